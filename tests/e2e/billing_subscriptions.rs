//! Issue 39 item 3, subscriptions over HTTP as a merchant's code calls
//! them: create (with and without a trial, the first invoice issued at
//! once without one), list with filters, get, pause, resume, cancel now
//! and at period end, end and extend a trial, the dunning policy; every
//! refused transition a 409 `subscription_state_conflict`, bad input a
//! 400 naming the field, another project's ids 404; the customer kept
//! while a subscription of theirs is open. And the official SDK's
//! subscription calls, unchanged (tests/sdk/billing_subscriptions.py).

use dhukuti_tests::billing::{call, post, text};
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::billing::calendar::nepal_day;
use shared::domain::billing::invoice::{BillingInvoice, PeriodClaim};
use shared::domain::record;
use shared::ids::SubscriptionId;
use shared::time::{Clock, SystemClock, Timestamp};

/// The first invoice of subscription `id`, issued today (Nepal), if any.
async fn first_invoice(app: &TestApp, id: &str) -> Option<BillingInvoice> {
    let today = nepal_day(SystemClock.now());
    let claim_key = PeriodClaim::key(&SubscriptionId::stored(id), today);
    let claim = record::get::<PeriodClaim>(&*app.store, &claim_key)
        .await
        .unwrap_or_else(|e| panic!("claim: {e}"))?;
    record::get::<BillingInvoice>(&*app.store, &BillingInvoice::key(&claim.invoice_id))
        .await
        .unwrap_or_else(|e| panic!("invoice: {e}"))
}

async fn subscriptions_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Gym Kathmandu", "owner@gym.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let c = post(
        &app,
        "/v1/billing/customers",
        &key,
        json!({"name": "Sita Rai"}),
    )
    .await;
    let customer = text(&c.body["id"]);
    let p = post(
        &app,
        "/v1/billing/plans",
        &key,
        json!({"name": "Monthly", "amount": 150_000, "intervalUnit": "month"}),
    )
    .await;
    let monthly = text(&p.body["id"]);
    let p = post(
        &app,
        "/v1/billing/plans",
        &key,
        json!({"name": "Trial", "amount": 99_900, "intervalUnit": "month", "trialDays": 14}),
    )
    .await;
    let trial_plan = text(&p.body["id"]);

    // Without a trial: incomplete, its first invoice issued at once. The
    // same Idempotency-Key again answers the first one.
    let body = json!({"customerId": customer, "planId": monthly, "referenceId": "m-7"});
    let a = app
        .post(
            "/v1/billing/subscriptions",
            Some(&key),
            Some("sub-once"),
            &body,
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let sub = text(&a.body["id"]);
    assert!(sub.starts_with("sub_"), "{}", a.body);
    assert_eq!(a.body["status"], "incomplete");
    assert_eq!(a.body["livemode"], false);
    assert_eq!(a.body["referenceId"], "m-7");
    assert_eq!(a.body["plan"]["amount"], 150_000);
    assert_eq!(a.body["quantity"], 1);
    assert!(a.body["currentPeriodStart"].is_string(), "{}", a.body);
    let again = app
        .post(
            "/v1/billing/subscriptions",
            Some(&key),
            Some("sub-once"),
            &body,
        )
        .await;
    assert_eq!(again.body["id"], sub.as_str(), "{}", again.body);
    let invoice = first_invoice(&app, &sub).await.expect("the first invoice");
    assert_eq!(invoice.amount_due, 150_000);
    assert!(invoice.number.starts_with("TEST-PI-"), "{}", invoice.number);

    // Bad input: 400 naming the field; another project's records: 404.
    for (extra, field) in [
        (json!({"trialDays": 366}), "trialDays"),
        (json!({"billingAnchorDay": 29}), "billingAnchorDay"),
        (json!({"quantity": 2}), "quantity"),
        (json!({"startDate": "2001-01-01"}), "startDate"),
        (json!({"trialEndsAt": "yesterday"}), "trialEndsAt"),
    ] {
        let mut b = json!({"customerId": customer, "planId": monthly});
        if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let r = post(&app, "/v1/billing/subscriptions", &key, b).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], field, "{}", r.body);
    }
    let other = app.tenant("Other Gym", "owner@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let r = post(
        &app,
        "/v1/billing/subscriptions",
        &other_key,
        json!({"customerId": customer, "planId": monthly}),
    )
    .await;
    r.assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(r.body["error"]["param"], "customerId", "{}", r.body);
    let r = call(
        &app,
        "GET",
        &format!("/v1/billing/subscriptions/{sub}"),
        &other_key,
        None,
    )
    .await;
    r.assert_error(404, "invalid_request_error", "not_found");
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/cancel"),
        &other_key,
        json!({}),
    )
    .await;
    r.assert_error(404, "invalid_request_error", "not_found");

    // The customer is kept while a subscription is open.
    let del = call(
        &app,
        "DELETE",
        &format!("/v1/billing/customers/{customer}"),
        &key,
        None,
    )
    .await;
    del.assert_error(409, "invalid_request_error", "customer_has_subscriptions");

    // A trial: trialing, nothing issued; extend only later; end it.
    let a = post(
        &app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": trial_plan}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["status"], "trialing");
    let trial = text(&a.body["id"]);
    assert!(first_invoice(&app, &trial).await.is_none());
    let ends = Timestamp::parse(&text(&a.body["trialEndsAt"])).expect("trialEndsAt");
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/extend-trial"),
        &key,
        json!({"trialEndsAt": ends.plus(chrono::Duration::days(-1)).to_string()}),
    )
    .await;
    r.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(r.body["error"]["param"], "trialEndsAt", "{}", r.body);
    let later = ends.plus(chrono::Duration::days(3));
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/extend-trial"),
        &key,
        json!({"trialEndsAt": later.to_string()}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["trialEndsAt"], later.to_string());
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/end-trial"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["subscription"]["status"], "active");
    assert_eq!(r.body["invoice"]["status"], "open");
    assert_eq!(r.body["invoice"]["amountDue"], 99_900);
    assert_eq!(r.body["invoice"]["subscriptionId"], trial.as_str());
    let issued = first_invoice(&app, &trial)
        .await
        .expect("issued at trial end");
    assert_eq!(r.body["invoice"]["id"], issued.id.as_str());
    // The invoice exactly as its own GET answers it.
    let got = app
        .get(&format!("/v1/billing/invoices/{}", issued.id), Some(&key))
        .await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(r.body["invoice"], got.body);
    for action in ["end-trial", "resume"] {
        let r = post(
            &app,
            &format!("/v1/billing/subscriptions/{trial}/{action}"),
            &key,
            json!({}),
        )
        .await;
        r.assert_error(409, "invalid_request_error", "subscription_state_conflict");
        assert!(
            text(&r.body["error"]["message"]).contains("active"),
            "{}",
            r.body
        );
    }

    // Pause and resume; cancel at period end keeps it open.
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/pause"),
        &key,
        json!({"pauseReason": "travelling"}),
    )
    .await;
    assert_eq!(r.body["status"], "paused", "{}", r.body);
    assert_eq!(r.body["pauseReason"], "travelling");
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/pause"),
        &key,
        json!({}),
    )
    .await;
    r.assert_error(409, "invalid_request_error", "subscription_state_conflict");
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/resume"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.body["status"], "active", "{}", r.body);
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{trial}/cancel"),
        &key,
        json!({"atPeriodEnd": true, "cancelReason": "moving"}),
    )
    .await;
    assert_eq!(r.body["status"], "active", "{}", r.body);
    assert_eq!(r.body["cancelAtPeriodEnd"], true);

    // The dunning policy: null reverts to the default; a policy that is
    // not the project's is not found.
    let r = post(
        &app,
        &format!("/v1/billing/dunning/subscriptions/{trial}/policy"),
        &key,
        json!({"policyId": null}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["dunningPolicyId"], Value::Null);
    let r = post(
        &app,
        &format!("/v1/billing/dunning/subscriptions/{trial}/policy"),
        &key,
        json!({"policyId": "dpol_01J00000000000000000000000"}),
    )
    .await;
    r.assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(r.body["error"]["param"], "policyId", "{}", r.body);

    // Lists: newest first, filtered.
    let all = call(&app, "GET", "/v1/billing/subscriptions?limit=1", &key, None).await;
    assert_eq!(all.body["total"], 2, "{}", all.body);
    assert_eq!(all.body["data"][0]["id"], trial.as_str(), "newest first");
    let inc = call(
        &app,
        "GET",
        &format!("/v1/billing/subscriptions?status=incomplete&customerId={customer}"),
        &key,
        None,
    )
    .await;
    assert_eq!(inc.body["total"], 1, "{}", inc.body);
    assert_eq!(inc.body["data"][0]["id"], sub.as_str());
    let by_plan = call(
        &app,
        "GET",
        &format!("/v1/billing/subscriptions?planId={trial_plan}"),
        &key,
        None,
    )
    .await;
    assert_eq!(by_plan.body["total"], 1, "{}", by_plan.body);
    let bad = call(
        &app,
        "GET",
        "/v1/billing/subscriptions?status=gone",
        &key,
        None,
    )
    .await;
    bad.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(bad.body["error"]["param"], "status");
    let theirs = call(&app, "GET", "/v1/billing/subscriptions", &other_key, None).await;
    assert_eq!(theirs.body["total"], 0, "{}", theirs.body);

    // Cancel both now: then the customer can go; a cancelled one is not
    // cancelled again.
    for id in [&sub, &trial] {
        let r = post(
            &app,
            &format!("/v1/billing/subscriptions/{id}/cancel"),
            &key,
            json!({}),
        )
        .await;
        assert_eq!(r.body["status"], "cancelled", "{}", r.body);
        assert!(r.body["cancelledAt"].is_string());
    }
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/cancel"),
        &key,
        json!({}),
    )
    .await;
    r.assert_error(409, "invalid_request_error", "subscription_state_conflict");
    let del = call(
        &app,
        "DELETE",
        &format!("/v1/billing/customers/{customer}"),
        &key,
        None,
    )
    .await;
    assert_eq!(del.status, 200, "{}", del.body);
    app.stop().await;
}

/// The official SDK's subscription calls, unchanged.
async fn the_sdk_subscription_calls_work_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let tenant = app.tenant("SDK Gym", "owner@sdkgym.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/sdk/billing_subscriptions.py");
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
    assert!(
        stdout.contains("all SDK subscription calls behaved"),
        "{stdout}"
    );
}

on_both_backends!(
    subscriptions_over_http,
    the_sdk_subscription_calls_work_unchanged
);
