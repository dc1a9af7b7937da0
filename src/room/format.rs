//! Events as clients see them (the client-server "ClientEvent" format):
//! redaction applied, `room_id` always present (also on a v12 create event),
//! and `unsigned` with `age`, `membership`, `transaction_id` (for the sending
//! device only) and `redacted_because`.

use ruma::canonical_json::{CanonicalJsonObject, redact_content_in_place};
use ruma::room_version_rules::RoomVersionRules;
use serde_json::{Map, Value, json};

use super::pdu::Pdu;
use crate::account::Requester;
use crate::storage::{self, events::StoredEvent};

/// Who is looking, and what their membership was at the event.
#[derive(Debug, Clone, Copy)]
pub struct Viewer<'a> {
    /// The requester.
    pub requester: &'a Requester,
    /// Their membership after the event (`unsigned.membership`).
    pub membership: &'a str,
}

/// An event's content as redaction leaves it.
pub fn redacted_content(pdu: &Pdu, rules: &RoomVersionRules) -> Value {
    let mut content: CanonicalJsonObject = serde_json::from_str(pdu.content.get()).unwrap_or_default();
    redact_content_in_place(&mut content, &rules.redaction, pdu.kind.to_string());
    serde_json::to_value(&content).unwrap_or_else(|_| json!({}))
}

/// The client form of a stored event. `redaction` is the redaction event when
/// the event has been redacted.
pub fn client_event(
    stored: &StoredEvent,
    pdu: &Pdu,
    rules: &RoomVersionRules,
    redaction: Option<&Pdu>,
    viewer: Option<Viewer<'_>>,
) -> Value {
    let content: Value = if redaction.is_some() {
        redacted_content(pdu, rules)
    } else {
        serde_json::from_str(pdu.content.get()).unwrap_or_else(|_| json!({}))
    };
    let mut event = Map::new();
    event.insert("content".into(), content);
    event.insert("event_id".into(), json!(pdu.event_id));
    event.insert("origin_server_ts".into(), json!(pdu.origin_server_ts));
    event.insert("room_id".into(), json!(stored.room_id));
    event.insert("sender".into(), json!(pdu.sender));
    event.insert("type".into(), json!(pdu.kind.to_string()));
    if let Some(state_key) = &pdu.state_key {
        event.insert("state_key".into(), json!(state_key));
    }
    if let Some(redacts) = pdu.redaction_target(&rules.redaction) {
        event.insert("redacts".into(), json!(redacts));
    }
    let mut unsigned = Map::new();
    let age = storage::now_ms() - i64::try_from(u64::from(pdu.origin_server_ts.0)).unwrap_or(0);
    unsigned.insert("age".into(), json!(age.max(0)));
    if let Some(viewer) = viewer {
        unsigned.insert("membership".into(), json!(viewer.membership));
        if pdu.sender == viewer.requester.user_id
            && stored.txn_device_id.as_deref() == Some(viewer.requester.device_id.as_str())
            && let Some(txn_id) = &stored.txn_id
        {
            unsigned.insert("transaction_id".into(), json!(txn_id));
        }
    }
    if let Some(redaction) = redaction {
        let stored_redaction = StoredEvent {
            room_id: stored.room_id.clone(),
            seq: 0,
            event_id: redaction.event_id.to_string(),
            json: String::new(),
            redacted_by: None,
            txn_device_id: None,
            txn_id: None,
            has_children: None,
        };
        unsigned
            .insert("redacted_because".into(), client_event(&stored_redaction, redaction, rules, None, None));
    }
    event.insert("unsigned".into(), Value::Object(unsigned));
    Value::Object(event)
}
