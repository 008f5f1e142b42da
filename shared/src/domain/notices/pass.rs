//! The scheduler's notices pass: the due schedule records of every
//! tenant, fair across tenants as the billing sweep is.

use futures::StreamExt;
use serde::Serialize;

use super::{NoticeError, RunOne, run_one};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::billing::due;
use crate::domain::billing::notice_due::{self, NoticeSchedule};
use crate::domain::billing::sweep::{DEADLINE, PARALLEL, PER_TENANT};
use crate::domain::record::from_item;
use crate::store::{Index, Query, SkCond, StoreError};
use crate::time::Timestamp;

/// What one [`pass`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NoticeReport {
    /// Schedule records found due and run.
    pub notices_run: usize,
    /// Messages stored to go (SMS and emails).
    pub sent: usize,
    /// Notices recorded `skipped`.
    pub skipped: usize,
    /// SMS waiting (quiet hours, a rate limit).
    pub deferred: usize,
    /// Dunning final actions taken.
    pub final_actions: usize,
    /// Records (or tenants) that failed; the next pass tries again.
    pub errors: usize,
}

/// The tenant's due schedule records at `now`, earliest first.
async fn due_in(
    deps: &Deps,
    tenant: &Tenant,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<NoticeSchedule>, StoreError> {
    let query = Query::partition(notice_due::due_partition(tenant))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(notice_due::due_before(now)))
        .limit(limit);
    let page = deps.store.query(&query).await?;
    let mut out = Vec::with_capacity(page.items.len());
    for item in page.items {
        match from_item::<NoticeSchedule>(item) {
            Ok(s) => out.push(s),
            Err(e) => tracing::warn!(error = %e, "unreadable notice schedule in the due index"),
        }
    }
    Ok(out)
}

/// One run: at most `budget` due records, each tenant's earliest first,
/// the tenants taking turns from one that rotates every minute;
/// [`PARALLEL`] at once, none started after [`DEADLINE`]. Fails only
/// when the list of tenants cannot be read.
pub async fn pass(deps: &Deps, now: Timestamp, budget: usize) -> Result<NoticeReport, StoreError> {
    let tenants = due::tenants(&*deps.store).await?;
    let found: Vec<Result<Vec<NoticeSchedule>, StoreError>> = futures::stream::iter(tenants)
        .map(|t| async move { due_in(deps, &t.tenant(), now, PER_TENANT).await })
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut report = NoticeReport::default();
    let mut queues = Vec::new();
    for f in found {
        match f {
            Ok(recs) => queues.push(recs),
            Err(e) => {
                tracing::warn!(error = %e, "a tenant's notice index could not be read");
                report.errors += 1;
            }
        }
    }
    let picked = due::take_turns(queues, now.unix_seconds() / 60, budget);
    let began = std::time::Instant::now();
    let results: Vec<Option<Result<RunOne, NoticeError>>> = futures::stream::iter(picked)
        .map(|rec| async move {
            if began.elapsed() >= DEADLINE {
                return None;
            }
            let r = run_one(deps, &rec, now).await;
            if let Err(e) = &r {
                tracing::warn!(subscription = %rec.subscription_id, error = %e, "notice failed; next pass retries");
            }
            Some(r)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for r in results.into_iter().flatten() {
        match r {
            Ok(one) => {
                report.notices_run += usize::from(one.progressed);
                report.sent += one.sent;
                report.skipped += one.skipped;
                report.deferred += usize::from(one.deferred);
                report.final_actions += usize::from(one.final_action);
            }
            Err(_) => report.errors += 1,
        }
    }
    tracing::info!(
        notices_run = report.notices_run,
        sent = report.sent,
        errors = report.errors,
        "billing notices pass done"
    );
    Ok(report)
}
