//! PDUs: building, hashing, signing and event ids (via ruma-signatures), and
//! the parsed form the authorisation rules read (ruma-state-res's `Event`).
//!
//! Every event seqline creates is a real, signed PDU of its room's version, so
//! that federation can take it as it is.

use std::collections::HashMap;
use std::sync::Arc;

use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::events::TimelineEventType;
use ruma::room_version_rules::RoomVersionRules;
use ruma::serde::Raw;
use ruma::{
    EventId, MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedRoomId, OwnedUserId, RoomId, ServerName, UInt,
    UserId,
};
use serde::Deserialize;
use serde_json::value::RawValue as RawJsonValue;

use crate::error::{Error, Result};
use crate::signing_key::ServerKey;

/// The largest PDU taken or built here, in bytes of canonical JSON
/// (signatures included). The spec allows 65,536; ruma's format check, ours
/// and that of every ruma-based server, refuses more than 65,535, so an
/// event of exactly 65,536 bytes would be refused elsewhere: one byte less
/// keeps every event of ours acceptable to every server.
pub const MAX_PDU_BYTES: usize = 65_535;

/// The deepest an event may be (2^53 - 1, the canonical JSON integer bound).
/// Depth is the sender's hint: a remote event may claim this much, and the
/// events after it stay at it rather than fail to build.
pub const MAX_DEPTH: u64 = (1 << 53) - 1;

/// The depth an event takes after prev events whose deepest is `deepest`
/// (a stored, possibly remote, value): one more, capped at [`MAX_DEPTH`].
pub fn depth_after(deepest: i64) -> u64 {
    u64::try_from(deepest).unwrap_or(0).saturating_add(1).min(MAX_DEPTH)
}

/// A depth as the room's head keeps it: what the sender claimed, capped.
pub fn stored_depth(depth: u64) -> i64 {
    i64::try_from(depth.min(MAX_DEPTH)).unwrap_or(0)
}

/// The longest event type and state key the spec allows, in bytes.
pub const MAX_TYPE_OR_KEY_BYTES: usize = 255;

/// How deeply event content may nest objects and arrays: deep enough for any
/// real content, shallow enough that the PDU and the client formats around it
/// stay within what common JSON parsers take (serde_json stops at 128).
pub const MAX_CONTENT_DEPTH: usize = 100;

/// What a local sender wants to put in a room, before it is a PDU.
#[derive(Debug, Clone)]
pub struct Draft {
    /// Event type.
    pub kind: String,
    /// `Some` for state events.
    pub state_key: Option<String>,
    /// The event content, as sent.
    pub content: CanonicalJsonObject,
    /// The sender.
    pub sender: OwnedUserId,
    /// For `m.room.redaction`: the event redacted (top-level `redacts` before
    /// room version 11, inside `content` from 11 on).
    pub redacts: Option<OwnedEventId>,
}

/// A stored or freshly built PDU, parsed enough for authorisation and serving.
#[derive(Debug, Clone)]
pub struct Pdu {
    /// Event id (the `event_id` field in v1/v2 rooms, the reference hash after: `version::event_id`).
    pub event_id: OwnedEventId,
    /// `None` only for the create event of a v12+ room.
    pub room_id: Option<OwnedRoomId>,
    /// Sender.
    pub sender: OwnedUserId,
    /// Origin timestamp.
    pub origin_server_ts: MilliSecondsSinceUnixEpoch,
    /// Event type.
    pub kind: TimelineEventType,
    /// Content, raw.
    pub content: Box<RawJsonValue>,
    /// State key for state events.
    pub state_key: Option<String>,
    /// Previous events in the DAG.
    pub prev_events: Vec<OwnedEventId>,
    /// Auth events.
    pub auth_events: Vec<OwnedEventId>,
    /// Redaction target, wherever the room version puts it (what the auth
    /// rules read; which of the two places counts is [`Pdu::redaction_target`]).
    pub redacts: Option<OwnedEventId>,
    /// `content.redacts` of a redaction (where room version 11+ reads it).
    redacts_in_content: Option<OwnedEventId>,
    /// The top-level `redacts` (where versions before 11 read it).
    redacts_top_level: Option<OwnedEventId>,
    /// Depth in the DAG.
    pub depth: u64,
    /// The whole PDU as canonical JSON text (parsed into an object only when
    /// something needs the object: hashing, signing checks).
    text: Arc<str>,
    /// Held as rejected (it failed the rules against its auth events or the
    /// state before it): the auth rules refuse events that cite it, and
    /// state resolution leaves it out.
    pub rejected: bool,
}

#[derive(Deserialize)]
struct PduFields {
    room_id: Option<OwnedRoomId>,
    sender: OwnedUserId,
    origin_server_ts: MilliSecondsSinceUnixEpoch,
    #[serde(rename = "type")]
    kind: TimelineEventType,
    content: Box<RawJsonValue>,
    state_key: Option<String>,
    #[serde(default)]
    prev_events: Vec<Reference>,
    #[serde(default)]
    auth_events: Vec<Reference>,
    redacts: Option<OwnedEventId>,
    #[serde(default)]
    depth: UInt,
}

/// An entry of `prev_events` or `auth_events`: a plain id (room version 3
/// on) or an `[id, hashes]` pair (versions 1 and 2; the form each version
/// must use is checked where other servers' PDUs come in:
/// `version::check_references`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Reference {
    Id(OwnedEventId),
    Pair(OwnedEventId, serde::de::IgnoredAny),
}

impl Reference {
    fn into_id(self) -> OwnedEventId {
        match self {
            Self::Id(id) | Self::Pair(id, _) => id,
        }
    }
}

#[derive(Deserialize)]
struct RedactsInContent {
    redacts: Option<OwnedEventId>,
}

impl Pdu {
    fn from_text(event_id: OwnedEventId, text: Arc<str>) -> Result<Self> {
        let fields: PduFields =
            serde_json::from_str(&text).map_err(|e| Error::Internal(format!("pdu fields: {e}")))?;
        let redacts_in_content = if fields.kind == TimelineEventType::RoomRedaction {
            serde_json::from_str::<RedactsInContent>(fields.content.get()).ok().and_then(|c| c.redacts)
        } else {
            None
        };
        let redacts = fields.redacts.clone().or_else(|| redacts_in_content.clone());
        Ok(Self {
            event_id,
            room_id: fields.room_id,
            sender: fields.sender,
            origin_server_ts: fields.origin_server_ts,
            kind: fields.kind,
            content: fields.content,
            state_key: fields.state_key,
            prev_events: fields.prev_events.into_iter().map(Reference::into_id).collect(),
            auth_events: fields.auth_events.into_iter().map(Reference::into_id).collect(),
            redacts,
            redacts_in_content,
            redacts_top_level: fields.redacts,
            depth: fields.depth.into(),
            text,
            rejected: false,
        })
    }

    /// Parses a stored PDU (its canonical JSON text as kept in the `events`
    /// table): only the fields are read, the text is kept as it is.
    pub fn from_stored(event_id: &str, json: &str) -> Result<Self> {
        let event_id =
            EventId::parse(event_id).map_err(|e| Error::Internal(format!("stored event id: {e}")))?;
        Self::from_text(event_id, json.into())
    }

    /// The whole PDU as a canonical JSON object.
    pub fn canonical(&self) -> Result<CanonicalJsonObject> {
        serde_json::from_str(&self.text).map_err(|e| Error::Internal(format!("pdu json: {e}")))
    }

    /// Content deserialised as `T`.
    pub fn content_as<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(self.content.get()).ok()
    }

    /// The event a redaction names, where its room version puts it: inside
    /// `content` from room version 11 on, at the top level before. `None` for
    /// other events and for a redaction that names nothing in that place.
    pub fn redaction_target(
        &self,
        rules: &ruma::room_version_rules::RedactionRules,
    ) -> Option<&OwnedEventId> {
        if self.kind != TimelineEventType::RoomRedaction {
            return None;
        }
        if rules.content_field_redacts {
            self.redacts_in_content.as_ref()
        } else {
            self.redacts_top_level.as_ref()
        }
    }

    /// The event as the write path sees a local one (type, state key,
    /// content, sender, redaction target).
    pub fn as_draft(&self) -> Result<Draft> {
        let content: CanonicalJsonObject = serde_json::from_str(self.content.get())
            .map_err(|e| Error::BadJson(format!("The event content is not a canonical JSON object: {e}")))?;
        Ok(Draft {
            kind: self.kind.to_string(),
            state_key: self.state_key.clone(),
            content,
            sender: self.sender.clone(),
            redacts: self.redacts.clone(),
        })
    }

    /// Parses a PDU another server sent, checked already (its canonical
    /// JSON object, without `unsigned`, and the event id it has in its
    /// room's version).
    pub fn from_checked(event_id: OwnedEventId, object: &CanonicalJsonObject) -> Result<Self> {
        let text = serde_json::to_string(object).map_err(|e| Error::Internal(format!("pdu json: {e}")))?;
        Self::from_text(event_id, text.into())
            .map_err(|e| Error::BadJson(format!("The event does not have the fields of a PDU: {e}")))
    }

    /// The PDU as JSON text, for storage.
    pub fn to_json_string(&self) -> String {
        self.text.to_string()
    }

    /// The reference hash of the event (what versions 1 and 2 list beside
    /// its id where other events point at it).
    pub fn reference_hash(&self, rules: &RoomVersionRules) -> Result<String> {
        super::version::reference_hash(&self.canonical()?, rules)
    }
}

impl ruma::state_res::Event for Pdu {
    type Id = OwnedEventId;

    fn event_id(&self) -> &Self::Id {
        &self.event_id
    }
    fn room_id(&self) -> Option<&RoomId> {
        self.room_id.as_deref()
    }
    fn sender(&self) -> &UserId {
        &self.sender
    }
    fn origin_server_ts(&self) -> MilliSecondsSinceUnixEpoch {
        self.origin_server_ts
    }
    fn event_type(&self) -> &TimelineEventType {
        &self.kind
    }
    fn content(&self) -> &RawJsonValue {
        &self.content
    }
    fn state_key(&self) -> Option<&str> {
        self.state_key.as_deref()
    }
    fn prev_events(&self) -> Box<dyn DoubleEndedIterator<Item = &Self::Id> + '_> {
        Box::new(self.prev_events.iter())
    }
    fn auth_events(&self) -> Box<dyn DoubleEndedIterator<Item = &Self::Id> + '_> {
        Box::new(self.auth_events.iter())
    }
    fn redacts(&self) -> Option<&Self::Id> {
        self.redacts.as_ref()
    }
    fn rejected(&self) -> bool {
        self.rejected
    }
}

/// Where a new event goes in the DAG.
#[derive(Debug, Clone)]
pub struct Placement<'a> {
    /// The room, or `None` for a v12 create event (whose id becomes the room id).
    pub room_id: Option<&'a RoomId>,
    /// Previous events (the room's forward extremities).
    pub prev_events: Vec<OwnedEventId>,
    /// Auth events chosen by the auth-events selection rules.
    pub auth_events: Vec<OwnedEventId>,
    /// Room versions 1 and 2: the reference hash of each prev and auth
    /// event, by id (they are listed with it); empty for later versions.
    pub reference_hashes: HashMap<OwnedEventId, String>,
    /// Depth: one more than the deepest prev event.
    pub depth: u64,
    /// Origin timestamp.
    pub origin_server_ts: MilliSecondsSinceUnixEpoch,
}

/// Builds, hashes and signs a PDU; returns it parsed, with its event id.
pub fn build(
    rules: &RoomVersionRules,
    server_name: &ServerName,
    key: &ServerKey,
    draft: &Draft,
    placement: Placement<'_>,
) -> Result<Pdu> {
    let references = |ids: &[OwnedEventId]| {
        super::version::references(rules, ids, |id| placement.reference_hashes.get(id).cloned())
    };
    let mut content = draft.content.clone();
    let mut object = CanonicalJsonObject::new();
    if let Some(redacts) = &draft.redacts {
        if rules.redaction.content_field_redacts {
            content.insert("redacts".into(), CanonicalJsonValue::String(redacts.to_string()));
        } else {
            object.insert("redacts".into(), CanonicalJsonValue::String(redacts.to_string()));
        }
    }
    object.insert("auth_events".into(), references(&placement.auth_events)?);
    object.insert("content".into(), CanonicalJsonValue::Object(content));
    object.insert("depth".into(), CanonicalJsonValue::Integer(int(placement.depth)?));
    object.insert(
        "origin_server_ts".into(),
        CanonicalJsonValue::Integer(int(u64::from(placement.origin_server_ts.0))?),
    );
    object.insert("prev_events".into(), references(&placement.prev_events)?);
    if let Some(room_id) = placement.room_id {
        object.insert("room_id".into(), CanonicalJsonValue::String(room_id.to_string()));
    }
    object.insert("sender".into(), CanonicalJsonValue::String(draft.sender.to_string()));
    if let Some(state_key) = &draft.state_key {
        object.insert("state_key".into(), CanonicalJsonValue::String(state_key.clone()));
    }
    object.insert("type".into(), CanonicalJsonValue::String(draft.kind.clone()));
    super::version::assign_event_id(rules, server_name, &mut object);

    ruma::signatures::hash_and_sign_event(server_name.as_str(), &key.pair, &mut object, &rules.redaction)
        .map_err(|e| match e {
            ruma::signatures::JsonError::PduTooLarge => too_large(),
            other => Error::Internal(format!("signing failed: {other}")),
        })?;
    let text = serde_json::to_string(&object).map_err(|e| Error::Internal(format!("pdu json: {e}")))?;
    if text.len() > MAX_PDU_BYTES {
        return Err(too_large());
    }
    let event_id = super::version::event_id(&object, rules).map_err(|e| match e {
        Error::TooLarge(_) => e,
        other => Error::Internal(format!("event id: {other}")),
    })?;
    Pdu::from_text(event_id, text.into())
}

/// What every new event must be, whichever path it comes by (checked by
/// `RoomWriter::append` before it reads anything, and by createRoom for the
/// create event, the one event built outside it): a type and
/// state key within the spec's 255 bytes and without NUL characters (which
/// no identifier holds and PostgreSQL cannot store in text), and content no
/// deeper than [`MAX_CONTENT_DEPTH`].
pub fn check_draft(draft: &Draft) -> Result<()> {
    for (what, value) in [("event type", Some(&draft.kind)), ("state key", draft.state_key.as_ref())] {
        let Some(value) = value else { continue };
        if value.len() > MAX_TYPE_OR_KEY_BYTES {
            return Err(Error::TooLarge(format!("The {what} is longer than {MAX_TYPE_OR_KEY_BYTES} bytes")));
        }
        if value.contains('\0') {
            return Err(Error::InvalidParam(format!("The {what} must not contain NUL characters")));
        }
    }
    if deeper_than(&draft.content, MAX_CONTENT_DEPTH) {
        return Err(Error::BadJson(format!(
            "The event content is nested deeper than {MAX_CONTENT_DEPTH} levels"
        )));
    }
    Ok(())
}

/// Whether `object` (at depth 1) holds arrays or objects nested more than
/// `limit` levels; looks no deeper than `limit + 1`.
fn deeper_than(object: &CanonicalJsonObject, limit: usize) -> bool {
    fn value_deeper(value: &CanonicalJsonValue, depth: usize, limit: usize) -> bool {
        match value {
            CanonicalJsonValue::Object(o) => {
                depth > limit || o.values().any(|v| value_deeper(v, depth + 1, limit))
            }
            CanonicalJsonValue::Array(a) => {
                depth > limit || a.iter().any(|v| value_deeper(v, depth + 1, limit))
            }
            _ => false,
        }
    }
    limit == 0 || object.values().any(|v| value_deeper(v, 2, limit))
}

fn too_large() -> Error {
    Error::TooLarge(format!("The event is larger than {MAX_PDU_BYTES} bytes"))
}

fn int(n: u64) -> Result<ruma::Int> {
    ruma::Int::try_from(n).map_err(|_| Error::Internal("integer out of range".into()))
}

/// Turns a client's JSON object into canonical JSON, refusing what canonical
/// JSON cannot hold (floats, integers beyond 2^53).
pub fn canonical_content(value: serde_json::Value) -> Result<CanonicalJsonObject> {
    match CanonicalJsonValue::try_from(value) {
        Ok(CanonicalJsonValue::Object(object)) => Ok(object),
        Ok(_) => Err(Error::BadJson("The event content must be a JSON object".into())),
        Err(e) => Err(Error::BadJson(format!("The event content is not valid canonical JSON: {e}"))),
    }
}

/// Raw JSON of a value, for ruma's `Raw` fields.
pub fn raw<T>(json: &CanonicalJsonObject) -> Option<Raw<T>> {
    serde_json::value::to_raw_value(json).ok().map(Raw::from_json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruma::signatures::{PublicKeyMap, PublicKeySet};
    use serde_json::json;

    #[test]
    fn depth_is_capped_whatever_a_sender_claimed() {
        assert_eq!(depth_after(1), 2);
        assert_eq!(depth_after(MAX_DEPTH as i64 - 1), MAX_DEPTH);
        assert_eq!(depth_after(MAX_DEPTH as i64), MAX_DEPTH);
        assert_eq!(depth_after(i64::MAX), MAX_DEPTH);
        assert_eq!(depth_after(-5), 1);
        assert_eq!(stored_depth(u64::MAX), MAX_DEPTH as i64);
    }

    /// The key of the spec's signing test vectors (Appendices, "Signing key").
    fn spec_key() -> ServerKey {
        crate::signing_key::parse("ed25519 1 YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1").unwrap()
    }

    #[test]
    fn spec_vector_event_hash_and_signature() {
        // Appendices, "Signing events": the minimal event and its expected hash and signature.
        let mut object: CanonicalJsonObject = serde_json::from_value(json!({
            "room_id": "!x:domain",
            "sender": "@a:domain",
            "origin": "domain",
            "origin_server_ts": 1000000,
            "signatures": {},
            "hashes": {},
            "type": "X",
            "content": {},
            "prev_events": [],
            "auth_events": [],
            "depth": 3,
            "unsigned": { "age_ts": 1000000 }
        }))
        .unwrap();
        let rules = ruma::RoomVersionId::V1.rules().unwrap();
        ruma::signatures::hash_and_sign_event("domain", &spec_key().pair, &mut object, &rules.redaction)
            .unwrap();
        let value = serde_json::to_value(&object).unwrap();
        assert_eq!(value["hashes"]["sha256"], "5jM4wQpv6lnBo7CLIghJuHdW+s2CMBJPUOGOC89ncos");
        assert_eq!(
            value["signatures"]["domain"]["ed25519:1"],
            "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIReFGZlHi5KLjAWbOoMszkwsQma+lYAg"
        );
    }

    fn message_draft() -> Draft {
        Draft {
            kind: "m.room.message".into(),
            state_key: None,
            content: canonical_content(json!({ "msgtype": "m.text", "body": "hello" })).unwrap(),
            sender: "@a:domain".try_into().unwrap(),
            redacts: None,
        }
    }

    fn verify(key: &ServerKey, pdu: &Pdu, rules: &RoomVersionRules) {
        let mut keys = PublicKeySet::new();
        keys.insert(key.key_id(), ruma::serde::Base64::new(key.pair.public_key().to_vec()));
        let mut map = PublicKeyMap::new();
        map.insert("domain".into(), keys);
        ruma::signatures::verify_event(&map, &pdu.canonical().unwrap(), rules).unwrap();
    }

    #[test]
    fn built_events_verify_and_have_their_versions_ids() {
        let key = spec_key();
        let server: &ServerName = "domain".try_into().unwrap();
        let room_id: OwnedRoomId = "!room:domain".try_into().unwrap();
        for version in crate::room::version::CREATABLE {
            let rules = version.rules().unwrap();
            let prev: OwnedEventId =
                if super::super::version::carries_event_id(&rules) { "$prev:domain" } else { "$prevhash" }
                    .try_into()
                    .unwrap();
            let placement = Placement {
                room_id: Some(&room_id),
                prev_events: vec![prev.clone()],
                auth_events: vec![prev.clone()],
                reference_hashes: [(prev.clone(), "somehash".to_owned())].into(),
                depth: 2,
                origin_server_ts: MilliSecondsSinceUnixEpoch(UInt::from(1_000_000u32)),
            };
            let pdu = build(&rules, server, &key, &message_draft(), placement).unwrap();
            verify(&key, &pdu, &rules);
            assert_eq!(pdu.depth, 2);
            assert_eq!(pdu.prev_events, vec![prev.clone()], "{version}");
            assert_eq!(pdu.auth_events, vec![prev.clone()], "{version}");
            let object = pdu.canonical().unwrap();
            let hash = ruma::signatures::reference_hash(&object, &rules).unwrap();
            let prev_events = serde_json::to_value(&object["prev_events"]).unwrap();
            match version {
                ruma::RoomVersionId::V1 | ruma::RoomVersionId::V2 => {
                    // $<opaque>:<our name>, kept (and signed) in the PDU; pairs with hashes.
                    assert_eq!(pdu.event_id.server_name().map(|s| s.as_str()), Some("domain"));
                    assert_eq!(object["event_id"], CanonicalJsonValue::String(pdu.event_id.to_string()));
                    assert_eq!(prev_events, json!([["$prev:domain", { "sha256": "somehash" }]]));
                }
                _ => {
                    assert_eq!(pdu.event_id.as_str(), format!("${hash}"));
                    assert!(!object.contains_key("event_id"));
                    assert_eq!(prev_events, json!(["$prevhash"]));
                }
            }
            if matches!(version, ruma::RoomVersionId::V1 | ruma::RoomVersionId::V2 | ruma::RoomVersionId::V3)
            {
                // Standard base64 (the v3 id, the hashes v1/v2 list).
                assert!(!hash.contains('-') && !hash.contains('_'));
            } else {
                assert!(!hash.contains('+') && !hash.contains('/'));
            }
            // The stored form parses back to the same fields.
            let stored = Pdu::from_stored(pdu.event_id.as_str(), &pdu.to_json_string()).unwrap();
            assert_eq!(stored.prev_events, pdu.prev_events);
            assert_eq!(stored.auth_events, pdu.auth_events);
        }
    }

    #[test]
    fn v1_v2_references_need_the_hashes() {
        let rules = ruma::RoomVersionId::V2.rules().unwrap();
        let room_id: OwnedRoomId = "!room:domain".try_into().unwrap();
        let placement = Placement {
            room_id: Some(&room_id),
            prev_events: vec!["$prev:domain".try_into().unwrap()],
            auth_events: vec![],
            reference_hashes: HashMap::new(),
            depth: 2,
            origin_server_ts: MilliSecondsSinceUnixEpoch(UInt::from(1u32)),
        };
        let err = build(&rules, "domain".try_into().unwrap(), &spec_key(), &message_draft(), placement);
        assert!(matches!(err, Err(Error::Internal(_))), "{err:?}");
    }

    #[test]
    fn v1_v2_pdus_parse_with_pairs() {
        // The shape another server sends in a v2 room.
        let object: CanonicalJsonObject = serde_json::from_value(json!({
            "event_id": "$e:remote", "room_id": "!r:remote", "sender": "@u:remote",
            "type": "m.room.message", "content": { "body": "x" }, "depth": 4,
            "origin_server_ts": 5,
            "prev_events": [["$p:remote", { "sha256": "aGFzaA" }]],
            "auth_events": [["$a1:remote", { "sha256": "aGFzaA" }], ["$a2:other", { "sha256": "aGFzaA" }]],
            "hashes": { "sha256": "x" }, "signatures": {}
        }))
        .unwrap();
        let pdu = Pdu::from_checked("$e:remote".try_into().unwrap(), &object).unwrap();
        assert_eq!(pdu.prev_events, vec![OwnedEventId::try_from("$p:remote").unwrap()]);
        let auth: Vec<&str> = pdu.auth_events.iter().map(|id| id.as_str()).collect();
        assert_eq!(auth, ["$a1:remote", "$a2:other"]);
        assert_eq!(pdu.depth, 4);
    }

    /// A v11 message with a body of `len` bytes, built and signed here.
    fn message_of(len: usize) -> Result<Pdu> {
        let key = spec_key();
        let rules = ruma::RoomVersionId::V11.rules().unwrap();
        let room_id: OwnedRoomId = "!room:domain".try_into().unwrap();
        let draft = Draft {
            kind: "m.room.message".into(),
            state_key: None,
            content: canonical_content(json!({ "body": "x".repeat(len) })).unwrap(),
            sender: "@a:domain".try_into().unwrap(),
            redacts: None,
        };
        let placement = Placement {
            room_id: Some(&room_id),
            prev_events: vec![],
            auth_events: vec![],
            reference_hashes: HashMap::new(),
            depth: 1,
            origin_server_ts: MilliSecondsSinceUnixEpoch(UInt::from(1u32)),
        };
        build(&rules, "domain".try_into().unwrap(), &key, &draft, placement)
    }

    #[test]
    fn oversized_events_are_too_large() {
        let err = message_of(70_000).unwrap_err();
        assert!(matches!(err, Error::TooLarge(_)), "{err:?}");
    }

    /// Near the limit, whatever is built passes ruma's format check (which
    /// every ruma-based server runs on what it receives), and what would
    /// not is refused here first.
    #[test]
    fn every_event_built_passes_the_format_check_of_other_servers() {
        let rules = ruma::RoomVersionId::V11.rules().unwrap();
        let (mut built, mut refused) = (0, 0);
        for len in 64_600..65_560 {
            match message_of(len) {
                Ok(pdu) => {
                    let object: CanonicalJsonObject = serde_json::from_str(&pdu.to_json_string()).unwrap();
                    ruma::state_res::check_pdu_format(&object, &rules.event_format)
                        .unwrap_or_else(|e| panic!("a {len}-byte body: {e}"));
                    built += 1;
                }
                Err(Error::TooLarge(_)) => refused += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(built > 0 && refused > 0, "{built} built, {refused} refused");
    }

    #[test]
    fn floats_are_not_canonical() {
        assert!(matches!(canonical_content(json!({ "x": 1.5 })), Err(Error::BadJson(_))));
        assert!(matches!(canonical_content(json!([1])), Err(Error::BadJson(_))));
    }
}
