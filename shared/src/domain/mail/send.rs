//! `send_billing_mail`: render, store once per occurrence, queue.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::feedback::is_suppressed;
use super::message::{KEPT_DAYS, MailAbout, MailMessage, MailStatus, get};
use super::{MAX_OCCURRENCE, MailError, invalid, normalize_address};
use crate::Deps;
use crate::domain::billing::reminders::{Locale, ReminderKind, ReminderText, render};
use crate::domain::record::Record;
use crate::domain::{Mode, Tenant};
use crate::ids::{MailId, ProjectId};
use crate::queue::QueueName;
use crate::store::{Key, StoreError, TxReason};

/// The queue message: the message to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailQueueMessage {
    pub mail_id: MailId,
}

/// A rendered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedMail {
    pub subject: String,
    pub text: String,
    pub html: String,
}

/// The occurrence a caller names (a reminder of one invoice on one day, a
/// dunning step): one message each, at
/// `MAILOCC#<project>#<mode>#<sha256 of the key>` / `OCC`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MailOccurrence {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub mail_id: MailId,
    pub occurrence: String,
    pub ttl: i64,
}

crate::attrs! { MailOccurrence {
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    MAIL_ID: MailId = mail_id,
    OCCURRENCE: String = occurrence,
    TTL: i64 = ttl,
} }

impl MailOccurrence {
    pub fn key(tenant: &Tenant, occurrence: &str) -> Key {
        let digest = hex::encode(Sha256::digest(occurrence.as_bytes()));
        Key::new(
            format!(
                "MAILOCC#{}#{}#{digest}",
                tenant.project,
                tenant.mode.as_str()
            ),
            "OCC",
        )
    }
}

impl Record for MailOccurrence {
    fn item_key(&self) -> Key {
        MailOccurrence::key(
            &Tenant::new(self.project_id.clone(), self.mode),
            &self.occurrence,
        )
    }
}

fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn subject(t: &ReminderText<'_>) -> String {
    let m = t.merchant.trim();
    let inv = t.invoice_number;
    match (t.locale, t.kind) {
        (Locale::En, ReminderKind::BeforeDue) => format!("{m}: invoice {inv} is due soon"),
        (Locale::En, ReminderKind::DueToday) => format!("{m}: invoice {inv} is due today"),
        (Locale::En, ReminderKind::Overdue) => format!("{m}: invoice {inv} is overdue"),
        (Locale::En, ReminderKind::TrialEnding) => format!("{m}: your trial ends soon"),
        (Locale::En, ReminderKind::Dunning) => format!("{m}: payment for invoice {inv} failed"),
        (Locale::Ne, ReminderKind::BeforeDue) => format!("{m}: बिल {inv} तिर्ने मिति नजिकियो"),
        (Locale::Ne, ReminderKind::DueToday) => format!("{m}: बिल {inv} आज तिर्नुपर्छ"),
        (Locale::Ne, ReminderKind::Overdue) => format!("{m}: बिल {inv} को म्याद नाघ्यो"),
        (Locale::Ne, ReminderKind::TrialEnding) => format!("{m}: तपाईंको परीक्षण सकिँदैछ"),
        (Locale::Ne, ReminderKind::Dunning) => format!("{m}: बिल {inv} को भुक्तानी असफल"),
    }
}

/// The email of a billing reminder: the reminder's text (its AD date with
/// the BS Miti) as the body, the pay link as a link; `None` when the due
/// date is outside the Bikram Sambat years covered.
pub fn render_billing_mail(t: &ReminderText<'_>) -> Option<RenderedMail> {
    let line = render(t)?;
    let sign = format!("— {}", t.merchant.trim());
    let text = format!("{line}\n\n{sign}\n");
    let url = escape_html(t.pay_url);
    let body = escape_html(&line).replace(&url, &format!("<a href=\"{url}\">{url}</a>"));
    let lang = match t.locale {
        Locale::En => "en",
        Locale::Ne => "ne",
    };
    let html = format!(
        "<!doctype html><html lang=\"{lang}\"><body><p>{body}</p><p>{}</p></body></html>",
        escape_html(&sign)
    );
    Some(RenderedMail {
        subject: subject(t),
        text,
        html,
    })
}

/// Stores and queues one billing reminder email to `recipient` for the
/// occurrence `occurrence` (the caller's key: a retried sweep gives the
/// same one and gets the first message's id, nothing stored or sent
/// again). An address the project suppressed is stored `suppressed`,
/// never queued.
pub async fn send_billing_mail(
    deps: &Deps,
    tenant: &Tenant,
    recipient: &str,
    template: &ReminderText<'_>,
    about: MailAbout,
    occurrence: &str,
) -> Result<MailId, MailError> {
    let to = normalize_address(recipient)
        .ok_or_else(|| invalid("recipient", "recipient must be an email address"))?;
    if occurrence.trim().is_empty() || occurrence.len() > MAX_OCCURRENCE {
        return Err(invalid(
            "occurrence",
            format!("occurrence must be 1 to {MAX_OCCURRENCE} bytes"),
        ));
    }
    let rendered = render_billing_mail(template).ok_or_else(|| {
        invalid(
            "due",
            "the due date is outside the Bikram Sambat years covered",
        )
    })?;
    let store = &*deps.store;
    let occ_key = MailOccurrence::key(tenant, occurrence);
    if let Some(id) = existing(deps, &occ_key).await? {
        return Ok(id);
    }
    let now = deps.clock.now();
    let suppressed = is_suppressed(store, &tenant.project, &to).await?;
    let (invoice_id, subscription_id) = match about {
        MailAbout::BillingInvoice(id) => (Some(id), None),
        MailAbout::Subscription(id) => (None, Some(id)),
    };
    let message = MailMessage {
        id: MailId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        to,
        subject: rendered.subject,
        text: rendered.text,
        html: rendered.html,
        kind: template.kind.as_str().to_owned(),
        invoice_id,
        subscription_id,
        status: if suppressed {
            MailStatus::Suppressed
        } else {
            MailStatus::Queued
        },
        attempts: 0,
        lease_until_ms: None,
        last_error: suppressed.then(|| "the address is suppressed for this project".to_owned()),
        provider_message_id: None,
        created_at: now,
        updated_at: now,
        claim: None,
        ttl: Some(now.unix_seconds() + KEPT_DAYS * 86_400),
    };
    let occ = MailOccurrence {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        mail_id: message.id.clone(),
        occurrence: occurrence.to_owned(),
        ttl: now.unix_seconds() + KEPT_DAYS * 86_400,
    };
    let written = store
        .transact(vec![message.put_new()?, occ.put_new()?])
        .await;
    match written {
        Ok(()) => {}
        Err(StoreError::TransactionCanceled { reasons })
            if matches!(reasons.get(1), Some(TxReason::ConditionFailed)) =>
        {
            // Another run of the same occurrence stored its message first.
            if let Some(id) = existing(deps, &occ_key).await? {
                return Ok(id);
            }
            return Err(StoreError::ConditionFailed.into());
        }
        Err(e) => return Err(e.into()),
    }
    if message.status == MailStatus::Queued {
        enqueue(deps, &message.id).await?;
    } else {
        tracing::info!(mail_id = %message.id, "billing mail to a suppressed address stored, not queued");
    }
    Ok(message.id)
}

/// The message already stored for the occurrence at `key`, if any; a
/// still-queued one is queued again (its first message may have been
/// lost; a duplicate is dropped by the dispatcher's claim).
async fn existing(deps: &Deps, key: &Key) -> Result<Option<MailId>, MailError> {
    let Some(occ) = crate::domain::record::get::<MailOccurrence>(&*deps.store, key).await? else {
        return Ok(None);
    };
    if let Some(m) = get(&*deps.store, &occ.mail_id).await?
        && m.status == MailStatus::Queued
    {
        enqueue(deps, &m.id).await?;
    }
    Ok(Some(occ.mail_id))
}

/// Puts the message's id on the mail queue. An error is returned (the
/// caller's sweep retries with the same occurrence, which queues it
/// again).
pub(super) async fn enqueue(deps: &Deps, id: &MailId) -> Result<(), MailError> {
    let body = serde_json::to_string(&MailQueueMessage {
        mail_id: id.clone(),
    })
    .map_err(|e| StoreError::Backend(format!("mail queue message: {e}")))?;
    deps.queue
        .send(QueueName::Mail, &body, Duration::ZERO)
        .await?;
    tracing::debug!(mail_id = %id, "billing mail queued");
    Ok(())
}
