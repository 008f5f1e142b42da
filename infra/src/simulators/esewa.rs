//! eSewa ePay v2 (providers.md 1.7): the browser form POST, the wallet
//! page, the signed success redirect and the status API.
//!
//! Routes (below `/esewa`):
//! - `POST /api/epay/main/v2/form`: the merchant's auto-submitted form;
//!   on success a 303 to the wallet page (or, with a preset outcome,
//!   straight to the callback);
//! - `GET /api/epay/transaction/status/?product_code=&total_amount=&transaction_uuid=`;
//! - `GET|POST /wallet/{transaction_uuid}`: the wallet page and its buttons;
//! - control: `POST /_control/next`, `POST /_control/reset`,
//!   `GET /_control/attempts/{uuid}`,
//!   `POST /_control/attempts/{uuid}/pay|fail|cancel|expire`,
//!   `POST /_control/attempts/{uuid}/refund` (`{"amount_paisa": n}` or `{}`
//!   for the whole: the merchant portal's refund, which eSewa's API lacks).
//!
//! Choices where the notes say UNCONFIRMED: errors are HTTP 400 with
//! `{"code": 0, "error_message": ...}` (`"ES104"` / "Invalid payload
//! signature" for a bad signature); a reused `transaction_uuid` is refused
//! unless the same pending session is posted again; `fail` ends the
//! session as `NOT_FOUND` and `cancel` as `CANCELED`; both go to
//! `failure_url` with no parameters, as do pending and ambiguous payments;
//! the status API answers `NOT_FOUND` for an unknown id or a different
//! amount; `data` is percent-encoded in the success URL, appended with `&`
//! when the URL already has a query.

use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::json;
use shared::providers::sign;

use super::page::{self, Brand};
use super::{
    Action, Attempt, Fault, FaultOn, Outcome, Scenario, SimState, control_acted, control_error,
    java_double, parse_control_next, parse_form, parse_rupees, random_string, with_query,
};

/// The 11 form fields, all required and non-empty.
const FORM_FIELDS: [&str; 11] = [
    "amount",
    "tax_amount",
    "product_service_charge",
    "product_delivery_charge",
    "total_amount",
    "transaction_uuid",
    "product_code",
    "success_url",
    "failure_url",
    "signed_field_names",
    "signature",
];

/// The fields every request signature must cover.
const MANDATORY_SIGNED: [&str; 3] = ["total_amount", "transaction_uuid", "product_code"];

/// The success callback's own signed field list.
pub const CALLBACK_SIGNED_FIELD_NAMES: &str =
    "transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names";

pub const PENDING: &str = "PENDING";
pub const COMPLETE: &str = "COMPLETE";
pub const FULL_REFUND: &str = "FULL_REFUND";
pub const PARTIAL_REFUND: &str = "PARTIAL_REFUND";
pub const AMBIGUOUS: &str = "AMBIGUOUS";
pub const NOT_FOUND: &str = "NOT_FOUND";
pub const CANCELED: &str = "CANCELED";

/// One eSewa session, keyed by `transaction_uuid`.
#[derive(Clone, Debug, Serialize)]
pub struct EsewaAttempt {
    pub transaction_uuid: String,
    pub product_code: String,
    pub amount: String,
    pub tax_amount: String,
    pub product_service_charge: String,
    pub product_delivery_charge: String,
    /// As the merchant sent it.
    pub total_amount: String,
    pub total_paisa: i64,
    pub success_url: String,
    pub failure_url: String,
    pub status: String,
    /// eSewa's reference (`transaction_code` in the callback, `ref_id` in
    /// the status API).
    pub ref_id: Option<String>,
    pub refunded_paisa: i64,
    /// Paid but still answering `PENDING` for this many status calls.
    pub pending_calls_left: Option<u32>,
    pub status_calls: u32,
    pub last_callback_url: Option<String>,
    pub created_at: String,
    scenario: Scenario,
    #[serde(skip)]
    created: Instant,
}

impl Attempt for EsewaAttempt {
    fn scenario_mut(&mut self) -> &mut Scenario {
        &mut self.scenario
    }
}

impl EsewaAttempt {
    /// Nobody acted on it within the session timeout: `NOT_FOUND`.
    fn refresh(&mut self, st: &SimState) {
        if self.status == PENDING
            && self.pending_calls_left.is_none()
            && self.ref_id.is_none()
            && self.created.elapsed() >= st.config().esewa_session_timeout
        {
            self.status = NOT_FOUND.into();
        }
    }

    fn is_fresh(&self) -> bool {
        self.status == PENDING && self.pending_calls_left.is_none() && self.ref_id.is_none()
    }
}

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route("/api/epay/main/v2/form", post(form))
        .route("/api/epay/main/v2/form/", post(form))
        .route("/api/epay/transaction/status/", get(status))
        .route("/api/epay/transaction/status", get(status))
        .route("/wallet/{uuid}", get(wallet).post(wallet_act))
        .route("/_control/next", post(control_next))
        .route("/_control/reset", post(control_reset))
        .route("/_control/attempts/{uuid}", get(control_get))
        .route("/_control/attempts/{uuid}/{action}", post(control_act))
}

/// eSewa's error body.
fn esewa_error(status: StatusCode, code: serde_json::Value, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"code": code, "error_message": message})),
    )
        .into_response()
}

fn bad_request(message: &str) -> Response {
    esewa_error(StatusCode::BAD_REQUEST, json!(0), message)
}

fn unavailable() -> Response {
    esewa_error(
        StatusCode::SERVICE_UNAVAILABLE,
        json!(0),
        "Service is currently unavailable",
    )
}

fn secret_for(st: &SimState, product_code: &str) -> Option<String> {
    st.config()
        .esewa_merchants
        .iter()
        .find(|m| m.product_code == product_code)
        .map(|m| m.secret_key.clone())
}

fn wallet_url(st: &SimState, uuid: &str) -> String {
    format!("{}/esewa/wallet/{}", st.base(), page::path_seg(uuid))
}

async fn form(
    State(st): State<SimState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    body: Bytes,
) -> Response {
    // eSewa reads request parameters: fields in the POST's query string
    // count as the form body's do (the body's first where both are sent).
    let mut f = parse_form(&body);
    for (k, v) in parse_form(query.unwrap_or_default().as_bytes()) {
        f.entry(k).or_insert(v);
    }
    for name in FORM_FIELDS {
        if f.get(name).is_none_or(|v| v.trim().is_empty()) {
            return bad_request(&format!("Invalid payload: {name} is required"));
        }
    }
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    let product_code = get("product_code");
    let Some(secret) = secret_for(&st, &product_code) else {
        return bad_request("Unable to fetch merchant key. Please try again later.");
    };
    let uuid = get("transaction_uuid");
    if !uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return bad_request(
            "Invalid payload: transaction_uuid may contain only letters, digits and '-'",
        );
    }
    let mut parts = [0i64; 4];
    for (i, name) in [
        "amount",
        "tax_amount",
        "product_service_charge",
        "product_delivery_charge",
    ]
    .iter()
    .enumerate()
    {
        match parse_rupees(&get(name)) {
            Some(p) => parts[i] = p,
            None => return bad_request(&format!("Invalid payload: {name} must be an amount")),
        }
    }
    let Some(total) = parse_rupees(&get("total_amount")) else {
        return bad_request("Invalid payload: total_amount must be an amount");
    };
    if parts[0] <= 0 {
        return bad_request("Invalid payload: amount must be greater than 0");
    }
    if parts.iter().sum::<i64>() != total {
        return bad_request(
            "Invalid payload: total_amount must equal amount + tax_amount + product_service_charge + product_delivery_charge",
        );
    }
    for url_field in ["success_url", "failure_url"] {
        let u = get(url_field);
        if reqwest::Url::parse(&u).is_err() {
            return bad_request(&format!("Invalid payload: {url_field} must be a URL"));
        }
    }

    // The signature over signed_field_names, with the submitted strings.
    let signed_names = get("signed_field_names");
    let names: Vec<&str> = signed_names.split(',').collect();
    if MANDATORY_SIGNED.iter().any(|m| !names.contains(m)) {
        return esewa_error(
            StatusCode::BAD_REQUEST,
            json!("ES104"),
            "Invalid payload signature",
        );
    }
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(names.len());
    for n in &names {
        match f.get(*n) {
            Some(v) => pairs.push((n, v.as_str())),
            None => {
                return esewa_error(
                    StatusCode::BAD_REQUEST,
                    json!("ES104"),
                    "Invalid payload signature",
                );
            }
        }
    }
    let message = sign::esewa_message(&pairs);
    if !sign::esewa_verify(&secret, &message, &get("signature")) {
        return esewa_error(
            StatusCode::BAD_REQUEST,
            json!("ES104"),
            "Invalid payload signature",
        );
    }

    // A reused transaction_uuid.
    let fault = {
        let mut book = st.esewa();
        if let Some(existing) = book.attempts.get(&uuid) {
            let same = existing.is_fresh()
                && existing.total_paisa == total
                && existing.product_code == product_code;
            if same {
                return page::redirect(StatusCode::SEE_OTHER, &wallet_url(&st, &uuid));
            }
            if st.config().reject_duplicate_references {
                return bad_request("Duplicate transaction_uuid: it was used before");
            }
        }
        let mut scenario = book.presets.take(&[uuid.as_str()]);
        let fault = scenario.take_fault(FaultOn::Initiate);
        if fault == Some(Fault::ServerError) {
            book.presets.give_back(&uuid, scenario);
            drop(book);
            return unavailable();
        }
        let attempt = EsewaAttempt {
            transaction_uuid: uuid.clone(),
            product_code: product_code.clone(),
            amount: get("amount"),
            tax_amount: get("tax_amount"),
            product_service_charge: get("product_service_charge"),
            product_delivery_charge: get("product_delivery_charge"),
            total_amount: get("total_amount"),
            total_paisa: total,
            success_url: get("success_url"),
            failure_url: get("failure_url"),
            status: PENDING.into(),
            ref_id: None,
            refunded_paisa: 0,
            pending_calls_left: None,
            status_calls: 0,
            last_callback_url: None,
            created_at: super::now_rfc3339(),
            scenario,
            created: Instant::now(),
        };
        book.insert(uuid.clone(), attempt);
        fault
    };
    if fault == Some(Fault::Timeout) {
        tokio::time::sleep(st.config().timeout_delay).await;
    }

    // A preset outcome: the customer acts at once.
    let mut book = st.esewa();
    let Some(a) = book.attempts.get_mut(&uuid) else {
        return bad_request("the session vanished");
    };
    if let Some(action) = a.scenario.auto_action() {
        match act(&st, a, action) {
            Ok(Some(url)) => return page::redirect(StatusCode::FOUND, &url),
            Ok(None) => {}
            Err(e) => return bad_request(&e),
        }
    }
    drop(book);
    page::redirect(StatusCode::SEE_OTHER, &wallet_url(&st, &uuid))
}

/// A customer action (or a control call resolving a pending/ambiguous
/// session). Returns where the browser goes, if anywhere.
fn act(st: &SimState, a: &mut EsewaAttempt, action: Action) -> Result<Option<String>, String> {
    a.refresh(st);
    let secret = secret_for(st, &a.product_code).unwrap_or_default();
    let tampered = a.scenario.is(Outcome::TamperedCallback);

    // Resolving a paid-but-pending or ambiguous session: no browser.
    let paid_pending = a.status == PENDING && a.pending_calls_left.is_some();
    if paid_pending || a.status == AMBIGUOUS {
        match action {
            Action::Pay => a.status = COMPLETE.into(),
            Action::Fail | Action::Cancel => a.status = CANCELED.into(),
        }
        a.pending_calls_left = None;
        return Ok(None);
    }
    if !a.is_fresh() {
        return Err(format!(
            "the session is {}; only a PENDING session can be acted on",
            a.status
        ));
    }

    let url = match action {
        Action::Pay => {
            a.ref_id = Some(random_string(super::UPPER_ALNUM, 7));
            if a.scenario.is(Outcome::PendingThenSuccess) {
                a.pending_calls_left = Some(a.scenario.pending_calls(st.config()));
                a.failure_url.clone()
            } else if a.scenario.is(Outcome::Ambiguous) {
                a.status = AMBIGUOUS.into();
                a.failure_url.clone()
            } else {
                a.status = COMPLETE.into();
                success_redirect(a, &secret, false)
            }
        }
        Action::Fail => {
            a.status = NOT_FOUND.into();
            a.failure_url.clone()
        }
        Action::Cancel => {
            a.status = CANCELED.into();
            a.failure_url.clone()
        }
    };
    let url = if tampered {
        success_redirect(a, &secret, true)
    } else {
        url
    };
    a.last_callback_url = Some(url.clone());
    Ok(Some(url))
}

/// `success_url?data=<base64 JSON>`, signed over its own field list with
/// `total_amount` rendered like a Java double. `tampered`: the amount is
/// altered after signing (and the status claims `COMPLETE` whatever the
/// truth).
fn success_redirect(a: &mut EsewaAttempt, secret: &str, tampered: bool) -> String {
    let code = a
        .ref_id
        .clone()
        .unwrap_or_else(|| random_string(super::UPPER_ALNUM, 7));
    let total = java_double(a.total_paisa);
    let message = sign::esewa_message(&[
        ("transaction_code", &code),
        ("status", COMPLETE),
        ("total_amount", &total),
        ("transaction_uuid", &a.transaction_uuid),
        ("product_code", &a.product_code),
        ("signed_field_names", CALLBACK_SIGNED_FIELD_NAMES),
    ]);
    let signature = sign::esewa_signature(secret, &message);
    // As eSewa does: amounts of 1,000 and more shown with thousands
    // separators, signed without them.
    let shown_total = grouped(&if tampered {
        java_double(a.total_paisa + 100)
    } else {
        total
    });
    let data = callback_json(
        &code,
        COMPLETE,
        &shown_total,
        &a.transaction_uuid,
        &a.product_code,
        &signature,
    );
    with_query(&a.success_url, &[("data", &STANDARD.encode(data))])
}

/// `6600.0` as eSewa shows it in a callback: `6,600.0` (a plain decimal
/// only; anything else as it is).
fn grouped(amount: &str) -> String {
    let (int_part, rest) = match amount.split_once('.') {
        Some((i, f)) => (i, format!(".{f}")),
        None => (amount, String::new()),
    };
    if int_part.len() <= 3 || !int_part.bytes().all(|b| b.is_ascii_digit()) {
        return amount.to_owned();
    }
    let mut out = String::with_capacity(amount.len() + int_part.len() / 3);
    for (i, c) in int_part.chars().enumerate() {
        if i > 0 && (int_part.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out + &rest
}

/// The callback JSON with eSewa's key order (serde_json's map would sort
/// the keys).
fn callback_json(
    code: &str,
    status: &str,
    total: &str,
    uuid: &str,
    product_code: &str,
    signature: &str,
) -> String {
    #[derive(Serialize)]
    struct Data<'a> {
        transaction_code: &'a str,
        status: &'a str,
        total_amount: &'a str,
        transaction_uuid: &'a str,
        product_code: &'a str,
        signed_field_names: &'a str,
        signature: &'a str,
    }
    serde_json::to_string(&Data {
        transaction_code: code,
        status,
        total_amount: total,
        transaction_uuid: uuid,
        product_code,
        signed_field_names: CALLBACK_SIGNED_FIELD_NAMES,
        signature,
    })
    .unwrap_or_default()
}

/// The status API's answer, in eSewa's field order.
#[derive(Serialize)]
struct StatusBody {
    product_code: String,
    transaction_uuid: String,
    total_amount: f64,
    status: String,
    ref_id: Option<String>,
}

async fn status(State(st): State<SimState>, RawQuery(query): RawQuery) -> Response {
    let q = parse_form(query.unwrap_or_default().as_bytes());
    let mut fields = Vec::new();
    for name in ["product_code", "total_amount", "transaction_uuid"] {
        match q.get(name).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            Some(v) => fields.push(v.to_owned()),
            None => return bad_request(&format!("{name} is required")),
        }
    }
    let (product_code, total_text, uuid) = (&fields[0], &fields[1], &fields[2]);
    // Lenient: "1,000.0" as well as "1000".
    let Some(total) = parse_rupees(&total_text.replace(',', "")) else {
        return bad_request("total_amount must be an amount");
    };

    let fault = {
        let mut book = st.esewa();
        book.attempts
            .get_mut(uuid.as_str())
            .filter(|a| a.product_code == *product_code)
            .and_then(|a| a.scenario.take_fault(FaultOn::Status))
    };
    match fault {
        Some(Fault::ServerError) => return unavailable(),
        Some(Fault::Timeout) => tokio::time::sleep(st.config().timeout_delay).await,
        None => {}
    }

    let mut book = st.esewa();
    let found = book
        .attempts
        .get_mut(uuid.as_str())
        .filter(|a| a.product_code == *product_code && a.total_paisa == total);
    let body = match found {
        None => StatusBody {
            product_code: product_code.clone(),
            transaction_uuid: uuid.clone(),
            total_amount: total as f64 / 100.0,
            status: NOT_FOUND.into(),
            ref_id: None,
        },
        Some(a) => {
            a.status_calls += 1;
            a.refresh(&st);
            if let Some(left) = a.pending_calls_left {
                if left == 0 {
                    a.status = COMPLETE.into();
                    a.pending_calls_left = None;
                } else {
                    a.pending_calls_left = Some(left - 1);
                }
            }
            let ref_id = match a.status.as_str() {
                PENDING | NOT_FOUND => None,
                _ => a.ref_id.clone(),
            };
            StatusBody {
                product_code: a.product_code.clone(),
                transaction_uuid: a.transaction_uuid.clone(),
                total_amount: a.total_paisa as f64 / 100.0,
                status: a.status.clone(),
                ref_id,
            }
        }
    };
    axum::Json(body).into_response()
}

// ---------------------------------------------------------------------------
// The wallet page

async fn wallet(State(st): State<SimState>, Path(uuid): Path<String>) -> Response {
    let mut book = st.esewa();
    let Some(a) = book.attempts.get_mut(&uuid) else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Esewa, "No such payment.");
    };
    a.refresh(&st);
    // A scenario set after the form POST: the customer acts on arrival.
    if a.is_fresh()
        && let Some(action) = a.scenario.auto_action()
    {
        return match act(&st, a, action) {
            Ok(Some(url)) => page::redirect(StatusCode::FOUND, &url),
            Ok(None) => page::redirect(StatusCode::SEE_OTHER, &wallet_url(&st, &uuid)),
            Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Esewa, &e),
        };
    }
    if !a.is_fresh() {
        return page::html(
            StatusCode::OK,
            page::decided(
                Brand::Esewa,
                &a.transaction_uuid,
                &a.status,
                a.last_callback_url.as_deref(),
            ),
        );
    }
    let rupees = |s: &str| page::esc(s);
    let body = format!(
        "<div class=card><h1>Pay {merchant}</h1>\
         <div class=amount>Rs. {total}</div>\
         <dl><dt>Amount</dt><dd>{amount}</dd><dt>Tax</dt><dd>{tax}</dd>\
         <dt>Service charge</dt><dd>{psc}</dd><dt>Delivery charge</dt><dd>{pdc}</dd>\
         <dt>Transaction</dt><dd>{uuid}</dd></dl></div>\
         <div class=card><form method=post action=\"{action}\">\
         <label for=id>eSewa ID</label><input id=id name=esewa_id value=9806800001 inputmode=numeric>\
         <label for=pw>Password</label><input id=pw name=password type=password value=\"Nepal@123\">\
         <p class=muted>Test IDs 9806800001–9806800005, password Nepal@123, token 123456.</p>\
         <div class=actions>{pay}{fail}{cancel}</div></form></div>",
        merchant = page::esc(&a.product_code),
        total = rupees(&a.total_amount),
        amount = rupees(&a.amount),
        tax = rupees(&a.tax_amount),
        psc = rupees(&a.product_service_charge),
        pdc = rupees(&a.product_delivery_charge),
        uuid = page::esc(&a.transaction_uuid),
        action = page::esc(&wallet_url(&st, &a.transaction_uuid)),
        pay = page::button("pay", "Pay", "pay"),
        fail = page::button("fail", "Fail (e.g. insufficient balance)", "fail"),
        cancel = page::button("cancel", "Cancel and return to merchant", "cancel"),
    );
    page::html(
        StatusCode::OK,
        page::layout("Pay with eSewa", Brand::Esewa, &body),
    )
}

async fn wallet_act(State(st): State<SimState>, Path(uuid): Path<String>, body: Bytes) -> Response {
    let f = parse_form(&body);
    let Some(action) = f.get("action").and_then(|a| Action::parse(a)) else {
        return page::error_page(StatusCode::BAD_REQUEST, Brand::Esewa, "Unknown action.");
    };
    let mut book = st.esewa();
    let Some(a) = book.attempts.get_mut(&uuid) else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Esewa, "No such payment.");
    };
    match act(&st, a, action) {
        Ok(Some(url)) => page::redirect(StatusCode::FOUND, &url),
        Ok(None) => page::redirect(StatusCode::SEE_OTHER, &wallet_url(&st, &uuid)),
        Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Esewa, &e),
    }
}

// ---------------------------------------------------------------------------
// Control API

async fn control_next(State(st): State<SimState>, body: Bytes) -> Response {
    let c = match parse_control_next(&body) {
        Ok(c) => c,
        Err(r) => return r,
    };
    axum::Json(st.esewa().control_next(&c)).into_response()
}

async fn control_reset(State(st): State<SimState>) -> Response {
    st.esewa().reset();
    axum::Json(json!({"reset": true})).into_response()
}

async fn control_get(State(st): State<SimState>, Path(uuid): Path<String>) -> Response {
    let mut book = st.esewa();
    match book.attempts.get_mut(&uuid) {
        Some(a) => {
            a.refresh(&st);
            axum::Json(&*a).into_response()
        }
        None => control_error(
            StatusCode::NOT_FOUND,
            "no eSewa session with that transaction_uuid",
        ),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RefundBody {
    #[serde(default)]
    amount_paisa: Option<i64>,
}

async fn control_act(
    State(st): State<SimState>,
    Path((uuid, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let mut book = st.esewa();
    let Some(a) = book.attempts.get_mut(&uuid) else {
        return control_error(
            StatusCode::NOT_FOUND,
            "no eSewa session with that transaction_uuid",
        );
    };
    match action.as_str() {
        "expire" => {
            a.refresh(&st);
            if !a.is_fresh() {
                return control_error(
                    StatusCode::CONFLICT,
                    &format!("the session is {}", a.status),
                );
            }
            a.status = NOT_FOUND.into();
            control_acted(&*a, None)
        }
        "refund" => {
            let req: RefundBody = if body.iter().all(|b| b.is_ascii_whitespace()) {
                RefundBody::default()
            } else {
                match serde_json::from_slice(&body) {
                    Ok(r) => r,
                    Err(e) => {
                        return control_error(
                            StatusCode::BAD_REQUEST,
                            &format!("bad refund body: {e}"),
                        );
                    }
                }
            };
            if a.status != COMPLETE && a.status != PARTIAL_REFUND {
                return control_error(
                    StatusCode::CONFLICT,
                    &format!(
                        "only a COMPLETE payment can be refunded; this one is {}",
                        a.status
                    ),
                );
            }
            let left = a.total_paisa - a.refunded_paisa;
            let amount = req.amount_paisa.unwrap_or(left);
            if amount <= 0 || amount > left {
                return control_error(
                    StatusCode::BAD_REQUEST,
                    &format!("amount_paisa must be from 1 to {left}"),
                );
            }
            a.refunded_paisa += amount;
            a.status = if a.refunded_paisa == a.total_paisa {
                FULL_REFUND.into()
            } else {
                PARTIAL_REFUND.into()
            };
            control_acted(&*a, None)
        }
        other => match Action::parse(other) {
            Some(act_kind) => match act(&st, a, act_kind) {
                Ok(url) => control_acted(&*a, url),
                Err(e) => control_error(StatusCode::CONFLICT, &e),
            },
            None => control_error(
                StatusCode::NOT_FOUND,
                "unknown action; use pay, fail, cancel, expire or refund",
            ),
        },
    }
}
