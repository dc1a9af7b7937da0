//! Request helpers shared by the black-box tests.

use std::fmt::Write as _;

use serde_json::{Value, json};

/// The v3 client API prefix.
pub const V3: &str = "/_matrix/client/v3";

/// Percent-encodes one path segment (room ids, event ids, state keys).
pub fn enc(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `/_matrix/client/v3/rooms/{room_id}{rest}`.
pub fn room_path(room_id: &str, rest: &str) -> String {
    format!("{V3}/rooms/{}{rest}", enc(room_id))
}

/// Asserts an error response's status and errcode.
#[track_caller]
pub fn assert_error(response: &(u16, Value), status: u16, errcode: &str, what: &str) {
    assert_eq!(
        (response.0, response.1["errcode"].as_str()),
        (status, Some(errcode)),
        "{what}: {}",
        response.1
    );
}

/// Deactivates `user` (whose login is `localpart` / `password`) through the
/// password stage of user-interactive auth, erasing them when `erase`.
pub async fn deactivate(
    server: &crate::harness::Server,
    user: &crate::harness::User,
    localpart: &str,
    password: &str,
    erase: bool,
) {
    let path = format!("{V3}/account/deactivate");
    let (status, flows) = server.post(&path, Some(&user.token), json!({ "erase": erase })).await;
    assert_eq!(status, 401, "{flows}");
    let body = json!({ "erase": erase, "auth": { "type": "m.login.password", "session": flows["session"],
        "password": password, "identifier": { "type": "m.id.user", "user": localpart } } });
    let (status, done) = server.post(&path, Some(&user.token), body).await;
    assert_eq!(status, 200, "{done}");
}

/// An `m.text` message content.
pub fn text(body: &str) -> Value {
    json!({ "msgtype": "m.text", "body": body })
}

pub fn event_id_of(response: &Value) -> String {
    let id = response["event_id"].as_str().unwrap_or_else(|| panic!("no event_id in {response}"));
    assert!(id.starts_with('$'), "{id}");
    id.to_owned()
}

/// Creates a room with `body` as createRoom's; asserts success, returns its id.
pub async fn create_room(
    server: &crate::harness::Server,
    user: &crate::harness::User,
    body: Value,
) -> String {
    let (status, body) = server.post(&format!("{V3}/createRoom"), Some(&user.token), body).await;
    assert_eq!(status, 200, "{body}");
    body["room_id"].as_str().expect("room_id").to_owned()
}

/// Joins a room by id; asserts success.
pub async fn join(server: &crate::harness::Server, user: &crate::harness::User, room: &str) {
    let (status, body) = server.post(&room_path(room, "/join"), Some(&user.token), json!({})).await;
    assert_eq!(status, 200, "{body}");
}

/// One `/sync` that does not wait (`since`: the previous `next_batch`).
pub async fn sync_once(
    server: &crate::harness::Server,
    user: &crate::harness::User,
    since: Option<&str>,
) -> Value {
    let path = match since {
        Some(s) => format!("{V3}/sync?timeout=0&since={}", enc(s)),
        None => format!("{V3}/sync?timeout=0"),
    };
    let (status, body) = server.get(&path, Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits (up to 30 s) until `check` answers `Some`, asking again every
/// 100 ms: for what another server does in its own time.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The bodies of the `m.room.message` events of a `/messages` page taken
/// backwards (`dir=b`), oldest first.
pub fn message_bodies(page: &Value) -> Vec<String> {
    let mut out: Vec<String> = page["chunk"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "m.room.message")
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_owned))
        .collect();
    out.reverse();
    out
}

/// The ids of `room`'s joined members as `user` reads them
/// (`/joined_members`), sorted.
pub async fn joined_member_ids(
    server: &crate::harness::Server,
    user: &crate::harness::User,
    room: &str,
) -> Vec<String> {
    let (status, body) = server.get(&room_path(room, "/joined_members"), Some(&user.token)).await;
    assert_eq!(status, 200, "{body}");
    let mut members: Vec<String> =
        body["joined"].as_object().into_iter().flat_map(|m| m.keys().cloned()).collect();
    members.sort_unstable();
    members
}

/// Every read of `room`'s timeline `user` has, checked against each other:
/// `/messages` backwards to the start and forwards from it give the same
/// events in the same order; `/event` gives each of them; `/context` of each
/// finds it between the same neighbours; an initial `/sync` (joined or
/// left) ends with the same events. Answers the events' ids in order, for
/// the caller to assert what they hold.
pub async fn reads_agree(
    server: &crate::harness::Server,
    user: &crate::harness::User,
    room: &str,
) -> Vec<String> {
    let page_all = |dir: &'static str| async move {
        let mut ids: Vec<String> = Vec::new();
        let mut from = String::new();
        for _ in 0..50 {
            let path = room_path(room, &format!("/messages?dir={dir}&limit=20{from}"));
            let (status, page) = server.get(&path, Some(&user.token)).await;
            assert_eq!(status, 200, "{page}");
            ids.extend(
                page["chunk"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| e["event_id"].as_str().unwrap_or_default().to_owned()),
            );
            let Some(end) = page["end"].as_str() else { return ids };
            from = format!("&from={}", enc(end));
        }
        panic!("more than 50 pages of {room}");
    };
    let mut backwards = page_all("b").await;
    backwards.reverse();
    let forwards = page_all("f").await;
    assert_eq!(forwards, backwards, "/messages forwards and backwards differ for {}", user.user_id);
    for (i, id) in forwards.iter().enumerate() {
        let (status, event) =
            server.get(&room_path(room, &format!("/event/{}", enc(id))), Some(&user.token)).await;
        assert_eq!((status, event["event_id"].as_str()), (200, Some(id.as_str())), "/event {id}: {event}");
        let (status, context) =
            server.get(&room_path(room, &format!("/context/{}?limit=2", enc(id))), Some(&user.token)).await;
        assert_eq!(status, 200, "/context {id}: {context}");
        assert_eq!(context["event"]["event_id"], id.as_str(), "{context}");
        let before = context["events_before"][0]["event_id"].as_str();
        let after = context["events_after"][0]["event_id"].as_str();
        let want_before = i.checked_sub(1).map(|j| forwards[j].as_str());
        assert_eq!(
            (before, after),
            (want_before, forwards.get(i + 1).map(String::as_str)),
            "/context {id}: {context}"
        );
    }
    let body = sync_once(server, user, None).await;
    let synced = ["join", "leave"].iter().find_map(|kind| body["rooms"][kind].get(room));
    if let Some(synced) = synced {
        let tail: Vec<String> = synced["timeline"]["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["event_id"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert!(forwards.ends_with(&tail), "/sync's timeline {tail:?} is not the end of {forwards:?}");
    }
    forwards
}
