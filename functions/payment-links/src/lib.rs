//! The payment links function: `POST /v1/payment-links`,
//! `GET /v1/payment-links`, `GET|PATCH|DELETE /v1/payment-links/{id}`,
//! `POST /v1/payment-links/{id}/cancel`. The public page is in
//! `functions/hosted`.

use axum::Router;
use axum::extract::{Extension, State};
use edge::Json;
use edge::PathId;
use edge::answers::Deleted;
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::PageParams;
use edge::{ApiError, Auth, JsonBody, Page, Pagination, QueryParams, with_edge};
use http::{HeaderMap, StatusCode};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::links::{self, CreateLink, PatchLink, PaymentLinkView};
use shared::ids::{IdKind, LinkId};

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_link, list_links)))
        .routes(idempotent(
            state,
            routes!(get_link, patch_link, delete_link),
        ))
        .routes(idempotent(state, routes!(cancel_link)))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// Create a payment link: a reusable public page at `url`.
#[utoipa::path(
    post, path = "/v1/payment-links", tag = "Payment links", operation_id = "createPaymentLink",
    request_body = CreateLink,
    security(("bearer" = ["links:write"])),
    responses(
        (status = 201, description = "The link.", body = PaymentLinkView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = PaymentLinkView),
    ),
)]
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
    let link = links::new_link(who.tenant(), body, state.clock.now())?;
    links::check_spend_cap(&link, who.key.spend_cap_paisa)?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let link = links::insert_once(&state, &link, fence, Vec::new()).await?;
    let view = PaymentLinkView::of(link, &edge::requests::public_base(&state, &headers), false);
    Ok((StatusCode::CREATED, Json(view)))
}

/// List payment links, newest first.
#[utoipa::path(
    get, path = "/v1/payment-links", tag = "Payment links", operation_id = "listPaymentLinks",
    params(PageParams, ("active" = Option<bool>, Query, description = "Only active (`true`) or inactive (`false`) links.")),
    security(("bearer" = ["links:read"])),
    responses((status = 200, description = "A page of links.", body = Page<PaymentLinkView>)),
)]
async fn list_links(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Json<Page<PaymentLinkView>>, ApiError> {
    let who = auth.require(Scope::LinksRead)?;
    let page = Pagination::from_query(&query, links::DEFAULT_PAGE, IdKind::PaymentLink)?;
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
    let (found, total) = links::list(&state, who.tenant(), active, page.window()).await?;
    let base = edge::requests::public_base(&state, &headers);
    let data = found
        .into_iter()
        .map(|l| PaymentLinkView::of(l, &base, false))
        .collect();
    Ok(Json(Page::new(data, total, page)))
}

/// Retrieve a payment link, with its payment stats.
#[utoipa::path(
    get, path = "/v1/payment-links/{id}", tag = "Payment links", operation_id = "getPaymentLink",
    params(("id" = String, Path, description = "A payment link id, `plink_…`.")),
    security(("bearer" = ["links:read"])),
    responses((status = 200, description = "The link.", body = PaymentLinkView)),
)]
async fn get_link(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    id: PathId<LinkId>,
) -> Result<Json<PaymentLinkView>, ApiError> {
    let who = auth.require(Scope::LinksRead)?;
    let id = id.get()?;
    links::find(&state, who.tenant(), &id)
        .await?
        .map(|l| {
            Json(PaymentLinkView::of(
                l,
                &edge::requests::public_base(&state, &headers),
                true,
            ))
        })
        .ok_or_else(|| ApiError::not_found("payment link", &id))
}

/// Change a payment link: only the keys sent change; `null` clears one
/// that may be cleared.
#[utoipa::path(
    patch, path = "/v1/payment-links/{id}", tag = "Payment links", operation_id = "updatePaymentLink",
    params(("id" = String, Path, description = "A payment link id, `plink_…`.")),
    request_body = PatchLink,
    security(("bearer" = ["links:write"])),
    responses(
        (status = 200, description = "The link as changed.", body = PaymentLinkView),
        (status = 422, description = "Not with the link's uses or state (`link_used`, `link_inactive`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn patch_link(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    id: PathId<LinkId>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<PatchLink>, ApiError>,
) -> Result<Json<PaymentLinkView>, ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let link = links::patch(
        &state,
        who.tenant(),
        &id,
        body,
        state.clock.now(),
        Vec::new(),
    )
    .await?;
    Ok(Json(PaymentLinkView::of(
        link,
        &edge::requests::public_base(&state, &headers),
        false,
    )))
}

/// Deactivate a payment link for good.
#[utoipa::path(
    post, path = "/v1/payment-links/{id}/cancel", tag = "Payment links", operation_id = "cancelPaymentLink",
    params(("id" = String, Path, description = "A payment link id, `plink_…`.")),
    security(("bearer" = ["links:write"])),
    responses(
        (status = 200, description = "The link, inactive.", body = PaymentLinkView),
        (status = 422, description = "Already inactive (`link_inactive`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn cancel_link(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    id: PathId<LinkId>,
) -> Result<Json<PaymentLinkView>, ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let id = id.get()?;
    let link = links::cancel(&state, who.tenant(), &id, state.clock.now(), Vec::new()).await?;
    Ok(Json(PaymentLinkView::of(
        link,
        &edge::requests::public_base(&state, &headers),
        false,
    )))
}

/// Delete a payment link that no payment used.
#[utoipa::path(
    delete, path = "/v1/payment-links/{id}", tag = "Payment links", operation_id = "deletePaymentLink",
    params(("id" = String, Path, description = "A payment link id, `plink_…`.")),
    security(("bearer" = ["links:write"])),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 422, description = "Payments used the link (`link_used`): cancel it instead.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn delete_link(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<LinkId>,
) -> Result<Json<Deleted>, ApiError> {
    let who = auth.require(Scope::LinksWrite)?;
    let id = id.get()?;
    let deleted = links::delete(&state, who.tenant(), &id).await?;
    Ok(Json(Deleted::of(deleted.into(), who.mode())))
}
