//! Acting as another server: a test that plays a second seqline server
//! (`remote`) toward a `resident` one signs its requests (X-Matrix) and its
//! PDUs with the remote server's own key, so the resident takes them as that
//! server's.

use serde_json::{Value, json};

use crate::api::enc;
use crate::federation::{FedServer, now_ms, x_matrix};
use crate::pdu;

/// Another seqline server's identity, for tests that act as that server:
/// requests to `resident` signed with its key, PDUs signed with it.
pub struct Acting<'a> {
    /// The server the requests go to.
    pub resident: &'a FedServer,
    /// The server acted as.
    pub remote: &'a FedServer,
    /// The remote server's key id and signing key.
    pub key: (String, ed25519_dalek::SigningKey),
}

impl<'a> Acting<'a> {
    pub fn new(resident: &'a FedServer, remote: &'a FedServer) -> Self {
        Self { resident, remote, key: remote.signing_key() }
    }

    /// A federation request from the remote server to the resident.
    pub async fn call(&self, method: &str, uri: &str, body: Option<&Value>) -> (u16, Value) {
        let auth = x_matrix(&self.remote.name, &self.resident.name, &self.key, method, uri, body);
        self.resident.send(method, uri, Some(auth), body).await
    }

    /// Signs `pdu` as the remote server; answers its event id.
    pub fn sign(&self, pdu: &mut Value) -> String {
        pdu::sign(pdu, &self.remote.name, &self.key.0, &self.key.1)
    }

    /// A transaction of `pdus`; answers the per-PDU results.
    pub async fn send_txn(&self, txn: &str, pdus: &[&Value]) -> (u16, Value) {
        let body = json!({ "origin": self.remote.name, "origin_server_ts": now_ms(), "pdus": pdus });
        self.call("PUT", &format!("/_matrix/federation/v1/send/{txn}"), Some(&body)).await
    }

    /// The make_join template (v11 and v12 asked for) of `user` in `room`.
    pub async fn make_join(&self, room: &str, user: &str) -> (u16, Value) {
        let uri = format!("/_matrix/federation/v1/make_join/{}/{}?ver=11&ver=12", enc(room), enc(user));
        self.call("GET", &uri, None).await
    }

    /// send_join (v2) of the signed `join` under its id `join_id`.
    pub async fn send_join(&self, room: &str, join_id: &str, join: &Value) -> (u16, Value) {
        let uri = format!("/_matrix/federation/v2/send_join/{}/{}", enc(room), enc(join_id));
        self.call("PUT", &uri, Some(join)).await
    }

    /// `user` of the remote server joins `room` (a v11 or v12 template) by
    /// make_join and send_join; answers the join's event id, the join and the
    /// send_join answer.
    pub async fn join(&self, room: &str, user: &str) -> (String, Value, Value) {
        let (status, template) = self.make_join(room, user).await;
        assert_eq!(status, 200, "{template}");
        let mut join = template["event"].clone();
        let join_id = self.sign(&mut join);
        let (status, answer) = self.send_join(room, &join_id, &join).await;
        assert_eq!(status, 200, "{answer}");
        (join_id, join, answer)
    }
}
