//! Reconciliation runs: one provider's statement of one Nepal day matched
//! against the tenant's payments ([`super::matching`]), its findings kept
//! under the run.
//!
//! A run is written `running`, then its findings (`RRUN#<id>` /
//! `F#<n>`), then ONE transaction completes it: the run `completed` with
//! its counts, the claim of the statement's digest, and its
//! `reconciliation.completed` event. Findings are read only through a
//! completed run, so a reader sees all of them or none. The same
//! statement again (its digest, per provider and day) answers the run it
//! made and changes nothing; two at once: one completes, the other is
//! stored `failed` and answers the first.
//!
//! Our side of a day: the tenant's payments of the provider created from
//! the day before the Nepal day to its end, read by id range from the
//! tenant's payments list (ids sort by creation), so the cost follows the
//! days read, not the project's history.

use chrono::NaiveDate;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::matching::{self, Classification, Counts, Finding, Ours};
use super::statements::{LineKind, LineStatus, Statement, StatementLine};
use crate::Deps;
use crate::domain::listing::counted;
use crate::domain::outbox::{Event, EventType};
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::{self, Attr, Changes, Entry, Record, Window, from_item};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{IdKind, PaymentId, ProjectId, ReconRunId, StatementUploadId};
use crate::keys;
use crate::money::Paisa;
use crate::refusal::Refusal;
use crate::secrets::ProviderCredentials;
use crate::store::{Cond, Index, Key, Query, SkCond, Store, StoreError, TxOp};
use crate::time::{Clock, SystemClock, Timestamp};

/// A list's page size when the caller names none.
pub const DEFAULT_PAGE: usize = 20;
/// Findings written per transaction.
const FINDINGS_PER_WRITE: usize = 50;
/// Finding transactions in flight at once.
const WRITES_IN_FLIGHT: usize = 4;

/// Where a run's statement came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunSource {
    /// Pulled from the provider's API (Khalti's transaction list).
    Pull,
    /// A file the merchant uploaded (eSewa, Fonepay).
    Upload,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
}

/// A stored run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub id: ReconRunId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// The Nepal calendar day, `YYYY-MM-DD`.
    pub day: String,
    pub source: RunSource,
    /// Hex SHA-256 of the statement's bytes.
    pub digest: String,
    pub status: RunStatus,
    #[serde(default)]
    pub counts: Counts,
    /// Our successful payments of the day, in paisa.
    pub ours_total: Paisa,
    /// The statement's paid payment lines, in paisa.
    pub theirs_total: Paisa,
    /// Lines the statement had.
    pub lines: u32,
    /// Findings written (all of them once `completed`).
    pub findings: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    pub created_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// Its findings carry their rank within their classification (runs
    /// from before the ranks: false): a page of one classification is then
    /// a ranged read at any offset ([`findings`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ranked: bool,
    /// Counted in its tenant's list counters and their narrowings by
    /// provider and day ([`Run::counted_lists`]): set at creation, or by
    /// `dhukuti-admin lists migrate` for a run from before them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listed: bool,
}

crate::attrs! { Run {
    STATUS: RunStatus = status,
    PROVIDER: Provider = provider,
    DAY: String = day,
    LISTED: bool = listed,
} }

impl counted::Counted for Run {
    const COUNTED: Attr<Self, bool> = Run::LISTED;
    fn counted_list(&self) -> counted::CountedList {
        Run::counted_list_of(&self.tenant(), &RunFilter::default())
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
    /// In the list and the lists of its provider, its day, and both.
    fn count_ops(&self) -> Vec<TxOp> {
        counted::counts_in(&self.counted_lists(), self.id.as_str(), self.created_at)
    }
    /// Its entries in the provider and day lists come with the count: a
    /// run from before them has its `gsi1` entry only.
    fn mark_counted(&self) -> Changes<Self> {
        Changes::new().set(Run::LISTED, &true).enter(self.entries())
    }
    /// A running run is written whole when it ends: counted only once it
    /// has (the migration retries meanwhile), or once it is older than
    /// any run's process lives ([`STALE_RUN`]: it never ends).
    fn countable(&self) -> Option<Cond> {
        let stale = self.created_at.plus(STALE_RUN) < SystemClock.now();
        (!stale).then(|| Run::STATUS.ne(&RunStatus::Running))
    }
}

/// How long after its start a run still `running` can still end: a run is
/// made within one Lambda invocation (15 minutes at most); past this its
/// process is gone and nothing writes it again.
const STALE_RUN: chrono::Duration = chrono::Duration::hours(1);

impl Run {
    pub fn key(id: &ReconRunId) -> Key {
        keys::recon_run(id)
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// The lists it is in: all runs, its provider's, its day's and both's.
    pub fn counted_lists(&self) -> Vec<counted::CountedList> {
        let tenant = self.tenant();
        let provider = Some(self.provider);
        let mut filters = vec![
            RunFilter::default(),
            RunFilter {
                provider,
                day: None,
            },
        ];
        // A day is always stored `YYYY-MM-DD`.
        if let Ok(d) = NaiveDate::parse_from_str(&self.day, "%Y-%m-%d") {
            filters.push(RunFilter {
                provider: None,
                day: Some(d),
            });
            filters.push(RunFilter {
                provider,
                day: Some(d),
            });
        }
        filters
            .iter()
            .map(|f| Run::counted_list_of(&tenant, f))
            .collect()
    }

    /// `tenant`'s counted list of the runs `filter` shows: all of them
    /// (`gsi1`), of a provider (`gsi4`, a member of the list's
    /// counters), of a Nepal day (`gsi5`, its own counters: days are
    /// unbounded), of both (`gsi6`, likewise).
    pub fn counted_list_of(tenant: &Tenant, filter: &RunFilter) -> counted::CountedList {
        let all = keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::ReconRuns);
        let list =
            counted::CountedList::new(counted::CountedKind::ReconRuns, tenant.clone(), all.clone());
        let day = filter.day.map(|d| d.format("%Y-%m-%d").to_string());
        match (filter.provider, day) {
            (None, None) => list,
            (Some(p), None) => list.narrowed(
                &format!("p_{}", p.as_str()),
                Index::Gsi4,
                format!("{all}#P#{}", p.as_str()),
            ),
            (None, Some(d)) => list.scoped(&format!("day_{d}")).narrowed(
                "all",
                Index::Gsi5,
                format!("{all}#D#{d}"),
            ),
            (Some(p), Some(d)) => list.scoped(&format!("day_{d}_{}", p.as_str())).narrowed(
                "all",
                Index::Gsi6,
                format!("{all}#DP#{d}#{}", p.as_str()),
            ),
        }
    }
}

impl Record for Run {
    fn item_key(&self) -> Key {
        Run::key(&self.id)
    }

    /// Its place in each of [`Run::counted_lists`], by id.
    fn entries(&self) -> Vec<Entry> {
        counted::entries_in(&self.counted_lists(), self.id.as_str())
    }
}

/// One stored finding of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFinding {
    pub run_id: ReconRunId,
    /// 1-based, in the run's order.
    pub n: u32,
    #[serde(flatten)]
    pub finding: Finding,
    /// When "settle from provider" paid its payment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<Timestamp>,
    /// Its number among its run's findings of its classification
    /// (1-based; none on a run from before the ranks): its place in the
    /// classification's `gsi1` partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

crate::attrs! { StoredFinding {
    CLASSIFICATION: Classification = finding.classification,
    SETTLED_AT: Option<Timestamp> = settled_at,
} }

impl StoredFinding {
    pub fn key(run: &ReconRunId, n: u32) -> Key {
        keys::recon_finding(run, n)
    }
}

impl Record for StoredFinding {
    fn item_key(&self) -> Key {
        StoredFinding::key(&self.run_id, self.n)
    }

    fn entries(&self) -> Vec<Entry> {
        self.rank
            .map(|rank| {
                Entry::gsi1(
                    keys::recon_findings_by(
                        self.run_id.as_str(),
                        self.finding.classification.as_str(),
                    ),
                    rank_sort(rank),
                )
            })
            .into_iter()
            .collect()
    }
}

/// The sort key of rank `rank` (zero-padded: ranks sort in order).
fn rank_sort(rank: u32) -> String {
    format!("{rank:06}")
}

/// The claim of a statement already run: which run it made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestClaim {
    pub run_id: ReconRunId,
    #[serde(skip)]
    pub key: Option<Key>,
}

impl Record for DigestClaim {
    fn item_key(&self) -> Key {
        self.key.clone().unwrap_or_else(|| Key::new("", ""))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("provider must be one of 'esewa', 'khalti', 'fonepay'")]
    Provider,
    #[error("date must be a Nepal calendar day, YYYY-MM-DD")]
    Day,
    #[error("{0}")]
    File(String),
    #[error("{1}")]
    Field(&'static str, String),
    #[error(
        "this statement is for merchant account '{found}', not this project's {} account", .provider.as_str()
    )]
    Account { provider: Provider, found: String },
    #[error("no such reconciliation run")]
    NotFound(ReconRunId),
    #[error("no such finding: {0}")]
    NoFinding(u32),
    #[error("{0}")]
    NotSettleable(String),
    #[error("{0}")]
    NotConfirmed(String),
    #[error("{0}")]
    Provider2(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<RunError> for Refusal {
    fn from(err: RunError) -> Self {
        match err {
            e @ RunError::Provider => Refusal::invalid("provider", e.to_string()),
            e @ RunError::Day => Refusal::invalid("date", e.to_string()),
            RunError::File(m) => Refusal::invalid("file", m),
            RunError::Field(f, m) => Refusal::invalid(f, m),
            e @ RunError::Account { .. } => Refusal::invalid("file", e.to_string()),
            RunError::NotFound(id) => Refusal::not_found("reconciliation run", id.as_str()),
            RunError::NoFinding(n) => Refusal::not_found("finding", &n.to_string()),
            RunError::NotSettleable(m) => Refusal::conflict("state_conflict", m),
            RunError::NotConfirmed(m) => Refusal::conflict("provider_not_confirmed", m),
            RunError::Provider2(m) => {
                Refusal::new(crate::refusal::Kind::Unavailable, "provider_error", m)
            }
            RunError::Store(e) => e.into(),
        }
    }
}

/// `date` as a Nepal day.
pub fn parse_day(date: &str) -> Result<NaiveDate, RunError> {
    NaiveDate::parse_from_str(date, "%Y-%m-%d").map_err(|_| RunError::Day)
}

/// `provider` as one of ours.
pub fn parse_provider(provider: &str) -> Result<Provider, RunError> {
    Provider::parse(provider).ok_or(RunError::Provider)
}

/// The merchant account a statement must be for: the project's own
/// configured one (eSewa product code, Fonepay merchant code); none for
/// Khalti (its list is pulled with the project's own key).
pub async fn configured_account(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
) -> Result<Option<String>, RunError> {
    let creds =
        crate::domain::credentials::for_provider(&*deps.store, &deps.providers, tenant, provider)
            .await;
    Ok(match creds {
        Ok(ProviderCredentials::Esewa { product_code, .. }) => Some(product_code),
        Ok(ProviderCredentials::Fonepay { merchant_code, .. }) => Some(merchant_code),
        Ok(ProviderCredentials::Khalti { .. }) | Err(_) => None,
    })
}

/// What `POST /v1/reconciliation/runs` asks, as sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunRequest<'a> {
    pub provider: &'a str,
    pub date: &'a str,
    pub upload_id: Option<&'a str>,
}

/// Runs the statement `req` names: Khalti's list pulled from Khalti for
/// the day, or the eSewa or Fonepay file uploaded to `uploadId`.
pub async fn start(
    deps: &Deps,
    tenant: &Tenant,
    req: &RunRequest<'_>,
    now: Timestamp,
) -> Result<Run, RunError> {
    let provider = parse_provider(req.provider)?;
    let day = parse_day(req.date)?;
    let (statement, source) = match (provider, req.upload_id) {
        (Provider::Khalti, Some(_)) => {
            return Err(RunError::Field(
                "uploadId",
                "Khalti's statement is pulled from Khalti: send no uploadId".into(),
            ));
        }
        (Provider::Khalti, None) => {
            let statement = pull_khalti(deps, tenant, day).await?;
            // A tenant whose own Khalti credentials predate the daily
            // pull's list is listed now (`enroll`: one read when it is).
            if let Err(e) = super::enroll::tenant(&*deps.store, tenant, provider, now).await {
                tracing::warn!(project = %tenant.project, error = %e, "could not list the tenant for the daily Khalti pull");
            }
            (statement, RunSource::Pull)
        }
        (_, None) => {
            return Err(RunError::Field(
                "uploadId",
                format!(
                    "uploadId is required: upload the {} statement file first \
                     (POST /v1/reconciliation/uploads)",
                    provider.as_str()
                ),
            ));
        }
        (_, Some(id)) => {
            let id = StatementUploadId::parse(id)
                .ok_or_else(|| RunError::Field("uploadId", "no such upload".into()))?;
            let bytes = super::uploads::file_of(deps, tenant, &id, provider, day).await?;
            (parse_file(provider, &bytes)?, RunSource::Upload)
        }
    };
    execute(deps, tenant, day, &statement, source, now).await
}

/// Runs an eSewa or Fonepay statement file the request carried itself
/// (the dashboard's form, `dhukuti-admin reconcile --file`): the checks
/// and the run of [`start`] with an upload, without the upload slot.
pub async fn start_file(
    deps: &Deps,
    tenant: &Tenant,
    provider: &str,
    date: &str,
    bytes: &[u8],
    now: Timestamp,
) -> Result<Run, RunError> {
    let provider = parse_provider(provider)?;
    let day = parse_day(date)?;
    if provider == Provider::Khalti {
        return Err(RunError::Field(
            "provider",
            "Khalti's statement is pulled from Khalti: run it without a file".into(),
        ));
    }
    let statement = parse_file(provider, bytes)?;
    execute(deps, tenant, day, &statement, RunSource::Upload, now).await
}

/// An uploaded file read as `provider`'s statement.
fn parse_file(provider: Provider, bytes: &[u8]) -> Result<Statement, RunError> {
    super::statements::parse(provider, bytes).map_err(|e| RunError::File(e.to_string()))
}

/// Khalti's transaction list of `day`, pulled with the project's key.
async fn pull_khalti(deps: &Deps, tenant: &Tenant, day: NaiveDate) -> Result<Statement, RunError> {
    use super::statements::khalti::{PullError, pull};
    pull(deps, tenant, day).await.map_err(|e| match e {
        PullError::Credentials(e) => RunError::Field("provider", e.to_string()),
        PullError::Provider(e) => RunError::Provider2(e.to_string()),
        PullError::Records(e) => RunError::File(e.to_string()),
    })
}

/// Runs `statement` for `tenant`'s `provider` on Nepal day `day`: the
/// run, completed with its findings; or the run the same statement made
/// before.
pub async fn execute(
    deps: &Deps,
    tenant: &Tenant,
    day: NaiveDate,
    statement: &Statement,
    source: RunSource,
    now: Timestamp,
) -> Result<Run, RunError> {
    let provider = statement.provider;
    let day_text = day.format("%Y-%m-%d").to_string();
    if let Some(found) = &statement.account {
        if let Some(ours) = configured_account(deps, tenant, provider).await? {
            if found.trim() != ours {
                return Err(RunError::Account {
                    provider,
                    found: found.clone(),
                });
            }
        }
    }
    if let Some(line) = matching::outside_day(day, &statement.lines) {
        return Err(RunError::File(format!(
            "line {}: dated {} (Nepal time), outside the run's day {day_text}",
            line.line,
            line.at
                .plus(chrono::Duration::minutes(345))
                .datetime()
                .format("%Y-%m-%d %H:%M")
        )));
    }
    let claim_key = keys::recon_digest(
        &tenant.project,
        tenant.mode,
        provider,
        &day_text,
        &statement.digest,
    );
    if let Some(done) = claimed_run(deps, &claim_key).await? {
        return Ok(done);
    }
    let (mut ours, tokens): (Vec<Ours>, Vec<Option<String>>) = ours_of(deps, tenant, provider, day)
        .await?
        .into_iter()
        .unzip();
    if provider == Provider::Khalti {
        learn_transaction_ids(deps, tenant, &mut ours, &tokens, &statement.lines).await;
    }
    let findings = matching::classify(&ours, &statement.lines);
    let (ours_total, theirs_total) = matching::totals(&ours, &statement.lines);
    let mut run = Run {
        id: ReconRunId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        provider,
        day: day_text,
        source,
        digest: statement.digest.clone(),
        status: RunStatus::Running,
        counts: Counts::default(),
        ours_total,
        theirs_total,
        lines: u32::try_from(statement.lines.len()).unwrap_or(u32::MAX),
        findings: 0,
        failure: None,
        created_at: now,
        completed_at: None,
        ranked: true,
        listed: true,
    };
    insert(deps, &run).await?;
    write_findings(deps, &run.id, findings.clone()).await?;
    run.status = RunStatus::Completed;
    run.counts = matching::counts(&findings);
    run.findings = u32::try_from(findings.len()).unwrap_or(u32::MAX);
    run.completed_at = Some(now);
    complete(deps, run, claim_key, now).await
}

/// The run a statement's claim names, if it was run before.
async fn claimed_run(deps: &Deps, claim: &Key) -> Result<Option<Run>, RunError> {
    let Some(c) = record::get::<DigestClaim>(&*deps.store, claim).await? else {
        return Ok(None);
    };
    Ok(record::get::<Run>(&*deps.store, &Run::key(&c.run_id)).await?)
}

/// The one write that makes `run`'s findings visible: the run completed,
/// the digest claimed, the event. Lost to another run of the same
/// statement: this one is stored `failed` and the other answered.
async fn complete(deps: &Deps, run: Run, claim_key: Key, now: Timestamp) -> Result<Run, RunError> {
    let claim = DigestClaim {
        run_id: run.id.clone(),
        key: Some(claim_key.clone()),
    };
    let view =
        serde_json::to_value(RunView::of(&run)).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let mut ops = vec![
        TxOp::Put {
            item: run.to_item()?,
            cond: Some(Run::STATUS.eq(&RunStatus::Running)),
        },
        claim.put_new()?,
    ];
    ops.extend(Event::new(EventType::ReconciliationCompleted, &run.tenant(), view, now).put_ops()?);
    match deps.store.transact(ops).await {
        Ok(()) => Ok(run),
        Err(e) if e.is_condition_failure() => {
            let Some(other) = claimed_run(deps, &claim_key).await? else {
                return Err(e.into());
            };
            let mut failed = run;
            failed.status = RunStatus::Failed;
            failed.completed_at = None;
            failed.failure = Some(format!(
                "the same statement was run meanwhile: {}",
                other.id
            ));
            deps.store.put(failed.to_item()?, None).await?;
            Ok(other)
        }
        Err(e) => Err(e.into()),
    }
}

async fn write_findings(
    deps: &Deps,
    run: &ReconRunId,
    findings: Vec<Finding>,
) -> Result<(), StoreError> {
    let mut ranks = Counts::default();
    let stored: Vec<StoredFinding> = findings
        .into_iter()
        .enumerate()
        .map(|(i, finding)| {
            let rank = ranks.bump(finding.classification);
            StoredFinding {
                run_id: run.clone(),
                n: u32::try_from(i + 1).unwrap_or(u32::MAX),
                finding,
                settled_at: None,
                rank: Some(rank),
            }
        })
        .collect();
    let mut batches = Vec::new();
    for chunk in stored.chunks(FINDINGS_PER_WRITE) {
        let ops = chunk
            .iter()
            .map(|f| f.to_item().map(|item| TxOp::Put { item, cond: None }))
            .collect::<Result<Vec<_>, _>>()?;
        batches.push(ops);
    }
    let store = &*deps.store;
    let results: Vec<Result<(), StoreError>> = futures::stream::iter(batches)
        .map(|ops| store.transact(ops))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The tenant's payments of `provider` created from the day before
/// `day` to its end (Nepal time), each marked whether it was created on
/// `day`, with the provider's token of its attempt (Khalti's `pidx`).
async fn ours_of(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
    day: NaiveDate,
) -> Result<Vec<(Ours, Option<String>)>, StoreError> {
    let (start, end) = matching::day_bounds(day);
    let from = start.plus(chrono::Duration::days(-1));
    let id_at = |at: Timestamp, random: u128| {
        let ms = u64::try_from(at.unix_millis()).unwrap_or(0);
        format!(
            "{}{}",
            IdKind::Payment.prefix(),
            ulid::Ulid::from_parts(ms, random)
                .to_string()
                .to_ascii_lowercase()
        )
    };
    let mut query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::Payments,
    ))
    .on(Index::Gsi1)
    .sk(SkCond::Between(id_at(from, 0), id_at(end, u128::MAX)))
    .filter(Payment::PROVIDER.eq(&provider));
    let mut out = Vec::new();
    loop {
        let page = deps.store.query(&query).await?;
        for item in page.items {
            let p: Payment = from_item(item)?;
            out.push((ours_view(&p, start, end), p.attempt.provider_token.clone()));
        }
        match page.last_key {
            Some(k) => query.start_after = Some(k),
            None => break,
        }
    }
    Ok(out)
}

/// Khalti lookups one run makes at most to learn transaction ids
/// ([`learn_transaction_ids`]).
pub const MAX_LOOKUPS: usize = 25;
/// Of those, how many at once.
const LOOKUPS_IN_FLIGHT: usize = 5;
/// No lookup starts after this long (a run answers an API request).
const LOOKUP_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// Which of our payments a Khalti run looks up ([`learn_transaction_ids`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookups {
    /// Indices into `ours`, in the order to ask: those created on the
    /// run's day first, at most [`MAX_LOOKUPS`].
    pub picked: Vec<usize>,
    /// Candidates left out by the bound.
    pub over: usize,
}

/// The paid payment lines that name none of `ours`.
fn unmatched_paid<'a>(ours: &[Ours], lines: &'a [StatementLine]) -> Vec<&'a StatementLine> {
    let refs: std::collections::HashSet<&str> = ours
        .iter()
        .flat_map(|o| [o.reference.as_deref(), o.provider_ref.as_deref()])
        .flatten()
        .collect();
    lines
        .iter()
        .filter(|l| {
            l.kind == LineKind::Payment
                && matches!(l.status, LineStatus::Success | LineStatus::Refunded)
        })
        .filter(|l| {
            ![l.reference.as_deref(), l.provider_ref.as_deref()]
                .into_iter()
                .flatten()
                .any(|r| refs.contains(r))
        })
        .collect()
}

/// The payments of ours a Khalti line that matches nothing may be: not
/// paid here, their transaction id unknown (`providerRef` unset), with the
/// `pidx` to look them up by (`tokens`, by index), of the amount of such a
/// line. None when every paid line found its payment.
pub fn lookup_candidates(
    ours: &[Ours],
    tokens: &[Option<String>],
    lines: &[StatementLine],
) -> Lookups {
    let amounts: std::collections::HashSet<Paisa> = unmatched_paid(ours, lines)
        .iter()
        .map(|l| l.amount)
        .collect();
    if amounts.is_empty() {
        return Lookups::default();
    }
    let mut all: Vec<usize> = (0..ours.len())
        .filter(|&i| {
            let o = &ours[i];
            o.provider_ref.is_none()
                && !matches!(o.status, PaymentStatus::Success | PaymentStatus::Refunded)
                && tokens.get(i).is_some_and(Option::is_some)
                && amounts.contains(&o.amount)
        })
        .collect();
    all.sort_by_key(|&i| !ours[i].on_day);
    let over = all.len().saturating_sub(MAX_LOOKUPS);
    all.truncate(MAX_LOOKUPS);
    Lookups { picked: all, over }
}

/// Khalti's list names only its transaction id (`idx`), which a payment
/// of ours learns when it settles: one paid whose return never reached us
/// would match no line. For the lines that match nothing, look up (by
/// `pidx`, the verification client's status check) the candidates of
/// [`lookup_candidates`], a few at a time, until every such line is
/// explained, [`MAX_LOOKUPS`] were asked, or [`LOOKUP_BUDGET`] passed; a
/// transaction id learned that a line names is set on the payment's view
/// for matching only (`missing_in_dhukuti`). Nothing is stored and no
/// payment is settled here: "settle from provider" asks again. A lookup
/// that fails is logged and its line stays `not_ours`.
async fn learn_transaction_ids(
    deps: &Deps,
    tenant: &Tenant,
    ours: &mut [Ours],
    tokens: &[Option<String>],
    lines: &[StatementLine],
) {
    let lookups = lookup_candidates(ours, tokens, lines);
    if lookups.picked.is_empty() {
        return;
    }
    let mut wanted: std::collections::HashSet<String> = unmatched_paid(ours, lines)
        .iter()
        .filter_map(|l| l.provider_ref.clone())
        .collect();
    if lookups.over > 0 {
        tracing::warn!(project = %tenant.project, mode = tenant.mode.as_str(), asked = lookups.picked.len(), left = lookups.over, "Khalti run: more payments to look up than the bound; their lines may show as not_ours");
    }
    let provider = Provider::Khalti;
    let creds = match crate::domain::credentials::for_provider(
        &*deps.store,
        &deps.providers,
        tenant,
        provider,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(project = %tenant.project, error = %e, "Khalti run: no credentials to look payments up");
            return;
        }
    };
    let client = match deps.providers.client(tenant.mode, provider) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(project = %tenant.project, error = %e, "Khalti run: no client to look payments up");
            return;
        }
    };
    let started = std::time::Instant::now();
    let mut learned: Vec<(usize, String)> = Vec::new();
    for chunk in lookups.picked.chunks(LOOKUPS_IN_FLIGHT) {
        if wanted.is_empty() || started.elapsed() >= LOOKUP_BUDGET {
            break;
        }
        let view: &[Ours] = ours;
        let asks = chunk.iter().map(|&i| {
            let query = crate::providers::StatusQuery {
                reference: view[i].reference.clone().unwrap_or_default(),
                amount: view[i].amount,
                provider_ref: tokens.get(i).cloned().flatten(),
            };
            let creds = &creds;
            async move { (i, client.status(creds, &query).await) }
        });
        for (i, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(status) => {
                    if let Some(txn) = status.provider_ref.filter(|t| wanted.remove(t)) {
                        learned.push((i, txn));
                    }
                }
                Err(e) => {
                    tracing::warn!(project = %tenant.project, payment = %view[i].payment_id, error = %e, "Khalti run: lookup failed; its line, if any, stays not_ours");
                }
            }
        }
    }
    for (i, txn) in learned {
        ours[i].provider_ref = Some(txn);
    }
}

fn ours_view(p: &Payment, start: Timestamp, end: Timestamp) -> Ours {
    Ours {
        payment_id: p.id.clone(),
        reference: p.attempt.reference.clone(),
        provider_ref: p.provider_ref.clone(),
        status: p.status,
        amount: p.amount,
        amount_refunded: p.amount_refunded,
        fee: p.fee().map(|(f, _)| f),
        on_day: p.created_at >= start && p.created_at < end,
    }
}

/// The tenant's run `id` (another tenant's is not found).
pub async fn get(deps: &Deps, tenant: &Tenant, id: &ReconRunId) -> Result<Run, RunError> {
    match record::get::<Run>(&*deps.store, &Run::key(id)).await? {
        Some(r) if tenant.owns(r.project_id.as_str(), r.mode) => Ok(r),
        _ => Err(RunError::NotFound(id.clone())),
    }
}

/// Which runs a list shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub provider: Option<Provider>,
    pub day: Option<NaiveDate>,
}

/// Stores a new run, counted in its lists (a counter-shard conflict with
/// a concurrent insert is retried).
async fn insert(deps: &Deps, run: &Run) -> Result<(), StoreError> {
    store_new(&*deps.store, run).await
}

/// [`insert`] on a store (tests seed runs with it).
pub async fn store_new(store: &dyn Store, run: &Run) -> Result<(), StoreError> {
    let mut tries = 0;
    loop {
        let mut ops = vec![run.put_new()?];
        ops.extend(counted::Counted::count_ops(run));
        match store.transact(ops).await {
            Err(e) if counted::is_conflict(&e) && tries < 10 => {
                tries += 1;
                crate::store::contention_backoff(tries).await;
            }
            done => return done,
        }
    }
}

/// A page of the tenant's runs, newest first, and the total. Counted
/// (`listing::counted`): each filter is its own list, any offset at a
/// bounded cost once the tenant is covered; until then filtered and
/// skipped through the list.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    filter: &RunFilter,
    window: Window,
) -> Result<(Vec<Run>, u64), StoreError> {
    let store = &*deps.store;
    if counted::covered(store, tenant, counted::CountedKind::ReconRuns).await? {
        let list = Run::counted_list_of(tenant, filter);
        let (found, total, _) = counted::page(store, &list, &window, true).await?;
        return Ok((found, total));
    }
    let mut query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::ReconRuns,
    ))
    .on(Index::Gsi1)
    .backward();
    let mut conds = Vec::new();
    if let Some(p) = filter.provider {
        conds.push(Run::PROVIDER.eq(&p));
    }
    if let Some(d) = filter.day {
        conds.push(Run::DAY.eq(&d.format("%Y-%m-%d").to_string()));
    }
    if !conds.is_empty() {
        query = query.filter(Cond::And(conds));
    }
    record::page_of(&*deps.store, &query, window).await
}

/// The tenant's completed runs whose Nepal day begins in `[from, to)`,
/// by day, provider and completion (the reconciliation export). Reads
/// the tenant's runs list (a few runs a day), filtered to `completed`.
pub async fn completed_between(
    deps: &Deps,
    tenant: &Tenant,
    from: Timestamp,
    to: Timestamp,
) -> Result<Vec<Run>, StoreError> {
    let mut query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::ReconRuns,
    ))
    .on(Index::Gsi1)
    .filter(Run::STATUS.eq(&RunStatus::Completed));
    let mut out = Vec::new();
    loop {
        let page = deps.store.query(&query).await?;
        for item in page.items {
            let run: Run = from_item(item)?;
            let Ok(day) = NaiveDate::parse_from_str(&run.day, "%Y-%m-%d") else {
                continue;
            };
            let (start, _) = matching::day_bounds(day);
            if start >= from && start < to {
                out.push(run);
            }
        }
        match page.last_key {
            Some(k) => query.start_after = Some(k),
            None => break,
        }
    }
    out.sort_by(|a, b| {
        (&a.day, a.provider.as_str(), a.completed_at, &a.id).cmp(&(
            &b.day,
            b.provider.as_str(),
            b.completed_at,
            &b.id,
        ))
    });
    Ok(out)
}

/// The query of run `id`'s findings, in order (all of them: read only
/// through a completed run).
pub fn findings_query(id: &ReconRunId) -> Query {
    Query::partition(Run::key(id).pk).sk(SkCond::BeginsWith(keys::RECON_FINDING_PREFIX.to_owned()))
}

/// A page of a completed run's findings (of one classification, when
/// named), in order, and the total. A run not completed shows none.
///
/// At any offset one ranged read of the page: finding `n` is the run's
/// `n`th (its key), and finding of rank `r` the `r`th of its
/// classification (its `gsi1` entry); the totals are the run's counts. A
/// run from before the ranks (`ranked` false) is filtered and skipped
/// through its findings (at most a statement's lines and a day's
/// payments).
pub async fn findings(
    deps: &Deps,
    tenant: &Tenant,
    id: &ReconRunId,
    classification: Option<Classification>,
    window: Window,
) -> Result<(Vec<StoredFinding>, u64), RunError> {
    let run = get(deps, tenant, id).await?;
    if run.status != RunStatus::Completed {
        return Ok((Vec::new(), 0));
    }
    let store = &*deps.store;
    let (query, total) = match classification {
        None => (
            Query::partition(Run::key(id).pk).sk(SkCond::Between(
                keys::recon_finding(id.as_str(), first_of(&window)).sk,
                format!("{}~", keys::RECON_FINDING_PREFIX),
            )),
            run.findings,
        ),
        Some(c) if run.ranked => (
            Query::partition(keys::recon_findings_by(id.as_str(), c.as_str()))
                .on(Index::Gsi1)
                .sk(SkCond::Between(rank_sort(first_of(&window)), "~".into())),
            run.counts.of(c),
        ),
        Some(c) => {
            let query = Query::partition(Run::key(id).pk)
                .sk(SkCond::BeginsWith(keys::RECON_FINDING_PREFIX.to_owned()))
                .filter(StoredFinding::CLASSIFICATION.eq(&c));
            return Ok(record::page_of(store, &query, window).await?);
        }
    };
    if window.offset >= usize::try_from(total).unwrap_or(usize::MAX) {
        return Ok((Vec::new(), u64::from(total)));
    }
    let items = crate::store::query_window(store, &query, 0, window.limit).await?;
    let found = items
        .into_iter()
        .map(record::from_item)
        .collect::<Result<Vec<StoredFinding>, _>>()?;
    Ok((found, u64::from(total)))
}

/// The number (or rank) of the first finding `window` shows: its offset
/// plus one.
fn first_of(window: &Window) -> u32 {
    u32::try_from(window.offset)
        .unwrap_or(u32::MAX)
        .saturating_add(1)
}

/// "Settle from provider" for finding `n` of run `id`, a
/// `missing_in_dhukuti` payment line: asks the provider about the payment
/// now and applies its answer through the same path as the reconciler
/// (the file proves nothing). Answers the payment once `success`;
/// refused when the provider does not confirm it paid.
pub async fn settle(
    deps: &Deps,
    tenant: &Tenant,
    id: &ReconRunId,
    n: u32,
    now: Timestamp,
) -> Result<Payment, RunError> {
    let run = get(deps, tenant, id).await?;
    if run.status != RunStatus::Completed {
        return Err(RunError::NoFinding(n));
    }
    let Some(found) =
        record::get::<StoredFinding>(&*deps.store, &StoredFinding::key(id, n)).await?
    else {
        return Err(RunError::NoFinding(n));
    };
    let payment_id = match (&found.finding, &found.finding.payment_id) {
        (f, Some(p))
            if f.classification == Classification::MissingInDhukuti
                && f.kind == LineKind::Payment =>
        {
            p.clone()
        }
        (f, _) => {
            return Err(RunError::NotSettleable(format!(
                "finding {n} is {}: only a missing_in_dhukuti payment can be settled from the \
                 provider",
                f.classification.as_str()
            )));
        }
    };
    let payment = payment_of(deps, tenant, &payment_id).await?;
    let settled = if payment.status == PaymentStatus::Success {
        payment
    } else {
        crate::domain::attempts::verify_now(deps, &payment, now)
            .await
            .map_err(|e| match e {
                crate::domain::attempts::AttemptError::Store(s) => RunError::Store(s),
                other => RunError::Provider2(format!(
                    "could not ask {} about payment {payment_id}: {other}",
                    payment.provider.as_str()
                )),
            })?
    };
    if settled.status != PaymentStatus::Success {
        return Err(RunError::NotConfirmed(format!(
            "{} does not confirm payment {payment_id} as paid (it is {}{}); nothing was changed \
             on the file's word",
            settled.provider.as_str(),
            record::word(&settled.status),
            settled
                .checks
                .review
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )));
    }
    if found.settled_at.is_none() {
        let update = crate::domain::record::Changes::<StoredFinding>::new()
            .set_some(StoredFinding::SETTLED_AT, &now);
        deps.store
            .update(&StoredFinding::key(id, n), update.into(), None)
            .await?;
    }
    Ok(settled)
}

async fn payment_of(deps: &Deps, tenant: &Tenant, id: &PaymentId) -> Result<Payment, RunError> {
    match crate::domain::payments::get(&*deps.store, id).await? {
        Some(p) if tenant.owns(p.project_id.as_str(), p.mode) => Ok(p),
        _ => Err(RunError::NotSettleable(format!(
            "payment {id} is not found"
        ))),
    }
}

/// A run as the API answers it (and the `reconciliation.completed`
/// event's `data.object`).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ReconciliationRun)]
pub struct RunView {
    /// `rrun_…`.
    pub id: String,
    /// Always `reconciliation_run`.
    pub object: &'static str,
    pub livemode: bool,
    pub provider: Provider,
    /// The Nepal calendar day, `YYYY-MM-DD`.
    pub date: String,
    /// `pull` (Khalti's list) or `upload` (a file).
    pub source: RunSource,
    /// `running`, `completed` or `failed`.
    pub status: RunStatus,
    /// Findings per classification (all zero until `completed`).
    pub counts: Counts,
    /// Everything but `matched`.
    pub discrepancies: u32,
    /// Our successful payments of the day, in paisa.
    pub ours_total: Paisa,
    /// The statement's paid payment lines, in paisa.
    pub theirs_total: Paisa,
    /// Lines in the statement.
    pub lines: u32,
    /// Hex SHA-256 of the statement.
    pub digest: String,
    pub failure: Option<String>,
    pub created_at: Timestamp,
    pub completed_at: Option<Timestamp>,
}

impl RunView {
    pub fn of(run: &Run) -> Self {
        let done = run.status == RunStatus::Completed;
        let counts = if done { run.counts } else { Counts::default() };
        RunView {
            id: run.id.to_string(),
            object: "reconciliation_run",
            livemode: run.mode.is_live(),
            provider: run.provider,
            date: run.day.clone(),
            source: run.source,
            status: run.status,
            counts,
            discrepancies: counts.discrepancies(),
            ours_total: run.ours_total,
            theirs_total: run.theirs_total,
            lines: run.lines,
            digest: run.digest.clone(),
            failure: run.failure.clone(),
            created_at: run.created_at,
            completed_at: run.completed_at,
        }
    }
}

/// A finding as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ReconciliationFinding)]
pub struct FindingView {
    /// 1-based, in the run's order: `POST …/findings/{n}/settle`.
    pub n: u32,
    pub object: &'static str,
    pub run_id: String,
    pub classification: Classification,
    /// `payment` or `refund`.
    #[schema(value_type = String)]
    pub kind: LineKind,
    /// The statement's line (none for a payment of ours no line names).
    pub line: Option<u32>,
    /// Our payment, when one is found.
    pub payment_id: Option<String>,
    pub reference: Option<String>,
    pub provider_ref: Option<String>,
    pub ours_amount: Option<Paisa>,
    pub theirs_amount: Option<Paisa>,
    pub ours_fee: Option<Paisa>,
    pub theirs_fee: Option<Paisa>,
    /// When the provider recorded the line.
    pub at: Option<Timestamp>,
    /// When "settle from provider" paid its payment.
    pub settled_at: Option<Timestamp>,
}

impl FindingView {
    pub fn of(f: &StoredFinding) -> Self {
        let x = &f.finding;
        FindingView {
            n: f.n,
            object: "reconciliation_finding",
            run_id: f.run_id.to_string(),
            classification: x.classification,
            kind: x.kind,
            line: x.line,
            payment_id: x.payment_id.as_ref().map(ToString::to_string),
            reference: x.reference.clone(),
            provider_ref: x.provider_ref.clone(),
            ours_amount: x.ours_amount,
            theirs_amount: x.theirs_amount,
            ours_fee: x.ours_fee,
            theirs_fee: x.theirs_fee,
            at: x.at,
            settled_at: f.settled_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn p(n: i64) -> Paisa {
        Paisa::new(n).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ours(n: usize, status: PaymentStatus, amount: i64, on_day: bool) -> Ours {
        Ours {
            payment_id: PaymentId::from(format!("pay_{n}").as_str()),
            reference: Some(format!("order-{n}")),
            provider_ref: None,
            status,
            amount: p(amount),
            amount_refunded: Paisa::ZERO,
            fee: None,
            on_day,
        }
    }

    fn line(n: u32, idx: &str, status: LineStatus, amount: i64) -> StatementLine {
        StatementLine {
            line: n,
            provider: Provider::Khalti,
            reference: None,
            provider_ref: Some(idx.to_owned()),
            kind: LineKind::Payment,
            status,
            amount: p(amount),
            fee: None,
            at: Timestamp::parse("2026-11-20T06:00:00Z").unwrap_or_else(|| panic!("time")),
        }
    }

    /// Only payments not paid here, with a pidx and no transaction id, of
    /// the amount of a paid line that matches nothing; the day's first;
    /// at most MAX_LOOKUPS.
    #[test]
    fn a_khalti_run_looks_up_only_what_an_unmatched_line_may_be() {
        let mut paid = ours(0, PaymentStatus::Success, 1000, true);
        paid.provider_ref = Some("TXN-0".into());
        let list = vec![
            paid,
            ours(1, PaymentStatus::Pending, 1000, false),
            ours(2, PaymentStatus::Cancelled, 1000, true),
            // Another amount than any unmatched line.
            ours(3, PaymentStatus::Pending, 2000, true),
            // No pidx.
            ours(4, PaymentStatus::Pending, 1000, true),
            // Its transaction id known already.
            {
                let mut o = ours(5, PaymentStatus::Failed, 1000, true);
                o.provider_ref = Some("TXN-5".into());
                o
            },
        ];
        let tokens: Vec<Option<String>> = (0..list.len())
            .map(|i| (i != 4).then(|| format!("pidx-{i}")))
            .collect();
        let lines = vec![
            line(1, "TXN-0", LineStatus::Success, 1000),
            line(2, "TXN-X", LineStatus::Success, 1000),
            // Not paid, or matching ours: no lookup for them.
            line(3, "TXN-Y", LineStatus::Failed, 2000),
            line(4, "TXN-5", LineStatus::Success, 2000),
        ];
        let got = lookup_candidates(&list, &tokens, &lines);
        assert_eq!(
            got,
            Lookups {
                picked: vec![2, 1],
                over: 0
            }
        );
        // Every line explained: nothing to look up.
        assert_eq!(
            lookup_candidates(&list, &tokens, &lines[..1]),
            Lookups::default()
        );
        // The bound.
        let many: Vec<Ours> = (0..MAX_LOOKUPS + 7)
            .map(|i| ours(i, PaymentStatus::Pending, 1000, true))
            .collect();
        let tokens: Vec<Option<String>> = (0..many.len()).map(|i| Some(format!("p{i}"))).collect();
        let got = lookup_candidates(&many, &tokens, &lines);
        assert_eq!((got.picked.len(), got.over), (MAX_LOOKUPS, 7));
    }

    fn finding(c: Classification, i: usize) -> Finding {
        Finding {
            classification: c,
            kind: LineKind::Payment,
            line: u32::try_from(i).ok(),
            payment_id: None,
            reference: Some(format!("r-{i}")),
            provider_ref: None,
            ours_amount: None,
            theirs_amount: None,
            ours_fee: None,
            theirs_fee: None,
            at: None,
        }
    }

    /// A completed run of `n` findings (classes cycling unevenly), ranked
    /// or as before the ranks.
    async fn seeded_run(
        deps: &crate::AppState,
        tenant: &Tenant,
        n: usize,
        ranked: bool,
    ) -> (Run, Vec<Finding>) {
        let classes = [
            Classification::Matched,
            Classification::Matched,
            Classification::NotOurs,
            Classification::Matched,
            Classification::AmountMismatch,
        ];
        let all: Vec<Finding> = (0..n).map(|i| finding(classes[i % 5], i)).collect();
        let run = Run {
            id: ReconRunId::new(),
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            provider: Provider::Esewa,
            day: "2026-11-20".into(),
            source: RunSource::Upload,
            digest: "d".into(),
            status: RunStatus::Completed,
            counts: matching::counts(&all),
            ours_total: Paisa::ZERO,
            theirs_total: Paisa::ZERO,
            lines: 0,
            findings: u32::try_from(n).unwrap_or(0),
            failure: None,
            created_at: crate::testenv::at("2026-11-21T00:00:00Z"),
            completed_at: None,
            ranked,
            listed: true,
        };
        deps.store
            .transact(vec![run.put_new().unwrap_or_else(|e| panic!("{e}"))])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        write_findings(deps, &run.id, all.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if !ranked {
            // As written before the ranks: no rank, no entry.
            for i in 0..n {
                let key = StoredFinding::key(&run.id, u32::try_from(i + 1).unwrap_or(0));
                let mut f: StoredFinding = record::get(&*deps.store, &key)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .unwrap_or_else(|| panic!("finding {i}"));
                f.rank = None;
                deps.store
                    .transact(vec![TxOp::Put {
                        item: f.to_item().unwrap_or_else(|e| panic!("{e}")),
                        cond: None,
                    }])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        (run, all)
    }

    /// Every offset of every classification (and of all) pages exactly;
    /// a ranked run reads only the page, whatever the offset.
    #[tokio::test]
    async fn findings_page_exactly_at_any_offset_reading_only_the_page() {
        let inner = crate::testenv::memory_store();
        let store = Arc::new(crate::store::counting::CountingStore::new(Arc::clone(
            &inner,
        )));
        let deps = crate::domain::billing::testenv::deps_at(store.clone(), "2026-11-21T00:00:00Z");
        let tenant = Tenant::new("proj_findings", Mode::Sandbox);
        for ranked in [true, false] {
            let (run, all) = seeded_run(&deps, &tenant, 1_203, ranked).await;
            for class in [
                None,
                Some(Classification::Matched),
                Some(Classification::NotOurs),
                Some(Classification::AmountMismatch),
                Some(Classification::FeeMismatch),
            ] {
                let want: Vec<String> = all
                    .iter()
                    .filter(|f| class.is_none_or(|c| f.classification == c))
                    .filter_map(|f| f.reference.clone())
                    .collect();
                for offset in [
                    0,
                    1,
                    99,
                    100,
                    101,
                    240,
                    700,
                    want.len().saturating_sub(1),
                    want.len(),
                    10_000_000,
                ] {
                    let before = store.items_read();
                    let (got, total) =
                        findings(&deps, &tenant, &run.id, class, Window::at(offset, 7))
                            .await
                            .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(total, want.len() as u64, "{class:?}");
                    let end = (offset + 7).min(want.len());
                    let expect = want
                        .get(offset..end)
                        .map(<[String]>::to_vec)
                        .unwrap_or_default();
                    let got: Vec<String> = got
                        .into_iter()
                        .filter_map(|f| f.finding.reference)
                        .collect();
                    assert_eq!(got, expect, "ranked {ranked} {class:?} offset {offset}");
                    if ranked {
                        // The page alone (the run is one get).
                        let read = store.items_read() - before;
                        assert!(read <= 7, "read {read}");
                    }
                }
            }
        }
    }

    fn run_of(tenant: &Tenant, provider: Provider, day: &str, listed: bool) -> Run {
        Run {
            id: ReconRunId::new(),
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            provider,
            day: day.into(),
            source: RunSource::Upload,
            digest: "d".into(),
            status: RunStatus::Completed,
            counts: Counts::default(),
            ours_total: Paisa::ZERO,
            theirs_total: Paisa::ZERO,
            lines: 0,
            findings: 0,
            failure: None,
            created_at: crate::testenv::at("2026-11-21T00:00:00Z"),
            completed_at: None,
            ranked: true,
            listed,
        }
    }

    /// Each filter's list against the runs filtered by hand.
    async fn assert_lists(deps: &crate::AppState, tenant: &Tenant, all: &[Run]) {
        let days = ["2026-11-18", "2026-11-19", "2026-11-20"];
        let mut filters = vec![RunFilter::default()];
        for p in [Provider::Esewa, Provider::Khalti, Provider::Fonepay] {
            filters.push(RunFilter {
                provider: Some(p),
                day: None,
            });
        }
        for d in days {
            let day = NaiveDate::parse_from_str(d, "%Y-%m-%d").ok();
            filters.push(RunFilter {
                provider: None,
                day,
            });
            filters.push(RunFilter {
                provider: Some(Provider::Khalti),
                day,
            });
        }
        for f in &filters {
            let mut want: Vec<String> = all
                .iter()
                .filter(|r| f.provider.is_none_or(|p| p == r.provider))
                .filter(|r| {
                    f.day
                        .is_none_or(|d| d.format("%Y-%m-%d").to_string() == r.day)
                })
                .map(|r| r.id.to_string())
                .collect();
            want.sort_by(|a, b| b.cmp(a));
            for offset in [
                0,
                3,
                100,
                101,
                130,
                want.len().saturating_sub(1),
                want.len() + 2,
            ] {
                let (got, total) = list(deps, tenant, f, Window::at(offset, 6))
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(total, want.len() as u64, "{f:?}");
                let end = (offset + 6).min(want.len());
                let got: Vec<String> = got.into_iter().map(|r| r.id.to_string()).collect();
                assert_eq!(
                    got,
                    want.get(offset..end)
                        .map(<[String]>::to_vec)
                        .unwrap_or_default(),
                    "{f:?} offset {offset}"
                );
            }
        }
    }

    fn spread(tenant: &Tenant, n: usize, listed: bool) -> Vec<Run> {
        let providers = [
            Provider::Esewa,
            Provider::Khalti,
            Provider::Khalti,
            Provider::Fonepay,
        ];
        let days = ["2026-11-18", "2026-11-19", "2026-11-20"];
        (0..n)
            .map(|i| run_of(tenant, providers[i % 4], days[i % 3], listed))
            .collect()
    }

    /// Runs are counted lists per provider, day and both: every filter
    /// pages and counts exactly at any offset, inserted concurrently.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn runs_list_by_provider_and_day_exactly_at_any_offset() {
        let store = crate::testenv::memory_store();
        let deps = crate::domain::billing::testenv::deps_at(store.clone(), "2026-11-21T00:00:00Z");
        let tenant = Tenant::new("proj_runs", Mode::Live);
        store
            .transact(vec![crate::domain::listing::ListsMarker::mark_counted(
                &tenant,
                counted::CountedKind::ReconRuns,
            )])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let all = spread(&tenant, 280, true);
        let inserts = all.iter().map(|r| insert(&deps, r));
        for done in futures::future::join_all(inserts).await {
            done.unwrap_or_else(|e| panic!("{e}"));
        }
        assert_lists(&deps, &tenant, &all).await;
    }

    /// Runs from before the counters: listed the old way until the
    /// migration, which enters each in the provider and day lists, waits
    /// for a running run to end (not for one whose process is long gone)
    /// and counts each once.
    #[tokio::test]
    async fn older_runs_are_counted_once_by_the_migration() {
        let store = crate::testenv::memory_store();
        let deps = crate::domain::billing::testenv::deps_at(store.clone(), "2026-11-21T00:00:00Z");
        let tenant = Tenant::new("proj_old_runs", Mode::Live);
        let mut all = spread(&tenant, 40, false);
        // Running now, and running since long ago (its process died).
        all[7].status = RunStatus::Running;
        all[7].created_at = SystemClock.now();
        all[9].status = RunStatus::Running;
        for r in &all {
            // As the code before the counters stored it: `gsi1` only.
            let only_gsi1 = TxOp::Update {
                key: r.item_key(),
                update: Changes::<Run>::new()
                    .unindex(Index::Gsi4)
                    .unindex(Index::Gsi5)
                    .unindex(Index::Gsi6)
                    .into(),
                cond: None,
            };
            for op in [r.put_new().unwrap_or_else(|e| panic!("{e}")), only_gsi1] {
                store
                    .transact(vec![op])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        // Uncovered: right through the old filtered read.
        assert_lists(&deps, &tenant, &all).await;
        let migrate = || crate::domain::lists_migration::migrate(&*store, &tenant);
        // A run still running is not counted: the migration fails, to be
        // run again.
        assert!(migrate().await.is_err());
        let mut ended = all[7].clone();
        ended.status = RunStatus::Completed;
        store
            .put(ended.to_item().unwrap_or_else(|e| panic!("{e}")), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let done = migrate().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(done.recon_runs.listed + done.recon_runs.already, 40);
        assert_eq!(done.recon_runs.already, 40 - done.recon_runs.listed);
        let again = migrate().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((again.recon_runs.listed, again.recon_runs.already), (0, 40));
        assert!(
            counted::covered(&*store, &tenant, counted::CountedKind::ReconRuns)
                .await
                .unwrap_or(false)
        );
        assert_lists(&deps, &tenant, &all).await;
    }
}
