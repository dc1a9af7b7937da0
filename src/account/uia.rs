//! User-interactive authentication (spec: client-server API, "User-Interactive
//! Authentication API"). A request that needs it is answered 401 with the flows
//! and a session until one flow's stages are all completed; sessions live in the
//! database and are bound to one purpose and one user, so a session started to
//! change a password cannot authorise deleting devices.

use ruma::api::client::uiaa::{AuthData, UserIdentifier};
use serde_json::json;

use super::{Requester, check_password, local_localpart};
use crate::error::{Error, Result, UiaChallenge, UiaFlow};
use crate::state::AppState;
use crate::storage::{self, uia};

/// Stage types seqline offers.
pub const DUMMY: &str = "m.login.dummy";
/// Password stage.
pub const PASSWORD: &str = "m.login.password";
/// Registration-token stage.
pub const REGISTRATION_TOKEN: &str = "m.login.registration_token";

/// Sessions older than this are discarded.
const SESSION_LIFETIME_MS: i64 = 30 * 60 * 1000;

/// What a UIA session authorises: a session completed for one request
/// cannot authorise another (deleting other devices than the ones it was
/// started for, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose<'a> {
    /// Creating an account.
    Register,
    /// Changing the password.
    ChangePassword,
    /// Deleting these devices.
    DeleteDevices(&'a [&'a str]),
    /// Replacing the cross-signing keys.
    ReplaceCrossSigningKeys,
    /// Deactivating the account.
    Deactivate,
}

impl Purpose<'_> {
    /// What the session row records: the kind of request and, for device
    /// deletion, a digest of the (sorted, distinct) device ids.
    fn key(self) -> String {
        match self {
            Self::Register => "register".into(),
            Self::ChangePassword => "password".into(),
            Self::ReplaceCrossSigningKeys => "cross_signing".into(),
            Self::Deactivate => "deactivate".into(),
            Self::DeleteDevices(ids) => {
                use sha2::Digest as _;
                let mut ids = ids.to_vec();
                ids.sort_unstable();
                ids.dedup();
                let mut hash = sha2::Sha256::new();
                for id in ids {
                    hash.update(id.as_bytes());
                    hash.update([0]);
                }
                let digest = hash.finalize();
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                format!("delete_devices:{hex}")
            }
        }
    }
}

/// A completed UIA session. The operation it authorised calls
/// [`Grant::finish`] once it has succeeded; until then the session stays, so a
/// client retrying after a failure is not asked to authenticate again.
#[must_use = "finish the grant once the operation succeeded"]
#[derive(Debug)]
pub struct Grant {
    session_id: String,
}

impl Grant {
    /// Ends the session (and sweeps out stale ones).
    pub async fn finish(self, state: &AppState) -> Result<()> {
        uia::delete(&state.db, &self.session_id, storage::now_ms() - SESSION_LIFETIME_MS).await
    }
}

/// Runs one round of UIA. `Ok(grant)` means a flow is complete and the
/// operation may proceed; otherwise the error is the 401 challenge (or a plain
/// error for a session or identity that does not belong here).
pub async fn authorize(
    state: &AppState,
    purpose: Purpose<'_>,
    requester: Option<&Requester>,
    flows: &[&[&str]],
    auth: Option<&AuthData>,
) -> Result<Grant> {
    let user = requester.map(|r| r.user_id.as_str());
    let now = storage::now_ms();
    let (session_id, mut completed) = match auth.and_then(AuthData::session) {
        Some(id) => {
            let row = uia::get(&state.db, id)
                .await?
                .filter(|row| now - row.created_ts < SESSION_LIFETIME_MS)
                .ok_or_else(|| Error::InvalidParam("Unknown or expired UIA session".into()))?;
            if row.purpose != purpose.key() || row.user_id.as_deref() != user {
                return Err(Error::Forbidden("This UIA session was started for another request".into()));
            }
            (id.to_owned(), row.completed)
        }
        None => {
            let id = new_session_id();
            uia::create(&state.db, &id, &purpose.key(), user, now).await?;
            (id, Vec::new())
        }
    };
    let challenge = |completed: Vec<String>, error: Option<(&'static str, String)>| {
        let (errcode, error) = error.map_or((None, None), |(c, m)| (Some(c), Some(m)));
        Error::Uia(Box::new(UiaChallenge {
            flows: flows
                .iter()
                .map(|f| UiaFlow { stages: f.iter().map(|s| (*s).to_owned()).collect() })
                .collect(),
            params: json!({}),
            session: session_id.clone(),
            completed,
            errcode,
            error,
        }))
    };
    let offered = |stage: &str| flows.iter().any(|f| f.contains(&stage));

    if let Some(auth) = auth {
        let outcome = match auth {
            AuthData::Dummy(_) if offered(DUMMY) => Ok(DUMMY),
            AuthData::RegistrationToken(t) if offered(REGISTRATION_TOKEN) => {
                if state.settings.registration_tokens.iter().any(|known| known == &t.token) {
                    Ok(REGISTRATION_TOKEN)
                } else {
                    Err(("M_FORBIDDEN", "Invalid registration token".to_owned()))
                }
            }
            AuthData::Password(p) if offered(PASSWORD) => match (&p.identifier, requester) {
                (UserIdentifier::Matrix(id), Some(requester)) => {
                    let localpart = local_localpart(&id.user, &state.settings.server_name)?;
                    if localpart != requester.user_id.localpart() {
                        return Err(Error::Forbidden(
                            "The identifier does not match the logged-in user".into(),
                        ));
                    } else {
                        match check_password(state, &localpart, &p.password).await {
                            Ok(_) => Ok(PASSWORD),
                            Err(Error::Forbidden(msg)) => Err(("M_FORBIDDEN", msg)),
                            Err(e) => return Err(e),
                        }
                    }
                }
                _ => Err((
                    "M_FORBIDDEN",
                    "Only m.id.user identifiers of the logged-in user are accepted".to_owned(),
                )),
            },
            AuthData::FallbackAcknowledgement(_) => Err(("M_FORBIDDEN", "No stage was completed".to_owned())),
            other => Err((
                "M_UNRECOGNIZED",
                format!(
                    "Stage {} is not offered here",
                    other.auth_type().map_or_else(|| "?".to_owned(), |t| t.to_string())
                ),
            )),
        };
        match outcome {
            Ok(stage) => {
                if !completed.iter().any(|s| s == stage) {
                    completed.push(stage.to_owned());
                    uia::set_completed(&state.db, &session_id, &completed).await?;
                }
            }
            Err(error) => return Err(challenge(completed, Some(error))),
        }
    }

    let done = flows.iter().any(|flow| flow.iter().all(|stage| completed.iter().any(|c| c == stage)));
    if done { Ok(Grant { session_id }) } else { Err(challenge(completed, None)) }
}

fn new_session_id() -> String {
    use base64::Engine;
    use rand::Rng;
    let mut bytes = [0u8; 18];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
