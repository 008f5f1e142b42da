//! The delivery log: one record per (event, endpoint), as merchants read it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DELIVERY_LOG;
use super::endpoints::{WebhookError, get};
use crate::Deps;
use crate::domain::listing::counted;
use crate::domain::outbox::{self, Event, EventType};
use crate::domain::record::{Entry, Gsi2Entry, Record, from_item};
use crate::domain::{Mode, Tenant, Window};
use crate::ids::{DeliveryId, EndpointId, EventId, PaymentId, ProjectId};
use crate::keys;
use crate::store::{Index, Key, Query, SkCond, Store, StoreError};
use crate::time::Timestamp;

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
    pub id: DeliveryId,
    pub event_id: EventId,
    pub event_type: EventType,
    pub endpoint_id: EndpointId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub payment_id: Option<PaymentId>,
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
    /// Its entry among the open deliveries, by due time, while open:
    /// `gsi2pk`, then `gsi2sk` (see [`Delivery::open_entry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsi2pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsi2sk: Option<String>,
    /// Counted in its endpoint's list counters (`listing::counted`): set
    /// at creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
}

crate::attrs! { Delivery {
    ID: DeliveryId = id,
    EVENT_ID: EventId = event_id,
    EVENT_TYPE: EventType = event_type,
    ENDPOINT_ID: EndpointId = endpoint_id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    PAYMENT_ID: Option<PaymentId> = payment_id,
    STATUS: DeliveryStatus = status,
    ATTEMPTS: u32 = attempts,
    RESPONSE_STATUS: Option<u16> = response_status,
    RESPONSE_BODY: Option<String> = response_body,
    PAYLOAD: Option<String> = payload,
    LAST_ERROR: Option<String> = last_error,
    LAST_ATTEMPT_AT: Option<Timestamp> = last_attempt_at,
    NEXT_ATTEMPT_AT: Option<Timestamp> = next_attempt_at,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    LEASE_UNTIL_MS: Option<i64> = lease_until_ms,
    GSI2PK: Option<String> = gsi2pk,
    GSI2SK: Option<String> = gsi2sk,
    COUNTED: bool = counted,
} }

impl crate::domain::listing::counted::Counted for Delivery {
    const COUNTED: crate::domain::record::Attr<Self, bool> = Delivery::COUNTED;
    fn counted_list(&self) -> counted::CountedList {
        Delivery::counted_list_of(
            &Tenant::new(self.project_id.clone(), self.mode),
            &self.endpoint_id,
        )
    }
    fn counted_id(&self) -> &str {
        &self.id
    }
    fn counted_created(&self) -> Timestamp {
        self.created_at
    }
    fn is_counted(&self) -> bool {
        self.counted
    }
}

impl Delivery {
    pub fn key(event_id: &EventId, endpoint_id: &EndpointId) -> Key {
        keys::delivery(event_id, endpoint_id)
    }

    /// Its entry among the open deliveries (`gsi2`), due at `due`: in the
    /// partition of its event's shard, due time first.
    pub(super) fn open_entry(
        due: Timestamp,
        event_id: &EventId,
        endpoint_id: &EndpointId,
    ) -> Gsi2Entry {
        Gsi2Entry::new(
            keys::open(
                keys::Open::Deliveries,
                keys::shard_of(event_id, outbox::SHARDS),
            ),
            Delivery::open_sort_key(due, event_id, endpoint_id),
        )
    }

    /// The open-deliveries sort key of one due at `due`: due time first
    /// (a sweep reads those due before a time).
    fn open_sort_key(due: Timestamp, event_id: &EventId, endpoint_id: &EndpointId) -> String {
        format!("{:015}#{event_id}#{endpoint_id}", due.unix_millis().max(0))
    }

    pub(crate) fn log_partition(endpoint_id: &EndpointId) -> String {
        keys::endpoint_deliveries(endpoint_id)
    }

    /// The counted delivery log of `endpoint` (of `tenant`): its own
    /// counters.
    pub fn counted_list_of(tenant: &Tenant, endpoint: &EndpointId) -> counted::CountedList {
        counted::CountedList::new(
            counted::CountedKind::Deliveries,
            tenant.clone(),
            Delivery::log_partition(endpoint),
        )
        .scoped(endpoint)
    }

    /// The writes counting it in its endpoint's log (its insert's
    /// transaction).
    pub fn count_new(&self) -> Vec<crate::store::TxOp> {
        use counted::Counted;
        self.counted_list().count_new(&self.id, self.created_at)
    }
}

impl Record for Delivery {
    fn item_key(&self) -> Key {
        Delivery::key(&self.event_id, &self.endpoint_id)
    }

    /// Listed in its endpoint's delivery log, newest first (its entry
    /// among the open deliveries is its `gsi2` fields).
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            Delivery::log_partition(&self.endpoint_id),
            self.id.clone(),
        )]
    }
}

/// A delivery as the API answers it (spec, "Webhook delivery attempt").
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookDelivery)]
pub struct DeliveryView {
    pub id: String,
    /// Always `webhook_delivery`.
    #[schema(value_type = String)]
    pub object: &'static str,
    pub webhook_endpoint_id: String,
    pub event_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub payment_id: Option<String>,
    #[schema(value_type = EventType)]
    pub event_type: &'static str,
    #[schema(value_type = String)]
    pub status: &'static str,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub response_status: Option<u16>,
    /// The first KB of the receiver's last answer, as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub response_body: Option<String>,
    /// The event body sent, as JSON (omitted before the first attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub last_attempt_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next_attempt_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub livemode: bool,
}

impl From<&Delivery> for DeliveryView {
    fn from(d: &Delivery) -> Self {
        DeliveryView {
            id: d.id.to_string(),
            object: "webhook_delivery",
            webhook_endpoint_id: d.endpoint_id.to_string(),
            event_id: d.event_id.to_string(),
            payment_id: d.payment_id.as_ref().map(ToString::to_string),
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
    deps: &Deps,
    tenant: &Tenant,
    id: &EndpointId,
) -> Result<Vec<Delivery>, WebhookError> {
    let store = &*deps.store;
    let endpoint = get(deps, tenant, id).await?;
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

/// A page of the deliveries to endpoint `id`, newest first, and their
/// total (the dashboard's delivery log).
pub async fn deliveries_page(
    deps: &Deps,
    tenant: &Tenant,
    id: &EndpointId,
    window: Window,
) -> Result<(Vec<Delivery>, u64), WebhookError> {
    let store = &*deps.store;
    let endpoint = get(deps, tenant, id).await?;
    let covered = counted::covered(store, tenant, counted::CountedKind::Deliveries).await?;
    let list = Delivery::counted_list_of(tenant, &endpoint.id);
    let (deliveries, total, _) = counted::page(store, &list, &window, covered).await?;
    Ok((deliveries, total))
}

/// The deliveries of event `event_id` (one per endpoint it went to, at
/// most `limit`). The caller has found the event's payment in its tenant.
pub async fn deliveries_of_event(
    store: &dyn Store,
    event_id: &EventId,
    limit: usize,
) -> Result<Vec<Delivery>, StoreError> {
    let query = Query::partition(Event::key(event_id).pk)
        .sk(SkCond::BeginsWith(keys::delivery(event_id, "").sk))
        .limit(limit);
    crate::domain::record::all_of(store, &query).await
}

/// The delivery of `event_id` to `endpoint_id`, if any.
pub async fn delivery(
    store: &dyn Store,
    event_id: &EventId,
    endpoint_id: &EndpointId,
) -> Result<Option<Delivery>, StoreError> {
    crate::domain::record::get(store, &Delivery::key(event_id, endpoint_id)).await
}

// --------------------------------------------------------------- fan-out
