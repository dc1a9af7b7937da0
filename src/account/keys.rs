//! The E2EE keys users upload, checked before anything is stored: device keys
//! must be the caller's own and carry their device's valid self-signature;
//! signed one-time and fallback keys the device key's; self-signing and
//! user-signing keys the master key's. Signatures uploaded later
//! (`/keys/signatures/upload`) are verified with the signer's key and kept per
//! signer and signing key (`key_signatures`), never replacing another signer's.
//!
//! A signature is ed25519 over the canonical JSON of the object without
//! `signatures` and `unsigned`. Knows nothing of HTTP.

use base64::Engine;
use base64::alphabet::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ruma::api::client::uiaa::AuthData;
use ruma::canonical_json::CanonicalJsonValue;
use ruma::signatures::{to_canonical_json_string_for_signing, verify_canonical_json_bytes};
use ruma::{OwnedUserId, SigningKeyAlgorithm};
use serde_json::{Map, Value};

use super::{Requester, e2ee, uia};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::keys::{self, KeySignature};
use crate::streams::Change;

/// Keys and signatures are base64 without padding; padded input is accepted.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// An ed25519 public key in unpadded base64, if it is one.
fn ed25519_key(encoded: &str) -> Option<[u8; 32]> {
    BASE64.decode(encoded).ok()?.try_into().ok()
}

/// The bytes a signature of `object` covers: its canonical JSON without
/// `signatures` and `unsigned`.
fn signed_bytes(object: &Value) -> Result<String> {
    let value = CanonicalJsonValue::try_from(object.clone())
        .map_err(|e| Error::BadJson(format!("A signed key is not canonical JSON: {e}")))?;
    let CanonicalJsonValue::Object(object) = value else {
        return Err(Error::BadJson("A signed key must be a JSON object".into()));
    };
    to_canonical_json_string_for_signing(&object).map_err(|e| Error::BadJson(e.to_string()))
}

/// Verifies `object.signatures[signer][key_id]` with `public_key` (unpadded
/// base64 ed25519). A missing or wrong signature is `M_INVALID_SIGNATURE`.
pub fn verify_signature(object: &Value, signer: &str, key_id: &str, public_key: &str) -> Result<()> {
    let Some(signature) = object["signatures"][signer][key_id].as_str() else {
        return Err(Error::InvalidSignature(format!("No signature by {signer} with {key_id}")));
    };
    let invalid =
        || Error::InvalidSignature(format!("The signature by {signer} with {key_id} does not verify"));
    let key = ed25519_key(public_key).ok_or_else(invalid)?;
    let signature = BASE64.decode(signature).map_err(|_| invalid())?;
    let bytes = signed_bytes(object)?;
    verify_canonical_json_bytes(&SigningKeyAlgorithm::Ed25519, &key, &signature, bytes.as_bytes())
        .map_err(|_| invalid())
}

/// `key` without `signatures` and `unsigned`: what a signature covers, for
/// comparing an uploaded copy with the stored one.
fn signed_part(key: &Value) -> Value {
    let mut key = key.clone();
    if let Some(object) = key.as_object_mut() {
        object.remove("signatures");
        object.remove("unsigned");
    }
    key
}

/// Keeps only `signer`'s signatures on `key` (and of those only `key_id`'s,
/// when given).
fn keep_signatures_of(key: &mut Value, signer: &str, key_id: Option<&str>) {
    let Some(object) = key.as_object_mut() else { return };
    let mut own = object
        .get("signatures")
        .and_then(|s| s.get(signer))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(key_id) = key_id {
        own.retain(|id, _| id == key_id);
    }
    let mut signatures = Map::new();
    if !own.is_empty() {
        signatures.insert(signer.to_owned(), Value::Object(own));
    }
    object.insert("signatures".into(), Value::Object(signatures));
}

/// A cross-signing key's one public key (unpadded base64), if its `keys`
/// holds exactly one `ed25519:<public key>` entry naming itself.
pub fn cross_signing_public_key(key: &Value) -> Option<String> {
    let keys = key["keys"].as_object()?;
    let mut entries = keys.iter();
    let (id, value) = entries.next()?;
    let value = value.as_str()?;
    let single = entries.next().is_none();
    (single && id.strip_prefix("ed25519:") == Some(value) && ed25519_key(value).is_some())
        .then(|| value.to_owned())
}

/// A device's ed25519 key (unpadded base64) from its stored or uploaded keys.
fn device_ed25519(keys: &Value, device: &str) -> Option<String> {
    keys["keys"][format!("ed25519:{device}")].as_str().filter(|k| ed25519_key(k).is_some()).map(str::to_owned)
}

/// A stored cross-signing key of `user` with its public key.
async fn stored_cross_signing_key(
    state: &AppState,
    user: &str,
    kind: &str,
) -> Result<Option<(Value, String)>> {
    let Some(text) = keys::cross_signing_key(&state.db, user, kind).await? else { return Ok(None) };
    let key: Value = serde_json::from_str(&text).unwrap_or_default();
    Ok(cross_signing_public_key(&key).map(|public| (key, public)))
}

/// What one `/keys/upload` carries.
#[derive(Debug, Default)]
pub struct DeviceKeysUpload {
    /// The device's identity keys.
    pub device_keys: Option<Value>,
    /// One-time keys: (key id `<algorithm>:<id>`, algorithm, key).
    pub one_time_keys: Vec<(String, String, Value)>,
    /// Fallback keys, the same way.
    pub fallback_keys: Vec<(String, String, Value)>,
}

/// Checks then stores a device's upload. Device keys must name the caller's
/// user and device, hold the device's ed25519 key and be signed by it;
/// `signed_curve25519` keys must be signed by that key too. Only the device's
/// own signature is kept on its keys (the rest arrive, verified, through
/// [`upload_signatures`]). A bad upload stores nothing.
pub async fn upload_device_keys(state: &AppState, me: &Requester, upload: DeviceKeysUpload) -> Result<()> {
    let (user, device) = (me.user_id.as_str(), me.device_id.as_str());
    let key_id = format!("ed25519:{device}");
    let stored = keys::device_keys(&state.db, user).await?.into_iter().find(|(d, _)| d == device);
    let stored: Option<Value> = stored.map(|(_, text)| serde_json::from_str(&text).unwrap_or_default());
    let mut new_keys = None;
    let ed25519 = match upload.device_keys {
        Some(mut uploaded) => {
            if !uploaded.is_object() {
                return Err(Error::BadJson("device_keys must be a JSON object".into()));
            }
            if uploaded["user_id"] != user || uploaded["device_id"] != device {
                return Err(Error::InvalidParam("device_keys must be for this user and device".into()));
            }
            let public = device_ed25519(&uploaded, device).ok_or_else(|| {
                Error::InvalidParam(format!("device_keys.keys must hold the device's ed25519 key {key_id}"))
            })?;
            verify_signature(&uploaded, user, &key_id, &public)?;
            keep_signatures_of(&mut uploaded, user, Some(&key_id));
            if let Some(object) = uploaded.as_object_mut() {
                object.remove("unsigned");
            }
            new_keys = Some(uploaded);
            Some(public)
        }
        None => stored.as_ref().and_then(|k| device_ed25519(k, device)),
    };
    for (id, algorithm, key) in upload.one_time_keys.iter().chain(&upload.fallback_keys) {
        if algorithm != "signed_curve25519" {
            continue;
        }
        if !key.is_object() {
            return Err(Error::InvalidParam(format!("{id} must be a signed key object")));
        }
        let public = ed25519.as_deref().ok_or_else(|| {
            Error::InvalidParam("Upload the device keys before (or with) signed one-time keys".into())
        })?;
        verify_signature(key, user, &key_id, public)?;
    }

    if let Some(new_keys) = new_keys {
        let changed = stored.as_ref() != Some(&new_keys);
        if let Some(old) = &stored
            && signed_part(old) != signed_part(&new_keys)
        {
            // Other keys under the same device id: signatures of the old ones
            // (and made with them) no longer hold.
            keys::drop_key_signatures(&state.db, user, device).await?;
        }
        keys::put_device_keys(&state.db, user, device, &new_keys.to_string()).await?;
        if changed {
            e2ee::device_list_changed(state, &me.user_id, e2ee::DeviceChange::Devices(&[device])).await?;
        }
    }
    if upload.one_time_keys.is_empty() && upload.fallback_keys.is_empty() {
        return Ok(());
    }
    // The key counts move: a position says so to the user's syncs.
    let reservation = state.streams.reserve();
    for (id, algorithm, key) in &upload.one_time_keys {
        keys::add_one_time_key(&state.db, user, device, id, algorithm, &key.to_string()).await?;
    }
    for (id, algorithm, key) in &upload.fallback_keys {
        keys::put_fallback_key(&state.db, user, device, algorithm, id, &key.to_string()).await?;
    }
    reservation.finish(Change::Keys { user: user.to_owned() });
    Ok(())
}

/// What one `/keys/device_signing/upload` carries.
#[derive(Debug, Default)]
pub struct CrossSigningUpload {
    /// The master key.
    pub master: Option<Value>,
    /// The self-signing key.
    pub self_signing: Option<Value>,
    /// The user-signing key.
    pub user_signing: Option<Value>,
}

/// Checks then stores cross-signing keys. Each must be the caller's, of its
/// usage, with one ed25519 key; the self-signing and user-signing keys must
/// be signed by the master key (uploaded with them, or stored). Once a master
/// key exists, changing any key takes user-interactive auth. Signatures by
/// other users are dropped (they arrive through [`upload_signatures`]).
pub async fn upload_cross_signing_keys(
    state: &AppState,
    me: &Requester,
    upload: CrossSigningUpload,
    auth: Option<&AuthData>,
) -> Result<()> {
    let user = me.user_id.as_str();
    let mut checked = Vec::new();
    for (kind, key) in [
        ("master", upload.master),
        ("self_signing", upload.self_signing),
        ("user_signing", upload.user_signing),
    ] {
        let Some(mut key) = key else { continue };
        if key["user_id"] != user {
            return Err(Error::InvalidParam(format!("The {kind} key must be for {user}")));
        }
        if !key["usage"].as_array().is_some_and(|u| u.iter().any(|u| u == kind)) {
            return Err(Error::InvalidParam(format!("The {kind} key's usage must include \"{kind}\"")));
        }
        let public = cross_signing_public_key(&key).ok_or_else(|| {
            Error::InvalidParam(format!("The {kind} key must hold exactly one key, \"ed25519:<public key>\""))
        })?;
        // Nothing unchecked is kept: a master key's signatures (by the
        // user's devices, say) come through /keys/signatures/upload, where
        // each is verified; the others keep only the master key's, verified
        // below.
        if kind == "master" {
            keep_signatures_of(&mut key, user, Some(""));
        }
        checked.push((kind, key, public));
    }
    let has_master = keys::cross_signing_key(&state.db, user, "master").await?.is_some();
    let stored_master = stored_cross_signing_key(state, user, "master").await?;
    let master = checked
        .iter()
        .find(|(kind, ..)| *kind == "master")
        .map(|(.., public)| public.clone())
        .or_else(|| stored_master.as_ref().map(|(_, public)| public.clone()));
    for (kind, key, _) in checked.iter_mut().filter(|(kind, ..)| *kind != "master") {
        let master = master.as_deref().ok_or_else(|| {
            Error::MissingParam(format!("The {kind} key must be signed by a master key; there is none"))
        })?;
        let key_id = format!("ed25519:{master}");
        keep_signatures_of(key, user, Some(&key_id));
        verify_signature(key, user, &key_id, master)?;
    }

    // The first upload needs no UIA (there is nothing to take over yet);
    // replacing existing keys does.
    let grant = if has_master {
        Some(
            uia::authorize(state, uia::Purpose::ReplaceCrossSigningKeys, Some(me), &[&[uia::PASSWORD]], auth)
                .await?,
        )
    } else {
        None
    };
    for (kind, key, public) in &checked {
        if let Some((_, old)) = stored_cross_signing_key(state, user, kind).await?
            && old != *public
        {
            keys::drop_key_signatures(&state.db, user, &old).await?;
        }
        keys::put_cross_signing_key(&state.db, user, kind, &key.to_string()).await?;
    }
    if let Some(grant) = grant {
        grant.finish(state).await?;
    }
    e2ee::device_list_changed(state, &me.user_id, e2ee::DeviceChange::CrossSigning).await?;
    Ok(())
}

/// The outcome of [`upload_signatures`]: what was refused, per signed key.
pub type SignatureFailures = Vec<(OwnedUserId, String, Error)>;

/// A user's stored keys, loaded once per upload: the signer's and each
/// signed user's.
struct UserKeys {
    master: Option<(Value, String)>,
    self_signing: Option<String>,
    user_signing: Option<String>,
    devices: Vec<(String, Value)>,
}

impl UserKeys {
    async fn load(state: &AppState, user: &str) -> Result<Self> {
        Ok(Self {
            master: stored_cross_signing_key(state, user, "master").await?,
            self_signing: stored_cross_signing_key(state, user, "self_signing").await?.map(|(_, p)| p),
            user_signing: stored_cross_signing_key(state, user, "user_signing").await?.map(|(_, p)| p),
            devices: keys::device_keys(&state.db, user)
                .await?
                .into_iter()
                .map(|(d, text)| (d, serde_json::from_str(&text).unwrap_or_default()))
                .collect(),
        })
    }

    /// Whether `key_id` names one of these devices or cross-signing keys.
    fn has(&self, key_id: &str) -> bool {
        self.devices.iter().any(|(d, _)| d == key_id)
            || [&self.self_signing, &self.user_signing].iter().any(|k| k.as_deref() == Some(key_id))
            || self.master.as_ref().is_some_and(|(_, p)| p == key_id)
    }
}

/// Verifies and stores uploaded signatures. A user may sign their own devices
/// with their self-signing key, their own master key with their devices, and
/// another user's master key with their user-signing key. Only that signature
/// is taken from each uploaded object, which must otherwise equal the stored
/// key; any other key or signature is a failure, reported per key.
pub async fn upload_signatures(
    state: &AppState,
    me: &Requester,
    signed: Vec<(OwnedUserId, Vec<(String, Value)>)>,
) -> Result<SignatureFailures> {
    let user = me.user_id.as_str();
    let mine = UserKeys::load(state, user).await?;
    let mut failures = Vec::new();
    for (target, objects) in signed {
        let theirs =
            if target == me.user_id { None } else { Some(UserKeys::load(state, target.as_str()).await?) };
        let mut accepted = Vec::new();
        for (key_id, object) in objects {
            let checked = match &theirs {
                None => own_signatures(&mine, user, &key_id, &object),
                Some(theirs) => other_signature(&mine, user, theirs, &target, &key_id, &object),
            };
            match checked {
                Ok(signatures) => accepted.extend(signatures),
                Err(e @ (Error::Database(_) | Error::Internal(_))) => return Err(e),
                Err(e) => failures.push((target.clone(), key_id, e)),
            }
        }
        if !accepted.is_empty() {
            keys::put_key_signatures(&state.db, target.as_str(), &accepted).await?;
            // A signed device changes for the other servers; a signed
            // cross-signing key (a public key, not a device id) too.
            let known = keys::device_keys(&state.db, target.as_str()).await?;
            let devices: Vec<&str> = known
                .iter()
                .map(|(d, _)| d.as_str())
                .filter(|d| accepted.iter().any(|s| s.target_key_id == *d))
                .collect();
            let change = if target.server_name() != state.settings.server_name {
                e2ee::DeviceChange::Remote
            } else if devices.is_empty() {
                e2ee::DeviceChange::CrossSigning
            } else {
                e2ee::DeviceChange::Devices(&devices)
            };
            e2ee::device_list_changed(state, &target, change).await?;
        }
    }
    Ok(failures)
}

/// The uploaded copy must be the stored key, signatures aside.
fn same_key(uploaded: &Value, stored: &Value) -> Result<()> {
    if signed_part(uploaded) == signed_part(stored) {
        Ok(())
    } else {
        Err(Error::InvalidSignature("The signed key differs from the stored one".into()))
    }
}

/// Signatures of the caller's own device (by their self-signing key) or
/// master key (by their devices).
fn own_signatures(mine: &UserKeys, user: &str, key_id: &str, object: &Value) -> Result<Vec<KeySignature>> {
    if let Some((master, public)) = &mine.master
        && public == key_id
    {
        same_key(object, master)?;
        let self_id = format!("ed25519:{public}");
        let by_me = object["signatures"][user].as_object().cloned().unwrap_or_default();
        let mut out = Vec::new();
        for (signer_key_id, signature) in by_me.iter().filter(|(id, _)| **id != self_id) {
            let device_key = signer_key_id
                .strip_prefix("ed25519:")
                .and_then(|d| mine.devices.iter().find(|(id, _)| id == d))
                .and_then(|(d, keys)| device_ed25519(keys, d))
                .ok_or_else(|| {
                    Error::InvalidSignature(format!("{signer_key_id} is not a key of one of your devices"))
                })?;
            verify_signature(object, user, signer_key_id, &device_key)?;
            out.push(KeySignature {
                target_key_id: key_id.to_owned(),
                signer_user_id: user.to_owned(),
                signer_key_id: signer_key_id.clone(),
                signature: signature.as_str().unwrap_or_default().to_owned(),
            });
        }
        if out.is_empty() {
            return Err(Error::InvalidSignature(
                "No signature of the master key by one of your devices".into(),
            ));
        }
        return Ok(out);
    }
    if let Some((device, stored)) = mine.devices.iter().find(|(d, _)| d == key_id) {
        let ssk = mine
            .self_signing
            .as_deref()
            .ok_or_else(|| Error::NotFound("You have no self-signing key to sign devices with".into()))?;
        same_key(object, stored)?;
        let signer_key_id = format!("ed25519:{ssk}");
        verify_signature(object, user, &signer_key_id, ssk)?;
        let signature = object["signatures"][user][&signer_key_id].as_str().unwrap_or_default().to_owned();
        return Ok(vec![KeySignature {
            target_key_id: device.clone(),
            signer_user_id: user.to_owned(),
            signer_key_id,
            signature,
        }]);
    }
    if [&mine.self_signing, &mine.user_signing].iter().any(|k| k.as_deref() == Some(key_id)) {
        return Err(Error::Forbidden("Only your devices and your master key can be signed".into()));
    }
    Err(Error::NotFound(format!("You have no device or master key {key_id}")))
}

/// A signature of another user's master key by the caller's user-signing key.
fn other_signature(
    mine: &UserKeys,
    user: &str,
    theirs: &UserKeys,
    target: &OwnedUserId,
    key_id: &str,
    object: &Value,
) -> Result<Vec<KeySignature>> {
    let Some((master, _)) = theirs.master.as_ref().filter(|(_, public)| public == key_id) else {
        return Err(if theirs.has(key_id) {
            Error::Forbidden("Of another user's keys only their master key can be signed".into())
        } else {
            Error::NotFound(format!("{target} has no master key {key_id}"))
        });
    };
    let usk = mine
        .user_signing
        .as_deref()
        .ok_or_else(|| Error::NotFound("You have no user-signing key to sign other users with".into()))?;
    same_key(object, master)?;
    let signer_key_id = format!("ed25519:{usk}");
    verify_signature(object, user, &signer_key_id, usk)?;
    let signature = object["signatures"][user][&signer_key_id].as_str().unwrap_or_default().to_owned();
    Ok(vec![KeySignature {
        target_key_id: key_id.to_owned(),
        signer_user_id: user.to_owned(),
        signer_key_id,
        signature,
    }])
}

/// Adds to `key` (of `owner`, stored under `target_key_id`) the stored
/// signatures `viewer` may see: the owner's own and the viewer's. A signature
/// by someone's user-signing key is theirs alone to see.
pub fn add_signatures(
    key: &mut Value,
    owner: &str,
    target_key_id: &str,
    stored: &[KeySignature],
    viewer: &str,
) {
    let Some(object) = key.as_object_mut() else { return };
    let signatures = object.entry("signatures").or_insert_with(|| Value::Object(Map::new()));
    let Some(signatures) = signatures.as_object_mut() else { return };
    for s in stored.iter().filter(|s| s.target_key_id == target_key_id) {
        if s.signer_user_id != owner && s.signer_user_id != viewer {
            continue;
        }
        if let Some(by_signer) = signatures
            .entry(s.signer_user_id.clone())
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
        {
            by_signer.insert(s.signer_key_id.clone(), Value::String(s.signature.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use ruma::signatures::{Ed25519KeyPair, KeyPair};
    use serde_json::json;

    use super::*;

    fn key_pair(version: &str) -> (Ed25519KeyPair, String) {
        let doc = Ed25519KeyPair::generate();
        let pair = Ed25519KeyPair::from_der(&doc, version.into()).unwrap();
        let public = BASE64.encode(pair.public_key());
        (pair, public)
    }

    fn sign(object: &mut Value, signer: &str, pair: &Ed25519KeyPair) {
        let signature = pair.sign(signed_bytes(object).unwrap().as_bytes());
        object["signatures"][signer][signature.id()] = json!(signature.base64());
    }

    #[test]
    fn a_signature_verifies_only_with_its_key_and_content() {
        let (pair, public) = key_pair("DEV");
        let (_, other) = key_pair("OTHER");
        let mut object = json!({ "user_id": "@a:x", "keys": { "k": "v" }, "unsigned": { "n": 1 } });
        sign(&mut object, "@a:x", &pair);
        verify_signature(&object, "@a:x", "ed25519:DEV", &public).unwrap();
        // unsigned is not covered; other signatures do not matter.
        object["unsigned"] = json!({ "n": 2 });
        object["signatures"]["@b:x"] = json!({ "ed25519:B": "c2ln" });
        verify_signature(&object, "@a:x", "ed25519:DEV", &public).unwrap();
        let wrong_key = verify_signature(&object, "@a:x", "ed25519:DEV", &other);
        assert!(matches!(wrong_key, Err(Error::InvalidSignature(_))), "{wrong_key:?}");
        let missing = verify_signature(&object, "@a:x", "ed25519:NOPE", &public);
        assert!(matches!(missing, Err(Error::InvalidSignature(_))), "{missing:?}");
        object["keys"]["k"] = json!("changed");
        let tampered = verify_signature(&object, "@a:x", "ed25519:DEV", &public);
        assert!(matches!(tampered, Err(Error::InvalidSignature(_))), "{tampered:?}");
    }

    #[test]
    fn cross_signing_keys_name_their_one_public_key() {
        let (_, public) = key_pair("X");
        let good = json!({ "keys": { format!("ed25519:{public}"): public } });
        assert_eq!(cross_signing_public_key(&good), Some(public.clone()));
        let renamed = json!({ "keys": { "ed25519:other": public } });
        assert_eq!(cross_signing_public_key(&renamed), None);
        let two = json!({ "keys": { format!("ed25519:{public}"): public, "ed25519:b": "b" } });
        assert_eq!(cross_signing_public_key(&two), None);
        let short = json!({ "keys": { "ed25519:abc": "abc" } });
        assert_eq!(cross_signing_public_key(&short), None);
    }

    #[test]
    fn signatures_are_shown_to_owner_and_signer_only() {
        let stored = [
            KeySignature {
                target_key_id: "M".into(),
                signer_user_id: "@bob:x".into(),
                signer_key_id: "ed25519:B".into(),
                signature: "b".into(),
            },
            KeySignature {
                target_key_id: "M".into(),
                signer_user_id: "@alice:x".into(),
                signer_key_id: "ed25519:DEV".into(),
                signature: "a".into(),
            },
            KeySignature {
                target_key_id: "OTHER".into(),
                signer_user_id: "@alice:x".into(),
                signer_key_id: "ed25519:S".into(),
                signature: "o".into(),
            },
        ];
        let key = json!({ "signatures": { "@alice:x": { "ed25519:M": "self" } } });
        let mut for_bob = key.clone();
        add_signatures(&mut for_bob, "@alice:x", "M", &stored, "@bob:x");
        assert_eq!(
            for_bob["signatures"],
            json!({ "@alice:x": { "ed25519:M": "self", "ed25519:DEV": "a" }, "@bob:x": { "ed25519:B": "b" } })
        );
        let mut for_carol = key;
        add_signatures(&mut for_carol, "@alice:x", "M", &stored, "@carol:x");
        assert_eq!(
            for_carol["signatures"],
            json!({ "@alice:x": { "ed25519:M": "self", "ed25519:DEV": "a" } })
        );
    }
}
