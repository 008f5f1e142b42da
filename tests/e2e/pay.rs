//! Payments end to end over HTTP, on both backends: a merchant creates a
//! checkout session through the API, and a customer (an HTTP client playing
//! the browser, following no redirect by itself) picks a provider on the
//! hosted page and pays on the provider's simulator: eSewa's auto-posted
//! form and wallet, Khalti's payment page, Fonepay's QR and web page.
//!
//! Then every way it can go wrong, scripted with the simulators' control
//! API: a cancel, a decline, a tampered or forged return, a provider that
//! answers "pending" or stays ambiguous, a status check that times out or
//! fails, a provider that cannot start a payment, a second attempt paid
//! after the first, an expired session, the sandbox Fonepay month cap and
//! a retried create.
//!
//! Every wait is bounded: polls give up after a fixed number of tries.

use std::sync::Arc;
use std::time::Duration;

use dhukuti_tests::browser::{
    Form, Page, base64_decode, base64_encode, fields, form, form_encode, query_param, radios, tags,
    text, with_query,
};
use dhukuti_tests::shop::{self, CANCEL_URL, RETURN_URL, Via};
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app, spawn_app_with_clock};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::attempts::SweepReport;
use shared::time::{Clock, ManualClock, SystemClock, Timestamp};

/// NPR 1,500: above Khalti's minimum.
const AMOUNT: i64 = 150_000;
/// NPR 500: under the sandbox Fonepay limit of NPR 1,000 a payment.
const FONEPAY_AMOUNT: i64 = 50_000;
/// The eSewa sandbox merchant's published secret (the simulator's too).
const ESEWA_TEST_SECRET: &str = "8gBm/:&EnhH.1/q";
/// How often a poll asks, and how long it waits between asks.
const POLL_TRIES: usize = 20;
const POLL_PAUSE: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------
// The shop: one merchant, its API key, and one customer

/// Where the browser stands after the hand-off to the provider.
#[derive(Debug)]
enum AtProvider {
    /// On the provider's page, where a person pays, fails or cancels.
    Wallet { page: String, form: Form },
    /// Already sent back to us (a scripted outcome acted at once).
    Back(String),
}

impl AtProvider {
    fn wallet(&self) -> &Form {
        match self {
            AtProvider::Wallet { form, .. } => form,
            AtProvider::Back(u) => panic!("expected the provider's page, was sent back to {u}"),
        }
    }

    fn back(&self) -> &str {
        match self {
            AtProvider::Back(u) => u,
            AtProvider::Wallet { page, .. } => {
                panic!("expected to be sent back, stayed on the provider's page {page}")
            }
        }
    }
}

/// The shared shop (`dhukuti_tests::shop`) with this file's flows.
struct Shop(shop::Shop);

impl std::ops::Deref for Shop {
    type Target = shop::Shop;

    fn deref(&self) -> &shop::Shop {
        &self.0
    }
}

fn later() -> Timestamp {
    SystemClock.now().plus(chrono::Duration::minutes(2))
}

fn merchant_landing(session: &str) -> String {
    format!("{RETURN_URL}?session_id={session}&status=success")
}

impl Shop {
    async fn open(which: Which) -> Option<Shop> {
        Some(Shop::on(spawn_app(which).await?).await)
    }

    async fn open_with_clock(which: Which, clock: Arc<dyn Clock>) -> Option<Shop> {
        Some(Shop::on(spawn_app_with_clock(which, |s| s, clock).await?).await)
    }

    async fn on(app: TestApp) -> Shop {
        Shop(shop::Shop::on(app).await)
    }

    async fn enable_fonepay(&self) {
        self.app.enable_fonepay(&self.tenant, Mode::Sandbox).await;
    }

    async fn stop(self) {
        self.0.stop().await;
    }

    // --- the merchant, through the API

    /// `POST /v1/checkout`: the new session's id.
    async fn checkout(&self, amount: i64) -> String {
        let body = self.create_checkout(amount).await;
        let id = text(&body["id"]);
        assert_eq!(body["checkout_url"], format!("{}/c/{id}", self.app.base));
        id
    }

    async fn session_status(&self, id: &str) -> String {
        text(&self.session(id).await["status"])
    }

    /// The session's current attempt.
    async fn current_payment(&self, session: &str) -> String {
        let s = self.session(session).await;
        let id = text(&s["paymentId"]);
        assert!(id.starts_with("pay_"), "no attempt: {s}");
        id
    }

    async fn payment_status(&self, id: &str) -> String {
        text(&self.payment(id).await["status"])
    }

    /// `GET /v1/payments`: the payments' ids and the total.
    async fn payments(&self) -> (Vec<String>, u64) {
        let a = self.app.get("/v1/payments", Some(&self.key)).await;
        assert_eq!(a.status, 200, "{}", a.body);
        let ids = a.body["data"]
            .as_array()
            .map(|d| d.iter().map(|p| text(&p["id"])).collect())
            .unwrap_or_default();
        (ids, a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX))
    }

    async fn sweep(&self) -> SweepReport {
        let n = self
            .sweeps
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let at = later().plus(chrono::Duration::minutes(2 * n));
        self.app.sweep(at).await
    }

    // --- the simulators' control API

    /// `POST /sim/{provider}/_control/attempts/{reference}/{action}`.
    async fn at_provider(&self, provider: &str, reference: &str, action: &str) -> Value {
        let res = self
            .app
            .client
            .post(self.sim(&format!(
                "/{provider}/_control/attempts/{reference}/{action}"
            )))
            .send()
            .await;
        match res {
            Ok(r) => {
                let status = r.status();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                assert!(status.is_success(), "control {action}: {status} {body}");
                body
            }
            Err(e) => panic!("control {action}: {e}"),
        }
    }

    // --- the customer, through the browser

    /// `GET /c/{id}` (with an optional query).
    async fn hosted(&self, session: &str, query: &str) -> Page {
        self.browser.get(&format!("/c/{session}{query}")).await
    }

    /// The picker's radios on `GET /c/{id}`.
    async fn offered(&self, session: &str) -> Vec<String> {
        let page = self.hosted(session, "").await;
        assert_eq!(page.status, 200, "{}", page.show());
        let f = form(&page.body, Some("pay-form"));
        assert_eq!(
            f.map(|f| f.action),
            Some(format!("/c/{session}/pay")),
            "{}",
            page.show()
        );
        radios(&page.body, "provider")
    }

    /// Picks `via` and follows the hand-off until the provider's page (or
    /// straight back to us, when a scripted outcome acts at once).
    async fn to_provider(&self, session: &str, via: Via) -> AtProvider {
        let base = &self.app.base;
        let at = match via {
            Via::Esewa => {
                let page = self.choose(session, &[("provider", "esewa")]).await;
                assert_eq!(page.status, 200, "{}", page.show());
                let Some(handoff) = form(&page.body, Some("handoff")) else {
                    panic!("no hand-off form: {}", page.show())
                };
                assert_eq!(
                    handoff.action,
                    format!("{base}/sim/esewa/api/epay/main/v2/form")
                );
                let names: Vec<&str> = handoff.hidden.iter().map(|(k, _)| k.as_str()).collect();
                for must in [
                    "total_amount",
                    "transaction_uuid",
                    "signature",
                    "success_url",
                ] {
                    assert!(names.contains(&must), "{must} in {names:?}");
                }
                self.browser
                    .post_form(&handoff.action, &handoff.hidden)
                    .await
            }
            Via::Khalti => {
                let page = self.choose(session, &[("provider", "khalti")]).await;
                let to = page.redirect(303);
                assert!(
                    to.starts_with(&format!("{base}/sim/khalti/pay")) && to.contains("pidx="),
                    "{to}"
                );
                let at = self.browser.get(&to).await;
                if at.status == 200 {
                    return self.wallet(&to, at);
                }
                at
            }
            Via::FonepayWeb => {
                let page = self
                    .choose(session, &[("provider", "fonepay"), ("fonepay", "web")])
                    .await;
                let to = page.redirect(303);
                assert!(
                    to.starts_with(&format!("{base}/sim/fonepay/api/merchantRequest?")),
                    "{to}"
                );
                self.browser.get(&to).await
            }
        };
        match at.status {
            // eSewa's form and Fonepay's web redirect: on to the wallet.
            303 => {
                let to = at.redirect(303);
                let wallet = match via {
                    Via::Esewa => "/sim/esewa/wallet/",
                    Via::Khalti => "/sim/khalti/pay",
                    Via::FonepayWeb => "/sim/fonepay/web/",
                };
                assert!(to.starts_with(&format!("{base}{wallet}")), "{to}");
                let page = self.browser.get(&to).await;
                if page.status == 200 {
                    self.wallet(&to, page)
                } else {
                    AtProvider::Back(page.redirect(302))
                }
            }
            302 => AtProvider::Back(at.redirect(302)),
            _ => panic!("the provider answered {}", at.show()),
        }
    }

    fn wallet(&self, url: &str, page: Page) -> AtProvider {
        let buttons: Vec<String> = tags(&page.body, "button")
            .into_iter()
            .filter(|b| b.get("name") == Some("action"))
            .map(|b| b.get("value").unwrap_or_default().to_owned())
            .collect();
        assert!(
            buttons.iter().any(|b| b == "pay"),
            "no pay button: {}",
            page.show()
        );
        let Some(form) = form(&page.body, None) else {
            panic!("no form on the provider's page: {}", page.show())
        };
        AtProvider::Wallet {
            page: url.to_owned(),
            form,
        }
    }

    /// The customer presses `action` (`pay`, `fail`, `cancel`) on the
    /// provider's page: answers where the provider sends the browser.
    async fn press(&self, at: &AtProvider, action: &str) -> String {
        let form = at.wallet();
        let mut sent = form.hidden.clone();
        sent.push(("action".into(), action.into()));
        let page = self.browser.post_form(&form.action, &sent).await;
        page.redirect(302)
    }

    /// The browser arrives back at our return URL.
    async fn arrive(&self, session: &str, callback: &str) -> Page {
        assert!(
            callback.starts_with(&format!("{}/c/{session}/return/pay_", self.app.base)),
            "{callback}"
        );
        self.browser.get(callback).await
    }

    /// Picks `via`, pays on the provider's page, and comes back: the
    /// payment's id and our answer to the return.
    async fn pay(&self, session: &str, via: Via) -> (String, Page) {
        let at = self.to_provider(session, via).await;
        let payment = self.current_payment(session).await;
        let callback = self.press(&at, "pay").await;
        assert!(
            callback.contains(&format!("/return/{payment}/ok")),
            "{callback}"
        );
        (payment, self.arrive(session, &callback).await)
    }

    /// Picks Fonepay's QR: the payment and the QR page's URL.
    async fn start_qr(&self, session: &str) -> (String, String) {
        let page = self.choose(session, &[("provider", "fonepay")]).await;
        let qr = page.redirect(303);
        let payment = self.current_payment(session).await;
        assert_eq!(qr, format!("{}/c/{session}/qr/{payment}", self.app.base));
        let shown = self.browser.get(&qr).await;
        assert_eq!(shown.status, 200, "{}", shown.show());
        assert!(shown.has("<svg"), "no QR: {}", shown.show());
        (payment, qr)
    }

    /// `GET /c/{id}/status` until `done` holds (bounded).
    async fn poll_until(&self, session: &str, done: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        for _ in 0..POLL_TRIES {
            let res = self
                .browser
                .http
                .get(format!("{}/c/{session}/status", self.app.base))
                .send()
                .await;
            last = match res {
                Ok(r) => {
                    assert_eq!(r.status().as_u16(), 200);
                    r.json().await.unwrap_or(Value::Null)
                }
                Err(e) => panic!("status poll: {e}"),
            };
            if done(&last) {
                return last;
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
        panic!("the status never got there; last {last}")
    }

    // --- what the merchant sees afterwards

    /// The session is paid by `payment` (of `provider`, `amount`), the
    /// payment API agrees, lists it, and its event was written.
    async fn assert_paid(&self, session: &str, payment: &str, provider: &str, amount: i64) {
        let s = self.session(session).await;
        assert_eq!(s["status"], "success", "{s}");
        assert_eq!(s["paymentId"], payment, "{s}");
        let p = self.payment(payment).await;
        assert_eq!(p["status"], "success", "{p}");
        assert_eq!(p["amount"], amount, "{p}");
        assert_eq!(p["provider"], provider, "{p}");
        assert_eq!(p["checkoutSessionId"], session, "{p}");
        assert!(
            p["providerRef"].as_str().is_some_and(|r| !r.is_empty()),
            "providerRef: {p}"
        );
        assert_eq!(p["doublePaymentOf"], Value::Null, "{p}");
        let (ids, _) = self.payments().await;
        assert!(ids.iter().any(|i| i == payment), "{payment} in {ids:?}");
        assert_eq!(
            self.events_about("payment.succeeded", payment).await,
            1,
            "one payment.succeeded event for {payment}"
        );
        let page = self.hosted(session, "").await;
        assert_eq!(page.status, 200, "{}", page.show());
        assert!(page.has("Payment received"), "{}", page.show());
    }
}

// ---------------------------------------------------------------------------
// 1. A real payment through each provider

async fn a_customer_pays_with_esewa(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    assert_eq!(shop.session_status(&s).await, "pending");
    // Fonepay needs the merchant's own credentials: not offered yet.
    assert_eq!(shop.offered(&s).await, vec!["esewa", "khalti"]);

    let (payment, back) = shop.pay(&s, Via::Esewa).await;
    assert!(
        back.status == 303 && back.location.as_deref() == Some(merchant_landing(&s).as_str()),
        "{}",
        back.show()
    );
    shop.assert_paid(&s, &payment, "esewa", AMOUNT).await;
    let (ids, total) = shop.payments().await;
    assert_eq!((ids, total), (vec![payment.clone()], 1));
    shop.stop().await;
}

/// Issue 41, 1: a payment's fee is the provider's where it states one
/// (Khalti's lookup, 3 % in the simulator), else the merchant's configured
/// rate snapshotted at success (eSewa), else none (null); the API's GET,
/// its list and the webhook's payment object agree; a refund shows the
/// fee the provider keeps.
async fn payments_show_the_providers_or_the_configured_fee(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let fee_of = |p: &Value| (p["fee"].clone(), p["net"].clone(), p["feeSource"].clone());
    // No rate, and eSewa states no fee: null, null, null.
    let s = shop.checkout(AMOUNT).await;
    let (plain, _) = shop.pay(&s, Via::Esewa).await;
    let p = shop.payment(&plain).await;
    assert_eq!(fee_of(&p), (Value::Null, Value::Null, Value::Null), "{p}");

    // 2.5 % + NPR 1 configured for eSewa: 3,750 + 100 paisa.
    let tenant = shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox);
    let configured = shared::domain::fees::configure(
        shop.app.state(),
        &tenant,
        shared::domain::Provider::Esewa,
        250,
        100,
        Vec::new(),
    )
    .await;
    assert!(configured.is_ok(), "{configured:?}");
    let s = shop.checkout(AMOUNT).await;
    let (esewa, _) = shop.pay(&s, Via::Esewa).await;
    let p = shop.payment(&esewa).await;
    assert_eq!(
        fee_of(&p),
        (json!(3_850), json!(146_150), json!("configured")),
        "{p}"
    );

    // Khalti states its fee (the simulator's 3 %): the provider's.
    let s = shop.checkout(AMOUNT).await;
    let (khalti, _) = shop.pay(&s, Via::Khalti).await;
    let p = shop.payment(&khalti).await;
    assert_eq!(
        fee_of(&p),
        (json!(4_500), json!(145_500), json!("provider")),
        "{p}"
    );

    // The list shows the same, and the webhook's payment object too.
    let list = shop.app.get("/v1/payments", Some(&shop.key)).await;
    assert_eq!(list.status, 200, "{}", list.body);
    let listed: Vec<(String, (Value, Value, Value))> = list.body["data"]
        .as_array()
        .map(|d| d.iter().map(|p| (text(&p["id"]), fee_of(p))).collect())
        .unwrap_or_default();
    assert_eq!(
        listed,
        vec![
            (
                khalti.clone(),
                (json!(4_500), json!(145_500), json!("provider"))
            ),
            (
                esewa.clone(),
                (json!(3_850), json!(146_150), json!("configured"))
            ),
            (plain.clone(), (Value::Null, Value::Null, Value::Null)),
        ]
    );
    let events = shop.events().await;
    let object = events
        .iter()
        .find(|e| e.object["id"] == khalti.as_str())
        .map(|e| e.object.clone())
        .unwrap_or_default();
    assert_eq!(
        fee_of(&object),
        (json!(4_500), json!(145_500), json!("provider")),
        "{object}"
    );

    // A refund of the eSewa payment: eSewa keeps its fee (assumed).
    let r = shop
        .app
        .post(
            "/v1/refunds",
            Some(&shop.key),
            None,
            &json!({"paymentId": esewa, "amount": 50_000, "reason": "customer_request"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        fee_of(&r.body),
        (json!(0), json!(50_000), json!("configured")),
        "{}",
        r.body
    );
    let r = shop
        .app
        .post(
            "/v1/refunds",
            Some(&shop.key),
            None,
            &json!({"paymentId": plain, "amount": 50_000, "reason": "customer_request"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        fee_of(&r.body),
        (Value::Null, Value::Null, Value::Null),
        "{}",
        r.body
    );
    shop.stop().await;
}

/// Issue 37, 2: anyone who knows a session's id (it is in the page's
/// address) can spend the session's page budget, but not the customer's
/// way back from the provider: the return of the session's own attempt
/// is checked by its signature and counted per address only.
async fn a_stranger_spending_a_sessions_budget_stops_no_return(which: Which) {
    // Ten seconds into a minute: every request below falls in one window
    // of the limits.
    let now = SystemClock.now().unix_seconds();
    let start = Timestamp::from_unix_millis((now - now.rem_euclid(60) + 10) * 1000);
    let clock = ManualClock::new(start.unwrap_or_else(|| SystemClock.now()));
    let Some(shop) = Shop::open_with_clock(which, Arc::new(clock.clone())).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    let at = shop.to_provider(&s, Via::Esewa).await;
    let payment = shop.current_payment(&s).await;
    // address, writes per address, per session, per link, link sessions:
    // four a minute for the session, one spent by the customer's attempt.
    shop.app.state().public_limits().set(1000, 100, 4, 100, 100);
    let stranger = match reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 9]))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let status = format!("{}/c/{s}/status", shop.app.base);
    let mut answers = Vec::new();
    for _ in 0..6 {
        match stranger.get(&status).send().await {
            Ok(r) => answers.push(r.status().as_u16()),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        answers,
        [200, 200, 200, 429, 429, 429],
        "the stranger spent it"
    );
    // The stranger's polls asked eSewa (one check per payment every 3 s);
    // the customer comes back a few seconds later.
    clock.advance(chrono::Duration::seconds(4));
    // The customer pays at eSewa and comes back: the return is handled.
    let callback = shop.press(&at, "pay").await;
    assert!(
        callback.contains(&format!("/return/{payment}/ok")),
        "{callback}"
    );
    let back = shop.arrive(&s, &callback).await;
    assert!(
        back.status == 303 && back.location.as_deref() == Some(merchant_landing(&s).as_str()),
        "{}",
        back.show()
    );
    shop.assert_paid(&s, &payment, "esewa", AMOUNT).await;
    shop.stop().await;
}

async fn a_customer_pays_with_khalti(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    let at = shop.to_provider(&s, Via::Khalti).await;
    assert_eq!(shop.session_status(&s).await, "initiated");
    let payment = shop.current_payment(&s).await;
    assert_eq!(shop.payment_status(&payment).await, "pending");
    let callback = shop.press(&at, "pay").await;
    assert_eq!(
        query_param(&callback, "status").as_deref(),
        Some("Completed")
    );
    assert!(query_param(&callback, "pidx").is_some(), "{callback}");
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &payment, "khalti", AMOUNT).await;
    // A reload of the return changes nothing.
    let again = shop.arrive(&s, &callback).await;
    assert_eq!(again.redirect(303), merchant_landing(&s));
    assert_eq!(shop.events_about("payment.succeeded", &payment).await, 1);
    shop.stop().await;
}

async fn a_customer_pays_with_a_fonepay_qr(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    shop.enable_fonepay().await;
    let s = shop.checkout(FONEPAY_AMOUNT).await;
    assert_eq!(shop.offered(&s).await, vec!["esewa", "khalti", "fonepay"]);
    let (payment, qr) = shop.start_qr(&s).await;
    // The checkout page sends a returning customer to the QR again.
    assert_eq!(shop.hosted(&s, "").await.redirect(303), qr);
    let waiting = shop.poll_until(&s, |_| true).await;
    assert_eq!(waiting["status"], "initiated", "{waiting}");
    assert_eq!(waiting["next"], Value::Null, "{waiting}");

    // The customer's banking app pays the QR.
    let prn = shop.reference(&payment).await;
    shop.at_provider("fonepay", &prn, "pay").await;
    let done = shop.poll_until(&s, |v| v["status"] != "initiated").await;
    assert_eq!(done["status"], "success", "{done}");
    assert_eq!(done["paymentStatus"], "success", "{done}");
    assert_eq!(done["next"], merchant_landing(&s), "{done}");
    shop.assert_paid(&s, &payment, "fonepay", FONEPAY_AMOUNT)
        .await;
    // The QR is gone once paid.
    assert_eq!(
        shop.browser.get(&qr).await.redirect(303),
        format!("{}/c/{s}", shop.app.base)
    );
    shop.stop().await;
}

async fn a_customer_pays_on_fonepays_web_page(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    shop.enable_fonepay().await;
    let s = shop.checkout(FONEPAY_AMOUNT).await;
    let (payment, back) = shop.pay(&s, Via::FonepayWeb).await;
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &payment, "fonepay", FONEPAY_AMOUNT)
        .await;
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 2. A cancel at the provider: back to the picker, another provider pays

async fn a_cancel_at_esewa_returns_to_the_picker_and_khalti_then_pays(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    let at = shop.to_provider(&s, Via::Esewa).await;
    let first = shop.current_payment(&s).await;
    let callback = shop.press(&at, "cancel").await;
    assert!(
        callback.ends_with(&format!("/return/{first}/fail")),
        "{callback}"
    );
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(
        back.redirect(303),
        format!("{}/c/{s}?notice=cancelled", shop.app.base)
    );
    assert_eq!(shop.payment_status(&first).await, "cancelled");
    assert_eq!(shop.session_status(&s).await, "pending");
    assert_eq!(shop.events_about("payment.cancelled", &first).await, 1);
    let picker = shop.hosted(&s, "?notice=cancelled").await;
    assert_eq!(picker.status, 200, "{}", picker.show());
    assert!(
        picker.has("id=notice") && picker.has("Payment cancelled"),
        "{}",
        picker.show()
    );
    assert_eq!(radios(&picker.body, "provider"), vec!["esewa", "khalti"]);

    let (second, back) = shop.pay(&s, Via::Khalti).await;
    assert_ne!(first, second);
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &second, "khalti", AMOUNT).await;
    assert_eq!(shop.payment_status(&first).await, "cancelled");
    assert_eq!(shop.payments().await.1, 2);
    shop.stop().await;
}

/// A redirect checkout (no picker): a cancel at the provider lands on the
/// shop's cancelUrl, or its returnUrl with `status=cancelled`.
async fn a_cancel_in_a_redirect_checkout_goes_back_to_the_shop(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    for cancel_url in [Some("https://shop.example/basket?from=pay"), None] {
        let mut body = json!({
            "amount": AMOUNT, "returnUrl": "https://shop.example/thanks?order=7",
            "flow": "redirect", "provider": "esewa",
        });
        if let Some(c) = cancel_url {
            body["cancelUrl"] = json!(c);
        }
        let a = shop
            .app
            .post("/v1/checkout", Some(&shop.key), None, &body)
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
        let s = text(&a.body["id"]);
        let at = shop.to_provider(&s, Via::Esewa).await;
        let first = shop.current_payment(&s).await;
        let callback = shop.press(&at, "cancel").await;
        let back = shop.arrive(&s, &callback).await;
        let expected = match cancel_url {
            Some(c) => c.to_owned(),
            None => format!("https://shop.example/thanks?order=7&session_id={s}&status=cancelled"),
        };
        assert_eq!(back.redirect(303), expected);
        assert_eq!(shop.payment_status(&first).await, "cancelled");
        assert_eq!(shop.session_status(&s).await, "pending");
    }
    shop.stop().await;
}

async fn a_scripted_cancel_at_khalti_returns_to_the_picker_and_esewa_then_pays(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    shop.script("khalti", json!({"outcome": "cancel"})).await;
    let at = shop.to_provider(&s, Via::Khalti).await;
    let first = shop.current_payment(&s).await;
    let callback = at.back().to_owned();
    assert_eq!(
        query_param(&callback, "status").as_deref(),
        Some("User canceled")
    );
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(
        back.redirect(303),
        format!("{}/c/{s}?notice=cancelled", shop.app.base)
    );
    assert_eq!(shop.payment_status(&first).await, "cancelled");
    assert_eq!(shop.session_status(&s).await, "pending");

    let (second, back) = shop.pay(&s, Via::Esewa).await;
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &second, "esewa", AMOUNT).await;
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 3. A decline fails the payment and the session

/// The declined session is `failed` everywhere: API, event, page, and no
/// new attempt can start.
async fn assert_declined(shop: &Shop, session: &str, payment: &str) {
    assert_eq!(shop.payment_status(payment).await, "failed");
    let p = shop.payment(payment).await;
    assert!(p["failureReason"].is_string(), "{p}");
    assert_eq!(shop.session_status(session).await, "failed");
    assert_eq!(shop.events_about("payment.failed", payment).await, 1);
    assert_eq!(shop.events_about("payment.succeeded", payment).await, 0);
    let page = shop.hosted(session, "").await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.has("id=final") && page.has("Payment failed"),
        "{}",
        page.show()
    );
    let again = shop.choose(session, &[("provider", "khalti")]).await;
    assert_eq!(
        again.redirect(303),
        format!("{}/c/{session}", shop.app.base)
    );
}

async fn a_fonepay_decline_fails_the_session(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    shop.enable_fonepay().await;

    // On Fonepay's web page (scripted: the bank declines at once).
    let s = shop.checkout(FONEPAY_AMOUNT).await;
    shop.script("fonepay", json!({"outcome": "failure"})).await;
    let at = shop.to_provider(&s, Via::FonepayWeb).await;
    let payment = shop.current_payment(&s).await;
    let callback = at.back().to_owned();
    assert_eq!(query_param(&callback, "PS").as_deref(), Some("false"));
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(back.redirect(303), format!("{}/c/{s}", shop.app.base));
    assert_declined(&shop, &s, &payment).await;

    // A QR the customer's bank declines: the page's polling finds out.
    let s = shop.checkout(FONEPAY_AMOUNT).await;
    let (payment, _) = shop.start_qr(&s).await;
    let prn = shop.reference(&payment).await;
    shop.at_provider("fonepay", &prn, "fail").await;
    let done = shop.poll_until(&s, |v| v["status"] != "initiated").await;
    assert_eq!(done["paymentStatus"], "failed", "{done}");
    assert_eq!(done["next"], format!("/c/{s}"), "{done}");
    assert_declined(&shop, &s, &payment).await;
    shop.stop().await;
}

async fn an_esewa_decline_sends_the_customer_back_to_the_picker(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    shop.script("esewa", json!({"outcome": "failure"})).await;
    let at = shop.to_provider(&s, Via::Esewa).await;
    let payment = shop.current_payment(&s).await;
    let callback = at.back().to_owned();
    assert!(
        callback.ends_with(&format!("/return/{payment}/fail")),
        "{callback}"
    );
    // eSewa has no "failed" status: after its failure return its status
    // API has no payment, so the attempt is over (cancelled, with the
    // reason) and the customer may pay another way (decisions.md).
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(
        back.redirect(303),
        format!("{}/c/{s}?notice=cancelled", shop.app.base)
    );
    assert_eq!(shop.payment_status(&payment).await, "cancelled");
    let p = shop.payment(&payment).await;
    assert!(
        p["failureReason"]
            .as_str()
            .is_some_and(|r| r.contains("without paying")),
        "{p}"
    );
    assert_eq!(shop.session_status(&s).await, "pending");
    assert_eq!(shop.events_about("payment.cancelled", &payment).await, 1);
    assert_eq!(shop.events_about("payment.succeeded", &payment).await, 0);
    let picker = shop.hosted(&s, "?notice=cancelled").await;
    assert!(picker.has("id=pay-form"), "{}", picker.show());
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 4. A tampered return changes nothing; the reconciler settles the truth

async fn a_tampered_esewa_return_is_ignored_and_the_sweep_settles_it(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    let at = shop.to_provider(&s, Via::Esewa).await;
    let payment = shop.current_payment(&s).await;
    let reference = shop.reference(&payment).await;
    // The customer pays; the browser is sent back with an altered amount
    // under a signature that does not match it.
    shop.script(
        "esewa",
        json!({"outcome": "tampered_callback", "reference": reference}),
    )
    .await;
    let callback = shop.press(&at, "pay").await;
    let data = query_param(&callback, "data").unwrap_or_default();
    let claim = String::from_utf8(base64_decode(&data)).unwrap_or_default();
    assert!(claim.contains("\"total_amount\":\"1,501.0\""), "{claim}");
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(back.redirect(303), format!("{}/c/{s}", shop.app.base));
    assert_eq!(shop.payment_status(&payment).await, "pending");
    assert_eq!(shop.session_status(&s).await, "initiated");
    assert_eq!(shop.events_about("payment.succeeded", &payment).await, 0);

    // The scheduler asks eSewa, which says paid.
    let report = shop.sweep().await;
    assert!(report.payments_checked >= 1, "{report:?}");
    assert!(report.payments_settled >= 1, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    shop.assert_paid(&s, &payment, "esewa", AMOUNT).await;
    shop.stop().await;
}

async fn a_tampered_khalti_return_is_ignored_and_the_sweep_finds_the_cancel(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    // The customer cancels, yet the browser comes back claiming a payment
    // of another amount.
    shop.script("khalti", json!({"outcome": "tampered_callback"}))
        .await;
    let at = shop.to_provider(&s, Via::Khalti).await;
    let payment = shop.current_payment(&s).await;
    let callback = at.back().to_owned();
    assert_eq!(
        query_param(&callback, "status").as_deref(),
        Some("Completed")
    );
    assert_eq!(
        query_param(&callback, "amount").as_deref(),
        Some((AMOUNT + 100).to_string().as_str())
    );
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(back.redirect(303), format!("{}/c/{s}", shop.app.base));
    assert_eq!(shop.payment_status(&payment).await, "pending");
    assert_eq!(shop.session_status(&s).await, "initiated");

    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(shop.payment_status(&payment).await, "cancelled");
    assert_eq!(shop.session_status(&s).await, "pending");
    assert_eq!(shop.events_about("payment.succeeded", &payment).await, 0);
    assert_eq!(shop.events_about("payment.cancelled", &payment).await, 1);
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 5. Hand-made returns never make a payment succeed

async fn forged_esewa_returns_never_succeed(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let base = shop.app.base.clone();
    // Payment A: paid at eSewa; its genuine return is held back for now.
    let s1 = shop.checkout(AMOUNT).await;
    let at = shop.to_provider(&s1, Via::Esewa).await;
    let a = shop.current_payment(&s1).await;
    let genuine = shop.press(&at, "pay").await;
    let data = query_param(&genuine, "data").unwrap_or_default();
    let claim = String::from_utf8(base64_decode(&data)).unwrap_or_default();
    assert!(claim.contains("\"status\":\"COMPLETE\""), "{claim}");
    // eSewa shows Rs 1,500 with a separator and signs it without one.
    assert!(claim.contains("\"total_amount\":\"1,500.0\""), "{claim}");

    // Payment B of another session (same amount), not paid.
    let s2 = shop.checkout(AMOUNT).await;
    let at_b = shop.to_provider(&s2, Via::Esewa).await;
    at_b.wallet();
    let b = shop.current_payment(&s2).await;
    let b_ref = shop.reference(&b).await;
    let return_b = format!("{base}/c/{s2}/return/{b}/ok");

    let forgeries: Vec<(&str, String)> = vec![
        // A's data with another amount (the signature no longer matches).
        (
            "amount changed",
            with_query(
                &genuine,
                &[(
                    "data",
                    &base64_encode(
                        claim
                            .replace("\"total_amount\":\"1,500.0\"", "\"total_amount\":\"15.0\"")
                            .as_bytes(),
                    ),
                )],
            ),
        ),
        // A's data with the signature dropped.
        (
            "unsigned",
            with_query(
                &genuine,
                &[(
                    "data",
                    &base64_encode(
                        claim
                            .replace("\"signature\":", "\"signatures\":")
                            .as_bytes(),
                    ),
                )],
            ),
        ),
        // Not base64 at all.
        (
            "garbage",
            with_query(&genuine, &[("data", "%%%not-base64")]),
        ),
        // No data.
        ("empty", with_query(&genuine, &[])),
        // A's genuine data replayed onto B's return.
        ("replayed onto B", with_query(&return_b, &[("data", &data)])),
        // A claim for B, correctly signed (the sandbox key is public), but
        // B was never paid: the status check says otherwise.
        ("signed but false", {
            let code = "FORGED1";
            let total = "1500.0";
            let message = shared::providers::sign::esewa_message(&[
                ("transaction_code", code),
                ("status", "COMPLETE"),
                ("total_amount", total),
                ("transaction_uuid", &b_ref),
                ("product_code", "EPAYTEST"),
                (
                    "signed_field_names",
                    "transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names",
                ),
            ]);
            let signature = shared::providers::sign::esewa_signature(ESEWA_TEST_SECRET, &message);
            let forged = json!({
                "transaction_code": code, "status": "COMPLETE", "total_amount": total,
                "transaction_uuid": b_ref, "product_code": "EPAYTEST",
                "signed_field_names": "transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names",
                "signature": signature,
            });
            with_query(
                &return_b,
                &[("data", &base64_encode(forged.to_string().as_bytes()))],
            )
        }),
    ];
    for (what, forged) in &forgeries {
        let (session, payment) = if forged.contains(&format!("/return/{b}/")) {
            (&s2, &b)
        } else {
            (&s1, &a)
        };
        let back = shop.arrive(session, forged).await;
        assert_eq!(
            back.redirect(303),
            format!("{base}/c/{session}"),
            "{what}: {forged}"
        );
        let status = shop.payment_status(payment).await;
        assert!(
            status == "pending" || status == "processing",
            "{what}: payment {payment} is {status}"
        );
        assert_eq!(shop.session_status(session).await, "initiated", "{what}");
    }
    // A's return under B's session: no such payment there.
    let crossed = shop
        .browser
        .get(&format!(
            "{base}/c/{s2}/return/{a}/ok?data={}",
            url_escape(&data)
        ))
        .await;
    assert_eq!(crossed.status, 404, "{}", crossed.show());
    assert_eq!(shop.events_about("payment.succeeded", &a).await, 0);
    assert_eq!(shop.events_about("payment.succeeded", &b).await, 0);

    // The genuine return still works, once.
    let back = shop.arrive(&s1, &genuine).await;
    assert_eq!(back.redirect(303), merchant_landing(&s1));
    shop.assert_paid(&s1, &a, "esewa", AMOUNT).await;
    // ...and replaying it onto B afterwards still changes nothing.
    let replay = shop
        .arrive(&s2, &with_query(&return_b, &[("data", &data)]))
        .await;
    assert_eq!(replay.redirect(303), format!("{base}/c/{s2}"));
    assert_ne!(shop.payment_status(&b).await, "success");
    assert_ne!(shop.session_status(&s2).await, "success");
    assert_eq!(shop.events_about("payment.succeeded", &b).await, 0);
    shop.stop().await;
}

/// Percent-encodes one query value.
fn url_escape(v: &str) -> String {
    form_encode(&[("v".into(), v.into())])
        .trim_start_matches("v=")
        .to_owned()
}

// ---------------------------------------------------------------------------
// 6. "Pending" at the provider: processing, then settled by sweeps

async fn pending_payments_are_processing_until_a_sweep_settles_them(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    // Khalti answers "pending" once more after the return, eSewa twice.
    let k = shop.checkout(AMOUNT).await;
    shop.script(
        "khalti",
        json!({"outcome": "pending_then_success", "pending_calls": 1}),
    )
    .await;
    let at = shop.to_provider(&k, Via::Khalti).await;
    let kp = shop.current_payment(&k).await;
    let callback = at.back().to_owned();
    assert_eq!(query_param(&callback, "status").as_deref(), Some("Pending"));
    let back = shop.arrive(&k, &callback).await;
    assert_eq!(back.redirect(303), format!("{}/c/{k}", shop.app.base));
    assert_eq!(shop.payment_status(&kp).await, "processing");
    assert_eq!(shop.session_status(&k).await, "initiated");
    let page = shop.hosted(&k, "").await;
    assert!(page.has("Confirming your payment"), "{}", page.show());

    let e = shop.checkout(AMOUNT).await;
    shop.script("esewa", json!({"outcome": "pending_then_success"}))
        .await;
    let at = shop.to_provider(&e, Via::Esewa).await;
    let ep = shop.current_payment(&e).await;
    let back = shop.arrive(&e, at.back()).await;
    assert_eq!(back.redirect(303), format!("{}/c/{e}", shop.app.base));
    assert_eq!(shop.payment_status(&ep).await, "processing");

    let first = shop.sweep().await;
    assert_eq!(first.errors, 0, "{first:?}");
    shop.assert_paid(&k, &kp, "khalti", AMOUNT).await;
    assert_eq!(shop.payment_status(&ep).await, "processing");
    assert_eq!(shop.session_status(&e).await, "initiated");

    let second = shop.sweep().await;
    assert_eq!(second.errors, 0, "{second:?}");
    shop.assert_paid(&e, &ep, "esewa", AMOUNT).await;
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 7. An ambiguous provider: processing, never success

async fn ambiguous_payments_stay_processing(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    shop.enable_fonepay().await;
    let e = shop.checkout(AMOUNT).await;
    shop.script("esewa", json!({"outcome": "ambiguous"})).await;
    let at = shop.to_provider(&e, Via::Esewa).await;
    let ep = shop.current_payment(&e).await;
    let back = shop.arrive(&e, at.back()).await;
    assert_eq!(back.redirect(303), format!("{}/c/{e}", shop.app.base));

    let f = shop.checkout(FONEPAY_AMOUNT).await;
    shop.script("fonepay", json!({"outcome": "ambiguous"}))
        .await;
    let at = shop.to_provider(&f, Via::FonepayWeb).await;
    let fp = shop.current_payment(&f).await;
    let back = shop.arrive(&f, at.back()).await;
    assert_eq!(back.redirect(303), format!("{}/c/{f}", shop.app.base));

    for round in 0..3 {
        for (s, p) in [(&e, &ep), (&f, &fp)] {
            assert_eq!(shop.payment_status(p).await, "processing", "round {round}");
            assert_eq!(shop.session_status(s).await, "initiated", "round {round}");
            assert_eq!(shop.events_about("payment.succeeded", p).await, 0);
        }
        let report = shop.sweep().await;
        assert_eq!(report.payments_settled, 0, "{report:?}");
    }
    let page = shop.hosted(&e, "").await;
    assert!(page.has("Confirming your payment"), "{}", page.show());
    let polled = shop.poll_until(&f, |_| true).await;
    assert_eq!(polled["status"], "initiated", "{polled}");
    assert_eq!(polled["paymentStatus"], "processing", "{polled}");
    assert_eq!(polled["next"], Value::Null, "{polled}");
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 8. Faults: a status check that fails or times out, a refused start

async fn a_failed_status_check_leaves_the_payment_to_the_sweep(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    // eSewa's status API answers 503 once.
    let e = shop.checkout(AMOUNT).await;
    shop.script(
        "esewa",
        json!({"outcome": "server_error", "on": "status", "times": 1}),
    )
    .await;
    let (ep, back) = shop.pay(&e, Via::Esewa).await;
    assert_eq!(back.redirect(303), format!("{}/c/{e}", shop.app.base));
    let status = shop.payment_status(&ep).await;
    assert!(status == "pending" || status == "processing", "{status}");
    assert_eq!(shop.session_status(&e).await, "initiated");

    // Khalti's lookup outlasts the client's timeout once.
    let k = shop.checkout(AMOUNT).await;
    shop.script(
        "khalti",
        json!({"outcome": "timeout", "on": "status", "times": 1}),
    )
    .await;
    let started = std::time::Instant::now();
    let (kp, back) = shop.pay(&k, Via::Khalti).await;
    assert_eq!(back.redirect(303), format!("{}/c/{k}", shop.app.base));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let status = shop.payment_status(&kp).await;
    assert!(status == "pending" || status == "processing", "{status}");
    assert_eq!(shop.session_status(&k).await, "initiated");
    assert_eq!(shop.events_about("payment.succeeded", &kp).await, 0);

    // The faults are used up: the sweep finds both paid.
    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.payments_settled, 2, "{report:?}");
    shop.assert_paid(&e, &ep, "esewa", AMOUNT).await;
    shop.assert_paid(&k, &kp, "khalti", AMOUNT).await;
    shop.stop().await;
}

async fn a_provider_that_cannot_start_sends_the_customer_back_to_the_picker(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    shop.script(
        "khalti",
        json!({"outcome": "server_error", "on": "initiate"}),
    )
    .await;
    let page = shop.choose(&s, &[("provider", "khalti")]).await;
    assert_eq!(page.status, 503, "{}", page.show());
    // Nothing was charged: the attempt failed, the session stays open.
    let (ids, total) = shop.payments().await;
    assert_eq!(total, 1, "{ids:?}");
    let failed = &ids[0];
    let p = shop.payment(failed).await;
    assert_eq!(p["status"], "failed", "{p}");
    assert_eq!(p["provider"], "khalti", "{p}");
    assert_eq!(
        shop.session_status(&s).await,
        "pending",
        "a provider that could not start must leave the session open; the page: {}",
        page.show()
    );
    assert!(
        page.has("id=pay-form") && page.has("id=error") && page.has("did not answer"),
        "the picker again, with the error: {}",
        page.show()
    );

    let (paid, back) = shop.pay(&s, Via::Esewa).await;
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &paid, "esewa", AMOUNT).await;
    assert_eq!(shop.payment_status(failed).await, "failed");
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 9. Two attempts both paid: the second success is kept and flagged

async fn a_second_success_is_flagged_as_a_double_payment(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    // Attempt A: the customer reaches eSewa's wallet but does not pay...
    let at_a = shop.to_provider(&s, Via::Esewa).await;
    let a = shop.current_payment(&s).await;
    // ...comes back to the checkout page, chooses again, and pays B.
    let confirming = shop.hosted(&s, "").await;
    assert!(confirming.has("?choose=1"), "{}", confirming.show());
    let picker = shop.hosted(&s, "?choose=1").await;
    assert_eq!(radios(&picker.body, "provider"), vec!["esewa", "khalti"]);
    let (b, back) = shop.pay(&s, Via::Khalti).await;
    assert_ne!(a, b);
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &b, "khalti", AMOUNT).await;

    // Then the old eSewa tab pays A too.
    let callback = shop.press(&at_a, "pay").await;
    assert!(callback.contains(&format!("/return/{a}/ok")), "{callback}");
    let back = shop.arrive(&s, &callback).await;
    assert_eq!(back.status, 303, "{}", back.show());
    let pa = shop.payment(&a).await;
    assert_eq!(pa["status"], "success", "{pa}");
    assert_eq!(pa["doublePaymentOf"], b.as_str(), "{pa}");
    let session = shop.session(&s).await;
    assert_eq!(session["status"], "success", "{session}");
    assert_eq!(session["paymentId"], b.as_str(), "{session}");
    assert_eq!(shop.payment(&b).await["doublePaymentOf"], Value::Null);
    assert_eq!(shop.events_about("payment.succeeded", &a).await, 1);
    assert_eq!(shop.events_about("payment.succeeded", &b).await, 1);
    assert_eq!(shop.payments().await.1, 2);
    shop.stop().await;
}

/// Another project's flood of abandoned attempts (more than the former
/// sweep took in one pass, all older) does not delay a shop whose
/// customers paid and closed the tab: the reconciler visits work by when
/// it is due, one project's turn at a time, and settles all three in the
/// first sweep.
async fn one_projects_flood_does_not_delay_anothers_settlement(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let state = shop.app.state();
    let junk = shop.app.tenant("Junk", "junk@example.com").await;
    let creator = shared::domain::checkout::Creator {
        project_id: junk.project.id.as_str().into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_junk".into(),
        spend_cap_paisa: None,
    };
    // As many open attempts as a script looping on a link leaves (one per
    // session), older than the shop's, written in batches so the shared
    // AWS-compatible server is not what the test measures.
    let now = SystemClock.now();
    const JUNK: usize = 240;
    let junk: Vec<shared::store::TxOp> = (0..JUNK)
        .map(|i| {
            let p = shared::domain::payments::Payment {
                id: shared::ids::PaymentId::new(),
                project_id: creator.project_id.clone(),
                checkout_session_id: shared::ids::SessionId::new(),
                mode: Mode::Sandbox,
                amount: shared::money::Paisa::new(AMOUNT).unwrap_or_default(),
                amount_refunded: shared::money::Paisa::ZERO,
                currency: shared::money::Currency::Npr,
                amount_reserved: Default::default(),
                gsi2pk: None,
                gsi2sk: None,
                provider: shared::domain::Provider::Esewa,
                status: shared::domain::payments::PaymentStatus::Pending,
                provider_ref: None,
                failure_reason: None,
                metadata: Default::default(),
                customer_name: None,
                customer_email: None,
                customer_phone: None,
                created_at: now.plus(chrono::Duration::milliseconds(i as i64)),
                updated_at: now,
                double_payment_of: None,
                scanned_at: None,
                attempt: shared::domain::payments::AttemptInfo {
                    reference: Some(format!("JUNK-{i}")),
                    ..Default::default()
                },
                checks: Default::default(),
            };
            match shared::domain::attempts::stored_item(&p) {
                Ok(item) => shared::store::TxOp::Put { item, cond: None },
                Err(e) => panic!("{e}"),
            }
        })
        .collect();
    for batch in junk.chunks(60) {
        if let Err(e) = state.store.transact(batch.to_vec()).await {
            panic!("seed: {e}");
        }
    }
    if let Err(e) = shared::domain::active::touch_now(
        &*state.store,
        &shared::domain::Tenant::new(creator.project_id.clone(), Mode::Sandbox),
        now,
    )
    .await
    {
        panic!("{e}");
    }

    // Three customers of the shop pay at eSewa and close the tab.
    let mut paid = Vec::new();
    for _ in 0..3 {
        let s = shop.checkout(AMOUNT).await;
        let at = shop.to_provider(&s, Via::Esewa).await;
        let payment = shop.current_payment(&s).await;
        let callback = shop.press(&at, "pay").await;
        assert!(callback.contains("/return/"), "{callback}");
        paid.push((s, payment));
    }
    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    for (s, payment) in &paid {
        shop.assert_paid(s, payment, "esewa", AMOUNT).await;
    }
    assert!(
        report.payments_checked < JUNK,
        "the flood waits its turns: {report:?}"
    );
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 10. An expired session takes no attempt

/// A session takes at most ten attempts: a page reloaded in a loop (or a
/// script) cannot mint payments and provider calls without end.
async fn a_session_takes_at_most_ten_attempts(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    for n in 0..10 {
        let page = shop.choose(&s, &[("provider", "esewa")]).await;
        assert_eq!(page.status, 200, "attempt {n}: {}", page.show());
    }
    let refused = shop.choose(&s, &[("provider", "esewa")]).await;
    assert_eq!(refused.status, 422, "{}", refused.show());
    assert!(refused.has("10 payment attempts"), "{}", refused.show());
    let (_, total) = shop.payments().await;
    assert_eq!(total, 10);
    shop.stop().await;
}

/// A newer attempt of a session closes the one it supersedes at once:
/// cancelled (none of the providers can void a started attempt, so it is
/// re-checked like any cancel), out of the reconciler's open payments, so
/// a session holds at most one open payment however often it is retried.
async fn a_newer_attempt_closes_the_one_it_supersedes(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let s = shop.checkout(AMOUNT).await;
    let _at_a = shop.to_provider(&s, Via::Esewa).await;
    let a = shop.current_payment(&s).await;
    let page = shop.choose(&s, &[("provider", "khalti")]).await;
    assert_eq!(page.status, 303, "{}", page.show());
    let b = shop.current_payment(&s).await;
    assert_ne!(a, b);
    let pa = shop.payment(&a).await;
    assert_eq!(pa["status"], "cancelled", "{pa}");
    assert!(text(&pa["failureReason"]).contains("superseded"), "{pa}");
    assert_eq!(shop.payment_status(&b).await, "pending");
    assert_eq!(shop.events_about("payment.cancelled", &a).await, 1);
    // Eight more attempts: still one open payment in the index.
    for n in 0..8 {
        let page = shop.choose(&s, &[("provider", "esewa")]).await;
        assert_eq!(page.status, 200, "attempt {n}: {}", page.show());
    }
    let state = shop.app.state();
    let project = &shop.tenant.project.id;
    let open = shared::store::Query::partition(shared::domain::attempts::open_payments_partition(
        &shared::domain::Tenant::new(project.as_str(), Mode::Sandbox),
    ))
    .on(shared::store::Index::Gsi2);
    let indexed = state.store.query(&open).await.map(|p| p.items.len());
    assert_eq!(indexed.ok(), Some(1), "one open payment per session");
    let (_, total) = shop.payments().await;
    assert_eq!(total, 10);
    shop.stop().await;
}

/// Once the customer was sent to a provider, the session's address is
/// what the provider, the payment and the merchant were told: a later
/// attempt may send it again unchanged, never rewrite it.
async fn the_address_is_frozen_once_an_attempt_started(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let body = json!({
        "amount": AMOUNT, "returnUrl": RETURN_URL, "collectAddress": true
    });
    let a = shop
        .app
        .post("/v1/checkout", Some(&shop.key), None, &body)
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let s = text(&a.body["id"]);
    let home = [
        ("provider", "esewa"),
        ("line1", "Thamel 12"),
        ("city", "Kathmandu"),
    ];
    let page = shop.choose(&s, &home).await;
    assert_eq!(page.status, 200, "{}", page.show());
    let first = shop.current_payment(&s).await;

    // Another address on a second attempt: refused, with the reason.
    let elsewhere = [
        ("provider", "khalti"),
        ("line1", "Somewhere else 1"),
        ("city", "Pokhara"),
    ];
    let refused = shop.choose(&s, &elsewhere).await;
    assert_eq!(refused.status, 400, "{}", refused.show());
    assert!(
        refused.has("cannot be changed once a payment has been started"),
        "{}",
        refused.show()
    );
    let session = shop.session(&s).await;
    assert_eq!(session["customerAddress"]["line1"], "Thamel 12");
    assert_eq!(session["customerAddress"]["city"], "Kathmandu");
    assert_eq!(shop.current_payment(&s).await, first, "no attempt started");

    // The same address again, or none (the stored one is used): accepted.
    let again = shop.choose(&s, &home).await;
    assert_eq!(again.status, 200, "{}", again.show());
    let without = shop.choose(&s, &[("provider", "esewa")]).await;
    assert_eq!(without.status, 200, "{}", without.show());
    assert_eq!(
        shop.session(&s).await["customerAddress"]["line1"],
        "Thamel 12"
    );
    shop.stop().await;
}

async fn an_expired_session_takes_no_attempt(which: Which) {
    let clock = ManualClock::new(SystemClock.now());
    let Some(shop) = Shop::open_with_clock(which, Arc::new(clock.clone())).await else {
        return;
    };
    let seen = shop.checkout(AMOUNT).await;
    let unseen = shop.checkout(AMOUNT).await;
    assert_eq!(shop.offered(&seen).await, vec!["esewa", "khalti"]);
    clock.advance(chrono::Duration::minutes(31));

    let page = shop.hosted(&seen, "").await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.has("This checkout has expired"), "{}", page.show());
    assert!(!page.has("id=pay-form"), "{}", page.show());
    let tried = shop.choose(&seen, &[("provider", "esewa")]).await;
    assert_eq!(tried.redirect(303), format!("{}/c/{seen}", shop.app.base));
    assert_eq!(shop.session(&seen).await["paymentId"], Value::Null);
    assert_eq!(shop.payments().await.1, 0);

    // The scheduler stores the other one as expired (the read did the first).
    let report = shop.app.sweep(clock.now()).await;
    assert_eq!(report.sessions_expired, 1, "{report:?}");
    assert_eq!(shop.session_status(&unseen).await, "expired");
    assert_eq!(shop.app.sweep(clock.now()).await.sessions_expired, 0);
    shop.stop().await;
}

/// A sandbox Fonepay QR (real money) holds its share of the NPR 5,000
/// month for 30 minutes; reported paid after that (the simulator itself
/// refuses it by then; a real bank might not), it is held for review:
/// `processing`, no `payment.succeeded`, the month not charged.
async fn a_sandbox_qr_paid_after_its_hold_is_held_for_review(which: Which) {
    let clock = ManualClock::new(SystemClock.now());
    let Some(shop) = Shop::open_with_clock(which, Arc::new(clock.clone())).await else {
        return;
    };
    shop.enable_fonepay().await;
    let s = shop.checkout(FONEPAY_AMOUNT).await;
    let (payment, _qr) = shop.start_qr(&s).await;
    let prn = shop.reference(&payment).await;
    clock.advance(chrono::Duration::minutes(31));
    // The simulator's own clock has not moved: it takes the payment, as a
    // bank reporting late would.
    shop.at_provider("fonepay", &prn, "pay").await;
    let report = shop.app.sweep(clock.now()).await;
    assert_eq!(report.errors, 0, "{report:?}");
    let p = shop.payment(&payment).await;
    assert_eq!(p["status"], "processing", "{p}");
    assert_ne!(shop.session_status(&s).await, "success");
    assert_eq!(shop.events_about("payment.succeeded", &payment).await, 0);
    let stored = shop.stored(&payment).await;
    assert!(
        stored
            .checks
            .review
            .as_deref()
            .is_some_and(|r| r.contains("hold lapsed")),
        "{:?}",
        stored.checks
    );
    let used = shared::domain::fonepay_cap::used(
        &*shop.app.state().store,
        &shop.tenant.project.id.as_str().into(),
        clock.now(),
    )
    .await;
    assert_eq!(used.ok(), Some(0), "the month is not charged");
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 11. The sandbox Fonepay month cap, under concurrent customers

async fn the_fonepay_month_cap_holds_over_http(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    shop.enable_fonepay().await;
    let mut sessions = Vec::new();
    for _ in 0..6 {
        // NPR 1,000 each: five fill the NPR 5,000 month.
        sessions.push(shop.checkout(100_000).await);
    }
    let pages = futures::future::join_all(
        sessions
            .iter()
            .map(|s| shop.choose(s, &[("provider", "fonepay")])),
    )
    .await;
    let mut refused = Vec::new();
    for (s, page) in sessions.iter().zip(&pages) {
        match page.status {
            303 => {
                let to = page.redirect(303);
                assert!(
                    to.starts_with(&format!("{}/c/{s}/qr/pay_", shop.app.base)),
                    "{to}"
                );
            }
            422 => {
                assert!(page.has("5,000 a month"), "{}", page.show());
                refused.push(s.clone());
            }
            _ => panic!("{}", page.show()),
        }
    }
    assert_eq!(refused.len(), 1, "exactly one refused");
    let s = shop.session(&refused[0]).await;
    assert_eq!(s["status"], "pending", "{s}");
    assert_eq!(s["paymentId"], Value::Null, "{s}");
    assert_eq!(shop.payments().await.1, 5);
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 12. A retried create answers the same session

async fn a_retried_checkout_create_answers_the_same_session(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let body = json!({"amount": AMOUNT, "returnUrl": RETURN_URL, "cancelUrl": CANCEL_URL});
    let first = shop
        .app
        .post("/v1/checkout", Some(&shop.key), Some("order-77"), &body)
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_ne!(first.header("idempotent-replayed"), "true");
    let again = shop
        .app
        .post("/v1/checkout", Some(&shop.key), Some("order-77"), &body)
        .await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(again.body["id"], first.body["id"]);
    assert_eq!(again.body["checkout_url"], first.body["checkout_url"]);
    let listed = shop.app.get("/v1/sessions", Some(&shop.key)).await;
    assert_eq!(listed.body["meta"]["total"], 1, "{}", listed.body);
    // The one session pays normally.
    let s = text(&first.body["id"]);
    let (payment, back) = shop.pay(&s, Via::Esewa).await;
    assert_eq!(back.redirect(303), merchant_landing(&s));
    shop.assert_paid(&s, &payment, "esewa", AMOUNT).await;
    shop.stop().await;
}

on_both_backends!(
    payments_show_the_providers_or_the_configured_fee,
    the_address_is_frozen_once_an_attempt_started,
    a_stranger_spending_a_sessions_budget_stops_no_return,
    a_customer_pays_with_esewa,
    a_customer_pays_with_khalti,
    a_customer_pays_with_a_fonepay_qr,
    a_customer_pays_on_fonepays_web_page,
    a_cancel_at_esewa_returns_to_the_picker_and_khalti_then_pays,
    a_cancel_in_a_redirect_checkout_goes_back_to_the_shop,
    a_scripted_cancel_at_khalti_returns_to_the_picker_and_esewa_then_pays,
    a_fonepay_decline_fails_the_session,
    an_esewa_decline_sends_the_customer_back_to_the_picker,
    a_tampered_esewa_return_is_ignored_and_the_sweep_settles_it,
    a_tampered_khalti_return_is_ignored_and_the_sweep_finds_the_cancel,
    forged_esewa_returns_never_succeed,
    pending_payments_are_processing_until_a_sweep_settles_them,
    ambiguous_payments_stay_processing,
    a_failed_status_check_leaves_the_payment_to_the_sweep,
    a_provider_that_cannot_start_sends_the_customer_back_to_the_picker,
    a_second_success_is_flagged_as_a_double_payment,
    an_expired_session_takes_no_attempt,
    a_session_takes_at_most_ten_attempts,
    a_newer_attempt_closes_the_one_it_supersedes,
    one_projects_flood_does_not_delay_anothers_settlement,
    a_sandbox_qr_paid_after_its_hold_is_held_for_review,
    the_fonepay_month_cap_holds_over_http,
    a_retried_checkout_create_answers_the_same_session,
);

#[test]
fn the_string_helpers_read_pages_and_base64() {
    let html = "<form id=handoff class=card method=post action=\"http://h/x?a=1&amp;b=2\">\
                <input type=hidden name=\"sig\" value=\"a&quot;b&lt;c\"><input type=text name=t value=1>\
                <input type=hidden name=empty value=\"\"></form>\
                <input type=radio name=provider value=esewa id=p checked><input type=radio name=provider value=khalti>";
    let f = form(html, Some("handoff")).unwrap_or_else(|| panic!("form"));
    assert_eq!(f.action, "http://h/x?a=1&b=2");
    assert_eq!(
        f.hidden,
        vec![
            ("sig".to_owned(), "a\"b<c".to_owned()),
            ("empty".to_owned(), String::new())
        ]
    );
    assert_eq!(radios(html, "provider"), vec!["esewa", "khalti"]);
    assert!(form(html, Some("other")).is_none());
    for s in [
        "",
        "f",
        "fo",
        "foo",
        "{\"a\":\"1500.0\"}",
        "any carnal pleas",
    ] {
        assert_eq!(base64_decode(&base64_encode(s.as_bytes())), s.as_bytes());
    }
    assert_eq!(base64_encode(b"foob"), "Zm9vYg==");
    assert_eq!(
        form_encode(&fields(&[("a", "b c"), ("d", "+/=&")])),
        "a=b+c&d=%2B%2F%3D%26"
    );
    assert_eq!(
        query_param("http://h/p?x=1&data=a%2Bb", "data").as_deref(),
        Some("a+b")
    );
}
