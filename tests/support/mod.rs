//! Test support: a real gateway on a loopback socket with fresh storage
//! per test, a typed client, and helpers that set up merchants, keys and
//! payments directly through the domain.

pub mod billing;
pub mod browser;
pub mod dash;
pub mod shop;
pub mod sse;

use std::path::PathBuf;
use std::sync::Arc;

use dhukuti::{Running, Settings};
use serde_json::{Map, Value};
use shared::app::{AwsSettings, Backend};
use shared::domain::account::{self, KeyKind, Merchant, NewKey, Plan, Project, Scope};
use shared::domain::payments::{self, Payment, PaymentStatus};
use shared::domain::{Mode, Provider};
use shared::ids::{IdKind, new_id};
use shared::money::{Currency, Paisa};
use shared::store::Store;
use shared::time::{Clock, SystemClock};

/// The backend an end-to-end test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// redb in a temporary directory, in-process queue, local blobs.
    Embedded,
    /// DynamoDB, SQS and S3 on the moto server `infra/test.sh` starts
    /// (`DHUKUTI_TEST_AWS_ENDPOINT`), with a fresh table, queues and bucket.
    Aws,
}

/// Expands each listed `async fn name(which: Which)` into two tests,
/// `embedded::name` and `aws::name`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Which::Embedded).await
                }
            )*
        }
        mod aws {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Which::Aws).await
                }
            )*
        }
    };
}

/// One running gateway for one test.
pub struct TestApp {
    pub base: String,
    pub running: Option<Running>,
    pub store: Arc<dyn Store>,
    pub client: reqwest::Client,
    pub data_dir: PathBuf,
    pub backend: Backend,
    _tmp: Option<tempfile::TempDir>,
}

/// A backend of kind `which` that no other test uses; `None` when the AWS
/// endpoint is not configured (the test then skips, unless
/// `DHUKUTI_REQUIRE_AWS=1`, which makes it fail).
pub fn fresh_backend(which: Which, data_dir: &std::path::Path) -> Option<Backend> {
    match which {
        Which::Embedded => Some(Backend::embedded(data_dir)),
        Which::Aws => {
            let endpoint = shared::queue::testkit::aws_endpoint()?;
            let id = new_id(IdKind::Event)[4..].to_owned();
            Some(Backend::Aws(AwsSettings {
                endpoint: Some(endpoint),
                table: format!("e2e-{id}"),
                queue_urls: Default::default(),
                queue_prefix: format!("e2e-{id}"),
                bucket: format!("e2e-{id}"),
            }))
        }
    }
}

/// A started gateway on `which` with fresh storage; `None` = skipped.
pub async fn spawn_app(which: Which) -> Option<TestApp> {
    spawn_app_wrapped(which, |s| s).await
}

/// [`spawn_app`] with the store wrapped (counting, faults).
pub async fn spawn_app_wrapped(
    which: Which,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> Option<TestApp> {
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => panic!("tempdir: {e}"),
    };
    let backend = fresh_backend(which, tmp.path())?;
    let mut app = spawn_app_on(backend, tmp.path().to_path_buf(), wrap).await;
    app._tmp = Some(tmp);
    Some(app)
}

/// A started gateway on `backend` (created if missing), keeping
/// `demo-keys.json` in `data_dir` (restart tests reuse both).
pub async fn spawn_app_on(
    backend: Backend,
    data_dir: PathBuf,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> TestApp {
    spawn_app_on_with_clock(backend, data_dir, wrap, Arc::new(SystemClock)).await
}

/// [`spawn_app_wrapped`] with the gateway reading the time from `clock`
/// (a [`shared::time::ManualClock`] lets a test move past expiries).
pub async fn spawn_app_with_clock(
    which: Which,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    clock: Arc<dyn Clock>,
) -> Option<TestApp> {
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => panic!("tempdir: {e}"),
    };
    let backend = fresh_backend(which, tmp.path())?;
    let mut app = spawn_app_on_with_clock(backend, tmp.path().to_path_buf(), wrap, clock).await;
    app._tmp = Some(tmp);
    Some(app)
}

/// [`spawn_app_wrapped`] with the gateway's settings changed by `tweak`
/// first (e.g. no webhook poller for a test that counts store calls).
pub async fn spawn_app_tweaked(
    which: Which,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    tweak: impl FnOnce(&mut Settings),
) -> Option<TestApp> {
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => panic!("tempdir: {e}"),
    };
    let backend = fresh_backend(which, tmp.path())?;
    let mut app = spawn_app_full(
        backend,
        tmp.path().to_path_buf(),
        wrap,
        Arc::new(SystemClock),
        tweak,
    )
    .await;
    app._tmp = Some(tmp);
    Some(app)
}

/// [`spawn_app_tweaked`] with the gateway reading the time from `clock`
/// (e.g. the sweep tick on, at a fixed Nepal daytime).
pub async fn spawn_app_tweaked_with_clock(
    which: Which,
    clock: Arc<dyn Clock>,
    tweak: impl FnOnce(&mut Settings),
) -> Option<TestApp> {
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => panic!("tempdir: {e}"),
    };
    let backend = fresh_backend(which, tmp.path())?;
    let mut app = spawn_app_full(backend, tmp.path().to_path_buf(), |s| s, clock, tweak).await;
    app._tmp = Some(tmp);
    Some(app)
}

/// [`spawn_app_on`] with the gateway reading the time from `clock`.
pub async fn spawn_app_on_with_clock(
    backend: Backend,
    data_dir: PathBuf,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    clock: Arc<dyn Clock>,
) -> TestApp {
    spawn_app_full(backend, data_dir, wrap, clock, |_| {}).await
}

async fn spawn_app_full(
    backend: Backend,
    data_dir: PathBuf,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    tweak: impl FnOnce(&mut Settings),
) -> TestApp {
    let mut settings = Settings {
        addr: "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
        data_dir: data_dir.clone(),
        backend: backend.clone(),
        init: true,
        demo_payments: false,
        public_url: None,
        dashboard_url: None,
        sweep_every: None,
        // Simulated provider timeouts then take 2 s (+2 s of slack).
        provider_timeout: Some(std::time::Duration::from_secs(2)),
        webhooks: test_webhook_settings(),
        webhook_poll: Some(std::time::Duration::from_millis(100)),
    };
    tweak(&mut settings);
    let (store, queue, blobs) = match backend.open(true).await {
        Ok(b) => b,
        Err(e) => panic!("backend did not open: {e}"),
    };
    let store = wrap(store);
    let running =
        match dhukuti::start_with_clock(settings, store.clone(), queue, blobs, clock).await {
            Ok(r) => r,
            Err(e) => panic!("gateway did not start: {e}"),
        };
    // Many tests fire hundreds of concurrent requests with one key: the
    // rate limit stays out of their way unless a test lowers it
    // ([`TestApp::set_rate_limits`]).
    running.state.limits().set(TEST_RATE_LIMIT, TEST_RATE_LIMIT);
    TestApp {
        base: running.base_url.clone(),
        store,
        running: Some(running),
        client: reqwest::Client::new(),
        data_dir,
        backend,
        _tmp: None,
    }
}

/// Requests per second per key of a test gateway unless a test sets its
/// own: high enough never to be reached.
pub const TEST_RATE_LIMIT: u32 = 1_000_000;

/// Webhooks as the end-to-end tests run them: local receivers allowed
/// (sandbox), the decided number of retries but 300 ms apart, a receiver
/// timeout of 2 s and a 3 s claim (the worker's visibility is 4 s).
pub fn test_webhook_settings() -> shared::domain::webhooks::WebhookSettings {
    use std::time::Duration;
    shared::domain::webhooks::WebhookSettings {
        allow_local_http: true,
        schedule: vec![Duration::from_millis(300); shared::domain::webhooks::RETRY_SCHEDULE.len()],
        timeout: Duration::from_secs(2),
        lease: Duration::from_secs(3),
    }
}

/// A merchant with one project and a key of the chosen scopes.
pub struct Tenant {
    pub merchant: Merchant,
    pub project: Project,
}

/// An answer: status, headers and JSON body.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Asserts the spec's error envelope with `code`, and that
    /// `error.request_id` equals `X-Request-Id`.
    pub fn assert_error(&self, status: u16, kind: &str, code: &str) {
        assert_eq!(self.status, status, "status; body {}", self.body);
        let e = &self.body["error"];
        assert_eq!(e["type"], kind, "error.type; body {}", self.body);
        assert_eq!(e["code"], code, "error.code; body {}", self.body);
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "message; body {}",
            self.body
        );
        let rid = self.header("x-request-id");
        assert!(!rid.is_empty(), "X-Request-Id missing");
        assert_eq!(
            e["request_id"], rid,
            "error.request_id must equal X-Request-Id"
        );
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str, key: Option<&str>) -> Answer {
        let mut req = self.client.get(self.url(path));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        send(req).await
    }

    /// POSTs `body` as JSON, with an `Idempotency-Key` when given.
    pub async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        idempotency_key: Option<&str>,
        body: &Value,
    ) -> Answer {
        let mut req = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(k) = idempotency_key {
            req = req.header("idempotency-key", k);
        }
        send(req).await
    }

    /// Replaces the gateway's per-key limits (requests per second).
    pub fn set_rate_limits(&self, live: u32, sandbox: u32) {
        self.state().limits().set(live, sandbox);
    }

    /// The state the gateway's functions share.
    pub fn state(&self) -> &shared::AppState {
        match &self.running {
            Some(r) => &r.state,
            None => panic!("the gateway was stopped"),
        }
    }

    /// One scheduler pass (expire due sessions, reconcile open payments)
    /// as of `now`.
    pub async fn sweep(
        &self,
        now: shared::time::Timestamp,
    ) -> shared::domain::attempts::SweepReport {
        match shared::domain::attempts::sweep(self.state(), now).await {
            Ok(r) => r,
            Err(e) => panic!("sweep: {e}"),
        }
    }

    /// Gives the tenant's project the Fonepay merchant the simulator knows
    /// (`NBQM`), sealed with the gateway's master key.
    pub async fn enable_fonepay(&self, tenant: &Tenant, mode: Mode) {
        let Some(keys) = self.state().providers.keys() else {
            panic!("the gateway has no credentials key")
        };
        let creds = dhukuti::demo::simulator_fonepay_credentials();
        if let Err(e) = shared::domain::credentials::put_credentials(
            &*self.store,
            keys,
            SystemClock.now(),
            &shared::domain::Tenant::new(tenant.project.id.clone(), mode),
            &creds,
        )
        .await
        {
            panic!("fonepay credentials: {e}")
        }
    }

    pub async fn tenant(&self, name: &str, email: &str) -> Tenant {
        let now = SystemClock.now();
        let store = &*self.store;
        let Ok(merchant) = account::create_merchant(store, now, name, email, Plan::Growth).await
        else {
            panic!("merchant")
        };
        let Ok(project) = account::create_project(store, now, &merchant, "Shop", false).await
        else {
            panic!("project")
        };
        Tenant { merchant, project }
    }

    pub async fn key(&self, tenant: &Tenant, mode: Mode, scopes: &[Scope]) -> String {
        self.key_with_cap(tenant, mode, scopes, None).await
    }

    /// A key with a monthly `spend_cap_paisa`.
    pub async fn key_with_cap(
        &self,
        tenant: &Tenant,
        mode: Mode,
        scopes: &[Scope],
        spend_cap_paisa: Option<i64>,
    ) -> String {
        let new = NewKey {
            mode,
            kind: if scopes.len() == Scope::ALL.len() {
                KeyKind::Secret
            } else {
                KeyKind::Restricted
            },
            scopes: scopes.to_vec(),
            description: "test key".into(),
            expires_at: None,
            spend_cap_paisa,
        };
        match account::issue_api_key(self.state(), SystemClock.now(), &tenant.project, new).await {
            Ok((secret, _)) => secret,
            Err(e) => panic!("key: {e}"),
        }
    }

    pub async fn payment(
        &self,
        tenant: &Tenant,
        mode: Mode,
        amount: i64,
        provider: Provider,
    ) -> Payment {
        let now = SystemClock.now();
        let mut metadata = Map::new();
        metadata.insert("order".into(), Value::from("A-1"));
        let p = Payment {
            id: shared::ids::PaymentId::new(),
            project_id: tenant.project.id.clone(),
            checkout_session_id: shared::ids::SessionId::new(),
            mode,
            amount: Paisa::new(amount).unwrap_or_default(),
            amount_refunded: Paisa::ZERO,
            currency: Currency::Npr,
            amount_reserved: Default::default(),
            gsi2pk: None,
            gsi2sk: None,
            provider,
            status: PaymentStatus::Success,
            provider_ref: Some("REF-1".into()),
            failure_reason: None,
            metadata,
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
        if let Err(e) = payments::insert(&*self.store, &p).await {
            panic!("payment: {e}");
        }
        p
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.stop().await;
        }
        // moto holds every table of the run in memory (a full run once
        // grew one server to 11 GB): the table of a backend this app made
        // for itself (`_tmp` set: not a restart test's) goes with it.
        if let (Backend::Aws(s), Some(_)) = (&self.backend, &self._tmp)
            && let Err(e) = shared::store::dynamo::drop_table(s.endpoint.as_deref(), &s.table).await
        {
            eprintln!("could not drop the test table {}: {e}", s.table);
        }
    }
}

/// Sends `req`; an answer of a documented `/v1` operation must carry a
/// status the OpenAPI document lists for it, so every test that sends
/// through here also checks the document.
pub async fn send(req: reqwest::RequestBuilder) -> Answer {
    let (client, req) = req.build_split();
    let req = match req {
        Ok(r) => r,
        Err(e) => panic!("request did not build: {e}"),
    };
    let (method, path) = (req.method().to_string(), req.url().path().to_owned());
    let res = match client.execute(req).await {
        Ok(r) => r,
        Err(e) => panic!("request failed: {e}"),
    };
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let bytes = res.bytes().await.unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if let Some(listed) = documented_statuses(&method, &path) {
        assert!(
            listed.iter().any(|s| *s == status.to_string()),
            "{method} {path} answered {status}, which the OpenAPI document does not list \
             for it ({listed:?}): {body}"
        );
    }
    Answer {
        status,
        headers,
        body,
    }
}

/// The statuses the document lists for the operation `method path`
/// matches (`{id}` matching one segment); `None` when no operation does.
pub fn documented_statuses(method: &str, path: &str) -> Option<Vec<String>> {
    type Operation = (String, Vec<String>, Vec<String>);
    static OPERATIONS: std::sync::OnceLock<Vec<Operation>> = std::sync::OnceLock::new();
    let operations = OPERATIONS.get_or_init(|| {
        let doc: Value = match dhukuti::openapi_json().map(|j| serde_json::from_str(&j)) {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => panic!("the OpenAPI document: {e}"),
            Err(e) => panic!("the OpenAPI document: {e}"),
        };
        let mut out = Vec::new();
        for (template, item) in doc["paths"].as_object().into_iter().flatten() {
            for (m, op) in item.as_object().into_iter().flatten() {
                let statuses = op["responses"]
                    .as_object()
                    .map(|r| r.keys().cloned().collect())
                    .unwrap_or_default();
                let segments = template.split('/').map(String::from).collect();
                out.push((m.to_uppercase(), segments, statuses));
            }
        }
        out
    });
    let segments: Vec<&str> = path.split('/').collect();
    operations
        .iter()
        .find(|(m, template, _)| {
            m == method
                && template.len() == segments.len()
                && template
                    .iter()
                    .zip(&segments)
                    .all(|(t, s)| t.starts_with('{') || t == s)
        })
        .map(|(_, _, statuses)| statuses.clone())
}
