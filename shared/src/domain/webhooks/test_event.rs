//! A signed test event of any type, sent to one endpoint on request.

use serde_json::{Value, json};

use super::endpoints::{WebhookError, get, invalid};
use crate::Deps;
use crate::domain::outbox::{Event, EventType};
use crate::domain::{Mode, Tenant};
use crate::ids::{self, EndpointId, IdKind};
use crate::time::Timestamp;

/// A sample object for a test event of type `t`.
pub(super) fn sample_object(t: EventType, mode: Mode, now: Timestamp) -> Value {
    let pay = format!("pay_test{}", &ids::new_id(IdKind::Payment)[4..]);
    let payment = |status: &str| {
        json!({
            "id": pay, "object": "payment", "amount": 150000, "currency": "NPR",
            "provider": "khalti", "status": status, "livemode": mode.is_live(),
            "createdAt": now, "test": true,
        })
    };
    match t {
        EventType::PaymentSucceeded => payment("success"),
        EventType::PaymentFailed => payment("failed"),
        EventType::PaymentCancelled => payment("cancelled"),
        EventType::PaymentRefunded => payment("refunded"),
        EventType::RefundSucceeded | EventType::RefundFailed => json!({
            "id": format!("ref_test{}", &ids::new_id(IdKind::Refund)[4..]),
            "object": "refund", "paymentId": pay, "amount": 50000, "currency": "NPR",
            "status": if t == EventType::RefundSucceeded { "succeeded" } else { "failed" },
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::PaymentLinkPaid => json!({
            "id": format!("lnk_test{}", &ids::new_id(IdKind::PaymentLink)[4..]),
            "object": "payment_link", "paymentId": pay, "title": "Test link",
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::InvoicePaid => json!({
            "id": format!("oinv_test{}", &ids::new_id(IdKind::Invoice)[4..]),
            "object": "invoice", "paymentId": pay, "total_amount": 150000,
            "amount_paid": 150000, "currency": "NPR", "collection_status": "paid",
            "livemode": mode.is_live(), "created_at": now, "test": true,
        }),
        t if t.is_subscription() => json!({
            "id": format!("sub_test{}", &ids::new_id(IdKind::Subscription)[4..]),
            "object": "subscription", "customerId": "cus_test", "planId": "bp_test",
            "status": subscription_status(t), "metadata": {},
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::CustomerCreditUpdated => json!({
            "id": format!("cus_test{}", &ids::new_id(IdKind::BillingCustomer)[4..]),
            "object": "billing_customer", "name": "Test customer", "creditBalance": 50000,
            "metadata": {}, "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::CouponCreated | EventType::CouponDeactivated => json!({
            "id": format!("cpn_test{}", &ids::new_id(IdKind::Coupon)[4..]),
            "code": "LAUNCH", "name": "Launch discount", "discountType": "percent",
            "percentOff": 50, "duration": "once", "redeemedCount": 0,
            "active": t == EventType::CouponCreated, "metadata": {},
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::ReconciliationCompleted => json!({
            "id": format!("rrun_test{}", &ids::new_id(IdKind::ReconRun)[5..]),
            "object": "reconciliation_run", "provider": "khalti", "date": "2026-11-20",
            "source": "pull", "status": "completed", "discrepancies": 1,
            "counts": {"matched": 9, "amountMismatch": 1, "feeMismatch": 0,
                "missingInProvider": 0, "missingInDhukuti": 0, "notOurs": 0},
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        EventType::PromotionCodeCreated | EventType::PromotionCodeDeactivated => json!({
            "id": format!("promo_test{}", &ids::new_id(IdKind::PromotionCode)[4..]),
            "code": "LAUNCH50", "couponId": "cpn_test", "redeemedCount": 0,
            "active": t == EventType::PromotionCodeCreated, "metadata": {},
            "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
        _ => json!({
            "id": format!("inv_test{}", &ids::new_id(IdKind::BillingInvoice)[4..]),
            "object": "billing_invoice", "number": "TEST-PI-000001",
            "subscriptionId": "sub_test", "customerId": "cus_test",
            "status": invoice_status(t), "total": 150000, "amountDue": 150000,
            "currency": "NPR", "livemode": mode.is_live(), "createdAt": now, "test": true,
        }),
    }
}

/// The subscription status a sample of `t` shows.
fn subscription_status(t: EventType) -> &'static str {
    match t {
        EventType::SubscriptionCreated
        | EventType::SubscriptionTrialWillEnd
        | EventType::SubscriptionTrialExtended => "trialing",
        EventType::SubscriptionPastDue => "past_due",
        EventType::SubscriptionPaused => "paused",
        EventType::SubscriptionCancelled => "cancelled",
        _ => "active",
    }
}

/// The billing invoice status a sample of `t` shows.
fn invoice_status(t: EventType) -> &'static str {
    match t {
        EventType::BillingInvoiceCreated => "open",
        EventType::InvoiceUpcoming => "draft",
        EventType::BillingInvoiceOverdue => "overdue",
        EventType::BillingInvoiceVoided => "void",
        EventType::BillingInvoiceUncollectible => "uncollectible",
        _ => "paid",
    }
}

/// Records a test event of type `t` for endpoint `id` only (whatever its
/// `events` filter says); it goes through the outbox like any event.
pub async fn send_test_event(
    state: &Deps,
    tenant: &Tenant,
    id: &EndpointId,
    t: EventType,
) -> Result<Event, WebhookError> {
    let endpoint = get(state, tenant, id).await?;
    if !endpoint.enabled {
        return Err(invalid(
            "id",
            "the endpoint is disabled; enable it to send a test event",
        ));
    }
    let now = state.clock.now();
    let mut event = Event::new(t, tenant, sample_object(t, tenant.mode, now), now);
    event.endpoint_id = Some(endpoint.id.clone());
    state.store.transact(event.put_ops()?).await?;
    Ok(event)
}
