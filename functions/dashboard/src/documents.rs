//! What a signed-in user downloads from the bucket (feature `documents`):
//! an invoice's PDF and a finished export's CSV, the pages that need S3
//! (and the PDF renderer), deployed as their own function
//! (`functions/dashboard-documents`).

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use edge::PathId;
use http::{HeaderValue, StatusCode, header};
use shared::AppState;
use shared::domain::invoices;
use shared::domain::reports::{self, ReportError, ReportStatus};
use shared::ids::{InvoiceId, ReportId};

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

/// `GET /dashboard/exports/{id}/download`: a fresh link to the finished
/// export's CSV (S3's presigned GET on AWS, the signed local link on the
/// embedded backend) as a `303`. The Exports page links here rather than
/// to the bucket: the pages' function has no S3 client to sign with, and
/// a link made on each click never shows an expired one.
pub async fn export_download(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<ReportId>,
) -> Result<Response, Stop> {
    let missing = || {
        Stop::from(edge::html::html(
            StatusCode::NOT_FOUND,
            crate::pages::message("Not found", "There is no such export."),
        ))
    };
    let rid = id.get_or(|_, _| missing())?;
    let report = match reports::get(&state, &signed.tenant, &rid).await {
        Ok(r) => r,
        Err(ReportError::NotFound(_)) => return Err(missing()),
        Err(e) => return Err(fail(e)),
    };
    if report.status != ReportStatus::Ready {
        return Err(Stop::from(edge::html::html(
            StatusCode::CONFLICT,
            crate::pages::message("Not ready", "This export has no file yet."),
        )));
    }
    let (url, _) = reports::download_link(&state, &report, state.clock.now())
        .await
        .map_err(fail)?;
    let mut res = StatusCode::SEE_OTHER.into_response();
    let h = res.headers_mut();
    match HeaderValue::from_str(&url) {
        Ok(v) => h.insert(header::LOCATION, v),
        Err(_) => return Err(fail(ReportError::BadLink)),
    };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}
