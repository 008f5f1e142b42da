//! The mail worker: claim a message, check the lists, send it once and
//! record the outcome; or take an SES notification.

use std::time::Duration;

use serde_json::Value;

use super::feedback::{FeedbackOutcome, handle_feedback, is_feedback, is_suppressed, is_verified};
use super::message::{MailMessage, MailStatus, get};
use super::send::MailQueueMessage;
use super::{LEASE, MAX_ATTEMPTS};
use crate::Deps;
use crate::domain::Mode;
use crate::domain::record::{Changes, word};
use crate::ids::MailId;
use crate::providers::mail::{MailSendError, MailSender, OutgoingMail, TAG_MAIL_ID, TAG_PROJECT};
use crate::store::{Cond, Store, StoreError};

/// What handling one queue message did; each lets the message go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchOutcome {
    Sent,
    /// Certainly not sent: refused, or out of attempts.
    Failed,
    /// Not sent: a suppressed (or, in sandbox on SES, unverified) address.
    Suppressed,
    /// Maybe sent; never tried again.
    Unknown,
    /// Final already, claimed by another worker, or not ours.
    Skipped,
    /// An SES notification, handled.
    Feedback(FeedbackOutcome),
}

/// Why a message must stay on the queue (it comes back and is retried).
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("mail service unavailable: {0}")]
    Transient(String),
}

/// One queue message body: a message to send, or an SES notification;
/// malformed bodies are dropped (logged).
pub async fn handle_message(
    deps: &Deps,
    sender: &MailSender,
    body: &str,
) -> Result<DispatchOutcome, DispatchError> {
    let Ok(value) = serde_json::from_str::<Value>(body) else {
        tracing::warn!("malformed mail queue message dropped");
        return Ok(DispatchOutcome::Skipped);
    };
    if is_feedback(&value) {
        return Ok(DispatchOutcome::Feedback(
            handle_feedback(deps, &value).await?,
        ));
    }
    match serde_json::from_value::<MailQueueMessage>(value) {
        Ok(msg) => dispatch(deps, sender, &msg.mail_id, LEASE).await,
        Err(e) => {
            tracing::warn!(error = %e, "malformed mail queue message dropped");
            Ok(DispatchOutcome::Skipped)
        }
    }
}

/// Claims, checks, sends and records one message.
pub(super) async fn dispatch(
    deps: &Deps,
    sender: &MailSender,
    id: &MailId,
    lease: Duration,
) -> Result<DispatchOutcome, DispatchError> {
    let store = &*deps.store;
    let Some(m) = get(store, id).await? else {
        tracing::warn!(mail_id = %id, "message for an unknown mail dropped");
        return Ok(DispatchOutcome::Skipped);
    };
    let now_ms = deps.clock.now().unix_millis();
    match m.status {
        MailStatus::Queued => {}
        MailStatus::Sending => {
            if m.lease_until_ms.is_some_and(|t| t >= now_ms) {
                return Ok(DispatchOutcome::Skipped);
            }
            // Its dispatcher stopped while it was claimed: it may have
            // gone out. Not sent again.
            return abandon(deps, &m).await;
        }
        _ => return Ok(DispatchOutcome::Skipped),
    }
    let Some(claim) = claim(store, &m, lease, now_ms).await? else {
        return Ok(DispatchOutcome::Skipped);
    };
    let blocked = match blocked(store, sender, &m).await {
        Ok(b) => b,
        Err(e) => {
            unclaim(store, &m.id, &claim).await;
            return Err(e.into());
        }
    };
    if let Some(why) = blocked {
        let ended = finish(
            deps,
            &m,
            &claim,
            MailStatus::Suppressed,
            m.attempts,
            Some(why),
            None,
        )
        .await;
        return match ended {
            Ok(true) => {
                tracing::info!(mail_id = %m.id, reason = why, "mail not sent");
                Ok(DispatchOutcome::Suppressed)
            }
            Ok(false) => Ok(DispatchOutcome::Skipped),
            Err(e) => {
                unclaim(store, &m.id, &claim).await;
                Err(e.into())
            }
        };
    }
    send_and_record(deps, sender, &m, &claim).await
}

/// Why the message must not go out, if it must not.
async fn blocked(
    store: &dyn Store,
    sender: &MailSender,
    m: &MailMessage,
) -> Result<Option<&'static str>, StoreError> {
    if is_suppressed(store, &m.project_id, &m.to).await? {
        return Ok(Some("the address is suppressed for this project"));
    }
    if m.mode == Mode::Sandbox
        && sender.sandbox_needs_verified()
        && !is_verified(store, &m.project_id, &m.to).await?
    {
        return Ok(Some(
            "sandbox mail goes only to addresses verified for the project",
        ));
    }
    Ok(None)
}

/// Still `sending` under `claim`.
fn held_by(claim: &str) -> Cond {
    Cond::And(vec![
        MailMessage::STATUS.eq(&MailStatus::Sending),
        MailMessage::CLAIM.is(claim),
    ])
}

/// `queued` → `sending` with a lease; `None` when another worker got it.
pub(super) async fn claim(
    store: &dyn Store,
    m: &MailMessage,
    lease: Duration,
    now_ms: i64,
) -> Result<Option<String>, DispatchError> {
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
    let claim = ulid::Ulid::new().to_string();
    let claimed = store
        .update(
            &MailMessage::key(&m.id),
            Changes::<MailMessage>::new()
                .set(MailMessage::STATUS, &MailStatus::Sending)
                .set_some(MailMessage::LEASE_UNTIL_MS, &(now_ms + lease_ms))
                .set_some(MailMessage::CLAIM, claim.as_str())
                .into(),
            Some(Cond::And(vec![
                MailMessage::ATTEMPTS.eq(&m.attempts),
                MailMessage::STATUS.eq(&MailStatus::Queued),
            ])),
        )
        .await;
    match claimed {
        Ok(_) => Ok(Some(claim)),
        Err(e) if e.is_condition_failure() => Ok(None),
        Err(e) => {
            // The claim may have landed: give it back, nothing was sent.
            unclaim(store, &m.id, &claim).await;
            Err(e.into())
        }
    }
}

/// Gives a claim back before anything was sent (best effort).
async fn unclaim(store: &dyn Store, id: &MailId, claim: &str) {
    let released = store
        .update(
            &MailMessage::key(id),
            Changes::<MailMessage>::new()
                .set(MailMessage::STATUS, &MailStatus::Queued)
                .remove(MailMessage::LEASE_UNTIL_MS)
                .remove(MailMessage::CLAIM)
                .into(),
            Some(held_by(claim)),
        )
        .await;
    match released {
        Ok(_) => {}
        Err(e) if e.is_condition_failure() => {}
        Err(e) => {
            tracing::warn!(mail_id = %id, error = %e, "could not give a mail claim back; it ends unknown after its lease")
        }
    }
}

/// Tries of the write that ends a claim.
const FINISH_TRIES: usize = 6;

/// Ends a claimed message with `status`, conditioned on the claim;
/// `Ok(false)`: the claim was lost.
async fn finish(
    deps: &Deps,
    m: &MailMessage,
    claim: &str,
    status: MailStatus,
    attempts: u32,
    error: Option<&str>,
    provider_message_id: Option<&str>,
) -> Result<bool, StoreError> {
    let mut changes = Changes::<MailMessage>::new()
        .set(MailMessage::STATUS, &status)
        .set(MailMessage::ATTEMPTS, &attempts)
        .set(MailMessage::UPDATED_AT, &deps.clock.now())
        .remove(MailMessage::LEASE_UNTIL_MS)
        .remove(MailMessage::CLAIM);
    changes = match error {
        Some(e) => changes.set_some(MailMessage::LAST_ERROR, e),
        None => changes.remove(MailMessage::LAST_ERROR),
    };
    if let Some(p) = provider_message_id {
        changes = changes.set_some(MailMessage::PROVIDER_MESSAGE_ID, p);
    }
    let update: crate::store::Update = changes.into();
    let mut attempt = 0;
    loop {
        let e = match deps
            .store
            .update(
                &MailMessage::key(&m.id),
                update.clone(),
                Some(held_by(claim)),
            )
            .await
        {
            Ok(_) => return Ok(true),
            Err(e) if e.is_condition_failure() => return Ok(false),
            Err(e @ StoreError::Unavailable(_)) => e,
            Err(e) => return Err(e),
        };
        attempt += 1;
        if attempt >= FINISH_TRIES {
            return Err(e);
        }
        crate::store::contention_backoff(attempt).await;
    }
}

/// Sends the claimed message once and records the outcome.
async fn send_and_record(
    deps: &Deps,
    sender: &MailSender,
    m: &MailMessage,
    claim: &str,
) -> Result<DispatchOutcome, DispatchError> {
    let mail = OutgoingMail {
        to: &m.to,
        subject: &m.subject,
        text: &m.text,
        html: &m.html,
        tags: vec![
            (TAG_MAIL_ID, m.id.as_str()),
            (TAG_PROJECT, m.project_id.as_str()),
        ],
    };
    let sent = sender.send(&mail).await;
    let attempts = m.attempts + 1;
    let provider_message_id = sent.as_ref().ok().cloned();
    let (status, error, outcome) = send_outcome(sent.map(|_| ()), attempts);
    // A store error here leaves it `sending`: after the lease it ends
    // `unknown`, never sent twice.
    if !finish(
        deps,
        m,
        claim,
        status,
        attempts,
        error.as_deref(),
        provider_message_id.as_deref().filter(|p| !p.is_empty()),
    )
    .await?
    {
        return Ok(DispatchOutcome::Skipped);
    }
    match &outcome {
        Ok(DispatchOutcome::Sent) => tracing::info!(mail_id = %m.id, attempts, "billing mail sent"),
        _ => {
            tracing::warn!(mail_id = %m.id, attempts, status = %word(&status), error = ?error, "billing mail not sent")
        }
    }
    outcome
}

/// What the `attempts`-th send's result makes of the message.
pub(super) fn send_outcome(
    sent: Result<(), MailSendError>,
    attempts: u32,
) -> (
    MailStatus,
    Option<String>,
    Result<DispatchOutcome, DispatchError>,
) {
    match sent {
        Ok(()) => (MailStatus::Sent, None, Ok(DispatchOutcome::Sent)),
        Err(e @ MailSendError::Rejected(_)) => (
            MailStatus::Failed,
            Some(e.to_string()),
            Ok(DispatchOutcome::Failed),
        ),
        Err(MailSendError::Unknown(why)) => (
            MailStatus::Unknown,
            Some(format!(
                "the mail service may have taken it ({why}); not sent again"
            )),
            Ok(DispatchOutcome::Unknown),
        ),
        Err(MailSendError::Transient(why)) if attempts >= MAX_ATTEMPTS => (
            MailStatus::Failed,
            Some(format!("gave up after {attempts} attempts: {why}")),
            Ok(DispatchOutcome::Failed),
        ),
        Err(MailSendError::Transient(why)) => (
            MailStatus::Queued,
            Some(why.clone()),
            Err(DispatchError::Transient(why)),
        ),
    }
}

/// Ends a message whose dispatcher stopped mid-send: `unknown`.
async fn abandon(deps: &Deps, m: &MailMessage) -> Result<DispatchOutcome, DispatchError> {
    let ended = deps
        .store
        .update(
            &MailMessage::key(&m.id),
            Changes::<MailMessage>::new()
                .set(MailMessage::STATUS, &MailStatus::Unknown)
                .set(MailMessage::UPDATED_AT, &deps.clock.now())
                .set_some(
                    MailMessage::LAST_ERROR,
                    "a dispatcher stopped while sending it; not sent again",
                )
                .remove(MailMessage::LEASE_UNTIL_MS)
                .remove(MailMessage::CLAIM)
                .into(),
            Some(Cond::And(vec![
                MailMessage::STATUS.eq(&MailStatus::Sending),
                MailMessage::ATTEMPTS.eq(&m.attempts),
                match m.lease_until_ms {
                    Some(t) => MailMessage::LEASE_UNTIL_MS.is(&t),
                    None => MailMessage::LEASE_UNTIL_MS.missing(),
                },
            ])),
        )
        .await;
    match ended {
        Ok(_) => {
            tracing::warn!(mail_id = %m.id, "billing mail abandoned mid-send ended unknown; not sent again");
            Ok(DispatchOutcome::Unknown)
        }
        Err(e) if e.is_condition_failure() => Ok(DispatchOutcome::Skipped),
        Err(e) => Err(e.into()),
    }
}
