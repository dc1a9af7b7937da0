//! Request helpers shared by the black-box tests.

use std::fmt::Write as _;

use serde_json::{Value, json};

/// The v3 client API prefix.
pub const V3: &str = "/_matrix/client/v3";

/// Percent-encodes one path segment (room ids, event ids, state keys).
pub fn enc(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `/_matrix/client/v3/rooms/{room_id}{rest}`.
pub fn room_path(room_id: &str, rest: &str) -> String {
    format!("{V3}/rooms/{}{rest}", enc(room_id))
}

/// Asserts an error response's status and errcode.
#[track_caller]
pub fn assert_error(response: &(u16, Value), status: u16, errcode: &str, what: &str) {
    assert_eq!(
        (response.0, response.1["errcode"].as_str()),
        (status, Some(errcode)),
        "{what}: {}",
        response.1
    );
}

/// An `m.text` message content.
pub fn text(body: &str) -> Value {
    json!({ "msgtype": "m.text", "body": body })
}

pub fn event_id_of(response: &Value) -> String {
    let id = response["event_id"].as_str().unwrap_or_else(|| panic!("no event_id in {response}"));
    assert!(id.starts_with('$'), "{id}");
    id.to_owned()
}
