//! What a user may read, as interval arithmetic on the room's seq line.
//!
//! Inputs: the user's membership ranges (one per stay, one per invite), the
//! room's `m.room.history_visibility` over the seq line, whether the user is
//! joined now, and the floors (the room's, the user's own, retention). Output:
//! a sorted set of disjoint, inclusive seq ranges. Every read path (event,
//! context, messages, state, members, sync, push, backfill) asks this one
//! function, so no path can see more than another.
//!
//! The rule is the spec's (client-server API, "History visibility"), decided per
//! event by the visibility in force when it was sent:
//! - `world_readable`: everyone;
//! - `shared`: anyone who joined at any point after the event was sent (so all
//!   of it for those joined now, and up to their last join for those who left),
//!   and anyone whose membership at the event was join;
//! - `invited`: membership at the event was invite or join (the spec's rule for
//!   invitees names `invited` only);
//! - `joined`: membership at the event was join.
//!
//! An `m.room.history_visibility` event itself counts with the more permissive
//! of the settings before and after it. A user's own membership event counts
//! with the "more joined" of their membership before and after it: a stay is
//! its join event through the event that ended it (so the leaver sees their own
//! leave, kick or ban), an invite likewise. Beyond the spec, a stay may start
//! earlier through the pre-join window (`window_seq`, fixed at join time).

use crate::storage::memberships::Range;

/// `m.room.history_visibility` values, from least to most permissive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hv {
    /// Only while joined.
    Joined,
    /// From the invite on.
    Invited,
    /// All history before one's (latest) join.
    Shared,
    /// Everyone, members or not.
    WorldReadable,
}

impl Hv {
    /// Parses a content value. An unknown or malformed value counts as the
    /// least permissive, `joined` (a missing event means `shared`: see
    /// [`HvLine::segments`]).
    pub fn parse(value: &str) -> Self {
        match value {
            "world_readable" => Self::WorldReadable,
            "shared" => Self::Shared,
            "invited" => Self::Invited,
            _ => Self::Joined,
        }
    }
}

/// The room's history visibility along its seq line.
#[derive(Debug, Clone, Default)]
pub struct HvLine {
    /// (seq of an `m.room.history_visibility` event, the value it sets), in order.
    pub changes: Vec<(i64, Hv)>,
}

impl HvLine {
    /// Piecewise-constant segments `(lo, hi, value)` covering every position up
    /// to `last_seq` (from [`super::position::LOWEST`]).
    /// Before any history-visibility event the value is `shared`.
    pub fn segments(&self, last_seq: i64) -> Vec<(i64, i64, Hv)> {
        let mut out = Vec::new();
        let mut value = Hv::Shared;
        let mut start = super::position::LOWEST;
        for &(seq, next) in &self.changes {
            if seq > last_seq {
                break;
            }
            if start < seq {
                out.push((start, seq - 1, value));
            }
            out.push((seq, seq, value.max(next)));
            value = next;
            start = seq + 1;
        }
        if start <= last_seq {
            out.push((start, last_seq, value));
        }
        out
    }
}

/// Sorted, disjoint, inclusive seq ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqRanges(pub Vec<(i64, i64)>);

impl SeqRanges {
    /// Merges arbitrary (possibly overlapping or adjacent) ranges.
    pub fn from_unsorted(mut parts: Vec<(i64, i64)>) -> Self {
        parts.retain(|(lo, hi)| lo <= hi);
        parts.sort_unstable();
        let mut out: Vec<(i64, i64)> = Vec::with_capacity(parts.len());
        for (lo, hi) in parts {
            match out.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => out.push((lo, hi)),
            }
        }
        Self(out)
    }

    /// Keeps only `lo..=hi`.
    pub fn clamp(&self, lo: i64, hi: i64) -> Self {
        Self(self.0.iter().map(|&(a, b)| (a.max(lo), b.min(hi))).filter(|(a, b)| a <= b).collect())
    }

    /// Whether `seq` is readable.
    pub fn contains(&self, seq: i64) -> bool {
        let i = self.0.partition_point(|&(_, hi)| hi < seq);
        self.0.get(i).is_some_and(|&(lo, _)| lo <= seq)
    }

    /// The lowest readable seq.
    pub fn first(&self) -> Option<i64> {
        self.0.first().map(|r| r.0)
    }

    /// The highest readable seq.
    pub fn last(&self) -> Option<i64> {
        self.0.last().map(|r| r.1)
    }

    /// How many positions the ranges span. Positions are sparse, so this is
    /// no count of events (ask the events table for that): only tests use it.
    #[cfg(test)]
    pub fn positions(&self) -> i64 {
        self.0.iter().fold(0i64, |n, (lo, hi)| n.saturating_add(hi.saturating_sub(*lo).saturating_add(1)))
    }

    /// True when nothing is readable.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ranges at or below `seq`, highest first, each cut at `seq`.
    pub fn descending_from(&self, seq: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.0.iter().rev().filter(move |r| r.0 <= seq).map(move |&(lo, hi)| (lo, hi.min(seq)))
    }

    /// The ranges at or above `seq`, lowest first, each cut at `seq`.
    pub fn ascending_from(&self, seq: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.0.iter().filter(move |r| r.1 >= seq).map(move |&(lo, hi)| (lo.max(seq), hi))
    }
}

/// Everything the rule needs about one user in one room.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The user's membership ranges.
    pub ranges: &'a [Range],
    /// The room's history visibility.
    pub hv: &'a HvLine,
    /// The room's newest seq.
    pub last_seq: i64,
    /// Nothing below this seq is readable (room floor, user floor, retention).
    pub floor: i64,
}

/// The seqs the user may read.
pub fn visible(inputs: &Inputs<'_>) -> SeqRanges {
    let segments = inputs.hv.segments(inputs.last_seq);
    let mut parts = Vec::new();
    for range in inputs.ranges {
        let end = range.max_seq.unwrap_or(inputs.last_seq);
        match range.kind.as_str() {
            "join" => {
                parts.push((range.window_seq.min(range.min_seq), end));
            }
            "invite" => {
                // The event that ended the invite is the user's own membership
                // event seen with their membership before it (invite): a
                // rejected invite must reach the rejecter, whatever the setting.
                if let Some(end) = range.max_seq {
                    parts.push((end, end));
                }
                for &(lo, hi, hv) in &segments {
                    // The spec's rule for invitees names `invited` only;
                    // `shared` counts for them once they join, `world_readable` always.
                    if hv == Hv::Invited {
                        parts.push((lo.max(range.min_seq), hi.min(end)));
                    }
                }
            }
            "knock" => {
                // A knocker reads nothing of the room, only the event that
                // answers the knock (an invite, a refusal) or withdraws it.
                if let Some(end) = range.max_seq {
                    parts.push((end, end));
                }
            }
            _ => {}
        }
    }
    // `shared`: the user joined at some point after the event.
    let last_join = inputs.ranges.iter().filter(|r| r.kind == "join").map(|r| r.min_seq).max().unwrap_or(0);
    for &(lo, hi, hv) in &segments {
        if hv == Hv::WorldReadable {
            parts.push((lo, hi));
        } else if hv == Hv::Shared {
            parts.push((lo, hi.min(last_join)));
        }
    }
    SeqRanges::from_unsorted(parts).clamp(inputs.floor.max(1), inputs.last_seq)
}

/// The seqs another server may be sent (Synapse's rule for servers, by the
/// same interval arithmetic): `rows` are the ranges of every user of that
/// server, and the server is in the room now (it is refused before this
/// otherwise). `world_readable` and `shared` stretches: all of them;
/// `invited` stretches: inside its users' invites and stays; `joined`: inside
/// their stays. Each of its users' own membership events counts as for that
/// user. Outside what this answers, events go out redacted.
pub fn server_visible(rows: &[Range], hv: &HvLine, last_seq: i64, floor: i64) -> SeqRanges {
    // Its users' own rules, with `shared` open to the end (the server is in
    // the room now), and `invited` read through invites and stays alike.
    let mut parts = visible(&Inputs { ranges: rows, hv, last_seq, floor }).0;
    for &(lo, hi, value) in &hv.segments(last_seq) {
        match value {
            Hv::WorldReadable | Hv::Shared => parts.push((lo, hi)),
            Hv::Invited => {
                for row in rows.iter().filter(|r| r.kind == "join") {
                    parts.push((lo.max(row.min_seq), hi.min(row.max_seq.unwrap_or(last_seq))));
                }
            }
            Hv::Joined => {}
        }
    }
    SeqRanges::from_unsorted(parts).clamp(floor.max(1), last_seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stay(min: i64, max: Option<i64>) -> Range {
        Range { kind: "join".into(), min_seq: min, max_seq: max, window_seq: min }
    }

    fn invite(min: i64, max: Option<i64>) -> Range {
        Range { kind: "invite".into(), min_seq: min, max_seq: max, window_seq: min }
    }

    /// `joined` from before the first event (seq 0 is before the line).
    fn joined_only() -> HvLine {
        HvLine { changes: vec![(0, Hv::Joined)] }
    }

    #[test]
    fn ranges_at_the_ends_of_i64_merge_without_overflow() {
        let r = SeqRanges::from_unsorted(vec![(i64::MAX, i64::MAX), (i64::MIN, i64::MAX - 1), (5, 1)]);
        assert_eq!(r.0, vec![(i64::MIN, i64::MAX)]);
        assert_eq!(r.positions(), i64::MAX);
        assert!(r.contains(i64::MAX) && r.contains(i64::MIN));
    }

    #[test]
    fn the_chapters_hiking_group() {
        // Joined-only history. Ben: in from the start, leaves at 4,816, back
        // at 4,881; Cara joins at 4,837; the room is at 4,900.
        let hv = joined_only();
        let ben = [stay(2, Some(4816)), stay(4881, None)];
        let v = visible(&Inputs { ranges: &ben, hv: &hv, last_seq: 4900, floor: 0 });
        assert_eq!(v.0, vec![(2, 4816), (4881, 4900)]);
        // The 64 events of the gap stay hidden.
        assert_eq!((4817..4881).filter(|s| v.contains(*s)).count(), 0);
        assert_eq!(4880 - 4817 + 1, 64);

        let cara = [stay(4837, None)];
        let v = visible(&Inputs { ranges: &cara, hv: &hv, last_seq: 4900, floor: 0 });
        assert_eq!(v.first(), Some(4837));
        // With the pre-join window of 100, her start moves back 100.
        let cara = [Range { window_seq: 4737, ..stay(4837, None) }];
        let v = visible(&Inputs { ranges: &cara, hv: &hv, last_seq: 4900, floor: 0 });
        assert_eq!(v.0, vec![(4737, 4900)]);
        // ... but never below the floor.
        let v = visible(&Inputs { ranges: &cara, hv: &hv, last_seq: 4900, floor: 4800 });
        assert_eq!(v.0, vec![(4800, 4900)]);
    }

    #[test]
    fn a_departed_user_keeps_their_stay_and_nothing_newer() {
        let hv = joined_only();
        let ben = [stay(2, Some(4816))];
        let v = visible(&Inputs { ranges: &ben, hv: &hv, last_seq: 4900, floor: 0 });
        assert_eq!(v.0, vec![(2, 4816)]);
        assert!(v.contains(4816), "the leaver sees their own leave");
        assert!(!v.contains(4817));
    }

    #[test]
    fn shared_opens_the_history_before_ones_latest_join() {
        // Default (no visibility event) is shared.
        let hv = HvLine::default();
        let ben = [stay(2, Some(10)), stay(20, None)];
        let v = visible(&Inputs { ranges: &ben, hv: &hv, last_seq: 30, floor: 0 });
        assert_eq!(v.0, vec![(1, 30)]);
        // After leaving he keeps all he could see: everything up to his leave,
        // the gap too (he joined after it), nothing after.
        let ben = [stay(2, Some(10)), stay(20, Some(25))];
        let v = visible(&Inputs { ranges: &ben, hv: &hv, last_seq: 30, floor: 0 });
        assert_eq!(v.0, vec![(1, 25)]);
        // Someone invited who never joined sees nothing of a shared room but
        // their own rejection.
        let eve = [invite(5, Some(6))];
        let v = visible(&Inputs {
            ranges: &eve,
            hv: &HvLine { changes: vec![(0, Hv::Shared)] },
            last_seq: 30,
            floor: 0,
        });
        assert_eq!(v.0, vec![(6, 6)], "an invite alone opens nothing under shared: {v:?}");
    }

    #[test]
    fn a_visibility_change_decides_per_event_and_never_reopens() {
        // shared until seq 10 sets joined; seq 20 sets shared again.
        let hv = HvLine { changes: vec![(10, Hv::Joined), (20, Hv::Shared)] };
        assert_eq!(
            hv.segments(30),
            vec![
                (1, 9, Hv::Shared),
                (10, 10, Hv::Shared),
                (11, 19, Hv::Joined),
                (20, 20, Hv::Shared),
                (21, 30, Hv::Shared)
            ]
        );
        let cara = [stay(25, None)];
        let v = visible(&Inputs { ranges: &cara, hv: &hv, last_seq: 30, floor: 0 });
        // 11..=19 were sent under `joined`: hidden, although the room is shared now.
        assert_eq!(v.0, vec![(1, 10), (20, 30)]);
    }

    #[test]
    fn invited_reads_from_the_invite_on() {
        let hv = HvLine { changes: vec![(0, Hv::Invited)] };
        let dan = [invite(5, Some(8)), stay(8, None)];
        let v = visible(&Inputs { ranges: &dan, hv: &hv, last_seq: 12, floor: 0 });
        assert_eq!(v.0, vec![(5, 12)]);
        // A rejected invite: the invite through the rejection.
        let eve = [invite(5, Some(9))];
        let v = visible(&Inputs { ranges: &eve, hv: &hv, last_seq: 12, floor: 0 });
        assert_eq!(v.0, vec![(5, 9)]);
        // Under `joined`, an invite shows nothing but its own end (the rejection).
        let hv = joined_only();
        let v = visible(&Inputs { ranges: &eve, hv: &hv, last_seq: 12, floor: 0 });
        assert_eq!(v.0, vec![(9, 9)]);
    }

    #[test]
    fn world_readable_needs_no_membership() {
        let hv = HvLine { changes: vec![(3, Hv::WorldReadable), (7, Hv::Joined)] };
        let v = visible(&Inputs { ranges: &[], hv: &hv, last_seq: 10, floor: 0 });
        // The event at 7 itself counts as the more permissive of before and after.
        assert_eq!(v.0, vec![(3, 7)]);
    }

    #[test]
    fn ranges_merge_clamp_and_walk() {
        let r = SeqRanges::from_unsorted(vec![(5, 7), (1, 2), (3, 4), (10, 12), (11, 11), (9, 8)]);
        assert_eq!(r.0, vec![(1, 7), (10, 12)]);
        assert_eq!(r.positions(), 10);
        assert!(r.contains(7) && !r.contains(8) && r.contains(10));
        assert_eq!(r.descending_from(11).collect::<Vec<_>>(), vec![(10, 11), (1, 7)]);
        assert_eq!(r.ascending_from(6).collect::<Vec<_>>(), vec![(6, 7), (10, 12)]);
        assert_eq!(r.clamp(2, 10).0, vec![(2, 7), (10, 10)]);
    }

    #[test]
    fn servers_read_by_the_union_of_their_users_rows() {
        // joined until 10, shared from 10 on; one user of the server joined
        // at 5 and left at 8, another was invited at 12 and joined at 15.
        let hv = HvLine { changes: vec![(0, Hv::Joined), (10, Hv::Shared)] };
        let rows = [stay(5, Some(8)), invite(12, Some(15)), stay(15, None)];
        let seen = server_visible(&rows, &hv, 20, 0);
        // 5..=8: the first stay; 10..=20: shared while the server is in the room.
        assert_eq!(seen, SeqRanges(vec![(5, 8), (10, 20)]));
        // A room floor cuts it.
        assert_eq!(server_visible(&rows, &hv, 20, 12), SeqRanges(vec![(12, 20)]));
        // `invited`: from the invite on, not before.
        let hv = HvLine { changes: vec![(0, Hv::Invited)] };
        assert_eq!(
            server_visible(&[invite(12, Some(15)), stay(15, None)], &hv, 20, 0),
            SeqRanges(vec![(12, 20)])
        );
        // `joined` with no stays: only the end of an invite (its answer).
        let hv = HvLine { changes: vec![(0, Hv::Joined)] };
        assert_eq!(server_visible(&[invite(3, Some(4))], &hv, 20, 0), SeqRanges(vec![(4, 4)]));
    }
}
