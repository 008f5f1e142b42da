//! `Idempotency-Key` on every POST, PATCH and DELETE (decisions.md,
//! Idempotency): a retry of a logical write with the same key answers what
//! the first attempt answered, and never runs it twice.
//!
//! The key is scoped to (project, mode, key) and remembered 24 hours. The
//! first request claims it with a conditional put (`in_progress`, with a
//! lease); when the handler answers, the answer is stored with the record.
//! - same key, same fingerprint, completed: the stored answer is replayed
//!   with `Idempotent-Replayed: true`;
//! - same key while the first is in flight: 409 `idempotency_conflict`;
//! - same key, different method/path/query/body, or another API key of the
//!   project: 409 `idempotency_key_reused`;
//! - a 5xx answer, or a 4xx the router made before any handler ran, is not
//!   stored: the claim is released so a retry runs;
//! - an answer too large (or not text) to store: the record is completed
//!   without it, and a retry gets 409 `idempotency_conflict` saying so.
//!
//! A claim whose process died mid-request is taken over after its lease
//! ([`LEASE`]) by the next retry from the same API key.
//!
//! The stored answer alone cannot cover one case: the business write
//! committed but the answer was lost (a timeout after the write, a crash).
//! For that, handlers that create things put the request's [`Fence`] in the
//! same transaction as the write: a second run of the same request then
//! fails on the fence and finds what the first run created.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use sha2::{Digest, Sha256};

use super::auth::authenticate_request;
use super::error::{ApiError, Enveloped, ErrorType};
use super::input::{MAX_BODY_BYTES, QueryParams};
use super::requests::current_request_id;
use shared::app::AppState;
use shared::domain::credentials::{CredentialsError, SealedSecret};
use shared::domain::idempotency::{self, Claim, ClaimState, Claimed, Ticket};

pub const HEADER: &str = "idempotency-key";
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
pub const MAX_KEY_LEN: usize = 255;
pub use shared::domain::idempotency::LEASE;
pub use shared::store::fence::{Fence, RETENTION};
/// Answers larger than this are answered but not stored for replay.
const MAX_STORED_BODY: usize = 256 * 1024;

/// What makes two requests "the same request".
pub fn fingerprint(method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> String {
    let mut pairs = QueryParams::parse(query).0;
    pairs.sort();
    let canonical_query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    let mut h = Sha256::new();
    h.update(method.as_str().as_bytes());
    h.update(b"\n");
    h.update(path.as_bytes());
    h.update(b"\n");
    h.update(canonical_query.as_bytes());
    h.update(b"\n");
    h.update(Sha256::digest(body));
    hex::encode(h.finalize())
}

fn conflict(code: &'static str, message: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        ErrorType::IdempotencyError,
        code,
        message,
    )
}

/// The middleware. Requests without the header, and GETs, pass through.
/// `method_router` with the idempotency layer on its methods only: a
/// method the path does not take stays a plain 405, whatever
/// Idempotency-Key it carries (the key is neither judged nor taken).
/// (`Router::route_layer` would also wrap each route's 405 fallback.)
pub fn on<S>(
    state: &AppState,
    method_router: axum::routing::MethodRouter<S>,
) -> axum::routing::MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    method_router.route_layer(axum::middleware::from_fn_with_state(state.clone(), layer))
}

pub async fn layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match run(state, req, next).await {
        Ok(res) => res,
        Err(err) => err.into_response(),
    }
}

async fn run(state: AppState, req: Request, next: Next) -> Result<Response, ApiError> {
    let writes = matches!(*req.method(), Method::POST | Method::PATCH | Method::DELETE);
    if !writes || !req.headers().contains_key(HEADER) {
        return Ok(next.run(req).await);
    }

    // The key is scoped to the caller, so authenticate first (and hand the
    // result to the handler's extractor: no second lookup). A request
    // without a usable key is a 401 before anything about its
    // Idempotency-Key is judged.
    let (mut parts, body) = req.into_parts();
    let auth = authenticate_request(&parts, &state).await?;
    // A publishable key is public (it ships in apps) and is refused by
    // every idempotent route: refused before it can claim a key, so no
    // one holding an app can block the merchant's Idempotency-Keys.
    if auth.0.key.kind == shared::domain::account::KeyKind::Publishable {
        return Err(shared::domain::account::publishable_refusal().into());
    }
    parts.extensions.insert(auth.clone());
    let idem_key = parts
        .headers
        .get(HEADER)
        .map(|v| v.to_str())
        .transpose()
        .map_err(|_| {
            ApiError::validation("Idempotency-Key", "Idempotency-Key must be printable ASCII")
        })?
        .unwrap_or_default()
        .trim()
        .to_owned();
    if idem_key.is_empty() || idem_key.len() > MAX_KEY_LEN {
        return Err(ApiError::validation(
            "Idempotency-Key",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} characters"),
        ));
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::payload_too_large(MAX_BODY_BYTES))?;
    let print = fingerprint(&parts.method, parts.uri.path(), parts.uri.query(), &bytes);

    let request = idempotency::Request {
        tenant: auth.tenant(),
        key: &idem_key,
        fingerprint: &print,
        api_key: &auth.0.key.id,
    };
    let ticket = match idempotency::claim(&state, request).await? {
        Claimed::Ours(ticket) => ticket,
        Claimed::Taken(existing) => return taken(&state, &request, existing),
    };
    parts.extensions.insert(ticket.fence());
    let req = Request::from_parts(parts, Body::from(bytes));
    let res = next.run(req).await;
    // Not stored, the key released so the retry runs: a 5xx, and a 4xx
    // the router made before any handler ran (a 405, a bad path), which
    // the edge puts in the error envelope on the way out (a stored copy
    // would replay it without).
    let unhandled_4xx =
        res.status().is_client_error() && res.extensions().get::<Enveloped>().is_none();
    if unhandled_4xx {
        // No handler ran, nothing was written: the key is free again.
        if let Err(e) = ticket.release(&state).await {
            tracing::warn!(error = %e, "could not release an idempotency claim");
        }
        return Ok(res);
    }
    if res.status().is_server_error() {
        // A handler ran and may have written (its fence knows): released,
        // not deleted, so only a retry of this very request takes it.
        if let Err(e) = ticket.lapse(&state).await {
            tracing::warn!(error = %e, "could not release an idempotency claim");
        }
        return Ok(res);
    }
    let (res_parts, res_body) = res.into_parts();
    let res_bytes = axum::body::to_bytes(res_body, usize::MAX)
        .await
        .unwrap_or_default();
    keep(&state, &ticket, &res_parts, &res_bytes).await;
    Ok(Response::from_parts(res_parts, Body::from(res_bytes)))
}

/// Keeps the answer for replays: its body as text when it fits (without
/// [`Redact`]'s fields, [`Seal`]'s sealed apart), else none. An answer
/// whose secret cannot be sealed (no master key) is not kept at all: the
/// claim lapses, so a retry of the request runs again (its fence finds
/// what the first run made) rather than finding the secret in the clear
/// or an answer without it.
async fn keep(state: &AppState, ticket: &Ticket, res: &http::response::Parts, bytes: &[u8]) {
    let content_type = res
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Too large or binary to keep: marked done without it, so a retry
    // neither runs the write again nor gets an empty answer.
    let text = String::from_utf8(bytes.to_vec())
        .ok()
        .filter(|b| b.len() <= MAX_STORED_BODY)
        .map(|b| match res.extensions.get::<Redact>() {
            Some(redact) => redact.apply(&b),
            None => b,
        });
    let (text, sealed) = match (text, res.extensions.get::<Seal>()) {
        (Some(text), Some(seal)) => match seal.apply(state, ticket, &text) {
            Ok((rest, sealed)) => (Some(rest), Some(sealed)),
            Err(e) => {
                tracing::error!(error = %e, "an answer's secret could not be sealed: not kept");
                if let Err(e) = ticket.lapse(state).await {
                    tracing::warn!(error = %e, "could not release an idempotency claim");
                }
                return;
            }
        },
        (text, _) => (text, None),
    };
    let answer = text.map(|b| (b, content_type.unwrap_or_else(|| "application/json".into())));
    if let Err(e) = ticket
        .complete(state, res.status.as_u16(), answer, sealed)
        .await
    {
        tracing::error!(error = %e, "could not record an idempotent answer");
    }
}

/// What a request gets when its key is held: the replay of the same
/// request's stored answer, or why it cannot be run.
fn taken(
    state: &AppState,
    request: &idempotency::Request<'_>,
    existing: Option<Claim>,
) -> Result<Response, ApiError> {
    let (print, api_key) = (request.fingerprint, request.api_key);
    match existing {
        Some(r) if r.fingerprint != print => Err(conflict(
            "idempotency_key_reused",
            "This Idempotency-Key was used with a different request (method, path, query or body)",
        )),
        Some(r) if r.key_id.as_ref().is_some_and(|k| k != api_key) => Err(conflict(
            "idempotency_key_reused",
            "This Idempotency-Key was used by another API key of this project",
        )),
        Some(r) if r.state == ClaimState::Completed && r.body.is_none() => Err(conflict(
            "idempotency_conflict",
            "The request with this Idempotency-Key was done, but its answer was too large (or not text) to keep for a replay: read the result with a GET",
        )),
        Some(r) if r.state == ClaimState::Completed => Ok(replay(&r, opened(state, request, &r)?)),
        _ => Err(conflict(
            "idempotency_conflict",
            "A request with this Idempotency-Key is still in progress; retry later",
        )),
    }
}

/// Put on a response whose body holds a secret shown once (a webhook
/// signing secret): the stored copy for replays leaves these top-level
/// fields out, so the secret is never kept in the clear.
#[derive(Clone, Copy, Debug)]
pub struct Redact(pub &'static [&'static str]);

impl Redact {
    fn apply(&self, body: &str) -> String {
        match serde_json::from_str::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(mut map)) => {
                for field in self.0 {
                    map.remove(*field);
                }
                serde_json::Value::Object(map).to_string()
            }
            // Not an object: nothing can be left out, so keep nothing.
            _ => String::new(),
        }
    }
}

/// Put on a response whose body holds a secret a replay must show again
/// (a mobile session's client secret): the stored copy holds these
/// top-level fields sealed with the credentials master key
/// (`shared::domain::idempotency`), apart from the rest of the body, and
/// a replay opens them into the body again. Nothing readable in the table
/// or a backup of it holds the secret.
#[derive(Clone, Copy, Debug)]
pub struct Seal(pub &'static [&'static str]);

impl Seal {
    /// `body` without the fields, and the fields sealed for `ticket`'s
    /// record.
    fn apply(
        &self,
        state: &AppState,
        ticket: &Ticket,
        body: &str,
    ) -> Result<(String, SealedSecret), CredentialsError> {
        let Ok(serde_json::Value::Object(mut rest)) = serde_json::from_str(body) else {
            return Err(CredentialsError::Invalid(
                "the answer is not a JSON object".into(),
            ));
        };
        let fields: serde_json::Map<String, serde_json::Value> = self
            .0
            .iter()
            .filter_map(|f| rest.remove(*f).map(|v| ((*f).to_owned(), v)))
            .collect();
        let sealed = ticket.seal(state, &fields)?;
        Ok((serde_json::Value::Object(rest).to_string(), sealed))
    }
}

/// The body a replay of completed claim `r` answers: as stored, with its
/// sealed fields opened into it. Fields that cannot be opened (the master
/// key that sealed them is no longer configured) are a 409: the answer is
/// never replayed without them.
fn opened(
    state: &AppState,
    request: &idempotency::Request<'_>,
    r: &Claim,
) -> Result<String, ApiError> {
    let body = r.body.clone().unwrap_or_default();
    let fields = match idempotency::open_sealed(state, request.tenant, request.key, r) {
        Ok(None) => return Ok(body),
        Ok(Some(fields)) => fields,
        Err(e) => {
            tracing::error!(error = %e, "a kept answer's sealed fields do not open");
            return Err(conflict(
                "idempotency_conflict",
                "The request with this Idempotency-Key was done, but its answer can no longer be opened: make a new request",
            ));
        }
    };
    match serde_json::from_str::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.extend(fields);
            Ok(serde_json::Value::Object(map).to_string())
        }
        _ => Err(ApiError::internal()),
    }
}

fn replay(r: &Claim, body: String) -> Response {
    let status = r
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let mut body = body;
    if status.is_client_error() {
        // A stored error names the first request's id; the replay names its own.
        if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&body) {
            if let Some(e) = v.get_mut("error").and_then(|e| e.as_object_mut()) {
                e.insert(
                    "request_id".into(),
                    current_request_id().unwrap_or_default().into(),
                );
                body = v.to_string();
            }
        }
    }
    let mut res = (status, body).into_response();
    let ct = r.content_type.as_deref().unwrap_or("application/json");
    if let Ok(v) = HeaderValue::from_str(ct) {
        res.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    res.headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    if status.is_client_error() {
        // A replayed error keeps its body; mark it so the edge leaves it be.
        res.extensions_mut().insert(Enveloped);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Auth, JsonBody, with_edge};
    use axum::extract::Extension;
    use axum::routing::post;
    use axum::{Json, Router};
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use shared::domain::Mode;
    use shared::domain::Tenant;
    use shared::domain::account::{self, KeyKind, NewKey, Plan, Scope};
    use shared::domain::credentials::{CredentialsKey, CredentialsKeys};
    use shared::domain::idempotency::record_key;
    use shared::domain::record::item_at;
    use shared::providers::ProviderHub;
    use shared::store::embedded::EmbeddedStore;
    use shared::store::faults::{Fault, FaultyStore, Op};
    use shared::store::fence::RETENTION;
    use shared::store::{Cond, TxOp, Update};
    use shared::store::{Item, Key, Store};
    use shared::time::{Clock, SystemClock};
    use shared::{AppState, Config};
    use std::sync::Arc;
    use tower::ServiceExt;

    #[test]
    fn redact_leaves_out_secret_fields_only() {
        let r = Redact(&["signing_secret"]);
        let kept = r.apply(r#"{"id":"we_1","signing_secret":"whsec_x","url":"https://a"}"#);
        assert!(!kept.contains("whsec_x"), "{kept}");
        assert!(
            kept.contains("we_1") && kept.contains("https://a"),
            "{kept}"
        );
        assert_eq!(r.apply("not json"), "");
    }

    /// A write endpoint of the shape every real one has: one transaction
    /// (the widget, a counter, and the fence when there is a key).
    async fn create_widget(
        State(state): State<AppState>,
        auth: Auth,
        fence: Option<Extension<Fence>>,
        JsonBody(body): JsonBody<Value>,
    ) -> Result<(StatusCode, Json<Value>), ApiError> {
        let store = &state.store;
        let id = shared::ids::new_id(shared::ids::IdKind::Event);
        let widget = json!({"id": id, "name": body["name"], "project": auth.project_id()});
        let mut item = Item::new();
        item.insert("pk".into(), format!("W#{id}").into());
        item.insert("sk".into(), "W".into());
        item.insert("json".into(), widget.clone());
        let mut ops = vec![
            TxOp::Put {
                item,
                cond: Some(Cond::NotExists),
            },
            TxOp::Update {
                key: Key::new("COUNTER", "COUNTER"),
                update: Update::new().add("n", 1),
                cond: None,
            },
        ];
        if let Some(Extension(f)) = &fence {
            ops.push(f.op(&id));
        }
        match store.transact(ops).await {
            Ok(()) => Ok((StatusCode::CREATED, Json(widget))),
            Err(e) if fence.as_ref().is_some_and(|_| Fence::tripped(&e, 2)) => {
                let Some(Extension(f)) = fence else {
                    return Err(ApiError::internal());
                };
                let first = f.resource_id(&**store).await?.unwrap_or_default();
                let item = store.get(&Key::new(format!("W#{first}"), "W")).await?;
                let json = item
                    .and_then(|i| i.get("json").cloned())
                    .unwrap_or(Value::Null);
                Ok((StatusCode::CREATED, Json(json)))
            }
            Err(e) => Err(e.into()),
        }
    }

    struct Setup {
        app: Router,
        store: Arc<dyn Store>,
        faulty: Arc<FaultyStore>,
        key: String,
        /// Another key of the same project and mode (read-only).
        other_key: String,
        project_id: String,
    }

    /// An answer too large to store for replay (counted in `BIG`).
    async fn big_answer(
        State(state): State<AppState>,
    ) -> Result<(StatusCode, Json<Value>), ApiError> {
        state
            .store
            .update(&Key::new("BIG", "BIG"), Update::new().add("n", 1), None)
            .await?;
        let id = shared::ids::new_id(shared::ids::IdKind::Event);
        let pad = "x".repeat(MAX_STORED_BODY);
        Ok((StatusCode::CREATED, Json(json!({"id": id, "pad": pad}))))
    }

    /// An answer holding a secret shown once that a replay shows again
    /// (as a mobile session's client secret), counted in `SEALED`.
    async fn sealed_answer(
        State(state): State<AppState>,
    ) -> Result<(StatusCode, Extension<Seal>, Json<Value>), ApiError> {
        let n = state
            .store
            .update(
                &Key::new("SEALED", "SEALED"),
                Update::new().add("n", 1),
                None,
            )
            .await?;
        let n = n.get("n").and_then(Value::as_i64);
        let secret = format!(
            "cs_secret_{}",
            shared::ids::new_id(shared::ids::IdKind::Event)
        );
        let body = json!({"id": n, "client_secret": secret, "amount": 50000});
        Ok((
            StatusCode::CREATED,
            Extension(Seal(&["client_secret"])),
            Json(body),
        ))
    }

    async fn big_answers(s: &Setup) -> i64 {
        let item = s.store.get(&Key::new("BIG", "BIG")).await.ok().flatten();
        item.and_then(|i| i.get("n").and_then(Value::as_i64))
            .unwrap_or(0)
    }

    async fn setup() -> Setup {
        let Ok(inner) = EmbeddedStore::in_memory() else {
            panic!()
        };
        let inner: Arc<dyn Store> = Arc::new(inner);
        let faulty = Arc::new(FaultyStore::new(inner.clone()));
        let now = SystemClock.now();
        let Ok(m) = account::create_merchant(&*inner, now, "Idem", "i@x.example", Plan::Pro).await
        else {
            panic!()
        };
        let Ok(p) = account::create_project(&*inner, now, &m, "P", false).await else {
            panic!()
        };
        let new = NewKey {
            mode: Mode::Sandbox,
            kind: KeyKind::Secret,
            scopes: Scope::ALL.to_vec(),
            description: String::new(),
            expires_at: None,
            spend_cap_paisa: None,
        };
        let keys = AppState::new(
            inner.clone(),
            Arc::new(SystemClock),
            Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        );
        let Ok((key, _)) = account::issue_api_key(&keys, now, &p, new).await else {
            panic!()
        };
        let read_only = NewKey {
            mode: Mode::Sandbox,
            kind: KeyKind::Restricted,
            scopes: vec![Scope::PaymentsRead],
            description: String::new(),
            expires_at: None,
            spend_cap_paisa: None,
        };
        let Ok((other_key, _)) = account::issue_api_key(&keys, now, &p, read_only).await else {
            panic!()
        };
        let Ok(master) = CredentialsKey::generate("k1") else {
            panic!()
        };
        let state = AppState::new(
            faulty.clone(),
            Arc::new(SystemClock),
            Config {
                public_base_url: "http://x".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
        .with_providers(ProviderHub::keys_only(CredentialsKeys::single(master)));
        let app = with_edge(
            Router::new()
                .route("/v1/widgets", post(create_widget))
                .route("/v1/big", post(big_answer))
                .route("/v1/sealed", post(sealed_answer))
                .layer(axum::middleware::from_fn_with_state(state.clone(), layer))
                .with_state(state),
        );
        Setup {
            app,
            store: inner,
            faulty,
            key,
            other_key,
            project_id: p.id.to_string(),
        }
    }

    struct Answer {
        status: StatusCode,
        replayed: bool,
        request_id: String,
        body: Value,
    }

    async fn call(s: &Setup, idem: Option<&str>, body: &str) -> Answer {
        send(s, Method::POST, "/v1/widgets", &s.key, idem, body).await
    }

    async fn send(
        s: &Setup,
        method: Method,
        path: &str,
        key: &str,
        idem: Option<&str>,
        body: &str,
    ) -> Answer {
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json");
        if let Some(k) = idem {
            req = req.header(HEADER, k);
        }
        let req = req.body(Body::from(body.to_owned())).unwrap_or_default();
        let res = s.app.clone().oneshot(req).await.unwrap_or_default();
        let status = res.status();
        let replayed = res.headers().get(REPLAYED_HEADER).is_some();
        let request_id = res
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Answer {
            status,
            replayed,
            request_id,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    async fn widgets_created(s: &Setup) -> i64 {
        let item = s
            .store
            .get(&Key::new("COUNTER", "COUNTER"))
            .await
            .ok()
            .flatten();
        item.and_then(|i| i.get("n").and_then(Value::as_i64))
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_retry_replays_the_first_answer_and_writes_once() {
        let s = setup().await;
        let first = call(&s, Some("order-1"), r#"{"name": "a"}"#).await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(!first.replayed);
        let again = call(&s, Some("order-1"), r#"{"name": "a"}"#).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed, "the replay is marked");
        assert_eq!(again.body, first.body);
        assert_eq!(widgets_created(&s).await, 1);
        // Without a key, every call is a new write.
        call(&s, None, r#"{"name": "a"}"#).await;
        assert_eq!(widgets_created(&s).await, 2);
    }

    #[tokio::test]
    async fn the_same_key_for_another_request_is_refused() {
        let s = setup().await;
        call(&s, Some("k"), r#"{"name": "a"}"#).await;
        let other = call(&s, Some("k"), r#"{"name": "b"}"#).await;
        assert_eq!(other.status, StatusCode::CONFLICT);
        assert_eq!(other.body["error"]["type"], "idempotency_error");
        assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
        assert_eq!(other.body["error"]["request_id"], other.request_id.as_str());
        assert_eq!(widgets_created(&s).await, 1);
    }

    #[tokio::test]
    async fn another_api_key_never_gets_the_first_keys_answer() {
        let s = setup().await;
        let first = call(&s, Some("k"), r#"{"name": "a"}"#).await;
        assert_eq!(first.status, StatusCode::CREATED);
        // Same project, mode, Idempotency-Key and request; a key that may
        // not even read widgets.
        let other = send(
            &s,
            Method::POST,
            "/v1/widgets",
            &s.other_key,
            Some("k"),
            r#"{"name": "a"}"#,
        )
        .await;
        assert_eq!(other.status, StatusCode::CONFLICT);
        assert!(!other.replayed);
        assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
        assert!(other.body.get("id").is_none(), "{}", other.body);
        assert_eq!(widgets_created(&s).await, 1);
        // The first key still gets its replay.
        assert!(call(&s, Some("k"), r#"{"name": "a"}"#).await.replayed);
    }

    #[tokio::test]
    async fn a_router_refusal_is_not_stored_and_stays_in_the_envelope() {
        let s = setup().await;
        for _ in 0..2 {
            // Only POST is routed: axum answers 405 before any handler.
            let a = send(&s, Method::DELETE, "/v1/widgets", &s.key, Some("d"), "").await;
            assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
            assert!(!a.replayed);
            assert!(a.body["error"]["type"].is_string(), "{}", a.body);
            assert_eq!(a.body["error"]["request_id"], a.request_id.as_str());
        }
        // Not kept: the key is free for the request it was meant for.
        let ok = call(&s, Some("d"), r#"{"name": "a"}"#).await;
        assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
        assert!(!ok.replayed);
    }

    #[tokio::test]
    async fn an_answer_too_large_to_keep_is_neither_replayed_empty_nor_run_again() {
        let s = setup().await;
        let first = send(&s, Method::POST, "/v1/big", &s.key, Some("b"), "{}").await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(first.body["id"].is_string());
        assert_eq!(big_answers(&s).await, 1);
        let again = send(&s, Method::POST, "/v1/big", &s.key, Some("b"), "{}").await;
        assert_eq!(again.status, StatusCode::CONFLICT);
        assert_eq!(again.body["error"]["code"], "idempotency_conflict");
        assert!(
            again.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("too large")),
            "{}",
            again.body
        );
        assert_eq!(big_answers(&s).await, 1, "not run again");
    }

    #[tokio::test]
    async fn another_api_key_cannot_take_over_an_abandoned_claim() {
        let s = setup().await;
        let now = SystemClock.now();
        let Ok(who) = account::authenticate(&*s.store, now, &s.key).await else {
            panic!()
        };
        let body = r#"{"name": "z"}"#;
        let key = record_key(
            &Tenant::new(who.project_id().clone(), Mode::Sandbox),
            "crashed",
        );
        // The first key's process died mid-request; its lease is over.
        let claim = Claim {
            state: ClaimState::InProgress,
            fingerprint: fingerprint(&Method::POST, "/v1/widgets", None, body.as_bytes()),
            owner: "a-process-that-died".into(),
            locked_until: now.plus(chrono::Duration::seconds(-1)),
            status: None,
            content_type: None,
            body: None,
            created_at: now,
            ttl: now.plus(RETENTION).unix_seconds(),
            key_id: Some(who.key.id.clone()),
            sealed: None,
        };
        let Ok(item) = item_at(&claim, &key) else {
            panic!()
        };
        assert!(s.store.put(item, None).await.is_ok());
        let other = send(
            &s,
            Method::POST,
            "/v1/widgets",
            &s.other_key,
            Some("crashed"),
            body,
        )
        .await;
        assert_eq!(other.status, StatusCode::CONFLICT);
        assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
        assert_eq!(widgets_created(&s).await, 0);
        // The first key takes it over.
        let taken = call(&s, Some("crashed"), body).await;
        assert_eq!(taken.status, StatusCode::CREATED, "{}", taken.body);
        assert_eq!(widgets_created(&s).await, 1);
    }

    #[tokio::test]
    async fn bad_keys_are_refused() {
        let s = setup().await;
        let long = "k".repeat(256);
        let a = call(&s, Some(&long), "{}").await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert_eq!(a.body["error"]["param"], "Idempotency-Key");
        assert_eq!(
            call(&s, Some(&"k".repeat(255)), "{}").await.status,
            StatusCode::CREATED
        );
        assert_eq!(
            call(&s, Some(" "), "{}").await.status,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn stored_client_errors_replay_with_the_new_request_id() {
        let s = setup().await;
        let first = call(&s, Some("bad"), "{not json").await;
        assert_eq!(first.status, StatusCode::BAD_REQUEST);
        let again = call(&s, Some("bad"), "{not json").await;
        assert_eq!(again.status, StatusCode::BAD_REQUEST);
        assert!(again.replayed);
        assert_eq!(again.body["error"]["request_id"], again.request_id.as_str());
        assert_ne!(again.request_id, first.request_id);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicates_write_once() {
        let s = Arc::new(setup().await);
        let calls = (0..24).map(|_| {
            let s = s.clone();
            tokio::spawn(async move { call(&s, Some("same"), r#"{"name": "c"}"#).await })
        });
        let answers: Vec<Answer> = futures::future::join_all(calls)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .collect();
        assert_eq!(answers.len(), 24);
        let fresh = answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED && !a.replayed)
            .count();
        assert_eq!(fresh, 1, "exactly one request ran the write");
        for a in &answers {
            let ok = (a.status == StatusCode::CREATED)
                || (a.status == StatusCode::CONFLICT
                    && a.body["error"]["code"] == "idempotency_conflict");
            assert!(ok, "{} {}", a.status, a.body);
        }
        assert_eq!(widgets_created(&s).await, 1);
    }

    #[tokio::test]
    async fn a_store_fault_leaves_nothing_behind_and_the_retry_succeeds() {
        let s = setup().await;
        // Throttled on the write itself.
        s.faulty.plan(Op::Transact, 0, Fault::throttled());
        let failed = call(&s, Some("fault-1"), r#"{"name": "f"}"#).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(failed.body["error"]["type"], "api_error");
        assert_eq!(
            failed.body["error"]["request_id"],
            failed.request_id.as_str()
        );
        assert_eq!(widgets_created(&s).await, 0, "no partial state");
        let retry = call(&s, Some("fault-1"), r#"{"name": "f"}"#).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(!retry.replayed, "the failed attempt was not stored");
        assert_eq!(widgets_created(&s).await, 1);

        // Throttled while claiming the key.
        s.faulty.plan(Op::Put, 0, Fault::throttled());
        let failed = call(&s, Some("fault-2"), r#"{"name": "g"}"#).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            call(&s, Some("fault-2"), r#"{"name": "g"}"#).await.status,
            StatusCode::CREATED
        );
        assert_eq!(widgets_created(&s).await, 2);
    }

    #[tokio::test]
    async fn another_body_under_a_released_key_is_refused_not_answered_the_first_write() {
        let s = setup().await;
        // The first request's write commits, its answer is lost (a 5xx):
        // the claim is released for a retry of the same request.
        s.faulty.plan(Op::Transact, 0, Fault::timeout_after_write());
        let failed = call(&s, Some("lost-2"), r#"{"name": "first"}"#).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(widgets_created(&s).await, 1);
        // Another body under that key: refused, neither the first write's
        // answer nor a second write.
        let other = call(&s, Some("lost-2"), r#"{"name": "second"}"#).await;
        assert_eq!(other.status, StatusCode::CONFLICT, "{:?}", other.body);
        assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
        assert_eq!(widgets_created(&s).await, 1);
        // The retry of the first request still finds its write.
        let retry = call(&s, Some("lost-2"), r#"{"name": "first"}"#).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert_eq!(retry.body["name"], "first");
        assert_eq!(widgets_created(&s).await, 1);
    }

    #[tokio::test]
    async fn fences_of_two_requests_under_one_key_are_apart() {
        // Even with the claim record gone (past its retention, or deleted
        // by hand), a fence found by another request is not its own.
        let s = setup().await;
        s.faulty.plan(Op::Transact, 0, Fault::timeout_after_write());
        call(&s, Some("gone"), r#"{"name": "first"}"#).await;
        assert_eq!(widgets_created(&s).await, 1);
        // Drop the claim record: only the fence remains.
        let record = record_key(&Tenant::new(s.project_id.as_str(), Mode::Sandbox), "gone");
        s.store.delete(&record, None).await.unwrap();
        let other = call(&s, Some("gone"), r#"{"name": "second"}"#).await;
        assert_eq!(other.status, StatusCode::CREATED, "{:?}", other.body);
        assert_eq!(
            other.body["name"], "second",
            "its own write, not the first's"
        );
        assert_eq!(widgets_created(&s).await, 2);
    }

    #[tokio::test]
    async fn a_write_whose_answer_was_lost_is_not_repeated() {
        let s = setup().await;
        s.faulty.plan(Op::Transact, 0, Fault::timeout_after_write());
        let failed = call(&s, Some("lost"), r#"{"name": "l"}"#).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(widgets_created(&s).await, 1, "the write did commit");
        let retry = call(&s, Some("lost"), r#"{"name": "l"}"#).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert_eq!(retry.body["name"], "l");
        assert_eq!(
            widgets_created(&s).await,
            1,
            "the fence stopped a second write"
        );
    }

    #[tokio::test]
    async fn an_abandoned_claim_is_taken_over_after_its_lease() {
        let s = setup().await;
        let now = SystemClock.now();
        let Ok(who) = account::authenticate(&*s.store, now, &s.key).await else {
            panic!()
        };
        let body = r#"{"name": "z"}"#;
        let print = fingerprint(&Method::POST, "/v1/widgets", None, body.as_bytes());
        let key = record_key(
            &Tenant::new(who.project_id().clone(), Mode::Sandbox),
            "crashed",
        );
        let mut claim = Claim {
            state: ClaimState::InProgress,
            fingerprint: print,
            owner: "a-process-that-died".into(),
            locked_until: now.plus(chrono::Duration::seconds(30)),
            status: None,
            content_type: None,
            body: None,
            created_at: now,
            ttl: now.plus(RETENTION).unix_seconds(),
            // Written before the key was kept: taken over all the same.
            key_id: None,
            sealed: None,
        };
        let Ok(item) = item_at(&claim, &key) else {
            panic!()
        };
        assert!(s.store.put(item, None).await.is_ok());
        let blocked = call(&s, Some("crashed"), body).await;
        assert_eq!(blocked.status, StatusCode::CONFLICT, "still leased");
        assert_eq!(blocked.body["error"]["code"], "idempotency_conflict");

        claim.locked_until = now.plus(chrono::Duration::seconds(-1));
        let Ok(item) = item_at(&claim, &key) else {
            panic!()
        };
        assert!(s.store.put(item, None).await.is_ok());
        let taken = call(&s, Some("crashed"), body).await;
        assert_eq!(taken.status, StatusCode::CREATED, "{}", taken.body);
        assert_eq!(widgets_created(&s).await, 1);
    }

    #[tokio::test]
    async fn a_key_older_than_its_retention_is_free_again() {
        let s = setup().await;
        let now = SystemClock.now();
        let Ok(who) = account::authenticate(&*s.store, now, &s.key).await else {
            panic!()
        };
        let key = record_key(&Tenant::new(who.project_id().clone(), Mode::Sandbox), "old");
        // A completed answer for another request, past its 24 h TTL but not
        // yet swept (DynamoDB deletes expired items lazily).
        let stale = Claim {
            state: ClaimState::Completed,
            fingerprint: "another request".into(),
            owner: "gone".into(),
            locked_until: now.plus(chrono::Duration::hours(-25)),
            status: Some(201),
            content_type: Some("application/json".into()),
            body: Some("{}".into()),
            created_at: now.plus(chrono::Duration::hours(-25)),
            ttl: now.plus(chrono::Duration::hours(-1)).unix_seconds(),
            key_id: None,
            sealed: None,
        };
        let Ok(item) = item_at(&stale, &key) else {
            panic!()
        };
        assert!(s.store.put(item, None).await.is_ok());
        let fresh = call(&s, Some("old"), r#"{"name": "n"}"#).await;
        assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.body);
        assert!(!fresh.replayed);
        assert_eq!(widgets_created(&s).await, 1);
    }

    #[tokio::test]
    async fn a_sealed_secret_is_kept_sealed_and_replayed_whole() {
        let s = setup().await;
        let first = send(
            &s,
            Method::POST,
            "/v1/sealed",
            &s.key,
            Some("sealed-1"),
            "{}",
        )
        .await;
        assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
        let secret = first.body["client_secret"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(secret.starts_with("cs_secret_"), "{}", first.body);
        let tenant = Tenant::new(s.project_id.as_str(), Mode::Sandbox);
        let Ok(Some(item)) = s.store.get(&record_key(&tenant, "sealed-1")).await else {
            panic!("no claim")
        };
        let raw = Value::Object(item.clone()).to_string();
        assert!(
            !raw.contains(&secret),
            "the secret is stored in the clear: {raw}"
        );
        assert!(
            raw.contains("50000"),
            "the rest of the answer is kept: {raw}"
        );
        let Ok(claim) = shared::domain::record::from_item::<Claim>(item) else {
            panic!()
        };
        assert!(claim.sealed.is_some(), "{raw}");
        let again = send(
            &s,
            Method::POST,
            "/v1/sealed",
            &s.key,
            Some("sealed-1"),
            "{}",
        )
        .await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed);
        assert_eq!(again.body, first.body, "the same answer, secret included");
        let Ok(Some(n)) = s.store.get(&Key::new("SEALED", "SEALED")).await else {
            panic!()
        };
        assert_eq!(n.get("n").and_then(Value::as_i64), Some(1), "ran once");
    }

    #[tokio::test]
    async fn without_a_master_key_a_secret_answer_is_not_kept() {
        let s = setup().await;
        // The same routes on a state without a master key.
        let state = AppState::new(
            s.store.clone(),
            Arc::new(SystemClock),
            Config {
                public_base_url: "http://x".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        );
        let app = with_edge(
            Router::new()
                .route("/v1/sealed", post(sealed_answer))
                .layer(axum::middleware::from_fn_with_state(state.clone(), layer))
                .with_state(state),
        );
        let s = Setup { app, ..s };
        let first = send(
            &s,
            Method::POST,
            "/v1/sealed",
            &s.key,
            Some("sealed-2"),
            "{}",
        )
        .await;
        assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
        let secret = first.body["client_secret"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let tenant = Tenant::new(s.project_id.as_str(), Mode::Sandbox);
        let Ok(Some(item)) = s.store.get(&record_key(&tenant, "sealed-2")).await else {
            panic!("no claim")
        };
        let raw = Value::Object(item).to_string();
        assert!(!raw.contains(&secret), "{raw}");
        // The retry runs again (a real handler's fence finds its write).
        let again = send(
            &s,
            Method::POST,
            "/v1/sealed",
            &s.key,
            Some("sealed-2"),
            "{}",
        )
        .await;
        assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
        assert!(!again.replayed);
    }

    #[test]
    fn fingerprints_ignore_query_order_but_not_content() {
        let m = Method::POST;
        let a = fingerprint(&m, "/v1/x", Some("a=1&b=2"), b"{}");
        assert_eq!(a, fingerprint(&m, "/v1/x", Some("b=2&a=1"), b"{}"));
        assert_ne!(a, fingerprint(&m, "/v1/x", Some("a=1&b=3"), b"{}"));
        assert_ne!(a, fingerprint(&m, "/v1/y", Some("a=1&b=2"), b"{}"));
        assert_ne!(
            a,
            fingerprint(&Method::PATCH, "/v1/x", Some("a=1&b=2"), b"{}")
        );
        assert_ne!(a, fingerprint(&m, "/v1/x", Some("a=1&b=2"), b"{ }"));
    }
}
