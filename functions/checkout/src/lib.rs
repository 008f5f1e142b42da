//! The checkout function: `POST /v1/checkout`, `POST /v1/checkout/{id}/expire`,
//! `GET /v1/sessions`, `GET /v1/sessions/{id}`, `GET /v1/providers`.
//!
//! Every POST goes through the idempotency layer; the create puts the
//! request's fence in its own transaction, so a retry after a lost answer
//! returns the first session instead of creating a second one.

use axum::Router;
use axum::extract::{Extension, State};
use edge::Json;
use edge::PathId;
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::PageParams;
use edge::{ApiError, Auth, JsonBody, Page, Pagination, QueryParams, with_edge};
use http::StatusCode;
use serde::Serialize;
use shared::AppState;
use shared::domain::Provider;
use shared::domain::account::Scope;
use shared::domain::checkout::{
    self, CheckoutSession, CheckoutSessionView, CreateCheckout, Creator, Flow,
    ProviderAvailability, SessionStatus,
};
use shared::ids::{IdKind, SessionId};
use shared::time::Timestamp;

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_checkout)))
        .routes(idempotent(state, routes!(expire_checkout)))
        .routes(routes!(list_sessions))
        .routes(routes!(get_session))
        .routes(routes!(list_providers))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// The answer of `POST /v1/checkout` (snake_case, decisions.md).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = CheckoutCreated)]
struct Created {
    id: String,
    livemode: bool,
    checkout_url: String,
    flow: Flow,
    #[schema(required)]
    provider: Option<Provider>,
    expires_at: Timestamp,
}

/// The answer of `POST /v1/checkout/{id}/expire`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = CheckoutExpired)]
struct Expired {
    id: String,
    status: SessionStatus,
    flow: Flow,
    #[schema(required)]
    provider: Option<Provider>,
    expires_at: Timestamp,
}

#[derive(Serialize, utoipa::ToSchema)]
struct ProviderList {
    data: Vec<ProviderAvailability>,
    /// The enabled providers' names, as SDKs written for the contract's
    /// product read them (`providers: ["esewa", ...]`).
    #[schema(value_type = Vec<Provider>)]
    providers: Vec<&'static str>,
}

/// Create a checkout session: send the customer to `checkout_url`.
#[utoipa::path(
    post, path = "/v1/checkout", tag = "Checkout", operation_id = "createCheckout",
    request_body = CreateCheckout,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 201, description = "The session.", body = Created),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = Created),
        (status = 422, description = "A business rule refused it (`provider_unavailable`, `fonepay_sandbox_cap`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_checkout(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: http::HeaderMap,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateCheckout>, ApiError>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let base = edge::requests::public_base(&state, &headers);
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let valid = checkout::validate_create(body, who.mode())?;
    let creator = Creator::of(who);
    let now = state.clock.now();
    let fence = fence.as_ref().map(|Extension(f)| f);
    let s = checkout::create(&state, &creator, valid, now, fence).await?;
    let created = Created {
        checkout_url: format!("{base}/c/{}", s.id),
        livemode: s.mode.is_live(),
        id: s.id.into(),
        flow: s.flow,
        provider: s.provider,
        expires_at: s.expires_at,
    };
    Ok((StatusCode::CREATED, Json(created)))
}

/// Expire an open session now; its pending payment is cancelled.
#[utoipa::path(
    post, path = "/v1/checkout/{id}/expire", tag = "Checkout", operation_id = "expireCheckout",
    params(("id" = String, Path, description = "A checkout session id, `cs_…`.")),
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 200, description = "The session, expired (or already final).", body = Expired),
        (status = 409, description = "The session was paid or is being paid.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn expire_checkout(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SessionId>,
) -> Result<Json<Expired>, ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let id = id.get()?;
    let s: CheckoutSession = checkout::expire(&state, who.tenant(), &id)
        .await?
        .ok_or_else(|| ApiError::not_found("checkout session", &id))?;
    Ok(Json(Expired {
        provider: s.current_provider(),
        id: s.id.into(),
        status: s.status,
        flow: s.flow,
        expires_at: s.expires_at,
    }))
}

/// List checkout sessions, newest first.
#[utoipa::path(
    get, path = "/v1/sessions", tag = "Checkout", operation_id = "listSessions",
    params(PageParams, ("status" = Option<String>, Query, description = "Only sessions in this status: `pending`, `initiated`, `success`, `failed` or `expired` (an open session past its time is `expired`); an unknown value is ignored, as the contract says.")),
    security(("bearer" = ["sessions:read"])),
    responses((status = 200, description = "A page of sessions.", body = Page<CheckoutSessionView>)),
)]
async fn list_sessions(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<CheckoutSessionView>>, ApiError> {
    let who = auth.require(Scope::SessionsRead)?;
    let page = Pagination::from_query(&query, checkout::DEFAULT_PAGE, IdKind::CheckoutSession)?;
    // The spec: unrecognised status values are ignored.
    let status = query.get("status").and_then(SessionStatus::parse);
    let now = state.clock.now();
    let (found, total) = checkout::list(&state, who.tenant(), status, now, page.window()).await?;
    let data = found
        .into_iter()
        .map(|s| CheckoutSessionView::at(s, now))
        .collect();
    Ok(Json(Page::new(data, total, page)))
}

/// Retrieve a checkout session.
#[utoipa::path(
    get, path = "/v1/sessions/{id}", tag = "Checkout", operation_id = "getSession",
    params(("id" = String, Path, description = "A checkout session id, `cs_…`.")),
    security(("bearer" = ["sessions:read"])),
    responses((status = 200, description = "The session.", body = CheckoutSessionView)),
)]
async fn get_session(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SessionId>,
) -> Result<Json<CheckoutSessionView>, ApiError> {
    let who = auth.require(Scope::SessionsRead)?;
    let now = state.clock.now();
    let id = id.get()?;
    checkout::find(&state, who.tenant(), &id, now)
        .await?
        .map(|s| Json(CheckoutSessionView::at(s, now)))
        .ok_or_else(|| ApiError::not_found("checkout session", &id))
}

/// Scope `payments:read` (decisions.md): what a server needs before it
/// creates a checkout is which providers it may name.
#[utoipa::path(
    get, path = "/v1/providers", tag = "Checkout", operation_id = "listProviders",
    security(("bearer" = ["payments:read"])),
    responses((status = 200, description = "Every provider, and whether this project can use it in this mode.", body = ProviderList)),
)]
async fn list_providers(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<ProviderList>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let data = checkout::providers(&state, who.tenant()).await?;
    let providers = data
        .iter()
        .filter(|p| p.enabled)
        .map(|p| p.provider.as_str())
        .collect();
    Ok(Json(ProviderList { data, providers }))
}
