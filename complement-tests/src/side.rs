//! One user on one server (seqline or Synapse), as a test drives them
//! through the client API.

use serde_json::{Value, json};

use crate::api::room_path;
use crate::federation::FedServer;
use crate::harness::User;
use crate::synapse::Synapse;

/// One user on one server, as the test drives it.
pub enum Side<'a> {
    /// A seqline user.
    Seqline(&'a FedServer, &'a User),
    /// A Synapse user (its access token).
    Synapse(&'a Synapse, &'a str),
}

impl Side<'_> {
    /// `GET path` as the user.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        match self {
            Side::Seqline(server, user) => server.server.get(path, Some(&user.token)).await,
            Side::Synapse(server, token) => server.get(path, Some(token)).await,
        }
    }

    /// `PUT path` as the user.
    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        match self {
            Side::Seqline(server, user) => server.server.put(path, Some(&user.token), body).await,
            Side::Synapse(server, token) => server.put(path, Some(token), body).await,
        }
    }

    /// `POST path` as the user.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        match self {
            Side::Seqline(server, user) => server.server.post(path, Some(&user.token), body).await,
            Side::Synapse(server, token) => server.post(path, Some(token), body).await,
        }
    }

    /// Sends a message; answers its event id.
    pub async fn say(&self, room: &str, txn: &str, body: &str) -> String {
        let path = room_path(room, &format!("/send/m.room.message/{txn}"));
        let (status, sent) = self.put(&path, json!({ "msgtype": "m.text", "body": body })).await;
        assert_eq!(status, 200, "{sent}");
        sent["event_id"].as_str().unwrap().to_owned()
    }
}
