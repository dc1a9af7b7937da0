//! Token-bucket rate limiting, per action and key (a client address, an
//! account, a room). In memory: each seqline process limits what reaches it.
//! Also where the client address of a request is decided ([`client_address`]:
//! the peer, or what a trusted proxy forwarded).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use http::HeaderMap;
use ipnet::IpNet;

use crate::config::RateLimits;
use crate::error::{Error, Result};

/// What is being limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `POST /login`, per client address.
    Login,
    /// Successful logins, per account.
    LoginAccount,
    /// Wrong passwords (logins and UIA password stages), per account.
    FailedLogin,
    /// `POST /register`.
    Register,
    /// Registration-token validity checks (a token guessing oracle otherwise).
    TokenValidity,
    /// Events sent by a user (messages, state, redactions).
    Message,
    /// Joins by a user.
    Join,
    /// Invites into a room.
    InviteRoom,
    /// Invites received by a user.
    InviteUser,
    /// Presence updates by a user.
    Presence,
    /// URL previews fetched for a user (cached ones are free).
    UrlPreview,
}

/// Whose bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// A client address.
    Ip(IpAddr),
    /// A user id or a room id.
    Id(String),
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Self::Ip(ip)
    }
}

impl From<&str> for Key {
    fn from(id: &str) -> Self {
        Self::Id(id.to_owned())
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The limiter shared by all requests.
#[derive(Debug)]
pub struct RateLimiter {
    config: RateLimits,
    buckets: Mutex<HashMap<(Action, Key), Bucket>>,
}

/// Buckets kept before idle (full) ones are swept out.
const SWEEP_AT: usize = 10_000;

impl RateLimiter {
    /// A limiter with the configured rates.
    pub fn new(config: RateLimits) -> Self {
        Self { config, buckets: Mutex::new(HashMap::new()) }
    }

    fn rate(&self, action: Action) -> (f64, f64) {
        let c = &self.config;
        let (per_second, burst) = match action {
            Action::Login => (c.login_per_second, c.login_burst),
            Action::LoginAccount => (c.login_account_per_second, c.login_account_burst),
            Action::FailedLogin => (c.failed_login_per_second, c.failed_login_burst),
            Action::Register | Action::TokenValidity => (c.register_per_second, c.register_burst),
            Action::Message => (c.message_per_second, c.message_burst),
            Action::Join => (c.join_per_second, c.join_burst),
            Action::InviteRoom => (c.invite_room_per_second, c.invite_room_burst),
            Action::InviteUser => (c.invite_user_per_second, c.invite_user_burst),
            Action::Presence => (c.presence_per_second, c.presence_burst),
            Action::UrlPreview => (c.url_preview_per_second, c.url_preview_burst),
        };
        (per_second, f64::from(burst))
    }

    /// Takes one token for `action` from `key`'s bucket, or says how long to wait.
    pub fn check(&self, action: Action, key: impl Into<Key>) -> Result<()> {
        self.at(action, key.into(), Instant::now(), true)
    }

    /// Whether `key`'s bucket has a token for `action`, without taking it
    /// (the failed-attempt counter is charged only when an attempt fails).
    pub fn peek(&self, action: Action, key: impl Into<Key>) -> Result<()> {
        self.at(action, key.into(), Instant::now(), false)
    }

    fn at(&self, action: Action, key: Key, now: Instant, take: bool) -> Result<()> {
        if !self.config.enabled {
            return Ok(());
        }
        let (per_second, burst) = self.rate(action);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= SWEEP_AT {
            buckets.retain(|(a, _), b| {
                let (rate, burst) = self.rate(*a);
                b.tokens + now.saturating_duration_since(b.updated).as_secs_f64() * rate < burst
            });
        }
        let bucket = buckets.entry((action, key)).or_insert(Bucket { tokens: burst, updated: now });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            if take {
                bucket.tokens -= 1.0;
            }
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / per_second;
            Err(Error::LimitExceeded { retry_after_ms: (wait * 1000.0).ceil() as u64 })
        }
    }
}

/// The client address of a request: the peer's, unless the peer is a trusted
/// proxy; then the right-most `X-Forwarded-For` address that is not itself a
/// trusted proxy (addresses left of it were written by the client and prove
/// nothing). A header that does not parse leaves the peer's address.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(&canonical(*ip)));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let Ok(value) = value.to_str() else { return peer };
        for hop in value.split(',') {
            match hop.trim().parse::<IpAddr>() {
                Ok(ip) => hops.push(canonical(ip)),
                Err(_) => return peer,
            }
        }
    }
    hops.into_iter().rev().find(|ip| !is_trusted(ip)).unwrap_or(peer)
}

/// IPv4-mapped IPv6 addresses (a dual-stack listener's view of IPv4 peers) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_refill() {
        let limiter =
            RateLimiter::new(RateLimits { login_burst: 2, login_per_second: 1.0, ..RateLimits::default() });
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        limiter.at(Action::Login, ip.into(), t0, true).unwrap();
        limiter.at(Action::Login, ip.into(), t0, true).unwrap();
        match limiter.at(Action::Login, ip.into(), t0, true) {
            Err(Error::LimitExceeded { retry_after_ms }) => assert_eq!(retry_after_ms, 1000),
            other => panic!("expected a limit, got {other:?}"),
        }
        // Another action and another address have their own buckets.
        limiter.at(Action::Register, ip.into(), t0, true).unwrap();
        limiter.at(Action::Login, "127.0.0.2".parse::<IpAddr>().unwrap().into(), t0, true).unwrap();
        limiter.at(Action::Login, ip.into(), t0 + Duration::from_secs(1), true).unwrap();
    }

    #[test]
    fn peek_takes_nothing() {
        let limiter = RateLimiter::new(RateLimits {
            failed_login_burst: 1,
            failed_login_per_second: 0.5,
            ..RateLimits::default()
        });
        let t0 = Instant::now();
        let key = || Key::from("@a:x");
        for _ in 0..5 {
            limiter.at(Action::FailedLogin, key(), t0, false).unwrap();
        }
        limiter.at(Action::FailedLogin, key(), t0, true).unwrap();
        match limiter.at(Action::FailedLogin, key(), t0, false) {
            Err(Error::LimitExceeded { retry_after_ms }) => assert_eq!(retry_after_ms, 2000),
            other => panic!("expected a limit, got {other:?}"),
        }
        limiter.at(Action::FailedLogin, "@b:x".into(), t0, false).unwrap();
        limiter.at(Action::FailedLogin, key(), t0 + Duration::from_secs(2), false).unwrap();
    }

    #[test]
    fn every_action_has_its_configured_rate() {
        let limiter = RateLimiter::new(RateLimits::default());
        assert_eq!(limiter.rate(Action::FailedLogin), (0.17, 3.0));
        assert_eq!(limiter.rate(Action::LoginAccount), (0.003, 5.0));
        assert_eq!(limiter.rate(Action::Message), (0.2, 10.0));
        assert_eq!(limiter.rate(Action::Join), (0.1, 10.0));
        assert_eq!(limiter.rate(Action::InviteRoom), (0.3, 10.0));
        assert_eq!(limiter.rate(Action::InviteUser), (0.003, 5.0));
        assert_eq!(limiter.rate(Action::Presence), (0.1, 1.0));
    }

    #[test]
    fn disabled_never_limits() {
        let limiter =
            RateLimiter::new(RateLimits { enabled: false, login_burst: 1, ..RateLimits::default() });
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..100 {
            limiter.check(Action::Login, ip).unwrap();
            limiter.check(Action::Presence, "@a:x").unwrap();
        }
    }

    #[test]
    fn forwarded_for_only_through_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let headers = |v: &[&str]| {
            let mut h = HeaderMap::new();
            for v in v {
                h.append("x-forwarded-for", v.parse().unwrap());
            }
            h
        };
        let xff = headers(&["203.0.113.9, 198.51.100.1"]);
        // An untrusted peer's header is ignored.
        assert_eq!(client_address(ip("192.0.2.1"), &xff, &trusted), ip("192.0.2.1"));
        assert_eq!(client_address(ip("10.1.2.3"), &xff, &[]), ip("10.1.2.3"));
        // The right-most untrusted hop, across repeated headers, skipping trusted ones.
        assert_eq!(client_address(ip("10.1.2.3"), &xff, &trusted), ip("198.51.100.1"));
        let chain = headers(&["203.0.113.9", "198.51.100.1 , 10.0.0.5"]);
        assert_eq!(client_address(ip("::1"), &chain, &trusted), ip("198.51.100.1"));
        // Mapped addresses count as their IPv4 form.
        assert_eq!(client_address(ip("::ffff:10.0.0.1"), &xff, &trusted), ip("198.51.100.1"));
        // Only trusted hops, no header, or garbage: the peer.
        assert_eq!(client_address(ip("10.1.2.3"), &headers(&["10.0.0.7"]), &trusted), ip("10.1.2.3"));
        assert_eq!(client_address(ip("10.1.2.3"), &HeaderMap::new(), &trusted), ip("10.1.2.3"));
        assert_eq!(client_address(ip("10.1.2.3"), &headers(&["1.2.3.4, nope"]), &trusted), ip("10.1.2.3"));
    }
}
