//! Benchmark: `GET /v1/payments/{id}` on the local gateway against a bare
//! axum handler answering a fixed JSON body of the same size, on the same
//! machine in the same run, at the same concurrency; then `POST
//! /v1/checkout` (each request with its own `Idempotency-Key`, as a
//! merchant sends it) on the gateway.
//!
//!     cargo run --release -p dhukuti-bench --bin bench -- [--seconds 10] [--connections 32] [--rounds 5]
//!
//! Prints a Markdown table for BENCHMARKS.md and the store calls one
//! request makes.
//!
//! With `--reconciler`, measures the reconciler's fairness instead (see
//! [`reconciler_bench`]):
//!
//!     cargo run --release -p dhukuti-bench --bin bench -- --reconciler [--junk 10000] [--genuine 20]
//!
//! With `--webhooks`, measures webhook delivery instead (see
//! [`webhooks_bench`]):
//!
//!     cargo run --release -p dhukuti-bench --bin bench -- --webhooks \
//!         [--events 2000] [--latency-events 200] [--payments 200] [--poll-ms 10]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use dhukuti::Settings;
use serde_json::{Value, json};
use shared::domain::account::{self, KeyKind, NewKey, Plan, Scope};
use shared::domain::outbox::{Event, EventType};
use shared::domain::payments::{self, Payment, PaymentStatus, PaymentView};
use shared::domain::webhooks::WebhookSettings;
use shared::domain::{Mode, Provider};
use shared::ids::IdKind;
use shared::money::{Currency, Paisa};
use shared::store::counting::CountingStore;
use shared::store::embedded::EmbeddedStore;
use shared::store::{Cond, Index, Item, Key, Query, QueryPage, Store, StoreError, TxOp, Update};
use shared::time::{Clock, SystemClock};

#[path = "../local.rs"]
mod local;
use local::local_settings;

struct Result {
    name: &'static str,
    requests: usize,
    errors: usize,
    seconds: f64,
    p50_us: u64,
    p99_us: u64,
}

#[tokio::main]
async fn main() -> std::result::Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if args.iter().any(|a| a == "--reconciler") {
        return reconciler_bench(
            arg("--junk", 10_000) as usize,
            arg("--genuine", 20) as usize,
        )
        .await;
    }
    if args.iter().any(|a| a == "--webhooks") {
        return webhooks_bench(WebhookBench {
            events: arg("--events", 2000) as usize,
            latency_events: arg("--latency-events", 200) as usize,
            payments: arg("--payments", 200) as usize,
            poll: Duration::from_millis(arg("--poll-ms", 10)),
        })
        .await;
    }
    let seconds = arg("--seconds", 10);
    let connections = arg("--connections", 32) as usize;
    let rounds = arg("--rounds", 5).clamp(1, seconds.max(1)) as usize;

    let tmp = std::env::temp_dir().join(format!("dhukuti-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let redb = Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(|e| e.to_string())?);
    let embedded: Arc<dyn Store> = redb.clone();
    let counting = Arc::new(CountingStore::new(embedded));
    let settings = local_settings(&tmp)?;
    let running = dhukuti::start_with_store(settings, counting.clone()).await?;
    // Load from one key: the per-key rate limit must not be what is measured.
    running.state.limits().set(u32::MAX, u32::MAX);

    // A merchant, a key and a payment to read.
    let now = SystemClock.now();
    let store: &dyn Store = &*counting;
    let merchant =
        account::create_merchant(store, now, "Bench Shop", "bench@shop.example", Plan::Pro)
            .await
            .map_err(|e| e.to_string())?;
    let project = account::create_project(store, now, &merchant, "Bench", false)
        .await
        .map_err(|e| e.to_string())?;
    let new = NewKey {
        mode: Mode::Live,
        kind: KeyKind::Secret,
        scopes: Scope::ALL.to_vec(),
        description: "bench".into(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    let (key, _) = account::issue_api_key(&running.state, now, &project, new)
        .await
        .map_err(|e| e.to_string())?;
    let payment = Payment {
        id: shared::ids::PaymentId::new(),
        project_id: project.id.clone(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: Mode::Live,
        amount: Paisa::new(150_000).map_err(|e| e.to_string())?,
        amount_refunded: Paisa::ZERO,
        currency: Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider: Provider::Khalti,
        status: PaymentStatus::Success,
        provider_ref: Some("KTX-BENCH-1".into()),
        failure_reason: None,
        metadata: Default::default(),
        customer_name: Some("Sita Sharma".into()),
        customer_email: Some("sita@example.com".into()),
        customer_phone: Some("9841000001".into()),
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: Default::default(),
        checks: Default::default(),
    };
    payments::insert(store, &payment)
        .await
        .map_err(|e| e.to_string())?;
    let url = format!("{}/v1/payments/{}", running.base_url, payment.id);

    // Store calls of one request to each endpoint, and the answer's bytes.
    let client = reqwest::Client::new();
    let base = running.base_url.clone();
    let mut calls = Vec::new();
    let mut body = bytes::Bytes::new();
    let checkout_body = r#"{"amount": 150000, "returnUrl": "https://shop.example/thanks"}"#;
    // The key's first request reads it and its merchant; the process then
    // remembers them (`account::cache`): what is counted below is a warm
    // request's cost.
    client
        .get(format!("{base}/v1/account"))
        .bearer_auth(&key)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    for idem in [None, Some("bench-calls-1")] {
        let before = counting.calls();
        let mut req = client
            .post(format!("{base}/v1/checkout"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(checkout_body);
        if let Some(k) = idem {
            req = req.header("idempotency-key", k);
        }
        let res = req.send().await.map_err(|e| e.to_string())?;
        let label = match idem {
            Some(_) => "POST /v1/checkout (with Idempotency-Key)".to_owned(),
            None => "POST /v1/checkout".to_owned(),
        };
        calls.push((label, res.status().as_u16(), counting.calls() - before));
    }
    for path in [
        "/v1/account".to_owned(),
        "/v1/payments?limit=25".to_owned(),
        format!("/v1/payments/{}", payment.id),
        "/v1/payments/pay_notavalidid".to_owned(),
    ] {
        let before = counting.calls();
        let res = client
            .get(format!("{base}{path}"))
            .bearer_auth(&key)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = res.status().as_u16();
        let bytes = res.bytes().await.map_err(|e| e.to_string())?;
        calls.push((format!("GET {path}"), status, counting.calls() - before));
        if path.ends_with(payment.id.as_str()) {
            body = bytes;
        }
    }

    let fixed = body.clone();
    let bare = Router::new().route(
        "/v1/payments/{id}",
        get(move || {
            let b = fixed.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], b) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let bare_url = format!(
        "http://{}/v1/payments/{}",
        listener.local_addr().map_err(|e| e.to_string())?,
        payment.id
    );
    tokio::spawn(async move { axum::serve(listener, bare).await });

    let duration = Duration::from_secs(seconds);
    let mut results = Vec::new();
    let mut commit_note = String::new();
    let checkout_url = format!("{base}/v1/checkout");

    // The bare handler and the gateway's read take turns, `rounds` times
    // for `seconds / rounds` each, so that the machine's speed drifting
    // during the run (it does, by a fifth between runs here) weighs on
    // both alike: their ratio is the number the issue sets.
    let pair = [
        ("bare axum, fixed body", &bare_url),
        ("gateway GET /v1/payments/{id}", &url),
    ];
    for (_, target) in pair {
        // Warm up connections and caches.
        load(target, None, &key, connections, Duration::from_secs(1)).await;
    }
    let mut samples: [(usize, usize, f64, Vec<u64>); 2] = Default::default();
    let mut round_ratios = Vec::new();
    for _ in 0..rounds {
        let mut rates = [0.0; 2];
        for (i, (_, target)) in pair.iter().enumerate() {
            let (requests, errors, secs, lat) =
                load(target, None, &key, connections, duration / rounds as u32).await;
            rates[i] = requests as f64 / secs;
            let sample = &mut samples[i];
            sample.0 += requests;
            sample.1 += errors;
            sample.2 += secs;
            sample.3.extend(lat);
        }
        round_ratios.push(rates[1] / rates[0].max(1.0));
    }
    for ((name, _), (requests, errors, seconds, lat)) in pair.into_iter().zip(samples) {
        results.push(summarize(name, requests, errors, seconds, lat));
    }

    for (name, target, post) in [(
        "gateway POST /v1/checkout (Idempotency-Key each)",
        &checkout_url,
        Some(checkout_body),
    )] {
        // Warm up connections and caches.
        load(target, post, &key, connections, Duration::from_secs(1)).await;
        let (writes_before, commits_before) = (counting.calls(), redb.commits());
        let (requests, errors, seconds, lat) =
            load(target, post, &key, connections, duration).await;
        if post.is_some() {
            // Group commit: how many store calls each durable commit held
            // (reads included in the calls: a lower bound of the writes).
            let commits = (redb.commits() - commits_before).max(1);
            let calls = counting.calls() - writes_before;
            commit_note = format!(
                "store calls during the checkout load: {calls}; redb commits: {commits} ({:.1} calls a commit)",
                calls as f64 / commits as f64
            );
        }
        results.push(summarize(name, requests, errors, seconds, lat));
    }
    let _ = running.stop().await;
    let _ = std::fs::remove_dir_all(&tmp);

    println!("store calls per request:\n");
    println!("| request | status | store calls |");
    println!("|---|---:|---:|");
    for (path, status, n) in &calls {
        println!("| {path} | {status} | {n} |");
    }
    println!(
        "\nbody size of GET /v1/payments/{{id}}: {} bytes",
        body.len()
    );
    println!(
        "connections: {connections}; duration: {seconds} s per target \
         (the bare handler and the GET in {rounds} alternating rounds)\n"
    );
    println!("| target | requests | errors | req/s | p50 (ms) | p99 (ms) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &results {
        println!(
            "| {} | {} | {} | {:.0} | {:.3} | {:.3} |",
            r.name,
            r.requests,
            r.errors,
            r.requests as f64 / r.seconds,
            r.p50_us as f64 / 1000.0,
            r.p99_us as f64 / 1000.0
        );
    }
    if let [bare, read, ..] = &results[..] {
        let rate = |r: &Result| r.requests as f64 / r.seconds;
        let rounds = round_ratios
            .iter()
            .map(|r| format!("{:.0}%", r * 100.0))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "\nGET vs bare: {:.0}% (rounds: {rounds})",
            100.0 * rate(read) / rate(bare).max(1.0)
        );
    }
    println!("\n{commit_note}");
    Ok(())
}

/// A row of the table: the rate and the 50th and 99th percentiles.
fn summarize(
    name: &'static str,
    requests: usize,
    errors: usize,
    seconds: f64,
    mut lat: Vec<u64>,
) -> Result {
    lat.sort_unstable();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Result {
        name,
        requests,
        errors,
        seconds,
        p50_us: pick(0.50),
        p99_us: pick(0.99),
    }
}

/// `connections` workers, each with its own keep-alive connection, send
/// requests back to back until `duration` passes.
async fn load(
    url: &str,
    post: Option<&'static str>,
    key: &str,
    connections: usize,
    duration: Duration,
) -> (usize, usize, f64, Vec<u64>) {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let url = url.to_owned();
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .build()
                .unwrap_or_default();
            let mut lat = Vec::new();
            let mut errors = 0usize;
            let worker = shared::ids::new_id(IdKind::Event);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                let req = match post {
                    Some(body) => {
                        n += 1;
                        client
                            .post(&url)
                            .header("content-type", "application/json")
                            .header("idempotency-key", format!("{worker}-{n}"))
                            .body(body)
                    }
                    None => client.get(&url),
                };
                let ok = match req.bearer_auth(&key).send().await {
                    Ok(res) => res.status().is_success() && res.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    lat.push(t.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((lat, e)) = t.await {
            all.extend(lat);
            errors += e;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    (all.len(), errors, secs, all)
}

// ------------------------------------------------------------------ webhooks

/// What `bench --webhooks` runs.
struct WebhookBench {
    /// (a) events written at once for the throughput run.
    events: usize,
    /// (b) events committed one at a time, settle-shaped.
    latency_events: usize,
    /// (b) real payments over HTTP through the Khalti simulator.
    payments: usize,
    /// The gateway's outbox poll interval.
    poll: Duration,
}

type StoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, StoreError>> + Send + 'a>>;

/// Forwards to the store and notes when each outbox event (`EVT#<id>`)
/// committed, and how many writes were made: the gateway writes events
/// inside its own transactions, so this is where their commit is seen.
/// (Written out by hand: infra does not depend on `async-trait`.)
struct CommitClock {
    inner: Arc<dyn Store>,
    commits: Mutex<Vec<(String, Instant)>>,
    writes: AtomicU64,
}

impl CommitClock {
    fn commits_since(&self, from: usize) -> Vec<(String, Instant)> {
        self.commits
            .lock()
            .map(|c| c.get(from..).map(<[_]>::to_vec).unwrap_or_default())
            .unwrap_or_default()
    }

    fn commit_count(&self) -> usize {
        self.commits.lock().map(|c| c.len()).unwrap_or(0)
    }

    fn write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

impl Store for CommitClock {
    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    fn get<'s, 'k, 'f>(&'s self, key: &'k Key) -> StoreFuture<'f, Option<Item>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.inner.get(key)
    }

    fn put<'s, 'f>(&'s self, item: Item, cond: Option<Cond>) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.write();
        self.inner.put(item, cond)
    }

    fn update<'s, 'k, 'f>(
        &'s self,
        key: &'k Key,
        update: Update,
        cond: Option<Cond>,
    ) -> StoreFuture<'f, Item>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.write();
        self.inner.update(key, update, cond)
    }

    fn delete<'s, 'k, 'f>(&'s self, key: &'k Key, cond: Option<Cond>) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.write();
        self.inner.delete(key, cond)
    }

    fn transact<'s, 'f>(&'s self, ops: Vec<TxOp>) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.write();
        let events: Vec<String> = ops
            .iter()
            .filter(|op| matches!(op, TxOp::Put { .. }))
            .filter_map(TxOp::key)
            .filter_map(|k| {
                shared::keys::record_id(shared::keys::Record::Event, &k.pk, &k.sk)
                    .map(str::to_owned)
            })
            .collect();
        Box::pin(async move {
            let result = self.inner.transact(ops).await;
            if result.is_ok() && !events.is_empty() {
                let at = Instant::now();
                if let Ok(mut c) = self.commits.lock() {
                    c.extend(events.into_iter().map(|e| (e, at)));
                }
            }
            result
        })
    }

    fn query<'s, 'q, 'f>(&'s self, query: &'q Query) -> StoreFuture<'f, QueryPage>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        self.inner.query(query)
    }

    fn count<'s, 'q, 'f>(&'s self, query: &'q Query) -> StoreFuture<'f, u64>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        self.inner.count(query)
    }
}

/// What the receiver got: the first arrival of each event id, and every
/// delivery (duplicates included).
#[derive(Default)]
struct Receipts {
    first: Mutex<HashMap<String, Instant>>,
    deliveries: AtomicU64,
}

impl Receipts {
    fn of(&self, ids: &[String]) -> Option<Vec<Instant>> {
        let first = self.first.lock().ok()?;
        ids.iter().map(|id| first.get(id).copied()).collect()
    }

    /// Waits until every id in `ids` arrived (at most `limit`).
    async fn wait(
        &self,
        ids: &[String],
        limit: Duration,
    ) -> std::result::Result<Vec<Instant>, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(at) = self.of(ids) {
                return Ok(at);
            }
            if Instant::now() > deadline {
                let got = self
                    .first
                    .lock()
                    .map(|f| ids.iter().filter(|i| f.contains_key(*i)).count())
                    .unwrap_or(0);
                return Err(format!(
                    "only {got} of {} events arrived within {} s",
                    ids.len(),
                    limit.as_secs()
                ));
            }
            // Arrival times are taken by the receiver; this only paces the wait.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A receiver answering 200 to every POST, noting when each event arrived.
async fn start_receiver(receipts: Arc<Receipts>) -> std::result::Result<String, String> {
    let app = Router::new().route(
        "/",
        axum::routing::post(move |body: bytes::Bytes| {
            let receipts = receipts.clone();
            async move {
                let at = Instant::now();
                receipts.deliveries.fetch_add(1, Ordering::Relaxed);
                let id = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["id"].as_str().map(str::to_owned));
                if let (Some(id), Ok(mut first)) = (id, receipts.first.lock()) {
                    first.entry(id).or_insert(at);
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}/"))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

/// p50, p99 and max of latencies in milliseconds.
fn summary(mut ms: Vec<f64>) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    (
        percentile(&ms, 0.50),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(0.0),
    )
}

fn millis(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Webhook delivery on the local gateway (embedded store on disk, the
/// in-process queue, the poller and the worker of `infra/src/webhooks.rs`)
/// to a receiver on 127.0.0.1 answering 200, through one endpoint of the
/// demo merchant registered over the HTTP API:
///
/// (a) throughput: `events` outbox events written at once (transactions of
///     up to 100), timed from the first write to the last arrival;
/// (b) latency from the commit of a state change to the receiver's 2xx,
///     one event at a time: first `latency_events` settle-shaped
///     transactions (the payment's update and its event, as the settle
///     transaction writes them), then `payments` real payments paid through
///     the Khalti simulator over HTTP (the commit seen by [`CommitClock`]).
async fn webhooks_bench(cfg: WebhookBench) -> std::result::Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let tmp = std::env::temp_dir().join(format!("dhukuti-bench-webhooks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| err(&e))?;
    let embedded: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(|e| err(&e))?);
    let clock = Arc::new(CommitClock {
        inner: embedded,
        commits: Mutex::default(),
        writes: AtomicU64::new(0),
    });
    let settings = Settings {
        webhooks: WebhookSettings {
            allow_local_http: true,
            ..Default::default()
        },
        webhook_poll: Some(cfg.poll),
        ..local_settings(&tmp)?
    };
    let running = dhukuti::start_with_store(settings, clock.clone()).await?;
    running.state.limits().set(u32::MAX, u32::MAX);
    let base = running.base_url.clone();
    let key = running.keys.sandbox.clone();
    let store: &dyn Store = &*clock;

    let receipts = Arc::new(Receipts::default());
    let receiver_url = start_receiver(receipts.clone()).await?;
    let api = dhukuti::listen::Api::new(&base, &key)?;
    let endpoint = api.register(&receiver_url, &[]).await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| err(&e))?;
    let account: Value = http
        .get(format!("{base}/v1/account"))
        .bearer_auth(&key)
        .send()
        .await
        .map_err(|e| err(&e))?
        .json()
        .await
        .map_err(|e| err(&e))?;
    let project_id = account["project"]["id"]
        .as_str()
        .and_then(shared::ids::ProjectId::parse)
        .ok_or("GET /v1/account answered no project id")?;
    // One delivery first, so connections and caches are warm.
    let warm = dhukuti::listen::trigger(&api, "payment.succeeded", Some(&endpoint.id)).await?;
    let warm_ids: Vec<String> = warm.iter().map(|t| t.event_id.clone()).collect();
    receipts.wait(&warm_ids, Duration::from_secs(30)).await?;

    // (a) Throughput.
    let now = SystemClock.now();
    let events: Vec<Event> = (0..cfg.events)
        .map(|i| {
            Event::new(
                EventType::PaymentSucceeded,
                &shared::domain::Tenant::new(project_id.clone(), Mode::Sandbox),
                json!({"id": format!("pay_bench{i}"), "object": "payment", "status": "success"}),
                now,
            )
        })
        .collect();
    let ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
    let writes_before = clock.writes.load(Ordering::Relaxed);
    let deliveries_before = receipts.deliveries.load(Ordering::Relaxed);
    let started = Instant::now();
    // Up to two writes an event: the event and its payment's timeline.
    for chunk in events.chunks(shared::store::MAX_TX_OPS / 2) {
        let mut ops = Vec::new();
        for e in chunk {
            ops.extend(e.put_ops().map_err(|e| err(&e))?);
        }
        store.transact(ops).await.map_err(|e| err(&e))?;
    }
    let written = started.elapsed();
    let arrived = receipts.wait(&ids, Duration::from_secs(600)).await?;
    let last = arrived.iter().copied().max().unwrap_or(started);
    let drain = last.saturating_duration_since(started);
    let writes = clock.writes.load(Ordering::Relaxed) - writes_before;
    let deliveries = receipts.deliveries.load(Ordering::Relaxed) - deliveries_before;
    let mut first_ms: Vec<f64> = arrived.iter().map(|a| millis(started, *a)).collect();
    first_ms.sort_by(f64::total_cmp);

    // (b1) Settle-shaped commits, one at a time.
    let mut write_ms = Vec::new();
    let mut settle_ms = Vec::new();
    for i in 0..cfg.latency_events {
        let now = SystemClock.now();
        let payment = Payment {
            id: shared::ids::PaymentId::new(),
            project_id: project_id.clone(),
            checkout_session_id: shared::ids::SessionId::new(),
            mode: Mode::Sandbox,
            amount: Paisa::new(150_000).map_err(|e| err(&e))?,
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            amount_reserved: Default::default(),
            gsi2pk: None,
            gsi2sk: None,
            provider: Provider::Khalti,
            status: PaymentStatus::Pending,
            provider_ref: None,
            failure_reason: None,
            metadata: Default::default(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: now,
            updated_at: now,
            double_payment_of: None,
            scanned_at: None,
            attempt: Default::default(),
            checks: Default::default(),
        };
        let t = Instant::now();
        payments::insert(store, &payment)
            .await
            .map_err(|e| err(&e))?;
        write_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let mut paid = payment.clone();
        paid.status = PaymentStatus::Success;
        paid.provider_ref = Some(format!("KTX-BENCH-{i}"));
        let view = serde_json::to_value(PaymentView::from(paid)).map_err(|e| err(&e))?;
        let event = Event::new(
            EventType::PaymentSucceeded,
            &shared::domain::Tenant::new(project_id.clone(), Mode::Sandbox),
            view,
            now,
        );
        let mut ops = vec![TxOp::Update {
            key: Payment::key(&payment.id),
            update: Update::new()
                .set("status", "success")
                .set("provider_ref", format!("KTX-BENCH-{i}"))
                .set("updated_at", now.to_rfc3339())
                .remove(Index::Gsi2.pk_attr())
                .remove(Index::Gsi2.sk_attr()),
            cond: Some(Cond::eq("status", "pending")),
        }];
        ops.extend(event.put_ops().map_err(|e| err(&e))?);
        tokio::time::sleep(phase(cfg.poll, i)).await;
        let from = clock.commit_count();
        store.transact(ops).await.map_err(|e| err(&e))?;
        let committed = clock.commits_since(from);
        let at = receipts
            .wait(&[event.id.to_string()], Duration::from_secs(60))
            .await?;
        for ((_, c), r) in committed.iter().zip(at) {
            settle_ms.push(millis(*c, r));
        }
    }

    // (b2) Real payments: checkout, Khalti hand-off, paid at the simulator,
    // the customer's return (verified with the simulator's lookup) commits.
    let mut paid_ms = Vec::new();
    let mut return_ms = Vec::new();
    for i in 0..cfg.payments {
        let session: Value = http
            .post(format!("{base}/v1/checkout"))
            .bearer_auth(&key)
            .json(&json!({"amount": 150000, "returnUrl": "https://shop.example/thanks"}))
            .send()
            .await
            .map_err(|e| err(&e))?
            .json()
            .await
            .map_err(|e| err(&e))?;
        let session_id = session["id"].as_str().ok_or("no session id")?;
        let handoff = http
            .post(format!("{base}/c/{session_id}/pay"))
            .header(
                axum::http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body("provider=khalti")
            .send()
            .await
            .map_err(|e| err(&e))?;
        let to = location(&handoff)?;
        let pidx = reqwest::Url::parse(&to)
            .map_err(|e| err(&e))?
            .query_pairs()
            .find(|(k, _)| k == "pidx")
            .map(|(_, v)| v.into_owned())
            .ok_or_else(|| format!("no pidx in {to}"))?;
        let acted: Value = http
            .post(format!("{base}/sim/khalti/_control/attempts/{pidx}/pay"))
            .send()
            .await
            .map_err(|e| err(&e))?
            .json()
            .await
            .map_err(|e| err(&e))?;
        let callback = acted["callback_url"]
            .as_str()
            .ok_or_else(|| format!("the simulator did not pay: {acted}"))?;
        tokio::time::sleep(phase(cfg.poll, i)).await;
        let from = clock.commit_count();
        let t = Instant::now();
        let back = http.get(callback).send().await.map_err(|e| err(&e))?;
        return_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let landed = location(&back)?;
        if !landed.contains("status=success") {
            return Err(format!("the payment did not succeed: {landed}"));
        }
        let committed = clock.commits_since(from);
        let event_ids: Vec<String> = committed.iter().map(|(id, _)| id.clone()).collect();
        if event_ids.is_empty() {
            return Err("the return committed no event".into());
        }
        let at = receipts.wait(&event_ids, Duration::from_secs(60)).await?;
        for ((_, c), r) in committed.iter().zip(at) {
            paid_ms.push(millis(*c, r));
        }
    }
    let total_deliveries = receipts.deliveries.load(Ordering::Relaxed);
    let distinct = receipts.first.lock().map(|f| f.len()).unwrap_or(0);
    let _ = api.delete(&endpoint.id).await;
    let _ = running.stop().await;
    let _ = std::fs::remove_dir_all(&tmp);

    println!(
        "webhook delivery: poll every {} ms, dispatcher concurrency {}, embedded store on disk\n",
        cfg.poll.as_millis(),
        shared::queue::MAX_RECEIVE
    );
    println!("(a) throughput: {} events written at once\n", cfg.events);
    println!(
        "| events | written in (ms) | last delivered at (ms) | deliveries/s | first arrival (ms) | median arrival (ms) | store writes per delivery | deliveries (with duplicates) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {:.1} | {:.0} | {:.0} | {:.1} | {:.0} | {:.2} | {} |",
        cfg.events,
        written.as_secs_f64() * 1000.0,
        drain.as_secs_f64() * 1000.0,
        cfg.events as f64 / drain.as_secs_f64().max(1e-9),
        first_ms.first().copied().unwrap_or(0.0),
        percentile(&first_ms, 0.5),
        writes as f64 / cfg.events.max(1) as f64,
        deliveries
    );
    println!("\n(b) latency, commit to the receiver's 2xx, one event at a time\n");
    println!("| state change | events | p50 (ms) | p99 (ms) | max (ms) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, ms) in [
        (
            "settle-shaped transaction (payment update + event)",
            settle_ms,
        ),
        ("real payment: Khalti simulator, customer's return", paid_ms),
    ] {
        let n = ms.len();
        let (p50, p99, max) = summary(ms);
        println!("| {name} | {n} | {p50:.1} | {p99:.1} | {max:.1} |");
    }
    let (w50, w99, _) = summary(write_ms);
    let (r50, r99, _) = summary(return_ms);
    println!(
        "\none write transaction (payment insert): p50 {w50:.2} ms, p99 {w99:.2} ms; \
         the customer's return (lookup + settle): p50 {r50:.1} ms, p99 {r99:.1} ms"
    );
    println!(
        "receiver: {total_deliveries} deliveries of {distinct} distinct events (duplicates: {})",
        total_deliveries.saturating_sub(distinct as u64)
    );
    Ok(())
}

/// A wait before the `i`th sequential commit, spread evenly over one poll
/// interval (golden-ratio steps): waiting for each arrival and committing
/// at once would always commit just after a poll, the worst phase.
fn phase(poll: Duration, i: usize) -> Duration {
    poll.mul_f64((i as f64 * 0.618_033_988_75).fract())
}

/// The `Location` of a redirect.
fn location(res: &reqwest::Response) -> std::result::Result<String, String> {
    res.headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("expected a redirect, got {}", res.status()))
}

/// The reconciler under a flood: on the local gateway (file-backed
/// embedded store, the eSewa simulator), `genuine` customers of one
/// project pay at eSewa and close the tab (only the reconciler can settle
/// them), first alone (the baseline), then again, from another project,
/// after `junk` abandoned eSewa attempts of a third project, all older.
/// Prints how many genuine payments each sweep settled, what it checked
/// and how long it took.
async fn reconciler_bench(junk: usize, genuine: usize) -> std::result::Result<(), String> {
    use futures::StreamExt;
    use shared::domain::attempts::{self, PayChoice};
    use shared::domain::checkout::{self, Creator};

    let tmp = std::env::temp_dir().join(format!("dhukuti-bench-rec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(|e| e.to_string())?);
    let settings = local_settings(&tmp)?;
    let running = dhukuti::start_with_store(settings, store.clone()).await?;
    let state = running.state.clone();
    let base = running.base_url.clone();
    let client = reqwest::Client::new();
    let now = SystemClock.now();
    let merchant = account::create_merchant(&*store, now, "Bench", "bench@shop.example", Plan::Pro)
        .await
        .map_err(|e| e.to_string())?;
    let mut creators = Vec::new();
    for name in ["Baseline shop", "Flooded", "Shop beside the flood"] {
        let project = account::create_project(&*store, now, &merchant, name, false)
            .await
            .map_err(|e| e.to_string())?;
        creators.push(Creator {
            // MIGRATION: the project's record is another area's, not yet typed.
            project_id: project.id,
            mode: Mode::Sandbox,
            api_key_id: shared::ids::ApiKeyId::stored("ak_bench"),
            spend_cap_paisa: None,
        });
    }
    // One abandoned (or, with `pay`, paid) eSewa attempt of a new session.
    let attempt = |creator: Creator, pay: bool| {
        let (state, base, client) = (state.clone(), base.clone(), client.clone());
        async move {
            let at = SystemClock.now();
            let req = serde_json::from_value(
                json!({"amount": 150_000, "returnUrl": "https://shop.example/done"}),
            )
            .map_err(|e| e.to_string())?;
            let valid = checkout::validate_create(req, Mode::Sandbox).map_err(|e| e.to_string())?;
            let s = checkout::create(&state, &creator, valid, at, None)
                .await
                .map_err(|e| e.to_string())?;
            let choice = PayChoice {
                provider: Some(Provider::Esewa),
                fonepay_web: false,
                address: None,
                from_page: false,
            };
            let started = attempts::start(&state, &s.id, choice, &base, at)
                .await
                .map_err(|e| e.to_string())?;
            if pay {
                // The customer's browser posts the hand-off form to eSewa...
                if let shared::providers::Handoff::AutoPostForm { action, fields } =
                    &started.handoff
                {
                    let client = reqwest::Client::builder()
                        .redirect(reqwest::redirect::Policy::none())
                        .build()
                        .map_err(|e| e.to_string())?;
                    let body = fields
                        .iter()
                        .fold(
                            form_urlencoded::Serializer::new(String::new()),
                            |mut f, (k, v)| {
                                f.append_pair(k, v);
                                f
                            },
                        )
                        .finish();
                    client
                        .post(action)
                        .header("content-type", "application/x-www-form-urlencoded")
                        .body(body)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                }
                // ...pays, and closes the tab before coming back.
                let reference = started
                    .payment
                    .attempt
                    .reference
                    .clone()
                    .unwrap_or_default();
                let url = format!("{base}/sim/esewa/_control/attempts/{reference}/pay");
                let res = client.post(&url).send().await.map_err(|e| e.to_string())?;
                if !res.status().is_success() {
                    return Err(format!("{url}: {}", res.status()));
                }
            }
            Ok::<String, String>(started.payment.id.to_string())
        }
    };
    let mut sweep_at = now.plus(chrono::Duration::minutes(2));
    let mut rows = Vec::new();
    for (label, flood) in [("baseline: no other work", 0), ("beside the flood", junk)] {
        if flood > 0 {
            let started = Instant::now();
            let made: Vec<_> =
                futures::stream::iter((0..flood).map(|_| attempt(creators[1].clone(), false)))
                    .buffer_unordered(16)
                    .collect()
                    .await;
            if let Some(Err(e)) = made.iter().find(|r| r.is_err()) {
                return Err(format!("junk attempt: {e}"));
            }
            eprintln!(
                "{flood} junk attempts in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let who = if flood > 0 {
            &creators[2]
        } else {
            &creators[0]
        };
        let mut ids = Vec::new();
        for _ in 0..genuine {
            ids.push(attempt(who.clone(), true).await?);
        }
        // Later than every attempt made: all are due.
        sweep_at = std::cmp::max(
            sweep_at,
            SystemClock.now().plus(chrono::Duration::minutes(2)),
        );
        let mut settled_by = Vec::new();
        for _ in 0..2 {
            let started = Instant::now();
            let report = attempts::sweep(&state, sweep_at)
                .await
                .map_err(|e| e.to_string())?;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            let mut settled = 0;
            for id in &ids {
                let p = payments::get(&*store, &shared::ids::PaymentId::stored(id.as_str()))
                    .await
                    .map_err(|e| e.to_string())?;
                if p.is_some_and(|p| p.status == PaymentStatus::Success) {
                    settled += 1;
                }
            }
            settled_by.push((settled, report.payments_checked, ms));
            sweep_at = sweep_at.plus(chrono::Duration::minutes(1));
        }
        rows.push((label, flood, settled_by));
    }
    println!(
        "| scenario | older junk attempts | genuine | settled after sweep 1 | after sweep 2 | sweep 1 checks | sweep 1 (ms) | sweep 2 checks | sweep 2 (ms) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, flood, s) in rows {
        println!(
            "| {label} | {flood} | {genuine} | {} | {} | {} | {:.0} | {} | {:.0} |",
            s[0].0, s[1].0, s[0].1, s[0].2, s[1].1, s[1].2
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
