//! Narrowed lists (issue 37 item 11): `GET /v1/invoices` by
//! `document_status` / `collection_status`, and `GET
//! /v1/billing/subscriptions` by `status`, `planId` (and both) page from
//! their narrowings (`shared::domain::listing::counted`): a deep page of
//! a filter is the slice of the whole list filtered here, its total
//! exact; after a status change the record has moved lists. With
//! `customerId` and another filter the customer's own list is read
//! through, filtered, within its window. Both backends.

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::Tenant as Scoped;
use shared::domain::account::Scope;
use shared::domain::billing::subscription::{self, NewSubscription};
use shared::domain::invoices::{self, CreateInvoice};
use shared::ids::InvoiceId;
use shared::time::{Clock, SystemClock};

fn rows(a: &Answer) -> Vec<Value> {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["data"].as_array().cloned().unwrap_or_default()
}

fn ids_of(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect()
}

/// The whole invoice list, walked by `starting_after`.
async fn walk_invoices(app: &TestApp, key: &str) -> Vec<Value> {
    let mut walked = Vec::new();
    let mut path = "/v1/invoices?limit=100".to_owned();
    loop {
        let page = rows(&app.get(&path, Some(key)).await);
        let Some(last) = page
            .last()
            .and_then(|r| r["id"].as_str())
            .map(str::to_owned)
        else {
            break;
        };
        walked.extend(page);
        assert!(walked.len() <= 1000, "the walk goes round");
        path = format!("/v1/invoices?limit=100&starting_after={last}");
    }
    walked
}

fn matching(walked: &[Value], pairs: &[(&str, &str)]) -> Vec<String> {
    let hits: Vec<Value> = walked
        .iter()
        .filter(|r| pairs.iter().all(|(k, v)| r[*k] == *v))
        .cloned()
        .collect();
    ids_of(&hits)
}

/// Every offset of the filtered list equals the walked list filtered
/// here, its total too.
async fn assert_invoices_filter(
    app: &TestApp,
    key: &str,
    walked: &[Value],
    pairs: &[(&str, &str)],
) {
    let want = matching(walked, pairs);
    let n = want.len();
    let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let query = query.join("&");
    for offset in [0, 1, 100, 101, n.saturating_sub(1), n + 3] {
        let a = app
            .get(
                &format!("/v1/invoices?{query}&limit=4&offset={offset}"),
                Some(key),
            )
            .await;
        let got = ids_of(&rows(&a));
        let end = (offset + 4).min(n);
        let slice = want
            .get(offset..end)
            .map(<[String]>::to_vec)
            .unwrap_or_default();
        assert_eq!(got, slice, "{query} offset {offset}");
        assert_eq!(a.body["meta"]["total"], n, "{query}: {}", a.body);
    }
}

async fn invoices_by_status_at_any_offset(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Narrow Bills", "owner@narrowbills.np").await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::InvoicesRead, Scope::InvoicesWrite],
        )
        .await;
    let tenant = Scoped::new(t.project.id.clone(), Mode::Sandbox);
    // Seeded through the domain (as the API creates and finalizes): 130
    // drafts, 112 of them issued.
    let body = || -> CreateInvoice {
        serde_json::from_value(json!({
            "lines": [{"description": "Service", "quantity": "1", "unitAmount": 10_000}],
            "dueAt": "2030-12-31T18:15:00+05:45",
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut made = Vec::new();
    for _ in 0..130 {
        let inv = invoices::create(app.state(), &tenant, body(), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        made.push(inv.id);
    }
    for id in made.iter().take(112) {
        invoices::finalize(app.state(), &tenant, id, 1, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let walked = walk_invoices(&app, &key).await;
    assert_eq!(walked.len(), 130);
    for pairs in [
        &[("document_status", "issued")][..],
        &[("document_status", "draft")],
        &[("collection_status", "unpaid")],
        &[
            ("document_status", "issued"),
            ("collection_status", "unpaid"),
        ],
        &[("collection_status", "paid")],
    ] {
        assert_invoices_filter(&app, &key, &walked, pairs).await;
    }
    // A write-off through the API: unpaid -> closed_adjusted, out of the
    // issued-and-unpaid list, into the closed one.
    let issued = matching(&walked, &[("document_status", "issued")]);
    let moved = issued[105].clone();
    let inv = invoices::get(app.state(), &tenant, &InvoiceId::stored(moved.as_str()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = app
        .post(
            &format!("/v1/invoices/{moved}/adjustments"),
            Some(&key),
            None,
            &json!({"amount": inv.total_amount, "reason": "written off", "version": inv.version}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["collection_status"], "closed_adjusted", "{}", a.body);
    let after = walk_invoices(&app, &key).await;
    for pairs in [
        &[
            ("document_status", "issued"),
            ("collection_status", "unpaid"),
        ][..],
        &[("collection_status", "closed_adjusted")],
        &[("document_status", "issued")],
    ] {
        assert_invoices_filter(&app, &key, &after, pairs).await;
    }
    let a = app
        .get(
            "/v1/invoices?collection_status=closed_adjusted&limit=5",
            Some(&key),
        )
        .await;
    assert_eq!(ids_of(&rows(&a)), vec![moved.clone()]);
    let a = app
        .get(
            "/v1/invoices?document_status=issued&collection_status=unpaid&limit=4&offset=104",
            Some(&key),
        )
        .await;
    assert!(!ids_of(&rows(&a)).contains(&moved));
    assert_eq!(a.body["meta"]["total"], 111);
    app.stop().await;
}

async fn subscriptions_by_filter_at_any_page(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Narrow Fibre", "owner@narrowfibre.np").await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::BillingRead, Scope::BillingWrite],
        )
        .await;
    let mut customers = Vec::new();
    for (i, name) in ["Sita Rai", "Hari Thapa"].iter().enumerate() {
        let a = app
            .post(
                "/v1/billing/customers",
                Some(&key),
                Some(&format!("narrow-cus-{i}")),
                &json!({ "name": name }),
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
        customers.push(a.body["id"].as_str().unwrap_or_default().to_owned());
    }
    let mut plans = Vec::new();
    for (i, name) in ["Fibre 50", "Fibre 100"].iter().enumerate() {
        let a = app
            .post(
                "/v1/billing/plans",
                Some(&key),
                Some(&format!("narrow-plan-{i}")),
                &json!({"name": name, "amount": 99_900, "intervalUnit": "month"}),
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
        plans.push(a.body["id"].as_str().unwrap_or_default().to_owned());
    }
    // Seeded through the domain (as a create stores one): 110 on the first
    // plan (trialing, the first customer; every tenth the second's), 14 on
    // the second (incomplete: no trial).
    let tenant = Scoped::new(t.project.id.clone(), Mode::Sandbox);
    let now = SystemClock.now();
    for i in 0..124usize {
        let (plan, trial) = if i < 110 {
            (&plans[0], Some(now.plus(chrono::Duration::days(14))))
        } else {
            (&plans[1], None)
        };
        let customer = &customers[usize::from(i % 10 == 0)];
        let input = NewSubscription {
            customer_id: customer.as_str().into(),
            plan_id: plan.as_str().into(),
            terms: dhukuti_tests::billing::monthly(99_900),
            reference_id: None,
            metadata: serde_json::Map::new(),
            start: now,
            trial_ends_at: trial,
            billing_anchor_day: None,
            dunning_policy_id: None,
            test_clock_id: None,
        };
        let sub = subscription::new_subscription(&tenant, input, now)
            .unwrap_or_else(|e| panic!("subscription: {e}"));
        subscription::create(app.state(), &sub)
            .await
            .unwrap_or_else(|e| panic!("store subscription: {e}"));
    }
    let list = |q: String| {
        let (app, key) = (&app, &key);
        async move {
            app.get(&format!("/v1/billing/subscriptions?{q}"), Some(key))
                .await
        }
    };
    let walk = || async {
        let mut walked = Vec::new();
        for p in 1..=3 {
            walked.extend(rows(&list(format!("page={p}&limit=50")).await));
        }
        walked
    };
    let walked = walk().await;
    assert_eq!(walked.len(), 124);
    let check = |walked: Vec<Value>, pairs: Vec<(&'static str, String)>| {
        let list = &list;
        async move {
            let want: Vec<String> = ids_of(
                &walked
                    .iter()
                    .filter(|r| pairs.iter().all(|(k, v)| r[*k] == *v.as_str()))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
            let n = want.len();
            let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let query = query.join("&");
            for page in [1, 2, 101, 102, n.max(1), n + 1] {
                let a = list(format!("{query}&page={page}&limit=1")).await;
                let got = ids_of(&rows(&a));
                let slice = want
                    .get(page - 1..page)
                    .map(<[String]>::to_vec)
                    .unwrap_or_default();
                assert_eq!(got, slice, "{query} page {page}");
                assert_eq!(a.body["total"], n, "{query}: {}", a.body);
            }
            n
        }
    };
    let (p0, p1) = (plans[0].clone(), plans[1].clone());
    let (c0, c1) = (customers[0].clone(), customers[1].clone());
    assert_eq!(
        check(walked.clone(), vec![("status", "trialing".into())]).await,
        110
    );
    assert_eq!(
        check(walked.clone(), vec![("planId", p0.clone())]).await,
        110
    );
    assert_eq!(
        check(walked.clone(), vec![("planId", p1.clone())]).await,
        14
    );
    assert_eq!(
        check(
            walked.clone(),
            vec![("status", "trialing".into()), ("planId", p0.clone())]
        )
        .await,
        110
    );
    check(walked.clone(), vec![("customerId", c0.clone())]).await;
    check(
        walked.clone(),
        vec![("customerId", c1.clone()), ("status", "trialing".into())],
    )
    .await;
    check(
        walked.clone(),
        vec![("customerId", c1.clone()), ("planId", p1.clone())],
    )
    .await;
    // A single filter has no window; a customer's combination keeps it.
    let a = list("status=trialing&page=101&limit=100".into()).await;
    assert!(rows(&a).is_empty(), "{}", a.body);
    assert_eq!(a.body["total"], 110);
    let a = list(format!(
        "customerId={c1}&status=trialing&page=101&limit=100"
    ))
    .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "page", "{}", a.body);

    // Cancelled through the API: out of trialing, into cancelled.
    let trialing = ids_of(
        &walked
            .iter()
            .filter(|r| r["status"] == "trialing")
            .cloned()
            .collect::<Vec<_>>(),
    );
    let moved = trialing[104].clone();
    let a = app
        .post(
            &format!("/v1/billing/subscriptions/{moved}/cancel"),
            Some(&key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "cancelled", "{}", a.body);
    let after = walk().await;
    assert_eq!(
        check(after.clone(), vec![("status", "trialing".into())]).await,
        109
    );
    assert_eq!(
        check(
            after.clone(),
            vec![("status", "cancelled".into()), ("planId", p0.clone())]
        )
        .await,
        1
    );
    let a = list("status=cancelled&limit=5".into()).await;
    assert_eq!(ids_of(&rows(&a)), vec![moved.clone()]);
    let a = list("status=trialing&page=105&limit=1".into()).await;
    assert_ne!(ids_of(&rows(&a)), vec![moved]);
    app.stop().await;
}

on_both_backends!(
    invoices_by_status_at_any_offset,
    subscriptions_by_filter_at_any_page,
);
