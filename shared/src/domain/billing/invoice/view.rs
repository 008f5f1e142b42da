//! A billing invoice as the API answers it (camelCase, as the SDK reads
//! it), and its lists (`status`, `customerId`, `subscriptionId`, `search`;
//! page-based as the other billing lists).
//!
//! A list reads the narrowest of its counted lists ([`super::narrowed`]):
//! a subscription's, else a customer's, else a status's, else the whole
//! list. One filter: any page at a bounded cost, the total from the
//! counters. Two or three: the narrowest read through with a filter
//! expression for the others, while it holds at most [`MAX_WINDOW`]
//! invoices (its counters say); past that a 400 naming the other filter.
//! A search: the matches among the newest [`SEARCH_SCAN`] of the
//! narrowest, the other filters applied to them. A tenant whose older
//! invoices are not narrowed yet (`dhukuti-admin lists migrate`) is read
//! as before: the whole list filtered, within `page * limit` <= 10,000.

use chrono::NaiveDate;
use serde::Serialize;

use super::{
    BillingInvoice, InvoiceLine, InvoiceStatus, Overpayment, OverpaymentRefund, PaymentSource,
};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::billing::calendar::{bs_from_ad, miti_latin};
use crate::domain::billing::customers::{
    BillingError, MAX_SEARCH, MAX_WINDOW, PageRequest, SEARCH_SCAN, invalid,
};
use crate::domain::listing::counted::{self, CountedKind, CountedList, Narrowing};
use crate::domain::record::{Window, from_item};
use crate::ids::{CustomerId, SubscriptionId};
use crate::money::Currency;
use crate::store::{Cond, Index, Query, Store};
use crate::time::Timestamp;

/// A day as the API writes it, with its Bikram Sambat date (Miti).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingDay)]
pub struct Day {
    /// `YYYY-MM-DD`, a day in Nepal.
    pub ad: String,
    /// `2081 Shrawan 15`; `null` outside the calendar's years.
    pub bs: Option<String>,
}

impl Day {
    pub fn of(d: NaiveDate) -> Day {
        Day {
            ad: d.to_string(),
            bs: bs_from_ad(d).map(miti_latin),
        }
    }
}

/// One line of an invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingInvoiceLine)]
pub struct LineView {
    /// `subscription`, `usage`, `item`, `proration_credit` (negative),
    /// `proration_debit`, `discount` (negative) or `tax`.
    #[schema(
        pattern = "^(subscription|usage|item|proration_credit|proration_debit|discount|tax)$"
    )]
    pub kind: String,
    pub description: String,
    pub quantity: u64,
    /// Paisa.
    pub amount: i64,
    pub period_start: String,
    /// Exclusive.
    pub period_end: String,
}

/// The payment that paid an invoice, or one that came after (an
/// overpayment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingInvoicePayment)]
pub struct PaymentView {
    /// `online` (the pay page, the QR) or `out_of_band` (cash, bank
    /// deposit, recorded in the dashboard).
    pub kind: String,
    /// `pay_…` for an online payment.
    pub payment_id: Option<String>,
    /// `esewa`, `khalti`, `fonepay`; `cash` or `bank_deposit` out of band.
    pub method: String,
    pub amount: i64,
    pub at: Timestamp,
    /// Out of band: the day received and the reference.
    pub received_on: Option<String>,
    pub reference: Option<String>,
}

/// A payment that arrived for an invoice already paid (or void), and its
/// refund.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingInvoiceOverpayment)]
pub struct OverpaymentView {
    #[serde(flatten)]
    pub payment: PaymentView,
    /// `pending`, `processing`, `succeeded`, `failed`, `requires_action`
    /// (eSewa: the merchant completes it) or `manual` (Fonepay or out of
    /// band: refunded by hand).
    pub refund_status: OverpaymentRefund,
    /// `ref_…` once asked of the provider.
    pub refund_id: Option<String>,
}

/// A billing invoice (`inv_…`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingInvoice)]
pub struct InvoiceView {
    pub id: String,
    pub livemode: bool,
    /// From the project's one invoice series: `PI-…`, `TEST-PI-…`.
    pub number: String,
    pub subscription_id: String,
    pub customer_id: String,
    pub status: InvoiceStatus,
    /// `cycle` (a period's invoice) or `proration` (a plan or quantity
    /// change's net difference, due at once).
    #[schema(pattern = "^(cycle|proration)$")]
    pub kind: String,
    /// Paisa: the invoice's total (`taxableAmount + taxTotal`).
    pub amount: i64,
    /// The sum of the lines before discount and VAT.
    pub subtotal: i64,
    /// What the discount took off (positive).
    pub discount_total: i64,
    /// Subtotal less discount: what VAT is charged on.
    pub taxable_amount: i64,
    pub tax_total: i64,
    pub total: i64,
    /// The customer's credit this invoice took (positive).
    pub credit_applied: i64,
    /// `total - creditApplied`: what a payment brings.
    pub amount_due: i64,
    pub amount_paid: i64,
    /// The VAT rate it was issued with (basis points; 0 without VAT): a
    /// snapshot, whatever the tax settings say now.
    pub tax_rate_bps: u32,
    /// The seller's PAN/VAT number it was issued with.
    pub tax_registration_number: Option<String>,
    /// The coupon whose discount it carries.
    pub coupon_id: Option<String>,
    /// The Nepali fiscal year of its issue date in Nepal (from 1
    /// Shrawan): `2082/83`; `null` outside the calendar's years.
    pub fiscal_year: Option<String>,
    pub currency: Currency,
    pub lines: Vec<LineView>,
    /// The first Nepal day billed, `YYYY-MM-DD`.
    pub period_start: String,
    /// The day after the last billed (exclusive).
    pub period_end: String,
    /// The Nepal day it is due (the period's first: billed in advance).
    pub due_date: String,
    /// The start of the due day in Nepal (00:00 +05:45).
    pub due_at: Timestamp,
    /// The due day with its Miti.
    pub due: Day,
    /// Overdue from this Nepal day if unpaid.
    pub overdue_on: String,
    /// The hosted bill page: amount, period, due date, the provider
    /// picker and the PDF. No key needed.
    pub pay_url: String,
    /// The invoice's PDF (`GET /v1/billing/invoices/{id}/pdf`, with a
    /// key that may read billing).
    pub pdf_url: String,
    pub payment: Option<PaymentView>,
    pub overpayments: Vec<OverpaymentView>,
    pub issued_at: Timestamp,
    pub paid_at: Option<Timestamp>,
    pub voided_at: Option<Timestamp>,
    pub uncollectible_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

fn payment_view(source: &PaymentSource, amount: i64, at: Timestamp) -> PaymentView {
    match source {
        PaymentSource::Online {
            payment_id,
            provider,
        } => PaymentView {
            kind: "online".into(),
            payment_id: Some(payment_id.to_string()),
            method: provider.as_str().into(),
            amount,
            at,
            received_on: None,
            reference: None,
        },
        PaymentSource::OutOfBand {
            method,
            received_on,
            reference,
            ..
        } => PaymentView {
            kind: "out_of_band".into(),
            payment_id: None,
            method: serde_json::to_value(method)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            amount,
            at,
            received_on: Some(received_on.to_string()),
            reference: Some(reference.clone()),
        },
    }
}

fn line_view(l: &InvoiceLine) -> LineView {
    LineView {
        kind: l.kind.as_str().to_owned(),
        description: l.description.clone(),
        quantity: l.quantity,
        amount: l.amount,
        period_start: l.period_start.to_string(),
        period_end: l.period_end.to_string(),
    }
}

fn overpayment_view(o: &Overpayment) -> OverpaymentView {
    OverpaymentView {
        payment: payment_view(&o.source, o.amount, o.at),
        refund_status: o.refund_status,
        refund_id: o.refund_id.as_ref().map(ToString::to_string),
    }
}

/// The start of Nepal day `d` (00:00 at +05:45).
pub fn start_of_nepal_day(d: NaiveDate) -> Timestamp {
    let utc = d
        .and_hms_opt(0, 0, 0)
        .unwrap_or_default()
        .and_utc()
        .checked_sub_signed(chrono::Duration::minutes(5 * 60 + 45))
        .unwrap_or_default();
    Timestamp::from_datetime(utc)
}

impl InvoiceView {
    /// The view as JSON (a webhook event's `data.object`).
    pub fn json(inv: &BillingInvoice, base: &str) -> serde_json::Value {
        serde_json::to_value(InvoiceView::of(inv, base)).unwrap_or(serde_json::Value::Null)
    }

    /// `inv` as answered, its links under `base` (the public base URL).
    pub fn of(inv: &BillingInvoice, base: &str) -> Self {
        let pay_url = super::collect::pay_url(base, &inv.id);
        InvoiceView {
            id: inv.id.to_string(),
            livemode: inv.mode.is_live(),
            number: inv.number.clone(),
            subscription_id: inv.subscription_id.to_string(),
            customer_id: inv.customer_id.to_string(),
            status: inv.status,
            kind: inv.kind.as_str().to_owned(),
            amount: inv.total,
            subtotal: inv.subtotal,
            discount_total: inv.discount_total,
            taxable_amount: inv.taxable_amount(),
            tax_total: inv.tax_total,
            total: inv.total,
            credit_applied: inv.credit_applied,
            tax_rate_bps: inv.tax.as_ref().map_or(0, |t| t.rate_bps),
            tax_registration_number: inv.tax.as_ref().and_then(|t| t.registration_number.clone()),
            coupon_id: inv.discount.as_ref().map(|d| d.coupon_id.to_string()),
            fiscal_year: crate::domain::billing::tax::fiscal_year(
                crate::domain::billing::calendar::nepal_day(inv.issued_at),
            ),
            amount_due: inv.amount_due,
            amount_paid: inv.amount_paid,
            currency: inv.currency,
            lines: inv.lines.iter().map(line_view).collect(),
            period_start: inv.period_start.to_string(),
            period_end: inv.period_end.to_string(),
            due_date: inv.due_date.to_string(),
            due_at: start_of_nepal_day(inv.due_date),
            due: Day::of(inv.due_date),
            overdue_on: inv.overdue_on.to_string(),
            pdf_url: format!("{base}/v1/billing/invoices/{}/pdf", inv.id),
            pay_url,
            payment: inv
                .payment
                .as_ref()
                .map(|p| payment_view(&p.source, p.amount, p.at)),
            overpayments: inv.overpayments.iter().map(overpayment_view).collect(),
            issued_at: inv.issued_at,
            paid_at: inv.paid_at,
            voided_at: inv.voided_at,
            uncollectible_at: inv.uncollectible_at,
            created_at: inv.created_at,
            updated_at: inv.updated_at,
        }
    }
}

/// What a list keeps (each `None`: any).
#[derive(Clone, Debug, Default)]
pub struct Filters {
    pub status: Option<InvoiceStatus>,
    pub customer_id: Option<CustomerId>,
    pub subscription_id: Option<SubscriptionId>,
    pub search: Option<String>,
}

impl Filters {
    /// From the query's values (its ids parsed at the edge): an unknown
    /// status or a long search is a 400 naming the parameter.
    pub fn parse(
        status: Option<&str>,
        customer_id: Option<CustomerId>,
        subscription_id: Option<SubscriptionId>,
        search: Option<&str>,
    ) -> Result<Filters, BillingError> {
        let status = match status {
            None => None,
            Some(raw) => Some(
                InvoiceStatus::ALL
                    .into_iter()
                    .find(|s| s.as_str() == raw)
                    .ok_or_else(|| {
                        invalid(
                            "status",
                            format!(
                                "status must be one of draft, open, paid, overdue, void, uncollectible; got {raw:?}"
                            ),
                        )
                    })?,
            ),
        };
        let search = search.map(str::trim).filter(|s| !s.is_empty());
        if search.is_some_and(|s| s.chars().count() > MAX_SEARCH) {
            return Err(invalid(
                "search",
                format!("search must be at most {MAX_SEARCH} characters"),
            ));
        }
        Ok(Filters {
            status,
            customer_id,
            subscription_id,
            search: search.map(str::to_lowercase),
        })
    }

    /// Whether `inv` passes the status, customer and subscription filters.
    fn keeps(&self, inv: &BillingInvoice) -> bool {
        self.status.is_none_or(|s| s == inv.status)
            && self
                .customer_id
                .as_ref()
                .is_none_or(|c| *c == inv.customer_id)
            && self
                .subscription_id
                .as_ref()
                .is_none_or(|s| *s == inv.subscription_id)
    }

    /// The narrowest counted list holding every invoice these filters
    /// keep (a subscription's, a customer's, a status's, or the whole
    /// list), and the filters left to apply to it (no search).
    fn narrowest(&self, tenant: &Tenant) -> (CountedList, Filters) {
        let rest = |status, customer_id| Filters {
            status,
            customer_id,
            subscription_id: None,
            search: None,
        };
        if let Some(s) = &self.subscription_id {
            return (
                BillingInvoice::by_subscription(tenant, s),
                rest(self.status, self.customer_id.clone()),
            );
        }
        if let Some(c) = &self.customer_id {
            return (
                BillingInvoice::by_customer(tenant, c),
                rest(self.status, None),
            );
        }
        match self.status {
            Some(s) => (BillingInvoice::by_status(tenant, s), rest(None, None)),
            None => (BillingInvoice::counted_list_of(tenant), rest(None, None)),
        }
    }

    fn cond(&self) -> Option<Cond> {
        let mut all = Vec::new();
        if let Some(s) = &self.status {
            all.push(BillingInvoice::STATUS.eq(s));
        }
        if let Some(c) = &self.customer_id {
            all.push(BillingInvoice::CUSTOMER_ID.eq(c));
        }
        if let Some(s) = &self.subscription_id {
            all.push(BillingInvoice::SUBSCRIPTION_ID.eq(s));
        }
        match all.len() {
            0 => None,
            1 => all.pop(),
            _ => Some(Cond::And(all)),
        }
    }
}

/// Whether `inv` matches a lowercased `needle`: its number, id, customer
/// or subscription.
fn matches(inv: &BillingInvoice, needle: &str) -> bool {
    [
        inv.number.as_str(),
        inv.id.as_str(),
        inv.customer_id.as_str(),
        inv.subscription_id.as_str(),
    ]
    .iter()
    .any(|h| h.to_lowercase().contains(needle))
}

/// A page of the tenant's invoices, newest first, and the total: of the
/// filtered list without `search`; with it, of the matches among the
/// newest [`SEARCH_SCAN`] of the narrowest list (see the module doc).
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    page: PageRequest,
    filters: &Filters,
) -> Result<(Vec<BillingInvoice>, u64), BillingError> {
    let store = &*deps.store;
    if filters.cond().is_none() && filters.search.is_none() {
        // Unfiltered: counted, any page at a bounded cost.
        let covered = counted::covered(store, tenant, CountedKind::BillingInvoices).await?;
        let list = BillingInvoice::counted_list_of(tenant);
        let window = Window::at(page.offset(), page.limit);
        let (found, total, _) = counted::page(store, &list, &window, covered).await?;
        return Ok((found, total));
    }
    if !counted::covered_narrowing(store, tenant, Narrowing::BillingInvoicesByFilter).await? {
        return list_through(store, tenant, page, filters).await;
    }
    let (list, rest) = filters.narrowest(tenant);
    if let Some(needle) = &filters.search {
        let page = page.windowed()?;
        let read = crate::store::query_window(store, &list.all(), 0, SEARCH_SCAN).await?;
        return searched(read, &rest, needle, page);
    }
    let window = Window::at(page.offset(), page.limit);
    let Some(cond) = rest.cond() else {
        // One filter: its narrowing, any page.
        let (found, total, _) = counted::page(store, &list, &window, true).await?;
        return Ok((found, total));
    };
    // More: the narrowest read through, filtered by the others, while its
    // counters say it is within the window.
    let (_, size, _) =
        counted::page::<BillingInvoice>(store, &list, &Window::at(0, 1), true).await?;
    if size > MAX_WINDOW as u64 {
        let (param, what) = match (rest.status, &filters.subscription_id) {
            (Some(_), Some(_)) => ("status", "subscription"),
            (Some(_), None) => ("status", "customer"),
            (None, _) => ("customerId", "subscription"),
        };
        return Err(invalid(
            param,
            format!(
                "this {what} has more than {MAX_WINDOW} invoices: a list of them reads at most {MAX_WINDOW} to filter by {param}; list them without {param}, or by {param} alone"
            ),
        ));
    }
    let query = list.all().filter(cond);
    let (items, total) = tokio::join!(
        crate::store::query_window(store, &query, page.offset(), page.limit),
        store.count(&query)
    );
    let found = items?
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<BillingInvoice>, _>>()?;
    Ok((found, total?))
}

/// The page of the matches of `needle` among `read` kept by `rest`, and
/// their number.
fn searched(
    read: Vec<crate::store::Item>,
    rest: &Filters,
    needle: &str,
    page: PageRequest,
) -> Result<(Vec<BillingInvoice>, u64), BillingError> {
    let mut matched = Vec::new();
    for item in read {
        let inv: BillingInvoice = from_item(item)?;
        if rest.keeps(&inv) && matches(&inv, needle) {
            matched.push(inv);
        }
    }
    let total = matched.len() as u64;
    let found = matched
        .into_iter()
        .skip(page.offset())
        .take(page.limit)
        .collect();
    Ok((found, total))
}

/// A tenant whose older invoices are not narrowed yet: the whole list
/// filtered, read through from the start within its window.
async fn list_through(
    store: &dyn Store,
    tenant: &Tenant,
    page: PageRequest,
    filters: &Filters,
) -> Result<(Vec<BillingInvoice>, u64), BillingError> {
    let page = page.windowed()?;
    let mut query = Query::partition(BillingInvoice::list_partition(tenant))
        .on(Index::Gsi1)
        .backward();
    if let Some(c) = filters.cond() {
        query = query.filter(c);
    }
    let Some(needle) = &filters.search else {
        let items = crate::store::query_window(store, &query, page.offset(), page.limit).await?;
        let found = items
            .into_iter()
            .map(from_item)
            .collect::<Result<Vec<BillingInvoice>, _>>()?;
        let total = store.count(&query).await?;
        return Ok((found, total));
    };
    let read = crate::store::query_window(store, &query, 0, SEARCH_SCAN).await?;
    searched(read, &Filters::default(), needle, page)
}
