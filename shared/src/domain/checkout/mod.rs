//! Checkout sessions: what a merchant creates (`POST /v1/checkout`) so a
//! customer can pay on the hosted page or go straight to a provider.
//!
//! Stored at `CS#<id>` / `CS` (the hosted page and provider callbacks find
//! it by id alone) and listed through `gsi1` on `PROJ#<project>#<mode>#CS`,
//! newest first because ids sort by time.
//!
//! Rules (decisions.md, "Checkout sessions"):
//! - a session lives [`SESSION_LIFETIME`]; once `expires_at` passed, a
//!   `pending` or `initiated` session is `expired`: reads show it at once
//!   and persist it with a conditional update ([`find`]);
//! - `expire` moves `pending|initiated` to `expired` with a conditional
//!   write; a final session is answered unchanged;
//! - a key's `spend_cap_paisa` bounds the volume it creates per calendar
//!   month (UTC), enforced by a counter updated in the same transaction as
//!   the session insert, so concurrent creations cannot pass it.

mod expiry;
#[cfg(test)]
mod narrowed_tests;
mod providers;
mod sessions;
pub mod stats;
#[cfg(test)]
mod tests;

pub use expiry::{
    LinkUses, OPEN_SHARDS, due_for_expiry, expire, expire_due, has_open_sessions, list,
    release_link_use,
};
#[cfg(test)]
use expiry::{expire_in, list_in};
pub(crate) use expiry::{open_partition, open_partitions};
pub(crate) use providers::providers_in;
pub use providers::{ProviderAvailability, offered, providers};
pub use sessions::{
    Address, CheckoutError, CheckoutSession, CheckoutSessionView, CreateCheckout, Creator,
    CustomerInput, Flow, SessionStatus, SpendCounter, StoredAddress, ValidCheckout, check_amount,
    check_metadata, check_url, create, failed_at, find, find_any, new_session, spend_op,
    validate_create,
};
pub(crate) use sessions::{create_bound_in, create_in, find_any_at, find_at};

/// How long a session can be paid.
pub const SESSION_LIFETIME: chrono::Duration = chrono::Duration::minutes(30);
/// Upper bound of any session: NPR 10,00,000 (ten lakh).
pub const MAX_AMOUNT_PAISA: i64 = 100_000_000;
/// Khalti's minimum (Rs 10).
pub const KHALTI_MIN_AMOUNT_PAISA: i64 = crate::providers::khalti::MIN_AMOUNT_PAISA;
/// Sandbox fonepay moves real money: at most NPR 1,000 a payment.
pub const FONEPAY_SANDBOX_MAX_PAISA: i64 = super::account::SANDBOX_FONEPAY_MAX_PAYMENT_PAISA;
pub const MAX_METADATA_KEYS: usize = 50;
pub const MAX_METADATA_KEY_LEN: usize = 40;
pub const MAX_METADATA_VALUE_LEN: usize = 500;
/// Default page size of `GET /v1/sessions` (spec, Limits).
pub const DEFAULT_PAGE: usize = 25;
/// Tries of the create transaction when DynamoDB reports a conflict on the
/// spend counter (another creation of the same key at the same moment).
const CONFLICT_TRIES: usize = 4;
