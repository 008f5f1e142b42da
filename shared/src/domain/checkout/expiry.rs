//! Expiry: the open-sessions index, expiring one session or every due one,
//! and listing with the status as of now.

use serde::{Deserialize, Serialize};

use super::sessions::{CheckoutSession, SessionStatus, failed_at, find_at};
use super::stats;
use crate::app::Deps;
use crate::domain::listing::counted;
use crate::domain::record::{Changes, from_item};
use crate::domain::{Tenant, Window};
use crate::ids::{LinkId, SessionId, TypedId};
use crate::keys;
use crate::store::{Cond, Index, Query, SkCond, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

fn open_cond() -> Cond {
    CheckoutSession::STATUS.is_in(&[SessionStatus::Pending, SessionStatus::Initiated])
}

/// Moves an open session to `expired`; when `only_if_due`, only once its
/// `expires_at` passed. A session that is no longer open (or not yet due)
/// is answered as stored.
///
/// One transaction: the session (conditioned on the status it was read
/// with), its project's session counters, and the link use it gives back.
/// A session that moved meanwhile is read again and tried again.
pub(super) async fn mark_expired(
    store: &dyn Store,
    id: &SessionId,
    known: Option<&CheckoutSession>,
    now: Timestamp,
    only_if_due: bool,
) -> Result<CheckoutSession, StoreError> {
    let key = CheckoutSession::key(id);
    let mut read = known.cloned();
    // Set when the link the session holds a use of is gone (deleted):
    // the session expires without giving the use back.
    let mut link_gone = false;
    for attempt in 0..8usize {
        let current = match read.take() {
            Some(s) => s,
            None => match crate::domain::record::get::<CheckoutSession>(store, &key).await? {
                Some(s) => s,
                None => return Err(StoreError::Backend(format!("session {id} vanished"))),
            },
        };
        if current.status.is_final() || (only_if_due && now < current.expires_at) {
            return Ok(current);
        }
        let mut conds = vec![Cond::Exists, CheckoutSession::STATUS.eq(&current.status)];
        if only_if_due {
            conds.push(CheckoutSession::EXPIRES_AT.le(&now));
        }
        let update = Changes::<CheckoutSession>::new()
            .set(CheckoutSession::STATUS, &SessionStatus::Expired)
            .set(CheckoutSession::UPDATED_AT, &now)
            .unindex(Index::Gsi2);
        let mut ops = vec![TxOp::Update {
            key: key.clone(),
            update: update.into(),
            cond: Some(Cond::And(conds)),
        }];
        // A session holding one of its link's uses gives it back as it ends.
        let releases = current.link_claimed && current.link_id.is_some() && !link_gone;
        if releases {
            if let Some(link) = &current.link_id {
                ops.push(release_link_use(link));
            }
        }
        let mut tally = stats::Tally::new();
        tally.session_moved(&current, current.status, SessionStatus::Expired);
        tally.apply_to(&mut ops)?;
        match store.transact(ops).await {
            Ok(()) => {
                let mut done = current;
                done.status = SessionStatus::Expired;
                done.updated_at = now;
                return Ok(done);
            }
            // Moved meanwhile (paid, another attempt): read it again.
            Err(e) if failed_at(&e, 0) => {}
            Err(e) if releases && failed_at(&e, 1) => {
                tracing::warn!(session = %id, "the link of an expiring session is gone: its use is not given back");
                link_gone = true;
                read = Some(current);
            }
            // Busy (the link or the counters are being written).
            Err(StoreError::TransactionCanceled { reasons })
                if !reasons.contains(&TxReason::ConditionFailed) =>
            {
                read = Some(current);
            }
            Err(e) => return Err(e),
        }
        crate::store::contention_backoff(attempt).await;
    }
    Err(StoreError::Unavailable(format!("session {id} is busy")))
}

/// The sweep partitions of open records (`gsi2`), spread so no single
/// partition takes every write.
pub const OPEN_SHARDS: u32 = 4;
const OPEN_SESSIONS: keys::Open = keys::Open::Sessions;

/// The open-records partition of `id` under `prefix`.
pub(crate) fn open_partition<T: TypedId>(what: keys::Open, id: &T) -> String {
    keys::open(what, keys::shard_of(id.as_str(), OPEN_SHARDS))
}

/// Every open-records partition under `prefix`.
pub(crate) fn open_partitions(what: keys::Open) -> Vec<String> {
    (0..OPEN_SHARDS).map(|s| keys::open(what, s)).collect()
}

/// The `gsi2` partition of a project's open sessions, by `expires_at`:
/// the sweep finds it through [`crate::domain::active`], and `GET /v1/sessions`
/// counts the ones past their time in it.
pub(super) fn open_sessions_partition(tenant: &Tenant) -> String {
    keys::open_per_project(OPEN_SESSIONS, &tenant.project, tenant.mode)
}

/// Open sessions whose time has passed at `now`, oldest first: at most
/// `limit` of each project in `active` (one project's backlog never holds
/// up another's), then at most `limit` per partition of the former,
/// global layout (sessions written before the per-project index).
pub async fn due_for_expiry(
    store: &dyn Store,
    active: &[crate::domain::active::Active],
    now: Timestamp,
    limit: usize,
) -> Result<Vec<SessionId>, StoreError> {
    let partitions = active
        .iter()
        .map(|a| open_sessions_partition(&Tenant::new(a.project_id.clone(), a.mode)))
        .chain(open_partitions(OPEN_SESSIONS));
    let mut ids = Vec::new();
    for pk in partitions {
        let query = Query::partition(pk)
            .on(Index::Gsi2)
            .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())))
            .limit(limit);
        for item in store.query(&query).await?.items {
            match from_item::<CheckoutSession>(item) {
                Ok(s) => ids.push(s.id),
                Err(e) => tracing::warn!(error = %e, "unreadable open session passed over"),
            }
        }
    }
    Ok(ids)
}

/// Whether the project has any open session indexed (the sweep retires an
/// idle registry entry only when it has none).
pub async fn has_open_sessions(store: &dyn Store, tenant: &Tenant) -> Result<bool, StoreError> {
    let query = Query::partition(open_sessions_partition(tenant))
        .on(Index::Gsi2)
        .limit(1);
    Ok(!store.query(&query).await?.items.is_empty())
}

/// Stores a due session as expired (the scheduler's part of lazy expiry).
/// Whether this call moved it.
pub async fn expire_due(
    store: &dyn Store,
    id: &SessionId,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let s = mark_expired(store, id, None, now, true).await?;
    Ok(s.status == SessionStatus::Expired && s.updated_at == now)
}

/// `POST /v1/checkout/{id}/expire`: `pending|initiated` -> `expired`; a
/// final session is answered unchanged. `None` when not found.
pub async fn expire(
    deps: &Deps,
    tenant: &Tenant,
    id: &SessionId,
) -> Result<Option<CheckoutSession>, StoreError> {
    expire_in(&*deps.store, tenant, id, deps.clock.now()).await
}

/// [`expire`] on a store as of `now`.
pub(crate) async fn expire_in(
    store: &dyn Store,
    tenant: &Tenant,
    id: &SessionId,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    let Some(session) = find_at(store, tenant, id, now).await? else {
        return Ok(None);
    };
    if session.status.is_final() {
        return Ok(Some(session));
    }
    mark_expired(store, &session.id, Some(&session), now, false)
        .await
        .map(Some)
}

/// The list filter for `status` as of `now`: stored statuses, with open
/// sessions past their time counted as expired.
fn status_filter(status: SessionStatus, now: Timestamp) -> Cond {
    let stored = CheckoutSession::STATUS.eq(&status);
    match status {
        SessionStatus::Pending | SessionStatus::Initiated => {
            Cond::And(vec![stored, CheckoutSession::EXPIRES_AT.gt(&now)])
        }
        SessionStatus::Expired => Cond::Or(vec![
            stored,
            Cond::And(vec![open_cond(), CheckoutSession::EXPIRES_AT.le(&now)]),
        ]),
        SessionStatus::Success | SessionStatus::Failed => stored,
    }
}

/// A page of the project's sessions in `mode`, newest first, optionally of
/// one status (as of `now`), and the total. Lists show lazy expiry without
/// writing it (a read of the one session persists it).
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    status: Option<SessionStatus>,
    now: Timestamp,
    window: Window,
) -> Result<(Vec<CheckoutSession>, u64), StoreError> {
    list_in(&*deps.store, tenant, status, now, window).await
}

/// [`list`] on a store.
pub(crate) async fn list_in(
    store: &dyn Store,
    tenant: &Tenant,
    status: Option<SessionStatus>,
    now: Timestamp,
    window: Window,
) -> Result<(Vec<CheckoutSession>, u64), StoreError> {
    let mut query = Query::partition(CheckoutSession::list_partition(tenant))
        .on(Index::Gsi1)
        .backward();
    if let Some(s) = status {
        query = query.filter(status_filter(s, now));
    }
    // Unfiltered and counted: any offset at a bounded cost.
    if status.is_none() && counted::covered(store, tenant, counted::CountedKind::Sessions).await? {
        let list = CheckoutSession::counted_list_of(tenant);
        let (sessions, total, _) = counted::page(store, &list, &window, true).await?;
        return Ok((sessions, total));
    }
    let Some(totals) = stats::session_totals(store, tenant).await? else {
        // A project from before the counters: counted the old way.
        return crate::domain::record::page_of(store, &query, window).await;
    };
    let items = window.read(store, &query).await?;
    let sessions = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<CheckoutSession>, _>>()?;
    let total = match status {
        None => totals.total,
        Some(s @ (SessionStatus::Success | SessionStatus::Failed)) => totals.stored(s),
        // Lazy expiry: open sessions past their time are listed as
        // expired. They are the ones still in the project's open index
        // with `expires_at <= now` (the sweep stores them within a minute
        // or so), counted with a key-range query.
        Some(s @ (SessionStatus::Pending | SessionStatus::Initiated)) => {
            totals.stored(s) - overdue(store, tenant, Some(s), now).await?
        }
        // Every session in the open index past its time is pending or
        // initiated: one count.
        Some(SessionStatus::Expired) => {
            totals.stored(SessionStatus::Expired) + overdue(store, tenant, None, now).await?
        }
    };
    Ok((sessions, u64::try_from(total.max(0)).unwrap_or(0)))
}

/// Open sessions of the project whose time passed, stored as `status`
/// (any open one when `None`).
async fn overdue(
    store: &dyn Store,
    tenant: &Tenant,
    status: Option<SessionStatus>,
    now: Timestamp,
) -> Result<i64, StoreError> {
    let mut query = Query::partition(open_sessions_partition(tenant))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())));
    if let Some(status) = status {
        query = query.filter(CheckoutSession::STATUS.eq(&status));
    }
    Ok(i64::try_from(store.count(&query).await?).unwrap_or(i64::MAX))
}

/// The part of a payment link's item a session holds a share of: its
/// claimed uses (the link's own `claimed` field). Declared here, as a view
/// of the link's item, because `links` builds on `checkout`, not the
/// reverse; `links`' tests hold the two declarations to one attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkUses {
    #[serde(default)]
    pub claimed: i64,
}

crate::attrs! { LinkUses {
    CLAIMED: i64 = claimed,
} }

/// Gives back the use of its payment link that an unpaid session held (the
/// session ended): the link record's claimed count ([`LinkUses`]).
pub fn release_link_use(link_id: &LinkId) -> TxOp {
    TxOp::Update {
        key: keys::record(keys::Record::PaymentLink, link_id),
        update: Changes::<LinkUses>::new()
            .subtract(LinkUses::CLAIMED, 1)
            .into(),
        cond: Some(Cond::Exists),
    }
}
