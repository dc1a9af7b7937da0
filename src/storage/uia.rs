//! The `uia_sessions` table: user-interactive-auth sessions, kept in the
//! database so that any seqline process sharing it can continue a session.

use super::Db;
use crate::error::Result;

/// A stored UIA session.
#[derive(Debug, Clone)]
pub struct UiaSessionRow {
    /// What the session authorises.
    pub purpose: String,
    /// The user it was started for (none for registration).
    pub user_id: Option<String>,
    /// Completed stage types.
    pub completed: Vec<String>,
    /// Creation time, ms.
    pub created_ts: i64,
}

/// Starts a session.
pub async fn create(db: &Db, session_id: &str, purpose: &str, user_id: Option<&str>, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO uia_sessions (session_id, purpose, user_id, created_ts) VALUES ($1, $2, $3, $4)",
    )
    .bind(session_id)
    .bind(purpose)
    .bind(user_id)
    .bind(now)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// Loads a session.
pub async fn get(db: &Db, session_id: &str) -> Result<Option<UiaSessionRow>> {
    let row: Option<(String, Option<String>, String, i64)> = sqlx::query_as(
        "SELECT purpose, user_id, completed, created_ts FROM uia_sessions WHERE session_id = $1",
    )
    .bind(session_id)
    .fetch_optional(&mut db.reader())
    .await?;
    Ok(row.map(|(purpose, user_id, completed, created_ts)| UiaSessionRow {
        purpose,
        user_id,
        completed: serde_json::from_str(&completed).unwrap_or_default(),
        created_ts,
    }))
}

/// Records the completed stages.
pub async fn set_completed(db: &Db, session_id: &str, completed: &[String]) -> Result<()> {
    let json = serde_json::to_string(completed).map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    sqlx::query("UPDATE uia_sessions SET completed = $1 WHERE session_id = $2")
        .bind(json)
        .bind(session_id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Ends a session (after the operation it authorised ran), and drops stale ones.
pub async fn delete(db: &Db, session_id: &str, stale_before: i64) -> Result<()> {
    sqlx::query("DELETE FROM uia_sessions WHERE session_id = $1 OR created_ts < $2")
        .bind(session_id)
        .bind(stale_before)
        .execute(&db.pool)
        .await?;
    Ok(())
}
