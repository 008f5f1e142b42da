//! The hosted demo of Direct-QR in a real browser: the demo merchant's
//! counter (`/demo/counter`) asks for a QR through the API, shows it, and
//! flips to "Paid" from the event stream once the simulator's customer
//! pays and the gateway has proven it with Fonepay.

use std::time::Duration;

use crate::browser::{Driver, WAIT, element, locate_browser, type_into, within};
use dhukuti_tests::{TestApp, Which, spawn_app};
use fantoccini::Client;
use serde_json::Value;

const WHOLE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_shows_a_qr_and_flips_to_paid_in_a_real_browser() {
    let Some((chromium, chromedriver)) = locate_browser() else {
        return;
    };
    let Some(app) = spawn_app(Which::Embedded).await else {
        panic!("the embedded gateway is never skipped");
    };
    let driver = Driver::start(&chromedriver);
    let client = driver.connect(&chromium).await;
    let run = tokio::time::timeout(WHOLE, sell_at_the_counter(&client, &app))
        .await
        .unwrap_or_else(|_| Err(format!("the browser part took longer than {WHOLE:?}")));
    let report = match &run {
        Ok(()) => None,
        Err(_) => Some(driver.report(&client, "counter").await),
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
    drop(driver);
    app.stop().await;
    if let Err(e) = run {
        panic!("{e}\n{}", report.unwrap_or_default());
    }
}

async fn sell_at_the_counter(c: &Client, app: &TestApp) -> Result<(), String> {
    within("open /demo/counter", c.goto(&app.url("/demo/counter"))).await?;
    type_into(c, "#amount", "250").await?;
    let button = element(c, "#ask button[type=submit]").await?;
    within("press Show QR", button.click()).await?;
    // The QR appears, a PNG from the API.
    let img = element(c, "#qr:not([hidden]) img[src^='data:image/png;base64,']").await?;
    let src = within("read the QR", img.attr("src"))
        .await?
        .unwrap_or_default();
    if src.len() < 200 {
        return Err(format!("a QR image of {} bytes", src.len()));
    }
    let qr_box = element(c, "#qr").await?;
    let session = within("read the session", qr_box.attr("data-session"))
        .await?
        .ok_or("no session on the page")?;
    // The customer's banking app pays the QR at the simulator.
    let key = match &app.running {
        Some(r) => r.keys.sandbox.clone(),
        None => return Err("the gateway stopped".into()),
    };
    let s: Value = app
        .client
        .get(app.url(&format!("/v1/sessions/{session}")))
        .bearer_auth(&key)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let payment = s["paymentId"].as_str().ok_or(format!("no payment: {s}"))?;
    let stored = app
        .store
        .get(&shared::domain::payments::Payment::key(&payment.into()))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("payment not stored")?;
    let p: shared::domain::payments::Payment =
        shared::domain::record::from_item(stored).map_err(|e| e.to_string())?;
    let prn = p.attempt.reference.ok_or("no PRN")?;
    let paid = app
        .client
        .post(app.url(&format!("/sim/fonepay/_control/attempts/{prn}/pay")))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !paid.status().is_success() {
        return Err(format!("simulator pay: {}", paid.status()));
    }
    // The screen flips to "Paid" from the event stream.
    let done = c
        .wait()
        .at_most(WAIT)
        .every(Duration::from_millis(100))
        .for_element(fantoccini::Locator::Css("#state.paid"));
    let state = tokio::time::timeout(WAIT + Duration::from_secs(5), done)
        .await
        .map_err(|_| "the page never said Paid".to_owned())?
        .map_err(|e| format!("the page never said Paid: {e}"))?;
    let text = within("read the state", state.text()).await?;
    if text != "Paid" {
        return Err(format!("the page says {text:?}"));
    }
    Ok(())
}
