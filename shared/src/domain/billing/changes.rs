//! Plan changes, seats and proration (issue 40 parts 4 and 5): what
//! `change-plan`, `preview-proration` and `PATCH …/quantity` call.
//!
//! - The rule ([`prorate`], pure): by whole Nepal days. The change day
//!   counts as remaining; a period's days are its own (a BS month has its
//!   own 29 to 32). credit = remaining/total x current amount x quantity,
//!   debit = remaining/total x new amount x quantity, each rounded half up
//!   to the paisa; net = debit - credit. The preview and the change call
//!   the same function on the same record, so the preview is what the
//!   change bills.
//! - `prorationBehavior: none` (the default) stores a [`PendingChange`] on
//!   the subscription; the sweep applies it ([`apply_pending`]) when it
//!   starts the first period beginning on or after its `effective_on`,
//!   before that period's invoice is issued, so the invoice bills the new
//!   terms.
//! - `create_prorations` and a quantity change apply at once: the
//!   subscription's write (conditioned on its version), its
//!   `subscription.updated` event and, when the net is more than 0, the
//!   proration invoice (open, due today, numbered from the `PI-` series,
//!   no period claim) are ONE transaction. A net of 0 or less issues no
//!   invoice; a net below 0 becomes customer credit in the same
//!   transaction ([`credit_ops`], `billing::credit`).

use chrono::{Duration, NaiveDate};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::calendar::nepal_day;
use super::compose::{self, TaxTerms};
use super::credit::{CreditActor, CreditReason, Grant, grant_ops};
use super::customers::{BillingError, invalid};
use super::events::{invoice_event, subscription_event};
use super::invoice::{BillingInvoice, InvoiceKind, InvoiceLine, InvoiceStatus, LineKind};
use super::lifecycle::{self, LifecycleError, PlanSummary, start_of, terms_of};
use super::notice_due::NoticeSchedule;
use super::period::Period;
use super::plans::{self, Plan};
use super::subscription::{
    self, GracePending, Subscription, SubscriptionError, SubscriptionStatus, change_ops,
    is_conflict,
};
use super::terms::{PricingModel, Terms};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::invoices::{last_number, take_number};
use crate::domain::outbox::{Event, EventType};
use crate::domain::record::Record;
use crate::fields::wire::{or_null, present};
use crate::ids::{BillingInvoiceId, PlanId, SubscriptionId};
use crate::money::Currency;
use crate::refusal::Refusal;
use crate::store::{StoreError, TxOp};
use crate::time::Timestamp;

/// The largest `quantity` (seats) of a subscription.
pub const MAX_QUANTITY: u32 = 10_000;
/// How often an immediate change re-reads what another writer moved.
const TRIES: usize = 32;

// ---------------------------------------------------------------------------
// The rule (pure).

/// A price: paisa per unit per period, and the units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Price {
    pub amount: i64,
    pub quantity: u32,
}

/// What moving from one price to another on `day` of `period` bills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proration {
    pub period: Period,
    /// The change day (Nepal), counted as remaining.
    pub day: NaiveDate,
    pub remaining_days: i64,
    pub total_days: i64,
    /// The unused time of the current price (a `proration_credit` line).
    pub credit: i64,
    /// The remaining time at the new price (a `proration_debit` line).
    pub debit: i64,
}

impl Proration {
    /// debit - credit: more than 0 is owed, less than 0 is credit.
    pub fn net(&self) -> i64 {
        self.debit - self.credit
    }
}

/// The proration of a change on Nepal day `day` from `from` to `to`
/// within `period` (see the module). `None` when `day` is outside the
/// period or an amount overflows.
pub fn prorate(period: Period, day: NaiveDate, from: Price, to: Price) -> Option<Proration> {
    if day < period.start || day >= period.end_exclusive {
        return None;
    }
    let total_days = (period.end_exclusive - period.start).num_days();
    let remaining_days = (period.end_exclusive - day).num_days();
    Some(Proration {
        period,
        day,
        remaining_days,
        total_days,
        credit: share(from, remaining_days, total_days)?,
        debit: share(to, remaining_days, total_days)?,
    })
}

/// remaining/total x amount x quantity, rounded half up to the paisa.
fn share(p: Price, remaining: i64, total: i64) -> Option<i64> {
    if total <= 0 || remaining < 0 || p.amount < 0 {
        return None;
    }
    let whole = i128::from(p.amount)
        .checked_mul(i128::from(p.quantity))?
        .checked_mul(i128::from(remaining))?;
    let total = i128::from(total);
    i64::try_from((2 * whole + total) / (2 * total)).ok()
}

// ---------------------------------------------------------------------------
// The scheduled change.

/// A plan change scheduled by `prorationBehavior: none`, kept on the
/// subscription until the sweep starts the period it applies from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingChange {
    pub plan_id: PlanId,
    /// The new plan's terms, as they were when the change was asked.
    pub terms: Terms,
    /// It applies from the first period starting on or after this day.
    pub effective_on: NaiveDate,
    pub requested_at: Timestamp,
}

/// Whether `terms` bill per unit (a quantity above 1 is allowed).
fn per_unit(terms: &Terms) -> bool {
    terms.pricing_model == PricingModel::PerUnit
}

/// The quantity a subscription keeps on new terms: its own on a per-unit
/// plan, else 1.
fn quantity_on(terms: &Terms, quantity: u32) -> u32 {
    if per_unit(terms) { quantity } else { 1 }
}

/// Applies `sub`'s pending change when a period starting on
/// `period_start` is reached (the sweep calls it as it starts a period,
/// before that period's invoice is issued): true when it did.
pub fn apply_pending(sub: &mut Subscription, period_start: NaiveDate) -> bool {
    let Some(p) = &sub.pending_change else {
        return false;
    };
    if period_start < p.effective_on {
        return false;
    }
    let p = p.clone();
    sub.quantity = quantity_on(&p.terms, sub.quantity);
    sub.plan_id = p.plan_id;
    sub.terms = p.terms;
    sub.pending_change = None;
    true
}

/// `subscription.updated` about `changed`, with `previous_attributes`
/// holding the plan and quantity `current` had (only those that changed).
pub fn updated_event(current: &Subscription, changed: &Subscription, now: Timestamp) -> Event {
    let mut previous = Map::new();
    if current.plan_id != changed.plan_id || current.terms != changed.terms {
        previous.insert("planId".into(), Value::from(current.plan_id.to_string()));
        previous.insert(
            "plan".into(),
            serde_json::to_value(summary(&current.plan_id, &current.terms)).unwrap_or(Value::Null),
        );
    }
    if current.quantity != changed.quantity {
        previous.insert("quantity".into(), Value::from(current.quantity));
    }
    let mut event = subscription_event(EventType::SubscriptionUpdated, changed, now);
    event.previous_attributes = Some(Value::Object(previous));
    event
}

fn summary(plan_id: &PlanId, t: &Terms) -> PlanSummary {
    PlanSummary::of(plan_id, t)
}

// ---------------------------------------------------------------------------
// Errors.

/// Why a change is refused.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The subscription's status takes no change (409).
    #[error("a subscription that is {} cannot {action}", status.as_str())]
    State {
        status: SubscriptionStatus,
        action: &'static str,
    },
    /// Its current period ended and the next has not started yet (the
    /// sweep is due to renew it): retry in a moment.
    #[error("the subscription's period is being renewed; retry in a moment")]
    Renewing,
    #[error("the subscription changed too often while being written; retry")]
    Busy,
}

impl From<BillingError> for ChangeError {
    fn from(e: BillingError) -> Self {
        ChangeError::Lifecycle(e.into())
    }
}

impl From<SubscriptionError> for ChangeError {
    fn from(e: SubscriptionError) -> Self {
        ChangeError::Lifecycle(e.into())
    }
}

impl From<StoreError> for ChangeError {
    fn from(e: StoreError) -> Self {
        ChangeError::Lifecycle(e.into())
    }
}

impl From<ChangeError> for Refusal {
    fn from(err: ChangeError) -> Self {
        match err {
            ChangeError::Lifecycle(e) => e.into(),
            e @ ChangeError::State { .. } => {
                Refusal::conflict(subscription::SUBSCRIPTION_STATE_CONFLICT, e.to_string())
            }
            e @ ChangeError::Renewing => Refusal::conflict("state_conflict", e.to_string()),
            e @ ChangeError::Busy => Refusal::unavailable(&e),
        }
    }
}

// ---------------------------------------------------------------------------
// Wire shapes (the SDK's, camelCase).

/// The SDK's `prorationBehavior`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BillingProrationBehavior)]
pub enum ProrationBehavior {
    /// Apply now with a proration invoice for the net difference.
    CreateProrations,
    /// Schedule the change for the next period (the default).
    None,
}

/// `POST …/{id}/change-plan` (the SDK's `ChangePlanParams`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = ChangeBillingSubscriptionPlan)]
pub struct ChangePlan {
    /// `bp_…`, the tenant's, active, the same currency and interval as the
    /// current plan, and not the current plan.
    pub new_plan_id: String,
    /// `none` only: the change applies from the first period starting on
    /// or after this day (an RFC 3339 time or a Nepal day `YYYY-MM-DD`,
    /// today up to 365 days ahead). Absent: the next period.
    /// `create_prorations` applies now: absent or today.
    #[serde(default, deserialize_with = "or_null")]
    pub effective_at: Option<String>,
    /// `none` (the default) or `create_prorations`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub proration_behavior: Option<ProrationBehavior>,
}

/// `PATCH …/{id}/quantity`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = UpdateBillingSubscriptionQuantity)]
pub struct UpdateQuantity {
    /// 1 to 10,000 seats; a per-unit plan only.
    pub quantity: i64,
}

/// `GET …/{id}/preview-proration?newPlanId=`: what `create_prorations`
/// would bill now, with no write.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingProrationPreview)]
pub struct ProrationPreview {
    /// The unused time of the current plan (paisa).
    pub credit_amount: i64,
    /// The remaining time on the new plan (paisa).
    pub debit_amount: i64,
    /// debit - credit: more than 0 is invoiced, less becomes credit.
    pub net_amount: i64,
    /// VAT on a positive net when tax is enabled (else 0).
    pub tax_amount: i64,
    /// What the proration invoice will ask: net plus VAT (0 when the net
    /// is 0 or less: no invoice).
    pub amount_due: i64,
    pub currency: Currency,
    /// The current period's first Nepal day (null while trialing: nothing
    /// is billed yet, so nothing is prorated).
    #[schema(value_type = Option<String>, format = Date)]
    pub period_start: Option<NaiveDate>,
    /// The day after its last.
    #[schema(value_type = Option<String>, format = Date)]
    pub period_end: Option<NaiveDate>,
    /// The change day (Nepal), counted as remaining.
    #[schema(value_type = String, format = Date)]
    pub proration_date: NaiveDate,
    pub remaining_days: i64,
    pub total_days: i64,
    pub quantity: u32,
    /// The quantity on the new plan (its own on per-unit plans, else 1).
    pub new_quantity: u32,
    pub current_plan: PlanSummary,
    pub new_plan: PlanSummary,
}

// ---------------------------------------------------------------------------
// Rules.

/// What the subscription moves to.
#[derive(Clone, Debug, PartialEq)]
struct Target {
    plan_id: PlanId,
    terms: Terms,
    quantity: u32,
}

/// The tenant's plan named `raw` in `newPlanId`: 404 naming the field when
/// it is not the tenant's, 400 when inactive.
async fn new_plan(deps: &Deps, tenant: &Tenant, raw: &str) -> Result<Plan, ChangeError> {
    let missing = || LifecycleError::Missing {
        what: "plan",
        field: "newPlanId",
        named: raw.to_owned(),
    };
    let id = PlanId::parse(raw.trim()).ok_or_else(missing)?;
    let plan = match plans::get(deps, tenant, &id).await {
        Err(BillingError::NotFound { .. }) => return Err(missing().into()),
        other => other?,
    };
    if !plan.active {
        return Err(invalid(
            "newPlanId",
            format!("plan {} is inactive: change to an active plan", plan.id),
        )
        .into());
    }
    Ok(plan)
}

/// Refuses a status that takes no change: only active, trialing and past
/// due subscriptions change plan or quantity.
fn check_status(sub: &Subscription, action: &'static str) -> Result<(), ChangeError> {
    use SubscriptionStatus as S;
    match sub.status {
        S::Active | S::Trialing | S::PastDue => Ok(()),
        status => Err(ChangeError::State { status, action }),
    }
}

/// Refuses a plan `sub` cannot move to: its current plan, another
/// currency, another interval or calendar (the periods would not line
/// up), and a metered plan on either side of an immediate change.
fn check_target(
    sub: &Subscription,
    plan_id: &PlanId,
    to: &Terms,
    now_applied: bool,
) -> Result<(), ChangeError> {
    let from = &sub.terms;
    if &sub.plan_id == plan_id {
        return Err(invalid(
            "newPlanId",
            format!("the subscription is on plan {plan_id} already"),
        )
        .into());
    }
    if from.currency != to.currency {
        return Err(invalid(
            "newPlanId",
            "the new plan must bill in the subscription's currency",
        )
        .into());
    }
    if (from.interval_unit, from.interval_count, from.calendar)
        != (to.interval_unit, to.interval_count, to.calendar)
    {
        return Err(invalid(
            "newPlanId",
            "the new plan must have the current plan's intervalUnit, intervalCount and calendar",
        )
        .into());
    }
    let metered = PricingModel::Metered;
    if now_applied && (from.pricing_model == metered || to.pricing_model == metered) {
        return Err(invalid(
            "prorationBehavior",
            "a metered plan bills its usage: change it with prorationBehavior none",
        )
        .into());
    }
    Ok(())
}

/// The proration of moving `sub` to `to` on `now`'s Nepal day: `None`
/// while nothing is billed (trialing); [`ChangeError::Renewing`] when
/// its current period ended and the sweep has not started the next yet.
fn proration_of(
    sub: &Subscription,
    to: Price,
    now: Timestamp,
) -> Result<Option<Proration>, ChangeError> {
    if sub.status == SubscriptionStatus::Trialing || sub.billing_start.is_none() {
        return Ok(None);
    }
    let Some(period) = sub.current_period() else {
        return Err(ChangeError::Renewing);
    };
    let from = Price {
        amount: sub.terms.amount,
        quantity: sub.quantity,
    };
    let day = nepal_day(now);
    if day < period.start {
        // Not reached yet (a just-created period): nothing to prorate.
        return Ok(None);
    }
    match prorate(period, day, from, to) {
        Some(p) => Ok(Some(p)),
        None if day >= period.end_exclusive => Err(ChangeError::Renewing),
        None => Err(LifecycleError::Invoice(super::invoice::BillingInvoiceError::Overflow).into()),
    }
}

/// Previews moving the tenant's subscription `id` to the plan the query
/// names (`newPlanId`, as sent: parsed here, 404 when not the tenant's)
/// now, as `create_prorations` would bill it (no write).
pub async fn preview(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    new_plan_raw: Option<&str>,
) -> Result<ProrationPreview, ChangeError> {
    let now = lifecycle::time_for(deps, tenant, id, deps.clock.now()).await?;
    let sub = subscription::get(deps, tenant, id).await?;
    let Some(raw) = new_plan_raw else {
        return Err(invalid("newPlanId", "newPlanId is required").into());
    };
    check_status(&sub, "have a plan change previewed")?;
    let plan = new_plan(deps, tenant, raw).await?;
    let terms = terms_of(&plan);
    check_target(&sub, &plan.id, &terms, true)?;
    let new_quantity = quantity_on(&terms, sub.quantity);
    let to = Price {
        amount: terms.amount,
        quantity: new_quantity,
    };
    let p = proration_of(&sub, to, now)?;
    let net = p.map_or(0, |p| p.net());
    let tax_amount = match proration_tax(deps, tenant).await? {
        Some(t) if net > 0 => compose::tax_of(net, t.rate_bps).map_err(|_| {
            ChangeError::Lifecycle(LifecycleError::Invoice(
                super::invoice::BillingInvoiceError::Overflow,
            ))
        })?,
        _ => 0,
    };
    Ok(ProrationPreview {
        credit_amount: p.map_or(0, |p| p.credit),
        debit_amount: p.map_or(0, |p| p.debit),
        net_amount: net,
        tax_amount,
        amount_due: if net > 0 { net + tax_amount } else { 0 },
        currency: sub.terms.currency,
        period_start: p.map(|p| p.period.start),
        period_end: p.map(|p| p.period.end_exclusive),
        proration_date: nepal_day(now),
        remaining_days: p.map_or(0, |p| p.remaining_days),
        total_days: p.map_or(0, |p| p.total_days),
        quantity: sub.quantity,
        new_quantity,
        current_plan: summary(&sub.plan_id, &sub.terms),
        new_plan: summary(&plan.id, &terms),
    })
}

/// What a change did.
#[derive(Clone, Debug)]
pub struct Changed {
    pub subscription: Subscription,
    /// True when applied now (`create_prorations`, a quantity change).
    pub applied: bool,
    pub proration: Option<Proration>,
    /// The proration invoice (net more than 0).
    pub invoice: Option<BillingInvoice>,
    /// Paisa granted as customer credit (net less than 0).
    pub credit_granted: i64,
}

/// The first period of `sub` starting on or after `day` (its first Nepal
/// day); `None` past the calendar.
fn first_period_from(sub: &Subscription, day: NaiveDate) -> Option<NaiveDate> {
    if sub.billing_start.is_none() {
        // Trialing: the first period starts when the trial ends, early or
        // not, and any period starting on or after `day` takes it.
        return Some(day);
    }
    (sub.period_index + 1..sub.period_index + 400)
        .filter_map(|i| sub.period(i))
        .map(|p| p.start)
        .find(|start| *start >= day)
}

/// Changes the tenant's subscription `id` to plan `body.newPlanId`: now
/// with a proration (`create_prorations`), or from the next period
/// (`none`, the default; see the module).
pub async fn change_plan(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: ChangePlan,
) -> Result<Changed, ChangeError> {
    let now = lifecycle::time_for(deps, tenant, id, deps.clock.now()).await?;
    let behavior = body.proration_behavior.unwrap_or(ProrationBehavior::None);
    let effective = body
        .effective_at
        .as_deref()
        .map(|raw| {
            start_of(Some(raw), now).map_err(|e| match e {
                BillingError::Invalid { message, .. } => {
                    invalid("effectiveAt", message.replace("startDate", "effectiveAt"))
                }
                other => other,
            })
        })
        .transpose()?
        .map(nepal_day);
    if behavior == ProrationBehavior::CreateProrations
        && effective.is_some_and(|d| d != nepal_day(now))
    {
        return Err(invalid(
            "effectiveAt",
            "create_prorations applies now: leave effectiveAt out, or use prorationBehavior none",
        )
        .into());
    }
    let plan = new_plan(deps, tenant, &body.new_plan_id).await?;
    let terms = terms_of(&plan);
    let target = |current: &Subscription| -> Result<Action, ChangeError> {
        check_status(current, "change plan")?;
        match behavior {
            ProrationBehavior::CreateProrations => {
                check_target(current, &plan.id, &terms, true)?;
                Ok(Action::Now(Target {
                    plan_id: plan.id.clone(),
                    terms: terms.clone(),
                    quantity: quantity_on(&terms, current.quantity),
                }))
            }
            ProrationBehavior::None => {
                check_target(current, &plan.id, &terms, false)?;
                // Absent: the next period (while trialing, the first).
                let next = if current.billing_start.is_none() {
                    0
                } else {
                    1
                };
                let from = effective.unwrap_or_else(|| nepal_day(now) + Duration::days(next));
                let effective_on = first_period_from(current, from).ok_or_else(|| {
                    ChangeError::from(invalid(
                        "effectiveAt",
                        "no period of the subscription starts then",
                    ))
                })?;
                Ok(Action::Schedule(PendingChange {
                    plan_id: plan.id.clone(),
                    terms: terms.clone(),
                    effective_on,
                    requested_at: now,
                }))
            }
        }
    };
    write_change(deps, tenant, id, &target, now).await
}

/// Sets the seats of the tenant's per-unit subscription `id`, at once,
/// with the same proration as a plan change (`create_prorations`). The
/// same quantity again changes nothing (a retry answers as the first).
pub async fn update_quantity(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: UpdateQuantity,
) -> Result<Changed, ChangeError> {
    let quantity = check_quantity(body.quantity)?;
    let now = lifecycle::time_for(deps, tenant, id, deps.clock.now()).await?;
    let target = |current: &Subscription| -> Result<Action, ChangeError> {
        check_status(current, "change its quantity")?;
        if !per_unit(&current.terms) {
            return Err(invalid(
                "quantity",
                "quantity applies to per_unit plans only; this subscription's plan is not one",
            )
            .into());
        }
        if current.quantity == quantity {
            return Ok(Action::Nothing);
        }
        Ok(Action::Now(Target {
            plan_id: current.plan_id.clone(),
            terms: current.terms.clone(),
            quantity,
        }))
    };
    write_change(deps, tenant, id, &target, now).await
}

/// A `quantity` as asked: 1 to [`MAX_QUANTITY`].
pub fn check_quantity(q: i64) -> Result<u32, BillingError> {
    match u32::try_from(q) {
        Ok(q) if (1..=MAX_QUANTITY).contains(&q) => Ok(q),
        _ => Err(invalid(
            "quantity",
            format!("quantity must be 1 to {MAX_QUANTITY}, got {q}"),
        )),
    }
}

/// What a change does to the subscription as read.
enum Action {
    /// Nothing (the same quantity again).
    Nothing,
    /// Moves to the target now, prorated.
    Now(Target),
    /// Stores the pending change (replacing one stored before).
    Schedule(PendingChange),
}

/// A new subscription's `quantity` on `terms`: more than 1 on a
/// per-unit plan only.
pub fn check_create_quantity(terms: &Terms, quantity: u32) -> Result<(), BillingError> {
    if quantity > 1 && !per_unit(terms) {
        return Err(invalid(
            "quantity",
            format!("quantity must be 1 on a plan that is not per_unit, got {quantity}"),
        ));
    }
    Ok(())
}

type TargetOf<'a> = dyn Fn(&Subscription) -> Result<Action, ChangeError> + Sync + 'a;

/// Does what `target` says on the record as read: a scheduled change is
/// the subscription's write alone; an immediate one is its write, its
/// `subscription.updated` event and its proration invoice (or credit) in
/// one transaction conditioned on the version read and the invoice
/// counter. A lost race reads and decides again.
async fn write_change(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    target: &TargetOf<'_>,
    now: Timestamp,
) -> Result<Changed, ChangeError> {
    let store = &*deps.store;
    for attempt in 0..TRIES {
        let current = subscription::get(deps, tenant, id).await?;
        let to = match target(&current)? {
            Action::Nothing => {
                return Ok(Changed {
                    subscription: current,
                    applied: false,
                    proration: None,
                    invoice: None,
                    credit_granted: 0,
                });
            }
            Action::Schedule(pending) => {
                let mut changed = current.clone();
                changed.pending_change = Some(pending);
                changed.version = current.version + 1;
                changed.updated_at = now;
                let changed = changed.stamped();
                let ops = change_ops(store, &current, &changed, None, now).await?;
                match store.transact(ops).await {
                    Ok(()) => {
                        return Ok(Changed {
                            subscription: changed,
                            applied: false,
                            proration: None,
                            invoice: None,
                            credit_granted: 0,
                        });
                    }
                    Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                        crate::store::contention_backoff(attempt).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Action::Now(to) => to,
        };
        let price = Price {
            amount: to.terms.amount,
            quantity: to.quantity,
        };
        let proration = proration_of(&current, price, now)?;
        let mut changed = current.clone();
        if to.plan_id != current.plan_id {
            // A plan change now replaces one scheduled; a quantity keeps it.
            changed.pending_change = None;
        }
        changed.plan_id = to.plan_id;
        changed.terms = to.terms;
        changed.quantity = to.quantity;
        changed.version = current.version + 1;
        changed.updated_at = now;
        // The proration invoice, made before the write so the subscription
        // records its grace end: the sweep marks it overdue as it marks a
        // cycle invoice (`sweep::Step::ProrationGrace`).
        let mut due = None;
        if let Some(p) = proration.as_ref().filter(|p| p.net() > 0) {
            let (inv, take) = numbered_proration(deps, tenant, &current, &changed, p, now).await?;
            changed.grace_pending.push(GracePending {
                invoice_id: inv.id.clone(),
                overdue_on: inv.overdue_on,
            });
            due = Some((inv, take));
        }
        let changed = changed.stamped();
        let mut ops = change_ops(store, &current, &changed, None, now).await?;
        ops.extend(updated_event(&current, &changed, now).put_ops()?);
        let mut invoice = None;
        let mut credit_granted = 0;
        if let Some(p) = proration {
            if let Some((inv, take)) = due {
                ops.extend(proration_ops(&inv, take, &changed, now)?);
                let base = deps.config.base_for(None);
                ops.extend(
                    invoice_event(EventType::BillingInvoiceCreated, &inv, &base, now).put_ops()?,
                );
                invoice = Some(inv);
            } else if p.net() < 0 {
                credit_granted = -p.net();
                ops.extend(credit_ops(deps, &current, &changed, credit_granted, now).await?);
            }
        }
        match store.transact(ops).await {
            Ok(()) => {
                return Ok(Changed {
                    subscription: changed,
                    applied: true,
                    proration,
                    invoice,
                    credit_granted,
                });
            }
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(ChangeError::Busy)
}

/// A proration invoice's writes: it, the number it takes, its notices
/// and its count in the invoices list.
fn proration_ops(
    inv: &BillingInvoice,
    take: TxOp,
    changed: &Subscription,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    let notices = NoticeSchedule::for_invoice(inv, changed, now);
    let mut ops = vec![inv.put_new()?, take, notices.put_new()?];
    ops.extend(inv.insert_counts());
    Ok(ops)
}

/// The proration invoice of a change to `changed`, with the next number
/// of the tenant's series and the write that takes it.
async fn numbered_proration(
    deps: &Deps,
    tenant: &Tenant,
    current: &Subscription,
    changed: &Subscription,
    p: &Proration,
    now: Timestamp,
) -> Result<(BillingInvoice, TxOp), ChangeError> {
    let last = last_number(&*deps.store, tenant).await?;
    let (number, take) = take_number(tenant, last);
    let tax = proration_tax(deps, tenant).await?;
    let inv = proration_invoice(current, changed, p, tax.as_ref(), number, now)?;
    Ok((inv, take))
}

/// The writes that grant `amount` paisa of customer credit to `sub`'s
/// customer for a downgrade's net credit (`billing::credit`, reason
/// `proration_credit`, by the engine), for the change's transaction:
/// conditioned on the balance as read, so a racing credit change makes
/// the change read again.
async fn credit_ops(
    deps: &Deps,
    current: &Subscription,
    changed: &Subscription,
    amount: i64,
    now: Timestamp,
) -> Result<Vec<TxOp>, ChangeError> {
    let tenant = changed.tenant();
    let customer = super::customers::get(deps, &tenant, &changed.customer_id).await?;
    let note = if current.plan_id == changed.plan_id {
        format!(
            "Quantity {} to {} on {}",
            current.quantity, changed.quantity, changed.terms.description
        )
    } else {
        format!(
            "Plan change from {} to {}",
            current.terms.description, changed.terms.description
        )
    };
    let grant = Grant {
        amount,
        reason: CreditReason::ProrationCredit,
        note: Some(note),
        actor: CreditActor::System,
        invoice_id: None,
    };
    Ok(grant_ops(&customer, grant, now)?.ops)
}

/// The tax a proration invoice is issued with: the tenant's VAT when
/// enabled (`billing::tax`), as period invoices add it. No discount: a
/// coupon discounts period invoices only.
async fn proration_tax(deps: &Deps, tenant: &Tenant) -> Result<Option<TaxTerms>, ChangeError> {
    Ok(super::tax::invoice_terms(deps, tenant).await?)
}

/// The proration invoice of moving `current` to `changed` as `p` bills
/// it, numbered `number`, with `tax`: open, due today, no period claim,
/// kind `proration`.
fn proration_invoice(
    current: &Subscription,
    changed: &Subscription,
    p: &Proration,
    tax: Option<&TaxTerms>,
    number: String,
    now: Timestamp,
) -> Result<BillingInvoice, ChangeError> {
    let today = nepal_day(now);
    let last = p.period.end_exclusive - Duration::days(1);
    let lines = vec![
        InvoiceLine {
            kind: LineKind::ProrationCredit,
            description: format!(
                "Unused time on {} ({} of {} days, {} to {})",
                current.terms.description, p.remaining_days, p.total_days, p.day, last
            ),
            quantity: u64::from(current.quantity),
            amount: -p.credit,
            period_start: p.day,
            period_end: p.period.end_exclusive,
        },
        InvoiceLine {
            kind: LineKind::ProrationDebit,
            description: format!(
                "Remaining time on {} ({} of {} days, {} to {})",
                changed.terms.description, p.remaining_days, p.total_days, p.day, last
            ),
            quantity: u64::from(changed.quantity),
            amount: p.debit,
            period_start: p.day,
            period_end: p.period.end_exclusive,
        },
    ];
    let c =
        compose::compose(lines, (p.day, p.period.end_exclusive), None, tax, 0).map_err(|_| {
            ChangeError::Lifecycle(LifecycleError::Invoice(
                super::invoice::BillingInvoiceError::Overflow,
            ))
        })?;
    Ok(BillingInvoice {
        id: BillingInvoiceId::new(),
        project_id: changed.project_id.clone(),
        mode: changed.mode,
        subscription_id: changed.id.clone(),
        customer_id: changed.customer_id.clone(),
        number,
        status: InvoiceStatus::Open,
        currency: changed.terms.currency,
        lines: c.lines,
        subtotal: c.subtotal,
        discount_total: 0,
        tax_total: c.tax_total,
        total: c.total,
        credit_applied: 0,
        amount_due: c.amount_due,
        amount_paid: 0,
        discount: None,
        tax: tax.cloned(),
        kind: InvoiceKind::Proration,
        period_start: p.day,
        period_end: p.period.end_exclusive,
        due_date: today,
        overdue_on: changed.terms.overdue_on(today).unwrap_or(today),
        payment: None,
        overpayments: Vec::new(),
        issued_at: now,
        paid_at: None,
        voided_at: None,
        uncollectible_at: None,
        version: 1,
        created_at: now,
        updated_at: now,
        counted: true,
        narrowed: true,
    })
}

#[cfg(test)]
mod tests;
