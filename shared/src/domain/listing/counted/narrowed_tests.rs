//! Narrowings of a counted list ([`CountedList::narrowed`]): a record
//! entered and counted per value of a filter, moved when the value
//! changes, and the migration of records from before the narrowing.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    CountedKind, CountedList, Narrowed, Narrowing, covered_narrowing, is_conflict,
    migrate_narrowed, page,
};
use crate::domain::Mode;
use crate::domain::listing::ListsMarker;
use crate::domain::record::Entry;
use crate::domain::record::{Attr, Changes, Record, Window};
use crate::ids::ProjectId;
use crate::kinds::Tenant;
use crate::store::counting::CountingStore;
use crate::store::{Cond, Index, Key, Query, Store, StoreError, TxOp};
use crate::testenv::memory_store;
use crate::time::Timestamp;

/// A record of a counted list narrowed by its `color`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Tile {
    id: String,
    project_id: ProjectId,
    mode: Mode,
    created_at: Timestamp,
    color: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    counted: bool,
    /// Its `gsi4` partition, read as whether it is narrowed.
    #[serde(
        default,
        rename = "gsi4pk",
        deserialize_with = "crate::domain::listing::present",
        skip_serializing
    )]
    narrowed: bool,
}

crate::attrs! { Tile {
    COLOR: String = color,
    COUNTED: bool = counted,
    NARROWED: bool = narrowed as "gsi4pk",
} }

const PARTITION: &str = "PROJ#proj_tiles#live#TILES";

fn tenant() -> Tenant {
    Tenant::new("proj_tiles", Mode::Live)
}

fn list() -> CountedList {
    CountedList::new(CountedKind::Links, tenant(), PARTITION.into())
}

fn by_color(color: &str) -> CountedList {
    list().narrowed(
        &format!("c_{color}"),
        Index::Gsi4,
        format!("{PARTITION}#C#{color}"),
    )
}

impl Tile {
    fn entry(&self, color: &str) -> Entry {
        let l = by_color(color);
        Entry {
            index: Index::Gsi4,
            partition: l.partition,
            sort: self.id.clone(),
        }
    }
}

impl Record for Tile {
    fn item_key(&self) -> Key {
        Key::new(format!("TILE#{}", self.id), "R")
    }

    fn entries(&self) -> Vec<Entry> {
        let mut out = vec![Entry::gsi1(PARTITION, self.id.clone())];
        if self.narrowed {
            out.push(self.entry(&self.color));
        }
        out
    }
}

impl Narrowed for Tile {
    const NARROWED: Attr<Self, bool> = Tile::NARROWED;
    fn is_narrowed(&self) -> bool {
        self.narrowed
    }
    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>) {
        (
            Changes::new().enter([self.entry(&self.color)]),
            by_color(&self.color).count_new(&self.id, self.created_at),
        )
    }
    fn narrowed_as_read(&self) -> Cond {
        Tile::COLOR.eq(&self.color)
    }
}

fn ms(s: &str) -> i64 {
    Timestamp::parse(s)
        .unwrap_or_else(|| panic!("time {s}"))
        .unix_millis()
}

fn tile(ms: i64, color: &str, narrowed: bool) -> Tile {
    Tile {
        id: super::super::id_key("lnk_", ms, rand::random::<u128>()),
        project_id: tenant().project,
        mode: Mode::Live,
        created_at: Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms")),
        color: color.into(),
        counted: true,
        narrowed,
    }
}

/// Its insert: the record, counted in the list and (when narrowed) in its
/// color's narrowing, the counter writes folded per item.
async fn insert(store: &dyn Store, t: &Tile) -> Result<(), StoreError> {
    let mut ops = vec![t.put_new()?];
    let mut counts = list().count_new(&t.id, t.created_at);
    if t.narrowed {
        crate::domain::listing::merge_counts(
            &mut counts,
            by_color(&t.color).count_new(&t.id, t.created_at),
        );
    }
    ops.extend(counts);
    store.transact(ops).await
}

/// Moves `t` to `color`: its entry and its count, conditioned on the
/// color read.
async fn recolor(store: &dyn Store, t: &Tile, color: &str) -> Result<(), StoreError> {
    let mut ops = vec![TxOp::Update {
        key: t.item_key(),
        update: Changes::<Tile>::new()
            .set(Tile::COLOR, &color.to_owned())
            .enter([t.entry(color)])
            .into(),
        cond: Some(Tile::COLOR.eq(&t.color)),
    }];
    ops.extend(by_color(&t.color).count_moved(&by_color(color), &t.id, t.created_at));
    store.transact(ops).await
}

fn colors(i: usize) -> &'static str {
    ["red", "blue", "red", "green", "red"][i % 5]
}

async fn seeded(n: usize, narrowed: bool) -> (Arc<dyn Store>, Vec<Tile>) {
    let store = memory_store();
    store
        .transact(vec![ListsMarker::mark_counted(
            &tenant(),
            CountedKind::Links,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let base = ms("2025-12-28T22:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..n {
        let step = [0, 1, 3_600_000 * 7, 86_400_000 * 9 + 5][i % 4];
        let t = tile(base + (i as i64) * 86_400_000 + step, colors(i), narrowed);
        insert(&*store, &t).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(t);
    }
    (store, all)
}

fn newest_first(all: &[Tile], color: &str) -> Vec<String> {
    let mut ids: Vec<String> = all
        .iter()
        .filter(|t| t.color == color)
        .map(|t| t.id.clone())
        .collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

async fn read(store: &dyn Store, l: &CountedList, window: Window) -> (Vec<String>, u64) {
    let (page, total, _) = page::<Tile>(store, l, &window, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (page.into_iter().map(|t| t.id).collect(), total)
}

async fn assert_exact(store: &dyn Store, all: &[Tile]) {
    for color in ["red", "blue", "green"] {
        let want = newest_first(all, color);
        for offset in [
            0,
            3,
            100,
            101,
            140,
            want.len().saturating_sub(1),
            want.len() + 4,
        ] {
            let (got, total) = read(store, &by_color(color), Window::at(offset, 9)).await;
            assert_eq!(total, want.len() as u64, "{color}");
            let end = (offset + 9).min(want.len());
            assert_eq!(
                got,
                want.get(offset..end)
                    .map(<[String]>::to_vec)
                    .unwrap_or_default(),
                "{color} offset {offset}"
            );
        }
    }
}

#[tokio::test]
async fn a_narrowing_pages_and_counts_its_value_exactly_at_any_offset() {
    let (store, all) = seeded(420, true).await;
    assert_exact(&*store, &all).await;
    // The whole list keeps its own count.
    let (_, total) = read(&*store, &list(), Window::at(300, 5)).await;
    assert_eq!(total, 420);
}

#[tokio::test]
async fn a_deep_offset_of_a_narrowing_reads_a_bounded_number_of_items() {
    let inner = memory_store();
    inner
        .transact(vec![ListsMarker::mark_counted(
            &tenant(),
            CountedKind::Links,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let start = ms("2026-10-20T00:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..2000i64 {
        // Blue is rare: one in ten.
        let color = if i % 10 == 0 { "blue" } else { "red" };
        let t = tile(start + i * 600_000, color, true);
        insert(&*inner, &t).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(t);
    }
    let want = newest_first(&all, "blue");
    let store = CountingStore::new(Arc::clone(&inner));
    let (got, total) = read(&store, &by_color("blue"), Window::at(150, 10)).await;
    assert_eq!(total, 200);
    assert_eq!(got, want[150..160].to_vec());
    let bound = 8 * (2 + 2 + 31) + 15 + 10;
    assert!(store.items_read() <= bound, "read {}", store.items_read());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moving_records_between_values_keeps_every_page_exact() {
    let (store, mut all) = seeded(300, true).await;
    // Racing moves of different records (counter shards conflict: retry).
    let moves: Vec<(usize, &str)> = (0..60).map(|i| (i * 5, "blue")).collect();
    let tasks = moves.iter().map(|&(i, color)| {
        let store = Arc::clone(&store);
        let t = all[i].clone();
        async move {
            let mut tries = 0;
            loop {
                match recolor(&*store, &t, color).await {
                    Ok(()) => return,
                    Err(e) if is_conflict(&e) && tries < 20 => {
                        tries += 1;
                        crate::store::contention_backoff(tries).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    });
    futures::future::join_all(tasks).await;
    for &(i, color) in &moves {
        all[i].color = color.into();
    }
    assert_exact(&*store, &all).await;
    // A move to the same value counts nothing.
    assert!(
        by_color("red")
            .count_moved(&by_color("red"), "lnk_x", all[0].created_at)
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_narrows_every_older_record_once() {
    let (store, mut all) = seeded(150, false).await;
    for i in 0..4 {
        let t = tile(ms("2026-11-29T08:00:00.000Z") + i, "green", true);
        insert(&*store, &t).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(t);
    }
    assert!(
        !covered_narrowing(&*store, &tenant(), Narrowing::LinksByActive)
            .await
            .unwrap_or(true)
    );
    let q = || Query::partition(PARTITION).on(Index::Gsi1);
    let (a, b) = tokio::join!(
        migrate_narrowed::<Tile>(&*store, q()),
        migrate_narrowed::<Tile>(&*store, q())
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(a.listed + b.listed, 150, "{a:?} {b:?}");
    let again = migrate_narrowed::<Tile>(&*store, q())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.listed, again.already), (0, 154));
    store
        .transact(vec![ListsMarker::mark_narrowing(
            &tenant(),
            Narrowing::LinksByActive,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        covered_narrowing(&*store, &tenant(), Narrowing::LinksByActive)
            .await
            .unwrap_or(false)
    );
    assert_exact(&*store, &all).await;
}
