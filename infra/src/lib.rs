//! The local gateway: every function's router in one axum app on
//! 127.0.0.1, on the embedded store in a data directory. Same handlers,
//! same domain as on Lambda; no second code path.

pub mod counter;
pub mod demo;
pub mod listen;
pub mod mail_worker;
pub mod queue_worker;
pub mod sam_local;
pub mod simulators;
pub mod sms_worker;
pub mod webhooks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::{Json, Router};
use edge::with_edge;
use serde_json::json;
use shared::app::Backend;
use shared::blobs::Blobs;
use shared::domain::Mode;
use shared::domain::credentials::{CredentialsError, CredentialsKey, CredentialsKeys};
use shared::domain::webhooks::WebhookSettings;
use shared::limits::rate::RateLimits;
use shared::providers::{ProviderConfig, ProviderHub, SandboxAccounts};
use shared::queue::Queue;
use shared::store::Store;
use shared::time::{Clock, SystemClock};
use shared::{AppState, Config};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use demo::DemoKeys;

/// Every function's routes, plus `GET /health`, the API reference
/// (`/openapi.json`, `/docs`) and the simulators under `/sim`.
pub fn app(state: AppState) -> Router {
    let sim = simulators::SimState::with_base_url(format!("{}/sim", state.config.public_base_url));
    app_with_simulators(state, sim, Router::new())
}

/// [`app`] with simulators of the caller's configuration, and `extra`
/// routes (the demo counter) behind the same edge.
pub fn app_with_simulators(state: AppState, sim: simulators::SimState, extra: Router) -> Router {
    let document: Arc<str> = Arc::from(edge::openapi::to_json(&openapi(&state)));
    with_edge(
        Router::new()
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .merge(account::router(state.clone()))
            .merge(payments::router(state.clone()))
            .merge(checkout::router(state.clone()))
            .merge(refunds::router(state.clone()))
            .merge(reports::router(state.clone()))
            .merge(reports::download_router(state.clone()))
            .merge(settlements::router(state.clone()))
            .merge(reconciliation::router(state.clone()))
            .merge(reconciliation::upload_router(state.clone()))
            .merge(payment_links::router(state.clone()))
            .merge(webhooks_api::router(state.clone()))
            .merge(invoices::router(state.clone()))
            .merge(billing::router(state.clone()))
            .merge(sms::router(state.clone()))
            .merge(qr::router(state.clone()))
            .merge(mobile::router(state.clone()))
            .merge(dashboard::router(state.clone()))
            .merge(dashboard::documents_router(state.clone()))
            .merge(hosted::router(state))
            .merge(docs::router(document))
            .merge(extra)
            .nest("/sim", simulator_routes(sim)),
    )
}

/// The OpenAPI document of every `/v1` route: built from the same
/// route tables the functions serve (`edge::openapi`).
pub fn openapi(state: &AppState) -> utoipa::openapi::OpenApi {
    let parts = [
        account::routes(state),
        payments::routes(state),
        checkout::routes(state),
        refunds::routes(state),
        reports::routes(state),
        settlements::routes(state),
        reconciliation::routes(state),
        payment_links::routes(state),
        webhooks_api::routes(state),
        invoices::routes(state),
        billing::routes(state),
        sms::routes(state),
        qr::routes(state),
        mobile::routes(state),
    ];
    let mut api = utoipa::openapi::OpenApi::default();
    for part in parts {
        api.merge(part.split_for_parts().1);
    }
    edge::openapi::finish(api, webhooks_api::events())
}

/// The document as JSON, the same whatever the state (the committed
/// copy, `docs/openapi.json`, is this): `cargo run -- --openapi`.
pub fn openapi_json() -> Result<String, String> {
    let store = shared::store::embedded::EmbeddedStore::in_memory()
        .map_err(|e| format!("in-memory store: {e}"))?;
    let state = AppState::new(
        Arc::new(store),
        Arc::new(SystemClock),
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    Ok(edge::openapi::to_json(&openapi(&state)))
}

/// The provider simulators under `/sim`, answering in their providers'
/// own shapes: marked so the edge does not turn their errors into ours.
fn simulator_routes(sim: simulators::SimState) -> Router {
    simulators::router(sim).layer(axum::middleware::map_response(
        |mut res: axum::response::Response| async move {
            res.extensions_mut().insert(edge::error::Enveloped);
            res
        },
    ))
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
    /// `DHUKUTI_DASHBOARD_URL`: the dashboard's own base URL (its own
    /// host); default none, the dashboard beside the hosted pages.
    pub dashboard_url: Option<String>,
    /// `DHUKUTI_SWEEP_SECONDS` (default 30; 0 = off): how often the
    /// in-process scheduler expires sessions and reconciles payments.
    pub sweep_every: Option<Duration>,
    /// Overrides `DHUKUTI_PROVIDER_TIMEOUT_MS` (tests shorten it).
    pub provider_timeout: Option<Duration>,
    /// Webhook receivers allowed, retry schedule, timeouts.
    pub webhooks: WebhookSettings,
    /// How often the outbox is fanned out into deliveries (`None`: never;
    /// then no webhook is delivered by this process).
    pub webhook_poll: Option<Duration>,
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
        let mut webhooks = WebhookSettings::from_env()?;
        let mut demo_payments = matches!(
            std::env::var("DHUKUTI_DEMO_PAYMENTS").as_deref(),
            Ok("1") | Ok("true") | Ok("yes")
        );
        for arg in args {
            match arg.as_str() {
                "--demo-payments" => demo_payments = true,
                "--init" => init = true,
                "--allow-local-webhooks" => webhooks.allow_local_http = true,
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
            dashboard_url: std::env::var("DHUKUTI_DASHBOARD_URL")
                .ok()
                .filter(|v| !v.trim().is_empty()),
            sweep_every: sweep_every()?,
            provider_timeout: None,
            webhooks,
            webhook_poll: webhook_poll()?,
        })
    }
}

fn sweep_every() -> Result<Option<Duration>, String> {
    match std::env::var("DHUKUTI_SWEEP_SECONDS") {
        Err(_) => Ok(Some(Duration::from_secs(30))),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(n) if n <= 3600 => Ok(Some(Duration::from_secs(n))),
            _ => Err(format!(
                "DHUKUTI_SWEEP_SECONDS={v:?} must be seconds from 0 (off) to 3600"
            )),
        },
    }
}

fn webhook_poll() -> Result<Option<Duration>, String> {
    match std::env::var("DHUKUTI_WEBHOOK_POLL_MS") {
        Err(_) => Ok(Some(Duration::from_millis(250))),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(n) if n <= 60_000 => Ok(Some(Duration::from_millis(n))),
            _ => Err(format!(
                "DHUKUTI_WEBHOOK_POLL_MS={v:?} must be milliseconds from 0 (off) to 60000"
            )),
        },
    }
}

pub const USAGE: &str = "\
Usage: cargo run [-- [--demo-payments] [--init] [--allow-local-webhooks]]
       cargo run -- --init-only

Starts every Dhukuti function in one process, on the embedded store or
(DHUKUTI_BACKEND=aws) on DynamoDB, SQS and S3.

  --demo-payments         seed sample payments (once)
  --init                  with DHUKUTI_BACKEND=aws: create the table, queues
                          and bucket if they are missing
  --init-only             the same, then exit (no gateway); with
                          DHUKUTI_CREDENTIALS_KEY_SECRET also that secret,
                          holding a new master key (SAM local: infra/README.md)
  --allow-local-webhooks  sandbox webhook endpoints may be http://127.0.0.1
                          or http://localhost (same as
                          DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP=1); never live

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
  DHUKUTI_SWEEP_SECONDS   scheduler period (default 30; 0 turns it off)
  DHUKUTI_WEBHOOK_POLL_MS outbox fan-out period (default 250; 0 turns webhook
                          delivery off)
  DHUKUTI_WEBHOOK_RETRY_SECONDS
                          comma-separated waits replacing the retry schedule
                          (default 60,300,1800,7200,18000,36000,86400,86400)
  DHUKUTI_PROVIDERS_BASE_URL
                          sandbox providers (default: the simulators at
                          <public url>/sim); see README for each provider
  DHUKUTI_SMS_BASE_URL, DHUKUTI_SMS_TOKEN, DHUKUTI_SMS_FROM
                          the SMS provider of live reminders (default: the
                          simulator at <public url>/sim/sms and its token)
  DHUKUTI_CREDENTIALS_KEY master key of stored provider credentials
                          (default: generated into <data dir>/credentials.key)
  DHUKUTI_RATE_LIMIT_LIVE, DHUKUTI_RATE_LIMIT_SANDBOX
                          requests per second per API key (default 100, 25)
  RUST_LOG                log filter (default info)";

/// A started gateway.
pub struct Running {
    pub addr: SocketAddr,
    pub base_url: String,
    pub keys: DemoKeys,
    pub keys_file: PathBuf,
    pub store: Arc<dyn Store>,
    /// The state every function shares (tests sweep with it).
    pub state: AppState,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    ticker: Option<JoinHandle<()>>,
    webhook_loops: Vec<JoinHandle<()>>,
    sms_worker: Option<JoinHandle<()>>,
    mail_worker: Option<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, finishes in-flight requests and closes the store.
    pub async fn stop(mut self) -> std::io::Result<()> {
        // Stop the background tasks and wait until they are gone: they hold
        // the store, and the embedded store's file stays locked until the
        // last holder drops it (a restart would find it "already open").
        let mut background: Vec<JoinHandle<()>> = self.webhook_loops.drain(..).collect();
        background.extend(self.ticker.take());
        background.extend(self.sms_worker.take());
        background.extend(self.mail_worker.take());
        for t in &background {
            t.abort();
        }
        for t in background {
            let _ = t.await;
        }
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
    let base_url = base_url.trim_end_matches('/').to_owned();
    let config = Config {
        public_base_url: base_url.clone(),
        events_base_url: None,
        dashboard_base_url: settings
            .dashboard_url
            .as_deref()
            .map(|u| u.trim().trim_end_matches('/').to_owned()),
    };
    let sim_base = format!("{base_url}/sim");
    // Sandbox providers: the simulators, unless the environment names
    // other hosts (e.g. the providers' real test environments).
    let sandbox = ProviderConfig::from_lookup(Mode::Sandbox, |name| {
        std::env::var(name)
            .ok()
            .or_else(|| (name == "DHUKUTI_PROVIDERS_BASE_URL").then(|| sim_base.clone()))
    })
    .map_err(|e| e.to_string())?;
    let mut live = ProviderConfig::from_env(Mode::Live).map_err(|e| e.to_string())?;
    let sandbox = match settings.provider_timeout {
        Some(t) => {
            live = live.with_timeout(t);
            sandbox.with_timeout(t)
        }
        None => sandbox,
    };
    let keys = credentials_keys(&settings.data_dir)?;
    let mut accounts = SandboxAccounts::from_env();
    if accounts.khalti.is_none() && sandbox.khalti_base_url.starts_with(&sim_base) {
        // Khalti is the simulator: its key.
        accounts.khalti = SandboxAccounts::default().khalti;
    }
    let hub = ProviderHub::new(&sandbox, &live, Some(keys), accounts).map_err(|e| e.to_string())?;
    let rate_limits = RateLimits::from_env()?;
    let public_limits = shared::limits::public::PublicLimits::from_env()?;
    // One process by construction: count in memory.
    let (rate_limits, public_limits) = if store.single_process() {
        (
            rate_limits.counted_in_process(),
            public_limits.counted_in_process(),
        )
    } else {
        (rate_limits, public_limits)
    };
    let state = AppState::new(store.clone(), clock, config)
        .with_queue(queue)
        .with_blobs(blobs)
        .with_providers(hub)
        .with_webhooks(settings.webhooks.clone())
        .with_rate_limits(rate_limits)
        .with_public_limits(public_limits)
        .with_background_work(true);
    // A simulated "timeout" outlasts the client's own timeout.
    let mut sim_config = simulators::SimConfig::new(sim_base.clone());
    sim_config.timeout_delay = sandbox.timeout + Duration::from_secs(2);
    // A sandbox Fonepay QR (real money) is payable only while its month-cap
    // hold lasts: the simulator refuses it after as long.
    sim_config.fonepay_qr_expiry = Some(
        shared::domain::fonepay_cap::HOLD_WINDOW
            .to_std()
            .unwrap_or(Duration::from_secs(30 * 60)),
    );
    let sim = simulators::SimState::new(sim_config);

    let keys_file = settings.data_dir.join("demo-keys.json");
    let demo = demo::bootstrap(&state, &keys_file).await?;
    demo::ensure_fonepay_credentials(&state, &demo).await?;
    if settings.demo_payments {
        let n = demo::seed_payments(&state, &demo)
            .await
            .map_err(|e| e.to_string())?;
        if n > 0 {
            tracing::info!(payments = n, "seeded demo payments");
        }
    }

    let ticker = settings.sweep_every.map(|every| {
        let state = state.clone();
        let reports_busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = shared::domain::attempts::sweep(&state, state.clock.now()).await {
                    tracing::warn!(error = %e, "sweep failed; next tick retries");
                }
                // The billing engine, as the scheduler function runs it.
                let billing = shared::domain::billing::sweep::sweep(
                    &state,
                    state.clock.now(),
                    shared::domain::billing::sweep::BUDGET,
                )
                .await;
                if let Err(e) = billing {
                    tracing::warn!(error = %e, "billing sweep failed; next tick retries");
                }
                // Then its notices (reminders, dunning), as the scheduler.
                let noticed = shared::domain::notices::pass(
                    &state,
                    state.clock.now(),
                    shared::domain::billing::sweep::BUDGET,
                )
                .await;
                if let Err(e) = noticed {
                    tracing::warn!(error = %e, "billing notices pass failed; next tick retries");
                }
                let refunds = shared::domain::billing::invoice::refund_due::sweep(
                    &state,
                    state.clock.now(),
                )
                .await;
                if let Err(e) = refunds {
                    tracing::warn!(error = %e, "overpayment refund sweep failed; next tick retries");
                }
                // Exports no task finished (a restart), as the report
                // runner does on AWS: in a task of their own (a million
                // rows take minutes; the tick goes on), one at a time.
                if shared::domain::reports::kick((*state).clone(), reports_busy.clone()).is_none() {
                    tracing::debug!("the last tick's report runs still go");
                }
                // Sandbox test clocks left advancing, as the scheduler does.
                let deadline = std::time::Instant::now() + shared::domain::clocks::RUN_DEADLINE;
                if let Err(e) = shared::domain::clocks::finish_advancing(&state, deadline).await {
                    tracing::warn!(error = %e, "test clocks failed; next tick retries");
                }
                // The daily Khalti pull (yesterday's run per tenant with
                // Khalti credentials), as the scheduler does.
                let daily = shared::domain::reconciliation::daily::daily(
                    &state,
                    state.clock.now(),
                    std::time::Instant::now() + shared::domain::reconciliation::daily::RUN_DEADLINE,
                )
                .await;
                if let Err(e) = daily {
                    tracing::warn!(error = %e, "daily Khalti pull failed; next tick resumes");
                }
            }
        })
    });

    let webhook_loops = match settings.webhook_poll {
        Some(every) => webhooks::spawn(&state, every)?,
        None => Vec::new(),
    };

    // SMS reminders: the simulator unless the environment names a provider.
    let sms_config = shared::providers::sms::SmsConfig::from_lookup(|name| {
        std::env::var(name).ok().or_else(|| match name {
            "DHUKUTI_SMS_BASE_URL" => Some(format!("{sim_base}/sms")),
            "DHUKUTI_SMS_TOKEN" => Some(simulators::sms::SMS_TEST_TOKEN.to_owned()),
            _ => None,
        })
    })?;
    let sms_client = shared::providers::sms::SmsClient::new(sms_config)?;
    let sms_worker = Some(sms_worker::spawn(&state, sms_client));

    // Billing mail: the simulator unless the environment names SES (no
    // DHUKUTI_MAIL_BASE_URL and DHUKUTI_MAIL_SES=1). Its bounce and
    // complaint control endpoint feeds the mail queue, as SNS does on AWS.
    let mail_sender = mail_sender(&sim_base)?;
    sim.wire_mail_feedback(state.queue.clone());
    let mail_worker = Some(mail_worker::spawn(&state, mail_sender));

    let (tx, rx) = oneshot::channel::<()>();
    // The demo counter (`/demo/counter`) asks the API with the demo key,
    // server side.
    let counter = counter::routes(base_url.clone(), demo.keys.sandbox.clone());
    let router = app_with_simulators(state.clone(), sim, counter);
    let task = tokio::spawn(async move {
        // The peer's address: the public routes' per-client limits.
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
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
        state,
        shutdown: Some(tx),
        task,
        ticker,
        webhook_loops,
        sms_worker,
        mail_worker,
    })
}

/// The local gateway's mail sender: `DHUKUTI_MAIL_BASE_URL`, else the
/// simulator at `<sim_base>/mail`; SES (`AWS_ENDPOINT_URL`, e.g. moto)
/// when `DHUKUTI_MAIL_SES=1`.
fn mail_sender(sim_base: &str) -> Result<shared::providers::mail::MailSender, String> {
    use shared::providers::mail::{HttpSender, MailConfig, MailSender};
    let ses = std::env::var("DHUKUTI_MAIL_SES").is_ok_and(|v| v.trim() == "1");
    let config = MailConfig::from_lookup(|name| {
        std::env::var(name).ok().or_else(|| match name {
            "DHUKUTI_MAIL_BASE_URL" if !ses => Some(format!("{sim_base}/mail")),
            _ => None,
        })
    })?;
    if let Some(base) = config.base_url.clone() {
        return HttpSender::new(config, base).map(MailSender::Http);
    }
    let endpoint = std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let sdk = shared::aws::sdk_config(endpoint.as_deref())?;
    MailSender::new(config, &sdk)
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
        format!(
            "  publishable     {} (apps: mobile endpoints only)",
            running.keys.sandbox_publishable
        ),
        format!(
            "  dashboard       {}/dashboard  ({} / {})",
            settings
                .dashboard_url
                .as_deref()
                .map_or(url.as_str(), |d| d.trim_end_matches('/')),
            running.keys.dashboard_email,
            running.keys.dashboard_password
        ),
        format!("  keys file       {}", running.keys_file.display()),
        String::new(),
        "Try:".to_owned(),
        format!("  curl -s {url}/v1/account -H 'Authorization: Bearer {sandbox}'"),
        format!("  curl -s '{url}/v1/payments?limit=5' -H 'Authorization: Bearer {sandbox}'"),
        String::new(),
    ]
    .join("\n")
}

/// The master key of stored provider credentials: `DHUKUTI_CREDENTIALS_KEY`,
/// else `<data dir>/credentials.key`, made on first start (owner-only).
pub fn credentials_keys(data_dir: &std::path::Path) -> Result<CredentialsKeys, String> {
    match CredentialsKeys::from_env() {
        Ok(k) => return Ok(k),
        Err(CredentialsError::MissingKey) => {}
        Err(e) => return Err(e.to_string()),
    }
    let path = data_dir.join("credentials.key");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let key = CredentialsKey::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(CredentialsKeys::single(key));
    }
    let key = CredentialsKey::generate("local").map_err(|e| e.to_string())?;
    write_private(&path, &key.export())?;
    Ok(CredentialsKeys::single(key))
}

fn write_private(path: &std::path::Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Ctrl-C, or SIGTERM on unix.
pub async fn shutdown_signal() {
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
