//! A mail service: it takes every message (the local gateway's mail sender
//! posts `POST /send {from, to, subject, text, html, tags}`), keeps it in
//! an inbox tests and the README walkthrough read, and turns a bounce or a
//! complaint into the notification SES would publish, delivered as SNS
//! would deliver it to the mail queue (moto has no bounce events).
//!
//! - `POST /send`: 200 `{"messageId": "sim-mail-<n>"}`; 400 for a missing
//!   field;
//! - `GET /_control/messages`: `{"messages": [...], "send_calls": n}`,
//!   oldest first; `POST /_control/reset` (or `DELETE /_control/messages`)
//!   clears;
//! - `POST /_control/fail {"times": N, "status": 503}`: the next N sends
//!   answer that status and keep nothing;
//! - `POST /_control/bounce {"address": "...", "type": "bounce"|"complaint"}`:
//!   the latest message to `address` bounces (permanently) or draws a
//!   complaint: an SES event JSON naming that message's tags, in an SNS
//!   envelope, is put on the mail queue; 404 when nothing was sent there.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use shared::queue::{Queue, QueueName};

use super::{SimState, control_error, now_rfc3339};

/// One message taken.
#[derive(Clone, Debug, Serialize)]
pub struct MailSent {
    pub message_id: String,
    pub from: String,
    pub to: String,
    pub subject: String,
    pub text: String,
    pub html: String,
    pub tags: Map<String, Value>,
    pub at: String,
}

/// What the simulator holds.
#[derive(Default)]
pub(crate) struct MailBook {
    pub sent: Vec<MailSent>,
    pub calls: u64,
    pub fail_left: u32,
    pub fail_status: u16,
    /// Where notifications go (the gateway's mail queue), once wired.
    pub feedback: Option<Arc<dyn Queue>>,
}

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/send", post(send))
        .route("/_control/fail", post(control_fail))
        .route(
            "/_control/messages",
            get(control_messages).delete(control_reset),
        )
        .route("/_control/reset", post(control_reset))
        .route("/_control/bounce", post(control_bounce))
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

#[derive(Deserialize)]
struct SendBody {
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    subject: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    html: String,
    #[serde(default)]
    tags: Map<String, Value>,
}

async fn send(State(st): State<SimState>, body: axum::body::Bytes) -> Response {
    let mut book = st.mail();
    book.calls += 1;
    if book.fail_left > 0 {
        book.fail_left -= 1;
        let status =
            StatusCode::from_u16(book.fail_status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return answer(
            status,
            json!({"message": "Service temporarily unavailable"}),
        );
    }
    let b: SendBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return answer(StatusCode::BAD_REQUEST, json!({"message": e.to_string()})),
    };
    if [&b.from, &b.to, &b.subject, &b.text]
        .iter()
        .any(|f| f.trim().is_empty())
    {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"message": "from, to, subject and text are required"}),
        );
    }
    let message_id = format!("sim-mail-{}", book.sent.len() + 1);
    book.sent.push(MailSent {
        message_id: message_id.clone(),
        from: b.from,
        to: b.to,
        subject: b.subject,
        text: b.text,
        html: b.html,
        tags: b.tags,
        at: now_rfc3339(),
    });
    answer(StatusCode::OK, json!({"messageId": message_id}))
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
    let mut book = st.mail();
    book.fail_left = c.times.unwrap_or(1);
    book.fail_status = status;
    answer(
        StatusCode::OK,
        json!({"fail_left": book.fail_left, "status": status}),
    )
}

async fn control_messages(State(st): State<SimState>) -> Response {
    let book = st.mail();
    answer(
        StatusCode::OK,
        json!({"messages": book.sent, "send_calls": book.calls, "fail_left": book.fail_left}),
    )
}

async fn control_reset(State(st): State<SimState>) -> Response {
    let mut book = st.mail();
    let feedback = book.feedback.take();
    *book = MailBook {
        feedback,
        ..MailBook::default()
    };
    answer(StatusCode::OK, json!({"reset": true}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlBounce {
    address: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

/// The SES event (event publishing's shape) of a bounce or complaint of
/// `sent`.
pub fn ses_event(sent: &MailSent, complaint: bool) -> Value {
    let tags: Map<String, Value> = sent
        .tags
        .iter()
        .map(|(k, v)| (k.clone(), json!([v])))
        .collect();
    let mail = json!({
        "timestamp": sent.at,
        "source": sent.from,
        "messageId": sent.message_id,
        "destination": [sent.to],
        "tags": tags,
    });
    if complaint {
        json!({
            "eventType": "Complaint",
            "complaint": {
                "complainedRecipients": [{"emailAddress": sent.to}],
                "complaintFeedbackType": "abuse",
                "timestamp": now_rfc3339(),
                "feedbackId": format!("sim-feedback-{}", sent.message_id),
            },
            "mail": mail,
        })
    } else {
        json!({
            "eventType": "Bounce",
            "bounce": {
                "bounceType": "Permanent",
                "bounceSubType": "General",
                "bouncedRecipients": [{
                    "emailAddress": sent.to,
                    "action": "failed",
                    "status": "5.1.1",
                    "diagnosticCode": "smtp; 550 5.1.1 user unknown",
                }],
                "timestamp": now_rfc3339(),
                "feedbackId": format!("sim-feedback-{}", sent.message_id),
            },
            "mail": mail,
        })
    }
}

/// `event` as SNS delivers it to an SQS subscription (raw delivery off).
pub fn sns_envelope(event: &Value) -> Value {
    json!({
        "Type": "Notification",
        "MessageId": format!("sim-sns-{}", ulid_like()),
        "TopicArn": "arn:aws:sns:ap-south-1:000000000000:dhukuti-mail-feedback",
        "Message": event.to_string(),
        "Timestamp": now_rfc3339(),
        "SignatureVersion": "1",
    })
}

fn ulid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

async fn control_bounce(State(st): State<SimState>, body: axum::body::Bytes) -> Response {
    let c: ControlBounce = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return control_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let complaint = match c.kind.as_deref().unwrap_or("bounce") {
        "bounce" => false,
        "complaint" => true,
        _ => {
            return control_error(StatusCode::BAD_REQUEST, "type must be bounce or complaint");
        }
    };
    let address = c.address.trim().to_lowercase();
    let (sent, queue) = {
        let book = st.mail();
        let sent = book
            .sent
            .iter()
            .rev()
            .find(|m| m.to.eq_ignore_ascii_case(&address))
            .cloned();
        (sent, book.feedback.clone())
    };
    let Some(sent) = sent else {
        return control_error(StatusCode::NOT_FOUND, "no message was sent to that address");
    };
    let Some(queue) = queue else {
        return control_error(
            StatusCode::CONFLICT,
            "no mail queue is wired to the simulator",
        );
    };
    let envelope = sns_envelope(&ses_event(&sent, complaint));
    match queue
        .send(QueueName::Mail, &envelope.to_string(), Duration::ZERO)
        .await
    {
        Ok(_) => answer(
            StatusCode::OK,
            json!({"queued": true, "notification": envelope}),
        ),
        Err(e) => control_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}
