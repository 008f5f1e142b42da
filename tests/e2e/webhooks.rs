//! Webhooks end to end over HTTP, on both backends: endpoints registered
//! through `/v1/webhooks`, events written to the outbox (by a real payment
//! through the hosted pages and the Khalti simulator, or directly as the
//! domain writes them), fanned out and delivered by the gateway's poller
//! and worker to a real HTTP receiver on 127.0.0.1.
//!
//! The receiver records every request (headers, raw body, arrival time)
//! and verifies the signature of every delivery with the endpoint's
//! signing secret (`shared::webhooks::signature::verify`); each test
//! asserts that none failed. It can be told to answer 500 to its first N
//! requests (or to every one), to hang past the gateway's 2 s timeout, and
//! to hold a request until the test has looked at the delivery log.
//!
//! The gateway runs the test schedule (`test_webhook_settings`): 8 retries
//! 300 ms apart (whole seconds on SQS), a 2 s receiver timeout, a 3 s
//! claim and a 4 s queue visibility.
//!
//! Every wait is bounded: polls ask every 50 ms and give up at a deadline.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use dhukuti_tests::browser::{form, text};
use dhukuti_tests::shop::{self, RETURN_URL};
use dhukuti_tests::{
    Answer, Tenant, TestApp, Which, on_both_backends, send, spawn_app, spawn_app_wrapped,
};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::outbox::{Event, EventType};
use shared::domain::webhooks::DeliveryMessage;
use shared::ids::{IdKind, new_id};
use shared::queue::QueueName;
use shared::store::{Cond, Item, Key, Query, QueryPage, Store, StoreError, TxOp, Update};
use shared::time::{Clock, SystemClock};
use shared::webhooks::signature::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// How often a poll asks.
const POLL: Duration = Duration::from_millis(50);
/// How long a poll waits for a condition by default.
const DEADLINE: Duration = Duration::from_secs(15);
/// How long a hanging receiver sleeps: past the gateway's 2 s timeout.
const HANG: Duration = Duration::from_millis(3500);
/// How long a held request waits for the test at most (under the 2 s
/// timeout, so that a test that never releases it sees a normal answer).
const HOLD: Duration = Duration::from_millis(1500);
/// The extra wait after the expected deliveries arrived, before asserting
/// that nothing more came: longer than one retry interval (1 s on SQS).
const QUIET: Duration = Duration::from_millis(1500);
/// Number of retries of the test schedule.
const RETRIES: usize = 8;

// ---------------------------------------------------------------------------
// Polling

/// Calls `probe` every [`POLL`] until it answers `Ok`, for at most
/// `deadline`; panics with the last `Err` (what was seen) otherwise.
async fn eventually_within<T>(
    what: &str,
    deadline: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let until = Instant::now() + deadline;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(seen) => {
                if Instant::now() >= until {
                    panic!("gave up after {deadline:?} waiting for {what}; last seen: {seen}");
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually_within`] the default [`DEADLINE`].
async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Result<T, String>) -> T {
    eventually_within(what, DEADLINE, probe).await
}

// ---------------------------------------------------------------------------
// The receiver

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Hit {
    headers: HeaderMap,
    body: Vec<u8>,
    /// The body as JSON (`Null` when it is not JSON).
    json: Value,
    /// Arrival, on the test's monotonic clock and in unix seconds.
    at: Instant,
    unix: i64,
}

impl Hit {
    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    fn event_id(&self) -> String {
        text(&self.json["id"])
    }

    fn event_type(&self) -> String {
        text(&self.json["type"])
    }
}

/// What the receiver answers.
#[derive(Default)]
struct Behaviour {
    /// 500 to the first this many requests.
    fail_first: usize,
    /// 500 to every request.
    always_fail: bool,
    /// Sleeps [`HANG`] before answering the first this many requests.
    hang_first: usize,
    /// Holds request number `hold` (1-based) until [`Receiver::release`]
    /// (at most [`HOLD`]).
    hold: Option<usize>,
    /// The status of a success (200 when unset).
    ok_status: Option<u16>,
}

struct Shared {
    behaviour: Behaviour,
    /// The endpoint's signing secret, once registered.
    secret: Mutex<Option<String>>,
    hits: Mutex<Vec<Hit>>,
    /// Every delivery whose signature did not verify, and why.
    bad: Mutex<Vec<String>>,
    released: AtomicBool,
    /// Whether a held request was released by the test (not by [`HOLD`]).
    released_in_time: AtomicBool,
    served: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A webhook receiver on 127.0.0.1; stops when dropped.
struct Receiver {
    url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The test receiver's answer body for `status` (the delivery log keeps
/// its first KB).
fn answer_for(status: u16) -> String {
    format!("test receiver says {status}: {}", "x".repeat(2000))
}

async fn receive(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let now = SystemClock.now().unix_seconds();
    let hit = Hit {
        headers: headers.clone(),
        body: body.to_vec(),
        json: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
        unix: now,
    };
    let n = {
        let mut hits = lock(&s.hits);
        hits.push(hit);
        hits.len()
    };
    // Every delivery must verify against the endpoint's secret.
    let header = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let secret = lock(&s.secret).clone();
    let verdict = match secret {
        None => Err("no secret registered yet".to_owned()),
        Some(secret) => signature::verify(header, &body, &[secret.as_str()], now)
            .map_err(|e| format!("{e} (header {header:?})")),
    };
    if let Err(why) = verdict {
        lock(&s.bad).push(format!("request {n}: {why}"));
    }
    let b = &s.behaviour;
    if n <= b.hang_first {
        tokio::time::sleep(HANG).await;
    }
    if b.hold == Some(n) {
        let until = Instant::now() + HOLD;
        while !s.released.load(Ordering::SeqCst) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        s.released_in_time
            .store(s.released.load(Ordering::SeqCst), Ordering::SeqCst);
    }
    s.served.fetch_add(1, Ordering::SeqCst);
    let status = if b.always_fail || n <= b.fail_first {
        500
    } else {
        b.ok_status.unwrap_or(200)
    };
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        answer_for(status),
    )
}

impl Receiver {
    async fn start(behaviour: Behaviour) -> Receiver {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("receiver bind: {e}"),
        };
        let port = match listener.local_addr() {
            Ok(a) => a.port(),
            Err(e) => panic!("receiver address: {e}"),
        };
        let shared = Arc::new(Shared {
            behaviour,
            secret: Mutex::new(None),
            hits: Mutex::new(Vec::new()),
            bad: Mutex::new(Vec::new()),
            released: AtomicBool::new(false),
            released_in_time: AtomicBool::new(false),
            served: AtomicUsize::new(0),
        });
        let router = axum::Router::new()
            .fallback(receive)
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                panic!("receiver: {e}");
            }
        });
        Receiver {
            url: format!("http://127.0.0.1:{port}/hooks"),
            shared,
            task,
        }
    }

    async fn ok() -> Receiver {
        Receiver::start(Behaviour::default()).await
    }

    fn set_secret(&self, secret: &str) {
        *lock(&self.shared.secret) = Some(secret.to_owned());
    }

    fn secret(&self) -> String {
        match lock(&self.shared.secret).clone() {
            Some(s) => s,
            None => panic!("the receiver has no secret"),
        }
    }

    fn hits(&self) -> Vec<Hit> {
        lock(&self.shared.hits).clone()
    }

    fn count(&self) -> usize {
        lock(&self.shared.hits).len()
    }

    fn release(&self) {
        self.shared.released.store(true, Ordering::SeqCst);
    }

    /// Asserts that every delivery so far verified.
    fn assert_all_signed(&self) {
        let bad = lock(&self.shared.bad).clone();
        assert!(bad.is_empty(), "deliveries that did not verify: {bad:?}");
    }

    /// Waits until at least `n` requests arrived; answers them all.
    async fn wait_for(&self, n: usize) -> Vec<Hit> {
        self.wait_for_within(n, DEADLINE).await
    }

    async fn wait_for_within(&self, n: usize, deadline: Duration) -> Vec<Hit> {
        eventually_within(
            &format!("{n} requests at the receiver"),
            deadline,
            async || {
                let hits = self.hits();
                if hits.len() >= n {
                    Ok(hits)
                } else {
                    Err(format!("{} requests: {:?}", hits.len(), ids_of(&hits)))
                }
            },
        )
        .await
    }
}

fn ids_of(hits: &[Hit]) -> Vec<(String, String)> {
    hits.iter()
        .map(|h| (h.event_type(), h.event_id()))
        .collect()
}

// ---------------------------------------------------------------------------
// The merchant, through the API (and the domain, for events)

struct Merchant {
    app: TestApp,
    tenant: Tenant,
    /// Sandbox, every scope.
    key: String,
}

impl Merchant {
    async fn on(app: TestApp) -> Merchant {
        let tenant = app.tenant("Hook Pasal", "owner@hook.example").await;
        let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
        Merchant { app, tenant, key }
    }

    async fn open(which: Which) -> Option<Merchant> {
        Some(Merchant::on(spawn_app(which).await?).await)
    }

    async fn stop(self) {
        self.app.stop().await;
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> Answer {
        self.app.post(path, Some(key), None, body).await
    }

    async fn get(&self, path: &str, key: &str) -> Answer {
        self.app.get(path, Some(key)).await
    }

    async fn patch(&self, path: &str, key: &str, body: &Value) -> Answer {
        let req = self
            .app
            .client
            .patch(self.app.url(path))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body.to_string());
        send(req).await
    }

    async fn delete(&self, path: &str, key: &str) -> Answer {
        send(self.app.client.delete(self.app.url(path)).bearer_auth(key)).await
    }

    /// Registers `rx` (201), gives it the signing secret; the endpoint as
    /// answered.
    async fn register(&self, rx: &Receiver, events: Option<&[&str]>) -> Value {
        let mut body = json!({ "url": rx.url });
        if let Some(events) = events {
            body["events"] = json!(events);
        }
        let a = self.post("/v1/webhooks", &self.key, &body).await;
        assert_eq!(a.status, 201, "{}", a.body);
        let secret = text(&a.body["signing_secret"]);
        assert_secret(&secret);
        rx.set_secret(&secret);
        a.body
    }

    /// Writes an event as the domain does (in a transaction of its own).
    async fn record(&self, t: EventType, object: Value) -> Event {
        let event = Event::new(
            t,
            &shared::domain::Tenant::new(self.tenant.project.id.clone(), Mode::Sandbox),
            object,
            SystemClock.now(),
        );
        let ops = match event.put_ops() {
            Ok(ops) => ops,
            Err(e) => panic!("event op: {e}"),
        };
        if let Err(e) = self.app.store.transact(ops).await {
            panic!("event write: {e}");
        }
        event
    }

    /// A `payment.*`-shaped event about a new payment id: the event and
    /// the payment id.
    async fn record_payment_event(&self, t: EventType) -> (Event, String) {
        let pay = new_id(IdKind::Payment);
        let object = json!({
            "id": pay, "object": "payment", "amount": 150000, "currency": "NPR",
            "status": "success", "livemode": false,
        });
        (self.record(t, object).await, pay)
    }

    /// `GET /v1/webhooks/{id}/deliveries` (200): its `data`.
    async fn deliveries(&self, endpoint: &str) -> Vec<Value> {
        let a = self
            .get(&format!("/v1/webhooks/{endpoint}/deliveries"), &self.key)
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        match a.body["data"].as_array() {
            Some(d) => d.clone(),
            None => panic!("no data: {}", a.body),
        }
    }

    /// The delivery of `event` to `endpoint` in the log, if listed.
    async fn delivery(&self, endpoint: &str, event: &str) -> Option<Value> {
        self.deliveries(endpoint)
            .await
            .into_iter()
            .find(|d| d["eventId"] == event)
    }

    /// Waits until the delivery of `event` to `endpoint` has `status`.
    async fn delivery_with_status(&self, endpoint: &str, event: &str, status: &str) -> Value {
        self.delivery_with_status_within(endpoint, event, status, DEADLINE)
            .await
    }

    async fn delivery_with_status_within(
        &self,
        endpoint: &str,
        event: &str,
        status: &str,
        deadline: Duration,
    ) -> Value {
        eventually_within(
            &format!("the delivery of {event} to be {status}"),
            deadline,
            async || match self.delivery(endpoint, event).await {
                Some(d) if d["status"] == status => Ok(d),
                other => Err(format!("{other:?}")),
            },
        )
        .await
    }
}

/// `whsec_` and 64 lowercase hex digits.
fn assert_secret(secret: &str) {
    let hex = secret.strip_prefix("whsec_").unwrap_or_default();
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "signing secret {secret:?}"
    );
}

fn keys_of(v: &Value) -> Vec<String> {
    let mut keys: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------
// 1. Registration and management

async fn endpoints_are_registered_listed_patched_and_deleted(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let live = m.app.key(&m.tenant, Mode::Live, &Scope::ALL).await;
    let read_only = m
        .app
        .key(&m.tenant, Mode::Sandbox, &[Scope::WebhooksRead])
        .await;
    let no_webhooks = m
        .app
        .key(&m.tenant, Mode::Sandbox, &[Scope::PaymentsRead])
        .await;
    let url = "http://127.0.0.1:9/hooks";

    // Registration: the secret is in this answer only.
    let created = m.post("/v1/webhooks", &m.key, &json!({"url": url})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let e = &created.body;
    let id = text(&e["id"]);
    assert!(shared::ids::is_valid(&id, IdKind::WebhookEndpoint), "{e}");
    assert_eq!(e["object"], "webhook_endpoint", "{e}");
    assert_eq!(e["livemode"], false, "{e}");
    assert_eq!(e["url"], url, "{e}");
    assert_eq!(e["events"], json!([]), "events omitted = every event: {e}");
    assert_eq!(e["enabled"], true, "{e}");
    assert!(
        e["createdAt"].is_string() && e["updatedAt"].is_string(),
        "{e}"
    );
    assert_eq!(
        keys_of(e),
        sorted(&[
            "id",
            "object",
            "livemode",
            "url",
            "events",
            "enabled",
            "createdAt",
            "updatedAt",
            "signing_secret",
        ])
    );
    let secret = text(&e["signing_secret"]);
    assert_secret(&secret);

    // GET and the list never show it.
    let got = m.get(&format!("/v1/webhooks/{id}"), &m.key).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let mut without_secret = e.clone();
    if let Some(o) = without_secret.as_object_mut() {
        o.remove("signing_secret");
    }
    assert_eq!(got.body, without_secret);
    let read = m.get(&format!("/v1/webhooks/{id}"), &read_only).await;
    assert_eq!(read.status, 200, "a read key reads: {}", read.body);
    let list = m.get("/v1/webhooks", &m.key).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(keys_of(&list.body), vec!["data"], "{}", list.body);
    assert_eq!(list.body["data"], json!([without_secret]));
    assert!(!list.body.to_string().contains("whsec_"), "{}", list.body);

    // A retried registration under one Idempotency-Key: one endpoint, and
    // the replay leaves the secret out.
    let body = json!({"url": url, "events": ["payment.failed", "refund.succeeded"]});
    let first = m
        .app
        .post("/v1/webhooks", Some(&m.key), Some("register-1"), &body)
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_ne!(first.header("idempotent-replayed"), "true");
    let first_secret = text(&first.body["signing_secret"]);
    assert_secret(&first_secret);
    assert_ne!(first_secret, secret, "every endpoint has its own secret");
    assert_eq!(
        first.body["events"],
        json!(["payment.failed", "refund.succeeded"])
    );
    let again = m
        .app
        .post("/v1/webhooks", Some(&m.key), Some("register-1"), &body)
        .await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(again.body["id"], first.body["id"], "{}", again.body);
    assert!(
        again.body.get("signing_secret").is_none() && !again.body.to_string().contains("whsec_"),
        "a replay shows no secret: {}",
        again.body
    );
    let listed = m.get("/v1/webhooks", &m.key).await;
    assert_eq!(
        listed.body["data"].as_array().map(Vec::len),
        Some(2),
        "{}",
        listed.body
    );

    // Refused receivers.
    for bad in [
        "http://example.com",
        "https://10.0.0.1/x",
        "https://169.254.169.254/latest",
        "https://[::1]/x",
        "https://localhost/x",
        "https://metadata.google.internal/computeMetadata/v1/",
        "https://intranet/hooks",
    ] {
        let a = m.post("/v1/webhooks", &m.key, &json!({"url": bad})).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], "url", "{bad}: {}", a.body);
    }
    // A host whose DNS is not set up yet is accepted (the delivery
    // client checks what it resolves to at connect time).
    let later = m
        .post(
            "/v1/webhooks",
            &m.key,
            &json!({"url": "https://hooks.not-live-yet.example/dhukuti"}),
        )
        .await;
    assert_eq!(later.status, 201, "{}", later.body);
    m.delete(&format!("/v1/webhooks/{}", text(&later.body["id"])), &m.key)
        .await;
    // Local http is for sandbox keys only.
    let a = m.post("/v1/webhooks", &live, &json!({"url": url})).await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "url", "{}", a.body);
    // Unknown event names.
    let a = m
        .post(
            "/v1/webhooks",
            &m.key,
            &json!({"url": url, "events": ["payment.failed", "payment.success"]}),
        )
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "events", "{}", a.body);
    // Scopes.
    m.post("/v1/webhooks", &read_only, &json!({"url": url}))
        .await
        .assert_error(403, "permission_error", "missing_scope");
    m.get("/v1/webhooks", &no_webhooks).await.assert_error(
        403,
        "permission_error",
        "missing_scope",
    );
    m.patch(
        &format!("/v1/webhooks/{id}"),
        &read_only,
        &json!({"enabled": false}),
    )
    .await
    .assert_error(403, "permission_error", "missing_scope");
    m.delete(&format!("/v1/webhooks/{id}"), &read_only)
        .await
        .assert_error(403, "permission_error", "missing_scope");
    // Nothing refused was created.
    let listed = m.get("/v1/webhooks", &m.key).await;
    assert_eq!(listed.body["data"].as_array().map(Vec::len), Some(2));

    // The other mode does not see the sandbox endpoint.
    m.get(&format!("/v1/webhooks/{id}"), &live)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    m.patch(
        &format!("/v1/webhooks/{id}"),
        &live,
        &json!({"enabled": false}),
    )
    .await
    .assert_error(404, "invalid_request_error", "not_found");
    m.delete(&format!("/v1/webhooks/{id}"), &live)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    let live_list = m.get("/v1/webhooks", &live).await;
    assert_eq!(live_list.body, json!({"data": []}));

    // PATCH changes only the keys sent.
    let path = format!("/v1/webhooks/{id}");
    let p = m.patch(&path, &m.key, &json!({"enabled": false})).await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["enabled"], false, "{}", p.body);
    assert_eq!(p.body["url"], url);
    assert_eq!(p.body["events"], json!([]));
    assert_eq!(p.body["createdAt"], e["createdAt"]);
    assert!(p.body.get("signing_secret").is_none(), "{}", p.body);
    let p = m
        .patch(&path, &m.key, &json!({"events": ["payment.failed"]}))
        .await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["events"], json!(["payment.failed"]));
    assert_eq!(p.body["enabled"], false, "{}", p.body);
    assert_eq!(p.body["url"], url);
    let other = "http://127.0.0.1:10/other";
    let p = m.patch(&path, &m.key, &json!({"url": other})).await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["url"], other);
    assert_eq!(p.body["events"], json!(["payment.failed"]));
    assert_eq!(p.body["enabled"], false);
    // A refused PATCH changes nothing.
    let bad = m
        .patch(&path, &m.key, &json!({"events": ["nope"], "enabled": true}))
        .await;
    bad.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(bad.body["error"]["param"], "events", "{}", bad.body);
    let bad = m
        .patch(&path, &m.key, &json!({"url": "https://10.0.0.1/x"}))
        .await;
    assert_eq!(bad.body["error"]["param"], "url", "{}", bad.body);
    let now = m.get(&path, &m.key).await;
    assert_eq!(now.body, p.body, "refused PATCHes left it as it was");

    // DELETE, then it is gone.
    let d = m.delete(&path, &m.key).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body, json!({"deleted": true, "id": id}));
    m.get(&path, &m.key)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    m.delete(&path, &m.key)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    let listed = m.get("/v1/webhooks", &m.key).await;
    let ids: Vec<String> = listed.body["data"]
        .as_array()
        .map(|d| d.iter().map(|e| text(&e["id"])).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![text(&first.body["id"])]);
    m.get("/v1/webhooks/we_nope", &m.key).await.assert_error(
        404,
        "invalid_request_error",
        "not_found",
    );
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 2. A signed delivery

async fn an_event_is_delivered_once_and_signed(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::start(Behaviour {
        ok_status: Some(204),
        ..Behaviour::default()
    })
    .await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let (event, pay) = m.record_payment_event(EventType::PaymentSucceeded).await;

    let hits = rx.wait_for(1).await;
    let d = m
        .delivery_with_status(&endpoint, &event.id, "success")
        .await;
    let hit = &hits[0];

    // The headers.
    assert!(
        hit.header("content-type").starts_with("application/json"),
        "{:?}",
        hit.headers
    );
    let sig = hit.header(SIGNATURE_HEADER);
    let (t, v1) = match signature::parse(&sig) {
        Ok(p) => p,
        Err(e) => panic!("signature header {sig:?}: {e}"),
    };
    assert_eq!(v1.len(), 1, "{sig}");
    assert_eq!(hit.header(TIMESTAMP_HEADER), t.to_string(), "{sig}");
    assert!((hit.unix - t).abs() <= 5, "t={t}, arrived at {}", hit.unix);
    let secret = rx.secret();
    assert_eq!(
        signature::verify(&sig, &hit.body, &[secret.as_str()], hit.unix),
        Ok(())
    );
    // The check is not vacuous: another secret or another body fails.
    assert!(signature::verify(&sig, &hit.body, &["whsec_other"], hit.unix).is_err());
    let mut tampered = hit.body.clone();
    tampered.push(b' ');
    assert!(signature::verify(&sig, &tampered, &[secret.as_str()], hit.unix).is_err());

    // The body.
    let body = &hit.json;
    assert_eq!(
        keys_of(body),
        sorted(&["id", "type", "created", "livemode", "data"]),
        "{body}"
    );
    assert_eq!(body["id"], event.id.as_str());
    assert_eq!(body["type"], "payment.succeeded");
    assert_eq!(body["created"], event.created_at.unix_seconds());
    assert_eq!(body["livemode"], false);
    assert_eq!(body["data"]["object"], event.object);
    // The main fields, flat beside the object, as plugins read them.
    assert_eq!(body["data"]["id"], event.object["id"]);
    assert_eq!(body["data"]["amount"], event.object["amount"]);
    assert_eq!(body["data"]["currency"], "NPR");
    assert_eq!(body["data"]["status"], event.object["status"]);
    assert_eq!(body["data"]["object"]["id"], pay);

    // The log.
    assert_eq!(d["object"], "webhook_delivery", "{d}");
    assert!(
        shared::ids::is_valid(&text(&d["id"]), IdKind::WebhookDelivery),
        "{d}"
    );
    assert_eq!(d["webhookEndpointId"], endpoint, "{d}");
    assert_eq!(d["eventType"], "payment.succeeded", "{d}");
    assert_eq!(d["paymentId"], pay, "{d}");
    assert_eq!(d["attempts"], 1, "{d}");
    assert_eq!(d["responseStatus"], 204, "{d}");
    assert_eq!(d["lastError"], Value::Null, "{d}");
    assert_eq!(d["nextAttemptAt"], Value::Null, "{d}");
    assert!(
        d["lastAttemptAt"].is_string() && d["createdAt"].is_string(),
        "{d}"
    );
    assert_eq!(d["livemode"], false, "{d}");
    // What was sent, and the first KB of what the receiver said (a 204
    // has no body).
    assert_eq!(d["payload"], hit.json, "{d}");
    let said = answer_for(204);
    let expected = if d["responseStatus"] == 204 {
        ""
    } else {
        &said[..1024]
    };
    assert_eq!(d["responseBody"], expected, "{d}");
    assert_eq!(
        keys_of(&d),
        sorted(&[
            "id",
            "object",
            "webhookEndpointId",
            "eventId",
            "paymentId",
            "eventType",
            "status",
            "attempts",
            "responseStatus",
            "responseBody",
            "payload",
            "lastAttemptAt",
            "createdAt",
            "livemode",
        ])
    );

    // Once.
    tokio::time::sleep(QUIET).await;
    assert_eq!(rx.count(), 1, "{:?}", ids_of(&rx.hits()));
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 3. Failures, then a success

async fn a_failing_receiver_gets_retries_until_it_answers(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    const N: usize = 3;
    // 500 three times; the second attempt is held until the test has seen
    // the first failure in the log.
    let rx = Receiver::start(Behaviour {
        fail_first: N,
        hold: Some(2),
        ..Behaviour::default()
    })
    .await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let (event, _) = m.record_payment_event(EventType::PaymentFailed).await;

    let retrying = eventually("the first attempt in the log", async || {
        match m.delivery(&endpoint, &event.id).await {
            Some(d) if d["attempts"].as_u64().unwrap_or(0) >= 1 => Ok(d),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    rx.release();
    assert_eq!(retrying["status"], "retrying", "{retrying}");
    assert_eq!(retrying["attempts"], 1, "{retrying}");
    assert_eq!(retrying["responseStatus"], 500, "{retrying}");
    assert_eq!(
        retrying["responseBody"],
        answer_for(500)[..1024],
        "{retrying}"
    );
    assert!(retrying["payload"]["id"] == event.id.as_str(), "{retrying}");
    assert!(text(&retrying["lastError"]).contains("500"), "{retrying}");
    assert!(retrying["nextAttemptAt"].is_string(), "{retrying}");

    let d = m
        .delivery_with_status(&endpoint, &event.id, "success")
        .await;
    assert!(
        rx.shared.released_in_time.load(Ordering::SeqCst),
        "the held attempt was released by the test"
    );
    assert_eq!(d["attempts"], N + 1, "{d}");
    assert_eq!(d["responseStatus"], 200, "{d}");
    assert_eq!(d["lastError"], Value::Null, "{d}");
    assert_eq!(d["nextAttemptAt"], Value::Null, "{d}");

    // Exactly N + 1 requests, one event, the schedule's wait between them,
    // and nothing after the success.
    tokio::time::sleep(QUIET).await;
    let hits = rx.hits();
    assert_eq!(hits.len(), N + 1, "{:?}", ids_of(&hits));
    assert!(
        hits.iter().all(|h| h.event_id() == event.id),
        "{:?}",
        ids_of(&hits)
    );
    for pair in hits.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= Duration::from_millis(250), "retried after {gap:?}");
    }
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 4. A receiver that always fails

async fn a_delivery_fails_after_the_last_retry(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::start(Behaviour {
        always_fail: true,
        ..Behaviour::default()
    })
    .await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let (event, _) = m.record_payment_event(EventType::PaymentCancelled).await;

    let d = m
        .delivery_with_status_within(&endpoint, &event.id, "failed", Duration::from_secs(25))
        .await;
    assert_eq!(d["attempts"], RETRIES + 1, "{d}");
    assert_eq!(d["responseStatus"], 500, "{d}");
    assert_eq!(d["nextAttemptAt"], Value::Null, "{d}");
    assert!(text(&d["lastError"]).contains("500"), "{d}");

    tokio::time::sleep(QUIET).await;
    let hits = rx.hits();
    assert_eq!(hits.len(), RETRIES + 1, "{:?}", ids_of(&hits));
    assert!(hits.iter().all(|h| h.event_id() == event.id));
    let after = m.delivery(&endpoint, &event.id).await;
    assert_eq!(after.as_ref(), Some(&d), "a failed delivery stays failed");
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 5. A receiver that does not answer in time

async fn a_receiver_timeout_is_a_failed_attempt_then_retried(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::start(Behaviour {
        hang_first: 1,
        hold: Some(2),
        ..Behaviour::default()
    })
    .await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let (event, _) = m.record_payment_event(EventType::PaymentSucceeded).await;

    let first = eventually("the timed-out attempt in the log", async || {
        match m.delivery(&endpoint, &event.id).await {
            Some(d) if d["attempts"].as_u64().unwrap_or(0) >= 1 => Ok(d),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    rx.release();
    assert_eq!(first["status"], "retrying", "{first}");
    assert_eq!(first["attempts"], 1, "{first}");
    assert_eq!(first["responseStatus"], Value::Null, "{first}");
    assert!(text(&first["lastError"]).contains("no answer"), "{first}");

    let d = m
        .delivery_with_status(&endpoint, &event.id, "success")
        .await;
    assert!(rx.shared.released_in_time.load(Ordering::SeqCst));
    assert_eq!(d["attempts"], 2, "{d}");
    assert_eq!(d["responseStatus"], 200, "{d}");
    assert_eq!(d["lastError"], Value::Null, "{d}");
    let hits = rx.hits();
    assert_eq!(hits.len(), 2, "{:?}", ids_of(&hits));
    assert!(hits.iter().all(|h| h.event_id() == event.id));
    // The second attempt came after the 2 s timeout.
    let gap = hits[1].at.duration_since(hits[0].at);
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}");
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 6. Event filters, disabled and deleted endpoints

async fn endpoints_get_the_events_they_subscribed_to(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let (a, b, off, gone) = (
        Receiver::ok().await,
        Receiver::ok().await,
        Receiver::ok().await,
        Receiver::ok().await,
    );
    let a_id = text(&m.register(&a, Some(&["payment.failed"])).await["id"]);
    let b_id = text(&m.register(&b, Some(&[])).await["id"]);
    let off_id = text(&m.register(&off, None).await["id"]);
    let gone_id = text(&m.register(&gone, None).await["id"]);
    let p = m
        .patch(
            &format!("/v1/webhooks/{off_id}"),
            &m.key,
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(p.status, 200, "{}", p.body);
    let d = m.delete(&format!("/v1/webhooks/{gone_id}"), &m.key).await;
    assert_eq!(d.status, 200, "{}", d.body);

    let mut events = Vec::new();
    for t in EventType::ALL {
        events.push(m.record_payment_event(t).await.0);
    }
    let every: Vec<String> = EventType::ALL
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
    eventually("every event type at B", async || {
        let mut types: Vec<String> = b.hits().iter().map(Hit::event_type).collect();
        types.sort();
        types.dedup();
        let mut want = every.clone();
        want.sort();
        if types == want {
            Ok(())
        } else {
            Err(format!("{types:?}"))
        }
    })
    .await;
    a.wait_for(1).await;
    tokio::time::sleep(QUIET).await;

    let b_hits = b.hits();
    assert_eq!(b_hits.len(), EventType::ALL.len(), "{:?}", ids_of(&b_hits));
    let mut b_ids: Vec<String> = b_hits.iter().map(Hit::event_id).collect();
    b_ids.sort();
    let mut want_ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
    want_ids.sort();
    assert_eq!(b_ids, want_ids);
    let a_hits = a.hits();
    assert_eq!(
        ids_of(&a_hits),
        vec![("payment.failed".to_owned(), events[1].id.to_string())],
        "A wants payment.failed only"
    );
    assert_eq!(off.count(), 0, "{:?}", ids_of(&off.hits()));
    assert_eq!(gone.count(), 0, "{:?}", ids_of(&gone.hits()));
    // No delivery was even created for the disabled endpoint.
    assert_eq!(m.deliveries(&off_id).await, Vec::<Value>::new());
    let b_log = m.deliveries(&b_id).await;
    assert_eq!(b_log.len(), EventType::ALL.len());
    assert!(b_log.iter().all(|d| d["status"] == "success"), "{b_log:?}");
    let a_log = m.deliveries(&a_id).await;
    assert_eq!(a_log.len(), 1, "{a_log:?}");
    assert_eq!(a_log[0]["eventType"], "payment.failed");
    for rx in [&a, &b, &off, &gone] {
        rx.assert_all_signed();
    }
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 7. A crash between the send and the log

/// Fails the first write of an attempt's outcome (`update` of a delivery,
/// `WHD#...`, setting `attempts`) without applying it: what a process that
/// died right after the receiver answered leaves behind.
struct CrashAfterSend {
    inner: Arc<dyn Store>,
    crashed: AtomicUsize,
}

type StoreFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StoreError>> + Send + 'a>>;

// `Store` is an `#[async_trait]` trait; this crate has no `async-trait`,
// so its methods are written as the macro expands them.
impl Store for CrashAfterSend {
    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    fn get<'life0, 'life1, 'async_trait>(
        &'life0 self,
        key: &'life1 Key,
    ) -> StoreFuture<'async_trait, Option<Item>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.get(key)
    }

    fn put<'life0, 'async_trait>(
        &'life0 self,
        item: Item,
        cond: Option<Cond>,
    ) -> StoreFuture<'async_trait, ()>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.put(item, cond)
    }

    fn update<'life0, 'life1, 'async_trait>(
        &'life0 self,
        key: &'life1 Key,
        update: Update,
        cond: Option<Cond>,
    ) -> StoreFuture<'async_trait, Item>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let outcome =
                key.sk.starts_with("WHD#") && update.set.iter().any(|(k, _)| k == "attempts");
            if outcome && self.crashed.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(StoreError::Unavailable(
                    "crashed between the send and the log (injected)".into(),
                ));
            }
            self.inner.update(key, update, cond).await
        })
    }

    fn delete<'life0, 'life1, 'async_trait>(
        &'life0 self,
        key: &'life1 Key,
        cond: Option<Cond>,
    ) -> StoreFuture<'async_trait, ()>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.delete(key, cond)
    }

    fn transact<'life0, 'async_trait>(&'life0 self, ops: Vec<TxOp>) -> StoreFuture<'async_trait, ()>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.transact(ops)
    }

    fn query<'life0, 'life1, 'async_trait>(
        &'life0 self,
        query: &'life1 Query,
    ) -> StoreFuture<'async_trait, QueryPage>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.query(query)
    }

    fn count<'life0, 'life1, 'async_trait>(
        &'life0 self,
        query: &'life1 Query,
    ) -> StoreFuture<'async_trait, u64>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.count(query)
    }
}

async fn a_crash_after_sending_resends_and_never_loses_the_event(which: Which) {
    let crash = Arc::new(std::sync::OnceLock::<Arc<CrashAfterSend>>::new());
    let keep = crash.clone();
    let Some(app) = spawn_app_wrapped(which, move |store| {
        let wrapped = Arc::new(CrashAfterSend {
            inner: store,
            crashed: AtomicUsize::new(0),
        });
        let _ = keep.set(wrapped.clone());
        wrapped as Arc<dyn Store>
    })
    .await
    else {
        return;
    };
    let Some(crash) = crash.get().cloned() else {
        panic!("the store was not wrapped")
    };
    let m = Merchant::on(app).await;
    let rx = Receiver::ok().await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let (event, pay) = m.record_payment_event(EventType::PaymentSucceeded).await;

    // Sent, the log write lost; the message comes back after its
    // visibility (4 s) to an expired claim, and the event is sent again.
    let d = m
        .delivery_with_status(&endpoint, &event.id, "success")
        .await;
    assert!(
        crash.crashed.load(Ordering::SeqCst) >= 2,
        "the outcome write was tried again after the crash"
    );
    assert_eq!(d["attempts"], 1, "{d}");
    assert_eq!(d["responseStatus"], 200, "{d}");
    assert_eq!(d["paymentId"], pay, "{d}");
    let hits = rx.hits();
    assert!(
        hits.len() >= 2,
        "a duplicate, never a loss: {:?}",
        ids_of(&hits)
    );
    assert!(
        hits.iter()
            .all(|h| h.event_id() == event.id && h.json == hits[0].json),
        "the same event each time: {:?}",
        ids_of(&hits)
    );
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 8. Duplicate queue messages

async fn duplicate_messages_never_resend_a_success(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::ok().await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let (event, _) = m.record_payment_event(EventType::PaymentSucceeded).await;
    let before = m
        .delivery_with_status(&endpoint, &event.id, "success")
        .await;
    assert_eq!(rx.count(), 1);

    for attempt in [0, 1] {
        let msg = DeliveryMessage {
            event_id: event.id.clone(),
            endpoint_id: endpoint.as_str().into(),
            attempt,
        };
        let body = match serde_json::to_string(&msg) {
            Ok(b) => b,
            Err(e) => panic!("message: {e}"),
        };
        for _ in 0..3 {
            if let Err(e) = m
                .app
                .state()
                .queue
                .send(QueueName::Webhooks, &body, Duration::ZERO)
                .await
            {
                panic!("queue send: {e}");
            }
        }
    }
    // A later event goes through the same worker: once it is delivered
    // (and a little more), the duplicates have been handled.
    let (later, _) = m.record_payment_event(EventType::PaymentRefunded).await;
    m.delivery_with_status(&endpoint, &later.id, "success")
        .await;
    tokio::time::sleep(QUIET).await;

    let hits = rx.hits();
    assert_eq!(
        ids_of(&hits),
        vec![
            ("payment.succeeded".to_owned(), event.id.to_string()),
            ("payment.refunded".to_owned(), later.id.to_string()),
        ]
    );
    let after = m.delivery(&endpoint, &event.id).await;
    assert_eq!(after.as_ref(), Some(&before), "the log is unchanged");
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 9. Test events

/// `POST /v1/webhooks/{endpoint}/test` of `type` (202): the event sent.
async fn send_test_event(m: &Merchant, endpoint: &str, t: &str) -> Value {
    let a = m
        .post(
            &format!("/v1/webhooks/{endpoint}/test"),
            &m.key,
            &json!({"type": t}),
        )
        .await;
    assert_eq!(a.status, 202, "{}", a.body);
    let sent = a.body;
    assert!(
        shared::ids::is_valid(&text(&sent["id"]), IdKind::Event),
        "{sent}"
    );
    assert_eq!(sent["type"], t, "{sent}");
    assert_eq!(sent["livemode"], false, "{sent}");
    assert_eq!(sent["data"]["object"]["test"], true, "{sent}");
    sent
}

/// A test event reaches its one endpoint, even one whose `events` filter
/// leaves its type out, and no other.
async fn a_test_event_goes_to_its_endpoint_only(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let read_only = m
        .app
        .key(&m.tenant, Mode::Sandbox, &[Scope::WebhooksRead])
        .await;
    let rx = Receiver::ok().await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let bystander = Receiver::ok().await;
    let bystander_id = text(&m.register(&bystander, None).await["id"]);
    let path = format!("/v1/webhooks/{endpoint}/test");

    // Refusals first.
    let bad = m
        .post(&path, &m.key, &json!({"type": "payment.success"}))
        .await;
    bad.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(bad.body["error"]["param"], "type", "{}", bad.body);
    m.post(&path, &read_only, &json!({"type": "refund.succeeded"}))
        .await
        .assert_error(403, "permission_error", "missing_scope");
    let unknown = format!("/v1/webhooks/{}/test", new_id(IdKind::WebhookEndpoint));
    m.post(&unknown, &m.key, &json!({"type": "refund.succeeded"}))
        .await
        .assert_error(404, "invalid_request_error", "not_found");

    // A test event reaches its endpoint, and only it.
    let sent = send_test_event(&m, &endpoint, "refund.succeeded").await;
    let id = text(&sent["id"]);
    let hits = rx.wait_for(1).await;
    let hit = &hits[0];
    assert_eq!(hit.json, sent, "the receiver gets the event answered");
    assert_eq!(hit.event_type(), "refund.succeeded");
    assert_eq!(hit.json["data"]["object"]["test"], true);
    let d = m.delivery_with_status(&endpoint, &id, "success").await;
    assert_eq!(d["eventType"], "refund.succeeded", "{d}");
    assert!(text(&d["paymentId"]).starts_with("pay_"), "{d}");

    // An endpoint subscribed to payment.failed only still gets its own
    // test event of another type.
    let picky = Receiver::ok().await;
    let picky_id = text(&m.register(&picky, Some(&["payment.failed"])).await["id"]);
    let sent = send_test_event(&m, &picky_id, "refund.succeeded").await;
    // (The pipeline is known to work by now: 10 s is plenty.)
    let got = eventually_within(
        "the test event at the payment.failed-only endpoint",
        Duration::from_secs(10),
        async || match picky.hits().first() {
            Some(h) => Ok(h.clone()),
            None => Err(format!(
                "nothing received; its delivery log: {:?}",
                m.deliveries(&picky_id).await
            )),
        },
    )
    .await;
    assert_eq!(got.json, sent);
    m.delivery_with_status(&picky_id, &text(&sent["id"]), "success")
        .await;

    // Nobody else got either.
    tokio::time::sleep(QUIET).await;
    assert_eq!(rx.count(), 1, "{:?}", ids_of(&rx.hits()));
    assert_eq!(picky.count(), 1, "{:?}", ids_of(&picky.hits()));
    assert_eq!(bystander.count(), 0, "{:?}", ids_of(&bystander.hits()));
    assert_eq!(m.deliveries(&bystander_id).await, Vec::<Value>::new());
    for r in [&rx, &picky, &bystander] {
        r.assert_all_signed();
    }
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 10. The delivery log

async fn the_delivery_log_lists_newest_first(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let live = m.app.key(&m.tenant, Mode::Live, &Scope::ALL).await;
    let rx = Receiver::ok().await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let path = format!("/v1/webhooks/{endpoint}/deliveries");
    let empty = m.get(&path, &m.key).await;
    assert_eq!(empty.body, json!({"data": []}));

    // One at a time, so each delivery is created in its own fan-out.
    let mut events = Vec::new();
    for t in [
        EventType::PaymentSucceeded,
        EventType::RefundSucceeded,
        EventType::PaymentRefunded,
    ] {
        let (e, _) = m.record_payment_event(t).await;
        m.delivery_with_status(&endpoint, &e.id, "success").await;
        events.push(e);
    }
    let a = m.get(&path, &m.key).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(keys_of(&a.body), vec!["data"], "no meta: {}", a.body);
    let data = a.body["data"].as_array().cloned().unwrap_or_default();
    let listed: Vec<String> = data.iter().map(|d| text(&d["eventId"])).collect();
    let newest_first: Vec<String> = events.iter().rev().map(|e| e.id.to_string()).collect();
    assert_eq!(listed, newest_first);
    for pair in data.windows(2) {
        assert!(
            text(&pair[0]["id"]) > text(&pair[1]["id"]),
            "ids newest first: {data:?}"
        );
        assert!(
            text(&pair[0]["createdAt"]) >= text(&pair[1]["createdAt"]),
            "createdAt newest first: {data:?}"
        );
    }
    assert!(data.iter().all(|d| d["webhookEndpointId"] == endpoint));

    let unknown = format!(
        "/v1/webhooks/{}/deliveries",
        new_id(IdKind::WebhookEndpoint)
    );
    m.get(&unknown, &m.key)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    m.get("/v1/webhooks/nonsense/deliveries", &m.key)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    m.get(&path, &live)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    rx.assert_all_signed();
    m.stop().await;
}

/// More deliveries than the log answers: the newest 50, newest first.
async fn the_delivery_log_answers_the_newest_fifty(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::ok().await;
    let endpoint = text(&m.register(&rx, None).await["id"]);
    let total = 60;
    for _ in 0..total {
        m.record_payment_event(EventType::PaymentSucceeded).await;
    }
    rx.wait_for_within(total, Duration::from_secs(60)).await;
    // Every delivery as stored, newest (largest id) first.
    let stored = eventually(&format!("{total} stored deliveries"), async || {
        let q = Query::partition(format!("WE#{endpoint}#WHD"))
            .on(shared::store::Index::Gsi1)
            .backward()
            .limit(200);
        let found = m.app.store.query(&q).await.map_err(|e| e.to_string())?;
        let mut ids: Vec<(String, String)> = found
            .items
            .iter()
            .map(|i| (text(&i["id"]), text(&i["event_id"])))
            .collect();
        ids.sort();
        ids.reverse();
        if ids.len() == total {
            Ok(ids)
        } else {
            Err(format!("{} stored", ids.len()))
        }
    })
    .await;
    let data = eventually("every delivery a success in the log", async || {
        let data = m.deliveries(&endpoint).await;
        if data.iter().all(|d| d["status"] == "success") {
            Ok(data)
        } else {
            Err(format!("{data:?}"))
        }
    })
    .await;
    assert_eq!(data.len(), 50);
    let listed: Vec<(String, String)> = data
        .iter()
        .map(|d| (text(&d["id"]), text(&d["eventId"])))
        .collect();
    assert_eq!(listed, stored[..50].to_vec(), "the newest 50, newest first");
    rx.assert_all_signed();
    m.stop().await;
}

// ---------------------------------------------------------------------------
// 11. A real payment

async fn a_paid_checkout_sends_a_signed_payment_succeeded(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = shop::Shop::on(app).await;
    let rx = Receiver::ok().await;
    let created = shop
        .app
        .post(
            "/v1/webhooks",
            Some(&shop.key),
            None,
            &json!({"url": rx.url}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let secret = text(&created.body["signing_secret"]);
    assert_secret(&secret);
    rx.set_secret(&secret);
    let endpoint = text(&created.body["id"]);

    // The customer pays a checkout with Khalti (the simulator's page).
    let s = text(&shop.create_checkout(150_000).await["id"]);
    let picked = shop.choose(&s, &[("provider", "khalti")]).await;
    let wallet_url = picked.redirect(303);
    let wallet = shop.browser.get(&wallet_url).await;
    assert_eq!(wallet.status, 200, "{}", wallet.show());
    let Some(wallet) = form(&wallet.body, None) else {
        panic!("no form on Khalti's page")
    };
    let payment = text(&shop.session(&s).await["paymentId"]);
    assert!(payment.starts_with("pay_"), "no attempt for {s}");
    let mut fields = wallet.hidden.clone();
    fields.push(("action".into(), "pay".into()));
    let callback = shop
        .browser
        .post_form(&wallet.action, &fields)
        .await
        .redirect(302);
    let back = shop.browser.get(&callback).await;
    assert_eq!(
        back.redirect(303),
        format!("{RETURN_URL}?session_id={s}&status=success")
    );
    assert_eq!(shop.payment(&payment).await["status"], "success");

    let hit = eventually("payment.succeeded at the receiver", async || {
        let hits = rx.hits();
        hits.iter()
            .find(|h| h.event_type() == "payment.succeeded")
            .cloned()
            .ok_or_else(|| format!("{:?}", ids_of(&hits)))
    })
    .await;
    assert_eq!(hit.json["data"]["object"]["id"], payment, "{}", hit.json);
    assert_eq!(
        hit.json["data"]["object"]["status"], "success",
        "{}",
        hit.json
    );
    assert_eq!(hit.json["livemode"], false);
    let secret = rx.secret();
    assert_eq!(
        signature::verify(
            &hit.header(SIGNATURE_HEADER),
            &hit.body,
            &[secret.as_str()],
            hit.unix
        ),
        Ok(())
    );
    let d = shop_delivery(&shop, &endpoint, &hit.event_id()).await;
    assert_eq!(d["paymentId"], payment, "{d}");
    assert_eq!(d["eventType"], "payment.succeeded", "{d}");
    assert_eq!(d["attempts"], 1, "{d}");
    assert_eq!(d["responseStatus"], 200, "{d}");

    tokio::time::sleep(QUIET).await;
    let succeeded: Vec<Hit> = rx
        .hits()
        .into_iter()
        .filter(|h| h.event_type() == "payment.succeeded")
        .collect();
    assert_eq!(succeeded.len(), 1, "{:?}", ids_of(&rx.hits()));
    rx.assert_all_signed();
    shop.stop().await;
}

/// The delivery of `event` to `endpoint` once `success`, read with the
/// shop's key.
async fn shop_delivery(shop: &shop::Shop, endpoint: &str, event: &str) -> Value {
    eventually(&format!("the delivery of {event} to succeed"), async || {
        let a = shop
            .app
            .get(
                &format!("/v1/webhooks/{endpoint}/deliveries"),
                Some(&shop.key),
            )
            .await;
        let found = a.body["data"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["eventId"] == event).cloned());
        match found {
            Some(d) if d["status"] == "success" => Ok(d),
            other => Err(format!("HTTP {}: {other:?}", a.status)),
        }
    })
    .await
}

// ---------------------------------------------------------------------------
// 12. The endpoint limit, under concurrent registrations

async fn the_endpoint_limit_holds_under_concurrent_registrations(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::ok().await;
    let body = json!({ "url": rx.url });
    let answers =
        futures::future::join_all((0..40).map(|_| m.post("/v1/webhooks", &m.key, &body))).await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    let created = statuses.iter().filter(|s| **s == 201).count();
    assert_eq!(created, 16, "{statuses:?}");
    for a in answers.iter().filter(|a| a.status != 201) {
        a.assert_error(422, "invalid_request_error", "webhook_endpoint_limit");
    }
    let list = m.get("/v1/webhooks", &m.key).await;
    assert_eq!(list.status, 200, "{}", list.body);
    let listed = list.body["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 16, "{}", list.body);

    // A delete makes room for one, a second delete of it for none.
    let gone = text(&listed[0]["id"]);
    let path = format!("/v1/webhooks/{gone}");
    assert_eq!(m.delete(&path, &m.key).await.status, 200);
    m.delete(&path, &m.key)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(m.post("/v1/webhooks", &m.key, &body).await.status, 201);
    m.post("/v1/webhooks", &m.key, &body).await.assert_error(
        422,
        "invalid_request_error",
        "webhook_endpoint_limit",
    );
    // Per mode: live has its own 16.
    let live = m.app.key(&m.tenant, Mode::Live, &Scope::ALL).await;
    let live_list = m.get("/v1/webhooks", &live).await;
    assert_eq!(live_list.body, json!({"data": []}));
    m.stop().await;
}

on_both_backends!(
    endpoints_are_registered_listed_patched_and_deleted,
    an_event_is_delivered_once_and_signed,
    a_failing_receiver_gets_retries_until_it_answers,
    a_delivery_fails_after_the_last_retry,
    a_receiver_timeout_is_a_failed_attempt_then_retried,
    endpoints_get_the_events_they_subscribed_to,
    a_crash_after_sending_resends_and_never_loses_the_event,
    duplicate_messages_never_resend_a_success,
    a_test_event_goes_to_its_endpoint_only,
    the_delivery_log_lists_newest_first,
    the_delivery_log_answers_the_newest_fifty,
    the_endpoint_limit_holds_under_concurrent_registrations,
    a_paid_checkout_sends_a_signed_payment_succeeded,
    an_issued_billing_invoice_sends_a_signed_billing_invoice_created,
);

/// The receivers `docs/webhooks.md` shows merchants (Python and Node) run
/// as printed against signatures the gateway makes: a good delivery is
/// taken (and the payment it names is looked up with the API), the same
/// event again is a duplicate, a wrong secret and a replayed (stale)
/// timestamp are refused. A change to the signing scheme or to the
/// examples that breaks one fails here, so the documentation cannot rot.
async fn the_documented_receivers_verify_as_documented(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Docs", "docs@example.com").await;
    let key = app.key(&t, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let doc = match std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/webhooks.md"
    )) {
        Ok(d) => d,
        Err(e) => panic!("docs/webhooks.md: {e}"),
    };
    // Standard library only: the system's interpreters run them (PHP
    // behind its built-in server, as the example says).
    for (lang, program, file) in [
        ("python", "python3", "receiver.py"),
        ("js", "node", "receiver.js"),
        ("php", "php", "receiver.php"),
    ] {
        let code = documented_block(&doc, "## How to verify a webhook", lang);
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let path = dir.path().join(file);
        if let Err(e) = std::fs::write(&path, code) {
            panic!("{e}");
        }
        let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            Ok(a) => a.port(),
            Err(e) => panic!("{e}"),
        };
        let mut command = tokio::process::Command::new(program);
        if lang == "php" {
            // Its server logs every request on stderr.
            command
                .arg("-S")
                .arg(format!("127.0.0.1:{port}"))
                .arg(&path)
                .stderr(std::process::Stdio::null());
        } else {
            command.arg(&path).arg(port.to_string());
        }
        let mut child = match command
            .env("WEBHOOK_SECRET", "whsec_docs_old, whsec_docs")
            .env("DHUKUTI_KEY", &key)
            .env("DHUKUTI_API", app.url(""))
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("{program} {file}: {e}"),
        };
        let url = format!("http://127.0.0.1:{port}/");
        let client = reqwest::Client::new();
        let deliver = |body: String, header: String| {
            let client = client.clone();
            let url = url.clone();
            async move {
                let r = client
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .header(SIGNATURE_HEADER, header)
                    .body(body)
                    .timeout(Duration::from_secs(15))
                    .send()
                    .await;
                match r {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, e.to_string()),
                }
            }
        };
        let now = SystemClock.now().unix_seconds();
        let body = json!({
            "id": "evt_docs_1", "type": "payment.succeeded", "livemode": false,
            "created_at": now,
            "data": {"object": {"id": "pay_test_missing", "status": "success"}},
        })
        .to_string();
        let good = signature::sign("whsec_docs", now, body.as_bytes());
        // Wait (bounded) for the receiver to listen.
        let deadline = Instant::now() + Duration::from_secs(20);
        let first = loop {
            let (status, text) = deliver(body.clone(), good.clone()).await;
            if status != 0 || Instant::now() > deadline {
                break (status, text);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(first.0, 200, "{lang}: a good delivery: {}", first.1);
        let again = deliver(body.clone(), good.clone()).await;
        assert_eq!(again.0, 200, "{lang}: {}", again.1);
        assert!(again.1.contains("duplicate"), "{lang}: {}", again.1);
        let other = json!({"id": "evt_docs_2", "type": "refund.succeeded", "data": {"object": {"id": "re_1"}}})
            .to_string();
        let forged = signature::sign("whsec_someone_else", now, other.as_bytes());
        assert_eq!(
            deliver(other.clone(), forged).await.0,
            400,
            "{lang}: a wrong secret"
        );
        let stale = signature::sign("whsec_docs", now - 400, other.as_bytes());
        assert_eq!(
            deliver(other.clone(), stale).await.0,
            400,
            "{lang}: a replay"
        );
        let tampered = good.clone();
        assert_eq!(
            deliver(other.clone(), tampered).await.0,
            400,
            "{lang}: another body"
        );
        let rotated = signature::sign("whsec_docs_old", now, other.as_bytes());
        assert_eq!(
            deliver(other, rotated).await.0,
            200,
            "{lang}: the old secret in a rotation"
        );
        let _ = child.kill().await;
    }
    app.stop().await;
}

/// The first code block tagged `lang` after `heading` in `doc`.
fn documented_block(doc: &str, heading: &str, lang: &str) -> String {
    let Some(start) = doc.find(heading) else {
        panic!("no {heading:?} in the docs");
    };
    let fence = format!("\n```{lang}\n");
    let Some(open) = doc[start..].find(&fence) else {
        panic!("no {lang} example under {heading:?}");
    };
    let from = start + open + fence.len();
    let Some(len) = doc[from..].find("\n```") else {
        panic!("an unclosed {lang} block");
    };
    doc[from..from + len + 1].to_owned()
}

#[tokio::test]
async fn the_documented_receivers_verify_as_documented_on_the_embedded_store() {
    the_documented_receivers_verify_as_documented(Which::Embedded).await;
}

/// An endpoint subscribed to `billing_invoice.created` receives it, signed,
/// when an invoice is issued (through the domain, as the scheduler issues
/// it), with the invoice as `data.object`; the issue's other event
/// (`subscription.created`) does not go to it, and an endpoint listening
/// for the one-time `invoice.paid` receives nothing new.
async fn an_issued_billing_invoice_sends_a_signed_billing_invoice_created(which: Which) {
    let Some(m) = Merchant::open(which).await else {
        return;
    };
    let rx = Receiver::ok().await;
    let one_time = Receiver::ok().await;
    let endpoint = text(&m.register(&rx, Some(&["billing_invoice.created"])).await["id"]);
    m.register(&one_time, Some(&["invoice.paid"])).await;
    let inv = crate::dunning::issued_invoice(&m.app, &m.tenant).await;

    let hits = rx.wait_for(1).await;
    let hit = &hits[0];
    assert_eq!(hit.event_type(), "billing_invoice.created");
    let body = &hit.json;
    assert_eq!(body["livemode"], false);
    let object = &body["data"]["object"];
    assert_eq!(object["id"], inv.id.as_str(), "{body}");
    // The invoice exactly as its GET answers it.
    let got = m
        .get(&format!("/v1/billing/invoices/{}", inv.id), &m.key)
        .await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(object, &got.body, "data.object is the GET's answer");
    assert_eq!(object["status"], "open");
    assert_eq!(object["number"], inv.number.as_str());
    assert_eq!(object["amountDue"], 99_900);
    assert_eq!(object["subscriptionId"], inv.subscription_id.as_str());
    assert_eq!(body["data"]["invoice_number"], inv.number.as_str());
    assert_eq!(body["data"]["amount"], 99_900);
    let d = m
        .delivery_with_status(&endpoint, &hit.event_id(), "success")
        .await;
    assert_eq!(d["eventType"], "billing_invoice.created", "{d}");
    tokio::time::sleep(QUIET).await;
    assert_eq!(rx.count(), 1, "{:?}", ids_of(&rx.hits()));
    assert_eq!(one_time.count(), 0, "{:?}", ids_of(&one_time.hits()));
    rx.assert_all_signed();
    m.stop().await;
}
