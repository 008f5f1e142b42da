//! Khalti KPG-2 web checkout (providers.md 2.6): initiate, the payer page,
//! the callback, lookup and refund, all behind `Authorization: Key`.
//!
//! Routes (below `/khalti`; the API paths answer with and without the
//! trailing slash):
//! - `POST /api/v2/epayment/initiate/`, `POST /api/v2/epayment/lookup/`;
//! - `POST /api/merchant-transaction/{transaction_id}/refund/`;
//! - `GET /pay/?pidx=` (the `payment_url`), `POST /pay/` (its buttons);
//! - control: `POST /_control/next`, `POST /_control/reset`,
//!   `GET /_control/attempts/{pidx or purchase_order_id}`,
//!   `POST /_control/attempts/{ref}/pay|fail|cancel|expire` (pay takes
//!   `{"mobile": "98…", "via_bank": bool}`, both optional).
//!
//! Refunds: the refund URL names Khalti's `transaction_id`, so the call
//! finds its payment by transaction id (and the key that created it).
//! Scenarios with `"on": "refund"` (see [`super::Outcome`]) script it:
//! `{"outcome": "timeout", "on": "refund", "reference": <pidx,
//! purchase_order_id or transaction_id>}` applies the refund AT ONCE and
//! only then holds the answer for the timeout delay (the provider acted;
//! the client timed out: a lookup already shows the refund);
//! `server_error` answers 500 and applies nothing; `failure` answers 400
//! `{"detail": "Refund not allowed", "error_key": "validation_error"}` and
//! applies nothing. Without a scenario: `amount` refunds part, no amount
//! refunds the rest, more than the rest is rejected. `GET
//! /_control/attempts/{ref}` shows `refunded_paisa`, `refund_calls` (every
//! refund call that named this payment's transaction with the right key,
//! whatever the answer) and `refunds` (the refunds applied, in order:
//! `{"amount": paisa, "timed_out": bool, "at": RFC 3339}`).
//!
//! Choices where the notes say UNCONFIRMED: an amount of exactly 1000
//! paisa is accepted (the bound is configurable); a reused
//! `purchase_order_id` is accepted (a new `pidx`; control calls by
//! `purchase_order_id` reach the newest); `merchant_*` extras come back as
//! extra callback parameters; a customer "fail" ends as `Expired` and the
//! browser gets the callback with `status=Expired` and empty ids; pending
//! callbacks carry empty ids until lookup says `Completed`; `fee` is 0
//! until then, and `SimConfig::khalti_fee_bps` of the amount once paid;
//! refund errors are DRF-style `{"detail": ..., "error_key":
//! "validation_error"}` with HTTP 400 (404 for an unknown transaction);
//! a 5xx is Django's plain `<h1>Server Error (500)</h1>` page.

use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::page::{self, Brand};
use super::{
    ALNUM, Action, Attempt, Fault, FaultOn, Outcome, RefundFault, Scenario, SimState,
    control_acted, control_error, parse_control_next, parse_form, random_string, with_query,
};

pub const COMPLETED: &str = "Completed";
pub const PENDING: &str = "Pending";
pub const INITIATED: &str = "Initiated";
pub const REFUNDED: &str = "Refunded";
pub const PARTIALLY_REFUNDED: &str = "Partially Refunded";
pub const EXPIRED: &str = "Expired";
pub const USER_CANCELED: &str = "User canceled";

/// The sandbox test payers (Khalti IDs).
const TEST_PAYERS: [&str; 6] = [
    "9800000000",
    "9800000001",
    "9800000002",
    "9800000003",
    "9800000004",
    "9800000005",
];

/// One Khalti payment, keyed by `pidx`.
#[derive(Clone, Debug, Serialize)]
pub struct KhaltiAttempt {
    pub pidx: String,
    pub purchase_order_id: String,
    pub purchase_order_name: String,
    /// Paisa.
    pub amount: i64,
    pub return_url: String,
    pub website_url: String,
    pub customer_info: Option<Value>,
    pub amount_breakdown: Option<Value>,
    pub product_details: Option<Value>,
    /// `merchant_*` keys of the initiate body, as strings.
    pub merchant_extras: Vec<(String, String)>,
    pub status: String,
    pub transaction_id: Option<String>,
    /// The payer's Khalti ID (unmasked).
    pub mobile: Option<String>,
    /// Paid from a bank: a refund must name `mobile`.
    pub via_bank: bool,
    pub refunded_paisa: i64,
    /// Refund calls that named this payment's `transaction_id` with the
    /// right key, whatever the answer (faults and rejections included).
    pub refund_calls: u32,
    /// The refunds applied, in order.
    pub refunds: Vec<KhaltiRefund>,
    pub fee: i64,
    pub pending_calls_left: Option<u32>,
    pub lookups: u32,
    pub last_callback_url: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    scenario: Scenario,
    #[serde(skip)]
    created: Instant,
    #[serde(skip)]
    owner_key: String,
}

/// A refund applied to a Khalti payment.
#[derive(Clone, Debug, Serialize)]
pub struct KhaltiRefund {
    /// Paisa.
    pub amount: i64,
    /// Applied under a `timeout` fault: the caller got no answer in time.
    pub timed_out: bool,
    pub at: String,
}

impl Attempt for KhaltiAttempt {
    const REFUND_API: bool = true;

    fn scenario_mut(&mut self) -> &mut Scenario {
        &mut self.scenario
    }
}

impl KhaltiAttempt {
    /// `Initiated` past `expires_in` is `Expired`.
    fn refresh(&mut self, st: &SimState) {
        if self.status == INITIATED && self.created.elapsed() >= st.config().khalti_expires_in {
            self.status = EXPIRED.into();
        }
    }
}

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/api/v2/epayment/initiate/", post(initiate))
        .route("/api/v2/epayment/initiate", post(initiate))
        .route("/api/v2/epayment/lookup/", post(lookup))
        .route("/api/v2/epayment/lookup", post(lookup))
        .route("/api/merchant-transaction/{txn}/refund/", post(refund))
        .route("/api/merchant-transaction/{txn}/refund", post(refund))
        .route("/pay/", get(pay_page).post(pay_act))
        .route("/pay", get(pay_page).post(pay_act))
        .route("/_control/next", post(control_next))
        .route("/_control/reset", post(control_reset))
        .route("/_control/attempts/{reference}", get(control_get))
        .route("/_control/attempts/{reference}/{action}", post(control_act))
}

/// The payer page of a `pidx`.
pub fn payment_url(st: &SimState, pidx: &str) -> String {
    with_query(&format!("{}/khalti/pay/", st.base()), &[("pidx", pidx)])
}

fn json_status(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// `{"field": ["message"], ..., "error_key": "validation_error"}`.
fn validation_error(errors: Map<String, Value>) -> Response {
    let mut body = errors;
    body.insert("error_key".into(), json!("validation_error"));
    json_status(StatusCode::BAD_REQUEST, Value::Object(body))
}

fn detail_error(status: StatusCode, detail: &str) -> Response {
    json_status(
        status,
        json!({"detail": detail, "error_key": "validation_error"}),
    )
}

fn server_error() -> Response {
    page::html(
        StatusCode::INTERNAL_SERVER_ERROR,
        "<h1>Server Error (500)</h1>".to_owned(),
    )
}

/// `Authorization: Key <secret>` (keyword in any case). Returns the key.
pub(crate) fn authenticate(st: &SimState, headers: &HeaderMap) -> Result<String, Response> {
    let unauthorized = |detail: &str| {
        json_status(
            StatusCode::UNAUTHORIZED,
            json!({"detail": detail, "status_code": 401}),
        )
    };
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(unauthorized(
            "Authentication credentials were not provided.",
        ));
    };
    let mut words = value.split_whitespace();
    let keyword = words.next().unwrap_or_default();
    if !keyword.eq_ignore_ascii_case("key") {
        return Err(unauthorized(
            "Authentication credentials were not provided.",
        ));
    }
    let (Some(key), None) = (words.next(), words.next()) else {
        return Err(unauthorized(
            "Invalid token header. No credentials provided.",
        ));
    };
    if st.config().khalti_secret_keys.iter().any(|k| k == key) {
        Ok(key.to_owned())
    } else {
        Err(unauthorized("Invalid token."))
    }
}

/// The request body as Khalti's API (Django REST framework) reads it: a
/// form-encoded body by its content type (values as strings, which its
/// fields accept), else JSON.
fn request_body(headers: &HeaderMap, body: &[u8]) -> Result<Map<String, Value>, Response> {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            t.trim()
                .to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        });
    if form {
        let mut out = Map::new();
        for (k, v) in super::parse_form(body) {
            out.insert(k, Value::String(v));
        }
        return Ok(out);
    }
    json_body(body)
}

/// The JSON body, or DRF's parse error.
fn json_body(body: &[u8]) -> Result<Map<String, Value>, Response> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(json_status(
            StatusCode::BAD_REQUEST,
            json!({"non_field_errors": ["Invalid data. Expected a dictionary, but got list."], "error_key": "validation_error"}),
        )),
        Err(e) => Err(json_status(
            StatusCode::BAD_REQUEST,
            json!({"detail": format!("JSON parse error - {e}"), "status_code": 400}),
        )),
    }
}

/// DRF's IntegerField: an integer, or a string/float that is one.
fn as_integer(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => {
            let t = s.trim();
            let t = match t.split_once('.') {
                Some((w, f)) if f.bytes().all(|b| b == b'0') => w,
                Some(_) => return None,
                None => t,
            };
            t.parse().ok()
        }
        _ => None,
    }
}

fn is_url(s: &str) -> bool {
    reqwest::Url::parse(s)
        .map(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        .unwrap_or(false)
}

fn add_error(errors: &mut Map<String, Value>, field: &str, message: &str) {
    errors.insert(field.to_owned(), json!([message]));
}

#[derive(Serialize)]
struct InitiateBody {
    pidx: String,
    payment_url: String,
    expires_at: String,
    expires_in: u64,
}

async fn initiate(State(st): State<SimState>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match authenticate(&st, &headers) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let body = match request_body(&headers, &body) {
        Ok(b) => b,
        Err(r) => return r,
    };

    let mut errors = Map::new();
    let text = |name: &str, errors: &mut Map<String, Value>| -> Option<String> {
        match body.get(name) {
            None | Some(Value::Null) => {
                add_error(errors, name, "This field is required.");
                None
            }
            Some(Value::String(s)) if s.trim().is_empty() => {
                add_error(errors, name, "This field may not be blank.");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => {
                add_error(errors, name, "Not a valid string.");
                None
            }
        }
    };
    let return_url = text("return_url", &mut errors);
    let website_url = text("website_url", &mut errors);
    let purchase_order_id = text("purchase_order_id", &mut errors);
    let purchase_order_name = text("purchase_order_name", &mut errors);
    for (name, value) in [("return_url", &return_url), ("website_url", &website_url)] {
        if let Some(u) = value
            && !is_url(u)
        {
            add_error(&mut errors, name, "Enter a valid URL.");
        }
    }
    let amount = match body.get("amount") {
        None | Some(Value::Null) => {
            add_error(&mut errors, "amount", "This field is required.");
            None
        }
        Some(v) => match as_integer(v) {
            None => {
                add_error(&mut errors, "amount", "A valid integer is required.");
                None
            }
            Some(a) if a < st.config().khalti_min_amount_paisa => {
                let min = st.config().khalti_min_amount_paisa;
                add_error(
                    &mut errors,
                    "amount",
                    &format!(
                        "Amount should be greater than Rs. {}, that is {min} paisa.",
                        min / 100
                    ),
                );
                None
            }
            Some(a) => Some(a),
        },
    };
    if let (Some(amount), Some(breakdown)) = (amount, body.get("amount_breakdown")) {
        let sum = breakdown.as_array().map(|items| {
            items.iter().try_fold(0i64, |acc, i| {
                i.get("amount")
                    .and_then(as_integer)
                    .and_then(|v| acc.checked_add(v))
            })
        });
        if !matches!(sum, Some(Some(s)) if s == amount) {
            add_error(&mut errors, "amount", "Amount Breakdown mismatch.");
        }
    }
    let (
        Some(return_url),
        Some(website_url),
        Some(purchase_order_id),
        Some(purchase_order_name),
        Some(amount),
        true,
    ) = (
        return_url,
        website_url,
        purchase_order_id,
        purchase_order_name,
        amount,
        errors.is_empty(),
    )
    else {
        return validation_error(errors);
    };

    let merchant_extras: Vec<(String, String)> = body
        .iter()
        .filter(|(k, _)| k.starts_with("merchant_"))
        .map(|(k, v)| {
            let s = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), s)
        })
        .collect();

    let pidx = random_string(ALNUM, 22);
    let expires_in = st.config().khalti_expires_in;
    let expires_at = (super::nepal_now()
        + chrono::Duration::from_std(expires_in).unwrap_or(chrono::Duration::zero()))
    .format("%Y-%m-%dT%H:%M:%S%.6f%:z")
    .to_string();
    let fault = {
        let mut book = st.khalti();
        let mut scenario = book.presets.take(&[purchase_order_id.as_str()]);
        let fault = scenario.take_fault(FaultOn::Initiate);
        if fault == Some(Fault::ServerError) {
            book.presets.give_back(&purchase_order_id, scenario);
            return server_error();
        }
        let attempt = KhaltiAttempt {
            pidx: pidx.clone(),
            purchase_order_id: purchase_order_id.clone(),
            purchase_order_name,
            amount,
            return_url,
            website_url,
            customer_info: body.get("customer_info").cloned(),
            amount_breakdown: body.get("amount_breakdown").cloned(),
            product_details: body.get("product_details").cloned(),
            merchant_extras,
            status: INITIATED.into(),
            transaction_id: None,
            mobile: None,
            via_bank: false,
            refunded_paisa: 0,
            refund_calls: 0,
            refunds: Vec::new(),
            fee: 0,
            pending_calls_left: None,
            lookups: 0,
            last_callback_url: None,
            created_at: super::now_rfc3339(),
            expires_at: expires_at.clone(),
            scenario,
            created: Instant::now(),
            owner_key: key,
        };
        book.insert(pidx.clone(), attempt);
        book.aliases.insert(purchase_order_id, pidx.clone());
        fault
    };
    if fault == Some(Fault::Timeout) {
        tokio::time::sleep(st.config().timeout_delay).await;
    }
    axum::Json(InitiateBody {
        payment_url: payment_url(&st, &pidx),
        pidx,
        expires_at,
        expires_in: expires_in.as_secs(),
    })
    .into_response()
}

/// `98XXXXX004`.
fn mask_mobile(m: &str) -> String {
    let chars: Vec<char> = m.chars().collect();
    if chars.len() <= 5 {
        return m.to_owned();
    }
    let head: String = chars[..2].iter().collect();
    let tail: String = chars[chars.len() - 3..].iter().collect();
    format!("{head}{}{tail}", "X".repeat(chars.len() - 5))
}

/// Payer details for a `pay`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payer {
    #[serde(default)]
    mobile: Option<String>,
    #[serde(default)]
    via_bank: Option<bool>,
}

/// The callback URL with the documented parameters.
fn callback_url(a: &KhaltiAttempt, status: &str, txn: &str, mobile: &str, amount: i64) -> String {
    let amount = amount.to_string();
    let mut pairs: Vec<(&str, &str)> = vec![
        ("pidx", &a.pidx),
        ("txnId", txn),
        ("amount", &amount),
        ("total_amount", &amount),
        ("status", status),
        ("mobile", mobile),
        ("tidx", txn),
        ("purchase_order_id", &a.purchase_order_id),
        ("purchase_order_name", &a.purchase_order_name),
        ("transaction_id", txn),
    ];
    for (k, v) in &a.merchant_extras {
        pairs.push((k, v));
    }
    with_query(&a.return_url, &pairs)
}

/// A customer action, or a control call resolving a pending payment.
fn act(
    st: &SimState,
    a: &mut KhaltiAttempt,
    action: Action,
    payer: &Payer,
) -> Result<Option<String>, String> {
    a.refresh(st);
    let tampered = a.scenario.is(Outcome::TamperedCallback);
    if a.status == PENDING {
        match action {
            Action::Pay => {
                a.status = COMPLETED.into();
                if a.transaction_id.is_none() {
                    a.transaction_id = Some(random_string(ALNUM, 22));
                }
            }
            Action::Cancel => a.status = USER_CANCELED.into(),
            Action::Fail => a.status = EXPIRED.into(),
        }
        a.pending_calls_left = None;
        return Ok(None);
    }
    if a.status != INITIATED {
        return Err(format!(
            "the payment is {}; only an Initiated payment can be acted on",
            a.status
        ));
    }
    let url = match action {
        Action::Pay => {
            let mobile = payer
                .mobile
                .clone()
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| TEST_PAYERS[1].to_owned());
            a.mobile = Some(mobile.clone());
            a.via_bank = payer.via_bank.unwrap_or(false);
            let masked = mask_mobile(&mobile);
            if a.scenario.is(Outcome::PendingThenSuccess) || a.scenario.is(Outcome::Ambiguous) {
                a.status = PENDING.into();
                if a.scenario.is(Outcome::PendingThenSuccess) {
                    a.pending_calls_left = Some(a.scenario.pending_calls(st.config()));
                }
                callback_url(a, PENDING, "", &masked, a.amount)
            } else {
                a.status = COMPLETED.into();
                let txn = random_string(ALNUM, 22);
                a.transaction_id = Some(txn.clone());
                callback_url(a, COMPLETED, &txn, &masked, a.amount)
            }
        }
        Action::Cancel => {
            a.status = USER_CANCELED.into();
            callback_url(a, USER_CANCELED, "", "", a.amount)
        }
        Action::Fail => {
            a.status = EXPIRED.into();
            callback_url(a, EXPIRED, "", "", a.amount)
        }
    };
    let url = if tampered {
        // Claims a completed payment with an altered amount; lookup tells
        // the truth.
        let txn = a
            .transaction_id
            .clone()
            .unwrap_or_else(|| random_string(ALNUM, 22));
        callback_url(
            a,
            COMPLETED,
            &txn,
            &mask_mobile(TEST_PAYERS[1]),
            a.amount.saturating_add(100),
        )
    } else {
        url
    };
    a.last_callback_url = Some(url.clone());
    Ok(Some(url))
}

/// The lookup answer, in Khalti's field order.
#[derive(Serialize)]
struct LookupBody {
    pidx: String,
    total_amount: i64,
    status: String,
    transaction_id: Option<String>,
    fee: i64,
    refunded: bool,
}

async fn lookup(State(st): State<SimState>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match authenticate(&st, &headers) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let body = match request_body(&headers, &body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let pidx = match body.get("pidx") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => {
            let mut e = Map::new();
            add_error(&mut e, "pidx", "This field may not be blank.");
            return validation_error(e);
        }
        _ => {
            let mut e = Map::new();
            add_error(&mut e, "pidx", "This field is required.");
            return validation_error(e);
        }
    };
    let not_found = || detail_error(StatusCode::NOT_FOUND, "Not found.");
    let fault = {
        let mut book = st.khalti();
        match book.attempts.get_mut(&pidx) {
            Some(a) if a.owner_key == key => a.scenario.take_fault(FaultOn::Status),
            _ => return not_found(),
        }
    };
    match fault {
        Some(Fault::ServerError) => return server_error(),
        Some(Fault::Timeout) => tokio::time::sleep(st.config().timeout_delay).await,
        None => {}
    }
    let mut book = st.khalti();
    let Some(a) = book.attempts.get_mut(&pidx) else {
        return not_found();
    };
    a.lookups += 1;
    a.refresh(&st);
    if a.status == PENDING
        && let Some(left) = a.pending_calls_left
    {
        if left == 0 {
            a.status = COMPLETED.into();
            a.pending_calls_left = None;
            if a.transaction_id.is_none() {
                a.transaction_id = Some(random_string(ALNUM, 22));
            }
        } else {
            a.pending_calls_left = Some(left - 1);
        }
    }
    let shows_txn = matches!(a.status.as_str(), COMPLETED | REFUNDED | PARTIALLY_REFUNDED);
    let answer = LookupBody {
        pidx: a.pidx.clone(),
        total_amount: a.amount,
        status: a.status.clone(),
        transaction_id: if shows_txn {
            a.transaction_id.clone()
        } else {
            None
        },
        // Khalti's fee once paid: the configured stand-in rate.
        fee: if shows_txn {
            super::fee_of(a.amount, st.config().khalti_fee_bps)
        } else {
            a.fee
        },
        refunded: a.refunded_paisa > 0,
    };
    let code = if matches!(a.status.as_str(), EXPIRED | USER_CANCELED) {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    (code, axum::Json(answer)).into_response()
}

async fn refund(
    State(st): State<SimState>,
    Path(txn): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = match authenticate(&st, &headers) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let body = match request_body(&headers, &body) {
        Ok(b) => b,
        Err(r) => return r,
    };

    let (answer, fault) = {
        let mut book = st.khalti();
        let Some((pidx, order)) = book
            .attempts
            .values()
            .find(|a| a.owner_key == key && a.transaction_id.as_deref() == Some(txn.as_str()))
            .map(|a| (a.pidx.clone(), a.purchase_order_id.clone()))
        else {
            return detail_error(StatusCode::NOT_FOUND, "Transaction not found.");
        };
        let fault =
            book.refund_presets
                .take_refund_fault(&[pidx.as_str(), order.as_str(), txn.as_str()]);
        let Some(a) = book.attempts.get_mut(&pidx) else {
            return detail_error(StatusCode::NOT_FOUND, "Transaction not found.");
        };
        a.refund_calls += 1;
        let answer = match fault {
            Some(RefundFault::ServerError) => server_error(),
            Some(RefundFault::Failure) => {
                detail_error(StatusCode::BAD_REQUEST, "Refund not allowed")
            }
            Some(RefundFault::Timeout) | None => {
                match apply_refund(a, &body, fault == Some(RefundFault::Timeout)) {
                    Ok(()) => axum::Json(json!({"detail": "Transaction refund successful."}))
                        .into_response(),
                    Err(r) => r,
                }
            }
        };
        (answer, fault)
    };
    // The refund (if any) is already applied: only the answer is late, as
    // when the provider acts and the client gives up waiting.
    if fault == Some(RefundFault::Timeout) {
        tokio::time::sleep(st.config().timeout_delay).await;
    }
    answer
}

/// Validates a refund body against the payment and applies it.
fn apply_refund(
    a: &mut KhaltiAttempt,
    body: &Map<String, Value>,
    timed_out: bool,
) -> Result<(), Response> {
    let amount = match body.get("amount") {
        None | Some(Value::Null) => None,
        Some(v) => match as_integer(v) {
            Some(a) if a > 0 => Some(a),
            _ => {
                let mut e = Map::new();
                add_error(&mut e, "amount", "A valid integer is required.");
                return Err(validation_error(e));
            }
        },
    };
    let mobile = body.get("mobile").and_then(Value::as_str);
    if a.status == REFUNDED {
        return Err(detail_error(
            StatusCode::BAD_REQUEST,
            "Transaction already refunded.",
        ));
    }
    if a.status != COMPLETED && a.status != PARTIALLY_REFUNDED {
        return Err(detail_error(
            StatusCode::BAD_REQUEST,
            &format!("Transaction with status {} cannot be refunded.", a.status),
        ));
    }
    if a.via_bank {
        match mobile {
            None => {
                let mut e = Map::new();
                add_error(
                    &mut e,
                    "mobile",
                    "This field is required for bank transactions.",
                );
                return Err(validation_error(e));
            }
            Some(m) if Some(m) != a.mobile.as_deref() => {
                return Err(detail_error(
                    StatusCode::BAD_REQUEST,
                    "Mobile number does not match the payer.",
                ));
            }
            Some(_) => {}
        }
    }
    let left = a.amount - a.refunded_paisa;
    let amount = amount.unwrap_or(left);
    if amount > left {
        return Err(detail_error(
            StatusCode::BAD_REQUEST,
            &format!("Refund amount exceeds the refundable amount of {left} paisa."),
        ));
    }
    a.refunded_paisa += amount;
    a.refunds.push(KhaltiRefund {
        amount,
        timed_out,
        at: super::now_rfc3339(),
    });
    a.status = if a.refunded_paisa == a.amount {
        REFUNDED.into()
    } else {
        PARTIALLY_REFUNDED.into()
    };
    Ok(())
}

// ---------------------------------------------------------------------------
// The payer page

async fn pay_page(State(st): State<SimState>, RawQuery(query): RawQuery) -> Response {
    let q = parse_form(query.unwrap_or_default().as_bytes());
    let pidx = q.get("pidx").cloned().unwrap_or_default();
    let mut book = st.khalti();
    let Some(a) = book.attempts.get_mut(&pidx) else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Khalti, "No such payment.");
    };
    a.refresh(&st);
    if a.status == INITIATED
        && let Some(action) = a.scenario.auto_action()
    {
        return match act(&st, a, action, &Payer::default()) {
            Ok(Some(url)) => page::redirect(StatusCode::FOUND, &url),
            Ok(None) => page::redirect(StatusCode::SEE_OTHER, &payment_url(&st, &pidx)),
            Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Khalti, &e),
        };
    }
    if a.status != INITIATED {
        return page::html(
            StatusCode::OK,
            page::decided(
                Brand::Khalti,
                &a.purchase_order_id,
                &a.status,
                a.last_callback_url.as_deref(),
            ),
        );
    }
    let options: String = TEST_PAYERS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "<option value={p}{}>{p}</option>",
                if i == 1 { " selected" } else { "" }
            )
        })
        .collect();
    let body = format!(
        "<div class=card><h1>{name}</h1>\
         <div class=amount>Rs. {rupees}</div>\
         <dl><dt>Order</dt><dd>{order}</dd><dt>Amount</dt><dd>{paisa} paisa</dd>\
         <dt>pidx</dt><dd>{pidx}</dd><dt>Expires</dt><dd>{expires}</dd></dl></div>\
         <div class=card><form method=post action=\"{action}\">\
         <input type=hidden name=pidx value=\"{pidx}\">\
         <label for=m>Khalti ID</label><select id=m name=mobile>{options}</select>\
         <label for=pin>MPIN</label><input id=pin name=mpin type=password value=1111 inputmode=numeric>\
         <label for=src>Pay from</label><select id=src name=source>\
         <option value=wallet selected>Khalti wallet</option><option value=bank>Bank (mobile banking)</option></select>\
         <p class=muted>Test MPIN 1111, OTP 987654.</p>\
         <div class=actions>{pay}{fail}{cancel}</div></form></div>",
        name = page::esc(&a.purchase_order_name),
        rupees = page::esc(&format!("{}.{:02}", a.amount / 100, a.amount % 100)),
        order = page::esc(&a.purchase_order_id),
        paisa = a.amount,
        pidx = page::esc(&a.pidx),
        expires = page::esc(&a.expires_at),
        action = page::esc(&format!("{}/khalti/pay/", st.base())),
        pay = page::button("pay", "Pay", "pay"),
        fail = page::button("fail", "Fail (payment not completed)", "fail"),
        cancel = page::button("cancel", "Cancel", "cancel"),
    );
    page::html(
        StatusCode::OK,
        page::layout("Pay with Khalti", Brand::Khalti, &body),
    )
}

async fn pay_act(State(st): State<SimState>, body: Bytes) -> Response {
    let f = parse_form(&body);
    let Some(action) = f.get("action").and_then(|a| Action::parse(a)) else {
        return page::error_page(StatusCode::BAD_REQUEST, Brand::Khalti, "Unknown action.");
    };
    let pidx = f.get("pidx").cloned().unwrap_or_default();
    let payer = Payer {
        mobile: f.get("mobile").cloned(),
        via_bank: Some(f.get("source").map(String::as_str) == Some("bank")),
    };
    let mut book = st.khalti();
    let Some(a) = book.attempts.get_mut(&pidx) else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Khalti, "No such payment.");
    };
    match act(&st, a, action, &payer) {
        Ok(Some(url)) => page::redirect(StatusCode::FOUND, &url),
        Ok(None) => page::redirect(StatusCode::SEE_OTHER, &payment_url(&st, &pidx)),
        Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Khalti, &e),
    }
}

// ---------------------------------------------------------------------------
// Control API

async fn control_next(State(st): State<SimState>, body: Bytes) -> Response {
    let c = match parse_control_next(&body) {
        Ok(c) => c,
        Err(r) => return r,
    };
    axum::Json(st.khalti().control_next(&c)).into_response()
}

async fn control_reset(State(st): State<SimState>) -> Response {
    st.khalti().reset();
    axum::Json(json!({"reset": true})).into_response()
}

async fn control_get(State(st): State<SimState>, Path(reference): Path<String>) -> Response {
    let mut book = st.khalti();
    match book.get_mut(&reference) {
        Some(a) => {
            a.refresh(&st);
            axum::Json(&*a).into_response()
        }
        None => control_error(
            StatusCode::NOT_FOUND,
            "no Khalti payment with that pidx or purchase_order_id",
        ),
    }
}

async fn control_act(
    State(st): State<SimState>,
    Path((reference, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let payer: Payer = if body.iter().all(|b| b.is_ascii_whitespace()) {
        Payer::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => {
                return control_error(StatusCode::BAD_REQUEST, &format!("bad body: {e}"));
            }
        }
    };
    let mut book = st.khalti();
    let Some(a) = book.get_mut(&reference) else {
        return control_error(
            StatusCode::NOT_FOUND,
            "no Khalti payment with that pidx or purchase_order_id",
        );
    };
    if action == "expire" {
        a.refresh(&st);
        if a.status != INITIATED && a.status != PENDING {
            return control_error(
                StatusCode::CONFLICT,
                &format!("the payment is {}", a.status),
            );
        }
        a.status = EXPIRED.into();
        a.pending_calls_left = None;
        return control_acted(&*a, None);
    }
    match Action::parse(&action) {
        Some(kind) => match act(&st, a, kind, &payer) {
            Ok(url) => control_acted(&*a, url),
            Err(e) => control_error(StatusCode::CONFLICT, &e),
        },
        None => control_error(
            StatusCode::NOT_FOUND,
            "unknown action; use pay, fail, cancel or expire",
        ),
    }
}
