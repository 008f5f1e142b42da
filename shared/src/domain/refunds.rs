//! Refunds (spec "Refund", decisions "Refunds"): money back to a customer,
//! where a bug pays twice.
//!
//! - **Balance.** A refund reserves its amount on the payment with one
//!   conditional write (`amount_reserved <= amount - this`, payment still
//!   `success`) in the same transaction that stores the refund, so the sum
//!   of `processing + succeeded + requires_action` refunds never passes the
//!   payment, whatever the concurrency. A `failed` refund releases its
//!   reservation in the transaction that fails it.
//! - **Providers.** Khalti: its refund API, called once per refund, never
//!   again (a timeout leaves the refund `processing` for [`sweep`], which
//!   asks Khalti's lookup instead). eSewa: no refund API, so the refund is
//!   `requires_action` at once (the merchant refunds in eSewa's portal; the
//!   record is the audit trail). Fonepay: refused (422), nothing created.
//! - **Events.** `refund.succeeded` / `refund.failed` in the transaction of
//!   the change; `payment.refunded` when succeeded refunds reach the full
//!   amount (the payment becomes `refunded`).
//!
//! Stored at `REF#<id>`, listed by project and mode (`gsi1`
//! `PROJ#<p>#<mode>#REF`) and by payment (`gsi2` `PAY#<payment>#REF`);
//! an open refund also has a marker item `OPENREF#<shard>` /
//! `<created>#<id>`, the sweep's queue, deleted when it resolves.

use crate::refusal::{Kind, Refusal};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Mode;
use super::Provider;
use super::checkout::open_partition;
use super::outbox::{Event, EventType};
use super::payments::{self, Payment, PaymentStatus, PaymentView};
use super::record::{from_item, to_item};
use crate::app::Deps;
use crate::fields::{NepaliMobile, RefundNotes};
use crate::ids::{self, IdKind};
use crate::keys;
use crate::money::{Currency, Paisa};
use crate::providers::{ProviderError, ProviderState, StatusQuery};
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Query, SkCond, Store, StoreError, TxOp, TxReason, Update};
use crate::time::Timestamp;

/// Default page size of `GET /v1/refunds` (spec).
pub const DEFAULT_PAGE: usize = 10;
/// An open refund is asked about after this: longer than the longest
/// provider call (`DHUKUTI_PROVIDER_TIMEOUT_MS` is at most 120 s), so the
/// sweep never judges a refund whose call is still in flight.
pub const RESOLVE_AFTER: chrono::Duration = chrono::Duration::minutes(5);
/// A refund Khalti's lookup shows as not applied is `failed` (its balance
/// released for another refund) only once it is this old: a refund call
/// that timed out or answered 5xx may still be applied a little later, and
/// failing it early would let the merchant refund the customer twice.
pub const NOT_APPLIED_AFTER: chrono::Duration = chrono::Duration::hours(1);
/// An open refund Khalti cannot confirm within this goes to a person.
pub const GIVE_UP_AFTER: chrono::Duration = chrono::Duration::hours(24);
const OPEN_REFUNDS: keys::Open = keys::Open::Refunds;
const TRIES: usize = 12;
/// The payment attribute holding the reserved (not failed) refund total.
pub const RESERVED: &str = "amount_reserved";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    Processing,
    Succeeded,
    Failed,
    RequiresAction,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundStatus::Processing => "processing",
            RefundStatus::Succeeded => "succeeded",
            RefundStatus::Failed => "failed",
            RefundStatus::RequiresAction => "requires_action",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    CustomerRequest,
    Duplicate,
    Fraudulent,
    Other,
}

/// A stored refund.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Refund {
    pub id: String,
    pub project_id: String,
    pub payment_id: String,
    pub mode: Mode,
    pub provider: Provider,
    pub amount: Paisa,
    pub currency: Currency,
    pub reason: RefundReason,
    pub status: RefundStatus,
    #[serde(default)]
    pub provider_refund_id: Option<String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(default)]
    pub mobile_number: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Refund {
    pub fn key(id: &str) -> Key {
        keys::record(keys::Record::Refund, id)
    }

    fn list_partition(project_id: &str, mode: Mode) -> String {
        keys::per_mode(project_id, mode, keys::PerMode::Refunds)
    }

    fn payment_partition(payment_id: &str) -> String {
        keys::payment_refunds(payment_id)
    }

    fn indexes(&self) -> [(Index, String, String); 2] {
        [
            (
                Index::Gsi1,
                Refund::list_partition(&self.project_id, self.mode),
                self.id.clone(),
            ),
            (
                Index::Gsi2,
                Refund::payment_partition(&self.payment_id),
                self.id.clone(),
            ),
        ]
    }

    fn marker_key(&self) -> Key {
        Key::new(
            open_partition(OPEN_REFUNDS, &self.id),
            format!("{}#{}", self.created_at.to_rfc3339(), self.id),
        )
    }
}

/// A refund as the API shows it (camelCase, as the spec writes it).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefundView {
    pub id: String,
    pub livemode: bool,
    pub payment_id: String,
    pub project_id: String,
    pub mode: Mode,
    pub amount: Paisa,
    pub currency: Currency,
    pub reason: RefundReason,
    pub status: RefundStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_refund_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<RefundNotes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mobile_number: Option<NepaliMobile>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl From<Refund> for RefundView {
    fn from(r: Refund) -> Self {
        RefundView {
            livemode: r.mode.is_live(),
            id: r.id,
            payment_id: r.payment_id,
            project_id: r.project_id,
            mode: r.mode,
            amount: r.amount,
            currency: r.currency,
            reason: r.reason,
            status: r.status,
            provider_refund_id: r.provider_refund_id,
            failure_reason: r.failure_reason,
            notes: r.notes.map(RefundNotes::stored),
            mobile_number: r.mobile_number.map(NepaliMobile::stored),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// The body of `POST /v1/refunds`. Unknown fields refused.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRefund {
    pub payment_id: String,
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

fn invalid(field: &'static str, message: impl Into<String>) -> RefundError {
    RefundError::Invalid {
        field,
        message: message.into(),
    }
}

/// The request, checked: the amount (the note and the payer's mobile kept
/// their rules when the body was parsed).
pub fn validate(req: &CreateRefund) -> Result<(), RefundError> {
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

fn reserved_of(item: &crate::store::Item) -> i64 {
    item.get(RESERVED).and_then(Value::as_i64).unwrap_or(0)
}

/// The payment as stored and its reserved refund total.
async fn payment_with_reserved(
    store: &dyn Store,
    id: &str,
) -> Result<Option<(Payment, i64)>, StoreError> {
    if !ids::is_valid(id, IdKind::Payment) {
        return Ok(None);
    }
    match store.get(&Payment::key(id)).await? {
        Some(item) => {
            let reserved = reserved_of(&item);
            Ok(Some((from_item(item)?, reserved)))
        }
        None => Ok(None),
    }
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

/// Creates a refund of a payment of `project_id` in `mode` and, for
/// Khalti, asks Khalti once. A request whose first run already committed
/// (its fence is there) answers that run's refund.
pub async fn create(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    req: CreateRefund,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<Refund, RefundError> {
    validate(&req)?;
    let store = &*state.store;
    let Some((payment, reserved)) = payment_with_reserved(store, &req.payment_id).await? else {
        return Err(RefundError::PaymentNotFound);
    };
    if payment.project_id != project_id || payment.mode != mode {
        return Err(RefundError::PaymentNotFound);
    }
    if payment.provider == Provider::Fonepay {
        return Err(RefundError::NotSupported(
            "Fonepay has no refund API: refund the full amount from the Fonepay merchant dashboard"
                .into(),
        ));
    }
    let remaining = payment.amount.get() - reserved;
    if payment.status != PaymentStatus::Success || req.amount > remaining {
        // A retry whose first run committed (and took the balance) gets
        // that run's refund; only a refusal pays for the fence read.
        if let Some(r) = first_run(store, fence).await? {
            return Ok(r);
        }
        if payment.status != PaymentStatus::Success {
            return Err(not_refundable(&payment));
        }
        return Err(RefundError::ExceedsBalance {
            amount: req.amount,
            remaining,
        });
    }
    let amount = Paisa::new(req.amount).map_err(|e| invalid("amount", e.to_string()))?;
    let (status, failure_reason) = match payment.provider {
        Provider::Esewa => (
            RefundStatus::RequiresAction,
            Some(format!(
                "eSewa has no refund API: refund {} of eSewa transaction {} in the eSewa merchant portal (merchant.esewa.com.np)",
                amount.display_npr(),
                payment.provider_ref.as_deref().unwrap_or("(unknown)")
            )),
        ),
        _ => (RefundStatus::Processing, None),
    };
    let refund = Refund {
        id: ids::new_id(IdKind::Refund),
        project_id: project_id.to_owned(),
        payment_id: payment.id.clone(),
        mode,
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
    };
    let room = payment.amount.get() - req.amount;
    let mut ops = vec![
        TxOp::Update {
            key: Payment::key(&payment.id),
            update: Update::new().add(RESERVED, req.amount),
            cond: Some(Cond::And(vec![
                Cond::eq("status", "success"),
                Cond::Or(vec![
                    Cond::AttrNotExists(RESERVED.into()),
                    Cond::le(RESERVED, room),
                ]),
            ])),
        },
        TxOp::Put {
            item: to_item(&refund, &Refund::key(&refund.id), &refund.indexes())?,
            cond: Some(Cond::NotExists),
        },
    ];
    if refund.status == RefundStatus::Processing {
        ops.push(TxOp::Put {
            item: marker_item(&refund)?,
            cond: None,
        });
    }
    let fence_at = fence.map(|f| {
        ops.push(f.op(&refund.id));
        ops.len() - 1
    });
    let mut tries = 0;
    loop {
        tries += 1;
        match store.transact(ops.clone()).await {
            Ok(()) => break,
            Err(e) => {
                if let (Some(f), Some(i)) = (fence, fence_at) {
                    if Fence::tripped(&e, i) {
                        return first_run(store, Some(f)).await?.ok_or_else(|| {
                            StoreError::Backend("the fenced refund is missing".into()).into()
                        });
                    }
                }
                match &e {
                    StoreError::TransactionCanceled { reasons } => {
                        if matches!(reasons.first(), Some(TxReason::ConditionFailed)) {
                            return Err(balance_error(store, &payment.id, req.amount).await);
                        }
                        if reasons.contains(&TxReason::Conflict) && tries < TRIES {
                            let pause = 10 * tries as u64 + rand::random::<u64>() % 20;
                            tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                            continue;
                        }
                        return Err(e.into());
                    }
                    _ => return Err(e.into()),
                }
            }
        }
    }
    if refund.status != RefundStatus::Processing {
        return Ok(refund);
    }
    Ok(call_khalti(state, &payment, refund, now).await?)
}

/// The refund the first run of this request created, if it committed.
async fn first_run(store: &dyn Store, fence: Option<&Fence>) -> Result<Option<Refund>, StoreError> {
    let Some(f) = fence else {
        return Ok(None);
    };
    match f.resource_id(store).await? {
        Some(first) => get(store, &first).await,
        None => Ok(None),
    }
}

/// Why the reservation did not fit, as the payment now stands.
async fn balance_error(store: &dyn Store, payment_id: &str, amount: i64) -> RefundError {
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

fn marker_item(refund: &Refund) -> Result<crate::store::Item, StoreError> {
    let mut item = serde_json::Map::new();
    item.insert("id".into(), Value::String(refund.id.clone()));
    let key = refund.marker_key();
    item.insert(crate::store::PK.into(), Value::String(key.pk));
    item.insert(crate::store::SK.into(), Value::String(key.sk));
    Ok(item)
}

/// The one call to Khalti's refund API for `refund`, and its outcome.
async fn call_khalti(
    state: &Deps,
    payment: &Payment,
    refund: Refund,
    now: Timestamp,
) -> Result<Refund, StoreError> {
    let creds = match super::credentials::for_payment(state, payment).await {
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
pub fn khalti_amount(refund: &Refund, payment: &Payment) -> Option<Paisa> {
    let full = refund.amount == payment.amount && payment.amount_refunded == Paisa::ZERO;
    (!full).then_some(refund.amount)
}

/// How an open refund ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded(Option<String>),
    Failed(String),
    RequiresAction(String),
}

/// Moves an open refund to its outcome, with the payment's counters and
/// the events, in one transaction; answers the refund as stored after. A
/// refund no longer `processing` is answered unchanged.
pub async fn resolve(
    state: &Deps,
    refund: &Refund,
    outcome: Outcome,
    now: Timestamp,
) -> Result<Refund, StoreError> {
    let store = &*state.store;
    for _ in 0..TRIES {
        let Some(current) = get(store, &refund.id).await? else {
            return Err(StoreError::Backend(format!(
                "refund {} vanished",
                refund.id
            )));
        };
        if current.status != RefundStatus::Processing {
            return Ok(current);
        }
        let Some(payment) = payments::get(store, &current.payment_id).await? else {
            return Err(StoreError::Backend(format!(
                "payment {} vanished",
                current.payment_id
            )));
        };
        let ops = resolve_ops(&current, &payment, &outcome, now)?;
        match store.transact(ops).await {
            Ok(()) => {
                if matches!(outcome, Outcome::Succeeded(_)) {
                    mark_refunded(store, &payment.id, now).await?;
                }
                return get(store, &refund.id)
                    .await?
                    .ok_or_else(|| StoreError::Backend(format!("refund {} vanished", refund.id)));
            }
            Err(StoreError::TransactionCanceled { .. }) => {
                tokio::time::sleep(std::time::Duration::from_millis(
                    5 + rand::random::<u64>() % 20,
                ))
                .await;
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(format!(
        "refund {} kept changing while being resolved",
        refund.id
    )))
}

/// Once succeeded refunds reach the full amount: the payment becomes
/// `refunded` with its `payment.refunded` event, in one transaction that
/// only the first caller to see the full amount can commit.
async fn mark_refunded(
    store: &dyn Store,
    payment_id: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let Some(p) = payments::get(store, payment_id).await? else {
        return Ok(());
    };
    if p.status != PaymentStatus::Success || p.amount_refunded < p.amount {
        return Ok(());
    }
    let mut after = p.clone();
    after.status = PaymentStatus::Refunded;
    after.updated_at = now;
    let view = serde_json::to_value(PaymentView::from(after))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    let ops = vec![
        TxOp::Update {
            key: Payment::key(&p.id),
            update: Update::new()
                .set("status", "refunded")
                .set("updated_at", now.to_rfc3339()),
            cond: Some(Cond::And(vec![
                Cond::eq("status", "success"),
                Cond::ge("amount_refunded", p.amount.get()),
            ])),
        },
        Event::new(EventType::PaymentRefunded, &p.project_id, p.mode, view, now).put_op()?,
    ];
    for attempt in 0..TRIES {
        match store.transact(ops.clone()).await {
            Ok(()) => return Ok(()),
            Err(StoreError::TransactionCanceled { reasons })
                if reasons.contains(&TxReason::Conflict) =>
            {
                let pause = 5 + 10 * attempt as u64 + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            // Another caller marked it first: exactly one event.
            Err(StoreError::TransactionCanceled { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(format!(
        "payment {payment_id} reached its full refund but could not be marked refunded"
    )))
}

fn resolve_ops(
    r: &Refund,
    p: &Payment,
    outcome: &Outcome,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    let stamp = now.to_rfc3339();
    let mut next = r.clone();
    next.updated_at = now;
    let mut refund_update = Update::new().set("updated_at", stamp.clone());
    let mut ops = Vec::new();
    match outcome {
        Outcome::Succeeded(provider_ref) => {
            next.status = RefundStatus::Succeeded;
            next.provider_refund_id = provider_ref.clone();
            refund_update = refund_update.set("status", "succeeded");
            if let Some(id) = provider_ref {
                refund_update = refund_update.set("provider_refund_id", id.clone());
            }
            // The reservation already caps the total: add without
            // reading, so parallel successes never retry on each other.
            ops.push(TxOp::Update {
                key: Payment::key(&p.id),
                update: Update::new()
                    .add("amount_refunded", r.amount.get())
                    .set("updated_at", stamp.clone()),
                cond: Some(Cond::Exists),
            });
            ops.push(event(EventType::RefundSucceeded, &next, now)?);
        }
        Outcome::Failed(why) => {
            next.status = RefundStatus::Failed;
            next.failure_reason = Some(why.clone());
            refund_update = refund_update
                .set("status", "failed")
                .set("failure_reason", why.clone());
            ops.push(TxOp::Update {
                key: Payment::key(&p.id),
                update: Update::new().add(RESERVED, -r.amount.get()),
                cond: Some(Cond::Exists),
            });
            ops.push(event(EventType::RefundFailed, &next, now)?);
        }
        Outcome::RequiresAction(why) => {
            refund_update = refund_update
                .set("status", "requires_action")
                .set("failure_reason", why.clone());
        }
    }
    ops.insert(
        0,
        TxOp::Update {
            key: Refund::key(&r.id),
            update: refund_update,
            cond: Some(Cond::eq("status", "processing")),
        },
    );
    ops.push(TxOp::Delete {
        key: r.marker_key(),
        cond: None,
    });
    Ok(ops)
}

fn event(kind: EventType, r: &Refund, now: Timestamp) -> Result<TxOp, StoreError> {
    let view = serde_json::to_value(RefundView::from(r.clone()))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    Event::new(kind, &r.project_id, r.mode, view, now).put_op()
}

/// The refund `id` of any project.
pub async fn get(store: &dyn Store, id: &str) -> Result<Option<Refund>, StoreError> {
    if !ids::is_valid(id, IdKind::Refund) {
        return Ok(None);
    }
    match store.get(&Refund::key(id)).await? {
        Some(item) => from_item(item).map(Some),
        None => Ok(None),
    }
}

/// The refund `id` of `project_id` in `mode` (else `None`, as if missing).
pub async fn find(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<Option<Refund>, StoreError> {
    Ok(get(store, id)
        .await?
        .filter(|r| r.project_id == project_id && r.mode == mode))
}

/// A page of the project's refunds in `mode`, newest first, optionally of
/// one payment, and the total.
pub async fn list(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    payment_id: Option<&str>,
    offset: usize,
    limit: usize,
) -> Result<(Vec<Refund>, u64), StoreError> {
    let query = match payment_id {
        Some(pid) => {
            // Another project's (or a missing) payment lists nothing.
            if payments::find(store, project_id, mode, pid)
                .await?
                .is_none()
            {
                return Ok((Vec::new(), 0));
            }
            Query::partition(Refund::payment_partition(pid))
                .on(Index::Gsi2)
                .backward()
        }
        None => Query::partition(Refund::list_partition(project_id, mode))
            .on(Index::Gsi1)
            .backward(),
    };
    super::record::page_of(store, &query, offset, limit).await
}

/// What one refund sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RefundSweep {
    pub checked: usize,
    pub resolved: usize,
    pub errors: usize,
}

/// Resolves refunds left `processing` (a Khalti timeout) by asking Khalti's
/// lookup, never its refund API: fully refunded, or partly refunded with
/// no other refund of the payment succeeded, is `succeeded`; not refunded
/// at all, still so [`NOT_APPLIED_AFTER`] after the refund, is `failed`
/// (the reservation is released); anything Khalti cannot settle within
/// [`GIVE_UP_AFTER`] goes to `requires_action`.
pub async fn sweep(state: &Deps, now: Timestamp) -> Result<RefundSweep, StoreError> {
    let store = &*state.store;
    let mut report = RefundSweep::default();
    let before = format!("{}#~", now.plus(-RESOLVE_AFTER).to_rfc3339());
    for shard in 0..super::checkout::OPEN_SHARDS {
        let query = Query::partition(keys::open(OPEN_REFUNDS, shard))
            .sk(SkCond::Lt(before.clone()))
            .limit(50);
        for item in store.query(&query).await?.items {
            let Some(id) = item.get("id").and_then(Value::as_str) else {
                continue;
            };
            report.checked += 1;
            match resolve_one(state, id, now).await {
                Ok(true) => report.resolved += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(refund = %id, error = %e, "refund not resolved; next sweep retries");
                    report.errors += 1;
                }
            }
        }
    }
    Ok(report)
}

async fn resolve_one(state: &Deps, id: &str, now: Timestamp) -> Result<bool, StoreError> {
    let store = &*state.store;
    let Some(refund) = get(store, id).await? else {
        return Ok(false);
    };
    if refund.status != RefundStatus::Processing {
        // Resolved, but its marker outlived it: drop the marker.
        store.delete(&refund.marker_key(), None).await?;
        return Ok(false);
    }
    let Some(payment) = payments::get(store, &refund.payment_id).await? else {
        return Ok(false);
    };
    let outcome = match ask_khalti(state, &payment).await {
        Some(state_now) => decide(
            &refund,
            payment.amount,
            state_now,
            others_of(store, &refund).await?,
        )
        .map(|o| match o {
            Outcome::Succeeded(None) => Outcome::Succeeded(payment.provider_ref.clone()),
            other => other,
        }),
        None => None,
    };
    let outcome = match outcome {
        Some(Outcome::Failed(_)) if now < refund.created_at.plus(NOT_APPLIED_AFTER) => None,
        Some(o) => Some(o),
        None if now >= refund.created_at.plus(GIVE_UP_AFTER) => Some(Outcome::RequiresAction(
            "Khalti did not confirm this refund within a day: check the Khalti merchant dashboard"
                .into(),
        )),
        None => None,
    };
    match outcome {
        Some(o) => {
            let after = resolve(state, &refund, o, now).await?;
            Ok(after.status != RefundStatus::Processing)
        }
        None => Ok(false),
    }
}

async fn ask_khalti(state: &Deps, payment: &Payment) -> Option<ProviderState> {
    let creds = super::credentials::for_payment(state, payment).await.ok()?;
    let client = state
        .providers
        .client(payment.mode, payment.provider)
        .ok()?;
    let query = StatusQuery {
        reference: payment.attempt.reference.clone().unwrap_or_default(),
        amount: payment.amount,
        provider_ref: payment.attempt.provider_token.clone(),
    };
    match client.status(&creds, &query).await {
        Ok(s) => Some(s.state),
        Err(e) => {
            tracing::warn!(payment = %payment.id, error = %e, "Khalti lookup failed");
            None
        }
    }
}

/// The payment's other refunds that are not `failed`: whether there are
/// any, and their total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    pub count: usize,
    pub total: i64,
}

/// From the payment's reservation (a consistent read of one item, never
/// an index that may lag): every live refund of the payment is in it.
async fn others_of(store: &dyn Store, refund: &Refund) -> Result<Others, StoreError> {
    let reserved = match store.get(&Payment::key(&refund.payment_id)).await? {
        Some(item) => reserved_of(&item),
        None => 0,
    };
    let total = (reserved - refund.amount.get()).max(0);
    Ok(Others {
        count: usize::from(total > 0),
        total,
    })
}

/// What Khalti's lookup says about an open refund, given the payment's
/// amount and its other refunds that are not `failed`: `None` = ask again.
/// Khalti's lookup says only "refunded", "partly refunded" or neither, so
/// a refund is called `succeeded` only when that answer can mean nothing
/// else: fully refunded with every live refund adding up to the payment,
/// or partly refunded with no other live refund. Otherwise a person looks.
pub fn decide(
    refund: &Refund,
    payment_amount: Paisa,
    khalti: ProviderState,
    others: Others,
) -> Option<Outcome> {
    let unsure = || {
        Some(Outcome::RequiresAction(format!(
            "Khalti cannot say whether this refund of {} was applied (other refunds of the payment are open or were made elsewhere): check the Khalti merchant dashboard",
            refund.amount.display_npr()
        )))
    };
    match khalti {
        ProviderState::Refunded { partial: false } => {
            if others.total + refund.amount.get() == payment_amount.get() {
                Some(Outcome::Succeeded(None))
            } else {
                unsure()
            }
        }
        // Alone, and not the whole payment (had a whole-payment refund
        // been applied, Khalti would say fully refunded: this one was not,
        // and another refund was made elsewhere).
        ProviderState::Refunded { partial: true }
            if others.count == 0 && refund.amount < payment_amount =>
        {
            Some(Outcome::Succeeded(None))
        }
        ProviderState::Refunded { partial: true } => unsure(),
        ProviderState::Paid => Some(Outcome::Failed(
            "Khalti did not apply the refund (the payment shows no refund)".into(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AppState;
    use crate::domain::outbox;
    use crate::domain::payments::AttemptInfo;
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::at;
    use crate::time::ManualClock;
    use std::sync::Arc;

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

    async fn paid(st: &Deps, provider: Provider, amount: i64) -> Payment {
        let now = at("2026-11-22T10:00:00Z");
        let p = Payment {
            id: ids::new_id(IdKind::Payment),
            project_id: "proj_1".into(),
            checkout_session_id: ids::new_id(IdKind::CheckoutSession),
            mode: Mode::Sandbox,
            amount: Paisa::new(amount).unwrap(),
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            provider,
            status: PaymentStatus::Success,
            provider_ref: Some("TXN-1".into()),
            failure_reason: None,
            metadata: Default::default(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: now,
            updated_at: now,
            double_payment_of: None,
            attempt: AttemptInfo::default(),
            checks: Default::default(),
        };
        payments::insert(&*st.store, &p).await.unwrap();
        p
    }

    fn ask(payment: &Payment, amount: i64) -> CreateRefund {
        CreateRefund {
            payment_id: payment.id.clone(),
            amount,
            reason: RefundReason::CustomerRequest,
            notes: None,
            mobile_number: None,
        }
    }

    async fn reserved(st: &Deps, p: &Payment) -> i64 {
        let item = st.store.get(&Payment::key(&p.id)).await.unwrap().unwrap();
        reserved_of(&item)
    }

    async fn kinds(st: &Deps) -> Vec<EventType> {
        let mut k: Vec<EventType> = outbox::recent(&*st.store, "proj_1", Mode::Sandbox, 50)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event_type)
            .collect();
        k.reverse();
        k
    }

    #[tokio::test]
    async fn fifty_racing_refunds_of_thirty_percent_reserve_at_most_the_amount() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let p = paid(&st, Provider::Esewa, 100_000).await;
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let st = st.clone();
            let req = ask(&p, 30_000);
            tasks.push(tokio::spawn(async move {
                create(&st, "proj_1", Mode::Sandbox, req, now, None).await
            }));
        }
        let (mut ok, mut over) = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => {
                    assert_eq!(r.status, RefundStatus::RequiresAction);
                    ok += 1;
                }
                Err(RefundError::ExceedsBalance { .. }) => over += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!((ok, over), (3, 47));
        assert_eq!(reserved(&st, &p).await, 90_000);
        let (listed, total) = list(&*st.store, "proj_1", Mode::Sandbox, Some(&p.id), 0, 100)
            .await
            .unwrap();
        assert_eq!((listed.len(), total), (3, 3));
    }

    #[tokio::test]
    async fn refunds_are_refused_for_other_projects_fonepay_and_unpaid_payments() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let p = paid(&st, Provider::Esewa, 10_000).await;
        assert!(matches!(
            create(&st, "proj_2", Mode::Sandbox, ask(&p, 100), now, None).await,
            Err(RefundError::PaymentNotFound)
        ));
        assert!(matches!(
            create(&st, "proj_1", Mode::Live, ask(&p, 100), now, None).await,
            Err(RefundError::PaymentNotFound)
        ));
        assert!(matches!(
            create(&st, "proj_1", Mode::Sandbox, ask(&p, 10_001), now, None).await,
            Err(RefundError::ExceedsBalance {
                remaining: 10_000,
                ..
            })
        ));
        let f = paid(&st, Provider::Fonepay, 10_000).await;
        assert!(matches!(
            create(&st, "proj_1", Mode::Sandbox, ask(&f, 100), now, None).await,
            Err(RefundError::NotSupported(_))
        ));
        assert_eq!(reserved(&st, &f).await, 0);
        let mut pending = paid(&st, Provider::Esewa, 10_000).await;
        pending.id = ids::new_id(IdKind::Payment);
        pending.status = PaymentStatus::Pending;
        payments::insert(&*st.store, &pending).await.unwrap();
        assert!(matches!(
            create(&st, "proj_1", Mode::Sandbox, ask(&pending, 100), now, None).await,
            Err(RefundError::NotRefundable(_))
        ));
    }

    /// A Khalti refund as `create` leaves it when Khalti does not answer:
    /// `processing`, reserved, with its sweep marker.
    async fn open_khalti_refund(st: &Deps, p: &Payment, amount: i64) -> Refund {
        let now = at("2026-11-22T10:00:00Z");
        let r = Refund {
            id: ids::new_id(IdKind::Refund),
            project_id: p.project_id.clone(),
            payment_id: p.id.clone(),
            mode: p.mode,
            provider: Provider::Khalti,
            amount: Paisa::new(amount).unwrap(),
            currency: Currency::Npr,
            reason: RefundReason::Duplicate,
            status: RefundStatus::Processing,
            provider_refund_id: None,
            failure_reason: None,
            notes: None,
            mobile_number: None,
            created_at: now,
            updated_at: now,
        };
        st.store
            .transact(vec![
                TxOp::Update {
                    key: Payment::key(&p.id),
                    update: Update::new().add(RESERVED, amount),
                    cond: None,
                },
                TxOp::Put {
                    item: to_item(&r, &Refund::key(&r.id), &r.indexes()).unwrap(),
                    cond: None,
                },
                TxOp::Put {
                    item: marker_item(&r).unwrap(),
                    cond: None,
                },
            ])
            .await
            .unwrap();
        r
    }

    #[tokio::test]
    async fn resolving_moves_money_counters_and_events_once() {
        let now = at("2026-11-22T10:00:00Z");
        let st = state(now);
        let p = paid(&st, Provider::Khalti, 10_000).await;
        let a = open_khalti_refund(&st, &p, 4_000).await;
        let b = open_khalti_refund(&st, &p, 6_000).await;
        // A failed refund releases its reservation, once.
        let failed = resolve(&st, &a, Outcome::Failed("no".into()), now)
            .await
            .unwrap();
        assert_eq!(failed.status, RefundStatus::Failed);
        assert_eq!(reserved(&st, &p).await, 6_000);
        let again = resolve(&st, &a, Outcome::Succeeded(None), now)
            .await
            .unwrap();
        assert_eq!(
            again.status,
            RefundStatus::Failed,
            "a final refund never moves"
        );
        assert_eq!(reserved(&st, &p).await, 6_000);
        // Refund the rest: 4,000 again, then B: the payment is refunded.
        let c = open_khalti_refund(&st, &p, 4_000).await;
        let mut tasks = Vec::new();
        for r in [b.clone(), c.clone(), b.clone(), c.clone()] {
            let st = st.clone();
            tasks.push(tokio::spawn(async move {
                resolve(&st, &r, Outcome::Succeeded(Some("TXN-1".into())), now).await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().status, RefundStatus::Succeeded);
        }
        let after = payments::get(&*st.store, &p.id).await.unwrap().unwrap();
        assert_eq!(after.amount_refunded.get(), 10_000);
        assert_eq!(after.status, PaymentStatus::Refunded);
        // One event per change, and `payment.refunded` exactly once,
        // however the two successes raced.
        assert_eq!(
            kinds_sorted(kinds(&st).await),
            kinds_sorted(vec![
                EventType::RefundFailed,
                EventType::RefundSucceeded,
                EventType::RefundSucceeded,
                EventType::PaymentRefunded,
            ])
        );
        // The sweep's queue is empty: every marker went with its refund.
        let later = now.plus(chrono::Duration::hours(1));
        assert_eq!(sweep(&st, later).await.unwrap(), RefundSweep::default());
    }

    fn kinds_sorted(mut k: Vec<EventType>) -> Vec<EventType> {
        k.sort_by_key(|t| t.as_str());
        k
    }

    fn refund() -> Refund {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        Refund {
            id: "ref_1".into(),
            project_id: "proj_1".into(),
            payment_id: "pay_1".into(),
            mode: Mode::Sandbox,
            provider: Provider::Khalti,
            amount: Paisa::new(3000).unwrap(),
            currency: Currency::Npr,
            reason: RefundReason::CustomerRequest,
            status: RefundStatus::Processing,
            provider_refund_id: None,
            failure_reason: None,
            notes: None,
            mobile_number: None,
            created_at: now,
            updated_at: now,
        }
    }

    #[test]
    fn the_lookup_settles_an_open_refund_only_when_it_can_tell() {
        let r = refund(); // 3,000 paisa
        let full = Paisa::new(10_000).unwrap();
        let none = Others::default();
        let partial = ProviderState::Refunded { partial: true };
        let whole = ProviderState::Refunded { partial: false };
        // Alone and partly refunded: it was ours.
        assert_eq!(
            decide(&r, full, partial, none),
            Some(Outcome::Succeeded(None))
        );
        // Another live refund (open or succeeded): cannot tell.
        let one = Others {
            count: 1,
            total: 5_000,
        };
        assert!(matches!(
            decide(&r, full, partial, one),
            Some(Outcome::RequiresAction(_))
        ));
        // Fully refunded: ours only if the live refunds add up exactly.
        let rest = Others {
            count: 1,
            total: 7_000,
        };
        assert_eq!(
            decide(&r, full, whole, rest),
            Some(Outcome::Succeeded(None))
        );
        assert!(matches!(
            decide(&r, full, whole, none),
            Some(Outcome::RequiresAction(_))
        ));
        assert!(matches!(
            decide(&r, full, ProviderState::Paid, one),
            Some(Outcome::Failed(_))
        ));
        assert_eq!(decide(&r, full, ProviderState::Pending, none), None);
        assert_eq!(decide(&r, full, ProviderState::Ambiguous, none), None);
        // A whole-payment refund, alone, but Khalti says partly refunded:
        // ours was not applied (someone refunded part elsewhere).
        let mut whole_refund = refund();
        whole_refund.amount = full;
        assert!(matches!(
            decide(&whole_refund, full, partial, none),
            Some(Outcome::RequiresAction(_))
        ));
    }

    #[tokio::test]
    async fn khalti_gets_an_empty_body_only_for_a_whole_untouched_payment() {
        let st = state(at("2026-11-22T10:00:00Z"));
        let mut p = paid(&st, Provider::Khalti, 3000).await;
        let r = refund(); // 3,000 paisa
        assert_eq!(khalti_amount(&r, &p), None);
        p.amount_refunded = Paisa::new(1).unwrap();
        assert_eq!(khalti_amount(&r, &p), Some(r.amount));
        p.amount_refunded = Paisa::ZERO;
        p.amount = Paisa::new(5000).unwrap();
        assert_eq!(khalti_amount(&r, &p), Some(r.amount));
    }

    #[test]
    fn requests_are_checked_and_named() {
        let req = |v: serde_json::Value| serde_json::from_value::<CreateRefund>(v);
        let ok =
            req(serde_json::json!({"paymentId": "pay_1", "amount": 100, "reason": "duplicate"}))
                .unwrap();
        assert!(validate(&ok).is_ok());
        let zero = serde_json::json!({"paymentId": "pay_1", "amount": 0, "reason": "other"});
        match validate(&req(zero).unwrap()) {
            Err(RefundError::Invalid { field: f, .. }) => assert_eq!(f, "amount"),
            other => panic!("amount: {other:?}"),
        }
        // The note's and the mobile's rules live in their field types:
        // parsing stops there, naming the field.
        for (body, field) in [
            (
                serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "notes": "x".repeat(501)}),
                "notes",
            ),
            (
                serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "mobileNumber": "98-1"}),
                "mobileNumber",
            ),
        ] {
            let r: Result<CreateRefund, _> = serde_path_to_error::deserialize(body);
            assert_eq!(
                r.err().map(|e| e.path().to_string()).as_deref(),
                Some(field)
            );
        }
        let with_mobile = req(serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "mobileNumber": "+9779800000001"})).unwrap();
        assert!(validate(&with_mobile).is_ok());
        assert!(
            req(serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "bored"})).is_err()
        );
        assert!(req(serde_json::json!({"paymentId": "pay_1", "amount": 1})).is_err());
        assert!(req(serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "extra": 1})).is_err());
    }

    #[test]
    fn the_view_uses_the_spec_names() {
        let v = serde_json::to_value(RefundView::from(refund())).unwrap();
        for f in [
            "id",
            "livemode",
            "paymentId",
            "projectId",
            "mode",
            "amount",
            "currency",
            "reason",
            "status",
            "createdAt",
            "updatedAt",
        ] {
            assert!(v.get(f).is_some(), "{f}");
        }
        // Optional fields: set, or omitted; never null against their type.
        for f in ["providerRefundId", "failureReason", "notes", "mobileNumber"] {
            assert_ne!(v.get(f), Some(&serde_json::Value::Null), "{f} is null");
        }
        assert_eq!(v["status"], "processing");
        assert_eq!(v["reason"], "customer_request");
    }
}
