//! Server signing keys. Ours is published self-signed, valid for a day
//! ([`own_key_object`]). Other servers' keys are fetched from their
//! `/_matrix/key/v2/server` on a miss, accepted only when the object is for
//! that server and carries its own valid signature, and cached in
//! `server_keys`, old ones kept (and in memory a minute, [`KeyCache`]). A request is verified with the keys valid
//! now ([`public_keys`]); an event of room version 5 or later with those
//! valid at its `origin_server_ts` ([`keys_at`]): a current key until its
//! `valid_until_ts` (asked for again with `minimum_valid_until_ts` when the
//! one we hold ran out before the event), an old key until its `expired_ts`. The notary
//! ([`notary_query`]) answers from that cache (or our own key), adding our
//! signature.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ruma::api::federation::discovery::get_remote_server_keys_batch::v2::QueryCriteria;
use ruma::api::federation::discovery::{
    ServerSigningKeys, VerifyKey, get_remote_server_keys, get_server_keys,
};
use ruma::serde::{Base64, Raw};
use ruma::signatures::PublicKeySet;
use ruma::{
    CanonicalJsonObject, CanonicalJsonValue, MilliSecondsSinceUnixEpoch, OwnedServerName,
    OwnedServerSigningKeyId, ServerName, UInt,
};

use super::FederationError;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::{self, server_keys};

/// How long our published key object says it is valid (Synapse's default
/// `key_refresh_interval`).
pub const OWN_KEY_VALIDITY_MS: i64 = 24 * 60 * 60 * 1000;

/// The furthest into the future a fetched key's validity is believed: the
/// spec's cap for room versions 5 and later.
pub const MAX_REMOTE_VALIDITY_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// Servers one notary query may name.
pub const MAX_NOTARY_SERVERS: usize = 100;

/// Key fetches one notary query makes at once.
const NOTARY_PARALLEL_FETCHES: usize = 8;

/// How long a server whose keys could not be fetched is not asked again.
pub const FETCH_BACKOFF_MS: i64 = 60_000;

/// Servers remembered in [`FetchBackoff`] at most.
const MAX_BACKOFF_ENTRIES: usize = 10_000;

/// Servers whose keys could not be fetched, with when they may be asked
/// again: requests naming such an origin (anyone can send them) cost no
/// outbound request until then.
#[derive(Debug, Default)]
pub struct FetchBackoff {
    until: std::sync::Mutex<std::collections::HashMap<OwnedServerName, i64>>,
    /// Servers refetched for a key id the cache did not know, until when
    /// another such refetch waits.
    refetched: std::sync::Mutex<std::collections::HashMap<OwnedServerName, i64>>,
}

impl FetchBackoff {
    fn blocked(&self, server: &ServerName, now: i64) -> bool {
        let until = self.until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        until.get(server).is_some_and(|&t| t > now)
    }

    fn failed(&self, server: &ServerName, now: i64) {
        let mut until = self.until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if until.len() >= MAX_BACKOFF_ENTRIES {
            until.retain(|_, t| *t > now);
        }
        if until.len() < MAX_BACKOFF_ENTRIES {
            until.insert(server.to_owned(), now + FETCH_BACKOFF_MS);
        }
    }

    /// Whether a refetch for an unknown key id may go out now (then none
    /// other for this server within [`FETCH_BACKOFF_MS`]).
    fn may_refetch(&self, server: &ServerName, now: i64) -> bool {
        let mut refetched = self.refetched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if refetched.get(server).is_some_and(|&t| t > now) {
            return false;
        }
        if refetched.len() >= MAX_BACKOFF_ENTRIES {
            refetched.retain(|_, t| *t > now);
        }
        if refetched.len() >= MAX_BACKOFF_ENTRIES {
            return false;
        }
        refetched.insert(server.to_owned(), now + FETCH_BACKOFF_MS);
        true
    }

    fn succeeded(&self, server: &ServerName) {
        self.until.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(server);
    }
}

/// How long the stored keys of a server are used from memory before they
/// are read again (another process sharing the database may have stored
/// newer ones; a key id not in memory is always read again first).
const CACHED_KEYS_MS: u64 = 60_000;

/// Servers whose stored keys are kept in memory at most.
const MAX_CACHED_SERVERS: usize = 10_000;

/// Other servers' stored keys, kept in memory a while: every request from
/// another server and every event checked needs them, and reading them from
/// the database each time cost a query per event in a backfill of
/// thousands.
#[derive(Debug, Default)]
pub struct KeyCache {
    servers: std::sync::Mutex<HashMap<OwnedServerName, (std::time::Instant, StoredKeys)>>,
}

/// A server's stored keys, shared.
type StoredKeys = Arc<Vec<server_keys::StoredKey>>;

impl KeyCache {
    fn get(&self, server: &ServerName) -> Option<StoredKeys> {
        let servers = self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (read_at, keys) = servers.get(server)?;
        (read_at.elapsed() < std::time::Duration::from_millis(CACHED_KEYS_MS)).then(|| keys.clone())
    }

    fn put(&self, server: &ServerName, keys: StoredKeys) {
        let mut servers = self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if servers.len() >= MAX_CACHED_SERVERS {
            servers.clear();
        }
        servers.insert(server.to_owned(), (std::time::Instant::now(), keys));
    }

    fn forget(&self, server: &ServerName) {
        self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(server);
    }
}

/// The stored keys of `server`, from memory when read lately (`fresh`:
/// read from the database in any case).
async fn stored_keys(state: &AppState, server: &ServerName, fresh: bool) -> Result<StoredKeys> {
    if !fresh && let Some(keys) = state.server_keys.get(server) {
        return Ok(keys);
    }
    let keys = Arc::new(server_keys::get(&state.db, server.as_str()).await?);
    state.server_keys.put(server, keys.clone());
    Ok(keys)
}

/// Why another server's keys could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key server did not answer usefully.
    #[error("cannot fetch the keys of {0}: {1}")]
    Fetch(OwnedServerName, FederationError),
    /// The answer is not a valid key object for that server.
    #[error("the keys of {0} are invalid: {1}")]
    Invalid(OwnedServerName, String),
    /// A recent fetch failed; not asked again yet.
    #[error("the keys of {0} could not be fetched lately; not asking again yet")]
    BackingOff(OwnedServerName),
    /// Reading or writing the cache failed.
    #[error(transparent)]
    Storage(#[from] Error),
}

/// Our key object as `/_matrix/key/v2/server` serves it: our current key,
/// no old keys, valid for a day from now, signed by us.
pub fn own_key_object(state: &AppState) -> Result<CanonicalJsonObject> {
    let now = storage::now_ms();
    let valid_until = millis(now + OWN_KEY_VALIDITY_MS);
    let mut keys = ServerSigningKeys::new(state.settings.server_name.clone(), valid_until);
    let key_id = OwnedServerSigningKeyId::try_from(state.signing_key.key_id().as_str())
        .map_err(|e| Error::Internal(format!("own key id: {e}")))?;
    keys.verify_keys
        .insert(key_id, VerifyKey::new(Base64::new(state.signing_key.pair.public_key().to_vec())));
    let mut object = to_object(&keys).map_err(Error::Internal)?;
    sign(state, &mut object)?;
    Ok(object)
}

/// Adds our signature to `object`.
fn sign(state: &AppState, object: &mut CanonicalJsonObject) -> Result<()> {
    ruma::signatures::sign_json(state.settings.server_name.as_str(), &state.signing_key.pair, object)
        .map_err(|e| Error::Internal(format!("cannot sign: {e}")))
}

fn to_object<T: serde::Serialize>(value: &T) -> Result<CanonicalJsonObject, String> {
    match ruma::canonical_json::to_canonical_value(value) {
        Ok(CanonicalJsonValue::Object(object)) => Ok(object),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn millis(ms: i64) -> MilliSecondsSinceUnixEpoch {
    MilliSecondsSinceUnixEpoch(UInt::try_from(ms.max(0)).unwrap_or(UInt::MAX))
}

/// A key object checked to be `server`'s own: its verify keys (id, unpadded
/// base64), old keys with their expiry, and its validity.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedKeys {
    /// Current keys.
    pub verify_keys: BTreeMap<String, String>,
    /// Old keys and when they expired.
    pub old_verify_keys: BTreeMap<String, (String, i64)>,
    /// `valid_until_ts` as published.
    pub valid_until_ts: i64,
}

/// Checks that `object` is a key object for `server` signed by one of its own
/// current verify keys (signatures by others are ignored here).
pub fn check_key_object(server: &ServerName, object: &CanonicalJsonObject) -> Result<CheckedKeys, String> {
    let parsed: ServerSigningKeys =
        serde_json::from_value(serde_json::to_value(object).map_err(|e| e.to_string())?)
            .map_err(|e| format!("not a key object: {e}"))?;
    if parsed.server_name != server {
        return Err(format!("the object is for {}", parsed.server_name));
    }
    if parsed.verify_keys.is_empty() {
        return Err("no verify_keys".into());
    }
    let verify_keys: BTreeMap<String, String> =
        parsed.verify_keys.iter().map(|(id, key)| (id.to_string(), key.key.encode())).collect();
    // Verify the origin's own signature only: drop everyone else's first.
    let mut own = object.clone();
    let signatures = object
        .get("signatures")
        .and_then(|s| match s {
            CanonicalJsonValue::Object(map) => map.get(server.as_str()).cloned(),
            _ => None,
        })
        .ok_or("not signed by the server itself")?;
    own.insert(
        "signatures".into(),
        CanonicalJsonValue::Object(BTreeMap::from([(server.to_string(), signatures)])),
    );
    let set: PublicKeySet =
        parsed.verify_keys.iter().map(|(id, key)| (id.to_string(), key.key.clone())).collect();
    let map = BTreeMap::from([(server.to_string(), set)]);
    ruma::signatures::verify_json(&map, &own).map_err(|e| format!("bad self-signature: {e}"))?;
    let old_verify_keys = parsed
        .old_verify_keys
        .iter()
        .map(|(id, old)| {
            (
                id.to_string(),
                (old.key.encode(), i64::try_from(u64::from(old.expired_ts.0)).unwrap_or(i64::MAX)),
            )
        })
        .collect();
    let valid_until_ts = i64::try_from(u64::from(parsed.valid_until_ts.0)).unwrap_or(i64::MAX);
    Ok(CheckedKeys { verify_keys, old_verify_keys, valid_until_ts })
}

/// Whether a stored key was valid at `ts`: a current key until the
/// `valid_until_ts` of the object it came in, an old key until its
/// `expired_ts` (an event signed while it was in use stays verifiable).
fn valid_at(key: &server_keys::StoredKey, ts: i64) -> bool {
    match key.expired_ts {
        Some(expired) => ts < expired,
        None => key.valid_until_ts >= ts,
    }
}

/// The keys of `server` usable to verify a request made now, among them
/// `wanted` if the server has it (see [`keys_at`]).
pub async fn public_keys(
    state: &AppState,
    server: &ServerName,
    wanted: &str,
) -> Result<PublicKeySet, KeyError> {
    keys_at(state, server, wanted, Some(storage::now_ms())).await
}

/// The keys of `server` that were valid at `at` (an event's
/// `origin_server_ts` in room versions 5 and later, now for a request;
/// `None`: any key we know of, the rule of versions 1 to 4), among them
/// `wanted` if the server has it. Ours directly; another server's from the
/// cache, else fetched from it: freely while the cache holds no key valid
/// now, else at most once a minute per server (a key id the cache does not
/// know: the server may have a new key; a key that expired before `at`:
/// asked for with `minimum_valid_until_ts` = `at`).
pub async fn keys_at(
    state: &AppState,
    server: &ServerName,
    wanted: &str,
    at: Option<i64>,
) -> Result<PublicKeySet, KeyError> {
    if server == state.settings.server_name {
        return Ok(BTreeMap::from([(
            state.signing_key.key_id(),
            Base64::new(state.signing_key.pair.public_key().to_vec()),
        )]));
    }
    let now = storage::now_ms();
    let usable = |k: &server_keys::StoredKey| at.is_none_or(|ts| valid_at(k, ts));
    let mut stored = stored_keys(state, server, false).await?;
    let known_in = |stored: &[server_keys::StoredKey]| stored.iter().any(|k| usable(k) && k.key_id == wanted);
    if !known_in(&stored) {
        stored = stored_keys(state, server, true).await?;
    }
    let valid_now = stored.iter().any(|k| valid_at(k, now));
    let known = known_in(&stored);
    if !known && (!valid_now || state.key_fetch_backoff.may_refetch(server, now)) {
        // The key we hold ran out before `at`: ask for one valid until then.
        let expired_before =
            at.filter(|_| stored.iter().any(|k| k.key_id == wanted && k.expired_ts.is_none()));
        let fetched = match expired_before {
            Some(ts) => fetch_valid_until(state, server, ts).await,
            None => fetch(state, server).await,
        };
        match fetched {
            Ok(()) => stored = stored_keys(state, server, true).await?,
            // Keep using the cached keys that are still valid.
            Err(KeyError::Fetch(..) | KeyError::Invalid(..) | KeyError::BackingOff(..)) if valid_now => {}
            Err(e) => return Err(e),
        }
    }
    Ok(stored
        .iter()
        .filter(|k| usable(k))
        .filter_map(|k| {
            let bytes = STANDARD_NO_PAD.decode(&k.public_key).ok()?;
            Some((k.key_id.clone(), Base64::new(bytes)))
        })
        .collect())
}

/// Asks `server` for its keys valid until at least `minimum`
/// (`/_matrix/key/v2/query/{server}?minimum_valid_until_ts=`), keeping each
/// object it signed itself; a server that does not answer that is asked
/// `/_matrix/key/v2/server` instead.
async fn fetch_valid_until(state: &AppState, server: &ServerName, minimum: i64) -> Result<(), KeyError> {
    let now = storage::now_ms();
    if state.key_fetch_backoff.blocked(server, now) {
        return Err(KeyError::BackingOff(server.to_owned()));
    }
    let request = get_remote_server_keys::v2::Request::new(server.to_owned(), millis(minimum));
    let objects = match super::send(state, server, request).await {
        Ok(response) => response.server_keys,
        Err(e) => {
            tracing::info!(%server, "key query with minimum_valid_until_ts: {e}; asking /key/v2/server");
            return fetch(state, server).await;
        }
    };
    let mut kept = 0;
    for raw in &objects {
        let Ok(object) = serde_json::from_str::<CanonicalJsonObject>(raw.json().get()) else { continue };
        match store(state, server, &object).await {
            Ok(()) => kept += 1,
            Err(KeyError::Invalid(_, e)) => tracing::info!(%server, "key query: an object refused: {e}"),
            Err(e) => return Err(e),
        }
    }
    if kept == 0 {
        return fetch(state, server).await;
    }
    state.key_fetch_backoff.succeeded(server);
    Ok(())
}

/// Fetches `server`'s keys from it directly, checks and caches them; a
/// server whose last fetch failed under a minute ago is not asked.
pub async fn fetch(state: &AppState, server: &ServerName) -> Result<(), KeyError> {
    let now = storage::now_ms();
    if state.key_fetch_backoff.blocked(server, now) {
        return Err(KeyError::BackingOff(server.to_owned()));
    }
    let fetched = fetch_now(state, server).await;
    match &fetched {
        Ok(()) => state.key_fetch_backoff.succeeded(server),
        Err(KeyError::Fetch(..) | KeyError::Invalid(..)) => state.key_fetch_backoff.failed(server, now),
        Err(_) => {}
    }
    fetched
}

async fn fetch_now(state: &AppState, server: &ServerName) -> Result<(), KeyError> {
    let response = super::send(state, server, get_server_keys::v2::Request::new())
        .await
        .map_err(|e| KeyError::Fetch(server.to_owned(), e))?;
    let object: CanonicalJsonObject = serde_json::from_str(response.server_key.json().get())
        .map_err(|e| KeyError::Invalid(server.to_owned(), e.to_string()))?;
    store(state, server, &object).await
}

/// Checks that `object` is `server`'s own key object and caches its keys
/// (validity capped at [`MAX_REMOTE_VALIDITY_MS`] from now).
async fn store(state: &AppState, server: &ServerName, object: &CanonicalJsonObject) -> Result<(), KeyError> {
    let checked = check_key_object(server, object).map_err(|e| KeyError::Invalid(server.to_owned(), e))?;
    let now = storage::now_ms();
    let valid_until = checked.valid_until_ts.min(now + MAX_REMOTE_VALIDITY_MS);
    let json = serde_json::to_string(object).map_err(|e| Error::Internal(e.to_string()))?;
    let mut keys: Vec<server_keys::NewKey<'_>> =
        checked.verify_keys.iter().map(|(id, key)| (id.as_str(), key.as_str(), None)).collect();
    keys.extend(
        checked
            .old_verify_keys
            .iter()
            .map(|(id, (key, expired))| (id.as_str(), key.as_str(), Some(*expired))),
    );
    server_keys::put(&state.db, server.as_str(), &keys, valid_until, now, &json).await?;
    state.server_keys.forget(server);
    tracing::info!(%server, keys = keys.len(), "fetched server keys");
    Ok(())
}

/// The notary answer to `POST /_matrix/key/v2/query`: for each server named,
/// its key object(s) with our signature added, from the cache, fetched from
/// the server when the cache holds nothing valid until the asked
/// `minimum_valid_until_ts` (now when not given). A server that cannot be
/// reached is answered with what the cache has, or left out.
pub async fn notary_query(
    state: &AppState,
    query: &BTreeMap<OwnedServerName, BTreeMap<OwnedServerSigningKeyId, QueryCriteria>>,
) -> Result<Vec<Raw<ServerSigningKeys>>> {
    if query.len() > MAX_NOTARY_SERVERS {
        return Err(Error::InvalidParam(format!(
            "A key query may name at most {MAX_NOTARY_SERVERS} servers"
        )));
    }
    let now = storage::now_ms();
    // Which servers the cache cannot answer for: fetched first, a few at a time.
    let mut missing = Vec::new();
    for (server, criteria) in query {
        if *server == state.settings.server_name {
            continue;
        }
        let minimum = criteria
            .values()
            .filter_map(|c| c.minimum_valid_until_ts)
            .map(|ts| i64::try_from(u64::from(ts.0)).unwrap_or(i64::MAX))
            .max()
            .unwrap_or(now);
        let stored = server_keys::get(&state.db, server.as_str()).await?;
        let satisfied = stored.iter().any(|k| k.expired_ts.is_none() && k.valid_until_ts >= minimum);
        // A server whose keys we hold is fetched again at most once per
        // backoff period, however far off the asked validity (this query
        // needs no signature: it must not make us hammer other servers).
        if !satisfied && (stored.is_empty() || state.key_fetch_backoff.may_refetch(server, now)) {
            missing.push(server.clone());
        }
    }
    let mut fetches = tokio::task::JoinSet::new();
    for server in missing {
        if fetches.len() >= NOTARY_PARALLEL_FETCHES
            && let Some(done) = fetches.join_next().await
        {
            notary_fetched(done)?;
        }
        let state = state.clone();
        fetches.spawn(async move { fetch(&state, &server).await });
    }
    while let Some(done) = fetches.join_next().await {
        notary_fetched(done)?;
    }

    let mut answer = Vec::new();
    for server in query.keys() {
        let mut objects: Vec<CanonicalJsonObject> = Vec::new();
        if *server == state.settings.server_name {
            objects.push(own_key_object(state)?);
        } else {
            for key in server_keys::get(&state.db, server.as_str()).await? {
                let Ok(mut object) = serde_json::from_str::<CanonicalJsonObject>(&key.json) else { continue };
                // The object as its origin signed it, without earlier notary signatures.
                if let Some(CanonicalJsonValue::Object(signatures)) = object.get_mut("signatures") {
                    signatures.retain(|name, _| name == server.as_str());
                }
                if !objects.contains(&object) {
                    objects.push(object);
                }
            }
            for object in &mut objects {
                sign(state, object)?;
            }
        }
        for object in objects {
            let raw = serde_json::value::to_raw_value(&object).map_err(|e| Error::Internal(e.to_string()))?;
            answer.push(Raw::from_json(raw));
        }
    }
    Ok(answer)
}

/// One notary fetch finished: a server that could not be asked is left to
/// the cache (or out); a storage failure fails the query.
fn notary_fetched(done: Result<Result<(), KeyError>, tokio::task::JoinError>) -> Result<()> {
    match done {
        Ok(Ok(())) => Ok(()),
        Ok(Err(KeyError::Storage(e))) => Err(e),
        Ok(Err(e)) => {
            tracing::info!("notary query: {e}");
            Ok(())
        }
        Err(e) => Err(Error::Internal(format!("key fetch task: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing_key;

    fn object_signed_by(name: &str, key: &signing_key::ServerKey, valid_until: i64) -> CanonicalJsonObject {
        let mut keys = ServerSigningKeys::new(name.try_into().unwrap(), millis(valid_until));
        keys.verify_keys.insert(
            key.key_id().as_str().try_into().unwrap(),
            VerifyKey::new(Base64::new(key.pair.public_key().to_vec())),
        );
        let mut object = to_object(&keys).unwrap();
        ruma::signatures::sign_json(name, &key.pair, &mut object).unwrap();
        object
    }

    fn key(seed: u8) -> signing_key::ServerKey {
        signing_key::parse(&format!("ed25519 a_{seed} {}", STANDARD_NO_PAD.encode([seed; 32]))).unwrap()
    }

    #[test]
    fn a_key_is_judged_at_a_time() {
        let stored = |valid_until_ts, expired_ts| server_keys::StoredKey {
            key_id: "ed25519:k".into(),
            public_key: String::new(),
            valid_until_ts,
            expired_ts,
            json: String::new(),
        };
        // A current key: until its object's validity, inclusive.
        assert!(valid_at(&stored(100, None), 100) && !valid_at(&stored(100, None), 101));
        // An old key: before it was retired, whatever its object's validity.
        assert!(valid_at(&stored(10, Some(50)), 49) && !valid_at(&stored(1_000, Some(50)), 50));
    }

    #[test]
    fn a_self_signed_key_object_is_accepted() {
        let server: &ServerName = "remote.example:8448".try_into().unwrap();
        let k = key(1);
        let object = object_signed_by(server.as_str(), &k, 1_000);
        let checked = check_key_object(server, &object).unwrap();
        assert_eq!(checked.valid_until_ts, 1_000);
        assert_eq!(checked.verify_keys.get("ed25519:a_1"), Some(&k.public_key_base64()));
        // A notary's signature beside the origin's changes nothing.
        let mut notarised = object.clone();
        ruma::signatures::sign_json("notary.example", &key(2).pair, &mut notarised).unwrap();
        assert_eq!(check_key_object(server, &notarised).unwrap(), checked);
    }

    #[test]
    fn forged_or_misdirected_key_objects_are_refused() {
        let server: &ServerName = "remote.example".try_into().unwrap();
        // For another server.
        let other = object_signed_by("other.example", &key(1), 1_000);
        assert!(check_key_object(server, &other).unwrap_err().contains("other.example"));
        // Signed by a key other than the one it publishes.
        let mut keys = ServerSigningKeys::new(server.to_owned(), millis(1_000));
        keys.verify_keys.insert(
            "ed25519:a_1".try_into().unwrap(),
            VerifyKey::new(Base64::new(key(1).pair.public_key().to_vec())),
        );
        let mut forged = to_object(&keys).unwrap();
        ruma::signatures::sign_json(server.as_str(), &key(3).pair, &mut forged).unwrap();
        assert!(check_key_object(server, &forged).is_err());
        // A changed field after signing.
        let mut tampered = object_signed_by(server.as_str(), &key(1), 1_000);
        tampered.insert(
            "valid_until_ts".into(),
            CanonicalJsonValue::Integer(9_999_999_999i64.try_into().unwrap()),
        );
        assert!(check_key_object(server, &tampered).unwrap_err().contains("self-signature"));
        // Unsigned.
        let mut unsigned = object_signed_by(server.as_str(), &key(1), 1_000);
        unsigned.remove("signatures");
        assert!(check_key_object(server, &unsigned).is_err());
    }
}
