//! Pending invoice items (issue 40 part 7): one-off charges a merchant
//! adds to a subscription, consumed by its next invoice exactly once.
//! No HTTP.
//!
//! Stored in the subscription's items partition (`SUB#<sub>#ITEMS`, sort
//! key the id: oldest first). An item is `pending` until an invoice takes
//! it: the issuing transaction sets it `invoiced` conditioned on its
//! being `pending` (the hook [`consume_ops`]), and a delete is
//! conditioned the same way, so of an issue and a delete racing exactly
//! one wins: a deleted item is on no invoice, an invoiced one is not
//! deleted (409 `invoice_item_invoiced`).
//!
//! **The cap.** [`PendingCount`] (sort key `COUNT` in the same partition)
//! counts the pending items. A create adds 1 in the item's own
//! transaction, conditioned on the count being below [`MAX_PENDING`]; a
//! delete subtracts 1 in the delete's transaction, and the invoice that
//! takes items subtracts them in its own: each item leaves `pending`
//! once, by exactly one of them, so racing creates never pass the cap and
//! an invoice (which takes up to [`MAX_PENDING`]) takes every one.

use serde::{Deserialize, Serialize};

use super::adjust::Hook;
use super::customers::{BillingError, invalid, text};
use super::invoice::{InvoiceLine, LineKind};
use super::lifecycle::LifecycleError;
use super::period::Period;
use super::subscription::{self, Subscription, SubscriptionError, is_conflict};
use crate::Deps;
use crate::domain::record::{self, Changes, Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, InvoiceItemId, ProjectId, SubscriptionId};
use crate::money::Currency;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Key, Query, SkCond, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// Longest `description`.
pub const MAX_DESCRIPTION: usize = 500;
/// Largest `amount` per unit: Rs 10 crore.
pub const MAX_AMOUNT: i64 = 10_000_000_000;
/// Largest `quantity`.
pub const MAX_QUANTITY: u32 = 10_000;
/// Most pending items a subscription holds, and the most one invoice
/// takes (the oldest first; the issuing transaction has room for them).
pub const MAX_PENDING: usize = 40;

/// [`MAX_PENDING`] as the count is stored.
const CAP: i64 = MAX_PENDING as i64;
/// Tries of a create or delete against conflicting writes of the count.
const TRIES: usize = 12;
/// Sort keys of items (their ids), apart from the count.
const ITEM_PREFIX: &str = "ii_";

/// Whether an item still waits for an invoice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    Pending,
    Invoiced,
}

/// A one-off charge of a subscription.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InvoiceItem {
    pub id: InvoiceItemId,
    pub subscription_id: SubscriptionId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub description: String,
    /// Paisa per unit, more than 0.
    pub unit_amount: i64,
    pub quantity: u32,
    pub currency: Currency,
    pub status: ItemStatus,
    /// The invoice that took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invoice_id: Option<BillingInvoiceId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invoiced_at: Option<Timestamp>,
    pub created_at: Timestamp,
}

crate::attrs! { InvoiceItem {
    STATUS: ItemStatus = status,
    INVOICE_ID: Option<BillingInvoiceId> = invoice_id,
    INVOICED_AT: Option<Timestamp> = invoiced_at,
} }

impl InvoiceItem {
    pub fn partition(sub: &SubscriptionId) -> String {
        format!("SUB#{sub}#ITEMS")
    }

    pub fn key(sub: &SubscriptionId, id: &InvoiceItemId) -> Key {
        Key::new(InvoiceItem::partition(sub), id.as_str())
    }

    /// `unit_amount * quantity`, paisa.
    pub fn total(&self) -> i64 {
        self.unit_amount.saturating_mul(i64::from(self.quantity))
    }
}

impl InvoiceItem {
    /// Its line on the invoice of `period`.
    pub fn line(&self, period: Period) -> InvoiceLine {
        InvoiceLine {
            kind: LineKind::Item,
            description: self.description.clone(),
            quantity: u64::from(self.quantity),
            amount: self.total(),
            period_start: period.start,
            period_end: period.end_exclusive,
        }
    }
}

impl Record for InvoiceItem {
    fn item_key(&self) -> Key {
        InvoiceItem::key(&self.subscription_id, &self.id)
    }
}

/// How many items of a subscription are pending (the cap's counter):
/// changed only by `ADD`, in the transaction that makes, deletes or
/// invoices its items. None stored is 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingCount {
    pub subscription_id: SubscriptionId,
    #[serde(default)]
    pub pending: i64,
}

crate::attrs! { PendingCount {
    SUBSCRIPTION_ID: SubscriptionId = subscription_id,
    PENDING: i64 = pending,
} }

impl PendingCount {
    pub fn key(sub: &SubscriptionId) -> Key {
        Key::new(InvoiceItem::partition(sub), "COUNT")
    }

    /// The write that moves the count by `delta`, on `cond`.
    fn op(sub: &SubscriptionId, delta: i64, cond: Option<Cond>) -> TxOp {
        TxOp::Update {
            key: PendingCount::key(sub),
            update: Changes::<PendingCount>::new()
                .set(PendingCount::SUBSCRIPTION_ID, sub)
                .add(PendingCount::PENDING, delta)
                .into(),
            cond,
        }
    }
}

impl Record for PendingCount {
    fn item_key(&self) -> Key {
        PendingCount::key(&self.subscription_id)
    }
}

/// The stored count of pending items of `sub` (0 when none is stored).
pub async fn pending_count(deps: &Deps, sub: &SubscriptionId) -> Result<i64, StoreError> {
    Ok(
        record::get::<PendingCount>(&*deps.store, &PendingCount::key(sub))
            .await?
            .map_or(0, |c| c.pending),
    )
}

/// Whether the transaction failed on its op at `index`.
fn failed_at(e: &StoreError, index: usize) -> bool {
    matches!(e, StoreError::TransactionCanceled { reasons }
        if matches!(reasons.get(index), Some(TxReason::ConditionFailed)))
}

/// Why an invoice item request is refused.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    #[error(transparent)]
    Billing(#[from] BillingError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("subscription {0} has ended: it has no next invoice to add an item to")]
    Ended(SubscriptionId),
    #[error(
        "invoice item {item} is on invoice {invoice}: an invoiced item cannot be deleted (credit the customer instead)"
    )]
    Invoiced {
        item: InvoiceItemId,
        invoice: String,
    },
    #[error(
        "subscription {0} has {MAX_PENDING} pending invoice items, the most it holds: delete one or wait for the next invoice"
    )]
    TooMany(SubscriptionId),
}

impl From<StoreError> for ItemError {
    fn from(e: StoreError) -> Self {
        ItemError::Billing(BillingError::Store(e))
    }
}

impl From<SubscriptionError> for ItemError {
    fn from(e: SubscriptionError) -> Self {
        ItemError::Lifecycle(e.into())
    }
}

impl From<ItemError> for Refusal {
    fn from(err: ItemError) -> Self {
        match err {
            ItemError::Billing(e) => e.into(),
            ItemError::Lifecycle(e) => e.into(),
            e @ ItemError::Ended(_) => {
                Refusal::conflict("subscription_state_conflict", e.to_string())
            }
            e @ ItemError::Invoiced { .. } => {
                Refusal::conflict("invoice_item_invoiced", e.to_string())
            }
            e @ ItemError::TooMany(_) => Refusal::conflict("invoice_item_limit", e.to_string()),
        }
    }
}

/// `POST /v1/billing/subscriptions/{id}/invoice-items`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateInvoiceItem)]
pub struct CreateItem {
    /// Paisa per unit: 1 to 10,000,000,000.
    pub amount: i64,
    /// What the invoice line says: 1 to 500 characters.
    pub description: String,
    /// 1 to 10,000; default 1. The line is `amount * quantity`.
    #[serde(default)]
    pub quantity: Option<i64>,
}

/// An invoice item as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = InvoiceItem)]
pub struct ItemView {
    /// `ii_…`.
    pub id: String,
    pub object: &'static str,
    pub livemode: bool,
    pub subscription_id: String,
    /// Paisa per unit.
    pub amount: i64,
    pub quantity: u32,
    /// `amount * quantity`.
    pub total: i64,
    pub currency: Currency,
    pub description: String,
    pub status: ItemStatus,
    /// The invoice that took it (`inv_…`), null while pending.
    pub invoice_id: Option<String>,
    pub invoiced_at: Option<Timestamp>,
    pub created_at: Timestamp,
}

impl ItemView {
    pub fn of(i: &InvoiceItem) -> Self {
        ItemView {
            id: i.id.to_string(),
            object: "invoice_item",
            livemode: i.mode.is_live(),
            subscription_id: i.subscription_id.to_string(),
            amount: i.unit_amount,
            quantity: i.quantity,
            total: i.total(),
            currency: i.currency,
            description: i.description.clone(),
            status: i.status,
            invoice_id: i.invoice_id.as_ref().map(ToString::to_string),
            invoiced_at: i.invoiced_at,
            created_at: i.created_at,
        }
    }
}

/// The answer to a delete.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletedItem {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}

/// The checked (unit amount, description, quantity) of a create.
pub fn checked(body: &CreateItem) -> Result<(i64, String, u32), BillingError> {
    if !(1..=MAX_AMOUNT).contains(&body.amount) {
        return Err(invalid(
            "amount",
            format!("amount must be paisa per unit, from 1 to {MAX_AMOUNT}"),
        ));
    }
    let description = text("description", &body.description, MAX_DESCRIPTION)?;
    let quantity = match body.quantity {
        None => 1,
        Some(q) => u32::try_from(q)
            .ok()
            .filter(|q| (1..=MAX_QUANTITY).contains(q))
            .ok_or_else(|| {
                invalid(
                    "quantity",
                    format!("quantity must be an integer from 1 to {MAX_QUANTITY}"),
                )
            })?,
    };
    Ok((body.amount, description, quantity))
}

/// Adds a pending item to the tenant's subscription `id` (not ended).
/// With the request's idempotency `fence`, a retry finds the first.
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    body: CreateItem,
    fence: Option<&Fence>,
) -> Result<InvoiceItem, ItemError> {
    let (unit_amount, description, quantity) = checked(&body)?;
    let sub = subscription::get(deps, tenant, id).await?;
    if sub.status.is_ended() {
        return Err(ItemError::Ended(sub.id));
    }
    mark_has_items(deps, &sub).await?;
    let item = InvoiceItem {
        id: InvoiceItemId::new(),
        subscription_id: sub.id.clone(),
        project_id: sub.project_id.clone(),
        mode: sub.mode,
        description,
        unit_amount,
        quantity,
        currency: sub.terms.currency,
        status: ItemStatus::Pending,
        invoice_id: None,
        invoiced_at: None,
        created_at: deps.clock.now(),
    };
    // The count, below the cap, moves with the item (after the put and
    // the fence, which `put_once_with` places first).
    let below = Cond::Or(vec![
        PendingCount::PENDING.missing(),
        PendingCount::PENDING.lt(&CAP),
    ]);
    let at = if fence.is_some() { 2 } else { 1 };
    for attempt in 0..TRIES {
        let count = PendingCount::op(&sub.id, 1, Some(below.clone()));
        let written = Fence::put_once_with(
            fence,
            &*deps.store,
            item.put_new()?,
            item.id.as_str(),
            vec![count],
        )
        .await;
        match written {
            Ok(None) => return Ok(item),
            Ok(Some(first)) => return get(deps, &sub.id, &InvoiceItemId::stored(first)).await,
            Err(e) if failed_at(&e, at) => return Err(ItemError::TooMany(sub.id)),
            Err(e) if is_conflict(&e) => crate::store::contention_backoff(attempt).await,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Unavailable("the pending items changed too often".into()).into())
}

/// Marks `sub` as one that has items (`has_items`: the sweep looks for
/// pending items before each of its invoices, `invoice.upcoming`), once:
/// a write conditioned on the version read, read again on a race. Before
/// the item is written, so an item never waits on a subscription that
/// does not look for it.
async fn mark_has_items(deps: &Deps, sub: &Subscription) -> Result<(), ItemError> {
    let mut current = sub.clone();
    for attempt in 0..8 {
        if current.has_items || current.status.is_ended() {
            return Ok(());
        }
        let mut changed = current.clone();
        changed.has_items = true;
        changed.version = current.version + 1;
        changed.updated_at = deps.clock.now();
        match deps
            .store
            .transact(subscription::write_ops(&changed, Some(&current))?)
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if e.is_condition_failure() || subscription::is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
                current = subscription::get(deps, &sub.tenant(), &sub.id).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Unavailable("the subscription changed too often".into()).into())
}

async fn get(
    deps: &Deps,
    sub: &SubscriptionId,
    id: &InvoiceItemId,
) -> Result<InvoiceItem, ItemError> {
    record::get::<InvoiceItem>(&*deps.store, &InvoiceItem::key(sub, id))
        .await?
        .ok_or_else(|| {
            BillingError::NotFound {
                what: "invoice item",
                named: id.to_string(),
            }
            .into()
        })
}

/// The subscription's pending items, oldest first (at most
/// [`MAX_PENDING`]: the oldest).
pub async fn pending(deps: &Deps, sub: &SubscriptionId) -> Result<Vec<InvoiceItem>, StoreError> {
    let query = Query::partition(InvoiceItem::partition(sub))
        .sk(SkCond::BeginsWith(ITEM_PREFIX.to_owned()))
        .filter(InvoiceItem::STATUS.eq(&ItemStatus::Pending));
    crate::store::query_window(&*deps.store, &query, 0, MAX_PENDING)
        .await?
        .into_iter()
        .map(from_item)
        .collect()
}

/// The pending items of the tenant's subscription `id` (the SDK's
/// `list_invoice_items`: a bare array).
pub async fn list_pending(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<Vec<InvoiceItem>, ItemError> {
    let sub = subscription::get(deps, tenant, id).await?;
    Ok(pending(deps, &sub.id).await?)
}

/// Every item of the subscription, newest first (the dashboard's), at
/// most `limit`.
pub async fn all(
    deps: &Deps,
    sub: &SubscriptionId,
    limit: usize,
) -> Result<Vec<InvoiceItem>, StoreError> {
    let query = Query::partition(InvoiceItem::partition(sub))
        .sk(SkCond::BeginsWith(ITEM_PREFIX.to_owned()))
        .backward();
    crate::store::query_window(&*deps.store, &query, 0, limit)
        .await?
        .into_iter()
        .map(from_item)
        .collect()
}

/// Deletes a pending item: conditioned on its being pending, so an
/// invoice taking it at the same moment either takes it (the delete is
/// refused, 409) or finds it gone; the count moves with it.
pub async fn delete(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    item: &InvoiceItemId,
) -> Result<(), ItemError> {
    let sub = subscription::get(deps, tenant, id).await?;
    let key = InvoiceItem::key(&sub.id, item);
    let cond = Cond::And(vec![
        Cond::Exists,
        InvoiceItem::STATUS.eq(&ItemStatus::Pending),
    ]);
    for attempt in 0..TRIES {
        let ops = vec![
            TxOp::Delete {
                key: key.clone(),
                cond: Some(cond.clone()),
            },
            PendingCount::op(&sub.id, -1, None),
        ];
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(()),
            Err(e) if failed_at(&e, 0) => {
                let found = get(deps, &sub.id, item).await?;
                return Err(ItemError::Invoiced {
                    item: found.id,
                    invoice: found.invoice_id.map(|i| i.to_string()).unwrap_or_default(),
                });
            }
            Err(e) if is_conflict(&e) => crate::store::contention_backoff(attempt).await,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Unavailable("the pending items changed too often".into()).into())
}

/// The writes that mark `items` taken by `invoice`, each conditioned on
/// the item still being pending (an item deleted or taken meanwhile
/// fails the issuing transaction, which gathers again), and the count
/// less as many.
pub fn consume_ops(items: &[InvoiceItem], invoice: &BillingInvoiceId, now: Timestamp) -> Vec<TxOp> {
    let count = items.first().map(|i| {
        let n = i64::try_from(items.len()).unwrap_or(i64::MAX);
        PendingCount::op(&i.subscription_id, -n, None)
    });
    items
        .iter()
        .map(|i| TxOp::Update {
            key: i.item_key(),
            update: Changes::<InvoiceItem>::new()
                .set(InvoiceItem::STATUS, &ItemStatus::Invoiced)
                .set_some(InvoiceItem::INVOICE_ID, invoice)
                .set_some(InvoiceItem::INVOICED_AT, &now)
                .into(),
            cond: Some(InvoiceItem::STATUS.eq(&ItemStatus::Pending)),
        })
        .chain(count)
        .collect()
}

/// The pending items' lines for the invoice of `period`, and the hook
/// that marks them taken by it, each conditioned on its still being
/// pending (the invoice hook, `adjust::gather`).
pub async fn item_lines(
    deps: &Deps,
    sub: &SubscriptionId,
    period: Period,
    now: Timestamp,
) -> Result<(Vec<InvoiceLine>, Option<Hook>), StoreError> {
    let items = pending(deps, sub).await?;
    if items.is_empty() {
        return Ok((Vec::new(), None));
    }
    let lines = items.iter().map(|i| i.line(period)).collect();
    let hook: Hook = Box::new(move |invoice| Ok(consume_ops(&items, &invoice.id, now)));
    Ok((lines, Some(hook)))
}

#[cfg(test)]
mod tests;
