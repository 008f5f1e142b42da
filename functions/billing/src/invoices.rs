//! `/v1/billing/invoices`: list (`status`, `customerId`, `subscriptionId`,
//! `search`) and retrieve. Invoices are issued by the engine; their QR
//! (`POST /v1/billing/invoices/{id}/qr`) is the Direct-QR function's.

use axum::extract::State;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, PathId, QueryParams};
use http::HeaderMap;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::customers::PageRequest;
use shared::domain::billing::invoice::view::InvoiceView;
use shared::domain::billing::invoice::{self, view};
use shared::ids::{BillingInvoiceId, CustomerId, SubscriptionId, TypedId};
use shared::refusal::Refusal;

use crate::customers::allowed;
use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(list_invoices)))
        .routes(idempotent(state, routes!(get_invoice)))
}

/// List billing invoices, newest first.
#[utoipa::path(
    get, path = "/v1/billing/invoices", tag = "Billing", operation_id = "listBillingInvoices",
    params(
        BillingPageParams,
        ("status" = Option<String>, Query, description = "Only invoices in this status: `draft`, `open`, `paid`, `overdue`, `void`, `uncollectible`."),
        ("customerId" = Option<String>, Query, description = "Only this customer's invoices (`cus_…`)."),
        ("subscriptionId" = Option<String>, Query, description = "Only this subscription's invoices (`sub_…`)."),
        ("search" = Option<String>, Query, description = "Only invoices whose number, id, customer or subscription id holds this text (any case); among the newest 5,000."),
    ),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of invoices.", body = BillingPage<InvoiceView>),
    ),
)]
async fn list_invoices(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Json<BillingPage<InvoiceView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    // Any page of the counted list or a filter's narrowing; a search's
    // within its window.
    let page = PageRequest::parse_deep(query.get("page"), query.get("limit"))?;
    let filters = view::Filters::parse(
        query.get("status"),
        id_param::<CustomerId>(&query, "customerId", "cus_")?,
        id_param::<SubscriptionId>(&query, "subscriptionId", "sub_")?,
        query.get("search"),
    )?;
    let (found, total) = view::list(&state, who.tenant(), page, &filters).await?;
    let base = edge::requests::public_base(&state, &headers);
    Ok(Json(BillingPage {
        data: found.iter().map(|i| InvoiceView::of(i, &base)).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a billing invoice: its lines, period, due date (with its
/// Miti), amount due, payments, overpayments and their refunds, its pay
/// page (`payUrl`) and PDF.
#[utoipa::path(
    get, path = "/v1/billing/invoices/{id}", tag = "Billing", operation_id = "getBillingInvoice",
    params(("id" = String, Path, description = "A billing invoice id, `inv_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The invoice.", body = InvoiceView),
    ),
)]
async fn get_invoice(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    id: PathId<BillingInvoiceId>,
) -> Result<Json<InvoiceView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let inv = invoice::get_invoice(&state, who.tenant(), &id).await?;
    let base = edge::requests::public_base(&state, &headers);
    Ok(Json(InvoiceView::of(&inv, &base)))
}

/// The id the query's `name` holds, if any: one that cannot be a `prefix`
/// id is a 400 naming the parameter.
fn id_param<T: TypedId>(
    query: &QueryParams,
    name: &str,
    prefix: &str,
) -> Result<Option<T>, ApiError> {
    match query.get(name) {
        None => Ok(None),
        Some(raw) => T::parse(raw).map(Some).ok_or_else(|| {
            Refusal::invalid(name, format!("{name} must be a {prefix} id; got {raw:?}")).into()
        }),
    }
}
