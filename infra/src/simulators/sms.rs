//! A Sparrow SMS-style SMS provider: `POST /api/v2/sms/` with `token`,
//! `from`, `to`, `text` (form or JSON). It records every accepted message
//! so tests can read what was sent, and can be told to fail.
//!
//! - `POST /api/v2/sms/`: 200 `{"count": 1, "response_code": 200,
//!   "response": "1 mesages has been queued for delivery",
//!   "message_id": "…"}`; 403 `{"response_code": 1002, "response":
//!   "Invalid Token"}` for another token; 400 for a missing field or a
//!   `to` that is not a 10-digit Nepali mobile number;
//! - control: `POST /_control/fail {"times": N, "status": 503}` makes the
//!   next N sends answer that status (default 503) and record nothing;
//!   `GET /_control/messages` lists the accepted messages (oldest first)
//!   with `send_calls`, every call counted; `POST /_control/reset` clears.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{SimState, control_error, now_rfc3339, parse_form};

/// The token the simulator accepts (`DHUKUTI_SMS_TOKEN` of the dev
/// server by default). Made up for the simulator.
pub const SMS_TEST_TOKEN: &str = "sim_sms_token_5b2e9c4d7a1f3e6b";

/// One accepted message.
#[derive(Clone, Debug, Serialize)]
pub struct SmsSent {
    pub message_id: String,
    pub from: String,
    pub to: String,
    pub text: String,
    pub at: String,
}

/// What the simulator holds.
#[derive(Default)]
pub(crate) struct SmsBook {
    pub sent: Vec<SmsSent>,
    pub calls: u64,
    pub fail_left: u32,
    pub fail_status: u16,
}

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/api/v2/sms/", post(send))
        .route("/api/v2/sms", post(send))
        .route("/_control/fail", post(control_fail))
        .route("/_control/messages", get(control_messages))
        .route("/_control/reset", post(control_reset))
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

async fn send(State(st): State<SimState>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let is_json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let fields: std::collections::HashMap<String, String> = if is_json {
        match serde_json::from_slice::<serde_json::Map<String, Value>>(&body) {
            Ok(m) => m
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, v)
                })
                .collect(),
            Err(_) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    json!({"response_code": 1000, "response": "Invalid JSON"}),
                );
            }
        }
    } else {
        parse_form(&body)
    };
    let mut book = st.sms();
    book.calls += 1;
    if book.fail_left > 0 {
        book.fail_left -= 1;
        let status =
            StatusCode::from_u16(book.fail_status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return answer(
            status,
            json!({"response_code": status.as_u16(), "response": "Service temporarily unavailable"}),
        );
    }
    let get = |k: &str| {
        fields
            .get(k)
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    if get("token") != SMS_TEST_TOKEN {
        return answer(
            StatusCode::FORBIDDEN,
            json!({"response_code": 1002, "response": "Invalid Token"}),
        );
    }
    let (from, to, text) = (get("from"), get("to"), get("text"));
    if from.is_empty() || text.is_empty() {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"response_code": 1003, "response": "from and text are required"}),
        );
    }
    let valid_to = to.len() == 10
        && to.bytes().all(|b| b.is_ascii_digit())
        && (to.starts_with("97") || to.starts_with("98"));
    if !valid_to {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"response_code": 1011, "response": "Invalid receiver"}),
        );
    }
    let message_id = format!("sim-sms-{}", book.sent.len() + 1);
    book.sent.push(SmsSent {
        message_id: message_id.clone(),
        from,
        to,
        text,
        at: now_rfc3339(),
    });
    answer(
        StatusCode::OK,
        json!({
            "count": 1,
            "response_code": 200,
            "response": "1 mesages has been queued for delivery",
            "message_id": message_id,
        }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlFail {
    #[serde(default)]
    times: Option<u32>,
    #[serde(default)]
    status: Option<u16>,
}

async fn control_fail(State(st): State<SimState>, body: axum::body::Bytes) -> Response {
    let c: ControlFail = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return control_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let status = c.status.unwrap_or(503);
    if !(400..=599).contains(&status) {
        return control_error(StatusCode::BAD_REQUEST, "status must be 400-599");
    }
    let mut book = st.sms();
    book.fail_left = c.times.unwrap_or(1);
    book.fail_status = status;
    answer(
        StatusCode::OK,
        json!({"fail_left": book.fail_left, "status": status}),
    )
}

async fn control_messages(State(st): State<SimState>) -> Response {
    let book = st.sms();
    answer(
        StatusCode::OK,
        json!({"messages": book.sent, "send_calls": book.calls, "fail_left": book.fail_left}),
    )
}

async fn control_reset(State(st): State<SimState>) -> Response {
    *st.sms() = SmsBook::default();
    answer(StatusCode::OK, json!({"reset": true}))
}
