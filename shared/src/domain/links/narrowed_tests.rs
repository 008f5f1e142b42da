//! Links by `active` (issue 37 item 11): the narrowing by stored `active`
//! paged and counted exactly at any offset, moved by PATCH and cancel,
//! taken back by DELETE, and migrated for older links.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::manage::insert;
use super::{
    CreateLink, LinkError, PatchLink, PaymentLink, cancel, delete, get, list, new_link, patch,
};
use crate::AppState;
use crate::domain::listing::ListsMarker;
use crate::domain::listing::counted::{self, Narrowing};
use crate::domain::record::{Record, Window};
use crate::domain::{Mode, Tenant};
use crate::ids::LinkId;
use crate::store::counting::CountingStore;
use crate::store::{Seek, Store};
use crate::time::Timestamp;

fn tenant() -> Tenant {
    Tenant::new("proj_links", Mode::Sandbox)
}

fn ms(s: &str) -> i64 {
    Timestamp::parse(s)
        .unwrap_or_else(|| panic!("time {s}"))
        .unix_millis()
}

/// A link created at `created` (its id minted then), stored `active`;
/// `narrowed`: entered in its narrowing (else one from before it).
fn link(rng: &mut StdRng, created: i64, active: bool, narrowed: bool) -> PaymentLink {
    let req: CreateLink =
        serde_json::from_value(serde_json::json!({"title": "Box", "amount": 1000}))
            .unwrap_or_else(|e| panic!("{e}"));
    let at = Timestamp::from_unix_millis(created).unwrap_or_else(|| panic!("ms"));
    let mut l = new_link(&tenant(), req, at).unwrap_or_else(|e| panic!("{e:?}"));
    let random: u128 = rng.random::<u128>() & ((1u128 << 80) - 1);
    let ulid = ulid::Ulid::from_parts(u64::try_from(created).unwrap_or(0), random);
    l.id = LinkId::stored(format!("lnk_{}", ulid.to_string().to_ascii_lowercase()));
    l.active = active;
    l.narrowed = narrowed;
    l
}

async fn state_with(marker: ListsMarker) -> AppState {
    let state = AppState::for_tests();
    state
        .store
        .put(marker.to_item().unwrap_or_else(|e| panic!("{e}")), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    state
}

/// `n` links over 90 days, one in three inactive.
async fn seeded(store: &dyn Store, seed: u64, n: usize, narrowed: bool) -> Vec<PaymentLink> {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = ms("2026-11-29T12:00:00.000Z");
    let mut all = Vec::new();
    for _ in 0..n {
        let created = end - rng.random_range(0..90 * 86_400_000i64);
        let active = rng.random_range(0..3) != 0;
        let l = link(&mut rng, created, active, narrowed);
        insert(store, &l).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(l);
    }
    all
}

fn brute(all: &[PaymentLink], active: bool) -> Vec<String> {
    let mut ids: Vec<String> = all
        .iter()
        .filter(|l| l.active == active)
        .map(|l| l.id.as_str().to_owned())
        .collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

fn brute_window(want: &[String], w: &Window) -> Vec<String> {
    let after: Vec<&String> = match &w.seek {
        Seek::After(id) => want.iter().filter(|x| x.as_str() < id.as_str()).collect(),
        _ => want.iter().collect(),
    };
    after
        .into_iter()
        .skip(w.offset)
        .take(w.limit)
        .cloned()
        .collect()
}

async fn read(state: &AppState, active: bool, w: &Window) -> (Vec<String>, u64) {
    let (page, total) = list(state, &tenant(), Some(active), w.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (
        page.into_iter().map(|l| l.id.as_str().to_owned()).collect(),
        total,
    )
}

async fn assert_exact(state: &AppState, all: &[PaymentLink], rng: &mut StdRng) {
    for active in [true, false] {
        let want = brute(all, active);
        let n = want.len();
        for offset in [
            0,
            1,
            99,
            100,
            101,
            140,
            n / 2,
            n.saturating_sub(1),
            n,
            n + 3,
        ] {
            let w = Window::at(offset, 10);
            let (got, total) = read(state, active, &w).await;
            assert_eq!(total, n as u64, "active {active}");
            assert_eq!(
                got,
                brute_window(&want, &w),
                "active {active} offset {offset}"
            );
        }
        for _ in 0..4 {
            let from = all[rng.random_range(0..all.len())].id.as_str().to_owned();
            for offset in [0, 130] {
                let w = Window {
                    offset,
                    limit: 10,
                    seek: Seek::After(from.clone()),
                };
                let (got, total) = read(state, active, &w).await;
                assert_eq!(total, n as u64);
                assert_eq!(got, brute_window(&want, &w), "active {active} {w:?}");
            }
        }
    }
}

#[tokio::test]
async fn links_by_active_page_and_count_exactly_at_any_offset() {
    let state = state_with(ListsMarker::new(&tenant())).await;
    let all = seeded(&*state.store, 5, 360, true).await;
    let mut rng = StdRng::seed_from_u64(6);
    assert_exact(&state, &all, &mut rng).await;
}

#[tokio::test]
async fn a_deep_offset_of_inactive_links_reads_a_bounded_number_of_items() {
    let mut state = state_with(ListsMarker::new(&tenant())).await;
    let mut rng = StdRng::seed_from_u64(8);
    let start = ms("2026-10-20T00:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..2000i64 {
        let l = link(&mut rng, start + i * 600_000, i % 10 != 0, true);
        insert(&*state.store, &l)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        all.push(l);
    }
    let counting = Arc::new(CountingStore::new(Arc::clone(&state.store)));
    state.store = counting.clone();
    let want = brute(&all, false);
    let w = Window::at(150, 10);
    let (got, total) = read(&state, false, &w).await;
    assert_eq!(total, 200);
    assert_eq!(got, brute_window(&want, &w));
    let bound = 8 * (2 + 2 + 31) + 15 + 10 + 1;
    assert!(
        counting.items_read() <= bound,
        "read {}",
        counting.items_read()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_patches_and_cancels_keep_the_totals_exact() {
    let state = state_with(ListsMarker::new(&tenant())).await;
    let all = seeded(&*state.store, 9, 120, true).await;
    let now = Timestamp::parse("2026-11-29T13:00:00Z").unwrap_or_else(|| panic!("now"));
    // Every link flipped by a PATCH, the active ones also cancelled at
    // the same moment (one of the two moves it to inactive).
    let tasks = all.iter().flat_map(|l| {
        let flip = {
            let state = state.clone();
            let id = l.id.clone();
            let to = !l.active;
            tokio::spawn(async move {
                let p: PatchLink = serde_json::from_value(serde_json::json!({"active": to}))
                    .unwrap_or_else(|e| panic!("{e}"));
                patch(&state, &tenant(), &id, p, now, Vec::new())
                    .await
                    .map(|_| ())
                    .unwrap_or_else(|e| panic!("{e:?}"));
            })
        };
        let cancelling = l.active.then(|| {
            let state = state.clone();
            let id = l.id.clone();
            tokio::spawn(async move {
                match cancel(&state, &tenant(), &id, now, Vec::new()).await {
                    Ok(_) | Err(LinkError::Inactive) => {}
                    Err(e) => panic!("{e:?}"),
                }
            })
        });
        std::iter::once(flip).chain(cancelling)
    });
    for t in futures::future::join_all(tasks).await {
        t.unwrap_or_else(|e| panic!("{e}"));
    }
    // As stored now.
    let mut now_all = Vec::new();
    for l in &all {
        now_all.push(
            get(&state, &l.id)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("gone")),
        );
    }
    let mut rng = StdRng::seed_from_u64(10);
    assert_exact(&state, &now_all, &mut rng).await;
    // A delete takes its narrowed count back.
    let gone = &now_all[0];
    delete(&state, &tenant(), &gone.id)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    now_all.remove(0);
    assert_exact(&state, &now_all, &mut rng).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_narrows_older_links_once_and_the_old_way_answers_until_then() {
    let mut marker = ListsMarker::new(&tenant());
    marker.links_by_active = false;
    let state = state_with(marker).await;
    let mut all = seeded(&*state.store, 13, 140, false).await;
    let now = Timestamp::parse("2026-11-29T13:00:00Z").unwrap_or_else(|| panic!("now"));
    // A cancel and a delete before the migration: nothing narrowed moves.
    let i = all
        .iter()
        .position(|l| l.active)
        .unwrap_or_else(|| panic!("an active link"));
    cancel(&state, &tenant(), &all[i].id, now, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    all[i].active = false;
    delete(&state, &tenant(), &all[0].id)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    all.remove(0);
    // Uncovered: the old way, exactly.
    for active in [true, false] {
        let want = brute(&all, active);
        for offset in [0, 7, 40] {
            let w = Window::at(offset, 10);
            let (got, total) = read(&state, active, &w).await;
            assert_eq!(total, want.len() as u64);
            assert_eq!(got, brute_window(&want, &w));
        }
    }
    let q = || PaymentLink::counted_list_of(&tenant()).all();
    let (a, b) = tokio::join!(
        counted::migrate_narrowed::<PaymentLink>(&*state.store, q()),
        counted::migrate_narrowed::<PaymentLink>(&*state.store, q())
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(a.listed + b.listed, 139, "{a:?} {b:?}");
    let again = counted::migrate_narrowed::<PaymentLink>(&*state.store, q())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.listed, again.already), (0, 139));
    state
        .store
        .transact(vec![ListsMarker::mark_narrowing(
            &tenant(),
            Narrowing::LinksByActive,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        counted::covered_narrowing(&*state.store, &tenant(), Narrowing::LinksByActive)
            .await
            .unwrap_or(false)
    );
    let mut rng = StdRng::seed_from_u64(14);
    assert_exact(&state, &all, &mut rng).await;
}

/// Every write of a link's `active` goes through
/// `PaymentLink::active_change` (which moves its narrowed entry and
/// counts), every insert counts through `insert_counts`.
#[test]
fn active_is_set_only_through_active_change() {
    let mut found = Vec::new();
    for (name, flat) in crate::testenv::flat_sources(&["shared/src"]) {
        for (needle, allowed) in [
            (
                "set(PaymentLink::ACTIVE",
                usize::from(name == "shared/src/domain/links/mod.rs"),
            ),
            ("link.count_new()", 0),
        ] {
            let n = flat.matches(needle).count();
            if n != allowed {
                found.push(format!("{name}: {n} × {needle}"));
            }
        }
    }
    assert!(found.is_empty(), "outside active_change: {found:?}");
}
