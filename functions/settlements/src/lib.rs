//! The settlements function (issue 41, part 5): per provider and Nepal
//! day, what the provider should pay into the merchant's bank beside the
//! bank credits the merchant records.
//!
//! - `GET /v1/reconciliation/settlements?provider&from&to`: the days;
//! - `POST /v1/reconciliation/settlements/credits`: record a bank credit
//!   (a bank reference once per provider: 409 `duplicate_reference`);
//! - `DELETE /v1/reconciliation/settlements/credits/{id}`: remove one
//!   recorded by mistake.
//!
//! The rules are `shared::domain::reconciliation::settlements`. Scopes:
//! `payments:read` to read (a settlement is a read of payments and
//! refunds), `payments:write` to record or delete a credit.

use axum::Router;
use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams, with_edge};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::reconciliation::settlements::{
    self, CreditRequest, CreditView, SettlementQuery, Settlements,
};
use shared::ids::BankCreditId;
use shared::refusal::Refusal;

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_settlements))
        .routes(idempotent(state, routes!(create_credit)))
        .routes(idempotent(state, routes!(delete_credit)))
}

/// The function's routes, behind the idempotency layer, in the shared
/// edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

#[utoipa::path(
    get, path = "/v1/reconciliation/settlements", tag = "Reconciliation", operation_id = "listSettlements",
    params(
        ("provider" = Option<String>, Query, description = "`esewa`, `khalti` or `fonepay`; every provider when absent."),
        ("from" = Option<String>, Query, description = "The first Nepal day, `YYYY-MM-DD` (default: six days before `to`)."),
        ("to" = Option<String>, Query, description = "The last Nepal day, included, `YYYY-MM-DD` (default: today in Nepal); at most 92 days from `from`."),
    ),
    security(("bearer" = ["payments:read"])),
    responses(
        (status = 200, description = "Each day of the range with a payment, a refund or a bank credit, per provider: `expected` (net of the day's successful payments less its refunds), what was `credited`, and `variance = credited - expected`.", body = Settlements),
        (status = 400, description = "An unknown `provider`, a `from` or `to` that is not `YYYY-MM-DD`, `from` after `to`, a range over 92 days.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn list_settlements(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Settlements>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let q = SettlementQuery {
        provider: query.get("provider"),
        from: query.get("from"),
        to: query.get("to"),
    };
    let days = settlements::settlements(&state, who.tenant(), q)
        .await
        .map_err(Refusal::from)?;
    Ok(Json(days))
}

/// `POST /v1/reconciliation/settlements/credits`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBankCredit)]
pub struct CreateCredit {
    /// `esewa`, `khalti` or `fonepay`: whose settlement the bank credited.
    pub provider: String,
    /// The Nepal day of the settlement it pays, `YYYY-MM-DD`, not after
    /// today.
    pub date: String,
    /// Paisa credited, at least 1.
    pub amount: i64,
    /// The bank's reference for the credit (1 to 100 characters); once per
    /// provider, compared without case or surrounding spaces.
    pub reference: String,
}

#[utoipa::path(
    post, path = "/v1/reconciliation/settlements/credits", tag = "Reconciliation", operation_id = "createBankCredit",
    request_body = CreateCredit,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 201, description = "The credit.", body = CreditView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = CreditView),
        (status = 400, description = "A field breaks its rule; `param` names it.", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "A credit with this `reference` is recorded for the provider (`duplicate_reference`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_credit(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateCredit>, ApiError>,
) -> Result<(StatusCode, Json<CreditView>), ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let req = CreditRequest {
        provider: &body.provider,
        date: &body.date,
        amount: body.amount,
        reference: &body.reference,
    };
    let credit = settlements::record_credit(&state, who.tenant(), req, fence, Vec::new())
        .await
        .map_err(Refusal::from)?;
    Ok((StatusCode::CREATED, Json(CreditView::of(&credit))))
}

/// The answer of a credit's delete.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = BankCreditDeleted)]
struct Deleted {
    id: String,
    /// Always `true`.
    deleted: bool,
}

#[utoipa::path(
    delete, path = "/v1/reconciliation/settlements/credits/{id}", tag = "Reconciliation", operation_id = "deleteBankCredit",
    params(("id" = String, Path, description = "A bank credit id, `bcr_…`.")),
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 200, description = "Deleted: its reference may be recorded again.", body = Deleted),
    ),
)]
async fn delete_credit(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<BankCreditId>,
) -> Result<Json<Deleted>, ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let id = id.get()?;
    settlements::delete_credit(&state, who.tenant(), &id, Vec::new())
        .await
        .map_err(Refusal::from)?;
    Ok(Json(Deleted {
        id: id.to_string(),
        deleted: true,
    }))
}
