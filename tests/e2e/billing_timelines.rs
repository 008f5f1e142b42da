//! Issue 39, the dashboard's billing timelines: a subscription's page and
//! its customer's page show the subscription's webhook events and its
//! invoices' reminders (each channel with its outcome), newest first, at
//! most 50; the test clock's page shows the events and notices its last
//! advance made. Everything on them is escaped. Over HTTP on both
//! backends, and in a real browser (headless Chromium) with the pages'
//! accessibility audit.
//!
//! The billing runs on a sandbox test clock (the gateway's own clock stays
//! real, so a browser's session cookie is as on any day).

use std::time::Duration;

use crate::browser::{Driver, element, locate_browser, type_into, within};
use dhukuti_tests::dash::Dash;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";
const HOSTILE: &str = "<script>alert(1)</script> Sita & \"Co\"";

async fn post(app: &TestApp, path: &str, key: &str, body: Value) -> Answer {
    let req = app
        .client
        .post(app.url(path))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("idempotency-key", format!("k-{}", ulid::Ulid::new()))
        .body(body.to_string());
    send(req).await
}

async fn get(app: &TestApp, path: &str, key: &str) -> Answer {
    send(app.client.get(app.url(path)).bearer_auth(key)).await
}

fn ok(a: &Answer, status: u16, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// What the tests look at.
struct Billed {
    owner_email: String,
    clock: String,
    customer: String,
    sub: String,
    invoice: String,
}

/// Advances `clock` to `to` and polls it until `ready` (each GET runs part
/// of the work, so this ends without waiting on time).
async fn advance(app: &TestApp, key: &str, clock: &str, to: &str) {
    let a = post(
        app,
        &format!("/v1/billing/test-clocks/{clock}/advance"),
        key,
        json!({"frozenTime": to}),
    )
    .await;
    ok(&a, 200, "advance");
    for _ in 0..100 {
        let a = get(app, &format!("/v1/billing/test-clocks/{clock}"), key).await;
        ok(&a, 200, "poll");
        if a.body["status"] == "ready" {
            return;
        }
    }
    panic!("clock {clock} never became ready");
}

/// A customer (hostile name, SMS and email) on a test clock, subscribed
/// with a 3-day trial; the clock advanced past the trial end: the first
/// invoice issued and its due-today reminder sent by SMS and email.
async fn billed(app: &TestApp, who: &str) -> (Billed, String) {
    let owner = app
        .tenant("Himal Fibre", &format!("owner@{who}.example"))
        .await;
    let key = app.key(&owner, Mode::Sandbox, &Scope::ALL).await;
    let owner_email = format!("boss@{who}.example");
    dashboard::create_user(
        app.state(),
        SystemClock.now(),
        &owner.merchant.id,
        &owner_email,
        Role::Owner,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let a = post(
        app,
        "/v1/billing/test-clocks",
        &key,
        json!({"frozenTime": "2026-01-12T05:00:00Z", "name": "Timeline"}),
    )
    .await;
    ok(&a, 201, "clock");
    let clock = text(&a.body["id"]);
    let a = post(
        app,
        "/v1/billing/customers",
        &key,
        json!({"name": HOSTILE, "email": format!("sita@{who}.example"), "phone": "9841000001", "testClockId": clock}),
    )
    .await;
    ok(&a, 201, "customer");
    let customer = text(&a.body["id"]);
    let a = post(
        app,
        "/v1/billing/plans",
        &key,
        json!({"name": "Fibre 50", "amount": 150_000, "intervalUnit": "month", "gracePeriodDays": 3}),
    )
    .await;
    ok(&a, 201, "plan");
    let plan = text(&a.body["id"]);
    let a = post(
        app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": plan, "trialDays": 3}),
    )
    .await;
    ok(&a, 201, "subscription");
    let sub = text(&a.body["id"]);
    advance(app, &key, &clock, "2026-01-15T06:00:00Z").await;
    let a = get(
        app,
        &format!("/v1/billing/invoices?subscriptionId={sub}"),
        &key,
    )
    .await;
    ok(&a, 200, "invoices");
    let invoice = text(&a.body["data"][0]["id"]);
    assert!(!invoice.is_empty(), "{}", a.body);
    (
        Billed {
            owner_email,
            clock,
            customer,
            sub,
            invoice,
        },
        key,
    )
}

/// The timeline section of a page: from its heading to the end of its
/// panel.
fn timeline(body: &str) -> &str {
    let start = body
        .find("id=\"timeline\"")
        .unwrap_or_else(|| panic!("no timeline: {body}"));
    let rest = &body[start..];
    let end = rest.find("</table>").map_or(rest.len(), |e| e + 8);
    &rest[..end]
}

fn position(panel: &str, what: &str) -> usize {
    panel
        .find(what)
        .unwrap_or_else(|| panic!("{what} not in the timeline: {panel}"))
}

async fn timelines_show_events_and_reminders(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (b, key) = billed(&app, "timeline").await;
    let mut owner = Dash::new(&app.base);
    let r = owner.sign_in(&b.owner_email, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());

    // The subscription: its events and its invoice's reminders, newest
    // first (the reminders, then the invoice, the trial's end, creation).
    let page = owner
        .get(&format!("/dashboard/billing/subscriptions/{}", b.sub))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    let panel = timeline(&page.body);
    // (The invoice and the trial's end share the sweep's time: either
    // first.)
    for middle in ["billing_invoice.created", "subscription.trial_ended"] {
        let order = [
            "reminder due_today",
            middle,
            "reminder trial_ending",
            "subscription.trial_will_end",
            "subscription.created",
        ];
        let at: Vec<usize> = order.iter().map(|w| position(panel, w)).collect();
        assert!(
            at.windows(2).all(|p| p[0] < p[1]),
            "{order:?} at {at:?}: {panel}"
        );
    }
    for word in ["email", "queued", "sms", "logged"] {
        assert!(panel.contains(word), "{word}: {panel}");
    }
    assert!(
        panel.contains(&format!(
            "href=\"/dashboard/billing/invoices/{}\"",
            b.invoice
        )),
        "{panel}"
    );

    // The customer: the same events, and the reminders of its invoices;
    // its name escaped everywhere.
    let page = owner
        .get(&format!("/dashboard/billing/customers/{}", b.customer))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(!page.body.contains("<script>alert"), "{}", page.show());
    assert!(
        page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        page.show()
    );
    let panel = timeline(&page.body);
    for word in [
        "reminder due_today",
        "billing_invoice.created",
        "subscription.created",
    ] {
        assert!(panel.contains(word), "{word}: {panel}");
    }

    // The clock's page: what the last advance made, marked new.
    advance(&app, &key, &b.clock, "2026-01-18T06:00:00Z").await;
    let page = owner
        .get(&format!("/dashboard/billing/test-clocks/{}", b.clock))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    let at = page
        .body
        .find("Events and notices of the last advance")
        .unwrap_or_else(|| panic!("{}", page.show()));
    let panel = &page.body[at..];
    // Jan 18: the grace end (overdue: the invoice's event and reminder).
    for word in ["billing_invoice.overdue", "reminder overdue"] {
        assert!(panel.contains(word), "{word}: {panel}");
    }
    assert!(
        !panel.contains("subscription.created"),
        "only the last advance's: {panel}"
    );

    // Bounded: 59 events later, the latest 50 rows and a word saying so.
    for i in 0..30 {
        let path = format!("/v1/billing/subscriptions/{}", b.sub);
        let a = post(
            &app,
            &format!("{path}/pause"),
            &key,
            json!({"pauseReason": format!("<b>trip {i}</b>")}),
        )
        .await;
        ok(&a, 200, "pause");
        if i < 29 {
            let a = post(&app, &format!("{path}/resume"), &key, json!({})).await;
            ok(&a, 200, "resume");
        }
    }
    let page = owner
        .get(&format!("/dashboard/billing/subscriptions/{}", b.sub))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    let panel = timeline(&page.body);
    assert_eq!(
        panel.matches("<tr>").count(),
        51,
        "a head and 50 rows: {panel}"
    );
    assert!(
        page.body.contains("The latest 50 are shown."),
        "{}",
        page.show()
    );
    assert!(!page.body.contains("<b>trip"), "{}", page.show());
    assert!(
        page.body.contains("&lt;b&gt;trip 29&lt;/b&gt;"),
        "{}",
        page.show()
    );
    assert!(
        position(panel, "subscription.paused") < position(panel, "subscription.resumed"),
        "newest first: {panel}"
    );
    app.stop().await;
}

on_both_backends!(timelines_show_events_and_reminders);

/// The same pages in a real browser: they render, pass the audit, and
/// show the timeline's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_timelines_in_a_real_browser() {
    let Some((chromium, chromedriver)) = locate_browser() else {
        return;
    };
    let Some(app) = spawn_app(Which::Embedded).await else {
        panic!("the embedded gateway is never skipped");
    };
    let (b, _) = billed(&app, "browser").await;
    let driver = Driver::start(&chromedriver);
    let client = driver.connect(&chromium).await;
    let run = tokio::time::timeout(Duration::from_secs(120), walk(&client, &app, &b))
        .await
        .unwrap_or_else(|_| Err("the browser part took longer than 120 s".into()));
    let report = match &run {
        Ok(()) => None,
        Err(_) => Some(driver.report(&client, "billing-timelines").await),
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
    drop(driver);
    if let Err(e) = run {
        panic!("{e}\n{}", report.unwrap_or_default());
    }
    app.stop().await;
}

async fn rows(c: &fantoccini::Client) -> Result<Vec<String>, String> {
    let found = within(
        "read the timeline",
        c.execute(
            "return [...document.querySelectorAll('.timeline tbody tr')].map(r => r.innerText)",
            vec![],
        ),
    )
    .await?;
    Ok(found
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect())
}

async fn walk(c: &fantoccini::Client, app: &TestApp, b: &Billed) -> Result<(), String> {
    within("open /dashboard", c.goto(&app.url("/dashboard"))).await?;
    element(c, "#email").await?;
    type_into(c, "#email", &b.owner_email).await?;
    type_into(c, "#password", PASSWORD).await?;
    let submit = element(c, "form.stack button[type=submit]").await?;
    within("sign in", submit.click()).await?;
    element(c, "main h1").await?;
    for (path, name) in [
        (
            format!("/dashboard/billing/subscriptions/{}", b.sub),
            "subscription",
        ),
        (
            format!("/dashboard/billing/customers/{}", b.customer),
            "customer",
        ),
        (
            format!("/dashboard/billing/test-clocks/{}", b.clock),
            "test clock",
        ),
    ] {
        within(&format!("open {path}"), c.goto(&app.url(&path))).await?;
        element(c, "main h1").await?;
        let found = within(
            &format!("audit {name}"),
            c.execute(crate::dashboard_browser::AUDIT, vec![]),
        )
        .await?;
        if found != json!([]) {
            return Err(format!("{name} fails the accessibility audit: {found}"));
        }
        let shown = rows(c).await?;
        let first = shown.first().cloned().unwrap_or_default();
        if !first.contains("due_today")
            || !shown.iter().any(|r| r.contains("billing_invoice.created"))
        {
            return Err(format!("{name}'s timeline: {shown:?}"));
        }
        if !first.contains("email") && !first.contains("sms") {
            return Err(format!(
                "{name}: a reminder row names its channel: {first:?}"
            ));
        }
    }
    // The customer's hostile name shows as text.
    within(
        "open the customer",
        c.goto(&app.url(&format!("/dashboard/billing/customers/{}", b.customer))),
    )
    .await?;
    let h1 = element(c, "main h1").await?;
    let title = within("read the title", h1.text()).await?;
    if title != HOSTILE {
        return Err(format!("the customer's name reads {title:?}"));
    }
    Ok(())
}
