//! The one place where [`Error`] becomes a Matrix error response:
//! `{"errcode", "error", ...}` with the right HTTP status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::Error;

impl Error {
    /// HTTP status and Matrix errcode of this error.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::NotJson(_) => (StatusCode::BAD_REQUEST, "M_NOT_JSON"),
            Self::BadJson(_) => (StatusCode::BAD_REQUEST, "M_BAD_JSON"),
            Self::MissingParam(_) => (StatusCode::BAD_REQUEST, "M_MISSING_PARAM"),
            Self::InvalidParam(_) => (StatusCode::BAD_REQUEST, "M_INVALID_PARAM"),
            Self::MissingToken => (StatusCode::UNAUTHORIZED, "M_MISSING_TOKEN"),
            Self::UnknownToken | Self::ExpiredToken => (StatusCode::UNAUTHORIZED, "M_UNKNOWN_TOKEN"),
            Self::Forbidden(_) | Self::RegistrationDisabled => (StatusCode::FORBIDDEN, "M_FORBIDDEN"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "M_NOT_FOUND"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "M_UNKNOWN"),
            Self::BadAlias(_) => (StatusCode::BAD_REQUEST, "M_BAD_ALIAS"),
            Self::RoomInUse(_) => (StatusCode::BAD_REQUEST, "M_ROOM_IN_USE"),
            Self::UnsupportedRoomVersion(_) => (StatusCode::BAD_REQUEST, "M_UNSUPPORTED_ROOM_VERSION"),
            Self::Unrecognized => (StatusCode::NOT_FOUND, "M_UNRECOGNIZED"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "M_UNRECOGNIZED"),
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "M_TOO_LARGE"),
            Self::LimitExceeded { .. } => (StatusCode::TOO_MANY_REQUESTS, "M_LIMIT_EXCEEDED"),
            Self::InvalidUsername(_) => (StatusCode::BAD_REQUEST, "M_INVALID_USERNAME"),
            Self::UserInUse => (StatusCode::BAD_REQUEST, "M_USER_IN_USE"),
            Self::UserDeactivated => (StatusCode::FORBIDDEN, "M_USER_DEACTIVATED"),
            Self::GuestAccessForbidden => (StatusCode::FORBIDDEN, "M_GUEST_ACCESS_FORBIDDEN"),
            Self::InvalidRegistrationToken => (StatusCode::UNAUTHORIZED, "M_FORBIDDEN"),
            Self::Uia(_) => (StatusCode::UNAUTHORIZED, "M_FORBIDDEN"),
            Self::CannotOverwriteMedia => (StatusCode::CONFLICT, "M_CANNOT_OVERWRITE_MEDIA"),
            Self::NotYetUploaded => (StatusCode::GATEWAY_TIMEOUT, "M_NOT_YET_UPLOADED"),
            Self::Unknown(_) => (StatusCode::BAD_REQUEST, "M_UNKNOWN"),
            Self::RemoteUnavailable(_) => (StatusCode::BAD_GATEWAY, "M_UNKNOWN"),
            Self::RemoteTooLarge(_) => (StatusCode::BAD_GATEWAY, "M_TOO_LARGE"),
            Self::RemoteTimeout(_) => (StatusCode::GATEWAY_TIMEOUT, "M_UNKNOWN"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "M_UNAUTHORIZED"),
            Self::InvalidSignature(_) => (StatusCode::BAD_REQUEST, "M_INVALID_SIGNATURE"),
            Self::IncompatibleRoomVersion { .. } => (StatusCode::BAD_REQUEST, "M_INCOMPATIBLE_ROOM_VERSION"),
            Self::UnableToAuthoriseJoin(_) => (StatusCode::BAD_REQUEST, "M_UNABLE_TO_AUTHORISE_JOIN"),
            Self::UnableToGrantJoin(_) => (StatusCode::BAD_REQUEST, "M_UNABLE_TO_GRANT_JOIN"),
            Self::MissingPrevEvents(_) => (StatusCode::BAD_REQUEST, "M_BAD_JSON"),
            Self::UnknownPos(_) => (StatusCode::BAD_REQUEST, "M_UNKNOWN_POS"),
            Self::ServerControlled(_) => (StatusCode::METHOD_NOT_ALLOWED, "M_BAD_JSON"),
            Self::WrongRoomKeysVersion { .. } => (StatusCode::FORBIDDEN, "M_WRONG_ROOM_KEYS_VERSION"),
            Self::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "M_UNKNOWN"),
            Self::Database(_) | Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "M_UNKNOWN"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, errcode) = self.status_and_code();
        let body: Value = match &self {
            Self::Uia(challenge) => serde_json::to_value(challenge.as_ref()).unwrap_or_else(|_| json!({})),
            Self::UnknownToken | Self::ExpiredToken => {
                let soft_logout = matches!(self, Self::ExpiredToken);
                json!({ "errcode": errcode, "error": self.to_string(), "soft_logout": soft_logout })
            }
            Self::LimitExceeded { retry_after_ms } => {
                json!({ "errcode": errcode, "error": self.to_string(), "retry_after_ms": retry_after_ms })
            }
            Self::IncompatibleRoomVersion { room_version } => {
                json!({ "errcode": errcode, "error": self.to_string(), "room_version": room_version })
            }
            Self::WrongRoomKeysVersion { current_version } => json!({
                "errcode": errcode,
                "error": self.to_string(),
                "current_version": current_version,
            }),
            Self::Database(_) | Self::Internal(_) => {
                tracing::error!(error = %self, "request failed");
                json!({ "errcode": errcode, "error": "Internal server error" })
            }
            _ => json!({ "errcode": errcode, "error": self.to_string() }),
        };
        let too_large = matches!(self, Self::TooLarge(_));
        let mut response = (status, axum::Json(body)).into_response();
        // The rest of an oversized body is never read: the connection cannot
        // carry another request, so say so rather than let a client reuse it.
        if too_large {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Self::LimitExceeded { retry_after_ms } = self {
            let secs = retry_after_ms.div_ceil(1000).to_string();
            if let Ok(v) = HeaderValue::from_str(&secs) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}
