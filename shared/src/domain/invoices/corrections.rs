//! Corrections and adjustments of a finalized invoice, and what blocks them
//! (a checkout being paid).

use super::drafts::{
    AdjustInvoice, CorrectInvoice, InvoiceError, check_version, get_in, invalid, lost_race,
    replace, require_state, text,
};
use super::records::{Adjustment, CollectionStatus, DocumentStatus, Invoice};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::checkout::stats::Tally;
use crate::domain::checkout::{CheckoutSession, SessionStatus};
use crate::domain::payments::{self, Payment, PaymentStatus};
use crate::domain::record::{Changes, Record};
use crate::ids::{InvoiceId, PaymentId};
use crate::store::{Cond, Index, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// The invoice's current checkout session, and the payment of its latest
/// attempt, as they are now.
pub(super) struct CurrentCheckout {
    pub(super) session: CheckoutSession,
    pub(super) payment: Option<Payment>,
}

pub(super) async fn current_checkout(
    store: &dyn Store,
    inv: &Invoice,
) -> Result<Option<CurrentCheckout>, StoreError> {
    let Some(sid) = &inv.checkout_session_id else {
        return Ok(None);
    };
    let Some(session) =
        crate::domain::record::get::<CheckoutSession>(store, &CheckoutSession::key(sid)).await?
    else {
        return Ok(None);
    };
    let payment = match session.payment_id.clone() {
        Some(pid) => payments::get(store, &pid).await?,
        None => None,
    };
    Ok(Some(CurrentCheckout { session, payment }))
}

/// Whether a payment may still bring money (a cancelled one is watched for
/// a late success until its re-check ends).
fn payment_active(p: &Payment, now: Timestamp) -> bool {
    match p.status {
        PaymentStatus::Pending | PaymentStatus::Processing | PaymentStatus::Success => true,
        PaymentStatus::Cancelled => p.checks.recheck_until.is_some_and(|t| t > now),
        PaymentStatus::Failed | PaymentStatus::Refunded => false,
    }
}

/// Why the invoice's checkout stops a change that needs it closed, if it
/// does: an attempt in progress, a payment, or a payment that may still
/// succeed.
fn checkout_activity(c: &CurrentCheckout, now: Timestamp) -> Option<String> {
    let s = &c.session;
    if matches!(s.status, SessionStatus::Initiated | SessionStatus::Success) {
        return Some(format!(
            "checkout {} has a payment in progress or paid",
            s.id
        ));
    }
    if c.payment.as_ref().is_some_and(|p| payment_active(p, now)) {
        return Some(format!(
            "checkout {} has a payment that may still succeed",
            s.id
        ));
    }
    None
}

/// The write that closes the checkout as read: a pending session is
/// expired (only if nobody started an attempt meanwhile); any other is
/// checked to still be what it was. With the counter writes of its
/// status's move (fold them in with `listing::merge_counts`).
pub(super) fn close_checkout_op(
    s: &CheckoutSession,
    now: Timestamp,
    tally: &mut Tally,
) -> (TxOp, Vec<TxOp>) {
    let attempt_as_read = match &s.payment_id {
        Some(p) => CheckoutSession::PAYMENT_ID.is(p),
        // Null or missing: "not a string" (not >= "") covers both on both
        // backends.
        None => Cond::Not(Box::new(
            CheckoutSession::PAYMENT_ID.ge(&Some(PaymentId::default())),
        )),
    };
    if s.status_at(now) == SessionStatus::Pending {
        tally.session_moved(s, SessionStatus::Pending, SessionStatus::Expired);
        let change = s.status_change(
            SessionStatus::Expired,
            Changes::<CheckoutSession>::new()
                .set(CheckoutSession::UPDATED_AT, &now)
                .unindex(Index::Gsi2),
        );
        let op = TxOp::Update {
            key: CheckoutSession::key(&s.id),
            update: change.changes.into(),
            cond: Some(Cond::And(vec![change.cond, attempt_as_read])),
        };
        (op, change.also)
    } else {
        let op = TxOp::Check {
            key: CheckoutSession::key(&s.id),
            cond: Cond::And(vec![CheckoutSession::STATUS.eq(&s.status), attempt_as_read]),
        };
        (op, Vec::new())
    }
}

/// Why an issued invoice cannot be corrected (spec: any receipt,
/// allocated or excess amount, unlinked payment activity or
/// payment-related attention), if it cannot.
fn correction_blocker(
    inv: &Invoice,
    checkout: Option<&CurrentCheckout>,
    now: Timestamp,
) -> Option<String> {
    if inv.amount_paid > 0 || !inv.allocations.is_empty() {
        return Some("a payment has been received for this invoice".into());
    }
    if inv.amount_excess > 0 {
        return Some("the invoice holds an excess payment".into());
    }
    if inv.needs_attention {
        return Some("the invoice needs attention for a payment".into());
    }
    checkout
        .and_then(|c| checkout_activity(c, now))
        .map(|why| format!("{why}; use an adjustment instead"))
}

/// Voids an issued, unpaid invoice and creates its replacement draft (a
/// copy of its lines and terms), in one transaction. Its open checkout, if
/// any, is expired in the same transaction, so nobody pays a void invoice.
pub async fn correct(
    state: &Deps,
    tenant: &Tenant,
    id: &InvoiceId,
    body: CorrectInvoice,
) -> Result<(Invoice, Invoice), InvoiceError> {
    let reason =
        text(Some(body.reason)).ok_or_else(|| invalid("reason", "reason must not be empty"))?;
    let store = &*state.store;
    let current = get_in(store, tenant, id).await?;
    require_state(&current, DocumentStatus::Issued, "correct")?;
    let now = state.clock.now();
    let checkout = current_checkout(store, &current).await?;
    if let Some(why) = correction_blocker(&current, checkout.as_ref(), now) {
        return Err(InvoiceError::NotCorrectable(format!(
            "this invoice cannot be corrected: {why}"
        )));
    }
    let mut replacement = current.clone();
    replacement.id = InvoiceId::new();
    replacement.version = 1;
    replacement.invoice_number = None;
    replacement.document_status = DocumentStatus::Draft;
    replacement.collection_status = CollectionStatus::Unpaid;
    replacement.seller = None;
    replacement.issued_at = None;
    replacement.created_at = now;
    replacement.updated_at = now;
    replacement.amount_adjusted = 0;
    replacement.adjustments = Vec::new();
    replacement.checkout_session_id = None;
    replacement.correction_of_invoice_id = Some(current.id.clone());
    replacement.corrected_by_invoice_id = None;
    replacement.voided_at = None;
    replacement.void_reason = None;
    replacement.counted = true;
    replacement.narrowed = true;

    let mut voided = current.clone();
    voided.document_status = DocumentStatus::Void;
    voided.voided_at = Some(now);
    voided.void_reason = Some(reason);
    voided.corrected_by_invoice_id = Some(replacement.id.clone());
    voided.version += 1;
    voided.updated_at = now;
    voided.collection_status = voided.collection();

    // The version covers everything the blocker read (payments and
    // checkouts bump it).
    let mut ops = Invoice::write_over(
        &current,
        &voided,
        vec![Invoice::DOCUMENT_STATUS.eq(&DocumentStatus::Issued)],
    )?;
    ops.push(replacement.put_new()?);
    crate::domain::listing::merge_counts(&mut ops, replacement.counts_new());
    if let Some(c) = &checkout {
        let mut tally = Tally::new();
        let (close, counts) = close_checkout_op(&c.session, now, &mut tally);
        ops.push(close);
        tally.apply_to(&mut ops)?;
        crate::domain::listing::merge_counts(&mut ops, counts);
    }
    match super::drafts::transact(store, ops).await {
        Ok(()) => Ok((voided, replacement)),
        Err(e) if e.is_condition_failure() => {
            Err(lost_race(store, &current, current.version, "correct").await)
        }
        Err(e) => Err(e.into()),
    }
}

/// Records a collection adjustment on an issued invoice: adds to
/// `amount_adjusted` (at most the remaining balance), at the version sent.
/// An open checkout is for the old balance: it is expired in the same
/// transaction (a new checkout collects the new one); with an attempt in
/// progress the adjustment waits (409).
pub async fn adjust(
    state: &Deps,
    tenant: &Tenant,
    id: &InvoiceId,
    body: AdjustInvoice,
) -> Result<Invoice, InvoiceError> {
    let reason =
        text(Some(body.reason)).ok_or_else(|| invalid("reason", "reason must not be empty"))?;
    let store = &*state.store;
    let current = get_in(store, tenant, id).await?;
    require_state(&current, DocumentStatus::Issued, "an adjustment")?;
    check_version(&current, body.version)?;
    let remaining = current.amount_remaining();
    if body.amount < 1 || body.amount > remaining {
        return Err(invalid(
            "amount",
            format!("amount must be 1 to the remaining balance ({remaining} paisa)"),
        ));
    }
    let now = state.clock.now();
    let checkout = current_checkout(store, &current).await?;
    let mut extra = Vec::new();
    if let Some(c) = &checkout {
        if c.session.status_at(now) == SessionStatus::Initiated {
            return Err(InvoiceError::StateConflict(format!(
                "checkout {} has a payment in progress; adjust once it has finished",
                c.session.id
            )));
        }
        let mut tally = Tally::new();
        let (close, counts) = close_checkout_op(&c.session, now, &mut tally);
        extra.push(close);
        tally.apply_to(&mut extra)?;
        crate::domain::listing::merge_counts(&mut extra, counts);
    }
    let mut next = current.clone();
    next.amount_adjusted += body.amount;
    next.adjustments.push(Adjustment {
        amount: body.amount,
        reason,
        at: now,
    });
    next.version += 1;
    next.updated_at = now;
    next.collection_status = next.collection();
    replace(store, &current, next, extra, "an adjustment").await
}
