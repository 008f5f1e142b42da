//! The customers' counted list (issue 37 item 11): any page reaches its
//! customers at a cost that does not grow with the history, totals from
//! the counters stay exact under racing creates and deletes, and an older
//! project's customers are counted by the lists migration.

use std::sync::Arc;

use serde_json::json;

use super::super::{BillingError, CreateCustomer, Customer, PageRequest, create, delete, list};
use crate::domain::listing::ListsMarker;
use crate::domain::listing::counted::CountedKind;
use crate::domain::record::Record;
use crate::domain::{Mode, Tenant, lists_migration};
use crate::ids::{CustomerId, ProjectId};
use crate::refusal::Refusal;
use crate::store::Store;
use crate::store::counting::CountingStore;
use crate::testenv::memory_store;
use crate::time::{SystemClock, Timestamp};

fn deps(store: Arc<dyn Store>) -> crate::AppState {
    crate::AppState::new(
        store,
        Arc::new(SystemClock),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn tenant() -> Tenant {
    Tenant::new(ProjectId::stored("proj_deep"), Mode::Live)
}

fn body(name: &str) -> CreateCustomer {
    serde_json::from_value(json!({ "name": name })).unwrap_or_else(|e| panic!("{e}"))
}

fn ms(s: &str) -> i64 {
    Timestamp::parse(s)
        .unwrap_or_else(|| panic!("time {s}"))
        .unix_millis()
}

/// A customer minted at `ms` (its id's time), counted or not (an older
/// project's: written before the counters).
fn customer(ms: i64, counted: bool) -> Customer {
    let at = Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"));
    let ulid = ulid::Ulid::from_parts(
        u64::try_from(ms).unwrap_or(0),
        rand::random::<u128>() & ((1u128 << 80) - 1),
    );
    let id = CustomerId::stored(format!("cus_{}", ulid.to_string().to_ascii_lowercase()));
    let mut c = super::super::new_customer(&tenant(), body(&format!("c{ms}")), at)
        .unwrap_or_else(|e| panic!("{e}"));
    c.id = id;
    c.counted = counted;
    c
}

/// Written as `create` writes it (with its counts when counted).
async fn insert(store: &dyn Store, c: &Customer) {
    let mut ops = vec![c.put_new().unwrap_or_else(|e| panic!("{e}"))];
    if c.counted {
        ops.extend(c.count_new());
    }
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
}

async fn mark_covered(store: &dyn Store) {
    store
        .transact(vec![ListsMarker::mark_counted(
            &tenant(),
            CountedKind::Customers,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

fn newest_first(all: &[Customer]) -> Vec<String> {
    let mut ids: Vec<String> = all.iter().map(|c| c.id.to_string()).collect();
    ids.sort();
    ids.reverse();
    ids
}

async fn page_of(d: &crate::AppState, page: usize, limit: usize) -> (Vec<String>, u64) {
    let (found, total) = list(d, &tenant(), PageRequest { page, limit }, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (found.iter().map(|c| c.id.to_string()).collect(), total)
}

/// Customers over years, months, days and within a day.
fn spread(n: usize, counted: bool) -> Vec<Customer> {
    let base = ms("2024-11-28T22:00:00.000Z");
    (0..n)
        .map(|i| {
            let step = match i % 5 {
                0 => 0,
                1 => 3_600_000 * 5,
                2 => 86_400_000 * 3 + 1,
                3 => 86_400_000 * 17,
                _ => 1,
            };
            customer(base + (i as i64) * 86_400_000 * 2 + step, counted)
        })
        .collect()
}

#[tokio::test]
async fn every_page_reaches_its_customers_and_totals_are_counted() {
    let store = memory_store();
    mark_covered(&*store).await;
    let all = spread(240, true);
    for c in &all {
        insert(&*store, c).await;
    }
    let want = newest_first(&all);
    let d = deps(store);
    for limit in [1, 7, 50] {
        for page in [1, 2, 15, 16, 34, 35, 120, 200, 240, 241, 5_000] {
            let (got, total) = page_of(&d, page, limit).await;
            assert_eq!(total, 240);
            let from = ((page - 1) * limit).min(240);
            let to = (from + limit).min(240);
            assert_eq!(got, want[from..to].to_vec(), "page {page} limit {limit}");
        }
    }
}

#[tokio::test]
async fn a_deep_page_reads_a_bounded_number_of_items() {
    let inner = memory_store();
    mark_covered(&*inner).await;
    let start = ms("2026-10-20T00:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..2000i64 {
        let c = customer(start + i * 600_000, true);
        insert(&*inner, &c).await;
        all.push(c);
    }
    let want = newest_first(&all);
    let counting = Arc::new(CountingStore::new(Arc::clone(&inner)));
    let d = deps(counting.clone());
    // Page 191 of 10: customers 1,900 to 1,909.
    let (got, total) = page_of(&d, 191, 10).await;
    assert_eq!(total, 2000);
    assert_eq!(got, want[1900..1910].to_vec());
    // The marker, counter items (8 shards: the year, two months, a
    // month's days), one day's customers (144) and the page; reading
    // through would read 1,910.
    let bound = 1 + 8 * (2 + 2 + 31) + 144 + 10;
    assert!(
        counting.items_read() <= bound,
        "read {} items (bound {bound})",
        counting.items_read()
    );
    // Past 10,000 records is no refusal: an empty page, the total.
    let (past, total) = page_of(&d, 101, 100).await;
    assert!(past.is_empty());
    assert_eq!(total, 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_and_deletes_keep_the_total_exact() {
    let store = memory_store();
    mark_covered(&*store).await;
    let d = deps(store);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            create(&d, &tenant(), body(&format!("n{i}")), None).await
        }));
    }
    let mut made = Vec::new();
    for t in tasks {
        let c = t
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        made.push(c);
    }
    let want = newest_first(&made);
    let (got, total) = page_of(&d, 1, 100).await;
    assert_eq!(total, 30);
    assert_eq!(got, want);
    let mut tasks = Vec::new();
    for c in made.iter().take(10) {
        let (d, id) = (d.clone(), c.id.clone());
        tasks.push(tokio::spawn(
            async move { delete(&d, &tenant(), &id).await },
        ));
    }
    for t in tasks {
        t.await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let (got, total) = page_of(&d, 1, 100).await;
    assert_eq!(total, 20);
    assert_eq!(got.len(), 20);
    // A second delete of one finds none and takes back nothing.
    assert!(matches!(
        delete(&d, &tenant(), &made[0].id).await,
        Err(BillingError::NotFound { .. })
    ));
    let (_, total) = page_of(&d, 20, 1).await;
    assert_eq!(total, 20);
    let (last, _) = page_of(&d, 20, 1).await;
    assert_eq!(last.len(), 1);
    let (past, _) = page_of(&d, 21, 1).await;
    assert!(past.is_empty());
}

#[tokio::test]
async fn an_older_project_is_counted_by_the_migration() {
    let store = memory_store();
    // Written before the counters: not counted, no marker.
    let older = spread(60, false);
    for c in &older {
        insert(&*store, c).await;
    }
    let d = deps(store.clone());
    let want = newest_first(&older);
    // Served as before (counted and skipped through the partition).
    let (got, total) = page_of(&d, 5, 7).await;
    assert_eq!(total, 60);
    assert_eq!(got, want[28..35].to_vec());
    // A delete of an uncounted customer takes back no count.
    delete(&d, &tenant(), &older[0].id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let done = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((done.customers.listed, done.customers.already), (59, 0));
    let again = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.customers.listed, again.customers.already), (0, 59));
    let want: Vec<String> = want
        .into_iter()
        .filter(|id| id.as_str() != older[0].id.as_str())
        .collect();
    for (page, limit) in [(1, 10), (3, 7), (59, 1), (12, 5)] {
        let (got, total) = page_of(&d, page, limit).await;
        assert_eq!(total, 59, "counted from the counters");
        let from = ((page - 1) * limit).min(59);
        assert_eq!(got, want[from..(from + limit).min(59)].to_vec());
    }
    // A migrated customer's delete takes its count back.
    delete(&d, &tenant(), &older[1].id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, total) = page_of(&d, 1, 1).await;
    assert_eq!(total, 58);
}

#[tokio::test]
async fn a_search_keeps_its_window() {
    let deep = PageRequest::parse_deep(Some("150"), Some("100")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(deep.offset(), 14_900);
    for (page, limit, field) in [
        (Some("0"), None, "page"),
        (Some("x"), None, "page"),
        (Some("1000000001"), None, "page"),
        (None, Some("101"), "limit"),
    ] {
        match PageRequest::parse_deep(page, limit) {
            Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some(field)),
            Ok(p) => panic!("accepted {p:?}"),
        }
    }
    let d = deps(memory_store());
    let refused = list(&d, &tenant(), deep, Some("sita")).await;
    match refused {
        Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some("page")),
        Ok(_) => panic!("a search past its window"),
    }
}
