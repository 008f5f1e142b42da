//! Delivering: claim an attempt with a lease, send it signed, log the
//! outcome, schedule the next try or give up; re-queue overdue deliveries.

use std::time::Duration;

use super::endpoints::{Endpoint, WebhookError, get};
use super::fan_out::{DeliveryMessage, DispatchError, FanOutReport, enqueue, fan_out_pending};
use super::log::{Delivery, DeliveryStatus, delivery};
use crate::domain::record::Changes;
use crate::domain::{Mode, Tenant, credentials, outbox};
use crate::ids::{EndpointId, EventId};
use crate::store::{Cond, Index, Query, SkCond, StoreError};
use crate::time::Timestamp;
use crate::webhooks::client::{Sent, WebhookClient};
use crate::{Deps, keys};

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
pub(super) async fn dispatch(
    state: &Deps,
    client: &WebhookClient,
    msg: &DeliveryMessage,
) -> Result<Outcome, DispatchError> {
    let now = state.clock.now();
    let Some(d) = delivery(&*state.store, &msg.event_id, &msg.endpoint_id).await? else {
        tracing::warn!(event_id = %msg.event_id, endpoint_id = %msg.endpoint_id, "message for an unknown delivery dropped");
        return Ok(Outcome::Skipped);
    };
    if let Some(later) = not_now(state, msg, &d, now).await? {
        return Ok(later);
    }
    let endpoint = match get(
        state,
        &Tenant::new(d.project_id.clone(), d.mode),
        &d.endpoint_id,
    )
    .await
    {
        Ok(e) if e.enabled => e,
        Ok(_) => return give_up(state, &d, "the endpoint is disabled").await,
        Err(WebhookError::NotFound(_)) => {
            return give_up(state, &d, "the endpoint was deleted").await;
        }
        Err(WebhookError::Store(e)) => return Err(e.into()),
        Err(e) => return Err(DispatchError::Secrets(e.to_string())),
    };
    let Some(event) = outbox::get(state, &d.event_id).await? else {
        return give_up(state, &d, "the event no longer exists").await;
    };
    let Some(lease_until) = claim_attempt(state, &d).await? else {
        return Ok(Outcome::Skipped);
    };
    let body = serde_json::to_vec(&event.body())
        .map_err(|e| DispatchError::BadMessage(format!("event body: {e}")))?;
    let sent = send_signed(state, client, &endpoint, &body).await;
    let done_at = state.clock.now();
    let (status, next_at, outcome) = attempt_outcome(state, &d, &sent, done_at);
    let update = attempt_log(&d, &sent, &body, status, next_at, done_at);
    // The next attempt's message goes out before the log: if the log then
    // fails, this message stays and redoes the attempt, and the early
    // message waits for it; if queueing fails, nothing is logged and this
    // message redoes the attempt. Never a delivery without a message.
    if let Outcome::Retrying { next_in } = outcome {
        let next = DeliveryMessage {
            attempt: d.attempts + 1,
            ..msg.clone()
        };
        enqueue(state, &next, next_in).await?;
    }
    if !log_attempt(state, &d, update, lease_until).await? {
        // Our claim ran out and another worker took the attempt: it logs.
        return Ok(Outcome::Skipped);
    }
    tracing::info!(
        event_id = %d.event_id,
        endpoint_id = %d.endpoint_id,
        attempt = d.attempts + 1,
        status = status.as_str(),
        response_status = ?sent.status(),
        "webhook attempt"
    );
    Ok(outcome)
}

/// What a message that is not for an attempt now does: stale or final is
/// skipped; one early (ahead of the attempt logged, or before the next
/// attempt is due) is queued again for later; a lease held by another
/// worker is skipped. `None`: attempt it now.
pub(super) async fn not_now(
    state: &Deps,
    msg: &DeliveryMessage,
    d: &Delivery,
    now: Timestamp,
) -> Result<Option<Outcome>, DispatchError> {
    if d.status.is_final() || msg.attempt < d.attempts {
        return Ok(Some(Outcome::Skipped));
    }
    if msg.attempt > d.attempts {
        // The message for the next attempt is queued before the current
        // attempt is logged: the log is late or failed (then the current
        // attempt's message redoes it). Either way this message must not
        // be lost: look again after a lease.
        enqueue(state, msg, state.webhooks.lease).await?;
        return Ok(Some(Outcome::NotDue));
    }
    if let Some(next) = d.next_attempt_at {
        let wait_ms = next.unix_millis() - now.unix_millis();
        if wait_ms > 1000 {
            enqueue(state, msg, Duration::from_millis(wait_ms as u64)).await?;
            return Ok(Some(Outcome::NotDue));
        }
    }
    let now_ms = now.unix_millis();
    if d.lease_until_ms.is_some_and(|until| until > now_ms) {
        return Ok(Some(Outcome::Skipped));
    }
    Ok(None)
}

/// Open attempts: still `pending` or `retrying`.
fn open_attempt() -> Cond {
    Delivery::STATUS.is_in(&[DeliveryStatus::Pending, DeliveryStatus::Retrying])
}

/// No worker holds the attempt at `now_ms`: no lease, or one run out.
fn unleased(now_ms: i64) -> Cond {
    Cond::Or(vec![
        Delivery::LEASE_UNTIL_MS.missing(),
        Delivery::LEASE_UNTIL_MS.lt(&Some(now_ms)),
    ])
}

/// Claims the delivery's attempt with a lease that counts from now (not
/// from the reads); answers the lease's end, or `None` when another
/// worker holds or made it.
pub(super) async fn claim_attempt(
    state: &Deps,
    d: &Delivery,
) -> Result<Option<i64>, DispatchError> {
    let now_ms = state.clock.now().unix_millis();
    let lease_until = now_ms + state.webhooks.lease.as_millis() as i64;
    let claim = state
        .store
        .update(
            &Delivery::key(&d.event_id, &d.endpoint_id),
            Changes::<Delivery>::new()
                .set_some(Delivery::LEASE_UNTIL_MS, &lease_until)
                .into(),
            Some(Cond::And(vec![
                Delivery::ATTEMPTS.eq(&d.attempts),
                open_attempt(),
                unleased(now_ms),
            ])),
        )
        .await;
    match claim {
        Ok(_) => Ok(Some(lease_until)),
        Err(e) if e.is_condition_failure() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Sends `body` to `endpoint`, signed with its secret.
pub(super) async fn send_signed(
    state: &Deps,
    client: &WebhookClient,
    endpoint: &Endpoint,
    body: &[u8],
) -> Sent {
    let secret = match state.providers.keys() {
        Some(keys) => credentials::open_secret(keys, &endpoint.secret, &endpoint.secret_context())
            .map_err(|e| e.to_string()),
        None => Err(format!("{} is not set", credentials::KEY_ENV)),
    };
    match secret {
        Ok(secret) => {
            client
                .send(
                    &endpoint.url,
                    &secret,
                    state.clock.now().unix_seconds(),
                    body,
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
    }
}

/// What the attempt made at `done_at` leads to: delivered, the next try on
/// the schedule, or, past it, failed.
pub(super) fn attempt_outcome(
    state: &Deps,
    d: &Delivery,
    sent: &Sent,
    done_at: Timestamp,
) -> (DeliveryStatus, Option<Timestamp>, Outcome) {
    let retry_in = state.webhooks.schedule.get(d.attempts as usize).copied();
    if sent.is_success() {
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
    }
}

/// The delivery log's entry for the attempt: its status, when the next is
/// due (in the open-deliveries index) or none (out of it), the receiver's
/// answer or why there was none, and the payload on the first attempt.
pub(super) fn attempt_log(
    d: &Delivery,
    sent: &Sent,
    body: &[u8],
    status: DeliveryStatus,
    next_at: Option<Timestamp>,
    done_at: Timestamp,
) -> Changes<Delivery> {
    let mut update = Changes::<Delivery>::new()
        .set(Delivery::ATTEMPTS, &(d.attempts + 1))
        .set(Delivery::STATUS, &status)
        .set_some(Delivery::LAST_ATTEMPT_AT, &done_at)
        .set(Delivery::UPDATED_AT, &done_at)
        .remove(Delivery::LEASE_UNTIL_MS);
    update = match next_at {
        Some(t) => update
            .set_some(Delivery::NEXT_ATTEMPT_AT, &t)
            .index(&Delivery::open_entry(t, &d.event_id, &d.endpoint_id)),
        // Final: out of the open-deliveries index.
        None => update
            .remove(Delivery::NEXT_ATTEMPT_AT)
            .unindex(Index::Gsi2),
    };
    update = match sent.status() {
        Some(code) => update.set_some(Delivery::RESPONSE_STATUS, &code),
        None => update.remove(Delivery::RESPONSE_STATUS),
    };
    update = match sent {
        Sent::NoAnswer(why) => update
            .set_some(Delivery::LAST_ERROR, why.as_str())
            .remove(Delivery::RESPONSE_BODY),
        Sent::Answered(s, answer) if !sent.is_success() => update
            .set_some(
                Delivery::LAST_ERROR,
                format!("the receiver answered {s}").as_str(),
            )
            .set_some(Delivery::RESPONSE_BODY, answer.as_str()),
        Sent::Answered(_, answer) => update
            .remove(Delivery::LAST_ERROR)
            .set_some(Delivery::RESPONSE_BODY, answer.as_str()),
    };
    if d.payload.is_none() {
        update = update.set_some(Delivery::PAYLOAD, &*String::from_utf8_lossy(body));
    }
    update
}

/// Logs the attempt under our claim (the lease ending `lease_until`);
/// `false` when the claim ran out and another worker took the attempt.
pub(super) async fn log_attempt(
    state: &Deps,
    d: &Delivery,
    update: Changes<Delivery>,
    lease_until: i64,
) -> Result<bool, DispatchError> {
    let logged = state
        .store
        .update(
            &Delivery::key(&d.event_id, &d.endpoint_id),
            update.into(),
            Some(Cond::And(vec![
                Delivery::ATTEMPTS.eq(&d.attempts),
                Delivery::LEASE_UNTIL_MS.is(&lease_until),
                open_attempt(),
            ])),
        )
        .await;
    match logged {
        Ok(_) => Ok(true),
        Err(e) if e.is_condition_failure() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Ends a delivery that can no longer be made, without sending.
async fn give_up(state: &Deps, d: &Delivery, why: &str) -> Result<Outcome, DispatchError> {
    let now = state.clock.now();
    let written = state
        .store
        .update(
            &Delivery::key(&d.event_id, &d.endpoint_id),
            Changes::<Delivery>::new()
                .set(Delivery::STATUS, &DeliveryStatus::Failed)
                .set_some(Delivery::LAST_ERROR, why)
                .remove(Delivery::NEXT_ATTEMPT_AT)
                .unindex(Index::Gsi2)
                .set(Delivery::UPDATED_AT, &now)
                .into(),
            Some(Cond::And(vec![
                Delivery::ATTEMPTS.eq(&d.attempts),
                open_attempt(),
                // Not while another worker holds the attempt: it logs.
                unleased(now.unix_millis()),
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
const OVERDUE_AFTER: chrono::Duration = chrono::Duration::minutes(15);

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
            // Move it forward in the index first (due now: same partition,
            // later place), so the next sweep looks at the ones behind it
            // and does not queue this one every run.
            let moved = state
                .store
                .update(
                    &Delivery::key(&d.event_id, &d.endpoint_id),
                    Changes::<Delivery>::new()
                        .index_sort(Delivery::open_entry(now, &d.event_id, &d.endpoint_id).sort)
                        .into(),
                    Some(Cond::And(vec![
                        Delivery::ATTEMPTS.eq(&d.attempts),
                        Delivery::GSI2PK.exists(),
                        open_attempt(),
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
const FAN_OUT_GRACE: chrono::Duration = chrono::Duration::minutes(2);

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

/// What [`resend`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resent {
    /// Queued for one more attempt now.
    Queued,
    /// Not final: its own retries are still to come (nothing done).
    StillOpen,
}

/// Sends a final delivery (delivered or failed) again: one more attempt of
/// the same event (same id and body, so a receiver that deduplicates by
/// event id sees it as the same) to the same endpoint, now. The delivery
/// is reopened only if it is as read (status and attempts), so a double
/// submit queues one attempt; it goes back in the open-deliveries index,
/// so the sweep's backstop queues it again if its message is lost. After
/// that attempt the schedule goes on where it was (usually: over, so a
/// failure is final again).
pub async fn resend(
    state: &Deps,
    tenant: &Tenant,
    event_id: &EventId,
    endpoint_id: &EndpointId,
) -> Result<Resent, WebhookError> {
    // The endpoint first: another project's or mode's is no endpoint.
    get(state, tenant, endpoint_id).await?;
    let d = delivery(&*state.store, event_id, endpoint_id)
        .await?
        .filter(|d| tenant.owns(&d.project_id, d.mode))
        .ok_or_else(|| WebhookError::NotFound(format!("{event_id} to {endpoint_id}")))?;
    if !d.status.is_final() {
        return Ok(Resent::StillOpen);
    }
    let now = state.clock.now();
    let reopen = Changes::<Delivery>::new()
        .set(Delivery::STATUS, &DeliveryStatus::Retrying)
        .set_some(Delivery::NEXT_ATTEMPT_AT, &now)
        .set(Delivery::UPDATED_AT, &now)
        .index(&Delivery::open_entry(now, &d.event_id, &d.endpoint_id))
        .remove(Delivery::LEASE_UNTIL_MS);
    let as_read = Cond::And(vec![
        Delivery::STATUS.eq(&d.status),
        Delivery::ATTEMPTS.eq(&d.attempts),
    ]);
    match state
        .store
        .update(
            &Delivery::key(&d.event_id, &d.endpoint_id),
            reopen.into(),
            Some(as_read),
        )
        .await
    {
        Ok(_) => {}
        // Reopened by a first click meanwhile: that one queued it.
        Err(e) if e.is_condition_failure() => return Ok(Resent::StillOpen),
        Err(e) => return Err(e.into()),
    }
    let msg = DeliveryMessage {
        event_id: d.event_id.clone(),
        endpoint_id: d.endpoint_id.clone(),
        attempt: d.attempts,
    };
    // A lost message leaves an open, due delivery: the sweep queues it.
    if let Err(e) = enqueue(state, &msg, Duration::ZERO).await {
        tracing::warn!(error = %e, "a resent delivery's message was not queued; the sweep will");
    }
    Ok(Resent::Queued)
}
