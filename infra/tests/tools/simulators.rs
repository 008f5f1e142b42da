//! The provider simulators over real HTTP, driven the way a provider
//! client would drive eSewa, Khalti and Fonepay (raw requests, redirects
//! not followed), independently of the clients in `shared::providers`.
//! The router is mounted at `/sim`, as the gateway mounts it, so every
//! generated URL must carry that base.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use dhukuti::simulators::{self, KHALTI_TEST_SECRET_KEY, SimConfig, SimState};
use reqwest::{StatusCode, Url, redirect};
use serde_json::{Value, json};
use shared::providers::sign;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ESEWA_SECRET: &str = "8gBm/:&EnhH.1/q";
const FONEPAY_SECRET: &str = "a7e3512f5032480a83137793cb2021dc";
const FONEPAY_USER: &str = "9861101076";
const FONEPAY_PASSWORD: &str = "admin123456";
const MERCHANT: &str = "https://shop.example";

struct Sim {
    base: String,
    addr: std::net::SocketAddr,
    http: reqwest::Client,
}

async fn start() -> Sim {
    start_with(|_| {}).await
}

async fn start_with(configure: impl FnOnce(&mut SimConfig)) -> Sim {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base = format!("http://{addr}/sim");
    let mut config = SimConfig::new(&base);
    config.timeout_delay = Duration::from_millis(1500);
    configure(&mut config);
    let app = Router::new().nest("/sim", simulators::router(SimState::new(config)));
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let http = reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Sim { base, addr, http }
}

fn form_body(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .unwrap_or_else(|| panic!("no Location on {}", resp.status()))
        .to_str()
        .unwrap()
        .to_owned()
}

fn query_of(url: &str) -> HashMap<String, String> {
    Url::parse(url)
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

impl Sim {
    async fn post_form(&self, url: &str, pairs: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(pairs))
            .send()
            .await
            .unwrap()
    }

    async fn control(&self, provider: &str, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}/{provider}/_control/{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap())
    }

    async fn next(&self, provider: &str, body: Value) {
        let (status, answer) = self.control(provider, "next", body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    async fn attempt(&self, provider: &str, reference: &str) -> Value {
        self.http
            .get(format!(
                "{}/{provider}/_control/attempts/{reference}",
                self.base
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    // --- eSewa --------------------------------------------------------

    fn esewa_form_url(&self) -> String {
        format!("{}/esewa/api/epay/main/v2/form", self.base)
    }

    /// The docs' example form: amount 100 + tax 10 = 110.
    fn esewa_fields(uuid: &str, secret: &str) -> Vec<(String, String)> {
        let message = sign::esewa_message(&[
            ("total_amount", "110"),
            ("transaction_uuid", uuid),
            ("product_code", "EPAYTEST"),
        ]);
        let signature = sign::esewa_signature(secret, &message);
        [
            ("amount", "100"),
            ("tax_amount", "10"),
            ("product_service_charge", "0"),
            ("product_delivery_charge", "0"),
            ("total_amount", "110"),
            ("transaction_uuid", uuid),
            ("product_code", "EPAYTEST"),
            ("success_url", &format!("{MERCHANT}/esewa/success")),
            ("failure_url", &format!("{MERCHANT}/esewa/failure")),
            (
                "signed_field_names",
                "total_amount,transaction_uuid,product_code",
            ),
            ("signature", &signature),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    async fn esewa_post(&self, fields: &[(String, String)]) -> reqwest::Response {
        let pairs: Vec<(&str, &str)> = fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.post_form(&self.esewa_form_url(), &pairs).await
    }

    async fn esewa_status_raw(&self, uuid: &str, total: &str) -> reqwest::Response {
        let url = format!(
            "{}/esewa/api/epay/transaction/status/?product_code=EPAYTEST&total_amount={total}&transaction_uuid={uuid}",
            self.base
        );
        self.http.get(url).send().await.unwrap()
    }

    async fn esewa_status(&self, uuid: &str) -> Value {
        let resp = self.esewa_status_raw(uuid, "110").await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.unwrap()
    }

    // --- Khalti -------------------------------------------------------

    async fn khalti(&self, path: &str, key: Option<&str>, body: Value) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/khalti/api/{path}", self.base))
            .json(&body);
        if let Some(k) = key {
            req = req.header("authorization", k);
        }
        req.send().await.unwrap()
    }

    async fn khalti_initiate(&self, order: &str, amount: i64) -> Value {
        let resp = self
            .khalti(
                "v2/epayment/initiate/",
                Some(&format!("Key {KHALTI_TEST_SECRET_KEY}")),
                json!({
                    "return_url": format!("{MERCHANT}/khalti/return"),
                    "website_url": MERCHANT,
                    "amount": amount,
                    "purchase_order_id": order,
                    "purchase_order_name": "Dhaka topi",
                    "customer_info": {"name": "Sita", "email": "sita@example.com", "phone": "9800000001"},
                    "merchant_extra": "x1",
                }),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.unwrap()
    }

    async fn khalti_lookup(&self, pidx: &str) -> (StatusCode, Value) {
        let resp = self
            .khalti(
                "v2/epayment/lookup/",
                Some(&format!("Key {KHALTI_TEST_SECRET_KEY}")),
                json!({ "pidx": pidx }),
            )
            .await;
        let status = resp.status();
        (status, resp.json().await.unwrap())
    }

    /// A refund call: the status and the raw body (a 500 is HTML).
    async fn khalti_refund_raw(&self, txn: &str, body: Value) -> (StatusCode, String) {
        let resp = self
            .khalti(
                &format!("merchant-transaction/{txn}/refund/"),
                Some(&format!("Key {KHALTI_TEST_SECRET_KEY}")),
                body,
            )
            .await;
        let status = resp.status();
        (status, resp.text().await.unwrap())
    }

    async fn khalti_refund(&self, txn: &str, body: Value) -> (StatusCode, Value) {
        let (status, text) = self.khalti_refund_raw(txn, body).await;
        let j = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {status} {text}"));
        (status, j)
    }

    /// A Khalti payment of `amount` paisa, paid from the wallet: its pidx
    /// and transaction id.
    async fn khalti_paid(&self, order: &str, amount: i64) -> (String, String) {
        let init = self.khalti_initiate(order, amount).await;
        let pidx = init["pidx"].as_str().unwrap().to_owned();
        let (status, acted) = self
            .control("khalti", &format!("attempts/{pidx}/pay"), json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "{acted}");
        let txn = query_of(acted["callback_url"].as_str().unwrap())["transaction_id"].clone();
        (pidx, txn)
    }

    // --- Fonepay ------------------------------------------------------

    async fn fonepay(&self, call: &str, body: Value) -> reqwest::Response {
        self.http
            .post(format!(
                "{}/fonepay/api/merchant/merchantDetailsForThirdParty/{call}",
                self.base
            ))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn qr_create_raw(&self, prn: &str, dv: &str) -> reqwest::Response {
        self.fonepay(
            "thirdPartyDynamicQrDownload",
            json!({
                "amount": "14", "remarks1": "test1", "remarks2": "test2", "prn": prn,
                "merchantCode": "NBQM", "dataValidation": dv,
                "username": FONEPAY_USER, "password": FONEPAY_PASSWORD,
            }),
        )
        .await
    }

    async fn qr_create(&self, prn: &str) -> Value {
        // Fonepay's Java sample sends UPPERCASE hex: accepted.
        let dv =
            sign::fonepay_data_validation(FONEPAY_SECRET, &["14", prn, "NBQM", "test1", "test2"])
                .to_ascii_uppercase();
        let resp = self.qr_create_raw(prn, &dv).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.unwrap()
    }

    async fn qr_status_raw(&self, prn: &str) -> reqwest::Response {
        let dv = sign::fonepay_data_validation(FONEPAY_SECRET, &[prn, "NBQM"]);
        self.fonepay(
            "thirdPartyDynamicQrGetStatus",
            json!({
                "prn": prn, "merchantCode": "NBQM", "dataValidation": dv,
                "username": FONEPAY_USER, "password": FONEPAY_PASSWORD,
            }),
        )
        .await
    }

    async fn qr_status(&self, prn: &str) -> Value {
        let resp = self.qr_status_raw(prn).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.unwrap()
    }
}

/// Decodes eSewa's `data` and checks its signature over its own
/// `signed_field_names`, with the values exactly as received.
fn esewa_data(callback: &str) -> Value {
    let q = query_of(callback);
    let raw = STANDARD.decode(q.get("data").expect("data")).unwrap();
    serde_json::from_slice(&raw).unwrap()
}

fn esewa_data_verifies(data: &Value) -> bool {
    let names = data["signed_field_names"].as_str().unwrap();
    let values: Vec<(String, String)> = names
        .split(',')
        .map(|n| {
            let v = match &data[n] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (n.to_owned(), v)
        })
        .collect();
    let pairs: Vec<(&str, &str)> = values
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    sign::esewa_verify(
        ESEWA_SECRET,
        &sign::esewa_message(&pairs),
        data["signature"].as_str().unwrap(),
    )
}

// ===========================================================================
// eSewa

#[tokio::test]
async fn esewa_wallet_form_pay_signed_callback_and_status() {
    let sim = start().await;
    let uuid = "250610-162413";

    let resp = sim.esewa_post(&Sim::esewa_fields(uuid, ESEWA_SECRET)).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let wallet = location(&resp);
    assert_eq!(wallet, format!("{}/esewa/wallet/{uuid}", sim.base));

    // Before paying: PENDING, no ref_id.
    let s = sim.esewa_status(uuid).await;
    assert_eq!(s["status"], "PENDING");
    assert_eq!(s["ref_id"], Value::Null);

    // The wallet page works without JavaScript: plain form POSTs.
    let page = sim.http.get(&wallet).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("<form method=post"), "{html}");
    assert!(html.contains("value=\"pay\""));
    assert!(!html.contains("<script"));

    let resp = sim.post_form(&wallet, &[("action", "pay")]).await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    let callback = location(&resp);
    assert!(callback.starts_with(&format!("{MERCHANT}/esewa/success?data=")));

    let data = esewa_data(&callback);
    assert_eq!(data["status"], "COMPLETE");
    assert_eq!(data["total_amount"], "110.0", "Java-double style string");
    assert_eq!(data["transaction_uuid"], uuid);
    assert_eq!(data["product_code"], "EPAYTEST");
    assert_eq!(
        data["signed_field_names"],
        "transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names"
    );
    let code = data["transaction_code"].as_str().unwrap().to_owned();
    assert_eq!(code.len(), 7);
    assert!(esewa_data_verifies(&data));
    // The raw JSON keeps eSewa's key order.
    let raw = String::from_utf8(
        STANDARD
            .decode(query_of(&callback).get("data").unwrap())
            .unwrap(),
    )
    .unwrap();
    assert!(raw.starts_with("{\"transaction_code\":"), "{raw}");

    // An altered amount no longer verifies, nor does a reformatted one.
    let mut altered = data.clone();
    altered["total_amount"] = json!("11.0");
    assert!(!esewa_data_verifies(&altered));
    let mut reformatted = data.clone();
    reformatted["total_amount"] = json!("110");
    assert!(!esewa_data_verifies(&reformatted));

    let s = sim.esewa_status(uuid).await;
    assert_eq!(s["status"], "COMPLETE");
    assert_eq!(s["ref_id"], code.as_str());
    assert_eq!(s["total_amount"], json!(110.0));
    assert_eq!(s["product_code"], "EPAYTEST");
    assert_eq!(s["transaction_uuid"], uuid);

    // The decided wallet page links back; a second pay is refused.
    let resp = sim.post_form(&wallet, &[("action", "pay")]).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn esewa_control_pay_and_status_lookups() {
    let sim = start().await;
    let uuid = "ctl-1";
    let resp = sim.esewa_post(&Sim::esewa_fields(uuid, ESEWA_SECRET)).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);

    let (status, acted) = sim
        .control("esewa", &format!("attempts/{uuid}/pay"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{acted}");
    let callback = acted["callback_url"].as_str().unwrap();
    assert!(esewa_data_verifies(&esewa_data(callback)));
    assert_eq!(acted["attempt"]["status"], "COMPLETE");

    let a = sim.attempt("esewa", uuid).await;
    assert_eq!(a["status"], "COMPLETE");
    assert_eq!(a["last_callback_url"], callback);

    // Another amount or an unknown id: NOT_FOUND.
    let s: Value = sim
        .esewa_status_raw(uuid, "100")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(s["status"], "NOT_FOUND");
    assert_eq!(s["ref_id"], Value::Null);
    let s = sim.esewa_status("no-such").await;
    assert_eq!(s["status"], "NOT_FOUND");
    // "110.0" and "110" are the same amount to the status API.
    let s: Value = sim
        .esewa_status_raw(uuid, "110.0")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(s["status"], "COMPLETE");
}

#[tokio::test]
async fn esewa_failure_and_cancel_go_to_failure_url() {
    let sim = start().await;
    sim.next("esewa", json!({"outcome": "failure"})).await;
    let resp = sim
        .esewa_post(&Sim::esewa_fields("f-1", ESEWA_SECRET))
        .await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    assert_eq!(location(&resp), format!("{MERCHANT}/esewa/failure"));
    assert_eq!(sim.esewa_status("f-1").await["status"], "NOT_FOUND");

    sim.next("esewa", json!({"outcome": "cancel", "reference": "c-1"}))
        .await;
    let resp = sim
        .esewa_post(&Sim::esewa_fields("c-1", ESEWA_SECRET))
        .await;
    assert_eq!(location(&resp), format!("{MERCHANT}/esewa/failure"));
    assert_eq!(sim.esewa_status("c-1").await["status"], "CANCELED");

    // By hand, through the wallet page.
    let resp = sim
        .esewa_post(&Sim::esewa_fields("c-2", ESEWA_SECRET))
        .await;
    let wallet = location(&resp);
    let resp = sim.post_form(&wallet, &[("action", "cancel")]).await;
    assert_eq!(location(&resp), format!("{MERCHANT}/esewa/failure"));
    assert_eq!(sim.esewa_status("c-2").await["status"], "CANCELED");
}

#[tokio::test]
async fn esewa_success_preset_redirects_at_once() {
    let sim = start().await;
    sim.next("esewa", json!({"outcome": "success"})).await;
    let resp = sim
        .esewa_post(&Sim::esewa_fields("s-1", ESEWA_SECRET))
        .await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    let data = esewa_data(&location(&resp));
    assert!(esewa_data_verifies(&data));
    assert_eq!(sim.esewa_status("s-1").await["status"], "COMPLETE");
}

#[tokio::test]
async fn esewa_pending_then_success() {
    let sim = start().await;
    sim.next(
        "esewa",
        json!({"outcome": "pending_then_success", "pending_calls": 2}),
    )
    .await;
    let resp = sim
        .esewa_post(&Sim::esewa_fields("p-1", ESEWA_SECRET))
        .await;
    // eSewa sends pending payments to failure_url.
    assert_eq!(location(&resp), format!("{MERCHANT}/esewa/failure"));
    assert_eq!(sim.esewa_status("p-1").await["status"], "PENDING");
    assert_eq!(sim.esewa_status("p-1").await["status"], "PENDING");
    let s = sim.esewa_status("p-1").await;
    assert_eq!(s["status"], "COMPLETE");
    assert!(s["ref_id"].is_string());

    // Or completed early by a control call.
    sim.next(
        "esewa",
        json!({"outcome": "pending_then_success", "pending_calls": 100}),
    )
    .await;
    sim.esewa_post(&Sim::esewa_fields("p-2", ESEWA_SECRET))
        .await;
    assert_eq!(sim.esewa_status("p-2").await["status"], "PENDING");
    let (status, acted) = sim.control("esewa", "attempts/p-2/pay", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(acted["callback_url"], Value::Null);
    assert_eq!(sim.esewa_status("p-2").await["status"], "COMPLETE");
}

#[tokio::test]
async fn esewa_ambiguous_until_resolved() {
    let sim = start().await;
    sim.next("esewa", json!({"outcome": "ambiguous"})).await;
    let resp = sim
        .esewa_post(&Sim::esewa_fields("a-1", ESEWA_SECRET))
        .await;
    assert_eq!(location(&resp), format!("{MERCHANT}/esewa/failure"));
    for _ in 0..3 {
        let s = sim.esewa_status("a-1").await;
        assert_eq!(s["status"], "AMBIGUOUS");
        assert!(s["ref_id"].is_string());
    }
    sim.control("esewa", "attempts/a-1/cancel", json!({})).await;
    assert_eq!(sim.esewa_status("a-1").await["status"], "CANCELED");
}

#[tokio::test]
async fn esewa_status_server_error_then_recovers() {
    let sim = start().await;
    sim.next(
        "esewa",
        json!({"outcome": "server_error", "reference": "e-1"}),
    )
    .await;
    sim.esewa_post(&Sim::esewa_fields("e-1", ESEWA_SECRET))
        .await;
    let resp = sim.esewa_status_raw("e-1", "110").await;
    assert!(resp.status().is_server_error());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"code": 0, "error_message": "Service is currently unavailable"})
    );
    assert_eq!(sim.esewa_status("e-1").await["status"], "PENDING");
}

#[tokio::test]
async fn esewa_status_timeout() {
    let sim = start().await;
    sim.next("esewa", json!({"outcome": "timeout", "times": 1}))
        .await;
    sim.esewa_post(&Sim::esewa_fields("t-1", ESEWA_SECRET))
        .await;
    let url = format!(
        "{}/esewa/api/epay/transaction/status/?product_code=EPAYTEST&total_amount=110&transaction_uuid=t-1",
        sim.base
    );
    let err = sim
        .http
        .get(&url)
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // The next call answers.
    assert_eq!(sim.esewa_status("t-1").await["status"], "PENDING");
}

#[tokio::test]
async fn esewa_form_rejects_bad_requests() {
    let sim = start().await;

    // Wrong signature.
    let resp = sim.esewa_post(&Sim::esewa_fields("b-1", "wrong")).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "ES104");
    assert_eq!(body["error_message"], "Invalid payload signature");

    let with = |name: &str, value: &str| {
        let mut f = Sim::esewa_fields("b-2", ESEWA_SECRET);
        for (k, v) in f.iter_mut() {
            if k == name {
                *v = value.to_owned();
            }
        }
        f
    };
    // The signed total altered after signing.
    let resp = sim.esewa_post(&with("total_amount", "110.0")).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Totals that do not add up (signature re-made over the new total).
    let mut f = with("tax_amount", "20");
    let sig = sign::esewa_signature(
        ESEWA_SECRET,
        "total_amount=110,transaction_uuid=b-2,product_code=EPAYTEST",
    );
    for (k, v) in f.iter_mut() {
        if k == "signature" {
            *v = sig.clone();
        }
    }
    let body: Value = sim.esewa_post(&f).await.json().await.unwrap();
    assert!(
        body["error_message"]
            .as_str()
            .unwrap()
            .contains("total_amount"),
        "{body}"
    );
    // Unknown merchant.
    let body: Value = sim
        .esewa_post(&with("product_code", "NOPE"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        body["error_message"],
        "Unable to fetch merchant key. Please try again later."
    );
    // A missing (empty) field.
    let resp = sim.esewa_post(&with("failure_url", "")).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Bad transaction_uuid characters.
    let resp = sim
        .esewa_post(&Sim::esewa_fields("bad uuid!", ESEWA_SECRET))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // A signature that leaves out a mandatory field.
    let resp = sim
        .esewa_post(&with("signed_field_names", "total_amount,transaction_uuid"))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Nothing was created.
    assert_eq!(sim.esewa_status("b-2").await["status"], "NOT_FOUND");
}

#[tokio::test]
async fn esewa_duplicate_uuid() {
    let sim = start().await;
    let f = Sim::esewa_fields("d-1", ESEWA_SECRET);
    assert_eq!(sim.esewa_post(&f).await.status(), StatusCode::SEE_OTHER);
    // The same pending session posted again (a browser refresh): the wallet.
    assert_eq!(sim.esewa_post(&f).await.status(), StatusCode::SEE_OTHER);
    sim.control("esewa", "attempts/d-1/pay", json!({})).await;
    let resp = sim.esewa_post(&f).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn esewa_tampered_callback_fails_verification_status_tells_truth() {
    let sim = start().await;
    sim.next("esewa", json!({"outcome": "tampered_callback"}))
        .await;
    let resp = sim
        .esewa_post(&Sim::esewa_fields("x-1", ESEWA_SECRET))
        .await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    let callback = location(&resp);
    assert!(callback.starts_with(&format!("{MERCHANT}/esewa/success?data=")));
    let data = esewa_data(&callback);
    assert_eq!(data["status"], "COMPLETE");
    assert_ne!(data["total_amount"], "110.0");
    assert!(!esewa_data_verifies(&data));
    assert_eq!(sim.esewa_status("x-1").await["status"], "CANCELED");
}

#[tokio::test]
async fn esewa_portal_refunds() {
    let sim = start().await;
    sim.next("esewa", json!({"outcome": "success"})).await;
    sim.esewa_post(&Sim::esewa_fields("r-1", ESEWA_SECRET))
        .await;
    let (status, _) = sim
        .control(
            "esewa",
            "attempts/r-1/refund",
            json!({"amount_paisa": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.esewa_status("r-1").await["status"], "PARTIAL_REFUND");
    let (status, _) = sim
        .control(
            "esewa",
            "attempts/r-1/refund",
            json!({"amount_paisa": 10001}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    sim.control("esewa", "attempts/r-1/refund", json!({})).await;
    assert_eq!(sim.esewa_status("r-1").await["status"], "FULL_REFUND");
}

// ===========================================================================
// Khalti

#[tokio::test]
async fn khalti_initiate_pay_callback_lookup() {
    let sim = start().await;
    let init = sim.khalti_initiate("order-1", 1000).await;
    let pidx = init["pidx"].as_str().unwrap();
    assert_eq!(pidx.len(), 22);
    assert!(pidx.chars().all(|c| c.is_ascii_alphanumeric()));
    let payment_url = init["payment_url"].as_str().unwrap();
    assert_eq!(payment_url, format!("{}/khalti/pay/?pidx={pidx}", sim.base));
    assert_eq!(init["expires_in"], 1800);
    assert!(
        init["expires_at"].as_str().unwrap().ends_with("+05:45"),
        "{init}"
    );

    let (code, l) = sim.khalti_lookup(pidx).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(l["status"], "Initiated");
    assert_eq!(l["transaction_id"], Value::Null);

    // The payer page, then its Pay button (a plain form POST).
    let page = sim.http.get(payment_url).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("value=\"pay\"") && !html.contains("<script"));
    let resp = sim
        .post_form(
            &format!("{}/khalti/pay/", sim.base),
            &[("pidx", pidx), ("action", "pay"), ("mobile", "9800000004")],
        )
        .await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    let callback = location(&resp);
    assert!(callback.starts_with(&format!("{MERCHANT}/khalti/return?")));
    let q = query_of(&callback);
    assert_eq!(q["pidx"], pidx);
    assert_eq!(q["status"], "Completed");
    assert_eq!(q["amount"], "1000");
    assert_eq!(q["total_amount"], "1000");
    assert_eq!(q["mobile"], "98XXXXX004");
    assert_eq!(q["purchase_order_id"], "order-1");
    assert_eq!(q["purchase_order_name"], "Dhaka topi");
    assert_eq!(q["merchant_extra"], "x1");
    let txn = q["transaction_id"].clone();
    assert_eq!(q["tidx"], txn);
    assert_eq!(txn.len(), 22);

    let (code, l) = sim.khalti_lookup(pidx).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        l,
        json!({"pidx": pidx, "total_amount": 1000, "status": "Completed",
               "transaction_id": txn, "fee": 30, "refunded": false})
    );
}

#[tokio::test]
async fn khalti_auth_is_required() {
    let sim = start_with(|c| c.khalti_secret_keys.push("live_secret_key_other".into())).await;
    let body = json!({"pidx": "x"});
    let resp = sim.khalti("v2/epayment/lookup/", None, body.clone()).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let j: Value = resp.json().await.unwrap();
    assert_eq!(
        j,
        json!({"detail": "Authentication credentials were not provided.", "status_code": 401})
    );
    let resp = sim
        .khalti(
            "v2/epayment/lookup/",
            Some(&format!("Bearer {KHALTI_TEST_SECRET_KEY}")),
            body.clone(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = sim
        .khalti(
            "v2/epayment/initiate/",
            Some("Key live_secret_key_wrong"),
            body.clone(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let j: Value = resp.json().await.unwrap();
    assert_eq!(j, json!({"detail": "Invalid token.", "status_code": 401}));

    // The keyword in any case, with or without the trailing slash.
    let init = sim.khalti_initiate("order-a", 1000).await;
    let resp = sim
        .khalti(
            "v2/epayment/lookup",
            Some(&format!("key {KHALTI_TEST_SECRET_KEY}")),
            json!({"pidx": init["pidx"]}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // Another merchant's key does not see it.
    let resp = sim
        .khalti(
            "v2/epayment/lookup/",
            Some("Key live_secret_key_other"),
            json!({"pidx": init["pidx"]}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let j: Value = resp.json().await.unwrap();
    assert_eq!(
        j,
        json!({"detail": "Not found.", "error_key": "validation_error"})
    );
}

#[tokio::test]
async fn khalti_initiate_validation() {
    let sim = start().await;
    let key = format!("Key {KHALTI_TEST_SECRET_KEY}");
    let base = json!({
        "return_url": format!("{MERCHANT}/r"), "website_url": MERCHANT, "amount": 1000,
        "purchase_order_id": "o", "purchase_order_name": "n",
    });
    let cases = [
        ("return_url", json!(""), "This field may not be blank."),
        ("website_url", json!("not a url"), "Enter a valid URL."),
        (
            "amount",
            json!(999),
            "Amount should be greater than Rs. 10, that is 1000 paisa.",
        ),
        ("amount", json!("ten"), "A valid integer is required."),
        (
            "purchase_order_id",
            json!(""),
            "This field may not be blank.",
        ),
        (
            "purchase_order_name",
            json!(""),
            "This field may not be blank.",
        ),
    ];
    for (field, value, message) in cases {
        let mut body = base.clone();
        body[field] = value;
        let resp = sim.khalti("v2/epayment/initiate/", Some(&key), body).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let j: Value = resp.json().await.unwrap();
        assert_eq!(j[field], json!([message]), "{j}");
        assert_eq!(j["error_key"], "validation_error");
    }
    let mut body = base.clone();
    body["amount_breakdown"] =
        json!([{"label": "a", "amount": 600}, {"label": "b", "amount": 300}]);
    let j: Value = sim
        .khalti("v2/epayment/initiate/", Some(&key), body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(j["amount"], json!(["Amount Breakdown mismatch."]));
    // The docs' string amount is accepted.
    let mut body = base.clone();
    body["amount"] = json!("1000");
    let resp = sim.khalti("v2/epayment/initiate", Some(&key), body).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn khalti_cancel_and_fail() {
    let sim = start().await;
    sim.next("khalti", json!({"outcome": "cancel"})).await;
    let init = sim.khalti_initiate("order-c", 2000).await;
    let resp = sim
        .http
        .get(init["payment_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FOUND);
    let q = query_of(&location(&resp));
    assert_eq!(q["status"], "User canceled");
    assert_eq!(q["transaction_id"], "");
    assert_eq!(q["tidx"], "");
    assert_eq!(q["mobile"], "");
    assert_eq!(q["amount"], "2000");
    let (code, l) = sim.khalti_lookup(init["pidx"].as_str().unwrap()).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "400 with the lookup body");
    assert_eq!(l["status"], "User canceled");
    assert_eq!(l["transaction_id"], Value::Null);

    let init = sim.khalti_initiate("order-f", 2000).await;
    let (_, acted) = sim
        .control("khalti", "attempts/order-f/fail", json!({}))
        .await;
    assert_eq!(acted["attempt"]["status"], "Expired");
    let (code, l) = sim.khalti_lookup(init["pidx"].as_str().unwrap()).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(l["status"], "Expired");
}

#[tokio::test]
async fn khalti_pending_then_success_and_ambiguous() {
    let sim = start().await;
    sim.next("khalti", json!({"outcome": "pending_then_success"}))
        .await;
    let init = sim.khalti_initiate("order-p", 1500).await;
    let pidx = init["pidx"].as_str().unwrap();
    let resp = sim
        .http
        .get(init["payment_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(query_of(&location(&resp))["status"], "Pending");
    for _ in 0..2 {
        let (code, l) = sim.khalti_lookup(pidx).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(l["status"], "Pending");
        assert_eq!(l["transaction_id"], Value::Null);
    }
    let (_, l) = sim.khalti_lookup(pidx).await;
    assert_eq!(l["status"], "Completed");
    assert!(l["transaction_id"].is_string());

    sim.next("khalti", json!({"outcome": "ambiguous"})).await;
    let init = sim.khalti_initiate("order-amb", 1500).await;
    let pidx = init["pidx"].as_str().unwrap();
    sim.http
        .get(init["payment_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    for _ in 0..4 {
        assert_eq!(sim.khalti_lookup(pidx).await.1["status"], "Pending");
    }
    let (status, _) = sim
        .control("khalti", &format!("attempts/{pidx}/pay"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.khalti_lookup(pidx).await.1["status"], "Completed");
}

#[tokio::test]
async fn khalti_lookup_server_error_and_timeout() {
    let sim = start().await;
    sim.next(
        "khalti",
        json!({"outcome": "server_error", "reference": "order-5"}),
    )
    .await;
    let init = sim.khalti_initiate("order-5", 1000).await;
    let pidx = init["pidx"].as_str().unwrap().to_owned();
    let resp = sim
        .khalti(
            "v2/epayment/lookup/",
            Some(&format!("Key {KHALTI_TEST_SECRET_KEY}")),
            json!({"pidx": pidx}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(sim.khalti_lookup(&pidx).await.1["status"], "Initiated");

    sim.next(
        "khalti",
        json!({"outcome": "timeout", "reference": pidx.clone()}),
    )
    .await;
    let err = sim
        .http
        .post(format!("{}/khalti/api/v2/epayment/lookup/", sim.base))
        .header("authorization", format!("Key {KHALTI_TEST_SECRET_KEY}"))
        .json(&json!({"pidx": pidx}))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(sim.khalti_lookup(&pidx).await.1["status"], "Initiated");

    // A fault on initiate: 5xx once, then it works.
    sim.next(
        "khalti",
        json!({"outcome": "server_error", "on": "initiate"}),
    )
    .await;
    let resp = sim
        .khalti(
            "v2/epayment/initiate/",
            Some(&format!("Key {KHALTI_TEST_SECRET_KEY}")),
            json!({"return_url": format!("{MERCHANT}/r"), "website_url": MERCHANT,
                   "amount": 1000, "purchase_order_id": "o-i", "purchase_order_name": "n"}),
        )
        .await;
    assert!(resp.status().is_server_error());
    sim.khalti_initiate("o-i", 1000).await;
}

#[tokio::test]
async fn khalti_tampered_callback_lookup_tells_truth() {
    let sim = start().await;
    sim.next("khalti", json!({"outcome": "tampered_callback"}))
        .await;
    let init = sim.khalti_initiate("order-x", 1000).await;
    let resp = sim
        .http
        .get(init["payment_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    let q = query_of(&location(&resp));
    assert_eq!(q["status"], "Completed");
    assert_ne!(q["amount"], "1000");
    let (code, l) = sim.khalti_lookup(init["pidx"].as_str().unwrap()).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(l["status"], "User canceled");
}

#[tokio::test]
async fn khalti_refunds_full_and_partial() {
    let sim = start().await;
    let key = format!("Key {KHALTI_TEST_SECRET_KEY}");
    let refund = |txn: String, body: Value| {
        let sim = &sim;
        let key = key.clone();
        async move {
            let resp = sim
                .khalti(
                    &format!("merchant-transaction/{txn}/refund/"),
                    Some(&key),
                    body,
                )
                .await;
            let status = resp.status();
            let j: Value = resp.json().await.unwrap();
            (status, j)
        }
    };

    // Partial, then the rest.
    let init = sim.khalti_initiate("order-r", 5000).await;
    let pidx = init["pidx"].as_str().unwrap();
    let (_, acted) = sim
        .control("khalti", "attempts/order-r/pay", json!({}))
        .await;
    let txn = query_of(acted["callback_url"].as_str().unwrap())["transaction_id"].clone();
    let (status, j) = refund(txn.clone(), json!({"amount": 2000})).await;
    assert_eq!(status, StatusCode::OK, "{j}");
    assert_eq!(j, json!({"detail": "Transaction refund successful."}));
    let (code, l) = sim.khalti_lookup(pidx).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(l["status"], "Partially Refunded");
    assert_eq!(l["refunded"], true);
    let (status, _) = refund(txn.clone(), json!({"amount": 3001})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = refund(txn.clone(), json!({"amount": 3000})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.khalti_lookup(pidx).await.1["status"], "Refunded");
    let (status, _) = refund(txn.clone(), json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Full, with an empty body; a bank payment needs the mobile.
    sim.khalti_initiate("order-r2", 5000).await;
    let (_, acted) = sim
        .control(
            "khalti",
            "attempts/order-r2/pay",
            json!({"mobile": "9800000002", "via_bank": true}),
        )
        .await;
    let txn = query_of(acted["callback_url"].as_str().unwrap())["transaction_id"].clone();
    let (status, j) = refund(txn.clone(), json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{j}");
    let (status, _) = refund(txn.clone(), json!({"mobile": "9800000002"})).await;
    assert_eq!(status, StatusCode::OK);
    let l = sim.attempt("khalti", "order-r2").await;
    assert_eq!(l["status"], "Refunded");

    // Unknown transaction; a wrong key.
    let (status, _) = refund("nope".into(), json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let resp = sim
        .khalti(
            &format!("merchant-transaction/{txn}/refund/"),
            Some("Key bad"),
            json!({}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn khalti_refund_counts_calls_and_refunds() {
    let sim = start().await;
    let (pidx, txn) = sim.khalti_paid("order-rc", 5000).await;
    let a = sim.attempt("khalti", &pidx).await;
    assert_eq!(a["refund_calls"], 0);
    assert_eq!(a["refunds"], json!([]));

    let (status, _) = sim.khalti_refund(&txn, json!({"amount": 2000})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = sim.khalti_refund(&txn, json!({"amount": 9000})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = sim.khalti_refund(&txn, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    // An unknown transaction reaches no payment.
    let (status, _) = sim.khalti_refund("nope", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let a = sim.attempt("khalti", "order-rc").await;
    assert_eq!(a["status"], "Refunded");
    assert_eq!(a["refunded_paisa"], 5000);
    assert_eq!(a["refund_calls"], 3);
    let refunds = a["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 2, "{a}");
    assert_eq!(refunds[0]["amount"], 2000);
    assert_eq!(refunds[0]["timed_out"], false);
    assert!(refunds[0]["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(refunds[1]["amount"], 3000);
}

#[tokio::test]
async fn khalti_refund_timeout_applies_the_refund_then_answers_late() {
    let sim = start().await;
    let (pidx, txn) = sim.khalti_paid("order-rt", 5000).await;
    // By purchase_order_id, on an existing payment.
    let (status, answer) = sim
        .control(
            "khalti",
            "next",
            json!({"outcome": "timeout", "on": "refund", "reference": "order-rt"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer,
        json!({"applied_to": "order-rt", "on": "refund", "attempt_exists": true})
    );
    // The refund scenario replaces nothing: lookups are not delayed.
    assert_eq!(sim.khalti_lookup(&pidx).await.1["status"], "Completed");

    let err = sim
        .http
        .post(format!(
            "{}/khalti/api/merchant-transaction/{txn}/refund/",
            sim.base
        ))
        .header("authorization", format!("Key {KHALTI_TEST_SECRET_KEY}"))
        .json(&json!({}))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    // The provider acted although the client gave up.
    let (code, l) = sim.khalti_lookup(&pidx).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(l["status"], "Refunded");
    assert_eq!(l["refunded"], true);
    let a = sim.attempt("khalti", &pidx).await;
    assert_eq!(a["refund_calls"], 1);
    assert_eq!(
        a["refunds"].as_array().unwrap().len(),
        1,
        "applied exactly once: {a}"
    );
    assert_eq!(a["refunds"][0]["amount"], 5000);
    assert_eq!(a["refunds"][0]["timed_out"], true);
    // The fault is spent: a retry answers at once, already refunded.
    let (status, j) = sim.khalti_refund(&txn, json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{j}");
    assert_eq!(j["detail"], "Transaction already refunded.");
    let a = sim.attempt("khalti", &pidx).await;
    assert_eq!(a["refund_calls"], 2);
    assert_eq!(a["refunds"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn khalti_refund_timeout_by_pidx_answers_after_the_delay() {
    let sim = start_with(|c| c.timeout_delay = Duration::from_millis(800)).await;
    let (pidx, txn) = sim.khalti_paid("order-rt2", 5000).await;
    sim.next(
        "khalti",
        json!({"outcome": "timeout", "on": "refund", "reference": pidx.clone()}),
    )
    .await;
    let started = std::time::Instant::now();
    let (status, j) = sim.khalti_refund(&txn, json!({"amount": 1000})).await;
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(j, json!({"detail": "Transaction refund successful."}));
    assert_eq!(
        sim.khalti_lookup(&pidx).await.1["status"],
        "Partially Refunded"
    );
    // Once only (times defaults to 1).
    let started = std::time::Instant::now();
    let (status, _) = sim.khalti_refund(&txn, json!({"amount": 1000})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() < Duration::from_millis(800));
    assert_eq!(sim.attempt("khalti", &pidx).await["refunded_paisa"], 2000);
}

#[tokio::test]
async fn khalti_refund_server_error_applies_nothing() {
    let sim = start().await;
    let (pidx, txn) = sim.khalti_paid("order-r5", 5000).await;
    // Without a reference: the next refund call of any payment, set after
    // the payment exists.
    let (status, answer) = sim
        .control(
            "khalti",
            "next",
            json!({"outcome": "server_error", "on": "refund"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer, json!({"applied_to": "next", "on": "refund"}));
    let (status, body) = sim.khalti_refund_raw(&txn, json!({})).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("Server Error (500)"));
    let (_, l) = sim.khalti_lookup(&pidx).await;
    assert_eq!(l["status"], "Completed");
    assert_eq!(l["refunded"], false);
    let a = sim.attempt("khalti", &pidx).await;
    assert_eq!(a["refund_calls"], 1);
    assert_eq!(a["refunds"], json!([]));
    assert_eq!(a["refunded_paisa"], 0);
    // The retry works.
    let (status, _) = sim.khalti_refund(&txn, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.khalti_lookup(&pidx).await.1["status"], "Refunded");

    // Set before the payment exists, by reference, twice.
    sim.next(
        "khalti",
        json!({"outcome": "server_error", "on": "refund", "reference": "order-r6", "times": 2}),
    )
    .await;
    let (pidx, txn) = sim.khalti_paid("order-r6", 5000).await;
    for _ in 0..2 {
        let (status, _) = sim.khalti_refund_raw(&txn, json!({})).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let (status, _) = sim.khalti_refund(&txn, json!({"amount": 1500})).await;
    assert_eq!(status, StatusCode::OK);
    let a = sim.attempt("khalti", &pidx).await;
    assert_eq!(a["refund_calls"], 3);
    assert_eq!(a["refunded_paisa"], 1500);
    assert_eq!(a["status"], "Partially Refunded");
}

#[tokio::test]
async fn khalti_refund_failure_is_rejected() {
    let sim = start().await;
    let (pidx, txn) = sim.khalti_paid("order-rf", 5000).await;
    sim.next(
        "khalti",
        json!({"outcome": "failure", "on": "refund", "reference": pidx.clone()}),
    )
    .await;
    let (status, j) = sim.khalti_refund(&txn, json!({"amount": 1000})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        j,
        json!({"detail": "Refund not allowed", "error_key": "validation_error"})
    );
    let (_, l) = sim.khalti_lookup(&pidx).await;
    assert_eq!(l["status"], "Completed");
    assert_eq!(l["refunded"], false);
    let a = sim.attempt("khalti", &pidx).await;
    assert_eq!(a["refund_calls"], 1);
    assert_eq!(a["refunds"], json!([]));
    // Then it works.
    let (status, _) = sim.khalti_refund(&txn, json!({"amount": 1000})).await;
    assert_eq!(status, StatusCode::OK);

    // By transaction id too.
    let (pidx, txn) = sim.khalti_paid("order-rf2", 5000).await;
    sim.next(
        "khalti",
        json!({"outcome": "failure", "on": "refund", "reference": txn.clone()}),
    )
    .await;
    let (status, _) = sim.khalti_refund(&txn, json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(sim.attempt("khalti", &pidx).await["refunded_paisa"], 0);
}

#[tokio::test]
async fn khalti_refund_scenarios_leave_the_payment_alone() {
    let sim = start().await;
    // A refund "failure" for the next refund does not fail the next
    // customer: the payer page waits for a person.
    sim.next("khalti", json!({"outcome": "failure", "on": "refund"}))
        .await;
    let init = sim.khalti_initiate("order-rs", 2000).await;
    let page = sim
        .http
        .get(init["payment_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);

    // A payment scenario and a refund scenario on the same reference.
    sim.next(
        "khalti",
        json!({"outcome": "pending_then_success", "reference": "order-rs2", "pending_calls": 1}),
    )
    .await;
    sim.next(
        "khalti",
        json!({"outcome": "timeout", "on": "refund", "reference": "order-rs2"}),
    )
    .await;
    let init = sim.khalti_initiate("order-rs2", 2000).await;
    let pidx = init["pidx"].as_str().unwrap();
    let resp = sim
        .http
        .get(init["payment_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(query_of(&location(&resp))["status"], "Pending");
    assert_eq!(sim.khalti_lookup(pidx).await.1["status"], "Pending");
    let (_, l) = sim.khalti_lookup(pidx).await;
    assert_eq!(l["status"], "Completed");
    let txn = l["transaction_id"].as_str().unwrap().to_owned();
    // The "next" refund failure set above is still waiting: a scenario
    // by reference comes first (the timeout).
    let err = sim
        .http
        .post(format!(
            "{}/khalti/api/merchant-transaction/{txn}/refund/",
            sim.base
        ))
        .header("authorization", format!("Key {KHALTI_TEST_SECRET_KEY}"))
        .json(&json!({}))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(sim.khalti_lookup(pidx).await.1["status"], "Refunded");

    // Bad refund scenarios are refused; eSewa and Fonepay have no refund
    // API.
    let (status, _) = sim
        .control(
            "khalti",
            "next",
            json!({"outcome": "success", "on": "refund"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, answer) = sim
        .control(
            "esewa",
            "next",
            json!({"outcome": "failure", "on": "refund"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["ignored"], "this provider has no refund API");

    // A reset drops refund scenarios: the pending "next" failure is gone.
    sim.control("khalti", "reset", json!({})).await;
    let (_, txn) = sim.khalti_paid("order-rs3", 2000).await;
    let (status, _) = sim.khalti_refund(&txn, json!({})).await;
    assert_eq!(status, StatusCode::OK);
}

// ===========================================================================
// Fonepay

#[tokio::test]
async fn fonepay_qr_create_pay_status() {
    let sim = start().await;
    let prn = "5d76d323-d1f6-4a38-8231-0063f9581c98";
    let created = sim.qr_create(prn).await;
    assert_eq!(created["message"], "successfull");
    assert_eq!(created["status"], "CREATED");
    assert_eq!(created["statusCode"], 201);
    assert_eq!(created["success"], true);
    let qr = created["qrMessage"].as_str().unwrap();
    assert!(qr.starts_with("000201"));
    let ws = created["thirdpartyQrWebSocketUrl"].as_str().unwrap();
    let ws_base = sim.base.replace("http://", "ws://");
    assert!(
        ws.starts_with(&format!(
            "{ws_base}/fonepay/convergent-webSocket-web/merchantEndPoint/"
        )),
        "{ws}"
    );
    assert!(ws.ends_with("/NBQM/Y"));

    let s = sim.qr_status(prn).await;
    assert_eq!(s["paymentStatus"], "pending");
    assert_eq!(s["merchantCode"], "NBQM");
    assert_eq!(s["prn"], prn);
    let trace = s["fonepayTraceId"].as_u64().unwrap();

    // The QR page stands in for the customer's banking app.
    let page_url = format!("{}/fonepay/qr/{prn}", sim.base);
    let html = sim
        .http
        .get(&page_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("<svg"), "inline QR");
    assert!(html.contains(qr));
    assert!(!html.contains("<script"));
    let resp = sim.post_form(&page_url, &[("action", "pay")]).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);

    let s = sim.qr_status(prn).await;
    assert_eq!(s["paymentStatus"], "success");
    assert_eq!(s["fonepayTraceId"].as_u64(), Some(trace));
}

#[tokio::test]
async fn a_fonepay_qr_is_not_payable_after_its_expiry() {
    // The local gateway sets the expiry to the sandbox cap hold (30 min).
    let sim = start_with(|c| c.fonepay_qr_expiry = Some(Duration::from_millis(300))).await;
    sim.qr_create("q-late").await;
    sim.qr_create("q-in-time").await;
    let (status, _) = sim
        .control("fonepay", "attempts/q-in-time/pay", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, body) = sim
        .control("fonepay", "attempts/q-late/pay", json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(sim.qr_status("q-late").await["paymentStatus"], "failed");
    // Paid in time stays paid.
    assert_eq!(sim.qr_status("q-in-time").await["paymentStatus"], "success");
}

/// Rs 1,000 and more: eSewa's callback shows `total_amount` with
/// thousands separators, signed over the amount without them.
#[tokio::test]
async fn esewa_callbacks_show_large_amounts_with_separators() {
    let sim = start().await;
    let uuid = "big-1";
    let signature = sign::esewa_signature(
        ESEWA_SECRET,
        &sign::esewa_message(&[
            ("total_amount", "6600"),
            ("transaction_uuid", uuid),
            ("product_code", "EPAYTEST"),
        ]),
    );
    let fields: Vec<(String, String)> = Sim::esewa_fields(uuid, ESEWA_SECRET)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "amount" => (k, "6590".to_owned()),
            "total_amount" => (k, "6600".to_owned()),
            "signature" => (k, signature.clone()),
            _ => (k, v),
        })
        .collect();
    let resp = sim.esewa_post(&fields).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let (status, acted) = sim
        .control("esewa", &format!("attempts/{uuid}/pay"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{acted}");
    let data = esewa_data(acted["callback_url"].as_str().unwrap_or_default());
    assert_eq!(data["total_amount"], "6,600.0", "{data}");
    assert!(!esewa_data_verifies(&data), "signed without the separators");
    let mut plain = data.clone();
    plain["total_amount"] = json!("6600.0");
    assert!(esewa_data_verifies(&plain));
}

#[tokio::test]
async fn fonepay_qr_rejects_bad_dv_and_credentials() {
    let sim = start().await;
    let resp = sim.qr_create_raw("prn-bad", "00ff").await;
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
    let j: Value = resp.json().await.unwrap();
    assert_eq!(
        j,
        json!({"documentation": "Merchant request Exception", "errorCode": 406,
               "message": "Data Validation Failed"})
    );
    // Base64 instead of hex is refused too.
    let mac =
        sign::fonepay_data_validation(FONEPAY_SECRET, &["14", "prn-bad", "NBQM", "test1", "test2"]);
    let b64 = STANDARD.encode(hex_decode(&mac));
    assert_eq!(
        sim.qr_create_raw("prn-bad", &b64).await.status(),
        StatusCode::NOT_ACCEPTABLE
    );

    let dv = sign::fonepay_data_validation(FONEPAY_SECRET, &["14", "p2", "NBQM", "test1", "test2"]);
    for (field, value, message) in [
        ("merchantCode", "XXXX", "Invalid Merchant Code"),
        ("username", "someone", "Invalid username"),
        ("password", "guess", "Invalid password"),
    ] {
        let mut body = json!({
            "amount": "14", "remarks1": "test1", "remarks2": "test2", "prn": "p2",
            "merchantCode": "NBQM", "dataValidation": dv,
            "username": FONEPAY_USER, "password": FONEPAY_PASSWORD,
        });
        body[field] = json!(value);
        let resp = sim.fonepay("thirdPartyDynamicQrDownload", body).await;
        assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
        let j: Value = resp.json().await.unwrap();
        assert_eq!(j["message"], message);
    }

    // Status with a DV over the wrong fields.
    sim.qr_create("p3").await;
    let dv = sign::fonepay_data_validation(FONEPAY_SECRET, &["NBQM", "p3"]);
    let resp = sim
        .fonepay(
            "thirdPartyDynamicQrGetStatus",
            json!({"prn": "p3", "merchantCode": "NBQM", "dataValidation": dv,
                   "username": FONEPAY_USER, "password": FONEPAY_PASSWORD}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
    // A reused prn.
    let dv = sign::fonepay_data_validation(FONEPAY_SECRET, &["14", "p3", "NBQM", "test1", "test2"]);
    let resp = sim.qr_create_raw("p3", &dv).await;
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test]
async fn fonepay_qr_outcomes() {
    let sim = start().await;

    sim.next("fonepay", json!({"outcome": "failure", "reference": "q-f"}))
        .await;
    sim.qr_create("q-f").await;
    assert_eq!(sim.qr_status("q-f").await["paymentStatus"], "failed");

    sim.qr_create("q-c").await;
    sim.control("fonepay", "attempts/q-c/cancel", json!({}))
        .await;
    assert_eq!(sim.qr_status("q-c").await["paymentStatus"], "failed");

    sim.next(
        "fonepay",
        json!({"outcome": "pending_then_success", "reference": "q-p", "pending_calls": 1}),
    )
    .await;
    sim.qr_create("q-p").await;
    assert_eq!(sim.qr_status("q-p").await["paymentStatus"], "pending");
    assert_eq!(sim.qr_status("q-p").await["paymentStatus"], "success");

    sim.next(
        "fonepay",
        json!({"outcome": "ambiguous", "reference": "q-a"}),
    )
    .await;
    sim.qr_create("q-a").await;
    for _ in 0..3 {
        assert_eq!(sim.qr_status("q-a").await["paymentStatus"], "pending");
    }
    sim.control("fonepay", "attempts/q-a/pay", json!({})).await;
    assert_eq!(sim.qr_status("q-a").await["paymentStatus"], "success");

    sim.next(
        "fonepay",
        json!({"outcome": "server_error", "reference": "q-e", "times": 2}),
    )
    .await;
    sim.qr_create("q-e").await;
    for _ in 0..2 {
        let resp = sim.qr_status_raw("q-e").await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(sim.qr_status("q-e").await["paymentStatus"], "pending");

    sim.next("fonepay", json!({"outcome": "timeout", "reference": "q-t"}))
        .await;
    sim.qr_create("q-t").await;
    let dv = sign::fonepay_data_validation(FONEPAY_SECRET, &["q-t", "NBQM"]);
    let err = sim
        .http
        .post(format!(
            "{}/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrGetStatus",
            sim.base
        ))
        .json(
            &json!({"prn": "q-t", "merchantCode": "NBQM", "dataValidation": dv,
                      "username": FONEPAY_USER, "password": FONEPAY_PASSWORD}),
        )
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(sim.qr_status("q-t").await["paymentStatus"], "pending");

    // Unknown prn.
    let resp = sim.qr_status_raw("nope").await;
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
}

/// A minimal websocket client: handshake, then unmasked server frames.
async fn ws_connect(sim: &Sim, ws_url: &str) -> TcpStream {
    let path = ws_url.split_once(&sim.addr.to_string()).unwrap().1;
    let mut stream = TcpStream::connect(sim.addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        sim.addr
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        stream.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // RFC 6455's example key and accept.
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    stream
}

async fn ws_text(stream: &mut TcpStream) -> Value {
    let read = async {
        let mut h = [0u8; 2];
        stream.read_exact(&mut h).await.unwrap();
        assert_eq!(h[0], 0x81, "a final text frame");
        let mut len = usize::from(h[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            stream.read_exact(&mut b).await.unwrap();
            len = usize::from(u16::from_be_bytes(b));
        }
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await.unwrap();
        serde_json::from_slice::<Value>(&payload).unwrap()
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("a frame")
}

#[tokio::test]
async fn fonepay_websocket_notifications() {
    let sim = start().await;
    let created = sim.qr_create("ws-1").await;
    let mut ws = ws_connect(&sim, created["thirdpartyQrWebSocketUrl"].as_str().unwrap()).await;

    let (status, _) = sim
        .control("fonepay", "attempts/ws-1/scan", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let frame = ws_text(&mut ws).await;
    assert!(frame["deviceId"].as_str().unwrap().starts_with('T'));
    let inner: Value = serde_json::from_str(frame["transactionStatus"].as_str().unwrap()).unwrap();
    assert_eq!(inner["message"], "VERIFIED");
    assert_eq!(inner["qrVerified"], true);

    sim.control("fonepay", "attempts/ws-1/pay", json!({})).await;
    let frame = ws_text(&mut ws).await;
    let inner: Value = serde_json::from_str(frame["transactionStatus"].as_str().unwrap()).unwrap();
    assert_eq!(inner["paymentSuccess"], true);
    assert_eq!(inner["message"], "Request Complete");
    assert_eq!(inner["productNumber"], "ws-1");
    assert_eq!(inner["amount"], "14");
    assert!(inner["traceId"].is_u64());
    assert_eq!(sim.qr_status("ws-1").await["paymentStatus"], "success");

    // A failed payment: success stays true, paymentSuccess is false.
    // Frames from before the merchant connected arrive on connect.
    let created = sim.qr_create("ws-2").await;
    sim.control("fonepay", "attempts/ws-2/fail", json!({}))
        .await;
    let mut ws = ws_connect(&sim, created["thirdpartyQrWebSocketUrl"].as_str().unwrap()).await;
    let first = ws_text(&mut ws).await;
    assert!(
        first["transactionStatus"]
            .as_str()
            .unwrap()
            .contains("VERIFIED")
    );
    let frame = ws_text(&mut ws).await;
    let inner: Value = serde_json::from_str(frame["transactionStatus"].as_str().unwrap()).unwrap();
    assert_eq!(inner["paymentSuccess"], false);
    assert_eq!(inner["success"], true);
    assert_eq!(inner["message"], "Request Failed");
}

fn web_request(prn: &str, amt: &str, ru: &str) -> Vec<(&'static str, String)> {
    let (pid, md, crn, dt, r1, r2) = ("NBQM", "P", "NPR", "06/27/2017", "Hello", "test");
    let dv =
        sign::fonepay_data_validation(FONEPAY_SECRET, &[pid, md, prn, amt, crn, dt, r1, r2, ru]);
    vec![
        ("PID", pid.into()),
        ("MD", md.into()),
        ("PRN", prn.into()),
        ("AMT", amt.into()),
        ("CRN", crn.into()),
        ("DT", dt.into()),
        ("R1", r1.into()),
        ("R2", r2.into()),
        ("RU", ru.into()),
        ("DV", dv),
    ]
}

fn fonepay_return_verifies(q: &HashMap<String, String>) -> bool {
    let names = [
        "PRN", "PID", "PS", "RC", "UID", "BC", "INI", "P_AMT", "R_AMT",
    ];
    let values: Vec<&str> = names.iter().map(|n| q[*n].as_str()).collect();
    q["DV"] == q["DV"].to_ascii_uppercase()
        && sign::fonepay_verify(FONEPAY_SECRET, &values, &q["DV"])
}

#[tokio::test]
async fn fonepay_web_redirect() {
    let sim = start().await;
    let ru = format!("{MERCHANT}/fonepay/return");
    let web_url = format!("{}/fonepay/api/merchantRequest", sim.base);

    // GET with the parameters in the query.
    let params = web_request("web-1", "30", &ru);
    let query: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let resp = sim
        .http
        .get(format!("{web_url}?{}", form_body(&query)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let page = location(&resp);
    assert_eq!(page, format!("{}/fonepay/web/web-1", sim.base));
    let html = sim
        .http
        .get(&page)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("value=\"pay\""));
    // Pay with a discount: P_AMT differs from R_AMT.
    let resp = sim
        .post_form(&page, &[("action", "pay"), ("paid_amount", "20.0")])
        .await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    let callback = location(&resp);
    assert!(callback.starts_with(&format!("{ru}?PRN=web-1&PID=NBQM&PS=true")));
    let q = query_of(&callback);
    assert_eq!(q["RC"], "successful");
    assert_eq!(q["P_AMT"], "20.0");
    assert_eq!(q["R_AMT"], "30");
    assert!(fonepay_return_verifies(&q));
    let mut altered = q.clone();
    altered.insert("R_AMT".into(), "300".into());
    assert!(!fonepay_return_verifies(&altered));
    assert_eq!(sim.qr_status("web-1").await["paymentStatus"], "success");

    // POST, cancelled.
    let params = web_request("web-2", "30", &ru);
    let form: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let page = location(&sim.post_form(&web_url, &form).await);
    let resp = sim.post_form(&page, &[("action", "cancel")]).await;
    let q = query_of(&location(&resp));
    assert_eq!((q["PS"].as_str(), q["RC"].as_str()), ("false", "cancel"));
    assert!(fonepay_return_verifies(&q));

    // Tampered: claims success, the DV does not match, status tells truth.
    sim.next("fonepay", json!({"outcome": "tampered_callback"}))
        .await;
    let params = web_request("web-3", "30", &ru);
    let form: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let resp = sim.post_form(&web_url, &form).await;
    assert_eq!(resp.status(), StatusCode::FOUND);
    let q = query_of(&location(&resp));
    assert_eq!(q["PS"], "true");
    assert!(!fonepay_return_verifies(&q));
    assert_eq!(sim.qr_status("web-3").await["paymentStatus"], "failed");

    // A bad DV is refused.
    let mut params = web_request("web-4", "30", &ru);
    params[3].1 = "31".into();
    let form: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let resp = sim.post_form(&web_url, &form).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("Data Validation Failed")
    );
}

/// Client libraries written for the real providers work unchanged: the
/// test key Khalti's docs print, form-encoded Khalti bodies, eSewa fields
/// in the POST's query string.
#[tokio::test]
async fn the_simulators_take_what_the_real_providers_take() {
    let sim = start().await;
    let docs_key = format!("Key {}", simulators::KHALTI_DOCS_SECRET_KEY);
    let form = |pairs: &[(&str, &str)]| form_body(pairs);
    let resp = sim
        .http
        .post(format!("{}/khalti/api/v2/epayment/initiate/", sim.base))
        .header("authorization", &docs_key)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[
            ("return_url", &format!("{MERCHANT}/khalti/return")),
            ("website_url", MERCHANT),
            ("amount", "1000"),
            ("purchase_order_id", "form-1"),
            ("purchase_order_name", "Dhaka topi"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let started: Value = resp.json().await.unwrap();
    let pidx = started["pidx"].as_str().unwrap_or_default().to_owned();
    assert!(!pidx.is_empty(), "{started}");
    let resp = sim
        .http
        .post(format!("{}/khalti/api/v2/epayment/lookup/", sim.base))
        .header("authorization", &docs_key)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("pidx", &pidx)]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let looked: Value = resp.json().await.unwrap();
    assert_eq!(looked["status"], "Initiated", "{looked}");
    assert_eq!(looked["total_amount"], 1000, "{looked}");

    // eSewa: every field in the query string, an empty body.
    let fields = Sim::esewa_fields("query-1", ESEWA_SECRET);
    let pairs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let resp = sim
        .http
        .post(format!("{}?{}", sim.esewa_form_url(), form_body(&pairs)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert!(location(&resp).contains("/esewa/wallet/query-1"));

    let index = sim
        .http
        .get(&sim.base)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        index.contains(simulators::KHALTI_DOCS_SECRET_KEY),
        "{index}"
    );
}

#[tokio::test]
async fn index_page_and_control_errors() {
    let sim = start().await;
    sim.qr_create("idx-1").await;
    let html = sim
        .http
        .get(&sim.base)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("EPAYTEST") && html.contains(KHALTI_TEST_SECRET_KEY));
    assert!(html.contains(&format!("{}/fonepay/qr/idx-1", sim.base)));

    let (status, _) = sim
        .control("esewa", "next", json!({"outcome": "sometimes"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = sim.control("khalti", "attempts/none/pay", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = sim.control("fonepay", "reset", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let resp = sim.qr_status_raw("idx-1").await;
    assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE);
}

/// An independent client library (nepal-gateways from PyPI, installed
/// unchanged into the test venv by infra/test.sh) pays through the eSewa
/// and Khalti simulators and verifies the returns its own way:
/// infra/tests/clients/nepal_gateways_flow.py.
#[tokio::test]
async fn an_independent_client_library_works_against_the_simulators() {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let sim = start().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients/nepal_gateways_flow.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("SIM_BASE", &sim.base)
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(60), run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("the client library run took over 60 s"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("the independent client library worked unchanged"),
        "{stdout}"
    );
}
