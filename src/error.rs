//! The one error type of seqline. Domain and storage code return it; the API
//! layer turns it into a Matrix error response in exactly one place
//! (`api::error`). Each variant names a failure a client can act on, so the
//! mapping to `errcode` and HTTP status is a plain table.

use serde_json::Value;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request body is not JSON at all.
    #[error("{0}")]
    NotJson(String),
    /// The body is JSON but not the shape the endpoint takes.
    #[error("{0}")]
    BadJson(String),
    /// A required parameter is missing.
    #[error("{0}")]
    MissingParam(String),
    /// A parameter (path, query or body) has an invalid value.
    #[error("{0}")]
    InvalidParam(String),
    /// No access token was supplied.
    #[error("Missing access token")]
    MissingToken,
    /// The access token is not (or no longer) valid.
    #[error("Unknown access token")]
    UnknownToken,
    /// The access token has expired: the client may refresh it (soft logout).
    #[error("The access token has expired")]
    ExpiredToken,
    /// The caller may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The thing asked for does not exist (or is not visible to the caller).
    #[error("{0}")]
    NotFound(String),
    /// The thing to create exists already (an alias, say): 409 M_UNKNOWN.
    #[error("{0}")]
    Conflict(String),
    /// A canonical alias names an alias that does not point to the room.
    #[error("{0}")]
    BadAlias(String),
    /// A room alias given to createRoom is taken: 400 M_ROOM_IN_USE.
    #[error("{0}")]
    RoomInUse(String),
    /// The room version is not one this server supports.
    #[error("{0}")]
    UnsupportedRoomVersion(String),
    /// No such endpoint.
    #[error("Unrecognized request")]
    Unrecognized,
    /// The endpoint exists but not with this method.
    #[error("Method not allowed")]
    MethodNotAllowed,
    /// The request body is over the configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// Rate limited; retry after this many milliseconds.
    #[error("Too many requests")]
    LimitExceeded {
        /// Suggested wait.
        retry_after_ms: u64,
    },
    /// The desired user id is malformed or reserved.
    #[error("{0}")]
    InvalidUsername(String),
    /// The desired user id is taken.
    #[error("User ID already taken")]
    UserInUse,
    /// The account has been deactivated.
    #[error("This account has been deactivated")]
    UserDeactivated,
    /// Guest access is not offered.
    #[error("Guest access is not allowed")]
    GuestAccessForbidden,
    /// The registration token is not valid.
    #[error("Invalid registration token")]
    InvalidRegistrationToken,
    /// Registration is disabled on this server.
    #[error("Registration is disabled")]
    RegistrationDisabled,
    /// User-interactive authentication must (continue to) be completed: the
    /// body says which flows, what is done, and optionally why the last
    /// attempt failed.
    #[error("User-interactive authentication required")]
    Uia(Box<UiaChallenge>),
    /// A request the server cannot make sense of, per the spec's M_UNKNOWN (400).
    #[error("{0}")]
    Unknown(String),
    /// Media created with /create was uploaded already: 409.
    #[error("This media has already been uploaded")]
    CannotOverwriteMedia,
    /// Media created with /create is not uploaded yet: 504 M_NOT_YET_UPLOADED.
    #[error("The media has not been uploaded yet")]
    NotYetUploaded,
    /// Account data the server keeps (`m.push_rules`, `m.fully_read`) written
    /// through the account-data API: 405 M_BAD_JSON, as the spec says.
    #[error("{0}")]
    ServerControlled(String),
    /// A federation request without a valid X-Matrix signature (missing,
    /// malformed, for another destination, or not verifying with the
    /// origin's keys): 401 M_UNAUTHORIZED.
    #[error("{0}")]
    Unauthorized(String),
    /// Another server could not be asked (unreachable, or a bad answer): 502 M_UNKNOWN.
    #[error("{0}")]
    RemoteUnavailable(String),
    /// Another host's answer is larger than we read (a previewed page): 502 M_TOO_LARGE.
    #[error("{0}")]
    RemoteTooLarge(String),
    /// Another host did not answer in time (a previewed page): 504 M_UNKNOWN.
    #[error("{0}")]
    RemoteTimeout(String),
    /// A room's version is not among those the asking server supports
    /// (make_join's `ver`): 400 M_INCOMPATIBLE_ROOM_VERSION with the room's version.
    #[error("Your homeserver does not support the features required to join this room")]
    IncompatibleRoomVersion {
        /// The room's version.
        room_version: String,
    },
    /// A restricted join this server cannot judge: it knows none of the
    /// rooms the join rule allows (make_join, send_join): 400
    /// M_UNABLE_TO_AUTHORISE_JOIN, as the spec says.
    #[error("{0}")]
    UnableToAuthoriseJoin(String),
    /// A restricted join the joiner may make, but no user of this server may
    /// authorise (none in the room with the power to invite): 400
    /// M_UNABLE_TO_GRANT_JOIN, so the joining server tries another.
    #[error("{0}")]
    UnableToGrantJoin(String),
    /// Another server's event points at events this server does not have:
    /// 400 M_BAD_JSON (said per event in a /send answer).
    #[error("{0}")]
    MissingPrevEvents(String),
    /// A key or signature does not verify: 400 M_INVALID_SIGNATURE.
    #[error("{0}")]
    InvalidSignature(String),
    /// A sliding sync `pos` this server does not hold (expired, from before
    /// a restart, of another connection): 400 M_UNKNOWN_POS, and the client
    /// starts the connection again.
    #[error("{0}")]
    UnknownPos(String),
    /// A room-key backup write names a version that is not the current one.
    #[error("Wrong backup version")]
    WrongRoomKeysVersion {
        /// The user's current backup version.
        current_version: String,
    },
    /// The client did not send its request body in time.
    #[error("{0}")]
    RequestTimeout(String),
    /// A database failure: logged, reported as M_UNKNOWN.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Anything else that is our fault.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The 401 body of user-interactive authentication.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UiaChallenge {
    /// Each flow is a list of stage types.
    pub flows: Vec<UiaFlow>,
    /// Stage parameters, by stage type.
    pub params: Value,
    /// The UIA session id.
    pub session: String,
    /// Stages already completed in this session.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub completed: Vec<String>,
    /// Why the previous attempt failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errcode: Option<&'static str>,
    /// Human-readable form of `errcode`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One UIA flow.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UiaFlow {
    /// Stage types, in order.
    pub stages: Vec<String>,
}

impl Error {
    /// The same failure for another request that waited on the same write
    /// (the variants a room write can end in; the rest as internal errors).
    pub fn replicate(&self) -> Error {
        match self {
            Self::NotFound(m) => Self::NotFound(m.clone()),
            Self::Forbidden(m) => Self::Forbidden(m.clone()),
            Self::BadJson(m) => Self::BadJson(m.clone()),
            Self::InvalidParam(m) => Self::InvalidParam(m.clone()),
            Self::TooLarge(m) => Self::TooLarge(m.clone()),
            Self::MissingPrevEvents(m) => Self::MissingPrevEvents(m.clone()),
            other => Self::Internal(other.to_string()),
        }
    }

    /// Whether a write that failed with this error may have left part of
    /// itself in its transaction (a storage or internal failure), so the
    /// transaction must not commit.
    pub fn taints_transaction(&self) -> bool {
        matches!(self, Self::Database(_) | Self::Internal(_))
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Self::Internal(format!("migration failed: {e}"))
    }
}
