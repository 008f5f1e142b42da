//! Payments held for review (a provider answer we cannot trust) and their
//! release by an operator.

use super::settle::{Decision, apply};
use super::{due_sk, open_payments_partition, status_in};
use crate::app::Deps;
use crate::domain::Tenant;
use crate::domain::listing::StatusChange;
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::{Changes, Gsi2Entry, from_item};
use crate::ids::PaymentId;
use crate::keys;
use crate::store::{Cond, Index, Query, Store, StoreError};
use crate::time::Timestamp;

/// A hold for review: `processing` with its reason, out of the
/// reconciler's partitions (nothing it learns changes a held payment, and
/// held ones must not crowd its turns) into the held payments' partition
/// ([`held`], for the admin tool); the error log written with it is what
/// calls a person.
pub(super) fn hold_update(p: &Payment, reason: &str, now: Timestamp) -> StatusChange<Payment> {
    let mut change = p.status_change(PaymentStatus::Processing);
    change.changes = change
        .changes
        .set_some(Payment::REVIEW, reason)
        .set(Payment::UPDATED_AT, &now)
        .remove(Payment::RECHECK_UNTIL)
        .index(&Gsi2Entry::new(HELD_PAYMENTS, due_sk(p, now)));
    change
}

/// The `gsi2` partition of payments held for review, oldest hold first
/// (one for the whole table: holds are rare, and each calls a person).
const HELD_PAYMENTS: &str = keys::HELD_PAYMENTS;

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
    id: &PaymentId,
    decision: Release,
    now: Timestamp,
) -> Result<Payment, ReleaseError> {
    let store = &*state.store;
    let p = crate::domain::payments::get(store, id)
        .await?
        .ok_or(ReleaseError::NotFound)?;
    let Some(reason) = p.checks.review.clone() else {
        return Err(ReleaseError::NotHeld);
    };
    // The registry first: the partition the payment goes back to must be
    // one the sweep finds.
    crate::domain::active::touch_now(store, &Tenant::new(p.project_id.clone(), p.mode), now)
        .await?;
    // Due now for a recheck; a few minutes on when the decision follows at
    // once, so a sweep running meanwhile does not judge it first.
    let due = match decision {
        Release::Recheck => now,
        _ => now.plus(chrono::Duration::minutes(5)),
    };
    let update = Changes::<Payment>::new()
        .remove(Payment::REVIEW)
        .set(Payment::UPDATED_AT, &now)
        .index(&Gsi2Entry::new(
            open_payments_partition(&Tenant::new(p.project_id.clone(), p.mode)),
            due_sk(&p, due),
        ));
    let cond = Cond::And(vec![
        Payment::REVIEW.is(&reason),
        Payment::STATUS.eq(&PaymentStatus::Processing),
    ]);
    let item = match store
        .update(&Payment::key(id), update.into(), Some(cond))
        .await
    {
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
            // A person's word states no fee: the configured rate's applies.
            let success = Decision::Success {
                provider_ref,
                fee: None,
                configured_fee: None,
            };
            apply(state, &unheld, success, now).await?
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
pub(super) fn holdable() -> Cond {
    status_in(&[
        PaymentStatus::Pending,
        PaymentStatus::Processing,
        PaymentStatus::Cancelled,
    ])
}

/// Holds an open (or cancelled) payment as `processing` for a person to
/// look at; the reconciler, and every settlement planned from an older
/// copy, then leave it alone.
pub(super) async fn hold_for_review(
    store: &dyn Store,
    payment: &Payment,
    reason: &str,
    now: Timestamp,
) -> Result<Payment, StoreError> {
    let mut current = payment.clone();
    for attempt in 0..HOLD_TRIES {
        let hold = hold_update(&current, reason, now);
        let written = crate::store::update_with(
            store,
            &Payment::key(&payment.id),
            hold.changes.into(),
            Some(Cond::And(vec![holdable(), hold.cond])),
            hold.also,
        )
        .await;
        match written {
            Ok(item) => return from_item(item),
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                let Some(fresh) = crate::domain::payments::get(store, &payment.id).await? else {
                    return Ok(current);
                };
                // Moved on (closed, or held already): as it is now.
                let open = matches!(
                    fresh.status,
                    PaymentStatus::Pending | PaymentStatus::Processing | PaymentStatus::Cancelled
                );
                if !open || fresh.checks.review.is_some() {
                    return Ok(fresh);
                }
                current = fresh;
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(format!(
        "payment {} kept changing while being held",
        payment.id
    )))
}

/// How often a hold re-reads a payment that moved under it.
const HOLD_TRIES: usize = 8;

fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::TransactionCanceled { reasons }
        if reasons.contains(&crate::store::TxReason::Conflict))
}
