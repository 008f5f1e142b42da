//! A project's all-time counters in each mode: the `ALL#NN` items of its
//! stats partition (one per shard, [`AllTimeCounts`]), each changed in the
//! same transaction as what it counts, and the `ALL#INIT` marker
//! ([`AllTimeMarker`]), written with the project, saying they cover
//! everything it will have. Sessions by status (`checkout::stats`) and
//! payments are counted there, so a list's total is one query of a few
//! items whatever the number of records.
//!
//! A project from before a counter was kept has no flag for it on its
//! marker: its lists count the old way.

use serde::{Deserialize, Serialize};

use super::record::{Changes, Count, Record, from_item};
use crate::keys;
use crate::kinds::Tenant;
use crate::store::{Key, Query, SkCond, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// A counter as stored: absent until an `ADD` first writes it, then kept
/// (0 included), so a counter item reads and writes back as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Counter(Option<i64>);

impl Counter {
    /// A count of `n` (what an update adds).
    pub const fn of(n: i64) -> Counter {
        Counter(Some(n))
    }

    /// The count, 0 when never added to.
    pub fn get(self) -> i64 {
        self.0.unwrap_or(0)
    }

    /// The count, if ever added to.
    pub fn stored(self) -> Option<i64> {
        self.0
    }

    /// Never added to (the item does not hold it).
    pub fn is_unset(&self) -> bool {
        self.0.is_none()
    }
}

impl Count for Counter {
    fn delta(n: Counter) -> i64 {
        n.get()
    }
}

/// One all-time counter item (`ALL#NN`), "session totals": sessions by
/// stored status, all sessions, and payments ever created. Its key is no
/// function of its counts: the record holds it (`pk`, `sk`, read from the
/// item, written as its key).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllTimeCounts {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub pending: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub initiated: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub success: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub failed: Counter,
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub expired: Counter,
    /// Sessions ever created.
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub total: Counter,
    /// Payments ever created.
    #[serde(default, skip_serializing_if = "Counter::is_unset")]
    pub payments: Counter,
}

crate::attrs! { AllTimeCounts {
    PENDING: Counter = pending,
    INITIATED: Counter = initiated,
    SUCCESS: Counter = success,
    FAILED: Counter = failed,
    EXPIRED: Counter = expired,
    TOTAL: Counter = total,
    PAYMENTS: Counter = payments,
} }

impl Record for AllTimeCounts {
    fn item_key(&self) -> Key {
        Key::new(self.pk.as_str(), self.sk.as_str())
    }
}

/// The `ALL#INIT` marker, "session totals marker": being there, it says
/// the session counters cover every session of the project (created at
/// `since`); `payments_counted` says the payment counter covers every
/// payment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllTimeMarker {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub payments_counted: bool,
}

crate::attrs! { AllTimeMarker {
    SINCE: Option<Timestamp> = since,
    PAYMENTS_COUNTED: bool = payments_counted,
} }

impl Record for AllTimeMarker {
    fn item_key(&self) -> Key {
        Key::new(self.pk.as_str(), self.sk.as_str())
    }
}

impl AllTimeMarker {
    /// The marker of a project created at `since`: every counter covers it.
    pub fn new(tenant: &Tenant, since: Timestamp) -> AllTimeMarker {
        let key = keys::stats_totals_marker(&tenant.project, tenant.mode);
        AllTimeMarker {
            pk: key.pk,
            sk: key.sk,
            since: Some(since),
            payments_counted: true,
        }
    }
}

/// The counter item of the record whose counters shard on `shard_of` (a
/// session's id, or a payment's session's, else the payment's own: any
/// kind, only its characters count).
pub fn item_key(tenant: &Tenant, shard_of: &str) -> Key {
    Key::new(
        keys::stats_partition(&tenant.project, tenant.mode),
        keys::stats_totals(keys::stats_shard(shard_of)),
    )
}

/// The project's counter items and marker in `mode`, as read.
#[derive(Clone, Debug, Default)]
pub struct AllTime {
    pub marker: Option<AllTimeMarker>,
    pub items: Vec<AllTimeCounts>,
}

impl AllTime {
    /// One counter (`count` of an item) summed over the counter items.
    pub fn sum(&self, count: impl Fn(&AllTimeCounts) -> Counter) -> i64 {
        self.items.iter().map(|c| count(c).get()).sum()
    }

    /// Whether the payment counter was kept since the start.
    pub fn payments_covered(&self) -> bool {
        self.marker.as_ref().is_some_and(|m| m.payments_counted)
    }
}

/// Reads the counter items and the marker (one query of a few items).
pub async fn read(store: &dyn Store, tenant: &Tenant) -> Result<AllTime, StoreError> {
    let mut query = Query::partition(keys::stats_partition(&tenant.project, tenant.mode))
        .sk(SkCond::BeginsWith(keys::STATS_TOTALS_PREFIX.into()));
    let mut all = AllTime::default();
    loop {
        let page = store.query(&query).await?;
        for item in page.items {
            let marker = Key::of(&item).is_some_and(|k| k.sk == keys::STATS_TOTALS_MARKER);
            if marker {
                all.marker = Some(from_item(item)?);
            } else {
                all.items.push(from_item(item)?);
            }
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => return Ok(all),
        }
    }
}

/// The project's payments in `mode`, when counted since its start.
pub async fn payments(store: &dyn Store, tenant: &Tenant) -> Result<Option<u64>, StoreError> {
    let all = read(store, tenant).await?;
    Ok(all
        .payments_covered()
        .then(|| u64::try_from(all.sum(|c| c.payments)).unwrap_or(0)))
}

/// The write counting one new payment whose counters shard on `shard_of`.
pub fn count_payment(tenant: &Tenant, shard_of: &str) -> TxOp {
    TxOp::Update {
        key: item_key(tenant, shard_of),
        update: Changes::<AllTimeCounts>::new()
            .add(AllTimeCounts::PAYMENTS, Counter::of(1))
            .into(),
        cond: None,
    }
}
