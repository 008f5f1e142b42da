//! Customer credit (issue 40 part 3): a balance in paisa applied to the
//! customer's next invoices before payment, and its ledger.
//!
//! The balance lives on the customer (`credit_balance`) with the number of
//! ledger entries written (`credit_entries`, its version). Every change is
//! ONE transaction: the customer's update, conditioned on the version read
//! (and on the customer existing), the ledger entry (`cbt_…`, with the
//! balance after it, its reason and who made it) and the
//! `customer.credit_updated` webhook. Two writers racing on one balance:
//! one wins, the other reads again, so a balance never goes below zero
//! and no entry is lost; a deduction beyond the balance, an amount of 0
//! and a balance that would overflow are refused (400 naming `amount`).
//!
//! Writers: the API and the dashboard ([`add`], reason `manual`), the
//! invoice issue ([`grant_ops`] in its transaction, `invoice_applied`), a
//! plan change's net credit (`proration_credit`), an overpayment kept as
//! credit (`overpayment`).

use serde::{Deserialize, Serialize};

use crate::Deps;
use crate::domain::Mode;
use crate::domain::Tenant;
use crate::domain::billing::adjust::Hook;
use crate::domain::billing::customers::{BillingError, Customer, CustomerView, get, invalid};
use crate::domain::billing::invoice::BillingInvoice;
use crate::domain::billing::tax::{OverpaymentHandling, TaxSettings};
use crate::domain::outbox::{Event, EventType};
use crate::domain::record::{Changes, Record, from_item};
use crate::fields::wire::or_null;
use crate::ids::{ApiKeyId, BillingInvoiceId, CreditEntryId, CustomerId, ProjectId, UserId};
use crate::store::fence::Fence;
use crate::store::{Cond, Key, Query, StoreError, TxOp};
use crate::time::Timestamp;

/// Longest `note`.
pub const MAX_NOTE: usize = 500;
/// Most entries a ledger read answers.
pub const MAX_LEDGER: usize = 100;
/// How often a change re-reads a balance another writer moved.
const TRIES: usize = 64;

/// Why a ledger entry was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BillingCreditReason)]
pub enum CreditReason {
    /// Added or deducted by the merchant (API or dashboard).
    Manual,
    /// Applied to an invoice when it was issued.
    InvoiceApplied,
    /// A plan change's net credit.
    ProrationCredit,
    /// A payment for an invoice already paid, kept as credit.
    Overpayment,
}

/// Who wrote a ledger entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CreditActor {
    ApiKey {
        key_id: ApiKeyId,
    },
    DashboardUser {
        user_id: UserId,
    },
    /// The billing engine (an invoice, a plan change, an overpayment).
    System,
}

impl CreditActor {
    /// `ak_…`, `usr_…`, or `null` for the engine.
    pub fn id(&self) -> Option<String> {
        match self {
            CreditActor::ApiKey { key_id } => Some(key_id.to_string()),
            CreditActor::DashboardUser { user_id } => Some(user_id.to_string()),
            CreditActor::System => None,
        }
    }
}

/// One entry of a customer's credit ledger (stored kind "credit entry").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditEntry {
    pub id: CreditEntryId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub customer_id: CustomerId,
    /// Paisa: positive adds, negative deducts.
    pub amount: i64,
    pub balance_after: i64,
    pub reason: CreditReason,
    pub note: Option<String>,
    pub actor: CreditActor,
    /// The invoice it was applied to, or whose overpayment it keeps.
    pub invoice_id: Option<BillingInvoiceId>,
    pub created_at: Timestamp,
}

impl CreditEntry {
    /// A customer's ledger: its own partition, by id (oldest first).
    pub fn partition(tenant: &Tenant, customer: &CustomerId) -> String {
        format!("{}#{customer}#CREDIT", Customer::partition(tenant))
    }
}

impl Record for CreditEntry {
    fn item_key(&self) -> Key {
        let tenant = Tenant::new(self.project_id.clone(), self.mode);
        Key::new(
            CreditEntry::partition(&tenant, &self.customer_id),
            self.id.as_str(),
        )
    }
}

/// A ledger entry as the API and the dashboard show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingCreditEntry)]
pub struct CreditEntryView {
    /// `cbt_…`.
    pub id: String,
    pub customer_id: String,
    pub amount: i64,
    pub balance_after: i64,
    pub reason: CreditReason,
    pub note: Option<String>,
    /// The API key (`ak_…`) or dashboard user (`usr_…`) that made it;
    /// `null` for the billing engine.
    pub created_by: Option<String>,
    pub invoice_id: Option<String>,
    pub created_at: Timestamp,
}

impl CreditEntryView {
    pub fn of(e: &CreditEntry) -> Self {
        CreditEntryView {
            id: e.id.to_string(),
            customer_id: e.customer_id.to_string(),
            amount: e.amount,
            balance_after: e.balance_after,
            reason: e.reason,
            note: e.note.clone(),
            created_by: e.actor.id(),
            invoice_id: e.invoice_id.as_ref().map(ToString::to_string),
            created_at: e.created_at,
        }
    }
}

/// `POST /v1/billing/customers/{id}/credit` (the SDK's `add_credit`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = AddBillingCustomerCredit)]
pub struct AddCredit {
    /// Paisa, not 0: positive adds, negative deducts (never below 0).
    pub amount: i64,
    /// At most 500 characters.
    #[serde(default, deserialize_with = "or_null")]
    pub note: Option<String>,
}

/// The balance after `amount` is applied to `balance`: refused (naming
/// `amount`) for 0, below zero and an overflow.
pub fn next_balance(balance: i64, amount: i64) -> Result<i64, BillingError> {
    if amount == 0 {
        return Err(invalid(
            "amount",
            "amount must not be 0: positive adds credit, negative deducts it",
        ));
    }
    let Some(next) = balance.checked_add(amount) else {
        return Err(invalid(
            "amount",
            "amount would make the credit balance overflow",
        ));
    };
    if next < 0 {
        return Err(invalid(
            "amount",
            format!(
                "amount deducts {} paisa but the credit balance is {balance} paisa",
                amount.unsigned_abs()
            ),
        ));
    }
    Ok(next)
}

/// A note: trimmed; empty is none; at most [`MAX_NOTE`] characters, no
/// control characters but line breaks.
pub fn note(raw: Option<&str>) -> Result<Option<String>, BillingError> {
    let Some(t) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if t.chars().count() > MAX_NOTE || t.chars().any(|c| c.is_control() && c != '\n') {
        return Err(invalid(
            "note",
            format!("note must be at most {MAX_NOTE} characters, without control characters"),
        ));
    }
    Ok(Some(t.to_owned()))
}

/// One change of a balance.
#[derive(Clone, Debug)]
pub struct Grant {
    /// Paisa: positive adds, negative deducts.
    pub amount: i64,
    pub reason: CreditReason,
    pub note: Option<String>,
    pub actor: CreditActor,
    pub invoice_id: Option<BillingInvoiceId>,
}

/// What a change writes.
#[derive(Clone, Debug)]
pub struct Granted {
    /// The customer's update (conditioned on the balance's version read),
    /// the ledger entry and the `customer.credit_updated` webhook: for one
    /// transaction.
    pub ops: Vec<TxOp>,
    /// The customer as changed.
    pub customer: Customer,
    pub entry: CreditEntry,
}

/// The writes that apply `grant` to `customer` as read (checked: never
/// below 0, no overflow, not 0). Any write that changed the balance since
/// makes the transaction fail, for the caller to read again.
pub fn grant_ops(
    customer: &Customer,
    grant: Grant,
    now: Timestamp,
) -> Result<Granted, BillingError> {
    let balance = next_balance(customer.credit_balance, grant.amount)?;
    let entries = customer.credit_entries + 1;
    let tenant = Tenant::new(customer.project_id.clone(), customer.mode);
    let entry = CreditEntry {
        id: CreditEntryId::new(),
        project_id: customer.project_id.clone(),
        mode: customer.mode,
        customer_id: customer.id.clone(),
        amount: grant.amount,
        balance_after: balance,
        reason: grant.reason,
        note: grant.note,
        actor: grant.actor,
        invoice_id: grant.invoice_id,
        created_at: now,
    };
    let mut changed = customer.clone();
    changed.credit_balance = balance;
    changed.credit_entries = entries;
    let seen = if customer.credit_entries == 0 {
        Cond::Or(vec![
            Customer::CREDIT_ENTRIES.missing(),
            Customer::CREDIT_ENTRIES.eq(&0),
        ])
    } else {
        Customer::CREDIT_ENTRIES.eq(&customer.credit_entries)
    };
    let mut ops = vec![
        TxOp::Update {
            key: Customer::key(&tenant, &customer.id),
            update: Changes::<Customer>::new()
                .set(Customer::CREDIT_BALANCE, &balance)
                .set(Customer::CREDIT_ENTRIES, &entries)
                .into(),
            cond: Some(Cond::And(vec![Cond::Exists, seen])),
        },
        entry.put_new()?,
    ];
    let object = serde_json::to_value(CustomerView::of(&changed))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    ops.extend(Event::new(EventType::CustomerCreditUpdated, &tenant, object, now).put_ops()?);
    Ok(Granted {
        ops,
        customer: changed,
        entry,
    })
}

/// A rule's refusal as the store error a transaction's builder answers.
fn as_store(e: BillingError) -> StoreError {
    match e {
        BillingError::Store(e) => e,
        other => StoreError::Invalid(other.to_string()),
    }
}

/// The writes of `grant` for the tenant's customer `id` as read now
/// (conditioned on its balance's version: a transaction holding them
/// fails when the balance moved, for the caller to read again). For a
/// plan change's net credit (`CreditReason::ProrationCredit`), written in
/// the change's own transaction.
pub async fn grant_for(
    deps: &Deps,
    tenant: &Tenant,
    id: &CustomerId,
    grant: Grant,
    now: Timestamp,
) -> Result<Granted, BillingError> {
    let customer = get(deps, tenant, id).await?;
    grant_ops(&customer, grant, now)
}

/// `gather`'s part: the credit the tenant's customer `id` has for an
/// invoice issued now, and the hook that records what the invoice took
/// (a ledger entry `invoice_applied`, conditioned on the balance read).
/// No credit (or no customer): 0 and no hook.
pub async fn invoice_credit(
    deps: &Deps,
    tenant: &Tenant,
    id: &CustomerId,
    now: Timestamp,
) -> Result<(i64, Option<Hook>), StoreError> {
    let customer = match get(deps, tenant, id).await {
        Ok(c) => c,
        Err(BillingError::NotFound { .. }) => return Ok((0, None)),
        Err(e) => return Err(as_store(e)),
    };
    if customer.credit_balance <= 0 {
        return Ok((0, None));
    }
    let available = customer.credit_balance;
    let hook: Hook = Box::new(move |inv: &BillingInvoice| {
        if inv.credit_applied <= 0 {
            return Ok(Vec::new());
        }
        let grant = Grant {
            amount: -inv.credit_applied,
            reason: CreditReason::InvoiceApplied,
            note: Some(format!("Applied to invoice {}", inv.number)),
            actor: CreditActor::System,
            invoice_id: Some(inv.id.clone()),
        };
        grant_ops(&customer, grant, now)
            .map(|g| g.ops)
            .map_err(as_store)
    });
    Ok((available, Some(hook)))
}

/// The customer an overpayment of `inv` is kept for as credit: when the
/// tenant's `overpaymentHandling` is `credit` and the customer is there
/// (else it is refunded, as the core does).
pub async fn overpayment_keeper(
    store: &dyn crate::store::Store,
    inv: &BillingInvoice,
) -> Result<Option<Customer>, StoreError> {
    let tenant = Tenant::new(inv.project_id.clone(), inv.mode);
    let settings =
        crate::domain::record::get::<TaxSettings>(store, &TaxSettings::key(&tenant)).await?;
    if settings.map(|s| s.overpayment_handling) != Some(OverpaymentHandling::Credit) {
        return Ok(None);
    }
    crate::domain::record::get::<Customer>(store, &Customer::key(&tenant, &inv.customer_id)).await
}

/// Adds (or deducts) credit for the tenant's customer `id` by `actor`,
/// with the request's idempotency `fence`: a retry after a lost answer
/// changes nothing more. Answers the customer as changed.
pub async fn add(
    deps: &Deps,
    tenant: &Tenant,
    id: &CustomerId,
    body: AddCredit,
    actor: CreditActor,
    fence: Option<&Fence>,
) -> Result<(Customer, Option<CreditEntry>), BillingError> {
    let note = note(body.note.as_deref())?;
    if body.amount == 0 {
        next_balance(0, 0)?;
    }
    for attempt in 0..TRIES {
        let customer = get(deps, tenant, id).await?;
        let grant = Grant {
            amount: body.amount,
            reason: CreditReason::Manual,
            note: note.clone(),
            actor: actor.clone(),
            invoice_id: None,
        };
        let granted = grant_ops(&customer, grant, deps.clock.now())?;
        let mut ops = Vec::with_capacity(granted.ops.len() + 1);
        if let Some(f) = fence {
            ops.push(f.op(granted.entry.id.as_str()));
        }
        ops.extend(granted.ops);
        match deps.store.transact(ops).await {
            Ok(()) => return Ok((granted.customer, Some(granted.entry))),
            // This very request was written before: answer as it is now.
            Err(e) if fence.is_some() && Fence::tripped(&e, 0) => {
                return Ok((get(deps, tenant, id).await?, None));
            }
            Err(e)
                if e.is_condition_failure()
                    || crate::domain::billing::subscription::is_conflict(&e) =>
            {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingError::Store(StoreError::Backend(
        "the credit balance changed too often while being written; retry".into(),
    )))
}

/// The newest `limit` (at most [`MAX_LEDGER`]) entries of the tenant's
/// customer `id`'s ledger, newest first.
pub async fn ledger(
    deps: &Deps,
    tenant: &Tenant,
    id: &CustomerId,
    limit: usize,
) -> Result<Vec<CreditEntry>, BillingError> {
    let query = Query::partition(CreditEntry::partition(tenant, id)).backward();
    let items =
        crate::store::query_window(&*deps.store, &query, 0, limit.clamp(1, MAX_LEDGER)).await?;
    Ok(items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<CreditEntry>, _>>()?)
}

#[cfg(test)]
mod tests;
