//! The payment links function: `POST /v1/payment-links`,
//! `GET /v1/payment-links`, `GET|PATCH|DELETE /v1/payment-links/{id}`,
//! `POST /v1/payment-links/{id}/cancel`. The public page is in
//! `functions/hosted`.

use axum::extract::{Extension, Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use edge::idempotency::{self, Fence};
use edge::{ApiError, Auth, JsonBody, Page, Pagination, QueryParams, with_edge};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::links::{self, CreateLink, PatchLink, PaymentLinkView};

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route(
                "/v1/payment-links",
                idempotency::on(&state, get(list_links).post(create_link)),
            )
            .route(
                "/v1/payment-links/{id}",
                idempotency::on(&state, get(get_link).patch(patch_link).delete(delete_link)),
            )
            .route(
                "/v1/payment-links/{id}/cancel",
                idempotency::on(&state, post(cancel_link)),
            )
            .with_state(state),
    )
}

fn base(state: &AppState, headers: &HeaderMap) -> String {
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    state.config.base_for(host)
}

async fn create_link(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: HeaderMap,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateLink>, ApiError>,
) -> Result<(StatusCode, Json<PaymentLinkView>), ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let JsonBody(body) = body?;
    let link = links::new_link(who.project_id(), who.mode(), body, state.clock.now())?;
    links::check_spend_cap(&link, who.key.spend_cap_paisa)?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let link = links::insert_once(&*state.store, &link, fence).await?;
    let view = PaymentLinkView::of(link, &base(&state, &headers), false);
    Ok((StatusCode::CREATED, Json(view)))
}

async fn list_links(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Json<Page<PaymentLinkView>>, ApiError> {
    let who = auth.require(Scope::LinksRead)?;
    let page = Pagination::from_query(&query, links::DEFAULT_PAGE)?;
    let active = match query.get("active") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(ApiError::validation(
                "active",
                format!("active must be true or false, got {other:?}"),
            ));
        }
    };
    let (found, total) = links::list(
        &*state.store,
        who.project_id(),
        who.mode(),
        active,
        page.offset,
        page.limit,
    )
    .await?;
    let base = base(&state, &headers);
    let data = found
        .into_iter()
        .map(|l| PaymentLinkView::of(l, &base, false))
        .collect();
    Ok(Json(Page::new(data, total, page)))
}

async fn get_link(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<PaymentLinkView>, ApiError> {
    let who = auth.require(Scope::LinksRead)?;
    links::find(&*state.store, who.project_id(), who.mode(), &id)
        .await?
        .map(|l| Json(PaymentLinkView::of(l, &base(&state, &headers), true)))
        .ok_or_else(|| ApiError::not_found("payment link", &id))
}

async fn patch_link(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    Path(id): Path<String>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<PatchLink>, ApiError>,
) -> Result<Json<PaymentLinkView>, ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let JsonBody(body) = body?;
    let link = links::patch(
        &*state.store,
        who.project_id(),
        who.mode(),
        &id,
        body,
        state.clock.now(),
    )
    .await?;
    Ok(Json(PaymentLinkView::of(
        link,
        &base(&state, &headers),
        false,
    )))
}

async fn cancel_link(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<PaymentLinkView>, ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let link = links::cancel(
        &*state.store,
        who.project_id(),
        who.mode(),
        &id,
        state.clock.now(),
    )
    .await?;
    Ok(Json(PaymentLinkView::of(
        link,
        &base(&state, &headers),
        false,
    )))
}

async fn delete_link(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let deleted = links::delete(&*state.store, who.project_id(), who.mode(), &id).await?;
    Ok(Json(
        json!({"deleted": true, "id": deleted, "livemode": who.mode().is_live()}),
    ))
}
