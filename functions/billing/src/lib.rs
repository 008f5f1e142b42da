//! The billing function: all of `/v1/billing` (issue 39). Each resource
//! group is a module with its own route table; [`MODULES`] is the list
//! the function serves and documents (customers, plans, subscriptions,
//! invoices, dunning, test clocks, coupons, promotion codes, discounts). The rules are in
//! `shared::domain::billing`.

use axum::Router;
use edge::openapi::OpenApiRouter;
use edge::with_edge;
use serde::Serialize;
use shared::AppState;

mod changes;
mod coupons;
mod credit;
mod customers;
mod discounts;
mod dunning;
mod invoices;
mod items;
mod plans;
mod promotion_codes;
mod subscriptions;
mod tax;
mod test_clocks;
mod usage;

/// Every resource group's route table.
const MODULES: &[fn(&AppState) -> OpenApiRouter<AppState>] = &[
    customers::routes,
    plans::routes,
    subscriptions::routes,
    changes::routes,
    invoices::routes,
    dunning::routes,
    test_clocks::routes,
    coupons::routes,
    promotion_codes::routes,
    discounts::routes,
    tax::routes,
    credit::routes,
    usage::routes,
    items::routes,
];

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    MODULES
        .iter()
        .fold(OpenApiRouter::new(), |all, module| all.merge(module(state)))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// A page of a billing list, as the SDK reads it: `{data, total, page,
/// limit}` (unlike the payment API's offset lists).
#[derive(Serialize, utoipa::ToSchema)]
pub struct BillingPage<T> {
    pub data: Vec<T>,
    /// Records matching in all pages.
    pub total: u64,
    pub page: usize,
    pub limit: usize,
}

/// `page` (from 1) and `limit` (1 to 100, default 50), as the document
/// shows them. Customers, subscriptions and billing invoices reach any
/// page unfiltered (counted lists), subscriptions also by `status`,
/// `planId`, both, or `customerId` alone (narrowings); the other lists,
/// and those filtered or searched otherwise, read at most 10,000 records:
/// `page * limit` at most 10,000 (docs/billing.md, "List pages").
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct BillingPageParams {
    #[param(minimum = 1)]
    page: Option<u32>,
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
}
