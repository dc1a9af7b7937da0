//! Simplified sliding sync (MSC4186, the protocol Element X and
//! matrix-rust-sdk speak; `../shared/SLIDING-SYNC.md` is the study).
//!
//! Built so far: the request body read into bounded types ([`request`]) and
//! the per-connection store of what each client holds, kept per position
//! ([`conn`]). Not yet: the endpoint, the room lists, the per-room data and
//! the extensions (issue 29).

pub mod conn;
pub mod request;
