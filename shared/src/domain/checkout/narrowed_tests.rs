//! Sessions by status (issue 37 item 11): the narrowings by stored status
//! merged with lazy expiry, against a brute-force filter of every session
//! as of now.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::expiry::{expire_in, list_in};
use super::{CheckoutSession, Creator, SessionStatus, new_session, validate_create};
use crate::domain::listing::ListsMarker;
use crate::domain::listing::counted::{self, Narrowing};
use crate::domain::record::{Record, Window};
use crate::domain::{Mode, Tenant};
use crate::ids::SessionId;
use crate::store::counting::CountingStore;
use crate::store::{Seek, Store, StoreError};
use crate::testenv::memory_store;
use crate::time::Timestamp;

fn tenant() -> Tenant {
    Tenant::new("proj_narrow", Mode::Sandbox)
}

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"))
}

fn ms(s: &str) -> i64 {
    Timestamp::parse(s)
        .unwrap_or_else(|| panic!("time {s}"))
        .unix_millis()
}

/// The session created at `created` (its id minted then), stored as
/// `status`, open until `expires`; `narrowed`: entered in its status's
/// narrowing (else one from before it).
fn session(
    rng: &mut StdRng,
    created: i64,
    status: SessionStatus,
    expires: i64,
    narrowed: bool,
) -> CheckoutSession {
    let valid = validate_create(
        serde_json::from_value(
            serde_json::json!({"amount": 5000, "returnUrl": "https://shop.example/done"}),
        )
        .unwrap_or_else(|e| panic!("{e}")),
        Mode::Sandbox,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let creator = Creator {
        project_id: tenant().project,
        mode: Mode::Sandbox,
        api_key_id: "ak_narrow".into(),
        spend_cap_paisa: None,
    };
    let mut s = new_session(&creator, valid, ts(created));
    let random: u128 = rng.random::<u128>() & ((1u128 << 80) - 1);
    let ulid = ulid::Ulid::from_parts(u64::try_from(created).unwrap_or(0), random);
    s.id = SessionId::stored(format!("cs_{}", ulid.to_string().to_ascii_lowercase()));
    s.status = status;
    s.expires_at = ts(expires);
    s.narrowed = narrowed;
    s
}

/// Its insert: the record and its counts (the list's, and its status's
/// when narrowed).
async fn insert(store: &dyn Store, s: &CheckoutSession) -> Result<(), StoreError> {
    let mut ops = vec![s.put_new()?];
    ops.extend(if s.narrowed {
        s.insert_counts()
    } else {
        s.count_new()
    });
    store.transact(ops).await
}

async fn covered_store() -> Arc<dyn Store> {
    let store = memory_store();
    let marker = ListsMarker::new(&tenant());
    store
        .put(marker.to_item().unwrap_or_else(|e| panic!("{e}")), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
}

const NOW: &str = "2026-11-29T12:00:00.000Z";

/// `n` sessions over the 60 days before now, of every status; about one
/// open session in three past its time (overdue), wherever in the list.
async fn seeded(store: &dyn Store, seed: u64, n: usize, narrowed: bool) -> Vec<CheckoutSession> {
    let mut rng = StdRng::seed_from_u64(seed);
    let now = ms(NOW);
    let mut all = Vec::new();
    for _ in 0..n {
        // Several of one millisecond now and then.
        let created = match all.last() {
            Some(prev) if rng.random_range(0..10) == 0 => {
                let prev: &CheckoutSession = prev;
                prev.created_at.unix_millis()
            }
            _ => now - rng.random_range(0..60 * 86_400_000i64),
        };
        let status = SessionStatus::ALL[rng.random_range(0..5)];
        let expires = if rng.random_range(0..3) == 0 {
            now - rng.random_range(0..3_600_000)
        } else {
            now + rng.random_range(1..3_600_000)
        };
        let s = session(&mut rng, created, status, expires, narrowed);
        insert(store, &s).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(s);
    }
    all
}

/// The ids of `all` as of now in `status`, newest first.
fn brute(all: &[CheckoutSession], status: SessionStatus) -> Vec<String> {
    let now = ts(ms(NOW));
    let mut ids: Vec<String> = all
        .iter()
        .filter(|s| s.status_at(now) == status)
        .map(|s| s.id.as_str().to_owned())
        .collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

/// What a window of the filtered list holds, by brute force.
fn brute_window(want: &[String], window: &Window) -> Vec<String> {
    match &window.seek {
        Seek::Start => want
            .iter()
            .skip(window.offset)
            .take(window.limit)
            .cloned()
            .collect(),
        Seek::After(id) => want
            .iter()
            .filter(|x| x.as_str() < id.as_str())
            .skip(window.offset)
            .take(window.limit)
            .cloned()
            .collect(),
        Seek::Before(id) => {
            let newer: Vec<&String> = want.iter().filter(|x| x.as_str() > id.as_str()).collect();
            let end = newer.len().saturating_sub(window.offset);
            let start = end.saturating_sub(window.limit);
            newer[start..end].iter().map(|x| (*x).clone()).collect()
        }
    }
}

async fn read(store: &dyn Store, status: SessionStatus, window: &Window) -> (Vec<String>, u64) {
    let (page, total) = list_in(store, &tenant(), Some(status), ts(ms(NOW)), window.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (
        page.into_iter().map(|s| s.id.as_str().to_owned()).collect(),
        total,
    )
}

async fn assert_exact(store: &dyn Store, all: &[CheckoutSession], rng: &mut StdRng) {
    for status in SessionStatus::ALL {
        let want = brute(all, status);
        let n = want.len();
        let mut offsets = vec![
            0,
            1,
            7,
            99,
            100,
            101,
            150,
            n / 2,
            n.saturating_sub(1),
            n,
            n + 5,
        ];
        offsets.extend((0..4).map(|_| rng.random_range(0..n + 2)));
        for offset in offsets {
            for limit in [1, 10, 25] {
                let w = Window::at(offset, limit);
                let (got, total) = read(store, status, &w).await;
                assert_eq!(total, n as u64, "{status:?} total");
                assert_eq!(
                    got,
                    brute_window(&want, &w),
                    "{status:?} offset {offset} limit {limit}"
                );
            }
        }
        // Seeks from any session's id (in the list or not).
        for _ in 0..6 {
            let from = all[rng.random_range(0..all.len())].id.as_str().to_owned();
            for offset in [0, 3, 120] {
                for w in [
                    Window {
                        offset,
                        limit: 10,
                        seek: Seek::After(from.clone()),
                    },
                    Window {
                        offset,
                        limit: 10,
                        seek: Seek::Before(from.clone()),
                    },
                ] {
                    let (got, total) = read(store, status, &w).await;
                    assert_eq!(total, n as u64, "{status:?} total");
                    assert_eq!(got, brute_window(&want, &w), "{status:?} {w:?}");
                }
            }
        }
    }
}

#[tokio::test]
async fn status_lists_equal_a_brute_force_filter_at_any_offset_and_seek() {
    for seed in [1u64, 2, 3] {
        let store = covered_store().await;
        let all = seeded(&*store, seed, 420, true).await;
        let mut rng = StdRng::seed_from_u64(seed + 100);
        assert_exact(&*store, &all, &mut rng).await;
    }
}

#[tokio::test]
async fn a_deep_offset_of_a_status_reads_a_bounded_number_of_items() {
    let inner = covered_store().await;
    let mut rng = StdRng::seed_from_u64(7);
    let now = ms(NOW);
    let start = now - 20 * 86_400_000;
    let mut all = Vec::new();
    for i in 0..2000i64 {
        // Expired is rare (one in ten); a few open ones past their time.
        let (status, expires) = match i % 50 {
            0 => (SessionStatus::Pending, now - 60_000),
            n if n % 10 == 5 => (SessionStatus::Expired, now - 86_400_000),
            _ => (SessionStatus::Success, now - 86_400_000),
        };
        let s = session(&mut rng, start + i * 800_000, status, expires, true);
        insert(&*inner, &s).await.unwrap_or_else(|e| panic!("{e}"));
        all.push(s);
    }
    let store = CountingStore::new(Arc::clone(&inner));
    for status in [
        SessionStatus::Expired,
        SessionStatus::Pending,
        SessionStatus::Success,
    ] {
        let want = brute(&all, status);
        let offset = want.len().saturating_sub(30).min(150);
        let before = store.items_read();
        let w = Window::at(offset, 10);
        let (got, total) = read(&store, status, &w).await;
        assert_eq!(total, want.len() as u64);
        assert_eq!(got, brute_window(&want, &w));
        // Counters walked to a day (8 shards × years, months, days), the
        // overdue (40), the day's entries and the page widened by them.
        let bound = 8 * (2 + 2 + 31) + 40 + 2 * 72 + 10 + 40;
        let read = store.items_read() - before;
        assert!(read <= bound, "{status:?} read {read}");
    }
}

#[tokio::test]
async fn more_overdue_sessions_than_merged_is_refused_not_answered_wrong() {
    let store = covered_store().await;
    let mut rng = StdRng::seed_from_u64(9);
    let now = ms(NOW);
    for i in 0..=super::expiry::MAX_OVERDUE as i64 {
        let s = session(
            &mut rng,
            now - 7_200_000 + i,
            SessionStatus::Pending,
            now - 1,
            true,
        );
        insert(&*store, &s).await.unwrap_or_else(|e| panic!("{e}"));
    }
    for status in [SessionStatus::Expired, SessionStatus::Pending] {
        let r = list_in(&*store, &tenant(), Some(status), ts(now), Window::first(5)).await;
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    }
    // Stored statuses alone are unaffected.
    let r = list_in(
        &*store,
        &tenant(),
        Some(SessionStatus::Success),
        ts(now),
        Window::first(5),
    )
    .await;
    assert_eq!(r.map(|(p, t)| (p.len(), t)), Ok((0, 0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_status_changes_keep_every_list_exact() {
    let store = covered_store().await;
    let mut all = seeded(&*store, 11, 160, true).await;
    let now = ts(ms(NOW));
    // Every open session expired at once, each twice over (one moves it).
    let open: Vec<usize> = (0..all.len())
        .filter(|&i| !all[i].status.is_final())
        .collect();
    let tasks = open.iter().flat_map(|&i| [i, i]).map(|i| {
        let store = Arc::clone(&store);
        let id = all[i].id.clone();
        async move {
            expire_in(&*store, &tenant(), &id, now)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }
    });
    futures::future::join_all(tasks).await;
    for &i in &open {
        all[i].status = SessionStatus::Expired;
    }
    let mut rng = StdRng::seed_from_u64(12);
    assert_exact(&*store, &all, &mut rng).await;
    for status in SessionStatus::ALL {
        // The narrowing's own count agrees (nothing counted twice).
        let (_, stored, _) = counted::page::<CheckoutSession>(
            &*store,
            &CheckoutSession::by_status(&tenant(), status),
            &Window::first(1),
            true,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let want = all.iter().filter(|s| s.status == status).count();
        assert_eq!(stored, want as u64, "{status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_narrows_older_sessions_once_and_the_old_way_answers_until_then() {
    let store = memory_store();
    // Counted in the list, not narrowed: from before the narrowing.
    let mut marker = ListsMarker::new(&tenant());
    marker.sessions_by_status = false;
    store
        .put(marker.to_item().unwrap_or_else(|e| panic!("{e}")), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut all = seeded(&*store, 21, 150, false).await;
    let now = ts(ms(NOW));
    // A status change before the migration: moved, not counted.
    let first_open = all
        .iter()
        .position(|s| !s.status.is_final() && s.expires_at > now)
        .unwrap_or_else(|| panic!("an open session"));
    let moved = expire_in(&*store, &tenant(), &all[first_open].id, now)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(moved.map(|s| s.status), Some(SessionStatus::Expired));
    all[first_open].status = SessionStatus::Expired;
    // Uncovered: answered the old way, exactly.
    let mut rng = StdRng::seed_from_u64(22);
    for status in SessionStatus::ALL {
        let want = brute(&all, status);
        for offset in [0, 3, 20] {
            let w = Window::at(offset, 10);
            let (got, total) = read(&*store, status, &w).await;
            assert_eq!(total, want.len() as u64, "{status:?}");
            assert_eq!(got, brute_window(&want, &w), "{status:?} {offset}");
        }
    }
    let all_q = || CheckoutSession::counted_list_of(&tenant()).all();
    let (a, b) = tokio::join!(
        counted::migrate_narrowed::<CheckoutSession>(&*store, all_q()),
        counted::migrate_narrowed::<CheckoutSession>(&*store, all_q())
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(a.listed + b.listed, 150, "{a:?} {b:?}");
    let again = counted::migrate_narrowed::<CheckoutSession>(&*store, all_q())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.listed, again.already), (0, 150));
    assert!(
        !counted::covered_narrowing(&*store, &tenant(), Narrowing::SessionsByStatus)
            .await
            .unwrap_or(true)
    );
    store
        .transact(vec![ListsMarker::mark_narrowing(
            &tenant(),
            Narrowing::SessionsByStatus,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        counted::covered_narrowing(&*store, &tenant(), Narrowing::SessionsByStatus)
            .await
            .unwrap_or(false)
    );
    assert_exact(&*store, &all, &mut rng).await;
}

/// Every write of a session's status goes through
/// `CheckoutSession::status_change` (which moves its narrowed entry and
/// counts), and every insert counts through `insert_counts`: no other code
/// of the crate sets the status or counts a new session in its list alone.
#[test]
fn session_statuses_are_set_only_through_status_change() {
    let mut found = Vec::new();
    for (name, flat) in crate::testenv::flat_sources(&["shared/src"]) {
        for (needle, allowed) in [
            (
                "set(CheckoutSession::STATUS",
                usize::from(name == "shared/src/domain/checkout/sessions.rs"),
            ),
            ("session.count_new()", 0),
        ] {
            let n = flat.matches(needle).count();
            if n != allowed {
                found.push(format!("{name}: {n} × {needle}"));
            }
        }
    }
    assert!(found.is_empty(), "outside status_change: {found:?}");
}
