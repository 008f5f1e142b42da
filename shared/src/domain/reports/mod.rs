//! Exports (issue 41, part 3): `POST /v1/reports` starts a report of the
//! tenant's payments or refunds created in `[from, to)`; it is written as
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
pub use run::{LEASE, claim, run, run_unfinished, spawn_run};

use crate::Deps;
use crate::domain::record::{self, Entry, Record, Window};
use crate::domain::{Mode, Tenant};
use crate::ids::{ProjectId, ReportId};
use crate::keys;
use crate::refusal::Refusal;
use crate::store::{Index, Key, Query, StoreError, TxOp};
use crate::time::Timestamp;

/// The longest range one report covers.
pub const MAX_DAYS: i64 = 366;
/// A list's page size when the caller names none.
pub const DEFAULT_PAGE: usize = 20;

/// What a report exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportType {
    Payments,
    Refunds,
}

impl ReportType {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportType::Payments => "payments",
            ReportType::Refunds => "refunds",
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
}

crate::attrs! { Report {
    VERSION: i64 = version,
    STATUS: ReportStatus = status,
} }

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
    #[error("type must be one of 'payments', 'refunds'")]
    Type,
    #[error("type '{0}' is not available yet; use 'payments' or 'refunds'")]
    NotYet(&'static str),
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
            e @ (ReportError::Type | ReportError::NotYet(_)) => {
                Refusal::invalid("type", e.to_string())
            }
            e @ ReportError::Time(field) => Refusal::invalid(field, e.to_string()),
            e @ (ReportError::Order | ReportError::TooLong) => {
                Refusal::invalid("to", e.to_string())
            }
            ReportError::NotFound(id) => Refusal::not_found("report", id.as_str()),
            e @ ReportError::BadLink => Refusal::forbidden("download_link_invalid", e.to_string()),
            e @ ReportError::Expired => Refusal::forbidden("download_link_expired", e.to_string()),
            e @ ReportError::Busy => Refusal::conflict("version_conflict", e.to_string()),
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
        "billing_invoices" => return Err(ReportError::NotYet("billing_invoices")),
        "reconciliation" => return Err(ReportError::NotYet("reconciliation")),
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
    };
    deps.store.transact(vec![report.put_new()?]).await?;
    Ok(report)
}

/// The tenant's report `id` (another tenant's is not found).
pub async fn get(deps: &Deps, tenant: &Tenant, id: &ReportId) -> Result<Report, ReportError> {
    match record::get::<Report>(&*deps.store, &Report::key(id)).await? {
        Some(r) if tenant.owns(r.project_id.as_str(), r.mode) => Ok(r),
        _ => Err(ReportError::NotFound(id.clone())),
    }
}

/// A page of the tenant's reports, newest first, and the total.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    window: Window,
) -> Result<(Vec<Report>, u64), StoreError> {
    let query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::Reports,
    ))
    .on(Index::Gsi1)
    .backward();
    record::page_of(&*deps.store, &query, window).await
}

/// Writes `next` over `seen` (conditioned on the version read): `Busy`
/// when another writer came first.
pub(crate) async fn save(
    deps: &Deps,
    seen: &Report,
    mut next: Report,
) -> Result<Report, ReportError> {
    next.version = seen.version + 1;
    let op = TxOp::Put {
        item: next.to_item()?,
        cond: Some(Report::VERSION.eq(&seen.version)),
    };
    match deps.store.transact(vec![op]).await {
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
