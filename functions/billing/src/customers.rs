//! `/v1/billing/customers`: create, list (`page`, `limit`, `search`),
//! retrieve, update, delete.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::StatusCode;
use serde::Serialize;
use shared::AppState;
use shared::domain::account::{Principal, Scope};
use shared::domain::billing::customers::{
    self, CreateCustomer, CustomerView, PageRequest, UpdateCustomer,
};
use shared::domain::billing::test_clock;
use shared::ids::CustomerId;

use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_customer, list_customers)))
        .routes(idempotent(
            state,
            routes!(get_customer, update_customer, delete_customer),
        ))
}

/// The key's scope, then the merchant plan's entitlement.
pub(crate) fn allowed(auth: &Auth, scope: Scope) -> Result<&Principal, ApiError> {
    let who = auth.require(scope)?;
    customers::entitled(who)?;
    Ok(who)
}

/// Create a customer.
#[utoipa::path(
    post, path = "/v1/billing/customers", tag = "Billing", operation_id = "createBillingCustomer",
    request_body = CreateCustomer,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The customer.", body = CustomerView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = CustomerView),
        (status = 403, description = "The key lacks `billing:write` (`missing_scope`) or the plan the billing API (`permission_denied`, `entitlement`: `billing.api`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_customer(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateCustomer>, ApiError>,
) -> Result<(StatusCode, Json<CustomerView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let c = test_clock::create_customer(&state, who.tenant(), body, fence).await?;
    Ok((StatusCode::CREATED, Json(CustomerView::of(&c))))
}

/// List customers, newest first.
#[utoipa::path(
    get, path = "/v1/billing/customers", tag = "Billing", operation_id = "listBillingCustomers",
    params(BillingPageParams, ("search" = Option<String>, Query, description = "Only customers whose name, email, phone or externalCustomerId holds this text (any case); among the newest 5,000.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of customers.", body = BillingPage<CustomerView>),
    ),
)]
async fn list_customers(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<BillingPage<CustomerView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    // Any page of the counted list; a search's within its window.
    let page = PageRequest::parse_deep(query.get("page"), query.get("limit"))?;
    let search = query.get("search").filter(|s| !s.trim().is_empty());
    let (found, total) = customers::list(&state, who.tenant(), page, search).await?;
    Ok(Json(BillingPage {
        data: found.iter().map(CustomerView::of).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a customer.
#[utoipa::path(
    get, path = "/v1/billing/customers/{id}", tag = "Billing", operation_id = "getBillingCustomer",
    params(("id" = String, Path, description = "A customer id, `cus_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The customer.", body = CustomerView),
    ),
)]
async fn get_customer(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CustomerId>,
) -> Result<Json<CustomerView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let c = customers::get(&state, who.tenant(), &id).await?;
    Ok(Json(CustomerView::of(&c)))
}

/// Change a customer: only the keys sent change; `null` clears.
#[utoipa::path(
    patch, path = "/v1/billing/customers/{id}", tag = "Billing", operation_id = "updateBillingCustomer",
    params(("id" = String, Path, description = "A customer id, `cus_…`.")),
    request_body = UpdateCustomer,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The customer as changed.", body = CustomerView),
    ),
)]
async fn update_customer(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CustomerId>,
    body: Result<JsonBody<UpdateCustomer>, ApiError>,
) -> Result<Json<CustomerView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let c = customers::update(&state, who.tenant(), &id, body).await?;
    Ok(Json(CustomerView::of(&c)))
}

/// The answer of a customer's delete.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = BillingCustomerDeleted)]
struct Deleted {
    id: String,
    /// Always `true`.
    deleted: bool,
}

/// Delete a customer (not while a subscription of theirs has not ended).
#[utoipa::path(
    delete, path = "/v1/billing/customers/{id}", tag = "Billing", operation_id = "deleteBillingCustomer",
    params(("id" = String, Path, description = "A customer id, `cus_…`.")),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 409, description = "A subscription of the customer has not ended (`customer_has_subscriptions`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn delete_customer(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CustomerId>,
) -> Result<Json<Deleted>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    customers::delete(&state, who.tenant(), &id).await?;
    Ok(Json(Deleted {
        id: id.to_string(),
        deleted: true,
    }))
}
