//! `/v1/billing/subscriptions`: create, list (`page`, `limit`, `status`,
//! `customerId`, `planId`), retrieve, pause, resume, cancel, end-trial,
//! extend-trial; and `/v1/billing/dunning/subscriptions/{id}/policy`.
//! The rules are in `shared::domain::billing::lifecycle`.

use axum::extract::{Extension, State};
use edge::idempotency::Fence;
use edge::input::OptionalJsonBody;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::customers::PageRequest;
use shared::domain::billing::invoice::view::InvoiceView;
use shared::domain::billing::lifecycle::{
    self, CancelSubscription, CreateSubscription, ExtendTrial, LifecycleError, ListFilter,
    PauseSubscription, SetDunningPolicy, SubscriptionView,
};
use shared::ids::SubscriptionId;
use shared::refusal::Refusal;

use crate::customers::allowed;
use crate::{BillingPage, BillingPageParams};

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(
            state,
            routes!(create_subscription, list_subscriptions),
        ))
        .routes(idempotent(state, routes!(get_subscription)))
        .routes(idempotent(state, routes!(pause_subscription)))
        .routes(idempotent(state, routes!(resume_subscription)))
        .routes(idempotent(state, routes!(cancel_subscription)))
        .routes(idempotent(state, routes!(end_trial)))
        .routes(idempotent(state, routes!(extend_trial)))
        .routes(idempotent(state, routes!(set_dunning_policy)))
}

/// The domain's refusal, in the envelope.
fn refused(e: LifecycleError) -> ApiError {
    Refusal::from(e).into()
}

const ID: &str = "A subscription id, `sub_…`.";

/// Create a subscription.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions", tag = "Billing", operation_id = "createBillingSubscription",
    request_body = CreateSubscription,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The subscription: `trialing` with a trial, `incomplete` with its first invoice issued without one, `draft` when it starts on a later day.", body = SubscriptionView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = SubscriptionView),
        (status = 403, description = "The key lacks `billing:write` (`missing_scope`) or the plan the billing API (`permission_denied`, `entitlement`: `billing.api`).", body = edge::openapi::ErrorEnvelope),
        (status = 404, description = "The customer or plan is not the project's (`not_found`, `param` names it).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_subscription(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateSubscription>, ApiError>,
) -> Result<(StatusCode, Json<SubscriptionView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let made = lifecycle::create_subscription(&state, who.tenant(), body, fence)
        .await
        .map_err(refused)?;
    Ok((
        StatusCode::CREATED,
        Json(SubscriptionView::of(&made.subscription)),
    ))
}

/// List subscriptions, newest first.
#[utoipa::path(
    get, path = "/v1/billing/subscriptions", tag = "Billing", operation_id = "listBillingSubscriptions",
    params(
        BillingPageParams,
        ("status" = Option<String>, Query, description = "Only subscriptions in this status."),
        ("customerId" = Option<String>, Query, description = "Only this customer's."),
        ("planId" = Option<String>, Query, description = "Only this plan's."),
    ),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "A page of subscriptions.", body = BillingPage<SubscriptionView>),
    ),
)]
async fn list_subscriptions(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<BillingPage<SubscriptionView>>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    // Any page of the counted list; a filter's within its window.
    let page = PageRequest::parse_deep(query.get("page"), query.get("limit"))?;
    let filter = ListFilter::parse(
        query.get("status"),
        query.get("customerId"),
        query.get("planId"),
    )?;
    let (found, total) = lifecycle::list(&state, who.tenant(), page, &filter)
        .await
        .map_err(refused)?;
    Ok(Json(BillingPage {
        data: found.iter().map(SubscriptionView::of).collect(),
        total,
        page: page.page,
        limit: page.limit,
    }))
}

/// Retrieve a subscription.
#[utoipa::path(
    get, path = "/v1/billing/subscriptions/{id}", tag = "Billing", operation_id = "getBillingSubscription",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The subscription.", body = SubscriptionView),
    ),
)]
async fn get_subscription(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let s = lifecycle::get(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(SubscriptionView::of(&s)))
}

/// Pause an active or past-due subscription.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/pause", tag = "Billing", operation_id = "pauseBillingSubscription",
    params(("id" = String, Path, description = ID)),
    request_body = PauseSubscription,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription, paused.", body = SubscriptionView),
        (status = 409, description = "Its status cannot be paused (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn pause_subscription(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<OptionalJsonBody<PauseSubscription>, ApiError>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let OptionalJsonBody(body) = body?;
    let id = id.get()?;
    let s = lifecycle::pause(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    Ok(Json(SubscriptionView::of(&s)))
}

/// Resume a paused subscription.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/resume", tag = "Billing", operation_id = "resumeBillingSubscription",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription, active.", body = SubscriptionView),
        (status = 409, description = "It is not paused (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn resume_subscription(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    let s = lifecycle::resume(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(SubscriptionView::of(&s)))
}

/// Cancel a subscription now, or at the end of its period (`atPeriodEnd`).
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/cancel", tag = "Billing", operation_id = "cancelBillingSubscription",
    params(("id" = String, Path, description = ID)),
    request_body = CancelSubscription,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription, cancelled (or flagged to cancel at period end).", body = SubscriptionView),
        (status = 409, description = "It has ended, or cannot be cancelled that way (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn cancel_subscription(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<OptionalJsonBody<CancelSubscription>, ApiError>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let OptionalJsonBody(body) = body?;
    let id = id.get()?;
    let s = lifecycle::cancel(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    Ok(Json(SubscriptionView::of(&s)))
}

/// The answer of an ended trial.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = BillingSubscriptionTrialEnded)]
struct TrialEnded {
    subscription: SubscriptionView,
    /// The first paid invoice, issued now, as its GET answers it.
    invoice: InvoiceView,
}

/// End a subscription's trial now: it becomes active and its first
/// invoice is issued.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/end-trial", tag = "Billing", operation_id = "endBillingSubscriptionTrial",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription and its first invoice.", body = TrialEnded),
        (status = 409, description = "It is not trialing (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn end_trial(
    State(state): State<AppState>,
    headers: HeaderMap,
    auth: Auth,
    id: PathId<SubscriptionId>,
) -> Result<Json<TrialEnded>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    let now = state.clock.now();
    let ended = lifecycle::end_trial(&state, who.tenant(), &id, now)
        .await
        .map_err(refused)?;
    Ok(Json(TrialEnded {
        subscription: SubscriptionView::of(&ended.subscription),
        invoice: InvoiceView::of(
            &ended.invoice.invoice,
            &edge::requests::public_base(&state, &headers),
        ),
    }))
}

/// Move a trialing subscription's trial end later.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/extend-trial", tag = "Billing", operation_id = "extendBillingSubscriptionTrial",
    params(("id" = String, Path, description = ID)),
    request_body = ExtendTrial,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription with its new trial end.", body = SubscriptionView),
        (status = 409, description = "It is not trialing (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn extend_trial(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<ExtendTrial>, ApiError>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let s = lifecycle::extend_trial(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    Ok(Json(SubscriptionView::of(&s)))
}

/// Set a subscription's dunning policy (`null`: the project's default).
#[utoipa::path(
    post, path = "/v1/billing/dunning/subscriptions/{id}/policy", tag = "Billing", operation_id = "setBillingSubscriptionDunningPolicy",
    params(("id" = String, Path, description = ID)),
    request_body = SetDunningPolicy,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The subscription with its policy.", body = SubscriptionView),
        (status = 404, description = "The subscription, or the policy (`param`: `policyId`), is not the project's.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn set_dunning_policy(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<SetDunningPolicy>, ApiError>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let s = lifecycle::set_dunning_policy(&state, who.tenant(), &id, body)
        .await
        .map_err(refused)?;
    Ok(Json(SubscriptionView::of(&s)))
}
