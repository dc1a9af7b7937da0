//! Token-bucket rate limiting, per action and client IP address. In memory:
//! each seqline process limits what reaches it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use crate::config::RateLimits;
use crate::error::{Error, Result};

/// What is being limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `POST /login`.
    Login,
    /// `POST /register`.
    Register,
    /// Registration-token validity checks (a token guessing oracle otherwise).
    TokenValidity,
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
    buckets: Mutex<HashMap<(Action, IpAddr), Bucket>>,
}

/// Buckets kept before idle (full) ones are swept out.
const SWEEP_AT: usize = 10_000;

impl RateLimiter {
    /// A limiter with the configured rates.
    pub fn new(config: RateLimits) -> Self {
        Self { config, buckets: Mutex::new(HashMap::new()) }
    }

    fn rate(&self, action: Action) -> (f64, f64) {
        match action {
            Action::Login => (self.config.login_per_second, f64::from(self.config.login_burst)),
            Action::Register | Action::TokenValidity => {
                (self.config.register_per_second, f64::from(self.config.register_burst))
            }
        }
    }

    /// Takes one token for `action` from `ip`'s bucket, or says how long to wait.
    pub fn check(&self, action: Action, ip: IpAddr) -> Result<()> {
        self.check_at(action, ip, Instant::now())
    }

    fn check_at(&self, action: Action, ip: IpAddr, now: Instant) -> Result<()> {
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
        let bucket = buckets.entry((action, ip)).or_insert(Bucket { tokens: burst, updated: now });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / per_second;
            Err(Error::LimitExceeded { retry_after_ms: (wait * 1000.0).ceil() as u64 })
        }
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
        limiter.check_at(Action::Login, ip, t0).unwrap();
        limiter.check_at(Action::Login, ip, t0).unwrap();
        match limiter.check_at(Action::Login, ip, t0) {
            Err(Error::LimitExceeded { retry_after_ms }) => assert_eq!(retry_after_ms, 1000),
            other => panic!("expected a limit, got {other:?}"),
        }
        // Another action and another address have their own buckets.
        limiter.check_at(Action::Register, ip, t0).unwrap();
        limiter.check_at(Action::Login, "127.0.0.2".parse().unwrap(), t0).unwrap();
        limiter.check_at(Action::Login, ip, t0 + Duration::from_secs(1)).unwrap();
    }

    #[test]
    fn disabled_never_limits() {
        let limiter =
            RateLimiter::new(RateLimits { enabled: false, login_burst: 1, ..RateLimits::default() });
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..100 {
            limiter.check(Action::Login, ip).unwrap();
        }
    }
}
