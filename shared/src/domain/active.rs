//! The projects with open work, for the scheduler's sweep.
//!
//! Open sessions (to expire) and open payments (to reconcile) are indexed
//! per project and mode (`gsi2`, one partition each), ordered by when they
//! are due, so one project's backlog never sits in front of another
//! project's due work. The sweep finds the partitions through this
//! registry: one small item per project and mode that has had open work
//! recently, in [`SHARDS`] partitions.
//!
//! A writer [`touch`]es the registry before it creates open work (at most
//! once per [`TOUCH_EVERY`] per process and project: a cache, so a busy
//! project costs one write a minute, not one per checkout). The sweep
//! [`retire`]s an entry whose partitions it found empty, only when the
//! entry was last touched more than [`IDLE_AFTER`] ago and not touched
//! since it was read (a conditional delete). A writer whose cached touch
//! is younger than [`TOUCH_EVERY`] therefore always finds its entry there:
//! the sweep only retires entries older than that, and its delete fails on
//! any touch after its read.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use serde::{Deserialize, Serialize};

use super::record::{Changes, Record, from_item};
use super::{Mode, Tenant};
use crate::ids::ProjectId;
use crate::keys;
use crate::store::{Key, Query, Store, StoreError};
use crate::time::Timestamp;

/// Registry partitions.
pub const SHARDS: u32 = 4;
/// A process writes a project's entry at most this often.
pub const TOUCH_EVERY: chrono::Duration = chrono::Duration::seconds(60);
/// An entry is retired only after this long without a touch (well over
/// [`TOUCH_EVERY`]).
pub const IDLE_AFTER: chrono::Duration = chrono::Duration::minutes(10);
/// At most this many entries are read per sweep (the rest wait a sweep).
pub const MAX_PER_SWEEP: usize = 10_000;

/// One project and mode with (possibly) open work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Active {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub touched_at: Timestamp,
}

crate::attrs! { Active {
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    TOUCHED_AT: Timestamp = touched_at,
} }

impl Record for Active {
    fn item_key(&self) -> Key {
        key(&Tenant::new(self.project_id.clone(), self.mode))
    }
}

fn shard(project: &ProjectId) -> u32 {
    keys::stats_shard(project) % SHARDS
}

fn key(tenant: &Tenant) -> Key {
    keys::active(shard(&tenant.project), &tenant.project, tenant.mode)
}

/// When this process last wrote each entry, per store.
type Touched = HashMap<(u64, Tenant), Timestamp>;
static TOUCHED: LazyLock<Mutex<Touched>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Records that `tenant` is about to have open work (call before the
/// write that creates it).
pub async fn touch(store: &dyn Store, tenant: &Tenant, now: Timestamp) -> Result<(), StoreError> {
    let cache_key = (store.instance(), tenant.clone());
    let fresh = {
        let cache = match TOUCHED.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        cache
            .get(&cache_key)
            .is_some_and(|t| *t <= now && now < t.plus(TOUCH_EVERY))
    };
    if fresh {
        return Ok(());
    }
    touch_now(store, tenant, now).await?;
    let mut cache = match TOUCHED.lock() {
        Ok(c) => c,
        Err(poisoned) => poisoned.into_inner(),
    };
    // Bounded: a process serving very many projects starts over.
    if cache.len() > 100_000 {
        cache.clear();
    }
    cache.insert(cache_key, now);
    Ok(())
}

/// The write of [`touch`], without the cache.
pub async fn touch_now(
    store: &dyn Store,
    tenant: &Tenant,
    now: Timestamp,
) -> Result<(), StoreError> {
    let update = Changes::<Active>::new()
        .set(Active::PROJECT_ID, &tenant.project)
        .set(Active::MODE, &tenant.mode)
        .set(Active::TOUCHED_AT, &now);
    store
        .update(&key(tenant), update.into(), None)
        .await
        .map(|_| ())
}

/// Every registered project and mode (at most [`MAX_PER_SWEEP`]), in a
/// stable order.
pub async fn all(store: &dyn Store) -> Result<Vec<Active>, StoreError> {
    let mut out = Vec::new();
    for s in 0..SHARDS {
        let mut query = Query::partition(keys::active_partition(s));
        loop {
            let page = store.query(&query).await?;
            for item in page.items {
                match from_item::<Active>(item) {
                    Ok(a) => out.push(a),
                    Err(e) => tracing::warn!(error = %e, "unreadable registry entry passed over"),
                }
            }
            match page.last_key {
                Some(last) if out.len() < MAX_PER_SWEEP => query.start_after = Some(last),
                _ => break,
            }
        }
    }
    out.truncate(MAX_PER_SWEEP);
    Ok(out)
}

/// Takes `a` out of the registry if it has been idle for [`IDLE_AFTER`]
/// and nobody touched it since it was read. The caller found its
/// partitions empty. Whether it was retired.
pub async fn retire(store: &dyn Store, a: &Active, now: Timestamp) -> Result<bool, StoreError> {
    if now < a.touched_at.plus(IDLE_AFTER) {
        return Ok(false);
    }
    let cond = Active::TOUCHED_AT.eq(&a.touched_at);
    match store.delete(&a.item_key(), Some(cond)).await {
        Ok(()) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::at;

    #[tokio::test]
    async fn touched_projects_are_listed_until_retired_when_idle() {
        let store = EmbeddedStore::in_memory().unwrap();
        let t0 = at("2026-11-25T10:00:00Z");
        touch(&store, &Tenant::new("proj_a", Mode::Sandbox), t0)
            .await
            .unwrap();
        touch(&store, &Tenant::new("proj_b", Mode::Live), t0)
            .await
            .unwrap();
        let mut seen = all(&store).await.unwrap();
        seen.sort_by(|a, b| a.project_id.cmp(&b.project_id));
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].project_id, "proj_a");
        assert_eq!(seen[1].mode, Mode::Live);
        // Not idle yet: kept.
        assert!(
            !retire(&store, &seen[0], t0.plus(IDLE_AFTER / 2))
                .await
                .unwrap()
        );
        // Idle, but touched again since the read: kept.
        touch_now(
            &store,
            &Tenant::new("proj_a", Mode::Sandbox),
            t0.plus(IDLE_AFTER),
        )
        .await
        .unwrap();
        assert!(
            !retire(&store, &seen[0], t0.plus(IDLE_AFTER * 2))
                .await
                .unwrap()
        );
        // Idle and untouched: retired.
        assert!(retire(&store, &seen[1], t0.plus(IDLE_AFTER)).await.unwrap());
        let left = all(&store).await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].project_id, "proj_a");
    }

    #[tokio::test]
    async fn a_process_writes_an_entry_at_most_once_a_minute() {
        let inner: std::sync::Arc<dyn Store> =
            std::sync::Arc::new(EmbeddedStore::in_memory().unwrap());
        let counting = crate::store::counting::CountingStore::new(inner);
        let t0 = at("2026-11-25T11:00:00Z");
        // A project id no other test uses (the cache is per process).
        let tenant = Tenant::new(ProjectId::new(), Mode::Sandbox);
        for s in 0..30 {
            touch(&counting, &tenant, t0.plus(chrono::Duration::seconds(s)))
                .await
                .unwrap();
        }
        assert_eq!(counting.calls(), 1, "one write for 30 touches in 30 s");
        touch(&counting, &tenant, t0.plus(TOUCH_EVERY))
            .await
            .unwrap();
        assert_eq!(counting.calls(), 2);
    }
}
