//! Benchmark: `GET /v1/payments/{id}` on the local gateway against a bare
//! axum handler answering a fixed JSON body of the same size, on the same
//! machine in the same run, at the same concurrency; then `POST
//! /v1/checkout` (each request with its own `Idempotency-Key`, as a
//! merchant sends it) on the gateway.
//!
//!     cargo run --release -p dhukuti --bin bench -- [--seconds 10] [--connections 32]
//!
//! Prints a Markdown table for BENCHMARKS.md and the store calls one
//! request makes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use dhukuti::Settings;
use shared::domain::account::{self, KeyKind, NewKey, Plan, Scope};
use shared::domain::payments::{self, Payment, PaymentStatus};
use shared::domain::{Mode, Provider};
use shared::ids::{IdKind, new_id};
use shared::money::{Currency, Paisa};
use shared::store::Store;
use shared::store::counting::CountingStore;
use shared::store::embedded::EmbeddedStore;
use shared::time::{Clock, SystemClock};

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
    let seconds = arg("--seconds", 10);
    let connections = arg("--connections", 32) as usize;

    let tmp = std::env::temp_dir().join(format!("dhukuti-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let embedded: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(|e| e.to_string())?);
    let counting = Arc::new(CountingStore::new(embedded));
    let settings = Settings {
        addr: "127.0.0.1:0".parse().map_err(|_| "addr")?,
        data_dir: tmp.clone(),
        backend: shared::app::Backend::Embedded {
            data_dir: tmp.clone(),
        },
        init: false,
        demo_payments: false,
        public_url: None,
        sweep_every: None,
        provider_timeout: None,
    };
    let running = dhukuti::start_with_store(settings, counting.clone()).await?;

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
    let (key, _) = account::issue_api_key(store, now, &project, new)
        .await
        .map_err(|e| e.to_string())?;
    let payment = Payment {
        id: new_id(IdKind::Payment),
        project_id: project.id.clone(),
        checkout_session_id: new_id(IdKind::CheckoutSession),
        mode: Mode::Live,
        amount: Paisa::new(150_000).map_err(|e| e.to_string())?,
        amount_refunded: Paisa::ZERO,
        currency: Currency::Npr,
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
        if path.ends_with(&payment.id) {
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
    let checkout_url = format!("{base}/v1/checkout");
    for (name, target, post) in [
        ("bare axum, fixed body", &bare_url, None),
        ("gateway GET /v1/payments/{id}", &url, None),
        (
            "gateway POST /v1/checkout (Idempotency-Key each)",
            &checkout_url,
            Some(checkout_body),
        ),
    ] {
        // Warm up connections and caches.
        load(target, post, &key, connections, Duration::from_secs(1)).await;
        let (requests, errors, seconds, mut lat) =
            load(target, post, &key, connections, duration).await;
        lat.sort_unstable();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        results.push(Result {
            name,
            requests,
            errors,
            seconds,
            p50_us: pick(0.50),
            p99_us: pick(0.99),
        });
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
    println!("connections: {connections}; duration: {seconds} s per target\n");
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
    Ok(())
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
