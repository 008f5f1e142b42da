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
use crate::store::{Cond, Index, Query, Seek, SkCond, Store, StoreError, TxOp, TxReason};
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
        let change = current.status_change(
            SessionStatus::Expired,
            Changes::<CheckoutSession>::new()
                .set(CheckoutSession::UPDATED_AT, &now)
                .unindex(Index::Gsi2),
        );
        let mut conds = vec![Cond::Exists, change.cond];
        if only_if_due {
            conds.push(CheckoutSession::EXPIRES_AT.le(&now));
        }
        let mut ops = vec![TxOp::Update {
            key: key.clone(),
            update: change.changes.into(),
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
        crate::domain::listing::merge_counts(&mut ops, change.also);
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
    // Unfiltered and counted: any offset at a bounded cost.
    if status.is_none() && counted::covered(store, tenant, counted::CountedKind::Sessions).await? {
        let list = CheckoutSession::counted_list_of(tenant);
        let (sessions, total, _) = counted::page(store, &list, &window, true).await?;
        return Ok((sessions, total));
    }
    // By status and narrowed: any offset at a bounded cost.
    if let Some(s) = status {
        if counted::covered_narrowing(store, tenant, counted::Narrowing::SessionsByStatus).await? {
            return by_status(store, tenant, s, now, &window).await;
        }
    }
    let mut query = Query::partition(CheckoutSession::list_partition(tenant))
        .on(Index::Gsi1)
        .backward();
    if let Some(s) = status {
        query = query.filter(status_filter(s, now));
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

/// The most overdue sessions (open, past their time, not yet stored as
/// expired) a status list merges; the sweep stores them within a minute
/// or so, so there are a few. Past it (the sweep far behind) a list of
/// an open or expired status is refused as unavailable for the moment
/// rather than answered wrong.
pub(crate) const MAX_OVERDUE: usize = 1_000;

/// The project's open sessions past their time at `now` (the open index,
/// `expires_at <= now`), newest id first: at most [`MAX_OVERDUE`].
async fn overdue_sessions(
    store: &dyn Store,
    tenant: &Tenant,
    now: Timestamp,
) -> Result<Vec<CheckoutSession>, StoreError> {
    let query = Query::partition(open_sessions_partition(tenant))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())));
    let items = crate::store::query_window(store, &query, 0, MAX_OVERDUE + 1).await?;
    if items.len() > MAX_OVERDUE {
        return Err(StoreError::Unavailable(format!(
            "more than {MAX_OVERDUE} sessions wait to be stored as expired; retry in a minute"
        )));
    }
    let mut found = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<CheckoutSession>, _>>()?;
    // An entry left on a final session (never by the service) is no
    // overdue one.
    found.retain(|s| !s.status.is_final() && s.status_at(now) == SessionStatus::Expired);
    found.sort_by(|a, b| b.id.as_str().cmp(a.id.as_str()));
    found.dedup_by(|a, b| a.id == b.id);
    Ok(found)
}

/// A page of the sessions whose status as of `now` is `status`, and their
/// total, from the narrowings by stored status (exact at any offset):
/// `success`/`failed` are the stored ones; `expired` the stored ones and
/// the overdue ones (O: open, past their time); `pending`/`initiated` the
/// stored ones but the overdue of them. O is read whole (at most
/// [`MAX_OVERDUE`]) and merged with a page of the stored narrowing read
/// `|O|` items wider: see [`merge_union`] and [`merge_difference`].
async fn by_status(
    store: &dyn Store,
    tenant: &Tenant,
    status: SessionStatus,
    now: Timestamp,
    window: &Window,
) -> Result<(Vec<CheckoutSession>, u64), StoreError> {
    let stored = CheckoutSession::by_status(tenant, status);
    if status.is_final() && status != SessionStatus::Expired {
        let (sessions, total, _) = counted::page(store, &stored, window, true).await?;
        return Ok((sessions, total));
    }
    // O first: a session the sweep stores as expired meanwhile is then
    // in both reads (counted once), never in neither.
    let mut overdue = overdue_sessions(store, tenant, now).await?;
    let union = status == SessionStatus::Expired;
    if !union {
        overdue.retain(|s| s.status == status);
    }
    let m = overdue.len();
    let newer = |sort: &str| overdue.iter().filter(|o| o.id.as_str() > sort).count();
    // Where the page starts in the merged list.
    let (k, limit) = match &window.seek {
        Seek::Start => (window.offset, window.limit),
        seek @ (Seek::After(id) | Seek::Before(id)) => {
            let (at, own) = counted::position_of(store, &stored, id).await?;
            let in_o = usize::from(overdue.iter().any(|o| o.id.as_str() == id));
            let (at, own) = if union {
                (at + newer(id), own.max(in_o))
            } else {
                (at.saturating_sub(newer(id)), own.saturating_sub(in_o))
            };
            seek_window_at(seek, at, own, window)
        }
    };
    if limit == 0 {
        // A page before the list's first record: empty, the total still.
        let (_, total) = Box::pin(by_status(store, tenant, status, now, &Window::at(0, 1))).await?;
        return Ok((Vec::new(), total));
    }
    let from = if union { k.saturating_sub(m) } else { k };
    let (read, total, _) = counted::page::<CheckoutSession>(
        store,
        &stored,
        &Window::at(from, limit.saturating_add(m)),
        true,
    )
    .await?;
    let m = u64::try_from(m).unwrap_or(u64::MAX);
    if union {
        Ok((
            merge_union(read, from, overdue, k, limit),
            total.saturating_add(m),
        ))
    } else {
        Ok((
            merge_difference(read, &overdue, limit),
            total.saturating_sub(m),
        ))
    }
}

/// The page at `k` (`limit` long) of the union of a stored list S and O
/// (disjoint, both newest id first), given `read` = S[s0 ..] with s0 =
/// `from` >= k - |O| and at least `limit + |O|` long where S has them.
/// S[s0] stands at p = s0 + |O newer than it| <= k in the union; merged
/// from there with the O older than it (all of O when s0 = 0, p = 0),
/// the page is merged[k - p ..].
pub(crate) fn merge_union(
    read: Vec<CheckoutSession>,
    from: usize,
    overdue: Vec<CheckoutSession>,
    k: usize,
    limit: usize,
) -> Vec<CheckoutSession> {
    let (p, rest): (usize, Vec<CheckoutSession>) = if from == 0 {
        (0, overdue)
    } else {
        let Some(first) = read.first() else {
            // Past the stored list: k >= |S| + |O|.
            return Vec::new();
        };
        let first = first.id.as_str().to_owned();
        let newer = overdue
            .iter()
            .filter(|o| o.id.as_str() > first.as_str())
            .count();
        (
            from + newer,
            overdue
                .into_iter()
                .filter(|o| o.id.as_str() < first.as_str())
                .collect(),
        )
    };
    let mut merged: Vec<CheckoutSession> = Vec::with_capacity(read.len() + rest.len());
    let (mut a, mut b) = (read.into_iter().peekable(), rest.into_iter().peekable());
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(x), Some(y)) => x.id.as_str() >= y.id.as_str(),
        };
        let next = if take_a { a.next() } else { b.next() };
        if let Some(s) = next {
            // A session in both (stored as expired between the reads):
            // once.
            if merged.last().is_none_or(|l| l.id != s.id) {
                merged.push(s);
            }
        }
    }
    merged
        .into_iter()
        .skip(k.saturating_sub(p))
        .take(limit)
        .collect()
}

/// The page at `k` (`limit` long) of a stored list S but its members in
/// O (O a part of S, both newest id first), given `read` = S[k ..], at
/// least `limit + |O|` long where S has them: S[k] stands at k - d in
/// the difference (d = |O newer than it|), so the page is the read
/// without O, from its item d.
pub(crate) fn merge_difference(
    read: Vec<CheckoutSession>,
    overdue: &[CheckoutSession],
    limit: usize,
) -> Vec<CheckoutSession> {
    let Some(first) = read.first() else {
        return Vec::new();
    };
    let d = overdue
        .iter()
        .filter(|o| o.id.as_str() > first.id.as_str())
        .count();
    let gone: std::collections::HashSet<&str> = overdue.iter().map(|o| o.id.as_str()).collect();
    read.into_iter()
        .filter(|s| !gone.contains(s.id.as_str()))
        .skip(d)
        .take(limit)
        .collect()
}

/// The offset and limit of a page after or before a record at position
/// `at` (entries newer than it; `own`: 1 when it is in the list itself).
fn seek_window_at(seek: &Seek, at: usize, own: usize, window: &Window) -> (usize, usize) {
    match seek {
        Seek::Start => (window.offset, window.limit),
        Seek::After(_) => (
            at.saturating_add(own).saturating_add(window.offset),
            window.limit,
        ),
        Seek::Before(_) => {
            let end = at.saturating_sub(window.offset);
            let start = end.saturating_sub(window.limit);
            (start, end - start)
        }
    }
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
