//! Pending-payment SMS reminders (spec "SMS", decisions "SMS reminders").
//!
//! `POST /v1/sms/notify-pending-payment` runs [`notify`]: it validates the
//! body, then applies the guards in this order:
//! 1. the recipient (normalized Nepali mobile) has a pending checkout
//!    session on this project and mode created in the last 24 h
//!    ([`pending_session`]). When `checkoutUrl` names one of the project's
//!    sessions (`/c/<cs_id>`) it must be that one; otherwise the project's
//!    sessions on `gsi1` are read newest first, from the id of "24 h ago",
//!    in bounded pages. The reminder is bound to the session found;
//! 2. `checkoutUrl`'s host is the project's checkout host (the public base
//!    URL's host), and a session it names is one of this project's. There
//!    are no verified custom domains yet, so only the canonical host is
//!    accepted;
//! 3. the abuse limits: at most [`Limits::per_recipient_per_day`] per
//!    recipient in any rolling 24 h (a window item of the recipient's
//!    recent send times, written with a version condition) and
//!    [`Limits::per_merchant_per_hour`] per merchant per (UTC) hour (a
//!    fixed-window counter), per mode, taken together in one transaction,
//!    so concurrent requests never pass them and a refused request takes
//!    nothing;
//! 4. live only: one unit of the merchant's monthly plan quota
//!    ([`Plan::sms_monthly_quota`], UTC calendar month) reserved with a
//!    conditional `ADD`; none left answers `plan_limit_reached`.
//!
//! Sandbox reminders pass guards 1-3 and are stored as `logged`, never
//! queued. Live reminders are stored (`sms_…` at `SMS#<id>` / `SMS`,
//! status `queued`) and their id is queued on [`QueueName::Sms`].
//!
//! The dispatcher ([`dispatch`]) sends one reminder at most once. The
//! provider takes no idempotency key, so the rule is "when in doubt, do
//! not send again":
//! - it claims the record with a conditional write (`queued` → `sending`
//!   with a lease); a duplicate queue message finds it claimed or final
//!   and is dropped;
//! - it reads the bound checkout session: paid, failed or expired since
//!   the request means `cancelled`, nothing sent, the quota unit given back;
//! - it sends, then ends the record with a write conditioned on its claim
//!   (a random id written with the lease):
//!   `sent`; `failed` (a 4xx refusal, or [`MAX_ATTEMPTS`] sends that
//!   certainly did not reach the provider), quota unit given back in the
//!   same transaction; `queued` again after a send that certainly did not
//!   reach it (connection refused, 408, 429, 503), retried by the queue;
//!   `unknown` after a send that may have reached it (a timeout, 5xx other
//!   than 503), never retried, quota unit kept;
//! - a `sending` record whose lease ran out (its dispatcher crashed or
//!   could not record the outcome) may have been sent: it ends `unknown`.
//!
//! A live reminder still waiting 5 minutes after it was queued is queued
//! again by [`requeue_stuck`] (the Scheduler, the local worker): a lost
//! message means a late reminder, not a lost one.

use crate::refusal::{Kind, Refusal};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Mode;
use super::account::Principal;
use super::checkout::{CheckoutSession, SessionStatus};
use super::record::{from_item, to_item};
use crate::Deps;
use crate::ids::{IdKind, new_id};
use crate::keys;
use crate::providers::sms::{SmsClient, SmsSendError};
use crate::queue::{QueueError, QueueName};
use crate::store::fence::Fence;
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
    #[error(
        "checkoutUrl names checkout session {session_id}, which is not a session of this project in this mode"
    )]
    ForeignCheckoutSession { session_id: String },
    #[error("too many SMS reminders: {which}; retry later")]
    RateLimited {
        which: String,
        retry_after_secs: i64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<SmsError> for Refusal {
    fn from(err: SmsError) -> Self {
        match err {
            SmsError::Invalid { field, message } => Refusal::invalid(field, message),
            e @ SmsError::PhoneNotOnSession => {
                Refusal::new(Kind::Invalid, "phone_not_on_session", e.to_string())
                    .at("customerPhone")
            }
            e
            @ (SmsError::InvalidCheckoutHost { .. } | SmsError::ForeignCheckoutSession { .. }) => {
                Refusal::new(Kind::Invalid, "invalid_checkout_host", e.to_string())
                    .at("checkoutUrl")
            }
            SmsError::RateLimited {
                which,
                retry_after_secs,
            } => Refusal::new(
                Kind::RateLimited,
                "rate_limited",
                format!("Too many SMS reminders ({which}); retry later"),
            )
            .retry_after(u64::try_from(retry_after_secs).unwrap_or(0)),
            SmsError::Store(e) => e.into(),
            SmsError::Queue(e) => e.into(),
        }
    }
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

/// The path of an `http(s)` URL, without its query and fragment (`""`
/// when it has none).
fn url_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let rest = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    Some(rest.find('/').map_or("", |i| &rest[i..]))
}

/// The checkout session a hosted checkout URL names
/// (`<base>/c/<cs_id>[/…]`), where `base` is the public base URL the
/// hosted pages are under (its path, if any, comes first).
pub fn session_in_url<'a>(url: &'a str, base: &str) -> Option<&'a str> {
    let base_path = url_path(base).unwrap_or("").trim_end_matches('/');
    let path = url_path(url)?.strip_prefix(base_path)?;
    let id = path.strip_prefix("/c/")?;
    let id = &id[..id.find('/').unwrap_or(id.len())];
    let ok = id.starts_with(IdKind::CheckoutSession.prefix())
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    ok.then_some(id)
}

/// Whether `s` is a session guard 1 accepts for `phone` at `now`.
fn is_pending_for(s: &CheckoutSession, phone: &str, now: Timestamp) -> bool {
    let since = now.plus(chrono::Duration::hours(-SESSION_WINDOW_HOURS));
    let pending = matches!(
        s.status_at(now),
        SessionStatus::Pending | SessionStatus::Initiated
    );
    let same = s
        .customer_phone
        .as_deref()
        .and_then(normalize_phone)
        .is_some_and(|p| p == phone);
    pending && same && s.created_at >= since
}

/// What guard 1 found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionMatch {
    /// The recipient's pending session the reminder is about: the one the
    /// URL names, else the newest one found.
    Found(String),
    /// The URL names a session of another project, mode, or none at all
    /// (guard 2 refuses it when guard 1 passes).
    ForeignUrl(String),
    NotFound,
}

/// Guard 1: the pending session of `phone` (normalized) on the project and
/// mode created in the last 24 h. When `url_session` names one of the
/// project's sessions, it must be that one (a reminder is bound to the
/// checkout it links to); otherwise the project's sessions are read on
/// `gsi1`, newest first from the id of "24 h ago", at most
/// `SESSION_PAGES` pages of `SESSION_PAGE`.
pub async fn pending_session(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    phone: &str,
    url_session: Option<&str>,
    now: Timestamp,
) -> Result<SessionMatch, StoreError> {
    let mut foreign = None;
    if let Some(id) = url_session {
        let named = match store.get(&CheckoutSession::key(id)).await? {
            Some(item) => from_item::<CheckoutSession>(item).ok(),
            None => None,
        };
        match named {
            Some(s) if s.project_id == project_id && s.mode == mode => {
                return Ok(if is_pending_for(&s, phone, now) {
                    SessionMatch::Found(s.id)
                } else {
                    SessionMatch::NotFound
                });
            }
            _ => foreign = Some(id.to_owned()),
        }
    }
    let since = now.plus(chrono::Duration::hours(-SESSION_WINDOW_HOURS));
    let mut query = Query::partition(keys::per_mode(project_id, mode, keys::PerMode::Sessions))
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
            if is_pending_for(&s, phone, now) {
                return Ok(match foreign {
                    Some(url) => SessionMatch::ForeignUrl(url),
                    None => SessionMatch::Found(s.id),
                });
            }
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => break,
        }
    }
    Ok(SessionMatch::NotFound)
}

/// The recipient's window item: the times (ms) of the reminders sent to
/// `phone` by the merchant in `mode` in the last 24 h, and a version.
pub fn recipient_window(merchant_id: &str, mode: Mode, phone: &str) -> Key {
    keys::sms_recipient(merchant_id, mode, phone)
}

/// The recipient window's length.
const RECIPIENT_WINDOW_MS: i64 = 24 * 3_600_000;
/// Tries of the recipient window's versioned write before giving up.
const WINDOW_TRIES: usize = 12;

/// The merchant's fixed-hour counter.
pub fn merchant_counter(merchant_id: &str, mode: Mode, now: Timestamp) -> Key {
    let hour = now.unix_seconds().div_euclid(3600);
    keys::sms_hour(merchant_id, mode, hour)
}

/// The merchant's live quota counter of the UTC month of `now`.
pub fn quota_counter(merchant_id: &str, now: Timestamp) -> Key {
    keys::sms_quota(merchant_id, &now.datetime().format("%Y-%m").to_string())
}

/// `n < limit` (a missing counter is 0).
fn below(limit: i64) -> Cond {
    Cond::Or(vec![Cond::AttrNotExists("n".into()), Cond::lt("n", limit)])
}

fn counter_update(expires: i64) -> Update {
    Update::new().add("n", 1).set(TTL, expires)
}

/// What [`take_places`] took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Both abuse places (and the quota unit, and the reminder written).
    All,
    /// The quota is used up: nothing was taken.
    QuotaExhausted,
    /// The fence tripped: a first run of this request (same
    /// Idempotency-Key) already stored the reminder; nothing more taken.
    AlreadyStored,
}

/// Guards 3 and 4, and the reminder's record, in one transaction:
/// everything or nothing, so a refused request takes nothing.
///
/// - Guard 3, per recipient, a rolling 24 h: the recipient's window item
///   holds the times of its reminders in the last 24 h; a new one is added
///   with a write conditioned on the version read, so two concurrent
///   requests cannot both take the last place (the loser reads again).
/// - Guard 3, per merchant, a fixed UTC hour: a counter `n < limit` taken
///   with a conditional `ADD`.
/// - Guard 4 (`quota` is `Some` in live mode): one unit of the month's plan
///   quota, a conditional `ADD` (a quota of 0 is a check that never
///   passes).
/// - `record`: the reminder's put, if any.
///
/// Refusals come in the guards' order: a full recipient window or hour is
/// `rate_limited` even when the quota is used up too.
#[allow(clippy::too_many_arguments)]
pub async fn take_places(
    store: &dyn Store,
    limits: Limits,
    merchant_id: &str,
    mode: Mode,
    phone: &str,
    now: Timestamp,
    quota: Option<u32>,
    record: Option<TxOp>,
    fence: Option<TxOp>,
) -> Result<Taken, SmsError> {
    let secs = now.unix_seconds();
    let now_ms = now.unix_millis();
    let hour_end = (secs.div_euclid(3600) + 1) * 3600;
    let hour_full = || SmsError::RateLimited {
        which: format!(
            "at most {} reminders per merchant per hour",
            limits.per_merchant_per_hour
        ),
        retry_after_secs: (hour_end - secs).max(1),
    };
    let key = recipient_window(merchant_id, mode, phone);
    for attempt in 0..WINDOW_TRIES {
        let current = store.get(&key).await?;
        let version = current
            .as_ref()
            .and_then(|i| i.get("v"))
            .and_then(serde_json::Value::as_i64);
        let mut recent: Vec<i64> = current
            .as_ref()
            .and_then(|i| i.get("sent_ms"))
            .and_then(serde_json::Value::as_array)
            .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
            .unwrap_or_default();
        recent.retain(|t| *t > now_ms - RECIPIENT_WINDOW_MS);
        recent.sort_unstable();
        let room = usize::try_from(limits.per_recipient_per_day).unwrap_or(0);
        if recent.len() >= room {
            // The place frees when the oldest counted reminder is 24 h old.
            let frees_ms = recent
                .len()
                .checked_sub(room)
                .and_then(|i| recent.get(i))
                .map_or(now_ms + RECIPIENT_WINDOW_MS, |t| t + RECIPIENT_WINDOW_MS);
            return Err(SmsError::RateLimited {
                which: format!(
                    "at most {} reminders per recipient in 24 hours",
                    limits.per_recipient_per_day
                ),
                retry_after_secs: ((frees_ms - now_ms + 999) / 1000).max(1),
            });
        }
        recent.push(now_ms);
        let mut item = crate::store::Item::new();
        item.insert("pk".into(), json!(key.pk));
        item.insert("sk".into(), json!(key.sk));
        item.insert("sent_ms".into(), json!(recent));
        item.insert("v".into(), json!(version.unwrap_or(0) + 1));
        item.insert(
            TTL.into(),
            json!((now_ms + RECIPIENT_WINDOW_MS) / 1000 + 3600),
        );
        let mut ops = vec![
            TxOp::Put {
                item,
                cond: Some(match version {
                    Some(v) => Cond::eq("v", v),
                    None => Cond::NotExists,
                }),
            },
            TxOp::Update {
                key: merchant_counter(merchant_id, mode, now),
                update: counter_update(hour_end + 86_400),
                cond: Some(below(limits.per_merchant_per_hour)),
            },
        ];
        const QUOTA_AT: usize = 2;
        if let Some(quota) = quota {
            let key = quota_counter(merchant_id, now);
            ops.push(if quota == 0 {
                // No quota: a check that never passes (`n` is never < 0,
                // and a missing `n` fails the comparison).
                TxOp::Check {
                    key,
                    cond: Cond::lt("n", 0),
                }
            } else {
                TxOp::Update {
                    key,
                    update: counter_update(secs + 40 * 86_400),
                    cond: Some(below(i64::from(quota))),
                }
            });
        }
        if let Some(op) = &record {
            ops.push(op.clone());
        }
        let fence_at = fence.as_ref().map(|op| {
            ops.push(op.clone());
            ops.len() - 1
        });
        match store.transact(ops).await {
            Ok(()) => return Ok(Taken::All),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let failed = |i: usize| matches!(reasons.get(i), Some(TxReason::ConditionFailed));
                if fence_at.is_some_and(failed) {
                    return Ok(Taken::AlreadyStored);
                }
                if failed(1) {
                    return Err(hour_full());
                }
                if quota.is_some() && failed(QUOTA_AT) && !failed(0) {
                    return Ok(Taken::QuotaExhausted);
                }
                // The window moved under us, or a conflicting transaction:
                // read again.
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Still conflicting (hot counters under a burst): a full hour or quota
    // is still a 429 / plan_limit_reached, not a busy store.
    let count = |key: Key| async move {
        store
            .get(&key)
            .await
            .map(|i| i.and_then(|i| i.get("n").and_then(serde_json::Value::as_i64)))
    };
    if count(merchant_counter(merchant_id, mode, now))
        .await?
        .unwrap_or(0)
        >= limits.per_merchant_per_hour
    {
        return Err(hour_full());
    }
    if let Some(quota) = quota {
        if count(quota_counter(merchant_id, now)).await?.unwrap_or(0) >= i64::from(quota) {
            return Ok(Taken::QuotaExhausted);
        }
    }
    Err(SmsError::Store(StoreError::Unavailable(
        "SMS limits are busy; retry".into(),
    )))
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
    pub fn as_str(self) -> &'static str {
        match self {
            SmsStatus::Logged => "logged",
            SmsStatus::Queued => "queued",
            SmsStatus::Sending => "sending",
            SmsStatus::Sent => "sent",
            SmsStatus::Failed => "failed",
            SmsStatus::Cancelled => "cancelled",
            SmsStatus::Unknown => "unknown",
        }
    }

    /// Nothing more happens to it.
    pub fn is_final(self) -> bool {
        !matches!(self, SmsStatus::Queued | SmsStatus::Sending)
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
    /// The checkout session the reminder is about (guard 1's match): the
    /// dispatcher sends nothing once it is no longer payable.
    #[serde(default)]
    pub session_id: Option<String>,
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
        keys::record(keys::Record::Sms, id)
    }

    fn list_partition(project_id: &str, mode: Mode) -> String {
        keys::per_mode(project_id, mode, keys::PerMode::Sms)
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
    keys::open(keys::Open::Sms, keys::shard_of(id, OPEN_SHARDS))
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
            let update = if waiting {
                Update::new().set(Index::Gsi2.sk_attr(), open_sort_key(now, &r.id))
            } else if matches!(r.status, SmsStatus::Sending) {
                continue;
            } else {
                // Final but still listed: take it out.
                Update::new().unindex(Index::Gsi2)
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
            if waiting && enqueue(state, &r.id).await {
                queued += 1;
                tracing::warn!(sms_id = %r.id, attempts = r.attempts, "stuck SMS reminder queued again");
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
    let project_id = who.project_id();
    let mode = who.mode();
    let merchant_id = who.merchant.id.as_str();
    // 1. A recent pending session for this number (the one the URL names,
    // when it names one of the project's).
    let url_session = session_in_url(&v.checkout_url, checkout_base);
    let session_id =
        match pending_session(store, project_id, mode, &v.phone, url_session, now).await? {
            SessionMatch::Found(id) => id,
            SessionMatch::NotFound => return Err(SmsError::PhoneNotOnSession),
            SessionMatch::ForeignUrl(id) => {
                return Err(SmsError::ForeignCheckoutSession { session_id: id });
            }
        };
    // 2. The checkout host (no verified custom domains exist yet).
    let allowed = url_host(checkout_base).unwrap_or_default();
    if allowed.is_empty() || v.checkout_host != allowed {
        return Err(SmsError::InvalidCheckoutHost { allowed });
    }
    // 3 and 4, with the record: one transaction.
    let mut reminder = SmsReminder {
        id: new_id(IdKind::Sms),
        project_id: project_id.to_owned(),
        merchant_id: merchant_id.to_owned(),
        mode,
        to: v.phone.clone(),
        text: message_text(&v),
        session_id: Some(session_id),
        status: SmsStatus::Logged,
        attempts: 0,
        lease_until_ms: None,
        last_error: None,
        created_at: now,
        updated_at: now,
    };
    let live = mode == Mode::Live;
    if live {
        reminder.status = SmsStatus::Queued;
    }
    let quota = live.then(|| who.merchant.plan.sms_monthly_quota());
    let record = new_record_op(&reminder)?;
    let taken = take_places(
        store,
        limits,
        merchant_id,
        mode,
        &v.phone,
        now,
        quota,
        Some(record),
        fence.map(|f| f.op(&reminder.id)),
    )
    .await;
    // The first run's reminder, when already read.
    let (taken, first_run) = match (taken, fence) {
        // The recipient's window is full, perhaps with this request's own
        // first run (its answer lost): that run's reminder answers.
        (Err(e @ SmsError::RateLimited { .. }), Some(f)) => match f.resource_id(store).await? {
            Some(id) => (Taken::AlreadyStored, Some(id)),
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
        // A retry of a request whose answer was lost: the first run's
        // reminder stands and is answered as the first run was. Its queue
        // message may never have been sent (the first run stopped at the
        // store's answer): queue it again now rather than wait for the
        // sweep; a duplicate message is dropped by the claim.
        Taken::AlreadyStored => {
            if live {
                let first_run = match (first_run, fence) {
                    (Some(id), _) => Some(id),
                    (None, Some(f)) => f.resource_id(store).await.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "first reminder of a retried request not read; the sweep queues it");
                        None
                    }),
                    (None, None) => None,
                };
                if let Some(id) = first_run {
                    enqueue(state, &id).await;
                }
            }
            return Ok(NotifyOutcome {
                sent: live,
                status: if live { "queued" } else { "logged" },
            });
        }
    }
    if !live {
        tracing::info!(sms_id = %reminder.id, to = %masked(&reminder.to), project_id, "sandbox SMS reminder logged, not delivered");
        return Ok(NotifyOutcome {
            sent: false,
            status: "logged",
        });
    }
    enqueue(state, &reminder.id).await;
    tracing::info!(sms_id = %reminder.id, to = %masked(&reminder.to), project_id, "SMS reminder stored");
    Ok(NotifyOutcome {
        sent: true,
        status: "queued",
    })
}

/// Queues a stored live reminder for the dispatcher; answers whether it
/// was queued. A failure is logged, not returned: the reminder is stored
/// and counted, and the backstop sweep queues it within minutes (a late
/// reminder, not a lost one); ending it here instead could race a message
/// that did reach the queue.
async fn enqueue(state: &Deps, sms_id: &str) -> bool {
    let body = match serde_json::to_string(&SmsMessage {
        sms_id: sms_id.to_owned(),
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

/// The put of a new reminder's record.
fn new_record_op(r: &SmsReminder) -> Result<TxOp, StoreError> {
    let mut item = to_item(r, &SmsReminder::key(&r.id), &r.indexes())?;
    // Kept 90 days for support, then expired by the table's TTL.
    item.insert(TTL.into(), json!(r.created_at.unix_seconds() + 90 * 86_400));
    Ok(TxOp::Put {
        item,
        cond: Some(Cond::NotExists),
    })
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
    let Some(id) = r.session_id.as_deref() else {
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
    let mut update = Update::new()
        .set("status", status.as_str())
        .set("attempts", attempts)
        .set("updated_at", json!(now))
        .remove("lease_until_ms")
        .remove(CLAIM);
    if status.is_final() {
        update = update.unindex(Index::Gsi2);
    }
    update = match error {
        Some(e) => update.set("last_error", e),
        None => update.remove("last_error"),
    };
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
                        update: Update::new().add("n", -1),
                        cond: Some(Cond::gt("n", 0)),
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

/// The attribute naming the claim in flight (a random id): every write of
/// the claim holder is conditioned on it.
const CLAIM: &str = "claim";

/// Still `sending` under the claim `claim`.
fn held_by(claim: &str) -> Cond {
    Cond::And(vec![
        Cond::eq("status", SmsStatus::Sending.as_str()),
        Cond::eq(CLAIM, claim),
    ])
}

/// Tries of the write that ends a claimed reminder.
const FINISH_TRIES: usize = 6;

/// Gives a claim back (`sending` → `queued`, attempts unchanged) after a
/// failure before anything was sent, so the queue's next delivery tries
/// again instead of ending it `unknown`. Best effort: conditioned on our
/// claim (a claim write that did not land changes nothing).
async fn unclaim(store: &dyn Store, id: &str, claim: &str) {
    let released = store
        .update(
            &SmsReminder::key(id),
            Update::new()
                .set("status", SmsStatus::Queued.as_str())
                .remove("lease_until_ms")
                .remove(CLAIM),
            Some(held_by(claim)),
        )
        .await;
    match released {
        Ok(_) => {}
        Err(e) if e.is_condition_failure() => {}
        Err(e) => {
            tracing::warn!(sms_id = id, error = %e, "could not give an SMS claim back; it ends unknown after its lease")
        }
    }
}

/// Claims, sends and records one reminder (see the module docs).
pub async fn dispatch(
    state: &Deps,
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
    if r.mode != Mode::Live {
        return Ok(DispatchOutcome::Skipped);
    }
    let key = SmsReminder::key(sms_id);
    match r.status {
        SmsStatus::Queued => {}
        SmsStatus::Sending => {
            let Some(held) = r.lease_until_ms.filter(|t| *t >= now_ms) else {
                // Its dispatcher stopped while it was claimed: the message
                // may have gone out. Not sent again; ended `unknown`.
                return abandon(state, &r).await;
            };
            tracing::debug!(sms_id, held, "SMS reminder claimed by another worker");
            return Ok(DispatchOutcome::Skipped);
        }
        _ => return Ok(DispatchOutcome::Skipped),
    }
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
    let lease_until = now_ms + lease_ms;
    // Names this claim alone: two workers may compute the same lease.
    let claim_id = ulid::Ulid::new().to_string();
    let claim = store
        .update(
            &key,
            Update::new()
                .set("status", SmsStatus::Sending.as_str())
                .set("lease_until_ms", lease_until)
                .set(CLAIM, claim_id.as_str()),
            Some(Cond::And(vec![
                Cond::eq("attempts", r.attempts),
                Cond::eq("status", SmsStatus::Queued.as_str()),
            ])),
        )
        .await;
    match claim {
        Ok(_) => {}
        Err(e) if e.is_condition_failure() => return Ok(DispatchOutcome::Skipped),
        Err(e) => {
            // The claim may have landed: give it back, nothing was sent.
            unclaim(store, sms_id, &claim_id).await;
            return Err(e.into());
        }
    }
    // Paid (or expired) since it was queued: nothing to remind.
    let payable = match still_payable(store, &r, state.clock.now()).await {
        Ok(p) => p,
        Err(e) => {
            unclaim(store, sms_id, &claim_id).await;
            return Err(e.into());
        }
    };
    if let Some(why) = payable {
        let now = state.clock.now();
        let ended = finish(
            store,
            &r,
            &claim_id,
            SmsStatus::Cancelled,
            r.attempts,
            Some(&why),
            now,
        )
        .await;
        let ended = match ended {
            Ok(ended) => ended,
            Err(e) => {
                unclaim(store, sms_id, &claim_id).await;
                return Err(e.into());
            }
        };
        if ended {
            tracing::info!(sms_id, reason = %why, "SMS reminder cancelled, not sent");
            return Ok(DispatchOutcome::Cancelled);
        }
        return Ok(DispatchOutcome::Skipped);
    }
    let sent = client.send(&r.to, &r.text).await;
    let attempts = r.attempts + 1;
    let (status, error, outcome) = match sent {
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
    };
    let now = state.clock.now();
    // A store error here leaves the reminder `sending`: after the lease it
    // ends `unknown`, never sent twice.
    if !finish(
        store,
        &r,
        &claim_id,
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
            tracing::warn!(sms_id, attempts, status = status.as_str(), error = ?error, "SMS reminder not sent")
        }
        Err(_) => {
            tracing::warn!(sms_id, attempts, error = ?error, "SMS send failed; it will be retried")
        }
    }
    outcome
}

/// Ends a reminder whose dispatcher stopped while sending it: `unknown`,
/// its quota unit kept.
async fn abandon(state: &Deps, r: &SmsReminder) -> Result<DispatchOutcome, DispatchError> {
    let now = state.clock.now();
    let ended = state
        .store
        .update(
            &SmsReminder::key(&r.id),
            Update::new()
                .set("status", SmsStatus::Unknown.as_str())
                .set("updated_at", json!(now))
                .set(
                    "last_error",
                    "a dispatcher stopped while sending it; not sent again",
                )
                .remove("lease_until_ms")
                .remove(CLAIM)
                .unindex(Index::Gsi2),
            Some(Cond::And(vec![
                Cond::eq("status", SmsStatus::Sending.as_str()),
                Cond::eq("attempts", r.attempts),
                match r.lease_until_ms {
                    Some(t) => Cond::eq("lease_until_ms", t),
                    None => Cond::AttrNotExists("lease_until_ms".into()),
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

#[cfg(test)]
mod tests {
    use crate::AppState;
    use crate::testenv::memory_store as store;
    use std::sync::Arc;

    use super::*;
    use crate::Config;
    use crate::domain::account::Plan;
    use crate::time::{Clock, ManualClock, SystemClock};

    /// Guard 3 alone.
    async fn take_abuse_limits(
        store: &dyn Store,
        limits: Limits,
        merchant_id: &str,
        mode: Mode,
        phone: &str,
        now: Timestamp,
    ) -> Result<(), SmsError> {
        take_places(
            store,
            limits,
            merchant_id,
            mode,
            phone,
            now,
            None,
            None,
            None,
        )
        .await
        .map(|_| ())
    }

    /// One unit of the month's quota, as a request takes it.
    async fn reserve_quota(
        store: &dyn Store,
        merchant_id: &str,
        quota: u32,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let taken = store
            .update(
                &quota_counter(merchant_id, now),
                counter_update(now.unix_seconds() + 40 * 86_400),
                Some(below(i64::from(quota))),
            )
            .await;
        match taken {
            Ok(_) => Ok(true),
            Err(e) if e.is_condition_failure() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn put_new(store: &dyn Store, r: &SmsReminder) -> Result<(), StoreError> {
        store.transact(vec![new_record_op(r)?]).await
    }

    fn req() -> NotifyRequest {
        NotifyRequest {
            customer_phone: "+977 984-1000001".into(),
            shop_name: "Sita's Shop".into(),
            order_name: "Order A-17".into(),
            amount_minor: 123_450,
            currency: "NPR".into(),
            checkout_url: "https://pay.example/l/lnk_1".into(),
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
        let window = store
            .get(&recipient_window("mer_1", Mode::Live, "9841000003"))
            .await;
        assert!(matches!(window, Ok(None)), "{window:?}");
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
    async fn concurrent_quota_reservations_stop_at_the_quota_and_refusals_take_nothing() {
        let store = store();
        let now = SystemClock.now();
        let limits = Limits::default();
        let take = |phone: String, quota: u32, at: Timestamp| {
            let store = store.clone();
            async move {
                take_places(
                    &*store,
                    limits,
                    "mer_1",
                    Mode::Live,
                    &phone,
                    at,
                    Some(quota),
                    None,
                    None,
                )
                .await
            }
        };
        let tasks: Vec<_> = (0..10)
            .map(|i| tokio::spawn(take(format!("98410000{:02}", 10 + i), 3, now)))
            .collect();
        let (mut all, mut exhausted) = (0, 0);
        for t in tasks {
            match t.await {
                Ok(Ok(Taken::All)) => all += 1,
                Ok(Ok(Taken::QuotaExhausted)) => exhausted += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((all, exhausted), (3, 7), "exactly the quota is reserved");
        // The refused requests took no abuse place.
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
        assert_eq!(n(quota_counter("mer_1", now)).await, 3);
        // A plan without SMS: refused, nothing taken.
        let r = take("9841000099".into(), 0, now).await;
        assert!(matches!(r, Ok(Taken::QuotaExhausted)), "{r:?}");
        assert_eq!(n(merchant_counter("mer_1", Mode::Live, now)).await, 3);
        let window = store
            .get(&recipient_window("mer_1", Mode::Live, "9841000099"))
            .await;
        assert!(matches!(window, Ok(None)), "{window:?}");
        // Another month starts afresh.
        let next = now.plus(chrono::Duration::days(32));
        let r = take("9841000099".into(), 3, next).await;
        assert!(matches!(r, Ok(Taken::All)), "{r:?}");
    }

    #[tokio::test]
    async fn a_full_hour_is_rate_limited_before_the_quota_is_looked_at() {
        let store = store();
        let now = SystemClock.now();
        let limits = Limits {
            per_recipient_per_day: 3,
            per_merchant_per_hour: 1,
        };
        let take = |phone: &'static str, quota: u32| {
            let store = store.clone();
            async move {
                take_places(
                    &*store,
                    limits,
                    "mer_1",
                    Mode::Live,
                    phone,
                    now,
                    Some(quota),
                    None,
                    None,
                )
                .await
            }
        };
        assert!(matches!(take("9841000001", 5).await, Ok(Taken::All)));
        // Hour full and quota 0: the abuse limit (guard 3) answers.
        let r = take("9841000002", 0).await;
        assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
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
            session_id: None,
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
        state_on(store(), plan, mode).await
    }

    async fn state_on(
        store: Arc<dyn Store>,
        plan: Plan,
        mode: Mode,
    ) -> (AppState, Principal, Arc<ManualClock>) {
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

    async fn session(state: &Deps, who: &Principal, phone: &str) -> String {
        // Ids sort by the wall clock's millisecond: keep them apart.
        tokio::time::sleep(Duration::from_millis(2)).await;
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
        id
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
        let r = notify(&state, &who, bad_host.clone(), base, limits, None).await;
        assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
        session(&state, &who, "+977-9841000001").await;
        // 2 before 3.
        let r = notify(&state, &who, bad_host.clone(), base, limits, None).await;
        assert!(
            matches!(r, Err(SmsError::InvalidCheckoutHost { .. })),
            "{r:?}"
        );
        let r = notify(&state, &who, req(), base, limits, None).await;
        assert!(
            matches!(&r, Ok(o) if o.status == "logged" && !o.sent),
            "{r:?}"
        );
        let r = notify(&state, &who, req(), base, limits, None).await;
        assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
        // Bad host still answers 400 over the exhausted limit.
        let r = notify(&state, &who, bad_host, base, limits, None).await;
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
            None,
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
            None,
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
            None,
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

    /// A provider on loopback answering `status` to every send, counting
    /// the sends; `None` answers nothing at all (holds the connection).
    async fn provider(status: Option<u16>) -> (SmsClient, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let app = axum::Router::new().fallback(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                match status {
                    Some(s) => http::StatusCode::from_u16(s)
                        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
                    None => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        http::StatusCode::OK
                    }
                }
            }
        });
        let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
            panic!("bind")
        };
        let Ok(addr) = listener.local_addr() else {
            panic!("addr")
        };
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = match SmsClient::new(crate::providers::sms::SmsConfig {
            base_url: format!("http://{addr}"),
            token: "t".into(),
            from: "Dhukuti".into(),
            timeout: Duration::from_millis(300),
        }) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        (client, calls)
    }

    fn calls(c: &std::sync::atomic::AtomicUsize) -> usize {
        c.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A live reminder queued the way `notify` does (its quota unit taken),
    /// bound to a fresh pending session of `who`.
    async fn queued_reminder(state: &Deps, who: &Principal) -> SmsReminder {
        let now = state.clock.now();
        let session_id = session(state, who, "9841000001").await;
        assert!(matches!(
            reserve_quota(&*state.store, &who.merchant.id, 200, now).await,
            Ok(true)
        ));
        let r = SmsReminder {
            id: new_id(IdKind::Sms),
            project_id: who.project_id().to_owned(),
            merchant_id: who.merchant.id.clone(),
            mode: Mode::Live,
            to: "9841000001".into(),
            text: "hi".into(),
            session_id: Some(session_id),
            status: SmsStatus::Queued,
            attempts: 0,
            lease_until_ms: None,
            last_error: None,
            created_at: now,
            updated_at: now,
        };
        if let Err(e) = put_new(&*state.store, &r).await {
            panic!("{e}")
        }
        r
    }

    async fn quota_used(state: &Deps, who: &Principal) -> i64 {
        let now = state.clock.now();
        state
            .store
            .get(&quota_counter(&who.merchant.id, now))
            .await
            .ok()
            .flatten()
            .and_then(|i| i.get("n").and_then(|v| v.as_i64()))
            .unwrap_or(0)
    }

    async fn status_of(state: &Deps, id: &str) -> SmsReminder {
        match get(&*state.store, id).await {
            Ok(Some(r)) => r,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_claimed_reminder_is_never_sent_twice_even_after_its_lease_runs_out() {
        let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(200)).await;
        let mut r = queued_reminder(&state, &who).await;
        // A dispatcher claimed it (and may have sent it), then stopped.
        let lease_until = clock.now().unix_millis() + 60_000;
        let Ok(_) = state
            .store
            .update(
                &SmsReminder::key(&r.id),
                Update::new()
                    .set("status", "sending")
                    .set("lease_until_ms", lease_until),
                None,
            )
            .await
        else {
            panic!("claim")
        };
        r.lease_until_ms = Some(lease_until);
        // While it holds the lease, a duplicate message sends nothing.
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
        // After the lease: it may have gone out, so it is not sent again.
        clock.advance(chrono::Duration::seconds(61));
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Unknown)), "{d:?}");
        let got = status_of(&state, &r.id).await;
        assert_eq!(got.status, SmsStatus::Unknown);
        assert!(got.lease_until_ms.is_none());
        assert_eq!(calls(&sent), 0, "never sent a second time");
        // Its quota unit is kept (it may have been delivered and billed).
        assert_eq!(quota_used(&state, &who).await, 1);
        // Final: every later message is dropped, the sweep leaves it.
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
        let later = clock.now().plus(chrono::Duration::minutes(30));
        assert_eq!(requeue_stuck(&state, later, 10).await.ok(), Some(0));
        assert_eq!(calls(&sent), 0);
    }

    #[tokio::test]
    async fn a_send_that_may_have_reached_the_provider_is_never_retried() {
        for answer in [Some(500), Some(502), Some(504), None] {
            let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
            let (client, sent) = provider(answer).await;
            let r = queued_reminder(&state, &who).await;
            let d = dispatch(&state, &client, &r.id, LEASE).await;
            assert!(
                matches!(d, Ok(DispatchOutcome::Unknown)),
                "{answer:?}: {d:?}"
            );
            let got = status_of(&state, &r.id).await;
            assert_eq!(got.status, SmsStatus::Unknown, "{answer:?}");
            assert_eq!(got.attempts, 1);
            // The queue redelivers, the sweep runs: nothing more is sent.
            let d = dispatch(&state, &client, &r.id, LEASE).await;
            assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
            assert_eq!(calls(&sent), 1, "{answer:?}: one send, never two");
            assert_eq!(quota_used(&state, &who).await, 1, "kept: it may be billed");
        }
    }

    #[tokio::test]
    async fn a_send_that_certainly_did_not_arrive_is_retried_then_given_up_with_the_unit_back() {
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(503)).await;
        let r = queued_reminder(&state, &who).await;
        for attempt in 1..MAX_ATTEMPTS {
            let d = dispatch(&state, &client, &r.id, LEASE).await;
            assert!(matches!(d, Err(DispatchError::Transient(_))), "{d:?}");
            let got = status_of(&state, &r.id).await;
            assert_eq!((got.status, got.attempts), (SmsStatus::Queued, attempt));
        }
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
        assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Failed);
        assert_eq!(calls(&sent) as u32, MAX_ATTEMPTS);
        assert_eq!(quota_used(&state, &who).await, 0, "the unit is given back");
        // Once: a duplicate message gives nothing back a second time.
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
        assert_eq!(quota_used(&state, &who).await, 0);
    }

    #[tokio::test]
    async fn a_refused_reminder_fails_at_once_and_gives_its_unit_back() {
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(400)).await;
        // Another reminder's unit stays taken.
        assert!(matches!(
            reserve_quota(&*state.store, &who.merchant.id, 200, state.clock.now()).await,
            Ok(true)
        ));
        let r = queued_reminder(&state, &who).await;
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
        assert_eq!(calls(&sent), 1);
        assert_eq!(quota_used(&state, &who).await, 1);
    }

    #[tokio::test]
    async fn a_reminder_ending_after_its_month_counter_expired_still_ends_and_makes_no_counter() {
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(400)).await;
        let r = queued_reminder(&state, &who).await;
        // The month's counter is gone (its TTL ran out) before the end.
        let counter = quota_counter(&who.merchant.id, r.created_at);
        if let Err(e) = state.store.delete(&counter, None).await {
            panic!("{e}")
        }
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
        assert_eq!(calls(&sent), 1);
        assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Failed);
        // Nothing to give back to: no counter made, certainly not at -1.
        assert!(matches!(state.store.get(&counter).await, Ok(None)));
    }

    #[tokio::test]
    async fn a_reminder_for_a_session_paid_meanwhile_is_cancelled_unsent() {
        let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(200)).await;
        let r = queued_reminder(&state, &who).await;
        let Some(session_id) = r.session_id.clone() else {
            panic!("bound")
        };
        let Ok(_) = state
            .store
            .update(
                &CheckoutSession::key(&session_id),
                Update::new().set("status", "success"),
                None,
            )
            .await
        else {
            panic!("pay")
        };
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Cancelled)), "{d:?}");
        let got = status_of(&state, &r.id).await;
        assert_eq!(got.status, SmsStatus::Cancelled);
        assert!(
            got.last_error
                .as_deref()
                .is_some_and(|e| e.contains("success")),
            "{got:?}"
        );
        assert_eq!(calls(&sent), 0);
        assert_eq!(quota_used(&state, &who).await, 0);
        // An expired session cancels too.
        let r = queued_reminder(&state, &who).await;
        clock.advance(chrono::Duration::hours(2));
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Cancelled)), "{d:?}");
        assert_eq!(calls(&sent), 0);
        // A payable one is sent.
        let r = queued_reminder(&state, &who).await;
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
        assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Sent);
        assert_eq!(calls(&sent), 1);
    }

    #[tokio::test]
    async fn concurrent_copies_of_one_message_send_once() {
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(200)).await;
        let r = queued_reminder(&state, &who).await;
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (state, client, id) = (state.clone(), client.clone(), r.id.clone());
                tokio::spawn(async move { dispatch(&state, &client, &id, LEASE).await })
            })
            .collect();
        let mut sends = 0;
        for t in tasks {
            if matches!(t.await, Ok(Ok(DispatchOutcome::Sent))) {
                sends += 1;
            }
        }
        assert_eq!((sends, calls(&sent)), (1, 1));
    }

    #[tokio::test]
    async fn the_recipient_limit_is_a_rolling_24_hours() {
        let store = store();
        let limits = Limits {
            per_recipient_per_day: 3,
            per_merchant_per_hour: 100,
        };
        // 22:00 UTC: a fixed day would reset at midnight, two hours later.
        let Some(t0) = chrono::DateTime::from_timestamp(1_795_298_400, 0) else {
            panic!("time")
        };
        let t0 = Timestamp::from_datetime(t0);
        let at = |mins: i64| t0.plus(chrono::Duration::minutes(mins));
        let take = |when: Timestamp| {
            let store = store.clone();
            async move {
                take_abuse_limits(&*store, limits, "mer_1", Mode::Live, "9841000001", when).await
            }
        };
        for m in [0, 60, 90] {
            assert!(take(at(m)).await.is_ok(), "{m}");
        }
        // Past midnight: still three in the last 24 h.
        match take(at(180)).await {
            Err(SmsError::RateLimited {
                retry_after_secs, ..
            }) => assert_eq!(retry_after_secs, (24 * 60 - 180) * 60),
            other => panic!("{other:?}"),
        }
        // 24 h after the first, one place is free again; then full again.
        assert!(take(at(24 * 60 + 1)).await.is_ok());
        assert!(matches!(
            take(at(24 * 60 + 2)).await,
            Err(SmsError::RateLimited { .. })
        ));
        // Another recipient, another window.
        assert!(
            take_abuse_limits(&*store, limits, "mer_1", Mode::Live, "9841000002", at(181))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_url_naming_a_session_binds_the_reminder_to_it() {
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
        let (_, other, _) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
        let base = "https://pay.example";
        let mine = session(&state, &who, "9841000001").await;
        let newer = session(&state, &who, "9841000001").await;
        let not_theirs = session(&state, &who, "9841000009").await;
        // Another project's session on the same store.
        let foreign = session(&state, &other, "9841000001").await;
        let with_url = |id: &str| NotifyRequest {
            checkout_url: format!("{base}/c/{id}?lang=ne"),
            ..req()
        };
        let r = notify(&state, &who, with_url(&mine), base, Limits::default(), None).await;
        assert!(matches!(&r, Ok(o) if o.status == "logged"), "{r:?}");
        let Ok(list) = list_recent(&*state.store, who.project_id(), Mode::Sandbox, 10).await else {
            panic!("list")
        };
        assert_eq!(list[0].session_id.as_deref(), Some(mine.as_str()));
        // A URL without a session id binds to the newest pending session.
        let r = notify(&state, &who, req(), base, Limits::default(), None).await;
        assert!(r.is_ok(), "{r:?}");
        let Ok(list) = list_recent(&*state.store, who.project_id(), Mode::Sandbox, 10).await else {
            panic!("list")
        };
        assert_eq!(list[0].session_id.as_deref(), Some(newer.as_str()));
        // The project's session of another customer: guard 1 refuses.
        let r = notify(
            &state,
            &who,
            with_url(&not_theirs),
            base,
            Limits::default(),
            None,
        )
        .await;
        assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
        // Another project's session: guard 2 refuses.
        let r = notify(
            &state,
            &who,
            with_url(&foreign),
            base,
            Limits::default(),
            None,
        )
        .await;
        assert!(
            matches!(&r, Err(SmsError::ForeignCheckoutSession { session_id }) if *session_id == foreign),
            "{r:?}"
        );
        let b = "https://pay.example";
        assert_eq!(
            session_in_url("https://pay.example/c/cs_01ab/pay", b),
            Some("cs_01ab")
        );
        assert_eq!(
            session_in_url("https://pay.example/c/cs_01ab?x=1", b),
            Some("cs_01ab")
        );
        assert_eq!(session_in_url("https://pay.example/l/lnk_1", b), None);
        assert_eq!(session_in_url("https://pay.example/c/x_1", b), None);
        assert_eq!(session_in_url("https://pay.example", b), None);
        // A query or fragment never names a session.
        assert_eq!(session_in_url("https://pay.example?x=/c/cs_01ab", b), None);
        assert_eq!(session_in_url("https://pay.example#/c/cs_01ab", b), None);
        // Under a base URL with a path.
        let b = "https://x.example/pay/";
        assert_eq!(
            session_in_url("https://x.example/pay/c/cs_01ab", b),
            Some("cs_01ab")
        );
        assert_eq!(session_in_url("https://x.example/c/cs_01ab", b), None);
    }

    #[tokio::test]
    async fn a_conflict_while_ending_a_reminder_is_retried_and_the_unit_comes_back() {
        use crate::store::faults::{Fault, FaultyStore, Op};
        let faulty = Arc::new(FaultyStore::new(store()));
        let (state, who, _) = state_on(faulty.clone(), Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(400)).await;
        let r = queued_reminder(&state, &who).await;
        // Many reminders of the merchant end at once: the first give-back
        // meets another transaction on the quota item.
        faulty.plan(
            Op::Transact,
            0,
            Fault::Before(StoreError::TransactionCanceled {
                reasons: vec![TxReason::None, TxReason::Conflict],
            }),
        );
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
        assert_eq!(faulty.injected(), 1);
        assert_eq!(calls(&sent), 1);
        assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Failed);
        assert_eq!(
            quota_used(&state, &who).await,
            0,
            "given back after the retry"
        );
    }

    #[tokio::test]
    async fn a_store_error_before_the_send_gives_the_claim_back() {
        use crate::store::faults::{Fault, FaultyStore, Op};
        let faulty = Arc::new(FaultyStore::new(store()));
        let (state, who, _) = state_on(faulty.clone(), Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(200)).await;
        let r = queued_reminder(&state, &who).await;
        // Reads: the reminder, then its session (throttled).
        faulty.plan(Op::Get, 1, Fault::throttled());
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Err(DispatchError::Store(_))), "{d:?}");
        assert_eq!(faulty.injected(), 1);
        let got = status_of(&state, &r.id).await;
        assert_eq!(
            (got.status, got.attempts),
            (SmsStatus::Queued, 0),
            "{got:?}"
        );
        assert!(got.lease_until_ms.is_none());
        assert_eq!(calls(&sent), 0);
        // The queue's next delivery sends it (not `unknown`).
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
        assert_eq!(calls(&sent), 1);
    }

    #[tokio::test]
    async fn a_busy_store_after_the_send_is_retried_so_the_outcome_is_kept() {
        use crate::store::faults::{Fault, FaultyStore, Op};
        let faulty = Arc::new(FaultyStore::new(store()));
        let (state, who, _) = state_on(faulty.clone(), Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(Some(200)).await;
        let r = queued_reminder(&state, &who).await;
        // Updates: the claim, then the `sent` write (throttled twice).
        faulty.plan(Op::Update, 1, Fault::throttled());
        faulty.plan(Op::Update, 2, Fault::throttled());
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
        assert_eq!(faulty.injected(), 2);
        assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Sent);
        assert_eq!(calls(&sent), 1);
    }

    /// A queue that is down for sends (receives from the inner one).
    struct DownForSends(Arc<dyn crate::queue::Queue>);

    #[async_trait::async_trait]
    impl crate::queue::Queue for DownForSends {
        async fn send(&self, _: QueueName, _: &str, _: Duration) -> Result<String, QueueError> {
            Err(QueueError::Unavailable("injected".into()))
        }
        async fn receive(
            &self,
            queue: QueueName,
            max: usize,
            wait: Duration,
            visibility: Duration,
        ) -> Result<Vec<crate::queue::Message>, QueueError> {
            self.0.receive(queue, max, wait, visibility).await
        }
        async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError> {
            self.0.delete(queue, receipt).await
        }
    }

    #[tokio::test]
    async fn a_reminder_the_queue_refused_is_answered_queued_and_swept_later() {
        let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let working = state.queue.clone();
        let down = state
            .clone()
            .with_queue(Arc::new(DownForSends(working.clone())));
        session(&down, &who, "9841000001").await;
        let r = notify(
            &down,
            &who,
            req(),
            "https://pay.example",
            Limits::default(),
            None,
        )
        .await;
        // Stored and counted: it will go out, so the answer says queued.
        assert!(
            matches!(&r, Ok(o) if o.status == "queued" && o.sent),
            "{r:?}"
        );
        assert_eq!(quota_used(&state, &who).await, 1);
        let Ok(list) = list_recent(&*state.store, who.project_id(), Mode::Live, 10).await else {
            panic!("list")
        };
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].status, SmsStatus::Queued);
        // The backstop queues it once it is overdue.
        let later = clock.now().plus(chrono::Duration::minutes(6));
        assert_eq!(requeue_stuck(&state, later, 10).await.ok(), Some(1));
        let got = working
            .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
            .await;
        assert!(
            matches!(got.as_deref(), Ok([m]) if m.body.contains(&list[0].id)),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn a_full_hour_under_endless_conflicts_is_still_a_429() {
        use crate::store::faults::{Fault, FaultyStore, Op};
        let faulty = Arc::new(FaultyStore::new(store()));
        let now = SystemClock.now();
        let limits = Limits {
            per_recipient_per_day: 3,
            per_merchant_per_hour: 2,
        };
        let hour = merchant_counter("mer_1", Mode::Live, now);
        let Ok(_) = faulty.update(&hour, Update::new().add("n", 2), None).await else {
            panic!("seed")
        };
        for i in 0..WINDOW_TRIES {
            faulty.plan(
                Op::Transact,
                i,
                Fault::Before(StoreError::TransactionCanceled {
                    reasons: vec![TxReason::None, TxReason::Conflict],
                }),
            );
        }
        let r = take_places(
            &*faulty,
            limits,
            "mer_1",
            Mode::Live,
            "9841000001",
            now,
            Some(10),
            None,
            None,
        )
        .await;
        assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
        // Under the limit, the same conflicts are a busy store (503).
        let calm = store();
        let faulty = Arc::new(FaultyStore::new(calm));
        for i in 0..WINDOW_TRIES {
            faulty.plan(
                Op::Transact,
                i,
                Fault::Before(StoreError::TransactionCanceled {
                    reasons: vec![TxReason::None, TxReason::Conflict],
                }),
            );
        }
        let r = take_places(
            &*faulty,
            limits,
            "mer_1",
            Mode::Live,
            "9841000001",
            now,
            Some(10),
            None,
            None,
        )
        .await;
        assert!(
            matches!(r, Err(SmsError::Store(StoreError::Unavailable(_)))),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn an_unreadable_reminder_is_passed_over_then_taken_out_of_the_sweep() {
        let (state, _, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let id = new_id(IdKind::Sms);
        let item = json!({"pk": format!("SMS#{id}"), "sk": "SMS",
                          "gsi2pk": open_partition(&id), "gsi2sk": format!("{:015}#{id}", 1),
                          "status": "teleported"});
        let Some(item) = item.as_object().cloned() else {
            panic!()
        };
        let Ok(()) = state.store.put(item, None).await else {
            panic!("put")
        };
        let now = clock.now();
        assert_eq!(requeue_stuck(&state, now, 10).await.ok(), Some(0));
        let kept = state.store.get(&SmsReminder::key(&id)).await;
        assert!(
            matches!(&kept, Ok(Some(i)) if i.contains_key("gsi2pk")),
            "young: kept for newer code"
        );
        let later = now.plus(chrono::Duration::hours(2));
        assert_eq!(requeue_stuck(&state, later, 10).await.ok(), Some(0));
        let out = state.store.get(&SmsReminder::key(&id)).await;
        assert!(
            matches!(&out, Ok(Some(i)) if !i.contains_key("gsi2pk")),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn a_retry_whose_first_run_took_the_last_place_answers_as_the_first() {
        use crate::store::fence::Fence;
        let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
        session(&state, &who, "9841000001").await;
        let limits = Limits {
            per_recipient_per_day: 1,
            per_merchant_per_hour: 100,
        };
        let ttl = clock.now().unix_seconds() + 86_400;
        let fence = Fence::new(Key::new("IDEMFENCE#p#sandbox#k1", "FENCE"), ttl);
        let base = "https://pay.example";
        let r = notify(&state, &who, req(), base, limits, Some(&fence)).await;
        assert!(matches!(&r, Ok(o) if o.status == "logged"), "{r:?}");
        // Its answer was lost; the retry finds the window full (with its
        // own first run) and answers as the first run did.
        let r = notify(&state, &who, req(), base, limits, Some(&fence)).await;
        assert!(matches!(&r, Ok(o) if o.status == "logged"), "{r:?}");
        let Ok(list) = list_recent(&*state.store, who.project_id(), Mode::Sandbox, 10).await else {
            panic!("list")
        };
        assert_eq!(list.len(), 1, "one reminder");
        // Another request (another key) is refused.
        let other = Fence::new(Key::new("IDEMFENCE#p#sandbox#k2", "FENCE"), ttl);
        let r = notify(&state, &who, req(), base, limits, Some(&other)).await;
        assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
    }
}
