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
use ruma::{OwnedUserId, RoomId, UInt};
use serde_json::Value;

/// What the default rules say of an event for readers it does not name, and
/// which readers must look at it themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Class {
    /// It notifies them.
    pub notifies: bool,
    /// It highlights for them.
    pub highlights: bool,
    /// Every reader evaluates it (a body the legacy name rules read).
    pub recheck: bool,
    /// Our users it names, who evaluate it themselves.
    pub mentions: Vec<String>,
    /// The thread root it is in (`None`: the main timeline).
    pub thread: Option<String>,
}

impl Class {
    /// Whether it needs a row: it counts for someone.
    pub fn counts(&self) -> bool {
        self.notifies || self.highlights || self.recheck || !self.mentions.is_empty()
    }
}

/// The reader no event names: a user id drawn at random per process, whose
/// localpart no body holds, and the default rules built for it.
static NOBODY: LazyLock<(OwnedUserId, Arc<Ruleset>)> = LazyLock::new(|| {
    use rand::Rng;
    let mut rng = rand::rng();
    let local: String = (0..24).map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8)).collect();
    let user = OwnedUserId::try_from(format!("@{local}:nobody.invalid"))
        .unwrap_or_else(|_| OwnedUserId::try_from("@nobody:nobody.invalid").expect("a valid user id"));
    let rules = Arc::new(crate::notify::default_ruleset(&user));
    (user, rules)
});

/// The thread an event's content puts it in: the root its `m.thread`
/// relation names.
pub fn thread_in(content: &Value) -> Option<&str> {
    let relates_to = content.get("m.relates_to")?;
    if relates_to.get("rel_type")?.as_str()? != "m.thread" {
        return None;
    }
    relates_to.get("event_id")?.as_str()
}

/// Classifies an event (`json`: its PDU) of `room_id` sent by `sender`;
/// `power` gives the room's power levels when the rules need them (an
/// `@room` mention), `ours` says which users are this server's.
pub async fn classify(
    room_id: &RoomId,
    json: &str,
    content: &Value,
    kind: &str,
    state_key: Option<&str>,
    power: impl AsyncFnOnce() -> Option<RoomPowerLevels>,
    ours: &str,
) -> Option<Class> {
    let raw = serde_json::value::RawValue::from_string(json.to_owned()).ok()?;
    let raw: Raw<ruma::events::AnySyncTimelineEvent> = Raw::from_json(raw);
    let flat = FlattenedJson::from_raw(&raw);
    let has_mentions = flat.contains_mentions();
    let body = content.get("body").and_then(Value::as_str);
    let recheck = !has_mentions && body.is_some();
    let mut mentions: Vec<String> = Vec::new();
    if has_mentions && let Some(ids) = content["m.mentions"]["user_ids"].as_array() {
        mentions.extend(ids.iter().filter_map(Value::as_str).filter(|u| is_ours(u, ours)).map(str::to_owned));
    }
    if kind == "m.room.member"
        && content["membership"] == "invite"
        && let Some(target) = state_key.filter(|u| is_ours(u, ours))
    {
        mentions.push(target.to_owned());
    }
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
    let actions = rules.get_actions(&raw, &ctx).await;
    // A highlight counts only with a notification, as in `notify::Counts`.
    let notifies = actions.iter().any(|a| matches!(a, Action::Notify));
    let class = Class {
        notifies,
        highlights: notifies && actions.iter().any(Action::is_highlight),
        recheck,
        mentions,
        thread: thread_in(content).map(str::to_owned),
    };
    Some(class)
}

/// Whether `user` looks like one of this server's user ids.
fn is_ours(user: &str, ours: &str) -> bool {
    user.starts_with('@') && user.split_once(':').is_some_and(|(_, server)| server == ours)
}
