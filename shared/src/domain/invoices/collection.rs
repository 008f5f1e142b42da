//! Collecting an invoice through a checkout, and allocating each payment to
//! its balance.

use serde::Serialize;
use serde_json::json;

use super::corrections::{close_checkout_op, current_checkout};
use super::drafts::{InvoiceCheckout, InvoiceError, get_in, require_state};
use super::records::{Allocation, DocumentStatus, Invoice, InvoiceView};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::checkout::{self, CheckoutSession, SessionStatus};
use crate::domain::outbox::{Event, EventType};
use crate::domain::record::{Changes, Record};
use crate::fields::{PersonName, Phone};
use crate::ids::{InvoiceId, PaymentId, SessionId};
use crate::store::fence::Fence;
use crate::store::{Cond, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// What `POST /v1/invoices/{id}/checkout` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = InvoiceCheckoutSession)]
pub struct InvoiceCheckoutView {
    pub checkout_session_id: String,
    pub checkout_url: String,
    pub reused: bool,
}

/// Opens (or reuses) a checkout for what is left to collect on an issued
/// invoice. The open session of the invoice is reused when it is for the
/// current balance and the provider asked for; otherwise it is expired in
/// the transaction that opens the new one (one open checkout per invoice),
/// unless an attempt is in progress on it (409). Opening a checkout is a
/// change of the invoice: its `version` goes up.
pub async fn checkout(
    state: &Deps,
    payer: &checkout::Creator,
    id: &InvoiceId,
    body: InvoiceCheckout,
    base: &str,
    fence: Option<&Fence>,
) -> Result<(CheckoutSession, bool), InvoiceError> {
    let store = &*state.store;
    let tenant = Tenant::new(payer.project_id.clone(), payer.mode);
    let mode = payer.mode;
    check_provider_offered(store, &tenant, body.provider).await?;
    for attempt in 0..8 {
        let inv = get_in(store, &tenant, id).await?;
        require_state(&inv, DocumentStatus::Issued, "a checkout")?;
        let remaining = inv.amount_remaining();
        if remaining <= 0 {
            return Err(InvoiceError::StateConflict(
                "nothing is left to collect on this invoice".into(),
            ));
        }
        let now = state.clock.now();
        let previous = current_checkout(store, &inv).await?;
        if let Some(c) = &previous {
            if let Some(open) = reusable_checkout(&c.session, remaining, body.provider, now)? {
                return Ok((open, true));
            }
        }
        let amount = checkout::check_amount(remaining, body.provider, mode)
            .map_err(InvoiceError::Checkout)?;
        // A new checkout is volume the calling key creates: charged to its
        // spend counter like POST /v1/checkout (a reused one is not).
        let spend = checkout::spend_op(payer, amount.get(), now).map_err(InvoiceError::Checkout)?;
        let session = invoice_session(payer, &inv, amount, body.provider, base, now);
        let mut ops = vec![
            session.put_new()?,
            TxOp::Update {
                key: Invoice::key(&inv.id),
                update: Changes::<Invoice>::new()
                    .set_some(Invoice::CHECKOUT_SESSION_ID, session.id.as_str())
                    .set(Invoice::VERSION, &(inv.version + 1))
                    .set(Invoice::UPDATED_AT, &now)
                    .into(),
                cond: Some(Cond::And(vec![
                    Invoice::VERSION.eq(&inv.version),
                    Invoice::DOCUMENT_STATUS.eq(&DocumentStatus::Issued),
                ])),
            },
        ];
        if let Some(f) = fence {
            ops.push(f.op(&session.id));
        }
        let mut tally = checkout::stats::Tally::new();
        let mut counts = session.insert_counts();
        if let Some(c) = &previous {
            let (close, moved) = close_checkout_op(&c.session, now, &mut tally);
            ops.push(close);
            // The same counter items when both are of one day and shard.
            crate::domain::listing::merge_counts(&mut counts, moved);
        }
        let spend_at = spend.map(|op| {
            ops.push(op);
            ops.len() - 1
        });
        // The day's counters, in the same transaction (last: the fence's
        // index above is read on failure).
        tally.session_created(&session);
        tally.apply_to(&mut ops)?;
        ops.extend(counts);
        crate::domain::active::touch(store, &tenant, now).await?;
        match store.transact(ops).await {
            Ok(()) => return Ok((session, false)),
            Err(StoreError::TransactionCanceled { reasons })
                if fence.is_some() && matches!(reasons.get(2), Some(TxReason::ConditionFailed)) =>
            {
                // This very request opened a checkout already (its answer
                // was lost): answer that one.
                return Ok((first_run_session(store, fence, id).await?, false));
            }
            Err(e) if spend_at.is_some_and(|i| checkout::failed_at(&e, i)) => {
                return Err(InvoiceError::Checkout(
                    checkout::CheckoutError::SpendCapExceeded {
                        cap: payer.spend_cap_paisa.unwrap_or_default(),
                    },
                ));
            }
            Err(e)
                if e.is_condition_failure()
                    || matches!(e, StoreError::TransactionCanceled { .. }) =>
            {
                // The invoice or its checkout moved (another checkout, a
                // payment, an adjustment): read both again.
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(InvoiceError::Store(StoreError::Unavailable(
        "the invoice kept changing; retry".into(),
    )))
}

/// Refuses a provider the project does not offer (none asked: any).
async fn check_provider_offered(
    store: &dyn Store,
    tenant: &Tenant,
    provider: Option<crate::domain::Provider>,
) -> Result<(), InvoiceError> {
    let Some(p) = provider else {
        return Ok(());
    };
    let enabled = checkout::providers_in(store, tenant).await?;
    if !enabled.iter().any(|x| x.provider == p && x.enabled) {
        return Err(InvoiceError::Checkout(
            checkout::CheckoutError::ProviderUnavailable(p),
        ));
    }
    Ok(())
}

/// The invoice's current checkout `s`, when it can be answered again: open,
/// for the `remaining` balance and the provider asked for. One with an
/// attempt in progress is refused (409); any other is replaced (`None`).
fn reusable_checkout(
    s: &CheckoutSession,
    remaining: i64,
    provider: Option<crate::domain::Provider>,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, InvoiceError> {
    let status = s.status_at(now);
    let open = matches!(status, SessionStatus::Pending | SessionStatus::Initiated);
    let same_provider = provider.is_none() || provider == s.current_provider();
    if open && s.amount.get() == remaining && same_provider {
        return Ok(Some(s.clone()));
    }
    if status == SessionStatus::Initiated {
        return Err(InvoiceError::StateConflict(format!(
            "checkout {} has a payment in progress; wait for it to finish",
            s.id
        )));
    }
    Ok(None)
}

/// The hosted checkout of `amount` for the invoice: named after it, its
/// buyer as the customer (as far as the checkout's rules take them), and
/// returning to its own page.
fn invoice_session(
    payer: &checkout::Creator,
    inv: &Invoice,
    amount: crate::money::Paisa,
    provider: Option<crate::domain::Provider>,
    base: &str,
    now: Timestamp,
) -> CheckoutSession {
    let number = inv.invoice_number.clone().unwrap_or_default();
    let mut metadata = serde_json::Map::new();
    metadata.insert("invoice_id".into(), json!(inv.id));
    metadata.insert("invoice_number".into(), json!(number));
    let buyer = inv.buyer.clone().unwrap_or_default();
    let valid = checkout::ValidCheckout {
        amount,
        return_url: String::new(),
        cancel_url: None,
        provider,
        flow: checkout::Flow::Hosted,
        description: Some(format!("Invoice {number}")),
        metadata,
        // Only what the checkout's own rules take: a longer name is cut, a
        // phone in another shape left out.
        customer_name: buyer
            .name
            .map(|n| n.chars().take(PersonName::MAX).collect()),
        customer_email: buyer.email,
        customer_phone: buyer.phone.filter(|p| Phone::parse(p.clone()).is_ok()),
        customer_address: None,
        collect_address: false,
        client_secret_sha256: None,
    };
    let mut session = checkout::new_session(payer, valid, now);
    session.return_url = format!("{base}/c/{}", session.id);
    session.invoice_id = Some(inv.id.clone());
    session
}

/// The checkout this very request opened already for invoice `id` (its
/// fence tripped: its answer was lost).
async fn first_run_session(
    store: &dyn Store,
    fence: Option<&Fence>,
    id: &InvoiceId,
) -> Result<CheckoutSession, InvoiceError> {
    let sid = match fence {
        Some(f) => f.resource_id(store).await?.unwrap_or_default(),
        None => String::new(),
    };
    crate::domain::record::get::<CheckoutSession>(
        store,
        &CheckoutSession::key(&SessionId::stored(sid)),
    )
    .await?
    .filter(|s| s.invoice_id.as_ref() == Some(id))
    .ok_or_else(|| InvoiceError::NotFound(id.to_string()))
}

// ------------------------------------------------------------ collection

/// The writes that allocate a succeeded `payment_id` of `amount` to the
/// invoice as read: to `amount_paid` up to the collectible balance, the
/// rest to `amount_excess` with `needs_attention`; `invoice.paid` when the
/// invoice becomes paid. Nothing when the payment is already allocated.
/// The invoice write is conditioned on the version read (the settlement
/// re-reads and retries on conflict).
pub fn allocation_ops(
    inv: &Invoice,
    payment_id: &PaymentId,
    amount: i64,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    if inv.allocations.iter().any(|a| &a.payment_id == payment_id) {
        return Ok(Vec::new());
    }
    let collectible = if inv.document_status == DocumentStatus::Issued {
        inv.amount_remaining()
    } else {
        0
    };
    let paid = amount.min(collectible).max(0);
    let excess = amount - paid;
    let mut next = inv.clone();
    next.amount_paid += paid;
    next.amount_excess += excess;
    next.needs_attention |= excess > 0;
    next.allocations.push(Allocation {
        payment_id: payment_id.clone(),
        amount,
        excess,
        at: now,
    });
    next.version += 1;
    next.updated_at = now;
    next.collection_status = next.collection();
    if excess > 0 {
        tracing::warn!(
            invoice = %inv.id,
            payment = %payment_id,
            excess,
            "payment beyond the invoice's balance: recorded as excess, needs attention"
        );
    }
    // The invoice first, its narrowings' counter moves last.
    let mut ops = Invoice::write_over(inv, &next, Vec::new())?;
    let counts = ops.split_off(1);
    // Paid: the payment took the balance to zero (also after adjustments).
    if inv.document_status == DocumentStatus::Issued && collectible > 0 && paid == collectible {
        let mut view = serde_json::to_value(InvoiceView::at(&next, now))
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        if let Some(o) = view.as_object_mut() {
            // The payment that settled it (the delivery log's `paymentId`).
            o.insert("payment_id".into(), json!(payment_id));
        }
        ops.extend(
            Event::new(
                EventType::InvoicePaid,
                &Tenant::new(inv.project_id.clone(), inv.mode),
                view,
                now,
            )
            .put_ops()?,
        );
    }
    ops.extend(counts);
    Ok(ops)
}

// -------------------------------------------------------------------- pdf
