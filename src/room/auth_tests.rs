//! The authorisation rules, one allowed and one refused case each, run
//! through the same `timeline::authorize` and `pdu::build` the write path uses,
//! on an in-memory room.

use std::collections::HashMap;

use ruma::events::{StateEventType, TimelineEventType};
use ruma::room_version_rules::RoomVersionRules;
use ruma::{MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedRoomId, RoomId, RoomVersionId, UInt};
use serde_json::{Value, json};

use super::pdu::{self, Draft, Pdu, Placement, canonical_content};
use super::timeline::authorize;
use crate::signing_key::ServerKey;

struct Room {
    rules: RoomVersionRules,
    room_id: OwnedRoomId,
    key: ServerKey,
    state: HashMap<(String, String), Pdu>,
    by_id: HashMap<OwnedEventId, Pdu>,
    prev: Vec<OwnedEventId>,
    depth: u64,
}

const ALICE: &str = "@alice:example.org";
const BOB: &str = "@bob:example.org";
const CAROL: &str = "@carol:example.org";

impl Room {
    /// A room created by alice, who joined, with power levels and join rule.
    fn new(version: RoomVersionId, join_rule: &str, power: Value) -> Self {
        let key = crate::signing_key::parse("ed25519 1 YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1").unwrap();
        let rules = version.rules().unwrap();
        let mut room = Self {
            rules,
            room_id: "!room:example.org".try_into().unwrap(),
            key,
            state: HashMap::new(),
            by_id: HashMap::new(),
            prev: Vec::new(),
            depth: 0,
        };
        let mut create = json!({ "room_version": version.as_str() });
        if !room.rules.authorization.use_room_create_sender {
            create["creator"] = json!(ALICE);
        }
        room.send(ALICE, "m.room.create", Some(""), create).expect("create");
        if room.rules.authorization.room_create_event_id_as_room_id {
            let id = room.state[&("m.room.create".to_owned(), String::new())].event_id.clone();
            room.room_id = RoomId::parse(format!("!{}", &id.as_str()[1..])).unwrap();
        }
        room.send(ALICE, "m.room.member", Some(ALICE), json!({ "membership": "join" })).expect("alice joins");
        room.send(ALICE, "m.room.power_levels", Some(""), power).expect("power levels");
        room.send(ALICE, "m.room.join_rules", Some(""), json!({ "join_rule": join_rule }))
            .expect("join rules");
        room
    }

    fn v11(join_rule: &str) -> Self {
        Self::new(
            RoomVersionId::V11,
            join_rule,
            json!({ "users": { ALICE: 100, CAROL: 50 }, "state_default": 50, "events_default": 0, "ban": 50, "kick": 50, "invite": 50, "redact": 50, "events": { "m.room.name": 50, "m.room.power_levels": 100 } }),
        )
    }

    /// Builds and authorises an event; on success it becomes part of the room.
    fn send(
        &mut self,
        sender: &str,
        kind: &str,
        state_key: Option<&str>,
        content: Value,
    ) -> Result<Pdu, String> {
        let draft = Draft {
            kind: kind.to_owned(),
            state_key: state_key.map(str::to_owned),
            content: canonical_content(content).unwrap(),
            sender: sender.try_into().unwrap(),
            redacts: None,
        };
        self.send_draft(draft)
    }

    fn send_draft(&mut self, draft: Draft) -> Result<Pdu, String> {
        let kind = TimelineEventType::from(draft.kind.as_str());
        let raw = serde_json::value::to_raw_value(&draft.content).unwrap();
        let auth_types = ruma::state_res::auth_types_for_event(
            &kind,
            &draft.sender,
            draft.state_key.as_deref(),
            &raw,
            &self.rules.authorization,
        )?;
        let auth_events: Vec<OwnedEventId> = auth_types
            .iter()
            .filter_map(|(t, k)| self.state.get(&(t.to_string(), k.clone())).map(|p| p.event_id.clone()))
            .collect();
        let reference_hashes = auth_events
            .iter()
            .chain(&self.prev)
            .map(|id| (id.clone(), self.by_id[id].reference_hash(&self.rules).unwrap()))
            .collect();
        let is_create = kind == TimelineEventType::RoomCreate;
        let placement = Placement {
            room_id: if is_create && self.rules.authorization.room_create_event_id_as_room_id {
                None
            } else {
                Some(&self.room_id)
            },
            prev_events: self.prev.clone(),
            auth_events,
            reference_hashes,
            depth: self.depth + 1,
            origin_server_ts: MilliSecondsSinceUnixEpoch(UInt::from(1_000_000u32)),
        };
        let pdu = pdu::build(&self.rules, "example.org".try_into().unwrap(), &self.key, &draft, placement)
            .map_err(|e| e.to_string())?;
        authorize(
            &self.rules,
            &pdu,
            |id| self.by_id.get(id),
            |t: &StateEventType, k: &str| self.state.get(&(t.to_string(), k.to_owned())),
        )
        .map_err(|e| e.to_string())?;
        self.prev = vec![pdu.event_id.clone()];
        self.depth += 1;
        self.by_id.insert(pdu.event_id.clone(), pdu.clone());
        if let Some(k) = &draft.state_key {
            self.state.insert((draft.kind.clone(), k.clone()), pdu.clone());
        }
        Ok(pdu)
    }

    fn join(&mut self, user: &str) -> Result<Pdu, String> {
        self.send(user, "m.room.member", Some(user), json!({ "membership": "join" }))
    }
}

/// Asserts that the rules (not anything else) refused the event.
#[track_caller]
fn refused(result: Result<Pdu, String>) -> bool {
    match result {
        Err(e) if e.starts_with("Event not allowed") => true,
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(pdu) => panic!("allowed: {}", pdu.event_id),
    }
}

fn text(body: &str) -> Value {
    json!({ "msgtype": "m.text", "body": body })
}

#[test]
fn create_must_be_first_and_clean() {
    let mut room = Room::v11("public");
    // A second create event (it has prev_events) is refused.
    assert!(refused(room.send(ALICE, "m.room.create", Some(""), json!({ "room_version": "11" }))));
}

#[test]
fn joining_follows_the_join_rule() {
    let mut public = Room::v11("public");
    public.join(BOB).expect("anyone may join a public room");
    let mut private = Room::v11("invite");
    assert!(refused(private.join(BOB)), "an invite-only room refuses an uninvited join");
    private
        .send(ALICE, "m.room.member", Some(BOB), json!({ "membership": "invite" }))
        .expect("alice invites");
    private.join(BOB).expect("an invited user may join");
    // Nobody joins on someone else's behalf.
    assert!(refused(public.send(BOB, "m.room.member", Some(CAROL), json!({ "membership": "join" }))));
    // Knocking is refused where the join rule is not knock.
    assert!(refused(private.send(CAROL, "m.room.member", Some(CAROL), json!({ "membership": "knock" }))));
}

#[test]
fn only_members_send() {
    let mut room = Room::v11("public");
    assert!(refused(room.send(BOB, "m.room.message", None, text("hi"))), "not joined");
    room.join(BOB).unwrap();
    room.send(BOB, "m.room.message", None, text("hi")).expect("joined members send");
    room.send(BOB, "m.room.member", Some(BOB), json!({ "membership": "leave" })).expect("bob leaves");
    assert!(refused(room.send(BOB, "m.room.message", None, text("hi"))), "left");
}

#[test]
fn power_levels_gate_state_and_changes_to_power() {
    let mut room = Room::v11("public");
    room.join(BOB).unwrap();
    assert!(refused(room.send(BOB, "m.room.name", Some(""), json!({ "name": "x" }))), "bob is at 0 < 50");
    room.send(ALICE, "m.room.name", Some(""), json!({ "name": "x" })).expect("alice is at 100");
    // Nobody raises anyone above their own level.
    room.join(CAROL).unwrap();
    let raise = json!({ "users": { ALICE: 100, CAROL: 100 }, "state_default": 50, "events": { "m.room.power_levels": 50 } });
    assert!(refused(room.send(CAROL, "m.room.power_levels", Some(""), raise)));
    let ok = json!({ "users": { ALICE: 100, CAROL: 50, BOB: 10 }, "state_default": 50, "ban": 50, "kick": 50, "invite": 50, "redact": 50, "events": { "m.room.name": 50, "m.room.power_levels": 100 } });
    room.send(ALICE, "m.room.power_levels", Some(""), ok).expect("alice may");
}

#[test]
fn kick_ban_and_invite_need_their_levels() {
    let mut room = Room::v11("public");
    room.join(BOB).unwrap();
    room.join(CAROL).unwrap();
    assert!(
        refused(room.send(BOB, "m.room.member", Some(CAROL), json!({ "membership": "leave" }))),
        "bob cannot kick"
    );
    assert!(
        refused(room.send(CAROL, "m.room.member", Some(ALICE), json!({ "membership": "ban" }))),
        "not above alice"
    );
    room.send(CAROL, "m.room.member", Some(BOB), json!({ "membership": "ban" }))
        .expect("carol (50) bans bob (0)");
    assert!(refused(room.join(BOB)), "a banned user cannot join");
    assert!(
        refused(room.send(
            BOB,
            "m.room.member",
            Some("@dave:example.org"),
            json!({ "membership": "invite" })
        )),
        "banned and below the invite level"
    );
    room.send(CAROL, "m.room.member", Some("@dave:example.org"), json!({ "membership": "invite" }))
        .expect("carol is at the invite level");
    room.send(CAROL, "m.room.member", Some(BOB), json!({ "membership": "leave" })).expect("unban");
    room.join(BOB).expect("after the unban");
}

#[test]
fn third_party_invites_need_a_signed_token() {
    let mut room = Room::v11("invite");
    let content = json!({
        "membership": "invite",
        "third_party_invite": { "display_name": "x", "signed": { "mxid": BOB, "token": "t", "signatures": {} } },
    });
    assert!(refused(room.send(ALICE, "m.room.member", Some(BOB), content)), "no m.room.third_party_invite");
}

#[test]
fn v12_creators_are_above_every_level() {
    let power = json!({ "users": {}, "state_default": 50, "events": { "m.room.power_levels": 100, "m.room.tombstone": 150 } });
    let mut room = Room::new(RoomVersionId::V12, "public", power);
    // The creator is not in `users`, yet may do anything.
    room.send(
        ALICE,
        "m.room.tombstone",
        Some(""),
        json!({ "body": "moved", "replacement_room": "!new:example.org" }),
    )
    .expect("creators have infinite power");
    room.join(BOB).unwrap();
    assert!(refused(room.send(
        BOB,
        "m.room.tombstone",
        Some(""),
        json!({ "body": "x", "replacement_room": "!x:example.org" })
    )));
    // Creators may not be listed in `users`.
    let listed = json!({ "users": { ALICE: 100 }, "events": { "m.room.power_levels": 100 } });
    assert!(refused(room.send(ALICE, "m.room.power_levels", Some(""), listed)));
}

#[test]
fn redaction_rules_per_version() {
    use ruma::canonical_json::redact_content_in_place;
    // v11 keeps `redacts` in content and more keys of power levels (`invite`).
    let pl = json!({ "ban": 50, "events": {}, "invite": 10, "users": {}, "kick": 50, "redact": 50, "state_default": 50, "events_default": 0, "users_default": 0, "notifications": { "room": 50 } });
    for (version, keeps_invite) in [(RoomVersionId::V10, false), (RoomVersionId::V11, true)] {
        let rules = version.rules().unwrap();
        let mut content = canonical_content(pl.clone()).unwrap();
        redact_content_in_place(&mut content, &rules.redaction, "m.room.power_levels");
        assert_eq!(content.contains_key("invite"), keeps_invite, "{version}");
        assert!(!content.contains_key("notifications"), "{version}");
        assert!(content.contains_key("ban"), "{version}");
    }
    // Messages lose everything; a create event keeps all of its content from v11 on.
    let rules = RoomVersionId::V11.rules().unwrap();
    let mut msg = canonical_content(json!({ "body": "secret", "msgtype": "m.text" })).unwrap();
    redact_content_in_place(&mut msg, &rules.redaction, "m.room.message");
    assert!(msg.is_empty());
    let mut create = canonical_content(json!({ "room_version": "11", "m.federate": false, "x": 1 })).unwrap();
    redact_content_in_place(&mut create, &rules.redaction, "m.room.create");
    assert_eq!(create.len(), 3);
    let rules10 = RoomVersionId::V10.rules().unwrap();
    let mut create = canonical_content(json!({ "creator": ALICE, "room_version": "10", "x": 1 })).unwrap();
    redact_content_in_place(&mut create, &rules10.redaction, "m.room.create");
    assert_eq!(create.keys().collect::<Vec<_>>(), vec!["creator"]);
    // join_rules keeps `allow` from v8 on.
    let mut jr = canonical_content(json!({ "join_rule": "restricted", "allow": [], "x": 1 })).unwrap();
    redact_content_in_place(&mut jr, &rules.redaction, "m.room.join_rules");
    assert_eq!(jr.keys().collect::<Vec<_>>(), vec!["allow", "join_rule"]);
}

/// Power levels for the per-version tests: alice at 100 (from v12 on, as
/// the creator, whom `users` may not list).
fn plain_power(version: &RoomVersionId) -> Value {
    let users = if *version == RoomVersionId::V12 { json!({}) } else { json!({ ALICE: 100 }) };
    json!({ "users": users, "state_default": 50, "events_default": 0, "invite": 0, "redact": 50, "events": { "m.room.power_levels": 100 } })
}

#[test]
fn every_creatable_version_builds_an_authorised_room() {
    for version in super::version::CREATABLE {
        let mut room = Room::new(version.clone(), "public", plain_power(&version));
        room.join(BOB).unwrap_or_else(|e| panic!("{version}: {e}"));
        let message = room
            .send(BOB, "m.room.message", None, json!({ "msgtype": "m.text", "body": "hi" }))
            .unwrap_or_else(|e| panic!("{version}: {e}"));
        let id_names_server = message.event_id.server_name().is_some();
        assert_eq!(id_names_server, matches!(version, RoomVersionId::V1 | RoomVersionId::V2), "{version}");
    }
}

/// Asserts that `result` was allowed, or refused by the rules.
#[track_caller]
fn allowed_or_refused(result: Result<Pdu, String>, allowed: bool, what: &str) {
    if allowed {
        result.unwrap_or_else(|e| panic!("{what}: {e}"));
    } else {
        assert!(refused(result), "{what}");
    }
}

#[test]
fn knocking_needs_version_7() {
    for (version, allowed) in [(RoomVersionId::V6, false), (RoomVersionId::V7, true)] {
        let mut room = Room::new(version.clone(), "knock", plain_power(&version));
        let knock = room.send(BOB, "m.room.member", Some(BOB), json!({ "membership": "knock" }));
        allowed_or_refused(knock, allowed, version.as_str());
    }
}

#[test]
fn restricted_joins_need_version_8_and_knock_restricted_10() {
    let allow = json!([{ "type": "m.room_membership", "room_id": "!other:example.org" }]);
    for (version, rule, allowed) in [
        (RoomVersionId::V7, "restricted", false),
        (RoomVersionId::V8, "restricted", true),
        (RoomVersionId::V9, "knock_restricted", false),
        (RoomVersionId::V10, "knock_restricted", true),
    ] {
        let mut room = Room::new(version.clone(), "invite", plain_power(&version));
        room.send(ALICE, "m.room.join_rules", Some(""), json!({ "join_rule": rule, "allow": allow }))
            .unwrap();
        // A join authorised by alice (the server checked the allowed room).
        let content = json!({ "membership": "join", "join_authorised_via_users_server": ALICE });
        let join = room.send(BOB, "m.room.member", Some(BOB), content);
        allowed_or_refused(join, allowed, &format!("{version} {rule}"));
    }
}

#[test]
fn string_power_levels_are_accepted_before_version_10() {
    for (version, allowed) in [(RoomVersionId::V9, true), (RoomVersionId::V10, false)] {
        let mut room = Room::new(version.clone(), "public", plain_power(&version));
        let power = json!({ "users": { ALICE: "100" }, "events": { "m.room.power_levels": "100" } });
        let result = room.send(ALICE, "m.room.power_levels", Some(""), power);
        allowed_or_refused(result, allowed, version.as_str());
    }
}
