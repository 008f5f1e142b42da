//! Finalizing: the gapless per-project number, taken in the transaction that
//! finalizes the draft.

use serde::{Deserialize, Serialize};

use super::drafts::{InvoiceError, check_version, get_in, require_state};
use super::records::{DocumentStatus, Invoice};
use super::{FINALIZE_BUDGET, FINALIZE_TRIES};
use crate::domain::account::Seller;
use crate::domain::record::{self, Changes, Record};
use crate::domain::{Mode, Tenant, account};
use crate::ids::InvoiceId;
use crate::store::fence::Fence;
use crate::store::{Cond, Key, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;
use crate::{Deps, keys};

fn counter_key(tenant: &Tenant) -> Key {
    keys::invoice_sequence(&tenant.project, tenant.mode)
}

/// The number counter of a project and mode (stored kind "invoice number
/// sequence"): the last number given. Changed only by a finalize's `SET`
/// conditioned on the value it read; never written whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceSequence {
    /// Its key, as read (written from [`Record::item_key`]).
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    pub value: u64,
}

crate::attrs! { InvoiceSequence {
    VALUE: u64 = value,
} }

impl Record for InvoiceSequence {
    fn item_key(&self) -> Key {
        Key::new(self.pk.clone(), self.sk.clone())
    }
}

/// The last number the project and mode gave (0: none yet), as read now:
/// pass it to [`take_number`] in the transaction that uses the number.
pub async fn last_number(store: &dyn Store, tenant: &Tenant) -> Result<u64, StoreError> {
    Ok(record::get::<InvoiceSequence>(store, &counter_key(tenant))
        .await?
        .map_or(0, |s| s.value))
}

/// The number after `last` (read by [`last_number`]) and the write that
/// takes it, conditioned on the counter still being at `last`: put it in
/// the same transaction as the document that carries the number, so two
/// writers never take one number and a failed write takes none. Billing
/// invoices (issue 39) take their numbers from this series too.
pub fn take_number(tenant: &Tenant, last: u64) -> (String, TxOp) {
    let n = last + 1;
    let op = TxOp::Update {
        key: counter_key(tenant),
        update: Changes::<InvoiceSequence>::new()
            .set(InvoiceSequence::VALUE, &n)
            .into(),
        cond: Some(counter_at(last)),
    };
    (number_text(tenant.mode, n), op)
}

/// `PI-000042` live, `TEST-PI-000042` sandbox (6 digits, then as many as
/// needed).
pub(super) fn number_text(mode: Mode, n: u64) -> String {
    let prefix = if mode.is_live() { "PI-" } else { "TEST-PI-" };
    format!("{prefix}{n:06}")
}

/// Issues a draft at the version sent: allocates the next number of the
/// project and mode in the same transaction, copies the seller profile,
/// and freezes the document. A finalize that lost the counter to another
/// re-reads it and tries again; one that lost the invoice gets
/// `VersionConflict` and changes nothing.
pub async fn finalize(
    state: &Deps,
    tenant: &Tenant,
    id: &InvoiceId,
    version: i64,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    let store = &*state.store;
    let seller = account::get_project(state, &tenant.project)
        .await?
        .and_then(|p| p.seller);
    let started = std::time::Instant::now();
    for attempt in 0..FINALIZE_TRIES {
        if started.elapsed() > FINALIZE_BUDGET {
            break;
        }
        let current = get_in(store, tenant, id).await?;
        if current.document_status != DocumentStatus::Draft {
            if let Some(f) = fence {
                // A retry of a finalize whose answer was lost.
                if f.resource_id(store).await?.as_deref() == Some(id) {
                    return Ok(current);
                }
            }
        }
        require_state(&current, DocumentStatus::Draft, "finalize")?;
        check_version(&current, version)?;
        let last = last_number(store, tenant).await?;
        let (number, take) = take_number(tenant, last);
        let now = state.clock.now();
        let next = issued(&current, number, seller.clone(), now);
        // The invoice at 0, the number at 1, the fence at 2: the
        // narrowings' counter moves last.
        let mut ops = Invoice::write_over(
            &current,
            &next,
            vec![Invoice::DOCUMENT_STATUS.eq(&DocumentStatus::Draft)],
        )?;
        let counts = ops.split_off(1);
        ops.push(take);
        if let Some(f) = fence {
            ops.push(f.op(id));
        }
        ops.extend(counts);
        match store.transact(ops).await {
            Ok(()) => return Ok(next),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let failed = |i: usize| matches!(reasons.get(i), Some(TxReason::ConditionFailed));
                if failed(2) {
                    // This very request finalized it already (its answer
                    // was lost).
                    return first_run_finalized(store, tenant, id, fence).await;
                }
                if failed(0) {
                    let now_current = get_in(store, tenant, id).await?;
                    require_state(&now_current, DocumentStatus::Draft, "finalize")?;
                    if now_current.version != version {
                        return Err(InvoiceError::VersionConflict {
                            sent: version,
                            current: now_current.version,
                        });
                    }
                    // Only its list marks moved (the lists migration):
                    // read it again.
                }
                // The counter moved (or a write conflict): read it again,
                // after a pause that grows with the contention.
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(InvoiceError::Store(StoreError::Unavailable(
        "invoice numbering is busy; retry".into(),
    )))
}

/// The draft `current` as issued at `now` with `number`: the seller
/// profile copied, the document frozen.
fn issued(current: &Invoice, number: String, seller: Option<Seller>, now: Timestamp) -> Invoice {
    let mut next = current.clone();
    next.document_status = DocumentStatus::Issued;
    next.invoice_number = Some(number);
    next.issued_at = Some(now);
    next.seller = seller;
    next.version += 1;
    next.updated_at = now;
    next.collection_status = next.collection();
    next
}

/// The number counter still at `last` as read (0: never written).
fn counter_at(last: u64) -> Cond {
    if last == 0 {
        Cond::Or(vec![
            InvoiceSequence::VALUE.missing(),
            InvoiceSequence::VALUE.eq(&0),
        ])
    } else {
        InvoiceSequence::VALUE.eq(&last)
    }
}

/// The fence of this request tripped: the invoice it finalized already,
/// or, when the key was used for another resource, a conflict.
async fn first_run_finalized(
    store: &dyn Store,
    tenant: &Tenant,
    id: &InvoiceId,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    let first = match fence {
        Some(f) => f.resource_id(store).await?,
        None => None,
    };
    if first.as_deref() == Some(id.as_str()) {
        return get_in(store, tenant, id).await;
    }
    Err(InvoiceError::StateConflict(
        "this Idempotency-Key was used for another request".into(),
    ))
}

/// Deletes a draft. With the request's fence, a retry after a lost answer
/// answers the same.
pub async fn discard(
    state: &Deps,
    tenant: &Tenant,
    id: &InvoiceId,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    let current = match get_in(&*state.store, tenant, id).await {
        Ok(c) => c,
        Err(InvoiceError::NotFound(_)) => {
            if let Some(f) = fence {
                if f.resource_id(&*state.store).await?.as_deref() == Some(id.as_str()) {
                    // This very request discarded it (its answer was lost).
                    return Err(InvoiceError::AlreadyDiscarded);
                }
            }
            return Err(InvoiceError::NotFound(id.to_string()));
        }
        Err(e) => return Err(e),
    };
    require_state(&current, DocumentStatus::Draft, "discard")?;
    let mut ops = vec![TxOp::Delete {
        key: Invoice::key(id),
        cond: Some(Cond::And(vec![
            Invoice::DOCUMENT_STATUS.eq(&DocumentStatus::Draft),
            Invoice::VERSION.eq(&current.version),
            current.listed_as_read(),
        ])),
    }];
    if let Some(f) = fence {
        ops.push(f.op(id));
    }
    // Out of its list and narrowings: out of their counters.
    ops.extend(current.counts_gone());
    match super::drafts::transact(&*state.store, ops).await {
        Ok(()) => Ok(current),
        Err(e) if e.is_condition_failure() => Err(InvoiceError::StateConflict(
            "the draft changed while being discarded; read it again".into(),
        )),
        Err(e) => Err(e.into()),
    }
}
