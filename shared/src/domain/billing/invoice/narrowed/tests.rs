//! The billing invoices' narrowings (issue 37 item 11): every filter and
//! combination pages and totals exactly at any page, a deep page of a
//! rare status reads a bounded number of items, racing status changes
//! keep every total exact, every insert path enters and counts, the
//! migration narrows older invoices once (the old way answering until
//! then), a combination past the window is refused naming its filter,
//! and nothing but `status_change` sets an invoice's status.

use std::sync::Arc;

use serde_json::json;

use super::super::view::{Filters, list};
use super::super::*;
use crate::domain::Mode;
use crate::domain::billing::changes::{ChangePlan, change_plan};
use crate::domain::billing::customers::{self, CreateCustomer, PageRequest};
use crate::domain::billing::lifecycle::{self, CreateSubscription};
use crate::domain::billing::plans::{self, CreatePlan, Plan};
use crate::domain::billing::testenv::{deps_with, stores};
use crate::domain::listing::counted::{self, CountedKind, Narrowing};
use crate::domain::listing::{ListsMarker, merge_counts};
use crate::domain::lists_migration;
use crate::domain::record::Record;
use crate::ids::CustomerId;
use crate::refusal::Refusal;
use crate::store::Store;
use crate::store::counting::CountingStore;
use crate::testenv::at;
use crate::time::ManualClock;

const NOW: &str = "2026-01-10T06:00:00Z";

fn deps_on(store: Arc<dyn Store>) -> (crate::AppState, ManualClock) {
    let clock = ManualClock::new(at(NOW));
    (deps_with(store, Arc::new(clock.clone())), clock)
}

fn tenant() -> Tenant {
    Tenant::new("proj_invnarrow", Mode::Sandbox)
}

async fn mark(store: &dyn Store, narrowed: bool) {
    let mut ops = vec![ListsMarker::mark_counted(
        &tenant(),
        CountedKind::BillingInvoices,
    )];
    if narrowed {
        ops.push(ListsMarker::mark_narrowing(
            &tenant(),
            Narrowing::BillingInvoicesByFilter,
        ));
    }
    // One write each (a transaction writes an item once).
    for op in ops {
        store
            .transact(vec![op])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

async fn customer(deps: &Deps, name: &str) -> CustomerId {
    let body: CreateCustomer =
        serde_json::from_value(json!({ "name": name })).unwrap_or_else(|e| panic!("{e}"));
    customers::create(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .id
}

async fn plan(deps: &Deps, name: &str, amount: i64) -> Plan {
    let body: CreatePlan =
        serde_json::from_value(json!({"name": name, "amount": amount, "intervalUnit": "month"}))
            .unwrap_or_else(|e| panic!("{e}"));
    plans::create(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A subscription without a trial: its first invoice, issued at once.
async fn first_invoice(deps: &Deps, c: &CustomerId, p: &Plan) -> BillingInvoice {
    let body: CreateSubscription = serde_json::from_value(json!({"customerId": c, "planId": p.id}))
        .unwrap_or_else(|e| panic!("{e}"));
    lifecycle::create_subscription(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .first_invoice
        .unwrap_or_else(|| panic!("a first invoice"))
        .invoice
}

/// `template` again, minted at `ms`, in `status`, of `customer` and
/// `subscription`, narrowed or not (an invoice from before the
/// narrowings).
fn minted(
    template: &BillingInvoice,
    ms: i64,
    status: InvoiceStatus,
    (customer, subscription): (&CustomerId, &SubscriptionId),
    narrowed: bool,
) -> BillingInvoice {
    let ulid = ulid::Ulid::from_parts(
        u64::try_from(ms).unwrap_or(0),
        rand::random::<u128>() & ((1u128 << 80) - 1),
    );
    let mut inv = template.clone();
    inv.id = BillingInvoiceId::stored(format!("inv_{}", ulid.to_string().to_ascii_lowercase()));
    inv.created_at = Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"));
    inv.status = status;
    inv.customer_id = customer.clone();
    inv.subscription_id = subscription.clone();
    inv.counted = true;
    inv.narrowed = narrowed;
    inv
}

/// Its insert as the engine's: the invoice (its entries) and its counts.
async fn insert(store: &dyn Store, inv: &BillingInvoice) {
    let mut ops = vec![inv.put_new().unwrap_or_else(|e| panic!("{e}"))];
    ops.extend(inv.insert_counts());
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
}

fn status_of(i: usize) -> InvoiceStatus {
    match i {
        i if i % 11 == 0 => InvoiceStatus::Void,
        i if i % 7 == 0 => InvoiceStatus::Uncollectible,
        i if i % 5 == 0 => InvoiceStatus::Overdue,
        i if i % 2 == 0 => InvoiceStatus::Paid,
        _ => InvoiceStatus::Open,
    }
}

/// Two customers; three subscriptions of the first, one of the second.
fn owners() -> Vec<(CustomerId, SubscriptionId)> {
    let (a, b) = (CustomerId::new(), CustomerId::new());
    vec![
        (a.clone(), SubscriptionId::new()),
        (a.clone(), SubscriptionId::new()),
        (a, SubscriptionId::new()),
        (b, SubscriptionId::new()),
    ]
}

/// `n` invoices minted over years, months, days and within a day.
fn spread(
    template: &BillingInvoice,
    owners: &[(CustomerId, SubscriptionId)],
    n: usize,
    narrowed: bool,
) -> Vec<BillingInvoice> {
    let base = at("2024-11-28T22:00:00Z").unix_millis();
    (0..n)
        .map(|i| {
            let step = [0, 3_600_000 * 5, 86_400_000 * 3 + 1, 86_400_000 * 17, 1][i % 5];
            let (c, s) = &owners[(i / 3) % owners.len()];
            let ms = base + (i as i64) * 86_400_000 * 2 + step;
            minted(template, ms, status_of(i), (c, s), narrowed)
        })
        .collect()
}

fn kept(all: &[BillingInvoice], f: &Filters) -> Vec<String> {
    let mut ids: Vec<String> = all
        .iter()
        .filter(|i| {
            f.status.is_none_or(|s| s == i.status)
                && f.customer_id.as_ref().is_none_or(|c| *c == i.customer_id)
                && f.subscription_id
                    .as_ref()
                    .is_none_or(|s| *s == i.subscription_id)
        })
        .map(|i| i.id.to_string())
        .collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

async fn page_of(
    d: &Deps,
    f: &Filters,
    page: usize,
    limit: usize,
) -> Result<(Vec<String>, u64), crate::domain::billing::customers::BillingError> {
    let (found, total) = list(d, &tenant(), PageRequest { page, limit }, f).await?;
    Ok((found.iter().map(|i| i.id.to_string()).collect(), total))
}

/// Every filter of `all`'s values and the combinations.
fn filters_of(all: &[BillingInvoice]) -> Vec<Filters> {
    let mut out = Vec::new();
    let status = |s| Filters {
        status: Some(s),
        ..Filters::default()
    };
    for s in InvoiceStatus::ALL {
        out.push(status(s));
    }
    let mut pairs: Vec<(CustomerId, SubscriptionId)> = all
        .iter()
        .map(|i| (i.customer_id.clone(), i.subscription_id.clone()))
        .collect();
    pairs.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
    pairs.dedup();
    for (c, s) in pairs {
        out.push(Filters {
            customer_id: Some(c.clone()),
            ..Filters::default()
        });
        out.push(Filters {
            subscription_id: Some(s.clone()),
            ..Filters::default()
        });
        for st in [InvoiceStatus::Open, InvoiceStatus::Void] {
            out.push(Filters {
                customer_id: Some(c.clone()),
                ..status(st)
            });
            out.push(Filters {
                subscription_id: Some(s.clone()),
                ..status(st)
            });
            out.push(Filters {
                customer_id: Some(c.clone()),
                subscription_id: Some(s.clone()),
                ..status(st)
            });
        }
        out.push(Filters {
            customer_id: Some(c.clone()),
            subscription_id: Some(s),
            ..Filters::default()
        });
    }
    // A subscription with another customer: nothing.
    out.push(Filters {
        customer_id: Some(CustomerId::new()),
        subscription_id: all.first().map(|i| i.subscription_id.clone()),
        ..Filters::default()
    });
    out
}

/// Every filter of `all` pages and totals exactly at offsets 0, 1, 100,
/// 101, deep, the last and past the end, and by pages of 7.
async fn assert_exact(d: &Deps, all: &[BillingInvoice]) {
    for f in filters_of(all) {
        let want = kept(all, &f);
        let n = want.len();
        let mut offsets = vec![0, 1, 100, 101, n / 2 + 37, n.saturating_sub(1), n, n + 5];
        offsets.dedup();
        for offset in offsets {
            let (got, total) = page_of(d, &f, offset + 1, 1)
                .await
                .unwrap_or_else(|e| panic!("{f:?} {e}"));
            assert_eq!(total, n as u64, "{f:?}");
            let end = (offset + 1).min(n);
            let slice = want.get(offset.min(n)..end).unwrap_or_default();
            assert_eq!(got, slice.to_vec(), "{f:?} offset {offset}");
        }
        for page in [1, 2, 15, 16, 40] {
            let (got, total) = page_of(d, &f, page, 7)
                .await
                .unwrap_or_else(|e| panic!("{f:?} {e}"));
            assert_eq!(total, n as u64, "{f:?}");
            let from = ((page - 1) * 7).min(n);
            assert_eq!(got, want[from..(from + 7).min(n)].to_vec(), "{f:?} {page}");
        }
    }
}

async fn seeded(narrowed: bool, n: usize) -> (Arc<dyn Store>, Vec<BillingInvoice>) {
    let store = crate::testenv::memory_store();
    mark(&*store, narrowed).await;
    let (d, _) = deps_on(store.clone());
    let c = customer(&d, "Sita Rai").await;
    let p = plan(&d, "Fibre 50", 150_000).await;
    let real = first_invoice(&d, &c, &p).await;
    let mut all = spread(&real, &owners(), n, narrowed);
    for inv in &all {
        insert(&*store, inv).await;
    }
    all.push(real);
    (store, all)
}

#[tokio::test]
async fn every_filter_and_combination_pages_and_totals_exactly() {
    let (store, all) = seeded(true, 600).await;
    let (d, _) = deps_on(store);
    assert_exact(&d, &all).await;
    // A search: the matches among the narrowest list, the others applied.
    let c = all[0].customer_id.clone();
    let f = Filters {
        customer_id: Some(c.clone()),
        status: Some(InvoiceStatus::Open),
        search: Some(c.as_str().to_ascii_lowercase()),
        ..Filters::default()
    };
    let want = kept(&all, &f);
    let (got, total) = page_of(&d, &f, 2, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(total, want.len() as u64);
    assert_eq!(got, want[10..20].to_vec());
}

#[tokio::test]
async fn a_deep_page_of_a_rare_status_or_a_customer_reads_a_bounded_number_of_items() {
    let inner = crate::testenv::memory_store();
    mark(&*inner, true).await;
    let (d, _) = deps_on(inner.clone());
    let c = customer(&d, "Sita Rai").await;
    let p = plan(&d, "Fibre 50", 150_000).await;
    let real = first_invoice(&d, &c, &p).await;
    let (rare, sub) = (CustomerId::new(), SubscriptionId::new());
    let start = at("2025-10-20T00:00:00Z").unix_millis();
    let mut all = vec![real.clone()];
    for i in 0..2000i64 {
        // One in ten is void, of another customer.
        let inv = if i % 10 == 0 {
            minted(
                &real,
                start + i * 600_000,
                InvoiceStatus::Void,
                (&rare, &sub),
                true,
            )
        } else {
            minted(
                &real,
                start + i * 600_000,
                InvoiceStatus::Paid,
                (&real.customer_id, &real.subscription_id),
                true,
            )
        };
        insert(&*inner, &inv).await;
        all.push(inv);
    }
    for f in [
        Filters {
            status: Some(InvoiceStatus::Void),
            ..Filters::default()
        },
        Filters {
            customer_id: Some(rare.clone()),
            ..Filters::default()
        },
        Filters {
            subscription_id: Some(sub.clone()),
            ..Filters::default()
        },
    ] {
        let want = kept(&all, &f);
        assert_eq!(want.len(), 200);
        let counting = Arc::new(CountingStore::new(Arc::clone(&inner)));
        let (cd, _) = deps_on(counting.clone());
        let (got, total) = page_of(&cd, &f, 16, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(total, 200);
        assert_eq!(got, want[150..160].to_vec());
        // Two markers, the counter items (8 shards: years, months, a
        // month's days), a day's entries (15) and the page; reading
        // through would read 160, filtering the list 1,600.
        let bound = 2 + 8 * (2 + 2 + 31) + 15 + 10;
        assert!(
            counting.items_read() <= bound,
            "{f:?}: read {} (bound {bound})",
            counting.items_read()
        );
    }
}

/// The totals of every status, customer and subscription of `all` as
/// stored now equal their counts, and each status's first page is right.
async fn assert_totals(d: &Deps, store: &dyn Store, ids: &[BillingInvoiceId], name: &str) {
    let mut now = Vec::new();
    for id in ids {
        let inv: BillingInvoice = crate::domain::record::get(store, &BillingInvoice::key(id))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("{id}"));
        now.push(inv);
    }
    for f in filters_of(&now) {
        let want = kept(&now, &f);
        let (got, total) = page_of(d, &f, 1, 100)
            .await
            .unwrap_or_else(|e| panic!("{name} {f:?} {e}"));
        assert_eq!(total, want.len() as u64, "{name} {f:?}");
        assert_eq!(got, want, "{name} {f:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_status_changes_keep_every_total_exact() {
    for (name, store) in stores().await {
        mark(&*store, true).await;
        let (d, _) = deps_on(store.clone());
        let p = plan(&d, "Fibre 50", 150_000).await;
        let (a, b) = (
            customer(&d, "Sita Rai").await,
            customer(&d, "Ram Thapa").await,
        );
        let mut made = Vec::new();
        for i in 0..12 {
            let c = if i % 3 == 0 { &b } else { &a };
            made.push(first_invoice(&d, c, &p).await);
        }
        let now = d.clock.now();
        // Each invoice raced by a void, a write-off and an overdue mark
        // (one wins, the next may follow); every third also paid.
        let mut tasks = Vec::new();
        for (i, inv) in made.iter().enumerate() {
            let t = tenant();
            for k in 0..3 {
                let (d, t, id) = (d.clone(), t.clone(), inv.id.clone());
                tasks.push(tokio::spawn(async move {
                    let r = match k {
                        0 => void(&d, &t, &id, now).await,
                        1 => mark_uncollectible(&d, &t, &id, now).await,
                        _ => mark_overdue(&d, &t, &id, now).await,
                    };
                    match r {
                        Ok(_) | Err(BillingInvoiceError::Refused(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }));
            }
            if i % 3 == 0 {
                let (d, t, inv) = (d.clone(), t.clone(), inv.clone());
                tasks.push(tokio::spawn(async move {
                    let pay = OutOfBand {
                        method: OutOfBandMethod::Cash,
                        received_on: chrono::NaiveDate::from_ymd_opt(2026, 1, 10)
                            .unwrap_or_default(),
                        reference: format!("R-{}", inv.number),
                        recorded_by: crate::ids::UserId::new(),
                        amount: inv.amount_due,
                    };
                    match record_out_of_band_payment(&d, &t, &inv.id, pay, now).await {
                        Ok(_) | Err(BillingInvoiceError::Refused(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap_or_else(|e| panic!("{e}"));
        }
        let ids: Vec<BillingInvoiceId> = made.iter().map(|i| i.id.clone()).collect();
        assert_totals(&d, &*store, &ids, name).await;
    }
}

#[tokio::test]
async fn issues_prorations_and_payments_enter_and_move_their_invoices() {
    let store = crate::testenv::memory_store();
    mark(&*store, true).await;
    let (d, clock) = deps_on(store.clone());
    let c = customer(&d, "Sita Rai").await;
    let basic = plan(&d, "Basic", 99_900).await;
    let pro = plan(&d, "Pro", 199_900).await;
    let first = first_invoice(&d, &c, &basic).await;
    let other = first_invoice(&d, &c, &basic).await;
    let pay = OutOfBand {
        method: OutOfBandMethod::Cash,
        received_on: chrono::NaiveDate::from_ymd_opt(2026, 1, 10).unwrap_or_default(),
        reference: "R-1".into(),
        recorded_by: crate::ids::UserId::new(),
        amount: first.amount_due,
    };
    record_out_of_band_payment(&d, &tenant(), &first.id, pay, d.clock.now())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    clock.advance(chrono::Duration::days(5));
    let body: ChangePlan = serde_json::from_value(
        json!({"newPlanId": pro.id, "prorationBehavior": "create_prorations"}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let changed = change_plan(&d, &tenant(), &first.subscription_id, body)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let proration = changed
        .invoice
        .unwrap_or_else(|| panic!("a proration invoice"));
    assert_eq!(proration.kind, InvoiceKind::Proration);
    let ids = [first.id.clone(), other.id.clone(), proration.id.clone()];
    assert_totals(&d, &*store, &ids, "embedded").await;
    let open = Filters {
        status: Some(InvoiceStatus::Open),
        subscription_id: Some(first.subscription_id.clone()),
        ..Filters::default()
    };
    let (got, total) = page_of(&d, &open, 1, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((got, total), (vec![proration.id.to_string()], 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn older_invoices_answer_the_old_way_until_the_migration_narrows_them_once() {
    let (store, mut all) = seeded(false, 180).await;
    let (d, _) = deps_on(store.clone());
    // The one issued now is narrowed; the older ones are not.
    assert!(all.iter().filter(|i| i.narrowed).count() == 1);
    // A status change of an older invoice: no count moved, the
    // migration counts it as it is then.
    let older = all[3].clone();
    assert_eq!(older.status, InvoiceStatus::Open);
    let now = d.clock.now();
    void(&d, &tenant(), &older.id, now)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    all[3].status = InvoiceStatus::Void;
    // Uncovered: the whole list filtered, within its window.
    for f in filters_of(&all).into_iter().take(8) {
        let want = kept(&all, &f);
        let (got, total) = page_of(&d, &f, 2, 5)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(total, want.len() as u64, "{f:?}");
        let from = 5.min(want.len());
        assert_eq!(got, want[from..(from + 5).min(want.len())].to_vec());
        match page_of(&d, &f, 101, 100).await {
            Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some("page")),
            Ok(_) => panic!("an uncovered filter past its window"),
        }
    }
    // Two migrations, and older open invoices voided meanwhile (a void
    // that finds its invoice narrowed since it read it re-reads it and
    // moves its count).
    let racing: Vec<usize> = (20..120)
        .filter(|&i| all[i].status == InvoiceStatus::Open)
        .collect();
    assert!(racing.len() > 20);
    let voids = racing.iter().map(|&i| {
        let (d, id) = (d.clone(), all[i].id.clone());
        tokio::spawn(async move { void(&d, &tenant(), &id, now).await })
    });
    let voids: Vec<_> = voids.collect();
    // One read before the migration, written after it.
    let k = (121..180)
        .find(|&i| all[i].status == InvoiceStatus::Open)
        .unwrap_or_else(|| panic!("an open invoice"));
    let stale: BillingInvoice =
        crate::domain::record::get(&*store, &BillingInvoice::key(&all[k].id))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("invoice"));
    assert!(!stale.narrowed);
    let t = tenant();
    let (a, b) = tokio::join!(
        lists_migration::migrate(&*store, &t),
        lists_migration::migrate(&*store, &t)
    );
    for v in voids {
        v.await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for &i in &racing {
        all[i].status = InvoiceStatus::Void;
    }
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(
        a.billing_invoices_by_filter.listed + b.billing_invoices_by_filter.listed,
        180,
        "{a:?} {b:?}"
    );
    let again = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            again.billing_invoices_by_filter.listed,
            again.billing_invoices_by_filter.already
        ),
        (0, 181)
    );
    assert!(
        counted::covered_narrowing(&*store, &tenant(), Narrowing::BillingInvoicesByFilter)
            .await
            .unwrap_or(false)
    );
    // The change read before the migration no longer holds: the
    // migration counted it open, so it must not move it unnarrowed.
    let change = stale.status_change(InvoiceStatus::Void);
    let write = crate::store::TxOp::Update {
        key: stale.item_key(),
        update: change.changes.into(),
        cond: Some(change.cond),
    };
    let refused = store.transact(vec![write]).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.is_condition_failure()),
        "{refused:?}"
    );
    assert_exact(&d, &all).await;
    // Re-read, it moves.
    void(&d, &tenant(), &stale.id, now)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    all[k].status = InvoiceStatus::Void;
    assert_exact(&d, &all).await;
    // Narrowed now, a status change moves it.
    let moved = all[6].clone();
    assert_eq!(moved.status, InvoiceStatus::Paid);
    let refused = void(&d, &tenant(), &moved.id, now).await;
    assert!(matches!(refused, Err(BillingInvoiceError::Refused(_))));
    let open = all[1].clone();
    assert_eq!(open.status, InvoiceStatus::Open);
    mark_uncollectible(&d, &tenant(), &open.id, now)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    all[1].status = InvoiceStatus::Uncollectible;
    assert_exact(&d, &all).await;
}

#[tokio::test]
async fn a_combination_past_the_window_is_refused_naming_its_filter() {
    let (store, all) = seeded(true, 20).await;
    let (d, _) = deps_on(store.clone());
    let (c, s) = (all[0].customer_id.clone(), all[0].subscription_id.clone());
    // Counters saying the customer and the subscription hold more than
    // 10,000 invoices (the records are not needed: only the counters are
    // read).
    for list in [
        BillingInvoice::by_customer(&tenant(), &c),
        BillingInvoice::by_subscription(&tenant(), &s),
    ] {
        let mut ops = Vec::new();
        for _ in 0..crate::domain::billing::customers::MAX_WINDOW {
            let id = BillingInvoiceId::new();
            merge_counts(&mut ops, list.count_new(id.as_str(), all[0].created_at));
        }
        store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
    }
    let status = Some(InvoiceStatus::Open);
    for (f, param) in [
        (
            Filters {
                status,
                customer_id: Some(c.clone()),
                ..Filters::default()
            },
            "status",
        ),
        (
            Filters {
                status,
                subscription_id: Some(s.clone()),
                ..Filters::default()
            },
            "status",
        ),
        (
            Filters {
                customer_id: Some(c.clone()),
                subscription_id: Some(s.clone()),
                ..Filters::default()
            },
            "customerId",
        ),
    ] {
        match page_of(&d, &f, 1, 10).await {
            Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some(param), "{f:?}"),
            Ok(_) => panic!("{f:?}: a combination past the window"),
        }
    }
    // One filter alone still answers (its total from the counters), and
    // a search scans the newest of the narrowest.
    let (_, total) = page_of(
        &d,
        &Filters {
            customer_id: Some(c.clone()),
            ..Filters::default()
        },
        500,
        10,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(total > 10_000);
    let f = Filters {
        status,
        customer_id: Some(c.clone()),
        search: Some("inv_".into()),
        ..Filters::default()
    };
    let (got, total) = page_of(&d, &f, 1, 100)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, kept(&all, &f));
    assert_eq!(total, got.len() as u64);
}

#[test]
fn only_status_change_sets_an_invoices_status_and_nothing_its_owners() {
    let mut found = Vec::new();
    for (name, flat) in
        crate::testenv::flat_sources(&["shared/src", "functions", "infra", "edge/src"])
    {
        let n = flat.matches("BillingInvoice::STATUS,").count();
        let allowed = usize::from(name == "shared/src/domain/billing/invoice/narrowed.rs");
        if n != allowed {
            found.push(format!("{name}: {n} × its status"));
        }
        // Its customer and subscription never change (their entries are
        // written once).
        for attr in [
            "BillingInvoice::CUSTOMER_ID,",
            "BillingInvoice::SUBSCRIPTION_ID,",
        ] {
            if flat.contains(attr) {
                found.push(format!("{name}: {attr}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "an invoice's status set outside status_change, or its customer or subscription set: {found:?}"
    );
}
