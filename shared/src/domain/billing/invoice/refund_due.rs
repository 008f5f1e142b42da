//! The backstop of an overpayment's refund.
//!
//! A payment that arrives for an invoice already paid (or voided) is
//! recorded as an overpayment in the settlement's transaction, and its
//! refund is asked right after that transaction commits
//! ([`super::collect::refund_overpayment`]). A process that dies between
//! the two, or a provider that fails the call, would leave the customer's
//! money with the merchant. So the same transaction that records an
//! overpayment to refund (status `pending`: Khalti and eSewa; Fonepay and
//! out-of-band money are refunded by hand) also writes a [`RefundDue`]
//! item, due [`GRACE_SECONDS`] later; the write that keeps the refund on
//! the invoice deletes it. The scheduler's [`sweep`] asks the refund of
//! every item still there when due (the refund flow finds a refund the
//! payment already has, so nothing is refunded twice), retrying a failure
//! with a growing wait, and after [`MAX_ATTEMPTS`] marks the overpayment's
//! refund `failed` on the invoice (shown on the invoice and the dashboard
//! for a person to settle).

use serde::{Deserialize, Serialize};

use super::collect::{RefundAsked, refund_overpayment};
use super::{BillingInvoice, OverpaymentRefund, PaymentSource};
use crate::Deps;
use crate::domain::Mode;
use crate::domain::record::{self, Changes, Entry, Record, from_item};
use crate::ids::{BillingInvoiceId, PaymentId, ProjectId};
use crate::keys;
use crate::store::{Index, Key, Query, SkCond, StoreError, TxOp};
use crate::time::Timestamp;

/// How long the inline refund has before the sweep takes over.
pub const GRACE_SECONDS: i64 = 120;
/// Tries before the overpayment's refund is marked `failed` for a person
/// (waits of 1, 2, 4, … 64 minutes: about two hours in all).
pub const MAX_ATTEMPTS: u32 = 8;
/// Items taken per sweep.
pub const PER_SWEEP: usize = 50;

/// An overpayment whose refund is still to be asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundDue {
    pub invoice_id: BillingInvoiceId,
    pub payment_id: PaymentId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub due_at: Timestamp,
    pub attempts: u32,
    pub created_at: Timestamp,
}

crate::attrs! { RefundDue {
    DUE_AT: Timestamp = due_at,
    ATTEMPTS: u32 = attempts,
} }

impl RefundDue {
    pub fn key(payment: &PaymentId) -> Key {
        keys::overpayment_refund_due(payment.as_str())
    }

    fn sort(at: Timestamp, payment: &PaymentId) -> String {
        format!("{}#{payment}", at.to_rfc3339())
    }
}

impl Record for RefundDue {
    fn item_key(&self) -> Key {
        RefundDue::key(&self.payment_id)
    }

    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi2(
            keys::OVERPAYMENT_REFUNDS_DUE,
            RefundDue::sort(self.due_at, &self.payment_id),
        )]
    }
}

/// The write (in the overpayment's own transaction) that makes the sweep
/// ask `payment`'s refund unless the inline call does first.
pub fn put_op(
    inv: &BillingInvoice,
    payment: &PaymentId,
    now: Timestamp,
) -> Result<TxOp, StoreError> {
    let due = RefundDue {
        invoice_id: inv.id.clone(),
        payment_id: payment.clone(),
        project_id: inv.project_id.clone(),
        mode: inv.mode,
        due_at: now.plus(chrono::Duration::seconds(GRACE_SECONDS)),
        attempts: 0,
        created_at: now,
    };
    Ok(TxOp::Put {
        item: due.to_item()?,
        cond: None,
    })
}

/// The write (with the one that keeps the refund on the invoice) that
/// takes the item away.
pub fn delete_op(payment: &PaymentId) -> TxOp {
    TxOp::Delete {
        key: RefundDue::key(payment),
        cond: None,
    }
}

/// What a [`sweep`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RefundSweep {
    /// Refunds asked (or found asked) and kept on their invoice.
    pub asked: usize,
    /// Failures to try again later.
    pub retried: usize,
    /// Given up after [`MAX_ATTEMPTS`]: the refund marked `failed`.
    pub failed: usize,
}

/// The wait after the `attempts`-th failure.
pub fn backoff_seconds(attempts: u32) -> i64 {
    60_i64 << attempts.min(6)
}

/// Asks the refund of every overpayment whose item is due at `now`.
pub async fn sweep(deps: &Deps, now: Timestamp) -> Result<RefundSweep, StoreError> {
    let query = Query::partition(keys::OVERPAYMENT_REFUNDS_DUE)
        .on(Index::Gsi2)
        .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())))
        .limit(PER_SWEEP);
    let page = deps.store.query(&query).await?;
    let mut report = RefundSweep::default();
    for item in page.items {
        let due: RefundDue = match from_item(item) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable overpayment refund item passed over");
                continue;
            }
        };
        match refund_overpayment(deps, &due.invoice_id, &due.payment_id, now).await {
            // Kept on the invoice: that write took the item away.
            Ok(RefundAsked::Asked(_)) => report.asked += 1,
            // Kept before, refunded by hand, or the invoice is gone.
            Ok(RefundAsked::Settled) => {
                deps.store
                    .transact(vec![delete_op(&due.payment_id)])
                    .await?;
                report.asked += 1;
            }
            Ok(RefundAsked::Failed(reason)) => {
                if retry_or_give_up(deps, &due, &reason, now).await? {
                    report.failed += 1;
                } else {
                    report.retried += 1;
                }
            }
            Err(e) => {
                let reason = e.to_string();
                if retry_or_give_up(deps, &due, &reason, now).await? {
                    report.failed += 1;
                } else {
                    report.retried += 1;
                }
            }
        }
    }
    Ok(report)
}

/// Schedules the next try; after the last, marks the refund `failed` on
/// the invoice and removes the item (true).
async fn retry_or_give_up(
    deps: &Deps,
    due: &RefundDue,
    reason: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let attempts = due.attempts + 1;
    if attempts < MAX_ATTEMPTS {
        let mut next = due.clone();
        next.attempts = attempts;
        next.due_at = now.plus(chrono::Duration::seconds(backoff_seconds(attempts)));
        tracing::warn!(invoice = %due.invoice_id, payment = %due.payment_id, attempts, error = %reason, "overpayment refund failed; tried again later");
        deps.store
            .transact(vec![TxOp::Put {
                item: next.to_item()?,
                cond: Some(RefundDue::ATTEMPTS.eq(&due.attempts)),
            }])
            .await
            .or_else(ignore_lost_race)?;
        return Ok(false);
    }
    tracing::error!(invoice = %due.invoice_id, payment = %due.payment_id, attempts, error = %reason, "overpayment refund failed every try: needs a person");
    mark_failed(deps, due, now).await?;
    Ok(true)
}

/// The overpayment's refund `failed` (no refund id) and the item gone, in
/// one write conditioned on the invoice's version.
async fn mark_failed(deps: &Deps, due: &RefundDue, now: Timestamp) -> Result<(), StoreError> {
    for attempt in 0..16 {
        let Some(inv) =
            record::get::<BillingInvoice>(&*deps.store, &BillingInvoice::key(&due.invoice_id))
                .await?
        else {
            return deps.store.transact(vec![delete_op(&due.payment_id)]).await;
        };
        let mut overpayments = inv.overpayments.clone();
        if let Some(o) = overpayments.iter_mut().find(|o| {
            matches!(&o.source, PaymentSource::Online { payment_id: p, .. } if *p == due.payment_id)
        }) {
            if o.refund_id.is_none() {
                o.refund_status = OverpaymentRefund::Failed;
            }
        }
        let ops = vec![
            TxOp::Update {
                key: BillingInvoice::key(&inv.id),
                update: Changes::<BillingInvoice>::new()
                    .set(BillingInvoice::OVERPAYMENTS, &overpayments)
                    .set(BillingInvoice::VERSION, &(inv.version + 1))
                    .set(BillingInvoice::UPDATED_AT, &now)
                    .into(),
                cond: Some(BillingInvoice::VERSION.eq(&inv.version)),
            },
            delete_op(&due.payment_id),
        ];
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_condition_failure() || super::is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Backend(format!(
        "billing invoice {} changed too often to mark its refund failed",
        due.invoice_id
    )))
}

/// Another sweep moved the item first: its write stands.
fn ignore_lost_race(e: StoreError) -> Result<(), StoreError> {
    if e.is_condition_failure() {
        Ok(())
    } else {
        Err(e)
    }
}
