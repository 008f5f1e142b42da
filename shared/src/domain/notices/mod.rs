//! The billing notices pass (issue 39, parts 5 and 6): every reminder of
//! a billing invoice (due today, before due, overdue), each dunning
//! reminder and the policy's final action, and the trial-ending notice,
//! sent by SMS and email through the existing pipelines.
//!
//! The schedule is `billing::notice_due` (pure `next_notice` over the
//! records billing writes); this module reads it, sends, and records:
//! - [`run_one`]: one schedule record at `now`: the notice due (in real
//!   time only the latest of several due; the earlier are recorded
//!   `skipped`), by SMS and/or email, once per occurrence
//!   (`<invoice>#<kind>#<day>`, the SMS claim and the mail occurrence), so
//!   a retried or concurrent run sends nothing twice; the SMS waits out the
//!   quiet hours and a rate limit (`next_at` moves; the email, already
//!   stored, is found again by its occurrence); dunning started with the
//!   `overdue` notice, each `dunning` notice an attempt, the final action
//!   after the last interval;
//! - [`pass`]: the scheduler's run over the due index, fair across
//!   tenants as `billing::sweep::sweep`;
//! - [`clock::run`]: a test clock's run, subscriptions and notices
//!   interleaved by time.

pub mod clock;
mod pass;
mod send;

use crate::domain::billing::customers::BillingError;
use crate::domain::billing::dunning::DunningError;
use crate::domain::billing::invoice::BillingInvoiceError;
use crate::domain::billing::lifecycle::LifecycleError;
use crate::domain::billing::subscription::SubscriptionError;
use crate::domain::billing::sweep::SweepError;
use crate::domain::mail::MailError;
use crate::domain::sms::SmsError;
use crate::store::StoreError;

pub use pass::{NoticeReport, pass};
pub use send::{RunOne, retry_now, run_one};

/// Why a notice run failed (the next run tries again: nothing was lost).
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Sweep(#[from] SweepError),
    #[error(transparent)]
    Invoice(#[from] BillingInvoiceError),
    #[error(transparent)]
    Dunning(#[from] DunningError),
    #[error(transparent)]
    Subscription(#[from] SubscriptionError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(transparent)]
    Billing(#[from] BillingError),
    #[error(transparent)]
    Sms(#[from] SmsError),
    #[error(transparent)]
    Mail(#[from] MailError),
    #[error("a notice day is outside the calendar")]
    NoDay,
}

#[cfg(test)]
mod tests;
