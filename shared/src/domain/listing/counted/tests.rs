//! The counted lists' machinery on a minimal record: pages and totals at
//! any offset, the cost of a deep offset, seeks, racing inserts, deletes,
//! retention and the migration of older records.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::*;
use crate::domain::Mode;
use crate::domain::record::Entry;
use crate::ids::ProjectId;
use crate::store::Key;
use crate::store::counting::CountingStore;
use crate::testenv::memory_store;

/// A record of a counted list (as a payment link's, prefix `lnk_`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Thing {
    id: String,
    project_id: ProjectId,
    mode: Mode,
    created_at: Timestamp,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    counted: bool,
}

crate::attrs! { Thing {
    ID: String = id,
    COUNTED: bool = counted,
} }

impl Record for Thing {
    fn item_key(&self) -> Key {
        Key::new(format!("THING#{}", self.id), "R")
    }

    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(PARTITION, self.id.clone())]
    }
}

const PARTITION: &str = "PROJ#proj_things#live#THINGS";

fn tenant() -> Tenant {
    Tenant::new("proj_things", Mode::Live)
}

fn list() -> CountedList {
    CountedList::new(CountedKind::Links, tenant(), PARTITION.into())
}

impl Counted for Thing {
    const COUNTED: Attr<Self, bool> = Thing::COUNTED;
    fn counted_list(&self) -> CountedList {
        list()
    }
    fn counted_id(&self) -> &str {
        &self.id
    }
    fn counted_created(&self) -> Timestamp {
        self.created_at
    }
    fn is_counted(&self) -> bool {
        self.counted
    }
}

fn ms(s: &str) -> i64 {
    Timestamp::parse(s)
        .unwrap_or_else(|| panic!("time {s}"))
        .unix_millis()
}

/// A thing minted at `ms` (its id's time), counted or not.
fn thing(ms: i64, counted: bool) -> Thing {
    Thing {
        id: super::super::id_key("lnk_", ms, rand::random::<u128>()),
        project_id: tenant().project,
        mode: Mode::Live,
        created_at: Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms")),
        counted,
    }
}

async fn insert(store: &dyn Store, t: &Thing) -> Result<(), StoreError> {
    let mut ops = vec![t.put_new()?];
    if t.counted {
        ops.extend(list().count_new(&t.id, t.created_at));
    }
    store.transact(ops).await
}

async fn mark_covered(store: &dyn Store) {
    store
        .transact(vec![ListsMarker::mark_counted(
            &tenant(),
            CountedKind::Links,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Things spread over years, months, days and within a day, some at one
/// millisecond.
fn spread(n: usize, counted: bool) -> Vec<Thing> {
    let base = ms("2024-11-28T22:00:00.000Z");
    (0..n)
        .map(|i| {
            let step = match i % 7 {
                0 => 0,
                1 => 3_600_000 * 5,
                2 => 86_400_000 * 3 + 1,
                3 => 86_400_000 * 17,
                4 => 1,
                5 => 86_400_000 * 40,
                _ => 600_000,
            };
            thing(base + (i as i64) * 86_400_000 * 2 + step, counted)
        })
        .collect()
}

fn newest_first(all: &[Thing]) -> Vec<String> {
    let mut ids: Vec<String> = all.iter().map(|t| t.id.clone()).collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

async fn seeded(n: usize) -> (Arc<dyn Store>, Vec<Thing>) {
    let store = memory_store();
    mark_covered(&*store).await;
    let all = spread(n, true);
    for t in &all {
        insert(&*store, t).await.unwrap_or_else(|e| panic!("{e}"));
    }
    (store, all)
}

async fn read(store: &dyn Store, l: &CountedList, window: Window) -> (Vec<String>, u64) {
    let (page, total, _) = page::<Thing>(store, l, &window, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (page.into_iter().map(|t| t.id).collect(), total)
}

#[tokio::test]
async fn every_offset_pages_and_counts_exactly() {
    let (store, all) = seeded(300).await;
    let want = newest_first(&all);
    for offset in [0, 1, 57, 100, 101, 102, 150, 213, 299, 300, 301, 5000] {
        for limit in [1, 7, 25, 100] {
            let (got, total) = read(&*store, &list(), Window::at(offset, limit)).await;
            assert_eq!(total, 300);
            let end = (offset + limit).min(want.len());
            let expect = want.get(offset..end).map(<[String]>::to_vec);
            assert_eq!(
                got,
                expect.unwrap_or_default(),
                "offset {offset} limit {limit}"
            );
        }
    }
}

#[tokio::test]
async fn a_deep_offset_reads_a_bounded_number_of_items() {
    let inner = memory_store();
    mark_covered(&*inner).await;
    let start = ms("2026-10-20T00:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..2000i64 {
        let t = thing(start + i * 600_000, true);
        insert(&*inner, &t).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(t);
    }
    let want = newest_first(&all);
    let store = CountingStore::new(Arc::clone(&inner));
    let (got, total) = read(&store, &list(), Window::at(1900, 10)).await;
    assert_eq!(total, 2000);
    assert_eq!(got, want[1900..1910].to_vec());
    // The marker aside: counter items (8 shards: the years, two months, a
    // month's days), one day's entries (144) and the page; a skip reads
    // 1,910.
    let bound = 8 * (2 + 2 + 31) + 144 + 10;
    assert!(
        store.items_read() <= bound,
        "read {} items (bound {bound})",
        store.items_read()
    );
    // A shallow offset is read through: the page and the counters only.
    let store = CountingStore::new(inner);
    let (got, _) = read(&store, &list(), Window::at(20, 10)).await;
    assert_eq!(got, want[20..30].to_vec());
    assert!(store.items_read() <= 30 + 8 * 2, "{}", store.items_read());
}

#[tokio::test]
async fn a_page_after_or_before_a_record_at_any_depth() {
    let (store, all) = seeded(300).await;
    let want = newest_first(&all);
    for at in [0usize, 40, 180, 299] {
        let id = want[at].clone();
        for offset in [0usize, 3, 150] {
            let after = Window {
                offset,
                limit: 10,
                seek: Seek::After(id.clone()),
            };
            let (got, total) = read(&*store, &list(), after).await;
            assert_eq!(total, 300);
            let from = (at + 1 + offset).min(300);
            assert_eq!(
                got,
                want[from..(from + 10).min(300)].to_vec(),
                "after {at} +{offset}"
            );
            let before = Window {
                offset,
                limit: 10,
                seek: Seek::Before(id.clone()),
            };
            let (got, _) = read(&*store, &list(), before).await;
            let end = at.saturating_sub(offset);
            assert_eq!(
                got,
                want[end.saturating_sub(10)..end].to_vec(),
                "before {at} +{offset}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_inserts_keep_totals_exact() {
    let store = memory_store();
    mark_covered(&*store).await;
    let now = ms("2026-11-29T08:00:00.000Z");
    let mut tasks = Vec::new();
    for i in 0..40 {
        let store = store.clone();
        let t = thing(now + i % 3, true);
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                match insert(&*store, &t).await {
                    Ok(()) => return,
                    Err(StoreError::TransactionCanceled { .. }) => tokio::task::yield_now().await,
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("never inserted");
        }));
    }
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let (_, total) = read(&*store, &list(), Window::at(0, 1)).await;
    assert_eq!(total, 40);
    let (deep, _) = read(&*store, &list(), Window::at(120, 1)).await;
    assert!(deep.is_empty());
}

#[tokio::test]
async fn a_delete_takes_its_count_back() {
    let (store, mut all) = seeded(150).await;
    let gone = all.remove(120);
    let mut ops = vec![TxOp::Delete {
        key: gone.item_key(),
        cond: Some(Cond::Exists),
    }];
    ops.extend(list().count_gone(&gone.id, gone.created_at));
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
    let want = newest_first(&all);
    let (got, total) = read(&*store, &list(), Window::at(110, 20)).await;
    assert_eq!(total, 149);
    assert_eq!(got, want[110..130].to_vec());
}

#[tokio::test]
async fn a_list_bounded_by_retention_counts_only_what_it_keeps() {
    let (store, all) = seeded(300).await;
    let since = ms("2025-06-10T13:00:00.000Z");
    let kept: Vec<Thing> = all
        .iter()
        .filter(|t| t.created_at.unix_millis() >= since)
        .cloned()
        .collect();
    let want = newest_first(&kept);
    assert!(want.len() > 120 && want.len() < 300, "{}", want.len());
    let l = list().since(since);
    for offset in [0, 99, 101, want.len() - 1, want.len()] {
        let (got, total) = read(&*store, &l, Window::at(offset, 10)).await;
        assert_eq!(total, want.len() as u64);
        let end = (offset + 10).min(want.len());
        assert_eq!(got, want[offset.min(end)..end].to_vec(), "offset {offset}");
    }
    let after = Window {
        offset: 0,
        limit: 5,
        seek: Seek::After(want[3].clone()),
    };
    let (got, _) = read(&*store, &l, after).await;
    assert_eq!(got, want[4..9].to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_counts_every_older_record_once() {
    let store = memory_store();
    let all = spread(120, false);
    for t in &all {
        insert(&*store, t).await.unwrap_or_else(|e| panic!("{e}"));
    }
    // And some counted by their insert already.
    let mut all = all;
    for i in 0..5 {
        let t = thing(ms("2026-11-29T08:00:00.000Z") + i, true);
        insert(&*store, &t).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(t);
    }
    let want = newest_first(&all);
    assert!(
        !covered(&*store, &tenant(), CountedKind::Links)
            .await
            .unwrap_or(true)
    );
    // Uncovered: skipped and counted through the index, still right.
    let (page, total, _) = page::<Thing>(&*store, &list(), &Window::at(110, 10), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(total, 125);
    assert_eq!(
        page.into_iter().map(|t| t.id).collect::<Vec<_>>(),
        want[110..120].to_vec()
    );
    let q = || Query::partition(PARTITION).on(Index::Gsi1);
    let (a, b) = tokio::join!(
        migrate::<Thing>(&*store, q()),
        migrate::<Thing>(&*store, q())
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(a.listed + b.listed, 120, "{a:?} {b:?}");
    let again = migrate::<Thing>(&*store, q())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.listed, again.already), (0, 125));
    mark_covered(&*store).await;
    for offset in [0, 110, 124] {
        let (got, total) = read(&*store, &list(), Window::at(offset, 10)).await;
        assert_eq!(total, 125);
        assert_eq!(got, want[offset..(offset + 10).min(125)].to_vec());
    }
}

#[test]
fn a_counted_list_of_an_endpoint_keeps_its_own_counters() {
    let a = list().scoped("we_a").count_new("lnk_x", epoch());
    let b = list().count_new("lnk_x", epoch());
    let keys = |ops: &[TxOp]| {
        ops.iter()
            .filter_map(|op| match op {
                TxOp::Update { key, .. } => Some(key.sk.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert!(
        keys(&a).iter().all(|k| k.starts_with("LIST#LNK#we_a#")),
        "{:?}",
        keys(&a)
    );
    assert!(
        keys(&b)
            .iter()
            .all(|k| k.starts_with("LIST#LNK#") && !k.contains("we_a"))
    );
}

fn epoch() -> Timestamp {
    Timestamp::from_unix_millis(0).unwrap_or_else(|| panic!("epoch"))
}
