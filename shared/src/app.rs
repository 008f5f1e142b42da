//! What every handler gets: the store, the clock and the configuration.

use std::path::PathBuf;
use std::sync::Arc;

use crate::store::Store;
use crate::store::embedded::EmbeddedStore;
use crate::time::{Clock, SystemClock};

/// Configuration read once at start (environment variables).
#[derive(Clone, Debug)]
pub struct Config {
    /// Public base URL of the hosted pages (checkout, links), no trailing /.
    pub public_base_url: String,
}

impl Config {
    pub fn from_env() -> Self {
        let base = std::env::var("DHUKUTI_PUBLIC_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:8080".to_owned());
        Config {
            public_base_url: base.trim_end_matches('/').to_owned(),
        }
    }
}

/// Shared by every request of a function (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<Config>,
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: Config) -> Self {
        AppState {
            store,
            clock,
            config: Arc::new(config),
        }
    }

    /// The state a Lambda function builds once at cold start from its
    /// environment: `DHUKUTI_BACKEND` (`embedded` for now; the DynamoDB
    /// backend is the next step) and `DHUKUTI_DATA_DIR`.
    pub fn from_env() -> Result<Self, String> {
        let backend = std::env::var("DHUKUTI_BACKEND").unwrap_or_else(|_| "embedded".to_owned());
        match backend.as_str() {
            "embedded" => {
                let dir = std::env::var("DHUKUTI_DATA_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|_| std::env::temp_dir().join("dhukuti"));
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
                let store = EmbeddedStore::open(&dir.join("dhukuti.redb"))
                    .map_err(|e| format!("cannot open the embedded store: {e}"))?;
                Ok(AppState::new(
                    Arc::new(store),
                    Arc::new(SystemClock),
                    Config::from_env(),
                ))
            }
            other => Err(format!(
                "DHUKUTI_BACKEND={other:?} is not supported; use 'embedded'"
            )),
        }
    }
}
