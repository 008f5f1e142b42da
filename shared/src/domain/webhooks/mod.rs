//! Webhook endpoints, the fan-out of outbox events into deliveries, and
//! the delivery of each one with retries (decisions, "Webhooks").
//!
//! Storage:
//! - an endpoint at `PROJ#<project>#<mode>#WE` / `<we_id>`: a project's
//!   endpoints are one strongly consistent partition (fan-out reads it);
//!   its signing secret is sealed with the credentials master key, never
//!   stored in the clear;
//! - their number at `PROJ#<project>#<mode>#WECOUNT` / `COUNT` (`n`),
//!   changed in the transaction that writes or deletes an endpoint, so
//!   [`MAX_ENDPOINTS`] holds under concurrent registrations (missing for
//!   data from before it: counted from the partition on first use);
//! - a delivery at `EVT#<evt_id>` / `WHD#<we_id>`: one per (event,
//!   endpoint) by construction, so a fan-out that runs twice writes it
//!   once; listed per endpoint through `gsi1` (`WE#<we_id>#WHD`, by its
//!   time-sortable id, newest first).
//!
//! Delivery is at least once. A queue message names a delivery and the
//! attempt it is for; the handler claims the attempt with a conditional
//! lease, sends, queues the next attempt's message when one is due, then
//! logs the outcome with a write conditioned on that lease, and only then
//! lets its message go. A message for an attempt already made, or for a
//! final delivery, is dropped, so a duplicate message never re-sends a
//! success; a message ahead of the log waits. A crash between send and log
//! leaves the message on the queue: it comes back after the lease and the
//! same event (same id) is sent again.

use crate::refusal::Refusal;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Mode;
use super::credentials::{self, CredentialsError, SealedSecret};
use super::outbox::{self, Event, EventType};
use super::record::{from_item, to_item};
use crate::Deps;
use crate::fields::wire::present;
use crate::ids::{self, IdKind};
use crate::keys;
use crate::queue::{MAX_DELAY, QueueError, QueueName};
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Query, SkCond, Store, StoreError, TxOp, TxReason, Update};
use crate::time::Timestamp;
use crate::webhooks::client::{Sent, WebhookClient};
use crate::webhooks::ssrf::{self, Policy, UrlError};

mod delivery;
mod endpoints;
mod fan_out;
mod log;
mod test_event;
#[cfg(test)]
mod tests;

pub use delivery::*;
pub use endpoints::*;
pub use fan_out::*;
pub use log::*;
pub use test_event::*;

/// Most endpoints one project may register per mode.
pub const MAX_ENDPOINTS: usize = 16;
/// Deliveries the log answers (spec, "Limits").
pub const DELIVERY_LOG: usize = 50;
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

// ------------------------------------------------------------- endpoints
