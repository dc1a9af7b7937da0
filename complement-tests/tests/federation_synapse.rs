//! seqline and a real Synapse (PyPI, `clients/synapse/`) federating over
//! loopback TLS, each named `127.0.0.1:<its federation port>`: each notary
//! fetches, checks and countersigns the other's key; profiles and aliases are
//! asked of the other server both ways, with X-Matrix requests signed by one
//! and verified by the other (each fetching the other's key on demand).
//!
//! Each test starts its own Synapse (`complement_tests::synapse`); without
//! Synapse installed (no Python 3.10+, no PyPI on the first run) the tests fail
//! with the setup script's reason.

use complement_tests::api::enc;
use complement_tests::backend_tests;
use complement_tests::federation::{FedServer, now_ms, verify};
use complement_tests::harness::Backend;
use complement_tests::synapse::{Synapse, SynapseOptions};
use serde_json::{Value, json};

backend_tests!(
    notaries_countersign_each_others_keys,
    seqline_reads_a_synapse_profile,
    synapse_reads_a_seqline_profile,
    aliases_resolve_both_ways,
);

/// Starts seqline and Synapse side by side.
async fn pair(backend: &Backend, options: SynapseOptions) -> (FedServer, Synapse) {
    let (seqline, synapse) = tokio::join!(FedServer::start(backend), Synapse::start_with(options));
    (seqline, synapse)
}

async fn notaries_countersign_each_others_keys(backend: Backend) {
    let (seq, syn) = pair(&backend, SynapseOptions::default()).await;
    let (seq_key_id, seq_public) = seq.public_key();

    // Synapse's notary has never seen seqline: it fetches seqline's key from
    // seqline's /_matrix/key/v2/server, checks the self-signature and adds its own.
    let query = json!({
        "server_keys": { seq.name.clone(): { seq_key_id.clone(): { "minimum_valid_until_ts": now_ms() } } }
    });
    let (status, body) = syn.federation("POST", "/_matrix/key/v2/query", Some(&query)).await;
    assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    let keys = body["server_keys"].as_array().unwrap_or_else(|| panic!("{body}\n{}", syn.log_tail()));
    assert_eq!(keys.len(), 1, "{body}\n{}", syn.log_tail());
    let seq_keys = &keys[0];
    assert_eq!(seq_keys["server_name"], seq.name.as_str());
    assert_eq!(seq_keys["verify_keys"], json!({ seq_key_id.clone(): { "key": seq_public.clone() } }));
    assert_eq!(seq_keys["old_verify_keys"], json!({}));
    verify(seq_keys, &seq.name, &seq_key_id, &seq_public);
    verify(seq_keys, &syn.name, &syn.key_id, &syn.public_key);
    let signers: Vec<&String> = seq_keys["signatures"].as_object().unwrap().keys().collect();
    let mut expected = vec![&seq.name, &syn.name];
    expected.sort_unstable();
    assert_eq!(signers, expected, "{seq_keys}");
    // seqline's key is valid for a day; Synapse passes that on.
    let day = 24 * 60 * 60 * 1000;
    let valid_until = seq_keys["valid_until_ts"].as_i64().unwrap();
    assert!((valid_until - (now_ms() + day)).abs() < 60_000, "valid_until_ts {valid_until}: {seq_keys}");

    // seqline's notary has never seen Synapse: the same the other way round.
    let query = json!({
        "server_keys": { syn.name.clone(): { syn.key_id.clone(): { "minimum_valid_until_ts": now_ms() } } }
    });
    let (status, body) = seq.send("POST", "/_matrix/key/v2/query", None, Some(&query)).await;
    assert_eq!(status, 200, "{body}\n{}", seq.server.log());
    let keys = body["server_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{body}\n{}", seq.server.log());
    let syn_keys = &keys[0];
    assert_eq!(syn_keys["server_name"], syn.name.as_str());
    assert_eq!(syn_keys["verify_keys"], json!({ syn.key_id.clone(): { "key": syn.public_key.clone() } }));
    verify(syn_keys, &syn.name, &syn.key_id, &syn.public_key);
    verify(syn_keys, &seq.name, &seq_key_id, &seq_public);
    let (status, own) = syn.federation("GET", "/_matrix/key/v2/server", None).await;
    assert_eq!(status, 200);
    assert_eq!(syn_keys["valid_until_ts"], own["valid_until_ts"], "{syn_keys} vs {own}");
    assert_eq!(key_fetches(&seq, &syn), 1, "{}", seq.server.log());
}

/// How often seqline fetched Synapse's keys (its log line per fetch).
fn key_fetches(seq: &FedServer, syn: &Synapse) -> usize {
    let server = format!("server={}", syn.name);
    seq.server.log().lines().filter(|l| l.contains("fetched server keys") && l.contains(&server)).count()
}

/// `/_matrix/client/v3/profile/{user_id}` and then `field` ("", "/displayname", ...).
fn profile_path(user_id: &str, field: &str) -> String {
    format!("/_matrix/client/v3/profile/{}{field}", enc(user_id))
}

async fn seqline_reads_a_synapse_profile(backend: Backend) {
    let (seq, syn) = pair(&backend, SynapseOptions::default()).await;
    let sue = syn.register("sue", "pw").await;
    assert_eq!(sue.user_id, syn.user_id("sue"));
    let avatar = format!("mxc://{}/suesavatar", syn.name);
    let (status, body) = syn
        .put(&profile_path(&sue.user_id, "/displayname"), Some(&sue.token), json!({ "displayname": "Sue S" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = syn
        .put(&profile_path(&sue.user_id, "/avatar_url"), Some(&sue.token), json!({ "avatar_url": avatar }))
        .await;
    assert_eq!(status, 200, "{body}");
    let alice = seq.server.register("alice", "pw").await;

    // seqline asks Synapse (signed); Synapse fetches seqline's key to check it.
    let (status, body) = seq.server.get(&profile_path(&sue.user_id, ""), Some(&alice.token)).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", seq.server.log(), syn.log_tail());
    assert_eq!(body, json!({ "displayname": "Sue S", "avatar_url": avatar }));
    let (status, body) =
        seq.server.get(&profile_path(&sue.user_id, "/displayname"), Some(&alice.token)).await;
    assert_eq!((status, body), (200, json!({ "displayname": "Sue S" })));
    let (status, body) = seq.server.get(&profile_path(&sue.user_id, "/avatar_url"), Some(&alice.token)).await;
    assert_eq!((status, body), (200, json!({ "avatar_url": avatar })));
    // Synapse answers that query only when signed: seqline's signature checked out.
    let uri = format!("/_matrix/federation/v1/query/profile?user_id={}", enc(&sue.user_id));
    let (status, body) = syn.federation("GET", &uri, None).await;
    assert_eq!((status, body["errcode"].as_str()), (401, Some("M_UNAUTHORIZED")), "{body}");

    // Someone Synapse does not know: its 404 comes through as seqline's own.
    let (status, body) = seq.server.get(&profile_path(&syn.user_id("nobody"), ""), Some(&alice.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
}

async fn synapse_reads_a_seqline_profile(backend: Backend) {
    let (seq, syn) = pair(&backend, SynapseOptions::default()).await;
    let alice = seq.server.register("alice", "pw").await;
    assert_eq!(alice.user_id, seq.user_id("alice"));
    let avatar = format!("mxc://{}/alicesavatar", seq.name);
    let (status, _) = seq
        .server
        .put(
            &profile_path(&alice.user_id, "/displayname"),
            Some(&alice.token),
            json!({ "displayname": "Alice Seq" }),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = seq
        .server
        .put(
            &profile_path(&alice.user_id, "/avatar_url"),
            Some(&alice.token),
            json!({ "avatar_url": avatar }),
        )
        .await;
    assert_eq!(status, 200);
    let sue = syn.register("sue", "pw").await;

    // Synapse asks seqline (signed); seqline fetches Synapse's key to check it.
    let (status, body) = syn.get(&profile_path(&alice.user_id, ""), Some(&sue.token)).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", seq.server.log(), syn.log_tail());
    assert_eq!(body, json!({ "displayname": "Alice Seq", "avatar_url": avatar }));
    let (status, body) = syn.get(&profile_path(&alice.user_id, "/displayname"), Some(&sue.token)).await;
    assert_eq!((status, body), (200, json!({ "displayname": "Alice Seq" })));
    let (status, body) = syn.get(&profile_path(&alice.user_id, "/avatar_url"), Some(&sue.token)).await;
    assert_eq!((status, body), (200, json!({ "avatar_url": avatar })));
    // One fetch of Synapse's key, then the cached key for the later requests.
    assert_eq!(key_fetches(&seq, &syn), 1, "{}", seq.server.log());

    // Someone seqline does not know: Synapse passes on seqline's 404.
    let (status, body) = syn.get(&profile_path(&seq.user_id("nobody"), ""), Some(&sue.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
}

/// `/_matrix/client/v3/directory/room/{alias}`.
fn alias_path(alias: &str) -> String {
    format!("/_matrix/client/v3/directory/room/{}", enc(alias))
}

async fn create_room(syn: &Synapse, token: &str, body: Value) -> String {
    let (status, room) = syn.post("/_matrix/client/v3/createRoom", Some(token), body).await;
    assert_eq!(status, 200, "{room}\n{}", syn.log_tail());
    room["room_id"].as_str().unwrap().to_owned()
}

async fn aliases_resolve_both_ways(backend: Backend) {
    // Room version 10 by default, so room ids carry Synapse's name.
    let (seq, syn) = pair(&backend, SynapseOptions::default().default_room_version("10")).await;
    let sue = syn.register("sue", "pw").await;
    let v10 = create_room(&syn, &sue.token, json!({ "room_alias_name": "lounge" })).await;
    assert!(v10.ends_with(&format!(":{}", syn.name)), "{v10}");
    let v12 =
        create_room(&syn, &sue.token, json!({ "room_alias_name": "attic", "room_version": "12" })).await;
    assert!(v12.starts_with('!') && !v12.contains(':'), "{v12}");
    let alice = seq.server.register("alice", "pw").await;
    let (status, room) = seq
        .server
        .post("/_matrix/client/v3/createRoom", Some(&alice.token), json!({ "room_alias_name": "lobby" }))
        .await;
    assert_eq!(status, 200, "{room}");
    let seq_room = room["room_id"].as_str().unwrap().to_owned();

    // seqline asks Synapse.
    for (alias, room_id) in [("lounge", &v10), ("attic", &v12)] {
        let alias = format!("#{alias}:{}", syn.name);
        let (status, body) = seq.server.get(&alias_path(&alias), Some(&alice.token)).await;
        assert_eq!(status, 200, "{alias}: {body}\n{}\n{}", seq.server.log(), syn.log_tail());
        assert_eq!(body, json!({ "room_id": room_id, "servers": [syn.name.clone()] }), "{alias}");
    }
    let (status, body) =
        seq.server.get(&alias_path(&format!("#nothing:{}", syn.name)), Some(&alice.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");

    // Synapse asks seqline.
    let alias = format!("#lobby:{}", seq.name);
    let (status, body) = syn.get(&alias_path(&alias), Some(&sue.token)).await;
    assert_eq!(status, 200, "{body}\n{}\n{}", seq.server.log(), syn.log_tail());
    assert_eq!(body, json!({ "room_id": seq_room, "servers": [seq.name.clone()] }));
    let (status, body) = syn.get(&alias_path(&format!("#nothing:{}", seq.name)), Some(&sue.token)).await;
    assert_eq!((status, body["errcode"].as_str()), (404, Some("M_NOT_FOUND")), "{body}");
}
