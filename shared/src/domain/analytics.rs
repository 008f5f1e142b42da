//! The analytics overview (`GET /v1/analytics/overview`) from per-day
//! counters (decisions, "Analytics").
//!
//! Counters are kept per project, mode and UTC day, in [`SHARDS`] items
//! per day: `pk = PROJ#<project>#<mode>#STATS`,
//! `sk = DAY#YYYY-MM-DD#<shard>` (the shard two digits, `00`..`07`, so
//! the keys of a day sort together and the days in order). Every write
//! that creates a session or payment or changes its status adds to a
//! shard item of the record's *creation* day, in the same transaction as
//! the change ([`Tally`]), so the figures are exact for "created in the
//! window":
//!
//! - a session created: `sessions_created` +1;
//! - a session's first attempt (it first becomes `initiated`):
//!   `sessions_initiated` +1 (later attempts add nothing);
//! - a session that becomes `success` (once: success is final):
//!   `sessions_paid` +1;
//! - a payment created: `payments_total` +1 and `<provider>_count` +1;
//! - a payment that becomes `success` (from pending, processing or
//!   cancelled; once): `payments_success` +1, `success_volume_paisa`
//!   +amount, `<provider>_success` +1, `<provider>_success_volume` +amount;
//! - a payment that becomes `failed` (a decline, or an attempt the
//!   provider could not start; once: failed is final): `payments_failed` +1.
//!
//! A cancelled payment counts in `total` only (a cancel may still turn
//! into a success, which then counts once); a refunded payment stays
//! counted as a success; `processing` and session expiry add nothing.
//!
//! Why shards: with one item per day, every session and payment of a
//! project written in a burst adds to the same item, so those
//! transactions conflict on it and retry (a hot item). The shard is
//! chosen from a record id with a stable hash ([`shard_of`]): a session's
//! counters from the session id, a payment's from its checkout session
//! id, so a session and its payment written in one transaction add to
//! one item, and a transaction touches no more counter items than before.
//!
//! Reads ([`overview`], [`day_totals`]) query the sort-key range from
//! `DAY#<first day>` to `DAY#<last day>#~` and sum every item in it. That
//! range also holds the items of the former layout (`DAY#YYYY-MM-DD`, no
//! shard), which therefore still count, and any shard number, so
//! [`SHARDS`] may change without moving data. The overview reads
//! O(days × shards) small items with one paginated query.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checkout::{CheckoutSession, SessionStatus};
use super::payments::Payment;
use super::{Mode, Provider};
use crate::keys;
use crate::store::{
    Item, Key, MAX_TX_OPS, PK, Query, SK, SkCond, Store, StoreError, TTL, TxOp, Update,
};
use crate::time::Timestamp;
use serde_json::Value;

/// Days in the window when the request names none.
pub const DEFAULT_DAYS: u32 = 30;
/// The longest window.
pub const MAX_DAYS: u32 = 90;
/// A day's counters are kept this long after the day (then dropped by
/// TTL): well past the longest window and the latest late success.
pub const KEEP_DAYS: i64 = 120;

pub const SESSIONS_CREATED: &str = "sessions_created";
pub const SESSIONS_INITIATED: &str = "sessions_initiated";
pub const SESSIONS_PAID: &str = "sessions_paid";
pub const PAYMENTS_TOTAL: &str = "payments_total";
pub const PAYMENTS_SUCCESS: &str = "payments_success";
pub const PAYMENTS_FAILED: &str = "payments_failed";
pub const SUCCESS_VOLUME: &str = "success_volume_paisa";

fn provider_count(p: Provider) -> String {
    format!("{}_count", p.as_str())
}
fn provider_success(p: Provider) -> String {
    format!("{}_success", p.as_str())
}
fn provider_volume(p: Provider) -> String {
    format!("{}_success_volume", p.as_str())
}

/// The counters partition of a project in a mode.
pub fn stats_partition(project_id: &str, mode: Mode) -> String {
    keys::per_mode(project_id, mode, keys::PerMode::Stats)
}

/// All-time session counters: [`SHARDS`] items per project and mode
/// (`ALL#NN`, the shard of the session's id, like its day item), each
/// counting sessions by stored status, plus `total`; changed in the same
/// transaction as every status change ([`Tally::session_moved`]), so
/// `GET /v1/sessions` reads its `meta.total` from one query of 9 items
/// whatever the number of sessions. `ALL#INIT`, written with the project,
/// says the counters cover every session of the project: a project from
/// before them is counted the old way.
fn totals_key(project_id: &str, mode: Mode, session_id: &str) -> Key {
    Key::new(
        stats_partition(project_id, mode),
        keys::stats_totals(shard_of(session_id)),
    )
}

/// The marker of [`totals_key`]'s counters.
pub fn totals_marker(project_id: &str, mode: Mode) -> Key {
    Key::new(stats_partition(project_id, mode), keys::STATS_TOTALS_MARKER)
}

const TOTAL: &str = "total";

fn status_attr(s: SessionStatus) -> &'static str {
    s.as_str()
}

/// A project's sessions by stored status, from the all-time counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionTotals {
    pub total: i64,
    by_status: Vec<(SessionStatus, i64)>,
}

impl SessionTotals {
    /// Sessions stored with `status`.
    pub fn stored(&self, status: SessionStatus) -> i64 {
        self.by_status
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, n)| *n)
            .sum()
    }
}

/// The project's session counters in `mode`; `None` for a project created
/// before they were kept (no marker).
pub async fn session_totals(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
) -> Result<Option<SessionTotals>, StoreError> {
    let query = Query::partition(stats_partition(project_id, mode))
        .sk(SkCond::BeginsWith(keys::STATS_TOTALS_PREFIX.into()));
    let mut totals = SessionTotals::default();
    let mut marked = false;
    let mut query = query;
    loop {
        let page = store.query(&query).await?;
        for item in &page.items {
            if item.get(SK).and_then(Value::as_str) == Some(keys::STATS_TOTALS_MARKER) {
                marked = true;
                continue;
            }
            let n = |a: &str| item.get(a).and_then(Value::as_i64).unwrap_or(0);
            totals.total += n(TOTAL);
            for s in SessionStatus::ALL {
                let v = n(status_attr(s));
                match totals.by_status.iter_mut().find(|(x, _)| *x == s) {
                    Some((_, t)) => *t += v,
                    None => totals.by_status.push((s, v)),
                }
            }
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => break,
        }
    }
    Ok(marked.then_some(totals))
}

/// The UTC day of `at`, as `YYYY-MM-DD`.
pub fn day_of(at: Timestamp) -> String {
    at.datetime().format("%Y-%m-%d").to_string()
}

/// Counter items per day.
pub const SHARDS: u32 = 8;

/// The shard (`0..SHARDS`) of the record `id`: FNV-1a over its bytes,
/// high half folded into the low (the low bits of FNV-1a alone depend on
/// the low bits of each byte only). Stable across processes and builds.
pub fn shard_of(id: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let folded = (h ^ (h >> 32)) & 0xffff_ffff;
    // `folded` fits in u32 and SHARDS > 0: the remainder is below SHARDS.
    u32::try_from(folded % u64::from(SHARDS)).unwrap_or(0)
}

/// The sort key of the former, unsharded item of `day` (still read), and
/// the least sort key of the day.
fn day_sk(day: &str) -> String {
    keys::stats_day(day)
}

/// The sort key of a shard item of `day`.
fn shard_sk(day: &str, shard: u32) -> String {
    keys::stats_day_shard(day, shard)
}

/// A sort key after every item of `day` (`~` sorts after the digits) and
/// before the next day's.
fn day_end_sk(day: &str) -> String {
    keys::stats_day_end(day)
}

/// The key of the UTC day of `at` without a shard: the item of the former
/// layout, and what [`Tally::added`] takes for "all items of the day".
pub fn day_key(project_id: &str, mode: Mode, at: Timestamp) -> Key {
    Key::new(stats_partition(project_id, mode), day_sk(&day_of(at)))
}

/// The shard item `shard` of the UTC day of `at`.
pub fn shard_key(project_id: &str, mode: Mode, at: Timestamp, shard: u32) -> Key {
    Key::new(
        stats_partition(project_id, mode),
        shard_sk(&day_of(at), shard),
    )
}

/// The counter item that the record `record_id` created at `at` adds to.
pub fn counter_key(project_id: &str, mode: Mode, at: Timestamp, record_id: &str) -> Key {
    shard_key(project_id, mode, at, shard_of(record_id))
}

/// Whether `key` is the item `want`, or `want` is a [`day_key`] and `key`
/// one of that day's items.
fn within(key: &Key, want: &Key) -> bool {
    key.pk == want.pk
        && (key.sk == want.sk
            || (want.sk.matches('#').count() == 1
                && key
                    .sk
                    .strip_prefix(want.sk.as_str())
                    .is_some_and(|rest| rest.starts_with('#'))))
}

/// The id a payment's counters shard on: its checkout session's (so it
/// shares the item of its session), else its own.
fn payment_shard_id(p: &Payment) -> &str {
    if p.checkout_session_id.is_empty() {
        &p.id
    } else {
        &p.checkout_session_id
    }
}

/// Midnight UTC of the day of `at`.
fn start_of_day(at: Timestamp) -> Timestamp {
    let d = at.datetime().date_naive();
    match d.and_hms_opt(0, 0, 0) {
        Some(naive) => Timestamp::from_datetime(naive.and_utc()),
        None => at,
    }
}

/// One day item's adds (one entry per attribute).
type Adds = Vec<(String, i64)>;

/// Counter additions of one transaction, grouped per day item.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// Per item: its ttl (none for the all-time items) and its adds.
    items: Vec<(Key, Option<i64>, Adds)>,
}

impl Tally {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn add(&mut self, record: (&str, Mode, Timestamp, &str), attr: &str, n: i64) {
        let (project_id, mode, created, shard_id) = record;
        let key = counter_key(project_id, mode, created, shard_id);
        let ttl = start_of_day(created)
            .plus(chrono::Duration::days(KEEP_DAYS))
            .unix_seconds();
        self.add_to(key, Some(ttl), attr, n);
    }

    fn add_to(&mut self, key: Key, ttl: Option<i64>, attr: &str, n: i64) {
        let at = match self.items.iter().position(|(k, _, _)| *k == key) {
            Some(i) => i,
            None => {
                self.items.push((key, ttl, Vec::new()));
                self.items.len() - 1
            }
        };
        let adds = &mut self.items[at].2;
        match adds.iter_mut().find(|(a, _)| a == attr) {
            Some((_, v)) => *v += n,
            None => adds.push((attr.to_owned(), n)),
        }
    }

    fn session(&mut self, s: &CheckoutSession, attr: &str) {
        self.add((&s.project_id, s.mode, s.created_at, &s.id), attr, 1);
    }

    fn payment(&mut self, p: &Payment, attr: &str, n: i64) {
        let record = (
            p.project_id.as_str(),
            p.mode,
            p.created_at,
            payment_shard_id(p),
        );
        self.add(record, attr, n);
    }

    /// A session was created (`pending`).
    pub fn session_created(&mut self, s: &CheckoutSession) {
        self.session(s, SESSIONS_CREATED);
        let key = totals_key(&s.project_id, s.mode, &s.id);
        self.add_to(key.clone(), None, TOTAL, 1);
        self.add_to(key, None, status_attr(SessionStatus::Pending), 1);
    }

    /// A session's stored status moved from `from` to `to` (the write is
    /// conditioned on `from`, so the move is counted once).
    pub fn session_moved(&mut self, s: &CheckoutSession, from: SessionStatus, to: SessionStatus) {
        if from == to {
            return;
        }
        let key = totals_key(&s.project_id, s.mode, &s.id);
        self.add_to(key.clone(), None, status_attr(from), -1);
        self.add_to(key, None, status_attr(to), 1);
    }

    /// A session became `initiated` for the first time.
    pub fn session_initiated(&mut self, s: &CheckoutSession) {
        self.session(s, SESSIONS_INITIATED);
    }

    /// A session became `success`.
    pub fn session_paid(&mut self, s: &CheckoutSession) {
        self.session(s, SESSIONS_PAID);
    }

    /// A payment was created.
    pub fn payment_created(&mut self, p: &Payment) {
        self.payment(p, PAYMENTS_TOTAL, 1);
        self.payment(p, &provider_count(p.provider), 1);
    }

    /// A payment became `success`.
    pub fn payment_succeeded(&mut self, p: &Payment) {
        let amount = p.amount.get();
        self.payment(p, PAYMENTS_SUCCESS, 1);
        self.payment(p, SUCCESS_VOLUME, amount);
        self.payment(p, &provider_success(p.provider), 1);
        self.payment(p, &provider_volume(p.provider), amount);
    }

    /// A payment became `failed`.
    pub fn payment_failed(&mut self, p: &Payment) {
        self.payment(p, PAYMENTS_FAILED, 1);
    }

    /// The counter items this tally adds to, in order.
    pub fn keys(&self) -> Vec<&Key> {
        self.items.iter().map(|(k, _, _)| k).collect()
    }

    /// The adds of `attr` on the item `key`, or on all items of the day
    /// when `key` is a [`day_key`] (tests and checks).
    pub fn added(&self, key: &Key, attr: &str) -> i64 {
        self.items
            .iter()
            .filter(|(k, _, _)| within(k, key))
            .flat_map(|(_, _, adds)| adds.iter())
            .filter(|(a, _)| a == attr)
            .map(|(_, v)| *v)
            .sum()
    }

    /// Adds the counters to `ops`: into an update of the same item already
    /// there (a transaction touches each key once), else as a new
    /// unconditional update (an upsert: a missing day starts from 0).
    pub fn apply_to(self, ops: &mut Vec<TxOp>) -> Result<(), StoreError> {
        for (key, ttl, adds) in self.items {
            let existing = ops.iter_mut().find(|op| op.key().as_ref() == Some(&key));
            match existing {
                Some(TxOp::Update { update, .. }) => {
                    for (attr, n) in adds {
                        match update.add.iter_mut().find(|(a, _)| *a == attr) {
                            Some((_, v)) => *v += n,
                            None => update.add.push((attr, n)),
                        }
                    }
                    if let Some(ttl) = ttl {
                        if !update.set.iter().any(|(a, _)| a == TTL) {
                            update.set.push((TTL.to_owned(), ttl.into()));
                        }
                    }
                }
                Some(_) => {
                    return Err(StoreError::Invalid(format!(
                        "counter item {}/{} is already written by this transaction",
                        key.pk, key.sk
                    )));
                }
                None => {
                    let mut update = match ttl {
                        Some(ttl) => Update::new().set(TTL, ttl),
                        None => Update::new(),
                    };
                    update.add = adds;
                    ops.push(TxOp::Update {
                        key,
                        update,
                        cond: None,
                    });
                }
            }
        }
        if ops.len() > MAX_TX_OPS {
            return Err(StoreError::Invalid(format!(
                "a transaction of {} operations with its counters (at most {MAX_TX_OPS})",
                ops.len()
            )));
        }
        Ok(())
    }
}

/// Checks the `days` query parameter: an integer from 1 to [`MAX_DAYS`],
/// [`DEFAULT_DAYS`] when absent. The error is the message for `days`.
pub fn parse_days(raw: Option<&str>) -> Result<u32, String> {
    match raw {
        None => Ok(DEFAULT_DAYS),
        Some(r) => match r.trim().parse::<i64>() {
            Ok(n) if (1..=i64::from(MAX_DAYS)).contains(&n) => {
                u32::try_from(n).map_err(|e| e.to_string())
            }
            _ => Err(format!(
                "days must be an integer from 1 to {MAX_DAYS}, got '{r}'"
            )),
        },
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Window {
    pub days: u32,
    pub start: Timestamp,
    pub end: Timestamp,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PaymentFigures {
    pub total: i64,
    pub success: i64,
    pub failed: i64,
    pub success_rate: f64,
    pub success_volume_paisa: i64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Funnel {
    pub sessions_created: i64,
    pub sessions_initiated: i64,
    pub sessions_paid: i64,
    pub conversion_rate_initiated_to_paid: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProviderFigures {
    pub provider: Provider,
    pub count: i64,
    pub success_count: i64,
    pub success_volume_paisa: i64,
}

/// The answer of `GET /v1/analytics/overview`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Overview {
    pub window: Window,
    pub payments: PaymentFigures,
    pub funnel: Funnel,
    pub by_provider: Vec<ProviderFigures>,
}

fn ratio(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn int(item: &Item, attr: &str) -> i64 {
    item.get(attr).and_then(|v| v.as_i64()).unwrap_or(0)
}

/// The overview of the last `days` UTC days including today's (the window
/// starts at midnight UTC `days - 1` days before `now` and ends `now`).
pub async fn overview(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    days: u32,
    now: Timestamp,
) -> Result<Overview, StoreError> {
    let days = days.clamp(1, MAX_DAYS);
    let start = start_of_day(now).plus(chrono::Duration::days(-(i64::from(days) - 1)));
    let items = day_items(store, project_id, mode, &day_of(start), &day_of(now)).await?;
    Ok(summarize(&items, days, start, now))
}

/// Every counter item from the day `first` to the day `last` (both
/// `YYYY-MM-DD`, inclusive): all shards, and the unsharded items of the
/// former layout; all pages.
async fn day_items(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    first: &str,
    last: &str,
) -> Result<Vec<Item>, StoreError> {
    let mut q = Query::partition(stats_partition(project_id, mode))
        .sk(SkCond::Between(day_sk(first), day_end_sk(last)));
    let mut items = Vec::new();
    loop {
        let page = store.query(&q).await?;
        items.extend(page.items);
        match page.last_key {
            Some(last) => q.start_after = Some(last),
            None => break,
        }
    }
    Ok(items)
}

/// The counters of the UTC day of `at`: the sums over all the day's items
/// (every shard, and an unsharded item of the former layout). Counters
/// never added to are absent; a day without items gives an empty map.
pub async fn day_totals(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    at: Timestamp,
) -> Result<BTreeMap<String, i64>, StoreError> {
    let day = day_of(at);
    let mut totals = BTreeMap::new();
    for item in day_items(store, project_id, mode, &day, &day).await? {
        for (attr, value) in &item {
            if attr == PK || attr == SK || attr == TTL {
                continue;
            }
            if let Some(n) = value.as_i64() {
                *totals.entry(attr.clone()).or_insert(0) += n;
            }
        }
    }
    Ok(totals)
}

/// Sums counter items (any number per day: shards, former unsharded
/// items) into the overview.
pub fn summarize(items: &[Item], days: u32, start: Timestamp, end: Timestamp) -> Overview {
    let sum = |attr: &str| items.iter().map(|i| int(i, attr)).sum::<i64>();
    let total = sum(PAYMENTS_TOTAL);
    let success = sum(PAYMENTS_SUCCESS);
    let initiated = sum(SESSIONS_INITIATED);
    let paid = sum(SESSIONS_PAID);
    let by_provider = Provider::ALL
        .iter()
        .map(|&p| ProviderFigures {
            provider: p,
            count: sum(&provider_count(p)),
            success_count: sum(&provider_success(p)),
            success_volume_paisa: sum(&provider_volume(p)),
        })
        .filter(|f| f.count > 0 || f.success_count > 0)
        .collect();
    Overview {
        window: Window { days, start, end },
        payments: PaymentFigures {
            total,
            success,
            failed: sum(PAYMENTS_FAILED),
            success_rate: ratio(success, total),
            success_volume_paisa: sum(SUCCESS_VOLUME),
        },
        funnel: Funnel {
            sessions_created: sum(SESSIONS_CREATED),
            sessions_initiated: initiated,
            sessions_paid: paid,
            conversion_rate_initiated_to_paid: ratio(paid, initiated),
        },
        by_provider,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::checkout::{self, CreateCheckout, Creator, validate_create};
    use crate::domain::payments::{AttemptInfo, PaymentStatus};
    use crate::money::{Currency, Paisa};
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::at;
    use serde_json::json;

    fn session(now: Timestamp) -> CheckoutSession {
        let req: CreateCheckout = serde_json::from_value(json!({
            "amount": 100_000, "returnUrl": "https://shop.example/thanks"
        }))
        .unwrap();
        let creator = Creator {
            project_id: "proj_1".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: None,
        };
        checkout::new_session(&creator, validate_create(req, Mode::Sandbox).unwrap(), now)
    }

    fn payment(s: &CheckoutSession, provider: Provider, now: Timestamp) -> Payment {
        Payment {
            id: "pay_1".into(),
            project_id: s.project_id.clone(),
            checkout_session_id: s.id.clone(),
            mode: s.mode,
            amount: Paisa::new(100_000).unwrap(),
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            provider,
            status: PaymentStatus::Pending,
            provider_ref: None,
            failure_reason: None,
            metadata: Default::default(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: now,
            updated_at: now,
            double_payment_of: None,
            attempt: AttemptInfo::default(),
            checks: Default::default(),
        }
    }

    #[test]
    fn days_are_1_to_90_defaulting_to_30() {
        assert_eq!(parse_days(None), Ok(30));
        assert_eq!(parse_days(Some("1")), Ok(1));
        assert_eq!(parse_days(Some("90")), Ok(90));
        for bad in ["0", "91", "x", "", "-1", "1.5"] {
            assert!(parse_days(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn counters_go_to_the_creation_day_of_the_record() {
        let created = at("2026-11-20T23:59:00Z");
        let s = session(created);
        let p = payment(&s, Provider::Khalti, at("2026-11-21T00:01:00Z"));
        let mut t = Tally::new();
        t.session_paid(&s);
        t.payment_succeeded(&p);
        let day_s = day_key("proj_1", Mode::Sandbox, created);
        let day_p = day_key("proj_1", Mode::Sandbox, p.created_at);
        assert_eq!(day_s.sk, "DAY#2026-11-20");
        assert_eq!(day_p.sk, "DAY#2026-11-21");
        assert_eq!(day_s.pk, "PROJ#proj_1#sandbox#STATS");
        assert_eq!(t.added(&day_s, SESSIONS_PAID), 1);
        assert_eq!(t.added(&day_p, SESSIONS_PAID), 0);
        assert_eq!(t.added(&day_p, PAYMENTS_SUCCESS), 1);
        assert_eq!(t.added(&day_p, SUCCESS_VOLUME), 100_000);
        assert_eq!(t.added(&day_p, "khalti_success"), 1);
        assert_eq!(t.added(&day_p, "khalti_success_volume"), 100_000);
        // Each on a shard item of its day, the shard of the session.
        assert_eq!(
            t.keys(),
            vec![
                &counter_key("proj_1", Mode::Sandbox, created, &s.id),
                &counter_key("proj_1", Mode::Sandbox, p.created_at, &s.id),
            ]
        );
        let shard = format!("#{:02}", shard_of(&s.id));
        assert_eq!(t.keys()[0].sk, format!("DAY#2026-11-20{shard}"));
        assert_eq!(t.keys()[1].sk, format!("DAY#2026-11-21{shard}"));
    }

    #[test]
    fn each_transition_adds_its_counters() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Esewa, now);
        let day = day_key("proj_1", Mode::Sandbox, now);
        type Case = (&'static str, Tally, Vec<(&'static str, i64)>);
        let cases: Vec<Case> = vec![
            (
                "session created",
                {
                    let mut t = Tally::new();
                    t.session_created(&s);
                    t
                },
                vec![(SESSIONS_CREATED, 1)],
            ),
            (
                "session initiated",
                {
                    let mut t = Tally::new();
                    t.session_initiated(&s);
                    t
                },
                vec![(SESSIONS_INITIATED, 1)],
            ),
            (
                "session paid",
                {
                    let mut t = Tally::new();
                    t.session_paid(&s);
                    t
                },
                vec![(SESSIONS_PAID, 1)],
            ),
            (
                "payment created",
                {
                    let mut t = Tally::new();
                    t.payment_created(&p);
                    t
                },
                vec![(PAYMENTS_TOTAL, 1), ("esewa_count", 1)],
            ),
            (
                "payment succeeded",
                {
                    let mut t = Tally::new();
                    t.payment_succeeded(&p);
                    t
                },
                vec![
                    (PAYMENTS_SUCCESS, 1),
                    (SUCCESS_VOLUME, 100_000),
                    ("esewa_success", 1),
                    ("esewa_success_volume", 100_000),
                ],
            ),
            (
                "payment failed",
                {
                    let mut t = Tally::new();
                    t.payment_failed(&p);
                    t
                },
                vec![(PAYMENTS_FAILED, 1)],
            ),
        ];
        let all = [
            SESSIONS_CREATED,
            SESSIONS_INITIATED,
            SESSIONS_PAID,
            PAYMENTS_TOTAL,
            PAYMENTS_SUCCESS,
            PAYMENTS_FAILED,
            SUCCESS_VOLUME,
            "esewa_count",
            "esewa_success",
            "esewa_success_volume",
        ];
        for (name, tally, want) in cases {
            for attr in all {
                let expected = want
                    .iter()
                    .find(|(a, _)| *a == attr)
                    .map(|(_, v)| *v)
                    .unwrap_or(0);
                assert_eq!(tally.added(&day, attr), expected, "{name}: {attr}");
            }
        }
    }

    #[test]
    fn adds_merge_into_one_op_per_item() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Fonepay, now);
        let mut t = Tally::new();
        t.session_initiated(&s);
        t.payment_created(&p);
        t.session_initiated(&s);
        let day = counter_key("proj_1", Mode::Sandbox, now, &s.id);
        // The transaction already updates the counter item: the adds join it.
        let mut ops = vec![TxOp::Update {
            key: day.clone(),
            update: Update::new().add(PAYMENTS_TOTAL, 2),
            cond: None,
        }];
        t.apply_to(&mut ops).unwrap();
        assert_eq!(ops.len(), 1);
        let TxOp::Update { update, .. } = &ops[0] else {
            panic!("not an update")
        };
        let get = |a: &str| update.add.iter().find(|(x, _)| x == a).map(|(_, v)| *v);
        assert_eq!(get(PAYMENTS_TOTAL), Some(3));
        assert_eq!(get(SESSIONS_INITIATED), Some(2));
        assert_eq!(get("fonepay_count"), Some(1));
        assert!(update.set.iter().any(|(a, _)| a == TTL));

        // A put of the same key cannot take adds: refused, not doubled.
        let mut t = Tally::new();
        t.session_created(&s);
        let mut ops = vec![TxOp::Check {
            key: day,
            cond: crate::store::Cond::Exists,
        }];
        assert!(t.apply_to(&mut ops).is_err());
    }

    #[tokio::test]
    async fn the_overview_reads_the_window_of_days() {
        let store = EmbeddedStore::in_memory().unwrap();
        let now = at("2026-11-22T10:00:00Z");
        let day = |d: i64| now.plus(chrono::Duration::days(-d));
        let mut t = Tally::new();
        for d in [0, 1, 6, 7, 30] {
            let s = session(day(d));
            let p = payment(&s, Provider::Khalti, day(d));
            t.session_created(&s);
            t.session_initiated(&s);
            t.payment_created(&p);
            if d != 1 {
                t.session_paid(&s);
                t.payment_succeeded(&p);
            } else {
                t.payment_failed(&p);
            }
        }
        // Another mode's counters are apart.
        let mut live = session(now);
        live.mode = Mode::Live;
        t.session_created(&live);
        let mut ops = Vec::new();
        t.apply_to(&mut ops).unwrap();
        store.transact(ops).await.unwrap();

        let o = overview(&store, "proj_1", Mode::Sandbox, 7, now)
            .await
            .unwrap();
        assert_eq!(o.window.start, at("2026-11-16T00:00:00Z"));
        assert_eq!(o.window.end, now);
        assert_eq!(o.funnel.sessions_created, 3);
        assert_eq!(o.funnel.sessions_initiated, 3);
        assert_eq!(o.funnel.sessions_paid, 2);
        assert_eq!(o.payments.total, 3);
        assert_eq!(o.payments.success, 2);
        assert_eq!(o.payments.failed, 1);
        assert!((o.payments.success_rate - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(o.payments.success_volume_paisa, 200_000);
        assert_eq!(
            o.by_provider,
            vec![ProviderFigures {
                provider: Provider::Khalti,
                count: 3,
                success_count: 2,
                success_volume_paisa: 200_000,
            }]
        );
        let all = overview(&store, "proj_1", Mode::Sandbox, 90, now)
            .await
            .unwrap();
        assert_eq!(all.funnel.sessions_created, 5);
        let one = overview(&store, "proj_1", Mode::Sandbox, 1, now)
            .await
            .unwrap();
        assert_eq!(one.funnel.sessions_created, 1);
        let live = overview(&store, "proj_1", Mode::Live, 30, now)
            .await
            .unwrap();
        assert_eq!(live.funnel.sessions_created, 1);
        assert_eq!(live.payments.total, 0);
        assert_eq!(live.payments.success_rate, 0.0);
        assert_eq!(live.funnel.conversion_rate_initiated_to_paid, 0.0);
        assert!(live.by_provider.is_empty());
    }

    #[test]
    fn shard_choice_is_stable_and_spreads() {
        // Pinned values: a change of hash would move live counters between
        // shards mid-day (harmless for reads, but not meant to happen).
        assert_eq!(shard_of(""), 1);
        assert_eq!(shard_of("cs_01JD0000000000000000000000"), 0);
        assert_eq!(shard_of("cs_01JD0000000000000000000001"), 7);
        for id in ["cs_a", "cs_b", "pay_1", "some longer id with spaces"] {
            assert_eq!(shard_of(id), shard_of(id), "{id}");
            assert!(shard_of(id) < SHARDS, "{id}");
        }
        let mut hits = [0u32; SHARDS as usize];
        for i in 0..1000 {
            hits[shard_of(&format!("cs_{i}")) as usize] += 1;
        }
        assert!(hits.iter().all(|&n| n > 60), "uneven: {hits:?}");
        // Real (ULID) ids spread too.
        let mut hits = [0u32; SHARDS as usize];
        for _ in 0..1000 {
            let id = crate::ids::new_id(crate::ids::IdKind::CheckoutSession);
            hits[shard_of(&id) as usize] += 1;
        }
        assert!(hits.iter().all(|&n| n > 60), "uneven: {hits:?}");
    }

    #[test]
    fn shard_keys_sort_inside_their_day() {
        let day = "2026-11-22";
        let (lo, hi) = (day_sk(day), day_end_sk(day));
        for shard in 0..SHARDS {
            let sk = shard_sk(day, shard);
            assert!(lo < sk && sk < hi, "{sk}");
        }
        assert!(shard_sk(day, 0) < shard_sk(day, SHARDS - 1));
        // Neighbouring days stay outside.
        assert!(day_end_sk("2026-11-21") < lo);
        assert!(hi < day_sk("2026-11-23"));
        assert!(hi < shard_sk("2026-11-23", 0));
    }

    #[test]
    fn a_session_and_its_payment_land_on_one_item() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Khalti, now);
        let mut t = Tally::new();
        t.session_initiated(&s);
        t.payment_created(&p);
        t.session_paid(&s);
        t.payment_succeeded(&p);
        let key = counter_key("proj_1", Mode::Sandbox, now, &s.id);
        assert_eq!(t.keys(), vec![&key]);
        let mut ops = Vec::new();
        t.apply_to(&mut ops).unwrap();
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].key(), Some(key));
        // Without a session id a payment shards on its own id.
        let mut orphan = payment(&s, Provider::Khalti, now);
        orphan.checkout_session_id = String::new();
        let mut t = Tally::new();
        t.payment_created(&orphan);
        assert_eq!(
            t.keys(),
            vec![&counter_key("proj_1", Mode::Sandbox, now, "pay_1")]
        );
    }

    /// Puts a counter item as the former layout wrote it (no shard).
    async fn put_unsharded(store: &dyn Store, at: Timestamp, counts: &[(&str, i64)]) {
        let key = day_key("proj_1", Mode::Sandbox, at);
        let mut item = Item::new();
        item.insert(PK.into(), key.pk.clone().into());
        item.insert(SK.into(), key.sk.clone().into());
        for (attr, n) in counts {
            item.insert((*attr).into(), (*n).into());
        }
        store.put(item, None).await.unwrap();
    }

    #[tokio::test]
    async fn old_unsharded_items_count_with_the_shards_of_their_day() {
        let store = EmbeddedStore::in_memory().unwrap();
        let now = at("2026-11-22T10:00:00Z");
        let yesterday = now.plus(chrono::Duration::days(-1));
        // Written before the shards: today's and yesterday's item.
        put_unsharded(
            &store,
            now,
            &[
                (SESSIONS_CREATED, 4),
                (PAYMENTS_TOTAL, 3),
                (PAYMENTS_SUCCESS, 2),
                ("khalti_count", 3),
                ("khalti_success", 2),
            ],
        )
        .await;
        put_unsharded(&store, yesterday, &[(SESSIONS_CREATED, 10)]).await;
        // Then sharded adds on the same days.
        let mut t = Tally::new();
        for _ in 0..5 {
            let s = session(now);
            let p = payment(&s, Provider::Khalti, now);
            t.session_created(&s);
            t.payment_created(&p);
            t.payment_succeeded(&p);
        }
        t.session_created(&session(yesterday));
        let mut ops = Vec::new();
        t.apply_to(&mut ops).unwrap();
        store.transact(ops).await.unwrap();

        let today = day_totals(&store, "proj_1", Mode::Sandbox, now)
            .await
            .unwrap();
        assert_eq!(today.get(SESSIONS_CREATED), Some(&9));
        assert_eq!(today.get(PAYMENTS_TOTAL), Some(&8));
        assert_eq!(today.get(PAYMENTS_SUCCESS), Some(&7));
        assert_eq!(today.get(SUCCESS_VOLUME), Some(&500_000));
        assert_eq!(today.get("khalti_count"), Some(&8));
        assert!(!today.contains_key(TTL) && !today.contains_key(PK));
        let before = day_totals(&store, "proj_1", Mode::Sandbox, yesterday)
            .await
            .unwrap();
        assert_eq!(before.get(SESSIONS_CREATED), Some(&11));
        assert_eq!(before.len(), 1);
        let empty = day_totals(&store, "proj_1", Mode::Live, now).await.unwrap();
        assert!(empty.is_empty());

        let one = overview(&store, "proj_1", Mode::Sandbox, 1, now)
            .await
            .unwrap();
        assert_eq!(one.funnel.sessions_created, 9);
        assert_eq!(one.payments.total, 8);
        assert_eq!(one.payments.success, 7);
        assert_eq!(one.payments.success_volume_paisa, 500_000);
        assert_eq!(
            one.by_provider,
            vec![ProviderFigures {
                provider: Provider::Khalti,
                count: 8,
                success_count: 7,
                success_volume_paisa: 500_000,
            }]
        );
        let two = overview(&store, "proj_1", Mode::Sandbox, 2, now)
            .await
            .unwrap();
        assert_eq!(two.funnel.sessions_created, 20);
    }

    /// A store whose queries return at most 2 items a page.
    struct SmallPages {
        inner: EmbeddedStore,
        queries: std::sync::atomic::AtomicU64,
    }

    #[async_trait::async_trait]
    impl Store for SmallPages {
        fn instance(&self) -> u64 {
            self.inner.instance()
        }

        async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
            self.inner.get(key).await
        }
        async fn put(
            &self,
            item: Item,
            cond: Option<crate::store::Cond>,
        ) -> Result<(), StoreError> {
            self.inner.put(item, cond).await
        }
        async fn update(
            &self,
            key: &Key,
            update: Update,
            cond: Option<crate::store::Cond>,
        ) -> Result<Item, StoreError> {
            self.inner.update(key, update, cond).await
        }
        async fn delete(
            &self,
            key: &Key,
            cond: Option<crate::store::Cond>,
        ) -> Result<(), StoreError> {
            self.inner.delete(key, cond).await
        }
        async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
            self.inner.transact(ops).await
        }
        async fn query(&self, query: &Query) -> Result<crate::store::QueryPage, StoreError> {
            self.queries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut q = query.clone();
            q.limit = Some(2);
            self.inner.query(&q).await
        }
        async fn count(&self, query: &Query) -> Result<u64, StoreError> {
            self.inner.count(query).await
        }
    }

    #[tokio::test]
    async fn the_overview_sums_every_shard_of_every_day_across_pages() {
        let store = SmallPages {
            inner: EmbeddedStore::in_memory().unwrap(),
            queries: Default::default(),
        };
        let now = at("2026-11-22T10:00:00Z");
        let day = |d: i64| now.plus(chrono::Duration::days(-d));
        // 40 sessions a day on the window's first and last day and the days
        // just outside it, enough to fill every shard.
        let (mut created, mut paid, mut volume) = (0, 0, 0);
        for d in [0, 1, 5, 6, 7] {
            for i in 0..40 {
                let mut s = session(day(d));
                s.id = format!("cs_{d}_{i}"); // fixed ids: every shard is hit
                let mut p = payment(&s, Provider::Esewa, day(d));
                p.amount = Paisa::new(1_000 + i).unwrap();
                let mut t = Tally::new();
                t.session_created(&s);
                t.payment_created(&p);
                if i % 2 == 0 {
                    t.session_paid(&s);
                    t.payment_succeeded(&p);
                }
                if d != 7 {
                    created += 1;
                    if i % 2 == 0 {
                        paid += 1;
                        volume += 1_000 + i;
                    }
                }
                let mut ops = Vec::new();
                t.apply_to(&mut ops).unwrap();
                store.transact(ops).await.unwrap();
            }
            let shards = store
                .inner
                .query(
                    &Query::partition(stats_partition("proj_1", Mode::Sandbox)).sk(
                        SkCond::Between(day_sk(&day_of(day(d))), day_end_sk(&day_of(day(d)))),
                    ),
                )
                .await
                .unwrap()
                .items
                .len();
            assert_eq!(shards, SHARDS as usize, "day -{d}");
        }
        // Today's figures also with the sums of day_totals.
        let today = day_totals(&store, "proj_1", Mode::Sandbox, now)
            .await
            .unwrap();
        assert_eq!(today.get(SESSIONS_CREATED), Some(&40));

        store.queries.store(0, std::sync::atomic::Ordering::Relaxed);
        let o = overview(&store, "proj_1", Mode::Sandbox, 7, now)
            .await
            .unwrap();
        // 4 days of 8 shards, 2 a page: 16 or 17 pages, all followed.
        assert!(store.queries.load(std::sync::atomic::Ordering::Relaxed) >= 16);
        assert_eq!(o.funnel.sessions_created, created);
        assert_eq!(o.funnel.sessions_paid, paid);
        assert_eq!(o.payments.total, created);
        assert_eq!(o.payments.success, paid);
        assert_eq!(o.payments.success_volume_paisa, volume);
        assert_eq!(o.by_provider[0].success_volume_paisa, volume);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_settles_of_one_project_end_with_exact_totals() {
        use crate::store::TxReason;
        use std::sync::Arc;
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
        let now = at("2026-11-22T10:00:00Z");
        const TASKS: i64 = 16;
        const ROUNDS: i64 = 5;
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS as usize));
        let mut tasks = Vec::new();
        for n in 0..TASKS {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..ROUNDS {
                    // A session settles: its payment succeeds, with the
                    // session's own counters, in one transaction.
                    let s = session(now);
                    let mut p = payment(&s, Provider::Fonepay, now);
                    p.amount = Paisa::new(100 + n).unwrap();
                    loop {
                        let mut t = Tally::new();
                        t.session_paid(&s);
                        t.payment_succeeded(&p);
                        let mut ops = Vec::new();
                        t.apply_to(&mut ops).unwrap();
                        match store.transact(ops).await {
                            Ok(()) => break,
                            Err(StoreError::Unavailable(_)) => {}
                            Err(StoreError::TransactionCanceled { reasons })
                                if reasons.contains(&TxReason::Conflict) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let want_volume: i64 = (0..TASKS).map(|n| (100 + n) * ROUNDS).sum();
        let totals = day_totals(&*store, "proj_1", Mode::Sandbox, now)
            .await
            .unwrap();
        assert_eq!(totals.get(SESSIONS_PAID), Some(&(TASKS * ROUNDS)));
        assert_eq!(totals.get(PAYMENTS_SUCCESS), Some(&(TASKS * ROUNDS)));
        assert_eq!(totals.get(SUCCESS_VOLUME), Some(&want_volume));
        assert_eq!(totals.get("fonepay_success_volume"), Some(&want_volume));
        let o = overview(&*store, "proj_1", Mode::Sandbox, 1, now)
            .await
            .unwrap();
        assert_eq!(o.funnel.sessions_paid, TASKS * ROUNDS);
        assert_eq!(o.payments.success, TASKS * ROUNDS);
        assert_eq!(o.payments.success_volume_paisa, want_volume);
    }
}
