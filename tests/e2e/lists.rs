//! Filtered lists (issue 41 part 2, issue 37 item 11): `GET /v1/payments`
//! and `GET /v1/refunds` by `createdFrom` / `createdTo`, `status` and
//! `provider`, any combination, with exact totals, through the lists'
//! indexes and counters (`shared::domain::listing`); a deep offset is the
//! page walking reaches; a status change moves a payment between lists;
//! bad values are 400s naming the parameter. Both backends.

use dhukuti_tests::{Answer, Tenant, TestApp, Which, on_both_backends, spawn_app};
use serde_json::Map;
use shared::domain::account::Scope;
use shared::domain::attempts::{self, Decision};
use shared::domain::listing::{self, ListFilter, sort_key};
use shared::domain::payments::{self, Payment, PaymentStatus};
use shared::domain::record::Record;
use shared::domain::refunds::{Refund, RefundReason, RefundStatus};
use shared::domain::{Mode, Provider};
use shared::ids::{PaymentId, RefundId, SessionId};
use shared::money::{Currency, Paisa};
use shared::store::StoreError;
use shared::time::Timestamp;

fn at(s: &str) -> Timestamp {
    Timestamp::parse(s).unwrap_or_else(|| panic!("time {s}"))
}

fn ids(a: &Answer) -> Vec<String> {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|p| p["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn payment(t: &Tenant, created: Timestamp, status: PaymentStatus, provider: Provider) -> Payment {
    Payment {
        id: PaymentId::new(),
        project_id: t.project.id.clone(),
        checkout_session_id: SessionId::new(),
        mode: Mode::Sandbox,
        amount: Paisa::new(10_000).unwrap_or_default(),
        amount_refunded: Paisa::ZERO,
        amount_reserved: Paisa::ZERO,
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider,
        status,
        provider_ref: Some("REF-1".into()),
        failure_reason: None,
        metadata: Map::new(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: created,
        updated_at: created,
        double_payment_of: None,
        scanned_at: None,
        attempt: Default::default(),
        checks: Default::default(),
    }
}

/// Stores `p`, again when a concurrent insert's counters conflicted.
async fn insert(app: &TestApp, p: &Payment) {
    for _ in 0..50 {
        match payments::insert(&*app.store, p).await {
            Ok(()) => return,
            Err(StoreError::TransactionCanceled { .. }) => tokio::task::yield_now().await,
            Err(e) => panic!("insert: {e}"),
        }
    }
    panic!("never inserted");
}

/// A refund of `p` as stored with its counters (the provider's part is
/// `refunds.rs`'s).
async fn refund_of(app: &TestApp, p: &Payment, created: Timestamp, status: RefundStatus) -> Refund {
    let r = Refund {
        id: RefundId::new(),
        project_id: p.project_id.clone(),
        payment_id: p.id.clone(),
        mode: p.mode,
        provider: p.provider,
        amount: Paisa::new(100).unwrap_or_default(),
        currency: Currency::Npr,
        reason: RefundReason::CustomerRequest,
        status,
        provider_refund_id: None,
        failure_reason: None,
        notes: None,
        mobile_number: None,
        created_at: created,
        updated_at: created,
        fee: None,
        fee_source: None,
        listed: false,
    };
    let mut ops = vec![r.put_new().unwrap_or_else(|e| panic!("{e}"))];
    ops.extend(listing::count_new(&r));
    app.store
        .transact(ops)
        .await
        .unwrap_or_else(|e| panic!("refund: {e}"));
    r
}

/// The ids `filter` selects of `all`, newest first.
fn expected<'a>(
    all: impl Iterator<Item = (&'a str, Timestamp, String, Provider)>,
    filter: &ListFilter,
) -> Vec<String> {
    let mut hits: Vec<(String, String)> = all
        .filter(|(_, created, status, provider)| {
            let ms = created.unix_millis();
            filter.status.as_ref().is_none_or(|s| s == status)
                && filter.provider.is_none_or(|p| p == *provider)
                && filter.from.is_none_or(|f| ms >= f.unix_millis())
                && filter.to.is_none_or(|t| ms < t.unix_millis())
        })
        .map(|(id, created, _, _)| (sort_key(created, id), id.to_owned()))
        .collect();
    hits.sort_by(|a, b| b.0.cmp(&a.0));
    hits.into_iter().map(|(_, id)| id).collect()
}

fn query_of(filter: &ListFilter) -> String {
    let mut q = Vec::new();
    if let Some(s) = &filter.status {
        q.push(format!("status={s}"));
    }
    if let Some(p) = filter.provider {
        q.push(format!("provider={}", p.as_str()));
    }
    if let Some(f) = filter.from {
        q.push(format!("createdFrom={f}"));
    }
    if let Some(t) = filter.to {
        q.push(format!("createdTo={t}"));
    }
    q.join("&")
}

const STATUSES: [PaymentStatus; 3] = [
    PaymentStatus::Success,
    PaymentStatus::Failed,
    PaymentStatus::Pending,
];

async fn shop(app: &TestApp, name: &str) -> (Tenant, String) {
    let t = app.tenant(name, &format!("owner@{name}.np")).await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::PaymentsRead, Scope::RefundsRead],
        )
        .await;
    (t, key)
}

fn filters(statuses: &[&str]) -> Vec<ListFilter> {
    let mut out = Vec::new();
    let ranges = [
        (None, None),
        (Some("2026-10-31T18:15:00Z"), None),
        (None, Some("2026-11-02T00:00:00Z")),
        (Some("2026-09-30T23:00:00Z"), Some("2026-11-01T06:00:00Z")),
    ];
    for (from, to) in ranges {
        for status in [None, Some(statuses[1])] {
            for provider in [None, Some(Provider::Fonepay)] {
                out.push(ListFilter {
                    status: status.map(str::to_owned),
                    provider,
                    from: from.map(at),
                    to: to.map(at),
                });
            }
        }
    }
    out
}

/// Every filter and combination, on payments and refunds: the page and
/// its exact total. A date alone is its 00:00 UTC; an offset is read
/// from Nepal time as the instant it names.
async fn filters_and_combinations_have_exact_totals(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (t, key) = shop(&app, "filters").await;
    let base = at("2026-09-29T20:00:00Z").unix_millis();
    let mut all = Vec::new();
    let mut refunds = Vec::new();
    for i in 0..36i64 {
        let created = Timestamp::from_unix_millis(base + i * 5 * 3_600_000 + i % 4)
            .unwrap_or_else(|| panic!("ms"));
        let p = payment(
            &t,
            created,
            STATUSES[(i % 3) as usize],
            Provider::ALL[((i / 2) % 3) as usize],
        );
        insert(&app, &p).await;
        if i % 2 == 0 {
            let status = if i % 4 == 0 {
                RefundStatus::Succeeded
            } else {
                RefundStatus::Failed
            };
            refunds.push(refund_of(&app, &p, created, status).await);
        }
        all.push(p);
    }
    let pays = || {
        all.iter().map(|p| {
            (
                p.id.as_str(),
                p.created_at,
                listing::status_name(&p.status),
                p.provider,
            )
        })
    };
    for filter in filters(&["success", "failed"]) {
        let want = expected(pays(), &filter);
        let a = app
            .get(
                &format!("/v1/payments?limit=100&{}", query_of(&filter)),
                Some(&key),
            )
            .await;
        assert_eq!(ids(&a), want, "{filter:?}");
        assert_eq!(a.body["meta"]["total"], want.len(), "{filter:?}");
        let a = app
            .get(
                &format!("/v1/payments?limit=3&offset=2&{}", query_of(&filter)),
                Some(&key),
            )
            .await;
        let page: Vec<String> = want.iter().skip(2).take(3).cloned().collect();
        assert_eq!(ids(&a), page, "{filter:?}");
        assert_eq!(
            a.body["meta"],
            serde_json::json!({"total": want.len(), "limit": 3, "offset": 2})
        );
    }
    let refs = || {
        refunds.iter().map(|r| {
            (
                r.id.as_str(),
                r.created_at,
                r.status.as_str().to_owned(),
                r.provider,
            )
        })
    };
    for filter in filters(&["succeeded", "failed"]) {
        let want = expected(refs(), &filter);
        let a = app
            .get(
                &format!("/v1/refunds?limit=100&{}", query_of(&filter)),
                Some(&key),
            )
            .await;
        assert_eq!(ids(&a), want, "{filter:?}");
        assert_eq!(a.body["meta"]["total"], want.len(), "{filter:?}");
    }
    // A date is its 00:00 UTC; an instant in Nepal time is that instant.
    let by_date = app
        .get(
            "/v1/payments?limit=100&createdFrom=2026-10-01&createdTo=2026-10-03",
            Some(&key),
        )
        .await;
    let by_instant = app
        .get(
            "/v1/payments?limit=100&createdFrom=2026-10-01T05:45:00%2B05:45&createdTo=2026-10-03T00:00:00.000Z",
            Some(&key),
        )
        .await;
    assert_eq!(ids(&by_date), ids(&by_instant));
    let want = expected(
        pays(),
        &ListFilter {
            from: Some(at("2026-10-01T00:00:00Z")),
            to: Some(at("2026-10-03T00:00:00Z")),
            ..Default::default()
        },
    );
    assert!(!want.is_empty());
    assert_eq!(ids(&by_date), want);
    // Another merchant sees none of them.
    let (_, other) = shop(&app, "elsewhere").await;
    let a = app.get("/v1/payments?provider=khalti", Some(&other)).await;
    assert_eq!(a.body["meta"]["total"], 0, "{}", a.body);
    app.stop().await;
}

/// An unknown value is a 400 naming its parameter, on both lists.
async fn bad_filter_values_name_their_parameter(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (_, key) = shop(&app, "badvalues").await;
    let cases = [
        ("/v1/payments?status=paid", "status"),
        ("/v1/payments?status=succeeded", "status"),
        ("/v1/payments?provider=paypal", "provider"),
        ("/v1/payments?provider=", "provider"),
        ("/v1/payments?createdFrom=yesterday", "createdFrom"),
        ("/v1/payments?createdFrom=2026-13-01", "createdFrom"),
        ("/v1/payments?createdFrom=2026-1-1", "createdFrom"),
        ("/v1/payments?createdTo=1700000000", "createdTo"),
        (
            "/v1/payments?createdFrom=2026-11-02&createdTo=2026-11-01",
            "createdTo",
        ),
        ("/v1/refunds?status=success", "status"),
        ("/v1/refunds?provider=esewa2", "provider"),
        ("/v1/refunds?createdTo=2026-11-31", "createdTo"),
    ];
    for (path, param) in cases {
        let a = app.get(path, Some(&key)).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], param, "{path}: {}", a.body);
    }
    app.stop().await;
}

/// A deep offset on a filtered list and on the whole list is the page
/// walking (`starting_after`) reaches, total included.
async fn a_deep_offset_is_the_walked_page(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (t, key) = shop(&app, "deep").await;
    let base = at("2026-08-30T10:00:00Z").unix_millis();
    for i in 0..150i64 {
        let created =
            Timestamp::from_unix_millis(base + i * 7 * 3_600_000).unwrap_or_else(|| panic!("ms"));
        let provider = if i % 5 == 0 {
            Provider::Khalti
        } else {
            Provider::Esewa
        };
        insert(
            &app,
            &payment(&t, created, PaymentStatus::Success, provider),
        )
        .await;
    }
    let mut everything = Vec::new();
    for filter in ["provider=esewa", "status=success", "createdFrom=2026-08-01"] {
        let mut walked = Vec::new();
        let mut path = format!("/v1/payments?limit=25&{filter}");
        loop {
            let a = app.get(&path, Some(&key)).await;
            let page = ids(&a);
            let Some(last) = page.last().cloned() else {
                break;
            };
            walked.extend(page);
            assert!(walked.len() <= 150, "the walk goes round");
            path = format!("/v1/payments?limit=25&{filter}&starting_after={last}");
        }
        for offset in [101, 113, 119] {
            let a = app
                .get(
                    &format!("/v1/payments?limit=7&offset={offset}&{filter}"),
                    Some(&key),
                )
                .await;
            assert_eq!(a.body["meta"]["total"], walked.len(), "{filter}");
            let want: Vec<String> = walked.iter().skip(offset).take(7).cloned().collect();
            assert_eq!(ids(&a), want, "{filter} offset {offset}");
        }
        everything = walked;
    }
    // The whole list past the first hundred, in creation order (every
    // payment was created after 1 August).
    assert_eq!(everything.len(), 150);
    let a = app
        .get("/v1/payments?limit=10&offset=140", Some(&key))
        .await;
    assert_eq!(ids(&a), everything[140..150].to_vec());
    assert_eq!(a.body["meta"]["total"], 150);
    app.stop().await;
}

/// Settling a payment moves it from the `pending` list to `success` (or
/// `failed`), in its list, its total and the combined filters.
async fn a_status_change_moves_a_payment_between_lists(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (t, key) = shop(&app, "moves").await;
    let created = at("2026-11-20T04:00:00Z");
    let mut pending = Vec::new();
    for _ in 0..4 {
        let p = payment(&t, created, PaymentStatus::Pending, Provider::Khalti);
        insert(&app, &p).await;
        pending.push(p);
    }
    let total = |path: &'static str| {
        let app = &app;
        let key = &key;
        async move {
            let a = app.get(path, Some(key)).await;
            assert_eq!(a.status, 200, "{}", a.body);
            a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX)
        }
    };
    assert_eq!(
        total("/v1/payments?status=pending&provider=khalti").await,
        4
    );
    let now = at("2026-11-20T04:05:00Z");
    let decisions = [
        Decision::Success {
            provider_ref: Some("KTX-9".into()),
            fee: None,
            configured_fee: None,
        },
        Decision::Failed("declined".into()),
        Decision::Processing,
    ];
    for (p, d) in pending.iter().zip(decisions) {
        attempts::apply(app.state(), p, d, now)
            .await
            .unwrap_or_else(|e| panic!("apply: {e}"));
    }
    assert_eq!(total("/v1/payments?status=pending").await, 1);
    assert_eq!(
        total("/v1/payments?status=success&provider=khalti").await,
        1
    );
    assert_eq!(
        total("/v1/payments?status=failed&createdFrom=2026-11-20").await,
        1
    );
    assert_eq!(total("/v1/payments?status=processing").await, 1);
    assert_eq!(total("/v1/payments?provider=khalti").await, 4);
    let a = app.get("/v1/payments?status=success", Some(&key)).await;
    assert_eq!(ids(&a), vec![pending[0].id.to_string()]);
    app.stop().await;
}

/// Concurrent inserts keep every total exact (their counters are changed
/// in each insert's transaction, sharded).
async fn concurrent_inserts_keep_totals_exact(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (t, key) = shop(&app, "racers").await;
    let created = at("2026-11-25T09:00:00Z");
    let payments: Vec<Payment> = (0..30)
        .map(|i| payment(&t, created, STATUSES[i % 3], Provider::ALL[i % 3]))
        .collect();
    futures::future::join_all(payments.iter().map(|p| insert(&app, p))).await;
    for (path, want) in [
        ("/v1/payments?createdFrom=2026-11-25", 30),
        ("/v1/payments?status=failed&createdTo=2026-11-26", 10),
        ("/v1/payments?provider=esewa&status=success", 10),
        ("/v1/payments?provider=esewa&status=failed", 0),
    ] {
        let a = app.get(path, Some(&key)).await;
        assert_eq!(a.body["meta"]["total"], want, "{path}: {}", a.body);
    }
    app.stop().await;
}

on_both_backends!(
    filters_and_combinations_have_exact_totals,
    bad_filter_values_name_their_parameter,
    a_deep_offset_is_the_walked_page,
    a_status_change_moves_a_payment_between_lists,
    concurrent_inserts_keep_totals_exact,
);
