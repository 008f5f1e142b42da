//! `/v1/billing/customers/{id}/credit`: add or deduct a customer's credit
//! (the SDK's `add_credit`), and read the ledger.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use serde::Serialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::credit::{self, AddCredit, CreditActor, CreditEntryView, MAX_LEDGER};
use shared::domain::billing::customers::{self, CustomerView, invalid};
use shared::ids::CustomerId;

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(idempotent(
        state,
        routes!(add_customer_credit, list_customer_credit),
    ))
}

/// Add credit to a customer's balance (a negative `amount` deducts it;
/// never below zero). Credit is applied to the customer's next invoices
/// before payment.
#[utoipa::path(
    post, path = "/v1/billing/customers/{id}/credit", tag = "Billing", operation_id = "addBillingCustomerCredit",
    params(("id" = String, Path, description = "A customer id, `cus_…`.")),
    request_body = AddCredit,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The customer with the new `creditBalance`.", body = CustomerView),
        (status = 400, description = "`amount` is 0, deducts more than the balance or overflows it (`validation_failed`, `param`: `amount`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn add_customer_credit(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CustomerId>,
    fence: Option<Extension<Fence>>,
    body: Result<JsonBody<AddCredit>, ApiError>,
) -> Result<Json<CustomerView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let actor = CreditActor::ApiKey {
        key_id: who.key.id.clone(),
    };
    let (c, _) = credit::add(&state, who.tenant(), &id, body, actor, fence).await?;
    Ok(Json(CustomerView::of(&c)))
}

/// A customer's credit ledger, newest first.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingCreditLedger)]
struct Ledger {
    customer_id: String,
    credit_balance: i64,
    data: Vec<CreditEntryView>,
}

/// A customer's credit balance and its newest ledger entries (ours: the
/// SDK has no call for it).
#[utoipa::path(
    get, path = "/v1/billing/customers/{id}/credit", tag = "Billing", operation_id = "listBillingCustomerCredit",
    params(
        ("id" = String, Path, description = "A customer id, `cus_…`."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Entries, newest first (default 50)."),
    ),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The balance and the ledger.", body = Ledger),
    ),
)]
async fn list_customer_credit(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<CustomerId>,
    query: QueryParams,
) -> Result<Json<Ledger>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let limit = match query.get("limit") {
        None => 50,
        Some(raw) => match raw.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_LEDGER).contains(&n) => n,
            _ => {
                return Err(invalid(
                    "limit",
                    format!("limit must be an integer from 1 to {MAX_LEDGER}, got {raw:?}"),
                )
                .into());
            }
        },
    };
    let c = customers::get(&state, who.tenant(), &id).await?;
    let entries = credit::ledger(&state, who.tenant(), &id, limit).await?;
    Ok(Json(Ledger {
        customer_id: c.id.to_string(),
        credit_balance: c.credit_balance,
        data: entries.iter().map(CreditEntryView::of).collect(),
    }))
}
