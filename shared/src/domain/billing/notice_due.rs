//! When each billing notice is due: the schedule records the notices pass
//! (`domain::notices`) reads, written by billing in the same transaction
//! as what makes them due.
//!
//! - Per billing invoice, `BINV#<invoice>` / `NOTICES`: written by
//!   [`issue_invoice`](super::invoice::issue_invoice) with the invoice.
//! - Per trial end, `SUB#<sub>` / `NOTICE#TRIAL#<trial end>`: written by
//!   the sweep's `TrialWillEnd` step with the write that records it.
//!
//! A record with a notice still due is in `gsi2` partition
//! `PROJ#<project>#<mode>#NOTICEDUE` (a test clock's: `CLOCK#<clock>#NOTICEDUE`),
//! sorted `<next_at>#<id>`; it leaves the index (no `next_at`) only by the
//! write that did the work. [`next_notice`] (pure) is the schedule itself:
//! from the last notice handled (`through`), the next one.

use chrono::{Days, NaiveDate};
use serde::{Deserialize, Serialize};

use super::calendar::nepal_day_start;
use super::dunning::DunningStatus;
use super::invoice::BillingInvoice;
use super::reminders::ReminderKind;
use super::subscription::Subscription;
use super::terms::Terms;
use crate::domain::record::{Entry, Record};
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, MailId, ProjectId, SmsId, SubscriptionId, TestClockId};
use crate::keys;
use crate::store::{Key, TxOp};
use crate::time::Timestamp;

/// Overdue reminders of an invoice without dunning, the first included.
pub const MAX_OVERDUE_REMINDERS: u64 = 4;
/// Notices go at 07:00 Nepal time (01:15 UTC) of their Nepal day.
pub const SEND_HOUR_NEPAL: i64 = 7;

/// The stored kind of a notice (as [`ReminderKind`] names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    DueToday,
    BeforeDue,
    Overdue,
    Dunning,
    TrialEnding,
}

impl NoticeKind {
    pub fn reminder(self) -> ReminderKind {
        match self {
            NoticeKind::DueToday => ReminderKind::DueToday,
            NoticeKind::BeforeDue => ReminderKind::BeforeDue,
            NoticeKind::Overdue => ReminderKind::Overdue,
            NoticeKind::Dunning => ReminderKind::Dunning,
            NoticeKind::TrialEnding => ReminderKind::TrialEnding,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.reminder().as_str()
    }
}

/// The last notice handled: its day and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Through {
    pub day: NaiveDate,
    pub kind: NoticeKind,
}

/// How a notice went out (or did not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeChannel {
    Sms,
    Email,
    /// Neither: the customer has no phone or email, or it was skipped.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeOutcome {
    /// Live: stored and queued.
    Queued,
    /// Sandbox SMS: logged, never delivered.
    Logged,
    /// An address the project suppressed: stored, never sent.
    Suppressed,
    /// The plan's SMS quota is used up.
    QuotaExhausted,
    /// Not sent: stale (a later notice was due), or no way to reach.
    Skipped,
    /// Could not be stored (bad address, template): recorded, not retried.
    Failed,
    /// A retry-now's SMS in quiet hours (or a rate limit): it waits in
    /// the record's `deferred` and goes when its time comes (a second
    /// entry then records how it went).
    Deferred,
}

/// One notice in the record's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeEntry {
    pub at: Timestamp,
    /// The notice's Nepal day (its occurrence).
    pub day: NaiveDate,
    pub kind: NoticeKind,
    pub channel: NoticeChannel,
    pub outcome: NoticeOutcome,
    /// The SMS stored (channel `sms`).
    pub sms_id: Option<SmsId>,
    /// The email stored (channel `email`).
    pub mail_id: Option<MailId>,
    /// The dunning policy interval (from 0) a `dunning` notice answers.
    pub interval: Option<u16>,
}

/// The schedule of one invoice's notices, or of one trial end's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeSchedule {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub subscription_id: SubscriptionId,
    /// The invoice (an invoice's schedule).
    pub invoice_id: Option<BillingInvoiceId>,
    /// The trial end (a trial's schedule).
    pub trial_end: Option<Timestamp>,
    /// The customer's test clock, if any (the clock runs it).
    pub test_clock_id: Option<TestClockId>,
    /// Never before this (the invoice's issue, the trial-will-end moment).
    pub not_before: Timestamp,
    /// When the next notice is due; `None`: nothing more (out of the index).
    pub next_at: Option<Timestamp>,
    pub through: Option<Through>,
    pub history: Vec<NoticeEntry>,
    /// SMS that wait for their time outside the schedule (a retry-now in
    /// quiet hours); `next_at` is never after the earliest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deferred: Vec<DeferredSms>,
    pub version: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// An SMS of a retry-now that waits (quiet hours, a rate limit); the
/// notices pass sends it once `at` comes, once (its occurrence's claim),
/// unless the invoice is no longer collectable or its dunning ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeferredSms {
    /// When it may go.
    pub at: Timestamp,
    /// The Nepal day of the retry-now (its occurrence's day).
    pub day: NaiveDate,
    pub kind: NoticeKind,
    /// The occurrence (`<invoice>#dunning#<day>#now<n>`).
    pub occurrence: String,
    pub interval: Option<u16>,
}

crate::attrs! { NoticeSchedule {
    VERSION: i64 = version,
} }

impl NoticeSchedule {
    pub fn invoice_key(invoice: &BillingInvoiceId) -> Key {
        Key::new(format!("BINV#{invoice}"), "NOTICES")
    }

    pub fn trial_key(sub: &SubscriptionId, trial_end: Timestamp) -> Key {
        let (pk, prefix) = NoticeSchedule::trials_of(sub);
        Key::new(pk, format!("{prefix}{}", trial_end.to_rfc3339()))
    }

    /// Where a subscription's trial schedules are: its partition and
    /// their sort key prefix.
    pub fn trials_of(sub: &SubscriptionId) -> (String, &'static str) {
        (format!("SUB#{sub}"), "NOTICE#TRIAL#")
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// What its index entry sorts by after the time: its invoice, or its
    /// subscription.
    fn target(&self) -> &dyn std::fmt::Display {
        match &self.invoice_id {
            Some(inv) => inv,
            None => &self.subscription_id,
        }
    }

    /// The schedule of `inv`, issued for `sub` at `now` (its first notice
    /// due: `due_today`, or `overdue` with no grace).
    pub fn for_invoice(inv: &BillingInvoice, sub: &Subscription, now: Timestamp) -> Self {
        let days = InvoiceDays {
            due_date: inv.due_date,
            overdue_on: inv.overdue_on,
        };
        let first = next_notice(&days, &sub.terms, None, None);
        NoticeSchedule {
            project_id: inv.project_id.clone(),
            mode: inv.mode,
            subscription_id: sub.id.clone(),
            invoice_id: Some(inv.id.clone()),
            trial_end: None,
            test_clock_id: sub.test_clock_id.clone(),
            not_before: inv.issued_at,
            next_at: first.and_then(|n| due_time(n.0, inv.issued_at)),
            through: None,
            history: Vec::new(),
            deferred: Vec::new(),
            version: 1,
            created_at: now,
            updated_at: now,
        }
    }

    /// The schedule of `sub`'s trial-ending notice, written when the sweep
    /// records the trial-will-end moment `moment` (never before 07:00
    /// Nepal time of its day).
    pub fn for_trial(
        sub: &Subscription,
        trial_end: Timestamp,
        moment: Timestamp,
        now: Timestamp,
    ) -> Self {
        let at = send_time(super::calendar::nepal_day(moment)).map_or(moment, |t| t.max(moment));
        NoticeSchedule {
            project_id: sub.project_id.clone(),
            mode: sub.mode,
            subscription_id: sub.id.clone(),
            invoice_id: None,
            trial_end: Some(trial_end),
            test_clock_id: sub.test_clock_id.clone(),
            not_before: at,
            next_at: Some(at),
            through: None,
            history: Vec::new(),
            deferred: Vec::new(),
            version: 1,
            created_at: now,
            updated_at: now,
        }
    }

    /// The write of this record replacing the one read at version `seen`
    /// (`None`: a new record).
    pub fn write(&self, seen: Option<i64>) -> Result<TxOp, crate::store::StoreError> {
        Ok(match seen {
            None => self.put_new()?,
            Some(v) => TxOp::Put {
                item: self.to_item()?,
                cond: Some(NoticeSchedule::VERSION.eq(&v)),
            },
        })
    }
}

impl Record for NoticeSchedule {
    fn item_key(&self) -> Key {
        match (&self.invoice_id, self.trial_end) {
            (Some(inv), _) => NoticeSchedule::invoice_key(inv),
            (None, Some(end)) => NoticeSchedule::trial_key(&self.subscription_id, end),
            (None, None) => NoticeSchedule::trial_key(&self.subscription_id, self.created_at),
        }
    }

    fn entries(&self) -> Vec<Entry> {
        match self.next_at {
            Some(at) => {
                let partition = match &self.test_clock_id {
                    Some(clock) => clock_partition(clock),
                    None => due_partition(&self.tenant()),
                };
                vec![Entry::gsi2(partition, due_sort(at, self.target()))]
            }
            None => Vec::new(),
        }
    }
}

/// The once-only marker of one notice's SMS: `sms::notify_invoice` puts
/// it (where none is) in the transaction that stores the SMS, so a retried
/// or concurrent run stores and sends none again. It lives beside its
/// schedule: `BINV#<invoice>` (or `SUB#<sub>`) / `NOTICE#SMS#<occurrence>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeSmsClaim {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub subscription_id: SubscriptionId,
    pub invoice_id: Option<BillingInvoiceId>,
    /// `<invoice or subscription>#<kind>#<day>`.
    pub occurrence: String,
    /// The SMS this occurrence stored (written with it): what a retried
    /// run records when it finds the occurrence done.
    #[serde(default)]
    pub sms_id: Option<SmsId>,
    pub created_at: Timestamp,
}

impl Record for NoticeSmsClaim {
    fn item_key(&self) -> Key {
        let pk = match &self.invoice_id {
            Some(inv) => format!("BINV#{inv}"),
            None => format!("SUB#{}", self.subscription_id),
        };
        Key::new(pk, format!("NOTICE#SMS#{}", self.occurrence))
    }
}

/// The tenant's notices due index partition.
pub fn due_partition(tenant: &Tenant) -> String {
    keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::NoticesDue)
}

/// The notices due index partition of test clock `clock`.
pub fn clock_partition(clock: &TestClockId) -> String {
    keys::test_clock_notice_partition(clock)
}

/// The place of a record due at `at` in its partition.
pub fn due_sort(at: Timestamp, target: &dyn std::fmt::Display) -> String {
    format!("{}#{target}", at.to_rfc3339())
}

/// The upper bound of the entries due at or before `now`.
pub fn due_before(now: Timestamp) -> String {
    format!("{}#~", now.to_rfc3339())
}

/// 07:00 Nepal time of `day`.
pub fn send_time(day: NaiveDate) -> Option<Timestamp> {
    nepal_day_start(day).map(|t| t.plus(chrono::Duration::hours(SEND_HOUR_NEPAL)))
}

/// When a notice of `day` goes: 07:00 Nepal time, never before `not_before`.
pub fn due_time(day: NaiveDate, not_before: Timestamp) -> Option<Timestamp> {
    send_time(day).map(|t| t.max(not_before))
}

/// The days an invoice's notices are computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvoiceDays {
    pub due_date: NaiveDate,
    pub overdue_on: NaiveDate,
}

/// One notice: its Nepal day, kind, and the dunning interval (from 0) it
/// answers.
pub type Notice = (NaiveDate, NoticeKind, Option<u16>);

/// Every notice of an invoice, in order (ties on a day in kind order).
/// `dunning`: the policy's intervals and where its dunning stands (an
/// invoice not yet dunned under an active policy: `Active`); `None`: no
/// active policy, the plan's overdue reminders repeat instead.
pub fn invoice_notices(
    inv: &InvoiceDays,
    terms: &Terms,
    dunning: Option<(&[u16], DunningStatus)>,
) -> Vec<Notice> {
    let mut out = Vec::new();
    let (due, overdue_on) = (inv.due_date, inv.overdue_on);
    // Grace 0: the bill is overdue on its due day; the overdue notice says so.
    if overdue_on > due {
        out.push((due, NoticeKind::DueToday, None));
    }
    let before = u64::from(terms.reminder_days_before_due);
    if before > 0
        && let Some(b) = overdue_on.checked_sub_days(Days::new(before))
        && b > due
        && b < overdue_on
    {
        out.push((b, NoticeKind::BeforeDue, None));
    }
    out.push((overdue_on, NoticeKind::Overdue, None));
    match dunning {
        Some((intervals, status)) => {
            if matches!(status, DunningStatus::Active) {
                for (i, d) in intervals.iter().enumerate() {
                    if let (Some(day), Ok(i)) = (
                        overdue_on.checked_add_days(Days::new(u64::from(*d))),
                        u16::try_from(i),
                    ) {
                        out.push((day, NoticeKind::Dunning, Some(i)));
                    }
                }
            }
        }
        None => {
            let every = u64::from(terms.overdue_reminder_interval_days);
            if every > 0 {
                for k in 1..MAX_OVERDUE_REMINDERS {
                    if let Some(day) = overdue_on.checked_add_days(Days::new(every * k)) {
                        out.push((day, NoticeKind::Overdue, None));
                    }
                }
            }
        }
    }
    out
}

/// The notice after `through` (the last handled), `None` when none is
/// left. A dunning that is stopped, exhausted or resolved has none left.
pub fn next_notice(
    inv: &InvoiceDays,
    terms: &Terms,
    dunning: Option<(&[u16], DunningStatus)>,
    through: Option<&Through>,
) -> Option<Notice> {
    if let Some((_, status)) = dunning
        && status != DunningStatus::Active
    {
        return None;
    }
    invoice_notices(inv, terms, dunning)
        .into_iter()
        .find(|(day, kind, _)| through.is_none_or(|t| (*day, *kind) > (t.day, t.kind)))
}

#[cfg(test)]
mod tests;
