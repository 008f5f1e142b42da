//! The subscription API's operations (`/v1/billing/subscriptions`, issue
//! 39 item 3): create (the customer's `open_subscriptions` count raised
//! in the same transaction, the first invoice issued when it starts
//! billing at once), list, get, and the merchant's transitions: pause,
//! resume, cancel (now or at period end), end trial (issuing the first
//! invoice), extend trial, and the subscription's dunning policy. Every
//! write goes through `subscription::create_with` / `apply` / `change`.
//!
//! The two transitions that issue an invoice are [`issue_first_invoice`]
//! (at creation) and [`end_trial`]: the scheduler's own start and trial
//! end call the same.

use chrono::{Duration, NaiveDate, NaiveTime};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::calendar::nepal_day;
use super::customers::{
    self, BillingError, Customer, MAX_WINDOW, PageRequest, invalid, metadata, text,
};
use super::dunning::{self, DunningError};
use super::invoice::{BillingInvoiceError, Issued, issue_invoice};
use super::period::{Calendar, IntervalError, IntervalUnit};
use super::plans::{self, Plan};
use super::subscription::{
    self, NewSubscription, Subscription, SubscriptionError, SubscriptionEvent, SubscriptionStatus,
    new_subscription,
};
use super::terms::{OverdueAction, Terms, TermsError, extended_trial_end, trial_end};
use super::test_clock::{self, ClockTimeError};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::listing::counted::{self, CountedKind, Narrowing};
use crate::domain::record::{Changes, Window, page_of};
use crate::fields::wire::{nullable, or_null, present};
use crate::ids::{CustomerId, DunningPolicyId, PlanId, SubscriptionId};
use crate::money::Currency;
use crate::refusal::{Kind, Refusal};
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Query, StoreError, TxOp};
use crate::time::Timestamp;

/// Longest `referenceId`, `pauseReason` and `cancelReason`.
pub const MAX_REFERENCE: usize = 200;
pub const MAX_REASON: usize = 500;
/// How far ahead a `startDate` may be, and a `resumeAt`.
pub const MAX_AHEAD_DAYS: i64 = 365;

/// Why a subscription request is refused.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Billing(#[from] BillingError),
    #[error(transparent)]
    Subscription(#[from] SubscriptionError),
    #[error(transparent)]
    Invoice(#[from] BillingInvoiceError),
    #[error(transparent)]
    Dunning(#[from] DunningError),
    /// The subscription lives on a test clock that is advancing, or was
    /// deleted.
    #[error(transparent)]
    Clock(#[from] ClockTimeError),
    /// A record the body names (its `field`) is not the tenant's.
    #[error("No such {what}: '{named}'")]
    Missing {
        what: &'static str,
        field: &'static str,
        named: String,
    },
}

impl From<StoreError> for LifecycleError {
    fn from(e: StoreError) -> Self {
        LifecycleError::Billing(BillingError::Store(e))
    }
}

/// The field a terms error is about.
fn terms_field(e: &TermsError) -> &'static str {
    match e {
        TermsError::Amount => "amount",
        TermsError::Interval(i) => interval_field(i),
        TermsError::Days { field, .. } => field,
        TermsError::TrialEndsBeforeStart
        | TermsError::TrialTooLong
        | TermsError::ExtensionNotLater { .. } => "trialEndsAt",
    }
}

fn interval_field(e: &IntervalError) -> &'static str {
    match e {
        IntervalError::ZeroCount | IntervalError::CountTooLarge { .. } => "intervalCount",
        IntervalError::AnchorOutOfRange(_) | IntervalError::AnchorNeedsMonths => "billingAnchorDay",
    }
}

impl From<LifecycleError> for Refusal {
    fn from(err: LifecycleError) -> Self {
        match err {
            LifecycleError::Billing(e) => e.into(),
            LifecycleError::Clock(e) => match e {
                e @ ClockTimeError::Advancing { .. } => {
                    Refusal::conflict("state_conflict", e.to_string())
                }
                e @ ClockTimeError::Deleted(_) => {
                    Refusal::conflict("subscription_state_conflict", e.to_string())
                }
                ClockTimeError::Store(s) => s.into(),
            },
            LifecycleError::Missing { what, field, named } => Refusal::new(
                Kind::NotFound,
                "not_found",
                format!("No such {what}: '{named}'"),
            )
            .at(field),
            LifecycleError::Subscription(e) => match e {
                SubscriptionError::NotFound(id) => Refusal::not_found("subscription", id.as_str()),
                SubscriptionError::Refused(r) => {
                    Refusal::conflict("subscription_state_conflict", r.to_string())
                }
                SubscriptionError::Terms(t) => Refusal::invalid(terms_field(&t), t.to_string()),
                SubscriptionError::Interval(i) => {
                    Refusal::invalid(interval_field(&i), i.to_string())
                }
                SubscriptionError::Busy => Refusal::unavailable(&e),
                SubscriptionError::Store(s) => s.into(),
            },
            LifecycleError::Invoice(e) => match e {
                BillingInvoiceError::NotBillable(_) => {
                    Refusal::conflict("subscription_state_conflict", e.to_string())
                }
                BillingInvoiceError::Busy => Refusal::unavailable(&e),
                BillingInvoiceError::Store(s) => s.into(),
                other => Refusal::internal(&other),
            },
            LifecycleError::Dunning(e) => match e {
                DunningError::NotFound(id) => Refusal::new(
                    Kind::NotFound,
                    "not_found",
                    format!("No such dunning policy: '{id}'"),
                )
                .at("policyId"),
                DunningError::Invalid { field, message } => Refusal::invalid(field, message),
                DunningError::Busy => Refusal::unavailable(&e),
                DunningError::Store(s) => s.into(),
                other @ (DunningError::Conflict(_) | DunningError::InvoiceNotFound(_)) => {
                    Refusal::internal(&other)
                }
            },
        }
    }
}

/// `raw`, sent in `field`, names no `what` of the tenant.
fn missing(what: &'static str, field: &'static str, raw: &str) -> LifecycleError {
    LifecycleError::Missing {
        what,
        field,
        named: raw.to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Wire shapes (the SDK's, camelCase).

/// `POST /v1/billing/subscriptions` (the SDK's `CreateSubscriptionParams`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBillingSubscription)]
pub struct CreateSubscription {
    /// `cus_…`, the tenant's.
    pub customer_id: String,
    /// `bp_…`, the tenant's, active.
    pub plan_id: String,
    #[serde(default, deserialize_with = "or_null")]
    pub reference_id: Option<String>,
    /// When it starts: an RFC 3339 time or a Nepal day `YYYY-MM-DD`, today
    /// or up to 365 days ahead (a later day makes a `draft`). Now when
    /// absent.
    #[serde(default, deserialize_with = "or_null")]
    pub start_date: Option<String>,
    /// 0 to 365; `trialEndsAt` wins over it; both absent: the plan's.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub trial_days: Option<i64>,
    #[serde(default, deserialize_with = "or_null")]
    pub trial_ends_at: Option<Timestamp>,
    /// Seats: 1 (the default) to 10,000; more than 1 on a `per_unit`
    /// plan only.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub quantity: Option<i64>,
    /// 1 to 28, month, quarter and year plans only.
    #[serde(default, deserialize_with = "or_null")]
    pub billing_anchor_day: Option<i64>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// `POST …/{id}/pause` (the SDK's `PauseSubscriptionParams`).
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = PauseBillingSubscription)]
pub struct PauseSubscription {
    #[serde(default, deserialize_with = "or_null")]
    pub pause_reason: Option<String>,
    /// When the scheduler resumes it: after now, within 365 days.
    #[serde(default, deserialize_with = "or_null")]
    pub resume_at: Option<Timestamp>,
}

/// `POST …/{id}/cancel` (the SDK's `CancelSubscriptionParams`).
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CancelBillingSubscription)]
pub struct CancelSubscription {
    #[serde(default, deserialize_with = "or_null")]
    pub cancel_reason: Option<String>,
    /// `true`: at the end of the current period; else now.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub at_period_end: Option<bool>,
}

/// `POST …/{id}/extend-trial` (the SDK's `ExtendTrialParams`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = ExtendBillingSubscriptionTrial)]
pub struct ExtendTrial {
    /// After the current trial end, within 365 days of now.
    pub trial_ends_at: Timestamp,
}

/// `POST /v1/billing/dunning/subscriptions/{id}/policy`: `null` reverts to
/// the project's default policy.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = SetSubscriptionDunningPolicy)]
pub struct SetDunningPolicy {
    /// `dpol_…`, the tenant's; `null`: the project's default.
    #[serde(default, deserialize_with = "nullable")]
    pub policy_id: Option<Option<String>>,
}

/// The plan a subscription bills, as its terms snapshot has it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingSubscriptionPlan)]
pub struct PlanSummary {
    pub id: String,
    pub name: String,
    pub amount: i64,
    pub currency: Currency,
    #[schema(value_type = String, pattern = "^(day|week|month|quarter|year)$")]
    pub interval_unit: IntervalUnit,
    pub interval_count: u32,
    #[schema(value_type = String, pattern = "^(ad|bs)$")]
    pub calendar: Calendar,
}

impl PlanSummary {
    /// The summary of plan `id` as `t` bills it.
    pub fn of(id: &PlanId, t: &Terms) -> Self {
        PlanSummary {
            id: id.to_string(),
            name: t.description.clone(),
            amount: t.amount,
            currency: t.currency,
            interval_unit: t.interval_unit,
            interval_count: t.interval_count,
            calendar: t.calendar,
        }
    }
}

/// A scheduled plan change, as the subscription shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingPendingPlanChange)]
pub struct PendingPlanChange {
    /// The plan it moves to, as it was when the change was asked.
    pub plan: PlanSummary,
    /// The first day of the period that bills it.
    #[schema(value_type = String, format = Date)]
    pub effective_on: NaiveDate,
}

/// The subscription as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingSubscription)]
pub struct SubscriptionView {
    /// `sub_…`.
    pub id: String,
    pub livemode: bool,
    /// The SDK's `SubscriptionStatus`.
    #[schema(value_type = String, pattern = "^(incomplete|incomplete_expired|draft|trialing|active|past_due|paused|cancelled|completed)$")]
    pub status: SubscriptionStatus,
    pub customer_id: String,
    pub plan_id: String,
    pub plan: PlanSummary,
    pub quantity: u32,
    pub reference_id: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// The Nepal day it starts.
    #[schema(value_type = String, format = Date)]
    pub start_date: NaiveDate,
    pub billing_anchor_day: Option<u8>,
    pub trial_ends_at: Option<Timestamp>,
    /// The current period's first Nepal day, once billing has begun.
    #[schema(value_type = Option<String>, format = Date)]
    pub current_period_start: Option<NaiveDate>,
    /// The day after its last (the next period's first day).
    #[schema(value_type = Option<String>, format = Date)]
    pub current_period_end: Option<NaiveDate>,
    pub cancel_at_period_end: bool,
    pub cancel_reason: Option<String>,
    pub cancelled_at: Option<Timestamp>,
    pub pause_reason: Option<String>,
    pub resume_at: Option<Timestamp>,
    /// `null`: the project's default policy.
    pub dunning_policy_id: Option<String>,
    /// The sandbox test clock it lives by (its customer's), or null.
    pub test_clock_id: Option<String>,
    /// A plan change scheduled for a later period (`change-plan` with
    /// `prorationBehavior: none`), or null.
    pub pending_plan_change: Option<PendingPlanChange>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl SubscriptionView {
    /// The view as JSON (a webhook event's `data.object`).
    pub fn json(s: &Subscription) -> Value {
        serde_json::to_value(SubscriptionView::of(s)).unwrap_or(Value::Null)
    }

    pub fn of(s: &Subscription) -> Self {
        let period = s.current_period();
        SubscriptionView {
            id: s.id.to_string(),
            livemode: s.mode.is_live(),
            status: s.status,
            customer_id: s.customer_id.to_string(),
            plan_id: s.plan_id.to_string(),
            plan: PlanSummary {
                id: s.plan_id.to_string(),
                name: s.terms.description.clone(),
                amount: s.terms.amount,
                currency: s.terms.currency,
                interval_unit: s.terms.interval_unit,
                interval_count: s.terms.interval_count,
                calendar: s.terms.calendar,
            },
            quantity: s.quantity,
            reference_id: s.reference_id.clone(),
            metadata: s.metadata.clone(),
            start_date: s.start_date,
            billing_anchor_day: s.billing_anchor_day,
            trial_ends_at: s.trial_ends_at,
            current_period_start: period.map(|p| p.start),
            current_period_end: period.map(|p| p.end_exclusive),
            cancel_at_period_end: s.cancel_at_period_end,
            cancel_reason: s.cancel_reason.clone(),
            cancelled_at: s.cancelled_at,
            pause_reason: s.pause_reason.clone(),
            resume_at: s.resume_at,
            dunning_policy_id: s.dunning_policy_id.as_ref().map(|p| p.to_string()),
            test_clock_id: s.test_clock_id.as_ref().map(ToString::to_string),
            pending_plan_change: s.pending_change.as_ref().map(|p| PendingPlanChange {
                plan: PlanSummary::of(&p.plan_id, &p.terms),
                effective_on: p.effective_on,
            }),
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

// ---------------------------------------------------------------------------
// Rules.

/// The terms `plan` bills now (the snapshot a subscription keeps).
pub fn terms_of(plan: &Plan) -> Terms {
    let days = |d: u32| u16::try_from(d).unwrap_or(u16::MAX);
    Terms {
        description: plan.name.clone(),
        amount: plan.amount,
        currency: Currency::Npr,
        interval_unit: plan.interval_unit,
        interval_count: plan.interval_count,
        calendar: plan.calendar,
        trial_days: plan.trial_days,
        grace_period_days: days(plan.grace_period_days),
        reminder_days_before_due: days(plan.reminder_days_before_due),
        overdue_reminder_interval_days: days(plan.overdue_reminder_interval_days),
        overdue_action: match plan.overdue_action {
            plans::OverdueAction::KeepActive => OverdueAction::KeepActive,
            plans::OverdueAction::MarkPastDue => OverdueAction::MarkPastDue,
            plans::OverdueAction::Pause => OverdueAction::Pause,
            plans::OverdueAction::Cancel => OverdueAction::Cancel,
        },
        default_provider: plan.default_provider,
        pricing_model: plan.pricing_model,
    }
}

/// The first instant of the Nepal day `day`.
fn nepal_midnight(day: NaiveDate) -> Timestamp {
    let utc = day.and_time(NaiveTime::MIN) - Duration::minutes(5 * 60 + 45);
    Timestamp::from_datetime(utc.and_utc())
}

/// `startDate`: an RFC 3339 time or a Nepal day; today (Nepal) up to
/// [`MAX_AHEAD_DAYS`] ahead.
pub fn start_of(raw: Option<&str>, now: Timestamp) -> Result<Timestamp, BillingError> {
    let Some(raw) = raw else { return Ok(now) };
    let start = match Timestamp::parse(raw.trim()) {
        Some(t) => t,
        None => match NaiveDate::parse_from_str(raw.trim(), "%Y-%m-%d") {
            Ok(day) => nepal_midnight(day),
            Err(_) => {
                return Err(invalid(
                    "startDate",
                    "startDate must be an RFC 3339 time or a date YYYY-MM-DD",
                ));
            }
        },
    };
    let today = nepal_day(now);
    let day = nepal_day(start);
    if day < today {
        return Err(invalid(
            "startDate",
            format!("startDate must be today ({today}, Nepal) or later"),
        ));
    }
    if day > today + Duration::days(MAX_AHEAD_DAYS) {
        return Err(invalid(
            "startDate",
            format!("startDate must be at most {MAX_AHEAD_DAYS} days ahead"),
        ));
    }
    // A start earlier today is now: nothing is billed backwards.
    Ok(if start < now { now } else { start })
}

/// What a create is asked, checked before any record is read.
struct Asked {
    customer_id: CustomerId,
    plan_id: PlanId,
    reference_id: Option<String>,
    metadata: Map<String, Value>,
    start: Timestamp,
    billing_anchor_day: Option<u8>,
    /// 1 to `changes::MAX_QUANTITY`; more than 1 on a per-unit plan only.
    quantity: u32,
}

fn asked(body: &CreateSubscription, now: Timestamp) -> Result<Asked, LifecycleError> {
    let customer_id = CustomerId::parse(body.customer_id.trim())
        .ok_or_else(|| missing("customer", "customerId", &body.customer_id))?;
    let plan_id = PlanId::parse(body.plan_id.trim())
        .ok_or_else(|| missing("plan", "planId", &body.plan_id))?;
    let quantity = super::changes::check_quantity(body.quantity.unwrap_or(1))?;
    let billing_anchor_day = match body.billing_anchor_day {
        None => None,
        Some(d) => match u8::try_from(d) {
            Ok(d) if (1..=28).contains(&d) => Some(d),
            _ => {
                return Err(invalid(
                    "billingAnchorDay",
                    format!("billingAnchorDay must be 1 to 28, got {d}"),
                )
                .into());
            }
        },
    };
    Ok(Asked {
        customer_id,
        plan_id,
        reference_id: body
            .reference_id
            .as_deref()
            .map(|r| text("referenceId", r, MAX_REFERENCE))
            .transpose()?,
        metadata: metadata(body.metadata.clone().unwrap_or_default())?,
        start: start_of(body.start_date.as_deref(), now)?,
        billing_anchor_day,
        quantity,
    })
}

/// What a create made: the subscription, and its first invoice when it
/// started billing at once.
#[derive(Clone, Debug)]
pub struct Created {
    pub subscription: Subscription,
    pub first_invoice: Option<Issued>,
}

/// Creates a subscription for the tenant's customer on the tenant's
/// active plan. The subscription and its customer's `open_subscriptions`
/// (conditioned on the customer existing) are one transaction, with the
/// request's idempotency `fence`: a retry after a lost answer finds the
/// first one. Starting today without a trial, its first invoice is issued
/// at once ([`issue_first_invoice`]); a retry issues it if the first run
/// stopped before (once per period, whoever asks).
pub async fn create_subscription(
    deps: &Deps,
    tenant: &Tenant,
    body: CreateSubscription,
    fence: Option<&Fence>,
) -> Result<Created, LifecycleError> {
    let mut now = deps.clock.now();
    let mut a = asked(&body, now)?;
    let customer = match customers::get(deps, tenant, &a.customer_id).await {
        Err(BillingError::NotFound { .. }) => {
            return Err(missing("customer", "customerId", a.customer_id.as_str()));
        }
        other => other?,
    };
    if let Some(clock) = &customer.test_clock_id {
        // On a test clock the subscription lives by the clock's time: its
        // start and trial are read at it.
        now = match test_clock::time_of(deps, tenant, clock).await {
            Ok(t) => t,
            Err(ClockTimeError::Deleted(_)) => {
                return Err(invalid(
                    "customerId",
                    format!(
                        "customer {} is on test clock {clock}, which was deleted: use another customer",
                        customer.id
                    ),
                )
                .into());
            }
            Err(e) => return Err(e.into()),
        };
        a = asked(&body, now)?;
    }
    let plan = active_plan(deps, tenant, &a.plan_id).await?;
    let terms = terms_of(&plan);
    super::changes::check_create_quantity(&terms, a.quantity)?;
    let trial_ends_at = trial_end(
        a.start,
        body.trial_ends_at,
        body.trial_days,
        terms.trial_days,
    )
    .map_err(SubscriptionError::from)?;
    let input = NewSubscription {
        customer_id: customer.id.clone(),
        plan_id: plan.id.clone(),
        terms,
        reference_id: a.reference_id,
        metadata: a.metadata,
        start: a.start,
        trial_ends_at,
        billing_anchor_day: a.billing_anchor_day,
        dunning_policy_id: None,
        test_clock_id: customer.test_clock_id.clone(),
    };
    let mut sub = new_subscription(tenant, input, now)?;
    sub.quantity = a.quantity;
    let raise = TxOp::Update {
        key: Customer::key(tenant, &customer.id),
        update: Changes::<Customer>::new()
            .add(Customer::OPEN_SUBSCRIPTIONS, 1)
            .into(),
        cond: Some(Cond::Exists),
    };
    let mut with = vec![raise];
    if let Some(f) = fence {
        with.push(f.op(sub.id.as_str()));
    }
    let sub = match subscription::create_with(deps, &sub, with).await {
        Ok(()) => sub,
        Err(e) => match fence {
            Some(f) if Fence::tripped(&e, 2) => {
                let first = f.resource_id(&*deps.store).await?.unwrap_or_default();
                subscription::get(deps, tenant, &SubscriptionId::stored(first)).await?
            }
            // The customer was deleted since it was read.
            _ if Fence::tripped(&e, 1) => {
                return Err(missing("customer", "customerId", customer.id.as_str()));
            }
            _ => return Err(e.into()),
        },
    };
    let first_invoice = if sub.status == SubscriptionStatus::Incomplete {
        Some(issue_first_invoice(deps, &sub, now).await?)
    } else {
        None
    };
    Ok(Created {
        subscription: as_after(deps, tenant, sub, first_invoice.as_ref()).await?,
        first_invoice,
    })
}

/// The tenant's plan `id` a subscription is created on: 404 naming
/// `planId` when not the tenant's, 400 when inactive.
async fn active_plan(deps: &Deps, tenant: &Tenant, id: &PlanId) -> Result<Plan, LifecycleError> {
    let plan = match plans::get(deps, tenant, id).await {
        Err(BillingError::NotFound { .. }) => {
            return Err(missing("plan", "planId", id.as_str()));
        }
        other => other?,
    };
    if !plan.active {
        return Err(invalid(
            "planId",
            format!("plan {} is inactive: subscribe to an active plan", plan.id),
        )
        .into());
    }
    Ok(plan)
}

/// `sub` as its first invoice left it: one with nothing to pay (credit, a
/// discount) was paid at issue, and that write made it active.
async fn as_after(
    deps: &Deps,
    tenant: &Tenant,
    sub: Subscription,
    first: Option<&Issued>,
) -> Result<Subscription, LifecycleError> {
    if first.is_some_and(|i| i.invoice.status == super::invoice::InvoiceStatus::Paid) {
        return Ok(subscription::get(deps, tenant, &sub.id).await?);
    }
    Ok(sub)
}

/// Issues the invoice of `sub`'s first period (exactly once: a second
/// call answers the same invoice). For a subscription that has just
/// begun billing: created without a trial, or its trial ended.
pub async fn issue_first_invoice(
    deps: &Deps,
    sub: &Subscription,
    now: Timestamp,
) -> Result<Issued, LifecycleError> {
    let Some(period) = sub.period(0) else {
        return Err(invalid(
            "startDate",
            "the subscription's first period is outside the calendar's covered years",
        )
        .into());
    };
    Ok(issue_invoice(deps, sub, period, now).await?)
}

/// The tenant's subscription `id`.
pub async fn get(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<Subscription, LifecycleError> {
    Ok(subscription::get(deps, tenant, id).await?)
}

/// What a list asks for (all optional).
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub status: Option<SubscriptionStatus>,
    pub customer_id: Option<CustomerId>,
    pub plan_id: Option<PlanId>,
}

impl ListFilter {
    /// From the query's `status`, `customerId` and `planId`: a value that
    /// cannot match anything is a 400 naming it.
    pub fn parse(
        status: Option<&str>,
        customer: Option<&str>,
        plan: Option<&str>,
    ) -> Result<Self, BillingError> {
        let status = status
            .map(|raw| {
                SubscriptionStatus::ALL
                    .into_iter()
                    .find(|s| s.as_str() == raw.trim())
                    .ok_or_else(|| {
                        let all: Vec<&str> =
                            SubscriptionStatus::ALL.iter().map(|s| s.as_str()).collect();
                        invalid(
                            "status",
                            format!("status must be one of {}", all.join(", ")),
                        )
                    })
            })
            .transpose()?;
        let customer_id = customer
            .map(|raw| {
                CustomerId::parse(raw.trim())
                    .ok_or_else(|| invalid("customerId", "customerId must be a customer id, cus_…"))
            })
            .transpose()?;
        let plan_id = plan
            .map(|raw| {
                PlanId::parse(raw.trim())
                    .ok_or_else(|| invalid("planId", "planId must be a plan id, bp_…"))
            })
            .transpose()?;
        Ok(ListFilter {
            status,
            customer_id,
            plan_id,
        })
    }

    fn cond(&self) -> Option<Cond> {
        let mut all = Vec::new();
        if let Some(s) = &self.status {
            all.push(Subscription::STATUS.eq(s));
        }
        if let Some(c) = &self.customer_id {
            all.push(Subscription::CUSTOMER_ID.eq(c));
        }
        if let Some(p) = &self.plan_id {
            all.push(Subscription::PLAN_ID.eq(p));
        }
        match all.len() {
            0 => None,
            1 => all.pop(),
            _ => Some(Cond::And(all)),
        }
    }
}

/// A page of the tenant's subscriptions, newest first, and the total
/// matching `filter`. Unfiltered: counted (any page at a bounded cost,
/// the total from the counters). Once the tenant's
/// [`Narrowing::SubscriptionsByFilter`] is covered: by status, plan, both,
/// or customer alone, its narrowing (any page, the same way); a customer
/// with a status or plan reads the customer's own list through, filtered,
/// only when the customer's counters say it holds at most `MAX_WINDOW`
/// subscriptions (else a 400 naming `customerId`), `page * limit` at most
/// `MAX_WINDOW`. A tenant not yet migrated: read through from the start,
/// filtered, `page * limit` at most `MAX_WINDOW`.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    page: PageRequest,
    filter: &ListFilter,
) -> Result<(Vec<Subscription>, u64), LifecycleError> {
    let store = &*deps.store;
    if filter.cond().is_none() {
        let covered = counted::covered(store, tenant, CountedKind::Subscriptions).await?;
        let list = Subscription::counted_list_of(tenant);
        let window = Window::at(page.offset(), page.limit);
        let (found, total, _) = counted::page(store, &list, &window, covered).await?;
        return Ok((found, total));
    }
    let covered =
        counted::covered_narrowing(store, tenant, Narrowing::SubscriptionsByFilter).await?;
    if covered {
        let narrowed = match (&filter.customer_id, filter.status, &filter.plan_id) {
            (None, status, plan) => Some(Subscription::by_filter(tenant, status, plan.as_ref())),
            (Some(customer), None, None) => Some(Subscription::of_customer(tenant, customer)),
            (Some(_), _, _) => None,
        };
        if let Some(list) = narrowed {
            let window = Window::at(page.offset(), page.limit);
            let (found, total, _) = counted::page(store, &list, &window, true).await?;
            return Ok((found, total));
        }
    }
    let page = page.windowed()?;
    let window = Window::at(page.offset(), page.limit);
    let query = match &filter.customer_id {
        Some(customer) if covered => {
            // The customer's list, filtered: bounded by its count.
            let of_customer = Subscription::of_customer(tenant, customer);
            let (_, held, _) =
                counted::page::<Subscription>(store, &of_customer, &Window::at(0, 1), true).await?;
            if held > MAX_WINDOW as u64 {
                return Err(invalid(
                    "customerId",
                    format!(
                        "this customer has {held} subscriptions, more than the {MAX_WINDOW} a list filters through: list them by customerId alone, or by status and planId without it"
                    ),
                )
                .into());
            }
            of_customer.all()
        }
        _ => Query::partition(Subscription::list_partition(tenant))
            .on(Index::Gsi1)
            .backward(),
    };
    let query = match filter.cond() {
        Some(cond) => query.filter(cond),
        None => query,
    };
    Ok(page_of(store, &query, window).await?)
}

/// The time the tenant's subscription `id` lives by: its test clock's
/// (sandbox, the clock `ready`; see [`test_clock::time_of`]), else `now`.
/// Every transition's decisions and timestamps are read at it.
pub async fn time_for(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    now: Timestamp,
) -> Result<Timestamp, LifecycleError> {
    if tenant.mode.is_live() {
        // Clocks are sandbox only.
        return Ok(now);
    }
    let sub = match subscription::get(deps, tenant, id).await {
        Ok(s) => s,
        // Refused by the transition itself, after its body is checked.
        Err(SubscriptionError::NotFound(_)) => return Ok(now),
        Err(e) => return Err(e.into()),
    };
    match &sub.test_clock_id {
        None => Ok(now),
        Some(clock) => Ok(test_clock::time_of(deps, tenant, clock).await?),
    }
}

fn reason(field: &str, raw: Option<&str>) -> Result<Option<String>, BillingError> {
    raw.map(|r| text(field, r, MAX_REASON)).transpose()
}

/// Pauses the subscription (active or past due) until resumed, by the
/// merchant or at `resumeAt`.
pub async fn pause(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: PauseSubscription,
) -> Result<Subscription, LifecycleError> {
    let now = time_for(deps, tenant, id, deps.clock.now()).await?;
    let pause_reason = reason("pauseReason", body.pause_reason.as_deref())?;
    if let Some(at) = body.resume_at
        && (at <= now || at > now.plus(Duration::days(MAX_AHEAD_DAYS)))
    {
        return Err(invalid(
            "resumeAt",
            format!("resumeAt must be after now and within {MAX_AHEAD_DAYS} days"),
        )
        .into());
    }
    let edit = |s: &mut Subscription| {
        s.pause_reason = pause_reason.clone();
        s.resume_at = body.resume_at;
        s.paused_for_nonpayment = false;
    };
    Ok(subscription::apply(deps, tenant, id, SubscriptionEvent::Pause, &edit, now).await?)
}

/// Resumes a paused subscription.
pub async fn resume(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<Subscription, LifecycleError> {
    let now = time_for(deps, tenant, id, deps.clock.now()).await?;
    let edit = |s: &mut Subscription| {
        s.pause_reason = None;
        s.resume_at = None;
        s.paused_for_nonpayment = false;
    };
    Ok(subscription::apply(deps, tenant, id, SubscriptionEvent::Resume, &edit, now).await?)
}

/// Cancels now (the customer's count lowered in the same write), or at
/// the end of the current period (`atPeriodEnd`: a flag the scheduler
/// acts on).
pub async fn cancel(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: CancelSubscription,
) -> Result<Subscription, LifecycleError> {
    let now = time_for(deps, tenant, id, deps.clock.now()).await?;
    let cancel_reason = reason("cancelReason", body.cancel_reason.as_deref())?;
    let at_period_end = body.at_period_end.unwrap_or(false);
    let event = if at_period_end {
        SubscriptionEvent::CancelAtPeriodEnd
    } else {
        SubscriptionEvent::CancelNow
    };
    let edit = |s: &mut Subscription| {
        if at_period_end {
            s.cancel_at_period_end = true;
        } else {
            s.cancelled_at = Some(now);
        }
        s.cancel_reason = cancel_reason.clone();
    };
    Ok(subscription::apply(deps, tenant, id, event, &edit, now).await?)
}

/// What ending a trial made.
#[derive(Clone, Debug)]
pub struct TrialEnded {
    pub subscription: Subscription,
    pub invoice: Issued,
}

/// Ends a trial now: the subscription is active, billing from today (its
/// first period starts today), and the first period's invoice is issued
/// ([`issue_first_invoice`]). The scheduler's trial end does the same
/// at `trialEndsAt`.
pub async fn end_trial(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    now: Timestamp,
) -> Result<TrialEnded, LifecycleError> {
    let now = time_for(deps, tenant, id, now).await?;
    let edit = |s: &mut Subscription| {
        s.trial_ends_at = Some(now);
        s.billing_start = Some(nepal_day(now));
        s.period_index = 0;
        if let Some(first) = s.period(0) {
            super::changes::apply_pending(s, first.start);
        }
    };
    let sub =
        subscription::apply(deps, tenant, id, SubscriptionEvent::TrialEnded, &edit, now).await?;
    let invoice = issue_first_invoice(deps, &sub, now).await?;
    Ok(TrialEnded {
        subscription: sub,
        invoice,
    })
}

/// Moves a trialing subscription's trial end later.
pub async fn extend_trial(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: ExtendTrial,
) -> Result<Subscription, LifecycleError> {
    let now = time_for(deps, tenant, id, deps.clock.now()).await?;
    let decide = |current: &Subscription| -> Result<Subscription, SubscriptionError> {
        let mut changed = current.clone();
        changed.status = subscription::next(current.status, SubscriptionEvent::TrialExtended)?;
        let current_end = current.trial_ends_at.unwrap_or(now);
        changed.trial_ends_at = Some(extended_trial_end(current_end, body.trial_ends_at, now)?);
        Ok(changed)
    };
    Ok(subscription::change(
        deps,
        tenant,
        id,
        Some(SubscriptionEvent::TrialExtended),
        &decide,
        now,
    )
    .await?)
}

/// Sets the subscription's dunning policy (the tenant's, active), or with
/// `None` reverts it to the project's default.
pub async fn set_dunning_policy(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: SetDunningPolicy,
) -> Result<Subscription, LifecycleError> {
    let now = time_for(deps, tenant, id, deps.clock.now()).await?;
    let policy = match body.policy_id {
        None => {
            return Err(invalid("policyId", "policyId is required (null for the default)").into());
        }
        Some(None) => None,
        Some(Some(raw)) => {
            let pid = DunningPolicyId::parse(raw.trim())
                .ok_or_else(|| missing("dunning policy", "policyId", &raw))?;
            let policy = dunning::get_policy(deps, tenant, &pid).await?;
            if !policy.active {
                return Err(
                    invalid("policyId", format!("dunning policy {pid} is inactive")).into(),
                );
            }
            Some(pid)
        }
    };
    let decide = |current: &Subscription| -> Result<Subscription, SubscriptionError> {
        let mut changed = current.clone();
        changed.dunning_policy_id = policy.clone();
        Ok(changed)
    };
    Ok(subscription::change(deps, tenant, id, None, &decide, now).await?)
}

#[cfg(test)]
mod tests;

/// The deep pages of its counted list (a `tests.rs` of its own).
#[cfg(test)]
mod deep {
    mod tests;
}

/// The lists by status, plan and customer (a `tests.rs` of their own).
#[cfg(test)]
mod narrowed {
    mod tests;
}
