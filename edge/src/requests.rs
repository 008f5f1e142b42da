//! What wraps every function's router: a request id on every answer (API
//! Gateway's when present), one log line per request, panics turned into a
//! 500 envelope, and every error status the router makes itself (unknown
//! path, wrong method) rendered as the spec's envelope. Answers to
//! authenticated requests get the key's `X-RateLimit-*` headers here, from
//! the decision the limiter left in the request's [`QuotaSlot`].

use std::time::Instant;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use tower_http::catch_panic::CatchPanicLayer;

use super::error::{ApiError, Enveloped};
use super::ratelimit::{QuotaHttp, QuotaSlot};
use shared::ids;

use crate::context::REQUEST_ID;
pub use crate::context::{REQUEST_ID_HEADER, current_request_id};

/// The id of the request being served, also in `X-Request-Id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

/// Wraps `router` with the shared edge. Safe to apply twice (the dev
/// server wraps the merged app again): an inner edge sees the outer one's
/// request id and steps aside.
pub fn with_edge(router: Router) -> Router {
    router
        .layer(CatchPanicLayer::custom(|_panic| {
            tracing::error!("handler panicked");
            ApiError::internal().into_response()
        }))
        .layer(middleware::from_fn(edge))
}

async fn edge(mut req: Request, next: Next) -> Response {
    if req.extensions().get::<RequestId>().is_some() {
        return next.run(req).await;
    }
    let started = Instant::now();
    let request_id = gateway_request_id(&req).unwrap_or_else(fresh_request_id);
    req.extensions_mut().insert(RequestId(request_id.clone()));
    let quota = QuotaSlot::default();
    req.extensions_mut().insert(quota.clone());
    let method = req.method().clone();
    let path = req.uri().path().to_owned();

    let mut res = REQUEST_ID
        .scope(request_id.clone(), async move {
            let res = next.run(req).await;
            if is_error(res.status()) && res.extensions().get::<Enveloped>().is_none() {
                // An error the router made itself: give it the envelope.
                let mut enveloped = ApiError::for_status(res.status()).into_response();
                if let Some(allow) = res.headers().get(http::header::ALLOW) {
                    enveloped
                        .headers_mut()
                        .insert(http::header::ALLOW, allow.clone());
                }
                enveloped
            } else {
                res
            }
        })
        .await;

    if let Ok(v) = HeaderValue::from_str(&request_id) {
        res.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    if let Some(quota) = quota.get() {
        quota.apply(res.headers_mut());
    }
    let status = res.status().as_u16();
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    // One line per request. The query string and headers are left out on
    // purpose: they are where secrets would be.
    tracing::info!(
        %method,
        path = %path,
        status,
        latency_ms = format_args!("{latency_ms:.2}"),
        request_id = %request_id,
        "request"
    );
    res
}

fn is_error(status: StatusCode) -> bool {
    status.is_client_error() || status.is_server_error()
}

/// The client's address: API Gateway's `sourceIp` on Lambda (set by the
/// gateway from the connection, not from a header a client can write),
/// else the socket's peer (the local gateway), else `unknown`.
pub fn client_address(req: &Request) -> String {
    client_address_in(req.extensions())
}

/// [`client_address`] from a request's extensions (an extractor's parts).
pub fn client_address_in(extensions: &http::Extensions) -> String {
    use lambda_http::request::RequestContext;
    let from_gateway = match extensions.get::<RequestContext>() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.http.source_ip.clone(),
        Some(RequestContext::ApiGatewayV1(ctx)) => ctx.identity.source_ip.clone(),
        _ => None,
    };
    let peer = || {
        extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip().to_string())
    };
    from_gateway
        .filter(|ip| !ip.is_empty() && ip.len() <= 64)
        .or_else(peer)
        .unwrap_or_else(|| "unknown".to_owned())
}

/// API Gateway's own request id, so our logs and theirs line up.
fn gateway_request_id(req: &Request) -> Option<String> {
    use lambda_http::request::RequestContext;
    let id = match req.extensions().get::<RequestContext>()? {
        RequestContext::ApiGatewayV2(ctx) => ctx.request_id.clone(),
        RequestContext::ApiGatewayV1(ctx) => ctx.request_id.clone(),
        _ => None,
    }?;
    // Only ids that are safe as a header value and short enough to log.
    let ok = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(id)
}

fn fresh_request_id() -> String {
    // Reuses the id generator: sortable, unique, with its own prefix.
    let id = ids::new_id(ids::IdKind::Event);
    format!("req_{}", &id[ids::IdKind::Event.prefix().len()..])
}

/// Our public base URL as this request reached us (its `Host`, when the
/// configuration allows it): where links in an answer point.
pub fn public_base(state: &shared::AppState, headers: &http::HeaderMap) -> String {
    state.config.base_for(host(headers))
}

/// A session's event stream for the customer's screen: on the events
/// function's own URL where one is configured (it streams; API Gateway
/// would buffer the answer), else on our public base.
pub fn events_url(state: &shared::AppState, headers: &http::HeaderMap, session_id: &str) -> String {
    let base = state.config.events_base_for(host(headers));
    format!("{base}/c/{session_id}/events")
}

fn host(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn call(
        router: Router,
        req: http::Request<Body>,
    ) -> (StatusCode, http::HeaderMap, serde_json::Value) {
        let res = router.oneshot(req).await.unwrap_or_default();
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, headers, json)
    }

    fn app() -> Router {
        with_edge(
            Router::new()
                .route("/ok", get(|| async { "fine" }))
                .route(
                    "/boom",
                    get(|| async { if true { panic!("boom") } else { "never" } }),
                )
                .route(
                    "/err",
                    get(|| async { ApiError::validation("limit", "bad limit") }),
                ),
        )
    }

    fn get_req(path: &str) -> http::Request<Body> {
        http::Request::get(path)
            .body(Body::empty())
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn every_answer_carries_a_request_id() {
        let (status, headers, _) = call(app(), get_req("/ok")).await;
        assert_eq!(status, StatusCode::OK);
        let id = headers
            .get(REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(id.starts_with("req_"), "{id}");
    }

    #[tokio::test]
    async fn error_bodies_repeat_the_request_id() {
        let (status, headers, body) = call(app(), get_req("/err")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let id = headers
            .get(REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert_eq!(body["error"]["request_id"], id);
        assert_eq!(body["error"]["param"], "limit");
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_get_the_envelope() {
        let (status, headers, body) = call(app(), get_req("/nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "not_found");
        assert_eq!(
            body["error"]["request_id"],
            headers[REQUEST_ID_HEADER].to_str().unwrap_or("?")
        );

        let req = http::Request::post("/ok")
            .body(Body::empty())
            .unwrap_or_default();
        let (status, headers, body) = call(app(), req).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(body["error"]["code"], "method_not_allowed");
        assert!(headers.get(http::header::ALLOW).is_some());
    }

    #[tokio::test]
    async fn a_panic_becomes_a_500_envelope() {
        let (status, headers, body) = call(app(), get_req("/boom")).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["type"], "api_error");
        assert!(headers.get(REQUEST_ID_HEADER).is_some());
    }

    #[tokio::test]
    async fn api_gateway_request_id_is_reused() {
        let event = serde_json::json!({
            "version": "2.0", "routeKey": "$default", "rawPath": "/err", "rawQueryString": "",
            "headers": {"host": "x.execute-api.ap-south-1.amazonaws.com"},
            "requestContext": {"accountId": "1", "apiId": "x", "domainName": "x", "domainPrefix": "x",
                "http": {"method": "GET", "path": "/err", "protocol": "HTTP/1.1", "sourceIp": "1.2.3.4", "userAgent": "t"},
                "requestId": "JKJaXmPLvHcESHA=", "routeKey": "$default", "stage": "$default",
                "time": "22/Nov/2026:01:00:00 +0000", "timeEpoch": 1795000000000i64},
            "isBase64Encoded": false
        });
        let req = lambda_http::request::from_str(&event.to_string())
            .map(|r| r.map(|b| Body::from(b.to_vec())));
        let Ok(req) = req else {
            panic!("event did not parse")
        };
        let (_, headers, body) = call(app(), req).await;
        assert_eq!(headers[REQUEST_ID_HEADER], "JKJaXmPLvHcESHA=");
        assert_eq!(body["error"]["request_id"], "JKJaXmPLvHcESHA=");
    }

    #[tokio::test]
    async fn applying_the_edge_twice_keeps_one_id() {
        let inner = app();
        let outer = with_edge(Router::new().merge(inner));
        let (_, headers, body) = call(outer, get_req("/err")).await;
        assert_eq!(
            body["error"]["request_id"],
            headers[REQUEST_ID_HEADER].to_str().unwrap_or("?")
        );
    }
}
