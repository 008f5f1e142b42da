//! Payment attempts: from the customer's choice of provider on the hosted
//! page to a verified outcome (decisions, "Checkout sessions" and
//! "Payments").
//!
//! - [`start`](fn@start): the customer picks a provider. One transaction creates the
//!   attempt's payment (`pending`) and moves the session to `initiated`;
//!   then the provider is asked for the hand-off (eSewa's signed form,
//!   Khalti's payment page, Fonepay's QR or web page). Sandbox fonepay
//!   holds its amount against the month's cap first ([`fonepay_cap`]).
//! - [`on_return`]: the provider sends the browser back. The return is only
//!   a trigger: it must verify (eSewa's signature, Khalti's `pidx`,
//!   Fonepay's DV, our reference and amount) before we ask the provider
//!   server to server; a return that does not verify is logged and changes
//!   nothing (the reconciler resolves the payment).
//! - [`reconcile`](settle::reconcile): asks the provider and applies the answer
//!   ([`decide`](settle::decide)): `success` only on a paid status whose amount matches;
//!   a second success for one session is kept and flagged
//!   (`double_payment_of`). Every change merchants hear about writes its
//!   event in the same transaction ([`outbox`](super::outbox)).
//! - [`sweep`](fn@sweep): the scheduler's pass: expires due sessions and reconciles
//!   open payments.

use super::checkout::{CheckoutSession, SessionStatus, StoredAddress};
use super::fonepay_cap;
use super::payments::{Payment, PaymentStatus};
use super::record::{Gsi2Entry, Record};
use super::{Mode, Provider, Tenant};
use crate::keys;
use crate::providers::hub::HubError;
use crate::providers::{Handoff, ProviderError};
use crate::store::{Cond, StoreError};
use crate::time::Timestamp;

mod provider_rules;
mod returns;
mod review;
mod settle;
mod start;
mod sweep;
#[cfg(test)]
mod tests;

pub use returns::{ReturnKind, on_return};
pub use review::{Release, ReleaseError, held, release};
pub use settle::{Decision, apply, poll_of, poll_qr_every, poll_qr_of, verify_now};
pub use start::{find_payment, start, start_for};
pub use sweep::{SweepReport, sweep};

use sweep::check_gap;

/// Open payments live in `gsi2` under this prefix, one partition per
/// project and mode, by when their next provider check is due
/// ([`open_payments_partition`]). `OPEN#PAY#0..3` are the former, global
/// partitions (by creation), still drained.
pub(crate) const OPEN_PAYMENTS: keys::Open = keys::Open::Payments;
/// Cancelled payments the reconciler still re-checks for a day (the
/// customer may pay after all; a superseded attempt is one), apart from
/// the open ones, one partition per project and mode, by due time.
pub(crate) const RECHECK_PAYMENTS: keys::Open = keys::Open::Recheck;
/// How many cancelled payments one sweep re-checks per project.
pub const RECHECK_BATCH: usize = 25;
/// A sweep starts no provider check after this long (the scheduler runs
/// every minute, one run at a time, with a 60 s timeout).
pub const SWEEP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(40);
/// At most this many provider checks per sweep, shared round-robin among
/// the projects with due work (the rest are due again next sweep).
pub const SWEEP_BUDGET: usize = 2000;
/// A payment younger than this is left to its customer by the sweep.
pub const RECONCILE_AFTER: chrono::Duration = chrono::Duration::seconds(60);
/// How many payments one sweep checks, per partition.
pub const SWEEP_BATCH: usize = 50;
/// How many due sessions one sweep expires, per project (a session past
/// its time still counts in `GET /v1/sessions` totals through a key-range
/// count until it is stored as expired: this keeps that range short).
pub const EXPIRE_BATCH: usize = 200;
/// How many provider checks one sweep runs at once.
pub const SWEEP_PARALLEL: usize = 8;
/// Polls of the QR page ask the provider at most this often per payment.
pub const POLL_CHECK_EVERY: chrono::Duration = chrono::Duration::seconds(3);
/// How long a cancelled payment is still checked with its provider.
pub const RECHECK_CANCELLED: chrono::Duration = chrono::Duration::hours(24);
/// At most this many attempts per checkout session.
pub const MAX_ATTEMPTS: u32 = 10;
/// How many index entries one sweep reads per partition, at most.
pub const SWEEP_SCAN: usize = 1000;
/// An attempt the provider still calls "pending" this long after it began,
/// with its session over, was abandoned: cancelled.
pub const ABANDONED_AFTER: chrono::Duration = chrono::Duration::hours(24);

/// What the customer chose on the hosted page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PayChoice {
    pub provider: Option<Provider>,
    /// Fonepay: pay by scanning a QR (default) rather than Fonepay's web
    /// page.
    pub fonepay_web: bool,
    /// The address form, when the session collects one.
    pub address: Option<StoredAddress>,
    /// Chosen on our hosted page (not through the API): only sessions with
    /// a shop page take those; a Direct-QR or mobile session's id is public
    /// (in its `events_url`), and its attempts belong to the counter or
    /// the app.
    pub from_page: bool,
}

/// Why an attempt could not start or a return could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("no such checkout session")]
    NotFound,
    /// The session is `expired`, `success` or `failed`.
    #[error("this checkout session is {}", .0.as_str())]
    Closed(SessionStatus),
    #[error("{0}")]
    NotOffered(String),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("{0}")]
    FonepayCap(String),
    /// The session changed while we worked (another tab): show it again.
    #[error("the checkout session changed; please try again")]
    Busy,
    #[error("{0}")]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An attempt refused to an API caller (a Direct-QR counter, a mobile
/// app): the contract's codes, naming the field where there is one.
impl From<AttemptError> for crate::refusal::Refusal {
    fn from(e: AttemptError) -> Self {
        use crate::refusal::{Kind, Refusal};
        match e {
            AttemptError::NotFound => Refusal::not_found("checkout session", ""),
            e @ AttemptError::Closed(_) => Refusal::unprocessable("session_closed", e.to_string()),
            AttemptError::NotOffered(m) => {
                Refusal::unprocessable("provider_unavailable", m).at("provider")
            }
            AttemptError::Invalid { field, message } => Refusal::invalid(field, message),
            AttemptError::FonepayCap(m) => {
                Refusal::unprocessable("fonepay_sandbox_cap", m).at("amount")
            }
            e @ AttemptError::Busy => Refusal::conflict("state_conflict", e.to_string()),
            AttemptError::Provider(e) => Refusal::new(
                Kind::Unavailable,
                "provider_error",
                format!("the provider did not start the payment ({e}); try again"),
            ),
            AttemptError::Store(e) => e.into(),
        }
    }
}

impl From<HubError> for AttemptError {
    fn from(e: HubError) -> Self {
        match e {
            HubError::NotConfigured { .. } => AttemptError::NotOffered(e.to_string()),
            HubError::Credentials(c) => match c {
                super::credentials::CredentialsError::Store(s) => AttemptError::Store(s),
                other => AttemptError::Store(StoreError::Backend(other.to_string())),
            },
        }
    }
}

/// A started attempt: where to send the customer.
#[derive(Clone, Debug)]
pub struct Started {
    pub session: CheckoutSession,
    pub payment: Payment,
    pub handoff: Handoff,
}

/// An open payment's entry among its project's open payments, due at its
/// next check.
fn open_entry(p: &Payment) -> Gsi2Entry {
    Gsi2Entry::new(
        open_payments_partition(&Tenant::new(p.project_id.clone(), p.mode)),
        due_sk(p, next_check_at(p)),
    )
}

/// `p` as the start of its attempt stores it: listed among the open
/// payments while open.
fn as_started(p: &Payment) -> Payment {
    let mut out = p.clone();
    let open = is_open(p.status).then(|| open_entry(p));
    out.gsi2pk = open.as_ref().map(|e| e.partition.clone());
    out.gsi2sk = open.map(|e| e.sort);
    out
}

/// `p` as the start of its attempt stores it, with its indexes (for
/// seeding many payments at once: tests, benchmarks).
pub fn stored_item(p: &Payment) -> Result<crate::store::Item, StoreError> {
    as_started(p).to_item()
}

/// The `gsi2` partition of a project's open payments, by next check.
pub fn open_payments_partition(tenant: &Tenant) -> String {
    keys::open_per_project(OPEN_PAYMENTS, &tenant.project, tenant.mode)
}

/// The `gsi2` partition of a project's cancelled payments still re-checked.
pub fn recheck_partition(tenant: &Tenant) -> String {
    keys::open_per_project(RECHECK_PAYMENTS, &tenant.project, tenant.mode)
}

/// The sort key of `p` in its partition when due at `at`.
fn due_sk(p: &Payment, at: Timestamp) -> String {
    format!("{}#{}", at.to_rfc3339(), p.id)
}

/// When the reconciler next asks the provider about `p`: a minute after it
/// began, then [`check_gap`] after its last claimed check.
pub fn next_check_at(p: &Payment) -> Timestamp {
    let next = match p.checks.checked_at {
        None => p.created_at.plus(RECONCILE_AFTER),
        Some(c) => c.plus(check_gap(p, c)),
    };
    // A sandbox Fonepay QR paid after its cap hold is held for review
    // (decide_for): one last check just before the hold ends, so a
    // payment made in time is learned in time even with the page closed.
    if provider_rules::of(p.provider, p.mode).month_cap && p.attempt.cap_month.is_some() {
        let last = p
            .created_at
            .plus(fonepay_cap::HOLD_WINDOW - chrono::Duration::seconds(30));
        if p.checks.checked_at.is_none_or(|c| c < last) && next > last {
            return last;
        }
    }
    next
}

fn is_open(s: PaymentStatus) -> bool {
    matches!(s, PaymentStatus::Pending | PaymentStatus::Processing)
}

fn status_in(list: &[PaymentStatus]) -> Cond {
    Payment::STATUS.is_in(list)
}
