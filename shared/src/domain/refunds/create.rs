//! Creating a refund: the request, the balance reserved on the payment in
//! the same transaction, and the call to Khalti where it refunds by API.

use serde::Deserialize;

use super::resolve::{Outcome, get, resolve};
use super::{Refund, RefundReason, RefundStatus, TRIES};
use crate::app::Deps;
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::{self, Changes, Record};
use crate::domain::{Provider, Tenant};
use crate::fields::{NepaliMobile, RefundNotes};
use crate::ids::{PaymentId, RefundId};
use crate::money::{Currency, Paisa};
use crate::providers::ProviderError;
use crate::refusal::{Kind, Refusal};
use crate::store::fence::Fence;
use crate::store::{Cond, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// The body of `POST /v1/refunds`. Unknown fields refused.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRefund {
    pub payment_id: String,
    /// Paisa, at most what is left to refund.
    #[schema(minimum = 1)]
    pub amount: i64,
    pub reason: RefundReason,
    #[serde(default)]
    pub notes: Option<RefundNotes>,
    #[serde(default)]
    pub mobile_number: Option<NepaliMobile>,
}

/// Why a refund was not created.
#[derive(Debug, thiserror::Error)]
pub enum RefundError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("no such payment")]
    PaymentNotFound,
    #[error("{0}")]
    NotSupported(String),
    #[error("{0}")]
    NotRefundable(String),
    #[error("the refund of {amount} paisa is more than the {remaining} paisa left to refund")]
    ExceedsBalance { amount: i64, remaining: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<RefundError> for Refusal {
    fn from(err: RefundError) -> Self {
        match err {
            RefundError::Invalid { field, message } => Refusal::invalid(field, message),
            RefundError::PaymentNotFound => {
                Refusal::new(Kind::NotFound, "not_found", "No such payment").at("paymentId")
            }
            e @ RefundError::ExceedsBalance { .. } => {
                Refusal::unprocessable("refund_exceeds_balance", e.to_string()).at("amount")
            }
            RefundError::NotSupported(m) => {
                Refusal::unprocessable("refund_not_supported", m).at("paymentId")
            }
            RefundError::NotRefundable(m) => {
                Refusal::unprocessable("payment_not_refundable", m).at("paymentId")
            }
            RefundError::Store(e) => e.into(),
        }
    }
}

impl CreateRefund {
    /// The payment the body names, parsed; a `payment_id` that cannot be
    /// a payment's is refused as an unknown payment is (after the amount,
    /// which is checked first).
    pub fn payment(&self) -> Result<PaymentId, RefundError> {
        match PaymentId::parse(&self.payment_id) {
            Some(id) => Ok(id),
            None => Err(validate(self).err().unwrap_or(RefundError::PaymentNotFound)),
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> RefundError {
    RefundError::Invalid {
        field,
        message: message.into(),
    }
}

/// The request, checked: the amount (the note and the payer's mobile kept
/// their rules when the body was parsed).
pub(super) fn validate(req: &CreateRefund) -> Result<(), RefundError> {
    if req.amount <= 0 {
        return Err(invalid(
            "amount",
            format!(
                "amount must be a positive integer of paisa, got {}",
                req.amount
            ),
        ));
    }
    Ok(())
}

/// The payment as stored and its reserved refund total.
async fn payment_with_reserved(
    store: &dyn Store,
    id: &PaymentId,
) -> Result<Option<(Payment, i64)>, StoreError> {
    let payment: Option<Payment> = record::get(store, &Payment::key(id)).await?;
    Ok(payment.map(|p| {
        let reserved = p.amount_reserved.get();
        (p, reserved)
    }))
}

fn not_refundable(p: &Payment) -> RefundError {
    match p.status {
        PaymentStatus::Refunded => {
            RefundError::NotRefundable("the payment is already fully refunded".into())
        }
        s => RefundError::NotRefundable(format!(
            "only a successful payment can be refunded; this one is {}",
            serde_json::to_value(s)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        )),
    }
}

/// Creates a refund of payment `payment_id` (the body's, parsed: see
/// [`CreateRefund::payment`]) of `tenant` and, for Khalti, asks Khalti
/// once. A request whose first run already committed (its fence is there)
/// answers that run's refund.
pub async fn create(
    state: &Deps,
    tenant: &Tenant,
    payment_id: PaymentId,
    req: CreateRefund,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<Refund, RefundError> {
    let request = RefundRequest {
        tenant,
        payment_id,
        body: req,
        channel: Channel::Api,
        now,
        fence,
    };
    create_via(state, request, |_| Ok(Vec::new())).await
}

/// Where a refund is asked for. The contract refuses a Fonepay refund
/// over the API and has it "issued from the dashboard": there, the full
/// amount is recorded as `requires_action` for the merchant to refund in
/// Fonepay's merchant portal, as eSewa refunds are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    Api,
    Dashboard,
}

/// A refund asked for: by the tenant of the key (or dashboard session)
/// that asks, of which payment (the body's `payment_id`, parsed), what it
/// sent, from where, when, and the request's idempotency fence (a retry
/// whose first run committed answers that run's refund).
#[derive(Clone, Debug)]
pub struct RefundRequest<'a> {
    pub tenant: &'a Tenant,
    pub payment_id: PaymentId,
    pub body: CreateRefund,
    pub channel: Channel,
    pub now: Timestamp,
    pub fence: Option<&'a Fence>,
}

/// [`create`] from the request's channel, with `extra` operations (an
/// audit entry) written in the refund's own transaction.
pub async fn create_via(
    state: &Deps,
    request: RefundRequest<'_>,
    extra: impl FnOnce(&Refund) -> Result<Vec<TxOp>, StoreError>,
) -> Result<Refund, RefundError> {
    let RefundRequest {
        tenant,
        payment_id,
        body: req,
        channel,
        now,
        fence,
    } = request;
    validate(&req)?;
    let store = &*state.store;
    let Some((payment, reserved)) = payment_with_reserved(store, &payment_id).await? else {
        return Err(RefundError::PaymentNotFound);
    };
    if !tenant.owns(&payment.project_id, payment.mode) {
        return Err(RefundError::PaymentNotFound);
    }
    match refused(&payment, reserved, req.amount, channel) {
        None => {}
        Some(Refused::Outright(e)) => return Err(e),
        // A retry whose first run committed (and took the balance) gets
        // that run's refund; only a refusal pays for the fence read.
        Some(Refused::UnlessRetried(e)) => {
            return first_run(store, fence).await?.ok_or(e);
        }
    }
    let amount = Paisa::new(req.amount).map_err(|e| invalid("amount", e.to_string()))?;
    let refund = new_refund(tenant, &payment, amount, req, now);
    let mut ops = reservation_ops(&payment, &refund)?;
    ops.extend(extra(&refund)?);
    let fence_at = fence.map(|f| {
        ops.push(f.op(&refund.id));
        (f, ops.len() - 1)
    });
    if let Some(first) =
        write_refund(store, ops, fence_at, &payment.id, refund.amount.get()).await?
    {
        return Ok(first);
    }
    if refund.status != RefundStatus::Processing {
        return Ok(refund);
    }
    Ok(call_khalti(state, &payment, refund, now).await?)
}

/// Why a refund is refused before anything is written.
#[derive(Debug)]
enum Refused {
    /// Whatever ran before.
    Outright(RefundError),
    /// Unless this request's first run committed: then its refund answers.
    UnlessRetried(RefundError),
}

/// Why `payment` (with `reserved` already held) takes no refund of
/// `amount` from `channel`, if it does not: its provider's rule first,
/// then the balance.
fn refused(payment: &Payment, reserved: i64, amount: i64, channel: Channel) -> Option<Refused> {
    if let Some(r) = provider_refuses(payment, reserved, amount, channel) {
        return Some(r);
    }
    let remaining = payment.amount.get() - reserved;
    if payment.status != PaymentStatus::Success {
        return Some(Refused::UnlessRetried(not_refundable(payment)));
    }
    (amount > remaining).then_some(Refused::UnlessRetried(RefundError::ExceedsBalance {
        amount,
        remaining,
    }))
}

/// The providers' own refund rules: Fonepay has no refund API, so its
/// refunds are issued from the dashboard only, of the whole (untouched)
/// amount; eSewa and Khalti take any part of the balance from anywhere.
fn provider_refuses(
    payment: &Payment,
    reserved: i64,
    amount: i64,
    channel: Channel,
) -> Option<Refused> {
    match (payment.provider, channel) {
        (Provider::Fonepay, Channel::Api) => Some(Refused::Outright(RefundError::NotSupported(
            "Fonepay has no refund API: refund the full amount from the Fonepay merchant dashboard"
                .into(),
        ))),
        (Provider::Fonepay, Channel::Dashboard)
            if payment.status == PaymentStatus::Success
                && (amount != payment.amount.get() || reserved != 0) =>
        {
            Some(Refused::UnlessRetried(invalid(
                "amount",
                format!(
                    "Fonepay refunds are of the full amount only: {}",
                    payment.amount.display_npr()
                ),
            )))
        }
        _ => None,
    }
}

/// How `payment`'s provider refunds `amount`: Khalti by its API
/// (`processing` until it answers); eSewa and Fonepay by the merchant in
/// their portal (`requires_action`, with what to refund where).
fn provider_route(payment: &Payment, amount: Paisa) -> (RefundStatus, Option<String>) {
    match payment.provider {
        Provider::Esewa => (
            RefundStatus::RequiresAction,
            Some(format!(
                "eSewa has no refund API: refund {} of eSewa transaction {} in the eSewa merchant portal (merchant.esewa.com.np)",
                amount.display_npr(),
                payment.provider_ref.as_deref().unwrap_or("(unknown)")
            )),
        ),
        Provider::Fonepay => (
            RefundStatus::RequiresAction,
            Some(format!(
                "Fonepay has no refund API: refund {} of Fonepay transaction {} in the Fonepay merchant portal",
                amount.display_npr(),
                payment
                    .provider_ref
                    .as_deref()
                    .or(payment.attempt.reference.as_deref())
                    .unwrap_or("(unknown)")
            )),
        ),
        Provider::Khalti => (RefundStatus::Processing, None),
    }
}

/// The refund of `amount` of `payment` as it is created.
fn new_refund(
    tenant: &Tenant,
    payment: &Payment,
    amount: Paisa,
    req: CreateRefund,
    now: Timestamp,
) -> Refund {
    let (status, failure_reason) = provider_route(payment, amount);
    let fee = super::fee_returned(payment, amount);
    Refund {
        fee: fee.map(|(f, _)| f),
        fee_source: fee.map(|(_, s)| s),
        listed: false,
        id: RefundId::new(),
        project_id: tenant.project.clone(),
        payment_id: payment.id.clone(),
        mode: tenant.mode,
        provider: payment.provider,
        amount,
        currency: Currency::Npr,
        reason: req.reason,
        status,
        provider_refund_id: None,
        failure_reason,
        notes: req
            .notes
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty()),
        mobile_number: req.mobile_number.map(String::from),
        created_at: now,
        updated_at: now,
    }
}

/// The refund's amount reserved on the payment (still `success`, the
/// reservations within its amount), the refund stored, and an open one
/// queued for the sweep.
fn reservation_ops(payment: &Payment, refund: &Refund) -> Result<Vec<TxOp>, StoreError> {
    let room = payment.amount.get() - refund.amount.get();
    let mut ops = vec![
        TxOp::Update {
            key: Payment::key(&payment.id),
            update: Changes::new()
                .add(Payment::AMOUNT_RESERVED, refund.amount)
                .into(),
            cond: Some(Cond::And(vec![
                Payment::STATUS.eq(&PaymentStatus::Success),
                Cond::Or(vec![
                    Payment::AMOUNT_RESERVED.missing(),
                    Payment::AMOUNT_RESERVED.le(&room),
                ]),
            ])),
        },
        refund.put_new()?,
    ];
    ops.extend(crate::domain::listing::count_new(refund));
    if refund.status == RefundStatus::Processing {
        ops.push(TxOp::Put {
            item: marker_item(refund)?,
            cond: None,
        });
    }
    Ok(ops)
}

/// Writes the refund's transaction `ops` (its reservation first), again
/// on a conflict. `Some`: the first run's refund, when this request's
/// fence (`fence_at`: the fence and its operation's place) shows it ran.
async fn write_refund(
    store: &dyn Store,
    ops: Vec<TxOp>,
    fence_at: Option<(&Fence, usize)>,
    payment_id: &PaymentId,
    amount: i64,
) -> Result<Option<Refund>, RefundError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let Err(e) = store.transact(ops.clone()).await else {
            return Ok(None);
        };
        if let Some((f, i)) = fence_at {
            if Fence::tripped(&e, i) {
                return match first_run(store, Some(f)).await? {
                    Some(first) => Ok(Some(first)),
                    None => Err(StoreError::Backend("the fenced refund is missing".into()).into()),
                };
            }
        }
        let StoreError::TransactionCanceled { reasons } = &e else {
            return Err(e.into());
        };
        if matches!(reasons.first(), Some(TxReason::ConditionFailed)) {
            return Err(balance_error(store, payment_id, amount).await);
        }
        if !(reasons.contains(&TxReason::Conflict) && tries < TRIES) {
            return Err(e.into());
        }
        let pause = 10 * tries as u64 + rand::random::<u64>() % 20;
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    }
}

/// The refund the first run of this request created, if it committed.
async fn first_run(store: &dyn Store, fence: Option<&Fence>) -> Result<Option<Refund>, StoreError> {
    let Some(f) = fence else {
        return Ok(None);
    };
    match f.resource_id(store).await? {
        Some(first) => get(store, &RefundId::stored(first)).await,
        None => Ok(None),
    }
}

/// Why the reservation did not fit, as the payment now stands.
async fn balance_error(store: &dyn Store, payment_id: &PaymentId, amount: i64) -> RefundError {
    match payment_with_reserved(store, payment_id).await {
        Ok(Some((p, reserved))) if p.status == PaymentStatus::Success => {
            RefundError::ExceedsBalance {
                amount,
                remaining: p.amount.get() - reserved,
            }
        }
        Ok(Some((p, _))) => not_refundable(&p),
        Ok(None) => RefundError::PaymentNotFound,
        Err(e) => e.into(),
    }
}

pub(super) fn marker_item(refund: &Refund) -> Result<crate::store::Item, StoreError> {
    refund.marker().to_item()
}

/// The one call to Khalti's refund API for `refund`, and its outcome.
async fn call_khalti(
    state: &Deps,
    payment: &Payment,
    refund: Refund,
    now: Timestamp,
) -> Result<Refund, StoreError> {
    let creds = match crate::domain::credentials::for_payment(state, payment).await {
        Ok(c) => c,
        Err(e) => {
            let why = format!("no Khalti credentials to refund with: {e}");
            return resolve(state, &refund, Outcome::Failed(why), now).await;
        }
    };
    let client = match state.providers.client(payment.mode, payment.provider) {
        Ok(c) => c,
        Err(e) => return resolve(state, &refund, Outcome::Failed(e.to_string()), now).await,
    };
    let Some(txn) = payment.provider_ref.as_deref() else {
        let why = "the payment has no Khalti transaction id to refund".to_owned();
        return resolve(state, &refund, Outcome::Failed(why), now).await;
    };
    let amount = khalti_amount(&refund, payment);
    let called = client
        .refund(&creds, txn, amount, refund.mobile_number.as_deref())
        .await;
    match called {
        Ok(_) => {
            let after = resolve(
                state,
                &refund,
                Outcome::Succeeded(Some(txn.to_owned())),
                now,
            )
            .await?;
            if after.status == RefundStatus::Failed {
                tracing::error!(
                    refund = %refund.id,
                    "Khalti applied a refund already recorded failed: check the Khalti dashboard and correct by hand"
                );
            }
            Ok(after)
        }
        Err(ProviderError::Rejected { code, message }) => {
            let why = format!("Khalti refused the refund: {message} ({code})");
            resolve(state, &refund, Outcome::Failed(why), now).await
        }
        Err(ProviderError::Invalid(m) | ProviderError::Unsupported(m)) => {
            resolve(state, &refund, Outcome::Failed(m), now).await
        }
        Err(e) => {
            // Timed out, 5xx or unreadable: Khalti may have acted. Never
            // call again; the sweep asks Khalti's lookup.
            tracing::warn!(refund = %refund.id, error = %e, "Khalti refund outcome unknown; left processing for the sweep");
            Ok(refund)
        }
    }
}

/// What to send Khalti: the whole amount of an untouched payment is a
/// full refund (Khalti's empty body, `None`); anything else names the
/// amount.
pub(super) fn khalti_amount(refund: &Refund, payment: &Payment) -> Option<Paisa> {
    let full = refund.amount == payment.amount && payment.amount_refunded == Paisa::ZERO;
    (!full).then_some(refund.amount)
}
