use std::sync::Arc;

use serde_json::Map;

use super::*;
use crate::domain::Mode;
use crate::domain::payments::{self, AttemptInfo, Checks, Payment, PaymentStatus};
use crate::ids::{PaymentId, SessionId};
use crate::money::{Currency, Paisa};
use crate::store::counting::CountingStore;
use crate::testenv::memory_store;

fn at(s: &str) -> Timestamp {
    Timestamp::parse(s).unwrap_or_else(|| panic!("time {s}"))
}

fn ms(s: &str) -> i64 {
    at(s).unix_millis()
}

fn tenant() -> Tenant {
    Tenant::new("proj_lists", Mode::Live)
}

fn payment(created: Timestamp, status: PaymentStatus, provider: Provider) -> Payment {
    Payment {
        id: PaymentId::new(),
        project_id: tenant().project,
        checkout_session_id: SessionId::new(),
        mode: Mode::Live,
        amount: Paisa::new(1000).unwrap_or_default(),
        amount_refunded: Paisa::ZERO,
        amount_reserved: Paisa::ZERO,
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider,
        status,
        provider_ref: None,
        failure_reason: None,
        metadata: Map::new(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: created,
        updated_at: created,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo::default(),
        checks: Checks::default(),
    }
}

async fn mark_covered(store: &dyn Store) {
    let marker = ListsMarker::new(&tenant());
    let item = marker.to_item().unwrap_or_else(|e| panic!("{e}"));
    store
        .put(item, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

const STATUSES: [PaymentStatus; 3] = [
    PaymentStatus::Success,
    PaymentStatus::Failed,
    PaymentStatus::Pending,
];

/// Payments spread over years, months, days and within a day, with
/// several at one millisecond; `n` of them.
fn spread(n: usize) -> Vec<Payment> {
    let base = ms("2024-11-28T22:00:00.000Z");
    (0..n)
        .map(|i| {
            // Uneven steps: some hours, some days, some at the same ms.
            let step = match i % 7 {
                0 => 0,
                1 => 3_600_000 * 5,
                2 => 86_400_000 * 3 + 1,
                3 => 86_400_000 * 17,
                4 => 1,
                5 => 86_400_000 * 40,
                _ => 600_000,
            };
            let t = base + (i as i64) * 86_400_000 * 2 + step;
            let created = Timestamp::from_unix_millis(t).unwrap_or_else(|| panic!("ms"));
            payment(created, STATUSES[i % 3], Provider::ALL[(i / 2) % 3])
        })
        .collect()
}

/// What a list should answer: matching payments newest first (by sort
/// key), and their number.
fn expected(all: &[Payment], filter: &ListFilter) -> Vec<PaymentId> {
    let mut hits: Vec<&Payment> = all.iter().filter(|p| filter.selects(*p)).collect();
    hits.sort_by_key(|p| std::cmp::Reverse(sort_key(p.created_at, &p.id)));
    hits.into_iter().map(|p| p.id.clone()).collect()
}

async fn seeded(n: usize) -> (Arc<dyn Store>, Vec<Payment>) {
    let store = memory_store();
    mark_covered(&*store).await;
    let all = spread(n);
    for p in &all {
        payments::insert(&*store, p)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    (store, all)
}

async fn read(
    store: &dyn Store,
    filter: &ListFilter,
    offset: usize,
    limit: usize,
) -> (Vec<PaymentId>, u64) {
    let (page, total, _) = page::<Payment>(
        store,
        &tenant(),
        filter,
        &Window::at(offset, limit),
        None,
        true,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    (page.into_iter().map(|p| p.id).collect(), total)
}

fn filters() -> Vec<ListFilter> {
    let mut out = Vec::new();
    let ranges = [
        (None, None),
        (Some("2025-01-01T00:00:00.000Z"), None),
        (None, Some("2025-03-15T12:00:00.000Z")),
        (
            Some("2024-12-30T13:00:00.000Z"),
            Some("2026-02-02T05:00:00.000Z"),
        ),
        (
            Some("2025-02-03T00:00:00.000Z"),
            Some("2025-02-03T00:00:00.001Z"),
        ),
    ];
    for (from, to) in ranges {
        for status in [None, Some(PaymentStatus::Failed)] {
            for provider in [None, Some(Provider::Khalti)] {
                out.push(ListFilter {
                    status: status.map(|s| status_name(&s)),
                    provider,
                    from: from.map(at),
                    to: to.map(at),
                });
            }
        }
    }
    out
}

#[test]
fn a_range_is_cut_into_whole_years_months_days_and_partial_days() {
    let lo = ms("2024-12-30T10:00:00.000Z");
    let hi = ms("2027-02-02T05:00:00.000Z");
    let segs = segments(lo, hi);
    // Contiguous, covering exactly [lo, hi).
    assert_eq!(segs.first().map(|s| s.lo), Some(lo));
    assert_eq!(segs.last().map(|s| s.hi), Some(hi));
    assert!(segs.windows(2).all(|w| w[0].hi == w[1].lo));
    let units: Vec<Option<Unit>> = segs.iter().map(|s| s.unit).collect();
    assert_eq!(
        units,
        vec![
            None,              // 30 Dec from 10:00
            Some(Unit::Day),   // 31 Dec
            Some(Unit::Year),  // 2025
            Some(Unit::Year),  // 2026
            Some(Unit::Month), // Jan 2027
            Some(Unit::Day),   // 1 Feb
            None,              // 2 Feb to 05:00
        ]
    );
    // Within one day: one partial segment.
    let one = segments(
        ms("2026-11-29T01:00:00.000Z"),
        ms("2026-11-29T02:00:00.000Z"),
    );
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].unit, None);
    // A whole leap February is one month.
    let feb = segments(
        ms("2028-02-01T00:00:00.000Z"),
        ms("2028-03-01T00:00:00.000Z"),
    );
    assert_eq!(
        feb.iter().map(|s| s.unit).collect::<Vec<_>>(),
        vec![Some(Unit::Month)]
    );
    assert_eq!(children(feb[0]).len(), 29);
    // Bounded whatever the length: at most 30 + 11 days and months each
    // side, two partial days, and the years between.
    let long = segments(
        ms("1990-06-15T03:00:00.000Z"),
        ms("2030-06-15T03:00:00.000Z"),
    );
    assert!(long.len() <= 2 * (30 + 11 + 1) + 40, "{}", long.len());
}

#[test]
fn counts_fold_into_a_write_of_the_same_item() {
    let p = payment(
        at("2026-11-29T01:00:00.000Z"),
        PaymentStatus::Pending,
        Provider::Khalti,
    );
    let mut ops = count_new(&p);
    assert_eq!(ops.len(), 3, "year, month and day");
    let mut moved = p.clone();
    moved.checks.listed = true;
    let change = moved.status_change(PaymentStatus::Cancelled);
    merge_counts(&mut ops, change.also);
    assert_eq!(ops.len(), 3, "the same three items");
    let TxOp::Update { update, .. } = &ops[0] else {
        panic!("an update")
    };
    let adds: BTreeMap<String, i64> = update.add.iter().cloned().collect();
    assert_eq!(adds.get("c_all"), Some(&1));
    assert_eq!(adds.get("c_s_pending"), Some(&0));
    assert_eq!(adds.get("c_s_cancelled"), Some(&1));
    assert_eq!(adds.get("c_sp_cancelled_khalti"), Some(&1));
}

/// Every filter and combination, at every offset: the page and its
/// total are the brute-force answer (deep offsets walk the counters).
#[tokio::test]
async fn every_filter_pages_and_counts_exactly_at_any_offset() {
    let (store, all) = seeded(150).await;
    for filter in filters() {
        let want = expected(&all, &filter);
        for offset in [0, 1, 7, 99, 100, 101, 120, 149, 150, 400] {
            let (got, total) = read(&*store, &filter, offset, 9).await;
            assert_eq!(total, want.len() as u64, "{filter:?}");
            let end = (offset + 9).min(want.len());
            let slice = if offset < want.len() {
                want[offset..end].to_vec()
            } else {
                Vec::new()
            };
            assert_eq!(got, slice, "{filter:?} offset {offset}");
        }
    }
}

/// A deep offset reads its counters and its day's entries at most, not
/// the skipped ones.
#[tokio::test]
async fn a_deep_offset_reads_a_bounded_number_of_items() {
    let inner = memory_store();
    mark_covered(&*inner).await;
    let start = ms("2026-10-20T00:00:00.000Z");
    let mut all = Vec::new();
    for i in 0..2000i64 {
        let created =
            Timestamp::from_unix_millis(start + i * 600_000).unwrap_or_else(|| panic!("ms"));
        let p = payment(created, STATUSES[(i % 3) as usize], Provider::Khalti);
        payments::insert(&*inner, &p)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        all.push(p);
    }
    let store = CountingStore::new(inner);
    let filter = ListFilter::default();
    let want = expected(&all, &filter);
    let (got, total) = read(&store, &filter, 1900, 10).await;
    assert_eq!(total, 2000);
    assert_eq!(got, want[1900..1910].to_vec());
    // Counter items (8 shards: a year, two months, a month's days), one
    // day's entries (144) and the page: far below the 1,910 a skip reads.
    let bound = 8 * (1 + 2 + 31) + 144 + 10;
    assert!(
        store.items_read() <= bound,
        "read {} items (bound {bound})",
        store.items_read()
    );
}

/// `starting_after` / `Before` on a filtered list: the pages around a
/// record, as walking reaches them.
#[tokio::test]
async fn a_page_after_or_before_a_record_is_the_walked_page() {
    let (store, all) = seeded(80).await;
    let filter = ListFilter {
        provider: Some(Provider::Esewa),
        ..Default::default()
    };
    let want = expected(&all, &filter);
    let pick = |i: usize| {
        all.iter()
            .find(|p| p.id == want[i])
            .cloned()
            .unwrap_or_else(|| panic!("record"))
    };
    for i in [0, 3, 10, want.len() - 1] {
        let r = pick(i);
        let window = Window {
            offset: 0,
            limit: 5,
            seek: Seek::After(r.id.to_string()),
        };
        let (found, total, _) =
            page::<Payment>(&*store, &tenant(), &filter, &window, Some(&r), true)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(total, want.len() as u64);
        let got: Vec<PaymentId> = found.into_iter().map(|p| p.id).collect();
        assert_eq!(
            got,
            want[(i + 1).min(want.len())..(i + 6).min(want.len())].to_vec()
        );
        let window = Window {
            seek: Seek::Before(r.id.to_string()),
            ..window
        };
        let (found, _, _) = page::<Payment>(&*store, &tenant(), &filter, &window, Some(&r), true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<PaymentId> = found.into_iter().map(|p| p.id).collect();
        assert_eq!(got, want[i.saturating_sub(5)..i].to_vec());
    }
}

/// A status change moves a payment between the filtered lists and their
/// totals, in the day, month and year of its creation.
#[tokio::test]
async fn a_status_change_moves_a_payment_between_lists() {
    let (store, mut all) = seeded(30).await;
    let pending: Vec<usize> = (0..all.len())
        .filter(|i| all[*i].status == PaymentStatus::Pending)
        .collect();
    for i in pending.iter().take(4) {
        let stored = payments::get(&*store, &all[*i].id)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("stored"));
        assert!(stored.checks.listed, "listed at insert");
        let change = stored.status_change(PaymentStatus::Success);
        let mut ops = vec![TxOp::Update {
            key: Payment::key(&stored.id),
            update: change.changes.into(),
            cond: Some(change.cond),
        }];
        ops.extend(change.also);
        store.transact(ops).await.unwrap_or_else(|e| panic!("{e}"));
        all[*i].status = PaymentStatus::Success;
        // Applying the same (now stale) change again is refused.
        let stale = stored.status_change(PaymentStatus::Failed);
        let mut ops = vec![TxOp::Update {
            key: Payment::key(&stored.id),
            update: stale.changes.into(),
            cond: Some(stale.cond),
        }];
        ops.extend(stale.also);
        assert!(store.transact(ops).await.is_err());
    }
    for filter in filters() {
        let want = expected(&all, &filter);
        for offset in [0, 12] {
            let (got, total) = read(&*store, &filter, offset, 50).await;
            assert_eq!(total, want.len() as u64, "{filter:?}");
            assert_eq!(got, want[offset.min(want.len())..].to_vec(), "{filter:?}");
        }
    }
}

/// Concurrent inserts of one day keep every total exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_inserts_keep_totals_exact() {
    let store = memory_store();
    mark_covered(&*store).await;
    let created = at("2026-11-29T08:00:00.000Z");
    let mut tasks = Vec::new();
    for i in 0..40 {
        let store = store.clone();
        let p = payment(created, STATUSES[i % 3], Provider::ALL[i % 3]);
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                match payments::insert(&*store, &p).await {
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
    let (_, total) = read(&*store, &ListFilter::default(), 0, 1).await;
    assert_eq!(total, 40);
    let failed = ListFilter {
        status: Some(status_name(&PaymentStatus::Failed)),
        from: Some(at("2026-11-01T00:00:00.000Z")),
        ..Default::default()
    };
    let (_, total) = read(&*store, &failed, 0, 1).await;
    assert_eq!(total, 13);
}

/// Payments written before the lists: not listed, not counted.
async fn seeded_unlisted(n: usize) -> (Arc<dyn Store>, Vec<Payment>) {
    let store = memory_store();
    let all = spread(n);
    for p in &all {
        let mut item = p.to_item().unwrap_or_else(|e| panic!("{e}"));
        for index in [Index::Gsi3, Index::Gsi4, Index::Gsi5, Index::Gsi6] {
            item.remove(index.pk_attr());
            item.remove(index.sk_attr());
        }
        store
            .put(item, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    (store, all)
}

fn all_payments() -> Query {
    Query::partition(keys::per_mode(
        &tenant().project,
        tenant().mode,
        keys::PerMode::Payments,
    ))
    .on(Index::Gsi1)
}

/// The migration lists and counts every older payment once: a rerun and
/// a concurrent run count nothing twice, then the tenant is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_counts_every_older_record_once() {
    let (store, all) = seeded_unlisted(60).await;
    assert!(
        !covered(&*store, &tenant(), ListKind::Payments)
            .await
            .unwrap_or(true)
    );
    let t = tenant();
    let (a, b) = tokio::join!(
        migrate::<Payment>(&*store, &t, all_payments()),
        migrate::<Payment>(&*store, &t, all_payments())
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(a.listed + b.listed, 60, "{a:?} {b:?}");
    let again = migrate::<Payment>(&*store, &tenant(), all_payments())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.listed, again.already), (0, 60));
    assert!(
        covered(&*store, &tenant(), ListKind::Payments)
            .await
            .unwrap_or(false)
    );
    for filter in filters() {
        let want = expected(&all, &filter);
        let (got, total) = read(&*store, &filter, 0, 100).await;
        assert_eq!(total, want.len() as u64, "{filter:?}");
        assert_eq!(got, want, "{filter:?}");
    }
}

/// A status change of a payment the migration has not listed yet leaves
/// its counting to the migration; one racing the migration is refused
/// and re-read, so no count is lost or doubled.
#[tokio::test]
async fn a_status_change_before_the_migration_is_counted_once() {
    let (store, mut all) = seeded_unlisted(12).await;
    let i = all
        .iter()
        .position(|p| p.status == PaymentStatus::Pending)
        .unwrap_or_else(|| panic!("a pending one"));
    let stored = payments::get(&*store, &all[i].id)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("stored"));
    assert!(!stored.checks.listed);
    let change = stored.status_change(PaymentStatus::Failed);
    assert!(
        change.also.is_empty(),
        "nothing counted before the migration"
    );
    store
        .update(
            &Payment::key(&stored.id),
            change.changes.into(),
            Some(change.cond),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    all[i].status = PaymentStatus::Failed;
    migrate::<Payment>(&*store, &tenant(), all_payments())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The copy read before the migration no longer applies.
    let stale = stored.status_change(PaymentStatus::Success);
    assert!(
        store
            .update(
                &Payment::key(&stored.id),
                stale.changes.into(),
                Some(stale.cond)
            )
            .await
            .is_err()
    );
    for filter in filters() {
        let want = expected(&all, &filter);
        let (_, total) = read(&*store, &filter, 0, 1).await;
        assert_eq!(total, want.len() as u64, "{filter:?}");
    }
}

/// Before the migration a filtered list is counted through its index
/// (what the index holds), and an unfiltered one stays whole.
#[tokio::test]
async fn an_uncovered_tenant_counts_through_the_index() {
    let (store, _) = seeded_unlisted(5).await;
    let extra = payment(
        at("2026-11-29T08:00:00.000Z"),
        PaymentStatus::Success,
        Provider::Khalti,
    );
    payments::insert(&*store, &extra)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let filter = ListFilter {
        provider: Some(Provider::Khalti),
        ..Default::default()
    };
    let (page, total, _) =
        page::<Payment>(&*store, &tenant(), &filter, &Window::first(10), None, false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((page.len(), total), (1, 1));
}

/// Every status change of a payment or refund goes through its
/// `status_change` (which moves its list entries and counters): no other
/// code of the crate sets the status attribute.
#[test]
fn statuses_are_set_only_through_status_change() {
    let mut found = Vec::new();
    for (name, flat) in crate::testenv::flat_sources(&["shared/src"]) {
        if name == "shared/src/domain/record.rs" {
            continue;
        }
        for needle in ["set(Payment::STATUS", "set(Refund::STATUS"] {
            let n = flat.matches(needle).count();
            let allowed = match (name.as_str(), needle) {
                ("shared/src/domain/payments.rs", "set(Payment::STATUS") => 1,
                ("shared/src/domain/refunds/mod.rs", "set(Refund::STATUS") => 1,
                _ => 0,
            };
            if n != allowed {
                found.push(format!("{name}: {n} × {needle}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "status set outside status_change: {found:?}"
    );
}
