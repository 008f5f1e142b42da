//! The guards, in order: a pending session for the recipient, the checkout
//! host, and the abuse limits and plan quota taken in one transaction.

use serde_json::json;

use super::request::{first_id_at, normalize_phone};
use super::{Limits, SESSION_PAGE, SESSION_PAGES, SESSION_WINDOW_HOURS, SmsError};
use crate::domain::Mode;
use crate::domain::checkout::{CheckoutSession, SessionStatus};
use crate::domain::record::from_item;
use crate::ids::IdKind;
use crate::keys;
use crate::store::{
    Cond, Index, Key, Query, SkCond, Store, StoreError, TTL, TxOp, TxReason, Update,
};
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
pub(super) async fn pending_session(
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
pub(super) fn recipient_window(merchant_id: &str, mode: Mode, phone: &str) -> Key {
    keys::sms_recipient(merchant_id, mode, phone)
}

/// The recipient window's length.
const RECIPIENT_WINDOW_MS: i64 = 24 * 3_600_000;
/// Tries of the recipient window's versioned write before giving up.
pub(super) const WINDOW_TRIES: usize = 12;

/// The merchant's fixed-hour counter.
pub(super) fn merchant_counter(merchant_id: &str, mode: Mode, now: Timestamp) -> Key {
    let hour = now.unix_seconds().div_euclid(3600);
    keys::sms_hour(merchant_id, mode, hour)
}

/// The merchant's live quota counter of the UTC month of `now`.
pub fn quota_counter(merchant_id: &str, now: Timestamp) -> Key {
    keys::sms_quota(merchant_id, &now.datetime().format("%Y-%m").to_string())
}

/// `n < limit` (a missing counter is 0).
pub(super) fn below(limit: i64) -> Cond {
    Cond::Or(vec![Cond::AttrNotExists("n".into()), Cond::lt("n", limit)])
}

pub(super) fn counter_update(expires: i64) -> Update {
    Update::new().add("n", 1).set(TTL, expires)
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
pub(super) async fn take_places(
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
