//! Payment attempts: from the customer's choice of provider on the hosted
//! page to a verified outcome (decisions, "Checkout sessions" and
//! "Payments").
//!
//! - [`start`]: the customer picks a provider. One transaction creates the
//!   attempt's payment (`pending`) and moves the session to `initiated`;
//!   then the provider is asked for the hand-off (eSewa's signed form,
//!   Khalti's payment page, Fonepay's QR or web page). Sandbox fonepay
//!   holds its amount against the month's cap first ([`fonepay_cap`]).
//! - [`on_return`]: the provider sends the browser back. The return is only
//!   a trigger: it must verify (eSewa's signature, Khalti's `pidx`,
//!   Fonepay's DV, our reference and amount) before we ask the provider
//!   server to server; a return that does not verify is logged and changes
//!   nothing (the reconciler resolves the payment).
//! - [`reconcile`]: asks the provider and applies the answer
//!   ([`decide`]): `success` only on a paid status whose amount matches;
//!   a second success for one session is kept and flagged
//!   (`double_payment_of`). Every change merchants hear about writes its
//!   event in the same transaction ([`outbox`](super::outbox)).
//! - [`sweep`]: the scheduler's pass: expires due sessions and reconciles
//!   open payments.

use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};

use super::account;
use super::analytics::Tally;
use super::checkout::{self, CheckoutSession, SessionStatus, StoredAddress, open_partitions};
use super::fonepay_cap::{self, CapError};
use super::outbox::{Event, EventType};
use super::payments::{AttemptInfo, Payment, PaymentStatus, PaymentView};
use super::record::{from_item, to_item};
use super::{Mode, Provider};
use crate::app::Deps;
use crate::ids::{self, IdKind};
use crate::keys;
use crate::money::Currency;
use crate::providers::hub::HubError;
use crate::providers::{
    self, Attempt, Channel, CustomerInfo, Handoff, ProviderError, ProviderState, ProviderStatus,
    StatusQuery, esewa, fonepay, khalti,
};
use crate::store::{Cond, Index, Query, SkCond, Store, StoreError, TxOp, TxReason, Update};
use crate::time::Timestamp;

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

fn payment_indexes(p: &Payment) -> Vec<(Index, String, String)> {
    let mut out = p.indexes().to_vec();
    if is_open(p.status) {
        out.push((
            Index::Gsi2,
            open_payments_partition(&p.project_id, p.mode),
            due_sk(p, next_check_at(p)),
        ));
    }
    out
}

/// `p` as the start of its attempt stores it, with its indexes (for
/// seeding many payments at once: tests, benchmarks).
pub fn stored_item(p: &Payment) -> Result<crate::store::Item, StoreError> {
    to_item(p, &Payment::key(&p.id), &payment_indexes(p))
}

/// The `gsi2` partition of a project's open payments, by next check.
pub fn open_payments_partition(project_id: &str, mode: Mode) -> String {
    keys::open_per_project(OPEN_PAYMENTS, project_id, mode)
}

/// The `gsi2` partition of a project's cancelled payments still re-checked.
pub fn recheck_partition(project_id: &str, mode: Mode) -> String {
    keys::open_per_project(RECHECK_PAYMENTS, project_id, mode)
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
    if p.provider == Provider::Fonepay && p.mode == Mode::Sandbox && p.attempt.cap_month.is_some() {
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
    Cond::Or(
        list.iter()
            .map(|s| Cond::eq("status", status_word(*s)))
            .collect(),
    )
}

fn status_word(s: PaymentStatus) -> &'static str {
    match s {
        PaymentStatus::Pending => "pending",
        PaymentStatus::Processing => "processing",
        PaymentStatus::Success => "success",
        PaymentStatus::Failed => "failed",
        PaymentStatus::Refunded => "refunded",
        PaymentStatus::Cancelled => "cancelled",
    }
}

/// The URLs on our own server the provider sends the customer back to.
pub fn return_url(base: &str, session_id: &str, payment_id: &str, outcome: &str) -> String {
    format!("{base}/c/{session_id}/return/{payment_id}/{outcome}")
}

/// The merchant's site (scheme and host of `url`), for Khalti's
/// `website_url`.
fn origin(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    format!("{scheme}://{host}")
}

/// The address the customer typed, trimmed, each part held to
/// [`AddressPart`](crate::fields::AddressPart)'s rule; `line1` and `city`
/// are required.
fn check_address(a: &StoredAddress) -> Result<StoredAddress, AttemptError> {
    let part = |field: &'static str, v: &Option<String>, required: bool| match v
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        None if required => Err(AttemptError::Invalid {
            field,
            message: "is required".into(),
        }),
        None => Ok(None),
        Some(v) => crate::fields::AddressPart::parse(v.to_owned())
            .map(|p| Some(p.into_string()))
            .map_err(|message| AttemptError::Invalid { field, message }),
    };
    Ok(StoredAddress {
        line1: part("line1", &a.line1, true)?,
        line2: part("line2", &a.line2, false)?,
        city: part("city", &a.city, true)?,
        state: part("state", &a.state, false)?,
        postal_code: part("postalCode", &a.postal_code, false)?,
        country: part("country", &a.country, false)?,
    })
}

/// The customer chose a provider: create the attempt and ask the provider
/// for the hand-off.
/// `public_base`: our public base URL (the providers return there).
pub async fn start(
    state: &Deps,
    session_id: &str,
    choice: PayChoice,
    public_base: &str,
    now: Timestamp,
) -> Result<Started, AttemptError> {
    let store = &*state.store;
    let session = checkout::find_any(store, session_id, now)
        .await?
        .ok_or(AttemptError::NotFound)?;
    if session.status.is_final() {
        return Err(AttemptError::Closed(session.status));
    }
    if session.attempts >= MAX_ATTEMPTS {
        return Err(AttemptError::NotOffered(format!(
            "this checkout has had {MAX_ATTEMPTS} payment attempts; please return to the shop and start again"
        )));
    }
    let provider = choice
        .provider
        .or(session.provider)
        .ok_or(AttemptError::Invalid {
            field: "provider",
            message: "choose how to pay".into(),
        })?;
    if session.flow == checkout::Flow::Redirect && session.provider != Some(provider) {
        return Err(AttemptError::NotOffered(format!(
            "this checkout pays with {} only",
            session
                .provider
                .map(Provider::as_str)
                .unwrap_or("one provider")
        )));
    }
    let offered = checkout::providers(store, &session.project_id, session.mode).await?;
    if !offered.iter().any(|p| p.provider == provider && p.enabled) {
        return Err(AttemptError::NotOffered(format!(
            "{} is not available for this shop",
            provider.as_str()
        )));
    }
    checkout::check_amount(session.amount.get(), Some(provider), session.mode).map_err(
        |e| match e {
            checkout::CheckoutError::FonepaySandboxCap(m) => AttemptError::FonepayCap(m),
            other => AttemptError::NotOffered(other.to_string()),
        },
    )?;
    let address = match (&choice.address, session.collect_address) {
        // Once an attempt has started, the customer's details are frozen:
        // the provider, the merchant's webhook and the payment were told
        // them (the form may send them again unchanged).
        (Some(a), true) if session.payment_id.is_some() => {
            let sent = check_address(a)?;
            let kept = match &session.customer_address {
                Some(k) => Some(check_address(k)?),
                None => None,
            };
            if kept.as_ref() != Some(&sent) {
                return Err(AttemptError::Invalid {
                    field: "address",
                    message: "cannot be changed once a payment has been started for this \
                              checkout; pay with the address given, or return to the shop \
                              to start a new checkout"
                        .into(),
                });
            }
            kept
        }
        (Some(a), true) => Some(check_address(a)?),
        (None, true) => match &session.customer_address {
            Some(a) => Some(check_address(a)?),
            None => {
                return Err(AttemptError::Invalid {
                    field: "line1",
                    message: "is required".into(),
                });
            }
        },
        (_, false) => None,
    };
    let creds = super::credentials::for_provider(
        store,
        &state.providers,
        &session.project_id,
        session.mode,
        provider,
    )
    .await?;
    let client = state.providers.client(session.mode, provider)?;
    if !account::storefront(store, &session.project_id).await?.1 {
        return Err(AttemptError::NotOffered(
            "this shop cannot take payments right now".into(),
        ));
    }
    // A link's session takes one of the link's uses as its customer is
    // sent to a provider (again after an attempt gave it back), in the
    // start's transaction.
    let claim = match (&session.link_id, session.link_claimed) {
        (Some(link_id), false) => {
            let link = super::links::get(store, link_id)
                .await?
                .ok_or_else(|| AttemptError::NotOffered(LINK_GONE.into()))?;
            refuse_link(&link, now)?;
            Some(link)
        }
        _ => None,
    };

    let reference = providers::new_reference();
    let qr = provider == Provider::Fonepay && !choice.fonepay_web;
    let capped = provider == Provider::Fonepay && session.mode == Mode::Sandbox;
    let cap_month = if capped {
        match fonepay_cap::reserve(
            store,
            &session.project_id,
            &reference,
            session.amount.get(),
            now,
        )
        .await
        {
            Ok(m) => Some(m),
            Err(CapError::MonthExceeded { .. }) => {
                return Err(AttemptError::FonepayCap(
                    "Sandbox fonepay uses real money and is capped at NPR 5,000 a month \
                     (succeeded payments plus QRs minted in the last 30 minutes); \
                     this payment would pass it"
                        .into(),
                ));
            }
            Err(CapError::Store(e)) => return Err(e.into()),
        }
    } else {
        None
    };

    let payment = Payment {
        id: ids::new_id(IdKind::Payment),
        project_id: session.project_id.clone(),
        checkout_session_id: session.id.clone(),
        mode: session.mode,
        amount: session.amount,
        amount_refunded: Default::default(),
        currency: Currency::Npr,
        provider,
        status: PaymentStatus::Pending,
        provider_ref: None,
        failure_reason: None,
        metadata: session.metadata.clone(),
        customer_name: session.customer_name.clone(),
        customer_email: session.customer_email.clone(),
        customer_phone: session.customer_phone.clone(),
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        attempt: AttemptInfo {
            reference: Some(reference.clone()),
            provider_token: None,
            qr_message: None,
            cap_month: cap_month.clone(),
            qr,
        },
        checks: Default::default(),
    };
    let mut session_update = Update::new()
        .add("attempts", 1)
        .set("status", SessionStatus::Initiated.as_str())
        .set("payment_id", payment.id.clone())
        .set("provider", provider.as_str())
        .set("updated_at", now.to_rfc3339());
    if claim.is_some() {
        session_update = session_update.set("link_claimed", true);
    }
    if let Some(a) = &address {
        session_update = session_update.set(
            "customer_address",
            serde_json::to_value(a).map_err(|e| StoreError::Invalid(e.to_string()))?,
        );
    }
    let current = match &session.payment_id {
        Some(p) => Cond::eq("payment_id", p.clone()),
        // Stored as null or missing: "not a string" covers both on both
        // backends (a comparison across types is false).
        None => Cond::Not(Box::new(Cond::ge("payment_id", ""))),
    };
    let mut ops = vec![
        TxOp::Put {
            item: to_item(
                &payment,
                &Payment::key(&payment.id),
                &payment_indexes(&payment),
            )?,
            cond: Some(Cond::NotExists),
        },
        TxOp::Update {
            key: CheckoutSession::key(&session.id),
            update: session_update,
            cond: Some(Cond::And(vec![
                Cond::Exists,
                // As read: the counters move from this status.
                Cond::eq("status", session.status.as_str()),
                Cond::gt("expires_at", now.to_rfc3339()),
                Cond::Or(vec![
                    Cond::AttrNotExists("attempts".into()),
                    Cond::lt("attempts", i64::from(MAX_ATTEMPTS)),
                ]),
                current,
            ])),
        },
    ];
    // One open payment per session: the attempt this one supersedes is
    // cancelled in the same write (none of our providers has an API to
    // void a started attempt; its customer may still finish it, so it is
    // re-checked for a day like any cancel, and its Fonepay cap hold stays
    // until it lapses).
    if let Some(prev) = &session.payment_id {
        if let Some(prev) = find_payment(store, &session.id, prev).await? {
            ops.extend(supersede_ops(&prev, now)?);
        }
    }
    let claim_at = claim.as_ref().map(|link| {
        ops.push(super::links::claim_op(link, session.expires_at));
        ops.len() - 1
    });
    start_tally(&session, &payment).apply_to(&mut ops)?;
    super::active::touch(store, &session.project_id, session.mode, now).await?;
    if let Err(e) = transact_start(store, ops).await {
        if let Some(m) = &cap_month {
            release_hold(store, &session.project_id, &reference, m).await;
        }
        if let (Some(at), Some(link)) = (claim_at, &claim) {
            if checkout::failed_at(&e, at) {
                // Taken meanwhile: say why, as the link now stands.
                let now_link = super::links::get(store, &link.id).await?;
                let now_link =
                    now_link.ok_or_else(|| AttemptError::NotOffered(LINK_GONE.into()))?;
                refuse_link(&now_link, now)?;
                return Err(AttemptError::NotOffered(super::links::held_text(1)));
            }
        }
        return Err(if e.is_condition_failure() {
            AttemptError::Busy
        } else {
            e.into()
        });
    }

    let base = public_base;
    let attempt = Attempt {
        reference: reference.clone(),
        amount: session.amount,
        return_url: return_url(base, &session.id, &payment.id, "ok"),
        failure_url: Some(return_url(base, &session.id, &payment.id, "fail")),
        website_url: origin(&session.return_url),
        order_name: session
            .description
            .clone()
            .unwrap_or_else(|| format!("Order {}", session.id)),
        customer: Some(CustomerInfo {
            name: session.customer_name.clone(),
            email: session.customer_email.clone(),
            phone: session.customer_phone.clone(),
        }),
        channel: if qr { Channel::Qr } else { Channel::Browser },
    };
    match client.initiate(&creds, &attempt).await {
        Ok(handoff) => {
            let mut info = payment.attempt.clone();
            match &handoff {
                Handoff::Redirect { provider_ref, .. } => {
                    info.provider_token = provider_ref.clone();
                }
                Handoff::Qr {
                    qr_message,
                    provider_ref,
                    ..
                } => {
                    info.provider_token = provider_ref.clone();
                    info.qr_message = Some(qr_message.clone());
                }
                Handoff::AutoPostForm { .. } => {}
            }
            let mut payment = payment;
            if info != payment.attempt {
                let value =
                    serde_json::to_value(&info).map_err(|e| StoreError::Invalid(e.to_string()))?;
                state
                    .store
                    .update(
                        &Payment::key(&payment.id),
                        Update::new().set("attempt", value),
                        Some(Cond::Exists),
                    )
                    .await?;
                payment.attempt = info;
            }
            // The session as the transaction left it (no second read).
            let mut session = session;
            session.status = SessionStatus::Initiated;
            session.payment_id = Some(payment.id.clone());
            session.provider = Some(provider);
            session.attempts += 1;
            session.updated_at = now;
            if address.is_some() {
                session.customer_address = address;
            }
            Ok(Started {
                session,
                payment,
                handoff,
            })
        }
        Err(err) => {
            tracing::warn!(
                payment = %payment.id,
                provider = provider.as_str(),
                error = %err,
                "provider refused to start the attempt"
            );
            if let Some(m) = &cap_month {
                release_hold(store, &session.project_id, &reference, m).await;
            }
            let reason = format!("{} could not start the payment: {err}", provider.as_str());
            apply(state, &payment, Decision::NotStarted(reason), now).await?;
            Err(AttemptError::Provider(err))
        }
    }
}

const LINK_GONE: &str = "this payment link no longer exists";

/// Refuses an attempt for `link` when it is used up or every use is held.
fn refuse_link(link: &super::links::PaymentLink, now: Timestamp) -> Result<(), AttemptError> {
    if link.max_uses.is_some_and(|m| link.used_count >= m) {
        return Err(AttemptError::NotOffered(super::links::inactive_text(link)));
    }
    match link.held(now) {
        Some(minutes) => Err(AttemptError::NotOffered(super::links::held_text(minutes))),
        None => Ok(()),
    }
}

/// Why an attempt was closed by the next one of its session.
pub const SUPERSEDED: &str = "superseded by a newer attempt of the same checkout";

/// The writes cancelling `prev`, an open attempt a new one of its session
/// supersedes (none when it is no longer open or held for review): out of
/// the open payments into its project's re-check partition, with its
/// `payment.cancelled` event. Conditioned on it still being open and not
/// held, so a payment settled meanwhile makes the start fail and retry.
fn supersede_ops(prev: &Payment, now: Timestamp) -> Result<Vec<TxOp>, StoreError> {
    if !is_open(prev.status) || prev.checks.review.is_some() {
        return Ok(Vec::new());
    }
    // A cancel as a provider's answer would plan it, without its session
    // (the new attempt's write moves the session).
    let cancel = Decision::Cancelled(SUPERSEDED.to_owned());
    Ok(plan(prev, None, None, &cancel, now)?.unwrap_or_default())
}

/// The day counters of a started attempt: the payment is created, and the
/// session counts as initiated on its first attempt only (`session` as
/// read; the transaction's `payment_id` condition pins that read).
fn start_tally(session: &CheckoutSession, payment: &Payment) -> Tally {
    let mut tally = Tally::new();
    tally.payment_created(payment);
    if session.payment_id.is_none() {
        tally.session_initiated(session);
    }
    tally.session_moved(session, session.status, SessionStatus::Initiated);
    tally
}

/// The start transaction, tried again when only a conflict (another
/// transaction writing the same item: the day's counters are shared by
/// the project's sessions) cancelled it.
async fn transact_start(store: &dyn Store, ops: Vec<TxOp>) -> Result<(), StoreError> {
    let mut tries = 0u64;
    loop {
        tries += 1;
        match store.transact(ops.clone()).await {
            Err(StoreError::TransactionCanceled { reasons })
                if tries < 5
                    && reasons.contains(&TxReason::Conflict)
                    && !reasons.contains(&TxReason::ConditionFailed) =>
            {
                let pause = 5 + 10 * tries + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            other => return other,
        }
    }
}

async fn release_hold(store: &dyn Store, project_id: &str, reference: &str, month: &str) {
    if let Err(e) = fonepay_cap::release(store, project_id, reference, month).await {
        // The hold lapses by itself after 30 minutes.
        tracing::warn!(error = %e, "could not release a sandbox fonepay hold");
    }
}

/// The payment `payment_id` of session `session_id`.
pub async fn find_payment(
    store: &dyn Store,
    session_id: &str,
    payment_id: &str,
) -> Result<Option<Payment>, StoreError> {
    Ok(super::payments::get(store, payment_id)
        .await?
        .filter(|p| p.checkout_session_id == session_id))
}

/// Which way the provider sent the customer back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnKind {
    /// eSewa `success_url`, Khalti `return_url`, Fonepay `RU`.
    Ok,
    /// eSewa `failure_url`.
    Fail,
}

/// Why a return was not believed (logged; nothing changes), and whether
/// a person must look (a genuine return saying another amount was paid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distrust {
    pub reason: String,
    pub review: bool,
}

impl Distrust {
    fn new(reason: impl Into<String>) -> Self {
        Distrust {
            reason: reason.into(),
            review: false,
        }
    }
}

/// Checks the provider's browser return for `payment`. `Ok(())`: worth a
/// server-to-server check now. `Err`: tampered, replayed onto another
/// attempt, or for another amount.
pub fn verify_return(
    payment: &Payment,
    creds: &providers::ProviderCredentials,
    kind: ReturnKind,
    params: &str,
) -> Result<(), Distrust> {
    let reference = payment.attempt.reference.as_deref().unwrap_or_default();
    match payment.provider {
        Provider::Esewa => {
            let data = form_urlencoded::parse(params.trim_start_matches('?').as_bytes())
                .find(|(k, _)| k == "data")
                .map(|(_, v)| v.into_owned());
            match (kind, data) {
                // eSewa's failure redirect carries nothing to verify.
                (ReturnKind::Fail, None) => Ok(()),
                (_, None) => Err(Distrust::new("eSewa return without data")),
                (_, Some(data)) => {
                    let cb = esewa::verify_callback(creds, &data)
                        .map_err(|e| Distrust::new(format!("eSewa data: {e}")))?;
                    if cb.transaction_uuid != reference {
                        return Err(Distrust::new(format!(
                            "eSewa data names attempt {}, not ours",
                            providers_clip(&cb.transaction_uuid)
                        )));
                    }
                    if cb.total_amount != payment.amount {
                        return Err(Distrust::new(format!(
                            "eSewa data says {} paisa, the payment is {}",
                            cb.total_amount.get(),
                            payment.amount.get()
                        )));
                    }
                    Ok(())
                }
            }
        }
        Provider::Khalti => {
            let r = khalti::parse_return(params);
            let token = payment.attempt.provider_token.as_deref();
            if r.pidx.is_none() || r.pidx.as_deref() != token {
                return Err(Distrust::new("Khalti return names another pidx"));
            }
            if let Some(order) = &r.purchase_order_id {
                if order != reference {
                    return Err(Distrust::new("Khalti return names another order"));
                }
            }
            if let Some(amount) = r.amount {
                if amount != payment.amount {
                    return Err(Distrust::new(format!(
                        "Khalti return says {} paisa, the payment is {}",
                        amount.get(),
                        payment.amount.get()
                    )));
                }
            }
            Ok(())
        }
        Provider::Fonepay => {
            let r = fonepay::verify_web_return(creds, params)
                .map_err(|e| Distrust::new(format!("Fonepay return: {e}")))?;
            if r.prn != reference {
                return Err(Distrust::new("Fonepay return names another PRN"));
            }
            if r.requested_amount != payment.amount {
                return Err(Distrust::new(format!(
                    "Fonepay return says {} paisa requested, the payment is {}",
                    r.requested_amount.get(),
                    payment.amount.get()
                )));
            }
            if r.paid && r.paid_amount != payment.amount {
                // Signed by Fonepay: the customer really paid another
                // amount (a discount). Never success without a person.
                return Err(Distrust {
                    reason: format!(
                        "Fonepay says {} paisa were paid for a payment of {}",
                        r.paid_amount.get(),
                        payment.amount.get()
                    ),
                    review: true,
                });
            }
            Ok(())
        }
    }
}

fn providers_clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// The provider sent the customer back: verify the return, then ask the
/// provider. Answers the session and the payment as they now stand.
///
/// Proof: the return itself proves nothing (a browser carries it). It is
/// checked first ([`verify_return`]: eSewa's signature over `status`,
/// `total_amount`, `transaction_uuid` and product code with our amount and
/// reference; Khalti's `pidx`, `purchase_order_id` and amount as ours;
/// Fonepay's DV over our PRN and amount), and only a return that passes
/// triggers the server-to-server check whose answer [`decide`] judges. A
/// tampered return changes nothing, or (a signed Fonepay return for
/// another amount) holds the payment for review.
pub async fn on_return(
    state: &Deps,
    session_id: &str,
    payment_id: &str,
    kind: ReturnKind,
    params: &str,
    now: Timestamp,
) -> Result<(CheckoutSession, Payment), AttemptError> {
    let store = &*state.store;
    let payment = find_payment(store, session_id, payment_id)
        .await?
        .ok_or(AttemptError::NotFound)?;
    let mut payment = payment;
    // A cancelled payment may still be paid (the customer finished at the
    // provider after the cancel): its return is checked like an open one.
    // A payment held for review waits for a person: a return changes
    // nothing (and asks the provider nothing).
    let reviewable = payment.checks.review.is_none();
    if reviewable && (is_open(payment.status) || payment.status == PaymentStatus::Cancelled) {
        let creds = super::credentials::for_payment(state, &payment).await?;
        match verify_return(&payment, &creds, kind, params) {
            // One provider check per payment every few seconds, however
            // often the return is replayed.
            Ok(()) => match claim_check(store, &payment, now, POLL_CHECK_EVERY).await? {
                true => match check_and_apply(state, &payment, Some(kind), now).await {
                    Ok(p) => payment = p,
                    Err(e) => {
                        tracing::warn!(payment = %payment.id, error = %e, "status check failed; the reconciler will retry");
                    }
                },
                false => {
                    tracing::info!(payment = %payment.id, "return within seconds of the last check: not asking the provider again");
                }
            },
            Err(d) if d.review => {
                tracing::error!(
                    payment = %payment.id,
                    provider = payment.provider.as_str(),
                    reason = %d.reason,
                    "payment needs review: held as processing"
                );
                payment = hold_for_review(store, &payment, &d.reason, now).await?;
            }
            Err(d) => {
                tracing::warn!(
                    payment = %payment.id,
                    provider = payment.provider.as_str(),
                    reason = %d.reason,
                    "provider return not believed; payment left for the reconciler"
                );
            }
        }
    } else {
        tracing::info!(payment = %payment.id, status = status_word(payment.status), "return for a settled payment (replay or reload): nothing to do");
    }
    let session = checkout::find_any(store, session_id, now)
        .await?
        .ok_or(AttemptError::NotFound)?;
    Ok((session, payment))
}

/// A hold for review: `processing` with its reason, out of the
/// reconciler's partitions (nothing it learns changes a held payment, and
/// held ones must not crowd its turns) into the held payments' partition
/// ([`held`], for the admin tool); the error log written with it is what
/// calls a person.
fn hold_update(p: &Payment, reason: &str, now: Timestamp) -> Update {
    Update::new()
        .set("status", "processing")
        .set(REVIEW, reason)
        .set("updated_at", now.to_rfc3339())
        .remove("recheck_until")
        .set(Index::Gsi2.pk_attr(), HELD_PAYMENTS)
        .set(
            Index::Gsi2.sk_attr(),
            format!("{}#{}", now.to_rfc3339(), p.id),
        )
}

/// The `gsi2` partition of payments held for review, oldest hold first
/// (one for the whole table: holds are rare, and each calls a person).
pub const HELD_PAYMENTS: &str = keys::HELD_PAYMENTS;

/// Payments held for review, oldest hold first, at most `limit`.
pub async fn held(store: &dyn Store, limit: usize) -> Result<Vec<Payment>, StoreError> {
    let query = Query::partition(HELD_PAYMENTS).on(Index::Gsi2).limit(limit);
    let page = store.query(&query).await?;
    page.items.into_iter().map(from_item).collect()
}

/// What a person decided about a payment held for review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// Back to the reconciler, due now (the cause was fixed, e.g. a wrong
    /// amount on our side): it is judged afresh, and held again if the
    /// provider's answer still does not match.
    Recheck,
    /// The person confirmed the money with the provider: `success`, with
    /// its event, as a provider's paid answer would.
    Succeed,
    /// The person found no money (or returned it): `failed` with this
    /// reason.
    Fail(String),
}

/// Why a release was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("no such payment")]
    NotFound,
    #[error("the payment is not held for review")]
    NotHeld,
    /// Taken off hold, but something else settled it first (it stays as
    /// it now is; look again).
    #[error("taken off hold, but the payment is now {0:?}: the decision did not apply")]
    NotApplied(PaymentStatus),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Takes payment `id` off hold as a person decided: the hold is removed
/// and the payment put back in its project's open payments, due now, in
/// one conditional write (so a crash before the decision lands leaves it
/// with the reconciler, never lost), then the decision is applied like a
/// provider's answer (its event, its session, counters). Logged.
pub async fn release(
    state: &Deps,
    id: &str,
    decision: Release,
    now: Timestamp,
) -> Result<Payment, ReleaseError> {
    let store = &*state.store;
    let p = super::payments::get(store, id)
        .await?
        .ok_or(ReleaseError::NotFound)?;
    let Some(reason) = p.checks.review.clone() else {
        return Err(ReleaseError::NotHeld);
    };
    // The registry first: the partition the payment goes back to must be
    // one the sweep finds.
    super::active::touch_now(store, &p.project_id, p.mode, now).await?;
    // Due now for a recheck; a few minutes on when the decision follows at
    // once, so a sweep running meanwhile does not judge it first.
    let due = match decision {
        Release::Recheck => now,
        _ => now.plus(chrono::Duration::minutes(5)),
    };
    let update = Update::new()
        .remove(REVIEW)
        .set("updated_at", now.to_rfc3339())
        .set(
            Index::Gsi2.pk_attr(),
            open_payments_partition(&p.project_id, p.mode),
        )
        .set(Index::Gsi2.sk_attr(), due_sk(&p, due));
    let cond = Cond::And(vec![
        Cond::eq(REVIEW, reason.clone()),
        Cond::eq("status", "processing"),
    ]);
    let item = match store.update(&Payment::key(id), update, Some(cond)).await {
        Ok(item) => item,
        Err(StoreError::ConditionFailed) => return Err(ReleaseError::NotHeld),
        Err(e) => return Err(e.into()),
    };
    let unheld: Payment = from_item(item)?;
    tracing::warn!(payment = %id, held_for = %reason, decision = ?decision, "payment released from review by a person");
    let out = match decision.clone() {
        Release::Recheck => unheld,
        Release::Succeed => {
            let provider_ref = unheld.provider_ref.clone();
            apply(state, &unheld, Decision::Success { provider_ref }, now).await?
        }
        Release::Fail(why) => apply(state, &unheld, Decision::Failed(why), now).await?,
    };
    let landed = match &decision {
        Release::Recheck => true,
        Release::Succeed => out.status == PaymentStatus::Success,
        Release::Fail(_) => out.status == PaymentStatus::Failed,
    };
    if !landed {
        return Err(ReleaseError::NotApplied(out.status));
    }
    Ok(out)
}

/// Which payments a hold may land on: open ones, and cancelled ones (their
/// day of rechecks must not settle them).
fn holdable() -> Cond {
    status_in(&[
        PaymentStatus::Pending,
        PaymentStatus::Processing,
        PaymentStatus::Cancelled,
    ])
}

/// The payment attribute of a hold for review ([`super::payments::Checks::review`]).
const REVIEW: &str = "review";

/// Holds an open (or cancelled) payment as `processing` for a person to
/// look at; the reconciler, and every settlement planned from an older
/// copy, then leave it alone.
async fn hold_for_review(
    store: &dyn Store,
    payment: &Payment,
    reason: &str,
    now: Timestamp,
) -> Result<Payment, StoreError> {
    match store
        .update(
            &Payment::key(&payment.id),
            hold_update(payment, reason, now),
            Some(holdable()),
        )
        .await
    {
        Ok(item) => from_item(item),
        Err(StoreError::ConditionFailed) => Ok(super::payments::get(store, &payment.id)
            .await?
            .unwrap_or_else(|| payment.clone())),
        Err(e) => Err(e),
    }
}

/// What the provider's answer means for a payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Success {
        provider_ref: Option<String>,
    },
    Failed(String),
    Cancelled(String),
    /// The provider refused to start the attempt: the payment is `failed`
    /// but the customer goes back to the picker (nothing was attempted).
    NotStarted(String),
    /// Still open at the provider: `processing`.
    Processing,
    /// Nothing to change (logged with the reason).
    Hold(String),
    /// Money may have moved in a way the payment does not explain (paid
    /// another amount, paid with no amount stated, refunded before it was
    /// settled): held as `processing` for a person, never settled by the
    /// reconciler again.
    Review(String),
}

/// The rule (decisions, "Payments"): `success` only on a paid status whose
/// amount, when the provider states one, is the payment's.
///
/// **What proves the money.** Every path that can set `success` (the
/// browser return and eSewa's signed `data` on it, the QR page's poll,
/// the status poll, the reconciler) ends here, through
/// [`check_and_apply`]: never on what a browser brought, always on the
/// provider's own server-to-server answer to a query we make:
///
/// | provider | status | amount | currency | our reference |
/// |---|---|---|---|---|
/// | eSewa | `status` of the status API (`COMPLETE`) | its `total_amount`, compared here | NPR (eSewa has no other) | we query with our `transaction_uuid`, `total_amount` and product code; the client refuses an answer naming another `transaction_uuid` |
/// | Khalti | lookup `status` (`Completed`) | its `total_amount`, compared here | NPR (Khalti has no other) | we look up the `pidx` Khalti gave our initiate (kept on the payment); the client refuses another `pidx` |
/// | Fonepay | QR/web status `paymentStatus` (`success`) | none in the answer: the proof is our own signed request (the QR we minted, the web request whose DV we signed) for that PRN, which fixes the amount | NPR (the QR and request state it) | we query with our PRN and merchant code under our DV |
///
/// A mismatch (another amount, no amount from eSewa or Khalti, a refund
/// of an unsettled payment, a sandbox QR paid after its cap hold) is a
/// [`Decision::Review`]: `processing`, out of every automatic path, logged
/// at error level with the reason, until a person releases it
/// ([`release`]).
/// `session_over`: the session expired (an attempt the provider has
/// forgotten then counts as cancelled).
pub fn decide(payment: &Payment, status: &ProviderStatus, session_over: bool) -> Decision {
    match status.state {
        ProviderState::Paid => match status.amount {
            Some(a) if a != payment.amount => Decision::Review(format!(
                "provider says paid {} paisa, the payment is {}: needs review",
                a.get(),
                payment.amount.get()
            )),
            // eSewa and Khalti state the amount; without it there is no
            // proof. Fonepay's status has none: the amount is the one we
            // minted into the QR or signed into the web request.
            None if payment.provider != Provider::Fonepay => {
                Decision::Review("provider says paid but states no amount: needs review".into())
            }
            _ => Decision::Success {
                provider_ref: status.provider_ref.clone(),
            },
        },
        ProviderState::Pending | ProviderState::Ambiguous => Decision::Processing,
        ProviderState::Failed => {
            Decision::Failed(format!("declined by the provider ({})", status.raw_status))
        }
        ProviderState::Cancelled => Decision::Cancelled("cancelled by the customer".into()),
        ProviderState::Expired => {
            Decision::Cancelled("the provider's payment window closed".into())
        }
        ProviderState::NotFound if session_over => {
            Decision::Cancelled("the customer did not pay before the session expired".into())
        }
        ProviderState::NotFound => Decision::Hold("the provider does not know it yet".into()),
        ProviderState::Refunded { .. } => Decision::Review(format!(
            "provider reports {} for an unsettled payment: needs review",
            status.raw_status
        )),
    }
}

/// [`decide`] in context: `returned` is the provider return that
/// triggered the check (none for the reconciler and the QR page's poll).
///
/// - After a failure return, an attempt the provider has no record of
///   (eSewa answers `NOT_FOUND` for a payment left or declined in its
///   wallet; it has no "failed" status) is over: cancelled, and the
///   customer goes back to the picker.
/// - The provider's "pending" means `processing` only when the customer
///   came back from the provider; otherwise the customer simply has not paid
///   yet (an unscanned QR, a wallet page left open) and nothing changes,
///   until [`ABANDONED_AFTER`] past an expired session, when the attempt
///   is cancelled.
pub fn decide_for(
    payment: &Payment,
    status: &ProviderStatus,
    returned: Option<ReturnKind>,
    session_over: bool,
    now: Timestamp,
) -> Decision {
    if let Some(why) = &payment.checks.review {
        return Decision::Hold(format!("waiting for review: {why}"));
    }
    match (returned, status.state) {
        (Some(ReturnKind::Fail), ProviderState::NotFound) => Decision::Cancelled(format!(
            "the customer came back from {} without paying",
            payment.provider.as_str()
        )),
        // The customer came back (eSewa sends a pending payment to its
        // failure return): the provider is working on it.
        (Some(_), ProviderState::Pending) => Decision::Processing,
        (_, ProviderState::Pending) if payment.status == PaymentStatus::Pending => {
            if session_over && now >= payment.created_at.plus(ABANDONED_AFTER) {
                Decision::Cancelled("not paid by the customer".into())
            } else {
                Decision::Hold("not paid yet".into())
            }
        }
        _ => match decide(payment, status, session_over) {
            Decision::Success { .. } if late_sandbox_qr(payment, now) => Decision::Review(format!(
                "sandbox Fonepay payment reported paid after its {}-minute cap hold lapsed \
                 (minted {}): it may pass the NPR 5,000 month cap; not counted until a person \
                 confirms it",
                fonepay_cap::HOLD_WINDOW.num_minutes(),
                payment.created_at.to_rfc3339()
            )),
            d => d,
        },
    }
}

/// A sandbox Fonepay attempt (real money under the month cap) learned to
/// be paid after its cap hold lapsed: the month's room it held may have
/// been given to others meanwhile, so its success is not counted by
/// itself (the simulator, like the hold, refuses a QR that old).
fn late_sandbox_qr(payment: &Payment, now: Timestamp) -> bool {
    payment.provider == Provider::Fonepay
        && payment.mode == Mode::Sandbox
        && payment.attempt.cap_month.is_some()
        && now >= payment.created_at.plus(fonepay_cap::HOLD_WINDOW)
}

/// Asks the provider about `payment` and applies the answer (the
/// reconciler's and the pollers' path). Proof: the provider's answer to
/// our own query, judged by [`decide`] (amount compared where stated).
pub async fn reconcile(
    state: &Deps,
    payment: &Payment,
    now: Timestamp,
) -> Result<Payment, AttemptError> {
    check_and_apply(state, payment, None, now).await
}

async fn check_and_apply(
    state: &Deps,
    payment: &Payment,
    returned: Option<ReturnKind>,
    now: Timestamp,
) -> Result<Payment, AttemptError> {
    let store = &*state.store;
    let creds = super::credentials::for_payment(state, payment).await?;
    let client = state.providers.client(payment.mode, payment.provider)?;
    let query = StatusQuery {
        reference: payment.attempt.reference.clone().unwrap_or_default(),
        amount: payment.amount,
        provider_ref: payment.attempt.provider_token.clone(),
    };
    let status = client.status(&creds, &query).await?;
    let session = checkout::find_any(store, &payment.checkout_session_id, now).await?;
    // Over: expired, or settled by another attempt, or gone.
    let over = session.as_ref().is_none_or(|s| s.status.is_final());
    let decision = decide_for(payment, &status, returned, over, now);
    match &decision {
        Decision::Hold(why) => {
            tracing::info!(payment = %payment.id, provider_status = %status.raw_status, reason = %why, "payment left as it is");
        }
        Decision::Review(why) => {
            tracing::error!(payment = %payment.id, provider = payment.provider.as_str(), provider_status = %status.raw_status, reason = %why, "payment needs review: held as processing");
        }
        _ => {}
    }
    Ok(apply(state, payment, decision, now).await?)
}

/// Applies `decision` to `payment` (and its session), with its event, in
/// one transaction; answers the payment as stored afterwards. A payment
/// another caller settled first is answered as that caller left it.
pub async fn apply(
    state: &Deps,
    payment: &Payment,
    decision: Decision,
    now: Timestamp,
) -> Result<Payment, StoreError> {
    let store = &*state.store;
    let key = Payment::key(&payment.id);
    for attempt in 0..SETTLE_TRIES {
        let Some(item) = store.get(&key).await? else {
            return Err(StoreError::Backend(format!(
                "payment {} vanished",
                payment.id
            )));
        };
        let current: Payment = from_item(item)?;
        let session = match store
            .get(&CheckoutSession::key(&current.checkout_session_id))
            .await?
        {
            Some(i) => Some(from_item::<CheckoutSession>(i)?),
            None => None,
        };
        let link = match session.as_ref().and_then(|s| s.link_id.clone()) {
            Some(id) => super::links::get(store, &id).await?,
            None => None,
        };
        let link = link.map(|l| (l, state.config.public_base_url.as_str()));
        let invoice = match session.as_ref().and_then(|s| s.invoice_id.clone()) {
            Some(id) => super::invoices::get_any(store, &id).await?,
            None => None,
        };
        let Some(mut ops) = plan(&current, session.as_ref(), link.as_ref(), &decision, now)? else {
            return Ok(current);
        };
        // A success for an invoice's checkout is allocated to the invoice
        // in the same transaction (re-read and retried on conflict).
        if let (Decision::Success { .. }, Some(inv)) = (&decision, &invoice) {
            ops.extend(super::invoices::allocation_ops(
                inv,
                &current.id,
                current.amount.get(),
                now,
            )?);
        }
        match store.transact(ops).await {
            Ok(()) => {
                return match store.get(&key).await? {
                    Some(i) => from_item(i),
                    None => Err(StoreError::Backend(format!(
                        "payment {} vanished",
                        payment.id
                    ))),
                };
            }
            Err(StoreError::TransactionCanceled { reasons })
                if reasons
                    .iter()
                    .any(|r| matches!(r, TxReason::ConditionFailed | TxReason::Conflict)) =>
            {
                crate::store::contention_backoff(attempt).await;
                continue;
            }
            Err(StoreError::ConditionFailed) => {
                crate::store::contention_backoff(attempt).await;
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(format!(
        "payment {} kept changing while being settled",
        payment.id
    )))
}

/// How often a settlement re-reads what moved under it (its session, link
/// or invoice), with a short random pause that grows each time
/// ([`crate::store::contention_backoff`]).
const SETTLE_TRIES: usize = 8;

fn event_op(kind: EventType, payment: &Payment, now: Timestamp) -> Result<TxOp, StoreError> {
    let view = serde_json::to_value(PaymentView::from(payment.clone()))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    Event::new(kind, &payment.project_id, payment.mode, view, now).put_op()
}

/// `cond`, and no hold for review: a settlement never lands over a hold
/// that came after the copy it was planned from was read.
fn not_held(cond: Cond) -> Cond {
    Cond::And(vec![cond, Cond::AttrNotExists(REVIEW.into())])
}

fn close_payment(update: Update) -> Update {
    update.unindex(Index::Gsi2)
}

/// `update` cancelling `p` at `now`: re-checked for [`RECHECK_CANCELLED`]
/// from its project's re-check partition.
fn recheck(update: Update, p: &Payment, now: Timestamp) -> Update {
    update
        .set("recheck_until", now.plus(RECHECK_CANCELLED).to_rfc3339())
        .set(
            Index::Gsi2.pk_attr(),
            recheck_partition(&p.project_id, p.mode),
        )
        .set(Index::Gsi2.sk_attr(), due_after_check(p, now))
}

/// `p`'s sort key in its partition once checked at `now`.
fn due_after_check(p: &Payment, now: Timestamp) -> String {
    let mut checked = p.clone();
    checked.checks.checked_at = Some(now);
    due_sk(p, next_check_at(&checked))
}

/// The transaction that applies `decision` to `p` as stored now; `None`
/// when nothing changes.
fn plan(
    p: &Payment,
    session: Option<&CheckoutSession>,
    link: Option<&(super::links::PaymentLink, &str)>,
    decision: &Decision,
    now: Timestamp,
) -> Result<Option<Vec<TxOp>>, StoreError> {
    let key = Payment::key(&p.id);
    let stamp = now.to_rfc3339();
    let ours = |s: &CheckoutSession| s.payment_id.as_deref() == Some(p.id.as_str());
    let mut ops = Vec::new();
    // The day counters of the transitions below, added to `ops` last.
    let mut tally = Tally::new();
    if p.checks.review.is_some() {
        // `p` is the fresh copy; the decision may have been made from an
        // older one (a sweep's or a poll's) read before a signed return
        // held the payment: it waits for a person, whatever the provider
        // now says.
        tracing::warn!(payment = %p.id, "payment held for review: provider answer not applied");
        return Ok(None);
    }
    match decision {
        Decision::Hold(_) => return Ok(None),
        Decision::Review(reason) => {
            if !(is_open(p.status) || p.status == PaymentStatus::Cancelled) {
                return Ok(None);
            }
            ops.push(TxOp::Update {
                key,
                update: hold_update(p, reason, now),
                cond: Some(not_held(holdable())),
            });
        }
        Decision::Processing => {
            if p.status != PaymentStatus::Pending {
                return Ok(None);
            }
            ops.push(TxOp::Update {
                key,
                update: Update::new()
                    .set("status", "processing")
                    .set("updated_at", stamp),
                cond: Some(Cond::eq("status", "pending")),
            });
        }
        Decision::Success { provider_ref } => {
            // A late success after a cancel (the session expired first) is
            // still money taken: record it.
            if !matches!(
                p.status,
                PaymentStatus::Pending | PaymentStatus::Processing | PaymentStatus::Cancelled
            ) {
                return Ok(None);
            }
            let mut next = p.clone();
            next.status = PaymentStatus::Success;
            next.failure_reason = None;
            next.provider_ref = provider_ref.clone().or_else(|| p.provider_ref.clone());
            next.updated_at = now;
            let mut update = close_payment(
                Update::new()
                    .remove("recheck_until")
                    .set("status", "success")
                    .set("updated_at", stamp.clone())
                    .set("failure_reason", Value::Null),
            );
            if let Some(r) = &next.provider_ref {
                update = update.set("provider_ref", r.clone());
            }
            match session {
                Some(s) if s.status == SessionStatus::Success && !ours(s) => {
                    next.double_payment_of = s.payment_id.clone();
                    update = update.set("double_payment_of", json!(s.payment_id));
                    tracing::error!(
                        payment = %p.id,
                        first = ?s.payment_id,
                        session = %s.id,
                        "double payment: a second attempt of one session succeeded; flagged for refund"
                    );
                    ops.push(TxOp::Check {
                        key: CheckoutSession::key(&s.id),
                        cond: Cond::eq("status", "success"),
                    });
                }
                Some(s) if s.status != SessionStatus::Success => {
                    // Success is final: a session becomes paid once.
                    tally.session_paid(s);
                    tally.session_moved(s, s.status, SessionStatus::Success);
                    ops.push(TxOp::Update {
                        key: CheckoutSession::key(&s.id),
                        update: Update::new()
                            .set("status", "success")
                            .set("payment_id", p.id.clone())
                            .set("provider", p.provider.as_str())
                            .set("updated_at", stamp.clone())
                            .unindex(Index::Gsi2),
                        // As read: a session that moved meanwhile (expired,
                        // failed: its link use given back) is re-read.
                        cond: Some(Cond::eq("status", s.status.as_str())),
                    });
                    if let Some((l, base)) = link {
                        // The link's use becomes a completed one, once:
                        // only this transition of the session counts it.
                        let mut update = Update::new()
                            .add("used_count", 1)
                            .set("updated_at", stamp.clone());
                        if s.status.is_final() || !s.link_claimed {
                            // Its hold was given back (expired first).
                            update = update.add("claimed", 1);
                        }
                        ops.push(TxOp::Update {
                            key: super::links::PaymentLink::key(&l.id),
                            update,
                            cond: Some(Cond::Exists),
                        });
                        let mut after = l.clone();
                        after.used_count += 1;
                        after.updated_at = now;
                        let view = serde_json::to_value(super::links::PaymentLinkView::of(
                            after, base, false,
                        ))
                        .map_err(|e| StoreError::Invalid(e.to_string()))?;
                        ops.push(
                            Event::new(
                                EventType::PaymentLinkPaid,
                                &p.project_id,
                                p.mode,
                                view,
                                now,
                            )
                            .put_op()?,
                        );
                    }
                }
                _ => {}
            }
            ops.insert(
                0,
                TxOp::Update {
                    key,
                    update,
                    cond: Some(not_held(status_in(&[
                        PaymentStatus::Pending,
                        PaymentStatus::Processing,
                        PaymentStatus::Cancelled,
                    ]))),
                },
            );
            if p.provider == Provider::Fonepay && p.mode == Mode::Sandbox {
                ops.extend(fonepay_cap::paid_ops(
                    &p.project_id,
                    p.attempt.reference.as_deref().unwrap_or_default(),
                    p.attempt.cap_month.as_deref(),
                    p.amount.get(),
                    now,
                ));
            }
            // From pending, processing or cancelled (the condition above):
            // a payment becomes a success once.
            tally.payment_succeeded(p);
            ops.push(event_op(EventType::PaymentSucceeded, &next, now)?);
        }
        Decision::Failed(reason) | Decision::Cancelled(reason) | Decision::NotStarted(reason) => {
            if !is_open(p.status) {
                return Ok(None);
            }
            let failed = matches!(decision, Decision::Failed(_) | Decision::NotStarted(_));
            // A decline ends the session; a cancel, or an attempt that never
            // reached the provider, sends the customer back to the picker
            // while the session has time left.
            let ends_session = matches!(decision, Decision::Failed(_));
            let mut next = p.clone();
            next.status = if failed {
                PaymentStatus::Failed
            } else {
                PaymentStatus::Cancelled
            };
            next.failure_reason = Some(reason.clone());
            next.updated_at = now;
            let mut update = Update::new()
                .set("status", status_word(next.status))
                .set("failure_reason", reason.clone())
                .set("updated_at", stamp.clone());
            update = if failed {
                close_payment(update)
            } else {
                // A cancelled attempt may still be paid at the provider:
                // the reconciler keeps asking for a day, from the
                // project's re-check partition (out of the open payments).
                recheck(update, p, now)
            };
            ops.push(TxOp::Update {
                key,
                update,
                cond: Some(not_held(status_in(&[
                    PaymentStatus::Pending,
                    PaymentStatus::Processing,
                ]))),
            });
            if let Some(s) = session.filter(|s| ours(s) && s.status == SessionStatus::Initiated) {
                let back_to_picker = !ends_session && s.expires_at > now;
                let mut session_update = if ends_session {
                    Update::new()
                        .set("status", "failed")
                        .set("updated_at", stamp.clone())
                        .unindex(Index::Gsi2)
                } else if back_to_picker {
                    Update::new()
                        .set("status", "pending")
                        .set("updated_at", stamp.clone())
                } else {
                    Update::new()
                };
                // The attempt held one of its link's uses: given back as it
                // fails or is cancelled (the next attempt takes one again).
                let release = s.link_claimed && !session_update.set.is_empty();
                if release {
                    session_update = session_update.set("link_claimed", false);
                }
                if !session_update.set.is_empty() {
                    let to = if ends_session {
                        SessionStatus::Failed
                    } else {
                        SessionStatus::Pending
                    };
                    tally.session_moved(s, SessionStatus::Initiated, to);
                    ops.push(TxOp::Update {
                        key: CheckoutSession::key(&s.id),
                        update: session_update,
                        cond: Some(Cond::And(vec![
                            Cond::eq("payment_id", p.id.clone()),
                            Cond::eq("status", "initiated"),
                        ])),
                    });
                    if release {
                        if let Some(id) = &s.link_id {
                            ops.push(super::links::release_op(id));
                        }
                    }
                }
            }
            let kind = if failed {
                // From pending or processing: failed is final, counted once.
                // A cancel counts in no outcome (it may still succeed).
                tally.payment_failed(p);
                EventType::PaymentFailed
            } else {
                EventType::PaymentCancelled
            };
            ops.push(event_op(kind, &next, now)?);
        }
    }
    tally.apply_to(&mut ops)?;
    Ok(Some(ops))
}

/// For the QR page's polling: asks the provider about the session's
/// current payment, at most once per [`POLL_CHECK_EVERY`] per payment
/// (a conditional write claims the check). Proof: as [`reconcile`]; the
/// poll carries nothing the payment is judged on.
pub async fn poll(
    state: &Deps,
    session_id: &str,
    now: Timestamp,
) -> Result<Option<(CheckoutSession, Option<Payment>)>, AttemptError> {
    let store = &*state.store;
    let Some(session) = checkout::find_any(store, session_id, now).await? else {
        return Ok(None);
    };
    let Some(pid) = session.payment_id.clone() else {
        return Ok(Some((session, None)));
    };
    let Some(payment) = find_payment(store, session_id, &pid).await? else {
        return Ok(Some((session, None)));
    };
    if !is_open(payment.status)
        || session.status != SessionStatus::Initiated
        || payment.checks.review.is_some()
    {
        return Ok(Some((session, Some(payment))));
    }
    if !claim_check(store, &payment, now, POLL_CHECK_EVERY).await? {
        return Ok(Some((session, Some(payment))));
    }
    let payment = match reconcile(state, &payment, now).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(payment = %payment.id, error = %e, "status check failed; will retry");
            payment
        }
    };
    let session = checkout::find_any(store, session_id, now)
        .await?
        .unwrap_or(session);
    Ok(Some((session, Some(payment))))
}

/// The write claiming a provider check of `p` at `now`: its `checked_at`,
/// and its place in its partition (`gsi2sk`, by next check). Setting the
/// sort key of a payment that is in no partition indexes nothing: an
/// index entry needs both key attributes.
fn check_update(p: &Payment, now: Timestamp) -> Update {
    Update::new()
        .set("checked_at", now.to_rfc3339())
        .set(Index::Gsi2.sk_attr(), due_after_check(p, now))
}

async fn claimed(
    store: &dyn Store,
    p: &Payment,
    now: Timestamp,
    cond: Cond,
) -> Result<bool, StoreError> {
    let claim = store
        .update(
            &Payment::key(&p.id),
            check_update(p, now),
            Some(Cond::And(vec![Cond::Exists, cond])),
        )
        .await;
    match claim {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Claims the next provider check of payment `p` at `now` if none was
/// made in the last `gap` (a conditional write, so parallel pollers and
/// sweeps ask the provider once). Whether this caller may check.
pub async fn claim_check(
    store: &dyn Store,
    p: &Payment,
    now: Timestamp,
    gap: chrono::Duration,
) -> Result<bool, StoreError> {
    let cond = Cond::Or(vec![
        Cond::AttrNotExists("checked_at".into()),
        Cond::le("checked_at", now.plus(-gap).to_rfc3339()),
    ]);
    claimed(store, p, now, cond).await
}

/// The sweep's claim: nobody checked `p` since the sweep read it.
async fn claim_as_read(store: &dyn Store, p: &Payment, now: Timestamp) -> Result<bool, StoreError> {
    let cond = match p.checks.checked_at {
        None => Cond::AttrNotExists("checked_at".into()),
        Some(c) => Cond::eq("checked_at", c.to_rfc3339()),
    };
    claimed(store, p, now, cond).await
}

/// How long the sweep leaves an open payment between checks: a minute
/// while young, then a tenth of its age (an hour-old attempt every 6
/// minutes, a day-old one every 2.4 hours), so abandoned attempts cost
/// little.
pub fn check_gap(payment: &Payment, now: Timestamp) -> chrono::Duration {
    let age = now.datetime() - payment.created_at.datetime();
    std::cmp::max(RECONCILE_AFTER, age / 10)
}

/// What one run of [`sweep`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Open sessions past their 30 minutes, now stored as `expired`.
    pub sessions_expired: usize,
    /// Open payments whose provider was asked what became of them.
    pub payments_checked: usize,
    /// Payments that reached a final state through that check.
    pub payments_settled: usize,
    /// Provider or store errors met (the next run tries again).
    pub errors: usize,
    /// Refunds left `processing` that were checked with Khalti, and how
    /// many of them that settled.
    pub refunds_checked: usize,
    pub refunds_resolved: usize,
}

/// Whether the sweep should ask the provider about `p` at `now`.
pub fn due_for_check(p: &Payment, now: Timestamp) -> bool {
    next_check_at(p) <= now
}

/// The due entries of one `gsi2` partition (sort key before
/// `{now}#~`), at most `limit`, oldest due first.
async fn due_in(
    store: &dyn Store,
    pk: String,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Payment>, StoreError> {
    let query = Query::partition(pk)
        .on(Index::Gsi2)
        .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())))
        .limit(limit);
    let page = store.query(&query).await?;
    let mut out = Vec::with_capacity(page.items.len());
    for item in page.items {
        match from_item::<Payment>(item) {
            Ok(p) => out.push(p),
            Err(e) => {
                tracing::warn!(error = %e, "unreadable payment in a sweep partition passed over")
            }
        }
    }
    Ok(out)
}

/// Payments of the former global partitions (`OPEN#PAY#0..3`, by
/// creation) created before `before`: at most [`SWEEP_BATCH`] per
/// partition that are due a check (or, for cancelled ones, due to leave
/// the index), reading at most [`SWEEP_SCAN`] entries per partition.
async fn legacy_open_payments(
    store: &dyn Store,
    before: Timestamp,
    now: Timestamp,
) -> Result<Vec<Payment>, StoreError> {
    let mut out = Vec::new();
    for pk in open_partitions(OPEN_PAYMENTS) {
        let mut query = Query::partition(pk)
            .on(Index::Gsi2)
            .sk(SkCond::Lt(format!("{}#~", before.to_rfc3339())))
            .limit(SWEEP_BATCH);
        let (mut taken, mut scanned) = (0, 0);
        loop {
            let page = store.query(&query).await?;
            scanned += page.items.len();
            for item in page.items {
                let p: Payment = from_item(item)?;
                let leaving = p.checks.recheck_until.is_some_and(|u| u <= now);
                if leaving || due_for_check(&p, now) {
                    out.push(p);
                    taken += 1;
                }
            }
            match page.last_key {
                Some(last) if taken < SWEEP_BATCH && scanned < SWEEP_SCAN => {
                    query.start_after = Some(last);
                }
                _ => break,
            }
        }
    }
    Ok(out)
}

/// One project's due reconciler work.
struct ProjectDue {
    active: super::active::Active,
    payments: Vec<Payment>,
}

/// What the reconciler checks this sweep, in order: each project (and
/// mode) with open work gives at most [`SWEEP_BATCH`] open payments whose
/// next check is due and [`RECHECK_BATCH`] cancelled ones, earliest due
/// first; the projects take turns one payment at a time (round-robin,
/// starting from a project that moves every minute), up to
/// [`SWEEP_BUDGET`] in all. A project with ten thousand due attempts thus
/// delays another project's due payment by at most one turn. Payments of
/// the former global partitions take one turn like a project. Also
/// answers the registry entries whose project had nothing open.
pub async fn open_payments(
    store: &dyn Store,
    active: &[super::active::Active],
    now: Timestamp,
) -> Result<(Vec<Payment>, Vec<super::active::Active>), StoreError> {
    let per_project: Vec<Result<ProjectDue, StoreError>> =
        futures::stream::iter(active.iter().cloned().map(|a| async move {
            let open = open_payments_partition(&a.project_id, a.mode);
            let mut payments = due_in(store, open, now, SWEEP_BATCH).await?;
            let recheck = recheck_partition(&a.project_id, a.mode);
            payments.extend(due_in(store, recheck, now, RECHECK_BATCH).await?);
            payments.sort_by_key(next_check_at);
            Ok(ProjectDue {
                active: a,
                payments,
            })
        }))
        .buffered(SWEEP_PARALLEL)
        .collect()
        .await;
    let mut queues = Vec::with_capacity(per_project.len() + 1);
    let mut idle = Vec::new();
    for due in per_project {
        let due = due?;
        if due.payments.is_empty() {
            if now >= due.active.touched_at.plus(super::active::IDLE_AFTER) {
                idle.push(due.active);
            }
        } else {
            queues.push(due.payments.into_iter());
        }
    }
    let legacy = legacy_open_payments(store, now.plus(-RECONCILE_AFTER), now).await?;
    if !legacy.is_empty() {
        queues.push(legacy.into_iter());
    }
    if !queues.is_empty() {
        let turn = usize::try_from(now.unix_seconds() / 60).unwrap_or(0) % queues.len();
        queues.rotate_left(turn);
    }
    let mut out = Vec::new();
    while out.len() < SWEEP_BUDGET && !queues.is_empty() {
        queues.retain_mut(|q| match q.next() {
            Some(p) if out.len() < SWEEP_BUDGET => {
                out.push(p);
                true
            }
            _ => false,
        });
    }
    Ok((out, idle))
}

/// Takes a cancelled payment out of the reconciler's index once its
/// re-check window passed.
async fn retire(store: &dyn Store, p: &Payment) -> Result<(), StoreError> {
    let update = Update::new().remove("recheck_until").unindex(Index::Gsi2);
    match store
        .update(
            &Payment::key(&p.id),
            update,
            Some(Cond::eq("status", "cancelled")),
        )
        .await
    {
        Ok(_) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The scheduled pass: expires due sessions and reconciles open payments
/// with their providers when each is due ([`open_payments`]).
pub async fn sweep(state: &Deps, now: Timestamp) -> Result<SweepReport, StoreError> {
    let store = &*state.store;
    let mut report = SweepReport::default();
    let active = super::active::all(store).await?;
    let due = checkout::due_for_expiry(store, &active, now, EXPIRE_BATCH).await?;
    let expired: Vec<(String, Result<bool, StoreError>)> = futures::stream::iter(due)
        .map(|id| async move {
            let r = checkout::expire_due(store, &id, now).await;
            (id, r)
        })
        .buffer_unordered(SWEEP_PARALLEL)
        .collect()
        .await;
    for (id, r) in expired {
        match r {
            Ok(true) => report.sessions_expired += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "could not expire a session");
                report.errors += 1;
            }
        }
    }
    // Refunds first: a long reconciling pass must not starve them.
    let refunds = super::refunds::sweep(state, now).await?;
    report.refunds_checked = refunds.checked;
    report.refunds_resolved = refunds.resolved;
    report.errors += refunds.errors;
    let (due, idle) = open_payments(store, &active, now).await?;
    // No new provider check starts after the deadline: the rest are due
    // again at the next run (one run at a time, a minute apart).
    let started = std::time::Instant::now();
    let results: Vec<(Payment, Option<Result<Payment, AttemptError>>)> =
        futures::stream::iter(due.into_iter().map(|p| async move {
            if started.elapsed() >= SWEEP_DEADLINE {
                return (p, None);
            }
            // A payment of the former global partitions may move to its
            // project's partitions (a cancel re-checked): the project must
            // be in the registry that finds them.
            if p.checks.recheck_until.is_none_or(|u| u > now) {
                if let Err(e) = super::active::touch(store, &p.project_id, p.mode, now).await {
                    return (p, Some(Err(e.into())));
                }
            }
            let r = match claim_as_read(store, &p, now).await {
                Ok(true) => Some(reconcile(state, &p, now).await),
                Ok(false) => None,
                Err(e) => Some(Err(e.into())),
            };
            // A cancelled payment past its day of re-checks: asked one last
            // time above, it leaves the index if still cancelled.
            if p.checks.recheck_until.is_some_and(|u| u <= now)
                && matches!(&r, Some(Ok(after)) if after.status == PaymentStatus::Cancelled)
            {
                if let Err(e) = retire(store, &p).await {
                    return (p, Some(Err(e.into())));
                }
            }
            (p, r)
        }))
        .buffer_unordered(SWEEP_PARALLEL)
        .collect()
        .await;
    for (before, r) in results {
        let Some(r) = r else {
            continue;
        };
        report.payments_checked += 1;
        match r {
            Ok(p) if p.status != before.status && !is_open(p.status) => {
                report.payments_settled += 1;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(payment = %before.id, error = %e, "reconcile failed; next sweep retries");
                report.errors += 1;
            }
        }
    }
    // Projects with nothing open for a while leave the registry (kept if
    // they have an open session or anything was written since the read).
    for a in idle {
        let quiet = !checkout::has_open_sessions(store, &a.project_id, a.mode).await?
            && !has_indexed_payments(store, &a).await?;
        if quiet {
            super::active::retire(store, &a, now).await?;
        }
    }
    tracing::info!(
        refunds_checked = report.refunds_checked,
        refunds_resolved = report.refunds_resolved,
        sessions_expired = report.sessions_expired,
        payments_checked = report.payments_checked,
        payments_settled = report.payments_settled,
        errors = report.errors,
        "sweep done"
    );
    Ok(report)
}

/// Whether any payment of the project sits in its open or re-check
/// partition, due or not.
async fn has_indexed_payments(
    store: &dyn Store,
    a: &super::active::Active,
) -> Result<bool, StoreError> {
    for pk in [
        open_payments_partition(&a.project_id, a.mode),
        recheck_partition(&a.project_id, a.mode),
    ] {
        let query = Query::partition(pk).on(Index::Gsi2).limit(1);
        if !store.query(&query).await?.items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AppState;
    use crate::domain::checkout::{CreateCheckout, Creator, validate_create};
    use crate::domain::outbox;
    use crate::money::Paisa;
    use crate::providers::ProviderCredentials;
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::at;
    use crate::time::ManualClock;
    use base64::Engine;
    use std::sync::Arc;

    /// What a sweep at `now` would check.
    async fn due_now(store: &dyn Store, now: Timestamp) -> Vec<Payment> {
        let active = crate::domain::active::all(store).await.unwrap();
        open_payments(store, &active, now).await.unwrap().0
    }

    /// What a sweep at `now` would expire.
    async fn expiring(store: &dyn Store, now: Timestamp, limit: usize) -> Vec<String> {
        let active = crate::domain::active::all(store).await.unwrap();
        checkout::due_for_expiry(store, &active, now, limit)
            .await
            .unwrap()
    }

    fn state(now: Timestamp) -> AppState {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
        AppState::new(
            store,
            Arc::new(ManualClock::new(now)),
            crate::Config {
                public_base_url: "https://pay.example".into(),
            },
        )
    }

    /// A session in `initiated` with one pending attempt at `provider`.
    async fn attempt(st: &Deps, provider: Provider, now: Timestamp) -> (CheckoutSession, Payment) {
        let req: CreateCheckout = serde_json::from_value(json!({
            "amount": 100_000, "returnUrl": "https://shop.example/thanks"
        }))
        .unwrap();
        let valid = validate_create(req, Mode::Sandbox).unwrap();
        let creator = Creator {
            project_id: "proj_1".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: None,
        };
        let session = checkout::create(&*st.store, &creator, valid, now, None)
            .await
            .unwrap();
        let payment = add_attempt(st, &session, provider, "REF1", now).await;
        let session = checkout::find_any(&*st.store, &session.id, now)
            .await
            .unwrap()
            .unwrap();
        (session, payment)
    }

    /// A new session of `project` (sandbox, NPR 1,000).
    async fn session_of(st: &Deps, project: &str, now: Timestamp) -> CheckoutSession {
        let req: CreateCheckout = serde_json::from_value(json!({
            "amount": 100_000, "returnUrl": "https://shop.example/thanks"
        }))
        .unwrap();
        let valid = validate_create(req, Mode::Sandbox).unwrap();
        let creator = Creator {
            project_id: project.into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: None,
        };
        checkout::create(&*st.store, &creator, valid, now, None)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn one_projects_backlog_does_not_delay_anothers_due_payments() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        // 300 attempts of one project, all due, created first...
        for i in 0..30 {
            let s = session_of(&st, "proj_junk", now).await;
            for j in 0..10 {
                add_attempt(&st, &s, Provider::Esewa, &format!("J{i}-{j}"), now).await;
            }
        }
        // ...then three genuine ones of another project.
        let mut genuine = Vec::new();
        for i in 0..3 {
            let at = now.plus(chrono::Duration::minutes(5));
            let s = session_of(&st, "proj_real", at).await;
            genuine.push(
                add_attempt(&st, &s, Provider::Esewa, &format!("G{i}"), at)
                    .await
                    .id,
            );
        }
        let due = due_now(&*st.store, now.plus(chrono::Duration::minutes(10))).await;
        let first: Vec<&str> = due.iter().take(6).map(|p| p.project_id.as_str()).collect();
        assert_eq!(
            first.iter().filter(|p| **p == "proj_real").count(),
            3,
            "the projects take turns: {first:?}"
        );
        for g in &genuine {
            assert!(due.iter().take(6).any(|p| &p.id == g));
        }
        let junk = due.iter().filter(|p| p.project_id == "proj_junk").count();
        assert_eq!(junk, SWEEP_BATCH, "at most a batch per project and sweep");
        // Checked now, the next turn goes to those not yet checked.
        let later = now.plus(chrono::Duration::minutes(10));
        for p in &due {
            assert!(claim_as_read(&*st.store, p, later).await.unwrap());
        }
        let next = due_now(&*st.store, later).await;
        assert!(next.iter().all(|p| p.project_id == "proj_junk"));
        assert!(
            next.iter().all(|p| !due.iter().any(|d| d.id == p.id)),
            "by next check"
        );
        // A claim lost to a concurrent checker is not taken twice.
        assert!(!claim_as_read(&*st.store, &due[0], later).await.unwrap());
    }

    async fn add_attempt(
        st: &Deps,
        session: &CheckoutSession,
        provider: Provider,
        reference: &str,
        now: Timestamp,
    ) -> Payment {
        let p = Payment {
            id: ids::new_id(IdKind::Payment),
            project_id: session.project_id.clone(),
            checkout_session_id: session.id.clone(),
            mode: session.mode,
            amount: session.amount,
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            provider,
            status: PaymentStatus::Pending,
            provider_ref: None,
            failure_reason: None,
            metadata: Default::default(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: now,
            updated_at: now,
            double_payment_of: None,
            attempt: AttemptInfo {
                reference: Some(reference.into()),
                provider_token: Some("pidx-1".into()),
                ..Default::default()
            },
            checks: Default::default(),
        };
        st.store
            .transact(vec![
                TxOp::Put {
                    item: to_item(&p, &Payment::key(&p.id), &payment_indexes(&p)).unwrap(),
                    cond: Some(Cond::NotExists),
                },
                TxOp::Update {
                    key: CheckoutSession::key(&session.id),
                    update: Update::new()
                        .set("status", "initiated")
                        .set("payment_id", p.id.clone()),
                    cond: None,
                },
            ])
            .await
            .unwrap();
        p
    }

    async fn load(st: &Deps, p: &Payment) -> (CheckoutSession, Payment) {
        let s = checkout::find_any(
            &*st.store,
            &p.checkout_session_id,
            at("2026-11-22T10:00:00Z"),
        )
        .await
        .unwrap()
        .unwrap();
        let p = find_payment(&*st.store, &s.id, &p.id)
            .await
            .unwrap()
            .unwrap();
        (s, p)
    }

    async fn events(st: &Deps) -> Vec<(EventType, String)> {
        outbox::recent(&*st.store, "proj_1", Mode::Sandbox, 50)
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.event_type,
                    e.object["id"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    fn paid(amount: i64) -> ProviderStatus {
        ProviderStatus {
            state: ProviderState::Paid,
            amount: Some(Paisa::new(amount).unwrap()),
            provider_ref: Some("TXN-9".into()),
            raw_status: "COMPLETE".into(),
        }
    }

    fn with_state(state: ProviderState, raw: &str) -> ProviderStatus {
        ProviderStatus {
            state,
            amount: None,
            provider_ref: None,
            raw_status: raw.into(),
        }
    }

    fn payment_of(amount: i64) -> Payment {
        Payment {
            id: "pay_1".into(),
            project_id: "proj_1".into(),
            checkout_session_id: "cs_1".into(),
            mode: Mode::Sandbox,
            amount: Paisa::new(amount).unwrap(),
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            provider: Provider::Esewa,
            status: PaymentStatus::Pending,
            provider_ref: None,
            failure_reason: None,
            metadata: Default::default(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: at("2026-11-22T10:00:00Z"),
            updated_at: at("2026-11-22T10:00:00Z"),
            double_payment_of: None,
            attempt: AttemptInfo {
                reference: Some("250610-162413".into()),
                provider_token: Some("pidx-1".into()),
                ..Default::default()
            },
            checks: Default::default(),
        }
    }

    #[test]
    fn only_a_paid_status_of_the_right_amount_is_success() {
        let p = payment_of(100_000);
        assert!(
            matches!(decide(&p, &paid(100_000), false), Decision::Success { provider_ref: Some(r) } if r == "TXN-9")
        );
        // No amount named: fine for Fonepay (its status has none; the
        // amount is the one we minted or signed), held for eSewa and
        // Khalti, which always state it. A different amount is held too.
        let mut no_amount = paid(1);
        no_amount.amount = None;
        assert!(matches!(decide(&p, &no_amount, false), Decision::Review(_)));
        let mut fonepay = p.clone();
        fonepay.provider = Provider::Fonepay;
        assert!(matches!(
            decide(&fonepay, &no_amount, false),
            Decision::Success { .. }
        ));
        assert!(matches!(
            decide(&p, &paid(99_999), false),
            Decision::Review(_)
        ));
        assert!(matches!(
            decide(&p, &paid(100_001), false),
            Decision::Review(_)
        ));
        for (state, expected) in [
            (ProviderState::Pending, "processing"),
            (ProviderState::Ambiguous, "processing"),
            (ProviderState::Failed, "failed"),
            (ProviderState::Cancelled, "cancelled"),
            (ProviderState::Expired, "cancelled"),
            (ProviderState::Refunded { partial: false }, "review"),
        ] {
            let got = match decide(&p, &with_state(state, "X"), false) {
                Decision::Processing => "processing",
                Decision::Failed(_) => "failed",
                Decision::NotStarted(_) => "not started",
                Decision::Cancelled(_) => "cancelled",
                Decision::Hold(_) => "hold",
                Decision::Review(_) => "review",
                Decision::Success { .. } => "success",
            };
            assert_eq!(got, expected, "{state:?}");
        }
        // An attempt the provider forgot is cancelled only once the
        // session is over (the customer may still be on the provider's page).
        let nf = with_state(ProviderState::NotFound, "NOT_FOUND");
        assert!(matches!(decide(&p, &nf, false), Decision::Hold(_)));
        assert!(matches!(decide(&p, &nf, true), Decision::Cancelled(_)));
    }

    const DOC_CALLBACK: &str = r#"{"transaction_code":"000AWEO","status":"COMPLETE","total_amount":"1000.0","transaction_uuid":"250610-162413","product_code":"EPAYTEST","signed_field_names":"transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names","signature":"62GcfZTmVkzhtUeh+QJ1AqiJrjoWWGof3U+eTPTZ7fA="}"#;

    fn esewa_creds() -> ProviderCredentials {
        ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "8gBm/:&EnhH.1/q".into(),
        }
    }

    fn data_param(json: &str) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(json);
        form_urlencoded::Serializer::new(String::new())
            .append_pair("data", &b64)
            .finish()
    }

    #[test]
    fn an_esewa_return_must_be_signed_ours_and_of_our_amount() {
        let p = payment_of(100_000);
        let good = data_param(DOC_CALLBACK);
        assert_eq!(
            verify_return(&p, &esewa_creds(), ReturnKind::Ok, &good),
            Ok(())
        );
        // Tampered amount: the signature no longer verifies.
        let tampered = data_param(&DOC_CALLBACK.replace("\"1000.0\"", "\"10.0\""));
        assert!(verify_return(&p, &esewa_creds(), ReturnKind::Ok, &tampered).is_err());
        // Another merchant's key.
        let other = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "another-secret".into(),
        };
        assert!(verify_return(&p, &other, ReturnKind::Ok, &good).is_err());
        // A genuine return replayed onto another attempt, or for another
        // amount.
        let mut other_attempt = p.clone();
        other_attempt.attempt.reference = Some("250610-999999".into());
        assert!(verify_return(&other_attempt, &esewa_creds(), ReturnKind::Ok, &good).is_err());
        assert!(
            verify_return(&payment_of(200_000), &esewa_creds(), ReturnKind::Ok, &good).is_err()
        );
        // No data on a success return: unsigned, not believed. The failure
        // return carries nothing by design: the status check decides.
        assert!(verify_return(&p, &esewa_creds(), ReturnKind::Ok, "").is_err());
        assert_eq!(
            verify_return(&p, &esewa_creds(), ReturnKind::Fail, ""),
            Ok(())
        );
    }

    #[test]
    fn a_khalti_return_must_name_our_pidx_order_and_amount() {
        let mut p = payment_of(100_000);
        p.provider = Provider::Khalti;
        let creds = ProviderCredentials::Khalti {
            secret_key: "k".into(),
        };
        let ok = "pidx=pidx-1&status=Completed&purchase_order_id=250610-162413&amount=100000";
        assert_eq!(verify_return(&p, &creds, ReturnKind::Ok, ok), Ok(()));
        for bad in [
            "status=Completed",
            "pidx=pidx-2&status=Completed",
            "pidx=pidx-1&purchase_order_id=OTHER",
            "pidx=pidx-1&amount=1000",
        ] {
            assert!(
                verify_return(&p, &creds, ReturnKind::Ok, bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_sandbox_qr_paid_after_its_cap_hold_is_held_for_review() {
        let mut p = payment_of(50_000);
        p.provider = Provider::Fonepay;
        p.mode = Mode::Sandbox;
        p.attempt.cap_month = Some("2026-11".into());
        let in_time = p.created_at.plus(chrono::Duration::minutes(29));
        assert!(matches!(
            decide_for(&p, &paid(50_000), None, false, in_time),
            Decision::Success { .. }
        ));
        let late = p.created_at.plus(fonepay_cap::HOLD_WINDOW);
        let d = decide_for(&p, &paid(50_000), None, true, late);
        assert!(
            matches!(&d, Decision::Review(r) if r.contains("hold lapsed")),
            "{d:?}"
        );
        // Live Fonepay has no cap hold: paid is paid.
        p.mode = Mode::Live;
        p.attempt.cap_month = None;
        assert!(matches!(
            decide_for(&p, &paid(50_000), None, true, late),
            Decision::Success { .. }
        ));
    }

    #[test]
    fn a_sandbox_qr_is_checked_once_more_just_before_its_hold_ends() {
        let mut p = payment_of(50_000);
        p.provider = Provider::Fonepay;
        p.attempt.cap_month = Some("2026-11".into());
        let last = p
            .created_at
            .plus(fonepay_cap::HOLD_WINDOW - chrono::Duration::seconds(30));
        // Checked at 28 minutes: the next gap (2.8 min) would pass the hold.
        p.checks.checked_at = Some(p.created_at.plus(chrono::Duration::minutes(28)));
        assert_eq!(next_check_at(&p), last);
        // Checked after that: the usual gap.
        p.checks.checked_at = Some(last.plus(chrono::Duration::seconds(1)));
        assert!(next_check_at(&p) > last);
        // Live Fonepay: no hold, the usual gap.
        p.mode = Mode::Live;
        p.attempt.cap_month = None;
        p.checks.checked_at = Some(p.created_at.plus(chrono::Duration::minutes(28)));
        assert!(next_check_at(&p) > last);
    }

    #[test]
    fn a_fonepay_return_must_carry_a_valid_dv_for_our_prn_and_amount() {
        let mut p = payment_of(50_000);
        p.provider = Provider::Fonepay;
        p.attempt.reference = Some("PRN1".into());
        let secret = "a7e3512f5032480a83137793cb2021dc";
        let creds = ProviderCredentials::Fonepay {
            merchant_code: "NBQM".into(),
            secret_key: secret.into(),
            username: "u".into(),
            password: "p".into(),
        };
        let query = |prn: &str, amount: &str, dv_over_amount: &str| {
            let values = [
                prn,
                "NBQM",
                "true",
                "successful",
                "UID1",
                "NICENPKA",
                "98",
                amount,
                amount,
            ];
            let mut signed = values;
            signed[7] = dv_over_amount;
            signed[8] = dv_over_amount;
            let dv = crate::providers::sign::fonepay_data_validation(secret, &signed);
            let mut s = form_urlencoded::Serializer::new(String::new());
            for (k, v) in [
                "PRN", "PID", "PS", "RC", "UID", "BC", "INI", "P_AMT", "R_AMT",
            ]
            .iter()
            .zip(values)
            {
                s.append_pair(k, v);
            }
            s.append_pair("DV", &dv);
            s.finish()
        };
        assert_eq!(
            verify_return(&p, &creds, ReturnKind::Ok, &query("PRN1", "500", "500")),
            Ok(())
        );
        // Amount changed after signing; another PRN; another amount signed.
        assert!(verify_return(&p, &creds, ReturnKind::Ok, &query("PRN1", "5", "500")).is_err());
        assert!(verify_return(&p, &creds, ReturnKind::Ok, &query("PRN2", "500", "500")).is_err());
        assert!(verify_return(&p, &creds, ReturnKind::Ok, &query("PRN1", "5", "5")).is_err());
        assert!(verify_return(&p, &creds, ReturnKind::Ok, "PRN=PRN1").is_err());
        // Genuinely signed, but the customer paid less (a discount): held
        // for a person, never success.
        let values = [
            "PRN1",
            "NBQM",
            "true",
            "successful",
            "UID1",
            "NICENPKA",
            "98",
            "400",
            "500",
        ];
        let dv = crate::providers::sign::fonepay_data_validation(secret, &values);
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            "PRN", "PID", "PS", "RC", "UID", "BC", "INI", "P_AMT", "R_AMT",
        ]
        .iter()
        .zip(values)
        {
            q.append_pair(k, v);
        }
        q.append_pair("DV", &dv);
        let discounted = verify_return(&p, &creds, ReturnKind::Ok, &q.finish());
        assert!(
            matches!(discounted, Err(Distrust { review: true, .. })),
            "{discounted:?}"
        );
        let mut held = p.clone();
        held.checks.review = Some("paid 400 of 500".into());
        let mut no_amount = paid(1);
        no_amount.amount = None;
        assert!(matches!(
            decide_for(&held, &no_amount, None, false, held.created_at),
            Decision::Hold(_)
        ));
    }

    #[tokio::test]
    async fn a_cancelled_payment_is_rechecked_for_a_day_and_can_still_succeed() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let c = apply(&st, &p, Decision::Cancelled("left".into()), now)
            .await
            .unwrap();
        assert_eq!(c.status, PaymentStatus::Cancelled);
        assert_eq!(c.checks.recheck_until, Some(now.plus(RECHECK_CANCELLED)));
        // Still in the reconciler's index...
        let soon = now.plus(chrono::Duration::minutes(5));
        let listed = due_now(&*st.store, soon).await;
        assert_eq!(
            listed.iter().map(|x| x.id.clone()).collect::<Vec<_>>(),
            vec![p.id.clone()]
        );
        // ...so a payment made after all is found and recorded.
        let ok = apply(&st, &c, decide(&c, &paid(100_000), false), soon)
            .await
            .unwrap();
        assert_eq!(ok.status, PaymentStatus::Success);
        assert_eq!(ok.checks.recheck_until, None);
        assert!(due_now(&*st.store, soon).await.is_empty());

        // Another cancelled one leaves the index after its day.
        let s2 = checkout::find_any(&*st.store, &p.checkout_session_id, now)
            .await
            .unwrap()
            .unwrap();
        let q = add_attempt(&st, &s2, Provider::Khalti, "REF3", now).await;
        apply(&st, &q, Decision::Cancelled("left".into()), now)
            .await
            .unwrap();
        let day = now.plus(RECHECK_CANCELLED);
        let due = due_now(&*st.store, day).await;
        assert_eq!(due.len(), 1);
        retire(&*st.store, &due[0]).await.unwrap();
        assert!(due_now(&*st.store, day).await.is_empty());
    }

    #[tokio::test]
    async fn a_person_lists_and_releases_held_payments() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let mut ps = Vec::new();
        for _ in 0..3 {
            let (_, p) = attempt(&st, Provider::Esewa, now).await;
            let h = apply(&st, &p, Decision::Review("paid 400 of 1000".into()), now)
                .await
                .unwrap();
            assert_eq!(h.status, PaymentStatus::Processing);
            ps.push(p);
        }
        let listed: Vec<String> = held(&*st.store, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(listed.len(), 3);
        for p in &ps {
            assert!(listed.contains(&p.id));
        }
        let later = now.plus(chrono::Duration::minutes(5));
        assert!(
            due_now(&*st.store, later).await.is_empty(),
            "held: out of the reconciler's turns"
        );
        // A person confirmed the first with eSewa, found no money for the
        // second, and fixed what made the third mismatch.
        let ok = release(&st, &ps[0].id, Release::Succeed, later)
            .await
            .unwrap();
        assert_eq!(ok.status, PaymentStatus::Success);
        assert!(
            events(&st)
                .await
                .contains(&(EventType::PaymentSucceeded, ps[0].id.clone()))
        );
        let no = release(
            &st,
            &ps[1].id,
            Release::Fail("no money at eSewa".into()),
            later,
        )
        .await
        .unwrap();
        assert_eq!(no.status, PaymentStatus::Failed);
        let back = release(&st, &ps[2].id, Release::Recheck, later)
            .await
            .unwrap();
        assert_eq!(
            (back.status, back.checks.review),
            (PaymentStatus::Processing, None)
        );
        let due: Vec<String> = due_now(&*st.store, later)
            .await
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(due, vec![ps[2].id.clone()]);
        assert!(held(&*st.store, 10).await.unwrap().is_empty());
        assert!(matches!(
            release(&st, &ps[0].id, Release::Succeed, later).await,
            Err(ReleaseError::NotHeld)
        ));
        assert!(matches!(
            release(&st, "pay_missing", Release::Recheck, later).await,
            Err(ReleaseError::NotFound)
        ));
    }

    #[tokio::test]
    async fn a_payment_held_for_review_is_never_settled_from_an_older_copy() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        // A sweep read `p`, then a signed return said another amount was
        // paid and held it; the sweep's provider check then says paid.
        let held = hold_for_review(&*st.store, &p, "paid 400 of 500", now)
            .await
            .unwrap();
        assert_eq!(held.status, PaymentStatus::Processing);
        let soon = now.plus(chrono::Duration::minutes(5));
        assert!(due_now(&*st.store, soon).await.is_empty());
        let stale = decide_for(&p, &paid(100_000), None, false, now);
        assert!(matches!(stale, Decision::Success { .. }), "{stale:?}");
        let after = apply(&st, &p, stale, now).await.unwrap();
        assert_eq!(after.status, PaymentStatus::Processing);
        assert_eq!(after.checks.review.as_deref(), Some("paid 400 of 500"));
        // Nor a failure or a cancel: it waits for a person.
        for d in [
            Decision::Failed("x".into()),
            Decision::Cancelled("x".into()),
        ] {
            let after = apply(&st, &p, d, now).await.unwrap();
            assert_eq!(after.status, PaymentStatus::Processing);
        }
        assert!(events(&st).await.is_empty());
    }

    #[tokio::test]
    async fn a_paid_answer_for_another_amount_holds_the_payment_for_good() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let d = decide_for(&p, &paid(99_999), None, false, now);
        assert!(matches!(d, Decision::Review(_)), "{d:?}");
        let held = apply(&st, &p, d, now).await.unwrap();
        assert_eq!(held.status, PaymentStatus::Processing);
        assert!(
            held.checks
                .review
                .as_deref()
                .is_some_and(|r| r.contains("99999")),
            "{:?}",
            held.checks.review
        );
        // Out of the reconciler's index; nothing later settles it, even
        // the right amount or an expiry planned from the old copy.
        let soon = now.plus(chrono::Duration::minutes(5));
        assert!(due_now(&*st.store, soon).await.is_empty());
        for later in [
            decide(&p, &paid(100_000), false),
            Decision::Cancelled("the provider's payment window closed".into()),
        ] {
            let after = apply(&st, &p, later, soon).await.unwrap();
            assert_eq!(after.status, PaymentStatus::Processing);
        }
        assert!(events(&st).await.is_empty());
        // A settled payment is never held.
        let (_, q) = attempt(&st, Provider::Khalti, now).await;
        let ok = apply(&st, &q, decide(&q, &paid(100_000), false), now)
            .await
            .unwrap();
        assert_eq!(ok.status, PaymentStatus::Success);
        let after = apply(&st, &ok, Decision::Review("late".into()), soon)
            .await
            .unwrap();
        assert_eq!(after.status, PaymentStatus::Success);
        assert_eq!(after.checks.review, None);
    }

    #[tokio::test]
    async fn the_settling_write_itself_refuses_a_payment_held_for_review() {
        let now = at("2026-11-22T10:00:00Z");
        for decision in [
            Decision::Success { provider_ref: None },
            Decision::Failed("declined".into()),
            Decision::Cancelled("left".into()),
            Decision::NotStarted("refused".into()),
        ] {
            let st = state(now);
            let (s, p) = attempt(&st, Provider::Esewa, now).await;
            // The plan made from the copy read before the hold landed.
            let ops = plan(&p, Some(&s), None, &decision, now).unwrap().unwrap();
            hold_for_review(&*st.store, &p, "paid 400 of 500", now)
                .await
                .unwrap();
            assert!(st.store.transact(ops).await.is_err(), "{decision:?}");
            let (_, after) = load(&st, &p).await;
            assert_eq!(after.status, PaymentStatus::Processing, "{decision:?}");
            assert!(events(&st).await.is_empty(), "{decision:?}");
        }
    }

    #[tokio::test]
    async fn a_cancelled_payment_paid_another_amount_is_held_not_settled_later() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let c = apply(&st, &p, Decision::Cancelled("left".into()), now)
            .await
            .unwrap();
        assert_eq!(c.status, PaymentStatus::Cancelled);
        let held = hold_for_review(&*st.store, &c, "paid 400 of 500", now)
            .await
            .unwrap();
        assert_eq!(held.status, PaymentStatus::Processing);
        assert_eq!(held.checks.review.as_deref(), Some("paid 400 of 500"));
        assert_eq!(held.checks.recheck_until, None);
        // Out of the reconciler's index, also once the day is over.
        let day = now
            .plus(RECHECK_CANCELLED)
            .plus(chrono::Duration::minutes(1));
        assert!(due_now(&*st.store, day).await.is_empty());
        // The day's recheck of the cancelled payment then says paid.
        let later = now.plus(chrono::Duration::hours(1));
        let d = decide_for(&c, &paid(100_000), None, true, later);
        let after = apply(&st, &c, d, later).await.unwrap();
        assert_eq!(after.status, PaymentStatus::Processing);
        assert!(
            !events(&st)
                .await
                .iter()
                .any(|(t, _)| *t == EventType::PaymentSucceeded)
        );
    }

    #[tokio::test]
    async fn the_sweep_reads_past_payments_that_are_not_due() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (s, _) = attempt(&st, Provider::Esewa, now).await;
        // 60 old attempts checked a moment ago, then one never checked.
        let later = now.plus(chrono::Duration::minutes(10));
        for i in 0..60 {
            let p = add_attempt(&st, &s, Provider::Esewa, &format!("OLD{i}"), now).await;
            assert!(
                claim_check(&*st.store, &p, later, check_gap(&p, later))
                    .await
                    .unwrap()
            );
        }
        let fresh = add_attempt(
            &st,
            &s,
            Provider::Esewa,
            "NEW",
            now.plus(chrono::Duration::seconds(1)),
        )
        .await;
        let active = crate::domain::active::all(&*st.store).await.unwrap();
        let (due, _) = open_payments(&*st.store, &active, later).await.unwrap();
        assert!(due.iter().any(|p| p.id == fresh.id), "{} due", due.len());
        assert!(due.len() <= 2, "only the unchecked ones: {}", due.len());
    }

    #[tokio::test]
    async fn success_settles_payment_and_session_with_one_event() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let later = now.plus(chrono::Duration::minutes(1));
        let settled = apply(&st, &p, decide(&p, &paid(100_000), false), later)
            .await
            .unwrap();
        assert_eq!(settled.status, PaymentStatus::Success);
        assert_eq!(settled.provider_ref.as_deref(), Some("TXN-9"));
        let (s, _) = load(&st, &p).await;
        assert_eq!(s.status, SessionStatus::Success);
        assert_eq!(s.payment_id.as_deref(), Some(p.id.as_str()));
        assert_eq!(
            events(&st).await,
            vec![(EventType::PaymentSucceeded, p.id.clone())]
        );
        // Settled payments leave the sweep's index; so does the session.
        assert!(
            due_now(&*st.store, later.plus(chrono::Duration::hours(1)))
                .await
                .is_empty()
        );
        assert!(
            expiring(&*st.store, later.plus(chrono::Duration::hours(1)), 10)
                .await
                .is_empty()
        );
        // Applying again (a replayed return, the next sweep) changes nothing.
        let again = apply(&st, &p, decide(&p, &paid(100_000), false), later)
            .await
            .unwrap();
        assert_eq!(again, settled);
        assert_eq!(events(&st).await.len(), 1);
        // A late "failed" cannot undo a success.
        let after = apply(&st, &p, Decision::Failed("x".into()), later)
            .await
            .unwrap();
        assert_eq!(after.status, PaymentStatus::Success);
    }

    #[tokio::test]
    async fn racing_settlements_write_one_success_and_one_event() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Khalti, now).await;
        let mut tasks = Vec::new();
        for _ in 0..12 {
            let st = st.clone();
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                apply(&st, &p, decide(&p, &paid(100_000), false), now).await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().status, PaymentStatus::Success);
        }
        assert_eq!(
            events(&st).await,
            vec![(EventType::PaymentSucceeded, p.id.clone())]
        );
    }

    #[tokio::test]
    async fn a_second_success_for_a_session_is_kept_and_flagged() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (s, first) = attempt(&st, Provider::Esewa, now).await;
        let second = add_attempt(&st, &s, Provider::Khalti, "REF2", now).await;
        apply(&st, &second, decide(&second, &paid(100_000), false), now)
            .await
            .unwrap();
        let late = apply(&st, &first, decide(&first, &paid(100_000), false), now)
            .await
            .unwrap();
        assert_eq!(late.status, PaymentStatus::Success);
        assert_eq!(late.double_payment_of.as_deref(), Some(second.id.as_str()));
        let (s, _) = load(&st, &second).await;
        assert_eq!(s.payment_id.as_deref(), Some(second.id.as_str()));
        let view = serde_json::to_value(PaymentView::from(late)).unwrap();
        assert_eq!(view["doublePaymentOf"], second.id.as_str());
        assert_eq!(events(&st).await.len(), 2);
    }

    #[tokio::test]
    async fn cancel_returns_to_the_picker_and_decline_ends_the_session() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let c = apply(
            &st,
            &p,
            decide(&p, &with_state(ProviderState::Cancelled, "CANCELED"), false),
            now,
        )
        .await
        .unwrap();
        assert_eq!(c.status, PaymentStatus::Cancelled);
        let (s, _) = load(&st, &p).await;
        assert_eq!(s.status, SessionStatus::Pending);

        let p2 = add_attempt(&st, &s, Provider::Khalti, "REF2", now).await;
        let processing = apply(&st, &p2, Decision::Processing, now).await.unwrap();
        assert_eq!(processing.status, PaymentStatus::Processing);
        let f = apply(
            &st,
            &p2,
            decide(&p2, &with_state(ProviderState::Failed, "Failed"), false),
            now,
        )
        .await
        .unwrap();
        assert_eq!(f.status, PaymentStatus::Failed);
        assert!(f.failure_reason.is_some());
        let (s, _) = load(&st, &p2).await;
        assert_eq!(s.status, SessionStatus::Failed);
        assert_eq!(
            events(&st).await,
            vec![
                (EventType::PaymentFailed, p2.id.clone()),
                (EventType::PaymentCancelled, p.id.clone()),
            ]
        );
    }

    #[tokio::test]
    async fn money_taken_after_the_session_expired_is_still_recorded() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (s, p) = attempt(&st, Provider::Esewa, now).await;
        let late = now.plus(chrono::Duration::minutes(31));
        assert_eq!(expiring(&*st.store, late, 10).await, vec![s.id.clone()]);
        assert!(checkout::expire_due(&*st.store, &s.id, late).await.unwrap());
        // The provider forgot the attempt: cancelled, session stays expired.
        let nf = with_state(ProviderState::NotFound, "NOT_FOUND");
        let c = apply(&st, &p, decide(&p, &nf, true), late).await.unwrap();
        assert_eq!(c.status, PaymentStatus::Cancelled);
        assert_eq!(load(&st, &p).await.0.status, SessionStatus::Expired);
        // ...but then it reports paid after all: money moved, so record it.
        let ok = apply(&st, &c, decide(&c, &paid(100_000), true), late)
            .await
            .unwrap();
        assert_eq!(ok.status, PaymentStatus::Success);
        assert_eq!(load(&st, &p).await.0.status, SessionStatus::Success);
    }

    #[test]
    fn a_failure_return_the_provider_does_not_know_is_a_cancel() {
        let p = payment_of(100_000);
        let now = p.created_at;
        let nf = with_state(ProviderState::NotFound, "NOT_FOUND");
        let fail = Some(ReturnKind::Fail);
        assert!(matches!(
            decide_for(&p, &nf, fail, false, now),
            Decision::Cancelled(_)
        ));
        assert!(matches!(
            decide_for(&p, &nf, Some(ReturnKind::Ok), false, now),
            Decision::Hold(_)
        ));
        assert!(matches!(
            decide_for(&p, &nf, None, false, now),
            Decision::Hold(_)
        ));
        // Any other answer decides as always (a failure return is no proof
        // of failure: a paid status still wins).
        assert!(matches!(
            decide_for(&p, &paid(100_000), fail, false, now),
            Decision::Success { .. }
        ));
    }

    #[test]
    fn pending_is_processing_only_after_the_customer_says_paid() {
        let p = payment_of(100_000);
        let now = p.created_at.plus(chrono::Duration::minutes(2));
        let pending = with_state(ProviderState::Pending, "pending");
        let ok = Some(ReturnKind::Ok);
        assert_eq!(
            decide_for(&p, &pending, ok, false, now),
            Decision::Processing
        );
        // An unscanned QR, a wallet page left open: not paid yet.
        assert!(matches!(
            decide_for(&p, &pending, None, false, now),
            Decision::Hold(_)
        ));
        // A day after it began, with the session over: abandoned.
        let later = p.created_at.plus(ABANDONED_AFTER);
        assert!(matches!(
            decide_for(&p, &pending, None, false, later),
            Decision::Hold(_)
        ));
        assert!(matches!(
            decide_for(&p, &pending, None, true, later),
            Decision::Cancelled(_)
        ));
        // A payment the customer said was paid stays processing (review).
        let mut processing = p.clone();
        processing.status = PaymentStatus::Processing;
        assert_eq!(
            decide_for(&processing, &pending, None, true, later),
            Decision::Processing
        );
        // Ambiguous is processing whatever the trigger.
        let amb = with_state(ProviderState::Ambiguous, "AMBIGUOUS");
        assert_eq!(decide_for(&p, &amb, None, false, now), Decision::Processing);
    }

    #[test]
    fn old_open_payments_are_checked_less_often() {
        let p = payment_of(100_000);
        let at_age = |m: i64| check_gap(&p, p.created_at.plus(chrono::Duration::minutes(m)));
        assert_eq!(at_age(2), RECONCILE_AFTER);
        assert_eq!(at_age(60), chrono::Duration::minutes(6));
        assert_eq!(at_age(24 * 60), chrono::Duration::minutes(144));
    }

    #[tokio::test]
    async fn one_check_is_claimed_per_gap() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let gap = chrono::Duration::seconds(3);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let store = st.store.clone();
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                claim_check(&*store, &p, now, gap).await
            }));
        }
        let mut won = 0;
        for t in tasks {
            if t.await.unwrap().unwrap() {
                won += 1;
            }
        }
        assert_eq!(won, 1);
        assert!(
            !claim_check(&*st.store, &p, now.plus(chrono::Duration::seconds(2)), gap)
                .await
                .unwrap()
        );
        assert!(
            claim_check(&*st.store, &p, now.plus(chrono::Duration::seconds(3)), gap)
                .await
                .unwrap()
        );
        let mut missing = p.clone();
        missing.id = "pay_missing".into();
        assert!(!claim_check(&*st.store, &missing, now, gap).await.unwrap());
    }

    #[tokio::test]
    async fn an_attempt_the_provider_refused_fails_but_keeps_the_session_open() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Khalti, now).await;
        let f = apply(&st, &p, Decision::NotStarted("khalti: 503".into()), now)
            .await
            .unwrap();
        assert_eq!(f.status, PaymentStatus::Failed);
        assert_eq!(load(&st, &p).await.0.status, SessionStatus::Pending);
        assert_eq!(
            events(&st).await,
            vec![(EventType::PaymentFailed, p.id.clone())]
        );
    }

    #[test]
    fn return_urls_and_origins() {
        assert_eq!(
            return_url("https://pay.example", "cs_1", "pay_1", "ok"),
            "https://pay.example/c/cs_1/return/pay_1/ok"
        );
        assert_eq!(
            origin("https://shop.example/a/b?c=1"),
            "https://shop.example"
        );
        assert_eq!(origin("http://127.0.0.1:9/thanks"), "http://127.0.0.1:9");
    }

    /// The day counters (all shards) of the session's and payments'
    /// creation day.
    async fn counters(st: &Deps, now: Timestamp) -> std::collections::BTreeMap<String, i64> {
        crate::domain::analytics::day_totals(&*st.store, "proj_1", Mode::Sandbox, now)
            .await
            .unwrap()
    }

    fn count(c: &std::collections::BTreeMap<String, i64>, attr: &str) -> i64 {
        c.get(attr).copied().unwrap_or(0)
    }

    #[test]
    fn a_start_counts_the_payment_and_the_first_attempt_of_its_session() {
        use crate::domain::analytics::{PAYMENTS_TOTAL, SESSIONS_INITIATED, day_key};
        let now = at("2026-11-22T10:00:00Z");
        let req: CreateCheckout = serde_json::from_value(json!({
            "amount": 100_000, "returnUrl": "https://shop.example/thanks"
        }))
        .unwrap();
        let creator = Creator {
            project_id: "proj_1".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: None,
        };
        // Created yesterday, attempted today: each counts on its own day.
        let yesterday = now.plus(chrono::Duration::days(-1));
        let mut session = checkout::new_session(
            &creator,
            validate_create(req, Mode::Sandbox).unwrap(),
            yesterday,
        );
        let mut p = payment_of(100_000);
        p.provider = Provider::Khalti;
        p.created_at = now;
        let first = start_tally(&session, &p);
        let (d0, d1) = (
            day_key("proj_1", Mode::Sandbox, yesterday),
            day_key("proj_1", Mode::Sandbox, now),
        );
        assert_eq!(first.added(&d0, SESSIONS_INITIATED), 1);
        assert_eq!(first.added(&d1, SESSIONS_INITIATED), 0);
        assert_eq!(first.added(&d1, PAYMENTS_TOTAL), 1);
        assert_eq!(first.added(&d1, "khalti_count"), 1);
        // A second attempt (back at the picker after a cancel): the
        // payment counts, the session does not again.
        session.attempts = 1;
        session.payment_id = Some("pay_first".into());
        let second = start_tally(&session, &p);
        assert_eq!(second.added(&d0, SESSIONS_INITIATED), 0);
        assert_eq!(second.added(&d1, PAYMENTS_TOTAL), 1);
    }

    #[tokio::test]
    async fn a_success_counts_once_for_the_payment_and_its_session() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Khalti, now).await;
        let ok = apply(&st, &p, decide(&p, &paid(100_000), false), now)
            .await
            .unwrap();
        assert_eq!(ok.status, PaymentStatus::Success);
        // A replayed success changes nothing.
        apply(&st, &ok, decide(&ok, &paid(100_000), false), now)
            .await
            .unwrap();
        let c = counters(&st, now).await;
        assert_eq!(count(&c, "sessions_created"), 1);
        assert_eq!(count(&c, "sessions_paid"), 1);
        assert_eq!(count(&c, "payments_success"), 1);
        assert_eq!(count(&c, "payments_failed"), 0);
        assert_eq!(count(&c, "success_volume_paisa"), 100_000);
        assert_eq!(count(&c, "khalti_success"), 1);
        assert_eq!(count(&c, "khalti_success_volume"), 100_000);
    }

    #[tokio::test]
    async fn a_decline_and_a_failed_start_count_as_failed_once() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let f = apply(&st, &p, Decision::Failed("declined".into()), now)
            .await
            .unwrap();
        apply(&st, &f, Decision::Failed("declined".into()), now)
            .await
            .unwrap();
        let (_, q) = attempt(&st, Provider::Esewa, now).await;
        apply(&st, &q, Decision::NotStarted("esewa: 503".into()), now)
            .await
            .unwrap();
        let c = counters(&st, now).await;
        assert_eq!(count(&c, "payments_failed"), 2);
        assert_eq!(count(&c, "payments_success"), 0);
        assert_eq!(count(&c, "sessions_paid"), 0);
    }

    #[tokio::test]
    async fn a_cancel_counts_in_no_outcome_until_it_succeeds_after_all() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let c = apply(&st, &p, Decision::Cancelled("left".into()), now)
            .await
            .unwrap();
        let counted = counters(&st, now).await;
        assert_eq!(count(&counted, "payments_failed"), 0);
        assert_eq!(count(&counted, "payments_success"), 0);
        // Paid after all, the next day: counted on its creation day.
        let later = now.plus(chrono::Duration::hours(20));
        apply(&st, &c, decide(&c, &paid(100_000), false), later)
            .await
            .unwrap();
        let counted = counters(&st, now).await;
        assert_eq!(count(&counted, "payments_success"), 1);
        assert_eq!(count(&counted, "sessions_paid"), 1);
        assert!(counters(&st, later).await.is_empty());
    }

    #[tokio::test]
    async fn a_double_payment_counts_the_payment_but_not_the_session_again() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let (s, first) = attempt(&st, Provider::Khalti, now).await;
        let first = apply(&st, &first, Decision::Cancelled("left".into()), now)
            .await
            .unwrap();
        let second = add_attempt(&st, &s, Provider::Khalti, "REF2", now).await;
        apply(&st, &second, decide(&second, &paid(100_000), false), now)
            .await
            .unwrap();
        // The first attempt was paid at the provider too.
        let late = apply(&st, &first, decide(&first, &paid(100_000), false), now)
            .await
            .unwrap();
        assert!(late.double_payment_of.is_some());
        let c = counters(&st, now).await;
        assert_eq!(count(&c, "payments_success"), 2);
        assert_eq!(count(&c, "sessions_paid"), 1);
    }
}
