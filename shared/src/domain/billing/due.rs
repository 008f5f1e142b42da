//! Where the billing sweep finds its work (`billing::sweep`).
//!
//! - The due index: every subscription with something still to do is in
//!   `gsi2` partition `PROJ#<project>#<mode>#SUBDUE`, sorted by
//!   `<next due time>#<id>` ([`due_sort`]). A subscription's writes keep the
//!   entry true (`Subscription::due_at`); an ended subscription has none.
//!   A subscription on a test clock is in its clock's partition instead
//!   (`CLOCK#<clock>#SUBDUE`): only the clock advances it.
//! - The list of tenants: one small item per project and mode that has
//!   subscriptions, `BILLDUE#<shard>` / `<project>#<mode>` ([`SHARDS`]
//!   partitions), written in the same transaction as a subscription that
//!   enters the due index. The sweep reads the list, then each tenant's
//!   partition, so one tenant's backlog never sits in front of another's.

use serde::{Deserialize, Serialize};

use crate::domain::record::{Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::{ProjectId, SubscriptionId, TestClockId};
use crate::keys;
use crate::store::{Key, Query, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// Partitions of the tenant list.
pub const SHARDS: u32 = 4;
/// At most this many tenants are read per sweep (the rest wait).
pub const MAX_TENANTS: usize = 10_000;

/// One project and mode that has (or had) subscriptions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueTenant {
    pub project_id: ProjectId,
    pub mode: Mode,
    /// When a subscription last entered the due index.
    pub touched_at: Timestamp,
}

impl DueTenant {
    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }
}

fn shard(project: &ProjectId) -> u32 {
    keys::stats_shard(project) % SHARDS
}

fn key(tenant: &Tenant) -> Key {
    keys::billing_due(shard(&tenant.project), &tenant.project, tenant.mode)
}

impl Record for DueTenant {
    fn item_key(&self) -> Key {
        key(&self.tenant())
    }
}

/// The tenant's due index partition.
pub fn due_partition(tenant: &Tenant) -> String {
    keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::SubscriptionsDue,
    )
}

/// The due index partition of the subscriptions on test clock `clock`
/// (advanced by the clock, so the sweep never reads it).
pub fn clock_partition(clock: &TestClockId) -> String {
    keys::test_clock_due_partition(clock)
}

/// The place of a subscription due at `at` in its partition.
pub fn due_sort(at: Timestamp, id: &SubscriptionId) -> String {
    format!("{}#{id}", at.to_rfc3339())
}

/// The upper bound of the entries due at or before `now`.
pub fn due_before(now: Timestamp) -> String {
    format!("{}#~", now.to_rfc3339())
}

/// The write that lists `tenant` (idempotent; part of the transaction
/// that puts a subscription in the due index).
pub fn listed(tenant: &Tenant, now: Timestamp) -> Result<TxOp, StoreError> {
    let entry = DueTenant {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        touched_at: now,
    };
    Ok(TxOp::Put {
        item: entry.to_item()?,
        cond: None,
    })
}

/// Every listed tenant (at most [`MAX_TENANTS`]), in a stable order.
pub async fn tenants(store: &dyn Store) -> Result<Vec<DueTenant>, StoreError> {
    let mut out = Vec::new();
    for s in 0..SHARDS {
        let mut query = Query::partition(keys::billing_due_partition(s));
        loop {
            let page = store.query(&query).await?;
            for item in page.items {
                match from_item::<DueTenant>(item) {
                    Ok(t) => out.push(t),
                    Err(e) => tracing::warn!(error = %e, "unreadable billing tenant passed over"),
                }
            }
            match page.last_key {
                Some(last) if out.len() < MAX_TENANTS => query.start_after = Some(last),
                _ => break,
            }
        }
    }
    out.truncate(MAX_TENANTS);
    Ok(out)
}

/// The tenants' due work taken in turns, one item each, starting from the
/// tenant that `minute` (a run's minute) names and moving on every minute,
/// up to `budget` items: no tenant's backlog sits in front of another's.
/// (The billing sweep and the notices pass both pick this way.)
pub fn take_turns<T>(queues: Vec<Vec<T>>, minute: i64, budget: usize) -> Vec<T> {
    let mut queues: Vec<std::vec::IntoIter<T>> = queues
        .into_iter()
        .filter(|q| !q.is_empty())
        .map(Vec::into_iter)
        .collect();
    if !queues.is_empty() {
        let turn = usize::try_from(minute).unwrap_or(0) % queues.len();
        queues.rotate_left(turn);
    }
    let mut out = Vec::new();
    while out.len() < budget && !queues.is_empty() {
        queues.retain_mut(|q| match q.next() {
            Some(s) if out.len() < budget => {
                out.push(s);
                true
            }
            _ => false,
        });
    }
    out
}

#[cfg(test)]
mod turn_tests {
    use super::take_turns;

    #[test]
    fn tenants_take_turns_from_the_minute_s_tenant_up_to_the_budget() {
        let q = || vec![vec![1, 2, 3], vec![], vec![10, 20], vec![100]];
        assert_eq!(take_turns(q(), 0, 10), vec![1, 10, 100, 2, 20, 3]);
        assert_eq!(take_turns(q(), 1, 10), vec![10, 100, 1, 20, 2, 3]);
        assert_eq!(take_turns(q(), 0, 4), vec![1, 10, 100, 2]);
        assert_eq!(take_turns::<i32>(Vec::new(), 7, 4), Vec::<i32>::new());
    }
}
