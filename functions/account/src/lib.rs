//! The account function: `GET /v1/account` and
//! `GET /v1/analytics/overview` (the "Account and analytics" group).

use axum::Router;
use axum::extract::State;
use edge::Json;
use edge::openapi::{OpenApiRouter, routes};
use edge::{ApiError, Auth, QueryParams, with_edge};
use shared::AppState;
use shared::domain::account::{self, AccountView, Scope};
use shared::domain::analytics::{self, Overview};

/// The function's routes and their description, one value.
pub fn routes(_state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_account))
        .routes(routes!(get_overview))
}

/// The function's routes, wrapped in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// The calling key's merchant, project, key, plan and entitlements.
#[utoipa::path(
    get, path = "/v1/account", tag = "Account", operation_id = "getAccount",
    security(("bearer" = ["account:read"])),
    responses((status = 200, description = "The account context of this key.", body = AccountView)),
)]
async fn get_account(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<AccountView>, ApiError> {
    let who = auth.require(Scope::AccountRead)?;
    Ok(Json(account::account_view(&state, who).await?))
}

/// Payments, conversion and providers over the last `days` UTC days,
/// today included.
#[utoipa::path(
    get, path = "/v1/analytics/overview", tag = "Account", operation_id = "getAnalyticsOverview",
    params(("days" = Option<u32>, Query, minimum = 1, maximum = 90, description = "Days in the window, today included (default 30).")),
    security(("bearer" = ["analytics:read"])),
    responses((status = 200, description = "The overview.", body = Overview)),
)]
async fn get_overview(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Overview>, ApiError> {
    auth.require(Scope::AnalyticsRead)?;
    let days =
        analytics::parse_days(query.get("days")).map_err(|m| ApiError::validation("days", m))?;
    Ok(Json(
        analytics::overview(&state, auth.tenant(), days).await?,
    ))
}
