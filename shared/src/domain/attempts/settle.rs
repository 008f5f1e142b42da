//! Deciding and applying a provider's answer: `success` only on a paid status
//! whose amount matches, each change with its event in one transaction.

use super::returns::ReturnKind;
use super::review::{hold_update, holdable};
use super::start::payment_of;
use super::sweep::claim_check;
use super::{
    ABANDONED_AFTER, AttemptError, POLL_CHECK_EVERY, RECHECK_CANCELLED, due_sk, is_open,
    next_check_at, recheck_partition, status_in,
};
use crate::app::Deps;
use crate::domain::Tenant;
use crate::domain::billing::invoice::{self as billing_invoice, collect as billing_collect};
use crate::domain::checkout::stats::Tally;
use crate::domain::checkout::{self, CheckoutSession, SessionStatus};
use crate::domain::fonepay_cap;
use crate::domain::links::PaymentLink;
use crate::domain::outbox::{Event, EventType};
use crate::domain::payments::{Payment, PaymentStatus, PaymentView};
use crate::domain::record::{Changes, Gsi2Entry, from_item};
use crate::ids::SessionId;
use crate::money::Paisa;
use crate::providers::{ProviderState, ProviderStatus, StatusQuery};
use crate::store::{Cond, Index, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// What the provider's answer means for a payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Success {
        provider_ref: Option<String>,
        /// The fee the provider's answer states (Khalti's lookup `fee`).
        fee: Option<Paisa>,
        /// The fee computed from the merchant's configured rate for the
        /// provider, filled in by [`apply`] as it settles.
        configured_fee: Option<Paisa>,
    },
    Failed(String),
    Cancelled(String),
    /// The provider refused to start the attempt: the payment is `failed`
    /// but the customer goes back to the picker (nothing was attempted).
    NotStarted(String),
    /// Still open at the provider: `processing`.
    Processing,
    /// Nothing to change (logged with the reason).
    Hold(String),
    /// Money may have moved in a way the payment does not explain (paid
    /// another amount, paid with no amount stated, refunded before it was
    /// settled): held as `processing` for a person, never settled by the
    /// reconciler again.
    Review(String),
}

/// The rule (decisions, "Payments"): `success` only on a paid status whose
/// amount, when the provider states one, is the payment's.
///
/// **What proves the money.** Every path that can set `success` (the
/// browser return and eSewa's signed `data` on it, the QR page's poll,
/// the status poll, the reconciler) ends here, through
/// [`check_and_apply`]: never on what a browser brought, always on the
/// provider's own server-to-server answer to a query we make:
///
/// | provider | status | amount | currency | our reference |
/// |---|---|---|---|---|
/// | eSewa | `status` of the status API (`COMPLETE`) | its `total_amount`, compared here | NPR (eSewa has no other) | we query with our `transaction_uuid`, `total_amount` and product code; the client refuses an answer naming another `transaction_uuid` |
/// | Khalti | lookup `status` (`Completed`) | its `total_amount`, compared here | NPR (Khalti has no other) | we look up the `pidx` Khalti gave our initiate (kept on the payment); the client refuses another `pidx` |
/// | Fonepay | QR/web status `paymentStatus` (`success`) | none in the answer: the proof is our own signed request (the QR we minted, the web request whose DV we signed) for that PRN, which fixes the amount | NPR (the QR and request state it) | we query with our PRN and merchant code under our DV |
///
/// A mismatch (another amount, no amount from eSewa or Khalti, a refund
/// of an unsettled payment, a sandbox QR paid after its cap hold) is a
/// [`Decision::Review`]: `processing`, out of every automatic path, logged
/// at error level with the reason, until a person releases it
/// ([`release`]).
/// `session_over`: the session expired (an attempt the provider has
/// forgotten then counts as cancelled).
pub(super) fn decide(payment: &Payment, status: &ProviderStatus, session_over: bool) -> Decision {
    match status.state {
        ProviderState::Paid => match status.amount {
            Some(a) if a != payment.amount => Decision::Review(format!(
                "provider says paid {} paisa, the payment is {}: needs review",
                a.get(),
                payment.amount.get()
            )),
            // eSewa and Khalti state the amount; without it there is no
            // proof. Fonepay's status has none: the amount is the one we
            // minted into the QR or signed into the web request.
            None if super::provider_rules::of(payment.provider, payment.mode)
                .states_paid_amount =>
            {
                Decision::Review("provider says paid but states no amount: needs review".into())
            }
            _ => Decision::Success {
                provider_ref: status.provider_ref.clone(),
                fee: status.fee,
                configured_fee: None,
            },
        },
        ProviderState::Pending | ProviderState::Ambiguous => Decision::Processing,
        ProviderState::Failed => {
            Decision::Failed(format!("declined by the provider ({})", status.raw_status))
        }
        ProviderState::Cancelled => Decision::Cancelled("cancelled by the customer".into()),
        ProviderState::Expired => {
            Decision::Cancelled("the provider's payment window closed".into())
        }
        ProviderState::NotFound if session_over => {
            Decision::Cancelled("the customer did not pay before the session expired".into())
        }
        ProviderState::NotFound => Decision::Hold("the provider does not know it yet".into()),
        ProviderState::Refunded { .. } => Decision::Review(format!(
            "provider reports {} for an unsettled payment: needs review",
            status.raw_status
        )),
    }
}

/// [`decide`] in context: `returned` is the provider return that
/// triggered the check (none for the reconciler and the QR page's poll).
///
/// - After a failure return, an attempt the provider has no record of
///   (eSewa answers `NOT_FOUND` for a payment left or declined in its
///   wallet; it has no "failed" status) is over: cancelled, and the
///   customer goes back to the picker.
/// - The provider's "pending" means `processing` only when the customer
///   came back from the provider; otherwise the customer simply has not paid
///   yet (an unscanned QR, a wallet page left open) and nothing changes,
///   until [`ABANDONED_AFTER`] past an expired session, when the attempt
///   is cancelled.
pub(super) fn decide_for(
    payment: &Payment,
    status: &ProviderStatus,
    returned: Option<ReturnKind>,
    session_over: bool,
    now: Timestamp,
) -> Decision {
    if let Some(why) = &payment.checks.review {
        return Decision::Hold(format!("waiting for review: {why}"));
    }
    match (returned, status.state) {
        (Some(ReturnKind::Fail), ProviderState::NotFound) => Decision::Cancelled(format!(
            "the customer came back from {} without paying",
            payment.provider.as_str()
        )),
        // The customer came back (eSewa sends a pending payment to its
        // failure return): the provider is working on it.
        (Some(_), ProviderState::Pending) => Decision::Processing,
        (_, ProviderState::Pending) if payment.status == PaymentStatus::Pending => {
            if session_over && now >= payment.created_at.plus(ABANDONED_AFTER) {
                Decision::Cancelled("not paid by the customer".into())
            } else {
                Decision::Hold("not paid yet".into())
            }
        }
        _ => match decide(payment, status, session_over) {
            Decision::Success { .. } if late_sandbox_qr(payment, now) => Decision::Review(format!(
                "sandbox Fonepay payment reported paid after its {}-minute cap hold lapsed \
                 (minted {}): it may pass the NPR 5,000 month cap; not counted until a person \
                 confirms it",
                fonepay_cap::HOLD_WINDOW.num_minutes(),
                payment.created_at.to_rfc3339()
            )),
            d => d,
        },
    }
}

/// A sandbox Fonepay attempt (real money under the month cap) learned to
/// be paid after its cap hold lapsed: the month's room it held may have
/// been given to others meanwhile, so its success is not counted by
/// itself (the simulator, like the hold, refuses a QR that old).
fn late_sandbox_qr(payment: &Payment, now: Timestamp) -> bool {
    super::provider_rules::of(payment.provider, payment.mode).month_cap
        && payment.attempt.cap_month.is_some()
        && now >= payment.created_at.plus(fonepay_cap::HOLD_WINDOW)
}

/// Asks the provider about `payment` and applies the answer (the
/// reconciler's and the pollers' path). Proof: the provider's answer to
/// our own query, judged by [`decide`] (amount compared where stated).
pub(super) async fn reconcile(
    state: &Deps,
    payment: &Payment,
    now: Timestamp,
) -> Result<Payment, AttemptError> {
    check_and_apply(state, payment, None, now).await
}

/// Asks the provider about `payment` now and applies its answer, as the
/// reconciler does (reconciliation's "settle from provider": a payment
/// already cancelled by expiry included, which a paid answer makes a late
/// success). Answers the payment as stored afterwards.
pub async fn verify_now(
    state: &Deps,
    payment: &Payment,
    now: Timestamp,
) -> Result<Payment, AttemptError> {
    check_and_apply(state, payment, None, now).await
}

pub(super) async fn check_and_apply(
    state: &Deps,
    payment: &Payment,
    returned: Option<ReturnKind>,
    now: Timestamp,
) -> Result<Payment, AttemptError> {
    let store = &*state.store;
    let creds = crate::domain::credentials::for_payment(state, payment).await?;
    let client = state.providers.client(payment.mode, payment.provider)?;
    let query = StatusQuery {
        reference: payment.attempt.reference.clone().unwrap_or_default(),
        amount: payment.amount,
        provider_ref: payment.attempt.provider_token.clone(),
    };
    let status = client.status(&creds, &query).await?;
    let session = checkout::find_any_at(store, &payment.checkout_session_id.clone(), now).await?;
    // Over: expired, or settled by another attempt, or gone.
    let over = session.as_ref().is_none_or(|s| s.status.is_final());
    let decision = decide_for(payment, &status, returned, over, now);
    match &decision {
        Decision::Hold(why) => {
            tracing::info!(payment = %payment.id, provider_status = %status.raw_status, reason = %why, "payment left as it is");
        }
        Decision::Review(why) => {
            tracing::error!(payment = %payment.id, provider = payment.provider.as_str(), provider_status = %status.raw_status, reason = %why, "payment needs review: held as processing");
        }
        _ => {}
    }
    Ok(apply(state, payment, decision, now).await?)
}

/// Applies `decision` to `payment` (and its session), with its event, in
/// one transaction; answers the payment as stored afterwards. A payment
/// another caller settled first is answered as that caller left it.
pub async fn apply(
    state: &Deps,
    payment: &Payment,
    decision: Decision,
    now: Timestamp,
) -> Result<Payment, StoreError> {
    let store = &*state.store;
    let key = Payment::key(&payment.id);
    // A success snapshots the fee of the merchant's configured rate, as
    // the rate is now (`domain::fees`).
    let decision = match decision {
        Decision::Success {
            provider_ref, fee, ..
        } => {
            let rate = crate::domain::fees::get(store, &payment.tenant(), payment.provider).await?;
            Decision::Success {
                provider_ref,
                fee,
                configured_fee: rate.map(|r| r.fee_for(payment.amount)),
            }
        }
        d => d,
    };
    for attempt in 0..SETTLE_TRIES {
        let Some(item) = store.get(&key).await? else {
            return Err(StoreError::Backend(format!(
                "payment {} vanished",
                payment.id
            )));
        };
        let current: Payment = from_item(item)?;
        let session = match store
            .get(&CheckoutSession::key(&current.checkout_session_id))
            .await?
        {
            Some(i) => Some(from_item::<CheckoutSession>(i)?),
            None => None,
        };
        let link = match session.as_ref().and_then(|s| s.link_id.clone()) {
            Some(id) => crate::domain::links::get_in(store, &id).await?,
            None => None,
        };
        let link = link.map(|l| (l, state.config.public_base_url.as_str()));
        let invoice = match session.as_ref().and_then(|s| s.invoice_id.clone()) {
            Some(id) => crate::domain::invoices::get_any(store, &id).await?,
            None => None,
        };
        let Some(mut ops) = plan(&current, session.as_ref(), link.as_ref(), &decision, now)? else {
            return Ok(current);
        };
        // A success for an invoice's checkout is allocated to the invoice
        // in the same transaction (re-read and retried on conflict).
        if let (Decision::Success { .. }, Some(inv)) = (&decision, &invoice) {
            ops.extend(crate::domain::invoices::allocation_ops(
                inv,
                &current.id.clone(),
                current.amount.get(),
                now,
            )?);
        }
        // So is a billing invoice's (its pay page, its QR): paid once, or
        // an overpayment to refund after.
        let mut overpaid = None;
        if let (Decision::Success { .. }, Some(s)) = (&decision, &session) {
            if let Some(settled) =
                billing_collect::settlement(store, s, &current, &state.config.base_for(None), now)
                    .await?
            {
                if let billing_invoice::PayOutcome::Overpayment(inv) = &settled.outcome {
                    overpaid = Some(inv.id.clone());
                }
                ops.extend(settled.ops);
            }
        }
        match store.transact(ops).await {
            Ok(()) => {
                if let Some(invoice) = overpaid {
                    // A failure (or a crash before this line) is taken
                    // up by the refund sweep (`billing_invoice::refund_due`).
                    if let Err(e) =
                        billing_collect::refund_overpayment(state, &invoice, &current.id, now).await
                    {
                        tracing::warn!(invoice = %invoice, payment = %current.id, error = %e, "overpayment refund not asked; the refund sweep tries again");
                    }
                }
                return match store.get(&key).await? {
                    Some(i) => from_item(i),
                    None => Err(StoreError::Backend(format!(
                        "payment {} vanished",
                        payment.id
                    ))),
                };
            }
            Err(StoreError::TransactionCanceled { reasons })
                if reasons
                    .iter()
                    .any(|r| matches!(r, TxReason::ConditionFailed | TxReason::Conflict)) =>
            {
                crate::store::contention_backoff(attempt).await;
                continue;
            }
            Err(StoreError::ConditionFailed) => {
                crate::store::contention_backoff(attempt).await;
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable(format!(
        "payment {} kept changing while being settled",
        payment.id
    )))
}

/// How often a settlement re-reads what moved under it (its session, link
/// or invoice), with a short random pause that grows each time
/// ([`crate::store::contention_backoff`]).
const SETTLE_TRIES: usize = 8;

fn event_op(kind: EventType, payment: &Payment, now: Timestamp) -> Result<Vec<TxOp>, StoreError> {
    let view = serde_json::to_value(PaymentView::from(payment.clone()))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    Event::new(
        kind,
        &Tenant::new(payment.project_id.clone(), payment.mode),
        view,
        now,
    )
    .put_ops()
}

/// `update` of `p` if its status is one of `from` (and `also` holds: its
/// status change's condition) and it is not held.
fn unheld_payment_update(
    p: &Payment,
    update: Changes<Payment>,
    from: &[PaymentStatus],
    also: Cond,
) -> TxOp {
    TxOp::Update {
        key: Payment::key(&p.id),
        update: update.into(),
        cond: Some(not_held(Cond::And(vec![status_in(from), also]))),
    }
}

/// `cond`, and no hold for review: a settlement never lands over a hold
/// that came after the copy it was planned from was read.
fn not_held(cond: Cond) -> Cond {
    Cond::And(vec![cond, Payment::REVIEW.missing()])
}

fn close_payment(update: Changes<Payment>) -> Changes<Payment> {
    update.unindex(Index::Gsi2)
}

/// `update` cancelling `p` at `now`: re-checked for [`RECHECK_CANCELLED`]
/// from its project's re-check partition.
pub(super) fn recheck(update: Changes<Payment>, p: &Payment, now: Timestamp) -> Changes<Payment> {
    update
        .set_some(Payment::RECHECK_UNTIL, &now.plus(RECHECK_CANCELLED))
        .index(&Gsi2Entry::new(
            recheck_partition(&Tenant::new(p.project_id.clone(), p.mode)),
            due_after_check(p, now),
        ))
}

/// `p`'s sort key in its partition once checked at `now`.
pub(super) fn due_after_check(p: &Payment, now: Timestamp) -> String {
    let mut checked = p.clone();
    checked.checks.checked_at = Some(now);
    due_sk(p, next_check_at(&checked))
}

/// The transaction that applies `decision` to `p` as stored now; `None`
/// when nothing changes.
pub(super) fn plan(
    p: &Payment,
    session: Option<&CheckoutSession>,
    link: Option<&(crate::domain::links::PaymentLink, &str)>,
    decision: &Decision,
    now: Timestamp,
) -> Result<Option<Vec<TxOp>>, StoreError> {
    if p.checks.review.is_some() {
        // `p` is the fresh copy; the decision may have been made from an
        // older one (a sweep's or a poll's) read before a signed return
        // held the payment: it waits for a person, whatever the provider
        // now says.
        tracing::warn!(payment = %p.id, "payment held for review: provider answer not applied");
        return Ok(None);
    }
    // The day counters of the transitions below, added to the ops last.
    let mut tally = Tally::new();
    let ops = match decision {
        Decision::Hold(_) => None,
        Decision::Review(reason) => plan_review(p, reason, now),
        Decision::Processing => plan_processing(p, now),
        Decision::Success {
            provider_ref,
            fee,
            configured_fee,
        } => plan_success(
            p,
            session,
            link,
            provider_ref.as_deref(),
            (*fee, *configured_fee),
            &mut tally,
            now,
        )?,
        Decision::Failed(reason) | Decision::Cancelled(reason) | Decision::NotStarted(reason) => {
            plan_closing(p, session, decision, reason, &mut tally, now)?
        }
    };
    let Some(mut ops) = ops else {
        return Ok(None);
    };
    tally.apply_to(&mut ops)?;
    Ok(Some(ops))
}

/// Held for a person: an open or cancelled payment becomes `processing`
/// with the reason.
fn plan_review(p: &Payment, reason: &str, now: Timestamp) -> Option<Vec<TxOp>> {
    if !(is_open(p.status) || p.status == PaymentStatus::Cancelled) {
        return None;
    }
    let hold = hold_update(p, reason, now);
    let mut ops = vec![TxOp::Update {
        key: Payment::key(&p.id),
        update: hold.changes.into(),
        cond: Some(not_held(Cond::And(vec![holdable(), hold.cond]))),
    }];
    ops.extend(hold.also);
    Some(ops)
}

/// Still open at the provider: a `pending` payment becomes `processing`.
fn plan_processing(p: &Payment, now: Timestamp) -> Option<Vec<TxOp>> {
    if p.status != PaymentStatus::Pending {
        return None;
    }
    let change = p.status_change(PaymentStatus::Processing);
    let mut ops = vec![TxOp::Update {
        key: Payment::key(&p.id),
        update: change.changes.set(Payment::UPDATED_AT, &now).into(),
        cond: Some(Cond::And(vec![
            Payment::STATUS.eq(&PaymentStatus::Pending),
            change.cond,
        ])),
    }];
    ops.extend(change.also);
    Some(ops)
}

/// Paid: the payment becomes a success once (from pending, processing or
/// cancelled), its session paid (or, already paid by another attempt, the
/// payment flagged as a double payment), its month-cap hold counted, with
/// its event.
fn plan_success(
    p: &Payment,
    session: Option<&CheckoutSession>,
    link: Option<&(crate::domain::links::PaymentLink, &str)>,
    provider_ref: Option<&str>,
    (fee, configured_fee): (Option<Paisa>, Option<Paisa>),
    tally: &mut Tally,
    now: Timestamp,
) -> Result<Option<Vec<TxOp>>, StoreError> {
    // A late success after a cancel (the session expired first) is still
    // money taken: record it.
    if !matches!(
        p.status,
        PaymentStatus::Pending | PaymentStatus::Processing | PaymentStatus::Cancelled
    ) {
        return Ok(None);
    }
    let mut next = p.clone();
    next.status = PaymentStatus::Success;
    next.failure_reason = None;
    next.provider_ref = provider_ref
        .map(str::to_owned)
        .or_else(|| p.provider_ref.clone());
    next.updated_at = now;
    let change = p.status_change(PaymentStatus::Success);
    let mut update = close_payment(
        change
            .changes
            .remove(Payment::RECHECK_UNTIL)
            .set(Payment::UPDATED_AT, &now)
            .set(Payment::FAILURE_REASON, &None),
    );
    if let Some(r) = &next.provider_ref {
        update = update.set_some(Payment::PROVIDER_REF, r);
    }
    // The fee: the provider's when its answer states one, and the
    // configured rate's snapshot (shown when the provider states none).
    if let Some(f) = fee {
        next.checks.fee_provider = Some(f);
        update = update.set_some(Payment::FEE_PROVIDER, &f);
    }
    if let Some(f) = configured_fee {
        next.checks.fee_configured = Some(f);
        update = update.set_some(Payment::FEE_CONFIGURED, &f);
    }
    let ours = |s: &CheckoutSession| s.payment_id.as_deref() == Some(p.id.as_str());
    let session_ops = match session {
        Some(s) if s.status == SessionStatus::Success && !ours(s) => {
            update = flag_double_payment(p, s, &mut next, update);
            vec![TxOp::Check {
                key: CheckoutSession::key(&s.id),
                cond: CheckoutSession::STATUS.eq(&SessionStatus::Success),
            }]
        }
        Some(s) if s.status != SessionStatus::Success => session_paid_ops(p, s, link, tally, now)?,
        _ => Vec::new(),
    };
    let mut ops = vec![unheld_payment_update(
        p,
        update,
        &[
            PaymentStatus::Pending,
            PaymentStatus::Processing,
            PaymentStatus::Cancelled,
        ],
        change.cond,
    )];
    ops.extend(change.also);
    ops.extend(session_ops);
    if super::provider_rules::of(p.provider, p.mode).month_cap {
        ops.extend(fonepay_cap::paid_ops(
            &p.project_id,
            p.attempt.reference.as_deref().unwrap_or_default(),
            p.attempt.cap_month.as_deref(),
            p.amount.get(),
            now,
        ));
    }
    // From pending, processing or cancelled (the condition above): a
    // payment becomes a success once.
    tally.payment_succeeded(p);
    ops.extend(event_op(EventType::PaymentSucceeded, &next, now)?);
    Ok(Some(ops))
}

/// A second attempt of a session another attempt paid succeeded: `next`
/// and its `update` name the first (`double_payment_of`), for a refund.
fn flag_double_payment(
    p: &Payment,
    s: &CheckoutSession,
    next: &mut Payment,
    update: Changes<Payment>,
) -> Changes<Payment> {
    next.double_payment_of = s.payment_id.clone();
    tracing::error!(
        payment = %p.id,
        first = ?s.payment_id,
        session = %s.id,
        "double payment: a second attempt of one session succeeded; flagged for refund"
    );
    update.set(Payment::DOUBLE_PAYMENT_OF, &next.double_payment_of)
}

/// The session `s` becomes paid by `p` (success is final: a session
/// becomes paid once), and its link's use a completed one.
fn session_paid_ops(
    p: &Payment,
    s: &CheckoutSession,
    link: Option<&(crate::domain::links::PaymentLink, &str)>,
    tally: &mut Tally,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    tally.session_paid(s);
    tally.session_moved(s, s.status, SessionStatus::Success);
    let change = s.status_change(
        SessionStatus::Success,
        Changes::new()
            .set_some(CheckoutSession::PAYMENT_ID, p.id.as_str())
            .set_some(CheckoutSession::ATTEMPT_PROVIDER, &p.provider)
            .set(CheckoutSession::UPDATED_AT, &now)
            .unindex(Index::Gsi2),
    );
    let mut ops = vec![TxOp::Update {
        key: CheckoutSession::key(&s.id),
        update: change.changes.into(),
        // As read: a session that moved meanwhile (expired, failed: its
        // link use given back) is re-read.
        cond: Some(change.cond),
    }];
    crate::domain::listing::merge_counts(&mut ops, change.also);
    if let Some((l, base)) = link {
        ops.extend(link_paid_ops(p, s, l, base, now)?);
    }
    Ok(ops)
}

/// The link's use becomes a completed one, once (only the session's move
/// to paid counts it), with its `payment_link.paid` event.
fn link_paid_ops(
    p: &Payment,
    s: &CheckoutSession,
    l: &crate::domain::links::PaymentLink,
    base: &str,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    let mut update = Changes::new()
        .add(PaymentLink::USED_COUNT, 1)
        .set(PaymentLink::UPDATED_AT, &now);
    if s.status.is_final() || !s.link_claimed {
        // Its hold was given back (expired first).
        update = update.add(PaymentLink::CLAIMED, 1);
    }
    let mut ops = vec![TxOp::Update {
        key: PaymentLink::key(&l.id),
        update: update.into(),
        cond: Some(Cond::Exists),
    }];
    let mut after = l.clone();
    after.used_count += 1;
    after.updated_at = now;
    let view = serde_json::to_value(crate::domain::links::PaymentLinkView::of(
        after, base, false,
    ))
    .map_err(|e| StoreError::Invalid(e.to_string()))?;
    ops.extend(
        Event::new(
            EventType::PaymentLinkPaid,
            &Tenant::new(p.project_id.clone(), p.mode),
            view,
            now,
        )
        .about_payment(&p.id)
        .put_ops()?,
    );
    Ok(ops)
}

/// Declined, cancelled or never started: an open payment becomes `failed`
/// (closed) or `cancelled` (re-checked for a day), its session moved on,
/// with its event.
fn plan_closing(
    p: &Payment,
    session: Option<&CheckoutSession>,
    decision: &Decision,
    reason: &str,
    tally: &mut Tally,
    now: Timestamp,
) -> Result<Option<Vec<TxOp>>, StoreError> {
    if !is_open(p.status) {
        return Ok(None);
    }
    let failed = matches!(decision, Decision::Failed(_) | Decision::NotStarted(_));
    // A decline ends the session; a cancel, or an attempt that never
    // reached the provider, sends the customer back to the picker while
    // the session has time left.
    let ends_session = matches!(decision, Decision::Failed(_));
    let mut next = p.clone();
    next.status = if failed {
        PaymentStatus::Failed
    } else {
        PaymentStatus::Cancelled
    };
    next.failure_reason = Some(reason.to_owned());
    next.updated_at = now;
    let change = p.status_change(next.status);
    let update = change
        .changes
        .set_some(Payment::FAILURE_REASON, reason)
        .set(Payment::UPDATED_AT, &now);
    let update = if failed {
        close_payment(update)
    } else {
        // A cancelled attempt may still be paid at the provider: the
        // reconciler keeps asking for a day, from the project's re-check
        // partition (out of the open payments).
        recheck(update, p, now)
    };
    let mut ops = vec![unheld_payment_update(
        p,
        update,
        &[PaymentStatus::Pending, PaymentStatus::Processing],
        change.cond,
    )];
    ops.extend(change.also);
    let ours = |s: &&CheckoutSession| {
        s.payment_id.as_deref() == Some(p.id.as_str()) && s.status == SessionStatus::Initiated
    };
    if let Some(s) = session.filter(ours) {
        ops.extend(session_after_attempt_ops(p, s, ends_session, tally, now));
    }
    let kind = if failed {
        // From pending or processing: failed is final, counted once. A
        // cancel counts in no outcome (it may still succeed).
        tally.payment_failed(p);
        EventType::PaymentFailed
    } else {
        EventType::PaymentCancelled
    };
    ops.extend(event_op(kind, &next, now)?);
    Ok(Some(ops))
}

/// The initiated session `s` after its attempt `p` closed: `failed` when
/// the attempt ends it, else back to the picker while it has time left;
/// the link's use it held given back.
fn session_after_attempt_ops(
    p: &Payment,
    s: &CheckoutSession,
    ends_session: bool,
    tally: &mut Tally,
    now: Timestamp,
) -> Vec<TxOp> {
    let back_to_picker = !ends_session && s.expires_at > now;
    let to = if ends_session {
        SessionStatus::Failed
    } else {
        SessionStatus::Pending
    };
    // The status's move (none when the session stays as it is).
    let change = (ends_session || back_to_picker).then(|| {
        let changes = Changes::new().set(CheckoutSession::UPDATED_AT, &now);
        let changes = if ends_session {
            changes.unindex(Index::Gsi2)
        } else {
            changes
        };
        s.status_change(to, changes)
    });
    let (mut session_update, moved_cond, counts) = match change {
        Some(c) => (c.changes, Some(c.cond), c.also),
        None => (Changes::new(), None, Vec::new()),
    };
    // The attempt held one of its link's uses: given back as it fails or
    // is cancelled (the next attempt takes one again).
    let release = s.link_claimed && !session_update.sets_nothing();
    if release {
        session_update = session_update.set(CheckoutSession::LINK_CLAIMED, &false);
    }
    if session_update.sets_nothing() {
        return Vec::new();
    }
    tally.session_moved(s, SessionStatus::Initiated, to);
    let mut conds = vec![
        CheckoutSession::PAYMENT_ID.is(p.id.as_str()),
        CheckoutSession::STATUS.eq(&SessionStatus::Initiated),
    ];
    conds.extend(moved_cond);
    let mut ops = vec![TxOp::Update {
        key: CheckoutSession::key(&s.id),
        update: session_update.into(),
        cond: Some(Cond::And(conds)),
    }];
    crate::domain::listing::merge_counts(&mut ops, counts);
    if release {
        if let Some(id) = &s.link_id {
            ops.push(crate::domain::checkout::release_link_use(id));
        }
    }
    ops
}

/// For an event stream: [`poll_of`]'s check, at most once per `every`, for a QR payment (a Direct-QR
/// stream asks every second, so a paid QR shows within about two:
/// decisions-refined, "Direct-QR"); any other payment is only read. A
/// redirect provider's payment is proven on the customer's return, which
/// a stream must not beat to the one check per few seconds, or by the
/// sweep.
pub async fn poll_qr_every(
    state: &Deps,
    session_id: &SessionId,
    now: Timestamp,
    every: chrono::Duration,
) -> Result<Option<(CheckoutSession, Option<Payment>)>, AttemptError> {
    poll_when(state, session_id, now, every, true).await
}

async fn poll_when(
    state: &Deps,
    session_id: &SessionId,
    now: Timestamp,
    every: chrono::Duration,
    qr_only: bool,
) -> Result<Option<(CheckoutSession, Option<Payment>)>, AttemptError> {
    let Some(session) = checkout::find_any_at(&*state.store, session_id, now).await? else {
        return Ok(None);
    };
    poll_session(state, session, now, every, qr_only)
        .await
        .map(Some)
}

/// For the pages' status poll, of a session the caller has read: asks
/// the provider about the session's current payment, at most once per
/// [`POLL_CHECK_EVERY`] per payment (a conditional write claims the
/// check). Proof: as [`reconcile`]; the poll carries nothing the payment
/// is judged on.
pub async fn poll_of(
    state: &Deps,
    session: CheckoutSession,
    now: Timestamp,
) -> Result<(CheckoutSession, Option<Payment>), AttemptError> {
    poll_session(state, session, now, POLL_CHECK_EVERY, false).await
}

/// [`poll_qr_every`] for a session the caller has read already (one read
/// less).
pub async fn poll_qr_of(
    state: &Deps,
    session: CheckoutSession,
    now: Timestamp,
    every: chrono::Duration,
) -> Result<(CheckoutSession, Option<Payment>), AttemptError> {
    poll_session(state, session, now, every, true).await
}

async fn poll_session(
    state: &Deps,
    session: CheckoutSession,
    now: Timestamp,
    every: chrono::Duration,
    qr_only: bool,
) -> Result<(CheckoutSession, Option<Payment>), AttemptError> {
    let store = &*state.store;
    let Some(pid) = session.payment_id.clone() else {
        return Ok((session, None));
    };
    let sid = session.id.clone();
    let Some(payment) = payment_of(store, &sid, &pid).await? else {
        return Ok((session, None));
    };
    if !is_open(payment.status)
        || session.status != SessionStatus::Initiated
        || payment.checks.review.is_some()
        || (qr_only && !payment.attempt.qr)
    {
        return Ok((session, Some(payment)));
    }
    if !claim_check(store, &payment, now, every).await? {
        return Ok((session, Some(payment)));
    }
    let payment = match reconcile(state, &payment, now).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(payment = %payment.id, error = %e, "status check failed; will retry");
            payment
        }
    };
    let session = checkout::find_any_at(store, &session.id, now)
        .await?
        .unwrap_or(session);
    Ok((session, Some(payment)))
}
