//! Settlements (issue 41 part 5): per provider and Nepal calendar day,
//! what the provider should pay into the merchant's bank (`expected`)
//! beside the bank credits the merchant records, and the difference.
//!
//! - **Expected.** The net (`Payment::net`: amount less the fee as
//!   recorded; the amount when no fee is known) of the day's payments of
//!   the provider that succeeded (`success`, or `refunded` since), less
//!   the net (amount less the fee returned) of the day's refunds of the
//!   provider that took money back (`succeeded`, or `requires_action`:
//!   an eSewa refund the merchant makes in eSewa's portal). A record's
//!   day is the Nepal day (+05:45) its id was minted on, which is when it
//!   was created: a payment begun before midnight and paid after counts on
//!   the day it began (each provider's own cut-off is not public:
//!   `docs/reconciliation.md`, "Settlements").
//! - **Cost.** Read, never kept: a range of days is one id range of the
//!   payments list index (`gsi1`, ids sort by time) and one of the refunds
//!   list index, filtered by status (and provider), paged; the cost is the
//!   range's volume, whatever the project's history. A range is at most
//!   [`MAX_DAYS`] days.
//! - **Credits.** A bank credit is stored at `BCR#<id>` and listed by day
//!   on `gsi1` `PROJ#<p>#<mode>#BCR` / `<date>#<id>`; its bank reference is
//!   claimed per provider (`PROJ#<p>#<mode>#BCREF` /
//!   `<provider>#<REFERENCE>`) in the same transaction, so a second credit
//!   with the same reference is refused however the two race.

use std::collections::BTreeMap;

use chrono::{Datelike, Days, NaiveDate};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Deps;
use crate::domain::billing::calendar::{nepal_day, nepal_day_start};
use crate::domain::payments::{Payment, PaymentStatus};
use crate::domain::record::{Entry, Record, from_item};
use crate::domain::refunds::{Refund, RefundStatus};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{self, BankCreditId, IdKind, ProjectId};
use crate::keys::{self, PerMode};
use crate::money::Paisa;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Query, SkCond, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// The most days one settlements read covers.
pub const MAX_DAYS: u64 = 92;
/// Days shown when no range is asked for: the last week, today included.
pub const DEFAULT_DAYS: u64 = 7;
/// The largest credit recorded: NPR 10,000,000,000.
pub const MAX_CREDIT: i64 = 1_000_000_000_000;
/// The longest bank reference.
pub const MAX_REFERENCE: usize = 100;
/// Items a page of the index reads examines.
const PAGE: usize = 1_000;

/// Why a settlements request is refused.
#[derive(Debug, thiserror::Error)]
pub enum SettlementError {
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("No such bank credit: '{0}'")]
    NotFound(String),
    #[error(
        "A bank credit with reference '{reference}' is already recorded for {provider} ({existing}): delete it first to record it again"
    )]
    DuplicateReference {
        provider: &'static str,
        reference: String,
        existing: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<SettlementError> for Refusal {
    fn from(err: SettlementError) -> Self {
        match err {
            SettlementError::Invalid { field, message } => Refusal::invalid(field, message),
            SettlementError::NotFound(id) => Refusal::not_found("bank credit", &id),
            e @ SettlementError::DuplicateReference { .. } => {
                Refusal::conflict("duplicate_reference", e.to_string()).at("reference")
            }
            SettlementError::Store(e) => e.into(),
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> SettlementError {
    SettlementError::Invalid {
        field,
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------
// Bank credits

/// A bank credit the merchant recorded: money a provider paid into the
/// merchant's bank for one settlement day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BankCredit {
    pub id: BankCreditId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// The Nepal day of the settlement it pays, `YYYY-MM-DD`.
    pub date: String,
    pub amount: Paisa,
    /// The bank's reference, as entered (trimmed).
    pub reference: String,
    pub created_at: Timestamp,
}

crate::attrs! { BankCredit {
    ID: BankCreditId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    PROVIDER: Provider = provider,
    DATE: String = date,
    AMOUNT: Paisa = amount,
    REFERENCE: String = reference,
    CREATED_AT: Timestamp = created_at,
} }

impl BankCredit {
    pub fn key(id: &BankCreditId) -> Key {
        keys::bank_credit(id)
    }

    fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, PerMode::BankCredits)
    }

    /// The claim of its reference.
    fn claim(&self) -> ReferenceClaim {
        ReferenceClaim {
            credit_id: self.id.clone(),
            project_id: self.project_id.clone(),
            mode: self.mode,
            provider: self.provider,
            reference: normalized(&self.reference),
        }
    }
}

impl Record for BankCredit {
    fn item_key(&self) -> Key {
        BankCredit::key(&self.id)
    }

    /// Listed in its project's credits by day.
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            BankCredit::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            format!("{}#{}", self.date, self.id),
        )]
    }
}

/// One provider's bank reference, claimed by the credit that holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReferenceClaim {
    pub credit_id: BankCreditId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// Upper-cased, trimmed ([`normalized`]).
    pub reference: String,
}

crate::attrs! { ReferenceClaim {
    CREDIT_ID: BankCreditId = credit_id,
} }

impl Record for ReferenceClaim {
    fn item_key(&self) -> Key {
        Key::new(
            keys::per_mode(&self.project_id, self.mode, PerMode::BankCreditRefs),
            format!("{}#{}", self.provider.as_str(), self.reference),
        )
    }
}

/// A reference as banks compare them: trimmed, upper case.
fn normalized(reference: &str) -> String {
    reference.trim().to_uppercase()
}

/// A bank credit as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BankCredit)]
pub struct CreditView {
    /// `bcr_…`.
    pub id: String,
    pub livemode: bool,
    pub provider: Provider,
    /// The Nepal day of the settlement it pays, `YYYY-MM-DD`.
    pub date: String,
    /// Paisa.
    pub amount: Paisa,
    pub reference: String,
    pub created_at: Timestamp,
}

impl CreditView {
    pub fn of(c: &BankCredit) -> Self {
        CreditView {
            id: c.id.to_string(),
            livemode: c.mode.is_live(),
            provider: c.provider,
            date: c.date.clone(),
            amount: c.amount,
            reference: c.reference.clone(),
            created_at: c.created_at,
        }
    }
}

/// What a new credit says (`POST /v1/reconciliation/settlements/credits`).
#[derive(Clone, Copy, Debug)]
pub struct CreditRequest<'a> {
    pub provider: &'a str,
    pub date: &'a str,
    pub amount: i64,
    pub reference: &'a str,
}

/// A Nepal day written `YYYY-MM-DD`, `field` naming it when it is not.
pub fn parse_day(field: &'static str, raw: &str) -> Result<NaiveDate, SettlementError> {
    let raw = raw.trim();
    let day = (raw.len() == 10)
        .then(|| NaiveDate::parse_from_str(raw, "%Y-%m-%d").ok())
        .flatten()
        .filter(|d| nepal_day_start(*d).is_some() && d.year() >= 2000);
    day.ok_or_else(|| {
        invalid(
            field,
            format!("'{raw}' is not a date (YYYY-MM-DD, from 2000)"),
        )
    })
}

/// A provider named in a request.
pub fn parse_provider(raw: &str) -> Result<Provider, SettlementError> {
    Provider::parse(raw.trim()).ok_or_else(|| {
        invalid(
            "provider",
            format!("Unknown provider '{raw}': esewa, khalti or fonepay"),
        )
    })
}

/// The credit `req` makes on `today` (checked; not stored yet).
pub fn new_credit(
    tenant: &Tenant,
    req: CreditRequest<'_>,
    today: NaiveDate,
    now: Timestamp,
) -> Result<BankCredit, SettlementError> {
    let provider = parse_provider(req.provider)?;
    let date = parse_day("date", req.date)?;
    if date > today {
        return Err(invalid(
            "date",
            format!(
                "{date} is after today ({today}, Nepal): record a credit once it is in the bank"
            ),
        ));
    }
    let amount = match Paisa::new(req.amount) {
        Ok(a) if !a.is_zero() && req.amount <= MAX_CREDIT => a,
        _ => {
            return Err(invalid(
                "amount",
                format!("amount is paisa, 1 to {MAX_CREDIT}"),
            ));
        }
    };
    let reference = req.reference.trim();
    if reference.is_empty()
        || reference.chars().count() > MAX_REFERENCE
        || reference.chars().any(char::is_control)
    {
        return Err(invalid(
            "reference",
            format!(
                "reference is the bank's reference: 1 to {MAX_REFERENCE} characters, no control characters"
            ),
        ));
    }
    Ok(BankCredit {
        id: BankCreditId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        provider,
        date: date.format("%Y-%m-%d").to_string(),
        amount,
        reference: reference.to_owned(),
        created_at: now,
    })
}

/// Records a bank credit with `also` (a dashboard's audit entry) in its
/// transaction. With the request's idempotency `fence`, a retry after a
/// lost answer finds the first one; a reference already recorded for the
/// provider is refused.
pub async fn record_credit(
    deps: &Deps,
    tenant: &Tenant,
    req: CreditRequest<'_>,
    fence: Option<&Fence>,
    also: Vec<TxOp>,
) -> Result<BankCredit, SettlementError> {
    let now = deps.clock.now();
    let credit = new_credit(tenant, req, nepal_day(now), now)?;
    let claim = credit.claim();
    let claim_at = if fence.is_some() { 2 } else { 1 };
    let mut with = vec![claim.put_new()?];
    with.extend(also);
    let put = credit.put_new()?;
    match Fence::put_once_with(fence, &*deps.store, put, credit.id.as_str(), with).await {
        Ok(None) => Ok(credit),
        Ok(Some(first)) => get_credit(deps, tenant, &BankCreditId::stored(first)).await,
        Err(e) if Fence::tripped(&e, claim_at) => {
            let held: Option<ReferenceClaim> =
                crate::domain::record::get(&*deps.store, &claim.item_key()).await?;
            Err(SettlementError::DuplicateReference {
                provider: credit.provider.as_str(),
                reference: credit.reference,
                existing: held.map(|c| c.credit_id.to_string()).unwrap_or_default(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The credit `id` of the tenant (another project's or mode's: not found).
pub async fn get_credit(
    deps: &Deps,
    tenant: &Tenant,
    id: &BankCreditId,
) -> Result<BankCredit, SettlementError> {
    let found: Option<BankCredit> =
        crate::domain::record::get(&*deps.store, &BankCredit::key(id)).await?;
    found
        .filter(|c| tenant.owns(&c.project_id, c.mode))
        .ok_or_else(|| SettlementError::NotFound(id.to_string()))
}

/// Deletes a credit recorded by mistake, and its reference claim, with
/// `also` in the same transaction: the credit as it was.
pub async fn delete_credit(
    deps: &Deps,
    tenant: &Tenant,
    id: &BankCreditId,
    also: Vec<TxOp>,
) -> Result<BankCredit, SettlementError> {
    let credit = get_credit(deps, tenant, id).await?;
    let mut ops = vec![
        TxOp::Delete {
            key: credit.item_key(),
            cond: Some(Cond::Exists),
        },
        TxOp::Delete {
            key: credit.claim().item_key(),
            cond: Some(ReferenceClaim::CREDIT_ID.eq(&credit.id)),
        },
    ];
    ops.extend(also);
    match deps.store.transact(ops).await {
        Ok(()) => Ok(credit),
        // Deleted meanwhile by another request.
        Err(e) if e.is_condition_failure() => Err(SettlementError::NotFound(id.to_string())),
        Err(e) => Err(e.into()),
    }
}

// ---------------------------------------------------------------------------
// The days

/// Days `from..=to` (Nepal dates), at most [`MAX_DAYS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DayRange {
    pub from: NaiveDate,
    pub to: NaiveDate,
}

impl DayRange {
    /// From the query's `from` and `to` (inclusive, `YYYY-MM-DD`): absent
    /// `to` is `today`, absent `from` the [`DEFAULT_DAYS`] up to `to`.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        today: NaiveDate,
    ) -> Result<DayRange, SettlementError> {
        let to = match to {
            Some(raw) => parse_day("to", raw)?,
            None => today,
        };
        let from = match from {
            Some(raw) => parse_day("from", raw)?,
            None => to
                .checked_sub_days(Days::new(DEFAULT_DAYS - 1))
                .unwrap_or(to),
        };
        if from > to {
            return Err(invalid("from", format!("from ({from}) is after to ({to})")));
        }
        let span = u64::try_from((to - from).num_days()).unwrap_or(u64::MAX);
        if span >= MAX_DAYS {
            return Err(invalid(
                "to",
                format!(
                    "a range is at most {MAX_DAYS} days ({from} to {to} is {})",
                    span + 1
                ),
            ));
        }
        Ok(DayRange { from, to })
    }

    /// The instants it covers: `[start, end)`.
    fn bounds(self) -> Option<(Timestamp, Timestamp)> {
        let end = self.to.checked_add_days(Days::new(1))?;
        Some((nepal_day_start(self.from)?, nepal_day_start(end)?))
    }

    fn days(self) -> impl Iterator<Item = NaiveDate> {
        self.from.iter_days().take_while(move |d| *d <= self.to)
    }
}

/// One provider's settlement day as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SettlementDay)]
pub struct SettlementDay {
    pub provider: Provider,
    /// The Nepal day, `YYYY-MM-DD`.
    pub date: String,
    /// Paisa the provider should pay for the day: `paymentsNet` less
    /// `refundsNet` (negative when refunds outweigh payments).
    pub expected: i64,
    /// Successful payments of the day (`success` or `refunded`).
    pub expected_payments: u64,
    /// Refunds of the day that took money back (`succeeded` or
    /// `requires_action`).
    pub expected_refunds: u64,
    /// Their net: amount less the fee as recorded, paisa.
    pub payments_net: i64,
    /// Of those payments, how many have no fee recorded (counted at their
    /// amount: configure the provider's rate so they are not).
    pub payments_without_fee: u64,
    /// The refunds' net: amount less the fee the provider returns, paisa.
    pub refunds_net: i64,
    /// The credits recorded for the day, paisa.
    pub credited: i64,
    pub credits: Vec<CreditView>,
    /// `credited - expected`: 0 when the bank got what was expected.
    pub variance: i64,
}

/// A tenant's settlements over a range of days.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Settlements)]
pub struct Settlements {
    /// The first day, `YYYY-MM-DD` (Nepal).
    pub from: String,
    /// The last day, included.
    pub to: String,
    /// The days with a payment, a refund or a credit, oldest first, then
    /// by provider (`esewa`, `khalti`, `fonepay`).
    pub data: Vec<SettlementDay>,
}

/// The sums of one provider's day.
#[derive(Clone, Debug, Default, PartialEq)]
struct Sums {
    payments: u64,
    payments_net: i64,
    without_fee: u64,
    refunds: u64,
    refunds_net: i64,
    credits: Vec<BankCredit>,
}

/// The days being summed, by (day, provider): pure arithmetic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    days: BTreeMap<(NaiveDate, usize), Sums>,
}

fn rank(p: Provider) -> usize {
    Provider::ALL.iter().position(|x| *x == p).unwrap_or(0)
}

/// The Nepal day a record of ours was created: when its id was minted
/// (`ids::minted_at_ms`, how the index is read), else `created_at`.
pub fn day_of(minted_ms: Option<i64>, created_at: Timestamp) -> NaiveDate {
    let at = minted_ms
        .and_then(Timestamp::from_unix_millis)
        .unwrap_or(created_at);
    nepal_day(at)
}

impl Tally {
    fn at(&mut self, day: NaiveDate, provider: Provider) -> &mut Sums {
        self.days.entry((day, rank(provider))).or_default()
    }

    /// Counts `p` if it succeeded (`success`, or `refunded` since).
    pub fn add_payment(&mut self, p: &Payment) {
        if !matches!(p.status, PaymentStatus::Success | PaymentStatus::Refunded) {
            return;
        }
        let net = p.net().unwrap_or(p.amount).get();
        let s = self.at(day_of(ids::minted_at_ms(&p.id), p.created_at), p.provider);
        s.payments += 1;
        s.payments_net = s.payments_net.saturating_add(net);
        if p.fee().is_none() {
            s.without_fee += 1;
        }
    }

    /// Counts `r` if it took money back (`succeeded`, `requires_action`).
    pub fn add_refund(&mut self, r: &Refund) {
        if !matches!(
            r.status,
            RefundStatus::Succeeded | RefundStatus::RequiresAction
        ) {
            return;
        }
        let returned = r.fee.unwrap_or(Paisa::ZERO);
        let net = r.amount.checked_sub(returned).unwrap_or(Paisa::ZERO).get();
        let s = self.at(day_of(ids::minted_at_ms(&r.id), r.created_at), r.provider);
        s.refunds += 1;
        s.refunds_net = s.refunds_net.saturating_add(net);
    }

    pub fn add_credit(&mut self, c: BankCredit) {
        let Ok(day) = NaiveDate::parse_from_str(&c.date, "%Y-%m-%d") else {
            return;
        };
        self.at(day, c.provider).credits.push(c);
    }

    /// Takes in what `other` summed.
    pub fn absorb(&mut self, other: Tally) {
        for (k, o) in other.days {
            let s = self.days.entry(k).or_default();
            s.payments += o.payments;
            s.payments_net = s.payments_net.saturating_add(o.payments_net);
            s.without_fee += o.without_fee;
            s.refunds += o.refunds;
            s.refunds_net = s.refunds_net.saturating_add(o.refunds_net);
            s.credits.extend(o.credits);
        }
    }

    /// The days of `range` (of `provider` alone when given) that hold
    /// anything, oldest first.
    pub fn days(self, range: DayRange, provider: Option<Provider>) -> Vec<SettlementDay> {
        let wanted: Vec<NaiveDate> = range.days().collect();
        self.days
            .into_iter()
            .filter(|((day, p), _)| {
                wanted.contains(day) && provider.is_none_or(|want| rank(want) == *p)
            })
            .map(|((day, p), s)| {
                let expected = s.payments_net.saturating_sub(s.refunds_net);
                let credited = s
                    .credits
                    .iter()
                    .fold(0i64, |sum, c| sum.saturating_add(c.amount.get()));
                let mut credits = s.credits;
                credits.sort_by(|a, b| a.id.cmp(&b.id));
                SettlementDay {
                    provider: Provider::ALL.get(p).copied().unwrap_or(Provider::Esewa),
                    date: day.format("%Y-%m-%d").to_string(),
                    expected,
                    expected_payments: s.payments,
                    expected_refunds: s.refunds,
                    payments_net: s.payments_net,
                    payments_without_fee: s.without_fee,
                    refunds_net: s.refunds_net,
                    credited,
                    credits: credits.iter().map(CreditView::of).collect(),
                    variance: credited.saturating_sub(expected),
                }
            })
            .collect()
    }
}

/// What `GET /v1/reconciliation/settlements` asks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SettlementQuery<'a> {
    pub provider: Option<&'a str>,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
}

/// The tenant's settlement days over the range `q` asks.
pub async fn settlements(
    deps: &Deps,
    tenant: &Tenant,
    q: SettlementQuery<'_>,
) -> Result<Settlements, SettlementError> {
    let provider = q.provider.map(parse_provider).transpose()?;
    let range = DayRange::parse(q.from, q.to, nepal_day(deps.clock.now()))?;
    let data = days(deps, tenant, range, provider).await?;
    Ok(Settlements {
        from: range.from.format("%Y-%m-%d").to_string(),
        to: range.to.format("%Y-%m-%d").to_string(),
        data,
    })
}

/// The settlement days of `range` (checked) that hold anything.
pub async fn days(
    deps: &Deps,
    tenant: &Tenant,
    range: DayRange,
    provider: Option<Provider>,
) -> Result<Vec<SettlementDay>, SettlementError> {
    let store = &*deps.store;
    let (payments, refunds, credits) = tokio::join!(
        read_payments(store, tenant, range, provider),
        read_refunds(store, tenant, range, provider),
        read_credits(store, tenant, range),
    );
    let mut tally = payments?;
    tally.absorb(refunds?);
    tally.absorb(credits?);
    Ok(tally.days(range, provider))
}

/// The `gsi1` sort keys of ids of `kind` minted in `[start, end)`.
fn id_range(kind: IdKind, start: Timestamp, end: Timestamp) -> SkCond {
    let at = |t: Timestamp| u64::try_from(t.unix_millis()).unwrap_or(0);
    let low = ulid::Ulid::from_parts(at(start), 0);
    let high = ulid::Ulid::from_parts(at(end).saturating_sub(1), u128::MAX);
    let id = |u: ulid::Ulid| format!("{}{}", kind.prefix(), u.to_string().to_ascii_lowercase());
    SkCond::Between(id(low), id(high))
}

/// Every item `query` matches, page by page, each handed to `each`.
async fn each_of<T: DeserializeOwned>(
    store: &dyn Store,
    mut query: Query,
    mut each: impl FnMut(T),
) -> Result<(), StoreError> {
    query.limit = Some(PAGE);
    loop {
        let page = store.query(&query).await?;
        for item in page.items {
            each(from_item(item)?);
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => return Ok(()),
        }
    }
}

async fn read_payments(
    store: &dyn Store,
    tenant: &Tenant,
    range: DayRange,
    provider: Option<Provider>,
) -> Result<Tally, StoreError> {
    let mut tally = Tally::default();
    let Some((start, end)) = range.bounds() else {
        return Ok(tally);
    };
    let mut conds = vec![Payment::STATUS.is_in(&[PaymentStatus::Success, PaymentStatus::Refunded])];
    if let Some(p) = provider {
        conds.push(Payment::PROVIDER.eq(&p));
    }
    let query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        PerMode::Payments,
    ))
    .on(Index::Gsi1)
    .sk(id_range(IdKind::Payment, start, end))
    .filter(Cond::And(conds));
    each_of(store, query, |p: Payment| tally.add_payment(&p)).await?;
    Ok(tally)
}

async fn read_refunds(
    store: &dyn Store,
    tenant: &Tenant,
    range: DayRange,
    provider: Option<Provider>,
) -> Result<Tally, StoreError> {
    let mut tally = Tally::default();
    let Some((start, end)) = range.bounds() else {
        return Ok(tally);
    };
    let mut conds =
        vec![Refund::STATUS.is_in(&[RefundStatus::Succeeded, RefundStatus::RequiresAction])];
    if let Some(p) = provider {
        conds.push(Refund::PROVIDER.eq(&p));
    }
    let query = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        PerMode::Refunds,
    ))
    .on(Index::Gsi1)
    .sk(id_range(IdKind::Refund, start, end))
    .filter(Cond::And(conds));
    each_of(store, query, |r: Refund| tally.add_refund(&r)).await?;
    Ok(tally)
}

async fn read_credits(
    store: &dyn Store,
    tenant: &Tenant,
    range: DayRange,
) -> Result<Tally, StoreError> {
    let mut tally = Tally::default();
    let day = |d: NaiveDate| d.format("%Y-%m-%d").to_string();
    let query = Query::partition(BankCredit::list_partition(tenant))
        .on(Index::Gsi1)
        .sk(SkCond::Between(
            format!("{}#", day(range.from)),
            format!("{}#~", day(range.to)),
        ));
    each_of(store, query, |c: BankCredit| tally.add_credit(c)).await?;
    Ok(tally)
}

#[cfg(test)]
mod tests;
