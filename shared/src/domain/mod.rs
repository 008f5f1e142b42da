//! The rules of each resource, on the [`Store`](crate::store::Store) port
//! only: no HTTP, no AWS types.

pub mod account;
pub mod active;
pub mod analytics;
pub mod attempts;
pub mod billing;
pub mod checkout;
pub mod clocks;
pub mod credentials;
pub mod dashboard;
pub mod fees;
pub mod fonepay_cap;
pub mod idempotency;
pub mod invoices;
pub mod links;
pub mod listing;
pub mod lists_migration;
pub mod mail;
pub mod mobile;
pub mod notices;
pub mod outbox;
pub mod payments;
pub mod qr;
pub mod reconciliation;
pub mod record;
pub mod refunds;
pub mod reports;
#[cfg(test)]
mod roundtrip;
pub mod short_links;
pub mod sms;
#[cfg(test)]
mod stored_shapes;
pub mod streams;
pub mod totals;
pub mod webhooks;

pub use crate::kinds::{Mode, Provider, Tenant};
pub use record::Window;
