//! State resolution: the room's state where its graph forked and joins
//! again. ruma's `resolve` does the resolving (v2; v2.1 for room version
//! 12); this module hands it what it asks for out of events already loaded:
//! the auth chain of each state set, and for v2.1 the conflicted state
//! subgraph (the events on an auth path from one conflicted event to
//! another). It reads nothing itself, so the write path loads first and
//! resolves inside its transaction without waiting on the network.

use std::collections::{HashMap, HashSet};

use ruma::OwnedEventId;
use ruma::room_version_rules::RoomVersionRules;
use ruma::state_res::StateMap;
use ruma::state_res::utils::event_id_set::EventIdSet;

use super::pdu::Pdu;
use crate::error::{Error, Result};

/// A state: for each (type, state key), the event that holds it.
pub type StateIds = StateMap<OwnedEventId>;

/// The events a resolution may read, by id.
pub type Events = HashMap<OwnedEventId, Pdu>;

/// The auth chain of `roots` within `events`: every event reached from
/// them through `auth_events`, transitively (a root itself only where
/// another root's chain reaches it).
pub fn auth_chain<'a>(
    events: &Events,
    roots: impl IntoIterator<Item = &'a OwnedEventId>,
) -> HashSet<OwnedEventId> {
    let mut chain = HashSet::new();
    let mut stack: Vec<&OwnedEventId> =
        roots.into_iter().filter_map(|r| events.get(r)).flat_map(|p| p.auth_events.iter()).collect();
    while let Some(id) = stack.pop() {
        if chain.insert(id.clone())
            && let Some(pdu) = events.get(id)
        {
            stack.extend(pdu.auth_events.iter());
        }
    }
    chain
}

/// The conflicted state subgraph of state resolution v2.1: the events that
/// a conflicted event reaches through `auth_events` (or is) and that reach a
/// conflicted event (or are one). Events not in `events` end a path.
pub fn conflicted_subgraph(
    events: &Events,
    conflicted: &StateMap<Vec<OwnedEventId>>,
) -> HashSet<OwnedEventId> {
    let targets: HashSet<&OwnedEventId> = conflicted.values().flatten().collect();
    // Whether each ancestor of a conflicted event reaches one: a depth-first
    // walk, each event decided after its auth events (no recursion, so a
    // long chain cannot overflow the stack).
    let mut reaches: HashMap<&OwnedEventId, bool> = HashMap::new();
    let auth = |id: &OwnedEventId| events.get(id).map(|p| p.auth_events.as_slice()).unwrap_or_default();
    for start in &targets {
        let mut stack: Vec<(&OwnedEventId, bool)> = vec![(start, false)];
        while let Some((id, expanded)) = stack.pop() {
            if reaches.contains_key(id) {
                continue;
            }
            if expanded {
                let reached = targets.contains(id) || auth(id).iter().any(|a| reaches.get(a) == Some(&true));
                reaches.insert(id, reached);
            } else {
                stack.push((id, true));
                stack.extend(auth(id).iter().filter(|a| !reaches.contains_key(a)).map(|a| (a, false)));
            }
        }
    }
    reaches.into_iter().filter(|(_, reached)| *reached).map(|(id, _)| id.clone()).collect()
}

/// Resolves `states` (the states after the tips being joined) by the rules of
/// the room's version. `events` must hold every event the states name and
/// their auth chains; an event missing there is left out of the resolution
/// (ruma does not honour what it cannot read). A failure is the event's
/// (its tips cannot be resolved), not ours.
pub fn resolve(rules: &RoomVersionRules, states: &[StateIds], events: &Events) -> Result<StateIds> {
    let v2 = rules
        .state_res
        .v2_rules()
        .ok_or_else(|| Error::Forbidden("This room version's state resolution is not supported".into()))?;
    let auth_chains: Vec<EventIdSet<OwnedEventId>> =
        states.iter().map(|s| auth_chain(events, s.values()).into_iter().collect()).collect();
    ruma::state_res::resolve(
        &rules.authorization,
        v2,
        states.iter(),
        auth_chains,
        |id| events.get(id).cloned(),
        |conflicted| Some(conflicted_subgraph(events, conflicted).into_iter().collect()),
    )
    .map_err(|e| Error::Forbidden(format!("The room's state cannot be resolved here: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruma::events::StateEventType;
    use serde_json::json;

    /// A PDU of room version 11 with these fields (signatures are not read here).
    fn pdu(
        id: &str,
        kind: &str,
        sender: &str,
        key: Option<&str>,
        content: serde_json::Value,
        auth: &[&str],
        ts: u64,
    ) -> Pdu {
        let mut event = json!({
            "room_id": "!r:a", "type": kind, "sender": sender, "content": content,
            "auth_events": auth, "prev_events": auth, "depth": 1, "origin_server_ts": ts,
            "hashes": { "sha256": "x" }, "signatures": {},
        });
        if let Some(key) = key {
            event["state_key"] = json!(key);
        }
        let object = serde_json::from_value(event).unwrap();
        Pdu::from_checked(OwnedEventId::try_from(id).unwrap(), &object).unwrap()
    }

    fn id(s: &str) -> OwnedEventId {
        OwnedEventId::try_from(s).unwrap()
    }

    /// A room by @a:a (power 100) with @b:a (power 50) joined, then two
    /// concurrent topic changes: the later `origin_server_ts` wins whichever
    /// was seen last, as every server resolves it.
    #[test]
    fn concurrent_topics_resolve_by_the_rules_not_by_arrival() {
        let rules = ruma::RoomVersionId::V11.rules().unwrap();
        let power = json!({ "users": { "@a:a": 100, "@b:a": 50 }, "state_default": 50 });
        let events: Events = [
            pdu("$create", "m.room.create", "@a:a", Some(""), json!({ "room_version": "11" }), &[], 1),
            pdu(
                "$ja",
                "m.room.member",
                "@a:a",
                Some("@a:a"),
                json!({ "membership": "join" }),
                &["$create"],
                2,
            ),
            pdu("$pl", "m.room.power_levels", "@a:a", Some(""), power, &["$create", "$ja"], 3),
            pdu(
                "$jr",
                "m.room.join_rules",
                "@a:a",
                Some(""),
                json!({ "join_rule": "public" }),
                &["$create", "$ja", "$pl"],
                4,
            ),
            pdu(
                "$jb",
                "m.room.member",
                "@b:a",
                Some("@b:a"),
                json!({ "membership": "join" }),
                &["$create", "$pl", "$jr"],
                5,
            ),
            pdu(
                "$t1",
                "m.room.topic",
                "@a:a",
                Some(""),
                json!({ "topic": "one" }),
                &["$create", "$pl", "$ja"],
                7,
            ),
            pdu(
                "$t2",
                "m.room.topic",
                "@b:a",
                Some(""),
                json!({ "topic": "two" }),
                &["$create", "$pl", "$jb"],
                6,
            ),
        ]
        .into_iter()
        .map(|p| (p.event_id.clone(), p))
        .collect();
        let base: StateIds = [
            ((StateEventType::RoomCreate, String::new()), id("$create")),
            ((StateEventType::RoomMember, "@a:a".to_owned()), id("$ja")),
            ((StateEventType::RoomPowerLevels, String::new()), id("$pl")),
            ((StateEventType::RoomJoinRules, String::new()), id("$jr")),
            ((StateEventType::RoomMember, "@b:a".to_owned()), id("$jb")),
        ]
        .into_iter()
        .collect();
        let with = |topic: &str| {
            let mut s = base.clone();
            s.insert((StateEventType::RoomTopic, String::new()), id(topic));
            s
        };
        let topic = |s: &StateIds| s[&(StateEventType::RoomTopic, String::new())].clone();
        // Either order of the tips gives the same answer: $t1, the later.
        assert_eq!(topic(&resolve(&rules, &[with("$t1"), with("$t2")], &events).unwrap()), id("$t1"));
        assert_eq!(topic(&resolve(&rules, &[with("$t2"), with("$t1")], &events).unwrap()), id("$t1"));
    }

    #[test]
    fn the_conflicted_subgraph_holds_the_paths_between_conflicted_events() {
        // $c <- $x <- $y <- $d (auth edges point left); $z beside $y.
        let events: Events = [
            pdu("$c", "m.room.power_levels", "@a:a", Some(""), json!({}), &[], 1),
            pdu("$x", "m.room.member", "@a:a", Some("@a:a"), json!({}), &["$c"], 1),
            pdu("$y", "m.room.member", "@b:a", Some("@b:a"), json!({}), &["$x"], 1),
            pdu("$z", "m.room.member", "@e:a", Some("@e:a"), json!({}), &["$x"], 1),
            pdu("$d", "m.room.power_levels", "@a:a", Some(""), json!({}), &["$y", "$unknown"], 1),
        ]
        .into_iter()
        .map(|p| (p.event_id.clone(), p))
        .collect();
        let conflicted: StateMap<Vec<OwnedEventId>> =
            [((StateEventType::RoomPowerLevels, String::new()), vec![id("$c"), id("$d")])]
                .into_iter()
                .collect();
        let mut got: Vec<String> =
            conflicted_subgraph(&events, &conflicted).iter().map(ToString::to_string).collect();
        got.sort();
        assert_eq!(got, ["$c", "$d", "$x", "$y"]);
        assert_eq!(auth_chain(&events, [&id("$d")]).len(), 4, "$y $x $c and the unknown id");
    }
}
