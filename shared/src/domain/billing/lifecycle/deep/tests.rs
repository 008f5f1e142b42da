//! The subscriptions' counted list (issue 37 item 11): any page reaches
//! its subscriptions at a cost that does not grow with the history, the
//! total from the counters stays exact under racing creates, an older
//! project's subscriptions are counted by the lists migration (and a
//! write from a read before it cannot undo its mark), and a filtered list
//! keeps its window.

use std::sync::Arc;

use serde_json::json;

use super::super::*;
use crate::domain::Mode;
use crate::domain::billing::customers::CreateCustomer;
use crate::domain::billing::plans::CreatePlan;
use crate::domain::billing::subscription;
use crate::domain::listing::ListsMarker;
use crate::domain::lists_migration;
use crate::domain::record::Record;
use crate::store::Store;
use crate::store::counting::CountingStore;
use crate::testenv::at;
use crate::time::ManualClock;
use crate::{AppState, Config};

const NOW: &str = "2026-01-10T06:00:00Z";

fn deps_on(store: Arc<dyn Store>) -> AppState {
    AppState::new(
        store,
        Arc::new(ManualClock::new(at(NOW))),
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn tenant() -> Tenant {
    Tenant::new("proj_subdeep", Mode::Sandbox)
}

async fn mark_covered(store: &dyn Store) {
    store
        .transact(vec![ListsMarker::mark_counted(
            &tenant(),
            CountedKind::Subscriptions,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A customer and a plan of the tenant.
async fn customer_and_plan(deps: &Deps) -> (CustomerId, PlanId) {
    let body: CreateCustomer =
        serde_json::from_value(json!({"name": "Sita Rai"})).unwrap_or_else(|e| panic!("{e}"));
    let c = customers::create(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let body: CreatePlan = serde_json::from_value(
        json!({"name": "Fibre 50", "amount": 150_000, "intervalUnit": "month"}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let p = plans::create(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (c.id, p.id)
}

/// A subscription created as the API creates one.
async fn subscribe(deps: &Deps, c: &CustomerId, p: &PlanId) -> Subscription {
    let body: CreateSubscription =
        serde_json::from_value(json!({"customerId": c, "planId": p, "trialDays": 14}))
            .unwrap_or_else(|e| panic!("{e}"));
    create_subscription(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .subscription
}

/// `template` again, minted at `ms` (its id's time), counted or not (an
/// older project's: written before the counters).
fn minted(template: &Subscription, ms: i64, counted: bool) -> Subscription {
    let ulid = ulid::Ulid::from_parts(
        u64::try_from(ms).unwrap_or(0),
        rand::random::<u128>() & ((1u128 << 80) - 1),
    );
    let mut s = template.clone();
    s.id = SubscriptionId::stored(format!("sub_{}", ulid.to_string().to_ascii_lowercase()));
    s.created_at = Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"));
    s.counted = counted;
    s
}

/// Written as a create writes it (with its counts when counted).
async fn insert(store: &dyn Store, s: &Subscription) {
    let mut ops = vec![s.put_new().unwrap_or_else(|e| panic!("{e}"))];
    if s.counted {
        ops.extend(s.count_new());
    }
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
}

fn newest_first(all: &[Subscription]) -> Vec<String> {
    let mut ids: Vec<String> = all.iter().map(|s| s.id.to_string()).collect();
    ids.sort();
    ids.reverse();
    ids
}

async fn page_of(d: &Deps, page: usize, limit: usize) -> (Vec<String>, u64) {
    let (found, total) = list(
        d,
        &tenant(),
        PageRequest { page, limit },
        &ListFilter::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    (found.iter().map(|s| s.id.to_string()).collect(), total)
}

fn ms(s: &str) -> i64 {
    at(s).unix_millis()
}

/// Minted over years, months, days and within a day.
fn spread(template: &Subscription, n: usize, counted: bool) -> Vec<Subscription> {
    let base = ms("2024-11-28T22:00:00Z");
    (0..n)
        .map(|i| {
            let step = match i % 5 {
                0 => 0,
                1 => 3_600_000 * 5,
                2 => 86_400_000 * 3 + 1,
                3 => 86_400_000 * 17,
                _ => 1,
            };
            minted(template, base + (i as i64) * 86_400_000 * 2 + step, counted)
        })
        .collect()
}

#[tokio::test]
async fn every_page_reaches_its_subscriptions_and_totals_are_counted() {
    let store = crate::testenv::memory_store();
    mark_covered(&*store).await;
    let d = deps_on(store.clone());
    let (c, p) = customer_and_plan(&d).await;
    let real = subscribe(&d, &c, &p).await;
    let mut all = spread(&real, 200, true);
    for s in &all {
        insert(&*store, s).await;
    }
    all.push(real);
    let want = newest_first(&all);
    for limit in [1, 7, 50] {
        for page in [1, 2, 15, 29, 30, 120, 200, 201, 202, 9_000] {
            let (got, total) = page_of(&d, page, limit).await;
            assert_eq!(total, 201);
            let from = ((page - 1) * limit).min(201);
            let to = (from + limit).min(201);
            assert_eq!(got, want[from..to].to_vec(), "page {page} limit {limit}");
        }
    }
}

#[tokio::test]
async fn a_deep_page_reads_a_bounded_number_of_items() {
    let inner = crate::testenv::memory_store();
    mark_covered(&*inner).await;
    let d = deps_on(inner.clone());
    let (c, p) = customer_and_plan(&d).await;
    let real = subscribe(&d, &c, &p).await;
    let start = ms("2025-10-20T00:00:00Z");
    let mut all = vec![real.clone()];
    for i in 0..1500i64 {
        let s = minted(&real, start + i * 600_000, true);
        insert(&*inner, &s).await;
        all.push(s);
    }
    let want = newest_first(&all);
    let counting = Arc::new(CountingStore::new(Arc::clone(&inner)));
    let d = deps_on(counting.clone());
    let (got, total) = page_of(&d, 141, 10).await;
    assert_eq!(total, 1501);
    assert_eq!(got, want[1400..1410].to_vec());
    // The marker, counter items (8 shards: two years, three months, a
    // month's days), one day's subscriptions (144) and the page; reading
    // through would read 1,410.
    let bound = 1 + 8 * (2 + 3 + 31) + 144 + 10;
    assert!(
        counting.items_read() <= bound,
        "read {} items (bound {bound})",
        counting.items_read()
    );
    let (past, total) = page_of(&d, 101, 100).await;
    assert!(past.is_empty());
    assert_eq!(total, 1501);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_keep_the_total_exact() {
    let store = crate::testenv::memory_store();
    mark_covered(&*store).await;
    let d = deps_on(store);
    let (c, p) = customer_and_plan(&d).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (d, c, p) = (d.clone(), c.clone(), p.clone());
        tasks.push(tokio::spawn(async move { subscribe(&d, &c, &p).await }));
    }
    let mut made = Vec::new();
    for t in tasks {
        made.push(t.await.unwrap_or_else(|e| panic!("{e}")));
    }
    let (got, total) = page_of(&d, 1, 100).await;
    assert_eq!(total, 20);
    assert_eq!(got, newest_first(&made));
    let (last, _) = page_of(&d, 20, 1).await;
    assert_eq!(last.len(), 1);
    let (past, _) = page_of(&d, 21, 1).await;
    assert!(past.is_empty());
}

#[tokio::test]
async fn an_older_project_is_counted_by_the_migration() {
    let store = crate::testenv::memory_store();
    let d = deps_on(store.clone());
    let (c, p) = customer_and_plan(&d).await;
    let real = subscribe(&d, &c, &p).await;
    let older = spread(&real, 50, false);
    for s in &older {
        insert(&*store, s).await;
    }
    let mut all = older.clone();
    all.push(real.clone());
    let want = newest_first(&all);
    // No marker: served as before (counted and skipped through the index).
    let (got, total) = page_of(&d, 5, 7).await;
    assert_eq!(total, 51);
    assert_eq!(got, want[28..35].to_vec());
    let stale = subscription::get(&d, &tenant(), &older[3].id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let done = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The real one was counted at its creation.
    assert_eq!(
        (done.subscriptions.listed, done.subscriptions.already),
        (50, 1)
    );
    // A whole-record write from a read before the migration is refused
    // (it would drop the mark: a rerun would count it twice).
    let mut changed = stale.clone();
    changed.reference_id = Some("late".into());
    let ops = subscription::write_ops(&changed, Some(&stale)).unwrap_or_else(|e| panic!("{e}"));
    let refused = store.transact(ops).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(StoreError::is_condition_failure),
        "{refused:?}"
    );
    let again = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (again.subscriptions.listed, again.subscriptions.already),
        (0, 51)
    );
    for (page, limit) in [(1, 10), (3, 7), (51, 1), (11, 5)] {
        let (got, total) = page_of(&d, page, limit).await;
        assert_eq!(total, 51, "counted from the counters");
        let from = ((page - 1) * limit).min(51);
        assert_eq!(got, want[from..(from + limit).min(51)].to_vec());
    }
}

#[tokio::test]
async fn a_filtered_list_keeps_its_window() {
    let d = deps_on(crate::testenv::memory_store());
    let filter = ListFilter::parse(Some("trialing"), None, None).unwrap_or_else(|e| panic!("{e}"));
    let deep = PageRequest {
        page: 101,
        limit: 100,
    };
    match list(&d, &tenant(), deep, &filter).await {
        Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some("page")),
        Ok(_) => panic!("a filtered list past its window"),
    }
    let (none, total) = list(&d, &tenant(), deep, &ListFilter::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(none.is_empty() && total == 0);
}
