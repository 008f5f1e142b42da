//! Pending-payment SMS reminders (spec "SMS", decisions "SMS reminders").
//!
//! `POST /v1/sms/notify-pending-payment` runs [`notify`]: it validates the
//! body, then applies the guards in this order:
//! 1. the recipient (normalized Nepali mobile) has a pending checkout
//!    session on this project and mode created in the last 24 h
//!    ([`pending_session`](guards::pending_session)). When `checkoutUrl` names one of the project's
//!    sessions (`/c/<cs_id>`) it must be that one; otherwise the project's
//!    sessions on `gsi1` are read newest first, from the id of "24 h ago",
//!    in bounded pages. The reminder is bound to the session found;
//! 2. `checkoutUrl`'s host is the project's checkout host (the public base
//!    URL's host), and a session it names is one of this project's. There
//!    are no verified custom domains yet, so only the canonical host is
//!    accepted;
//! 3. the abuse limits: at most [`Limits::per_recipient_per_day`] per
//!    recipient in any rolling 24 h (a window item of the recipient's
//!    recent send times, written with a version condition) and
//!    [`Limits::per_merchant_per_hour`] per merchant per (UTC) hour (a
//!    fixed-window counter), per mode, taken together in one transaction,
//!    so concurrent requests never pass them and a refused request takes
//!    nothing;
//! 4. live only: one unit of the merchant's monthly plan quota
//!    ([`Plan::sms_monthly_quota`], UTC calendar month) reserved with a
//!    conditional `ADD`; none left answers `plan_limit_reached`.
//!
//! Sandbox reminders pass guards 1-3 and are stored as `logged`, never
//! queued. Live reminders are stored (`sms_…` at `SMS#<id>` / `SMS`,
//! status `queued`) and their id is queued on [`QueueName::Sms`](crate::queue::QueueName::Sms).
//!
//! The dispatcher ([`dispatch`]) sends one reminder at most once. The
//! provider takes no idempotency key, so the rule is "when in doubt, do
//! not send again":
//! - it claims the record with a conditional write (`queued` → `sending`
//!   with a lease); a duplicate queue message finds it claimed or final
//!   and is dropped;
//! - it reads the bound checkout session: paid, failed or expired since
//!   the request means `cancelled`, nothing sent, the quota unit given back;
//! - it sends, then ends the record with a write conditioned on its claim
//!   (a random id written with the lease):
//!   `sent`; `failed` (a 4xx refusal, or [`MAX_ATTEMPTS`] sends that
//!   certainly did not reach the provider), quota unit given back in the
//!   same transaction; `queued` again after a send that certainly did not
//!   reach it (connection refused, 408, 429, 503), retried by the queue;
//!   `unknown` after a send that may have reached it (a timeout, 5xx other
//!   than 503), never retried, quota unit kept;
//! - a `sending` record whose lease ran out (its dispatcher crashed or
//!   could not record the outcome) may have been sent: it ends `unknown`.
//!
//! A live reminder still waiting 5 minutes after it was queued is queued
//! again by [`requeue_stuck`] (the Scheduler, the local worker): a lost
//! message means a late reminder, not a lost one.

use crate::refusal::{Kind, Refusal};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::queue::QueueError;
use crate::store::StoreError;

mod dispatch;
mod guards;
mod invoice;
mod notify;
mod reminders;
mod request;
#[cfg(test)]
mod tests;

pub use dispatch::{DispatchError, DispatchOutcome, handle_message};
pub use guards::{SmsCount, SmsRecipientWindow, quota_counter, session_in_url};
pub use invoice::{InvoiceSms, InvoiceSmsOutcome, notify_invoice};
pub use notify::{SmsMessage, get, notify};
pub use reminders::{SmsReminder, SmsStatus, list, list_recent, requeue_stuck};
pub use request::normalize_phone;

/// The abuse limits (decisions: 3 per recipient per 24 h, 100 per merchant
/// per hour).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub per_recipient_per_day: i64,
    pub per_merchant_per_hour: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_recipient_per_day: 3,
            per_merchant_per_hour: 100,
        }
    }
}

/// How long a session counts as "recent" for guard 1.
pub const SESSION_WINDOW_HOURS: i64 = 24;
/// Sessions examined per page, and pages at most, for guard 1.
const SESSION_PAGE: usize = 100;
const SESSION_PAGES: usize = 20;
/// Sends tried before a reminder is given up (the SMS queue's
/// `maxReceiveCount`).
pub const MAX_ATTEMPTS: u32 = 5;
/// How long a claimed reminder stays claimed: past the client's timeout,
/// shorter than the queue's visibility timeout (90 s).
pub const LEASE: Duration = Duration::from_secs(60);

const MAX_TEXT_FIELD: usize = 60;
const MAX_URL: usize = 500;
/// Rs 10 crore: a bound against absurd amounts.
const MAX_AMOUNT_MINOR: i64 = 10_000_000_000;

/// The request body (camelCase, unknown fields refused).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NotifyRequest {
    pub customer_phone: String,
    pub shop_name: String,
    pub order_name: String,
    pub amount_minor: i64,
    pub currency: String,
    pub checkout_url: String,
}

/// A validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidNotify {
    /// 10 digits, `97…` or `98…`.
    pub phone: String,
    pub shop_name: String,
    pub order_name: String,
    pub amount_minor: i64,
    pub checkout_url: String,
    /// `host[:port]` of `checkout_url`, lowercase.
    pub checkout_host: String,
}

/// The answer: `{sent, status}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct NotifyOutcome {
    pub sent: bool,
    /// `queued` (live), `logged` (sandbox: nothing is sent) or
    /// `plan_limit_reached` (this month's quota is used).
    #[schema(value_type = String, pattern = "^(queued|logged|plan_limit_reached)$")]
    pub status: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum SmsError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("customerPhone has no pending checkout session on this project in the last 24 hours")]
    PhoneNotOnSession,
    #[error("checkoutUrl must be on this project's checkout host ({allowed})")]
    InvalidCheckoutHost { allowed: String },
    #[error(
        "checkoutUrl names checkout session {given}, which is not a session of this project in this mode"
    )]
    ForeignCheckoutSession { given: String },
    #[error("too many SMS reminders: {which}; retry later")]
    RateLimited {
        which: String,
        retry_after_secs: i64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<SmsError> for Refusal {
    fn from(err: SmsError) -> Self {
        match err {
            SmsError::Invalid { field, message } => Refusal::invalid(field, message),
            e @ SmsError::PhoneNotOnSession => {
                Refusal::new(Kind::Invalid, "phone_not_on_session", e.to_string())
                    .at("customerPhone")
            }
            e
            @ (SmsError::InvalidCheckoutHost { .. } | SmsError::ForeignCheckoutSession { .. }) => {
                Refusal::new(Kind::Invalid, "invalid_checkout_host", e.to_string())
                    .at("checkoutUrl")
            }
            SmsError::RateLimited {
                which,
                retry_after_secs,
            } => Refusal::new(
                Kind::RateLimited,
                "rate_limited",
                format!("Too many SMS reminders ({which}); retry later"),
            )
            .retry_after(u64::try_from(retry_after_secs).unwrap_or(0)),
            SmsError::Store(e) => e.into(),
            SmsError::Queue(e) => e.into(),
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> SmsError {
    SmsError::Invalid {
        field,
        message: message.into(),
    }
}
