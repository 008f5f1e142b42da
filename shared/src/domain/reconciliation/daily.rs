//! The daily pull: every tenant (project and mode) with its own Khalti
//! credentials gets a run of the previous Nepal day's Khalti statement,
//! pulled from Khalti's merchant transaction list, once.
//!
//! The scheduler (every minute; the local tick the same) calls [`daily`].
//! Each call takes at most [`PAGE`] tenants of the pulled list
//! (`credentials::pulled_after`), [`PARALLEL`] at a time, and saves where
//! it stopped in the cursor ([`PullCursor`], one per provider, written
//! conditioned on the version read), so a day's pulls spread over as many
//! ticks as the list needs. When the list ends, another pass over it
//! begins [`RETRY_AFTER`] later, all day: it retries the tenants that
//! failed (Khalti down, credentials refused) and takes those whose
//! credentials came since; a tenant already done costs one read.
//!
//! Exactly once per tenant and day, however ticks race: a tenant's pull is
//! claimed first ([`PullClaim`], `PULLDAY#<project>#<mode>#khalti` /
//! `<day>`, a conditional write on the claim as read); a claim `done`
//! is never run again, a `running` one only once its lease lapsed (a
//! crashed tick), a `failed` one [`RETRY_AFTER`] after it failed, until
//! [`MAX_ATTEMPTS`]. Claims expire
//! (DynamoDB TTL) after [`KEEP_DAYS`]. A tenant's failure is recorded on
//! its claim and logged; the others go on.

use std::time::Instant;

use chrono::NaiveDate;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::matching::nepal_day_of;
use super::runs::{self, RunSource};
use super::statements::khalti;
use crate::Deps;
use crate::domain::credentials::{self, PulledTenant};
use crate::domain::record::{self, Changes, Record};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{ProjectId, ReconRunId};
use crate::keys;
use crate::store::{Cond, Key, StoreError};
use crate::time::Timestamp;

/// The provider pulled.
pub const PROVIDER: Provider = Provider::Khalti;
/// Tenants one call takes from the list.
pub const PAGE: usize = 20;
/// Pulls in flight at once.
pub const PARALLEL: usize = 4;
/// Tries of one tenant's day before it is left failed.
pub const MAX_ATTEMPTS: u32 = 3;
/// How long after a pass the next one begins (and after a failure a
/// tenant is tried again).
pub const RETRY_AFTER: chrono::Duration = chrono::Duration::minutes(30);
/// How long a claim holds a tenant's pull without news (a crashed tick).
pub const LEASE: chrono::Duration = chrono::Duration::minutes(5);
/// How long a claim is kept (TTL).
pub const KEEP_DAYS: i64 = 35;
/// How long after Nepal's midnight the previous day is first pulled (a
/// transaction of the day's last minutes may reach the list late).
pub const PULL_AFTER: chrono::Duration = chrono::Duration::hours(1);
/// No tenant's pull starts after this long in one call. The scheduler's
/// invocation lasts 60 s at most, and a pull started just before this
/// may still read the list (a page a call, 10 s each at most), then
/// look unmatched lines up for up to 10 s (`runs::MAX_LOOKUPS`), each
/// lookup with its own 10 s: 25 s leaves the rest for them.
pub const RUN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(25);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullStatus {
    Running,
    Done,
    Failed,
}

/// One tenant's pull of one day.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullClaim {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// The Nepal day pulled, `YYYY-MM-DD`.
    pub day: String,
    pub status: PullStatus,
    /// Tries so far (this one included while `running`).
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Timestamp>,
    /// The run it made (`done`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<ReconRunId>,
    /// Why the last try failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    pub updated_at: Timestamp,
    /// Epoch seconds after which it may be deleted.
    pub ttl: i64,
}

crate::attrs! { PullClaim {
    STATUS: PullStatus = status,
    ATTEMPTS: u32 = attempts,
    LEASE_UNTIL: Option<Timestamp> = lease_until,
    RUN_ID: Option<ReconRunId> = run_id,
    FAILURE: Option<String> = failure,
    UPDATED_AT: Timestamp = updated_at,
} }

impl PullClaim {
    pub fn key(tenant: &Tenant, provider: Provider, day: &str) -> Key {
        keys::pull_claim(&tenant.project, tenant.mode, provider, day)
    }
}

impl Record for PullClaim {
    fn item_key(&self) -> Key {
        keys::pull_claim(&self.project_id, self.mode, self.provider, &self.day)
    }
}

/// Where the day's pull stands in the list of tenants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullCursor {
    pub provider: Provider,
    /// The Nepal day being pulled, `YYYY-MM-DD`.
    pub day: String,
    /// The sort key of the last tenant taken in this pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// 1-based.
    pub pass: u32,
    /// The next pass does not begin before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
    pub version: i64,
}

crate::attrs! { PullCursor {
    VERSION: i64 = version,
} }

impl Record for PullCursor {
    fn item_key(&self) -> Key {
        keys::pull_cursor(self.provider)
    }
}

impl PullCursor {
    fn fresh(day: &str, version: i64) -> Self {
        PullCursor {
            provider: PROVIDER,
            day: day.to_owned(),
            after: None,
            pass: 1,
            not_before: None,
            version,
        }
    }
}

/// What one call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PullReport {
    /// Tenants whose day was run now.
    pub pulled: usize,
    /// Tenants taken but already done, held by another tick, or given up.
    pub skipped: usize,
    /// Tenants whose pull failed now (retried by a later pass).
    pub failed: usize,
}

/// How one tenant's turn went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    Pulled,
    Skipped,
    Failed,
    /// The deadline came first: not taken.
    Late,
}

/// The scheduler's part: the previous Nepal day's pulls, as far as one
/// page of tenants and `deadline` allow; nothing in the first
/// [`PULL_AFTER`] of the Nepal day.
pub async fn daily(
    deps: &Deps,
    now: Timestamp,
    deadline: Instant,
) -> Result<PullReport, StoreError> {
    let today = nepal_day_of(now);
    let (midnight, _) = super::matching::day_bounds(today);
    if now < midnight.plus(PULL_AFTER) {
        return Ok(PullReport::default());
    }
    pull_day(deps, today - chrono::Duration::days(1), now, deadline).await
}

/// One call's share of `day`'s pulls (see the module).
pub async fn pull_day(
    deps: &Deps,
    day: NaiveDate,
    now: Timestamp,
    deadline: Instant,
) -> Result<PullReport, StoreError> {
    let day_text = day.format("%Y-%m-%d").to_string();
    let key = keys::pull_cursor(PROVIDER);
    let seen = record::get::<PullCursor>(&*deps.store, &key).await?;
    let mut cursor = match &seen {
        Some(c) if c.day == day_text => c.clone(),
        Some(c) => PullCursor::fresh(&day_text, c.version),
        None => PullCursor::fresh(&day_text, 0),
    };
    let mut report = PullReport::default();
    if cursor.not_before.is_some_and(|t| t > now) {
        return Ok(report);
    }
    let (page, more) =
        credentials::pulled_after(&*deps.store, PROVIDER, cursor.after.as_deref(), PAGE).await?;
    // Owned items: a stream of borrowed ones is not `Send` for every
    // lifetime, which the tick's spawned task needs.
    let tenants: Vec<(usize, PulledTenant)> =
        page.iter().map(|(_, t)| t.clone()).enumerate().collect();
    let turns: Vec<(usize, Turn)> = futures::stream::iter(tenants)
        .map(move |(i, t)| async move { (i, turn(deps, &t, day, now, deadline).await) })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut turns = turns;
    turns.sort_by_key(|(i, _)| *i);
    let mut taken = 0;
    for (i, t) in &turns {
        match t {
            Turn::Pulled => report.pulled += 1,
            Turn::Skipped => report.skipped += 1,
            Turn::Failed => report.failed += 1,
            Turn::Late => continue,
        }
        // The cursor moves past the leading run of tenants taken.
        if *i == taken {
            taken += 1;
        }
    }
    if taken > 0 {
        cursor.after = Some(page[taken - 1].0.clone());
    }
    if taken == page.len() && !more {
        cursor.pass += 1;
        cursor.after = None;
        cursor.not_before = Some(now.plus(RETRY_AFTER));
    }
    let read = seen.as_ref().map(|c| c.version);
    cursor.version = read.unwrap_or(0) + 1;
    let cond = match read {
        Some(v) => PullCursor::VERSION.eq(&v),
        None => Cond::NotExists,
    };
    match deps.store.put(cursor.to_item()?, Some(cond)).await {
        Ok(()) => {}
        // Another tick moved it meanwhile: its word stands.
        Err(e) if e.is_condition_failure() => {}
        Err(e) => return Err(e),
    }
    Ok(report)
}

/// `tenant`'s pull of `day`, if it is not done, held or given up.
async fn turn(
    deps: &Deps,
    pulled: &PulledTenant,
    day: NaiveDate,
    now: Timestamp,
    deadline: Instant,
) -> Turn {
    if Instant::now() >= deadline {
        return Turn::Late;
    }
    let tenant = pulled.tenant();
    match pull_tenant(deps, &tenant, day, now).await {
        Ok(Some(Ok(_))) => Turn::Pulled,
        Ok(None) => Turn::Skipped,
        Ok(Some(Err(why))) => {
            tracing::warn!(project = %tenant.project, mode = tenant.mode.as_str(), %day, error = %why, "daily Khalti pull failed; a later pass retries");
            Turn::Failed
        }
        Err(e) => {
            tracing::warn!(project = %tenant.project, mode = tenant.mode.as_str(), %day, error = %e, "daily Khalti pull: store error; a later pass retries");
            Turn::Failed
        }
    }
}

/// Claims `tenant`'s pull of `day` and runs it: `None` when the claim
/// says it is not this call's to run (done, held by a live lease, given
/// up, or claimed meanwhile); else the run, or why it failed (recorded
/// on the claim).
pub async fn pull_tenant(
    deps: &Deps,
    tenant: &Tenant,
    day: NaiveDate,
    now: Timestamp,
) -> Result<Option<Result<ReconRunId, String>>, StoreError> {
    let day_text = day.format("%Y-%m-%d").to_string();
    let key = PullClaim::key(tenant, PROVIDER, &day_text);
    let seen = record::get::<PullClaim>(&*deps.store, &key).await?;
    let attempts = match &seen {
        None => 0,
        Some(c) if c.status == PullStatus::Done => return Ok(None),
        Some(c) if c.status == PullStatus::Running && c.lease_until.is_some_and(|t| t > now) => {
            return Ok(None);
        }
        Some(c) if c.attempts >= MAX_ATTEMPTS => return Ok(None),
        // Failed lately: a later pass retries it.
        Some(c) if c.status == PullStatus::Failed && c.updated_at.plus(RETRY_AFTER) > now => {
            return Ok(None);
        }
        Some(c) => c.attempts,
    };
    let claim = PullClaim {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        provider: PROVIDER,
        day: day_text,
        status: PullStatus::Running,
        attempts: attempts + 1,
        lease_until: Some(now.plus(LEASE)),
        run_id: None,
        failure: None,
        updated_at: now,
        ttl: now.plus(chrono::Duration::days(KEEP_DAYS)).unix_seconds(),
    };
    let cond = match &seen {
        None => Cond::NotExists,
        Some(c) => Cond::And(vec![
            PullClaim::STATUS.eq(&c.status),
            PullClaim::ATTEMPTS.eq(&c.attempts),
        ]),
    };
    match deps.store.put(claim.to_item()?, Some(cond)).await {
        Ok(()) => {}
        Err(e) if e.is_condition_failure() => return Ok(None),
        Err(e) => return Err(e),
    }
    let ran = run(deps, tenant, day, now).await;
    let ours = PullClaim::ATTEMPTS.eq(&claim.attempts);
    let change = match &ran {
        Ok(id) => Changes::<PullClaim>::new()
            .set(PullClaim::STATUS, &PullStatus::Done)
            .set_some(PullClaim::RUN_ID, id)
            .remove(PullClaim::LEASE_UNTIL)
            .remove(PullClaim::FAILURE),
        Err(why) => Changes::<PullClaim>::new()
            .set(PullClaim::STATUS, &PullStatus::Failed)
            .set_some(PullClaim::FAILURE, why)
            .remove(PullClaim::LEASE_UNTIL),
    }
    .set(PullClaim::UPDATED_AT, &now);
    match deps.store.update(&key, change.into(), Some(ours)).await {
        Ok(_) => {}
        // Its lease lapsed and another tick took it over: the run (if
        // any) stands by its digest; the other's claim is the word.
        Err(e) if e.is_condition_failure() => {}
        Err(e) => return Err(e),
    }
    Ok(Some(ran))
}

/// Pulls `tenant`'s Khalti list of `day` and runs it.
async fn run(
    deps: &Deps,
    tenant: &Tenant,
    day: NaiveDate,
    now: Timestamp,
) -> Result<ReconRunId, String> {
    let statement = khalti::pull(deps, tenant, day)
        .await
        .map_err(|e| e.to_string())?;
    runs::execute(deps, tenant, day, &statement, RunSource::Pull, now)
        .await
        .map(|r| r.id)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::AppState;
    use crate::domain::account::{self, Plan};
    use crate::providers::ProviderHub;
    use crate::secrets::{CredentialsKey, CredentialsKeys, ProviderCredentials};
    use crate::time::{Clock, SystemClock};

    /// A state whose providers have no clients: every Khalti pull fails
    /// at once, which is what these tests need (the pulls that succeed
    /// are the end-to-end tests', against the simulator).
    fn state() -> AppState {
        let keys = CredentialsKeys::single(
            CredentialsKey::new("k1", [7u8; 32]).unwrap_or_else(|e| panic!("{e}")),
        );
        AppState::for_tests().with_providers(ProviderHub::keys_only(keys))
    }

    async fn khalti_tenants(state: &AppState, n: usize) -> Vec<Tenant> {
        let now = SystemClock.now();
        let Some(keys) = state.providers.keys() else {
            panic!("keys")
        };
        let merchant =
            account::create_merchant(&*state.store, now, "Sita", "sita@example.com", Plan::Growth)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        for _ in 0..n {
            let project = account::create_project(&*state.store, now, &merchant, "Shop", false)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let tenant = Tenant::new(project.id.clone(), Mode::Sandbox);
            credentials::put_credentials(
                &*state.store,
                keys,
                now,
                &tenant,
                &ProviderCredentials::Khalti {
                    secret_key: "live_secret_key_0123456789abcdef".into(),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            out.push(tenant);
        }
        out
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn day() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, 28).unwrap_or_default()
    }

    async fn claim_of(state: &AppState, tenant: &Tenant) -> Option<PullClaim> {
        record::get::<PullClaim>(
            &*state.store,
            &PullClaim::key(tenant, PROVIDER, "2026-11-28"),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn tenants_with_khalti_credentials_are_listed_until_they_are_removed() {
        let state = state();
        let tenants = khalti_tenants(&state, 3).await;
        // eSewa credentials are not pulled: not listed.
        let Some(keys) = state.providers.keys() else {
            panic!("keys")
        };
        credentials::put_credentials(
            &*state.store,
            keys,
            SystemClock.now(),
            &tenants[0],
            &ProviderCredentials::Esewa {
                product_code: "EPAYTEST".into(),
                secret_key: "8gBm/:&EnhH.1/q".into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let (listed, more) = credentials::pulled_after(&*state.store, PROVIDER, None, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!more);
        let mut want: Vec<Tenant> = tenants.clone();
        want.sort_by(|a, b| a.project.cmp(&b.project));
        let got: Vec<Tenant> = listed.iter().map(|(_, t)| t.tenant()).collect();
        assert_eq!(got, want);
        // Paged: after the first, the other two.
        let (rest, _) = credentials::pulled_after(&*state.store, PROVIDER, Some(&listed[0].0), 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rest.len(), 2);
        assert!(
            credentials::delete_credentials(&*state.store, &want[1], Provider::Khalti)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
        let (listed, _) = credentials::pulled_after(&*state.store, PROVIDER, None, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<Tenant> = listed.iter().map(|(_, t)| t.tenant()).collect();
        assert_eq!(got, vec![want[0].clone(), want[2].clone()]);
    }

    /// A failed pull is recorded and tried again until MAX_ATTEMPTS; a
    /// done claim, or one a live lease holds, is never run again.
    #[tokio::test]
    async fn a_claim_runs_a_tenants_day_at_most_as_its_state_allows() {
        let state = state();
        let tenants = khalti_tenants(&state, 1).await;
        let t = &tenants[0];
        let mut now = SystemClock.now();
        for attempt in 1..=MAX_ATTEMPTS {
            // Failed just now: not tried again before RETRY_AFTER.
            if attempt > 1 {
                let ran = pull_tenant(&state, t, day(), now)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(ran, None);
                now = now.plus(RETRY_AFTER);
            }
            let ran = pull_tenant(&state, t, day(), now)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(ran, Some(Err(_))), "{ran:?}");
            let claim = claim_of(&state, t).await.unwrap_or_else(|| panic!("claim"));
            assert_eq!(claim.status, PullStatus::Failed);
            assert_eq!(claim.attempts, attempt);
            assert!(claim.failure.is_some());
            assert_eq!(claim.lease_until, None);
        }
        // Given up.
        let ran = pull_tenant(&state, t, day(), now)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ran, None);

        // Done, or held by a live lease: not run; a lapsed lease: run.
        let other = &khalti_tenants(&state, 1).await[0];
        let mut claim = PullClaim {
            project_id: other.project.clone(),
            mode: other.mode,
            provider: PROVIDER,
            day: "2026-11-28".into(),
            status: PullStatus::Done,
            attempts: 1,
            lease_until: None,
            run_id: Some(ReconRunId::new()),
            failure: None,
            updated_at: now,
            ttl: 0,
        };
        for (status, lease, runs) in [
            (PullStatus::Done, None, false),
            (PullStatus::Running, Some(now.plus(LEASE)), false),
            (PullStatus::Running, Some(now.plus(-LEASE)), true),
        ] {
            claim.status = status;
            claim.lease_until = lease;
            claim.attempts = 1;
            state
                .store
                .put(claim.to_item().unwrap_or_else(|e| panic!("{e}")), None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let ran = pull_tenant(&state, other, day(), now)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(ran.is_some(), runs, "{status:?} {lease:?}");
        }
    }

    /// Ticks that race claim each tenant once: one of them runs it.
    #[tokio::test]
    async fn racing_calls_run_each_tenant_once() {
        let state = state();
        let tenants = khalti_tenants(&state, 6).await;
        let now = SystemClock.now();
        let calls = (0..4).map(|_| pull_tenant(&state, &tenants[0], day(), now));
        let ran: Vec<_> = futures::future::join_all(calls).await;
        let runs = ran.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        assert_eq!(runs, 1, "{ran:?}");
        let calls = (0..3).map(|_| pull_day(&state, day(), now, later()));
        let reports: Vec<PullReport> = futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        // Tenant 0 failed just now (not retried yet); every other tenant
        // is tried once, whichever call took it.
        let tried: usize = reports.iter().map(|r| r.failed).sum();
        assert_eq!(tried, 5, "{reports:?}");
        for t in &tenants {
            let c = claim_of(&state, t).await.unwrap_or_else(|| panic!("claim"));
            assert_eq!(c.attempts, 1, "{t:?}");
        }
    }

    /// A page of tenants per call; when the list ends, the next pass
    /// begins RETRY_AFTER later: it retries the failures (up to
    /// MAX_ATTEMPTS, then skips them) and takes tenants added since. A
    /// new day starts again from the top; a passed deadline takes nobody.
    #[tokio::test]
    async fn the_day_goes_a_page_at_a_time_in_passes_that_retry_and_take_newcomers() {
        let state = state();
        let n = PAGE * 2 + 3;
        let tenants = khalti_tenants(&state, n).await;
        let mut now = SystemClock.now();
        let mut pages = Vec::new();
        for _ in 0..3 {
            let r = pull_day(&state, day(), now, later())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            pages.push(r.failed);
        }
        assert_eq!(pages, vec![PAGE, PAGE, 3]);
        // The next pass waits RETRY_AFTER.
        let r = pull_day(&state, day(), now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r, PullReport::default());
        let pass = |now: Timestamp| {
            let state = state.clone();
            async move {
                let mut sum = PullReport::default();
                for _ in 0..3 {
                    let r = pull_day(&state, day(), now, later())
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    sum.pulled += r.pulled;
                    sum.skipped += r.skipped;
                    sum.failed += r.failed;
                }
                sum
            }
        };
        for attempt in 2..=MAX_ATTEMPTS {
            now = now.plus(RETRY_AFTER + chrono::Duration::seconds(1));
            assert_eq!(pass(now).await.failed, n, "attempt {attempt}");
        }
        // Given up on, and a newcomer: tried once.
        let newcomer = khalti_tenants(&state, 1).await;
        now = now.plus(RETRY_AFTER + chrono::Duration::seconds(1));
        let r = pass(now).await;
        assert_eq!((r.failed, r.skipped), (1, n), "{r:?}");
        for t in &tenants {
            let c = claim_of(&state, t).await.unwrap_or_else(|| panic!("claim"));
            assert_eq!(c.attempts, MAX_ATTEMPTS);
        }
        let c = claim_of(&state, &newcomer[0])
            .await
            .unwrap_or_else(|| panic!("claim"));
        assert_eq!(c.attempts, 1);
        // The next day begins again from the top.
        let next = day() + chrono::Duration::days(1);
        let r = pull_day(&state, next, now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.failed, PAGE);
        // A passed deadline takes nobody and keeps the cursor.
        let r = pull_day(&state, next, now, Instant::now())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r, PullReport::default());
        let r = pull_day(&state, next, now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.failed, PAGE);
    }

    #[tokio::test]
    async fn the_scheduler_pulls_the_previous_nepal_day() {
        let state = state();
        let tenants = khalti_tenants(&state, 1).await;
        // 2026-11-29 00:30 in Nepal: not yet.
        let now = Timestamp::parse("2026-11-28T18:45:00Z").unwrap_or_else(|| panic!("time"));
        let r = daily(&state, now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r, PullReport::default());
        assert!(claim_of(&state, &tenants[0]).await.is_none());
        // 01:00: the 28th is pulled.
        let now = now.plus(chrono::Duration::minutes(30));
        let r = daily(&state, now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.failed, 1);
        assert!(claim_of(&state, &tenants[0]).await.is_some());
    }
}
