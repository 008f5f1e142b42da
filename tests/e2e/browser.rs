//! Customers in a real browser, end to end, each in its own headless
//! Chromium:
//!
//! * one opens a checkout session's `checkout_url`, picks eSewa, pays on
//!   the eSewa simulator's wallet page and lands on the merchant's
//!   `returnUrl`;
//! * one opens a payment link's page `/l/{id}`, types an amount and a
//!   name, continues to the hosted checkout it opens, picks Khalti, pays
//!   on the Khalti simulator's page and lands on the link's `redirectUrl`.
//!
//! The API then shows the session and its payment `success` (and the link
//! used once, its page viewed).
//!
//! Chromium is driven over WebDriver through Debian's `chromedriver`
//! (package `chromium-driver`) with fantoccini, on 127.0.0.1 only.
//! `infra/test.sh` installs both and sets `DHUKUTI_CHROMIUM` (and
//! `DHUKUTI_CHROMEDRIVER`); with the variable set, a browser that does not
//! start fails the test. Without it and without a browser on PATH (a
//! laptop), each test says so loudly and passes, so the rest still runs.
//!
//! Bounded: every wait gives up after [`WAIT`], each test's browser part
//! after [`WHOLE`], and chromedriver with every Chromium process it started
//! is killed when the test ends, however it ends.

use std::fmt::Display;
use std::fs;
use std::future::Future;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::Uri;
use axum::response::Html;
use axum::routing::get;
use dhukuti_tests::{TestApp, Which, spawn_app};
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;

/// The longest any one wait (an element, a URL, a command) may take.
pub(crate) const WAIT: Duration = Duration::from_secs(20);
/// The longest the whole browser part of one test may take.
const WHOLE: Duration = Duration::from_secs(120);

/// The flags the brief asks for; chromedriver adds its own
/// `--remote-debugging-port`.
pub(crate) const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--no-first-run",
    "--no-default-browser-check",
    "--window-size=1280,1000",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_pays_with_esewa_in_a_real_browser() {
    let Some(scene) = Scene::new().await else {
        return;
    };
    let (app, shop) = (&scene.app, &scene.shop);

    let a = app
        .post(
            "/v1/checkout",
            Some(&scene.key),
            None,
            &json!({
                "amount": 150_000,
                "returnUrl": format!("{}/thanks", shop.base),
                "cancelUrl": format!("{}/cancelled", shop.base),
            }),
        )
        .await;
    assert_eq!(a.status, 201, "create the session: {}", a.body);
    let session_id = a.body["id"].as_str().unwrap_or_default().to_owned();
    let checkout_url = a.body["checkout_url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(checkout_url, format!("{}/c/{session_id}", app.base));

    scene
        .in_browser("esewa-checkout", async |c| {
            pay_a_session_with_esewa(c, app, shop, &session_id, &checkout_url).await
        })
        .await;

    scene.assert_returned(&session_id);
    scene.assert_paid(&session_id, 150_000, "esewa").await;
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_pays_through_a_payment_link_with_khalti_in_a_real_browser() {
    let Some(scene) = Scene::new().await else {
        return;
    };
    let (app, shop) = (&scene.app, &scene.shop);

    let a = app
        .post(
            "/v1/payment-links",
            Some(&scene.key),
            None,
            &json!({
                "title": "Everest tee",
                "minAmount": 50_000,
                "maxAmount": 200_000,
                "redirectUrl": format!("{}/thanks", shop.base),
            }),
        )
        .await;
    assert_eq!(a.status, 201, "create the link: {}", a.body);
    let link_id = a.body["id"].as_str().unwrap_or_default().to_owned();
    let link_url = a.body["url"].as_str().unwrap_or_default().to_owned();
    assert!(link_id.starts_with("lnk_"), "{}", a.body);
    assert_eq!(link_url, format!("{}/l/{link_id}", app.base));

    let session_id = scene
        .in_browser("khalti-link", async |c| {
            pay_a_link_with_khalti(c, app, shop, &link_id, &link_url).await
        })
        .await;

    scene.assert_returned(&session_id);
    let s = scene.assert_paid(&session_id, 150_000, "khalti").await;
    assert_eq!(s["customerName"], "Sita Sharma", "{s}");
    let l = app
        .get(&format!("/v1/payment-links/{link_id}"), Some(&scene.key))
        .await;
    assert_eq!(l.status, 200, "{}", l.body);
    assert_eq!(l.body["usedCount"], 1, "{}", l.body);
    assert!(
        l.body["stats"]["views"].as_u64().is_some_and(|v| v >= 1),
        "the page view was not counted: {}",
        l.body
    );
    scene.stop().await;
}

// ---------------------------------------------------------------------------
// What the customers do, step by step; the first failure is returned.

/// Pays the session at `checkout_url` with eSewa and lands on the shop.
async fn pay_a_session_with_esewa(
    c: &Client,
    app: &TestApp,
    shop: &MerchantSite,
    session_id: &str,
    checkout_url: &str,
) -> Result<(), String> {
    reach_the_gateway(c, app).await?;

    // Our checkout page: choose eSewa and pay.
    within("open the checkout page", c.goto(checkout_url)).await?;
    choose_and_pay(c, session_id, "esewa").await?;

    // The auto-submitted form brings the customer to eSewa's wallet page.
    url_until(c, "reach the eSewa wallet page", |u| {
        u.starts_with(&app.url("/sim/esewa/wallet/"))
    })
    .await?;
    let pay = element(c, "button[name=action][value=pay]").await?;
    within("click Pay on the wallet page", pay.click()).await?;

    // Back through our return URL to the merchant's thank-you page.
    land_on_the_thanks_page(c, shop).await?;
    Ok(())
}

/// Opens the link's page at `link_url`, asks for Rs. 1500, pays the
/// checkout session it opens with Khalti and lands on the shop; the
/// session's id.
async fn pay_a_link_with_khalti(
    c: &Client,
    app: &TestApp,
    shop: &MerchantSite,
    link_id: &str,
    link_url: &str,
) -> Result<String, String> {
    reach_the_gateway(c, app).await?;

    // The link's page: its title, and a form that posts back to it.
    within("open the payment link's page", c.goto(link_url)).await?;
    let title = within(
        "read the link's title",
        element(c, "h1#link-title").await?.text(),
    )
    .await?;
    if title != "Everest tee" {
        return Err(format!("the link's page is titled {title:?}"));
    }
    let form = element(c, "form#link-form").await?;
    let action = within("read the link form's action", form.attr("action")).await?;
    let want = format!("/l/{link_id}");
    if !action.as_deref().is_some_and(|a| a.ends_with(&want)) {
        return Err(format!("#link-form posts to {action:?}, not {want}"));
    }

    // An amount within the link's bounds, a name, and on.
    type_into(c, "input#link-amount[name=amount]", "1500").await?;
    type_into(c, "input#link-name[name=name]", "Sita Sharma").await?;
    within(
        "click #link-continue",
        element(c, "button#link-continue").await?.click(),
    )
    .await?;

    // The link opened a checkout session: the same picker as any.
    let at = url_until(c, "reach the hosted checkout from the link", |u| {
        u.starts_with(&app.url("/c/cs_"))
    })
    .await?;
    let session_id = at
        .strip_prefix(&app.url("/c/"))
        .and_then(|rest| rest.split(['/', '?', '#']).next())
        .unwrap_or_default()
        .to_owned();
    choose_and_pay(c, &session_id, "khalti").await?;

    // Khalti's own page (the simulator's): pay.
    url_until(c, "reach the Khalti payment page", |u| {
        u.starts_with(&app.url("/sim/khalti/pay")) && u.contains("pidx=")
    })
    .await?;
    let pay = element(c, "button[name=action][value=pay]").await?;
    within("click Pay on the Khalti page", pay.click()).await?;

    // Back through our return URL to the link's redirectUrl.
    land_on_the_thanks_page(c, shop).await?;
    Ok(session_id)
}

/// The browser works and reaches the gateway at all.
async fn reach_the_gateway(c: &Client, app: &TestApp) -> Result<(), String> {
    within("open the simulators' index", c.goto(&app.url("/sim"))).await?;
    let h1 = element(c, "h1").await?;
    let text = within("read the index heading", h1.text()).await?;
    if !text.contains("simulators") {
        return Err(format!("the /sim index shows {text:?}"));
    }
    Ok(())
}

/// On the hosted checkout page of `session_id`: chooses `provider`
/// (`esewa`, `khalti`) and clicks Pay.
async fn choose_and_pay(c: &Client, session_id: &str, provider: &str) -> Result<(), String> {
    let form = element(c, "form#pay-form").await?;
    let action = within("read the form's action", form.attr("action")).await?;
    let want = format!("/c/{session_id}/pay");
    if !action.as_deref().is_some_and(|a| a.ends_with(&want)) {
        return Err(format!("#pay-form posts to {action:?}, not {want}"));
    }
    let radio = element(
        c,
        &format!("input#provider-{provider}[name=provider][value={provider}]"),
    )
    .await?;
    within(&format!("choose {provider}"), radio.click()).await?;
    if !within(&format!("read the {provider} radio"), radio.is_selected()).await? {
        return Err(format!(
            "#provider-{provider} is not selected after a click"
        ));
    }
    within(
        "click #pay-button",
        element(c, "#pay-button").await?.click(),
    )
    .await
}

/// Waits for the merchant's `/thanks` page and reads it; the URL.
async fn land_on_the_thanks_page(c: &Client, shop: &MerchantSite) -> Result<String, String> {
    let thanks = format!("{}/thanks", shop.base);
    let landed = url_until(c, "land on the merchant's thank-you page", |u| {
        u.starts_with(&thanks)
    })
    .await?;
    let shown = within(
        "read the thank-you page",
        element(c, "#thanks").await?.text(),
    )
    .await?;
    if shown != "Thank you for your order" {
        return Err(format!("the merchant's page at {landed} shows {shown:?}"));
    }
    Ok(landed)
}

/// Types `text` into the empty field `css` and checks that it holds it.
pub(crate) async fn type_into(c: &Client, css: &str, text: &str) -> Result<(), String> {
    let field = element(c, css).await?;
    within(&format!("clear `{css}`"), field.clear()).await?;
    within(&format!("type into `{css}`"), field.send_keys(text)).await?;
    let value = within(&format!("read `{css}`"), field.prop("value")).await?;
    if value.as_deref() != Some(text) {
        return Err(format!("`{css}` holds {value:?} after typing {text:?}"));
    }
    Ok(())
}

/// `fut` within [`WAIT`], its error named after `what`.
pub(crate) async fn within<T, E: Display>(
    what: &str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {WAIT:?}")),
    }
}

/// The first element matching `css`, waiting for it up to [`WAIT`].
pub(crate) async fn element(c: &Client, css: &str) -> Result<Element, String> {
    let found = c
        .wait()
        .at_most(WAIT)
        .every(Duration::from_millis(100))
        .for_element(Locator::Css(css));
    match tokio::time::timeout(WAIT + Duration::from_secs(5), found).await {
        Ok(Ok(e)) => Ok(e),
        Ok(Err(e)) => Err(format!("no element `{css}` within {WAIT:?}: {e}")),
        Err(_) => Err(format!("no element `{css}` within {WAIT:?}")),
    }
}

/// Polls the browser's URL until `ok` holds, up to [`WAIT`].
async fn url_until(c: &Client, what: &str, ok: impl Fn(&str) -> bool) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let url = within("read the URL", c.current_url()).await?.to_string();
        if ok(&url) {
            return Ok(url);
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: still at {url} after {WAIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn query_of(path_and_query: &str) -> Vec<(String, String)> {
    match reqwest::Url::parse(&format!("http://merchant.invalid{path_and_query}")) {
        Ok(u) => u.query_pairs().into_owned().collect(),
        Err(e) => panic!("{path_and_query}: {e}"),
    }
}

fn query_value(query: &[(String, String)], name: &str) -> Option<String> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

// ---------------------------------------------------------------------------
// What every test starts with, runs and checks

/// A browser to drive, the embedded gateway with one sandbox merchant and
/// its key, and the merchant's own site.
struct Scene {
    chromium: PathBuf,
    chromedriver: PathBuf,
    app: TestApp,
    key: String,
    shop: MerchantSite,
}

impl Scene {
    /// `None` (after a loud message) when there is no browser to drive and
    /// none was asked for.
    async fn new() -> Option<Scene> {
        let (chromium, chromedriver) = locate_browser()?;
        let Some(app) = spawn_app(Which::Embedded).await else {
            panic!("the embedded gateway is never skipped");
        };
        let t = app.tenant("Thamel Books", "orders@thamel.example").await;
        let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
        let shop = MerchantSite::start().await;
        Some(Scene {
            chromium,
            chromedriver,
            app,
            key,
            shop,
        })
    }

    /// Runs the customer's `steps` in a fresh Chromium, all within
    /// [`WHOLE`]; their answer. When they fail, panics with their error,
    /// where the browser was and what it showed (a screenshot named after
    /// `name`) and chromedriver's log. chromedriver and its Chromium are
    /// gone when this returns or panics.
    async fn in_browser<T>(
        &self,
        name: &str,
        steps: impl AsyncFnOnce(&Client) -> Result<T, String>,
    ) -> T {
        let started = Instant::now();
        let driver = Driver::start(&self.chromedriver);
        let client = driver.connect(&self.chromium).await;
        let run = tokio::time::timeout(WHOLE, steps(&client))
            .await
            .unwrap_or_else(|_| Err(format!("the browser part took longer than {WHOLE:?}")));
        let report = match &run {
            Ok(_) => None,
            Err(_) => Some(driver.report(&client, name).await),
        };
        // chromedriver quits Chromium itself (and reaps it) on a close; a
        // polite goodbye, the guard kills whatever is left anyway.
        let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
        drop(driver);
        match run {
            Ok(v) => {
                eprintln!(
                    "browser ({name}): the customer paid in {:?}",
                    started.elapsed()
                );
                v
            }
            Err(e) => panic!("{e}\n{}", report.unwrap_or_default()),
        }
    }

    /// The merchant's site saw the browser arrive once, with the outcome
    /// of `session_id`.
    fn assert_returned(&self, session_id: &str) {
        let hits = self.shop.hits();
        assert_eq!(hits.len(), 1, "requests to /thanks: {hits:?}");
        let query = query_of(&hits[0]);
        assert_eq!(
            query_value(&query, "session_id").as_deref(),
            Some(session_id),
            "{}",
            hits[0]
        );
        assert_eq!(
            query_value(&query, "status").as_deref(),
            Some("success"),
            "{}",
            hits[0]
        );
    }

    /// The API shows `session_id` and its payment `success` for `amount`
    /// through `provider` (at once, or at least within [`WAIT`]); the
    /// session.
    async fn assert_paid(&self, session_id: &str, amount: i64, provider: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        let s = loop {
            let s = self
                .app
                .get(&format!("/v1/sessions/{session_id}"), Some(&self.key))
                .await;
            assert_eq!(s.status, 200, "{}", s.body);
            if s.body["status"] != "pending" || Instant::now() >= deadline {
                break s.body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(s["status"], "success", "{s}");
        assert_eq!(s["amount"], amount, "{s}");
        let payment_id = s["paymentId"].as_str().unwrap_or_default();
        assert!(payment_id.starts_with("pay_"), "paymentId: {s}");
        let p = self
            .app
            .get(&format!("/v1/payments/{payment_id}"), Some(&self.key))
            .await;
        assert_eq!(p.status, 200, "{}", p.body);
        assert_eq!(p.body["status"], "success", "{}", p.body);
        assert_eq!(p.body["amount"], amount, "{}", p.body);
        assert_eq!(p.body["provider"], provider, "{}", p.body);
        s
    }

    async fn stop(self) {
        self.shop.stop();
        self.app.stop().await;
    }
}

// ---------------------------------------------------------------------------
// Finding the browser

/// Chromium and chromedriver, or `None` (after a loud message) on a
/// machine that has no browser and did not ask for one.
pub(crate) fn locate_browser() -> Option<(PathBuf, PathBuf)> {
    let asked = std::env::var_os("DHUKUTI_CHROMIUM").filter(|v| !v.is_empty());
    let chromium = match &asked {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "DHUKUTI_CHROMIUM={} is not a file: the browser cannot start",
                p.display()
            );
            Some(p)
        }
        None => [
            "chromium",
            "chromium-browser",
            "google-chrome",
            "google-chrome-stable",
        ]
        .iter()
        .find_map(|n| on_path(n)),
    };
    let driver = match std::env::var_os("DHUKUTI_CHROMEDRIVER").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => on_path("chromedriver").or_else(|| {
            Some(PathBuf::from("/usr/lib/chromium/chromedriver")).filter(|p| p.is_file())
        }),
    };
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        (c, d) => {
            let missing = match (c, d) {
                (None, _) => "no chromium on PATH",
                _ => "no chromedriver (Debian package chromium-driver; or DHUKUTI_CHROMEDRIVER)",
            };
            assert!(
                asked.is_none(),
                "DHUKUTI_CHROMIUM is set but {missing}: the browser cannot start"
            );
            // Straight to stderr: the test harness captures `eprintln!`.
            let _ = writeln!(
                std::io::stderr(),
                "\n==================== BROWSER TEST NOT RUN ====================\n\
                 {missing}, and DHUKUTI_CHROMIUM is unset. `bash infra/test.sh`\n\
                 installs chromium and chromium-driver and runs it; or\n\
                 `apt-get install chromium chromium-driver` and run it again.\n\
                 ===============================================================\n"
            );
            None
        }
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

// ---------------------------------------------------------------------------
// chromedriver, and Chromium under it

/// chromedriver on a free loopback port, the leader of its own process
/// group, which Chromium and its helpers inherit. Dropping it kills the
/// whole group and reaps chromedriver.
pub(crate) struct Driver {
    child: Child,
    url: String,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Driver {
    pub(crate) fn start(chromedriver: &Path) -> Driver {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            Ok(a) => a.port(),
            Err(e) => panic!("a free port for chromedriver: {e}"),
        };
        let log = dir.path().join("chromedriver.log");
        let out = fs::File::create(dir.path().join("chromedriver.out"))
            .unwrap_or_else(|e| panic!("chromedriver's output file: {e}"));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("chromedriver's output file: {e}"));
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .arg("--allowed-ips=127.0.0.1")
            // Chromium's temporary profile and scoped dirs go under the
            // test's own temp dir, removed when the driver is dropped
            // (Chromium is killed, so it cannot remove them itself).
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{} did not start: {e}", chromedriver.display()));
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            dir,
        }
    }

    /// Waits for chromedriver to be ready, then opens a session on
    /// `chromium`; fails (never skips) when either does not come up.
    pub(crate) async fn connect(&self, chromium: &Path) -> Client {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = tokio::time::timeout(
                Duration::from_secs(2),
                http.get(format!("{}/status", self.url)).send(),
            )
            .await;
            if matches!(ready, Ok(Ok(ref r)) if r.status().is_success()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver was not ready within {WAIT:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "timeouts": {"pageLoad": WAIT.as_millis() as u64, "script": WAIT.as_millis() as u64, "implicit": 0},
            // The page's console, for tests that read it (`docs_page`).
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": CHROMIUM_FLAGS,
            },
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let mut builder = ClientBuilder::new(connector);
        builder.capabilities(caps);
        let session = builder.connect(&self.url);
        match tokio::time::timeout(WAIT, session).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => panic!(
                "Chromium ({}) did not start under chromedriver: {e}\n{}",
                chromium.display(),
                self.logs()
            ),
            Err(_) => panic!(
                "Chromium ({}) did not start within {WAIT:?}\n{}",
                chromium.display(),
                self.logs()
            ),
        }
    }

    /// Where the browser is and what it shows (a screenshot saved beside
    /// the test binaries as `browser-failure-{name}.png`), plus
    /// chromedriver's log: for a failure message.
    pub(crate) async fn report(&self, c: &Client, name: &str) -> String {
        let short = Duration::from_secs(5);
        let url = match tokio::time::timeout(short, c.current_url()).await {
            Ok(Ok(u)) => u.to_string(),
            other => format!("(unknown: {other:?})"),
        };
        let source = match tokio::time::timeout(short, c.source()).await {
            Ok(Ok(s)) => s.chars().take(4000).collect(),
            other => format!("(unavailable: {other:?})"),
        };
        let shot =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("browser-failure-{name}.png"));
        let shot = match tokio::time::timeout(short, c.screenshot()).await {
            Ok(Ok(png)) if fs::write(&shot, &png).is_ok() => shot.display().to_string(),
            _ => "(none)".into(),
        };
        format!(
            "--- browser at: {url}\n--- screenshot: {shot}\n--- page source (start):\n{source}\n{}",
            self.logs()
        )
    }

    /// The last lines of chromedriver's log and output.
    pub(crate) fn logs(&self) -> String {
        let tail = |p: &Path| {
            let text = fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        format!(
            "--- chromedriver log (last 40 lines):\n{}\n--- chromedriver output:\n{}",
            tail(&self.log),
            tail(&self.dir.path().join("chromedriver.out"))
        )
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group id is chromedriver's pid, not reusable before the
        // `wait` below reaps it.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// The merchant's site

/// A tiny shop on 127.0.0.1 that records every request to `/thanks`
/// (path and query) and answers a small page.
struct MerchantSite {
    base: String,
    hits: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MerchantSite {
    async fn start() -> MerchantSite {
        let hits = Arc::new(Mutex::new(Vec::new()));
        let seen = hits.clone();
        let router = Router::new()
            .route(
                "/thanks",
                get(move |uri: Uri| async move {
                    if let Ok(mut h) = seen.lock() {
                        h.push(uri.to_string());
                    }
                    Html(
                        "<!doctype html><title>Thamel Books</title>\
                         <h1 id=thanks>Thank you for your order</h1>",
                    )
                }),
            )
            .route(
                "/cancelled",
                get(|| async { Html("<!doctype html><h1 id=cancelled>Order cancelled</h1>") }),
            );
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("merchant site: {e}"),
        };
        let base = match listener.local_addr() {
            Ok(a) => format!("http://{a}"),
            Err(e) => panic!("merchant site: {e}"),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        MerchantSite { base, hits, task }
    }

    fn hits(&self) -> Vec<String> {
        self.hits.lock().map(|h| h.clone()).unwrap_or_default()
    }

    fn stop(self) {}
}

impl Drop for MerchantSite {
    fn drop(&mut self) {
        self.task.abort();
    }
}
