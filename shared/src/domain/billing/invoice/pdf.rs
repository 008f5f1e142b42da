//! A billing invoice's PDF: rendered with the one-time invoices' writer
//! (`crate::pdf`) and kept in the blob store beside theirs, at
//! `invoices/billing/<id>/v<version>.pdf` (a payment or a void is a new
//! version, so a stale PDF is never served). The writer prints Latin
//! text only: the Miti is written in Latin letters (`2081 Shrawan 15`).

use super::{BillingInvoice, BillingInvoiceError, InvoiceStatus};
use crate::Deps;
use crate::domain::Tenant;
use crate::domain::billing::calendar::{bs_from_ad, miti_latin};
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
        lines: inv
            .lines
            .iter()
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
                    l.amount / i64::from(l.quantity)
                },
                line_total: l.amount,
            })
            .collect(),
        subtotal: inv.subtotal,
        tax_rate_bps: 0,
        tax_total: 0,
        total_amount: inv.total,
        amount_paid: inv.amount_paid,
        amount_adjusted: 0,
        amount_remaining: (inv.amount_due - inv.amount_paid).max(0),
        note: Some(note),
        external_reference: Some(inv.subscription_id.to_string()),
        void_reason: None,
    };
    render(&doc).map_err(|e| {
        BillingInvoiceError::Store(StoreError::Backend(format!(
            "billing invoice {} PDF: {e}",
            inv.id
        )))
    })
}
