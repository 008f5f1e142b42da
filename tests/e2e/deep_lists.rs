//! Counted lists (issue 37 item 11): `GET /v1/sessions`,
//! `/v1/payment-links`, `/v1/invoices` and `/v1/webhooks/{id}/deliveries`
//! serve any offset at a bounded cost from their counters
//! (`shared::domain::listing::counted`): a deep offset is the page walking
//! (`starting_after`) reaches, total included, also counted from a
//! `starting_after`; a project from before the counters is served by
//! skipping until `lists migrate` counts it (idempotently). Both backends.

use dhukuti_tests::{Answer, Tenant, TestApp, Which, on_both_backends, spawn_app};
use serde_json::json;
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::links::PaymentLink;
use shared::domain::listing::ListsMarker;
use shared::domain::outbox::EventType;
use shared::domain::record::Record;
use shared::domain::webhooks::{Delivery, DeliveryStatus};
use shared::domain::{Tenant as Scoped, lists_migration};
use shared::ids::{DeliveryId, EndpointId, EventId};
use shared::store::{Cond, Query, SkCond, TxOp};
use shared::time::{Clock, SystemClock};

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

async fn shop(app: &TestApp, name: &str) -> (Tenant, String) {
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant(name, &format!("owner@{name}.np")).await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[
                Scope::PaymentsWrite,
                Scope::SessionsRead,
                Scope::LinksRead,
                Scope::LinksWrite,
                Scope::InvoicesRead,
                Scope::InvoicesWrite,
                Scope::WebhooksRead,
                Scope::WebhooksWrite,
            ],
        )
        .await;
    (t, key)
}

async fn create(app: &TestApp, key: &str, path: &str, body: serde_json::Value) -> String {
    let a = app.post(path, Some(key), None, &body).await;
    assert!(a.status == 200 || a.status == 201, "{path}: {}", a.body);
    a.body["id"].as_str().unwrap_or_default().to_owned()
}

/// Every record of `list` by walking `starting_after` pages.
async fn walk(app: &TestApp, key: &str, list: &str) -> Vec<String> {
    let mut walked = Vec::new();
    let mut path = format!("{list}?limit=25");
    loop {
        let page = ids(&app.get(&path, Some(key)).await);
        let Some(last) = page.last().cloned() else {
            break;
        };
        walked.extend(page);
        assert!(walked.len() <= 1000, "the walk goes round");
        path = format!("{list}?limit=25&starting_after={last}");
    }
    walked
}

/// Deep offsets (past the 100 read through), from the start and from a
/// record, against the walked list; past the end an empty page.
/// `meta`: the list answers its total (the deliveries answer `data` only).
async fn assert_deep_pages(app: &TestApp, key: &str, list: &str, walked: &[String], meta: bool) {
    let n = walked.len();
    for offset in [0, 99, 101, n - 9, n - 1, n, n + 500] {
        let a = app
            .get(&format!("{list}?limit=7&offset={offset}"), Some(key))
            .await;
        let want: Vec<String> = walked.iter().skip(offset).take(7).cloned().collect();
        assert_eq!(ids(&a), want, "{list} offset {offset}");
        if meta {
            assert_eq!(
                a.body["meta"],
                json!({"total": n, "limit": 7, "offset": offset}),
                "{list}"
            );
        }
    }
    let from = &walked[3];
    let a = app
        .get(
            &format!("{list}?limit=5&offset=110&starting_after={from}"),
            Some(key),
        )
        .await;
    let want: Vec<String> = walked.iter().skip(114).take(5).cloned().collect();
    assert_eq!(ids(&a), want, "{list} after {from}");
    if meta {
        assert_eq!(a.body["meta"]["total"], n, "{list}");
    }
}

async fn deep_offsets_on_sessions_links_and_invoices(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (_, key) = shop(&app, "deepsessions").await;
    let n = 125;
    for _ in 0..n {
        create(
            &app,
            &key,
            "/v1/checkout",
            json!({"amount": 10_000, "returnUrl": "https://shop.example/thanks"}),
        )
        .await;
        create(
            &app,
            &key,
            "/v1/payment-links",
            json!({"title": "Tea", "amount": 10_000}),
        )
        .await;
    }
    for list in ["/v1/sessions", "/v1/payment-links"] {
        let walked = walk(&app, &key, list).await;
        assert_eq!(walked.len(), n, "{list}");
        assert_deep_pages(&app, &key, list, &walked, true).await;
    }
    // A deleted link leaves its list and its total.
    let links = walk(&app, &key, "/v1/payment-links").await;
    let gone = &links[110];
    let a = app
        .client
        .delete(app.url(&format!("/v1/payment-links/{gone}")))
        .bearer_auth(&key)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0);
    assert!(a == 200 || a == 204, "delete: {a}");
    let a = app
        .get("/v1/payment-links?limit=3&offset=109", Some(&key))
        .await;
    assert_eq!(
        ids(&a),
        vec![links[109].clone(), links[111].clone(), links[112].clone()]
    );
    assert_eq!(a.body["meta"]["total"], n - 1);
    // Invoices: fewer, still past the hundred read through.
    let body = json!({
        "lines": [{"description": "Service", "quantity": "1", "unitAmount": 10_000}],
        "dueAt": "2030-12-31T18:15:00+05:45",
    });
    for _ in 0..110 {
        create(&app, &key, "/v1/invoices", body.clone()).await;
    }
    let walked = walk(&app, &key, "/v1/invoices").await;
    assert_eq!(walked.len(), 110);
    let a = app.get("/v1/invoices?limit=4&offset=104", Some(&key)).await;
    assert_eq!(ids(&a), walked[104..108].to_vec());
    assert_eq!(a.body["meta"]["total"], 110);
    app.stop().await;
}

/// A delivery to `endpoint` as the fan-out stores it (with its counters).
async fn delivery(app: &TestApp, t: &Tenant, endpoint: &EndpointId) -> String {
    let now = SystemClock.now();
    let d = Delivery {
        id: DeliveryId::new(),
        event_id: EventId::new(),
        event_type: EventType::PaymentSucceeded,
        endpoint_id: endpoint.clone(),
        project_id: t.project.id.clone(),
        mode: Mode::Sandbox,
        payment_id: None,
        status: DeliveryStatus::Success,
        attempts: 1,
        response_status: Some(200),
        response_body: None,
        payload: None,
        last_error: None,
        last_attempt_at: Some(now),
        next_attempt_at: None,
        created_at: now,
        updated_at: now,
        lease_until_ms: None,
        gsi2pk: None,
        gsi2sk: None,
        counted: true,
    };
    let mut ops = vec![d.put_new().unwrap_or_else(|e| panic!("{e}"))];
    ops.extend(d.count_new());
    app.store
        .transact(ops)
        .await
        .unwrap_or_else(|e| panic!("delivery: {e}"));
    d.id.to_string()
}

async fn deep_offsets_on_an_endpoints_deliveries(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (t, key) = shop(&app, "deepdeliveries").await;
    let a = create(
        &app,
        &key,
        "/v1/webhooks",
        json!({"url": "https://shop.example/hook"}),
    )
    .await;
    let b = create(
        &app,
        &key,
        "/v1/webhooks",
        json!({"url": "https://shop.example/other"}),
    )
    .await;
    let (ea, eb) = (
        EndpointId::stored(a.as_str()),
        EndpointId::stored(b.as_str()),
    );
    for i in 0..130 {
        delivery(&app, &t, &ea).await;
        if i % 10 == 0 {
            delivery(&app, &t, &eb).await;
        }
    }
    let list = format!("/v1/webhooks/{a}/deliveries");
    let walked = walk(&app, &key, &list).await;
    assert_eq!(walked.len(), 130);
    assert_deep_pages(&app, &key, &list, &walked, false).await;
    // Without paging: the last 50 (the contract), no `meta`.
    let a = app.get(&list, Some(&key)).await;
    assert_eq!(ids(&a), walked[..50].to_vec());
    assert!(a.body.get("meta").is_none(), "{}", a.body);
    // The other endpoint's log holds its own.
    let a = app
        .get(
            &format!("/v1/webhooks/{b}/deliveries?offset=10"),
            Some(&key),
        )
        .await;
    assert_eq!(ids(&a).len(), 3, "{}", a.body);
    app.stop().await;
}

/// A project from before the counters (its marker without the counted
/// lists, its links uncounted) is served by skipping, then `lists
/// migrate` counts it once, a rerun nothing.
async fn an_older_project_is_served_then_migrated_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (t, key) = shop(&app, "deepolder").await;
    for _ in 0..108 {
        create(
            &app,
            &key,
            "/v1/payment-links",
            json!({"title": "Tea", "amount": 10_000}),
        )
        .await;
    }
    // As the project was before: the marker of its filtered lists only,
    // no link counted.
    let tenant = Scoped::new(t.project.id.clone(), Mode::Sandbox);
    let mut old = ListsMarker::new(&tenant);
    (
        old.sessions,
        old.links,
        old.invoices,
        old.deliveries,
        old.sms,
    ) = (false, false, false, false, false);
    let store = &*app.store;
    store
        .put(old.to_item().unwrap_or_else(|e| panic!("{e}")), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let walked = walk(&app, &key, "/v1/payment-links").await;
    for id in &walked {
        let key = PaymentLink::key(&shared::ids::LinkId::stored(id.as_str()));
        let mut link: PaymentLink = shared::domain::record::get(store, &key)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("link {id}"));
        // Written whole without its mark, as the old code wrote it.
        link.counted = false;
        store
            .put(
                link.to_item().unwrap_or_else(|e| panic!("{e}")),
                Some(Cond::Exists),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let stats = shared::keys::stats_partition(&tenant.project, tenant.mode);
    let counters = store
        .query(&Query::partition(stats.clone()).sk(SkCond::BeginsWith("LIST#LNK#".into())))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut drop = Vec::new();
    for item in counters.items {
        if let Some(k) = shared::store::Key::of(&item) {
            drop.push(TxOp::Delete { key: k, cond: None });
        }
    }
    assert!(!drop.is_empty());
    for chunk in drop.chunks(25) {
        store
            .transact(chunk.to_vec())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Served the old way meanwhile, every record reachable.
    let a = app
        .get("/v1/payment-links?limit=5&offset=103", Some(&key))
        .await;
    assert_eq!(ids(&a), walked[103..108].to_vec());
    assert_eq!(a.body["meta"]["total"], 108);
    let first = lists_migration::migrate(store, &tenant)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((first.links.listed, first.links.already), (108, 0));
    let again = lists_migration::migrate(store, &tenant)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.links.listed, again.links.already), (0, 108));
    let a = app
        .get("/v1/payment-links?limit=5&offset=103", Some(&key))
        .await;
    assert_eq!(ids(&a), walked[103..108].to_vec());
    assert_eq!(a.body["meta"]["total"], 108);
    app.stop().await;
}

on_both_backends!(
    deep_offsets_on_sessions_links_and_invoices,
    deep_offsets_on_an_endpoints_deliveries,
    an_older_project_is_served_then_migrated_once,
);
