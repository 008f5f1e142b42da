//! The SMS worker: claim a reminder, check it is still worth sending, send it
//! through the provider and record the outcome exactly once.

use std::time::Duration;

use super::guards::{SmsCount, quota_counter};
use super::notify::{SmsMessage, get};
use super::reminders::{SmsReminder, SmsStatus};
use super::{LEASE, MAX_ATTEMPTS};
use crate::Deps;
use crate::domain::Mode;
use crate::domain::checkout::{CheckoutSession, SessionStatus};
use crate::domain::record::{Changes, from_item, word};
use crate::ids::SmsId;
use crate::providers::sms::{SmsClient, SmsSendError};
use crate::store::{Cond, Index, Store, StoreError, TxOp, TxReason, Update};
use crate::time::Timestamp;

/// What handling one message did; each lets the message go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchOutcome {
    Sent,
    /// Certainly not sent: refused by the provider, or out of attempts.
    Failed,
    /// Not sent: its checkout session is no longer payable.
    Cancelled,
    /// Maybe sent; never tried again (see [`SmsStatus::Unknown`]).
    Unknown,
    /// Unknown, final, or claimed by another worker (duplicate message).
    Skipped,
}

/// Why a message must stay on the queue (it comes back and is retried).
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("SMS provider unavailable: {0}")]
    Transient(String),
}

/// One queue message body: malformed messages are dropped (logged).
pub async fn handle_message(
    state: &Deps,
    client: &SmsClient,
    body: &str,
) -> Result<DispatchOutcome, DispatchError> {
    match serde_json::from_str::<SmsMessage>(body) {
        Ok(msg) => dispatch(state, client, &msg.sms_id, LEASE).await,
        Err(e) => {
            tracing::warn!(error = %e, "malformed SMS queue message dropped");
            Ok(DispatchOutcome::Skipped)
        }
    }
}

/// Whether the reminder's checkout session can still be paid (a reminder
/// without one, from before sessions were bound, is sent).
async fn still_payable(
    store: &dyn Store,
    r: &SmsReminder,
    now: Timestamp,
) -> Result<Option<String>, StoreError> {
    let Some(id) = r.session_id.as_ref() else {
        return Ok(None);
    };
    let session = match store.get(&CheckoutSession::key(id)).await? {
        Some(item) => from_item::<CheckoutSession>(item).ok(),
        None => None,
    };
    Ok(match session.map(|s| s.status_at(now)) {
        Some(SessionStatus::Pending | SessionStatus::Initiated) => None,
        Some(other) => Some(format!(
            "checkout session {id} is {}: nothing to remind",
            other.as_str()
        )),
        None => Some(format!("checkout session {id} no longer exists")),
    })
}

/// Ends a claimed reminder: `status` with `error`, conditioned on our
/// claim; a `Failed` or `Cancelled` one gives its quota unit back in the
/// same transaction (once: the write that ends it is the one that gives
/// it back). `Ok(false)`: the lease was lost, another worker owns it.
async fn finish(
    store: &dyn Store,
    r: &SmsReminder,
    claim: &str,
    status: SmsStatus,
    attempts: u32,
    error: Option<&str>,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let mut changes = Changes::<SmsReminder>::new()
        .set(SmsReminder::STATUS, &status)
        .set(SmsReminder::ATTEMPTS, &attempts)
        .set(SmsReminder::UPDATED_AT, &now)
        .remove(SmsReminder::LEASE_UNTIL_MS)
        .remove(SmsReminder::CLAIM);
    if status.is_final() {
        changes = changes.unindex(Index::Gsi2);
    }
    changes = match error {
        Some(e) => changes.set_some(SmsReminder::LAST_ERROR, e),
        None => changes.remove(SmsReminder::LAST_ERROR),
    };
    let update: Update = changes.into();
    let key = SmsReminder::key(&r.id);
    let cond = held_by(claim);
    let gives_back = matches!(status, SmsStatus::Failed | SmsStatus::Cancelled);
    let mut attempt = 0;
    loop {
        let result = if gives_back {
            store
                .transact(vec![
                    TxOp::Update {
                        key: key.clone(),
                        update: update.clone(),
                        cond: Some(cond.clone()),
                    },
                    TxOp::Update {
                        key: quota_counter(&r.merchant_id, r.created_at),
                        update: Changes::<SmsCount>::new().subtract(SmsCount::N, 1).into(),
                        cond: Some(SmsCount::N.gt(&0)),
                    },
                ])
                .await
        } else {
            store
                .update(&key, update.clone(), Some(cond.clone()))
                .await
                .map(|_| ())
        };
        let e = match result {
            Ok(()) => return Ok(true),
            Err(e) => e,
        };
        match &e {
            StoreError::ConditionFailed => return Ok(false),
            StoreError::TransactionCanceled { reasons } => {
                if matches!(reasons.first(), Some(TxReason::ConditionFailed)) {
                    return Ok(false);
                }
                if matches!(reasons.get(1), Some(TxReason::ConditionFailed)) {
                    // The month's counter is gone (expired): nothing to
                    // give back to; end the reminder alone.
                    tracing::warn!(sms_id = %r.id, "SMS quota unit not given back: its month's counter is gone");
                    return match store.update(&key, update, Some(cond)).await {
                        Ok(_) => Ok(true),
                        Err(e) if e.is_condition_failure() => Ok(false),
                        Err(e) => Err(e),
                    };
                }
                // Another transaction on the same items (many reminders of
                // one merchant ending at once): try again.
            }
            // Busy or unreachable: the outcome must not be lost (a
            // reminder left `sending` ends `unknown`), so try again.
            StoreError::Unavailable(_) => {}
            _ => return Err(e),
        }
        attempt += 1;
        if attempt >= FINISH_TRIES {
            return Err(e);
        }
        crate::store::contention_backoff(attempt).await;
    }
}

/// Still `sending` under the claim `claim` (every write of the claim
/// holder is conditioned on it).
fn held_by(claim: &str) -> Cond {
    Cond::And(vec![
        SmsReminder::STATUS.eq(&SmsStatus::Sending),
        SmsReminder::CLAIM.is(claim),
    ])
}

/// Tries of the write that ends a claimed reminder.
const FINISH_TRIES: usize = 6;

/// Gives a claim back (`sending` → `queued`, attempts unchanged) after a
/// failure before anything was sent, so the queue's next delivery tries
/// again instead of ending it `unknown`. Best effort: conditioned on our
/// claim (a claim write that did not land changes nothing).
async fn unclaim(store: &dyn Store, id: &SmsId, claim: &str) {
    let released = store
        .update(
            &SmsReminder::key(id),
            Changes::<SmsReminder>::new()
                .set(SmsReminder::STATUS, &SmsStatus::Queued)
                .remove(SmsReminder::LEASE_UNTIL_MS)
                .remove(SmsReminder::CLAIM)
                .into(),
            Some(held_by(claim)),
        )
        .await;
    match released {
        Ok(_) => {}
        Err(e) if e.is_condition_failure() => {}
        Err(e) => {
            tracing::warn!(sms_id = %id, error = %e, "could not give an SMS claim back; it ends unknown after its lease")
        }
    }
}

/// Claims, sends and records one reminder (see the module docs).
pub(super) async fn dispatch(
    state: &Deps,
    client: &SmsClient,
    sms_id: &SmsId,
    lease: Duration,
) -> Result<DispatchOutcome, DispatchError> {
    let store = &*state.store;
    let Some(r) = get(store, sms_id).await? else {
        let sms_id = sms_id.as_str();
        tracing::warn!(sms_id, "message for an unknown SMS reminder dropped");
        return Ok(DispatchOutcome::Skipped);
    };
    let now_ms = state.clock.now().unix_millis();
    if r.mode != Mode::Live {
        return Ok(DispatchOutcome::Skipped);
    }
    match r.status {
        SmsStatus::Queued => {}
        SmsStatus::Sending => {
            let Some(held) = r.lease_until_ms.filter(|t| *t >= now_ms) else {
                // Its dispatcher stopped while it was claimed: the message
                // may have gone out. Not sent again; ended `unknown`.
                return abandon(state, &r).await;
            };
            tracing::debug!(sms_id = %sms_id, held, "SMS reminder claimed by another worker");
            return Ok(DispatchOutcome::Skipped);
        }
        _ => return Ok(DispatchOutcome::Skipped),
    }
    let Some(claim) = claim(store, &r, lease, now_ms).await? else {
        return Ok(DispatchOutcome::Skipped);
    };
    if let Some(ended) = cancel_when_not_payable(state, &r, &claim).await? {
        return Ok(ended);
    }
    send_and_record(state, client, &r, &claim).await
}

/// Claims the queued reminder `r` for `lease` from `now_ms` (`queued` →
/// `sending`); answers the claim's id, or `None` when another worker
/// claimed or ended it first.
pub(super) async fn claim(
    store: &dyn Store,
    r: &SmsReminder,
    lease: Duration,
    now_ms: i64,
) -> Result<Option<String>, DispatchError> {
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
    let lease_until = now_ms + lease_ms;
    // Names this claim alone: two workers may compute the same lease.
    let claim = ulid::Ulid::new().to_string();
    let claimed = store
        .update(
            &SmsReminder::key(&r.id),
            Changes::<SmsReminder>::new()
                .set(SmsReminder::STATUS, &SmsStatus::Sending)
                .set_some(SmsReminder::LEASE_UNTIL_MS, &lease_until)
                .set_some(SmsReminder::CLAIM, claim.as_str())
                .into(),
            Some(Cond::And(vec![
                SmsReminder::ATTEMPTS.eq(&r.attempts),
                SmsReminder::STATUS.eq(&SmsStatus::Queued),
            ])),
        )
        .await;
    match claimed {
        Ok(_) => Ok(Some(claim)),
        Err(e) if e.is_condition_failure() => Ok(None),
        Err(e) => {
            // The claim may have landed: give it back, nothing was sent.
            unclaim(store, &r.id, &claim).await;
            Err(e.into())
        }
    }
}

/// Paid (or expired) since it was queued: nothing to remind. Ends the
/// claimed reminder `cancelled`, nothing sent, and answers what that did;
/// `None` while its session can still be paid. A store error gives the
/// claim back.
pub(super) async fn cancel_when_not_payable(
    state: &Deps,
    r: &SmsReminder,
    claim: &str,
) -> Result<Option<DispatchOutcome>, DispatchError> {
    let store = &*state.store;
    let payable = match still_payable(store, r, state.clock.now()).await {
        Ok(p) => p,
        Err(e) => {
            unclaim(store, &r.id, claim).await;
            return Err(e.into());
        }
    };
    let Some(why) = payable else {
        return Ok(None);
    };
    let now = state.clock.now();
    let ended = finish(
        store,
        r,
        claim,
        SmsStatus::Cancelled,
        r.attempts,
        Some(&why),
        now,
    )
    .await;
    let ended = match ended {
        Ok(ended) => ended,
        Err(e) => {
            unclaim(store, &r.id, claim).await;
            return Err(e.into());
        }
    };
    if ended {
        tracing::info!(sms_id = %r.id, reason = %why, "SMS reminder cancelled, not sent");
        return Ok(Some(DispatchOutcome::Cancelled));
    }
    Ok(Some(DispatchOutcome::Skipped))
}

/// Sends the claimed reminder `r` once and ends its claim with the
/// outcome.
pub(super) async fn send_and_record(
    state: &Deps,
    client: &SmsClient,
    r: &SmsReminder,
    claim: &str,
) -> Result<DispatchOutcome, DispatchError> {
    let sms_id = r.id.as_str();
    let sent = client.send(&r.to, &r.text).await;
    let attempts = r.attempts + 1;
    let (status, error, outcome) = send_outcome(sent, attempts);
    let now = state.clock.now();
    // A store error here leaves the reminder `sending`: after the lease it
    // ends `unknown`, never sent twice.
    if !finish(
        &*state.store,
        r,
        claim,
        status,
        attempts,
        error.as_deref(),
        now,
    )
    .await?
    {
        // Our lease ran out and another worker ended it.
        return Ok(DispatchOutcome::Skipped);
    }
    match &outcome {
        Ok(DispatchOutcome::Sent) => tracing::info!(sms_id, attempts, "SMS reminder sent"),
        Ok(_) => {
            tracing::warn!(sms_id, attempts, status = %word(&status), error = ?error, "SMS reminder not sent")
        }
        Err(_) => {
            tracing::warn!(sms_id, attempts, error = ?error, "SMS send failed; it will be retried")
        }
    }
    outcome
}

/// What the `attempts`-th send's result makes of the reminder: its
/// status, the error it records, and what the message handling answers.
pub(super) fn send_outcome(
    sent: Result<(), SmsSendError>,
    attempts: u32,
) -> (
    SmsStatus,
    Option<String>,
    Result<DispatchOutcome, DispatchError>,
) {
    match sent {
        Ok(()) => (SmsStatus::Sent, None, Ok(DispatchOutcome::Sent)),
        Err(e @ SmsSendError::Rejected { .. }) => (
            SmsStatus::Failed,
            Some(e.to_string()),
            Ok(DispatchOutcome::Failed),
        ),
        Err(SmsSendError::Unknown(why)) => (
            SmsStatus::Unknown,
            Some(format!(
                "the provider may have taken it ({why}); not sent again"
            )),
            Ok(DispatchOutcome::Unknown),
        ),
        Err(SmsSendError::Transient(why)) if attempts >= MAX_ATTEMPTS => (
            SmsStatus::Failed,
            Some(format!("gave up after {attempts} attempts: {why}")),
            Ok(DispatchOutcome::Failed),
        ),
        Err(SmsSendError::Transient(why)) => (
            SmsStatus::Queued,
            Some(why.clone()),
            Err(DispatchError::Transient(why)),
        ),
    }
}

/// Ends a reminder whose dispatcher stopped while sending it: `unknown`,
/// its quota unit kept.
async fn abandon(state: &Deps, r: &SmsReminder) -> Result<DispatchOutcome, DispatchError> {
    let now = state.clock.now();
    let ended = state
        .store
        .update(
            &SmsReminder::key(&r.id),
            Changes::<SmsReminder>::new()
                .set(SmsReminder::STATUS, &SmsStatus::Unknown)
                .set(SmsReminder::UPDATED_AT, &now)
                .set_some(
                    SmsReminder::LAST_ERROR,
                    "a dispatcher stopped while sending it; not sent again",
                )
                .remove(SmsReminder::LEASE_UNTIL_MS)
                .remove(SmsReminder::CLAIM)
                .unindex(Index::Gsi2)
                .into(),
            Some(Cond::And(vec![
                SmsReminder::STATUS.eq(&SmsStatus::Sending),
                SmsReminder::ATTEMPTS.eq(&r.attempts),
                match r.lease_until_ms {
                    Some(t) => SmsReminder::LEASE_UNTIL_MS.is(&t),
                    None => SmsReminder::LEASE_UNTIL_MS.missing(),
                },
            ])),
        )
        .await;
    match ended {
        Ok(_) => {
            tracing::warn!(sms_id = %r.id, "SMS reminder abandoned mid-send ended unknown; not sent again");
            Ok(DispatchOutcome::Unknown)
        }
        Err(e) if e.is_condition_failure() => Ok(DispatchOutcome::Skipped),
        Err(e) => Err(e.into()),
    }
}
