//! A store wrapper that injects failures, for tests: throttling, timeouts
//! and conditional failures on chosen calls, to prove that a request that
//! hits one answers an error, leaves no partial state, and can be retried.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{Cond, Item, Key, Query, QueryPage, Store, StoreError, Stored, TxOp, Update};

/// Which calls a planned fault may hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Put,
    Update,
    Delete,
    Transact,
    Query,
    Count,
    /// Any call.
    Any,
}

/// What the fault does.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Fails before reaching the store (throttling, a timeout on the way
    /// out): nothing is written.
    Before(StoreError),
    /// Reaches the store, then reports a failure (a timeout on the way
    /// back): the write happened but the caller cannot know.
    After(StoreError),
}

impl Fault {
    pub fn throttled() -> Fault {
        Fault::Before(StoreError::Unavailable(
            "ProvisionedThroughputExceededException (injected)".into(),
        ))
    }
    pub fn timeout_after_write() -> Fault {
        Fault::After(StoreError::Unavailable(
            "timeout after the write (injected)".into(),
        ))
    }
    pub fn condition_failed() -> Fault {
        Fault::Before(StoreError::ConditionFailed)
    }
}

/// Forwards to an inner store, failing the calls planned with
/// [`FaultyStore::plan`].
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    planned: Mutex<VecDeque<(Op, usize, Fault)>>,
    injected: Mutex<u64>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            planned: Mutex::new(VecDeque::new()),
            injected: Mutex::new(0),
        }
    }

    /// Fails the `nth` (0 = the next) call of kind `op` from now with `fault`.
    pub fn plan(&self, op: Op, nth: usize, fault: Fault) {
        self.planned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back((op, nth, fault));
    }

    /// How many faults fired so far.
    pub fn injected(&self) -> u64 {
        *self.injected.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, op: Op) -> Option<Fault> {
        let mut planned = self.planned.lock().unwrap_or_else(|p| p.into_inner());
        let mut fired = None;
        for entry in planned.iter_mut() {
            if entry.0 == op || entry.0 == Op::Any {
                if entry.1 == 0 && fired.is_none() {
                    fired = Some(entry.2.clone());
                    entry.1 = usize::MAX; // spent
                } else if entry.1 != usize::MAX && entry.1 > 0 {
                    // (One due while another fired waits for the next call.)
                    entry.1 -= 1;
                }
            }
        }
        planned.retain(|e| e.1 != usize::MAX);
        if fired.is_some() {
            *self.injected.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        }
        fired
    }
}

macro_rules! faulty {
    ($self:ident, $op:expr, $call:expr) => {{
        match $self.take($op) {
            Some(Fault::Before(e)) => Err(e),
            Some(Fault::After(e)) => {
                let _ = $call.await;
                Err(e)
            }
            None => $call.await,
        }
    }};
}

#[async_trait]
impl Store for FaultyStore {
    fn single_process(&self) -> bool {
        self.inner.single_process()
    }

    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        faulty!(self, Op::Get, self.inner.get(key))
    }
    async fn get_stored(&self, key: &Key) -> Result<Option<Stored>, StoreError> {
        faulty!(self, Op::Get, self.inner.get_stored(key))
    }
    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError> {
        faulty!(self, Op::Put, self.inner.put(item, cond))
    }
    async fn update(
        &self,
        key: &Key,
        update: Update,
        cond: Option<Cond>,
    ) -> Result<Item, StoreError> {
        faulty!(self, Op::Update, self.inner.update(key, update, cond))
    }
    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError> {
        faulty!(self, Op::Delete, self.inner.delete(key, cond))
    }
    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
        faulty!(self, Op::Transact, self.inner.transact(ops))
    }
    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError> {
        faulty!(self, Op::Query, self.inner.query(query))
    }
    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        faulty!(self, Op::Count, self.inner.count(query))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use serde_json::json;

    fn item(pk: &str) -> Item {
        let mut i = Item::new();
        i.insert("pk".into(), json!(pk));
        i.insert("sk".into(), json!("x"));
        i
    }

    #[tokio::test]
    async fn planned_faults_fire_once_on_the_chosen_call() {
        let Ok(inner) = EmbeddedStore::in_memory() else {
            panic!()
        };
        let store = FaultyStore::new(Arc::new(inner));
        store.plan(Op::Put, 1, Fault::throttled());
        assert!(store.put(item("a"), None).await.is_ok());
        assert!(matches!(
            store.put(item("b"), None).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(store.put(item("c"), None).await.is_ok());
        assert_eq!(store.injected(), 1);
        // "Before" faults write nothing.
        assert_eq!(store.get(&Key::new("b", "x")).await, Ok(None));
    }

    #[tokio::test]
    async fn after_faults_write_but_report_failure() {
        let Ok(inner) = EmbeddedStore::in_memory() else {
            panic!()
        };
        let store = FaultyStore::new(Arc::new(inner));
        store.plan(Op::Any, 0, Fault::timeout_after_write());
        assert!(store.put(item("a"), None).await.is_err());
        assert!(
            store
                .get(&Key::new("a", "x"))
                .await
                .ok()
                .flatten()
                .is_some()
        );
    }
}
