//! Exports (issue 41, part 3): `POST /v1/reports` starts a report of the
//! tenant's payments, refunds or billing invoices created in `[from, to)`,
//! or of the findings of its reconciliation runs whose Nepal day begins
//! in `[from, to)`; it is written as
//! CSV to the blob store by a run ([`run`]) and then downloaded through a
//! link that expires (S3: a presigned GET; the local blob directory: a
//! link to `GET /exports/{id}` signed with a key derived from
//! the credentials master key, [`link`]).
//!
//! Who runs it: on the local gateway a task the POST spawns
//! ([`spawn_run`]); on AWS the scheduler ([`run_unfinished`], every
//! minute), which also takes over a run whose lease lapsed (a crashed
//! instance). A run claims the report (`pending` → `running`, conditioned
//! on the version read) before it writes, so two drivers never both write
//! it.
//!
//! Storage: a report at `RPT#<id>` / `RPT`, listed per tenant on `gsi1`
//! (`PROJ#<p>#<mode>#RPT`, by id, newest first) and, until it is `ready`
//! or `failed`, on `gsi2` (`RPTS#UNFINISHED`, by id). Its file is the blob
//! `reports/<project>/<id>.csv`.

pub mod csv;
pub mod link;
pub mod run;

use serde::{Deserialize, Serialize};

pub use link::{download, download_link};
pub use run::{LEASE, claim, kick, run, run_unfinished, spawn_run};

use crate::Deps;
use crate::domain::listing::counted;
use crate::domain::record::{self, Attr, Changes, Entry, Record, Window};
use crate::domain::{Mode, Tenant};
use crate::ids::{ProjectId, ReportId};
use crate::keys;
use crate::refusal::Refusal;
use crate::store::{Cond, Key, StoreError, TxOp};
use crate::time::Timestamp;

/// The error code of a `POST` refused at [`MAX_UNFINISHED`] (409). The
/// refusal writes it as a literal: the documentation guard
/// (`openapi::every_error_code_is_documented`) reads the calls' text.
pub const TOO_MANY_REPORTS: &str = "too_many_reports";

/// The longest range one report covers.
pub const MAX_DAYS: i64 = 366;
/// A list's page size when the caller names none.
pub const DEFAULT_PAGE: usize = 20;
/// Most unfinished (`pending` or `running`) reports one tenant may have:
/// the next `POST` is refused (`409 too_many_reports`) until one ends.
pub const MAX_UNFINISHED: i64 = 5;
/// Runs a report gets: one cut short (a timeout, a crash) or failed by
/// the store or the blob store is retried until then, then `failed`.
pub const MAX_ATTEMPTS: u32 = 3;

/// What a report exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportType {
    Payments,
    Refunds,
    BillingInvoices,
    /// The findings of the completed reconciliation runs whose Nepal day
    /// begins in the range.
    Reconciliation,
}

impl ReportType {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportType::Payments => "payments",
            ReportType::Refunds => "refunds",
            ReportType::BillingInvoices => "billing_invoices",
            ReportType::Reconciliation => "reconciliation",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    Pending,
    Running,
    Ready,
    Failed,
}

impl ReportStatus {
    pub fn finished(self) -> bool {
        matches!(self, ReportStatus::Ready | ReportStatus::Failed)
    }
}

/// A stored report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub id: ReportId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub report_type: ReportType,
    /// Records created at or after this time...
    pub from: Timestamp,
    /// ...and before this one.
    pub to: Timestamp,
    pub status: ReportStatus,
    /// Rows written so far (all of them once `ready`).
    #[serde(default)]
    pub rows: u64,
    /// The file's size once `ready`.
    #[serde(default)]
    pub bytes: u64,
    /// Why it failed (our words, never a backend's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// While `running`: until when its runner holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Timestamp>,
    pub version: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Runs started so far (each claim counts one): at
    /// [`MAX_ATTEMPTS`] the report is `failed`, not retried.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// Counted in its tenant's [`ReportQuota`] while unfinished (false for
    /// a report from before the quota).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// Counted in its tenant's list counters (`listing::counted`): set
    /// at creation, or by `dhukuti-admin lists migrate` for a report
    /// from before them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listed: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

/// One tenant's exports in flight (`RPTQ#<project>#<mode>` / `RPTQ`),
/// changed by updates only: how many of its reports are unfinished
/// (bounded by [`MAX_UNFINISHED`] at creation, one less when one ends,
/// in the transaction that ends it) and the one report it may have
/// running at a time (its runner's lease; a lapsed one frees the slot),
/// so one tenant never holds more than one of the runner's slots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportQuota {
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub unfinished: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<ReportId>,
    /// Unix milliseconds until which `running` holds the slot.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub running_until: i64,
}

crate::attrs! { ReportQuota {
    UNFINISHED: i64 = unfinished,
    RUNNING: Option<ReportId> = running,
    RUNNING_UNTIL: i64 = running_until,
} }

impl ReportQuota {
    pub fn key(tenant: &Tenant) -> Key {
        keys::report_quota(tenant.project.as_str(), tenant.mode)
    }

    /// Counts one more unfinished report, refused at the bound.
    fn take(tenant: &Tenant) -> TxOp {
        TxOp::Update {
            key: ReportQuota::key(tenant),
            update: Changes::<ReportQuota>::new()
                .add(ReportQuota::UNFINISHED, 1)
                .into(),
            cond: Some(Cond::Or(vec![
                ReportQuota::UNFINISHED.missing(),
                ReportQuota::UNFINISHED.lt(&MAX_UNFINISHED),
            ])),
        }
    }

    /// Counts one unfinished report less (`report` ends).
    fn give_back(report: &Report) -> Option<TxOp> {
        report.counted.then(|| TxOp::Update {
            key: ReportQuota::key(&report.tenant()),
            update: Changes::<ReportQuota>::new()
                .subtract(ReportQuota::UNFINISHED, 1)
                .into(),
            cond: None,
        })
    }

    /// Holds the tenant's running slot for `report` until `until`: free,
    /// lapsed before `now`, or already its own.
    fn hold(report: &Report, now: Timestamp, until: Timestamp) -> TxOp {
        TxOp::Update {
            key: ReportQuota::key(&report.tenant()),
            update: Changes::<ReportQuota>::new()
                .set_some(ReportQuota::RUNNING, &report.id)
                .set(ReportQuota::RUNNING_UNTIL, &until.unix_millis())
                .into(),
            cond: Some(Cond::Or(vec![
                ReportQuota::RUNNING.missing(),
                ReportQuota::RUNNING_UNTIL.lt(&now.unix_millis()),
                ReportQuota::RUNNING.is(&report.id),
            ])),
        }
    }

    /// Extends `report`'s hold of the slot (only while it is its own).
    fn extend(report: &Report, until: Timestamp) -> TxOp {
        TxOp::Update {
            key: ReportQuota::key(&report.tenant()),
            update: Changes::<ReportQuota>::new()
                .set(ReportQuota::RUNNING_UNTIL, &until.unix_millis())
                .into(),
            cond: Some(ReportQuota::RUNNING.is(&report.id)),
        }
    }

    /// Frees the slot if `report` holds it (best effort: a lapsed hold
    /// frees itself).
    async fn release(deps: &Deps, report: &Report) {
        let op = TxOp::Update {
            key: ReportQuota::key(&report.tenant()),
            update: Changes::<ReportQuota>::new()
                .remove(ReportQuota::RUNNING)
                .set(ReportQuota::RUNNING_UNTIL, &0i64)
                .into(),
            cond: Some(ReportQuota::RUNNING.is(&report.id)),
        };
        if let Err(e) = deps.store.transact(vec![op]).await
            && !e.is_condition_failure()
        {
            tracing::warn!(report = %report.id, error = %e, "report slot not released; its lease lapses");
        }
    }
}

crate::attrs! { Report {
    VERSION: i64 = version,
    STATUS: ReportStatus = status,
    LISTED: bool = listed,
} }

impl counted::Counted for Report {
    const COUNTED: Attr<Self, bool> = Report::LISTED;
    fn counted_list(&self) -> counted::CountedList {
        Report::counted_list_of(&self.tenant())
    }
    fn counted_id(&self) -> &str {
        self.id.as_str()
    }
    fn counted_created(&self) -> Timestamp {
        self.created_at
    }
    fn is_counted(&self) -> bool {
        self.listed
    }
    /// Written whole under its version: the mark bumps it, so a save
    /// from a read before the mark fails (`Busy`) rather than undo it.
    fn mark_counted(&self) -> Changes<Self> {
        Changes::new()
            .set(Report::LISTED, &true)
            .add(Report::VERSION, 1)
    }
}

impl Report {
    pub fn key(id: &ReportId) -> Key {
        keys::report(id)
    }

    /// Where its file lives.
    pub fn blob_key(&self) -> String {
        format!("reports/{}/{}.csv", self.project_id, self.id)
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// `tenant`'s counted list of reports (its `gsi1` partition).
    pub fn counted_list_of(tenant: &Tenant) -> counted::CountedList {
        counted::CountedList::new(
            counted::CountedKind::Reports,
            tenant.clone(),
            keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Reports),
        )
    }
}

impl Record for Report {
    fn item_key(&self) -> Key {
        Report::key(&self.id)
    }

    fn entries(&self) -> Vec<Entry> {
        let mut entries = vec![Entry::gsi1(
            keys::per_mode(&self.project_id, self.mode, keys::PerMode::Reports),
            self.id.to_string(),
        )];
        if !self.status.finished() {
            entries.push(Entry::gsi2(keys::unfinished_reports(), self.id.to_string()));
        }
        entries
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("type must be one of 'payments', 'refunds', 'billing_invoices', 'reconciliation'")]
    Type,
    #[error("{0} must be an ISO 8601 date-time, e.g. 2026-11-01T00:00:00Z")]
    Time(&'static str),
    #[error("to must be after from")]
    Order,
    #[error("a report covers at most {MAX_DAYS} days")]
    TooLong,
    #[error("no such report")]
    NotFound(ReportId),
    #[error("this download link is not valid")]
    BadLink,
    #[error("this download link has expired; ask GET /v1/reports/{{id}} for a fresh one")]
    Expired,
    #[error("the report changed meanwhile")]
    Busy,
    #[error(
        "this project already has {MAX_UNFINISHED} reports pending or running; \
         wait for one to be ready or failed (GET /v1/reports), then start another"
    )]
    TooMany,
    #[error("no key to sign download links with (the credentials master key)")]
    Unsigned,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("blob store: {0}")]
    Blobs(#[from] crate::blobs::BlobError),
}

impl From<ReportError> for Refusal {
    fn from(err: ReportError) -> Self {
        match err {
            e @ ReportError::Type => Refusal::invalid("type", e.to_string()),
            e @ ReportError::Time(field) => Refusal::invalid(field, e.to_string()),
            e @ (ReportError::Order | ReportError::TooLong) => {
                Refusal::invalid("to", e.to_string())
            }
            ReportError::NotFound(id) => Refusal::not_found("report", id.as_str()),
            e @ ReportError::BadLink => Refusal::forbidden("download_link_invalid", e.to_string()),
            e @ ReportError::Expired => Refusal::forbidden("download_link_expired", e.to_string()),
            e @ ReportError::Busy => Refusal::conflict("version_conflict", e.to_string()),
            e @ ReportError::TooMany => Refusal::conflict("too_many_reports", e.to_string()),
            e @ ReportError::Unsigned => Refusal::internal(&e),
            ReportError::Store(e) => e.into(),
            ReportError::Blobs(e) => Refusal::unavailable(&e),
        }
    }
}

/// What a caller asks for, as sent (the rules parse it: [`parse`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportRequest<'a> {
    pub report_type: &'a str,
    pub from: &'a str,
    pub to: &'a str,
}

/// The type and range of `req`, or the field at fault.
pub fn parse(req: &ReportRequest<'_>) -> Result<(ReportType, Timestamp, Timestamp), ReportError> {
    let kind = match req.report_type {
        "payments" => ReportType::Payments,
        "refunds" => ReportType::Refunds,
        "billing_invoices" => ReportType::BillingInvoices,
        "reconciliation" => ReportType::Reconciliation,
        _ => return Err(ReportError::Type),
    };
    let from = Timestamp::parse(req.from).ok_or(ReportError::Time("from"))?;
    let to = Timestamp::parse(req.to).ok_or(ReportError::Time("to"))?;
    if from >= to {
        return Err(ReportError::Order);
    }
    if to.datetime() - from.datetime() > chrono::Duration::days(MAX_DAYS) {
        return Err(ReportError::TooLong);
    }
    Ok((kind, from, to))
}

/// Starts a report for `tenant`: stored `pending`; nothing is read yet.
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    req: &ReportRequest<'_>,
    now: Timestamp,
) -> Result<Report, ReportError> {
    let (report_type, from, to) = parse(req)?;
    let report = Report {
        id: ReportId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        report_type,
        from,
        to,
        status: ReportStatus::Pending,
        rows: 0,
        bytes: 0,
        failure: None,
        lease_until: None,
        version: 1,
        created_at: now,
        updated_at: now,
        finished_at: None,
        attempts: 0,
        counted: true,
        listed: true,
    };
    let mut tries = 0;
    loop {
        let mut ops = vec![report.put_new()?, ReportQuota::take(tenant)];
        ops.extend(counted::Counted::count_ops(&report));
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(report),
            // A concurrent insert wrote a counter shard: try again.
            Err(e) if counted::is_conflict(&e) && tries < 10 => {
                tries += 1;
                crate::store::contention_backoff(tries).await;
            }
            // The id is new: only the bound can refuse it.
            Err(e) if e.is_condition_failure() => return Err(ReportError::TooMany),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The tenant's report `id` (another tenant's is not found).
pub async fn get(deps: &Deps, tenant: &Tenant, id: &ReportId) -> Result<Report, ReportError> {
    match record::get::<Report>(&*deps.store, &Report::key(id)).await? {
        Some(r) if tenant.owns(r.project_id.as_str(), r.mode) => Ok(r),
        _ => Err(ReportError::NotFound(id.clone())),
    }
}

/// A page of the tenant's reports, newest first, and the total: counted
/// (`listing::counted`), any offset at a bounded cost once the tenant is
/// covered.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    window: Window,
) -> Result<(Vec<Report>, u64), StoreError> {
    let store = &*deps.store;
    let covered = counted::covered(store, tenant, counted::CountedKind::Reports).await?;
    let (found, total, _) =
        counted::page(store, &Report::counted_list_of(tenant), &window, covered).await?;
    Ok((found, total))
}

/// Writes `next` over `seen` (conditioned on the version read): `Busy`
/// when another writer came first.
pub(crate) async fn save(deps: &Deps, seen: &Report, next: Report) -> Result<Report, ReportError> {
    save_with(deps, seen, next, Vec::new()).await
}

/// [`save`] with `also` in the same transaction; an end (`ready` or
/// `failed`) gives back the tenant's count of unfinished reports in it.
pub(crate) async fn save_with(
    deps: &Deps,
    seen: &Report,
    mut next: Report,
    mut also: Vec<TxOp>,
) -> Result<Report, ReportError> {
    next.version = seen.version + 1;
    if next.status.finished() && !seen.status.finished() {
        also.extend(ReportQuota::give_back(seen));
    }
    let mut ops = vec![TxOp::Put {
        item: next.to_item()?,
        cond: Some(Report::VERSION.eq(&seen.version)),
    }];
    ops.extend(also);
    match deps.store.transact(ops).await {
        Ok(()) => Ok(next),
        Err(e) if e.is_condition_failure() => Err(ReportError::Busy),
        Err(e) => Err(e.into()),
    }
}

/// A report as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Report)]
pub struct ReportView {
    /// `rpt_…`.
    pub id: String,
    /// Always `report`.
    pub object: &'static str,
    #[serde(rename = "type")]
    pub report_type: ReportType,
    pub from: Timestamp,
    pub to: Timestamp,
    /// `pending`, `running`, `ready` or `failed`.
    pub status: ReportStatus,
    /// Rows written so far (all of them once `ready`).
    pub rows: u64,
    /// The file's size in bytes once `ready`, else 0.
    pub bytes: u64,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// The CSV, while the link lasts (`ready` only).
    pub download_url: Option<String>,
    /// When `downloadUrl` stops working.
    pub download_expires_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub finished_at: Option<Timestamp>,
}

impl ReportView {
    /// `report` without a link (a list, or one not ready).
    pub fn of(report: &Report) -> Self {
        ReportView {
            id: report.id.to_string(),
            object: "report",
            report_type: report.report_type,
            from: report.from,
            to: report.to,
            status: report.status,
            rows: report.rows,
            bytes: report.bytes,
            failure: report.failure.clone(),
            download_url: None,
            download_expires_at: None,
            created_at: report.created_at,
            finished_at: report.finished_at,
        }
    }

    /// `report` with a fresh download link when it is `ready`.
    pub async fn with_link(
        deps: &Deps,
        report: &Report,
        now: Timestamp,
    ) -> Result<Self, ReportError> {
        let mut view = ReportView::of(report);
        if report.status == ReportStatus::Ready {
            let (url, expires) = download_link(deps, report, now).await?;
            view.download_url = Some(url);
            view.download_expires_at = Some(expires);
        }
        Ok(view)
    }
}

#[cfg(test)]
mod tests;
