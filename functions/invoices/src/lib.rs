//! The one-time invoices function: `POST|GET /v1/invoices`,
//! `GET|PATCH /v1/invoices/{id}`, and `POST /v1/invoices/{id}/finalize`,
//! `.../discard`, `.../correct`, `.../adjustments`, `.../checkout`,
//! `GET .../pdf`. The rules are in `shared::domain::invoices`. Also a
//! billing invoice's PDF, `GET /v1/billing/invoices/{id}/pdf` (this
//! function holds the documents bucket and the PDF writer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use edge::Json;
use edge::PathId;
use edge::answers::Deleted;
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::PageParams;
use edge::{ApiError, Auth, JsonBody, OptionalJsonBody, Page, Pagination, QueryParams, with_edge};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use shared::AppState;
use shared::domain::Tenant;
use shared::domain::account::Scope;
use shared::domain::invoices::{
    self, AdjustInvoice, CollectionStatus, CorrectInvoice, CreateInvoice, DocumentStatus,
    FinalizeInvoice, InvoiceCheckout, InvoiceCheckoutView, InvoiceError, InvoiceView, PatchInvoice,
};
use shared::ids::{IdKind, InvoiceId};

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_invoice, list_invoices)))
        .routes(idempotent(state, routes!(get_invoice, patch_invoice)))
        .routes(idempotent(state, routes!(finalize_invoice)))
        .routes(idempotent(state, routes!(discard_invoice)))
        .routes(idempotent(state, routes!(correct_invoice)))
        .routes(idempotent(state, routes!(adjust_invoice)))
        .routes(idempotent(state, routes!(invoice_checkout)))
        .routes(routes!(invoice_pdf))
        .routes(routes!(billing_invoice_pdf))
}

/// The function's routes, behind the idempotency layer, in the shared edge,
/// and the bill page's PDF (`GET /b/{id}/pdf`, keyless like the page).
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    let router = router.route(
        "/b/{id}/pdf",
        axum::routing::get(bill_pdf).route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            edge::html::public_site,
        )),
    );
    with_edge(router.with_state(state))
}

/// A billing invoice's PDF for its customer, linked from the bill page
/// (`/b/{id}`): no key, as the page, whose unguessable id it shares. The
/// address's public page budget is taken first (a refused or made-up id
/// costs no write); an unknown id, another kind of id or a draft is a 404.
async fn bill_pdf(
    State(state): State<AppState>,
    axum::extract::Path(raw): axum::extract::Path<String>,
    req: axum::extract::Request,
) -> Response {
    use shared::domain::billing::invoice::{self, InvoiceStatus, collect};
    let address = edge::requests::client_address(&state, &req);
    let request = shared::limits::public::PublicRequest {
        address: address.as_str(),
        poll: false,
        write: false,
        link: None,
        opens_session: false,
        opens_stream: false,
    };
    if let Err(limited) = state.take_public(&request).await {
        let mut res = (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests from this address; try again shortly.\n",
        )
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&limited.retry_after.to_string()) {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return res;
    }
    let not_found = || {
        (
            StatusCode::NOT_FOUND,
            "No such invoice. Check the link you were sent.\n",
        )
            .into_response()
    };
    let Some(id) = <shared::ids::BillingInvoiceId as shared::ids::TypedId>::parse(&raw) else {
        return not_found();
    };
    let inv = match collect::find(&state, &id).await {
        Ok(Some(i)) if i.status != InvoiceStatus::Draft => i,
        Ok(_) => return not_found(),
        Err(e) => {
            tracing::error!(invoice = %id, error = %e, "bill PDF: invoice unreadable");
            return (StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.\n").into_response();
        }
    };
    let merchant = match shared::domain::account::storefront(&state, &inv.project_id).await {
        Ok((m, _)) => m,
        Err(e) => {
            tracing::error!(invoice = %id, error = %e, "bill PDF: merchant unreadable");
            return (StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.\n").into_response();
        }
    };
    match invoice::pdf::pdf(&state, &inv, &merchant).await {
        Ok(bytes) => {
            let mut res = (StatusCode::OK, bytes).into_response();
            let h = res.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/pdf"),
            );
            if let Ok(v) =
                HeaderValue::from_str(&format!("inline; filename=\"{}.pdf\"", inv.number))
            {
                h.insert(header::CONTENT_DISPOSITION, v);
            }
            h.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
            h.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            h.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            );
            res
        }
        Err(e) => {
            tracing::error!(invoice = %id, error = %e, "bill PDF not rendered");
            (StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.\n").into_response()
        }
    }
}

fn view(inv: &invoices::Invoice, state: &AppState) -> InvoiceView {
    InvoiceView::at(inv, state.clock.now())
}

fn fence_of(fence: &Option<Extension<Fence>>) -> Option<&Fence> {
    fence.as_ref().map(|Extension(f)| f)
}

/// Finalizes of one project and mode wait for each other in this process:
/// they would only race for the same counter (the store's conditional
/// write still decides between processes).
fn numbering_lock(tenant: &Tenant) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<Tenant, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let locks = LOCKS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = match locks.lock() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    };
    if map.len() > 10_000 {
        // Forget idle locks now and then (held ones are shared: kept).
        map.retain(|_, l| Arc::strong_count(l) > 1);
    }
    map.entry(tenant.clone()).or_default().clone()
}

/// Create a draft invoice.
#[utoipa::path(
    post, path = "/v1/invoices", tag = "Invoices", operation_id = "createInvoice",
    request_body = CreateInvoice,
    security(("bearer" = ["invoices:write"])),
    responses(
        (status = 201, description = "The draft.", body = InvoiceView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = InvoiceView),
    ),
)]
async fn create_invoice(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateInvoice>, ApiError>,
) -> Result<(StatusCode, Json<InvoiceView>), ApiError> {
    let who = auth.require(Scope::InvoicesWrite)?;
    let JsonBody(body) = body?;
    let inv = invoices::create(&state, who.tenant(), body, fence_of(&fence)).await?;
    Ok((StatusCode::CREATED, Json(view(&inv, &state))))
}

/// List invoices, newest first.
#[utoipa::path(
    get, path = "/v1/invoices", tag = "Invoices", operation_id = "listInvoices",
    params(PageParams, ("document_status" = inline(Option<DocumentStatus>), Query, description = "Only invoices in this document status."), ("collection_status" = inline(Option<CollectionStatus>), Query, description = "Only invoices in this collection status.")),
    security(("bearer" = ["invoices:read"])),
    responses(
        (status = 200, description = "A page of invoices.", body = Page<InvoiceView>),
    ),
)]
async fn list_invoices(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<InvoiceView>>, ApiError> {
    let who = auth.require(Scope::InvoicesRead)?;
    let page = Pagination::from_query(&query, invoices::DEFAULT_PAGE, IdKind::Invoice)?;
    let document_status = match query.get("document_status") {
        None => None,
        Some(v) => Some(DocumentStatus::parse(v).ok_or_else(|| {
            ApiError::validation(
                "document_status",
                format!("document_status must be draft, issued or void, got {v:?}"),
            )
        })?),
    };
    let collection_status = match query.get("collection_status") {
        None => None,
        Some(v) => Some(CollectionStatus::parse(v).ok_or_else(|| {
            ApiError::validation(
                "collection_status",
                format!(
                    "collection_status must be unpaid, part_paid, paid or closed_adjusted, got {v:?}"
                ),
            )
        })?),
    };
    let (found, total) = invoices::list(
        &state,
        who.tenant(),
        document_status,
        collection_status,
        page.window(),
    )
    .await?;
    let data = found.iter().map(|i| view(i, &state)).collect();
    Ok(Json(Page::new(data, total, page)))
}

/// Retrieve an invoice.
#[utoipa::path(
    get, path = "/v1/invoices/{id}", tag = "Invoices", operation_id = "getInvoice",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    security(("bearer" = ["invoices:read"])),
    responses(
        (status = 200, description = "The invoice.", body = InvoiceView),
    ),
)]
async fn get_invoice(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<InvoiceId>,
) -> Result<Json<InvoiceView>, ApiError> {
    let who = auth.require(Scope::InvoicesRead)?;
    let id = id.get()?;
    let inv = invoices::get(&state, who.tenant(), &id).await?;
    Ok(Json(view(&inv, &state)))
}

/// Change a draft: only the keys sent change.
#[utoipa::path(
    patch, path = "/v1/invoices/{id}", tag = "Invoices", operation_id = "updateInvoice",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    request_body = PatchInvoice,
    security(("bearer" = ["invoices:write"])),
    responses(
        (status = 200, description = "The draft as changed.", body = InvoiceView),
        (status = 409, description = "The invoice changed or is not in a state that allows this (`version_conflict`, `state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn patch_invoice(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<InvoiceId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<PatchInvoice>, ApiError>,
) -> Result<Json<InvoiceView>, ApiError> {
    let who = auth.require(Scope::InvoicesWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let inv = invoices::patch(&state, who.tenant(), &id, body).await?;
    Ok(Json(view(&inv, &state)))
}

/// Issue a draft: it takes its number and its PDF.
#[utoipa::path(
    post, path = "/v1/invoices/{id}/finalize", tag = "Invoices", operation_id = "finalizeInvoice",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    request_body = FinalizeInvoice,
    security(("bearer" = ["invoices:write"])),
    responses(
        (status = 200, description = "The issued invoice.", body = InvoiceView),
        (status = 409, description = "The invoice changed or is not in a state that allows this (`version_conflict`, `state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn finalize_invoice(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    id: PathId<InvoiceId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<FinalizeInvoice>, ApiError>,
) -> Result<Json<InvoiceView>, ApiError> {
    let who = auth.require(Scope::InvoicesWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let lock = numbering_lock(who.tenant());
    let inv = {
        let _turn = lock.lock().await;
        invoices::finalize(&state, who.tenant(), &id, body.version, fence_of(&fence)).await?
    };
    tracing::info!(invoice = %inv.id, number = ?inv.invoice_number, "invoice issued");
    invoices::store_pdf(&state, &inv).await;
    Ok(Json(view(&inv, &state)))
}

/// Discard a draft (again: the same answer).
#[utoipa::path(
    post, path = "/v1/invoices/{id}/discard", tag = "Invoices", operation_id = "discardInvoice",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    security(("bearer" = ["invoices:write"])),
    responses(
        (status = 200, description = "Discarded.", body = Deleted),
        (status = 409, description = "The invoice changed or is not in a state that allows this (`version_conflict`, `state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn discard_invoice(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    id: PathId<InvoiceId>,
) -> Result<Json<Deleted>, ApiError> {
    let who = auth.require(Scope::InvoicesWrite)?;
    let id = id.get()?;
    match invoices::discard(&state, who.tenant(), &id, fence_of(&fence)).await {
        Ok(_) | Err(InvoiceError::AlreadyDiscarded) => Ok(Json(Deleted::of(id.into(), who.mode()))),
        Err(e) => Err(e.into()),
    }
}

/// Void an issued invoice and issue its replacement.
#[utoipa::path(
    post, path = "/v1/invoices/{id}/correct", tag = "Invoices", operation_id = "correctInvoice",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    request_body = CorrectInvoice,
    security(("bearer" = ["invoices:write"])),
    responses(
        (status = 200, description = "The voided invoice and its replacement.", body = Corrected),
        (status = 409, description = "The invoice changed or is not in a state that allows this (`version_conflict`, `state_conflict`).", body = edge::openapi::ErrorEnvelope),
        (status = 422, description = "Cannot be corrected in its state (`invoice_not_correctable`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn correct_invoice(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<InvoiceId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CorrectInvoice>, ApiError>,
) -> Result<Json<Corrected>, ApiError> {
    let who = auth.require(Scope::InvoicesWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let (voided, replacement) = invoices::correct(&state, who.tenant(), &id, body).await?;
    tracing::info!(invoice = %voided.id, replacement = %replacement.id, "invoice voided and replaced");
    invoices::store_pdf(&state, &voided).await;
    Ok(Json(Corrected {
        replacement: view(&replacement, &state),
        voided: view(&voided, &state),
    }))
}

/// The answer of a correction.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = InvoiceCorrected)]
struct Corrected {
    replacement: InvoiceView,
    voided: InvoiceView,
}

/// Record a credit or write-off against an issued invoice.
#[utoipa::path(
    post, path = "/v1/invoices/{id}/adjustments", tag = "Invoices", operation_id = "adjustInvoice",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    request_body = AdjustInvoice,
    security(("bearer" = ["invoices:write"])),
    responses(
        (status = 200, description = "The invoice with the adjustment.", body = InvoiceView),
        (status = 409, description = "The invoice changed or is not in a state that allows this (`version_conflict`, `state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn adjust_invoice(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<InvoiceId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<AdjustInvoice>, ApiError>,
) -> Result<Json<InvoiceView>, ApiError> {
    let who = auth.require(Scope::InvoicesWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let inv = invoices::adjust(&state, who.tenant(), &id, body).await?;
    Ok(Json(view(&inv, &state)))
}

/// A checkout session for what is left to pay on an issued invoice.
#[utoipa::path(
    post, path = "/v1/invoices/{id}/checkout", tag = "Invoices", operation_id = "createInvoiceCheckout",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    request_body = Option<InvoiceCheckout>,
    security(("bearer" = ["invoices:write", "payments:write"])),
    responses(
        (status = 200, description = "The session to send the customer to.", body = InvoiceCheckoutView),
        (status = 409, description = "The invoice changed or is not in a state that allows this (`version_conflict`, `state_conflict`).", body = edge::openapi::ErrorEnvelope),
        (status = 422, description = "The balance cannot be collected by checkout (`invoice_not_collectable`, `provider_unavailable`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn invoice_checkout(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: HeaderMap,
    id: PathId<InvoiceId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<OptionalJsonBody<InvoiceCheckout>, ApiError>,
) -> Result<Json<InvoiceCheckoutView>, ApiError> {
    // The checkout is a payment: it needs the right to take payments as
    // well as to act on invoices, and it counts toward the key's spend cap.
    auth.require(Scope::PaymentsWrite)?;
    let who = auth.require(Scope::InvoicesWrite)?;
    let OptionalJsonBody(body) = body?;
    let payer = shared::domain::checkout::Creator::of(who);
    let base = edge::requests::public_base(&state, &headers);
    let id = id.get()?;
    let (session, reused) =
        invoices::checkout(&state, &payer, &id, body, &base, fence_of(&fence)).await?;
    Ok(Json(InvoiceCheckoutView {
        checkout_url: format!("{base}/c/{}", session.id),
        checkout_session_id: session.id.into(),
        reused,
    }))
}

/// The issued invoice as a PDF.
#[utoipa::path(
    get, path = "/v1/invoices/{id}/pdf", tag = "Invoices", operation_id = "getInvoicePdf",
    params(("id" = String, Path, description = "An invoice id, `inv_…`.")),
    security(("bearer" = ["invoices:read"])),
    responses(
        (status = 200, description = "The PDF.", content_type = "application/pdf", body = edge::openapi::Binary),
        (status = 409, description = "Not issued yet: a draft has no PDF (`state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn invoice_pdf(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<InvoiceId>,
) -> Result<Response, ApiError> {
    let who = auth.require(Scope::InvoicesRead)?;
    let id = id.get()?;
    let inv = invoices::get(&state, who.tenant(), &id).await?;
    let bytes = invoices::pdf(&state, &inv).await?;
    let name = inv
        .invoice_number
        .clone()
        .unwrap_or_else(|| inv.id.to_string());
    let mut res = (StatusCode::OK, bytes).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/pdf"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("inline; filename=\"{name}.pdf\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    Ok(res)
}

/// A billing invoice as a PDF (the Miti beside each date).
#[utoipa::path(
    get, path = "/v1/billing/invoices/{id}/pdf", tag = "Billing", operation_id = "getBillingInvoicePdf",
    params(("id" = String, Path, description = "A billing invoice id, `inv_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The PDF.", content_type = "application/pdf", body = edge::openapi::Binary),
    ),
)]
async fn billing_invoice_pdf(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<shared::ids::BillingInvoiceId>,
) -> Result<Response, ApiError> {
    use shared::domain::billing::invoice;
    let who = auth.require(Scope::BillingRead)?;
    shared::domain::billing::customers::entitled(who)?;
    let id = id.get()?;
    let inv = invoice::get_invoice(&state, who.tenant(), &id).await?;
    let (merchant, _) = shared::domain::account::storefront(&state, &inv.project_id).await?;
    let bytes = invoice::pdf::pdf(&state, &inv, &merchant).await?;
    let mut res = (StatusCode::OK, bytes).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/pdf"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("inline; filename=\"{}.pdf\"", inv.number)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    Ok(res)
}
