//! Typing notifications: in memory, per room, with a serial that moves on
//! every change (a start, a stop, an expiry) so `/sync` can tell what changed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Inner {
    serial: u64,
    /// room -> user -> until when
    rooms: HashMap<String, HashMap<String, Instant>>,
    /// room -> serial of its last change
    changed: HashMap<String, u64>,
}

/// Who is typing where.
#[derive(Debug, Default)]
pub struct Typing {
    inner: Mutex<Inner>,
}

/// The longest typing timeout honoured.
const MAX_TIMEOUT: Duration = Duration::from_secs(120);

impl Typing {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts or stops `user` typing in `room`; true if that changed anything.
    pub fn set(&self, room: &str, user: &str, typing: Option<Duration>) -> bool {
        let mut inner = self.lock();
        let changed = match typing {
            Some(timeout) => {
                let until = Instant::now() + timeout.min(MAX_TIMEOUT);
                inner.rooms.entry(room.to_owned()).or_default().insert(user.to_owned(), until).is_none()
            }
            None => inner.rooms.get_mut(room).is_some_and(|users| users.remove(user).is_some()),
        };
        if changed {
            inner.serial += 1;
            let serial = inner.serial;
            inner.changed.insert(room.to_owned(), serial);
        }
        changed
    }

    /// Drops expired entries; returns the rooms that changed.
    pub fn expire(&self) -> Vec<String> {
        let now = Instant::now();
        let mut inner = self.lock();
        let mut changed = Vec::new();
        for (room, users) in inner.rooms.iter_mut() {
            let before = users.len();
            users.retain(|_, until| *until > now);
            if users.len() != before {
                changed.push(room.clone());
            }
        }
        inner.rooms.retain(|_, users| !users.is_empty());
        for room in &changed {
            inner.serial += 1;
            let serial = inner.serial;
            inner.changed.insert(room.clone(), serial);
        }
        changed
    }

    /// The current serial.
    pub fn serial(&self) -> u64 {
        self.lock().serial
    }

    /// The rooms whose typing users changed last in `(since, upto]` (those
    /// [`Self::changed_since`] answers for with `Some(since)`); `None` when
    /// more than `at_most` rooms ever had anyone typing (asking room by room
    /// is then the cheaper way).
    pub fn rooms_changed(&self, since: u64, upto: u64, at_most: usize) -> Option<Vec<String>> {
        let inner = self.lock();
        (inner.changed.len() <= at_most).then(|| {
            inner
                .changed
                .iter()
                .filter(|(_, last)| **last > since && **last <= upto)
                .map(|(room, _)| room.clone())
                .collect()
        })
    }

    /// The users typing in `room` if that changed in `(since, upto]`
    /// (`since` `None`: an initial sync, which hears of anyone typing). A change
    /// after `upto` (the serial in the token being handed out) waits for the
    /// next sync, so no token ever covers less than the body it came with.
    pub fn changed_since(&self, room: &str, since: Option<u64>, upto: u64) -> Option<Vec<String>> {
        let inner = self.lock();
        let last = inner.changed.get(room).copied().unwrap_or(0);
        if last > upto {
            return None;
        }
        match since {
            Some(since) if last <= since => return None,
            None if inner.rooms.get(room).is_none_or(|u| u.is_empty()) => return None,
            _ => {}
        }
        let mut users: Vec<String> =
            inner.rooms.get(room).map(|u| u.keys().cloned().collect()).unwrap_or_default();
        users.sort();
        Some(users)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_move_the_serial() {
        let t = Typing::default();
        assert!(t.set("!r", "@a", Some(Duration::from_secs(30))));
        let s1 = t.serial();
        assert!(!t.set("!r", "@a", Some(Duration::from_secs(30))), "still typing: no change");
        assert_eq!(t.changed_since("!r", None, s1), Some(vec!["@a".to_owned()]));
        assert_eq!(t.changed_since("!r", Some(0), s1), Some(vec!["@a".to_owned()]));
        assert_eq!(t.changed_since("!r", Some(0), 0), None, "a change after the token waits");
        assert_eq!(t.changed_since("!r", Some(s1), s1), None);
        assert_eq!(t.rooms_changed(0, s1, 10), Some(vec!["!r".to_owned()]));
        assert_eq!(t.rooms_changed(s1, s1, 10), Some(vec![]));
        assert_eq!(t.rooms_changed(0, 0, 10), Some(vec![]), "a change after the token waits");
        assert_eq!(t.rooms_changed(0, s1, 0), None, "more rooms than asked for");
        assert!(t.set("!r", "@a", None));
        assert_eq!(t.changed_since("!r", Some(s1), t.serial()), Some(vec![]));
        assert_eq!(
            t.changed_since("!r", None, t.serial()),
            None,
            "nobody typing: nothing to tell a new client"
        );
        assert!(t.set("!r", "@b", Some(Duration::ZERO)));
        assert_eq!(t.expire(), vec!["!r".to_owned()]);
    }
}
