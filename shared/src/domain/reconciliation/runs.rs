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
use super::statements::{LineKind, Statement};
use crate::Deps;
use crate::domain::outbox::{Event, EventType};
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::{self, Entry, Record, Window, from_item};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{IdKind, PaymentId, ProjectId, ReconRunId, StatementUploadId};
use crate::keys;
use crate::money::Paisa;
use crate::refusal::Refusal;
use crate::secrets::ProviderCredentials;
use crate::store::{Cond, Index, Key, Query, SkCond, StoreError, TxOp};
use crate::time::Timestamp;

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
}

crate::attrs! { Run {
    STATUS: RunStatus = status,
    PROVIDER: Provider = provider,
    DAY: String = day,
} }

impl Run {
    pub fn key(id: &ReconRunId) -> Key {
        keys::recon_run(id)
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }
}

impl Record for Run {
    fn item_key(&self) -> Key {
        Run::key(&self.id)
    }

    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            keys::per_mode(&self.project_id, self.mode, keys::PerMode::ReconRuns),
            self.id.to_string(),
        )]
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
        (Provider::Khalti, None) => (pull_khalti(deps, tenant, day).await?, RunSource::Pull),
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
    let ours = ours_of(deps, tenant, provider, day).await?;
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
    };
    deps.store.transact(vec![run.put_new()?]).await?;
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
    let stored: Vec<StoredFinding> = findings
        .into_iter()
        .enumerate()
        .map(|(i, finding)| StoredFinding {
            run_id: run.clone(),
            n: u32::try_from(i + 1).unwrap_or(u32::MAX),
            finding,
            settled_at: None,
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
/// `day`.
async fn ours_of(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
    day: NaiveDate,
) -> Result<Vec<Ours>, StoreError> {
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
            out.push(ours_view(&p, start, end));
        }
        match page.last_key {
            Some(k) => query.start_after = Some(k),
            None => break,
        }
    }
    Ok(out)
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

/// A page of the tenant's runs, newest first, and the total.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    filter: &RunFilter,
    window: Window,
) -> Result<(Vec<Run>, u64), StoreError> {
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
    let mut query = Query::partition(Run::key(id).pk)
        .sk(SkCond::BeginsWith(keys::RECON_FINDING_PREFIX.to_owned()));
    if let Some(c) = classification {
        query = query.filter(StoredFinding::CLASSIFICATION.eq(&c));
    }
    Ok(record::page_of(&*deps.store, &query, window).await?)
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
