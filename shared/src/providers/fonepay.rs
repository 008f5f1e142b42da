//! Fonepay: the dynamic QR API (JSON, credentials in the body, HMAC-SHA512
//! `dataValidation`), its websocket hints, and the web redirect with its DV
//! (research notes, section 3).
//!
//! - [`Channel::Qr`]: `POST {api}/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload`
//!   with DV over `AMOUNT,PRN,MERCHANT-CODE,REMARKS1,REMARKS2`, answered with
//!   the EMV `qrMessage` and the websocket URL ([`Handoff::Qr`]).
//! - [`Channel::Browser`]: the web redirect `{web}?PID&MD=P&PRN&AMT&CRN=NPR&DT&R1&R2&RU&DV`,
//!   built locally ([`web_payment_url`]); `DT` is today in Nepal
//!   (UTC+05:45), `MM/DD/YYYY`. The return is checked by [`verify_web_return`].
//! - [`ProviderClient::status`]: `thirdPartyDynamicQrGetStatus` with DV over
//!   `PRN,MERCHANT-CODE`; `success`/`failed`/`pending`, anything else
//!   `Ambiguous`. The answer carries no amount (the amount is fixed by the
//!   signed QR). Whether it also answers for web-redirect PRNs is
//!   UNCONFIRMED; it is the only server-to-server check Fonepay documents
//!   (the pre-2020 `verificationMerchant` is not implemented).
//! - Amounts are rupee strings ([`rupees`]); the QR `amount` is at most 10
//!   characters. References: the QR `prn` at most 20 characters, the web
//!   `PRN` 3-25. Remarks are AN 1-25: letters, digits and spaces of the
//!   order name (`remarks1`) and of the reference (`remarks2`). No value may
//!   hold a `,` (the DV joins values with commas).
//! - No customer-refund API: `Unsupported` (refunds are manual).
//! - Errors `{"errorCode":406,"message":"Data Validation Failed",...}` (HTTP
//!   200 or 4xx) are `Rejected` with the code.

use async_trait::async_trait;
use chrono::{FixedOffset, NaiveDate, Utc};
use serde_json::{Map, Value, json};

use super::amount::{parse_rupees, rupees};
use super::transport::{Reply, Transport};
use super::{
    Attempt, CallbackError, Channel, Handoff, ProviderClient, ProviderConfig, ProviderCredentials,
    ProviderError, ProviderState, ProviderStatus, RefundOutcome, StatusQuery, check_amount,
    check_reference, clip, sign,
};
use crate::kinds::Provider;
use crate::money::Paisa;

/// Longest QR `prn` (the PDF's limit; the 2024 doc allows 25).
pub const MAX_QR_PRN_LEN: usize = 20;
/// Web redirect `PRN`: 3-25 characters.
pub const MAX_WEB_PRN_LEN: usize = 25;
/// The QR status check takes a `prn` of up to 50 characters (the docs'
/// own example PRN is a 36-character UUID).
pub const MAX_STATUS_PRN_LEN: usize = 50;
const MAX_QR_AMOUNT_LEN: usize = 10;
const MAX_WEB_AMOUNT_LEN: usize = 18;
const MAX_REMARK_LEN: usize = 25;
const MAX_R1_LEN: usize = 160;
const MAX_R2_LEN: usize = 50;
const MAX_RU_LEN: usize = 150;
/// Nepal Standard Time, UTC+05:45.
const NPT_OFFSET_SECONDS: i32 = 5 * 3600 + 45 * 60;

/// The Fonepay client of one mode.
#[derive(Clone, Debug)]
pub struct FonepayClient {
    config: ProviderConfig,
    transport: Transport,
}

impl FonepayClient {
    pub(crate) fn new(config: &ProviderConfig, transport: Transport) -> Self {
        FonepayClient {
            config: config.clone(),
            transport,
        }
    }
}

struct Creds<'a> {
    merchant_code: &'a str,
    secret_key: &'a str,
    username: &'a str,
    password: &'a str,
}

fn credentials(creds: &ProviderCredentials) -> Result<Creds<'_>, ProviderError> {
    match creds {
        ProviderCredentials::Fonepay {
            merchant_code,
            secret_key,
            username,
            password,
        } => Ok(Creds {
            merchant_code,
            secret_key,
            username,
            password,
        }),
        other => Err(ProviderError::Invalid(format!(
            "{} credentials given to the Fonepay client",
            other.provider().as_str()
        ))),
    }
}

/// A Fonepay `paymentStatus` in our vocabulary.
pub fn map_status(word: &str) -> ProviderState {
    match word.trim().to_ascii_lowercase().as_str() {
        "success" => ProviderState::Paid,
        "failed" => ProviderState::Failed,
        "pending" => ProviderState::Pending,
        _ => ProviderState::Ambiguous,
    }
}

/// Letters, digits and single spaces of `text`, at most `max` characters;
/// `fallback` when nothing is left.
fn remark(text: &str, max: usize, fallback: &str) -> String {
    let kept: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { ' ' })
        .collect();
    let words: Vec<&str> = kept.split_whitespace().collect();
    let joined = words.join(" ");
    let cut: String = joined.chars().take(max).collect();
    let cut = cut.trim().to_owned();
    if cut.is_empty() {
        fallback.to_owned()
    } else {
        cut
    }
}

fn no_comma(what: &str, value: &str) -> Result<(), ProviderError> {
    if value.contains(',') {
        return Err(ProviderError::Invalid(format!(
            "Fonepay {what} must not contain ','"
        )));
    }
    Ok(())
}

/// The DV of a QR create request.
pub fn qr_request_dv(
    secret_key: &str,
    amount: &str,
    prn: &str,
    merchant_code: &str,
    remarks1: &str,
    remarks2: &str,
) -> String {
    sign::fonepay_data_validation(
        secret_key,
        &[amount, prn, merchant_code, remarks1, remarks2],
    )
}

/// The DV of a QR status request.
pub fn qr_status_dv(secret_key: &str, prn: &str, merchant_code: &str) -> String {
    sign::fonepay_data_validation(secret_key, &[prn, merchant_code])
}

/// The values of one web redirect, as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebPayment {
    pub prn: String,
    /// Rupees, e.g. `"30"`.
    pub amount: String,
    /// `MM/DD/YYYY`.
    pub date: String,
    /// Payment description (`R1`, at most 160).
    pub description: String,
    /// Extra information (`R2`, at most 50) or `N/A`.
    pub extra: String,
    /// Our return URL (`RU`, at most 150).
    pub return_url: String,
}

/// Today's date in Nepal as Fonepay's `DT` (`MM/DD/YYYY`).
pub fn nepal_date_today() -> String {
    web_date(
        FixedOffset::east_opt(NPT_OFFSET_SECONDS)
            .map(|tz| Utc::now().with_timezone(&tz).date_naive())
            .unwrap_or_else(|| Utc::now().date_naive()),
    )
}

/// `date` as Fonepay's `DT` (`MM/DD/YYYY`).
pub fn web_date(date: NaiveDate) -> String {
    date.format("%m/%d/%Y").to_string()
}

/// The browser URL of a Fonepay web payment: the 9 parameters and `DV`,
/// HMAC-SHA512 over `PID,MD,PRN,AMT,CRN,DT,R1,R2,RU` (raw values).
pub fn web_payment_url(
    web_url: &str,
    merchant_code: &str,
    secret_key: &str,
    payment: &WebPayment,
) -> Result<String, ProviderError> {
    let prn_len = payment.prn.chars().count();
    if !(3..=MAX_WEB_PRN_LEN).contains(&prn_len) {
        return Err(ProviderError::Invalid(format!(
            "Fonepay web PRN must be 3-{MAX_WEB_PRN_LEN} characters"
        )));
    }
    for (what, value, max) in [
        ("PRN", &payment.prn, MAX_WEB_PRN_LEN),
        ("AMT", &payment.amount, MAX_WEB_AMOUNT_LEN),
        ("DT", &payment.date, 10),
        ("R1", &payment.description, MAX_R1_LEN),
        ("R2", &payment.extra, MAX_R2_LEN),
        ("RU", &payment.return_url, MAX_RU_LEN),
    ] {
        no_comma(what, value)?;
        if value.is_empty() || value.chars().count() > max {
            return Err(ProviderError::Invalid(format!(
                "Fonepay {what} must be 1-{max} characters"
            )));
        }
    }
    let dv = sign::fonepay_data_validation(
        secret_key,
        &[
            merchant_code,
            "P",
            &payment.prn,
            &payment.amount,
            "NPR",
            &payment.date,
            &payment.description,
            &payment.extra,
            &payment.return_url,
        ],
    );
    let mut url = reqwest::Url::parse(web_url)
        .map_err(|e| ProviderError::Invalid(format!("Fonepay web URL: {e}")))?;
    url.query_pairs_mut()
        .append_pair("PID", merchant_code)
        .append_pair("MD", "P")
        .append_pair("PRN", &payment.prn)
        .append_pair("AMT", &payment.amount)
        .append_pair("CRN", "NPR")
        .append_pair("DT", &payment.date)
        .append_pair("R1", &payment.description)
        .append_pair("R2", &payment.extra)
        .append_pair("RU", &payment.return_url)
        .append_pair("DV", &dv);
    Ok(url.into())
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `{errorCode, message}` (or a failed `{success:false, message}`) as
/// `Rejected`; otherwise the HTTP status decides.
fn rejected(reply: &Reply) -> ProviderError {
    if let Some(e) = reply.unavailable() {
        return e;
    }
    let json = reply.json();
    let obj = json.as_ref().and_then(Value::as_object);
    let code = obj
        .and_then(|o| o.get("errorCode").or_else(|| o.get("statusCode")))
        .and_then(text_of);
    let message = obj.and_then(|o| o.get("message")).and_then(text_of);
    match (code, message) {
        (code, Some(message)) => ProviderError::Rejected {
            code: code.unwrap_or_else(|| format!("http_{}", reply.status)),
            message: clip(&message, 200),
        },
        (Some(code), None) => ProviderError::Rejected {
            code,
            message: reply.snippet(),
        },
        (None, None) if reply.is_success() => {
            ProviderError::Protocol(format!("Fonepay answer: {}", reply.snippet()))
        }
        (None, None) => ProviderError::Rejected {
            code: format!("http_{}", reply.status),
            message: reply.snippet(),
        },
    }
}

fn is_error_body(obj: &Map<String, Value>) -> bool {
    obj.contains_key("errorCode") || obj.get("success") == Some(&Value::Bool(false))
}

fn parse_qr_reply(reply: &Reply) -> Result<Handoff, ProviderError> {
    if let Some(e) = reply.unavailable() {
        return Err(e);
    }
    let json = reply.json();
    let obj = json.as_ref().and_then(Value::as_object);
    let qr = obj
        .filter(|o| reply.is_success() && !is_error_body(o))
        .and_then(|o| o.get("qrMessage"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty());
    match (obj, qr) {
        (Some(obj), Some(qr)) => {
            let websocket_url = ["thirdpartyQrWebSocketUrl", "merchantWebSocketUrl"]
                .iter()
                .find_map(|k| obj.get(*k).and_then(Value::as_str))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned);
            Ok(Handoff::Qr {
                qr_message: qr.to_owned(),
                websocket_url,
                provider_ref: None,
            })
        }
        _ => Err(rejected(reply)),
    }
}

fn parse_status_reply(
    reply: &Reply,
    prn: &str,
    merchant_code: &str,
) -> Result<ProviderStatus, ProviderError> {
    if let Some(e) = reply.unavailable() {
        return Err(e);
    }
    let json = reply.json();
    let obj = json
        .as_ref()
        .and_then(Value::as_object)
        .filter(|o| reply.is_success() && !is_error_body(o));
    let status = obj
        .and_then(|o| o.get("paymentStatus"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let (Some(obj), Some(status)) = (obj, status) else {
        return Err(rejected(reply));
    };
    for (field, ours) in [("prn", prn), ("merchantCode", merchant_code)] {
        match obj.get(field).and_then(text_of) {
            Some(theirs) if theirs != ours => {
                return Err(ProviderError::Protocol(format!(
                    "Fonepay answered about {field} {:?}",
                    clip(&theirs, 40)
                )));
            }
            _ => {}
        }
    }
    Ok(ProviderStatus {
        state: map_status(status),
        amount: None,
        provider_ref: obj
            .get("fonepayTraceId")
            .and_then(text_of)
            .filter(|s| !s.is_empty()),
        fee: None,
        raw_status: clip(status, 40),
    })
}

#[async_trait]
impl ProviderClient for FonepayClient {
    fn provider(&self) -> Provider {
        Provider::Fonepay
    }

    async fn initiate(
        &self,
        creds: &ProviderCredentials,
        attempt: &Attempt,
    ) -> Result<Handoff, ProviderError> {
        let c = credentials(creds)?;
        check_amount(attempt.amount)?;
        let amount = rupees(attempt.amount);
        match attempt.channel {
            Channel::Qr => {
                check_reference(&attempt.reference, MAX_QR_PRN_LEN)?;
                if amount.len() > MAX_QR_AMOUNT_LEN {
                    return Err(ProviderError::Invalid(format!(
                        "Fonepay QR amounts are at most {MAX_QR_AMOUNT_LEN} characters"
                    )));
                }
                let remarks1 = remark(&attempt.order_name, MAX_REMARK_LEN, "Payment");
                let remarks2 = remark(&attempt.reference, MAX_REMARK_LEN, "NA");
                let dv = qr_request_dv(
                    c.secret_key,
                    &amount,
                    &attempt.reference,
                    c.merchant_code,
                    &remarks1,
                    &remarks2,
                );
                let body = json!({
                    "amount": amount,
                    "remarks1": remarks1,
                    "remarks2": remarks2,
                    "prn": attempt.reference,
                    "merchantCode": c.merchant_code,
                    "dataValidation": dv,
                    "username": c.username,
                    "password": c.password,
                });
                let request = self
                    .transport
                    .client()?
                    .post(self.config.fonepay_qr_create_url())
                    .header(reqwest::header::ACCEPT, "application/json")
                    .json(&body);
                let reply = self
                    .transport
                    .send(Provider::Fonepay, "qr_create", request)
                    .await?;
                parse_qr_reply(&reply)
            }
            Channel::Browser => {
                check_reference(&attempt.reference, MAX_WEB_PRN_LEN)?;
                let payment = WebPayment {
                    prn: attempt.reference.clone(),
                    amount,
                    date: nepal_date_today(),
                    description: remark(&attempt.order_name, MAX_R1_LEN, "Payment"),
                    extra: remark(&attempt.reference, MAX_R2_LEN, "N/A"),
                    return_url: attempt.return_url.clone(),
                };
                let url = web_payment_url(
                    &self.config.fonepay_web_url,
                    c.merchant_code,
                    c.secret_key,
                    &payment,
                )?;
                Ok(Handoff::Redirect {
                    url,
                    provider_ref: None,
                })
            }
        }
    }

    async fn status(
        &self,
        creds: &ProviderCredentials,
        query: &StatusQuery,
    ) -> Result<ProviderStatus, ProviderError> {
        let c = credentials(creds)?;
        check_reference(&query.reference, MAX_STATUS_PRN_LEN)?;
        let body = json!({
            "prn": query.reference,
            "merchantCode": c.merchant_code,
            "dataValidation": qr_status_dv(c.secret_key, &query.reference, c.merchant_code),
            "username": c.username,
            "password": c.password,
        });
        let request = self
            .transport
            .client()?
            .post(self.config.fonepay_qr_status_url())
            .header(reqwest::header::ACCEPT, "application/json")
            .json(&body);
        let reply = self
            .transport
            .send(Provider::Fonepay, "qr_status", request)
            .await?;
        parse_status_reply(&reply, &query.reference, c.merchant_code)
    }

    async fn refund(
        &self,
        _creds: &ProviderCredentials,
        _provider_ref: &str,
        _amount: Option<Paisa>,
        _mobile: Option<&str>,
    ) -> Result<RefundOutcome, ProviderError> {
        Err(ProviderError::Unsupported(
            "Fonepay has no customer-refund API: refund by hand".into(),
        ))
    }
}

/// A web-redirect return whose DV verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FonepayWebReturn {
    pub prn: String,
    pub merchant_code: String,
    /// `PS=true` and `RC=successful`: check `requested_amount` against the
    /// attempt too.
    pub paid: bool,
    /// `PS` as sent (`true`/`false`).
    pub ps: String,
    /// `RC`: `successful`, `failed` or `cancel`.
    pub response_code: String,
    /// `UID`: Fonepay's trace id, for reconciliation.
    pub trace_id: String,
    /// `BC`: the payer's bank (SWIFT code, `esewa`, or `N/A`).
    pub bank_code: String,
    /// `INI`: the payer's id or mobile, or `N/A`.
    pub initiator: String,
    /// `P_AMT`: what was paid; may differ from the request (discounts).
    pub paid_amount: Paisa,
    /// `R_AMT`: what was requested.
    pub requested_amount: Paisa,
}

const WEB_RETURN_FIELDS: [&str; 9] = [
    "PRN", "PID", "PS", "RC", "UID", "BC", "INI", "P_AMT", "R_AMT",
];

/// Check Fonepay's web return (the query string, without `?`) with the
/// project's credentials: every parameter present once, the uppercase-hex
/// DV over `PRN,PID,PS,RC,UID,BC,INI,P_AMT,R_AMT` (any hex case accepted),
/// and `PID` is the project's merchant code.
pub fn verify_web_return(
    creds: &ProviderCredentials,
    query: &str,
) -> Result<FonepayWebReturn, CallbackError> {
    let ProviderCredentials::Fonepay {
        merchant_code,
        secret_key,
        ..
    } = creds
    else {
        return Err(CallbackError::WrongCredentials);
    };
    let mut values: Vec<(String, String)> = Vec::new();
    for (k, v) in form_urlencoded::parse(query.trim_start_matches('?').as_bytes()) {
        if WEB_RETURN_FIELDS.contains(&k.as_ref()) || k == "DV" {
            if values.iter().any(|(seen, _)| *seen == k) {
                return Err(CallbackError::Malformed(format!("{k} appears twice")));
            }
            values.push((k.into_owned(), v.into_owned()));
        }
    }
    let get = |name: &str| {
        values
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| CallbackError::Malformed(format!("{name} is missing")))
    };
    let mut signed = Vec::with_capacity(WEB_RETURN_FIELDS.len());
    for name in WEB_RETURN_FIELDS {
        signed.push(get(name)?);
    }
    let dv = get("DV")?;
    if !sign::fonepay_verify(secret_key, &signed, dv) {
        return Err(CallbackError::BadSignature);
    }
    let field = |i: usize| signed.get(i).map(|s| (*s).to_owned()).unwrap_or_default();
    let pid = field(1);
    if pid != *merchant_code {
        return Err(CallbackError::MerchantMismatch);
    }
    let amount = |i: usize, name: &str| {
        parse_rupees(&field(i)).map_err(|e| CallbackError::Malformed(format!("{name}: {e}")))
    };
    let ps = field(2);
    let rc = field(3);
    Ok(FonepayWebReturn {
        prn: field(0),
        merchant_code: pid,
        paid: ps.eq_ignore_ascii_case("true") && rc.eq_ignore_ascii_case("successful"),
        ps,
        response_code: rc,
        trace_id: field(4),
        bank_code: field(5),
        initiator: field(6),
        paid_amount: amount(7, "P_AMT")?,
        requested_amount: amount(8, "R_AMT")?,
    })
}

/// A websocket frame from Fonepay: a hint to run the status check now,
/// never proof.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FonepayWsEvent {
    /// The payer scanned the QR.
    Verified { qr_verified: bool },
    /// The payment ended: `payment_success` (not `success`) tells how.
    Payment {
        payment_success: bool,
        trace_id: Option<String>,
        prn: Option<String>,
        amount: Option<Paisa>,
        message: Option<String>,
    },
    /// Anything else.
    Other,
}

fn get_ci<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

fn as_bool(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// Read one websocket text frame. `transactionStatus` is itself JSON in a
/// string (an object is accepted too); keys are matched case-insensitively
/// (`qrVerified` / `QRVerified`).
pub fn parse_ws_frame(text: &str) -> Result<FonepayWsEvent, CallbackError> {
    let outer: Value = serde_json::from_str(text)
        .map_err(|_| CallbackError::Malformed("frame is not JSON".into()))?;
    let Some(outer) = outer.as_object() else {
        return Err(CallbackError::Malformed(
            "frame is not a JSON object".into(),
        ));
    };
    let inner = match get_ci(outer, "transactionStatus") {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map_err(|_| CallbackError::Malformed("transactionStatus is not JSON".into()))?,
        Some(v @ Value::Object(_)) => v.clone(),
        _ => return Ok(FonepayWsEvent::Other),
    };
    let Some(inner) = inner.as_object() else {
        return Err(CallbackError::Malformed(
            "transactionStatus is not an object".into(),
        ));
    };
    if let Some(v) = get_ci(inner, "paymentSuccess") {
        return Ok(FonepayWsEvent::Payment {
            payment_success: as_bool(v),
            trace_id: get_ci(inner, "traceId").and_then(text_of),
            prn: get_ci(inner, "productNumber").and_then(text_of),
            amount: get_ci(inner, "amount")
                .and_then(text_of)
                .and_then(|a| parse_rupees(&a).ok()),
            message: get_ci(inner, "message").and_then(text_of),
        });
    }
    if let Some(v) = get_ci(inner, "qrVerified") {
        return Ok(FonepayWsEvent::Verified {
            qr_verified: as_bool(v),
        });
    }
    Ok(FonepayWsEvent::Other)
}

#[cfg(test)]
mod tests {
    use super::super::ProviderClients;
    use super::super::mock::Mock;
    use super::*;
    use std::time::Duration;

    fn creds() -> ProviderCredentials {
        ProviderCredentials::Fonepay {
            merchant_code: "NBQM".into(),
            secret_key: "a7e3512f5032480a83137793cb2021dc".into(),
            username: "9861101076".into(),
            password: "admin123456".into(),
        }
    }

    fn demo_creds() -> ProviderCredentials {
        ProviderCredentials::Fonepay {
            merchant_code: "fonepay123".into(),
            secret_key: "fonepay".into(),
            username: "bijayk".into(),
            password: "password".into(),
        }
    }

    fn paisa(v: i64) -> Paisa {
        Paisa::new(v).unwrap_or_default()
    }

    fn attempt(channel: Channel) -> Attempt {
        Attempt {
            reference: "01JD5Z3K7QWXYZ123456".into(),
            amount: paisa(1400),
            return_url: "https://gw.example/r/fonepay/att1".into(),
            failure_url: None,
            website_url: "https://shop.example".into(),
            order_name: "Order #42, blue mug".into(),
            customer: None,
            channel,
        }
    }

    fn clients(mock: &Mock, timeout_ms: u64) -> ProviderClients {
        let cfg =
            ProviderConfig::for_base(&mock.base).with_timeout(Duration::from_millis(timeout_ms));
        ProviderClients::new(&cfg).expect("clients")
    }

    #[test]
    fn request_dvs_match_the_published_vectors() {
        let secret = "a7e3512f5032480a83137793cb2021dc";
        let dv = qr_request_dv(
            secret,
            "14",
            "5d76d323-d1f6-4a38-8231-0063f9581c98",
            "NBQM",
            "test1",
            "test2",
        );
        assert!(
            dv.starts_with("43d2f0939e58e038") && dv.ends_with("0eaca7d7"),
            "{dv}"
        );
        let dv = qr_status_dv(secret, "5d76d323-d1f6-4a38-8231-0063f9581c98", "NBQM");
        assert!(
            dv.starts_with("de5fd3bbbd7d36c7") && dv.ends_with("a9b032b7"),
            "{dv}"
        );
        let dv = qr_request_dv("fonepay", "50", "check", "fonepay123", "test1", "test2");
        assert!(
            dv.starts_with("f036eb09c5402a91") && dv.ends_with("c8ac4204"),
            "{dv}"
        );
    }

    #[test]
    fn the_web_request_matches_the_spec_vector() {
        let payment = WebPayment {
            prn: "d1580724437729".into(),
            amount: "30".into(),
            date: "06/27/2017".into(),
            description: "Hello".into(),
            extra: "test".into(),
            return_url:
                "https://devadminapi.fonepay.com/ConvergentMerchantDummyweb/MerchantVerification"
                    .into(),
        };
        let url = web_payment_url(
            "https://dev-clientapi.fonepay.com/api/merchantRequest",
            "fonepay123",
            "fonepay",
            &payment,
        );
        let Ok(url) = url else { panic!("{url:?}") };
        let parsed = reqwest::Url::parse(&url).expect("url");
        assert_eq!(parsed.path(), "/api/merchantRequest");
        let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
        let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "PID", "MD", "PRN", "AMT", "CRN", "DT", "R1", "R2", "RU", "DV"
            ]
        );
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("RU"), payment.return_url);
        assert_eq!(get("DT"), "06/27/2017");
        let dv = get("DV");
        assert!(
            dv.starts_with("147384cc250bf072") && dv.ends_with("2f591b92c0"),
            "{dv}"
        );

        for bad in [
            WebPayment {
                prn: "ab".into(),
                ..payment.clone()
            },
            WebPayment {
                prn: "x".repeat(26),
                ..payment.clone()
            },
            WebPayment {
                description: "a,b".into(),
                ..payment.clone()
            },
            WebPayment {
                return_url: format!("https://x/{}", "y".repeat(150)),
                ..payment.clone()
            },
            WebPayment {
                extra: String::new(),
                ..payment.clone()
            },
        ] {
            assert!(matches!(
                web_payment_url(
                    "https://x/api/merchantRequest",
                    "fonepay123",
                    "fonepay",
                    &bad
                ),
                Err(ProviderError::Invalid(_))
            ));
        }
        assert_eq!(
            web_date(NaiveDate::from_ymd_opt(2017, 6, 27).unwrap_or_default()),
            "06/27/2017"
        );
        assert_eq!(nepal_date_today().len(), 10);
    }

    #[test]
    fn the_web_return_verifies_with_the_computed_vector() {
        let dv = "FD3ECF635F3F92E93760DD756FE6E61F14FA3B3653BDEE85977D0C0369351A87DED1F893C008D0ED54A3EF92BA0FCD9EBE2FB83BD9734B5EA45BFF64ADF512A8";
        let q = format!(
            "PRN=d1580724437729&PID=fonepay123&PS=true&RC=successful&UID=36463&BC=NICENPKA&INI=9841845631&P_AMT=20.0&R_AMT=30&DV={dv}"
        );
        let r = verify_web_return(&demo_creds(), &q);
        assert_eq!(
            r,
            Ok(FonepayWebReturn {
                prn: "d1580724437729".into(),
                merchant_code: "fonepay123".into(),
                paid: true,
                ps: "true".into(),
                response_code: "successful".into(),
                trace_id: "36463".into(),
                bank_code: "NICENPKA".into(),
                initiator: "9841845631".into(),
                paid_amount: paisa(2000),
                requested_amount: paisa(3000),
            })
        );
        // Lowercase hex is accepted; any change to a value is not.
        assert!(verify_web_return(&demo_creds(), &q.replace(dv, &dv.to_ascii_lowercase())).is_ok());
        assert_eq!(
            verify_web_return(&demo_creds(), &q.replace("R_AMT=30", "R_AMT=30.0")),
            Err(CallbackError::BadSignature)
        );
        assert_eq!(
            verify_web_return(&demo_creds(), &q.replace("PS=true", "PS=false")),
            Err(CallbackError::BadSignature)
        );
        assert_eq!(
            verify_web_return(&creds(), &q),
            Err(CallbackError::BadSignature)
        );
        assert!(matches!(
            verify_web_return(&demo_creds(), &q.replace("&UID=36463", "")),
            Err(CallbackError::Malformed(_))
        ));
        assert!(matches!(
            verify_web_return(&demo_creds(), &format!("{q}&PS=false")),
            Err(CallbackError::Malformed(_))
        ));
        let khalti = ProviderCredentials::Khalti {
            secret_key: "k".into(),
        };
        assert_eq!(
            verify_web_return(&khalti, &q),
            Err(CallbackError::WrongCredentials)
        );
        // Signed correctly for another merchant.
        let other = ProviderCredentials::Fonepay {
            merchant_code: "OTHER".into(),
            secret_key: "fonepay".into(),
            username: "u".into(),
            password: "p".into(),
        };
        assert_eq!(
            verify_web_return(&other, &q),
            Err(CallbackError::MerchantMismatch)
        );
        // A cancelled payment verifies but is not paid.
        let values = [
            "d1580724437729",
            "fonepay123",
            "false",
            "cancel",
            "36464",
            "N/A",
            "N/A",
            "0",
            "30",
        ];
        let dv = sign::fonepay_data_validation("fonepay", &values).to_ascii_uppercase();
        let q = format!(
            "PRN=d1580724437729&PID=fonepay123&PS=false&RC=cancel&UID=36464&BC=N%2FA&INI=N%2FA&P_AMT=0&R_AMT=30&DV={dv}"
        );
        let r = verify_web_return(&demo_creds(), &q);
        assert_eq!(r.as_ref().map(|r| r.paid), Ok(false));
        assert_eq!(r.map(|r| r.bank_code), Ok("N/A".to_owned()));
    }

    #[test]
    fn websocket_frames() {
        let verified = r#"{"merchantId":70,"deviceId":"Td35","transactionStatus":"{\"success\":true,\"message\":\"VERIFIED\",\"qrVerified\":true}"}"#;
        assert_eq!(
            parse_ws_frame(verified),
            Ok(FonepayWsEvent::Verified { qr_verified: true })
        );
        let verified_2024 = r#"{"transactionStatus":"{\"success\":true,\"message\":\"VERIFIED\",\"QRVerified\":true}"}"#;
        assert_eq!(
            parse_ws_frame(verified_2024),
            Ok(FonepayWsEvent::Verified { qr_verified: true })
        );
        let paid = r#"{"merchantId":70,"deviceId":"Td35","transactionStatus":"{\"traceId\":17015,\"remarks1\":\"test1\",\"remarks2\":\"test2\",\"transactionDate\":\"Apr 11, 2019 1:43:23 PM\",\"productNumber\":\"5d76d323\",\"amount\":\"14\",\"message\":\"Request Complete\",\"success\":true,\"commissionType\":\"CHARGE\",\"commissionAmount\":0.0,\"totalCalculatedAmount\":14.0,\"paymentSuccess\":true}"}"#;
        assert_eq!(
            parse_ws_frame(paid),
            Ok(FonepayWsEvent::Payment {
                payment_success: true,
                trace_id: Some("17015".into()),
                prn: Some("5d76d323".into()),
                amount: Some(paisa(1400)),
                message: Some("Request Complete".into()),
            })
        );
        // success stays true on failure: paymentSuccess decides.
        let failed = paid.replace(r#"\"paymentSuccess\":true"#, r#"\"paymentSuccess\":false"#);
        assert!(matches!(
            parse_ws_frame(&failed),
            Ok(FonepayWsEvent::Payment {
                payment_success: false,
                ..
            })
        ));
        assert_eq!(parse_ws_frame(r#"{"hello":1}"#), Ok(FonepayWsEvent::Other));
        for junk in [
            "",
            "nope",
            "[1]",
            r#"{"transactionStatus":"{bad"}"#,
            r#"{"transactionStatus":"[1]"}"#,
        ] {
            assert!(
                matches!(parse_ws_frame(junk), Err(CallbackError::Malformed(_))),
                "{junk}"
            );
        }
    }

    #[tokio::test]
    async fn qr_create_posts_the_documented_body() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        mock.reply(
            200,
            r#"{"message":"successfull","qrMessage":"000201010212153137910524005204540000000808280010000000000000000000NBQM520441115303524540514.005802NP5910NBQM6007Kathmandu62270523d1f6-4a38-8231-0063f9581c9863041a5b","status":"CREATED","statusCode":201,"success":true,"thirdpartyQrWebSocketUrl":"wss://dev-ws.fonepay.com/convergent-webSocket-web/merchantEndPoint/Td35588c2d9a647f28f4959f96f905bec/NBQM/Y"}"#,
        );
        let h = c
            .get(Provider::Fonepay)
            .initiate(&creds(), &attempt(Channel::Qr))
            .await;
        let Ok(Handoff::Qr {
            qr_message,
            websocket_url,
            provider_ref,
        }) = h
        else {
            panic!("{h:?}")
        };
        assert!(qr_message.starts_with("000201"));
        assert_eq!(
            websocket_url.as_deref(),
            Some(
                "wss://dev-ws.fonepay.com/convergent-webSocket-web/merchantEndPoint/Td35588c2d9a647f28f4959f96f905bec/NBQM/Y"
            )
        );
        assert_eq!(provider_ref, None);
        let req = mock.last();
        assert_eq!(req.method, "POST");
        assert_eq!(
            req.path,
            "/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload"
        );
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert!(req.header("authorization").is_none());
        let body = req.json();
        assert_eq!(body["amount"], "14");
        assert_eq!(body["prn"], "01JD5Z3K7QWXYZ123456");
        assert_eq!(body["merchantCode"], "NBQM");
        assert_eq!(body["remarks1"], "Order 42 blue mug");
        assert_eq!(body["remarks2"], "01JD5Z3K7QWXYZ123456");
        assert_eq!(body["username"], "9861101076");
        assert_eq!(body["password"], "admin123456");
        let dv = qr_request_dv(
            "a7e3512f5032480a83137793cb2021dc",
            "14",
            "01JD5Z3K7QWXYZ123456",
            "NBQM",
            "Order 42 blue mug",
            "01JD5Z3K7QWXYZ123456",
        );
        assert_eq!(body["dataValidation"], dv.as_str());
        assert_eq!(body.as_object().map(|o| o.len()), Some(8));
    }

    #[tokio::test]
    async fn qr_create_errors() {
        let mock = Mock::start().await;
        let c = clients(&mock, 300);
        let a = attempt(Channel::Qr);
        for (http, msg) in [
            (200, "Data Validation Failed"),
            (406, "Invalid Merchant Code"),
            (406, "Invalid username"),
        ] {
            mock.reply(
                http,
                format!(r#"{{"documentation":"Merchant request Exception","errorCode":406,"message":"{msg}"}}"#),
            );
            assert_eq!(
                c.fonepay.initiate(&creds(), &a).await,
                Err(ProviderError::Rejected {
                    code: "406".into(),
                    message: msg.into()
                })
            );
        }
        mock.reply(500, "Internal Server Error");
        assert!(matches!(
            c.fonepay.initiate(&creds(), &a).await,
            Err(ProviderError::Unavailable(_))
        ));
        mock.reply(200, "<html>maintenance</html>");
        assert!(matches!(
            c.fonepay.initiate(&creds(), &a).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(200, r#"{"success":true,"qrMessage":""}"#);
        assert!(matches!(
            c.fonepay.initiate(&creds(), &a).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(200, "{}");
        mock.delay(Duration::from_millis(1500));
        assert_eq!(
            c.fonepay.initiate(&creds(), &a).await,
            Err(ProviderError::Timeout)
        );

        let before = mock.requests().len();
        let mut long = a.clone();
        long.reference = "A".repeat(21);
        let mut huge = a.clone();
        huge.amount = paisa(10_000_000_000_000);
        let mut zero = a.clone();
        zero.amount = Paisa::ZERO;
        for bad in [long, huge, zero] {
            assert!(matches!(
                c.fonepay.initiate(&creds(), &bad).await,
                Err(ProviderError::Invalid(_))
            ));
        }
        let esewa = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "s".into(),
        };
        assert!(matches!(
            c.fonepay.initiate(&esewa, &a).await,
            Err(ProviderError::Invalid(_))
        ));
        assert!(matches!(
            c.fonepay.refund(&creds(), "17404", None, None).await,
            Err(ProviderError::Unsupported(_))
        ));
        assert_eq!(mock.requests().len(), before, "nothing sent");
    }

    #[tokio::test]
    async fn the_web_flow_redirects_without_a_call() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        let h = c
            .fonepay
            .initiate(&demo_creds(), &attempt(Channel::Browser))
            .await;
        let Ok(Handoff::Redirect {
            url,
            provider_ref: None,
        }) = h
        else {
            panic!("{h:?}")
        };
        assert!(url.starts_with(&format!("{}/fonepay/api/merchantRequest?PID=fonepay123&MD=P&PRN=01JD5Z3K7QWXYZ123456&AMT=14&CRN=NPR&DT=", mock.base)), "{url}");
        let parsed = reqwest::Url::parse(&url).expect("url");
        let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("R1"), "Order 42 blue mug");
        assert_eq!(get("RU"), "https://gw.example/r/fonepay/att1");
        let values: Vec<String> = ["PID", "MD", "PRN", "AMT", "CRN", "DT", "R1", "R2", "RU"]
            .iter()
            .map(|k| get(k))
            .collect();
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        assert!(sign::fonepay_verify("fonepay", &refs, &get("DV")));
        assert!(mock.requests().is_empty());
    }

    #[tokio::test]
    async fn status_maps_every_payment_status() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        let q = StatusQuery {
            reference: "5d76d323-d1f6".into(),
            amount: paisa(1400),
            provider_ref: None,
        };
        for (word, state) in [
            ("success", ProviderState::Paid),
            ("failed", ProviderState::Failed),
            ("pending", ProviderState::Pending),
            ("SUCCESS", ProviderState::Paid),
            ("reversed", ProviderState::Ambiguous),
        ] {
            mock.reply(
                200,
                format!(r#"{{"fonepayTraceId":17404,"merchantCode":"NBQM","paymentStatus":"{word}","prn":"5d76d323-d1f6"}}"#),
            );
            assert_eq!(
                c.fonepay.status(&creds(), &q).await,
                Ok(ProviderStatus {
                    state,
                    amount: None,
                    provider_ref: Some("17404".into()),
                    fee: None,
                    raw_status: word.into(),
                }),
                "{word}"
            );
        }
        let req = mock.last();
        assert_eq!(req.method, "POST");
        assert_eq!(
            req.path,
            "/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrGetStatus"
        );
        let dv = qr_status_dv("a7e3512f5032480a83137793cb2021dc", "5d76d323-d1f6", "NBQM");
        assert_eq!(
            req.json(),
            json!({
                "prn": "5d76d323-d1f6",
                "merchantCode": "NBQM",
                "dataValidation": dv,
                "username": "9861101076",
                "password": "admin123456",
            })
        );
    }

    #[tokio::test]
    async fn status_errors() {
        let mock = Mock::start().await;
        let c = clients(&mock, 300);
        let q = StatusQuery {
            reference: "5d76d323-d1f6".into(),
            amount: paisa(1400),
            provider_ref: None,
        };
        mock.reply(406, r#"{"documentation":"Merchant request Exception","errorCode":406,"message":"Data Validation Failed"}"#);
        assert_eq!(
            c.fonepay.status(&creds(), &q).await,
            Err(ProviderError::Rejected {
                code: "406".into(),
                message: "Data Validation Failed".into()
            })
        );
        mock.reply(503, "");
        assert!(matches!(
            c.fonepay.status(&creds(), &q).await,
            Err(ProviderError::Unavailable(_))
        ));
        for garbage in ["garbage", r#"{"fonepayTraceId":1}"#] {
            mock.reply(200, garbage);
            assert!(
                matches!(
                    c.fonepay.status(&creds(), &q).await,
                    Err(ProviderError::Protocol(_))
                ),
                "{garbage}"
            );
        }
        mock.reply(200, r#"{"fonepayTraceId":1,"merchantCode":"NBQM","paymentStatus":"success","prn":"SOMEONE-ELSE"}"#);
        assert!(matches!(
            c.fonepay.status(&creds(), &q).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(200, r#"{"fonepayTraceId":1,"merchantCode":"OTHER","paymentStatus":"success","prn":"5d76d323-d1f6"}"#);
        assert!(matches!(
            c.fonepay.status(&creds(), &q).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(200, "{}");
        mock.delay(Duration::from_millis(1500));
        assert_eq!(
            c.fonepay.status(&creds(), &q).await,
            Err(ProviderError::Timeout)
        );
    }

    #[test]
    fn remarks_are_alphanumeric_and_short() {
        assert_eq!(
            remark("Order #42, blue mug", 25, "Payment"),
            "Order 42 blue mug"
        );
        assert_eq!(remark("  ,,, ", 25, "Payment"), "Payment");
        assert_eq!(remark("नेपाली सामान", 25, "Payment"), "Payment");
        assert!(remark(&"ab ".repeat(20), 25, "x").len() <= 25);
        assert_eq!(remark("01JD-5Z3K", 25, "NA"), "01JD 5Z3K");
    }
}
