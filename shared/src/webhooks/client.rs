//! The HTTP client that delivers webhooks: the SSRF guard applied at
//! connection time, no redirects, a hard timeout, and an answer reduced to
//! what the delivery log keeps (the status, or why there was none).
//!
//! DNS can change between registration and delivery, so the URL is checked
//! again here ([`ssrf::check_url`]) and every address a host name resolves
//! to is checked by the client's own resolver, the one the connection then
//! uses: there is no window between the check and the connect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::signature::{SIGNATURE_HEADER, TIMESTAMP_HEADER, sign};
use super::ssrf::{self, Policy, UrlError};

/// Longest part of a receiver's answer we read.
const MAX_ANSWER: usize = 64 * 1024;

/// Longest part of a receiver's answer the delivery log keeps.
pub const MAX_KEPT_ANSWER: usize = 1024;

/// What one delivery attempt got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The receiver answered this HTTP status, with the start of its body
    /// (at most [`MAX_KEPT_ANSWER`] bytes, as text).
    Answered(u16, String),
    /// No answer: the reason, for the delivery log (no secrets in it).
    NoAnswer(String),
}

impl Sent {
    pub fn is_success(&self) -> bool {
        matches!(self, Sent::Answered(s, _) if (200..300).contains(s))
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Sent::Answered(s, _) => Some(*s),
            Sent::NoAnswer(_) => None,
        }
    }
}

/// Resolves with the system resolver and refuses a name if any of its
/// addresses is forbidden (loopback only when the policy allows local
/// receivers and the name is `localhost`).
struct GuardedResolver {
    allow_local: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let allow_local = self.allow_local;
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|_| Box::new(UrlError::Unresolvable(host.clone())))?
                .collect();
            if addrs.is_empty() {
                return Err(Box::new(UrlError::Unresolvable(host)).into());
            }
            for a in &addrs {
                match ssrf::forbidden_kind(a.ip()) {
                    None => {}
                    Some("loopback") if allow_local && host == "localhost" => {}
                    Some(kind) => return Err(Box::new(UrlError::Forbidden(kind)).into()),
                }
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Delivers signed bodies. Cheap to clone; build one per process.
#[derive(Clone)]
pub struct WebhookClient {
    client: reqwest::Client,
    policy: Policy,
    timeout: Duration,
}

impl std::fmt::Debug for WebhookClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookClient")
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl WebhookClient {
    /// A client under `policy` that gives a receiver `timeout` to answer.
    pub fn new(policy: Policy, timeout: Duration) -> Result<Self, String> {
        let tls =
            crate::tls::outbound().map_err(|e| format!("cannot build the webhook client: {e}"))?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would resolve and connect for us, past the guard.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                allow_local: policy.allow_local_http,
            }))
            .user_agent(concat!("dhukuti-webhooks/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(30))
            .tls_backend_preconfigured((*tls).clone())
            .build()
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        Ok(WebhookClient {
            client,
            policy,
            timeout,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` to `url`, signed with `secret` at `timestamp` (unix
    /// seconds). `local_allowed` says whether this delivery may go to a
    /// local http receiver (sandbox endpoints under the dev flag).
    pub async fn send(
        &self,
        url: &str,
        secret: &str,
        timestamp: i64,
        body: &[u8],
        local_allowed: bool,
    ) -> Sent {
        let policy = Policy {
            allow_local_http: self.policy.allow_local_http && local_allowed,
        };
        let target = match ssrf::check_url(url, policy) {
            Ok(t) => t,
            Err(e) => return Sent::NoAnswer(format!("refused before sending: {e}")),
        };
        // Names are checked by the client's resolver at connect time (the
        // reason reaches the log through `connect_reason`), inside the
        // request's timeout.
        let signature = sign(secret, timestamp, body);
        let request = self
            .client
            .post(target.url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .body(body.to_vec());
        match request.send().await {
            Ok(mut response) => {
                let status = response.status().as_u16();
                // Drain a little of the answer so the connection can be
                // reused; its first KB is kept for the delivery log.
                let mut read = 0usize;
                let mut kept: Vec<u8> = Vec::new();
                while read < MAX_ANSWER {
                    match response.chunk().await {
                        Ok(Some(chunk)) => {
                            read += chunk.len();
                            let room = MAX_KEPT_ANSWER.saturating_sub(kept.len());
                            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                        }
                        _ => break,
                    }
                }
                Sent::Answered(status, answer_text(&kept))
            }
            Err(e) if e.is_timeout() => {
                Sent::NoAnswer(format!("no answer within {} s", self.timeout.as_secs_f64()))
            }
            Err(e) if e.is_connect() => Sent::NoAnswer(connect_reason(&e)),
            Err(e) => Sent::NoAnswer(format!("request failed: {}", without_url(&e))),
        }
    }
}

/// The kept start of an answer as text: invalid UTF-8 replaced, a
/// character cut by the limit dropped.
fn answer_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// Why a connection failed, naming a refused address kind when that was
/// the cause.
fn connect_reason(e: &reqwest::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(u) = s.downcast_ref::<UrlError>() {
            return format!("refused: {u}");
        }
        source = s.source();
    }
    format!("could not connect: {}", without_url(e))
}

fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhooks::signature::verify;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server answering `status`; returns its port and the
    /// raw request it got.
    async fn one_shot(status: u16) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 16 * 1024];
            let mut got = Vec::new();
            loop {
                let n = sock.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(head_end) = text.find("\r\n\r\n") {
                    let len = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            let l = l.to_ascii_lowercase();
                            l.strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if got.len() >= head_end + 4 + len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let answer =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            sock.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&got).to_string()
        });
        (port, task)
    }

    fn local() -> WebhookClient {
        WebhookClient::new(
            Policy {
                allow_local_http: true,
            },
            Duration::from_secs(2),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_local_receiver_gets_a_signed_body_when_allowed() {
        let (port, task) = one_shot(204).await;
        let url = format!("http://127.0.0.1:{port}/hook");
        let sent = local()
            .send(&url, "whsec_x", 1_700_000_000, b"{\"a\":1}", true)
            .await;
        assert_eq!(sent.status(), Some(204));
        assert!(sent.is_success());
        let raw = task.await.unwrap();
        let lower = raw.to_ascii_lowercase();
        assert!(lower.contains("x-service-timestamp: 1700000000"), "{raw}");
        let sig = raw
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .starts_with("x-service-signature:")
                    .then(|| l.split_once(':').unwrap().1.trim().to_owned())
            })
            .unwrap();
        assert!(verify(&sig, b"{\"a\":1}", &["whsec_x"], 1_700_000_010).is_ok());
        assert!(raw.ends_with("{\"a\":1}"), "{raw}");
    }

    #[tokio::test]
    async fn loopback_is_refused_without_the_flag_or_for_live() {
        let (port, _task) = one_shot(200).await;
        let url = format!("http://127.0.0.1:{port}/hook");
        let strict = WebhookClient::new(Policy::default(), Duration::from_secs(2)).unwrap();
        let sent = strict.send(&url, "s", 1, b"{}", true).await;
        assert!(
            matches!(sent, Sent::NoAnswer(ref why) if why.contains("refused")),
            "{sent:?}"
        );
        // The flag is on but this delivery is not allowed local (live).
        let sent = local().send(&url, "s", 1, b"{}", false).await;
        assert!(
            matches!(sent, Sent::NoAnswer(ref why) if why.contains("refused")),
            "{sent:?}"
        );
        let https_loopback = format!("https://127.0.0.1:{port}/hook");
        let sent = local().send(&https_loopback, "s", 1, b"{}", true).await;
        assert!(
            matches!(sent, Sent::NoAnswer(ref why) if why.contains("loopback")),
            "{sent:?}"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_connect() {
        let client = WebhookClient::new(Policy::default(), Duration::from_secs(2)).unwrap();
        let sent = client
            .send("https://localhost.localdomain./x", "s", 1, b"{}", true)
            .await;
        assert!(matches!(sent, Sent::NoAnswer(_)), "{sent:?}");
        assert!(!sent.is_success());
    }

    #[tokio::test]
    async fn non_2xx_and_silence_are_failures() {
        let (port, _task) = one_shot(500).await;
        let url = format!("http://127.0.0.1:{port}/hook");
        let sent = local().send(&url, "s", 1, b"{}", true).await;
        assert_eq!(sent.status(), Some(500));
        assert!(!sent.is_success());

        // A receiver that accepts and never answers: a timeout.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(sock);
        });
        let client = WebhookClient::new(
            Policy {
                allow_local_http: true,
            },
            Duration::from_millis(300),
        )
        .unwrap();
        let url = format!("http://127.0.0.1:{port}/hook");
        let sent = client.send(&url, "s", 1, b"{}", true).await;
        assert!(
            matches!(sent, Sent::NoAnswer(ref why) if why.contains("no answer")),
            "{sent:?}"
        );
        hold.abort();
    }
}
