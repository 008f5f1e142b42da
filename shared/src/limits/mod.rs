//! How much a caller may ask: per-key request rates ([`rate`]) and the
//! public routes' budgets per client, session and link ([`public`]),
//! counted in the store (or in memory on the one-process local gateway).

pub mod public;
pub mod rate;
