//! The simulators' statements (issue 41): eSewa and Fonepay portal files
//! and Khalti's merchant transaction list reflect what was processed, and
//! the discrepancy control changes exactly what it says. Read back with
//! the gateway's own parser and Khalti client.

use std::time::Duration;

use axum::Router;
use chrono::{NaiveDate, TimeDelta, Utc};
use dhukuti::simulators::{self, KHALTI_TEST_SECRET_KEY, SimConfig, SimState};
use reqwest::{StatusCode, redirect};
use serde_json::{Value, json};
use shared::domain::reconciliation::statements::{
    LineKind, LineStatus, Statement, from_khalti_records, parse,
};
use shared::kinds::Provider;
use shared::money::Paisa;
use shared::providers::{ProviderClients, ProviderConfig, ProviderCredentials, sign};
use tokio::net::TcpListener;

const MERCHANT: &str = "https://shop.example";

struct Sim {
    base: String,
    http: reqwest::Client,
}

async fn start() -> Sim {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base = format!("http://{addr}/sim");
    let app = Router::new().nest(
        "/sim",
        simulators::router(SimState::new(SimConfig::new(&base))),
    );
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let http = reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Sim { base, http }
}

fn paisa(v: i64) -> Paisa {
    Paisa::new(v).unwrap()
}

impl Sim {
    async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn inject(&self, provider: &str, body: Value) -> Value {
        let (status, answer) = self
            .post_json(&format!("/{provider}/_sim/statement-discrepancies"), body)
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    async fn pay(&self, provider: &str, reference: &str) {
        let (status, acted) = self
            .post_json(
                &format!("/{provider}/_control/attempts/{reference}/pay"),
                json!({}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{acted}");
    }

    async fn esewa_attempt(&self, uuid: &str) {
        let message = sign::esewa_message(&[
            ("total_amount", "110"),
            ("transaction_uuid", uuid),
            ("product_code", "EPAYTEST"),
        ]);
        let signature = sign::esewa_signature("8gBm/:&EnhH.1/q", &message);
        let mut form = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
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
        ] {
            form.append_pair(k, v);
        }
        let resp = self
            .http
            .post(format!("{}/esewa/api/epay/main/v2/form", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.finish())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    }

    async fn fonepay_qr(&self, prn: &str) {
        let dv = sign::fonepay_data_validation(
            "a7e3512f5032480a83137793cb2021dc",
            &["14", prn, "NBQM", "test1", "test2"],
        );
        let (status, answer) = self
            .post_json(
                "/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload",
                json!({
                    "amount": "14", "remarks1": "test1", "remarks2": "test2", "prn": prn,
                    "merchantCode": "NBQM", "dataValidation": dv,
                    "username": "9861101076", "password": "admin123456",
                }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    async fn khalti_paid(&self, order: &str, amount: i64) -> String {
        let resp = self
            .http
            .post(format!("{}/khalti/api/v2/epayment/initiate/", self.base))
            .header("authorization", format!("Key {KHALTI_TEST_SECRET_KEY}"))
            .json(&json!({
                "return_url": format!("{MERCHANT}/khalti/return"),
                "website_url": MERCHANT,
                "amount": amount,
                "purchase_order_id": order,
                "purchase_order_name": "Dhaka topi",
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let init: Value = resp.json().await.unwrap();
        let pidx = init["pidx"].as_str().unwrap().to_owned();
        self.pay("khalti", &pidx).await;
        pidx
    }

    async fn file(&self, provider: Provider, format: &str) -> Statement {
        let resp = self
            .http
            .get(format!(
                "{}/{}/_sim/statement?format={format}",
                self.base,
                provider.as_str()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let bytes = resp.bytes().await.unwrap();
        parse(provider, &bytes).unwrap_or_else(|e| panic!("{format}: {e}"))
    }
}

fn nepal_today() -> NaiveDate {
    (Utc::now() + TimeDelta::minutes(5 * 60 + 45)).date_naive()
}

#[tokio::test]
async fn esewa_statement_files_list_the_paid_payments_and_the_injections() {
    let sim = start().await;
    for uuid in ["st-1", "st-2", "st-3", "st-unpaid"] {
        sim.esewa_attempt(uuid).await;
    }
    for uuid in ["st-1", "st-2", "st-3"] {
        sim.pay("esewa", uuid).await;
    }
    for format in ["csv", "xlsx"] {
        let s = sim.file(Provider::Esewa, format).await;
        assert_eq!(s.account.as_deref(), Some("EPAYTEST"), "{format}");
        let refs: Vec<_> = s
            .lines
            .iter()
            .map(|l| l.reference.clone().unwrap())
            .collect();
        assert_eq!(refs, ["st-1", "st-2", "st-3"], "{format}");
        for l in &s.lines {
            assert_eq!(l.amount, paisa(11_000));
            assert_eq!(
                (l.kind, l.status, l.fee),
                (LineKind::Payment, LineStatus::Success, None)
            );
            assert!(l.provider_ref.is_some());
        }
    }
    sim.inject("esewa", json!({"kind": "drop", "reference": "st-1"}))
        .await;
    sim.inject(
        "esewa",
        json!({"kind": "amount", "reference": "st-2", "amount": 10_900}),
    )
    .await;
    sim.inject(
        "esewa",
        json!({"kind": "fee", "reference": "st-3", "fee": 330}),
    )
    .await;
    let foreign = sim
        .inject("esewa", json!({"kind": "foreign", "amount": 50_000}))
        .await;
    for format in ["csv", "xlsx"] {
        let s = sim.file(Provider::Esewa, format).await;
        let got: Vec<_> = s
            .lines
            .iter()
            .map(|l| (l.reference.clone().unwrap(), l.amount, l.fee))
            .collect();
        assert_eq!(
            got,
            [
                ("st-2".to_owned(), paisa(10_900), None),
                ("st-3".to_owned(), paisa(11_000), Some(paisa(330))),
                (
                    foreign["reference"].as_str().unwrap().to_owned(),
                    paisa(50_000),
                    None
                ),
            ],
            "{format}"
        );
    }
    // Another day's file is empty; a bad date or kind is refused.
    let resp = sim
        .http
        .get(format!("{}/esewa/_sim/statement?date=2001-01-01", sim.base))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(
        parse(Provider::Esewa, text.as_bytes())
            .unwrap()
            .lines
            .is_empty()
    );
    let (status, _) = sim
        .post_json(
            "/esewa/_sim/statement-discrepancies",
            json!({"kind": "drop", "reference": "nope"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = sim
        .post_json(
            "/esewa/_sim/statement-discrepancies",
            json!({"kind": "smudge"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Clearing puts the processed payments back as they were.
    let resp = sim
        .http
        .delete(format!("{}/esewa/_sim/statement-discrepancies", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(sim.file(Provider::Esewa, "csv").await.lines.len(), 3);
}

#[tokio::test]
async fn fonepay_statement_files_carry_the_qr_commission() {
    let sim = start().await;
    sim.fonepay_qr("PRN-1").await;
    sim.fonepay_qr("PRN-2").await;
    sim.pay("fonepay", "PRN-1").await;
    for format in ["csv", "xlsx"] {
        let s = sim.file(Provider::Fonepay, format).await;
        assert_eq!(s.account.as_deref(), Some("NBQM"));
        assert_eq!(s.lines.len(), 1, "{format}");
        let l = &s.lines[0];
        assert_eq!(l.reference.as_deref(), Some("PRN-1"));
        assert_eq!(l.amount, paisa(1400));
        // 150 bps of Rs 14 = 21 paisa.
        assert_eq!(l.fee, Some(paisa(21)));
        assert!(
            l.provider_ref
                .as_deref()
                .is_some_and(|t| t.parse::<u64>().is_ok())
        );
    }
}

#[tokio::test]
async fn the_khalti_client_reads_every_page_of_the_simulated_list() {
    let sim = start().await;
    let mut pidxs = Vec::new();
    for i in 0..105 {
        pidxs.push(sim.khalti_paid(&format!("order-{i}"), 1000 + i).await);
    }
    // An unpaid one is not listed.
    let _ = sim
        .http
        .post(format!("{}/khalti/api/v2/epayment/initiate/", sim.base))
        .header("authorization", format!("Key {KHALTI_TEST_SECRET_KEY}"))
        .json(
            &json!({"return_url": format!("{MERCHANT}/r"), "website_url": MERCHANT,
                      "amount": 5000, "purchase_order_id": "unpaid", "purchase_order_name": "x"}),
        )
        .send()
        .await
        .unwrap();

    // The documented page shape.
    let page: Value = sim
        .http
        .get(format!(
            "{}/khalti/api/v2/merchant-transaction/?page=2&page_size=50",
            sim.base
        ))
        .header("authorization", format!("Key {KHALTI_TEST_SECRET_KEY}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["total_pages"], 3);
    assert_eq!(page["total_records"], 105);
    assert_eq!(page["current_page"], 2);
    assert_eq!(page["record_range"], json!([51, 100]));
    assert!(page["next"].as_str().is_some() && page["previous"].as_str().is_some());
    let r = &page["records"][0];
    for key in [
        "idx",
        "type",
        "state",
        "amount",
        "fee_amount",
        "refunded",
        "created_on",
        "user",
        "merchant",
    ] {
        assert!(r.get(key).is_some(), "{key} in {r}");
    }
    assert!(r["created_on"].as_str().unwrap().ends_with("+05:45"));
    // Without the key: refused.
    let resp = sim
        .http
        .get(format!("{}/khalti/api/v2/merchant-transaction/", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    let clients = ProviderClients::new(&ProviderConfig::for_base(&sim.base)).unwrap();
    let creds = ProviderCredentials::Khalti {
        secret_key: KHALTI_TEST_SECRET_KEY.into(),
    };
    let today = nepal_today();
    let (from, to) = (today - TimeDelta::days(1), today + TimeDelta::days(1));
    let records = clients.khalti.transactions(&creds, from, to).await.unwrap();
    assert_eq!(records.len(), 105, "all pages");
    let lines = from_khalti_records(&records).unwrap();
    assert_eq!(lines[0].amount, paisa(1000));
    assert_eq!(lines[0].fee, Some(paisa(30)));
    assert_eq!(lines[104].amount, paisa(1104));
    assert!(lines.iter().all(|l| l.status == LineStatus::Success));

    // Injections, seen through the client.
    sim.inject("khalti", json!({"kind": "drop", "reference": "order-0"}))
        .await;
    sim.inject(
        "khalti",
        json!({"kind": "fee", "reference": pidxs[1], "fee": 99}),
    )
    .await;
    sim.inject(
        "khalti",
        json!({"kind": "amount", "reference": "order-2", "amount": 7}),
    )
    .await;
    let foreign = sim
        .inject("khalti", json!({"kind": "foreign", "amount": 12_345}))
        .await;
    let lines =
        from_khalti_records(&clients.khalti.transactions(&creds, from, to).await.unwrap()).unwrap();
    assert_eq!(lines.len(), 105);
    assert_eq!(lines[0].fee, Some(paisa(99)));
    assert_eq!(lines[1].amount, paisa(7));
    let last = &lines[104];
    assert_eq!(
        last.provider_ref.as_deref(),
        foreign["provider_ref"].as_str()
    );
    assert_eq!(last.amount, paisa(12_345));

    // Another range: nothing; a wrong key: refused.
    let old = NaiveDate::from_ymd_opt(2001, 1, 1).unwrap();
    assert!(
        clients
            .khalti
            .transactions(&creds, old, old)
            .await
            .unwrap()
            .is_empty()
    );
    let wrong = ProviderCredentials::Khalti {
        secret_key: "live_secret_key_00000000000000000000000000000000".into(),
    };
    assert!(clients.khalti.transactions(&wrong, from, to).await.is_err());
}
