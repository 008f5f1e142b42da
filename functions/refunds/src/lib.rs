//! The refunds function: `POST /v1/refunds`, `GET /v1/refunds`,
//! `GET /v1/refunds/{id}`.
//!
//! The POST goes through the idempotency layer and puts the request's fence
//! in the refund's own transaction: a retry after a lost answer gets the
//! first refund, never a second one.

use axum::Router;
use axum::extract::{Extension, State};
use edge::Json;
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::{FilterParams, PageParams, list_filter};
use edge::{ApiError, Auth, JsonBody, Page, Pagination, PathId, QueryParams, with_edge};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::refunds::{self, CreateRefund, RefundStatus, RefundView};
use shared::ids::{IdKind, PaymentId, RefundId};

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_refund, list_refunds)))
        .routes(routes!(get_refund))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

#[utoipa::path(
    post, path = "/v1/refunds", tag = "Refunds", operation_id = "createRefund",
    request_body = CreateRefund,
    security(("bearer" = ["refunds:write"])),
    responses(
        (status = 201, description = "The refund (`pending` until the provider answers, or `succeeded`).", body = RefundView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = RefundView),
        (status = 404, description = "No such payment (`not_found`, param `paymentId`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "A refund of this payment is in progress.", body = edge::openapi::ErrorEnvelope),
        (status = 422, description = "Not refundable: amount over what is left, payment not succeeded, or the provider takes no API refunds.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_refund(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateRefund>, ApiError>,
) -> Result<(StatusCode, Json<RefundView>), ApiError> {
    let who = auth.require(Scope::RefundsWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let payment_id = body.payment()?;
    let refund = refunds::create(
        &state,
        who.tenant(),
        payment_id,
        body,
        state.clock.now(),
        fence,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(refund.into())))
}

#[utoipa::path(
    get, path = "/v1/refunds", tag = "Refunds", operation_id = "listRefunds",
    params(PageParams, FilterParams, ("paymentId" = Option<String>, Query, description = "Only this payment's refunds.")),
    security(("bearer" = ["refunds:read"])),
    responses((status = 200, description = "A page of refunds, newest first.", body = Page<RefundView>)),
)]
async fn list_refunds(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<RefundView>>, ApiError> {
    let who = auth.require(Scope::RefundsRead)?;
    let page = Pagination::from_query(&query, refunds::DEFAULT_PAGE, IdKind::Refund)?;
    let filter = list_filter::<RefundStatus>(&query)?;
    let payment_id = match query.get("paymentId").filter(|p| !p.is_empty()) {
        None => None,
        Some(raw) => match PaymentId::parse(raw) {
            Some(id) => Some(id),
            // No payment has that id: none of its refunds either.
            None => return Ok(Json(Page::new(Vec::new(), 0, page))),
        },
    };
    let (found, total) = refunds::list_where(
        &state,
        who.tenant(),
        payment_id.as_ref(),
        &filter,
        page.window(),
    )
    .await?;
    let data = found.into_iter().map(RefundView::from).collect();
    Ok(Json(Page::new(data, total, page)))
}

#[utoipa::path(
    get, path = "/v1/refunds/{id}", tag = "Refunds", operation_id = "getRefund",
    params(("id" = String, Path, description = "A refund id, `re_…`.")),
    security(("bearer" = ["refunds:read"])),
    responses((status = 200, description = "The refund.", body = RefundView)),
)]
async fn get_refund(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<RefundId>,
) -> Result<Json<RefundView>, ApiError> {
    let who = auth.require(Scope::RefundsRead)?;
    // Parsed after the scope check (a key without it gets 403, whatever
    // the path): an id that cannot exist is a missing refund.
    let id = id.get()?;
    refunds::find(&state, who.tenant(), &id)
        .await?
        .map(|r| Json(r.into()))
        .ok_or_else(|| ApiError::not_found("refund", &id))
}
