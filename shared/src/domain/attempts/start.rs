//! Starting an attempt: the customer picks a provider; one transaction writes
//! the pending payment and moves the session on, then the provider is asked
//! for the hand-off.

use super::settle::{Decision, apply, plan};
use super::{AttemptError, MAX_ATTEMPTS, PayChoice, Started, as_started, is_open};
use crate::app::Deps;
use crate::domain::checkout::stats::Tally;
use crate::domain::checkout::{self, CheckoutSession, SessionStatus, StoredAddress};
use crate::domain::fonepay_cap::{self, CapError};
use crate::domain::payments::{AttemptInfo, Payment, PaymentStatus};
use crate::domain::record::{Changes, Record};
use crate::domain::{Provider, Tenant, account};
use crate::ids::{PaymentId, ProjectId, SessionId};
use crate::money::Currency;
use crate::providers::{self, Attempt, Channel, CustomerInfo, Handoff, ProviderError};
use crate::store::{Cond, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// The URLs on our own server the provider sends the customer back to.
pub(super) fn return_url(
    base: &str,
    session_id: &SessionId,
    payment_id: &PaymentId,
    outcome: &str,
) -> String {
    format!("{base}/c/{session_id}/return/{payment_id}/{outcome}")
}

/// The merchant's site (scheme and host of `url`), for Khalti's
/// `website_url`.
pub(super) fn origin(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    format!("{scheme}://{host}")
}

/// The address the customer typed, trimmed, each part held to
/// [`AddressPart`](crate::fields::AddressPart)'s rule; `line1` and `city`
/// are required.
fn check_address(a: &StoredAddress) -> Result<StoredAddress, AttemptError> {
    let part = |field: &'static str, v: &Option<String>, required: bool| match v
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        None if required => Err(AttemptError::Invalid {
            field,
            message: "is required".into(),
        }),
        None => Ok(None),
        Some(v) => crate::fields::AddressPart::parse(v.to_owned())
            .map(|p| Some(p.into_string()))
            .map_err(|message| AttemptError::Invalid { field, message }),
    };
    Ok(StoredAddress {
        line1: part("line1", &a.line1, true)?,
        line2: part("line2", &a.line2, false)?,
        city: part("city", &a.city, true)?,
        state: part("state", &a.state, false)?,
        postal_code: part("postalCode", &a.postal_code, false)?,
        country: part("country", &a.country, false)?,
    })
}

/// The customer chose a provider: create the attempt and ask the provider
/// for the hand-off.
/// `public_base`: our public base URL (the providers return there).
pub async fn start(
    state: &Deps,
    session_id: &SessionId,
    choice: PayChoice,
    public_base: &str,
    now: Timestamp,
) -> Result<Started, AttemptError> {
    let session = checkout::find_any_at(&*state.store, session_id, now)
        .await?
        .ok_or(AttemptError::NotFound)?;
    start_for(state, session, choice, public_base, now).await
}

/// [`start`] for a session the caller has just read or written (one read
/// less); the transaction's conditions still check it is as read.
pub async fn start_for(
    state: &Deps,
    session: CheckoutSession,
    choice: PayChoice,
    public_base: &str,
    now: Timestamp,
) -> Result<Started, AttemptError> {
    let store = &*state.store;
    check_open(&session, &choice)?;
    let provider = chosen_provider(&session, &choice)?;
    check_offered(store, &session, provider).await?;
    let address = customer_address(&session, choice.address.as_ref())?;
    let creds = crate::domain::credentials::for_provider(
        store,
        &state.providers,
        &Tenant::new(session.project_id.clone(), session.mode),
        provider,
    )
    .await?;
    let client = state.providers.client(session.mode, provider)?;
    check_storefront(state, &session.project_id).await?;
    let claim = link_use_to_claim(store, &session, now).await?;

    let rules = super::provider_rules::of(provider, session.mode);
    let reference = providers::new_reference();
    let cap_month = if rules.month_cap {
        Some(hold_month_cap(store, &session, &reference, now).await?)
    } else {
        None
    };
    let qr = rules.pays_by_qr && !choice.fonepay_web;
    let payment = pending_payment(&session, provider, &reference, cap_month, qr, now);
    record_start(
        store,
        &session,
        &payment,
        address.as_ref(),
        claim.as_ref(),
        now,
    )
    .await?;

    let attempt = provider_attempt(&session, &payment, &reference, public_base);
    match client.initiate(&creds, &attempt).await {
        Ok(handoff) => handed_off(state, session, payment, handoff, address, now).await,
        Err(err) => not_started(state, &payment, err, now).await,
    }
}

/// Refuses a start on a session that takes no more attempts: closed, out
/// of attempts, or (from our page) one without a shop page.
fn check_open(session: &CheckoutSession, choice: &PayChoice) -> Result<(), AttemptError> {
    if choice.from_page && !session.flow.has_shop() {
        return Err(AttemptError::NotFound);
    }
    if session.status.is_final() {
        return Err(AttemptError::Closed(session.status));
    }
    if session.attempts >= MAX_ATTEMPTS {
        return Err(AttemptError::NotOffered(format!(
            "this checkout has had {MAX_ATTEMPTS} payment attempts; please return to the shop and start again"
        )));
    }
    Ok(())
}

/// The provider the customer pays with: the one chosen, else the one the
/// merchant set.
fn chosen_provider(
    session: &CheckoutSession,
    choice: &PayChoice,
) -> Result<Provider, AttemptError> {
    let provider = choice
        .provider
        .or(session.provider)
        .ok_or(AttemptError::Invalid {
            field: "provider",
            message: "choose how to pay".into(),
        })?;
    // Only a hosted page lets the customer pick another provider than the
    // one the merchant set.
    if session.flow != checkout::Flow::Hosted && session.provider.is_some_and(|set| set != provider)
    {
        return Err(AttemptError::NotOffered(format!(
            "this checkout pays with {} only",
            session
                .provider
                .map(Provider::as_str)
                .unwrap_or("one provider")
        )));
    }
    Ok(provider)
}

/// Refuses a provider the shop does not offer, or one that does not take
/// the session's amount.
async fn check_offered(
    store: &dyn Store,
    session: &CheckoutSession,
    provider: Provider,
) -> Result<(), AttemptError> {
    let offered = checkout::providers_in(
        store,
        &Tenant::new(session.project_id.clone(), session.mode),
    )
    .await?;
    if !offered.iter().any(|p| p.provider == provider && p.enabled) {
        return Err(AttemptError::NotOffered(format!(
            "{} is not available for this shop",
            provider.as_str()
        )));
    }
    checkout::check_amount(session.amount.get(), Some(provider), session.mode).map_err(
        |e| match e {
            checkout::CheckoutError::FonepaySandboxCap(m) => AttemptError::FonepayCap(m),
            other => AttemptError::NotOffered(other.to_string()),
        },
    )?;
    Ok(())
}

/// The address the attempt goes with, when the session collects one: the
/// one sent, else the one kept; once an attempt has started, the kept one
/// only.
fn customer_address(
    session: &CheckoutSession,
    sent: Option<&StoredAddress>,
) -> Result<Option<StoredAddress>, AttemptError> {
    let kept = || match &session.customer_address {
        Some(k) => check_address(k).map(Some),
        None => Ok(None),
    };
    match (sent, session.collect_address) {
        // Once an attempt has started, the customer's details are frozen:
        // the provider, the merchant's webhook and the payment were told
        // them (the form may send them again unchanged).
        (Some(a), true) if session.payment_id.is_some() => {
            let sent = check_address(a)?;
            let kept = kept()?;
            if kept.as_ref() != Some(&sent) {
                return Err(AttemptError::Invalid {
                    field: "address",
                    message: "cannot be changed once a payment has been started for this \
                              checkout; pay with the address given, or return to the shop \
                              to start a new checkout"
                        .into(),
                });
            }
            Ok(kept)
        }
        (Some(a), true) => Ok(Some(check_address(a)?)),
        (None, true) => match kept()? {
            Some(a) => Ok(Some(a)),
            None => Err(AttemptError::Invalid {
                field: "line1",
                message: "is required".into(),
            }),
        },
        (_, false) => Ok(None),
    }
}

/// Refuses a start while the merchant's shop cannot take payments.
async fn check_storefront(state: &Deps, project_id: &ProjectId) -> Result<(), AttemptError> {
    if !account::storefront(state, project_id).await?.1 {
        return Err(AttemptError::NotOffered(
            "this shop cannot take payments right now".into(),
        ));
    }
    Ok(())
}

/// The link whose use the start takes: a link's session takes one of the
/// link's uses as its customer is sent to a provider (again after an
/// attempt gave it back), in the start's transaction.
async fn link_use_to_claim(
    store: &dyn Store,
    session: &CheckoutSession,
    now: Timestamp,
) -> Result<Option<crate::domain::links::PaymentLink>, AttemptError> {
    let (Some(link_id), false) = (&session.link_id, session.link_claimed) else {
        return Ok(None);
    };
    let link = crate::domain::links::get_in(store, link_id)
        .await?
        .ok_or_else(|| AttemptError::NotOffered(LINK_GONE.into()))?;
    refuse_link(&link, now)?;
    Ok(Some(link))
}

/// Holds the session's amount against the month's cap (sandbox Fonepay:
/// real money); answers the month held in.
async fn hold_month_cap(
    store: &dyn Store,
    session: &CheckoutSession,
    reference: &str,
    now: Timestamp,
) -> Result<String, AttemptError> {
    let held = fonepay_cap::reserve(
        store,
        &session.project_id,
        reference,
        session.amount.get(),
        now,
    )
    .await;
    match held {
        Ok(m) => Ok(m),
        Err(CapError::MonthExceeded { .. }) => Err(AttemptError::FonepayCap(
            "Sandbox fonepay uses real money and is capped at NPR 5,000 a month \
             (succeeded payments plus QRs minted in the last 30 minutes); \
             this payment would pass it"
                .into(),
        )),
        Err(CapError::Store(e)) => Err(e.into()),
    }
}

/// The attempt's payment as the start creates it: `pending`, the
/// session's amount and customer.
fn pending_payment(
    session: &CheckoutSession,
    provider: Provider,
    reference: &str,
    cap_month: Option<String>,
    qr: bool,
    now: Timestamp,
) -> Payment {
    Payment {
        id: PaymentId::new(),
        project_id: session.project_id.clone(),
        checkout_session_id: session.id.clone(),
        mode: session.mode,
        amount: session.amount,
        amount_refunded: Default::default(),
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider,
        status: PaymentStatus::Pending,
        provider_ref: None,
        failure_reason: None,
        metadata: session.metadata.clone(),
        customer_name: session.customer_name.clone(),
        customer_email: session.customer_email.clone(),
        customer_phone: session.customer_phone.clone(),
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo {
            reference: Some(reference.to_owned()),
            provider_token: None,
            qr_message: None,
            cap_month,
            qr,
            websocket_url: None,
        },
        checks: Default::default(),
    }
}

/// The start's one transaction: the payment created, the session moved to
/// `initiated` as read, the attempt it supersedes cancelled, the link's
/// use taken and the day's counters. A refusal gives the cap hold back.
async fn record_start(
    store: &dyn Store,
    session: &CheckoutSession,
    payment: &Payment,
    address: Option<&StoredAddress>,
    claim: Option<&crate::domain::links::PaymentLink>,
    now: Timestamp,
) -> Result<(), AttemptError> {
    let change = session.status_change(
        SessionStatus::Initiated,
        started_session_update(payment, address, claim.is_some(), now),
    );
    let mut ops = vec![
        as_started(payment).put_new()?,
        TxOp::Update {
            key: CheckoutSession::key(&session.id),
            update: change.changes.into(),
            cond: Some(Cond::And(vec![
                startable_as_read(session, now),
                change.cond,
            ])),
        },
    ];
    // One open payment per session: the attempt this one supersedes is
    // cancelled in the same write (none of our providers has an API to
    // void a started attempt; its customer may still finish it, so it is
    // re-checked for a day like any cancel, and its Fonepay cap hold stays
    // until it lapses).
    if let Some(prev) = session.payment_id.clone() {
        let sid = session.id.clone();
        if let Some(prev) = payment_of(store, &sid, &prev).await? {
            ops.extend(supersede_ops(&prev, now)?);
        }
    }
    // Its filtered lists' counters (`domain::listing`), merged with the
    // superseded attempt's move (the same counter items when both are of
    // one day).
    crate::domain::listing::merge_counts(&mut ops, crate::domain::listing::count_new(payment));
    // The session's move between its status narrowings.
    crate::domain::listing::merge_counts(&mut ops, change.also);
    let claim_at = claim.map(|link| {
        ops.push(crate::domain::links::claim_op(link, session.expires_at));
        (link, ops.len() - 1)
    });
    start_tally(session, payment).apply_to(&mut ops)?;
    crate::domain::active::touch(
        store,
        &Tenant::new(session.project_id.clone(), session.mode),
        now,
    )
    .await?;
    match transact_start(store, ops).await {
        Ok(()) => Ok(()),
        Err(e) => {
            release_cap_hold(store, payment).await;
            Err(start_refused(store, claim_at, e, now).await)
        }
    }
}

/// The session's move to `initiated` with `payment` (its link's use taken
/// when `claims_link`, the address kept when one goes with the attempt),
/// but for the status ([`CheckoutSession::status_change`] sets it).
fn started_session_update(
    payment: &Payment,
    address: Option<&StoredAddress>,
    claims_link: bool,
    now: Timestamp,
) -> Changes<CheckoutSession> {
    let mut update = Changes::new()
        .add(CheckoutSession::ATTEMPTS, 1)
        .set_some(CheckoutSession::PAYMENT_ID, payment.id.as_str())
        .set_some(CheckoutSession::ATTEMPT_PROVIDER, &payment.provider)
        .set(CheckoutSession::UPDATED_AT, &now);
    if claims_link {
        update = update.set(CheckoutSession::LINK_CLAIMED, &true);
    }
    if let Some(a) = address {
        update = update.set_some(CheckoutSession::CUSTOMER_ADDRESS, a);
    }
    update
}

/// The session is as read: its status (the counters move from it), still
/// open, with attempts left and the same current payment.
fn startable_as_read(session: &CheckoutSession, now: Timestamp) -> Cond {
    let current = match &session.payment_id {
        Some(p) => CheckoutSession::PAYMENT_ID.is(p),
        // Stored as null or missing: "not a string" covers both on both
        // backends (a comparison across types is false).
        None => Cond::Not(Box::new(CheckoutSession::PAYMENT_ID.some().ge(""))),
    };
    Cond::And(vec![
        Cond::Exists,
        // As read: the counters move from this status.
        CheckoutSession::STATUS.eq(&session.status),
        CheckoutSession::EXPIRES_AT.gt(&now),
        Cond::Or(vec![
            CheckoutSession::ATTEMPTS.missing(),
            CheckoutSession::ATTEMPTS.lt(&MAX_ATTEMPTS),
        ]),
        current,
    ])
}

/// Why the start's transaction `e` did not land: the link's last use
/// taken meanwhile (`claim`: the link and its operation's place), else a
/// session that moved (busy), else the store's error.
async fn start_refused(
    store: &dyn Store,
    claim: Option<(&crate::domain::links::PaymentLink, usize)>,
    e: StoreError,
    now: Timestamp,
) -> AttemptError {
    if let Some((link, at)) = claim {
        if checkout::failed_at(&e, at) {
            return link_taken(store, link, now).await;
        }
    }
    if e.is_condition_failure() {
        AttemptError::Busy
    } else {
        e.into()
    }
}

/// A link use taken meanwhile: why, as the link now stands.
async fn link_taken(
    store: &dyn Store,
    link: &crate::domain::links::PaymentLink,
    now: Timestamp,
) -> AttemptError {
    let now_link = match crate::domain::links::get_in(store, &link.id).await {
        Ok(Some(l)) => l,
        Ok(None) => return AttemptError::NotOffered(LINK_GONE.into()),
        Err(e) => return e.into(),
    };
    match refuse_link(&now_link, now) {
        Err(e) => e,
        Ok(()) => AttemptError::NotOffered(crate::domain::links::held_text(1)),
    }
}

/// What the provider is asked to start: our reference and amount, where
/// to send the customer back, and who pays.
fn provider_attempt(
    session: &CheckoutSession,
    payment: &Payment,
    reference: &str,
    base: &str,
) -> Attempt {
    Attempt {
        reference: reference.to_owned(),
        amount: session.amount,
        return_url: return_url(base, &session.id, &payment.id, "ok"),
        failure_url: Some(return_url(base, &session.id, &payment.id, "fail")),
        website_url: origin(&session.return_url),
        order_name: session
            .description
            .clone()
            .unwrap_or_else(|| format!("Order {}", session.id)),
        customer: Some(CustomerInfo {
            name: session.customer_name.clone(),
            email: session.customer_email.clone(),
            phone: session.customer_phone.clone(),
        }),
        channel: if payment.attempt.qr {
            Channel::Qr
        } else {
            Channel::Browser
        },
    }
}

/// The provider took the attempt: what its hand-off names is kept on the
/// payment, and the session is answered as the start's transaction left
/// it (no second read).
async fn handed_off(
    state: &Deps,
    mut session: CheckoutSession,
    payment: Payment,
    handoff: Handoff,
    address: Option<StoredAddress>,
    now: Timestamp,
) -> Result<Started, AttemptError> {
    let payment = record_handoff(state, payment, &handoff).await?;
    session.status = SessionStatus::Initiated;
    session.payment_id = Some(payment.id.clone());
    session.attempt_provider = Some(payment.provider);
    session.attempts += 1;
    session.updated_at = now;
    if address.is_some() {
        session.customer_address = address;
    }
    Ok(Started {
        session,
        payment,
        handoff,
    })
}

/// Keeps on the payment what `handoff` names (the provider's token, the
/// QR and its socket), when it names any.
async fn record_handoff(
    state: &Deps,
    mut payment: Payment,
    handoff: &Handoff,
) -> Result<Payment, AttemptError> {
    let mut info = payment.attempt.clone();
    match handoff {
        Handoff::Redirect { provider_ref, .. } => {
            info.provider_token = provider_ref.clone();
        }
        Handoff::Qr {
            qr_message,
            provider_ref,
            websocket_url,
        } => {
            info.provider_token = provider_ref.clone();
            info.qr_message = Some(qr_message.clone());
            info.websocket_url = websocket_url.clone();
        }
        Handoff::AutoPostForm { .. } => {}
    }
    if info != payment.attempt {
        state
            .store
            .update(
                &Payment::key(&payment.id),
                Changes::new().set(Payment::ATTEMPT, &info).into(),
                Some(Cond::Exists),
            )
            .await?;
        payment.attempt = info;
    }
    Ok(payment)
}

/// The provider refused to start the attempt: its cap hold given back,
/// the payment `failed` and the customer back at the picker.
async fn not_started(
    state: &Deps,
    payment: &Payment,
    err: ProviderError,
    now: Timestamp,
) -> Result<Started, AttemptError> {
    tracing::warn!(
        payment = %payment.id,
        provider = payment.provider.as_str(),
        error = %err,
        "provider refused to start the attempt"
    );
    release_cap_hold(&*state.store, payment).await;
    let reason = format!(
        "{} could not start the payment: {err}",
        payment.provider.as_str()
    );
    apply(state, payment, Decision::NotStarted(reason), now).await?;
    Err(AttemptError::Provider(err))
}

/// Gives back the month-cap hold `payment`'s start took, if it took one.
async fn release_cap_hold(store: &dyn Store, payment: &Payment) {
    if let (Some(month), Some(reference)) = (&payment.attempt.cap_month, &payment.attempt.reference)
    {
        release_hold(store, &payment.project_id, reference, month).await;
    }
}

const LINK_GONE: &str = "this payment link no longer exists";

/// Refuses an attempt for `link` when it is used up or every use is held.
fn refuse_link(
    link: &crate::domain::links::PaymentLink,
    now: Timestamp,
) -> Result<(), AttemptError> {
    if link.max_uses.is_some_and(|m| link.used_count >= m) {
        return Err(AttemptError::NotOffered(
            crate::domain::links::inactive_text(link),
        ));
    }
    match link.held(now) {
        Some(minutes) => Err(AttemptError::NotOffered(crate::domain::links::held_text(
            minutes,
        ))),
        None => Ok(()),
    }
}

/// Why an attempt was closed by the next one of its session.
const SUPERSEDED: &str = "superseded by a newer attempt of the same checkout";

/// The writes cancelling `prev`, an open attempt a new one of its session
/// supersedes (none when it is no longer open or held for review): out of
/// the open payments into its project's re-check partition, with its
/// `payment.cancelled` event. Conditioned on it still being open and not
/// held, so a payment settled meanwhile makes the start fail and retry.
fn supersede_ops(prev: &Payment, now: Timestamp) -> Result<Vec<TxOp>, StoreError> {
    if !is_open(prev.status) || prev.checks.review.is_some() {
        return Ok(Vec::new());
    }
    // A cancel as a provider's answer would plan it, without its session
    // (the new attempt's write moves the session).
    let cancel = Decision::Cancelled(SUPERSEDED.to_owned());
    Ok(plan(prev, None, None, &cancel, now)?.unwrap_or_default())
}

/// The day counters of a started attempt: the payment is created, and the
/// session counts as initiated on its first attempt only (`session` as
/// read; the transaction's `payment_id` condition pins that read).
pub(super) fn start_tally(session: &CheckoutSession, payment: &Payment) -> Tally {
    let mut tally = Tally::new();
    tally.payment_created(payment);
    if session.payment_id.is_none() {
        tally.session_initiated(session);
    }
    tally.session_moved(session, session.status, SessionStatus::Initiated);
    tally
}

/// The start transaction, tried again when only a conflict (another
/// transaction writing the same item: the day's counters are shared by
/// the project's sessions) cancelled it.
async fn transact_start(store: &dyn Store, ops: Vec<TxOp>) -> Result<(), StoreError> {
    let mut tries = 0u64;
    loop {
        tries += 1;
        match store.transact(ops.clone()).await {
            Err(StoreError::TransactionCanceled { reasons })
                if tries < 5
                    && reasons.contains(&TxReason::Conflict)
                    && !reasons.contains(&TxReason::ConditionFailed) =>
            {
                let pause = 5 + 10 * tries + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            other => return other,
        }
    }
}

async fn release_hold(store: &dyn Store, project_id: &ProjectId, reference: &str, month: &str) {
    if let Err(e) = fonepay_cap::release(store, project_id, reference, month).await {
        // The hold lapses by itself after 30 minutes.
        tracing::warn!(error = %e, "could not release a sandbox fonepay hold");
    }
}

/// The payment `payment_id` of session `session_id`.
pub async fn find_payment(
    deps: &Deps,
    session_id: &SessionId,
    payment_id: &PaymentId,
) -> Result<Option<Payment>, StoreError> {
    payment_of(&*deps.store, session_id, payment_id).await
}

/// [`find_payment`] in `store`.
pub(super) async fn payment_of(
    store: &dyn Store,
    session_id: &SessionId,
    payment_id: &PaymentId,
) -> Result<Option<Payment>, StoreError> {
    Ok(crate::domain::payments::get(store, payment_id)
        .await?
        .filter(|p| p.checkout_session_id == *session_id))
}
