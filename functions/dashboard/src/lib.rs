//! The merchant dashboard: server-rendered pages under `/dashboard` that
//! work without JavaScript, signed in with a cookie session.
//!
//! | Route | What |
//! |---|---|
//! | `GET, POST /dashboard/sign-in` | The sign-in form and its answer (throttled per email and address; a known device on its own budget). |
//! | `POST /dashboard/sign-out`, `/dashboard/sign-out-everywhere` | End this session, or every session of the user. |
//! | `POST /dashboard/view` | Switch project or sandbox/live. |
//! | `POST /dashboard/switch` | Switch to another merchant the person belongs to (checked on the server). |
//! | `GET /dashboard` | The overview: the last 30 days and their chart. |
//! | `GET /dashboard/payments`, `/dashboard/payments/{id}` | Payments, and one with its attempt and refunds. |
//! | `GET /dashboard/audit` | Who did what (owners). |
//! | `GET, POST /dashboard/exports` | Exports: start one (owners, developers), progress, downloads. |
//! | `GET /dashboard/reconciliation`, `/dashboard/reconciliation/runs/{id}` | Reconciliation runs and a run's findings; `POST …/uploads` (a statement file), `…/khalti` (the pull), `…/runs/{id}/findings/{n}/settle`. |
//! | `GET, POST /dashboard/people` | People and invitations (owners). |
//! | `GET, POST /dashboard/join/{token}` | An invitation's link: set a password and join (keyless, throttled per address). |
//!
//! Handlers check the session (`Signed`), the role (`dashboard::allows`, the role table) and,
//! on every form, the CSRF token; the rules live in
//! `shared::domain::dashboard` and the capability modules.

mod billing;
mod billing_changes;
mod chart;
mod clocks;
mod coupons;
mod credentials;
#[cfg(feature = "documents")]
mod documents;
mod exports;
mod join;
mod keys;
mod pages;
mod people;
mod reconciliation;
mod records;
mod settlements;
mod taxcredit;
mod usage;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use edge::PathId;
use edge::html::html;
use edge::with_edge;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use shared::AppState;
use shared::domain::Mode;
use shared::domain::account;
use shared::domain::analytics;
use shared::domain::dashboard::{
    self, Action, Actor, DashboardError, DashboardSession, DashboardUser,
};
use shared::domain::payments::{self, PaymentView};
use shared::domain::refunds::{self, CreateRefund, RefundError, RefundReason};
use shared::domain::{Tenant, Window};
use shared::fields::{NepaliMobile, RefundNotes};
use shared::ids::{IdKind, PaymentId, ProjectId};
use shared::limits::public;
use shared::store::Seek;

pub use pages::Nav;

/// The session cookie.
pub const SESSION_COOKIE: &str = "dhukuti_session";
/// The sign-in form's CSRF cookie (before there is a session).
pub const PRE_COOKIE: &str = "dhukuti_pre";
/// The known-device cookie: a browser that signed in as a user before
/// signs in as them on its own budget (`shared::domain::dashboard`'s
/// `devices`). Sent only to the sign-in form's answer.
pub const DEVICE_COOKIE: &str = "dhukuti_device";
const DEVICE_PATH: &str = "/dashboard/sign-in";
/// Rows a list page shows.
pub const PAGE: usize = 25;

/// The rows of list page `page` (1-based, already checked to be >= 1),
/// by offset: the lists reached by page number only (keys).
pub(crate) fn page_window(page: usize) -> Window {
    Window::at(page.saturating_sub(1).saturating_mul(PAGE), PAGE)
}
/// The deepest page a list reached by page number goes (offset pages
/// read what they skip).
const MAX_PAGE: usize = 400;
/// The deepest page a record list opens at by number alone, without one
/// of its own links' places: 1,000 rows skipped at most (one store
/// read). Its links go anywhere at the cost of one page ([`Place`]).
const MAX_JUMP: usize = 40;

const CSS: &str = include_str!("dashboard.css");

/// The dashboard's routes in the shared edge, with the pages' security
/// headers and the public limits per client address. An invoice's PDF is
/// [`documents_router`]'s.
pub fn router(state: AppState) -> Router {
    in_edge(
        state,
        Router::new()
            .route("/dashboard", get(overview))
            .route("/dashboard/", get(overview))
            .route("/dashboard/sign-in", get(sign_in_page).post(sign_in))
            .route("/dashboard/sign-out", post(sign_out))
            .route("/dashboard/sign-out-everywhere", post(sign_out_everywhere))
            .route("/dashboard/view", post(switch_view))
            .route("/dashboard/switch", post(switch_merchant))
            .route("/dashboard/payments", get(payments_page))
            .route("/dashboard/payments/{id}", get(payment_page))
            .route("/dashboard/payments/{id}/refund", post(refund))
            .route("/dashboard/refunds", get(refunds_page))
            .route(
                "/dashboard/links",
                get(records::links_page).post(records::make_link),
            )
            .route(
                "/dashboard/links/{id}",
                get(records::link_page).post(records::edit_link),
            )
            .route("/dashboard/links/{id}/cancel", post(records::cancel_link))
            .route("/dashboard/invoices", get(records::invoices_page))
            .route("/dashboard/invoices/{id}", get(records::invoice_page))
            .route("/dashboard/billing", get(billing_home))
            .route("/dashboard/billing/customers", get(billing::customers_page))
            .route(
                "/dashboard/billing/customers/{id}",
                get(billing::customer_page),
            )
            .route(
                "/dashboard/billing/customers/{id}/credit",
                post(taxcredit::add_credit),
            )
            .route(
                "/dashboard/billing/settings/tax",
                get(taxcredit::tax_page).post(taxcredit::save_tax),
            )
            .route("/dashboard/billing/plans", get(billing::plans_page))
            .route("/dashboard/billing/plans/{id}", get(billing::plan_page))
            .route(
                "/dashboard/billing/subscriptions",
                get(billing::subscriptions_page),
            )
            .route(
                "/dashboard/billing/subscriptions/{id}",
                get(billing::subscription_page),
            )
            .route(
                "/dashboard/billing/subscriptions/{id}/pause",
                post(billing::pause_subscription),
            )
            .route(
                "/dashboard/billing/subscriptions/{id}/resume",
                post(billing::resume_subscription),
            )
            .route(
                "/dashboard/billing/subscriptions/{id}/cancel",
                post(billing::cancel_subscription),
            )
            .route(
                "/dashboard/billing/subscriptions/{id}/change-plan",
                get(billing_changes::change_plan_preview).post(billing_changes::change_plan),
            )
            .route(
                "/dashboard/billing/subscriptions/{id}/quantity",
                post(billing_changes::update_quantity),
            )
            .route("/dashboard/billing/invoices", get(billing::invoices_page))
            .route(
                "/dashboard/billing/invoices/{id}",
                get(billing::invoice_page),
            )
            .route(
                "/dashboard/billing/invoices/{id}/void",
                post(billing::void_invoice),
            )
            .route(
                "/dashboard/billing/invoices/{id}/record-payment",
                post(billing::record_payment),
            )
            .route(
                "/dashboard/billing/test-clocks",
                get(clocks::clocks_page).post(clocks::create_clock),
            )
            .route(
                "/dashboard/billing/test-clocks/{id}",
                get(clocks::clock_page),
            )
            .route(
                "/dashboard/billing/test-clocks/{id}/advance",
                post(clocks::advance_clock),
            )
            .route(
                "/dashboard/billing/coupons",
                get(coupons::coupons_page).post(coupons::create_coupon),
            )
            .route(
                "/dashboard/billing/coupons/{id}/deactivate",
                post(coupons::deactivate_coupon),
            )
            .route(
                "/dashboard/billing/promotion-codes",
                get(coupons::codes_page).post(coupons::create_code),
            )
            .route(
                "/dashboard/billing/promotion-codes/{id}/deactivate",
                post(coupons::deactivate_code),
            )
            .route("/dashboard/sms", get(records::sms_page))
            .route(
                exports::PATH,
                get(exports::exports_page).post(exports::start),
            )
            .route(
                "/dashboard/webhooks",
                get(records::webhooks_page).post(records::add_endpoint),
            )
            .route(
                "/dashboard/webhooks/{id}",
                get(records::endpoint_page).post(records::change_endpoint),
            )
            .route("/dashboard/webhooks/{id}/resend", post(records::resend))
            .route("/dashboard/webhooks/{id}/test", post(records::send_test))
            .route("/dashboard/keys", get(keys::keys_page).post(keys::issue))
            .route(
                "/dashboard/credentials",
                get(credentials::page).post(credentials::set),
            )
            .route("/dashboard/credentials/check", post(credentials::check))
            .route("/dashboard/credentials/fees", post(credentials::set_fee))
            .route(reconciliation::PATH, get(reconciliation::page))
            .route(
                "/dashboard/reconciliation/uploads",
                post(reconciliation::upload),
            )
            .route(
                "/dashboard/reconciliation/khalti",
                post(reconciliation::pull),
            )
            .route(
                "/dashboard/reconciliation/runs/{id}",
                get(reconciliation::run_page),
            )
            .route(
                "/dashboard/reconciliation/runs/{id}/findings/{n}/settle",
                post(reconciliation::settle),
            )
            .route(
                "/dashboard/reconciliation/settlements",
                get(settlements::page),
            )
            .route(
                "/dashboard/reconciliation/settlements/credits",
                post(settlements::record),
            )
            .route(
                "/dashboard/reconciliation/settlements/credits/{id}/delete",
                post(settlements::delete),
            )
            .route("/dashboard/keys/{id}/rotate", post(keys::rotate))
            .route("/dashboard/keys/{id}/revoke", post(keys::revoke))
            .route("/dashboard/audit", get(audit_page))
            .route("/dashboard/people", get(people::page).post(people::add))
            .route("/dashboard/people/{id}", post(people::change))
            .route(
                "/dashboard/people/invitations/revoke",
                post(people::revoke_invitation),
            )
            .route(
                "/dashboard/join/{token}",
                get(join::page).post(join::accept),
            )
            .route("/dashboard/assets/dashboard.css", get(css))
            // Not a fallback: the local gateway merges every router into
            // one, where a fallback would answer the API's unknown paths.
            .route("/dashboard/{*rest}", axum::routing::any(not_found)),
    )
}

/// `GET /dashboard/invoices/{id}/pdf` and
/// `GET /dashboard/exports/{id}/download`, behind the same sign-in, limits
/// and headers as the pages. Deployed as its own function
/// (`functions/dashboard-documents`, feature `documents`): only it carries
/// the S3 client and the PDF renderer, which would take the pages'
/// function over its size (issue 21).
#[cfg(feature = "documents")]
pub fn documents_router(state: AppState) -> Router {
    in_edge(
        state,
        Router::new()
            .route("/dashboard/invoices/{id}/pdf", get(documents::invoice_pdf))
            .route(
                "/dashboard/exports/{id}/download",
                get(documents::export_download),
            ),
    )
}

/// `routes` with the public limits per client address, the pages'
/// security headers and the shared edge.
fn in_edge(state: AppState, routes: Router<AppState>) -> Router {
    with_edge(
        routes
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                throttle,
            ))
            // Only on the dashboard's own host, when it has one.
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                edge::html::dashboard_site,
            ))
            .layer(axum::middleware::map_response(secure))
            .with_state(state),
    )
}

/// Every request counts against its client address's public limits (the
/// sign-in form is open to anyone; a signed-in browser makes a few
/// requests a page).
async fn throttle(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let address = edge::requests::client_address(&state, &req);
    let request = public::PublicRequest {
        address: address.as_str(),
        poll: false,
        write: req.method() == http::Method::POST,
        link: None,
        opens_session: false,
        opens_stream: false,
    };
    match state.take_public(&request).await {
        Ok(()) => next.run(req).await,
        Err(limited) => {
            let mut res = html(
                StatusCode::TOO_MANY_REQUESTS,
                pages::message(
                    "Too many requests",
                    &format!(
                        "Too many requests from your network. Try again in {} s.",
                        limited.retry_after
                    ),
                ),
            );
            if let Ok(v) = HeaderValue::from_str(&limited.retry_after.to_string()) {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
            res
        }
    }
}

/// The pages' headers: never cached or framed; only our own stylesheet,
/// no script at all, forms only to ourselves.
async fn secure(res: Response) -> Response {
    edge::html::page_answer(
        res,
        "default-src 'none'; style-src 'self'; img-src 'self' data:; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    )
}

pub(crate) fn see_other(location: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    res
}

/// `/dashboard/billing`: its first tab.
async fn billing_home() -> Response {
    see_other("/dashboard/billing/customers")
}

async fn css() -> Response {
    let mut res = CSS.into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    res
}

async fn not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::message("Not found", "There is no such page in the dashboard."),
    )
}

/// A page that ends a handler early (a refusal, a failure): boxed, so
/// that `Result<Response, Stop>` stays small.
pub struct Stop(Box<Response>);

impl IntoResponse for Stop {
    fn into_response(self) -> Response {
        *self.0
    }
}

impl From<Response> for Stop {
    fn from(res: Response) -> Self {
        Stop(Box::new(res))
    }
}

/// What a page handler answers.
pub(crate) type Page = Result<Response, Stop>;

/// [`failure`] as a [`Stop`].
pub(crate) fn fail(e: impl Into<shared::refusal::Refusal>) -> Stop {
    failure(e).into()
}

/// The failure page of a store or rule error: the words of the refusal,
/// never its internals; its status the API's for the refusal's kind.
pub(crate) fn failure(e: impl Into<shared::refusal::Refusal>) -> Response {
    let refusal = e.into();
    let status = edge::refusals::status_of(refusal.kind);
    if status.is_server_error() {
        tracing::error!(code = refusal.code, message = %refusal.message, "dashboard failure");
        return html(
            status,
            pages::message(
                "Something went wrong",
                "We could not finish this. Try again in a moment; if you were changing \
                 something, look whether it was done before you repeat it.",
            ),
        );
    }
    html(status, pages::message("Not done", &refusal.message))
}

/// The page of a form whose token is stale or missing: nothing done.
pub(crate) fn expired_form() -> Stop {
    Stop::from(html(
        StatusCode::FORBIDDEN,
        pages::message(
            "This form has expired",
            "Nothing was changed. Go back, reload the page and try again.",
        ),
    ))
}

/// Writes an audit entry of `action` by the signed-in person, for an
/// action with no transaction of its own. Called before the action's
/// effect where its target is known before (else right after it); a
/// failure to write it fails the request with the failure page, never
/// only a log line.
pub(crate) async fn audit(
    state: &AppState,
    signed: &Signed,
    action: &str,
    target: &str,
    detail: &str,
) -> Result<(), Stop> {
    let entry = signed.entry(state, action, target, detail);
    dashboard::record_audit(state, &entry).await.map_err(fail)
}

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// `Secure` on cookies everywhere but the local http gateway (the
/// dashboard's own base URL when it has one). Cookies carry no `Domain`:
/// they stay on the host that set them.
fn secure_cookies(state: &AppState) -> bool {
    let config = &state.config;
    let base = config
        .dashboard_base_url
        .as_deref()
        .unwrap_or(&config.public_base_url);
    !base.starts_with("http://")
}

fn set_cookie(state: &AppState, name: &str, value: &str, max_age: i64) -> HeaderValue {
    cookie_header(state, name, value, max_age, "/dashboard", "Lax")
}

/// The known-device cookie: as the session's, but SameSite=Strict and
/// sent to the sign-in form only.
fn device_cookie(state: &AppState, value: &str) -> HeaderValue {
    let age = dashboard::DEVICE_LIFETIME.num_seconds();
    cookie_header(state, DEVICE_COOKIE, value, age, DEVICE_PATH, "Strict")
}

fn cookie_header(
    state: &AppState,
    name: &str,
    value: &str,
    max_age: i64,
    path: &str,
    same_site: &str,
) -> HeaderValue {
    let secure = if secure_cookies(state) {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite={same_site}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// A form's fields (`application/x-www-form-urlencoded`), first value of
/// each name.
pub(crate) fn form(body: &Bytes) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    for (k, v) in form_urlencoded::parse(body) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    out
}

pub(crate) fn query(raw: &Option<String>) -> std::collections::HashMap<String, String> {
    form(&Bytes::from(raw.clone().unwrap_or_default()))
}

/// The query parameter `name` when it names one of our ids (`prefix…`):
/// what a notice after an action may echo.
pub(crate) fn id_param<'a>(
    q: &'a std::collections::HashMap<String, String>,
    name: &str,
    prefix: &str,
) -> Option<&'a String> {
    q.get(name).filter(|id| {
        id.starts_with(prefix)
            && id.len() <= 64
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// A page to come back to after signing in: our own paths only.
fn local_path(next: Option<&String>) -> String {
    next.filter(|p| {
        p.starts_with("/dashboard")
            && !p.contains("//")
            && !p.contains('\\')
            && p.len() <= 200
            && p.bytes().all(|b| b.is_ascii_graphic())
    })
    .cloned()
    .unwrap_or_else(|| "/dashboard".to_owned())
}

/// A signed-in request: the session its cookie names, the user, and the
/// client's address. Without one, a GET goes to the sign-in page and
/// comes back after; a POST changes nothing.
pub struct Signed {
    pub session: DashboardSession,
    /// The project and mode the session shows: whose records it reads.
    pub tenant: Tenant,
    pub user: DashboardUser,
    pub cookie: String,
    pub address: String,
}

impl Signed {
    fn actor(&self) -> Actor {
        Actor::of(&self.user, &self.session, &self.address)
    }

    /// The audit entry of `action` by this person now, for an action's
    /// own transaction.
    pub(crate) fn entry(
        &self,
        state: &AppState,
        action: &str,
        target: &str,
        detail: &str,
    ) -> dashboard::AuditEntry {
        dashboard::audit_entry(&self.actor(), state.clock.now(), action, target, detail)
    }

    /// The audit entry of `action` as the one write to add to the
    /// action's own transaction (so the action and its entry commit
    /// together or not at all).
    pub(crate) fn audit_op(
        &self,
        state: &AppState,
        action: &str,
        target: &str,
        detail: &str,
    ) -> Result<Vec<shared::store::TxOp>, Stop> {
        let entry = self.entry(state, action, target, detail);
        Ok(vec![dashboard::audit_op(&entry).map_err(fail)?])
    }

    /// Whether the role table ([`dashboard::allows`]) lets this person
    /// take `what` in the session's mode.
    pub(crate) fn allows(&self, what: Action) -> bool {
        dashboard::allows(self.user.role, what, self.session.mode)
    }

    /// Refuses with a page unless the role table allows `what`.
    fn require(&self, what: Action) -> Result<(), Stop> {
        if self.allows(what) {
            Ok(())
        } else {
            Err(fail(what.refusal(self.user.role, self.session.mode)))
        }
    }

    /// The fields of a form posted for an action needing `what`: the role
    /// checked first, then the form's CSRF token.
    pub(crate) fn action_form(
        &self,
        what: Action,
        body: &Bytes,
    ) -> Result<std::collections::HashMap<String, String>, Stop> {
        self.require(what)?;
        let f = form(body);
        self.check_csrf(&f)?;
        Ok(f)
    }

    /// Refuses with a page unless the form carries this session's token.
    fn check_csrf(&self, fields: &std::collections::HashMap<String, String>) -> Result<(), Stop> {
        let token = fields.get("csrf").map(String::as_str).unwrap_or("");
        if self.session.csrf_ok(token) {
            Ok(())
        } else {
            Err(expired_form())
        }
    }

    fn nav(&self, projects: Vec<account::Project>, current: &'static str) -> Nav {
        Nav {
            email: self.user.email.clone(),
            role: self.user.role,
            csrf: self.session.csrf.clone(),
            project_id: self.session.project_id.to_string(),
            mode: self.session.mode,
            projects: projects
                .into_iter()
                .map(|p| (p.id.into_string(), p.name))
                .collect(),
            current,
            alert: None,
            merchant_id: self.session.merchant_id.to_string(),
            merchants: Vec::new(),
        }
    }
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let signed_out = |parts: &Parts| {
            if parts.method == http::Method::GET {
                let next = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/dashboard");
                let next: String = form_urlencoded::byte_serialize(next.as_bytes()).collect();
                see_other(&format!("/dashboard/sign-in?next={next}"))
            } else {
                html(
                    StatusCode::UNAUTHORIZED,
                    pages::message(
                        "You are signed out",
                        "Nothing was changed. Sign in again and repeat what you were doing.",
                    ),
                )
            }
        };
        let Some(cookie) = cookie(&parts.headers, SESSION_COOKIE) else {
            return Err(signed_out(parts));
        };
        match dashboard::open_session(state, state.clock.now(), &cookie).await {
            Ok(Ok((session, user))) => Ok(Signed {
                tenant: Tenant::new(session.project_id.clone(), session.mode),
                session,
                user,
                cookie,
                address: edge::requests::client_address_in(
                    state,
                    &parts.headers,
                    &parts.extensions,
                ),
            }),
            Ok(Err(_)) => {
                let mut res = signed_out(parts);
                res.headers_mut()
                    .append(header::SET_COOKIE, set_cookie(state, SESSION_COOKIE, "", 0));
                Err(res)
            }
            Err(e) => Err(failure(e)),
        }
    }
}

async fn sign_in_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = query(&raw);
    let pre = cookie(&headers, PRE_COOKIE)
        .filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_else(dashboard::new_form_token);
    let next = local_path(q.get("next"));
    let mut res = html(StatusCode::OK, pages::sign_in(&pre, &next, None, ""));
    res.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, PRE_COOKIE, &pre, 3600),
    );
    res
}

async fn sign_in(State(state): State<AppState>, req: axum::extract::Request) -> Response {
    let address = edge::requests::client_address(&state, &req);
    let headers = req.headers().clone();
    let body = match axum::body::to_bytes(req.into_body(), 16 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            return html(
                StatusCode::PAYLOAD_TOO_LARGE,
                pages::message("Too large", "That form was too large."),
            );
        }
    };
    let f = form(&body);
    let email = f.get("email").cloned().unwrap_or_default();
    let next = local_path(f.get("next"));
    let pre = cookie(&headers, PRE_COOKIE).unwrap_or_default();
    let sent = f.get("csrf").map(String::as_str).unwrap_or("");
    if pre.len() != 32 || !dashboard::same_token(&pre, sent) {
        let fresh = dashboard::new_form_token();
        let mut res = html(
            StatusCode::FORBIDDEN,
            pages::sign_in(
                &fresh,
                &next,
                Some("This form has expired. Please sign in again."),
                &email,
            ),
        );
        res.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(&state, PRE_COOKIE, &fresh, 3600),
        );
        return res;
    }
    let password = f.get("password").cloned().unwrap_or_default();
    let device = cookie(&headers, DEVICE_COOKIE);
    let req = dashboard::SignInRequest {
        email: &email,
        password: &password,
        address: &address,
        device: device.as_deref(),
    };
    match dashboard::sign_in_with(&state, state.clock.now(), &req).await {
        Ok(signed) => {
            let mut res = see_other(&next);
            let age = dashboard::ABSOLUTE.num_seconds();
            let h = res.headers_mut();
            h.append(
                header::SET_COOKIE,
                set_cookie(&state, SESSION_COOKIE, &signed.cookie, age),
            );
            h.append(header::SET_COOKIE, set_cookie(&state, PRE_COOKIE, "", 0));
            if let Some(device) = &signed.device {
                h.append(header::SET_COOKIE, device_cookie(&state, device));
            }
            res
        }
        Err(e) => {
            // The sign-in form again, in its own words; the status is the
            // refusal's.
            let (message, retry_after) = match &e {
                DashboardError::WrongCredentials => ("Wrong email or password.".to_owned(), None),
                DashboardError::Throttled { retry_after } => (
                    format!(
                        "Too many sign-in attempts. Try again in {} minutes.",
                        (retry_after + 59) / 60
                    ),
                    Some(*retry_after),
                ),
                DashboardError::Disabled => (
                    "This user is disabled. Ask your account's owner.".to_owned(),
                    None,
                ),
                DashboardError::NoProject => (
                    "Your account has no project yet. Contact Dhukuti.".to_owned(),
                    None,
                ),
                _ => return failure(e),
            };
            let status = edge::refusals::status_of(shared::refusal::Refusal::from(e).kind);
            let mut res = html(status, pages::sign_in(&pre, &next, Some(&message), &email));
            if let Some(retry_after) = retry_after
                && let Ok(v) = HeaderValue::from_str(&retry_after.to_string())
            {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
            res
        }
    }
}

async fn sign_out(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    signed.check_csrf(&form(&body))?;
    let entry = signed.entry(&state, "sign_out", &signed.user.id, "");
    dashboard::sign_out_audited(&state, &signed.cookie, &entry)
        .await
        .map_err(fail)?;
    Ok(signed_out_now(&state))
}

/// Back to the sign-in page, the session cookie cleared.
fn signed_out_now(state: &AppState) -> Response {
    let mut res = see_other("/dashboard/sign-in");
    res.headers_mut()
        .append(header::SET_COOKIE, set_cookie(state, SESSION_COOKIE, "", 0));
    res
}

async fn sign_out_everywhere(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    signed.check_csrf(&form(&body))?;
    let entry = signed.entry(&state, "sign_out_everywhere", &signed.user.id, "");
    dashboard::sign_out_everywhere(&state, &signed.user.id, &entry)
        .await
        .map_err(fail)?;
    Ok(signed_out_now(&state))
}

async fn switch_view(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = form(&body);
    signed.check_csrf(&f)?;
    let mode = match f.get("mode").map(String::as_str) {
        Some("live") => Mode::Live,
        Some("sandbox") => Mode::Sandbox,
        _ => {
            return Err(fail(shared::refusal::Refusal::invalid(
                "mode",
                "Choose sandbox or live",
            )));
        }
    };
    // An id that cannot be a project's is refused as an unknown one.
    let project = match f.get("project") {
        Some(raw) => ProjectId::parse(raw).ok_or_else(|| {
            fail(shared::refusal::Refusal::invalid(
                "project",
                "No such project",
            ))
        })?,
        None => signed.session.project_id.clone(),
    };
    dashboard::switch_view(&state, &signed.cookie, &signed.session, &project, mode)
        .await
        .map_err(fail)?;
    Ok(see_other(&local_path(f.get("back"))))
}

/// Points the session at another merchant of the person's: the form
/// names it, the server checks the membership (a forged one is the 403
/// page and the session is unchanged).
async fn switch_merchant(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = form(&body);
    signed.check_csrf(&f)?;
    let not_member = || fail(dashboard::DashboardError::NotMember);
    let merchant = f
        .get("merchant")
        .and_then(|raw| shared::ids::MerchantId::parse(raw))
        .ok_or_else(not_member)?;
    dashboard::switch_merchant(&state, &signed.cookie, &signed.session, &merchant)
        .await
        .map_err(fail)?;
    Ok(see_other("/dashboard"))
}

/// The merchants the person may switch to, "name (role)" (none when only
/// one: the header then shows no switcher).
async fn switchable(state: &AppState, signed: &Signed) -> Result<Vec<(String, String)>, Stop> {
    let merchants = dashboard::switchable_merchants(state, &signed.user.id)
        .await
        .map_err(fail)?;
    Ok(merchants
        .into_iter()
        .map(|(id, name, role)| (id.into_string(), format!("{name} ({})", role.as_str())))
        .collect())
}

/// The header of a signed-in page (reads the merchant's projects and the
/// person's merchants).
pub(crate) async fn nav(
    state: &AppState,
    signed: &Signed,
    current: &'static str,
) -> Result<Nav, Stop> {
    let projects = account::merchant_projects(state, &signed.user.merchant_id)
        .await
        .map_err(fail)?;
    let mut nav = signed.nav(projects, current);
    nav.merchants = switchable(state, signed).await?;
    if signed.session.notice.is_some() {
        dashboard::clear_notice(state, &signed.cookie)
            .await
            .map_err(fail)?;
        nav.alert = signed.session.notice.clone();
    }
    Ok(nav)
}

async fn overview(State(state): State<AppState>, signed: Signed) -> Page {
    let (o, series) = analytics::overview_by_day(&state, &signed.tenant, analytics::DEFAULT_DAYS)
        .await
        .map_err(fail)?;
    let nav = nav(&state, &signed, "overview").await?;
    Ok(html(StatusCode::OK, pages::overview(&nav, &o, &series)))
}

/// Where a page of a record list starts: its newest records, `page`
/// pages down by number (at most [`MAX_JUMP`]), or next to a record the
/// page before showed: `after` it (the Older link) or `before` it (the
/// Newer link), one ranged read whatever the depth, so every record is
/// reachable. `page` is then only the number shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub page: usize,
    pub seek: Seek,
}

impl Place {
    /// `page`, `after` and `before` of a list of `kind` records.
    pub(crate) fn of(
        q: &std::collections::HashMap<String, String>,
        kind: IdKind,
    ) -> Result<Place, Stop> {
        let id = |name: &'static str| match q.get(name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) if shared::ids::is_valid(v, kind) => Ok(Some(v.clone())),
            Some(_) => Err(fail(shared::refusal::Refusal::invalid(
                name,
                "Not a record of this list",
            ))),
        };
        let seek = match (id("after")?, id("before")?) {
            (None, None) => Seek::Start,
            (Some(a), None) => Seek::After(a),
            (None, Some(b)) => Seek::Before(b),
            (Some(_), Some(_)) => {
                return Err(fail(shared::refusal::Refusal::invalid(
                    "before",
                    "A page is after a record or before one, not both",
                )));
            }
        };
        let most = if seek == Seek::Start {
            MAX_JUMP
        } else {
            usize::MAX
        };
        let page = match q.get("page") {
            None => 1,
            Some(raw) => match raw.parse::<usize>() {
                Ok(n) if (1..=most).contains(&n) => n,
                _ => {
                    return Err(fail(shared::refusal::Refusal::invalid(
                        "page",
                        format!(
                            "A page is a number from 1 to {MAX_JUMP}; older ones are \
                             reached by the Older links"
                        ),
                    )));
                }
            },
        };
        Ok(Place { page, seek })
    }

    /// The newest page.
    pub(crate) fn first() -> Place {
        Place {
            page: 1,
            seek: Seek::Start,
        }
    }

    /// The rows this page holds.
    pub(crate) fn window(&self) -> Window {
        match self.seek {
            Seek::Start => page_window(self.page),
            _ => Window {
                offset: 0,
                limit: PAGE,
                seek: self.seek.clone(),
            },
        }
    }
}

/// The page number of a list (`?page=`, from 1), bounded.
pub(crate) fn page_number(q: &std::collections::HashMap<String, String>) -> Result<usize, Stop> {
    match q.get("page") {
        None => Ok(1),
        Some(raw) => match raw.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
            _ => Err(fail(shared::refusal::Refusal::invalid(
                "page",
                format!("A page is a number from 1 to {MAX_PAGE}"),
            ))),
        },
    }
}

async fn payments_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let q = query(&raw);
    let place = Place::of(&q, IdKind::Payment)?;
    let named = |name: &str| q.get(name).map(String::as_str).unwrap_or("");
    let status = match named("status") {
        "" => None,
        s => Some(
            serde_json::from_value::<payments::PaymentStatus>(serde_json::Value::from(s)).map_err(
                |_| {
                    fail(shared::refusal::Refusal::invalid(
                        "status",
                        "No such payment status",
                    ))
                },
            )?,
        ),
    };
    let provider = match named("provider") {
        "" => None,
        p => Some(shared::domain::Provider::parse(p).ok_or_else(|| {
            fail(shared::refusal::Refusal::invalid(
                "provider",
                "No such provider",
            ))
        })?),
    };
    let (list, total) = payments::list_filtered(
        &state,
        &signed.tenant,
        payments::PaymentFilter { status, provider },
        place.window(),
    )
    .await
    .map_err(fail)?;
    let views: Vec<PaymentView> = list.into_iter().map(PaymentView::from).collect();
    let nav = nav(&state, &signed, "payments").await?;
    let (status, provider) = (
        status.map(|s| pages::label(&s)).unwrap_or_default(),
        provider.map(|p| p.as_str()).unwrap_or_default(),
    );
    Ok(html(
        StatusCode::OK,
        pages::payments(&nav, &views, &place, total, &status, provider),
    ))
}

async fn payment_page(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<PaymentId>,
    RawQuery(raw): RawQuery,
) -> Page {
    let id = id.get_or(no_payment)?;
    let q = query(&raw);
    let notice = crate::id_param(&q, "refund", "ref_").map(|r| format!("Refund {r} recorded."));
    payment_view(
        &state,
        &signed,
        &id,
        notice.as_deref(),
        None,
        StatusCode::OK,
    )
    .await
}

/// The 404 page of a payment the path names, also for an id that cannot
/// be one.
fn no_payment(_: &'static str, raw: &str) -> Stop {
    fail(shared::refusal::Refusal::not_found("payment", raw))
}

/// The payment page, with a notice or an error above it.
async fn payment_view(
    state: &AppState,
    signed: &Signed,
    id: &PaymentId,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let payment = payments::find(state, &signed.tenant, id)
        .await
        .map_err(fail)?
        .ok_or_else(|| no_payment("payment", id))?;
    let (refunds, _) = refunds::of_payment(state, &payment.id, Window::first(100))
        .await
        .map_err(fail)?;
    let timeline = timeline(state, signed, &payment.id).await?;
    let nav = nav(state, signed, "payments").await?;
    let attempt = payment.attempt.clone();
    let checks = payment.checks.clone();
    let form = signed
        .allows(Action::ChangeRecords)
        .then(dashboard::new_form_nonce);
    Ok(html(
        status,
        pages::payment(
            &nav,
            &PaymentView::from(payment),
            &attempt,
            &checks,
            &refunds,
            &timeline,
            pages::Notes {
                notice,
                error,
                refund_form: form.as_deref(),
            },
        ),
    ))
}

/// The events a payment page shows at most (oldest first), and the
/// deliveries shown per event.
pub(crate) const TIMELINE: usize = 20;
const TIMELINE_DELIVERIES: usize = 10;

/// Payment `id`'s events, oldest first, each with its deliveries when the
/// role table lets the reader see webhook endpoints. The caller has found
/// the payment in its tenant.
async fn timeline(
    state: &AppState,
    signed: &Signed,
    id: &PaymentId,
) -> Result<Vec<pages::TimelineRow>, Stop> {
    let deliveries = signed
        .allows(Action::Webhooks)
        .then_some(TIMELINE_DELIVERIES);
    let rows = dashboard::payment_timeline(state, id, TIMELINE, deliveries)
        .await
        .map_err(fail)?;
    Ok(rows
        .into_iter()
        .map(|(event, deliveries)| pages::TimelineRow { event, deliveries })
        .collect())
}

/// What a refund form asks for, read from its fields; an error names
/// the field.
fn refund_request(
    payment_id: &PaymentId,
    f: &std::collections::HashMap<String, String>,
) -> Result<CreateRefund, String> {
    let amount = shared::money::parse_rupees(f.get("amount").map(String::as_str).unwrap_or(""))
        .map_err(|e| format!("Amount: {e}"))?;
    let reason = match f.get("reason").map(String::as_str) {
        Some("customer_request") => RefundReason::CustomerRequest,
        Some("duplicate") => RefundReason::Duplicate,
        Some("fraudulent") => RefundReason::Fraudulent,
        Some("other") => RefundReason::Other,
        _ => return Err("Reason: choose one of the reasons".into()),
    };
    let notes = f
        .get("notes")
        .map(|n| n.replace("\r\n", "\n").trim().to_owned())
        .filter(|n| !n.is_empty())
        .map(|n| RefundNotes::parse(n).map_err(|e| format!("Notes: {e}")))
        .transpose()?;
    let mobile_number = f
        .get("mobile")
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .map(|m| NepaliMobile::parse(m).map_err(|e| format!("Mobile number: {e}")))
        .transpose()?;
    Ok(CreateRefund {
        payment_id: payment_id.to_string(),
        amount,
        reason,
        notes,
        mobile_number,
    })
}

/// Issues a refund from the payment's page: the same rule as the API
/// (`refunds::create_via`), Fonepay's full amount recorded for the
/// merchant to refund by hand; the audit entry in the refund's own
/// transaction; a double submit finds the first refund.
async fn refund(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<PaymentId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::ChangeRecords, &body)?;
    let now = state.clock.now();
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, now) else {
        return Err(expired_form());
    };
    // An id that cannot be a payment's is the payment page's 404, as
    // every path below ends for it.
    let id = id.get_or(no_payment)?;
    let req = match refund_request(&id, &f) {
        Ok(r) => r,
        Err(e) => {
            return payment_view(
                &state,
                &signed,
                &id,
                None,
                Some(&e),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let actor = signed.actor();
    let detail = format!(
        "{} ({:?}){}",
        shared::money::Paisa::new(req.amount)
            .map(|p| p.display_npr())
            .unwrap_or_default(),
        req.reason,
        req.notes
            .as_ref()
            .map(|n| format!(": {}", n.as_str()))
            .unwrap_or_default()
    );
    let made = match req.payment() {
        Ok(payment_id) => {
            let request = refunds::RefundRequest {
                tenant: &signed.tenant,
                payment_id,
                body: req,
                channel: refunds::Channel::Dashboard,
                now,
                fence: Some(&fence),
            };
            refunds::create_via(&state, request, |r| {
                let entry = dashboard::audit_entry(&actor, now, "refund.create", &r.id, &detail);
                Ok(vec![dashboard::audit_op(&entry)?])
            })
            .await
        }
        Err(e) => Err(e),
    };
    match made {
        Ok(r) => Ok(see_other(&format!(
            "/dashboard/payments/{id}?refund={}",
            r.id
        ))),
        // The refund may have committed before the failure (a Khalti call
        // after it, say): never "nothing was changed" here. The same form
        // sent again is safe (its fence finds the refund).
        Err(RefundError::Store(e)) => {
            tracing::error!(error = %e, payment = %id, "dashboard refund unconfirmed");
            let status = edge::refusals::status_of(shared::refusal::Refusal::from(e).kind);
            payment_view(
                &state,
                &signed,
                &id,
                None,
                Some(
                    "We could not confirm the refund: it may have been recorded. Look at the \
                     refunds below before you try again.",
                ),
                status,
            )
            .await
        }
        Err(e) => {
            let refusal = shared::refusal::Refusal::from(e);
            let status = edge::refusals::status_of(refusal.kind);
            let message = format!("The refund was not made: {}", refusal.message);
            payment_view(&state, &signed, &id, None, Some(&message), status).await
        }
    }
}

async fn refunds_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    let place = Place::of(&query(&raw), IdKind::Refund)?;
    let (list, total) = refunds::list(&state, &signed.tenant, None, place.window())
        .await
        .map_err(fail)?;
    let nav = nav(&state, &signed, "refunds").await?;
    Ok(html(
        StatusCode::OK,
        pages::refunds(&nav, &list, &place, total),
    ))
}

async fn audit_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    signed.require(Action::Audit)?;
    let q = query(&raw);
    let before = q
        .get("before")
        .filter(|b| b.len() <= 80 && b.bytes().all(|c| c.is_ascii_graphic()));
    let (entries, next) = dashboard::list_audit(
        &state,
        &signed.user.merchant_id,
        before.map(String::as_str),
        dashboard::AUDIT_PAGE,
    )
    .await
    .map_err(fail)?;
    let nav = nav(&state, &signed, "audit").await?;
    Ok(html(
        StatusCode::OK,
        pages::audit(&nav, &entries, next.as_deref()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::refusal::{Kind, Refusal};

    #[test]
    fn a_refused_page_answers_with_the_apis_status_for_its_kind() {
        let kinds = [
            Kind::Invalid,
            Kind::Unauthenticated,
            Kind::AccountClosed,
            Kind::KeyPaused,
            Kind::Forbidden,
            Kind::NotFound,
            Kind::Conflict,
            Kind::Unprocessable,
            Kind::RateLimited,
            Kind::Unavailable,
            Kind::Internal,
        ];
        for kind in kinds {
            let refusal = Refusal::new(kind, "some_code", "Not this way");
            let page = failure(refusal.clone());
            assert_eq!(page.status(), edge::refusals::status_of(kind), "{kind:?}");
            assert_eq!(
                page.status(),
                edge::ApiError::from(refusal).status,
                "{kind:?}"
            );
        }
    }
}
