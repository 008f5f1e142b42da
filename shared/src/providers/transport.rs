//! The one HTTPS client behind every provider call: timeouts, no redirects,
//! a bounded answer, and errors mapped onto [`ProviderError`]. Nothing here
//! logs a URL, a header or a body (they may carry credentials).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{ProviderError, clip};
use crate::kinds::Provider;

/// Largest provider answer read (their answers are a few hundred bytes).
const MAX_BODY: usize = 256 * 1024;
const MAX_CONNECT: Duration = Duration::from_secs(5);

/// Built on first use, not at start: most functions never call a provider
/// (issue 21: a cold start pays only for what it uses). Every client of
/// the process shares one TLS configuration ([`crate::tls::outbound`]).
#[derive(Clone)]
pub(crate) struct Transport {
    timeout: Duration,
    client: Arc<OnceLock<reqwest::Client>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").finish_non_exhaustive()
    }
}

/// A provider's answer, whatever its status.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The start of the body as text, for error messages.
    pub fn snippet(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let one_line: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        clip(one_line.trim(), 120)
    }

    /// 5xx, 429 and 408: the provider's trouble, worth a retry.
    pub fn unavailable(&self) -> Option<ProviderError> {
        (self.status >= 500 || self.status == 429 || self.status == 408)
            .then(|| ProviderError::Unavailable(format!("HTTP {}", self.status)))
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

impl Transport {
    pub fn new(timeout: Duration) -> Self {
        Transport {
            timeout,
            client: Arc::new(OnceLock::new()),
        }
    }

    /// The HTTPS client, built on the first call. A failure (a crypto
    /// provider with neither TLS 1.2 nor 1.3) is answered to that call and
    /// tried again on the next.
    pub fn client(&self) -> Result<&reqwest::Client, ProviderError> {
        if let Some(client) = self.client.get() {
            return Ok(client);
        }
        let unusable =
            |e: String| ProviderError::Unavailable(format!("cannot build the HTTPS client: {e}"));
        let tls = crate::tls::outbound().map_err(unusable)?;
        let client = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.timeout.min(MAX_CONNECT))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("dhukuti/", env!("CARGO_PKG_VERSION")))
            .tls_backend_preconfigured((*tls).clone())
            .build()
            .map_err(|e| unusable(e.without_url().to_string()))?;
        Ok(self.client.get_or_init(|| client))
    }

    /// Send `request` and read the whole answer (any HTTP status).
    pub async fn send(
        &self,
        provider: Provider,
        op: &'static str,
        request: reqwest::RequestBuilder,
    ) -> Result<Reply, ProviderError> {
        let started = Instant::now();
        let result = self.exchange(request).await;
        let ms = started.elapsed().as_millis() as u64;
        let provider = provider.as_str();
        match &result {
            Ok(reply) => tracing::debug!(provider, op, status = reply.status, ms, "provider call"),
            Err(e) => tracing::warn!(provider, op, ms, error = %e, "provider call failed"),
        }
        result
    }

    async fn exchange(&self, request: reqwest::RequestBuilder) -> Result<Reply, ProviderError> {
        let mut response = request.send().await.map_err(map_error)?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(map_error)? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(ProviderError::Protocol(format!(
                    "answer larger than {MAX_BODY} bytes (HTTP {status})"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Reply { status, body })
    }
}

fn map_error(e: reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout
    } else if e.is_connect() {
        ProviderError::Unavailable("connection failed".into())
    } else if e.is_builder() {
        ProviderError::Invalid(format!("bad request: {}", e.without_url()))
    } else {
        ProviderError::Unavailable(clip(&e.without_url().to_string(), 200))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function that never calls a provider never builds an HTTPS
    /// client; the clients of a mode share one.
    #[test]
    fn the_client_is_built_on_first_use_and_shared() {
        let transport = Transport::new(Duration::from_secs(5));
        let copy = transport.clone();
        assert!(transport.client.get().is_none(), "built at start");
        let first = match transport.client() {
            Ok(c) => c as *const reqwest::Client,
            Err(e) => panic!("{e}"),
        };
        let again = match copy.client() {
            Ok(c) => c as *const reqwest::Client,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(first, again, "the clones share one client");
    }
}
