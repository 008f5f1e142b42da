//! Dunning policies, the project's one default, and an invoice's dunning
//! state (its attempt history).
//!
//! Storage:
//! - a policy at `DPOL#<id>` / `DPOL`, listed per project and mode on
//!   `gsi1` (`PROJ#<project>#<mode>#DPOL`, by id);
//! - the default pointer at `PROJ#<project>#<mode>` / `DPOL#DEFAULT`,
//!   `policy_id` = the default policy. Making a policy the default writes
//!   the pointer conditioned on the policy it read, the new default's flag
//!   and the old default's flag in one transaction: however many requests
//!   race, exactly one policy is the default, and the pointer and the
//!   `is_default` flags always agree;
//! - an invoice's dunning state at `BINV#<invoice>` / `DUNNING`, appended
//!   to with a version condition.

use serde::{Deserialize, Serialize};

use super::subscription::is_conflict;
use crate::Deps;
use crate::domain::record::{self, Changes, Entry, Record, Window};
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, DunningPolicyId, ProjectId};
use crate::store::{Cond, Key, Query, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// At most this many reminders in a policy (the API reference: 1 to 10).
pub const MAX_INTERVALS: usize = 10;
/// The latest reminder, in days after the invoice went overdue.
pub const MAX_INTERVAL_DAYS: u16 = 365;
pub const MAX_NAME_CHARS: usize = 100;
/// How often a default change re-reads a pointer another request moved.
const DEFAULT_TRIES: usize = 64;

/// The policy's `finalAction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalAction {
    Cancel,
    Pause,
    MarkUncollectible,
}

impl FinalAction {
    pub const ALL: [FinalAction; 3] = [
        FinalAction::Cancel,
        FinalAction::Pause,
        FinalAction::MarkUncollectible,
    ];
}

/// A stored dunning policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DunningPolicy {
    pub id: DunningPolicyId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub name: String,
    /// Days after the invoice went overdue at which each reminder goes,
    /// ascending.
    pub retry_intervals_days: Vec<u16>,
    pub final_action: FinalAction,
    /// Mirrors the project's default pointer (written in the same
    /// transaction).
    pub is_default: bool,
    pub active: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

crate::attrs! { DunningPolicy {
    ID: DunningPolicyId = id,
    NAME: String = name,
    RETRY_INTERVALS_DAYS: Vec<u16> = retry_intervals_days,
    FINAL_ACTION: FinalAction = final_action,
    IS_DEFAULT: bool = is_default,
    ACTIVE: bool = active,
    UPDATED_AT: Timestamp = updated_at,
} }

impl DunningPolicy {
    pub fn key(id: &DunningPolicyId) -> Key {
        Key::new(format!("DPOL#{id}"), "DPOL")
    }

    pub fn list_partition(tenant: &Tenant) -> String {
        format!("PROJ#{}#{}#DPOL", tenant.project, tenant.mode.as_str())
    }
}

impl Record for DunningPolicy {
    fn item_key(&self) -> Key {
        DunningPolicy::key(&self.id)
    }

    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            DunningPolicy::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.to_string(),
        )]
    }
}

/// The project's default policy (stored kind "dunning default"), changed
/// only by a conditioned update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultPolicy {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    pub policy_id: DunningPolicyId,
}

crate::attrs! { DefaultPolicy {
    POLICY_ID: DunningPolicyId = policy_id,
} }

impl DefaultPolicy {
    pub fn key(tenant: &Tenant) -> Key {
        Key::new(
            format!("PROJ#{}#{}", tenant.project, tenant.mode.as_str()),
            "DPOL#DEFAULT",
        )
    }
}

impl Record for DefaultPolicy {
    fn item_key(&self) -> Key {
        Key::new(self.pk.clone(), self.sk.clone())
    }
}

/// Why a policy is refused; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum DunningError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("dunning policy {0} not found")]
    NotFound(DunningPolicyId),
    #[error("billing invoice {0} not found")]
    InvoiceNotFound(BillingInvoiceId),
    #[error("{0}")]
    Conflict(String),
    #[error("the default policy changed too often while being written; retry")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> DunningError {
    DunningError::Invalid {
        field,
        message: message.into(),
    }
}

/// Checks a policy's name and intervals: 1 to 10 reminders, each 1 to
/// 365 days after the invoice went overdue, strictly ascending.
pub fn validate(name: &str, intervals: &[i64]) -> Result<Vec<u16>, DunningError> {
    let chars = name.trim().chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(invalid(
            "name",
            format!("must be 1 to {MAX_NAME_CHARS} characters"),
        ));
    }
    if intervals.is_empty() || intervals.len() > MAX_INTERVALS {
        return Err(invalid(
            "retryIntervalsDays",
            format!("must hold 1 to {MAX_INTERVALS} intervals"),
        ));
    }
    let mut out: Vec<u16> = Vec::with_capacity(intervals.len());
    for &days in intervals {
        let Some(d) = u16::try_from(days)
            .ok()
            .filter(|d| (1..=MAX_INTERVAL_DAYS).contains(d))
        else {
            return Err(invalid(
                "retryIntervalsDays",
                format!("each interval is 1 to {MAX_INTERVAL_DAYS} days, got {days}"),
            ));
        };
        if out.last().is_some_and(|&last| d <= last) {
            return Err(invalid(
                "retryIntervalsDays",
                "intervals must be strictly ascending (days since the invoice went overdue)",
            ));
        }
        out.push(d);
    }
    Ok(out)
}

/// A new policy of the tenant (not yet stored).
pub fn new_policy(
    tenant: &Tenant,
    name: &str,
    intervals: &[i64],
    final_action: FinalAction,
    now: Timestamp,
) -> Result<DunningPolicy, DunningError> {
    Ok(DunningPolicy {
        id: DunningPolicyId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        name: name.trim().to_owned(),
        retry_intervals_days: validate(name, intervals)?,
        final_action,
        is_default: false,
        active: true,
        created_at: now,
        updated_at: now,
    })
}

/// Stores `policy`; with `make_default` it becomes the project's default
/// in the same transaction (the old default's flag cleared).
pub async fn create_policy(
    deps: &Deps,
    policy: &DunningPolicy,
    make_default: bool,
) -> Result<DunningPolicy, DunningError> {
    if !make_default {
        deps.store.transact(vec![policy.put_new()?]).await?;
        return Ok(policy.clone());
    }
    let mut stored = policy.clone();
    stored.is_default = true;
    let put = stored.put_new()?;
    switch_default(deps, &stored, Some(put)).await?;
    Ok(stored)
}

/// The tenant's policy `id`.
pub async fn get_policy(
    deps: &Deps,
    tenant: &Tenant,
    id: &DunningPolicyId,
) -> Result<DunningPolicy, DunningError> {
    match record::get::<DunningPolicy>(&*deps.store, &DunningPolicy::key(id)).await? {
        Some(p) if tenant.owns(p.project_id.as_str(), p.mode) => Ok(p),
        _ => Err(DunningError::NotFound(id.clone())),
    }
}

/// The tenant's policies, oldest first (a project has few).
pub async fn list_policies(
    deps: &Deps,
    tenant: &Tenant,
    window: Window,
) -> Result<(Vec<DunningPolicy>, u64), DunningError> {
    let query =
        Query::partition(DunningPolicy::list_partition(tenant)).on(crate::store::Index::Gsi1);
    Ok(record::page_of(&*deps.store, &query, window).await?)
}

/// The project's default policy id, if any.
pub async fn default_policy(
    deps: &Deps,
    tenant: &Tenant,
) -> Result<Option<DunningPolicyId>, DunningError> {
    Ok(
        record::get::<DefaultPolicy>(&*deps.store, &DefaultPolicy::key(tenant))
            .await?
            .map(|p| p.policy_id),
    )
}

/// Makes the tenant's active policy `id` the default.
pub async fn set_default(
    deps: &Deps,
    tenant: &Tenant,
    id: &DunningPolicyId,
) -> Result<DunningPolicy, DunningError> {
    let policy = get_policy(deps, tenant, id).await?;
    if !policy.active {
        return Err(DunningError::Conflict(
            "an inactive policy cannot be the default; activate it first".into(),
        ));
    }
    switch_default(deps, &policy, None).await?;
    get_policy(deps, tenant, id).await
}

/// Points the default at `policy` (written by `put` when it is new, else
/// flagged by an update), clearing the old default's flag, all in one
/// transaction conditioned on the pointer as read. A pointer another
/// request moved meanwhile is read again.
async fn switch_default(
    deps: &Deps,
    policy: &DunningPolicy,
    put: Option<TxOp>,
) -> Result<(), DunningError> {
    let tenant = Tenant::new(policy.project_id.clone(), policy.mode);
    let pointer = DefaultPolicy::key(&tenant);
    let now = deps.clock.now();
    for attempt in 0..DEFAULT_TRIES {
        let current = default_policy(deps, &tenant).await?;
        if put.is_none() && current.as_ref() == Some(&policy.id) {
            return Ok(());
        }
        let mut ops = vec![TxOp::Update {
            key: pointer.clone(),
            update: Changes::<DefaultPolicy>::new()
                .set(DefaultPolicy::POLICY_ID, &policy.id)
                .into(),
            cond: Some(match &current {
                Some(old) => DefaultPolicy::POLICY_ID.eq(old),
                None => Cond::NotExists,
            }),
        }];
        ops.push(match &put {
            Some(p) => p.clone(),
            None => flag(&policy.id, true, now, Some(DunningPolicy::ACTIVE.eq(&true))),
        });
        if let Some(old) = &current {
            ops.push(flag(old, false, now, None));
        }
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(()),
            Err(StoreError::TransactionCanceled { reasons })
                if matches!(reasons.get(1), Some(TxReason::ConditionFailed)) =>
            {
                return Err(DunningError::Conflict(
                    "the policy changed (deactivated or already stored); read it again".into(),
                ));
            }
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(DunningError::Busy)
}

/// Sets policy `id`'s default flag (the policy must exist; `also`: a
/// further condition).
fn flag(id: &DunningPolicyId, is_default: bool, now: Timestamp, also: Option<Cond>) -> TxOp {
    let mut cond = vec![Cond::Exists];
    cond.extend(also);
    TxOp::Update {
        key: DunningPolicy::key(id),
        update: Changes::<DunningPolicy>::new()
            .set(DunningPolicy::IS_DEFAULT, &is_default)
            .set(DunningPolicy::UPDATED_AT, &now)
            .into(),
        cond: Some(Cond::And(cond)),
    }
}

/// Where an invoice's dunning stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DunningStatus {
    /// Reminders go on at the policy's intervals.
    Active,
    /// The merchant stopped it: no more reminders.
    Stopped,
    /// The last interval passed; the final action was taken.
    Exhausted,
    /// The invoice was paid (or voided).
    Resolved,
}

/// The kind of an attempt: with no card on file, every attempt is a
/// reminder carrying a fresh pay link and QR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptKind {
    Reminder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    Sms,
    Email,
}

/// What came of an attempt (as the SMS and mail pipelines record it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Queued,
    Sent,
    /// Sandbox: logged, never delivered.
    Logged,
    Failed,
    /// Claimed, outcome uncertain: never resent.
    Unknown,
    /// Not sent (no address, quota, quiet hours ended the window).
    Skipped,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub at: Timestamp,
    pub kind: AttemptKind,
    pub channel: Channel,
    pub outcome: AttemptOutcome,
    /// The index of the policy interval it answers (`None`: retry-now).
    pub interval: Option<u16>,
    /// A retry-now's occurrence: its SMS, deferred and sent by a later
    /// run, is recorded once per (occurrence, channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurrence: Option<String>,
}

/// An invoice's dunning state (stored kind "invoice dunning state").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DunningState {
    pub invoice_id: BillingInvoiceId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub policy_id: DunningPolicyId,
    pub status: DunningStatus,
    pub attempts: Vec<Attempt>,
    pub version: i64,
    pub updated_at: Timestamp,
}

crate::attrs! { DunningState {
    STATUS: DunningStatus = status,
    ATTEMPTS: Vec<Attempt> = attempts,
    VERSION: i64 = version,
    UPDATED_AT: Timestamp = updated_at,
} }

impl DunningState {
    pub fn key(invoice: &BillingInvoiceId) -> Key {
        Key::new(format!("BINV#{invoice}"), "DUNNING")
    }
}

impl Record for DunningState {
    fn item_key(&self) -> Key {
        DunningState::key(&self.invoice_id)
    }
}

/// The tenant's dunning state of `invoice`, if dunning started.
pub async fn dunning_state(
    deps: &Deps,
    tenant: &Tenant,
    invoice: &BillingInvoiceId,
) -> Result<Option<DunningState>, DunningError> {
    Ok(
        record::get::<DunningState>(&*deps.store, &DunningState::key(invoice))
            .await?
            .filter(|s| tenant.owns(s.project_id.as_str(), s.mode)),
    )
}

/// Starts dunning `invoice` under `policy` (once: a second start finds
/// the state there and answers it).
pub async fn start_dunning(
    deps: &Deps,
    tenant: &Tenant,
    invoice: &BillingInvoiceId,
    policy: &DunningPolicyId,
) -> Result<DunningState, DunningError> {
    let state = DunningState {
        invoice_id: invoice.clone(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        policy_id: policy.clone(),
        status: DunningStatus::Active,
        attempts: Vec::new(),
        version: 1,
        updated_at: deps.clock.now(),
    };
    match deps.store.transact(vec![state.put_new()?]).await {
        Ok(()) => Ok(state),
        Err(e) if e.is_condition_failure() => dunning_state(deps, tenant, invoice)
            .await?
            .ok_or_else(|| DunningError::Conflict("the dunning state vanished".into())),
        Err(e) => Err(e.into()),
    }
}

/// Appends `attempt` to the state read at `seen` (its version): a writer
/// that raced gets `Conflict` and re-reads, so no attempt is lost or
/// recorded twice. Only an active dunning takes attempts.
pub async fn append_attempt(
    deps: &Deps,
    seen: &DunningState,
    attempt: Attempt,
) -> Result<DunningState, DunningError> {
    if seen.status != DunningStatus::Active {
        return Err(DunningError::Conflict(format!(
            "dunning of {} is {:?}: no more attempts",
            seen.invoice_id, seen.status
        )));
    }
    let mut next = seen.clone();
    next.attempts.push(attempt);
    next.version += 1;
    next.updated_at = deps.clock.now();
    write_state(deps, seen, &next).await
}

/// Appends several `attempts` at once (one reminder's channels), as
/// [`append_attempt`] does one.
pub async fn append_attempts(
    deps: &Deps,
    seen: &DunningState,
    attempts: Vec<Attempt>,
) -> Result<DunningState, DunningError> {
    if seen.status != DunningStatus::Active {
        return Err(DunningError::Conflict(format!(
            "dunning of {} is {:?}: no more attempts",
            seen.invoice_id, seen.status
        )));
    }
    let mut next = seen.clone();
    next.attempts.extend(attempts);
    next.version += 1;
    next.updated_at = deps.clock.now();
    write_state(deps, seen, &next).await
}

/// Moves an invoice's dunning to `status` (stop, exhausted, resolved).
pub async fn set_dunning_status(
    deps: &Deps,
    seen: &DunningState,
    status: DunningStatus,
) -> Result<DunningState, DunningError> {
    let mut next = seen.clone();
    next.status = status;
    next.version += 1;
    next.updated_at = deps.clock.now();
    write_state(deps, seen, &next).await
}

async fn write_state(
    deps: &Deps,
    seen: &DunningState,
    next: &DunningState,
) -> Result<DunningState, DunningError> {
    let op = TxOp::Update {
        key: DunningState::key(&seen.invoice_id),
        update: Changes::<DunningState>::new()
            .set(DunningState::STATUS, &next.status)
            .set(DunningState::ATTEMPTS, &next.attempts)
            .set(DunningState::VERSION, &next.version)
            .set(DunningState::UPDATED_AT, &next.updated_at)
            .into(),
        cond: Some(DunningState::VERSION.eq(&seen.version)),
    };
    match deps.store.transact(vec![op]).await {
        Ok(()) => Ok(next.clone()),
        Err(e) if e.is_condition_failure() || is_conflict(&e) => Err(DunningError::Conflict(
            "the dunning state changed; read it again".into(),
        )),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
