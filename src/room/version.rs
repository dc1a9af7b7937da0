//! What differs between room versions in the shape of a PDU, decided here
//! once for local events and other servers' alike (the authorisation rules
//! and the redaction algorithm are ruma's, read from `RoomVersionRules`):
//!
//! - the event id: versions 1 and 2 carry it in the PDU's `event_id` field
//!   (`$<opaque>:<server>`, made by the server that creates the event and
//!   signed with it); version 3 derives it from the reference hash in
//!   standard base64, version 4 on in URL-safe base64;
//! - `prev_events` and `auth_events`: versions 1 and 2 list
//!   `[event_id, {"sha256": reference hash}]` pairs, version 3 on plain ids;
//! - which room an event belongs to: the one its `room_id` names, but in
//!   version 12 on the create event names none and belongs to the room
//!   whose id is its event id with the `!` sigil (`belongs_to`);
//! - which versions this server creates rooms in (1 to 12) and which it
//!   takes part in over federation (2 to 12: version 1 needs state
//!   resolution v1, which ruma does not have).

use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue};
use ruma::events::TimelineEventType;
use ruma::room_version_rules::{EventIdFormatVersion, EventsReferenceFormatVersion, RoomVersionRules};
use ruma::{EventId, OwnedEventId, RoomId, RoomVersionId, ServerName};

use crate::error::{Error, Result};
use crate::room::pdu::Pdu;

/// Room versions this server creates rooms in.
pub const CREATABLE: [RoomVersionId; 12] = [
    RoomVersionId::V1,
    RoomVersionId::V2,
    RoomVersionId::V3,
    RoomVersionId::V4,
    RoomVersionId::V5,
    RoomVersionId::V6,
    RoomVersionId::V7,
    RoomVersionId::V8,
    RoomVersionId::V9,
    RoomVersionId::V10,
    RoomVersionId::V11,
    RoomVersionId::V12,
];

/// Room versions this server joins, accepts joins and invites in, and
/// exchanges events of with other servers: all it creates but the first,
/// version 1, whose state resolution (v1) ruma does not implement.
pub const FEDERATED: &[RoomVersionId] = CREATABLE.split_at(1).1;

/// The default version for new rooms (the spec recommends 12 since v1.16).
pub const DEFAULT: RoomVersionId = RoomVersionId::V12;

/// Whether rooms of `version` take part in federation here.
pub fn federates(version: &RoomVersionId) -> bool {
    FEDERATED.contains(version)
}

/// Refuses another server's request about a room of a version that does not
/// federate here (400 M_INCOMPATIBLE_ROOM_VERSION, as for make_join's `ver`).
pub fn check_federates(version: &RoomVersionId) -> Result<()> {
    if federates(version) {
        Ok(())
    } else {
        Err(Error::IncompatibleRoomVersion { room_version: version.to_string() })
    }
}

/// The rules of the version another server says its room is in (make_join,
/// make_leave; `None`: the spec's default, version 1), if this server takes
/// part in it: else 400 M_UNSUPPORTED_ROOM_VERSION for our user.
pub fn federated_rules(version: Option<&RoomVersionId>) -> Result<(RoomVersionId, RoomVersionRules)> {
    let version = version.cloned().unwrap_or(RoomVersionId::V1);
    let rules = version.rules().filter(|_| federates(&version)).ok_or_else(|| {
        Error::UnsupportedRoomVersion(format!("Room version {version} is not supported here"))
    })?;
    Ok((version, rules))
}

/// Whether `pdu` is an event of `room_id`. An event names its room in
/// `room_id`, except in versions whose room id is the create event's (12
/// on): there the create event names none and belongs to the room whose id
/// is `!` + its event id without the `$`. Another server's answer holding
/// an event of another room is refused whole (a local user's real join of
/// another room must not make them a member of this one).
pub fn belongs_to(rules: &RoomVersionRules, pdu: &Pdu, room_id: &RoomId) -> bool {
    if rules.authorization.room_create_event_id_as_room_id && pdu.kind == TimelineEventType::RoomCreate {
        let hash = pdu.event_id.as_str().strip_prefix('$');
        return pdu.room_id.is_none() && hash.is_some_and(|h| room_id.as_str().strip_prefix('!') == Some(h));
    }
    pdu.room_id.as_deref() == Some(room_id)
}

/// Whether the version's event ids are carried in the PDU (versions 1, 2).
pub fn carries_event_id(rules: &RoomVersionRules) -> bool {
    rules.event_id_format == EventIdFormatVersion::V1
}

/// Whether the version lists prev and auth events as `[id, hashes]` pairs.
pub fn references_are_pairs(rules: &RoomVersionRules) -> bool {
    rules.events_reference_format == EventsReferenceFormatVersion::V1
}

/// Gives an event this server is about to hash and sign its id where the
/// room version carries it in the PDU (versions 1 and 2): a fresh
/// `$<random>:<server_name>` put in `event_id`, so that the signature covers
/// it. Other versions: nothing (their id is the reference hash, known only
/// once the event is signed: [`event_id`]).
pub fn assign_event_id(rules: &RoomVersionRules, server_name: &ServerName, object: &mut CanonicalJsonObject) {
    if carries_event_id(rules) {
        use rand::Rng;
        let mut rng = rand::rng();
        let opaque: String = (0..18)
            .map(|_| {
                const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
                char::from(ALPHABET[(rng.next_u32() as usize) % ALPHABET.len()])
            })
            .collect();
        object.insert("event_id".into(), CanonicalJsonValue::String(format!("${opaque}:{server_name}")));
    } else {
        object.remove("event_id");
    }
}

/// The event id of a signed PDU in its room's version: the `event_id` field
/// in versions 1 and 2 (which must be a `$<opaque>:<server>` id), the
/// reference hash after.
pub fn event_id(object: &CanonicalJsonObject, rules: &RoomVersionRules) -> Result<OwnedEventId> {
    if carries_event_id(rules) {
        let id = object
            .get("event_id")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::BadJson("The event has no event_id".into()))?;
        let id = EventId::parse(id).map_err(|e| Error::BadJson(format!("Invalid event_id: {e}")))?;
        if id.server_name().is_none() {
            return Err(Error::BadJson(format!(
                "The event_id {id} names no server, as this room version requires"
            )));
        }
        return Ok(id);
    }
    let hash = reference_hash(object, rules)?;
    EventId::parse(format!("${hash}")).map_err(|e| Error::Internal(format!("event id: {e}")))
}

/// The reference hash of a signed PDU, unpadded base64 as its room version
/// writes it.
pub fn reference_hash(object: &CanonicalJsonObject, rules: &RoomVersionRules) -> Result<String> {
    ruma::signatures::reference_hash(object, rules).map_err(|e| match e {
        ruma::signatures::JsonError::PduTooLarge => {
            Error::TooLarge(format!("The event is larger than {} bytes", super::pdu::MAX_PDU_BYTES))
        }
        other => Error::BadJson(format!("Cannot compute the event's reference hash: {other}")),
    })
}

/// `prev_events` or `auth_events` as the room version writes them: plain ids,
/// or (versions 1, 2) each id with the reference hash of its event, which
/// `hash` answers (`None`: the event is not at hand, an internal error).
pub fn references(
    rules: &RoomVersionRules,
    ids: &[OwnedEventId],
    hash: impl Fn(&EventId) -> Option<String>,
) -> Result<CanonicalJsonValue> {
    let mut list = Vec::with_capacity(ids.len());
    for id in ids {
        let id_value = CanonicalJsonValue::String(id.to_string());
        if references_are_pairs(rules) {
            let hash = hash(id).ok_or_else(|| Error::Internal(format!("no reference hash for {id}")))?;
            let mut hashes = CanonicalJsonObject::new();
            hashes.insert("sha256".into(), CanonicalJsonValue::String(hash));
            list.push(CanonicalJsonValue::Array(vec![id_value, CanonicalJsonValue::Object(hashes)]));
        } else {
            list.push(id_value);
        }
    }
    Ok(CanonicalJsonValue::Array(list))
}

/// Checks that another server's PDU lists its prev and auth events in its
/// room version's form (ruma's format check looks at the lists' lengths
/// only): `[id, hashes]` pairs in versions 1 and 2 (`hashes` an object, its
/// `sha256` unchecked, as other servers do: Synapse leaves it out), id
/// strings after; every id an event id of the version's form.
pub fn check_references(object: &CanonicalJsonObject, rules: &RoomVersionRules) -> Result<()> {
    for field in ["prev_events", "auth_events"] {
        let Some(CanonicalJsonValue::Array(list)) = object.get(field) else {
            return Err(Error::BadJson(format!("The event's {field} is not a list")));
        };
        for entry in list {
            let id = if references_are_pairs(rules) {
                match entry {
                    // The hashes are not checked (nor always given: Synapse
                    // sends `{}`); an object they must be.
                    CanonicalJsonValue::Array(pair) if pair.len() == 2 && pair[1].as_object().is_some() => {
                        pair[0].as_str()
                    }
                    _ => None,
                }
            } else {
                entry.as_str()
            };
            let form = if references_are_pairs(rules) { "[event id, hashes] pairs" } else { "event ids" };
            let id = id.ok_or_else(|| {
                Error::BadJson(format!("The event's {field} must hold {form} in this room version"))
            })?;
            let id = EventId::parse(id).map_err(|e| Error::BadJson(format!("Invalid id in {field}: {e}")))?;
            if carries_event_id(rules) != id.server_name().is_some() {
                return Err(Error::BadJson(format!(
                    "{id} in {field} is not an event id of this room version"
                )));
            }
        }
    }
    Ok(())
}

/// A room version a client asked for, if this server creates rooms in it.
pub fn creatable(version: &RoomVersionId) -> bool {
    CREATABLE.contains(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: serde_json::Value) -> CanonicalJsonObject {
        serde_json::from_value(value).unwrap()
    }

    fn pdu(id: &str, kind: &str, room_id: Option<&str>) -> Pdu {
        let mut json = json!({
            "sender": "@a:x", "type": kind, "state_key": "", "content": {}, "origin_server_ts": 1,
            "depth": 1, "prev_events": [], "auth_events": [], "hashes": {"sha256": "x"}, "signatures": {},
        });
        if let Some(room_id) = room_id {
            json["room_id"] = json!(room_id);
        }
        Pdu::from_stored(id, &json.to_string()).unwrap()
    }

    #[test]
    fn an_event_belongs_to_the_room_it_names_and_a_v12_create_to_its_own_id() {
        let v11 = RoomVersionId::V11.rules().unwrap();
        let v12 = RoomVersionId::V12.rules().unwrap();
        let room: &RoomId = "!abc".try_into().unwrap();
        let other: &RoomId = "!other".try_into().unwrap();
        let join = pdu("$j", "m.room.member", Some("!abc"));
        assert!(belongs_to(&v12, &join, room) && !belongs_to(&v12, &join, other));
        assert!(belongs_to(&v11, &join, room) && !belongs_to(&v11, &join, other));
        // v12: the create event names no room; its id is the room's.
        assert!(belongs_to(&v12, &pdu("$abc", "m.room.create", None), room));
        assert!(!belongs_to(&v12, &pdu("$abc", "m.room.create", None), other));
        assert!(!belongs_to(&v12, &pdu("$xyz", "m.room.create", None), room));
        assert!(!belongs_to(&v12, &pdu("$abc", "m.room.create", Some("!abc")), room));
        // Before v12 it names its room like any event.
        assert!(belongs_to(&v11, &pdu("$c", "m.room.create", Some("!abc")), room));
        assert!(!belongs_to(&v11, &pdu("$abc", "m.room.create", None), room));
    }

    #[test]
    fn federated_versions_are_2_to_12() {
        let federated: Vec<&str> = FEDERATED.iter().map(|v| v.as_str()).collect();
        assert_eq!(federated, ["2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12"]);
        assert!(!federates(&RoomVersionId::V1) && check_federates(&RoomVersionId::V1).is_err());
        assert!(creatable(&RoomVersionId::V1) && creatable(&DEFAULT));
        assert!(matches!(federated_rules(None), Err(Error::UnsupportedRoomVersion(_))));
        assert!(matches!(federated_rules(Some(&RoomVersionId::V1)), Err(Error::UnsupportedRoomVersion(_))));
        let (version, rules) = federated_rules(Some(&RoomVersionId::V2)).unwrap();
        assert!(version == RoomVersionId::V2 && references_are_pairs(&rules));
    }

    #[test]
    fn v1_and_v2_ids_come_from_the_event_id_field() {
        for version in [RoomVersionId::V1, RoomVersionId::V2] {
            let rules = version.rules().unwrap();
            let good =
                object(json!({ "event_id": "$abc:example.org", "prev_events": [], "auth_events": [] }));
            assert_eq!(event_id(&good, &rules).unwrap().as_str(), "$abc:example.org");
            let missing = object(json!({ "prev_events": [], "auth_events": [] }));
            assert!(matches!(event_id(&missing, &rules), Err(Error::BadJson(_))));
            // A v3+ style id names no server: not an id of these versions.
            let hashlike = object(json!({ "event_id": "$abcdef", "prev_events": [], "auth_events": [] }));
            assert!(matches!(event_id(&hashlike, &rules), Err(Error::BadJson(_))));
            let not_an_id = object(json!({ "event_id": "abc:example.org" }));
            assert!(matches!(event_id(&not_an_id, &rules), Err(Error::BadJson(_))));
        }
    }

    #[test]
    fn v3_ids_ignore_the_event_id_field() {
        let rules = RoomVersionId::V3.rules().unwrap();
        let event = object(json!({
            "event_id": "$abc:example.org", "type": "m.room.message", "room_id": "!r:example.org",
            "sender": "@a:example.org", "content": {}, "prev_events": [], "auth_events": [],
            "depth": 1, "origin_server_ts": 1, "hashes": { "sha256": "x" }
        }));
        let id = event_id(&event, &rules).unwrap();
        assert_ne!(id.as_str(), "$abc:example.org");
        assert!(id.server_name().is_none());
    }

    #[test]
    fn assigned_ids_name_our_server_only_where_the_version_carries_them() {
        let server: &ServerName = "example.org".try_into().unwrap();
        for version in CREATABLE {
            let rules = version.rules().unwrap();
            let mut event = object(json!({ "event_id": "$stale:elsewhere" }));
            assign_event_id(&rules, server, &mut event);
            let id = event.get("event_id").and_then(|v| v.as_str());
            if matches!(version, RoomVersionId::V1 | RoomVersionId::V2) {
                let id = EventId::parse(id.unwrap()).unwrap();
                assert_eq!(id.server_name().map(|s| s.as_str()), Some("example.org"));
            } else {
                assert_eq!(id, None, "{version}");
            }
        }
    }

    #[test]
    fn references_per_version() {
        let ids: Vec<OwnedEventId> = vec!["$a:x".try_into().unwrap()];
        let v2 = RoomVersionId::V2.rules().unwrap();
        let pairs = references(&v2, &ids, |_| Some("h".into())).unwrap();
        assert_eq!(serde_json::to_value(&pairs).unwrap(), json!([["$a:x", { "sha256": "h" }]]));
        assert!(matches!(references(&v2, &ids, |_| None), Err(Error::Internal(_))));
        let v4 = RoomVersionId::V4.rules().unwrap();
        let plain = references(&v4, &["$hash".try_into().unwrap()], |_| None).unwrap();
        assert_eq!(serde_json::to_value(&plain).unwrap(), json!(["$hash"]));
    }

    #[test]
    fn reference_shapes_are_checked_per_version() {
        let v2 = RoomVersionId::V2.rules().unwrap();
        let v3 = RoomVersionId::V3.rules().unwrap();
        let pairs =
            object(json!({ "prev_events": [["$a:x", { "sha256": "h" }]], "auth_events": [["$b:y", {}]] }));
        let plain = object(json!({ "prev_events": ["$hash"], "auth_events": [] }));
        assert!(check_references(&pairs, &v2).is_ok());
        assert!(check_references(&plain, &v2).is_err());
        assert!(check_references(&plain, &v3).is_ok());
        assert!(check_references(&pairs, &v3).is_err());
        for bad in [
            json!({ "prev_events": [["$a:x"]], "auth_events": [] }),
            json!({ "prev_events": [["$a:x", "h"]], "auth_events": [] }),
            json!({ "prev_events": [["$a:x", {}, {}]], "auth_events": [] }),
            json!({ "prev_events": [["$nohost", { "sha256": "h" }]], "auth_events": [] }),
            json!({ "prev_events": [], "auth_events": [["a:x", { "sha256": "h" }]] }),
            json!({ "prev_events": [] }),
        ] {
            assert!(matches!(check_references(&object(bad.clone()), &v2), Err(Error::BadJson(_))), "{bad}");
        }
        let v3_with_server = object(json!({ "prev_events": ["$a:x"], "auth_events": [] }));
        assert!(check_references(&v3_with_server, &v3).is_err());
    }
}
