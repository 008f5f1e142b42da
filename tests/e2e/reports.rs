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
use shared::domain::payments::Payment;
use shared::domain::record::Changes;
use shared::domain::{Mode, Provider};
use shared::money::Paisa;
use shared::store::{Cond, Item, Key, Query, QueryPage, SkCond, Store, StoreError, TxOp, Update};
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
            json!({"type": "settlements", "from": from, "to": to}),
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

on_both_backends!(
    a_payments_export_runs_and_downloads,
    exports_are_bounded_and_carry_fees_and_invoices
);

/// The store as the gateway uses it, with every export's read of the
/// payments index held until `gate` is closed (opened).
struct HeldExports {
    inner: Arc<dyn Store>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl Store for HeldExports {
    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    fn single_process(&self) -> bool {
        self.inner.single_process()
    }

    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        self.inner.get(key).await
    }

    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError> {
        self.inner.put(item, cond).await
    }

    async fn update(
        &self,
        key: &Key,
        update: Update,
        cond: Option<Cond>,
    ) -> Result<Item, StoreError> {
        self.inner.update(key, update, cond).await
    }

    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError> {
        self.inner.delete(key, cond).await
    }

    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
        self.inner.transact(ops).await
    }

    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError> {
        if query.pk.ends_with("#PAY") && matches!(query.sk, SkCond::Between(..)) {
            // Closed: open for good.
            let _ = self.gate.acquire().await;
        }
        self.inner.query(query).await
    }

    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        self.inner.count(query).await
    }
}

/// A project's unfinished reports are bounded: the sixth while five wait
/// is a 409 `too_many_reports`; once they end, the next starts. Every
/// one of them ends (one at a time for the project). The payments CSV
/// carries a payment's fee and net; a billing invoices export has its
/// columns and needs `billing:read`.
async fn exports_are_bounded_and_carry_fees_and_invoices(which: Which) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let wrap = move |inner: Arc<dyn Store>| -> Arc<dyn Store> {
        Arc::new(HeldExports { inner, gate: held })
    };
    let Some(app) = spawn_app_with_clock(which, wrap, Arc::new(SystemClock)).await else {
        return;
    };
    let tenant = app.tenant("Sita's Shop", "sita@example.com").await;
    let key = app
        .key(
            &tenant,
            Mode::Sandbox,
            &[Scope::PaymentsRead, Scope::RefundsRead, Scope::BillingRead],
        )
        .await;
    let paid = app
        .payment(&tenant, Mode::Sandbox, 100_000, Provider::Khalti)
        .await;
    let fee = Changes::<Payment>::new().set_some(
        Payment::FEE_PROVIDER,
        &Paisa::new(2_950).unwrap_or(Paisa::ZERO),
    );
    let op = TxOp::Update {
        key: Payment::key(&paid.id),
        update: fee.into(),
        cond: None,
    };
    if let Err(e) = app.store.transact(vec![op]).await {
        panic!("fee: {e}");
    }
    let now = SystemClock.now();
    let from = now.plus(chrono::Duration::hours(-1)).to_rfc3339();
    let to = now.plus(chrono::Duration::hours(1)).to_rfc3339();
    let body = json!({"type": "payments", "from": from, "to": to});

    let mut ids = Vec::new();
    for _ in 0..5 {
        let a = post(&app, &key, body.clone()).await;
        assert_eq!(a.status, 201, "{}", a.body);
        ids.push(a.body["id"].as_str().unwrap_or_default().to_owned());
    }
    let a = post(&app, &key, body.clone()).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "too_many_reports", "{}", a.body);
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("5 reports pending or running"),
        "{message}"
    );
    // Another project is not held back by this one's.
    let other = app.tenant("Ram's Shop", "ram@example.com").await;
    let theirs = app.key(&other, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let a = post(&app, &theirs, body.clone()).await;
    assert_eq!(a.status, 201, "{}", a.body);

    gate.close();
    let mut last = Value::Null;
    for id in &ids {
        last = ready(&app, &key, id).await;
        assert_eq!(last["rows"], 1, "{last}");
    }
    let url = last["downloadUrl"].as_str().unwrap_or_default().to_owned();
    let (status, csv) = download(&app, &url).await;
    assert_eq!(status, 200, "{csv}");
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .map(|h| h.iter().map(str::to_owned).collect())
        .unwrap_or_default();
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap_or_default()).collect();
    let at = |column: &str| {
        header
            .iter()
            .position(|h| h == column)
            .unwrap_or(usize::MAX)
    };
    let got: Vec<&str> = ["fee_paisa", "fee_npr", "net_paisa", "net_npr", "fee_source"]
        .iter()
        .map(|c| rows[0].get(at(c)).unwrap_or("?"))
        .collect();
    assert_eq!(
        got,
        ["2950", "29.50", "97050", "970.50", "provider"],
        "{csv}"
    );
    // Room again.
    let a = post(&app, &key, body).await;
    assert_eq!(a.status, 201, "{}", a.body);

    // Billing invoices: its columns; billing:read needed.
    let invoices = json!({"type": "billing_invoices", "from": from, "to": to});
    let a = post(&app, &theirs, invoices.clone()).await;
    assert_eq!(a.status, 403, "{}", a.body);
    let a = post(&app, &key, invoices).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["type"], "billing_invoices", "{}", a.body);
    let id = a.body["id"].as_str().unwrap_or_default().to_owned();
    let report = ready(&app, &key, &id).await;
    assert_eq!(report["rows"], 0, "{report}");
    let url = report["downloadUrl"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (status, csv) = download(&app, &url).await;
    assert_eq!(status, 200, "{csv}");
    let header = csv.lines().next().unwrap_or_default();
    assert_eq!(
        header,
        shared::domain::reports::csv::INVOICE_COLUMNS.join(",")
    );
    app.stop().await;
}
