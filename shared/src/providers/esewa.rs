//! eSewa ePay v2: a signed browser form, a signed success redirect, and an
//! unauthenticated status check (research notes, section 1).
//!
//! - Initiation needs no call: [`payment_form`] builds the 11 fields
//!   (`amount` = `total_amount` = the attempt's amount, the three charges
//!   `0`), signed over `total_amount,transaction_uuid,product_code`. Amounts
//!   are rupee strings as [`rupees`] renders them (`"110"`, `"110.50"`); the
//!   status check repeats the very same string.
//! - The success redirect (`?data=<base64 JSON>`) is checked by
//!   [`verify_callback`] over the callback's own `signed_field_names`, values
//!   exactly as received. It is still only a hint: confirm with
//!   [`ProviderClient::status`].
//! - The failure redirect carries nothing documented: resolve it with the
//!   status check too.
//! - No refund API: refunds are made in eSewa's merchant portal, and the
//!   status check shows `FULL_REFUND` / `PARTIAL_REFUND`.
//! - Error bodies `{code, error_message}`: "…unavailable…" messages are
//!   [`ProviderError::Unavailable`], others `Rejected` with the code.

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::Value;

use super::amount::{parse_rupees, rupees, rupees_from_json};
use super::transport::{Reply, Transport};
use super::{
    Attempt, CallbackError, Channel, Handoff, ProviderClient, ProviderConfig, ProviderCredentials,
    ProviderError, ProviderState, ProviderStatus, RefundOutcome, StatusQuery, check_amount,
    check_reference, clip, sign,
};
use crate::kinds::Provider;
use crate::money::Paisa;

/// The fields the request signature covers, in order (fixed by eSewa).
pub const REQUEST_SIGNED_FIELDS: &str = "total_amount,transaction_uuid,product_code";
/// Longest `transaction_uuid` we send.
pub const MAX_REFERENCE_LEN: usize = 64;
/// Longest `data` accepted from a success redirect.
const MAX_DATA_LEN: usize = 8 * 1024;

/// The eSewa client of one mode.
#[derive(Clone, Debug)]
pub struct EsewaClient {
    form_url: String,
    status_url: String,
    transport: Transport,
}

impl EsewaClient {
    pub(crate) fn new(config: &ProviderConfig, transport: Transport) -> Self {
        EsewaClient {
            form_url: config.esewa_form_url.clone(),
            status_url: config.esewa_status_url.clone(),
            transport,
        }
    }
}

fn credentials(creds: &ProviderCredentials) -> Result<(&str, &str), ProviderError> {
    match creds {
        ProviderCredentials::Esewa {
            product_code,
            secret_key,
        } => Ok((product_code, secret_key)),
        other => Err(ProviderError::Invalid(format!(
            "{} credentials given to the eSewa client",
            other.provider().as_str()
        ))),
    }
}

/// The signed ePay v2 form for `attempt`, to be auto-posted to `form_url`.
pub fn payment_form(
    form_url: &str,
    product_code: &str,
    secret_key: &str,
    attempt: &Attempt,
) -> Result<Handoff, ProviderError> {
    check_reference(&attempt.reference, MAX_REFERENCE_LEN)?;
    check_amount(attempt.amount)?;
    for (name, url) in [
        ("return_url", Some(&attempt.return_url)),
        ("failure_url", attempt.failure_url.as_ref()),
    ] {
        if url.is_some_and(|u| u.trim().is_empty()) {
            return Err(ProviderError::Invalid(format!("{name} is empty")));
        }
    }
    let total = rupees(attempt.amount);
    let message = sign::esewa_message(&[
        ("total_amount", &total),
        ("transaction_uuid", &attempt.reference),
        ("product_code", product_code),
    ]);
    let signature = sign::esewa_signature(secret_key, &message);
    let failure_url = attempt
        .failure_url
        .clone()
        .unwrap_or_else(|| attempt.return_url.clone());
    let fields = [
        ("amount", total.clone()),
        ("tax_amount", "0".to_owned()),
        ("total_amount", total),
        ("transaction_uuid", attempt.reference.clone()),
        ("product_code", product_code.to_owned()),
        ("product_service_charge", "0".to_owned()),
        ("product_delivery_charge", "0".to_owned()),
        ("success_url", attempt.return_url.clone()),
        ("failure_url", failure_url),
        ("signed_field_names", REQUEST_SIGNED_FIELDS.to_owned()),
        ("signature", signature),
    ];
    Ok(Handoff::AutoPostForm {
        action: form_url.to_owned(),
        fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    })
}

/// An eSewa status word in our vocabulary. Unknown words are `Ambiguous`.
pub fn map_status(word: &str) -> ProviderState {
    match word.trim().to_ascii_uppercase().as_str() {
        "COMPLETE" => ProviderState::Paid,
        "PENDING" => ProviderState::Pending,
        "FULL_REFUND" => ProviderState::Refunded { partial: false },
        "PARTIAL_REFUND" => ProviderState::Refunded { partial: true },
        "NOT_FOUND" => ProviderState::NotFound,
        "CANCELED" | "CANCELLED" => ProviderState::Cancelled,
        // Also "AMBIGUOUS" (and the "AMBIGIOUS" typo of one SDK).
        _ => ProviderState::Ambiguous,
    }
}

fn json_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An `{code, error_message}` body as an error, if it is one.
fn error_body(json: &Value) -> Option<ProviderError> {
    let message = json.get("error_message").and_then(json_text)?;
    let code = json
        .get("code")
        .and_then(json_text)
        .unwrap_or_else(|| "unknown".into());
    Some(if message.to_ascii_lowercase().contains("unavailable") {
        ProviderError::Unavailable(clip(&message, 200))
    } else {
        ProviderError::Rejected {
            code,
            message: clip(&message, 200),
        }
    })
}

/// The status check's answer for `(product_code, reference)`.
fn parse_status_reply(
    reply: &Reply,
    product_code: &str,
    reference: &str,
) -> Result<ProviderStatus, ProviderError> {
    if let Some(e) = reply.unavailable() {
        return Err(e);
    }
    let json = reply.json();
    if let Some(e) = json.as_ref().and_then(error_body) {
        return Err(e);
    }
    let status = json
        .as_ref()
        .and_then(|j| j.get("status"))
        .and_then(Value::as_str);
    let (Some(json), Some(status), true) = (json.as_ref(), status, reply.is_success()) else {
        return Err(if reply.is_success() {
            ProviderError::Protocol(format!("eSewa status answer: {}", reply.snippet()))
        } else {
            ProviderError::Rejected {
                code: format!("http_{}", reply.status),
                message: reply.snippet(),
            }
        });
    };
    for (field, ours) in [
        ("product_code", product_code),
        ("transaction_uuid", reference),
    ] {
        match json.get(field).and_then(json_text) {
            Some(theirs) if theirs != ours => {
                return Err(ProviderError::Protocol(format!(
                    "eSewa answered about {field} {:?}, not {ours:?}",
                    clip(&theirs, 40)
                )));
            }
            _ => {}
        }
    }
    let amount = match json.get("total_amount") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            rupees_from_json(v)
                .map_err(|e| ProviderError::Protocol(format!("eSewa total_amount {v}: {e}")))?,
        ),
    };
    let provider_ref = json
        .get("ref_id")
        .and_then(json_text)
        .filter(|s| !s.is_empty());
    Ok(ProviderStatus {
        state: map_status(status),
        amount,
        provider_ref,
        fee: None,
        raw_status: clip(status, 40),
    })
}

#[async_trait]
impl ProviderClient for EsewaClient {
    fn provider(&self) -> Provider {
        Provider::Esewa
    }

    async fn initiate(
        &self,
        creds: &ProviderCredentials,
        attempt: &Attempt,
    ) -> Result<Handoff, ProviderError> {
        let (product_code, secret_key) = credentials(creds)?;
        if attempt.channel == Channel::Qr {
            return Err(ProviderError::Unsupported(
                "eSewa ePay has no QR flow here; use the browser form".into(),
            ));
        }
        payment_form(&self.form_url, product_code, secret_key, attempt)
    }

    async fn status(
        &self,
        creds: &ProviderCredentials,
        query: &StatusQuery,
    ) -> Result<ProviderStatus, ProviderError> {
        let (product_code, _) = credentials(creds)?;
        check_reference(&query.reference, MAX_REFERENCE_LEN)?;
        let mut url = reqwest::Url::parse(&self.status_url)
            .map_err(|e| ProviderError::Invalid(format!("eSewa status URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("product_code", product_code)
            .append_pair("total_amount", &rupees(query.amount))
            .append_pair("transaction_uuid", &query.reference);
        let request = self
            .transport
            .client()?
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json");
        let reply = self
            .transport
            .send(Provider::Esewa, "status", request)
            .await?;
        parse_status_reply(&reply, product_code, &query.reference)
    }

    async fn refund(
        &self,
        _creds: &ProviderCredentials,
        _provider_ref: &str,
        _amount: Option<Paisa>,
        _mobile: Option<&str>,
    ) -> Result<RefundOutcome, ProviderError> {
        Err(ProviderError::Unsupported(
            "eSewa has no refund API: refund in the eSewa merchant portal".into(),
        ))
    }
}

/// A success redirect whose signature verified. Only the fields covered by
/// the signature are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EsewaCallback {
    /// eSewa's reference (`transaction_code`), when signed.
    pub transaction_code: Option<String>,
    /// `COMPLETE` on success.
    pub status: String,
    pub total_amount: Paisa,
    /// `total_amount` exactly as eSewa sent it (e.g. `"1,000.0"`).
    pub total_amount_raw: String,
    pub transaction_uuid: String,
    pub product_code: String,
}

impl EsewaCallback {
    /// `status` is `COMPLETE`: a hint to run the status check now.
    pub fn is_complete(&self) -> bool {
        self.status.eq_ignore_ascii_case("COMPLETE")
    }
}

/// Fields a callback must have signed for us to read it.
const MUST_BE_SIGNED: [&str; 4] = ["status", "total_amount", "transaction_uuid", "product_code"];

fn decode_data(data: &str) -> Result<Vec<u8>, CallbackError> {
    // A '+' that went through form decoding comes back as a space.
    let text: String = data.trim().replace(' ', "+");
    if text.is_empty() || text.len() > MAX_DATA_LEN {
        return Err(CallbackError::Malformed("data is empty or too long".into()));
    }
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        if let Ok(bytes) = engine.decode(&text) {
            return Ok(bytes);
        }
    }
    Err(CallbackError::Malformed("data is not base64".into()))
}

/// Check eSewa's success redirect `data` (the query parameter, decoded
/// from the URL) with the project's credentials: the signature over the
/// callback's own `signed_field_names` (values as received), that the
/// status, amount, reference and product code are among the signed fields,
/// and that the product code is the project's.
pub fn verify_callback(
    creds: &ProviderCredentials,
    data: &str,
) -> Result<EsewaCallback, CallbackError> {
    let ProviderCredentials::Esewa {
        product_code,
        secret_key,
    } = creds
    else {
        return Err(CallbackError::WrongCredentials);
    };
    let bytes = decode_data(data)?;
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|_| CallbackError::Malformed("data is not JSON".into()))?;
    let Some(obj) = json.as_object() else {
        return Err(CallbackError::Malformed("data is not a JSON object".into()));
    };
    let text = |name: &str| obj.get(name).and_then(json_text);
    let names_text = text("signed_field_names")
        .ok_or_else(|| CallbackError::Malformed("signed_field_names is missing".into()))?;
    let signature =
        text("signature").ok_or_else(|| CallbackError::Malformed("signature is missing".into()))?;
    let names: Vec<&str> = names_text.split(',').collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(CallbackError::Malformed(
            "signed_field_names has an empty name".into(),
        ));
    }
    let mut pairs: Vec<(&str, String)> = Vec::with_capacity(names.len());
    for name in &names {
        let value = text(name).ok_or_else(|| {
            CallbackError::Malformed(format!("signed field {:?} is missing", clip(name, 40)))
        })?;
        pairs.push((name, value));
    }
    let verifies = |pairs: &[(&str, String)]| {
        let borrowed: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        sign::esewa_verify(secret_key, &sign::esewa_message(&borrowed), &signature)
    };
    // eSewa writes amounts of 1,000 and more with thousands separators
    // (`"6,600.0"`) but signs them without (`6600.0`): the values as
    // received first, then the amounts with the separators removed.
    let plain: Vec<(&str, String)> = pairs
        .iter()
        .map(|(k, v)| match *k {
            "total_amount" | "amount" => (*k, v.replace(',', "")),
            _ => (*k, v.clone()),
        })
        .collect();
    if !verifies(&pairs) && (plain == pairs || !verifies(&plain)) {
        return Err(CallbackError::BadSignature);
    }
    let signed = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    };
    for name in MUST_BE_SIGNED {
        if signed(name).is_none() {
            return Err(CallbackError::Malformed(format!("{name} is not signed")));
        }
    }
    let callback_product = signed("product_code").unwrap_or_default();
    if callback_product != *product_code {
        return Err(CallbackError::MerchantMismatch);
    }
    let total_amount_raw = signed("total_amount").unwrap_or_default();
    let total_amount = parse_rupees(&total_amount_raw)
        .map_err(|e| CallbackError::Malformed(format!("total_amount: {e}")))?;
    Ok(EsewaCallback {
        transaction_code: signed("transaction_code"),
        status: signed("status").unwrap_or_default(),
        total_amount,
        total_amount_raw,
        transaction_uuid: signed("transaction_uuid").unwrap_or_default(),
        product_code: callback_product,
    })
}

#[cfg(test)]
mod tests {
    use super::super::mock::Mock;
    use super::super::{ProviderClients, ProviderConfig};
    use super::*;
    use std::time::Duration;

    const SECRET: &str = "8gBm/:&EnhH.1/q";
    const DOC_CALLBACK: &str = r#"{"transaction_code":"000AWEO","status":"COMPLETE","total_amount":"1000.0","transaction_uuid":"250610-162413","product_code":"EPAYTEST","signed_field_names":"transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names","signature":"62GcfZTmVkzhtUeh+QJ1AqiJrjoWWGof3U+eTPTZ7fA="}"#;

    fn creds() -> ProviderCredentials {
        ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: SECRET.into(),
        }
    }

    fn paisa(v: i64) -> Paisa {
        Paisa::new(v).unwrap_or_default()
    }

    fn attempt(reference: &str, amount: i64) -> Attempt {
        Attempt {
            reference: reference.into(),
            amount: paisa(amount),
            return_url: "https://gw.example/r/esewa/ok".into(),
            failure_url: Some("https://gw.example/r/esewa/fail".into()),
            website_url: "https://shop.example".into(),
            order_name: "Order 1".into(),
            customer: None,
            channel: Channel::Browser,
        }
    }

    fn sign_json(fields: &[(&str, &str)], secret: &str) -> String {
        let names = fields
            .iter()
            .map(|(k, _)| *k)
            .chain(["signed_field_names"])
            .collect::<Vec<_>>()
            .join(",");
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        all.push(("signed_field_names", &names));
        let sig = sign::esewa_signature(secret, &sign::esewa_message(&all));
        let mut obj = serde_json::Map::new();
        for (k, v) in &all {
            obj.insert((*k).into(), Value::from(*v));
        }
        obj.insert("signature".into(), Value::from(sig));
        STANDARD.encode(Value::Object(obj).to_string())
    }

    #[test]
    fn the_form_matches_the_docs_vector() {
        let form = payment_form(
            "https://rc-epay.esewa.com.np/api/epay/main/v2/form",
            "EPAYTEST",
            SECRET,
            &attempt("241028", 11_000),
        );
        let Ok(Handoff::AutoPostForm { action, fields }) = form else {
            panic!("{form:?}")
        };
        assert_eq!(action, "https://rc-epay.esewa.com.np/api/epay/main/v2/form");
        let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(fields.len(), 11);
        assert_eq!(get("amount"), Some("110"));
        assert_eq!(get("tax_amount"), Some("0"));
        assert_eq!(get("total_amount"), Some("110"));
        assert_eq!(get("transaction_uuid"), Some("241028"));
        assert_eq!(get("product_code"), Some("EPAYTEST"));
        assert_eq!(get("product_service_charge"), Some("0"));
        assert_eq!(get("product_delivery_charge"), Some("0"));
        assert_eq!(get("success_url"), Some("https://gw.example/r/esewa/ok"));
        assert_eq!(get("failure_url"), Some("https://gw.example/r/esewa/fail"));
        assert_eq!(
            get("signed_field_names"),
            Some("total_amount,transaction_uuid,product_code")
        );
        assert_eq!(
            get("signature"),
            Some("i94zsd3oXF6ZsSr/kGqT4sSzYQzjj1W/waxjWyRwaME=")
        );
        assert!(fields.iter().all(|(_, v)| !v.is_empty()));
    }

    #[test]
    fn the_form_renders_paisa_and_refuses_what_esewa_cannot_take() {
        let mut a = attempt("ABC-123", 11_050);
        a.failure_url = None;
        let Ok(Handoff::AutoPostForm { fields, .. }) = payment_form("u", "EPAYTEST", SECRET, &a)
        else {
            panic!()
        };
        let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("total_amount").as_deref(), Some("110.50"));
        assert_eq!(get("failure_url"), get("success_url"));
        let msg = "total_amount=110.50,transaction_uuid=ABC-123,product_code=EPAYTEST";
        assert_eq!(get("signature"), Some(sign::esewa_signature(SECRET, msg)));

        for bad in [
            attempt("pay_01jd", 100),
            attempt("", 100),
            attempt("a b", 100),
        ] {
            assert!(matches!(
                payment_form("u", "EPAYTEST", SECRET, &bad),
                Err(ProviderError::Invalid(_))
            ));
        }
        assert!(matches!(
            payment_form("u", "EPAYTEST", SECRET, &attempt("R1", 0)),
            Err(ProviderError::Invalid(_))
        ));
    }

    #[test]
    fn the_docs_callback_verifies() {
        let data = STANDARD.encode(DOC_CALLBACK);
        let cb = verify_callback(&creds(), &data);
        assert_eq!(
            cb,
            Ok(EsewaCallback {
                transaction_code: Some("000AWEO".into()),
                status: "COMPLETE".into(),
                total_amount: paisa(100_000),
                total_amount_raw: "1000.0".into(),
                transaction_uuid: "250610-162413".into(),
                product_code: "EPAYTEST".into(),
            })
        );
        assert!(cb.is_ok_and(|c| c.is_complete()));
        // A '+' turned into a space by form decoding, and URL-safe base64.
        assert!(verify_callback(&creds(), &data.replace('+', " ")).is_ok());
        let url_safe = URL_SAFE_NO_PAD.encode(DOC_CALLBACK);
        assert!(verify_callback(&creds(), &url_safe).is_ok());
    }

    #[test]
    fn tampered_or_foreign_callbacks_are_refused() {
        let tampered = DOC_CALLBACK.replace("\"1000.0\"", "\"1000\"");
        assert_eq!(
            verify_callback(&creds(), &STANDARD.encode(tampered)),
            Err(CallbackError::BadSignature)
        );
        let status = DOC_CALLBACK.replace("COMPLETE", "COMPLETED");
        assert_eq!(
            verify_callback(&creds(), &STANDARD.encode(status)),
            Err(CallbackError::BadSignature)
        );
        let other_secret = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "another".into(),
        };
        assert_eq!(
            verify_callback(&other_secret, &STANDARD.encode(DOC_CALLBACK)),
            Err(CallbackError::BadSignature)
        );
        // Signed with our secret but for another product code.
        let foreign = sign_json(
            &[
                ("transaction_code", "0001ABC"),
                ("status", "COMPLETE"),
                ("total_amount", "10.0"),
                ("transaction_uuid", "R1"),
                ("product_code", "OTHER"),
            ],
            SECRET,
        );
        assert_eq!(
            verify_callback(&creds(), &foreign),
            Err(CallbackError::MerchantMismatch)
        );
        // A genuine signature that leaves the status unsigned proves nothing.
        let partial = sign_json(
            &[
                ("total_amount", "10.0"),
                ("transaction_uuid", "R1"),
                ("product_code", "EPAYTEST"),
            ],
            SECRET,
        );
        assert!(matches!(
            verify_callback(&creds(), &partial),
            Err(CallbackError::Malformed(m)) if m.contains("status")
        ));
        let khalti = ProviderCredentials::Khalti {
            secret_key: "k".into(),
        };
        assert_eq!(
            verify_callback(&khalti, &STANDARD.encode(DOC_CALLBACK)),
            Err(CallbackError::WrongCredentials)
        );
        let long = "A".repeat(MAX_DATA_LEN + 4);
        for junk in [
            "",
            "%%%",
            "bm90IGpzb24=",
            &STANDARD.encode("[1,2]"),
            &STANDARD.encode(r#"{"signature":"x"}"#),
            &STANDARD.encode(r#"{"signed_field_names":"status","status":"COMPLETE"}"#),
            &STANDARD.encode(r#"{"signed_field_names":"status,,x","signature":"x"}"#),
            &STANDARD.encode(r#"{"signed_field_names":"gone","signature":"x"}"#),
            &long,
        ] {
            assert!(
                matches!(
                    verify_callback(&creds(), junk),
                    Err(CallbackError::Malformed(_))
                ),
                "{junk}"
            );
        }
    }

    /// eSewa's callbacks for Rs 1,000 and more show the amount with
    /// thousands separators and sign it without them (captured UAT
    /// callbacks of public integrations): such a callback verifies and
    /// reads as its amount; a separator does not rescue a changed amount.
    #[test]
    fn a_callback_with_thousands_separators_verifies_over_the_plain_amount() {
        let names =
            "transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names";
        let signed_as = |total: &str| {
            sign::esewa_signature(
                SECRET,
                &format!(
                    "transaction_code=000D3LZ,status=COMPLETE,total_amount={total},transaction_uuid=240613-155000,product_code=EPAYTEST,signed_field_names={names}"
                ),
            )
        };
        let data = |shown: &str, sig: &str| {
            STANDARD.encode(format!(
                r#"{{"transaction_code":"000D3LZ","status":"COMPLETE","total_amount":"{shown}","transaction_uuid":"240613-155000","product_code":"EPAYTEST","signed_field_names":"{names}","signature":"{sig}"}}"#
            ))
        };
        let cb = verify_callback(&creds(), &data("6,600.0", &signed_as("6600.0")));
        assert_eq!(cb.as_ref().map(|c| c.total_amount), Ok(paisa(660_000)));
        assert_eq!(cb.map(|c| c.total_amount_raw), Ok("6,600.0".to_owned()));
        // Signed as shown also verifies (the values as received come first).
        assert!(verify_callback(&creds(), &data("6,600.0", &signed_as("6,600.0"))).is_ok());
        assert!(verify_callback(&creds(), &data("1,000,000.0", &signed_as("1000000.0"))).is_ok());
        // Another amount, with or without separators: refused.
        for shown in ["6,700.0", "66,000.0", "6600.5"] {
            assert_eq!(
                verify_callback(&creds(), &data(shown, &signed_as("6600.0"))).err(),
                Some(CallbackError::BadSignature),
                "{shown}"
            );
        }
    }

    #[test]
    fn callback_amounts_are_read_as_sent() {
        for (raw, want) in [("1,000.0", 100_000), ("110", 11_000), ("110.5", 11_050)] {
            let data = sign_json(
                &[
                    ("transaction_code", "000AWEO"),
                    ("status", "COMPLETE"),
                    ("total_amount", raw),
                    ("transaction_uuid", "R1"),
                    ("product_code", "EPAYTEST"),
                ],
                SECRET,
            );
            let cb = verify_callback(&creds(), &data);
            assert_eq!(
                cb.as_ref().map(|c| c.total_amount),
                Ok(paisa(want)),
                "{raw}"
            );
            assert_eq!(cb.map(|c| c.total_amount_raw), Ok(raw.to_owned()));
        }
        let garbage = sign_json(
            &[
                ("status", "COMPLETE"),
                ("total_amount", "ten"),
                ("transaction_uuid", "R1"),
                ("product_code", "EPAYTEST"),
            ],
            SECRET,
        );
        assert!(matches!(
            verify_callback(&creds(), &garbage),
            Err(CallbackError::Malformed(_))
        ));
        // Numbers in the JSON are signed by their JSON text.
        let names = "status,total_amount,transaction_uuid,product_code,signed_field_names";
        let msg = format!(
            "status=COMPLETE,total_amount=1000.0,transaction_uuid=R1,product_code=EPAYTEST,signed_field_names={names}"
        );
        let sig = sign::esewa_signature(SECRET, &msg);
        let body = format!(
            r#"{{"status":"COMPLETE","total_amount":1000.0,"transaction_uuid":"R1","product_code":"EPAYTEST","signed_field_names":"{names}","signature":"{sig}"}}"#
        );
        let cb = verify_callback(&creds(), &STANDARD.encode(body));
        assert_eq!(
            cb.map(|c| (c.total_amount, c.transaction_code)),
            Ok((paisa(100_000), None))
        );
    }

    fn clients(mock: &Mock, timeout_ms: u64) -> ProviderClients {
        let cfg =
            ProviderConfig::for_base(&mock.base).with_timeout(Duration::from_millis(timeout_ms));
        ProviderClients::new(&cfg).expect("clients")
    }

    fn query(reference: &str, amount: i64) -> StatusQuery {
        StatusQuery {
            reference: reference.into(),
            amount: paisa(amount),
            provider_ref: None,
        }
    }

    #[tokio::test]
    async fn initiate_builds_the_form_at_the_configured_url() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        let h = c
            .get(Provider::Esewa)
            .initiate(&creds(), &attempt("241028", 11_000))
            .await;
        let Ok(Handoff::AutoPostForm { action, .. }) = h else {
            panic!("{h:?}")
        };
        assert_eq!(action, format!("{}/esewa/api/epay/main/v2/form", mock.base));
        assert!(mock.requests().is_empty(), "no call to eSewa");
        let mut qr = attempt("241028", 11_000);
        qr.channel = Channel::Qr;
        assert!(matches!(
            c.esewa.initiate(&creds(), &qr).await,
            Err(ProviderError::Unsupported(_))
        ));
        let khalti = ProviderCredentials::Khalti {
            secret_key: "k".into(),
        };
        let r = c.esewa.initiate(&khalti, &attempt("R1", 100)).await;
        assert!(matches!(r, Err(ProviderError::Invalid(_))));
        assert!(matches!(
            c.esewa.refund(&creds(), "000AWEO", None, None).await,
            Err(ProviderError::Unsupported(_))
        ));
    }

    #[tokio::test]
    async fn status_sends_the_documented_query_and_maps_every_status() {
        let mock = Mock::start().await;
        let c = clients(&mock, 2000);
        let cases = [
            ("PENDING", "null", ProviderState::Pending),
            ("COMPLETE", "\"0007G36\"", ProviderState::Paid),
            (
                "FULL_REFUND",
                "\"0007G36\"",
                ProviderState::Refunded { partial: false },
            ),
            (
                "PARTIAL_REFUND",
                "\"0007G36\"",
                ProviderState::Refunded { partial: true },
            ),
            ("AMBIGUOUS", "\"0007G36\"", ProviderState::Ambiguous),
            ("NOT_FOUND", "null", ProviderState::NotFound),
            ("CANCELED", "\"0007G36\"", ProviderState::Cancelled),
            ("SOMETHING_NEW", "null", ProviderState::Ambiguous),
        ];
        for (word, ref_id, state) in cases {
            mock.reply(
                200,
                format!(
                    r#"{{"product_code":"EPAYTEST","transaction_uuid":"R-1","total_amount":100.0,"status":"{word}","ref_id":{ref_id}}}"#
                ),
            );
            let s = c.esewa.status(&creds(), &query("R-1", 10_000)).await;
            let want = ProviderStatus {
                state,
                amount: Some(paisa(10_000)),
                provider_ref: (ref_id != "null").then(|| "0007G36".to_owned()),
                fee: None,
                raw_status: word.into(),
            };
            assert_eq!(s, Ok(want), "{word}");
        }
        let req = mock.last();
        assert_eq!(req.method, "GET");
        assert_eq!(req.path, "/esewa/api/epay/transaction/status/");
        assert_eq!(
            req.query_pairs(),
            vec![
                ("product_code".to_owned(), "EPAYTEST".to_owned()),
                ("total_amount".to_owned(), "100".to_owned()),
                ("transaction_uuid".to_owned(), "R-1".to_owned()),
            ]
        );
        assert!(req.header("authorization").is_none());
        // The same amount string the form signed.
        let _ = c.esewa.status(&creds(), &query("R-1", 11_050)).await;
        assert!(
            mock.last()
                .query_pairs()
                .contains(&("total_amount".into(), "110.50".into()))
        );
    }

    #[tokio::test]
    async fn status_errors_are_classified() {
        let mock = Mock::start().await;
        let c = clients(&mock, 300);
        let q = query("R-1", 10_000);
        mock.reply(
            200,
            r#"{"code":0,"error_message":"Service is currently unavailable"}"#,
        );
        assert!(matches!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Unavailable(_))
        ));
        mock.reply(
            400,
            r#"{"code":"ES104","error_message":"Invalid payload signature"}"#,
        );
        assert_eq!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Rejected {
                code: "ES104".into(),
                message: "Invalid payload signature".into()
            })
        );
        mock.reply(503, "<html>down</html>");
        assert_eq!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Unavailable("HTTP 503".into()))
        );
        mock.reply(200, "<html>not json</html>");
        assert!(matches!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(404, "<html>no such page</html>");
        assert!(matches!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Rejected { code, .. }) if code == "http_404"
        ));
        mock.reply(200, r#"{"product_code":"EPAYTEST","transaction_uuid":"OTHER","total_amount":100.0,"status":"COMPLETE","ref_id":"X"}"#);
        assert!(matches!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(200, r#"{"product_code":"EPAYTEST","transaction_uuid":"R-1","total_amount":"a lot","status":"COMPLETE","ref_id":"X"}"#);
        assert!(matches!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Protocol(_))
        ));
        mock.reply(200, r#"{"status":"COMPLETE"}"#);
        mock.delay(Duration::from_millis(1500));
        assert_eq!(
            c.esewa.status(&creds(), &q).await,
            Err(ProviderError::Timeout)
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_unavailable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let cfg = ProviderConfig::for_base(&format!("http://{addr}"));
        let c = ProviderClients::new(&cfg).expect("clients");
        let r = c.esewa.status(&creds(), &query("R-1", 100)).await;
        assert!(matches!(r, Err(ProviderError::Unavailable(_))), "{r:?}");
    }
}
