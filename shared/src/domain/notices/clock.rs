//! A test clock's run: everything due on the clock up to `to`, the
//! subscriptions' steps and the notices interleaved by time, so a dunning
//! final action on day X happens before the next period's invoice on day
//! Y > X, exactly as in real time.
//!
//! Repeat: `t` = the earliest of the clock's due subscription and due
//! notice; past `to` (or none): done. Else every clock subscription due at
//! or before `t` is advanced at `t` ([`sweep::advance`]) and every clock
//! notice due at or before `t` is run at `t` ([`super::run_one`]). On a
//! clock no notice is skipped as stale: time passes step by step. Bounded
//! by a deadline and [`MAX_ITERATIONS`]; a run cut short answers
//! `done: false` and the next run carries on (nothing leaves an index but
//! by the write that did the work).

use std::sync::Arc;
use std::time::Instant;

use crate::Deps;
use crate::domain::billing::due;
use crate::domain::billing::notice_due::{self, NoticeSchedule};
use crate::domain::billing::subscription::Subscription;
use crate::domain::billing::sweep;
use crate::domain::record::from_item;
use crate::ids::TestClockId;
use crate::store::{Index, Query, SkCond};
use crate::time::{ManualClock, Timestamp};

use super::NoticeError;

/// Most time steps one run takes.
pub const MAX_ITERATIONS: usize = 400;
/// Records read per partition per step.
const PAGE: usize = 100;

/// What one [`run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockRun {
    /// Nothing is due on the clock up to `to` any more.
    pub done: bool,
}

/// The deps whose clock reads `t` (the SMS and mail records, and their
/// per-day limits, are in the test clock's time).
pub(super) fn at_time(deps: &Deps, t: Timestamp) -> Deps {
    let mut d = deps.clone();
    d.clock = Arc::new(ManualClock::new(t));
    d
}

async fn due_subscriptions(
    deps: &Deps,
    clock: &TestClockId,
    upto: Timestamp,
    limit: usize,
) -> Result<Vec<Subscription>, NoticeError> {
    let query = Query::partition(due::clock_partition(clock))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(due::due_before(upto)))
        .limit(limit);
    let page = deps.store.query(&query).await?;
    let mut out = Vec::with_capacity(page.items.len());
    for item in page.items {
        out.push(from_item::<Subscription>(item)?);
    }
    Ok(out)
}

async fn due_notices(
    deps: &Deps,
    clock: &TestClockId,
    upto: Timestamp,
    limit: usize,
) -> Result<Vec<NoticeSchedule>, NoticeError> {
    let query = Query::partition(notice_due::clock_partition(clock))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(notice_due::due_before(upto)))
        .limit(limit);
    let page = deps.store.query(&query).await?;
    let mut out = Vec::with_capacity(page.items.len());
    for item in page.items {
        out.push(from_item::<NoticeSchedule>(item)?);
    }
    Ok(out)
}

/// Runs everything due on clock `clock_id` up to `to` (see the module),
/// starting no new step after `deadline`.
pub async fn run(
    deps: &Deps,
    clock_id: &TestClockId,
    to: Timestamp,
    deadline: Instant,
) -> Result<ClockRun, NoticeError> {
    for _ in 0..MAX_ITERATIONS {
        if Instant::now() >= deadline {
            return Ok(ClockRun { done: false });
        }
        let sub_at = due_subscriptions(deps, clock_id, to, 1)
            .await?
            .first()
            .and_then(|s| s.next_due_at);
        let notice_at = due_notices(deps, clock_id, to, 1)
            .await?
            .first()
            .and_then(|n| n.next_at);
        let Some(t) = [sub_at, notice_at].into_iter().flatten().min() else {
            return Ok(ClockRun { done: true });
        };
        if t > to {
            return Ok(ClockRun { done: true });
        }
        let now = at_time(deps, t);
        let mut moved = false;
        for sub in due_subscriptions(deps, clock_id, t, PAGE).await? {
            let done = sweep::advance(&now, &sub, t).await?;
            moved |= done.steps > 0;
        }
        for notice in due_notices(deps, clock_id, t, PAGE).await? {
            let ran = super::run_one(&now, &notice, t).await?;
            moved |= ran.progressed;
        }
        if !moved {
            // Listed as due but nothing to do: the index lags (DynamoDB's
            // eventually consistent index); the next run finishes.
            return Ok(ClockRun { done: false });
        }
    }
    Ok(ClockRun { done: false })
}
