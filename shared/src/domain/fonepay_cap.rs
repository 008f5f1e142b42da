//! The sandbox fonepay caps (spec, mode rules 2 to 4; decisions, "Sandbox
//! fonepay"): fonepay has no sandbox, so a sandbox project pays with real
//! money, at most NPR 1,000 a payment and NPR 5,000 a calendar month
//! (Asia/Kathmandu), where the month counts succeeded volume plus every
//! unpaid attempt minted in the last 30 minutes at full value.
//!
//! One item per project and Kathmandu month (`PROJ#<p>` / `FPCAP#YYYY-MM`)
//! holds `paid` (succeeded volume) and one `hold_<reference>` attribute per
//! minted attempt (`{amount, minted}`), plus a `version`. Minting reads the
//! item, drops holds past 30 minutes, and writes the new hold only if the
//! version is unchanged, so parallel mints are serialized and the month
//! never goes over. A success (in the settle transaction) adds to `paid`,
//! drops its hold and bumps the version in one atomic update.

use std::collections::BTreeMap;

use chrono::{Datelike, FixedOffset};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::domain::record::{self, Changes, Family};
use crate::ids::ProjectId;
use crate::keys;
use crate::store::{Cond, Key, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// NPR 5,000 a month.
pub const MONTH_CAP_PAISA: i64 = 500_000;
/// An unpaid attempt counts this long after it is minted.
pub const HOLD_WINDOW: chrono::Duration = chrono::Duration::minutes(30);
const TRIES: usize = 40;

/// One project's sandbox fonepay month (`PROJ#<p>` / `FPCAP#YYYY-MM`),
/// read whole and changed only by updates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MonthCap {
    /// Succeeded volume, paisa (left out at zero).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paid: i64,
    /// Bumped by every write: a mint writes only over the version it read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// Epoch seconds after which the item may go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
    /// The minted attempts' holds, by attempt reference.
    #[serde(flatten, serialize_with = "holds_out", deserialize_with = "holds_in")]
    pub holds: BTreeMap<String, Hold>,
}

/// One minted attempt's hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Paisa.
    #[serde(default)]
    pub amount: i64,
    /// Epoch seconds it was minted.
    #[serde(default)]
    pub minted: i64,
}

crate::attrs! { MonthCap {
    PAID: i64 = paid,
    VERSION: Option<i64> = version,
    TTL: Option<i64> = ttl,
} }

impl MonthCap {
    /// A hold per minted attempt: attribute `hold_<reference>`.
    pub const HOLD: Family<MonthCap, Hold> = Family::declared("hold_");
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn holds_out<S: Serializer>(holds: &BTreeMap<String, Hold>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(holds.len()))?;
    for (reference, hold) in holds {
        map.serialize_entry(&format!("hold_{reference}"), hold)?;
    }
    map.end()
}

fn holds_in<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Hold>, D::Error> {
    let attrs = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    record::members(MonthCap::HOLD, attrs).map_err(serde::de::Error::custom)
}

/// Why a mint was refused.
#[derive(Debug, thiserror::Error)]
pub enum CapError {
    #[error(
        "Sandbox fonepay uses real money and is capped at NPR 5,000 a month \
         (succeeded payments plus QRs minted in the last 30 minutes): \
         {used} paisa counted, {amount} more would pass {cap}"
    )]
    MonthExceeded { used: i64, amount: i64, cap: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The Kathmandu calendar month (`YYYY-MM`) of `at` (UTC+05:45, no DST).
pub fn month_of(at: Timestamp) -> String {
    let offset = FixedOffset::east_opt(5 * 3600 + 45 * 60);
    let local = match offset {
        Some(o) => at.datetime().with_timezone(&o).date_naive(),
        None => at.datetime().date_naive(),
    };
    format!("{:04}-{:02}", local.year(), local.month())
}

pub fn cap_key(project_id: &ProjectId, month: &str) -> Key {
    keys::fonepay_cap(project_id, month)
}

fn paid(cap: Option<&MonthCap>) -> i64 {
    cap.map_or(0, |c| c.paid)
}

/// The holds of `cap` still counting at `now`: (reference, amount), and
/// the references of the stale ones.
fn holds(cap: Option<&MonthCap>, now: Timestamp) -> (Vec<(String, i64)>, Vec<String>) {
    let mut active = Vec::new();
    let mut stale = Vec::new();
    let cutoff = now.plus(-HOLD_WINDOW).unix_seconds();
    for (reference, hold) in cap.into_iter().flat_map(|c| &c.holds) {
        if hold.minted > cutoff {
            active.push((reference.clone(), hold.amount));
        } else {
            stale.push(reference.clone());
        }
    }
    (active, stale)
}

/// "The item's version is still the one read" (or it still does not
/// exist).
fn version_cond(cap: Option<&MonthCap>) -> Cond {
    match cap.and_then(|c| c.version) {
        Some(v) => MonthCap::VERSION.is(&v),
        None => MonthCap::VERSION.missing(),
    }
}

async fn read(store: &dyn Store, key: &Key) -> Result<Option<MonthCap>, StoreError> {
    record::get(store, key).await
}

/// What counts toward the month of `now` for the project.
pub async fn used(
    store: &dyn Store,
    project_id: &ProjectId,
    now: Timestamp,
) -> Result<i64, StoreError> {
    let month = month_of(now);
    let cur = read(store, &cap_key(project_id, &month)).await?;
    let mut total =
        paid(cur.as_ref()) + holds(cur.as_ref(), now).0.iter().map(|h| h.1).sum::<i64>();
    let earlier = month_of(now.plus(-HOLD_WINDOW));
    if earlier != month {
        let prev = read(store, &cap_key(project_id, &earlier)).await?;
        total += holds(prev.as_ref(), now).0.iter().map(|h| h.1).sum::<i64>();
    }
    Ok(total)
}

/// Holds `amount` for the attempt `reference` if the month has room;
/// answers the month that holds it.
pub async fn reserve(
    store: &dyn Store,
    project_id: &ProjectId,
    reference: &str,
    amount: i64,
    now: Timestamp,
) -> Result<String, CapError> {
    let month = month_of(now);
    let key = cap_key(project_id, &month);
    let earlier = month_of(now.plus(-HOLD_WINDOW));
    for attempt in 0..TRIES {
        let cur = read(store, &key).await?;
        let (active, stale) = holds(cur.as_ref(), now);
        let mut used = paid(cur.as_ref()) + active.iter().map(|h| h.1).sum::<i64>();
        // Near a month start, last month's recent holds count too; a mint
        // there must not race one on last month's item.
        let mut prev_check = None;
        if earlier != month {
            let prev = read(store, &cap_key(project_id, &earlier)).await?;
            used += holds(prev.as_ref(), now).0.iter().map(|h| h.1).sum::<i64>();
            prev_check = Some(version_cond(prev.as_ref()));
        }
        if used + amount > MONTH_CAP_PAISA {
            return Err(CapError::MonthExceeded {
                used,
                amount,
                cap: MONTH_CAP_PAISA,
            });
        }
        let cond = version_cond(cur.as_ref());
        let hold = Hold {
            amount,
            minted: now.unix_seconds(),
        };
        let mut update = Changes::new()
            .set_member(MonthCap::HOLD, reference, &hold)
            .add(MonthCap::VERSION.some(), 1)
            .set_some(
                MonthCap::TTL,
                &now.plus(chrono::Duration::days(62)).unix_seconds(),
            );
        for stale_reference in stale {
            update = update.remove_member(MonthCap::HOLD, &stale_reference);
        }
        let update = update.into();
        let written = match prev_check {
            None => store.update(&key, update, Some(cond)).await.map(|_| ()),
            Some(prev_cond) => store
                .transact(vec![
                    TxOp::Update {
                        key: key.clone(),
                        update,
                        cond: Some(cond),
                    },
                    TxOp::Check {
                        key: cap_key(project_id, &earlier),
                        cond: prev_cond,
                    },
                ])
                .await
                .map_err(|e| match e {
                    StoreError::TransactionCanceled { .. } => StoreError::ConditionFailed,
                    other => other,
                }),
        };
        match written {
            Ok(()) => return Ok(month),
            Err(StoreError::ConditionFailed) => {
                let pause = 5 + (attempt as u64 * 7) % 40 + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Unavailable("sandbox fonepay cap busy".into()).into())
}

/// Drops the hold of an attempt that never reached fonepay (nothing was
/// minted, so nothing counts).
pub async fn release(
    store: &dyn Store,
    project_id: &ProjectId,
    reference: &str,
    month: &str,
) -> Result<(), StoreError> {
    let update = Changes::new()
        .remove_member(MonthCap::HOLD, reference)
        .add(MonthCap::VERSION.some(), 1);
    store
        .update(
            &cap_key(project_id, month),
            update.into(),
            Some(Cond::Exists),
        )
        .await
        .map(|_| ())
}

/// The writes, for the settle transaction, of a sandbox fonepay attempt
/// that succeeded at `now`: its amount joins the month's paid volume and
/// its hold (in `hold_month`) stops counting.
pub fn paid_ops(
    project_id: &ProjectId,
    reference: &str,
    hold_month: Option<&str>,
    amount: i64,
    now: Timestamp,
) -> Vec<TxOp> {
    let month = month_of(now);
    let ttl = now.plus(chrono::Duration::days(62)).unix_seconds();
    let mut update = Changes::new()
        .add(MonthCap::PAID, amount)
        .add(MonthCap::VERSION.some(), 1)
        .set_some(MonthCap::TTL, &ttl);
    let mut ops = Vec::new();
    match hold_month {
        Some(m) if m == month => update = update.remove_member(MonthCap::HOLD, reference),
        Some(m) => ops.push(TxOp::Update {
            key: cap_key(project_id, m),
            update: Changes::new()
                .remove_member(MonthCap::HOLD, reference)
                .add(MonthCap::VERSION.some(), 1)
                .into(),
            cond: None,
        }),
        None => {}
    }
    ops.insert(
        0,
        TxOp::Update {
            key: cap_key(project_id, &month),
            update: update.into(),
            cond: None,
        },
    );
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::at;
    use std::sync::Arc;

    #[test]
    fn months_are_kathmandu_months() {
        // 18:15 UTC on the last day is already the next day in Kathmandu.
        assert_eq!(month_of(at("2026-11-30T18:14:59Z")), "2026-11");
        assert_eq!(month_of(at("2026-11-30T18:15:00Z")), "2026-12");
        assert_eq!(month_of(at("2026-12-31T18:15:00Z")), "2027-01");
    }

    #[tokio::test]
    async fn a_month_item_that_does_not_decode_refuses_instead_of_counting_zero() {
        // decisions-refined: a damaged counter is an error, never 0 (read
        // as 0, a sandbox project could mint past its real-money cap).
        let store = EmbeddedStore::in_memory().unwrap();
        let t0 = at("2026-11-10T04:00:00Z");
        let key = cap_key(&"proj_1".into(), &month_of(t0));
        let mut item = crate::store::Item::new();
        item.insert(crate::store::PK.into(), key.pk.clone().into());
        item.insert(crate::store::SK.into(), key.sk.clone().into());
        item.insert("paid".into(), serde_json::Value::from("lots"));
        store.put(item, None).await.unwrap();
        assert!(matches!(
            used(&store, &"proj_1".into(), t0).await,
            Err(StoreError::Backend(_))
        ));
        assert!(matches!(
            reserve(&store, &"proj_1".into(), "R1", 100_000, t0).await,
            Err(CapError::Store(StoreError::Backend(_)))
        ));
        // An item without `paid` (holds only) still reads as none paid.
        let ok = reserve(&store, &"proj_2".into(), "R1", 100_000, t0).await;
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(used(&store, &"proj_2".into(), t0).await.unwrap(), 100_000);
    }

    #[tokio::test]
    async fn holds_count_for_thirty_minutes_and_paid_volume_for_the_month() {
        let store = EmbeddedStore::in_memory().unwrap();
        let t0 = at("2026-11-10T04:00:00Z");
        for (i, r) in ["A1", "A2", "A3", "A4", "A5"].iter().enumerate() {
            let m = reserve(
                &store,
                &"proj_1".into(),
                r,
                100_000,
                t0.plus(chrono::Duration::seconds(i as i64)),
            )
            .await;
            assert_eq!(m.unwrap(), "2026-11");
        }
        let over = reserve(&store, &"proj_1".into(), "A6", 1, t0).await;
        assert!(
            matches!(over, Err(CapError::MonthExceeded { used: 500_000, .. })),
            "{over:?}"
        );
        // Another project has its own cap.
        assert!(
            reserve(&store, &"proj_2".into(), "B1", 100_000, t0)
                .await
                .is_ok()
        );
        // A2 is paid: it moves from the holds to the paid volume.
        let t1 = t0.plus(chrono::Duration::minutes(5));
        store
            .transact(paid_ops(
                &"proj_1".into(),
                "A2",
                Some("2026-11"),
                100_000,
                t1,
            ))
            .await
            .unwrap();
        assert_eq!(used(&store, &"proj_1".into(), t1).await.unwrap(), 500_000);
        // 30 minutes on, the unpaid holds stop counting; the paid one stays.
        let t2 = t0.plus(chrono::Duration::minutes(31));
        assert_eq!(used(&store, &"proj_1".into(), t2).await.unwrap(), 100_000);
        assert!(
            reserve(&store, &"proj_1".into(), "A7", 400_000, t2)
                .await
                .is_ok()
        );
        assert!(matches!(
            reserve(&store, &"proj_1".into(), "A8", 1, t2).await,
            Err(CapError::MonthExceeded { .. })
        ));
        // A released hold (nothing minted) frees its room at once.
        release(&store, &"proj_1".into(), "A7", "2026-11")
            .await
            .unwrap();
        assert_eq!(used(&store, &"proj_1".into(), t2).await.unwrap(), 100_000);
        // A new Kathmandu month starts from zero, apart from holds minted
        // in its first 30 minutes' look-back.
        let t3 = at("2026-11-30T18:05:00Z");
        assert!(
            reserve(&store, &"proj_1".into(), "C1", 300_000, t3)
                .await
                .is_ok()
        );
        let t4 = at("2026-11-30T18:20:00Z");
        assert_eq!(month_of(t4), "2026-12");
        assert_eq!(used(&store, &"proj_1".into(), t4).await.unwrap(), 300_000);
        assert!(matches!(
            reserve(&store, &"proj_1".into(), "C2", 300_000, t4).await,
            Err(CapError::MonthExceeded { .. })
        ));
        assert!(
            reserve(&store, &"proj_1".into(), "C3", 200_000, t4)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn mints_racing_across_a_month_start_never_pass_the_cap() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
        // NPR 4,000 held at 23:50 on the 30th in Kathmandu (18:05 UTC).
        let held = at("2026-11-30T18:05:00Z");
        reserve(&*store, &"proj_1".into(), "H", 400_000, held)
            .await
            .unwrap();
        let before = at("2026-11-30T18:14:59Z");
        let after = at("2026-11-30T18:15:01Z");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let store = store.clone();
            let t = if i % 2 == 0 { before } else { after };
            tasks.push(tokio::spawn(async move {
                reserve(&*store, &"proj_1".into(), &format!("R{i}"), 100_000, t).await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            if t.await.unwrap().is_ok() {
                ok += 1;
            }
        }
        assert_eq!(ok, 1, "exactly NPR 1,000 of room in the 30-minute window");
    }

    #[tokio::test]
    async fn parallel_mints_never_pass_the_month_cap() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
        let now = at("2026-11-10T04:00:00Z");
        let mut tasks = Vec::new();
        for i in 0..12 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                reserve(&*store, &"proj_1".into(), &format!("R{i}"), 100_000, now).await
            }));
        }
        let mut ok = 0;
        let mut over = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(CapError::MonthExceeded { .. }) => over += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!((ok, over), (5, 7));
        assert_eq!(used(&*store, &"proj_1".into(), now).await.unwrap(), 500_000);
    }
}
