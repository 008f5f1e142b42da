//! Billing records made through the domain, for tests of what comes after
//! a subscription (its invoices), while the subscription routes are built
//! apart: a subscription stored directly, and its first invoice issued as
//! the engine issues it. And the calls the billing API tests make.

use shared::domain::billing::invoice::{self, BillingInvoice};
use shared::domain::billing::period::{Calendar, IntervalUnit};
use shared::domain::billing::subscription::{self, NewSubscription, Subscription};
use shared::domain::billing::terms::{OverdueAction, Terms};
use shared::domain::{Mode, Tenant};
use shared::money::Currency;
use shared::time::{Clock, SystemClock};

use serde_json::Value;

use crate::{Answer, TestApp, send};

/// Monthly terms of `amount` paisa, no trial (its first invoice is issued
/// at once, the subscription `incomplete` until it is paid).
pub fn monthly(amount: i64) -> Terms {
    Terms {
        description: "Fibre 100 Mbps, monthly".into(),
        amount,
        currency: Currency::Npr,
        interval_unit: IntervalUnit::Month,
        interval_count: 1,
        calendar: Calendar::Ad,
        trial_days: 0,
        grace_period_days: 3,
        reminder_days_before_due: 3,
        overdue_reminder_interval_days: 2,
        overdue_action: OverdueAction::MarkPastDue,
        default_provider: None,
        pricing_model: Default::default(),
    }
}

/// A sandbox subscription of `customer` (a `cus_` id) on `terms`, started
/// now, stored directly.
pub async fn subscription(
    app: &TestApp,
    project: &str,
    customer: &str,
    terms: Terms,
) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    let now = SystemClock.now();
    let input = NewSubscription {
        customer_id: customer.into(),
        plan_id: "bp_00000000000000000000000000".into(),
        terms,
        reference_id: None,
        metadata: serde_json::Map::new(),
        start: now,
        trial_ends_at: None,
        billing_anchor_day: None,
        dunning_policy_id: None,
        test_clock_id: None,
    };
    let sub = subscription::new_subscription(&tenant, input, now)
        .unwrap_or_else(|e| panic!("subscription: {e}"));
    subscription::create(app.state(), &sub)
        .await
        .unwrap_or_else(|e| panic!("store subscription: {e}"));
    sub
}

/// The first invoice of a new subscription of `customer` for `amount`
/// paisa a month, issued as the engine issues it.
pub async fn first_invoice(
    app: &TestApp,
    project: &str,
    customer: &str,
    amount: i64,
) -> (Subscription, BillingInvoice) {
    let sub = subscription(app, project, customer, monthly(amount)).await;
    let Some(period) = sub.current_period() else {
        panic!("subscription {} has no period", sub.id)
    };
    let issued = invoice::issue_invoice(app.state(), &sub, period, SystemClock.now())
        .await
        .unwrap_or_else(|e| panic!("issue: {e}"));
    (sub, issued.invoice)
}

/// A `method` request to `path` with the API key `key` (a JSON `body`
/// with a fresh `idempotency-key`).
pub async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    key: &str,
    body: Option<&Value>,
) -> Answer {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut req = app.client.request(m, app.url(path)).bearer_auth(key);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .header("idempotency-key", format!("k-{}", ulid::Ulid::new()))
            .body(b.to_string());
    }
    send(req).await
}

/// A POST of `body` to `path`.
pub async fn post(app: &TestApp, path: &str, key: &str, body: Value) -> Answer {
    call(app, "POST", path, key, Some(&body)).await
}

/// A GET of `path`.
pub async fn get(app: &TestApp, path: &str, key: &str) -> Answer {
    call(app, "GET", path, key, None).await
}

/// A JSON string as text (empty when not a string).
pub fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// Asserts the answer's `status`, naming `what` with its body.
pub fn ok(a: &Answer, status: u16, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
}

/// The invoices of subscription `sub` (up to 100), as the list answers them.
pub async fn invoices_of(app: &TestApp, key: &str, sub: &str) -> Vec<Value> {
    let a = get(
        app,
        &format!("/v1/billing/invoices?subscriptionId={sub}&limit=100"),
        key,
    )
    .await;
    ok(&a, 200, "list invoices");
    a.body["data"].as_array().cloned().unwrap_or_default()
}

/// A test clock named `name` frozen at `frozen`, and a customer (Sita
/// Rai) on it: their ids.
pub async fn clock_and_customer(
    app: &TestApp,
    key: &str,
    frozen: &str,
    name: &str,
) -> (String, String) {
    let a = post(
        app,
        "/v1/billing/test-clocks",
        key,
        serde_json::json!({"frozenTime": frozen, "name": name}),
    )
    .await;
    ok(&a, 201, "clock");
    let clock = text(&a.body["id"]);
    let a = post(
        app,
        "/v1/billing/customers",
        key,
        serde_json::json!({"name": "Sita Rai", "testClockId": clock}),
    )
    .await;
    ok(&a, 201, "customer");
    (clock, text(&a.body["id"]))
}
