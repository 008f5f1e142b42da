//! The SMS function: `POST /v1/sms/notify-pending-payment` (scope
//! `payments:write`). The rules are `shared::domain::sms`; this function
//! validates, applies the guards, logs (sandbox) or queues (live) the
//! reminder. `functions/sms-dispatcher` sends it.

use axum::Router;
use axum::extract::{Extension, State};
use edge::Json;
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, JsonBody, with_edge};
use http::HeaderMap;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::sms::{self, Limits, NotifyOutcome, NotifyRequest};

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(idempotent(state, routes!(notify)))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// Text the customer a reminder of a pending checkout (live: queued for
/// sending; sandbox: logged, nothing sent).
#[utoipa::path(
    post, path = "/v1/sms/notify-pending-payment", tag = "SMS", operation_id = "notifyPendingPayment",
    request_body = NotifyRequest,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 200, description = "What happened to the reminder.", body = NotifyOutcome),
        (status = 400, description = "Invalid, or a guard refused it (`phone_not_on_session`, `invalid_checkout_host`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
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
    let base = edge::requests::public_base(&state, &headers);
    let fence = fence.as_ref().map(|Extension(f)| f);
    let outcome = sms::notify(&state, who, body, &base, Limits::default(), fence).await?;
    Ok(Json(outcome))
}
