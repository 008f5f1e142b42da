//! Subscriptions narrowed by status, plan, both and customer
//! (`counted::Narrowing::SubscriptionsByFilter`): every page of every
//! filter exact, a deep page at a bounded cost, racing status and plan
//! changes, the customer's combinations bounded by its count, the
//! migration of older subscriptions, and the older way before it.

use std::sync::Arc;

use serde_json::json;

use super::super::*;
use crate::domain::Mode;
use crate::domain::billing::customers::CreateCustomer;
use crate::domain::billing::plans::CreatePlan;
use crate::domain::billing::subscription;
use crate::domain::listing::{ListsMarker, merge_counts};
use crate::domain::lists_migration;
use crate::domain::record::Record;
use crate::store::Store;
use crate::store::counting::CountingStore;
use crate::testenv::at;
use crate::time::ManualClock;
use crate::{AppState, Config};
use SubscriptionStatus as S;

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
    Tenant::new("proj_subnarrow", Mode::Sandbox)
}

async fn mark(store: &dyn Store, narrowed: bool) {
    let mut ops = vec![ListsMarker::mark_counted(
        &tenant(),
        CountedKind::Subscriptions,
    )];
    if narrowed {
        ops.push(ListsMarker::mark_narrowing(
            &tenant(),
            Narrowing::SubscriptionsByFilter,
        ));
    }
    for op in ops {
        store
            .transact(vec![op])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Three customers and two plans of the tenant.
async fn customers_and_plans(deps: &Deps) -> (Vec<CustomerId>, Vec<PlanId>) {
    let mut cs = Vec::new();
    for name in ["Sita Rai", "Hari Thapa", "Gita Gurung"] {
        let body: CreateCustomer =
            serde_json::from_value(json!({"name": name})).unwrap_or_else(|e| panic!("{e}"));
        let c = customers::create(deps, &tenant(), body, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        cs.push(c.id);
    }
    let mut ps = Vec::new();
    for name in ["Fibre 50", "Fibre 100"] {
        let body: CreatePlan = serde_json::from_value(
            json!({"name": name, "amount": 150_000, "intervalUnit": "month"}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let p = plans::create(deps, &tenant(), body, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ps.push(p.id);
    }
    (cs, ps)
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

/// `template` again, minted at `ms`, with these fields.
fn minted(
    template: &Subscription,
    ms: i64,
    (status, plan, customer): (S, &PlanId, &CustomerId),
    narrowed: bool,
) -> Subscription {
    let ulid = ulid::Ulid::from_parts(
        u64::try_from(ms).unwrap_or(0),
        rand::random::<u128>() & ((1u128 << 80) - 1),
    );
    let mut s = template.clone();
    s.id = SubscriptionId::stored(format!("sub_{}", ulid.to_string().to_ascii_lowercase()));
    s.created_at = Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"));
    s.status = status;
    s.plan_id = plan.clone();
    s.customer_id = customer.clone();
    s.narrowed = narrowed;
    s
}

/// Written as a create writes it, with its counts.
async fn insert(store: &dyn Store, s: &Subscription) {
    let mut ops = vec![s.put_new().unwrap_or_else(|e| panic!("{e}"))];
    ops.extend(s.counts_new());
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
}

fn ms(s: &str) -> i64 {
    at(s).unix_millis()
}

const STATUSES: [S; 4] = [S::Active, S::Trialing, S::Paused, S::Cancelled];

/// The real subscription and `n` more over years, months and days, in
/// every status, plan and customer.
async fn seeded(
    n: usize,
    narrowed: bool,
) -> (
    Arc<dyn Store>,
    AppState,
    Vec<Subscription>,
    Vec<CustomerId>,
    Vec<PlanId>,
) {
    let store = crate::testenv::memory_store();
    mark(&*store, narrowed).await;
    let d = deps_on(store.clone());
    let (cs, ps) = customers_and_plans(&d).await;
    let real = subscribe(&d, &cs[0], &ps[0]).await;
    let base = ms("2024-11-28T22:00:00Z");
    let mut all = vec![real.clone()];
    for i in 0..n {
        let step = [0, 3_600_000 * 5, 86_400_000 * 3 + 1, 1][i % 4];
        let s = minted(
            &real,
            base + (i as i64) * 86_400_000 + step,
            (
                STATUSES[[0, 1, 0, 2, 3, 0][i % 6]],
                &ps[[0, 1, 1][i % 3]],
                &cs[[0, 1, 2, 1, 2][i % 5]],
            ),
            narrowed,
        );
        insert(&*store, &s).await;
        all.push(s);
    }
    (store, d, all, cs, ps)
}

fn want(all: &[Subscription], f: &ListFilter) -> Vec<String> {
    let mut ids: Vec<String> = all
        .iter()
        .filter(|s| f.status.is_none_or(|x| s.status == x))
        .filter(|s| f.plan_id.as_ref().is_none_or(|x| &s.plan_id == x))
        .filter(|s| f.customer_id.as_ref().is_none_or(|x| &s.customer_id == x))
        .map(|s| s.id.to_string())
        .collect();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

fn filters(cs: &[CustomerId], ps: &[PlanId]) -> Vec<ListFilter> {
    let mut out = Vec::new();
    let statuses = [None, Some(S::Active), Some(S::Paused), Some(S::Cancelled)];
    let plans = [None, Some(ps[0].clone()), Some(ps[1].clone())];
    let customers = [None, Some(cs[0].clone()), Some(cs[2].clone())];
    for status in statuses {
        for plan_id in &plans {
            for customer_id in &customers {
                if status.is_none() && plan_id.is_none() && customer_id.is_none() {
                    continue;
                }
                out.push(ListFilter {
                    status,
                    customer_id: customer_id.clone(),
                    plan_id: plan_id.clone(),
                });
            }
        }
    }
    out
}

async fn assert_exact(d: &Deps, all: &[Subscription], cs: &[CustomerId], ps: &[PlanId]) {
    let limit = 7;
    for f in filters(cs, ps) {
        let want = want(all, &f);
        let last = want.len().div_ceil(limit).max(1);
        for page in [1, 2, 15, 16, 22, last, last + 1] {
            let (found, total) = list(d, &tenant(), PageRequest { page, limit }, &f)
                .await
                .unwrap_or_else(|e| panic!("{f:?}: {e}"));
            assert_eq!(total, want.len() as u64, "{f:?}");
            let from = ((page - 1) * limit).min(want.len());
            let to = (from + limit).min(want.len());
            let got: Vec<String> = found.iter().map(|s| s.id.to_string()).collect();
            assert_eq!(got, want[from..to].to_vec(), "{f:?} page {page}");
        }
    }
}

#[tokio::test]
async fn every_filter_pages_and_counts_exactly() {
    let (_, d, all, cs, ps) = seeded(400, true).await;
    assert_exact(&d, &all, &cs, &ps).await;
}

#[tokio::test]
async fn a_deep_page_of_a_rare_status_or_a_plan_reads_a_bounded_number_of_items() {
    let inner = crate::testenv::memory_store();
    mark(&*inner, true).await;
    let d = deps_on(inner.clone());
    let (cs, ps) = customers_and_plans(&d).await;
    let real = subscribe(&d, &cs[0], &ps[0]).await;
    let start = ms("2025-10-20T00:00:00Z");
    let mut all = vec![real.clone()];
    for i in 0..2000i64 {
        // Paused is rare (one in ten); the second plan one in four.
        let status = if i % 10 == 0 { S::Paused } else { S::Active };
        let plan = &ps[usize::from(i % 4 == 0)];
        let s = minted(&real, start + i * 600_000, (status, plan, &cs[1]), true);
        insert(&*inner, &s).await;
        all.push(s);
    }
    let counting = Arc::new(CountingStore::new(Arc::clone(&inner)));
    let d = deps_on(counting.clone());
    for (f, page, total) in [
        (
            ListFilter {
                status: Some(S::Paused),
                ..ListFilter::default()
            },
            16,
            200,
        ),
        (
            ListFilter {
                plan_id: Some(ps[1].clone()),
                ..ListFilter::default()
            },
            46,
            500,
        ),
    ] {
        let before = counting.items_read();
        let (found, got_total) = list(&d, &tenant(), PageRequest { page, limit: 10 }, &f)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got_total, total);
        let w = want(&all, &f);
        let got: Vec<String> = found.iter().map(|s| s.id.to_string()).collect();
        assert_eq!(got, w[(page - 1) * 10..page * 10].to_vec());
        // The markers, counter items (8 shards: two years, three months,
        // a month's days), one day's entries (144) and the page.
        let bound = 2 + 8 * (2 + 3 + 31) + 144 + 10;
        let read = counting.items_read() - before;
        assert!(read <= bound, "{f:?}: read {read} (bound {bound})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_status_and_plan_changes_keep_every_total_exact() {
    let (store, d, mut all, cs, ps) = seeded(120, true).await;
    // 40 subscriptions change at once (a status, a plan, or both), while
    // 10 new ones are created, on the same counter shards.
    let changes: Vec<(usize, Option<S>, Option<PlanId>)> = (0..40)
        .map(|k| {
            let i = 1 + k * 3;
            match k % 3 {
                0 => (i, Some(S::Paused), None),
                1 => (i, None, Some(ps[0].clone())),
                _ => (i, Some(S::Cancelled), Some(ps[1].clone())),
            }
        })
        .collect();
    let mut tasks = Vec::new();
    for (i, status, plan) in changes.clone() {
        let d = d.clone();
        let id = all[i].id.clone();
        tasks.push(tokio::spawn(async move {
            let decide = move |current: &Subscription| -> Result<Subscription, SubscriptionError> {
                let mut next = current.clone();
                if let Some(s) = status {
                    next.status = s;
                }
                if let Some(p) = &plan {
                    next.plan_id = p.clone();
                }
                Ok(next)
            };
            subscription::change(&d, &tenant(), &id, None, &decide, at(NOW))
                .await
                .map(|_| ())
                .unwrap_or_else(|e| panic!("{e}"));
        }));
    }
    for k in 0..10 {
        let (d, c, p) = (d.clone(), cs[k % 3].clone(), ps[k % 2].clone());
        tasks.push(tokio::spawn(async move {
            subscribe(&d, &c, &p).await;
        }));
    }
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let q = Subscription::counted_list_of(&tenant()).all();
    all.clear();
    for item in store
        .query(&q)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .items
    {
        all.push(crate::domain::record::from_item(item).unwrap_or_else(|e| panic!("{e}")));
    }
    assert_eq!(all.len(), 131);
    assert_exact(&d, &all, &cs, &ps).await;
}

#[tokio::test]
async fn a_customer_with_more_than_the_window_refuses_its_combinations_only() {
    let (store, d, all, cs, ps) = seeded(20, true).await;
    // 10,001 more of the first customer, counted in one transaction (a
    // day's counter items): their records are not needed to refuse.
    let of_customer = Subscription::of_customer(&tenant(), &cs[0]);
    let day = ms("2026-01-09T00:00:00Z");
    let mut counts = Vec::new();
    for i in 0..10_001i64 {
        let s = minted(&all[0], day + i, (S::Active, &ps[0], &cs[0]), true);
        merge_counts(&mut counts, of_customer.count_new(&s.id, s.created_at));
    }
    store
        .transact(counts)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let held = want(
        &all,
        &ListFilter {
            customer_id: Some(cs[0].clone()),
            ..ListFilter::default()
        },
    )
    .len() as u64;
    let first = PageRequest { page: 1, limit: 10 };
    let alone = ListFilter {
        customer_id: Some(cs[0].clone()),
        ..ListFilter::default()
    };
    let (_, total) = list(&d, &tenant(), first, &alone)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(total, held + 10_001, "the customer's own list: any page");
    for f in [
        ListFilter {
            status: Some(S::Active),
            ..alone.clone()
        },
        ListFilter {
            plan_id: Some(ps[0].clone()),
            ..alone.clone()
        },
    ] {
        match list(&d, &tenant(), first, &f).await {
            Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some("customerId")),
            Ok(_) => panic!("{f:?}: read past the window"),
        }
    }
    // Another customer's combinations are read.
    let other = ListFilter {
        status: Some(S::Active),
        customer_id: Some(cs[1].clone()),
        plan_id: None,
    };
    let (_, total) = list(&d, &tenant(), first, &other)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(total, want(&all, &other).len() as u64);
    // Its window still holds: page * limit at most MAX_WINDOW.
    let deep = PageRequest {
        page: 101,
        limit: 100,
    };
    match list(&d, &tenant(), deep, &other).await {
        Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some("page")),
        Ok(_) => panic!("a combination past its window"),
    }
    // A single filter has none.
    let status = ListFilter {
        status: Some(S::Active),
        ..ListFilter::default()
    };
    let (none, total) = list(&d, &tenant(), deep, &status)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(none.is_empty());
    assert_eq!(total, want(&all, &status).len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn older_subscriptions_are_read_the_older_way_until_migrated_once() {
    let (store, d, mut all, cs, ps) = seeded(90, false).await;
    // The real one was created narrowed (a new project's way).
    assert!(all[0].narrowed);
    assert!(!all[1].narrowed);
    // Not covered: a filter over the list (within its window), right.
    assert_exact(&d, &all, &cs, &ps).await;
    // A change of an older one moves no count (it has none).
    let older = all[1].clone();
    let mut next = older.clone();
    next.status = S::Paused;
    next.version += 1;
    let ops = subscription::write_ops(&next, Some(&older)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ops.len(), 1, "{ops:?}");
    store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
    all[1] = subscription::get(&d, &tenant(), &older.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stale = all[2].clone();
    let t = tenant();
    let (a, b) = tokio::join!(
        lists_migration::migrate(&*store, &t),
        lists_migration::migrate(&*store, &t)
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(
        a.subscriptions_by_filter.listed + b.subscriptions_by_filter.listed,
        90,
        "{a:?} {b:?}"
    );
    let again = lists_migration::migrate(&*store, &tenant())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            again.subscriptions_by_filter.listed,
            again.subscriptions_by_filter.already
        ),
        (0, 91)
    );
    // A whole write from a read before the migration is refused.
    let mut late = stale.clone();
    late.status = S::Cancelled;
    let ops = subscription::write_ops(&late, Some(&stale)).unwrap_or_else(|e| panic!("{e}"));
    let refused = store.transact(ops).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(StoreError::is_condition_failure),
        "{refused:?}"
    );
    assert_exact(&d, &all, &cs, &ps).await;
    // Migrated, a change moves its counts.
    let decide = |current: &Subscription| -> Result<Subscription, SubscriptionError> {
        let mut next = current.clone();
        next.status = S::Cancelled;
        next.plan_id = ps[0].clone();
        Ok(next)
    };
    let changed = subscription::change(&d, &tenant(), &all[5].id, None, &decide, at(NOW))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    all[5] = changed;
    assert_exact(&d, &all, &cs, &ps).await;
}

/// Every status or plan change of a subscription is a whole-record write
/// built by `subscription::write_ops` (which moves its narrowings'
/// counts): no code of the crate sets those attributes.
#[test]
fn status_and_plan_are_written_only_through_write_ops() {
    let mut found = Vec::new();
    for (name, flat) in crate::testenv::flat_sources(&["shared/src"]) {
        for needle in [
            "set(Subscription::STATUS",
            "set(Subscription::PLAN_ID",
            "set(Subscription::CUSTOMER_ID",
        ] {
            let n = flat.matches(needle).count();
            if n != 0 {
                found.push(format!("{name}: {n} × {needle}"));
            }
        }
        // The one whole write of a stored subscription.
        if name == "shared/src/domain/billing/subscription.rs" {
            let n = flat.matches(".to_item()").count();
            if n != 1 {
                found.push(format!("{name}: {n} × .to_item()"));
            }
        }
    }
    assert!(found.is_empty(), "written around write_ops: {found:?}");
}
