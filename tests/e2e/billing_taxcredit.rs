//! Issue 40 parts 2 and 3 over HTTP: the tax settings
//! (`/v1/billing/settings/tax`) and a customer's credit
//! (`/v1/billing/customers/{id}/credit`), as a merchant's code calls them;
//! bad input refused naming its field with nothing stored; 20 racing
//! deductions of a balance that covers 10; the dashboard's tax form and
//! credit ledger; and the SDK's `tax` and `add_credit`, unchanged.

use dhukuti_tests::browser::text;
use dhukuti_tests::dash::Dash;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock};

async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    key: &str,
    body: Option<&Value>,
    idem: Option<&str>,
) -> Answer {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut req = app.client.request(m, app.url(path)).bearer_auth(key);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    if let Some(k) = idem {
        req = req.header("idempotency-key", k);
    }
    send(req).await
}

async fn customer(app: &TestApp, key: &str, name: &str) -> String {
    let a = call(
        app,
        "POST",
        "/v1/billing/customers",
        key,
        Some(&json!({"name": name})),
        None,
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["creditBalance"], 0, "{}", a.body);
    text(&a.body["id"])
}

async fn tax_settings_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Fibre", "owner@himal.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let read = app.key(&t, Mode::Sandbox, &[Scope::BillingRead]).await;
    let path = "/v1/billing/settings/tax";

    let first = call(&app, "GET", path, &key, None, None).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["enabled"], false);
    assert_eq!(first.body["rateBps"], 1300);
    assert_eq!(first.body["label"], "VAT");
    assert_eq!(first.body["registrationNumber"], Value::Null);
    assert_eq!(first.body["overpaymentHandling"], "refund");

    let on = call(
        &app,
        "PATCH",
        path,
        &key,
        Some(&json!({"enabled": true, "rateBps": 1300, "label": "VAT", "registrationNumber": "301 234 567"})),
        None,
    )
    .await;
    assert_eq!(on.status, 200, "{}", on.body);
    assert_eq!(on.body["enabled"], true);
    assert_eq!(on.body["registrationNumber"], "301234567");

    // Bad input: 400 naming the field, nothing stored.
    for (body, field) in [
        (json!({"rateBps": 10_001}), "rateBps"),
        (json!({"rateBps": -5}), "rateBps"),
        (json!({"registrationNumber": "12345"}), "registrationNumber"),
        (json!({"label": ""}), "label"),
        (json!({"enabled": "yes"}), "enabled"),
        (
            json!({"overpaymentHandling": "keep"}),
            "overpaymentHandling",
        ),
        (json!({"enabled": null}), "enabled"),
    ] {
        let r = call(&app, "PATCH", path, &key, Some(&body), None).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], field, "{body}: {}", r.body);
    }
    let same = call(&app, "GET", path, &read, None, None).await;
    assert_eq!(same.body["rateBps"], 1300, "{}", same.body);
    assert_eq!(same.body["registrationNumber"], "301234567");

    let changed = call(
        &app,
        "PATCH",
        path,
        &key,
        Some(&json!({"label": null, "registrationNumber": null, "overpaymentHandling": "credit"})),
        None,
    )
    .await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(changed.body["label"], "VAT");
    assert_eq!(changed.body["registrationNumber"], Value::Null);
    assert_eq!(changed.body["overpaymentHandling"], "credit");
    assert_eq!(changed.body["enabled"], true, "kept");

    // A read key reads and cannot write; live settings are apart.
    let denied = call(
        &app,
        "PATCH",
        path,
        &read,
        Some(&json!({"enabled": false})),
        None,
    )
    .await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    let live = app.key(&t, Mode::Live, &Scope::ALL).await;
    let l = call(&app, "GET", path, &live, None, None).await;
    assert_eq!(l.body["enabled"], false, "{}", l.body);
    assert_eq!(l.body["livemode"], true);
    app.stop().await;
}

async fn customer_credit_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Fibre", "owner@himal.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sita = customer(&app, &key, "Sita Rai").await;
    let path = format!("/v1/billing/customers/{sita}/credit");

    let added = call(
        &app,
        "POST",
        &path,
        &key,
        Some(&json!({"amount": 50_000, "note": "paid in advance"})),
        Some("credit-1"),
    )
    .await;
    assert_eq!(added.status, 200, "{}", added.body);
    assert_eq!(added.body["id"], sita.as_str());
    assert_eq!(added.body["creditBalance"], 50_000);
    // The same request again (a lost answer): nothing more is added.
    let again = call(
        &app,
        "POST",
        &path,
        &key,
        Some(&json!({"amount": 50_000, "note": "paid in advance"})),
        Some("credit-1"),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["creditBalance"], 50_000, "{}", again.body);
    let less = call(
        &app,
        "POST",
        &path,
        &key,
        Some(&json!({"amount": -20_000})),
        None,
    )
    .await;
    assert_eq!(less.body["creditBalance"], 30_000, "{}", less.body);

    // Bad input: 400 naming the field, nothing stored.
    for (body, field) in [
        (json!({"amount": -30_001}), "amount"),
        (json!({"amount": 0}), "amount"),
        (json!({"amount": i64::MAX}), "amount"),
        (json!({"amount": 1.5}), "amount"),
        (json!({"amount": "500"}), "amount"),
        (json!({}), "amount"),
        (json!({"amount": 100, "note": "x".repeat(501)}), "note"),
    ] {
        let r = call(&app, "POST", &path, &key, Some(&body), None).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], field, "{body}: {}", r.body);
    }
    let got = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{sita}"),
        &key,
        None,
        None,
    )
    .await;
    assert_eq!(got.body["creditBalance"], 30_000, "{}", got.body);
    let ledger = call(&app, "GET", &path, &key, None, None).await;
    assert_eq!(ledger.status, 200, "{}", ledger.body);
    assert_eq!(ledger.body["creditBalance"], 30_000);
    let entries = ledger.body["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 2, "{}", ledger.body);
    assert_eq!(entries[0]["amount"], -20_000);
    assert_eq!(entries[0]["balanceAfter"], 30_000);
    assert_eq!(entries[1]["note"], "paid in advance");
    assert_eq!(entries[1]["reason"], "manual");
    assert!(
        text(&entries[1]["id"]).starts_with("cbt_")
            && text(&entries[1]["createdBy"]).starts_with("ak_"),
        "{}",
        ledger.body
    );
    let bad_limit = call(&app, "GET", &format!("{path}?limit=0"), &key, None, None).await;
    assert_eq!(
        bad_limit.body["error"]["param"], "limit",
        "{}",
        bad_limit.body
    );
    // Another merchant's customer is not found.
    let other = app.tenant("Other", "owner@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let r = call(
        &app,
        "POST",
        &path,
        &other_key,
        Some(&json!({"amount": 1})),
        None,
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    app.stop().await;
}

/// 20 deductions of NPR 10 racing for a balance of NPR 100: exactly 10
/// are taken, the others refused naming `amount`; the balance ends at 0.
async fn racing_deductions_take_exactly_the_balance(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Himal Fibre", "owner@himal.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sita = customer(&app, &key, "Sita Rai").await;
    let path = format!("/v1/billing/customers/{sita}/credit");
    let r = call(
        &app,
        "POST",
        &path,
        &key,
        Some(&json!({"amount": 10_000})),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let deduct = json!({"amount": -1_000});
    let racers = (0..20).map(|_| call(&app, "POST", &path, &key, Some(&deduct), None));
    let answers = futures::future::join_all(racers).await;
    let taken = answers.iter().filter(|a| a.status == 200).count();
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.status != 200).collect();
    assert_eq!(
        taken,
        10,
        "{:?}",
        answers.iter().map(|a| &a.body).collect::<Vec<_>>()
    );
    for a in refused {
        assert_eq!(a.status, 400, "{}", a.body);
        assert_eq!(a.body["error"]["param"], "amount", "{}", a.body);
    }
    let ledger = call(&app, "GET", &path, &key, None, None).await;
    assert_eq!(ledger.body["creditBalance"], 0, "{}", ledger.body);
    assert_eq!(ledger.body["data"].as_array().map(Vec::len), Some(11));
    app.stop().await;
}

const PASSWORD: &str = "a long dashboard password";

async fn tax_and_credit_in_the_dashboard(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Fibre", "owner@himal.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let sita = customer(&app, &key, "Sita Rai").await;
    let mut people = Vec::new();
    for (email, role) in [
        ("dev@himal.example", Role::Developer),
        ("viewer@himal.example", Role::Viewer),
    ] {
        dashboard::create_user(
            app.state(),
            SystemClock.now(),
            &t.merchant.id,
            email,
            role,
            PASSWORD,
        )
        .await
        .unwrap_or_else(|e| panic!("user: {e}"));
        let mut d = Dash::new(&app.base);
        let r = d.sign_in(email, PASSWORD).await;
        assert_eq!(r.status, 303, "{}", r.show());
        people.push(d);
    }
    let (mut dev, mut viewer) = match <[Dash; 2]>::try_from(people) {
        Ok([a, b]) => (a, b),
        Err(_) => panic!("two people"),
    };
    let tax = "/dashboard/billing/settings/tax";

    // The viewer sees the settings, no form; a forged post changes nothing.
    let page = viewer.get(tax).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.body.contains("VAT (13.00%)") && !page.body.contains("name=\"rate_bps\""),
        "{}",
        page.show()
    );
    let csrf = viewer.csrf_of(tax).await;
    let forged = viewer
        .post(
            tax,
            &[("csrf", &csrf), ("enabled", "true"), ("rate_bps", "1300")],
        )
        .await;
    assert_eq!(forged.status, 403, "{}", forged.show());

    // The developer: a bad rate is said on the page, a good form saved.
    let csrf = dev.csrf_of(tax).await;
    let bad = dev
        .post(
            tax,
            &[("csrf", &csrf), ("enabled", "true"), ("rate_bps", "10001")],
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.show());
    assert!(
        bad.body.contains("rateBps must be from 0 to 10000"),
        "{}",
        bad.show()
    );
    let csrf = dev.csrf_of(tax).await;
    let saved = dev
        .post(
            tax,
            &[
                ("csrf", &csrf),
                ("enabled", "true"),
                ("rate_bps", "1300"),
                ("registration_number", "301234567"),
                ("label", "VAT"),
                ("overpayment_handling", "credit"),
            ],
        )
        .await;
    assert_eq!(saved.status, 303, "{}", saved.show());
    let api = call(&app, "GET", "/v1/billing/settings/tax", &key, None, None).await;
    assert_eq!(api.body["enabled"], true, "{}", api.body);
    assert_eq!(api.body["registrationNumber"], "301234567");
    assert_eq!(api.body["overpaymentHandling"], "credit");

    // Credit on the customer's page: added, a deduction beyond refused.
    let page_path = format!("/dashboard/billing/customers/{sita}");
    let csrf = dev.csrf_of(&page_path).await;
    let add = dev
        .post(
            &format!("{page_path}/credit"),
            &[
                ("csrf", &csrf),
                ("amount", "250.50"),
                ("note", "advance for Poush"),
            ],
        )
        .await;
    assert_eq!(add.status, 303, "{}", add.show());
    let csrf = dev.csrf_of(&page_path).await;
    let beyond = dev
        .post(
            &format!("{page_path}/credit"),
            &[("csrf", &csrf), ("amount", "-300")],
        )
        .await;
    assert_eq!(beyond.status, 303, "{}", beyond.show());
    let page = dev.get(&page_path).await;
    assert!(
        page.body.contains("NPR 250.50") && page.body.contains("advance for Poush"),
        "{}",
        page.show()
    );
    let shown = viewer.get(&format!("{page_path}?credit_error=x")).await;
    assert!(!shown.body.contains("name=\"amount\""), "{}", shown.show());
    let api = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{sita}"),
        &key,
        None,
        None,
    )
    .await;
    assert_eq!(api.body["creditBalance"], 25_050, "{}", api.body);
    let ledger = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{sita}/credit"),
        &key,
        None,
        None,
    )
    .await;
    assert!(
        text(&ledger.body["data"][0]["createdBy"]).starts_with("usr_"),
        "{}",
        ledger.body
    );
    app.stop().await;
}

/// The official SDK's `tax` resource and `customers.add_credit`, unchanged.
async fn the_sdk_tax_and_credit_calls_work_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("SDK Fibre", "owner@sdkfibre.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/billing_tax_credit.py");
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
        out.status.success() && stdout.contains("all SDK tax and credit calls behaved"),
        "the SDK run failed on {which:?}:\n{stdout}\n{stderr}"
    );
}

/// The text of a PDF, through `pdftotext` (`DHUKUTI_PDFTOTEXT` or PATH),
/// with runs of whitespace made single spaces.
fn pdf_text(bytes: &[u8]) -> String {
    let tool = std::env::var("DHUKUTI_PDFTOTEXT").unwrap_or_else(|_| "pdftotext".into());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("invoice.pdf");
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write pdf: {e}"));
    let out = std::process::Command::new(&tool)
        .arg("-layout")
        .arg(&path)
        .arg("-")
        .output()
        .unwrap_or_else(|e| {
            panic!("{tool} did not run ({e}): install poppler-utils or set DHUKUTI_PDFTOTEXT")
        });
    assert!(out.status.success(), "{tool} failed");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first invoice of a new subscription of `customer` to a plan of
/// NPR 500 a month, as the API answers it.
async fn first_invoice(app: &TestApp, key: &str, customer: &str) -> Value {
    let plan = call(
        app,
        "POST",
        "/v1/billing/plans",
        key,
        Some(&json!({"name": "Fibre 100", "amount": 50_000, "intervalUnit": "month"})),
        None,
    )
    .await;
    assert_eq!(plan.status, 201, "{}", plan.body);
    let sub = call(
        app,
        "POST",
        "/v1/billing/subscriptions",
        key,
        Some(&json!({"customerId": customer, "planId": plan.body["id"]})),
        None,
    )
    .await;
    assert_eq!(sub.status, 201, "{}", sub.body);
    let list = call(
        app,
        "GET",
        &format!(
            "/v1/billing/invoices?subscriptionId={}",
            text(&sub.body["id"])
        ),
        key,
        None,
        None,
    )
    .await;
    assert_eq!(list.body["total"], 1, "{}", list.body);
    list.body["data"][0].clone()
}

/// VAT and credit on a billing invoice: its amounts to the paisa, the
/// snapshot of the rate and the seller's number, the fiscal year, the
/// PDF (a "Tax Invoice", read back with pdftotext) and the bill page; an
/// invoice without VAT stays an invoice.
async fn a_tax_invoice_with_credit(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Fibre", "owner@himal.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let on = call(
        &app,
        "PATCH",
        "/v1/billing/settings/tax",
        &key,
        Some(&json!({"enabled": true, "rateBps": 1300, "registrationNumber": "301234567"})),
        None,
    )
    .await;
    assert_eq!(on.status, 200, "{}", on.body);
    let c = call(
        &app,
        "POST",
        "/v1/billing/customers",
        &key,
        Some(&json!({"name": "Sita Rai", "metadata": {"pan": "600-123-456"}})),
        None,
    )
    .await;
    let sita = text(&c.body["id"]);
    let r = call(
        &app,
        "POST",
        &format!("/v1/billing/customers/{sita}/credit"),
        &key,
        Some(&json!({"amount": 10_000})),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let inv = first_invoice(&app, &key, &sita).await;
    let id = text(&inv["id"]);
    // NPR 500 + 13% VAT = 565; NPR 100 of credit; 465 due.
    for (field, want) in [
        ("subtotal", 50_000),
        ("taxableAmount", 50_000),
        ("taxTotal", 6_500),
        ("total", 56_500),
        ("amount", 56_500),
        ("creditApplied", 10_000),
        ("amountDue", 46_500),
        ("taxRateBps", 1_300),
    ] {
        assert_eq!(inv[field], want, "{field}: {inv}");
    }
    assert_eq!(inv["taxRegistrationNumber"], "301234567", "{inv}");
    let today = shared::domain::billing::calendar::nepal_day(SystemClock.now());
    let fy = shared::domain::billing::tax::fiscal_year(today).unwrap_or_default();
    assert_eq!(inv["fiscalYear"], fy.as_str(), "{inv}");
    let ledger = call(
        &app,
        "GET",
        &format!("/v1/billing/customers/{sita}/credit"),
        &key,
        None,
        None,
    )
    .await;
    assert_eq!(ledger.body["creditBalance"], 0, "{}", ledger.body);
    assert_eq!(ledger.body["data"][0]["reason"], "invoice_applied");
    assert_eq!(ledger.body["data"][0]["invoiceId"], id.as_str());

    // The PDF is a tax invoice.
    let pdf = app
        .client
        .get(app.url(&format!("/v1/billing/invoices/{id}/pdf")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pdf.status(), 200);
    let doc = pdf_text(&pdf.bytes().await.unwrap_or_default());
    for want in [
        "Tax Invoice",
        "PAN/VAT No. 301234567",
        "PAN 600123456",
        "Subtotal NPR 500.00",
        "Taxable amount NPR 500.00",
        "VAT (13.00%) NPR 65.00",
        "Total NPR 565.00",
        "Credit applied -NPR 100.00",
        "Amount due NPR 465.00",
        &format!("Fiscal year FY {fy}"),
        "Date (BS) 208",
    ] {
        assert!(doc.contains(want), "{want:?} not in: {doc}");
    }
    assert!(doc.contains(&today.to_string()), "the AD date: {doc}");

    // The bill page says the same.
    let page = app
        .client
        .get(app.url(&format!("/b/{id}")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let page = page.text().await.unwrap_or_default();
    for want in [
        "Tax Invoice",
        "Seller PAN/VAT No. 301234567",
        "Buyer PAN 600123456",
        &format!("FY {fy}"),
        "VAT (13.00%)",
        "NPR 65.00",
        "Taxable amount",
        "NPR 465.00",
        " BS)",
    ] {
        assert!(page.contains(want), "{want:?} not in: {page}");
    }

    // A rate changed later does not rewrite it.
    call(
        &app,
        "PATCH",
        "/v1/billing/settings/tax",
        &key,
        Some(&json!({"rateBps": 1500})),
        None,
    )
    .await;
    let again = call(
        &app,
        "GET",
        &format!("/v1/billing/invoices/{id}"),
        &key,
        None,
        None,
    )
    .await;
    assert_eq!(again.body["taxRateBps"], 1300, "{}", again.body);
    assert_eq!(again.body["taxTotal"], 6_500);

    // Without VAT: an invoice, with its fiscal year.
    let other = app.tenant("Plain Shop", "owner@plain.example").await;
    let plain_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let ram = customer(&app, &plain_key, "Ram Thapa").await;
    let plain = first_invoice(&app, &plain_key, &ram).await;
    assert_eq!(plain["taxRateBps"], 0, "{plain}");
    assert_eq!(plain["taxTotal"], 0);
    assert_eq!(plain["fiscalYear"], fy.as_str());
    let pdf = app
        .client
        .get(app.url(&format!("/v1/billing/invoices/{}/pdf", text(&plain["id"]))))
        .bearer_auth(&plain_key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = pdf_text(&pdf.bytes().await.unwrap_or_default());
    assert!(
        doc.contains("INVOICE") && !doc.contains("Tax Invoice"),
        "{doc}"
    );
    assert!(doc.contains(&format!("Fiscal year FY {fy}")), "{doc}");
    app.stop().await;
}

on_both_backends!(
    tax_settings_over_http,
    customer_credit_over_http,
    racing_deductions_take_exactly_the_balance,
    tax_and_credit_in_the_dashboard,
    the_sdk_tax_and_credit_calls_work_unchanged,
    a_tax_invoice_with_credit
);
