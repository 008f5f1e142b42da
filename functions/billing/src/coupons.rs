//! `/v1/billing/coupons`: create, list (`page`, `limit`, `active`),
//! retrieve, deactivate (`DELETE`: soft, answers the coupon). The rules
//! are in `shared::domain::billing::coupons`.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::coupons::{self, CouponError, CouponView, CreateCoupon};
use shared::domain::billing::customers::{PageRequest, invalid};
use shared::ids::CouponId;
use shared::refusal::Refusal;

use crate::customers::allowed;
use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_coupon, list_coupons)))
        .routes(idempotent(state, routes!(get_coupon, deactivate_coupon)))
}

/// The domain's refusal, in the envelope.
pub(crate) fn refused(e: CouponError) -> ApiError {
    Refusal::from(e).into()
}

/// `active=true|false`, else a 400 naming it.
pub(crate) fn active_param(raw: Option<&str>) -> Result<Option<bool>, ApiError> {
    match raw {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => Err(invalid(
            "active",
            format!("active must be true or false, got {other:?}"),
        )
        .into()),
    }
}

const ID: &str = "A coupon id, `cpn_…`.";

/// Create a coupon.
#[utoipa::path(
    post, path = "/v1/billing/coupons", tag = "Billing", operation_id = "createBillingCoupon",
    request_body = CreateCoupon,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The coupon; `coupon.created` is sent.", body = CouponView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = CouponView),
        (status = 403, description = "The key lacks `billing:write` (`missing_scope`) or the plan the billing API (`permission_denied`, `entitlement`: `billing.api`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "A coupon of the project and mode has this code, in any case (`coupon_code_taken`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_coupon(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateCoupon>, ApiError>,
) -> Result<(StatusCode, Json<CouponView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let c = coupons::create_coupon(&state, who.tenant(), body, fence)
        .await
        .map_err(refused)?;
    Ok((StatusCode::CREATED, Json(CouponView::of(&c))))
}

/// List coupons, newest first.
#[utoipa::path(
    get, path = "/v1/billing/coupons", tag = "Billing", operation_id = "listBillingCoupons",
    params(BillingPageParams, ("active" = Option<bool>, Query, description = "Only active (`true`) or deactivated (`false`) coupons.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of coupons.", body = BillingPage<CouponView>),
    ),
)]
async fn list_coupons(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<BillingPage<CouponView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let page = PageRequest::parse(query.get("page"), query.get("limit"))?;
    let active = active_param(query.get("active"))?;
    let (found, total) = coupons::list_coupons(&state, who.tenant(), page, active)
        .await
        .map_err(refused)?;
    Ok(Json(BillingPage {
        data: found.iter().map(CouponView::of).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a coupon.
#[utoipa::path(
    get, path = "/v1/billing/coupons/{id}", tag = "Billing", operation_id = "getBillingCoupon",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The coupon.", body = CouponView),
    ),
)]
async fn get_coupon(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CouponId>,
) -> Result<Json<CouponView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let c = coupons::get_coupon(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(CouponView::of(&c)))
}

/// Deactivate a coupon (soft: it stays, inactive). It redeems no more;
/// the discounts it gave stay (a `forever` one ends with it).
#[utoipa::path(
    delete, path = "/v1/billing/coupons/{id}", tag = "Billing", operation_id = "deactivateBillingCoupon",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The coupon, inactive; the first deactivation sends `coupon.deactivated`.", body = CouponView),
    ),
)]
async fn deactivate_coupon(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CouponId>,
) -> Result<Json<CouponView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    let c = coupons::deactivate_coupon(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(CouponView::of(&c)))
}
