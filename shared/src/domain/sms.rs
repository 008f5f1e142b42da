//! Pending-payment SMS reminders (spec "SMS", decisions "SMS reminders").
//!
//! `POST /v1/sms/notify-pending-payment` runs [`notify`]: it validates the
//! body, then applies the guards in this order:
//! 1. the recipient (normalized Nepali mobile) has a pending checkout
//!    session on this project and mode created in the last 24 h
//!    ([`has_pending_session`]: the project's sessions on `gsi1`, newest
//!    first, from the id of "24 h ago", in bounded pages);
//! 2. `checkoutUrl`'s host is the project's checkout host (the public base
//!    URL's host). There are no verified custom domains yet, so only the
//!    canonical host is accepted;
//! 3. the abuse limits: at most [`Limits::per_recipient_per_day`] per
//!    recipient per (UTC) day and [`Limits::per_merchant_per_hour`] per
//!    merchant per (UTC) hour, per mode. Both are fixed-window counters
//!    taken together in one transaction of conditional `ADD`s, so
//!    concurrent requests never pass them; a refused request takes nothing;
//! 4. live only: one unit of the merchant's monthly plan quota
//!    ([`Plan::sms_monthly_quota`], UTC calendar month) reserved with a
//!    conditional `ADD`; none left answers `plan_limit_reached`.
//!
//! Sandbox reminders pass guards 1-3 and are stored as `logged`, never
//! queued. Live reminders are stored (`sms_…` at `SMS#<id>` / `SMS`,
//! status `queued`) and their id is queued on [`QueueName::Sms`].
//!
//! The dispatcher ([`dispatch`]) never sends one reminder twice in normal
//! operation: it claims the record with a conditional write (status
//! `queued` → `sending` with a lease, or a `sending` whose lease ran out),
//! sends, then records `sent` / `failed` (or `queued` again after a
//! transient failure) with a write conditioned on its lease. A duplicate
//! queue message finds the record claimed or final and is dropped. The one
//! gap: a crash (or a lease running out) between the provider accepting
//! the message and the `sent` write leaves the record `sending`; after the
//! lease the message comes back and the reminder is sent once more.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Mode;
use super::account::{Plan, Principal};
use super::checkout::{CheckoutSession, SessionStatus};
use super::record::{from_item, to_item};
use crate::AppState;
use crate::ids::{IdKind, new_id};
use crate::providers::sms::{SmsClient, SmsSendError};
use crate::queue::{QueueError, QueueName};
use crate::store::{
    Cond, Index, Key, Query, SkCond, Store, StoreError, TTL, TxOp, TxReason, Update,
};
use crate::time::Timestamp;

/// The abuse limits (decisions: 3 per recipient per 24 h, 100 per merchant
/// per hour).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub per_recipient_per_day: i64,
    pub per_merchant_per_hour: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_recipient_per_day: 3,
            per_merchant_per_hour: 100,
        }
    }
}

/// How long a session counts as "recent" for guard 1.
pub const SESSION_WINDOW_HOURS: i64 = 24;
/// Sessions examined per page, and pages at most, for guard 1.
const SESSION_PAGE: usize = 100;
const SESSION_PAGES: usize = 20;
/// Sends tried before a reminder is given up (the SMS queue's
/// `maxReceiveCount`).
pub const MAX_ATTEMPTS: u32 = 5;
/// How long a claimed reminder stays claimed: past the client's timeout,
/// shorter than the queue's visibility timeout (90 s).
pub const LEASE: Duration = Duration::from_secs(60);

const MAX_TEXT_FIELD: usize = 60;
const MAX_URL: usize = 500;
/// Rs 10 crore: a bound against absurd amounts.
const MAX_AMOUNT_MINOR: i64 = 10_000_000_000;

/// The request body (camelCase, unknown fields refused).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NotifyRequest {
    pub customer_phone: String,
    pub shop_name: String,
    pub order_name: String,
    pub amount_minor: i64,
    pub currency: String,
    pub checkout_url: String,
}

/// A validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidNotify {
    /// 10 digits, `97…` or `98…`.
    pub phone: String,
    pub shop_name: String,
    pub order_name: String,
    pub amount_minor: i64,
    pub checkout_url: String,
    /// `host[:port]` of `checkout_url`, lowercase.
    pub checkout_host: String,
}

/// The answer: `{sent, status}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotifyOutcome {
    pub sent: bool,
    pub status: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum SmsError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("customerPhone has no pending checkout session on this project in the last 24 hours")]
    PhoneNotOnSession,
    #[error("checkoutUrl must be on this project's checkout host ({allowed})")]
    InvalidCheckoutHost { allowed: String },
    #[error("too many SMS reminders: {which}; retry later")]
    RateLimited {
        which: &'static str,
        retry_after_secs: i64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> SmsError {
    SmsError::Invalid {
        field,
        message: message.into(),
    }
}

/// A Nepali mobile number as 10 digits (`97…`/`98…`), from the forms
/// people write: optional `+977` (or `977`) prefix, spaces and dashes.
pub fn normalize_phone(raw: &str) -> Option<String> {
    let compact: String = raw
        .trim()
        .chars()
        .filter(|c| !matches!(c, ' ' | '-'))
        .collect();
    let rest = compact
        .strip_prefix("+977")
        .or_else(|| {
            (compact.len() == 13)
                .then(|| compact.strip_prefix("977"))
                .flatten()
        })
        .unwrap_or(&compact);
    let ok = rest.len() == 10
        && rest.bytes().all(|b| b.is_ascii_digit())
        && (rest.starts_with("97") || rest.starts_with("98"));
    ok.then(|| rest.to_owned())
}

/// `host[:port]` of an `http(s)` URL, lowercase; `None` for anything
/// else (no scheme, user info, an empty or odd host).
pub fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let ok = !authority.is_empty()
        && authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
    ok.then(|| authority.to_ascii_lowercase())
}

fn text_field(field: &'static str, value: &str) -> Result<String, SmsError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(invalid(field, format!("{field} must not be empty")));
    }
    if v.chars().count() > MAX_TEXT_FIELD {
        return Err(invalid(
            field,
            format!("{field} must be at most {MAX_TEXT_FIELD} characters"),
        ));
    }
    if v.chars().any(char::is_control) {
        return Err(invalid(
            field,
            format!("{field} must not hold control characters"),
        ));
    }
    Ok(v.to_owned())
}

/// Checks each field, naming the one at fault.
pub fn validate(req: NotifyRequest) -> Result<ValidNotify, SmsError> {
    let phone = normalize_phone(&req.customer_phone).ok_or_else(|| {
        invalid(
            "customerPhone",
            "customerPhone must be a Nepali mobile number: 10 digits starting 97 or 98, optionally prefixed +977",
        )
    })?;
    let shop_name = text_field("shopName", &req.shop_name)?;
    let order_name = text_field("orderName", &req.order_name)?;
    if req.amount_minor <= 0 || req.amount_minor > MAX_AMOUNT_MINOR {
        return Err(invalid(
            "amountMinor",
            "amountMinor must be a positive amount in paisa",
        ));
    }
    if req.currency != "NPR" {
        return Err(invalid("currency", "currency must be NPR"));
    }
    let url = req.checkout_url.trim();
    if url.len() > MAX_URL {
        return Err(invalid(
            "checkoutUrl",
            format!("checkoutUrl must be at most {MAX_URL} characters"),
        ));
    }
    let checkout_host = url_host(url).ok_or_else(|| {
        invalid(
            "checkoutUrl",
            "checkoutUrl must be an http(s) URL of the hosted checkout",
        )
    })?;
    Ok(ValidNotify {
        phone,
        shop_name,
        order_name,
        amount_minor: req.amount_minor,
        checkout_url: url.to_owned(),
        checkout_host,
    })
}

/// The reminder's text.
pub fn message_text(v: &ValidNotify) -> String {
    let amount = crate::money::Paisa::new(v.amount_minor)
        .map(|p| p.display_npr())
        .unwrap_or_default();
    format!(
        "{}: your payment of {} for {} is pending. Complete it here: {}",
        v.shop_name, amount, v.order_name, v.checkout_url
    )
}

/// The smallest `cs_` id minted at `at` (ids sort by time).
fn first_id_at(kind: IdKind, at: Timestamp) -> String {
    let ms = u64::try_from(at.unix_millis()).unwrap_or(0);
    let ulid = ulid::Ulid::from_parts(ms, 0);
    format!("{}{}", kind.prefix(), ulid.to_string().to_ascii_lowercase())
}

/// Guard 1: whether `phone` (normalized) has a pending session on the
/// project and mode created in the last 24 h. Reads the project's
/// sessions newest first from the id of "24 h ago", at most
/// `SESSION_PAGES` pages of `SESSION_PAGE`.
pub async fn has_pending_session(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    phone: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let since = now.plus(chrono::Duration::hours(-SESSION_WINDOW_HOURS));
    let mut query = Query::partition(format!("PROJ#{project_id}#{}#CS", mode.as_str()))
        .on(Index::Gsi1)
        .sk(SkCond::Ge(first_id_at(IdKind::CheckoutSession, since)))
        .backward()
        .limit(SESSION_PAGE)
        .filter(Cond::AttrExists("customer_phone".into()));
    for _ in 0..SESSION_PAGES {
        let page = store.query(&query).await?;
        for item in page.items {
            let Ok(s) = from_item::<CheckoutSession>(item) else {
                continue;
            };
            let pending = matches!(
                s.status_at(now),
                SessionStatus::Pending | SessionStatus::Initiated
            );
            let same = s
                .customer_phone
                .as_deref()
                .and_then(normalize_phone)
                .is_some_and(|p| p == phone);
            if pending && same && s.created_at >= since {
                return Ok(true);
            }
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// Keys of the abuse counters and of the quota counter.
pub fn recipient_counter(merchant_id: &str, mode: Mode, phone: &str, now: Timestamp) -> Key {
    let day = now.unix_seconds().div_euclid(86_400);
    Key::new(
        format!("SMSCNT#{merchant_id}#{}#TO#{phone}", mode.as_str()),
        format!("D#{day}"),
    )
}

pub fn merchant_counter(merchant_id: &str, mode: Mode, now: Timestamp) -> Key {
    let hour = now.unix_seconds().div_euclid(3600);
    Key::new(
        format!("SMSCNT#{merchant_id}#{}", mode.as_str()),
        format!("H#{hour}"),
    )
}

/// The merchant's live quota counter of the UTC month of `now`.
pub fn quota_counter(merchant_id: &str, now: Timestamp) -> Key {
    Key::new(
        format!("SMSQUOTA#{merchant_id}"),
        format!("M#{}", now.datetime().format("%Y-%m")),
    )
}

/// `n < limit` (a missing counter is 0).
fn below(limit: i64) -> Cond {
    Cond::Or(vec![Cond::AttrNotExists("n".into()), Cond::lt("n", limit)])
}

fn counter_update(expires: i64) -> Update {
    Update::new().add("n", 1).set(TTL, expires)
}

/// Guard 3: takes one unit of both abuse counters, or none.
pub async fn take_abuse_limits(
    store: &dyn Store,
    limits: Limits,
    merchant_id: &str,
    mode: Mode,
    phone: &str,
    now: Timestamp,
) -> Result<(), SmsError> {
    let secs = now.unix_seconds();
    let day_end = (secs.div_euclid(86_400) + 1) * 86_400;
    let hour_end = (secs.div_euclid(3600) + 1) * 3600;
    let ops = vec![
        TxOp::Update {
            key: recipient_counter(merchant_id, mode, phone, now),
            update: counter_update(day_end + 86_400),
            cond: Some(below(limits.per_recipient_per_day)),
        },
        TxOp::Update {
            key: merchant_counter(merchant_id, mode, now),
            update: counter_update(hour_end + 86_400),
            cond: Some(below(limits.per_merchant_per_hour)),
        },
    ];
    let mut tries = 0;
    loop {
        tries += 1;
        match store.transact(ops.clone()).await {
            Ok(()) => return Ok(()),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let failed = |i: usize| matches!(reasons.get(i), Some(TxReason::ConditionFailed));
                if failed(0) {
                    return Err(SmsError::RateLimited {
                        which: "at most 3 reminders per recipient per day",
                        retry_after_secs: (day_end - secs).max(1),
                    });
                }
                if failed(1) {
                    return Err(SmsError::RateLimited {
                        which: "at most 100 reminders per merchant per hour",
                        retry_after_secs: (hour_end - secs).max(1),
                    });
                }
                // A conflict with a concurrent transaction: try again.
                if tries >= 8 {
                    return Err(SmsError::Store(StoreError::Unavailable(
                        "SMS counters are busy".into(),
                    )));
                }
                tokio::time::sleep(Duration::from_millis(5 * tries)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Guard 4: reserves one unit of the month's quota; `false` when none is
/// left (`quota` 0 reserves nothing).
pub async fn reserve_quota(
    store: &dyn Store,
    merchant_id: &str,
    quota: u32,
    now: Timestamp,
) -> Result<bool, StoreError> {
    if quota == 0 {
        return Ok(false);
    }
    let expires = now.unix_seconds() + 40 * 86_400;
    match store
        .update(
            &quota_counter(merchant_id, now),
            counter_update(expires),
            Some(below(i64::from(quota))),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.is_condition_failure() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives back a reserved unit (the reminder could not be queued).
async fn release_quota(store: &dyn Store, merchant_id: &str, now: Timestamp) {
    let released = store
        .update(
            &quota_counter(merchant_id, now),
            Update::new().add("n", -1),
            Some(Cond::gt("n", 0)),
        )
        .await;
    if let Err(e) = released {
        tracing::warn!(error = %e, "could not release an SMS quota unit");
    }
}

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
    Sent,
    Failed,
}

impl SmsStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SmsStatus::Logged => "logged",
            SmsStatus::Queued => "queued",
            SmsStatus::Sending => "sending",
            SmsStatus::Sent => "sent",
            SmsStatus::Failed => "failed",
        }
    }
}

/// One reminder, stored at `SMS#<id>` / `SMS`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmsReminder {
    pub id: String,
    pub project_id: String,
    pub merchant_id: String,
    pub mode: Mode,
    pub to: String,
    pub text: String,
    pub status: SmsStatus,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub lease_until_ms: Option<i64>,
    #[serde(default)]
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl SmsReminder {
    pub fn key(id: &str) -> Key {
        Key::new(format!("SMS#{id}"), "SMS")
    }

    fn list_partition(project_id: &str, mode: Mode) -> String {
        format!("PROJ#{project_id}#{}#SMS", mode.as_str())
    }

    /// `gsi1`: the project's reminders, by time-ordered id; `gsi2` (sparse,
    /// while a live reminder waits to be sent): the backstop sweep's queue.
    fn indexes(&self) -> Vec<(Index, String, String)> {
        let mut out = vec![(
            Index::Gsi1,
            SmsReminder::list_partition(&self.project_id, self.mode),
            self.id.clone(),
        )];
        if matches!(self.status, SmsStatus::Queued | SmsStatus::Sending) {
            out.push((
                Index::Gsi2,
                open_partition(&self.id),
                open_sort_key(self.created_at, &self.id),
            ));
        }
        out
    }
}

/// Shards of the open-reminders index.
const OPEN_SHARDS: u32 = 4;

fn open_partition(id: &str) -> String {
    let sum: u32 = id.bytes().map(u32::from).sum();
    format!("OPEN#SMS#{}", sum % OPEN_SHARDS)
}

fn open_sort_key(at: Timestamp, id: &str) -> String {
    format!("{:015}#{id}", at.unix_millis().max(0))
}

/// How long a waiting reminder may go unsent before the sweep queues it
/// again (its message was lost: a crash between the record and the queue,
/// an ambiguous write, a message given up to the dead-letter queue).
pub const STUCK_AFTER: chrono::Duration = chrono::Duration::minutes(5);

/// Queues again every live reminder still waiting [`STUCK_AFTER`] after it
/// was queued (or last swept), at most `limit` per shard; moves each one
/// forward in the index first, so the next sweep looks further and does
/// not queue it every run. A duplicate message is harmless (the claim lets
/// one send through). Answers how many were queued.
pub async fn requeue_stuck(
    state: &AppState,
    now: Timestamp,
    limit: usize,
) -> Result<usize, StoreError> {
    let store = &*state.store;
    let before = format!("{:015}", now.plus(-STUCK_AFTER).unix_millis().max(0));
    let mut queued = 0;
    for shard in 0..OPEN_SHARDS {
        let query = Query::partition(format!("OPEN#SMS#{shard}"))
            .on(Index::Gsi2)
            .sk(crate::store::SkCond::Lt(before.clone()))
            .limit(limit);
        for item in store.query(&query).await?.items {
            let r: SmsReminder = from_item(item)?;
            let key = SmsReminder::key(&r.id);
            let waiting = match r.status {
                SmsStatus::Queued => true,
                SmsStatus::Sending => r.lease_until_ms.is_none_or(|t| t < now.unix_millis()),
                _ => false,
            };
            let update = if waiting {
                Update::new().set(Index::Gsi2.sk_attr(), open_sort_key(now, &r.id))
            } else if matches!(r.status, SmsStatus::Sending) {
                continue;
            } else {
                // Final but still listed: take it out.
                Update::new()
                    .remove(Index::Gsi2.pk_attr())
                    .remove(Index::Gsi2.sk_attr())
            };
            let moved = store
                .update(
                    &key,
                    update,
                    Some(Cond::And(vec![
                        Cond::eq("status", r.status.as_str()),
                        Cond::eq("attempts", r.attempts),
                    ])),
                )
                .await;
            match moved {
                Ok(_) => {}
                Err(e) if e.is_condition_failure() => continue,
                Err(e) => return Err(e),
            }
            if !waiting {
                continue;
            }
            let body = serde_json::to_string(&SmsMessage {
                sms_id: r.id.clone(),
            })
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
            match state
                .queue
                .send(QueueName::Sms, &body, Duration::ZERO)
                .await
            {
                Ok(_) => {
                    queued += 1;
                    tracing::warn!(sms_id = %r.id, attempts = r.attempts, "stuck SMS reminder queued again");
                }
                Err(e) => {
                    tracing::warn!(sms_id = %r.id, error = %e, "could not queue a stuck SMS reminder; the next sweep retries")
                }
            }
        }
    }
    Ok(queued)
}

/// The project's latest reminders in `mode`, newest first (support and
/// tests; index reads are eventually consistent).
pub async fn list_recent(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    limit: usize,
) -> Result<Vec<SmsReminder>, StoreError> {
    let query = Query::partition(SmsReminder::list_partition(project_id, mode))
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

/// The queue message: the reminder to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsMessage {
    pub sms_id: String,
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
    state: &AppState,
    who: &Principal,
    req: NotifyRequest,
    checkout_base: &str,
    limits: Limits,
) -> Result<NotifyOutcome, SmsError> {
    let v = validate(req)?;
    let store = &*state.store;
    let now = state.clock.now();
    let project_id = who.project_id();
    let mode = who.mode();
    let merchant_id = who.merchant.id.as_str();
    // 1. A recent pending session for this number.
    if !has_pending_session(store, project_id, mode, &v.phone, now).await? {
        return Err(SmsError::PhoneNotOnSession);
    }
    // 2. The checkout host (no verified custom domains exist yet).
    let allowed = url_host(checkout_base).unwrap_or_default();
    if allowed.is_empty() || v.checkout_host != allowed {
        return Err(SmsError::InvalidCheckoutHost { allowed });
    }
    // 3. Abuse limits.
    take_abuse_limits(store, limits, merchant_id, mode, &v.phone, now).await?;
    let mut reminder = SmsReminder {
        id: new_id(IdKind::Sms),
        project_id: project_id.to_owned(),
        merchant_id: merchant_id.to_owned(),
        mode,
        to: v.phone.clone(),
        text: message_text(&v),
        status: SmsStatus::Logged,
        attempts: 0,
        lease_until_ms: None,
        last_error: None,
        created_at: now,
        updated_at: now,
    };
    if mode == Mode::Sandbox {
        put_new(store, &reminder).await?;
        tracing::info!(sms_id = %reminder.id, to = %masked(&reminder.to), project_id, "sandbox SMS reminder logged, not delivered");
        return Ok(NotifyOutcome {
            sent: false,
            status: "logged",
        });
    }
    // 4. The plan's monthly quota (live).
    let quota = plan_quota(who.merchant.plan);
    if !reserve_quota(store, merchant_id, quota, now).await? {
        return Ok(NotifyOutcome {
            sent: false,
            status: "plan_limit_reached",
        });
    }
    reminder.status = SmsStatus::Queued;
    if let Err(e) = put_new(store, &reminder).await {
        release_quota(store, merchant_id, now).await;
        return Err(e.into());
    }
    let body = serde_json::to_string(&SmsMessage {
        sms_id: reminder.id.clone(),
    })
    .map_err(|e| StoreError::Invalid(e.to_string()))?;
    if let Err(e) = state
        .queue
        .send(QueueName::Sms, &body, Duration::ZERO)
        .await
    {
        // Not queued: nothing will send it; give the unit back and end it.
        release_quota(store, merchant_id, now).await;
        let _ = store
            .update(
                &SmsReminder::key(&reminder.id),
                Update::new()
                    .set("status", SmsStatus::Failed.as_str())
                    .set("last_error", "could not be queued")
                    .remove(Index::Gsi2.pk_attr())
                    .remove(Index::Gsi2.sk_attr()),
                Some(Cond::eq("status", SmsStatus::Queued.as_str())),
            )
            .await;
        return Err(e.into());
    }
    tracing::info!(sms_id = %reminder.id, to = %masked(&reminder.to), project_id, "SMS reminder queued");
    Ok(NotifyOutcome {
        sent: true,
        status: "queued",
    })
}

fn plan_quota(plan: Plan) -> u32 {
    plan.sms_monthly_quota()
}

async fn put_new(store: &dyn Store, r: &SmsReminder) -> Result<(), StoreError> {
    let mut item = to_item(r, &SmsReminder::key(&r.id), &r.indexes())?;
    // Kept 90 days for support, then expired by the table's TTL.
    item.insert(TTL.into(), json!(r.created_at.unix_seconds() + 90 * 86_400));
    store.put(item, Some(Cond::NotExists)).await
}

pub async fn get(store: &dyn Store, id: &str) -> Result<Option<SmsReminder>, StoreError> {
    match store.get(&SmsReminder::key(id)).await? {
        Some(item) => from_item(item).map(Some),
        None => Ok(None),
    }
}

/// What handling one message did; each lets the message go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchOutcome {
    Sent,
    /// Refused by the provider, or out of attempts.
    Failed,
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
    state: &AppState,
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

/// Claims, sends and records one reminder (see the module docs).
pub async fn dispatch(
    state: &AppState,
    client: &SmsClient,
    sms_id: &str,
    lease: Duration,
) -> Result<DispatchOutcome, DispatchError> {
    let store = &*state.store;
    let Some(r) = get(store, sms_id).await? else {
        tracing::warn!(sms_id, "message for an unknown SMS reminder dropped");
        return Ok(DispatchOutcome::Skipped);
    };
    let now_ms = state.clock.now().unix_millis();
    let claimable = match r.status {
        SmsStatus::Queued => true,
        SmsStatus::Sending => r.lease_until_ms.is_none_or(|t| t < now_ms),
        SmsStatus::Logged | SmsStatus::Sent | SmsStatus::Failed => false,
    };
    if !claimable || r.mode != Mode::Live {
        return Ok(DispatchOutcome::Skipped);
    }
    let key = SmsReminder::key(sms_id);
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
    let lease_until = now_ms + lease_ms;
    let claim = store
        .update(
            &key,
            Update::new()
                .set("status", SmsStatus::Sending.as_str())
                .set("lease_until_ms", lease_until),
            Some(Cond::And(vec![
                Cond::eq("attempts", r.attempts),
                Cond::Or(vec![
                    Cond::eq("status", SmsStatus::Queued.as_str()),
                    Cond::And(vec![
                        Cond::eq("status", SmsStatus::Sending.as_str()),
                        Cond::Or(vec![
                            Cond::AttrNotExists("lease_until_ms".into()),
                            Cond::lt("lease_until_ms", now_ms),
                        ]),
                    ]),
                ]),
            ])),
        )
        .await;
    match claim {
        Ok(_) => {}
        Err(e) if e.is_condition_failure() => return Ok(DispatchOutcome::Skipped),
        Err(e) => return Err(e.into()),
    }
    let sent = client.send(&r.to, &r.text).await;
    let attempts = r.attempts + 1;
    let now = state.clock.now();
    let (status, error, outcome) = match &sent {
        Ok(()) => (SmsStatus::Sent, None, Ok(DispatchOutcome::Sent)),
        Err(SmsSendError::Rejected { .. }) => (
            SmsStatus::Failed,
            sent.as_ref().err().map(|e| e.to_string()),
            Ok(DispatchOutcome::Failed),
        ),
        Err(SmsSendError::Transient(why)) if attempts >= MAX_ATTEMPTS => (
            SmsStatus::Failed,
            Some(format!("gave up after {attempts} attempts: {why}")),
            Ok(DispatchOutcome::Failed),
        ),
        Err(SmsSendError::Transient(why)) => (
            SmsStatus::Queued,
            Some(why.clone()),
            Err(DispatchError::Transient(why.clone())),
        ),
    };
    let mut update = Update::new()
        .set("status", status.as_str())
        .set("attempts", attempts)
        .set("updated_at", json!(now))
        .remove("lease_until_ms");
    if matches!(status, SmsStatus::Sent | SmsStatus::Failed) {
        update = update
            .remove(Index::Gsi2.pk_attr())
            .remove(Index::Gsi2.sk_attr());
    }
    update = match &error {
        Some(e) => update.set("last_error", e.as_str()),
        None => update.remove("last_error"),
    };
    let logged = store
        .update(
            &key,
            update,
            Some(Cond::And(vec![
                Cond::eq("status", SmsStatus::Sending.as_str()),
                Cond::eq("lease_until_ms", lease_until),
            ])),
        )
        .await;
    match logged {
        Ok(_) => {}
        // Our lease ran out and another worker took the reminder: it logs.
        Err(e) if e.is_condition_failure() => return Ok(DispatchOutcome::Skipped),
        // Sent but not recorded: the message comes back after the lease
        // and may send once more (the documented gap).
        Err(e) => return Err(e.into()),
    }
    match &outcome {
        Ok(DispatchOutcome::Failed) => {
            tracing::warn!(sms_id, attempts, error = ?error, "SMS reminder failed")
        }
        Ok(_) => tracing::info!(sms_id, attempts, "SMS reminder sent"),
        Err(_) => {
            tracing::warn!(sms_id, attempts, error = ?error, "SMS send failed; it will be retried")
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Config;
    use crate::store::embedded::EmbeddedStore;
    use crate::time::{Clock, ManualClock, SystemClock};

    fn store() -> Arc<dyn Store> {
        match EmbeddedStore::in_memory() {
            Ok(s) => Arc::new(s),
            Err(e) => panic!("{e}"),
        }
    }

    fn req() -> NotifyRequest {
        NotifyRequest {
            customer_phone: "+977 984-1000001".into(),
            shop_name: "Sita's Shop".into(),
            order_name: "Order A-17".into(),
            amount_minor: 123_450,
            currency: "NPR".into(),
            checkout_url: "https://pay.example/c/cs_1".into(),
        }
    }

    #[test]
    fn phones_normalize_to_ten_digits() {
        for ok in [
            "9841000001",
            "+9779841000001",
            "+977 984 100 0001",
            "977-9841000001",
            "9701234567",
        ] {
            assert!(normalize_phone(ok).is_some(), "{ok}");
        }
        assert_eq!(
            normalize_phone("+977 9841000001").as_deref(),
            Some("9841000001")
        );
        for bad in [
            "",
            "984100000",
            "98410000011",
            "9641000001",
            "01-4412345",
            "+19841000001",
            "98410000o1",
            "+977+9841000001",
        ] {
            assert!(normalize_phone(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let field = |r: NotifyRequest| match validate(r) {
            Err(SmsError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(validate(req()).is_ok());
        assert_eq!(
            field(NotifyRequest {
                customer_phone: "12345".into(),
                ..req()
            }),
            "customerPhone"
        );
        assert_eq!(
            field(NotifyRequest {
                shop_name: " ".into(),
                ..req()
            }),
            "shopName"
        );
        assert_eq!(
            field(NotifyRequest {
                order_name: "x".repeat(61),
                ..req()
            }),
            "orderName"
        );
        assert_eq!(
            field(NotifyRequest {
                amount_minor: 0,
                ..req()
            }),
            "amountMinor"
        );
        assert_eq!(
            field(NotifyRequest {
                currency: "USD".into(),
                ..req()
            }),
            "currency"
        );
        assert_eq!(
            field(NotifyRequest {
                checkout_url: "javascript:alert(1)".into(),
                ..req()
            }),
            "checkoutUrl"
        );
        assert_eq!(
            field(NotifyRequest {
                checkout_url: "https://evil@pay.example/c".into(),
                ..req()
            }),
            "checkoutUrl"
        );
        let unknown: Result<NotifyRequest, _> = serde_json::from_value(json!({
            "customerPhone": "9841000001", "shopName": "a", "orderName": "b",
            "amountMinor": 1, "currency": "NPR", "checkoutUrl": "https://x/", "extra": 1
        }));
        assert!(unknown.is_err());
        let Ok(v) = validate(req()) else { panic!() };
        assert_eq!(v.checkout_host, "pay.example");
        assert!(
            message_text(&v).contains("NPR 1,234.50"),
            "{}",
            message_text(&v)
        );
    }

    #[tokio::test]
    async fn abuse_counters_refuse_past_the_limits_and_take_nothing_then() {
        let store = store();
        let now = SystemClock.now();
        let limits = Limits {
            per_recipient_per_day: 2,
            per_merchant_per_hour: 3,
        };
        let take = |phone: &'static str| {
            let store = store.clone();
            async move { take_abuse_limits(&*store, limits, "mer_1", Mode::Live, phone, now).await }
        };
        assert!(take("9841000001").await.is_ok());
        assert!(take("9841000001").await.is_ok());
        assert!(matches!(
            take("9841000001").await,
            Err(SmsError::RateLimited { which, .. }) if which.contains("recipient")
        ));
        assert!(take("9841000002").await.is_ok());
        assert!(matches!(
            take("9841000003").await,
            Err(SmsError::RateLimited { which, .. }) if which.contains("merchant")
        ));
        // The refused requests took nothing.
        let n = |key: Key| {
            let store = store.clone();
            async move {
                store
                    .get(&key)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|i| i.get("n").and_then(|v| v.as_i64()))
                    .unwrap_or(0)
            }
        };
        assert_eq!(n(merchant_counter("mer_1", Mode::Live, now)).await, 3);
        assert_eq!(
            n(recipient_counter("mer_1", Mode::Live, "9841000003", now)).await,
            0
        );
        // Sandbox counts apart.
        assert!(
            take_abuse_limits(&*store, limits, "mer_1", Mode::Sandbox, "9841000001", now)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn concurrent_abuse_counters_never_pass_the_limit() {
        let store = store();
        let now = SystemClock.now();
        let limits = Limits {
            per_recipient_per_day: 3,
            per_merchant_per_hour: 100,
        };
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    take_abuse_limits(&*store, limits, "mer_1", Mode::Live, "9841000001", now)
                        .await
                        .is_ok()
                })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            if matches!(t.await, Ok(true)) {
                ok += 1;
            }
        }
        assert_eq!(ok, 3);
    }

    #[tokio::test]
    async fn concurrent_quota_reservations_stop_at_the_quota() {
        let store = store();
        let now = SystemClock.now();
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    matches!(reserve_quota(&*store, "mer_1", 3, now).await, Ok(true))
                })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            if matches!(t.await, Ok(true)) {
                ok += 1;
            }
        }
        assert_eq!(ok, 3, "exactly the quota is reserved");
        assert!(matches!(
            reserve_quota(&*store, "mer_1", 0, now).await,
            Ok(false)
        ));
        // Another month starts afresh.
        let next = now.plus(chrono::Duration::days(32));
        assert!(matches!(
            reserve_quota(&*store, "mer_1", 3, next).await,
            Ok(true)
        ));
    }

    #[tokio::test]
    async fn a_reminder_whose_message_was_lost_is_queued_again_once_per_sweep() {
        let (state, _who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let now = clock.now();
        let reminder = SmsReminder {
            id: crate::ids::new_id(crate::ids::IdKind::Sms),
            project_id: "proj_1".into(),
            merchant_id: "mer_1".into(),
            mode: Mode::Live,
            to: "9841000001".into(),
            text: "pay".into(),
            status: SmsStatus::Queued,
            attempts: 0,
            lease_until_ms: None,
            last_error: None,
            created_at: now,
            updated_at: now,
        };
        // Recorded, but its queue message never went out (a crash).
        let Ok(()) = put_new(&*state.store, &reminder).await else {
            panic!("put")
        };
        let swept = |at| requeue_stuck(&state, at, 10);
        assert_eq!(swept(now).await.ok(), Some(0), "not stuck yet");
        let later = now.plus(chrono::Duration::minutes(6));
        assert_eq!(swept(later).await.ok(), Some(1));
        assert_eq!(
            swept(later).await.ok(),
            Some(0),
            "moved forward: once per sweep"
        );
        let Ok(got) = state
            .queue
            .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
            .await
        else {
            panic!("receive")
        };
        assert_eq!(got.len(), 1);
        assert!(got[0].body.contains(&reminder.id));
        // Once final it leaves the index and is never queued again.
        let Ok(_) = state
            .store
            .update(
                &SmsReminder::key(&reminder.id),
                Update::new().set("status", "sent"),
                None,
            )
            .await
        else {
            panic!("update")
        };
        let much_later = later.plus(chrono::Duration::minutes(10));
        assert_eq!(swept(much_later).await.ok(), Some(0));
        assert_eq!(
            swept(much_later.plus(chrono::Duration::minutes(10)))
                .await
                .ok(),
            Some(0)
        );
    }

    async fn state_with_tenant(plan: Plan, mode: Mode) -> (AppState, Principal, Arc<ManualClock>) {
        let store = store();
        let clock = Arc::new(ManualClock::new(SystemClock.now()));
        let state = AppState::new(
            store.clone(),
            clock.clone(),
            Config {
                public_base_url: "https://pay.example".into(),
            },
        );
        let now = clock.now();
        let Ok(merchant) =
            super::super::account::create_merchant(&*store, now, "M", "m@example.com", plan).await
        else {
            panic!("merchant")
        };
        let Ok(project) =
            super::super::account::create_project(&*store, now, &merchant, "Shop", false).await
        else {
            panic!("project")
        };
        let new = super::super::account::NewKey {
            mode,
            kind: super::super::account::KeyKind::Secret,
            scopes: super::super::account::Scope::ALL.to_vec(),
            description: "k".into(),
            expires_at: None,
            spend_cap_paisa: None,
        };
        let Ok((_, key)) = super::super::account::issue_api_key(&*store, now, &project, new).await
        else {
            panic!("key")
        };
        (state, Principal { key, merchant }, clock)
    }

    async fn session(state: &AppState, who: &Principal, phone: &str) {
        let now = state.clock.now();
        let id = new_id(IdKind::CheckoutSession);
        let item = json!({
            "pk": format!("CS#{id}"), "sk": "CS",
            "gsi1pk": format!("PROJ#{}#{}#CS", who.project_id(), who.mode().as_str()),
            "gsi1sk": id,
            "id": id, "project_id": who.project_id(), "mode": who.mode(),
            "api_key_id": who.key.id, "flow": "hosted", "amount": 1000, "currency": "NPR",
            "status": "pending", "customer_phone": phone,
            "return_url": "https://shop.example/r",
            "expires_at": now.plus(chrono::Duration::hours(1)),
            "created_at": now, "updated_at": now,
        });
        let Some(item) = item.as_object().cloned() else {
            panic!()
        };
        if let Err(e) = state.store.put(item, None).await {
            panic!("{e}")
        }
    }

    #[tokio::test]
    async fn the_guards_apply_in_order() {
        let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
        let base = "https://pay.example";
        let limits = Limits {
            per_recipient_per_day: 1,
            per_merchant_per_hour: 100,
        };
        let bad_host = NotifyRequest {
            checkout_url: "https://evil.example/c/x".into(),
            ..req()
        };
        // 1 before 2: no session and a bad host → phone_not_on_session.
        let r = notify(&state, &who, bad_host.clone(), base, limits).await;
        assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
        session(&state, &who, "+977-9841000001").await;
        // 2 before 3.
        let r = notify(&state, &who, bad_host.clone(), base, limits).await;
        assert!(
            matches!(r, Err(SmsError::InvalidCheckoutHost { .. })),
            "{r:?}"
        );
        let r = notify(&state, &who, req(), base, limits).await;
        assert!(
            matches!(&r, Ok(o) if o.status == "logged" && !o.sent),
            "{r:?}"
        );
        let r = notify(&state, &who, req(), base, limits).await;
        assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
        // Bad host still answers 400 over the exhausted limit.
        let r = notify(&state, &who, bad_host, base, limits).await;
        assert!(
            matches!(r, Err(SmsError::InvalidCheckoutHost { .. })),
            "{r:?}"
        );
        // A session older than 24 h does not count.
        clock.advance(chrono::Duration::hours(25));
        let r = notify(
            &state,
            &who,
            NotifyRequest {
                customer_phone: "9841000001".into(),
                ..req()
            },
            base,
            limits,
        )
        .await;
        assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
    }

    #[tokio::test]
    async fn live_reminders_take_the_quota_and_free_plans_have_none() {
        let (state, who, _) = state_with_tenant(Plan::Free, Mode::Live).await;
        session(&state, &who, "9841000001").await;
        let r = notify(
            &state,
            &who,
            req(),
            "https://pay.example",
            Limits::default(),
        )
        .await;
        assert!(
            matches!(&r, Ok(o) if o.status == "plan_limit_reached" && !o.sent),
            "{r:?}"
        );
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
        session(&state, &who, "9841000001").await;
        let r = notify(
            &state,
            &who,
            req(),
            "https://pay.example",
            Limits::default(),
        )
        .await;
        assert!(
            matches!(&r, Ok(o) if o.status == "queued" && o.sent),
            "{r:?}"
        );
        let got = state
            .queue
            .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
            .await;
        assert!(matches!(got.as_deref(), Ok([_])), "{got:?}");
    }

    #[tokio::test]
    async fn a_claimed_reminder_is_not_sent_twice_until_its_lease_runs_out() {
        let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let now = clock.now();
        let lease_until = now.unix_millis() + 60_000;
        let r = SmsReminder {
            id: new_id(IdKind::Sms),
            project_id: who.project_id().to_owned(),
            merchant_id: who.merchant.id.clone(),
            mode: Mode::Live,
            to: "9841000001".into(),
            text: "hi".into(),
            status: SmsStatus::Sending,
            attempts: 0,
            lease_until_ms: Some(lease_until),
            last_error: None,
            created_at: now,
            updated_at: now,
        };
        if let Err(e) = put_new(&*state.store, &r).await {
            panic!("{e}")
        }
        // Nothing listens there: a send attempt is a transient failure.
        let client = match SmsClient::new(crate::providers::sms::SmsConfig {
            base_url: "http://127.0.0.1:9".into(),
            token: "t".into(),
            from: "Dhukuti".into(),
            timeout: Duration::from_millis(300),
        }) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        // Another worker holds it: a duplicate message sends nothing.
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
        // Its lease ran out (it crashed): the reminder is tried again.
        clock.advance(chrono::Duration::seconds(61));
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Err(DispatchError::Transient(_))), "{d:?}");
        let got = get(&*state.store, &r.id).await;
        assert!(
            matches!(&got, Ok(Some(g)) if g.status == SmsStatus::Queued
                && g.attempts == 1 && g.lease_until_ms.is_none()),
            "{got:?}"
        );
        // A final reminder is never sent again.
        let done = state
            .store
            .update(
                &SmsReminder::key(&r.id),
                Update::new().set("status", "sent"),
                None,
            )
            .await;
        assert!(done.is_ok());
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
    }
}
