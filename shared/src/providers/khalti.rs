//! Khalti KPG-2 ("ePayment"): JSON over HTTPS with `Authorization: Key
//! <secret>`, amounts in integer paisa (research notes, section 2).
//!
//! - [`ProviderClient::initiate`]: `POST /api/v2/epayment/initiate/`, answered
//!   with Khalti's `payment_url` and `pidx` ([`Handoff::Redirect`]). Keep the
//!   `pidx`: the status check needs it.
//! - [`ProviderClient::status`]: `POST /api/v2/epayment/lookup/ {pidx}`.
//!   `Expired` and `User canceled` come with **HTTP 400** and the normal
//!   body, which is read. Status words are compared case-insensitively
//!   (`Partially Refunded` / `Partially refunded`); unknown words are
//!   `Ambiguous`. `provider_ref` is the `transaction_id`, which refunds need.
//!   An unknown `pidx` (`{"detail": "Not found."}`) is `NotFound`; a 404
//!   without that body is not (a wrong base URL must not fail payments).
//! - [`ProviderClient::refund`]: `POST /api/merchant-transaction/{transaction_id}/refund/`
//!   with `{}` (full), `{"amount": paisa}` (partial), plus `"mobile"` for
//!   payments made from a bank.
//! - [`KhaltiClient::transactions`]: `GET /api/v2/merchant-transaction/`,
//!   the merchant transaction list, every page of a range of Nepal days
//!   (statements for reconciliation). Query parameters `page`,
//!   `page_size`, `start_date`, `end_date` (UNCONFIRMED: the public docs
//!   show the answer, not the filters).
//! - The return to our `return_url` is unsigned: [`parse_return`] reads it as
//!   an untrusted hint; only the lookup decides.
//! - Errors: `{field: [messages], "error_key": ...}` and `{"detail": ...}`
//!   become [`ProviderError::Rejected`] (`code` = `error_key`, else
//!   `http_<status>`).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::amount::paisa_from_json;
use super::transport::{Reply, Transport};
use super::{
    Attempt, Channel, Handoff, ProviderClient, ProviderConfig, ProviderCredentials, ProviderError,
    ProviderState, ProviderStatus, RefundOutcome, StatusQuery, check_amount, check_reference, clip,
};
use crate::kinds::Provider;
use crate::money::Paisa;

/// Khalti's documented minimum (Rs 10); Khalti itself enforces it.
pub const MIN_AMOUNT_PAISA: i64 = 1000;
/// Longest `purchase_order_id` we send.
pub const MAX_REFERENCE_LEN: usize = 64;
const MAX_TOKEN_LEN: usize = 64;

/// The Khalti client of one mode.
#[derive(Clone, Debug)]
pub struct KhaltiClient {
    config: ProviderConfig,
    transport: Transport,
}

impl KhaltiClient {
    pub(crate) fn new(config: &ProviderConfig, transport: Transport) -> Self {
        KhaltiClient {
            config: config.clone(),
            transport,
        }
    }

    fn post(
        &self,
        url: String,
        secret_key: &str,
        body: &Value,
    ) -> Result<reqwest::RequestBuilder, ProviderError> {
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Key {secret_key}"))
            .unwrap_or_else(|_| reqwest::header::HeaderValue::from_static("Key"));
        auth.set_sensitive(true);
        Ok(self
            .transport
            .client()?
            .post(url)
            .header(reqwest::header::AUTHORIZATION, auth)
            .header(reqwest::header::ACCEPT, "application/json")
            .json(body))
    }
}

/// The most pages [`KhaltiClient::transactions`] reads for one range.
pub const MAX_TRANSACTION_PAGES: u32 = 200;
/// Records asked for per page.
pub const TRANSACTIONS_PAGE_SIZE: u32 = 100;

/// A record of Khalti's merchant transaction list, as documented
/// (`amount` and `fee_amount` in paisa, `created_on` in +05:45). Amounts
/// stay JSON values here: the statement reads them exactly and names the
/// record that has a bad one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KhaltiTransaction {
    pub idx: String,
    #[serde(rename = "type")]
    pub kind: KhaltiNamed,
    pub state: KhaltiNamed,
    pub amount: Value,
    #[serde(default)]
    pub fee_amount: Value,
    #[serde(default)]
    pub refunded: bool,
    pub created_on: String,
    #[serde(default)]
    pub user: Option<Value>,
    #[serde(default)]
    pub merchant: Option<KhaltiNamed>,
}

/// `{idx, name}` (a record's type, state or merchant).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KhaltiNamed {
    #[serde(default)]
    pub idx: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

impl KhaltiClient {
    /// Every record of the merchant transaction list from `from` to `to`
    /// (Nepal days, inclusive), page after page, at most
    /// [`MAX_TRANSACTION_PAGES`] (more is an error, never a silent cut).
    /// Each call has the client's timeout.
    pub async fn transactions(
        &self,
        creds: &ProviderCredentials,
        from: chrono::NaiveDate,
        to: chrono::NaiveDate,
    ) -> Result<Vec<KhaltiTransaction>, ProviderError> {
        let secret_key = secret(creds)?;
        let mut out = Vec::new();
        for page in 1..=MAX_TRANSACTION_PAGES {
            let mut auth = reqwest::header::HeaderValue::from_str(&format!("Key {secret_key}"))
                .unwrap_or_else(|_| reqwest::header::HeaderValue::from_static("Key"));
            auth.set_sensitive(true);
            let request = self
                .transport
                .client()?
                .get(format!(
                    "{}?page={page}&page_size={TRANSACTIONS_PAGE_SIZE}&start_date={}&end_date={}",
                    self.config.khalti_transactions_url(),
                    from.format("%Y-%m-%d"),
                    to.format("%Y-%m-%d"),
                ))
                .header(reqwest::header::AUTHORIZATION, auth)
                .header(reqwest::header::ACCEPT, "application/json");
            let reply = self
                .transport
                .send(Provider::Khalti, "transactions", request)
                .await?;
            if !reply.is_success() {
                return Err(rejected(&reply));
            }
            let Some(Value::Object(body)) = reply.json() else {
                return Err(ProviderError::Protocol(format!(
                    "Khalti transaction list answer: {}",
                    reply.snippet()
                )));
            };
            let Some(Value::Array(records)) = body.get("records") else {
                return Err(ProviderError::Protocol(
                    "Khalti transaction list answer without records".into(),
                ));
            };
            for (i, record) in records.iter().enumerate() {
                let parsed: KhaltiTransaction =
                    serde_json::from_value(record.clone()).map_err(|e| {
                        ProviderError::Protocol(format!(
                            "Khalti transaction list page {page}, record {}: {}",
                            i + 1,
                            clip(&e.to_string(), 200)
                        ))
                    })?;
                out.push(parsed);
            }
            let total_pages = body.get("total_pages").and_then(Value::as_u64).unwrap_or(0);
            let has_next = body.get("next").is_some_and(|n| !n.is_null());
            if !has_next && u64::from(page) >= total_pages {
                return Ok(out);
            }
            if records.is_empty() {
                return Err(ProviderError::Protocol(format!(
                    "Khalti transaction list page {page} is empty but more are announced"
                )));
            }
        }
        Err(ProviderError::Protocol(format!(
            "Khalti transaction list has more than {MAX_TRANSACTION_PAGES} pages"
        )))
    }
}

fn secret(creds: &ProviderCredentials) -> Result<&str, ProviderError> {
    match creds {
        ProviderCredentials::Khalti { secret_key } => Ok(secret_key),
        other => Err(ProviderError::Invalid(format!(
            "{} credentials given to the Khalti client",
            other.provider().as_str()
        ))),
    }
}

/// A Khalti status word in our vocabulary. Unknown words are `Ambiguous`
/// (hold, review).
pub fn map_status(word: &str) -> ProviderState {
    match word.trim().to_ascii_lowercase().as_str() {
        "completed" => ProviderState::Paid,
        "pending" | "initiated" => ProviderState::Pending,
        "refunded" => ProviderState::Refunded { partial: false },
        "partially refunded" | "partially_refunded" => ProviderState::Refunded { partial: true },
        "expired" => ProviderState::Expired,
        "user canceled" | "user cancelled" | "canceled" | "cancelled" => ProviderState::Cancelled,
        "failed" => ProviderState::Failed,
        _ => ProviderState::Ambiguous,
    }
}

/// A plain token (`pidx`, `transaction_id`): safe in a URL path and a body.
fn check_token(what: &str, token: &str) -> Result<(), ProviderError> {
    if token.is_empty()
        || token.len() > MAX_TOKEN_LEN
        || !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ProviderError::Invalid(format!(
            "Khalti {what} {:?} is not a plain token",
            clip(token, 40)
        )));
    }
    Ok(())
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A Khalti error answer as `Rejected` (or `Unavailable` for 5xx/429).
fn rejected(reply: &Reply) -> ProviderError {
    if let Some(e) = reply.unavailable() {
        return e;
    }
    let fallback_code = format!("http_{}", reply.status);
    let Some(Value::Object(obj)) = reply.json() else {
        return ProviderError::Rejected {
            code: fallback_code,
            message: reply.snippet(),
        };
    };
    let code = obj
        .get("error_key")
        .and_then(text_of)
        .unwrap_or(fallback_code);
    let mut parts: Vec<String> = Vec::new();
    if let Some(detail) = obj.get("detail").and_then(text_of) {
        parts.push(detail);
    }
    for (field, value) in &obj {
        if matches!(field.as_str(), "detail" | "error_key" | "status_code") {
            continue;
        }
        let messages = match value {
            Value::Array(items) => items
                .iter()
                .filter_map(text_of)
                .collect::<Vec<_>>()
                .join(" "),
            other => text_of(other).unwrap_or_default(),
        };
        parts.push(format!("{field}: {messages}"));
    }
    let message = if parts.is_empty() {
        reply.snippet()
    } else {
        parts.join("; ")
    };
    ProviderError::Rejected {
        code,
        message: clip(&message, 300),
    }
}

fn non_empty_string(obj: &Map<String, Value>, key: &str) -> Option<String> {
    obj.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The lookup's `fee` (paisa). One Khalti cannot state (negative, a
/// fraction, not a number) is a provider error, logged, and read as no
/// fee (the payment's status does not depend on it).
fn lookup_fee(obj: &Map<String, Value>, pidx: &str) -> Option<Paisa> {
    match obj.get("fee") {
        None | Some(Value::Null) => None,
        Some(v) => match paisa_from_json(v) {
            Ok(fee) => Some(fee),
            Err(e) => {
                tracing::warn!(pidx = %clip(pidx, 40), fee = %clip(&v.to_string(), 40), error = %e, "Khalti lookup: unreadable fee ignored");
                None
            }
        },
    }
}

fn parse_lookup(reply: &Reply, pidx: &str) -> Result<ProviderStatus, ProviderError> {
    if let Some(e) = reply.unavailable() {
        return Err(e);
    }
    let json = reply.json();
    let obj = json.as_ref().and_then(Value::as_object);
    let status = obj.and_then(|o| non_empty_string(o, "status"));
    // 200, or 400 for Expired / User canceled, with the lookup body.
    if let (Some(obj), Some(status), true) =
        (obj, status, reply.is_success() || reply.status == 400)
    {
        if obj.contains_key("pidx") || reply.is_success() {
            if let Some(theirs) = obj.get("pidx").and_then(text_of) {
                if theirs != pidx {
                    return Err(ProviderError::Protocol(format!(
                        "Khalti answered about pidx {:?}",
                        clip(&theirs, 40)
                    )));
                }
            }
            let amount = match obj.get("total_amount") {
                None | Some(Value::Null) => None,
                Some(v) => Some(paisa_from_json(v).map_err(|e| {
                    ProviderError::Protocol(format!("Khalti total_amount {v}: {e}"))
                })?),
            };
            return Ok(ProviderStatus {
                state: map_status(&status),
                amount,
                provider_ref: non_empty_string(obj, "transaction_id"),
                fee: lookup_fee(obj, pidx),
                raw_status: clip(&status, 40),
            });
        }
    }
    let not_found = obj
        .and_then(|o| o.get("detail"))
        .and_then(Value::as_str)
        .is_some_and(|d| {
            d.trim()
                .trim_end_matches('.')
                .eq_ignore_ascii_case("not found")
        });
    if not_found {
        return Ok(ProviderStatus {
            state: ProviderState::NotFound,
            amount: None,
            provider_ref: None,
            fee: None,
            raw_status: "Not found".into(),
        });
    }
    if reply.is_success() {
        return Err(ProviderError::Protocol(format!(
            "Khalti lookup answer: {}",
            reply.snippet()
        )));
    }
    Err(rejected(reply))
}

#[async_trait]
impl ProviderClient for KhaltiClient {
    fn provider(&self) -> Provider {
        Provider::Khalti
    }

    async fn initiate(
        &self,
        creds: &ProviderCredentials,
        attempt: &Attempt,
    ) -> Result<Handoff, ProviderError> {
        let secret_key = secret(creds)?;
        if attempt.channel == Channel::Qr {
            return Err(ProviderError::Unsupported(
                "Khalti has no QR flow here; use the payment page".into(),
            ));
        }
        check_reference(&attempt.reference, MAX_REFERENCE_LEN)?;
        check_amount(attempt.amount)?;
        let name = attempt.order_name.trim();
        let mut body = json!({
            "return_url": attempt.return_url,
            "website_url": attempt.website_url,
            "amount": attempt.amount.get(),
            "purchase_order_id": attempt.reference,
            "purchase_order_name": if name.is_empty() { attempt.reference.as_str() } else { name },
        });
        if let Some(c) = &attempt.customer {
            let mut info = Map::new();
            for (k, v) in [("name", &c.name), ("email", &c.email), ("phone", &c.phone)] {
                if let Some(v) = v.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
                    info.insert(k.into(), Value::from(v));
                }
            }
            if !info.is_empty() {
                body["customer_info"] = Value::Object(info);
            }
        }
        let request = self.post(self.config.khalti_initiate_url(), secret_key, &body)?;
        let reply = self
            .transport
            .send(Provider::Khalti, "initiate", request)
            .await?;
        if !reply.is_success() {
            return Err(rejected(&reply));
        }
        let json = reply.json();
        let obj = json.as_ref().and_then(Value::as_object);
        let pidx = obj.and_then(|o| non_empty_string(o, "pidx"));
        let url = obj.and_then(|o| non_empty_string(o, "payment_url"));
        match (pidx, url) {
            (Some(pidx), Some(url))
                if url.starts_with("https://") || url.starts_with("http://") =>
            {
                Ok(Handoff::Redirect {
                    url,
                    provider_ref: Some(pidx),
                })
            }
            _ => Err(ProviderError::Protocol(format!(
                "Khalti initiate answer: {}",
                reply.snippet()
            ))),
        }
    }

    async fn status(
        &self,
        creds: &ProviderCredentials,
        query: &StatusQuery,
    ) -> Result<ProviderStatus, ProviderError> {
        let secret_key = secret(creds)?;
        let Some(pidx) = query.provider_ref.as_deref() else {
            return Err(ProviderError::Invalid(
                "a Khalti status check needs the pidx from initiate".into(),
            ));
        };
        check_token("pidx", pidx)?;
        let request = self.post(
            self.config.khalti_lookup_url(),
            secret_key,
            &json!({ "pidx": pidx }),
        )?;
        let reply = self
            .transport
            .send(Provider::Khalti, "lookup", request)
            .await?;
        parse_lookup(&reply, pidx)
    }

    async fn refund(
        &self,
        creds: &ProviderCredentials,
        provider_ref: &str,
        amount: Option<Paisa>,
        mobile: Option<&str>,
    ) -> Result<RefundOutcome, ProviderError> {
        let secret_key = secret(creds)?;
        check_token("transaction_id", provider_ref)?;
        let mut body = Map::new();
        if let Some(amount) = amount {
            check_amount(amount)?;
            body.insert("amount".into(), Value::from(amount.get()));
        }
        if let Some(mobile) = mobile.map(str::trim) {
            let ok = !mobile.is_empty()
                && mobile.len() <= 20
                && mobile
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'+' || b == b'-');
            if !ok {
                return Err(ProviderError::Invalid(
                    "the refund mobile number must be digits".into(),
                ));
            }
            body.insert("mobile".into(), Value::from(mobile));
        }
        let request = self.post(
            self.config.khalti_refund_url(provider_ref),
            secret_key,
            &Value::Object(body),
        )?;
        let reply = self
            .transport
            .send(Provider::Khalti, "refund", request)
            .await?;
        if !reply.is_success() {
            return Err(rejected(&reply));
        }
        let message = reply
            .json()
            .as_ref()
            .and_then(|j| j.get("detail"))
            .and_then(text_of)
            .unwrap_or_else(|| "refund accepted".into());
        Ok(RefundOutcome {
            message: clip(&message, 200),
        })
    }
}

/// Khalti's browser return to our `return_url`, as sent: **unsigned and
/// untrusted**. Use it to find the attempt (prefer an id of ours in the
/// return URL's path) and to look the `pidx` up; never to decide.
/// Empty parameters are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KhaltiReturn {
    pub pidx: Option<String>,
    /// `Completed`, `Pending` or `User canceled`, as claimed.
    pub status: Option<String>,
    pub transaction_id: Option<String>,
    /// `amount` (else `total_amount`), as claimed.
    pub amount: Option<Paisa>,
    /// Masked payer id, e.g. `98XXXXX904`.
    pub mobile: Option<String>,
    pub purchase_order_id: Option<String>,
    pub purchase_order_name: Option<String>,
    /// The legacy failure return `?message=...`.
    pub message: Option<String>,
}

impl KhaltiReturn {
    /// The claimed status in our vocabulary (a hint for what to show while
    /// the lookup runs).
    pub fn claimed_state(&self) -> Option<ProviderState> {
        self.status.as_deref().map(map_status)
    }
}

/// Read Khalti's return query string (without the `?`). Never fails:
/// unknown, repeated or unreadable parameters are ignored (first wins).
pub fn parse_return(query: &str) -> KhaltiReturn {
    let mut r = KhaltiReturn::default();
    let mut total_amount = None;
    for (k, v) in form_urlencoded::parse(query.trim_start_matches('?').as_bytes()) {
        let v = v.trim();
        if v.is_empty() {
            continue;
        }
        let slot = match k.as_ref() {
            "pidx" => &mut r.pidx,
            "status" => &mut r.status,
            "transaction_id" | "tidx" => &mut r.transaction_id,
            "mobile" => &mut r.mobile,
            "purchase_order_id" => &mut r.purchase_order_id,
            "purchase_order_name" => &mut r.purchase_order_name,
            "message" => &mut r.message,
            "amount" => {
                if r.amount.is_none() {
                    r.amount = paisa_from_json(&Value::from(v)).ok();
                }
                continue;
            }
            "total_amount" => {
                if total_amount.is_none() {
                    total_amount = paisa_from_json(&Value::from(v)).ok();
                }
                continue;
            }
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(clip(v, 200));
        }
    }
    if r.amount.is_none() {
        r.amount = total_amount;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::super::mock::Mock;
    use super::super::{CustomerInfo, ProviderClients};
    use super::*;
    use std::time::Duration;

    const SECRET: &str = "live_secret_key_68791341fdd94846a146f0457ff7b455";

    fn creds() -> ProviderCredentials {
        ProviderCredentials::Khalti {
            secret_key: SECRET.into(),
        }
    }

    fn paisa(v: i64) -> Paisa {
        Paisa::new(v).unwrap_or_default()
    }

    fn attempt() -> Attempt {
        Attempt {
            reference: "01JD5Z3K7QWXYZ123456".into(),
            amount: paisa(1000),
            return_url: "https://gw.example/r/khalti/att_1".into(),
            failure_url: None,
            website_url: "https://shop.example".into(),
            order_name: "Test order".into(),
            customer: Some(CustomerInfo {
                name: Some("Ram Bahadur".into()),
                email: Some("test@khalti.com".into()),
                phone: None,
            }),
            channel: Channel::Browser,
        }
    }

    fn clients(mock: &Mock, timeout_ms: u64) -> ProviderClients {
        let cfg =
            ProviderConfig::for_base(&mock.base).with_timeout(Duration::from_millis(timeout_ms));
        ProviderClients::new(&cfg).expect("clients")
    }

    fn lookup_query(pidx: &str) -> StatusQuery {
        StatusQuery {
            reference: "01JD5Z3K7QWXYZ123456".into(),
            amount: paisa(1000),
            provider_ref: Some(pidx.into()),
        }
    }

    #[tokio::test]
    async fn initiate_posts_the_documented_body_with_the_key() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        mock.reply(
            200,
            r#"{"pidx":"bZQLD9wRVWo4CdESSfuSsB","payment_url":"https://test-pay.khalti.com/?pidx=bZQLD9wRVWo4CdESSfuSsB","expires_at":"2023-05-25T16:26:16.471649+05:45","expires_in":1800}"#,
        );
        let h = c.get(Provider::Khalti).initiate(&creds(), &attempt()).await;
        assert_eq!(
            h,
            Ok(Handoff::Redirect {
                url: "https://test-pay.khalti.com/?pidx=bZQLD9wRVWo4CdESSfuSsB".into(),
                provider_ref: Some("bZQLD9wRVWo4CdESSfuSsB".into()),
            })
        );
        let req = mock.last();
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/khalti/api/v2/epayment/initiate/");
        assert_eq!(
            req.header("authorization"),
            Some(format!("Key {SECRET}").as_str())
        );
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert_eq!(
            req.json(),
            json!({
                "return_url": "https://gw.example/r/khalti/att_1",
                "website_url": "https://shop.example",
                "amount": 1000,
                "purchase_order_id": "01JD5Z3K7QWXYZ123456",
                "purchase_order_name": "Test order",
                "customer_info": {"name": "Ram Bahadur", "email": "test@khalti.com"}
            })
        );
        // No customer, no order name.
        let mut a = attempt();
        a.customer = None;
        a.order_name = " ".into();
        let _ = c.khalti.initiate(&creds(), &a).await;
        let body = mock.last().json();
        assert!(body.get("customer_info").is_none());
        assert_eq!(body["purchase_order_name"], "01JD5Z3K7QWXYZ123456");
    }

    #[tokio::test]
    async fn initiate_errors() {
        let mock = Mock::start().await;
        let c = clients(&mock, 300);
        mock.reply(
            400,
            r#"{"amount": ["Amount should be greater than Rs. 10, that is 1000 paisa."], "error_key": "validation_error"}"#,
        );
        assert_eq!(
            c.khalti.initiate(&creds(), &attempt()).await,
            Err(ProviderError::Rejected {
                code: "validation_error".into(),
                message: "amount: Amount should be greater than Rs. 10, that is 1000 paisa.".into(),
            })
        );
        mock.reply(401, r#"{"detail": "Invalid token.", "status_code": 401}"#);
        assert_eq!(
            c.khalti.initiate(&creds(), &attempt()).await,
            Err(ProviderError::Rejected {
                code: "http_401".into(),
                message: "Invalid token.".into(),
            })
        );
        mock.reply(502, "Bad gateway");
        assert_eq!(
            c.khalti.initiate(&creds(), &attempt()).await,
            Err(ProviderError::Unavailable("HTTP 502".into()))
        );
        mock.reply(429, r#"{"detail":"Request was throttled."}"#);
        assert!(matches!(
            c.khalti.initiate(&creds(), &attempt()).await,
            Err(ProviderError::Unavailable(_))
        ));
        for garbage in [
            "not json",
            r#"{"pidx":"x"}"#,
            r#"{"pidx":"x","payment_url":"javascript:alert(1)"}"#,
        ] {
            mock.reply(200, garbage);
            assert!(
                matches!(
                    c.khalti.initiate(&creds(), &attempt()).await,
                    Err(ProviderError::Protocol(_))
                ),
                "{garbage}"
            );
        }
        mock.reply(200, "{}");
        mock.delay(Duration::from_millis(1500));
        assert_eq!(
            c.khalti.initiate(&creds(), &attempt()).await,
            Err(ProviderError::Timeout)
        );
        let before = mock.requests().len();
        let mut qr = attempt();
        qr.channel = Channel::Qr;
        assert!(matches!(
            c.khalti.initiate(&creds(), &qr).await,
            Err(ProviderError::Unsupported(_))
        ));
        let esewa = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "s".into(),
        };
        assert!(matches!(
            c.khalti.initiate(&esewa, &attempt()).await,
            Err(ProviderError::Invalid(_))
        ));
        assert_eq!(mock.requests().len(), before, "nothing sent");
    }

    #[tokio::test]
    async fn lookup_maps_every_status_and_reads_400_bodies() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        let pidx = "HT6o6PEZRWFJ5ygavzHWd5";
        let cases = [
            (
                200,
                "Completed",
                "\"GFq9PFS7b2iYvL8Lir9oXe\"",
                false,
                ProviderState::Paid,
            ),
            (200, "Pending", "null", false, ProviderState::Pending),
            (200, "Initiated", "null", false, ProviderState::Pending),
            (
                200,
                "Refunded",
                "\"GFq9PFS7b2iYvL8Lir9oXe\"",
                true,
                ProviderState::Refunded { partial: false },
            ),
            (
                200,
                "Partially Refunded",
                "\"GFq9PFS7b2iYvL8Lir9oXe\"",
                true,
                ProviderState::Refunded { partial: true },
            ),
            (
                200,
                "Partially refunded",
                "\"GFq9PFS7b2iYvL8Lir9oXe\"",
                true,
                ProviderState::Refunded { partial: true },
            ),
            (400, "Expired", "null", false, ProviderState::Expired),
            (
                400,
                "User canceled",
                "null",
                false,
                ProviderState::Cancelled,
            ),
            (200, "Failed", "null", false, ProviderState::Failed),
            (200, "Canceled", "null", false, ProviderState::Cancelled),
            (200, "Mystery", "null", false, ProviderState::Ambiguous),
        ];
        for (http, word, txn, refunded, state) in cases {
            mock.reply(
                http,
                format!(
                    r#"{{"pidx":"{pidx}","total_amount":1000,"status":"{word}","transaction_id":{txn},"fee":0,"refunded":{refunded}}}"#
                ),
            );
            let s = c.khalti.status(&creds(), &lookup_query(pidx)).await;
            assert_eq!(
                s,
                Ok(ProviderStatus {
                    state,
                    amount: Some(paisa(1000)),
                    provider_ref: (txn != "null").then(|| "GFq9PFS7b2iYvL8Lir9oXe".to_owned()),
                    fee: Some(paisa(0)),
                    raw_status: word.into(),
                }),
                "{word}"
            );
        }
        let req = mock.last();
        assert_eq!(
            (req.method.as_str(), req.path.as_str()),
            ("POST", "/khalti/api/v2/epayment/lookup/")
        );
        assert_eq!(
            req.header("authorization"),
            Some(format!("Key {SECRET}").as_str())
        );
        assert_eq!(req.json(), json!({"pidx": pidx}));

        mock.reply(
            404,
            r#"{"detail": "Not found.", "error_key": "validation_error"}"#,
        );
        let s = c.khalti.status(&creds(), &lookup_query(pidx)).await;
        assert_eq!(s.map(|s| s.state), Ok(ProviderState::NotFound));
    }

    /// The lookup's `fee` is recorded in paisa; one Khalti cannot state
    /// (negative, a fraction, text) is logged and read as none, never a
    /// failed lookup.
    #[tokio::test]
    async fn lookup_reads_the_fee() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        let pidx = "HT6o6PEZRWFJ5ygavzHWd5";
        for (fee, want) in [
            ("300", Some(paisa(300))),
            ("\"45\"", Some(paisa(45))),
            ("null", None),
            ("-3", None),
            ("2.5", None),
            ("\"x\"", None),
        ] {
            mock.reply(
                200,
                format!(
                    r#"{{"pidx":"{pidx}","total_amount":10000,"status":"Completed","transaction_id":"T1","fee":{fee},"refunded":false}}"#
                ),
            );
            let s = c.khalti.status(&creds(), &lookup_query(pidx)).await;
            assert_eq!(s.as_ref().map(|s| s.fee), Ok(want), "{fee}");
            assert_eq!(s.map(|s| s.state), Ok(ProviderState::Paid), "{fee}");
        }
    }

    #[tokio::test]
    async fn lookup_errors() {
        let mock = Mock::start().await;
        let c = clients(&mock, 300);
        let q = lookup_query("HT6o6PEZRWFJ5ygavzHWd5");
        // A 404 page that is not Khalti's "Not found." must not fail a payment.
        mock.reply(404, "<html>Not Found</html>");
        assert!(matches!(
            c.khalti.status(&creds(), &q).await,
            Err(ProviderError::Rejected { code, .. }) if code == "http_404"
        ));
        mock.reply(
            401,
            r#"{"detail": "Authentication credentials were not provided.", "status_code": 401}"#,
        );
        assert!(matches!(
            c.khalti.status(&creds(), &q).await,
            Err(ProviderError::Rejected { code, message }) if code == "http_401" && message.contains("not provided")
        ));
        mock.reply(500, r#"{"status":"Completed"}"#);
        assert_eq!(
            c.khalti.status(&creds(), &q).await,
            Err(ProviderError::Unavailable("HTTP 500".into()))
        );
        for garbage in [
            "garbage",
            r#"{"pidx":"HT6o6PEZRWFJ5ygavzHWd5"}"#,
            r#"{"pidx":"OTHER","status":"Completed","total_amount":1000}"#,
            r#"{"pidx":"HT6o6PEZRWFJ5ygavzHWd5","status":"Completed","total_amount":"ten"}"#,
        ] {
            mock.reply(200, garbage);
            assert!(
                matches!(
                    c.khalti.status(&creds(), &q).await,
                    Err(ProviderError::Protocol(_))
                ),
                "{garbage}"
            );
        }
        mock.reply(
            400,
            r#"{"pidx": ["This field is required."], "error_key": "validation_error"}"#,
        );
        assert!(matches!(
            c.khalti.status(&creds(), &q).await,
            Err(ProviderError::Rejected { code, .. }) if code == "validation_error"
        ));
        mock.delay(Duration::from_millis(1500));
        assert_eq!(
            c.khalti.status(&creds(), &q).await,
            Err(ProviderError::Timeout)
        );
        mock.delay(Duration::ZERO);
        let before = mock.requests().len();
        let mut no_pidx = q.clone();
        no_pidx.provider_ref = None;
        assert!(matches!(
            c.khalti.status(&creds(), &no_pidx).await,
            Err(ProviderError::Invalid(_))
        ));
        let mut sneaky = q.clone();
        sneaky.provider_ref = Some("../refund".into());
        assert!(matches!(
            c.khalti.status(&creds(), &sneaky).await,
            Err(ProviderError::Invalid(_))
        ));
        assert_eq!(mock.requests().len(), before, "nothing sent");
    }

    #[tokio::test]
    async fn refunds_post_the_documented_bodies() {
        let mock = Mock::start().await;
        let c = clients(&mock, 300);
        let txn = "GFq9PFS7b2iYvL8Lir9oXe";
        mock.reply(200, r#"{"detail": "Transaction refund successful."}"#);
        let cases = [
            (None, None, json!({})),
            (Some(paisa(500)), None, json!({"amount": 500})),
            (None, Some("9800000001"), json!({"mobile": "9800000001"})),
            (
                Some(paisa(750)),
                Some("9800000001"),
                json!({"mobile": "9800000001", "amount": 750}),
            ),
        ];
        for (amount, mobile, body) in cases {
            let r = c
                .get(Provider::Khalti)
                .refund(&creds(), txn, amount, mobile)
                .await;
            assert_eq!(
                r,
                Ok(RefundOutcome {
                    message: "Transaction refund successful.".into()
                })
            );
            let req = mock.last();
            assert_eq!(req.method, "POST");
            assert_eq!(
                req.path,
                format!("/khalti/api/merchant-transaction/{txn}/refund/")
            );
            assert_eq!(
                req.header("authorization"),
                Some(format!("Key {SECRET}").as_str())
            );
            assert_eq!(req.json(), body);
        }
        mock.reply(
            400,
            r#"{"detail": "Transaction already refunded.", "error_key": "validation_error"}"#,
        );
        assert_eq!(
            c.khalti.refund(&creds(), txn, None, None).await,
            Err(ProviderError::Rejected {
                code: "validation_error".into(),
                message: "Transaction already refunded.".into()
            })
        );
        mock.reply(503, "");
        assert!(matches!(
            c.khalti.refund(&creds(), txn, None, None).await,
            Err(ProviderError::Unavailable(_))
        ));
        mock.reply(200, "{}");
        mock.delay(Duration::from_millis(1500));
        assert_eq!(
            c.khalti.refund(&creds(), txn, None, None).await,
            Err(ProviderError::Timeout)
        );
        let before = mock.requests().len();
        for (t, amount, mobile) in [
            ("a/b", None, None),
            ("", None, None),
            (txn, Some(Paisa::ZERO), None),
            (txn, None, Some("98 00")),
            (txn, None, Some("")),
        ] {
            assert!(
                matches!(
                    c.khalti.refund(&creds(), t, amount, mobile).await,
                    Err(ProviderError::Invalid(_))
                ),
                "{t} {amount:?} {mobile:?}"
            );
        }
        assert_eq!(mock.requests().len(), before, "nothing sent");
    }

    #[test]
    fn the_return_is_read_but_not_trusted() {
        let q = "pidx=bZQLD9wRVWo4CdESSfuSsB&txnId=4H7AhoXDJWg5WjrcPT9ixW&amount=1000&total_amount=1000&status=Completed&mobile=98XXXXX904&tidx=4H7AhoXDJWg5WjrcPT9ixW&purchase_order_id=test12&purchase_order_name=test&transaction_id=4H7AhoXDJWg5WjrcPT9ixW";
        let r = parse_return(q);
        assert_eq!(
            r,
            KhaltiReturn {
                pidx: Some("bZQLD9wRVWo4CdESSfuSsB".into()),
                status: Some("Completed".into()),
                transaction_id: Some("4H7AhoXDJWg5WjrcPT9ixW".into()),
                amount: Some(paisa(1000)),
                mobile: Some("98XXXXX904".into()),
                purchase_order_id: Some("test12".into()),
                purchase_order_name: Some("test".into()),
                message: None,
            }
        );
        assert_eq!(r.claimed_state(), Some(ProviderState::Paid));

        let cancel = parse_return(
            "?pidx=abc&transaction_id=&tidx=&amount=1000&total_amount=1000&mobile=&status=User%20canceled&purchase_order_id=test12&purchase_order_name=test",
        );
        assert_eq!(cancel.status.as_deref(), Some("User canceled"));
        assert_eq!(cancel.transaction_id, None);
        assert_eq!(cancel.mobile, None);
        assert_eq!(cancel.claimed_state(), Some(ProviderState::Cancelled));

        let legacy = parse_return("message=Payment+failed");
        assert_eq!(legacy.message.as_deref(), Some("Payment failed"));
        assert_eq!(legacy.pidx, None);

        let odd = parse_return("amount=ten&total_amount=1500&pidx=a&pidx=b&junk=%ZZ");
        assert_eq!(
            (odd.amount, odd.pidx.as_deref()),
            (Some(paisa(1500)), Some("a"))
        );
        assert_eq!(parse_return(""), KhaltiReturn::default());
    }

    #[test]
    fn status_words_are_case_insensitive() {
        assert_eq!(map_status("COMPLETED"), ProviderState::Paid);
        assert_eq!(
            map_status(" partially refunded "),
            ProviderState::Refunded { partial: true }
        );
        assert_eq!(map_status("USER CANCELED"), ProviderState::Cancelled);
        assert_eq!(map_status(""), ProviderState::Ambiguous);
    }
}
