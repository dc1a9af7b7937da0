//! What simplified sliding sync (`sync::sliding`) reads in one go: a
//! user's rooms with what its lists sort and filter by, and a room's
//! `bump_stamp`.

use super::Db;
use crate::error::Result;

/// One of a user's rooms, as the room list sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRoom {
    /// The room.
    pub room_id: String,
    /// The membership the user holds now when it is `join`, `invite` or
    /// `knock` (an open range); `None` when they left, were kicked or
    /// banned, or an invite or knock of theirs ended.
    pub open: Option<String>,
    /// The last position the user's view of the room reaches: the room's
    /// head when joined, else the event that ended their last range (or the
    /// invite or knock that opened the open one).
    pub horizon: i64,
    /// The global stream position of the event at `horizon` (0 if none):
    /// what the lists sort by.
    pub stream: i64,
    /// The sender of the event at `horizon` (whether a leave was one's
    /// own).
    pub sender: String,
    /// `m.room.create`'s `content.type`.
    pub room_type: Option<String>,
    /// The room has an `m.room.encryption` state event now.
    pub encrypted: bool,
    /// The room's name now (`room_summaries`).
    pub name: Option<String>,
    /// Its avatar's URL now.
    pub avatar: Option<String>,
}

type Row = (
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
    i64,
    Option<String>,
    Option<String>,
);

/// Every room of `user`'s with any membership range (only those of `only`
/// when it names some), forgotten ones left out, in one statement.
pub async fn rooms_of(db: &Db, user: &str, only: &[&str]) -> Result<Vec<ListedRoom>> {
    let restrict = if only.is_empty() {
        String::new()
    } else {
        format!(" AND m.room_id IN ({})", super::params(2, only.len()))
    };
    let sql = format!(
        "SELECT x.room_id, x.open_kind, x.horizon, e.stream, e.sender, s.room_type, \
           CASE WHEN EXISTS (SELECT 1 FROM room_state rs WHERE rs.room_id = x.room_id \
             AND rs.event_type = 'm.room.encryption' AND rs.state_key = '' AND rs.event_id <> '') THEN 1 ELSE 0 END, \
           s.name, s.avatar_url \
         FROM (SELECT m.room_id, \
                 MAX(CASE WHEN m.max_seq IS NULL THEN m.kind ELSE NULL END) AS open_kind, \
                 MAX(CASE WHEN m.max_seq IS NULL AND m.kind = 'join' THEN r.last_seq \
                          ELSE COALESCE(m.max_seq, m.min_seq) END) AS horizon \
               FROM memberships m JOIN rooms r ON r.room_id = m.room_id \
               WHERE m.user_id = $1{restrict} AND NOT EXISTS \
                 (SELECT 1 FROM forgotten_rooms f WHERE f.user_id = m.user_id AND f.room_id = m.room_id) \
               GROUP BY m.room_id) x \
         LEFT JOIN events e ON e.room_id = x.room_id AND e.seq = x.horizon \
         LEFT JOIN room_summaries s ON s.room_id = x.room_id"
    );
    let mut query = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql)).bind(user);
    for room in only {
        query = query.bind(*room);
    }
    let rows = query.fetch_all(&mut db.reader()).await?;
    Ok(rows
        .into_iter()
        .map(|(room_id, open, horizon, stream, sender, room_type, encrypted, name, avatar)| ListedRoom {
            room_id,
            open,
            horizon,
            stream: stream.unwrap_or(0).max(0),
            sender: sender.unwrap_or_default(),
            room_type,
            encrypted: encrypted != 0,
            name: name.filter(|n| !n.is_empty()),
            avatar: avatar.filter(|a| !a.is_empty()),
        })
        .collect())
}

/// The event types that move a room's `bump_stamp` (Synapse's list, which
/// the merged MSC4186 text repeats).
pub const BUMP_TYPES: [&str; 8] = [
    "m.room.create",
    "m.room.message",
    "m.room.encrypted",
    "m.sticker",
    "m.call.invite",
    "m.poll.start",
    "m.beacon_info",
    "org.matrix.msc3672.beacon_info",
];

/// Where a room stands for an answer built at a stream position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Positions {
    /// The highest seq at or below the answer's stream position.
    pub end: i64,
    /// The highest seq at or below the client's position (0: none).
    pub since: i64,
    /// The stream position of the newest event of a bump type at or below
    /// the answer's position (0: none).
    pub bump: i64,
}

/// [`Positions`] of each of `rooms` at stream position `now`, the client
/// holding them up to `since`: one statement for all (three index walks
/// per room), instead of three per room. The bump stamp walks the room's
/// events other than memberships down from the newest (`+stream` keeps
/// SQLite from reading every event of the room by stream instead and
/// sorting them: a thousand joins since the last message cost a thousand
/// rows that way).
pub async fn positions(
    db: &Db,
    rooms: &[&str],
    since: i64,
    now: i64,
) -> Result<std::collections::HashMap<String, Positions>> {
    let mut out = std::collections::HashMap::new();
    for chunk in rooms.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = positions_sql(chunk.len());
        let mut query =
            sqlx::query_as::<_, (String, Option<i64>, Option<i64>, Option<i64>)>(sqlx::AssertSqlSafe(sql))
                .bind(now)
                .bind(since);
        for kind in BUMP_TYPES {
            query = query.bind(kind);
        }
        for room in chunk {
            query = query.bind(*room);
        }
        for (room, end, since, bump) in query.fetch_all(&mut db.reader()).await? {
            let end = end.unwrap_or(0);
            out.insert(
                room,
                Positions { end, since: since.unwrap_or(0).min(end), bump: bump.unwrap_or(0).max(0) },
            );
        }
    }
    Ok(out)
}

/// The statement of [`positions`] for `rooms` rooms: $1 now, $2 since, then
/// the bump types, then the rooms.
pub(in crate::storage) fn positions_sql(rooms: usize) -> String {
    format!(
        "SELECT r.room_id, \
           (SELECT seq FROM events WHERE room_id = r.room_id AND stream <= $1 AND stream > 0 \
            ORDER BY stream DESC LIMIT 1), \
           (SELECT seq FROM events WHERE room_id = r.room_id AND stream <= $2 AND stream > 0 \
            ORDER BY stream DESC LIMIT 1), \
           (SELECT stream FROM events WHERE room_id = r.room_id AND +stream <= $1 AND +stream > 0 \
            AND event_type <> 'm.room.member' AND event_type IN ({}) ORDER BY seq DESC LIMIT 1) \
         FROM rooms r WHERE r.room_id IN ({})",
        super::params(3, BUMP_TYPES.len()),
        super::params(3 + BUMP_TYPES.len(), rooms)
    )
}
