//! Sandbox test clocks: a frozen time that subscriptions on the clock
//! live by. This module is the clock record and its rules; advancing one
//! (answering `advancing` at once, running what is due in bounded chunks
//! through the same `sweep::advance` and notices the scheduler runs,
//! marking it `ready`) is driven by `domain::clocks`. The routes are
//! `/v1/billing/test-clocks` (the billing function's `test_clocks`
//! module); a customer is put on a clock at its creation
//! ([`create_customer`]), and a subscription of that customer lives by the
//! clock ([`time_of`]).
//!
//! Storage: a clock at `CLOCK#<id>` / `CLOCK`, listed per project on
//! `gsi1` (`PROJ#<project>#sandbox#CLOCK`, by id) and, while advancing,
//! on `gsi2` (`CLOCKS#ADVANCING`, by id: what the scheduler finishes);
//! its subscriptions are indexed in their own due partition
//! (`CLOCK#<id>#SUBDUE`, see `billing::due`), which the real-time sweep
//! never reads.

use serde::{Deserialize, Serialize};

use super::customers::{self, BillingError, CreateCustomer, Customer};
use super::subscription::Subscription;
use crate::Deps;
use crate::domain::record::{self, Entry, Record};
use crate::domain::{Mode, Tenant};
use crate::ids::{ProjectId, TestClockId};
use crate::keys;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Index, Key, Query, StoreError, TxOp};
use crate::time::Timestamp;

/// The error code of a clock asked of a live key.
pub const TEST_CLOCK_LIVE_MODE: &str = "test_clock_live_mode";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockStatus {
    Ready,
    Advancing,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestClock {
    pub id: TestClockId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub name: String,
    pub frozen_time: Timestamp,
    pub status: ClockStatus,
    /// The clock's time before its last advance (none before the first):
    /// what ran is what fell due between it and `frozen_time`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advanced_from: Option<Timestamp>,
    pub version: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

crate::attrs! { TestClock {
    VERSION: i64 = version,
} }

impl TestClock {
    pub fn key(id: &TestClockId) -> Key {
        keys::test_clock(id)
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }
}

impl Record for TestClock {
    fn item_key(&self) -> Key {
        TestClock::key(&self.id)
    }

    fn entries(&self) -> Vec<Entry> {
        let mut entries = vec![Entry::gsi1(
            keys::per_mode(&self.project_id, self.mode, keys::PerMode::TestClocks),
            self.id.to_string(),
        )];
        if self.status == ClockStatus::Advancing {
            entries.push(Entry::gsi2(
                keys::advancing_test_clocks(),
                self.id.to_string(),
            ));
        }
        entries
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TestClockError {
    #[error("test clocks exist in sandbox only; use a sandbox key")]
    LiveMode,
    #[error("name must be 1 to 100 characters")]
    Name,
    #[error("test clock {0} not found")]
    NotFound(TestClockId),
    #[error("frozenTime must be after the clock's time {current}")]
    NotForward { current: Timestamp },
    #[error(
        "the clock is advancing to {to}: poll GET /v1/billing/test-clocks/{{id}} until it is ready, then advance it again"
    )]
    Advancing { to: Timestamp },
    #[error("the clock changed while being written; retry")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TestClockError {
    pub fn code(&self) -> Option<&'static str> {
        matches!(self, TestClockError::LiveMode).then_some(TEST_CLOCK_LIVE_MODE)
    }
}

impl From<TestClockError> for Refusal {
    fn from(err: TestClockError) -> Self {
        match err {
            e @ TestClockError::LiveMode => {
                Refusal::forbidden("test_clock_live_mode", e.to_string())
            }
            e @ TestClockError::Name => Refusal::invalid("name", e.to_string()),
            TestClockError::NotFound(id) => Refusal::not_found("test clock", id.as_str()),
            e @ TestClockError::NotForward { .. } => Refusal::invalid("frozenTime", e.to_string()),
            e @ TestClockError::Busy => Refusal::conflict("version_conflict", e.to_string()),
            e @ TestClockError::Advancing { .. } => {
                Refusal::conflict("state_conflict", e.to_string())
            }
            TestClockError::Store(e) => e.into(),
        }
    }
}

/// The clock as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingTestClock)]
pub struct TestClockView {
    /// `clock_…`.
    pub id: String,
    /// Always `test_clock`.
    pub object: &'static str,
    pub name: String,
    /// The clock's time: what its subscriptions live by.
    pub frozen_time: Timestamp,
    /// `advancing` from an advance until everything due up to
    /// `frozenTime` has run (each GET of the clock runs part of it, and
    /// the scheduler finishes it), then `ready`.
    #[schema(value_type = String)]
    pub status: ClockStatus,
    /// Always `false`: clocks exist in sandbox only.
    pub livemode: bool,
    pub created_at: Timestamp,
}

impl TestClockView {
    pub fn of(c: &TestClock) -> Self {
        TestClockView {
            id: c.id.to_string(),
            object: "test_clock",
            name: c.name.clone(),
            frozen_time: c.frozen_time,
            status: c.status,
            livemode: c.mode.is_live(),
            created_at: c.created_at,
        }
    }
}

/// `POST /v1/billing/test-clocks`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBillingTestClock)]
pub struct CreateTestClock {
    /// The clock's starting time (RFC 3339).
    pub frozen_time: Timestamp,
    /// 1 to 100 characters.
    pub name: String,
}

/// `POST /v1/billing/test-clocks/{id}/advance`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = AdvanceBillingTestClock)]
pub struct AdvanceTestClock {
    /// Later than the clock's time (RFC 3339).
    pub frozen_time: Timestamp,
}

/// Why a record on a clock cannot take the clock's time now.
#[derive(Debug, thiserror::Error)]
pub enum ClockTimeError {
    #[error(
        "test clock {clock} is advancing to {to}: poll GET /v1/billing/test-clocks/{clock} until it is ready, then retry"
    )]
    Advancing { clock: TestClockId, to: Timestamp },
    #[error("test clock {0} was deleted: what lives on it no longer changes")]
    Deleted(TestClockId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The time a record on the tenant's clock `id` lives by: the clock's
/// `frozenTime` while it is `ready`. While it advances, nothing on it may
/// change (its time is moving); a deleted clock's records stay as they are.
pub async fn time_of(
    deps: &Deps,
    tenant: &Tenant,
    id: &TestClockId,
) -> Result<Timestamp, ClockTimeError> {
    match get(deps, tenant, id).await {
        Ok(c) if c.status == ClockStatus::Ready => Ok(c.frozen_time),
        Ok(c) => Err(ClockTimeError::Advancing {
            clock: c.id,
            to: c.frozen_time,
        }),
        Err(TestClockError::Store(e)) => Err(e.into()),
        Err(_) => Err(ClockTimeError::Deleted(id.clone())),
    }
}

/// Creates a customer, on the tenant's clock when the body names one
/// (`testClockId`: sandbox only; another tenant's or unknown clock is a
/// 404 naming the field).
pub async fn create_customer(
    deps: &Deps,
    tenant: &Tenant,
    body: CreateCustomer,
    fence: Option<&Fence>,
) -> Result<Customer, BillingError> {
    if let Some(raw) = body.test_clock_id.as_deref() {
        if tenant.mode != Mode::Sandbox {
            return Err(customers::invalid(
                "testClockId",
                "test clocks exist in sandbox only: use a sandbox key, or leave testClockId out",
            ));
        }
        let unknown = || {
            customers::invalid(
                "testClockId",
                format!("No such test clock: '{raw}' (of this project, in sandbox)"),
            )
        };
        let id = TestClockId::parse(raw.trim()).ok_or_else(unknown)?;
        match get(deps, tenant, &id).await {
            Ok(_) => {}
            Err(TestClockError::Store(e)) => return Err(e.into()),
            Err(_) => return Err(unknown()),
        }
    }
    customers::create(deps, tenant, body, fence).await
}

/// Makes a clock at `frozen_time` (sandbox only).
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    name: &str,
    frozen_time: Timestamp,
    now: Timestamp,
) -> Result<TestClock, TestClockError> {
    if tenant.mode != Mode::Sandbox {
        return Err(TestClockError::LiveMode);
    }
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 100 {
        return Err(TestClockError::Name);
    }
    let clock = TestClock {
        id: TestClockId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        name: name.to_owned(),
        frozen_time,
        status: ClockStatus::Ready,
        advanced_from: None,
        version: 1,
        created_at: now,
        updated_at: now,
    };
    deps.store.transact(vec![clock.put_new()?]).await?;
    Ok(clock)
}

/// The tenant's clock `id`.
pub async fn get(
    deps: &Deps,
    tenant: &Tenant,
    id: &TestClockId,
) -> Result<TestClock, TestClockError> {
    if tenant.mode != Mode::Sandbox {
        return Err(TestClockError::LiveMode);
    }
    match record::get::<TestClock>(&*deps.store, &TestClock::key(id)).await? {
        Some(c) if tenant.owns(c.project_id.as_str(), c.mode) => Ok(c),
        _ => Err(TestClockError::NotFound(id.clone())),
    }
}

/// The tenant's clocks, newest first (at most `limit`).
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    limit: usize,
) -> Result<Vec<TestClock>, TestClockError> {
    if tenant.mode != Mode::Sandbox {
        return Err(TestClockError::LiveMode);
    }
    let query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::TestClocks,
    ))
    .on(Index::Gsi1)
    .backward()
    .limit(limit);
    Ok(record::all_of(&*deps.store, &query).await?)
}

/// The sandbox subscriptions a look for those on a clock reads, newest
/// first: a page of a clock reads at most these, whatever the sandbox
/// holds (a test clock drives a handful of subscriptions; its own
/// advance finds them through its due index, not this).
pub const CLOCK_SCAN: usize = 1_000;

/// The subscriptions on the tenant's clock `id` among its newest
/// [`CLOCK_SCAN`] subscriptions: the first `limit` of them, newest first,
/// how many there are, and whether that is all of them (the sandbox
/// holds no more than were read).
pub async fn subscriptions(
    deps: &Deps,
    tenant: &Tenant,
    id: &TestClockId,
    limit: usize,
) -> Result<(Vec<Subscription>, u64, bool), TestClockError> {
    let query = Query::partition(Subscription::list_partition(tenant))
        .on(Index::Gsi1)
        .backward();
    let read = crate::store::query_window(&*deps.store, &query, 0, CLOCK_SCAN).await?;
    let whole = read.len() < CLOCK_SCAN;
    let mut on = Vec::new();
    for item in read {
        let sub: Subscription = record::from_item(item)?;
        if sub.test_clock_id.as_ref() == Some(id) {
            on.push(sub);
        }
    }
    let total = on.len() as u64;
    on.truncate(limit);
    Ok((on, total, whole))
}

/// Deletes the tenant's clock `id` (its subscriptions stay, never
/// advanced again).
pub async fn delete(deps: &Deps, tenant: &Tenant, id: &TestClockId) -> Result<(), TestClockError> {
    let clock = get(deps, tenant, id).await?;
    deps.store
        .delete(
            &clock.item_key(),
            Some(TestClock::VERSION.eq(&clock.version)),
        )
        .await
        .map_err(|e| match e {
            StoreError::ConditionFailed => TestClockError::Busy,
            e => e.into(),
        })
}

/// Writes `clock` changed, conditioned on the version it was read at
/// (a deleted clock is not written again: [`TestClockError::Busy`]).
pub async fn save(
    deps: &Deps,
    seen: &TestClock,
    mut clock: TestClock,
) -> Result<TestClock, TestClockError> {
    clock.version = seen.version + 1;
    let op = TxOp::Put {
        item: clock.to_item()?,
        cond: Some(TestClock::VERSION.eq(&seen.version)),
    };
    match deps.store.transact(vec![op]).await {
        Ok(()) => Ok(clock),
        Err(e) if e.is_condition_failure() => Err(TestClockError::Busy),
        Err(e) => Err(e.into()),
    }
}

/// What advancing `clock` to `to` at `now` writes: the clock `advancing`
/// to `to`, or `None` when it is already advancing to `to` (a retried
/// advance: answered as it is). Forward only; a clock advancing elsewhere
/// takes no other target until it is ready.
pub fn advanced(
    clock: &TestClock,
    to: Timestamp,
    now: Timestamp,
) -> Result<Option<TestClock>, TestClockError> {
    if clock.status == ClockStatus::Advancing {
        return if to == clock.frozen_time {
            Ok(None)
        } else {
            Err(TestClockError::Advancing {
                to: clock.frozen_time,
            })
        };
    }
    if to <= clock.frozen_time {
        return Err(TestClockError::NotForward {
            current: clock.frozen_time,
        });
    }
    let mut moving = clock.clone();
    moving.advanced_from = Some(clock.frozen_time);
    moving.frozen_time = to;
    moving.status = ClockStatus::Advancing;
    moving.updated_at = now;
    Ok(Some(moving))
}

/// `clock` once everything due up to its time has run: `ready`.
pub fn finished(clock: &TestClock, now: Timestamp) -> TestClock {
    let mut ready = clock.clone();
    ready.status = ClockStatus::Ready;
    ready.updated_at = now;
    ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testenv::at;

    fn deps() -> crate::AppState {
        crate::AppState::for_tests()
    }

    #[tokio::test]
    async fn a_live_key_gets_no_clock() {
        let deps = deps();
        let live = Tenant::new("proj_tc", Mode::Live);
        let t = at("2026-01-10T06:00:00Z");
        let err = create(&deps, &live, "x", t, t).await.unwrap_err();
        assert!(matches!(err, TestClockError::LiveMode));
        assert_eq!(err.code(), Some(TEST_CLOCK_LIVE_MODE));
        let sandbox = Tenant::new("proj_tc", Mode::Sandbox);
        let c = create(&deps, &sandbox, "Year walk", t, t).await.unwrap();
        assert!(matches!(
            get(&deps, &live, &c.id).await,
            Err(TestClockError::LiveMode)
        ));
        let other = Tenant::new("proj_other", Mode::Sandbox);
        assert!(matches!(
            get(&deps, &other, &c.id).await,
            Err(TestClockError::NotFound(_))
        ));
        assert!(matches!(
            create(&deps, &sandbox, " ", t, t).await,
            Err(TestClockError::Name)
        ));
    }

    /// A clock's page reads at most CLOCK_SCAN subscriptions however many
    /// the sandbox holds, and says when those on the clock may be more.
    #[tokio::test]
    async fn a_clocks_subscriptions_are_looked_for_among_a_bounded_few() {
        use crate::store::counting::CountingStore;
        let store = std::sync::Arc::new(CountingStore::new(crate::testenv::memory_store()));
        let deps = crate::domain::billing::testenv::deps_at(store.clone(), "2026-01-10T06:00:00Z");
        let tenant = Tenant::new("proj_tc_scan", Mode::Sandbox);
        let t = at("2026-01-10T06:00:00Z");
        let clock = create(&deps, &tenant, "scan", t, t).await.unwrap();
        let on_clock = |clock: Option<&TestClock>| {
            let mut input = crate::domain::billing::testenv::sub_input(
                t,
                crate::domain::billing::terms::monthly(),
            );
            input.test_clock_id = clock.map(|c| c.id.clone());
            input
        };
        // Three on the clock, then more of the sandbox's than a look reads.
        for _ in 0..3 {
            crate::domain::billing::testenv::stored_sub(&deps, &tenant, on_clock(Some(&clock)))
                .await;
        }
        let (on, total, whole) = subscriptions(&deps, &tenant, &clock.id, 2).await.unwrap();
        assert_eq!((on.len(), total, whole), (2, 3, true));
        for _ in 0..CLOCK_SCAN {
            crate::domain::billing::testenv::stored_sub(&deps, &tenant, on_clock(None)).await;
        }
        let before = store.items_read();
        let (on, total, whole) = subscriptions(&deps, &tenant, &clock.id, 2).await.unwrap();
        assert!(store.items_read() - before <= CLOCK_SCAN as u64);
        assert_eq!((on.len(), total, whole), (0, 0, false));
    }

    fn clock_at(t: Timestamp) -> TestClock {
        TestClock {
            id: TestClockId::new(),
            project_id: ProjectId::stored("proj_sm"),
            mode: Mode::Sandbox,
            name: "sm".into(),
            frozen_time: t,
            status: ClockStatus::Ready,
            advanced_from: None,
            version: 1,
            created_at: t,
            updated_at: t,
        }
    }

    /// ready --advance(later)--> advancing(to) --finished--> ready; the
    /// same target again while advancing is answered as it is; another
    /// target while advancing, or a time not after the clock's, is refused.
    #[test]
    fn the_clock_state_machine() {
        let t0 = at("2026-01-10T06:00:00Z");
        let to = at("2026-02-10T06:00:00Z");
        let now = at("2026-11-29T08:00:00Z");
        let ready = clock_at(t0);
        for back in [t0, at("2026-01-01T00:00:00Z")] {
            assert!(matches!(
                advanced(&ready, back, now),
                Err(TestClockError::NotForward { current }) if current == t0
            ));
        }
        let moving = advanced(&ready, to, now).unwrap().unwrap();
        assert_eq!(moving.status, ClockStatus::Advancing);
        assert_eq!(moving.frozen_time, to);
        assert_eq!(moving.advanced_from, Some(t0));
        assert_eq!(moving.updated_at, now);
        // Listed for the scheduler while advancing, not when ready.
        let listed = |c: &TestClock| {
            c.entries()
                .iter()
                .any(|e| e.index == Index::Gsi2 && e.partition == keys::advancing_test_clocks())
        };
        assert!(listed(&moving));
        assert!(!listed(&ready));
        assert!(advanced(&moving, to, now).unwrap().is_none());
        let err = advanced(&moving, at("2026-03-10T06:00:00Z"), now).unwrap_err();
        assert!(matches!(err, TestClockError::Advancing { to: t } if t == to));
        assert_eq!(Refusal::from(err).code, "state_conflict");
        let done = finished(&moving, now);
        assert_eq!(done.status, ClockStatus::Ready);
        assert_eq!(done.frozen_time, to);
        assert!(!listed(&done));
        // Ready at the target: the same time again is standing still.
        assert!(matches!(
            advanced(&done, to, now),
            Err(TestClockError::NotForward { .. })
        ));
    }

    /// Writes are conditioned on the version read: of two writers from
    /// the same read, one wins; a deleted clock is never written again.
    #[tokio::test]
    async fn a_clock_write_holds_only_on_the_version_read() {
        let deps = deps();
        let tenant = Tenant::new("proj_tc_v", Mode::Sandbox);
        let t0 = at("2026-01-10T06:00:00Z");
        let c = create(&deps, &tenant, "v", t0, t0).await.unwrap();
        let a = advanced(&c, at("2026-02-01T00:00:00Z"), t0)
            .unwrap()
            .unwrap();
        let b = advanced(&c, at("2026-03-01T00:00:00Z"), t0)
            .unwrap()
            .unwrap();
        let (x, y) = tokio::join!(save(&deps, &c, a), save(&deps, &c, b));
        assert!(x.is_ok() != y.is_ok(), "{x:?} {y:?}");
        assert!(matches!(x.or(y), Ok(w) if w.version == 2));
        let moving = get(&deps, &tenant, &c.id).await.unwrap();
        assert!(matches!(
            time_of(&deps, &tenant, &c.id).await,
            Err(ClockTimeError::Advancing { .. })
        ));
        let ready = save(&deps, &moving, finished(&moving, t0)).await.unwrap();
        assert_eq!(
            time_of(&deps, &tenant, &c.id).await.unwrap(),
            ready.frozen_time
        );
        // A stale ready write (version 2 again) is refused.
        assert!(matches!(
            save(&deps, &moving, finished(&moving, t0)).await,
            Err(TestClockError::Busy)
        ));
        delete(&deps, &tenant, &c.id).await.unwrap();
        assert!(matches!(
            save(&deps, &ready, finished(&ready, t0)).await,
            Err(TestClockError::Busy)
        ));
        assert!(matches!(
            get(&deps, &tenant, &c.id).await,
            Err(TestClockError::NotFound(_))
        ));
        assert!(matches!(
            time_of(&deps, &tenant, &c.id).await,
            Err(ClockTimeError::Deleted(_))
        ));
    }
}
