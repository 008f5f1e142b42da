//! Issue 39 item 5, dunning over HTTP as a merchant's code calls it:
//! policies (create, list, get, update, exactly one default however many
//! requests race), an invoice's dunning with its attempts, stop and retry
//! now; another project's ids, bad input and scopes refused with the
//! envelope; and the SDK's `dunning` resource run unchanged
//! (tests/sdk/paybridge_dunning.py). Billing invoices are issued through
//! the domain (the scheduler that issues them is not part of this test).

use dhukuti_tests::billing::text;
use dhukuti_tests::{Answer, Tenant, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::billing::dunning::{self, DunningStatus};
use shared::domain::billing::invoice::{BillingInvoice, issue_invoice, mark_overdue};
use shared::domain::billing::period::{Calendar, IntervalUnit};
use shared::domain::billing::subscription::{self, NewSubscription, new_subscription};
use shared::domain::billing::terms::{OverdueAction, Terms};
use shared::ids::DunningPolicyId;
use shared::money::Currency;
use shared::time::{Clock, SystemClock};

async fn call(app: &TestApp, method: &str, path: &str, key: &str, body: Option<&Value>) -> Answer {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut req = app.client.request(m, app.url(path)).bearer_auth(key);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    send(req).await
}

/// A subscription of `tenant`'s sandbox (NPR 999 a month, billed from
/// today), stored with its `subscription.created` event, and its first
/// invoice issued through the domain, as the scheduler issues it.
pub(crate) async fn issued_invoice(app: &TestApp, tenant: &Tenant) -> BillingInvoice {
    let t = shared::domain::Tenant::new(tenant.project.id.clone(), Mode::Sandbox);
    let now = SystemClock.now();
    let input = NewSubscription {
        customer_id: "cus_01jdunning0000000000000000".into(),
        plan_id: "bp_01jdunning0000000000000000".into(),
        terms: Terms {
            description: "Fibre 50".into(),
            amount: 99_900,
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
        },
        reference_id: None,
        metadata: serde_json::Map::new(),
        start: now,
        trial_ends_at: None,
        billing_anchor_day: None,
        dunning_policy_id: None,
        test_clock_id: None,
    };
    let sub = new_subscription(&t, input, now).unwrap_or_else(|e| panic!("{e}"));
    let state = app.state();
    if let Err(e) = subscription::create(state, &sub).await {
        panic!("create subscription: {e}");
    }
    let period = sub.current_period().unwrap_or_else(|| panic!("no period"));
    match issue_invoice(state, &sub, period, now).await {
        Ok(issued) => issued.invoice,
        Err(e) => panic!("issue: {e}"),
    }
}

/// `invoice` made overdue and its dunning started under `policy`, as the
/// sweep does when its grace period ends.
async fn dunned(app: &TestApp, invoice: &BillingInvoice, policy: &str) {
    let t = shared::domain::Tenant::new(invoice.project_id.clone(), invoice.mode);
    let state = app.state();
    if let Err(e) = mark_overdue(state, &t, &invoice.id, SystemClock.now()).await {
        panic!("overdue: {e}");
    }
    let policy = DunningPolicyId::stored(policy);
    if let Err(e) = dunning::start_dunning(state, &t, &invoice.id, &policy).await {
        panic!("start dunning: {e}");
    }
}

async fn dunning_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Fibre Nepal", "owner@fibre.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let policies = "/v1/billing/dunning/policies";

    // Create: the SDK's defaults (cancel, not the default), then a default.
    let a = call(
        &app,
        "POST",
        policies,
        &key,
        Some(&json!({"name": "Standard 3-strike", "retryIntervalsDays": [1, 3, 7]})),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let standard = text(&a.body["id"]);
    assert!(standard.starts_with("dpol_"), "{}", a.body);
    assert_eq!(a.body["finalAction"], "cancel");
    assert_eq!(a.body["isDefault"], false);
    assert_eq!(a.body["active"], true);
    assert_eq!(a.body["retryIntervalsDays"], json!([1, 3, 7]));
    assert!(a.body["createdAt"].is_string(), "{}", a.body);
    let b = call(
        &app,
        "POST",
        policies,
        &key,
        Some(&json!({"name": "Gentle", "retryIntervalsDays": [2, 5],
            "finalAction": "mark_uncollectible", "isDefault": true})),
    )
    .await;
    assert_eq!(b.status, 201, "{}", b.body);
    let gentle = text(&b.body["id"]);
    assert_eq!(b.body["isDefault"], true);

    // Bad input, each refused naming its field.
    for (body, field) in [
        (
            json!({"name": "x", "retryIntervalsDays": []}),
            "retryIntervalsDays",
        ),
        (
            json!({"name": "x", "retryIntervalsDays": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}),
            "retryIntervalsDays",
        ),
        (
            json!({"name": "x", "retryIntervalsDays": [0]}),
            "retryIntervalsDays",
        ),
        (
            json!({"name": "x", "retryIntervalsDays": [3, 1]}),
            "retryIntervalsDays",
        ),
        (
            json!({"name": "x", "retryIntervalsDays": [1], "finalAction": "delete"}),
            "finalAction",
        ),
        (json!({"name": "", "retryIntervalsDays": [1]}), "name"),
    ] {
        let r = call(&app, "POST", policies, &key, Some(&body)).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], field, "{body}: {}", r.body);
    }
    let unknown = call(
        &app,
        "POST",
        policies,
        &key,
        Some(&json!({"name": "x", "retryIntervalsDays": [1], "maxRetries": 3})),
    )
    .await;
    unknown.assert_error(400, "invalid_request_error", "validation_failed");

    // List and get.
    let list = call(&app, "GET", policies, &key, None).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["total"], 2, "{}", list.body);
    let ids: Vec<String> = list.body["data"]
        .as_array()
        .map(|d| d.iter().map(|p| text(&p["id"])).collect())
        .unwrap_or_default();
    assert_eq!(ids, [standard.clone(), gentle.clone()], "oldest first");
    let got = call(&app, "GET", &format!("{policies}/{gentle}"), &key, None).await;
    assert_eq!(
        got.body["finalAction"], "mark_uncollectible",
        "{}",
        got.body
    );

    // Update: fields, then the default moves; the default cannot be
    // unset or deactivated.
    let up = call(
        &app,
        "PATCH",
        &format!("{policies}/{standard}"),
        &key,
        Some(&json!({"name": "Strict", "retryIntervalsDays": [1, 2], "finalAction": "pause"})),
    )
    .await;
    assert_eq!(up.status, 200, "{}", up.body);
    assert_eq!(
        (
            &up.body["name"],
            &up.body["finalAction"],
            &up.body["retryIntervalsDays"]
        ),
        (&json!("Strict"), &json!("pause"), &json!([1, 2]))
    );
    for body in [json!({"isDefault": false}), json!({"active": false})] {
        let r = call(
            &app,
            "PATCH",
            &format!("{policies}/{gentle}"),
            &key,
            Some(&body),
        )
        .await;
        r.assert_error(409, "invalid_request_error", "state_conflict");
    }
    let bad = call(
        &app,
        "PATCH",
        &format!("{policies}/{standard}"),
        &key,
        Some(&json!({"retryIntervalsDays": [5, 5]})),
    )
    .await;
    bad.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(bad.body["error"]["param"], "retryIntervalsDays");
    let moved = call(
        &app,
        "PATCH",
        &format!("{policies}/{standard}"),
        &key,
        Some(&json!({"isDefault": true})),
    )
    .await;
    assert_eq!(moved.body["isDefault"], true, "{}", moved.body);
    let old = call(&app, "GET", &format!("{policies}/{gentle}"), &key, None).await;
    assert_eq!(old.body["isDefault"], false, "{}", old.body);

    // Another project's policy is not found; a reader cannot write; a
    // live key does not see sandbox policies.
    let other = app.tenant("Other ISP", "owner@other-isp.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let theirs = call(
        &app,
        "GET",
        &format!("{policies}/{standard}"),
        &other_key,
        None,
    )
    .await;
    theirs.assert_error(404, "invalid_request_error", "not_found");
    let theirs = call(
        &app,
        "PATCH",
        &format!("{policies}/{standard}"),
        &other_key,
        Some(&json!({"name": "mine"})),
    )
    .await;
    theirs.assert_error(404, "invalid_request_error", "not_found");
    let reader = app.key(&t, Mode::Sandbox, &[Scope::BillingRead]).await;
    let w = call(
        &app,
        "POST",
        policies,
        &reader,
        Some(&json!({"name": "x", "retryIntervalsDays": [1]})),
    )
    .await;
    w.assert_error(403, "permission_error", "missing_scope");
    let live = app.key(&t, Mode::Live, &Scope::ALL).await;
    let l = call(&app, "GET", policies, &live, None).await;
    assert_eq!(l.body["total"], 0, "{}", l.body);

    // An invoice's dunning: not started, then active with its attempts,
    // stopped; refused where the state does not allow it.
    let inv = issued_invoice(&app, &t).await;
    let base = format!("/v1/billing/dunning/invoices/{}/dunning", inv.id);
    let before = call(&app, "GET", &base, &key, None).await;
    assert_eq!(before.status, 200, "{}", before.body);
    assert_eq!(before.body["status"], "not_started");
    assert_eq!(before.body["invoiceStatus"], "open");
    assert_eq!(before.body["attempts"], json!([]));
    let early = call(
        &app,
        "POST",
        &format!("{base}/retry-now"),
        &key,
        Some(&json!({})),
    )
    .await;
    early.assert_error(409, "invalid_request_error", "state_conflict");
    dunned(&app, &inv, &standard).await;
    let retried = call(
        &app,
        "POST",
        &format!("{base}/retry-now"),
        &key,
        Some(&json!({})),
    )
    .await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(retried.body["status"], "active");
    assert_eq!(retried.body["policyId"], standard.as_str());
    assert_eq!(retried.body["invoiceStatus"], "overdue");
    let attempts = retried.body["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(attempts.len(), 1, "{}", retried.body);
    assert_eq!(attempts[0]["kind"], "reminder");
    assert_eq!(attempts[0]["interval"], Value::Null);
    assert!(
        retried.body["nextAttemptOn"].is_string(),
        "{}",
        retried.body
    );
    let theirs = call(&app, "GET", &base, &other_key, None).await;
    theirs.assert_error(404, "invalid_request_error", "not_found");
    let theirs = call(
        &app,
        "POST",
        &format!("{base}/stop"),
        &other_key,
        Some(&json!({})),
    )
    .await;
    theirs.assert_error(404, "invalid_request_error", "not_found");
    let stopped = call(
        &app,
        "POST",
        &format!("{base}/stop"),
        &key,
        Some(&json!({})),
    )
    .await;
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    assert_eq!(stopped.body["status"], "stopped");
    assert_eq!(stopped.body["attempts"].as_array().map(Vec::len), Some(1));
    let after = call(
        &app,
        "POST",
        &format!("{base}/retry-now"),
        &key,
        Some(&json!({})),
    )
    .await;
    after.assert_error(409, "invalid_request_error", "state_conflict");
    let t_dom = shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox);
    let stored = dunning::dunning_state(app.state(), &t_dom, &inv.id).await;
    assert_eq!(
        stored.ok().flatten().map(|s| s.status),
        Some(DunningStatus::Stopped)
    );
    app.stop().await;
}

/// Policies made the default at once, by creates and by updates: each
/// time exactly one policy is the default, and it is the one the
/// project's pointer names.
async fn exactly_one_default_when_requests_race(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Race ISP", "owner@race.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let policies = "/v1/billing/dunning/policies";
    let mut ids = Vec::new();
    for i in 0..4 {
        let a = call(
            &app,
            "POST",
            policies,
            &key,
            Some(&json!({"name": format!("P{i}"), "retryIntervalsDays": [1]})),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.body);
        ids.push(text(&a.body["id"]));
    }
    for round in 0..3 {
        let updates = ids.iter().map(|id| {
            let (app, key) = (&app, &key);
            let path = format!("{policies}/{id}");
            async move {
                let body = json!({"isDefault": true});
                call(app, "PATCH", &path, key, Some(&body)).await
            }
        });
        let creates = (0..4).map(|i| {
            let (app, key) = (&app, &key);
            async move {
                let body = json!({"name": format!("R{round}-{i}"), "retryIntervalsDays": [2],
                    "isDefault": true});
                call(app, "POST", policies, key, Some(&body)).await
            }
        });
        let (a, b) = futures::future::join(
            futures::future::join_all(updates),
            futures::future::join_all(creates),
        )
        .await;
        for r in a.iter().chain(b.iter()) {
            assert!(matches!(r.status, 200 | 201), "{}", r.body);
        }
        let list = call(&app, "GET", &format!("{policies}?limit=100"), &key, None).await;
        let defaults: Vec<String> = list.body["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|p| p["isDefault"] == true)
                    .map(|p| text(&p["id"]))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(defaults.len(), 1, "round {round}: {defaults:?}");
        let t_dom = shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox);
        let pointer = dunning::default_policy(app.state(), &t_dom)
            .await
            .ok()
            .flatten();
        assert_eq!(
            pointer.map(|p| p.to_string()),
            Some(defaults[0].clone()),
            "round {round}"
        );
    }
    app.stop().await;
}

/// The SDK's `dunning` resource, unchanged (tests/sdk/paybridge_dunning.py):
/// every method but `set_subscription_policy` (subscriptions' own).
async fn the_sdk_dunning_resource_works_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("SDK ISP", "owner@sdk-isp.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    // A policy to dun with, and an overdue invoice under it.
    let p = call(
        &app,
        "POST",
        "/v1/billing/dunning/policies",
        &key,
        Some(&json!({"name": "Seed", "retryIntervalsDays": [1, 3]})),
    )
    .await;
    assert_eq!(p.status, 201, "{}", p.body);
    let inv = issued_invoice(&app, &t).await;
    dunned(&app, &inv, &text(&p.body["id"])).await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/paybridge_dunning.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("BASE_URL", &app.base)
        .env("API_KEY", &key)
        .env("INVOICE_ID", inv.id.as_str())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(std::time::Duration::from_secs(120), run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("the SDK dunning run took over 120 s"),
    };
    app.stop().await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK dunning run failed on {which:?}:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all SDK dunning calls behaved"), "{stdout}");
}

on_both_backends!(
    dunning_over_http,
    exactly_one_default_when_requests_race,
    the_sdk_dunning_resource_works_unchanged,
);
