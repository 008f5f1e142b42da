//! The invoice PDF: rendered once per version and kept in the blob store.

use super::drafts::InvoiceError;
use super::records::{DocumentStatus, Invoice};
use crate::Deps;
use crate::store::StoreError;

/// The PDF of an issued or void invoice: the stored file of its current
/// version, rendered and stored first when missing.
pub async fn pdf(state: &Deps, inv: &Invoice) -> Result<Vec<u8>, InvoiceError> {
    if inv.document_status == DocumentStatus::Draft {
        return Err(InvoiceError::StateConflict(
            "a draft has no PDF; finalize it first".into(),
        ));
    }
    let key = inv.pdf_key();
    match state.blobs.get(&key).await {
        Ok(Some(blob)) => return Ok(blob.bytes.to_vec()),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(invoice = %inv.id, error = %e, "stored PDF unreadable; rendering it again")
        }
    }
    let bytes = render_pdf(inv)?;
    if let Err(e) = state
        .blobs
        .put(&key, bytes::Bytes::from(bytes.clone()), "application/pdf")
        .await
    {
        tracing::warn!(invoice = %inv.id, error = %e, "could not store the PDF; it is rendered again next time");
    }
    Ok(bytes)
}

/// Renders and stores the PDF of `inv` (after finalize or a void); a
/// failure is logged, the PDF is then rendered on first request.
pub async fn store_pdf(state: &Deps, inv: &Invoice) {
    // Bounded: the change it follows has committed; a slow blob store must
    // not turn its answer into a timeout.
    match tokio::time::timeout(std::time::Duration::from_secs(3), pdf(state, inv)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(invoice = %inv.id, error = %e, "could not render the PDF now; it is rendered on request")
        }
        Err(_) => {
            tracing::warn!(invoice = %inv.id, "storing the PDF took too long; it is rendered on request")
        }
    }
}

fn render_pdf(inv: &Invoice) -> Result<Vec<u8>, InvoiceError> {
    use crate::pdf::{PdfBuyer, PdfInvoice, PdfLine, PdfSeller, render};
    let doc = PdfInvoice {
        invoice_number: inv.invoice_number.clone(),
        document_status: inv.document_status.as_str().to_owned(),
        livemode: inv.mode.is_live(),
        seller: inv.seller.as_ref().map(|s| PdfSeller {
            name: s.name.clone(),
            legal_name: s.legal_name.clone(),
            email: s.email.clone(),
            logo_url: s.logo_url.clone(),
            brand_color: s.brand_color.clone(),
        }),
        buyer: inv.buyer.as_ref().map(|b| PdfBuyer {
            name: b.name.clone(),
            email: b.email.clone(),
            phone: b.phone.clone(),
            address: b.address.clone(),
        }),
        issued_at: inv.issued_at.map(|t| t.to_rfc3339()),
        due_at: inv.due_at.to_rfc3339(),
        created_at: inv.created_at.to_rfc3339(),
        lines: inv
            .lines
            .iter()
            .map(|l| PdfLine {
                description: l.description.clone(),
                quantity: l.quantity.clone(),
                unit_amount: l.unit_amount,
                line_total: l.line_total,
            })
            .collect(),
        subtotal: inv.subtotal,
        tax_rate_bps: inv.tax_rate_bps,
        tax_total: inv.tax_total,
        total_amount: inv.total_amount,
        amount_paid: inv.amount_paid,
        amount_adjusted: inv.amount_adjusted,
        amount_remaining: inv.amount_remaining(),
        note: inv.note.clone(),
        external_reference: inv.external_reference.clone(),
        void_reason: inv.void_reason.clone(),
        ..PdfInvoice::default()
    };
    render(&doc).map_err(|e| {
        InvoiceError::Store(StoreError::Backend(format!("invoice {} PDF: {e}", inv.id)))
    })
}
