//! A store wrapper that counts calls, to measure and pin how many round
//! trips a request costs (benchmarks and tests).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use super::{Cond, Item, Key, Query, QueryPage, Store, StoreError, TxOp, Update};

/// Forwards to an inner store and counts every call, and apart the
/// per-key rate limiter's (its counters' updates).
pub struct CountingStore {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
    limiter: AtomicU64,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        CountingStore {
            inner,
            calls: AtomicU64::new(0),
            limiter: AtomicU64::new(0),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The rate limiter's calls among them.
    pub fn limiter_calls(&self) -> u64 {
        self.limiter.load(Ordering::Relaxed)
    }

    /// Calls made so far, the rate limiter's left out.
    pub fn calls_besides_limiter(&self) -> u64 {
        self.calls() - self.limiter_calls()
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
        if crate::keys::is_rate_window(key) {
            self.limiter.fetch_add(1, Ordering::Relaxed);
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
        self.inner.query(query).await
    }
    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        self.tick();
        self.inner.count(query).await
    }
}
