//! `/v1/billing/subscriptions/{id}/change-plan`, `preview-proration` and
//! `quantity`: plan changes and seats. The rules are in
//! `shared::domain::billing::changes`.

use axum::extract::State;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::HeaderMap;
use serde::Serialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::changes::{
    self, ChangeError, ChangePlan, Changed, ProrationPreview, UpdateQuantity,
};
use shared::domain::billing::invoice::view::InvoiceView;
use shared::domain::billing::lifecycle::SubscriptionView;
use shared::ids::SubscriptionId;
use shared::refusal::Refusal;

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(change_plan)))
        .routes(idempotent(state, routes!(preview_proration)))
        .routes(idempotent(state, routes!(update_quantity)))
}

fn refused(e: ChangeError) -> ApiError {
    Refusal::from(e).into()
}

const ID: &str = "A subscription id, `sub_…`.";

/// The proration a change billed.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingProration)]
struct ProrationAmounts {
    credit_amount: i64,
    debit_amount: i64,
    net_amount: i64,
    remaining_days: i64,
    total_days: i64,
}

/// A changed subscription: the subscription as its GET answers it, and
/// what the change billed.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingSubscriptionChanged)]
struct ChangedView {
    #[serde(flatten)]
    subscription: SubscriptionView,
    /// True when the change applied now (`create_prorations`, a quantity).
    proration_applied: bool,
    /// The amounts, when the change was prorated (null while trialing or
    /// scheduled).
    proration: Option<ProrationAmounts>,
    /// The proration invoice, open and due today, when the net is more
    /// than 0.
    proration_invoice: Option<InvoiceView>,
    /// Paisa of a net credit (a downgrade), kept as customer credit.
    credit_granted: i64,
}

fn view(changed: &Changed, base: &str) -> ChangedView {
    ChangedView {
        subscription: SubscriptionView::of(&changed.subscription),
        proration_applied: changed.applied,
        proration: changed.proration.map(|p| ProrationAmounts {
            credit_amount: p.credit,
            debit_amount: p.debit,
            net_amount: p.net(),
            remaining_days: p.remaining_days,
            total_days: p.total_days,
        }),
        proration_invoice: changed.invoice.as_ref().map(|i| InvoiceView::of(i, base)),
        credit_granted: changed.credit_granted,
    }
}

/// Change a subscription's plan: now with a proration invoice
/// (`create_prorations`), or from the next period (`none`, the default).
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/change-plan", tag = "Billing", operation_id = "changeBillingSubscriptionPlan",
    params(("id" = String, Path, description = ID)),
    request_body = ChangePlan,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription: on the new plan (`create_prorations`), or with its `pendingPlanChange` (`none`).", body = ChangedView),
        (status = 400, description = "The current plan, an inactive plan, another currency or interval (`validation_failed`, `param`: `newPlanId`), or `effectiveAt` out of range.", body = edge::openapi::ErrorEnvelope),
        (status = 404, description = "The subscription, or the new plan (`param`: `newPlanId`), is not the project's.", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "Its status takes no change: only active, trialing and past due subscriptions do (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn change_plan(
    State(state): State<AppState>,
    headers: HeaderMap,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<ChangePlan>, ApiError>,
) -> Result<Json<ChangedView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let changed = changes::change_plan(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    let base = edge::requests::public_base(&state, &headers);
    Ok(Json(view(&changed, &base)))
}

/// Preview what changing to `newPlanId` now would bill (no write).
#[utoipa::path(
    get, path = "/v1/billing/subscriptions/{id}/preview-proration", tag = "Billing", operation_id = "previewBillingSubscriptionProration",
    params(
        ("id" = String, Path, description = ID),
        ("newPlanId" = String, Query, description = "The plan to change to, `bp_…`."),
    ),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The credit, debit and net a `create_prorations` change would bill now.", body = ProrationPreview),
        (status = 400, description = "No `newPlanId`, or one the subscription cannot change to (`param`: `newPlanId`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "Its status takes no change (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn preview_proration(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    query: QueryParams,
) -> Result<Json<ProrationPreview>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let preview = changes::preview(&state, who.tenant(), &id, query.get("newPlanId"))
        .await
        .map_err(refused)?;
    Ok(Json(preview))
}

/// Change a per-unit subscription's quantity (seats) now, prorated as a
/// plan change.
#[utoipa::path(
    patch, path = "/v1/billing/subscriptions/{id}/quantity", tag = "Billing", operation_id = "updateBillingSubscriptionQuantity",
    params(("id" = String, Path, description = ID)),
    request_body = UpdateQuantity,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription with its quantity, and the proration (the same quantity again: unchanged, nothing billed).", body = ChangedView),
        (status = 400, description = "A quantity outside 1 to 10,000, or a plan that is not `per_unit` (`param`: `quantity`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "Its status takes no change (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn update_quantity(
    State(state): State<AppState>,
    headers: HeaderMap,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<UpdateQuantity>, ApiError>,
) -> Result<Json<ChangedView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let changed = changes::update_quantity(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    let base = edge::requests::public_base(&state, &headers);
    Ok(Json(view(&changed, &base)))
}
