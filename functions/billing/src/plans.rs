//! `/v1/billing/plans`: create, list (`page`, `limit`, `active`),
//! retrieve, update.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::customers::{PageRequest, invalid};
use shared::domain::billing::plans::{self, CreatePlan, PlanView, UpdatePlan};
use shared::ids::PlanId;

use crate::customers::allowed;
use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_plan, list_plans)))
        .routes(idempotent(state, routes!(get_plan, update_plan)))
}

/// Create a plan.
#[utoipa::path(
    post, path = "/v1/billing/plans", tag = "Billing", operation_id = "createBillingPlan",
    request_body = CreatePlan,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The plan.", body = PlanView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = PlanView),
        (status = 403, description = "The key lacks `billing:write` (`missing_scope`) or the plan the billing API (`permission_denied`, `entitlement`: `billing.api`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_plan(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreatePlan>, ApiError>,
) -> Result<(StatusCode, Json<PlanView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let p = plans::create(&state, who.tenant(), body, fence).await?;
    Ok((StatusCode::CREATED, Json(PlanView::of(&p))))
}

/// List plans, newest first.
#[utoipa::path(
    get, path = "/v1/billing/plans", tag = "Billing", operation_id = "listBillingPlans",
    params(BillingPageParams, ("active" = Option<bool>, Query, description = "Only active (`true`) or inactive (`false`) plans.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of plans.", body = BillingPage<PlanView>),
    ),
)]
async fn list_plans(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<BillingPage<PlanView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let page = PageRequest::parse(query.get("page"), query.get("limit"))?;
    let active = match query.get("active") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(invalid(
                "active",
                format!("active must be true or false, got {other:?}"),
            )
            .into());
        }
    };
    let (found, total) = plans::list(&state, who.tenant(), page, active).await?;
    Ok(Json(BillingPage {
        data: found.iter().map(PlanView::of).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a plan.
#[utoipa::path(
    get, path = "/v1/billing/plans/{id}", tag = "Billing", operation_id = "getBillingPlan",
    params(("id" = String, Path, description = "A plan id, `bp_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The plan.", body = PlanView),
    ),
)]
async fn get_plan(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<PlanId>,
) -> Result<Json<PlanView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let p = plans::get(&state, who.tenant(), &id).await?;
    Ok(Json(PlanView::of(&p)))
}

/// Change a plan's name, description, state, provider and dunning; its
/// price and interval never change (a new price is a new plan).
#[utoipa::path(
    patch, path = "/v1/billing/plans/{id}", tag = "Billing", operation_id = "updateBillingPlan",
    params(("id" = String, Path, description = "A plan id, `bp_…`.")),
    request_body = UpdatePlan,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The plan as changed.", body = PlanView),
    ),
)]
async fn update_plan(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<PlanId>,
    body: Result<JsonBody<UpdatePlan>, ApiError>,
) -> Result<Json<PlanView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let p = plans::update(&state, who.tenant(), &id, body).await?;
    Ok(Json(PlanView::of(&p)))
}
