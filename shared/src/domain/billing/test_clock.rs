//! Sandbox test clocks: a frozen time that subscriptions on the clock
//! live by. Advancing a clock runs everything due up to its new time
//! through the same [`sweep::advance`] the scheduler runs, with nothing
//! simulated apart. The routes are `/v1/billing/test-clocks` (the billing
//! function's `test_clocks` module); a customer is put on a clock at its
//! creation ([`create_customer`]), and a subscription of that customer
//! lives by the clock ([`clock_time`]).
//!
//! Storage: a clock at `CLOCK#<id>` / `CLOCK`, listed per project on
//! `gsi1` (`PROJ#<project>#sandbox#CLOCK`, by id); its subscriptions are
//! indexed in their own due partition (`CLOCK#<id>#SUBDUE`, see
//! `billing::due`), which the real-time sweep never reads.

use serde::{Deserialize, Serialize};

use super::customers::{self, BillingError, CreateCustomer, Customer};
use super::due;
use super::subscription::Subscription;
use super::sweep::{self, SweepError};
use crate::Deps;
use crate::domain::record::{self, Entry, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::{ProjectId, TestClockId};
use crate::keys;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Index, Key, Query, SkCond, StoreError, TxOp};
use crate::time::Timestamp;

/// The error code of a clock asked of a live key.
pub const TEST_CLOCK_LIVE_MODE: &str = "test_clock_live_mode";
/// How many due subscriptions of a clock one pass reads.
const PAGE: usize = 100;
/// Most passes of one advance (each advances a page).
const MAX_PASSES: usize = 100;

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
        vec![Entry::gsi1(
            keys::per_mode(&self.project_id, self.mode, keys::PerMode::TestClocks),
            self.id.to_string(),
        )]
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
    #[error("the clock changed while being written; retry")]
    Busy,
    #[error(transparent)]
    Sweep(#[from] SweepError),
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
            TestClockError::Sweep(SweepError::Store(e)) | TestClockError::Store(e) => e.into(),
            // A failed pass leaves the clock `advancing`: advancing it again
            // to the same time finishes it.
            TestClockError::Sweep(e) => Refusal::unavailable(&e),
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
    /// `advancing` while an advance runs (a clock left so by a failure is
    /// finished by advancing it again to the same time), else `ready`.
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

/// The time `customer` lives by: its clock's, or `now` when it is on none.
/// A customer whose clock was deleted is refused (`customerId`).
pub async fn clock_time(
    deps: &Deps,
    tenant: &Tenant,
    customer: &Customer,
    now: Timestamp,
) -> Result<Timestamp, BillingError> {
    let Some(id) = &customer.test_clock_id else {
        return Ok(now);
    };
    match get(deps, tenant, id).await {
        Ok(clock) => Ok(clock.frozen_time),
        Err(TestClockError::Store(e)) => Err(e.into()),
        Err(_) => Err(customers::invalid(
            "customerId",
            format!(
                "customer {} is on test clock {id}, which was deleted: use another customer",
                customer.id
            ),
        )),
    }
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

/// Writes `clock` changed, conditioned on the version it was read at.
async fn save(
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

/// Moves the tenant's clock `id` forward to `to` (`advancing`), runs
/// everything due for its subscriptions up to `to` through
/// [`sweep::advance`], and marks it `ready`. A clock left `advancing` (a
/// crash) is finished by advancing it again to the same time.
pub async fn advance(
    deps: &Deps,
    tenant: &Tenant,
    id: &TestClockId,
    to: Timestamp,
    now: Timestamp,
) -> Result<TestClock, TestClockError> {
    let clock = get(deps, tenant, id).await?;
    let again = clock.status == ClockStatus::Advancing && to == clock.frozen_time;
    if to <= clock.frozen_time && !again {
        return Err(TestClockError::NotForward {
            current: clock.frozen_time,
        });
    }
    let mut moving = clock.clone();
    moving.frozen_time = to;
    moving.status = ClockStatus::Advancing;
    moving.updated_at = now;
    let moving = save(deps, &clock, moving).await?;
    run_due(deps, id, to).await?;
    let mut ready = moving.clone();
    ready.status = ClockStatus::Ready;
    ready.updated_at = now;
    save(deps, &moving, ready).await
}

/// Advances every subscription on clock `id` due at or before `to`.
async fn run_due(deps: &Deps, id: &TestClockId, to: Timestamp) -> Result<(), TestClockError> {
    for _ in 0..MAX_PASSES {
        let query = Query::partition(due::clock_partition(id))
            .on(Index::Gsi2)
            .sk(SkCond::Lt(due::due_before(to)))
            .limit(PAGE);
        let page = deps.store.query(&query).await?;
        if page.items.is_empty() {
            return Ok(());
        }
        let mut moved = false;
        for item in page.items {
            let sub: Subscription = from_item(item)?;
            let done = sweep::advance(deps, &sub, to).await?;
            moved |= done.steps > 0;
        }
        if !moved {
            // Listed as due but nothing to do: the index lags (DynamoDB's
            // eventually consistent index); the next advance finishes.
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::billing::invoice::{BillingInvoice, InvoiceStatus};
    use crate::domain::billing::subscription::{
        NewSubscription, SubscriptionStatus as S, create as create_sub, new_subscription,
    };
    use crate::domain::billing::terms::monthly;
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

    /// A trialing subscription on a clock walks three months in one
    /// advance: the same steps the sweep takes, at the clock's time.
    #[tokio::test]
    async fn advancing_runs_the_sweep_steps_at_the_clock_time() {
        let deps = deps();
        let tenant = Tenant::new("proj_tc_walk", Mode::Sandbox);
        let t0 = at("2026-01-10T06:00:00Z");
        let clock = create(&deps, &tenant, "walk", t0, t0).await.unwrap();
        let input = NewSubscription {
            customer_id: "cus_1".into(),
            plan_id: "bp_1".into(),
            terms: monthly(),
            reference_id: None,
            metadata: serde_json::Map::new(),
            start: t0,
            trial_ends_at: Some(at("2026-01-24T06:00:00Z")),
            billing_anchor_day: None,
            dunning_policy_id: None,
            test_clock_id: Some(clock.id.clone()),
        };
        let sub = new_subscription(&tenant, input, t0).unwrap();
        create_sub(&deps, &sub).await.unwrap();
        // Backwards (or standing still) is refused.
        assert!(matches!(
            advance(&deps, &tenant, &clock.id, t0, t0).await,
            Err(TestClockError::NotForward { .. })
        ));
        let to = at("2026-04-01T00:00:00Z");
        let after = advance(&deps, &tenant, &clock.id, to, t0).await.unwrap();
        assert_eq!(after.status, ClockStatus::Ready);
        assert_eq!(after.frozen_time, to);
        let s = crate::domain::billing::subscription::get(&deps, &tenant, &sub.id)
            .await
            .unwrap();
        // Trial ended Jan 24; periods Jan 24, Feb 24, Mar 24, each unpaid
        // past its grace: past due.
        assert_eq!(s.status, S::PastDue);
        assert_eq!(s.period_index, 2);
        let invoices: Vec<BillingInvoice> = record::all_of(
            &*deps.store,
            &Query::partition(BillingInvoice::list_partition(&tenant)).on(Index::Gsi1),
        )
        .await
        .unwrap();
        assert_eq!(invoices.len(), 3);
        assert!(invoices.iter().all(|i| i.status == InvoiceStatus::Overdue));
        // The real-time sweep leaves it alone, however late it is.
        let swept = sweep::sweep(&deps, at("2027-01-01T00:00:00Z"), sweep::BUDGET)
            .await
            .unwrap();
        assert_eq!(swept.subscriptions_advanced, 0);
        delete(&deps, &tenant, &clock.id).await.unwrap();
        assert!(matches!(
            get(&deps, &tenant, &clock.id).await,
            Err(TestClockError::NotFound(_))
        ));
    }
}
