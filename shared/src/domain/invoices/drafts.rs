//! Drafts: the request bodies and their rules, create, read, list, patch
//! (with the version check) and discard.

use serde::Deserialize;

use super::records::{
    Buyer, CollectionStatus, DocumentStatus, Invoice, Line, Quantity, StoredBuyer, line_total,
    tax_total,
};
use super::{MAX_LINES, MAX_TAX_BPS, MAX_UNIT_AMOUNT};
use crate::Deps;
use crate::domain::listing::counted;
use crate::domain::record::{Record, page_of};
use crate::domain::{Mode, Tenant, Window, account, checkout};
use crate::fields::wire::{nullable, or_null, present};
use crate::fields::{InvoiceLineText, InvoiceNote, InvoiceText};
use crate::ids::InvoiceId;
use crate::money::Currency;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Query, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// One line of a create or patch body.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LineInput {
    pub description: InvoiceLineText,
    pub quantity: String,
    pub unit_amount: i64,
}

/// `POST /v1/invoices` (camelCase request).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateInvoice {
    pub lines: Vec<LineInput>,
    pub due_at: String,
    #[serde(default, deserialize_with = "or_null")]
    pub customer_id: Option<InvoiceText>,
    #[serde(default, deserialize_with = "or_null")]
    pub buyer: Option<Buyer>,
    #[serde(default)]
    pub tax_rate_bps: Option<i64>,
    #[serde(default, deserialize_with = "or_null")]
    pub external_reference: Option<InvoiceText>,
    #[serde(default, deserialize_with = "or_null")]
    pub note: Option<InvoiceNote>,
}

/// `PATCH /v1/invoices/{id}`: the create fields to change, and the
/// `version` they were made against. A key sent as `null` clears it
/// (except `lines` and `dueAt`, which cannot be cleared).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchInvoice {
    pub version: i64,
    #[serde(default, deserialize_with = "present")]
    pub lines: Option<Vec<LineInput>>,
    #[serde(default, deserialize_with = "present")]
    pub due_at: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_id: Option<Option<InvoiceText>>,
    #[serde(default, deserialize_with = "nullable")]
    pub buyer: Option<Option<Buyer>>,
    #[serde(default, deserialize_with = "present")]
    pub tax_rate_bps: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub external_reference: Option<Option<InvoiceText>>,
    #[serde(default, deserialize_with = "nullable")]
    pub note: Option<Option<InvoiceNote>>,
}

#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinalizeInvoice {
    pub version: i64,
}

#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CorrectInvoice {
    pub reason: InvoiceLineText,
}

#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdjustInvoice {
    pub amount: i64,
    pub reason: InvoiceLineText,
    pub version: i64,
}

#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InvoiceCheckout {
    #[serde(default)]
    pub provider: Option<crate::domain::Provider>,
}

#[derive(Debug, thiserror::Error)]
pub enum InvoiceError {
    #[error("{message}")]
    Invalid { field: String, message: String },
    #[error("no such invoice: {0}")]
    NotFound(String),
    /// A retried discard whose first run deleted the draft.
    #[error("the draft was discarded by this request")]
    AlreadyDiscarded,
    #[error("live one-time invoices are disabled for this project; sandbox keeps working")]
    LiveDisabled,
    #[error("{0}")]
    StateConflict(String),
    #[error("the invoice changed since version {sent} (it is at version {current}); read it again")]
    VersionConflict { sent: i64, current: i64 },
    #[error("{0}")]
    NotCorrectable(String),
    /// The invoice's balance cannot be collected through a checkout now
    /// (provider disabled, sandbox cap, amount out of the provider's range).
    #[error("{0}")]
    Checkout(checkout::CheckoutError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<InvoiceError> for Refusal {
    fn from(err: InvoiceError) -> Self {
        match err {
            InvoiceError::Invalid { field, message } => Refusal::invalid(field, message),
            InvoiceError::NotFound(id) => Refusal::not_found("invoice", &id),
            e @ InvoiceError::LiveDisabled => {
                Refusal::forbidden("live_invoicing_disabled", e.to_string())
            }
            e @ InvoiceError::StateConflict(_) => {
                Refusal::conflict("state_conflict", e.to_string())
            }
            e @ InvoiceError::VersionConflict { .. } => {
                Refusal::conflict("version_conflict", e.to_string())
            }
            e @ InvoiceError::NotCorrectable(_) => {
                Refusal::unprocessable("invoice_not_correctable", e.to_string())
            }
            // The balance is out of what a checkout may take: a business
            // rule (nothing in the request to fix).
            InvoiceError::Checkout(checkout::CheckoutError::Invalid { message, .. }) => {
                Refusal::unprocessable(
                    "invoice_not_collectable",
                    format!("This invoice's balance cannot be collected by checkout: {message}"),
                )
            }
            InvoiceError::Checkout(e) => e.into(),
            e @ InvoiceError::AlreadyDiscarded => Refusal::not_found("invoice", &e.to_string()),
            InvoiceError::Store(e) => e.into(),
        }
    }
}

pub(super) fn invalid(field: impl Into<String>, message: impl Into<String>) -> InvoiceError {
    InvoiceError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// A text the merchant sent, trimmed; blank is none. Its rule (length,
/// characters) was kept when the request was parsed ([`crate::fields`]).
pub(super) fn text(value: Option<impl Into<String>>) -> Option<String> {
    value
        .map(|v| v.into().trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn valid_lines(lines: Vec<LineInput>) -> Result<Vec<Line>, InvoiceError> {
    if lines.is_empty() || lines.len() > MAX_LINES {
        return Err(invalid(
            "lines",
            format!("lines must hold 1 to {MAX_LINES} items"),
        ));
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let field = |name: &str| format!("lines[{i}].{name}");
            let description = text(Some(l.description))
                .ok_or_else(|| invalid(field("description"), "description must not be empty"))?;
            let quantity =
                Quantity::parse(l.quantity.trim()).map_err(|m| invalid(field("quantity"), m))?;
            if !(0..=MAX_UNIT_AMOUNT).contains(&l.unit_amount) {
                return Err(invalid(
                    field("unitAmount"),
                    format!("unitAmount must be whole paisa from 0 to {MAX_UNIT_AMOUNT}"),
                ));
            }
            Ok(Line {
                id: format!("il_{:03}", i + 1),
                description,
                quantity: quantity.text(),
                unit_amount: l.unit_amount,
                line_total: line_total(quantity, l.unit_amount),
            })
        })
        .collect()
}

fn valid_buyer(buyer: Option<Buyer>) -> Option<StoredBuyer> {
    let b = buyer?;
    let buyer = StoredBuyer {
        name: text(b.name),
        email: b.email.map(String::from),
        phone: text(b.phone),
        address: text(b.address),
    };
    (buyer != StoredBuyer::default()).then_some(buyer)
}

pub(super) fn valid_due(text_value: &str) -> Result<Timestamp, InvoiceError> {
    use chrono::Datelike;
    let due = Timestamp::parse(text_value.trim()).ok_or_else(|| {
        invalid(
            "dueAt",
            "dueAt must be a date-time like 2026-12-31T18:00:00+05:45",
        )
    })?;
    // Stored as RFC 3339 text: keep to years that read back (and make sense).
    if !(2000..=2199).contains(&due.datetime().year()) {
        return Err(invalid(
            "dueAt",
            "dueAt must be between the years 2000 and 2199",
        ));
    }
    Ok(due)
}

fn valid_tax(bps: Option<i64>) -> Result<i64, InvoiceError> {
    match bps {
        None => Ok(0),
        Some(b) if (0..=MAX_TAX_BPS).contains(&b) => Ok(b),
        Some(_) => Err(invalid(
            "taxRateBps",
            format!("taxRateBps must be 0 to {MAX_TAX_BPS}"),
        )),
    }
}

/// Recomputes subtotal, tax and total from the lines and the rate.
pub(super) fn price(inv: &mut Invoice) -> Result<(), InvoiceError> {
    let subtotal: i128 = inv.lines.iter().map(|l| i128::from(l.line_total)).sum();
    let subtotal =
        i64::try_from(subtotal).map_err(|_| invalid("lines", "the invoice total is too large"))?;
    let tax = tax_total(subtotal, inv.tax_rate_bps);
    inv.subtotal = subtotal;
    inv.tax_total = tax;
    inv.total_amount = subtotal
        .checked_add(tax)
        .filter(|t| *t <= i64::MAX / 4)
        .ok_or_else(|| invalid("lines", "the invoice total is too large"))?;
    Ok(())
}

/// A new draft from a create body (validated; not stored).
pub fn new_draft(
    tenant: &Tenant,
    body: CreateInvoice,
    now: Timestamp,
) -> Result<Invoice, InvoiceError> {
    let lines = valid_lines(body.lines)?;
    let mut inv = Invoice {
        id: InvoiceId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        version: 1,
        invoice_number: None,
        document_status: DocumentStatus::Draft,
        collection_status: CollectionStatus::Unpaid,
        currency: Currency::Npr,
        lines,
        subtotal: 0,
        tax_rate_bps: valid_tax(body.tax_rate_bps)?,
        tax_total: 0,
        total_amount: 0,
        amount_paid: 0,
        amount_adjusted: 0,
        amount_excess: 0,
        customer_id: text(body.customer_id),
        buyer: valid_buyer(body.buyer),
        seller: None,
        issued_at: None,
        due_at: valid_due(&body.due_at)?,
        created_at: now,
        updated_at: now,
        external_reference: text(body.external_reference),
        note: text(body.note),
        needs_attention: false,
        voided_at: None,
        void_reason: None,
        corrected_by_invoice_id: None,
        correction_of_invoice_id: None,
        checkout_session_id: None,
        allocations: Vec::new(),
        adjustments: Vec::new(),
        counted: true,
        narrowed: true,
    };
    price(&mut inv)?;
    Ok(inv)
}

// ------------------------------------------------------------ operations

/// The invoice `id` of any project (payments settle by session).
pub async fn get_any(store: &dyn Store, id: &InvoiceId) -> Result<Option<Invoice>, StoreError> {
    crate::domain::record::get(store, &Invoice::key(id)).await
}

/// The tenant's invoice `id` (not found for any other's).
pub async fn get(deps: &Deps, tenant: &Tenant, id: &InvoiceId) -> Result<Invoice, InvoiceError> {
    get_in(&*deps.store, tenant, id).await
}

/// [`get`] on a store (for the capability's own steps).
pub(super) async fn get_in(
    store: &dyn Store,
    tenant: &Tenant,
    id: &InvoiceId,
) -> Result<Invoice, InvoiceError> {
    match get_any(store, id).await? {
        Some(inv) if tenant.owns(&inv.project_id, inv.mode) => Ok(inv),
        _ => Err(InvoiceError::NotFound(id.to_string())),
    }
}

/// Creates a draft. Live mode needs live invoicing enabled on the
/// project. With the request's fence, a retry finds the first draft.
pub async fn create(
    state: &Deps,
    tenant: &Tenant,
    body: CreateInvoice,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    if tenant.mode == Mode::Live {
        let project = account::get_project(state, &tenant.project).await?;
        if !project.is_some_and(|p| p.live_invoicing) {
            return Err(InvoiceError::LiveDisabled);
        }
    }
    let inv = new_draft(tenant, body, state.clock.now())?;
    let mut ops = vec![inv.put_new()?];
    if let Some(f) = fence {
        ops.push(f.op(&inv.id));
    }
    // The counters last: the fence's index (1) is read on failure.
    ops.extend(inv.counts_new());
    let mut tries = 0;
    loop {
        match state.store.transact(ops.clone()).await {
            Ok(()) => return Ok(inv),
            Err(e) => match fence {
                Some(f) if Fence::tripped(&e, 1) => return first_of(state, f, tenant).await,
                // A concurrent insert on the same counter shard.
                _ if counted::is_conflict(&e) && tries < 8 => {
                    tries += 1;
                    crate::store::contention_backoff(tries).await;
                }
                _ => return Err(e.into()),
            },
        }
    }
}

/// What the first run of a fenced request made.
async fn first_of(state: &Deps, fence: &Fence, tenant: &Tenant) -> Result<Invoice, InvoiceError> {
    let first = fence.resource_id(&*state.store).await?.unwrap_or_default();
    get_in(&*state.store, tenant, &InvoiceId::stored(first)).await
}

/// One page of the project's invoices, newest first, with the total.
/// Unfiltered: the counted list; by status: its narrowing (once the
/// tenant's [`counted::Narrowing::InvoicesByStatus`] is covered), any
/// offset at a bounded cost either way. A tenant not yet migrated is read
/// the older way (a filter over the list).
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    document_status: Option<DocumentStatus>,
    collection_status: Option<CollectionStatus>,
    window: Window,
) -> Result<(Vec<Invoice>, u64), StoreError> {
    let store = &*deps.store;
    if document_status.is_none() && collection_status.is_none() {
        // Unfiltered: counted (once covered), any offset at a bounded cost.
        let covered = counted::covered(store, tenant, counted::CountedKind::Invoices).await?;
        let list = Invoice::counted_list_of(tenant);
        let (invoices, total, _) = counted::page(store, &list, &window, covered).await?;
        return Ok((invoices, total));
    }
    let narrowing = counted::Narrowing::InvoicesByStatus;
    if counted::covered_narrowing(store, tenant, narrowing).await? {
        let list = Invoice::by_status(tenant, document_status, collection_status);
        let (invoices, total, _) = counted::page(store, &list, &window, true).await?;
        return Ok((invoices, total));
    }
    let mut filters = Vec::new();
    if let Some(d) = document_status {
        filters.push(Invoice::DOCUMENT_STATUS.eq(&d));
    }
    if let Some(c) = collection_status {
        filters.push(Invoice::COLLECTION_STATUS.eq(&c));
    }
    let query = Query::partition(Invoice::list_partition(tenant))
        .on(Index::Gsi1)
        .backward()
        .filter(Cond::And(filters));
    page_of(store, &query, window).await
}

/// Runs `ops`, again while a concurrent writer holds one of its counter
/// shards (nothing was written).
pub(super) async fn transact(store: &dyn Store, ops: Vec<TxOp>) -> Result<(), StoreError> {
    let mut tries = 0;
    loop {
        match store.transact(ops.clone()).await {
            Err(e) if counted::is_conflict(&e) && tries < 8 => {
                tries += 1;
                crate::store::contention_backoff(tries).await;
            }
            done => return done,
        }
    }
}

/// `current` with `version` checked against what the caller sent.
pub(super) fn check_version(current: &Invoice, sent: i64) -> Result<(), InvoiceError> {
    if current.version != sent {
        return Err(InvoiceError::VersionConflict {
            sent,
            current: current.version,
        });
    }
    Ok(())
}

pub(super) fn require_state(
    current: &Invoice,
    want: DocumentStatus,
    what: &str,
) -> Result<(), InvoiceError> {
    if current.document_status != want {
        return Err(InvoiceError::StateConflict(format!(
            "{what} needs a {} invoice; this one is {}",
            want.as_str(),
            current.document_status.as_str()
        )));
    }
    Ok(())
}

/// Writes `next` over `current`; a lost race is a version conflict.
pub(super) async fn replace(
    store: &dyn Store,
    current: &Invoice,
    next: Invoice,
    extra: Vec<TxOp>,
    what: &str,
) -> Result<Invoice, InvoiceError> {
    let mut ops = Invoice::write_over(current, &next, Vec::new())?;
    ops.extend(extra);
    match transact(store, ops).await {
        Ok(()) => Ok(next),
        Err(e) if e.is_condition_failure() => {
            Err(lost_race(store, current, current.version, what).await)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why a write made against `current` (at `sent` version) did not land:
/// the invoice as it is now decides between a state and a version
/// conflict.
pub(super) async fn lost_race(
    store: &dyn Store,
    current: &Invoice,
    sent: i64,
    what: &str,
) -> InvoiceError {
    match get_in(
        store,
        &Tenant::new(current.project_id.clone(), current.mode),
        &current.id,
    )
    .await
    {
        Ok(now) if now.document_status != current.document_status => {
            InvoiceError::StateConflict(format!(
                "{what} needs a {} invoice; this one is now {}",
                current.document_status.as_str(),
                now.document_status.as_str()
            ))
        }
        Ok(now) if now.version != current.version => InvoiceError::VersionConflict {
            sent,
            current: now.version,
        },
        Ok(_) => InvoiceError::StateConflict(format!(
            "the invoice's checkout changed during {what}; read it again"
        )),
        Err(e) => e,
    }
}

/// Edits a draft (the keys sent change), at the version sent.
pub async fn patch(
    state: &Deps,
    tenant: &Tenant,
    id: &InvoiceId,
    body: PatchInvoice,
) -> Result<Invoice, InvoiceError> {
    let current = get_in(&*state.store, tenant, id).await?;
    require_state(&current, DocumentStatus::Draft, "editing")?;
    check_version(&current, body.version)?;
    let mut next = current.clone();
    if let Some(lines) = body.lines {
        next.lines = valid_lines(lines)?;
    }
    if let Some(due) = body.due_at {
        next.due_at = valid_due(&due)?;
    }
    if let Some(v) = body.customer_id {
        next.customer_id = text(v);
    }
    if let Some(v) = body.buyer {
        next.buyer = valid_buyer(v);
    }
    if let Some(v) = body.tax_rate_bps {
        next.tax_rate_bps = valid_tax(Some(v))?;
    }
    if let Some(v) = body.external_reference {
        next.external_reference = text(v);
    }
    if let Some(v) = body.note {
        next.note = text(v);
    }
    price(&mut next)?;
    next.version += 1;
    next.updated_at = state.clock.now();
    replace(&*state.store, &current, next, Vec::new(), "editing").await
}
