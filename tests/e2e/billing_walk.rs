//! Issue 39 "Done when": a year walked on a sandbox test clock by the
//! official SDK, unchanged (tests/sdk/billing_walk.py), for a monthly AD
//! plan and a monthly BS plan: trial, the first invoice paid through the
//! Khalti simulator, pause and resume, an overdue invoice paid late, one
//! dunned to its final action, a cancel at period end; every reminder,
//! logged SMS, email and webhook asserted by count and content, month by
//! month (the script's tables).
//!
//! The gateway runs as in every e2e test; the script reads the mail
//! simulator's inbox and receives the webhooks itself. Sandbox SMS are
//! logged and never delivered, and no API lists their text, so this test
//! serves the project's SMS log to the script from the store, on a
//! 127.0.0.1 port of its own (`SMS_LOG`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use dhukuti_tests::{Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::account::Scope;
use shared::domain::{Mode, Tenant, sms};
use shared::store::Store;

/// The merchant's name, as the reminders carry it.
const MERCHANT: &str = "Thamel Fibre";

struct Log {
    store: Arc<dyn Store>,
    tenant: Tenant,
}

/// The project's sandbox SMS log, newest first (at most 100: the script
/// checks it read fewer).
async fn sms_log(State(log): State<Arc<Log>>) -> Json<Value> {
    let list = match sms::list_recent(&*log.store, &log.tenant, 100).await {
        Ok(l) => l,
        Err(e) => return Json(json!({"error": e.to_string()})),
    };
    let sms: Vec<Value> = list
        .iter()
        .rev()
        .map(|r| {
            json!({
                "id": r.id.as_str(), "to": r.to, "text": r.text,
                "invoiceId": r.invoice_id.as_ref().map(|i| i.as_str()),
                "status": r.status, "createdAt": r.created_at.to_string(),
            })
        })
        .collect();
    Json(json!({ "sms": sms }))
}

async fn a_year_on_a_test_clock(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    // The walk makes a few hundred calls in a minute.
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant(MERCHANT, "owner@thamelfibre.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let log = Arc::new(Log {
        store: app.store.clone(),
        tenant: Tenant::new(t.project.id.clone(), Mode::Sandbox),
    });
    let router = axum::Router::new()
        .route("/sms", get(sms_log))
        .with_state(log);
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let sms_url = match listener.local_addr() {
        Ok(a) => format!("http://{a}"),
        Err(e) => panic!("addr: {e}"),
    };
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let out = run_script(
        &python,
        "billing_walk.py",
        &[
            ("BASE_URL", &app.base),
            ("API_KEY", &key),
            ("MERCHANT", MERCHANT),
            ("SMS_LOG", &sms_url),
        ],
    )
    .await;
    server.abort();
    app.stop().await;
    out.passed(which, "the year walked as the tables say");
}

/// The SDK's customers (all but `add_credit`), plans and invoices, unchanged.
async fn the_sdk_billing_resources_work_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("SDK Yoga", "owner@sdkyoga.example").await;
    app.enable_fonepay(&t, Mode::Sandbox).await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let out = run_script(
        &python,
        "billing_resources.py",
        &[("BASE_URL", &app.base), ("API_KEY", &key)],
    )
    .await;
    app.stop().await;
    out.passed(which, "all SDK customer, plan and invoice calls behaved");
}

/// Issue 40 "Done when": three months of seats, a coupon, VAT, an
/// upgrade and more seats with prorations, usage, an installation fee and
/// credit, each invoice asserted to the paisa with its PDF's text
/// (tests/sdk/billing_adjustments_walk.py).
async fn three_months_of_a_real_price_list(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app
        .tenant("Himal Software", "owner@himalsoftware.example")
        .await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let pdftotext = std::env::var("DHUKUTI_PDFTOTEXT").unwrap_or_else(|_| "pdftotext".into());
    let out = run_script(
        &python,
        "billing_adjustments_walk.py",
        &[
            ("BASE_URL", &app.base),
            ("API_KEY", &key),
            ("PDFTOTEXT", &pdftotext),
        ],
    )
    .await;
    app.stop().await;
    out.passed(which, "the three months billed as the table says");
}

struct Run(std::process::Output);

impl Run {
    fn passed(&self, which: Which, marker: &str) {
        let stdout = String::from_utf8_lossy(&self.0.stdout);
        let stderr = String::from_utf8_lossy(&self.0.stderr);
        assert!(
            self.0.status.success() && stdout.contains(marker),
            "the SDK run failed on {which:?}:\n{stdout}\n{stderr}"
        );
    }
}

/// Runs `tests/sdk/<name>` with `env` (a hang guard of twenty minutes: on
/// moto beside the suite the walk takes a few).
async fn run_script(python: &std::path::Path, name: &str, env: &[(&str, &str)]) -> Run {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/sdk")
        .join(name);
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&script).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    match tokio::time::timeout(std::time::Duration::from_secs(1200), cmd.output()).await {
        Ok(Ok(out)) => Run(out),
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("{name} took over 1200 s"),
    }
}

on_both_backends!(
    a_year_on_a_test_clock,
    the_sdk_billing_resources_work_unchanged,
    three_months_of_a_real_price_list
);
