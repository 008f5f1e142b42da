//! The hosted pages' Content-Security-Policy (issue 37, item 10): no
//! `'unsafe-inline'` for scripts or styles. Every inline `<script>` and
//! `<style>` a page carries is allowed by its SHA-256 hash in the policy,
//! and nothing else inline (no event-handler or `style` attribute) is on
//! the page: so the pages still work, and markup injected into one could
//! not run.
//!
//! Over HTTP on both backends: the picker, the eSewa hand-off, the Fonepay
//! QR page, a payment link's page, a page for an unknown session and a
//! wrong method's page. In a real Chromium: the checkout page, a link page
//! and the QR page (whose poll runs) show no CSP refusal in the browser's
//! console, and a script injected into the page is refused (so the check
//! can see a refusal at all).

use std::time::Duration;

use crate::browser::{Driver, WAIT, element, locate_browser, within};
use crate::docs_page::BrowserLog;
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app};
use fantoccini::Client;
use serde_json::json;
use shared::domain::Mode;
use shared::domain::account::Scope;

/// `'sha256-…'` of `text`.
fn hash_source(text: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The sources of `directive` in `csp`.
fn sources<'a>(csp: &'a str, directive: &str) -> Vec<&'a str> {
    csp.split(';')
        .map(str::trim)
        .find_map(|d| {
            let mut words = d.split_whitespace();
            (words.next() == Some(directive)).then(|| words.collect())
        })
        .unwrap_or_default()
}

/// The texts of every `<tag>…</tag>` in `body`.
fn inline(body: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    body.match_indices(&open)
        .filter_map(|(at, _)| {
            let rest = &body[at + open.len()..];
            rest.find(&close).map(|end| rest[..end].to_owned())
        })
        .collect()
}

/// One HTML answer of a hosted route holds to the rule.
fn assert_held(what: &str, csp: &str, body: &str) {
    assert!(!csp.is_empty(), "{what}: no Content-Security-Policy");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{what}: {csp}"
    );
    let scripts = sources(csp, "script-src");
    for s in inline(body, "script") {
        assert!(
            scripts.contains(&hash_source(&s).as_str()),
            "{what}: script not allowed by hash: {s}\n{csp}"
        );
    }
    let styles = sources(csp, "style-src");
    let css = inline(body, "style");
    assert!(!css.is_empty(), "{what}: the page lost its style");
    for s in css {
        assert!(
            styles.contains(&hash_source(&s).as_str()),
            "{what}: style not allowed by hash\n{csp}"
        );
    }
    let lower = body.to_ascii_lowercase();
    for attr in [" onsubmit=", " onclick=", " onload=", " style="] {
        assert!(!lower.contains(attr), "{what}: inline {attr} on the page");
    }
}

/// A browser's request to `path` on the hosted routes: status, policy,
/// `Location` and body.
async fn browse(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    form: Option<&[(&str, &str)]>,
) -> (u16, String, Option<String>, String) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    let mut req = client
        .request(method, app.url(path))
        .header("accept", "text/html");
    if let Some(f) = form {
        let pairs: Vec<(String, String)> = f
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let body = dhukuti_tests::browser::form_encode(&pairs);
        req = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
    }
    let res = match req.send().await {
        Ok(r) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, csp, location) = (
        res.status().as_u16(),
        header("content-security-policy").unwrap_or_default(),
        header("location"),
    );
    (status, csp, location, res.text().await.unwrap_or_default())
}

/// The start of a page, for a failure's message.
fn short(body: &str) -> String {
    body.chars().take(600).collect()
}

/// A sandbox merchant with Fonepay: the app, its key.
async fn shop(which: Which) -> Option<(TestApp, String)> {
    let app = spawn_app(which).await?;
    let t = app
        .tenant("Bhaktapur Pottery", "clay@bhaktapur.example")
        .await;
    app.enable_fonepay(&t, Mode::Sandbox).await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    Some((app, key))
}

async fn session(app: &TestApp, key: &str) -> String {
    let a = app
        .post(
            "/v1/checkout",
            Some(key),
            None,
            &json!({"amount": 50_000, "returnUrl": "https://shop.example/thanks"}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["id"].as_str().unwrap_or_default().to_owned()
}

async fn link(app: &TestApp, key: &str) -> String {
    let a = app
        .post(
            "/v1/payment-links",
            Some(key),
            None,
            &json!({"title": "Clay pot", "minAmount": 50_000, "maxAmount": 90_000}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["id"].as_str().unwrap_or_default().to_owned()
}

async fn no_hosted_page_allows_inline_code_but_its_own(which: Which) {
    use reqwest::Method;
    let Some((app, key)) = shop(which).await else {
        return;
    };
    let s = session(&app, &key).await;
    let (status, csp, _, body) = browse(&app, Method::GET, &format!("/c/{s}"), None).await;
    assert_eq!(status, 200, "{}", short(&body));
    assert_held("the picker", &csp, &body);

    let paid = [("provider", "esewa")];
    let (status, csp, _, body) =
        browse(&app, Method::POST, &format!("/c/{s}/pay"), Some(&paid)).await;
    assert_eq!(status, 200, "{}", short(&body));
    assert!(body.contains("id=handoff"), "{}", short(&body));
    assert_held("the eSewa hand-off", &csp, &body);

    let q = session(&app, &key).await;
    let fonepay = [("provider", "fonepay")];
    let (status, _, location, body) =
        browse(&app, Method::POST, &format!("/c/{q}/pay"), Some(&fonepay)).await;
    assert_eq!(status, 303, "{}", short(&body));
    let qr = location.unwrap_or_default();
    let path = qr.trim_start_matches(&app.base).to_owned();
    let (status, csp, _, body) = browse(&app, Method::GET, &path, None).await;
    assert_eq!(status, 200, "{}", short(&body));
    assert!(
        body.contains("<svg") && body.contains("data-status="),
        "{}",
        short(&body)
    );
    assert_held("the QR page", &csp, &body);

    let l = link(&app, &key).await;
    let (status, csp, _, body) = browse(&app, Method::GET, &format!("/l/{l}"), None).await;
    assert_eq!(status, 200, "{}", short(&body));
    assert_held("a link's page", &csp, &body);

    let unknown = "/c/cs_0000000000000000000000";
    let (status, csp, _, body) = browse(&app, Method::GET, unknown, None).await;
    assert!((400..500).contains(&status), "{status} {body}");
    assert_held("an unknown session's page", &csp, &body);
    let (status, csp, _, body) = browse(&app, Method::PUT, &format!("/c/{s}"), None).await;
    assert_eq!(status, 405, "{}", short(&body));
    assert_held("a wrong method's page", &csp, &body);
    app.stop().await;
}

on_both_backends!(no_hosted_page_allows_inline_code_but_its_own);

/// The CSP refusals in the browser's console since it was last read.
async fn refusals(c: &Client) -> Result<Vec<String>, String> {
    let log = within("read the browser's console", c.issue_cmd(BrowserLog)).await?;
    let entries = log
        .as_array()
        .or_else(|| log["value"].as_array())
        .cloned()
        .unwrap_or_default();
    Ok(entries
        .iter()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.contains("Content Security Policy") || m.contains("Refused to"))
        .map(str::to_owned)
        .collect())
}

/// Opens `url`, waits for `css`, lets the page's scripts run and returns
/// the refusals the console shows.
async fn visit(c: &Client, url: &str, css: &str, settle: Duration) -> Result<Vec<String>, String> {
    within(&format!("open {url}"), c.goto(url)).await?;
    element(c, css).await?;
    tokio::time::sleep(settle).await;
    refusals(c).await
}

async fn pages_run_in_chromium(c: &Client, app: &TestApp, key: &str) -> Result<(), String> {
    let s = session(app, key).await;
    let seen = visit(c, &app.url(&format!("/c/{s}")), "#pay-form", Duration::ZERO).await?;
    if !seen.is_empty() {
        return Err(format!("the checkout page: {seen:#?}"));
    }
    let l = link(app, key).await;
    let seen = visit(
        c,
        &app.url(&format!("/l/{l}")),
        "#link-form",
        Duration::ZERO,
    )
    .await?;
    if !seen.is_empty() {
        return Err(format!("the link page: {seen:#?}"));
    }
    // The QR page: its poll asks `status` after 2 s.
    within(
        "choose fonepay",
        element(c, "#link-amount").await?.send_keys("600"),
    )
    .await?;
    within("continue", element(c, "#link-continue").await?.click()).await?;
    within(
        "choose fonepay",
        element(c, "#provider-fonepay").await?.click(),
    )
    .await?;
    within("pay", element(c, "#pay-button").await?.click()).await?;
    element(c, "#qr svg").await?;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let polled = within(
        "read the page's requests",
        c.execute(
            "return performance.getEntriesByType('resource').map(function(e){return e.name})\
             .filter(function(n){return n.indexOf('/status')>0}).length;",
            vec![],
        ),
    )
    .await?;
    let seen = refusals(c).await?;
    if !seen.is_empty() {
        return Err(format!("the QR page: {seen:#?}"));
    }
    if polled.as_u64().unwrap_or(0) == 0 {
        return Err("the QR page's poll did not run".into());
    }
    // The check can see a refusal: a script put into the page is refused.
    let injected = "var s=document.createElement('script');\
         s.textContent='document.title=\"injected\"';document.body.appendChild(s);return 1;";
    within("inject a script", c.execute(injected, vec![])).await?;
    let seen = refusals(c).await?;
    let title = within("read the title", c.title()).await?;
    if seen.is_empty() || title == "injected" {
        return Err(format!(
            "an injected script ran or was not reported: {title} {seen:#?}"
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosted_pages_run_in_chromium_without_a_csp_refusal() {
    let Some((chromium, chromedriver)) = locate_browser() else {
        return;
    };
    let Some((app, key)) = shop(Which::Embedded).await else {
        panic!("the embedded gateway is never skipped");
    };
    let driver = Driver::start(&chromedriver);
    let c = driver.connect(&chromium).await;
    let run = tokio::time::timeout(
        Duration::from_secs(90),
        pages_run_in_chromium(&c, &app, &key),
    )
    .await
    .unwrap_or_else(|_| Err("the browser part took longer than 90 s".into()));
    let report = match &run {
        Ok(()) => String::new(),
        Err(_) => driver.report(&c, "page-policy").await,
    };
    let _ = tokio::time::timeout(WAIT, c.close()).await;
    drop(driver);
    app.stop().await;
    if let Err(e) = run {
        panic!("{e}\n{report}");
    }
}
