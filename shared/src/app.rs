//! What the rules use ([`Deps`]: store, queue, blobs, clock, configuration,
//! providers) and what every handler gets ([`AppState`]: those and the
//! limits); and how a process builds them from its environment.
//!
//! Backends (`DHUKUTI_BACKEND`):
//! - `embedded` (default for the dev server): redb in `DHUKUTI_DATA_DIR`,
//!   an in-process queue, blobs in a directory;
//! - `aws`: DynamoDB (`DHUKUTI_TABLE`), SQS (`DHUKUTI_QUEUE_WEBHOOKS_URL`,
//!   `DHUKUTI_QUEUE_SMS_URL`, or found by name from `DHUKUTI_QUEUE_PREFIX`)
//!   and S3 (`DHUKUTI_BUCKET`), with the standard AWS environment
//!   (`AWS_REGION`, credentials, `AWS_ENDPOINT_URL` for moto or DynamoDB
//!   Local; S3 then uses path-style addressing).
//!
//! The credentials master key ([`credentials_keys`]): `DHUKUTI_CREDENTIALS_KEY`
//! (local runs, tools, tests), or on Lambda the Secrets Manager secret
//! `DHUKUTI_CREDENTIALS_KEY_SECRET` names, read once at cold start.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::blobs::Blobs;
use crate::blobs::memory::MemoryBlobs;
use crate::ids::{ApiKeyId, SessionId};
use crate::kinds::Mode;
use crate::limits::public::{Limited, PublicLimits, PublicRequest, SessionUse};
use crate::limits::rate::{Quota, RateLimits};
use crate::providers::ProviderHub;
use crate::queue::memory::InProcessQueue;
use crate::queue::{Queue, QueueName};
use crate::secrets::{
    CredentialsError, CredentialsKeys, KEY_ENV, KEY_SECRET_ENV, PREVIOUS_KEYS_ENV,
};
use crate::store::Store;
use crate::time::{Clock, SystemClock};
use crate::webhooks::settings::WebhookSettings;

/// Configuration read once at start (environment variables).
#[derive(Clone, Debug)]
pub struct Config {
    /// Public base URL of the hosted pages (checkout, links), no trailing
    /// /. Empty on Lambda without `DHUKUTI_PUBLIC_URL`: then each request's
    /// own host is used ([`Config::base_for`]).
    pub public_base_url: String,
    /// Where customers' screens stream a session's events from, no
    /// trailing /: deployed, the events function's URL (it streams the
    /// answer; API Gateway would buffer it). `None`: the public base.
    pub events_base_url: Option<String>,
    /// The dashboard's own base URL when it has a host of its own
    /// (`DHUKUTI_DASHBOARD_URL`, the template's `DashboardBaseUrl`), no
    /// trailing /. Then the dashboard answers only on that host and the
    /// hosted pages only elsewhere ([`Config::on_dashboard_host`]).
    /// `None`: one domain serves both, as before.
    pub dashboard_base_url: Option<String>,
}

impl Config {
    pub fn from_env() -> Self {
        let set = std::env::var("DHUKUTI_PUBLIC_URL")
            .ok()
            .filter(|v| !v.trim().is_empty());
        let on_lambda = std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some();
        let base = match set {
            Some(v) => v,
            None if on_lambda => String::new(),
            None => "http://127.0.0.1:8080".to_owned(),
        };
        let events = std::env::var("DHUKUTI_EVENTS_URL")
            .ok()
            .map(|v| v.trim().trim_end_matches('/').to_owned())
            .filter(|v| !v.is_empty());
        let dashboard = std::env::var("DHUKUTI_DASHBOARD_URL")
            .ok()
            .map(|v| v.trim().trim_end_matches('/').to_owned())
            .filter(|v| !v.is_empty());
        Config {
            public_base_url: base.trim().trim_end_matches('/').to_owned(),
            events_base_url: events,
            dashboard_base_url: dashboard,
        }
    }

    /// With a dashboard host configured, whether a request naming `host`
    /// (its `Host` header) is for it: compared without case, a default
    /// port (`:443`, `:80`) ignored. `None` when the dashboard has no
    /// host of its own (every route is served on every host).
    pub fn on_dashboard_host(&self, host: Option<&str>) -> Option<bool> {
        let base = self.dashboard_base_url.as_deref()?;
        let authority = |s: &str| {
            let s = s.trim().to_ascii_lowercase();
            s.strip_suffix(":443")
                .or_else(|| s.strip_suffix(":80"))
                .map(str::to_owned)
                .unwrap_or(s)
        };
        let rest = base.split_once("://").map_or(base, |(_, r)| r);
        let want = authority(rest.split('/').next().unwrap_or_default());
        Some(host.is_some_and(|h| authority(h) == want))
    }

    /// Where a session's event stream is served: the events function's
    /// URL when configured, else [`Config::base_for`].
    pub fn events_base_for(&self, host: Option<&str>) -> String {
        match &self.events_base_url {
            Some(base) => base.clone(),
            None => self.base_for(host),
        }
    }

    /// The public base URL: the configured one, else `https://` + the
    /// request's `Host` (API Gateway's own domain), else the local default.
    pub fn base_for(&self, host: Option<&str>) -> String {
        if !self.public_base_url.is_empty() {
            return self.public_base_url.clone();
        }
        match host.filter(|h| is_host(h)) {
            Some(h) => format!("https://{h}"),
            None => "http://127.0.0.1:8080".to_owned(),
        }
    }
}

/// A `Host` header value we are willing to put into URLs.
fn is_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
}

/// What the rules use: the store, the queue, the blobs, the clock, the
/// configuration, the provider clients and the webhook settings (cheap to
/// clone). Domain operations take `&Deps`, never the edge's limits.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub blobs: Arc<dyn Blobs>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<Config>,
    /// Provider clients and credentials (checkout attempts, reconciling).
    pub providers: Arc<ProviderHub>,
    /// Webhook receivers allowed, retry schedule, timeouts.
    pub webhooks: Arc<WebhookSettings>,
}

/// Shared by every request of a function: the rules' [`Deps`] and the
/// edge's limits. It derefs to the [`Deps`] (so `state.store` reads and
/// `&state` is a `&Deps`); the limits are [`AppState::limits`] and
/// [`AppState::public_limits`].
///
/// One pointer: the router clones the state for every extractor of every
/// request, and a clone is one reference count, not nine (issue 21). A
/// change through `DerefMut` or a `with_…` (tests, start-up) copies the
/// parts first if another clone shares them, so no clone sees another's
/// change.
#[derive(Clone)]
pub struct AppState(Arc<StateParts>);

/// What an [`AppState`] holds.
#[derive(Clone)]
struct StateParts {
    deps: Deps,
    /// Requests per second per API key (live, sandbox).
    limits: Arc<RateLimits>,
    /// The public routes' limits (per client address, session, link).
    public_limits: Arc<PublicLimits>,
    /// The CDN's origin secret ([`ORIGIN_SECRET_ENV`]): only a request
    /// carrying it may name its client's address (`infra/edge.yaml`).
    origin_secret: Option<Arc<str>>,
    /// Whether work may go on after a request's answer (a task the handler
    /// spawns): the local gateway's long-lived process, never a Lambda,
    /// which may be frozen once it has answered.
    background_work: bool,
}

/// The environment variable holding the edge stack's origin secret: the
/// value CloudFront adds to every request it forwards (`infra/edge.yaml`).
/// Unset or empty: no request may name its client's address.
pub const ORIGIN_SECRET_ENV: &str = "DHUKUTI_EDGE_ORIGIN_SECRET";

impl std::ops::Deref for AppState {
    type Target = Deps;
    fn deref(&self) -> &Deps {
        &self.0.deps
    }
}

impl std::ops::DerefMut for AppState {
    fn deref_mut(&mut self) -> &mut Deps {
        &mut Arc::make_mut(&mut self.0).deps
    }
}

impl AppState {
    /// Requests per second per API key (live, sandbox).
    pub fn limits(&self) -> &RateLimits {
        &self.0.limits
    }

    /// The public routes' limits (per client address, session, link).
    pub fn public_limits(&self) -> &PublicLimits {
        &self.0.public_limits
    }

    /// The CDN's origin secret, when one is configured (never empty).
    pub fn origin_secret(&self) -> Option<&str> {
        self.0.origin_secret.as_deref()
    }

    /// Trust the client address CloudFront names on requests carrying
    /// `secret` (empty: trust none).
    pub fn with_origin_secret(mut self, secret: &str) -> Self {
        let secret = Some(secret.trim()).filter(|s| !s.is_empty());
        Arc::make_mut(&mut self.0).origin_secret = secret.map(Arc::from);
        self
    }

    /// Whether a handler may leave work to a task that outlives its
    /// answer ([`AppState::with_background_work`]; false on Lambda).
    pub fn runs_background_work(&self) -> bool {
        self.0.background_work
    }

    /// A long-lived process (the local gateway): work may go on after an
    /// answer.
    pub fn with_background_work(mut self, yes: bool) -> Self {
        Arc::make_mut(&mut self.0).background_work = yes;
        self
    }

    /// Takes one request of key `key`'s rate limit in `mode`, now.
    pub async fn take_key_request(&self, key: &ApiKeyId, mode: Mode) -> Quota {
        let now = self.clock.now();
        self.limits().take(&*self.store, key, mode, now).await
    }

    /// Takes one request of every public budget `request` falls under,
    /// now ([`PublicLimits::take`]).
    pub async fn take_public(&self, request: &PublicRequest<'_>) -> Result<(), Limited> {
        let now = self.clock.now();
        self.public_limits().take(&*self.store, request, now).await
    }

    /// Takes one request of checkout session `id`'s budget for `by`, now
    /// ([`PublicLimits::take_session`]): call it once the session is
    /// known to exist.
    pub async fn take_session(&self, id: &SessionId, by: SessionUse) -> Result<(), Limited> {
        let now = self.clock.now();
        self.public_limits()
            .take_session(&*self.store, id, by, now)
            .await
    }

    /// Tests: a state on a fresh in-memory embedded store, its clock a
    /// [`crate::time::ManualClock`] at the current time, the public base URL
    /// `http://127.0.0.1:8080`. Panics if the store cannot be made.
    #[cfg(any(test, feature = "testkit"))]
    pub fn for_tests() -> Self {
        let store = match crate::store::embedded::EmbeddedStore::in_memory() {
            Ok(s) => s,
            Err(e) => panic!("in-memory store: {e}"),
        };
        AppState::new(
            Arc::new(store),
            Arc::new(crate::time::ManualClock::new(SystemClock.now())),
            Config {
                public_base_url: "http://127.0.0.1:8080".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
    }

    /// A state on `store` with an in-process queue and in-memory blobs
    /// (tests); replace them with [`AppState::with_queue`] and
    /// [`AppState::with_blobs`].
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: Config) -> Self {
        AppState(Arc::new(StateParts {
            deps: Deps {
                store,
                queue: Arc::new(InProcessQueue::new()),
                blobs: Arc::new(MemoryBlobs::new()),
                clock,
                config: Arc::new(config),
                providers: Arc::new(ProviderHub::unconfigured()),
                webhooks: Arc::new(WebhookSettings::default()),
            },
            limits: Arc::new(RateLimits::default()),
            public_limits: Arc::new(PublicLimits::default()),
            origin_secret: None,
            background_work: false,
        }))
    }

    pub fn with_public_limits(mut self, limits: PublicLimits) -> Self {
        Arc::make_mut(&mut self.0).public_limits = Arc::new(limits);
        self
    }

    pub fn with_rate_limits(mut self, limits: RateLimits) -> Self {
        Arc::make_mut(&mut self.0).limits = Arc::new(limits);
        self
    }

    pub fn with_webhooks(mut self, webhooks: WebhookSettings) -> Self {
        self.webhooks = Arc::new(webhooks);
        self
    }

    pub fn with_providers(mut self, providers: ProviderHub) -> Self {
        self.providers = Arc::new(providers);
        self
    }

    /// The same state on another clock (tests that must not see a minute
    /// roll over while they count requests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_queue(mut self, queue: Arc<dyn Queue>) -> Self {
        self.queue = queue;
        self
    }

    pub fn with_blobs(mut self, blobs: Arc<dyn Blobs>) -> Self {
        self.blobs = blobs;
        self
    }

    /// The state a Lambda function builds once at cold start.
    pub async fn from_env() -> Result<Self, String> {
        let backend = Backend::from_env()?;
        let (store, queue, blobs) = backend.open(false).await?;
        let keys = credentials_keys().await?;
        let providers = ProviderHub::from_env(keys)?;
        let webhooks = WebhookSettings::from_env()?;
        let limits = RateLimits::from_env()?;
        let public_limits = PublicLimits::from_env()?;
        let origin_secret = std::env::var(ORIGIN_SECRET_ENV).unwrap_or_default();
        Ok(
            AppState::new(store, Arc::new(SystemClock), Config::from_env())
                .with_queue(queue)
                .with_blobs(blobs)
                .with_providers(providers)
                .with_webhooks(webhooks)
                .with_rate_limits(limits)
                .with_public_limits(public_limits)
                .with_origin_secret(&origin_secret),
        )
    }
}

/// Where a process's credentials master key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// [`KEY_ENV`] (and [`PREVIOUS_KEYS_ENV`]): the local gateway, tools,
    /// tests.
    Env,
    /// The Secrets Manager secret (ARN or name) in [`KEY_SECRET_ENV`]: the
    /// deployed functions.
    Secret(String),
    /// Neither: no key (only the sandbox accounts work).
    Missing,
}

impl KeySource {
    /// Which source the variables `lookup` answers configure; both at
    /// once, or previous keys beside a secret (they belong in the
    /// secret), is a configuration error.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<KeySource, String> {
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        match (set(KEY_ENV), set(KEY_SECRET_ENV)) {
            (Some(_), Some(_)) => Err(format!("set {KEY_ENV} or {KEY_SECRET_ENV}, not both")),
            (None, Some(secret)) if set(PREVIOUS_KEYS_ENV).is_some() => Err(format!(
                "{PREVIOUS_KEYS_ENV} is set beside {KEY_SECRET_ENV}: put previous keys in \
                 the secret ({{\"current\": ..., \"previous\": ...}}) of {}",
                secret.trim()
            )),
            (None, Some(secret)) => Ok(KeySource::Secret(secret.trim().to_owned())),
            (Some(_), None) => Ok(KeySource::Env),
            (None, None) => Ok(KeySource::Missing),
        }
    }
}

/// The credentials master keys of this process (see [`KeySource`]):
/// `None` when none is configured. A secret is read here, once per
/// process (a Lambda cold start, before serving); a failure is logged and
/// fails the start. Neither the key nor the secret's value is ever logged.
pub async fn credentials_keys() -> Result<Option<CredentialsKeys>, String> {
    match KeySource::from_lookup(|name| std::env::var(name).ok())? {
        KeySource::Missing => Ok(None),
        KeySource::Env => match CredentialsKeys::from_env() {
            Ok(keys) => Ok(Some(keys)),
            Err(CredentialsError::MissingKey) => Ok(None),
            Err(e) => Err(e.to_string()),
        },
        KeySource::Secret(secret) => {
            match keys_from_secret(env("AWS_ENDPOINT_URL").as_deref(), &secret).await {
                Ok(keys) => {
                    tracing::info!(
                        secret = %secret,
                        key_id = keys.current().id(),
                        "credentials master key read from Secrets Manager"
                    );
                    Ok(Some(keys))
                }
                Err(e) => {
                    tracing::error!(
                        secret = %secret,
                        error = %e,
                        "cannot read the credentials master key; the function does not start"
                    );
                    Err(e)
                }
            }
        }
    }
}

/// A function built without Secrets Manager (no `secrets` feature) reads no
/// secret: it is granted none in `template.yaml` (`tests/e2e/deps.rs`), and
/// a secret named to it anyway fails its start rather than being ignored.
#[cfg(not(feature = "secrets"))]
async fn keys_from_secret(_: Option<&str>, secret: &str) -> Result<CredentialsKeys, String> {
    Err(format!(
        "cannot read the secret {secret}: this function is built without Secrets Manager \
         (feature secrets) and uses no provider credentials"
    ))
}

/// The keys in a Secrets Manager secret: its `SecretString`
/// (GetSecretValue, the current version) read with the standard AWS
/// environment, at `endpoint` when given (a local server).
#[cfg(feature = "secrets")]
async fn keys_from_secret(endpoint: Option<&str>, secret: &str) -> Result<CredentialsKeys, String> {
    use aws_sdk_secretsmanager::error::DisplayErrorContext;
    let shared = crate::aws::sdk_config(endpoint)
        .map_err(|e| format!("cannot read the secret {secret}: {e}"))?;
    let client = aws_sdk_secretsmanager::Client::new(&shared);
    let out = client
        .get_secret_value()
        .secret_id(secret)
        .send()
        .await
        .map_err(|e| {
            format!(
                "cannot read the secret {secret}: {}",
                DisplayErrorContext(&e)
            )
        })?;
    let text = out.secret_string.ok_or_else(|| {
        format!("the secret {secret} has no SecretString (a binary secret is not read)")
    })?;
    CredentialsKeys::from_secret_string(secret, &text).map_err(|e| e.to_string())
}

/// Where the data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Embedded {
        data_dir: PathBuf,
        /// The most memory redb's page cache takes, in MiB
        /// (`DHUKUTI_STORE_CACHE_MIB`).
        cache_mib: usize,
    },
    Aws(AwsSettings),
}

/// Names of the AWS resources, and an optional endpoint for local servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsSettings {
    /// A DynamoDB/SQS/S3-compatible endpoint (moto); `None` = AWS itself.
    pub endpoint: Option<String>,
    pub table: String,
    /// Queue URLs when known (Lambda gets them from the template).
    pub queue_urls: HashMap<QueueName, String>,
    /// Name prefix to find (or, with `init`, create) the queues by name.
    pub queue_prefix: String,
    pub bucket: String,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// redb's page cache of the embedded store, in MiB, unless
/// `DHUKUTI_STORE_CACHE_MIB` says otherwise. redb's own default lets it
/// grow to 1 GiB, so a local gateway on a big store would take that
/// whatever it does; the exports benchmark runs a million rows in a
/// 64 MiB cache (BENCHMARKS.md §12).
pub const DEFAULT_CACHE_MIB: usize = 128;
/// The largest `DHUKUTI_STORE_CACHE_MIB` taken (64 GiB).
pub const MAX_CACHE_MIB: usize = 64 * 1024;

/// `DHUKUTI_STORE_CACHE_MIB`: a whole number of MiB, 1 to
/// [`MAX_CACHE_MIB`]; unset, [`DEFAULT_CACHE_MIB`].
fn cache_mib(raw: Option<&str>) -> Result<usize, String> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_CACHE_MIB);
    };
    match raw.parse::<usize>() {
        Ok(mib) if (1..=MAX_CACHE_MIB).contains(&mib) => Ok(mib),
        _ => Err(format!(
            "DHUKUTI_STORE_CACHE_MIB={raw:?} is not a whole number of MiB from 1 to {MAX_CACHE_MIB}"
        )),
    }
}

impl Backend {
    /// The embedded store in `data_dir`, with the default cache.
    pub fn embedded(data_dir: impl Into<PathBuf>) -> Backend {
        Backend::Embedded {
            data_dir: data_dir.into(),
            cache_mib: DEFAULT_CACHE_MIB,
        }
    }

    /// Reads `DHUKUTI_BACKEND` and the variables of that backend.
    pub fn from_env() -> Result<Backend, String> {
        match env("DHUKUTI_BACKEND").as_deref().unwrap_or("embedded") {
            "embedded" => Ok(Backend::Embedded {
                data_dir: env("DHUKUTI_DATA_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from(".dhukuti")),
                cache_mib: cache_mib(env("DHUKUTI_STORE_CACHE_MIB").as_deref())?,
            }),
            "aws" => {
                let mut queue_urls = HashMap::new();
                for (queue, var) in [
                    (QueueName::Webhooks, "DHUKUTI_QUEUE_WEBHOOKS_URL"),
                    (QueueName::Sms, "DHUKUTI_QUEUE_SMS_URL"),
                    (QueueName::Mail, "DHUKUTI_QUEUE_MAIL_URL"),
                ] {
                    if let Some(url) = env(var) {
                        queue_urls.insert(queue, url);
                    }
                }
                // A function is given its table (template.yaml): without
                // it, it would read and write a table of the default name.
                let on_lambda = std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some();
                let table = match env("DHUKUTI_TABLE") {
                    Some(table) => table,
                    None if on_lambda => {
                        return Err("DHUKUTI_TABLE is not set: a function needs the name of \
                                    its DynamoDB table (template.yaml sets it)"
                            .into());
                    }
                    None => "dhukuti".into(),
                };
                Ok(Backend::Aws(AwsSettings {
                    endpoint: env("AWS_ENDPOINT_URL"),
                    table,
                    queue_urls,
                    queue_prefix: env("DHUKUTI_QUEUE_PREFIX").unwrap_or_else(|| "dhukuti".into()),
                    bucket: env("DHUKUTI_BUCKET").unwrap_or_else(|| "dhukuti-documents".into()),
                }))
            }
            other => Err(format!(
                "DHUKUTI_BACKEND={other:?} is not a backend; use 'embedded' or 'aws'"
            )),
        }
    }

    /// Opens the backend. With `init`, creates what is missing (the table,
    /// the queues with their dead-letter queues, the bucket) first.
    pub async fn open(
        &self,
        init: bool,
    ) -> Result<(Arc<dyn Store>, Arc<dyn Queue>, Arc<dyn Blobs>), String> {
        match self {
            Backend::Embedded {
                data_dir,
                cache_mib,
            } => open_embedded(data_dir, *cache_mib),
            Backend::Aws(settings) => open_aws(settings, init).await,
        }
    }
}

impl Backend {
    /// One line for people: where the data is.
    pub fn describe(&self) -> String {
        match self {
            Backend::Embedded { data_dir, .. } => {
                format!("embedded ({})", data_dir.join("dhukuti.redb").display())
            }
            Backend::Aws(s) => format!(
                "aws (table {}, queues {}-*, bucket {}{})",
                s.table,
                s.queue_prefix,
                s.bucket,
                s.endpoint
                    .as_ref()
                    .map(|e| format!(", endpoint {e}"))
                    .unwrap_or_default()
            ),
        }
    }

    /// Only the store of the backend (tools that need nothing else).
    pub async fn open_store(&self) -> Result<Arc<dyn Store>, String> {
        match self {
            Backend::Embedded { .. } => self.open(false).await.map(|(store, _, _)| store),
            Backend::Aws(s) => {
                let shared = crate::aws::sdk_config(s.endpoint.as_deref())?;
                let dynamo = aws_sdk_dynamodb::Client::new(&shared);
                Ok(Arc::new(crate::store::dynamo::DynamoStore::new(
                    dynamo,
                    s.table.clone(),
                )))
            }
        }
    }
}

type Backends = (Arc<dyn Store>, Arc<dyn Queue>, Arc<dyn Blobs>);

#[cfg(feature = "embedded")]
fn open_embedded(data_dir: &std::path::Path, cache_mib: usize) -> Result<Backends, String> {
    use crate::blobs::local::LocalDirBlobs;
    use crate::store::embedded::EmbeddedStore;
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", data_dir.display()))?;
    let db = data_dir.join("dhukuti.redb");
    let cache = cache_mib.saturating_mul(1024 * 1024);
    let store = EmbeddedStore::open_with_cache(&db, cache).map_err(|e| {
        format!(
            "cannot open {} (is another process using it?): {e}",
            db.display()
        )
    })?;
    Ok((
        Arc::new(store),
        Arc::new(InProcessQueue::new()),
        Arc::new(LocalDirBlobs::new(data_dir.join("blobs"))),
    ))
}

/// A deployed function carries no embedded store (issue 21).
#[cfg(not(feature = "embedded"))]
fn open_embedded(_: &std::path::Path, _: usize) -> Result<Backends, String> {
    Err(
        "DHUKUTI_BACKEND=embedded: this build has no embedded store (feature embedded); \
         set DHUKUTI_BACKEND=aws"
            .into(),
    )
}

async fn open_aws(s: &AwsSettings, init: bool) -> Result<Backends, String> {
    use crate::store::dynamo::DynamoStore;

    let shared = crate::aws::sdk_config(s.endpoint.as_deref())?;
    let dynamo = aws_sdk_dynamodb::Client::new(&shared);
    #[cfg(feature = "tools")]
    if init {
        crate::store::dynamo::create_table(&dynamo, &s.table)
            .await
            .map_err(|e| format!("cannot create table {}: {e}", s.table))?;
    }
    #[cfg(not(feature = "tools"))]
    if init {
        return Err(format!(
            "cannot create table {}: this build does not create AWS resources (feature tools)",
            s.table
        ));
    }
    let queue = aws_queue(&shared, s, init).await?;
    let blobs = aws_blobs(&shared, s, init).await?;
    Ok((
        Arc::new(DynamoStore::new(dynamo, s.table.clone())),
        queue,
        blobs,
    ))
}

/// The SQS queues: created with `init`; each found by name unless its URL
/// is set (the template sets them, saving two round trips at start).
#[cfg(feature = "sqs")]
async fn aws_queue(
    shared: &aws_types::SdkConfig,
    s: &AwsSettings,
    init: bool,
) -> Result<Arc<dyn Queue>, String> {
    use crate::queue::sqs::{SqsQueue, queue_name};
    let mut urls = s.queue_urls.clone();
    // Every URL known (as the template sets them) and nothing to create:
    // SQS is not asked anything at start, so its client is built on the
    // first send. The shared configuration is valid: the DynamoDB client
    // was built from it already.
    if !init && QueueName::ALL.iter().all(|q| urls.contains_key(q)) {
        let config = aws_sdk_sqs::Config::from(shared);
        return Ok(Arc::new(SqsQueue::on_first_use(config, urls)));
    }
    let sqs = aws_sdk_sqs::Client::new(shared);
    #[cfg(feature = "tools")]
    if init {
        let created = crate::queue::sqs::ensure_queues(&sqs, &s.queue_prefix)
            .await
            .map_err(|e| format!("cannot create queues {}-*: {e}", s.queue_prefix))?;
        for (queue, url) in created {
            urls.entry(queue).or_insert(url);
        }
    }
    for queue in QueueName::ALL {
        if urls.contains_key(&queue) {
            continue;
        }
        let name = queue_name(&s.queue_prefix, queue);
        let url = sqs
            .get_queue_url()
            .queue_name(&name)
            .send()
            .await
            .ok()
            .and_then(|o| o.queue_url)
            .ok_or_else(|| format!("queue {name} not found: set its URL or create it (--init)"))?;
        urls.insert(queue, url);
    }
    Ok(Arc::new(SqsQueue::new(sqs, urls)))
}

/// A function that sends to no queue carries no SQS client.
#[cfg(not(feature = "sqs"))]
async fn aws_queue(
    _: &aws_types::SdkConfig,
    s: &AwsSettings,
    init: bool,
) -> Result<Arc<dyn Queue>, String> {
    if init {
        return Err(format!(
            "cannot create queues {}-*: this build has no SQS client (feature sqs)",
            s.queue_prefix
        ));
    }
    Ok(Arc::new(crate::queue::NoQueue))
}

/// The S3 bucket: created with `init`. A local endpoint serves every bucket
/// on one host: path-style.
#[cfg(feature = "s3")]
async fn aws_blobs(
    shared: &aws_types::SdkConfig,
    s: &AwsSettings,
    init: bool,
) -> Result<Arc<dyn Blobs>, String> {
    use crate::blobs::s3::S3Blobs;
    // Without tools, open_aws has refused an init already.
    #[cfg(not(feature = "tools"))]
    let _ = init;
    let conf = aws_sdk_s3::config::Builder::from(shared)
        .force_path_style(s.endpoint.is_some())
        .build();
    let s3 = aws_sdk_s3::Client::from_conf(conf);
    #[cfg(feature = "tools")]
    if init {
        crate::blobs::s3::ensure_bucket(&s3, &s.bucket)
            .await
            .map_err(|e| format!("cannot create bucket {}: {e}", s.bucket))?;
    }
    Ok(Arc::new(S3Blobs::new(s3, s.bucket.clone())))
}

/// A function that stores no documents carries no S3 client.
#[cfg(not(feature = "s3"))]
async fn aws_blobs(
    _: &aws_types::SdkConfig,
    s: &AwsSettings,
    init: bool,
) -> Result<Arc<dyn Blobs>, String> {
    if init {
        return Err(format!(
            "cannot create bucket {}: this build has no S3 client (feature s3)",
            s.bucket
        ));
    }
    Ok(Arc::new(crate::blobs::NoBlobs))
}

#[cfg(test)]
mod tests {
    /// Clones share one set of parts; a change to one clone copies them
    /// first, so the others keep what they had.
    #[test]
    fn a_state_changed_after_cloning_leaves_its_clones_as_they_were() {
        use std::sync::Arc;
        let first = super::AppState::for_tests();
        let second = first.clone();
        assert!(Arc::ptr_eq(&first.0, &second.0), "a clone is one pointer");
        let limits = super::RateLimits::default();
        limits.set(7, 3);
        let changed = first.clone().with_rate_limits(limits);
        assert!(!std::ptr::eq(first.limits(), changed.limits()));
        assert!(std::ptr::eq(first.limits(), second.limits()));
        assert!(
            Arc::ptr_eq(&first.store, &changed.store),
            "the rest is shared"
        );
    }

    #[test]
    fn the_base_url_falls_back_to_the_request_host() {
        let set = super::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        };
        assert_eq!(set.base_for(Some("evil.example")), "https://pay.example");
        let unset = super::Config {
            public_base_url: String::new(),
            events_base_url: None,
            dashboard_base_url: None,
        };
        assert_eq!(
            unset.base_for(Some("abc.execute-api.ap-south-1.amazonaws.com")),
            "https://abc.execute-api.ap-south-1.amazonaws.com"
        );
        assert_eq!(unset.base_for(Some("a/b@c")), "http://127.0.0.1:8080");
        assert_eq!(unset.base_for(None), "http://127.0.0.1:8080");
        // The event streams follow the pages unless they have their own URL.
        assert_eq!(set.events_base_for(None), "https://pay.example");
        let streaming = super::Config {
            events_base_url: Some("https://x7k.lambda-url.ap-south-1.on.aws".into()),
            ..set
        };
        assert_eq!(
            streaming.events_base_for(Some("pay.example")),
            "https://x7k.lambda-url.ap-south-1.on.aws"
        );
    }

    #[test]
    fn the_dashboard_host_is_told_from_the_public_one() {
        let single = super::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        };
        assert_eq!(single.on_dashboard_host(Some("pay.example")), None);
        let split = super::Config {
            dashboard_base_url: Some("https://Dash.example/".into()),
            ..single
        };
        assert_eq!(split.on_dashboard_host(Some("dash.example")), Some(true));
        assert_eq!(
            split.on_dashboard_host(Some("DASH.example:443")),
            Some(true)
        );
        assert_eq!(split.on_dashboard_host(Some("pay.example")), Some(false));
        assert_eq!(
            split.on_dashboard_host(Some("dash.example.evil")),
            Some(false)
        );
        assert_eq!(split.on_dashboard_host(None), Some(false));
        let local = super::Config {
            dashboard_base_url: Some("http://localhost:8080".into()),
            ..split
        };
        assert_eq!(local.on_dashboard_host(Some("localhost:8080")), Some(true));
        assert_eq!(local.on_dashboard_host(Some("127.0.0.1:8080")), Some(false));
    }

    use super::*;

    #[test]
    fn the_master_key_comes_from_the_environment_or_a_secret_never_both() {
        const ARN: &str = "arn:aws:secretsmanager:ap-south-1:123456789012:secret:ck-AbCdEf";
        let source = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            KeySource::from_lookup(move |name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            })
        };
        assert_eq!(source(&[]), Ok(KeySource::Missing));
        assert_eq!(
            source(&[(KEY_ENV, " "), (KEY_SECRET_ENV, "")]),
            Ok(KeySource::Missing)
        );
        assert_eq!(source(&[(KEY_ENV, "k1:AAAA")]), Ok(KeySource::Env));
        assert_eq!(
            source(&[(KEY_ENV, "k1:AAAA"), (PREVIOUS_KEYS_ENV, "k0:BBBB")]),
            Ok(KeySource::Env)
        );
        assert_eq!(
            source(&[(KEY_SECRET_ENV, &format!(" {ARN}\n"))]),
            Ok(KeySource::Secret(ARN.to_owned()))
        );
        let both = source(&[(KEY_ENV, "k1:AAAA"), (KEY_SECRET_ENV, ARN)]);
        assert!(matches!(&both, Err(e) if !e.contains("AAAA")), "{both:?}");
        let previous = source(&[(KEY_SECRET_ENV, ARN), (PREVIOUS_KEYS_ENV, "k0:BBBB")]);
        assert!(
            matches!(&previous, Err(e) if e.contains(ARN) && !e.contains("BBBB")),
            "{previous:?}"
        );
    }

    /// Against moto: the keys come out of a secret (plain or JSON with a
    /// previous key); a missing secret or a bad value fails naming the
    /// secret, never showing the value.
    #[tokio::test]
    async fn the_master_key_is_read_from_secrets_manager() {
        use base64::Engine;
        let Some(endpoint) = crate::queue::testkit::aws_endpoint() else {
            return;
        };
        let shared = match crate::aws::sdk_config(Some(&endpoint)) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let client = aws_sdk_secretsmanager::Client::new(&shared);
        let id = crate::ids::new_id(crate::ids::IdKind::Event);
        let b64 = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
        let old = base64::engine::general_purpose::STANDARD.encode([8u8; 32]);
        let create = |name: String, value: String| {
            let client = client.clone();
            async move {
                let out = client
                    .create_secret()
                    .name(name)
                    .secret_string(value)
                    .send()
                    .await;
                match out.map(|o| o.arn) {
                    Ok(Some(arn)) => arn,
                    other => panic!("create-secret: {other:?}"),
                }
            }
        };
        let plain = create(format!("dhukuti/{id}/plain"), format!("v1:{b64}\n")).await;
        let keys = keys_from_secret(Some(&endpoint), &plain).await;
        let Ok(keys) = keys else {
            panic!("{:?}", keys.err())
        };
        assert_eq!(keys.current().id(), "v1");

        let json = create(
            format!("dhukuti/{id}/json"),
            format!(r#"{{"current": "v2:{b64}", "previous": "v1:{old}"}}"#),
        )
        .await;
        let keys = keys_from_secret(Some(&endpoint), &json).await;
        let Ok(keys) = keys else {
            panic!("{:?}", keys.err())
        };
        assert_eq!(keys.current().id(), "v2");

        let bad = create(format!("dhukuti/{id}/bad"), "k1:c2hvcnQ=".to_owned()).await;
        let e = keys_from_secret(Some(&endpoint), &bad).await.err();
        let e = e.unwrap_or_default();
        assert!(e.contains(&bad) && !e.contains("c2hvcnQ"), "{e}");

        let missing = format!("dhukuti/{id}/missing");
        let e = keys_from_secret(Some(&endpoint), &missing).await.err();
        let e = e.unwrap_or_default();
        assert!(e.contains(&missing), "{e}");
    }

    #[test]
    fn the_store_cache_is_bounded_and_its_variable_checked() {
        assert_eq!(cache_mib(None), Ok(DEFAULT_CACHE_MIB));
        assert_eq!(cache_mib(Some("64")), Ok(64));
        assert_eq!(cache_mib(Some("65536")), Ok(MAX_CACHE_MIB));
        for bad in ["0", "-1", "65537", "1.5", "64MiB", " 64", "lots"] {
            let Err(e) = cache_mib(Some(bad)) else {
                panic!("{bad:?} accepted")
            };
            assert!(e.contains("DHUKUTI_STORE_CACHE_MIB"), "{e}");
        }
    }

    #[tokio::test]
    async fn the_embedded_backend_opens_in_a_fresh_directory() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!()
        };
        let backend = Backend::embedded(dir.path().join("nested"));
        assert!(backend.open(false).await.is_ok());
        assert!(dir.path().join("nested/dhukuti.redb").exists());
    }

    #[tokio::test]
    async fn the_aws_backend_creates_and_finds_its_resources() {
        let Some(endpoint) = crate::queue::testkit::aws_endpoint() else {
            return;
        };
        let id = crate::ids::new_id(crate::ids::IdKind::Event).replace('_', "-");
        let settings = AwsSettings {
            endpoint: Some(endpoint),
            table: format!("t-{id}"),
            queue_urls: HashMap::new(),
            queue_prefix: format!("q-{id}"),
            bucket: format!("b-{id}"),
        };
        let backend = Backend::Aws(settings);
        let Err(missing) = backend.open(false).await.map(|_| ()) else {
            panic!("queues that do not exist must not be found")
        };
        assert!(missing.contains("not found"), "{missing}");
        let opened = backend.open(true).await;
        let Ok((store, queue, blobs)) = opened else {
            panic!("{:?}", opened.err())
        };
        // A second init is harmless, and a plain open finds everything.
        assert!(backend.open(true).await.is_ok());
        assert!(backend.open(false).await.is_ok());
        let key = crate::store::Key::new("P", "S");
        let mut item = crate::store::Item::new();
        item.insert("pk".into(), "P".into());
        item.insert("sk".into(), "S".into());
        assert!(store.put(item, None).await.is_ok());
        assert!(store.get(&key).await.ok().flatten().is_some());
        let sent = queue
            .send(QueueName::Webhooks, "hello", std::time::Duration::ZERO)
            .await;
        assert!(sent.is_ok(), "{sent:?}");
        let put = blobs
            .put("a/b.txt", bytes::Bytes::from_static(b"x"), "text/plain")
            .await;
        assert!(put.is_ok(), "{put:?}");
    }
}
