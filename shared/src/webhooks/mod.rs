//! The webhook protocol, apart from storage and delivery: how a delivery
//! is signed and verified ([`signature`]) and which receiver URLs may be
//! called at all ([`ssrf`]).

pub mod signature;
pub mod ssrf;
