//! The Exports page (issue 41, part 3): start a CSV export of the
//! project's payments, refunds or billing invoices over a range of Nepal
//! days, see each one's progress (status, rows so far; the page asks the
//! browser to reload itself every few seconds while one is unfinished,
//! with a `Refresh` header: no script), and download the finished ones
//! through `/dashboard/exports/{id}/download` (`documents`), which answers
//! a link made fresh on each click (S3's presigned GET on AWS, the signed
//! local link on the embedded backend). Through the same domain calls as
//! `/v1/reports`.
//!
//! Everyone who reads records sees the page and downloads
//! (`Action::ReadRecords`: an export holds nothing the lists do not);
//! starting one takes `Action::Export` (owners and developers: a start
//! takes one of the project's few unfinished places), the form's CSRF
//! token and an audit entry. The payments and refunds lists link here
//! with their type (and their dates, when they have them) filled in.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::response::IntoResponse;
use chrono::NaiveDate;
use edge::html::html;
use http::{HeaderValue, StatusCode};
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::billing::calendar::{nepal_day, nepal_day_start};
use shared::domain::dashboard::Action;
use shared::domain::reports::{self, ReportError, ReportRequest, ReportStatus, ReportView};
use shared::domain::{Window, billing};

use crate::pages::{Nav, layout, status_badge, when};
use crate::{Page, Signed, audit, fail, nav, query, see_other};

pub const PATH: &str = "/dashboard/exports";
/// Reports listed.
const SHOWN: usize = 25;
/// Seconds between reloads while a report is unfinished.
const RELOAD_SECS: u32 = 5;
const TYPES: [(&str, &str); 4] = [
    ("payments", "Payments"),
    ("refunds", "Refunds"),
    ("billing_invoices", "Billing invoices"),
    ("reconciliation", "Reconciliation findings"),
];

/// The link to this page from a list (`payments`, `refunds`): its type,
/// and the list's Nepal days when it has them.
pub fn button(kind: &str, days: Option<(NaiveDate, NaiveDate)>) -> Markup {
    let mut href = format!("{PATH}?type={kind}");
    if let Some((from, to)) = days {
        href.push_str(&format!("&from={from}&to={to}"));
    }
    markup! { p { a.button href=(href) { "Export CSV…" } } }
}

fn day(raw: Option<&String>) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(raw?.trim(), "%Y-%m-%d").ok()
}

/// What the start form shows: a type and an inclusive range of days.
struct Asked {
    kind: String,
    from: NaiveDate,
    to: NaiveDate,
}

impl Asked {
    /// The form's fields, else the last 30 Nepal days of payments.
    fn of(fields: &std::collections::HashMap<String, String>, today: NaiveDate) -> Self {
        let kind = fields
            .get("type")
            .filter(|t| TYPES.iter().any(|(k, _)| k == t))
            .cloned()
            .unwrap_or_else(|| "payments".into());
        Asked {
            kind,
            from: day(fields.get("from")).unwrap_or(today - chrono::Duration::days(29)),
            to: day(fields.get("to")).unwrap_or(today),
        }
    }
}

fn status_of(r: &ReportView) -> Markup {
    status_badge(match r.status {
        ReportStatus::Pending => "pending",
        ReportStatus::Running => "running",
        ReportStatus::Ready => "ready",
        ReportStatus::Failed => "failed",
    })
}

fn type_name(kind: reports::ReportType) -> &'static str {
    TYPES
        .iter()
        .find(|(k, _)| *k == kind.as_str())
        .map_or("", |(_, name)| *name)
}

fn form(nav: &Nav, asked: &Asked) -> Markup {
    markup! {
        div.panel {
            h2 { "Start an export" }
            form method="post" action=(PATH) {
                input type="hidden" name="csrf" value=(nav.csrf);
                label for="export_type" { "Records " }
                select id="export_type" name="type" {
                    @for (k, name) in TYPES {
                        option value=(k) selected[asked.kind == k] { (name) }
                    }
                }
                " " label for="export_from" { "From (Nepal day) " }
                input id="export_from" name="from" type="date" value=(asked.from) required;
                " " label for="export_to" { "To (Nepal day, included) " }
                input id="export_to" name="to" type="date" value=(asked.to) required;
                " " button type="submit" { "Start export" }
            }
            p.muted { "Records created on those days, as CSV: amounts in paisa and rupees, times in UTC and Nepal time, days in AD and BS. At most 366 days, and 5 exports unfinished at a time." }
        }
    }
}

async fn page(
    state: &AppState,
    signed: &Signed,
    asked: &Asked,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let nav = nav(state, signed, "exports").await?;
    let (found, _) = reports::list(state, &signed.tenant, Window::first(SHOWN))
        .await
        .map_err(fail)?;
    // A finished file is linked through `/dashboard/exports/{id}/download`,
    // which signs a fresh link on each click (`documents::export_download`).
    let views: Vec<ReportView> = found.iter().map(ReportView::of).collect();
    let unfinished = views.iter().any(|v| !v.status.finished());
    let body = markup! {
        @if let Some(e) = error { p.error role="alert" { (e) } }
        @if signed.allows(Action::Export) { (form(&nav, asked)) }
        div.panel {
            h2 { "Exports" }
            @if views.is_empty() { p { "No exports yet." } } @else {
                @if unfinished {
                    p.muted { "This page reloads itself every " (RELOAD_SECS) " seconds while an export runs. " a href=(PATH) { "Reload now" } }
                }
                table {
                    thead { tr {
                        th scope="col" { "Export" }
                        th scope="col" { "Records" }
                        th scope="col" { "Created from" }
                        th scope="col" { "to (before)" }
                        th scope="col" { "Status" }
                        th.num scope="col" { "Rows" }
                        th scope="col" { "Started" }
                        th scope="col" { "File" }
                    } }
                    tbody {
                        @for v in &views {
                            tr {
                                td { (v.id) }
                                td { (type_name(v.report_type)) }
                                td { (when(v.from)) }
                                td { (when(v.to)) }
                                td { (status_of(v)) @if let Some(f) = &v.failure { br; span.muted { (f) } } }
                                td.num { (v.rows) }
                                td { (when(v.created_at)) }
                                td {
                                    @if v.status == ReportStatus::Ready {
                                        a href=(format!("{PATH}/{}/download", v.id)) download { "Download CSV" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    let mut answer = html(status, layout(&nav, "Exports", body));
    if unfinished {
        answer.headers_mut().insert(
            http::header::HeaderName::from_static("refresh"),
            HeaderValue::from(RELOAD_SECS),
        );
    }
    Ok(answer.into_response())
}

pub async fn exports_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let q = query(&raw);
    let asked = Asked::of(&q, nepal_day(state.clock.now()));
    page(&state, &signed, &asked, None, StatusCode::OK).await
}

pub async fn start(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::Export, &body)?;
    let now = state.clock.now();
    let asked = Asked::of(&f, nepal_day(now));
    let (Some(from), Some(to)) = (day(f.get("from")), day(f.get("to"))) else {
        return page(
            &state,
            &signed,
            &asked,
            Some("From and to: days, YYYY-MM-DD"),
            StatusCode::BAD_REQUEST,
        )
        .await;
    };
    let (Some(start), Some(end)) = (
        nepal_day_start(from),
        to.succ_opt().and_then(nepal_day_start),
    ) else {
        return page(
            &state,
            &signed,
            &asked,
            Some("From and to: days, YYYY-MM-DD"),
            StatusCode::BAD_REQUEST,
        )
        .await;
    };
    let kind = f.get("type").map(String::as_str).unwrap_or("");
    if kind == "billing_invoices"
        && !billing::customers::merchant_entitled(&state, &signed.session.merchant_id)
            .await
            .map_err(fail)?
    {
        let e = "Billing invoices: your plan does not include billing";
        return page(&state, &signed, &asked, Some(e), StatusCode::FORBIDDEN).await;
    }
    let (from_s, to_s) = (start.to_rfc3339(), end.to_rfc3339());
    let req = ReportRequest {
        report_type: kind,
        from: &from_s,
        to: &to_s,
    };
    let report = match reports::create(&state, &signed.tenant, &req, now).await {
        Ok(r) => r,
        Err(e @ ReportError::TooMany) => {
            return page(
                &state,
                &signed,
                &asked,
                Some(&e.to_string()),
                StatusCode::CONFLICT,
            )
            .await;
        }
        Err(
            e @ (ReportError::Type
            | ReportError::Time(_)
            | ReportError::Order
            | ReportError::TooLong),
        ) => {
            return page(
                &state,
                &signed,
                &asked,
                Some(&e.to_string()),
                StatusCode::BAD_REQUEST,
            )
            .await;
        }
        Err(e) => return Err(fail(e)),
    };
    audit(
        &state,
        &signed,
        "report.create",
        report.id.as_str(),
        &format!("{kind} {from} to {to}"),
    )
    .await?;
    if state.runs_background_work() {
        reports::spawn_run((*state).clone(), report.id.clone());
    }
    Ok(see_other(PATH))
}
