//! A joined room's entry when only typing moved in it. Someone typing wakes
//! every waiting `/sync` of the room's members; each would read the room's
//! row, its seq at the position, the reader's receipts and unread counts, to
//! answer the same counts as last time around one `m.typing`.
//!
//! So what an incremental entry of a joined room said besides its events
//! (the room's seq, the unread counts, the summary) is kept per (user, room)
//! with the stream position it was read at. It stands while the stream log
//! shows, since that position, no event and no receipt in the room, no
//! change of the user's account data (push rules move counts) and no write
//! of another process (the log cannot tell what that touched): nothing those
//! parts are read from has moved. A woken pass answers such a room from it
//! without reading the database.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::streams::Streams;

/// Entries kept at most; past it they are dropped all at once (each is
/// read again by the room's next entry).
const MAX_QUIET: usize = 50_000;

/// What an entry said besides its events.
#[derive(Debug, Clone, PartialEq)]
pub struct Quiet {
    /// The room's seq at the position.
    pub seq: i64,
    /// `unread_notifications`.
    pub unread: Value,
    /// `unread_thread_notifications`, when the filter asked for them.
    pub threads: Option<Value>,
    /// `summary`.
    pub summary: Value,
}

/// A kept [`Quiet`]: the position it was read at, whether its counts are
/// split by thread, and the parts.
type Kept = (i64, bool, Quiet);

/// [`Quiet`] parts per (user, room).
#[derive(Debug, Default)]
pub struct QuietRooms {
    entries: Mutex<HashMap<(String, String), Kept>>,
}

impl QuietRooms {
    /// Keeps what `user`'s entry of `room` said at stream position `at`.
    pub fn remember(&self, user: &str, room: &str, at: i64, by_thread: bool, quiet: Quiet) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_QUIET {
            entries.clear();
        }
        entries.insert((user.to_owned(), room.to_owned()), (at, by_thread, quiet));
    }

    /// What was kept for `user` in `room`, if it still holds at position
    /// `now` (see the module's notes).
    pub fn still(
        &self,
        streams: &Streams,
        user: &str,
        room: &str,
        now: i64,
        by_thread: bool,
    ) -> Option<Quiet> {
        let (at, kept_by_thread, quiet) = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.get(&(user.to_owned(), room.to_owned()))?.clone()
        };
        if kept_by_thread != by_thread || at > now {
            return None;
        }
        let moved = streams.changes_between(user, at, now)?;
        (!moved.rooms.contains_key(room) && !moved.account_data && !moved.my_membership).then_some(quiet)
    }
}

/// A joined room's entry with nothing new but `ephemeral`, from `quiet`;
/// `state_key` names the state field (`state` or `state_after`).
pub fn entry(quiet: Quiet, ephemeral: Vec<Value>, state_key: &str) -> Value {
    let mut room = json!({
        "timeline": {
            "events": [],
            "limited": false,
            "prev_batch": crate::room::history::token(quiet.seq),
        },
        "ephemeral": { "events": ephemeral },
        "account_data": { "events": [] },
        "unread_notifications": quiet.unread,
        "summary": quiet.summary,
    });
    if let Some(threads) = quiet.threads {
        room["unread_thread_notifications"] = threads;
    }
    room[state_key] = json!({ "events": [] });
    room
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet(seq: i64) -> Quiet {
        Quiet {
            seq,
            unread: json!({ "notification_count": 3, "highlight_count": 1 }),
            threads: None,
            summary: json!({}),
        }
    }

    #[test]
    fn an_entry_stands_until_its_room_or_the_users_rules_move() {
        let streams = Streams::starting_after(0);
        let rooms = QuietRooms::default();
        let at = streams.position();
        rooms.remember("@a:x", "!r:x", at, false, quiet(7));
        assert_eq!(rooms.still(&streams, "@a:x", "!r:x", at, false), Some(quiet(7)));
        assert_eq!(rooms.still(&streams, "@a:x", "!r:x", at, true), None, "counts split otherwise");
        assert_eq!(rooms.still(&streams, "@b:x", "!r:x", at, false), None, "another user's");

        // A receipt in another room leaves it standing; one in the room does not.
        let other = streams.reserve();
        let upto = other.pos;
        other.finish(crate::streams::Change::Receipt { room: "!other:x".into() });
        assert_eq!(rooms.still(&streams, "@a:x", "!r:x", upto, false), Some(quiet(7)));
        let here = streams.reserve();
        let upto = here.pos;
        here.finish(crate::streams::Change::Receipt { room: "!r:x".into() });
        assert_eq!(rooms.still(&streams, "@a:x", "!r:x", upto, false), None);

        // The user's push rules moving (account data) puts it aside too.
        rooms.remember("@a:x", "!r:x", upto, false, quiet(8));
        let data = streams.reserve();
        let later = data.pos;
        data.finish(crate::streams::Change::AccountData { user: "@a:x".into() });
        assert_eq!(rooms.still(&streams, "@a:x", "!r:x", later, false), None);
        // A write the log cannot place (another process's) as well.
        rooms.remember("@a:x", "!r:x", later, false, quiet(8));
        let unknown = streams.reserve();
        let last = unknown.pos;
        unknown.finish(crate::streams::Change::Unknown);
        assert_eq!(rooms.still(&streams, "@a:x", "!r:x", last, false), None);
    }
}
