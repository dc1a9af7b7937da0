//! Request bodies and path arguments of the write endpoints (send, state,
//! createRoom, filter), as the `Ruma<T>` extractor parses them, then the
//! content on its way to a PDU: canonical JSON, the draft limits, redaction.
//! Input: the first byte picks the path argument, the rest is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ruma::api::IncomingRequest;
use ruma::api::client::filter::create_filter;
use ruma::api::client::message::send_message_event;
use ruma::api::client::room::create_room;
use ruma::api::client::state::send_state_event;
use ruma::canonical_json::redact_content_in_place;
use seqline::api::extract::{check_json, parse_request};
use seqline::room::pdu::{self, Draft};

const ARGS: &[&str] = &["!r:x", "@u:x", "m.room.message", "", "\0", "é\u{202e}", "%00", "a/b"];

fn parse<T: IncomingRequest>(method: http::Method, uri: &str, body: &[u8], args: &[String]) {
    let (parts, ()) = http::Request::builder().method(method).uri(uri).body(()).unwrap().into_parts();
    if let Err(e) = parse_request::<T>(parts, body, args, false) {
        assert!(e.status_and_code().0.is_client_error(), "{e:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let arg = ARGS[usize::from(pick) % ARGS.len()].to_owned();
    let room = "/_matrix/client/v3/rooms/%21r%3Ax";
    let args = |n: usize| vec![arg.clone(); n];
    parse::<send_message_event::v3::Request>(
        http::Method::PUT,
        &format!("{room}/send/m.room.message/t"),
        body,
        &args(3),
    );
    parse::<send_state_event::v3::Request>(
        http::Method::PUT,
        &format!("{room}/state/m.room.name/k"),
        body,
        &args(3),
    );
    parse::<create_room::v3::Request>(http::Method::POST, "/_matrix/client/v3/createRoom", body, &[]);
    parse::<create_filter::v3::Request>(
        http::Method::POST,
        "/_matrix/client/v3/user/%40u%3Ax/filter",
        body,
        &args(1),
    );

    // What the send path does with content that passed the check.
    if check_json(body).is_err() {
        return;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        panic!("check_json passed what serde_json cannot parse");
    };
    let Ok(content) = pdu::canonical_content(value) else { return };
    let draft = Draft {
        kind: arg.clone(),
        state_key: Some(arg.clone()),
        content: content.clone(),
        sender: "@u:x".try_into().unwrap(),
        redacts: None,
    };
    let _ = pdu::check_draft(&draft);
    for version in [ruma::RoomVersionId::V10, ruma::RoomVersionId::V11, ruma::RoomVersionId::V12] {
        let rules = version.rules().unwrap();
        let mut redacted = content.clone();
        redact_content_in_place(&mut redacted, &rules.redaction, arg.clone());
        assert!(redacted.keys().all(|k| content.contains_key(k)));
    }
});
