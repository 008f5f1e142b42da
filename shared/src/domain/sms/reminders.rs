//! The reminder record, its open-reminder index and the recent log.

use serde::{Deserialize, Serialize};

use super::notify::enqueue;
use crate::domain::record::{Changes, Entry, Gsi2Entry, Record, from_item};
use crate::domain::{Mode, Tenant, Window};
use crate::ids::{BillingInvoiceId, MerchantId, ProjectId, SessionId, SmsId};
use crate::store::{Cond, Index, Key, Query, Store, StoreError};
use crate::time::Timestamp;
use crate::{Deps, keys};

/// Status of a stored reminder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmsStatus {
    /// Sandbox: logged, never delivered.
    Logged,
    /// Waiting for the dispatcher.
    Queued,
    /// Claimed by a dispatcher (see `lease_until_ms`).
    Sending,
    /// Accepted by the provider.
    Sent,
    /// Certainly not sent: refused by the provider, or out of attempts.
    /// Its quota unit is given back.
    Failed,
    /// Not sent: its checkout session was paid, expired or cancelled
    /// before the dispatcher got to it. Its quota unit is given back.
    Cancelled,
    /// Maybe sent: the provider was reached and no clear answer came back,
    /// or a dispatcher stopped while sending. Never sent again (the
    /// customer must not get it twice); its quota unit is kept.
    Unknown,
}

impl SmsStatus {
    /// Nothing more happens to it.
    pub fn is_final(self) -> bool {
        !matches!(self, SmsStatus::Queued | SmsStatus::Sending)
    }
}

/// One reminder, stored at `SMS#<id>` / `SMS`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmsReminder {
    pub id: SmsId,
    pub project_id: ProjectId,
    pub merchant_id: MerchantId,
    pub mode: Mode,
    pub to: String,
    pub text: String,
    /// The checkout session the reminder is about (guard 1's match): the
    /// dispatcher sends nothing once it is no longer payable.
    #[serde(default)]
    pub session_id: Option<SessionId>,
    /// The billing invoice a billing reminder is about (none for a
    /// checkout reminder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invoice_id: Option<BillingInvoiceId>,
    pub status: SmsStatus,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub lease_until_ms: Option<i64>,
    #[serde(default)]
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The claim in flight while `sending` (a random id written with the
    /// lease): every write of the claim holder is conditioned on it. Set
    /// and removed by updates only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// Epoch seconds after which the table's TTL expires it (kept
    /// [`KEPT_DAYS`] for support).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
    /// Its entry among the open reminders (while a live reminder waits to
    /// be sent: the backstop sweep's queue, by when it was queued or last
    /// swept): `gsi2pk`, then `gsi2sk` (see [`Gsi2Entry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsi2pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsi2sk: Option<String>,
    /// Counted in its project's list counters (`listing::counted`): set
    /// at creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
}

/// How long a reminder is kept for support before the table's TTL
/// expires it.
pub(super) const KEPT_DAYS: i64 = 90;

crate::attrs! { SmsReminder {
    ID: SmsId = id,
    PROJECT_ID: ProjectId = project_id,
    MERCHANT_ID: MerchantId = merchant_id,
    MODE: Mode = mode,
    TO: String = to,
    TEXT: String = text,
    SESSION_ID: Option<SessionId> = session_id,
    INVOICE_ID: Option<BillingInvoiceId> = invoice_id,
    STATUS: SmsStatus = status,
    ATTEMPTS: u32 = attempts,
    LEASE_UNTIL_MS: Option<i64> = lease_until_ms,
    LAST_ERROR: Option<String> = last_error,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    CLAIM: Option<String> = claim,
    TTL: Option<i64> = ttl,
    COUNTED: bool = counted,
} }

crate::domain::listing::counted::counted_per_tenant!(
    SmsReminder,
    crate::domain::listing::counted::CountedKind::Sms,
    SmsReminder::list_partition
);

impl SmsReminder {
    pub fn key(id: &SmsId) -> Key {
        keys::record(keys::Record::Sms, id)
    }

    fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Sms)
    }

    /// Lists it among the open reminders from `at` (a new reminder: when
    /// it was created).
    pub(super) fn list_open(&mut self, at: Timestamp) {
        let entry = open_entry(&self.id, at);
        self.gsi2pk = Some(entry.partition);
        self.gsi2sk = Some(entry.sort);
    }
}

impl Record for SmsReminder {
    fn item_key(&self) -> Key {
        SmsReminder::key(&self.id)
    }

    /// `gsi1`: the project's reminders, by time-ordered id (its
    /// open-reminders entry is its `gsi2` fields).
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            SmsReminder::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.clone(),
        )]
    }
}

/// Shards of the open-reminders index.
const OPEN_SHARDS: u32 = 4;

pub(super) fn open_partition(id: &SmsId) -> String {
    keys::open(keys::Open::Sms, keys::shard_of(id, OPEN_SHARDS))
}

/// The open-reminders entry of reminder `id` from `at`.
fn open_entry(id: &SmsId, at: Timestamp) -> Gsi2Entry {
    Gsi2Entry::new(
        open_partition(id),
        format!("{:015}#{id}", at.unix_millis().max(0)),
    )
}

/// How long a waiting reminder may go unsent before the sweep queues it
/// again (its message was lost: a crash between the record and the queue,
/// an ambiguous write, a message given up to the dead-letter queue).
const STUCK_AFTER: chrono::Duration = chrono::Duration::minutes(5);

/// Queues again every live reminder still waiting [`STUCK_AFTER`] after it
/// was queued (or last swept), at most `limit` per shard; moves each one
/// forward in the index first, so the next sweep looks further and does
/// not queue it every run. A duplicate message is harmless (the claim lets
/// one send through). Answers how many were queued.
pub async fn requeue_stuck(
    state: &Deps,
    now: Timestamp,
    limit: usize,
) -> Result<usize, StoreError> {
    let store = &*state.store;
    let before = format!("{:015}", now.plus(-STUCK_AFTER).unix_millis().max(0));
    let mut queued = 0;
    for shard in 0..OPEN_SHARDS {
        let query = Query::partition(keys::open(keys::Open::Sms, shard))
            .on(Index::Gsi2)
            .sk(crate::store::SkCond::Lt(before.clone()))
            .limit(limit);
        for item in store.query(&query).await?.items {
            let Some(r) =
                crate::domain::outbox::readable::<SmsReminder>(store, item, "SMS reminder", now)
                    .await
            else {
                continue;
            };
            let key = SmsReminder::key(&r.id);
            let waiting = match r.status {
                SmsStatus::Queued => true,
                SmsStatus::Sending => r.lease_until_ms.is_none_or(|t| t < now.unix_millis()),
                _ => false,
            };
            let changes = if waiting {
                Changes::<SmsReminder>::new().index_sort(open_entry(&r.id, now).sort)
            } else if matches!(r.status, SmsStatus::Sending) {
                continue;
            } else {
                // Final but still listed: take it out.
                Changes::new().unindex(Index::Gsi2)
            };
            let moved = store
                .update(
                    &key,
                    changes.into(),
                    Some(Cond::And(vec![
                        SmsReminder::STATUS.eq(&r.status),
                        SmsReminder::ATTEMPTS.eq(&r.attempts),
                    ])),
                )
                .await;
            match moved {
                Ok(_) => {}
                Err(e) if e.is_condition_failure() => continue,
                Err(e) => return Err(e),
            }
            if waiting && enqueue(state, &r.id).await {
                queued += 1;
                tracing::warn!(sms_id = %r.id, attempts = r.attempts, "stuck SMS reminder queued again");
            }
        }
    }
    Ok(queued)
}

/// A page of the project's reminders in `mode`, newest first, and the
/// total (the dashboard's SMS log).
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    window: Window,
) -> Result<(Vec<SmsReminder>, u64), StoreError> {
    let store = &*deps.store;
    let covered = crate::domain::listing::counted::covered(
        store,
        tenant,
        crate::domain::listing::counted::CountedKind::Sms,
    )
    .await?;
    // Reminders expire by TTL after KEPT_DAYS: the list keeps to them (a
    // counter never counts what the TTL deleted). Ids are minted on the
    // wall clock, `created_at` on the service's: the earlier of the two.
    let now = deps
        .clock
        .now()
        .unix_millis()
        .min(crate::time::Clock::now(&crate::time::SystemClock).unix_millis());
    let list = SmsReminder::counted_list_of(tenant).since(now - KEPT_DAYS * 86_400_000);
    let (reminders, total, _) =
        crate::domain::listing::counted::page(store, &list, &window, covered).await?;
    Ok((reminders, total))
}

/// The project's latest reminders in `mode`, newest first (support and
/// tests; index reads are eventually consistent).
pub async fn list_recent(
    store: &dyn Store,
    tenant: &Tenant,
    limit: usize,
) -> Result<Vec<SmsReminder>, StoreError> {
    let query = Query::partition(SmsReminder::list_partition(tenant))
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
