//! `/v1/billing/promotion-codes`: create, list (`page`, `limit`,
//! `couponId`, `active`), retrieve, `PATCH {active: false}` (deactivate),
//! and `validate` (reads only). The rules are in
//! `shared::domain::billing::coupons`.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::coupons::{
    self, CreatePromotionCode, PromotionCodeView, PromotionFilter, UpdatePromotionCode,
    ValidatePromotionCode, Validation,
};
use shared::domain::billing::customers::{PageRequest, invalid};
use shared::ids::{CouponId, PromotionCodeId};

use crate::coupons::{active_param, refused};
use crate::customers::allowed;
use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(
            state,
            routes!(create_promotion_code, list_promotion_codes),
        ))
        .routes(idempotent(
            state,
            routes!(get_promotion_code, update_promotion_code),
        ))
        .routes(idempotent(state, routes!(validate_promotion_code)))
}

const ID: &str = "A promotion code id, `promo_…`.";

/// Create a promotion code for a coupon.
#[utoipa::path(
    post, path = "/v1/billing/promotion-codes", tag = "Billing", operation_id = "createBillingPromotionCode",
    request_body = CreatePromotionCode,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The promotion code (its code upper-cased); `promotion_code.created` is sent.", body = PromotionCodeView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = PromotionCodeView),
        (status = 409, description = "A promotion code of the project and mode has this code (`promotion_code_taken`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_promotion_code(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    body: Result<JsonBody<CreatePromotionCode>, ApiError>,
) -> Result<(StatusCode, Json<PromotionCodeView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let p = coupons::create_promotion_code(&state, who.tenant(), body, fence)
        .await
        .map_err(refused)?;
    Ok((StatusCode::CREATED, Json(PromotionCodeView::of(&p))))
}

/// List promotion codes, newest first.
#[utoipa::path(
    get, path = "/v1/billing/promotion-codes", tag = "Billing", operation_id = "listBillingPromotionCodes",
    params(
        BillingPageParams,
        ("couponId" = Option<String>, Query, description = "Only this coupon's codes."),
        ("active" = Option<bool>, Query, description = "Only active (`true`) or deactivated (`false`) codes."),
    ),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of promotion codes.", body = BillingPage<PromotionCodeView>),
    ),
)]
async fn list_promotion_codes(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<BillingPage<PromotionCodeView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let page = PageRequest::parse(query.get("page"), query.get("limit"))?;
    let coupon_id = query
        .get("couponId")
        .map(|raw| {
            CouponId::parse(raw.trim())
                .ok_or_else(|| invalid("couponId", "couponId must be a coupon id, cpn_…"))
        })
        .transpose()?;
    let filter = PromotionFilter {
        coupon_id,
        active: active_param(query.get("active"))?,
    };
    let (found, total) = coupons::list_promotion_codes(&state, who.tenant(), page, &filter)
        .await
        .map_err(refused)?;
    Ok(Json(BillingPage {
        data: found.iter().map(PromotionCodeView::of).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a promotion code.
#[utoipa::path(
    get, path = "/v1/billing/promotion-codes/{id}", tag = "Billing", operation_id = "getBillingPromotionCode",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The promotion code.", body = PromotionCodeView),
    ),
)]
async fn get_promotion_code(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<PromotionCodeId>,
) -> Result<Json<PromotionCodeView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let p = coupons::get_promotion_code(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(PromotionCodeView::of(&p)))
}

/// Deactivate a promotion code (`{active: false}`; for good: existing
/// redemptions remain valid), or replace its `metadata`.
#[utoipa::path(
    patch, path = "/v1/billing/promotion-codes/{id}", tag = "Billing", operation_id = "updateBillingPromotionCode",
    params(("id" = String, Path, description = ID)),
    request_body = UpdatePromotionCode,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The promotion code as changed; the first deactivation sends `promotion_code.deactivated`.", body = PromotionCodeView),
    ),
)]
async fn update_promotion_code(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<PromotionCodeId>,
    body: Result<JsonBody<UpdatePromotionCode>, ApiError>,
) -> Result<Json<PromotionCodeView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let p = coupons::update_promotion_code(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    Ok(Json(PromotionCodeView::of(&p)))
}

/// Whether a code applies for this customer, plan and amount, and the
/// discount it would give. Reads only: redeems nothing.
#[utoipa::path(
    post, path = "/v1/billing/promotion-codes/validate", tag = "Billing", operation_id = "validateBillingPromotionCode",
    request_body = ValidatePromotionCode,
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "`{valid: true, coupon, promotion_code, discount_preview}` or `{valid: false, reason}`.", body = Validation),
    ),
)]
async fn validate_promotion_code(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<JsonBody<ValidatePromotionCode>, ApiError>,
) -> Result<Json<Validation>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let JsonBody(body) = body?;
    let v = coupons::validate(&state, who.tenant(), body)
        .await
        .map_err(refused)?;
    Ok(Json(v))
}
