//! One room of a sliding sync answer (`../shared/SLIDING-SYNC.md` §A.5):
//! what the connection's client lacks of it, read through the user's
//! readable ranges like every other read. A joined room is read up to the
//! head, a room left up to the leave; an invite or knock gives only its
//! stripped state.

use std::sync::Arc;

use ruma::push::Ruleset;
use serde_json::{Map, Value, json};

use super::conn::{RoomSent, Sent};
use super::list::Candidate;
use super::request::RoomConfig;
use crate::account::Requester;
use crate::error::Result;
use crate::room::history;
use crate::room::read::{self, Access, Loaded, RoomView};
use crate::state::AppState;
use crate::storage::{events, receipts, sliding};
use crate::sync::{SyncFilter, Token};

/// What a request knows while it builds rooms.
pub struct Ctx<'a> {
    pub state: &'a AppState,
    pub me: &'a Requester,
    /// The position the answer is built at.
    pub now: Token,
    /// The user's push rules (for the unread counts).
    pub rules: &'a Arc<Ruleset>,
    /// The user's read marks in the rooms never sent on the connection,
    /// read for all of them at once (a room missing here reads its own).
    pub marks: &'a std::collections::HashMap<String, Vec<(String, Option<i64>)>>,
}

/// What the client holds of a room before this answer.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    /// How far, and with which config; `None`: never sent on the connection.
    pub sent: Option<&'a RoomSent>,
    /// The stream position of the connection's previous answer.
    pub stream: i64,
}

impl Held<'_> {
    /// The stream position up to which the client has the room.
    fn until(&self) -> Option<i64> {
        self.sent.map(|s| match s.sent {
            Sent::Live => self.stream,
            Sent::Until(t) => t,
        })
    }
}

/// A room's entry in an answer, and what the extensions need of it.
pub struct Built {
    /// `rooms.<id>`; `None`: nothing new for the client.
    pub body: Option<Value>,
    /// The room was sent whole (`initial`, or its timeline widened).
    pub whole: bool,
    /// The ids of the timeline's events.
    pub timeline: Vec<String>,
    /// The receipts of the room changed since the client's position.
    pub receipts: Vec<receipts::Receipt>,
}

/// The state keys `required_state` asks for, as matched against events.
struct Wanted<'a> {
    pairs: &'a [(String, String)],
    me: &'a str,
    /// The users `$LAZY` stands for: the timeline's senders and the
    /// targets of its member events.
    lazy: Vec<String>,
}

impl Wanted<'_> {
    fn all(&self) -> bool {
        self.pairs.iter().any(|(t, k)| t == "*" && k == "*")
    }

    fn matches(&self, kind: &str, key: &str) -> bool {
        if self.all() {
            return true;
        }
        self.pairs.iter().any(|(t, k)| {
            (t == "*" || t == kind)
                && (k == "*"
                    || k == key
                    || (k == "$ME" && key == self.me)
                    || (k == "$LAZY" && kind == "m.room.member" && self.lazy.iter().any(|u| u == key)))
        })
    }

    /// Whether every member event may be wanted (then the whole state is
    /// read rather than the chosen members).
    fn all_members(&self) -> bool {
        self.pairs.iter().any(|(t, k)| (t == "*" || t == "m.room.member") && k == "*")
    }

    /// The member state keys wanted by name.
    fn members(&self) -> Vec<&str> {
        let mut users: Vec<&str> = vec![self.me];
        users.extend(self.lazy.iter().map(String::as_str));
        for (t, k) in self.pairs {
            if (t == "m.room.member" || t == "*") && !k.starts_with('$') && k != "*" {
                users.push(k);
            }
        }
        users.sort_unstable();
        users.dedup();
        users
    }
}

/// Builds `candidate`'s entry for a client holding `held`, with `config`;
/// `at`: where the room stands (read for all the answer's rooms at once).
pub async fn build(
    ctx: &Ctx<'_>,
    view: &RoomView,
    candidate: &Candidate<'_>,
    config: &RoomConfig,
    held: Held<'_>,
    at: sliding::Positions,
    is_dm: bool,
) -> Result<Built> {
    let state = ctx.state;
    let me = ctx.me;
    let access = read::access(state, view, &me.user_id).await?;
    let room_id = view.room.room_id.as_str();
    let since_stream = held.until();
    let membership = access.history.current().to_owned();
    let mut out = Map::new();
    if is_dm {
        out.insert("is_dm".into(), json!(true));
    }
    let nothing = Built { body: None, whole: false, timeline: Vec::new(), receipts: Vec::new() };

    if matches!(membership.as_str(), "invite" | "knock") {
        // Sent once, and again when a new invite or knock came since.
        if since_stream.is_some_and(|s| candidate.room.stream <= s) {
            return Ok(nothing);
        }
        // An invite or knock replaces whatever the client knew of the room.
        out.insert("initial".into(), json!(true));
        let stripped = crate::sync::invite_state(state, view, &me.user_id).await?;
        out.insert("invite_state".into(), json!(stripped));
        // No events nor state but the stripped state; the empty fields are
        // sent all the same (matrix-js-sdk reads both from every room).
        out.insert("timeline".into(), json!([]));
        out.insert("required_state".into(), json!([]));
        out.insert("bump_stamp".into(), json!(candidate.room.stream));
        return Ok(Built {
            body: Some(Value::Object(out)),
            whole: true,
            timeline: Vec::new(),
            receipts: Vec::new(),
        });
    }

    let joined = access.joined();
    let end = if joined {
        at.end
    } else {
        // Left, kicked or banned: the room as it was at the end of the
        // last stay.
        access.stays.iter().filter_map(|r| r.max_seq).max().unwrap_or(candidate.room.horizon)
    };
    // The state the user may see ends where every read says it does
    // (`read::state_horizon`): now while joined, at the end of the last stay
    // after a leave; one never joined (an invite turned down, a knock
    // refused) sees only their own membership.
    let (state_end, own_only) = match read::state_horizon(view, &access) {
        _ if joined => (end, false),
        Ok(horizon) => (horizon.min(end), false),
        Err(_) => (end, true),
    };
    let own = |s: &events::StoredEvent| {
        crate::room::pdu::Pdu::from_stored(&s.event_id, &s.json).is_ok_and(|p| {
            p.kind.to_string() == "m.room.member" && p.state_key.as_deref() == Some(me.user_id.as_str())
        })
    };
    let since_seq = match (since_stream, held.sent.map(|s| &s.sent)) {
        (Some(_), Some(Sent::Live)) => at.since.min(end),
        (Some(s), _) => events::seq_at_stream(&state.db, room_id, s).await?.min(end),
        (None, _) => 0,
    };
    // Never sent, or joined since the client's position (it held at most
    // an invite's stripped state): the room goes whole, as `initial`.
    let stay_start =
        access.stays.iter().filter(|r| r.kind == "join" && r.max_seq.is_none()).map(|r| r.min_seq).max();
    let initial = held.sent.is_none() || (joined && stay_start.is_some_and(|s| s > since_seq));
    if initial {
        out.insert("initial".into(), json!(true));
    }
    let before = held.sent.map(|s| &s.config);
    let timeline_grew = before.is_some_and(|b| config.timeline_limit > b.timeline_limit);
    let state_grew =
        before.is_some_and(|b| config.required_state.iter().any(|p| !b.required_state.contains(p)));
    let whole_timeline = initial || timeline_grew;

    // The timeline: the newest readable events of the window.
    let limit = usize::try_from(config.timeline_limit).unwrap_or(usize::MAX);
    let filter = SyncFilter { timeline_limit: limit, ..SyncFilter::default() };
    let lo = if whole_timeline { 0 } else { since_seq };
    let (timeline, mut limited) = crate::sync::timeline(state, view, &access, lo, end, &filter).await?;
    // Read down to the bottom of the line, where history continues on
    // another server (a room joined over federation): there is more, which
    // `/messages` from `prev_batch` fetches.
    if !limited && lo == 0 && !timeline.is_empty() {
        limited =
            crate::storage::backfill::bottom(&state.db, room_id).await?.is_some_and(|(_, m)| !m.is_empty());
    }
    // What changed in the state since the client's position (names,
    // avatars and members are resent on a change).
    let mut changed = if initial || since_seq >= state_end {
        Vec::new()
    } else {
        events::state_changed_between(&state.db, room_id, since_seq, state_end).await?
    };
    if own_only {
        changed.retain(|s| own(s));
    }
    // A room never sent takes its receipts apart (those of its timeline):
    // only the read marks are read here.
    let (receipts_changed, marks) = match since_stream {
        Some(since) => {
            receipts::changed_and_read_up_to(&state.db, room_id, since, ctx.now.stream, me.user_id.as_str())
                .await?
        }
        None => match ctx.marks.get(room_id) {
            Some(marks) => (Vec::new(), marks.clone()),
            None => (Vec::new(), receipts::read_up_to(&state.db, room_id, me.user_id.as_str()).await?),
        },
    };
    let own_receipt = receipts_changed.iter().any(|r| r.user_id == me.user_id.as_str());
    let news =
        initial || timeline_grew || state_grew || !timeline.is_empty() || !changed.is_empty() || own_receipt;
    if !news {
        return Ok(Built { receipts: receipts_changed, ..nothing });
    }

    let mut lazy: Vec<String> = Vec::new();
    for e in &timeline {
        lazy.push(e.pdu.sender.to_string());
        if e.pdu.kind.to_string() == "m.room.member"
            && let Some(key) = &e.pdu.state_key
        {
            lazy.push(key.clone());
        }
    }
    lazy.sort_unstable();
    lazy.dedup();
    let wanted = Wanted { pairs: &config.required_state, me: me.user_id.as_str(), lazy };
    let required = if own_only {
        // Their own member event, if asked for and whatever it says.
        let mine = events::members_at(&state.db, room_id, &[me.user_id.as_str()], end).await?;
        let mut out = Vec::new();
        for stored in mine.into_iter().filter(|s| own(s)) {
            let loaded = read::load(state, stored).await?;
            if wanted.matches("m.room.member", me.user_id.as_str()) {
                out.push(read::format(view, &loaded, me, &access.history));
            }
        }
        out
    } else {
        required_state(ctx, view, &access, &wanted, state_end, initial || state_grew, &changed).await?
    };

    let mut names = Map::new();
    let changed_kinds: Vec<(String, String)> = changed
        .iter()
        .filter_map(|s| crate::room::pdu::Pdu::from_stored(&s.event_id, &s.json).ok())
        .map(|p| (p.kind.to_string(), p.state_key.unwrap_or_default()))
        .collect();
    let moved = |kind: &str| {
        !own_only && (initial || changed_kinds.iter().any(|(k, key)| k == kind && key.is_empty()))
    };
    // The name and avatar now come with the room list; a room left is
    // read at the leave.
    let at_head = joined;
    if moved("m.room.name") {
        let name = if at_head {
            candidate.room.name.clone()
        } else {
            state_content(state, room_id, "m.room.name", state_end)
                .await?
                .and_then(|c| c["name"].as_str().filter(|n| !n.is_empty()).map(str::to_owned))
        };
        if let Some(name) = name {
            names.insert("name".into(), json!(name));
        }
    }
    if moved("m.room.avatar") {
        let avatar = if at_head {
            candidate.room.avatar.clone()
        } else {
            state_content(state, room_id, "m.room.avatar", state_end)
                .await?
                .and_then(|c| c["url"].as_str().filter(|u| !u.is_empty()).map(str::to_owned))
        };
        match avatar {
            Some(url) => {
                names.insert("avatar".into(), json!(url));
            }
            None if !initial => {
                names.insert("avatar".into(), Value::Null);
            }
            None => {}
        }
    }
    out.extend(names);
    let members_moved = initial || changed_kinds.iter().any(|(k, _)| k == "m.room.member");
    if joined && members_moved {
        let summary = read::member_summary(state, view).await?;
        out.insert("joined_count".into(), json!(summary.joined));
        out.insert("invited_count".into(), json!(summary.invited));
        if !summary.named {
            out.insert("heroes".into(), json!(heroes(state, view, &summary.first_members, me, end).await?));
        }
    }

    let start = timeline.first().map_or(end + 1, |e| e.stored.seq);
    let num_live = if initial { 0 } else { timeline.iter().filter(|e| e.stored.seq > since_seq).count() };
    let refs: Vec<&Loaded> = timeline.iter().collect();
    let formatted = read::format_events(state, view, &access, me, &refs).await?;
    out.insert("timeline".into(), json!(formatted));
    out.insert("num_live".into(), json!(num_live));
    if limited {
        out.insert("limited".into(), json!(true));
    }
    if timeline_grew {
        out.insert("unstable_expanded_timeline".into(), json!(true));
    }
    out.insert("prev_batch".into(), json!(history::token(start - 1)));
    out.insert("required_state".into(), json!(required));
    let bump = if joined { at.bump } else { candidate.room.stream };
    out.insert("bump_stamp".into(), json!(bump));
    if joined {
        let marks = crate::notify::ReadMarks::from_rows(marks);
        let counts = crate::notify::counts(state, view, &access, me, ctx.rules, marks, end).await?;
        out.insert("notification_count".into(), json!(counts.notify));
        out.insert("highlight_count".into(), json!(counts.highlight));
    }
    Ok(Built {
        body: Some(Value::Object(out)),
        whole: whole_timeline,
        timeline: timeline.iter().map(|e| e.stored.event_id.clone()).collect(),
        receipts: receipts_changed,
    })
}

/// The content of the state event (`kind`, "") at `at`, if any.
async fn state_content(state: &AppState, room_id: &str, kind: &str, at: i64) -> Result<Option<Value>> {
    let Some(stored) = events::state_event(&state.db, room_id, kind, "").await? else { return Ok(None) };
    // The current state is what a joined member sees; a room left is read
    // at the leave.
    if stored.seq > at {
        let at_end = events::state_at(&state.db, room_id, at).await?;
        return Ok(at_end
            .into_iter()
            .filter_map(|s| crate::room::pdu::Pdu::from_stored(&s.event_id, &s.json).ok())
            .find(|p| p.kind.to_string() == kind && p.state_key.as_deref() == Some(""))
            .and_then(|p| p.content_as::<Value>()));
    }
    Ok(crate::room::pdu::Pdu::from_stored(&stored.event_id, &stored.json)?.content_as::<Value>())
}

/// `required_state`: the matching state at `end` when everything is due,
/// else the matching changes since the client's position and the members
/// the timeline needs.
async fn required_state(
    ctx: &Ctx<'_>,
    view: &RoomView,
    access: &Access,
    wanted: &Wanted<'_>,
    end: i64,
    everything: bool,
    changed: &[events::StoredEvent],
) -> Result<Vec<Value>> {
    let state = ctx.state;
    let room_id = view.room.room_id.as_str();
    if wanted.pairs.is_empty() || end <= 0 {
        return Ok(Vec::new());
    }
    let rows = if everything {
        if wanted.all_members() {
            events::state_at(&state.db, room_id, end).await?
        } else {
            read::lazy_state(state, view, &wanted.members(), end).await?
        }
    } else {
        let mut rows = changed.to_vec();
        // The timeline's senders, whatever changed ($LAZY).
        let lazy: Vec<&str> = wanted.lazy.iter().map(String::as_str).collect();
        if !lazy.is_empty() && wanted.pairs.iter().any(|(t, k)| t == "m.room.member" && k == "$LAZY") {
            for member in read::members_at(state, view, &lazy, end).await? {
                if !rows.iter().any(|r| r.event_id == member.event_id) {
                    rows.push(member);
                }
            }
        }
        rows
    };
    let mut out = Vec::new();
    for stored in rows {
        let loaded = read::load(state, stored).await?;
        let kind = loaded.pdu.kind.to_string();
        let key = loaded.pdu.state_key.clone().unwrap_or_default();
        if wanted.matches(&kind, &key) {
            out.push(read::format(view, &loaded, ctx.me, &access.history));
        }
    }
    Ok(out)
}

/// Up to five other members, for a room without a name: each with the
/// display name and avatar of their member event (one read for all).
async fn heroes(
    state: &AppState,
    view: &RoomView,
    first: &[String],
    me: &Requester,
    at: i64,
) -> Result<Vec<Value>> {
    let users: Vec<&str> =
        first.iter().map(String::as_str).filter(|u| *u != me.user_id.as_str()).take(5).collect();
    let events =
        if users.is_empty() { Vec::new() } else { read::members_at(state, view, &users, at).await? };
    let content_of = |user: &str| -> Value {
        events
            .iter()
            .filter_map(|s| crate::room::pdu::Pdu::from_stored(&s.event_id, &s.json).ok())
            .find(|p| p.state_key.as_deref() == Some(user))
            .and_then(|p| p.content_as::<Value>())
            .unwrap_or_default()
    };
    Ok(users
        .iter()
        .map(|user| {
            let content = content_of(user);
            let mut hero = json!({ "user_id": user });
            if let Some(name) = content["displayname"].as_str() {
                hero["displayname"] = json!(name);
            }
            if let Some(url) = content["avatar_url"].as_str() {
                hero["avatar_url"] = json!(url);
            }
            hero
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
    }

    #[test]
    fn required_state_special_values() {
        let p = pairs(&[
            ("m.room.name", ""),
            ("m.room.member", "$LAZY"),
            ("m.room.member", "$ME"),
            ("m.space.child", "*"),
        ]);
        let w = Wanted { pairs: &p, me: "@me:x", lazy: vec!["@bob:x".into()] };
        assert!(w.matches("m.room.name", ""));
        assert!(!w.matches("m.room.topic", ""));
        assert!(w.matches("m.room.member", "@me:x"));
        assert!(w.matches("m.room.member", "@bob:x"));
        assert!(!w.matches("m.room.member", "@eve:x"));
        assert!(w.matches("m.space.child", "!any:x"));
        assert!(!w.all_members());
        assert_eq!(w.members(), vec!["@bob:x", "@me:x"]);
        let all = pairs(&[("*", "*"), ("m.room.member", "$LAZY")]);
        let w = Wanted { pairs: &all, me: "@me:x", lazy: Vec::new() };
        assert!(w.matches("m.room.member", "@eve:x") && w.all_members());
        let any_type = pairs(&[("*", "")]);
        let w = Wanted { pairs: &any_type, me: "@me:x", lazy: Vec::new() };
        assert!(w.matches("m.room.topic", "") && !w.matches("m.room.member", "@me:x"));
    }
}
