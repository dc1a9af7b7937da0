//! Account data (global and per room) and stored sync filters.

use super::Db;
use crate::error::Result;

/// Sets account data at stream position `stream`; `room_id` '' is global.
pub async fn put(
    db: &Db,
    user_id: &str,
    room_id: &str,
    data_type: &str,
    content: &str,
    stream: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO account_data (user_id, room_id, data_type, content, stream) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (user_id, room_id, data_type) DO UPDATE SET content = excluded.content, stream = excluded.stream",
    )
    .bind(user_id)
    .bind(room_id)
    .bind(data_type)
    .bind(content)
    .bind(stream)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// One item of account data.
pub async fn get(db: &Db, user_id: &str, room_id: &str, data_type: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT content FROM account_data WHERE user_id = $1 AND room_id = $2 AND data_type = $3",
    )
    .bind(user_id)
    .bind(room_id)
    .bind(data_type)
    .fetch_optional(&mut db.reader())
    .await?)
}

/// Account data changed in `(after, upto]` (`changed`: (room_id, type,
/// content), in stream order) and the user's global account data of
/// `types` whatever its age (`wanted`: (type, content)), in one statement.
pub async fn changed_and_wanted(
    db: &Db,
    user_id: &str,
    after: i64,
    upto: i64,
    types: &[&str],
) -> Result<(Vec<(String, String, String)>, Vec<(String, String)>)> {
    let sql = format!(
        "SELECT room_id, data_type, content, CASE WHEN stream > $2 AND stream <= $3 THEN 1 ELSE 0 END \
         FROM account_data WHERE user_id = $1 \
           AND ((stream > $2 AND stream <= $3) OR (room_id = '' AND data_type IN ({}))) \
         ORDER BY stream",
        super::params(4, types.len())
    );
    let mut query = sqlx::query_as::<_, (String, String, String, i64)>(sqlx::AssertSqlSafe(sql))
        .bind(user_id)
        .bind(after)
        .bind(upto);
    for t in types {
        query = query.bind(*t);
    }
    let (mut changed, mut wanted) = (Vec::new(), Vec::new());
    for (room_id, kind, content, is_changed) in query.fetch_all(&mut db.reader()).await? {
        if room_id.is_empty() && types.contains(&kind.as_str()) {
            wanted.push((kind.clone(), content.clone()));
        }
        if is_changed == 1 {
            changed.push((room_id, kind, content));
        }
    }
    Ok((changed, wanted))
}

/// `user_id`'s account data in each of `room_ids`: (room, type, content),
/// in the order it was written (up to [`super::outliers::IDS_PER_QUERY`] rooms per statement).
pub async fn of_rooms(db: &Db, user_id: &str, room_ids: &[&str]) -> Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    for rooms in room_ids.chunks(super::outliers::IDS_PER_QUERY) {
        let sql = format!(
            "SELECT room_id, data_type, content FROM account_data WHERE user_id = $1 AND room_id IN ({}) \
             ORDER BY stream",
            super::params(2, rooms.len())
        );
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(user_id);
        for room in rooms {
            query = query.bind(*room);
        }
        out.extend(query.fetch_all(&mut db.reader()).await?);
    }
    Ok(out)
}

/// Stores a filter; returns its id.
pub async fn put_filter(db: &Db, user_id: &str, filter: &str) -> Result<String> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM filters WHERE user_id = $1")
        .bind(user_id)
        .fetch_one(&mut db.reader())
        .await?;
    let id = format!("f{n}");
    sqlx::query("INSERT INTO filters (user_id, filter_id, filter) VALUES ($1, $2, $3)")
        .bind(user_id)
        .bind(&id)
        .bind(filter)
        .execute(&db.pool)
        .await?;
    Ok(id)
}

/// A stored filter.
pub async fn get_filter(db: &Db, user_id: &str, filter_id: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT filter FROM filters WHERE user_id = $1 AND filter_id = $2")
        .bind(user_id)
        .bind(filter_id)
        .fetch_optional(&mut db.reader())
        .await?)
}

/// The highest stream position stored anywhere (to start the allocator).
pub async fn max_stream(db: &Db) -> Result<i64> {
    let mut max = 0i64;
    for table in ["events", "receipts", "account_data", "device_list_updates", "to_device", "remote_invites"]
    {
        let m: Option<i64> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT MAX(stream) FROM {table}")))
                .fetch_one(&mut db.reader())
                .await?;
        max = max.max(m.unwrap_or(0));
    }
    Ok(max)
}

/// A user's pushers (JSON as set).
pub async fn pushers(db: &Db, user_id: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT pusher FROM pushers WHERE user_id = $1 ORDER BY app_id, pushkey")
        .bind(user_id)
        .fetch_all(&mut db.reader())
        .await?)
}

/// Stores a pusher (replacing the user's one with the same app id and
/// pushkey) for the device whose token set it, unless the user would then
/// have more than `max`: false, and nothing changed.
/// A pusher to store.
#[derive(Debug, Clone, Copy)]
pub struct NewPusher<'a> {
    /// Its user.
    pub user_id: &'a str,
    /// The device whose access token set it (it goes with the device).
    pub device_id: &'a str,
    /// `app_id`.
    pub app_id: &'a str,
    /// `pushkey`.
    pub pushkey: &'a str,
    /// The whole pusher, as JSON text.
    pub pusher: &'a str,
    /// The spec's `append`: false takes the app and key from other users.
    pub append: bool,
}

pub async fn add_pusher(db: &Db, new: NewPusher<'_>, max: i64) -> Result<bool> {
    let NewPusher { user_id, device_id, app_id, pushkey, pusher, append } = new;
    let mut tx = db.begin_write().await?;
    // Two concurrent adds of one user count one after the other.
    super::users::lock_for_count(db, tx.conn(), user_id).await?;
    if !append {
        // The spec's default: this app and push key now belong to this
        // user alone (a phone that changed hands stops getting the previous
        // owner's notifications).
        sqlx::query("DELETE FROM pushers WHERE app_id = $1 AND pushkey = $2 AND user_id <> $3")
            .bind(app_id)
            .bind(pushkey)
            .bind(user_id)
            .execute(tx.conn())
            .await?;
    }
    let others: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pushers WHERE user_id = $1 AND NOT (app_id = $2 AND pushkey = $3)",
    )
    .bind(user_id)
    .bind(app_id)
    .bind(pushkey)
    .fetch_one(tx.conn())
    .await?;
    if others >= max {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO pushers (user_id, device_id, app_id, pushkey, pusher) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (user_id, app_id, pushkey) DO UPDATE SET device_id = excluded.device_id, \
         pusher = excluded.pusher",
    )
    .bind(user_id)
    .bind(device_id)
    .bind(app_id)
    .bind(pushkey)
    .bind(pusher)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Deletes a pusher.
pub async fn delete_pusher(db: &Db, user_id: &str, app_id: &str, pushkey: &str) -> Result<()> {
    sqlx::query("DELETE FROM pushers WHERE user_id = $1 AND app_id = $2 AND pushkey = $3")
        .bind(user_id)
        .bind(app_id)
        .bind(pushkey)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Users with at least one pusher.
pub async fn pusher_users(db: &Db) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT DISTINCT user_id FROM pushers").fetch_all(&mut db.reader()).await?)
}
