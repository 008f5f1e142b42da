//! The guards, in order: a pending session for the recipient, the checkout
//! host, and the abuse limits and plan quota taken in one transaction.

use serde::{Deserialize, Serialize};

use super::request::{first_id_at, normalize_phone};
use super::{Limits, SESSION_PAGE, SESSION_PAGES, SESSION_WINDOW_HOURS, SmsError};
use crate::domain::checkout::{CheckoutSession, SessionStatus};
use crate::domain::record::{self, Changes, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::{IdKind, MerchantId, SessionId};
use crate::keys;
use crate::store::{Cond, Index, Key, Query, SkCond, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

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
pub(super) enum SessionMatch {
    /// The recipient's pending session the reminder is about: the one the
    /// URL names, else the newest one found.
    Found(SessionId),
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
pub(super) async fn pending_session(
    store: &dyn Store,
    tenant: &Tenant,
    phone: &str,
    url_session: Option<&str>,
    now: Timestamp,
) -> Result<SessionMatch, StoreError> {
    let mut foreign = None;
    if let Some(id) = url_session {
        let named = match SessionId::parse(id) {
            Some(sid) => store
                .get(&CheckoutSession::key(&sid))
                .await?
                .and_then(|item| from_item::<CheckoutSession>(item).ok()),
            None => None,
        };
        match named {
            Some(s) if tenant.owns(&s.project_id, s.mode) => {
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
    let mut query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::Sessions,
    ))
    .on(Index::Gsi1)
    .sk(SkCond::Ge(first_id_at(IdKind::CheckoutSession, since)))
    .backward()
    .limit(SESSION_PAGE)
    .filter(CheckoutSession::CUSTOMER_PHONE.exists());
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
pub(super) fn recipient_window(merchant_id: &MerchantId, mode: Mode, phone: &str) -> Key {
    keys::sms_recipient(merchant_id, mode, phone)
}

/// The recipient window's length.
const RECIPIENT_WINDOW_MS: i64 = 24 * 3_600_000;
/// Tries of the recipient window's versioned write before giving up.
pub(super) const WINDOW_TRIES: usize = 12;

/// The merchant's fixed-hour counter.
pub(super) fn merchant_counter(merchant_id: &MerchantId, mode: Mode, now: Timestamp) -> Key {
    let hour = now.unix_seconds().div_euclid(3600);
    keys::sms_hour(merchant_id, mode, hour)
}

/// The merchant's live quota counter of the UTC month of `now`.
pub fn quota_counter(merchant_id: &MerchantId, now: Timestamp) -> Key {
    keys::sms_quota(merchant_id, &now.datetime().format("%Y-%m").to_string())
}

/// A count of reminders: a merchant's in one UTC hour
/// ([`merchant_counter`], stored kind "sms hour count") or its live
/// quota used in one UTC month ([`quota_counter`], "sms month quota").
/// Changed only by `ADD` ([`counter_update`]); never written whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsCount {
    /// Its key, as read (written from [`Record::item_key`]).
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    pub n: i64,
    /// Epoch seconds after which the table's TTL expires it (a month's
    /// quota counted before expiry was set has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
}

crate::attrs! { SmsCount {
    N: i64 = n,
    TTL: Option<i64> = ttl,
} }

impl Record for SmsCount {
    fn item_key(&self) -> Key {
        Key::new(self.pk.clone(), self.sk.clone())
    }
}

/// `n < limit` (a missing counter is 0).
pub(super) fn below(limit: i64) -> Cond {
    Cond::Or(vec![SmsCount::N.missing(), SmsCount::N.lt(&limit)])
}

/// One more, the counter expiring at `expires` (epoch seconds).
pub(super) fn counter_update(expires: i64) -> Changes<SmsCount> {
    Changes::new()
        .add(SmsCount::N, 1)
        .set_some(SmsCount::TTL, &expires)
}

/// What [`take_places`] took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// Both abuse places (and the quota unit, and the reminder written).
    All,
    /// The quota is used up: nothing was taken.
    QuotaExhausted,
    /// The fence tripped: a first run of this request (same
    /// Idempotency-Key) already stored the reminder; nothing more taken.
    AlreadyStored,
}

/// The places one reminder takes (guards 3 and 4): its recipient's in the
/// rolling day and its merchant's in the hour, under `limits`, and, in
/// live mode (`quota`: the plan's monthly quota), a unit of the month's
/// quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Places<'a> {
    pub merchant_id: &'a MerchantId,
    pub mode: Mode,
    /// The recipient, normalized.
    pub phone: &'a str,
    pub now: Timestamp,
    pub quota: Option<u32>,
    pub limits: Limits,
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
pub(super) async fn take_places(
    store: &dyn Store,
    places: Places<'_>,
    record: impl IntoIterator<Item = TxOp>,
    fence: Option<TxOp>,
) -> Result<Taken, SmsError> {
    // The record and its counters.
    let record: Vec<TxOp> = record.into_iter().collect();
    let key = recipient_window(places.merchant_id, places.mode, places.phone);
    for attempt in 0..WINDOW_TRIES {
        let current = record::get::<SmsRecipientWindow>(store, &key).await?;
        let window = RecipientWindow::read(current, places.now);
        window.refuse_when_full(places.limits)?;
        let mut ops = vec![
            window.with_send(&key)?,
            TxOp::Update {
                key: merchant_counter(places.merchant_id, places.mode, places.now),
                update: counter_update(hour_end(places.now) + 86_400).into(),
                cond: Some(below(places.limits.per_merchant_per_hour)),
            },
        ];
        if let Some(quota) = places.quota {
            ops.push(quota_op(places.merchant_id, quota, places.now));
        }
        ops.extend(record.iter().cloned());
        let fence_at = fence.as_ref().map(|op| {
            ops.push(op.clone());
            ops.len() - 1
        });
        match store.transact(ops).await {
            Ok(()) => return Ok(Taken::All),
            Err(StoreError::TransactionCanceled { reasons }) => {
                if let Some(answer) = refused_places(&places, &reasons, fence_at) {
                    return answer;
                }
                // The window moved under us, or a conflicting transaction:
                // read again.
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    still_conflicting(store, &places).await
}

/// Where the quota's operation sits in the places' transaction.
const QUOTA_AT: usize = 2;

/// The end of the UTC hour of `now`, in seconds.
fn hour_end(now: Timestamp) -> i64 {
    (now.unix_seconds().div_euclid(3600) + 1) * 3600
}

/// The merchant's hour is full: until its end.
fn hour_full(places: &Places<'_>) -> SmsError {
    let secs = places.now.unix_seconds();
    SmsError::RateLimited {
        which: format!(
            "at most {} reminders per merchant per hour",
            places.limits.per_merchant_per_hour
        ),
        retry_after_secs: (hour_end(places.now) - secs).max(1),
    }
}

/// The month's quota unit: a conditional `ADD`, or, for a quota of 0, a
/// check that never passes (`n` is never < 0, and a missing `n` fails the
/// comparison).
fn quota_op(merchant_id: &MerchantId, quota: u32, now: Timestamp) -> TxOp {
    let key = quota_counter(merchant_id, now);
    if quota == 0 {
        TxOp::Check {
            key,
            cond: SmsCount::N.lt(&0),
        }
    } else {
        TxOp::Update {
            key,
            update: counter_update(now.unix_seconds() + 40 * 86_400).into(),
            cond: Some(below(i64::from(quota))),
        }
    }
}

/// What a cancelled places' transaction answers, by the operation whose
/// condition failed (`None`: the window moved or a conflict, try again).
fn refused_places(
    places: &Places<'_>,
    reasons: &[TxReason],
    fence_at: Option<usize>,
) -> Option<Result<Taken, SmsError>> {
    let failed = |i: usize| matches!(reasons.get(i), Some(TxReason::ConditionFailed));
    if fence_at.is_some_and(failed) {
        return Some(Ok(Taken::AlreadyStored));
    }
    if failed(1) {
        return Some(Err(hour_full(places)));
    }
    if places.quota.is_some() && failed(QUOTA_AT) && !failed(0) {
        return Some(Ok(Taken::QuotaExhausted));
    }
    None
}

/// Still conflicting after every try (hot counters under a burst): a full
/// hour or quota is still a 429 / plan_limit_reached, not a busy store.
async fn still_conflicting(store: &dyn Store, places: &Places<'_>) -> Result<Taken, SmsError> {
    let count = |key: Key| async move {
        record::get::<SmsCount>(store, &key)
            .await
            .map(|c| c.map(|c| c.n))
    };
    let hour = merchant_counter(places.merchant_id, places.mode, places.now);
    if count(hour).await?.unwrap_or(0) >= places.limits.per_merchant_per_hour {
        return Err(hour_full(places));
    }
    if let Some(quota) = places.quota {
        let month = quota_counter(places.merchant_id, places.now);
        if count(month).await?.unwrap_or(0) >= i64::from(quota) {
            return Ok(Taken::QuotaExhausted);
        }
    }
    Err(SmsError::Store(StoreError::Unavailable(
        "SMS limits are busy; retry".into(),
    )))
}

/// The recipient's window as stored (kind "sms recipient window"): the
/// times (ms) of the reminders sent to a recipient in the last 24 h, and a
/// version every write is conditioned on (written whole, at the next
/// version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsRecipientWindow {
    /// Its key, as read (written from [`Record::item_key`]).
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    pub sent_ms: Vec<i64>,
    pub v: i64,
    /// Epoch seconds after which the table's TTL expires it.
    pub ttl: i64,
}

crate::attrs! { SmsRecipientWindow {
    SENT_MS: Vec<i64> = sent_ms,
    V: i64 = v,
    TTL: i64 = ttl,
} }

impl Record for SmsRecipientWindow {
    fn item_key(&self) -> Key {
        Key::new(self.pk.clone(), self.sk.clone())
    }
}

/// The recipient's window as read: its version and the times (ms) of its
/// reminders in the last 24 h, oldest first.
struct RecipientWindow {
    version: Option<i64>,
    recent: Vec<i64>,
    now_ms: i64,
}

impl RecipientWindow {
    fn read(current: Option<SmsRecipientWindow>, now: Timestamp) -> RecipientWindow {
        let now_ms = now.unix_millis();
        let version = current.as_ref().map(|w| w.v);
        let mut recent: Vec<i64> = current.map(|w| w.sent_ms).unwrap_or_default();
        recent.retain(|t| *t > now_ms - RECIPIENT_WINDOW_MS);
        recent.sort_unstable();
        RecipientWindow {
            version,
            recent,
            now_ms,
        }
    }
    /// Refuses a reminder to a recipient whose day is full: until the
    /// oldest counted reminder is 24 h old, when its place frees.
    fn refuse_when_full(&self, limits: Limits) -> Result<(), SmsError> {
        let (recent, now_ms) = (&self.recent, self.now_ms);
        let room = usize::try_from(limits.per_recipient_per_day).unwrap_or(0);
        if recent.len() < room {
            return Ok(());
        }
        let frees_ms = recent
            .len()
            .checked_sub(room)
            .and_then(|i| recent.get(i))
            .map_or(now_ms + RECIPIENT_WINDOW_MS, |t| t + RECIPIENT_WINDOW_MS);
        Err(SmsError::RateLimited {
            which: format!(
                "at most {} reminders per recipient in 24 hours",
                limits.per_recipient_per_day
            ),
            retry_after_secs: ((frees_ms - now_ms + 999) / 1000).max(1),
        })
    }

    /// The window with this reminder's send added, written on the version
    /// read.
    fn with_send(self, key: &Key) -> Result<TxOp, StoreError> {
        let mut recent = self.recent;
        recent.push(self.now_ms);
        let window = SmsRecipientWindow {
            pk: key.pk.clone(),
            sk: key.sk.clone(),
            sent_ms: recent,
            v: self.version.unwrap_or(0) + 1,
            ttl: (self.now_ms + RECIPIENT_WINDOW_MS) / 1000 + 3600,
        };
        Ok(TxOp::Put {
            item: window.to_item()?,
            cond: Some(match self.version {
                Some(v) => SmsRecipientWindow::V.eq(&v),
                None => Cond::NotExists,
            }),
        })
    }
}
