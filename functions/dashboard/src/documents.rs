//! An invoice's PDF for a signed-in user (feature `documents`): the one
//! page that needs S3 and the PDF renderer, deployed as its own function
//! (`functions/dashboard-documents`).

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use edge::PathId;
use http::{HeaderValue, header};
use shared::AppState;
use shared::domain::invoices;
use shared::ids::InvoiceId;

use crate::records::invoice_of;
use crate::{Signed, Stop, fail};

/// `GET /dashboard/invoices/{id}/pdf`: the stored PDF of the invoice's
/// current version, as a download.
pub async fn invoice_pdf(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<InvoiceId>,
) -> Result<Response, Stop> {
    let i = invoice_of(&state, &signed, id).await?;
    let bytes = invoices::pdf(&state, &i).await.map_err(fail)?;
    let mut res = Body::from(bytes).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/pdf"),
    );
    let name = format!(
        "attachment; filename=\"{}.pdf\"",
        i.invoice_number
            .as_deref()
            .unwrap_or(&i.id)
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect::<String>()
    );
    if let Ok(v) = HeaderValue::from_str(&name) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}
