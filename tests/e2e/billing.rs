//! Issue 39, the billing API's customers and plans over HTTP, as a
//! merchant's code calls them: create, list, search, get, update, delete;
//! the scopes, the plan's entitlement, another project's ids and bad
//! input, each refused with the envelope naming what is wrong.

use dhukuti_tests::billing::text;
use dhukuti_tests::dash::Dash;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::{self, Plan, Scope};

async fn call(app: &TestApp, method: &str, path: &str, key: &str, body: Option<&Value>) -> Answer {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut req = app.client.request(m, app.url(path)).bearer_auth(key);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .header("idempotency-key", format!("k-{}", rand_suffix()))
            .body(b.to_string());
    }
    send(req).await
}

const PASSWORD: &str = "a long dashboard password";

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

async fn customers_and_plans_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Gym Kathmandu", "owner@gym.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;

    // Customers.
    let a = call(
        &app,
        "POST",
        "/v1/billing/customers",
        &key,
        Some(&json!({
            "name": "Sita Rai", "email": "sita@example.com", "phone": "+977 980-0000001",
            "externalCustomerId": "member-1", "metadata": {"branch": "thamel"}
        })),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let sita = text(&a.body["id"]);
    assert!(sita.starts_with("cus_"), "{}", a.body);
    assert_eq!(a.body["livemode"], false);
    assert_eq!(a.body["phone"], "9800000001");
    assert_eq!(a.body["locale"], "en");
    assert!(a.body["createdAt"].is_string() && a.body["updatedAt"].is_string());
    let b = call(
        &app,
        "POST",
        "/v1/billing/customers",
        &key,
        Some(&json!({"name": "Ram Thapa"})),
    )
    .await;
    assert_eq!(b.status, 201, "{}", b.body);
    let ram = text(&b.body["id"]);

    let list = call(&app, "GET", "/v1/billing/customers?limit=1", &key, None).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["total"], 2);
    assert_eq!(list.body["page"], 1);
    assert_eq!(list.body["limit"], 1);
    assert_eq!(list.body["data"][0]["id"], ram.as_str(), "newest first");
    let found = call(
        &app,
        "GET",
        "/v1/billing/customers?search=MEMBER-1",
        &key,
        None,
    )
    .await;
    assert_eq!(found.body["total"], 1, "{}", found.body);
    assert_eq!(found.body["data"][0]["id"], sita.as_str());

    let got = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{sita}"),
        &key,
        None,
    )
    .await;
    assert_eq!(got.body["email"], "sita@example.com", "{}", got.body);
    let up = call(
        &app,
        "PATCH",
        &format!("/v1/billing/customers/{sita}"),
        &key,
        Some(&json!({"email": null, "locale": "ne"})),
    )
    .await;
    assert_eq!(up.status, 200, "{}", up.body);
    assert_eq!(up.body["email"], Value::Null);
    assert_eq!(up.body["locale"], "ne");
    let unknown = call(
        &app,
        "PATCH",
        &format!("/v1/billing/customers/{sita}"),
        &key,
        Some(&json!({"credit": 1})),
    )
    .await;
    unknown.assert_error(400, "invalid_request_error", "validation_failed");
    let bad = call(
        &app,
        "POST",
        "/v1/billing/customers",
        &key,
        Some(&json!({"name": "X", "phone": "12345"})),
    )
    .await;
    bad.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(bad.body["error"]["param"], "phone", "{}", bad.body);

    let del = call(
        &app,
        "DELETE",
        &format!("/v1/billing/customers/{ram}"),
        &key,
        None,
    )
    .await;
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.body["deleted"], true);
    let gone = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{ram}"),
        &key,
        None,
    )
    .await;
    gone.assert_error(404, "invalid_request_error", "not_found");

    // Plans.
    let p = call(
        &app,
        "POST",
        "/v1/billing/plans",
        &key,
        Some(&json!({
            "name": "Monthly", "amount": 150_000, "intervalUnit": "month", "calendar": "bs",
            "trialDays": 7, "overdueAction": "pause"
        })),
    )
    .await;
    assert_eq!(p.status, 201, "{}", p.body);
    let plan = text(&p.body["id"]);
    assert!(plan.starts_with("bp_"), "{}", p.body);
    assert_eq!(p.body["currency"], "NPR");
    assert_eq!(p.body["calendar"], "bs");
    assert_eq!(p.body["dunningSettings"]["overdueAction"], "pause");
    for (body, field) in [
        (
            json!({"name": "X", "amount": 0, "intervalUnit": "month"}),
            "amount",
        ),
        (
            json!({"name": "X", "amount": 100, "intervalUnit": "month", "intervalCount": 0}),
            "intervalCount",
        ),
        (
            json!({"name": "X", "amount": 100, "intervalUnit": "month", "trialDays": 366}),
            "trialDays",
        ),
        (
            json!({"name": "X", "amount": 100, "intervalUnit": "month", "currency": "USD"}),
            "currency",
        ),
    ] {
        let r = call(&app, "POST", "/v1/billing/plans", &key, Some(&body)).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], field, "{}", r.body);
    }
    let price = call(
        &app,
        "PATCH",
        &format!("/v1/billing/plans/{plan}"),
        &key,
        Some(&json!({"amount": 200_000})),
    )
    .await;
    price.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(price.body["error"]["param"], "amount", "{}", price.body);
    let off = call(
        &app,
        "PATCH",
        &format!("/v1/billing/plans/{plan}"),
        &key,
        Some(&json!({"active": false})),
    )
    .await;
    assert_eq!(off.body["active"], false, "{}", off.body);
    let active = call(&app, "GET", "/v1/billing/plans?active=true", &key, None).await;
    assert_eq!(active.body["total"], 0, "{}", active.body);
    let inactive = call(&app, "GET", "/v1/billing/plans?active=false", &key, None).await;
    assert_eq!(inactive.body["total"], 1, "{}", inactive.body);

    // Another project's ids are not found; a restricted key without
    // billing:write is refused naming the scope; the Free plan has no
    // billing API.
    let other = app.tenant("Other Shop", "owner@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let theirs = call(
        &app,
        "GET",
        &format!("/v1/billing/plans/{plan}"),
        &other_key,
        None,
    )
    .await;
    theirs.assert_error(404, "invalid_request_error", "not_found");
    let theirs = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{sita}"),
        &other_key,
        None,
    )
    .await;
    theirs.assert_error(404, "invalid_request_error", "not_found");
    let reader = app.key(&t, Mode::Sandbox, &[Scope::BillingRead]).await;
    let r = call(&app, "GET", "/v1/billing/customers", &reader, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let w = call(
        &app,
        "POST",
        "/v1/billing/plans",
        &reader,
        Some(&json!({"name": "x"})),
    )
    .await;
    w.assert_error(403, "permission_error", "missing_scope");
    assert!(
        text(&w.body["error"]["message"]).contains("billing:write"),
        "{}",
        w.body
    );
    let free = app.tenant("Free Club", "owner@free.example").await;
    if let Err(e) = account::set_plan(&*app.store, &free.merchant.id, Plan::Free).await {
        panic!("set_plan: {e}")
    }
    let free_key = app.key(&free, Mode::Sandbox, &Scope::ALL).await;
    let f = call(&app, "GET", "/v1/billing/plans", &free_key, None).await;
    f.assert_error(403, "permission_error", "permission_denied");
    assert_eq!(f.body["error"]["entitlement"], "billing.api", "{}", f.body);
    app.stop().await;
}

/// The dashboard's billing pages list and show what the API made, with
/// the search and filter the API has; another merchant's records are not
/// found; a plan without billing is told so, not refused with an error.
async fn billing_pages_in_the_dashboard(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Yoga Patan", "owner@yoga.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let mut ids = Vec::new();
    for (name, email) in [
        ("Sita Rai", "sita@example.com"),
        ("Hari Thapa", "hari@example.com"),
    ] {
        let c = call(
            &app,
            "POST",
            "/v1/billing/customers",
            &key,
            Some(&json!({"name": name, "email": email})),
        )
        .await;
        assert_eq!(c.status, 201, "{}", c.body);
        ids.push(text(&c.body["id"]));
    }
    let plan = call(
        &app,
        "POST",
        "/v1/billing/plans",
        &key,
        Some(&json!({"name": "Monthly yoga", "amount": 250000, "intervalUnit": "month"})),
    )
    .await;
    assert_eq!(plan.status, 201, "{}", plan.body);
    let plan_id = text(&plan.body["id"]);
    let now = shared::time::Clock::now(&shared::time::SystemClock);
    shared::domain::dashboard::create_user(
        app.state(),
        now,
        &t.merchant.id,
        "viewer@yoga.example",
        shared::domain::dashboard::Role::Viewer,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut viewer = Dash::new(&app.base);
    let r = viewer.sign_in("viewer@yoga.example", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());

    let list = viewer.get("/dashboard/billing/customers").await;
    assert_eq!(list.status, 200, "{}", list.show());
    assert!(list.body.contains("Sita Rai") && list.body.contains("Hari Thapa"));
    assert!(list.body.contains("2 customers"), "{}", list.show());
    let found = viewer.get("/dashboard/billing/customers?search=HARI").await;
    assert!(found.body.contains("Hari Thapa") && !found.body.contains("Sita Rai"));
    let one = viewer
        .get(&format!("/dashboard/billing/customers/{}", ids[0]))
        .await;
    assert_eq!(one.status, 200, "{}", one.show());
    assert!(one.body.contains("sita@example.com"), "{}", one.show());
    let plans = viewer.get("/dashboard/billing/plans?active=true").await;
    assert!(
        plans.body.contains("Monthly yoga") && plans.body.contains("2,500"),
        "{}",
        plans.show()
    );
    let archived = viewer.get("/dashboard/billing/plans?active=false").await;
    assert!(
        !archived.body.contains("Monthly yoga"),
        "{}",
        archived.show()
    );
    let p = viewer
        .get(&format!("/dashboard/billing/plans/{plan_id}"))
        .await;
    assert_eq!(p.status, 200, "{}", p.show());
    assert!(p.body.contains("keep_active") || p.body.contains("When overdue"));

    // Another merchant's owner finds none of it.
    let other = app.tenant("Other Gym", "owner@other.example").await;
    shared::domain::dashboard::create_user(
        app.state(),
        now,
        &other.merchant.id,
        "boss@other.example",
        shared::domain::dashboard::Role::Owner,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut boss = Dash::new(&app.base);
    let r = boss.sign_in("boss@other.example", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let theirs = boss
        .get(&format!("/dashboard/billing/customers/{}", ids[0]))
        .await;
    assert_eq!(theirs.status, 404, "{}", theirs.show());
    let theirs = boss
        .get(&format!("/dashboard/billing/plans/{plan_id}"))
        .await;
    assert_eq!(theirs.status, 404, "{}", theirs.show());
    let mine = boss.get("/dashboard/billing/customers").await;
    assert!(!mine.body.contains("Sita Rai"));
    let bad = boss.get("/dashboard/billing/customers/cus_nope").await;
    assert_eq!(bad.status, 404, "{}", bad.show());

    // A merchant without billing in its plan is told so.
    if let Err(e) = account::set_plan(&*app.store, &other.merchant.id, Plan::Free).await {
        panic!("set_plan: {e}")
    }
    let free = boss.get("/dashboard/billing/customers").await;
    assert_eq!(free.status, 200, "{}", free.show());
    assert!(free.body.contains("Growth and Pro"), "{}", free.show());
    app.stop().await;
}

on_both_backends!(
    customers_and_plans_over_http,
    billing_pages_in_the_dashboard
);
