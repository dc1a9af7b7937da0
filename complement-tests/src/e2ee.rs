//! Real ed25519 keys and signatures for the E2EE tests: device keys,
//! cross-signing keys and signed one-time keys as clients make them.

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// An ed25519 key pair derived from a name (the same name, the same key).
#[derive(Clone)]
pub struct Key {
    signing: SigningKey,
    /// The public key, unpadded base64.
    pub public: String,
}

impl Key {
    /// The key pair named `seed`.
    pub fn new(seed: &str) -> Self {
        let signing = SigningKey::from_bytes(&Sha256::digest(seed.as_bytes()).into());
        let public = STANDARD_NO_PAD.encode(signing.verifying_key().to_bytes());
        Self { signing, public }
    }

    /// `ed25519:<public key>`, the key id of a cross-signing key.
    pub fn id(&self) -> String {
        format!("ed25519:{}", self.public)
    }

    /// The signature of `object` (without `signatures` and `unsigned`),
    /// unpadded base64.
    pub fn signature_of(&self, object: &Value) -> String {
        let mut signed = object.clone();
        if let Some(o) = signed.as_object_mut() {
            o.remove("signatures");
            o.remove("unsigned");
        }
        // serde_json's maps are sorted and to_string is compact: canonical
        // JSON for the ASCII content of these tests.
        let bytes = serde_json::to_string(&signed).expect("serialise");
        STANDARD_NO_PAD.encode(self.signing.sign(bytes.as_bytes()).to_bytes())
    }

    /// Adds this key's signature as `signatures[user][key_id]`.
    pub fn sign(&self, object: &mut Value, user: &str, key_id: &str) {
        let signature = self.signature_of(object);
        object["signatures"][user][key_id] = json!(signature);
    }
}

/// A device's keys, self-signed by `device_key`.
pub fn device_keys(user: &str, device: &str, device_key: &Key) -> Value {
    let mut keys = json!({
        "user_id": user,
        "device_id": device,
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {
            format!("curve25519:{device}"): format!("curve-{}", device_key.public),
            format!("ed25519:{device}"): device_key.public,
        },
    });
    device_key.sign(&mut keys, user, &format!("ed25519:{device}"));
    keys
}

/// A cross-signing key of `usage`, signed by `master` when given (else
/// unsigned, as master keys may be).
pub fn cross_signing_key(user: &str, usage: &str, key: &Key, master: Option<&Key>) -> Value {
    let mut value = json!({ "user_id": user, "usage": [usage], "keys": { key.id(): key.public } });
    if let Some(master) = master {
        master.sign(&mut value, user, &master.id());
    }
    value
}

/// A `signed_curve25519` one-time key signed by the device's key.
pub fn signed_one_time_key(user: &str, device: &str, device_key: &Key, key: &str) -> Value {
    let mut value = json!({ "key": key });
    device_key.sign(&mut value, user, &format!("ed25519:{device}"));
    value
}
