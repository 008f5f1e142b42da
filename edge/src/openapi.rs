//! The OpenAPI document's shared parts, and the one value that is both a
//! route table and its description ([`OpenApiRouter`]).
//!
//! A function builds its routes with [`routes!`] over handlers annotated
//! with `#[utoipa::path]`: the path the router serves is the path the
//! document names, by construction. What every operation shares is added
//! here once, from what the edge really does: the bearer key, the
//! `Idempotency-Key` header where [`idempotent`] installs the layer, the
//! `X-Request-Id` and `X-RateLimit-*` headers, and the error answers the
//! edge itself gives (401, 403, 423, 429, 500, 503; 400 where there is input; 404
//! where the path names a record; 409 and 413 where a body is fenced).

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{HttpMethod, Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, InfoBuilder, OpenApi, OpenApiVersion, Ref, RefOr, Required, ResponseBuilder,
    Schema,
};
use utoipa::{PartialSchema, ToSchema};

/// The handlers' routes only: a deployed function serves no document, so
/// it does not build one at every cold start, nor link the code that
/// would (issue 21). See [`route_table!`](crate::route_table).
#[cfg(not(feature = "document"))]
pub use crate::route_table as routes;
pub use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
/// The handlers' routes and their OpenAPI operations (feature `document`:
/// the local gateway, which writes `docs/openapi.json`, and the tests).
#[cfg(feature = "document")]
pub use utoipa_axum::routes;

/// What [`route_table!`](crate::route_table) expands to names.
#[doc(hidden)]
pub mod __private {
    pub use axum::routing::MethodRouter;
    pub use utoipa::Path;
    pub use utoipa::openapi::path::{PathItem, Paths};
    pub use utoipa_axum::PathItemExt;
    pub use utoipa_axum::paste;
}

/// `utoipa_axum::routes!` without the document: the same paths and
/// methods, read from each handler's `#[utoipa::path]`, on one
/// `MethodRouter`, with an empty [`PathItem`](utoipa::openapi::PathItem)
/// per path (so [`OpenApiRouter::routes`] registers it) and no schemas.
/// `edge::openapi::routes!` is this macro unless the `document` feature is
/// on; a test holds the two to the same routes.
#[macro_export]
macro_rules! route_table {
    ( $( $handler:ident ),+ $(,)? ) => {{
        use $crate::openapi::__private::{Path as _, PathItemExt as _};
        let mut paths = $crate::openapi::__private::Paths::new();
        let mut method_router = $crate::openapi::__private::MethodRouter::new();
        $( $crate::openapi::__private::paste! {
            for method in [<__path_ $handler>]::methods() {
                method_router = method_router.on(method.to_method_filter(), $handler);
            }
            paths
                .paths
                .entry([<__path_ $handler>]::path())
                .or_insert_with($crate::openapi::__private::PathItem::default);
        } )+
        (::std::vec::Vec::new(), paths, method_router)
    }};
}

use crate::ErrorType;
use crate::idempotency;
use crate::ratelimit::{LIMIT_HEADER, REMAINING_HEADER, RESET_HEADER};
use shared::AppState;

/// The security scheme's name: `Authorization: Bearer sk_test_…`.
pub const BEARER: &str = "bearer";
/// The apps' scheme: `Authorization: Bearer pk_test_…` (the mobile
/// endpoints, with a session's client secret).
pub const PUBLISHABLE: &str = "publishable";
const ERROR: &str = "Error";
const RATE_LIMITED: &str = "RateLimited";
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Marks an operation behind the idempotency layer until [`finish`]
/// turns it into the documented header and answers.
const IDEMPOTENT_MARK: &str = "x-dhukuti-idempotent";

/// These operations behind the idempotency layer, and documented so: the
/// one call that installs the layer also names the header.
pub fn idempotent<S>(
    state: &AppState,
    (schemas, mut paths, method_router): UtoipaMethodRouter<S>,
) -> UtoipaMethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    for item in paths.paths.values_mut() {
        let writes = operations(item)
            .into_iter()
            .filter(|(method, _)| *method != HttpMethod::Get);
        for (_, op) in writes {
            let ext = op.extensions.get_or_insert_with(Default::default);
            ext.insert(IDEMPOTENT_MARK.to_owned(), serde_json::Value::Bool(true));
        }
    }
    (schemas, paths, idempotency::on(state, method_router))
}

fn operations(item: &mut utoipa::openapi::PathItem) -> Vec<(HttpMethod, &mut Operation)> {
    [
        (HttpMethod::Get, &mut item.get),
        (HttpMethod::Post, &mut item.post),
        (HttpMethod::Patch, &mut item.patch),
        (HttpMethod::Put, &mut item.put),
        (HttpMethod::Delete, &mut item.delete),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_mut().map(|op| (m, op)))
    .collect()
}

/// Every `error.code` the API answers with, and what it means. A test
/// (`tests/e2e/openapi.rs`) fails when the code names one not listed.
pub const ERROR_CODES: &[(&str, &str)] = &[
    (
        "validation_failed",
        "a field, query parameter or header breaks its rule; `param` names it",
    ),
    ("api_key_invalid", "no API key, or not a valid one"),
    ("account_suspended", "the merchant's account is suspended"),
    ("token_paused", "the merchant paused this key"),
    (
        "missing_scope",
        "the key lacks the scope the operation needs",
    ),
    (
        "permission_denied",
        "the plan lacks the feature; `entitlement` names it",
    ),
    (
        "spend_cap_exceeded",
        "the key's monthly spend cap would be passed",
    ),
    (
        "live_invoicing_disabled",
        "invoicing in live mode is not enabled for this project",
    ),
    (
        "not_found",
        "no such record for this project and mode, or no such path",
    ),
    ("method_not_allowed", "the path does not take this method"),
    ("payload_too_large", "the body is over the size limit"),
    (
        "invalid_request_error",
        "another client error of the HTTP layer",
    ),
    (
        "idempotency_key_reused",
        "this Idempotency-Key was used for another request or key",
    ),
    (
        "idempotency_conflict",
        "the request with this Idempotency-Key is in progress, or its answer was not kept",
    ),
    (
        "version_conflict",
        "the record changed since it was read: read it again",
    ),
    (
        "state_conflict",
        "the record's state does not allow this now",
    ),
    (
        "provider_unavailable",
        "the provider is not enabled for this project in this mode",
    ),
    (
        "fonepay_sandbox_cap",
        "over the sandbox Fonepay cap per payment or per month",
    ),
    ("session_closed", "the session is final: create a new one"),
    (
        "provider_error",
        "the provider did not answer as it should: retry with the same Idempotency-Key",
    ),
    (
        "refund_exceeds_balance",
        "more than is left to refund on the payment",
    ),
    (
        "refund_not_supported",
        "the provider takes no refunds through the API",
    ),
    (
        "payment_not_refundable",
        "the payment is not in a refundable state",
    ),
    ("link_inactive", "the payment link is inactive"),
    (
        "link_used",
        "payments used the payment link: cancel it instead",
    ),
    (
        "invoice_not_collectable",
        "the invoice's balance cannot be collected by checkout",
    ),
    (
        "invoice_not_correctable",
        "the invoice cannot be corrected in its state",
    ),
    (
        "billing_invoice_state_conflict",
        "the billing invoice's status does not allow this (paid, void, not issued)",
    ),
    (
        "customer_has_subscriptions",
        "the billing customer has a subscription that has not ended",
    ),
    (
        "subscription_state_conflict",
        "the subscription's status does not allow that change",
    ),
    (
        "coupon_code_taken",
        "a coupon of the project and mode already has this code (any case)",
    ),
    (
        "promotion_code_taken",
        "a promotion code of the project and mode already has this code (any case)",
    ),
    (
        "usage_period_closed",
        "the usage event's period has been invoiced; `period` names it",
    ),
    (
        "usage_overflow",
        "the period's usage total or amount is more than one invoice bills",
    ),
    (
        "subscription_not_metered",
        "usage is reported only for a subscription on a metered plan",
    ),
    (
        "invoice_item_invoiced",
        "an invoice has taken the invoice item: it cannot be deleted",
    ),
    (
        "invoice_item_limit",
        "the subscription holds the most pending invoice items (40)",
    ),
    (
        "test_clock_live_mode",
        "test clocks exist in sandbox only: use a sandbox key",
    ),
    (
        "download_link_invalid",
        "the report's download link is not one we signed",
    ),
    (
        "download_link_expired",
        "the report's download link has expired: get the report again for a fresh one",
    ),
    (
        "duplicate_reference",
        "a bank credit with this reference is recorded for the provider (any case)",
    ),
    (
        "too_many_reports",
        "the project has 5 reports pending or running: wait for one to end",
    ),
    (
        "upload_link_invalid",
        "the statement upload link is not one we signed",
    ),
    (
        "upload_link_expired",
        "the statement upload link has expired: ask for another upload",
    ),
    (
        "provider_not_confirmed",
        "the provider does not confirm the payment as paid: nothing changed",
    ),
    (
        "webhook_endpoint_limit",
        "the project has its maximum of webhook endpoints",
    ),
    (
        "phone_not_on_session",
        "no pending checkout for this phone on the project",
    ),
    (
        "invalid_checkout_host",
        "the checkout URL is not on this project's checkout host",
    ),
    (
        "rate_limited",
        "too many requests: wait `Retry-After` seconds",
    ),
    (
        "api_error",
        "our fault or a busy dependency: retry with the same Idempotency-Key",
    ),
];

/// The error envelope every refusal is written in (`edge::error`).
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
#[allow(dead_code)]
pub struct ErrorEnvelope {
    error: ErrorBody,
}

/// What went wrong. More objects may join it (`suspension`, `pause`,
/// `refund`), named by the code that adds them.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct ErrorBody {
    /// For people: may change wording at any time.
    message: String,
    #[serde(rename = "type")]
    kind: ErrorType,
    /// For programs: stable, snake_case; the codes are listed in the
    /// document's description ([`ERROR_CODES`]). New codes may appear.
    code: String,
    /// The `X-Request-Id` of this answer: quote it to support.
    request_id: String,
    /// The body field, query parameter or header at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    param: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    detail: Option<String>,
    #[serde(flatten)]
    more: BTreeMap<String, serde_json::Value>,
}

/// A file in the answer (`format: binary`), e.g. an invoice PDF.
pub struct Binary;

impl utoipa::PartialSchema for Binary {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Binary,
            )))
            .into()
    }
}
impl ToSchema for Binary {}

fn header(description: &str, schema: impl Into<RefOr<Schema>>) -> utoipa::openapi::Header {
    HeaderBuilder::new()
        .schema(Some(schema))
        .description(Some(description))
        .build()
}

fn request_id_header() -> utoipa::openapi::Header {
    header(
        "This request's id, also in every log line about it and in an error's `request_id`.",
        String::schema(),
    )
}

fn rate_headers() -> Vec<(&'static str, utoipa::openapi::Header)> {
    vec![
        (
            LIMIT_HEADER,
            header("Requests allowed per window for this key.", u64::schema()),
        ),
        (
            REMAINING_HEADER,
            header("Requests left in this window.", u64::schema()),
        ),
        (
            RESET_HEADER,
            header(
                "Unix time (seconds) at which the window resets.",
                u64::schema(),
            ),
        ),
    ]
}

fn error_response(description: &str, rate_limited: bool) -> utoipa::openapi::Response {
    let mut r = ResponseBuilder::new()
        .description(description)
        .header("X-Request-Id", request_id_header())
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(ERROR)))
                .build(),
        );
    if rate_limited {
        r = r.header(
            "Retry-After",
            header("Seconds to wait before trying again.", u64::schema()),
        );
        for (name, h) in rate_headers() {
            r = r.header(name, h);
        }
    }
    r.build()
}

/// The whole document from the routers' own parts: shared components,
/// the security of every operation, the edge's headers and answers, and
/// the webhook events.
pub fn finish(mut api: OpenApi, webhooks: utoipa::openapi::Paths) -> OpenApi {
    api.openapi = OpenApiVersion::Version31;
    api.info = InfoBuilder::new()
        .title("Dhukuti API")
        .version("1")
        .description(Some(
            "Collect rupees through eSewa, Khalti and Fonepay with one API. \
             Authenticate with a secret key as a bearer token \
             (`Authorization: Bearer sk_test_…`); a test key sees only \
             sandbox data. Amounts are integers in paisa. Writes accept an \
             `Idempotency-Key`: a retry with the same key and body returns \
             the first answer. Errors use one envelope, `{\"error\": {…}}`. \
             Webhooks (below) are signed with the endpoint's secret in \
             `X-Service-Signature`.",
        ))
        .build();
    let codes: String = ERROR_CODES
        .iter()
        .map(|(code, meaning)| format!("\n- `{code}`: {meaning}"))
        .collect();
    if let Some(d) = api.info.description.as_mut() {
        d.push_str("\n\nError codes (`error.code`):");
        d.push_str(&codes);
    }

    let mut components = api.components.take().unwrap_or_default();
    components.security_schemes.insert(
        BEARER.to_owned(),
        RefOr::T(SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("sk_test_… or sk_live_…")
                .description(Some(
                    "A secret API key. Each operation names the scope it needs.",
                ))
                .build(),
        )),
    );
    components.security_schemes.insert(
        PUBLISHABLE.to_owned(),
        RefOr::T(SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("pk_test_… or pk_live_…")
                .description(Some(
                    "A publishable key, safe in an app: it calls only the mobile \
                     endpoints, with the session's client secret. Its requests \
                     are limited per client address and per session.",
                ))
                .build(),
        )),
    );
    let mut schemas = Vec::new();
    <ErrorEnvelope as ToSchema>::schemas(&mut schemas);
    schemas.push((ERROR.to_owned(), ErrorEnvelope::schema()));
    components.schemas.extend(schemas);
    components.responses.insert(
        ERROR.to_owned(),
        RefOr::T(error_response("Refused: the error envelope.", false)),
    );
    components.responses.insert(
        RATE_LIMITED.to_owned(),
        RefOr::T(error_response(
            "Too many requests for this key (`rate_limited`).",
            true,
        )),
    );

    for (path, item) in api.paths.paths.iter_mut() {
        let names_record = path.contains('{');
        for (method, op) in operations(item) {
            document_operation(op, &method, names_record);
        }
    }
    link_created_records(&mut api);
    if !webhooks.paths.is_empty() {
        api.webhooks = Some(webhooks);
    }
    api.components = Some(components);
    api
}

/// A create (`POST /v1/x` answering 201) links to every operation on
/// `/v1/x/{id}…` with the new record's id: how a client, or a stateful
/// fuzzer, goes from a record to what can be done with it.
fn link_created_records(api: &mut OpenApi) {
    let mut targets: Vec<(String, String)> = Vec::new();
    for (path, item) in api.paths.paths.iter_mut() {
        for (_, op) in operations(item) {
            if let Some(id) = &op.operation_id {
                targets.push((path.clone(), id.clone()));
            }
        }
    }
    for (path, item) in api.paths.paths.iter_mut() {
        let Some(RefOr::T(created)) = item
            .post
            .as_mut()
            .and_then(|op| op.responses.responses.get_mut("201"))
        else {
            continue;
        };
        let prefix = format!("{path}/{{id}}");
        for (target, id) in &targets {
            if *target == prefix || target.starts_with(&format!("{prefix}/")) {
                created.links.insert(
                    id.clone(),
                    RefOr::T(
                        utoipa::openapi::link::LinkBuilder::new()
                            .operation_id(id.clone())
                            .parameter("id", "$response.body#/id")
                            .build(),
                    ),
                );
            }
        }
    }
}

fn document_operation(op: &mut Operation, method: &HttpMethod, names_record: bool) {
    let idempotent = op
        .extensions
        .as_mut()
        .and_then(|e| e.remove(IDEMPOTENT_MARK))
        .is_some();
    if op.extensions.as_ref().is_some_and(|e| e.is_empty()) {
        op.extensions = None;
    }
    if idempotent {
        let p = ParameterBuilder::new()
            .name(IDEMPOTENCY_KEY)
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Up to 255 printable ASCII characters, unique per operation you \
                 mean once. A retry with the same key and body replays the first \
                 answer; the same key with another body is a 409.",
            ))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .max_length(Some(255))
                    // What `HeaderValue::to_str` passes, trimmed as HTTP
                    // trims a field value.
                    .pattern(Some("^[\\x21-\\x7E]([\\t\\x20-\\x7E]*[\\x21-\\x7E])?$")),
            ))
            .build();
        op.parameters.get_or_insert_with(Vec::new).push(RefOr::T(p));
    }

    for response in op.responses.responses.values_mut() {
        if let RefOr::T(r) = response {
            r.headers
                .insert("X-Request-Id".to_owned(), RefOr::T(request_id_header()));
            for (name, h) in rate_headers() {
                r.headers.insert(name.to_owned(), RefOr::T(h));
            }
        }
    }

    let has_input = op.request_body.is_some()
        || op.parameters.as_ref().is_some_and(|p| !p.is_empty())
        || names_record;
    let mut answers: BTreeMap<&str, &str> = BTreeMap::new();
    answers.insert("401", ERROR);
    answers.insert("403", ERROR);
    // A key its merchant paused (`token_paused`, with the pause).
    answers.insert("423", ERROR);
    answers.insert("429", RATE_LIMITED);
    answers.insert("500", ERROR);
    answers.insert("503", ERROR);
    if has_input || idempotent {
        answers.insert("400", ERROR);
    }
    if names_record {
        answers.insert("404", ERROR);
    }
    if idempotent {
        answers.insert("409", ERROR);
    }
    if op.request_body.is_some() || (idempotent && *method != HttpMethod::Get) {
        answers.insert("413", ERROR);
    }
    for (status, name) in answers {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))));
    }
}

/// The document as the gateway serves it: pretty JSON with a final
/// newline, so the committed copy diffs line by line.
pub fn to_json(api: &OpenApi) -> String {
    match api.to_pretty_json() {
        Ok(mut s) => {
            s.push('\n');
            s
        }
        // Serializing our own document cannot fail; say so if it ever does.
        Err(e) => format!("{{\"error\": \"the OpenAPI document did not serialize: {e}\"}}\n"),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::extract::Path;
    use http::{Method, Request};
    use tower::ServiceExt;

    use super::OpenApiRouter;

    #[utoipa::path(get, path = "/v1/things")]
    async fn list_things() -> &'static str {
        "list"
    }

    #[utoipa::path(post, path = "/v1/things")]
    async fn create_thing() -> &'static str {
        "create"
    }

    #[utoipa::path(get, path = "/v1/things/{id}", params(("id" = String, Path)))]
    async fn get_thing(Path(id): Path<String>) -> String {
        format!("get {id}")
    }

    #[utoipa::path(patch, path = "/v1/things/{id}", params(("id" = String, Path)))]
    async fn patch_thing(Path(id): Path<String>) -> String {
        format!("patch {id}")
    }

    #[utoipa::path(post, path = "/v1/things/{id}/cancel", params(("id" = String, Path)))]
    async fn cancel_thing(Path(id): Path<String>) -> String {
        format!("cancel {id}")
    }

    /// A deployed function's route table answers every method on every
    /// path exactly as the documented one the tests and the local gateway
    /// run: same handler, same 404 and 405.
    #[tokio::test]
    async fn the_route_table_routes_as_the_documented_routes_do() {
        let documented = OpenApiRouter::<()>::new()
            .routes(utoipa_axum::routes!(list_things, create_thing))
            .routes(utoipa_axum::routes!(get_thing, patch_thing))
            .routes(utoipa_axum::routes!(cancel_thing));
        let table = OpenApiRouter::<()>::new()
            .routes(crate::route_table!(list_things, create_thing))
            .routes(crate::route_table!(get_thing, patch_thing))
            .routes(crate::route_table!(cancel_thing));
        let (documented, doc) = documented.split_for_parts();
        let (table, bare) = table.split_for_parts();
        let keys =
            |api: &utoipa::openapi::OpenApi| api.paths.paths.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&doc), keys(&bare));
        assert_eq!(keys(&doc).len(), 3);
        assert!(
            bare.components
                .as_ref()
                .is_none_or(|c| c.schemas.is_empty()),
            "the table carries no schemas"
        );
        let mut answered = 0;
        for path in [
            "/v1/things",
            "/v1/things/t_1",
            "/v1/things/t_1/cancel",
            "/v1/other",
        ] {
            for method in [
                Method::GET,
                Method::POST,
                Method::PATCH,
                Method::PUT,
                Method::DELETE,
            ] {
                let call = |router: axum::Router| {
                    let request = Request::builder()
                        .method(method.clone())
                        .uri(path)
                        .body(Body::empty());
                    async move {
                        let response = router.oneshot(request.map_err(|e| e.to_string())?).await;
                        let response = response.map_err(|e| e.to_string())?;
                        let status = response.status();
                        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok::<_, String>((status, body))
                    }
                };
                let want = call(documented.clone()).await;
                let got = call(table.clone()).await;
                assert_eq!(got, want, "{method} {path}");
                if want.as_ref().is_ok_and(|(s, _)| s.is_success()) {
                    answered += 1;
                }
            }
        }
        assert_eq!(answered, 5, "each handler answered once");
    }
}
