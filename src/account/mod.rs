//! Accounts: registration, password login, access tokens, devices, and
//! user-interactive authentication. Knows nothing of HTTP; the client API
//! handlers call it.

pub mod deactivate;
pub mod e2ee;
pub mod key_query;
pub mod keys;
pub mod profile;
pub mod to_device;
pub mod uia;
pub mod voip;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng;
use ruma::{OwnedDeviceId, OwnedUserId, ServerName, UserId};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::ratelimit::Action;
use crate::state::AppState;
use crate::storage::{self, devices, users};

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Requester {
    /// The user.
    pub user_id: OwnedUserId,
    /// The device whose token was used.
    pub device_id: OwnedDeviceId,
    /// Server administrator.
    pub is_admin: bool,
}

/// A freshly issued login.
#[derive(Debug, Clone)]
pub struct Session {
    /// The user.
    pub user_id: OwnedUserId,
    /// The (possibly new) device.
    pub device_id: OwnedDeviceId,
    /// The access token; only its hash is stored.
    pub access_token: String,
    /// With a refresh token: the refresh token and the access token's
    /// lifetime in milliseconds.
    pub refresh: Option<(String, i64)>,
}

/// How long a `last_seen` timestamp may lag before a request refreshes it.
const LAST_SEEN_GRANULARITY_MS: i64 = 60_000;

/// Checks a desired localpart against the spec's rules for new user ids
/// (lower-case `a-z 0-9 . _ = - / +`, the whole id at most 255 bytes), and
/// refuses the forms reserved by convention: all digits (generated ids) and a
/// leading underscore (application services).
pub fn validate_localpart(localpart: &str, server_name: &ServerName) -> Result<()> {
    if localpart.is_empty() {
        return Err(Error::InvalidUsername("The username must not be empty".into()));
    }
    if let Some(c) =
        localpart.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '=' | '-' | '/' | '+'))
    {
        return Err(Error::InvalidUsername(format!(
            "The username may only contain a-z, 0-9, '.', '_', '=', '-', '/' and '+', not {c:?}"
        )));
    }
    if localpart.starts_with('_') {
        return Err(Error::InvalidUsername("The username may not begin with '_'".into()));
    }
    if localpart.chars().all(|c| c.is_ascii_digit()) {
        return Err(Error::InvalidUsername("Numeric usernames are reserved".into()));
    }
    if 1 + localpart.len() + 1 + server_name.as_str().len() > 255 {
        return Err(Error::InvalidUsername("The user id would be longer than 255 bytes".into()));
    }
    Ok(())
}

/// Turns what a client typed for "user" (a localpart or a full id) into a
/// local localpart, lower-cased as logins are case-insensitive.
pub fn local_localpart(input: &str, server_name: &ServerName) -> Result<String> {
    if input.starts_with('@') {
        let user_id = UserId::parse(input.to_lowercase())
            .map_err(|_| Error::InvalidParam(format!("{input:?} is not a valid user id")))?;
        if user_id.server_name() != server_name {
            return Err(Error::Forbidden("That user is not on this server".into()));
        }
        Ok(user_id.localpart().to_owned())
    } else {
        Ok(input.to_lowercase())
    }
}

fn user_id_for(localpart: &str, server_name: &ServerName) -> Result<OwnedUserId> {
    UserId::parse(format!("@{localpart}:{server_name}"))
        .map_err(|e| Error::InvalidUsername(format!("Invalid user id: {e}")))
}

/// At most this many password hashes at once. Each argon2id hash takes 19 MiB
/// on a blocking thread; unbounded, a burst of registrations grows the blocking
/// pool and the allocator keeps every thread's memory.
fn hashing_slots() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        tokio::sync::Semaphore::new(cores)
    })
}

/// Hashes a password with argon2id (on a blocking thread: it is slow on purpose).
pub async fn hash_password(password: String) -> Result<String> {
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let _slot = hashing_slots().acquire().await.map_err(|e| Error::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::encode_b64(&salt).map_err(|e| Error::Internal(e.to_string()))?;
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| Error::Internal(format!("password hashing failed: {e}")))
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
}

/// Checks a password against a stored hash.
pub async fn verify_password(hash: String, password: String) -> Result<bool> {
    let _slot = hashing_slots().acquire().await.map_err(|e| Error::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        let parsed = PasswordHash::new(&hash).map_err(|e| Error::Internal(format!("stored hash: {e}")))?;
        Ok(Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
}

/// The stored form of an access token.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new access token: 256 random bits.
fn new_access_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("slt_{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// A new device id: ten upper-case letters.
fn new_device_id() -> OwnedDeviceId {
    let mut rng = rand::rng();
    let id: String = (0..10).map(|_| char::from(b'A' + (rng.next_u32() % 26) as u8)).collect();
    id.into()
}

/// Device ids chosen by clients: 1 to 255 bytes.
pub fn validate_device_id(device_id: &ruma::DeviceId) -> Result<()> {
    if device_id.as_str().is_empty() || device_id.as_str().len() > 255 {
        return Err(Error::InvalidParam("device_id must be 1 to 255 bytes".into()));
    }
    Ok(())
}

/// Creates an account. `password` of `None` makes an account that cannot log
/// in with a password.
pub async fn create_user(
    state: &AppState,
    localpart: &str,
    password: Option<String>,
    is_admin: bool,
) -> Result<OwnedUserId> {
    validate_localpart(localpart, &state.settings.server_name)?;
    let user_id = user_id_for(localpart, &state.settings.server_name)?;
    let hash = match password {
        Some(p) => Some(hash_password(p).await?),
        None => None,
    };
    users::create(&state.db, user_id.as_str(), localpart, hash.as_deref(), is_admin, storage::now_ms())
        .await?;
    // The display name starts as the localpart, as Synapse does.
    let displayname = serde_json::to_string(localpart).map_err(|e| Error::Internal(e.to_string()))?;
    users::set_profile_field(&state.db, user_id.as_str(), "displayname", Some(&displayname)).await?;
    tracing::info!(%user_id, is_admin, "registered user");
    Ok(user_id)
}

/// Whether `localpart` could be registered now.
pub async fn check_available(state: &AppState, localpart: &str) -> Result<()> {
    validate_localpart(localpart, &state.settings.server_name)?;
    if users::localpart_exists(&state.db, localpart).await? {
        return Err(Error::UserInUse);
    }
    Ok(())
}

/// Issues an access token for a device of `user_id` (a new device when
/// `device_id` is `None` or unknown; an existing device's old token stops
/// working).
/// With `refresh`, the access token expires after the configured lifetime
/// and comes with a refresh token.
pub async fn issue_session(
    state: &AppState,
    user_id: &UserId,
    device_id: Option<OwnedDeviceId>,
    display_name: Option<&str>,
    ip: Option<&str>,
    refresh: bool,
) -> Result<Session> {
    let device_id = device_id.unwrap_or_else(new_device_id);
    validate_device_id(&device_id)?;
    let access_token = new_access_token();
    let now = storage::now_ms();
    let lifetime = state.settings.access_token_lifetime_ms;
    let refresh_token = refresh.then(new_access_token);
    let refresh_hash = refresh_token.as_deref().map(hash_token);
    let created = devices::login(
        &state.db,
        user_id.as_str(),
        device_id.as_str(),
        display_name,
        &hash_token(&access_token),
        refresh_hash
            .as_deref()
            .map(|refresh_hash| devices::Refresh { refresh_hash, expires_ts: now.saturating_add(lifetime) }),
        now,
        ip,
    )
    .await?;
    // A login with an existing device id replaced that device's token: the
    // old one is forgotten once the new one is stored.
    state.tokens.forget_device(user_id.as_str(), device_id.as_str());
    // A new device is a change of the user's device list: those who share
    // a room with the user, here and on other servers, hear of it (as of
    // its keys when it uploads them).
    if created {
        e2ee::device_list_changed(state, user_id, e2ee::DeviceChange::Devices(&[device_id.as_str()])).await?;
    }
    Ok(Session {
        user_id: user_id.to_owned(),
        device_id,
        access_token,
        refresh: refresh_token.map(|t| (t, lifetime)),
    })
}

/// `/refresh`: a new access token (expiring) and refresh token for the
/// device holding `refresh_token`; its old access token stops working.
/// `UnknownToken` for a refresh token no device holds (or one replaced by a
/// refresh whose access token was used since).
pub async fn refresh(state: &AppState, refresh_token: &str) -> Result<Session> {
    let access_token = new_access_token();
    let next_refresh = new_access_token();
    let lifetime = state.settings.access_token_lifetime_ms;
    let next_hash = hash_token(&next_refresh);
    let (user_id, device_id) = devices::refresh(
        &state.db,
        &hash_token(refresh_token),
        &hash_token(&access_token),
        devices::Refresh { refresh_hash: &next_hash, expires_ts: storage::now_ms().saturating_add(lifetime) },
    )
    .await?
    .ok_or(Error::UnknownToken)?;
    state.tokens.forget_device(&user_id, &device_id);
    Ok(Session {
        user_id: OwnedUserId::try_from(user_id)
            .map_err(|e| Error::Internal(format!("stored user id: {e}")))?,
        device_id: device_id.into(),
        access_token,
        refresh: Some((next_refresh, lifetime)),
    })
}

/// Checks a user's password; `Forbidden` for an unknown user, a deactivated
/// account or a wrong password alike, so the answer does not reveal which.
/// Every password check passes here (logins and UIA password stages), so the
/// failed-attempt counter per account is kept here: once it is spent, the
/// answer is 429 before any hashing, even for the right password. The hashes
/// of one account are checked one at a time ([`PasswordGate`]), so a flood
/// aimed at one account holds at most one hashing slot.
pub async fn check_password(state: &AppState, localpart: &str, password: &str) -> Result<OwnedUserId> {
    let forbidden = || Error::Forbidden("Invalid username or password".into());
    let limiter = &state.rate_limiter;
    limiter.peek(Action::FailedLogin, localpart)?;
    let failed = || {
        // The peek above (or after the wait) found a token; a race may have taken it since.
        let _ = limiter.check(Action::FailedLogin, localpart);
        forbidden()
    };
    let Some(user) = users::by_localpart(&state.db, localpart).await? else { return Err(failed()) };
    let Some(hash) = user.password_hash else { return Err(failed()) };
    let _turn = state.password_gate.enter(localpart).await;
    // Failures counted while this one waited its turn count now.
    limiter.peek(Action::FailedLogin, localpart)?;
    if !verify_password(hash, password.to_owned()).await? {
        return Err(failed());
    }
    // Only someone who knows the password learns that the account is gone.
    if user.deactivated {
        return Err(Error::UserDeactivated);
    }
    OwnedUserId::try_from(user.user_id).map_err(|e| Error::Internal(format!("stored user id: {e}")))
}

/// A password login: [`check_password`], then the limit on successful logins
/// per account (a stolen password does not mint devices without end).
pub async fn login_with_password(state: &AppState, localpart: &str, password: &str) -> Result<OwnedUserId> {
    let user_id = check_password(state, localpart, password).await?;
    state.rate_limiter.check(Action::LoginAccount, user_id.as_str())?;
    Ok(user_id)
}

/// Accounts kept in [`PasswordGate`] before idle ones are swept out.
const GATE_SWEEP_AT: usize = 10_000;

/// Password checks take turns per account: at most one hash of an account is
/// in flight, the others wait for it (and then find the failed-attempt counter
/// spent, if those were wrong passwords).
#[derive(Debug, Default)]
pub struct PasswordGate {
    accounts: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

/// One account's turn; the next waiter's comes when it is dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    gate: &'a PasswordGate,
    account: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl PasswordGate {
    /// Waits for `account`'s turn.
    pub async fn enter(&self, account: &str) -> Turn<'_> {
        let lock = {
            let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
            if accounts.len() >= GATE_SWEEP_AT {
                accounts.retain(|_, lock| std::sync::Arc::strong_count(lock) > 1);
            }
            accounts.entry(account.to_owned()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        Turn { gate: self, account: account.to_owned(), guard: Some(guard) }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut accounts = self.gate.accounts.lock().unwrap_or_else(|p| p.into_inner());
        self.guard = None;
        // Nobody waiting (only the map holds the lock): forget the account.
        if accounts.get(&self.account).is_some_and(|lock| std::sync::Arc::strong_count(lock) == 1) {
            accounts.remove(&self.account);
        }
    }
}

/// How long a resolved access token is trusted without asking the database.
/// Logout and device deletion in this process forget it at once; the bound
/// matters only for a revocation made by another process sharing the
/// database (or the CLI changing the admin flag).
const TOKEN_CACHE_TTL_MS: i64 = 10_000;

/// The cache holds at most this many tokens (it is emptied when full).
const TOKEN_CACHE_MAX: usize = 100_000;

/// Access tokens resolved recently: sha-256 of the token -> its owner.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, CachedOwner>>,
    /// Moves on every forget: a lookup that began before a forget does not
    /// put its (possibly revoked) answer into the cache.
    generation: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone)]
struct CachedOwner {
    requester: Requester,
    /// The device's last-seen time as stored (refreshed through the database).
    last_seen_ts: i64,
    /// When the token expires, if it does.
    expires_ts: Option<i64>,
    cached_at: i64,
}

impl TokenCache {
    fn get(&self, token_hash: &str, now: i64) -> Option<Requester> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let hit = entries.get(token_hash)?;
        let fresh = now - hit.cached_at <= TOKEN_CACHE_TTL_MS
            && now - hit.last_seen_ts <= LAST_SEEN_GRANULARITY_MS
            && hit.expires_ts.is_none_or(|expires| now < expires);
        fresh.then(|| hit.requester.clone())
    }

    /// The generation to pass to [`TokenCache::put`], read before the
    /// database lookup whose answer is to be kept.
    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn put(
        &self,
        token_hash: String,
        requester: Requester,
        last_seen_ts: i64,
        expires_ts: Option<i64>,
        now: i64,
        generation: u64,
    ) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if self.generation() != generation {
            // A device was forgotten since the lookup began: its answer may
            // name a token revoked meanwhile.
            return;
        }
        if entries.len() >= TOKEN_CACHE_MAX {
            entries.clear();
        }
        entries.insert(token_hash, CachedOwner { requester, last_seen_ts, expires_ts, cached_at: now });
    }

    /// Forgets every token of a device (logged out, deleted, or given a new
    /// token by a login with its id). Called after the change is committed.
    pub fn forget_device(&self, user_id: &str, device_id: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        entries.retain(|_, c| !(c.requester.user_id == user_id && c.requester.device_id == device_id));
    }
}

/// Resolves an access token to its owner, refreshing the device's last-seen
/// time at most once a minute.
pub async fn authenticate(state: &AppState, token: &str, ip: Option<&str>) -> Result<Requester> {
    let token_hash = hash_token(token);
    let now = storage::now_ms();
    if let Some(requester) = state.tokens.get(&token_hash, now) {
        return Ok(requester);
    }
    let generation = state.tokens.generation();
    let owner = devices::by_token(&state.db, &token_hash).await?.ok_or(Error::UnknownToken)?;
    if owner.expires_ts.is_some_and(|expires| now >= expires) {
        return Err(Error::ExpiredToken);
    }
    if owner.refresh_pending {
        devices::refresh_used(&state.db, &owner.user_id, &owner.device_id).await?;
    }
    let mut last_seen = owner.last_seen_ts.unwrap_or(0);
    if now - last_seen > LAST_SEEN_GRANULARITY_MS {
        devices::touch(&state.db, &owner.user_id, &owner.device_id, now, ip).await?;
        last_seen = now;
    }
    let requester = Requester {
        user_id: OwnedUserId::try_from(owner.user_id)
            .map_err(|e| Error::Internal(format!("stored user id: {e}")))?,
        device_id: owner.device_id.into(),
        is_admin: owner.is_admin,
    };
    state.tokens.put(token_hash, requester.clone(), last_seen, owner.expires_ts, now, generation);
    Ok(requester)
}

/// Sets a new password; with `logout_devices`, every other device of the user
/// is deleted (their tokens stop working).
pub async fn change_password(
    state: &AppState,
    requester: &Requester,
    new_password: String,
    logout_devices: bool,
) -> Result<()> {
    let hash = hash_password(new_password).await?;
    users::set_password_hash(&state.db, requester.user_id.as_str(), &hash).await?;
    if logout_devices {
        let all = devices::list(&state.db, requester.user_id.as_str()).await?;
        let others: Vec<&str> =
            all.iter().map(|d| d.device_id.as_str()).filter(|d| *d != requester.device_id.as_str()).collect();
        e2ee::remove_devices(state, &requester.user_id, &others).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ruma::OwnedServerName {
        "example.org".try_into().unwrap()
    }

    #[test]
    fn localparts_follow_the_spec() {
        let s = server();
        for ok in ["alice", "a.b_c=d-e/f+g", "bob2"] {
            validate_localpart(ok, &s).unwrap();
        }
        for bad in ["", "Alice", "al ice", "al:ice", "_bot", "12345", "é"] {
            assert!(matches!(validate_localpart(bad, &s), Err(Error::InvalidUsername(_))), "{bad}");
        }
        let long = "a".repeat(250);
        assert!(validate_localpart(&long, &s).is_err());
    }

    /// A lookup that began before a device was forgotten (its logout
    /// committed meanwhile) does not put the revoked token back.
    #[test]
    fn token_cache_keeps_no_answer_older_than_a_forget() {
        let cache = TokenCache::default();
        let alice = Requester {
            user_id: "@alice:example.org".try_into().unwrap(),
            device_id: "DEV".into(),
            is_admin: false,
        };
        let before_logout = cache.generation();
        cache.forget_device("@alice:example.org", "DEV");
        cache.put("hash".into(), alice.clone(), 0, None, 0, before_logout);
        assert!(cache.get("hash", 0).is_none());
        let now = cache.generation();
        cache.put("hash".into(), alice, 0, None, 0, now);
        assert!(cache.get("hash", 0).is_some());
    }

    #[test]
    fn login_names_are_case_insensitive() {
        let s = server();
        assert_eq!(local_localpart("Alice", &s).unwrap(), "alice");
        assert_eq!(local_localpart("@Alice:example.org", &s).unwrap(), "alice");
        assert!(matches!(local_localpart("@alice:elsewhere.org", &s), Err(Error::Forbidden(_))));
    }

    #[test]
    fn tokens_are_256_bits_and_hashed() {
        let t = new_access_token();
        assert_eq!(URL_SAFE_NO_PAD.decode(t.trim_start_matches("slt_")).unwrap().len(), 32);
        assert_ne!(t, new_access_token());
        assert_eq!(hash_token(&t).len(), 64);
        assert_eq!(hash_token("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[tokio::test]
    async fn password_checks_take_turns_per_account() {
        let gate = PasswordGate::default();
        let first = gate.enter("alice").await;
        // Another account is not held up.
        let bob = tokio::time::timeout(std::time::Duration::from_secs(5), gate.enter("bob")).await.unwrap();
        drop(bob);
        // Alice's second check waits for the first.
        let mut second = Box::pin(gate.enter("alice"));
        assert!(futures_poll_once(second.as_mut()).await.is_none());
        drop(first);
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), second).await.unwrap();
        drop(second);
        // Nothing is kept for accounts nobody is checking.
        assert!(gate.accounts.lock().unwrap().is_empty());
    }

    /// Polls a future once: `Some` if it completed.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    #[tokio::test]
    async fn passwords_round_trip() {
        let h = hash_password("hunter2".into()).await.unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password(h.clone(), "hunter2".into()).await.unwrap());
        assert!(!verify_password(h, "hunter3".into()).await.unwrap());
    }
}
