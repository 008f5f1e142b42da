//! Direct-QR: a shop counter asks for a Fonepay QR, shows it, refreshes
//! it, and the customer's banking app pays it; the payment is proven
//! server to server like every other; the official SDK's `client.qr`
//! works unchanged; a plan without the feature and a final session are
//! refused as the contract says.

use base64::Engine;
use dhukuti_tests::shop::Shop;
use dhukuti_tests::sse::read_events;
use dhukuti_tests::{Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::{self, Plan, Scope};
use shared::time::{Clock, SystemClock};

/// NPR 500: under the sandbox Fonepay cap of NPR 1,000.
const AMOUNT: i64 = 50_000;

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

async fn open(which: Which) -> Option<Shop> {
    let shop = Shop::on(spawn_app(which).await?).await;
    shop.app.enable_fonepay(&shop.tenant, Mode::Sandbox).await;
    Some(shop)
}

async fn create(shop: &Shop, idempotency_key: Option<&str>) -> dhukuti_tests::Answer {
    let body = json!({
        "amount": AMOUNT,
        "currency": "NPR",
        "customer": {"name": "Sita Rai", "email": "sita@example.com", "phone": "9800000001"},
        "metadata": {"counter": "2"},
    });
    shop.app
        .post("/v1/qr/fonepay", Some(&shop.key), idempotency_key, &body)
        .await
}

/// The PNG a `data:` URL carries: its width and height.
fn png_size(data_url: &str) -> (u32, u32) {
    let Some(b64) = data_url.strip_prefix("data:image/png;base64,") else {
        panic!("not a PNG data URL: {data_url:.40}")
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_else(|e| panic!("base64: {e}"));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let at = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    // The IHDR chunk: width and height right after "IHDR".
    (at(16), at(20))
}

async fn a_counter_shows_a_qr_refreshes_it_and_the_customer_pays(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let a = create(&shop, Some("counter-1")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let id = text(&a.body["id"]);
    assert!(id.starts_with("cs_"), "{}", a.body);
    assert_eq!(a.body["livemode"], false);
    let qr = text(&a.body["qr_message"]);
    assert!(qr.starts_with("000201"), "an EMV QR string: {qr}");
    let (w, h) = png_size(&text(&a.body["qr_image"]));
    assert!(w == h && w >= 150, "{w}x{h}");
    let expires_at = text(&a.body["expires_at"]);

    // The same request again answers the same QR (the idempotency layer).
    let again = create(&shop, Some("counter-1")).await;
    assert_eq!(again.body["id"], a.body["id"]);
    assert_eq!(again.body["qr_message"], a.body["qr_message"]);

    // A session of flow `qr` with its Fonepay payment.
    let s = shop.session(&id).await;
    assert_eq!(s["flow"], "qr", "{s}");
    assert_eq!(s["provider"], "fonepay", "{s}");
    assert_eq!(s["status"], "initiated", "{s}");
    let first = text(&s["paymentId"]);

    // A refresh: the same session, a new QR, the lifetime unchanged.
    let r = refresh(&shop, &id).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["id"], a.body["id"]);
    assert_eq!(text(&r.body["expires_at"]), expires_at);
    assert_ne!(r.body["qr_message"], a.body["qr_message"], "a fresh QR");
    let s = shop.session(&id).await;
    let second = text(&s["paymentId"]);
    assert_ne!(first, second);
    assert_eq!(shop.payment(&first).await["status"], "cancelled");

    // The customer's banking app pays the fresh QR; the sweep proves it
    // with Fonepay, server to server.
    pay_at_fonepay(&shop, &second, "pay").await;
    shop.app
        .sweep(SystemClock.now().plus(chrono::Duration::minutes(2)))
        .await;
    assert_eq!(shop.payment(&second).await["status"], "success");
    assert_eq!(shop.session(&id).await["status"], "success");
    assert_eq!(shop.events_about("payment.succeeded", &second).await, 1);

    // A final session gets no new QR.
    let r = refresh(&shop, &id).await;
    r.assert_error(422, "invalid_request_error", "session_closed");
    shop.stop().await;
}

async fn direct_qr_is_a_plan_feature_and_refuses_what_it_cannot_do(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    // A hosted session is not a Direct-QR session: 404, as for any id.
    let hosted = shop.create_checkout(10_000).await;
    let r = refresh(&shop, &text(&hosted["id"])).await;
    r.assert_error(404, "invalid_request_error", "not_found");
    // Over the sandbox Fonepay cap of NPR 1,000 a payment.
    let over = shop
        .app
        .post(
            "/v1/qr/fonepay",
            Some(&shop.key),
            None,
            &json!({"amount": 100_001}),
        )
        .await;
    over.assert_error(422, "invalid_request_error", "fonepay_sandbox_cap");
    // Fields are checked.
    let bad = shop
        .app
        .post(
            "/v1/qr/fonepay",
            Some(&shop.key),
            None,
            &json!({"amount": 1000, "returnUrl": "https://x.example"}),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    // The Free plan has no Direct-QR: 403 naming the entitlement.
    let free = shop.app.tenant("Free Teas", "owner@free.example").await;
    if let Err(e) = account::set_plan(&*shop.app.store, &free.merchant.id, Plan::Free).await {
        panic!("set_plan: {e}")
    }
    shop.app.enable_fonepay(&free, Mode::Sandbox).await;
    let key = shop.app.key(&free, Mode::Sandbox, &Scope::ALL).await;
    let r = shop
        .app
        .post("/v1/qr/fonepay", Some(&key), None, &json!({"amount": 1000}))
        .await;
    r.assert_error(403, "permission_error", "permission_denied");
    assert_eq!(r.body["error"]["entitlement"], "fonepay.directQr");
    let account = shop.app.get("/v1/account", Some(&key)).await;
    assert_eq!(account.body["entitlements"]["fonepay_direct_qr"], false);
    let account = shop.app.get("/v1/account", Some(&shop.key)).await;
    assert_eq!(account.body["entitlements"]["fonepay_direct_qr"], true);
    shop.stop().await;
}

/// The official SDK's `client.qr.fonepay(...)` and `client.qr.refresh(...)`,
/// unchanged.
async fn the_official_sdk_makes_and_refreshes_a_qr(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(shop) = open(which).await else {
        return;
    };
    let script = r#"
import sys
from paybridge_np import PayBridgeNP
client = PayBridgeNP(sys.argv[2], base_url=sys.argv[1])
qr = client.qr.fonepay({"amount": 25000, "customer": {"name": "Hari", "email": "hari@example.com"}})
assert qr["id"].startswith("cs_") and qr["qr_message"] and qr["qr_image"].startswith("data:image/png;base64,"), qr
fresh = client.qr.refresh(qr["id"])
assert fresh["id"] == qr["id"] and fresh["qr_message"] != qr["qr_message"], fresh
print("sdk qr ok")
"#;
    let out = tokio::process::Command::new(&python)
        .args(["-c", script, &shop.app.base, &shop.key])
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(std::time::Duration::from_secs(60), out).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("the SDK took over 60 s"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("sdk qr ok"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    shop.stop().await;
}

/// Deployed, the stream is the events function behind a function URL
/// with response streaming: through its Lambda handler (lambda_http's
/// streaming adapter, fed a real function URL event) the first bytes
/// leave before anything happened, and `qr.paid` leaves within two
/// seconds of the payment, while the invocation is still open, not when
/// it ends.
async fn the_events_function_streams_each_event_as_it_happens(which: Which) {
    use futures::StreamExt;
    use lambda_http::lambda_runtime::{Context, LambdaEvent};
    use lambda_http::request::LambdaRequest;
    use lambda_http::{Service, StreamAdapter};

    let Some(shop) = open(which).await else {
        return;
    };
    let secs = std::time::Duration::from_secs;
    let a = create(&shop, None).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let id = text(&a.body["id"]);
    let payment = text(&shop.session(&id).await["paymentId"]);
    let path = format!("{}/events/events-stream.json", env!("CARGO_MANIFEST_DIR"));
    let event = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .replace("__SESSION_ID__", &id);
    let request: LambdaRequest =
        serde_json::from_str(&event).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut handler = StreamAdapter::from(events::router(shop.app.state().clone()));
    let response = handler
        .call(LambdaEvent::new(request, Context::default()))
        .await
        .unwrap_or_else(|e| panic!("handler: {e:?}"));
    let prelude = &response.metadata_prelude;
    assert_eq!(prelude.status_code, 200);
    assert_eq!(prelude.headers["content-type"], "text/event-stream");
    assert_eq!(prelude.headers["cache-control"], "no-store");
    let mut body = response.stream;
    // Bytes before any event: the answer is streamed, not buffered.
    let first = tokio::time::timeout(secs(3), body.next()).await;
    let first = match first {
        Ok(Some(Ok(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
        other => panic!("no first chunk: {other:?}"),
    };
    assert!(first.contains(": connected"), "{first}");

    pay_at_fonepay(&shop, &payment, "pay").await;
    let paid_at = tokio::time::Instant::now();
    let mut seen = String::new();
    while !seen.contains("event: qr.paid") {
        match tokio::time::timeout(secs(3), body.next()).await {
            Ok(Some(Ok(bytes))) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("the stream ended or stalled before qr.paid: {other:?} after {seen}"),
        }
    }
    let took = paid_at.elapsed();
    assert!(took < secs(2), "qr.paid after {took:?}");
    assert!(seen.contains(&format!("id: {payment}:paid")), "{seen}");
    // Then the invocation ends.
    let end = tokio::time::timeout(secs(5), body.next()).await;
    assert!(matches!(end, Ok(None)), "the stream ends");
    shop.stop().await;
}

on_both_backends!(
    a_counter_shows_a_qr_refreshes_it_and_the_customer_pays,
    direct_qr_is_a_plan_feature_and_refuses_what_it_cannot_do,
    the_official_sdk_makes_and_refreshes_a_qr,
    the_event_stream_tells_the_screen_and_resumes_without_loss,
    the_events_function_streams_each_event_as_it_happens,
    one_merchants_screens_cannot_take_every_stream,
);

async fn refresh(shop: &Shop, id: &str) -> dhukuti_tests::Answer {
    shop.app
        .post(
            &format!("/v1/qr/{id}/refresh"),
            Some(&shop.key),
            None,
            &json!({}),
        )
        .await
}

async fn pay_at_fonepay(shop: &Shop, payment: &str, action: &str) {
    let prn = shop.reference(payment).await;
    let res = shop
        .app
        .client
        .post(shop.sim(&format!("/fonepay/_control/attempts/{prn}/{action}")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(res.status().is_success(), "{}", res.status());
}

async fn stream(shop: &Shop, url: &str, last_id: Option<&str>) -> reqwest::Response {
    let mut req = shop.app.client.get(url);
    if let Some(id) = last_id {
        req = req.header("last-event-id", id);
    }
    req.send().await.unwrap_or_else(|e| panic!("{e}"))
}

/// The customer's screen: the stream says `qr.failed` when the bank
/// declines and ends; after a dropped connection it still delivers
/// `qr.paid` (within two seconds of the payment, after the
/// server-to-server check) and ends; a screen that saw the final event
/// is told to stop (204), not sent it again.
async fn the_event_stream_tells_the_screen_and_resumes_without_loss(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let secs = std::time::Duration::from_secs;
    // The bank declines: qr.failed, final for a Direct-QR session.
    let a = create(&shop, None).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let id = text(&a.body["id"]);
    let url = text(&a.body["events_url"]);
    assert_eq!(url, format!("{}/c/{id}/events", shop.app.base));
    let mut res = stream(&shop, &url, None).await;
    assert_eq!(res.status(), 200);
    let ct = res.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let first = text(&shop.session(&id).await["paymentId"]);
    pay_at_fonepay(&shop, &first, "fail").await;
    let mut buf = String::new();
    let got = read_events(&mut res, &mut buf, secs(10), |e| e.1 == "qr.failed").await;
    let kinds: Vec<&str> = got.iter().map(|e| e.1.as_str()).collect();
    // (The bank's app scanned before declining: a scan may come first.)
    assert!(
        matches!(
            kinds.as_slice(),
            ["qr.failed"] | ["qr.scanned", "qr.failed"]
        ),
        "{got:?}"
    );
    let failed = &got[got.len() - 1];
    assert_eq!(failed.2["payment_id"], first.as_str());
    let end = tokio::time::timeout(secs(5), res.chunk()).await;
    assert!(matches!(end, Ok(Ok(None))), "the stream ends: {end:?}");
    let r = refresh(&shop, &id).await;
    r.assert_error(422, "invalid_request_error", "session_closed");

    // A new QR: the customer scans it (Fonepay's websocket says so, and
    // the screen hears it), then the screen loses the connection.
    let b = create(&shop, None).await;
    let id = text(&b.body["id"]);
    let url = text(&b.body["events_url"]);
    let payment = text(&shop.session(&id).await["paymentId"]);
    let mut res = stream(&shop, &url, None).await;
    let scanned_at = std::time::Instant::now();
    pay_at_fonepay(&shop, &payment, "scan").await;
    let mut buf = String::new();
    let got = read_events(&mut res, &mut buf, secs(10), |e| e.1 == "qr.scanned").await;
    let took = scanned_at.elapsed();
    let kinds: Vec<&str> = got.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(kinds, ["qr.scanned"], "{got:?}");
    assert_eq!(got[0].0, format!("{payment}:scanned"));
    assert!(took < secs(2), "qr.scanned after {took:?}");
    // A scan is a hint: nothing is paid.
    assert_eq!(shop.payment(&payment).await["status"], "pending");
    drop(res);
    let mut res = stream(&shop, &url, Some(&got[0].0)).await;
    let paid_at = std::time::Instant::now();
    pay_at_fonepay(&shop, &payment, "pay").await;
    let mut buf = String::new();
    let got = read_events(&mut res, &mut buf, secs(10), |e| e.1 == "qr.paid").await;
    let took = paid_at.elapsed();
    let kinds: Vec<&str> = got.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(kinds, ["qr.paid"], "{got:?}");
    assert_eq!(got[0].2["payment_id"], payment.as_str());
    assert!(took < secs(2), "qr.paid after {took:?}");
    // Proven server to server: the payment is paid in the API.
    assert_eq!(shop.payment(&payment).await["status"], "success");
    let end = tokio::time::timeout(secs(5), res.chunk()).await;
    assert!(matches!(end, Ok(Ok(None))), "the stream ends: {end:?}");
    // Coming back without the last id: every event again, in order (no
    // loss); with the final one's id: 204, nothing repeated.
    let mut again = stream(&shop, &url, None).await;
    let mut buf = String::new();
    let got = read_events(&mut again, &mut buf, secs(5), |e| e.1 == "qr.paid").await;
    let kinds: Vec<&str> = got.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(kinds, ["qr.scanned", "qr.paid"], "{got:?}");
    let seen = stream(&shop, &url, Some(&got[1].0)).await;
    assert_eq!(seen.status(), 204);

    // A hosted session has no stream; an unknown id neither.
    let hosted = shop.create_checkout(10_000).await;
    let res = shop
        .app
        .client
        .get(format!(
            "{}/c/{}/events",
            shop.app.base,
            text(&hosted["id"])
        ))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(res.status(), 404);
    shop.stop().await;
}

/// A QR of NPR 100 for `key` (under the sandbox Fonepay caps).
async fn small_qr(shop: &Shop, key: &str) -> (String, String) {
    let body = json!({"amount": 10_000, "currency": "NPR"});
    let a = shop
        .app
        .post("/v1/qr/fonepay", Some(key), None, &body)
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    (text(&a.body["id"]), text(&a.body["events_url"]))
}

/// Issue 37, item 4: one client holding every stream a merchant's
/// project may (its sessions' ids are all it needs) is refused the next
/// with 429 and where to poll instead; another merchant's screen still
/// streams; a stream that ends (its QR paid) gives its slot back.
async fn one_merchants_screens_cannot_take_every_stream(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let secs = std::time::Duration::from_secs;
    shop.app.state().public_limits().set_project_streams(2);
    let other = shop.app.tenant("Bhat Bhateni", "owner@bhat.example").await;
    shop.app.enable_fonepay(&other, Mode::Sandbox).await;
    let other_key = shop.app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let mut ours = Vec::new();
    for _ in 0..3 {
        ours.push(small_qr(&shop, &shop.key).await);
    }
    // The flood: the project's two streams, held from one client.
    let mut held = Vec::new();
    for (_, url) in &ours[..2] {
        let res = stream(&shop, url, None).await;
        assert_eq!(res.status(), 200);
        held.push(res);
    }
    let tenant = shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox);
    let count = async || {
        shared::domain::streams::held(shop.app.state(), &tenant)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(count().await, 2);
    let (third, url) = &ours[2];
    let refused = stream(&shop, url, None).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap_or_else(|e| panic!("{e}"));
    let poll = text(&body["status_url"]);
    assert_eq!(poll, format!("/c/{third}/status"), "{body}");
    // The refused screen polls instead, and is answered.
    let polled = shop.app.get(&poll, None).await;
    assert_eq!(polled.status, 200, "{}", polled.body);
    // Another merchant's screen is not starved.
    let (_, theirs) = small_qr(&shop, &other_key).await;
    let mut res = stream(&shop, &theirs, None).await;
    assert_eq!(res.status(), 200, "another merchant's screen");
    let first = tokio::time::timeout(secs(5), res.chunk()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    // The first QR is paid: its stream ends at once and its slot is free.
    let payment = text(&shop.session(&ours[0].0).await["paymentId"]);
    pay_at_fonepay(&shop, &payment, "pay").await;
    let mut buf = String::new();
    let got = read_events(&mut held[0], &mut buf, secs(10), |e| e.1 == "qr.paid").await;
    assert_eq!(got.last().map(|e| e.1.as_str()), Some("qr.paid"), "{got:?}");
    let end = tokio::time::timeout(secs(5), held[0].chunk()).await;
    assert!(matches!(end, Ok(Ok(None))), "the stream ends: {end:?}");
    let freed = std::time::Instant::now();
    while count().await > 1 {
        assert!(freed.elapsed() < secs(5), "the slot is given back");
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let res = stream(&shop, url, None).await;
    assert_eq!(res.status(), 200, "the freed slot");
    shop.stop().await;
}
