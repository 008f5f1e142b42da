//! The Reconciliation page (issue 41, part 6): the project's runs, newest
//! first (provider, Nepal day, source, status, counts per classification,
//! totals), a run's findings with a link to our payment when one is named,
//! "Settle from provider" on a `missing_in_dhukuti` payment line, the
//! statement upload form (eSewa, Fonepay), "Run Khalti now" (the pull),
//! and the way to the settlements. Through the same domain calls as
//! `/v1/reconciliation` (`domain::reconciliation::runs`).
//!
//! The form carries the file itself (`multipart/form-data`, at most
//! [`FORM_MAX_BYTES`]: what a Lambda request carries once API Gateway
//! has base64-encoded it), read in the request and run with
//! `runs::start_file`; the pages' function has no S3 client (issue 21),
//! so a larger file (up to the statements' 10 MB) goes through the API's
//! short-lived upload URL or `dhukuti-admin reconcile --file`.
//!
//! Everyone who reads records sees the runs (`Action::ReadRecords`);
//! uploading, pulling and settling take `Action::ChangeRecords`, the
//! form's CSRF token and an audit entry (`reconciliation.run`,
//! `reconciliation.settle`).

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::{Markup, html as markup};
use shared::AppState;
use shared::domain::Provider;
use shared::domain::billing::calendar::nepal_day;
use shared::domain::dashboard::Action;
use shared::domain::reconciliation::matching::{Classification, Counts};
use shared::domain::reconciliation::runs::{
    self, Run, RunError, RunFilter, RunRequest, RunSource, RunStatus, StoredFinding,
};
use shared::domain::reconciliation::statements::LineKind;
use shared::ids::ReconRunId;
use shared::money::Paisa;
use shared::refusal::Refusal;
use shared::time::Timestamp;

use crate::pages::{layout, pager, pages_of, rupees, status_badge, when};
use crate::{Page, Signed, Stop, audit, fail, nav, page_number, page_window, query, see_other};

pub const PATH: &str = "/dashboard/reconciliation";
/// The largest statement file the upload form carries: a Lambda request
/// is at most 6 MB, and API Gateway sends a file base64-encoded.
pub const FORM_MAX_BYTES: usize = 4 * 1024 * 1024;
/// The form's other fields and the parts' headers.
const FORM_SLACK: usize = 64 * 1024;
/// The providers whose statement is a file.
const UPLOADED: [Provider; 2] = [Provider::Esewa, Provider::Fonepay];

fn amount(p: Option<Paisa>) -> String {
    p.map(|p| rupees(p.get())).unwrap_or_else(|| "—".into())
}

fn source_name(s: RunSource) -> &'static str {
    match s {
        RunSource::Pull => "pulled",
        RunSource::Upload => "uploaded file",
    }
}

fn status_of(run: &Run) -> Markup {
    status_badge(match run.status {
        RunStatus::Running => "running",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
    })
}

fn class_name(c: Classification) -> &'static str {
    match c {
        Classification::Matched => "Matched",
        Classification::AmountMismatch => "Amount mismatch",
        Classification::FeeMismatch => "Fee mismatch",
        Classification::MissingInProvider => "Missing at the provider",
        Classification::MissingInDhukuti => "Missing in Dhukuti",
        Classification::NotOurs => "Not ours",
    }
}

/// A run's counts as shown (all zero until it completed).
fn counts_of(run: &Run) -> Counts {
    if run.status == RunStatus::Completed {
        run.counts
    } else {
        Counts::default()
    }
}

/// The upload form, "Run Khalti now" and the way to the settlements.
fn forms(csrf: &str, today: &str) -> Markup {
    markup! {
        section.panel aria-labelledby="upload-title" {
            h2 id="upload-title" { "Upload a statement" }
            p.muted { "The statement file of one Nepal day from the eSewa or Fonepay merchant portal (CSV, XLSX or XLS), at most " (FORM_MAX_BYTES / 1024 / 1024) " MB here. A larger one (up to 10 MB) goes through the API's upload URL (POST /v1/reconciliation/uploads) or dhukuti-admin reconcile --file." }
            form.stack method="post" action={ (PATH) "/uploads" } enctype="multipart/form-data" {
                input type="hidden" name="csrf" value=(csrf);
                label for="upload-provider" { "Provider" }
                select id="upload-provider" name="provider" required {
                    @for p in UPLOADED { option value=(p.as_str()) { (p.display_name()) } }
                }
                label for="upload-date" { "Nepal day" }
                input id="upload-date" name="date" type="date" required value=(today);
                label for="upload-file" { "Statement file" }
                input id="upload-file" name="file" type="file" required accept=".csv,.xlsx,.xls,text/csv";
                button.primary type="submit" { "Upload and run" }
            }
        }
        section.panel aria-labelledby="khalti-title" {
            h2 id="khalti-title" { "Khalti" }
            p.muted { "Khalti's transaction list of the day is pulled from Khalti with the project's key." }
            form.stack method="post" action={ (PATH) "/khalti" } {
                input type="hidden" name="csrf" value=(csrf);
                label for="khalti-date" { "Nepal day" }
                input id="khalti-date" name="date" type="date" required value=(today);
                button.primary type="submit" { "Run Khalti now" }
            }
        }
    }
}

/// The runs page, with an error above it when a form was refused.
async fn show(
    state: &AppState,
    signed: &Signed,
    page: usize,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let (found, total) = runs::list(
        state,
        &signed.tenant,
        &RunFilter::default(),
        page_window(page),
    )
    .await
    .map_err(fail)?;
    let nav = nav(state, signed, "reconciliation").await?;
    let today = nepal_day(state.clock.now()).format("%Y-%m-%d").to_string();
    let body = markup! {
        @if let Some(e) = error { p.error role="alert" { (e) } }
        p {
            "Each run matches one provider's statement of one Nepal day against your payments and refunds. "
            a href={ (PATH) "/settlements" } { "Settlements" } ": what each provider should pay beside what your bank received."
        }
        div.panel {
            h2 { "Runs" }
            @if found.is_empty() {
                p { "No reconciliation runs yet." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Run" }
                        th scope="col" { "Provider" }
                        th scope="col" { "Nepal day" }
                        th scope="col" { "Source" }
                        th scope="col" { "Status" }
                        @for c in Classification::ALL { th.num scope="col" { (class_name(c)) } }
                        th.num scope="col" { "Ours" }
                        th.num scope="col" { "Theirs" }
                        th scope="col" { "Started" }
                    } }
                    tbody { @for r in &found {
                        @let counts = counts_of(r);
                        tr.variance[counts.discrepancies() > 0] {
                            td { a href={ (PATH) "/runs/" (r.id) } { (r.id) } }
                            td { (r.provider.display_name()) }
                            td { (r.day) }
                            td { (source_name(r.source)) }
                            td { (status_of(r)) @if let Some(f) = &r.failure { br; span.muted { (f) } } }
                            @for c in Classification::ALL { td.num { (counts.of(c)) } }
                            td.num { (rupees(r.ours_total.get())) }
                            td.num { (rupees(r.theirs_total.get())) }
                            td { (when(r.created_at)) }
                        }
                    } }
                }
            }
            (pager(PATH, page, pages_of(total)))
        }
        @if signed.allows(Action::ChangeRecords) { (forms(&nav.csrf, &today)) }
    };
    Ok(html(status, layout(&nav, "Reconciliation", body)))
}

pub async fn page(State(state): State<AppState>, signed: Signed, RawQuery(raw): RawQuery) -> Page {
    signed.require(Action::ReadRecords)?;
    let page = page_number(&query(&raw))?;
    show(&state, &signed, page, None, StatusCode::OK).await
}

/// After a run was asked: its page, or the runs page saying why not.
async fn ran(
    state: &AppState,
    signed: &Signed,
    result: Result<Run, RunError>,
    now: Timestamp,
) -> Page {
    match result {
        Ok(run) => {
            let detail = format!(
                "{} {} {}",
                run.provider.as_str(),
                run.day,
                source_name(run.source)
            );
            let fresh = run.created_at == now;
            if fresh {
                audit(
                    state,
                    signed,
                    "reconciliation.run",
                    run.id.as_str(),
                    &detail,
                )
                .await?;
            }
            let done = if fresh { "ran" } else { "again" };
            Ok(see_other(&format!("{PATH}/runs/{}?done={done}", run.id)))
        }
        Err(e) => refused(state, signed, e).await,
    }
}

/// The runs page with the refusal's words, naming its field; a failure
/// of ours is the failure page.
async fn refused(state: &AppState, signed: &Signed, e: RunError) -> Page {
    let refusal = Refusal::from(e);
    let status = edge::refusals::status_of(refusal.kind);
    if status.is_server_error() && refusal.code != "provider_error" {
        return Err(fail(refusal));
    }
    let why = match &refusal.field {
        Some(field) => format!("Not run: {field}: {}", refusal.message),
        None => format!("Not run: {}", refusal.message),
    };
    show(state, signed, 1, Some(why.as_str()), status).await
}

/// "Run Khalti now": the day's transaction list pulled and run.
pub async fn pull(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    let date = f.get("date").map(|d| d.trim()).unwrap_or_default();
    let req = RunRequest {
        provider: Provider::Khalti.as_str(),
        date,
        upload_id: None,
    };
    let now = state.clock.now();
    let result = runs::start(&state, &signed.tenant, &req, now).await;
    ran(&state, &signed, result, now).await
}

/// The upload form's fields: what [`read_form`] accepts, no other.
const FORM_FIELDS: [&str; 4] = ["csrf", "provider", "date", "file"];
/// The most one of the form's text fields carries (the CSRF token, a
/// provider, a day).
const TEXT_MAX_BYTES: u64 = 1024;
/// The most parts a form may have: a few of each field, no more.
const FORM_MAX_PARTS: usize = 16;

/// The upload form as read from its body.
#[derive(Debug, Default)]
struct UploadForm {
    /// Its text fields, the first of each name.
    fields: std::collections::HashMap<String, String>,
    /// The chosen file: the first `file` part with a file name.
    file: Option<Bytes>,
}

/// Why a body is not the upload form: the page's message and status.
#[derive(Debug, PartialEq, Eq)]
struct BadForm {
    why: String,
    status: StatusCode,
}

fn too_large() -> BadForm {
    BadForm {
        why: format!(
            "Not run: file: the file is over the {} MB this form carries; send a larger one \
             (up to 10 MB) through the API's upload URL",
            FORM_MAX_BYTES / 1024 / 1024
        ),
        status: StatusCode::PAYLOAD_TOO_LARGE,
    }
}

fn malformed(what: impl std::fmt::Display) -> BadForm {
    BadForm {
        why: format!("Not run: the form did not arrive whole (malformed multipart body: {what})"),
        status: StatusCode::BAD_REQUEST,
    }
}

/// The boundary of a `multipart/form-data` request's `Content-Type`.
fn boundary_of(content_type: &str) -> Option<String> {
    multer::parse_boundary(content_type)
        .ok()
        .filter(|b| !b.is_empty())
}

/// The upload form's fields in `body` (already read whole), sent with
/// `boundary`: only [`FORM_FIELDS`], a text field at most
/// [`TEXT_MAX_BYTES`], the file at most [`FORM_MAX_BYTES`].
async fn read_form(boundary: &str, body: Bytes) -> Result<UploadForm, BadForm> {
    let limits = multer::SizeLimit::new()
        .whole_stream((FORM_MAX_BYTES + FORM_SLACK) as u64)
        .per_field(TEXT_MAX_BYTES)
        .for_field("file", FORM_MAX_BYTES as u64);
    let constraints = multer::Constraints::new()
        .allowed_fields(FORM_FIELDS.to_vec())
        .size_limit(limits);
    let stream = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut parts = multer::Multipart::with_constraints(stream, boundary, constraints);
    let mut form = UploadForm::default();
    let mut seen = 0;
    while let Some(part) = parts.next_field().await.map_err(bad_form)? {
        seen += 1;
        if seen > FORM_MAX_PARTS {
            return Err(malformed(format!("more than {FORM_MAX_PARTS} parts")));
        }
        let name = part.name().unwrap_or_default().to_owned();
        let is_file = part.file_name().is_some();
        let bytes = part.bytes().await.map_err(bad_form)?;
        if is_file {
            if name == "file" && form.file.is_none() {
                form.file = Some(bytes);
            }
        } else if let Ok(text) = String::from_utf8(bytes.to_vec()) {
            form.fields.entry(name).or_insert(text);
        }
    }
    Ok(form)
}

/// The page for what multer found wrong with the body.
fn bad_form(e: multer::Error) -> BadForm {
    match e {
        multer::Error::StreamSizeExceeded { .. } => too_large(),
        multer::Error::FieldSizeExceeded { field_name, limit } => match field_name.as_deref() {
            Some("file") => too_large(),
            name => BadForm {
                why: format!(
                    "Not run: {}: over the {limit} bytes this field carries",
                    name.unwrap_or("(a part without a name)")
                ),
                status: StatusCode::PAYLOAD_TOO_LARGE,
            },
        },
        multer::Error::UnknownField {
            field_name: Some(name),
        } => BadForm {
            why: format!("Not run: {name}: not a field of this form"),
            status: StatusCode::BAD_REQUEST,
        },
        multer::Error::UnknownField { field_name: None } => malformed("a part without a name"),
        other => malformed(other),
    }
}

/// A statement file from the form (`multipart/form-data`), run at once.
pub async fn upload(
    State(state): State<AppState>,
    signed: Signed,
    req: axum::extract::Request,
) -> Page {
    signed.require(Action::ChangeRecords)?;
    let boundary = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(boundary_of);
    let Some(boundary) = boundary else {
        let why = "Not run: file: choose a statement file (the form was not sent as a file upload)";
        return show(&state, &signed, 1, Some(why), StatusCode::BAD_REQUEST).await;
    };
    let read = match axum::body::to_bytes(req.into_body(), FORM_MAX_BYTES + FORM_SLACK).await {
        Ok(body) => read_form(&boundary, body).await,
        Err(_) => Err(too_large()),
    };
    let form = match read {
        Ok(form) => form,
        Err(bad) => return show(&state, &signed, 1, Some(bad.why.as_str()), bad.status).await,
    };
    let UploadForm { fields, file } = form;
    signed.check_csrf(&fields)?;
    let field = |k: &str| fields.get(k).map(|v| v.trim()).unwrap_or_default();
    let file = file.unwrap_or_default();
    if file.is_empty() {
        let why = "Not run: file: choose a statement file (the one sent is empty)";
        return show(&state, &signed, 1, Some(why), StatusCode::BAD_REQUEST).await;
    }
    let now = state.clock.now();
    let result = runs::start_file(
        &state,
        &signed.tenant,
        field("provider"),
        field("date"),
        &file,
        now,
    )
    .await;
    ran(&state, &signed, result, now).await
}

/// The 404 page of a run the path names, also for an id that cannot be
/// one.
fn no_run(_: &'static str, raw: &str) -> Stop {
    fail(Refusal::not_found("reconciliation run", raw))
}

/// What the run page shows: which findings, and what it says above them.
struct Shown<'a> {
    class: Option<Classification>,
    page: usize,
    notice: Option<String>,
    error: Option<&'a str>,
}

fn finding_row(f: &StoredFinding, run: &ReconRunId, csrf: Option<&str>) -> Markup {
    let x = &f.finding;
    let settleable = x.classification == Classification::MissingInDhukuti
        && x.kind == LineKind::Payment
        && x.payment_id.is_some();
    markup! {
        tr.variance[x.classification != Classification::Matched] {
            td.num { (f.n) }
            td { (class_name(x.classification)) @if x.kind == LineKind::Refund { " (refund)" } }
            td.num { @if let Some(l) = x.line { (l) } @else { "—" } }
            td { @if let Some(p) = &x.payment_id {
                a href={ "/dashboard/payments/" (p) } { (p) }
            } @else { "—" } }
            td { (x.reference.as_deref().unwrap_or("—")) }
            td { (x.provider_ref.as_deref().unwrap_or("—")) }
            td.num { (amount(x.ours_amount)) }
            td.num { (amount(x.theirs_amount)) }
            td.num { (amount(x.ours_fee)) }
            td.num { (amount(x.theirs_fee)) }
            td {
                @if let Some(at) = f.settled_at {
                    "Settled " (when(at))
                } @else if settleable {
                    @if let Some(csrf) = csrf {
                        form method="post" action={ (PATH) "/runs/" (run) "/findings/" (f.n) "/settle" } {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Settle from provider" }
                        }
                    }
                }
            }
        }
    }
}

async fn show_run(
    state: &AppState,
    signed: &Signed,
    id: &ReconRunId,
    shown: Shown<'_>,
    status: StatusCode,
) -> Page {
    let run = runs::get(state, &signed.tenant, id).await.map_err(fail)?;
    let (found, total) = runs::findings(
        state,
        &signed.tenant,
        id,
        shown.class,
        page_window(shown.page),
    )
    .await
    .map_err(fail)?;
    let nav = nav(state, signed, "reconciliation").await?;
    let csrf = signed
        .allows(Action::ChangeRecords)
        .then_some(nav.csrf.as_str());
    let counts = counts_of(&run);
    let path = format!("{PATH}/runs/{id}");
    let paged = match shown.class {
        Some(c) => format!("{path}?classification={}", c.as_str()),
        None => path.clone(),
    };
    let chosen = shown.class.map(Classification::as_str).unwrap_or("");
    let body = markup! {
        @if let Some(n) = &shown.notice { p.notice role="status" { (n) } }
        @if let Some(e) = shown.error { p.error role="alert" { (e) } }
        p { a href=(PATH) { "← All runs" } }
        div.panel {
            dl {
                dt { "Provider" } dd { (run.provider.display_name()) }
                dt { "Nepal day" } dd { (run.day) }
                dt { "Source" } dd { (source_name(run.source)) }
                dt { "Status" } dd { (status_of(&run)) @if let Some(f) = &run.failure { " " (f) } }
                dt { "Statement lines" } dd { (run.lines) }
                dt { "Our successful payments" } dd { (rupees(run.ours_total.get())) }
                dt { "The provider's paid lines" } dd { (rupees(run.theirs_total.get())) }
                dt { "Started" } dd { (when(run.created_at)) }
                dt { "Statement digest" } dd { code { (run.digest) } }
            }
            table {
                thead { tr { @for c in Classification::ALL { th.num scope="col" { (class_name(c)) } } } }
                tbody { tr { @for c in Classification::ALL { td.num { (counts.of(c)) } } } }
            }
        }
        form.filters method="get" action=(path) {
            label for="classification" { "Findings" } " "
            select id="classification" name="classification" {
                option value="" selected[chosen.is_empty()] { "all" }
                @for c in Classification::ALL {
                    option value=(c.as_str()) selected[chosen == c.as_str()] { (class_name(c)) }
                }
            }
            " " button type="submit" { "Show" }
        }
        div.panel {
            @if found.is_empty() {
                p { @if run.status == RunStatus::Completed { "No findings here." } @else { "This run did not complete: it shows no findings." } }
            } @else {
                table {
                    thead { tr {
                        th.num scope="col" { "#" }
                        th scope="col" { "Classification" }
                        th.num scope="col" { "Line" }
                        th scope="col" { "Our payment" }
                        th scope="col" { "Reference" }
                        th scope="col" { "Provider reference" }
                        th.num scope="col" { "Amount (ours)" }
                        th.num scope="col" { "Amount (theirs)" }
                        th.num scope="col" { "Fee (ours)" }
                        th.num scope="col" { "Fee (theirs)" }
                        th scope="col" { "" }
                    } }
                    tbody { @for f in &found { (finding_row(f, id, csrf)) } }
                }
            }
            (pager(&paged, shown.page, pages_of(total)))
        }
    };
    let title = format!(
        "{} reconciliation, {}",
        run.provider.display_name(),
        run.day
    );
    Ok(html(status, layout(&nav, &title, body)))
}

pub async fn run_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<ReconRunId>,
    RawQuery(raw): RawQuery,
) -> Page {
    signed.require(Action::ReadRecords)?;
    let id = id.get_or(no_run)?;
    let q = query(&raw);
    let page = page_number(&q)?;
    let class = match q.get("classification").filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => Some(Classification::parse(c).ok_or_else(|| {
            fail(Refusal::invalid(
                "classification",
                "Not a classification of a finding",
            ))
        })?),
    };
    let notice = match q.get("done").map(String::as_str) {
        Some("ran") => Some("Run completed.".to_owned()),
        Some("again") => {
            Some("This statement was run before: this is that run, nothing changed.".to_owned())
        }
        _ => crate::id_param(&q, "settled", "pay_")
            .map(|p| format!("The provider confirmed it: payment {p} is now paid.")),
    };
    let shown = Shown {
        class,
        page,
        notice,
        error: None,
    };
    show_run(&state, &signed, &id, shown, StatusCode::OK).await
}

/// "Settle from provider" for finding `n` of a run: the provider asked
/// now, as the API's settle; refused (nothing changed) when it does not
/// confirm the payment.
pub async fn settle(
    State(state): State<AppState>,
    signed: Signed,
    path: PathId<(ReconRunId, String)>,
    body: Bytes,
) -> Page {
    signed.action_form(Action::ChangeRecords, &body)?;
    let (id, n) = path.get_or(no_run)?;
    let n: u32 = n
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| fail(RunError::NoFinding(0)))?;
    match runs::settle(&state, &signed.tenant, &id, n, state.clock.now()).await {
        Ok(payment) => {
            let detail = format!("run {id} finding {n}");
            audit(
                &state,
                &signed,
                "reconciliation.settle",
                payment.id.as_str(),
                &detail,
            )
            .await?;
            Ok(see_other(&format!(
                "{PATH}/runs/{id}?settled={}",
                payment.id
            )))
        }
        Err(
            e @ (RunError::NotSettleable(_) | RunError::NotConfirmed(_) | RunError::Provider2(_)),
        ) => {
            let status = if matches!(e, RunError::Provider2(_)) {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::CONFLICT
            };
            let why = format!("Not settled: {e}");
            let shown = Shown {
                class: None,
                page: 1,
                notice: None,
                error: Some(why.as_str()),
            };
            show_run(&state, &signed, &id, shown, status).await
        }
        Err(e) => Err(fail(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A form as a browser posts it: (name, file name, bytes) per part,
    /// boundary `XyZ`, after a preamble.
    fn body(parts: &[(&str, Option<&str>, &[u8])]) -> Bytes {
        let mut out = b"preamble\r\n".to_vec();
        for (name, file, bytes) in parts {
            out.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"");
            out.extend_from_slice(name.as_bytes());
            out.push(b'"');
            if let Some(f) = file {
                out.extend_from_slice(format!("; filename=\"{f}\"").as_bytes());
                out.extend_from_slice(b"\r\nContent-Type: text/csv");
            }
            out.extend_from_slice(b"\r\n\r\n");
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--XyZ--\r\n");
        Bytes::from(out)
    }

    async fn read(body: Bytes) -> Result<UploadForm, BadForm> {
        read_form("XyZ", body).await
    }

    #[tokio::test]
    async fn a_browser_form_with_a_file_reads_back_exactly() {
        let file: &[u8] = b"a,b\r\n--X,y\r\n\r\n\x00\xff end";
        let b = body(&[
            ("csrf", None, b"tok"),
            ("provider", None, b"esewa"),
            ("provider", None, b"fonepay"),
            ("date", None, b"\xff"),
            ("file", Some("day.csv"), file),
            ("file", Some("other.csv"), b"second"),
        ]);
        let form = read(b).await.unwrap_or_default();
        assert_eq!(form.fields.get("csrf").map(String::as_str), Some("tok"));
        // The first of each name; a text that is not UTF-8 is no value.
        assert_eq!(
            form.fields.get("provider").map(String::as_str),
            Some("esewa")
        );
        assert_eq!(form.fields.get("date"), None);
        assert_eq!(form.file.as_deref(), Some(file));
        // A file field without a file name is no file; an empty file is
        // an empty one.
        let text = read(body(&[("file", None, b"x")]))
            .await
            .unwrap_or_default();
        assert_eq!(text.file, None);
        let empty = read(body(&[("file", Some(""), b"")])).await;
        assert_eq!(
            empty.map(|f| f.file).ok().flatten().as_deref(),
            Some(&b""[..])
        );
    }

    #[test]
    fn the_boundary_comes_from_the_content_type() {
        assert_eq!(
            boundary_of("multipart/form-data; boundary=----abc").as_deref(),
            Some("----abc")
        );
        assert_eq!(
            boundary_of("Multipart/Form-Data;charset=utf-8; boundary=\"q r\"").as_deref(),
            Some("q r")
        );
        for bad in [
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/form-data; boundary=\"\"",
            "multipart/mixed; boundary=a",
            "",
        ] {
            assert_eq!(boundary_of(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn a_broken_body_is_a_400_at_every_cut() {
        let whole = body(&[("csrf", None, b"tok"), ("file", Some("f.csv"), b"x,y\r\n")]);
        assert!(read(whole.clone()).await.is_ok());
        // Up to the closing boundary's `--`: never a form, never a panic.
        for cut in 0..whole.len() - 4 {
            let bad = read(whole.slice(..cut)).await.err();
            assert_eq!(
                bad.map(|b| b.status),
                Some(StatusCode::BAD_REQUEST),
                "cut at {cut}"
            );
        }
        let other = read_form("other", whole).await.err();
        assert_eq!(other.map(|b| b.status), Some(StatusCode::BAD_REQUEST));
        let no_name =
            Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--");
        let bad = read(no_name).await.err();
        assert_eq!(bad.map(|b| b.status), Some(StatusCode::BAD_REQUEST));
    }

    #[tokio::test]
    async fn only_the_forms_fields_and_at_most_their_sizes() {
        let bad = read(body(&[("csrf", None, b"t"), ("note", None, b"hi")]))
            .await
            .err();
        assert_eq!(
            bad,
            Some(BadForm {
                why: "Not run: note: not a field of this form".into(),
                status: StatusCode::BAD_REQUEST,
            })
        );
        let at_most = vec![b'a'; FORM_MAX_BYTES];
        let form = read(body(&[("file", Some("f.csv"), &at_most)])).await;
        assert_eq!(
            form.map(|f| f.file.map(|b| b.len())).ok().flatten(),
            Some(FORM_MAX_BYTES)
        );
        let over = vec![b'a'; FORM_MAX_BYTES + 1];
        let bad = read(body(&[("file", Some("f.csv"), &over)])).await.err();
        assert_eq!(bad, Some(too_large()));
        let long = vec![b'a'; TEXT_MAX_BYTES as usize + 1];
        let bad = read(body(&[("csrf", None, &long)])).await.err();
        assert_eq!(
            bad,
            Some(BadForm {
                why: format!("Not run: csrf: over the {TEXT_MAX_BYTES} bytes this field carries"),
                status: StatusCode::PAYLOAD_TOO_LARGE,
            })
        );
        let many: Vec<(&str, Option<&str>, &[u8])> = (0..=FORM_MAX_PARTS)
            .map(|_| ("date", None, &b"d"[..]))
            .collect();
        let bad = read(body(&many)).await.err();
        assert_eq!(bad.map(|b| b.status), Some(StatusCode::BAD_REQUEST));
    }
}
