//! Issue 40 parts 6 and 7 over HTTP: usage reported one event at a time
//! and in batches (a repeated `idempotency_key` counts once, bad input a
//! 400 naming the field, an invoiced period a 409 naming it), the
//! current period's summary and the raw records; pending invoice items
//! listed as a bare array, added and deleted; events racing the seal,
//! and a delete racing the invoice. And the official SDK's usage and
//! invoice item calls, unchanged (tests/sdk/billing_usage.py).

use dhukuti_tests::billing::{call, post, text};
use dhukuti_tests::dash::Dash;
use dhukuti_tests::shop::Shop;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::billing::calendar::nepal_day;
use shared::domain::billing::invoice::{LineKind, issue_invoice};
use shared::domain::billing::{items, subscription, usage};
use shared::domain::dashboard::{self, Role};
use shared::ids::SubscriptionId;
use shared::time::{Clock, SystemClock};

/// A customer and a subscription of a metered plan at Rs 0.10 a unit,
/// billing from today.
async fn metered_subscription(app: &TestApp, key: &str) -> String {
    let c = post(
        app,
        "/v1/billing/customers",
        key,
        json!({"name": "Sita Rai"}),
    )
    .await;
    let p = post(
        app,
        "/v1/billing/plans",
        key,
        json!({"name": "API calls", "amount": 10, "intervalUnit": "month", "pricingModel": "metered"}),
    )
    .await;
    assert_eq!(p.status, 201, "{}", p.body);
    let s = post(
        app,
        "/v1/billing/subscriptions",
        key,
        json!({"customerId": c.body["id"], "planId": p.body["id"]}),
    )
    .await;
    assert_eq!(s.status, 201, "{}", s.body);
    text(&s.body["id"])
}

fn refused(a: &Answer, status: u16, code: &str, param: Option<&str>, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
    assert_eq!(a.body["error"]["code"], code, "{what}: {}", a.body);
    if let Some(p) = param {
        assert_eq!(a.body["error"]["param"], p, "{what}: {}", a.body);
    }
}

async fn usage_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Cloud Kathmandu", "owner@cloud.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sub = metered_subscription(&app, &key).await;
    let usage = format!("/v1/billing/subscriptions/{sub}/usage");

    let first = post(
        &app,
        &usage,
        &key,
        json!({"quantity": 100, "idempotency_key": "evt_1"}),
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(text(&first.body["id"]).starts_with("ur_"), "{}", first.body);
    assert_eq!(first.body["action"], "increment");
    let again = post(
        &app,
        &usage,
        &key,
        json!({"quantity": 7, "idempotency_key": "evt_1"}),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        again.body["id"], first.body["id"],
        "the first record answers"
    );
    assert_eq!(again.body["quantity"], 100);

    for (body, param) in [
        (json!({"quantity": -1}), "quantity"),
        (json!({"quantity": 2.5}), "quantity"),
        (json!({"quantity": 1, "action": "decrement"}), "action"),
        (
            json!({"quantity": 1, "timestamp": "2999-01-01T00:00:00Z"}),
            "timestamp",
        ),
        (
            json!({"quantity": 1, "timestamp": "2020-01-01T00:00:00Z"}),
            "timestamp",
        ),
        (
            json!({"events": [{"quantity": 1}, {"quantity": -4}]}),
            "events[1].quantity",
        ),
    ] {
        let a = post(&app, &usage, &key, body.clone()).await;
        refused(&a, 400, "validation_failed", Some(param), &body.to_string());
    }

    // A batch of 1,000: one result per event, a repeated key counted once.
    let events: Vec<Value> = (0..1000)
        .map(|i| json!({"quantity": 1, "idempotency_key": format!("b-{}", i % 999)}))
        .collect();
    let batch = post(&app, &usage, &key, json!({ "events": events })).await;
    assert_eq!(batch.status, 201, "{}", batch.body);
    assert_eq!(batch.body["created"], 999, "{}", batch.body["created"]);
    assert_eq!(batch.body["duplicates"], 1);
    assert_eq!(batch.body["data"][999]["status"], "duplicate");
    assert_eq!(
        batch.body["data"][999]["record"]["id"],
        batch.body["data"][0]["record"]["id"]
    );
    let too_many: Vec<Value> = (0..1001).map(|_| json!({"quantity": 1})).collect();
    let a = post(&app, &usage, &key, json!({ "events": too_many })).await;
    refused(&a, 400, "validation_failed", Some("events"), "1,001 events");

    // `set` makes the total as of its time; a later increment adds.
    let now = SystemClock.now();
    let at = |secs: i64| now.plus(chrono::Duration::seconds(secs)).to_string();
    let a = post(
        &app,
        &usage,
        &key,
        json!({"quantity": 5000, "action": "set", "timestamp": at(1)}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let a = post(
        &app,
        &usage,
        &key,
        json!({"quantity": 3, "timestamp": at(2)}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let summary = app.get(&usage, Some(&key)).await;
    assert_eq!(summary.status, 200, "{}", summary.body);
    assert_eq!(summary.body["quantity"], 5003, "{}", summary.body);
    assert_eq!(summary.body["recordCount"], 1 + 999 + 2);
    assert_eq!(summary.body["aggregationMethod"], "sum");
    assert_eq!(summary.body["periodStart"], nepal_day(now).to_string());
    assert_eq!(summary.body["amount"], 50_030);

    let records = app
        .get(&format!("{usage}/records?limit=2"), Some(&key))
        .await;
    assert_eq!(records.status, 200, "{}", records.body);
    assert_eq!(records.body["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(records.body["hasMore"], true);
    assert_eq!(records.body["data"][0]["quantity"], 3, "newest first");
    let a = app
        .get(&format!("{usage}/records?limit=101"), Some(&key))
        .await;
    refused(&a, 400, "validation_failed", Some("limit"), "limit 101");

    // The period sealed (as an invoice would): its events are refused,
    // the period named.
    let id = SubscriptionId::stored(sub.clone());
    let tomorrow = nepal_day(now).succ_opt().unwrap_or_default();
    usage::seal(app.state(), &id, tomorrow, now)
        .await
        .unwrap_or_else(|e| panic!("seal: {e}"));
    let a = post(&app, &usage, &key, json!({"quantity": 1})).await;
    refused(&a, 409, "usage_period_closed", None, "a sealed period");
    assert_eq!(
        a.body["error"]["period"]["start"],
        nepal_day(now).to_string(),
        "{}",
        a.body
    );

    // Another project's subscription is not found.
    let other = app.tenant("Other Co", "owner@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let a = post(&app, &usage, &other_key, json!({"quantity": 1})).await;
    refused(&a, 404, "not_found", None, "another project's");
    let a = app.get(&usage, Some(&other_key)).await;
    refused(&a, 404, "not_found", None, "another project's summary");
    app.stop().await;
}

async fn invoice_items_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Fibre Pokhara", "owner@fibre.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sub = metered_subscription(&app, &key).await;
    let items = format!("/v1/billing/subscriptions/{sub}/invoice-items");
    let empty = app.get(&items, Some(&key)).await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    assert_eq!(empty.body, json!([]), "a bare array");
    let a = post(
        &app,
        &items,
        &key,
        json!({"amount": 150_000, "description": "Installation", "quantity": 2}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let item = text(&a.body["id"]);
    assert!(item.starts_with("ii_"));
    assert_eq!(a.body["total"], 300_000);
    assert_eq!(a.body["status"], "pending");
    let b = post(
        &app,
        &items,
        &key,
        json!({"amount": 5_000, "description": "Router"}),
    )
    .await;
    assert_eq!(b.body["quantity"], 1, "{}", b.body);
    for (body, param) in [
        (json!({"amount": 0, "description": "x"}), "amount"),
        (json!({"amount": 100, "description": ""}), "description"),
        (
            json!({"amount": 100, "description": "x", "quantity": 0}),
            "quantity",
        ),
    ] {
        let a = post(&app, &items, &key, body.clone()).await;
        refused(&a, 400, "validation_failed", Some(param), &body.to_string());
    }
    let listed = app.get(&items, Some(&key)).await;
    let ids: Vec<String> = listed
        .body
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| text(&i["id"]))
        .collect();
    assert_eq!(ids, vec![item.clone(), text(&b.body["id"])], "oldest first");
    let del = call(&app, "DELETE", &format!("{items}/{item}"), &key, None).await;
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.body["deleted"], true);
    let del = call(&app, "DELETE", &format!("{items}/{item}"), &key, None).await;
    refused(&del, 404, "not_found", None, "deleted twice");
    let listed = app.get(&items, Some(&key)).await;
    assert_eq!(listed.body.as_array().map(Vec::len), Some(1));
    app.stop().await;
}

/// Batches race the seal over HTTP: every event is either in the sealed
/// read (and so on the invoice) or refused with 409; none lost.
async fn usage_racing_the_seal(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Race Co", "owner@race.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sub = metered_subscription(&app, &key).await;
    let usage_path = format!("/v1/billing/subscriptions/{sub}/usage");
    let id = SubscriptionId::stored(sub.clone());
    let now = SystemClock.now();
    let through = nepal_day(now).succ_opt().unwrap_or_default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let (client, url, key) = (app.client.clone(), app.url(&usage_path), key.clone());
        writers.push(tokio::spawn(async move {
            let mut created = Vec::new();
            let mut closed = 0;
            for i in 0..200 {
                let events: Vec<Value> = (0..20)
                    .map(|j| json!({"quantity": 1, "idempotency_key": format!("{w}-{i}-{j}")}))
                    .collect();
                let req = client
                    .post(&url)
                    .bearer_auth(&key)
                    .header("content-type", "application/json")
                    .body(json!({ "events": events }).to_string());
                let a = send(req).await;
                assert_eq!(a.status, 201, "{}", a.body);
                for r in a.body["data"].as_array().into_iter().flatten() {
                    match r["status"].as_str() {
                        Some("created") => created.push(text(&r["record"]["id"])),
                        Some("refused") => {
                            assert_eq!(r["error"]["code"], "usage_period_closed", "{r}");
                            closed += 1;
                        }
                        other => panic!("{other:?}: {r}"),
                    }
                }
                if closed > 0 {
                    break;
                }
            }
            (created, closed)
        }));
    }
    let state = app.state();
    loop {
        let n = usage::records_between(state, &id, None, through)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .len();
        if n >= 100 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let sealed = usage::seal(state, &id, through, now)
        .await
        .unwrap_or_else(|e| panic!("seal: {e}"))
        .unwrap_or_else(|| panic!("sealed before"));
    let read = usage::records_between(state, &id, sealed.from, sealed.to)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut created = Vec::new();
    let mut closed = 0;
    for w in writers {
        let (c, n) = w.await.unwrap_or_else(|e| panic!("{e}"));
        created.extend(c);
        closed += n;
    }
    let mut read_ids: Vec<String> = read.iter().map(|r| r.id.to_string()).collect();
    read_ids.sort();
    created.sort();
    assert!(closed >= 4, "every writer met the seal: {closed}");
    assert_eq!(
        read_ids, created,
        "the sealed read is exactly what was recorded"
    );
    app.stop().await;
}

/// An item deleted over HTTP while the next invoice is issued: on the
/// invoice and refused 409, or deleted and not on it; never both, never
/// neither.
async fn an_item_deleted_while_the_invoice_is_issued(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Race Items", "owner@items.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let state = app.state();
    for round in 0..6 {
        let sub = metered_subscription(&app, &key).await;
        let items = format!("/v1/billing/subscriptions/{sub}/invoice-items");
        let a = post(
            &app,
            &items,
            &key,
            json!({"amount": 700, "description": "Visit"}),
        )
        .await;
        let item = text(&a.body["id"]);
        let id = SubscriptionId::stored(sub.clone());
        let tenant = shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox);
        let s = subscription::get(state, &tenant, &id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let next = s.period(1).unwrap_or_else(|| panic!("no period 1"));
        let (client, url, k) = (
            app.client.clone(),
            app.url(&format!("{items}/{item}")),
            key.clone(),
        );
        let deleting = tokio::spawn(async move { send(client.delete(url).bearer_auth(k)).await });
        let issued = issue_invoice(state, &s, next, SystemClock.now())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .invoice;
        let del = deleting.await.unwrap_or_else(|e| panic!("{e}"));
        let on_invoice = issued.lines.iter().any(|l| l.kind == LineKind::Item);
        match (on_invoice, del.status) {
            (true, 409) => assert_eq!(del.body["error"]["code"], "invoice_item_invoiced"),
            (false, 200) => assert_eq!(issued.amount_due, 0),
            (on, status) => panic!(
                "round {round}: on the invoice {on}, delete {status} {}",
                del.body
            ),
        }
        let count = items::pending_count(state, &id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(count, 0, "round {round}: the item left the count once");
    }
    app.stop().await;
}

/// Creates racing over HTTP at one below the cap: exactly one is made,
/// the others are refused 409 `invoice_item_limit`, and the list holds
/// exactly the cap.
async fn item_creates_racing_at_the_cap(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Cap Items", "owner@cap.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sub = metered_subscription(&app, &key).await;
    let path = format!("/v1/billing/subscriptions/{sub}/invoice-items");
    let one = json!({"amount": 100, "description": "Visit"});
    for _ in 0..items::MAX_PENDING - 1 {
        let a = post(&app, &path, &key, one.clone()).await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let req = app
                .client
                .post(app.url(&path))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .header("idempotency-key", format!("k-{}", ulid::Ulid::new()))
                .body(one.to_string());
            tokio::spawn(send(req))
        })
        .collect();
    let mut statuses = Vec::new();
    for r in racers {
        let a = r.await.unwrap_or_else(|e| panic!("{e}"));
        if a.status == 409 {
            assert_eq!(a.body["error"]["code"], "invoice_item_limit", "{}", a.body);
        }
        statuses.push(a.status);
    }
    statuses.sort_unstable();
    assert_eq!(statuses, vec![201, 409, 409, 409, 409, 409, 409, 409]);
    let listed = app.get(&path, Some(&key)).await;
    assert_eq!(
        listed.body.as_array().map(Vec::len),
        Some(items::MAX_PENDING),
        "{}",
        listed.body
    );
    app.stop().await;
}

/// The subscription page charts each period's usage and lists the items.
async fn usage_and_items_on_the_dashboard(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let sub = metered_subscription(&shop.app, &shop.key).await;
    let usage_path = format!("/v1/billing/subscriptions/{sub}/usage");
    let a = post(&shop.app, &usage_path, &shop.key, json!({"quantity": 1234})).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let items = format!("/v1/billing/subscriptions/{sub}/invoice-items");
    let a = post(
        &shop.app,
        &items,
        &shop.key,
        json!({"amount": 150_000, "description": "Installation visit"}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    dashboard::create_user(
        shop.app.state(),
        SystemClock.now(),
        &shop.tenant.merchant.id,
        "viewer@cloud.example",
        Role::Viewer,
        "a long dashboard password",
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut d = Dash::new(&shop.app.base);
    let r = d
        .sign_in("viewer@cloud.example", "a long dashboard password")
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let page = d
        .get(&format!("/dashboard/billing/subscriptions/{sub}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    for want in [
        "<svg",
        "1234 units, 1 records",
        "Installation visit",
        "pending",
        "NPR 1,500.00",
    ] {
        assert!(page.body.contains(want), "{want}: {}", page.show());
    }
    shop.app.stop().await;
}

/// The official SDK's usage and invoice item calls, unchanged.
async fn the_sdk_usage_calls_work_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let tenant = app.tenant("SDK Cloud", "owner@sdkcloud.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/billing_usage.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("BASE_URL", &app.base)
        .env("API_KEY", &key)
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(std::time::Duration::from_secs(120), run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("the SDK run took over 120 s"),
    };
    app.stop().await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK run failed on {which:?}:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all SDK usage calls behaved"), "{stdout}");
}

on_both_backends!(
    usage_over_http,
    invoice_items_over_http,
    usage_racing_the_seal,
    an_item_deleted_while_the_invoice_is_issued,
    item_creates_racing_at_the_cap,
    usage_and_items_on_the_dashboard,
    the_sdk_usage_calls_work_unchanged
);
