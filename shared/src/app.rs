//! What every handler gets: the store, the queue, the blobs, the clock and
//! the configuration; and how a process builds them from its environment.
//!
//! Backends (`DHUKUTI_BACKEND`):
//! - `embedded` (default for the dev server): redb in `DHUKUTI_DATA_DIR`,
//!   an in-process queue, blobs in a directory;
//! - `aws`: DynamoDB (`DHUKUTI_TABLE`), SQS (`DHUKUTI_QUEUE_WEBHOOKS_URL`,
//!   `DHUKUTI_QUEUE_SMS_URL`, or found by name from `DHUKUTI_QUEUE_PREFIX`)
//!   and S3 (`DHUKUTI_BUCKET`), with the standard AWS environment
//!   (`AWS_REGION`, credentials, `AWS_ENDPOINT_URL` for moto or DynamoDB
//!   Local; S3 then uses path-style addressing).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::blobs::Blobs;
use crate::blobs::local::LocalDirBlobs;
use crate::blobs::memory::MemoryBlobs;
use crate::domain::webhooks::WebhookSettings;
use crate::http::ratelimit::RateLimits;
use crate::providers::ProviderHub;
use crate::queue::memory::InProcessQueue;
use crate::queue::{Queue, QueueName};
use crate::store::Store;
use crate::store::embedded::EmbeddedStore;
use crate::time::{Clock, SystemClock};

/// Configuration read once at start (environment variables).
#[derive(Clone, Debug)]
pub struct Config {
    /// Public base URL of the hosted pages (checkout, links), no trailing
    /// /. Empty on Lambda without `DHUKUTI_PUBLIC_URL`: then each request's
    /// own host is used ([`Config::base_for`]).
    pub public_base_url: String,
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
        Config {
            public_base_url: base.trim().trim_end_matches('/').to_owned(),
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

/// Shared by every request of a function (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub blobs: Arc<dyn Blobs>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<Config>,
    /// Provider clients and credentials (checkout attempts, reconciling).
    pub providers: Arc<ProviderHub>,
    /// Webhook receivers allowed, retry schedule, timeouts.
    pub webhooks: Arc<WebhookSettings>,
    /// Requests per second per API key (live, sandbox).
    pub limits: Arc<RateLimits>,
}

impl AppState {
    /// Tests: a state on a fresh in-memory embedded store, its clock a
    /// [`crate::time::ManualClock`] at the current time, the public base URL
    /// `http://127.0.0.1:8080`. Panics if the store cannot be made.
    #[cfg(any(test, feature = "testkit"))]
    pub fn for_tests() -> Self {
        let store = match EmbeddedStore::in_memory() {
            Ok(s) => s,
            Err(e) => panic!("in-memory store: {e}"),
        };
        AppState::new(
            Arc::new(store),
            Arc::new(crate::time::ManualClock::new(SystemClock.now())),
            Config {
                public_base_url: "http://127.0.0.1:8080".into(),
            },
        )
    }

    /// A state on `store` with an in-process queue and in-memory blobs
    /// (tests); replace them with [`AppState::with_queue`] and
    /// [`AppState::with_blobs`].
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: Config) -> Self {
        AppState {
            store,
            queue: Arc::new(InProcessQueue::new()),
            blobs: Arc::new(MemoryBlobs::new()),
            clock,
            config: Arc::new(config),
            providers: Arc::new(ProviderHub::unconfigured()),
            webhooks: Arc::new(WebhookSettings::default()),
            limits: Arc::new(RateLimits::default()),
        }
    }

    pub fn with_rate_limits(mut self, limits: RateLimits) -> Self {
        self.limits = Arc::new(limits);
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
        let providers = ProviderHub::from_env()?;
        let webhooks = WebhookSettings::from_env()?;
        let limits = RateLimits::from_env()?;
        Ok(
            AppState::new(store, Arc::new(SystemClock), Config::from_env())
                .with_queue(queue)
                .with_blobs(blobs)
                .with_providers(providers)
                .with_webhooks(webhooks)
                .with_rate_limits(limits),
        )
    }
}

/// Where the data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Embedded { data_dir: PathBuf },
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

impl Backend {
    /// Reads `DHUKUTI_BACKEND` and the variables of that backend.
    pub fn from_env() -> Result<Backend, String> {
        match env("DHUKUTI_BACKEND").as_deref().unwrap_or("embedded") {
            "embedded" => Ok(Backend::Embedded {
                data_dir: env("DHUKUTI_DATA_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from(".dhukuti")),
            }),
            "aws" => {
                let mut queue_urls = HashMap::new();
                for (queue, var) in [
                    (QueueName::Webhooks, "DHUKUTI_QUEUE_WEBHOOKS_URL"),
                    (QueueName::Sms, "DHUKUTI_QUEUE_SMS_URL"),
                ] {
                    if let Some(url) = env(var) {
                        queue_urls.insert(queue, url);
                    }
                }
                Ok(Backend::Aws(AwsSettings {
                    endpoint: env("AWS_ENDPOINT_URL"),
                    table: env("DHUKUTI_TABLE").unwrap_or_else(|| "dhukuti".into()),
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
            Backend::Embedded { data_dir } => {
                std::fs::create_dir_all(data_dir).map_err(|e| {
                    format!("cannot create data directory {}: {e}", data_dir.display())
                })?;
                let db = data_dir.join("dhukuti.redb");
                let store = EmbeddedStore::open(&db).map_err(|e| {
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
            Backend::Aws(settings) => open_aws(settings, init).await,
        }
    }
}

impl Backend {
    /// One line for people: where the data is.
    pub fn describe(&self) -> String {
        match self {
            Backend::Embedded { data_dir } => {
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
                let shared = aws_shared_config(s).await?;
                let dynamo = aws_sdk_dynamodb::Client::new(&shared);
                Ok(Arc::new(crate::store::dynamo::DynamoStore::new(
                    dynamo,
                    s.table.clone(),
                )))
            }
        }
    }
}

async fn aws_shared_config(s: &AwsSettings) -> Result<aws_config::SdkConfig, String> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(endpoint) = &s.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    let shared = loader.load().await;
    if shared.region().is_none() {
        return Err("no AWS region: set AWS_REGION".into());
    }
    Ok(shared)
}

async fn open_aws(
    s: &AwsSettings,
    init: bool,
) -> Result<(Arc<dyn Store>, Arc<dyn Queue>, Arc<dyn Blobs>), String> {
    use crate::blobs::s3::{S3Blobs, ensure_bucket};
    use crate::queue::sqs::{SqsQueue, ensure_queues, queue_name};
    use crate::store::dynamo::{DynamoStore, create_table};

    let shared = aws_shared_config(s).await?;
    let dynamo = aws_sdk_dynamodb::Client::new(&shared);
    let sqs = aws_sdk_sqs::Client::new(&shared);
    // A local endpoint serves every bucket on one host: path-style.
    let s3_conf = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(s.endpoint.is_some())
        .build();
    let s3 = aws_sdk_s3::Client::from_conf(s3_conf);

    let mut urls = s.queue_urls.clone();
    if init {
        create_table(&dynamo, &s.table)
            .await
            .map_err(|e| format!("cannot create table {}: {e}", s.table))?;
        let created = ensure_queues(&sqs, &s.queue_prefix)
            .await
            .map_err(|e| format!("cannot create queues {}-*: {e}", s.queue_prefix))?;
        for (queue, url) in created {
            urls.entry(queue).or_insert(url);
        }
        ensure_bucket(&s3, &s.bucket)
            .await
            .map_err(|e| format!("cannot create bucket {}: {e}", s.bucket))?;
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
    Ok((
        Arc::new(DynamoStore::new(dynamo, s.table.clone())),
        Arc::new(SqsQueue::new(sqs, urls)),
        Arc::new(S3Blobs::new(s3, s.bucket.clone())),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_base_url_falls_back_to_the_request_host() {
        let set = super::Config {
            public_base_url: "https://pay.example".into(),
        };
        assert_eq!(set.base_for(Some("evil.example")), "https://pay.example");
        let unset = super::Config {
            public_base_url: String::new(),
        };
        assert_eq!(
            unset.base_for(Some("abc.execute-api.ap-south-1.amazonaws.com")),
            "https://abc.execute-api.ap-south-1.amazonaws.com"
        );
        assert_eq!(unset.base_for(Some("a/b@c")), "http://127.0.0.1:8080");
        assert_eq!(unset.base_for(None), "http://127.0.0.1:8080");
    }

    use super::*;

    #[tokio::test]
    async fn the_embedded_backend_opens_in_a_fresh_directory() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!()
        };
        let backend = Backend::Embedded {
            data_dir: dir.path().join("nested"),
        };
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
