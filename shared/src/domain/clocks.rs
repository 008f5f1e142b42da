//! Advancing sandbox test clocks (issue 39, "Test clocks"): an advance
//! answers at once with the clock `advancing` to its new time; the work
//! (every cycle, reminder and dunning step due up to that time, through
//! the same code the scheduler runs) is then done in bounded chunks by
//! whichever driver comes first:
//!
//! - on the local gateway, a background task the advance spawns
//!   ([`spawn_finish`]; never on Lambda, where nothing runs after the
//!   answer);
//! - every `GET /v1/billing/test-clocks/{id}` of an advancing clock runs
//!   one chunk ([`get`], at most [`CHUNK`]) before answering, so a client
//!   polling the clock drives it on Lambda too;
//! - the scheduler (and the local gateway's tick) finishes advancing
//!   clocks, at most [`PER_RUN`] a run ([`finish_advancing`]).
//!
//! Two drivers at once are safe: each step is exactly-once by its claims
//! and version conditions, and `ready` is written conditioned on the
//! version the driver read (so on the target it ran to). The clock record
//! and its pure rules are `billing::test_clock`; the run itself (the
//! subscriptions' steps and the reminder and dunning notices, interleaved
//! by time) is [`notices::clock::run`], which is why this module sits
//! above both `billing` and `notices`.

use std::time::{Duration, Instant};

use crate::Deps;
use crate::domain::Tenant;
use crate::domain::billing::test_clock::{self, ClockStatus, TestClock, TestClockError};
use crate::domain::notices::{self, NoticeError};
use crate::domain::record::{self, from_item};
use crate::ids::TestClockId;
use crate::keys;
use crate::store::{Index, Query, StoreError};
use crate::time::Timestamp;

/// Longest chunk a GET of an advancing clock runs before answering (well
/// within API Gateway's 29 s).
pub const CHUNK: Duration = Duration::from_secs(8);
/// Most advancing clocks one scheduler run takes up.
pub const PER_RUN: usize = 10;
/// How long one scheduler run spends on advancing clocks, at most.
pub const RUN_DEADLINE: Duration = Duration::from_secs(20);
/// Most chunks a local background task runs (then the scheduler's tick or
/// a GET finishes).
const MAX_CHUNKS: usize = 100;
/// How often an advance whose clock changed under it reads it again.
const TRIES: usize = 4;

/// Why a chunk of an advance stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error(transparent)]
    Clock(#[from] TestClockError),
    #[error(transparent)]
    Run(#[from] NoticeError),
}

impl From<StoreError> for ClockError {
    fn from(e: StoreError) -> Self {
        ClockError::Clock(e.into())
    }
}

/// Starts advancing the tenant's clock `id` to `to`: writes it
/// `advancing` (conditioned on the version read) and answers it; nothing
/// due has run yet. Forward only; the same target again while advancing
/// is answered as it is; another one is refused until it is `ready`.
pub async fn advance(
    deps: &Deps,
    tenant: &Tenant,
    id: &TestClockId,
    to: Timestamp,
    now: Timestamp,
) -> Result<TestClock, TestClockError> {
    for _ in 0..TRIES {
        let clock = test_clock::get(deps, tenant, id).await?;
        let Some(moving) = test_clock::advanced(&clock, to, now)? else {
            return Ok(clock);
        };
        match test_clock::save(deps, &clock, moving).await {
            // Another advance (or a driver's `ready`) wrote first: decide
            // again on what it wrote.
            Err(TestClockError::Busy) => continue,
            other => return other,
        }
    }
    Err(TestClockError::Busy)
}

/// Runs what is due on `clock` up to its time until `deadline`, and
/// writes it `ready` when nothing is left. Answers the clock as it then
/// is: unchanged (still `advancing`) when the deadline came first, the
/// stored one when another driver or advance wrote it since.
pub async fn drive(
    deps: &Deps,
    clock: TestClock,
    deadline: Instant,
) -> Result<TestClock, ClockError> {
    if clock.status != ClockStatus::Advancing {
        return Ok(clock);
    }
    if !run(deps, &clock, deadline).await? {
        return Ok(clock);
    }
    let ready = test_clock::finished(&clock, deps.clock.now());
    match test_clock::save(deps, &clock, ready).await {
        Err(TestClockError::Busy) => {
            match record::get::<TestClock>(&*deps.store, &TestClock::key(&clock.id)).await? {
                Some(now) => Ok(now),
                None => Err(TestClockError::NotFound(clock.id).into()),
            }
        }
        other => Ok(other?),
    }
}

/// One chunk of the work: the subscriptions' steps and notices due up to
/// the clock's time, in time order. `true` when nothing is left.
async fn run(deps: &Deps, clock: &TestClock, deadline: Instant) -> Result<bool, ClockError> {
    let ran = notices::clock::run(deps, &clock.id, clock.frozen_time, deadline).await?;
    Ok(ran.done)
}

/// The tenant's clock `id`, an advancing one first driven for at most
/// `budget` (see the module). A chunk that fails is logged and the clock
/// answered as read: the next GET or the scheduler tries again.
pub async fn get(
    deps: &Deps,
    tenant: &Tenant,
    id: &TestClockId,
    budget: Duration,
) -> Result<TestClock, TestClockError> {
    let clock = test_clock::get(deps, tenant, id).await?;
    if clock.status != ClockStatus::Advancing {
        return Ok(clock);
    }
    match drive(deps, clock.clone(), Instant::now() + budget).await {
        Ok(c) => Ok(c),
        Err(ClockError::Clock(e @ TestClockError::NotFound(_))) => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, clock = %clock.id, "test clock chunk failed; the next driver retries");
            Ok(clock)
        }
    }
}

/// Drives `clock` chunk after chunk until it is `ready` (at most
/// [`MAX_CHUNKS`]); a failure is logged and left to the other drivers.
pub async fn finish(deps: &Deps, clock: TestClock) -> Option<TestClock> {
    let mut clock = clock;
    for _ in 0..MAX_CHUNKS {
        match drive(deps, clock, Instant::now() + CHUNK).await {
            Ok(c) if c.status == ClockStatus::Ready => return Some(c),
            Ok(c) => clock = c,
            Err(e) => {
                tracing::warn!(error = %e, "test clock advance stopped; the scheduler or a GET finishes it");
                return None;
            }
        }
    }
    None
}

/// Finishes `clock` in a task of its own (the local gateway, where the
/// process outlives the answer: `AppState::runs_background_work`).
pub fn spawn_finish(deps: Deps, clock: TestClock) {
    tokio::spawn(async move {
        finish(&deps, clock).await;
    });
}

/// What [`finish_advancing`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Advancing clocks taken up.
    pub clocks: usize,
    /// Of them, those now `ready`.
    pub ready: usize,
    /// Chunks that failed (logged; the next run retries).
    pub errors: usize,
}

/// The scheduler's part: drives up to [`PER_RUN`] advancing clocks (the
/// oldest first), sharing what is left of `deadline` between them.
pub async fn finish_advancing(deps: &Deps, deadline: Instant) -> Result<Finished, StoreError> {
    let query = Query::partition(keys::advancing_test_clocks())
        .on(Index::Gsi2)
        .limit(PER_RUN);
    let listed = deps.store.query(&query).await?.items;
    let mut done = Finished::default();
    let total = listed.len();
    for (i, item) in listed.into_iter().enumerate() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let listed: TestClock = from_item(item)?;
        // The index may lag: the record itself says whether it advances.
        let Some(clock) =
            record::get::<TestClock>(&*deps.store, &TestClock::key(&listed.id)).await?
        else {
            continue;
        };
        if clock.status != ClockStatus::Advancing {
            continue;
        }
        let left = u32::try_from(total - i).unwrap_or(1).max(1);
        let share = deadline.saturating_duration_since(now) / left;
        done.clocks += 1;
        match drive(deps, clock, now + share).await {
            Ok(c) if c.status == ClockStatus::Ready => done.ready += 1,
            Ok(_) | Err(ClockError::Clock(TestClockError::NotFound(_))) => {}
            Err(e) => {
                tracing::warn!(error = %e, clock = %listed.id, "test clock chunk failed; the next run retries");
                done.errors += 1;
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Mode;
    use crate::domain::billing::invoice::{BillingInvoice, InvoiceStatus};
    use crate::domain::billing::subscription::{
        self, NewSubscription, Subscription, SubscriptionStatus as S, create as create_sub,
        new_subscription,
    };
    use crate::domain::billing::sweep;
    use crate::domain::billing::terms::monthly;
    use crate::testenv::at;

    fn deps() -> crate::AppState {
        crate::AppState::for_tests()
    }

    /// A trialing subscription on `clock`, its trial ending 14 days after
    /// `t0`.
    async fn on_clock(
        deps: &Deps,
        tenant: &Tenant,
        clock: &TestClock,
        t0: Timestamp,
    ) -> Subscription {
        let input = NewSubscription {
            customer_id: "cus_1".into(),
            plan_id: "bp_1".into(),
            terms: monthly(),
            reference_id: None,
            metadata: serde_json::Map::new(),
            start: t0,
            trial_ends_at: Some(t0.plus(chrono::Duration::days(14))),
            billing_anchor_day: None,
            dunning_policy_id: None,
            test_clock_id: Some(clock.id.clone()),
        };
        let sub = new_subscription(tenant, input, t0).unwrap();
        create_sub(deps, &sub).await.unwrap();
        sub
    }

    async fn invoices(deps: &Deps, tenant: &Tenant) -> Vec<BillingInvoice> {
        record::all_of(
            &*deps.store,
            &Query::partition(BillingInvoice::list_partition(tenant)).on(Index::Gsi1),
        )
        .await
        .unwrap()
    }

    /// An advance answers `advancing` having run nothing; the scheduler's
    /// part runs the sweep's steps at the clock's time and marks it ready.
    #[tokio::test]
    async fn an_advance_answers_at_once_and_the_scheduler_finishes_it() {
        let deps = deps();
        let tenant = Tenant::new("proj_tc_walk", Mode::Sandbox);
        let t0 = at("2026-01-10T06:00:00Z");
        let clock = test_clock::create(&deps, &tenant, "walk", t0, t0)
            .await
            .unwrap();
        let sub = on_clock(&deps, &tenant, &clock, t0).await;
        // Listed for the tenant, with its subscription (not another
        // clock's).
        let other = test_clock::create(&deps, &tenant, "other", t0, t0)
            .await
            .unwrap();
        on_clock(&deps, &tenant, &other, t0).await;
        assert_eq!(test_clock::list(&deps, &tenant, 10).await.unwrap().len(), 2);
        let (on, total, whole) = test_clock::subscriptions(&deps, &tenant, &clock.id, 10)
            .await
            .unwrap();
        assert_eq!((on.len(), total, whole), (1, 1, true));
        assert_eq!(on[0].id, sub.id);
        assert!(matches!(
            advance(&deps, &tenant, &clock.id, t0, t0).await,
            Err(TestClockError::NotForward { .. })
        ));
        let to = at("2026-04-01T00:00:00Z");
        let moving = advance(&deps, &tenant, &clock.id, to, t0).await.unwrap();
        assert_eq!(moving.status, ClockStatus::Advancing);
        assert_eq!(moving.frozen_time, to);
        assert!(invoices(&deps, &tenant).await.is_empty());
        // The same advance again (a retry) answers it as it is; another
        // target waits until it is ready.
        assert_eq!(
            advance(&deps, &tenant, &clock.id, to, t0).await.unwrap(),
            moving
        );
        assert!(matches!(
            advance(&deps, &tenant, &clock.id, at("2026-05-01T00:00:00Z"), t0).await,
            Err(TestClockError::Advancing { .. })
        ));
        let far = Instant::now() + Duration::from_secs(60);
        let run = finish_advancing(&deps, far).await.unwrap();
        assert_eq!(
            run,
            Finished {
                clocks: 1,
                ready: 1,
                errors: 0
            }
        );
        let ready = test_clock::get(&deps, &tenant, &clock.id).await.unwrap();
        assert_eq!(ready.status, ClockStatus::Ready);
        assert_eq!(ready.frozen_time, to);
        assert_eq!(ready.advanced_from, Some(t0));
        // Nothing is listed any more.
        assert_eq!(
            finish_advancing(&deps, far).await.unwrap(),
            Finished::default()
        );
        let s = subscription::get(&deps, &tenant, &sub.id).await.unwrap();
        // Trial ended Jan 24; periods Jan 24, Feb 24, Mar 24, each unpaid
        // past its grace: past due.
        assert_eq!(s.status, S::PastDue);
        assert_eq!(s.period_index, 2);
        let all = invoices(&deps, &tenant).await;
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|i| i.status == InvoiceStatus::Overdue));
        // The real-time sweep leaves it alone, however late it is.
        let swept = sweep::sweep(&deps, at("2027-01-01T00:00:00Z"), sweep::BUDGET)
            .await
            .unwrap();
        assert_eq!(swept.subscriptions_advanced, 0);
    }

    /// A GET with no time left answers the clock still advancing; with
    /// time, ready. A deadline already passed runs nothing.
    #[tokio::test]
    async fn a_get_drives_a_bounded_chunk() {
        let deps = deps();
        let tenant = Tenant::new("proj_tc_get", Mode::Sandbox);
        let t0 = at("2026-01-10T06:00:00Z");
        let clock = test_clock::create(&deps, &tenant, "get", t0, t0)
            .await
            .unwrap();
        on_clock(&deps, &tenant, &clock, t0).await;
        let to = at("2026-03-01T00:00:00Z");
        advance(&deps, &tenant, &clock.id, to, t0).await.unwrap();
        let still = get(&deps, &tenant, &clock.id, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(still.status, ClockStatus::Advancing);
        assert!(invoices(&deps, &tenant).await.is_empty());
        let ready = get(&deps, &tenant, &clock.id, CHUNK).await.unwrap();
        assert_eq!(ready.status, ClockStatus::Ready);
        assert_eq!(invoices(&deps, &tenant).await.len(), 2);
        // A ready clock is answered as it is.
        assert_eq!(get(&deps, &tenant, &clock.id, CHUNK).await.unwrap(), ready);
    }

    /// Four drivers at once (background, two GETs, the scheduler) issue
    /// each period's invoice once, and the clock ends ready once.
    #[tokio::test]
    async fn drivers_at_once_do_each_step_once() {
        let deps = deps();
        let tenant = Tenant::new("proj_tc_race", Mode::Sandbox);
        let t0 = at("2026-01-10T06:00:00Z");
        let clock = test_clock::create(&deps, &tenant, "race", t0, t0)
            .await
            .unwrap();
        for _ in 0..5 {
            on_clock(&deps, &tenant, &clock, t0).await;
        }
        let to = at("2027-01-01T00:00:00Z");
        let moving = advance(&deps, &tenant, &clock.id, to, t0).await.unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let (a, b, c, d) = tokio::join!(
            finish(&deps, moving.clone()),
            get(&deps, &tenant, &clock.id, CHUNK),
            get(&deps, &tenant, &clock.id, CHUNK),
            finish_advancing(&deps, far),
        );
        assert!(a.is_some());
        b.unwrap();
        c.unwrap();
        d.unwrap();
        let ready = test_clock::get(&deps, &tenant, &clock.id).await.unwrap();
        assert_eq!(ready.status, ClockStatus::Ready);
        // One write of `ready` after the advance's.
        assert_eq!(ready.version, moving.version + 1);
        let all = invoices(&deps, &tenant).await;
        let mut periods: Vec<(String, chrono::NaiveDate)> = all
            .iter()
            .map(|i| (i.subscription_id.to_string(), i.period_start))
            .collect();
        let n = periods.len();
        periods.sort();
        periods.dedup();
        assert_eq!(periods.len(), n, "an invoice twice for one period");
        // Trial to Jan 24, then Jan 24 .. Dec 24: 12 periods each.
        assert_eq!(n, 5 * 12);
    }
}
