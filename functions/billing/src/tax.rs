//! `/v1/billing/settings/tax`: the tenant's tax settings (and our
//! `overpaymentHandling`), read and changed.

use axum::extract::State;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::tax::{self, TaxSettingsView, UpdateTaxSettings};

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(idempotent(
        state,
        routes!(get_tax_settings, update_tax_settings),
    ))
}

/// The tax settings (the defaults when never set: off, 1300, `VAT`).
#[utoipa::path(
    get, path = "/v1/billing/settings/tax", tag = "Billing", operation_id = "getBillingTaxSettings",
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The settings.", body = TaxSettingsView),
    ),
)]
async fn get_tax_settings(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Json<TaxSettingsView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let s = tax::get(&state, who.tenant()).await?;
    Ok(Json(TaxSettingsView::of(&s)))
}

/// Change the tax settings: only the keys sent change. Invoices issued
/// before keep the rate and number they were issued with.
#[utoipa::path(
    patch, path = "/v1/billing/settings/tax", tag = "Billing", operation_id = "updateBillingTaxSettings",
    request_body = UpdateTaxSettings,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The settings as changed.", body = TaxSettingsView),
    ),
)]
async fn update_tax_settings(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<JsonBody<UpdateTaxSettings>, ApiError>,
) -> Result<Json<TaxSettingsView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let s = tax::update(&state, who.tenant(), body).await?;
    Ok(Json(TaxSettingsView::of(&s)))
}
