//! The per-project suppression and verified lists, and SES's bounce and
//! complaint notifications.
//!
//! SES publishes a configuration set's events to an SNS topic; the topic
//! delivers them to the mail queue (an SQS subscription, raw delivery off),
//! so each arrives as an SNS envelope whose `Message` is the SES event
//! JSON. Both shapes SES writes are read: event publishing (`eventType`)
//! and identity notifications (`notificationType`). The project is the
//! one of the message named by the `dhukuti_mail` tag every send carries
//! (`mail.tags`); a notification naming no stored message is dropped.
//! Only a `Permanent` bounce suppresses (a transient one is a full inbox);
//! every complaint does.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::get;
use super::{MailError, invalid, normalize_address};
use crate::Deps;
use crate::domain::record::Record;
use crate::ids::{MailId, ProjectId};
use crate::providers::mail::TAG_MAIL_ID;
use crate::store::{Key, Store, StoreError};
use crate::time::Timestamp;

/// Why an address is suppressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuppressReason {
    Bounce,
    Complaint,
}

/// An address the project never mails again, at
/// `MAILSUP#<project>` / `A#<address>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MailSuppression {
    pub project_id: ProjectId,
    pub address: String,
    pub reason: SuppressReason,
    /// The message whose bounce or complaint suppressed it.
    #[serde(default)]
    pub mail_id: Option<MailId>,
    pub created_at: Timestamp,
}

crate::attrs! { MailSuppression {
    PROJECT_ID: ProjectId = project_id,
    ADDRESS: String = address,
    REASON: SuppressReason = reason,
    MAIL_ID: Option<MailId> = mail_id,
    CREATED_AT: Timestamp = created_at,
} }

impl MailSuppression {
    pub fn key(project: &ProjectId, address: &str) -> Key {
        Key::new(format!("MAILSUP#{project}"), format!("A#{address}"))
    }
}

impl Record for MailSuppression {
    fn item_key(&self) -> Key {
        MailSuppression::key(&self.project_id, &self.address)
    }
}

/// An address verified for the project's sandbox mail, at
/// `MAILVER#<project>` / `A#<address>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MailVerified {
    pub project_id: ProjectId,
    pub address: String,
    pub created_at: Timestamp,
}

crate::attrs! { MailVerified {
    PROJECT_ID: ProjectId = project_id,
    ADDRESS: String = address,
    CREATED_AT: Timestamp = created_at,
} }

impl MailVerified {
    pub fn key(project: &ProjectId, address: &str) -> Key {
        Key::new(format!("MAILVER#{project}"), format!("A#{address}"))
    }
}

impl Record for MailVerified {
    fn item_key(&self) -> Key {
        MailVerified::key(&self.project_id, &self.address)
    }
}

/// Whether the project suppressed `address` (normalized).
pub async fn is_suppressed(
    store: &dyn Store,
    project: &ProjectId,
    address: &str,
) -> Result<bool, StoreError> {
    Ok(store
        .get(&MailSuppression::key(project, address))
        .await?
        .is_some())
}

/// Whether `address` (normalized) is verified for the project.
pub async fn is_verified(
    store: &dyn Store,
    project: &ProjectId,
    address: &str,
) -> Result<bool, StoreError> {
    Ok(store
        .get(&MailVerified::key(project, address))
        .await?
        .is_some())
}

/// Suppresses `address` for the project (idempotent: the first reason
/// stands).
pub async fn suppress(
    deps: &Deps,
    project: &ProjectId,
    address: &str,
    reason: SuppressReason,
    mail_id: Option<MailId>,
) -> Result<(), MailError> {
    let address = normalize_address(address)
        .ok_or_else(|| invalid("address", "address must be an email address"))?;
    let record = MailSuppression {
        project_id: project.clone(),
        address,
        reason,
        mail_id,
        created_at: deps.clock.now(),
    };
    match deps.store.transact(vec![record.put_new()?]).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_condition_failure() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Verifies `address` for the project's sandbox mail (idempotent).
pub async fn verify_address(
    deps: &Deps,
    project: &ProjectId,
    address: &str,
) -> Result<(), MailError> {
    let address = normalize_address(address)
        .ok_or_else(|| invalid("address", "address must be an email address"))?;
    let record = MailVerified {
        project_id: project.clone(),
        address,
        created_at: deps.clock.now(),
    };
    deps.store.put(record.to_item()?, None).await?;
    Ok(())
}

/// What a notification did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeedbackOutcome {
    /// These addresses are now suppressed for the project.
    Suppressed(Vec<String>),
    /// Nothing to do: a transient bounce, a delivery, another event, or a
    /// message not ours.
    Ignored(String),
}

/// The SES event inside an SNS envelope (or bare).
fn ses_event(body: &Value) -> Option<Value> {
    if body.get("Type").and_then(Value::as_str) == Some("Notification") {
        let inner = body.get("Message")?.as_str()?;
        return serde_json::from_str(inner).ok();
    }
    Some(body.clone())
}

/// Whether a queue body is an SES notification (not a message to send).
pub(super) fn is_feedback(body: &Value) -> bool {
    body.get("Type").and_then(Value::as_str) == Some("Notification")
        || body.get("eventType").is_some()
        || body.get("notificationType").is_some()
}

/// The addresses an SES bounce or complaint event suppresses, and why;
/// `Err` says why it suppresses nothing.
fn suppressed_by(event: &Value) -> Result<(SuppressReason, Vec<String>), String> {
    let kind = event
        .get("eventType")
        .or_else(|| event.get("notificationType"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let (reason, list, field) = match kind {
        "Bounce" => {
            let bounce = event.get("bounce").ok_or("a bounce without `bounce`")?;
            let ty = bounce.get("bounceType").and_then(Value::as_str);
            if ty != Some("Permanent") {
                return Err(format!(
                    "a {} bounce suppresses nothing",
                    ty.unwrap_or("unnamed")
                ));
            }
            (SuppressReason::Bounce, bounce, "bouncedRecipients")
        }
        "Complaint" => (
            SuppressReason::Complaint,
            event
                .get("complaint")
                .ok_or("a complaint without `complaint`")?,
            "complainedRecipients",
        ),
        other => return Err(format!("an SES {other:?} event suppresses nothing")),
    };
    let addresses: Vec<String> = list
        .get(field)
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .filter_map(|r| r.get("emailAddress").and_then(Value::as_str))
                .filter_map(normalize_address)
                .collect()
        })
        .unwrap_or_default();
    if addresses.is_empty() {
        return Err("no recipient named".into());
    }
    Ok((reason, addresses))
}

/// The stored message an event is about (its `dhukuti_mail` tag).
fn tagged_mail_id(event: &Value) -> Option<MailId> {
    let tag = event.get("mail")?.get("tags")?.get(TAG_MAIL_ID)?;
    let id = match tag {
        Value::Array(values) => values.first()?.as_str()?,
        Value::String(s) => s.as_str(),
        _ => return None,
    };
    MailId::parse(id)
}

/// Handles one SES notification (an SNS envelope or the bare event).
pub async fn handle_feedback(deps: &Deps, body: &Value) -> Result<FeedbackOutcome, StoreError> {
    let Some(event) = ses_event(body) else {
        return Ok(FeedbackOutcome::Ignored(
            "an SNS envelope without an SES event".into(),
        ));
    };
    let (reason, addresses) = match suppressed_by(&event) {
        Ok(found) => found,
        Err(why) => return Ok(FeedbackOutcome::Ignored(why)),
    };
    let Some(mail_id) = tagged_mail_id(&event) else {
        return Ok(FeedbackOutcome::Ignored(
            "no dhukuti_mail tag: not a message of ours".into(),
        ));
    };
    let Some(message) = get(&*deps.store, &mail_id).await? else {
        return Ok(FeedbackOutcome::Ignored(format!(
            "message {mail_id} is not stored"
        )));
    };
    let mut done = Vec::new();
    for address in addresses {
        match suppress(
            deps,
            &message.project_id,
            &address,
            reason,
            Some(mail_id.clone()),
        )
        .await
        {
            Ok(()) => done.push(address),
            Err(MailError::Store(e)) => return Err(e),
            Err(e) => tracing::warn!(error = %e, "SES notification address not suppressed"),
        }
    }
    tracing::info!(mail_id = %mail_id, project_id = %message.project_id, count = done.len(), ?reason, "mail addresses suppressed");
    Ok(FeedbackOutcome::Suppressed(done))
}
