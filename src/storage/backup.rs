//! Server-side room key backup: backup versions per user and the session keys
//! stored in them (opaque to the server).

use sqlx::AnyConnection;

use crate::error::Result;

/// One backup version.
#[derive(Debug, Clone)]
pub struct Version {
    /// The version number (clients see it as a string).
    pub version: i64,
    /// `algorithm`.
    pub algorithm: String,
    /// `auth_data`, JSON text.
    pub auth_data: String,
    /// Moves whenever the stored keys change.
    pub etag: i64,
}

/// Where a stored key stands, to decide whether a new upload replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRank {
    /// Verified keys beat unverified ones.
    pub is_verified: bool,
    /// Then the lower first message index wins.
    pub first_message_index: i64,
    /// Then the lower forwarded count.
    pub forwarded_count: i64,
}

impl KeyRank {
    /// Whether a key ranked `self` should replace one ranked `old` (the
    /// spec's order: verified first, then the earliest index, then the fewest
    /// forwards; an equal key changes nothing).
    pub fn replaces(&self, old: &KeyRank) -> bool {
        if self.is_verified != old.is_verified {
            return self.is_verified;
        }
        if self.first_message_index != old.first_message_index {
            return self.first_message_index < old.first_message_index;
        }
        self.forwarded_count < old.forwarded_count
    }
}

const VERSION_COLUMNS: &str = "version, algorithm, auth_data, etag";

type VersionRow = (i64, String, String, i64);

fn to_version(row: Option<VersionRow>) -> Option<Version> {
    row.map(|(version, algorithm, auth_data, etag)| Version { version, algorithm, auth_data, etag })
}

/// The user's current backup: the newest version not deleted.
pub async fn current(conn: &mut AnyConnection, user: &str) -> Result<Option<Version>> {
    let row: Option<VersionRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {VERSION_COLUMNS} FROM backup_versions WHERE user_id = $1 AND deleted = 0 \
         ORDER BY version DESC LIMIT 1"
    )))
    .bind(user)
    .fetch_optional(conn)
    .await?;
    Ok(to_version(row))
}

/// One version, unless deleted.
pub async fn version(conn: &mut AnyConnection, user: &str, version: i64) -> Result<Option<Version>> {
    let row: Option<VersionRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {VERSION_COLUMNS} FROM backup_versions WHERE user_id = $1 AND version = $2 AND deleted = 0"
    )))
    .bind(user)
    .bind(version)
    .fetch_optional(conn)
    .await?;
    Ok(to_version(row))
}

/// Creates the next version (numbers are never reused, not even after a
/// deletion) and returns its number.
pub async fn create(conn: &mut AnyConnection, user: &str, algorithm: &str, auth_data: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO backup_versions (user_id, version, algorithm, auth_data) \
         SELECT $1, COALESCE(MAX(version), 0) + 1, $2, $3 FROM backup_versions WHERE user_id = $1 \
         RETURNING version",
    )
    .bind(user)
    .bind(algorithm)
    .bind(auth_data)
    .fetch_one(conn)
    .await?)
}

/// Replaces a version's `auth_data`.
pub async fn set_auth_data(
    conn: &mut AnyConnection,
    user: &str,
    version: i64,
    auth_data: &str,
) -> Result<()> {
    sqlx::query("UPDATE backup_versions SET auth_data = $3 WHERE user_id = $1 AND version = $2")
        .bind(user)
        .bind(version)
        .bind(auth_data)
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks a version deleted and drops its keys; false if there was none.
pub async fn delete_version(conn: &mut AnyConnection, user: &str, version: i64) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE backup_versions SET deleted = 1 WHERE user_id = $1 AND version = $2 AND deleted = 0",
    )
    .bind(user)
    .bind(version)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    delete_keys(conn, user, version, None, None).await?;
    Ok(done > 0)
}

/// Moves a version's etag on (and, on PostgreSQL, locks its row until the
/// transaction ends, so key writes to one version queue).
pub async fn bump_etag(conn: &mut AnyConnection, user: &str, version: i64) -> Result<()> {
    sqlx::query("UPDATE backup_versions SET etag = etag + 1 WHERE user_id = $1 AND version = $2")
        .bind(user)
        .bind(version)
        .execute(conn)
        .await?;
    Ok(())
}

/// How many keys a version holds.
pub async fn count(conn: &mut AnyConnection, user: &str, version: i64) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM backup_keys WHERE user_id = $1 AND version = $2")
        .bind(user)
        .bind(version)
        .fetch_one(conn)
        .await?)
}

/// The rank of a stored key, if there is one.
pub async fn key_rank(
    conn: &mut AnyConnection,
    user: &str,
    version: i64,
    room: &str,
    session: &str,
) -> Result<Option<KeyRank>> {
    let row: Option<(i64, i64, i64)> = sqlx::query_as(
        "SELECT is_verified, first_message_index, forwarded_count FROM backup_keys \
         WHERE user_id = $1 AND version = $2 AND room_id = $3 AND session_id = $4",
    )
    .bind(user)
    .bind(version)
    .bind(room)
    .bind(session)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(v, i, f)| KeyRank { is_verified: v != 0, first_message_index: i, forwarded_count: f }))
}

/// Stores (or replaces) one key.
pub async fn put_key(
    conn: &mut AnyConnection,
    user: &str,
    version: i64,
    room: &str,
    session: &str,
    rank: KeyRank,
    key_data: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO backup_keys (user_id, version, room_id, session_id, first_message_index, \
           forwarded_count, is_verified, key_data) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (user_id, version, room_id, session_id) DO UPDATE SET \
           first_message_index = excluded.first_message_index, forwarded_count = excluded.forwarded_count, \
           is_verified = excluded.is_verified, key_data = excluded.key_data",
    )
    .bind(user)
    .bind(version)
    .bind(room)
    .bind(session)
    .bind(rank.first_message_index)
    .bind(rank.forwarded_count)
    .bind(i64::from(rank.is_verified))
    .bind(key_data)
    .execute(conn)
    .await?;
    Ok(())
}

/// The rows of a version, of one room, or of one session.
fn scope_filter(room: Option<&str>, session: Option<&str>) -> &'static str {
    match (room, session) {
        (Some(_), Some(_)) => " AND room_id = $3 AND session_id = $4",
        (Some(_), None) => " AND room_id = $3",
        _ => "",
    }
}

/// Stored keys of a version: (room, session, key data JSON), optionally of
/// one room or one session only.
pub async fn keys(
    conn: &mut AnyConnection,
    user: &str,
    version: i64,
    room: Option<&str>,
    session: Option<&str>,
) -> Result<Vec<(String, String, String)>> {
    let sql = format!(
        "SELECT room_id, session_id, key_data FROM backup_keys WHERE user_id = $1 AND version = $2{} \
         ORDER BY room_id, session_id",
        scope_filter(room, session)
    );
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(user).bind(version);
    if let Some(room) = room {
        query = query.bind(room);
        if let Some(session) = session {
            query = query.bind(session);
        }
    }
    Ok(query.fetch_all(conn).await?)
}

/// Deletes keys of a version (all, one room's, or one session's); returns
/// how many went.
pub async fn delete_keys(
    conn: &mut AnyConnection,
    user: &str,
    version: i64,
    room: Option<&str>,
    session: Option<&str>,
) -> Result<u64> {
    let sql =
        format!("DELETE FROM backup_keys WHERE user_id = $1 AND version = $2{}", scope_filter(room, session));
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(user).bind(version);
    if let Some(room) = room {
        query = query.bind(room);
        if let Some(session) = session {
            query = query.bind(session);
        }
    }
    Ok(query.execute(conn).await?.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::KeyRank;

    fn rank(is_verified: bool, first_message_index: i64, forwarded_count: i64) -> KeyRank {
        KeyRank { is_verified, first_message_index, forwarded_count }
    }

    #[test]
    fn replacement_follows_the_spec_order() {
        // Verification first, whatever the index.
        assert!(rank(true, 9, 9).replaces(&rank(false, 0, 0)));
        assert!(!rank(false, 0, 0).replaces(&rank(true, 9, 9)));
        // Then the lower first message index.
        assert!(rank(false, 1, 5).replaces(&rank(false, 2, 0)));
        assert!(!rank(false, 3, 0).replaces(&rank(false, 2, 5)));
        // Then the fewer forwards; an equal key changes nothing.
        assert!(rank(true, 2, 0).replaces(&rank(true, 2, 1)));
        assert!(!rank(true, 2, 1).replaces(&rank(true, 2, 1)));
    }
}
