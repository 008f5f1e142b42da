//! The idempotency fence: "this request's write is done", put in the
//! write's own transaction. A second run of the same request fails on it
//! and finds what the first run created ([`Fence::resource_id`]), even
//! when the first run's answer was lost. The HTTP edge makes one per
//! request that carries an `Idempotency-Key`; the rules only add its op.

use super::{Cond, Item, Key, PK, SK, Store, StoreError, TTL, TxOp, TxReason};

/// How long idempotency keys (and their fences) are remembered.
pub const RETENTION: chrono::Duration = chrono::Duration::hours(24);

/// Marks "this request's write is done" inside the write's own transaction.
/// Present (as an `Extension`) only on requests with an `Idempotency-Key`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fence {
    key: Key,
    ttl: i64,
}

impl Fence {
    /// A fence on `key` kept `ttl` (epoch seconds); the layer makes one per
    /// request (tools and tests may make their own).
    pub fn new(key: Key, ttl: i64) -> Fence {
        Fence { key, ttl }
    }

    /// The operation to add to the write's transaction. It fails if this
    /// request's write already committed once.
    pub fn op(&self, resource_id: &str) -> TxOp {
        let mut item = Item::new();
        item.insert(PK.into(), self.key.pk.clone().into());
        item.insert(SK.into(), self.key.sk.clone().into());
        item.insert("resource_id".into(), resource_id.into());
        item.insert(TTL.into(), self.ttl.into());
        // A fence past its retention is gone for the key's purposes, even
        // where the store has not deleted it yet (DynamoDB deletes expired
        // items lazily; the embedded store never does): it is overwritten.
        let made_at = self.ttl - RETENTION.num_seconds();
        TxOp::Put {
            item,
            cond: Some(Cond::Or(vec![Cond::NotExists, Cond::lt(TTL, made_at)])),
        }
    }

    /// Whether a failed transaction failed on the fence op at `index`.
    pub fn tripped(err: &StoreError, index: usize) -> bool {
        matches!(err, StoreError::TransactionCanceled { reasons }
            if matches!(reasons.get(index), Some(TxReason::ConditionFailed)))
    }

    /// Writes `put`, a new record's conditional put, once per request:
    /// with the request's fence (when it has one) in the same transaction.
    /// `Ok(None)` when this call wrote it; `Ok(Some(first))` when an
    /// earlier run of the same request created `first` (the caller answers
    /// that one, as the first run did).
    pub async fn put_once(
        fence: Option<&Fence>,
        store: &dyn Store,
        put: TxOp,
        resource_id: &str,
    ) -> Result<Option<String>, StoreError> {
        Fence::put_once_with(fence, store, put, resource_id, Vec::new()).await
    }

    /// [`Fence::put_once`] with `also` (an audit entry, say) in the same
    /// transaction: written with the record, or not at all.
    pub async fn put_once_with(
        fence: Option<&Fence>,
        store: &dyn Store,
        put: TxOp,
        resource_id: &str,
        also: Vec<TxOp>,
    ) -> Result<Option<String>, StoreError> {
        let mut ops = vec![put];
        if let Some(f) = fence {
            ops.push(f.op(resource_id));
        }
        ops.extend(also);
        match store.transact(ops).await {
            Ok(()) => Ok(None),
            Err(e) => match fence {
                Some(f) if Fence::tripped(&e, 1) => {
                    Ok(Some(f.resource_id(store).await?.unwrap_or_default()))
                }
                _ => Err(e),
            },
        }
    }

    /// The id of what the first run of this request created; none when
    /// the fence is past its retention (a key reused days later), as for
    /// [`Fence::op`], even where the store has not deleted it yet.
    pub async fn resource_id(&self, store: &dyn Store) -> Result<Option<String>, StoreError> {
        let made_at = self.ttl - RETENTION.num_seconds();
        Ok(store.get(&self.key).await?.and_then(|item| {
            let live = item
                .get(TTL)
                .and_then(|v| v.as_i64())
                .is_some_and(|ttl| ttl >= made_at);
            if !live {
                return None;
            }
            item.get("resource_id")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    #[tokio::test]
    async fn a_fence_past_its_retention_is_overwritten_not_tripped() {
        let store = EmbeddedStore::in_memory().unwrap();
        let key = Key::new("IDEMFENCE#p#sandbox#k", "FENCE");
        let day = RETENTION.num_seconds();
        let first = Fence::new(key.clone(), 1_000_000 + day);
        store.transact(vec![first.op("oinv_a")]).await.unwrap();
        // The same request again within the day: tripped.
        let again = store.transact(vec![first.op("oinv_a")]).await.unwrap_err();
        assert!(Fence::tripped(&again, 0), "{again:?}");
        // A new request with the key two days later: the old fence is stale,
        // and names nothing (a refused request must not answer as `oinv_a`).
        let later = Fence::new(key, 1_000_000 + 2 * day + 1);
        assert_eq!(later.resource_id(&store).await.unwrap(), None);
        assert_eq!(
            first.resource_id(&store).await.unwrap().as_deref(),
            Some("oinv_a")
        );
        store.transact(vec![later.op("oinv_b")]).await.unwrap();
        assert_eq!(
            later.resource_id(&store).await.unwrap().as_deref(),
            Some("oinv_b")
        );
    }

    fn put_of(id: &str) -> TxOp {
        let mut item = Item::new();
        item.insert(PK.into(), format!("REC#{id}").into());
        item.insert(SK.into(), "R".into());
        TxOp::Put {
            item,
            cond: Some(Cond::NotExists),
        }
    }

    #[tokio::test]
    async fn put_once_writes_once_and_names_the_first_record() {
        let store = EmbeddedStore::in_memory().unwrap();
        let fence = Fence::new(Key::new("IDEMFENCE#p#sandbox#k2", "FENCE"), 5_000_000);
        let first = Fence::put_once(Some(&fence), &store, put_of("cus_a"), "cus_a").await;
        assert_eq!(first.unwrap(), None, "this call wrote it");
        // The same request again (its answer lost) with a fresh record:
        // nothing is written, the first record is named.
        let again = Fence::put_once(Some(&fence), &store, put_of("cus_b"), "cus_b").await;
        assert_eq!(again.unwrap().as_deref(), Some("cus_a"));
        let b = Key::new("REC#cus_b", "R");
        assert_eq!(store.get(&b).await.unwrap(), None);
        // Without a fence a failed condition is the caller's error.
        let unfenced = Fence::put_once(None, &store, put_of("cus_a"), "cus_a").await;
        assert!(unfenced.unwrap_err().is_condition_failure());
    }
}
