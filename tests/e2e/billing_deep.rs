//! Deep pages of the billing lists (issue 37 item 11):
//! `GET /v1/billing/customers` is a counted list
//! (`shared::domain::listing::counted`): any page reaches its customers
//! (no `page * limit` cap; past the end an empty page), the total comes
//! from the counters and stays exact through a retried create and a
//! delete; a search keeps its bounded window. `GET
//! /v1/billing/subscriptions` likewise (a retried create counted once; a
//! status filter too, as a narrowing), and `GET /v1/billing/invoices`
//! (each subscription's first invoice; a search keeps its window, a
//! filter is narrowed).
//! Both backends.

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::json;
use shared::domain::Mode;
use shared::domain::account::Scope;

fn ids(a: &Answer) -> Vec<String> {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|c| c["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn create(app: &TestApp, key: &str, name: &str, idem: &str) -> Answer {
    app.post(
        "/v1/billing/customers",
        Some(key),
        Some(idem),
        &json!({ "name": name }),
    )
    .await
}

async fn page(app: &TestApp, key: &str, query: &str) -> Answer {
    app.get(&format!("/v1/billing/customers?{query}"), Some(key))
        .await
}

async fn customers_page_deep_with_exact_totals(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Deep Gym", "owner@deepgym.np").await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::BillingRead, Scope::BillingWrite],
        )
        .await;
    const N: usize = 160;
    for i in 0..N {
        let a = create(&app, &key, &format!("Member {i}"), &format!("deep-{i}")).await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    // A retried create (its idempotency key again) is counted once.
    let again = create(&app, &key, "Member 0", "deep-0").await;
    assert!(again.status == 200 || again.status == 201, "{}", again.body);

    // The whole list by shallow pages, newest first.
    let mut walked = Vec::new();
    for p in 1..=4 {
        let a = page(&app, &key, &format!("page={p}&limit=50")).await;
        assert_eq!(a.body["total"], N, "{}", a.body);
        walked.extend(ids(&a));
    }
    assert_eq!(walked.len(), N);
    let mut sorted = walked.clone();
    sorted.sort();
    sorted.reverse();
    assert_eq!(walked, sorted, "newest first");

    // Deep pages of one (past the 100 read through): each its customer.
    for p in [101, 120, 150, 160] {
        let a = page(&app, &key, &format!("page={p}&limit=1")).await;
        assert_eq!(ids(&a), vec![walked[p - 1].clone()], "page {p}");
        assert_eq!(a.body["total"], N);
        assert_eq!(a.body["page"], p);
        assert_eq!(a.body["limit"], 1);
    }
    let a = page(&app, &key, "page=23&limit=7").await;
    assert_eq!(ids(&a), walked[154..160].to_vec());
    // Past the end, and past 10,000 records: an empty page, not a 400.
    for q in [
        "page=161&limit=1",
        "page=101&limit=100",
        "page=5000&limit=100",
    ] {
        let a = page(&app, &key, q).await;
        assert!(ids(&a).is_empty(), "{q}: {}", a.body);
        assert_eq!(a.body["total"], N, "{q}");
    }
    // A page that is no number is still refused, naming `page`.
    let a = page(&app, &key, "page=0&limit=1").await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "page", "{}", a.body);
    // A search reads through from the start: its window stays.
    let a = page(&app, &key, "search=member&page=101&limit=100").await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "page", "{}", a.body);
    let a = page(&app, &key, "search=Member%2015&limit=100").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["total"], 11, "Member 15, 150..159: {}", a.body);

    // A delete takes its count back; the deep page moves up by one.
    let gone = &walked[10];
    let d = send(
        app.client
            .delete(app.url(&format!("/v1/billing/customers/{gone}")))
            .bearer_auth(&key),
    )
    .await;
    assert!(d.status == 200 || d.status == 204, "{}", d.body);
    let a = page(&app, &key, "page=150&limit=1").await;
    assert_eq!(ids(&a), vec![walked[150].clone()]);
    assert_eq!(a.body["total"], N - 1);
    app.stop().await;
}

async fn subscriptions_page_deep_with_exact_totals(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Deep Fibre", "owner@deepfibre.np").await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::BillingRead, Scope::BillingWrite],
        )
        .await;
    let c = create(&app, &key, "Sita Rai", "deep-customer").await;
    assert_eq!(c.status, 201, "{}", c.body);
    let plan = app
        .post(
            "/v1/billing/plans",
            Some(&key),
            Some("deep-plan"),
            &json!({"name": "Trial", "amount": 99_900, "intervalUnit": "month", "trialDays": 14}),
        )
        .await;
    assert_eq!(plan.status, 201, "{}", plan.body);
    let body = json!({"customerId": c.body["id"], "planId": plan.body["id"]});
    const N: usize = 125;
    for i in 0..N {
        let a = app
            .post(
                "/v1/billing/subscriptions",
                Some(&key),
                Some(&format!("deep-sub-{i}")),
                &body,
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    // A retried create (its idempotency key again) is counted once.
    let again = app
        .post(
            "/v1/billing/subscriptions",
            Some(&key),
            Some("deep-sub-0"),
            &body,
        )
        .await;
    assert!(again.status == 200 || again.status == 201, "{}", again.body);

    let list = |q: String| {
        let (app, key) = (&app, &key);
        async move {
            app.get(&format!("/v1/billing/subscriptions?{q}"), Some(key))
                .await
        }
    };
    let mut walked = Vec::new();
    for p in 1..=3 {
        let a = list(format!("page={p}&limit=50")).await;
        assert_eq!(a.body["total"], N, "{}", a.body);
        walked.extend(ids(&a));
    }
    assert_eq!(walked.len(), N);
    for p in [101, 118, 125] {
        let a = list(format!("page={p}&limit=1")).await;
        assert_eq!(ids(&a), vec![walked[p - 1].clone()], "page {p}");
        assert_eq!(a.body["total"], N);
    }
    for q in ["page=126&limit=1", "page=101&limit=100"] {
        let a = list(q.to_owned()).await;
        assert!(ids(&a).is_empty(), "{q}: {}", a.body);
        assert_eq!(a.body["total"], N, "{q}");
    }
    // A filter is a narrowing of the list: any page too.
    let a = list("status=trialing&page=101&limit=100".to_owned()).await;
    assert!(ids(&a).is_empty(), "{}", a.body);
    assert_eq!(a.body["total"], N, "{}", a.body);
    let a = list("status=trialing&page=3&limit=50".to_owned()).await;
    assert_eq!(ids(&a), walked[100..].to_vec());
    assert_eq!(a.body["total"], N);
    app.stop().await;
}

async fn billing_invoices_page_deep_with_exact_totals(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Deep Bills", "owner@deepbills.np").await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::BillingRead, Scope::BillingWrite],
        )
        .await;
    let c = create(&app, &key, "Ram Thapa", "deep-inv-customer").await;
    assert_eq!(c.status, 201, "{}", c.body);
    let plan = app
        .post(
            "/v1/billing/plans",
            Some(&key),
            Some("deep-inv-plan"),
            &json!({"name": "Monthly", "amount": 150_000, "intervalUnit": "month"}),
        )
        .await;
    assert_eq!(plan.status, 201, "{}", plan.body);
    // Without a trial: each subscription issues its first invoice.
    let body = json!({"customerId": c.body["id"], "planId": plan.body["id"]});
    const N: usize = 110;
    for i in 0..N {
        let a = app
            .post(
                "/v1/billing/subscriptions",
                Some(&key),
                Some(&format!("deep-inv-sub-{i}")),
                &body,
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    let list = |q: String| {
        let (app, key) = (&app, &key);
        async move {
            app.get(&format!("/v1/billing/invoices?{q}"), Some(key))
                .await
        }
    };
    let mut walked = Vec::new();
    for p in 1..=3 {
        let a = list(format!("page={p}&limit=50")).await;
        assert_eq!(a.body["total"], N, "{}", a.body);
        walked.extend(ids(&a));
    }
    assert_eq!(walked.len(), N);
    for p in [101, 105, 110] {
        let a = list(format!("page={p}&limit=1")).await;
        assert_eq!(ids(&a), vec![walked[p - 1].clone()], "page {p}");
        assert_eq!(a.body["total"], N);
    }
    for q in ["page=111&limit=1", "page=101&limit=100"] {
        let a = list(q.to_owned()).await;
        assert!(ids(&a).is_empty(), "{q}: {}", a.body);
        assert_eq!(a.body["total"], N, "{q}");
    }
    // A search keeps its window; a filter is narrowed (any page:
    // billing_invoices_narrowed.rs).
    let a = list("search=inv_&page=101&limit=100".to_owned()).await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "page", "{}", a.body);
    let a = list("status=open&page=101&limit=100".to_owned()).await;
    assert!(ids(&a).is_empty(), "{}", a.body);
    assert_eq!(a.body["total"], N);
    let a = list("status=open&page=3&limit=50".to_owned()).await;
    assert_eq!(ids(&a), walked[100..].to_vec());
    app.stop().await;
}

on_both_backends!(
    customers_page_deep_with_exact_totals,
    subscriptions_page_deep_with_exact_totals,
    billing_invoices_page_deep_with_exact_totals,
);
