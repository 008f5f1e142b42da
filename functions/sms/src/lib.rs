//! The SMS function: `POST /v1/sms/notify-pending-payment` (scope
//! `payments:write`). The rules are `shared::domain::sms`; this function
//! validates, applies the guards, logs (sandbox) or queues (live) the
//! reminder. `functions/sms-dispatcher` sends it.

use axum::extract::{Extension, State};
use axum::routing::post;
use axum::{Json, Router};
use edge::idempotency::{self, Fence};
use edge::{ApiError, Auth, JsonBody, with_edge};
use http::HeaderMap;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::sms::{self, Limits, NotifyOutcome, NotifyRequest};

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route(
                "/v1/sms/notify-pending-payment",
                idempotency::on(&state, post(notify)),
            )
            .with_state(state),
    )
}

async fn notify(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: HeaderMap,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<NotifyRequest>, ApiError>,
) -> Result<Json<NotifyOutcome>, ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let base = state.config.base_for(host);
    let fence = fence.as_ref().map(|Extension(f)| f);
    let outcome = sms::notify(&state, who, body, &base, Limits::default(), fence).await?;
    Ok(Json(outcome))
}
