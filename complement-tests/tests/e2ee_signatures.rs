//! Cross-signing under attack: who may sign which key (`/keys/signatures/upload`),
//! and what the upload paths (`/keys/upload`, `/keys/device_signing/upload`)
//! accept. Every key and signature here is real ed25519; a refused signature
//! is reported in `failures` and changes nothing anyone sees in `/keys/query`.

use complement_tests::api::{V3, assert_error};
use complement_tests::backend_tests;
use complement_tests::e2ee::{Key, cross_signing_key, device_keys, signed_one_time_key};
use complement_tests::harness::{Backend, Server, User};
use serde_json::{Value, json};

backend_tests!(
    a_self_signing_signature_is_kept_beside_the_devices_own,
    eve_cannot_sign_or_overwrite_alices_keys,
    signatures_that_do_not_verify_are_refused,
    bobs_user_signing_signature_joins_alices_own,
    keys_upload_takes_only_self_signed_keys,
    device_signing_upload_needs_the_master_signature,
    replaced_keys_take_their_signatures_along,
);

/// One user's keys: their device's and their three cross-signing keys.
struct Identity {
    device: Key,
    master: Key,
    self_signing: Key,
    user_signing: Key,
}

impl Identity {
    fn new(user: &User) -> Self {
        let key = |what: &str| Key::new(&format!("{}/{what}", user.user_id));
        Self {
            device: key("device"),
            master: key("master"),
            self_signing: key("self_signing"),
            user_signing: key("user_signing"),
        }
    }

    fn master_key(&self, user: &User) -> Value {
        cross_signing_key(&user.user_id, "master", &self.master, None)
    }
}

/// Uploads `user`'s self-signed device keys and cross-signing keys (the first
/// upload takes no UIA).
async fn set_up(server: &Server, user: &User) -> Identity {
    let id = Identity::new(user);
    let keys = device_keys(&user.user_id, &user.device_id, &id.device);
    let (status, body) =
        server.post(&format!("{V3}/keys/upload"), Some(&user.token), json!({ "device_keys": keys })).await;
    assert_eq!(status, 200, "device keys of {}: {body}", user.user_id);
    let u = &user.user_id;
    let body = json!({
        "master_key": id.master_key(user),
        "self_signing_key": cross_signing_key(u, "self_signing", &id.self_signing, Some(&id.master)),
        "user_signing_key": cross_signing_key(u, "user_signing", &id.user_signing, Some(&id.master)),
    });
    let (status, body) =
        server.post(&format!("{V3}/keys/device_signing/upload"), Some(&user.token), body).await;
    assert_eq!(status, 200, "cross-signing keys of {}: {body}", user.user_id);
    id
}

/// Replaces cross-signing keys of `user` (password `pw`): the 401 challenge,
/// then the password stage in its session.
async fn replace_cross_signing(server: &Server, user: &User, mut body: Value) {
    let path = format!("{V3}/keys/device_signing/upload");
    let (status, challenge) = server.post(&path, Some(&user.token), body.clone()).await;
    assert_eq!(status, 401, "a replacement takes UIA: {challenge}");
    let localpart = user.user_id.trim_start_matches('@').split(':').next().unwrap_or_default();
    body["auth"] = json!({
        "type": "m.login.password",
        "identifier": { "type": "m.id.user", "user": localpart },
        "password": "pw",
        "session": challenge["session"],
    });
    let (status, answer) = server.post(&path, Some(&user.token), body).await;
    assert_eq!(status, 200, "{answer}");
}

async fn query(server: &Server, viewer: &User, target: &User) -> Value {
    let body = json!({ "device_keys": { target.user_id.clone(): [] } });
    let (status, body) = server.post(&format!("{V3}/keys/query"), Some(&viewer.token), body).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `/keys/signatures/upload`: answers 200 with the failures.
async fn upload_signatures(server: &Server, user: &User, body: Value) -> Value {
    let (status, body) = server.post(&format!("{V3}/keys/signatures/upload"), Some(&user.token), body).await;
    assert_eq!(status, 200, "{body}");
    body["failures"].clone()
}

/// The signatures on `target`'s device and master key as `viewer` sees them.
async fn signatures_seen(server: &Server, viewer: &User, target: &User) -> (Value, Value) {
    let q = query(server, viewer, target).await;
    (
        q["device_keys"][&target.user_id][&target.device_id]["signatures"].clone(),
        q["master_keys"][&target.user_id]["signatures"].clone(),
    )
}

async fn a_self_signing_signature_is_kept_beside_the_devices_own(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let id = set_up(&server, &alice).await;
    let device_key_id = format!("ed25519:{}", alice.device_id);

    let mut device = device_keys(&alice.user_id, &alice.device_id, &id.device);
    let own = device["signatures"][&alice.user_id][&device_key_id].clone();
    id.self_signing.sign(&mut device, &alice.user_id, &id.self_signing.id());
    let by_ssk = device["signatures"][&alice.user_id][id.self_signing.id()].clone();
    let body = json!({ alice.user_id.clone(): { alice.device_id.clone(): device } });
    assert_eq!(upload_signatures(&server, &alice, body).await, json!({}));

    let expected =
        json!({ alice.user_id.clone(): { device_key_id.clone(): own, id.self_signing.id(): by_ssk } });
    assert_eq!(signatures_seen(&server, &bob, &alice).await.0, expected, "as bob sees it");
    assert_eq!(signatures_seen(&server, &alice, &alice).await.0, expected, "as alice sees it");

    // The device uploading its keys again does not drop the signature.
    let again = device_keys(&alice.user_id, &alice.device_id, &id.device);
    let (status, body) =
        server.post(&format!("{V3}/keys/upload"), Some(&alice.token), json!({ "device_keys": again })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(signatures_seen(&server, &bob, &alice).await.0, expected, "after the device's re-upload");
}

async fn eve_cannot_sign_or_overwrite_alices_keys(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let eve = server.register("eve", "pw").await;
    let bob = server.register("bob", "pw").await;
    let alice_id = set_up(&server, &alice).await;
    let eve_id = set_up(&server, &eve).await;
    let before = (query(&server, &bob, &alice).await, query(&server, &alice, &alice).await);
    let (a, d) = (alice.user_id.clone(), alice.device_id.clone());

    // Eve signs Alice's device with her own self-signing key, and also forges
    // Alice's self-signing signature and device self-signature on it.
    let mut device = device_keys(&a, &d, &alice_id.device);
    eve_id.self_signing.sign(&mut device, &eve.user_id, &eve_id.self_signing.id());
    eve_id.user_signing.sign(&mut device, &eve.user_id, &eve_id.user_signing.id());
    eve_id.self_signing.sign(&mut device, &a, &alice_id.self_signing.id());
    eve_id.device.sign(&mut device, &a, &format!("ed25519:{d}"));
    let failures = upload_signatures(&server, &eve, json!({ a.clone(): { d.clone(): device } })).await;
    assert_eq!(failures[&a][&d]["errcode"], "M_FORBIDDEN", "{failures}");

    // A signature of Alice's master key with a made-up key of Eve's.
    let made_up = Key::new("made-up");
    let mut master = alice_id.master_key(&alice);
    made_up.sign(&mut master, &eve.user_id, &made_up.id());
    let failures =
        upload_signatures(&server, &eve, json!({ a.clone(): { alice_id.master.public.clone(): master } }))
            .await;
    assert_eq!(failures[&a][&alice_id.master.public]["errcode"], "M_INVALID_SIGNATURE", "{failures}");

    // The made-up key's signature under the id of Eve's user-signing key.
    let mut master = alice_id.master_key(&alice);
    master["signatures"][&eve.user_id][eve_id.user_signing.id()] = json!(made_up.signature_of(&master));
    let failures =
        upload_signatures(&server, &eve, json!({ a.clone(): { alice_id.master.public.clone(): master } }))
            .await;
    assert_eq!(failures[&a][&alice_id.master.public]["errcode"], "M_INVALID_SIGNATURE", "{failures}");

    // A valid signature by Eve's user-signing key, of a master key that is
    // not the one stored, cannot be passed off as Alice's (nor overwrite it).
    let mut swapped = cross_signing_key(&a, "master", &made_up, None);
    eve_id.user_signing.sign(&mut swapped, &eve.user_id, &eve_id.user_signing.id());
    let body = json!({ a.clone(): { alice_id.master.public.clone(): swapped.clone(), made_up.public.clone(): swapped } });
    let failures = upload_signatures(&server, &eve, body).await;
    assert_eq!(failures[&a][&alice_id.master.public]["errcode"], "M_INVALID_SIGNATURE", "{failures}");
    assert_eq!(failures[&a][&made_up.public]["errcode"], "M_NOT_FOUND", "{failures}");

    // Signing Alice's self-signing key is not for Eve either.
    let mut ssk = cross_signing_key(&a, "self_signing", &alice_id.self_signing, Some(&alice_id.master));
    eve_id.user_signing.sign(&mut ssk, &eve.user_id, &eve_id.user_signing.id());
    let failures =
        upload_signatures(&server, &eve, json!({ a.clone(): { alice_id.self_signing.public.clone(): ssk } }))
            .await;
    assert_eq!(failures[&a][&alice_id.self_signing.public]["errcode"], "M_FORBIDDEN", "{failures}");

    let after = (query(&server, &bob, &alice).await, query(&server, &alice, &alice).await);
    assert_eq!(after, before, "nothing Eve sent changed Alice's keys");
}

async fn signatures_that_do_not_verify_are_refused(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let id = set_up(&server, &alice).await;
    let before = query(&server, &alice, &alice).await;
    let (a, d) = (alice.user_id.clone(), alice.device_id.clone());

    // Signed by another key under the self-signing key's id.
    let mut device = device_keys(&a, &d, &id.device);
    device["signatures"][&a][id.self_signing.id()] = json!(id.user_signing.signature_of(&device));
    // Signed by the right key, then changed.
    let mut tampered = device_keys(&a, &d, &id.device);
    id.self_signing.sign(&mut tampered, &a, &id.self_signing.id());
    tampered["algorithms"] = json!(["m.olm.v1.curve25519-aes-sha2"]);
    let body = json!({ a.clone(): { d.clone(): device } });
    let failures = upload_signatures(&server, &alice, body).await;
    assert_eq!(failures[&a][&d]["errcode"], "M_INVALID_SIGNATURE", "{failures}");
    let failures = upload_signatures(&server, &alice, json!({ a.clone(): { d.clone(): tampered } })).await;
    assert_eq!(failures[&a][&d]["errcode"], "M_INVALID_SIGNATURE", "{failures}");

    // Of a device that does not exist; and a master key signed by a device
    // key that is not the device's.
    let mut ghost = device_keys(&a, "GHOST", &id.device);
    id.self_signing.sign(&mut ghost, &a, &id.self_signing.id());
    let mut master = id.master_key(&alice);
    id.user_signing.sign(&mut master, &a, &format!("ed25519:{d}"));
    let body = json!({ a.clone(): { "GHOST": ghost, id.master.public.clone(): master } });
    let failures = upload_signatures(&server, &alice, body).await;
    assert_eq!(failures[&a]["GHOST"]["errcode"], "M_NOT_FOUND", "{failures}");
    assert_eq!(failures[&a][&id.master.public]["errcode"], "M_INVALID_SIGNATURE", "{failures}");

    assert_eq!(query(&server, &alice, &alice).await, before, "nothing was stored");
    assert_eq!(failures[&a]["GHOST"]["error"].as_str().map(str::is_empty), Some(false), "{failures}");
}

async fn bobs_user_signing_signature_joins_alices_own(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let carol = server.register("carol", "pw").await;
    let alice_id = set_up(&server, &alice).await;
    let bob_id = set_up(&server, &bob).await;
    let (a, d) = (alice.user_id.clone(), alice.device_id.clone());
    let master_id = alice_id.master.public.clone();

    // Alice's device signs her master key (as a client does on verification).
    let mut master = alice_id.master_key(&alice);
    alice_id.device.sign(&mut master, &a, &format!("ed25519:{d}"));
    let by_device = master["signatures"][&a][format!("ed25519:{d}")].clone();
    assert_eq!(
        upload_signatures(&server, &alice, json!({ a.clone(): { master_id.clone(): master } })).await,
        json!({})
    );

    // Bob's user-signing key signs Alice's master key.
    let mut master = alice_id.master_key(&alice);
    bob_id.user_signing.sign(&mut master, &bob.user_id, &bob_id.user_signing.id());
    let by_bob = master["signatures"][&bob.user_id][bob_id.user_signing.id()].clone();
    let body = json!({ a.clone(): { master_id.clone(): master } });
    assert_eq!(upload_signatures(&server, &bob, body.clone()).await, json!({}));
    // The same again changes nothing.
    assert_eq!(upload_signatures(&server, &bob, body).await, json!({}));

    let alices = json!({ format!("ed25519:{d}"): by_device });
    let seen_by_bob = signatures_seen(&server, &bob, &alice).await.1;
    assert_eq!(
        seen_by_bob,
        json!({ a.clone(): alices.clone(), bob.user_id.clone(): { bob_id.user_signing.id(): by_bob } }),
        "bob sees alice's signature and his own"
    );
    // A user-signing signature is for its signer's eyes only.
    assert_eq!(signatures_seen(&server, &alice, &alice).await.1, json!({ a.clone(): alices.clone() }));
    assert_eq!(signatures_seen(&server, &carol, &alice).await.1, json!({ a.clone(): alices }));
}

async fn keys_upload_takes_only_self_signed_keys(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let (a, d) = (alice.user_id.clone(), alice.device_id.clone());
    let key = Key::new("alice-device");
    let upload = |body: Value| {
        let (server, token) = (&server, alice.token.clone());
        async move { server.post(&format!("{V3}/keys/upload"), Some(&token), body).await }
    };

    // Device keys whose self-signature is by another key, or missing.
    let mut forged = device_keys(&a, &d, &key);
    forged["signatures"][&a][format!("ed25519:{d}")] = json!(Key::new("other").signature_of(&forged));
    let refused = upload(json!({ "device_keys": forged })).await;
    assert_error(&refused, 400, "M_INVALID_SIGNATURE", "a self-signature by another key");
    let mut unsigned = device_keys(&a, &d, &key);
    unsigned.as_object_mut().unwrap().remove("signatures");
    assert_error(
        &upload(json!({ "device_keys": unsigned })).await,
        400,
        "M_INVALID_SIGNATURE",
        "no signature",
    );
    // Bob's keys, validly signed, under Alice's token.
    let bobs = device_keys(&bob.user_id, &bob.device_id, &key);
    assert_error(
        &upload(json!({ "device_keys": bobs })).await,
        400,
        "M_INVALID_PARAM",
        "another user's keys",
    );
    let q = query(&server, &bob, &alice).await;
    assert_eq!(q["device_keys"][&a], json!({}), "no device keys were stored: {q}");

    // A signed one-time key not signed by the device: the whole upload fails.
    let good_otk = signed_one_time_key(&a, &d, &key, "otk-good");
    let mut bad_otk = signed_one_time_key(&a, &d, &key, "otk-bad");
    bad_otk["key"] = json!("otk-swapped");
    let body = json!({
        "device_keys": device_keys(&a, &d, &key),
        "one_time_keys": { "signed_curve25519:AAAA": good_otk, "signed_curve25519:AAAB": bad_otk },
    });
    assert_error(&upload(body).await, 400, "M_INVALID_SIGNATURE", "a one-time key with a bad signature");
    let unsigned_fallback =
        json!({ "fallback_keys": { "signed_curve25519:FFFF": { "key": "fb", "fallback": true } } });
    assert_error(&upload(unsigned_fallback).await, 400, "M_INVALID_PARAM", "signed keys before device keys");
    let (status, counts) = upload(json!({})).await;
    assert_eq!((status, &counts["one_time_key_counts"]["signed_curve25519"]), (200, &json!(0)), "{counts}");
    let q = query(&server, &bob, &alice).await;
    assert_eq!(q["device_keys"][&a], json!({}), "nothing of the refused upload was stored: {q}");

    // The honest upload is taken whole.
    let body = json!({
        "device_keys": device_keys(&a, &d, &key),
        "one_time_keys": { "signed_curve25519:AAAA": signed_one_time_key(&a, &d, &key, "otk-good") },
    });
    let (status, counts) = upload(body).await;
    assert_eq!((status, &counts["one_time_key_counts"]["signed_curve25519"]), (200, &json!(1)), "{counts}");
    let q = query(&server, &bob, &alice).await;
    assert_eq!(q["device_keys"][&a][&d]["keys"][format!("ed25519:{d}")], json!(key.public), "{q}");
}

async fn device_signing_upload_needs_the_master_signature(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let a = alice.user_id.clone();
    let (master, ssk, usk, other) =
        (Key::new("a-master"), Key::new("a-ssk"), Key::new("a-usk"), Key::new("a-other"));
    let upload = |body: Value| {
        let (server, token) = (&server, alice.token.clone());
        async move { server.post(&format!("{V3}/keys/device_signing/upload"), Some(&token), body).await }
    };
    let master_key = cross_signing_key(&a, "master", &master, None);

    // Not signed by the master key (by another key under its id, or not at all).
    let mut forged = cross_signing_key(&a, "self_signing", &ssk, None);
    forged["signatures"][&a][master.id()] = json!(other.signature_of(&forged));
    let body = json!({ "master_key": master_key, "self_signing_key": forged });
    assert_error(
        &upload(body).await,
        400,
        "M_INVALID_SIGNATURE",
        "a self-signing key not signed by the master",
    );
    let body = json!({ "master_key": master_key, "user_signing_key": cross_signing_key(&a, "user_signing", &usk, None) });
    assert_error(&upload(body).await, 400, "M_INVALID_SIGNATURE", "an unsigned user-signing key");
    // Without any master key to check against.
    let body = json!({ "self_signing_key": cross_signing_key(&a, "self_signing", &ssk, Some(&master)) });
    assert_error(&upload(body).await, 400, "M_MISSING_PARAM", "no master key at all");
    // Keys of another user, of the wrong usage, or with a key id that is not their key.
    let body = json!({ "master_key": cross_signing_key(&bob.user_id, "master", &master, None) });
    assert_error(&upload(body).await, 400, "M_INVALID_PARAM", "bob's master key under alice's token");
    let body = json!({ "master_key": cross_signing_key(&a, "self_signing", &master, None) });
    assert_error(&upload(body).await, 400, "M_INVALID_PARAM", "a master key without master usage");
    let mut renamed = master_key.clone();
    renamed["keys"] = json!({ other.id(): master.public });
    assert_error(
        &upload(json!({ "master_key": renamed })).await,
        400,
        "M_INVALID_PARAM",
        "a key id not its key",
    );
    let q = query(&server, &bob, &alice).await;
    assert_eq!((&q["master_keys"], &q["self_signing_keys"]), (&json!({}), &json!({})), "nothing stored: {q}");

    // The honest upload; changing it afterwards takes UIA, and a bad
    // replacement is refused before any password is asked for.
    let body = json!({
        "master_key": master_key,
        "self_signing_key": cross_signing_key(&a, "self_signing", &ssk, Some(&master)),
        "user_signing_key": cross_signing_key(&a, "user_signing", &usk, Some(&master)),
    });
    let (status, answer) = upload(body).await;
    assert_eq!(status, 200, "{answer}");
    let forged_ssk = cross_signing_key(&a, "self_signing", &other, Some(&other));
    assert_error(
        &upload(json!({ "self_signing_key": forged_ssk })).await,
        400,
        "M_INVALID_SIGNATURE",
        "replacement",
    );
    let new_ssk = cross_signing_key(&a, "self_signing", &other, Some(&master));
    let (status, challenge) = upload(json!({ "self_signing_key": new_ssk })).await;
    assert_eq!(status, 401, "a replacement takes UIA: {challenge}");
    let q = query(&server, &bob, &alice).await;
    assert_eq!(q["self_signing_keys"][&a]["keys"], json!({ ssk.id(): ssk.public }), "{q}");
}

async fn replaced_keys_take_their_signatures_along(backend: Backend) {
    let server = Server::start(&backend).await;
    let alice = server.register("alice", "pw").await;
    let bob = server.register("bob", "pw").await;
    let alice_id = set_up(&server, &alice).await;
    let bob_id = set_up(&server, &bob).await;
    let (a, d) = (alice.user_id.clone(), alice.device_id.clone());
    let own = json!({ format!("ed25519:{d}"): device_keys(&a, &d, &alice_id.device)["signatures"][&a][format!("ed25519:{d}")] });

    let mut device = device_keys(&a, &d, &alice_id.device);
    alice_id.self_signing.sign(&mut device, &a, &alice_id.self_signing.id());
    assert_eq!(
        upload_signatures(&server, &alice, json!({ a.clone(): { d.clone(): device } })).await,
        json!({})
    );
    let mut master = alice_id.master_key(&alice);
    bob_id.user_signing.sign(&mut master, &bob.user_id, &bob_id.user_signing.id());
    let body = json!({ a.clone(): { alice_id.master.public.clone(): master } });
    assert_eq!(upload_signatures(&server, &bob, body).await, json!({}));

    // Alice's new self-signing key: the old one's signature of her device goes.
    let new_ssk = Key::new("alice/new self_signing");
    let body = json!({ "self_signing_key": cross_signing_key(&a, "self_signing", &new_ssk, Some(&alice_id.master)) });
    replace_cross_signing(&server, &alice, body).await;
    let (device_sigs, master_sigs) = signatures_seen(&server, &bob, &alice).await;
    assert_eq!(
        device_sigs,
        json!({ a.clone(): own.clone() }),
        "the old self-signing key's signature is gone"
    );
    assert!(
        master_sigs[&bob.user_id][bob_id.user_signing.id()].is_string(),
        "bob's signature stays: {master_sigs}"
    );
    // The new key signs.
    let mut device = device_keys(&a, &d, &alice_id.device);
    new_ssk.sign(&mut device, &a, &new_ssk.id());
    let by_new = device["signatures"][&a][new_ssk.id()].clone();
    assert_eq!(
        upload_signatures(&server, &alice, json!({ a.clone(): { d.clone(): device } })).await,
        json!({})
    );
    let mut expected = own;
    expected[new_ssk.id()] = by_new;
    assert_eq!(signatures_seen(&server, &bob, &alice).await.0, json!({ a.clone(): expected }));

    // Bob's new user-signing key: his old signature of Alice's master goes.
    let new_usk = Key::new("bob/new user_signing");
    let body = json!({ "user_signing_key": cross_signing_key(&bob.user_id, "user_signing", &new_usk, Some(&bob_id.master)) });
    replace_cross_signing(&server, &bob, body).await;
    let master_sigs = signatures_seen(&server, &bob, &alice).await.1;
    assert_eq!(master_sigs.get(&bob.user_id), None, "{master_sigs}");

    // A second device of Alice's signs her master key; deleting the device
    // deletes its signature.
    let phone = server.login("alice", "pw").await;
    let phone_key = Key::new("alice/phone");
    let keys = device_keys(&a, &phone.device_id, &phone_key);
    let (status, body) =
        server.post(&format!("{V3}/keys/upload"), Some(&phone.token), json!({ "device_keys": keys })).await;
    assert_eq!(status, 200, "{body}");
    let mut master = alice_id.master_key(&alice);
    let phone_key_id = format!("ed25519:{}", phone.device_id);
    phone_key.sign(&mut master, &a, &phone_key_id);
    let body = json!({ a.clone(): { alice_id.master.public.clone(): master } });
    assert_eq!(upload_signatures(&server, &phone, body).await, json!({}));
    let master_sigs = signatures_seen(&server, &alice, &alice).await.1;
    assert!(master_sigs[&a][&phone_key_id].is_string(), "{master_sigs}");
    let body = json!({
        "devices": [phone.device_id],
        "auth": { "type": "m.login.password", "identifier": { "type": "m.id.user", "user": "alice" }, "password": "pw" },
    });
    let (status, answer) = server.post(&format!("{V3}/delete_devices"), Some(&alice.token), body).await;
    assert_eq!(status, 200, "{answer}");
    let master_sigs = signatures_seen(&server, &alice, &alice).await.1;
    assert_eq!(master_sigs, json!({}), "the deleted device's signature went with it");
}
