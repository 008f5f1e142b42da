//! Webhook endpoints: register (at most `MAX_ENDPOINTS` per project and
//! mode, counted in the same transaction), read, change and delete.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::MAX_ENDPOINTS;
use crate::Deps;
use crate::domain::credentials::{self, CredentialsError, SealedSecret};
use crate::domain::outbox::EventType;
use crate::domain::record::{Changes, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::fields::wire::present;
use crate::ids::{EndpointId, ProjectId};
use crate::keys;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Key, Query, Store, StoreError, TxOp, TxReason, update_with};
use crate::time::Timestamp;
use crate::webhooks::settings::WebhookSettings;
use crate::webhooks::ssrf::{self, UrlError};

/// A stored endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: EndpointId,
    pub project_id: ProjectId,
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

crate::attrs! { Endpoint {
    ID: EndpointId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    URL: String = url,
    EVENTS: Vec<EventType> = events,
    ENABLED: bool = enabled,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    SECRET: SealedSecret = secret,
} }

impl Endpoint {
    fn partition(tenant: &Tenant) -> String {
        keys::per_mode(
            &tenant.project,
            tenant.mode,
            keys::PerMode::WebhookEndpoints,
        )
    }

    pub fn key(tenant: &Tenant, id: &EndpointId) -> Key {
        Key::new(Endpoint::partition(tenant), id.as_str())
    }

    /// Whether this endpoint wants events of type `t`.
    pub fn wants(&self, t: EventType) -> bool {
        self.enabled && (self.events.is_empty() || self.events.contains(&t))
    }

    pub(super) fn secret_context(&self) -> String {
        format!("webhook/{}/{}", self.project_id, self.id)
    }
}

impl Record for Endpoint {
    fn item_key(&self) -> Key {
        Endpoint::key(&Tenant::new(self.project_id.clone(), self.mode), &self.id)
    }
}

/// The endpoint as the API answers it (spec, "Webhook endpoint").
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookEndpoint)]
pub struct EndpointView {
    pub id: String,
    /// Always `webhook_endpoint`.
    #[schema(value_type = String, pattern = "^webhook_endpoint$")]
    pub object: &'static str,
    pub livemode: bool,
    pub url: String,
    #[schema(value_type = Vec<EventType>)]
    pub events: Vec<&'static str>,
    pub enabled: bool,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Only in the answer to the registration.
    #[serde(rename = "signing_secret", skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub signing_secret: Option<String>,
}

impl EndpointView {
    pub fn of(e: &Endpoint, signing_secret: Option<String>) -> Self {
        EndpointView {
            id: e.id.to_string(),
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
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    pub url: String,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<EventType>>, nullable = false)]
    pub events: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/webhooks/{id}`: only the keys sent change.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchEndpoint {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub url: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<EventType>>, nullable = false)]
    pub events: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
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

pub(super) fn invalid(field: &'static str, message: impl Into<String>) -> WebhookError {
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
async fn check_receiver(
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

pub(super) fn keys(state: &Deps) -> Result<&credentials::CredentialsKeys, WebhookError> {
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
    tenant: &Tenant,
    body: CreateEndpoint,
    fence: Option<&Fence>,
) -> Result<(Endpoint, Option<String>), WebhookError> {
    create_with(state, tenant, body, fence, |_| Ok(Vec::new())).await
}

/// [`create`] with `also(endpoint)` (the dashboard's audit entry) written
/// in the same transaction.
pub async fn create_with(
    state: &Deps,
    tenant: &Tenant,
    body: CreateEndpoint,
    fence: Option<&Fence>,
    also: impl FnOnce(&Endpoint) -> Result<Vec<TxOp>, StoreError>,
) -> Result<(Endpoint, Option<String>), WebhookError> {
    let events = parse_events(body.events.as_deref().unwrap_or_default())?;
    let url = check_receiver(&body.url, tenant.mode, &state.webhooks).await?;
    let now = state.clock.now();
    let secret = new_secret()?;
    let id = EndpointId::new();
    let context = format!("webhook/{}/{id}", tenant.project);
    let sealed = credentials::seal_secret(keys(state)?, &context, &secret)?;
    let endpoint = Endpoint {
        id,
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        url,
        events,
        enabled: body.enabled.unwrap_or(true),
        created_at: now,
        updated_at: now,
        secret: sealed,
    };
    // The endpoint, the count (only while under the limit: the limit
    // holds however many registrations run at once), and the fence.
    let counter = EndpointCounter::key(tenant);
    let mut ops = vec![
        endpoint.put_new()?,
        TxOp::Update {
            key: counter.clone(),
            update: Changes::<EndpointCounter>::new()
                .add(EndpointCounter::N, 1)
                .add(EndpointCounter::V, 1)
                .into(),
            cond: Some(EndpointCounter::N.lt(&(MAX_ENDPOINTS as i64))),
        },
    ];
    const COUNTER_AT: usize = 1;
    const FENCE_AT: usize = 2;
    if let Some(f) = fence {
        ops.push(f.op(&endpoint.id));
    }
    ops.extend(also(&endpoint)?);
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
                let endpoint = get(state, tenant, &EndpointId::stored(&first)).await?;
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
            match EndpointCounter::read(&*state.store, tenant).await? {
                Some((n, v)) => {
                    let real = EndpointCounter::recount(&*state.store, tenant).await?;
                    if real >= MAX_ENDPOINTS as i64 {
                        return Err(WebhookError::TooMany);
                    }
                    if real != n {
                        // Only over the version just read: a registration
                        // or a delete in between makes this fail, and we
                        // try again.
                        EndpointCounter::repair(&*state.store, tenant, (n, v), real).await?;
                    }
                }
                None => EndpointCounter::ensure(&*state.store, tenant).await?,
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
/// endpoint existing, so a second delete lowers nothing). Written whole
/// once, when made from the endpoints (`EndpointCounter::ensure`); then
/// changed by `ADD`s and repairs alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointCounter {
    /// Its key, as read with it and written as its key (no attribute
    /// names the project and mode it counts).
    #[serde(skip_serializing)]
    pk: String,
    #[serde(skip_serializing)]
    sk: String,
    /// The endpoints (0 when missing).
    #[serde(default)]
    pub n: i64,
    /// Raised by every write of the count, so a repair from a recount is
    /// conditioned on nothing having changed since (a count alone could
    /// come back to the value read: a delete then a registration).
    /// Missing (0) on a counter no write has raised yet.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub v: i64,
}

crate::attrs! { EndpointCounter {
    N: i64 = n,
    V: i64 = v,
} }

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl Record for EndpointCounter {
    fn item_key(&self) -> Key {
        Key::new(self.pk.clone(), self.sk.clone())
    }
}

impl EndpointCounter {
    pub(super) fn key(tenant: &Tenant) -> Key {
        keys::webhook_count(&tenant.project, tenant.mode)
    }

    /// The count and its version, if the counter exists (0 for either
    /// attribute missing).
    pub(super) async fn read(
        store: &dyn Store,
        tenant: &Tenant,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        let key = EndpointCounter::key(tenant);
        let counter: Option<EndpointCounter> = crate::domain::record::get(store, &key).await?;
        Ok(counter.map(|c| (c.n, c.v)))
    }

    /// `version` still holds (a missing one reads as 0).
    fn unchanged(version: i64) -> Cond {
        if version == 0 {
            Cond::Or(vec![
                EndpointCounter::V.eq(&0),
                EndpointCounter::V.missing(),
            ])
        } else {
            EndpointCounter::V.eq(&version)
        }
    }

    /// Makes sure the counter exists. Endpoints registered before it
    /// existed are counted (strongly consistent) and the count written
    /// only if there is still no counter: every write that changes the
    /// endpoints needs the counter (its condition is false on a missing
    /// one), so none can land between that count and that put.
    async fn ensure(store: &dyn Store, tenant: &Tenant) -> Result<(), StoreError> {
        if EndpointCounter::read(store, tenant).await?.is_some() {
            return Ok(());
        }
        let n = EndpointCounter::recount(store, tenant).await?;
        let Key { pk, sk } = EndpointCounter::key(tenant);
        let counter = EndpointCounter { pk, sk, n, v: 0 };
        match store.put(counter.to_item()?, Some(Cond::NotExists)).await {
            // Another request made it first: from the same endpoints.
            Err(e) if e.is_condition_failure() => Ok(()),
            other => other,
        }
    }

    /// The endpoints actually stored (strongly consistent).
    async fn recount(store: &dyn Store, tenant: &Tenant) -> Result<i64, StoreError> {
        let n = store
            .count(&Query::partition(Endpoint::partition(tenant)))
            .await?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Sets the count to `real` if its version is still the one read with
    /// `seen` (before `real` was counted). Every write that changes the
    /// endpoints raises the version in the same transaction, so if it is
    /// unchanged none landed in between; if it moved, nothing is written
    /// (the caller reads and counts again). Logged: a drifted count means
    /// endpoints were changed without it.
    pub(super) async fn repair(
        store: &dyn Store,
        tenant: &Tenant,
        seen: (i64, i64),
        real: i64,
    ) -> Result<(), StoreError> {
        let key = EndpointCounter::key(tenant);
        let (seen, version) = seen;
        let still = EndpointCounter::unchanged(version);
        let update = Changes::<EndpointCounter>::new()
            .set(EndpointCounter::N, &real.max(0))
            .add(EndpointCounter::V, 1);
        match store
            .update(
                &key,
                update.into(),
                Some(Cond::And(vec![Cond::Exists, still])),
            )
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
pub async fn get(deps: &Deps, tenant: &Tenant, id: &EndpointId) -> Result<Endpoint, WebhookError> {
    let store = &*deps.store;
    match crate::domain::record::get(store, &Endpoint::key(tenant, id)).await? {
        Some(endpoint) => Ok(endpoint),
        None => Err(WebhookError::NotFound(id.to_string())),
    }
}

/// Every endpoint of the project in `mode`, newest first.
pub async fn list(deps: &Deps, tenant: &Tenant) -> Result<Vec<Endpoint>, StoreError> {
    list_in(&*deps.store, tenant).await
}

/// [`list`] on a store.
pub async fn list_in(store: &dyn Store, tenant: &Tenant) -> Result<Vec<Endpoint>, StoreError> {
    let query = Query::partition(Endpoint::partition(tenant))
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
    tenant: &Tenant,
    id: &EndpointId,
    body: PatchEndpoint,
) -> Result<Endpoint, WebhookError> {
    patch_with(state, tenant, id, body, Vec::new()).await
}

/// [`patch`] with `also` (the dashboard's audit entry) in the same
/// transaction.
pub async fn patch_with(
    state: &Deps,
    tenant: &Tenant,
    id: &EndpointId,
    body: PatchEndpoint,
    also: Vec<TxOp>,
) -> Result<Endpoint, WebhookError> {
    let current = get(state, tenant, id).await?;
    let mut update = Changes::<Endpoint>::new();
    if let Some(url) = &body.url {
        let url = check_receiver(url, tenant.mode, &state.webhooks).await?;
        update = update.set(Endpoint::URL, url.as_str());
    }
    if let Some(events) = &body.events {
        update = update.set(Endpoint::EVENTS, &parse_events(events)?);
    }
    if let Some(enabled) = body.enabled {
        update = update.set(Endpoint::ENABLED, &enabled);
    }
    let now = state.clock.now();
    update = update.set(Endpoint::UPDATED_AT, &now);
    match update_with(
        &*state.store,
        &current.item_key(),
        update.into(),
        Some(Cond::Exists),
        also,
    )
    .await
    {
        Ok(item) => Ok(from_item(item)?),
        Err(e) if e.is_condition_failure() => Err(WebhookError::NotFound(id.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the endpoint for good; pending deliveries to it are dropped
/// when their turn comes.
pub async fn delete(deps: &Deps, tenant: &Tenant, id: &EndpointId) -> Result<(), WebhookError> {
    delete_with(deps, tenant, id, Vec::new()).await
}

/// [`delete`] with `also` (the dashboard's audit entry) in the same
/// transaction: written only if the endpoint goes.
pub async fn delete_with(
    deps: &Deps,
    tenant: &Tenant,
    id: &EndpointId,
    also: Vec<TxOp>,
) -> Result<(), WebhookError> {
    let store = &*deps.store;
    let current = get(deps, tenant, id).await?;
    let key = Endpoint::key(tenant, &current.id);
    let counter = EndpointCounter::key(tenant);
    // The endpoint goes only if it is still there, and the count goes down
    // with it: a second delete (a retry, a race) lowers nothing.
    const ENDPOINT_AT: usize = 0;
    const COUNTER_AT: usize = 1;
    let mut ops = vec![
        TxOp::Delete {
            key: key.clone(),
            cond: Some(Cond::Exists),
        },
        TxOp::Update {
            key: counter.clone(),
            update: Changes::<EndpointCounter>::new()
                .subtract(EndpointCounter::N, 1)
                .add(EndpointCounter::V, 1)
                .into(),
            // Never below 0, and never ADD onto a missing counter (it
            // would start at -1): false on a missing `n`.
            cond: Some(EndpointCounter::N.gt(&0)),
        },
    ];
    ops.extend(also.iter().cloned());
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
            return Err(WebhookError::NotFound(id.to_string()));
        }
        if matches!(reasons.get(COUNTER_AT), Some(TxReason::ConditionFailed)) {
            // The counter is missing (made here from the endpoints, then
            // the delete is tried again), or it says
            // 0 while the endpoint exists: it drifted low (endpoints
            // written without it). The endpoint still goes; the count is
            // set from the endpoints left, only over the 0 just read.
            let counted = EndpointCounter::read(store, tenant).await?;
            if counted.is_none() {
                EndpointCounter::ensure(store, tenant).await?;
            }
            if let Some((seen @ ..=0, version)) = counted {
                let real = EndpointCounter::recount(store, tenant).await?;
                let mut ops = vec![
                    TxOp::Delete {
                        key: key.clone(),
                        cond: Some(Cond::Exists),
                    },
                    TxOp::Update {
                        key: counter.clone(),
                        update: Changes::<EndpointCounter>::new()
                            .set(EndpointCounter::N, &(real - 1).max(0))
                            .add(EndpointCounter::V, 1)
                            .into(),
                        cond: Some(EndpointCounter::unchanged(version)),
                    },
                ];
                ops.extend(also.iter().cloned());
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
                        return Err(WebhookError::NotFound(id.to_string()));
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
