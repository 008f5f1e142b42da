//! Subscriptions: the state machine (one pure function, [`next`]) and the
//! stored record.
//!
//! Storage: a subscription at `SUB#<id>` / `SUB`, listed per project and
//! mode on `gsi1` (`PROJ#<project>#<mode>#SUB`, by id). Every change is a
//! whole-record write conditioned on the version read (optimistic
//! locking): the state machine decides on the record as read, and a write
//! that lost the race re-reads and decides again.
//!
//! Every write also sets `next_due_at` ([`Subscription::due_at`]) and the
//! subscription's place in its tenant's due index (`billing::due`), so the
//! sweep finds each subscription when something of it is due.

use crate::domain::listing::counted;
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::calendar::{nepal_day, nepal_day_start};
use super::customers::Customer;
use super::due;
use super::dunning::FinalAction;
use super::events::{status_webhook, subscription_event, subscription_webhook};
use super::period::{IntervalError, Period, Schedule, validate_interval};
use super::terms::{OverdueAction, Terms, TermsError};
use crate::Deps;
use crate::domain::listing::counted::{CountedList, Narrowed};
use crate::domain::listing::merge_counts;
use crate::domain::outbox::EventType;
use crate::domain::record::{self, Attr, Changes, Entry, Record};
use crate::domain::{Mode, Tenant};
use crate::ids::{
    BillingInvoiceId, CustomerId, DunningPolicyId, PlanId, ProjectId, SubscriptionId, TestClockId,
};
use crate::store::{Cond, Index, Key, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// The error code of a refused transition (documented in
/// `docs/billing.md`; the subscription routes answer it, `billing::lifecycle`).
pub const SUBSCRIPTION_STATE_CONFLICT: &str = "subscription_state_conflict";

/// How often [`apply`] re-reads a subscription another writer changed.
const APPLY_TRIES: usize = 16;

/// The SDK's `SubscriptionStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionStatus {
    /// The first invoice is issued and unpaid (no trial).
    Incomplete,
    /// The first invoice's grace period ended unpaid.
    IncompleteExpired,
    /// Created with a start date still ahead: nothing billed yet.
    Draft,
    Trialing,
    Active,
    PastDue,
    Paused,
    Cancelled,
    /// Reserved for fixed-term subscriptions (issue 40): nothing reaches
    /// it yet.
    Completed,
}

impl SubscriptionStatus {
    pub const ALL: [SubscriptionStatus; 9] = [
        SubscriptionStatus::Incomplete,
        SubscriptionStatus::IncompleteExpired,
        SubscriptionStatus::Draft,
        SubscriptionStatus::Trialing,
        SubscriptionStatus::Active,
        SubscriptionStatus::PastDue,
        SubscriptionStatus::Paused,
        SubscriptionStatus::Cancelled,
        SubscriptionStatus::Completed,
    ];

    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SubscriptionStatus::Incomplete => "incomplete",
            SubscriptionStatus::IncompleteExpired => "incomplete_expired",
            SubscriptionStatus::Draft => "draft",
            SubscriptionStatus::Trialing => "trialing",
            SubscriptionStatus::Active => "active",
            SubscriptionStatus::PastDue => "past_due",
            SubscriptionStatus::Paused => "paused",
            SubscriptionStatus::Cancelled => "cancelled",
            SubscriptionStatus::Completed => "completed",
        }
    }

    /// Whether the subscription has ended (nothing more is billed).
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            SubscriptionStatus::IncompleteExpired
                | SubscriptionStatus::Cancelled
                | SubscriptionStatus::Completed
        )
    }
}

/// What happens to a subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubscriptionEvent {
    /// Its start date is reached (at creation, or later for a draft):
    /// with a trial it trials, without one its first invoice is issued.
    Start {
        trial: bool,
    },
    FirstInvoicePaid,
    /// A later invoice is paid; `unpauses` when the subscription was
    /// paused for not paying (an overdue or dunning pause), not by the
    /// merchant.
    InvoicePaid {
        unpauses: bool,
    },
    /// An invoice's grace period ended unpaid: the plan's overdue action.
    GraceEndedUnpaid(OverdueAction),
    /// The dunning policy's last interval passed unpaid.
    DunningExhausted(FinalAction),
    Pause,
    Resume,
    CancelNow,
    CancelAtPeriodEnd,
    /// The current period ended with a cancel at period end pending.
    PeriodEndedCancelPending,
    TrialEnded,
    TrialExtended,
}

impl SubscriptionEvent {
    /// Every event, with every value of its parameters (the table test).
    pub fn all() -> Vec<SubscriptionEvent> {
        let mut all = vec![
            SubscriptionEvent::Start { trial: true },
            SubscriptionEvent::Start { trial: false },
            SubscriptionEvent::FirstInvoicePaid,
            SubscriptionEvent::InvoicePaid { unpauses: true },
            SubscriptionEvent::InvoicePaid { unpauses: false },
        ];
        all.extend(OverdueAction::ALL.map(SubscriptionEvent::GraceEndedUnpaid));
        all.extend(FinalAction::ALL.map(SubscriptionEvent::DunningExhausted));
        all.extend([
            SubscriptionEvent::Pause,
            SubscriptionEvent::Resume,
            SubscriptionEvent::CancelNow,
            SubscriptionEvent::CancelAtPeriodEnd,
            SubscriptionEvent::PeriodEndedCancelPending,
            SubscriptionEvent::TrialEnded,
            SubscriptionEvent::TrialExtended,
        ]);
        all
    }

    /// The action, as the refusal names it.
    pub fn action(self) -> &'static str {
        match self {
            SubscriptionEvent::Start { .. } => "start",
            SubscriptionEvent::FirstInvoicePaid => "take the payment of its first invoice",
            SubscriptionEvent::InvoicePaid { .. } => "take the payment of an invoice",
            SubscriptionEvent::GraceEndedUnpaid(_) => "take the plan's overdue action",
            SubscriptionEvent::DunningExhausted(_) => "take the dunning policy's final action",
            SubscriptionEvent::Pause => "be paused",
            SubscriptionEvent::Resume => "be resumed",
            SubscriptionEvent::CancelNow => "be cancelled",
            SubscriptionEvent::CancelAtPeriodEnd => "be cancelled at period end",
            SubscriptionEvent::PeriodEndedCancelPending => "end its period with a cancel pending",
            SubscriptionEvent::TrialEnded => "end its trial",
            SubscriptionEvent::TrialExtended => "have its trial extended",
        }
    }
}

/// A transition the state machine does not allow
/// ([`SUBSCRIPTION_STATE_CONFLICT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a subscription that is {} cannot {}", from.as_str(), event.action())]
pub struct Refusal {
    pub from: SubscriptionStatus,
    pub event: SubscriptionEvent,
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        SUBSCRIPTION_STATE_CONFLICT
    }
}

/// The subscription state machine: where `event` takes a subscription
/// that is `from`, or why it cannot. `docs/billing.md` shows this table.
pub fn next(
    from: SubscriptionStatus,
    event: SubscriptionEvent,
) -> Result<SubscriptionStatus, Refusal> {
    use SubscriptionEvent as E;
    use SubscriptionStatus as S;
    let refused = Err(Refusal { from, event });
    let to = match (from, event) {
        (S::Draft, E::Start { trial: true }) => S::Trialing,
        (S::Draft, E::Start { trial: false }) => S::Incomplete,
        (S::Incomplete, E::FirstInvoicePaid) => S::Active,
        (S::Active | S::PastDue, E::InvoicePaid { .. }) => S::Active,
        (S::Paused, E::InvoicePaid { unpauses }) => {
            if unpauses {
                S::Active
            } else {
                S::Paused
            }
        }
        // A late payment of an ended subscription's last invoice.
        (S::Cancelled | S::Completed, E::InvoicePaid { .. }) => from,
        (S::Incomplete, E::GraceEndedUnpaid(_)) => S::IncompleteExpired,
        (S::Active | S::PastDue | S::Paused, E::GraceEndedUnpaid(action)) => overdue(from, action),
        (S::Active | S::PastDue | S::Paused, E::DunningExhausted(action)) => match action {
            FinalAction::Cancel => S::Cancelled,
            FinalAction::Pause => S::Paused,
            FinalAction::MarkUncollectible => from,
        },
        (S::Active | S::PastDue, E::Pause) => S::Paused,
        (S::Paused, E::Resume) => S::Active,
        (
            S::Draft | S::Incomplete | S::Trialing | S::Active | S::PastDue | S::Paused,
            E::CancelNow,
        ) => S::Cancelled,
        (S::Trialing | S::Active | S::PastDue, E::CancelAtPeriodEnd) => from,
        (S::Trialing | S::Active | S::PastDue | S::Paused, E::PeriodEndedCancelPending) => {
            S::Cancelled
        }
        (S::Trialing, E::TrialEnded) => S::Active,
        (S::Trialing, E::TrialExtended) => S::Trialing,
        _ => return refused,
    };
    Ok(to)
}

/// The plan's overdue action on a subscription that is active, past due
/// or paused: never back to active (only a payment does that).
fn overdue(from: SubscriptionStatus, action: OverdueAction) -> SubscriptionStatus {
    use SubscriptionStatus as S;
    match (from, action) {
        (_, OverdueAction::Cancel) => S::Cancelled,
        (S::Paused, _) | (_, OverdueAction::Pause) => S::Paused,
        (S::Active, OverdueAction::KeepActive) => S::Active,
        _ => S::PastDue,
    }
}

/// A proration invoice the sweep checks at its grace end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GracePending {
    pub invoice_id: BillingInvoiceId,
    /// Its `overdue_on` day: due at 00:00 Nepal time.
    pub overdue_on: NaiveDate,
}

/// A stored subscription.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    pub id: SubscriptionId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub customer_id: CustomerId,
    pub plan_id: PlanId,
    pub status: SubscriptionStatus,
    /// The plan's terms as they were when the subscription was created.
    pub terms: Terms,
    /// Units billed (seats): more than 1 on per-unit plans only
    /// (`billing::changes`).
    pub quantity: u32,
    pub reference_id: Option<String>,
    pub metadata: Map<String, Value>,
    /// The Nepal day it starts (a draft until then).
    pub start_date: NaiveDate,
    pub billing_anchor_day: Option<u8>,
    pub trial_ends_at: Option<Timestamp>,
    /// The first day billed: the start, or the day the trial ends; set
    /// when billing begins. Periods count from it ([`Subscription::period`]).
    pub billing_start: Option<NaiveDate>,
    /// The index of the current period (0: the first).
    pub period_index: u32,
    pub cancel_at_period_end: bool,
    pub cancel_reason: Option<String>,
    pub cancelled_at: Option<Timestamp>,
    pub pause_reason: Option<String>,
    /// Paused by an overdue or dunning action (a payment resumes it),
    /// not by the merchant.
    pub paused_for_nonpayment: bool,
    pub resume_at: Option<Timestamp>,
    /// `None`: the project's default policy.
    pub dunning_policy_id: Option<DunningPolicyId>,
    pub test_clock_id: Option<TestClockId>,
    /// When something of it is next due ([`Subscription::due_at`]); its
    /// entry in the due index sorts by it. `None`: nothing ever will be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due_at: Option<Timestamp>,
    /// The trial end whose `trial_will_end` moment the sweep handled (a
    /// new trial end makes it due again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial_reminded_for: Option<Timestamp>,
    /// The first period whose invoice's grace end the sweep has still to
    /// check.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub overdue_next: u32,
    /// A plan change scheduled for a later period (`prorationBehavior:
    /// none`); the sweep applies it (`billing::changes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_change: Option<super::changes::PendingChange>,
    /// The start of the period whose invoice's `invoice.upcoming` moment
    /// the sweep handled (`billing::upcoming`): once per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upcoming_for: Option<NaiveDate>,
    /// It had a one-off invoice item once (`billing::items`): its next
    /// invoices may carry items, so the sweep looks for them before each
    /// (a metered plan always does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub has_items: bool,
    /// Proration invoices whose grace end the sweep has still to check
    /// (`billing::changes`), as a cycle invoice's is (`overdue_next`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grace_pending: Vec<GracePending>,
    pub version: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Counted in its tenant's list counters (`listing::counted`): set at
    /// creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// Entered and counted in its tenant's narrowings (by status, plan,
    /// both, and its customer's list: [`Subscription::by_filter`],
    /// [`Subscription::of_customer`]): its `gsi4` partition, present from
    /// creation, or from `dhukuti-admin lists migrate`.
    #[serde(
        default,
        rename = "gsi4pk",
        deserialize_with = "crate::domain::listing::present",
        skip_serializing
    )]
    pub narrowed: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How long before a trial ends its `trial_will_end` moment is.
pub const TRIAL_WILL_END_BEFORE: chrono::Duration = chrono::Duration::days(3);

/// How long before a period ends (its next invoice is issued) its
/// `invoice.upcoming` moment is (`billing::upcoming`).
pub const UPCOMING_BEFORE: chrono::Duration = chrono::Duration::days(3);

crate::attrs! { Subscription {
    ID: SubscriptionId = id,
    CUSTOMER_ID: CustomerId = customer_id,
    PLAN_ID: PlanId = plan_id,
    STATUS: SubscriptionStatus = status,
    VERSION: i64 = version,
    TEST_CLOCK_ID: Option<TestClockId> = test_clock_id,
    COUNTED: bool = counted,
    NARROWED: bool = narrowed as "gsi4pk",
} }

crate::domain::listing::counted::counted_per_tenant!(
    Subscription,
    crate::domain::listing::counted::CountedKind::Subscriptions,
    Subscription::list_partition
);

impl Subscription {
    pub fn key(id: &SubscriptionId) -> Key {
        Key::new(format!("SUB#{id}"), "SUB")
    }

    pub fn list_partition(tenant: &Tenant) -> String {
        format!("PROJ#{}#{}#SUB", tenant.project, tenant.mode.as_str())
    }

    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// `tenant`'s subscriptions narrowed to a status, a plan, or both
    /// (neither: the whole list). Status: `gsi4`, member `s_<status>`;
    /// plan: `gsi5`, `p_<plan>`; both: `gsi6`, `sp_<status>_<plan>`; each
    /// partition the list's with `#S#<status>`, `#P#<plan>`,
    /// `#SP#<status>#<plan>`, sorted by id.
    pub fn by_filter(
        tenant: &Tenant,
        status: Option<SubscriptionStatus>,
        plan: Option<&PlanId>,
    ) -> CountedList {
        let list = Subscription::counted_list_of(tenant);
        let base = Subscription::list_partition(tenant);
        match (status, plan) {
            (None, None) => list,
            (Some(s), None) => list.narrowed(
                &format!("s_{}", s.as_str()),
                Index::Gsi4,
                format!("{base}#S#{}", s.as_str()),
            ),
            (None, Some(p)) => {
                list.narrowed(&format!("p_{p}"), Index::Gsi5, format!("{base}#P#{p}"))
            }
            (Some(s), Some(p)) => list.narrowed(
                &format!("sp_{}_{p}", s.as_str()),
                Index::Gsi6,
                format!("{base}#SP#{}#{p}", s.as_str()),
            ),
        }
    }

    /// The subscriptions of `tenant`'s customer `customer`: a scoped list
    /// (its own counters, `LIST#SUB#<customer>#...`: a project may have
    /// millions of customers), `gsi3` partition `<list>#CUS#<customer>`.
    pub fn of_customer(tenant: &Tenant, customer: &CustomerId) -> CountedList {
        let base = Subscription::list_partition(tenant);
        Subscription::counted_list_of(tenant)
            .scoped(customer.as_str())
            .narrowed("all", Index::Gsi3, format!("{base}#CUS#{customer}"))
    }

    /// Its four narrowings at its status, plan and customer.
    fn narrowings_now(&self) -> [CountedList; 4] {
        let tenant = self.tenant();
        [
            Subscription::by_filter(&tenant, Some(self.status), None),
            Subscription::by_filter(&tenant, None, Some(&self.plan_id)),
            Subscription::by_filter(&tenant, Some(self.status), Some(&self.plan_id)),
            Subscription::of_customer(&tenant, &self.customer_id),
        ]
    }

    fn narrowed_entries(&self) -> Vec<Entry> {
        counted::entries_in(&self.narrowings_now(), self.id.as_str())
    }

    /// The counter writes of a new subscription: its list (counted) and
    /// its narrowings (narrowed), folded per counter item.
    pub(crate) fn counts_new(&self) -> Vec<TxOp> {
        let mut ops = Vec::new();
        if self.counted {
            ops = self.count_new();
        }
        if self.narrowed {
            for l in self.narrowings_now() {
                merge_counts(&mut ops, l.count_new(&self.id, self.created_at));
            }
        }
        ops
    }

    /// Its `counted` and `narrowed` still as read: a whole-record write
    /// from an older read must not undo the lists migration's marks.
    fn listed_as_read(&self) -> Cond {
        Cond::And(vec![
            if self.counted {
                Subscription::COUNTED.eq(&true)
            } else {
                Subscription::COUNTED.missing()
            },
            if self.narrowed {
                Subscription::NARROWED.exists()
            } else {
                Subscription::NARROWED.missing()
            },
        ])
    }

    /// Period `index` of its billing (`None` before billing begins or past
    /// the calendar's covered years).
    pub fn period(&self, index: u32) -> Option<Period> {
        let t = &self.terms;
        Schedule::new(
            self.billing_start?,
            t.interval_unit,
            t.interval_count,
            self.billing_anchor_day,
            t.calendar,
        )
        .ok()??
        .period(index)
    }

    /// The current period, once billing has begun.
    pub fn current_period(&self) -> Option<Period> {
        self.period(self.period_index)
    }

    /// The next moment anything of this subscription is due for the sweep
    /// (`None`: nothing, ever, unless it changes): a draft's start day,
    /// the trial's `trial_will_end` moment and its end, the current
    /// period's end, a paused subscription's `resume_at`, and the grace end
    /// (the `overdue_on` day) of the first period not yet checked.
    pub fn due_at(&self) -> Option<Timestamp> {
        use SubscriptionStatus as S;
        let mut due: Vec<Option<Timestamp>> = Vec::new();
        match self.status {
            S::IncompleteExpired | S::Cancelled | S::Completed => return None,
            S::Draft => due.push(nepal_day_start(self.start_date)),
            S::Trialing => {
                if let Some(end) = self.trial_ends_at {
                    due.push(Some(end));
                    if self.trial_reminded_for != Some(end) {
                        due.push(Some(end.plus(-TRIAL_WILL_END_BEFORE)));
                    }
                }
            }
            S::Incomplete => {}
            S::Active | S::PastDue | S::Paused => {
                due.push(
                    self.current_period()
                        .and_then(|p| nepal_day_start(p.end_exclusive)),
                );
            }
        }
        if self.status == S::Paused {
            due.push(self.resume_at);
        }
        due.push(self.upcoming_at().map(|(at, _)| at));
        if !self.status.is_ended() {
            due.push(self.proration_grace_at().map(|(at, _)| at));
        }
        if self.billing_start.is_some()
            && !matches!(self.status, S::Draft | S::Trialing)
            && self.overdue_next <= self.period_index
        {
            due.push(
                self.period(self.overdue_next)
                    .and_then(|p| self.terms.overdue_on(p.start))
                    .and_then(nepal_day_start),
            );
        }
        due.into_iter().flatten().min()
    }

    /// The `invoice.upcoming` moment still to handle, and the start of the
    /// period whose invoice it announces: [`UPCOMING_BEFORE`] before the
    /// current period ends, for an `active` or `past_due` subscription
    /// whose next invoice may carry usage or items (a metered plan, or one
    /// that had an item) and is not cancelled at period end. `None` when
    /// handled for that period, or when the period is too short to have
    /// the moment inside it.
    pub fn upcoming_at(&self) -> Option<(Timestamp, NaiveDate)> {
        use SubscriptionStatus as S;
        if !matches!(self.status, S::Active | S::PastDue) || self.cancel_at_period_end {
            return None;
        }
        if !(self.has_items || self.terms.pricing_model == super::terms::PricingModel::Metered) {
            return None;
        }
        let p = self.current_period()?;
        if self.upcoming_for == Some(p.end_exclusive) {
            return None;
        }
        let at = nepal_day_start(p.end_exclusive)?.plus(-UPCOMING_BEFORE);
        (at > nepal_day_start(p.start)?).then_some((at, p.end_exclusive))
    }

    /// The earliest grace end of its proration invoices still to check,
    /// and which ([`GracePending`]).
    pub fn proration_grace_at(&self) -> Option<(Timestamp, &GracePending)> {
        self.grace_pending
            .iter()
            .filter_map(|g| nepal_day_start(g.overdue_on).map(|at| (at, g)))
            .min_by_key(|(at, _)| *at)
    }

    /// This subscription with `next_due_at` set from its fields.
    pub fn stamped(&self) -> Subscription {
        let mut sub = self.clone();
        sub.next_due_at = sub.due_at();
        sub
    }
}

impl Record for Subscription {
    fn item_key(&self) -> Key {
        Subscription::key(&self.id)
    }

    fn entries(&self) -> Vec<Entry> {
        let mut entries = vec![Entry::gsi1(
            Subscription::list_partition(&self.tenant()),
            self.id.to_string(),
        )];
        if let Some(at) = self.next_due_at {
            let partition = match &self.test_clock_id {
                Some(clock) => due::clock_partition(clock),
                None => due::due_partition(&self.tenant()),
            };
            entries.push(Entry::gsi2(partition, due::due_sort(at, &self.id)));
        }
        if self.narrowed {
            entries.extend(self.narrowed_entries());
        }
        entries
    }
}

impl Narrowed for Subscription {
    const NARROWED: Attr<Self, bool> = Subscription::NARROWED;
    fn is_narrowed(&self) -> bool {
        self.narrowed
    }
    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>) {
        let counts = counted::counts_in(&self.narrowings_now(), self.id.as_str(), self.created_at);
        (Changes::new().enter(self.narrowed_entries()), counts)
    }
    fn narrowed_as_read(&self) -> Cond {
        Cond::And(vec![
            Subscription::STATUS.eq(&self.status),
            Subscription::PLAN_ID.eq(&self.plan_id),
            Subscription::CUSTOMER_ID.eq(&self.customer_id),
        ])
    }
}

/// Why a subscription operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SubscriptionError {
    #[error("subscription {0} not found")]
    NotFound(SubscriptionId),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Terms(#[from] TermsError),
    #[error(transparent)]
    Interval(#[from] IntervalError),
    #[error("the subscription changed too often while being written; retry")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a new subscription is made of (checked by [`new_subscription`]).
#[derive(Clone, Debug)]
pub struct NewSubscription {
    pub customer_id: CustomerId,
    pub plan_id: PlanId,
    pub terms: Terms,
    pub reference_id: Option<String>,
    pub metadata: Map<String, Value>,
    /// When it starts (`startDate`; now when absent).
    pub start: Timestamp,
    /// The trial end as [`super::terms::trial_end`] chose it.
    pub trial_ends_at: Option<Timestamp>,
    pub billing_anchor_day: Option<u8>,
    pub dunning_policy_id: Option<DunningPolicyId>,
    pub test_clock_id: Option<TestClockId>,
}

/// The subscription `input` makes at `now`: a draft when it starts on a
/// later Nepal day, else started ([`SubscriptionEvent::Start`]).
pub fn new_subscription(
    tenant: &Tenant,
    input: NewSubscription,
    now: Timestamp,
) -> Result<Subscription, SubscriptionError> {
    input.terms.check()?;
    validate_interval(
        input.terms.interval_unit,
        input.terms.interval_count,
        input.billing_anchor_day,
    )?;
    let start_date = nepal_day(input.start);
    let mut sub = Subscription {
        id: SubscriptionId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        customer_id: input.customer_id,
        plan_id: input.plan_id,
        status: SubscriptionStatus::Draft,
        terms: input.terms,
        quantity: 1,
        reference_id: input.reference_id,
        metadata: input.metadata,
        start_date,
        billing_anchor_day: input.billing_anchor_day,
        trial_ends_at: input.trial_ends_at,
        billing_start: None,
        period_index: 0,
        cancel_at_period_end: false,
        cancel_reason: None,
        cancelled_at: None,
        pause_reason: None,
        paused_for_nonpayment: false,
        resume_at: None,
        dunning_policy_id: input.dunning_policy_id,
        test_clock_id: input.test_clock_id,
        next_due_at: None,
        trial_reminded_for: None,
        overdue_next: 0,
        pending_change: None,
        upcoming_for: None,
        has_items: false,
        grace_pending: Vec::new(),
        version: 1,
        created_at: now,
        updated_at: now,
        counted: true,
        narrowed: true,
    };
    if start_date <= nepal_day(now) {
        started(&mut sub)?;
    }
    Ok(sub.stamped())
}

/// Starts a draft: trialing until its trial end, else billing from its
/// start day.
pub fn started(sub: &mut Subscription) -> Result<(), Refusal> {
    let trial = sub.trial_ends_at.is_some();
    sub.status = next(sub.status, SubscriptionEvent::Start { trial })?;
    if !trial {
        sub.billing_start = Some(sub.start_date);
    }
    Ok(())
}

/// Stores a new subscription (with `next_due_at` set from its fields),
/// listing its tenant for the sweep, with its `subscription.created`
/// event in the same transaction.
pub async fn create(deps: &Deps, sub: &Subscription) -> Result<(), SubscriptionError> {
    create_with(deps, sub, Vec::new()).await?;
    Ok(())
}

/// Stores a new subscription with `with` in the same transaction (the
/// API's create adds its customer's `open_subscriptions` count and the
/// request's idempotency fence, in that order after the subscription's
/// own put, at index 0; the sweep's list entry, when written, comes after
/// them). The store's error is answered as it is, so the caller can tell
/// which op's condition failed.
pub async fn create_with(
    deps: &Deps,
    sub: &Subscription,
    with: Vec<TxOp>,
) -> Result<(), StoreError> {
    // The caller's ops keep their places after the subscription (a
    // fence's failure is found by its index); the listing, the event and
    // the list's counters come after them.
    let mut ops = write_ops(sub, None)?;
    let listed = ops.split_off(1);
    ops.extend(with);
    ops.extend(listed);
    ops.extend(subscription_event(EventType::SubscriptionCreated, sub, sub.created_at).put_ops()?);
    ops.extend(sub.counts_new());
    let mut tries = 0;
    loop {
        match deps.store.transact(ops.clone()).await {
            // A concurrent insert wrote a counter shard: nothing was
            // written, try again.
            Err(e) if crate::domain::listing::counted::is_conflict(&e) && tries < 10 => {
                tries += 1;
                crate::store::contention_backoff(tries).await;
            }
            done => return done,
        }
    }
}

/// The writes that store `sub` stamped ([`Subscription::stamped`]): a new
/// record when `seen` is `None` (its counts are [`Subscription::counts_new`]),
/// else the whole record conditioned on version `seen.version` and its list
/// marks as read; with the tenant's entry in the sweep's list when the
/// subscription enters the due index. THE write of every change of a
/// stored subscription: a status or plan change (its narrowed entries
/// from [`Record::entries`]) moves its narrowings' counts in the same
/// transaction (the counter writes come last).
pub(crate) fn write_ops(
    sub: &Subscription,
    seen: Option<&Subscription>,
) -> Result<Vec<TxOp>, StoreError> {
    let mut sub = sub.stamped();
    if let Some(current) = seen {
        sub.narrowed = current.narrowed;
    }
    let mut ops = vec![match seen {
        None => sub.put_new()?,
        // Its `counted` and `narrowed` still as read: a whole-record write
        // from an older read must not undo the lists migration's marks.
        Some(current) => TxOp::Put {
            item: sub.to_item()?,
            cond: Some(Cond::And(vec![
                Subscription::VERSION.eq(&current.version),
                current.listed_as_read(),
            ])),
        },
    }];
    let enters = sub.next_due_at.is_some() && seen.is_none_or(|s| s.next_due_at.is_none());
    if enters && sub.test_clock_id.is_none() {
        ops.push(due::listed(&sub.tenant(), sub.updated_at)?);
    }
    if let Some(current) = seen.filter(|c| c.narrowed) {
        let mut counts = Vec::new();
        for (from, to) in current.narrowings_now().iter().zip(sub.narrowings_now()) {
            merge_counts(
                &mut counts,
                from.count_moved(&to, &current.id, current.created_at),
            );
        }
        ops.extend(counts);
    }
    Ok(ops)
}

/// The writes that change `current` into `changed` (stamped, see
/// [`write_ops`]); one that ends the subscription also lowers its
/// customer's `open_subscriptions`. Every change of a stored subscription
/// ([`change`], the sweep's steps) is these ops.
pub(crate) async fn change_ops(
    store: &dyn Store,
    current: &Subscription,
    changed: &Subscription,
    event: Option<SubscriptionEvent>,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    let mut ops = write_ops(changed, Some(current))?;
    if changed.status.is_ended() && !current.status.is_ended() {
        ops.extend(release_customer(store, current).await?);
    }
    // The change's webhook: by its event when the caller names one, else
    // by the status it moved between (the sweep's steps).
    let webhook = match event {
        Some(e) => subscription_webhook(current.status, e, changed.status),
        None => status_webhook(current.status, changed.status),
    };
    if let Some(t) = webhook {
        ops.extend(subscription_event(t, changed, now).put_ops()?);
    }
    Ok(ops)
}

/// The tenant's subscription `id`.
pub async fn get(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
) -> Result<Subscription, SubscriptionError> {
    match record::get::<Subscription>(&*deps.store, &Subscription::key(id)).await? {
        Some(s) if tenant.owns(s.project_id.as_str(), s.mode) => Ok(s),
        _ => Err(SubscriptionError::NotFound(id.clone())),
    }
}

/// Applies `event` to the tenant's subscription `id` at `now`: the state
/// machine decides on the record as read, `edit` sets the event's fields
/// (a pause reason, a new trial end), and the write holds only if nobody
/// changed the subscription since; otherwise it is read and decided again.
/// The transition's webhook ([`subscription_webhook`]) is written in the
/// same transaction.
pub async fn apply(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    event: SubscriptionEvent,
    edit: &(dyn Fn(&mut Subscription) + Sync),
    now: Timestamp,
) -> Result<Subscription, SubscriptionError> {
    let decide = |current: &Subscription| -> Result<Subscription, SubscriptionError> {
        let mut changed = current.clone();
        changed.status = next(current.status, event)?;
        edit(&mut changed);
        Ok(changed)
    };
    change(deps, tenant, id, Some(event), &decide, now).await
}

/// Changes the tenant's subscription `id` at `now` as `decide` says on
/// the record as read (an event through [`apply`], or a field that is no
/// transition: the dunning policy), with the same version-conditioned
/// write and re-read as [`apply`]. A change that ends the subscription
/// lowers its customer's `open_subscriptions` in the same transaction.
pub async fn change(
    deps: &Deps,
    tenant: &Tenant,
    id: &SubscriptionId,
    event: Option<SubscriptionEvent>,
    decide: &(dyn Fn(&Subscription) -> Result<Subscription, SubscriptionError> + Sync),
    now: Timestamp,
) -> Result<Subscription, SubscriptionError> {
    for attempt in 0..APPLY_TRIES {
        let current = get(deps, tenant, id).await?;
        let mut changed = decide(&current)?;
        changed.version = current.version + 1;
        changed.updated_at = now;
        let changed = changed.stamped();
        let mut ops = change_ops(&*deps.store, &current, &changed, event, now).await?;
        if applied_pending(&current, &changed) {
            // A scheduled plan change the edit applied (a trial ended
            // now): `subscription.updated`, as the sweep sends it.
            ops.extend(super::changes::updated_event(&current, &changed, now).put_ops()?);
        }
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(changed),
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(SubscriptionError::Busy)
}

/// Whether `changed` is `current` with its scheduled plan change applied
/// (`changes::apply_pending`).
pub(crate) fn applied_pending(current: &Subscription, changed: &Subscription) -> bool {
    changed.pending_change.is_none()
        && current
            .pending_change
            .as_ref()
            .is_some_and(|p| changed.plan_id == p.plan_id && changed.terms == p.terms)
}

/// The op that lowers the customer's count of subscriptions not ended,
/// for the transaction that ends `sub`. None when the customer record is
/// not there (records made by tests and tools without one): a customer
/// with a subscription not ended cannot be deleted, so one that exists
/// now still exists when the transaction runs.
async fn release_customer(
    store: &dyn Store,
    sub: &Subscription,
) -> Result<Option<TxOp>, StoreError> {
    let key = Customer::key(&sub.tenant(), &sub.customer_id);
    if record::get::<Customer>(store, &key).await?.is_none() {
        return Ok(None);
    }
    let lower = Changes::<Customer>::new().subtract(Customer::OPEN_SUBSCRIPTIONS, 1);
    Ok(Some(TxOp::Update {
        key,
        update: lower.into(),
        cond: Some(Cond::Exists),
    }))
}

/// Another transaction wrote the same item at once (retry).
pub(super) fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::TransactionCanceled { reasons }
        if reasons.iter().any(|r| matches!(r, crate::store::TxReason::Conflict)))
}

#[cfg(test)]
mod tests;
