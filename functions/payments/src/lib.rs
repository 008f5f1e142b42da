//! The payments function: `GET /v1/payments`, `GET /v1/payments/{id}`.

use axum::Router;
use axum::extract::State;
use edge::Json;
use edge::openapi::{OpenApiRouter, routes};
use edge::pagination::{FilterParams, PageParams, list_filter};
use edge::{ApiError, Auth, Page, Pagination, PathId, QueryParams, with_edge};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::payments::{self, PaymentStatus, PaymentView};
use shared::ids::{IdKind, PaymentId};

/// The function's routes and their description, one value.
pub fn routes(_state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_payments))
        .routes(routes!(get_payment))
}

/// The function's routes, wrapped in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// List payments, newest first.
#[utoipa::path(
    get, path = "/v1/payments", tag = "Payments", operation_id = "listPayments",
    params(PageParams, FilterParams),
    security(("bearer" = ["payments:read"])),
    responses((status = 200, description = "A page of payments (25 by default).", body = Page<PaymentView>)),
)]
async fn list_payments(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<PaymentView>>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let page = Pagination::from_query(&query, payments::DEFAULT_PAGE, IdKind::Payment)?;
    let filter = list_filter::<PaymentStatus>(&query)?;
    let (found, total) = payments::list_where(&state, who.tenant(), &filter, page.window()).await?;
    let data = found.into_iter().map(PaymentView::from).collect();
    Ok(Json(Page::new(data, total, page)))
}

/// Retrieve a payment.
#[utoipa::path(
    get, path = "/v1/payments/{id}", tag = "Payments", operation_id = "getPayment",
    params(("id" = String, Path, description = "A payment id, `pay_…`.")),
    security(("bearer" = ["payments:read"])),
    responses((status = 200, description = "The payment.", body = PaymentView)),
)]
async fn get_payment(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<PaymentId>,
) -> Result<Json<PaymentView>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    // Parsed after the scope check (a key without it gets 403, whatever
    // the path): an id that cannot exist is a missing payment.
    let id = id.get()?;
    payments::find(&state, who.tenant(), &id)
        .await?
        .map(|p| Json(p.into()))
        .ok_or_else(|| ApiError::not_found("payment", &id))
}
