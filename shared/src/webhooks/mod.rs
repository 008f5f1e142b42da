//! The webhook protocol, apart from storage and delivery: how a delivery
//! is signed and verified ([`signature`]) and which receiver URLs may be
//! called at all ([`ssrf`]), and the client that delivers ([`client`]).
//! Endpoints, deliveries and retries are in `domain::webhooks`.

pub mod client;
pub mod settings;
pub mod signature;
pub mod ssrf;
