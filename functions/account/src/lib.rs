//! The account function: `GET /v1/account` and
//! `GET /v1/analytics/overview` (the "Account and analytics" group).

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use edge::{ApiError, Auth, QueryParams, with_edge};
use shared::AppState;
use shared::domain::account::{self, AccountView, Scope};
use shared::domain::analytics::{self, Overview};

/// The function's routes, wrapped in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route("/v1/account", get(get_account))
            .route("/v1/analytics/overview", get(get_overview))
            .with_state(state),
    )
}

async fn get_account(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<AccountView>, ApiError> {
    let who = auth.require(Scope::AccountRead)?;
    Ok(Json(account::account_view(&*state.store, who).await?))
}

/// `days` 1..=90 (default 30): the last `days` UTC days, today included.
async fn get_overview(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Overview>, ApiError> {
    auth.require(Scope::AnalyticsRead)?;
    let days =
        analytics::parse_days(query.get("days")).map_err(|m| ApiError::validation("days", m))?;
    let now = state.clock.now();
    Ok(Json(
        analytics::overview(&*state.store, auth.project_id(), auth.mode(), days, now).await?,
    ))
}
