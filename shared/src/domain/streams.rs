//! Event-stream leases: how many event streams (`GET /c/{id}/events`)
//! one project holds open in one mode. A stream holds a function instance
//! while it lasts, and the instances are one pool (the events function's
//! reserved concurrency): without a cap per project, one merchant's
//! screens (or whoever learnt their sessions' ids) could hold them all.
//!
//! A project has `cap` slots, one small item each (`SLOT#<n>` in
//! `PROJ#<project>#<mode>#STREAMS`). A stream takes a free slot with a
//! conditional put and holds it until a time set when it was taken: the
//! stream's own length and a grace. It gives the slot back when it ends;
//! a stream whose instance crashed or froze gives nothing back, and its
//! slot is free again at that time, so nothing leaks. Taking reads the
//! partition once (at most `cap` small items) and tries at most
//! [`TRIES`] free slots.

use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::app::Deps;
use crate::domain::record::{Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::ProjectId;
use crate::keys::{self, PerMode};
use crate::store::{Cond, Key, Query, SkCond, StoreError};

/// A lease is held this long past the stream's own length (a stream
/// ends on its own at its length; the grace covers a slow last write).
pub const GRACE: chrono::Duration = chrono::Duration::seconds(10);
/// Free slots tried before a stream is refused (another stream may take
/// the one chosen between the read and the write).
pub const TRIES: usize = 3;

/// One slot of a project's event streams, held by one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub slot: u32,
    /// Random tag of the stream holding the slot (only it gives it back).
    pub holder: String,
    /// Unix milliseconds from which the slot is free again, given back
    /// or not.
    pub until_ms: i64,
    /// Epoch seconds after which the item is gone (DynamoDB TTL).
    pub ttl: i64,
}

crate::attrs! { Lease {
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    SLOT: u32 = slot,
    HOLDER: String = holder,
    UNTIL_MS: i64 = until_ms,
    TTL: i64 = ttl,
} }

impl Record for Lease {
    fn item_key(&self) -> Key {
        key(&Tenant::new(self.project_id.clone(), self.mode), self.slot)
    }
}

fn partition(tenant: &Tenant) -> String {
    keys::per_mode(&tenant.project, tenant.mode, PerMode::Streams)
}

fn key(tenant: &Tenant, slot: u32) -> Key {
    Key::new(partition(tenant), format!("SLOT#{slot}"))
}

/// A slot a stream holds: give it back with [`give_back`] when the
/// stream ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub tenant: Tenant,
    pub slot: u32,
    holder: String,
}

/// Takes one of `tenant`'s `cap` stream slots for a stream lasting
/// `lasting`, now: `None` when every slot is held (the screen polls
/// instead).
pub async fn take(
    deps: &Deps,
    tenant: &Tenant,
    cap: u32,
    lasting: chrono::Duration,
) -> Result<Option<Held>, StoreError> {
    let now = deps.clock.now();
    let now_ms = now.unix_millis();
    let query = Query::partition(partition(tenant))
        .sk(SkCond::BeginsWith("SLOT#".into()))
        .limit(
            usize::try_from(cap)
                .unwrap_or(usize::MAX)
                .saturating_add(16),
        );
    let page = deps.store.query(&query).await?;
    let mut held = std::collections::HashSet::new();
    for item in page.items {
        let lease: Lease = from_item(item)?;
        if lease.until_ms > now_ms {
            held.insert(lease.slot);
        }
    }
    let mut free: Vec<u32> = (0..cap).filter(|s| !held.contains(s)).collect();
    free.shuffle(&mut rand::rng());
    let until = now.plus(lasting + GRACE);
    for slot in free.into_iter().take(TRIES) {
        let lease = Lease {
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            slot,
            holder: format!("{:032x}", rand::random::<u128>()),
            until_ms: until.unix_millis(),
            ttl: until.unix_seconds() + 3600,
        };
        let free_now = Cond::Or(vec![Cond::NotExists, Lease::UNTIL_MS.le(&now_ms)]);
        match deps.store.put(lease.to_item()?, Some(free_now)).await {
            Ok(()) => {
                return Ok(Some(Held {
                    tenant: tenant.clone(),
                    slot,
                    holder: lease.holder,
                }));
            }
            Err(StoreError::ConditionFailed) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Gives back a slot [`take`] gave, if this stream still holds it.
pub async fn give_back(deps: &Deps, held: &Held) -> Result<(), StoreError> {
    let mine = Lease::HOLDER.eq(&held.holder);
    match deps
        .store
        .delete(&key(&held.tenant, held.slot), Some(mine))
        .await
    {
        Ok(()) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How many of `tenant`'s slots are held now (tests, the dashboard).
pub async fn held(deps: &Deps, tenant: &Tenant) -> Result<usize, StoreError> {
    let now_ms = deps.clock.now().unix_millis();
    let query = Query::partition(partition(tenant)).sk(SkCond::BeginsWith("SLOT#".into()));
    let page = deps.store.query(&query).await?;
    let mut n = 0;
    for item in page.items {
        let lease: Lease = from_item(item)?;
        if lease.until_ms > now_ms {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
