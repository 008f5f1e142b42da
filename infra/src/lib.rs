//! The local gateway: every function's router in one axum app on
//! 127.0.0.1, on the embedded store in a data directory. Same handlers,
//! same domain as on Lambda; no second code path.

pub mod demo;
pub mod simulators;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use shared::app::Backend;
use shared::blobs::Blobs;
use shared::http::with_edge;
use shared::queue::Queue;
use shared::store::Store;
use shared::time::{Clock, SystemClock};
use shared::{AppState, Config};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use demo::DemoKeys;

/// Every function's routes, plus `GET /health`.
pub fn app(state: AppState) -> Router {
    let sim_base = format!("{}/sim", state.config.public_base_url);
    with_edge(
        Router::new()
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .merge(account::router(state.clone()))
            .merge(payments::router(state.clone()))
            .merge(checkout::router(state))
            .nest("/sim", simulator_routes(&sim_base)),
    )
}

/// The provider simulators under `/sim`, answering in their providers'
/// own shapes: marked so the edge does not turn their errors into ours.
fn simulator_routes(public_base: &str) -> Router {
    simulators::router(simulators::SimState::with_base_url(public_base)).layer(
        axum::middleware::map_response(|mut res: axum::response::Response| async move {
            res.extensions_mut().insert(shared::http::error::Enveloped);
            res
        }),
    )
}

/// How the gateway is started (environment variables and flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `DHUKUTI_ADDR`, default `127.0.0.1:8080`; port 0 picks a free one.
    pub addr: SocketAddr,
    /// `DHUKUTI_DATA_DIR`, default `.dhukuti` in the working directory:
    /// the embedded store and `demo-keys.json`.
    pub data_dir: PathBuf,
    /// `DHUKUTI_BACKEND` (`embedded` or `aws`) and its settings.
    pub backend: Backend,
    /// `--init`: create the AWS table, queues and bucket if missing.
    pub init: bool,
    /// `--demo-payments` or `DHUKUTI_DEMO_PAYMENTS=1`: seed sample payments.
    pub demo_payments: bool,
    /// `DHUKUTI_PUBLIC_URL`, default `http://<addr>`.
    pub public_url: Option<String>,
}

impl Settings {
    pub fn from_env_and_args(args: &[String]) -> Result<Settings, String> {
        let addr_text = std::env::var("DHUKUTI_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
        let addr: SocketAddr = addr_text.parse().map_err(|_| {
            format!("DHUKUTI_ADDR={addr_text:?} is not an address like 127.0.0.1:8080")
        })?;
        let data_dir = std::env::var("DHUKUTI_DATA_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(".dhukuti"));
        let backend = Backend::from_env()?;
        let mut init = false;
        let mut demo_payments = matches!(
            std::env::var("DHUKUTI_DEMO_PAYMENTS").as_deref(),
            Ok("1") | Ok("true") | Ok("yes")
        );
        for arg in args {
            match arg.as_str() {
                "--demo-payments" => demo_payments = true,
                "--init" => init = true,
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
            }
        }
        Ok(Settings {
            addr,
            data_dir,
            backend,
            init,
            demo_payments,
            public_url: std::env::var("DHUKUTI_PUBLIC_URL").ok(),
        })
    }
}

pub const USAGE: &str = "\
Usage: cargo run [-- [--demo-payments] [--init]]

Starts every Dhukuti function in one process, on the embedded store or
(DHUKUTI_BACKEND=aws) on DynamoDB, SQS and S3.

  --demo-payments         seed sample payments (once)
  --init                  with DHUKUTI_BACKEND=aws: create the table, queues
                          and bucket if they are missing

Environment:
  DHUKUTI_ADDR            listen address (default 127.0.0.1:8080)
  DHUKUTI_DATA_DIR        data directory (default ./.dhukuti)
  DHUKUTI_BACKEND         embedded (default) or aws
  DHUKUTI_TABLE, DHUKUTI_QUEUE_PREFIX, DHUKUTI_BUCKET
                          AWS resource names (default dhukuti,
                          dhukuti, dhukuti-documents)
  AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, ...
                          the standard AWS environment (moto: its URL)
  DHUKUTI_PUBLIC_URL      public base URL of hosted pages (default http://<addr>)
  DHUKUTI_DEMO_PAYMENTS   1 to seed sample payments (same as --demo-payments)
  RUST_LOG                log filter (default info)";

/// A started gateway.
pub struct Running {
    pub addr: SocketAddr,
    pub base_url: String,
    pub keys: DemoKeys,
    pub keys_file: PathBuf,
    pub store: Arc<dyn Store>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Stops accepting, finishes in-flight requests and closes the store.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    /// Serves until the process gets Ctrl-C (or SIGTERM).
    pub async fn until_signal(self) -> std::io::Result<()> {
        shutdown_signal().await;
        tracing::info!("shutting down");
        self.stop().await
    }
}

/// Opens the store, creates the demo merchant on first start, binds and
/// starts serving. Returns once `/health` would answer.
pub async fn start(settings: Settings) -> Result<Running, String> {
    let (store, queue, blobs) = settings.backend.open(settings.init).await?;
    start_with(settings, store, queue, blobs).await
}

/// [`start`] on a store the caller opened (benchmarks wrap it to count
/// calls). The data directory still holds `demo-keys.json`.
pub async fn start_with_store(
    settings: Settings,
    store: Arc<dyn Store>,
) -> Result<Running, String> {
    let queue: Arc<dyn Queue> = Arc::new(shared::queue::memory::InProcessQueue::new());
    let blobs: Arc<dyn Blobs> = Arc::new(shared::blobs::memory::MemoryBlobs::new());
    start_with(settings, store, queue, blobs).await
}

/// [`start`] on backends the caller opened.
pub async fn start_with(
    settings: Settings,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    blobs: Arc<dyn Blobs>,
) -> Result<Running, String> {
    start_with_clock(settings, store, queue, blobs, Arc::new(SystemClock)).await
}

/// [`start_with`] reading the time from `clock` (tests move it by hand,
/// e.g. past a checkout session's expiry).
pub async fn start_with_clock(
    settings: Settings,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    blobs: Arc<dyn Blobs>,
    clock: Arc<dyn Clock>,
) -> Result<Running, String> {
    std::fs::create_dir_all(&settings.data_dir).map_err(|e| {
        format!(
            "cannot create data directory {}: {e}",
            settings.data_dir.display()
        )
    })?;

    let listener = TcpListener::bind(settings.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let base_url = settings
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    let config = Config {
        public_base_url: base_url.trim_end_matches('/').to_owned(),
    };
    let state = AppState::new(store.clone(), clock, config)
        .with_queue(queue)
        .with_blobs(blobs);

    let keys_file = settings.data_dir.join("demo-keys.json");
    let demo = demo::bootstrap(&state, &keys_file).await?;
    if settings.demo_payments {
        let n = demo::seed_payments(&state, &demo)
            .await
            .map_err(|e| e.to_string())?;
        if n > 0 {
            tracing::info!(payments = n, "seeded demo payments");
        }
    }

    let (tx, rx) = oneshot::channel::<()>();
    let router = app(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
    });
    Ok(Running {
        addr,
        base_url,
        keys: demo.keys,
        keys_file,
        store,
        shutdown: Some(tx),
        task,
    })
}

/// What a newcomer sees after `cargo run`.
pub fn banner(running: &Running, settings: &Settings) -> String {
    let data_dir = &settings.data_dir;
    let url = &running.base_url;
    let sandbox = &running.keys.sandbox;
    [
        String::new(),
        format!("Dhukuti local gateway on {url}  (health: {url}/health)"),
        format!("  backend         {}", settings.backend.describe()),
        format!("  data directory  {}", data_dir.display()),
        format!("  sandbox key     {sandbox}"),
        format!("  live key        {}", running.keys.live),
        format!("  keys file       {}", running.keys_file.display()),
        String::new(),
        "Try:".to_owned(),
        format!("  curl -s {url}/v1/account -H 'Authorization: Bearer {sandbox}'"),
        format!("  curl -s '{url}/v1/payments?limit=5' -H 'Authorization: Bearer {sandbox}'"),
        String::new(),
    ]
    .join("\n")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
