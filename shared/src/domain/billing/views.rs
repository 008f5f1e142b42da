//! Subscriptions and billing invoices as the API answers them (camelCase,
//! as the SDK reads them): what their GET routes answer and what their
//! webhook events carry as `data.object`, one definition for both.

use chrono::NaiveDate;
use serde::Serialize;
use serde_json::{Map, Value};

use super::invoice::{BillingInvoice, InvoiceLine, Overpayment, PaymentSource, Settlement};
use super::period::{Calendar, IntervalUnit};
use super::subscription::Subscription;
use crate::time::Timestamp;

/// A subscription as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingSubscription)]
pub struct SubscriptionView {
    /// `sub_…`.
    pub id: String,
    /// Always `subscription`.
    #[schema(value_type = String)]
    pub object: &'static str,
    pub livemode: bool,
    pub customer_id: String,
    pub plan_id: String,
    /// The SDK's `SubscriptionStatus`.
    #[schema(value_type = String)]
    pub status: &'static str,
    pub quantity: u32,
    pub reference_id: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// Paisa per period (the plan's price when the subscription was made).
    pub amount: i64,
    #[schema(value_type = String)]
    pub currency: &'static str,
    #[schema(value_type = String, pattern = "^(day|week|month|quarter|year)$")]
    pub interval_unit: IntervalUnit,
    pub interval_count: u32,
    #[schema(value_type = String, pattern = "^(ad|bs)$")]
    pub calendar: Calendar,
    /// The Nepal day it starts.
    #[schema(value_type = String, format = Date)]
    pub start_date: NaiveDate,
    pub billing_anchor_day: Option<u8>,
    pub trial_ends_at: Option<Timestamp>,
    /// The current period's first Nepal day, once billing has begun.
    #[schema(value_type = Option<String>, format = Date)]
    pub current_period_start: Option<NaiveDate>,
    /// The day after the current period's last day.
    #[schema(value_type = Option<String>, format = Date)]
    pub current_period_end: Option<NaiveDate>,
    pub cancel_at_period_end: bool,
    pub cancel_reason: Option<String>,
    pub cancelled_at: Option<Timestamp>,
    pub pause_reason: Option<String>,
    pub resume_at: Option<Timestamp>,
    /// `null`: the project's default policy.
    pub dunning_policy_id: Option<String>,
    pub test_clock_id: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl SubscriptionView {
    pub fn of(s: &Subscription) -> Self {
        let period = s.current_period();
        SubscriptionView {
            id: s.id.to_string(),
            object: "subscription",
            livemode: s.mode.is_live(),
            customer_id: s.customer_id.to_string(),
            plan_id: s.plan_id.to_string(),
            status: s.status.as_str(),
            quantity: s.quantity,
            reference_id: s.reference_id.clone(),
            metadata: s.metadata.clone(),
            amount: s.terms.amount,
            currency: "NPR",
            interval_unit: s.terms.interval_unit,
            interval_count: s.terms.interval_count,
            calendar: s.terms.calendar,
            start_date: s.start_date,
            billing_anchor_day: s.billing_anchor_day,
            trial_ends_at: s.trial_ends_at,
            current_period_start: period.map(|p| p.start),
            current_period_end: period.map(|p| p.end_exclusive),
            cancel_at_period_end: s.cancel_at_period_end,
            cancel_reason: s.cancel_reason.clone(),
            cancelled_at: s.cancelled_at,
            pause_reason: s.pause_reason.clone(),
            resume_at: s.resume_at,
            dunning_policy_id: s.dunning_policy_id.as_ref().map(ToString::to_string),
            test_clock_id: s.test_clock_id.as_ref().map(ToString::to_string),
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }

    /// The view as JSON (an event's `data.object`).
    pub fn json(s: &Subscription) -> Value {
        serde_json::to_value(SubscriptionView::of(s)).unwrap_or(Value::Null)
    }
}

/// A billing invoice as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingInvoice)]
pub struct BillingInvoiceView {
    /// `inv_…`.
    pub id: String,
    /// Always `billing_invoice`.
    #[schema(value_type = String)]
    pub object: &'static str,
    pub livemode: bool,
    /// From the project's one invoice series (`PI-…` / `TEST-PI-…`).
    pub number: String,
    pub subscription_id: String,
    pub customer_id: String,
    /// The SDK's `InvoiceStatus`.
    #[schema(value_type = String)]
    pub status: &'static str,
    #[schema(value_type = String)]
    pub currency: &'static str,
    #[schema(value_type = Vec<Object>)]
    pub lines: Vec<Value>,
    /// Paisa.
    pub subtotal: i64,
    pub total: i64,
    pub amount_due: i64,
    pub amount_paid: i64,
    #[schema(value_type = String, format = Date)]
    pub period_start: NaiveDate,
    /// The day after the period's last day.
    #[schema(value_type = String, format = Date)]
    pub period_end: NaiveDate,
    #[schema(value_type = String, format = Date)]
    pub due_date: NaiveDate,
    /// Overdue from this Nepal day if unpaid.
    #[schema(value_type = String, format = Date)]
    pub overdue_on: NaiveDate,
    /// The payment that paid it.
    #[schema(value_type = Option<Object>)]
    pub payment: Option<Value>,
    /// Payments that arrived after it was paid (or voided), and their
    /// refunds.
    #[schema(value_type = Vec<Object>)]
    pub overpayments: Vec<Value>,
    pub issued_at: Timestamp,
    pub paid_at: Option<Timestamp>,
    pub voided_at: Option<Timestamp>,
    pub uncollectible_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl BillingInvoiceView {
    pub fn of(i: &BillingInvoice) -> Self {
        BillingInvoiceView {
            id: i.id.to_string(),
            object: "billing_invoice",
            livemode: i.mode.is_live(),
            number: i.number.clone(),
            subscription_id: i.subscription_id.to_string(),
            customer_id: i.customer_id.to_string(),
            status: i.status.as_str(),
            currency: "NPR",
            lines: i.lines.iter().map(line).collect(),
            subtotal: i.subtotal,
            total: i.total,
            amount_due: i.amount_due,
            amount_paid: i.amount_paid,
            period_start: i.period_start,
            period_end: i.period_end,
            due_date: i.due_date,
            overdue_on: i.overdue_on,
            payment: i.payment.as_ref().map(settlement),
            overpayments: i.overpayments.iter().map(overpayment).collect(),
            issued_at: i.issued_at,
            paid_at: i.paid_at,
            voided_at: i.voided_at,
            uncollectible_at: i.uncollectible_at,
            created_at: i.created_at,
            updated_at: i.updated_at,
        }
    }

    /// The view as JSON (an event's `data.object`).
    pub fn json(i: &BillingInvoice) -> Value {
        serde_json::to_value(BillingInvoiceView::of(i)).unwrap_or(Value::Null)
    }
}

fn line(l: &InvoiceLine) -> Value {
    serde_json::json!({
        "kind": l.kind,
        "description": l.description,
        "quantity": l.quantity,
        "amount": l.amount,
        "periodStart": l.period_start,
        "periodEnd": l.period_end,
    })
}

/// Where money came from, camelCase: `{kind: "online", paymentId,
/// provider}` or `{kind: "out_of_band", method, receivedOn, reference}`.
fn source(s: &PaymentSource) -> Value {
    match s {
        PaymentSource::Online {
            payment_id,
            provider,
        } => serde_json::json!({
            "kind": "online", "paymentId": payment_id.to_string(), "provider": provider,
        }),
        PaymentSource::OutOfBand {
            method,
            received_on,
            reference,
            recorded_by,
        } => serde_json::json!({
            "kind": "out_of_band", "method": method, "receivedOn": received_on,
            "reference": reference, "recordedBy": recorded_by.to_string(),
        }),
    }
}

fn settlement(s: &Settlement) -> Value {
    serde_json::json!({"source": source(&s.source), "amount": s.amount, "at": s.at})
}

fn overpayment(o: &Overpayment) -> Value {
    serde_json::json!({
        "source": source(&o.source),
        "amount": o.amount,
        "at": o.at,
        "refundStatus": o.refund_status,
        "refundId": o.refund_id.as_ref().map(ToString::to_string),
    })
}
