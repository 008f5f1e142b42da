//! Counted lists (issue 37 item 11): the unfiltered lists sorted by id
//! (checkout sessions, payment links, one-time invoices, an endpoint's
//! webhook deliveries, SMS reminders, billing customers, subscriptions and
//! invoices) served at any offset at a cost that does not grow with the
//! history, like the filtered payments and refunds.
//!
//! - **No new index.** Each list is its `gsi1` partition (billing
//!   customers: their table partition, [`CountedKind::index`]), sorted by the
//!   records' ids: a ULID minted at creation, so a UTC day is a key range
//!   from the day's lowest ULID to its highest.
//! - **Counters.** `c_all` per list, per UTC year, month and day of the
//!   id's time (`LIST#<code>[#<endpoint>]#D#2026-11-29#NN` in the stats
//!   partition, 8 shards by id), added in the insert's transaction
//!   ([`CountedList::count_new`]) and taken back in a delete's
//!   ([`CountedList::count_gone`]); a record carries `counted` once
//!   counted.
//! - **Pages** ([`page`]): an offset up to [`super::DIRECT_OFFSET`] is read
//!   through; a deeper one walks the counters newest first to its day and
//!   skips inside that day only. The total is the counters' sum. A seek
//!   (`starting_after`, the dashboard's Older/Newer) with a small offset is
//!   one ranged read; with a deep one it becomes an offset (the counters of
//!   the periods after its record, a count of its millisecond).
//! - **Retention.** SMS reminders expire by TTL after
//!   `sms::KEPT_DAYS`: their list is bounded by it ([`CountedList::since`]),
//!   so a counter never counts what the TTL deleted (older counters are
//!   never read).
//! - **Older records.** Until [`super::ListsMarker`] covers a list, it is
//!   counted and skipped through the index as before; [`migrate`] counts
//!   the older records (one conditional transaction each: `counted`
//!   missing, so a rerun or a concurrent run counts nothing twice).

use serde::de::DeserializeOwned;

use super::{
    DIRECT_OFFSET, ListsMarker, MAX_MS, Migrated, Reader, Sorted, decode, period_ops,
    seek_window_at,
};
use crate::domain::record::{self, Attr, Changes, Entry, Record, Window};
use crate::ids::IdKind;
use crate::kinds::Tenant;
use crate::store::{Cond, Index, Query, Seek, SkCond, Store, StoreError, TxOp, seek_window};
use crate::time::Timestamp;

/// Which counted list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CountedKind {
    Sessions,
    Links,
    Invoices,
    Deliveries,
    Sms,
    /// Billing customers: their own table partition, not an index's.
    Customers,
    Subscriptions,
    BillingInvoices,
    /// Reports (exports) of a tenant.
    Reports,
    /// Reconciliation runs of a tenant.
    ReconRuns,
}

impl CountedKind {
    fn code(self) -> &'static str {
        match self {
            CountedKind::Sessions => "CS",
            CountedKind::Links => "LNK",
            CountedKind::Invoices => "OINV",
            CountedKind::Deliveries => "WHD",
            CountedKind::Sms => "SMS",
            CountedKind::Customers => "BCUS",
            CountedKind::Subscriptions => "SUB",
            CountedKind::BillingInvoices => "BINV",
            CountedKind::Reports => "RPT",
            CountedKind::ReconRuns => "RRUN",
        }
    }

    fn id_kind(self) -> IdKind {
        match self {
            CountedKind::Sessions => IdKind::CheckoutSession,
            CountedKind::Links => IdKind::PaymentLink,
            CountedKind::Invoices => IdKind::Invoice,
            CountedKind::Deliveries => IdKind::WebhookDelivery,
            CountedKind::Sms => IdKind::Sms,
            CountedKind::Customers => IdKind::BillingCustomer,
            CountedKind::Subscriptions => IdKind::Subscription,
            CountedKind::BillingInvoices => IdKind::BillingInvoice,
            CountedKind::Reports => IdKind::Report,
            CountedKind::ReconRuns => IdKind::ReconRun,
        }
    }

    /// The index its list partition is on; `None`: the table's own
    /// partition (the records' keys).
    fn index(self) -> Option<Index> {
        match self {
            CountedKind::Customers => None,
            _ => Some(Index::Gsi1),
        }
    }
}

/// One counted list: its kind, tenant and list partition (on `gsi1`, or
/// the table's own for billing customers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountedList {
    pub kind: CountedKind,
    pub tenant: Tenant,
    pub partition: String,
    /// The records it is narrowed to (an endpoint's deliveries): part of
    /// its counter keys.
    pub scope: Option<String>,
    /// The earliest creation (unix millis) it lists: records older are
    /// gone by TTL (SMS), their counters never read.
    pub since: Option<i64>,
    /// The counter member counting it: `all`, or a narrowing's
    /// ([`CountedList::narrowed`]).
    pub member: String,
    /// The index its partition is on; `None`: the table's own.
    pub index: Option<Index>,
}

impl CountedList {
    pub fn new(kind: CountedKind, tenant: Tenant, partition: String) -> Self {
        CountedList {
            kind,
            tenant,
            partition,
            scope: None,
            since: None,
            member: "all".into(),
            index: kind.index(),
        }
    }

    /// The list narrowed to one value of a filter (a status, a plan):
    /// its records' entries in `partition` of `index`, sorted by id like
    /// the list's, counted as `member` of the list's counters (the same
    /// counter items: `c_<member>` beside `c_all`). A record in it has its
    /// entry written and its member counted in its insert's transaction
    /// (fold the counter writes into the list's with
    /// [`super::merge_counts`]: a transaction touches a counter item once),
    /// and moved by [`CountedList::count_moved`] when the value changes.
    /// A narrowing of a list whose records are too many per value to be
    /// members (a customer's) is a [`CountedList::scoped`] list instead.
    ///
    /// Page it ([`page`]) only once its [`Narrowing`] is covered: records
    /// from before it have no entry there until [`migrate_narrowed`].
    pub fn narrowed(mut self, member: &str, index: Index, partition: String) -> Self {
        self.member = member.to_owned();
        self.index = Some(index);
        self.partition = partition;
        self
    }

    /// The entry of a record in this list (its index and partition, at
    /// `sort`: the record's id); none for a list on the table's own
    /// partition (its records' keys).
    pub fn entry(&self, sort: &str) -> Option<Entry> {
        Some(Entry {
            index: self.index?,
            partition: self.partition.clone(),
            sort: sort.to_owned(),
        })
    }

    /// The list narrowed to `scope` (its own counters: `LIST#<code>#<scope>`).
    /// A scope starts with a lowercase letter (an id, `day_...`): the
    /// list's own counter keys go on with `Y#`, `M#` or `D#`, and a scope
    /// that did too would fall in their ranges.
    pub fn scoped(mut self, scope: &str) -> Self {
        debug_assert!(
            scope.starts_with(|c: char| c.is_ascii_lowercase()),
            "scope {scope:?} must start with a lowercase letter"
        );
        self.scope = Some(scope.to_owned());
        self
    }

    /// The list bounded to records created at or after `ms`.
    pub fn since(mut self, ms: i64) -> Self {
        self.since = Some(ms.max(0));
        self
    }

    fn base(&self) -> String {
        match &self.scope {
            Some(scope) => format!("LIST#{}#{scope}", self.kind.code()),
            None => format!("LIST#{}", self.kind.code()),
        }
    }

    /// The counter writes for a new record (its id, the list's sort key,
    /// `sort`; created at `created`), for its insert's transaction.
    pub fn count_new(&self, sort: &str, created: Timestamp) -> Vec<TxOp> {
        self.count(sort, created, 1)
    }

    /// The counter writes for a deleted record, for its delete's
    /// transaction (conditioned on the record being there).
    pub fn count_gone(&self, sort: &str, created: Timestamp) -> Vec<TxOp> {
        self.count(sort, created, -1)
    }

    /// The counter writes moving a record (`sort`, created at `created`)
    /// from this list to `to` (another narrowing of the same list: its
    /// status changed), for the change's transaction. Nothing when both
    /// are the same list.
    pub fn count_moved(&self, to: &CountedList, sort: &str, created: Timestamp) -> Vec<TxOp> {
        if self.base() == to.base() {
            if self.member == to.member {
                return Vec::new();
            }
            return period_ops(
                &self.base(),
                &self.tenant,
                Self::day_of(sort, created),
                sort,
                &[(self.member.clone(), -1), (to.member.clone(), 1)],
            );
        }
        let mut ops = self.count_gone(sort, created);
        super::merge_counts(&mut ops, to.count_new(sort, created));
        ops
    }

    /// The time whose day counts a record: its id's (an id's time runs
    /// at most a little ahead of `created`), `created` for an id not a
    /// ULID.
    fn day_of(sort: &str, created: Timestamp) -> i64 {
        crate::ids::minted_at_ms(sort).unwrap_or_else(|| created.unix_millis())
    }

    fn count(&self, sort: &str, created: Timestamp, n: i64) -> Vec<TxOp> {
        period_ops(
            &self.base(),
            &self.tenant,
            Self::day_of(sort, created),
            sort,
            &[(self.member.clone(), n)],
        )
    }

    /// Every record of the list, newest first.
    pub fn all(&self) -> Query {
        let mut q = Query::partition(self.partition.clone()).backward();
        q.index = self.index;
        q
    }

    fn reader<'a>(&self, store: &'a dyn Store, tenant: &'a Tenant) -> Reader<'a> {
        Reader {
            store,
            counters: self.base(),
            sorted: Sorted::Id(self.kind.id_kind().prefix()),
            tenant,
            index: self.index,
            partition: self.partition.clone(),
            member: self.member.clone(),
            calls: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

/// A record in a counted list.
pub trait Counted: Record + DeserializeOwned {
    /// Present (true) once the record is counted.
    const COUNTED: Attr<Self, bool>;
    fn counted_list(&self) -> CountedList;
    fn counted_id(&self) -> &str;
    fn counted_created(&self) -> Timestamp;
    fn is_counted(&self) -> bool;

    /// The counter writes counting it: in its list, and in any narrowing
    /// it is in (a record whose narrowings came with its list).
    fn count_ops(&self) -> Vec<TxOp> {
        self.counted_list()
            .count_new(self.counted_id(), self.counted_created())
    }

    /// The changes marking it counted (a record written whole under a
    /// version bumps it too, so a write from an older read fails).
    fn mark_counted(&self) -> Changes<Self> {
        Changes::new().set(Self::COUNTED, &true)
    }

    /// What else must hold when the migration counts it (a record written
    /// whole without a version: that no such write is under way).
    fn countable(&self) -> Option<Cond> {
        None
    }
}

/// The entries of a record (its id, `sort`) in `lists` (its narrowings).
pub fn entries_in(lists: &[CountedList], sort: &str) -> Vec<Entry> {
    lists.iter().filter_map(|l| l.entry(sort)).collect()
}

/// The counter writes counting a record (its id, `sort`; created at
/// `created`) in every one of `lists`, folded per counter item.
pub fn counts_in(lists: &[CountedList], sort: &str, created: Timestamp) -> Vec<TxOp> {
    let mut ops = Vec::new();
    for list in lists {
        super::merge_counts(&mut ops, list.count_new(sort, created));
    }
    ops
}

/// A change of the value `r` is narrowed by (a status, `active`) that
/// moves it from the list `from` to `to`: `changes` (which set the value)
/// with its entry moved, the condition to write them under (`as_read`:
/// the value as read; and `r` narrowed or not as read) and the counts
/// moved, for the same transaction. A record not narrowed yet moves
/// nothing: the migration narrows it as it then is.
pub fn value_change<R: Narrowed>(
    r: &R,
    as_read: Cond,
    changes: Changes<R>,
    (from, to): (&CountedList, &CountedList),
    (sort, created): (&str, Timestamp),
) -> super::StatusChange<R> {
    if !r.is_narrowed() {
        return super::StatusChange {
            changes,
            cond: Cond::And(vec![as_read, R::NARROWED.missing()]),
            also: Vec::new(),
        };
    }
    super::StatusChange {
        changes: changes.enter(to.entry(sort)),
        cond: Cond::And(vec![as_read, R::NARROWED.exists()]),
        also: from.count_moved(to, sort, created),
    }
}

/// Whether `e` is a transaction that lost a race on an item (a counter
/// shard a concurrent insert wrote): a retry may succeed.
pub fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::TransactionCanceled { reasons }
        if reasons.contains(&crate::store::TxReason::Conflict))
}

/// Whether `tenant`'s counters of `kind` cover its whole history.
pub async fn covered(
    store: &dyn Store,
    tenant: &Tenant,
    kind: CountedKind,
) -> Result<bool, StoreError> {
    let marker: Option<ListsMarker> = record::get(store, &ListsMarker::key(tenant)).await?;
    Ok(marker.is_some_and(|m| m.covers_counted(kind)))
}

impl ListsMarker {
    fn covers_counted(&self, kind: CountedKind) -> bool {
        match kind {
            CountedKind::Sessions => self.sessions,
            CountedKind::Links => self.links,
            CountedKind::Invoices => self.invoices,
            CountedKind::Deliveries => self.deliveries,
            CountedKind::Sms => self.sms,
            CountedKind::Customers => self.customers,
            CountedKind::Subscriptions => self.subscriptions,
            CountedKind::BillingInvoices => self.billing_invoices,
            CountedKind::Reports => self.reports,
            CountedKind::ReconRuns => self.recon_runs,
        }
    }

    /// The write marking the counted list `kind` covered.
    pub fn mark_counted(tenant: &Tenant, kind: CountedKind) -> TxOp {
        let attr = match kind {
            CountedKind::Sessions => ListsMarker::SESSIONS,
            CountedKind::Links => ListsMarker::LINKS,
            CountedKind::Invoices => ListsMarker::INVOICES,
            CountedKind::Deliveries => ListsMarker::DELIVERIES,
            CountedKind::Sms => ListsMarker::SMS,
            CountedKind::Customers => ListsMarker::CUSTOMERS,
            CountedKind::Subscriptions => ListsMarker::SUBSCRIPTIONS,
            CountedKind::BillingInvoices => ListsMarker::BILLING_INVOICES,
            CountedKind::Reports => ListsMarker::REPORTS,
            CountedKind::ReconRuns => ListsMarker::RECON_RUNS,
        };
        TxOp::Update {
            key: ListsMarker::key(tenant),
            update: Changes::<ListsMarker>::new().set(attr, &true).into(),
            cond: None,
        }
    }
}

/// The narrowings of the counted lists ([`CountedList::narrowed`],
/// [`CountedList::scoped`]): each covered once the tenant's marker says
/// every record has its entries there ([`migrate_narrowed`]); a new
/// project's marker covers them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Narrowing {
    /// Checkout sessions by stored status.
    SessionsByStatus,
    /// Payment links by `active`.
    LinksByActive,
    /// One-time invoices by document and collection status.
    InvoicesByStatus,
    /// Billing subscriptions by their list filters.
    SubscriptionsByFilter,
    /// Billing invoices by their list filters.
    BillingInvoicesByFilter,
}

impl Narrowing {
    fn attr(self) -> Attr<ListsMarker, bool> {
        match self {
            Narrowing::SessionsByStatus => ListsMarker::SESSIONS_BY_STATUS,
            Narrowing::LinksByActive => ListsMarker::LINKS_BY_ACTIVE,
            Narrowing::InvoicesByStatus => ListsMarker::INVOICES_BY_STATUS,
            Narrowing::SubscriptionsByFilter => ListsMarker::SUBSCRIPTIONS_BY_FILTER,
            Narrowing::BillingInvoicesByFilter => ListsMarker::BILLING_INVOICES_BY_FILTER,
        }
    }
}

impl ListsMarker {
    fn covers_narrowing(&self, n: Narrowing) -> bool {
        match n {
            Narrowing::SessionsByStatus => self.sessions_by_status,
            Narrowing::LinksByActive => self.links_by_active,
            Narrowing::InvoicesByStatus => self.invoices_by_status,
            Narrowing::SubscriptionsByFilter => self.subscriptions_by_filter,
            Narrowing::BillingInvoicesByFilter => self.billing_invoices_by_filter,
        }
    }

    /// The write marking the narrowing `n` covered.
    pub fn mark_narrowing(tenant: &Tenant, n: Narrowing) -> TxOp {
        TxOp::Update {
            key: ListsMarker::key(tenant),
            update: Changes::<ListsMarker>::new().set(n.attr(), &true).into(),
            cond: None,
        }
    }
}

/// Whether `tenant`'s records all have their entries and counts in the
/// narrowing `n`.
pub async fn covered_narrowing(
    store: &dyn Store,
    tenant: &Tenant,
    n: Narrowing,
) -> Result<bool, StoreError> {
    let marker: Option<ListsMarker> = record::get(store, &ListsMarker::key(tenant)).await?;
    Ok(marker.is_some_and(|m| m.covers_narrowing(n)))
}

/// A record of a counted list that is also in narrowings of it.
pub trait Narrowed: Record + DeserializeOwned {
    /// Present once its narrowed entries are written and counted (an
    /// index attribute read with [`super::present`], or a flag its
    /// [`Narrowed::narrowings`] sets).
    const NARROWED: Attr<Self, bool>;
    fn is_narrowed(&self) -> bool;
    /// The changes writing its entries in its narrowings (making
    /// `NARROWED` present), and the counter writes counting it there.
    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>);
    /// The fields its narrowings derive from (its status) are still the
    /// ones read.
    fn narrowed_as_read(&self) -> Cond;
}

/// Enters and counts `R`'s records of the query `all` (its whole list)
/// in their narrowings, one conditional transaction each (`NARROWED`
/// missing and the fields as read: a rerun or a concurrent run counts
/// nothing twice, a change meanwhile makes it re-read). The caller marks
/// the narrowing covered ([`ListsMarker::mark_narrowing`]) once done.
pub async fn migrate_narrowed<R: Narrowed>(
    store: &dyn Store,
    all: Query,
) -> Result<Migrated, StoreError> {
    super::migrate_each(store, all, R::is_narrowed, |record: &R, key| {
        let (changes, counts) = record.narrowings();
        let mut ops = vec![TxOp::Update {
            key: key.clone(),
            update: changes.into(),
            cond: Some(Cond::And(vec![
                Cond::Exists,
                R::NARROWED.missing(),
                record.narrowed_as_read(),
            ])),
        }];
        super::merge_counts(&mut ops, counts);
        ops
    })
    .await
}

/// A page of `list` (newest first) and its total, with what it cost.
/// `covered`: the tenant's counters cover the list ([`covered`]), else it
/// is counted and skipped through the index.
pub async fn page<T: DeserializeOwned>(
    store: &dyn Store,
    list: &CountedList,
    window: &Window,
    covered: bool,
) -> Result<(Vec<T>, u64, super::Cost), StoreError> {
    let all = list.all();
    if !covered {
        let (items, total) = record::page_of(store, &all, window.clone()).await?;
        return Ok((items, total, super::Cost::default()));
    }
    if window.limit == 0 {
        return Ok((Vec::new(), 0, super::Cost::default()));
    }
    let reader = list.reader(store, &list.tenant);
    let (lo, hi) = (list.since.unwrap_or(0), MAX_MS);
    // The whole partition when unbounded (every record, whatever its id).
    let whole = if lo > 0 { reader.query(lo, hi) } else { all };
    let (offset, limit) = match &window.seek {
        Seek::Start => (window.offset, window.limit),
        seek if lo == 0 && window.offset <= DIRECT_OFFSET => {
            // One ranged read from the record.
            let (items, total) = tokio::join!(
                seek_window(store, &whole, seek, window.offset, window.limit),
                reader.total(lo, hi)
            );
            let cost = super::Cost {
                counter_calls: reader.calls.load(std::sync::atomic::Ordering::Relaxed),
            };
            return Ok((decode(items?)?, total?, cost));
        }
        seek @ (Seek::After(sort) | Seek::Before(sort)) => {
            let (at, own) = position(&reader, list, sort, (lo, hi)).await?;
            seek_window_at(seek, at, own, window)
        }
    };
    let (items, total) = reader.read_at(&whole, (lo, hi), offset, limit).await;
    let cost = super::Cost {
        counter_calls: reader.calls.load(std::sync::atomic::Ordering::Relaxed),
    };
    Ok((decode(items?)?, total?, cost))
}

/// How many entries of `[lo, hi)` are newer than the record whose id is
/// `sort` (of its list), and whether it is one of them (1) or not (0).
async fn position(
    reader: &Reader<'_>,
    list: &CountedList,
    sort: &str,
    (lo, hi): (i64, i64),
) -> Result<(usize, usize), StoreError> {
    let ms = crate::ids::minted_at_ms(sort).unwrap_or(0);
    let later = if ms + 1 < hi {
        reader.total((ms + 1).max(lo), hi).await?
    } else {
        0
    };
    let (newer_same_ms, own) = if ms < lo {
        (0, 0)
    } else {
        let top = super::id_key(list.kind.id_kind().prefix(), ms, u128::MAX);
        let in_ms = |from: String, to: String| Query {
            sk: SkCond::Between(from, to),
            ..reader.query(lo, hi)
        };
        reader.tick();
        reader.tick();
        let (from_q, it_q) = (
            in_ms(sort.to_owned(), top),
            in_ms(sort.to_owned(), sort.to_owned()),
        );
        let (from_it, it) = tokio::join!(reader.store.count(&from_q), reader.store.count(&it_q));
        let (from_it, it) = (from_it?, it?);
        (from_it.saturating_sub(it), it.min(1))
    };
    let at = usize::try_from(later + newer_same_ms).unwrap_or(usize::MAX);
    Ok((at, usize::try_from(own).unwrap_or(0)))
}

/// Where the record whose id is `sort` stands in `list` (covered): how
/// many of its entries are newer, and whether it is one of them (1) or
/// not (0), at the cost of a deep offset's walk. For a list merged from
/// this one and others (a seek turned into an offset).
pub async fn position_of(
    store: &dyn Store,
    list: &CountedList,
    sort: &str,
) -> Result<(usize, usize), StoreError> {
    let reader = list.reader(store, &list.tenant);
    position(&reader, list, sort, (list.since.unwrap_or(0), MAX_MS)).await
}

/// Counts `R`'s records of the query `all` (a `gsi1` list partition, or
/// several: the caller runs it once per partition) not yet counted, one
/// conditional transaction each (`counted` missing: a rerun or a
/// concurrent run counts nothing twice). The caller marks the tenant
/// covered ([`ListsMarker::mark_counted`]) once every partition is done.
pub async fn migrate<R: Counted>(store: &dyn Store, all: Query) -> Result<Migrated, StoreError> {
    super::migrate_each(store, all, R::is_counted, |record: &R, key| {
        let mut cond = vec![Cond::Exists, R::COUNTED.missing()];
        cond.extend(record.countable());
        let mut ops = vec![TxOp::Update {
            key: key.clone(),
            update: record.mark_counted().into(),
            cond: Some(Cond::And(cond)),
        }];
        super::merge_counts(&mut ops, record.count_ops());
        ops
    })
    .await
}

/// [`Counted`] for a record listed per tenant (`project_id`, `mode`, `id`,
/// `created_at`, `counted`), its list partition given by `$partition`,
/// and `<Type>::counted_list_of(tenant)` / `<Type>::count_new(&self)`.
macro_rules! counted_per_tenant {
    ($ty:ty, $kind:expr, $partition:expr) => {
        impl $crate::domain::listing::counted::Counted for $ty {
            const COUNTED: $crate::domain::record::Attr<Self, bool> = <$ty>::COUNTED;
            fn counted_list(&self) -> $crate::domain::listing::counted::CountedList {
                <$ty>::counted_list_of(&$crate::kinds::Tenant::new(
                    self.project_id.clone(),
                    self.mode,
                ))
            }
            fn counted_id(&self) -> &str {
                &self.id
            }
            fn counted_created(&self) -> $crate::time::Timestamp {
                self.created_at
            }
            fn is_counted(&self) -> bool {
                self.counted
            }
        }

        impl $ty {
            /// `tenant`'s counted list of these records.
            pub fn counted_list_of(
                tenant: &$crate::kinds::Tenant,
            ) -> $crate::domain::listing::counted::CountedList {
                $crate::domain::listing::counted::CountedList::new(
                    $kind,
                    tenant.clone(),
                    $partition(tenant),
                )
            }

            /// The writes counting it in its list (its insert's
            /// transaction).
            pub fn count_new(&self) -> Vec<$crate::store::TxOp> {
                self.counted_list_of_self()
                    .count_new(&self.id, self.created_at)
            }

            pub(crate) fn counted_list_of_self(
                &self,
            ) -> $crate::domain::listing::counted::CountedList {
                <$ty>::counted_list_of(&$crate::kinds::Tenant::new(
                    self.project_id.clone(),
                    self.mode,
                ))
            }
        }
    };
}
pub(crate) use counted_per_tenant;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod narrowed_tests;
