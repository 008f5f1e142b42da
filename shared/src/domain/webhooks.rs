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

/// A stored endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: String,
    pub project_id: String,
    pub mode: Mode,
    pub url: String,
    /// Empty = every event.
    pub events: Vec<EventType>,
    pub enabled: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The signing secret, sealed with the master key.
    pub secret: SealedSecret,
}

impl Endpoint {
    fn partition(project_id: &str, mode: Mode) -> String {
        keys::per_mode(project_id, mode, keys::PerMode::WebhookEndpoints)
    }

    pub fn key(project_id: &str, mode: Mode, id: &str) -> Key {
        Key::new(Endpoint::partition(project_id, mode), id)
    }

    /// Whether this endpoint wants events of type `t`.
    pub fn wants(&self, t: EventType) -> bool {
        self.enabled && (self.events.is_empty() || self.events.contains(&t))
    }

    fn secret_context(&self) -> String {
        format!("webhook/{}/{}", self.project_id, self.id)
    }
}

/// The endpoint as the API answers it (spec, "Webhook endpoint").
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    pub id: String,
    pub object: &'static str,
    pub livemode: bool,
    pub url: String,
    pub events: Vec<&'static str>,
    pub enabled: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Only in the answer to the registration.
    #[serde(rename = "signing_secret", skip_serializing_if = "Option::is_none")]
    pub signing_secret: Option<String>,
}

impl EndpointView {
    pub fn of(e: &Endpoint, signing_secret: Option<String>) -> Self {
        EndpointView {
            id: e.id.clone(),
            object: "webhook_endpoint",
            livemode: e.mode.is_live(),
            url: e.url.clone(),
            events: e.events.iter().map(|t| t.as_str()).collect(),
            enabled: e.enabled,
            created_at: e.created_at,
            updated_at: e.updated_at,
            signing_secret,
        }
    }
}

/// `POST /v1/webhooks`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    pub url: String,
    #[serde(default, deserialize_with = "present")]
    pub events: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/webhooks/{id}`: only the keys sent change.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchEndpoint {
    #[serde(default, deserialize_with = "present")]
    pub url: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub events: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    pub enabled: Option<bool>,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("no such webhook endpoint: {0}")]
    NotFound(String),
    #[error("a project may register at most {MAX_ENDPOINTS} webhook endpoints per mode")]
    TooMany,
    #[error("webhook signing is not configured: {0}")]
    Secrets(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<WebhookError> for Refusal {
    fn from(err: WebhookError) -> Self {
        match err {
            WebhookError::Invalid { field, message } => Refusal::invalid(field, message),
            WebhookError::NotFound(id) => Refusal::not_found("webhook endpoint", &id),
            e @ WebhookError::TooMany => {
                Refusal::unprocessable("webhook_endpoint_limit", e.to_string())
            }
            // A deployment problem, not the caller's: logged, never shown.
            WebhookError::Secrets(why) => {
                Refusal::internal(&format_args!("webhook signing secrets unavailable: {why}"))
            }
            WebhookError::Store(e) => e.into(),
        }
    }
}

impl From<CredentialsError> for WebhookError {
    fn from(e: CredentialsError) -> Self {
        match e {
            CredentialsError::Store(s) => WebhookError::Store(s),
            other => WebhookError::Secrets(other.to_string()),
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> WebhookError {
    WebhookError::Invalid {
        field,
        message: message.into(),
    }
}

/// Event names to types: known names only, duplicates dropped, order kept.
pub fn parse_events(names: &[String]) -> Result<Vec<EventType>, WebhookError> {
    if names.len() > 4 * EventType::ALL.len() {
        return Err(invalid("events", "too many event names"));
    }
    let mut out = Vec::new();
    for name in names {
        let t = EventType::parse(name).ok_or_else(|| {
            invalid(
                "events",
                format!(
                    "{name:?} is not an event type; use one of {}",
                    EventType::ALL.map(|t| t.as_str()).join(", ")
                ),
            )
        })?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

/// How long registration waits for a receiver's host to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks a receiver URL for an endpoint of `mode`: its form (https, no
/// IP literal in a private, loopback, link-local or metadata range, no
/// localhost-like or single-label name), and, when the host resolves now,
/// every address it resolves to. A host that does not resolve yet is
/// accepted: DNS is often set up after the endpoint is registered, and
/// the delivery client checks every address again at connect time and
/// connects only to what it checked.
pub async fn check_receiver(
    url: &str,
    mode: Mode,
    settings: &WebhookSettings,
) -> Result<String, WebhookError> {
    let target = ssrf::check_url(url.trim(), settings.policy(mode)).map_err(|e| match e {
        UrlError::NotHttps if settings.allow_local_http && mode == Mode::Live => invalid(
            "url",
            "webhook URLs must use https (local http receivers are for sandbox only)",
        ),
        other => invalid("url", other.to_string()),
    })?;
    if !target.local {
        match tokio::time::timeout(RESOLVE_TIMEOUT, ssrf::resolve(&target)).await {
            Ok(Ok(_)) | Ok(Err(UrlError::Unresolvable(_))) | Err(_) => {}
            Ok(Err(e)) => return Err(invalid("url", e.to_string())),
        }
    }
    Ok(target.url)
}

/// `whsec_` + 32 random bytes in hex (decisions).
fn new_secret() -> Result<String, WebhookError> {
    use rand::TryRngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| WebhookError::Secrets(format!("no randomness for a secret: {e}")))?;
    Ok(format!("whsec_{}", hex::encode(bytes)))
}

fn keys(state: &Deps) -> Result<&credentials::CredentialsKeys, WebhookError> {
    state.providers.keys().ok_or_else(|| {
        WebhookError::Secrets(format!(
            "set {} so signing secrets can be sealed",
            credentials::KEY_ENV
        ))
    })
}

/// Registers an endpoint; answers it and its signing secret (shown once).
/// With the request's idempotency `fence`, a retry after a lost answer
/// finds the first endpoint: it is answered without its secret (`None`),
/// which was shown once already and is never stored in the clear.
pub async fn create(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    body: CreateEndpoint,
    fence: Option<&Fence>,
) -> Result<(Endpoint, Option<String>), WebhookError> {
    let events = parse_events(body.events.as_deref().unwrap_or_default())?;
    let url = check_receiver(&body.url, mode, &state.webhooks).await?;
    let now = state.clock.now();
    let secret = new_secret()?;
    let id = ids::new_id(IdKind::WebhookEndpoint);
    let context = format!("webhook/{project_id}/{id}");
    let sealed = credentials::seal_secret(keys(state)?, &context, &secret)?;
    let endpoint = Endpoint {
        id,
        project_id: project_id.to_owned(),
        mode,
        url,
        events,
        enabled: body.enabled.unwrap_or(true),
        created_at: now,
        updated_at: now,
        secret: sealed,
    };
    let item = to_item(
        &endpoint,
        &Endpoint::key(project_id, mode, &endpoint.id),
        &[],
    )?;
    // The endpoint, the count (only while under the limit: the limit
    // holds however many registrations run at once), and the fence.
    let counter = EndpointCounter::key(project_id, mode);
    let mut ops = vec![
        TxOp::Put {
            item,
            cond: Some(Cond::NotExists),
        },
        TxOp::Update {
            key: counter.clone(),
            update: Update::new()
                .add(EndpointCounter::ATTR, 1)
                .add(EndpointCounter::VERSION, 1),
            cond: Some(Cond::lt(EndpointCounter::ATTR, MAX_ENDPOINTS as i64)),
        },
    ];
    const COUNTER_AT: usize = 1;
    const FENCE_AT: usize = 2;
    if let Some(f) = fence {
        ops.push(f.op(&endpoint.id));
    }
    let mut tries = 0;
    loop {
        tries += 1;
        let e = match state.store.transact(ops.clone()).await {
            Ok(()) => return Ok((endpoint, Some(secret))),
            Err(e) => e,
        };
        if let Some(f) = fence {
            if Fence::tripped(&e, FENCE_AT) {
                let first = f.resource_id(&*state.store).await?.unwrap_or_default();
                let endpoint = get(&*state.store, project_id, mode, &first).await?;
                return Ok((endpoint, None));
            }
        }
        let StoreError::TransactionCanceled { reasons } = &e else {
            return Err(e.into());
        };
        if matches!(reasons.get(COUNTER_AT), Some(TxReason::ConditionFailed)) {
            // Full by the count. The endpoints themselves decide: the count
            // may have drifted (endpoints changed without it: old code
            // during a rolling deploy, a manual delete), or be missing
            // (vanished under us, or data from before it): then it is made
            // from the endpoints, and the write tried again.
            match EndpointCounter::read(&*state.store, project_id, mode).await? {
                Some((n, v)) => {
                    let real = EndpointCounter::recount(&*state.store, project_id, mode).await?;
                    if real >= MAX_ENDPOINTS as i64 {
                        return Err(WebhookError::TooMany);
                    }
                    if real != n {
                        // Only over the version just read: a registration
                        // or a delete in between makes this fail, and we
                        // try again.
                        EndpointCounter::repair(&*state.store, project_id, mode, (n, v), real)
                            .await?;
                    }
                }
                None => EndpointCounter::ensure(&*state.store, project_id, mode).await?,
            }
            if tries >= TX_TRIES {
                return Err(StoreError::Unavailable(
                    "webhook endpoints are busy: their count kept changing".into(),
                )
                .into());
            }
            continue;
        }
        if reasons.contains(&TxReason::Conflict) && tries < TX_TRIES {
            crate::store::contention_backoff(tries as usize).await;
            continue;
        }
        return Err(busy_or(e).into());
    }
}

/// How many times a transaction on the endpoint count is tried when it
/// meets another one on the same count (DynamoDB's `TransactionConflict`).
const TX_TRIES: u32 = 8;

/// A transaction still conflicting after [`TX_TRIES`] is a busy store (the
/// caller may retry), not a fault.
fn busy_or(e: StoreError) -> StoreError {
    match &e {
        StoreError::TransactionCanceled { reasons } if reasons.contains(&TxReason::Conflict) => {
            StoreError::Unavailable(format!("webhook endpoints are busy: {e}"))
        }
        _ => e,
    }
}

/// The number of endpoints of one project in one mode, at
/// `PROJ#<project>#<mode>#WECOUNT` / `COUNT`: raised in the transaction
/// that writes an endpoint, only while under [`MAX_ENDPOINTS`], and
/// lowered in the transaction that deletes one (conditioned on the
/// endpoint existing, so a second delete lowers nothing).
struct EndpointCounter;

impl EndpointCounter {
    const ATTR: &'static str = "n";
    /// Raised by every write of the count, so a repair from a recount is
    /// conditioned on nothing having changed since (a count alone could
    /// come back to the value read: a delete then a registration).
    const VERSION: &'static str = "v";

    fn key(project_id: &str, mode: Mode) -> Key {
        keys::webhook_count(project_id, mode)
    }

    /// The count and its version, if the counter exists (0 for either
    /// attribute missing).
    async fn read(
        store: &dyn Store,
        project_id: &str,
        mode: Mode,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        Ok(store
            .get(&EndpointCounter::key(project_id, mode))
            .await?
            .map(|item| {
                let get = |a: &str| item.get(a).and_then(Value::as_i64).unwrap_or(0);
                (get(EndpointCounter::ATTR), get(EndpointCounter::VERSION))
            }))
    }

    /// `version` still holds (a missing one reads as 0).
    fn unchanged(version: i64) -> Cond {
        if version == 0 {
            Cond::Or(vec![
                Cond::eq(EndpointCounter::VERSION, 0),
                Cond::AttrNotExists(EndpointCounter::VERSION.into()),
            ])
        } else {
            Cond::eq(EndpointCounter::VERSION, version)
        }
    }

    /// Makes sure the counter exists. Endpoints registered before it
    /// existed are counted (strongly consistent) and the count written
    /// only if there is still no counter: every write that changes the
    /// endpoints needs the counter (its condition is false on a missing
    /// one), so none can land between that count and that put.
    async fn ensure(store: &dyn Store, project_id: &str, mode: Mode) -> Result<(), StoreError> {
        if EndpointCounter::read(store, project_id, mode)
            .await?
            .is_some()
        {
            return Ok(());
        }
        let n = EndpointCounter::recount(store, project_id, mode).await?;
        let key = EndpointCounter::key(project_id, mode);
        let mut item = crate::store::Item::new();
        item.insert(crate::store::PK.into(), Value::String(key.pk));
        item.insert(crate::store::SK.into(), Value::String(key.sk));
        item.insert(EndpointCounter::ATTR.into(), json!(n));
        match store.put(item, Some(Cond::NotExists)).await {
            // Another request made it first: from the same endpoints.
            Err(e) if e.is_condition_failure() => Ok(()),
            other => other,
        }
    }

    /// The endpoints actually stored (strongly consistent).
    async fn recount(store: &dyn Store, project_id: &str, mode: Mode) -> Result<i64, StoreError> {
        let n = store
            .count(&Query::partition(Endpoint::partition(project_id, mode)))
            .await?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Sets the count to `real` if its version is still the one read with
    /// `seen` (before `real` was counted). Every write that changes the
    /// endpoints raises the version in the same transaction, so if it is
    /// unchanged none landed in between; if it moved, nothing is written
    /// (the caller reads and counts again). Logged: a drifted count means
    /// endpoints were changed without it.
    async fn repair(
        store: &dyn Store,
        project_id: &str,
        mode: Mode,
        seen: (i64, i64),
        real: i64,
    ) -> Result<(), StoreError> {
        let key = EndpointCounter::key(project_id, mode);
        let (seen, version) = seen;
        let still = EndpointCounter::unchanged(version);
        let update = Update::new()
            .set(EndpointCounter::ATTR, real.max(0))
            .add(EndpointCounter::VERSION, 1);
        match store
            .update(&key, update, Some(Cond::And(vec![Cond::Exists, still])))
            .await
        {
            Ok(_) => {
                tracing::warn!(
                    pk = %key.pk,
                    was = seen,
                    now = real.max(0),
                    "webhook endpoint count had drifted; repaired from the endpoints"
                );
                Ok(())
            }
            Err(e) if e.is_condition_failure() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The endpoint `id` of the project in `mode`.
pub async fn get(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<Endpoint, WebhookError> {
    if !ids::is_valid(id, IdKind::WebhookEndpoint) {
        return Err(WebhookError::NotFound(id.to_owned()));
    }
    match store.get(&Endpoint::key(project_id, mode, id)).await? {
        Some(item) => Ok(from_item(item)?),
        None => Err(WebhookError::NotFound(id.to_owned())),
    }
}

/// Every endpoint of the project in `mode`, newest first.
pub async fn list(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
) -> Result<Vec<Endpoint>, StoreError> {
    let query = Query::partition(Endpoint::partition(project_id, mode))
        .backward()
        .limit(100);
    store
        .query(&query)
        .await?
        .items
        .into_iter()
        .map(from_item)
        .collect()
}

/// Changes the keys sent; answers the endpoint as written.
pub async fn patch(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    body: PatchEndpoint,
) -> Result<Endpoint, WebhookError> {
    let current = get(&*state.store, project_id, mode, id).await?;
    let mut update = Update::new();
    if let Some(url) = &body.url {
        let url = check_receiver(url, mode, &state.webhooks).await?;
        update = update.set("url", url);
    }
    if let Some(events) = &body.events {
        let events = parse_events(events)?;
        update = update.set(
            "events",
            serde_json::to_value(events).map_err(|e| StoreError::Invalid(e.to_string()))?,
        );
    }
    if let Some(enabled) = body.enabled {
        update = update.set("enabled", enabled);
    }
    let now = state.clock.now();
    update = update.set("updated_at", json!(now));
    match state
        .store
        .update(
            &Endpoint::key(project_id, mode, &current.id),
            update,
            Some(Cond::Exists),
        )
        .await
    {
        Ok(item) => Ok(from_item(item)?),
        Err(e) if e.is_condition_failure() => Err(WebhookError::NotFound(id.to_owned())),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the endpoint for good; pending deliveries to it are dropped
/// when their turn comes.
pub async fn delete(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<(), WebhookError> {
    let current = get(store, project_id, mode, id).await?;
    let key = Endpoint::key(project_id, mode, &current.id);
    let counter = EndpointCounter::key(project_id, mode);
    // The endpoint goes only if it is still there, and the count goes down
    // with it: a second delete (a retry, a race) lowers nothing.
    const ENDPOINT_AT: usize = 0;
    const COUNTER_AT: usize = 1;
    let ops = vec![
        TxOp::Delete {
            key: key.clone(),
            cond: Some(Cond::Exists),
        },
        TxOp::Update {
            key: counter.clone(),
            update: Update::new()
                .add(EndpointCounter::ATTR, -1)
                .add(EndpointCounter::VERSION, 1),
            // Never below 0, and never ADD onto a missing counter (it
            // would start at -1): false on a missing `n`.
            cond: Some(Cond::gt(EndpointCounter::ATTR, 0)),
        },
    ];
    let mut tries = 0;
    loop {
        tries += 1;
        let e = match store.transact(ops.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let StoreError::TransactionCanceled { reasons } = &e else {
            return Err(e.into());
        };
        if matches!(reasons.get(ENDPOINT_AT), Some(TxReason::ConditionFailed)) {
            return Err(WebhookError::NotFound(id.to_owned()));
        }
        if matches!(reasons.get(COUNTER_AT), Some(TxReason::ConditionFailed)) {
            // The counter is missing (made here from the endpoints, then
            // the delete is tried again), or it says
            // 0 while the endpoint exists: it drifted low (endpoints
            // written without it). The endpoint still goes; the count is
            // set from the endpoints left, only over the 0 just read.
            let counted = EndpointCounter::read(store, project_id, mode).await?;
            if counted.is_none() {
                EndpointCounter::ensure(store, project_id, mode).await?;
            }
            if let Some((seen @ ..=0, version)) = counted {
                let real = EndpointCounter::recount(store, project_id, mode).await?;
                let ops = vec![
                    TxOp::Delete {
                        key: key.clone(),
                        cond: Some(Cond::Exists),
                    },
                    TxOp::Update {
                        key: counter.clone(),
                        update: Update::new()
                            .set(EndpointCounter::ATTR, (real - 1).max(0))
                            .add(EndpointCounter::VERSION, 1),
                        cond: Some(EndpointCounter::unchanged(version)),
                    },
                ];
                match store.transact(ops).await {
                    Ok(()) => {
                        tracing::warn!(
                            pk = %counter.pk,
                            was = seen,
                            now = (real - 1).max(0),
                            "webhook endpoint count had drifted low; repaired from the endpoints"
                        );
                        return Ok(());
                    }
                    Err(StoreError::TransactionCanceled { reasons })
                        if matches!(reasons.get(ENDPOINT_AT), Some(TxReason::ConditionFailed)) =>
                    {
                        return Err(WebhookError::NotFound(id.to_owned()));
                    }
                    // The count moved (a registration or a delete in
                    // between): read it again.
                    Err(StoreError::TransactionCanceled { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Or another transaction was on it.
        if tries < TX_TRIES {
            crate::store::contention_backoff(tries as usize).await;
            continue;
        }
        return Err(busy_or(e).into());
    }
}

// ------------------------------------------------------------ deliveries

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Pending,
    Retrying,
    Success,
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Retrying => "retrying",
            DeliveryStatus::Success => "success",
            DeliveryStatus::Failed => "failed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, DeliveryStatus::Success | DeliveryStatus::Failed)
    }
}

/// One event's delivery to one endpoint, with its attempts so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    pub event_type: EventType,
    pub endpoint_id: String,
    pub project_id: String,
    pub mode: Mode,
    pub payment_id: Option<String>,
    pub status: DeliveryStatus,
    pub attempts: u32,
    pub response_status: Option<u16>,
    /// The first KB of the receiver's last answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_body: Option<String>,
    /// The body sent (the same on every attempt), once one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    pub last_error: Option<String>,
    pub last_attempt_at: Option<Timestamp>,
    pub next_attempt_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Unix milliseconds until which an attempt is claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<i64>,
}

impl Delivery {
    pub fn key(event_id: &str, endpoint_id: &str) -> Key {
        keys::delivery(event_id, endpoint_id)
    }

    /// The open-deliveries partition of event `event_id` (`gsi2`).
    fn open_partition(event_id: &str) -> String {
        keys::open(
            keys::Open::Deliveries,
            keys::shard_of(event_id, outbox::SHARDS),
        )
    }

    /// The open-deliveries sort key: due time first.
    fn open_sort_key(due: Timestamp, event_id: &str, endpoint_id: &str) -> String {
        format!("{:015}#{event_id}#{endpoint_id}", due.unix_millis().max(0))
    }

    fn log_partition(endpoint_id: &str) -> String {
        keys::endpoint_deliveries(endpoint_id)
    }
}

/// A delivery as the API answers it (spec, "Webhook delivery attempt").
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryView {
    pub id: String,
    pub object: &'static str,
    pub webhook_endpoint_id: String,
    pub event_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    pub event_type: &'static str,
    pub status: &'static str,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// The first KB of the receiver's last answer, as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_body: Option<String>,
    /// The event body sent, as JSON (omitted before the first attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub livemode: bool,
}

impl From<&Delivery> for DeliveryView {
    fn from(d: &Delivery) -> Self {
        DeliveryView {
            id: d.id.clone(),
            object: "webhook_delivery",
            webhook_endpoint_id: d.endpoint_id.clone(),
            event_id: d.event_id.clone(),
            payment_id: d.payment_id.clone(),
            event_type: d.event_type.as_str(),
            status: d.status.as_str(),
            attempts: d.attempts,
            response_status: d.response_status,
            response_body: d.response_body.clone(),
            payload: d
                .payload
                .as_deref()
                .and_then(|p| serde_json::from_str(p).ok()),
            last_error: d.last_error.clone(),
            last_attempt_at: d.last_attempt_at,
            next_attempt_at: d.next_attempt_at,
            created_at: d.created_at,
            livemode: d.mode.is_live(),
        }
    }
}

/// The last [`DELIVERY_LOG`] deliveries to endpoint `id`, newest first.
pub async fn deliveries(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<Vec<Delivery>, WebhookError> {
    let endpoint = get(store, project_id, mode, id).await?;
    let query = Query::partition(Delivery::log_partition(&endpoint.id))
        .on(Index::Gsi1)
        .backward()
        .limit(DELIVERY_LOG);
    let found = store.query(&query).await?;
    Ok(found
        .items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<Delivery>, _>>()?)
}

/// The delivery of `event_id` to `endpoint_id`, if any.
pub async fn delivery(
    store: &dyn Store,
    event_id: &str,
    endpoint_id: &str,
) -> Result<Option<Delivery>, StoreError> {
    match store.get(&Delivery::key(event_id, endpoint_id)).await? {
        Some(item) => Ok(Some(from_item(item)?)),
        None => Ok(None),
    }
}

/// The payment an event is about, for the delivery log's `paymentId`.
fn payment_id_of(object: &Value) -> Option<String> {
    ["paymentId", "payment_id"]
        .iter()
        .find_map(|k| object.get(*k).and_then(Value::as_str))
        .or_else(|| {
            object
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| id.starts_with("pay_"))
        })
        .map(str::to_owned)
}

// --------------------------------------------------------------- fan-out

/// What a queue message asks: make attempt `attempt` (0-based: the number
/// of attempts already made) of one delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub event_id: String,
    pub endpoint_id: String,
    pub attempt: u32,
}

impl DeliveryMessage {
    pub fn parse(body: &str) -> Result<Self, DispatchError> {
        serde_json::from_str(body)
            .map_err(|e| DispatchError::BadMessage(format!("not a delivery message: {e}")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// A message that can never be handled (it is dropped, and logged).
    #[error("{0}")]
    BadMessage(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("cannot open the endpoint's signing secret: {0}")]
    Secrets(String),
}

/// What a fan-out did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FanOutReport {
    pub events: usize,
    pub deliveries: usize,
    pub errors: usize,
    /// Overdue deliveries queued again ([`requeue_overdue`]).
    pub requeued: usize,
}

async fn enqueue(state: &Deps, msg: &DeliveryMessage, delay: Duration) -> Result<(), QueueError> {
    let body = serde_json::to_string(msg).map_err(|e| QueueError::Invalid(e.to_string()))?;
    state
        .queue
        .send(QueueName::Webhooks, &body, delay.min(MAX_DELAY))
        .await
        .map(|_| ())
}

/// Creates the deliveries of one event (one per matching enabled
/// endpoint), queues their first attempt, then takes the event out of the
/// outbox. Safe to run any number of times, concurrently too: a delivery is
/// written once, and a first attempt not yet made is queued again (the
/// handler drops what is not due).
pub async fn fan_out(state: &Deps, event: &Event) -> Result<usize, DispatchError> {
    let now = state.clock.now();
    let endpoints = list(&*state.store, &event.project_id, event.mode).await?;
    let mut queued = 0;
    // A test event goes to its one endpoint, whatever that one's filter.
    let targets = endpoints.iter().filter(|e| match &event.endpoint_id {
        Some(target) => &e.id == target && e.enabled,
        None => e.wants(event.event_type),
    });
    for endpoint in targets {
        let delivery = Delivery {
            id: ids::new_id(IdKind::WebhookDelivery),
            event_id: event.id.clone(),
            event_type: event.event_type,
            endpoint_id: endpoint.id.clone(),
            project_id: event.project_id.clone(),
            mode: event.mode,
            payment_id: payment_id_of(&event.object),
            status: DeliveryStatus::Pending,
            attempts: 0,
            response_status: None,
            response_body: None,
            payload: None,
            last_error: None,
            last_attempt_at: None,
            next_attempt_at: Some(now),
            created_at: now,
            updated_at: now,
            lease_until_ms: None,
        };
        let item = to_item(
            &delivery,
            &Delivery::key(&event.id, &endpoint.id),
            &[
                (
                    Index::Gsi1,
                    Delivery::log_partition(&endpoint.id),
                    delivery.id.clone(),
                ),
                (
                    Index::Gsi2,
                    Delivery::open_partition(&event.id),
                    Delivery::open_sort_key(now, &event.id, &endpoint.id),
                ),
            ],
        )?;
        let first_time = match state.store.put(item, Some(Cond::NotExists)).await {
            Ok(()) => true,
            Err(e) if e.is_condition_failure() => false,
            Err(e) => return Err(e.into()),
        };
        if !first_time {
            // Written by an earlier run: queue again only an attempt that
            // has not been made (that run may have died before queueing).
            match self::delivery(&*state.store, &event.id, &endpoint.id).await? {
                Some(d) if d.attempts == 0 && !d.status.is_final() => {}
                _ => continue,
            }
        }
        let msg = DeliveryMessage {
            event_id: event.id.clone(),
            endpoint_id: endpoint.id.clone(),
            attempt: 0,
        };
        enqueue(state, &msg, Duration::ZERO).await?;
        queued += 1;
    }
    outbox::mark_dispatched(&*state.store, &event.id).await?;
    Ok(queued)
}

/// Fans out every event still in the outbox that was created at or before
/// `created_before` (all of them with `None`), oldest first, at most
/// `limit` per outbox shard. Errors are counted and logged; the events
/// stay in the outbox for the next run.
pub async fn fan_out_pending(
    state: &Deps,
    created_before: Option<Timestamp>,
    limit: usize,
) -> Result<FanOutReport, StoreError> {
    let mut report = FanOutReport::default();
    for event in outbox::undelivered(&*state.store, limit, state.clock.now()).await? {
        if created_before.is_some_and(|t| event.created_at > t) {
            continue;
        }
        report.events += 1;
        match fan_out(state, &event).await {
            Ok(n) => report.deliveries += n,
            Err(e) => {
                report.errors += 1;
                tracing::warn!(event_id = %event.id, error = %e, "fan-out failed; the event stays in the outbox");
            }
        }
    }
    Ok(report)
}

/// Fans out the event `id` (the Streams function: the stream says which
/// event was written; the record itself is read from the table).
pub async fn fan_out_by_id(state: &Deps, id: &str) -> Result<usize, DispatchError> {
    match outbox::get(&*state.store, id).await? {
        Some(event) if !event.dispatched => fan_out(state, &event).await,
        _ => Ok(0),
    }
}

// -------------------------------------------------------------- dispatch

/// What handling one message did; every outcome lets the message go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver answered 2xx.
    Delivered,
    /// The attempt failed; the next one is queued.
    Retrying { next_in: Duration },
    /// The last attempt failed, or the endpoint is gone or disabled.
    Failed,
    /// Not due yet: queued again for the rest of the wait.
    NotDue,
    /// Stale or duplicate message (attempt made, delivery final, or
    /// another worker holds the attempt).
    Skipped,
}

/// Handles one queue message at `now`. `Err` means "keep the message":
/// it comes back after its visibility timeout and is handled again.
pub async fn dispatch(
    state: &Deps,
    client: &WebhookClient,
    msg: &DeliveryMessage,
) -> Result<Outcome, DispatchError> {
    let now = state.clock.now();
    let Some(d) = delivery(&*state.store, &msg.event_id, &msg.endpoint_id).await? else {
        tracing::warn!(event_id = %msg.event_id, endpoint_id = %msg.endpoint_id, "message for an unknown delivery dropped");
        return Ok(Outcome::Skipped);
    };
    if d.status.is_final() || msg.attempt < d.attempts {
        return Ok(Outcome::Skipped);
    }
    if msg.attempt > d.attempts {
        // The message for the next attempt is queued before the current
        // attempt is logged: the log is late or failed (then the current
        // attempt's message redoes it). Either way this message must not
        // be lost: look again after a lease.
        enqueue(state, msg, state.webhooks.lease).await?;
        return Ok(Outcome::NotDue);
    }
    if let Some(next) = d.next_attempt_at {
        let wait_ms = next.unix_millis() - now.unix_millis();
        if wait_ms > 1000 {
            enqueue(state, msg, Duration::from_millis(wait_ms as u64)).await?;
            return Ok(Outcome::NotDue);
        }
    }
    let now_ms = now.unix_millis();
    if d.lease_until_ms.is_some_and(|until| until > now_ms) {
        return Ok(Outcome::Skipped);
    }
    let key = Delivery::key(&d.event_id, &d.endpoint_id);
    let endpoint = match get(&*state.store, &d.project_id, d.mode, &d.endpoint_id).await {
        Ok(e) if e.enabled => e,
        Ok(_) => return give_up(state, &d, "the endpoint is disabled").await,
        Err(WebhookError::NotFound(_)) => {
            return give_up(state, &d, "the endpoint was deleted").await;
        }
        Err(WebhookError::Store(e)) => return Err(e.into()),
        Err(e) => return Err(DispatchError::Secrets(e.to_string())),
    };
    let Some(event) = outbox::get(&*state.store, &d.event_id).await? else {
        return give_up(state, &d, "the event no longer exists").await;
    };

    // Claim this attempt (the lease counts from now, not from the reads).
    let now_ms = state.clock.now().unix_millis();
    let lease_until = now_ms + state.webhooks.lease.as_millis() as i64;
    let claim = state
        .store
        .update(
            &key,
            Update::new().set("lease_until_ms", lease_until),
            Some(Cond::And(vec![
                Cond::eq("attempts", d.attempts),
                Cond::Or(vec![
                    Cond::eq("status", "pending"),
                    Cond::eq("status", "retrying"),
                ]),
                Cond::Or(vec![
                    Cond::AttrNotExists("lease_until_ms".into()),
                    Cond::lt("lease_until_ms", now_ms),
                ]),
            ])),
        )
        .await;
    match claim {
        Ok(_) => {}
        Err(e) if e.is_condition_failure() => return Ok(Outcome::Skipped),
        Err(e) => return Err(e.into()),
    }

    let body = serde_json::to_vec(&event.body())
        .map_err(|e| DispatchError::BadMessage(format!("event body: {e}")))?;
    let secret = match state.providers.keys() {
        Some(keys) => credentials::open_secret(keys, &endpoint.secret, &endpoint.secret_context())
            .map_err(|e| e.to_string()),
        None => Err(format!("{} is not set", credentials::KEY_ENV)),
    };
    let sent = match secret {
        Ok(secret) => {
            client
                .send(
                    &endpoint.url,
                    &secret,
                    state.clock.now().unix_seconds(),
                    &body,
                    endpoint.mode == Mode::Sandbox,
                )
                .await
        }
        // A deployment fault (the master key that sealed it is gone): an
        // attempt that fails visibly in the log and is retried on the
        // schedule, rather than a message bouncing to the dead letters.
        Err(why) => {
            tracing::error!(endpoint_id = %endpoint.id, error = %why, "cannot open a webhook signing secret");
            Sent::NoAnswer("not sent: the signing secret could not be opened".into())
        }
    };
    let done_at = state.clock.now();
    let attempts = d.attempts + 1;
    let retry_in = state.webhooks.schedule.get(d.attempts as usize).copied();
    let (status, next_at, outcome) = if sent.is_success() {
        (DeliveryStatus::Success, None, Outcome::Delivered)
    } else if let Some(wait) = retry_in {
        let next = done_at.plus(chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX));
        (
            DeliveryStatus::Retrying,
            Some(next),
            Outcome::Retrying { next_in: wait },
        )
    } else {
        (DeliveryStatus::Failed, None, Outcome::Failed)
    };
    let mut update = Update::new()
        .set("attempts", attempts)
        .set("status", status.as_str())
        .set("last_attempt_at", json!(done_at))
        .set("updated_at", json!(done_at))
        .remove("lease_until_ms");
    update = match next_at {
        Some(t) => update
            .set("next_attempt_at", json!(t))
            .set(Index::Gsi2.pk_attr(), Delivery::open_partition(&d.event_id))
            .set(
                Index::Gsi2.sk_attr(),
                Delivery::open_sort_key(t, &d.event_id, &d.endpoint_id),
            ),
        // Final: out of the open-deliveries index.
        None => update.remove("next_attempt_at").unindex(Index::Gsi2),
    };
    update = match sent.status() {
        Some(code) => update.set("response_status", code),
        None => update.remove("response_status"),
    };
    update = match &sent {
        Sent::NoAnswer(why) => update
            .set("last_error", why.as_str())
            .remove("response_body"),
        Sent::Answered(s, answer) if !sent.is_success() => update
            .set("last_error", format!("the receiver answered {s}"))
            .set("response_body", answer.as_str()),
        Sent::Answered(_, answer) => update
            .remove("last_error")
            .set("response_body", answer.as_str()),
    };
    if d.payload.is_none() {
        update = update.set("payload", String::from_utf8_lossy(&body).into_owned());
    }
    // The next attempt's message goes out before the log: if the log then
    // fails, this message stays and redoes the attempt, and the early
    // message waits for it; if queueing fails, nothing is logged and this
    // message redoes the attempt. Never a delivery without a message.
    if let Outcome::Retrying { next_in } = outcome {
        let next = DeliveryMessage {
            attempt: attempts,
            ..msg.clone()
        };
        enqueue(state, &next, next_in).await?;
    }
    let logged = state
        .store
        .update(
            &key,
            update,
            Some(Cond::And(vec![
                Cond::eq("attempts", d.attempts),
                Cond::eq("lease_until_ms", lease_until),
                Cond::Or(vec![
                    Cond::eq("status", "pending"),
                    Cond::eq("status", "retrying"),
                ]),
            ])),
        )
        .await;
    match logged {
        Ok(_) => {}
        // Our claim ran out and another worker took the attempt: it logs.
        Err(e) if e.is_condition_failure() => return Ok(Outcome::Skipped),
        Err(e) => return Err(e.into()),
    }
    tracing::info!(
        event_id = %d.event_id,
        endpoint_id = %d.endpoint_id,
        attempt = attempts,
        status = status.as_str(),
        response_status = ?sent.status(),
        "webhook attempt"
    );
    Ok(outcome)
}

/// Ends a delivery that can no longer be made, without sending.
async fn give_up(state: &Deps, d: &Delivery, why: &str) -> Result<Outcome, DispatchError> {
    let now = state.clock.now();
    let written = state
        .store
        .update(
            &Delivery::key(&d.event_id, &d.endpoint_id),
            Update::new()
                .set("status", DeliveryStatus::Failed.as_str())
                .set("last_error", why)
                .remove("next_attempt_at")
                .unindex(Index::Gsi2)
                .set("updated_at", json!(now)),
            Some(Cond::And(vec![
                Cond::eq("attempts", d.attempts),
                Cond::Or(vec![
                    Cond::eq("status", "pending"),
                    Cond::eq("status", "retrying"),
                ]),
                // Not while another worker holds the attempt: it logs.
                Cond::Or(vec![
                    Cond::AttrNotExists("lease_until_ms".into()),
                    Cond::lt("lease_until_ms", now.unix_millis()),
                ]),
            ])),
        )
        .await;
    match written {
        Ok(_) => Ok(Outcome::Failed),
        Err(e) if e.is_condition_failure() => Ok(Outcome::Skipped),
        Err(e) => Err(e.into()),
    }
}

/// How late an open delivery must be before the sweep queues it again: its
/// own message fires at its due time (SQS delays are at most 15 minutes),
/// so one this late lost its message (a dead-letter queue, a purge).
pub const OVERDUE_AFTER: chrono::Duration = chrono::Duration::minutes(15);

/// Queues again every open delivery due more than [`OVERDUE_AFTER`] ago
/// (at most `limit` per shard): the backstop that makes a lost queue
/// message a late webhook, not a lost one. Duplicates are harmless (the
/// claim lets one through). Answers how many were queued.
pub async fn requeue_overdue(
    state: &Deps,
    now: Timestamp,
    limit: usize,
) -> Result<usize, StoreError> {
    let before = format!("{:015}", now.plus(-OVERDUE_AFTER).unix_millis().max(0));
    let mut queued = 0;
    for shard in 0..outbox::SHARDS {
        let query = Query::partition(keys::open(keys::Open::Deliveries, shard))
            .on(Index::Gsi2)
            .sk(SkCond::Lt(before.clone()))
            .limit(limit);
        for item in state.store.query(&query).await?.items {
            // One bad record must not keep the others from being queued
            // again.
            let Some(d) =
                outbox::readable::<Delivery>(&*state.store, item, "webhook delivery", now).await
            else {
                continue;
            };
            if d.status.is_final() || d.lease_until_ms.is_some_and(|t| t > now.unix_millis()) {
                continue;
            }
            // Move it forward in the index first, so the next sweep looks at
            // the ones behind it and does not queue this one every run.
            let moved = state
                .store
                .update(
                    &Delivery::key(&d.event_id, &d.endpoint_id),
                    Update::new().set(
                        Index::Gsi2.sk_attr(),
                        Delivery::open_sort_key(now, &d.event_id, &d.endpoint_id),
                    ),
                    Some(Cond::And(vec![
                        Cond::eq("attempts", d.attempts),
                        Cond::AttrExists(Index::Gsi2.pk_attr().into()),
                        Cond::Or(vec![
                            Cond::eq("status", "pending"),
                            Cond::eq("status", "retrying"),
                        ]),
                    ])),
                )
                .await;
            match moved {
                Ok(_) => {}
                Err(e) if e.is_condition_failure() => continue,
                Err(e) => return Err(e),
            }
            tracing::warn!(event_id = %d.event_id, endpoint_id = %d.endpoint_id, attempts = d.attempts, "overdue webhook delivery queued again");
            let msg = DeliveryMessage {
                event_id: d.event_id.clone(),
                endpoint_id: d.endpoint_id.clone(),
                attempt: d.attempts,
            };
            match enqueue(state, &msg, Duration::ZERO).await {
                Ok(()) => queued += 1,
                // Still overdue: the next sweep tries again.
                Err(e) => tracing::warn!(error = %e, "could not queue an overdue delivery"),
            }
        }
    }
    Ok(queued)
}

/// How long the stream function has to take an event before the
/// scheduled sweep fans it out itself.
pub const FAN_OUT_GRACE: chrono::Duration = chrono::Duration::minutes(2);

/// The scheduled backstop: fans out events the stream function missed (in
/// the outbox for over [`FAN_OUT_GRACE`]) and queues overdue deliveries
/// again, at most `limit` of each per shard.
pub async fn sweep(state: &Deps, now: Timestamp, limit: usize) -> Result<FanOutReport, StoreError> {
    let mut report = fan_out_pending(state, Some(now.plus(-FAN_OUT_GRACE)), limit).await?;
    report.requeued = requeue_overdue(state, now, limit).await?;
    Ok(report)
}

/// Handles a queue message body: [`dispatch`], with a message that can
/// never be handled logged and dropped.
pub async fn handle_message(
    state: &Deps,
    client: &WebhookClient,
    body: &str,
) -> Result<Outcome, DispatchError> {
    let msg = match DeliveryMessage::parse(body) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "webhook message dropped");
            return Ok(Outcome::Skipped);
        }
    };
    dispatch(state, client, &msg).await
}

// ----------------------------------------------------------- test events

/// A sample object for a test event of type `t`.
fn sample_object(t: EventType, mode: Mode, now: Timestamp) -> Value {
    let pay = format!("pay_test{}", &ids::new_id(IdKind::Payment)[4..]);
    let payment = |status: &str| {
        json!({
            "id": pay, "object": "payment", "amount": 150000, "currency": "NPR",
            "provider": "khalti", "status": status, "livemode": mode.is_live(),
            "createdAt": now, "test": true,
        })
    };
    match t {
        EventType::PaymentSucceeded => payment("success"),
        EventType::PaymentFailed => payment("failed"),
        EventType::PaymentCancelled => payment("cancelled"),
        EventType::PaymentRefunded => payment("refunded"),
        EventType::RefundSucceeded | EventType::RefundFailed => json!({
            "id": format!("ref_test{}", &ids::new_id(IdKind::Refund)[4..]),
            "object": "refund", "paymentId": pay, "amount": 50000, "currency": "NPR",
            "status": if t == EventType::RefundSucceeded { "succeeded" } else { "failed" },
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::PaymentLinkPaid => json!({
            "id": format!("lnk_test{}", &ids::new_id(IdKind::PaymentLink)[4..]),
            "object": "payment_link", "paymentId": pay, "title": "Test link",
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::InvoicePaid => json!({
            "id": format!("oinv_test{}", &ids::new_id(IdKind::Invoice)[4..]),
            "object": "invoice", "paymentId": pay, "total_amount": 150000,
            "amount_paid": 150000, "currency": "NPR", "collection_status": "paid",
            "livemode": mode.is_live(), "created_at": now, "test": true,
        }),
    }
}

/// Records a test event of type `t` for endpoint `id` only (whatever its
/// `events` filter says); it goes through the outbox like any event.
pub async fn send_test_event(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    t: EventType,
) -> Result<Event, WebhookError> {
    let endpoint = get(&*state.store, project_id, mode, id).await?;
    if !endpoint.enabled {
        return Err(invalid(
            "id",
            "the endpoint is disabled; enable it to send a test event",
        ));
    }
    let now = state.clock.now();
    let mut event = Event::new(t, project_id, mode, sample_object(t, mode, now), now);
    event.endpoint_id = Some(endpoint.id.clone());
    state.store.transact(vec![event.put_op()?]).await?;
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_and_refuse_nonsense() {
        assert_eq!(
            parse_schedule("1, 0.5,60").unwrap(),
            vec![
                Duration::from_secs(1),
                Duration::from_millis(500),
                Duration::from_secs(60)
            ]
        );
        assert!(parse_schedule("1,x").is_err());
        assert!(parse_schedule("-1").is_err());
        assert!(parse_schedule("999999999").is_err());
        assert_eq!(WebhookSettings::default().schedule.len(), 8);
        let total: Duration = RETRY_SCHEDULE.iter().sum();
        assert_eq!(
            total.as_secs(),
            60 + 300 + 1800 + 7200 + 18000 + 36000 + 86400 * 2
        );
    }

    #[test]
    fn events_are_validated_and_deduplicated() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_events(&names(&[
                "payment.failed",
                "payment.failed",
                "refund.succeeded"
            ]))
            .unwrap(),
            vec![EventType::PaymentFailed, EventType::RefundSucceeded]
        );
        assert!(parse_events(&[]).unwrap().is_empty());
        let err = parse_events(&names(&["payment.success"])).unwrap_err();
        assert!(
            matches!(err, WebhookError::Invalid { field: "events", ref message } if message.contains("payment.success")),
            "{err:?}"
        );
    }

    #[test]
    fn endpoints_want_their_events_only_while_enabled() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let mut e = Endpoint {
            id: "we_1".into(),
            project_id: "proj_1".into(),
            mode: Mode::Sandbox,
            url: "https://example.com/h".into(),
            events: vec![EventType::PaymentFailed],
            enabled: true,
            created_at: now,
            updated_at: now,
            secret: SealedSecret {
                key_id: "k1".into(),
                alg: "A256GCM".into(),
                nonce: String::new(),
                ciphertext: String::new(),
            },
        };
        assert!(e.wants(EventType::PaymentFailed));
        assert!(!e.wants(EventType::PaymentSucceeded));
        e.events.clear();
        assert!(EventType::ALL.iter().all(|t| e.wants(*t)));
        e.enabled = false;
        assert!(!e.wants(EventType::PaymentFailed));
    }

    #[test]
    fn the_payment_of_an_event_is_found_in_its_object() {
        assert_eq!(
            payment_id_of(&json!({"id": "pay_1"})).as_deref(),
            Some("pay_1")
        );
        assert_eq!(
            payment_id_of(&json!({"id": "ref_1", "paymentId": "pay_2"})).as_deref(),
            Some("pay_2")
        );
        assert_eq!(payment_id_of(&json!({"id": "oinv_1"})), None);
    }

    #[test]
    fn local_receivers_are_for_sandbox_under_the_flag_only() {
        let mut s = WebhookSettings::default();
        assert!(!s.policy(Mode::Sandbox).allow_local_http);
        s.allow_local_http = true;
        assert!(s.policy(Mode::Sandbox).allow_local_http);
        assert!(!s.policy(Mode::Live).allow_local_http);
    }

    #[test]
    fn test_events_have_a_plausible_object() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        for t in EventType::ALL {
            let o = sample_object(t, Mode::Sandbox, now);
            assert_eq!(o["test"], true, "{t:?}");
            assert!(
                payment_id_of(&o).is_some_and(|p| p.starts_with("pay_")),
                "{t:?}"
            );
        }
    }

    mod dispatching {
        use crate::AppState;
        use std::sync::Arc;

        use super::*;
        use crate::Config;
        use crate::domain::credentials::{CredentialsKey, CredentialsKeys};
        use crate::providers::ProviderHub;
        use crate::queue::memory::InProcessQueue;
        use crate::store::embedded::EmbeddedStore;
        use crate::time::{Clock, ManualClock};

        struct Fixture {
            state: AppState,
            queue: Arc<InProcessQueue>,
            clock: ManualClock,
            client: WebhookClient,
            event: Event,
            endpoint: Endpoint,
        }

        async fn fixture() -> Fixture {
            let clock = ManualClock::new(Timestamp::parse("2026-11-22T10:00:00Z").unwrap());
            let queue = Arc::new(InProcessQueue::new());
            let keys = CredentialsKeys::single(CredentialsKey::generate("k1").unwrap());
            let state = AppState::new(
                Arc::new(EmbeddedStore::in_memory().unwrap()),
                Arc::new(clock.clone()),
                Config {
                    public_base_url: "http://127.0.0.1:8080".into(),
                },
            )
            .with_queue(queue.clone())
            .with_providers(ProviderHub::keys_only(keys))
            .with_webhooks(WebhookSettings {
                allow_local_http: true,
                ..WebhookSettings::default()
            });
            // Port 9 (discard) on loopback: nothing listens, sends fail fast.
            let (endpoint, _secret) = create(
                &state,
                "proj_1",
                Mode::Sandbox,
                CreateEndpoint {
                    url: "http://127.0.0.1:9/hook".into(),
                    events: None,
                    enabled: None,
                },
                None,
            )
            .await
            .unwrap();
            let event = Event::new(
                EventType::PaymentSucceeded,
                "proj_1",
                Mode::Sandbox,
                json!({"id": "pay_1"}),
                clock.now(),
            );
            state
                .store
                .transact(vec![event.put_op().unwrap()])
                .await
                .unwrap();
            let client = state.webhooks.client().unwrap();
            Fixture {
                state,
                queue,
                clock,
                client,
                event,
                endpoint,
            }
        }

        fn msg(f: &Fixture, attempt: u32) -> DeliveryMessage {
            DeliveryMessage {
                event_id: f.event.id.clone(),
                endpoint_id: f.endpoint.id.clone(),
                attempt,
            }
        }

        async fn current(f: &Fixture) -> Delivery {
            delivery(&*f.state.store, &f.event.id, &f.endpoint.id)
                .await
                .unwrap()
                .unwrap()
        }

        #[tokio::test]
        async fn fan_out_writes_one_delivery_per_endpoint_however_often_it_runs() {
            let f = fixture().await;
            assert_eq!(fan_out(&f.state, &f.event).await.unwrap(), 1);
            let first = current(&f).await;
            // Again (a concurrent poller, a stream retry): same delivery,
            // its first attempt queued again since it was not made.
            assert_eq!(fan_out(&f.state, &f.event).await.unwrap(), 1);
            assert_eq!(current(&f).await.id, first.id);
            assert_eq!(f.queue.len(QueueName::Webhooks), 2);
            assert!(
                outbox::undelivered(&*f.state.store, 10, f.state.clock.now())
                    .await
                    .unwrap()
                    .is_empty()
            );
            assert_eq!(first.status, DeliveryStatus::Pending);
            assert_eq!(first.payment_id.as_deref(), Some("pay_1"));
        }

        #[tokio::test]
        async fn a_failed_attempt_schedules_the_next_and_stale_messages_are_dropped() {
            let f = fixture().await;
            fan_out(&f.state, &f.event).await.unwrap();
            let out = dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap();
            assert_eq!(
                out,
                Outcome::Retrying {
                    next_in: RETRY_SCHEDULE[0]
                }
            );
            let d = current(&f).await;
            assert_eq!((d.status, d.attempts), (DeliveryStatus::Retrying, 1));
            assert!(d.last_error.is_some() && d.response_status.is_none());
            assert!(d.lease_until_ms.is_none());
            assert_eq!(
                d.next_attempt_at,
                Some(f.clock.now().plus(chrono::Duration::seconds(60)))
            );
            // The duplicate of the first message: dropped, nothing sent.
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
                Outcome::Skipped
            );
            assert_eq!(current(&f).await.attempts, 1);
            // The next attempt's message before its time: queued again.
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 1)).await.unwrap(),
                Outcome::NotDue
            );
            assert_eq!(current(&f).await.attempts, 1);
            // A message ahead of the log waits instead of being lost.
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 5)).await.unwrap(),
                Outcome::NotDue
            );
            f.clock.advance(chrono::Duration::seconds(61));
            assert!(matches!(
                dispatch(&f.state, &f.client, &msg(&f, 1)).await.unwrap(),
                Outcome::Retrying { .. }
            ));
            assert_eq!(current(&f).await.attempts, 2);
        }

        #[tokio::test]
        async fn the_last_failure_ends_the_delivery() {
            let f = fixture().await;
            fan_out(&f.state, &f.event).await.unwrap();
            for attempt in 0..=RETRY_SCHEDULE.len() as u32 {
                let out = dispatch(&f.state, &f.client, &msg(&f, attempt))
                    .await
                    .unwrap();
                if (attempt as usize) < RETRY_SCHEDULE.len() {
                    assert!(
                        matches!(out, Outcome::Retrying { .. }),
                        "{attempt}: {out:?}"
                    );
                    f.clock.advance(chrono::Duration::days(2));
                } else {
                    assert_eq!(out, Outcome::Failed);
                }
            }
            let d = current(&f).await;
            assert_eq!((d.status, d.attempts), (DeliveryStatus::Failed, 9));
            assert!(d.next_attempt_at.is_none());
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 9)).await.unwrap(),
                Outcome::Skipped
            );
        }

        #[tokio::test]
        async fn a_claimed_attempt_is_not_made_twice() {
            let f = fixture().await;
            fan_out(&f.state, &f.event).await.unwrap();
            // Another worker holds the attempt.
            let until = f.clock.now().unix_millis() + 10_000;
            f.state
                .store
                .update(
                    &Delivery::key(&f.event.id, &f.endpoint.id),
                    Update::new().set("lease_until_ms", until),
                    None,
                )
                .await
                .unwrap();
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
                Outcome::Skipped
            );
            assert_eq!(current(&f).await.attempts, 0);
            // Its claim runs out (it crashed): the attempt is made.
            f.clock.advance(chrono::Duration::seconds(11));
            assert!(matches!(
                dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
                Outcome::Retrying { .. }
            ));
        }

        #[tokio::test]
        async fn disabled_and_deleted_endpoints_end_their_deliveries_unsent() {
            let f = fixture().await;
            fan_out(&f.state, &f.event).await.unwrap();
            patch(
                &f.state,
                "proj_1",
                Mode::Sandbox,
                &f.endpoint.id,
                PatchEndpoint {
                    enabled: Some(false),
                    ..PatchEndpoint::default()
                },
            )
            .await
            .unwrap();
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
                Outcome::Failed
            );
            let d = current(&f).await;
            assert_eq!((d.status, d.attempts), (DeliveryStatus::Failed, 0));
            assert!(d.last_error.unwrap().contains("disabled"));

            // Deleted: a new event gets no delivery at all.
            delete(&*f.state.store, "proj_1", Mode::Sandbox, &f.endpoint.id)
                .await
                .unwrap();
            let later = Event::new(
                EventType::PaymentFailed,
                "proj_1",
                Mode::Sandbox,
                json!({"id": "pay_2"}),
                f.clock.now(),
            );
            assert_eq!(fan_out(&f.state, &later).await.unwrap(), 0);
        }

        /// A receiver on loopback that answers 200 (after `delay`) and
        /// counts requests.
        async fn counting_receiver(
            delay: Duration,
        ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
            use std::sync::atomic::{AtomicUsize, Ordering};
            let hits = Arc::new(AtomicUsize::new(0));
            let counter = hits.clone();
            let app = axum::Router::new().route(
                "/hook",
                axum::routing::post(move || {
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(delay).await;
                        "ok"
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/hook", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            (url, hits)
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_copies_of_a_message_send_once() {
            let f = fixture().await;
            let (url, hits) = counting_receiver(Duration::from_millis(200)).await;
            patch(
                &f.state,
                "proj_1",
                Mode::Sandbox,
                &f.endpoint.id,
                PatchEndpoint {
                    url: Some(url),
                    ..PatchEndpoint::default()
                },
            )
            .await
            .unwrap();
            fan_out(&f.state, &f.event).await.unwrap();
            let runs = (0..8).map(|_| {
                let state = f.state.clone();
                let client = f.client.clone();
                let m = msg(&f, 0);
                tokio::spawn(async move { dispatch(&state, &client, &m).await.unwrap() })
            });
            let outcomes: Vec<Outcome> = futures::future::join_all(runs)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(
                outcomes
                    .iter()
                    .filter(|o| **o == Outcome::Delivered)
                    .count(),
                1,
                "{outcomes:?}"
            );
            assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
            let d = current(&f).await;
            assert_eq!(
                (d.status, d.attempts, d.response_status),
                (DeliveryStatus::Success, 1, Some(200))
            );
            // Later copies, of this attempt or the next: nothing is sent.
            for attempt in [0, 1] {
                assert_eq!(
                    dispatch(&f.state, &f.client, &msg(&f, attempt))
                        .await
                        .unwrap(),
                    Outcome::Skipped
                );
            }
            assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        }

        #[tokio::test]
        async fn a_delivery_whose_message_was_lost_is_queued_again_by_the_sweep() {
            use crate::queue::Queue;
            let f = fixture().await;
            fan_out(&f.state, &f.event).await.unwrap();
            // The message is lost (a purge, a dead-letter queue).
            let got = f
                .queue
                .receive(
                    QueueName::Webhooks,
                    10,
                    Duration::ZERO,
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            for m in got {
                f.queue
                    .delete(QueueName::Webhooks, &m.receipt)
                    .await
                    .unwrap();
            }
            assert_eq!(
                requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap(),
                0
            );
            f.clock.advance(chrono::Duration::minutes(16));
            let swept = sweep(&f.state, f.clock.now(), 10).await.unwrap();
            assert_eq!(swept.requeued, 1);
            let got = f
                .queue
                .receive(
                    QueueName::Webhooks,
                    10,
                    Duration::ZERO,
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            assert_eq!(got.len(), 1);
            let again = DeliveryMessage::parse(&got[0].body).unwrap();
            assert_eq!(again, msg(&f, 0));
            // Once final, it leaves the open index.
            for attempt in 0..=RETRY_SCHEDULE.len() as u32 {
                dispatch(&f.state, &f.client, &msg(&f, attempt))
                    .await
                    .unwrap();
                f.clock.advance(chrono::Duration::days(2));
            }
            assert_eq!(current(&f).await.status, DeliveryStatus::Failed);
            assert_eq!(
                requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap(),
                0
            );
        }

        #[tokio::test]
        async fn an_unreadable_delivery_does_not_keep_the_sweep_from_the_others() {
            use crate::queue::Queue;
            let f = fixture().await;
            fan_out(&f.state, &f.event).await.unwrap();
            // Its message is lost; a broken delivery of an old event sorts
            // before it in the same open shard.
            let got = f
                .queue
                .receive(
                    QueueName::Webhooks,
                    10,
                    Duration::ZERO,
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            for m in got {
                f.queue
                    .delete(QueueName::Webhooks, &m.receipt)
                    .await
                    .unwrap();
            }
            let Some(good) = f
                .state
                .store
                .get(&Delivery::key(&f.event.id, &f.endpoint.id))
                .await
                .unwrap()
            else {
                panic!("no delivery")
            };
            let shard = good.get(Index::Gsi2.pk_attr()).cloned();
            let three_hours_ago = f.clock.now().plus(chrono::Duration::hours(-3));
            let old_event = format!(
                "{}{}",
                IdKind::Event.prefix(),
                ulid::Ulid::from_parts(three_hours_ago.unix_millis() as u64, 1)
                    .to_string()
                    .to_ascii_lowercase()
            );
            let broken = json!({
                "pk": format!("EVT#{old_event}"),
                "sk": "WHD#we_broken",
                "status": "no-such-status",
                Index::Gsi2.pk_attr(): shard,
                Index::Gsi2.sk_attr(): "000000000000000#broken",
            });
            f.state
                .store
                .put(broken.as_object().cloned().unwrap(), None)
                .await
                .unwrap();
            f.clock.advance(chrono::Duration::minutes(16));
            assert_eq!(
                requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap(),
                1
            );
            // Taken out of the index (it is hours old), kept in the table.
            let kept = f
                .state
                .store
                .get(&Key::new(format!("EVT#{old_event}"), "WHD#we_broken"))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("the bad record is kept"));
            assert!(!kept.contains_key(Index::Gsi2.pk_attr()));

            // A delivery of the same old event that newer code wrote a
            // moment ago (a rolling deploy): passed over, left in the index.
            let fresh = json!({
                "pk": format!("EVT#{old_event}"),
                "sk": "WHD#we_newer",
                "status": "a-status-of-newer-code",
                "updated_at": f.clock.now(),
                Index::Gsi2.pk_attr(): shard,
                Index::Gsi2.sk_attr(): "000000000000000#newer",
            });
            f.state
                .store
                .put(fresh.as_object().cloned().unwrap(), None)
                .await
                .unwrap();
            requeue_overdue(&f.state, f.clock.now(), 10).await.unwrap();
            let left = f
                .state
                .store
                .get(&Key::new(format!("EVT#{old_event}"), "WHD#we_newer"))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("kept"));
            assert!(left.contains_key(Index::Gsi2.pk_attr()));
        }

        #[tokio::test]
        async fn a_test_event_reaches_its_endpoint_whatever_its_filter() {
            let f = fixture().await;
            let (filtered, _) = create(
                &f.state,
                "proj_1",
                Mode::Sandbox,
                CreateEndpoint {
                    url: "http://127.0.0.1:9/other".into(),
                    events: Some(vec!["payment.failed".into()]),
                    enabled: None,
                },
                None,
            )
            .await
            .unwrap();
            let event = send_test_event(
                &f.state,
                "proj_1",
                Mode::Sandbox,
                &filtered.id,
                EventType::RefundSucceeded,
            )
            .await
            .unwrap();
            assert_eq!(fan_out(&f.state, &event).await.unwrap(), 1);
            assert!(
                delivery(&*f.state.store, &event.id, &filtered.id)
                    .await
                    .unwrap()
                    .is_some()
            );
            // The fixture's endpoint takes every event, but not this one.
            assert!(
                delivery(&*f.state.store, &event.id, &f.endpoint.id)
                    .await
                    .unwrap()
                    .is_none()
            );
        }

        #[tokio::test]
        async fn a_fenced_registration_run_twice_creates_one_endpoint() {
            let f = fixture().await;
            let fence = Fence::new(Key::new("IDEMFENCE#t", "FENCE"), 0);
            let body = || CreateEndpoint {
                url: "http://127.0.0.1:9/fenced".into(),
                events: None,
                enabled: None,
            };
            let (first, secret) = create(&f.state, "proj_1", Mode::Sandbox, body(), Some(&fence))
                .await
                .unwrap();
            assert!(secret.is_some_and(|s| s.starts_with("whsec_") && s.len() == 6 + 64));
            // The answer was lost; the retry runs the handler again.
            let (again, secret) = create(&f.state, "proj_1", Mode::Sandbox, body(), Some(&fence))
                .await
                .unwrap();
            assert_eq!(again.id, first.id);
            assert!(secret.is_none(), "the secret is shown once");
            assert_eq!(
                list(&*f.state.store, "proj_1", Mode::Sandbox)
                    .await
                    .unwrap()
                    .len(),
                2
            );
        }

        #[test]
        fn null_is_refused_rather_than_ignored() {
            for body in [
                r#"{"url": null}"#,
                r#"{"events": null}"#,
                r#"{"enabled": null}"#,
            ] {
                assert!(
                    serde_json::from_str::<PatchEndpoint>(body).is_err(),
                    "{body}"
                );
            }
            assert!(
                serde_json::from_str::<CreateEndpoint>(
                    r#"{"url": "https://a.example", "events": null}"#
                )
                .is_err()
            );
            let p: PatchEndpoint = serde_json::from_str(r#"{"enabled": false}"#).unwrap();
            assert_eq!((p.url, p.events, p.enabled), (None, None, Some(false)));
        }

        #[tokio::test]
        async fn bad_messages_are_dropped() {
            let f = fixture().await;
            assert_eq!(
                handle_message(&f.state, &f.client, "{not json")
                    .await
                    .unwrap(),
                Outcome::Skipped
            );
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 0)).await.unwrap(),
                Outcome::Skipped
            );
        }

        // ------------------------------------------------ the delivery log

        #[tokio::test]
        async fn the_delivery_log_answers_the_newest_fifty_newest_first() {
            let f = fixture().await;
            let mut events = Vec::new();
            for i in 0..(DELIVERY_LOG + 10) {
                f.clock.advance(chrono::Duration::seconds(1));
                let event = Event::new(
                    EventType::PaymentSucceeded,
                    "proj_1",
                    Mode::Sandbox,
                    json!({ "id": format!("pay_{i}") }),
                    f.clock.now(),
                );
                f.state
                    .store
                    .transact(vec![event.put_op().unwrap()])
                    .await
                    .unwrap();
                assert_eq!(fan_out(&f.state, &event).await.unwrap(), 1);
                events.push(event);
            }
            let log = deliveries(&*f.state.store, "proj_1", Mode::Sandbox, &f.endpoint.id)
                .await
                .unwrap();
            assert_eq!(log.len(), DELIVERY_LOG);
            // Exactly the newest 50 events, newest first.
            let listed: Vec<&str> = log.iter().map(|d| d.event_id.as_str()).collect();
            let newest: Vec<&str> = events
                .iter()
                .rev()
                .take(DELIVERY_LOG)
                .map(|e| e.id.as_str())
                .collect();
            assert_eq!(listed, newest);
            for pair in log.windows(2) {
                assert!(pair[0].id > pair[1].id, "ids newest first");
                assert!(pair[0].created_at > pair[1].created_at, "newest first");
            }
            assert!(log.iter().all(|d| d.endpoint_id == f.endpoint.id));
            // The oldest ten are still stored, just not listed.
            for e in &events[..10] {
                assert!(
                    delivery(&*f.state.store, &e.id, &f.endpoint.id)
                        .await
                        .unwrap()
                        .is_some()
                );
            }
        }

        // ------------------------------------------------ long waits

        /// The queue of the fixture, recording every webhook message sent
        /// with its delay and the (manual) time it was sent at.
        struct Recording {
            inner: Arc<InProcessQueue>,
            clock: ManualClock,
            sent: std::sync::Mutex<Vec<(DeliveryMessage, Duration, Timestamp)>>,
        }

        impl Recording {
            fn sent(&self) -> Vec<(DeliveryMessage, Duration, Timestamp)> {
                self.sent.lock().unwrap().clone()
            }
        }

        #[async_trait::async_trait]
        impl crate::queue::Queue for Recording {
            async fn send(
                &self,
                queue: QueueName,
                body: &str,
                delay: Duration,
            ) -> Result<String, QueueError> {
                if queue == QueueName::Webhooks {
                    let m = DeliveryMessage::parse(body).unwrap();
                    self.sent.lock().unwrap().push((m, delay, self.clock.now()));
                }
                self.inner.send(queue, body, delay).await
            }

            async fn receive(
                &self,
                queue: QueueName,
                max: usize,
                wait: Duration,
                visibility: Duration,
            ) -> Result<Vec<crate::queue::Message>, QueueError> {
                self.inner.receive(queue, max, wait, visibility).await
            }

            async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError> {
                self.inner.delete(queue, receipt).await
            }
        }

        /// A receiver that answers 500 to its first `failures` requests,
        /// then 200, and records the (manual) time of each request.
        async fn flaky_receiver(
            failures: usize,
            clock: ManualClock,
        ) -> (String, Arc<std::sync::Mutex<Vec<Timestamp>>>) {
            let hits = Arc::new(std::sync::Mutex::new(Vec::new()));
            let seen = hits.clone();
            let app = axum::Router::new().route(
                "/hook",
                axum::routing::post(move || {
                    let seen = seen.clone();
                    let clock = clock.clone();
                    async move {
                        let mut seen = seen.lock().unwrap();
                        seen.push(clock.now());
                        if seen.len() <= failures {
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            axum::http::StatusCode::OK
                        }
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/hook", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            (url, hits)
        }

        /// Moves the manual clock and the queue's clock forward together by
        /// `step`, then handles every message now visible, as the worker
        /// does (a message is deleted once handled).
        async fn tick(f: &Fixture, step: Duration) -> Vec<Outcome> {
            use crate::queue::Queue;
            f.clock.advance(chrono::Duration::from_std(step).unwrap());
            f.queue.skip_ahead(step);
            let mut outcomes = Vec::new();
            loop {
                let got = f
                    .queue
                    .receive(
                        QueueName::Webhooks,
                        10,
                        Duration::ZERO,
                        Duration::from_secs(60),
                    )
                    .await
                    .unwrap();
                if got.is_empty() {
                    return outcomes;
                }
                for m in got {
                    outcomes.push(handle_message(&f.state, &f.client, &m.body).await.unwrap());
                    f.queue
                        .delete(QueueName::Webhooks, &m.receipt)
                        .await
                        .unwrap();
                }
            }
        }

        #[tokio::test]
        async fn a_wait_past_fifteen_minutes_is_chained_and_never_attempted_early() {
            let mut f = fixture().await;
            // Fails the first 4 attempts (waits 1 min, 5 min, 30 min, 2 h
            // follow them), answers the fifth.
            let (url, hits) = flaky_receiver(4, f.clock.clone()).await;
            patch(
                &f.state,
                "proj_1",
                Mode::Sandbox,
                &f.endpoint.id,
                PatchEndpoint {
                    url: Some(url),
                    ..PatchEndpoint::default()
                },
            )
            .await
            .unwrap();
            let recording = Arc::new(Recording {
                inner: f.queue.clone(),
                clock: f.clock.clone(),
                sent: std::sync::Mutex::new(Vec::new()),
            });
            f.state = f.state.clone().with_queue(recording.clone());
            let start = f.clock.now();
            fan_out(&f.state, &f.event).await.unwrap();

            // Minute by minute until the fourth attempt has failed.
            let minute = Duration::from_secs(60);
            let mut out = tick(&f, Duration::ZERO).await;
            while current(&f).await.attempts < 4 {
                assert!(f.clock.now() < start.plus(chrono::Duration::hours(1)));
                out.extend(tick(&f, minute).await);
            }
            let d = current(&f).await;
            assert_eq!(d.status, DeliveryStatus::Retrying);
            let failed_at = d.last_attempt_at.unwrap();
            let due = d.next_attempt_at.unwrap();
            assert_eq!(due, failed_at.plus(chrono::Duration::hours(2)));
            // Attempts at 0, +1 min, +6 min and +36 min (the 30 min wait
            // took two messages).
            let at = |mins: i64| start.plus(chrono::Duration::minutes(mins));
            assert_eq!(*hits.lock().unwrap(), vec![at(0), at(1), at(6), at(36)]);
            assert_eq!(failed_at, at(36));
            assert!(out.contains(&Outcome::NotDue), "{out:?}");

            // The 2 h wait, minute by minute: the chained messages arrive
            // early, send nothing and queue the rest of the wait.
            let stray_at = due.plus(chrono::Duration::minutes(-7));
            while f.clock.now() < stray_at {
                let out = tick(&f, minute).await;
                assert!(out.iter().all(|o| *o == Outcome::NotDue), "{out:?}");
                assert_eq!(hits.lock().unwrap().len(), 4, "sent early");
            }
            // A stray copy of the message 7 minutes early: not sent either,
            // and queued for exactly the 7 minutes left.
            assert_eq!(
                dispatch(&f.state, &f.client, &msg(&f, 4)).await.unwrap(),
                Outcome::NotDue
            );
            let (last, delay, _) = recording.sent().pop().unwrap();
            assert_eq!((last.attempt, delay), (4, Duration::from_secs(7 * 60)));
            while f.clock.now() < due.plus(chrono::Duration::minutes(-1)) {
                let out = tick(&f, minute).await;
                assert!(out.iter().all(|o| *o == Outcome::NotDue), "{out:?}");
                assert_eq!(hits.lock().unwrap().len(), 4, "sent early");
            }
            // Due: both messages arrive; exactly one sends.
            let mut out = tick(&f, minute).await;
            assert_eq!(f.clock.now(), due);
            out.sort_by_key(|o| format!("{o:?}"));
            assert_eq!(out, vec![Outcome::Delivered, Outcome::Skipped]);
            assert_eq!(hits.lock().unwrap().len(), 5);
            assert_eq!(hits.lock().unwrap()[4], due);
            let d = current(&f).await;
            assert_eq!((d.status, d.attempts), (DeliveryStatus::Success, 5));
            // Nothing more, ever.
            for _ in 0..30 {
                assert!(tick(&f, minute).await.is_empty());
            }
            assert!(f.queue.is_empty(QueueName::Webhooks));
            assert_eq!(hits.lock().unwrap().len(), 5);

            // Every message was queued for at most 15 minutes; each one for
            // the fifth attempt before its time for what was left of the
            // wait (capped): 2 h took 8 chained messages, plus the stray.
            let sent = recording.sent();
            assert!(
                sent.iter().all(|(_, delay, _)| *delay <= MAX_DELAY),
                "{sent:?}"
            );
            let fifth: Vec<(Duration, Timestamp)> = sent
                .iter()
                .filter(|(m, _, _)| m.attempt == 4)
                .map(|(_, delay, t)| (*delay, *t))
                .collect();
            assert_eq!(fifth.len(), 8 + 1, "{fifth:?}");
            for (delay, t) in &fifth {
                let left = Duration::from_millis((due.unix_millis() - t.unix_millis()) as u64);
                assert_eq!(*delay, left.min(MAX_DELAY), "at {t:?}");
            }
            let chain: Vec<Timestamp> = fifth
                .iter()
                .filter(|(delay, _)| *delay == MAX_DELAY)
                .map(|(_, t)| *t)
                .collect();
            let every_quarter: Vec<Timestamp> = (0..8)
                .map(|i| failed_at.plus(chrono::Duration::minutes(15 * i)))
                .collect();
            assert_eq!(chain, every_quarter);
        }

        // ------------------------------------------------ the endpoint limit

        fn body(i: usize) -> CreateEndpoint {
            CreateEndpoint {
                url: format!("http://127.0.0.1:9/hook/{i}"),
                events: None,
                enabled: None,
            }
        }

        async fn count_of(f: &Fixture, project: &str) -> Option<i64> {
            EndpointCounter::read(&*f.state.store, project, Mode::Sandbox)
                .await
                .unwrap()
                .map(|(n, _)| n)
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_registrations_never_pass_the_limit() {
            let f = fixture().await;
            let runs = (0..40).map(|i| {
                let state = f.state.clone();
                tokio::spawn(
                    async move { create(&state, "proj_2", Mode::Sandbox, body(i), None).await },
                )
            });
            let results: Vec<Result<(Endpoint, Option<String>), WebhookError>> =
                futures::future::join_all(runs)
                    .await
                    .into_iter()
                    .map(|r| r.unwrap())
                    .collect();
            let made = results.iter().filter(|r| r.is_ok()).count();
            let refused = results
                .iter()
                .filter(|r| matches!(r, Err(WebhookError::TooMany)))
                .count();
            assert_eq!((made, refused), (MAX_ENDPOINTS, 40 - MAX_ENDPOINTS));
            let listed = list(&*f.state.store, "proj_2", Mode::Sandbox)
                .await
                .unwrap();
            assert_eq!(listed.len(), MAX_ENDPOINTS);
            assert_eq!(count_of(&f, "proj_2").await, Some(MAX_ENDPOINTS as i64));
            // Per project and mode: the others are untouched.
            assert_eq!(count_of(&f, "proj_1").await, Some(1));
            create(&f.state, "proj_3", Mode::Sandbox, body(0), None)
                .await
                .unwrap();

            // Deleting makes room for exactly one; deleting twice (here at
            // once) frees one place only.
            let gone = listed[3].id.clone();
            let deletes = (0..4).map(|_| {
                let store = f.state.store.clone();
                let gone = gone.clone();
                tokio::spawn(async move { delete(&*store, "proj_2", Mode::Sandbox, &gone).await })
            });
            let deleted: Vec<Result<(), WebhookError>> = futures::future::join_all(deletes)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(deleted.iter().filter(|r| r.is_ok()).count(), 1);
            assert!(
                deleted
                    .iter()
                    .all(|r| matches!(r, Ok(()) | Err(WebhookError::NotFound(_))))
            );
            assert!(matches!(
                delete(&*f.state.store, "proj_2", Mode::Sandbox, &gone).await,
                Err(WebhookError::NotFound(_))
            ));
            assert_eq!(count_of(&f, "proj_2").await, Some(15));
            create(&f.state, "proj_2", Mode::Sandbox, body(100), None)
                .await
                .unwrap();
            assert!(matches!(
                create(&f.state, "proj_2", Mode::Sandbox, body(101), None).await,
                Err(WebhookError::TooMany)
            ));
            assert_eq!(
                list(&*f.state.store, "proj_2", Mode::Sandbox)
                    .await
                    .unwrap()
                    .len(),
                MAX_ENDPOINTS
            );
        }

        async fn set_count(f: &Fixture, project: &str, n: i64) {
            f.state
                .store
                .update(
                    &EndpointCounter::key(project, Mode::Sandbox),
                    Update::new().set(EndpointCounter::ATTR, n),
                    Some(Cond::Exists),
                )
                .await
                .unwrap();
        }

        #[tokio::test]
        async fn a_count_drifted_high_is_repaired_from_the_endpoints() {
            let f = fixture().await;
            for i in 0..3 {
                create(&f.state, "proj_2", Mode::Sandbox, body(i), None)
                    .await
                    .unwrap();
            }
            // Endpoints deleted without the count (old code, by hand).
            set_count(&f, "proj_2", MAX_ENDPOINTS as i64).await;
            create(&f.state, "proj_2", Mode::Sandbox, body(3), None)
                .await
                .unwrap();
            assert_eq!(count_of(&f, "proj_2").await, Some(4));
            let listed = list(&*f.state.store, "proj_2", Mode::Sandbox)
                .await
                .unwrap();
            assert_eq!(listed.len(), 4);

            // Still a limit: a full project is refused, repaired or not.
            for i in 4..MAX_ENDPOINTS {
                create(&f.state, "proj_2", Mode::Sandbox, body(i), None)
                    .await
                    .unwrap();
            }
            set_count(&f, "proj_2", MAX_ENDPOINTS as i64 + 3).await;
            assert!(matches!(
                create(&f.state, "proj_2", Mode::Sandbox, body(99), None).await,
                Err(WebhookError::TooMany)
            ));
            assert_eq!(
                list(&*f.state.store, "proj_2", Mode::Sandbox)
                    .await
                    .unwrap()
                    .len(),
                MAX_ENDPOINTS
            );
        }

        #[tokio::test]
        async fn a_repair_from_a_stale_read_changes_nothing() {
            let f = fixture().await;
            for i in 0..2 {
                create(&f.state, "proj_2", Mode::Sandbox, body(i), None)
                    .await
                    .unwrap();
            }
            let store = &*f.state.store;
            let Some((n, v)) = EndpointCounter::read(store, "proj_2", Mode::Sandbox)
                .await
                .unwrap()
            else {
                panic!("counter")
            };
            assert_eq!(n, 2);
            // A delete then a registration: the count is back at 2, but it
            // moved in between (a repair from the first read is stale).
            let listed = list(store, "proj_2", Mode::Sandbox).await.unwrap();
            delete(store, "proj_2", Mode::Sandbox, &listed[0].id)
                .await
                .unwrap();
            create(&f.state, "proj_2", Mode::Sandbox, body(7), None)
                .await
                .unwrap();
            EndpointCounter::repair(store, "proj_2", Mode::Sandbox, (n, v), 9)
                .await
                .unwrap();
            assert_eq!(count_of(&f, "proj_2").await, Some(2), "stale: no change");
            let fresh = EndpointCounter::read(store, "proj_2", Mode::Sandbox)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(fresh.1, v + 2);
            EndpointCounter::repair(store, "proj_2", Mode::Sandbox, fresh, 2)
                .await
                .unwrap();
            assert_eq!(count_of(&f, "proj_2").await, Some(2));
        }

        #[tokio::test]
        async fn a_count_drifted_low_never_blocks_a_delete_nor_goes_negative() {
            let f = fixture().await;
            let (only, _) = create(&f.state, "proj_2", Mode::Sandbox, body(0), None)
                .await
                .unwrap();
            set_count(&f, "proj_2", 0).await;
            delete(&*f.state.store, "proj_2", Mode::Sandbox, &only.id)
                .await
                .unwrap();
            assert!(matches!(
                get(&*f.state.store, "proj_2", Mode::Sandbox, &only.id).await,
                Err(WebhookError::NotFound(_))
            ));
            assert_eq!(count_of(&f, "proj_2").await, Some(0));
            assert!(matches!(
                delete(&*f.state.store, "proj_2", Mode::Sandbox, &only.id).await,
                Err(WebhookError::NotFound(_))
            ));
            assert_eq!(count_of(&f, "proj_2").await, Some(0));

            // Low with several left: set from the endpoints that remain.
            let mut made = Vec::new();
            for i in 0..3 {
                let (e, _) = create(&f.state, "proj_2", Mode::Sandbox, body(i), None)
                    .await
                    .unwrap();
                made.push(e.id);
            }
            set_count(&f, "proj_2", 0).await;
            delete(&*f.state.store, "proj_2", Mode::Sandbox, &made[0])
                .await
                .unwrap();
            assert_eq!(count_of(&f, "proj_2").await, Some(2));
            delete(&*f.state.store, "proj_2", Mode::Sandbox, &made[1])
                .await
                .unwrap();
            assert_eq!(count_of(&f, "proj_2").await, Some(1));
        }

        #[tokio::test]
        async fn endpoints_from_before_the_counter_are_counted() {
            let f = fixture().await;
            for i in 0..MAX_ENDPOINTS {
                create(&f.state, "proj_2", Mode::Sandbox, body(i), None)
                    .await
                    .unwrap();
            }
            // As stored before the counter existed.
            let counter = EndpointCounter::key("proj_2", Mode::Sandbox);
            f.state.store.delete(&counter, None).await.unwrap();
            assert!(matches!(
                create(&f.state, "proj_2", Mode::Sandbox, body(99), None).await,
                Err(WebhookError::TooMany)
            ));
            assert_eq!(count_of(&f, "proj_2").await, Some(MAX_ENDPOINTS as i64));

            // A delete is the first write after the upgrade: counted too.
            f.state.store.delete(&counter, None).await.unwrap();
            let some = list(&*f.state.store, "proj_2", Mode::Sandbox)
                .await
                .unwrap()
                .remove(0);
            delete(&*f.state.store, "proj_2", Mode::Sandbox, &some.id)
                .await
                .unwrap();
            assert_eq!(count_of(&f, "proj_2").await, Some(15));
            create(&f.state, "proj_2", Mode::Sandbox, body(100), None)
                .await
                .unwrap();
            assert!(matches!(
                create(&f.state, "proj_2", Mode::Sandbox, body(101), None).await,
                Err(WebhookError::TooMany)
            ));
        }
    }
}
