//! The email senders: Amazon SES v2 `SendEmail` with a configuration set
//! (feature `ses`), or an HTTP endpoint that takes the message as JSON (the
//! local gateway's mail simulator, `infra/src/simulators/mail.rs`).
//!
//! Configuration (`MailConfig::from_lookup`):
//! - `DHUKUTI_MAIL_FROM`: the sender address (an SES-verified identity);
//! - `DHUKUTI_MAIL_BASE_URL`: when set, mail is posted to `<base>/send`
//!   (the simulator) instead of SES;
//! - `DHUKUTI_SES_CONFIGURATION_SET`: the configuration set SES sends with
//!   (its event destination publishes bounces and complaints to SNS).
//!
//! Neither takes an idempotency key, so, as for SMS, a send is retried only
//! when it certainly did not reach the service ([`MailSendError`]).

use std::time::Duration;

/// How long one send may take before its outcome counts as unknown.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The sender when `DHUKUTI_MAIL_FROM` is not set (the simulator's).
pub const DEFAULT_FROM: &str = "billing@dhukuti.local";
/// The message tag that names the stored message (SES publishes it with
/// each bounce or complaint: `mail.tags`).
pub const TAG_MAIL_ID: &str = "dhukuti_mail";
/// The message tag that names the project.
pub const TAG_PROJECT: &str = "dhukuti_project";

/// One message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutgoingMail<'a> {
    pub to: &'a str,
    pub subject: &'a str,
    pub text: &'a str,
    pub html: &'a str,
    /// Name and value pairs (letters, digits, `_` and `-`).
    pub tags: Vec<(&'static str, &'a str)>,
}

/// The longest address accepted (RFC 5321's path limit).
pub const MAX_ADDRESS: usize = 254;

/// Whether `s` looks like one deliverable address: `local@domain.tld`, no
/// spaces, controls, quotes or angle brackets, at most [`MAX_ADDRESS`].
pub fn is_address(s: &str) -> bool {
    if s.len() > MAX_ADDRESS || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return false;
    }
    let Some((local, domain)) = s.rsplit_once('@') else {
        return false;
    };
    let labels_ok = domain.split('.').count() >= 2
        && domain.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    !local.is_empty()
        && local.len() <= 64
        && !local.contains('@')
        && !local
            .chars()
            .any(|c| matches!(c, '"' | '<' | '>' | '(' | ')' | ',' | ';' | '\\'))
        && labels_ok
}

/// Why a send did not go through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MailSendError {
    /// Certainly not taken (no connection, throttled, 503): try again.
    #[error("mail service unavailable: {0}")]
    Transient(String),
    /// Maybe taken (a timeout, a lost answer, another 5xx): never resent.
    #[error("mail service outcome unknown: {0}")]
    Unknown(String),
    /// Refused (4xx, or a message SES would not build): final.
    #[error("mail service rejected the message: {0}")]
    Rejected(String),
}

/// What an HTTP answer `status` means (the simulator's sends).
pub fn answer_error(status: u16, body: &str) -> Option<MailSendError> {
    match status {
        200..=299 => None,
        408 | 429 | 503 => Some(MailSendError::Transient(format!("HTTP {status}"))),
        500..=599 => Some(MailSendError::Unknown(format!("HTTP {status}"))),
        _ => Some(MailSendError::Rejected(format!("HTTP {status}: {body}"))),
    }
}

/// Where and how mail is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MailConfig {
    pub from: String,
    /// `Some`: the HTTP endpoint (simulator); `None`: SES.
    pub base_url: Option<String>,
    pub configuration_set: Option<String>,
    pub timeout: Duration,
}

impl MailConfig {
    pub fn from_env() -> Result<MailConfig, String> {
        MailConfig::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<MailConfig, String> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let from = get("DHUKUTI_MAIL_FROM").unwrap_or_else(|| DEFAULT_FROM.to_owned());
        if !is_address(&from) {
            return Err(format!(
                "DHUKUTI_MAIL_FROM={from:?} is not an email address"
            ));
        }
        let base_url = get("DHUKUTI_MAIL_BASE_URL").map(|b| b.trim_end_matches('/').to_owned());
        if let Some(b) = &base_url
            && !(b.starts_with("http://") || b.starts_with("https://"))
        {
            return Err(format!(
                "DHUKUTI_MAIL_BASE_URL={b:?} must be an http(s) URL"
            ));
        }
        Ok(MailConfig {
            from,
            base_url,
            configuration_set: get("DHUKUTI_SES_CONFIGURATION_SET"),
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

/// A sender (cheap to clone).
#[derive(Clone, Debug)]
pub enum MailSender {
    /// JSON to `<base>/send` (the simulator: it receives every address).
    Http(HttpSender),
    /// Amazon SES v2.
    #[cfg(feature = "ses")]
    Ses(SesSender),
}

impl MailSender {
    /// The sender `config` names; SES through `sdk` (its endpoint, e.g.
    /// moto's, included).
    #[cfg(feature = "ses")]
    pub fn new(config: MailConfig, sdk: &aws_types::SdkConfig) -> Result<MailSender, String> {
        match config.base_url.clone() {
            Some(base) => HttpSender::new(config, base).map(MailSender::Http),
            None => Ok(MailSender::Ses(SesSender::new(config, sdk))),
        }
    }

    /// The sender the environment names ([`MailConfig::from_env`]); SES
    /// through `AWS_ENDPOINT_URL` when set (moto).
    #[cfg(feature = "ses")]
    pub fn from_env() -> Result<MailSender, String> {
        let config = MailConfig::from_env()?;
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .ok()
            .filter(|v| !v.trim().is_empty());
        let sdk = crate::aws::sdk_config(endpoint.as_deref())?;
        MailSender::new(config, &sdk)
    }

    /// Whether sandbox mail may only go to the project's verified
    /// addresses: on SES, real mail reaches real people; the simulator
    /// keeps everything.
    pub fn sandbox_needs_verified(&self) -> bool {
        match self {
            MailSender::Http(h) => h.verified_only,
            #[cfg(feature = "ses")]
            MailSender::Ses(_) => true,
        }
    }

    /// Sends `mail`; answers the service's message id.
    pub async fn send(&self, mail: &OutgoingMail<'_>) -> Result<String, MailSendError> {
        match self {
            MailSender::Http(h) => h.send(mail).await,
            #[cfg(feature = "ses")]
            MailSender::Ses(s) => s.send(mail).await,
        }
    }
}

/// Posts the message as JSON to `<base>/send`.
#[derive(Clone, Debug)]
pub struct HttpSender {
    http: reqwest::Client,
    url: String,
    from: String,
    verified_only: bool,
}

impl HttpSender {
    pub fn new(config: MailConfig, base: String) -> Result<HttpSender, String> {
        let tls = crate::tls::outbound().map_err(|e| format!("mail HTTP client: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .tls_backend_preconfigured((*tls).clone())
            .build()
            .map_err(|e| format!("mail HTTP client: {e}"))?;
        Ok(HttpSender {
            http,
            url: format!("{base}/send"),
            from: config.from,
            verified_only: false,
        })
    }

    /// Treats this endpoint as one that delivers for real: sandbox mail
    /// only to verified addresses (tests of that rule).
    pub fn sandbox_verified_only(mut self, yes: bool) -> Self {
        self.verified_only = yes;
        self
    }

    async fn send(&self, mail: &OutgoingMail<'_>) -> Result<String, MailSendError> {
        let tags: serde_json::Map<String, serde_json::Value> = mail
            .tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let body = serde_json::json!({
            "from": self.from,
            "to": mail.to,
            "subject": mail.subject,
            "text": mail.text,
            "html": mail.html,
            "tags": tags,
        });
        let res = self
            .http
            .post(&self.url)
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    MailSendError::Transient("cannot connect".to_owned())
                } else if e.is_timeout() {
                    MailSendError::Unknown("timed out".to_owned())
                } else {
                    MailSendError::Unknown("request failed".to_owned())
                }
            })?;
        let status = res.status().as_u16();
        let answer = res.bytes().await.unwrap_or_default();
        let text: String = String::from_utf8_lossy(&answer[..answer.len().min(4096)])
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(160)
            .collect();
        if let Some(e) = answer_error(status, text.trim()) {
            return Err(e);
        }
        let id = serde_json::from_slice::<serde_json::Value>(&answer)
            .ok()
            .and_then(|v| {
                v.get("messageId")
                    .and_then(|m| m.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        Ok(id)
    }
}

/// SES v2 `SendEmail`.
#[cfg(feature = "ses")]
#[derive(Clone, Debug)]
pub struct SesSender {
    client: aws_sdk_sesv2::Client,
    from: String,
    configuration_set: Option<String>,
}

#[cfg(feature = "ses")]
impl SesSender {
    pub fn new(config: MailConfig, sdk: &aws_types::SdkConfig) -> SesSender {
        let timeouts = aws_smithy_types_timeout(config.timeout);
        let conf = aws_sdk_sesv2::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .build();
        SesSender {
            client: aws_sdk_sesv2::Client::from_conf(conf),
            from: config.from,
            configuration_set: config.configuration_set,
        }
    }

    /// The SDK client (tests verify identities on moto with it).
    pub fn client(&self) -> &aws_sdk_sesv2::Client {
        &self.client
    }

    async fn send(&self, mail: &OutgoingMail<'_>) -> Result<String, MailSendError> {
        use aws_sdk_sesv2::types::{Body, Content, Destination, EmailContent, Message, MessageTag};
        let bad = |e: aws_sdk_sesv2::error::BuildError| MailSendError::Rejected(e.to_string());
        let content = |s: &str| {
            Content::builder()
                .data(s)
                .charset("UTF-8")
                .build()
                .map_err(bad)
        };
        let message = Message::builder()
            .subject(content(mail.subject)?)
            .body(
                Body::builder()
                    .text(content(mail.text)?)
                    .html(content(mail.html)?)
                    .build(),
            )
            .build();
        let mut req = self
            .client
            .send_email()
            .from_email_address(&self.from)
            .destination(Destination::builder().to_addresses(mail.to).build())
            .content(EmailContent::builder().simple(message).build());
        if let Some(set) = &self.configuration_set {
            req = req.configuration_set_name(set);
        }
        for (name, value) in &mail.tags {
            req = req.email_tags(
                MessageTag::builder()
                    .name(*name)
                    .value(*value)
                    .build()
                    .map_err(bad)?,
            );
        }
        match req.send().await {
            Ok(out) => Ok(out.message_id().unwrap_or_default().to_owned()),
            Err(e) => Err(ses_error(&e)),
        }
    }
}

#[cfg(feature = "ses")]
fn aws_smithy_types_timeout(total: Duration) -> aws_sdk_sesv2::config::timeout::TimeoutConfig {
    aws_sdk_sesv2::config::timeout::TimeoutConfig::builder()
        .connect_timeout(total.min(Duration::from_secs(5)))
        .operation_attempt_timeout(total)
        .operation_timeout(total)
        .build()
}

/// What an SES error means for the message.
#[cfg(feature = "ses")]
fn ses_error<E>(e: &aws_sdk_sesv2::error::SdkError<E>) -> MailSendError
where
    E: aws_sdk_sesv2::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    use aws_sdk_sesv2::error::{DisplayErrorContext, ProvideErrorMetadata as _, SdkError};
    let why = DisplayErrorContext(e).to_string();
    match e {
        SdkError::ConstructionFailure(_) => MailSendError::Rejected(why),
        // Connecting failed: nothing left; anything later may have.
        SdkError::DispatchFailure(d) if !d.is_timeout() && why.contains("Connect") => {
            MailSendError::Transient(why)
        }
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            MailSendError::Unknown(why)
        }
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = e.code().unwrap_or_default();
            let refused_before = matches!(
                code,
                "TooManyRequestsException" | "LimitExceededException" | "SendingPausedException"
            );
            if refused_before || matches!(status, 429 | 503) {
                MailSendError::Transient(why)
            } else if status >= 500 {
                MailSendError::Unknown(why)
            } else {
                MailSendError::Rejected(why)
            }
        }
        _ => MailSendError::Unknown(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_prove_nothing_was_taken_are_retried() {
        assert_eq!(answer_error(200, ""), None);
        for s in [408, 429, 503] {
            assert!(matches!(
                answer_error(s, ""),
                Some(MailSendError::Transient(_))
            ));
        }
        for s in [500, 502, 504] {
            assert!(matches!(
                answer_error(s, ""),
                Some(MailSendError::Unknown(_))
            ));
        }
        assert!(matches!(
            answer_error(400, "no"),
            Some(MailSendError::Rejected(_))
        ));
    }

    #[test]
    fn the_config_reads_the_sender_and_the_simulator() {
        let Ok(c) = MailConfig::from_lookup(|n| match n {
            "DHUKUTI_MAIL_BASE_URL" => Some("http://127.0.0.1:9/sim/mail/".into()),
            "DHUKUTI_SES_CONFIGURATION_SET" => Some("dhukuti".into()),
            _ => None,
        }) else {
            panic!("config")
        };
        assert_eq!(c.from, DEFAULT_FROM);
        assert_eq!(c.base_url.as_deref(), Some("http://127.0.0.1:9/sim/mail"));
        assert_eq!(c.configuration_set.as_deref(), Some("dhukuti"));
        assert!(
            MailConfig::from_lookup(|n| (n == "DHUKUTI_MAIL_FROM").then(|| "nope".into())).is_err()
        );
        assert!(
            MailConfig::from_lookup(|n| (n == "DHUKUTI_MAIL_BASE_URL").then(|| "ftp://x".into()))
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient() {
        let Ok(c) = MailConfig::from_lookup(|_| None) else {
            panic!("config")
        };
        let Ok(s) = HttpSender::new(c, "http://127.0.0.1:9".into()) else {
            panic!("sender")
        };
        let r = MailSender::Http(s)
            .send(&OutgoingMail {
                to: "a@example.com",
                subject: "s",
                text: "t",
                html: "<p>t</p>",
                tags: vec![],
            })
            .await;
        assert!(matches!(r, Err(MailSendError::Transient(_))), "{r:?}");
    }
}
