//! What an event placed at the head of a room's line counts for in unread
//! counts (docs/unread-counts.md). The write path asks [`classify`] once per
//! event, whoever will read it: the spec's default push rules are evaluated
//! for a reader the event cannot name (a user id no one can guess), which is
//! what they say for every reader it does not name. What differs per reader
//! is marked for them to evaluate themselves: the users `m.mentions` names
//! and an invite's target (rows of `push_mentions`), and events whose body
//! the legacy name rules read (no `m.mentions`). Counting then takes running
//! totals instead of evaluating every unread event per reader.

use std::sync::{Arc, LazyLock};

use ruma::events::room::power_levels::RoomPowerLevels;
use ruma::push::{Action, FlattenedJson, PushConditionRoomCtx, Ruleset};
use ruma::serde::Raw;
use ruma::{OwnedUserId, RoomId, UInt, UserId};
use serde_json::Value;

/// What the default rules say of an event for readers it does not name and
/// for those it names, and which readers must look at it themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Class {
    /// `(notify, highlight)` for readers it does not name.
    pub unnamed: (bool, bool),
    /// For readers it names (`mentions`).
    pub named: (bool, bool),
    /// Who evaluates it themselves: [`LEGACY`] (a body the legacy name
    /// rules read: the readers it may name), [`EVERYONE`] (an invite naming
    /// others too), [`REDACTION`] (a redaction: counts before it may have
    /// moved), 0 no one.
    pub recheck: i64,
    /// Our users it names.
    pub mentions: Vec<String>,
    /// The thread root it is in (`None`: the main timeline).
    pub thread: Option<String>,
    /// The words of the body the legacy name rules read ([`words`]).
    pub words: i64,
}

impl Class {
    /// Whether it needs a row: it counts for someone.
    pub fn counts(&self) -> bool {
        self.unnamed.0 || self.recheck != 0 || (self.named.0 && !self.mentions.is_empty())
    }
}

/// The spec's default rule set (here, below `notify`, because the write
/// path classifies with it). ruma's `server_default` leaves out the three
/// rules deprecated in v1.7 (`.m.rule.contains_display_name`,
/// `.m.rule.roomnotif`, `.m.rule.contains_user_name`), which the spec still
/// lists and clients still show; they go in at their places. They only match
/// events without `m.mentions` (ruma's evaluation skips them otherwise).
pub fn default_ruleset(user: &UserId) -> Ruleset {
    let base = Ruleset::server_default(user);
    let Ok(mut value) = serde_json::to_value(&base) else { return base };
    let highlight_sound = serde_json::json!([
        "notify", { "set_tweak": "sound", "value": "default" }, { "set_tweak": "highlight" }
    ]);
    let legacy = [
        (
            ".m.rule.is_user_mention",
            serde_json::json!({
                "rule_id": ".m.rule.contains_display_name", "default": true, "enabled": true,
                "conditions": [{ "kind": "contains_display_name" }],
                "actions": highlight_sound,
            }),
        ),
        (
            ".m.rule.is_room_mention",
            serde_json::json!({
                "rule_id": ".m.rule.roomnotif", "default": true, "enabled": true,
                "conditions": [
                    { "kind": "event_match", "key": "content.body", "pattern": "@room" },
                    { "kind": "sender_notification_permission", "key": "room" },
                ],
                "actions": ["notify", { "set_tweak": "highlight" }],
            }),
        ),
    ];
    if let Some(rules) = value["override"].as_array_mut() {
        for (after, rule) in legacy {
            let at = rules.iter().position(|r| r["rule_id"] == after).map_or(rules.len(), |i| i + 1);
            rules.insert(at, rule);
        }
    }
    value["content"] = serde_json::json!([{
        "rule_id": ".m.rule.contains_user_name", "default": true, "enabled": true,
        "pattern": user.localpart(),
        "actions": highlight_sound,
    }]);
    serde_json::from_value(value).unwrap_or(base)
}

/// `recheck`: the legacy name rules read its body.
pub const LEGACY: i64 = 1;
/// `recheck`: every reader evaluates it (also set when it is redacted).
pub const EVERYONE: i64 = 2;
/// `recheck`: a redaction.
pub const REDACTION: i64 = 3;

/// The reader no event names: a user id drawn at random per process, whose
/// localpart no body holds, and the default rules built for it.
static NOBODY: LazyLock<(OwnedUserId, Arc<Ruleset>)> = LazyLock::new(|| {
    use rand::Rng;
    let mut rng = rand::rng();
    let local: String = (0..24).map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8)).collect();
    let user = OwnedUserId::try_from(format!("@{local}:nobody.invalid"))
        .unwrap_or_else(|_| OwnedUserId::try_from("@nobody:nobody.invalid").expect("a valid user id"));
    let rules = Arc::new(default_ruleset(&user));
    (user, rules)
});

/// The thread an event's content puts it in: the root its `m.thread`
/// relation names, when that is an event id (as `relations::relation_of`
/// records relations: a malformed or oversized id puts it in no thread).
pub fn thread_in(content: &Value) -> Option<&str> {
    let relates_to = content.get("m.relates_to")?;
    if relates_to.get("rel_type")?.as_str()? != "m.thread" {
        return None;
    }
    let root = relates_to.get("event_id")?.as_str()?;
    super::relations::names_an_event(root).then_some(root)
}

/// Classifies an event of `room_id` sent by `sender`; `power` gives the
/// room's power levels when the rules need them (an `@room` mention),
/// `ours` says which users are this server's. The rules are evaluated on the
/// fields they can name (type, sender, state key, content, room id), not the
/// whole PDU: its hashes, signatures and edges cost the most to flatten and
/// no rule reads them.
#[allow(clippy::too_many_arguments)]
pub async fn classify(
    room_id: &RoomId,
    sender: &str,
    content: &Value,
    kind: &str,
    state_key: Option<&str>,
    power: impl AsyncFnOnce() -> Option<RoomPowerLevels>,
    ours: &str,
) -> Option<Class> {
    let mut event = serde_json::json!({
        "type": kind, "sender": sender, "room_id": room_id.as_str(), "content": content,
    });
    if let Some(key) = state_key {
        event["state_key"] = key.into();
    }
    let raw: Raw<ruma::events::AnySyncTimelineEvent> =
        Raw::from_json(serde_json::value::to_raw_value(&event).ok()?);
    let has_mentions = FlattenedJson::from_raw(&raw).contains_mentions();
    let body = content.get("body").and_then(Value::as_str);
    let mut recheck = if !has_mentions && body.is_some() { LEGACY } else { 0 };
    let mut mentions: Vec<String> = Vec::new();
    if has_mentions && let Some(ids) = content["m.mentions"]["user_ids"].as_array() {
        mentions.extend(ids.iter().filter_map(Value::as_str).filter(|u| is_ours(u, ours)).map(str::to_owned));
    }
    let invited = (kind == "m.room.member" && content["membership"] == "invite")
        .then_some(state_key)
        .flatten()
        .filter(|u| is_ours(u, ours));
    // An invite naming others besides its target says something else to
    // each: every reader evaluates it.
    if invited.is_some() && !mentions.is_empty() {
        recheck = EVERYONE;
    }
    if kind == "m.room.redaction" {
        recheck = REDACTION;
    }
    mentions.extend(invited.map(str::to_owned));
    mentions.sort_unstable();
    mentions.dedup();

    let room_mention = if has_mentions {
        content["m.mentions"]["room"] == true
    } else {
        body.is_some_and(|b| b.contains("@room"))
    };
    let (nobody, rules) = &*NOBODY;
    // The member count only picks between rules of the same outcome (one to
    // one or not); the display name is one no body holds.
    let mut ctx =
        PushConditionRoomCtx::new(room_id.to_owned(), UInt::MIN, nobody.clone(), nobody.localpart().into());
    if room_mention {
        ctx.power_levels = power().await.map(Into::into);
    }
    let unnamed = outcome(rules, &raw, &ctx).await;
    // What the defaults say to a reader the event names: the same event
    // naming the reader no one can be.
    let named = match (mentions.is_empty() || recheck != 0, invited) {
        (true, _) => unnamed,
        (false, Some(_)) => named_outcome(event, &ctx, |e| e["state_key"] = nobody.as_str().into()).await,
        (false, None) => {
            let add = |pdu: &mut Value| {
                if let Some(ids) = pdu["content"]["m.mentions"]["user_ids"].as_array_mut() {
                    ids.push(nobody.as_str().into());
                }
            };
            named_outcome(event, &ctx, add).await
        }
    };
    let words = if recheck == LEGACY { body.map_or(0, words) } else { 0 };
    Some(Class { unnamed, named, recheck, mentions, thread: thread_in(content).map(str::to_owned), words })
}

/// A 64-bit signature of the words of `text` (lowercased, split at every
/// character but ASCII letters and digits), two bits per word: if a body's
/// signature lacks a bit of [`mask`]'s for a name, the legacy rules cannot
/// find that name in it. (They match a name at word boundaries, where a
/// word character is an ASCII letter, digit or `_`: every piece of the name
/// between such boundaries is then a whole word of the body here too.)
pub fn words(text: &str) -> i64 {
    text.to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .fold(0, |acc, w| acc | word_bits(w))
}

/// The bits a body's [`words`] must have for the legacy rules to find
/// `name` in it; 0 (any body) when the name is a glob or has no word.
pub fn mask(name: &str) -> i64 {
    if name.contains(['*', '?']) {
        return 0;
    }
    words(name)
}

/// Two bits for a word, from a hash that does not change between processes
/// or versions (FNV-1a): the signatures are stored.
fn word_bits(word: &str) -> i64 {
    let hash =
        word.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let bits = (1_u64 << (hash % 64)) | (1_u64 << ((hash >> 6) % 64));
    bits.cast_signed()
}

/// `(notify, highlight)` of the default rules for the reader of `ctx`: a
/// highlight counts only with a notification, as in `notify::Counts`.
async fn outcome(
    rules: &Ruleset,
    raw: &Raw<ruma::events::AnySyncTimelineEvent>,
    ctx: &PushConditionRoomCtx,
) -> (bool, bool) {
    let actions = rules.get_actions(raw, ctx).await;
    let notifies = actions.iter().any(|a| matches!(a, Action::Notify));
    (notifies, notifies && actions.iter().any(Action::is_highlight))
}

/// [`outcome`] of `event` once `name` has made it name the reader.
async fn named_outcome(
    mut event: Value,
    ctx: &PushConditionRoomCtx,
    name: impl FnOnce(&mut Value),
) -> (bool, bool) {
    name(&mut event);
    let Ok(raw) = serde_json::value::to_raw_value(&event) else { return (false, false) };
    outcome(&NOBODY.1, &Raw::from_json(raw), ctx).await
}

/// Whether `user` looks like one of this server's user ids.
fn is_ours(user: &str, ours: &str) -> bool {
    user.starts_with('@') && user.split_once(':').is_some_and(|(_, server)| server == ours)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use ruma::push::{FlattenedJson, PushCondition, PushConditionRoomCtx};
    use ruma::serde::Raw;

    use super::{mask, words};

    /// Whether the legacy display-name rule finds `name` in `body`, as ruma
    /// evaluates it.
    fn rule_finds(body: &str, name: &str) -> bool {
        let event =
            serde_json::json!({ "sender": "@a:x", "type": "m.room.message", "content": { "body": body } });
        let raw: Raw<serde_json::Value> = Raw::new(&event).expect("json");
        let flat = FlattenedJson::from_raw(&raw);
        let user = ruma::OwnedUserId::try_from("@b:x").expect("user id");
        let room = ruma::OwnedRoomId::try_from("!r:x").expect("room id");
        let ctx = PushConditionRoomCtx::new(room, ruma::UInt::MIN, user, name.to_owned());
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        #[allow(deprecated)]
        runtime.block_on(PushCondition::ContainsDisplayName.applies(&flat, &ctx))
    }

    fn text(pieces: &'static [&'static str], most: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(pieces), 1..most).prop_map(|p| p.concat())
    }

    const PIECES: &[&str] = &[
        "bob", "Bob", "BOB", "by", "smith", "_", "-", "!", "@", ":", " ", ".", "é", "Ünï", "x1", "İ", "ß",
        "*",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// A body in which the rule finds a name always has the name's bits.
        #[test]
        fn a_found_name_is_in_the_signature(body in text(PIECES, 12), name in text(PIECES, 4)) {
            if rule_finds(&body, &name) {
                let m = mask(&name);
                prop_assert_eq!(words(&body) & m, m, "body {:?} name {:?}", body, name);
            }
        }
    }

    #[test]
    fn signatures_tell_names_apart() {
        let body = words("lunch, Bob? 12");
        assert_eq!(body & mask("bob"), mask("bob"));
        assert_ne!(body & mask("carol"), mask("carol"), "carol is not in the body");
        assert_eq!(mask("b*b"), 0, "a glob matches any body");
        assert_eq!(mask("éÜ"), 0, "no ASCII letter or digit: any body");
    }
}
