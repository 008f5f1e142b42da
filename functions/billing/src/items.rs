//! `/v1/billing/subscriptions/{id}/invoice-items`: list the pending
//! one-off charges (a bare array, as the SDK reads it), add one, delete a
//! pending one. The rules are in `shared::domain::billing::items`.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId};
use http::StatusCode;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::items::{self, CreateItem, DeletedItem, ItemError, ItemView};
use shared::ids::{InvoiceItemId, SubscriptionId};
use shared::refusal::Refusal;

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(
            state,
            routes!(list_invoice_items, create_invoice_item),
        ))
        .routes(idempotent(state, routes!(delete_invoice_item)))
}

const ID: &str = "A subscription id, `sub_…`.";

fn refused(e: ItemError) -> ApiError {
    Refusal::from(e).into()
}

/// List a subscription's pending invoice items, oldest first: what its
/// next invoice will bill (a bare array).
#[utoipa::path(
    get, path = "/v1/billing/subscriptions/{id}/invoice-items", tag = "Billing", operation_id = "listBillingInvoiceItems",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The pending items (at most 40).", body = Vec<ItemView>),
    ),
)]
async fn list_invoice_items(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
) -> Result<Json<Vec<ItemView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let found = items::list_pending(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(found.iter().map(ItemView::of).collect()))
}

/// Add a one-off charge to a subscription's next invoice.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/invoice-items", tag = "Billing", operation_id = "createBillingInvoiceItem",
    params(("id" = String, Path, description = ID)),
    request_body = CreateItem,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The pending item.", body = ItemView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = ItemView),
        (status = 409, description = "The subscription has ended (`subscription_state_conflict`), or holds 40 pending items (`invoice_item_limit`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_invoice_item(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<CreateItem>, ApiError>,
) -> Result<(StatusCode, Json<ItemView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let item = items::create(&state, who.tenant(), &id, body, fence)
        .await
        .map_err(refused)?;
    Ok((StatusCode::CREATED, Json(ItemView::of(&item))))
}

/// Delete a pending invoice item; an invoiced one is refused.
#[utoipa::path(
    delete, path = "/v1/billing/subscriptions/{id}/invoice-items/{itemId}", tag = "Billing", operation_id = "deleteBillingInvoiceItem",
    params(("id" = String, Path, description = ID), ("itemId" = String, Path, description = "An invoice item id, `ii_…`.")),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "Deleted.", body = DeletedItem),
        (status = 409, description = "An invoice has taken it (`invoice_item_invoiced`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn delete_invoice_item(
    State(state): State<AppState>,
    auth: Auth,
    path: PathId<(SubscriptionId, InvoiceItemId)>,
) -> Result<Json<DeletedItem>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let (id, item) = path.get()?;
    items::delete(&state, who.tenant(), &id, &item)
        .await
        .map_err(refused)?;
    Ok(Json(DeletedItem {
        id: item.to_string(),
        object: "invoice_item",
        deleted: true,
    }))
}
