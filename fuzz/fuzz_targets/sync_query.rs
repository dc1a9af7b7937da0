//! `/sync` and `/messages` as a query string reaches them: the inline filter
//! (JSON in the query), `since`, `from`, `to`, and the tokens seqline parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ruma::api::IncomingRequest;
use ruma::api::client::filter::FilterDefinition;
use ruma::api::client::message::get_message_events;
use ruma::api::client::sync::sync_events;
use seqline::api::extract::parse_request;

fn parse<T: IncomingRequest>(uri: &str, args: &[String]) {
    let Ok(request) = http::Request::builder().method(http::Method::GET).uri(uri).body(()) else { return };
    let (parts, ()) = request.into_parts();
    if let Err(e) = parse_request::<T>(parts, b"", args, false) {
        assert!(e.status_and_code().0.is_client_error(), "{e:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let encoded: String = text.bytes().map(|b| format!("%{b:02X}")).collect();
    parse::<sync_events::v3::Request>(
        &format!("/_matrix/client/v3/sync?filter={encoded}&since={encoded}"),
        &[],
    );
    parse::<sync_events::v3::Request>(&format!("/_matrix/client/v3/sync?{text}"), &[]);
    parse::<get_message_events::v3::Request>(
        &format!(
            "/_matrix/client/v3/rooms/%21r%3Ax/messages?dir=b&from={encoded}&to={encoded}&filter={encoded}"
        ),
        &["!r:x".to_owned()],
    );
    let _ = serde_json::from_str::<FilterDefinition>(text);
    let _ = seqline::sync::Token::parse(text);
    let _ = seqline::room::history::parse_token(text);
});
