//! Rate limits at the edge: the [`Quota`] the limiter decided
//! (`shared::limits::rate`) as `X-RateLimit-*` headers, and the 429.

use http::{HeaderMap, HeaderValue, StatusCode};

use super::error::{ApiError, ErrorType};
pub use shared::limits::rate::{Quota, QuotaSlot, RateLimits, Window};

pub const LIMIT_HEADER: &str = "x-ratelimit-limit";
pub const REMAINING_HEADER: &str = "x-ratelimit-remaining";
pub const RESET_HEADER: &str = "x-ratelimit-reset";
pub const RETRY_AFTER_HEADER: &str = "retry-after";

/// A [`Quota`] on the wire.
pub trait QuotaHttp {
    /// Adds the `X-RateLimit-*` headers (and `Retry-After` when limited).
    fn apply(&self, headers: &mut HeaderMap);
    /// The 429 of a limited request, headers included.
    fn error(&self) -> ApiError;
}

impl QuotaHttp for Quota {
    fn apply(&self, headers: &mut HeaderMap) {
        headers.insert(LIMIT_HEADER, HeaderValue::from(self.limit));
        headers.insert(REMAINING_HEADER, HeaderValue::from(self.remaining));
        headers.insert(RESET_HEADER, HeaderValue::from(self.reset));
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER_HEADER, HeaderValue::from(secs));
        }
    }

    /// The 429 of a limited request, headers included.
    fn error(&self) -> ApiError {
        let secs = self.retry_after.unwrap_or(1).max(1);
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::RateLimitError,
            "rate_limited",
            format!(
                "Too many requests with this API key: the limit is {} per second; retry after {secs} s",
                self.limit
            ),
        )
        .with_header(LIMIT_HEADER, self.limit.to_string())
        .with_header(REMAINING_HEADER, self.remaining.to_string())
        .with_header(RESET_HEADER, self.reset.to_string())
        .with_header(RETRY_AFTER_HEADER, secs.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::domain::Mode;
    use shared::store::Store;
    use shared::testenv::at;
    use shared::testenv::memory_store as store;
    use std::sync::Arc;

    #[test]
    fn headers_and_the_429() {
        let ok = Quota {
            limit: 5,
            remaining: 3,
            reset: 1_800_000_001,
            retry_after: None,
        };
        let mut h = HeaderMap::new();
        ok.apply(&mut h);
        assert_eq!(h[LIMIT_HEADER], "5");
        assert_eq!(h[REMAINING_HEADER], "3");
        assert_eq!(h[RESET_HEADER], "1800000001");
        assert!(h.get(RETRY_AFTER_HEADER).is_none());

        let over = Quota {
            remaining: 0,
            retry_after: Some(1),
            ..ok
        };
        let e = over.error();
        assert_eq!(
            (e.status, e.kind, e.code),
            (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorType::RateLimitError,
                "rate_limited"
            )
        );
        let res = axum::response::IntoResponse::into_response(e);
        assert_eq!(res.headers()[RETRY_AFTER_HEADER], "1");
        assert_eq!(res.headers()[REMAINING_HEADER], "0");
        assert_eq!(res.headers()[LIMIT_HEADER], "5");
    }

    /// A merchant route behind the idempotency layer and the edge, on a
    /// clock that stands still (one window), with a limit of 1.
    async fn gateway() -> (
        axum::Router,
        String,
        Arc<dyn Store>,
        shared::time::ManualClock,
    ) {
        use crate::{Auth, with_edge};
        use axum::routing::get;
        use shared::domain::account::{self, KeyKind, NewKey, Plan, Scope};
        use shared::{AppState, Config};

        let store = store();
        let now = at("2026-11-22T01:00:00.100Z");
        let Ok(m) = account::create_merchant(&*store, now, "R", "r@x.example", Plan::Pro).await
        else {
            panic!()
        };
        let Ok(p) = account::create_project(&*store, now, &m, "P", false).await else {
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
            store.clone(),
            Arc::new(shared::time::SystemClock),
            Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        );
        let Ok((key, _)) = account::issue_api_key(&keys, now, &p, new).await else {
            panic!()
        };
        let clock = shared::time::ManualClock::new(now);
        let state = AppState::new(
            store.clone(),
            Arc::new(clock.clone()),
            Config {
                public_base_url: "http://x".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
        .with_rate_limits(RateLimits::new(100, 1));
        // Two Auth extractors: the request must still count once.
        async fn who(a: Auth, b: Auth) -> String {
            format!("{} {}", a.project_id(), b.project_id())
        }
        let app = with_edge(
            axum::Router::new()
                .route("/v1/who", get(who).post(who))
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    super::super::idempotency::layer,
                ))
                .with_state(state),
        );
        (app, key, store, clock)
    }

    async fn send(
        app: &axum::Router,
        method: &str,
        key: Option<&str>,
        idem: Option<&str>,
    ) -> http::Response<axum::body::Body> {
        use tower::ServiceExt;
        let mut req = http::Request::builder().method(method).uri("/v1/who");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        if let Some(i) = idem {
            req = req.header("idempotency-key", i);
        }
        let req = req.body(axum::body::Body::empty()).unwrap_or_default();
        app.clone().oneshot(req).await.unwrap_or_default()
    }

    #[tokio::test]
    async fn one_request_counts_once_after_authentication() {
        let (app, key, store, clock) = gateway().await;
        // Refused keys cost nothing and carry no rate headers.
        for bad in [
            None,
            Some("sk_test_nope"),
            Some("sk_test_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        ] {
            let res = send(&app, "GET", bad, None).await;
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
            assert!(res.headers().get(LIMIT_HEADER).is_none());
        }
        // The idempotency layer and two extractors authenticate: one slot.
        let res = send(&app, "POST", Some(&key), Some("k1")).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[LIMIT_HEADER], "1");
        assert_eq!(res.headers()[REMAINING_HEADER], "0");
        let reset = at("2026-11-22T01:00:01.000Z").unix_seconds().to_string();
        assert_eq!(res.headers()[RESET_HEADER], reset.as_str());
        assert!(res.headers().get(RETRY_AFTER_HEADER).is_none());
        // The window is spent: 429 in the envelope, with Retry-After.
        let res = send(&app, "GET", Some(&key), None).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RETRY_AFTER_HEADER], "1");
        assert_eq!(res.headers()[REMAINING_HEADER], "0");
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["code"], "rate_limited");
        // The next second has a fresh budget.
        clock.advance(chrono::Duration::seconds(1));
        let res = send(&app, "GET", Some(&key), None).await;
        assert_eq!(res.status(), StatusCode::OK);
        // Two windows were written, the first with count 1 (the 429 did
        // not add).
        let w = Window::of(at("2026-11-22T01:00:00.100Z"));
        let key_item = shared::domain::account::ApiKey::key_for_hash(
            &shared::domain::account::hash_secret(&key),
        );
        let id = match store.get(&key_item).await {
            Ok(Some(item)) => item["id"].as_str().unwrap_or_default().to_owned(),
            other => panic!("{other:?}"),
        };
        let item = store.get(&w.counter_key(&id)).await.ok().flatten();
        assert_eq!(item.and_then(|i| i.get("count").cloned()), Some(1.into()));
    }
}
