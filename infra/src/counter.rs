//! `/demo/counter` (the local gateway only): a shop counter's screen for
//! the demo merchant. The page asks the gateway for a Direct-QR through
//! the API (`POST /v1/qr/fonepay` with the demo sandbox key, server side:
//! the key never reaches the browser), shows the QR, and flips to "Paid"
//! from the session's event stream.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

/// At most one QR this often: the page is public on the gateway's address.
const EVERY: Duration = Duration::from_millis(500);

#[derive(Clone)]
struct Counter {
    base: String,
    key: String,
    client: reqwest::Client,
    last: Arc<Mutex<Option<Instant>>>,
}

/// The page, its script and the QR it asks for, for the demo key `key` of
/// the gateway at `base`.
pub fn routes(base: String, key: String) -> Router {
    let counter = Counter {
        base,
        key,
        client: reqwest::Client::new(),
        last: Arc::new(Mutex::new(None)),
    };
    Router::new()
        .route("/demo/counter", get(page))
        .route("/demo/counter.js", get(script))
        .route("/demo/counter/qr", post(make_qr))
        .with_state(counter)
}

/// The page's headers (its answers keep their own shape).
fn secure(res: Response) -> Response {
    edge::html::page_answer(
        res,
        "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
         img-src data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
         form-action 'self'",
    )
}

async fn page() -> Response {
    let html = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Counter - Dhukuti demo</title>
<style>
body{font-family:system-ui,sans-serif;max-width:28rem;margin:2rem auto;padding:0 1rem;color:#1a1a1a}
label{display:block;margin:.5rem 0 .25rem}input{font-size:1.2rem;padding:.4rem;width:10rem}
button{font-size:1.1rem;padding:.5rem 1rem;margin-left:.5rem}
#qr img{width:18rem;height:18rem;image-rendering:pixelated;margin-top:1rem}
#state{font-size:1.6rem;font-weight:600;margin-top:1rem}
.paid{color:#0a6b2d}.failed{color:#a31515}
</style></head><body>
<h1>Counter</h1>
<form id="ask"><label for="amount">Amount (NPR)</label>
<input id="amount" name="amount" type="number" min="1" max="1000" step="1" value="250" required>
<button type="submit">Show QR</button></form>
<div id="qr" hidden><img id="code" alt="Fonepay QR to scan"></div>
<p id="state" role="status" aria-live="polite"></p>
<script src="/demo/counter.js"></script>
</body></html>"#;
    let mut res = (StatusCode::OK, html).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(res)
}

async fn script() -> Response {
    let mut res = (StatusCode::OK, include_str!("counter.js")).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    secure(res)
}

#[derive(Deserialize)]
struct Ask {
    /// Rupees, as the shopkeeper types them.
    amount: i64,
}

fn answer(status: StatusCode, body: Value) -> Response {
    secure((status, Json(body)).into_response())
}

async fn make_qr(
    State(c): State<Counter>,
    headers: HeaderMap,
    body: Option<Json<Ask>>,
) -> Response {
    // Only this page may ask (a cross-site form cannot send JSON with this
    // Origin); and not faster than EVERY.
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if origin.is_some_and(|o| o != c.base) {
        return answer(StatusCode::FORBIDDEN, json!({"error": "another site"}));
    }
    let Some(Json(ask)) = body else {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"error": "amount: a whole number of rupees"}),
        );
    };
    if !(1..=1000).contains(&ask.amount) {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"error": "amount: 1 to 1,000 rupees (the sandbox Fonepay cap)"}),
        );
    }
    {
        let mut last = match c.last.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if last.is_some_and(|t| t.elapsed() < EVERY) {
            return answer(
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": "one QR at a time"}),
            );
        }
        *last = Some(Instant::now());
    }
    let res = c
        .client
        .post(format!("{}/v1/qr/fonepay", c.base))
        .bearer_auth(&c.key)
        .json(&json!({"amount": ask.amount * 100, "description": "Counter sale"}))
        .timeout(Duration::from_secs(15))
        .send()
        .await;
    let (status, body) = match res {
        Ok(r) => {
            let status = r.status();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
        Err(e) => {
            tracing::warn!(error = %e, "counter: the API did not answer");
            return answer(
                StatusCode::BAD_GATEWAY,
                json!({"error": "the API did not answer"}),
            );
        }
    };
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("refused");
        return answer(StatusCode::BAD_GATEWAY, json!({"error": message}));
    }
    // What the screen needs; the events URL is made same-origin.
    let events = format!("/c/{}/events", body["id"].as_str().unwrap_or_default());
    answer(
        StatusCode::OK,
        json!({"id": body["id"], "qr_image": body["qr_image"], "events": events}),
    )
}
