//! Black-box test support: the server harness, request helpers, federation
//! helpers, a scriptable fake federation server and a real Synapse as a
//! federation peer.

pub mod acting;
pub mod api;
pub mod e2ee;
pub mod fake;
pub mod federation;
pub mod harness;
pub mod pdu;
pub mod side;
pub mod synapse;
