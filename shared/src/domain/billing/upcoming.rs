//! `invoice.upcoming` (issue 40): a few days before a subscription's next
//! invoice is issued ([`UPCOMING_BEFORE`]), when that invoice will carry
//! usage or one-off items, the merchant gets the draft of it.
//!
//! The moment is a step of the billing sweep (`sweep::Step::Upcoming`,
//! due at [`Subscription::upcoming_at`]); the step's write records the
//! period announced (`upcoming_for`) conditioned on the version read, and
//! the event is in that same transaction: of racing sweeps only the one
//! that wrote sends it, once per period. The draft is the invoice as
//! issuing would compose it now ([`adjust::draft`], `invoice_for`, the
//! same composition), read only and never stored.

use serde_json::Value;

use super::adjust;
use super::invoice::view::InvoiceView;
use super::invoice::{BillingInvoice, BillingInvoiceError, LineKind, invoice_for};
use super::subscription::Subscription;
pub use super::subscription::UPCOMING_BEFORE;
use crate::Deps;
use crate::domain::outbox::{Event, EventType};
use crate::time::Timestamp;

/// The draft of the invoice `sub` (as stored) will be issued when its
/// current period ends, as of `now`: the next period, with a plan change
/// scheduled for it applied, composed as issuing would. `None` when it
/// would carry neither usage nor items (no event then).
pub async fn draft(
    deps: &Deps,
    sub: &Subscription,
    now: Timestamp,
) -> Result<Option<BillingInvoice>, BillingInvoiceError> {
    let mut next = sub.clone();
    next.period_index += 1;
    let Some(period) = next.current_period() else {
        return Ok(None);
    };
    super::changes::apply_pending(&mut next, period.start);
    let adj = adjust::draft(deps, &next, period, now).await?;
    if !adj
        .lines
        .iter()
        .any(|l| matches!(l.kind, LineKind::Usage | LineKind::Item))
    {
        return Ok(None);
    }
    Ok(Some(invoice_for(&next, period, String::new(), now, &adj)?))
}

/// `data.object` of `invoice.upcoming`: the draft as an invoice's GET
/// answers an invoice, but `status: draft` and no `id`, `number`,
/// `payUrl` or `pdfUrl` (it is not an invoice yet).
pub fn draft_json(inv: &BillingInvoice, base: &str) -> Value {
    let mut v = InvoiceView::json(inv, base);
    if let Some(o) = v.as_object_mut() {
        o.insert("status".into(), Value::from("draft"));
        for field in ["id", "number", "payUrl", "pdfUrl"] {
            o.insert(field.into(), Value::Null);
        }
    }
    v
}

/// The `invoice.upcoming` event of the draft `inv`.
pub fn event(inv: &BillingInvoice, base: &str, now: Timestamp) -> Event {
    let tenant = crate::domain::Tenant::new(inv.project_id.clone(), inv.mode);
    Event::new(
        EventType::InvoiceUpcoming,
        &tenant,
        draft_json(inv, base),
        now,
    )
}

#[cfg(test)]
mod tests;
