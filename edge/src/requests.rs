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

/// The header CloudFront adds with the viewer's address and source port
/// (`198.51.100.10:46532`, IPv6 unbracketed: `2001:db8::1:46532`); the
/// edge stack's origin request policy forwards it (`infra/edge.yaml`).
pub const VIEWER_ADDRESS_HEADER: &str = "cloudfront-viewer-address";

/// The header the edge stack's distribution adds to every request it
/// forwards, its value the origin secret ([`shared::app::ORIGIN_SECRET_ENV`]).
pub const ORIGIN_SECRET_HEADER: &str = "x-dhukuti-origin-secret";

/// The client's address: CloudFront's viewer address when the request
/// carries the configured origin secret (it came through our
/// distribution, which overwrites both headers), else API Gateway's
/// `sourceIp` on Lambda (set by the gateway from the connection, not from
/// a header a client can write), else the socket's peer (the local
/// gateway), else `unknown`.
pub fn client_address(state: &shared::AppState, req: &Request) -> String {
    client_address_in(state, req.headers(), req.extensions())
}

/// [`client_address`] from a request's parts (an extractor's).
pub fn client_address_in(
    state: &shared::AppState,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
) -> String {
    use lambda_http::request::RequestContext;
    if let Some(viewer) = trusted_viewer(state.origin_secret(), headers) {
        return viewer.to_string();
    }
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

/// The viewer's address CloudFront named, if the request carries exactly
/// one origin secret header equal to `secret` (compared in constant time)
/// and exactly one well-formed viewer address. Anything else: `None`, and
/// the caller uses the connection's address as without the edge.
pub fn trusted_viewer(secret: Option<&str>, headers: &http::HeaderMap) -> Option<std::net::IpAddr> {
    if !carries_origin_secret(secret, headers) {
        return None;
    }
    let viewer = single(headers, VIEWER_ADDRESS_HEADER)?.to_str().ok()?;
    parse_viewer_address(viewer)
}

/// Whether the request carries exactly one origin secret header equal to
/// `secret` (compared in constant time). Never with no or an empty secret.
pub fn carries_origin_secret(secret: Option<&str>, headers: &http::HeaderMap) -> bool {
    use subtle::ConstantTimeEq;
    let (Some(secret), Some(given)) = (
        secret.filter(|s| !s.is_empty()),
        single(headers, ORIGIN_SECRET_HEADER),
    ) else {
        return false;
    };
    given.as_bytes().ct_eq(secret.as_bytes()).into()
}

/// The header's value when it occurs exactly once.
fn single<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

/// The address of a `CloudFront-Viewer-Address` value, its port dropped:
/// `198.51.100.10:46532`, `2001:db8::1:46532` (CloudFront's form), or
/// `[2001:db8::1]:46532`. A value without a port, with a port that is not
/// 0-65535 in digits, or with an address that is not one: `None`.
pub fn parse_viewer_address(value: &str) -> Option<std::net::IpAddr> {
    let value = value.trim();
    if value.len() > 64 {
        return None;
    }
    let (address, port) = match value.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once("]:")?,
        None => value.rsplit_once(':')?,
    };
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok();
    if !port_ok {
        return None;
    }
    address.parse().ok()
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

    #[test]
    fn a_viewer_address_loses_its_port() {
        let cases = [
            ("198.51.100.10:46532", Some("198.51.100.10")),
            (" 198.51.100.10:0 ", Some("198.51.100.10")),
            ("2001:db8::1:443", Some("2001:db8::1")),
            (
                "2001:0db8:85a3:0000:0000:8a2e:0370:7334:46532",
                Some("2001:db8:85a3::8a2e:370:7334"),
            ),
            ("[2001:db8::1]:443", Some("2001:db8::1")),
            ("198.51.100.10", None),
            ("198.51.100.10:", None),
            ("198.51.100.10:65536", None),
            ("198.51.100.10:+80", None),
            ("[2001:db8::1]", None),
            ("2001:db8::1", None),
            ("example.com:443", None),
            ("", None),
        ];
        for (value, want) in cases {
            let got = parse_viewer_address(value).map(|ip| ip.to_string());
            assert_eq!(got.as_deref(), want, "{value:?}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) else {
                panic!("{name}: {value}")
            };
            map.append(name, value);
        }
        map
    }

    #[test]
    fn the_viewer_address_counts_only_with_the_origin_secret() {
        let viewer = (VIEWER_ADDRESS_HEADER, "2001:db8::7:51000");
        let secret = (ORIGIN_SECRET_HEADER, "s3cret-of-the-distribution");
        let trusted = |cfg: Option<&str>, pairs: &[(&str, &str)]| {
            trusted_viewer(cfg, &headers(pairs)).map(|ip| ip.to_string())
        };
        let cfg = Some("s3cret-of-the-distribution");
        assert_eq!(
            trusted(cfg, &[viewer, secret]).as_deref(),
            Some("2001:db8::7")
        );
        // A spoofed address without the secret, or with a wrong one.
        assert_eq!(trusted(cfg, &[viewer]), None);
        assert_eq!(
            trusted(cfg, &[viewer, (ORIGIN_SECRET_HEADER, "guess")]),
            None
        );
        assert_eq!(
            trusted(
                cfg,
                &[viewer, (ORIGIN_SECRET_HEADER, "s3cret-of-the-distributio")]
            ),
            None
        );
        // No secret configured: nothing is trusted, not even an empty one.
        assert_eq!(trusted(None, &[viewer, secret]), None);
        assert_eq!(
            trusted(Some(""), &[viewer, (ORIGIN_SECRET_HEADER, "")]),
            None
        );
        // Two secrets or two addresses: a client added its own beside ours.
        assert_eq!(trusted(cfg, &[viewer, secret, secret]), None);
        assert_eq!(
            trusted(
                cfg,
                &[viewer, ("cloudfront-viewer-address", "192.0.2.1:1"), secret]
            ),
            None
        );
        // The secret with a malformed address: the connection's address.
        assert_eq!(
            trusted(cfg, &[(VIEWER_ADDRESS_HEADER, "nonsense"), secret]),
            None
        );
    }

    #[test]
    fn client_address_prefers_the_trusted_viewer_then_the_socket() {
        let peer = axum::extract::ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 9], 4000)));
        let mut ext = http::Extensions::new();
        ext.insert(peer);
        let spoof = headers(&[
            (VIEWER_ADDRESS_HEADER, "198.51.100.1:1"),
            (ORIGIN_SECRET_HEADER, "x"),
        ]);
        let plain = shared::AppState::for_tests();
        assert_eq!(client_address_in(&plain, &spoof, &ext), "127.0.0.9");
        let behind = shared::AppState::for_tests().with_origin_secret("x");
        assert_eq!(client_address_in(&behind, &spoof, &ext), "198.51.100.1");
        let bare = headers(&[(VIEWER_ADDRESS_HEADER, "198.51.100.1:1")]);
        assert_eq!(client_address_in(&behind, &bare, &ext), "127.0.0.9");
    }
}
