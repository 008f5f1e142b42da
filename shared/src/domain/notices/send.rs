//! One schedule record's run ([`run_one`]) and a merchant's retry-now
//! ([`retry_now`]): what is due, sent by SMS and email once per
//! occurrence, and recorded.

use chrono::NaiveDate;

use super::NoticeError;
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::account::{get_merchant, get_project};
use crate::domain::billing::calendar::{nepal_day, nepal_day_start};
use crate::domain::billing::customers::{self, Customer, Locale as CustomerLocale};
use crate::domain::billing::dunning::{
    self, Attempt, AttemptKind, AttemptOutcome, Channel, DunningPolicy, DunningState,
    DunningStatus, FinalAction,
};
use crate::domain::billing::dunning_api::{self, InvoiceDunningView};
use crate::domain::billing::invoice::{self, BillingInvoice, BillingInvoiceError, InvoiceStatus};
use crate::domain::billing::lifecycle::{
    self, CancelSubscription, LifecycleError, PauseSubscription,
};
use crate::domain::billing::notice_due::{
    DeferredSms, InvoiceDays, Notice, NoticeChannel, NoticeEntry, NoticeKind, NoticeOutcome,
    NoticeSchedule, NoticeSmsClaim, Through, due_time, next_notice,
};
use crate::domain::billing::reminders::{Locale, ReminderText, quiet_until, render};
use crate::domain::billing::subscription::{
    self, Subscription, SubscriptionError, SubscriptionStatus as S,
};
use crate::domain::billing::test_clock::{self, ClockTimeError};
use crate::domain::mail::{self, MailAbout, MailError, MailStatus};
use crate::domain::record::{self, Record};
use crate::domain::short_links::{self, ShortTarget};
use crate::domain::sms::{self, InvoiceSms, InvoiceSmsOutcome, Limits, SmsError};
use crate::ids::{BillingInvoiceId, MailId, SmsId, SubscriptionId};
use crate::kinds::Mode;
use crate::store::StoreError;
use crate::time::Timestamp;

/// Re-reads of a record or dunning state that another writer moved.
const TRIES: usize = 8;

/// What one [`run_one`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOne {
    /// The record moved (a notice handled, deferred, or the record closed).
    pub progressed: bool,
    /// Messages stored to go (SMS and emails).
    pub sent: usize,
    /// Notices recorded `skipped` (stale, or no way to reach).
    pub skipped: usize,
    /// The SMS waits (quiet hours, a rate limit).
    pub deferred: bool,
    /// A dunning policy's final action taken.
    pub final_action: bool,
}

/// Who is told, and by whom.
struct Audience {
    tenant: Tenant,
    customer: Option<Customer>,
    merchant_id: Option<crate::ids::MerchantId>,
    merchant_name: String,
    quota: u32,
}

async fn audience(
    deps: &Deps,
    tenant: &Tenant,
    customer: &crate::ids::CustomerId,
) -> Result<Audience, NoticeError> {
    let customer = match customers::get(deps, tenant, customer).await {
        Ok(c) => Some(c),
        Err(crate::domain::billing::customers::BillingError::Store(e)) => return Err(e.into()),
        Err(_) => None,
    };
    let project = get_project(deps, &tenant.project).await?;
    let (merchant_id, merchant_name, quota) = match &project {
        Some(p) => match get_merchant(&*deps.store, &p.merchant_id).await? {
            Some(m) => (
                Some(m.id.clone()),
                m.name.clone(),
                m.plan.sms_monthly_quota(),
            ),
            None => (Some(p.merchant_id.clone()), p.name.clone(), 0),
        },
        None => (None, "Shop".to_owned(), 0),
    };
    Ok(Audience {
        tenant: tenant.clone(),
        customer,
        merchant_id,
        merchant_name,
        quota,
    })
}

/// What one notice says.
struct Say<'a> {
    kind: NoticeKind,
    /// The occurrence (`<invoice>#<kind>#<day>`).
    occurrence: String,
    shown: NaiveDate,
    amount: i64,
    pay_url: &'a str,
    number: &'a str,
    about: MailAbout,
    subscription_id: &'a SubscriptionId,
    invoice_id: Option<&'a BillingInvoiceId>,
}

/// How sending went: each channel's entry, or the time the SMS waits for
/// (the email, if any, is stored already: its entry).
enum Sent {
    Done(Vec<(NoticeChannel, NoticeOutcome, Option<String>)>),
    Wait {
        until: Timestamp,
        mail: Option<SentEntry>,
    },
}

/// The occurrence key of a notice.
pub fn occurrence(target: &dyn std::fmt::Display, kind: NoticeKind, day: NaiveDate) -> String {
    format!("{target}#{}#{}", kind.as_str(), day.format("%Y-%m-%d"))
}

/// Sends `say` to the audience: email when the customer has one, SMS
/// when a phone (the SMS waits out the quiet hours and a rate limit).
async fn send(
    deps: &Deps,
    who: &Audience,
    say: &Say<'_>,
    now: Timestamp,
) -> Result<Sent, NoticeError> {
    let Some(customer) = &who.customer else {
        return Ok(Sent::Done(vec![(
            NoticeChannel::None,
            NoticeOutcome::Skipped,
            None,
        )]));
    };
    let text = text_of(who, customer, say);
    let mut out = Vec::new();
    // The mail queue down (or a store error) fails the run after the SMS
    // is tried: one channel's outage does not hold the other back, and
    // the next run finds both by their occurrence.
    let mut mail_failed = None;
    if let Some(email) = &customer.email {
        match send_mail(deps, who, say, &text, email).await {
            Ok(entry) => out.push(entry),
            Err(e) => mail_failed = Some(e),
        }
    }
    if let (Some(phone), Some(merchant_id)) = (&customer.phone, &who.merchant_id) {
        let sms = send_sms(deps, who, say, &text, phone, merchant_id, now).await;
        if let Some(e) = mail_failed {
            return Err(e);
        }
        match sms? {
            Ok(entry) => out.push(entry),
            Err(until) => {
                return Ok(Sent::Wait {
                    until,
                    mail: out.pop(),
                });
            }
        }
    }
    if let Some(e) = mail_failed {
        return Err(e);
    }
    if out.is_empty() {
        out.push((NoticeChannel::None, NoticeOutcome::Skipped, None));
    }
    Ok(Sent::Done(out))
}

type SentEntry = (NoticeChannel, NoticeOutcome, Option<String>);

/// The reminder `say` in the customer's language.
fn text_of<'a>(who: &'a Audience, customer: &Customer, say: &'a Say<'_>) -> ReminderText<'a> {
    let locale = match customer.locale {
        CustomerLocale::En => Locale::En,
        CustomerLocale::Ne => Locale::Ne,
    };
    ReminderText {
        kind: say.kind.reminder(),
        locale,
        merchant: &who.merchant_name,
        amount_paisa: say.amount,
        due: say.shown,
        pay_url: say.pay_url,
        invoice_number: say.number,
    }
}

/// Only the SMS of `say` (a deferred retry-now's): its entry, or the time
/// it waits for; a customer no longer reachable by SMS: `skipped`.
async fn send_sms_only(
    deps: &Deps,
    who: &Audience,
    say: &Say<'_>,
    now: Timestamp,
) -> Result<Result<SentEntry, Timestamp>, NoticeError> {
    let (Some(customer), Some(merchant_id)) = (&who.customer, &who.merchant_id) else {
        return Ok(Ok((NoticeChannel::Sms, NoticeOutcome::Skipped, None)));
    };
    let Some(phone) = &customer.phone else {
        return Ok(Ok((NoticeChannel::Sms, NoticeOutcome::Skipped, None)));
    };
    let text = text_of(who, customer, say);
    send_sms(deps, who, say, &text, phone, merchant_id, now).await
}

/// The email of `say`, once per occurrence.
async fn send_mail(
    deps: &Deps,
    who: &Audience,
    say: &Say<'_>,
    text: &ReminderText<'_>,
    email: &str,
) -> Result<SentEntry, NoticeError> {
    let sent = mail::send_billing_mail(
        deps,
        &who.tenant,
        email,
        text,
        say.about.clone(),
        &say.occurrence,
    )
    .await;
    Ok(match sent {
        Ok(id) => {
            let suppressed = mail::get(&*deps.store, &id)
                .await?
                .is_some_and(|m| m.status == MailStatus::Suppressed);
            let outcome = if suppressed {
                NoticeOutcome::Suppressed
            } else {
                NoticeOutcome::Queued
            };
            (NoticeChannel::Email, outcome, Some(id.to_string()))
        }
        Err(MailError::Invalid { field, message }) => {
            tracing::warn!(field, message, "billing notice email refused");
            (NoticeChannel::Email, NoticeOutcome::Failed, None)
        }
        Err(e) => return Err(e.into()),
    })
}

/// The SMS of `say`, once per occurrence; `Err(until)` when it waits
/// (quiet hours, a rate limit).
async fn send_sms(
    deps: &Deps,
    who: &Audience,
    say: &Say<'_>,
    text: &ReminderText<'_>,
    phone: &str,
    merchant_id: &crate::ids::MerchantId,
    now: Timestamp,
) -> Result<Result<SentEntry, Timestamp>, NoticeError> {
    if let Some(until) = quiet_until(now) {
        return Ok(Err(until));
    }
    let Some(body) = render(text) else {
        return Ok(Ok((NoticeChannel::Sms, NoticeOutcome::Failed, None)));
    };
    let sms_id = crate::ids::SmsId::new();
    let claim = NoticeSmsClaim {
        project_id: who.tenant.project.clone(),
        mode: who.tenant.mode,
        subscription_id: say.subscription_id.clone(),
        invoice_id: say.invoice_id.cloned(),
        occurrence: say.occurrence.clone(),
        sms_id: Some(sms_id.clone()),
        created_at: now,
    };
    let claim_key = claim.item_key();
    let sms = InvoiceSms {
        id: sms_id,
        tenant: who.tenant.clone(),
        merchant_id: merchant_id.clone(),
        monthly_quota: who.quota,
        to: phone.to_owned(),
        text: body,
        invoice_id: say.invoice_id.cloned(),
        claim: claim.put_new()?,
        limits: Limits::default(),
    };
    let logged = if who.tenant.mode == Mode::Live {
        NoticeOutcome::Queued
    } else {
        NoticeOutcome::Logged
    };
    Ok(Ok(match sms::notify_invoice(deps, sms).await {
        Ok(InvoiceSmsOutcome::Queued(id) | InvoiceSmsOutcome::Logged(id)) => {
            (NoticeChannel::Sms, logged, Some(id.to_string()))
        }
        // Sent by an earlier run (a crash before its record was written,
        // or two drivers of one clock): the id its claim keeps.
        Ok(InvoiceSmsOutcome::AlreadyDone) => {
            let first = record::get::<NoticeSmsClaim>(&*deps.store, &claim_key)
                .await?
                .and_then(|c| c.sms_id);
            (NoticeChannel::Sms, logged, first.map(|id| id.to_string()))
        }
        Ok(InvoiceSmsOutcome::QuotaExhausted) => {
            (NoticeChannel::Sms, NoticeOutcome::QuotaExhausted, None)
        }
        Err(SmsError::RateLimited {
            retry_after_secs, ..
        }) => {
            return Ok(Err(
                now.plus(chrono::Duration::seconds(retry_after_secs.max(1)))
            ));
        }
        Err(e) => return Err(e.into()),
    }))
}

fn entries(
    sent: &[(NoticeChannel, NoticeOutcome, Option<String>)],
    notice: &Notice,
    now: Timestamp,
) -> Vec<NoticeEntry> {
    sent.iter()
        .map(|(channel, outcome, id)| NoticeEntry {
            at: now,
            day: notice.0,
            kind: notice.1,
            channel: *channel,
            outcome: *outcome,
            sms_id: id
                .as_ref()
                .filter(|_| *channel == NoticeChannel::Sms)
                .map(SmsId::stored),
            mail_id: id
                .as_ref()
                .filter(|_| *channel == NoticeChannel::Email)
                .map(MailId::stored),
            interval: notice.2,
        })
        .collect()
}

fn skipped_entry(notice: &Notice, now: Timestamp) -> NoticeEntry {
    NoticeEntry {
        at: now,
        day: notice.0,
        kind: notice.1,
        channel: NoticeChannel::None,
        outcome: NoticeOutcome::Skipped,
        sms_id: None,
        mail_id: None,
        interval: notice.2,
    }
}

/// The short pay link of an invoice (`<base>/r/<token>`: it opens the
/// bill page, where the customer pays by link or QR).
async fn invoice_link(deps: &Deps, inv: &BillingInvoice) -> Result<String, NoticeError> {
    let tenant = Tenant::new(inv.project_id.clone(), inv.mode);
    let link = short_links::ensure(deps, &tenant, &ShortTarget::Invoice(inv.id.clone())).await?;
    Ok(link.url(&deps.config.base_for(None)))
}

/// The short link of a subscription in its trial (what it will bill).
async fn subscription_link(deps: &Deps, sub: &Subscription) -> Result<String, NoticeError> {
    let link = short_links::ensure(
        deps,
        &sub.tenant(),
        &ShortTarget::Subscription(sub.id.clone()),
    )
    .await?;
    Ok(link.url(&deps.config.base_for(None)))
}

/// Writes `next` over the record read at `seen`; `false` when another run
/// moved it first (that run's notice stands: nothing is sent twice).
async fn save(
    deps: &Deps,
    seen: &NoticeSchedule,
    mut next: NoticeSchedule,
) -> Result<bool, NoticeError> {
    next.version = seen.version + 1;
    // A deferred SMS keeps the record in the index until its time.
    if let Some(first) = next.deferred.iter().map(|d| d.at).min() {
        next.next_at = Some(next.next_at.map_or(first, |at| at.min(first)));
    }
    match deps
        .store
        .transact(vec![next.write(Some(seen.version))?])
        .await
    {
        Ok(()) => Ok(true),
        Err(e)
            if e.is_condition_failure()
                || matches!(&e, StoreError::TransactionCanceled { reasons } if reasons.iter().any(|r| matches!(r, crate::store::TxReason::Conflict))) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs the schedule record `rec` at `now` (see the module). Reads it
/// again first; a record not due answers `progressed: false`.
pub async fn run_one(
    deps: &Deps,
    rec: &NoticeSchedule,
    now: Timestamp,
) -> Result<RunOne, NoticeError> {
    let Some(cur) = record::get::<NoticeSchedule>(&*deps.store, &rec.item_key()).await? else {
        return Ok(RunOne::default());
    };
    if cur.next_at.is_none_or(|at| at > now) {
        return Ok(RunOne::default());
    }
    match cur.invoice_id.clone() {
        Some(inv) => run_invoice(deps, cur, &inv, now).await,
        None => run_trial(deps, cur, now).await,
    }
}

async fn close(deps: &Deps, cur: &NoticeSchedule, now: Timestamp) -> Result<RunOne, NoticeError> {
    let mut next = cur.clone();
    next.next_at = None;
    next.updated_at = now;
    // Nothing to collect any more: a deferred SMS is not sent.
    let dropped = drop_deferred(&mut next, now);
    save(deps, cur, next).await?;
    Ok(RunOne {
        progressed: true,
        skipped: dropped,
        ..RunOne::default()
    })
}

/// Records every deferred SMS of `next` `skipped` and forgets them.
fn drop_deferred(next: &mut NoticeSchedule, now: Timestamp) -> usize {
    let dropped = std::mem::take(&mut next.deferred);
    for d in &dropped {
        next.history.push(NoticeEntry {
            channel: NoticeChannel::Sms,
            ..skipped_entry(&(d.day, d.kind, d.interval), now)
        });
    }
    dropped.len()
}

async fn run_trial(
    deps: &Deps,
    cur: NoticeSchedule,
    now: Timestamp,
) -> Result<RunOne, NoticeError> {
    let tenant = cur.tenant();
    let sub = match subscription::get(deps, &tenant, &cur.subscription_id).await {
        Ok(s) => s,
        Err(SubscriptionError::NotFound(_)) => return close(deps, &cur, now).await,
        Err(e) => return Err(e.into()),
    };
    let (Some(end), true) = (cur.trial_end, sub.status == S::Trialing) else {
        return close(deps, &cur, now).await;
    };
    if sub.trial_ends_at != Some(end) {
        return close(deps, &cur, now).await;
    }
    let notice: Notice = (nepal_day(cur.not_before), NoticeKind::TrialEnding, None);
    let who = audience(deps, &tenant, &sub.customer_id).await?;
    let link = subscription_link(deps, &sub).await?;
    let say = Say {
        kind: NoticeKind::TrialEnding,
        occurrence: occurrence(&sub.id, notice.1, notice.0),
        shown: nepal_day(end),
        amount: sub.terms.amount,
        pay_url: &link,
        number: "",
        about: MailAbout::Subscription(sub.id.clone()),
        subscription_id: &sub.id,
        invoice_id: None,
    };
    let mut next = cur.clone();
    next.updated_at = now;
    let mut run = RunOne {
        progressed: true,
        ..RunOne::default()
    };
    match send(deps, &who, &say, now).await? {
        Sent::Wait { until, .. } => {
            next.next_at = Some(until);
            run.deferred = true;
        }
        Sent::Done(sent) => {
            run.sent = count_sent(&sent);
            run.skipped = usize::from(run.sent == 0);
            next.history.extend(entries(&sent, &notice, now));
            next.through = Some(Through {
                day: notice.0,
                kind: notice.1,
            });
            next.next_at = None;
        }
    }
    save(deps, &cur, next).await?;
    Ok(run)
}

fn count_sent(sent: &[(NoticeChannel, NoticeOutcome, Option<String>)]) -> usize {
    sent.iter()
        .filter(|(_, o, _)| matches!(o, NoticeOutcome::Queued | NoticeOutcome::Logged))
        .count()
}

/// The invoice's policy (its dunning's, else the subscription's, else the
/// project's default; an inactive one only when dunning already started)
/// and its dunning state.
async fn policy_of(
    deps: &Deps,
    tenant: &Tenant,
    sub: &Subscription,
    inv: &BillingInvoiceId,
) -> Result<(Option<DunningPolicy>, Option<DunningState>), NoticeError> {
    let state = dunning::dunning_state(deps, tenant, inv).await?;
    let id = match (&state, &sub.dunning_policy_id) {
        (Some(s), _) => Some(s.policy_id.clone()),
        (None, Some(p)) => Some(p.clone()),
        (None, None) => dunning::default_policy(deps, tenant).await?,
    };
    let policy = match id {
        Some(id) => match dunning::get_policy(deps, tenant, &id).await {
            Ok(p) if p.active || state.is_some() => Some(p),
            Ok(_) | Err(dunning::DunningError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    Ok((policy, state))
}

fn attempt_outcome(o: NoticeOutcome) -> AttemptOutcome {
    match o {
        NoticeOutcome::Queued => AttemptOutcome::Queued,
        NoticeOutcome::Logged => AttemptOutcome::Logged,
        NoticeOutcome::Failed => AttemptOutcome::Failed,
        NoticeOutcome::Suppressed
        | NoticeOutcome::QuotaExhausted
        | NoticeOutcome::Skipped
        | NoticeOutcome::Deferred => AttemptOutcome::Skipped,
    }
}

/// Appends the attempts of `notice` (one per channel) to the invoice's
/// dunning, unless it holds that interval's already (a retried run), or,
/// for a retry-now's `occurrence`, that occurrence's on the channel.
async fn record_attempts(
    deps: &Deps,
    tenant: &Tenant,
    inv: &BillingInvoiceId,
    notice_entries: &[NoticeEntry],
    interval: Option<u16>,
    occurrence: Option<&str>,
) -> Result<(), NoticeError> {
    for _ in 0..TRIES {
        let Some(state) = dunning::dunning_state(deps, tenant, inv).await? else {
            return Ok(());
        };
        if state.status != DunningStatus::Active
            || (interval.is_some() && state.attempts.iter().any(|a| a.interval == interval))
        {
            return Ok(());
        }
        let attempts: Vec<Attempt> = notice_entries
            .iter()
            .map(|e| Attempt {
                at: e.at,
                kind: AttemptKind::Reminder,
                channel: match e.channel {
                    NoticeChannel::Email => Channel::Email,
                    NoticeChannel::Sms | NoticeChannel::None => Channel::Sms,
                },
                outcome: attempt_outcome(e.outcome),
                interval,
                occurrence: occurrence.map(str::to_owned),
            })
            .filter(|a| {
                a.occurrence.is_none()
                    || !state
                        .attempts
                        .iter()
                        .any(|b| b.occurrence == a.occurrence && b.channel == a.channel)
            })
            .collect();
        if attempts.is_empty() {
            return Ok(());
        }
        // One conditioned write for every channel: a crash between two
        // appends would leave the interval half recorded.
        let written = dunning::append_attempts(deps, &state, attempts).await;
        match written {
            Ok(_) => return Ok(()),
            Err(dunning::DunningError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(dunning::DunningError::Busy.into())
}

/// Takes the policy's final action, each through the billing function
/// the API uses (the same webhooks), then marks the dunning `exhausted`.
/// Taken again after a crash, an action already in place is refused and
/// passed over.
async fn final_action(
    deps: &Deps,
    tenant: &Tenant,
    sub: &Subscription,
    inv: &BillingInvoice,
    action: FinalAction,
    now: Timestamp,
) -> Result<(), NoticeError> {
    let done = match action {
        FinalAction::Cancel => lifecycle::cancel(
            deps,
            tenant,
            &sub.id,
            CancelSubscription {
                cancel_reason: Some("dunning: the final reminder went unpaid".into()),
                at_period_end: Some(false),
            },
        )
        .await
        .map(|_| ()),
        FinalAction::Pause => lifecycle::pause(
            deps,
            tenant,
            &sub.id,
            PauseSubscription {
                pause_reason: Some("dunning: the final reminder went unpaid".into()),
                resume_at: None,
            },
        )
        .await
        .map(|_| ()),
        FinalAction::MarkUncollectible => {
            match invoice::mark_uncollectible(deps, tenant, &inv.id, now).await {
                Ok(_) | Err(BillingInvoiceError::Refused(_)) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    };
    match done {
        Ok(()) | Err(LifecycleError::Subscription(SubscriptionError::Refused(_))) => {}
        Err(e) => return Err(e.into()),
    }
    for _ in 0..TRIES {
        let Some(state) = dunning::dunning_state(deps, tenant, &inv.id).await? else {
            return Ok(());
        };
        if state.status != DunningStatus::Active {
            return Ok(());
        }
        match dunning::set_dunning_status(deps, &state, DunningStatus::Exhausted).await {
            Ok(_) => return Ok(()),
            Err(dunning::DunningError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(dunning::DunningError::Busy.into())
}

/// What an invoice's run reads.
struct InvoiceCtx {
    tenant: Tenant,
    inv: BillingInvoice,
    sub: Subscription,
    policy: Option<DunningPolicy>,
    days: InvoiceDays,
}

impl InvoiceCtx {
    fn intervals(&self, status: DunningStatus) -> Option<(&[u16], DunningStatus)> {
        self.policy
            .as_ref()
            .map(|p| (p.retry_intervals_days.as_slice(), status))
    }
}

async fn run_invoice(
    deps: &Deps,
    cur: NoticeSchedule,
    inv_id: &BillingInvoiceId,
    now: Timestamp,
) -> Result<RunOne, NoticeError> {
    let tenant = cur.tenant();
    let inv = match invoice::get_invoice(deps, &tenant, inv_id).await {
        Ok(i) => i,
        Err(BillingInvoiceError::NotFound(_)) => return close(deps, &cur, now).await,
        Err(e) => return Err(e.into()),
    };
    let sub = match subscription::get(deps, &tenant, &inv.subscription_id).await {
        Ok(s) => s,
        Err(SubscriptionError::NotFound(_)) => return close(deps, &cur, now).await,
        Err(e) => return Err(e.into()),
    };
    let (policy, state) = policy_of(deps, &tenant, &sub, inv_id).await?;
    let collectable = matches!(inv.status, InvoiceStatus::Open | InvoiceStatus::Overdue);
    if !collectable || sub.status.is_ended() {
        if let Some(s) = state.filter(|s| s.status == DunningStatus::Active)
            && matches!(inv.status, InvoiceStatus::Paid | InvoiceStatus::Void)
        {
            match dunning::set_dunning_status(deps, &s, DunningStatus::Resolved).await {
                Ok(_) | Err(dunning::DunningError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return close(deps, &cur, now).await;
    }
    // A retry-now's SMS whose time came goes first.
    let mut early = 0;
    let cur = if cur.deferred.iter().any(|d| d.at <= now) {
        match send_deferred(deps, &tenant, &inv, &sub, cur, now).await? {
            Some((saved, sent)) => {
                early = sent;
                saved
            }
            None => {
                return Ok(RunOne {
                    progressed: true,
                    ..RunOne::default()
                });
            }
        }
    } else {
        cur
    };
    let ctx = InvoiceCtx {
        days: InvoiceDays {
            due_date: inv.due_date,
            overdue_on: inv.overdue_on,
        },
        tenant,
        inv,
        sub,
        policy,
    };
    let status = state.as_ref().map_or(DunningStatus::Active, |s| s.status);
    // The notices due now, after the last handled (on a clock, the first).
    let mut due: Vec<Notice> = Vec::new();
    let mut through = cur.through;
    while let Some(n) = next_notice(
        &ctx.days,
        &ctx.sub.terms,
        ctx.intervals(status),
        through.as_ref(),
    ) {
        let at = due_time(n.0, cur.not_before).ok_or(NoticeError::NoDay)?;
        if at > now {
            break;
        }
        due.push(n);
        through = Some(Through {
            day: n.0,
            kind: n.1,
        });
        if cur.test_clock_id.is_some() {
            break;
        }
    }
    if ctx.policy.is_some()
        && state.is_none()
        && due
            .iter()
            .any(|n| matches!(n.1, NoticeKind::Overdue | NoticeKind::Dunning))
        && let Some(p) = &ctx.policy
    {
        dunning::start_dunning(deps, &ctx.tenant, &ctx.inv.id, &p.id).await?;
    }
    let mut run = handle(deps, &ctx, cur, due, now).await?;
    run.sent += early;
    Ok(run)
}

/// Sends the deferred SMS of `cur` whose time came (each once: its
/// occurrence's claim; its attempt once per occurrence), unless the
/// invoice's dunning is no longer active (then they are recorded
/// `skipped`); one still waiting (a rate limit) moves to its new time.
/// Answers the record written and the messages sent, or `None` when
/// another run moved the record first.
async fn send_deferred(
    deps: &Deps,
    tenant: &Tenant,
    inv: &BillingInvoice,
    sub: &Subscription,
    cur: NoticeSchedule,
    now: Timestamp,
) -> Result<Option<(NoticeSchedule, usize)>, NoticeError> {
    let mut next = cur.clone();
    next.updated_at = now;
    let active = dunning::dunning_state(deps, tenant, &inv.id)
        .await?
        .is_some_and(|s| s.status == DunningStatus::Active);
    let mut sent = 0;
    if active {
        let who = audience(deps, tenant, &inv.customer_id).await?;
        let link = invoice_link(deps, inv).await?;
        let mut keep = Vec::new();
        for d in std::mem::take(&mut next.deferred) {
            if d.at > now {
                keep.push(d);
                continue;
            }
            let say = Say {
                kind: d.kind,
                occurrence: d.occurrence.clone(),
                shown: inv.due_date,
                amount: inv.amount_due,
                pay_url: &link,
                number: &inv.number,
                about: MailAbout::BillingInvoice(inv.id.clone()),
                subscription_id: &sub.id,
                invoice_id: Some(&inv.id),
            };
            match send_sms_only(deps, &who, &say, now).await? {
                Err(until) => keep.push(DeferredSms { at: until, ..d }),
                Ok(entry) => {
                    let sent_now = [entry];
                    sent += count_sent(&sent_now);
                    let new = entries(&sent_now, &(d.day, d.kind, d.interval), now);
                    record_attempts(deps, tenant, &inv.id, &new, d.interval, Some(&d.occurrence))
                        .await?;
                    next.history.extend(new);
                }
            }
        }
        next.deferred = keep;
    } else {
        drop_deferred(&mut next, now);
    }
    // Due at once: `handle` (next) writes the schedule's own `next_at`; a
    // crash before it leaves the record due for the next run.
    next.next_at = Some(now);
    let mut written = next.clone();
    if !save(deps, &cur, next).await? {
        return Ok(None);
    }
    written.version = cur.version + 1;
    Ok(Some((written, sent)))
}

/// Sends the latest of `due` (the earlier recorded `skipped`), then the
/// final action when its dunning's last interval is through, and writes
/// the record with its next notice.
async fn handle(
    deps: &Deps,
    ctx: &InvoiceCtx,
    cur: NoticeSchedule,
    mut due: Vec<Notice>,
    now: Timestamp,
) -> Result<RunOne, NoticeError> {
    let mut next = cur.clone();
    next.updated_at = now;
    let mut run = RunOne {
        progressed: true,
        ..RunOne::default()
    };
    let send_this = due.pop();
    for n in &due {
        next.history.push(skipped_entry(n, now));
        run.skipped += 1;
        if n.1 == NoticeKind::Dunning {
            record_attempts(
                deps,
                &ctx.tenant,
                &ctx.inv.id,
                &[skipped_entry(n, now)],
                n.2,
                None,
            )
            .await?;
        }
    }
    let mut last_handled = due.last().copied();
    let overdue_started = nepal_day_start(ctx.inv.overdue_on).is_some_and(|t| now >= t);
    if let Some(n) = send_this {
        last_handled = Some(n);
        if n.1 == NoticeKind::BeforeDue && overdue_started {
            next.history.push(skipped_entry(&n, now));
            run.skipped += 1;
        } else {
            match send_invoice_notice(deps, ctx, &n, now).await? {
                Sent::Wait { until, .. } => {
                    run.deferred = true;
                    next.through = due
                        .last()
                        .map(|l| Through {
                            day: l.0,
                            kind: l.1,
                        })
                        .or(cur.through);
                    next.next_at = Some(until);
                    save(deps, &cur, next).await?;
                    return Ok(run);
                }
                Sent::Done(sent) => {
                    let new = entries(&sent, &n, now);
                    run.sent += count_sent(&sent);
                    if n.1 == NoticeKind::Dunning {
                        record_attempts(deps, &ctx.tenant, &ctx.inv.id, &new, n.2, None).await?;
                    }
                    next.history.extend(new);
                }
            }
        }
    }
    if let Some(l) = last_handled {
        next.through = Some(Through {
            day: l.0,
            kind: l.1,
        });
    }
    let exhausted = finish_dunning(deps, ctx, next.through, now).await?;
    run.final_action = exhausted;
    let after = if exhausted {
        None
    } else {
        let status = dunning::dunning_state(deps, &ctx.tenant, &ctx.inv.id)
            .await?
            .map_or(DunningStatus::Active, |s| s.status);
        next_notice(
            &ctx.days,
            &ctx.sub.terms,
            ctx.intervals(status),
            next.through.as_ref(),
        )
    };
    next.next_at = match after {
        Some(n) => Some(due_time(n.0, cur.not_before).ok_or(NoticeError::NoDay)?),
        None => None,
    };
    save(deps, &cur, next).await?;
    Ok(run)
}

async fn send_invoice_notice(
    deps: &Deps,
    ctx: &InvoiceCtx,
    n: &Notice,
    now: Timestamp,
) -> Result<Sent, NoticeError> {
    let inv = &ctx.inv;
    let who = audience(deps, &ctx.tenant, &inv.customer_id).await?;
    let link = invoice_link(deps, inv).await?;
    let shown = match n.1 {
        // The last day to pay.
        NoticeKind::BeforeDue => inv.overdue_on.pred_opt().unwrap_or(inv.due_date),
        _ => inv.due_date,
    };
    let say = Say {
        kind: n.1,
        occurrence: occurrence(&inv.id, n.1, n.0),
        shown,
        amount: inv.amount_due,
        pay_url: &link,
        number: &inv.number,
        about: MailAbout::BillingInvoice(inv.id.clone()),
        subscription_id: &ctx.sub.id,
        invoice_id: Some(&inv.id),
    };
    send(deps, &who, &say, now).await
}

/// When `through` is the policy's last interval and the dunning is still
/// active: the final action, and `true`.
async fn finish_dunning(
    deps: &Deps,
    ctx: &InvoiceCtx,
    through: Option<Through>,
    now: Timestamp,
) -> Result<bool, NoticeError> {
    let (Some(policy), Some(t)) = (&ctx.policy, through) else {
        return Ok(false);
    };
    let last_day = policy.retry_intervals_days.last().and_then(|d| {
        ctx.inv
            .overdue_on
            .checked_add_days(chrono::Days::new(u64::from(*d)))
    });
    if t.kind != NoticeKind::Dunning || last_day != Some(t.day) {
        return Ok(false);
    }
    let active = dunning::dunning_state(deps, &ctx.tenant, &ctx.inv.id)
        .await?
        .is_some_and(|s| s.status == DunningStatus::Active);
    if !active {
        return Ok(false);
    }
    final_action(
        deps,
        &ctx.tenant,
        &ctx.sub,
        &ctx.inv,
        policy.final_action,
        now,
    )
    .await?;
    Ok(true)
}

/// `POST …/dunning/retry-now`: a dunning reminder now, sent as the
/// scheduled ones are (SMS and/or email, a fresh link), recorded as an
/// attempt with no interval; answers the invoice's dunning. In quiet hours
/// (or under a rate limit) the email goes and the SMS is deferred: the
/// invoice's schedule keeps it (`deferred`, a `deferred` entry in its
/// history) and the notices pass sends it when its time comes, once. On a
/// test clock, the clock's time is now.
pub async fn retry_now(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
) -> Result<InvoiceDunningView, dunning::DunningError> {
    let inv = match invoice::get_invoice(deps, tenant, id).await {
        Ok(i) => i,
        Err(BillingInvoiceError::NotFound(_)) => {
            return Err(dunning::DunningError::InvoiceNotFound(id.clone()));
        }
        Err(BillingInvoiceError::Store(e)) => return Err(e.into()),
        Err(e) => return Err(dunning::DunningError::Conflict(e.to_string())),
    };
    let schedule =
        record::get::<NoticeSchedule>(&*deps.store, &NoticeSchedule::invoice_key(&inv.id)).await?;
    let on_clock = match schedule.as_ref().and_then(|s| s.test_clock_id.as_ref()) {
        Some(clock) => match test_clock::time_of(deps, tenant, clock).await {
            Ok(t) => Some(super::clock::at_time(deps, t)),
            Err(ClockTimeError::Store(e)) => return Err(e.into()),
            Err(e) => return Err(dunning::DunningError::Conflict(e.to_string())),
        },
        None => None,
    };
    let deps = on_clock.as_ref().unwrap_or(deps);
    let now = deps.clock.now();
    if !matches!(inv.status, InvoiceStatus::Open | InvoiceStatus::Overdue) {
        return Err(dunning::DunningError::Conflict(format!(
            "invoice {id} is {}: there is nothing to collect",
            inv.status.as_str()
        )));
    }
    let Some(state) = dunning::dunning_state(deps, tenant, id).await? else {
        return Err(dunning::DunningError::Conflict(format!(
            "dunning of {id} has not started (the invoice is not overdue yet)"
        )));
    };
    if state.status != DunningStatus::Active {
        return Err(dunning::DunningError::Conflict(format!(
            "dunning of {id} is {}: no more attempts",
            dunning_api::status_word(state.status)
        )));
    }
    // Each retry-now its own occurrence: the attempts (one a channel) and
    // the SMS still deferred so far.
    let manual = state
        .attempts
        .iter()
        .filter(|a| a.interval.is_none())
        .count()
        + schedule.as_ref().map_or(0, |s| s.deferred.len());
    let who = audience(deps, tenant, &inv.customer_id)
        .await
        .map_err(to_dunning)?;
    let link = invoice_link(deps, &inv).await.map_err(to_dunning)?;
    let day = nepal_day(now);
    let occurrence = format!(
        "{}#now{manual}",
        occurrence(&inv.id, NoticeKind::Dunning, day)
    );
    let say = Say {
        kind: NoticeKind::Dunning,
        occurrence: occurrence.clone(),
        shown: inv.due_date,
        amount: inv.amount_due,
        pay_url: &link,
        number: &inv.number,
        about: MailAbout::BillingInvoice(inv.id.clone()),
        subscription_id: &inv.subscription_id,
        invoice_id: Some(&inv.id),
    };
    let notice: Notice = (day, NoticeKind::Dunning, None);
    let (sent, deferred) = match send(deps, &who, &say, now).await.map_err(to_dunning)? {
        Sent::Done(sent) => (sent, None),
        // Quiet hours or a rate limit: the email went; the SMS waits.
        Sent::Wait { until, mail } => {
            let mut sent: Vec<SentEntry> = mail.into_iter().collect();
            sent.push((NoticeChannel::Sms, NoticeOutcome::Deferred, None));
            let wait = DeferredSms {
                at: until,
                day,
                kind: NoticeKind::Dunning,
                occurrence: occurrence.clone(),
                interval: None,
            };
            (sent, Some(wait))
        }
    };
    let new = entries(&sent, &notice, now);
    let attempted: Vec<NoticeEntry> = new
        .iter()
        .filter(|e| e.outcome != NoticeOutcome::Deferred)
        .cloned()
        .collect();
    record_attempts(deps, tenant, id, &attempted, None, Some(&occurrence))
        .await
        .map_err(to_dunning)?;
    append_history(deps, &inv, &new, deferred, now)
        .await
        .map_err(to_dunning)?;
    dunning_api::invoice_dunning(deps, tenant, id).await
}

/// Adds entries to the invoice's schedule history (retry-now's), and the
/// SMS it defers.
async fn append_history(
    deps: &Deps,
    inv: &BillingInvoice,
    new: &[NoticeEntry],
    deferred: Option<DeferredSms>,
    now: Timestamp,
) -> Result<(), NoticeError> {
    for _ in 0..TRIES {
        let Some(cur) =
            record::get::<NoticeSchedule>(&*deps.store, &NoticeSchedule::invoice_key(&inv.id))
                .await?
        else {
            if deferred.is_some() {
                tracing::warn!(invoice = %inv.id, "no notice schedule: a deferred retry-now SMS is not kept");
            }
            return Ok(());
        };
        let mut next = cur.clone();
        next.history.extend(new.iter().cloned());
        next.deferred.extend(deferred.iter().cloned());
        next.updated_at = now;
        if save(deps, &cur, next).await? {
            return Ok(());
        }
    }
    Err(StoreError::ConditionFailed.into())
}

fn to_dunning(e: NoticeError) -> dunning::DunningError {
    match e {
        NoticeError::Store(e) => dunning::DunningError::Store(e),
        NoticeError::Dunning(e) => e,
        other => dunning::DunningError::Store(StoreError::Backend(other.to_string())),
    }
}
