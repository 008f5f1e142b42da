//! A shop owner in a real browser (headless Chromium): signs in to the
//! dashboard, reads the overview's chart, refunds part of a payment with a
//! note, rotates an API key, and every page on the way passes an
//! accessibility audit run in the page (labels, headings, language,
//! title, names of images, and WCAG AA contrast of every text as the
//! browser computed its colours). A phone-sized window shows the pages
//! without sideways scrolling. Screenshots of each step are kept in
//! `target/tmp/dashboard/` (CI's artefacts).

use std::path::PathBuf;
use std::time::Duration;

use crate::browser::{Driver, element, locate_browser, type_into, within};
use dhukuti_tests::{TestApp, Which, spawn_app};
use fantoccini::Client;
use serde_json::Value;
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::domain::{Mode, Provider};
use shared::time::{Clock, SystemClock};

const WHOLE: Duration = Duration::from_secs(150);
const PASSWORD: &str = "an owner's long password";

/// The audit, run in the page: a list of problems (empty when none).
pub(crate) const AUDIT: &str = r#"
const problems = [];
const visible = (el) => {
  const s = getComputedStyle(el);
  const r = el.getBoundingClientRect();
  return s.display !== 'none' && s.visibility !== 'hidden' && r.width > 0 && r.height > 0;
};
if (!document.documentElement.lang) problems.push('no lang on <html>');
if (!document.title.trim()) problems.push('no <title>');
if (document.compatMode !== 'CSS1Compat') problems.push('quirks mode');
const h1 = document.querySelectorAll('h1');
if (h1.length !== 1) problems.push(h1.length + ' <h1> elements');
let last = 0;
for (const h of document.querySelectorAll('h1,h2,h3,h4,h5,h6')) {
  const level = +h.tagName[1];
  if (last && level > last + 1) problems.push('heading skips from h' + last + ' to ' + h.tagName);
  last = level;
}
for (const el of document.querySelectorAll('input,select,textarea')) {
  if (el.type === 'hidden') continue;
  const labelled = (el.id && document.querySelector('label[for="' + el.id + '"]'))
    || el.closest('label') || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
  if (!labelled) problems.push('no label: ' + el.outerHTML.slice(0, 80));
}
for (const b of document.querySelectorAll('button,a')) {
  if (visible(b) && !b.textContent.trim() && !b.getAttribute('aria-label')) {
    problems.push('no name: ' + b.outerHTML.slice(0, 80));
  }
}
for (const i of document.querySelectorAll('img,svg[role=img]')) {
  if (!(i.getAttribute('alt') || i.getAttribute('aria-label'))) problems.push('no text alternative: ' + i.outerHTML.slice(0, 80));
}
const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
const lum = ([r, g, b]) => {
  const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
};
const background = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.9)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
const seen = new Set();
while (walker.nextNode()) {
  const node = walker.currentNode;
  const el = node.parentElement;
  if (!node.textContent.trim() || !el || seen.has(el) || !visible(el)) continue;
  if (el.closest('svg') || el.closest('option')) continue;
  seen.add(el);
  const s = getComputedStyle(el);
  const fg = rgb(s.color).slice(0, 3);
  const bg = background(el);
  const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
  const ratio = (a + 0.05) / (b + 0.05);
  const size = parseFloat(s.fontSize);
  const large = size >= 24 || (size >= 18.66 && +s.fontWeight >= 700);
  if (ratio < (large ? 3 : 4.5)) {
    problems.push('contrast ' + ratio.toFixed(2) + ' for "' + node.textContent.trim().slice(0, 40) + '"');
  }
}
const root = document.documentElement;
if (window.innerWidth < 500) {
  if (root.scrollWidth > root.clientWidth + 1) {
    problems.push('scrolls sideways at ' + root.clientWidth + 'px: ' + root.scrollWidth);
  }
  for (const el of document.querySelectorAll('header *, nav.pager *, main > h1, main > p')) {
    const r = el.getBoundingClientRect();
    if (visible(el) && r.right > root.clientWidth + 1 && !el.closest('nav.main')) {
      problems.push('cut off at the right: ' + el.outerHTML.slice(0, 60));
    }
  }
}
return problems;
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_refunds_and_rotates_a_key_in_a_real_browser() {
    let Some((chromium, chromedriver)) = locate_browser() else {
        return;
    };
    let Some(app) = spawn_app(Which::Embedded).await else {
        panic!("the embedded gateway is never skipped");
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    dashboard::create_user(
        app.state(),
        SystemClock.now(),
        &t.merchant.id,
        "owner@himal.np",
        Role::Owner,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let payment = app
        .payment(&t, Mode::Sandbox, 240_000, Provider::Esewa)
        .await;
    let old_key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    // A link, an invoice and a webhook endpoint, for their own pages.
    let mut details = Vec::new();
    for (path, body, page) in [
        (
            "/v1/payment-links",
            serde_json::json!({"title": "Blue mugs", "amount": 50_000}),
            "/dashboard/links/",
        ),
        (
            "/v1/invoices",
            serde_json::json!({"lines": [{"description": "Two mugs", "quantity": "2", "unitAmount": 25_000}], "dueAt": "2030-12-31T18:15:00+05:45"}),
            "/dashboard/invoices/",
        ),
        (
            "/v1/webhooks",
            serde_json::json!({"url": "http://127.0.0.1:9/hook"}),
            "/dashboard/webhooks/",
        ),
    ] {
        let made = app.post(path, Some(&old_key), None, &body).await;
        assert_eq!(made.status, 201, "{path}: {}", made.body);
        details.push(format!(
            "{page}{}",
            made.body["id"].as_str().unwrap_or_default()
        ));
    }

    let driver = Driver::start(&chromedriver);
    let client = driver.connect(&chromium).await;
    let run = tokio::time::timeout(WHOLE, walk(&client, &app, &payment.id, &old_key, &details))
        .await
        .unwrap_or_else(|_| Err(format!("the browser part took longer than {WHOLE:?}")));
    let report = match &run {
        Ok(_) => None,
        Err(_) => Some(driver.report(&client, "dashboard").await),
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
    drop(driver);
    let new_key = match run {
        Ok(k) => k,
        Err(e) => panic!("{e}\n{}", report.unwrap_or_default()),
    };
    // What the browser did holds in the API.
    assert_eq!(app.get("/v1/payments", Some(&new_key)).await.status, 200);
    let refunds = app
        .get(
            &format!("/v1/refunds?paymentId={}", payment.id),
            Some(&new_key),
        )
        .await;
    assert_eq!(
        refunds.body["data"][0]["amount"], 50_000,
        "{}",
        refunds.body
    );
    assert_eq!(
        refunds.body["data"][0]["notes"], "Customer returned one mug",
        "{}",
        refunds.body
    );
    app.stop().await;
}

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Saves a screenshot of the page as `NN-name.png`.
async fn shot(c: &Client, name: &str) -> Result<(), String> {
    let png = within(&format!("screenshot {name}"), c.screenshot()).await?;
    let path = shots().join(format!("{name}.png"));
    std::fs::write(&path, png).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("dashboard screenshot: {}", path.display());
    Ok(())
}

/// Runs the accessibility audit on the page shown.
async fn audit(c: &Client, page: &str) -> Result<(), String> {
    let found = within(&format!("audit {page}"), c.execute(AUDIT, vec![])).await?;
    match found {
        Value::Array(problems) if problems.is_empty() => Ok(()),
        other => Err(format!("{page} fails the accessibility audit: {other}")),
    }
}

async fn open(c: &Client, app: &TestApp, path: &str, name: &str) -> Result<(), String> {
    within(&format!("open {path}"), c.goto(&app.url(path))).await?;
    element(c, "main h1").await?;
    audit(c, name).await?;
    shot(c, name).await
}

async fn click(c: &Client, css: &str) -> Result<(), String> {
    let button = element(c, css).await?;
    within(&format!("click {css}"), button.click()).await
}

/// The walk; the rotated key's secret.
async fn walk(
    c: &Client,
    app: &TestApp,
    payment: &str,
    old_key: &str,
    details: &[String],
) -> Result<String, String> {
    // Signed out, the dashboard asks to sign in.
    within("open /dashboard", c.goto(&app.url("/dashboard"))).await?;
    element(c, "#email").await?;
    audit(c, "sign-in").await?;
    shot(c, "01-sign-in").await?;
    type_into(c, "#email", "owner@himal.np").await?;
    type_into(c, "#password", PASSWORD).await?;
    click(c, "form.stack button[type=submit]").await?;

    // The overview and its chart: a bar a day.
    element(c, "svg[role=img]").await?;
    let bars = within(
        "count the bars",
        c.execute(
            "return document.querySelectorAll('svg[role=img] rect').length",
            vec![],
        ),
    )
    .await?;
    if bars != 30 {
        return Err(format!("{bars} bars in the chart"));
    }
    audit(c, "overview").await?;
    shot(c, "02-overview").await?;

    // Payments, then the payment, refunded in part with a note.
    open(c, app, "/dashboard/payments", "03-payments").await?;
    click(c, &format!("a[href='/dashboard/payments/{payment}']")).await?;
    element(c, "#refund-title").await?;
    audit(c, "payment").await?;
    type_into(c, "#amount", "500").await?;
    type_into(c, "#notes", "Customer returned one mug").await?;
    click(c, "form[action$='/refund'] button[type=submit]").await?;
    let notice = element(c, "p.notice").await?;
    let said = within("read the notice", notice.text()).await?;
    if !said.contains("recorded") {
        return Err(format!("after the refund the page says {said:?}"));
    }
    audit(c, "payment after refund").await?;
    shot(c, "04-refunded").await?;
    open(c, app, "/dashboard/refunds", "05-refunds").await?;

    // API keys: rotate the key with a day's grace.
    open(c, app, "/dashboard/keys", "06-keys").await?;
    click(c, "form[action$='/rotate'] button[type=submit]").await?;
    let field = element(c, "#secret").await?;
    let secret = within("read the new key", field.prop("value"))
        .await?
        .unwrap_or_default();
    if !secret.starts_with("sk_test_") || secret == old_key {
        return Err(format!("the rotated key reads {secret:?}"));
    }
    audit(c, "new key").await?;
    shot(c, "07-rotated").await?;
    open(c, app, "/dashboard/audit", "08-audit").await?;
    for (path, name) in [
        ("/dashboard/links", "08a-links"),
        ("/dashboard/invoices", "08b-invoices"),
        ("/dashboard/webhooks", "08c-webhooks"),
        ("/dashboard/sms", "08d-sms"),
        ("/dashboard/credentials", "08e-credentials"),
        ("/dashboard/people", "08f-people"),
    ] {
        open(c, app, path, name).await?;
    }
    for (i, path) in details.iter().enumerate() {
        open(
            c,
            app,
            path,
            &format!("08{}-detail", (b'g' + i as u8) as char),
        )
        .await?;
    }

    // The same pages on a phone: no sideways scrolling, still readable.
    within("phone size", c.set_window_size(390, 844)).await?;
    for (path, name) in [
        ("/dashboard", "09-phone-overview"),
        ("/dashboard/payments", "10-phone-payments"),
        ("/dashboard/keys", "11-phone-keys"),
    ] {
        open(c, app, path, name).await?;
    }
    Ok(secret)
}
