//! PDUs as another server makes them, for tests that act as that server:
//! content hash, the redaction algorithm (room versions 10 to 12, for the
//! event types the tests sign), the server's signature over the redacted
//! event, and the event id (URL-safe reference hash).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// serde_json keeps maps sorted and prints compactly: canonical JSON.
fn canonical(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn without(value: &Value, keys: &[&str]) -> Value {
    let mut value = value.clone();
    if let Some(map) = value.as_object_mut() {
        for key in keys {
            map.remove(*key);
        }
    }
    value
}

/// The redacted form of `pdu` (room versions 11 and 12 for the top-level
/// keys; content kept per type as those versions keep it).
pub fn redact(pdu: &Value) -> Value {
    const TOP: [&str; 11] = [
        "event_id",
        "type",
        "room_id",
        "sender",
        "state_key",
        "hashes",
        "signatures",
        "depth",
        "prev_events",
        "auth_events",
        "origin_server_ts",
    ];
    let kind = pdu["type"].as_str().unwrap_or_default();
    let keep: &[&str] = match kind {
        "m.room.member" => &["membership", "join_authorised_via_users_server"],
        "m.room.join_rules" => &["join_rule", "allow"],
        "m.room.history_visibility" => &["history_visibility"],
        "m.room.redaction" => &["redacts"],
        "m.room.power_levels" => &[
            "ban",
            "events",
            "events_default",
            "invite",
            "kick",
            "redact",
            "state_default",
            "users",
            "users_default",
        ],
        _ => &[],
    };
    let mut out = Map::new();
    for key in TOP {
        if let Some(v) = pdu.get(key) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    let mut content = Map::new();
    if kind == "m.room.create" {
        content = pdu["content"].as_object().cloned().unwrap_or_default();
    } else {
        for key in keep {
            if let Some(v) = pdu["content"].get(*key) {
                content.insert((*key).to_owned(), v.clone());
            }
        }
    }
    out.insert("content".into(), Value::Object(content));
    Value::Object(out)
}

/// Hashes and signs `pdu` as `origin` with `key` (id `key_id`); answers its
/// event id (room version 4 on). In versions 1 and 2 the id is the PDU's
/// `event_id`, set before signing (the redaction keeps it: it is signed);
/// the redaction here matches theirs for the events those tests sign
/// (messages, joins).
pub fn sign(pdu: &mut Value, origin: &str, key_id: &str, key: &SigningKey) -> String {
    let bare = without(pdu, &["signatures", "unsigned", "hashes"]);
    let content_hash = Sha256::digest(canonical(&bare).as_bytes());
    pdu["hashes"] = json!({ "sha256": STANDARD_NO_PAD.encode(content_hash) });
    let redacted = without(&redact(pdu), &["signatures", "unsigned"]);
    let signature = STANDARD_NO_PAD.encode(key.sign(canonical(&redacted).as_bytes()).to_bytes());
    let signatures = pdu.as_object_mut().map(|m| m.entry("signatures").or_insert_with(|| json!({})));
    if let Some(signatures) = signatures {
        signatures[origin] = json!({ key_id: signature });
    }
    event_id(pdu)
}

/// The event id of a signed PDU (room version 4 and later).
pub fn event_id(pdu: &Value) -> String {
    let redacted = without(&redact(pdu), &["signatures", "unsigned"]);
    format!("${}", URL_SAFE_NO_PAD.encode(Sha256::digest(canonical(&redacted).as_bytes())))
}
