//! Positions on a room's seq line: the one place that knows their arithmetic.
//!
//! Positions are sparse (FEDERATION.md §0 decision 3, §1.2 "Arithmetic"): a
//! room's first event is placed at [`ORIGIN`] = 2^62 and each event placed at
//! the head takes the last position plus [`STEP`] = 2^20. Room is left below
//! the first position (backfill: [`below`]) and between two neighbours (a hole
//! filled later: [`between`]), so placing an event never renumbers another.
//! That gives ~4·10^12 placements each way and room for ~10^6 events between
//! two neighbours.
//!
//! Only the order of positions means anything: the difference of two is no
//! count of events. A position is an integer, so "just before x" as an
//! exclusive bound is `x - 1` and "just after x" is `x + 1`: such bounds stay
//! right whatever the spacing (no event lies strictly between x - 1 and x).
//!
//! [`NONE`] (0) is below every position: `rooms.last_seq` of a room with no
//! event, and a floor (`rooms.floor_seq`, `user_room_floors.floor_seq`) that
//! hides nothing.

/// The first event of a room.
pub const ORIGIN: i64 = 1 << 62;

/// The gap between two events placed one after the other.
pub const STEP: i64 = 1 << 20;

/// "No position": the head of an empty room, a floor that hides nothing.
pub const NONE: i64 = 0;

/// The lowest position an event may take.
pub const LOWEST: i64 = 1;

/// The position of a room's first event.
pub fn first() -> i64 {
    ORIGIN
}

/// The position of an event placed at the head, after `last` (the room's
/// newest position, [`NONE`] for an empty room). `None` once the line is full.
pub fn next_after(last: i64) -> Option<i64> {
    if last == NONE { Some(ORIGIN) } else { last.checked_add(STEP) }
}

/// The position of an event placed below `first` (backfill), `None` once there
/// is no room left below.
pub fn below(first: i64) -> Option<i64> {
    first.checked_sub(STEP).filter(|p| *p >= LOWEST)
}

/// A position strictly between `a` and `b` (a hole filled later), in the
/// middle so that later fills keep room on both sides; `None` when the two
/// are neighbours (or out of order).
pub fn between(a: i64, b: i64) -> Option<i64> {
    let gap = b.checked_sub(a)?;
    (gap >= 2).then(|| a + gap / 2)
}

/// `n` ascending positions strictly between `a` and `b`, packed just below
/// `b`: a hole in the line is filled from its top down (backfill pages back
/// into it), so each batch keeps most of the room below it for the next
/// one: a batch takes about a 64th of the gap (the spacing at least 1, at
/// most [`STEP`]), so a hole between two neighbours placed at the head
/// takes tens of thousands of events.
/// `None` when fewer than `n` positions lie between them.
pub fn just_below(a: i64, b: i64, n: usize) -> Option<Vec<i64>> {
    let gap = b.checked_sub(a)?;
    let count = i64::try_from(n).ok()?;
    if count == 0 {
        return Some(Vec::new());
    }
    let mut spacing = (gap / count.saturating_add(1).saturating_mul(64)).clamp(1, STEP);
    if count.saturating_mul(spacing) >= gap {
        spacing = 1;
    }
    if count >= gap {
        return None;
    }
    Some((0..count).map(|i| b - (count - i) * spacing).collect())
}

/// The position the migration to sparse positions (migration 0020) gave the
/// event at dense seq `seq` (1, 2, 3, ...): `ORIGIN + (seq - 1)·STEP`, so the
/// create event stays at [`first`] and each later one a [`STEP`] above.
/// `seq <= 0` ([`NONE`], "before every event") stays [`NONE`]; `None` past
/// what a dense line could have held.
pub fn from_dense(seq: i64) -> Option<i64> {
    if seq <= NONE {
        return Some(NONE);
    }
    (seq - 1).checked_mul(STEP)?.checked_add(ORIGIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hole_is_filled_from_its_top_and_keeps_room_below() {
        let (a, b) = (ORIGIN, ORIGIN + STEP);
        let first = just_below(a, b, 100).unwrap();
        assert_eq!(first.len(), 100);
        assert!(first.windows(2).all(|w| w[0] < w[1]));
        assert!(a < first[0] && *first.last().unwrap() < b);
        // Batch after batch into what is left below: thousands of events fit.
        let (mut top, mut placed) = (first[0], 100);
        while let Some(next) = just_below(a, top, 100) {
            assert!(a < next[0] && *next.last().unwrap() < top);
            top = next[0];
            placed += 100;
        }
        assert!(placed > 20_000, "{placed}");
        // Neighbours leave no room; exactly enough room is used whole.
        assert_eq!(just_below(5, 6, 1), None);
        assert_eq!(just_below(5, 8, 2), Some(vec![6, 7]));
        assert_eq!(just_below(5, 8, 0), Some(vec![]));
    }

    #[test]
    fn the_head_moves_by_step_from_the_origin() {
        assert_eq!(next_after(NONE), Some(ORIGIN));
        assert_eq!(first(), 4_611_686_018_427_387_904);
        assert_eq!(next_after(ORIGIN), Some(ORIGIN + 1_048_576));
        assert_eq!(next_after(next_after(ORIGIN).unwrap()), Some(ORIGIN + 2 * STEP));
        // The line ends ~4.4·10^12 placements above the origin.
        let top = ORIGIN + ((i64::MAX - ORIGIN) / STEP) * STEP;
        assert_eq!(next_after(top), None);
        assert_eq!((top - ORIGIN) / STEP, (1 << 42) - 1);
    }

    #[test]
    fn below_leaves_the_same_room_under_the_origin() {
        assert_eq!(below(ORIGIN), Some(ORIGIN - STEP));
        assert_eq!(below(ORIGIN - STEP), Some(ORIGIN - 2 * STEP));
        assert_eq!(below(STEP + 1), Some(1));
        assert_eq!(below(STEP), None);
        assert_eq!(below(LOWEST), None);
        // Every placement below the origin stays a valid position.
        assert_eq!((ORIGIN - LOWEST) / STEP, (1 << 42) - 1);
    }

    #[test]
    fn between_bisects_until_neighbours() {
        assert_eq!(between(ORIGIN, ORIGIN + STEP), Some(ORIGIN + STEP / 2));
        assert_eq!(between(10, 12), Some(11));
        assert_eq!(between(10, 11), None);
        assert_eq!(between(10, 10), None);
        assert_eq!(between(12, 10), None);
        assert_eq!(between(LOWEST, i64::MAX), Some(LOWEST + (i64::MAX - LOWEST) / 2));
        // A hole between two head placements takes STEP - 1 events.
        let (mut lo, hi) = (ORIGIN, ORIGIN + STEP);
        let mut fills = 0;
        while let Some(p) = between(lo, hi) {
            assert!(lo < p && p < hi);
            lo = p;
            fills += 1;
        }
        assert_eq!(fills, 20);
        assert_eq!(hi - lo, 1);
    }

    #[test]
    fn dense_seqs_map_in_order() {
        assert_eq!(from_dense(0), Some(NONE));
        assert_eq!(from_dense(-5), Some(NONE));
        assert_eq!(from_dense(1), Some(ORIGIN));
        assert_eq!(from_dense(2), next_after(ORIGIN));
        assert_eq!(from_dense(1000), Some(ORIGIN + 999 * STEP));
        assert_eq!(from_dense(i64::MAX), None);
        let mut last = NONE;
        for seq in 1..200 {
            let p = from_dense(seq).unwrap();
            assert_eq!(next_after(last), Some(p));
            last = p;
        }
    }
}
