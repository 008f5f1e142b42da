//! What a tester runs before `sam local` (infra/README.md, "Test with SAM
//! local"): [`init_only`] creates the table, the queues, the bucket and
//! the credentials master key's secret on an AWS-compatible server and
//! returns (`cargo run -- --init-only`); [`seed`] creates the demo
//! merchant, its keys and the simulators' Fonepay credentials there and
//! says what a tester needs (`dhukuti-admin seed`). Both are idempotent:
//! what exists is kept.

use std::path::Path;
use std::sync::Arc;

use shared::AppState;
use shared::app::{AwsSettings, Backend, credentials_keys};
use shared::domain::credentials::{CredentialsKey, KEY_ENV, KEY_SECRET_ENV};
use shared::providers::ProviderHub;
use shared::queue::QueueName;
use shared::queue::sqs::queue_name;
use shared::time::SystemClock;

use crate::demo::{self, DemoKeys};

/// The id of the key [`init_only`] generates into a new secret.
pub const LOCAL_KEY_ID: &str = "samlocal";

/// Creates what is missing (table, queues with their dead-letter queues,
/// bucket; with [`KEY_SECRET_ENV`] set, that secret holding a new master
/// key) and returns what was found or made, one line each. Only the AWS
/// backend has anything to create.
pub async fn init_only(backend: &Backend) -> Result<Vec<String>, String> {
    let Backend::Aws(settings) = backend else {
        return Err(
            "--init-only creates AWS resources: set DHUKUTI_BACKEND=aws (and AWS_ENDPOINT_URL \
             for a local server)"
                .into(),
        );
    };
    backend.open(true).await?;
    let mut lines = vec![
        format!("table   {}", settings.table),
        format!("bucket  {}", settings.bucket),
    ];
    for queue in QueueName::ALL {
        lines.push(format!(
            "queue   {}",
            queue_name(&settings.queue_prefix, queue)
        ));
    }
    if let Some(secret) = env(KEY_SECRET_ENV) {
        if env(KEY_ENV).is_some() {
            return Err(format!("set {KEY_ENV} or {KEY_SECRET_ENV}, not both"));
        }
        let created = ensure_key_secret(settings, &secret).await?;
        let what = if created { "created" } else { "kept" };
        lines.push(format!(
            "secret  {secret} ({what}: the credentials master key)"
        ));
    }
    Ok(lines)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The secret `name` holding a credentials master key: created with a new
/// key when missing (`true`), kept as it is when it exists. The key is
/// never printed.
pub async fn ensure_key_secret(settings: &AwsSettings, name: &str) -> Result<bool, String> {
    use aws_sdk_secretsmanager::error::{DisplayErrorContext, ProvideErrorMetadata};
    let shared = shared::aws::sdk_config(settings.endpoint.as_deref())?;
    let client = aws_sdk_secretsmanager::Client::new(&shared);
    match client.describe_secret().secret_id(name).send().await {
        Ok(_) => return Ok(false),
        Err(e) if e.code() == Some("ResourceNotFoundException") => {}
        Err(e) => {
            return Err(format!(
                "cannot read the secret {name}: {}",
                DisplayErrorContext(&e)
            ));
        }
    }
    let key = CredentialsKey::generate(LOCAL_KEY_ID).map_err(|e| e.to_string())?;
    client
        .create_secret()
        .name(name)
        .secret_string(key.export())
        .send()
        .await
        .map_err(|e| {
            format!(
                "cannot create the secret {name}: {}",
                DisplayErrorContext(&e)
            )
        })?;
    Ok(true)
}

/// What [`seed`] made or found.
#[derive(Clone, Debug)]
pub struct Seeded {
    pub merchant_id: String,
    pub project_id: String,
    pub keys: DemoKeys,
    /// Whether the project has the simulator's sandbox Fonepay credentials
    /// (only with a credentials master key).
    pub fonepay: bool,
}

/// The demo merchant, project, keys and dashboard owner in the backend of
/// the environment (created once, reused after; their secrets kept in
/// `<data_dir>/demo-keys.json`, as the local gateway does), and, with a
/// credentials master key ([`KEY_ENV`] or the secret [`KEY_SECRET_ENV`]
/// names, as the functions read it), the simulator's sandbox Fonepay
/// credentials.
pub async fn seed(data_dir: &Path) -> Result<Seeded, String> {
    let backend = Backend::from_env()?;
    let (store, queue, blobs) = backend.open(false).await?;
    let keys = credentials_keys().await?;
    let has_key = keys.is_some();
    let providers = ProviderHub::from_env(keys)?;
    let state = AppState::new(store, Arc::new(SystemClock), shared::Config::from_env())
        .with_queue(queue)
        .with_blobs(blobs)
        .with_providers(providers);
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let account = demo::bootstrap(&state, &data_dir.join("demo-keys.json")).await?;
    demo::ensure_fonepay_credentials(&state, &account).await?;
    Ok(Seeded {
        merchant_id: account.merchant_id.to_string(),
        project_id: account.project_id.to_string(),
        keys: account.keys,
        fonepay: has_key,
    })
}
