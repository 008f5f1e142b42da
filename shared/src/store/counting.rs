//! A store wrapper that counts calls, to measure and pin how many round
//! trips a request costs (benchmarks and tests).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use super::{Cond, Item, Key, Query, QueryPage, Store, StoreError, Stored, TxOp, Update};

/// Forwards to an inner store and counts every call, and apart the
/// updates of the keys a test sets apart ([`CountingStore::apart`], e.g.
/// the rate limiter's counters).
pub struct CountingStore {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
    apart: Option<fn(&Key) -> bool>,
    apart_calls: AtomicU64,
    items_read: AtomicU64,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        CountingStore {
            inner,
            calls: AtomicU64::new(0),
            apart: None,
            apart_calls: AtomicU64::new(0),
            items_read: AtomicU64::new(0),
        }
    }

    /// Counts the updates of keys for which `which` holds apart too.
    pub fn apart(mut self, which: fn(&Key) -> bool) -> Self {
        self.apart = Some(which);
        self
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The updates set apart among them.
    pub fn apart_calls(&self) -> u64 {
        self.apart_calls.load(Ordering::Relaxed)
    }

    /// Calls made so far, those set apart left out.
    pub fn other_calls(&self) -> u64 {
        self.calls() - self.apart_calls()
    }

    /// Items queries answered so far: what a list page read (a skipped
    /// record is read too).
    pub fn items_read(&self) -> u64 {
        self.items_read.load(Ordering::Relaxed)
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Store for CountingStore {
    fn single_process(&self) -> bool {
        self.inner.single_process()
    }

    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        self.tick();
        self.inner.get(key).await
    }
    async fn get_stored(&self, key: &Key) -> Result<Option<Stored>, StoreError> {
        self.tick();
        self.inner.get_stored(key).await
    }
    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError> {
        self.tick();
        self.inner.put(item, cond).await
    }
    async fn update(
        &self,
        key: &Key,
        update: Update,
        cond: Option<Cond>,
    ) -> Result<Item, StoreError> {
        self.tick();
        if self.apart.is_some_and(|apart| apart(key)) {
            self.apart_calls.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.update(key, update, cond).await
    }
    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError> {
        self.tick();
        self.inner.delete(key, cond).await
    }
    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
        self.tick();
        self.inner.transact(ops).await
    }
    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError> {
        self.tick();
        let page = self.inner.query(query).await?;
        let n = u64::try_from(page.items.len()).unwrap_or(u64::MAX);
        self.items_read.fetch_add(n, Ordering::Relaxed);
        Ok(page)
    }
    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        self.tick();
        self.inner.count(query).await
    }
}
