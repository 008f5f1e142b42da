//! A billing invoice's PDF: rendered with the one-time invoices' writer
//! (`crate::pdf`) and kept in the blob store beside theirs, at
//! `invoices/billing/<id>/v<version>.pdf` (a payment or a void is a new
//! version, so a stale PDF is never served). The writer prints Latin
//! text only: the Miti is written in Latin letters (`2081 Shrawan 15`).
//!
//! Every invoice shows its Nepali fiscal year (`FY 2082/83`) and its issue
//! date in BS beside AD. An invoice issued with VAT is a tax invoice, as
//! Nepal's VAT rules ask: titled "Tax Invoice", with the seller's PAN/VAT
//! number, the buyer's PAN when the customer has one (their metadata
//! `pan`, 9 digits: the SDK's customer has no field for it), the taxable
//! amount, the VAT and the total.

use super::{BillingInvoice, BillingInvoiceError, InvoiceStatus, LineKind};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::billing::calendar::{bs_from_ad, miti_latin, nepal_day};
use crate::domain::billing::customers::Customer;
use crate::domain::record;
use crate::store::StoreError;

/// Where the PDF of `inv`'s current version is kept.
pub fn pdf_key(inv: &BillingInvoice) -> String {
    format!("invoices/billing/{}/v{}.pdf", inv.id, inv.version)
}

/// `2026-01-10 (BS 2082 Poush 26)`: a day with its Miti.
fn with_miti(d: chrono::NaiveDate) -> String {
    match bs_from_ad(d) {
        Some(bs) => format!("{d} (BS {})", miti_latin(bs)),
        None => d.to_string(),
    }
}

/// The PDF of `inv` (`merchant`: the seller's name): the stored file of
/// its current version, rendered and stored first when missing.
pub async fn pdf(
    deps: &Deps,
    inv: &BillingInvoice,
    merchant: &str,
) -> Result<Vec<u8>, BillingInvoiceError> {
    let key = pdf_key(inv);
    match deps.blobs.get(&key).await {
        Ok(Some(blob)) => return Ok(blob.bytes.to_vec()),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(invoice = %inv.id, error = %e, "stored PDF unreadable; rendering it again")
        }
    }
    let tenant = Tenant::new(inv.project_id.clone(), inv.mode);
    let customer =
        record::get::<Customer>(&*deps.store, &Customer::key(&tenant, &inv.customer_id)).await?;
    let bytes = render(inv, merchant, customer.as_ref())?;
    if let Err(e) = deps
        .blobs
        .put(&key, bytes::Bytes::from(bytes.clone()), "application/pdf")
        .await
    {
        tracing::warn!(invoice = %inv.id, error = %e, "could not store the PDF; it is rendered again next time");
    }
    Ok(bytes)
}

/// The document of `inv`.
pub fn render(
    inv: &BillingInvoice,
    merchant: &str,
    customer: Option<&Customer>,
) -> Result<Vec<u8>, BillingInvoiceError> {
    use crate::pdf::{PdfBuyer, PdfInvoice, PdfLine, PdfSeller, render};
    let last_day = inv.period_end.pred_opt().unwrap_or(inv.period_end);
    let note = format!(
        "Period {} to {}. Due {}.{}",
        with_miti(inv.period_start),
        with_miti(last_day),
        with_miti(inv.due_date),
        match inv.status {
            InvoiceStatus::Paid => " Paid, thank you.",
            InvoiceStatus::Overdue => " Overdue.",
            _ => "",
        }
    );
    let issued = nepal_day(inv.issued_at);
    let mut extra_details = Vec::new();
    if let Some(bs) = bs_from_ad(issued) {
        extra_details.push(("Date (BS)".to_owned(), miti_latin(bs)));
    }
    if let Some(fy) = crate::domain::billing::tax::fiscal_year(issued) {
        extra_details.push(("Fiscal year".to_owned(), format!("FY {fy}")));
    }
    let doc = PdfInvoice {
        invoice_number: Some(inv.number.clone()),
        document_status: if inv.status == InvoiceStatus::Void {
            "void"
        } else {
            "issued"
        }
        .to_owned(),
        livemode: inv.mode.is_live(),
        seller: Some(PdfSeller {
            name: Some(merchant.to_owned()),
            ..PdfSeller::default()
        }),
        buyer: customer.map(|c| PdfBuyer {
            name: Some(c.name.clone()),
            email: c.email.clone(),
            phone: c.phone.clone(),
            address: None,
        }),
        issued_at: Some(inv.issued_at.to_rfc3339()),
        due_at: super::view::start_of_nepal_day(inv.due_date).to_rfc3339(),
        created_at: inv.created_at.to_rfc3339(),
        // The discount and the VAT are in the totals.
        lines: inv
            .lines
            .iter()
            .filter(|l| !matches!(l.kind, LineKind::Discount | LineKind::Tax))
            .map(|l| PdfLine {
                description: format!(
                    "{} ({} to {})",
                    l.description,
                    l.period_start,
                    l.period_end.pred_opt().unwrap_or(l.period_end)
                ),
                quantity: l.quantity.to_string(),
                unit_amount: if l.quantity == 0 {
                    l.amount
                } else {
                    i64::try_from(i128::from(l.amount) / i128::from(l.quantity)).unwrap_or(0)
                },
                line_total: l.amount,
            })
            .collect(),
        subtotal: inv.subtotal,
        tax_rate_bps: inv.tax.as_ref().map_or(0, |t| i64::from(t.rate_bps)),
        tax_total: inv.tax_total,
        total_amount: inv.total,
        amount_paid: inv.amount_paid,
        amount_adjusted: 0,
        amount_remaining: (inv.amount_due - inv.amount_paid).max(0),
        note: Some(note),
        external_reference: Some(inv.subscription_id.to_string()),
        void_reason: None,
        title: inv.tax.as_ref().map(|_| "Tax Invoice".to_owned()),
        seller_tax_id: inv.tax.as_ref().and_then(|t| t.registration_number.clone()),
        buyer_tax_id: customer.and_then(crate::domain::billing::tax::buyer_pan),
        extra_details,
        discount_total: inv.discount_total,
        tax_label: inv.tax.as_ref().map(|t| t.line_label()),
        credit_applied: inv.credit_applied,
    };
    render(&doc).map_err(|e| {
        BillingInvoiceError::Store(StoreError::Backend(format!(
            "billing invoice {} PDF: {e}",
            inv.id
        )))
    })
}
