//! Fan-out: an outbox event becomes one delivery (and one queue message) per
//! subscribed endpoint, at most once however often it runs.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::endpoints::list;
use super::log::{Delivery, DeliveryStatus, delivery};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::listing::counted;
use crate::domain::outbox::{self, Event};
use crate::domain::record::Record;
use crate::ids::{DeliveryId, EndpointId, EventId, PaymentId};
use crate::queue::{MAX_DELAY, QueueError, QueueName};
use crate::store::{Cond, StoreError, TxOp, write_with};
use crate::time::Timestamp;

/// What a queue message asks: make attempt `attempt` (0-based: the number
/// of attempts already made) of one delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub event_id: EventId,
    pub endpoint_id: EndpointId,
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
    /// Overdue deliveries queued again ([`requeue_overdue`](super::requeue_overdue)).
    pub requeued: usize,
}

pub(super) async fn enqueue(
    state: &Deps,
    msg: &DeliveryMessage,
    delay: Duration,
) -> Result<(), QueueError> {
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
pub(super) async fn fan_out(state: &Deps, event: &Event) -> Result<usize, DispatchError> {
    let now = state.clock.now();
    let endpoints = list(state, &Tenant::new(event.project_id.clone(), event.mode)).await?;
    let mut queued = 0;
    // A test event goes to its one endpoint, whatever that one's filter.
    let targets = endpoints.iter().filter(|e| match &event.endpoint_id {
        Some(target) => &e.id == target && e.enabled,
        None => e.wants(event.event_type),
    });
    for endpoint in targets {
        // In the open deliveries, due now.
        let open = Delivery::open_entry(now, &event.id, &endpoint.id);
        let delivery = Delivery {
            id: DeliveryId::new(),
            event_id: event.id.clone(),
            event_type: event.event_type,
            endpoint_id: endpoint.id.clone(),
            project_id: event.project_id.clone(),
            mode: event.mode,
            payment_id: event
                .payment_id
                .clone()
                .or_else(|| outbox::payment_of(&event.object).map(|p| PaymentId::stored(&p))),
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
            gsi2pk: Some(open.partition),
            gsi2sk: Some(open.sort),
            counted: true,
        };
        // Counted with its insert: a rerun's put fails, counting nothing.
        let put = TxOp::Put {
            item: delivery.to_item()?,
            cond: Some(Cond::NotExists),
        };
        let mut tries = 0;
        let first_time = loop {
            match write_with(&*state.store, put.clone(), delivery.count_new()).await {
                Ok(()) => break true,
                Err(e) if e.is_condition_failure() => break false,
                // A concurrent insert on the same counter shard.
                Err(e) if counted::is_conflict(&e) && tries < 8 => {
                    tries += 1;
                    crate::store::contention_backoff(tries).await;
                }
                Err(e) => return Err(e.into()),
            }
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
pub async fn fan_out_by_id(state: &Deps, id: &EventId) -> Result<usize, DispatchError> {
    match outbox::get(state, id).await? {
        Some(event) if !event.dispatched => fan_out(state, &event).await,
        _ => Ok(0),
    }
}

// -------------------------------------------------------------- dispatch
