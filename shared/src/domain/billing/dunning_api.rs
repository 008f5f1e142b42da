//! What the dunning routes (`/v1/billing/dunning/...`) call: the bodies
//! as the SDK sends them, the views as it reads them, and the operations
//! (create and update a policy, an invoice's dunning, stop, retry now).
//! The rules (one default per project, attempt history) are in
//! [`super::dunning`].

use super::notice_due::{NoticeChannel, NoticeEntry, NoticeKind, NoticeOutcome, NoticeSchedule};
use chrono::{Days, NaiveDate};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dunning::{
    self, AttemptKind, AttemptOutcome, Channel, DunningError, DunningPolicy, DunningState,
    DunningStatus, FinalAction,
};
use super::invoice::BillingInvoice;
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::record::{self, Changes, Record};
use crate::fields::wire::present;
use crate::ids::{BillingInvoiceId, DunningPolicyId};
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, TxOp};
use crate::time::Timestamp;

/// The code of a dunning refusal the state does not allow (a stopped
/// dunning retried, the default deactivated).
pub const STATE_CONFLICT: &str = "state_conflict";
/// How often a stop or a retry re-reads a state another writer moved.
const TRIES: usize = 16;

impl From<DunningError> for Refusal {
    fn from(err: DunningError) -> Self {
        match err {
            DunningError::Invalid { field, message } => Refusal::invalid(field, message),
            DunningError::NotFound(id) => Refusal::not_found("dunning policy", id.as_str()),
            DunningError::InvoiceNotFound(id) => Refusal::not_found("billing invoice", id.as_str()),
            e @ DunningError::Conflict(_) => Refusal::conflict(STATE_CONFLICT, e.to_string()),
            e @ DunningError::Busy => Refusal::unavailable(&e),
            DunningError::Store(e) => e.into(),
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> DunningError {
    DunningError::Invalid {
        field,
        message: message.into(),
    }
}

fn final_action(raw: &str) -> Result<FinalAction, DunningError> {
    serde_json::from_value(Value::from(raw)).map_err(|_| {
        invalid(
            "finalAction",
            format!("finalAction must be cancel, pause or mark_uncollectible, got {raw:?}"),
        )
    })
}

/// `POST /v1/billing/dunning/policies` (the SDK's `create_policy`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateDunningPolicy)]
pub struct CreatePolicy {
    /// 1 to 100 characters.
    pub name: String,
    /// Days after the invoice went overdue at which each reminder goes:
    /// 1 to 10 of them, each 1 to 365, strictly ascending.
    pub retry_intervals_days: Vec<i64>,
    /// `cancel` (default), `pause` or `mark_uncollectible`: taken after
    /// the last interval.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>, pattern = "^(cancel|pause|mark_uncollectible)$")]
    pub final_action: Option<String>,
    /// Make it the project's one default (the old default stops being it).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub is_default: Option<bool>,
}

/// `PATCH /v1/billing/dunning/policies/{id}`: only the keys sent change.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = UpdateDunningPolicy)]
pub struct UpdatePolicy {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub retry_intervals_days: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>, pattern = "^(cancel|pause|mark_uncollectible)$")]
    pub final_action: Option<String>,
    /// `true` makes it the default; `false` is refused on the default
    /// (make another policy the default instead).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub is_default: Option<bool>,
    /// The default cannot be deactivated.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub active: Option<bool>,
}

/// A dunning policy as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = DunningPolicy)]
pub struct PolicyView {
    /// `dpol_…`.
    pub id: String,
    /// Always `dunning_policy`.
    #[schema(value_type = String)]
    pub object: &'static str,
    pub livemode: bool,
    pub name: String,
    pub retry_intervals_days: Vec<u16>,
    #[schema(value_type = String, pattern = "^(cancel|pause|mark_uncollectible)$")]
    pub final_action: FinalAction,
    pub is_default: bool,
    pub active: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl PolicyView {
    pub fn of(p: &DunningPolicy) -> Self {
        PolicyView {
            id: p.id.to_string(),
            object: "dunning_policy",
            livemode: p.mode.is_live(),
            name: p.name.clone(),
            retry_intervals_days: p.retry_intervals_days.clone(),
            final_action: p.final_action,
            is_default: p.is_default,
            active: p.active,
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

/// One attempt of an invoice's dunning.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = DunningAttempt)]
pub struct AttemptView {
    pub at: Timestamp,
    /// `reminder`: with no card on file an attempt is a reminder carrying
    /// the invoice's pay link.
    #[schema(value_type = String)]
    pub kind: AttemptKind,
    /// `sms` or `email`.
    #[schema(value_type = String)]
    pub channel: Channel,
    /// `queued`, `sent`, `logged` (sandbox), `failed`, `unknown` or
    /// `skipped`.
    #[schema(value_type = String)]
    pub outcome: AttemptOutcome,
    /// The policy interval (from 0) it answers; `null` for a retry-now.
    pub interval: Option<u16>,
}

/// One notice of an invoice (all kinds, each channel), from its schedule.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = InvoiceReminder)]
pub struct ReminderView {
    pub at: Timestamp,
    /// The notice's Nepal day.
    #[schema(value_type = String, format = Date)]
    pub day: NaiveDate,
    /// `due_today`, `before_due`, `overdue` or `dunning`.
    #[schema(value_type = String)]
    pub kind: NoticeKind,
    /// `sms`, `email` or `none`.
    #[schema(value_type = String)]
    pub channel: NoticeChannel,
    /// `queued`, `logged` (sandbox SMS), `suppressed`, `quota_exhausted`,
    /// `skipped`, `failed`, or `deferred` (a retry-now's SMS in quiet
    /// hours: a later entry says how it went).
    #[schema(value_type = String)]
    pub outcome: NoticeOutcome,
    /// The SMS or email id.
    pub message_id: Option<String>,
    /// The dunning policy interval (from 0) a `dunning` reminder answers.
    pub interval: Option<u16>,
}

impl ReminderView {
    pub fn of(e: &NoticeEntry) -> Self {
        ReminderView {
            at: e.at,
            day: e.day,
            kind: e.kind,
            channel: e.channel,
            outcome: e.outcome,
            message_id: e
                .sms_id
                .as_ref()
                .map(ToString::to_string)
                .or_else(|| e.mail_id.as_ref().map(ToString::to_string)),
            interval: e.interval,
        }
    }
}

/// An invoice's dunning as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = InvoiceDunning)]
pub struct InvoiceDunningView {
    pub invoice_id: String,
    /// The invoice's own status.
    #[schema(value_type = String)]
    pub invoice_status: &'static str,
    /// `not_started` (the invoice is not overdue, or no policy applies),
    /// `active`, `stopped`, `exhausted` or `resolved`.
    #[schema(value_type = String, pattern = "^(not_started|active|stopped|exhausted|resolved)$")]
    pub status: &'static str,
    pub policy_id: Option<String>,
    pub attempts: Vec<AttemptView>,
    /// The Nepal day of the policy's next reminder, while active.
    #[schema(value_type = Option<String>, format = Date)]
    pub next_attempt_on: Option<NaiveDate>,
    pub updated_at: Option<Timestamp>,
    /// Every notice of the invoice (due today, before due, overdue,
    /// dunning), each channel with its outcome, oldest first.
    pub reminders: Vec<ReminderView>,
}

pub fn status_word(s: DunningStatus) -> &'static str {
    match s {
        DunningStatus::Active => "active",
        DunningStatus::Stopped => "stopped",
        DunningStatus::Exhausted => "exhausted",
        DunningStatus::Resolved => "resolved",
    }
}

/// The view of `invoice`'s dunning `state` under `policy` (its intervals
/// give the next reminder's day).
pub fn dunning_view(
    invoice: &BillingInvoice,
    state: Option<&DunningState>,
    policy: Option<&DunningPolicy>,
) -> InvoiceDunningView {
    let attempts = state.map_or_else(Vec::new, |s| {
        s.attempts
            .iter()
            .map(|a| AttemptView {
                at: a.at,
                kind: a.kind,
                channel: a.channel,
                outcome: a.outcome,
                interval: a.interval,
            })
            .collect()
    });
    let next_attempt_on = match (state, policy) {
        (Some(s), Some(p)) if s.status == DunningStatus::Active => {
            let done = s.attempts.iter().filter(|a| a.interval.is_some()).count();
            p.retry_intervals_days.get(done).and_then(|d| {
                invoice
                    .overdue_on
                    .checked_add_days(Days::new(u64::from(*d)))
            })
        }
        _ => None,
    };
    InvoiceDunningView {
        invoice_id: invoice.id.to_string(),
        invoice_status: invoice.status.as_str(),
        status: state.map_or("not_started", |s| status_word(s.status)),
        policy_id: state.map(|s| s.policy_id.to_string()),
        attempts,
        next_attempt_on,
        updated_at: state.map(|s| s.updated_at),
        reminders: Vec::new(),
    }
}

/// Creates a policy. With the request's idempotency `fence`, a retry
/// after a lost answer finds the first one. With `isDefault` it then
/// becomes the default (a retry makes it so again: the same answer).
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    body: CreatePolicy,
    fence: Option<&Fence>,
) -> Result<DunningPolicy, DunningError> {
    let action = body
        .final_action
        .as_deref()
        .map(final_action)
        .transpose()?
        .unwrap_or(FinalAction::Cancel);
    let policy = dunning::new_policy(
        tenant,
        &body.name,
        &body.retry_intervals_days,
        action,
        deps.clock.now(),
    )?;
    let put = policy.put_new()?;
    let id = match Fence::put_once(fence, &*deps.store, put, policy.id.as_str()).await? {
        None => policy.id.clone(),
        Some(first) => DunningPolicyId::stored(first),
    };
    if body.is_default == Some(true) {
        return dunning::set_default(deps, tenant, &id).await;
    }
    dunning::get_policy(deps, tenant, &id).await
}

/// Changes a policy: its fields in one write (deactivating only a policy
/// that is not the default, as read by the write's condition), then, with
/// `isDefault: true`, the default switched to it.
pub async fn update(
    deps: &Deps,
    tenant: &Tenant,
    id: &DunningPolicyId,
    body: UpdatePolicy,
) -> Result<DunningPolicy, DunningError> {
    let current = dunning::get_policy(deps, tenant, id).await?;
    let name = body.name.as_deref().unwrap_or(&current.name);
    let intervals: Vec<i64> = match &body.retry_intervals_days {
        Some(v) => v.clone(),
        None => current
            .retry_intervals_days
            .iter()
            .map(|d| i64::from(*d))
            .collect(),
    };
    let intervals = dunning::validate(name, &intervals)?;
    let action = body.final_action.as_deref().map(final_action).transpose()?;
    if body.is_default == Some(true) && body.active == Some(false) {
        return Err(invalid("active", "the default policy must be active"));
    }
    if body.is_default == Some(false) && current.is_default {
        return Err(DunningError::Conflict(
            "a project always has one default policy: make another policy the default instead"
                .into(),
        ));
    }
    let mut changes = Changes::<DunningPolicy>::new()
        .set(DunningPolicy::NAME, &name.trim().to_owned())
        .set(DunningPolicy::RETRY_INTERVALS_DAYS, &intervals)
        .set(DunningPolicy::UPDATED_AT, &deps.clock.now());
    if let Some(a) = action {
        changes = changes.set(DunningPolicy::FINAL_ACTION, &a);
    }
    let mut cond = vec![Cond::Exists];
    if let Some(active) = body.active {
        changes = changes.set(DunningPolicy::ACTIVE, &active);
        if !active {
            cond.push(DunningPolicy::IS_DEFAULT.eq(&false));
        }
    }
    let op = TxOp::Update {
        key: DunningPolicy::key(id),
        update: changes.into(),
        cond: Some(Cond::And(cond)),
    };
    match deps.store.transact(vec![op]).await {
        Ok(()) => {}
        Err(e) if e.is_condition_failure() => {
            return Err(DunningError::Conflict(
                "the default policy cannot be deactivated: make another policy the default first"
                    .into(),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    if body.is_default == Some(true) {
        return dunning::set_default(deps, tenant, id).await;
    }
    dunning::get_policy(deps, tenant, id).await
}

/// The tenant's billing invoice `id` (for the dunning routes).
async fn invoice(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
) -> Result<BillingInvoice, DunningError> {
    match record::get::<BillingInvoice>(&*deps.store, &BillingInvoice::key(id)).await? {
        Some(i) if tenant.owns(i.project_id.as_str(), i.mode) => Ok(i),
        _ => Err(DunningError::InvoiceNotFound(id.clone())),
    }
}

/// The dunning of the tenant's invoice `id`, with its attempt history.
pub async fn invoice_dunning(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
) -> Result<InvoiceDunningView, DunningError> {
    let inv = invoice(deps, tenant, id).await?;
    let state = dunning::dunning_state(deps, tenant, id).await?;
    let policy = match &state {
        Some(s) => {
            record::get::<DunningPolicy>(&*deps.store, &DunningPolicy::key(&s.policy_id)).await?
        }
        None => None,
    };
    let mut view = dunning_view(&inv, state.as_ref(), policy.as_ref());
    if let Some(notices) =
        record::get::<NoticeSchedule>(&*deps.store, &NoticeSchedule::invoice_key(id)).await?
    {
        view.reminders = notices.history.iter().map(ReminderView::of).collect();
    }
    Ok(view)
}

fn not_started(id: &BillingInvoiceId) -> DunningError {
    DunningError::Conflict(format!(
        "dunning of {id} has not started: it starts when the invoice becomes overdue"
    ))
}

/// Stops the dunning of the tenant's invoice `id`: no more reminders. A
/// stopped dunning answers as it is; an exhausted or resolved one is
/// refused.
pub async fn stop(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
) -> Result<InvoiceDunningView, DunningError> {
    invoice(deps, tenant, id).await?;
    for _ in 0..TRIES {
        let state = dunning::dunning_state(deps, tenant, id)
            .await?
            .ok_or_else(|| not_started(id))?;
        match state.status {
            DunningStatus::Stopped => return invoice_dunning(deps, tenant, id).await,
            DunningStatus::Active => {}
            other => {
                return Err(DunningError::Conflict(format!(
                    "dunning of {id} is {}: nothing to stop",
                    status_word(other)
                )));
            }
        }
        match dunning::set_dunning_status(deps, &state, DunningStatus::Stopped).await {
            Ok(_) => return invoice_dunning(deps, tenant, id).await,
            Err(DunningError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(DunningError::Busy)
}

// Retry-now sends a real reminder: `notices::retry_now` (billing never
// imports the notices).

#[cfg(test)]
mod tests;
