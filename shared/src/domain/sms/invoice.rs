//! Billing reminders by SMS (issue 39, part 6): a reminder bound to a
//! billing invoice rather than to a checkout session. Guard 1 (a pending
//! session for the number) and the dispatcher's "the session is no longer
//! payable" rule are the checkout reminders'; these take the same places
//! (guards 3 and 4: the recipient's rolling day, the merchant's hour and,
//! live, the plan's monthly quota) and are stored, logged in sandbox or
//! queued live, and sent at most once as any reminder. The caller (the
//! billing engine) gives the occurrence's once-only `claim`, written in the
//! same transaction: a second call for the same occurrence (a retried
//! sweep) stores, counts and sends nothing.

use super::guards::{Places, Taken, take_places};
use super::notify::enqueue;
use super::reminders::{KEPT_DAYS, SmsReminder, SmsStatus};
use super::{Limits, SmsError};
use crate::Deps;
use crate::domain::record::Record;
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, MerchantId, SmsId};
use crate::store::TxOp;

/// One billing reminder to store and send.
#[derive(Clone, Debug)]
pub struct InvoiceSms {
    /// The reminder's id, chosen by the caller so that its claim can name
    /// it (a retried run then finds the message it sent).
    pub id: SmsId,
    pub tenant: Tenant,
    pub merchant_id: MerchantId,
    /// The plan's monthly quota (live mode counts against it).
    pub monthly_quota: u32,
    /// The recipient, normalized (`normalize_phone`).
    pub to: String,
    pub text: String,
    /// The invoice it is about (`None`: a trial's notice, about its
    /// subscription).
    pub invoice_id: Option<BillingInvoiceId>,
    /// The occurrence's once-only marker (a conditional put).
    pub claim: TxOp,
    pub limits: Limits,
}

/// What happened to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvoiceSmsOutcome {
    /// Live: stored and queued for the dispatcher.
    Queued(SmsId),
    /// Sandbox: stored as `logged`, never delivered.
    Logged(SmsId),
    /// The occurrence was handled before: nothing taken.
    AlreadyDone,
    /// The plan's month is used up: nothing taken (the occurrence stays
    /// open; its caller records the outcome).
    QuotaExhausted,
}

/// Stores (and, live, queues) `sms`, taking its places, exactly once per
/// occurrence. A full recipient day or merchant hour is
/// [`SmsError::RateLimited`] with when to try again: nothing was taken.
pub async fn notify_invoice(deps: &Deps, sms: InvoiceSms) -> Result<InvoiceSmsOutcome, SmsError> {
    let now = deps.clock.now();
    let live = sms.tenant.mode == Mode::Live;
    let mut reminder = SmsReminder {
        id: sms.id.clone(),
        project_id: sms.tenant.project.clone(),
        merchant_id: sms.merchant_id.clone(),
        mode: sms.tenant.mode,
        to: sms.to.clone(),
        text: sms.text,
        session_id: None,
        invoice_id: sms.invoice_id,
        status: if live {
            SmsStatus::Queued
        } else {
            SmsStatus::Logged
        },
        attempts: 0,
        lease_until_ms: None,
        last_error: None,
        created_at: now,
        updated_at: now,
        claim: None,
        ttl: Some(now.unix_seconds() + KEPT_DAYS * 86_400),
        gsi2pk: None,
        gsi2sk: None,
        counted: true,
    };
    if live {
        reminder.list_open(now);
    }
    let places = Places {
        merchant_id: &sms.merchant_id,
        mode: sms.tenant.mode,
        phone: &sms.to,
        now,
        quota: live.then_some(sms.monthly_quota),
        limits: sms.limits,
    };
    let taken = take_places(
        &*deps.store,
        places,
        std::iter::once(reminder.put_new()?).chain(reminder.count_new()),
        Some(sms.claim),
    )
    .await?;
    match taken {
        Taken::AlreadyStored => Ok(InvoiceSmsOutcome::AlreadyDone),
        Taken::QuotaExhausted => Ok(InvoiceSmsOutcome::QuotaExhausted),
        Taken::All if live => {
            enqueue(deps, &reminder.id).await;
            Ok(InvoiceSmsOutcome::Queued(reminder.id))
        }
        Taken::All => {
            tracing::info!(sms_id = %reminder.id, project_id = %reminder.project_id, "sandbox billing SMS logged, not delivered");
            Ok(InvoiceSmsOutcome::Logged(reminder.id))
        }
    }
}
