//! `/v1/billing/test-clocks`: create, retrieve, advance (forward only),
//! delete. Sandbox only: a live key is refused (`test_clock_live_mode`).
//! The rules are `shared::domain::billing::test_clock`; advancing is
//! `shared::domain::clocks`: the advance answers `advancing` at once, a GET
//! of an advancing clock runs a bounded chunk of its work, and on the
//! local gateway a background task finishes it.

use axum::extract::State;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId};
use http::StatusCode;
use serde::Serialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::test_clock::{
    self, AdvanceTestClock, ClockStatus, CreateTestClock, TestClockView,
};
use shared::domain::clocks;
use shared::ids::TestClockId;

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_test_clock)))
        .routes(idempotent(
            state,
            routes!(get_test_clock, delete_test_clock),
        ))
        .routes(idempotent(state, routes!(advance_test_clock)))
}

/// Create a sandbox test clock at `frozenTime`.
#[utoipa::path(
    post, path = "/v1/billing/test-clocks", tag = "Billing", operation_id = "createBillingTestClock",
    request_body = CreateTestClock,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "The clock.", body = TestClockView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = TestClockView),
        (status = 403, description = "A live key (`test_clock_live_mode`): clocks exist in sandbox only.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_test_clock(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<JsonBody<CreateTestClock>, ApiError>,
) -> Result<(StatusCode, Json<TestClockView>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let now = state.clock.now();
    let c = test_clock::create(&state, who.tenant(), &body.name, body.frozen_time, now).await?;
    Ok((StatusCode::CREATED, Json(TestClockView::of(&c))))
}

/// Retrieve a test clock. An `advancing` clock first runs part of what
/// is due (at most a few seconds): poll this until it is `ready`.
#[utoipa::path(
    get, path = "/v1/billing/test-clocks/{id}", tag = "Billing", operation_id = "getBillingTestClock",
    params(("id" = String, Path, description = "A test clock id, `clock_…`.")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The clock: `advancing` while work is left, else `ready`.", body = TestClockView),
        (status = 403, description = "A live key (`test_clock_live_mode`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn get_test_clock(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<TestClockId>,
) -> Result<Json<TestClockView>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let c = clocks::get(&state, who.tenant(), &id, clocks::CHUNK).await?;
    Ok(Json(TestClockView::of(&c)))
}

/// Move a test clock forward to `frozenTime`. Answers at once with the
/// clock `advancing`; everything due for its subscriptions up to then
/// (invoices, trial ends, grace, reminders, dunning) then runs as the
/// scheduler runs it: poll `GET /v1/billing/test-clocks/{id}` (each GET
/// runs part of the work) until it is `ready`. Never backwards: a time
/// not after the clock's is a 400 naming `frozenTime`; the same time again
/// while advancing answers the clock as it is; another time while
/// advancing is a 409 `state_conflict`.
#[utoipa::path(
    post, path = "/v1/billing/test-clocks/{id}/advance", tag = "Billing", operation_id = "advanceBillingTestClock",
    params(("id" = String, Path, description = "A test clock id, `clock_…`.")),
    request_body = AdvanceTestClock,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "The clock, `advancing` to its new time.", body = TestClockView),
        (status = 403, description = "A live key (`test_clock_live_mode`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "It is advancing to another time (`state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn advance_test_clock(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<TestClockId>,
    body: Result<JsonBody<AdvanceTestClock>, ApiError>,
) -> Result<Json<TestClockView>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let now = state.clock.now();
    let c = clocks::advance(&state, who.tenant(), &id, body.frozen_time, now).await?;
    if c.status == ClockStatus::Advancing && state.runs_background_work() {
        // A long-lived process: finish it now rather than on the next GET.
        clocks::spawn_finish((*state).clone(), c.clone());
    }
    Ok(Json(TestClockView::of(&c)))
}

/// The answer of a clock's delete.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = BillingTestClockDeleted)]
struct Deleted {
    id: String,
    /// Always `true`.
    deleted: bool,
}

/// Delete a test clock (its subscriptions stay, never advanced again).
#[utoipa::path(
    delete, path = "/v1/billing/test-clocks/{id}", tag = "Billing", operation_id = "deleteBillingTestClock",
    params(("id" = String, Path, description = "A test clock id, `clock_…`.")),
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 403, description = "A live key (`test_clock_live_mode`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn delete_test_clock(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<TestClockId>,
) -> Result<Json<Deleted>, ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let id = id.get()?;
    test_clock::delete(&state, who.tenant(), &id).await?;
    Ok(Json(Deleted {
        id: id.to_string(),
        deleted: true,
    }))
}
