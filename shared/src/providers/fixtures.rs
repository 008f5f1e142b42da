//! Genuine provider messages (`fixtures/`, provenance in its README): each
//! one goes through the same code a live message does and must verify and
//! parse to what the provider meant.

use super::mock::Mock;
use super::{
    Attempt, CallbackError, Channel, Handoff, Provider, ProviderClients, ProviderConfig,
    ProviderCredentials, ProviderError, ProviderState, StatusQuery, esewa, fonepay, khalti,
};
use crate::money::Paisa;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use std::time::Duration;

const ESEWA_UAT_SECRET: &str = "8gBm/:&EnhH.1/q";

macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!("fixtures/", $path)).trim_end()
    };
}

fn paisa(v: i64) -> Paisa {
    Paisa::new(v).unwrap_or_default()
}

fn esewa_uat() -> ProviderCredentials {
    ProviderCredentials::Esewa {
        product_code: "EPAYTEST".into(),
        secret_key: ESEWA_UAT_SECRET.into(),
    }
}

fn khalti_docs() -> ProviderCredentials {
    ProviderCredentials::Khalti {
        secret_key: "live_secret_key_68791341fdd94846a146f0457ff7b455".into(),
    }
}

fn fonepay_pdf() -> ProviderCredentials {
    ProviderCredentials::Fonepay {
        merchant_code: "NBQM".into(),
        secret_key: "a7e3512f5032480a83137793cb2021dc".into(),
        username: "9861101076".into(),
        password: "admin123456".into(),
    }
}

async fn answering(status: u16, body: &str) -> (Mock, ProviderClients) {
    let mock = Mock::start().await;
    mock.reply(status, body);
    let cfg = ProviderConfig::for_base(&mock.base).with_timeout(Duration::from_secs(5));
    let clients = ProviderClients::new(&cfg).expect("clients");
    (mock, clients)
}

fn query(reference: &str, amount: i64, provider_ref: Option<&str>) -> StatusQuery {
    StatusQuery {
        reference: reference.into(),
        amount: paisa(amount),
        provider_ref: provider_ref.map(str::to_owned),
    }
}

#[test]
fn esewa_uat_and_docs_callbacks_verify_and_parse() {
    let docs = STANDARD.encode(fixture!("esewa/callback_docs_1000.json"));
    for (data, uuid, code, amount) in [
        (
            fixture!("esewa/callback_uat_133.b64").to_owned(),
            "1234567890",
            "0006TY3",
            13_300,
        ),
        (
            fixture!("esewa/callback_uat_400.b64").to_owned(),
            "MT1741357119",
            "0009XK3",
            40_000,
        ),
        (
            fixture!("esewa/callback_uat_2500.b64").to_owned(),
            "TXN-1769092167-9499",
            "000DX7T",
            250_000,
        ),
        (docs, "250610-162413", "000AWEO", 100_000),
    ] {
        let cb = esewa::verify_callback(&esewa_uat(), &data).expect(uuid);
        assert!(cb.is_complete(), "{uuid}");
        assert_eq!(cb.transaction_uuid, uuid);
        assert_eq!(cb.transaction_code.as_deref(), Some(code));
        assert_eq!(cb.total_amount, paisa(amount), "{uuid}");
        assert_eq!(cb.product_code, "EPAYTEST");
        // One byte of the signature changed: refused.
        let json = String::from_utf8(STANDARD.decode(&data).expect("b64")).expect("utf8");
        let forged = json.replacen("\"signature\":\"", "\"signature\":\"A", 1);
        assert_eq!(
            esewa::verify_callback(&esewa_uat(), &STANDARD.encode(forged)),
            Err(CallbackError::BadSignature),
            "{uuid}"
        );
    }
}

#[test]
fn esewa_amounts_with_thousands_separators_verify_and_parse() {
    let json = fixture!("esewa/callback_uat_6600_separator.json");
    let cb = esewa::verify_callback(&esewa_uat(), &STANDARD.encode(json)).expect("verifies");
    assert_eq!(cb.total_amount_raw, "6,600.0");
    assert_eq!(cb.total_amount, paisa(660_000));
    // Another amount with the same separator shape does not.
    let forged = json.replace("6,600.0", "6,900.0");
    assert_eq!(
        esewa::verify_callback(&esewa_uat(), &STANDARD.encode(forged)),
        Err(CallbackError::BadSignature)
    );
    // A real production capture of another merchant: its amount reads as
    // Rs 1,000; with the UAT key it is, rightly, not ours.
    let live = fixture!("esewa/callback_live_1000_separator.b64");
    let decoded: serde_json::Value =
        serde_json::from_slice(&STANDARD.decode(live).expect("b64")).expect("json");
    assert_eq!(decoded["total_amount"], "1,000.0");
    assert_eq!(
        super::amount::rupees_from_json(&decoded["total_amount"]),
        Ok(paisa(100_000))
    );
    assert!(esewa::verify_callback(&esewa_uat(), live).is_err());
}

#[tokio::test]
async fn esewa_status_answers_parse() {
    for (file, state, reference) in [
        (
            fixture!("esewa/status_complete.json"),
            ProviderState::Paid,
            Some("0001TS9"),
        ),
        (
            fixture!("esewa/status_pending.json"),
            ProviderState::Pending,
            None,
        ),
    ] {
        let (_mock, c) = answering(200, file).await;
        let s = c
            .get(Provider::Esewa)
            .status(&esewa_uat(), &query("123", 10_000, None))
            .await
            .expect(file);
        assert_eq!(s.state, state);
        assert_eq!(s.amount, Some(paisa(10_000)));
        assert_eq!(s.provider_ref.as_deref(), reference);
    }
    let (_mock, c) = answering(200, fixture!("esewa/status_unavailable.json")).await;
    let down = c
        .get(Provider::Esewa)
        .status(&esewa_uat(), &query("123", 10_000, None))
        .await;
    assert!(
        matches!(down, Err(ProviderError::Unavailable(_))),
        "{down:?}"
    );
}

#[tokio::test]
async fn khalti_initiate_and_lookups_parse() {
    let (_mock, c) = answering(200, fixture!("khalti/initiate.json")).await;
    let attempt = Attempt {
        reference: "test12".into(),
        amount: paisa(1000),
        return_url: "https://gw.example/r/khalti/att_1".into(),
        failure_url: None,
        website_url: "https://shop.example".into(),
        order_name: "test".into(),
        customer: None,
        channel: Channel::Browser,
    };
    assert_eq!(
        c.get(Provider::Khalti)
            .initiate(&khalti_docs(), &attempt)
            .await,
        Ok(Handoff::Redirect {
            url: "https://test-pay.khalti.com/?pidx=bZQLD9wRVWo4CdESSfuSsB".into(),
            provider_ref: Some("bZQLD9wRVWo4CdESSfuSsB".into()),
        })
    );
    for (http, file, pidx, state, txn) in [
        (
            200,
            fixture!("khalti/lookup_completed.json"),
            "HT6o6PEZRWFJ5ygavzHWd5",
            ProviderState::Paid,
            Some("GFq9PFS7b2iYvL8Lir9oXe"),
        ),
        (
            200,
            fixture!("khalti/lookup_pending.json"),
            "HT6o6PEZRWFJ5ygavzHWd5",
            ProviderState::Pending,
            None,
        ),
        (
            400,
            fixture!("khalti/lookup_expired_400.json"),
            "H90RPe2Su4DjAmLbJDLKWf",
            ProviderState::Expired,
            None,
        ),
        (
            400,
            fixture!("khalti/lookup_user_canceled_400.json"),
            "vNTeXkSEaEXK2J4i7cQU6e",
            ProviderState::Cancelled,
            None,
        ),
    ] {
        let (_mock, c) = answering(http, file).await;
        let s = c
            .get(Provider::Khalti)
            .status(&khalti_docs(), &query("test12", 1000, Some(pidx)))
            .await
            .expect(file);
        assert_eq!(s.state, state, "{file}");
        assert_eq!(s.amount, Some(paisa(1000)));
        assert_eq!(s.provider_ref.as_deref(), txn);
    }
    let (_mock, c) = answering(404, fixture!("khalti/lookup_not_found_404.json")).await;
    let s = c
        .get(Provider::Khalti)
        .status(&khalti_docs(), &query("test12", 1000, Some("unknownpidx")))
        .await;
    assert!(
        matches!(s, Ok(ref s) if s.state == ProviderState::NotFound),
        "{s:?}"
    );
}

#[test]
fn khalti_returns_parse() {
    let ok = khalti::parse_return(fixture!("khalti/return_completed.query"));
    assert_eq!(ok.pidx.as_deref(), Some("bZQLD9wRVWo4CdESSfuSsB"));
    assert_eq!(ok.claimed_state(), Some(ProviderState::Paid));
    assert_eq!(ok.transaction_id.as_deref(), Some("4H7AhoXDJWg5WjrcPT9ixW"));
    assert_eq!(ok.amount, Some(paisa(1000)));
    assert_eq!(ok.mobile.as_deref(), Some("98XXXXX904"));
    let cancel = khalti::parse_return(fixture!("khalti/return_user_canceled.query"));
    assert_eq!(cancel.claimed_state(), Some(ProviderState::Cancelled));
    assert_eq!(cancel.transaction_id, None);
    assert_eq!(cancel.purchase_order_id.as_deref(), Some("test12"));
}

#[tokio::test]
async fn fonepay_qr_and_status_answers_parse() {
    let (_mock, c) = answering(200, fixture!("fonepay/qr_create.json")).await;
    let attempt = Attempt {
        reference: "5d76d323-d1f6".into(),
        amount: paisa(1400),
        return_url: "https://gw.example/r/fonepay/att1".into(),
        failure_url: None,
        website_url: "https://shop.example".into(),
        order_name: "test1".into(),
        customer: None,
        channel: Channel::Qr,
    };
    let h = c
        .get(Provider::Fonepay)
        .initiate(&fonepay_pdf(), &attempt)
        .await;
    assert_eq!(
        h,
        Ok(Handoff::Qr {
            qr_message: "000201010212...6304d3f7".into(),
            websocket_url: Some("wss://dev-ws.fonepay.com/convergent-webSocket-web/merchantEndPoint/Td35588c2d9a647f28f4959f96f905bec/NBQM/Y".into()),
            provider_ref: None,
        })
    );
    let (_mock, c) = answering(406, fixture!("fonepay/qr_create_error.json")).await;
    let e = c
        .get(Provider::Fonepay)
        .initiate(&fonepay_pdf(), &attempt)
        .await;
    assert!(
        matches!(e, Err(ProviderError::Rejected { ref message, .. }) if message.contains("Data Validation Failed")),
        "{e:?}"
    );
    let prn = "5d76d323-d1f6-4a38-8231-0063f9581c98";
    for (file, state, trace) in [
        (
            fixture!("fonepay/qr_status_success.json"),
            ProviderState::Paid,
            "17404",
        ),
        (
            fixture!("fonepay/qr_status_failed.json"),
            ProviderState::Failed,
            "17405",
        ),
    ] {
        let (_mock, c) = answering(200, file).await;
        let s = c
            .get(Provider::Fonepay)
            .status(&fonepay_pdf(), &query(prn, 1400, None))
            .await
            .expect(file);
        assert_eq!(s.state, state);
        assert_eq!(s.provider_ref.as_deref(), Some(trace));
    }
}

#[test]
fn fonepay_websocket_frames_parse() {
    assert_eq!(
        fonepay::parse_ws_frame(fixture!("fonepay/ws_verified.json")),
        Ok(fonepay::FonepayWsEvent::Verified { qr_verified: true })
    );
    let prn = Some("5d76d323-d1f6-4a38-8231-0063f9581c98".to_owned());
    assert_eq!(
        fonepay::parse_ws_frame(fixture!("fonepay/ws_paid.json")),
        Ok(fonepay::FonepayWsEvent::Payment {
            payment_success: true,
            trace_id: Some("17015".into()),
            prn: prn.clone(),
            amount: Some(paisa(1400)),
            message: Some("Request Complete".into()),
        })
    );
    // `success` is true on a failed payment too: `paymentSuccess` decides.
    assert_eq!(
        fonepay::parse_ws_frame(fixture!("fonepay/ws_failed.json")),
        Ok(fonepay::FonepayWsEvent::Payment {
            payment_success: false,
            trace_id: Some("17016".into()),
            prn,
            amount: Some(paisa(1400)),
            message: Some("Request Failed".into()),
        })
    );
}
