//! Server ACLs (`m.room.server_acl`): which servers may take part in a room.
//! A server the room's ACL denies is refused at every federation entry point
//! that names the room (joins and leaves through us, its transactions' PDUs,
//! the events and state it asks for).

use ruma::ServerName;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::state::AppState;
use crate::storage::events;

/// Whether `pattern` (`*` any run of characters, `?` one) matches `name`,
/// ignoring case.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) =
        (pattern.to_lowercase().chars().collect(), name.to_lowercase().chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether an `m.room.server_acl` content lets `server` in (the spec's
/// rules: the host without its port; IP literals only with
/// `allow_ip_literals`, true by default; `deny` before `allow`; no `allow`
/// allows nobody).
pub fn allows(content: &Value, server: &ServerName) -> bool {
    let host = server.host();
    if content["allow_ip_literals"].as_bool() == Some(false) && server.is_ip_literal() {
        return false;
    }
    let any = |key: &str| {
        content[key].as_array().into_iter().flatten().filter_map(Value::as_str).any(|p| glob(p, host))
    };
    !any("deny") && any("allow")
}

/// [`check`] in an open room, with its ACL as kept while the room's read
/// epoch stands still (an ACL is state: a new one moves the epoch).
pub async fn check_in(
    state: &AppState,
    view: &crate::room::read::RoomView,
    server: &ServerName,
) -> Result<()> {
    refuse_denied(crate::room::read::server_acl(state, view).await?.as_ref(), server)
}

/// Refuses `server` where the ACL content `acl` (`None`: the room has none)
/// does not let it in.
fn refuse_denied(acl: Option<&Value>, server: &ServerName) -> Result<()> {
    match acl {
        Some(content) if !allows(content, server) => {
            Err(Error::Forbidden(format!("{server} is denied by the room's server ACL")))
        }
        _ => Ok(()),
    }
}

/// Refuses `server` if the room's current ACL does not let it in.
pub async fn check(state: &AppState, room_id: &str, server: &ServerName) -> Result<()> {
    let Some(stored) = events::state_event(&state.db, room_id, "m.room.server_acl", "").await? else {
        return Ok(());
    };
    let event: Value = serde_json::from_str(&stored.json).unwrap_or_default();
    refuse_denied(Some(&event["content"]), server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn name(s: &str) -> &ServerName {
        <&ServerName>::try_from(s).unwrap()
    }

    #[test]
    fn globs_match_the_spec_way() {
        assert!(glob("*", "anything.example"));
        assert!(glob("*.example.org", "matrix.example.org"));
        assert!(!glob("*.example.org", "example.org"));
        assert!(glob("m?trix.org", "MATRIX.org"));
        assert!(!glob("m?trix.org", "maatrix.org"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
    }

    #[test]
    fn deny_wins_and_no_allow_allows_nobody() {
        let acl = json!({ "allow": ["*"], "deny": ["evil.example", "*.evil.example"] });
        assert!(allows(&acl, name("good.example")));
        assert!(allows(&acl, name("good.example:8448")));
        assert!(!allows(&acl, name("evil.example:8448")));
        assert!(!allows(&acl, name("sub.evil.example")));
        assert!(!allows(&json!({ "deny": [] }), name("good.example")));
        // IP literals: allowed unless allow_ip_literals is false.
        assert!(allows(&acl, name("127.0.0.1:8448")));
        let no_ips = json!({ "allow": ["*"], "allow_ip_literals": false });
        assert!(!allows(&no_ips, name("127.0.0.1:8448")));
        assert!(!allows(&no_ips, name("[::1]:8448")));
        assert!(allows(&no_ips, name("good.example")));
    }
}
