//! The global stream position and the notifier that wakes long-polling
//! `/sync` requests.
//!
//! Positions are handed out before a write and finished after its commit (or
//! its failure). [`Streams::position`] is the highest position at or below
//! which every write has finished, so a `since` token built from it covers
//! every committed write at or below it, even when writers commit out of order.
//!
//! Every write a `/sync` reads takes its position here, so the allocator can
//! also say what kind of write each recent position was ([`Change`]): a
//! waiting sync that wakes asks [`Streams::changes_between`] what moved since
//! the answer it found empty, and reads again only those streams. A write
//! that does not say what it was counts as [`Change::Unknown`] (read
//! everything), and positions older than the log's window are unknown too.
//!
//! Waking is per user: a write names the users it concerns, and only their
//! waiting requests wake. A request subscribes before it reads the position,
//! so a write that lands in between still wakes it.
//!
//! A new event in a room wakes the waiting requests that watch the room:
//! each waiting `/sync` watches the rooms its user is joined to (registered,
//! like its subscription, before it reads the position). So a send finds
//! whom to wake in memory, among the requests waiting now, instead of asking
//! the database for every member of the room; a membership event also wakes
//! its target by name (they may not watch the room yet, or any more).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

#[derive(Debug, Default)]
struct Positions {
    next: i64,
    in_flight: BTreeSet<i64>,
    /// What the most recent finished positions were, by position.
    log: BTreeMap<i64, Change>,
    /// Positions at or below this one may have left the log.
    forgotten: i64,
}

impl Positions {
    /// See [`Streams::position`].
    fn position(&self) -> i64 {
        match self.in_flight.first() {
            Some(first) => first - 1,
            None => self.next - 1,
        }
    }
}

/// How many finished positions the change log keeps.
const LOG_SIZE: usize = 4096;

/// What a write at a stream position changed, as far as `/sync` cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An event in a room at `seq`: whether it is a state event, and the
    /// target of a membership event.
    Room { room: String, seq: i64, state: bool, member: Option<String> },
    /// A receipt in a room.
    Receipt { room: String },
    /// A user's account data.
    AccountData { user: String },
    /// A user's one-time or fallback keys (uploaded or claimed).
    Keys { user: String },
    /// To-device messages for these users.
    ToDevice { users: Vec<String> },
    /// A user's device list (devices or their keys).
    DeviceList { user: String },
    /// A user's presence.
    Presence,
    /// Anything (an invite from another server, or a write that did not
    /// say what it was).
    Unknown,
}

/// What moved in one room between two positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomMoved {
    /// The lowest and highest seq of the events there (none: only receipts).
    pub seqs: Option<(i64, i64)>,
    /// Some of them are state events.
    pub state: bool,
}

/// What moved between two positions, for one user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moved {
    /// Rooms with new events or receipts.
    pub rooms: BTreeMap<String, RoomMoved>,
    /// The user's own memberships changed (their room list may differ).
    pub my_membership: bool,
    /// Someone's membership changed in some room.
    pub any_membership: bool,
    /// The user's account data.
    pub account_data: bool,
    /// The user's to-device messages or key counts.
    pub device: bool,
    /// Someone's device list.
    pub device_lists: bool,
}

impl Moved {
    /// Whether a read of whose device lists changed, and who newly shares
    /// or no longer shares a room with the user, still stands: it moves
    /// with device lists and with anyone's membership.
    pub fn keeps_device_list_movement(&self) -> bool {
        !self.device_lists && !self.any_membership
    }
}

/// The stream position allocator.
#[derive(Debug, Default)]
pub struct Streams {
    positions: Mutex<Positions>,
    /// [`Streams::position`], sent as it moves: a request that a wake-up
    /// found ahead of the position waits on it (see [`Streams::held_back`]).
    advanced: watch::Sender<i64>,
}

/// A reserved position; finishing it (or dropping it) lets the stream
/// position move past it. Finish it with [`Reservation::finish`] to say what
/// the write changed; dropped unfinished, it counts as [`Change::Unknown`].
#[derive(Debug)]
pub struct Reservation {
    streams: Arc<Streams>,
    /// The position.
    pub pos: i64,
    change: Option<Change>,
}

impl Reservation {
    /// Ends the write (committed or failed): `change` says what it was.
    pub fn finish(mut self, change: Change) {
        self.change = Some(change);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let change = self.change.take().unwrap_or(Change::Unknown);
        let mut p = self.streams.positions.lock().unwrap_or_else(|e| e.into_inner());
        p.in_flight.remove(&self.pos);
        p.log.insert(self.pos, change);
        while p.log.len() > LOG_SIZE {
            if let Some((pos, _)) = p.log.pop_first() {
                p.forgotten = p.forgotten.max(pos);
            }
        }
        let position = p.position();
        drop(p);
        self.streams.advanced.send_if_modified(|at| std::mem::replace(at, position) != position);
    }
}

impl Streams {
    /// Starts after `last`, the highest position already stored.
    pub fn starting_after(last: i64) -> Arc<Self> {
        Arc::new(Self {
            positions: Mutex::new(Positions {
                next: last + 1,
                in_flight: BTreeSet::new(),
                log: BTreeMap::new(),
                forgotten: last,
            }),
            advanced: watch::channel(last).0,
        })
    }

    /// Reserves the next position.
    pub fn reserve(self: &Arc<Self>) -> Reservation {
        let mut p = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        let pos = p.next;
        p.next += 1;
        p.in_flight.insert(pos);
        Reservation { streams: self.clone(), pos, change: None }
    }

    /// Every write at or below this position has finished.
    pub fn position(&self) -> i64 {
        self.positions.lock().unwrap_or_else(|e| e.into_inner()).position()
    }

    /// Whether a write beyond `at` has finished though the position has not
    /// reached it (an earlier write is still in flight): its wake-up may
    /// already have been spent on a pass that could not see it, so a
    /// request that read at `at` waits for the position as well
    /// ([`Streams::watch_position`]).
    pub fn held_back(&self, at: i64) -> bool {
        let p = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        let position = p.position();
        p.log.range(at + 1..).next().is_some_and(|(pos, _)| *pos > position)
    }

    /// The position as it moves.
    pub fn watch_position(&self) -> watch::Receiver<i64> {
        self.advanced.subscribe()
    }

    /// Whether a state event of `room`, or a write the log cannot place,
    /// landed in `(after, upto]` (a position every write at or below has
    /// finished); `None` when the log no longer reaches back to `after`.
    pub fn state_moved_between(&self, room: &str, after: i64, upto: i64) -> Option<bool> {
        let p = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        if after < p.forgotten {
            return None;
        }
        if upto <= after {
            return Some(false);
        }
        Some(p.log.range(after + 1..=upto).any(|(_, change)| match change {
            Change::Room { room: r, state, .. } => *state && r == room,
            Change::Unknown => true,
            _ => false,
        }))
    }

    /// What the writes after `after` up to `upto` (a position every write at
    /// or below has finished) changed for `user`; `None` when the log no
    /// longer reaches back to `after` or a write there is unknown.
    pub fn changes_between(&self, user: &str, after: i64, upto: i64) -> Option<Moved> {
        let p = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        if after < p.forgotten {
            return None;
        }
        let mut moved = Moved::default();
        if upto <= after {
            return Some(moved);
        }
        for (_, change) in p.log.range(after + 1..=upto) {
            match change {
                Change::Room { room, seq, state, member } => {
                    let entry = moved.rooms.entry(room.clone()).or_default();
                    entry.seqs =
                        Some(entry.seqs.map_or((*seq, *seq), |(lo, hi)| (lo.min(*seq), hi.max(*seq))));
                    entry.state |= *state;
                    moved.any_membership |= member.is_some();
                    moved.my_membership |= member.as_deref() == Some(user);
                }
                Change::Receipt { room } => {
                    moved.rooms.entry(room.clone()).or_default();
                }
                Change::AccountData { user: u } => moved.account_data |= u == user,
                Change::Keys { user: u } => moved.device |= u == user,
                Change::ToDevice { users } => moved.device |= users.iter().any(|u| u == user),
                Change::DeviceList { .. } => moved.device_lists = true,
                Change::Presence => {}
                Change::Unknown => return None,
            }
        }
        Some(moved)
    }
}

/// Per-user wake-ups for long-polling requests.
#[derive(Debug, Default)]
pub struct Notifier {
    users: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Requests waiting for a wake-up now.
    waiting: AtomicUsize,
    /// Per room, the users with a waiting request watching it (and how many).
    rooms: Mutex<HashMap<String, HashMap<String, usize>>>,
}

/// A request's watch on rooms; dropping it ends the watch.
#[derive(Debug)]
pub struct RoomWatch<'a> {
    notifier: &'a Notifier,
    user: String,
    rooms: Vec<String>,
}

/// A request counted as waiting (see [`Notifier::waiting`]).
#[derive(Debug)]
pub struct Waiting<'a> {
    notifier: &'a Notifier,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.notifier.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for RoomWatch<'_> {
    fn drop(&mut self) {
        let mut rooms = self.notifier.rooms.lock().unwrap_or_else(|e| e.into_inner());
        for room in &self.rooms {
            if let Some(users) = rooms.get_mut(room) {
                if let Some(n) = users.get_mut(&self.user) {
                    *n -= 1;
                    if *n == 0 {
                        users.remove(&self.user);
                    }
                }
                if users.is_empty() {
                    rooms.remove(room);
                }
            }
        }
    }
}

impl Notifier {
    /// Subscribes to `user`'s wake-ups. Subscribe before reading the stream
    /// position, then wait on the receiver.
    pub fn subscribe(&self, user: &str) -> watch::Receiver<u64> {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.entry(user.to_owned()).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Watches `rooms` for `user` until the returned guard is dropped: a new
    /// event in one of them wakes the user's subscriptions. Register before
    /// reading the position, like [`Notifier::subscribe`].
    pub fn watch_rooms(&self, user: &str, rooms: Vec<String>) -> RoomWatch<'_> {
        let mut map = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        for room in &rooms {
            *map.entry(room.clone()).or_default().entry(user.to_owned()).or_default() += 1;
        }
        RoomWatch { notifier: self, user: user.to_owned(), rooms }
    }

    /// Counts a request as waiting until the guard is dropped.
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting { notifier: self }
    }

    /// How many requests are waiting for a wake-up now.
    pub fn waiting_now(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Wakes the requests watching `room` and those of `also`.
    pub fn wake_room<'a>(&self, room: &str, also: impl IntoIterator<Item = &'a str>) {
        let watching: Vec<String> = {
            let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
            rooms.get(room).map(|users| users.keys().cloned().collect()).unwrap_or_default()
        };
        self.wake(watching.iter().map(String::as_str));
        self.wake(also);
    }

    /// Wakes the waiting requests of these users.
    pub fn wake<'a>(&self, users: impl IntoIterator<Item = &'a str>) {
        let mut map = self.users.lock().unwrap_or_else(|e| e.into_inner());
        for user in users {
            if let Some(tx) = map.get(user) {
                if tx.receiver_count() == 0 {
                    map.remove(user);
                } else {
                    tx.send_modify(|n| *n += 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_waits_for_the_lowest_unfinished_write() {
        let streams = Streams::starting_after(10);
        assert_eq!(streams.position(), 10);
        let a = streams.reserve();
        let b = streams.reserve();
        assert_eq!((a.pos, b.pos), (11, 12));
        assert_eq!(streams.position(), 10);
        drop(b); // 12 commits first
        assert_eq!(streams.position(), 10, "11 is still in flight");
        drop(a);
        assert_eq!(streams.position(), 12);
    }

    /// A write that finishes behind one still in flight is held back: the
    /// position does not reach it, and reaching it is announced.
    #[test]
    fn a_write_finished_behind_one_in_flight_is_held_back_until_the_position_moves() {
        let streams = Streams::starting_after(10);
        let mut position = streams.watch_position();
        let a = streams.reserve();
        let b = streams.reserve();
        assert!(!streams.held_back(10));
        drop(b); // 12 finishes first: its wake-up finds the position at 10
        assert!(streams.held_back(10), "12 is finished but not readable");
        assert!(!position.has_changed().unwrap(), "the position has not moved");
        drop(a);
        assert!(position.has_changed().unwrap());
        assert_eq!(*position.borrow_and_update(), 12);
        assert!(!streams.held_back(10), "everything finished is readable");
        assert!(!streams.held_back(12));
    }

    #[test]
    fn a_rooms_state_moves_with_its_state_events_and_unknown_writes() {
        let streams = Streams::starting_after(10);
        let room = |room: &str, state: bool| Change::Room { room: room.into(), seq: 1, state, member: None };
        for change in [room("!a:x", false), room("!b:x", true), Change::Receipt { room: "!a:x".into() }] {
            streams.reserve().finish(change);
        }
        assert_eq!(streams.state_moved_between("!a:x", 10, 13), Some(false), "a message and a receipt");
        assert_eq!(streams.state_moved_between("!b:x", 10, 13), Some(true));
        assert_eq!(streams.state_moved_between("!b:x", 12, 13), Some(false), "before the window");
        streams.reserve().finish(room("!a:x", true));
        assert_eq!(streams.state_moved_between("!a:x", 13, 14), Some(true));
        streams.reserve().finish(Change::Unknown);
        assert_eq!(streams.state_moved_between("!c:x", 14, 15), Some(true), "a write the log cannot place");
        assert_eq!(streams.state_moved_between("!c:x", 15, 15), Some(false));
    }

    #[test]
    fn the_log_says_what_moved_for_whom() {
        let streams = Streams::starting_after(10);
        assert_eq!(streams.changes_between("@a:x", 9, 10), None, "before the log began");
        assert_eq!(streams.changes_between("@a:x", 10, 10), Some(Moved::default()));
        let room = |room: &str, seq: i64, member: Option<&str>| Change::Room {
            room: room.into(),
            seq,
            state: member.is_some(),
            member: member.map(str::to_owned),
        };
        streams.reserve().finish(room("!r:x", 100, None));
        streams.reserve().finish(Change::AccountData { user: "@b:x".into() });
        streams.reserve().finish(Change::ToDevice { users: vec!["@a:x".into()] });
        streams.reserve().finish(Change::Receipt { room: "!s:x".into() });
        let moved = streams.changes_between("@a:x", 10, 14).unwrap();
        assert_eq!(moved.rooms.keys().collect::<Vec<_>>(), ["!r:x", "!s:x"]);
        assert_eq!(moved.rooms["!r:x"], RoomMoved { seqs: Some((100, 100)), state: false });
        assert_eq!(moved.rooms["!s:x"], RoomMoved { seqs: None, state: false }, "a receipt alone");
        assert!(moved.device && !moved.account_data && !moved.my_membership && !moved.any_membership);
        let moved = streams.changes_between("@b:x", 11, 14).unwrap();
        assert!(moved.account_data && !moved.device, "{moved:?}");
        assert_eq!(streams.changes_between("@b:x", 12, 14).unwrap().rooms.len(), 1, "only after 12");

        streams.reserve().finish(room("!r:x", 200, Some("@a:x")));
        let moved = streams.changes_between("@b:x", 14, 15).unwrap();
        assert!(moved.any_membership && !moved.my_membership);
        assert_eq!(moved.rooms["!r:x"], RoomMoved { seqs: Some((200, 200)), state: true });
        let moved = streams.changes_between("@b:x", 10, 15).unwrap();
        assert_eq!(moved.rooms["!r:x"].seqs, Some((100, 200)), "the seqs of the window");
        assert!(streams.changes_between("@a:x", 14, 15).unwrap().my_membership);

        // A write that did not say what it was: nothing can be skipped.
        drop(streams.reserve());
        assert_eq!(streams.changes_between("@a:x", 14, 16), None);
        assert!(streams.changes_between("@a:x", 16, 16).is_some());

        // Old positions leave the log.
        for _ in 0..LOG_SIZE {
            streams.reserve().finish(Change::Presence);
        }
        assert_eq!(streams.changes_between("@a:x", 15, streams.position()), None);
        assert!(streams.changes_between("@a:x", 16, streams.position()).is_some());
    }

    #[tokio::test]
    async fn wakes_only_the_named_users() {
        let n = Notifier::default();
        let mut alice = n.subscribe("@alice:x");
        let mut bob = n.subscribe("@bob:x");
        n.wake(["@alice:x"]);
        assert!(alice.has_changed().unwrap());
        assert!(!bob.has_changed().unwrap());
        alice.borrow_and_update();
        n.wake(["@bob:x", "@carol:x"]);
        assert!(bob.has_changed().unwrap());
        assert!(!alice.has_changed().unwrap());
        bob.changed().await.unwrap();
    }

    #[test]
    fn a_room_wakes_its_watchers_while_they_watch() {
        let n = Notifier::default();
        let mut alice = n.subscribe("@alice:x");
        let bob = n.subscribe("@bob:x");
        let mut carol = n.subscribe("@carol:x");
        let watch_a = n.watch_rooms("@alice:x", vec!["!r:x".into(), "!s:x".into()]);
        let _watch_b = n.watch_rooms("@bob:x", vec!["!s:x".into()]);
        n.wake_room("!r:x", ["@carol:x"]);
        assert!(alice.has_changed().unwrap());
        assert!(!bob.has_changed().unwrap(), "bob does not watch !r");
        assert!(carol.has_changed().unwrap(), "named as well");
        alice.borrow_and_update();
        carol.borrow_and_update();
        drop(watch_a);
        n.wake_room("!r:x", []);
        assert!(!alice.has_changed().unwrap(), "alice's watch ended");
        n.wake_room("!s:x", []);
        assert!(bob.has_changed().unwrap());
        assert!(!alice.has_changed().unwrap());
        assert!(n.rooms.lock().unwrap().get("!r:x").is_none(), "an unwatched room is forgotten");
    }
}
