//! Issue 40 item 9, `invoice.upcoming`, over HTTP on a test clock: a
//! metered subscription with usage and a pending item; advancing the
//! clock past the moment three days before the period ends sends the
//! draft of the next invoice once (not stored: the invoice list is as it
//! was, the item still pending), the subscription's dashboard timeline
//! shows it, and the invoice issued at the period's end bills what the
//! draft showed.

use dhukuti_tests::billing::{clock_and_customer, get, invoices_of, ok, post, text};
use dhukuti_tests::dash::Dash;
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::domain::outbox::{self, EventType};
use shared::domain::{Mode, Tenant};
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";

/// Advances the clock to `to` and polls it until it is `ready` (each GET
/// runs part of its work).
async fn advance(app: &TestApp, key: &str, clock: &str, to: &str) {
    let path = format!("/v1/billing/test-clocks/{clock}/advance");
    let a = post(app, &path, key, json!({"frozenTime": to})).await;
    ok(&a, 200, "advance");
    let path = format!("/v1/billing/test-clocks/{clock}");
    for _ in 0..100 {
        let a = get(app, &path, key).await;
        ok(&a, 200, "poll the clock");
        if a.body["status"] == "ready" {
            return;
        }
    }
    panic!("clock {clock} never became ready")
}

async fn upcoming(app: &TestApp, project: &str) -> Vec<Value> {
    let tenant = Tenant::new(project, Mode::Sandbox);
    outbox::recent(&*app.store, &tenant, 200)
        .await
        .unwrap_or_else(|e| panic!("events: {e}"))
        .into_iter()
        .filter(|e| e.event_type == EventType::InvoiceUpcoming)
        .map(|e| e.object)
        .collect()
}

async fn upcoming_on_a_test_clock(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Meter Works", "owner@meterworks.example").await;
    let project = t.project.id.to_string();
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let (clock, customer) =
        clock_and_customer(&app, &key, "2026-01-10T06:00:00Z", "Upcoming").await;
    let a = post(
        &app,
        "/v1/billing/plans",
        &key,
        json!({"name": "API calls", "amount": 10, "intervalUnit": "month", "pricingModel": "metered"}),
    )
    .await;
    ok(&a, 201, "plan");
    let plan = text(&a.body["id"]);
    let a = post(
        &app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": plan}),
    )
    .await;
    ok(&a, 201, "subscription");
    let sub = text(&a.body["id"]);
    assert_eq!(
        a.body["status"], "active",
        "a zero first invoice: {}",
        a.body
    );
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/usage"),
        &key,
        json!({"quantity": 250, "timestamp": "2026-01-20T06:00:00Z"}),
    )
    .await;
    ok(&a, 201, "usage");
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/invoice-items"),
        &key,
        json!({"amount": 50_000, "description": "Router"}),
    )
    .await;
    ok(&a, 201, "item");

    // Before the moment (2026-02-06 18:15 UTC): nothing.
    advance(&app, &key, &clock, "2026-02-06T12:00:00Z").await;
    assert!(upcoming(&app, &project).await.is_empty());
    // Past it: the draft, once.
    advance(&app, &key, &clock, "2026-02-07T06:00:00Z").await;
    advance(&app, &key, &clock, "2026-02-08T06:00:00Z").await;
    let sent = upcoming(&app, &project).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let draft = &sent[0];
    assert_eq!(draft["status"], "draft", "{draft}");
    assert_eq!(draft["id"], Value::Null, "{draft}");
    assert_eq!(draft["subscriptionId"], sub.as_str());
    assert_eq!(draft["periodStart"], "2026-02-10", "{draft}");
    let lines: Vec<(String, i64)> = draft["lines"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|l| (text(&l["kind"]), l["amount"].as_i64().unwrap_or(-1)))
        .collect();
    assert_eq!(
        lines,
        vec![("usage".into(), 2_500), ("item".into(), 50_000)],
        "{draft}"
    );
    assert_eq!(draft["amountDue"], 52_500, "{draft}");
    assert_eq!(invoices_of(&app, &key, &sub).await.len(), 1, "not stored");
    let a = get(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/invoice-items"),
        &key,
    )
    .await;
    ok(&a, 200, "items");
    assert_eq!(a.body.as_array().map(Vec::len), Some(1), "still pending");

    // The subscription's timeline in the dashboard lists it.
    let email = "boss@meterworks.example";
    dashboard::create_user(
        app.state(),
        SystemClock.now(),
        &t.merchant.id,
        email,
        Role::Owner,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut owner = Dash::new(&app.base);
    let r = owner.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let page = owner
        .get(&format!("/dashboard/billing/subscriptions/{sub}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("invoice.upcoming"), "{}", page.show());

    // The period's end: the invoice bills what the draft showed.
    advance(&app, &key, &clock, "2026-02-11T06:00:00Z").await;
    let invoices = invoices_of(&app, &key, &sub).await;
    let next = invoices
        .iter()
        .find(|i| i["periodStart"] == "2026-02-10")
        .unwrap_or_else(|| panic!("{invoices:?}"));
    assert_eq!(next["amountDue"], draft["amountDue"], "{next}");
    assert_eq!(next["lines"], draft["lines"], "{next}");
    assert_eq!(upcoming(&app, &project).await.len(), 1);
}

on_both_backends!(upcoming_on_a_test_clock);
