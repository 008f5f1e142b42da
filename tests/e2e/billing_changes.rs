//! Issue 40 parts 4 and 5 over HTTP: a mid-period upgrade on a test
//! clock, previewed then applied with its proration invoice, the refused
//! changes, a change scheduled for the next period that the clock's sweep
//! applies before it bills that period; the official SDK's plan change
//! calls, unchanged (tests/sdk/billing_changes.py); and the dashboard's
//! plan change (preview, then confirm) and seats forms.

use dhukuti_tests::billing::{clock_and_customer, get, ok, post, text};
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;

fn refused(a: &Answer, status: u16, code: &str, param: &str, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
    assert_eq!(a.body["error"]["code"], code, "{what}: {}", a.body);
    assert_eq!(a.body["error"]["param"], param, "{what}: {}", a.body);
}

/// Advances the clock to `to` and polls it until `ready` (each GET runs
/// part of its work, so this ends without waiting on time).
async fn advance(app: &TestApp, key: &str, clock: &str, to: &str) {
    let a = post(
        app,
        &format!("/v1/billing/test-clocks/{clock}/advance"),
        key,
        json!({"frozenTime": to}),
    )
    .await;
    ok(&a, 200, "advance");
    for _ in 0..100 {
        let a = get(app, &format!("/v1/billing/test-clocks/{clock}"), key).await;
        ok(&a, 200, "poll the clock");
        if a.body["status"] == "ready" {
            return;
        }
    }
    panic!("clock {clock} never became ready")
}

async fn invoices_of(app: &TestApp, key: &str, sub: &str) -> Vec<Value> {
    let a = get(
        app,
        &format!("/v1/billing/invoices?subscriptionId={sub}&limit=100"),
        key,
    )
    .await;
    ok(&a, 200, "list invoices");
    let mut all = a.body["data"].as_array().cloned().unwrap_or_default();
    all.sort_by_key(|i| text(&i["number"]));
    all
}

async fn plan(app: &TestApp, key: &str, body: Value) -> String {
    let a = post(app, "/v1/billing/plans", key, body).await;
    ok(&a, 201, "plan");
    text(&a.body["id"])
}

async fn a_mid_period_change_bills_its_proration(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Fibre Pokhara", "owner@fibre.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let (clock, customer) = clock_and_customer(&app, &key, "2026-01-10T06:00:00Z", "Upgrade").await;
    let basic = plan(
        &app,
        &key,
        json!({"name": "Basic", "amount": 99_900, "intervalUnit": "month", "trialDays": 7,
               "overdueAction": "keep_active"}),
    )
    .await;
    let pro = plan(
        &app,
        &key,
        json!({"name": "Pro", "amount": 199_900, "intervalUnit": "month"}),
    )
    .await;
    let yearly = plan(
        &app,
        &key,
        json!({"name": "Yearly", "amount": 999_000, "intervalUnit": "year"}),
    )
    .await;

    let a = post(
        &app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": basic}),
    )
    .await;
    ok(&a, 201, "subscribe");
    let sub = text(&a.body["id"]);
    // A trialing subscription bills nothing yet: its preview is nothing.
    let a = get(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/preview-proration?newPlanId={pro}"),
        &key,
    )
    .await;
    ok(&a, 200, "trialing preview");
    assert_eq!(a.body["netAmount"], 0, "{}", a.body);
    assert!(a.body["periodStart"].is_null(), "{}", a.body);
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/end-trial"),
        &key,
        json!({}),
    )
    .await;
    ok(&a, 200, "end trial");
    assert_eq!(a.body["subscription"]["currentPeriodStart"], "2026-01-10");
    assert_eq!(a.body["subscription"]["currentPeriodEnd"], "2026-02-10");

    // Ten days in: January 20, 21 of the period's 31 days remain.
    advance(&app, &key, &clock, "2026-01-20T06:00:00Z").await;
    let preview_path = format!("/v1/billing/subscriptions/{sub}/preview-proration?newPlanId={pro}");
    let a = get(&app, &preview_path, &key).await;
    ok(&a, 200, "preview");
    let preview = a.body.clone();
    assert_eq!(preview["creditAmount"], 67_674, "{preview}");
    assert_eq!(preview["debitAmount"], 135_416, "{preview}");
    assert_eq!(preview["netAmount"], 67_742, "{preview}");
    assert_eq!(preview["currency"], "NPR");
    assert_eq!(preview["periodStart"], "2026-01-10");
    assert_eq!(preview["periodEnd"], "2026-02-10");
    assert_eq!(preview["prorationDate"], "2026-01-20");
    assert_eq!(preview["remainingDays"], 21);
    assert_eq!(preview["totalDays"], 31);
    assert_eq!(preview["currentPlan"]["id"], basic.as_str());
    assert_eq!(preview["newPlan"]["id"], pro.as_str());
    assert_eq!(
        invoices_of(&app, &key, &sub).await.len(),
        1,
        "the preview wrote nothing"
    );

    // Refused, naming the field, writing nothing.
    let change = format!("/v1/billing/subscriptions/{sub}/change-plan");
    for (body, status, code, param, what) in [
        (
            json!({"newPlanId": basic}),
            400,
            "validation_failed",
            "newPlanId",
            "the current plan",
        ),
        (
            json!({"newPlanId": yearly}),
            400,
            "validation_failed",
            "newPlanId",
            "another interval",
        ),
        (
            json!({"newPlanId": "bp_01jzzzzzzzzzzzzzzzzzzzzzzz"}),
            404,
            "not_found",
            "newPlanId",
            "no such plan",
        ),
        (
            json!({"newPlanId": pro, "prorationBehavior": "later"}),
            400,
            "validation_failed",
            "prorationBehavior",
            "an unknown behavior",
        ),
        (
            json!({"newPlanId": pro, "effectiveAt": "2026-01-01"}),
            400,
            "validation_failed",
            "effectiveAt",
            "a day past",
        ),
        (
            json!({"newPlanId": pro, "prorationBehavior": "create_prorations", "effectiveAt": "2026-03-01"}),
            400,
            "validation_failed",
            "effectiveAt",
            "a later day for create_prorations",
        ),
    ] {
        let a = post(&app, &change, &key, body).await;
        refused(&a, status, code, param, what);
    }
    let a = get(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/preview-proration"),
        &key,
    )
    .await;
    refused(
        &a,
        400,
        "validation_failed",
        "newPlanId",
        "a preview without newPlanId",
    );

    // Applied now: the proration invoice bills exactly the preview.
    let a = post(
        &app,
        &change,
        &key,
        json!({"newPlanId": pro, "prorationBehavior": "create_prorations"}),
    )
    .await;
    ok(&a, 200, "create_prorations");
    assert_eq!(a.body["prorationApplied"], true);
    assert_eq!(a.body["planId"], pro.as_str());
    assert_eq!(a.body["plan"]["amount"], 199_900);
    assert_eq!(a.body["proration"]["netAmount"], preview["netAmount"]);
    let inv = &a.body["prorationInvoice"];
    assert_eq!(inv["amountDue"], preview["netAmount"], "{inv}");
    assert_eq!(inv["status"], "open");
    assert_eq!(inv["dueDate"], "2026-01-20", "{inv}");
    let kinds: Vec<Value> = inv["lines"]
        .as_array()
        .map(|l| l.iter().map(|l| l["kind"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(kinds, [json!("proration_credit"), json!("proration_debit")]);
    assert_eq!(inv["lines"][0]["amount"], -67_674);
    assert_eq!(inv["lines"][1]["amount"], 135_416);
    let all = invoices_of(&app, &key, &sub).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1]["id"], inv["id"]);

    // The default schedules a downgrade for the next period; the clock's
    // renewal applies it and bills the new plan.
    let a = post(&app, &change, &key, json!({"newPlanId": basic})).await;
    ok(&a, 200, "scheduled");
    assert_eq!(a.body["prorationApplied"], false);
    assert!(a.body["prorationInvoice"].is_null());
    assert_eq!(a.body["planId"], pro.as_str());
    assert_eq!(a.body["pendingPlanChange"]["plan"]["id"], basic.as_str());
    assert_eq!(a.body["pendingPlanChange"]["effectiveOn"], "2026-02-10");
    advance(&app, &key, &clock, "2026-02-10T06:00:00Z").await;
    let a = get(&app, &format!("/v1/billing/subscriptions/{sub}"), &key).await;
    ok(&a, 200, "after the renewal");
    assert_eq!(a.body["planId"], basic.as_str(), "{}", a.body);
    assert!(a.body["pendingPlanChange"].is_null(), "{}", a.body);
    let all = invoices_of(&app, &key, &sub).await;
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all[2]["amountDue"], 99_900, "{}", all[2]);
    assert_eq!(all[2]["periodStart"], "2026-02-10");

    // Another project's subscription: 404.
    let other = app.tenant("Other Fibre", "owner@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let a = post(&app, &change, &other_key, json!({"newPlanId": pro})).await;
    assert_eq!(a.status, 404, "{}", a.body);
    app.stop().await;
}

/// The official SDK's plan change calls, unchanged.
async fn the_sdk_plan_change_calls_work_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let tenant = app.tenant("SDK Fibre", "owner@sdkfibre.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/billing_changes.py");
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
        stdout.contains("all SDK plan change calls behaved"),
        "{stdout}"
    );
}

/// The dashboard: change plan through its preview, and seats.
async fn plan_changes_in_the_dashboard(which: Which) {
    use dhukuti_tests::dash::{Dash, field};
    use dhukuti_tests::shop::Shop;
    use shared::domain::dashboard::{self, Role};
    use shared::time::{Clock, SystemClock};
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let (app, key) = (&shop.app, shop.key.clone());
    let a = post(
        app,
        "/v1/billing/customers",
        &key,
        json!({"name": "Sita Rai"}),
    )
    .await;
    let customer = text(&a.body["id"]);
    let basic = plan(
        app,
        &key,
        json!({"name": "Basic", "amount": 99_900, "intervalUnit": "month", "trialDays": 7}),
    )
    .await;
    let pro = plan(
        app,
        &key,
        json!({"name": "Pro", "amount": 199_900, "intervalUnit": "month"}),
    )
    .await;
    let team = plan(
        app,
        &key,
        json!({"name": "Team", "amount": 50_000, "intervalUnit": "month", "trialDays": 7,
               "pricingModel": "per_unit"}),
    )
    .await;
    let mut subs = Vec::new();
    for (p, q) in [(&basic, 1), (&team, 2)] {
        let a = post(
            app,
            "/v1/billing/subscriptions",
            &key,
            json!({"customerId": customer, "planId": p, "quantity": q}),
        )
        .await;
        ok(&a, 201, "subscribe");
        let id = text(&a.body["id"]);
        let a = post(
            app,
            &format!("/v1/billing/subscriptions/{id}/end-trial"),
            &key,
            json!({}),
        )
        .await;
        ok(&a, 200, "end trial");
        subs.push(id);
    }
    let (sub, seats) = (&subs[0], &subs[1]);
    let mut people = Vec::new();
    for (email, role) in [
        ("viewer@fibre.example", Role::Viewer),
        ("dev@fibre.example", Role::Developer),
    ] {
        dashboard::create_user(
            app.state(),
            SystemClock.now(),
            &shop.tenant.merchant.id,
            email,
            role,
            "a long dashboard password",
        )
        .await
        .unwrap_or_else(|e| panic!("user: {e}"));
        let mut d = Dash::new(&app.base);
        let r = d.sign_in(email, "a long dashboard password").await;
        assert_eq!(r.status, 303, "{}", r.show());
        people.push(d);
    }
    let mut dev = people.pop().unwrap_or_else(|| panic!("dev"));
    let mut viewer = people.pop().unwrap_or_else(|| panic!("viewer"));
    let page_path = format!("/dashboard/billing/subscriptions/{sub}");

    // A viewer sees the plan and no form; a forged post is refused.
    let page = viewer.get(&page_path).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(!page.body.contains("change-plan"), "{}", page.show());
    let csrf = field(&page.body, "csrf");
    let r = viewer
        .post(
            &format!("{page_path}/change-plan"),
            &[
                ("csrf", &csrf),
                ("plan", &pro),
                ("behavior", "create_prorations"),
            ],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());

    // A developer: the form offers Pro; a flat plan has no seats form.
    let page = dev.get(&page_path).await;
    assert!(page.body.contains("Change plan to"), "{}", page.show());
    assert!(
        page.body.contains(&format!("value=\"{pro}\"")),
        "{}",
        page.show()
    );
    assert!(!page.body.contains("/quantity\""), "{}", page.show());
    // The preview writes nothing and shows the amounts.
    let preview = dev
        .get(&format!(
            "{page_path}/change-plan?plan={pro}&behavior=create_prorations"
        ))
        .await;
    assert_eq!(preview.status, 200, "{}", preview.show());
    assert!(
        preview.body.contains("Confirm the change"),
        "{}",
        preview.show()
    );
    assert!(
        preview.body.contains("A proration invoice of"),
        "{}",
        preview.show()
    );
    let a = get(app, &format!("/v1/billing/subscriptions/{sub}"), &key).await;
    assert_eq!(
        a.body["planId"],
        basic.as_str(),
        "the preview changed nothing"
    );
    let bad = dev
        .get(&format!(
            "{page_path}/change-plan?plan={basic}&behavior=create_prorations"
        ))
        .await;
    assert_eq!(bad.status, 400, "{}", bad.show());
    // Confirmed: changed, with its proration invoice.
    let csrf = field(&preview.body, "csrf");
    let r = dev
        .post(
            &format!("{page_path}/change-plan"),
            &[
                ("csrf", &csrf),
                ("plan", &pro),
                ("behavior", "create_prorations"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let a = get(app, &format!("/v1/billing/subscriptions/{sub}"), &key).await;
    assert_eq!(a.body["planId"], pro.as_str(), "{}", a.body);
    assert_eq!(invoices_of(app, &key, sub).await.len(), 2);

    // Seats on the per-unit subscription.
    let seats_path = format!("/dashboard/billing/subscriptions/{seats}");
    let page = dev.get(&seats_path).await;
    assert!(page.body.contains("/quantity\""), "{}", page.show());
    let csrf = field(&page.body, "csrf");
    let r = dev
        .post(
            &format!("{seats_path}/quantity"),
            &[("csrf", &csrf), ("quantity", "many")],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    let r = dev
        .post(
            &format!("{seats_path}/quantity"),
            &[("csrf", &csrf), ("quantity", "4")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let a = get(app, &format!("/v1/billing/subscriptions/{seats}"), &key).await;
    assert_eq!(a.body["quantity"], 4, "{}", a.body);
    let page = dev.get(&format!("{seats_path}?done=quantity")).await;
    assert!(
        page.body.contains("The seats are changed."),
        "{}",
        page.show()
    );
    shop.stop().await;
}

on_both_backends!(
    a_mid_period_change_bills_its_proration,
    the_sdk_plan_change_calls_work_unchanged,
    plan_changes_in_the_dashboard
);
