//! Issue 39 parts 5 and 6, end to end: billing notices.
//!
//! - On the local gateway with its sweep tick on, a new subscription's
//!   first invoice gets its `due_today` notice: the SMS in the SMS log
//!   (sandbox: logged, with the short pay link) and the email in the mail
//!   simulator's inbox, once; the invoice's dunning view lists both.
//! - On a test clock, an unpaid invoice under a dunning policy: due today,
//!   overdue (dunning starts), a dunning reminder per interval, then the
//!   final action (cancel) before the next period's invoice: the
//!   subscription is cancelled, the dunning exhausted, and no second
//!   invoice is issued.

use dhukuti_tests::billing::{get, ok, post, text};
use std::sync::Arc;
use std::time::Duration;

use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app_tweaked_with_clock};
use serde_json::{Value, json};
use shared::domain::account::Scope;
use shared::domain::{Mode, Tenant};
use shared::ids::TestClockId;
use shared::time::{ManualClock, Timestamp};

/// 10:45 Nepal time: no quiet hours.
const T0: &str = "2026-01-12T05:00:00Z";

fn t(s: &str) -> Timestamp {
    Timestamp::parse(s).unwrap_or_else(|| panic!("time {s}"))
}

async fn app_at(which: Which, tick: bool) -> Option<TestApp> {
    let clock = Arc::new(ManualClock::new(t(T0)));
    spawn_app_tweaked_with_clock(which, clock, |s| {
        if tick {
            s.sweep_every = Some(Duration::from_millis(200));
        }
    })
    .await
}

/// A customer (SMS and email), a monthly plan (3 days' grace) and its
/// subscription; answers (customer, subscription).
async fn subscribe(app: &TestApp, key: &str, clock: Option<&str>, email: &str) -> (String, String) {
    let mut customer = json!({"name": "Sita Rai", "email": email, "phone": "9841000001"});
    if let Some(c) = clock {
        customer["testClockId"] = json!(c);
    }
    let a = post(app, "/v1/billing/customers", key, customer).await;
    ok(&a, 201, "customer");
    let customer = text(&a.body["id"]);
    let a = post(
        app,
        "/v1/billing/plans",
        key,
        json!({"name": "Fibre 50", "amount": 150_000, "intervalUnit": "month", "gracePeriodDays": 3}),
    )
    .await;
    ok(&a, 201, "plan");
    let plan = text(&a.body["id"]);
    let a = post(
        app,
        "/v1/billing/subscriptions",
        key,
        json!({"customerId": customer, "planId": plan}),
    )
    .await;
    ok(&a, 201, "subscription");
    (customer, text(&a.body["id"]))
}

async fn invoices_of(app: &TestApp, key: &str, sub: &str) -> Vec<Value> {
    let a = get(
        app,
        &format!("/v1/billing/invoices?subscriptionId={sub}"),
        key,
    )
    .await;
    ok(&a, 200, "invoices");
    a.body["data"].as_array().cloned().unwrap_or_default()
}

async fn inbox_to(app: &TestApp, to: &str) -> Vec<Value> {
    let a = app.get("/sim/mail/_control/messages", None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["to"] == to)
        .collect()
}

async fn sms_log(app: &TestApp, tenant: &Tenant) -> Vec<String> {
    match shared::domain::sms::list_recent(&*app.store, tenant, 100).await {
        Ok(all) => all
            .into_iter()
            .map(|s| {
                assert_eq!(s.status, shared::domain::sms::SmsStatus::Logged, "sandbox");
                s.text
            })
            .collect(),
        Err(e) => panic!("sms log: {e}"),
    }
}

async fn a_new_invoice_gets_its_due_today_sms_and_email(which: Which) {
    let Some(app) = app_at(which, true).await else {
        return;
    };
    let owner = app.tenant("Himal Fibre", "owner@himalfibre.example").await;
    let key = app.key(&owner, Mode::Sandbox, &Scope::ALL).await;
    let tenant = Tenant::new(owner.project.id.clone(), Mode::Sandbox);
    let (_, sub) = subscribe(&app, &key, None, "sita@notices.example").await;
    let invs = invoices_of(&app, &key, &sub).await;
    assert_eq!(invs.len(), 1, "the first invoice at once");
    let inv = text(&invs[0]["id"]);
    let number = text(&invs[0]["number"]);
    // The gateway's tick runs the sweep, then the notices pass.
    let mut mails = Vec::new();
    for _ in 0..150 {
        mails = inbox_to(&app, "sita@notices.example").await;
        if !mails.is_empty() && !sms_log(&app, &tenant).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(mails.len(), 1, "one email: {mails:?}");
    assert_eq!(
        mails[0]["subject"],
        format!("Himal Fibre: invoice {number} is due today")
    );
    let body = text(&mails[0]["text"]);
    assert!(
        body.contains("1,500.00") && body.contains("2026-01-12"),
        "{body}"
    );
    let sms = sms_log(&app, &tenant).await;
    assert_eq!(sms.len(), 1, "{sms:?}");
    assert!(sms[0].contains("due today 2026-01-12"), "{}", sms[0]);
    assert!(sms[0].contains("/r/"), "the short pay link: {}", sms[0]);
    // Further ticks send nothing twice.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(inbox_to(&app, "sita@notices.example").await.len(), 1);
    assert_eq!(sms_log(&app, &tenant).await.len(), 1);
    let a = get(
        &app,
        &format!("/v1/billing/dunning/invoices/{inv}/dunning"),
        &key,
    )
    .await;
    ok(&a, 200, "dunning view");
    let reminders = a.body["reminders"].as_array().cloned().unwrap_or_default();
    let seen: Vec<(String, String, String)> = reminders
        .iter()
        .map(|r| (text(&r["kind"]), text(&r["channel"]), text(&r["outcome"])))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("due_today".into(), "email".into(), "queued".into()),
            ("due_today".into(), "sms".into(), "logged".into()),
        ],
        "{}",
        a.body
    );
    assert_eq!(a.body["status"], "not_started");
    // The dashboard's invoice page shows the same reminders.
    let password = "a long dashboard password";
    shared::domain::dashboard::create_user(
        app.state(),
        app.state().clock.now(),
        &owner.merchant.id,
        "viewer@himalfibre.example",
        shared::domain::dashboard::Role::Viewer,
        password,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut viewer = dhukuti_tests::dash::Dash::new(&app.base);
    let r = viewer.sign_in("viewer@himalfibre.example", password).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let page = viewer
        .get(&format!("/dashboard/billing/invoices/{inv}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    let at = page
        .body
        .find("id=\"reminders\"")
        .unwrap_or_else(|| panic!("{}", page.show()));
    let panel = &page.body[at..];
    for word in ["due_today", "email", "queued", "sms", "logged"] {
        assert!(panel.contains(word), "{word}: {}", page.show());
    }
    app.stop().await;
}

async fn a_dunned_invoice_on_a_clock_ends_in_its_final_action(which: Which) {
    let Some(app) = app_at(which, false).await else {
        return;
    };
    let owner = app.tenant("Valley Gym", "owner@valleygym.example").await;
    let key = app.key(&owner, Mode::Sandbox, &Scope::ALL).await;
    let tenant = Tenant::new(owner.project.id.clone(), Mode::Sandbox);
    let a = post(
        &app,
        "/v1/billing/dunning/policies",
        &key,
        json!({"name": "Two tries", "retryIntervalsDays": [2, 5], "finalAction": "cancel", "isDefault": true}),
    )
    .await;
    ok(&a, 201, "policy");
    let a = post(
        &app,
        "/v1/billing/test-clocks",
        &key,
        json!({"frozenTime": T0, "name": "Dunning"}),
    )
    .await;
    ok(&a, 201, "clock");
    let clock = text(&a.body["id"]);
    let (_, sub) = subscribe(&app, &key, Some(&clock), "ram@notices.example").await;
    // The first invoice is issued at the clock's time, due 2026-01-12;
    // paid (out of band), the subscription is active.
    let invs = invoices_of(&app, &key, &sub).await;
    assert_eq!(invs.len(), 1);
    let first = text(&invs[0]["id"]);
    // The clock's own time: the first invoice's due-today notice.
    let id = TestClockId::stored(clock.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let run = shared::domain::notices::clock::run(app.state(), &id, t(T0), deadline).await;
    assert!(matches!(run, Ok(r) if r.done), "{run:?}");
    let paid = shared::domain::billing::invoice::pay_invoice(
        app.state(),
        &tenant,
        &shared::ids::BillingInvoiceId::stored(first.clone()),
        shared::domain::billing::invoice::PaymentSource::OutOfBand {
            method: shared::domain::billing::invoice::OutOfBandMethod::Cash,
            received_on: chrono::NaiveDate::from_ymd_opt(2026, 1, 12).unwrap_or_default(),
            reference: "r-1".into(),
            recorded_by: "e2e".into(),
        },
        150_000,
        t(T0),
    )
    .await;
    assert!(paid.is_ok(), "{paid:?}");
    // To 2026-03-01: period 2 (Feb 12) is invoiced and never paid: due
    // today Feb 12, overdue Feb 15, dunning Feb 17 and Feb 20, then the
    // cancel (before the Mar 12 period).
    let run =
        shared::domain::notices::clock::run(app.state(), &id, t("2026-03-01T00:00:00Z"), deadline)
            .await;
    assert!(matches!(run, Ok(r) if r.done), "{run:?}");
    let invs = invoices_of(&app, &key, &sub).await;
    assert_eq!(invs.len(), 2, "no invoice after the cancel");
    let second = invs
        .iter()
        .find(|i| text(&i["id"]) != first)
        .cloned()
        .unwrap_or_default();
    let inv = text(&second["id"]);
    let a = get(&app, &format!("/v1/billing/subscriptions/{sub}"), &key).await;
    ok(&a, 200, "subscription");
    assert_eq!(a.body["status"], "cancelled", "{}", a.body);
    let a = get(
        &app,
        &format!("/v1/billing/dunning/invoices/{inv}/dunning"),
        &key,
    )
    .await;
    ok(&a, 200, "dunning");
    assert_eq!(a.body["status"], "exhausted", "{}", a.body);
    let attempts = a.body["attempts"].as_array().cloned().unwrap_or_default();
    assert_eq!(attempts.len(), 4, "2 intervals x 2 channels: {}", a.body);
    let sms_days: Vec<(String, String)> = a.body["reminders"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|r| r["channel"] == "sms")
        .map(|r| (text(&r["kind"]), text(&r["day"])))
        .collect();
    assert_eq!(
        sms_days,
        vec![
            ("due_today".into(), "2026-02-12".into()),
            ("overdue".into(), "2026-02-15".into()),
            ("dunning".into(), "2026-02-17".into()),
            ("dunning".into(), "2026-02-20".into()),
        ],
        "{}",
        a.body
    );
    // The first invoice's due-today SMS and the second's four.
    let sms = sms_log(&app, &tenant).await;
    assert_eq!(sms.len(), 5, "{sms:?}");
    assert_eq!(
        sms.iter()
            .filter(|s| s.contains("failed. Please pay"))
            .count(),
        2
    );
    let mut mails = Vec::new();
    for _ in 0..150 {
        mails = inbox_to(&app, "ram@notices.example").await;
        if mails.len() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(mails.len(), 5, "{mails:?}");
    app.stop().await;
}

/// Moves `clock` to `to` (forward).
fn set(clock: &ManualClock, to: &str) {
    let d = t(to).unix_millis() - shared::time::Clock::now(clock).unix_millis();
    clock.advance(chrono::Duration::milliseconds(d));
}

/// The sandbox SMS log's dunning reminders.
async fn dunning_sms(app: &TestApp, tenant: &Tenant) -> usize {
    sms_log(app, tenant)
        .await
        .iter()
        .filter(|s| s.contains("failed. Please pay"))
        .count()
}

/// A retry-now at 21:45 Nepal time: the email goes at once, the SMS is
/// deferred (shown `deferred` in the invoice's reminders) and goes once
/// at 07:00, by the notices pass, however often it runs.
async fn a_retry_now_at_night_defers_its_sms_to_seven(which: Which) {
    let clock = Arc::new(ManualClock::new(t(T0)));
    let Some(app) = spawn_app_tweaked_with_clock(which, clock.clone(), |_| {}).await else {
        return;
    };
    let owner = app.tenant("Night Fibre", "owner@nightfibre.example").await;
    let key = app.key(&owner, Mode::Sandbox, &Scope::ALL).await;
    let tenant = Tenant::new(owner.project.id.clone(), Mode::Sandbox);
    let a = post(
        &app,
        "/v1/billing/dunning/policies",
        &key,
        json!({"name": "Two tries", "retryIntervalsDays": [2, 5], "finalAction": "cancel", "isDefault": true}),
    )
    .await;
    ok(&a, 201, "policy");
    let a = post(
        &app,
        "/v1/billing/customers",
        &key,
        json!({"name": "Hari", "email": "hari@night.example", "phone": "9841000002"}),
    )
    .await;
    ok(&a, 201, "customer");
    let customer = text(&a.body["id"]);
    let a = post(
        &app,
        "/v1/billing/plans",
        &key,
        json!({"name": "Fibre 50", "amount": 150_000, "intervalUnit": "month", "gracePeriodDays": 3}),
    )
    .await;
    ok(&a, 201, "plan");
    let plan = text(&a.body["id"]);
    let a = post(
        &app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": plan, "trialDays": 3}),
    )
    .await;
    ok(&a, 201, "subscription");
    let sub = text(&a.body["id"]);
    let run = |at: &'static str| {
        set(&clock, at);
        let state = app.state().clone();
        async move {
            let now = state.clock.now();
            let swept = shared::domain::billing::sweep::sweep(&state, now, 100).await;
            assert!(swept.is_ok(), "{swept:?}");
            let ran = shared::domain::notices::pass(&state, now, 100).await;
            assert!(matches!(&ran, Ok(r) if r.errors == 0), "{ran:?}");
            ran.map(|r| r.sent).unwrap_or_default()
        }
    };
    // The trial ends Jan 15 (the invoice, due that day); the grace ends
    // Jan 18: overdue, dunning starts.
    run("2026-01-15T06:00:00Z").await;
    let inv = text(&invoices_of(&app, &key, &sub).await[0]["id"]);
    run("2026-01-18T02:00:00Z").await;
    let base = format!("/v1/billing/dunning/invoices/{inv}/dunning");
    let a = get(&app, &base, &key).await;
    assert_eq!(a.body["status"], "active", "{}", a.body);
    set(&clock, "2026-01-18T16:00:00Z");
    let a = post(&app, &format!("{base}/retry-now"), &key, json!({})).await;
    ok(&a, 200, "retry-now");
    let attempts = a.body["attempts"].as_array().cloned().unwrap_or_default();
    assert_eq!(attempts.len(), 1, "the email: {}", a.body);
    assert_eq!(attempts[0]["channel"], "email");
    let reminders = a.body["reminders"].as_array().cloned().unwrap_or_default();
    let last: Vec<(String, String)> = reminders[reminders.len().saturating_sub(2)..]
        .iter()
        .map(|r| (text(&r["channel"]), text(&r["outcome"])))
        .collect();
    assert_eq!(
        last,
        vec![
            ("email".into(), "queued".into()),
            ("sms".into(), "deferred".into())
        ],
        "{}",
        a.body
    );
    assert_eq!(dunning_sms(&app, &tenant).await, 0, "no SMS at night");
    let mut mails = Vec::new();
    for _ in 0..150 {
        mails = inbox_to(&app, "hari@night.example").await;
        if mails.iter().any(|m| text(&m["text"]).contains("failed")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let night_mails = mails.len();
    assert!(
        mails.iter().any(|m| text(&m["text"]).contains("failed")),
        "the dunning email went: {mails:?}"
    );
    // Still night at 06:45: nothing.
    assert_eq!(run("2026-01-19T01:00:00Z").await, 0);
    // 07:00: the SMS goes once, over two passes.
    assert_eq!(run("2026-01-19T01:15:00Z").await, 1);
    assert_eq!(run("2026-01-19T01:16:00Z").await, 0);
    assert_eq!(dunning_sms(&app, &tenant).await, 1);
    let a = get(&app, &base, &key).await;
    ok(&a, 200, "dunning");
    let attempts: Vec<(String, String)> = a.body["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| (text(&r["channel"]), text(&r["outcome"])))
        .collect();
    assert_eq!(
        attempts,
        vec![
            ("email".into(), "queued".into()),
            ("sms".into(), "logged".into())
        ],
        "{}",
        a.body
    );
    assert_eq!(a.body["nextAttemptOn"], "2026-01-20", "{}", a.body);
    assert_eq!(
        inbox_to(&app, "hari@night.example").await.len(),
        night_mails,
        "the email is not resent"
    );
    app.stop().await;
}

/// A queue that refuses sends to one queue, the rest as `inner`.
struct DownFor(shared::queue::QueueName, Arc<dyn shared::queue::Queue>);

#[async_trait::async_trait]
impl shared::queue::Queue for DownFor {
    async fn send(
        &self,
        queue: shared::queue::QueueName,
        body: &str,
        delay: Duration,
    ) -> Result<String, shared::queue::QueueError> {
        if queue == self.0 {
            return Err(shared::queue::QueueError::Unavailable("injected".into()));
        }
        self.1.send(queue, body, delay).await
    }
    async fn receive(
        &self,
        queue: shared::queue::QueueName,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<shared::queue::Message>, shared::queue::QueueError> {
        self.1.receive(queue, max, wait, visibility).await
    }
    async fn delete(
        &self,
        queue: shared::queue::QueueName,
        receipt: &str,
    ) -> Result<(), shared::queue::QueueError> {
        self.1.delete(queue, receipt).await
    }
}

/// The notices pass with the mail queue down, then SES answering 503
/// twice: the notice stays due (each pass fails it and tries again), its
/// SMS goes once, and once the queue is back the email is queued once and
/// SES's retries deliver it once; further passes send nothing.
async fn a_notice_outlives_the_mail_queue_and_ses_down(which: Which) {
    let Some(app) = app_at(which, false).await else {
        return;
    };
    let owner = app.tenant("Down Fibre", "owner@downfibre.example").await;
    let key = app.key(&owner, Mode::Sandbox, &Scope::ALL).await;
    let tenant = Tenant::new(owner.project.id.clone(), Mode::Sandbox);
    let (_, sub) = subscribe(&app, &key, None, "gita@down.example").await;
    let inv = text(&invoices_of(&app, &key, &sub).await[0]["id"]);
    let state = app.state().clone();
    let down = state.clone().with_queue(Arc::new(DownFor(
        shared::queue::QueueName::Mail,
        state.queue.clone(),
    )));
    let now = state.clock.now();
    for _ in 0..2 {
        let ran = shared::domain::notices::pass(&down, now, 100).await;
        assert!(matches!(&ran, Ok(r) if r.errors == 1), "{ran:?}");
    }
    assert_eq!(sms_log(&app, &tenant).await.len(), 1, "the SMS went, once");
    let base = format!("/v1/billing/dunning/invoices/{inv}/dunning");
    let a = get(&app, &base, &key).await;
    assert_eq!(a.body["reminders"], json!([]), "nothing recorded yet");
    // SES down for the next two sends.
    let a = app
        .post(
            "/sim/mail/_control/fail",
            None,
            None,
            &json!({"times": 2, "status": 503}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let ran = shared::domain::notices::pass(&state, now, 100).await;
    assert!(matches!(&ran, Ok(r) if r.errors == 0), "{ran:?}");
    let mut mails = Vec::new();
    for _ in 0..150 {
        mails = inbox_to(&app, "gita@down.example").await;
        if !mails.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(mails.len(), 1, "{mails:?}");
    let stored = shared::domain::mail::list_recent(&*app.store, &tenant, 10).await;
    let stored = stored.unwrap_or_else(|e| panic!("mail: {e}"));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].status, shared::domain::mail::MailStatus::Sent);
    assert_eq!(stored[0].attempts, 3, "two 503s, then sent");
    let ran = shared::domain::notices::pass(&state, now, 100).await;
    assert!(
        matches!(&ran, Ok(r) if r.notices_run == 0 && r.errors == 0),
        "{ran:?}"
    );
    let a = get(&app, &base, &key).await;
    let seen: Vec<(String, String)> = a.body["reminders"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| (text(&r["channel"]), text(&r["outcome"])))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("email".into(), "queued".into()),
            ("sms".into(), "logged".into())
        ],
        "{}",
        a.body
    );
    assert_eq!(inbox_to(&app, "gita@down.example").await.len(), 1);
    assert_eq!(sms_log(&app, &tenant).await.len(), 1);
    app.stop().await;
}

on_both_backends!(
    a_new_invoice_gets_its_due_today_sms_and_email,
    a_dunned_invoice_on_a_clock_ends_in_its_final_action,
    a_retry_now_at_night_defers_its_sms_to_seven,
    a_notice_outlives_the_mail_queue_and_ses_down,
);
