//! The public pages (no API key): hosted checkout at a session's
//! `checkout_url` and the providers' returns.
//!
//! | Route | What |
//! |---|---|
//! | `GET /c/{id}` | The page for the session's state: the provider picker (and address form), the QR or "confirming" page while an attempt is open, or the paid / failed / expired page. |
//! | `POST /c/{id}/pay` | The customer's choice: starts an attempt and hands the browser to the provider (eSewa: auto-posted signed form; Khalti: redirect to its `payment_url`; Fonepay: our QR page, or its web page). |
//! | `GET|POST /c/{id}/return/{payment}/{ok|fail}` | The provider's return: verified, then checked server to server; on to the merchant's `returnUrl` when paid. |
//! | `GET /c/{id}/status` | JSON for the pages' polling (no personal data): asks the provider at most every 3 s. |
//! | `GET /c/{id}/events` | A Direct-QR or mobile session's server-sent events (`qr.scanned`, `qr.paid`, `qr.failed`, `qr.expired`). |
//! | `GET /c/{id}/qr/{payment}` | The Fonepay QR again (reload-safe). |
//! | `GET /b/{id}` | A billing invoice's pay page: merchant, number, period, amount, due date (AD and BS); paid or void: its state. |
//! | `POST /b/{id}` | "Pay": a checkout of the amount due bound to the invoice (its success pays it), on to `/c/{session}`. |
//! | `GET /r/{token}` | A short pay link (a reminder SMS's): an invoice's is a 303 to its bill page `/b/{id}`; a subscription's shows its trial (plan, amount, the trial's end in AD and BS). Unknown: 404. |
//!
//! Handlers only translate between HTTP and [`shared::domain::attempts`].

pub mod pages;

use std::collections::HashMap;
use std::sync::Mutex;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use edge::PathId;
use edge::html::html;
use edge::ids::{Id, Surface};
use edge::with_edge;
use http::{HeaderValue, StatusCode, header};
use serde_json::json;
use shared::AppState;
use shared::domain::Provider;
use shared::domain::account;
use shared::domain::attempts::{self, AttemptError, PayChoice, ReturnKind};
use shared::domain::billing::calendar;
use shared::domain::billing::invoice::collect;
use shared::domain::billing::{customers, tax};
use shared::domain::checkout::{self, CheckoutSession, Flow, SessionStatus, StoredAddress};
use shared::domain::links;
use shared::domain::payments::{Payment, PaymentStatus};
use shared::domain::short_links::{self, Landing};
use shared::ids::{BillingInvoiceId, LinkId, PaymentId, ProjectId, SessionId};
use shared::limits::public::{self, SessionUse};
use shared::providers::Handoff;
use shared::refusal::Refusal;
use shared::store::StoreError;

/// The public routes, in the shared edge (request id, one log line, no
/// panics), with the pages' security headers.
pub fn router(state: AppState) -> Router {
    if let Some(n) = short_links::too_long_on(&state.config.public_base_url) {
        tracing::warn!(
            base = %state.config.public_base_url,
            length = n,
            max = shared::domain::billing::reminders::MAX_PAY_URL_CHARS,
            "short pay links on this public base URL are too long for a two-segment SMS reminder; serve the pages on a shorter host"
        );
    }
    with_edge(
        Router::new()
            .route("/c/{id}", get(show))
            .route("/c/{id}/pay", axum::routing::post(pay))
            .route("/c/{id}/status", get(status))
            .route("/c/{id}/events", get(events))
            .route(
                "/c/{id}/return/{payment}/{outcome}",
                get(returned_get).post(returned_post),
            )
            .route("/c/{id}/qr/{payment}", get(qr))
            .route("/l/{id}", get(link_page).post(link_open))
            .route("/l/{id}/thanks", get(link_thanks))
            .route("/b/{id}", get(bill_page).post(bill_pay))
            .route("/r/{token}", get(short_page))
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                throttle,
            ))
            // Never on the dashboard's own host, when it has one.
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                edge::html::public_site,
            ))
            .route_layer(axum::middleware::from_fn(secure))
            .layer(axum::extract::DefaultBodyLimit::max(BODY_MAX))
            .layer(axum::Extension(StreamFor(STREAM_FOR)))
            .with_state(state),
    )
}

/// Only the event streams (`GET /c/{id}/events`), each lasting up to
/// `stream_for`, with the public limits and headers of every page: the
/// events function, which streams its answer through a Lambda function
/// URL instead of API Gateway.
///
/// With the edge stack's origin secret configured, only requests carrying
/// it (from the distribution) are served; the function URL itself is
/// public, and a stream holds one of the few reserved instances.
pub fn events_router(state: AppState, stream_for: std::time::Duration) -> Router {
    with_edge(
        Router::new()
            .route("/c/{id}/events", get(events))
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                throttle,
            ))
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                from_the_edge,
            ))
            .route_layer(axum::middleware::from_fn(secure))
            .layer(axum::extract::DefaultBodyLimit::max(BODY_MAX))
            .layer(axum::Extension(StreamFor(stream_for)))
            .with_state(state),
    )
}

/// Behind the edge stack ([`AppState::origin_secret`] set), refuses with
/// 403 a request that did not come through the distribution, before any
/// counter or store read; without it, lets every request through.
async fn from_the_edge(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let secret = state.origin_secret();
    if secret.is_some() && !edge::requests::carries_origin_secret(secret, req.headers()) {
        // As the stream's other refusals: not an API route, no error code.
        return (
            StatusCode::FORBIDDEN,
            edge::Json(json!({
                "error": "event streams are served through the gateway's own domain"
            })),
        )
            .into_response();
    }
    next.run(req).await
}

/// How long the event streams of a router last.
#[derive(Clone, Copy, Debug)]
struct StreamFor(std::time::Duration);

/// The public routes' limits ([`shared::limits::public`]), before any
/// other work: over one, 429 with `Retry-After`, a page for a browser
/// (it asks for `text/html`), the `rate_limited` envelope otherwise.
async fn throttle(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let address = edge::requests::client_address(&state, &req);
    let post = req.method() == http::Method::POST;
    let mut parts = req.uri().path().trim_start_matches('/').split('/');
    let (kind, raw_id, rest) = (parts.next(), parts.next(), parts.next());
    // The id as the route hands it to the handler (percent-decoded), so an
    // encoded id cannot slip past its counters; it names a counter only
    // when it could be one of ours (the handler answers 404 otherwise).
    let decoded: Option<String> = raw_id.map(|raw| {
        percent_encoding::percent_decode_str(raw)
            .decode_utf8_lossy()
            .into_owned()
    });
    let id = decoded.as_deref().filter(|id| {
        (4..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    let session = kind == Some("c");
    // A bill page's "Pay" opens a session as a link's does: counted per
    // invoice as per link.
    let link = id.filter(|_| matches!(kind, Some("l" | "b")));
    // A provider's return and the pages' status poll count in the
    // address's generous poll budget: customers behind one carrier NAT
    // share an address, and a customer coming back from paying must get
    // through. A session's own budget is taken by the handler once the
    // session is found, so a made-up id costs no counter.
    let poll = session && matches!(rest, Some("return" | "status"));
    let request = public::PublicRequest {
        address: address.as_str(),
        poll,
        // Starts an attempt or opens a session.
        write: post && !poll,
        link,
        opens_session: post && link.is_some() && rest.is_none(),
        opens_stream: session && rest == Some("events"),
    };
    match state.take_public(&request).await {
        Ok(()) => next.run(req).await,
        Err(limited) => {
            tracing::warn!(
                limit = limited.limit,
                retry_after = limited.retry_after,
                "public route limited"
            );
            too_many(req.headers(), &limited)
        }
    }
}

/// Takes one request of the open session's budget for `by`; over it, the
/// 429 its caller gets. A final session costs nothing more to show than
/// a read (no attempt, no provider check), so its pages are bounded per
/// address only: a customer who paid sees it, whoever spent the budget.
async fn session_budget(
    state: &AppState,
    session: &CheckoutSession,
    by: SessionUse,
    headers: &http::HeaderMap,
) -> Result<(), Response> {
    if session.status_at(state.clock.now()).is_final() {
        return Ok(());
    }
    state
        .take_session(&session.id, by)
        .await
        .map_err(|limited| {
            tracing::warn!(
                limit = limited.limit,
                retry_after = limited.retry_after,
                "session limited"
            );
            too_many(headers, &limited)
        })
}

fn too_many(headers: &http::HeaderMap, limited: &public::Limited) -> Response {
    let secs = limited.retry_after;
    let wait = if secs >= 120 {
        format!("{} minutes", (secs + 59) / 60)
    } else if secs == 1 {
        "a second".to_owned()
    } else {
        format!("{secs} seconds")
    };
    let browser = wants_html(headers);
    let mut res = if browser {
        html(
            StatusCode::TOO_MANY_REQUESTS,
            pages::plain(
                "Too many requests",
                &format!(
                    "This page was asked for too often from your connection. \
                     Please wait {wait} and try again."
                ),
            ),
        )
    } else {
        edge::error::ApiError::public_limited(limited).into_response()
    };
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

/// The most a hosted route reads of a body: a link's form, the picker's,
/// a provider's posted return (whose parameters are bounded at 16 KB) are
/// a few fields. A larger body is 413 before anything is read or stored.
const BODY_MAX: usize = 16 * 1024;

/// Pages answer in their own shapes (HTML), never framed, never cached.
/// An error the router or an extractor made (a method the route does not
/// take, a body over [`BODY_MAX`]) is put in the caller's words first: a
/// short page for a browser, the error envelope for a script.
async fn secure(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let browser = wants_html(req.headers());
    let res = next.run(req).await;
    let ours = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/html") || ct.starts_with("application/json"));
    let res = match res.status().is_client_error() && !ours {
        true => explained(&res, browser),
        false => res,
    };
    edge::html::page_answer(res, pages::csp())
}

/// Whether the caller is a browser (it asks for HTML).
fn wants_html(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

/// A router's or extractor's bare 4xx, as a page or the envelope; its
/// `Allow` kept.
fn explained(res: &Response, browser: bool) -> Response {
    let status = res.status();
    let mut answer = match (browser, status) {
        (true, StatusCode::METHOD_NOT_ALLOWED) => html(
            status,
            pages::plain(
                "Not available",
                "This page cannot be used that way. Please go back to the shop.",
            ),
        ),
        (true, StatusCode::PAYLOAD_TOO_LARGE) => html(
            status,
            pages::plain(
                "Too much sent",
                "The form sent was too large. Please go back and try again.",
            ),
        ),
        (true, _) => unreadable_form_as(status),
        (false, StatusCode::PAYLOAD_TOO_LARGE) => {
            edge::ApiError::payload_too_large(BODY_MAX).into_response()
        }
        (false, _) => edge::error::ApiError::for_status(status).into_response(),
    };
    if let Some(allow) = res.headers().get(header::ALLOW) {
        answer.headers_mut().insert(header::ALLOW, allow.clone());
    }
    answer
}

/// A form that is not what a browser sends (not UTF-8): refused, nothing
/// read or stored.
fn unreadable_form() -> Response {
    unreadable_form_as(StatusCode::BAD_REQUEST)
}

fn unreadable_form_as(status: StatusCode) -> Response {
    html(
        status,
        pages::plain(
            "Something went wrong",
            "The form sent could not be read. Please go back and try again.",
        ),
    )
}

fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(v) => {
            let mut res = StatusCode::SEE_OTHER.into_response();
            res.headers_mut().insert(header::LOCATION, v);
            res
        }
        Err(_) => html(
            StatusCode::BAD_GATEWAY,
            pages::plain(
                "Something went wrong",
                "The next page's address is not valid.",
            ),
        ),
    }
}

/// The hosted pages: an id that cannot exist is answered with the
/// checkout's not-found page, as a missing one is.
struct Hosted;

impl Surface for Hosted {
    type Rejection = Response;

    fn not_found(_noun: &'static str, _raw: &str) -> Response {
        not_found()
    }
}

/// The payment link pages: an id that cannot exist is answered with the
/// link's not-found page, as a missing one is.
struct LinkPages;

impl Surface for LinkPages {
    type Rejection = Response;

    fn not_found(_noun: &'static str, _raw: &str) -> Response {
        link_not_found()
    }
}

fn not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::plain(
            "Checkout not found",
            "This payment link is not valid. Please return to the shop and try again.",
        ),
    )
}

/// A store failure on a hosted page: nothing was charged; the status is
/// the API's for the same failure (503 when the store was busy, else 500).
fn trouble(e: &StoreError) -> Response {
    tracing::error!(error = %e, "store error on a hosted page");
    html(
        edge::refusals::status_of(Refusal::from(e.clone()).kind),
        pages::plain(
            "Please try again",
            "We could not load this checkout just now. Nothing was charged. Please reload in a moment.",
        ),
    )
}

/// `url` with `params` added to its query (before any fragment).
pub fn with_params(url: &str, params: &[(&str, &str)]) -> String {
    let (base, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        query.append_pair(k, v);
    }
    let sep = if base.contains('?') {
        if base.ends_with('?') || base.ends_with('&') {
            ""
        } else {
            "&"
        }
    } else {
        "?"
    };
    let mut out = format!("{base}{sep}{}", query.finish());
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Where the customer came from, in words.
fn back_to(flow: Flow) -> &'static str {
    match flow {
        Flow::Hosted | Flow::Redirect => "the shop",
        Flow::Mobile => "the app",
        Flow::Qr => "the counter",
    }
}

/// Where a paid customer goes: the merchant's `returnUrl` with the session
/// id and status (a hint only: merchants confirm through the API).
fn merchant_return(s: &CheckoutSession) -> String {
    with_params(
        &s.return_url,
        &[("session_id", &s.id), ("status", s.status.as_str())],
    )
}

/// Where a customer who cancelled at the provider goes from a redirect
/// checkout: `cancelUrl` as given, else `returnUrl` with the session id and
/// `status=cancelled`.
fn merchant_cancel(s: &CheckoutSession) -> String {
    match &s.cancel_url {
        Some(url) => url.clone(),
        None => with_params(
            &s.return_url,
            &[("session_id", &s.id), ("status", "cancelled")],
        ),
    }
}

fn query_has(query: &Option<String>, name: &str, value: &str) -> bool {
    query
        .as_deref()
        .is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == name && v == value))
}

async fn show(
    State(state): State<AppState>,
    Id(id, ..): Id<SessionId, Hosted>,
    RawQuery(query): RawQuery,
    headers: http::HeaderMap,
) -> Response {
    let now = state.clock.now();
    let session = match checkout::find_any(&state, &id, now).await {
        Ok(Some(s)) => s,
        Ok(None) => return not_found(),
        Err(e) => return trouble(&e),
    };
    if let Err(limited) = session_budget(&state, &session, SessionUse::Page, &headers).await {
        return limited;
    }
    let notice = query_has(&query, "notice", "cancelled")
        .then_some("Payment cancelled. You can choose another way to pay.");
    match render(
        &state,
        &session,
        notice,
        None,
        None,
        query_has(&query, "choose", "1"),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => trouble(&e),
    }
}

/// The page for the session as it stands.
async fn render(
    state: &AppState,
    s: &CheckoutSession,
    notice: Option<&str>,
    error: Option<(StatusCode, &str)>,
    address: Option<&StoredAddress>,
    choose: bool,
) -> Result<Response, StoreError> {
    let (merchant, active) = merchant_of(state, &s.project_id).await?;
    let place = back_to(s.flow);
    // A counter's QR and an app have no shop page: our page is the end.
    let shop = s.flow.has_shop().then(|| merchant_return(s));
    let back_to_shop = s
        .flow
        .has_shop()
        .then(|| s.cancel_url.as_deref().unwrap_or(&s.return_url));
    let label = format!("Return to {place}");
    let page = match s.status {
        SessionStatus::Success => pages::final_page(
            s,
            &merchant,
            "Payment received",
            &format!(
                "Thank you: your payment is confirmed.{}",
                if shop.is_none() {
                    format!(" You can return to {place}.")
                } else {
                    String::new()
                }
            ),
            shop.as_deref().map(|href| (href, label.as_str())),
        ),
        SessionStatus::Failed => pages::final_page(
            s,
            &merchant,
            "Payment failed",
            &format!(
                "The payment did not go through and nothing was charged. Please return to {place} to try again."
            ),
            back_to_shop.map(|href| (href, label.as_str())),
        ),
        SessionStatus::Expired => pages::final_page(
            s,
            &merchant,
            "This checkout has expired",
            &format!("Checkouts are open for 30 minutes. Please return to {place} to start again."),
            back_to_shop.map(|href| (href, label.as_str())),
        ),
        SessionStatus::Pending | SessionStatus::Initiated => {
            let current = match (&s.payment_id, s.status) {
                (Some(pid), SessionStatus::Initiated) => {
                    let (sid, pid) = (s.id.clone(), pid.clone());
                    attempts::find_payment(state, &sid, &pid).await?
                }
                _ => None,
            };
            match current {
                Some(p)
                    if !choose
                        && matches!(
                            p.status,
                            PaymentStatus::Pending | PaymentStatus::Processing
                        ) =>
                {
                    if p.attempt.qr && p.attempt.qr_message.is_some() {
                        return Ok(see_other(&format!("/c/{}/qr/{}", s.id, p.id)));
                    }
                    pages::confirming(s, &merchant, p.provider)
                }
                // A counter's or an app's session is paid there: its
                // page only tells where (its id is public).
                _ if !s.flow.has_shop() => pages::final_page(
                    s,
                    &merchant,
                    "Waiting for your payment",
                    &format!("Please pay from {place}; this page does not take payments."),
                    None,
                ),
                _ => {
                    let offered = if active {
                        checkout::offered(state, s).await?
                    } else {
                        Vec::new()
                    };
                    let mut page =
                        pages::picker(s, &merchant, &offered, notice, error.map(|e| e.1), address);
                    if s.flow == Flow::Redirect
                        && error.is_none()
                        && notice.is_none()
                        && offered.len() == 1
                    {
                        // Straight to the provider: the page posts itself.
                        page = page.replace(
                            "</body>",
                            &format!("<script>{}</script></body>", pages::PAY_NOW),
                        );
                    }
                    page
                }
            }
        }
    };
    let status = error.map(|e| e.0).unwrap_or(StatusCode::OK);
    Ok(html(status, page))
}

/// The picker's form fields.
fn parse_choice(body: &[u8]) -> PayChoice {
    let mut choice = PayChoice::default();
    let mut address = StoredAddress::default();
    let mut any_address = false;
    for (k, v) in form_urlencoded::parse(body) {
        let v = v.trim().to_owned();
        let slot = match k.as_ref() {
            "provider" => {
                choice.provider = match v.as_str() {
                    "esewa" => Some(Provider::Esewa),
                    "khalti" => Some(Provider::Khalti),
                    "fonepay" => Some(Provider::Fonepay),
                    _ => None,
                };
                continue;
            }
            "fonepay" => {
                choice.fonepay_web = v == "web";
                continue;
            }
            "line1" => &mut address.line1,
            "line2" => &mut address.line2,
            "city" => &mut address.city,
            "state" => &mut address.state,
            "postalCode" => &mut address.postal_code,
            "country" => &mut address.country,
            _ => continue,
        };
        any_address = true;
        *slot = Some(v);
    }
    if any_address {
        choice.address = Some(address);
    }
    choice
}

async fn pay(
    State(state): State<AppState>,
    Id(id, ..): Id<SessionId, Hosted>,
    headers: http::HeaderMap,
    body: Bytes,
) -> Response {
    if std::str::from_utf8(&body).is_err() {
        return unreadable_form();
    }
    let now = state.clock.now();
    let choice = PayChoice {
        from_page: true,
        ..parse_choice(&body)
    };
    let address = choice.address.clone();
    match checkout::find_any(&state, &id, now).await {
        Ok(Some(session)) => {
            if let Err(limited) = session_budget(&state, &session, SessionUse::Page, &headers).await
            {
                return limited;
            }
        }
        Ok(None) => return not_found(),
        Err(e) => return trouble(&e),
    }
    let base = edge::requests::public_base(&state, &headers);
    let started = attempts::start(&state, &id, choice, &base, now).await;
    let (status, message) = match started {
        Ok(s) => {
            let (merchant, _) = match merchant_of(&state, &s.session.project_id).await {
                Ok(x) => x,
                Err(e) => return trouble(&e),
            };
            return match s.handoff {
                Handoff::AutoPostForm { action, fields } => html(
                    StatusCode::OK,
                    pages::auto_post(&merchant, !s.session.mode.is_live(), &action, &fields),
                ),
                Handoff::Redirect { url, .. } => see_other(&url),
                Handoff::Qr { .. } => {
                    see_other(&format!("/c/{}/qr/{}", s.session.id, s.payment.id))
                }
            };
        }
        Err(AttemptError::NotFound) => return not_found(),
        Err(AttemptError::Closed(_)) => return see_other(&format!("/c/{id}")),
        Err(AttemptError::Store(e)) => return trouble(&e),
        Err(e) => picker_note(e),
    };
    let session = match checkout::find_any(&state, &id, now).await {
        Ok(Some(s)) => s,
        Ok(None) => return not_found(),
        Err(e) => return trouble(&e),
    };
    match render(
        &state,
        &session,
        None,
        Some((status, &message)),
        address.as_ref(),
        true,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => trouble(&e),
    }
}

/// The picker's note on an attempt it did not start: words for the
/// customer, and the status the API answers the same refusal with.
fn picker_note(e: AttemptError) -> (StatusCode, String) {
    let words = match &e {
        AttemptError::Provider(p) => format!(
            "The payment provider did not answer ({}). Nothing was charged: try again or choose another way to pay.",
            if p.is_retryable() {
                "temporarily unavailable"
            } else {
                "request refused"
            }
        ),
        other => other.to_string(),
    };
    (edge::refusals::status_of(Refusal::from(e).kind), words)
}

/// How long one event stream lasts on the hosted routes; the client
/// reconnects (`retry`) with `Last-Event-ID`. Under the function's 15 s
/// timeout and API Gateway's 30 s, which also buffers a Lambda's answer:
/// there a stream's events arrive when it ends (at once after a final
/// event). The events function streams for longer (`functions/events`).
pub const STREAM_FOR: std::time::Duration = std::time::Duration::from_secs(12);
/// Streams open at once in this process; past it, 503 with `Retry-After`.
pub const MAX_STREAMS: usize = 256;
/// Streams one client address may hold open on one session (a screen
/// needs one; a reconnect may overlap the old one): past it, 429. So no
/// address takes the process's streams with one session id.
pub const MAX_STREAMS_PER_WATCHER: usize = 4;

/// One client address's open streams on one session, given back on drop.
struct WatcherSlot(String);

impl WatcherSlot {
    fn open() -> &'static Mutex<HashMap<String, usize>> {
        static OPEN: std::sync::OnceLock<Mutex<HashMap<String, usize>>> =
            std::sync::OnceLock::new();
        OPEN.get_or_init(|| Mutex::new(HashMap::new()))
    }

    fn take(address: &str, session: &str) -> Option<WatcherSlot> {
        let key = format!("{address}|{session}");
        let mut open = match Self::open().lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        let n = open.entry(key.clone()).or_insert(0);
        if *n >= MAX_STREAMS_PER_WATCHER {
            return None;
        }
        *n += 1;
        Some(WatcherSlot(key))
    }
}

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        let mut open = match Self::open().lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(n) = open.get_mut(&self.0) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.0);
            }
        }
    }
}
const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(500);

fn streams() -> &'static std::sync::Arc<tokio::sync::Semaphore> {
    static STREAMS: std::sync::OnceLock<std::sync::Arc<tokio::sync::Semaphore>> =
        std::sync::OnceLock::new();
    STREAMS.get_or_init(|| std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)))
}

/// One open event stream: what it has sent, what it will send next, and
/// its place among [`MAX_STREAMS`].
struct Feed {
    state: AppState,
    id: SessionId,
    sent: std::collections::HashSet<String>,
    queue: std::collections::VecDeque<axum::response::sse::Event>,
    started: tokio::time::Instant,
    stream_for: std::time::Duration,
    first: bool,
    done: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _watcher: WatcherSlot,
    _lease: StreamLease,
    _scans: Option<Listener>,
}

/// The stream's slot among its project's (`domain::streams`),
/// given back when the stream ends. `None` when the limiter's store
/// failed: the stream goes on (the limits protect, they never block a
/// customer because the limiter is down), bounded by the process's
/// [`MAX_STREAMS`] and the function's concurrency.
struct StreamLease(Option<(AppState, shared::domain::streams::Held)>);

impl StreamLease {
    /// A slot of `session`'s project for a stream of `lasting`, or the
    /// answer refusing the stream: the screen polls `status` instead.
    async fn take(
        state: &AppState,
        session: &CheckoutSession,
        lasting: std::time::Duration,
    ) -> Result<StreamLease, Response> {
        let tenant = shared::domain::Tenant::new(session.project_id.clone(), session.mode);
        let lasting = chrono::Duration::from_std(lasting).unwrap_or(chrono::Duration::MAX);
        let cap = state.public_limits().project_streams();
        match shared::domain::streams::take(state, &tenant, cap, lasting).await {
            Ok(Some(held)) => Ok(StreamLease(Some((state.clone(), held)))),
            Ok(None) => {
                tracing::warn!(project = %tenant.project, "event stream refused: project at its cap");
                Err((
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, "30")],
                    edge::Json(json!({
                        "error": "this merchant's screens hold every event stream they may; poll status_url instead",
                        "status_url": format!("/c/{}/status", session.id),
                    })),
                )
                    .into_response())
            }
            Err(e) => {
                tracing::warn!(error = %e, "stream slots unavailable; stream let through");
                Ok(StreamLease(None))
            }
        }
    }
}

impl Drop for StreamLease {
    fn drop(&mut self) {
        let Some((state, held)) = self.0.take() else {
            return;
        };
        // Not given back (no runtime, or the instance freezes first): the
        // slot is free at its lease's end.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = shared::domain::streams::give_back(&state, &held).await {
                    tracing::warn!(error = %e, "stream slot not given back; it expires");
                }
            });
        }
    }
}

/// Whether `seen` (a screen's `Last-Event-ID`) is the last event of
/// `session`'s stream as it is now: the screen needs no stream.
async fn saw_the_end(
    state: &AppState,
    session: &CheckoutSession,
    seen: &str,
    now: shared::time::Timestamp,
) -> bool {
    let payment = match &session.payment_id {
        Some(p) => attempts::find_payment(state, &session.id, p)
            .await
            .ok()
            .flatten(),
        None => None,
    };
    shared::domain::qr::stream_events(session, payment.as_ref(), now)
        .iter()
        .any(|e| e.last && e.tag == seen)
}

/// A task listening on Fonepay's websocket for one stream, stopped with it.
struct Listener(tokio::task::JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens on the session's open Fonepay QR's websocket while the stream
/// lasts: records a scan (`qr.scanned`; a hint, never proof) and the
/// commission Fonepay states with the payment's result (its fee; the
/// result itself is only a hint: the status API decides). `None` when
/// there is no open QR with a websocket, or its fee is already known.
async fn scan_listener(
    state: &AppState,
    session: &CheckoutSession,
    lasting: std::time::Duration,
) -> Option<Listener> {
    if session.status != SessionStatus::Initiated {
        return None;
    }
    let pid = session.payment_id.clone()?;
    let sid = session.id.clone();
    let payment = attempts::find_payment(state, &sid, &pid).await.ok()??;
    if payment.status != PaymentStatus::Pending || payment.checks.fee_provider.is_some() {
        return None;
    }
    let mut scanned = payment.scanned_at.is_some();
    let provider = payment.provider;
    let url = payment.attempt.websocket_url?;
    let state = state.clone();
    Some(Listener(tokio::spawn(async move {
        use shared::providers::fonepay_ws::{Hint, Hints};
        let deadline = tokio::time::Instant::now() + lasting;
        let Some(mut hints) = Hints::connect(&url, std::time::Duration::from_secs(5)).await else {
            return;
        };
        while let Some(hint) = hints.next(deadline).await {
            match hint {
                Hint::Scanned if !scanned => {
                    let now = state.clock.now();
                    match shared::domain::qr::record_scan(&state, &pid, now).await {
                        Ok(_) => scanned = true,
                        Err(e) => tracing::warn!(error = %e, "scan not recorded"),
                    }
                }
                Hint::Scanned => {}
                Hint::Result { commission, .. } => {
                    if let Some(fee) = commission {
                        let recorded = shared::domain::payments::record_provider_fee(
                            &state, &pid, provider, fee,
                        )
                        .await;
                        if let Err(e) = recorded {
                            tracing::warn!(error = %e, "fonepay commission not recorded");
                        }
                    }
                    return;
                }
            }
        }
    })))
}

/// `GET /c/{id}/events`: a Direct-QR or mobile session's server-sent events for the
/// customer's screen (`qr.scanned`, `qr.paid`, `qr.failed`, `qr.expired`), public like
/// the session's page: the session id is the capability. Each poll runs
/// the same bounded server-to-server check as the QR page's.
async fn events(
    State(state): State<AppState>,
    axum::Extension(StreamFor(stream_for)): axum::Extension<StreamFor>,
    id: PathId<SessionId>,
    req: axum::extract::Request,
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let address = edge::requests::client_address(&state, &req);
    let headers = req.headers();
    let now = state.clock.now();
    let last_seen: Option<String> = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(200).collect());
    let session = match session_of(&state, id, now).await {
        Ok(Some(s)) if matches!(s.flow, Flow::Qr | Flow::Mobile) => {
            // The screen saw the last event: 204 tells an EventSource to
            // stop reconnecting.
            if let Some(seen) = &last_seen
                && saw_the_end(&state, &s, seen, now).await
            {
                return StatusCode::NO_CONTENT.into_response();
            }
            s
        }
        Ok(_) => {
            return (
                StatusCode::NOT_FOUND,
                edge::Json(json!({"error": "no such Direct-QR or mobile session"})),
            )
                .into_response();
        }
        Err(e) => {
            tracing::warn!(error = %e, "event stream: session read failed");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "2")],
                edge::Json(json!({"error": "try again"})),
            )
                .into_response();
        }
    };
    if let Err(limited) = session_budget(&state, &session, SessionUse::Stream, headers).await {
        return limited;
    }
    let Some(watcher) = WatcherSlot::take(&address, &session.id) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "2")],
            edge::Json(json!({"error": "too many open streams on this session from here"})),
        )
            .into_response();
    };
    let lease = match StreamLease::take(&state, &session, stream_for).await {
        Ok(lease) => lease,
        Err(refused) => return refused,
    };
    let Ok(permit) = streams().clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            edge::Json(json!({"error": "too many open streams; retry"})),
        )
            .into_response();
    };
    let scans = scan_listener(&state, &session, stream_for).await;
    let sent: std::collections::HashSet<String> = last_seen.into_iter().collect();
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(Event::default().comment("connected").retry(STREAM_POLL));
    let feed = Feed {
        id: session.id.clone(),
        state,
        sent,
        queue,
        started: tokio::time::Instant::now(),
        stream_for,
        first: true,
        done: false,
        _permit: permit,
        _watcher: watcher,
        _lease: lease,
        _scans: scans,
    };
    let stream = futures::stream::unfold(feed, |mut f| async move {
        loop {
            if let Some(e) = f.queue.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(e), f));
            }
            if f.done || f.started.elapsed() >= f.stream_for {
                return None;
            }
            if !f.first {
                tokio::time::sleep(STREAM_POLL).await;
            }
            f.first = false;
            let now = f.state.clock.now();
            let every = chrono::Duration::seconds(1);
            let (session, payment) =
                match attempts::poll_qr_every(&f.state, &f.id, now, every).await {
                    Ok(Some(x)) => x,
                    Ok(None) => return None,
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream poll failed; retrying");
                        continue;
                    }
                };
            for ev in shared::domain::qr::stream_events(&session, payment.as_ref(), now) {
                if !f.sent.insert(ev.tag.clone()) {
                    continue;
                }
                f.done |= ev.last;
                f.queue.push_back(
                    Event::default()
                        .id(ev.tag)
                        .event(ev.kind)
                        .data(ev.data.to_string()),
                );
            }
        }
    });
    let mut res = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response();
    // Not a page: the hosted pages' headers (`secure`) still apply.
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn status(
    State(state): State<AppState>,
    id: PathId<SessionId>,
    headers: http::HeaderMap,
) -> Response {
    let now = state.clock.now();
    // An id that cannot exist: as a missing session.
    let found = match id.get_or(|_, _| ()) {
        Ok(id) => checkout::find_any(&state, &id, now).await,
        Err(()) => Ok(None),
    };
    let polled = match found {
        Ok(Some(session)) => {
            if let Err(limited) = session_budget(&state, &session, SessionUse::Page, &headers).await
            {
                return limited;
            }
            attempts::poll_of(&state, session, now).await.map(Some)
        }
        Ok(None) => Ok(None),
        Err(e) => Err(AttemptError::Store(e)),
    };
    let (session, payment) = match polled {
        Ok(Some(x)) => x,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                edge::Json(json!({"error": "no such checkout session"})),
            )
                .into_response();
        }
        Err(e) => {
            tracing::warn!(error = %e, "status poll failed");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                edge::Json(json!({"error": "try again"})),
            )
                .into_response();
        }
    };
    let (next, message) = match session.status {
        SessionStatus::Success if session.flow.has_shop() => {
            (Some(merchant_return(&session)), "Payment confirmed.")
        }
        SessionStatus::Success => (Some(format!("/c/{}", session.id)), "Payment confirmed."),
        SessionStatus::Failed | SessionStatus::Expired => (Some(format!("/c/{}", session.id)), ""),
        SessionStatus::Pending => match &payment {
            Some(p) if p.status == PaymentStatus::Cancelled => {
                (Some(format!("/c/{}?notice=cancelled", session.id)), "")
            }
            _ => (Some(format!("/c/{}", session.id)), ""),
        },
        SessionStatus::Initiated => match &payment {
            Some(p) if p.status == PaymentStatus::Processing => {
                (None, "The provider is still processing your payment…")
            }
            _ => (None, "Waiting for your payment…"),
        },
    };
    edge::Json(json!({
        "status": session.status.as_str(),
        "paymentStatus": payment.as_ref().map(|p| p.status),
        "message": message,
        "next": next,
    }))
    .into_response()
}

async fn returned_get(
    State(state): State<AppState>,
    path: PathId<(SessionId, PaymentId, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    returned(state, path, query.unwrap_or_default()).await
}

/// A provider that posts its return (form-encoded): the body's parameters
/// join the query's.
async fn returned_post(
    State(state): State<AppState>,
    path: PathId<(SessionId, PaymentId, String)>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let mut params = query.unwrap_or_default();
    if let Ok(text) = std::str::from_utf8(&body) {
        if !text.is_empty() {
            if !params.is_empty() {
                params.push('&');
            }
            params.push_str(text);
        }
    }
    returned(state, path, params).await
}

async fn returned(
    state: AppState,
    path: PathId<(SessionId, PaymentId, String)>,
    params: String,
) -> Response {
    // Ids that cannot exist: as for a payment of no such session.
    let Ok((id, payment_id, outcome)) = path.get_or(|_, _| ()) else {
        return not_found();
    };
    let kind = match outcome.as_str() {
        "ok" => ReturnKind::Ok,
        "fail" => ReturnKind::Fail,
        _ => return not_found(),
    };
    if params.len() > 16 * 1024 {
        return html(
            StatusCode::BAD_REQUEST,
            pages::plain("Something went wrong", "The provider's answer is too long."),
        );
    }
    let now = state.clock.now();
    match attempts::on_return(&state, &id, &payment_id, kind, &params, now).await {
        Ok((session, payment)) => after_return(&session, &payment),
        Err(AttemptError::NotFound) => not_found(),
        Err(AttemptError::Store(e)) => trouble(&e),
        Err(e) => {
            tracing::warn!(error = %e, "provider return not handled");
            see_other(&format!("/c/{id}"))
        }
    }
}

/// Where the customer goes once the return is handled.
fn after_return(session: &CheckoutSession, payment: &Payment) -> Response {
    match payment.status {
        PaymentStatus::Success | PaymentStatus::Refunded => {
            if session.status == SessionStatus::Success && session.flow.has_shop() {
                see_other(&merchant_return(session))
            } else {
                see_other(&format!("/c/{}", session.id))
            }
        }
        // A redirect checkout has no picker to come back to: the shop's
        // cancelUrl, or its returnUrl saying the payment was cancelled.
        PaymentStatus::Cancelled
            if session.status == SessionStatus::Pending && session.flow == Flow::Redirect =>
        {
            see_other(&merchant_cancel(session))
        }
        PaymentStatus::Cancelled if session.status == SessionStatus::Pending => {
            see_other(&format!("/c/{}?notice=cancelled", session.id))
        }
        _ => see_other(&format!("/c/{}", session.id)),
    }
}

/// The shop's name and whether it may take payments.
async fn merchant_of(
    state: &AppState,
    project_id: &ProjectId,
) -> Result<(String, bool), StoreError> {
    account::storefront(state, project_id).await
}

async fn link_page(State(state): State<AppState>, Id(id, ..): Id<LinkId, LinkPages>) -> Response {
    let now = state.clock.now();
    let link = match links::get(&state, &id).await {
        Ok(Some(l)) => l,
        Ok(None) => return link_not_found(),
        Err(e) => return trouble(&e),
    };
    if let Err(e) = links::count_view(&state, &link.id).await {
        tracing::warn!(error = %e, "link view not counted");
    }
    let (merchant, active) = match merchant_of(&state, &link.project_id).await {
        Ok(x) => x,
        Err(e) => return trouble(&e),
    };
    let sandbox = !link.mode.is_live();
    if link.unusable(now).is_some() || !active {
        return html(
            StatusCode::OK,
            pages::link_unavailable(&merchant, sandbox, &links::inactive_text(&link)),
        );
    }
    // Every use held by customers at a provider: not the link's own
    // message (it is not used up), but when to come back.
    if let Some(minutes) = link.held(now) {
        return held_page(&merchant, sandbox, minutes);
    }
    html(
        StatusCode::OK,
        pages::link_page(&link, &merchant, None, None),
    )
}

async fn link_open(
    State(state): State<AppState>,
    Id(id, ..): Id<LinkId, LinkPages>,
    headers: http::HeaderMap,
    body: Bytes,
) -> Response {
    if std::str::from_utf8(&body).is_err() {
        return unreadable_form();
    }
    let now = state.clock.now();
    let mut customer = links::LinkCustomer::default();
    for (k, v) in form_urlencoded::parse(&body) {
        let v = Some(v.trim().to_owned()).filter(|v| !v.is_empty());
        match k.as_ref() {
            "amount" => customer.amount = v,
            "name" => customer.name = v,
            "email" => customer.email = v,
            "phone" => customer.phone = v,
            _ => {}
        }
    }
    let typed = customer.amount.clone();
    // A suspended shop's link opens nothing (its page says so too).
    if let Ok(Some(link)) = links::get(&state, &id).await {
        match merchant_of(&state, &link.project_id).await {
            Ok((merchant, false)) => {
                return html(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    pages::link_unavailable(
                        &merchant,
                        !link.mode.is_live(),
                        &links::inactive_text(&link),
                    ),
                );
            }
            Ok(_) => {}
            Err(e) => return trouble(&e),
        }
    }
    let base = edge::requests::public_base(&state, &headers);
    match links::open_session(&state, &id, customer, &base, now).await {
        Ok(session) => see_other(&format!("/c/{}", session.id)),
        Err(links::OpenError::NotFound) => link_not_found(),
        Err(links::OpenError::Store(e)) => trouble(&e),
        Err(e) => {
            let link = match links::get(&state, &id).await {
                Ok(Some(l)) => l,
                Ok(None) => return link_not_found(),
                Err(e) => return trouble(&e),
            };
            let (merchant, _) = match merchant_of(&state, &link.project_id).await {
                Ok(x) => x,
                Err(e) => return trouble(&e),
            };
            match e {
                links::OpenError::Held(minutes) => {
                    held_page(&merchant, !link.mode.is_live(), minutes)
                }
                links::OpenError::Unusable(m) => html(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    pages::link_unavailable(&merchant, !link.mode.is_live(), &m),
                ),
                other => html(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    pages::link_page(&link, &merchant, Some(&other.to_string()), typed.as_deref()),
                ),
            }
        }
    }
}

/// The session a page's path names (`None` for an id that cannot exist,
/// answered as a missing one).
async fn session_of(
    state: &AppState,
    id: PathId<SessionId>,
    now: shared::time::Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    match id.get_or(|_, _| ()) {
        Ok(id) => checkout::find_any(state, &id, now).await,
        Err(()) => Ok(None),
    }
}

async fn link_thanks(State(state): State<AppState>, Id(id, ..): Id<LinkId, LinkPages>) -> Response {
    let link = match links::get(&state, &id).await {
        Ok(Some(l)) => l,
        Ok(None) => return link_not_found(),
        Err(e) => return trouble(&e),
    };
    let (merchant, _) = match merchant_of(&state, &link.project_id).await {
        Ok(x) => x,
        Err(e) => return trouble(&e),
    };
    html(
        StatusCode::OK,
        pages::link_thanks(&merchant, !link.mode.is_live()),
    )
}

/// 503 with `Retry-After`: every use of the link is held for now.
fn held_page(merchant: &str, sandbox: bool, minutes: i64) -> Response {
    let mut res = html(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::link_unavailable(merchant, sandbox, &links::held_text(minutes)),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(minutes * 60));
    res
}

/// A billing invoice's pay page: its bill (AD and BS dates), and a "Pay"
/// button; a paid or void invoice shows its state.
async fn bill_page(
    State(state): State<AppState>,
    Id(id, ..): Id<BillingInvoiceId, BillPages>,
) -> Response {
    show_bill(&state, &id, StatusCode::OK, None).await
}

async fn show_bill(
    state: &AppState,
    id: &BillingInvoiceId,
    status: StatusCode,
    error: Option<&str>,
) -> Response {
    let inv = match collect::find(state, id).await {
        Ok(Some(i)) => i,
        Ok(None) => return bill_not_found(),
        Err(e) => return trouble(&e),
    };
    let (merchant, _) = match merchant_of(state, &inv.project_id).await {
        Ok(x) => x,
        Err(e) => return trouble(&e),
    };
    let bs = |d: chrono::NaiveDate| calendar::bs_from_ad(d).map(calendar::miti_latin);
    let last_day = inv.period_end.pred_opt().unwrap_or(inv.period_end);
    let issued_on = calendar::nepal_day(inv.issued_at);
    let tenant = shared::domain::Tenant::new(inv.project_id.clone(), inv.mode);
    let buyer_pan = match customers::get(state, &tenant, &inv.customer_id).await {
        Ok(c) => tax::buyer_pan(&c),
        Err(customers::BillingError::Store(e)) => return trouble(&e),
        Err(_) => None,
    };
    let bill = pages::Bill {
        invoice: &inv,
        what: inv.lines.first().map_or("", |l| l.description.as_str()),
        due_bs: bs(inv.due_date),
        period_start_bs: bs(inv.period_start),
        period_end_bs: bs(last_day),
        issued_on,
        issued_bs: bs(issued_on),
        fiscal_year: shared::domain::billing::tax::fiscal_year(issued_on),
        buyer_pan,
    };
    html(status, pages::bill_page(&bill, &merchant, error))
}

/// "Pay": a checkout of the amount due bound to the invoice, on to its
/// provider picker.
async fn bill_pay(
    State(state): State<AppState>,
    Id(id, ..): Id<BillingInvoiceId, BillPages>,
    headers: http::HeaderMap,
) -> Response {
    let now = state.clock.now();
    // A suspended shop's bill opens nothing.
    if let Ok(Some(inv)) = collect::find(&state, &id).await {
        match merchant_of(&state, &inv.project_id).await {
            Ok((_, false)) => {
                return show_bill(
                    &state,
                    &id,
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Some("This shop cannot take payments just now."),
                )
                .await;
            }
            Ok(_) => {}
            Err(e) => return trouble(&e),
        }
    }
    let base = edge::requests::public_base(&state, &headers);
    match collect::open_checkout(&state, &id, &base, now).await {
        Ok(session) => see_other(&format!("/c/{}", session.id)),
        Err(collect::CollectError::Invoice(
            shared::domain::billing::invoice::BillingInvoiceError::NotFound(_),
        )) => bill_not_found(),
        Err(collect::CollectError::Store(e)) => trouble(&e),
        Err(e) => {
            show_bill(
                &state,
                &id,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(&e.to_string()),
            )
            .await
        }
    }
}

/// A short pay link (`/r/<token>`, a reminder's): an invoice's goes on to
/// its bill page (the invoice's `payUrl`), a subscription's shows its
/// trial. A token that is none (or cannot be one) is a 404 that read at
/// most one item and wrote nothing; the public routes' address budget
/// bounds how many a client may try.
async fn short_page(
    State(state): State<AppState>,
    token: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    headers: http::HeaderMap,
) -> Response {
    let Ok(axum::extract::Path(token)) = token else {
        return short_not_found();
    };
    match short_links::landing(&state, &token).await {
        Ok(Some(Landing::Invoice(id))) => {
            let base = edge::requests::public_base(&state, &headers);
            see_other(&collect::pay_url(&base, &id))
        }
        Ok(Some(Landing::Trial(view))) => html(StatusCode::OK, pages::trial_page(&view)),
        Ok(None) => short_not_found(),
        Err(e) => trouble(&e),
    }
}

fn short_not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::plain(
            "Link not found",
            "This pay link is not valid. Please check the message you received, or ask the shop for a new link.",
        ),
    )
}

/// The bill pages' answer to an id that is no invoice's.
struct BillPages;

impl Surface for BillPages {
    type Rejection = Response;

    fn not_found(_noun: &'static str, _raw: &str) -> Response {
        bill_not_found()
    }
}

fn bill_not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::plain("Invoice not found", "This invoice does not exist."),
    )
}

fn link_not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::plain("Link not found", "This payment link does not exist."),
    )
}

async fn qr(
    State(state): State<AppState>,
    Id((id, payment_id), ..): Id<(SessionId, PaymentId), Hosted>,
    headers: http::HeaderMap,
) -> Response {
    let now = state.clock.now();
    let session = match checkout::find_any(&state, &id, now).await {
        Ok(Some(s)) => s,
        Ok(None) => return not_found(),
        Err(e) => return trouble(&e),
    };
    if let Err(limited) = session_budget(&state, &session, SessionUse::Page, &headers).await {
        return limited;
    }
    let payment = match attempts::find_payment(&state, &id, &payment_id).await {
        Ok(Some(p)) => p,
        Ok(None) => return not_found(),
        Err(e) => return trouble(&e),
    };
    let open = matches!(
        payment.status,
        PaymentStatus::Pending | PaymentStatus::Processing
    );
    let current = session.payment_id.as_deref() == Some(payment.id.as_str());
    let Some(text) = payment
        .attempt
        .qr_message
        .as_deref()
        .filter(|_| open && current && session.status == SessionStatus::Initiated)
    else {
        return see_other(&format!("/c/{id}"));
    };
    let svg = match qrcode::QrCode::new(text.as_bytes()) {
        Ok(code) => code
            .render::<qrcode::render::svg::Color>()
            .min_dimensions(220, 220)
            .build(),
        Err(e) => {
            tracing::error!(error = %e, "QR text cannot be encoded");
            return html(
                StatusCode::BAD_GATEWAY,
                pages::plain(
                    "Please choose another way to pay",
                    "The QR code could not be drawn.",
                ),
            );
        }
    };
    let merchant = match merchant_of(&state, &session.project_id).await {
        Ok((m, _)) => m,
        Err(e) => return trouble(&e),
    };
    html(StatusCode::OK, pages::qr_page(&session, &merchant, &svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_urls_keep_their_query_and_fragment() {
        assert_eq!(
            with_params(
                "https://shop.example/thanks",
                &[("session_id", "cs_1"), ("status", "success")]
            ),
            "https://shop.example/thanks?session_id=cs_1&status=success"
        );
        assert_eq!(
            with_params("https://shop.example/t?order=9#top", &[("a", "b c")]),
            "https://shop.example/t?order=9&a=b+c#top"
        );
        assert_eq!(
            with_params("https://s.example/t?", &[("a", "1")]),
            "https://s.example/t?a=1"
        );
    }

    #[test]
    fn the_form_reads_provider_and_address() {
        let c = parse_choice(b"provider=khalti&line1=Thamel+1&city=Kathmandu&fonepay=web");
        assert_eq!(c.provider, Some(Provider::Khalti));
        assert!(c.fonepay_web);
        let a = c.address.unwrap_or_default();
        assert_eq!(a.line1.as_deref(), Some("Thamel 1"));
        assert_eq!(a.city.as_deref(), Some("Kathmandu"));
        assert_eq!(parse_choice(b"provider=paypal").provider, None);
        assert!(parse_choice(b"provider=esewa").address.is_none());
    }

    #[test]
    fn a_store_failure_has_the_apis_status() {
        for e in [
            StoreError::Unavailable("busy".into()),
            StoreError::Backend("broken".into()),
        ] {
            let api = edge::ApiError::from(Refusal::from(e.clone()));
            assert_eq!(trouble(&e).status(), api.status, "{e}");
        }
    }

    #[test]
    fn the_pickers_note_has_the_apis_status() {
        use shared::providers::ProviderError;
        let refused = || {
            [
                AttemptError::Invalid {
                    field: "line1",
                    message: "is required".into(),
                },
                AttemptError::NotOffered("khalti is not available for this shop".into()),
                AttemptError::FonepayCap("over NPR 1,000 in sandbox".into()),
                AttemptError::Busy,
                AttemptError::Provider(ProviderError::Unavailable("500".into())),
                AttemptError::Provider(ProviderError::Rejected {
                    code: "bad".into(),
                    message: "no".into(),
                }),
            ]
        };
        for (e, api) in refused().into_iter().zip(refused()) {
            let what = e.to_string();
            let (status, _) = picker_note(e);
            let api = edge::ApiError::from(Refusal::from(api));
            assert_eq!(status, api.status, "{what}");
        }
        // A provider that did not start: 503 as the API, the page's words.
        let (status, words) = picker_note(AttemptError::Provider(ProviderError::Timeout));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            words.contains("temporarily unavailable") && words.contains("Nothing was charged"),
            "{words}"
        );
    }
}
