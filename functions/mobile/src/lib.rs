//! The mobile function: `POST /v1/mobile/sessions` (the merchant's server,
//! secret key), then `GET /v1/mobile/sessions/{id}` and
//! `POST /v1/mobile/sessions/{id}/attempts` (the merchant's app, with the
//! publishable key and the session's client secret). The rules are
//! `shared::domain::mobile`; paying is the hosted flow's.

use axum::Router;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use edge::Json;
use edge::auth::AppKey;
use edge::idempotency::{Fence, Seal};
use edge::ids::{Id, Surface};
use edge::openapi::{OpenApiRouter, idempotent, routes};
use edge::{ApiError, Auth, JsonBody, PathId, QueryParams, with_edge};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::{Deserialize, Serialize};
use shared::AppState;
use shared::domain::Provider;
use shared::domain::account::{Principal, Scope};
use shared::domain::attempts;
use shared::domain::checkout::{self, Address, CheckoutSession, SessionStatus};
use shared::domain::mobile::{self, CreateMobileSession, MobileError};
use shared::domain::payments::{Payment, PaymentStatus};
use shared::ids::SessionId;
use shared::money::{Currency, Paisa};
use shared::providers::Handoff;
use shared::time::Timestamp;

/// How often an app's reads may ask Fonepay about its open QR.
const POLL: chrono::Duration = chrono::Duration::seconds(3);

/// Where an app sends the session's client secret (or `client_secret` in
/// a POST's body; in a GET's query it is deprecated).
pub const CLIENT_SECRET_HEADER: &str = "x-client-secret";

/// `client_secret` in a GET's query (it ends up in proxy and access logs)
/// is deprecated since this instant, 2026-11-28T00:00:00Z (RFC 9745's
/// `Deprecation: @<unix seconds>`); a later API version refuses it
/// (docs/decisions-refined.md).
pub const QUERY_SECRET_DEPRECATED_AT: i64 = 1_795_824_000;

/// The function's routes and their description, one value.
pub fn routes(state: &AppState) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(idempotent(state, routes!(create_mobile_session)))
        .routes(routes!(get_mobile_session))
        .routes(routes!(start_mobile_attempt))
}

/// The function's routes, behind the idempotency layer, in the shared edge.
pub fn router(state: AppState) -> Router {
    let (router, _) = routes(&state).split_for_parts();
    with_edge(router.with_state(state))
}

/// The app's routes: an id that cannot be a session's is answered as a
/// missing session is (`No such mobile session: '…'`).
struct MobileApi;

impl Surface for MobileApi {
    type Rejection = ApiError;

    fn not_found(_noun: &'static str, raw: &str) -> ApiError {
        MobileError::NotFound(raw.to_owned()).into()
    }
}

/// The answer of `POST /v1/mobile/sessions`: hand `id` and
/// `client_secret` to your app.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = MobileSessionCreated)]
struct Created {
    /// The session, `cs_…`.
    id: String,
    /// The app's proof that it may read and pay this one session, with
    /// the publishable key. Shown here only; a replay of this request
    /// (same `Idempotency-Key`) shows it again.
    client_secret: String,
    livemode: bool,
    amount: Paisa,
    currency: Currency,
    expires_at: Timestamp,
    /// The providers the app may offer for this amount.
    providers: Vec<Provider>,
}

/// A mobile session as the app sees it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = MobileSession)]
struct View {
    id: String,
    livemode: bool,
    status: SessionStatus,
    amount: Paisa,
    currency: Currency,
    expires_at: Timestamp,
    providers: Vec<Provider>,
    /// Server-sent events about this session (`qr.scanned`, `qr.paid`,
    /// `qr.failed`, `qr.expired`), as for Direct-QR. No key needed.
    events_url: String,
    /// The current payment once it is final (`success`, `failed`,
    /// `cancelled`, `refunded`); `null` before.
    #[schema(required)]
    payment: Option<PaymentSummary>,
}

/// What the app may know of a payment: no merchant data.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = MobilePayment)]
struct PaymentSummary {
    id: String,
    provider: Provider,
    status: PaymentStatus,
    amount: Paisa,
    currency: Currency,
    created_at: Timestamp,
}

/// The body of `POST /v1/mobile/sessions/{id}/attempts`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = StartMobileAttempt)]
struct StartAttempt {
    provider: Provider,
    /// The session's client secret, unless sent as `X-Client-Secret`.
    #[serde(default)]
    client_secret: Option<String>,
    /// The customer's address, when the session collects one.
    #[serde(default)]
    address: Option<Address>,
}

/// How the app hands the customer to the provider.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
enum HandoffKind {
    /// Open `payment_url` (Khalti).
    Redirect,
    /// POST `form_fields` to `form_url`, form-encoded, in a web view
    /// (eSewa).
    FormPost,
    /// Show `qr_image` (or draw `qr_message`) to be scanned (Fonepay).
    Qr,
}

/// A started attempt: what the app needs to hand the customer over. The
/// provider's return comes back to us; the payment is proven server to
/// server before the session is `success`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = MobileAttempt)]
struct Attempt {
    /// The attempt's payment, `pay_…`.
    payment_id: String,
    session_id: String,
    provider: Provider,
    handoff: HandoffKind,
    /// Khalti's payment page.
    #[schema(required)]
    payment_url: Option<String>,
    /// Khalti's id of the payment.
    #[schema(required)]
    pidx: Option<String>,
    /// eSewa's form address.
    #[schema(required)]
    form_url: Option<String>,
    /// eSewa's signed form fields, to send unchanged.
    #[schema(required, value_type = Option<Object>)]
    form_fields: Option<serde_json::Map<String, serde_json::Value>>,
    /// Fonepay's EMV QR string.
    #[schema(required)]
    qr_message: Option<String>,
    /// `data:image/png;base64,…` of the same QR.
    #[schema(required)]
    qr_image: Option<String>,
    events_url: String,
    expires_at: Timestamp,
}

/// The client secret the app sent: the header first, else `fallback`
/// (the query's or the body's `client_secret`).
fn client_secret<'a>(headers: &'a HeaderMap, fallback: Option<&'a str>) -> Option<&'a str> {
    headers
        .get(CLIENT_SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .or(fallback)
}

/// Create a mobile session: hand its `id` and `client_secret` to your app.
#[utoipa::path(
    post, path = "/v1/mobile/sessions", tag = "Mobile", operation_id = "createMobileSession",
    request_body = CreateMobileSession,
    security(("bearer" = ["payments:write"])),
    responses(
        (status = 201, description = "The session and its client secret.", body = Created),
        (status = 200, description = "A replay: the first answer to this `Idempotency-Key`.", body = Created),
        (status = 422, description = "A business rule refused it (`provider_unavailable`, `fonepay_sandbox_cap`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn create_mobile_session(
    State(state): State<AppState>,
    auth: Auth,
    fence: Option<Extension<Fence>>,
    headers: HeaderMap,
    // Parsed after the scope check: a key without the scope gets 403,
    // whatever it sent.
    body: Result<JsonBody<CreateMobileSession>, ApiError>,
) -> Result<(StatusCode, Extension<Seal>, Json<Created>), ApiError> {
    let who = auth.require(Scope::PaymentsWrite)?;
    let JsonBody(body) = body?;
    let base = edge::requests::public_base(&state, &headers);
    let valid = mobile::validate(body, who.mode(), &base)?;
    let fence = fence.as_ref().map(|Extension(f)| f);
    let now = state.clock.now();
    let made = mobile::create(&state, who, valid, now, fence).await?;
    let providers = checkout::offered(&state, &made.session).await?;
    let s = made.session;
    Ok((
        StatusCode::CREATED,
        // Kept for replays with the secret sealed, never in the clear.
        Extension(Seal(&["client_secret"])),
        Json(Created {
            client_secret: made.client_secret,
            livemode: s.mode.is_live(),
            amount: s.amount,
            currency: s.currency,
            expires_at: s.expires_at,
            id: s.id.into(),
            providers,
        }),
    ))
}

/// Read a mobile session from the app. An open Fonepay QR is checked with
/// Fonepay, server to server, at most every few seconds; Khalti and eSewa
/// payments are proven on the customer's return (or by the sweep).
#[utoipa::path(
    get, path = "/v1/mobile/sessions/{id}", tag = "Mobile", operation_id = "getMobileSession",
    params(
        ("id" = String, Path, description = "A mobile session id, `cs_…`."),
        ("X-Client-Secret" = Option<String>, Header, description = "The session's client secret."),
        ("client_secret" = Option<String>, Query, deprecated, description = "Deprecated (it ends up in logs): the session's client secret, unless sent as `X-Client-Secret`. Still taken in `/v1`, with a `Deprecation` header on the answer."),
    ),
    security(("publishable" = [])),
    responses(
        (status = 200, description = "The session.", body = View),
        (status = 404, description = "No such session for this key, or a wrong or missing client secret (`not_found`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn get_mobile_session(
    State(state): State<AppState>,
    AppKey(who): AppKey,
    headers: HeaderMap,
    query: QueryParams,
    Id(id, ..): Id<SessionId, MobileApi>,
) -> Response {
    let in_query = query.get("client_secret").is_some();
    let mut res = read_mobile_session(&state, &who, &headers, &query, id)
        .await
        .into_response();
    if in_query {
        deprecated(&mut res, &edge::requests::public_base(&state, &headers));
    }
    res
}

/// Marks the answer to a request that sent its client secret in the
/// query: deprecated (RFC 9745), with a link to the API reference.
fn deprecated(res: &mut Response, base: &str) {
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("@{QUERY_SECRET_DEPRECATED_AT}")) {
        h.insert("deprecation", v);
    }
    let link = format!("<{base}/docs>; rel=\"deprecation\"; type=\"text/html\"");
    if let Ok(v) = HeaderValue::from_str(&link) {
        h.insert(header::LINK, v);
    }
}

async fn read_mobile_session(
    state: &AppState,
    who: &Principal,
    headers: &HeaderMap,
    query: &QueryParams,
    id: SessionId,
) -> Result<Json<View>, ApiError> {
    let now = state.clock.now();
    let secret = client_secret(headers, query.get("client_secret"));
    let session = mobile::open(state, who, &id, secret, now).await?;
    AppKey::session_budget(state, &session.id).await?;
    // An open Fonepay QR is asked about (as its page and stream do); a
    // redirect provider's payment is only read (attempts::poll_qr_every).
    let read = session.clone();
    let (session, payment) = match attempts::poll_qr_of(state, session, now, POLL).await {
        Ok(found) => found,
        Err(e) => {
            // A courtesy: the stream and the sweep prove it anyway.
            tracing::warn!(error = %e, "mobile session: status check failed");
            let payment = match read.payment_id.clone() {
                Some(p) => {
                    let sid = read.id.clone();
                    attempts::find_payment(state, &sid, &p).await?
                }
                None => None,
            };
            (read, payment)
        }
    };
    let events_url = edge::requests::events_url(state, headers, &session.id);
    let providers = checkout::offered(state, &session).await?;
    Ok(Json(view(session, payment, providers, events_url, now)))
}

fn view(
    s: CheckoutSession,
    payment: Option<Payment>,
    providers: Vec<Provider>,
    events_url: String,
    now: Timestamp,
) -> View {
    let payment = payment
        .filter(|p| !matches!(p.status, PaymentStatus::Pending | PaymentStatus::Processing))
        .map(|p| PaymentSummary {
            id: p.id.to_string(),
            provider: p.provider,
            status: p.status,
            amount: p.amount,
            currency: p.currency,
            created_at: p.created_at,
        });
    View {
        events_url,
        livemode: s.mode.is_live(),
        status: s.status_at(now),
        amount: s.amount,
        currency: s.currency,
        expires_at: s.expires_at,
        providers,
        payment,
        id: s.id.into(),
    }
}

/// Start paying from the app: what it needs to hand the customer to the
/// provider. A newer attempt supersedes an open one (at most ten per
/// session).
#[utoipa::path(
    post, path = "/v1/mobile/sessions/{id}/attempts", tag = "Mobile", operation_id = "startMobileAttempt",
    params(
        ("id" = String, Path, description = "A mobile session id, `cs_…`."),
        ("X-Client-Secret" = Option<String>, Header, description = "The session's client secret (or `client_secret` in the body)."),
    ),
    request_body = StartAttempt,
    security(("publishable" = [])),
    responses(
        (status = 201, description = "The attempt and its hand-off.", body = Attempt),
        (status = 404, description = "No such session for this key, or a wrong or missing client secret (`not_found`).", body = edge::openapi::ErrorEnvelope),
        (status = 409, description = "The session changed meanwhile; try again (`state_conflict`).", body = edge::openapi::ErrorEnvelope),
        (status = 422, description = "The session is final (`session_closed`), the provider is not offered (`provider_unavailable`) or the sandbox cap is reached (`fonepay_sandbox_cap`).", body = edge::openapi::ErrorEnvelope),
    ),
)]
async fn start_mobile_attempt(
    State(state): State<AppState>,
    AppKey(who): AppKey,
    headers: HeaderMap,
    id: PathId<SessionId>,
    body: Result<JsonBody<StartAttempt>, ApiError>,
) -> Result<(StatusCode, Json<Attempt>), ApiError> {
    let JsonBody(body) = body?;
    // Parsed after the body (as the session was looked up after it): a
    // bad body is answered first, as it always was.
    let id = id.get_or(|_, raw| MobileError::NotFound(raw.to_owned()))?;
    let now = state.clock.now();
    let secret = client_secret(&headers, body.client_secret.as_deref());
    let session = mobile::open(&state, &who, &id, secret, now).await?;
    AppKey::session_budget(&state, &session.id).await?;
    let base = edge::requests::public_base(&state, &headers);
    let address = body.address.map(Address::stored);
    let started = mobile::start(&state, session, body.provider, address, &base, now).await?;
    let mut answer = Attempt {
        payment_id: started.payment.id.to_string(),
        events_url: edge::requests::events_url(&state, &headers, &started.session.id),
        session_id: started.session.id.into(),
        provider: started.payment.provider,
        expires_at: started.session.expires_at,
        handoff: HandoffKind::Redirect,
        payment_url: None,
        pidx: None,
        form_url: None,
        form_fields: None,
        qr_message: None,
        qr_image: None,
    };
    match started.handoff {
        Handoff::Redirect { url, provider_ref } => {
            answer.payment_url = Some(url);
            answer.pidx = provider_ref;
        }
        Handoff::AutoPostForm { action, fields } => {
            answer.handoff = HandoffKind::FormPost;
            answer.form_url = Some(action);
            answer.form_fields = Some(
                fields
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::String(v)))
                    .collect(),
            );
        }
        Handoff::Qr { qr_message, .. } => {
            answer.handoff = HandoffKind::Qr;
            answer.qr_image = Some(qr::png_data_url(&qr_message).ok_or_else(ApiError::internal)?);
            answer.qr_message = Some(qr_message);
        }
    }
    Ok((StatusCode::CREATED, Json(answer)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_wins_over_the_query_or_body() {
        let mut h = HeaderMap::new();
        assert_eq!(client_secret(&h, Some("q")), Some("q"));
        assert_eq!(client_secret(&h, None), None);
        h.insert(CLIENT_SECRET_HEADER, http::HeaderValue::from_static(" s "));
        assert_eq!(client_secret(&h, Some("q")), Some("s"));
    }
}
