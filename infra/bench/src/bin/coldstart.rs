//! Cold-start benchmark: starts a function's binary against a minimal fake
//! Lambda Runtime API on loopback and measures
//! - init: process start to its first `GET /runtime/invocation/next`;
//! - first invocation: the event handed over to the response posted back;
//! - peak RSS: the process's high-water mark (`VmHWM`) once it has answered;
//!
//! next to the hello-world `lambda_http` binary (`hello-lambda`), built the
//! same way. Every run is a fresh process.
//!
//!     cargo build --release -p dhukuti-bench --bins -p dhukuti-account -p dhukuti-payments
//!     cargo run --release -p dhukuti-bench --bin coldstart -- [--runs 20] [name[=path] ...]
//!
//! Without names it measures `hello-lambda`, `account` and `payments` from
//! its own directory; a name without a path is looked up there too (any
//! function: those without a route for the event answer 404, after the
//! same start; the queue- and stream-driven ones get an empty batch; an
//! invocation error is reported as the status, not a failure).
//! `hello-lambda` is always measured, as the baseline; each run starts
//! every binary once, in turn (so drift in the machine's speed reaches them
//! all alike), each run one place further along the list, each start after
//! a pause for the last one's work to settle; the medians are over the
//! runs. The ratio to hello-lambda is the median of the runs' own ratios
//! (each binary's init over hello-lambda's in the same run), with their
//! quartiles: a paired measure, which the machine's slow and fast spells
//! move far less than a ratio of two medians.
//!
//! The functions get the environment of this process (so with
//! `DHUKUTI_BACKEND=aws`, `AWS_ENDPOINT_URL`, `DHUKUTI_TABLE`, ... they
//! talk to DynamoDB or moto), and this harness first seeds a merchant, a
//! key and a payment through the same `AppState::from_env`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};
use shared::AppState;
use shared::domain::Mode;
use shared::domain::Provider;
use shared::domain::account::{self, KeyKind, NewKey, Plan, Scope};
use shared::domain::payments::{self, Payment, PaymentStatus};
use shared::money::{Currency, Paisa};
use tokio::sync::{Mutex, mpsc};

#[derive(Default)]
struct Run {
    event: Option<Value>,
    served: bool,
    sent_at: Option<Instant>,
}

struct Fake {
    run: Mutex<Run>,
    events: mpsc::UnboundedSender<(&'static str, Instant, String)>,
}

async fn next(State(fake): State<Arc<Fake>>) -> impl IntoResponse {
    let now = Instant::now();
    let _ = fake.events.send(("next", now, String::new()));
    let mut run = fake.run.lock().await;
    if run.served {
        drop(run);
        // One invocation per process: later polls wait until it is killed.
        std::future::pending::<()>().await;
        return (StatusCode::OK, HeaderMap::new(), String::new());
    }
    run.served = true;
    run.sent_at = Some(Instant::now());
    let mut headers = HeaderMap::new();
    headers.insert(
        "lambda-runtime-aws-request-id",
        HeaderValue::from_static("8476a536-e9f4-11e8-9739-2dfe598c3fcd"),
    );
    headers.insert(
        "lambda-runtime-deadline-ms",
        HeaderValue::from_static("4102444800000"),
    );
    headers.insert(
        "lambda-runtime-invoked-function-arn",
        HeaderValue::from_static("arn:aws:lambda:ap-south-1:123456789012:function:bench"),
    );
    headers.insert(
        "lambda-runtime-trace-id",
        HeaderValue::from_static(
            "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1",
        ),
    );
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    (
        StatusCode::OK,
        headers,
        run.event.clone().unwrap_or(Value::Null).to_string(),
    )
}

async fn response(
    State(fake): State<Arc<Fake>>,
    Path(_id): Path<String>,
    body: String,
) -> StatusCode {
    let _ = fake.events.send(("response", Instant::now(), body));
    StatusCode::ACCEPTED
}

async fn error(State(fake): State<Arc<Fake>>, body: String) -> StatusCode {
    let _ = fake.events.send(("error", Instant::now(), body));
    StatusCode::ACCEPTED
}

fn http_event(path: &str, key: &str) -> Value {
    json!({
        "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
        "headers": {"authorization": format!("Bearer {key}"), "host": "bench.execute-api.ap-south-1.amazonaws.com"},
        "requestContext": {"accountId": "123456789012", "apiId": "bench", "domainName": "bench", "domainPrefix": "bench",
            "http": {"method": "GET", "path": path, "protocol": "HTTP/1.1", "sourceIp": "203.0.113.7", "userAgent": "bench"},
            "requestId": "bench-request", "routeKey": "$default", "stage": "$default",
            "time": "22/Nov/2026:01:30:00 +0000", "timeEpoch": 1795397400000i64},
        "isBase64Encoded": false
    })
}

struct Sample {
    init: Duration,
    first: Duration,
    status: String,
    /// `VmHWM` of the process after its first answer, in KiB.
    peak_kib: u64,
}

/// The peak resident set of process `pid` so far (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

async fn measure(bin: &PathBuf, event: Value) -> Result<Sample, String> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fake = Arc::new(Fake {
        run: Mutex::new(Run {
            event: Some(event),
            ..Default::default()
        }),
        events: tx,
    });
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .route("/2018-06-01/runtime/init/error", post(error))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let started = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "bench")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;

    let mut init = None;
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (what, at, body) = tokio::select! {
                got = rx.recv() => match got {
                    Some(got) => got,
                    None => return Err("runtime API closed".to_owned()),
                },
                // A start that fails (a missing setting) exits without a word.
                exit = child.wait() => return Err(format!(
                    "{} exited before answering ({}); run it alone to see why",
                    bin.display(),
                    exit.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
                )),
            };
            match what {
                "next" if init.is_none() => init = Some(at - started),
                "response" => return Ok((at, body)),
                // Still a start to measure (an event the function does
                // not take, a route it lacks): the status says so.
                "error" => {
                    let kind = serde_json::from_str::<Value>(&body)
                        .ok()
                        .and_then(|b| b["errorType"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let status = json!({ "statusCode": format!("error {kind}") });
                    return Ok((at, status.to_string()));
                }
                _ => {}
            }
        }
    })
    .await
    .map_err(|_| format!("{} did not answer within 30 s", bin.display()))??;
    let peak_kib = child.id().and_then(peak_rss_kib).unwrap_or(0);
    let _ = child.kill().await;
    server.abort();
    let sent_at = fake.run.lock().await.sent_at.ok_or("no event was sent")?;
    let body: Value = serde_json::from_str(&outcome.1).unwrap_or(Value::Null);
    Ok(Sample {
        init: init.ok_or("no poll")?,
        first: outcome.0 - sent_at,
        status: body["statusCode"].to_string(),
        peak_kib,
    })
}

/// The functions driven by SQS or a DynamoDB stream rather than HTTP: they
/// get an empty batch.
const QUEUE_DRIVEN: &[&str] = &[
    "mail-dispatcher",
    "sms-dispatcher",
    "webhook-dispatcher",
    "webhook-fanout",
];

/// The pause before each start, for the previous one's work (the
/// harness's, moto's) to finish.
const SETTLE: Duration = Duration::from_millis(30);

/// One binary's starts over the run.
#[derive(Default)]
struct Starts {
    inits: Vec<Duration>,
    firsts: Vec<Duration>,
    status: String,
    peak_kib: u64,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The quartiles (25th, 50th, 75th percentile) of `v`; zeros when empty.
fn quartiles(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(f64::total_cmp);
    let at = |q: usize| v.get(v.len() * q / 4).copied().unwrap_or_default();
    [at(1), at(2), at(3)]
}

/// Each run's init of `inits` over hello-lambda's init of the same run.
fn paired_ratios(inits: &[Duration], hello: &[Duration]) -> Vec<f64> {
    inits
        .iter()
        .zip(hello)
        .filter(|(_, h)| !h.is_zero())
        .map(|(i, h)| i.as_secs_f64() / h.as_secs_f64())
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs_at = args.iter().position(|a| a == "--runs");
    let runs: usize = runs_at
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let named: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, _)| runs_at.is_none_or(|r| *i != r && *i != r + 1))
        .map(|(_, a)| a)
        .collect();
    let dir = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .parent()
        .map(PathBuf::from)
        .ok_or("no exe dir")?;

    // Seed through the same configuration the functions read.
    let state = AppState::from_env().await?;
    let store = &*state.store;
    let now = state.clock.now();
    let err = |e: shared::store::StoreError| e.to_string();
    let m = account::create_merchant(store, now, "Cold Start", "cold@start.example", Plan::Pro)
        .await
        .map_err(err)?;
    let p = account::create_project(store, now, &m, "Cold", false)
        .await
        .map_err(err)?;
    let new = NewKey {
        mode: Mode::Live,
        kind: KeyKind::Secret,
        scopes: Scope::ALL.to_vec(),
        description: "coldstart".into(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    let (key, _) = account::issue_api_key(&state, now, &p, new)
        .await
        .map_err(err)?;
    let payment = Payment {
        id: shared::ids::PaymentId::new(),
        project_id: p.id.clone(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: Mode::Live,
        amount: Paisa::new(1000).map_err(|e| e.to_string())?,
        amount_refunded: Paisa::ZERO,
        currency: Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider: Provider::Esewa,
        status: PaymentStatus::Success,
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
    payments::insert(store, &payment).await.map_err(err)?;
    drop(state); // the embedded store is single-process: release it

    let route = |name: &str| match name {
        "account" => "/v1/account".to_owned(),
        "payments" => format!("/v1/payments/{}", payment.id),
        _ => "/".to_owned(),
    };
    let mut targets = vec![("hello-lambda".to_owned(), dir.join("hello-lambda"))];
    let names: Vec<String> = if named.is_empty() {
        vec!["account".into(), "payments".into()]
    } else {
        named.iter().map(|n| n.to_string()).collect()
    };
    for n in names {
        match n.split_once('=') {
            Some((name, path)) => targets.push((name.to_owned(), PathBuf::from(path))),
            None => targets.push((n.clone(), dir.join(&n))),
        }
    }
    println!("runs per binary: {runs}, the binaries in turn in each run\n");
    println!(
        "| binary | init p50 (ms) | first invocation p50 (ms) | init vs hello, runs' p50 (p25-p75) | peak RSS (MiB) | status |"
    );
    println!("|---|---:|---:|---:|---:|---|");
    // Round-robin: each run starts every binary once, in turn, so a
    // change in the machine's speed during the run reaches all of them
    // alike instead of skewing the ratio against whichever ran then. Each
    // run begins one place further along the list, so no binary always
    // follows the same one, and every start waits for the machine to
    // settle: a first invocation that called moto leaves it busy for a
    // few milliseconds, which would otherwise slow whichever start came
    // next.
    let mut samples: Vec<Starts> = targets.iter().map(|_| Starts::default()).collect();
    for run in 0..runs {
        for turn in 0..targets.len() {
            let at = (run + turn) % targets.len();
            let (name, bin) = &targets[at];
            let seen = &mut samples[at];
            tokio::time::sleep(SETTLE).await;
            let base = name.split('.').next().unwrap_or(name);
            let event = if QUEUE_DRIVEN.contains(&base) {
                json!({ "Records": [] })
            } else {
                http_event(&route(base), &key)
            };
            let s = measure(bin, event).await?;
            seen.inits.push(s.init);
            seen.firsts.push(s.first);
            seen.status = s.status;
            seen.peak_kib = seen.peak_kib.max(s.peak_kib);
        }
    }
    let hello = samples.first().map(|s| s.inits.clone()).unwrap_or_default();
    for ((name, _), seen) in targets.iter().zip(samples) {
        let [low, ratio, high] = quartiles(paired_ratios(&seen.inits, &hello));
        println!(
            "| {name} | {:.2} | {:.2} | {ratio:.2}x ({low:.2}-{high:.2}) | {:.1} | {} |",
            median(seen.inits).as_secs_f64() * 1000.0,
            median(seen.firsts).as_secs_f64() * 1000.0,
            seen.peak_kib as f64 / 1024.0,
            seen.status
        );
    }
    Ok(())
}
