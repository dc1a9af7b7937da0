//! Read receipts, one per (room, user, receipt type, thread).

use super::Db;
use crate::error::Result;

/// A stored receipt.
#[derive(Debug, Clone)]
pub struct Receipt {
    /// Room.
    pub room_id: String,
    /// Who read.
    pub user_id: String,
    /// `m.read` or `m.read.private`.
    pub receipt_type: String,
    /// Thread, '' when unthreaded.
    pub thread_id: String,
    /// Up to which event.
    pub event_id: String,
    /// When.
    pub ts: i64,
}

/// A user's read receipts (public or private) in a room: the highest seq
/// they reach per thread id ('' for unthreaded), as `columns` (where
/// `r.room_id`, `r.thread_id` and `MAX(e.seq)` stand). `rooms` says which
/// room (`= $1`, or an `IN (…)` list), `user` is the user's placeholder.
fn read_up_to_sql(columns: &str, rooms: &str, user: &str) -> String {
    format!(
        "SELECT {columns} FROM receipts r JOIN events e ON e.event_id = r.event_id \
         WHERE r.room_id {rooms} AND r.user_id = {user} AND r.receipt_type IN ('m.read', 'm.read.private') \
         GROUP BY r.room_id, r.thread_id"
    )
}

/// See [`read_up_to_sql`].
pub async fn read_up_to(db: &Db, room_id: &str, user: &str) -> Result<Vec<(String, Option<i64>)>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(read_up_to_sql("r.thread_id, MAX(e.seq)", "= $1", "$2")))
        .bind(room_id)
        .bind(user)
        .fetch_all(&mut db.reader())
        .await?)
}

/// [`read_up_to`] in each of `rooms`, every room present (with no marks
/// when the user has no receipt there).
pub async fn read_up_to_in(
    db: &Db,
    rooms: &[&str],
    user: &str,
) -> Result<std::collections::HashMap<String, Vec<(String, Option<i64>)>>> {
    let mut out: std::collections::HashMap<String, Vec<(String, Option<i64>)>> =
        rooms.iter().map(|r| ((*r).to_owned(), Vec::new())).collect();
    for rooms in rooms.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = read_up_to_sql(
            "r.room_id, r.thread_id, MAX(e.seq)",
            &format!("IN ({})", super::params(2, rooms.len())),
            "$1",
        );
        let mut query =
            sqlx::query_as::<_, (String, String, Option<i64>)>(sqlx::AssertSqlSafe(sql)).bind(user);
        for room in rooms {
            query = query.bind(*room);
        }
        for (room, thread, seq) in query.fetch_all(&mut db.reader()).await? {
            out.entry(room).or_default().push((thread, seq));
        }
    }
    Ok(out)
}

/// A row of [`changed_and_read_up_to`]: a receipt's columns, then the seq
/// a read mark reaches, whether the row is a read mark, and its stream.
type ReceiptOrMark = (String, String, String, String, String, i64, Option<i64>, i64, i64);

/// Receipts of the room changed in `(after, upto]`, in stream order, and,
/// in the same statement, `user`'s read receipts (public
/// or private) in the room: the highest seq they reach per thread id ('' for
/// unthreaded), what unread counting starts from.
pub async fn changed_and_read_up_to(
    db: &Db,
    room_id: &str,
    after: i64,
    upto: i64,
    user: &str,
) -> Result<(Vec<Receipt>, Vec<(String, Option<i64>)>)> {
    // The read marks' rows come with the receipts' columns blank.
    let marks = read_up_to_sql("'', '', '', r.thread_id, '', 0, MAX(e.seq), 1, 0", "= $1", "$4");
    let rows: Vec<ReceiptOrMark> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT room_id, user_id, receipt_type, thread_id, event_id, ts, NULL, 0, stream FROM receipts \
         WHERE room_id = $1 AND stream > $2 AND stream <= $3 \
         UNION ALL {marks} ORDER BY 8, 9"
    )))
    .bind(room_id)
    .bind(after)
    .bind(upto)
    .bind(user)
    .fetch_all(&mut db.reader())
    .await?;
    let (mut changed, mut marks) = (Vec::new(), Vec::new());
    for (room_id, user_id, receipt_type, thread_id, event_id, ts, seq, mine, _) in rows {
        if mine == 1 {
            marks.push((thread_id, seq));
        } else {
            changed.push(Receipt { room_id, user_id, receipt_type, thread_id, event_id, ts });
        }
    }
    Ok((changed, marks))
}

/// Sets a receipt at stream position `stream`.
pub async fn put(db: &Db, r: &Receipt, stream: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO receipts (room_id, user_id, receipt_type, thread_id, event_id, ts, stream) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (room_id, user_id, receipt_type, thread_id) DO UPDATE SET \
           event_id = excluded.event_id, ts = excluded.ts, stream = excluded.stream",
    )
    .bind(&r.room_id)
    .bind(&r.user_id)
    .bind(&r.receipt_type)
    .bind(&r.thread_id)
    .bind(&r.event_id)
    .bind(r.ts)
    .bind(stream)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// For each room of `rooms` (with events of its timeline): the receipts
/// at those events and `user`'s own receipts there, in the order they were
/// written (rooms and events up to [`super::outliers::IDS_PER_QUERY`] values
/// per statement; a room's events are never split).
pub async fn at_events_and_own(db: &Db, rooms: &[(&str, &[String])], user: &str) -> Result<Vec<Receipt>> {
    let mut out = Vec::new();
    let mut batches: Vec<&[(&str, &[String])]> = Vec::new();
    let (mut start, mut values) = (0, 0);
    for (i, (_, ids)) in rooms.iter().enumerate() {
        if i > start && values + 1 + ids.len() > super::outliers::IDS_PER_QUERY {
            batches.push(&rooms[start..i]);
            (start, values) = (i, 0);
        }
        values += 1 + ids.len();
    }
    batches.push(&rooms[start..]);
    for rooms in batches.into_iter().filter(|b| !b.is_empty()) {
        let events: Vec<&str> = rooms.iter().flat_map(|(_, ids)| ids.iter().map(String::as_str)).collect();
        let in_rooms = super::params(2, rooms.len());
        let at_events = if events.is_empty() {
            String::new()
        } else {
            format!(" OR event_id IN ({})", super::params(2 + rooms.len(), events.len()))
        };
        // A receipt is stored only at an event of its own room (the one
        // write path, `sync::writes::set_receipt`, checks): one at these
        // events is of the room whose timeline holds it.
        let sql = format!(
            "SELECT room_id, user_id, receipt_type, thread_id, event_id, ts FROM receipts \
             WHERE room_id IN ({in_rooms}) AND (user_id = $1{at_events}) ORDER BY stream"
        );
        let mut query =
            sqlx::query_as::<_, (String, String, String, String, String, i64)>(sqlx::AssertSqlSafe(sql))
                .bind(user);
        for (room, _) in rooms {
            query = query.bind(*room);
        }
        for id in events {
            query = query.bind(id);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?.into_iter().map(
            |(room_id, user_id, receipt_type, thread_id, event_id, ts)| Receipt {
                room_id,
                user_id,
                receipt_type,
                thread_id,
                event_id,
                ts,
            },
        ));
    }
    Ok(out)
}
