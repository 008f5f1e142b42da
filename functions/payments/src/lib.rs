//! The payments function: `GET /v1/payments`, `GET /v1/payments/{id}`.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use edge::{ApiError, Auth, Page, Pagination, QueryParams, with_edge};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::payments::{self, PaymentView};

/// The function's routes, wrapped in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route("/v1/payments", get(list_payments))
            .route("/v1/payments/{id}", get(get_payment))
            .with_state(state),
    )
}

async fn list_payments(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<PaymentView>>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let page = Pagination::from_query(&query, payments::DEFAULT_PAGE)?;
    let (found, total) = payments::list(
        &*state.store,
        who.project_id(),
        who.mode(),
        page.offset,
        page.limit,
    )
    .await?;
    let data = found.into_iter().map(PaymentView::from).collect();
    Ok(Json(Page::new(data, total, page)))
}

async fn get_payment(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<PaymentView>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    payments::find(&*state.store, who.project_id(), who.mode(), &id)
        .await?
        .map(|p| Json(p.into()))
        .ok_or_else(|| ApiError::not_found("payment", &id))
}
