//! The refunds function: `POST /v1/refunds`, `GET /v1/refunds`,
//! `GET /v1/refunds/{id}`.
//!
//! The POST goes through the idempotency layer and puts the request's fence
//! in the refund's own transaction: a retry after a lost answer gets the
//! first refund, never a second one.

use axum::extract::{Extension, Path, State};
use axum::routing::get;
use axum::{Json, Router};
use edge::idempotency::{self, Fence};
use edge::{ApiError, Auth, JsonBody, Page, Pagination, QueryParams, with_edge};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::refunds::{self, CreateRefund, RefundView};

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route(
                "/v1/refunds",
                idempotency::on(&state, get(list_refunds).post(create_refund)),
            )
            .route("/v1/refunds/{id}", get(get_refund))
            .with_state(state),
    )
}

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
    let refund = refunds::create(
        &state,
        who.project_id(),
        who.mode(),
        body,
        state.clock.now(),
        fence,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(refund.into())))
}

async fn list_refunds(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<RefundView>>, ApiError> {
    let who = auth.require(Scope::RefundsRead)?;
    let page = Pagination::from_query(&query, refunds::DEFAULT_PAGE)?;
    let payment_id = query.get("paymentId").filter(|p| !p.is_empty());
    let (found, total) = refunds::list(
        &*state.store,
        who.project_id(),
        who.mode(),
        payment_id,
        page.offset,
        page.limit,
    )
    .await?;
    let data = found.into_iter().map(RefundView::from).collect();
    Ok(Json(Page::new(data, total, page)))
}

async fn get_refund(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<RefundView>, ApiError> {
    let who = auth.require(Scope::RefundsRead)?;
    refunds::find(&*state.store, who.project_id(), who.mode(), &id)
        .await?
        .map(|r| Json(r.into()))
        .ok_or_else(|| ApiError::not_found("refund", &id))
}
