//! Black-box test support: the server harness and request helpers.

pub mod api;
pub mod e2ee;
pub mod harness;
pub mod pdu;
