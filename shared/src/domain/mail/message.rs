//! The stored message and its per-project log.

use serde::{Deserialize, Serialize};

use crate::domain::record::{Entry, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, MailId, ProjectId, SubscriptionId};
use crate::store::{Index, Key, Query, Store, StoreError};
use crate::time::Timestamp;

/// Status of a stored message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MailStatus {
    /// Waiting for the dispatcher.
    Queued,
    /// Claimed by a dispatcher (see `lease_until_ms`).
    Sending,
    /// Accepted by the mail service.
    Sent,
    /// Certainly not sent: refused, or out of attempts.
    Failed,
    /// Maybe sent (no clear answer, or a dispatcher stopped mid-send):
    /// never sent again.
    Unknown,
    /// Not sent: the address is on the project's suppression list (a
    /// bounce or complaint), or sandbox mail to an address the project has
    /// not verified.
    Suppressed,
}

impl MailStatus {
    /// Nothing more happens to it.
    pub fn is_final(self) -> bool {
        !matches!(self, MailStatus::Queued | MailStatus::Sending)
    }
}

/// What a message is about: a billing invoice or a subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MailAbout {
    BillingInvoice(BillingInvoiceId),
    Subscription(SubscriptionId),
}

/// One message, stored at `MAIL#<id>` / `MAIL`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MailMessage {
    pub id: MailId,
    pub project_id: ProjectId,
    pub mode: Mode,
    /// Normalized (lowercase).
    pub to: String,
    pub subject: String,
    pub text: String,
    pub html: String,
    /// The template (`before_due`, `due_today`, `overdue`,
    /// `trial_ending`, `dunning`).
    pub kind: String,
    #[serde(default)]
    pub invoice_id: Option<BillingInvoiceId>,
    #[serde(default)]
    pub subscription_id: Option<SubscriptionId>,
    pub status: MailStatus,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub lease_until_ms: Option<i64>,
    #[serde(default)]
    pub last_error: Option<String>,
    /// The mail service's id of the sent message.
    #[serde(default)]
    pub provider_message_id: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The claim in flight while `sending`; set and removed by updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// Epoch seconds after which the table's TTL expires it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
}

crate::attrs! { MailMessage {
    ID: MailId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    TO: String = to,
    SUBJECT: String = subject,
    TEXT: String = text,
    HTML: String = html,
    KIND: String = kind,
    INVOICE_ID: Option<BillingInvoiceId> = invoice_id,
    SUBSCRIPTION_ID: Option<SubscriptionId> = subscription_id,
    STATUS: MailStatus = status,
    ATTEMPTS: u32 = attempts,
    LEASE_UNTIL_MS: Option<i64> = lease_until_ms,
    LAST_ERROR: Option<String> = last_error,
    PROVIDER_MESSAGE_ID: Option<String> = provider_message_id,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    CLAIM: Option<String> = claim,
    TTL: Option<i64> = ttl,
} }

/// How long a message is kept for support before the TTL expires it.
pub(super) const KEPT_DAYS: i64 = 90;

impl MailMessage {
    pub fn key(id: &MailId) -> Key {
        Key::new(format!("MAIL#{id}"), "MAIL")
    }

    fn list_partition(tenant: &Tenant) -> String {
        format!("PROJ#{}#{}#MAIL", tenant.project, tenant.mode.as_str())
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }
}

impl Record for MailMessage {
    fn item_key(&self) -> Key {
        MailMessage::key(&self.id)
    }

    /// `gsi1`: the project's messages in its mode, by time-ordered id.
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            MailMessage::list_partition(&self.tenant()),
            self.id.clone(),
        )]
    }
}

pub async fn get(store: &dyn Store, id: &MailId) -> Result<Option<MailMessage>, StoreError> {
    crate::domain::record::get(store, &MailMessage::key(id)).await
}

/// The project's latest messages in its mode, newest first (the
/// dashboard's log, support and tests; index reads are eventually
/// consistent).
pub async fn list_recent(
    store: &dyn Store,
    tenant: &Tenant,
    limit: usize,
) -> Result<Vec<MailMessage>, StoreError> {
    let query = Query::partition(MailMessage::list_partition(tenant))
        .on(Index::Gsi1)
        .backward()
        .limit(limit.clamp(1, 100));
    store
        .query(&query)
        .await?
        .items
        .into_iter()
        .map(from_item)
        .collect()
}
