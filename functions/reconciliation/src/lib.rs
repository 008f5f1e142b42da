//! The reconciliation function (issue 41, statements): a provider's
//! statement of one Nepal day matched against the tenant's payments.
//!
//! - `POST /v1/reconciliation/uploads {provider, date}`: a short-lived
//!   URL to `PUT` an eSewa or Fonepay statement file to (S3 presigned on
//!   AWS; `PUT /statement-uploads/{id}` signed, on the local gateway).
//! - `POST /v1/reconciliation/runs {provider, date, uploadId?}`: runs it
//!   now (Khalti: pulls the day's transaction list) and answers the run,
//!   completed; the same statement again answers the run it made (200).
//! - `GET /v1/reconciliation/runs` (filters `provider`, `date`),
//!   `GET /v1/reconciliation/runs/{id}`,
//!   `GET /v1/reconciliation/runs/{id}/findings?classification=`.
//! - `POST /v1/reconciliation/runs/{id}/findings/{n}/settle`: "settle
//!   from provider" for a `missing_in_dhukuti` finding.
//!
//! Scopes: `payments:read` to read, `payments:write` to upload, run and
//! settle. The rules are `shared::domain::reconciliation`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::PageParams;
use edge::{ApiError, Auth, Json, JsonBody, Page, Pagination, PathId, QueryParams, with_edge};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::payments::PaymentView;
use shared::domain::reconciliation::matching::Classification;
use shared::domain::reconciliation::runs::{
    self, FindingView, RunError, RunFilter, RunRequest, RunView,
};
use shared::domain::reconciliation::uploads;
use shared::ids::{IdKind, ReconRunId, StatementUploadId};
use shared::time::Timestamp;

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_upload)))
        .routes(idempotent(state, routes!(create_run, list_runs)))
        .routes(routes!(get_run))
        .routes(routes!(list_findings))
        .routes(idempotent(state, routes!(settle_finding)))
}

/// The function's routes, behind the idempotency layer, in the shared
/// edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// The signed upload route of the local blob store (no API key: the
/// signed link is the bearer).
pub fn upload_router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route("/statement-uploads/{id}", axum::routing::put(receive))
            .layer(axum::extract::DefaultBodyLimit::max(uploads::MAX_BYTES + 1))
            .with_state(state),
    )
}

/// `POST /v1/reconciliation/uploads`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateStatementUpload)]
pub struct CreateUpload {
    /// `esewa` or `fonepay` (Khalti's statement is pulled).
    pub provider: String,
    /// The Nepal calendar day the statement covers, `YYYY-MM-DD`.
    pub date: String,
}

/// An upload slot: `PUT` the file's bytes to `uploadUrl` before
/// `expiresAt`, then start a run with its `id`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = StatementUpload)]
pub struct UploadView {
    /// `stu_…`.
    pub id: String,
    /// Always `statement_upload`.
    pub object: &'static str,
    pub provider: shared::domain::Provider,
    pub date: String,
    pub upload_url: String,
    pub expires_at: Timestamp,
    /// The largest file taken, in bytes.
    pub max_bytes: usize,
}

#[utoipa::path(
    post, path = "/v1/reconciliation/uploads", tag = "Reconciliation", operation_id = "createStatementUpload",
    request_body = CreateUpload,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 201, description = "An upload URL: `PUT` the statement file to it.", body = UploadView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = UploadView),
        (status = 400, description = "A provider that takes no file (Khalti) or that we do not have, a date that is not `YYYY-MM-DD`.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_upload(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<JsonBody<CreateUpload>, ApiError>,
) -> Result<(StatusCode, Json<UploadView>), ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let provider = runs::parse_provider(&body.provider)?;
    if provider == shared::domain::Provider::Khalti {
        return Err(ApiError::validation(
            "provider",
            "Khalti's statement is pulled from Khalti: start a run without an upload",
        ));
    }
    let day = runs::parse_day(&body.date)?;
    let (upload, url) =
        uploads::create(&state, who.tenant(), provider, day, state.clock.now()).await?;
    Ok((
        StatusCode::CREATED,
        Json(UploadView {
            id: upload.id.to_string(),
            object: "statement_upload",
            provider,
            date: upload.day,
            upload_url: url,
            expires_at: upload.expires_at,
            max_bytes: uploads::MAX_BYTES,
        }),
    ))
}

/// `POST /v1/reconciliation/runs`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateReconciliationRun)]
pub struct CreateRun {
    /// `esewa`, `khalti` or `fonepay`.
    pub provider: String,
    /// The Nepal calendar day, `YYYY-MM-DD`.
    pub date: String,
    /// The uploaded statement (`stu_…`): required for eSewa and Fonepay,
    /// refused for Khalti (its list is pulled).
    #[serde(default)]
    pub upload_id: Option<String>,
}

#[utoipa::path(
    post, path = "/v1/reconciliation/runs", tag = "Reconciliation", operation_id = "createReconciliationRun",
    request_body = CreateRun,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 201, description = "The run, completed with its counts: read its findings.", body = RunView),
        (status = 200, description = "The same statement was run before: that run, unchanged (or a replay of this `Idempotency-Key`).", body = RunView),
        (status = 400, description = "A bad `provider` or `date`, a missing or unknown `uploadId`, a file that cannot be read, has a line outside the day or is for another merchant account (`file`, naming the line).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_run(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<JsonBody<CreateRun>, ApiError>,
) -> Result<(StatusCode, Json<RunView>), ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let req = RunRequest {
        provider: &body.provider,
        date: &body.date,
        upload_id: body.upload_id.as_deref(),
    };
    let now = state.clock.now();
    let run = runs::start(&state, who.tenant(), &req, now).await?;
    let status = if run.created_at == now {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(RunView::of(&run))))
}

#[utoipa::path(
    get, path = "/v1/reconciliation/runs", tag = "Reconciliation", operation_id = "listReconciliationRuns",
    params(
        PageParams,
        ("provider" = Option<String>, Query, description = "Only this provider's runs."),
        ("date" = Option<String>, Query, description = "Only runs of this Nepal day, `YYYY-MM-DD`."),
    ),
    security(("bearer" = ["payments:read"])),
    responses(
        (status = 200, description = "A page of runs, newest first.", body = Page<RunView>),
        (status = 400, description = "An unknown `provider`, a `date` that is not `YYYY-MM-DD`.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn list_runs(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<RunView>>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let page = Pagination::from_query(&query, runs::DEFAULT_PAGE, IdKind::ReconRun)?;
    let filter = RunFilter {
        provider: query
            .get("provider")
            .map(runs::parse_provider)
            .transpose()?,
        day: query.get("date").map(runs::parse_day).transpose()?,
    };
    let (found, total) = runs::list(&state, who.tenant(), &filter, page.window()).await?;
    let data = found.iter().map(RunView::of).collect();
    Ok(Json(Page::new(data, total, page)))
}

#[utoipa::path(
    get, path = "/v1/reconciliation/runs/{id}", tag = "Reconciliation", operation_id = "getReconciliationRun",
    params(("id" = String, Path, description = "A run id, `rrun_…`.")),
    security(("bearer" = ["payments:read"])),
    responses((status = 200, description = "The run and its counts.", body = RunView)),
)]
async fn get_run(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<ReconRunId>,
) -> Result<Json<RunView>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let id = id.get()?;
    let run = runs::get(&state, who.tenant(), &id).await?;
    Ok(Json(RunView::of(&run)))
}

#[utoipa::path(
    get, path = "/v1/reconciliation/runs/{id}/findings", tag = "Reconciliation", operation_id = "listReconciliationFindings",
    params(
        ("id" = String, Path, description = "A run id, `rrun_…`."),
        PageParams,
        ("classification" = Option<Classification>, Query, description = "Only findings of this classification."),
    ),
    security(("bearer" = ["payments:read"])),
    responses(
        (status = 200, description = "A page of the run's findings in order (none while the run is not completed).", body = Page<FindingView>),
        (status = 400, description = "An unknown `classification`.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn list_findings(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<ReconRunId>,
    query: QueryParams,
) -> Result<Json<Page<FindingView>>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let id = id.get()?;
    let page = Pagination::from_query(&query, runs::DEFAULT_PAGE, IdKind::ReconRun)?;
    let classification = match query.get("classification") {
        None => None,
        Some(c) => Some(Classification::parse(c).ok_or_else(|| {
            ApiError::validation(
                "classification",
                "classification must be one of matched, amount_mismatch, fee_mismatch, \
                 missing_in_provider, missing_in_dhukuti, not_ours",
            )
        })?),
    };
    let window = shared::domain::record::Window::at(page.window().offset, page.window().limit);
    let (found, total) = runs::findings(&state, who.tenant(), &id, classification, window).await?;
    let data = found.iter().map(FindingView::of).collect();
    Ok(Json(Page::new(data, total, page)))
}

#[utoipa::path(
    post, path = "/v1/reconciliation/runs/{id}/findings/{n}/settle", tag = "Reconciliation", operation_id = "settleReconciliationFinding",
    params(
        ("id" = String, Path, description = "A run id, `rrun_…`."),
        ("n" = u32, Path, description = "The finding's number in its run."),
    ),
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 200, description = "The provider confirmed the payment paid: the payment, now `success`.", body = PaymentView),
        (status = 409, description = "The finding is not a `missing_in_dhukuti` payment (`state_conflict`), or the provider does not confirm it paid (`provider_not_confirmed`): nothing changed.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn settle_finding(
    State(state): State<AppState>,
    auth: Auth,
    path: PathId<(ReconRunId, String)>,
) -> Result<Json<PaymentView>, ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let (id, n) = path.get()?;
    let n: u32 =
        n.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::from(shared::refusal::Refusal::from(RunError::NoFinding(0)))
        })?;
    let payment = runs::settle(&state, who.tenant(), &id, n, state.clock.now()).await?;
    Ok(Json(PaymentView::from(payment)))
}

/// A statement file `PUT` to its signed local link.
async fn receive(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    parts: http::request::Parts,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    // Keyless: bounded per address as every public route is, before the
    // link is checked or the file stored.
    let address = edge::requests::client_address_in(&state, &parts.headers, &parts.extensions);
    let request = shared::limits::public::PublicRequest {
        address: address.as_str(),
        poll: false,
        write: true,
        link: None,
        opens_session: false,
        opens_stream: false,
    };
    if let Err(limited) = state.take_public(&request).await {
        return Err(ApiError::public_limited(&limited));
    }
    let Some(id) = StatementUploadId::parse(&id) else {
        return Err(ApiError::not_found("statement upload", &id));
    };
    let query = QueryParams::parse(parts.uri.query());
    let expires = query.get("expires").unwrap_or_default();
    let signature = query.get("signature").unwrap_or_default();
    uploads::receive(&state, &id, expires, signature, body, state.clock.now()).await?;
    Ok(StatusCode::OK)
}
