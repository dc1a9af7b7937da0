//! The slowly changing inputs of [`super::read::access`], kept between
//! requests: a room's history-visibility line and retention setting (and,
//! once asked for, its power levels, member summary, servers, server ACL
//! and state but its members), and per user their membership changes, membership ranges and own
//! floor.
//!
//! They change only when the room's `read_epoch` moves (a state event, a
//! purge, a user's floor), and every request reads that epoch with the room's
//! row, so an entry is used only while its epoch is the row's. That holds
//! across processes sharing one PostgreSQL too: nothing here needs to be told
//! of a change, a stale entry is simply never matched again. What depends on
//! the head (`last_seq`, open stays reaching it) is worked out per request from
//! these inputs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use ruma::events::room::power_levels::RoomPowerLevels;
use tokio::sync::OnceCell;

use super::read::MembershipHistory;
use super::visibility::HvLine;
use crate::storage::events::StoredEvent;
use crate::storage::memberships::Range;
use crate::storage::rooms::RoomRow;

/// Rooms kept before the whole map is dropped and refilled on demand.
const MAX_ROOMS: usize = 10_000;
/// Users kept per room before that room's map is dropped.
const MAX_USERS_PER_ROOM: usize = 50_000;

/// A room's inputs at one read epoch.
#[derive(Debug)]
pub struct RoomInputs {
    epoch: i64,
    /// History visibility along the seq line.
    pub hv: HvLine,
    /// `m.room.retention`'s `max_lifetime` in force, if any.
    pub max_lifetime: Option<i64>,
    /// The current power levels, once asked for.
    pub power: OnceCell<RoomPowerLevels>,
    /// Member counts and heroes, once asked for.
    pub members: OnceCell<MemberSummary>,
    /// The servers with a user joined now, once asked for (joins and
    /// leaves are state: they move the epoch).
    pub servers: OnceCell<Vec<String>>,
    /// The current `m.room.server_acl` content (`None`: no ACL), once asked for.
    pub acl: OnceCell<Option<serde_json::Value>>,
    /// The state but its members at the head, once asked for there
    /// (`None`: too big to keep, see [`HeadState`]).
    pub state: OnceCell<Option<HeadState>>,
    users: Mutex<HashMap<String, Arc<UserInputs>>>,
}

/// A room's state but its member events, read at the head of the line
/// (`at`, the room row's `last_seq`) in this read epoch. No state event
/// follows `at` while the epoch stands (one would have moved it; so does the
/// redaction of a state event), so this is also the state at any seq from
/// `at` up to the head a later row of the same epoch gives.
#[derive(Debug)]
pub struct HeadState {
    /// The seq it was read at.
    pub at: i64,
    /// The events, in seq order.
    pub events: Arc<[StoredEvent]>,
}

/// The most stored JSON a room's [`HeadState`] is kept with: a few
/// kilobytes in most rooms; a space with thousands of children is read each
/// time instead.
pub const MAX_HEAD_STATE_BYTES: usize = 16 * 1024;

/// What `/sync`'s room summary and push rules need of the members.
#[derive(Debug, Clone, Default)]
pub struct MemberSummary {
    /// Joined members.
    pub joined: i64,
    /// Invited members.
    pub invited: i64,
    /// The room has an `m.room.name` or `m.room.canonical_alias`.
    pub named: bool,
    /// The first six joined or invited members by user id (heroes come from
    /// these, the asking user left out).
    pub first_members: Vec<String>,
}

/// One user's inputs in a room at the room's read epoch.
#[derive(Debug, Clone)]
pub struct UserInputs {
    /// Their membership changes.
    pub history: MembershipHistory,
    /// Their membership ranges.
    pub stays: Vec<Range>,
    /// Their own floor (0 when none).
    pub floor: i64,
    /// The display name in their current member event, if any.
    pub display_name: Option<String>,
}

/// The cache itself (one per server process).
#[derive(Debug, Default)]
pub struct ReadCache {
    rooms: Mutex<HashMap<String, Arc<RoomInputs>>>,
    /// Rooms' rows kept between calls ([`super::read::kept_row`]),
    /// each with the stream position it was read at and when.
    rows: Mutex<HashMap<String, (i64, Instant, RoomRow)>>,
    /// Member events read at a room's head ([`super::read::members_at`]),
    /// by room and user: see [`KeptMember`].
    members: Mutex<HashMap<(String, String), KeptMember>>,
}

/// Member events kept in all, before the whole map is dropped.
const MAX_MEMBERS: usize = 20_000;

/// A user's member event in a room as read at the head of the line (`at`,
/// the room row's `last_seq`) in read epoch `epoch`, or that they had none.
/// Any member event moves the epoch, so while it stands this is also the
/// member event at any seq from `at` up to the head.
#[derive(Debug, Clone)]
pub struct KeptMember {
    /// The read epoch it was read in.
    pub epoch: i64,
    /// The seq it was read at.
    pub at: i64,
    /// The event; `None`: the user had none.
    pub event: Option<StoredEvent>,
}

impl ReadCache {
    /// A room's row kept by [`ReadCache::put_row`], with its position and
    /// when it was read.
    pub fn row(&self, room_id: &str) -> Option<(i64, Instant, RoomRow)> {
        self.rows.lock().unwrap_or_else(PoisonError::into_inner).get(room_id).cloned()
    }

    /// Keeps a room's row read at stream position `at`.
    pub fn put_row(&self, at: i64, row: RoomRow) {
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        if rows.len() >= MAX_ROOMS {
            rows.clear();
        }
        rows.insert(row.room_id.clone(), (at, Instant::now(), row));
    }

    /// The member events of `users` in `room_id` kept for read epoch `epoch`
    /// and valid at seq `end` (see [`KeptMember`]); `None` for a user with
    /// nothing kept.
    pub fn members(&self, room_id: &str, epoch: i64, end: i64, users: &[&str]) -> Vec<Option<KeptMember>> {
        let members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        users
            .iter()
            .map(|user| {
                members
                    .get(&(room_id.to_owned(), (*user).to_owned()))
                    .filter(|k| k.epoch == epoch && k.at <= end)
                    .cloned()
            })
            .collect()
    }

    /// Keeps member events read at `at`, the head of read epoch `epoch`.
    pub fn put_members(&self, room_id: &str, epoch: i64, at: i64, read: Vec<(String, Option<StoredEvent>)>) {
        let mut members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        if members.len() + read.len() > MAX_MEMBERS {
            members.clear();
        }
        for (user, event) in read {
            members.insert((room_id.to_owned(), user), KeptMember { epoch, at, event });
        }
    }

    /// The room's inputs, if they were worked out at `epoch`.
    pub fn room(&self, room_id: &str, epoch: i64) -> Option<Arc<RoomInputs>> {
        let rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        rooms.get(room_id).filter(|r| r.epoch == epoch).cloned()
    }

    /// Keeps inputs worked out at `epoch` (unless newer ones are already kept).
    pub fn put_room(
        &self,
        room_id: &str,
        epoch: i64,
        hv: HvLine,
        max_lifetime: Option<i64>,
    ) -> Arc<RoomInputs> {
        let fresh = Arc::new(RoomInputs {
            epoch,
            hv,
            max_lifetime,
            power: OnceCell::new(),
            members: OnceCell::new(),
            servers: OnceCell::new(),
            acl: OnceCell::new(),
            state: OnceCell::new(),
            users: Mutex::default(),
        });
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = rooms.get(room_id)
            && kept.epoch >= epoch
        {
            return if kept.epoch == epoch { kept.clone() } else { fresh };
        }
        if rooms.len() >= MAX_ROOMS {
            rooms.clear();
        }
        rooms.insert(room_id.to_owned(), fresh.clone());
        fresh
    }
}

impl RoomInputs {
    /// A user's inputs, if kept.
    pub fn user(&self, user_id: &str) -> Option<Arc<UserInputs>> {
        self.users.lock().unwrap_or_else(PoisonError::into_inner).get(user_id).cloned()
    }

    /// Keeps a user's inputs.
    pub fn put_user(&self, user_id: &str, inputs: UserInputs) -> Arc<UserInputs> {
        let inputs = Arc::new(inputs);
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        if users.len() >= MAX_USERS_PER_ROOM {
            users.clear();
        }
        users.insert(user_id.to_owned(), inputs.clone());
        inputs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_serves_only_its_own_epoch() {
        let cache = ReadCache::default();
        assert!(cache.room("!r", 3).is_none());
        let kept = cache.put_room("!r", 3, HvLine::default(), Some(10));
        kept.put_user(
            "@a",
            UserInputs {
                history: MembershipHistory::default(),
                stays: Vec::new(),
                floor: 7,
                display_name: None,
            },
        );
        let again = cache.room("!r", 3).expect("kept");
        assert_eq!(again.max_lifetime, Some(10));
        assert_eq!(again.user("@a").map(|u| u.floor), Some(7));
        assert!(cache.room("!r", 4).is_none(), "a moved epoch never matches");
        // An older epoch arriving late does not replace the newer one.
        cache.put_room("!r", 5, HvLine::default(), None);
        cache.put_room("!r", 4, HvLine::default(), Some(1));
        assert!(cache.room("!r", 4).is_none());
        assert_eq!(cache.room("!r", 5).map(|r| r.max_lifetime), Some(None));
    }

    fn member(user: &str, seq: i64) -> StoredEvent {
        StoredEvent {
            room_id: "!r".into(),
            seq,
            event_id: format!("$join-{user}"),
            json: "{}".into(),
            redacted_by: None,
            txn_device_id: None,
            txn_id: None,
            has_children: None,
        }
    }

    /// A member event kept at a head serves reads of the same epoch at or
    /// above that head, "has none" included; another epoch, a seq below
    /// it, or a user never read find nothing kept.
    #[test]
    fn a_kept_member_serves_its_epoch_from_its_head_up() {
        let cache = ReadCache::default();
        cache.put_members("!r", 3, 100, vec![("@a".into(), Some(member("@a", 40))), ("@b".into(), None)]);
        let at = |epoch, end| {
            cache
                .members("!r", epoch, end, &["@a", "@b", "@c"])
                .into_iter()
                .map(|k| k.map(|k| k.event.map(|e| e.event_id)))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(3, 100), vec![Some(Some("$join-@a".into())), Some(None), None]);
        assert_eq!(at(3, 250), vec![Some(Some("$join-@a".into())), Some(None), None]);
        assert_eq!(at(3, 99), vec![None, None, None], "below the head it was read at");
        assert_eq!(at(4, 100), vec![None, None, None], "a moved epoch");
        assert!(cache.members("!other", 3, 100, &["@a"])[0].is_none());
    }
}
