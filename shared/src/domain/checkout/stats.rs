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

use serde::{Deserialize, Serialize};

use super::{CheckoutSession, SessionStatus};
use crate::domain::payments::Payment;
use crate::domain::record::{Attr, Changes, Record};
use crate::domain::totals::{AllTimeCounts, Counter};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::ProjectId;
use crate::keys;
use crate::store::{Key, MAX_TX_OPS, Store, StoreError, TxOp, Update};
use crate::time::Timestamp;

/// A day's counters are kept this long after the day (then dropped by
/// TTL): well past the longest window and the latest late success.
pub const KEEP_DAYS: i64 = 120;

/// One counter item of a day (`DAY#YYYY-MM-DD#NN`, or the former
/// unsharded `DAY#YYYY-MM-DD`), "daily counters": each counter is absent
/// until first added to. Its key is no function of its counts: the record
/// holds it (`pk`, `sk`, read from the item, written as its key).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayCounters {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    /// Epoch seconds after which the item may go ([`KEEP_DAYS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub sessions_created: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub sessions_initiated: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub sessions_paid: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub payments_total: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub payments_success: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub payments_failed: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub success_volume_paisa: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub esewa_count: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub esewa_success: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub esewa_success_volume: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub khalti_count: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub khalti_success: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub khalti_success_volume: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub fonepay_count: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub fonepay_success: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub fonepay_success_volume: Counter,
}

crate::attrs! { DayCounters {
    TTL: Option<i64> = ttl,
    SESSIONS_CREATED: Counter = sessions_created,
    SESSIONS_INITIATED: Counter = sessions_initiated,
    SESSIONS_PAID: Counter = sessions_paid,
    PAYMENTS_TOTAL: Counter = payments_total,
    PAYMENTS_SUCCESS: Counter = payments_success,
    PAYMENTS_FAILED: Counter = payments_failed,
    SUCCESS_VOLUME_PAISA: Counter = success_volume_paisa,
    ESEWA_COUNT: Counter = esewa_count,
    ESEWA_SUCCESS: Counter = esewa_success,
    ESEWA_SUCCESS_VOLUME: Counter = esewa_success_volume,
    KHALTI_COUNT: Counter = khalti_count,
    KHALTI_SUCCESS: Counter = khalti_success,
    KHALTI_SUCCESS_VOLUME: Counter = khalti_success_volume,
    FONEPAY_COUNT: Counter = fonepay_count,
    FONEPAY_SUCCESS: Counter = fonepay_success,
    FONEPAY_SUCCESS_VOLUME: Counter = fonepay_success_volume,
} }

impl Record for DayCounters {
    fn item_key(&self) -> Key {
        Key::new(self.pk.as_str(), self.sk.as_str())
    }
}

/// A provider's counters of one day item (or of a sum of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProviderCounts {
    /// Payments created.
    pub count: Counter,
    /// Payments that succeeded.
    pub success: Counter,
    /// Their volume, in paisa.
    pub success_volume: Counter,
}

impl DayCounters {
    /// `<provider>_count`: the provider's payments created.
    pub fn count_of(p: Provider) -> Attr<DayCounters, Counter> {
        match p {
            Provider::Esewa => DayCounters::ESEWA_COUNT,
            Provider::Khalti => DayCounters::KHALTI_COUNT,
            Provider::Fonepay => DayCounters::FONEPAY_COUNT,
        }
    }

    /// `<provider>_success`: the provider's payments that succeeded.
    pub fn success_of(p: Provider) -> Attr<DayCounters, Counter> {
        match p {
            Provider::Esewa => DayCounters::ESEWA_SUCCESS,
            Provider::Khalti => DayCounters::KHALTI_SUCCESS,
            Provider::Fonepay => DayCounters::FONEPAY_SUCCESS,
        }
    }

    /// `<provider>_success_volume`: their volume, in paisa.
    pub fn success_volume_of(p: Provider) -> Attr<DayCounters, Counter> {
        match p {
            Provider::Esewa => DayCounters::ESEWA_SUCCESS_VOLUME,
            Provider::Khalti => DayCounters::KHALTI_SUCCESS_VOLUME,
            Provider::Fonepay => DayCounters::FONEPAY_SUCCESS_VOLUME,
        }
    }

    /// The counters of provider `p` on this item.
    pub fn provider(&self, p: Provider) -> ProviderCounts {
        let (count, success, success_volume) = match p {
            Provider::Esewa => (
                self.esewa_count,
                self.esewa_success,
                self.esewa_success_volume,
            ),
            Provider::Khalti => (
                self.khalti_count,
                self.khalti_success,
                self.khalti_success_volume,
            ),
            Provider::Fonepay => (
                self.fonepay_count,
                self.fonepay_success,
                self.fonepay_success_volume,
            ),
        };
        ProviderCounts {
            count,
            success,
            success_volume,
        }
    }

    /// Every counter of the item, with its attribute.
    pub fn counters(&self) -> [(Attr<DayCounters, Counter>, Counter); 16] {
        [
            (DayCounters::SESSIONS_CREATED, self.sessions_created),
            (DayCounters::SESSIONS_INITIATED, self.sessions_initiated),
            (DayCounters::SESSIONS_PAID, self.sessions_paid),
            (DayCounters::PAYMENTS_TOTAL, self.payments_total),
            (DayCounters::PAYMENTS_SUCCESS, self.payments_success),
            (DayCounters::PAYMENTS_FAILED, self.payments_failed),
            (DayCounters::SUCCESS_VOLUME_PAISA, self.success_volume_paisa),
            (DayCounters::ESEWA_COUNT, self.esewa_count),
            (DayCounters::ESEWA_SUCCESS, self.esewa_success),
            (DayCounters::ESEWA_SUCCESS_VOLUME, self.esewa_success_volume),
            (DayCounters::KHALTI_COUNT, self.khalti_count),
            (DayCounters::KHALTI_SUCCESS, self.khalti_success),
            (
                DayCounters::KHALTI_SUCCESS_VOLUME,
                self.khalti_success_volume,
            ),
            (DayCounters::FONEPAY_COUNT, self.fonepay_count),
            (DayCounters::FONEPAY_SUCCESS, self.fonepay_success),
            (
                DayCounters::FONEPAY_SUCCESS_VOLUME,
                self.fonepay_success_volume,
            ),
        ]
    }
}

/// All-time session counters: [`SHARDS`] items per project and mode
/// (`ALL#NN`, the shard of the session's id, like its day item), each
/// counting sessions by stored status, plus `total`; changed in the same
/// transaction as every status change ([`Tally::session_moved`]), so
/// `GET /v1/sessions` reads its `meta.total` from one query of 9 items
/// whatever the number of sessions. `ALL#INIT`, written with the project,
/// says the counters cover every session of the project: a project from
/// before them is counted the old way.
fn totals_key(tenant: &Tenant, record: &str) -> Key {
    crate::domain::totals::item_key(tenant, record)
}

/// The all-time counter of sessions stored with `s`.
fn status_attr(s: SessionStatus) -> Attr<AllTimeCounts, Counter> {
    match s {
        SessionStatus::Pending => AllTimeCounts::PENDING,
        SessionStatus::Initiated => AllTimeCounts::INITIATED,
        SessionStatus::Success => AllTimeCounts::SUCCESS,
        SessionStatus::Failed => AllTimeCounts::FAILED,
        SessionStatus::Expired => AllTimeCounts::EXPIRED,
    }
}

/// What `c` counts of sessions stored with `s`.
fn status_count(c: &AllTimeCounts, s: SessionStatus) -> Counter {
    match s {
        SessionStatus::Pending => c.pending,
        SessionStatus::Initiated => c.initiated,
        SessionStatus::Success => c.success,
        SessionStatus::Failed => c.failed,
        SessionStatus::Expired => c.expired,
    }
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
    let all = crate::domain::totals::read(store, tenant).await?;
    if all.marker.is_none() {
        return Ok(None);
    }
    let by_status = SessionStatus::ALL
        .into_iter()
        .map(|s| (s, all.sum(|c| status_count(c, s))))
        .collect();
    Ok(Some(SessionTotals {
        total: all.sum(|c| c.total),
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
pub fn shard_of(record: &str) -> u32 {
    keys::stats_shard(record)
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
pub fn day_key(tenant: &Tenant, at: Timestamp) -> Key {
    Key::new(
        keys::stats_partition(&tenant.project, tenant.mode),
        day_sk(&day_of(at)),
    )
}

/// The shard item `shard` of the UTC day of `at`.
pub fn shard_key(tenant: &Tenant, at: Timestamp, shard: u32) -> Key {
    Key::new(
        keys::stats_partition(&tenant.project, tenant.mode),
        shard_sk(&day_of(at), shard),
    )
}

/// The counter item that the record `record_id` created at `at` adds to.
pub fn counter_key(tenant: &Tenant, at: Timestamp, record: &str) -> Key {
    shard_key(tenant, at, shard_of(record))
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

/// The adds of one transaction to one counter item of kind `R`: one
/// entry per counter.
#[derive(Clone, Debug)]
struct ItemAdds<R> {
    key: Key,
    adds: Vec<(Attr<R, Counter>, i64)>,
}

impl<R> ItemAdds<R> {
    fn new(key: Key) -> Self {
        ItemAdds {
            key,
            adds: Vec::new(),
        }
    }

    fn add(&mut self, attr: Attr<R, Counter>, n: i64) {
        match self.adds.iter_mut().find(|(a, _)| a.name() == attr.name()) {
            Some((_, v)) => *v += n,
            None => self.adds.push((attr, n)),
        }
    }

    fn added(&self, name: &str) -> i64 {
        self.adds
            .iter()
            .filter(|(a, _)| a.name() == name)
            .map(|(_, v)| *v)
            .sum()
    }

    fn changes(&self) -> Changes<R> {
        self.adds
            .iter()
            .fold(Changes::new(), |c, (attr, n)| c.add(*attr, Counter::of(*n)))
    }
}

/// The adds to one counter item: a day's (with its ttl) or an all-time one.
#[derive(Clone, Debug)]
enum Counted {
    Day {
        adds: ItemAdds<DayCounters>,
        ttl: i64,
    },
    AllTime(ItemAdds<AllTimeCounts>),
}

impl Counted {
    fn key(&self) -> &Key {
        match self {
            Counted::Day { adds, .. } => &adds.key,
            Counted::AllTime(adds) => &adds.key,
        }
    }

    fn added(&self, name: &str) -> i64 {
        match self {
            Counted::Day { adds, .. } => adds.added(name),
            Counted::AllTime(adds) => adds.added(name),
        }
    }

    /// The update adding these counts (and setting a day item's ttl).
    fn update(&self) -> Update {
        match self {
            Counted::Day { adds, ttl } => adds.changes().set_some(DayCounters::TTL, ttl).into(),
            Counted::AllTime(adds) => adds.changes().into(),
        }
    }
}

/// Joins `from` into `into`, an update of the same item: adds of the same
/// counter are summed (an update names an attribute once), a set already
/// there is kept.
fn merge(into: &mut Update, from: Update) {
    for (attr, n) in from.add {
        match into.add.iter_mut().find(|(a, _)| *a == attr) {
            Some((_, v)) => *v += n,
            None => into.add.push((attr, n)),
        }
    }
    for (attr, v) in from.set {
        if !into.set.iter().any(|(a, _)| *a == attr) {
            into.set.push((attr, v));
        }
    }
}

/// Counter additions of one transaction, grouped per counter item.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Per item, in the order first added to.
    items: Vec<Counted>,
}

impl Tally {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds `n` to `attr` of the day item of the record (its project,
    /// mode, creation time and shard id).
    fn add(
        &mut self,
        record: (&ProjectId, Mode, Timestamp, &str),
        attr: Attr<DayCounters, Counter>,
        n: i64,
    ) {
        let (project_id, mode, created, shard_id) = record;
        let key = counter_key(&Tenant::new(project_id.clone(), mode), created, shard_id);
        let at = self.items.iter().position(|c| match c {
            Counted::Day { adds, .. } => adds.key == key,
            Counted::AllTime(_) => false,
        });
        let at = at.unwrap_or_else(|| {
            let ttl = start_of_day(created)
                .plus(chrono::Duration::days(KEEP_DAYS))
                .unix_seconds();
            self.items.push(Counted::Day {
                adds: ItemAdds::new(key),
                ttl,
            });
            self.items.len() - 1
        });
        if let Some(Counted::Day { adds, .. }) = self.items.get_mut(at) {
            adds.add(attr, n);
        }
    }

    /// Adds `n` to `attr` of the all-time item `key`.
    fn add_all_time(&mut self, key: Key, attr: Attr<AllTimeCounts, Counter>, n: i64) {
        let at = self.items.iter().position(|c| match c {
            Counted::AllTime(adds) => adds.key == key,
            Counted::Day { .. } => false,
        });
        let at = at.unwrap_or_else(|| {
            self.items.push(Counted::AllTime(ItemAdds::new(key)));
            self.items.len() - 1
        });
        if let Some(Counted::AllTime(adds)) = self.items.get_mut(at) {
            adds.add(attr, n);
        }
    }

    fn session(&mut self, s: &CheckoutSession, attr: Attr<DayCounters, Counter>) {
        self.add((&s.project_id, s.mode, s.created_at, &s.id), attr, 1);
    }

    fn payment(&mut self, p: &Payment, attr: Attr<DayCounters, Counter>, n: i64) {
        let record = (&p.project_id, p.mode, p.created_at, payment_shard_id(p));
        self.add(record, attr, n);
    }

    /// A session was created (`pending`).
    pub fn session_created(&mut self, s: &CheckoutSession) {
        self.session(s, DayCounters::SESSIONS_CREATED);
        let key = totals_key(&Tenant::new(s.project_id.clone(), s.mode), &s.id);
        self.add_all_time(key.clone(), AllTimeCounts::TOTAL, 1);
        self.add_all_time(key, status_attr(SessionStatus::Pending), 1);
    }

    /// A session's stored status moved from `from` to `to` (the write is
    /// conditioned on `from`, so the move is counted once).
    pub fn session_moved(&mut self, s: &CheckoutSession, from: SessionStatus, to: SessionStatus) {
        if from == to {
            return;
        }
        let key = totals_key(&Tenant::new(s.project_id.clone(), s.mode), &s.id);
        self.add_all_time(key.clone(), status_attr(from), -1);
        self.add_all_time(key, status_attr(to), 1);
    }

    /// A session became `initiated` for the first time.
    pub fn session_initiated(&mut self, s: &CheckoutSession) {
        self.session(s, DayCounters::SESSIONS_INITIATED);
    }

    /// A session became `success`.
    pub fn session_paid(&mut self, s: &CheckoutSession) {
        self.session(s, DayCounters::SESSIONS_PAID);
    }

    /// A payment was created (also in the all-time count).
    pub fn payment_created(&mut self, p: &Payment) {
        self.payment(p, DayCounters::PAYMENTS_TOTAL, 1);
        self.payment(p, DayCounters::count_of(p.provider), 1);
        let all_time = totals_key(
            &Tenant::new(p.project_id.clone(), p.mode),
            payment_shard_id(p),
        );
        self.add_all_time(all_time, AllTimeCounts::PAYMENTS, 1);
    }

    /// A payment became `success`.
    pub fn payment_succeeded(&mut self, p: &Payment) {
        let amount = p.amount.get();
        self.payment(p, DayCounters::PAYMENTS_SUCCESS, 1);
        self.payment(p, DayCounters::SUCCESS_VOLUME_PAISA, amount);
        self.payment(p, DayCounters::success_of(p.provider), 1);
        self.payment(p, DayCounters::success_volume_of(p.provider), amount);
    }

    /// A payment became `failed`.
    pub fn payment_failed(&mut self, p: &Payment) {
        self.payment(p, DayCounters::PAYMENTS_FAILED, 1);
    }

    /// The counter items this tally adds to, in order.
    pub fn keys(&self) -> Vec<&Key> {
        self.items.iter().map(Counted::key).collect()
    }

    /// The adds of the counter named `attr` on the item `key`, or on all
    /// items of the day when `key` is a [`day_key`] (tests and checks).
    pub fn added(&self, key: &Key, attr: &str) -> i64 {
        self.items
            .iter()
            .filter(|c| within(c.key(), key))
            .map(|c| c.added(attr))
            .sum()
    }

    /// Adds the counters to `ops`: into an update of the same item already
    /// there (a transaction touches each key once), else as a new
    /// unconditional update (an upsert: a missing day starts from 0).
    pub fn apply_to(self, ops: &mut Vec<TxOp>) -> Result<(), StoreError> {
        for counted in self.items {
            let existing = ops
                .iter_mut()
                .find(|op| op.key().as_ref() == Some(counted.key()));
            match existing {
                Some(TxOp::Update { update, .. }) => merge(update, counted.update()),
                Some(_) => {
                    let key = counted.key();
                    return Err(StoreError::Invalid(format!(
                        "counter item {}/{} is already written by this transaction",
                        key.pk, key.sk
                    )));
                }
                None => ops.push(TxOp::Update {
                    update: counted.update(),
                    key: counted.key().clone(),
                    cond: None,
                }),
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
