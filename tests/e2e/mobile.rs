//! Mobile sessions: the merchant's server creates a session with its
//! secret key and hands the app the id and client secret; the app, holding
//! only the publishable key, reads the session and pays with each
//! provider: Khalti's page, eSewa's signed form, Fonepay's QR with the
//! event stream. Each payment is proven server to server and ends as a
//! hosted one does (webhook, refund). A wrong secret, another project's
//! key or a secret key get nothing.

use dhukuti_tests::browser::{Page, form, text};
use dhukuti_tests::shop::Shop;
use dhukuti_tests::sse::read_events;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::{self, KeyKind, NewKey};
use shared::time::{Clock, SystemClock};

/// NPR 500: within every provider's sandbox bounds.
const AMOUNT: i64 = 50_000;

/// The app's side: the publishable key and one session's secret.
struct App {
    key: String,
    id: String,
    secret: String,
}

async fn publishable(app: &TestApp, tenant: &dhukuti_tests::Tenant, mode: Mode) -> String {
    let new = NewKey {
        mode,
        kind: KeyKind::Publishable,
        scopes: Vec::new(),
        description: "the shop's app".into(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    match account::issue_api_key(app.state(), SystemClock.now(), &tenant.project, new).await {
        Ok((key, _)) => key,
        Err(e) => panic!("publishable key: {e}"),
    }
}

async fn open(which: Which) -> Option<(Shop, String)> {
    let shop = Shop::on(spawn_app(which).await?).await;
    let pk = publishable(&shop.app, &shop.tenant, Mode::Sandbox).await;
    Some((shop, pk))
}

/// The merchant's server: `POST /v1/mobile/sessions`.
async fn create(shop: &Shop, body: Value, idempotency_key: Option<&str>) -> Answer {
    shop.app
        .post(
            "/v1/mobile/sessions",
            Some(&shop.key),
            idempotency_key,
            &body,
        )
        .await
}

async fn session_for_app(shop: &Shop, pk: &str, body: Value) -> App {
    let a = create(shop, body, None).await;
    assert_eq!(a.status, 201, "{}", a.body);
    App {
        key: pk.to_owned(),
        id: text(&a.body["id"]),
        secret: text(&a.body["client_secret"]),
    }
}

impl App {
    /// `GET /v1/mobile/sessions/{id}` with the secret in the header.
    async fn read(&self, shop: &Shop) -> Answer {
        self.read_with(shop, Some(&self.secret)).await
    }

    async fn read_with(&self, shop: &Shop, secret: Option<&str>) -> Answer {
        let mut req = shop
            .app
            .client
            .get(shop.app.url(&format!("/v1/mobile/sessions/{}", self.id)))
            .bearer_auth(&self.key);
        if let Some(s) = secret {
            req = req.header("x-client-secret", s);
        }
        dhukuti_tests::send(req).await
    }

    /// `POST /v1/mobile/sessions/{id}/attempts` with the secret in the body.
    async fn attempt(&self, shop: &Shop, provider: &str) -> Answer {
        let body = json!({"provider": provider, "client_secret": self.secret});
        let req = shop
            .app
            .client
            .post(
                shop.app
                    .url(&format!("/v1/mobile/sessions/{}/attempts", self.id)),
            )
            .bearer_auth(&self.key)
            .header("content-type", "application/json")
            .body(body.to_string());
        dhukuti_tests::send(req).await
    }
}

/// The customer presses "pay" on a provider's wallet page; the provider
/// sends the browser back to us, and we answer.
async fn pay_on_wallet(shop: &Shop, app: &App, wallet: &str) -> Page {
    let page = shop.browser.get(wallet).await;
    assert_eq!(page.status, 200, "{}", page.show());
    let Some(f) = form(&page.body, None) else {
        panic!("no form on the wallet: {}", page.show())
    };
    let mut sent = f.hidden.clone();
    sent.push(("action".into(), "pay".into()));
    let callback = shop.browser.post_form(&f.action, &sent).await.redirect(302);
    assert!(
        callback.starts_with(&format!("{}/c/{}/return/pay_", shop.app.base, app.id)),
        "{callback}"
    );
    shop.browser.get(&callback).await
}

/// After the provider's return the customer stays on our final page (an
/// app has no shop page), which says to go back to the app.
async fn assert_paid_page(shop: &Shop, app: &App, back: &Page) {
    let final_page = format!("{}/c/{}", shop.app.base, app.id);
    assert_eq!(back.redirect(303), final_page, "{}", back.show());
    let page = shop.browser.get(&format!("/c/{}", app.id)).await;
    assert!(page.has("Payment received"), "{}", page.show());
    assert!(page.has("return to the app"), "{}", page.show());
    assert!(
        !page.has("back-link"),
        "no shop to go back to: {}",
        page.show()
    );
}

/// The session as the app sees it once paid, with the payment.
async fn assert_paid(shop: &Shop, app: &App, provider: &str) -> String {
    let a = app.read(shop).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "success", "{}", a.body);
    let p = &a.body["payment"];
    assert_eq!(p["status"], "success", "{}", a.body);
    assert_eq!(p["provider"], provider, "{}", a.body);
    assert_eq!(p["amount"], AMOUNT, "{}", a.body);
    let payment = text(&p["id"]);
    // The merchant's view agrees, and heard it once.
    assert_eq!(shop.payment(&payment).await["status"], "success");
    assert_eq!(shop.session(&app.id).await["flow"], "mobile");
    assert_eq!(shop.events_about("payment.succeeded", &payment).await, 1);
    payment
}

async fn an_app_pays_with_khalti_holding_only_its_publishable_key(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let body = json!({
        "amount": AMOUNT,
        "currency": "NPR",
        "description": "Momo x 4",
        "customer": {"name": "Sita Rai", "phone": "9800000001"},
        "metadata": {"order": "A-17"},
    });
    let a = create(&shop, body.clone(), Some("order-A-17")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let id = text(&a.body["id"]);
    let secret = text(&a.body["client_secret"]);
    assert!(id.starts_with("cs_"), "{}", a.body);
    assert!(
        secret.starts_with("cs_secret_") && secret.len() >= 40,
        "{secret}"
    );
    assert_eq!(a.body["livemode"], false);
    assert_eq!(a.body["amount"], AMOUNT);
    assert_eq!(a.body["currency"], "NPR");
    assert!(a.body["expires_at"].is_string(), "{}", a.body);
    // Fonepay needs the merchant's own credentials: not offered.
    assert_eq!(a.body["providers"], json!(["esewa", "khalti"]));
    // A retry after a lost answer gets the same session and secret.
    let again = create(&shop, body, Some("order-A-17")).await;
    assert_eq!(
        (&again.body["id"], &again.body["client_secret"]),
        (&a.body["id"], &a.body["client_secret"])
    );
    let app = App {
        key: pk.clone(),
        id,
        secret,
    };

    // The app reads its session: the header or the query carry the secret.
    let r = app.read(&shop).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "pending");
    assert_eq!(r.body["payment"], Value::Null);
    assert_eq!(r.body["providers"], json!(["esewa", "khalti"]));
    assert_eq!(
        text(&r.body["events_url"]),
        format!("{}/c/{}/events", shop.app.base, app.id)
    );
    let by_query = shop
        .app
        .get(
            &format!(
                "/v1/mobile/sessions/{}?client_secret={}",
                app.id, app.secret
            ),
            Some(&pk),
        )
        .await;
    assert_eq!(by_query.status, 200, "{}", by_query.body);

    // Khalti: the app opens the payment page the answer names.
    let t = app.attempt(&shop, "khalti").await;
    assert_eq!(t.status, 201, "{}", t.body);
    assert_eq!(t.body["handoff"], "redirect");
    assert_eq!(t.body["provider"], "khalti");
    assert!(t.body["pidx"].is_string(), "{}", t.body);
    for none in ["form_url", "form_fields", "qr_message", "qr_image"] {
        assert_eq!(t.body[none], Value::Null, "{none}: {}", t.body);
    }
    let url = text(&t.body["payment_url"]);
    assert!(
        url.starts_with(&format!("{}/sim/khalti/pay", shop.app.base)),
        "{url}"
    );
    assert_eq!(app.read(&shop).await.body["status"], "initiated");
    // The app listens while the customer is at Khalti: the stream only
    // reads a redirect provider's payment, so the return is the one that
    // asks Khalti, and the customer lands on "paid" at once.
    let mut events = shop
        .app
        .client
        .get(text(&t.body["events_url"]))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let back = pay_on_wallet(&shop, &app, &url).await;
    assert_paid_page(&shop, &app, &back).await;
    let payment = assert_paid(&shop, &app, "khalti").await;
    let mut buf = String::new();
    let got = read_events(
        &mut events,
        &mut buf,
        std::time::Duration::from_secs(5),
        |e| e.1 == "qr.paid",
    )
    .await;
    assert_eq!(got.last().map(|e| e.1.as_str()), Some("qr.paid"), "{got:?}");
    assert_eq!(text(&t.body["payment_id"]), payment);

    // The merchant's analytics count it as any checkout.
    let a = shop
        .app
        .get("/v1/analytics/overview", Some(&shop.key))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["funnel"]["sessions_created"], 1, "{}", a.body);
    assert_eq!(a.body["funnel"]["sessions_paid"], 1, "{}", a.body);
    assert_eq!(a.body["payments"]["success"], 1, "{}", a.body);

    // The payment is the merchant's like any other: refunded in part.
    let refund = shop
        .app
        .post(
            "/v1/refunds",
            Some(&shop.key),
            Some("refund-A-17"),
            &json!({"paymentId": payment, "amount": 10_000, "reason": "customer_request"}),
        )
        .await;
    assert_eq!(refund.status, 201, "{}", refund.body);

    // A paid session takes no new attempt.
    let late = app.attempt(&shop, "esewa").await;
    late.assert_error(422, "invalid_request_error", "session_closed");
    shop.stop().await;
}

async fn an_app_pays_with_esewa_by_posting_the_signed_form(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    let t = app.attempt(&shop, "esewa").await;
    assert_eq!(t.status, 201, "{}", t.body);
    assert_eq!(t.body["handoff"], "form_post");
    let action = text(&t.body["form_url"]);
    assert_eq!(
        action,
        format!("{}/sim/esewa/api/epay/main/v2/form", shop.app.base)
    );
    let Some(fields) = t.body["form_fields"].as_object() else {
        panic!("no form fields: {}", t.body)
    };
    for must in [
        "amount",
        "total_amount",
        "transaction_uuid",
        "product_code",
        "signed_field_names",
        "signature",
        "success_url",
        "failure_url",
    ] {
        assert!(fields.contains_key(must), "{must} in {fields:?}");
    }
    assert_eq!(t.body["payment_url"], Value::Null);
    // The app's web view posts the fields unchanged.
    let sent: Vec<(String, String)> = fields.iter().map(|(k, v)| (k.clone(), text(v))).collect();
    let at = shop.browser.post_form(&action, &sent).await;
    let wallet = at.redirect(303);
    let back = pay_on_wallet(&shop, &app, &wallet).await;
    assert_paid_page(&shop, &app, &back).await;
    assert_paid(&shop, &app, "esewa").await;
    shop.stop().await;
}

async fn an_app_shows_a_fonepay_qr_and_hears_it_paid(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    shop.app.enable_fonepay(&shop.tenant, Mode::Sandbox).await;
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT, "provider": "fonepay"})).await;
    assert_eq!(app.read(&shop).await.body["providers"], json!(["fonepay"]));
    // The session names Fonepay: nothing else is offered.
    let other = app.attempt(&shop, "khalti").await;
    other.assert_error(422, "invalid_request_error", "provider_unavailable");
    let t = app.attempt(&shop, "fonepay").await;
    assert_eq!(t.status, 201, "{}", t.body);
    assert_eq!(t.body["handoff"], "qr");
    assert!(
        text(&t.body["qr_message"]).starts_with("000201"),
        "{}",
        t.body
    );
    assert!(
        text(&t.body["qr_image"]).starts_with("data:image/png;base64,"),
        "{}",
        t.body
    );
    let payment = text(&t.body["payment_id"]);

    // The app listens; the customer's bank pays the QR.
    let url = text(&t.body["events_url"]);
    let mut res = shop
        .app
        .client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(res.status(), 200);
    let prn = shop.reference(&payment).await;
    let paid = shop
        .app
        .client
        .post(shop.sim(&format!("/fonepay/_control/attempts/{prn}/pay")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(paid.status().is_success(), "{}", paid.status());
    let mut buf = String::new();
    let got = read_events(
        &mut res,
        &mut buf,
        std::time::Duration::from_secs(10),
        |e| e.1 == "qr.paid",
    )
    .await;
    assert_eq!(got.last().map(|e| e.1.as_str()), Some("qr.paid"), "{got:?}");
    assert_eq!(
        got.last().map(|e| e.2["payment_id"].clone()),
        Some(json!(payment))
    );
    assert_paid(&shop, &app, "fonepay").await;
    shop.stop().await;
}

/// Only the session's own secret, with its own project's publishable key,
/// opens it; every wrong answer is the unknown id's 404. A secret key is
/// refused on the app's endpoints, the publishable key everywhere else.
async fn a_session_opens_only_to_its_secret_and_its_projects_key(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    let other = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    assert_eq!(app.read(&shop).await.status, 200);
    let not_found = |a: &Answer, what: &str| {
        a.assert_error(404, "invalid_request_error", "not_found");
        assert!(!a.body.to_string().contains("secret"), "{what}: {}", a.body);
    };
    not_found(&app.read_with(&shop, None).await, "no secret");
    not_found(&app.read_with(&shop, Some("")).await, "empty");
    not_found(
        &app.read_with(&shop, Some(&other.secret)).await,
        "another session's",
    );
    not_found(
        &app.read_with(&shop, Some(&format!("{}x", app.secret)))
            .await,
        "altered",
    );
    let ghost = App {
        key: pk.clone(),
        id: "cs_01jz0000000000000000000000".into(),
        secret: app.secret.clone(),
    };
    not_found(&ghost.read(&shop).await, "unknown id");
    // The wrong secret starts nothing either.
    let wrong = App {
        key: pk.clone(),
        id: app.id.clone(),
        secret: other.secret.clone(),
    };
    not_found(&wrong.attempt(&shop, "khalti").await, "attempt");
    assert_eq!(shop.session(&app.id).await["status"], "pending");

    // Another project's publishable key, and the live one, find nothing.
    let stranger = shop.app.tenant("Other Teas", "owner@other.example").await;
    let their_pk = publishable(&shop.app, &stranger, Mode::Sandbox).await;
    let live_pk = publishable(&shop.app, &shop.tenant, Mode::Live).await;
    for key in [their_pk, live_pk] {
        let as_them = App {
            key,
            id: app.id.clone(),
            secret: app.secret.clone(),
        };
        not_found(&as_them.read(&shop).await, "another project or mode");
    }
    // A secret key is no app's key; a publishable key creates nothing.
    let with_secret_key = App {
        key: shop.key.clone(),
        id: app.id.clone(),
        secret: app.secret.clone(),
    };
    let refused = with_secret_key.read(&shop).await;
    refused.assert_error(403, "permission_error", "permission_denied");
    let created = shop
        .app
        .post(
            "/v1/mobile/sessions",
            Some(&pk),
            None,
            &json!({"amount": AMOUNT}),
        )
        .await;
    created.assert_error(403, "permission_error", "permission_denied");
    // The session's id is public (in its events_url), but our hosted
    // page neither offers nor starts a payment for it: that is the app's.
    let page = shop.browser.get(&format!("/c/{}", app.id)).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.has("Please pay from the app"), "{}", page.show());
    assert!(
        form(&page.body, Some("pay-form")).is_none(),
        "{}",
        page.show()
    );
    let pay = shop
        .browser
        .post_form(
            &format!("/c/{}/pay", app.id),
            &[("provider".to_owned(), "khalti".to_owned())],
        )
        .await;
    assert_eq!(pay.status, 404, "{}", pay.show());
    assert_eq!(shop.session(&app.id).await["status"], "pending");

    // Holding the app's key, no one can take the merchant's
    // Idempotency-Keys: refused before any claim.
    let taken = shop
        .app
        .post(
            "/v1/checkout",
            Some(&pk),
            Some("order-B-9"),
            &json!({"amount": AMOUNT, "returnUrl": "https://shop.example/thanks"}),
        )
        .await;
    taken.assert_error(403, "permission_error", "permission_denied");
    let mine = shop
        .app
        .post(
            "/v1/checkout",
            Some(&shop.key),
            Some("order-B-9"),
            &json!({"amount": AMOUNT, "returnUrl": "https://shop.example/thanks"}),
        )
        .await;
    assert_eq!(mine.status, 201, "{}", mine.body);

    // A hosted session is no mobile session, whatever is sent.
    let hosted = shop.create_checkout(10_000).await;
    let as_hosted = App {
        key: pk.clone(),
        id: text(&hosted["id"]),
        secret: app.secret.clone(),
    };
    not_found(&as_hosted.read(&shop).await, "a hosted session");

    // Bodies are checked: the URLs of a checkout are not a mobile field.
    let bad = create(
        &shop,
        json!({"amount": AMOUNT, "returnUrl": "https://shop.example"}),
        None,
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let bad = app.attempt(&shop, "paypal").await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    // The merchant expires it: the app sees it expired and cannot pay.
    let expired = shop
        .app
        .post(
            &format!("/v1/checkout/{}/expire", app.id),
            Some(&shop.key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(expired.status, 200, "{}", expired.body);
    assert_eq!(app.read(&shop).await.body["status"], "expired");
    let late = app.attempt(&shop, "khalti").await;
    late.assert_error(422, "invalid_request_error", "session_closed");
    shop.stop().await;
}

/// The app's requests count per client address and per session, never
/// against a per-key budget that whoever holds the app could spend.
async fn an_apps_requests_are_limited_per_address_not_per_key(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    // Five reads a minute per address for this test.
    start_early_in_a_minute().await;
    shop.app.state().public_limits().set(5, 60, 120, 600, 10);
    for i in 0..5 {
        let a = app.read(&shop).await;
        assert_eq!(a.status, 200, "read {i}: {}", a.body);
        assert!(
            a.headers.get("x-ratelimit-limit").is_none(),
            "no key budget"
        );
    }
    let over = app.read(&shop).await;
    over.assert_error(429, "rate_limit_error", "rate_limited");
    assert!(
        over.header("retry-after")
            .parse::<u64>()
            .is_ok_and(|s| s >= 1)
    );
    // The merchant's server, on its own key, is not held up.
    let s = shop
        .app
        .get(&format!("/v1/sessions/{}", app.id), Some(&shop.key))
        .await;
    assert_eq!(s.status, 200, "{}", s.body);
    shop.stop().await;
}

/// The limits' windows are whole minutes: a test that counts requests
/// into one starts early in it, so that they all fall into it (on moto
/// they have straddled a minute's end).
async fn start_early_in_a_minute() {
    let second = SystemClock.now().unix_seconds().rem_euclid(60);
    if second > 40 {
        tokio::time::sleep(std::time::Duration::from_secs((61 - second) as u64)).await;
    }
}

/// A session's app budget is apart from its hosted pages' and spent only
/// by callers holding its secret: the id alone, public in `events_url`,
/// cannot use it up for the app, neither with a guessed secret nor by
/// spending the pages' budget (issue 37, 2).
async fn only_the_secret_spends_a_sessions_budget(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    // Three requests a minute per session for its pages, three for its
    // app, for this test.
    start_early_in_a_minute().await;
    shop.app.state().public_limits().set(600, 60, 3, 600, 10);
    shop.app.state().public_limits().set_more(3000, 3, 120, 300);
    for _ in 0..6 {
        let wrong = app.read_with(&shop, Some("cs_secret_guess")).await;
        wrong.assert_error(404, "invalid_request_error", "not_found");
    }
    // A stranger polls the session's status page until it is refused.
    let status = shop.app.url(&format!("/c/{}/status", app.id));
    let mut codes = Vec::new();
    for _ in 0..5 {
        match shop.app.client.get(&status).send().await {
            Ok(r) => codes.push(r.status().as_u16()),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    for i in 0..3 {
        let a = app.read(&shop).await;
        assert_eq!(a.status, 200, "read {i}: {}", a.body);
    }
    let over = app.read(&shop).await;
    over.assert_error(429, "rate_limit_error", "rate_limited");
    shop.stop().await;
}

/// The answer a create keeps for its replays holds the client secret
/// sealed with the credentials master key: the stored item, as the table
/// (or a backup of it) holds it, names the session but not its secret,
/// and a replay still answers the same body, secret included (issue 37,
/// 6).
async fn the_kept_answer_holds_the_client_secret_sealed(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let body = json!({"amount": AMOUNT, "metadata": {"order": "S-1"}});
    let a = create(&shop, body.clone(), Some("order-S-1")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let secret = text(&a.body["client_secret"]);
    let id = text(&a.body["id"]);
    let tenant = shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox);
    let key = shared::domain::idempotency::record_key(&tenant, "order-S-1");
    let item = match shop.app.store.get(&key).await {
        Ok(Some(item)) => item,
        other => panic!("no idempotency record: {other:?}"),
    };
    let raw = Value::Object(item).to_string();
    assert!(raw.contains("completed"), "{raw}");
    assert!(raw.contains(&id), "the answer is kept: {raw}");
    let random = secret.trim_start_matches("cs_secret_");
    assert!(
        !raw.contains(random),
        "the client secret is stored in the clear: {raw}"
    );
    // Nor is it anywhere in the session's own item.
    let session =
        shared::domain::checkout::CheckoutSession::key(&shared::ids::SessionId::stored(id.clone()));
    let session = match shop.app.store.get(&session).await {
        Ok(Some(item)) => Value::Object(item).to_string(),
        other => panic!("no session: {other:?}"),
    };
    assert!(!session.contains(random), "{session}");

    // A replay answers the first answer, secret included, which opens
    // the session.
    let again = create(&shop, body, Some("order-S-1")).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(again.body, a.body);
    let app = App {
        key: pk,
        id,
        secret,
    };
    assert_eq!(app.read(&shop).await.status, 200);
    shop.stop().await;
}

/// `client_secret` in a GET's query ends up in proxy and access logs: it
/// still opens the session, but the answer says the form is deprecated
/// (RFC 9745 `Deprecation`, with a `Link` to the docs); the header and a
/// POST's body are not deprecated (issue 37, 6).
async fn the_client_secret_in_a_query_is_deprecated(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    let path = format!(
        "/v1/mobile/sessions/{}?client_secret={}",
        app.id, app.secret
    );
    let q = shop.app.get(&path, Some(&pk)).await;
    assert_eq!(q.status, 200, "{}", q.body);
    let when = q.header("deprecation");
    assert!(
        when.strip_prefix('@')
            .is_some_and(|s| s.parse::<i64>().is_ok_and(|t| t > 1_700_000_000)),
        "Deprecation: {when:?}"
    );
    let link = q.header("link");
    assert!(
        link.contains(&format!("<{}/docs", shop.app.base)) && link.contains("rel=\"deprecation\""),
        "Link: {link:?}"
    );
    // A wrong secret in the query: the same 404 as ever, also told.
    let wrong = format!("/v1/mobile/sessions/{}?client_secret=cs_secret_x", app.id);
    let w = shop.app.get(&wrong, Some(&pk)).await;
    w.assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(w.header("deprecation"), when);

    let h = app.read(&shop).await;
    assert_eq!(h.status, 200, "{}", h.body);
    assert!(h.headers.get("deprecation").is_none(), "{:?}", h.headers);
    assert!(h.headers.get("link").is_none(), "{:?}", h.headers);
    let b = app.attempt(&shop, "khalti").await;
    assert_eq!(b.status, 201, "{}", b.body);
    assert!(b.headers.get("deprecation").is_none(), "{:?}", b.headers);
    shop.stop().await;
}

/// eSewa's signed form, posted as the app's web view does: the wallet
/// page it leads to.
async fn to_esewa_wallet(shop: &Shop, attempt: &Answer) -> String {
    let action = text(&attempt.body["form_url"]);
    let Some(fields) = attempt.body["form_fields"].as_object() else {
        panic!("no form fields: {}", attempt.body)
    };
    let sent: Vec<(String, String)> = fields.iter().map(|(k, v)| (k.clone(), text(v))).collect();
    shop.browser.post_form(&action, &sent).await.redirect(303)
}

/// A customer who backs out of Khalti pays with eSewa: the session names
/// no provider, so the first attempt's binds nothing; the Khalti attempt
/// is superseded as on the hosted page, and a late Khalti payment neither
/// pays the session again nor replaces its payment: it is flagged as a
/// double payment, as a hosted one is (issue 37, 14).
async fn an_app_backs_out_of_khalti_and_pays_with_esewa(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT})).await;
    let k = app.attempt(&shop, "khalti").await;
    assert_eq!(k.status, 201, "{}", k.body);
    let khalti = text(&k.body["payment_id"]);
    // The customer reaches Khalti's page, then goes back to the app.
    let at_khalti = shop.browser.get(&text(&k.body["payment_url"])).await;
    assert_eq!(at_khalti.status, 200, "{}", at_khalti.show());
    let r = app.read(&shop).await;
    assert_eq!(
        r.body["providers"],
        json!(["esewa", "khalti"]),
        "{}",
        r.body
    );

    let e = app.attempt(&shop, "esewa").await;
    assert_eq!(e.status, 201, "{}", e.body);
    assert_eq!(e.body["provider"], "esewa");
    let esewa = text(&e.body["payment_id"]);
    let superseded = shop.payment(&khalti).await;
    assert_eq!(superseded["status"], "cancelled", "{superseded}");
    assert!(
        text(&superseded["failureReason"]).contains("superseded"),
        "{superseded}"
    );
    let wallet = to_esewa_wallet(&shop, &e).await;
    let back = pay_on_wallet(&shop, &app, &wallet).await;
    assert_paid_page(&shop, &app, &back).await;
    assert_eq!(assert_paid(&shop, &app, "esewa").await, esewa);

    // The old Khalti tab pays after all.
    let Some(f) = form(&at_khalti.body, None) else {
        panic!("no form on Khalti's page: {}", at_khalti.show())
    };
    let mut sent = f.hidden.clone();
    sent.push(("action".into(), "pay".into()));
    let callback = shop.browser.post_form(&f.action, &sent).await.redirect(302);
    assert!(
        callback.contains(&format!("/return/{khalti}/ok")),
        "{callback}"
    );
    let late = shop.browser.get(&callback).await;
    assert_eq!(late.status, 303, "{}", late.show());
    // The session stays paid once, by eSewa; the late payment is kept
    // and flagged for the merchant to refund.
    let r = app.read(&shop).await;
    assert_eq!(r.body["status"], "success", "{}", r.body);
    assert_eq!(r.body["payment"]["id"], esewa.as_str(), "{}", r.body);
    assert_eq!(r.body["payment"]["provider"], "esewa", "{}", r.body);
    let session = shop.session(&app.id).await;
    assert_eq!(session["paymentId"], esewa.as_str(), "{session}");
    assert_eq!(session["provider"], "esewa", "{session}");
    let pk_late = shop.payment(&khalti).await;
    assert_eq!(pk_late["doublePaymentOf"], esewa.as_str(), "{pk_late}");
    assert_eq!(shop.payment(&esewa).await["doublePaymentOf"], Value::Null);
    assert_eq!(shop.events_about("payment.succeeded", &esewa).await, 1);
    assert_eq!(shop.events_about("payment.succeeded", &khalti).await, 1);
    shop.stop().await;
}

/// A provider the merchant named still binds the app, before and after
/// an attempt with it.
async fn a_merchant_fixed_provider_still_binds_the_app(which: Which) {
    let Some((shop, pk)) = open(which).await else {
        return;
    };
    let app = session_for_app(&shop, &pk, json!({"amount": AMOUNT, "provider": "khalti"})).await;
    assert_eq!(app.read(&shop).await.body["providers"], json!(["khalti"]));
    let refused = app.attempt(&shop, "esewa").await;
    refused.assert_error(422, "invalid_request_error", "provider_unavailable");
    assert!(
        text(&refused.body["error"]["message"]).contains("pays with khalti only"),
        "{}",
        refused.body
    );
    let k = app.attempt(&shop, "khalti").await;
    assert_eq!(k.status, 201, "{}", k.body);
    let again = app.attempt(&shop, "esewa").await;
    again.assert_error(422, "invalid_request_error", "provider_unavailable");
    // The Khalti attempt stays open: the refusal superseded nothing.
    let p = shop.payment(&text(&k.body["payment_id"])).await;
    assert_eq!(p["status"], "pending", "{p}");
    shop.stop().await;
}

on_both_backends!(
    the_kept_answer_holds_the_client_secret_sealed,
    the_client_secret_in_a_query_is_deprecated,
    an_app_backs_out_of_khalti_and_pays_with_esewa,
    a_merchant_fixed_provider_still_binds_the_app,
    only_the_secret_spends_a_sessions_budget,
    an_app_pays_with_khalti_holding_only_its_publishable_key,
    an_app_pays_with_esewa_by_posting_the_signed_form,
    an_app_shows_a_fonepay_qr_and_hears_it_paid,
    a_session_opens_only_to_its_secret_and_its_projects_key,
    an_apps_requests_are_limited_per_address_not_per_key,
);
