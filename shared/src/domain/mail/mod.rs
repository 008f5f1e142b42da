//! Billing email (issue 39, item 6): a message record, its queue, the
//! dispatcher's claim and outcome, and the per-project suppression and
//! verified lists. Reference: `docs/mail.md`.
//!
//! - [`send_billing_mail`] renders a billing reminder (English or Nepali),
//!   stores it (`mail_…` at `MAIL#<id>` / `MAIL`, listed per project and
//!   mode on `gsi1`) with its occurrence (`MAILOCC#…`: the caller's key,
//!   so a retried sweep finds the first message instead of making a
//!   second) in one transaction, and queues its id on
//!   [`QueueName::Mail`](crate::queue::QueueName::Mail). An address the
//!   project suppressed is stored `suppressed` and never queued.
//! - [`handle_message`] (the mail dispatcher) claims a `queued` message
//!   (`queued` → `sending`, with a lease and a claim id), re-reads the
//!   suppression list (and, for sandbox mail sent through SES, the
//!   project's verified list), sends it once and ends the claim:
//!   `sent`; `failed` (refused, or [`MAX_ATTEMPTS`] sends that certainly
//!   did not leave); `queued` again after a send that certainly did not
//!   leave (retried by the queue); `unknown` after a send that may have
//!   left (a timeout, a 5xx) or a claim whose lease ran out. `unknown` is
//!   never sent again: a retried batch sends nothing twice.
//! - The same queue carries SES's bounce and complaint notifications (SNS
//!   delivers them there on AWS; the local simulator's control endpoint
//!   does the same): a permanent bounce or a complaint suppresses the
//!   address for the message's project ([`handle_feedback`]).

use crate::queue::QueueError;
use crate::store::StoreError;

mod dispatch;
mod feedback;
mod message;
mod send;
#[cfg(test)]
mod tests;

pub use dispatch::{DispatchError, DispatchOutcome, handle_message};
pub use feedback::{
    FeedbackOutcome, MailSuppression, MailVerified, SuppressReason, handle_feedback, is_suppressed,
    is_verified, suppress, verify_address,
};
pub use message::{MailAbout, MailMessage, MailStatus, get, list_recent};
pub use send::{
    MailOccurrence, MailQueueMessage, RenderedMail, render_billing_mail, send_billing_mail,
};

/// Sends tried before a message is given up (the mail queue's
/// `maxReceiveCount`).
pub const MAX_ATTEMPTS: u32 = 5;
/// How long a claimed message stays claimed: past the sender's timeout,
/// shorter than the queue's visibility timeout (90 s).
pub const LEASE: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest occurrence key a caller may give.
pub const MAX_OCCURRENCE: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> MailError {
    MailError::Invalid {
        field,
        message: message.into(),
    }
}

pub use crate::providers::mail::is_address;

/// The address as stored and compared: trimmed, lowercase.
pub fn normalize_address(raw: &str) -> Option<String> {
    let a = raw.trim().to_lowercase();
    is_address(&a).then_some(a)
}
