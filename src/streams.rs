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
}

impl Notifier {
    /// Subscribes to `user`'s wake-ups. Subscribe before reading the stream
    /// position, then wait on the receiver.
    pub fn subscribe(&self, user: &str) -> watch::Receiver<u64> {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.entry(user.to_owned()).or_insert_with(|| watch::channel(0).0).subscribe()
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
}
