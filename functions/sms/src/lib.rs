//! The SMS function: `POST /v1/sms/notify-pending-payment` (scope
//! `payments:write`). The rules are `shared::domain::sms`; this function
//! validates, applies the guards, logs (sandbox) or queues (live) the
//! reminder. `functions/sms-dispatcher` sends it.

use axum::extract::{Extension, State};
use axum::routing::post;
use axum::{Json, Router};
use edge::idempotency::{self, Fence};
use edge::{ApiError, Auth, ErrorType, JsonBody, with_edge};
use http::{HeaderMap, StatusCode};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::sms::{self, Limits, NotifyOutcome, NotifyRequest, SmsError};

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

/// The one place SMS refusals become answers.
pub fn api_error(err: SmsError) -> ApiError {
    match err {
        SmsError::Invalid { field, message } => ApiError::validation(field, message),
        e @ SmsError::PhoneNotOnSession => ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            "phone_not_on_session",
            e.to_string(),
        )
        .with_param("customerPhone"),
        e @ (SmsError::InvalidCheckoutHost { .. } | SmsError::ForeignCheckoutSession { .. }) => {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorType::InvalidRequestError,
                "invalid_checkout_host",
                e.to_string(),
            )
            .with_param("checkoutUrl")
        }
        SmsError::RateLimited {
            which,
            retry_after_secs,
        } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::RateLimitError,
            "rate_limited",
            format!("Too many SMS reminders ({which}); retry later"),
        )
        .with_header("retry-after", retry_after_secs.to_string()),
        SmsError::Store(e) => e.into(),
        SmsError::Queue(e) => {
            tracing::error!(error = %e, "SMS queue send failed");
            ApiError::unavailable()
        }
    }
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
    sms::notify(&state, who, body, &base, Limits::default(), fence)
        .await
        .map(Json)
        .map_err(api_error)
}
