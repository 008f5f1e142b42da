//! The scheduler's pass: which open payments are due for a check, claiming
//! one check at a time, and the sweep that expires and reconciles.

use futures::StreamExt;
use serde::Serialize;

use super::settle::{due_after_check, reconcile};
use super::{
    AttemptError, EXPIRE_BATCH, OPEN_PAYMENTS, RECHECK_BATCH, RECONCILE_AFTER, SWEEP_BATCH,
    SWEEP_BUDGET, SWEEP_DEADLINE, SWEEP_PARALLEL, SWEEP_SCAN, is_open, next_check_at,
    open_payments_partition, recheck_partition,
};
use crate::app::Deps;
use crate::domain::Tenant;
use crate::domain::checkout::{self, open_partitions};
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::{Changes, from_item};
use crate::ids::SessionId;
use crate::store::{Cond, Index, Query, SkCond, Store, StoreError};
use crate::time::Timestamp;

/// The write claiming a provider check of `p` at `now`: its `checked_at`,
/// and its place in its partition (`gsi2sk`, by next check). Setting the
/// sort key of a payment that is in no partition indexes nothing: an
/// index entry needs both key attributes.
fn check_update(p: &Payment, now: Timestamp) -> Changes<Payment> {
    Changes::new()
        .set_some(Payment::CHECKED_AT, &now)
        .index_sort(due_after_check(p, now))
}

pub(super) async fn claimed(
    store: &dyn Store,
    p: &Payment,
    now: Timestamp,
    cond: Cond,
) -> Result<bool, StoreError> {
    let claim = store
        .update(
            &Payment::key(&p.id),
            check_update(p, now).into(),
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
pub(super) async fn claim_check(
    store: &dyn Store,
    p: &Payment,
    now: Timestamp,
    gap: chrono::Duration,
) -> Result<bool, StoreError> {
    let cond = Cond::Or(vec![
        Payment::CHECKED_AT.missing(),
        Payment::CHECKED_AT.some().le(&now.plus(-gap)),
    ]);
    claimed(store, p, now, cond).await
}

/// The sweep's claim: nobody checked `p` since the sweep read it.
pub(super) async fn claim_as_read(
    store: &dyn Store,
    p: &Payment,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let cond = match p.checks.checked_at {
        None => Payment::CHECKED_AT.missing(),
        Some(c) => Payment::CHECKED_AT.is(&c),
    };
    claimed(store, p, now, cond).await
}

/// How long the sweep leaves an open payment between checks: a minute
/// while young, then a tenth of its age (an hour-old attempt every 6
/// minutes, a day-old one every 2.4 hours), so abandoned attempts cost
/// little.
pub(super) fn check_gap(payment: &Payment, now: Timestamp) -> chrono::Duration {
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
fn due_for_check(p: &Payment, now: Timestamp) -> bool {
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
    active: crate::domain::active::Active,
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
pub(super) async fn open_payments(
    store: &dyn Store,
    active: &[crate::domain::active::Active],
    now: Timestamp,
) -> Result<(Vec<Payment>, Vec<crate::domain::active::Active>), StoreError> {
    let per_project: Vec<Result<ProjectDue, StoreError>> =
        futures::stream::iter(active.iter().cloned().map(|a| async move {
            let open = open_payments_partition(&Tenant::new(a.project_id.clone(), a.mode));
            let mut payments = due_in(store, open, now, SWEEP_BATCH).await?;
            let recheck = recheck_partition(&Tenant::new(a.project_id.clone(), a.mode));
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
            if now
                >= due
                    .active
                    .touched_at
                    .plus(crate::domain::active::IDLE_AFTER)
            {
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
pub(super) async fn retire(store: &dyn Store, p: &Payment) -> Result<(), StoreError> {
    let update = Changes::<Payment>::new()
        .remove(Payment::RECHECK_UNTIL)
        .unindex(Index::Gsi2);
    match store
        .update(
            &Payment::key(&p.id),
            update.into(),
            Some(Payment::STATUS.eq(&PaymentStatus::Cancelled)),
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
    let active = crate::domain::active::all(store).await?;
    let due = checkout::due_for_expiry(store, &active, now, EXPIRE_BATCH).await?;
    let expired: Vec<(SessionId, Result<bool, StoreError>)> = futures::stream::iter(due)
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
    let refunds = crate::domain::refunds::sweep(state, now).await?;
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
                if let Err(e) = crate::domain::active::touch(
                    store,
                    &Tenant::new(p.project_id.clone(), p.mode),
                    now,
                )
                .await
                {
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
        let quiet = !checkout::has_open_sessions(store, &Tenant::new(a.project_id.clone(), a.mode))
            .await?
            && !has_indexed_payments(store, &a).await?;
        if quiet {
            crate::domain::active::retire(store, &a, now).await?;
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
    a: &crate::domain::active::Active,
) -> Result<bool, StoreError> {
    for pk in [
        open_payments_partition(&Tenant::new(a.project_id.clone(), a.mode)),
        recheck_partition(&Tenant::new(a.project_id.clone(), a.mode)),
    ] {
        let query = Query::partition(pk).on(Index::Gsi2).limit(1);
        if !store.query(&query).await?.items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}
