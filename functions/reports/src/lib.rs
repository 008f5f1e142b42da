//! The reports function (issue 41, exports): `POST /v1/reports` starts an
//! export of the tenant's payments or refunds over `[from, to)`,
//! `GET /v1/reports/{id}` shows its progress and, once `ready`, a download
//! link that expires, `GET /v1/reports` lists them, newest first. The
//! rules are `shared::domain::reports`; the run itself is the
//! report-runner function's on AWS (every minute) and a task of the local
//! gateway's here.
//!
//! `GET /exports/{id}` serves a ready file behind a signed link where the
//! blob store has no presigned URLs of its own (the local gateway): the
//! link is the bearer, so the route takes no API key. On AWS the link is
//! S3's presigned GET and this route is not deployed.
//!
//! Scopes: `payments:read` for every route (an export is a read of the
//! records), and `refunds:read` as well to export refunds,
//! `billing:read` (and a plan with billing) to export billing invoices.

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::pagination::PageParams;
use edge::{ApiError, Auth, Json, JsonBody, Page, Pagination, PathId, QueryParams, with_edge};
use http::{StatusCode, header};
use serde::Deserialize;
use shared::AppState;
use shared::domain::account::Scope;
use shared::domain::reports::{self, ReportRequest, ReportView};
use shared::ids::{IdKind, ReportId};

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_report, list_reports)))
        .routes(routes!(get_report))
}

/// The function's routes, behind the idempotency layer, in the shared
/// edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// The signed download route of the local blob store (no API key: the
/// signed link is the bearer).
pub fn download_router(state: AppState) -> Router {
    with_edge(
        Router::new()
            .route("/exports/{id}", axum::routing::get(download))
            .with_state(state),
    )
}

/// `POST /v1/reports`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateReport)]
pub struct CreateReport {
    /// `payments`, `refunds`, `billing_invoices` or `reconciliation` (the
    /// findings of the completed reconciliation runs whose Nepal day
    /// begins in the range).
    #[serde(rename = "type")]
    pub report_type: String,
    /// Records created at or after this time (ISO 8601 / RFC 3339; for
    /// `reconciliation`, runs of the Nepal days beginning at or after it,
    /// e.g. `2026-11-01T00:00:00+05:45`).
    pub from: String,
    /// ...and before this one; at most 366 days after `from`.
    pub to: String,
}

#[utoipa::path(
    post, path = "/v1/reports", tag = "Reports", operation_id = "createReport",
    request_body = CreateReport,
    security(("bearer" = ["payments:read"])),
    responses(
        (status = 201, description = "The report, `pending`: poll `GET /v1/reports/{id}`.", body = ReportView),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = ReportView),
        (status = 400, description = "An unknown `type`, a `from` or `to` that is not ISO 8601, `from` not before `to`, a range over 366 days.", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "`too_many_reports`: the project has 5 reports pending or running; wait for one to end.", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_report(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<JsonBody<CreateReport>, ApiError>,
) -> Result<(StatusCode, Json<ReportView>), ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let JsonBody(body) = body?;
    match body.report_type.as_str() {
        "refunds" => {
            auth.require(Scope::RefundsRead)?;
        }
        "billing_invoices" => {
            // As the billing routes: the scope, then the plan's billing.
            shared::domain::billing::customers::entitled(auth.require(Scope::BillingRead)?)?;
        }
        _ => {}
    }
    let req = ReportRequest {
        report_type: &body.report_type,
        from: &body.from,
        to: &body.to,
    };
    let report = reports::create(&state, who.tenant(), &req, state.clock.now()).await?;
    if state.runs_background_work() {
        // A long-lived process: run it now rather than on the next tick.
        reports::spawn_run((*state).clone(), report.id.clone());
    }
    Ok((StatusCode::CREATED, Json(ReportView::of(&report))))
}

#[utoipa::path(
    get, path = "/v1/reports", tag = "Reports", operation_id = "listReports",
    params(PageParams),
    security(("bearer" = ["payments:read"])),
    responses((status = 200, description = "A page of reports, newest first (without links: get one for its link).", body = Page<ReportView>)),
)]
async fn list_reports(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryParams,
) -> Result<Json<Page<ReportView>>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let page = Pagination::from_query(&query, reports::DEFAULT_PAGE, IdKind::Report)?;
    let (found, total) = reports::list(&state, who.tenant(), page.window()).await?;
    let data = found.iter().map(ReportView::of).collect();
    Ok(Json(Page::new(data, total, page)))
}

#[utoipa::path(
    get, path = "/v1/reports/{id}", tag = "Reports", operation_id = "getReport",
    params(("id" = String, Path, description = "A report id, `rpt_…`.")),
    security(("bearer" = ["payments:read"])),
    responses((status = 200, description = "The report: its progress (`status`, `rows`), and once `ready` a download link that expires (`downloadUrl`, `downloadExpiresAt`).", body = ReportView)),
)]
async fn get_report(
    State(state): State<AppState>,
    auth: Auth,
    id: PathId<ReportId>,
) -> Result<Json<ReportView>, ApiError> {
    let who = auth.require(Scope::PaymentsRead)?;
    let id = id.get()?;
    let report = reports::get(&state, who.tenant(), &id).await?;
    let view = ReportView::with_link(&state, &report, state.clock.now()).await?;
    Ok(Json(view))
}

/// A ready report's file behind its signed local link.
async fn download(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    parts: http::request::Parts,
    query: QueryParams,
) -> Result<Response, ApiError> {
    // Keyless: bounded per address as every public route is, before the
    // link is checked or the file read.
    let address = edge::requests::client_address_in(&state, &parts.headers, &parts.extensions);
    let request = shared::limits::public::PublicRequest {
        address: address.as_str(),
        poll: false,
        write: false,
        link: None,
        opens_session: false,
        opens_stream: false,
    };
    if let Err(limited) = state.take_public(&request).await {
        return Err(ApiError::public_limited(&limited));
    }
    let Some(id) = ReportId::parse(&id) else {
        return Err(ApiError::not_found("report", &id));
    };
    let expires = query.get("expires").unwrap_or_default();
    let signature = query.get("signature").unwrap_or_default();
    let blob = reports::download(&state, &id, expires, signature, state.clock.now()).await?;
    Ok((
        [
            (header::CONTENT_TYPE, blob.content_type),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{id}.csv\""),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        blob.bytes,
    )
        .into_response())
}
