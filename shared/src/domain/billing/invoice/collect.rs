//! Collecting a billing invoice: a checkout session bound to it (its pay
//! page's provider picker, or its Direct-QR), whose success pays it in the
//! settlement's own transaction, exactly once; a second payment is an
//! overpayment, refunded as its provider's refunds work.
//!
//! - [`open_checkout`]: the pay page's checkout (public: no key), of the
//!   amount due, returning to the pay page.
//! - `qr::for_billing_invoice`: a Direct-QR session of the amount due
//!   (`POST /v1/billing/invoices/{id}/qr`), through the existing QR flow.
//! - [`settlement`]: called by the payment settlement
//!   (`attempts::settle::apply`) when a payment of a bound session
//!   succeeds: the invoice's write (paid, or an overpayment) and the
//!   subscription's move (`FirstInvoicePaid` / `InvoicePaid`), added to
//!   the transaction that makes the payment a success. That transaction
//!   happens once per payment, and the invoice's write is conditioned on
//!   the version read: of two payments, one pays it, the other re-reads
//!   and is an overpayment.
//! - [`refund_overpayment`]: after that transaction, the overpayment's
//!   refund (Khalti by its API, eSewa `requires_action`, Fonepay recorded
//!   for the manual refund), its id and status kept on the invoice.

use serde_json::json;

use super::{
    BillingInvoice, BillingInvoiceError, InvoiceStatus, OverpaymentRefund, PayOutcome, PayPlan,
    PaymentSource, Taken, get_invoice, plan_payment_with,
};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::billing::customers::Customer;
use crate::domain::billing::subscription::{Subscription, SubscriptionEvent, change_ops, next};
use crate::domain::checkout::{self, CheckoutError, CheckoutSession, Creator, Flow};
use crate::domain::payments::Payment;
use crate::domain::record;
use crate::domain::refunds::{self, Channel, CreateRefund, RefundReason, RefundStatus};
use crate::fields::{PersonName, Phone};
use crate::ids::{ApiKeyId, BillingInvoiceId, PaymentId};
use crate::refusal::Refusal;
use crate::store::{Store, StoreError, TxOp};
use crate::time::Timestamp;

/// Why an invoice cannot be collected now.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error(transparent)]
    Invoice(#[from] BillingInvoiceError),
    /// Paid, void or a draft: nothing to pay.
    #[error("this invoice is {}: there is nothing to pay", .0.as_str())]
    NotPayable(InvoiceStatus),
    #[error(transparent)]
    Checkout(#[from] CheckoutError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A refused invoice transition, or an invoice that takes no payment.
fn state_conflict(message: String) -> Refusal {
    Refusal::conflict("billing_invoice_state_conflict", message)
}

impl From<BillingInvoiceError> for Refusal {
    fn from(err: BillingInvoiceError) -> Self {
        match err {
            BillingInvoiceError::NotFound(id) => Refusal::not_found("billing invoice", id.as_str()),
            e @ BillingInvoiceError::Refused(_) => state_conflict(e.to_string()),
            e @ BillingInvoiceError::NotBillable(_) => state_conflict(e.to_string()),
            e @ BillingInvoiceError::AmountMismatch { .. } => {
                Refusal::invalid("amount", e.to_string())
            }
            e @ BillingInvoiceError::Overflow => Refusal::invalid("amount", e.to_string()),
            BillingInvoiceError::Busy => Refusal::from(StoreError::Unavailable(
                "the invoice kept changing; retry".into(),
            )),
            BillingInvoiceError::Store(e) => e.into(),
        }
    }
}

impl From<CollectError> for Refusal {
    fn from(err: CollectError) -> Self {
        match err {
            CollectError::Invoice(e) => e.into(),
            e @ CollectError::NotPayable(_) => state_conflict(e.to_string()),
            CollectError::Checkout(e) => e.into(),
            CollectError::Store(e) => e.into(),
        }
    }
}

/// The invoice `id` whoever asks (the pay page has no key; its id is its
/// secret, 80 random bits).
pub async fn find(
    deps: &Deps,
    id: &BillingInvoiceId,
) -> Result<Option<BillingInvoice>, StoreError> {
    find_in(&*deps.store, id).await
}

async fn find_in(
    store: &dyn Store,
    id: &BillingInvoiceId,
) -> Result<Option<BillingInvoice>, StoreError> {
    record::get::<BillingInvoice>(store, &BillingInvoice::key(id)).await
}

/// Whether a payment can pay `inv` now.
pub fn payable(inv: &BillingInvoice) -> Result<(), CollectError> {
    if InvoiceStatus::PAYABLE.contains(&inv.status) && inv.amount_due > 0 {
        Ok(())
    } else {
        Err(CollectError::NotPayable(inv.status))
    }
}

/// The pay page of invoice `id` under `base`.
pub fn pay_url(base: &str, id: &BillingInvoiceId) -> String {
    format!("{base}/b/{id}")
}

/// What a payer is told the invoice is ("Invoice PI-000001").
pub fn description(inv: &BillingInvoice) -> String {
    format!("Invoice {}", inv.number)
}

/// The invoice's customer, when it is still there.
async fn customer_of(
    store: &dyn Store,
    inv: &BillingInvoice,
) -> Result<Option<Customer>, StoreError> {
    let tenant = Tenant::new(inv.project_id.clone(), inv.mode);
    record::get::<Customer>(store, &Customer::key(&tenant, &inv.customer_id)).await
}

/// Opens a hosted checkout of the amount due of invoice `id` (the pay
/// page's "Pay" button): the provider picker, returning to the pay page.
/// Each press opens its own session; two paid at once are one payment and
/// one overpayment.
pub async fn open_checkout(
    deps: &Deps,
    id: &BillingInvoiceId,
    base: &str,
    now: Timestamp,
) -> Result<CheckoutSession, CollectError> {
    let store = &*deps.store;
    let inv = find_in(store, id)
        .await?
        .ok_or_else(|| BillingInvoiceError::NotFound(id.clone()))?;
    payable(&inv)?;
    let amount = checkout::check_amount(inv.amount_due, None, inv.mode)?;
    let customer = customer_of(store, &inv).await?;
    let page = pay_url(base, &inv.id);
    let mut metadata = serde_json::Map::new();
    metadata.insert("billing_invoice_id".into(), json!(inv.id));
    metadata.insert("invoice_number".into(), json!(inv.number));
    metadata.insert("subscription_id".into(), json!(inv.subscription_id));
    let valid = checkout::ValidCheckout {
        amount,
        return_url: page.clone(),
        cancel_url: Some(page),
        provider: None,
        flow: Flow::Hosted,
        description: Some(description(&inv)),
        metadata,
        // Only what the checkout's own rules take.
        customer_name: customer
            .as_ref()
            .map(|c| c.name.chars().take(PersonName::MAX).collect()),
        customer_email: customer.as_ref().and_then(|c| c.email.clone()),
        customer_phone: customer
            .as_ref()
            .and_then(|c| c.phone.clone())
            .filter(|p| Phone::parse(p.clone()).is_ok()),
        customer_address: None,
        collect_address: false,
        client_secret_sha256: None,
    };
    let creator = Creator {
        project_id: inv.project_id.clone(),
        mode: inv.mode,
        // Not a key: the invoice stands for one (as a link does).
        api_key_id: ApiKeyId::stored(format!("binv:{}", inv.id)),
        spend_cap_paisa: None,
    };
    Ok(checkout::create_bound_in(store, &creator, valid, Some(inv.id.clone()), now, None).await?)
}

/// What a succeeded payment does to its bound invoice.
#[derive(Clone, Debug)]
pub struct Settled {
    /// Written in the settlement's transaction.
    pub ops: Vec<TxOp>,
    pub outcome: PayOutcome,
}

/// The writes that take `payment` (now a success) for the billing invoice
/// its `session` is bound to, if any: the invoice paid, with its
/// subscription's move, or the payment recorded as an overpayment. Both
/// writes are conditioned on the versions read (the settlement re-reads
/// and retries on conflict).
pub async fn settlement(
    store: &dyn Store,
    session: &CheckoutSession,
    payment: &Payment,
    base: &str,
    now: Timestamp,
) -> Result<Option<Settled>, StoreError> {
    let Some(id) = &session.billing_invoice_id else {
        return Ok(None);
    };
    let Some(inv) = find_in(store, id).await? else {
        tracing::error!(invoice = %id, payment = %payment.id, "paid session's billing invoice is gone");
        return Ok(None);
    };
    if !Tenant::new(inv.project_id.clone(), inv.mode).owns(&payment.project_id, payment.mode) {
        return Ok(None);
    }
    let source = PaymentSource::Online {
        payment_id: payment.id.clone(),
        provider: payment.provider,
    };
    let keeper = crate::domain::billing::credit::overpayment_keeper(store, &inv).await?;
    let plan = plan_payment_with(
        &inv,
        &source,
        payment.amount.get(),
        Taken::Received,
        keeper.as_ref(),
        base,
        now,
    )
    .map_err(|e| StoreError::Invalid(e.to_string()))?;
    let (mut ops, outcome) = match plan {
        PayPlan::Told(_) => return Ok(None),
        PayPlan::Write(ops, outcome) => (ops, outcome),
    };
    if let PayOutcome::Paid(_) = &outcome {
        ops.extend(subscription_paid_ops(store, &inv, now).await?);
    } else {
        tracing::warn!(
            invoice = %inv.id,
            payment = %payment.id,
            status = inv.status.as_str(),
            "payment for a billing invoice that takes none: recorded as an overpayment, to refund"
        );
    }
    Ok(Some(Settled { ops, outcome }))
}

/// The subscription of `inv` moved by its payment: `incomplete` becomes
/// `active` (its first invoice), `past_due` and a subscription paused for
/// not paying come back to `active`. Nothing when its state machine takes
/// no payment (an ended subscription keeps its status).
pub(super) async fn subscription_paid_ops(
    store: &dyn Store,
    inv: &BillingInvoice,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    use crate::domain::billing::subscription::SubscriptionStatus as S;
    let Some(sub) =
        record::get::<Subscription>(store, &Subscription::key(&inv.subscription_id)).await?
    else {
        return Ok(Vec::new());
    };
    let event = if sub.status == S::Incomplete {
        SubscriptionEvent::FirstInvoicePaid
    } else {
        SubscriptionEvent::InvoicePaid {
            unpauses: sub.paused_for_nonpayment,
        }
    };
    let Ok(status) = next(sub.status, event) else {
        return Ok(Vec::new());
    };
    if status == sub.status {
        return Ok(Vec::new());
    }
    let mut changed = sub.clone();
    changed.status = status;
    if sub.status == S::Paused && status == S::Active {
        changed.paused_for_nonpayment = false;
        changed.pause_reason = None;
        changed.resume_at = None;
    }
    changed.version = sub.version + 1;
    changed.updated_at = now;
    // As every change of a subscription: its due time, and its webhook.
    change_ops(store, &sub, &changed, Some(event), now).await
}

/// After the settlement: the refund of the overpayment `payment_id` made
/// on the invoice `id`, as its provider's refunds work (Khalti by its API,
/// eSewa `requires_action`, Fonepay recorded for the manual refund), its
/// id and status kept on the invoice (the write also takes away its
/// [`super::refund_due`] item). A refund the payment has already (a
/// retried call, the sweep) is the one kept; nothing when the overpayment
/// has its refund.
pub async fn refund_overpayment(
    deps: &Deps,
    id: &BillingInvoiceId,
    payment_id: &PaymentId,
    now: Timestamp,
) -> Result<RefundAsked, CollectError> {
    let Some(inv) = find(deps, id).await? else {
        return Ok(RefundAsked::Settled);
    };
    let Some(over) = inv.overpayments.iter().find(
        |o| matches!(&o.source, PaymentSource::Online { payment_id: p, .. } if p == payment_id),
    ) else {
        return Ok(RefundAsked::Settled);
    };
    if over.refund_id.is_some() || over.refund_status != OverpaymentRefund::Pending {
        return Ok(RefundAsked::Settled);
    }
    let tenant = Tenant::new(inv.project_id.clone(), inv.mode);
    let (existing, _) =
        refunds::of_payment(deps, payment_id, crate::domain::record::Window::first(1)).await?;
    let refund = match existing.into_iter().next() {
        Some(r) => r,
        None => {
            let body = CreateRefund {
                payment_id: payment_id.to_string(),
                amount: over.amount,
                reason: RefundReason::Duplicate,
                notes: crate::fields::RefundNotes::parse(format!(
                    "Overpayment of billing invoice {} (already paid)",
                    inv.number
                ))
                .ok(),
                mobile_number: None,
            };
            let request = refunds::RefundRequest {
                tenant: &tenant,
                payment_id: payment_id.clone(),
                body,
                // As the dashboard refunds: every provider takes one
                // (Fonepay's is recorded for the merchant to make).
                channel: Channel::Dashboard,
                now,
                fence: None,
            };
            match refunds::create_via(deps, request, |_| Ok(Vec::new())).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(invoice = %inv.id, payment = %payment_id, error = %e, "overpayment refund not asked; the refund sweep tries again");
                    return Ok(RefundAsked::Failed(e.to_string()));
                }
            }
        }
    };
    record_refund(deps, &tenant, id, payment_id, &refund, now).await?;
    Ok(RefundAsked::Asked(refund))
}

/// What [`refund_overpayment`] did.
#[derive(Debug)]
pub enum RefundAsked {
    /// Asked now (or found asked) and kept on the invoice.
    Asked(refunds::Refund),
    /// Nothing to do: the refund was kept before, or the invoice or its
    /// overpayment is not there (or is refunded by hand).
    Settled,
    /// The refund flow refused or failed; the refund sweep tries again.
    Failed(String),
}

/// How an overpayment's refund stands, from its refund's status.
fn refund_state(source: &PaymentSource, status: RefundStatus) -> OverpaymentRefund {
    use crate::domain::Provider;
    match (source, status) {
        (
            PaymentSource::Online {
                provider: Provider::Fonepay,
                ..
            },
            RefundStatus::RequiresAction,
        ) => OverpaymentRefund::Manual,
        (_, RefundStatus::Processing) => OverpaymentRefund::Processing,
        (_, RefundStatus::Succeeded) => OverpaymentRefund::Succeeded,
        (_, RefundStatus::Failed) => OverpaymentRefund::Failed,
        (_, RefundStatus::RequiresAction) => OverpaymentRefund::RequiresAction,
    }
}

/// Keeps `refund` on the overpayment of `payment_id` (a write conditioned
/// on the version read).
async fn record_refund(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    payment_id: &PaymentId,
    refund: &refunds::Refund,
    now: Timestamp,
) -> Result<(), CollectError> {
    for attempt in 0..16 {
        let inv = get_invoice(deps, tenant, id).await?;
        let mut overpayments = inv.overpayments.clone();
        let Some(o) = overpayments.iter_mut().find(
            |o| matches!(&o.source, PaymentSource::Online { payment_id: p, .. } if p == payment_id),
        ) else {
            return Ok(());
        };
        o.refund_id = Some(refund.id.clone());
        o.refund_status = refund_state(&o.source, refund.status);
        let op = TxOp::Update {
            key: BillingInvoice::key(id),
            update: crate::domain::record::Changes::<BillingInvoice>::new()
                .set(BillingInvoice::OVERPAYMENTS, &overpayments)
                .set(BillingInvoice::VERSION, &(inv.version + 1))
                .set(BillingInvoice::UPDATED_AT, &now)
                .into(),
            cond: Some(BillingInvoice::VERSION.eq(&inv.version)),
        };
        match deps
            .store
            .transact(vec![op, super::refund_due::delete_op(payment_id)])
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if e.is_condition_failure() || super::is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingInvoiceError::Busy.into())
}
