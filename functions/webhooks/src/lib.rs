//! The webhooks function: `POST /v1/webhooks`, `GET /v1/webhooks`,
//! `GET|PATCH|DELETE /v1/webhooks/{id}`, `GET /v1/webhooks/{id}/deliveries`
//! and `POST /v1/webhooks/{id}/test` (a test event of one type, for that
//! endpoint only). Delivery itself is `functions/webhook-dispatcher`.

use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use edge::idempotency::{self, Fence, Redact};
use edge::{ApiError, Auth, JsonBody, with_edge};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::outbox::EventType;
use shared::domain::webhooks::{self, CreateEndpoint, DeliveryView, EndpointView, PatchEndpoint};

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route(
                "/v1/webhooks",
                idempotency::on(&state, get(list_endpoints).post(create_endpoint)),
            )
            .route(
                "/v1/webhooks/{id}",
                idempotency::on(
                    &state,
                    get(get_endpoint)
                        .patch(patch_endpoint)
                        .delete(delete_endpoint),
                ),
            )
            .route("/v1/webhooks/{id}/deliveries", get(list_deliveries))
            .route(
                "/v1/webhooks/{id}/test",
                idempotency::on(&state, post(send_test)),
            )
            .with_state(state),
    )
}

async fn create_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateEndpoint>, ApiError>,
) -> Result<Response, ApiError> {
    let who = auth.require(Scope::WebhooksWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let (endpoint, secret) =
        webhooks::create(&state, who.project_id(), who.mode(), body, fence).await?;
    tracing::info!(endpoint_id = %endpoint.id, "webhook endpoint registered");
    let mut res = (
        StatusCode::CREATED,
        Json(EndpointView::of(&endpoint, secret)),
    )
        .into_response();
    // The secret is shown once: a replay of this answer leaves it out.
    res.extensions_mut().insert(Redact(&["signing_secret"]));
    Ok(res)
}

async fn list_endpoints(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<Value>, ApiError> {
    let who = auth.require(Scope::WebhooksRead)?;
    let found = webhooks::list(&*state.store, who.project_id(), who.mode()).await?;
    let data: Vec<EndpointView> = found.iter().map(|e| EndpointView::of(e, None)).collect();
    Ok(Json(json!({ "data": data })))
}

async fn get_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<EndpointView>, ApiError> {
    let who = auth.require(Scope::WebhooksRead)?;
    let endpoint = webhooks::get(&*state.store, who.project_id(), who.mode(), &id).await?;
    Ok(Json(EndpointView::of(&endpoint, None)))
}

async fn patch_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<PatchEndpoint>, ApiError>,
) -> Result<Json<EndpointView>, ApiError> {
    let who = auth.require(Scope::WebhooksWrite)?;
    let JsonBody(body) = body?;
    let endpoint = webhooks::patch(&state, who.project_id(), who.mode(), &id, body).await?;
    Ok(Json(EndpointView::of(&endpoint, None)))
}

async fn delete_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let who = auth.require(Scope::WebhooksWrite)?;
    webhooks::delete(&*state.store, who.project_id(), who.mode(), &id).await?;
    tracing::info!(endpoint_id = %id, "webhook endpoint deleted");
    Ok(Json(json!({"deleted": true, "id": id})))
}

async fn list_deliveries(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let who = auth.require(Scope::WebhooksRead)?;
    let found = webhooks::deliveries(&*state.store, who.project_id(), who.mode(), &id).await?;
    let data: Vec<DeliveryView> = found.iter().map(DeliveryView::from).collect();
    Ok(Json(json!({ "data": data })))
}

/// `POST /v1/webhooks/{id}/test`: `{"type": "<event type>"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestEvent {
    #[serde(rename = "type")]
    event_type: String,
}

async fn send_test(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<TestEvent>, ApiError>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let who = auth.require(Scope::WebhooksWrite)?;
    let JsonBody(body) = body?;
    let t = EventType::parse(&body.event_type).ok_or_else(|| {
        ApiError::validation(
            "type",
            format!(
                "{:?} is not an event type; use one of {}",
                body.event_type,
                EventType::ALL.map(|t| t.as_str()).join(", ")
            ),
        )
    })?;
    let event = webhooks::send_test_event(&state, who.project_id(), who.mode(), &id, t).await?;
    Ok((StatusCode::ACCEPTED, Json(event.body())))
}
