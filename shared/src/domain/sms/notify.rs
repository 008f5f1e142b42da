//! `notify`: the guards, then the reminder and its queue message.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::guards::{Places, SessionMatch, Taken, pending_session, session_in_url, take_places};
use super::reminders::{KEPT_DAYS, SmsReminder, SmsStatus};
use super::request::{message_text, url_host, validate};
use super::{Limits, NotifyOutcome, NotifyRequest, SmsError, ValidNotify};
use crate::Deps;
use crate::domain::Mode;
use crate::domain::account::Principal;
use crate::domain::record::Record;
use crate::ids::{SessionId, SmsId};
use crate::queue::QueueName;
use crate::store::fence::Fence;
use crate::store::{Store, StoreError};
use crate::time::Timestamp;

/// The queue message: the reminder to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsMessage {
    pub sms_id: SmsId,
}

/// The last digits of a number, for logs.
fn masked(phone: &str) -> String {
    let tail: String = phone
        .chars()
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("*******{tail}")
}

/// The whole request: validation, guards 1-4, then log (sandbox) or
/// store and queue (live). `checkout_base` is the project's public base
/// URL ([`crate::Config::base_for`]).
pub async fn notify(
    state: &Deps,
    who: &Principal,
    req: NotifyRequest,
    checkout_base: &str,
    limits: Limits,
    fence: Option<&Fence>,
) -> Result<NotifyOutcome, SmsError> {
    let v = validate(req)?;
    let store = &*state.store;
    let now = state.clock.now();
    let mode = who.mode();
    let session_id = recipient_session(store, who, &v, checkout_base, now).await?;
    check_checkout_host(&v, checkout_base)?;
    // 3 and 4, with the record: one transaction.
    let reminder = new_reminder(who, &v, session_id, now);
    let live = mode == Mode::Live;
    let places = Places {
        merchant_id: &reminder.merchant_id,
        mode,
        phone: &v.phone,
        now,
        quota: live.then(|| who.merchant.plan.sms_monthly_quota()),
        limits,
    };
    let mut record = vec![reminder.put_new()?];
    record.extend(reminder.count_new());
    let taken = take_places(store, places, record, fence.map(|f| f.op(&reminder.id))).await;
    // The first run's reminder, when already read.
    let (taken, first_run) = match (taken, fence) {
        // The recipient's window is full, perhaps with this request's own
        // first run (its answer lost): that run's reminder answers.
        (Err(e @ SmsError::RateLimited { .. }), Some(f)) => match f.resource_id(store).await? {
            Some(id) => (Taken::AlreadyStored, Some(SmsId::stored(id))),
            None => return Err(e),
        },
        (taken, _) => (taken?, None),
    };
    match taken {
        Taken::All => {}
        Taken::QuotaExhausted => {
            return Ok(NotifyOutcome {
                sent: false,
                status: "plan_limit_reached",
            });
        }
        Taken::AlreadyStored => return Ok(answer_first_run(state, live, first_run, fence).await),
    }
    if !live {
        tracing::info!(sms_id = %reminder.id, to = %masked(&reminder.to), project_id = %who.project_id(), "sandbox SMS reminder logged, not delivered");
        return Ok(NotifyOutcome {
            sent: false,
            status: "logged",
        });
    }
    enqueue(state, &reminder.id).await;
    tracing::info!(sms_id = %reminder.id, to = %masked(&reminder.to), project_id = %who.project_id(), "SMS reminder stored");
    Ok(NotifyOutcome {
        sent: true,
        status: "queued",
    })
}

/// Guard 1: a recent pending session for this number (the one the URL
/// names, when it names one of the project's).
async fn recipient_session(
    store: &dyn Store,
    who: &Principal,
    v: &ValidNotify,
    checkout_base: &str,
    now: Timestamp,
) -> Result<SessionId, SmsError> {
    let url_session = session_in_url(&v.checkout_url, checkout_base);
    let found = pending_session(store, who.tenant(), &v.phone, url_session, now).await?;
    match found {
        SessionMatch::Found(id) => Ok(id),
        SessionMatch::NotFound => Err(SmsError::PhoneNotOnSession),
        SessionMatch::ForeignUrl(id) => Err(SmsError::ForeignCheckoutSession { given: id }),
    }
}

/// Guard 2: the checkout host (no verified custom domains exist yet).
fn check_checkout_host(v: &ValidNotify, checkout_base: &str) -> Result<(), SmsError> {
    let allowed = url_host(checkout_base).unwrap_or_default();
    if allowed.is_empty() || v.checkout_host != allowed {
        return Err(SmsError::InvalidCheckoutHost { allowed });
    }
    Ok(())
}

/// The reminder as the request stores it: `queued` live (listed among the
/// open reminders), `logged` in sandbox, bound to its session, kept
/// [`KEPT_DAYS`].
fn new_reminder(
    who: &Principal,
    v: &ValidNotify,
    session_id: SessionId,
    now: Timestamp,
) -> SmsReminder {
    let mode = who.mode();
    let mut reminder = SmsReminder {
        id: SmsId::new(),
        project_id: who.tenant().project.clone(),
        merchant_id: who.merchant.id.clone(),
        mode,
        to: v.phone.clone(),
        text: message_text(v),
        session_id: Some(session_id),
        invoice_id: None,
        status: if mode == Mode::Live {
            SmsStatus::Queued
        } else {
            SmsStatus::Logged
        },
        attempts: 0,
        lease_until_ms: None,
        last_error: None,
        created_at: now,
        updated_at: now,
        claim: None,
        ttl: Some(now.unix_seconds() + KEPT_DAYS * 86_400),
        gsi2pk: None,
        gsi2sk: None,
        counted: true,
    };
    if mode == Mode::Live {
        // Waits for the dispatcher: the backstop sweep watches it.
        reminder.list_open(now);
    }
    reminder
}

/// A retry of a request whose answer was lost: the first run's reminder
/// stands and is answered as the first run was. Its queue message may
/// never have been sent (the first run stopped at the store's answer):
/// queued again now rather than wait for the sweep; a duplicate message
/// is dropped by the claim.
async fn answer_first_run(
    state: &Deps,
    live: bool,
    first_run: Option<SmsId>,
    fence: Option<&Fence>,
) -> NotifyOutcome {
    if live {
        let first_run = match (first_run, fence) {
            (Some(id), _) => Some(id),
            (None, Some(f)) => match f.resource_id(&*state.store).await {
                Ok(id) => id.map(SmsId::stored),
                Err(e) => {
                    tracing::warn!(error = %e, "first reminder of a retried request not read; the sweep queues it");
                    None
                }
            },
            (None, None) => None,
        };
        if let Some(id) = first_run {
            enqueue(state, &id).await;
        }
    }
    NotifyOutcome {
        sent: live,
        status: if live { "queued" } else { "logged" },
    }
}

/// Queues a stored live reminder for the dispatcher; answers whether it
/// was queued. A failure is logged, not returned: the reminder is stored
/// and counted, and the backstop sweep queues it within minutes (a late
/// reminder, not a lost one); ending it here instead could race a message
/// that did reach the queue.
pub(super) async fn enqueue(state: &Deps, sms_id: &SmsId) -> bool {
    let sms_id = sms_id.as_str();
    let body = match serde_json::to_string(&SmsMessage {
        sms_id: SmsId::stored(sms_id),
    }) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(sms_id, error = %e, "SMS message not encoded; the sweep queues it");
            return false;
        }
    };
    match state
        .queue
        .send(QueueName::Sms, &body, Duration::ZERO)
        .await
    {
        Ok(_) => {
            tracing::debug!(sms_id, "SMS reminder queued");
            true
        }
        Err(e) => {
            tracing::warn!(sms_id, error = %e, "SMS reminder not queued; the backstop sweep will queue it");
            false
        }
    }
}

pub async fn get(store: &dyn Store, id: &SmsId) -> Result<Option<SmsReminder>, StoreError> {
    crate::domain::record::get(store, &SmsReminder::key(id)).await
}
