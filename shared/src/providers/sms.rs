//! The SMS provider client: a Sparrow SMS-style HTTP API.
//!
//! `POST <base>/api/v2/sms/` with a form body `token`, `from`, `to`,
//! `text`; a 2xx answer means the provider accepted the message. The base
//! URL, token and sender come from `DHUKUTI_SMS_BASE_URL`,
//! `DHUKUTI_SMS_TOKEN` and `DHUKUTI_SMS_FROM`. The token is a credential:
//! it is never logged, and `Debug` hides it.

use std::time::Duration;

/// How long one send may take before it counts as a (transient) timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The sender id when `DHUKUTI_SMS_FROM` is not set.
pub const DEFAULT_FROM: &str = "Dhukuti";
/// Largest answer read from the provider.
const MAX_BODY: usize = 64 * 1024;

/// Where and as whom SMS are sent.
#[derive(Clone)]
pub struct SmsConfig {
    /// Without a trailing slash, e.g. `https://api.sparrowsms.com`.
    pub base_url: String,
    pub token: String,
    pub from: String,
    pub timeout: Duration,
}

impl std::fmt::Debug for SmsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmsConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("from", &self.from)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SmsConfig {
    /// From the process environment.
    pub fn from_env() -> Result<SmsConfig, String> {
        SmsConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// From `lookup` (the environment, or the dev server's defaults).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<SmsConfig, String> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let base_url = get("DHUKUTI_SMS_BASE_URL")
            .ok_or("DHUKUTI_SMS_BASE_URL is not set (the SMS provider's base URL)")?;
        let base_url = base_url.trim().trim_end_matches('/').to_owned();
        if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
            return Err(format!(
                "DHUKUTI_SMS_BASE_URL={base_url:?} must be an http(s) URL"
            ));
        }
        let token = get("DHUKUTI_SMS_TOKEN").ok_or("DHUKUTI_SMS_TOKEN is not set")?;
        let from = get("DHUKUTI_SMS_FROM").unwrap_or_else(|| DEFAULT_FROM.to_owned());
        Ok(SmsConfig {
            base_url,
            token: token.trim().to_owned(),
            from: from.trim().to_owned(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The send endpoint.
    pub fn send_url(&self) -> String {
        format!("{}/api/v2/sms/", self.base_url)
    }
}

/// Why a send did not go through. The provider takes no idempotency key,
/// so a send is retried only when the message certainly did not reach it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmsSendError {
    /// Certainly not accepted: no connection was made, or the provider
    /// answered 408, 429 or 503 (refused before taking the message).
    /// Worth another try.
    #[error("SMS provider unavailable: {0}")]
    Transient(String),
    /// Maybe accepted: the request went out and no clear answer came back
    /// (a timeout, a connection lost mid-answer, 500, 502, 504 or another
    /// 5xx). Never retried: a second send could reach the customer twice.
    #[error("SMS provider outcome unknown: {0}")]
    Unknown(String),
    /// The provider refused the message (4xx): retrying will not help.
    #[error("SMS provider rejected the message (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },
}

/// What an answer with HTTP `status` (and `body`, for a refusal's
/// message) means for the message: `None` when it was accepted.
pub fn answer_error(status: u16, body: &str) -> Option<SmsSendError> {
    match status {
        200..=299 => None,
        408 | 429 | 503 => Some(SmsSendError::Transient(format!("HTTP {status}"))),
        500..=599 => Some(SmsSendError::Unknown(format!("HTTP {status}"))),
        _ => Some(SmsSendError::Rejected {
            status,
            message: body.to_owned(),
        }),
    }
}

/// A client of one SMS provider account (cheap to clone: one pool).
#[derive(Clone)]
pub struct SmsClient {
    http: reqwest::Client,
    config: SmsConfig,
}

impl std::fmt::Debug for SmsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmsClient")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SmsClient {
    pub fn new(config: SmsConfig) -> Result<SmsClient, String> {
        let tls = crate::tls::outbound().map_err(|e| format!("SMS HTTP client: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .tls_backend_preconfigured((*tls).clone())
            .build()
            .map_err(|e| format!("SMS HTTP client: {e}"))?;
        Ok(SmsClient { http, config })
    }

    pub fn config(&self) -> &SmsConfig {
        &self.config
    }

    /// Sends `text` to `to` (10-digit Nepali mobile number). Nothing
    /// logged here names the token.
    pub async fn send(&self, to: &str, text: &str) -> Result<(), SmsSendError> {
        let form = [
            ("token", self.config.token.as_str()),
            ("from", self.config.from.as_str()),
            ("to", to),
            ("text", text),
        ];
        let body = form_body(&form);
        let res = self
            .http
            .post(self.config.send_url())
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| {
                // A connect error (a connect timeout included) means the
                // request never left; anything later may have reached it.
                if e.is_connect() {
                    SmsSendError::Transient("cannot connect".to_owned())
                } else if e.is_timeout() {
                    SmsSendError::Unknown("timed out".to_owned())
                } else {
                    SmsSendError::Unknown("request failed".to_owned())
                }
            })?;
        let status = res.status().as_u16();
        let body = res.bytes().await.unwrap_or_default();
        let snippet: String = String::from_utf8_lossy(&body[..body.len().min(MAX_BODY)])
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(160)
            .collect();
        match answer_error(status, snippet.trim()) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// `application/x-www-form-urlencoded` of `pairs`.
fn form_body(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_needs_a_base_and_a_token_and_hides_the_token() {
        let none = SmsConfig::from_lookup(|_| None);
        assert!(none.is_err());
        let Ok(c) = SmsConfig::from_lookup(|n| match n {
            "DHUKUTI_SMS_BASE_URL" => Some("http://127.0.0.1:9/sim/sms/".into()),
            "DHUKUTI_SMS_TOKEN" => Some("secret-token-123".into()),
            _ => None,
        }) else {
            panic!("config")
        };
        assert_eq!(c.send_url(), "http://127.0.0.1:9/sim/sms/api/v2/sms/");
        assert_eq!(c.from, DEFAULT_FROM);
        assert!(!format!("{c:?}").contains("secret-token-123"));
        let bad = SmsConfig::from_lookup(|n| match n {
            "DHUKUTI_SMS_BASE_URL" => Some("ftp://x".into()),
            "DHUKUTI_SMS_TOKEN" => Some("t".into()),
            _ => None,
        });
        assert!(bad.is_err());
    }

    #[test]
    fn only_answers_that_prove_nothing_was_taken_are_retried() {
        assert_eq!(answer_error(200, ""), None);
        assert_eq!(answer_error(201, ""), None);
        for s in [408, 429, 503] {
            assert!(
                matches!(answer_error(s, ""), Some(SmsSendError::Transient(_))),
                "{s}"
            );
        }
        for s in [500, 502, 504, 599] {
            assert!(
                matches!(answer_error(s, ""), Some(SmsSendError::Unknown(_))),
                "{s}"
            );
        }
        assert_eq!(
            answer_error(403, "Invalid Token"),
            Some(SmsSendError::Rejected {
                status: 403,
                message: "Invalid Token".into()
            })
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient_and_a_silent_provider_is_unknown() {
        let client = |base: String| {
            SmsClient::new(SmsConfig {
                base_url: base,
                token: "t".into(),
                from: "Dhukuti".into(),
                timeout: Duration::from_millis(300),
            })
        };
        // Nothing listens on port 9 of loopback: refused.
        let Ok(refused) = client("http://127.0.0.1:9".into()) else {
            panic!("client")
        };
        let r = refused.send("9841000001", "hi").await;
        assert!(matches!(r, Err(SmsSendError::Transient(_))), "{r:?}");
        // Accepts the connection, reads the request, never answers.
        let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
            panic!("bind")
        };
        let Ok(addr) = listener.local_addr() else {
            panic!("addr")
        };
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let Ok(mute) = client(format!("http://{addr}")) else {
            panic!("client")
        };
        let r = mute.send("9841000001", "hi").await;
        assert!(matches!(r, Err(SmsSendError::Unknown(_))), "{r:?}");
        silent.abort();
    }
}
