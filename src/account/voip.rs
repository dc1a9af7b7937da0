//! TURN credentials for calls, in the TURN REST API scheme (what coturn's
//! `use-auth-secret` checks): the username carries its own expiry and the
//! password is an HMAC of it under a secret the TURN server shares.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};
use ruma::UserId;

/// `(username, password)` valid until `expires_at` (seconds since the epoch):
/// username `"<expires_at>:<user id>"`, password base64(HMAC-SHA1(secret, username)).
pub fn turn_credentials(secret: &str, user: &UserId, expires_at: u64) -> (String, String) {
    let username = format!("{expires_at}:{user}");
    // HMAC takes a key of any length, so this cannot fail.
    let password = match hmac::Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()) {
        Ok(mut mac) => {
            mac.update(username.as_bytes());
            STANDARD.encode(mac.finalize().into_bytes())
        }
        Err(_) => String::new(),
    };
    (username, password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_match_the_turn_rest_scheme() {
        // Expected value computed independently (Python's hmac + hashlib.sha1).
        let user = <&UserId>::try_from("@alice:example.org").unwrap();
        let (username, password) = turn_credentials("north-wind", user, 1_700_000_000);
        assert_eq!(username, "1700000000:@alice:example.org");
        assert_eq!(password, "hjWiCaSSaIU8/8lCvMbcLYKN7nU=");
    }
}
