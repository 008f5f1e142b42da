//! `/v1/billing/dunning`: policies (create, list, retrieve, update) and
//! an invoice's dunning (its state and attempts, stop, retry now).

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::customers::PageRequest;
use shared::domain::billing::dunning;
use shared::domain::billing::dunning_api::{
    self, CreatePolicy, InvoiceDunningView, PolicyView, UpdatePolicy,
};
use shared::domain::record::Window;
use shared::ids::{BillingInvoiceId, DunningPolicyId};

use crate::customers::allowed;
use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_policy, list_policies)))
        .routes(idempotent(state, routes!(get_policy, update_policy)))
        .routes(idempotent(state, routes!(get_invoice_dunning)))
        .routes(idempotent(state, routes!(stop_invoice_dunning)))
        .routes(idempotent(state, routes!(retry_invoice_dunning_now)))
}

/// Create a dunning policy.
#[utoipa::path(
    post, path = "/v1/billing/dunning/policies", tag = "Billing", operation_id = "createDunningPolicy",
    request_body = CreatePolicy,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The policy.", body = PolicyView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = PolicyView),
        (status = 403, description = "The key lacks `billing:write` (`missing_scope`) or the plan the billing API (`permission_denied`, `entitlement`: `billing.api`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_policy(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreatePolicy>, ApiError>,
) -> Result<(StatusCode, Json<PolicyView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let p = dunning_api::create(&state, who.tenant(), body, fence).await?;
    Ok((StatusCode::CREATED, Json(PolicyView::of(&p))))
}

/// List dunning policies, oldest first.
#[utoipa::path(
    get, path = "/v1/billing/dunning/policies", tag = "Billing", operation_id = "listDunningPolicies",
    params(BillingPageParams),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of policies.", body = BillingPage<PolicyView>),
    ),
)]
async fn list_policies(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<BillingPage<PolicyView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let page = PageRequest::parse(query.get("page"), query.get("limit"))?;
    let window = Window::at(page.offset(), page.limit);
    let (found, total) = dunning::list_policies(&state, who.tenant(), window).await?;
    Ok(Json(BillingPage {
        data: found.iter().map(PolicyView::of).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a dunning policy.
#[utoipa::path(
    get, path = "/v1/billing/dunning/policies/{id}", tag = "Billing", operation_id = "getDunningPolicy",
    params(("id" = String, Path, description = "A policy id, `dpol_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The policy.", body = PolicyView),
    ),
)]
async fn get_policy(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<DunningPolicyId>,
) -> Result<Json<PolicyView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let p = dunning::get_policy(&state, who.tenant(), &id).await?;
    Ok(Json(PolicyView::of(&p)))
}

/// Change a dunning policy: only the keys sent change. `isDefault: true`
/// makes it the project's one default; the default cannot be unset or
/// deactivated (`state_conflict`): make another policy the default.
#[utoipa::path(
    patch, path = "/v1/billing/dunning/policies/{id}", tag = "Billing", operation_id = "updateDunningPolicy",
    params(("id" = String, Path, description = "A policy id, `dpol_…`.")),
    request_body = UpdatePolicy,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The policy as changed.", body = PolicyView),
        (status = 409, description = "The default unset or deactivated, or an inactive policy made the default (`state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn update_policy(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<DunningPolicyId>,
    body: Result<JsonBody<UpdatePolicy>, ApiError>,
) -> Result<Json<PolicyView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let p = dunning_api::update(&state, who.tenant(), &id, body).await?;
    Ok(Json(PolicyView::of(&p)))
}

/// An invoice's dunning: its state and attempt history.
#[utoipa::path(
    get, path = "/v1/billing/dunning/invoices/{id}/dunning", tag = "Billing", operation_id = "getInvoiceDunning",
    params(("id" = String, Path, description = "A billing invoice id, `inv_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The invoice's dunning (`not_started` before it is overdue).", body = InvoiceDunningView),
    ),
)]
async fn get_invoice_dunning(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<BillingInvoiceId>,
) -> Result<Json<InvoiceDunningView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let view = dunning_api::invoice_dunning(&state, who.tenant(), &id).await?;
    Ok(Json(view))
}

/// Stop an invoice's dunning: no more reminders.
#[utoipa::path(
    post, path = "/v1/billing/dunning/invoices/{id}/dunning/stop", tag = "Billing", operation_id = "stopInvoiceDunning",
    params(("id" = String, Path, description = "A billing invoice id, `inv_…`.")),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The invoice's dunning, stopped.", body = InvoiceDunningView),
        (status = 409, description = "Dunning has not started, or is exhausted or resolved (`state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn stop_invoice_dunning(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<BillingInvoiceId>,
) -> Result<Json<InvoiceDunningView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    let view = dunning_api::stop(&state, who.tenant(), &id).await?;
    Ok(Json(view))
}

/// Make a dunning attempt now: a reminder with the invoice's pay link.
#[utoipa::path(
    post, path = "/v1/billing/dunning/invoices/{id}/dunning/retry-now", tag = "Billing", operation_id = "retryInvoiceDunningNow",
    params(("id" = String, Path, description = "A billing invoice id, `inv_…`.")),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The invoice's dunning with the attempt recorded.", body = InvoiceDunningView),
        (status = 409, description = "Dunning is not active, or the invoice is paid, void or uncollectible (`state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn retry_invoice_dunning_now(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<BillingInvoiceId>,
) -> Result<Json<InvoiceDunningView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    let view = shared::domain::notices::retry_now(&state, who.tenant(), &id).await?;
    Ok(Json(view))
}
