//! The `rooms` table: one row per room, holding the head of its seq line.

use sqlx::AnyConnection;

use super::Db;
use crate::error::{Error, Result};

/// A room's row.
#[derive(Debug, Clone)]
pub struct RoomRow {
    /// Room id.
    pub room_id: String,
    /// Room version id.
    pub room_version: String,
    /// The creator (sender of the create event).
    pub creator: String,
    /// Seq of the newest event.
    pub last_seq: i64,
    /// Event ids new events point at.
    pub extremities: Vec<String>,
    /// Greatest depth so far.
    pub max_depth: i64,
    /// Listed in the public directory.
    pub published: bool,
    /// The room's floor: nothing below it is returned to anyone.
    pub floor_seq: i64,
    /// Moves whenever what members may read changes other than by the head
    /// moving on (a state event, a purge, a user's own floor).
    pub read_epoch: i64,
}

type Row = (String, String, String, i64, String, i64, i64, i64, i64);

fn from_row(
    (room_id, room_version, creator, last_seq, extremities, max_depth, published, floor_seq, read_epoch): Row,
) -> RoomRow {
    RoomRow {
        floor_seq,
        read_epoch,
        room_id,
        room_version,
        creator,
        last_seq,
        extremities: serde_json::from_str(&extremities).unwrap_or_default(),
        max_depth,
        published: published != 0,
    }
}

const COLUMNS: &str =
    "room_id, room_version, creator, last_seq, extremities, max_depth, published, floor_seq, read_epoch";

/// Loads a room inside a write transaction.
pub async fn get_tx(conn: &mut AnyConnection, room_id: &str) -> Result<Option<RoomRow>> {
    let row: Option<Row> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM rooms WHERE room_id = $1")))
            .bind(room_id)
            .fetch_optional(conn)
            .await?;
    Ok(row.map(from_row))
}

/// Loads a room.
pub async fn get(db: &Db, room_id: &str) -> Result<Option<RoomRow>> {
    let row: Option<Row> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM rooms WHERE room_id = $1")))
            .bind(room_id)
            .fetch_optional(&mut db.reader())
            .await?;
    Ok(row.map(from_row))
}

/// The rooms among `ids` that exist, in no particular order.
pub async fn get_many(db: &Db, ids: &[&str]) -> Result<Vec<RoomRow>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = format!("SELECT {COLUMNS} FROM rooms WHERE room_id IN ({})", super::params(1, chunk.len()));
        let mut query = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?.into_iter().map(from_row));
    }
    Ok(out)
}

/// Inserts a new room with an empty seq line.
pub async fn insert(
    conn: &mut AnyConnection,
    room_id: &str,
    room_version: &str,
    creator: &str,
    now: i64,
) -> Result<()> {
    sqlx::query("INSERT INTO rooms (room_id, room_version, creator, created_ts) VALUES ($1, $2, $3, $4)")
        .bind(room_id)
        .bind(room_version)
        .bind(creator)
        .bind(now)
        .execute(conn)
        .await
        .map_err(|e| {
            if super::is_unique_violation(&e) {
                Error::Internal(format!("room {room_id} exists already"))
            } else {
                e.into()
            }
        })?;
    Ok(())
}

/// Moves the head of the seq line.
pub async fn set_head(
    conn: &mut AnyConnection,
    room_id: &str,
    last_seq: i64,
    extremities: &[String],
    max_depth: i64,
    state_changed: bool,
) -> Result<()> {
    let extremities = serde_json::to_string(extremities).map_err(|e| Error::Internal(e.to_string()))?;
    sqlx::query(
        "UPDATE rooms SET last_seq = $1, extremities = $2, max_depth = $3, read_epoch = read_epoch + $4 \
         WHERE room_id = $5",
    )
    .bind(last_seq)
    .bind(extremities)
    .bind(max_depth)
    .bind(i64::from(state_changed))
    .bind(room_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Lists or unlists a room in the public directory.
pub async fn set_published(db: &Db, room_id: &str, published: bool) -> Result<()> {
    sqlx::query("UPDATE rooms SET published = $1 WHERE room_id = $2")
        .bind(i64::from(published))
        .bind(room_id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Raises the room's floor (it never moves down).
pub async fn raise_floor(db: &Db, room_id: &str, floor_seq: i64) -> Result<()> {
    sqlx::query(
        "UPDATE rooms SET floor_seq = $1, read_epoch = read_epoch + 1 WHERE room_id = $2 AND floor_seq < $1",
    )
    .bind(floor_seq)
    .bind(room_id)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// A field of a room's directory summary (`room_summaries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryField {
    /// `m.room.name` content.name.
    Name,
    /// `m.room.topic` content.topic.
    Topic,
    /// `m.room.avatar` content.url.
    AvatarUrl,
    /// `m.room.canonical_alias` content.alias.
    CanonicalAlias,
    /// `m.room.join_rules` content.join_rule.
    JoinRule,
    /// `m.room.create` content.type.
    RoomType,
    /// `m.room.history_visibility` is `world_readable` (1) or not (0).
    WorldReadable,
    /// `m.room.guest_access` is `can_join` (1) or not (0).
    GuestCanJoin,
}

impl SummaryField {
    fn column(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Topic => "topic",
            Self::AvatarUrl => "avatar_url",
            Self::CanonicalAlias => "canonical_alias",
            Self::JoinRule => "join_rule",
            Self::RoomType => "room_type",
            Self::WorldReadable => "world_readable",
            Self::GuestCanJoin => "guest_can_join",
        }
    }
}

/// A summary field's new value: text (or none) for the text fields, a flag
/// for `WorldReadable` and `GuestCanJoin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SummaryValue {
    /// A text field's value.
    Text(Option<String>),
    /// A flag field's value.
    Flag(bool),
}

/// Sets one field of a room's summary, inside the write transaction.
pub async fn set_summary_field(
    conn: &mut AnyConnection,
    room_id: &str,
    field: SummaryField,
    value: SummaryValue,
) -> Result<()> {
    let column = field.column();
    let query = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO room_summaries (room_id, {column}) VALUES ($1, $2) \
         ON CONFLICT (room_id) DO UPDATE SET {column} = excluded.{column}"
    )))
    .bind(room_id);
    let query = match value {
        SummaryValue::Text(text) => query.bind(text),
        SummaryValue::Flag(flag) => query.bind(i64::from(flag)),
    };
    query.execute(conn).await?;
    Ok(())
}

/// Moves a room's joined-member count by `delta`, inside the write transaction.
pub async fn add_joined_members(conn: &mut AnyConnection, room_id: &str, delta: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO room_summaries (room_id, joined_members) VALUES ($1, $2) \
         ON CONFLICT (room_id) DO UPDATE SET joined_members = room_summaries.joined_members + excluded.joined_members",
    )
    .bind(room_id)
    .bind(delta)
    .execute(conn)
    .await?;
    Ok(())
}

/// One published room's summary row.
#[derive(Debug, Clone)]
pub struct RoomSummary {
    /// Room id.
    pub room_id: String,
    /// Name, topic, avatar URL, canonical alias, join rule, room type.
    pub name: Option<String>,
    /// Topic.
    pub topic: Option<String>,
    /// Avatar URL.
    pub avatar_url: Option<String>,
    /// Canonical alias.
    pub canonical_alias: Option<String>,
    /// Join rule.
    pub join_rule: Option<String>,
    /// `m.room.create` content.type.
    pub room_type: Option<String>,
    /// History visibility is world_readable.
    pub world_readable: bool,
    /// Guest access is can_join.
    pub guest_can_join: bool,
    /// Joined members.
    pub joined_members: i64,
}

type SummaryRow = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    i64,
    i64,
);

fn summary_from_row(
    (room_id, name, topic, avatar_url, canonical_alias, join_rule, room_type, wr, guest, joined): SummaryRow,
) -> RoomSummary {
    RoomSummary {
        room_id,
        name,
        topic,
        avatar_url,
        canonical_alias,
        join_rule,
        room_type,
        world_readable: wr != 0,
        guest_can_join: guest != 0,
        joined_members: joined,
    }
}

/// One room's summary row (published or not).
pub async fn summary(db: &Db, room_id: &str) -> Result<Option<RoomSummary>> {
    let row: Option<SummaryRow> = sqlx::query_as(
        "SELECT s.room_id, s.name, s.topic, s.avatar_url, s.canonical_alias, s.join_rule, s.room_type, \
                s.world_readable, s.guest_can_join, s.joined_members FROM room_summaries s WHERE s.room_id = $1",
    )
    .bind(room_id)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(summary_from_row))
}

/// Published rooms whose name, topic or canonical alias contains `pattern`
/// (a lower-case LIKE pattern; `None`: all), most joined members first, then
/// by room id: the page at `offset` of up to `limit`, and how many match.
pub async fn published_summaries(
    db: &Db,
    pattern: Option<&str>,
    offset: i64,
    limit: i64,
) -> Result<(Vec<RoomSummary>, i64)> {
    let search = if pattern.is_some() {
        "AND (LOWER(s.name) LIKE $3 ESCAPE '\\' OR LOWER(s.topic) LIKE $3 ESCAPE '\\' \
              OR LOWER(s.canonical_alias) LIKE $3 ESCAPE '\\')"
    } else {
        ""
    };
    let from =
        format!("FROM room_summaries s JOIN rooms r ON r.room_id = s.room_id WHERE r.published = 1 {search}");
    let count = format!("SELECT COUNT(*) {from}").replace("$3", "$1");
    let mut total = sqlx::query_scalar(sqlx::AssertSqlSafe(count));
    let mut page = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT s.room_id, s.name, s.topic, s.avatar_url, s.canonical_alias, s.join_rule, s.room_type, \
                s.world_readable, s.guest_can_join, s.joined_members {from} \
         ORDER BY s.joined_members DESC, s.room_id LIMIT $1 + 0 OFFSET $2"
    )))
    .bind(limit)
    .bind(offset);
    if let Some(p) = pattern {
        total = total.bind(p);
        page = page.bind(p);
    }
    let total: i64 = total.fetch_one(&mut db.reader()).await?;
    let rows: Vec<SummaryRow> = page.fetch_all(&mut db.reader()).await?;
    let list = rows.into_iter().map(summary_from_row).collect();
    Ok((list, total))
}
