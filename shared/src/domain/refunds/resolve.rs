//! Resolving a refund: applying the provider's answer exactly once, reading
//! and listing refunds, and the sweep that resolves the ones left open.

use serde::Serialize;

use super::{
    GIVE_UP_AFTER, NOT_APPLIED_AFTER, OPEN_REFUNDS, OpenRefund, RESOLVE_AFTER, Refund,
    RefundStatus, RefundView, TRIES,
};
use crate::app::Deps;
use crate::domain::listing::{self, ListFilter, ListKind};
use crate::domain::outbox::{Event, EventType};
use crate::domain::payments::{self, Payment, PaymentStatus, PaymentView};
use crate::domain::record::{self, Changes, from_item};
use crate::domain::{Tenant, Window};
use crate::ids::{PaymentId, RefundId};
use crate::keys;
use crate::money::Paisa;
use crate::providers::{ProviderState, StatusQuery};
use crate::store::{Cond, Index, Query, Seek, SkCond, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// How an open refund ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Succeeded(Option<String>),
    Failed(String),
    RequiresAction(String),
}

/// Moves an open refund to its outcome, with the payment's counters and
/// the events, in one transaction; answers the refund as stored after. A
/// refund no longer `processing` is answered unchanged.
pub(super) async fn resolve(
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
    payment_id: &PaymentId,
    now: Timestamp,
) -> Result<(), StoreError> {
    for attempt in 0..TRIES {
        let Some(p) = payments::get(store, payment_id).await? else {
            return Ok(());
        };
        if p.status != PaymentStatus::Success || p.amount_refunded < p.amount {
            // Another caller marked it first: exactly one event.
            return Ok(());
        }
        let mut after = p.clone();
        after.status = PaymentStatus::Refunded;
        after.updated_at = now;
        let view = serde_json::to_value(PaymentView::from(after))
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let change = p.status_change(PaymentStatus::Refunded);
        let mut ops = vec![TxOp::Update {
            key: Payment::key(&p.id),
            update: change.changes.set(Payment::UPDATED_AT, &now).into(),
            cond: Some(Cond::And(vec![
                Payment::STATUS.eq(&PaymentStatus::Success),
                Payment::AMOUNT_REFUNDED.ge(&p.amount),
                change.cond,
            ])),
        }];
        ops.extend(change.also);
        ops.extend(
            Event::new(
                EventType::PaymentRefunded,
                &Tenant::new(p.project_id.clone(), p.mode),
                view,
                now,
            )
            .put_ops()?,
        );
        match store.transact(ops).await {
            Ok(()) => return Ok(()),
            // Read again: a conflict, a caller that marked it first, or a
            // payment the list migration listed meanwhile.
            Err(StoreError::TransactionCanceled { .. }) => {
                let pause = 5 + 10 * attempt as u64 + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
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
    let mut next = r.clone();
    next.updated_at = now;
    let to = match outcome {
        Outcome::Succeeded(_) => RefundStatus::Succeeded,
        Outcome::Failed(_) => RefundStatus::Failed,
        Outcome::RequiresAction(_) => RefundStatus::RequiresAction,
    };
    let change = r.status_change(to);
    let mut refund_update = change.changes.set(Refund::UPDATED_AT, &now);
    let mut ops = Vec::new();
    match outcome {
        Outcome::Succeeded(provider_ref) => {
            next.status = RefundStatus::Succeeded;
            next.provider_refund_id = provider_ref.clone();
            if let Some(id) = provider_ref {
                refund_update = refund_update.set_some(Refund::PROVIDER_REFUND_ID, id);
            }
            // The reservation already caps the total: add without
            // reading, so parallel successes never retry on each other.
            ops.push(TxOp::Update {
                key: Payment::key(&p.id),
                update: Changes::new()
                    .add(Payment::AMOUNT_REFUNDED, r.amount)
                    .set(Payment::UPDATED_AT, &now)
                    .into(),
                cond: Some(Cond::Exists),
            });
            ops.extend(event(EventType::RefundSucceeded, &next, now)?);
        }
        Outcome::Failed(why) => {
            next.status = RefundStatus::Failed;
            next.failure_reason = Some(why.clone());
            refund_update = refund_update.set_some(Refund::FAILURE_REASON, why);
            ops.push(TxOp::Update {
                key: Payment::key(&p.id),
                update: Changes::new()
                    .subtract(Payment::AMOUNT_RESERVED, r.amount)
                    .into(),
                cond: Some(Cond::Exists),
            });
            ops.extend(event(EventType::RefundFailed, &next, now)?);
        }
        Outcome::RequiresAction(why) => {
            refund_update = refund_update.set_some(Refund::FAILURE_REASON, why);
        }
    }
    ops.insert(
        0,
        TxOp::Update {
            key: Refund::key(&r.id),
            update: refund_update.into(),
            cond: Some(Cond::And(vec![
                Refund::STATUS.eq(&RefundStatus::Processing),
                change.cond,
            ])),
        },
    );
    ops.extend(change.also);
    ops.push(TxOp::Delete {
        key: r.marker_key(),
        cond: None,
    });
    Ok(ops)
}

pub(super) fn event(kind: EventType, r: &Refund, now: Timestamp) -> Result<Vec<TxOp>, StoreError> {
    let view = serde_json::to_value(RefundView::from(r.clone()))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    Event::new(kind, &Tenant::new(r.project_id.clone(), r.mode), view, now).put_ops()
}

/// The refund `id` of any project.
pub(super) async fn get(store: &dyn Store, id: &RefundId) -> Result<Option<Refund>, StoreError> {
    crate::domain::record::get(store, &Refund::key(id)).await
}

/// The refund `id` of `tenant` (else `None`, as if missing).
pub async fn find(
    deps: &Deps,
    tenant: &Tenant,
    id: &RefundId,
) -> Result<Option<Refund>, StoreError> {
    Ok(get(&*deps.store, id)
        .await?
        .filter(|r| tenant.owns(&r.project_id, r.mode)))
}

/// A page of the project's refunds in `mode`, newest first, optionally of
/// one payment, and the total.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    payment_id: Option<&PaymentId>,
    window: Window,
) -> Result<(Vec<Refund>, u64), StoreError> {
    list_where(deps, tenant, payment_id, &ListFilter::default(), window).await
}

/// [`list`] narrowed by `filter` (created in a range, a status, its
/// payment's provider, any combination): through the filtered lists'
/// indexes and counters (`domain::listing`). The refunds of one payment
/// (a few) are narrowed as they are read.
pub async fn list_where(
    deps: &Deps,
    tenant: &Tenant,
    payment_id: Option<&PaymentId>,
    filter: &ListFilter,
    window: Window,
) -> Result<(Vec<Refund>, u64), StoreError> {
    let store = &*deps.store;
    if let Some(pid) = payment_id {
        // Another project's (or a missing) payment lists nothing.
        if payments::find(deps, tenant, pid).await?.is_none() {
            return Ok((Vec::new(), 0));
        }
        let mut query = Query::partition(Refund::payment_partition(pid))
            .on(Index::Gsi2)
            .backward();
        if let Some(cond) = narrowing(filter) {
            query = query.filter(cond);
        }
        return record::page_of(store, &query, window).await;
    }
    // The whole list by id (`gsi1`) costs its page for a first page or a
    // page after a record: only a deep offset walks the counters.
    let by_id = window.seek != Seek::Start || window.offset <= listing::DIRECT_OFFSET;
    let by_id_query = || {
        Query::partition(Refund::list_partition(tenant))
            .on(Index::Gsi1)
            .backward()
    };
    if filter.is_empty() && by_id {
        return record::page_of(store, &by_id_query(), window).await;
    }
    let counted = listing::covered(store, tenant, ListKind::Refunds).await?;
    if filter.is_empty() && !counted {
        // Refunds from before the lists are not in them until the
        // migration: the whole list as it was kept.
        return record::page_of(store, &by_id_query(), window).await;
    }
    let seek_from = match &window.seek {
        Seek::Start => None,
        Seek::After(id) | Seek::Before(id) => {
            let found = match RefundId::parse(id) {
                Some(id) => find(deps, tenant, &id).await?,
                None => None,
            };
            match found {
                Some(r) => Some(r),
                None => return Ok((Vec::new(), 0)),
            }
        }
    };
    let (records, total, _) =
        listing::page(store, tenant, filter, &window, seek_from.as_ref(), counted).await?;
    Ok((records, total))
}

/// `filter` as a condition on refunds as read (one payment's few).
fn narrowing(filter: &ListFilter) -> Option<Cond> {
    let mut conds = Vec::new();
    if let Some(name) = &filter.status {
        match serde_json::from_value::<RefundStatus>(serde_json::Value::String(name.clone())) {
            Ok(s) => conds.push(Refund::STATUS.eq(&s)),
            // No refund has a status of another name.
            Err(_) => conds.push(Cond::Not(Box::new(Cond::Exists))),
        }
    }
    if let Some(p) = filter.provider {
        conds.push(Refund::PROVIDER.eq(&p));
    }
    if let Some(from) = filter.from {
        conds.push(Refund::CREATED_AT.ge(&from));
    }
    if let Some(to) = filter.to {
        conds.push(Refund::CREATED_AT.lt(&to));
    }
    (!conds.is_empty()).then_some(Cond::And(conds))
}

/// A page of the refunds of `payment_id`, newest first, and the total,
/// for a caller that has already found the payment in its project and
/// mode (the dashboard's payment page); [`list`] checks that itself.
pub async fn of_payment(
    deps: &Deps,
    payment_id: &PaymentId,
    window: Window,
) -> Result<(Vec<Refund>, u64), StoreError> {
    let query = Query::partition(Refund::payment_partition(payment_id))
        .on(Index::Gsi2)
        .backward();
    crate::domain::record::page_of(&*deps.store, &query, window).await
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
    for shard in 0..crate::domain::checkout::OPEN_SHARDS {
        let query = Query::partition(keys::open(OPEN_REFUNDS, shard))
            .sk(SkCond::Lt(before.clone()))
            .limit(50);
        for item in store.query(&query).await?.items {
            let Ok(OpenRefund { id, .. }) = from_item(item) else {
                continue;
            };
            report.checked += 1;
            match resolve_one(state, &id, now).await {
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

async fn resolve_one(state: &Deps, id: &RefundId, now: Timestamp) -> Result<bool, StoreError> {
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
    let creds = crate::domain::credentials::for_payment(state, payment)
        .await
        .ok()?;
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
pub(super) struct Others {
    pub count: usize,
    pub total: i64,
}

/// From the payment's reservation (a consistent read of one item, never
/// an index that may lag): every live refund of the payment is in it.
async fn others_of(store: &dyn Store, refund: &Refund) -> Result<Others, StoreError> {
    let payment: Option<Payment> = record::get(store, &Payment::key(&refund.payment_id)).await?;
    let reserved = payment.map_or(0, |p| p.amount_reserved.get());
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
pub(super) fn decide(
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
