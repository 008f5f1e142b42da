//! The webhooks function: `POST /v1/webhooks`, `GET /v1/webhooks`,
//! `GET|PATCH|DELETE /v1/webhooks/{id}`, `GET /v1/webhooks/{id}/deliveries`
//! and `POST /v1/webhooks/{id}/test` (a test event of one type, for that
//! endpoint only). Delivery itself is `functions/webhook-dispatcher`.

pub mod events;

use axum::Router;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use edge::Json;
use edge::idempotency::{Fence, Redact};
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::PageParams;
use edge::{ApiError, Auth, JsonBody, Pagination, PathId, QueryParams, with_edge};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::outbox::EventType;
use shared::domain::webhooks::{self, CreateEndpoint, DeliveryView, EndpointView, PatchEndpoint};
use shared::ids::{EndpointId, IdKind};

pub use events::events;

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    // The events' billing resources are components of the document.
    OpenApiRouter::with_openapi(events::resources())
        .routes(idempotent(state, routes!(create_endpoint, list_endpoints)))
        .routes(idempotent(
            state,
            routes!(get_endpoint, patch_endpoint, delete_endpoint),
        ))
        .routes(routes!(list_deliveries))
        .routes(idempotent(state, routes!(send_test)))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// Register a webhook endpoint. Its `signing_secret` is in this answer
/// only.
#[utoipa::path(
    post, path = "/v1/webhooks", tag = "Webhooks", operation_id = "createWebhookEndpoint",
    request_body = CreateEndpoint,
    security(("bearer" = ["webhooks:write"])),
    responses(
        (status = 201, description = "The endpoint, with its signing secret.", body = EndpointView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`, without the secret.", body = EndpointView),
        (status = 422, description = "The project has its maximum of endpoints (`webhook_endpoint_limit`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
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
    let (endpoint, secret) = webhooks::create(&state, who.tenant(), body, fence).await?;
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

/// List webhook endpoints.
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "Webhooks", operation_id = "listWebhookEndpoints",
    security(("bearer" = ["webhooks:read"])),
    responses((status = 200, description = "Every endpoint of this project and mode.", body = EndpointList)),
)]
async fn list_endpoints(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<EndpointList>, ApiError> {
    let who = auth.require(Scope::WebhooksRead)?;
    let found = webhooks::list(&state, who.tenant()).await?;
    let data = found.iter().map(|e| EndpointView::of(e, None)).collect();
    Ok(Json(EndpointList { data }))
}

/// Retrieve a webhook endpoint.
#[utoipa::path(
    get, path = "/v1/webhooks/{id}", tag = "Webhooks", operation_id = "getWebhookEndpoint",
    params(("id" = String, Path, description = "A webhook endpoint id, `we_…`.")),
    security(("bearer" = ["webhooks:read"])),
    responses((status = 200, description = "The endpoint.", body = EndpointView)),
)]
async fn get_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<EndpointId>,
) -> Result<Json<EndpointView>, ApiError> {
    let who = auth.require(Scope::WebhooksRead)?;
    let id = id.get()?;
    let endpoint = webhooks::get(&state, who.tenant(), &id).await?;
    Ok(Json(EndpointView::of(&endpoint, None)))
}

/// Change a webhook endpoint: only the keys sent change.
#[utoipa::path(
    patch, path = "/v1/webhooks/{id}", tag = "Webhooks", operation_id = "updateWebhookEndpoint",
    params(("id" = String, Path, description = "A webhook endpoint id, `we_…`.")),
    request_body = PatchEndpoint,
    security(("bearer" = ["webhooks:write"])),
    responses((status = 200, description = "The endpoint as changed.", body = EndpointView)),
)]
async fn patch_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<EndpointId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<PatchEndpoint>, ApiError>,
) -> Result<Json<EndpointView>, ApiError> {
    let who = auth.require(Scope::WebhooksWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let endpoint = webhooks::patch(&state, who.tenant(), &id, body).await?;
    Ok(Json(EndpointView::of(&endpoint, None)))
}

/// Delete a webhook endpoint; its pending deliveries end.
#[utoipa::path(
    delete, path = "/v1/webhooks/{id}", tag = "Webhooks", operation_id = "deleteWebhookEndpoint",
    params(("id" = String, Path, description = "A webhook endpoint id, `we_…`.")),
    security(("bearer" = ["webhooks:write"])),
    responses((status = 200, description = "Deleted.", body = EndpointDeleted)),
)]
async fn delete_endpoint(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<EndpointId>,
) -> Result<Json<EndpointDeleted>, ApiError> {
    let who = auth.require(Scope::WebhooksWrite)?;
    let id = id.get()?;
    webhooks::delete(&state, who.tenant(), &id).await?;
    tracing::info!(endpoint_id = %id, "webhook endpoint deleted");
    Ok(Json(EndpointDeleted {
        deleted: true,
        id: id.into(),
    }))
}

/// The endpoint's deliveries, newest first: the last 50 (the contract),
/// older ones by `starting_after` (the last id of a page) or `offset`, at
/// the cost of one page whatever the depth (`listing::counted`).
#[utoipa::path(
    get, path = "/v1/webhooks/{id}/deliveries", tag = "Webhooks", operation_id = "listWebhookDeliveries",
    params(("id" = String, Path, description = "A webhook endpoint id, `we_…`."), PageParams),
    security(("bearer" = ["webhooks:read"])),
    responses((status = 200, description = "The deliveries.", body = DeliveryList)),
)]
async fn list_deliveries(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<EndpointId>,
    query: QueryParams,
) -> Result<Json<DeliveryList>, ApiError> {
    let who = auth.require(Scope::WebhooksRead)?;
    let id = id.get()?;
    let page = Pagination::from_query(&query, webhooks::DELIVERY_LOG, IdKind::WebhookDelivery)?;
    let (found, _) = webhooks::deliveries_page(&state, who.tenant(), &id, page.window()).await?;
    let data = found.iter().map(DeliveryView::from).collect();
    Ok(Json(DeliveryList { data }))
}

/// `POST /v1/webhooks/{id}/test`: `{"type": "<event type>"}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = WebhookTestEvent)]
struct TestEvent {
    #[serde(rename = "type")]
    #[schema(value_type = EventType)]
    event_type: String,
}

/// `GET /v1/webhooks`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WebhookEndpointList)]
struct EndpointList {
    data: Vec<EndpointView>,
}

/// `GET /v1/webhooks/{id}/deliveries`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WebhookDeliveryList)]
struct DeliveryList {
    data: Vec<DeliveryView>,
}

/// The answer of a delete.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WebhookEndpointDeleted)]
struct EndpointDeleted {
    deleted: bool,
    id: String,
}

/// Send the endpoint (and only it) a test event of one type.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/test", tag = "Webhooks", operation_id = "sendWebhookTestEvent",
    params(("id" = String, Path, description = "A webhook endpoint id, `we_…`.")),
    request_body = TestEvent,
    security(("bearer" = ["webhooks:write"])),
    responses(
        (status = 202, description = "The event, queued for this endpoint.", body = events::Event),
        (status = 422, description = "The endpoint is disabled.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn send_test(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<EndpointId>,
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
    let id = id.get()?;
    let event = webhooks::send_test_event(&state, who.tenant(), &id, t).await?;
    Ok((StatusCode::ACCEPTED, Json(event.body())))
}
