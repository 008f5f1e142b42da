//! What changes an invoice beyond its subscription's price (issue 40): a
//! discount, VAT, customer credit, usage and one-off items. [`gather`]
//! reads them for one issue; `invoice::issue_invoice` composes the invoice
//! from them (`compose`) and writes every [`Hook`]'s operations in the
//! invoice's own transaction.
//!
//! A hook's operations are conditioned on what `gather` read (an item
//! still pending, a credit balance unchanged, a discount's cycles
//! unchanged): a write racing the issue makes the whole issue fail and
//! retry from a new `gather`, so nothing is consumed twice or lost.

use super::compose::{DiscountTerms, TaxTerms};
use super::invoice::{BillingInvoice, BillingInvoiceError, InvoiceLine};
use super::period::Period;
use super::subscription::Subscription;
use crate::Deps;
use crate::store::{StoreError, TxOp};
use crate::time::Timestamp;

/// Operations written with the invoice, given the invoice as composed.
pub type Hook = Box<dyn FnOnce(&BillingInvoice) -> Result<Vec<TxOp>, StoreError> + Send>;

/// What one issue of one period's invoice takes into account.
pub struct Adjustments {
    /// Base lines beyond the subscription's price (usage, items).
    pub lines: Vec<InvoiceLine>,
    /// Whether the price x quantity line is billed (false: a metered plan,
    /// whose price is per unit of usage).
    pub flat_line: bool,
    pub discount: Option<DiscountTerms>,
    pub tax: Option<TaxTerms>,
    /// The customer's credit balance (paisa, `>= 0`).
    pub credit_available: i64,
    pub hooks: Vec<Hook>,
}

impl Default for Adjustments {
    fn default() -> Self {
        Adjustments {
            lines: Vec::new(),
            flat_line: true,
            discount: None,
            tax: None,
            credit_available: 0,
            hooks: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Adjustments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adjustments")
            .field("lines", &self.lines)
            .field("flat_line", &self.flat_line)
            .field("discount", &self.discount)
            .field("tax", &self.tax)
            .field("credit_available", &self.credit_available)
            .field("hooks", &self.hooks.len())
            .finish()
    }
}

/// Reads what the invoice of `sub` for `period` takes into account, as of
/// `now`. Each capability adds its part here.
pub async fn gather(
    deps: &Deps,
    sub: &Subscription,
    period: Period,
    now: Timestamp,
) -> Result<Adjustments, BillingInvoiceError> {
    let mut adj = Adjustments {
        flat_line: sub.terms.pricing_model != super::terms::PricingModel::Metered,
        ..Adjustments::default()
    };
    // Coupons: the active discount, one cycle consumed with the invoice.
    let (discount, hook) = super::discounts::for_issue(deps, sub, now).await?;
    adj.discount = discount;
    adj.hooks.extend(hook);
    // VAT (`tax`) and the customer's credit (`credit`).
    let tenant = sub.tenant();
    adj.tax = super::tax::invoice_terms(deps, &tenant).await?;
    let (credit, hook) =
        super::credit::invoice_credit(deps, &tenant, &sub.customer_id, now).await?;
    adj.credit_available = credit;
    adj.hooks.extend(hook);
    // Usage (in arrears: sealed, then read) and pending one-off items.
    adj.lines
        .extend(super::usage::usage_line(deps, sub, period, now).await?);
    let (items, consume) = super::items::item_lines(deps, &sub.id, period, now).await?;
    adj.lines.extend(items);
    adj.hooks.extend(consume);
    Ok(adj)
}

/// What the invoice of `sub` for `period` would take into account if it
/// were issued at `now`, reading only: [`gather`] without its hooks and
/// without moving the usage seal (`invoice.upcoming`'s draft,
/// `billing::upcoming`).
pub async fn draft(
    deps: &Deps,
    sub: &Subscription,
    period: Period,
    now: Timestamp,
) -> Result<Adjustments, BillingInvoiceError> {
    let mut adj = Adjustments {
        flat_line: sub.terms.pricing_model != super::terms::PricingModel::Metered,
        ..Adjustments::default()
    };
    let (discount, _) = super::discounts::for_issue(deps, sub, now).await?;
    adj.discount = discount;
    let tenant = sub.tenant();
    adj.tax = super::tax::invoice_terms(deps, &tenant).await?;
    let (credit, _) = super::credit::invoice_credit(deps, &tenant, &sub.customer_id, now).await?;
    adj.credit_available = credit;
    adj.lines
        .extend(super::usage::draft_line(deps, sub, period).await?);
    let (items, _) = super::items::item_lines(deps, &sub.id, period, now).await?;
    adj.lines.extend(items);
    Ok(adj)
}
