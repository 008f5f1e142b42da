//! The storage port: a small trait at the level DynamoDB offers, so that the
//! embedded backend (redb) and the DynamoDB backend are both honest.
//!
//! Items are JSON objects (`serde_json::Map`) with string attributes `pk` and
//! `sk` as the table key. Sparse global secondary indexes exist:
//! `gsi1` (attributes `gsi1pk`/`gsi1sk`) and `gsi2` (`gsi2pk`/`gsi2sk`),
//! and `gsi3`..`gsi6` for the filtered lists (`domain::listing`); an
//! item without both attributes of an index is not in that index.
//!
//! Semantics every backend follows (the conformance suite in [`testkit`]
//! pins each one):
//! - a comparison condition on a missing attribute is false, except `Ne`,
//!   which is true there (DynamoDB's `a <> :v` on an absent `a`);
//! - `update` on a missing item creates it (DynamoDB's upsert), unless the
//!   condition says otherwise; `add` on a missing attribute starts from 0;
//! - a transaction holds at most [`MAX_TX_OPS`] operations on distinct keys
//!   and applies all or nothing;
//! - table reads (`get`, table `query`, `count`) are strongly consistent;
//!   index queries are eventually consistent on DynamoDB, so domain code
//!   never relies on reading its own write through an index;
//! - a query's `limit` bounds the items *examined*; `filter` then drops
//!   items from that page (DynamoDB's `Limit` + `FilterExpression`), so a
//!   page may be short while `last_key` is still set.

pub mod cond;
pub mod counting;
pub mod dynamo;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod faults;
pub mod fence;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod validate;

use async_trait::async_trait;
use serde_json::{Map, Value};

/// One stored record: a JSON object holding at least `pk` and `sk`.
pub type Item = Map<String, Value>;

/// An item as its backend read it, not yet decoded ([`Store::get_stored`]).
/// A record decodes from it in one pass: the embedded store's bytes go
/// straight into the record's fields, without the [`Item`] map between
/// them (on the read path that map was a third of a request's own work,
/// issue 21).
#[derive(Debug, PartialEq)]
pub struct Stored(StoredRepr);

#[derive(Debug, PartialEq)]
enum StoredRepr {
    /// The item's JSON text, as the embedded store keeps it. Only a build
    /// with that store has it: a deployed function decodes one way only,
    /// and links no second decoder per record type (issue 21's 10 MB).
    #[cfg(feature = "embedded")]
    Json(Vec<u8>),
    /// The item, decoded already.
    Item(Item),
}

impl Stored {
    /// An item kept as JSON text (not checked until decoded).
    #[cfg(feature = "embedded")]
    pub fn json(bytes: Vec<u8>) -> Stored {
        Stored(StoredRepr::Json(bytes))
    }

    /// An item decoded already.
    pub fn item(item: Item) -> Stored {
        Stored(StoredRepr::Item(item))
    }

    /// The item as a `T` (`Value` for the item itself): the same answer
    /// as `serde_json::from_value` of the item `get` reads.
    pub fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, serde_json::Error> {
        match self.0 {
            #[cfg(feature = "embedded")]
            StoredRepr::Json(bytes) => serde_json::from_slice(&bytes),
            StoredRepr::Item(item) => serde_json::from_value(Value::Object(item)),
        }
    }
}

pub const PK: &str = "pk";
pub const SK: &str = "sk";
/// Epoch seconds after which the record may be deleted (DynamoDB TTL).
pub const TTL: &str = "ttl";
/// Most operations one transaction may hold (DynamoDB's limit).
pub const MAX_TX_OPS: usize = 100;

/// The table key of one item.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub pk: String,
    pub sk: String,
}

impl Key {
    pub fn new(pk: impl Into<String>, sk: impl Into<String>) -> Self {
        Self {
            pk: pk.into(),
            sk: sk.into(),
        }
    }

    /// The key of a stored item, if it has string `pk` and `sk`.
    pub fn of(item: &Item) -> Option<Key> {
        let pk = item.get(PK)?.as_str()?;
        let sk = item.get(SK)?.as_str()?;
        Some(Key::new(pk, sk))
    }
}

/// A global secondary index of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    Gsi1,
    Gsi2,
    /// Filtered lists by creation time (`domain::listing`): all records
    /// of a list.
    Gsi3,
    /// ... by status.
    Gsi4,
    /// ... by provider.
    Gsi5,
    /// ... by status and provider.
    Gsi6,
}

impl Index {
    pub const ALL: [Index; 6] = [
        Index::Gsi1,
        Index::Gsi2,
        Index::Gsi3,
        Index::Gsi4,
        Index::Gsi5,
        Index::Gsi6,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Index::Gsi1 => "gsi1",
            Index::Gsi2 => "gsi2",
            Index::Gsi3 => "gsi3",
            Index::Gsi4 => "gsi4",
            Index::Gsi5 => "gsi5",
            Index::Gsi6 => "gsi6",
        }
    }

    /// Partition-key attribute of the index.
    pub fn pk_attr(self) -> &'static str {
        match self {
            Index::Gsi1 => "gsi1pk",
            Index::Gsi2 => "gsi2pk",
            Index::Gsi3 => "gsi3pk",
            Index::Gsi4 => "gsi4pk",
            Index::Gsi5 => "gsi5pk",
            Index::Gsi6 => "gsi6pk",
        }
    }

    /// Sort-key attribute of the index.
    pub fn sk_attr(self) -> &'static str {
        match self {
            Index::Gsi1 => "gsi1sk",
            Index::Gsi2 => "gsi2sk",
            Index::Gsi3 => "gsi3sk",
            Index::Gsi4 => "gsi4sk",
            Index::Gsi5 => "gsi5sk",
            Index::Gsi6 => "gsi6sk",
        }
    }
}

/// Comparison operators of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A condition on one item, evaluated atomically with the write it guards.
/// Attribute names are top-level attributes of the item.
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    /// The item exists.
    Exists,
    /// The item does not exist.
    NotExists,
    AttrExists(String),
    AttrNotExists(String),
    /// `attr op value`. On a missing attribute `Ne` is true and every other
    /// operator false (as in DynamoDB). `Lt/Le/Gt/Ge`
    /// compare numbers numerically and strings by UTF-8 bytes; a type
    /// mismatch is false. `Eq/Ne` compare whole JSON values.
    Cmp(String, CmpOp, Value),
    And(Vec<Cond>),
    Or(Vec<Cond>),
    Not(Box<Cond>),
}

impl Cond {
    pub fn eq(attr: impl Into<String>, v: impl Into<Value>) -> Cond {
        Cond::Cmp(attr.into(), CmpOp::Eq, v.into())
    }
    pub fn ne(attr: impl Into<String>, v: impl Into<Value>) -> Cond {
        Cond::Cmp(attr.into(), CmpOp::Ne, v.into())
    }
    pub fn lt(attr: impl Into<String>, v: impl Into<Value>) -> Cond {
        Cond::Cmp(attr.into(), CmpOp::Lt, v.into())
    }
    pub fn le(attr: impl Into<String>, v: impl Into<Value>) -> Cond {
        Cond::Cmp(attr.into(), CmpOp::Le, v.into())
    }
    pub fn gt(attr: impl Into<String>, v: impl Into<Value>) -> Cond {
        Cond::Cmp(attr.into(), CmpOp::Gt, v.into())
    }
    pub fn ge(attr: impl Into<String>, v: impl Into<Value>) -> Cond {
        Cond::Cmp(attr.into(), CmpOp::Ge, v.into())
    }
}

/// Changes applied to one item by [`Store::update`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Update {
    /// `SET attr = value`.
    pub set: Vec<(String, Value)>,
    /// `ADD attr delta` on an integer attribute (missing counts as 0).
    pub add: Vec<(String, i64)>,
    /// `REMOVE attr`.
    pub remove: Vec<String>,
}

impl Update {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn set(mut self, attr: impl Into<String>, v: impl Into<Value>) -> Self {
        self.set.push((attr.into(), v.into()));
        self
    }
    pub fn add(mut self, attr: impl Into<String>, delta: i64) -> Self {
        self.add.push((attr.into(), delta));
        self
    }
    pub fn remove(mut self, attr: impl Into<String>) -> Self {
        self.remove.push(attr.into());
        self
    }
    /// Takes the item out of the sparse `index` (removes its key
    /// attributes there).
    pub fn unindex(self, index: Index) -> Self {
        self.remove(index.pk_attr()).remove(index.sk_attr())
    }
}

/// One write of a transaction.
#[derive(Clone, Debug, PartialEq)]
pub enum TxOp {
    Put {
        item: Item,
        cond: Option<Cond>,
    },
    Update {
        key: Key,
        update: Update,
        cond: Option<Cond>,
    },
    Delete {
        key: Key,
        cond: Option<Cond>,
    },
    /// Checks a condition on an item without writing it.
    Check {
        key: Key,
        cond: Cond,
    },
}

impl TxOp {
    pub fn key(&self) -> Option<Key> {
        match self {
            TxOp::Put { item, .. } => Key::of(item),
            TxOp::Update { key, .. } | TxOp::Delete { key, .. } | TxOp::Check { key, .. } => {
                Some(key.clone())
            }
        }
    }
}

/// Why one operation of a cancelled transaction failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxReason {
    /// This operation was fine; another one cancelled the transaction.
    None,
    ConditionFailed,
    /// Another transaction was writing the same item (DynamoDB's
    /// `TransactionConflict`); retrying may succeed.
    Conflict,
    Other(String),
}

/// Sort-key condition of a query.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum SkCond {
    #[default]
    Any,
    Eq(String),
    BeginsWith(String),
    /// Inclusive on both ends.
    Between(String, String),
    Lt(String),
    Le(String),
    Gt(String),
    Ge(String),
}

/// A query on one partition of the table or of an index.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Query {
    pub index: Option<Index>,
    pub pk: String,
    pub sk: SkCond,
    /// Ascending sort key when true, descending when false.
    pub forward: bool,
    /// At most this many items are examined (before `filter`).
    pub limit: Option<usize>,
    /// Continue after this key (a previous page's `last_key`).
    pub start_after: Option<Item>,
    /// Drops examined items that do not match.
    pub filter: Option<Cond>,
}

impl Query {
    /// Every item of the partition `pk`, ascending by sort key (add
    /// [`Query::backward`] for newest first: ids sort by time).
    pub fn partition(pk: impl Into<String>) -> Self {
        Query {
            pk: pk.into(),
            forward: true,
            ..Default::default()
        }
    }
    pub fn on(mut self, index: Index) -> Self {
        self.index = Some(index);
        self
    }
    pub fn sk(mut self, sk: SkCond) -> Self {
        self.sk = sk;
        self
    }
    pub fn backward(mut self) -> Self {
        self.forward = false;
        self
    }
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }
    pub fn filter(mut self, cond: Cond) -> Self {
        self.filter = Some(cond);
        self
    }
}

/// One page of query results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryPage {
    pub items: Vec<Item>,
    /// Key attributes of the last examined item when more may follow: pass
    /// it as `start_after` to continue. `None` when the partition is done.
    pub last_key: Option<Item>,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum StoreError {
    /// The condition of a single write was false; nothing changed.
    #[error("condition failed")]
    ConditionFailed,
    /// A transaction was cancelled; one reason per operation, in order.
    #[error("transaction cancelled: {reasons:?}")]
    TransactionCanceled { reasons: Vec<TxReason> },
    /// The request itself is invalid (missing key attributes, a transaction
    /// touching one key twice or holding too many operations, ...).
    #[error("invalid store request: {0}")]
    Invalid(String),
    /// Throttling or a transient fault; the caller may retry.
    #[error("store temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("store failure: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether a transaction failed only because some condition was false.
    pub fn is_condition_failure(&self) -> bool {
        match self {
            StoreError::ConditionFailed => true,
            StoreError::TransactionCanceled { reasons } => reasons
                .iter()
                .any(|r| matches!(r, TxReason::ConditionFailed)),
            _ => false,
        }
    }
}

/// The storage port. Every method is one round trip to the backend.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The item at `key` (strongly consistent).
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError>;

    /// [`Store::get`], one round trip as well, leaving the decoding to the
    /// caller ([`crate::domain::record::get`] reads a record from it).
    /// Wrappers forward it as they forward `get`; a backend that keeps its
    /// items' text overrides it.
    async fn get_stored(&self, key: &Key) -> Result<Option<Stored>, StoreError> {
        Ok(self.get(key).await?.map(Stored::item))
    }

    /// Writes the whole item if `cond` holds on the current one.
    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError>;

    /// Applies `update` if `cond` holds; returns the item as written.
    async fn update(
        &self,
        key: &Key,
        update: Update,
        cond: Option<Cond>,
    ) -> Result<Item, StoreError>;

    /// Deletes the item if `cond` holds (deleting a missing item is fine).
    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError>;

    /// Applies every operation or none.
    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError>;

    /// One page of a partition, in sort-key order.
    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError>;

    /// How many items of the partition match `sk` and `filter` (ignores
    /// `limit` and `start_after`).
    async fn count(&self, query: &Query) -> Result<u64, StoreError>;

    /// Whether only this process can use the store (the embedded store's
    /// file is locked): counters that only bound requests (the rate
    /// limiter) may then be kept in memory.
    fn single_process(&self) -> bool {
        false
    }

    /// This store's identity in this process, distinct for every store
    /// opened ([`new_instance`]); caches of store writes key on it.
    /// Wrappers answer their inner store's.
    fn instance(&self) -> u64;
}

/// A fresh [`Store::instance`].
pub fn new_instance() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Items a skip reads per round trip: the skipped items are dropped as
/// they come, so a deep offset costs round trips, never memory.
pub const SKIP_PAGE: usize = 1000;

/// Skips `offset` matching items of `query` and returns up to `limit`,
/// following pages as DynamoDB requires (it has no server-side skip): an
/// offset costs reading the items it skips (`docs/decisions-refined.md`,
/// "Deep pages"); a [`Seek`] reaches any place without them.
pub async fn query_window(
    store: &dyn Store,
    query: &Query,
    offset: usize,
    limit: usize,
) -> Result<Vec<Item>, StoreError> {
    let mut q = query.clone();
    let mut to_skip = offset;
    let mut kept = Vec::new();
    if limit == 0 {
        return Ok(kept);
    }
    loop {
        // A filtered query may drop most of a page: read in larger pages.
        let remaining = to_skip.saturating_add(limit - kept.len());
        let page = if q.filter.is_some() {
            remaining.max(100)
        } else {
            remaining
        };
        q.limit = Some(page.clamp(1, SKIP_PAGE));
        let page = store.query(&q).await?;
        let skipped = page.items.len().min(to_skip);
        to_skip -= skipped;
        kept.extend(page.items.into_iter().skip(skipped));
        kept.truncate(limit);
        match page.last_key {
            Some(last) if kept.len() < limit => q.start_after = Some(last),
            _ => break,
        }
    }
    Ok(kept)
}

/// Where a page of a list starts, by sort key: the records of a
/// partition's index are in sort-key order, so a page after (or before)
/// a known key is one ranged read whatever its depth.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Seek {
    /// From the start of the list.
    #[default]
    Start,
    /// The records after this sort key in the query's order (a list's
    /// "older" page after its last record).
    After(String),
    /// The records just before this sort key in the query's order (the
    /// "newer" page before a page's first record), still in that order.
    Before(String),
}

/// [`query_window`] from `seek`: `offset` counts from there. A query with
/// a sort-key condition of its own cannot seek (no list has one).
pub async fn seek_window(
    store: &dyn Store,
    query: &Query,
    seek: &Seek,
    offset: usize,
    limit: usize,
) -> Result<Vec<Item>, StoreError> {
    let (sk, reverse) = match seek {
        Seek::Start => return query_window(store, query, offset, limit).await,
        Seek::After(sk) => (sk, false),
        Seek::Before(sk) => (sk, true),
    };
    if query.sk != SkCond::Any {
        return Err(StoreError::Invalid(
            "a seek needs a query without a sort-key condition".into(),
        ));
    }
    let mut q = query.clone();
    q.start_after = None;
    // Past the key in the direction of reading.
    q.forward = query.forward != reverse;
    q.sk = if q.forward {
        SkCond::Gt(sk.clone())
    } else {
        SkCond::Lt(sk.clone())
    };
    let mut items = query_window(store, &q, offset, limit).await?;
    if reverse {
        items.reverse();
    }
    Ok(items)
}

/// A short random pause before try `attempt` (0-based) of a write that
/// lost a race (a failed version condition, a conflicting transaction):
/// up to 5 ms, doubling each try to at most 320 ms, uniformly spread so
/// racing writers do not collide again in step.
pub async fn contention_backoff(attempt: usize) {
    use rand::Rng;
    let cap = 5u64 << attempt.min(6);
    let ms = rand::rng().random_range(0..=cap);
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// Writes `op` together with `also` (an audit entry, say) in one
/// transaction, or alone when `also` is empty. A failed condition of `op`
/// itself is [`StoreError::ConditionFailed`], as a single write answers it,
/// so callers keep their one error path either way.
pub async fn write_with(store: &dyn Store, op: TxOp, also: Vec<TxOp>) -> Result<(), StoreError> {
    let mut ops = Vec::with_capacity(1 + also.len());
    ops.push(op);
    ops.extend(also);
    match store.transact(ops).await {
        Err(StoreError::TransactionCanceled { reasons })
            if matches!(reasons.first(), Some(TxReason::ConditionFailed)) =>
        {
            Err(StoreError::ConditionFailed)
        }
        other => other,
    }
}

/// [`Store::update`] of `key` with `also` in the same transaction; the
/// item as written is read back after (a transaction returns no values).
/// Without `also` it is the single update.
pub async fn update_with(
    store: &dyn Store,
    key: &Key,
    update: Update,
    cond: Option<Cond>,
    also: Vec<TxOp>,
) -> Result<Item, StoreError> {
    if also.is_empty() {
        return store.update(key, update, cond).await;
    }
    let op = TxOp::Update {
        key: key.clone(),
        update,
        cond,
    };
    write_with(store, op, also).await?;
    store
        .get(key)
        .await?
        .ok_or_else(|| StoreError::Backend(format!("{} vanished after its write", key.pk)))
}

#[cfg(test)]
mod write_with_tests {
    use super::embedded::EmbeddedStore;
    use super::*;

    fn item(pk: &str) -> Item {
        let mut item = Item::new();
        item.insert(PK.into(), pk.into());
        item.insert(SK.into(), "X".into());
        item
    }

    /// The extra write commits with the write it rides on, or not at all;
    /// the write's own failed condition reads as a single write's.
    #[tokio::test]
    async fn what_rides_along_commits_only_with_the_write() {
        let store = EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}"));
        let put = |pk: &str| TxOp::Put {
            item: item(pk),
            cond: Some(Cond::NotExists),
        };
        write_with(&store, put("A"), vec![put("AUDIT1")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let again = write_with(&store, put("A"), vec![put("AUDIT2")]).await;
        assert!(
            matches!(again, Err(StoreError::ConditionFailed)),
            "{again:?}"
        );
        let got = |pk: &'static str| {
            let store = &store;
            async move {
                store
                    .get(&Key::new(pk, "X"))
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        assert!(got("AUDIT1").await.is_some());
        assert!(
            got("AUDIT2").await.is_none(),
            "no entry for a refused write"
        );
        let updated = update_with(
            &store,
            &Key::new("A", "X"),
            Update::new().set("n", 1),
            Some(Cond::Exists),
            vec![put("AUDIT3")],
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(updated.get("n").and_then(|v| v.as_i64()), Some(1));
        assert!(got("AUDIT3").await.is_some());
    }
}
