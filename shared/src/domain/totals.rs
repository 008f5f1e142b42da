//! A project's all-time counters in each mode: the `ALL#NN` items of its
//! stats partition (one per shard), each changed in the same transaction
//! as what it counts, and the `ALL#INIT` marker, written with the project,
//! saying they cover everything it will have. Sessions by status
//! (`checkout::stats`) and payments are counted there, so a list's total
//! is one query of a few items whatever the number of records.
//!
//! A project from before a counter was kept has no flag for it on its
//! marker: its lists count the old way.

use serde_json::Value;

use super::Mode;
use crate::keys;
use crate::store::{Item, Key, Query, SK, SkCond, Store, StoreError, TxOp, Update};

/// On the counter items: payments ever created.
pub const PAYMENTS: &str = "payments";
/// On the marker: the payment counter covers every payment of the project.
pub const PAYMENTS_COVERED: &str = "payments_counted";

/// The counter item of the record `shard_id` (a session's id, or the
/// payment's session's).
pub fn item_key(project_id: &str, mode: Mode, shard_id: &str) -> Key {
    Key::new(
        keys::stats_partition(project_id, mode),
        keys::stats_totals(keys::stats_shard(shard_id)),
    )
}

/// The project's counter items and marker in `mode`, as read.
#[derive(Clone, Debug, Default)]
pub struct AllTime {
    pub marker: Option<Item>,
    pub items: Vec<Item>,
}

impl AllTime {
    /// `attr` summed over the counter items.
    pub fn sum(&self, attr: &str) -> i64 {
        self.items
            .iter()
            .filter_map(|i| i.get(attr).and_then(Value::as_i64))
            .sum()
    }

    /// Whether the marker says `flag` (a counter kept since the start).
    pub fn covers(&self, flag: &str) -> bool {
        self.marker
            .as_ref()
            .is_some_and(|m| m.get(flag).and_then(Value::as_bool) == Some(true))
    }
}

/// Reads the counter items and the marker (one query of a few items).
pub async fn read(store: &dyn Store, project_id: &str, mode: Mode) -> Result<AllTime, StoreError> {
    let mut query = Query::partition(keys::stats_partition(project_id, mode))
        .sk(SkCond::BeginsWith(keys::STATS_TOTALS_PREFIX.into()));
    let mut all = AllTime::default();
    loop {
        let page = store.query(&query).await?;
        for item in page.items {
            if item.get(SK).and_then(Value::as_str) == Some(keys::STATS_TOTALS_MARKER) {
                all.marker = Some(item);
            } else {
                all.items.push(item);
            }
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => return Ok(all),
        }
    }
}

/// The project's payments in `mode`, when counted since its start.
pub async fn payments(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
) -> Result<Option<u64>, StoreError> {
    let all = read(store, project_id, mode).await?;
    Ok(all
        .covers(PAYMENTS_COVERED)
        .then(|| u64::try_from(all.sum(PAYMENTS)).unwrap_or(0)))
}

/// The write counting one new payment of the record `shard_id`.
pub fn count_payment(project_id: &str, mode: Mode, shard_id: &str) -> TxOp {
    TxOp::Update {
        key: item_key(project_id, mode, shard_id),
        update: Update::new().add(PAYMENTS, 1),
        cond: None,
    }
}
