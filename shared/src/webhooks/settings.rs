//! How webhooks behave in this process: the retry schedule, the receiver
//! timeout, the claim lease and whether local receivers are allowed, from
//! configuration. `domain::webhooks` re-exports them.

use std::time::Duration;

use crate::kinds::Mode;
use crate::webhooks::client::WebhookClient;
use crate::webhooks::ssrf::Policy;

/// The wait after each failed attempt (decisions): 8 retries, about 3 days.
pub const RETRY_SCHEDULE: [Duration; 8] = [
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(24 * 3600),
    Duration::from_secs(24 * 3600),
];
/// How long a receiver has to answer (decisions).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// How webhooks behave in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookSettings {
    /// Sandbox endpoints may be `http://127.0.0.1` / `localhost` (the local
    /// dev server, behind `DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP=1`). Never
    /// for live endpoints.
    pub allow_local_http: bool,
    /// Waits after each failed attempt; its length is the number of retries.
    pub schedule: Vec<Duration>,
    /// How long a receiver has to answer.
    pub timeout: Duration,
    /// How long a claimed attempt stays claimed: longer than `timeout`, and
    /// no longer than the queue's visibility timeout, so that the message
    /// of a crashed attempt finds the claim expired when it comes back.
    pub lease: Duration,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            allow_local_http: false,
            schedule: RETRY_SCHEDULE.to_vec(),
            timeout: TIMEOUT,
            lease: Duration::from_secs(60),
        }
    }
}

impl WebhookSettings {
    /// From the environment: `DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP` (`1`),
    /// and for tests and local experiments `DHUKUTI_WEBHOOK_RETRY_SECONDS`
    /// (comma-separated waits replacing the schedule).
    pub fn from_env() -> Result<Self, String> {
        let mut s = WebhookSettings::default();
        if let Ok(v) = std::env::var("DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP") {
            s.allow_local_http = matches!(v.trim(), "1" | "true" | "yes");
        }
        if s.allow_local_http && std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some() {
            // On Lambda, 127.0.0.1 is the Runtime API: never a receiver.
            return Err(
                "DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP is for the local gateway only; unset it on Lambda"
                    .into(),
            );
        }
        if let Ok(v) = std::env::var("DHUKUTI_WEBHOOK_RETRY_SECONDS") {
            if !v.trim().is_empty() {
                s.schedule = parse_schedule(&v)?;
            }
        }
        Ok(s)
    }

    /// The SSRF policy for an endpoint of `mode`.
    pub fn policy(&self, mode: Mode) -> Policy {
        Policy {
            allow_local_http: self.allow_local_http && mode == Mode::Sandbox,
        }
    }

    /// The client that delivers under these settings.
    pub fn client(&self) -> Result<WebhookClient, String> {
        WebhookClient::new(
            Policy {
                allow_local_http: self.allow_local_http,
            },
            self.timeout,
        )
    }
}

/// `"60,300"` as waits; each 0..=7 days, at most 20 of them.
pub fn parse_schedule(text: &str) -> Result<Vec<Duration>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let secs: f64 = part
            .trim()
            .parse()
            .map_err(|_| format!("retry schedule {text:?}: {part:?} is not a number of seconds"))?;
        if !(0.0..=7.0 * 86_400.0).contains(&secs) {
            return Err(format!(
                "retry schedule {text:?}: waits are 0 to 604800 seconds"
            ));
        }
        out.push(Duration::from_secs_f64(secs));
    }
    if out.len() > 20 {
        return Err(format!("retry schedule {text:?}: at most 20 retries"));
    }
    Ok(out)
}
