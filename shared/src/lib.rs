//! Dhukuti's shared core: the rules every function runs.
//!
//! - [`domain`]: one module per resource (account, payments, ...), no HTTP
//!   and no AWS types: it talks to the [`store::Store`] port only.
//! - [`limits`]: per-key rate limits and the public routes' limits, as
//!   counts in the store (the HTTP edge, crate `edge`, answers with them).
//! - [`store`]: the storage port and its backends.
//! - [`ids`], [`money`], [`time`]: the value types on the wire;
//!   [`fields`]: the contract's field rules, shared by requests and responses.

// Lifecycles read as named steps (issue 38): no function over 100 lines
// (shared/clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod app;
pub mod aws;
pub mod blobs;
pub mod domain;
pub mod fields;
pub mod ids;
pub mod keys;
pub mod kinds;
pub mod lambda;
pub mod limits;
pub mod logging;
pub mod money;
#[cfg(feature = "pdf")]
pub mod pdf;
pub mod providers;
pub mod queue;
pub mod refusal;
pub mod secrets;
pub mod store;
#[cfg(any(test, feature = "testkit"))]
pub mod testenv;
pub mod time;
pub mod tls;
pub mod webhooks;

pub use app::{AppState, Config, Deps};
