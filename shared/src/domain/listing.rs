//! Filtered lists of payments and refunds (issue 41 part 2, issue 37 item
//! 11): by creation time (`[from, to)`), status, provider and any
//! combination, each page and its exact total at a cost that does not grow
//! with the project's history, at any offset.
//!
//! - **Indexes.** Every payment and refund is listed four times, each
//!   entry sorted by `<created_at, 13-digit UTC millis>#<id>` so a time
//!   range is a key range, newest first: `gsi3` (all of the list), `gsi4`
//!   (by status), `gsi5` (by provider), `gsi6` (by status and provider).
//!   A status change moves the `gsi4`/`gsi6` entries: [`status_change`] is
//!   the one place that writes a listed record's status.
//! - **Counters.** Per tenant and list, per UTC year, month and day of
//!   creation, sharded like the all-time counters (`keys::stats_shard`):
//!   `all`, per status, per provider, per status × provider, changed in
//!   the insert's transaction ([`count_new`]) and in the status change's
//!   (one count moved from the old status to the new).
//! - **Totals** ([`page`]): whole years, months and days of the range from
//!   counters, the partial days at its ends counted through the index (at
//!   most two days' entries): at most five counter queries and two
//!   counts, whatever the history.
//! - **Deep offsets**: the counters walked newest first to the day that
//!   holds the offset, then one ranged read from that day, skipping
//!   within it only.
//! - A tenant whose counters do not cover its history (records from
//!   before the lists; [`ListsMarker`] absent) is counted and skipped
//!   through the index until `dhukuti-admin lists migrate` ([`migrate`])
//!   has listed and counted its old records and marked it.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::record::{Attr, Changes, Entry, Family, Record, Window, from_item};
use super::totals::Counter;
use crate::keys;
use crate::kinds::{Provider, Tenant};
use crate::store::{
    Cond, Index, Item, Key, Query, Seek, SkCond, Store, StoreError, TxOp, query_window,
};
use crate::time::Timestamp;

/// Which list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListKind {
    Payments,
    Refunds,
}

impl ListKind {
    fn per_mode(self) -> keys::PerMode {
        match self {
            ListKind::Payments => keys::PerMode::Payments,
            ListKind::Refunds => keys::PerMode::Refunds,
        }
    }

    fn code(self) -> &'static str {
        match self {
            ListKind::Payments => "PAY",
            ListKind::Refunds => "REF",
        }
    }

    /// The base of the list's index partitions.
    fn partition(self, tenant: &Tenant) -> String {
        format!(
            "{}#L",
            keys::per_mode(&tenant.project, tenant.mode, self.per_mode())
        )
    }
}

/// A record kept in a filtered list.
pub trait Listed: Record + DeserializeOwned {
    const KIND: ListKind;
    /// The attribute its `gsi3` partition is stored in: present once the
    /// record is listed (and counted); read as whether it is there.
    const LISTED: Attr<Self, bool>;
    fn list_tenant(&self) -> Tenant;
    /// Its status as stored.
    fn list_status(&self) -> String;
    fn list_provider(&self) -> Provider;
    fn list_created(&self) -> Timestamp;
    fn list_id(&self) -> &str;
    /// The id its counters shard on.
    fn list_shard(&self) -> &str;
    /// Whether it is listed (and counted): false for a record from before
    /// the lists until the migration.
    fn is_listed(&self) -> bool;
    /// Its status is still the one read.
    fn status_unchanged(&self) -> Cond;
}

/// Whether an attribute is there (any value): a record reads its list
/// entry's partition as this.
pub fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// The stored name of a status (its serde name).
pub fn status_name<S: Serialize>(status: &S) -> String {
    match serde_json::to_value(status) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// What a list is narrowed to: created in `[from, to)`, `status` (its
/// stored name), `provider`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub status: Option<String>,
    pub provider: Option<Provider>,
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
}

impl ListFilter {
    /// Whether it narrows nothing.
    pub fn is_empty(&self) -> bool {
        self == &ListFilter::default()
    }

    /// The counter member that counts what it selects.
    fn member(&self) -> String {
        match (&self.status, self.provider) {
            (None, None) => "all".into(),
            (Some(s), None) => format!("s_{s}"),
            (None, Some(p)) => format!("p_{}", p.as_str()),
            (Some(s), Some(p)) => format!("sp_{s}_{}", p.as_str()),
        }
    }

    /// The index and partition of the entries it selects.
    fn partition(&self, kind: ListKind, tenant: &Tenant) -> (Index, String) {
        let base = kind.partition(tenant);
        match (&self.status, self.provider) {
            (None, None) => (Index::Gsi3, base),
            (Some(s), None) => (Index::Gsi4, format!("{base}#S#{s}")),
            (None, Some(p)) => (Index::Gsi5, format!("{base}#P#{}", p.as_str())),
            (Some(s), Some(p)) => (Index::Gsi6, format!("{base}#SP#{s}#{}", p.as_str())),
        }
    }

    /// Whether `r` is in the list it selects.
    fn selects<R: Listed>(&self, r: &R) -> bool {
        let ms = r.list_created().unix_millis();
        self.status.as_ref().is_none_or(|s| *s == r.list_status())
            && self.provider.is_none_or(|p| p == r.list_provider())
            && self.from.is_none_or(|f| ms >= f.unix_millis())
            && self.to.is_none_or(|t| ms < t.unix_millis())
    }
}

/// A record's place in its lists: creation millis (13 digits) and id.
pub fn sort_key(created: Timestamp, of: &str) -> String {
    format!("{:013}#{of}", created.unix_millis().max(0))
}

/// The lowest sort key at `ms`.
fn lo_key(ms: i64) -> String {
    format!("{:013}", ms.max(0))
}

/// The id (after `prefix`) minted at `ms` with the random part `random`
/// (its low 80 bits): 0 for the lowest of the millisecond, all ones for
/// the highest.
fn id_key(prefix: &str, ms: i64, random: u128) -> String {
    let ms = u64::try_from(ms.max(0)).unwrap_or(0);
    let random = random & ((1u128 << 80) - 1);
    format!(
        "{prefix}{}",
        ulid::Ulid::from_parts(ms, random)
            .to_string()
            .to_ascii_lowercase()
    )
}

/// The highest sort key before `ms` (ids are ASCII letters, digits and
/// `_`, all below `~`).
fn hi_key(ms: i64) -> String {
    format!("{:013}#~", (ms - 1).max(0))
}

/// Every entry of a record of `kind` (its `Record::entries`).
pub fn entries<R: Listed>(r: &R) -> Vec<Entry> {
    entries_with(r, &r.list_status())
}

fn entries_with<R: Listed>(r: &R, status: &str) -> Vec<Entry> {
    let tenant = r.list_tenant();
    let sort = sort_key(r.list_created(), r.list_id());
    let provider = Some(r.list_provider());
    let status = Some(status.to_owned());
    let filters = [
        ListFilter::default(),
        ListFilter {
            status: status.clone(),
            ..Default::default()
        },
        ListFilter {
            provider,
            ..Default::default()
        },
        ListFilter {
            status,
            provider,
            ..Default::default()
        },
    ];
    filters
        .iter()
        .map(|f| {
            let (index, partition) = f.partition(R::KIND, &tenant);
            Entry {
                index,
                partition,
                sort: sort.clone(),
            }
        })
        .collect()
}

// ------------------------------------------------------------ counters

/// One counter item of a list: a period's counts in one shard, each an
/// attribute of [`ListCounts::COUNT`] (`all`, `s_<status>`,
/// `p_<provider>`, `sp_<status>_<provider>`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ListCounts {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    #[serde(flatten)]
    pub counts: BTreeMap<String, Value>,
}

impl ListCounts {
    pub const COUNT: Family<ListCounts, Counter> = Family::declared("c_");

    fn get(&self, member: &str) -> i64 {
        self.counts
            .iter()
            .filter(|(attr, _)| Self::COUNT.member(attr) == Some(member))
            .filter_map(|(_, v)| v.as_i64())
            .sum()
    }
}

impl Record for ListCounts {
    fn item_key(&self) -> Key {
        Key::new(self.pk.as_str(), self.sk.as_str())
    }
}

/// The marker saying a tenant's list counters cover every record of a
/// list: written with the project, or by the migration once it counted
/// the project's older records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListsMarker {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub payments: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refunds: bool,
    /// The counted lists ([`counted`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sessions: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub links: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub invoices: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deliveries: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sms: bool,
    /// Billing customers (`billing::customers`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub customers: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subscriptions: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub billing_invoices: bool,
    /// The narrowed counted lists ([`counted::Narrowing`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sessions_by_status: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub links_by_active: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub invoices_by_status: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subscriptions_by_filter: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub billing_invoices_by_filter: bool,
    /// Reports and reconciliation runs (runs with their narrowings by
    /// provider and day).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reports: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recon_runs: bool,
}

crate::attrs! { ListsMarker {
    PAYMENTS: bool = payments,
    REFUNDS: bool = refunds,
    SESSIONS: bool = sessions,
    LINKS: bool = links,
    INVOICES: bool = invoices,
    DELIVERIES: bool = deliveries,
    SMS: bool = sms,
    CUSTOMERS: bool = customers,
    SUBSCRIPTIONS: bool = subscriptions,
    BILLING_INVOICES: bool = billing_invoices,
    SESSIONS_BY_STATUS: bool = sessions_by_status,
    LINKS_BY_ACTIVE: bool = links_by_active,
    INVOICES_BY_STATUS: bool = invoices_by_status,
    SUBSCRIPTIONS_BY_FILTER: bool = subscriptions_by_filter,
    BILLING_INVOICES_BY_FILTER: bool = billing_invoices_by_filter,
    REPORTS: bool = reports,
    RECON_RUNS: bool = recon_runs,
} }

impl Record for ListsMarker {
    fn item_key(&self) -> Key {
        Key::new(self.pk.as_str(), self.sk.as_str())
    }
}

impl ListsMarker {
    pub fn key(tenant: &Tenant) -> Key {
        Key::new(
            keys::stats_partition(&tenant.project, tenant.mode),
            "LIST#INIT",
        )
    }

    /// The marker of a new tenant: every list counted from the start.
    pub fn new(tenant: &Tenant) -> ListsMarker {
        let key = ListsMarker::key(tenant);
        ListsMarker {
            pk: key.pk,
            sk: key.sk,
            payments: true,
            refunds: true,
            sessions: true,
            links: true,
            invoices: true,
            deliveries: true,
            sms: true,
            customers: true,
            subscriptions: true,
            billing_invoices: true,
            sessions_by_status: true,
            links_by_active: true,
            invoices_by_status: true,
            subscriptions_by_filter: true,
            billing_invoices_by_filter: true,
            reports: true,
            recon_runs: true,
        }
    }

    fn covers(&self, kind: ListKind) -> bool {
        match kind {
            ListKind::Payments => self.payments,
            ListKind::Refunds => self.refunds,
        }
    }

    /// The write marking `kind` covered.
    pub fn mark(tenant: &Tenant, kind: ListKind) -> TxOp {
        let attr = match kind {
            ListKind::Payments => ListsMarker::PAYMENTS,
            ListKind::Refunds => ListsMarker::REFUNDS,
        };
        TxOp::Update {
            key: ListsMarker::key(tenant),
            update: Changes::<ListsMarker>::new().set(attr, &true).into(),
            cond: None,
        }
    }
}

/// Whether `tenant`'s counters of `kind` cover its whole history.
pub async fn covered(
    store: &dyn Store,
    tenant: &Tenant,
    kind: ListKind,
) -> Result<bool, StoreError> {
    let marker: Option<ListsMarker> = super::record::get(store, &ListsMarker::key(tenant)).await?;
    Ok(marker.is_some_and(|m| m.covers(kind)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    Year,
    Month,
    Day,
}

impl Unit {
    fn code(self) -> &'static str {
        match self {
            Unit::Year => "Y",
            Unit::Month => "M",
            Unit::Day => "D",
        }
    }

    /// The period (`2026`, `2026-11`, `2026-11-29`) holding `ms`.
    fn period(self, ms: i64) -> String {
        let d = date(ms);
        match self {
            Unit::Year => format!("{:04}", d.year()),
            Unit::Month => format!("{:04}-{:02}", d.year(), d.month()),
            Unit::Day => format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day()),
        }
    }

    /// The start of the period holding `ms`, and of the next one.
    fn bounds(self, ms: i64) -> (i64, i64) {
        let d = date(ms);
        let (start, next) = match self {
            Unit::Year => (
                NaiveDate::from_ymd_opt(d.year(), 1, 1),
                NaiveDate::from_ymd_opt(d.year() + 1, 1, 1),
            ),
            Unit::Month => {
                let (y, m) = if d.month() == 12 {
                    (d.year() + 1, 1)
                } else {
                    (d.year(), d.month() + 1)
                };
                (
                    NaiveDate::from_ymd_opt(d.year(), d.month(), 1),
                    NaiveDate::from_ymd_opt(y, m, 1),
                )
            }
            Unit::Day => (Some(d), d.succ_opt()),
        };
        (start.map_or(ms, day_ms), next.map_or(MAX_MS, day_ms))
    }
}

/// The latest instant a range reaches (year 10000).
const MAX_MS: i64 = 253_402_300_800_000;

fn date(ms: i64) -> NaiveDate {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.date_naive())
        .unwrap_or_default()
}

fn day_ms(d: NaiveDate) -> i64 {
    d.and_hms_opt(0, 0, 0)
        .map(|t| Utc.from_utc_datetime(&t).timestamp_millis())
        .unwrap_or(0)
}

/// The base of a list's counter keys (`LIST#PAY`).
fn counter_base(kind: ListKind) -> String {
    format!("LIST#{}", kind.code())
}

fn counter_key(base: &str, tenant: &Tenant, unit: Unit, period: &str, shard: u32) -> Key {
    Key::new(
        keys::stats_partition(&tenant.project, tenant.mode),
        format!("{base}#{}#{period}#{shard:02}", unit.code()),
    )
}

fn counter_prefix(base: &str, unit: Unit) -> String {
    format!("{base}#{}#", unit.code())
}

/// `deltas` (member, n) added to the year, month and day counters of `r`.
fn counter_ops<R: Listed>(r: &R, deltas: &[(String, i64)]) -> Vec<TxOp> {
    let base = counter_base(R::KIND);
    period_ops(
        &base,
        &r.list_tenant(),
        r.list_created().unix_millis(),
        r.list_shard(),
        deltas,
    )
}

/// `deltas` added to the year, month and day counters (under `base`) of
/// the period holding `ms`, in the shard of `shard_of`.
fn period_ops(
    base: &str,
    tenant: &Tenant,
    ms: i64,
    shard_of: &str,
    deltas: &[(String, i64)],
) -> Vec<TxOp> {
    let shard = keys::stats_shard(shard_of);
    [Unit::Year, Unit::Month, Unit::Day]
        .into_iter()
        .map(|unit| {
            let mut changes = Changes::<ListCounts>::new();
            for (member, n) in deltas {
                changes = changes.add_member(ListCounts::COUNT, member, Counter::of(*n));
            }
            TxOp::Update {
                key: counter_key(base, tenant, unit, &unit.period(ms), shard),
                update: changes.into(),
                cond: None,
            }
        })
        .collect()
}

fn members(status: &str, provider: Provider) -> [String; 4] {
    [
        "all".into(),
        format!("s_{status}"),
        format!("p_{}", provider.as_str()),
        format!("sp_{status}_{}", provider.as_str()),
    ]
}

/// The writes counting a new record, for its insert's transaction.
pub fn count_new<R: Listed>(r: &R) -> Vec<TxOp> {
    let deltas: Vec<(String, i64)> = members(&r.list_status(), r.list_provider())
        .into_iter()
        .map(|m| (m, 1))
        .collect();
    counter_ops(r, &deltas)
}

/// A status change of a listed record: the caller's `changes` with the
/// record's entries moved, the condition it must be written under (the
/// status still the one read, and the record listed or not as read), and
/// the counter writes for the same transaction.
pub struct StatusChange<R> {
    pub changes: Changes<R>,
    pub cond: Cond,
    pub also: Vec<TxOp>,
}

/// What moving `r` to status `to` writes besides `changes` (which set the
/// status itself): the one place a listed record's status changes
/// (`Payment::status_change`, `Refund::status_change` call it).
pub fn status_change<R: Listed>(r: &R, to: &str, changes: Changes<R>) -> StatusChange<R> {
    if !r.is_listed() {
        // The migration lists and counts it as it is then.
        return StatusChange {
            changes,
            cond: Cond::And(vec![r.status_unchanged(), R::LISTED.missing()]),
            also: Vec::new(),
        };
    }
    let from = r.list_status();
    let moved = entries_with(r, to)
        .into_iter()
        .filter(|e| matches!(e.index, Index::Gsi4 | Index::Gsi6));
    let also = if from == to {
        Vec::new()
    } else {
        let p = r.list_provider();
        let [_, s_old, _, sp_old] = members(&from, p);
        let [_, s_new, _, sp_new] = members(to, p);
        counter_ops(r, &[(s_old, -1), (sp_old, -1), (s_new, 1), (sp_new, 1)])
    };
    StatusChange {
        changes: changes.enter(moved),
        cond: Cond::And(vec![r.status_unchanged(), R::LISTED.exists()]),
        also,
    }
}

/// Adds the counter writes `counts` to `ops`, folding each into a write
/// of `ops` to the same counter item (a transaction touches a key once).
pub fn merge_counts(ops: &mut Vec<TxOp>, counts: Vec<TxOp>) {
    for op in counts {
        let TxOp::Update {
            key,
            update,
            cond: None,
        } = op
        else {
            ops.push(op);
            continue;
        };
        let same = ops.iter_mut().find_map(|o| match o {
            TxOp::Update {
                key: k,
                update: u,
                cond: None,
            } if *k == key && u.set.is_empty() && u.remove.is_empty() => Some(u),
            _ => None,
        });
        match same {
            Some(existing) => {
                for (attr, n) in update.add {
                    match existing.add.iter_mut().find(|(a, _)| *a == attr) {
                        Some((_, m)) => *m += n,
                        None => existing.add.push((attr, n)),
                    }
                }
            }
            None => ops.push(TxOp::Update {
                key,
                update,
                cond: None,
            }),
        }
    }
}

// -------------------------------------------------------------- ranges

/// A stretch of a range, `[lo, hi)` in millis: a whole year, month or
/// day (counted by counters) or part of a day (`None`: counted through
/// the index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    lo: i64,
    hi: i64,
    unit: Option<Unit>,
}

/// `[lo, hi)` cut into the fewest whole years, months and days, with
/// partial days at the ends; oldest first.
fn segments(lo: i64, hi: i64) -> Vec<Seg> {
    let mut out = Vec::new();
    let mut at = lo;
    while at < hi {
        let mut seg = None;
        for unit in [Unit::Year, Unit::Month, Unit::Day] {
            let (start, next) = unit.bounds(at);
            if start == at && next <= hi {
                seg = Some(Seg {
                    lo: at,
                    hi: next,
                    unit: Some(unit),
                });
                break;
            }
        }
        let seg = seg.unwrap_or_else(|| Seg {
            lo: at,
            hi: Unit::Day.bounds(at).1.min(hi),
            unit: None,
        });
        out.push(seg);
        at = seg.hi;
    }
    out
}

/// `seg` cut into its months (a year) or days (a month); oldest first.
fn children(seg: Seg) -> Vec<Seg> {
    let unit = match seg.unit {
        Some(Unit::Year) => Unit::Month,
        Some(Unit::Month) => Unit::Day,
        _ => return vec![seg],
    };
    let mut out = Vec::new();
    let mut at = seg.lo;
    while at < seg.hi {
        let next = unit.bounds(at).1.min(seg.hi);
        out.push(Seg {
            lo: at,
            hi: next,
            unit: Some(unit),
        });
        at = next;
    }
    out
}

/// One list read: where its entries are and which counter counts them.
struct Reader<'a> {
    store: &'a dyn Store,
    /// The base of its counter keys ([`counter_base`]).
    counters: String,
    /// How its index's sort keys place a time.
    sorted: Sorted,
    tenant: &'a Tenant,
    /// Its index; `None`: the table's own partition.
    index: Option<Index>,
    partition: String,
    member: String,
    /// Store round trips made (benchmarks).
    calls: std::sync::atomic::AtomicU64,
}

/// How a list's sort keys place a time.
#[derive(Clone, Debug)]
enum Sorted {
    /// `<13-digit millis>#<id>` (the filtered lists).
    Millis,
    /// The record's id, a ULID of its creation after this prefix.
    Id(&'static str),
}

impl Reader<'_> {
    fn query(&self, lo: i64, hi: i64) -> Query {
        let (from, to) = match &self.sorted {
            Sorted::Millis => (lo_key(lo), hi_key(hi)),
            Sorted::Id(prefix) => (id_key(prefix, lo, 0), id_key(prefix, hi - 1, u128::MAX)),
        };
        let mut q = Query::partition(self.partition.clone())
            .backward()
            .sk(SkCond::Between(from, to));
        q.index = self.index;
        q
    }

    /// The counts of `segs` (oldest first, consecutive): one counter query
    /// per run of whole periods of one unit, one index count per partial
    /// day, side by side.
    async fn counts(&self, segs: &[Seg]) -> Result<Vec<u64>, StoreError> {
        // Runs of whole periods of one unit.
        let mut runs: Vec<(Unit, usize, usize)> = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let Some(unit) = seg.unit else { continue };
            match runs.last_mut() {
                Some((u, _, end)) if *u == unit && *end == i => *end = i + 1,
                _ => runs.push((unit, i, i + 1)),
            }
        }
        let run_reads = runs.iter().map(|&(unit, start, end)| async move {
            let first = unit.period(segs[start].lo);
            let last = unit.period(segs[end - 1].lo);
            let prefix = counter_prefix(&self.counters, unit);
            let mut q = Query::partition(keys::stats_partition(
                &self.tenant.project,
                self.tenant.mode,
            ))
            .sk(SkCond::Between(
                format!("{prefix}{first}"),
                format!("{prefix}{last}#~"),
            ));
            let mut by_period: BTreeMap<String, i64> = BTreeMap::new();
            loop {
                self.tick();
                let page = self.store.query(&q).await?;
                for item in page.items {
                    let counts: ListCounts = from_item(item)?;
                    let period = counts
                        .sk
                        .strip_prefix(&prefix)
                        .and_then(|rest| rest.split('#').next())
                        .unwrap_or_default()
                        .to_owned();
                    *by_period.entry(period).or_default() += counts.get(&self.member);
                }
                match page.last_key {
                    Some(last) => q.start_after = Some(last),
                    None => break,
                }
            }
            Ok::<_, StoreError>((unit, by_period))
        });
        let partial_reads = segs
            .iter()
            .filter(|s| s.unit.is_none())
            .map(|s| async move {
                self.tick();
                let n = self.store.count(&self.query(s.lo, s.hi)).await?;
                Ok::<_, StoreError>((s.lo, n))
            });
        let (runs, partials) = tokio::join!(
            futures::future::try_join_all(run_reads),
            futures::future::try_join_all(partial_reads)
        );
        let (runs, partials) = (runs?, partials?);
        Ok(segs
            .iter()
            .map(|s| match s.unit {
                Some(unit) => runs
                    .iter()
                    .filter(|(u, _)| *u == unit)
                    .find_map(|(_, m)| m.get(&unit.period(s.lo)))
                    .map_or(0, |n| u64::try_from(*n).unwrap_or(0)),
                None => partials
                    .iter()
                    .find(|(lo, _)| *lo == s.lo)
                    .map_or(0, |(_, n)| *n),
            })
            .collect())
    }

    fn tick(&self) {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The total of `[lo, hi)`.
    async fn total(&self, lo: i64, hi: i64) -> Result<u64, StoreError> {
        let segs = segments(lo, hi);
        Ok(self.counts(&segs).await?.iter().sum())
    }

    /// Where the entry `offset` (newest first) of `[lo, hi)` is: the end
    /// of the day holding it and how many newer entries of that day to
    /// skip; `None` past the end. Walks years, then months, then days.
    async fn locate(
        &self,
        lo: i64,
        hi: i64,
        offset: u64,
    ) -> Result<Option<(i64, u64)>, StoreError> {
        let mut segs = segments(lo, hi);
        let mut rem = offset;
        loop {
            let counts = self.counts(&segs).await?;
            let mut found = None;
            for (seg, n) in segs.iter().zip(counts).rev() {
                if rem < n {
                    found = Some(*seg);
                    break;
                }
                rem -= n;
            }
            let Some(seg) = found else { return Ok(None) };
            match seg.unit {
                Some(Unit::Year | Unit::Month) => segs = children(seg),
                _ => return Ok(Some((seg.hi, rem))),
            }
        }
    }
}

impl Reader<'_> {
    /// Entries `offset..offset + limit` of `[lo, hi)` (`whole` reads it)
    /// and its total, side by side: a small offset read through, a deep
    /// one located by the counters and skipped inside its day only.
    async fn read_at(
        &self,
        whole: &Query,
        (lo, hi): (i64, i64),
        offset: usize,
        limit: usize,
    ) -> (Result<Vec<Item>, StoreError>, Result<u64, StoreError>) {
        if offset <= DIRECT_OFFSET {
            return tokio::join!(
                query_window(self.store, whole, offset, limit),
                self.total(lo, hi)
            );
        }
        let (located, total) = tokio::join!(
            self.locate(lo, hi, u64::try_from(offset).unwrap_or(u64::MAX)),
            self.total(lo, hi)
        );
        let items = match located {
            Err(e) => Err(e),
            Ok(None) => Ok(Vec::new()),
            Ok(Some((day_end, skip))) => {
                let q = self.query(lo, day_end);
                query_window(
                    self.store,
                    &q,
                    usize::try_from(skip).unwrap_or(usize::MAX),
                    limit,
                )
                .await
            }
        };
        (items, total)
    }
}

/// What one list read cost, for benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Store round trips of the counters and counts (the page's own
    /// reads come on top: one ranged query, more only past 1,000 items).
    pub counter_calls: u64,
}

/// Offsets served by reading the items they skip (bounded by this):
/// cheaper than a walk of the counters.
pub const DIRECT_OFFSET: usize = 100;

/// A page of `tenant`'s list of `R`, narrowed by `filter`, newest first,
/// and its total. With a `window.seek`, `seek_from` is the record it
/// names, after or before which the page starts. `counted`: the tenant's
/// counters cover the list ([`covered`]), else it is counted through the
/// index.
pub async fn page<R: Listed>(
    store: &dyn Store,
    tenant: &Tenant,
    filter: &ListFilter,
    window: &Window,
    seek_from: Option<&R>,
    counted: bool,
) -> Result<(Vec<R>, u64, Cost), StoreError> {
    let (index, partition) = filter.partition(R::KIND, tenant);
    let reader = Reader {
        store,
        counters: counter_base(R::KIND),
        sorted: Sorted::Millis,
        tenant,
        index: Some(index),
        partition,
        member: filter.member(),
        calls: std::sync::atomic::AtomicU64::new(0),
    };
    let lo = filter.from.map_or(0, |t| t.unix_millis().max(0));
    let hi = filter.to.map_or(MAX_MS, |t| t.unix_millis().min(MAX_MS));
    if lo >= hi || window.limit == 0 {
        return Ok((Vec::new(), 0, Cost::default()));
    }
    let whole = reader.query(lo, hi);
    if !counted {
        // Not yet migrated: count and skip through the index.
        return page_uncounted(store, &whole, filter, window, seek_from, hi).await;
    }
    // Where the page starts, from the list's start.
    let (offset, limit) = match (&window.seek, seek_from) {
        (Seek::Start, _) | (_, None) => (window.offset, window.limit),
        (seek, Some(r)) => {
            let (at, own) = reader.position(r, filter, (lo, hi), &whole).await?;
            seek_window_at(seek, at, own, window)
        }
    };
    let (items, total) = reader.read_at(&whole, (lo, hi), offset, limit).await;
    let cost = Cost {
        counter_calls: reader.calls.load(std::sync::atomic::Ordering::Relaxed),
    };
    Ok((decode(items?)?, total?, cost))
}

/// [`page`] of a tenant not yet counted: counted and skipped through the
/// index.
async fn page_uncounted<R: Listed>(
    store: &dyn Store,
    whole: &Query,
    filter: &ListFilter,
    window: &Window,
    seek_from: Option<&R>,
    hi: i64,
) -> Result<(Vec<R>, u64, Cost), StoreError> {
    let (offset, limit) = match (&window.seek, seek_from) {
        (Seek::Start, _) | (_, None) => (window.offset, window.limit),
        (seek, Some(r)) => {
            let newer = store
                .count(&Query {
                    sk: SkCond::Between(
                        format!("{}#", sort_key(r.list_created(), r.list_id())),
                        hi_key(hi),
                    ),
                    ..whole.clone()
                })
                .await?;
            let at = usize::try_from(newer).unwrap_or(usize::MAX);
            let own = usize::from(filter.selects(r));
            seek_window_at(seek, at, own, window)
        }
    };
    let (items, total) = tokio::join!(
        query_window(store, whole, offset, limit),
        store.count(whole)
    );
    Ok((decode(items?)?, total?, Cost::default()))
}

impl Reader<'_> {
    /// How many entries of `[lo, hi)` are newer than `r` (those after its
    /// millisecond, and those of it with a greater id), and whether `r`
    /// itself is one of them (1) or not (0).
    async fn position<R: Listed>(
        &self,
        r: &R,
        filter: &ListFilter,
        (lo, hi): (i64, i64),
        whole: &Query,
    ) -> Result<(usize, usize), StoreError> {
        let ms = r.list_created().unix_millis();
        let later = if ms + 1 < hi {
            self.total(ms + 1, hi).await?
        } else {
            0
        };
        self.tick();
        let same_ms = self
            .store
            .count(&Query {
                sk: SkCond::Between(
                    format!("{}#", sort_key(r.list_created(), r.list_id())),
                    hi_key(ms + 1),
                ),
                ..whole.clone()
            })
            .await?;
        let at = usize::try_from(later + same_ms).unwrap_or(usize::MAX);
        let own = usize::from(filter.selects(r) && ms >= lo && ms < hi);
        Ok((at, own))
    }
}

/// The offset and limit of a page after or before a record at position
/// `at` (entries newer than it; `own`: 1 when it is in the list itself).
fn seek_window_at(seek: &Seek, at: usize, own: usize, window: &Window) -> (usize, usize) {
    match seek {
        Seek::Start => (window.offset, window.limit),
        Seek::After(_) => (
            at.saturating_add(own).saturating_add(window.offset),
            window.limit,
        ),
        Seek::Before(_) => {
            let end = at.saturating_sub(window.offset);
            let start = end.saturating_sub(window.limit);
            (start, end - start)
        }
    }
}

fn decode<R: DeserializeOwned>(items: Vec<Item>) -> Result<Vec<R>, StoreError> {
    items.into_iter().map(from_item).collect()
}

// ------------------------------------------------------------ migration

/// What [`migrate`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Records listed and counted now.
    pub listed: u64,
    /// Records found listed already (by the insert, or an earlier run).
    pub already: u64,
    /// Records another writer changed under us, retried.
    pub retried: u64,
}

/// Lists and counts `tenant`'s records of `R` from before the lists, one
/// conditional transaction each (the record unlisted and its status as
/// read: a rerun or a concurrent run counts nothing twice, and a status
/// change meanwhile makes it re-read), then marks the tenant covered.
/// `all` is the records' partition on `gsi1` (every one of them).
pub async fn migrate<R: Listed>(
    store: &dyn Store,
    tenant: &Tenant,
    all: Query,
) -> Result<Migrated, StoreError> {
    let done = migrate_each(store, all, R::is_listed, |record: &R, key| {
        let mut ops = vec![TxOp::Update {
            key: key.clone(),
            update: Changes::<R>::new().enter(entries(record)).into(),
            cond: Some(Cond::And(vec![
                Cond::Exists,
                R::LISTED.missing(),
                record.status_unchanged(),
            ])),
        }];
        ops.extend(count_new(record));
        ops
    })
    .await?;
    store
        .transact(vec![ListsMarker::mark(tenant, R::KIND)])
        .await?;
    Ok(done)
}

/// The walk of every migration: each record of `all` (200 a page) not
/// `done` yet gets the transaction `ops` builds for it (conditioned on
/// the record as read). A lost race (a concurrent write or run, a
/// counter conflict) re-reads the record and tries again, up to 20
/// times; a record gone meanwhile is skipped.
pub(crate) async fn migrate_each<R: DeserializeOwned>(
    store: &dyn Store,
    all: Query,
    done: impl Fn(&R) -> bool,
    ops: impl Fn(&R, &Key) -> Vec<TxOp>,
) -> Result<Migrated, StoreError> {
    let mut out = Migrated::default();
    let mut q = all;
    q.limit = Some(200);
    loop {
        let page = store.query(&q).await?;
        for item in page.items {
            let Some(key) = Key::of(&item) else { continue };
            let mut record: R = from_item(item)?;
            let mut tries = 0;
            loop {
                if done(&record) {
                    out.already += 1;
                    break;
                }
                match store.transact(ops(&record, &key)).await {
                    Ok(()) => {
                        out.listed += 1;
                        break;
                    }
                    Err(e)
                        if (e.is_condition_failure()
                            || matches!(&e, StoreError::TransactionCanceled { .. }))
                            && tries < 20 =>
                    {
                        tries += 1;
                        out.retried += 1;
                        crate::store::contention_backoff(tries).await;
                        match super::record::get::<R>(store, &key).await? {
                            Some(fresh) => record = fresh,
                            None => break,
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        match page.last_key {
            Some(last) => q.start_after = Some(last),
            None => break,
        }
    }
    Ok(out)
}

pub mod counted;

#[cfg(test)]
mod tests;
