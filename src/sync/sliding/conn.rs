//! Sliding sync connections: what each connection's client holds, kept per
//! position (`../shared/SLIDING-SYNC.md` §A.7).
//!
//! A connection is named by (user, device, `conn_id`). Each answer gets a
//! new position, `<epoch>_<n>`, under which the server keeps what the
//! client holds once it has that answer (a [`Snapshot`]). A request names
//! the position it builds on; the snapshot there is read, never changed,
//! so a request retried or cancelled and sent again with the same `pos`
//! gets the same answer. When a request names position `n`, the positions
//! older than `n` are dropped (the client has moved past them). The epoch
//! is drawn when the process starts: after a restart every `pos` is
//! unknown (400 `M_UNKNOWN_POS`) and the client starts again, never given
//! a wrong delta. Kept in memory, bounded: at most [`MAX_POSITIONS`] per
//! connection, [`MAX_CONNECTIONS_PER_DEVICE`] per device (the least
//! recently used goes), and a connection unused for [`EXPIRY`] is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::request::RoomConfig;
use crate::error::{Error, Result};

/// Most positions kept per connection (retries of one `pos` each add one).
pub const MAX_POSITIONS: usize = 8;
/// Most connections kept per device.
pub const MAX_CONNECTIONS_PER_DEVICE: usize = 10;
/// A connection unused this long is dropped.
pub const EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

/// How far a room was sent on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Everything up to the snapshot's stream position.
    Live,
    /// Everything up to this stream position (the room fell out of every
    /// range with news the client did not get).
    Until(i64),
}

/// What the client of a connection holds about one room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomSent {
    pub sent: Sent,
    /// The config it was last sent with (a wider one sends more at once).
    pub config: Arc<RoomConfig>,
}

/// What a connection's client holds once it has an answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The global stream position the answer was built at.
    pub stream: i64,
    /// The typing serial then.
    pub typing: u64,
    /// The rooms sent, by id: shared with the snapshot it was built from
    /// when a pass changed nothing of it (a woken pass in a thousand rooms
    /// copies none of them).
    pub rooms: Arc<foldhash::HashMap<String, RoomSent>>,
}

struct Connection {
    /// (n, snapshot), oldest first.
    positions: Vec<(u64, Arc<Snapshot>)>,
    last_used: Instant,
}

/// (user, device, conn_id).
type Key = (String, String, String);

/// Every connection of every device.
pub struct Connections {
    epoch: String,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    connections: HashMap<Key, Connection>,
    /// Each user's room list as last read, with the stream position it was
    /// read at: the next request reads again only what moved since.
    room_lists: HashMap<String, (i64, RoomList)>,
}

/// A user's room list, shared: a room read again replaces its entry in a
/// copy of the list of pointers, never a copy of every room.
pub type RoomList = Arc<Vec<Arc<crate::storage::sliding::ListedRoom>>>;

/// Users whose room lists are kept at most (then all are dropped at once).
const MAX_ROOM_LISTS: usize = 10_000;

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections").field("connections", &self.len()).finish()
    }
}

impl Default for Connections {
    fn default() -> Self {
        Self::new()
    }
}

fn unknown(pos: &str) -> Error {
    Error::UnknownPos(format!("Unknown position {pos:?}: start the connection again"))
}

impl Connections {
    /// An empty store with a fresh epoch.
    pub fn new() -> Self {
        Self { epoch: format!("{:08x}", rand::random::<u32>()), inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the connection's client holds at `pos`; `None` (no `pos`): a
    /// new connection, which replaces any of the same name. An unknown
    /// `pos` is 400 `M_UNKNOWN_POS`.
    pub fn load(
        &self,
        user: &str,
        device: &str,
        conn_id: &str,
        pos: Option<&str>,
    ) -> Result<Option<Arc<Snapshot>>> {
        let key = (user.to_owned(), device.to_owned(), conn_id.to_owned());
        let mut inner = self.lock();
        let Some(pos) = pos else {
            inner.connections.remove(&key);
            return Ok(None);
        };
        let n = pos
            .split_once('_')
            .filter(|(epoch, _)| *epoch == self.epoch)
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .ok_or_else(|| unknown(pos))?;
        let connection = inner.connections.get_mut(&key).ok_or_else(|| unknown(pos))?;
        let at = connection.positions.iter().position(|(m, _)| *m == n).ok_or_else(|| unknown(pos))?;
        connection.positions.drain(..at);
        connection.last_used = Instant::now();
        Ok(Some(connection.positions[0].1.clone()))
    }

    /// Keeps `snapshot` as what the connection's client holds once it has
    /// the answer being sent; answers that answer's `pos`.
    pub fn store(&self, user: &str, device: &str, conn_id: &str, snapshot: Snapshot) -> String {
        let key = (user.to_owned(), device.to_owned(), conn_id.to_owned());
        let now = Instant::now();
        let mut inner = self.lock();
        inner.next += 1;
        let n = inner.next;
        inner.connections.retain(|_, c| now.duration_since(c.last_used) < EXPIRY);
        if !inner.connections.contains_key(&key) {
            let mut same_device: Vec<(Key, Instant)> = inner
                .connections
                .iter()
                .filter(|((u, d, _), _)| u == user && d == device)
                .map(|(k, c)| (k.clone(), c.last_used))
                .collect();
            if same_device.len() >= MAX_CONNECTIONS_PER_DEVICE {
                same_device.sort_by_key(|(_, used)| *used);
                for (old, _) in same_device.iter().take(same_device.len() + 1 - MAX_CONNECTIONS_PER_DEVICE) {
                    inner.connections.remove(old);
                }
            }
        }
        let connection = inner
            .connections
            .entry(key)
            .or_insert_with(|| Connection { positions: Vec::new(), last_used: now });
        connection.last_used = now;
        connection.positions.push((n, Arc::new(snapshot)));
        if connection.positions.len() > MAX_POSITIONS {
            // Keep the one requests build on (the oldest) and the newest.
            let excess = connection.positions.len() - MAX_POSITIONS;
            connection.positions.drain(1..=excess);
        }
        format!("{}_{n}", self.epoch)
    }

    /// `user`'s room list as last read, and the position it was read at.
    pub fn room_list(&self, user: &str) -> Option<(i64, RoomList)> {
        self.lock().room_lists.get(user).cloned()
    }

    /// Keeps `user`'s room list read at stream position `at` (unless a
    /// newer one is kept).
    pub fn keep_room_list(&self, user: &str, at: i64, rooms: RoomList) {
        let mut inner = self.lock();
        if inner.room_lists.get(user).is_some_and(|(kept, _)| *kept > at) {
            return;
        }
        if inner.room_lists.len() >= MAX_ROOM_LISTS {
            inner.room_lists.clear();
        }
        inner.room_lists.insert(user.to_owned(), (at, rooms));
    }

    /// Drops `user`'s kept room list (it changed in a way no stream
    /// position tells: a room forgotten).
    pub fn drop_room_list(&self, user: &str) {
        self.lock().room_lists.remove(user);
    }

    /// Forgets every connection of a device (logged out or deleted).
    pub fn forget_device(&self, user: &str, device: &str) {
        self.lock().connections.retain(|(u, d, _), _| !(u == user && d == device));
    }

    /// How many connections are kept (for bounds and tests).
    pub fn len(&self) -> usize {
        self.lock().connections.len()
    }

    /// No connection is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(stream: i64) -> Snapshot {
        Snapshot { stream, ..Snapshot::default() }
    }

    #[test]
    fn a_position_answers_the_same_until_the_client_moves_past_it() {
        let conns = Connections::new();
        assert_eq!(conns.load("@a:x", "D", "c", None).unwrap(), None);
        let p1 = conns.store("@a:x", "D", "c", at(1));
        // Retried twice: the same snapshot, two answers.
        assert_eq!(conns.load("@a:x", "D", "c", Some(&p1)).unwrap().unwrap().stream, 1);
        let p2 = conns.store("@a:x", "D", "c", at(2));
        assert_eq!(conns.load("@a:x", "D", "c", Some(&p1)).unwrap().unwrap().stream, 1);
        let p3 = conns.store("@a:x", "D", "c", at(3));
        // The client took the second answer: the first position goes.
        assert_eq!(conns.load("@a:x", "D", "c", Some(&p3)).unwrap().unwrap().stream, 3);
        assert!(matches!(conns.load("@a:x", "D", "c", Some(&p1)), Err(Error::UnknownPos(_))));
        assert!(matches!(conns.load("@a:x", "D", "c", Some(&p2)), Err(Error::UnknownPos(_))));
    }

    #[test]
    fn positions_of_others_of_another_epoch_or_forged_are_unknown() {
        let conns = Connections::new();
        let p = conns.store("@a:x", "D", "c", at(1));
        for (user, device, conn) in [("@b:x", "D", "c"), ("@a:x", "E", "c"), ("@a:x", "D", "other")] {
            assert!(matches!(conns.load(user, device, conn, Some(&p)), Err(Error::UnknownPos(_))));
        }
        let restarted = Connections::new();
        assert!(matches!(restarted.load("@a:x", "D", "c", Some(&p)), Err(Error::UnknownPos(_))));
        for forged in ["", "_", "x_1", "1", &format!("{p}0"), &p.replace('_', "_-")] {
            assert!(
                matches!(conns.load("@a:x", "D", "c", Some(forged)), Err(Error::UnknownPos(_))),
                "{forged}"
            );
        }
        // No pos: the connection starts again and the old position is gone.
        assert_eq!(conns.load("@a:x", "D", "c", None).unwrap(), None);
        assert!(matches!(conns.load("@a:x", "D", "c", Some(&p)), Err(Error::UnknownPos(_))));
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let conns = Connections::new();
        let first = conns.store("@a:x", "D", "c", at(0));
        for i in 1..50 {
            conns.store("@a:x", "D", "c", at(i));
        }
        // The position requests build on stays; the middle ones went.
        assert_eq!(conns.load("@a:x", "D", "c", Some(&first)).unwrap().unwrap().stream, 0);
        for i in 0..(MAX_CONNECTIONS_PER_DEVICE + 5) {
            conns.store("@a:x", "D", &format!("c{i}"), at(0));
        }
        conns.store("@a:x", "E", "c", at(0));
        assert_eq!(conns.len(), MAX_CONNECTIONS_PER_DEVICE + 1);
        conns.forget_device("@a:x", "D");
        assert_eq!(conns.len(), 1);
    }
}
