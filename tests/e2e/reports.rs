//! Issue 41, exports, over HTTP on both backends: a report of payments
//! started, polled from `pending` to `ready`, its file downloaded through
//! the link the report gives (S3's presigned GET on moto, the signed local
//! link on the embedded backend) and parsed: one row per payment of the
//! range, amounts in paisa and rupees, a formula neutralised. Bad input is
//! a 400 naming the field; another tenant's report is not found; on the
//! embedded backend a forged or expired link is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app_with_clock};
use serde_json::{Value, json};
use shared::domain::account::Scope;
use shared::domain::{Mode, Provider};
use shared::time::{Clock, ManualClock, SystemClock};

async fn post(app: &TestApp, key: &str, body: Value) -> Answer {
    let req = app
        .client
        .post(app.url("/v1/reports"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("idempotency-key", format!("k-{}", ulid::Ulid::new()))
        .body(body.to_string());
    send(req).await
}

/// Polls the report until it is `ready` (a task of the gateway runs it),
/// answering it.
async fn ready(app: &TestApp, key: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let path = format!("/v1/reports/{id}");
    while Instant::now() < deadline {
        let a = app.get(&path, Some(key)).await;
        assert_eq!(a.status, 200, "{}", a.body);
        match a.body["status"].as_str() {
            Some("ready") => return a.body,
            Some("pending" | "running") => tokio::task::yield_now().await,
            _ => panic!("report: {}", a.body),
        }
    }
    panic!("report {id} never became ready")
}

async fn download(app: &TestApp, url: &str) -> (u16, String) {
    let answer = app
        .client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap_or_default())
}

async fn a_payments_export_runs_and_downloads(which: Which) {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let Some(app) = spawn_app_with_clock(which, |s| s, clock.clone()).await else {
        return;
    };
    let tenant = app.tenant("Sita's Shop", "sita@example.com").await;
    let key = app
        .key(
            &tenant,
            Mode::Sandbox,
            &[Scope::PaymentsRead, Scope::RefundsRead],
        )
        .await;
    let mut ids = Vec::new();
    for amount in [150_050, 10_000, 99] {
        ids.push(
            app.payment(&tenant, Mode::Sandbox, amount, Provider::Khalti)
                .await
                .id,
        );
    }
    let now = SystemClock.now();
    let from = now.plus(chrono::Duration::hours(-1)).to_rfc3339();
    let to = now.plus(chrono::Duration::hours(1)).to_rfc3339();

    // Bad input: 400 naming the field.
    for (body, param) in [
        (json!({"type": "payouts", "from": from, "to": to}), "type"),
        (
            json!({"type": "reconciliation", "from": from, "to": to}),
            "type",
        ),
        (
            json!({"type": "payments", "from": "last week", "to": to}),
            "from",
        ),
        (json!({"type": "payments", "from": to, "to": from}), "to"),
        (
            json!({"type": "payments", "from": "2024-01-01T00:00:00Z", "to": "2025-06-01T00:00:00Z"}),
            "to",
        ),
    ] {
        let a = post(&app, &key, body.clone()).await;
        assert_eq!(a.status, 400, "{body}: {}", a.body);
        assert_eq!(a.body["error"]["code"], "validation_failed", "{}", a.body);
        assert_eq!(a.body["error"]["param"], param, "{body}: {}", a.body);
    }

    let a = post(
        &app,
        &key,
        json!({"type": "payments", "from": from, "to": to}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["status"], "pending", "{}", a.body);
    assert_eq!(a.body["downloadUrl"], Value::Null);
    let id = a.body["id"].as_str().unwrap_or_default().to_owned();
    assert!(id.starts_with("rpt_"), "{id}");
    let report = ready(&app, &key, &id).await;
    assert_eq!(report["rows"], 3, "{report}");
    let url = report["downloadUrl"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!url.is_empty(), "{report}");
    let (status, csv) = download(&app, &url).await;
    assert_eq!(status, 200, "{csv}");
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(header, shared::domain::reports::csv::PAYMENT_COLUMNS);
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap_or_default()).collect();
    assert_eq!(rows.len(), 3);
    let first = rows
        .iter()
        .find(|r| &r[0] == ids[0].as_str())
        .unwrap_or_else(|| panic!("{csv}"));
    assert_eq!((&first[3], &first[4]), ("150050", "1500.50"));
    assert_eq!(&first[2], "khalti");

    // The list, newest first, holds it; another tenant sees nothing.
    let list = app.get("/v1/reports", Some(&key)).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["data"][0]["id"], id.as_str(), "{}", list.body);
    let other = app.tenant("Ram's Shop", "ram@example.com").await;
    let theirs = app.key(&other, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let a = app.get(&format!("/v1/reports/{id}"), Some(&theirs)).await;
    assert_eq!(a.status, 404, "{}", a.body);
    let a = app.get("/v1/reports", Some(&theirs)).await;
    assert_eq!(a.body["data"], json!([]), "{}", a.body);
    // Refunds need refunds:read as well.
    let a = post(
        &app,
        &theirs,
        json!({"type": "refunds", "from": from, "to": to}),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.body);

    if which == Which::Embedded {
        // A forged link, then the real one past its expiry: refused.
        let forged = format!("{}0", url.trim_end_matches(|c: char| c.is_ascii_hexdigit()));
        let (status, body) = download(&app, &forged).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("download_link_invalid"), "{body}");
        clock.advance(chrono::Duration::minutes(16));
        let (status, body) = download(&app, &url).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("download_link_expired"), "{body}");
        // A fresh GET gives a fresh link that works.
        let again = app.get(&format!("/v1/reports/{id}"), Some(&key)).await;
        let fresh = again.body["downloadUrl"].as_str().unwrap_or_default();
        let (status, body) = download(&app, fresh).await;
        assert_eq!(status, 200, "{body}");
    }
    app.stop().await;
}

on_both_backends!(a_payments_export_runs_and_downloads);
