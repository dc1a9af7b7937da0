//! Server-side room key backup (`/room_keys/...`): versions and the keys
//! stored in them, the spec's rule for which copy of a session key is kept,
//! and the errors clients read ("no backup yet" is exactly 404 M_NOT_FOUND).

use complement_tests::api::{V3, assert_error, enc};
use complement_tests::backend_tests;
use complement_tests::harness::{Backend, Server};
use reqwest::Method;
use serde_json::{Value, json};

backend_tests!(backup_versions_come_and_go, keys_are_stored_kept_by_rank_and_deleted, backups_are_private);

const ALGORITHM: &str = "m.megolm_backup.v1.curve25519-aes-sha2";

fn version_body(public_key: &str) -> Value {
    json!({ "algorithm": ALGORITHM, "auth_data": { "public_key": public_key, "signatures": {} } })
}

fn key(first_message_index: u64, forwarded_count: u64, is_verified: bool, tag: &str) -> Value {
    json!({
        "first_message_index": first_message_index,
        "forwarded_count": forwarded_count,
        "is_verified": is_verified,
        "session_data": { "ephemeral": tag, "ciphertext": format!("ct-{tag}"), "mac": "m" },
    })
}

async fn backup_versions_come_and_go(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let t = Some(alice.token.as_str());

    let none = server.get(&format!("{V3}/room_keys/version"), t).await;
    assert_error(&none, 404, "M_NOT_FOUND", "no backup yet");

    let (status, created) = server.post(&format!("{V3}/room_keys/version"), t, version_body("k1")).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created, json!({ "version": "1" }));
    let (_, latest) = server.get(&format!("{V3}/room_keys/version"), t).await;
    assert_eq!(
        latest,
        json!({
            "algorithm": ALGORITHM,
            "auth_data": { "public_key": "k1", "signatures": {} },
            "count": 0,
            "etag": "0",
            "version": "1",
        })
    );

    // A second version becomes the current one; the first is still readable.
    let (_, second) = server.post(&format!("{V3}/room_keys/version"), t, version_body("k2")).await;
    assert_eq!(second["version"], "2");
    let (_, latest) = server.get(&format!("{V3}/room_keys/version"), t).await;
    assert_eq!(
        (latest["version"].as_str(), latest["auth_data"]["public_key"].as_str()),
        (Some("2"), Some("k2"))
    );
    let (_, first) = server.get(&format!("{V3}/room_keys/version/1"), t).await;
    assert_eq!(first["auth_data"]["public_key"], "k1", "{first}");

    // Only auth_data may change.
    let mut update = version_body("k2-signed");
    update["version"] = json!("2");
    let (status, body) = server.put(&format!("{V3}/room_keys/version/2"), t, update).await;
    assert_eq!((status, body), (200, json!({})));
    let (_, latest) = server.get(&format!("{V3}/room_keys/version/2"), t).await;
    assert_eq!(latest["auth_data"]["public_key"], "k2-signed");
    let other_algorithm = json!({ "algorithm": "org.example.other", "auth_data": {} });
    let refused = server.put(&format!("{V3}/room_keys/version/2"), t, other_algorithm).await;
    assert_error(&refused, 400, "M_INVALID_PARAM", "the algorithm cannot change");
    let mut mismatch = version_body("k");
    mismatch["version"] = json!("1");
    let refused = server.put(&format!("{V3}/room_keys/version/2"), t, mismatch).await;
    assert_error(&refused, 400, "M_INVALID_PARAM", "body version differs from the path");
    let missing = server.put(&format!("{V3}/room_keys/version/7"), t, version_body("k")).await;
    assert_error(&missing, 404, "M_NOT_FOUND", "updating a version that does not exist");
    let bad = server.post(&format!("{V3}/room_keys/version"), t, json!({ "algorithm": ALGORITHM })).await;
    assert_eq!(bad.0, 400, "a version without auth_data: {}", bad.1);

    // Deleting the current version makes the previous one current again; the
    // number is not reused.
    let (status, _) = server.request(Method::DELETE, &format!("{V3}/room_keys/version/2"), t, None).await;
    assert_eq!(status, 200);
    let gone = server.get(&format!("{V3}/room_keys/version/2"), t).await;
    assert_error(&gone, 404, "M_NOT_FOUND", "a deleted version");
    let again = server.request(Method::DELETE, &format!("{V3}/room_keys/version/2"), t, None).await;
    assert_error(&again, 404, "M_NOT_FOUND", "deleting twice");
    let (_, latest) = server.get(&format!("{V3}/room_keys/version"), t).await;
    assert_eq!(latest["version"], "1");
    let (_, third) = server.post(&format!("{V3}/room_keys/version"), t, version_body("k3")).await;
    assert_eq!(third["version"], "3");
    let nonsense = server.get(&format!("{V3}/room_keys/version/latest-ish"), t).await;
    assert_error(&nonsense, 404, "M_NOT_FOUND", "a version that is not a number");
}

async fn keys_are_stored_kept_by_rank_and_deleted(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let t = Some(alice.token.as_str());
    let room_a = "!a:test.local";
    let room_b = "!b:test.local";
    let session_path = |room: &str, session: &str, version: &str| {
        format!("{V3}/room_keys/keys/{}/{}?version={version}", enc(room), enc(session))
    };

    let no_backup = server.put(&session_path(room_a, "s1", "1"), t, key(0, 0, false, "x")).await;
    assert_error(&no_backup, 404, "M_NOT_FOUND", "keys with no backup at all");

    server.post(&format!("{V3}/room_keys/version"), t, version_body("k1")).await;
    let (status, stored) = server
        .put(
            &format!("{V3}/room_keys/keys?version=1"),
            t,
            json!({ "rooms": {
                room_a: { "sessions": { "s1": key(5, 1, false, "a1"), "s2": key(0, 0, true, "a2") } },
                room_b: { "sessions": { "s3": key(2, 0, false, "b3") } },
            }}),
        )
        .await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored, json!({ "count": 3, "etag": "1" }));

    // A worse copy of s1 (higher index) changes nothing, not even the etag.
    let (_, same) = server.put(&session_path(room_a, "s1", "1"), t, key(9, 0, false, "worse")).await;
    assert_eq!(same, json!({ "count": 3, "etag": "1" }));
    // A better one (lower index) replaces it; then a verified one beats any index.
    let (_, better) = server.put(&session_path(room_a, "s1", "1"), t, key(3, 4, false, "better")).await;
    assert_eq!(better, json!({ "count": 3, "etag": "2" }));
    let (_, s1) = server.get(&session_path(room_a, "s1", "1"), t).await;
    assert_eq!(s1, key(3, 4, false, "better"));
    server.put(&session_path(room_a, "s1", "1"), t, key(3, 2, false, "fewer-forwards")).await;
    server.put(&session_path(room_a, "s1", "1"), t, key(8, 8, true, "verified")).await;
    server.put(&session_path(room_a, "s1", "1"), t, key(0, 0, false, "unverified-again")).await;
    let (_, s1) = server.get(&session_path(room_a, "s1", "1"), t).await;
    assert_eq!(s1["session_data"]["ephemeral"], "verified", "{s1}");

    // Reading back: everything, one room, one session.
    let (_, all) = server.get(&format!("{V3}/room_keys/keys?version=1"), t).await;
    assert_eq!(
        all,
        json!({ "rooms": {
            room_a: { "sessions": { "s1": key(8, 8, true, "verified"), "s2": key(0, 0, true, "a2") } },
            room_b: { "sessions": { "s3": key(2, 0, false, "b3") } },
        }})
    );
    let (_, room) = server.get(&format!("{V3}/room_keys/keys/{}?version=1", enc(room_b)), t).await;
    assert_eq!(room, json!({ "sessions": { "s3": key(2, 0, false, "b3") } }));
    let (_, empty) =
        server.get(&format!("{V3}/room_keys/keys/{}?version=1", enc("!none:test.local")), t).await;
    assert_eq!(empty, json!({ "sessions": {} }), "a room without keys");
    let missing = server.get(&session_path(room_b, "nope", "1"), t).await;
    assert_error(&missing, 404, "M_NOT_FOUND", "a session without a key");
    let wrong = server.get(&format!("{V3}/room_keys/keys?version=9"), t).await;
    assert_error(&wrong, 404, "M_NOT_FOUND", "reading a version that does not exist");
    let (_, info) = server.get(&format!("{V3}/room_keys/version"), t).await;
    assert_eq!((info["count"].as_i64(), info["etag"].as_str()), (Some(3), Some("4")), "{info}");

    // A new version: writes to the old one are refused with the current version.
    server.post(&format!("{V3}/room_keys/version"), t, version_body("k2")).await;
    let stale = server.put(&session_path(room_a, "s9", "1"), t, key(0, 0, false, "late")).await;
    assert_error(&stale, 403, "M_WRONG_ROOM_KEYS_VERSION", "writing to an old version");
    assert_eq!(stale.1["current_version"], "2");
    let bad = server.put(&session_path(room_a, "s9", "2"), t, json!({ "first_message_index": 0 })).await;
    assert_error(&bad, 400, "M_BAD_JSON", "a key without its fields");
    let (_, v2) = server.get(&format!("{V3}/room_keys/keys?version=2"), t).await;
    assert_eq!(v2, json!({ "rooms": {} }), "nothing from the failed writes");

    // Deleting: one session, one room, everything; the old version still reads.
    let (_, after) = server.request(Method::DELETE, &session_path(room_a, "s2", "1"), t, None).await;
    assert_eq!(after, json!({ "count": 2, "etag": "5" }));
    let (_, after) = server
        .request(Method::DELETE, &format!("{V3}/room_keys/keys/{}?version=1", enc(room_b)), t, None)
        .await;
    assert_eq!(after["count"], 1);
    let (_, after) = server.request(Method::DELETE, &format!("{V3}/room_keys/keys?version=1"), t, None).await;
    assert_eq!(after["count"], 0);
    let (_, all) = server.get(&format!("{V3}/room_keys/keys?version=1"), t).await;
    assert_eq!(all, json!({ "rooms": {} }));
}

async fn backups_are_private(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    server.post(&format!("{V3}/room_keys/version"), Some(&alice.token), version_body("k1")).await;
    server
        .put(
            &format!("{V3}/room_keys/keys/{}/s1?version=1", enc("!a:test.local")),
            Some(&alice.token),
            key(0, 0, true, "secret"),
        )
        .await;
    let none = server.get(&format!("{V3}/room_keys/version"), Some(&bob.token)).await;
    assert_error(&none, 404, "M_NOT_FOUND", "bob has no backup of his own");
    let not_his = server.get(&format!("{V3}/room_keys/keys?version=1"), Some(&bob.token)).await;
    assert_error(&not_his, 404, "M_NOT_FOUND", "alice's version is not bob's");
    let (_, bobs) =
        server.post(&format!("{V3}/room_keys/version"), Some(&bob.token), version_body("b")).await;
    assert_eq!(bobs["version"], "1", "versions count per user");
    let (_, empty) = server.get(&format!("{V3}/room_keys/keys?version=1"), Some(&bob.token)).await;
    assert_eq!(empty, json!({ "rooms": {} }));
    let unauthenticated = server.get(&format!("{V3}/room_keys/version"), None).await;
    assert_error(&unauthenticated, 401, "M_MISSING_TOKEN", "no token");
}
