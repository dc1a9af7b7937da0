//! Forks decided beside Synapse: a room of seqline A's with users of a
//! Synapse and of a second server B (the test acts as B, signing with B's
//! key, so it can build branches no honest server would). Each of B's
//! branches goes to A and to Synapse alike; after each, the room's current
//! state on A (what alice reads) must be the state Synapse resolved (what
//! sam reads), event for event, and what the fork was about must have gone
//! the way the spec's resolution says. Room versions 11 (state resolution
//! v2) and 12 (v2.1).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use complement_tests::acting::Acting;
use complement_tests::api::{V3, create_room, enc, event_id_of, reads_agree, room_path, text};
use complement_tests::backend_tests;
use complement_tests::federation::{FedServer, now_ms};
use complement_tests::harness::{Backend, User};
use complement_tests::synapse::Synapse;
use serde_json::{Value, json};

backend_tests!(forks_resolve_as_synapse_resolves_v11, forks_resolve_as_synapse_resolves_v12);

async fn forks_resolve_as_synapse_resolves_v11(backend: Backend) {
    forks_resolve_as_synapse_resolves(backend, "11").await;
}

async fn forks_resolve_as_synapse_resolves_v12(backend: Backend) {
    forks_resolve_as_synapse_resolves(backend, "12").await;
}

/// The current state as (type, state key) -> event id.
type State = BTreeMap<(String, String), String>;

fn state_map(events: &Value) -> State {
    events
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let key = (
                e["type"].as_str().unwrap_or("").to_owned(),
                e["state_key"].as_str().unwrap_or("").to_owned(),
            );
            (key, e["event_id"].as_str().unwrap_or("").to_owned())
        })
        .collect()
}

/// The room, as A's alice and Synapse's sam read it.
struct Room<'a> {
    a: &'a FedServer,
    b: &'a FedServer,
    syn: &'a Synapse,
    alice: &'a User,
    sam: &'a User,
    id: String,
    version: &'a str,
}

impl Room<'_> {
    async fn seqline_state(&self) -> State {
        let (status, state) =
            self.a.server.get(&room_path(&self.id, "/state"), Some(&self.alice.token)).await;
        assert_eq!(status, 200, "{state}");
        state_map(&state)
    }

    async fn synapse_state(&self) -> (u16, State) {
        let (status, state) = self.syn.get(&room_path(&self.id, "/state"), Some(&self.sam.token)).await;
        (status, state_map(&state))
    }

    /// Waits until Synapse's current state is A's; answers it.
    async fn agree(&self, what: &str) -> State {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ours = self.seqline_state().await;
            let (status, theirs) = self.synapse_state().await;
            if status == 200 && ours == theirs {
                return ours;
            }
            if Instant::now() > deadline {
                panic!(
                    "{what}: the states differ\nseqline: {ours:#?}\nSynapse ({status}): {theirs:#?}\n{}",
                    self.syn.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until Synapse has `event` (sent on A).
    async fn synapse_has(&self, event: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let path = room_path(&self.id, &format!("/event/{}", enc(event)));
        loop {
            let (status, _) = self.syn.get(&path, Some(&self.sam.token)).await;
            if status == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "Synapse never got {event}\n{}", self.syn.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// alice's state event on A, once Synapse has it too.
    async fn alice_state(&self, kind: &str, key: &str, content: Value) -> String {
        let path = room_path(&self.id, &format!("/state/{kind}/{}", enc(key)));
        let (status, sent) = self.a.server.put(&path, Some(&self.alice.token), content).await;
        assert_eq!(status, 200, "{sent}");
        let id = event_id_of(&sent);
        self.synapse_has(&id).await;
        id
    }

    /// alice's message on A, once Synapse has it too.
    async fn alice_says(&self, txn: &str, body: &str) -> String {
        let path = room_path(&self.id, &format!("/send/m.room.message/{txn}"));
        let (status, sent) = self.a.server.put(&path, Some(&self.alice.token), text(body)).await;
        assert_eq!(status, 200, "{sent}");
        let id = event_id_of(&sent);
        self.synapse_has(&id).await;
        id
    }

    /// An event of `sender` (a user of B) after `prev`, authorised by the
    /// state events `auth` names (the create event left out in v12).
    fn draft(
        &self,
        sender: &str,
        (kind, key): (&str, Option<&str>),
        content: Value,
        prev: &[&str],
        auth: &[&str],
        ts: i64,
    ) -> Value {
        let mut event = json!({
            "type": kind, "room_id": self.id, "sender": sender, "content": content,
            "prev_events": prev, "auth_events": auth, "depth": 100, "origin_server_ts": ts,
        });
        if let Some(key) = key {
            event["state_key"] = json!(key);
        }
        event
    }

    /// The auth events of a B user's event: create (before v12), power
    /// levels and the sender's join from `state`, and `more`.
    fn auth(&self, state: &State, sender: &str, more: &[&str]) -> Vec<String> {
        let id = |kind: &str, key: &str| state[&(kind.to_owned(), key.to_owned())].clone();
        let mut auth = vec![id("m.room.power_levels", ""), id("m.room.member", sender)];
        if self.version != "12" {
            auth.push(id("m.room.create", ""));
        }
        auth.extend(more.iter().map(|s| (*s).to_owned()));
        auth
    }

    /// Sends `event` as B to A and to Synapse; answers its id and A's
    /// per-PDU answer.
    async fn send_as_b(&self, acting: &Acting<'_>, txn: &str, mut event: Value) -> (String, Value) {
        let id = acting.sign(&mut event);
        let (status, ours) = acting.send_txn(txn, &[&event]).await;
        assert_eq!(status, 200, "{ours}");
        let body = json!({ "origin": self.b.name, "origin_server_ts": now_ms(), "pdus": [event] });
        let uri = format!("/_matrix/federation/v1/send/{txn}");
        let (status, theirs) =
            self.syn.federation_as(&self.b.name, &acting.key, "PUT", &uri, Some(&body)).await;
        assert_eq!(status, 200, "{theirs}\n{}", self.syn.log_tail());
        (id.clone(), ours["pdus"][&id].clone())
    }
}

async fn forks_resolve_as_synapse_resolves(backend: Backend, version: &str) {
    let (a, b, syn) = tokio::join!(FedServer::start(&backend), FedServer::start(&backend), Synapse::start());
    let acting = Acting::new(&a, &b);
    let alice = a.server.register("alice", "pw").await;
    let carol = a.server.register("carol", "pw").await;
    let (sam, sue) = (syn.register("sam", "pw").await, syn.register("sue", "pw").await);
    let bob = b.user_id("bob");
    let id =
        create_room(&a.server, &alice, json!({ "preset": "public_chat", "room_version": version })).await;
    let room = Room { a: &a, b: &b, syn: &syn, alice: &alice, sam: &sam, id, version };
    // Synapse's users first: every event a branch of B's stands on is then
    // one Synapse has on its line, not an outlier of its join.
    for user in [&sam, &sue] {
        let path = format!("{V3}/join/{}?server_name={}", enc(&room.id), enc(&a.name));
        let (status, body) = syn.post(&path, Some(&user.token), json!({})).await;
        assert_eq!(status, 200, "{body}\n{}", syn.log_tail());
    }
    let (bob_join, _, _) = acting.join(&room.id, &bob).await;
    room.synapse_has(&bob_join).await;
    let (status, mut power) =
        a.server.get(&room_path(&room.id, "/state/m.room.power_levels/"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{power}");
    power["users"][&bob] = json!(50);
    let power_50 = room.alice_state("m.room.power_levels", "", power.clone()).await;
    let at_50 = room.agree("bob at power 50").await;

    // Two topics at once: alice's "one", bob's "two" on a branch from
    // before it with an earlier timestamp; "one" stands (same power levels:
    // the later timestamp). Then bob's "three" after his "two", later than
    // both: it stands.
    room.alice_state("m.room.topic", "", json!({ "topic": "one" })).await;
    let auth = room.auth(&at_50, &bob, &[]);
    let auth: Vec<&str> = auth.iter().map(String::as_str).collect();
    let two = room.draft(
        &bob,
        ("m.room.topic", Some("")),
        json!({ "topic": "two" }),
        &[&power_50],
        &auth,
        now_ms() - 60_000,
    );
    let (two, answer) = room.send_as_b(&acting, "topic-two", two).await;
    assert_eq!(answer, json!({}));
    let state = room.agree("bob's topic two beside alice's one").await;
    let topic = |state: &State| state[&("m.room.topic".to_owned(), String::new())].clone();
    let (status, shown) =
        a.server.get(&room_path(&room.id, "/state/m.room.topic/"), Some(&alice.token)).await;
    assert_eq!((status, shown["topic"].as_str()), (200, Some("one")), "{shown}");
    let three = room.draft(
        &bob,
        ("m.room.topic", Some("")),
        json!({ "topic": "three" }),
        &[&two],
        &auth,
        now_ms() + 60_000,
    );
    let (three, _) = room.send_as_b(&acting, "topic-three", three).await;
    let state_after = room.agree("bob's topic three").await;
    assert_ne!(topic(&state), topic(&state_after));
    assert_eq!(topic(&state_after), three);

    // bob (power 50) gives himself 100: refused on both, nothing moves.
    let mut raised = power.clone();
    raised["users"][&bob] = json!(100);
    let raise = room.draft(&bob, ("m.room.power_levels", Some("")), raised, &[&three], &auth, now_ms());
    let (_, answer) = room.send_as_b(&acting, "raise", raise).await;
    assert!(answer["error"].is_string(), "{answer}");
    assert_eq!(room.agree("bob's refused power change").await, state_after);

    // carol (A) joins the public room while bob, on a branch from before
    // her join, makes it invite-only: the join rule stands and her join
    // does not.
    let before_carol = room.alice_says("m1", "before carol").await;
    let (status, body) =
        a.server.post(&format!("{V3}/join/{}", enc(&room.id)), Some(&carol.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let carol_key = ("m.room.member".to_owned(), carol.user_id.clone());
    let with_carol = room.agree("carol joined").await;
    assert!(with_carol.contains_key(&carol_key));
    let invite_only = room.draft(
        &bob,
        ("m.room.join_rules", Some("")),
        json!({ "join_rule": "invite" }),
        &[&before_carol],
        &auth,
        now_ms(),
    );
    let (invite_only, _) = room.send_as_b(&acting, "invite-only", invite_only).await;
    let state = room.agree("bob's invite-only beside carol's join").await;
    assert_eq!(state[&("m.room.join_rules".to_owned(), String::new())], invite_only);
    assert_ne!(state.get(&carol_key), with_carol.get(&carol_key), "carol's join stands");

    // alice demotes bob while bob, on a branch from before it, kicks sue:
    // the demotion (of the more powerful sender) goes first, the kick
    // fails, sue stays.
    let before_demotion = room.alice_says("m2", "before the demotion").await;
    let sue_key = ("m.room.member".to_owned(), sue.user_id.clone());
    let sue_join = state[&sue_key].clone();
    let mut demoted = power.clone();
    demoted["users"][&bob] = json!(0);
    let demotion = room.alice_state("m.room.power_levels", "", demoted).await;
    let kick_auth = room.auth(&state, &bob, &[&sue_join]);
    let kick_auth: Vec<&str> = kick_auth.iter().map(String::as_str).collect();
    let kick = room.draft(
        &bob,
        ("m.room.member", Some(&sue.user_id)),
        json!({ "membership": "leave" }),
        &[&before_demotion],
        &kick_auth,
        now_ms(),
    );
    let (kick, _) = room.send_as_b(&acting, "kick", kick).await;
    let state = room.agree("bob's kick beside his demotion").await;
    assert_eq!(state[&("m.room.power_levels".to_owned(), String::new())], demotion);
    assert_eq!(state[&sue_key], sue_join, "sue is still joined (not {kick})");

    // alice bans bob; bob's message on a branch from before the ban is
    // shown to no one on either side.
    let before_ban = room.alice_says("m3", "before the ban").await;
    let path = room_path(&room.id, "/ban");
    let (status, body) = a.server.post(&path, Some(&alice.token), json!({ "user_id": bob })).await;
    assert_eq!(status, 200, "{body}");
    let state = room.agree("bob banned").await;
    let ban = state[&("m.room.member".to_owned(), bob.clone())].clone();
    room.synapse_has(&ban).await;
    let message =
        room.draft(&bob, ("m.room.message", None), text("after my ban"), &[&before_ban], &auth, now_ms());
    let (message, _) = room.send_as_b(&acting, "banned-message", message).await;
    let after = room.alice_says("m4", "after bob's message").await;
    assert_eq!(room.agree("bob's message after his ban").await, state);
    let seen = |page: &Value| -> Vec<String> {
        page["chunk"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["event_id"].as_str().map(str::to_owned))
            .collect()
    };
    let (status, ours) =
        a.server.get(&room_path(&room.id, "/messages?dir=b&limit=50"), Some(&alice.token)).await;
    assert_eq!(status, 200, "{ours}");
    let (status, theirs) = syn.get(&room_path(&room.id, "/messages?dir=b&limit=50"), Some(&sam.token)).await;
    assert_eq!(status, 200, "{theirs}");
    for (side, page) in [("seqline", seen(&ours)), ("Synapse", seen(&theirs))] {
        assert!(page.contains(&after) && page.contains(&before_ban), "{side}: {page:?}");
        assert!(!page.contains(&message), "{side} shows bob's message after his ban: {page:?}");
    }
    // Every read of each local user agrees with the others after all the
    // forks: alice (in throughout) and carol (whose join did not stand).
    for user in [&alice, &carol] {
        let read = reads_agree(&a.server, user, &room.id).await;
        assert!(!read.contains(&message), "{}: {read:?}", user.user_id);
    }
    let (status, sent) = a
        .server
        .put(&room_path(&room.id, "/send/m.room.message/m5"), Some(&alice.token), text("still here"))
        .await;
    assert_eq!(status, 200, "{sent}");
}
