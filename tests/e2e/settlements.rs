//! Settlements (issue 41, part 5) end to end, on both backends: payments
//! taken through the hosted pages and the providers' simulators (Khalti
//! states its fee; eSewa states none), a Khalti refund, then
//! `GET /v1/reconciliation/settlements` per provider and Nepal day beside
//! the bank credits recorded through the API and the dashboard.

use dhukuti_tests::browser::text;
use dhukuti_tests::dash::{Dash, field};
use dhukuti_tests::shop::{Shop, Via};
use dhukuti_tests::{Answer, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::billing::calendar::nepal_day;
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock};

const PATH: &str = "/v1/reconciliation/settlements";
const CREDITS: &str = "/v1/reconciliation/settlements/credits";
const PAGE: &str = "/dashboard/reconciliation/settlements";
const PASSWORD: &str = "a long dashboard password";

/// Yesterday and today in Nepal: the range every read here asks, so a
/// run across Nepal's midnight still sees its payments.
fn days() -> (String, String) {
    let today = nepal_day(SystemClock.now());
    let yesterday = today.pred_opt().unwrap_or(today);
    (
        yesterday.format("%Y-%m-%d").to_string(),
        today.format("%Y-%m-%d").to_string(),
    )
}

async fn read(shop: &Shop, key: &str, provider: &str) -> Answer {
    let (from, to) = days();
    shop.app
        .get(
            &format!("{PATH}?provider={provider}&from={from}&to={to}"),
            Some(key),
        )
        .await
}

/// One provider's sums over the range: (payments, refunds, expected,
/// credited, variance), and every credit.
async fn sums(shop: &Shop, provider: &str) -> ((i64, i64, i64, i64, i64), Vec<Value>) {
    let a = read(shop, &shop.key, provider).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let mut s = (0, 0, 0, 0, 0);
    let mut credits = Vec::new();
    for d in a.body["data"].as_array().cloned().unwrap_or_default() {
        assert_eq!(d["provider"], provider, "{d}");
        let n = |f: &str| d[f].as_i64().unwrap_or_else(|| panic!("{f}: {d}"));
        assert_eq!(n("variance"), n("credited") - n("expected"), "{d}");
        assert_eq!(n("expected"), n("paymentsNet") - n("refundsNet"), "{d}");
        s.0 += n("expectedPayments");
        s.1 += n("expectedRefunds");
        s.2 += n("expected");
        s.3 += n("credited");
        s.4 += n("variance");
        credits.extend(d["credits"].as_array().cloned().unwrap_or_default());
    }
    (s, credits)
}

fn credit(provider: &str, amount: i64, reference: &str) -> Value {
    let (_, today) = days();
    json!({"provider": provider, "date": today, "amount": amount, "reference": reference})
}

async fn delete(shop: &Shop, id: &str) -> Answer {
    let req = shop
        .app
        .client
        .delete(shop.app.url(&format!("{CREDITS}/{id}")))
        .bearer_auth(&shop.key);
    send(req).await
}

async fn expected_settlements_meet_the_bank_credits(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let khalti = shop.paid(Via::Khalti, 100_000).await;
    let khalti_net = shop.payment(&khalti).await["net"]
        .as_i64()
        .unwrap_or_else(|| panic!("Khalti states its fee: a net"));
    assert!(khalti_net < 100_000, "{khalti_net}");
    let esewa = shop.paid(Via::Esewa, 50_000).await;
    assert_eq!(shop.payment(&esewa).await["net"], Value::Null);
    let r = shop
        .app
        .post(
            "/v1/refunds",
            Some(&shop.key),
            None,
            &json!({"paymentId": khalti, "amount": 30_000, "reason": "customer_request"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["status"], "succeeded", "{}", r.body);

    // Expected: Khalti's net less the refund; eSewa's amount (no fee).
    let expected = khalti_net - 30_000;
    assert_eq!(
        sums(&shop, "khalti").await.0,
        (1, 1, expected, 0, -expected)
    );
    assert_eq!(sums(&shop, "esewa").await.0, (1, 0, 50_000, 0, -50_000));
    assert_eq!(sums(&shop, "fonepay").await.0, (0, 0, 0, 0, 0));
    let (from, to) = days();
    let all = shop
        .app
        .get(&format!("{PATH}?from={from}&to={to}"), Some(&shop.key))
        .await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(
        (all.body["from"].as_str(), all.body["to"].as_str()),
        (Some(from.as_str()), Some(to.as_str()))
    );
    let rows = all.body["data"].as_array().map(Vec::len).unwrap_or(0);
    assert!((2..=4).contains(&rows), "{}", all.body);

    // A credit 1 rupee short; a retry under one Idempotency-Key is one
    // credit; the same reference again (any case) is refused.
    let body = credit("khalti", expected - 100, "NIC-20261129-01");
    let first = shop
        .app
        .post(CREDITS, Some(&shop.key), Some("bcr-1"), &body)
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    let id = text(&first.body["id"]);
    assert!(id.starts_with("bcr_"), "{id}");
    assert_eq!(first.body["amount"], expected - 100);
    assert_eq!(first.body["livemode"], false);
    let replay = shop
        .app
        .post(CREDITS, Some(&shop.key), Some("bcr-1"), &body)
        .await;
    assert_eq!(text(&replay.body["id"]), id, "{}", replay.body);
    let again = credit("khalti", 5, " nic-20261129-01 ");
    let dup = shop
        .app
        .post(CREDITS, Some(&shop.key), Some("bcr-2"), &again)
        .await;
    dup.assert_error(409, "invalid_request_error", "duplicate_reference");
    assert_eq!(dup.body["error"]["param"], "reference", "{}", dup.body);
    // Another provider's reference space.
    let other = shop
        .app
        .post(
            CREDITS,
            Some(&shop.key),
            None,
            &credit("esewa", 50_000, "NIC-20261129-01"),
        )
        .await;
    assert_eq!(other.status, 201, "{}", other.body);
    let (s, credits) = sums(&shop, "khalti").await;
    assert_eq!(s, (1, 1, expected, expected - 100, -100));
    assert_eq!(credits.len(), 1);
    assert_eq!(credits[0]["reference"], "NIC-20261129-01");
    assert_eq!(sums(&shop, "esewa").await.0, (1, 0, 50_000, 50_000, 0));

    // Another mode sees none of it.
    let live = shop.app.key(&shop.tenant, Mode::Live, &Scope::ALL).await;
    let a = read(&shop, &live, "khalti").await;
    assert_eq!(a.body["data"], json!([]), "{}", a.body);
    let a = shop
        .app
        .client
        .delete(shop.app.url(&format!("{CREDITS}/{id}")))
        .bearer_auth(&live);
    send(a)
        .await
        .assert_error(404, "invalid_request_error", "not_found");

    // Deleted: gone from the day, its reference free again.
    let d = delete(&shop, &id).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body, json!({"id": id, "deleted": true}));
    assert_eq!(delete(&shop, &id).await.status, 404);
    assert_eq!(
        sums(&shop, "khalti").await.0,
        (1, 1, expected, 0, -expected)
    );
    let again = shop.app.post(CREDITS, Some(&shop.key), None, &body).await;
    assert_eq!(again.status, 201, "{}", again.body);
    shop.stop().await;
}

async fn bad_input_names_its_parameter(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    for (query, param) in [
        ("provider=paypal", "provider"),
        ("from=2026-13-01", "from"),
        ("to=29-11-2026", "to"),
        ("from=2026-11-20&to=2026-11-19", "from"),
        ("from=2026-01-01&to=2026-06-01", "to"),
    ] {
        let a = shop
            .app
            .get(&format!("{PATH}?{query}"), Some(&shop.key))
            .await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], param, "{query}: {}", a.body);
    }
    let ok = credit("khalti", 100, "R-1");
    let tomorrow = nepal_day(SystemClock.now())
        .succ_opt()
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default();
    for (name, value, param) in [
        ("provider", json!("paypal"), "provider"),
        ("date", json!(tomorrow), "date"),
        ("date", json!("2026-11-31"), "date"),
        ("amount", json!(0), "amount"),
        ("amount", json!(-100), "amount"),
        ("amount", json!(12.5), "amount"),
        ("amount", json!("100"), "amount"),
        ("reference", json!(""), "reference"),
        ("reference", json!("x".repeat(101)), "reference"),
    ] {
        let mut body = ok.clone();
        body[name] = value.clone();
        let a = shop.app.post(CREDITS, Some(&shop.key), None, &body).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(
            a.body["error"]["param"], param,
            "{name}={value}: {}",
            a.body
        );
    }
    let mut extra = ok.clone();
    extra["note"] = json!("x");
    let a = shop.app.post(CREDITS, Some(&shop.key), None, &extra).await;
    assert_eq!(a.status, 400, "{}", a.body);
    // Nothing was recorded.
    assert_eq!(sums(&shop, "khalti").await.0, (0, 0, 0, 0, 0));
    shop.stop().await;
}

/// A signed-in person of the shop's merchant.
async fn person(shop: &Shop, email: &str, role: Role) -> Dash {
    dashboard::create_user(
        shop.app.state(),
        SystemClock.now(),
        &shop.tenant.merchant.id,
        email,
        role,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut d = Dash::new(&shop.app.base);
    let r = d.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    d
}

async fn the_dashboard_shows_days_and_records_credits(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let paid = shop.paid(Via::Esewa, 25_000).await;
    assert!(paid.starts_with("pay_"));
    let mut dev = person(&shop, "dev@asan.example", Role::Developer).await;
    let page = dev.get(PAGE).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("Settlements"), "{}", page.show());
    assert!(page.body.contains("NPR 250.00"), "{}", page.show());
    assert!(
        page.body.contains("Record a bank credit"),
        "{}",
        page.show()
    );
    let csrf = field(&page.body, "csrf");
    let (_, today) = days();

    // Recorded through the form, in rupees: 249.50, 50 paisa short.
    let form = [
        ("csrf", csrf.as_str()),
        ("provider", "esewa"),
        ("date", today.as_str()),
        ("amount", "249.50"),
        ("reference", "ESW-SLIP-7"),
    ];
    let r = dev.post(&format!("{PAGE}/credits"), &form).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let back = dev.get(&r.location).await;
    assert_eq!(back.status, 200, "{}", back.show());
    assert!(
        back.body.contains("Bank credit recorded"),
        "{}",
        back.show()
    );
    assert!(back.body.contains("ESW-SLIP-7"), "{}", back.show());
    assert!(back.body.contains("class=\"variance\""), "{}", back.show());
    let (s, credits) = sums(&shop, "esewa").await;
    assert_eq!(s, (1, 0, 25_000, 24_950, -50));
    let id = text(&credits[0]["id"]);

    // The same reference again: refused, named.
    let dup = dev.post(&format!("{PAGE}/credits"), &form).await;
    assert_eq!(dup.status, 409, "{}", dup.show());
    assert!(dup.body.contains("already recorded"), "{}", dup.show());
    // A form without its token, and a viewer: refused, nothing written.
    let forged = dev
        .post(
            &format!("{PAGE}/credits"),
            &[
                ("provider", "esewa"),
                ("date", today.as_str()),
                ("amount", "1"),
                ("reference", "F-1"),
            ],
        )
        .await;
    assert_eq!(forged.status, 403, "{}", forged.show());
    let mut viewer = person(&shop, "viewer@asan.example", Role::Viewer).await;
    let seen = viewer.get(PAGE).await;
    assert_eq!(seen.status, 200, "{}", seen.show());
    assert!(seen.body.contains("ESW-SLIP-7"), "{}", seen.show());
    assert!(
        !seen.body.contains("Record a bank credit"),
        "{}",
        seen.show()
    );
    let vcsrf = field(&seen.body, "csrf");
    let mut as_viewer = form;
    as_viewer[0] = ("csrf", vcsrf.as_str());
    as_viewer[4] = ("reference", "V-1");
    let refused = viewer.post(&format!("{PAGE}/credits"), &as_viewer).await;
    assert_eq!(refused.status, 403, "{}", refused.show());
    assert_eq!(sums(&shop, "esewa").await.1.len(), 1);

    // Deleted from the page.
    let d = dev
        .post(
            &format!("{PAGE}/credits/{id}/delete"),
            &[("csrf", csrf.as_str())],
        )
        .await;
    assert_eq!(d.status, 303, "{}", d.show());
    assert_eq!(sums(&shop, "esewa").await.0, (1, 0, 25_000, 0, -25_000));

    // Both in the audit log.
    let mut owner = person(&shop, "boss@asan.example", Role::Owner).await;
    let log = owner.get("/dashboard/audit").await;
    assert_eq!(log.status, 200, "{}", log.show());
    for action in ["settlement_credit.record", "settlement_credit.delete"] {
        assert!(log.body.contains(action), "{action}: {}", log.show());
    }
    shop.stop().await;
}

on_both_backends!(
    expected_settlements_meet_the_bank_credits,
    bad_input_names_its_parameter,
    the_dashboard_shows_days_and_records_credits,
);
