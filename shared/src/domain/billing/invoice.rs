//! Billing invoices: their state machine ([`next_invoice`]), exactly one
//! invoice per (subscription, period), numbered from the project's
//! gapless `PI-` series, and paid exactly once.
//!
//! Storage:
//! - an invoice at `BINV#<id>` / `BINV`, listed per project and mode on
//!   `gsi1` (`PROJ#<project>#<mode>#BINV`, by id), and narrowed by
//!   status (`gsi4`), customer (`gsi3`) and subscription (`gsi5`)
//!   ([`narrowed`]: [`BillingInvoice::status_change`] is the one write of
//!   its status);
//! - the claim of a period at `SUB#<subscription>` / `PERIOD#<start>`
//!   (the period's first Nepal day), naming its invoice. [`issue_invoice`]
//!   writes the claim (only where none is), the invoice and the number
//!   counter in ONE transaction: two sweeps, a retried invocation and an
//!   API call racing for one period make one invoice and take one number,
//!   and a failed issue takes none (no gap in the series).
//!
//! A payment is decided by a write conditioned on the invoice's version
//! and on its status being payable: of two payments racing, one pays the
//! invoice; the other finds it paid and is recorded as an overpayment for
//! the caller to refund.

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::adjust::{self, Adjustments};
use super::compose::{self, DiscountTerms, TaxTerms};
use super::events::invoice_event;
use super::period::Period;
use super::subscription::{Subscription, is_conflict};
use super::terms::PricingModel;
use crate::Deps;
use crate::domain::invoices::{last_number, take_number};
use crate::domain::outbox::EventType;
use crate::domain::record::{self, Changes, Entry, Record};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{
    BillingInvoiceId, CustomerId, PaymentId, ProjectId, RefundId, SubscriptionId, UserId,
};
use crate::money::Currency;
use crate::store::{Cond, Key, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// The error code of a refused invoice transition (docs only until the
/// routes come).
pub const BILLING_INVOICE_STATE_CONFLICT: &str = "billing_invoice_state_conflict";

/// How often an issue or a payment re-reads what another writer moved,
/// and for how long at most (well within a Lambda's 15 s).
const TRIES: usize = 64;
const BUDGET: std::time::Duration = std::time::Duration::from_secs(8);

/// The SDK's `InvoiceStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BillingInvoiceStatus)]
pub enum InvoiceStatus {
    /// Not issued (one-off items before issue, issue 40); the engine
    /// issues invoices open.
    Draft,
    Open,
    Paid,
    /// Its grace period ended unpaid.
    Overdue,
    Void,
    Uncollectible,
}

impl InvoiceStatus {
    pub const ALL: [InvoiceStatus; 6] = [
        InvoiceStatus::Draft,
        InvoiceStatus::Open,
        InvoiceStatus::Paid,
        InvoiceStatus::Overdue,
        InvoiceStatus::Void,
        InvoiceStatus::Uncollectible,
    ];
    /// The statuses a payment can pay.
    pub const PAYABLE: [InvoiceStatus; 3] = [
        InvoiceStatus::Open,
        InvoiceStatus::Overdue,
        InvoiceStatus::Uncollectible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            InvoiceStatus::Draft => "draft",
            InvoiceStatus::Open => "open",
            InvoiceStatus::Paid => "paid",
            InvoiceStatus::Overdue => "overdue",
            InvoiceStatus::Void => "void",
            InvoiceStatus::Uncollectible => "uncollectible",
        }
    }
}

/// What happens to a billing invoice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvoiceEvent {
    Finalize,
    GraceEnded,
    Pay,
    Void,
    MarkUncollectible,
}

impl InvoiceEvent {
    pub const ALL: [InvoiceEvent; 5] = [
        InvoiceEvent::Finalize,
        InvoiceEvent::GraceEnded,
        InvoiceEvent::Pay,
        InvoiceEvent::Void,
        InvoiceEvent::MarkUncollectible,
    ];

    pub fn action(self) -> &'static str {
        match self {
            InvoiceEvent::Finalize => "be issued",
            InvoiceEvent::GraceEnded => "become overdue",
            InvoiceEvent::Pay => "be paid",
            InvoiceEvent::Void => "be voided",
            InvoiceEvent::MarkUncollectible => "be marked uncollectible",
        }
    }
}

/// A refused invoice transition ([`BILLING_INVOICE_STATE_CONFLICT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an invoice that is {} cannot {}", from.as_str(), event.action())]
pub struct InvoiceRefusal {
    pub from: InvoiceStatus,
    pub event: InvoiceEvent,
}

/// The billing invoice state machine.
pub fn next_invoice(
    from: InvoiceStatus,
    event: InvoiceEvent,
) -> Result<InvoiceStatus, InvoiceRefusal> {
    use InvoiceEvent as E;
    use InvoiceStatus as S;
    Ok(match (from, event) {
        (S::Draft, E::Finalize) => S::Open,
        (S::Open, E::GraceEnded) => S::Overdue,
        (S::Open | S::Overdue | S::Uncollectible, E::Pay) => S::Paid,
        (S::Draft | S::Open | S::Overdue, E::Void) => S::Void,
        (S::Open | S::Overdue, E::MarkUncollectible) => S::Uncollectible,
        _ => return Err(InvoiceRefusal { from, event }),
    })
}

/// What a line bills. A discount line and a proration credit are
/// negative; every other line is positive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineKind {
    /// The plan's price (times the quantity of a per-unit plan).
    Subscription,
    /// A metered plan's usage in the line's period.
    Usage,
    /// A one-off charge (a pending invoice item).
    Item,
    /// The unused time of the plan changed from (negative).
    ProrationCredit,
    /// The remaining time of the plan changed to.
    ProrationDebit,
    /// A coupon's discount (negative).
    Discount,
    /// VAT on the discounted amount.
    Tax,
}

impl LineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LineKind::Subscription => "subscription",
            LineKind::Usage => "usage",
            LineKind::Item => "item",
            LineKind::ProrationCredit => "proration_credit",
            LineKind::ProrationDebit => "proration_debit",
            LineKind::Discount => "discount",
            LineKind::Tax => "tax",
        }
    }
}

/// Why an invoice was issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvoiceKind {
    /// A period's invoice (exactly one per period, with its claim).
    #[default]
    Cycle,
    /// A plan or quantity change's net difference, due at once.
    Proration,
}

impl InvoiceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InvoiceKind::Cycle => "cycle",
            InvoiceKind::Proration => "proration",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceLine {
    pub kind: LineKind,
    pub description: String,
    /// Units (a usage line's total may pass `u32`: read as before).
    pub quantity: u64,
    /// Paisa, the line's total.
    pub amount: i64,
    pub period_start: NaiveDate,
    /// Exclusive.
    pub period_end: NaiveDate,
}

/// How money for an invoice was received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutOfBandMethod {
    Cash,
    BankDeposit,
}

/// Where a payment came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PaymentSource {
    /// A payment through a provider (the pay link or the QR).
    Online {
        payment_id: PaymentId,
        provider: Provider,
    },
    /// Recorded in the dashboard (audited by the caller).
    OutOfBand {
        method: OutOfBandMethod,
        /// The Nepal day the money was received.
        received_on: NaiveDate,
        reference: String,
        recorded_by: UserId,
    },
}

/// The payment that paid an invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement {
    pub source: PaymentSource,
    pub amount: i64,
    pub at: Timestamp,
}

/// Where the refund of an overpayment stands (refunds work as that
/// provider's refunds do; out-of-band money is returned by hand).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BillingOverpaymentRefund)]
pub enum OverpaymentRefund {
    /// Not yet asked of the provider.
    Pending,
    Processing,
    Succeeded,
    Failed,
    /// eSewa: the merchant completes it.
    RequiresAction,
    /// Fonepay or out-of-band: recorded for a manual refund.
    Manual,
    /// Not refunded: kept as the customer's credit (the tenant's
    /// `overpaymentHandling` is `credit`), applied to their next invoices.
    Credited,
}

/// A payment that arrived for an invoice already paid (or voided).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overpayment {
    pub source: PaymentSource,
    pub amount: i64,
    pub at: Timestamp,
    pub refund_status: OverpaymentRefund,
    pub refund_id: Option<RefundId>,
}

/// A stored billing invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BillingInvoice {
    pub id: BillingInvoiceId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub subscription_id: SubscriptionId,
    pub customer_id: CustomerId,
    /// From the project's one-time invoice series (`PI-` / `TEST-PI-`).
    pub number: String,
    pub status: InvoiceStatus,
    pub currency: Currency,
    pub lines: Vec<InvoiceLine>,
    /// The sum of the base lines (before discount and VAT).
    pub subtotal: i64,
    /// What the discount took off (positive).
    #[serde(default)]
    pub discount_total: i64,
    #[serde(default)]
    pub tax_total: i64,
    /// Taxable amount plus VAT.
    pub total: i64,
    /// The customer's credit this invoice took (positive).
    #[serde(default)]
    pub credit_applied: i64,
    /// Total less credit applied: what a payment must bring.
    pub amount_due: i64,
    pub amount_paid: i64,
    /// The discount it was issued with (a snapshot).
    #[serde(default)]
    pub discount: Option<DiscountTerms>,
    /// The VAT it was issued with (a snapshot: the legal record).
    #[serde(default)]
    pub tax: Option<TaxTerms>,
    #[serde(default)]
    pub kind: InvoiceKind,
    pub period_start: NaiveDate,
    /// Exclusive.
    pub period_end: NaiveDate,
    /// Due on the period's first day (billed in advance).
    pub due_date: NaiveDate,
    /// Overdue from this Nepal day if unpaid: due + `gracePeriodDays`.
    pub overdue_on: NaiveDate,
    pub payment: Option<Settlement>,
    pub overpayments: Vec<Overpayment>,
    pub issued_at: Timestamp,
    pub paid_at: Option<Timestamp>,
    pub voided_at: Option<Timestamp>,
    pub uncollectible_at: Option<Timestamp>,
    pub version: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Counted in its tenant's list counters (`listing::counted`): set at
    /// issue, or by `dhukuti-admin lists migrate`. Only ever updated by
    /// attribute after, so no write can undo the mark.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// In its narrowed lists (by status, customer and subscription:
    /// [`narrowed`]), entered and counted: set at issue, or by
    /// `dhukuti-admin lists migrate`. Its `gsi4` partition, read as
    /// whether it is there.
    #[serde(
        default,
        rename = "gsi4pk",
        deserialize_with = "crate::domain::listing::present",
        skip_serializing
    )]
    pub narrowed: bool,
}

crate::attrs! { BillingInvoice {
    ID: BillingInvoiceId = id,
    SUBSCRIPTION_ID: SubscriptionId = subscription_id,
    CUSTOMER_ID: CustomerId = customer_id,
    STATUS: InvoiceStatus = status,
    PAYMENT: Option<Settlement> = payment,
    OVERPAYMENTS: Vec<Overpayment> = overpayments,
    AMOUNT_PAID: i64 = amount_paid,
    PAID_AT: Option<Timestamp> = paid_at,
    VOIDED_AT: Option<Timestamp> = voided_at,
    UNCOLLECTIBLE_AT: Option<Timestamp> = uncollectible_at,
    VERSION: i64 = version,
    UPDATED_AT: Timestamp = updated_at,
    COUNTED: bool = counted,
    NARROWED: bool = narrowed as "gsi4pk",
} }

crate::domain::listing::counted::counted_per_tenant!(
    BillingInvoice,
    crate::domain::listing::counted::CountedKind::BillingInvoices,
    BillingInvoice::list_partition
);

impl BillingInvoice {
    /// Subtotal less discount: what VAT is charged on (`total - tax`).
    pub fn taxable_amount(&self) -> i64 {
        self.total - self.tax_total
    }

    pub fn key(id: &BillingInvoiceId) -> Key {
        Key::new(format!("BINV#{id}"), "BINV")
    }

    pub fn list_partition(tenant: &Tenant) -> String {
        format!("PROJ#{}#{}#BINV", tenant.project, tenant.mode.as_str())
    }
}

impl Record for BillingInvoice {
    fn item_key(&self) -> Key {
        BillingInvoice::key(&self.id)
    }

    fn entries(&self) -> Vec<Entry> {
        let mut out = vec![Entry::gsi1(
            BillingInvoice::list_partition(&self.tenant()),
            self.id.to_string(),
        )];
        if self.narrowed {
            out.extend(self.narrowed_entries());
        }
        out
    }
}

/// The claim of one period of one subscription (stored kind "billing
/// period claim"): written once, with its invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodClaim {
    pub subscription_id: SubscriptionId,
    pub period_start: NaiveDate,
    pub invoice_id: BillingInvoiceId,
}

impl PeriodClaim {
    pub fn key(subscription: &SubscriptionId, start: NaiveDate) -> Key {
        Key::new(format!("SUB#{subscription}"), format!("PERIOD#{start}"))
    }
}

impl Record for PeriodClaim {
    fn item_key(&self) -> Key {
        PeriodClaim::key(&self.subscription_id, self.period_start)
    }
}

/// Why a billing invoice operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BillingInvoiceError {
    #[error("billing invoice {0} not found")]
    NotFound(BillingInvoiceId),
    #[error(transparent)]
    Refused(#[from] InvoiceRefusal),
    #[error("a subscription that is {0} is not billed")]
    NotBillable(&'static str),
    #[error("amount must be the amount due, {expected} paisa; got {got}")]
    AmountMismatch { expected: i64, got: i64 },
    #[error("the amount of this subscription's invoice overflows")]
    Overflow,
    #[error("the invoice changed too often while being written; retry")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What [`issue_invoice`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub invoice: BillingInvoice,
    /// False: the period had its invoice already (answered as it is).
    pub created: bool,
}

/// The invoice of `sub` for `period` (one of its periods), numbered
/// `number`, issued at `now` with the adjustments `adj`: open, or paid
/// when credit or a discount leaves nothing to pay (no provider asked).
pub fn invoice_for(
    sub: &Subscription,
    period: Period,
    number: String,
    now: Timestamp,
    adj: &Adjustments,
) -> Result<BillingInvoice, BillingInvoiceError> {
    let t = &sub.terms;
    let mut base = Vec::with_capacity(adj.lines.len() + 1);
    if adj.flat_line {
        // A flat plan bills its amount whatever the quantity says.
        let quantity = match t.pricing_model {
            PricingModel::Flat => 1,
            PricingModel::PerUnit | PricingModel::Metered => sub.quantity,
        };
        let amount = t
            .amount
            .checked_mul(i64::from(quantity))
            .ok_or(BillingInvoiceError::Overflow)?;
        base.push(InvoiceLine {
            kind: LineKind::Subscription,
            description: t.description.clone(),
            quantity: u64::from(quantity),
            amount,
            period_start: period.start,
            period_end: period.end_exclusive,
        });
    }
    base.extend(adj.lines.iter().cloned());
    let c = compose::compose(
        base,
        (period.start, period.end_exclusive),
        adj.discount.as_ref(),
        adj.tax.as_ref(),
        adj.credit_available,
    )
    .map_err(|_| BillingInvoiceError::Overflow)?;
    let due_date = period.start;
    let settled = c.amount_due == 0;
    Ok(BillingInvoice {
        id: BillingInvoiceId::new(),
        project_id: sub.project_id.clone(),
        mode: sub.mode,
        subscription_id: sub.id.clone(),
        customer_id: sub.customer_id.clone(),
        number,
        status: if settled {
            InvoiceStatus::Paid
        } else {
            InvoiceStatus::Open
        },
        currency: t.currency,
        lines: c.lines,
        subtotal: c.subtotal,
        discount_total: c.discount_total,
        tax_total: c.tax_total,
        total: c.total,
        credit_applied: c.credit_applied,
        amount_due: c.amount_due,
        amount_paid: 0,
        discount: adj.discount.clone().filter(|_| c.discount_total > 0),
        tax: adj.tax.clone(),
        kind: InvoiceKind::Cycle,
        period_start: period.start,
        period_end: period.end_exclusive,
        due_date,
        overdue_on: t.overdue_on(due_date).unwrap_or(due_date),
        payment: None,
        overpayments: Vec::new(),
        issued_at: now,
        paid_at: settled.then_some(now),
        voided_at: None,
        uncollectible_at: None,
        version: 1,
        created_at: now,
        updated_at: now,
        counted: true,
        narrowed: true,
    })
}

/// Issues the invoice of `sub` for `period`, exactly once: the period's
/// claim, the invoice and the next number are one transaction. When the
/// period has its invoice already (another sweep, a retry, an API call),
/// answers that one with `created: false`.
pub async fn issue_invoice(
    deps: &Deps,
    sub: &Subscription,
    period: Period,
    now: Timestamp,
) -> Result<Issued, BillingInvoiceError> {
    use super::subscription::SubscriptionStatus as S;
    if sub.status.is_ended() || sub.status == S::Draft {
        return Err(BillingInvoiceError::NotBillable(sub.status.as_str()));
    }
    let store = &*deps.store;
    let tenant = sub.tenant();
    let claim_key = PeriodClaim::key(&sub.id, period.start);
    let started = std::time::Instant::now();
    for attempt in 0..TRIES {
        if started.elapsed() > BUDGET {
            break;
        }
        if let Some(claim) = record::get::<PeriodClaim>(store, &claim_key).await? {
            let invoice = get_invoice(deps, &tenant, &claim.invoice_id).await?;
            return Ok(Issued {
                invoice,
                created: false,
            });
        }
        let adj = adjust::gather(deps, sub, period, now).await?;
        let last = last_number(store, &tenant).await?;
        let (number, take) = take_number(&tenant, last);
        let invoice = invoice_for(sub, period, number, now, &adj)?;
        let claim = PeriodClaim {
            subscription_id: sub.id.clone(),
            period_start: period.start,
            invoice_id: invoice.id.clone(),
        };
        let mut ops = vec![claim.put_new()?, invoice.put_new()?, take];
        for hook in adj.hooks {
            ops.extend(hook(&invoice)?);
        }
        let base = deps.config.base_for(None);
        ops.extend(
            invoice_event(EventType::BillingInvoiceCreated, &invoice, &base, now).put_ops()?,
        );
        if invoice.status == InvoiceStatus::Paid {
            // Nothing to pay: paid at issue, no reminders; its subscription
            // moves as a payment moves it (a first invoice: `active`).
            ops.extend(
                invoice_event(EventType::BillingInvoicePaid, &invoice, &base, now).put_ops()?,
            );
            ops.extend(collect::subscription_paid_ops(store, &invoice, now).await?);
        } else {
            let notices = super::notice_due::NoticeSchedule::for_invoice(&invoice, sub, now);
            ops.push(notices.put_new()?);
        }
        // Counted in its list and narrowings (last: the claim's index
        // stays 0).
        ops.extend(invoice.insert_counts());
        match store.transact(ops).await {
            Ok(()) => {
                return Ok(Issued {
                    invoice,
                    created: true,
                });
            }
            // The claim was taken: the next pass answers its invoice. The
            // counter moved, or a conflicting write: read again.
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                if !claim_taken(&e) {
                    crate::store::contention_backoff(attempt).await;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingInvoiceError::Busy)
}

fn claim_taken(e: &StoreError) -> bool {
    matches!(e, StoreError::TransactionCanceled { reasons }
        if matches!(reasons.first(), Some(TxReason::ConditionFailed)))
}

/// The tenant's billing invoice `id`.
pub async fn get_invoice(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
) -> Result<BillingInvoice, BillingInvoiceError> {
    match record::get::<BillingInvoice>(&*deps.store, &BillingInvoice::key(id)).await? {
        Some(i) if tenant.owns(i.project_id.as_str(), i.mode) => Ok(i),
        _ => Err(BillingInvoiceError::NotFound(id.clone())),
    }
}

/// What a payment did to an invoice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PayOutcome {
    /// This payment paid the invoice.
    Paid(BillingInvoice),
    /// This very payment paid it before (a retried notification).
    AlreadyPaid(BillingInvoice),
    /// The invoice was paid (or voided) by something else: this payment is
    /// recorded as an overpayment, for the caller to refund.
    Overpayment(BillingInvoice),
}

/// Takes a payment of `amount` from `source` for the tenant's invoice
/// `id`. Exactly one payment pays an invoice: the write is conditioned on
/// the version read and a payable status; a payment that loses finds the
/// invoice paid and is recorded as an overpayment. The same source twice
/// answers as the first time. The write carries its webhook:
/// `billing_invoice.paid`, or for an overpayment (refunded as that
/// provider's refunds work) `billing_invoice.payment_refunded`. A payment
/// that pays it moves its subscription in the same write.
pub async fn pay_invoice(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    source: PaymentSource,
    amount: i64,
    now: Timestamp,
) -> Result<PayOutcome, BillingInvoiceError> {
    for attempt in 0..TRIES {
        let inv = get_invoice(deps, tenant, id).await?;
        let keeper = super::credit::overpayment_keeper(&*deps.store, &inv).await?;
        let (mut ops, outcome) = match plan_payment_with(
            &inv,
            &source,
            amount,
            Taken::Asked,
            keeper.as_ref(),
            &deps.config.base_for(None),
            now,
        )? {
            PayPlan::Told(outcome) => return Ok(outcome),
            PayPlan::Write(ops, outcome) => (ops, outcome),
        };
        // Its subscription moves in the same write, as an online
        // payment's settlement moves it (a first invoice: `active`).
        if let PayOutcome::Paid(_) = &outcome {
            ops.extend(collect::subscription_paid_ops(&*deps.store, &inv, now).await?);
        }
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(outcome),
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingInvoiceError::Busy)
}

/// Whether the money of a payment has moved already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Asked of the invoice (the dashboard's out-of-band payment): an
    /// amount other than the amount due, or an invoice that takes no
    /// payment, is refused.
    Asked,
    /// Received (a provider's payment succeeded): it is recorded whatever
    /// it is, paying the invoice when it can, else as an overpayment.
    Received,
}

/// What a payment does to an invoice as read.
#[derive(Clone, Debug, PartialEq)]
pub enum PayPlan {
    /// Nothing to write: this payment was taken before.
    Told(PayOutcome),
    /// The invoice's write, conditioned on the version read, with its
    /// webhook (`billing_invoice.paid`, or `.payment_refunded` for money
    /// recorded to refund), and the answer.
    Write(Vec<TxOp>, PayOutcome),
}

/// Decides a payment of `amount` from `source` for `inv` as read: pays it
/// when it is payable (and, when [`Taken::Asked`], of exactly the amount
/// due), else records an overpayment. The write holds only if nobody
/// changed the invoice since it was read.
pub fn plan_payment(
    inv: &BillingInvoice,
    source: &PaymentSource,
    amount: i64,
    taken: Taken,
    base: &str,
    now: Timestamp,
) -> Result<PayPlan, BillingInvoiceError> {
    plan_payment_with(inv, source, amount, taken, None, base, now)
}

/// [`plan_payment`], with `keeper`: the customer (as read) an overpayment
/// is kept for as credit (the tenant's `overpaymentHandling` is
/// `credit`; `super::credit::overpayment_keeper`). Then an overpayment
/// is `credited`, not refunded, and the same write adds it to their
/// balance (a ledger entry `overpayment`, conditioned on the balance
/// read): exactly once, as the invoice records its source.
pub fn plan_payment_with(
    inv: &BillingInvoice,
    source: &PaymentSource,
    amount: i64,
    taken: Taken,
    keeper: Option<&super::customers::Customer>,
    base: &str,
    now: Timestamp,
) -> Result<PayPlan, BillingInvoiceError> {
    if inv.payment.as_ref().is_some_and(|p| &p.source == source) {
        return Ok(PayPlan::Told(PayOutcome::AlreadyPaid(inv.clone())));
    }
    if inv.overpayments.iter().any(|o| &o.source == source) {
        return Ok(PayPlan::Told(PayOutcome::Overpayment(inv.clone())));
    }
    let (changes, outcome, moved) = match next_invoice(inv.status, InvoiceEvent::Pay) {
        Ok(paid) if amount == inv.amount_due => paying(inv, paid, source, amount, now),
        Ok(_) if taken == Taken::Asked => {
            return Err(BillingInvoiceError::AmountMismatch {
                expected: inv.amount_due,
                got: amount,
            });
        }
        Err(refusal)
            if taken == Taken::Asked
                && !matches!(inv.status, InvoiceStatus::Paid | InvoiceStatus::Void) =>
        {
            return Err(refusal.into());
        }
        // Paid or void already, or money that cannot pay it as it is.
        _ => overpaying(inv, source, amount, keeper.is_some(), now),
    };
    let version = BillingInvoice::VERSION.eq(&inv.version);
    let (cond, moved) = match moved {
        Some((cond, also)) => (Cond::And(vec![version, cond]), also),
        None => (version, Vec::new()),
    };
    let mut ops = vec![TxOp::Update {
        key: BillingInvoice::key(&inv.id),
        update: changes.into(),
        cond: Some(cond),
    }];
    crate::domain::listing::merge_counts(&mut ops, moved);
    let (t, changed) = match &outcome {
        PayOutcome::Paid(i) => (EventType::BillingInvoicePaid, i),
        PayOutcome::Overpayment(i) | PayOutcome::AlreadyPaid(i) => {
            (EventType::BillingInvoicePaymentRefunded, i)
        }
    };
    ops.extend(invoice_event(t, changed, base, now).put_ops()?);
    // An overpayment to refund through the provider: the sweep asks it
    // should the call after this transaction never happen.
    if let (PayOutcome::Overpayment(i), Some(customer)) = (&outcome, keeper) {
        if amount > 0 {
            let grant = super::credit::Grant {
                amount,
                reason: super::credit::CreditReason::Overpayment,
                note: Some(format!("Overpayment of invoice {}", i.number)),
                actor: super::credit::CreditActor::System,
                invoice_id: Some(i.id.clone()),
            };
            let granted = super::credit::grant_ops(customer, grant, now).map_err(|e| match e {
                super::customers::BillingError::Store(e) => BillingInvoiceError::Store(e),
                _ => BillingInvoiceError::Overflow,
            })?;
            ops.extend(granted.ops);
        }
    }
    if let (PayOutcome::Overpayment(i), PaymentSource::Online { payment_id, .. }) =
        (&outcome, source)
    {
        let pending = i
            .overpayments
            .iter()
            .any(|o| &o.source == source && o.refund_status == OverpaymentRefund::Pending);
        if pending {
            ops.push(refund_due::put_op(i, payment_id, now)?);
        }
    }
    Ok(PayPlan::Write(ops, outcome))
}

/// A status change's condition (beside the version's) and counter
/// writes ([`BillingInvoice::status_change`]).
type Moved = Option<(Cond, Vec<TxOp>)>;

/// The changes that pay `inv` with `source`, the answer, and the status
/// change's condition and counter writes.
fn paying(
    inv: &BillingInvoice,
    paid: InvoiceStatus,
    source: &PaymentSource,
    amount: i64,
    now: Timestamp,
) -> (Changes<BillingInvoice>, PayOutcome, Moved) {
    let mut next = inv.clone();
    next.status = paid;
    next.payment = Some(Settlement {
        source: source.clone(),
        amount,
        at: now,
    });
    next.amount_paid = amount;
    next.paid_at = Some(now);
    next.version += 1;
    next.updated_at = now;
    let change = inv.status_change(next.status);
    let changes = change
        .changes
        .set(BillingInvoice::PAYMENT, &next.payment)
        .set(BillingInvoice::AMOUNT_PAID, &next.amount_paid)
        .set(BillingInvoice::PAID_AT, &next.paid_at)
        .set(BillingInvoice::VERSION, &next.version)
        .set(BillingInvoice::UPDATED_AT, &next.updated_at);
    (
        changes,
        PayOutcome::Paid(next),
        Some((change.cond, change.also)),
    )
}

/// The changes that record `source` as an overpayment of `inv`.
fn overpaying(
    inv: &BillingInvoice,
    source: &PaymentSource,
    amount: i64,
    kept: bool,
    now: Timestamp,
) -> (Changes<BillingInvoice>, PayOutcome, Moved) {
    let refund_status = match source {
        _ if kept && amount > 0 => OverpaymentRefund::Credited,
        PaymentSource::Online {
            provider: Provider::Fonepay,
            ..
        }
        | PaymentSource::OutOfBand { .. } => OverpaymentRefund::Manual,
        PaymentSource::Online { .. } => OverpaymentRefund::Pending,
    };
    let mut next = inv.clone();
    next.overpayments.push(Overpayment {
        source: source.clone(),
        amount,
        at: now,
        refund_status,
        refund_id: None,
    });
    next.version += 1;
    next.updated_at = now;
    let changes = Changes::new()
        .set(BillingInvoice::OVERPAYMENTS, &next.overpayments)
        .set(BillingInvoice::VERSION, &next.version)
        .set(BillingInvoice::UPDATED_AT, &next.updated_at);
    (changes, PayOutcome::Overpayment(next), None)
}

/// An out-of-band payment (cash, a bank deposit) of the full amount due,
/// recorded by a dashboard user. It races an online payment as any
/// payment does: one pays the invoice, the other is an overpayment.
#[derive(Clone, Debug)]
pub struct OutOfBand {
    pub method: OutOfBandMethod,
    pub received_on: NaiveDate,
    pub reference: String,
    pub recorded_by: UserId,
    pub amount: i64,
}

pub async fn record_out_of_band_payment(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    payment: OutOfBand,
    now: Timestamp,
) -> Result<PayOutcome, BillingInvoiceError> {
    let source = PaymentSource::OutOfBand {
        method: payment.method,
        received_on: payment.received_on,
        reference: payment.reference,
        recorded_by: payment.recorded_by,
    };
    pay_invoice(deps, tenant, id, source, payment.amount, now).await
}

/// Voids the tenant's invoice `id` (draft, open or overdue).
pub async fn void(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    now: Timestamp,
) -> Result<BillingInvoice, BillingInvoiceError> {
    transition(deps, tenant, id, InvoiceEvent::Void, now).await
}

/// Writes the tenant's invoice `id` off (open or overdue).
pub async fn mark_uncollectible(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    now: Timestamp,
) -> Result<BillingInvoice, BillingInvoiceError> {
    transition(deps, tenant, id, InvoiceEvent::MarkUncollectible, now).await
}

/// Marks the tenant's open invoice `id` overdue (its grace period ended).
pub async fn mark_overdue(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    now: Timestamp,
) -> Result<BillingInvoice, BillingInvoiceError> {
    transition(deps, tenant, id, InvoiceEvent::GraceEnded, now).await
}

/// Applies `event` (not a payment) with a version-conditioned write and
/// its webhook (`billing_invoice.voided`, `.uncollectible`, `.overdue`) in
/// the same transaction.
async fn transition(
    deps: &Deps,
    tenant: &Tenant,
    id: &BillingInvoiceId,
    event: InvoiceEvent,
    now: Timestamp,
) -> Result<BillingInvoice, BillingInvoiceError> {
    for attempt in 0..TRIES {
        let mut inv = get_invoice(deps, tenant, id).await?;
        let seen = inv.version;
        let to = next_invoice(inv.status, event)?;
        let change = inv.status_change(to);
        inv.status = to;
        inv.version += 1;
        inv.updated_at = now;
        let mut changes = change
            .changes
            .set(BillingInvoice::VERSION, &inv.version)
            .set(BillingInvoice::UPDATED_AT, &inv.updated_at);
        match event {
            InvoiceEvent::Void => {
                inv.voided_at = Some(now);
                changes = changes.set(BillingInvoice::VOIDED_AT, &inv.voided_at);
            }
            InvoiceEvent::MarkUncollectible => {
                inv.uncollectible_at = Some(now);
                changes = changes.set(BillingInvoice::UNCOLLECTIBLE_AT, &inv.uncollectible_at);
            }
            _ => {}
        }
        let t = match event {
            InvoiceEvent::Void => Some(EventType::BillingInvoiceVoided),
            InvoiceEvent::MarkUncollectible => Some(EventType::BillingInvoiceUncollectible),
            InvoiceEvent::GraceEnded => Some(EventType::BillingInvoiceOverdue),
            InvoiceEvent::Finalize | InvoiceEvent::Pay => None,
        };
        let mut ops = vec![TxOp::Update {
            key: BillingInvoice::key(id),
            update: changes.into(),
            cond: Some(Cond::And(vec![
                BillingInvoice::VERSION.eq(&seen),
                change.cond,
            ])),
        }];
        crate::domain::listing::merge_counts(&mut ops, change.also);
        if let Some(t) = t {
            let base = deps.config.base_for(None);
            ops.extend(invoice_event(t, &inv, &base, now).put_ops()?);
        }
        match deps.store.transact(ops).await {
            Ok(()) => return Ok(inv),
            Err(e) if e.is_condition_failure() || is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingInvoiceError::Busy)
}

pub mod collect;
pub mod narrowed;
#[cfg(feature = "pdf")]
pub mod pdf;
pub mod refund_due;
pub mod view;

/// The deep pages of its counted list (a `tests.rs` of its own).
#[cfg(test)]
mod deep {
    mod tests;
}

#[cfg(test)]
mod tests;
