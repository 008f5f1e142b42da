//! Metered usage (issue 40 part 6): the events a merchant reports for a
//! subscription, stored append-only, and the seal that closes them for
//! an invoice. No HTTP.
//!
//! **Records.** Every event is one item of the subscription's usage
//! partition (`SUB#<sub>#USAGE`), sort key `R#<Nepal day>#<timestamp>#<id>`:
//! a write never reads or changes another one (no hot counter), and a
//! range of days is one ranged read. An event with an `idempotency_key`
//! also writes `K#<key>` (the record again), in the same transaction,
//! where none is: a repeated event finds the first and answers it.
//!
//! **The seal.** `SEAL` holds `through`: usage of the Nepal days before it
//! has been (or is being) invoiced. Every usage write is a transaction
//! with a condition check `through <= the event's day` (or no seal), so an
//! event either lands before the seal moves, and the issuer (which reads
//! the records after sealing) counts it, or is refused: never lost, never
//! counted in a later period's invoice.
//!
//! **Totals.** Within one billing period, in timestamp order (ties by
//! id): `increment` adds its quantity; `set` makes the period's total its
//! quantity as of its timestamp (later increments add to it, a later
//! `set` replaces it). [`period_total`].

use std::collections::HashMap;

use chrono::{Duration, NaiveDate};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::calendar::nepal_day;
use super::customers::{BillingError, invalid};
use super::invoice::{BillingInvoiceError, InvoiceLine, LineKind};
use super::lifecycle::LifecycleError;
use super::period::Period;
use super::subscription::{self, Subscription, SubscriptionError, SubscriptionStatus};
use super::terms::PricingModel;
use super::test_clock;
use crate::Deps;
use crate::domain::record::{self, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::{ProjectId, SubscriptionId, UsageRecordId};
use crate::refusal::Refusal;
use crate::store::{Cond, Key, MAX_TX_OPS, Query, SkCond, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// Most events in one request (our batch extension).
pub const MAX_BATCH: usize = 1000;
/// Largest quantity of one event.
pub const MAX_QUANTITY: u64 = 1_000_000_000;
/// Longest body `idempotency_key`.
pub const MAX_KEY: usize = 200;
/// How far ahead of now an event's `timestamp` may be (clock skew).
pub const FUTURE_SKEW: Duration = Duration::minutes(5);
/// `limit` of the raw records list: default and most.
pub const DEFAULT_RECORDS: usize = 50;
pub const MAX_RECORDS: usize = 100;
/// Tries of one chunk of events against contention.
const TRIES: usize = 12;

/// What an event does to its period's total.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageAction {
    Increment,
    Set,
}

/// One usage event, as stored (append-only: never changed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub id: UsageRecordId,
    pub subscription_id: SubscriptionId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub quantity: u64,
    pub action: UsageAction,
    pub timestamp: Timestamp,
    /// The Nepal day of `timestamp`.
    pub day: NaiveDate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub created_at: Timestamp,
}

/// The usage partition of a subscription.
pub fn partition(sub: &SubscriptionId) -> String {
    format!("SUB#{sub}#USAGE")
}

const RECORD_PREFIX: &str = "R#";

impl Record for UsageRecord {
    fn item_key(&self) -> Key {
        Key::new(
            partition(&self.subscription_id),
            format!("{RECORD_PREFIX}{}#{}#{}", self.day, self.timestamp, self.id),
        )
    }
}

/// The claim of a body `idempotency_key`: the record it made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageKeyClaim {
    pub subscription_id: SubscriptionId,
    pub idempotency_key: String,
    pub record: UsageRecord,
}

impl UsageKeyClaim {
    pub fn key(sub: &SubscriptionId, key: &str) -> Key {
        Key::new(partition(sub), format!("K#{key}"))
    }
}

impl Record for UsageKeyClaim {
    fn item_key(&self) -> Key {
        UsageKeyClaim::key(&self.subscription_id, &self.idempotency_key)
    }
}

/// How far a subscription's usage is closed: the days before `through`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageSeal {
    pub subscription_id: SubscriptionId,
    /// Usage of days before it is invoiced (or being invoiced).
    pub through: NaiveDate,
    /// The previous `through` (`None`: the first seal): the last seal
    /// closed the days `from <= d < through`.
    pub from: Option<NaiveDate>,
    pub sealed_at: Timestamp,
}

crate::attrs! { UsageSeal {
    THROUGH: NaiveDate = through,
    FROM: Option<NaiveDate> = from,
} }

impl UsageSeal {
    pub fn key(sub: &SubscriptionId) -> Key {
        Key::new(partition(sub), "SEAL")
    }
}

impl Record for UsageSeal {
    fn item_key(&self) -> Key {
        UsageSeal::key(&self.subscription_id)
    }
}

/// Why a usage request is refused.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error(transparent)]
    Billing(#[from] BillingError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(
        "a subscription that is {0} takes no usage: usage is recorded while it is billed (incomplete, active or past_due)"
    )]
    NotAccepting(&'static str),
    #[error(
        "subscription {0} is not on a metered plan: usage is reported only for plans with pricingModel metered"
    )]
    NotMetered(SubscriptionId),
    #[error(
        "the usage of the period {start} to {end} (Nepal days, end exclusive) has been invoiced: usage for it is closed; report it with a timestamp in the current period"
    )]
    PeriodClosed { start: NaiveDate, end: NaiveDate },
    #[error("the usage was being written by too many requests at once; retry")]
    Busy,
    #[error(transparent)]
    Overflow(#[from] UsageOverflow),
}

impl From<StoreError> for UsageError {
    fn from(e: StoreError) -> Self {
        UsageError::Billing(BillingError::Store(e))
    }
}

impl From<SubscriptionError> for UsageError {
    fn from(e: SubscriptionError) -> Self {
        UsageError::Lifecycle(e.into())
    }
}

impl From<UsageError> for Refusal {
    fn from(err: UsageError) -> Self {
        match err {
            UsageError::Billing(e) => e.into(),
            UsageError::Lifecycle(e) => e.into(),
            e @ UsageError::NotAccepting(_) => {
                Refusal::conflict("subscription_state_conflict", e.to_string())
            }
            e @ UsageError::NotMetered(_) => {
                Refusal::conflict("subscription_not_metered", e.to_string())
            }
            UsageError::PeriodClosed { start, end } => {
                let message = UsageError::PeriodClosed { start, end }.to_string();
                Refusal::conflict("usage_period_closed", message).with_extra(
                    "period",
                    serde_json::json!({"start": start.to_string(), "end": end.to_string()}),
                )
            }
            e @ UsageError::Busy => Refusal::unavailable(&e),
            e @ UsageError::Overflow(_) => Refusal::conflict("usage_overflow", e.to_string()),
        }
    }
}

/// `POST /v1/billing/subscriptions/{id}/usage`: one event (the SDK's
/// `report_usage`), or our batch `{events: [...]}` of up to
/// [`MAX_BATCH`].
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReportUsage {
    /// Units used: an integer from 0 to 1,000,000,000.
    #[serde(default)]
    #[schema(value_type = Option<i64>)]
    pub quantity: Option<Value>,
    /// `increment` (the default) or `set`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub action: Option<Value>,
    /// When it was used: RFC 3339; default now. It must
    /// fall in an open period: not before billing began, at most 5
    /// minutes ahead, not in an invoiced period.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub timestamp: Option<Value>,
    /// The event's own key: a repeated event with the same key counts
    /// once and answers the first record (also `idempotencyKey`).
    #[serde(default, rename = "idempotency_key", alias = "idempotencyKey")]
    #[schema(value_type = Option<String>)]
    pub idempotency_key: Option<Value>,
    /// Ours: up to 1,000 events, each `{quantity, action, timestamp,
    /// idempotency_key}`; the answer has one result per event, in order.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub events: Option<Vec<Value>>,
}

/// One event, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageEvent {
    pub quantity: u64,
    pub action: UsageAction,
    pub timestamp: Option<Timestamp>,
    pub idempotency_key: Option<String>,
}

/// The events of a body: one, or the batch (`events[i].field` named on
/// a refusal). Nothing is stored when one is refused.
pub fn events_of(body: ReportUsage) -> Result<(Vec<UsageEvent>, bool), BillingError> {
    let Some(events) = body.events else {
        return Ok((vec![event_of("", &body)?], false));
    };
    let single = body.quantity.is_some()
        || body.action.is_some()
        || body.timestamp.is_some()
        || body.idempotency_key.is_some();
    if single {
        return Err(invalid(
            "events",
            "send either one event or events, not both",
        ));
    }
    if events.is_empty() || events.len() > MAX_BATCH {
        return Err(invalid(
            "events",
            format!("events must hold 1 to {MAX_BATCH} events"),
        ));
    }
    let mut out = Vec::with_capacity(events.len());
    for (i, raw) in events.into_iter().enumerate() {
        let prefix = format!("events[{i}].");
        let one: ReportUsage = match raw {
            Value::Object(_) => serde_json::from_value(raw)
                .map_err(|e| invalid(format!("events[{i}]"), e.to_string()))?,
            _ => return Err(invalid(format!("events[{i}]"), "an event is an object")),
        };
        if one.events.is_some() {
            return Err(invalid(format!("{prefix}events"), "events do not nest"));
        }
        out.push(event_of(&prefix, &one)?);
    }
    Ok((out, true))
}

fn event_of(prefix: &str, body: &ReportUsage) -> Result<UsageEvent, BillingError> {
    let field = |name: &str| format!("{prefix}{name}");
    let quantity = match &body.quantity {
        Some(Value::Number(n)) => n.as_u64().filter(|q| *q <= MAX_QUANTITY),
        _ => None,
    }
    .ok_or_else(|| {
        invalid(
            field("quantity"),
            format!("quantity must be an integer from 0 to {MAX_QUANTITY}"),
        )
    })?;
    let action = match &body.action {
        None | Some(Value::Null) => UsageAction::Increment,
        Some(Value::String(s)) if s == "increment" => UsageAction::Increment,
        Some(Value::String(s)) if s == "set" => UsageAction::Set,
        Some(other) => {
            return Err(invalid(
                field("action"),
                format!("action must be increment or set, got {other}"),
            ));
        }
    };
    let timestamp = match &body.timestamp {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            Timestamp::parse(s.trim())
                .ok_or_else(|| invalid(field("timestamp"), "timestamp must be an RFC 3339 time"))?,
        ),
        Some(_) => {
            return Err(invalid(
                field("timestamp"),
                "timestamp must be an RFC 3339 time",
            ));
        }
    };
    let idempotency_key = match &body.idempotency_key {
        None | Some(Value::Null) => None,
        Some(Value::String(s))
            if !s.is_empty()
                && s.trim() == s
                && s.chars().count() <= MAX_KEY
                && !s.chars().any(char::is_control) =>
        {
            Some(s.clone())
        }
        Some(_) => {
            return Err(invalid(
                field("idempotency_key"),
                format!(
                    "idempotency_key must be 1 to {MAX_KEY} characters, without surrounding whitespace"
                ),
            ));
        }
    };
    Ok(UsageEvent {
        quantity,
        action,
        timestamp,
        idempotency_key,
    })
}

/// What became of one event.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Recorded now.
    Created(UsageRecord),
    /// Its `idempotency_key` was seen before: the first record.
    Duplicate(UsageRecord),
    /// Its period is closed ([`UsageError::PeriodClosed`]).
    Closed { start: NaiveDate, end: NaiveDate },
}

/// The time the subscription lives by (its test clock's, else now).
pub async fn time_of(deps: &Deps, sub: &Subscription) -> Result<Timestamp, UsageError> {
    match &sub.test_clock_id {
        Some(clock) if !sub.mode.is_live() => Ok(test_clock::time_of(deps, &sub.tenant(), clock)
            .await
            .map_err(LifecycleError::from)?),
        _ => Ok(deps.clock.now()),
    }
}

/// Whether a subscription of this status takes usage.
fn accepting(status: SubscriptionStatus) -> bool {
    use SubscriptionStatus as S;
    matches!(status, S::Incomplete | S::Active | S::PastDue)
}

/// Whether the subscription bills usage.
pub fn metered(sub: &Subscription) -> bool {
    sub.terms.pricing_model == PricingModel::Metered
}

/// The billing period of `sub` holding `day` (searched from the current
/// period back; `None` before billing began).
pub fn period_of(sub: &Subscription, day: NaiveDate) -> Option<Period> {
    let top = sub.period_index.saturating_add(1);
    (0..=top)
        .rev()
        .filter_map(|i| sub.period(i))
        .find(|p| p.start <= day && day < p.end_exclusive)
}

/// The closed period an event of `day` falls in, as a refusal names it.
fn closed(sub: &Subscription, day: NaiveDate, seal: &UsageSeal) -> Outcome {
    match period_of(sub, day) {
        Some(p) => Outcome::Closed {
            start: p.start,
            end: p.end_exclusive,
        },
        None => Outcome::Closed {
            start: seal.from.unwrap_or(day),
            end: seal.through,
        },
    }
}

/// Records `events` for the tenant's subscription `id`: one outcome per
/// event, in order. A bad event refuses them all before anything is
/// written; a closed period refuses only its events.
pub async fn report(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    events: Vec<UsageEvent>,
) -> Result<Vec<Outcome>, UsageError> {
    let batch = events.len() > 1;
    report_as(deps, tenant, id, events, batch).await
}

/// [`report`], the events sent as a batch (`events`, refusals naming
/// `events[i].field`, even for a batch of one) or as one event.
pub async fn report_as(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    events: Vec<UsageEvent>,
    batch: bool,
) -> Result<Vec<Outcome>, UsageError> {
    let sub = subscription::get(deps, tenant, id).await?;
    if !metered(&sub) {
        return Err(UsageError::NotMetered(sub.id));
    }
    if !accepting(sub.status) {
        return Err(UsageError::NotAccepting(sub.status.as_str()));
    }
    let now = time_of(deps, &sub).await?;
    let records = records_of(&sub, &events, batch, now, deps.clock.now())?;
    write_all(deps, &sub, records).await
}

/// The records `events` make (checked against the subscription's time).
fn records_of(
    sub: &Subscription,
    events: &[UsageEvent],
    batch: bool,
    now: Timestamp,
    created_at: Timestamp,
) -> Result<Vec<UsageRecord>, UsageError> {
    let Some(start) = sub.billing_start else {
        return Err(UsageError::NotAccepting(sub.status.as_str()));
    };
    let mut out = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let field = if batch {
            format!("events[{i}].timestamp")
        } else {
            "timestamp".to_owned()
        };
        let at = e.timestamp.unwrap_or(now);
        // On a test clock, time moves in jumps: any time of the current
        // period is accepted, as if reported when it came.
        let on_clock_in_period = sub.test_clock_id.is_some()
            && sub
                .current_period()
                .is_some_and(|p| nepal_day(at) < p.end_exclusive);
        if at > now.plus(FUTURE_SKEW) && !on_clock_in_period {
            return Err(invalid(
                field,
                format!("timestamp {at} is in the future: at most 5 minutes after {now}"),
            )
            .into());
        }
        let day = nepal_day(at);
        if day < start {
            return Err(invalid(
                field,
                format!("timestamp {at} is before the subscription's billing began ({start})"),
            )
            .into());
        }
        out.push(UsageRecord {
            id: UsageRecordId::new(),
            subscription_id: sub.id.clone(),
            project_id: sub.project_id.clone(),
            mode: sub.mode,
            quantity: e.quantity,
            action: e.action,
            timestamp: at,
            day,
            idempotency_key: e.idempotency_key.clone(),
            created_at,
        });
    }
    Ok(out)
}

/// Writes the records in transactions of up to [`MAX_TX_OPS`] operations
/// (the seal check and one or two puts per event), all at once; a
/// repeated key within the batch answers the first.
async fn write_all(
    deps: &Deps,
    sub: &Subscription,
    records: Vec<UsageRecord>,
) -> Result<Vec<Outcome>, UsageError> {
    let n = records.len();
    let mut first_of_key: HashMap<String, usize> = HashMap::new();
    let mut repeats: Vec<(usize, usize)> = Vec::new();
    let mut chunks: Vec<Vec<(usize, UsageRecord)>> = vec![Vec::new()];
    let mut ops_in_chunk = 1;
    for (i, r) in records.into_iter().enumerate() {
        if let Some(k) = &r.idempotency_key {
            if let Some(first) = first_of_key.get(k) {
                repeats.push((i, *first));
                continue;
            }
            first_of_key.insert(k.clone(), i);
        }
        let ops = if r.idempotency_key.is_some() { 2 } else { 1 };
        if ops_in_chunk + ops > MAX_TX_OPS {
            chunks.push(Vec::new());
            ops_in_chunk = 1;
        }
        ops_in_chunk += ops;
        if let Some(last) = chunks.last_mut() {
            last.push((i, r));
        }
    }
    let written =
        futures::future::join_all(chunks.into_iter().map(|c| write_chunk(deps, sub, c))).await;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    for chunk in written {
        for (i, outcome) in chunk? {
            outcomes[i] = Some(outcome);
        }
    }
    for (i, first) in repeats {
        outcomes[i] = match outcomes[first].clone() {
            Some(Outcome::Created(r) | Outcome::Duplicate(r)) => Some(Outcome::Duplicate(r)),
            other => other,
        };
    }
    outcomes
        .into_iter()
        .map(|o| o.ok_or(UsageError::Busy))
        .collect()
}

/// Writes one chunk: the seal check and the puts in one transaction,
/// again without what a cancelled one refused (a closed period, a key
/// already used), until all are written.
async fn write_chunk(
    deps: &Deps,
    sub: &Subscription,
    mut pending: Vec<(usize, UsageRecord)>,
) -> Result<Vec<(usize, Outcome)>, UsageError> {
    let store = &*deps.store;
    let mut done = Vec::with_capacity(pending.len());
    for attempt in 0..TRIES {
        let Some(min_day) = pending.iter().map(|(_, r)| r.day).min() else {
            return Ok(done);
        };
        let mut ops = vec![TxOp::Check {
            key: UsageSeal::key(&sub.id),
            cond: Cond::Or(vec![
                UsageSeal::THROUGH.missing(),
                UsageSeal::THROUGH.le(&min_day),
            ]),
        }];
        // For each op after the check: the index in `pending` it writes.
        let mut owner = Vec::with_capacity(pending.len() * 2);
        for (at, (_, r)) in pending.iter().enumerate() {
            ops.push(r.put_new()?);
            owner.push((at, false));
            if let Some(k) = &r.idempotency_key {
                let claim = UsageKeyClaim {
                    subscription_id: sub.id.clone(),
                    idempotency_key: k.clone(),
                    record: r.clone(),
                };
                ops.push(claim.put_new()?);
                owner.push((at, true));
            }
        }
        let reasons = match store.transact(ops).await {
            Ok(()) => {
                done.extend(pending.into_iter().map(|(i, r)| (i, Outcome::Created(r))));
                return Ok(done);
            }
            Err(StoreError::TransactionCanceled { reasons }) => reasons,
            Err(e) if e.is_condition_failure() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut drop = vec![false; pending.len()];
        if matches!(reasons.first(), Some(TxReason::ConditionFailed))
            && let Some(seal) = record::get::<UsageSeal>(store, &UsageSeal::key(&sub.id)).await?
        {
            for (at, (i, r)) in pending.iter().enumerate() {
                if r.day < seal.through {
                    done.push((*i, closed(sub, r.day, &seal)));
                    drop[at] = true;
                }
            }
        }
        for (op, reason) in reasons.iter().enumerate().skip(1) {
            let Some(&(at, is_claim)) = owner.get(op - 1) else {
                continue;
            };
            if !(is_claim && matches!(reason, TxReason::ConditionFailed)) || drop[at] {
                continue;
            }
            let (i, r) = &pending[at];
            let key = r.idempotency_key.as_deref().unwrap_or_default();
            let claimed =
                record::get::<UsageKeyClaim>(store, &UsageKeyClaim::key(&sub.id, key)).await?;
            if let Some(c) = claimed {
                done.push((*i, Outcome::Duplicate(c.record)));
                drop[at] = true;
            }
        }
        let before = pending.len();
        pending = pending
            .into_iter()
            .zip(drop)
            .filter_map(|(p, d)| (!d).then_some(p))
            .collect();
        if pending.len() == before {
            // A conflict, or a seal that moved and back: try again.
            crate::store::contention_backoff(attempt).await;
        }
    }
    if pending.is_empty() {
        Ok(done)
    } else {
        Err(UsageError::Busy)
    }
}

/// A running total of usage records, fed in the order of their keys
/// (`R#<day>#<timestamp>#<id>`: by timestamp, ties by id, since a day is
/// its timestamp's Nepal day and timestamps have one fixed width): each
/// billing period's total by [`UsageAction`]'s rule, summed over the
/// periods, with no record kept. Checked: a total past `u64::MAX` is
/// [`Tally::total`] `None`, never a clamped number.
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    /// Records counted.
    pub records: u64,
    /// The day of the first record counted.
    pub first_day: Option<NaiveDate>,
    /// The total of the periods before the open one (`None`: overflowed).
    done: Option<u64>,
    /// The period being summed (start, end exclusive) and its total so
    /// far (`None`: overflowed; a later `set` replaces it).
    open: Option<(NaiveDate, NaiveDate, Option<u64>)>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            records: 0,
            first_day: None,
            done: Some(0),
            open: None,
        }
    }
}

impl Tally {
    /// Counts `r`, the next record in key order, in its period of `sub`
    /// (a day before billing began is a period of its own).
    pub fn add(&mut self, sub: &Subscription, r: &UsageRecord) {
        let open = match self.open {
            Some((start, end, total)) if start <= r.day && r.day < end => (start, end, total),
            previous => {
                if let Some((_, _, total)) = previous {
                    self.done = self.done.zip(total).and_then(|(d, t)| d.checked_add(t));
                }
                match period_of(sub, r.day) {
                    Some(p) => (p.start, p.end_exclusive, Some(0)),
                    None => (r.day, r.day.succ_opt().unwrap_or(r.day), Some(0)),
                }
            }
        };
        let (start, end, total) = open;
        let total = match r.action {
            UsageAction::Increment => total.and_then(|t| t.checked_add(r.quantity)),
            UsageAction::Set => Some(r.quantity),
        };
        self.open = Some((start, end, total));
        self.records += 1;
        self.first_day.get_or_insert(r.day);
    }

    /// The sum of the periods' totals; `None` when it passes `u64::MAX`.
    pub fn total(&self) -> Option<u64> {
        match self.open {
            Some((_, _, open)) => self.done.zip(open).and_then(|(d, t)| d.checked_add(t)),
            None => self.done,
        }
    }
}

/// The records in key order: by day, timestamp, then id.
fn key_order(records: &[UsageRecord]) -> Vec<&UsageRecord> {
    let mut sorted: Vec<&UsageRecord> = records.iter().collect();
    sorted.sort_by(|a, b| (a.day, a.timestamp, &a.id).cmp(&(b.day, b.timestamp, &b.id)));
    sorted
}

/// The total of one period's records ([`UsageAction`]'s rule): in
/// timestamp order (ties by id), `set` replaces the total, `increment`
/// adds to it. `None`: past `u64::MAX`.
pub fn period_total(records: &[UsageRecord]) -> Option<u64> {
    // Not `try_fold`: a later `set` replaces an overflowed total.
    let mut total = Some(0u64);
    for r in key_order(records) {
        total = match r.action {
            UsageAction::Increment => total.and_then(|t| t.checked_add(r.quantity)),
            UsageAction::Set => Some(r.quantity),
        };
    }
    total
}

/// The total of records over several periods: each period's
/// [`period_total`], summed (a `set` resets only its own period).
pub fn total_by_period(sub: &Subscription, records: &[UsageRecord]) -> Option<u64> {
    let mut tally = Tally::default();
    for r in key_order(records) {
        tally.add(sub, r);
    }
    tally.total()
}

/// Records one read of [`tally_between`] asks the store for.
pub const READ_PAGE: usize = 1000;

/// The query of the records of the Nepal days `from <= d < to` (`from`
/// `None`: from the first), in key order.
fn days_query(sub: &SubscriptionId, from: Option<NaiveDate>, to: NaiveDate) -> Query {
    let low = from.map_or_else(
        || RECORD_PREFIX.to_owned(),
        |d| format!("{RECORD_PREFIX}{d}"),
    );
    // Every record key of day `to` is longer than `R#<to>`: excluded.
    Query::partition(partition(sub)).sk(SkCond::Between(low, format!("{RECORD_PREFIX}{to}")))
}

/// The [`Tally`] of the records of the Nepal days `from <= d < to`,
/// read [`READ_PAGE`] at a time and counted as they come: memory is one
/// page whatever the count, store calls one a page. With `cap`, at most
/// that many records are counted, and `true` says more were left.
pub async fn tally_between(
    deps: &Deps,
    sub: &Subscription,
    from: Option<NaiveDate>,
    to: NaiveDate,
    cap: Option<u64>,
) -> Result<(Tally, bool), StoreError> {
    let mut query = days_query(&sub.id, from, to);
    let mut tally = Tally::default();
    loop {
        let room = cap.map_or(READ_PAGE as u64, |c| {
            c.saturating_sub(tally.records)
                .saturating_add(1)
                .min(READ_PAGE as u64)
        });
        query.limit = Some(usize::try_from(room).unwrap_or(READ_PAGE));
        let page = deps.store.query(&query).await?;
        for item in page.items {
            if cap.is_some_and(|c| tally.records >= c) {
                return Ok((tally, true));
            }
            tally.add(sub, &from_item(item)?);
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => return Ok((tally, false)),
        }
    }
}

/// Every record of the Nepal days `from <= d < to`, oldest first,
/// collected: for tests that check which records a read saw (requests
/// and invoices count with [`tally_between`]).
#[cfg(any(test, feature = "testkit"))]
pub async fn records_between(
    deps: &Deps,
    sub: &SubscriptionId,
    from: Option<NaiveDate>,
    to: NaiveDate,
) -> Result<Vec<UsageRecord>, StoreError> {
    crate::store::query_window(&*deps.store, &days_query(sub, from, to), 0, usize::MAX)
        .await?
        .into_iter()
        .map(from_item)
        .collect()
}

/// What a seal closed for one invoice: the days `from <= d < to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed {
    pub from: Option<NaiveDate>,
    pub to: NaiveDate,
}

/// Closes the subscription's usage before `through` (the start of the
/// period being invoiced) and answers the days this invoice bills: from
/// the previous seal. Sealing again to the same day (a retried issue)
/// answers the same days; `None` when a later seal exists (that usage
/// was billed already).
pub async fn seal(
    deps: &Deps,
    sub: &SubscriptionId,
    through: NaiveDate,
    now: Timestamp,
) -> Result<Option<Sealed>, StoreError> {
    let store = &*deps.store;
    let key = UsageSeal::key(sub);
    for attempt in 0..TRIES {
        let current = record::get::<UsageSeal>(store, &key).await?;
        let cond = match &current {
            Some(s) if s.through == through => {
                return Ok(Some(Sealed {
                    from: s.from,
                    to: through,
                }));
            }
            Some(s) if s.through > through => return Ok(None),
            Some(s) => UsageSeal::THROUGH.eq(&s.through),
            None => Cond::NotExists,
        };
        let from = current.map(|s| s.through);
        let next = UsageSeal {
            subscription_id: sub.clone(),
            through,
            from,
            sealed_at: now,
        };
        match store.put(next.to_item()?, Some(cond)).await {
            Ok(()) => return Ok(Some(Sealed { from, to: through })),
            Err(e) if e.is_condition_failure() => crate::store::contention_backoff(attempt).await,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(
        "the usage seal changed too often".into(),
    ))
}

/// The usage line of the invoice of `sub` for `period` (the invoice
/// hook, `adjust::gather`): usage is billed in arrears, so the invoice of
/// a period seals the usage before the period's start and bills what the
/// previous seal left open (the previous period, and any not billed
/// since: a paused one). The records are read after the seal: an event
/// either landed before it and is counted here, or is refused. `None`: not
/// metered, or nothing to bill (no records, or billed already).
pub async fn usage_line(
    deps: &Deps,
    sub: &Subscription,
    period: Period,
    now: Timestamp,
) -> Result<Option<InvoiceLine>, BillingInvoiceError> {
    if !metered(sub) {
        return Ok(None);
    }
    let Some(sealed) = seal(deps, &sub.id, period.start, now).await? else {
        return Ok(None);
    };
    line_of(deps, sub, sealed).await
}

/// The usage line the invoice of `sub` for `period` would have if it were
/// issued now, reading only (`invoice.upcoming`'s draft): the records
/// from the seal to the period's start, the seal left where it is.
pub async fn draft_line(
    deps: &Deps,
    sub: &Subscription,
    period: Period,
) -> Result<Option<InvoiceLine>, BillingInvoiceError> {
    if !metered(sub) {
        return Ok(None);
    }
    let sealed = match record::get::<UsageSeal>(&*deps.store, &UsageSeal::key(&sub.id)).await? {
        Some(s) if s.through > period.start => return Ok(None),
        Some(s) if s.through == period.start => Sealed {
            from: s.from,
            to: period.start,
        },
        current => Sealed {
            from: current.map(|s| s.through),
            to: period.start,
        },
    };
    line_of(deps, sub, sealed).await
}

/// The usage line of the days `sealed` closed (`None`: no records): the
/// records counted page by page ([`tally_between`]), exact for any
/// count. A total or amount that overflows fails the invoice (logged as
/// an error for the on-call, nothing issued), never billed clamped.
async fn line_of(
    deps: &Deps,
    sub: &Subscription,
    sealed: Sealed,
) -> Result<Option<InvoiceLine>, BillingInvoiceError> {
    let (tally, _) = tally_between(deps, sub, sealed.from, sealed.to, None).await?;
    let Some(first) = tally.first_day else {
        return Ok(None);
    };
    let unit = sub.terms.amount;
    let priced = tally
        .total()
        .ok_or(UsageOverflow {
            quantity: None,
            unit,
        })
        .and_then(|total| priced(total, unit));
    let (quantity, amount) = match priced {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(
                subscription = %sub.id,
                records = tally.records,
                error = %e,
                "usage overflows its invoice: the invoice is not issued"
            );
            return Err(BillingInvoiceError::Overflow);
        }
    };
    let start = sealed
        .from
        .or(sub.billing_start)
        .unwrap_or(first)
        .min(first);
    Ok(Some(InvoiceLine {
        kind: LineKind::Usage,
        description: format!("{} (usage)", sub.terms.description),
        quantity,
        amount,
        period_start: start,
        period_end: sealed.to,
    }))
}

/// Usage that one invoice line cannot bill: its total passes `u64::MAX`
/// (`quantity` `None`), or its amount passes `i64::MAX` paisa.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the period's usage, {} at {unit} paisa a unit, is more than one invoice bills (at most 18446744073709551615 units and 9223372036854775807 paisa): its invoice is not issued",
    match quantity { Some(q) => format!("{q} units"), None => "more than 18446744073709551615 units".to_owned() }
)]
pub struct UsageOverflow {
    pub quantity: Option<u64>,
    pub unit: i64,
}

/// The line quantity and amount (paisa) of `total` units at `unit`
/// paisa each, checked: never a clamped number.
pub fn priced(total: u64, unit: i64) -> Result<(u64, i64), UsageOverflow> {
    let overflow = UsageOverflow {
        quantity: Some(total),
        unit,
    };
    // i64 × u64 always fits i128.
    let amount = i64::try_from(i128::from(unit) * i128::from(total)).map_err(|_| overflow)?;
    Ok((total, amount))
}

/// Most records the dashboard reads of one period (a page's bound).
pub const PERIOD_READ_CAP: usize = 20_000;
const _: () = assert!((PERIOD_READ_CAP as u128) * (MAX_QUANTITY as u128) < u64::MAX as u128);

/// One period's usage, as the dashboard charts it.
#[derive(Clone, Debug, PartialEq)]
pub struct PeriodUsage {
    pub period: Period,
    /// The period's total ([`period_total`]) of the records read.
    pub quantity: u64,
    pub records: usize,
    /// More than [`PERIOD_READ_CAP`] records: the total is of the first.
    pub partial: bool,
}

/// The usage of the subscription's last `count` periods up to the
/// current one, oldest first (none before billing begins).
pub async fn recent_periods(
    deps: &Deps,
    sub: &Subscription,
    count: u32,
) -> Result<Vec<PeriodUsage>, StoreError> {
    let first = sub.period_index.saturating_sub(count.saturating_sub(1));
    let mut out = Vec::new();
    for p in (first..=sub.period_index).filter_map(|i| sub.period(i)) {
        let (tally, partial) = tally_between(
            deps,
            sub,
            Some(p.start),
            p.end_exclusive,
            Some(PERIOD_READ_CAP as u64),
        )
        .await?;
        out.push(PeriodUsage {
            period: p,
            // Below the cap a total cannot overflow (asserted above): a
            // chart, never a bill.
            quantity: tally.total().unwrap_or(u64::MAX),
            records: usize::try_from(tally.records).unwrap_or(PERIOD_READ_CAP),
            partial,
        });
    }
    Ok(out)
}

/// The current period's usage (the SDK's `get_usage_summary`).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageSummary {
    pub object: &'static str,
    pub subscription_id: String,
    /// The period's total ([`period_total`]).
    pub quantity: u64,
    pub record_count: u64,
    /// Always `sum` (with `set` as described in docs/billing.md).
    pub aggregation_method: &'static str,
    /// The current period (Nepal days, end exclusive); null before
    /// billing begins.
    #[schema(value_type = Option<String>, format = Date)]
    pub period_start: Option<NaiveDate>,
    #[schema(value_type = Option<String>, format = Date)]
    pub period_end: Option<NaiveDate>,
    /// The plan's price per unit, paisa.
    pub unit_amount: i64,
    /// `quantity * unitAmount`: what the next invoice will bill for it
    /// (a total one invoice cannot bill is refused, 409 `usage_overflow`).
    pub amount: i64,
    pub currency: crate::money::Currency,
}

/// The summary of the tenant's subscription `id`'s current period.
pub async fn summary(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<UsageSummary, UsageError> {
    let sub = subscription::get(deps, tenant, id).await?;
    let period = sub.current_period();
    let tally = match period {
        Some(p) => {
            tally_between(deps, &sub, Some(p.start), p.end_exclusive, None)
                .await?
                .0
        }
        None => Tally::default(),
    };
    let unit = sub.terms.amount;
    let quantity = tally.total().ok_or(UsageOverflow {
        quantity: None,
        unit,
    })?;
    let (_, amount) = priced(quantity, unit)?;
    Ok(UsageSummary {
        object: "usage_summary",
        subscription_id: sub.id.to_string(),
        quantity,
        record_count: tally.records,
        aggregation_method: "sum",
        period_start: period.map(|p| p.start),
        period_end: period.map(|p| p.end_exclusive),
        unit_amount: unit,
        amount,
        currency: sub.terms.currency,
    })
}

/// A usage record as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageRecordView {
    /// `ur_…`.
    pub id: String,
    pub object: &'static str,
    pub livemode: bool,
    pub subscription_id: String,
    pub quantity: u64,
    pub action: UsageAction,
    pub timestamp: Timestamp,
    /// The Nepal day of `timestamp`.
    #[schema(value_type = String, format = Date)]
    pub day: NaiveDate,
    pub idempotency_key: Option<String>,
    pub created_at: Timestamp,
}

impl UsageRecordView {
    pub fn of(r: &UsageRecord) -> Self {
        UsageRecordView {
            id: r.id.to_string(),
            object: "usage_record",
            livemode: r.mode.is_live(),
            subscription_id: r.subscription_id.to_string(),
            quantity: r.quantity,
            action: r.action,
            timestamp: r.timestamp,
            day: r.day,
            idempotency_key: r.idempotency_key.clone(),
            created_at: r.created_at,
        }
    }
}

/// `limit` of the records list: 1 to [`MAX_RECORDS`], default
/// [`DEFAULT_RECORDS`].
pub fn records_limit(raw: Option<&str>) -> Result<usize, BillingError> {
    match raw {
        None => Ok(DEFAULT_RECORDS),
        Some(raw) => raw
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_RECORDS).contains(n))
            .ok_or_else(|| {
                invalid(
                    "limit",
                    format!("limit must be an integer from 1 to {MAX_RECORDS}, got {raw:?}"),
                )
            }),
    }
}

/// The newest `limit` records of the tenant's subscription `id` (by
/// timestamp), and whether more exist.
pub async fn list_records(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    limit: usize,
) -> Result<(Vec<UsageRecord>, bool), UsageError> {
    let sub = subscription::get(deps, tenant, id).await?;
    let query = Query::partition(partition(&sub.id))
        .sk(SkCond::BeginsWith(RECORD_PREFIX.to_owned()))
        .backward();
    let items = crate::store::query_window(&*deps.store, &query, 0, limit + 1).await?;
    let more = items.len() > limit;
    let records = items
        .into_iter()
        .take(limit)
        .map(from_item)
        .collect::<Result<Vec<UsageRecord>, _>>()?;
    Ok((records, more))
}

#[cfg(test)]
pub(crate) mod tests;
