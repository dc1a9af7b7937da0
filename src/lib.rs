//! seqline: a Matrix homeserver whose rooms are seq lines and whose readers'
//! visibility is a set of ranges on them. See ARCHITECTURE.md for the map.

pub mod account;
pub mod api;
pub mod config;
pub mod error;
pub mod federation;
pub mod media;
pub mod notify;
pub mod outbound;
pub mod preview;
pub mod ratelimit;
pub mod room;
pub mod server;
pub mod signing_key;
pub mod state;
pub mod storage;
pub mod streams;
pub mod sync;

#[cfg(test)]
mod proptests;
