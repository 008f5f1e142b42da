//! Running a report: claim it, read its records page by page (one ranged
//! query of the tenant's list index per page, [`PAGE`] records), write
//! each page's CSV lines to the blob store as they come
//! ([`crate::blobs::Blobs::put_stream`]: a streamed file, an S3 multipart
//! upload), so memory holds one page and one upload part whatever the
//! row count; the progress (`rows`) is saved every [`PROGRESS_EVERY`]
//! rows, which also extends the lease.
//!
//! The records of `[from, to)` are found by id: ids begin with their
//! creation time (a ULID), so the range of ids minted from `from - MARGIN`
//! to `to + MARGIN` holds them all, and each one read is kept only if its
//! `createdAt` is in the range. A reconciliation export reads the
//! tenant's completed runs of the range first (a few a day), then each
//! run's findings page by page, one part after the other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::csv::{columns, finding_row, invoice_row, lines, payment_row, refund_row};
use super::{
    MAX_ATTEMPTS, Report, ReportError, ReportQuota, ReportStatus, ReportType, save, save_with,
};
use crate::Deps;
use crate::blobs::BlobError;
use crate::domain::billing::invoice::BillingInvoice;
use crate::domain::payments::Payment;
use crate::domain::reconciliation::runs::{self as recon_runs, Run, StoredFinding};
use crate::domain::record::{self, from_item};
use crate::domain::refunds::Refund;
use crate::ids::{IdKind, ReportId};
use crate::keys;
use crate::store::{Index, Item, Query, SkCond, StoreError};
use crate::time::Timestamp;

/// How long a claim holds a report without news from its runner.
pub const LEASE: chrono::Duration = chrono::Duration::minutes(10);
/// Records read per query.
pub const PAGE: usize = 1000;
/// Rows between two saves of the progress.
pub const PROGRESS_EVERY: u64 = 10_000;
/// How far an id's time may stray from its record's `createdAt`.
const MARGIN: chrono::Duration = chrono::Duration::hours(1);
/// Most unfinished reports one scheduler run takes up.
pub const PER_RUN: usize = 5;

/// `report` taken for a run at `now` (`running`, leased, holding its
/// tenant's one running slot), or `None` when it is finished, held by a
/// live lease, its tenant's slot is taken, or another driver took it
/// first. A report already tried [`MAX_ATTEMPTS`] times is `failed`
/// instead (and `None`).
pub async fn claim(
    deps: &Deps,
    report: Report,
    now: Timestamp,
) -> Result<Option<Report>, ReportError> {
    let held =
        report.status == ReportStatus::Running && report.lease_until.is_some_and(|t| t > now);
    if report.status.finished() || held {
        return Ok(None);
    }
    if report.attempts >= MAX_ATTEMPTS {
        let mut next = report.clone();
        next.status = ReportStatus::Failed;
        next.failure = Some(gave_up());
        next.lease_until = None;
        next.updated_at = now;
        next.finished_at = Some(now);
        return match save(deps, &report, next).await {
            Ok(_) | Err(ReportError::Busy) => Ok(None),
            Err(e) => Err(e),
        };
    }
    let mut next = report.clone();
    next.status = ReportStatus::Running;
    next.rows = 0;
    next.attempts = report.attempts + 1;
    next.lease_until = Some(now.plus(LEASE));
    next.updated_at = now;
    let slot = ReportQuota::hold(&report, now, now.plus(LEASE));
    match save_with(deps, &report, next, vec![slot]).await {
        Ok(r) => Ok(Some(r)),
        Err(ReportError::Busy) => Ok(None),
        Err(e) => Err(e),
    }
}

fn gave_up() -> String {
    format!("the export did not finish in {MAX_ATTEMPTS} attempts; start a new one")
}

/// Runs the report `id` to its end if nobody holds it; answers it as it
/// then is (`ready` or `failed`, or as another driver left it).
pub async fn run(deps: &Deps, id: &ReportId) -> Result<Report, ReportError> {
    let report = record::get::<Report>(&*deps.store, &Report::key(id))
        .await?
        .ok_or_else(|| ReportError::NotFound(id.clone()))?;
    let Some(held) = claim(deps, report.clone(), deps.clock.now()).await? else {
        return record::get::<Report>(&*deps.store, &Report::key(id))
            .await?
            .ok_or_else(|| ReportError::NotFound(id.clone()));
    };
    run_claimed(deps, held).await
}

/// Writes the claimed report `held` and ends it: `ready`; on a failure
/// `pending` again for the next run, or `failed` after [`MAX_ATTEMPTS`];
/// frees its tenant's running slot either way.
async fn run_claimed(deps: &Deps, held: Report) -> Result<Report, ReportError> {
    let id = held.id.clone();
    let shared = Arc::new(Mutex::new(held));
    let written = write(deps, shared.clone()).await;
    let held = shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let now = deps.clock.now();
    let mut next = held.clone();
    next.lease_until = None;
    next.updated_at = now;
    match written {
        Ok((rows, bytes)) => {
            next.status = ReportStatus::Ready;
            next.rows = rows;
            next.bytes = bytes;
            next.finished_at = Some(now);
        }
        // Another driver took it over (a lapsed lease): it finishes it.
        Err(ReportError::Busy) => {
            return record::get::<Report>(&*deps.store, &Report::key(&id))
                .await?
                .ok_or_else(|| ReportError::NotFound(id.clone()));
        }
        Err(e) if held.attempts < MAX_ATTEMPTS => {
            tracing::warn!(report = %id, error = %e, attempt = held.attempts, "report run failed; the next run retries");
            next.status = ReportStatus::Pending;
            next.rows = 0;
        }
        Err(e) => {
            tracing::error!(report = %id, error = %e, "report failed");
            next.status = ReportStatus::Failed;
            next.failure = Some(gave_up());
            next.finished_at = Some(now);
        }
    }
    let saved = save(deps, &held, next).await;
    ReportQuota::release(deps, &held).await;
    saved
}

/// Runs `id` in a task of its own (the local gateway, where the process
/// outlives the answer), then what else is waiting (its tenant's next
/// report, held back while this one ran); a failure is logged, the tick
/// retries.
pub fn spawn_run(deps: Deps, id: ReportId) {
    tokio::spawn(async move {
        if let Err(e) = run(&deps, &id).await {
            tracing::warn!(report = %id, error = %e, "report run stopped; the tick retries");
        }
        // Until nothing more can start (each pass finishes what it took).
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        loop {
            match run_unfinished(&deps, deadline).await {
                Ok(n) if n > 0 && Instant::now() < deadline => {}
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "report runs failed; the tick retries");
                    break;
                }
            }
        }
    });
}

/// The local tick's part: [`run_unfinished`] in a task of its own, so the
/// tick (and whatever waits on it) never waits for an export; `None`
/// while the previous one still runs (`busy`: one at a time).
pub fn kick(
    deps: Deps,
    busy: Arc<std::sync::atomic::AtomicBool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if busy.swap(true, Ordering::AcqRel) {
        return None;
    }
    Some(tokio::spawn(async move {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        if let Err(e) = run_unfinished(&deps, deadline).await {
            tracing::warn!(error = %e, "report runs failed; the next tick retries");
        }
        busy.store(false, Ordering::Release);
    }))
}

/// Unfinished reports one run looks through for ones it may take.
const SCAN: usize = 2000;

/// The runner's part: takes up to [`PER_RUN`] unfinished reports (the
/// oldest first, at most one per tenant: a tenant's running slot) while
/// `deadline` has not passed, and runs them side by side. Answers how
/// many it finished.
pub async fn run_unfinished(deps: &Deps, deadline: Instant) -> Result<usize, StoreError> {
    let mut query = Query::partition(keys::unfinished_reports())
        .on(Index::Gsi2)
        .limit(PAGE);
    let mut claimed: Vec<Report> = Vec::new();
    let mut tried = std::collections::HashSet::new();
    let mut seen = 0;
    'pages: loop {
        let page = deps.store.query(&query).await?;
        for item in page.items {
            seen += 1;
            let listed: Report = from_item(item)?;
            // One try per tenant and run: a tenant whose slot is taken
            // waits, the others go on.
            if !tried.insert(listed.tenant()) {
                continue;
            }
            if claimed.len() >= PER_RUN || Instant::now() >= deadline {
                break 'pages;
            }
            match claim(deps, listed.clone(), deps.clock.now()).await {
                Ok(Some(held)) => claimed.push(held),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(report = %listed.id, error = %e, "report claim failed; the next run retries")
                }
            }
        }
        match page.last_key {
            Some(last) if seen < SCAN => query.start_after = Some(last),
            _ => break,
        }
    }
    let runs = claimed.into_iter().map(|held| run_claimed(deps, held));
    let mut done = 0;
    for ran in futures::future::join_all(runs).await {
        match ran {
            Ok(r) if r.status.finished() => done += 1,
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "report run failed; the next run retries"),
        }
    }
    Ok(done)
}

/// The id bound of kind `kind` at `at` (lowest or highest of that ms).
fn id_bound(kind: IdKind, at: Timestamp, high: bool) -> String {
    let ms = u64::try_from(at.unix_millis()).unwrap_or(0);
    let random = if high { (1u128 << 80) - 1 } else { 0 };
    let ulid = ulid::Ulid::from_parts(ms, random);
    format!("{}{}", kind.prefix(), ulid.to_string().to_ascii_lowercase())
}

/// One query of a report's records, and the run whose findings it reads
/// (a reconciliation export).
#[derive(Clone)]
struct Part {
    query: Query,
    run: Option<Arc<Run>>,
}

/// The queries of `report`'s records, in the order they are written.
async fn parts_of(deps: &Deps, report: &Report) -> Result<Vec<Part>, StoreError> {
    if report.report_type != ReportType::Reconciliation {
        return Ok(vec![Part {
            query: query_of(report),
            run: None,
        }]);
    }
    let runs =
        recon_runs::completed_between(deps, &report.tenant(), report.from, report.to).await?;
    Ok(runs
        .into_iter()
        .map(|run| Part {
            query: recon_runs::findings_query(&run.id).limit(PAGE),
            run: Some(Arc::new(run)),
        })
        .collect())
}

/// The query of `report`'s records, oldest first.
///
/// Billing invoices of a sandbox project are read whole (their
/// `createdAt` follows a test clock, which strays from the id's time by
/// months); in live mode, as payments and refunds, by the id range.
fn query_of(report: &Report) -> Query {
    let (partition, kind) = match report.report_type {
        ReportType::Payments => (
            keys::per_mode(&report.project_id, report.mode, keys::PerMode::Payments),
            IdKind::Payment,
        ),
        ReportType::Refunds => (
            keys::per_mode(&report.project_id, report.mode, keys::PerMode::Refunds),
            IdKind::Refund,
        ),
        // A reconciliation export reads its runs' findings instead
        // ([`parts_of`]); never asked here.
        ReportType::BillingInvoices | ReportType::Reconciliation => (
            BillingInvoice::list_partition(&report.tenant()),
            IdKind::BillingInvoice,
        ),
    };
    let query = Query::partition(partition).on(Index::Gsi1).limit(PAGE);
    if report.report_type == ReportType::BillingInvoices && !report.mode.is_live() {
        return query;
    }
    let low = id_bound(kind, report.from.plus(-MARGIN), false);
    let high = id_bound(kind, report.to.plus(MARGIN), true);
    query.sk(SkCond::Between(low, high))
}

/// The CSV rows of one page of `kind`'s records that fall in `[from, to)`
/// (a reconciliation page: every finding of `run`).
fn page_rows(
    kind: ReportType,
    items: Vec<Item>,
    from: Timestamp,
    to: Timestamp,
    run: Option<&Run>,
) -> Result<Vec<Vec<String>>, StoreError> {
    match kind {
        ReportType::Reconciliation => {
            let Some(run) = run else {
                return Ok(Vec::new());
            };
            items
                .into_iter()
                .map(|item| from_item::<StoredFinding>(item).map(|f| finding_row(run, &f)))
                .collect()
        }
        ReportType::Payments => rows_of::<Payment>(items, from, to, |p| p.created_at, payment_row),
        ReportType::Refunds => rows_of::<Refund>(items, from, to, |r| r.created_at, refund_row),
        ReportType::BillingInvoices => {
            rows_of::<BillingInvoice>(items, from, to, |i| i.created_at, invoice_row)
        }
    }
}

/// The rows of one page's items that fall in `[from, to)`.
fn rows_of<T: DeserializeOwned>(
    items: Vec<Item>,
    from: Timestamp,
    to: Timestamp,
    created: fn(&T) -> Timestamp,
    row: fn(&T) -> Vec<String>,
) -> Result<Vec<Vec<String>>, StoreError> {
    let mut rows = Vec::with_capacity(items.len());
    for item in items {
        let record: T = from_item(item)?;
        let at = created(&record);
        if at >= from && at < to {
            rows.push(row(&record));
        }
    }
    Ok(rows)
}

/// Where a run is: the part being read and its next page's start, rows
/// so far, rows since the last progress save.
struct Cursor {
    part: usize,
    next: Option<Item>,
    rows: u64,
    unsaved: u64,
}

fn blob_error(e: impl std::fmt::Display) -> BlobError {
    BlobError::Backend(e.to_string())
}

/// Streams the report's CSV into the blob store. Answers rows and bytes.
async fn write(deps: &Deps, held: Arc<Mutex<Report>>) -> Result<(u64, u64), ReportError> {
    let report = held.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let parts = Arc::new(parts_of(deps, &report).await?);
    let kind = report.report_type;
    let (from, to) = (report.from, report.to);
    let header = lines(&[columns(kind).iter().map(|c| (*c).to_owned()).collect()])
        .map_err(|e| ReportError::Blobs(blob_error(e)))?;
    let busy = Arc::new(Mutex::new(false));
    let cursor = Cursor {
        part: 0,
        next: None,
        rows: 0,
        unsaved: 0,
    };
    let progress = held.clone();
    let lost = busy.clone();
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    let chunks =
        futures::stream::try_unfold((cursor, Some(header)), move |(mut cursor, header)| {
            let parts = parts.clone();
            let progress = progress.clone();
            let lost = lost.clone();
            let counter = counter.clone();
            async move {
                if let Some(h) = header {
                    return Ok(Some((Bytes::from(h), (cursor, None))));
                }
                let Some(part) = parts.get(cursor.part) else {
                    return Ok(None);
                };
                let mut q = part.query.clone();
                q.start_after = cursor.next.take();
                let page = deps.store.query(&q).await.map_err(blob_error)?;
                cursor.next = page.last_key;
                if cursor.next.is_none() {
                    cursor.part += 1;
                }
                let rows = page_rows(kind, page.items, from, to, part.run.as_deref())
                    .map_err(blob_error)?;
                cursor.rows += rows.len() as u64;
                cursor.unsaved += rows.len() as u64;
                counter.store(cursor.rows, Ordering::Relaxed);
                if cursor.unsaved >= PROGRESS_EVERY {
                    cursor.unsaved = 0;
                    let seen = progress
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    let now = deps.clock.now();
                    let mut next = seen.clone();
                    next.rows = cursor.rows;
                    next.lease_until = Some(now.plus(LEASE));
                    next.updated_at = now;
                    let slot = ReportQuota::extend(&seen, now.plus(LEASE));
                    match save_with(deps, &seen, next, vec![slot]).await {
                        Ok(saved) => {
                            *progress.lock().unwrap_or_else(PoisonError::into_inner) = saved;
                        }
                        Err(ReportError::Busy) => {
                            *lost.lock().unwrap_or_else(PoisonError::into_inner) = true;
                            return Err(BlobError::Backend("report taken over".into()));
                        }
                        Err(e) => return Err(blob_error(e)),
                    }
                }
                let bytes = lines(&rows).map_err(blob_error)?;
                Ok(Some((Bytes::from(bytes), (cursor, None))))
            }
        });
    let chunks = chunks.boxed();
    let written = deps
        .blobs
        .put_stream(&report.blob_key(), "text/csv; charset=utf-8", chunks)
        .await;
    if *busy.lock().unwrap_or_else(PoisonError::into_inner) {
        return Err(ReportError::Busy);
    }
    let bytes = written?;
    Ok((total.load(Ordering::Relaxed), bytes))
}
