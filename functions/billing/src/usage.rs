//! `/v1/billing/subscriptions/{id}/usage`: report usage (one event, or our
//! batch of up to 1,000), the current period's summary, and the raw
//! records. The rules are in `shared::domain::billing::usage`.

use axum::extract::State;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, Json, JsonBody, PathId, QueryParams};
use http::StatusCode;
use serde::Serialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::billing::usage::{
    self, Outcome, ReportUsage, UsageError, UsageRecordView, UsageSummary,
};
use shared::ids::SubscriptionId;
use shared::refusal::Refusal;

use crate::customers::allowed;

pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(report_usage, usage_summary)))
        .routes(idempotent(state, routes!(list_usage_records)))
}

const ID: &str = "A subscription id, `sub_…`.";

/// What a batch's event became.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct EventResult {
    /// The event's place in `events`, from 0.
    index: usize,
    /// `created`, `duplicate` (its `idempotency_key` was seen: the first
    /// record) or `refused` (`error` says why).
    status: &'static str,
    record: Option<UsageRecordView>,
    /// The refusal as a single event's would be (`usage_period_closed`).
    #[schema(value_type = Option<Object>)]
    error: Option<serde_json::Value>,
}

/// The answer to a batch.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct BatchResult {
    object: &'static str,
    data: Vec<EventResult>,
    created: usize,
    duplicates: usize,
    refused: usize,
}

/// Either answer of the usage report.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Reported {
    One(UsageRecordView),
    Batch(BatchResult),
}

fn refused(e: UsageError) -> ApiError {
    Refusal::from(e).into()
}

fn result_of(index: usize, o: Outcome) -> EventResult {
    match o {
        Outcome::Created(r) => EventResult {
            index,
            status: "created",
            record: Some(UsageRecordView::of(&r)),
            error: None,
        },
        Outcome::Duplicate(r) => EventResult {
            index,
            status: "duplicate",
            record: Some(UsageRecordView::of(&r)),
            error: None,
        },
        Outcome::Closed { start, end } => {
            let r = Refusal::from(UsageError::PeriodClosed { start, end });
            EventResult {
                index,
                status: "refused",
                record: None,
                error: Some(serde_json::json!({
                    "code": r.code,
                    "message": r.message,
                    "period": {"start": start.to_string(), "end": end.to_string()},
                })),
            }
        }
    }
}

/// Report usage of a metered subscription: one event (`{quantity,
/// action, timestamp, idempotency_key}`), or ours, `{events: [...]}`, up
/// to 1,000 at once.
#[utoipa::path(
    post, path = "/v1/billing/subscriptions/{id}/usage", tag = "Billing", operation_id = "reportBillingSubscriptionUsage",
    params(("id" = String, Path, description = ID)),
    request_body = ReportUsage,
    security(("bearer" = ["billing:write"])),
    responses(
        (status = 201, description = "One event: its record (`usage_record`). A batch: one result per event, in order.", body = Reported),
        (status = 200, description = "One event whose `idempotency_key` was seen: the first record; or a replay of this `Idempotency-Key`.", body = Reported),
        (status = 409, description = "The event's period was invoiced (`usage_period_closed`, `period` names it), the plan is not metered (`subscription_not_metered`), or the subscription takes no usage now (`subscription_state_conflict`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn report_usage(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    body: Result<JsonBody<ReportUsage>, ApiError>,
) -> Result<(StatusCode, Json<Reported>), ApiError> {
    let who = allowed(&auth, Scope::BillingWrite)?;
    let JsonBody(body) = body?;
    let id = id.get()?;
    let (events, batch) = usage::events_of(body).map_err(Refusal::from)?;
    let outcomes = usage::report_as(&state, who.tenant(), &id, events, batch)
        .await
        .map_err(refused)?;
    if !batch {
        return match outcomes.into_iter().next() {
            Some(Outcome::Created(r)) => Ok((
                StatusCode::CREATED,
                Json(Reported::One(UsageRecordView::of(&r))),
            )),
            Some(Outcome::Duplicate(r)) => {
                Ok((StatusCode::OK, Json(Reported::One(UsageRecordView::of(&r)))))
            }
            Some(Outcome::Closed { start, end }) => {
                Err(refused(UsageError::PeriodClosed { start, end }))
            }
            None => Err(refused(UsageError::Busy)),
        };
    }
    let data: Vec<EventResult> = outcomes
        .into_iter()
        .enumerate()
        .map(|(i, o)| result_of(i, o))
        .collect();
    let count = |s: &str| data.iter().filter(|r| r.status == s).count();
    let result = BatchResult {
        object: "usage_batch",
        created: count("created"),
        duplicates: count("duplicate"),
        refused: count("refused"),
        data,
    };
    Ok((StatusCode::CREATED, Json(Reported::Batch(result))))
}

/// The current period's usage of a subscription.
#[utoipa::path(
    get, path = "/v1/billing/subscriptions/{id}/usage", tag = "Billing", operation_id = "getBillingSubscriptionUsage",
    params(("id" = String, Path, description = ID)),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The current period's total (`quantity`), its record count and what it will bill.", body = UsageSummary),
    ),
)]
async fn usage_summary(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
) -> Result<Json<UsageSummary>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let id = id.get()?;
    let s = usage::summary(&state, who.tenant(), &id)
        .await
        .map_err(refused)?;
    Ok(Json(s))
}

/// The raw usage records, newest (by timestamp) first.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct RecordsPage {
    object: &'static str,
    data: Vec<UsageRecordView>,
    /// More records than `limit` exist.
    has_more: bool,
    limit: usize,
}

/// List a subscription's raw usage records (`limit` 1 to 100, default 50).
#[utoipa::path(
    get, path = "/v1/billing/subscriptions/{id}/usage/records", tag = "Billing", operation_id = "listBillingSubscriptionUsageRecords",
    params(("id" = String, Path, description = ID), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "At most this many records (default 50).")),
    security(("bearer" = ["billing:read"])),
    responses(
        (status = 200, description = "The newest records.", body = RecordsPage),
    ),
)]
async fn list_usage_records(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<SubscriptionId>,
    query: QueryParams,
) -> Result<Json<RecordsPage>, ApiError> {
    let who = allowed(&auth, Scope::BillingRead)?;
    let limit = usage::records_limit(query.get("limit")).map_err(Refusal::from)?;
    let id = id.get()?;
    let (records, has_more) = usage::list_records(&state, who.tenant(), &id, limit)
        .await
        .map_err(refused)?;
    Ok(Json(RecordsPage {
        object: "list",
        data: records.iter().map(UsageRecordView::of).collect(),
        has_more,
        limit,
    }))
}
