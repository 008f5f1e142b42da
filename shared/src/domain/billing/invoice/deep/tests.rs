//! The billing invoices' counted list (issue 37 item 11): any page
//! reaches its invoices at a cost that does not grow with the history,
//! totals from the counters stay exact as subscriptions issue invoices
//! side by side, an older project's invoices are counted by the lists
//! migration, and a searched list keeps its window.

use std::sync::Arc;

use serde_json::json;

use super::super::view::{Filters, list};
use super::super::*;
use crate::domain::Mode;
use crate::domain::billing::customers::{self, CreateCustomer, PageRequest};
use crate::domain::billing::lifecycle::{self, CreateSubscription};
use crate::domain::billing::plans::{self, CreatePlan};
use crate::domain::listing::ListsMarker;
use crate::domain::listing::counted::CountedKind;
use crate::domain::lists_migration;
use crate::domain::record::Record;
use crate::ids::{CustomerId, PlanId};
use crate::refusal::Refusal;
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
    Tenant::new("proj_invdeep", Mode::Sandbox)
}

async fn mark_covered(store: &dyn Store) {
    store
        .transact(vec![ListsMarker::mark_counted(
            &tenant(),
            CountedKind::BillingInvoices,
        )])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

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

/// A subscription without a trial: its first invoice, issued at once.
async fn first_invoice(deps: &Deps, c: &CustomerId, p: &PlanId) -> BillingInvoice {
    let body: CreateSubscription = serde_json::from_value(json!({"customerId": c, "planId": p}))
        .unwrap_or_else(|e| panic!("{e}"));
    lifecycle::create_subscription(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .first_invoice
        .unwrap_or_else(|| panic!("a first invoice"))
        .invoice
}

/// `template` again, minted at `ms` (its id's time), counted or not.
fn minted(template: &BillingInvoice, ms: i64, counted: bool) -> BillingInvoice {
    let ulid = ulid::Ulid::from_parts(
        u64::try_from(ms).unwrap_or(0),
        rand::random::<u128>() & ((1u128 << 80) - 1),
    );
    let mut inv = template.clone();
    inv.id = BillingInvoiceId::stored(format!("inv_{}", ulid.to_string().to_ascii_lowercase()));
    inv.created_at = Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"));
    inv.counted = counted;
    inv.narrowed = counted;
    inv
}

async fn insert(store: &dyn Store, inv: &BillingInvoice) {
    let mut ops = vec![inv.put_new().unwrap_or_else(|e| panic!("{e}"))];
    if inv.counted {
        ops.extend(inv.insert_counts());
    }
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
}

fn newest_first(all: &[BillingInvoice]) -> Vec<String> {
    let mut ids: Vec<String> = all.iter().map(|i| i.id.to_string()).collect();
    ids.sort();
    ids.reverse();
    ids
}

async fn page_of(d: &Deps, page: usize, limit: usize) -> (Vec<String>, u64) {
    let (found, total) = list(
        d,
        &tenant(),
        PageRequest { page, limit },
        &Filters::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    (found.iter().map(|i| i.id.to_string()).collect(), total)
}

/// Minted over years, months, days and within a day.
fn spread(template: &BillingInvoice, n: usize, counted: bool) -> Vec<BillingInvoice> {
    let base = at("2024-11-28T22:00:00Z").unix_millis();
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
async fn every_page_reaches_its_invoices_and_a_deep_one_is_bounded() {
    let inner = crate::testenv::memory_store();
    mark_covered(&*inner).await;
    let d = deps_on(inner.clone());
    let (c, p) = customer_and_plan(&d).await;
    let real = first_invoice(&d, &c, &p).await;
    let mut all = spread(&real, 150, true);
    let start = at("2025-10-20T00:00:00Z").unix_millis();
    for i in 0..1000i64 {
        all.push(minted(&real, start + i * 600_000, true));
    }
    for inv in &all {
        insert(&*inner, inv).await;
    }
    all.push(real);
    let n = all.len();
    let want = newest_first(&all);
    for limit in [1, 7, 50] {
        for page in [1, 2, 15, 120, 150, 1000, 1151, 1152, 9_000] {
            let (got, total) = page_of(&d, page, limit).await;
            assert_eq!(total, n as u64);
            let from = ((page - 1) * limit).min(n);
            let to = (from + limit).min(n);
            assert_eq!(got, want[from..to].to_vec(), "page {page} limit {limit}");
        }
    }
    let counting = Arc::new(CountingStore::new(Arc::clone(&inner)));
    let d = deps_on(counting.clone());
    let (got, _) = page_of(&d, 91, 10).await;
    assert_eq!(got, want[900..910].to_vec());
    // The marker, counter items (8 shards: years, months, a month's days)
    // one day's invoices (144) and the page; reading through reads 910.
    let bound = 1 + 8 * (3 + 14 + 31) + 144 + 10;
    assert!(
        counting.items_read() <= bound,
        "read {} items (bound {bound})",
        counting.items_read()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invoices_issued_side_by_side_keep_the_total_exact() {
    let store = crate::testenv::memory_store();
    mark_covered(&*store).await;
    let d = deps_on(store);
    let (c, p) = customer_and_plan(&d).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (d, c, p) = (d.clone(), c.clone(), p.clone());
        tasks.push(tokio::spawn(async move { first_invoice(&d, &c, &p).await }));
    }
    let mut made = Vec::new();
    for t in tasks {
        made.push(t.await.unwrap_or_else(|e| panic!("{e}")));
    }
    let (got, total) = page_of(&d, 1, 100).await;
    assert_eq!(total, 16);
    assert_eq!(got, newest_first(&made));
    let (past, total) = page_of(&d, 17, 1).await;
    assert!(past.is_empty());
    assert_eq!(total, 16);
}

#[tokio::test]
async fn an_older_project_is_counted_by_the_migration_and_filters_keep_their_window() {
    let store = crate::testenv::memory_store();
    let d = deps_on(store.clone());
    let (c, p) = customer_and_plan(&d).await;
    let real = first_invoice(&d, &c, &p).await;
    let older = spread(&real, 40, false);
    for inv in &older {
        insert(&*store, inv).await;
    }
    let mut all = older.clone();
    all.push(real);
    let want = newest_first(&all);
    let (got, total) = page_of(&d, 4, 7).await;
    assert_eq!(total, 41);
    assert_eq!(got, want[21..28].to_vec());
    let done = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (done.billing_invoices.listed, done.billing_invoices.already),
        (40, 1)
    );
    let again = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            again.billing_invoices.listed,
            again.billing_invoices.already
        ),
        (0, 41)
    );
    for (page, limit) in [(1, 10), (3, 7), (41, 1), (9, 5)] {
        let (got, total) = page_of(&d, page, limit).await;
        assert_eq!(total, 41, "counted from the counters");
        let from = ((page - 1) * limit).min(41);
        assert_eq!(got, want[from..(from + limit).min(41)].to_vec());
    }
    let deep = PageRequest {
        page: 101,
        limit: 100,
    };
    // A search keeps its window; a filter, narrowed by the migration too,
    // answers any page (past its end: empty, its total exact).
    let search = Filters {
        search: Some("inv_".into()),
        ..Filters::default()
    };
    match list(&d, &tenant(), deep, &search).await {
        Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some("page")),
        Ok(_) => panic!("a search past its window"),
    }
    let open = Filters {
        status: Some(InvoiceStatus::Open),
        ..Filters::default()
    };
    let (found, total) = list(&d, &tenant(), deep, &open)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(found.is_empty());
    assert_eq!(
        total,
        all.iter()
            .filter(|i| i.status == InvoiceStatus::Open)
            .count() as u64
    );
}
