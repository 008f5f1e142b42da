//! `POST /v1/billing/subscriptions/{id}/apply-coupon` and `DELETE
//! /v1/billing/subscriptions/{id}/discount`. The rules are in
//! `shared::domain::billing::discounts`.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::discounts::{self, ApplyCoupon, DiscountError, Discounted};
use shared::ids::SubscriptionId;
use shared::refusal::Refusal;

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(apply_coupon)))
        .routes(idempotent(state, routes!(remove_discount)))
}

fn refused(e: DiscountError) -> ApiError {
    Refusal::from(e).into()
}

const ID: &str = "A subscription id, `sub_…`.";

/// Apply a coupon (`couponId`) or a promotion code (`promotionCode`) to a
/// subscription: it replaces the active discount from the next invoice.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/apply-coupon", tag = "Billing", operation_id = "applyBillingSubscriptionCoupon",
    params(("id" = String, Path, description = ID)),
    request_body = ApplyCoupon,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription with its `discount`; `subscription.updated` is sent.", body = Discounted),
        (status = 400, description = "Bad input, or the coupon or code does not apply: expired, inactive, its redemption limit reached, another plan's, another customer's, below its minimum (`validation_failed`, `param` names the field, `reason` says why).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "The subscription has ended (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn apply_coupon(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<ApplyCoupon>, ApiError>,
) -> Result<Json<Discounted>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let d = discounts::apply(&state, who.tenant(), &id, body, fence)
        .await
        .map_err(refused)?;
    Ok(Json(d))
}

/// Remove a subscription's active discount: later invoices are not
/// discounted.
#[utoipa::path(
    delete, path = "/v1/billing/subscriptions/{id}/discount", tag = "Billing", operation_id = "removeBillingSubscriptionDiscount",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription, `discount` null; `subscription.updated` is sent.", body = Discounted),
        (status = 404, description = "No such subscription, or it has no active discount (`not_found`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn remove_discount(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
) -> Result<Json<Discounted>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    let d = discounts::remove(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(d))
}
