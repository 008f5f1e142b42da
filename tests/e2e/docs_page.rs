//! The API reference in a real browser: headless Chromium opens the
//! gateway's `/docs`, Swagger UI (served from the gateway's own
//! `/docs/assets/`) fetches and renders `/openapi.json`, and the
//! operations for `POST /v1/checkout` and `GET /v1/payments/{id}` are on
//! the page. Then what the page fetched: every URL in its Resource Timing
//! entries is on a loopback host (no CDN, no Swagger validator), and the
//! browser's console shows no Content-Security-Policy refusal (nothing was
//! even attempted elsewhere, no script blocked).
//!
//! Gated like `browser`: with `DHUKUTI_CHROMIUM` set (`infra/test.sh` sets
//! it) a browser that does not start fails the test; without it and
//! without Chromium on PATH, the test says so loudly and passes. Chromium
//! runs under Debian's chromedriver on 127.0.0.1, both in their own process
//! group, killed when the test ends however it ends; every wait is bounded.
//!
//! The chromedriver plumbing repeats a small part of `browser.rs`, whose
//! helpers are private to that module.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::browser::{Driver, WAIT, locate_browser, within};
use dhukuti_tests::{TestApp, Which, spawn_app};
use fantoccini::Client;
use fantoccini::wd::WebDriverCompatibleCommand;
use serde_json::{Value, json};

/// The longest the whole browser part may take.
const WHOLE: Duration = Duration::from_secs(90);

/// The operations the reference must show, as (method, path).
const WANTED: [(&str, &str); 2] = [("POST", "/v1/checkout"), ("GET", "/v1/payments/{id}")];

/// The files the page must have fetched, all from the gateway.
const FETCHED: [&str; 4] = [
    "/docs/assets/swagger-ui.css",
    "/docs/assets/swagger-ui-bundle.js",
    "/docs/assets/init.js",
    "/openapi.json",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reference_renders_offline_in_a_real_browser() {
    let Some((chromium, chromedriver)) = locate_browser() else {
        return;
    };
    let Some(app) = spawn_app(Which::Embedded).await else {
        panic!("the embedded gateway is never skipped");
    };
    served_over_http(&app).await;

    let started = Instant::now();
    let driver = Driver::start(&chromedriver);
    let client = driver.connect(&chromium).await;
    let run = tokio::time::timeout(WHOLE, read_the_reference(&client, &app))
        .await
        .unwrap_or_else(|_| Err(format!("the browser part took longer than {WHOLE:?}")));
    let report = match &run {
        Ok(_) => None,
        Err(_) => Some(driver.report(&client, "docs-page").await),
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
    drop(driver);
    app.stop().await;
    match run {
        Ok(seen) => eprintln!(
            "docs page: {seen} operations rendered, every fetch on loopback, in {:?}",
            started.elapsed()
        ),
        Err(e) => panic!("{e}\n{}", report.unwrap_or_default()),
    }
}

/// Before the browser, plain HTTP: the page, its files and the document
/// answer, the document lists the wanted operations (so a failure below
/// is the page's, not the document's).
async fn served_over_http(app: &TestApp) {
    let page = match app.client.get(app.url("/docs")).send().await {
        Ok(r) => r,
        Err(e) => panic!("GET /docs: {e}"),
    };
    assert_eq!(page.status().as_u16(), 200, "GET /docs");
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    assert!(
        header(&page, "content-type").starts_with("text/html"),
        "GET /docs: {:?}",
        page.headers()
    );
    let csp = header(&page, "content-security-policy");
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"),
        "GET /docs: content-security-policy {csp:?}"
    );
    for path in FETCHED {
        let a = app.get(path, None).await;
        assert_eq!(a.status, 200, "GET {path}");
    }
    let doc = app.get("/openapi.json", None).await;
    assert!(
        doc.header("content-type").starts_with("application/json"),
        "GET /openapi.json: {:?}",
        doc.headers
    );
    assert_eq!(doc.header("access-control-allow-origin"), "*");
    for (method, path) in WANTED {
        assert!(
            doc.body["paths"][path][method.to_lowercase()].is_object(),
            "/openapi.json has no {method} {path}; its paths: {:?}",
            doc.body["paths"]
                .as_object()
                .map(|p| p.keys().collect::<Vec<_>>())
        );
    }
}

/// Opens `/docs`, waits for Swagger UI's operations, finds the wanted ones
/// and checks what the page fetched; how many operations it rendered.
async fn read_the_reference(c: &Client, app: &TestApp) -> Result<usize, String> {
    within("open /docs", c.goto(&app.url("/docs"))).await?;

    // Swagger UI fetches the document, then renders one `.opblock` per
    // operation (collapsed, under expanded tags: its default).
    let deadline = Instant::now() + WAIT;
    let operations = loop {
        let found = operations(c).await?;
        let missing: Vec<_> = WANTED
            .iter()
            .filter(|(m, p)| !found.iter().any(|(fm, fp)| fm == m && fp == p))
            .collect();
        if missing.is_empty() {
            break found;
        }
        if Instant::now() >= deadline {
            let shown = within(
                "read what Swagger UI shows",
                c.execute("return document.body.innerText.slice(0, 2000);", vec![]),
            )
            .await
            .unwrap_or_default();
            return Err(format!(
                "after {WAIT:?} the page shows no operation for {missing:?}; \
                 operations rendered: {found:?}; the page says: {shown}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Every URL the page fetched (itself included) is on the gateway's
    // loopback origin, and the files above are among them.
    let fetched = within(
        "read the page's Resource Timing entries",
        c.execute(
            "return performance.getEntriesByType('navigation')\
               .concat(performance.getEntriesByType('resource'))\
               .map(function (e) { return e.name; });",
            vec![],
        ),
    )
    .await?;
    let fetched: Vec<String> = fetched
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let elsewhere: Vec<&String> = fetched.iter().filter(|u| !on_loopback(u)).collect();
    if !elsewhere.is_empty() {
        return Err(format!(
            "the page fetched from other hosts: {elsewhere:?} (all: {fetched:?})"
        ));
    }
    for path in FETCHED {
        let want = app.url(path);
        if !fetched.contains(&want) {
            return Err(format!(
                "the page's Resource Timing lacks {want}, so it cannot vouch \
                 for what else was fetched: {fetched:?}"
            ));
        }
    }

    // Nothing was refused by the page's policy: no request to another
    // host attempted, no script or style blocked. Through chromedriver's
    // log endpoint; a driver without it cannot tell, and that is said.
    match tokio::time::timeout(WAIT, c.issue_cmd(BrowserLog)).await {
        Ok(Ok(log)) => {
            let entries = log
                .as_array()
                .or_else(|| log["value"].as_array())
                .cloned()
                .unwrap_or_default();
            let refused: Vec<String> = entries
                .iter()
                .filter_map(|e| e["message"].as_str())
                .filter(|m| m.contains("Content Security Policy") || m.contains("Refused to"))
                .map(str::to_owned)
                .collect();
            if !refused.is_empty() {
                return Err(format!("the console shows refusals: {refused:#?}"));
            }
        }
        other => {
            let _ = writeln!(
                std::io::stderr(),
                "docs page: the browser's console could not be read ({other:?}); \
                 its CSP refusals were not checked"
            );
        }
    }
    Ok(operations.len())
}

/// Every rendered operation as (method, path), from the texts of its
/// `.opblock-summary-method` and `.opblock-summary-path`.
async fn operations(c: &Client) -> Result<Vec<(String, String)>, String> {
    let found = within(
        "read the rendered operations",
        c.execute(
            "return Array.from(document.querySelectorAll('.opblock')).map(function (b) {\
               var m = b.querySelector('.opblock-summary-method');\
               var p = b.querySelector('.opblock-summary-path');\
               return [m ? m.textContent : '', p ? p.textContent : ''];\
             });",
            vec![],
        ),
    )
    .await?;
    // Swagger UI breaks long paths with <wbr> (or zero-width spaces).
    let clean = |v: &Value| {
        v.as_str()
            .unwrap_or_default()
            .replace('\u{200b}', "")
            .trim()
            .to_owned()
    };
    Ok(found
        .as_array()
        .map(|a| {
            a.iter()
                .map(|pair| (clean(&pair[0]).to_uppercase(), clean(&pair[1])))
                .collect()
        })
        .unwrap_or_default())
}

/// An `http(s)` URL on 127.0.0.0/8, `::1` or `localhost`.
fn on_loopback(u: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(u) else {
        return false;
    };
    if !matches!(url.scheme(), "http" | "https") {
        return false;
    }
    match url.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// chromedriver's `POST /session/{id}/se/log` for the `browser` log (the
/// page's console, kept with `goog:loggingPrefs`); not in fantoccini.
#[derive(Debug)]
pub(crate) struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &reqwest::Url,
        session: Option<&str>,
    ) -> Result<reqwest::Url, <reqwest::Url as std::str::FromStr>::Err> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &reqwest::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({"type": "browser"}).to_string()),
        )
    }
}
