//! Property tests over what hostile input reaches first: request bodies and
//! path arguments (`api::extract::parse_request`, `check_json`), canonical
//! JSON of event content, stored PDUs, content redaction, filters, tokens, and
//! the interval arithmetic of the read rule. Any input gives `Ok` or a typed
//! client error, never a panic. Kept to a few seconds in all: bounded sizes
//! and case counts (the fuzz targets in `fuzz/` run the same entry points for
//! as long as one likes).

use proptest::prelude::*;
use ruma::api::IncomingRequest;
use ruma::api::client::filter::{FilterDefinition, create_filter};
use ruma::api::client::message::send_message_event;
use ruma::api::client::room::create_room;
use ruma::api::client::state::send_state_event;
use ruma::api::client::sync::sync_events;
use ruma::canonical_json::{CanonicalJsonObject, CanonicalJsonValue, redact_content_in_place};
use serde_json::Value;

use crate::api::extract::{MAX_BODY_DEPTH, check_json, parse_request};
use crate::error::Error;
use crate::room::pdu::{self, Draft, MAX_CONTENT_DEPTH};
use crate::room::visibility::{Hv, HvLine, Inputs, SeqRanges, visible};
use crate::storage::memberships::Range;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// A client error: 4xx, never a 5xx for bad input.
fn is_client_error(e: &Error) -> bool {
    e.status_and_code().0.is_client_error()
}

/// Arbitrary JSON values with odd strings and the edges of canonical numbers.
fn json_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<i64>().prop_map(Value::from),
        Just(Value::from(9_007_199_254_740_991_i64)),
        Just(Value::from(9_007_199_254_740_992_i64)),
        Just(Value::from(-9_007_199_254_740_992_i64)),
        Just(Value::from(u64::MAX)),
        any::<f64>().prop_map(Value::from),
    ];
    let string = prop_oneof![
        any::<String>(),
        Just("\u{0}".to_owned()),
        Just("\u{feff}\u{202e}\u{10ffff}".to_owned()),
        "[a-z.]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number,
        string.prop_map(Value::String)
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_.\u{0}é]{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON-looking text: tokens that get past the first byte more often than
/// random bytes do, in any order (so mostly not JSON).
fn json_text() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just(":".to_owned()),
        Just(",".to_owned()),
        Just("\"body\"".to_owned()),
        Just("\"msgtype\"".to_owned()),
        Just("\"m.text\"".to_owned()),
        Just("\"\\u0000\"".to_owned()),
        Just("\"\\ud800\"".to_owned()),
        Just("1e400".to_owned()),
        Just("-0".to_owned()),
        Just("9007199254740992".to_owned()),
        Just("null".to_owned()),
        Just(" ".to_owned()),
        "\"[^\"\\\\]{0,4}\"",
        any::<u8>().prop_map(|b| char::from(b).to_string()),
    ];
    prop::collection::vec(token, 0..40).prop_map(|t| t.concat().into_bytes())
}

fn parts(method: http::Method, uri: &str) -> http::request::Parts {
    let (parts, ()) =
        http::Request::builder().method(method).uri(uri).body(()).map(|r| r.into_parts()).unwrap();
    parts
}

/// Parses `body` as endpoint `T` and checks the outcome is `Ok` or a client error.
fn parse_any<T: IncomingRequest>(method: http::Method, uri: &str, body: &[u8], args: &[String]) {
    if let Err(e) = parse_request::<T>(parts(method, uri), body, args, false) {
        assert!(is_client_error(&e), "{e:?}");
    }
}

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn check_json_takes_any_bytes(bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..64), json_text()]) {
        match check_json(&bytes) {
            // What passes the check parses, so no later step says "not JSON".
            Ok(()) => prop_assert!(serde_json::from_slice::<Value>(&bytes).is_ok()),
            Err(e) => prop_assert!(matches!(e, Error::NotJson(_) | Error::BadJson(_)), "{e:?}"),
        }
    }

    #[test]
    fn every_serialised_value_passes_and_its_duplicate_keys_do_not(value in json_value(), key in "[a-z]{1,4}") {
        let text = serde_json::to_string(&value).unwrap();
        prop_assert!(check_json(text.as_bytes()).is_ok(), "{text}");
        // The same key twice in one object, even spelled with an escape.
        let first = key.chars().next().unwrap();
        let escaped = format!("\\u{:04x}{}", u32::from(first), &key[first.len_utf8()..]);
        let doubled = format!("{{\"{key}\":{text},\"x\":1,\"{escaped}\":2}}");
        prop_assert!(matches!(check_json(doubled.as_bytes()), Err(Error::BadJson(_))), "{doubled}");
    }

    #[test]
    fn nesting_passes_up_to_the_limit(depth in 0..=MAX_BODY_DEPTH + 30) {
        let ok = check_json(nested(depth).as_bytes()).is_ok();
        prop_assert_eq!(ok, depth <= MAX_BODY_DEPTH);
    }

    #[test]
    fn canonical_content_takes_exactly_objects_of_canonical_numbers(value in json_value()) {
        fn canonical_numbers(v: &Value) -> bool {
            match v {
                Value::Number(n) => n.as_i64().is_some_and(|i| i.unsigned_abs() < (1 << 53)),
                Value::Array(a) => a.iter().all(canonical_numbers),
                Value::Object(o) => o.values().all(canonical_numbers),
                _ => true,
            }
        }
        let expected = value.is_object() && canonical_numbers(&value);
        match pdu::canonical_content(value.clone()) {
            Ok(object) => {
                prop_assert!(expected);
                // Canonical text parses back to the same object.
                let text = serde_json::to_string(&object).unwrap();
                let back: CanonicalJsonObject = serde_json::from_str(&text).unwrap();
                prop_assert_eq!(&back, &object);
                prop_assert_eq!(serde_json::to_value(&object).unwrap(), value);
            }
            Err(e) => {
                prop_assert!(!expected);
                prop_assert!(matches!(e, Error::BadJson(_)), "{e:?}");
            }
        }
    }

    #[test]
    fn redacted_content_keeps_a_subset_of_its_keys(
        value in json_value(),
        kind in prop_oneof![
            Just("m.room.member"), Just("m.room.create"), Just("m.room.join_rules"),
            Just("m.room.power_levels"), Just("m.room.history_visibility"), Just("m.room.redaction"),
            Just("m.room.message"),
        ],
    ) {
        let Ok(content) = pdu::canonical_content(value) else { return Ok(()) };
        for version in [ruma::RoomVersionId::V10, ruma::RoomVersionId::V11, ruma::RoomVersionId::V12] {
            let rules = version.rules().unwrap();
            let mut redacted = content.clone();
            redact_content_in_place(&mut redacted, &rules.redaction, kind);
            prop_assert!(redacted.keys().all(|k| content.contains_key(k)));
        }
    }

    #[test]
    fn stored_pdus_of_any_text_parse_or_fail(id in "\\PC{0,20}", text in prop_oneof![
        json_text().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        json_value().prop_map(|v| serde_json::to_string(&v).unwrap()),
    ]) {
        if let Err(e) = crate::room::pdu::Pdu::from_stored(&id, &text) {
            prop_assert!(matches!(e, Error::Internal(_)), "{e:?}");
        }
    }

    #[test]
    fn request_bodies_of_the_write_endpoints_parse_or_are_client_errors(
        body in prop_oneof![
            json_text(),
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
            prop::collection::vec(any::<u8>(), 0..32),
        ],
        arg in prop_oneof![Just("!r:x".to_owned()), Just("@u:x".to_owned()), "\\PC{0,10}", Just("\u{0}".to_owned())],
    ) {
        let room = "/_matrix/client/v3/rooms/%21r%3Ax";
        let args = |n: usize| vec![arg.clone(); n];
        parse_any::<send_message_event::v3::Request>(
            http::Method::PUT, &format!("{room}/send/m.room.message/t"), &body, &args(3));
        parse_any::<send_state_event::v3::Request>(
            http::Method::PUT, &format!("{room}/state/m.room.name/k"), &body, &args(3));
        parse_any::<create_room::v3::Request>(
            http::Method::POST, "/_matrix/client/v3/createRoom", &body, &[]);
        parse_any::<create_filter::v3::Request>(
            http::Method::POST, "/_matrix/client/v3/user/%40u%3Ax/filter", &body, &args(1));
        if let Ok(text) = std::str::from_utf8(&body) {
            let _ = serde_json::from_str::<FilterDefinition>(text);
        }
    }

    #[test]
    fn sync_query_strings_parse_or_are_client_errors(query in "\\PC{0,40}", filter in json_value()) {
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        for q in [enc(&query), format!("filter={}", enc(&filter.to_string())), format!("since={}", enc(&query))] {
            parse_any::<sync_events::v3::Request>(http::Method::GET, &format!("/_matrix/client/v3/sync?{q}"), b"", &[]);
        }
        let _ = crate::sync::Token::parse(&query);
        let _ = crate::room::history::parse_token(&query);
    }

    #[test]
    fn drafts_beyond_the_limits_are_refused(kind_len in 0usize..300, key_len in 0usize..300, nul in any::<bool>()) {
        let mut kind = "t".repeat(kind_len);
        if nul { kind.push('\u{0}'); }
        let draft = Draft {
            kind: kind.clone(),
            state_key: Some("k".repeat(key_len)),
            content: CanonicalJsonObject::new(),
            sender: "@u:x".try_into().unwrap(),
            redacts: None,
        };
        let ok = pdu::check_draft(&draft).is_ok();
        prop_assert_eq!(ok, kind.len() <= 255 && key_len <= 255 && !nul);
    }

    #[test]
    fn content_depth_is_checked(depth in 1usize..=MAX_CONTENT_DEPTH + 5) {
        let mut value = CanonicalJsonValue::Integer(1u32.into());
        for _ in 1..depth {
            value = CanonicalJsonValue::Array(vec![value]);
        }
        let mut content = CanonicalJsonObject::new();
        content.insert("x".into(), value);
        let draft = Draft {
            kind: "m.room.message".into(),
            state_key: None,
            content,
            sender: "@u:x".try_into().unwrap(),
            redacts: None,
        };
        // The object itself is level 1, so `depth - 1` arrays make `depth` levels.
        prop_assert_eq!(pdu::check_draft(&draft).is_ok(), depth <= MAX_CONTENT_DEPTH);
    }

    #[test]
    fn seq_ranges_are_sorted_disjoint_and_cover_the_union(
        parts in prop::collection::vec(
            prop_oneof![
                (-50i64..50, -50i64..50),
                (any::<i64>(), any::<i64>()),
                Just((i64::MAX - 1, i64::MAX)),
                Just((i64::MIN, i64::MIN + 1)),
            ],
            0..12,
        )
    ) {
        let ranges = SeqRanges::from_unsorted(parts.clone());
        for pair in ranges.0.windows(2) {
            // Sorted, disjoint and not even adjacent (else they would be one).
            prop_assert!(pair[0].1.saturating_add(1) < pair[1].0, "{:?}", ranges);
        }
        prop_assert!(ranges.0.iter().all(|(lo, hi)| lo <= hi));
        // Every edge of every input, and just past it, is in the output exactly when in an input.
        let in_union = |s: i64| parts.iter().any(|&(lo, hi)| lo <= s && s <= hi);
        for &(lo, hi) in &parts {
            for s in [lo.saturating_sub(1), lo, hi, hi.saturating_add(1)] {
                prop_assert_eq!(ranges.contains(s), in_union(s), "seq {} of {:?} -> {:?}", s, parts, ranges);
            }
        }
    }

    #[test]
    fn visible_ranges_stay_within_the_floor_and_the_line(
        stays in prop::collection::vec(
            (prop_oneof![Just("join"), Just("invite"), Just("knock"), Just("other")], 0i64..60, prop::option::of(0i64..60), 0i64..60),
            0..4,
        ),
        changes in prop::collection::vec((0i64..60, 0u8..4), 0..4),
        last_seq in 0i64..60,
        floor in -5i64..60,
    ) {
        let ranges: Vec<Range> = stays
            .into_iter()
            .map(|(kind, min_seq, max_seq, window_seq)| Range { kind: kind.into(), min_seq, max_seq, window_seq })
            .collect();
        let mut changes: Vec<(i64, Hv)> = changes
            .into_iter()
            .map(|(seq, v)| (seq, [Hv::Joined, Hv::Invited, Hv::Shared, Hv::WorldReadable][usize::from(v)]))
            .collect();
        changes.sort_by_key(|c| c.0);
        let hv = HvLine { changes };
        let v = visible(&Inputs { ranges: &ranges, hv: &hv, last_seq, floor });
        for pair in v.0.windows(2) {
            prop_assert!(pair[0].1 < pair[1].0);
        }
        prop_assert!(v.0.iter().all(|&(lo, hi)| lo <= hi && lo >= floor.max(1) && hi <= last_seq), "{:?}", v);
    }
}
