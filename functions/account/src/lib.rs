//! The account function: `GET /v1/account`.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::AppState;
use shared::domain::account::{self, AccountView, Scope};
use shared::http::{ApiError, Auth, with_edge};

/// The function's routes, wrapped in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route("/v1/account", get(get_account))
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
