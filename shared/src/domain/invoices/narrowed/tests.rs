//! One-time invoices narrowed by document and collection status
//! (`counted::Narrowing::InvoicesByStatus`): every offset of every
//! filter exact, a deep offset at a bounded cost, racing status changes,
//! the migration of older invoices, and the older way for a tenant not
//! yet migrated.

use std::sync::Arc;

use super::super::drafts::price;
use super::super::*;
use crate::domain::listing::ListsMarker;
use crate::domain::listing::counted::{self, CountedKind, Narrowing};
use crate::domain::record::{Record, Window};
use crate::domain::{Mode, Tenant};
use crate::ids::InvoiceId;
use crate::store::counting::CountingStore;
use crate::store::embedded::EmbeddedStore;
use crate::store::{Index, Query, Store, TxOp};
use crate::time::{SystemClock, Timestamp};
use crate::{AppState, Config, Deps};
use serde_json::json;

fn tenant() -> Tenant {
    Tenant::new("proj_narrow", Mode::Sandbox)
}

fn state_on(store: Arc<dyn Store>) -> AppState {
    AppState::new(
        store,
        Arc::new(SystemClock),
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn ms(s: &str) -> i64 {
    Timestamp::parse(s)
        .unwrap_or_else(|| panic!("time {s}"))
        .unix_millis()
}

const DOCS: [DocumentStatus; 3] = [
    DocumentStatus::Draft,
    DocumentStatus::Issued,
    DocumentStatus::Void,
];
const COLLS: [CollectionStatus; 4] = [
    CollectionStatus::Unpaid,
    CollectionStatus::PartPaid,
    CollectionStatus::Paid,
    CollectionStatus::ClosedAdjusted,
];

/// An invoice created at `at` (its id minted then) in the statuses given.
fn invoice(at: i64, d: DocumentStatus, c: CollectionStatus, narrowed: bool) -> Invoice {
    let body = serde_json::from_value(json!({
        "lines": [{"description": "x", "quantity": "1", "unitAmount": 10_000}],
        "dueAt": "2027-01-01T00:00:00Z"
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let created = Timestamp::from_unix_millis(at).unwrap_or_else(|| panic!("ms"));
    let mut inv = new_draft(&tenant(), body, created).unwrap_or_else(|e| panic!("{e}"));
    let ulid = ulid::Ulid::from_parts(u64::try_from(at).unwrap_or(0), rand::random::<u128>());
    inv.id = InvoiceId::stored(format!("oinv_{}", ulid.to_string().to_ascii_lowercase()));
    inv.document_status = d;
    inv.collection_status = c;
    inv.narrowed = narrowed;
    price(&mut inv).unwrap_or_else(|e| panic!("{e}"));
    inv
}

/// Stores `inv` as an insert does (its put, its list's and narrowings'
/// counts).
async fn insert(store: &dyn Store, inv: &Invoice) {
    let mut ops = vec![inv.put_new().unwrap_or_else(|e| panic!("{e}"))];
    ops.extend(inv.counts_new());
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
}

async fn marked(store: &dyn Store, narrowed: bool) {
    let mut ops = vec![ListsMarker::mark_counted(&tenant(), CountedKind::Invoices)];
    if narrowed {
        ops.push(ListsMarker::mark_narrowing(
            &tenant(),
            Narrowing::InvoicesByStatus,
        ));
    }
    for op in ops {
        store
            .transact(vec![op])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `n` invoices over many days, in every status pair.
async fn seeded(n: usize, narrowed: bool) -> (Arc<dyn Store>, Vec<Invoice>) {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    marked(&*store, narrowed).await;
    let base = ms("2025-12-28T22:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..n {
        let step = [0, 1, 3_600_000 * 7, 86_400_000 * 9 + 5][i % 4];
        let at = base + (i as i64) * 86_400_000 / 3 + step;
        let d = DOCS[[0, 1, 1, 2, 1][i % 5]];
        let c = COLLS[[0, 1, 2, 0, 3, 0, 2][i % 7]];
        let inv = invoice(at, d, c, narrowed);
        insert(&*store, &inv).await;
        all.push(inv);
    }
    (store, all)
}

fn want(all: &[Invoice], d: Option<DocumentStatus>, c: Option<CollectionStatus>) -> Vec<String> {
    let mut ids: Vec<String> = all
        .iter()
        .filter(|i| d.is_none_or(|d| i.document_status == d))
        .filter(|i| c.is_none_or(|c| i.collection_status == c))
        .map(|i| i.id.to_string())
        .collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

async fn read(
    state: &Deps,
    d: Option<DocumentStatus>,
    c: Option<CollectionStatus>,
    offset: usize,
) -> (Vec<String>, u64) {
    let (page, total) = list(state, &tenant(), d, c, Window::at(offset, 7))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (page.into_iter().map(|i| i.id.to_string()).collect(), total)
}

/// Every filter (document, collection, both) at offsets 0, 1, 100, 101,
/// deep, the last and past the end: the right slice and total.
async fn assert_exact(state: &Deps, all: &[Invoice]) {
    let mut filters = Vec::new();
    for d in DOCS {
        filters.push((Some(d), None));
        for c in COLLS {
            filters.push((Some(d), Some(c)));
        }
    }
    for c in COLLS {
        filters.push((None, Some(c)));
    }
    for (d, c) in filters {
        let want = want(all, d, c);
        for offset in [
            0,
            1,
            100,
            101,
            150,
            want.len().saturating_sub(1),
            want.len() + 3,
        ] {
            let (got, total) = read(state, d, c, offset).await;
            assert_eq!(total, want.len() as u64, "{d:?} {c:?}");
            let end = (offset + 7).min(want.len());
            assert_eq!(
                got,
                want.get(offset..end)
                    .map(<[String]>::to_vec)
                    .unwrap_or_default(),
                "{d:?} {c:?} offset {offset}"
            );
        }
    }
}

#[tokio::test]
async fn every_status_filter_pages_and_counts_exactly_at_any_offset() {
    let (store, all) = seeded(420, true).await;
    assert_exact(&state_on(store), &all).await;
}

#[tokio::test]
async fn a_deep_page_of_a_rare_status_reads_a_bounded_number_of_items() {
    let inner: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    marked(&*inner, true).await;
    let start = ms("2026-10-20T00:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..2000i64 {
        // Void is rare: one in ten.
        let d = if i % 10 == 0 {
            DocumentStatus::Void
        } else {
            DocumentStatus::Issued
        };
        let inv = invoice(start + i * 600_000, d, CollectionStatus::Unpaid, true);
        insert(&*inner, &inv).await;
        all.push(inv);
    }
    let want = want(&all, Some(DocumentStatus::Void), None);
    let counting = Arc::new(CountingStore::new(Arc::clone(&inner)));
    let state = state_on(counting.clone());
    let (got, total) = read(&state, Some(DocumentStatus::Void), None, 150).await;
    assert_eq!(total, 200);
    assert_eq!(got, want[150..157].to_vec());
    // The counters of two years, two months, a month's days (8 shards
    // each), a day's entries, the page, the marker.
    let bound = 8 * (2 + 2 + 31) + 15 + 7 + 2;
    assert!(
        counting.items_read() <= bound,
        "read {}",
        counting.items_read()
    );
}

async fn stored(store: &dyn Store, id: &InvoiceId) -> Invoice {
    get_any(store, id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("{id} gone"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_status_changes_keep_every_total_exact() {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    marked(&*store, true).await;
    let state = state_on(Arc::clone(&store));
    let body = || {
        serde_json::from_value::<CreateInvoice>(json!({
            "lines": [{"description": "x", "quantity": "1", "unitAmount": 10_000}],
            "dueAt": "2027-01-01T00:00:00Z"
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut drafts = Vec::new();
    for _ in 0..30 {
        drafts.push(
            create(&state, &tenant(), body(), None)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    // Finalizes (draft -> issued), adjustments of the issued ones
    // (unpaid -> closed_adjusted), discards and new drafts, all at once
    // on the same counter shards.
    let finalizes = drafts.iter().take(20).map(|d| {
        let state = state.clone();
        let id = d.id.clone();
        tokio::spawn(async move {
            let issued = finalize(&state, &tenant(), &id, 1, None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if issued
                .invoice_number
                .as_deref()
                .is_some_and(|n| n.ends_with('2'))
            {
                let body = AdjustInvoice {
                    amount: issued.total_amount,
                    reason: serde_json::from_value(json!("written off"))
                        .unwrap_or_else(|e| panic!("{e}")),
                    version: issued.version,
                };
                adjust(&state, &tenant(), &id, body)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        })
    });
    let discards = drafts.iter().skip(20).take(5).map(|d| {
        let state = state.clone();
        let id = d.id.clone();
        tokio::spawn(async move {
            discard(&state, &tenant(), &id, None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        })
    });
    let creates = (0..10).map(|_| {
        let state = state.clone();
        let b = body();
        tokio::spawn(async move {
            create(&state, &tenant(), b, None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        })
    });
    let runs: Vec<_> = finalizes.chain(discards).chain(creates).collect();
    for r in futures::future::join_all(runs).await {
        r.unwrap_or_else(|e| panic!("{e}"));
    }
    let q = Query::partition(Invoice::list_partition(&tenant())).on(Index::Gsi1);
    let mut all = Vec::new();
    for item in store
        .query(&q)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .items
    {
        let inv: Invoice = crate::domain::record::from_item(item).unwrap_or_else(|e| panic!("{e}"));
        all.push(stored(&*store, &inv.id).await);
    }
    assert_eq!(all.len(), 35);
    let adjusted = want(&all, None, Some(CollectionStatus::ClosedAdjusted)).len();
    assert!(adjusted >= 2, "{adjusted}");
    assert_exact(&state, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn older_invoices_are_read_the_older_way_until_migrated_once() {
    // Invoices from before the narrowings: no entries, no counts.
    let (store, mut all) = seeded(150, false).await;
    let state = state_on(Arc::clone(&store));
    // Not covered: a filter over the list, still right.
    assert_exact(&state, &all).await;
    // A status change of an older invoice moves no count (it has none).
    let older = all[1].clone();
    assert_eq!(older.document_status, DocumentStatus::Issued);
    let mut next = older.clone();
    next.document_status = DocumentStatus::Void;
    next.version += 1;
    let ops = Invoice::write_over(&older, &next, Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ops.len(), 1);
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
    all[1] = stored(&*store, &older.id).await;
    assert!(!all[1].narrowed);
    // New invoices are narrowed from their creation.
    for i in 0..4 {
        let inv = invoice(
            ms("2026-11-29T08:00:00.000Z") + i,
            DocumentStatus::Draft,
            CollectionStatus::Unpaid,
            true,
        );
        insert(&*store, &inv).await;
        all.push(inv);
    }
    let q = || Query::partition(Invoice::list_partition(&tenant())).on(Index::Gsi1);
    let (a, b) = tokio::join!(
        counted::migrate_narrowed::<Invoice>(&*store, q()),
        counted::migrate_narrowed::<Invoice>(&*store, q())
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(a.listed + b.listed, 150, "{a:?} {b:?}");
    let again = counted::migrate_narrowed::<Invoice>(&*store, q())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.listed, again.already), (0, 154));
    marked(&*store, true).await;
    assert_exact(&state, &all).await;
    // Migrated, a status change moves its counts.
    let migrated = stored(&*store, &all[6].id).await;
    assert!(migrated.narrowed);
    assert_eq!(migrated.document_status, DocumentStatus::Issued);
    let mut next = migrated.clone();
    next.document_status = DocumentStatus::Void;
    next.version += 1;
    let ops = Invoice::write_over(&migrated, &next, Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
    all[6] = stored(&*store, &migrated.id).await;
    assert_exact(&state, &all).await;
}

#[tokio::test]
async fn a_whole_write_from_before_the_migration_does_not_undo_it() {
    let (store, all) = seeded(3, false).await;
    let read = all[0].clone();
    let q = Query::partition(Invoice::list_partition(&tenant())).on(Index::Gsi1);
    counted::migrate_narrowed::<Invoice>(&*store, q)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut next = read.clone();
    next.document_status = DocumentStatus::Void;
    next.version += 1;
    let ops = Invoice::write_over(&read, &next, Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    let e = store.transact(ops).await.err();
    assert!(e.is_some_and(|e| e.is_condition_failure()));
}

/// Every status change of a one-time invoice is a whole-record write
/// built by `Invoice::write_over` (which moves its narrowings' counts):
/// no code of the crate sets either status attribute, and no invoice
/// code outside `records.rs` writes an invoice whole but a new one.
#[test]
fn statuses_are_written_only_through_write_over() {
    let mut found = Vec::new();
    for (name, flat) in crate::testenv::flat_sources(&["shared/src"]) {
        for needle in [
            "set(Invoice::DOCUMENT_STATUS",
            "set(Invoice::COLLECTION_STATUS",
        ] {
            let n = flat.matches(needle).count();
            if n != 0 {
                found.push(format!("{name}: {n} × {needle}"));
            }
        }
        if name.starts_with("shared/src/domain/invoices/")
            && name != "shared/src/domain/invoices/records.rs"
        {
            let n = flat.matches(".to_item()").count();
            if n != 0 {
                found.push(format!("{name}: {n} × .to_item()"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "statuses written around write_over: {found:?}"
    );
}

#[test]
fn a_status_change_moves_every_narrowing_and_nothing_else() {
    let inv = invoice(
        ms("2026-11-29T08:00:00.000Z"),
        DocumentStatus::Issued,
        CollectionStatus::PartPaid,
        true,
    );
    let mut next = inv.clone();
    next.collection_status = CollectionStatus::Paid;
    next.version += 1;
    let ops = Invoice::write_over(&inv, &next, Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    // The put, then year, month and day counters (one item each: the
    // three narrowings folded).
    assert_eq!(ops.len(), 4, "{ops:?}");
    let TxOp::Put { item, .. } = &ops[0] else {
        panic!("{ops:?}")
    };
    let partition = Invoice::list_partition(&tenant());
    assert_eq!(
        item.get("gsi5pk"),
        Some(&json!(format!("{partition}#C#paid")))
    );
    assert_eq!(
        item.get("gsi6pk"),
        Some(&json!(format!("{partition}#DC#issued#paid")))
    );
    assert_eq!(
        item.get("gsi4pk"),
        Some(&json!(format!("{partition}#D#issued")))
    );
    // No change of status: the put alone.
    let mut same = inv.clone();
    same.note = Some("n".into());
    same.version += 1;
    let ops = Invoice::write_over(&inv, &same, Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ops.len(), 1);
}
