//! The counters behind the analytics overview and `GET /v1/sessions`'s
//! total, written by every change of a session or payment in its own
//! transaction ([`Tally`]); read by `domain::analytics`.
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

use super::{CheckoutSession, SessionStatus};
use crate::domain::payments::Payment;
use crate::domain::{Mode, Provider, Tenant};
use crate::keys;
use crate::store::{Key, MAX_TX_OPS, Store, StoreError, TTL, TxOp, Update};
use crate::time::Timestamp;

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

pub(crate) fn provider_count(p: Provider) -> String {
    format!("{}_count", p.as_str())
}
pub(crate) fn provider_success(p: Provider) -> String {
    format!("{}_success", p.as_str())
}
pub(crate) fn provider_volume(p: Provider) -> String {
    format!("{}_success_volume", p.as_str())
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
    crate::domain::totals::item_key(project_id, mode, session_id)
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
    tenant: &Tenant,
) -> Result<Option<SessionTotals>, StoreError> {
    let all = crate::domain::totals::read(store, &tenant.project, tenant.mode).await?;
    if all.marker.is_none() {
        return Ok(None);
    }
    let by_status = SessionStatus::ALL
        .into_iter()
        .map(|s| (s, all.sum(status_attr(s))))
        .collect();
    Ok(Some(SessionTotals {
        total: all.sum(TOTAL),
        by_status,
    }))
}

/// The UTC day of `at`, as `YYYY-MM-DD`.
pub fn day_of(at: Timestamp) -> String {
    at.datetime().format("%Y-%m-%d").to_string()
}

/// Counter items per day.
pub const SHARDS: u32 = keys::STATS_SHARDS;

/// The shard (`0..SHARDS`) of the record `id` ([`keys::stats_shard`]).
pub fn shard_of(id: &str) -> u32 {
    keys::stats_shard(id)
}

/// The sort key of the former, unsharded item of `day` (still read), and
/// the least sort key of the day.
pub(crate) fn day_sk(day: &str) -> String {
    keys::stats_day(day)
}

/// The sort key of a shard item of `day`.
pub(crate) fn shard_sk(day: &str, shard: u32) -> String {
    keys::stats_day_shard(day, shard)
}

/// A sort key after every item of `day` (`~` sorts after the digits) and
/// before the next day's.
pub(crate) fn day_end_sk(day: &str) -> String {
    keys::stats_day_end(day)
}

/// The key of the UTC day of `at` without a shard: the item of the former
/// layout, and what [`Tally::added`] takes for "all items of the day".
pub fn day_key(project_id: &str, mode: Mode, at: Timestamp) -> Key {
    Key::new(keys::stats_partition(project_id, mode), day_sk(&day_of(at)))
}

/// The shard item `shard` of the UTC day of `at`.
pub fn shard_key(project_id: &str, mode: Mode, at: Timestamp, shard: u32) -> Key {
    Key::new(
        keys::stats_partition(project_id, mode),
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

/// The id a payment's counters shard on ([`Payment::counter_shard_id`]).
fn payment_shard_id(p: &Payment) -> &str {
    p.counter_shard_id()
}

/// Midnight UTC of the day of `at`.
pub(crate) fn start_of_day(at: Timestamp) -> Timestamp {
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

    /// A payment was created (also in the all-time count).
    pub fn payment_created(&mut self, p: &Payment) {
        self.payment(p, PAYMENTS_TOTAL, 1);
        self.payment(p, &provider_count(p.provider), 1);
        let all_time = totals_key(&p.project_id, p.mode, payment_shard_id(p));
        self.add_to(all_time, None, crate::domain::totals::PAYMENTS, 1);
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
