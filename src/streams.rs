//! The global stream position and the notifier that wakes long-polling
//! `/sync` requests.
//!
//! Positions are handed out before a write and finished after its commit (or
//! its failure). [`Streams::position`] is the highest position at or below
//! which every write has finished, so a `since` token built from it covers
//! every committed write at or below it, even when writers commit out of order.
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

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

#[derive(Debug, Default)]
struct Positions {
    next: i64,
    in_flight: BTreeSet<i64>,
}

/// The stream position allocator.
#[derive(Debug, Default)]
pub struct Streams {
    positions: Mutex<Positions>,
}

/// A reserved position; finishing it (or dropping it) lets the stream
/// position move past it.
#[derive(Debug)]
pub struct Reservation {
    streams: Arc<Streams>,
    /// The position.
    pub pos: i64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut p = self.streams.positions.lock().unwrap_or_else(|e| e.into_inner());
        p.in_flight.remove(&self.pos);
    }
}

impl Streams {
    /// Starts after `last`, the highest position already stored.
    pub fn starting_after(last: i64) -> Arc<Self> {
        Arc::new(Self { positions: Mutex::new(Positions { next: last + 1, in_flight: BTreeSet::new() }) })
    }

    /// Reserves the next position.
    pub fn reserve(self: &Arc<Self>) -> Reservation {
        let mut p = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        let pos = p.next;
        p.next += 1;
        p.in_flight.insert(pos);
        Reservation { streams: self.clone(), pos }
    }

    /// Every write at or below this position has finished.
    pub fn position(&self) -> i64 {
        let p = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        match p.in_flight.first() {
            Some(first) => first - 1,
            None => p.next - 1,
        }
    }
}

/// Per-user wake-ups for long-polling requests.
#[derive(Debug, Default)]
pub struct Notifier {
    users: Mutex<HashMap<String, watch::Sender<u64>>>,
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
