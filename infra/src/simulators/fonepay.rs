//! Fonepay (providers.md 3.8): dynamic QR (create, status, websocket,
//! tax-refund report) and the web redirect.
//!
//! Routes (below `/fonepay`):
//! - `POST /api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload`;
//! - `POST /api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrGetStatus`;
//! - `POST /api/merchant/merchantDetailsForThirdParty/thirdPartyPostTaxRefund`;
//! - `GET  /convergent-webSocket-web/merchantEndPoint/{deviceId}/{merchantCode}/Y`
//!   (the `thirdpartyQrWebSocketUrl`, a websocket);
//! - `GET|POST /api/merchantRequest` (web redirect) and
//!   `GET /api/merchantRequest/verificationMerchant` (legacy XML check);
//! - pages: `GET|POST /qr/{prn}` (the QR and the customer's banking app),
//!   `GET|POST /web/{prn}` (the hosted web page);
//! - control: `POST /_control/next`, `POST /_control/reset`,
//!   `GET /_control/attempts/{prn}`,
//!   `POST /_control/attempts/{prn}/scan|pay|fail|cancel|expire` (pay takes
//!   `{"paid_amount": "20.0", "bank": "NICENPKA", "mobile": "98…"}`, all
//!   optional; `paid_amount` makes the web `P_AMT` differ from `R_AMT`).
//!
//! Choices where the notes say UNCONFIRMED: errors are HTTP 406 with
//! `{"documentation":"Merchant request Exception","errorCode":406,"message":…}`
//! (also for a wrong password, "Invalid password"; a format error names
//! the field; a reused `prn` is "Duplicate PRN"; an unknown `prn` on status
//! is "Invalid PRN"); the QR create answers HTTP 200; the `prn` may be up
//! to 50 characters (the docs' table says 20 or 25, their example sends a 36-character UUID); a QR cancel is `failed` like a failure; websocket
//! frames sent before the merchant connects are delivered on connect; the
//! web redirect of a pending or ambiguous payment says `PS=false&RC=failed`
//! (the status API tells the rest); an unpaid web redirect still carries
//! `P_AMT` = the requested amount; a 5xx is Spring's JSON error body.

use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha1::{Digest, Sha1};
use shared::providers::sign;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::page::{self, Brand};
use super::{
    Action, Attempt, Fault, FaultOn, FonepayMerchant, HEX, Outcome, Scenario, SimState,
    control_acted, control_error, java_double, parse_control_next, parse_form, parse_rupees,
    random_string, with_query,
};

pub const SUCCESS: &str = "success";
pub const FAILED: &str = "failed";
pub const PENDING: &str = "pending";

const QR_PATH: &str = "/api/merchant/merchantDetailsForThirdParty";

/// A websocket text frame for one device.
#[derive(Clone, Debug)]
pub struct Frame {
    pub device_id: String,
    pub text: String,
}

/// One Fonepay payment, QR or web, keyed by `prn`.
#[derive(Clone, Debug, Serialize)]
pub struct FonepayAttempt {
    /// `qr` or `web`.
    pub kind: String,
    pub prn: String,
    pub merchant_code: String,
    /// As the merchant sent it (QR `amount`, web `AMT`).
    pub amount: String,
    pub amount_paisa: i64,
    pub remarks1: String,
    pub remarks2: String,
    pub tax_amount: Option<String>,
    pub tax_refund: Option<String>,
    /// Web: `RU`.
    pub return_url: Option<String>,
    pub status: String,
    /// Web: `successful`, `failed` or `cancel` once decided.
    pub web_result: Option<String>,
    pub trace_id: u64,
    /// QR: the websocket device id and the EMV payload.
    pub device_id: Option<String>,
    pub qr_message: Option<String>,
    pub scanned: bool,
    /// Paid, the bank's answer held back (pending / ambiguous).
    pub awaiting_bank: bool,
    pub pending_calls_left: Option<u32>,
    pub payer_bank: Option<String>,
    pub payer_mobile: Option<String>,
    pub paid_amount: Option<String>,
    pub tax_refund_invoices: Vec<String>,
    pub status_calls: u32,
    pub last_callback_url: Option<String>,
    /// Websocket frames sent for this QR.
    pub frames: Vec<String>,
    pub created_at: String,
    scenario: Scenario,
    #[serde(skip)]
    created: Instant,
}

impl Attempt for FonepayAttempt {
    fn scenario_mut(&mut self) -> &mut Scenario {
        &mut self.scenario
    }
}

impl FonepayAttempt {
    fn refresh(&mut self, st: &SimState) {
        if let Some(expiry) = st.config().fonepay_qr_expiry
            && self.kind == "qr"
            && self.status == PENDING
            && !self.awaiting_bank
            && self.created.elapsed() >= expiry
        {
            self.status = FAILED.into();
        }
    }

    fn is_fresh(&self) -> bool {
        self.status == PENDING && !self.awaiting_bank
    }
}

pub(crate) fn routes() -> Router<SimState> {
    Router::new()
        .route(
            &format!("{QR_PATH}/thirdPartyDynamicQrDownload"),
            post(qr_create),
        )
        .route(
            &format!("{QR_PATH}/thirdPartyDynamicQrGetStatus"),
            post(qr_status),
        )
        .route(
            &format!("{QR_PATH}/thirdPartyPostTaxRefund"),
            post(tax_refund),
        )
        .route(
            "/convergent-webSocket-web/merchantEndPoint/{device}/{code}/{flag}",
            get(websocket),
        )
        .route("/api/merchantRequest", get(web_get).post(web_post))
        .route(
            "/api/merchantRequest/verificationMerchant",
            get(verification_merchant),
        )
        .route("/qr/{prn}", get(qr_page).post(qr_page_act))
        .route("/web/{prn}", get(web_page).post(web_page_act))
        .route("/_control/next", post(control_next))
        .route("/_control/reset", post(control_reset))
        .route("/_control/attempts/{prn}", get(control_get))
        .route("/_control/attempts/{prn}/{action}", post(control_act))
}

/// The customer's page of an attempt (QR or web).
pub fn page_url(st: &SimState, a: &FonepayAttempt) -> String {
    format!(
        "{}/fonepay/{}/{}",
        st.base(),
        if a.kind == "web" { "web" } else { "qr" },
        page::path_seg(&a.prn)
    )
}

/// `{"documentation":"Merchant request Exception","errorCode":406,"message":…}`.
fn fonepay_error(message: &str) -> Response {
    (
        StatusCode::NOT_ACCEPTABLE,
        axum::Json(json!({
            "documentation": "Merchant request Exception",
            "errorCode": 406,
            "message": message,
        })),
    )
        .into_response()
}

/// Spring's error body.
fn server_error(path: &str) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        axum::Json(json!({
            "timestamp": super::now_rfc3339(),
            "status": 500,
            "error": "Internal Server Error",
            "path": path,
        })),
    )
        .into_response()
}

fn merchant(st: &SimState, code: &str) -> Option<FonepayMerchant> {
    st.config()
        .fonepay_merchants
        .iter()
        .find(|m| m.merchant_code == code)
        .cloned()
}

/// The merchant index (Fonepay's numeric `merchantId` in frames).
fn merchant_id(st: &SimState, code: &str) -> u64 {
    st.config()
        .fonepay_merchants
        .iter()
        .position(|m| m.merchant_code == code)
        .map_or(70, |i| 70 + i as u64)
}

/// A JSON object body, or an error.
fn json_object(body: &[u8]) -> Result<Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err((
            StatusCode::BAD_REQUEST,
            axum::Json(json!({
                "documentation": "Merchant request Exception",
                "errorCode": 400,
                "message": "Malformed JSON request",
            })),
        )
            .into_response()),
    }
}

/// A field as a string (numbers are accepted too).
fn field(m: &Map<String, Value>, name: &str) -> Option<String> {
    match m.get(name)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The credentials in a QR API body: the merchant, or the error.
fn check_credentials(st: &SimState, m: &Map<String, Value>) -> Result<FonepayMerchant, Response> {
    let code = field(m, "merchantCode").unwrap_or_default();
    let Some(merchant) = merchant(st, &code) else {
        return Err(fonepay_error("Invalid Merchant Code"));
    };
    if field(m, "username").as_deref() != Some(merchant.username.as_str()) {
        return Err(fonepay_error("Invalid username"));
    }
    if field(m, "password").as_deref() != Some(merchant.password.as_str()) {
        return Err(fonepay_error("Invalid password"));
    }
    Ok(merchant)
}

/// Fonepay's amount: digits with at most one `.`, 1-10 characters.
fn valid_amount(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 10 || s.matches('.').count() > 1 {
        return None;
    }
    parse_rupees(s).filter(|p| *p > 0)
}

/// CRC-16/CCITT-FALSE, as EMV QR uses.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for b in data {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn tlv(tag: &str, value: &str) -> String {
    let v: String = value.chars().take(99).collect();
    format!("{tag}{:02}{v}", v.chars().count())
}

/// An EMVCo merchant-presented QR payload with a correct CRC.
fn emv_payload(merchant_code: &str, prn: &str, amount: &str, remarks1: &str) -> String {
    let short = |s: &str| s.chars().take(25).collect::<String>();
    let mut s = String::new();
    s.push_str(&tlv("00", "01"));
    s.push_str(&tlv("01", "12"));
    s.push_str(&tlv(
        "26",
        &format!(
            "{}{}{}",
            tlv("00", "fonepay.com"),
            tlv("01", merchant_code),
            tlv("02", &short(prn))
        ),
    ));
    s.push_str(&tlv("52", "5999"));
    s.push_str(&tlv("53", "524"));
    s.push_str(&tlv("54", amount));
    s.push_str(&tlv("58", "NP"));
    s.push_str(&tlv("59", &short(&format!("SIMULATED {merchant_code}"))));
    s.push_str(&tlv("60", "KATHMANDU"));
    s.push_str(&tlv(
        "62",
        &format!("{}{}", tlv("01", &short(prn)), tlv("08", &short(remarks1))),
    ));
    s.push_str("6304");
    let crc = crc16(s.as_bytes());
    s.push_str(&format!("{crc:04x}"));
    s
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QrCreated {
    message: &'static str,
    qr_message: String,
    status: &'static str,
    status_code: u16,
    success: bool,
    thirdparty_qr_web_socket_url: String,
}

fn new_attempt(kind: &str, prn: &str, merchant_code: &str, trace_id: u64) -> FonepayAttempt {
    FonepayAttempt {
        kind: kind.into(),
        prn: prn.into(),
        merchant_code: merchant_code.into(),
        amount: String::new(),
        amount_paisa: 0,
        remarks1: String::new(),
        remarks2: String::new(),
        tax_amount: None,
        tax_refund: None,
        return_url: None,
        status: PENDING.into(),
        web_result: None,
        trace_id,
        device_id: None,
        qr_message: None,
        scanned: false,
        awaiting_bank: false,
        pending_calls_left: None,
        payer_bank: None,
        payer_mobile: None,
        paid_amount: None,
        tax_refund_invoices: Vec::new(),
        status_calls: 0,
        last_callback_url: None,
        frames: Vec::new(),
        created_at: super::now_rfc3339(),
        scenario: Scenario::default(),
        created: Instant::now(),
    }
}

async fn qr_create(State(st): State<SimState>, body: Bytes) -> Response {
    let m = match json_object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    for name in [
        "amount",
        "remarks1",
        "remarks2",
        "prn",
        "merchantCode",
        "dataValidation",
        "username",
        "password",
    ] {
        if field(&m, name).is_none_or(|v| v.is_empty()) {
            return fonepay_error(&format!("{name} is required"));
        }
    }
    let merchant = match check_credentials(&st, &m) {
        Ok(mer) => mer,
        Err(r) => return r,
    };
    let get = |k: &str| field(&m, k).unwrap_or_default();
    let (amount, prn, remarks1, remarks2) =
        (get("amount"), get("prn"), get("remarks1"), get("remarks2"));
    let Some(amount_paisa) = valid_amount(&amount) else {
        return fonepay_error("Invalid amount");
    };
    // The docs' own example PRN is a 36-character UUID; the status API
    // allows 50.
    if prn.chars().count() > 50 {
        return fonepay_error("Invalid prn");
    }
    for (name, v) in [("remarks1", &remarks1), ("remarks2", &remarks2)] {
        if v.chars().count() > 25 {
            return fonepay_error(&format!("Invalid {name}"));
        }
    }
    let tax_amount = field(&m, "taxAmount").filter(|s| !s.is_empty());
    let tax_refund = field(&m, "taxRefund").filter(|s| !s.is_empty());
    let dv_ok = match (&tax_amount, &tax_refund) {
        (None, None) => sign::fonepay_verify(
            &merchant.secret_key,
            &[&amount, &prn, &merchant.merchant_code, &remarks1, &remarks2],
            &get("dataValidation"),
        ),
        (ta, tr) => {
            let ta = ta.clone().unwrap_or_default();
            let tr = tr.clone().unwrap_or_default();
            sign::fonepay_verify(
                &merchant.secret_key,
                &[
                    &amount,
                    &prn,
                    &merchant.merchant_code,
                    &remarks1,
                    &remarks2,
                    &ta,
                    &tr,
                ],
                &get("dataValidation"),
            )
        }
    };
    if !dv_ok {
        return fonepay_error("Data Validation Failed");
    }
    let tax_paisa = match &tax_amount {
        Some(t) => match parse_rupees(t) {
            Some(p) if p <= amount_paisa => Some(p),
            _ => return fonepay_error("Invalid taxAmount"),
        },
        None => None,
    };
    if let Some(tr) = &tax_refund {
        match (parse_rupees(tr), tax_paisa) {
            (Some(r), Some(t)) if r <= t => {}
            _ => return fonepay_error("Invalid taxRefund"),
        }
    }

    let device_id = format!("T{}", random_string(HEX, 32));
    let (fault, response) = {
        let mut book = st.fonepay();
        if book.attempts.contains_key(&prn) && st.config().reject_duplicate_references {
            return fonepay_error("Duplicate PRN");
        }
        let mut scenario = book.presets.take(&[prn.as_str()]);
        let fault = scenario.take_fault(FaultOn::Initiate);
        if fault == Some(Fault::ServerError) {
            book.presets.give_back(&prn, scenario);
            return server_error(&format!("{QR_PATH}/thirdPartyDynamicQrDownload"));
        }
        let trace_id = 17_000 + book.next_counter();
        let qr_message = emv_payload(&merchant.merchant_code, &prn, &amount, &remarks1);
        let mut a = new_attempt("qr", &prn, &merchant.merchant_code, trace_id);
        a.amount = amount.clone();
        a.amount_paisa = amount_paisa;
        a.remarks1 = remarks1;
        a.remarks2 = remarks2;
        a.tax_amount = tax_amount;
        a.tax_refund = tax_refund;
        a.device_id = Some(device_id.clone());
        a.qr_message = Some(qr_message.clone());
        a.scenario = scenario;
        // A preset outcome: the customer scans and acts at once.
        if let Some(action) = a.scenario.auto_action() {
            // A fresh QR always accepts an action.
            let _ = act(&st, &mut a, action, &PayOpts::default());
        }
        book.insert(prn.clone(), a);
        let response = QrCreated {
            message: "successfull",
            qr_message,
            status: "CREATED",
            status_code: 201,
            success: true,
            thirdparty_qr_web_socket_url: format!(
                "{}/fonepay/convergent-webSocket-web/merchantEndPoint/{}/{}/Y",
                st.ws_base(),
                device_id,
                page::path_seg(&merchant.merchant_code)
            ),
        };
        (fault, response)
    };
    if fault == Some(Fault::Timeout) {
        tokio::time::sleep(st.config().timeout_delay).await;
    }
    axum::Json(response).into_response()
}

/// Optional payer details for a `pay`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PayOpts {
    #[serde(default)]
    paid_amount: Option<String>,
    #[serde(default)]
    bank: Option<String>,
    #[serde(default)]
    mobile: Option<String>,
}

/// Records a websocket frame and sends it to a connected merchant.
fn emit(st: &SimState, a: &mut FonepayAttempt, text: String) {
    let Some(device_id) = a.device_id.clone() else {
        return;
    };
    if a.scenario.silent_websocket {
        return;
    }
    a.frames.push(text.clone());
    // No receiver is fine: the websocket is only a hint.
    let _ = st.fonepay_frames().send(Frame { device_id, text });
}

fn verification_frame(st: &SimState, a: &FonepayAttempt) -> String {
    #[derive(Serialize)]
    struct Verified {
        success: bool,
        message: &'static str,
        #[serde(rename = "qrVerified")]
        qr_verified: bool,
    }
    let inner = serde_json::to_string(&Verified {
        success: true,
        message: "VERIFIED",
        qr_verified: true,
    })
    .unwrap_or_default();
    outer_frame(st, a, inner)
}

fn payment_frame(st: &SimState, a: &FonepayAttempt, paid: bool, amount_paisa: i64) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Payment<'a> {
        trace_id: u64,
        remarks1: &'a str,
        remarks2: &'a str,
        transaction_date: String,
        product_number: &'a str,
        amount: String,
        message: &'static str,
        success: bool,
        commission_type: &'static str,
        commission_amount: f64,
        total_calculated_amount: f64,
        payment_success: bool,
    }
    let amount = if amount_paisa == a.amount_paisa {
        a.amount.clone()
    } else {
        java_double(amount_paisa)
    };
    let inner = serde_json::to_string(&Payment {
        trace_id: a.trace_id,
        remarks1: &a.remarks1,
        remarks2: &a.remarks2,
        transaction_date: super::nepal_now()
            .format("%b %-d, %Y %-I:%M:%S %p")
            .to_string(),
        product_number: &a.prn,
        amount,
        message: if paid {
            "Request Complete"
        } else {
            "Request Failed"
        },
        success: true,
        commission_type: "CHARGE",
        // Rupees with at most two decimals, as Fonepay sends it.
        commission_amount: if paid {
            super::fee_of(amount_paisa, st.config().fonepay_commission_bps) as f64 / 100.0
        } else {
            0.0
        },
        total_calculated_amount: amount_paisa as f64 / 100.0,
        payment_success: paid,
    })
    .unwrap_or_default();
    outer_frame(st, a, inner)
}

fn outer_frame(st: &SimState, a: &FonepayAttempt, transaction_status: String) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Outer<'a> {
        merchant_id: u64,
        device_id: &'a str,
        transaction_status: String,
    }
    serde_json::to_string(&Outer {
        merchant_id: merchant_id(st, &a.merchant_code),
        device_id: a.device_id.as_deref().unwrap_or_default(),
        transaction_status,
    })
    .unwrap_or_default()
}

fn scan(st: &SimState, a: &mut FonepayAttempt) {
    if !a.scanned {
        a.scanned = true;
        let f = verification_frame(st, a);
        emit(st, a, f);
    }
}

/// Marks the payment paid and tells the websocket.
fn settle(st: &SimState, a: &mut FonepayAttempt, paid: bool) {
    a.status = if paid { SUCCESS } else { FAILED }.into();
    a.awaiting_bank = false;
    a.pending_calls_left = None;
    let f = payment_frame(st, a, paid, a.amount_paisa);
    emit(st, a, f);
}

/// A customer action (or a control call resolving a held payment).
/// Returns where the browser goes (web flow only).
fn act(
    st: &SimState,
    a: &mut FonepayAttempt,
    action: Action,
    opts: &PayOpts,
) -> Result<Option<String>, String> {
    a.refresh(st);
    if a.status == PENDING && a.awaiting_bank {
        settle(st, a, action == Action::Pay);
        return Ok(None);
    }
    if !a.is_fresh() {
        return Err(format!(
            "the payment is {}; only a pending payment can be acted on",
            a.status
        ));
    }
    let tampered = a.scenario.is(Outcome::TamperedCallback);
    if a.kind == "qr" {
        scan(st, a);
    }
    let held = a.scenario.is(Outcome::PendingThenSuccess) || a.scenario.is(Outcome::Ambiguous);
    match action {
        Action::Pay => {
            a.payer_bank = Some(opts.bank.clone().unwrap_or_else(|| "NICENPKA".into()));
            a.payer_mobile = Some(opts.mobile.clone().unwrap_or_else(|| "9841845631".into()));
            a.paid_amount = opts.paid_amount.clone();
            if held {
                a.awaiting_bank = true;
                if a.scenario.is(Outcome::PendingThenSuccess) {
                    a.pending_calls_left = Some(a.scenario.pending_calls(st.config()));
                }
            } else {
                settle(st, a, true);
            }
        }
        Action::Fail | Action::Cancel => settle(st, a, false),
    }
    if tampered && a.kind == "qr" {
        // The websocket claims success with an altered amount; the status
        // API tells the truth.
        let f = payment_frame(st, a, true, a.amount_paisa + 100);
        emit(st, a, f);
    }
    if a.kind != "web" {
        return Ok(None);
    }
    let secret = merchant(st, &a.merchant_code)
        .map(|m| m.secret_key)
        .unwrap_or_default();
    let (ps, rc) = match (action, a.status.as_str()) {
        (Action::Pay, SUCCESS) => ("true", "successful"),
        (Action::Cancel, _) => ("false", "cancel"),
        _ => ("false", "failed"),
    };
    a.web_result = Some(rc.to_owned());
    let paid = a.status == SUCCESS;
    let bc = if paid {
        a.payer_bank.clone().unwrap_or_else(|| "N/A".into())
    } else {
        "N/A".into()
    };
    let ini = if paid {
        a.payer_mobile.clone().unwrap_or_else(|| "N/A".into())
    } else {
        "N/A".into()
    };
    let p_amt = a
        .paid_amount
        .clone()
        .unwrap_or_else(|| java_double(a.amount_paisa));
    let uid = a.trace_id.to_string();
    let url = if tampered {
        // Success claimed with an altered R_AMT; the DV is over the true
        // values, so it does not match.
        let altered = java_double(a.amount_paisa + 100);
        let dv = sign::fonepay_data_validation(
            &secret,
            &[
                &a.prn,
                &a.merchant_code,
                "true",
                "successful",
                &uid,
                "NICENPKA",
                "9841845631",
                &p_amt,
                &a.amount,
            ],
        )
        .to_ascii_uppercase();
        web_return_url(
            a,
            [
                "true",
                "successful",
                &uid,
                "NICENPKA",
                "9841845631",
                &p_amt,
                &altered,
                &dv,
            ],
        )
    } else {
        let dv = sign::fonepay_data_validation(
            &secret,
            &[
                &a.prn,
                &a.merchant_code,
                ps,
                rc,
                &uid,
                &bc,
                &ini,
                &p_amt,
                &a.amount,
            ],
        )
        .to_ascii_uppercase();
        web_return_url(a, [ps, rc, &uid, &bc, &ini, &p_amt, &a.amount, &dv])
    };
    a.last_callback_url = Some(url.clone());
    Ok(Some(url))
}

/// `RU?PRN=&PID=&PS=&RC=&UID=&BC=&INI=&P_AMT=&R_AMT=&DV=`.
fn web_return_url(a: &FonepayAttempt, v: [&str; 8]) -> String {
    with_query(
        a.return_url.as_deref().unwrap_or_default(),
        &[
            ("PRN", &a.prn),
            ("PID", &a.merchant_code),
            ("PS", v[0]),
            ("RC", v[1]),
            ("UID", v[2]),
            ("BC", v[3]),
            ("INI", v[4]),
            ("P_AMT", v[5]),
            ("R_AMT", v[6]),
            ("DV", v[7]),
        ],
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusBody {
    fonepay_trace_id: u64,
    merchant_code: String,
    payment_status: String,
    prn: String,
}

async fn qr_status(State(st): State<SimState>, body: Bytes) -> Response {
    let m = match json_object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    for name in [
        "prn",
        "merchantCode",
        "dataValidation",
        "username",
        "password",
    ] {
        if field(&m, name).is_none_or(|v| v.is_empty()) {
            return fonepay_error(&format!("{name} is required"));
        }
    }
    let merchant = match check_credentials(&st, &m) {
        Ok(mer) => mer,
        Err(r) => return r,
    };
    let prn = field(&m, "prn").unwrap_or_default();
    let dv = field(&m, "dataValidation").unwrap_or_default();
    if !sign::fonepay_verify(&merchant.secret_key, &[&prn, &merchant.merchant_code], &dv) {
        return fonepay_error("Data Validation Failed");
    }
    let fault = {
        let mut book = st.fonepay();
        match book.attempts.get_mut(&prn) {
            Some(a) if a.merchant_code == merchant.merchant_code => {
                a.scenario.take_fault(FaultOn::Status)
            }
            _ => return fonepay_error("Invalid PRN"),
        }
    };
    match fault {
        Some(Fault::ServerError) => {
            return server_error(&format!("{QR_PATH}/thirdPartyDynamicQrGetStatus"));
        }
        Some(Fault::Timeout) => tokio::time::sleep(st.config().timeout_delay).await,
        None => {}
    }
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn) else {
        return fonepay_error("Invalid PRN");
    };
    a.status_calls += 1;
    a.refresh(&st);
    if a.status == PENDING
        && a.awaiting_bank
        && let Some(left) = a.pending_calls_left
    {
        if left == 0 {
            settle(&st, a, true);
        } else {
            a.pending_calls_left = Some(left - 1);
        }
    }
    axum::Json(StatusBody {
        fonepay_trace_id: a.trace_id,
        merchant_code: a.merchant_code.clone(),
        payment_status: a.status.clone(),
        prn: a.prn.clone(),
    })
    .into_response()
}

async fn tax_refund(State(st): State<SimState>, body: Bytes) -> Response {
    let m = match json_object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let names = [
        "fonepayTraceId",
        "transactionAmount",
        "merchantPRN",
        "invoiceNumber",
        "invoiceDate",
        "merchantCode",
        "dataValidation",
        "username",
        "password",
    ];
    for name in names {
        if field(&m, name).is_none_or(|v| v.is_empty()) {
            return fonepay_error(&format!("{name} is required"));
        }
    }
    let merchant = match check_credentials(&st, &m) {
        Ok(mer) => mer,
        Err(r) => return r,
    };
    let get = |k: &str| field(&m, k).unwrap_or_default();
    let (trace, amount, prn, invoice, date) = (
        get("fonepayTraceId"),
        get("transactionAmount"),
        get("merchantPRN"),
        get("invoiceNumber"),
        get("invoiceDate"),
    );
    if !sign::fonepay_verify(
        &merchant.secret_key,
        &[
            &trace,
            &prn,
            &invoice,
            &date,
            &amount,
            &merchant.merchant_code,
        ],
        &get("dataValidation"),
    ) {
        return fonepay_error("Data Validation Failed");
    }
    let mut book = st.fonepay();
    if book
        .attempts
        .values()
        .any(|a| a.tax_refund_invoices.contains(&invoice))
    {
        return fonepay_error("Invoice Number already exists.");
    }
    let Some(a) = book.attempts.get_mut(&prn).filter(|a| {
        a.merchant_code == merchant.merchant_code
            && a.status == SUCCESS
            && a.trace_id.to_string() == trace
    }) else {
        return fonepay_error("Invalid PRN");
    };
    a.tax_refund_invoices.push(invoice);
    axum::Json(json!({
        "fonepayTraceId": a.trace_id,
        "message": "Tax Refund Request Sucess",
        "success": true,
    }))
    .into_response()
}

// ---------------------------------------------------------------------------
// The web redirect

async fn web_get(State(st): State<SimState>, RawQuery(query): RawQuery) -> Response {
    web_request(st, parse_form(query.unwrap_or_default().as_bytes())).await
}

async fn web_post(State(st): State<SimState>, RawQuery(query): RawQuery, body: Bytes) -> Response {
    let mut params = parse_form(&body);
    for (k, v) in parse_form(query.unwrap_or_default().as_bytes()) {
        params.entry(k).or_insert(v);
    }
    web_request(st, params).await
}

fn web_error(message: &str) -> Response {
    page::error_page(StatusCode::BAD_REQUEST, Brand::Fonepay, message)
}

/// MM/DD/YYYY.
fn valid_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[2] == b'/'
        && b[5] == b'/'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 2 || i == 5 || c.is_ascii_digit())
}

async fn web_request(st: SimState, p: std::collections::HashMap<String, String>) -> Response {
    let names = [
        "PID", "MD", "PRN", "AMT", "CRN", "DT", "R1", "R2", "RU", "DV",
    ];
    for name in names {
        if p.get(name).is_none_or(|v| v.is_empty()) {
            return web_error(&format!("{name} is required"));
        }
    }
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    let (pid, md, prn, amt, crn, dt, r1, r2, ru) = (
        get("PID"),
        get("MD"),
        get("PRN"),
        get("AMT"),
        get("CRN"),
        get("DT"),
        get("R1"),
        get("R2"),
        get("RU"),
    );
    let Some(merchant) = merchant(&st, &pid) else {
        return web_error("Invalid Merchant Code");
    };
    let len = |s: &str| s.chars().count();
    let amount_paisa = parse_rupees(&amt).filter(|a| *a > 0 && amt.len() <= 18);
    let problem = if md != "P" {
        Some("MD must be P")
    } else if !(3..=25).contains(&len(&prn)) {
        Some("PRN must be 3 to 25 characters")
    } else if amount_paisa.is_none() {
        Some("Invalid AMT")
    } else if crn != "NPR" {
        Some("CRN must be NPR")
    } else if !valid_date(&dt) {
        Some("DT must be MM/DD/YYYY")
    } else if len(&r1) > 160 {
        Some("R1 is longer than 160 characters")
    } else if len(&r2) > 50 {
        Some("R2 is longer than 50 characters")
    } else if len(&ru) > 150 || reqwest::Url::parse(&ru).is_err() {
        Some("Invalid RU")
    } else {
        None
    };
    if let Some(problem) = problem {
        return web_error(problem);
    }
    if !sign::fonepay_verify(
        &merchant.secret_key,
        &[&pid, &md, &prn, &amt, &crn, &dt, &r1, &r2, &ru],
        &get("DV"),
    ) {
        return web_error("Data Validation Failed");
    }
    let fault = {
        let mut book = st.fonepay();
        if let Some(existing) = book.attempts.get(&prn) {
            let same = existing.kind == "web" && existing.is_fresh() && existing.amount == amt;
            if same {
                return page::redirect(StatusCode::SEE_OTHER, &page_url(&st, existing));
            }
            if st.config().reject_duplicate_references {
                return web_error("Duplicate PRN");
            }
        }
        let mut scenario = book.presets.take(&[prn.as_str()]);
        let fault = scenario.take_fault(FaultOn::Initiate);
        if fault == Some(Fault::ServerError) {
            book.presets.give_back(&prn, scenario);
            return server_error("/api/merchantRequest");
        }
        let trace_id = 17_000 + book.next_counter();
        let mut a = new_attempt("web", &prn, &pid, trace_id);
        a.amount = amt;
        a.amount_paisa = amount_paisa.unwrap_or_default();
        a.remarks1 = r1;
        a.remarks2 = r2;
        a.return_url = Some(ru);
        a.scenario = scenario;
        book.insert(prn.clone(), a);
        fault
    };
    if fault == Some(Fault::Timeout) {
        tokio::time::sleep(st.config().timeout_delay).await;
    }
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn) else {
        return web_error("the payment vanished");
    };
    if let Some(action) = a.scenario.auto_action() {
        match act(&st, a, action, &PayOpts::default()) {
            Ok(Some(url)) => return page::redirect(StatusCode::FOUND, &url),
            Ok(None) => {}
            Err(e) => return web_error(&e),
        }
    }
    let url = page_url(&st, a);
    page::redirect(StatusCode::SEE_OTHER, &url)
}

/// The pre-2020 server check: XML with `<success>` and `<message>`.
async fn verification_merchant(State(st): State<SimState>, RawQuery(query): RawQuery) -> Response {
    let q = parse_form(query.unwrap_or_default().as_bytes());
    let get = |k: &str| q.get(k).cloned().unwrap_or_default();
    let (prn, pid, bid, amt, uid, dv) = (
        get("PRN"),
        get("PID"),
        get("BID"),
        get("AMT"),
        get("UID"),
        get("DV"),
    );
    let xml = |ok: bool, message: &str| {
        let mut resp = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><response><success>{ok}</success><message>{}</message></response>",
            page::esc(message)
        )
        .into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/xml"),
        );
        resp
    };
    let Some(merchant) = merchant(&st, &pid) else {
        return xml(false, "Invalid Merchant Code");
    };
    if !sign::fonepay_verify(&merchant.secret_key, &[&pid, &amt, &prn, &bid, &uid], &dv) {
        return xml(false, "Data Validation Failed");
    }
    let book = st.fonepay();
    match book.attempts.get(&prn) {
        Some(a)
            if a.merchant_code == pid
                && a.trace_id.to_string() == uid
                && parse_rupees(&amt) == Some(a.amount_paisa) =>
        {
            if a.status == SUCCESS {
                xml(true, "successful")
            } else {
                xml(false, &format!("Payment {}", a.status))
            }
        }
        _ => xml(false, "Invalid transaction"),
    }
}

// ---------------------------------------------------------------------------
// Pages

fn qr_svg(payload: &str) -> String {
    match qrcode::QrCode::new(payload.as_bytes()) {
        Ok(code) => {
            let svg = code
                .render::<qrcode::render::svg::Color<'_>>()
                .min_dimensions(240, 240)
                .quiet_zone(true)
                .build();
            match svg.find("<svg") {
                Some(i) => svg[i..].to_owned(),
                None => svg,
            }
        }
        Err(_) => String::new(),
    }
}

async fn qr_page(State(st): State<SimState>, Path(prn): Path<String>) -> Response {
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn).filter(|a| a.kind == "qr") else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Fonepay, "No such QR.");
    };
    a.refresh(&st);
    let payload = a.qr_message.clone().unwrap_or_default();
    let buttons = if a.is_fresh() {
        format!(
            "<form method=post action=\"{action}\"><p class=muted>These buttons stand in for the customer's banking app.</p>\
             <div class=actions>{scan}{pay}{fail}</div></form>",
            action = page::esc(&page_url(&st, a)),
            scan = if a.scanned {
                String::new()
            } else {
                page::button("scan", "Scan (verify QR)", "neutral")
            },
            pay = page::button("pay", "Pay", "pay"),
            fail = page::button("fail", "Fail", "fail"),
        )
    } else if a.awaiting_bank {
        format!(
            "<form method=post action=\"{action}\"><p class=muted>Paid; the bank's answer is held back.</p>\
             <div class=actions>{pay}{fail}</div></form>",
            action = page::esc(&page_url(&st, a)),
            pay = page::button("pay", "Bank confirms", "pay"),
            fail = page::button("fail", "Bank declines", "fail"),
        )
    } else {
        String::new()
    };
    let body = format!(
        "<div class=card><h1>Scan to pay {merchant}</h1><div class=amount>Rs. {amount}</div>\
         <div class=qr>{svg}</div>\
         <dl><dt>PRN</dt><dd>{prn}</dd><dt>Remarks</dt><dd>{r1} / {r2}</dd>\
         <dt>Status</dt><dd><span class=status>{status}</span>{scanned}</dd></dl>\
         <details open><summary>QR payload</summary><pre>{payload}</pre></details></div>\
         <div class=card>{buttons}</div>",
        merchant = page::esc(&a.merchant_code),
        amount = page::esc(&a.amount),
        svg = qr_svg(&payload),
        prn = page::esc(&a.prn),
        r1 = page::esc(&a.remarks1),
        r2 = page::esc(&a.remarks2),
        status = page::esc(&a.status),
        scanned = if a.scanned { " (scanned)" } else { "" },
        payload = page::esc(&payload),
    );
    page::html(
        StatusCode::OK,
        page::layout("Fonepay QR", Brand::Fonepay, &body),
    )
}

async fn qr_page_act(State(st): State<SimState>, Path(prn): Path<String>, body: Bytes) -> Response {
    let f = parse_form(&body);
    let action = f.get("action").cloned().unwrap_or_default();
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn).filter(|a| a.kind == "qr") else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Fonepay, "No such QR.");
    };
    let result = if action == "scan" {
        if a.is_fresh() {
            scan(&st, a);
            Ok(None)
        } else {
            Err(format!("the payment is {}", a.status))
        }
    } else {
        match Action::parse(&action) {
            Some(kind) => act(&st, a, kind, &PayOpts::default()),
            None => Err("Unknown action.".to_owned()),
        }
    };
    match result {
        Ok(_) => page::redirect(StatusCode::SEE_OTHER, &page_url(&st, a)),
        Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Fonepay, &e),
    }
}

async fn web_page(State(st): State<SimState>, Path(prn): Path<String>) -> Response {
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn).filter(|a| a.kind == "web") else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Fonepay, "No such payment.");
    };
    // A scenario set after the redirect: the customer acts on arrival.
    if a.is_fresh()
        && let Some(action) = a.scenario.auto_action()
    {
        return match act(&st, a, action, &PayOpts::default()) {
            Ok(Some(url)) => page::redirect(StatusCode::FOUND, &url),
            Ok(None) => page::redirect(StatusCode::SEE_OTHER, &page_url(&st, a)),
            Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Fonepay, &e),
        };
    }
    if !a.is_fresh() {
        return page::html(
            StatusCode::OK,
            page::decided(
                Brand::Fonepay,
                &a.prn,
                &a.status,
                a.last_callback_url.as_deref(),
            ),
        );
    }
    let body = format!(
        "<div class=card><h1>Pay {merchant}</h1><div class=amount>Rs. {amount}</div>\
         <dl><dt>PRN</dt><dd>{prn}</dd><dt>For</dt><dd>{r1}</dd><dt>Info</dt><dd>{r2}</dd></dl></div>\
         <div class=card><form method=post action=\"{action}\">\
         <label for=bank>Bank</label><select id=bank name=bank>\
         <option value=NICENPKA selected>NIC Asia Bank</option><option value=NARBNPKA>Nabil Bank</option>\
         <option value=GLBBNPKA>Global IME Bank</option><option value=esewa>eSewa</option></select>\
         <label for=m>Mobile</label><input id=m name=mobile value=9841845631 inputmode=numeric>\
         <label for=pa>Amount actually paid (a discount makes it differ)</label>\
         <input id=pa name=paid_amount value=\"{paid}\" inputmode=decimal>\
         <div class=actions>{pay}{fail}{cancel}</div></form></div>",
        merchant = page::esc(&a.merchant_code),
        amount = page::esc(&a.amount),
        prn = page::esc(&a.prn),
        r1 = page::esc(&a.remarks1),
        r2 = page::esc(&a.remarks2),
        action = page::esc(&page_url(&st, a)),
        paid = page::esc(&java_double(a.amount_paisa)),
        pay = page::button("pay", "Pay", "pay"),
        fail = page::button("fail", "Fail", "fail"),
        cancel = page::button("cancel", "Cancel", "cancel"),
    );
    page::html(
        StatusCode::OK,
        page::layout("Pay with Fonepay", Brand::Fonepay, &body),
    )
}

async fn web_page_act(
    State(st): State<SimState>,
    Path(prn): Path<String>,
    body: Bytes,
) -> Response {
    let f = parse_form(&body);
    let Some(action) = f.get("action").and_then(|a| Action::parse(a)) else {
        return page::error_page(StatusCode::BAD_REQUEST, Brand::Fonepay, "Unknown action.");
    };
    let opts = PayOpts {
        paid_amount: f
            .get("paid_amount")
            .filter(|v| parse_rupees(v).is_some())
            .cloned(),
        bank: f.get("bank").filter(|v| !v.is_empty()).cloned(),
        mobile: f.get("mobile").filter(|v| !v.is_empty()).cloned(),
    };
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn).filter(|a| a.kind == "web") else {
        return page::error_page(StatusCode::NOT_FOUND, Brand::Fonepay, "No such payment.");
    };
    match act(&st, a, action, &opts) {
        Ok(Some(url)) => page::redirect(StatusCode::FOUND, &url),
        Ok(None) => page::redirect(StatusCode::SEE_OTHER, &page_url(&st, a)),
        Err(e) => page::error_page(StatusCode::CONFLICT, Brand::Fonepay, &e),
    }
}

// ---------------------------------------------------------------------------
// The websocket (RFC 6455, just what Fonepay's notifications need)

async fn websocket(
    State(st): State<SimState>,
    Path((device, code, _flag)): Path<(String, String, String)>,
    mut req: Request,
) -> Response {
    let headers = req.headers();
    let is_upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (true, Some(key)) = (is_upgrade, key) else {
        return (StatusCode::BAD_REQUEST, "a websocket upgrade is required").into_response();
    };
    let (rx, backlog, silent) =
        {
            let book = st.fonepay();
            let Some(a) = book.attempts.values().find(|a| {
                a.device_id.as_deref() == Some(device.as_str()) && a.merchant_code == code
            }) else {
                return (StatusCode::NOT_FOUND, "unknown device").into_response();
            };
            (
                st.fonepay_frames().subscribe(),
                a.frames.clone(),
                a.scenario.silent_websocket,
            )
        };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            serve_socket(TokioIo::new(upgraded), device, rx, backlog, silent).await;
        }
    });
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let accept = STANDARD.encode(sha.finalize());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn serve_socket<S>(
    io: S,
    device: String,
    mut rx: tokio::sync::broadcast::Receiver<Frame>,
    backlog: Vec<String>,
    silent: bool,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(io);
    // Client frames are read on their own task (a read is not
    // cancellation-safe); pings and the close come back here.
    let (ctl_tx, mut ctl_rx) = tokio::sync::mpsc::channel::<(u8, Vec<u8>)>(8);
    let reader_task = tokio::spawn(async move {
        loop {
            match read_frame(&mut reader).await {
                Ok((0x8, payload)) => {
                    let _ = ctl_tx.send((0x8, payload)).await;
                    return;
                }
                Ok((0x9, payload)) => {
                    if ctl_tx.send((0x9, payload)).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    let _ = ctl_tx.send((0x8, Vec::new())).await;
                    return;
                }
            }
        }
    });
    if !silent {
        for text in backlog {
            if write_frame(&mut writer, 0x1, text.as_bytes())
                .await
                .is_err()
            {
                reader_task.abort();
                return;
            }
        }
    }
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Ok(frame) if frame.device_id == device && !silent => {
                    if write_frame(&mut writer, 0x1, frame.text.as_bytes()).await.is_err() {
                        break;
                    }
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            ctl = ctl_rx.recv() => match ctl {
                Some((0x9, payload)) => {
                    if write_frame(&mut writer, 0xA, &payload).await.is_err() {
                        break;
                    }
                }
                Some(_) | None => {
                    let _ = write_frame(&mut writer, 0x8, &[]).await;
                    break;
                }
            },
        }
    }
    reader_task.abort();
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await?;
    let opcode = head[0] & 0x0f;
    let masked = head[1] & 0x80 != 0;
    let mut len = u64::from(head[1] & 0x7f);
    if len == 126 {
        let mut b = [0u8; 2];
        r.read_exact(&mut b).await?;
        len = u64::from(u16::from_be_bytes(b));
    } else if len == 127 {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).await?;
        len = u64::from_be_bytes(b);
    }
    if len > 64 * 1024 {
        return Err(std::io::Error::other("frame too large"));
    }
    let mut mask = [0u8; 4];
    if masked {
        r.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((opcode, payload))
}

async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    opcode: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(0x80 | opcode);
    let n = payload.len();
    if n < 126 {
        out.push(n as u8);
    } else if n <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(payload);
    w.write_all(&out).await?;
    w.flush().await
}

// ---------------------------------------------------------------------------
// Control API

async fn control_next(State(st): State<SimState>, body: Bytes) -> Response {
    let c = match parse_control_next(&body) {
        Ok(c) => c,
        Err(r) => return r,
    };
    axum::Json(st.fonepay().control_next(&c)).into_response()
}

async fn control_reset(State(st): State<SimState>) -> Response {
    st.fonepay().reset();
    axum::Json(json!({"reset": true})).into_response()
}

async fn control_get(State(st): State<SimState>, Path(prn): Path<String>) -> Response {
    let mut book = st.fonepay();
    match book.attempts.get_mut(&prn) {
        Some(a) => {
            a.refresh(&st);
            axum::Json(&*a).into_response()
        }
        None => control_error(StatusCode::NOT_FOUND, "no Fonepay payment with that prn"),
    }
}

async fn control_act(
    State(st): State<SimState>,
    Path((prn, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let opts: PayOpts = if body.iter().all(|b| b.is_ascii_whitespace()) {
        PayOpts::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(o) => o,
            Err(e) => return control_error(StatusCode::BAD_REQUEST, &format!("bad body: {e}")),
        }
    };
    let mut book = st.fonepay();
    let Some(a) = book.attempts.get_mut(&prn) else {
        return control_error(StatusCode::NOT_FOUND, "no Fonepay payment with that prn");
    };
    match action.as_str() {
        "scan" => {
            if a.kind != "qr" || !a.is_fresh() {
                return control_error(StatusCode::CONFLICT, "only a pending QR can be scanned");
            }
            scan(&st, a);
            control_acted(&*a, None)
        }
        "expire" => {
            a.refresh(&st);
            if !a.is_fresh() {
                return control_error(
                    StatusCode::CONFLICT,
                    &format!("the payment is {}", a.status),
                );
            }
            a.status = FAILED.into();
            control_acted(&*a, None)
        }
        other => match Action::parse(other) {
            Some(kind) => match act(&st, a, kind, &opts) {
                Ok(url) => control_acted(&*a, url),
                Err(e) => control_error(StatusCode::CONFLICT, &e),
            },
            None => control_error(
                StatusCode::NOT_FOUND,
                "unknown action; use scan, pay, fail, cancel or expire",
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_ccitt_false() {
        assert_eq!(crc16(b"123456789"), 0x29B1);
    }

    #[test]
    fn emv_payload_has_a_correct_crc() {
        let p = emv_payload("NBQM", "prn-1", "14", "test1");
        assert!(p.starts_with("000201010212"));
        let (body, crc) = p.split_at(p.len() - 4);
        assert!(body.ends_with("6304"));
        assert_eq!(
            u16::from_str_radix(crc, 16).ok(),
            Some(crc16(body.as_bytes()))
        );
    }
}
