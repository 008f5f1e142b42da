//! The billing engine's sweep: everything due for a subscription, done
//! through the state machine and [`issue_invoice`], by due time.
//!
//! [`advance`] takes one subscription as far as `now` asks, one step at a
//! time ([`next_step`], pure): a draft's start, the trial's
//! `trial_will_end` moment and its end (the first invoice), each period's
//! end (the next period's invoice, or the cancel pending at period end),
//! a paused subscription's `resume_at`, and each period's grace end (an
//! unpaid invoice is marked overdue and the plan's overdue action taken; an
//! incomplete subscription's unpaid first invoice is voided and the
//! subscription expires). Each step is one write of the subscription
//! conditioned on the version read; a step that lost a race reads the
//! subscription again and decides again. An invoice is issued BEFORE the
//! write that records its period (the claim makes it exactly once), so a
//! crash between the two leaves the step due, and the next run finds the
//! invoice the claim names.
//!
//! [`sweep`] finds the work through the due index (`billing::due`): per
//! tenant, at most [`PER_TENANT`] due subscriptions, earliest first; the
//! tenants take turns one subscription at a time, from a tenant that
//! rotates every minute, up to the budget; budget left after every
//! tenant's turn goes to further turns of the tenants with more due.
//! Nothing is removed from the
//! index but by the write that does the work, so a crashed run loses
//! nothing: the next run finds the same entries.

use futures::StreamExt;
use serde::Serialize;

use super::calendar::nepal_day_start;
use super::due;
use super::invoice::{
    self, BillingInvoice, BillingInvoiceError, InvoiceStatus, PeriodClaim, issue_invoice,
};
use super::subscription::{
    self, Subscription, SubscriptionError, SubscriptionEvent as E, SubscriptionStatus as S,
    change_ops, is_conflict, next, started,
};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::record::{self, from_item};
use crate::store::{Index, Query, SkCond, StoreError};
use crate::time::Timestamp;

/// Most steps one [`advance`] takes (a year of a monthly plan is 24); the
/// rest stays due for the next run.
pub const MAX_STEPS: usize = 64;
/// Most due subscriptions of one tenant taken per run.
pub const PER_TENANT: usize = 100;
/// Subscriptions advanced per run by the scheduler.
pub const BUDGET: usize = 500;
/// Tenants read, and subscriptions advanced, at once.
pub const PARALLEL: usize = 8;
/// No new subscription is started after this long in a run.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(40);

/// One thing due for a subscription, in the order ties are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A draft's start day came.
    Start,
    /// The trial ends in [`subscription::TRIAL_WILL_END_BEFORE`].
    TrialWillEnd,
    TrialEnd,
    /// The grace end of period `n`'s invoice.
    GraceEnd(u32),
    /// The grace end of a proration invoice (`Subscription::grace_pending`).
    ProrationGrace,
    Resume,
    /// The next invoice's `invoice.upcoming` moment (`billing::upcoming`).
    Upcoming,
    /// The current period ended.
    PeriodEnd,
}

/// The first step due for `sub` at `now` (earliest due; on a tie, in
/// [`Step`] order), `None` when nothing is.
pub fn next_step(sub: &Subscription, now: Timestamp) -> Option<Step> {
    let mut due: Vec<(Timestamp, Step)> = Vec::new();
    match sub.status {
        S::IncompleteExpired | S::Cancelled | S::Completed => return None,
        S::Draft => {
            if let Some(at) = nepal_day_start(sub.start_date) {
                due.push((at, Step::Start));
            }
        }
        S::Trialing => {
            if let Some(end) = sub.trial_ends_at {
                due.push((end, Step::TrialEnd));
                if sub.trial_reminded_for != Some(end) {
                    let at = end.plus(-subscription::TRIAL_WILL_END_BEFORE);
                    due.push((at, Step::TrialWillEnd));
                }
            }
        }
        S::Incomplete => {}
        S::Active | S::PastDue | S::Paused => {
            if let Some(at) = sub
                .current_period()
                .and_then(|p| nepal_day_start(p.end_exclusive))
            {
                due.push((at, Step::PeriodEnd));
            }
        }
    }
    if sub.status == S::Paused {
        if let Some(at) = sub.resume_at {
            due.push((at, Step::Resume));
        }
    }
    if let Some((at, _)) = sub.upcoming_at() {
        due.push((at, Step::Upcoming));
    }
    if let Some((at, _)) = sub.proration_grace_at() {
        due.push((at, Step::ProrationGrace));
    }
    if sub.billing_start.is_some()
        && !matches!(sub.status, S::Draft | S::Trialing)
        && sub.overdue_next <= sub.period_index
    {
        if let Some(at) = sub
            .period(sub.overdue_next)
            .and_then(|p| sub.terms.overdue_on(p.start))
            .and_then(nepal_day_start)
        {
            due.push((at, Step::GraceEnd(sub.overdue_next)));
        }
    }
    due.into_iter()
        .filter(|(at, _)| *at <= now)
        .min()
        .map(|(_, step)| step)
}

/// Why advancing a subscription failed (the next run tries again).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Subscription(#[from] SubscriptionError),
    #[error(transparent)]
    Invoice(#[from] BillingInvoiceError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("period {0} of the subscription is outside the calendar's covered years")]
    NoPeriod(u32),
}

impl From<subscription::Refusal> for SweepError {
    fn from(r: subscription::Refusal) -> Self {
        SweepError::Subscription(r.into())
    }
}

/// What [`advance`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Advanced {
    /// The subscription as it is now stored.
    pub subscription: Subscription,
    /// The steps it took (its writes).
    pub steps: usize,
    /// Invoices this call created (not found already issued).
    pub invoices_issued: usize,
}

/// Does everything due for `sub` at `now` (see the module): reads it
/// again, then takes [`next_step`] until nothing is due, at most
/// [`MAX_STEPS`].
pub async fn advance(
    deps: &Deps,
    sub: &Subscription,
    now: Timestamp,
) -> Result<Advanced, SweepError> {
    let tenant = sub.tenant();
    let mut current = subscription::get(deps, &tenant, &sub.id).await?;
    let mut done = Advanced {
        subscription: current.clone(),
        steps: 0,
        invoices_issued: 0,
    };
    for attempt in 0..MAX_STEPS {
        let Some(step) = next_step(&current, now) else {
            break;
        };
        let (changed, issued) = decide(deps, &current, step, now).await?;
        let mut changed = changed;
        changed.version = current.version + 1;
        changed.updated_at = now;
        let changed = changed.stamped();
        let mut ops = change_ops(&*deps.store, &current, &changed, None, now).await?;
        if subscription::applied_pending(&current, &changed) {
            // A scheduled plan change applied by this step.
            ops.extend(super::changes::updated_event(&current, &changed, now).put_ops()?);
        }
        if step == Step::Upcoming {
            // Once per period: the write that records it carries it. A
            // sweep that comes after the period's end (the invoice is
            // issued next) sends none.
            let ended = current
                .current_period()
                .and_then(|p| nepal_day_start(p.end_exclusive))
                .is_none_or(|end| now >= end);
            if !ended {
                if let Some(draft) = super::upcoming::draft(deps, &current, now).await? {
                    let base = deps.config.base_for(None);
                    ops.extend(super::upcoming::event(&draft, &base, now).put_ops()?);
                }
            }
        }
        if step == Step::TrialWillEnd {
            // Once per trial end: the write that records it carries it.
            ops.extend(super::events::trial_will_end(&changed, now).put_ops()?);
            // Its notice's schedule, in the same write.
            if let Some(end) = changed.trial_ends_at {
                let moment = end.plus(-subscription::TRIAL_WILL_END_BEFORE);
                let notice =
                    super::notice_due::NoticeSchedule::for_trial(&changed, end, moment, now);
                ops.push(notice.write(None)?);
            }
        }
        match deps.store.transact(ops).await {
            Ok(()) => {
                done.steps += 1;
                done.invoices_issued += issued.as_ref().map_or(0, |(_, created)| *created);
                current = changed;
            }
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                crate::store::contention_backoff(attempt.min(4)).await;
                current = subscription::get(deps, &tenant, &sub.id).await?;
                if let Some((inv, 1)) = issued {
                    orphaned(deps, &current, &inv, now).await?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    done.subscription = current;
    Ok(done)
}

/// An invoice this run created for a period its subscription never
/// reached (an API call ended the subscription between the read and the
/// write): voided, so nobody is asked to pay it.
async fn orphaned(
    deps: &Deps,
    now_stored: &Subscription,
    inv: &BillingInvoice,
    now: Timestamp,
) -> Result<(), SweepError> {
    let reached = now_stored
        .current_period()
        .is_some_and(|p| p.start >= inv.period_start);
    if now_stored.status.is_ended() && !reached {
        match invoice::void(deps, &now_stored.tenant(), &inv.id, now).await {
            Ok(_) | Err(BillingInvoiceError::Refused(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The subscription after `step`, and the invoice the step issued (with
/// 1 when this call created it).
async fn decide(
    deps: &Deps,
    sub: &Subscription,
    step: Step,
    now: Timestamp,
) -> Result<(Subscription, Option<(BillingInvoice, usize)>), SweepError> {
    let mut changed = sub.clone();
    let mut issue = None;
    match step {
        Step::Start => {
            started(&mut changed)?;
            if changed.billing_start.is_some() {
                issue = Some(0);
            }
        }
        Step::TrialWillEnd => changed.trial_reminded_for = changed.trial_ends_at,
        Step::Upcoming => {
            changed.upcoming_for = sub.upcoming_at().map(|(_, start)| start);
        }
        Step::TrialEnd => {
            if changed.cancel_at_period_end {
                changed.status = next(changed.status, E::PeriodEndedCancelPending)?;
                changed.cancelled_at = Some(now);
            } else {
                changed.status = next(changed.status, E::TrialEnded)?;
                changed.billing_start = changed.trial_ends_at.map(super::calendar::nepal_day);
                changed.period_index = 0;
                changed.overdue_next = 0;
                if let Some(first) = changed.period(0) {
                    super::changes::apply_pending(&mut changed, first.start);
                }
                issue = Some(0);
            }
        }
        Step::PeriodEnd => {
            if changed.cancel_at_period_end {
                changed.status = next(changed.status, E::PeriodEndedCancelPending)?;
                changed.cancelled_at = Some(now);
            } else {
                changed.period_index += 1;
                // A plan change scheduled from this period applies before
                // its invoice is issued (`billing::changes`).
                if let Some(p) = changed.current_period() {
                    super::changes::apply_pending(&mut changed, p.start);
                }
                // A period that begins while paused is not billed.
                if matches!(changed.status, S::Active | S::PastDue) {
                    issue = Some(changed.period_index);
                }
            }
        }
        Step::Resume => {
            changed.status = next(changed.status, E::Resume)?;
            changed.resume_at = None;
            changed.pause_reason = None;
            changed.paused_for_nonpayment = false;
        }
        Step::GraceEnd(n) => {
            changed.overdue_next = n + 1;
            if grace_ended_unpaid(deps, sub, n, now).await? {
                overdue_action(sub, &mut changed, now)?;
            }
        }
        Step::ProrationGrace => {
            // The same rule as a cycle invoice's grace end: still open, it
            // is marked overdue and the plan's overdue action taken.
            if let Some((_, g)) = sub.proration_grace_at() {
                let g = g.clone();
                changed.grace_pending.retain(|p| p != &g);
                let tenant = sub.tenant();
                let inv = invoice::get_invoice(deps, &tenant, &g.invoice_id).await?;
                let after = match inv.status {
                    InvoiceStatus::Open => {
                        transition_or_reread(
                            invoice::mark_overdue(deps, &tenant, &inv.id, now).await,
                            deps,
                            &tenant,
                            &inv,
                        )
                        .await?
                    }
                    _ => inv,
                };
                if after.status == InvoiceStatus::Overdue
                    && matches!(sub.status, S::Active | S::PastDue | S::Paused)
                {
                    overdue_action(sub, &mut changed, now)?;
                }
            }
        }
    }
    let issued = match issue {
        Some(n) => {
            let period = changed.period(n).ok_or(SweepError::NoPeriod(n))?;
            let issued = issue_invoice(deps, &changed, period, now).await?;
            Some((issued.invoice, usize::from(issued.created)))
        }
        None => None,
    };
    Ok((changed, issued))
}

/// The plan's overdue action on `changed` (`sub` as read): its status,
/// and what the status records.
fn overdue_action(
    sub: &Subscription,
    changed: &mut Subscription,
    now: Timestamp,
) -> Result<(), SweepError> {
    let action = sub.terms.overdue_action;
    changed.status = next(sub.status, E::GraceEndedUnpaid(action))?;
    match changed.status {
        S::Paused if sub.status != S::Paused => changed.paused_for_nonpayment = true,
        S::Cancelled => changed.cancelled_at = Some(now),
        _ => {}
    }
    Ok(())
}

/// Whether period `n`'s invoice was still unpaid when its grace ended:
/// marks it overdue (an incomplete subscription's first invoice: void).
/// A period without an invoice (it began while paused) is not unpaid.
async fn grace_ended_unpaid(
    deps: &Deps,
    sub: &Subscription,
    n: u32,
    now: Timestamp,
) -> Result<bool, SweepError> {
    let Some(period) = sub.period(n) else {
        return Err(SweepError::NoPeriod(n));
    };
    let key = PeriodClaim::key(&sub.id, period.start);
    let Some(claim) = record::get::<PeriodClaim>(&*deps.store, &key).await? else {
        return Ok(false);
    };
    let tenant = sub.tenant();
    let inv = invoice::get_invoice(deps, &tenant, &claim.invoice_id).await?;
    let expiring = sub.status == S::Incomplete;
    let after = match inv.status {
        InvoiceStatus::Open | InvoiceStatus::Overdue if expiring => {
            transition_or_reread(
                invoice::void(deps, &tenant, &inv.id, now).await,
                deps,
                &tenant,
                &inv,
            )
            .await?
        }
        InvoiceStatus::Open => {
            transition_or_reread(
                invoice::mark_overdue(deps, &tenant, &inv.id, now).await,
                deps,
                &tenant,
                &inv,
            )
            .await?
        }
        _ => inv,
    };
    Ok(match after.status {
        InvoiceStatus::Overdue => true,
        // An incomplete subscription's first invoice voided (by this run,
        // an earlier one that crashed, or the merchant): it expires.
        InvoiceStatus::Void => expiring,
        _ => false,
    })
}

/// The invoice after a transition, or as it is now when another writer
/// moved it first (a payment racing the grace end wins).
async fn transition_or_reread(
    moved: Result<BillingInvoice, BillingInvoiceError>,
    deps: &Deps,
    tenant: &Tenant,
    inv: &BillingInvoice,
) -> Result<BillingInvoice, SweepError> {
    match moved {
        Ok(after) => Ok(after),
        Err(BillingInvoiceError::Refused(_)) => {
            Ok(invoice::get_invoice(deps, tenant, &inv.id).await?)
        }
        Err(e) => Err(e.into()),
    }
}

/// What one [`sweep`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BillingSweepReport {
    /// Subscriptions found due and advanced.
    pub subscriptions_advanced: usize,
    /// Invoices issued by this run.
    pub invoices_issued: usize,
    /// Subscriptions (or tenants) that failed; the next run tries again.
    pub errors: usize,
}

/// The due subscriptions of `tenant` at `now`, earliest first, at most
/// `limit`.
pub async fn due_in(
    deps: &Deps,
    tenant: &Tenant,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Subscription>, StoreError> {
    due_after(deps, tenant, None, now, limit).await
}

/// [`due_in`], after `after` (a subscription read before) when given.
async fn due_after(
    deps: &Deps,
    tenant: &Tenant,
    after: Option<&Subscription>,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Subscription>, StoreError> {
    let before = due::due_before(now);
    let sk = match after.and_then(|s| s.next_due_at.map(|at| due::due_sort(at, &s.id))) {
        // Just past the last one read ("\0" sorts before any other
        // character that could follow it).
        Some(last) => SkCond::Between(format!("{last}\u{0}"), before),
        None => SkCond::Lt(before),
    };
    let query = Query::partition(due::due_partition(tenant))
        .on(Index::Gsi2)
        .sk(sk)
        .limit(limit);
    let page = deps.store.query(&query).await?;
    let mut out = Vec::with_capacity(page.items.len());
    for item in page.items {
        match from_item::<Subscription>(item) {
            Ok(s) => out.push(s),
            Err(e) => tracing::warn!(error = %e, "unreadable subscription in the due index"),
        }
    }
    Ok(out)
}

/// The subscriptions this run advances, in order: each tenant's due ones
/// (at most `per_tenant`, earliest first), the tenants taking turns one
/// at a time from one that moves every minute, up to `budget`; then, while
/// budget is left that no other tenant needs, the next `per_tenant` of
/// each tenant that had more, taking turns again; and the number of
/// tenants whose index could not be read.
pub async fn pick(
    deps: &Deps,
    now: Timestamp,
    budget: usize,
    per_tenant: usize,
) -> Result<(Vec<Subscription>, usize), StoreError> {
    let per_tenant = per_tenant.max(1);
    let tenants: Vec<Tenant> = due::tenants(&*deps.store)
        .await?
        .iter()
        .map(due::DueTenant::tenant)
        .collect();
    let mut errors = 0;
    // (tenant, its last subscription read) of the tenants that may have
    // more due than was read.
    let mut pending: Vec<(Tenant, Option<Subscription>)> =
        tenants.into_iter().map(|t| (t, None)).collect();
    let mut out = Vec::new();
    let mut first = true;
    while out.len() < budget && !pending.is_empty() {
        let found: Vec<(Tenant, Result<Vec<Subscription>, StoreError>)> =
            futures::stream::iter(pending)
                .map(|(t, after)| async move {
                    let r = due_after(deps, &t, after.as_ref(), now, per_tenant).await;
                    (t, r)
                })
                .buffered(PARALLEL)
                .collect()
                .await;
        let mut queues = Vec::new();
        pending = Vec::new();
        for (t, f) in found {
            match f {
                Ok(subs) if !subs.is_empty() => {
                    if subs.len() == per_tenant {
                        pending.push((t, subs.last().cloned()));
                    }
                    queues.push(subs);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "a tenant's due index could not be read");
                    errors += usize::from(first);
                }
            }
        }
        first = false;
        let room = budget - out.len();
        out.extend(due::take_turns(queues, now.unix_seconds() / 60, room));
    }
    Ok((out, errors))
}

/// One run: advances at most `budget` due subscriptions (see [`pick`]),
/// [`PARALLEL`] at once, starting none after [`DEADLINE`]. Fails only
/// when the list of tenants cannot be read.
pub async fn sweep(
    deps: &Deps,
    now: Timestamp,
    budget: usize,
) -> Result<BillingSweepReport, StoreError> {
    let (due, errors) = pick(deps, now, budget, PER_TENANT).await?;
    let mut report = BillingSweepReport {
        errors,
        ..BillingSweepReport::default()
    };
    let began = std::time::Instant::now();
    let results: Vec<Option<Result<Advanced, SweepError>>> = futures::stream::iter(due)
        .map(|s| async move {
            if began.elapsed() >= DEADLINE {
                return None;
            }
            let r = advance(deps, &s, now).await;
            if let Err(e) = &r {
                tracing::warn!(subscription = %s.id, error = %e, "advance failed; next sweep retries");
            }
            Some(r)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for r in results.into_iter().flatten() {
        match r {
            Ok(a) => {
                report.subscriptions_advanced += 1;
                report.invoices_issued += a.invoices_issued;
            }
            Err(_) => report.errors += 1,
        }
    }
    tracing::info!(
        subscriptions_advanced = report.subscriptions_advanced,
        invoices_issued = report.invoices_issued,
        errors = report.errors,
        "billing sweep done"
    );
    Ok(report)
}

#[cfg(test)]
mod tests;
