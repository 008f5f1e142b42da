//! Issue 39 "Test clocks", over HTTP: a customer put on a sandbox clock,
//! a monthly plan with a 7-day trial subscribed on it, and the clock
//! advanced: the advance answers `advancing` at once, polling the clock
//! reaches `ready`, and by then past the trial the first invoice is issued
//! and the subscription active; a month on, the second invoice. The
//! merchant's transitions on the clock's subscription read the clock's
//! time. A clock never goes backwards (400 naming `frozenTime`); a live
//! key gets no clock (403 `test_clock_live_mode`) and cannot put a
//! customer on one; another project's clock is not yours. A deleted
//! clock's customer gets no new subscription (400 naming `customerId`).
//!
//! And the concurrency the issue asks for: a clock advanced while
//! scheduler runs, pollers and API calls race it issues exactly the
//! invoices a twin clock advanced alone issues, one per period. And the
//! dashboard's test clocks (sandbox only): create, advance, see what ran.

use dhukuti_tests::billing::{call, get, invoices_of, ok, post, text};
use dhukuti_tests::dash::{Dash, field};
use dhukuti_tests::shop::Shop;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock, Timestamp};

fn time(v: &Value) -> Option<Timestamp> {
    v.as_str().and_then(Timestamp::parse)
}

fn refused(a: &Answer, status: u16, code: &str, param: Option<&str>, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
    assert_eq!(a.body["error"]["code"], code, "{what}: {}", a.body);
    if let Some(p) = param {
        assert_eq!(a.body["error"]["param"], p, "{what}: {}", a.body);
    }
}

/// Polls the clock until it is `ready` (each GET runs part of its work,
/// so this ends without waiting on time), answering it.
async fn ready(app: &TestApp, key: &str, clock: &str) -> Value {
    let path = format!("/v1/billing/test-clocks/{clock}");
    for _ in 0..100 {
        let a = get(app, &path, key).await;
        ok(&a, 200, "poll the clock");
        match a.body["status"].as_str() {
            Some("ready") => return a.body,
            Some("advancing") => {}
            _ => panic!("status: {}", a.body),
        }
    }
    panic!("clock {clock} never became ready")
}

/// Advances the clock: the answer is `advancing` at `to`, at once.
async fn advance(app: &TestApp, key: &str, clock: &str, to: &str) -> Value {
    let path = format!("/v1/billing/test-clocks/{clock}/advance");
    let a = post(app, &path, key, json!({"frozenTime": to})).await;
    ok(&a, 200, "advance");
    assert_eq!(a.body["status"], "advancing", "{}", a.body);
    assert_eq!(
        time(&a.body["frozenTime"]),
        Timestamp::parse(to),
        "{}",
        a.body
    );
    a.body
}

async fn a_trial_subscription_lives_by_its_clock(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Clock Gym", "owner@clockgym.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let live = app.key(&t, Mode::Live, &Scope::ALL).await;

    // A live key gets no clock.
    let body = json!({"frozenTime": "2026-01-10T06:00:00Z", "name": "Year walk"});
    let a = post(&app, "/v1/billing/test-clocks", &live, body.clone()).await;
    refused(&a, 403, "test_clock_live_mode", None, "live create");

    let a = post(&app, "/v1/billing/test-clocks", &key, body.clone()).await;
    ok(&a, 201, "create clock");
    let clock = text(&a.body["id"]);
    assert!(clock.starts_with("clock_"), "{}", a.body);
    assert_eq!(a.body["object"], "test_clock");
    assert_eq!(a.body["name"], "Year walk");
    assert_eq!(a.body["status"], "ready");
    assert_eq!(a.body["livemode"], false);
    let t0 = Timestamp::parse("2026-01-10T06:00:00Z");
    assert_eq!(time(&a.body["frozenTime"]), t0, "{}", a.body);
    let a = get(&app, &format!("/v1/billing/test-clocks/{clock}"), &live).await;
    refused(&a, 403, "test_clock_live_mode", None, "live get");
    let a = post(
        &app,
        "/v1/billing/test-clocks",
        &key,
        json!({"frozenTime": "not a time", "name": "x"}),
    )
    .await;
    refused(&a, 400, "validation_failed", Some("frozenTime"), "bad time");

    // The customer is put on the clock (sandbox only, the tenant's own).
    let on_clock = json!({"name": "Sita Rai", "testClockId": clock});
    let a = post(&app, "/v1/billing/customers", &live, on_clock.clone()).await;
    refused(
        &a,
        400,
        "validation_failed",
        Some("testClockId"),
        "live customer",
    );
    let other = app.tenant("Other Gym", "owner@othergym.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let a = post(&app, "/v1/billing/customers", &other_key, on_clock.clone()).await;
    refused(
        &a,
        400,
        "validation_failed",
        Some("testClockId"),
        "another's clock",
    );
    let a = post(&app, "/v1/billing/customers", &key, on_clock).await;
    ok(&a, 201, "customer on the clock");
    assert_eq!(a.body["testClockId"], clock.as_str());
    let customer = text(&a.body["id"]);

    let a = post(
        &app,
        "/v1/billing/plans",
        &key,
        json!({
            "name": "Monthly", "amount": 150_000, "intervalUnit": "month",
            "trialDays": 7, "gracePeriodDays": 3, "overdueAction": "keep_active",
        }),
    )
    .await;
    ok(&a, 201, "plan");
    let plan = text(&a.body["id"]);
    let a = post(
        &app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": plan}),
    )
    .await;
    ok(&a, 201, "subscription");
    let sub = text(&a.body["id"]);
    assert_eq!(a.body["status"], "trialing", "{}", a.body);
    assert_eq!(a.body["testClockId"], clock.as_str(), "{}", a.body);
    // Its trial is read at the clock's time, not today's.
    assert_eq!(
        time(&a.body["trialEndsAt"]),
        Timestamp::parse("2026-01-17T06:00:00Z"),
        "{}",
        a.body
    );
    assert!(invoices_of(&app, &key, &sub).await.is_empty());

    // Eight days on: the trial has ended, the first invoice is issued.
    let advance_path = format!("/v1/billing/test-clocks/{clock}/advance");
    advance(&app, &key, &clock, "2026-01-18T06:00:00Z").await;
    let c = ready(&app, &key, &clock).await;
    assert_eq!(
        time(&c["frozenTime"]),
        Timestamp::parse("2026-01-18T06:00:00Z")
    );
    let s = get(&app, &format!("/v1/billing/subscriptions/{sub}"), &key).await;
    ok(&s, 200, "subscription after the trial");
    assert_eq!(s.body["status"], "active", "{}", s.body);
    let first = invoices_of(&app, &key, &sub).await;
    assert_eq!(first.len(), 1, "{first:?}");

    // Backwards, or standing still, is refused and changes nothing.
    for to in ["2026-01-12T00:00:00Z", "2026-01-18T06:00:00Z"] {
        let a = post(&app, &advance_path, &key, json!({"frozenTime": to})).await;
        refused(&a, 400, "validation_failed", Some("frozenTime"), to);
    }
    let a = post(
        &app,
        &advance_path,
        &live,
        json!({"frozenTime": "2026-03-01T00:00:00Z"}),
    )
    .await;
    refused(&a, 403, "test_clock_live_mode", None, "live advance");

    // A month on: the second period's invoice.
    advance(&app, &key, &clock, "2026-02-18T06:00:00Z").await;
    ready(&app, &key, &clock).await;
    let both = invoices_of(&app, &key, &sub).await;
    assert_eq!(both.len(), 2, "{both:?}");

    // The merchant's transitions read the clock's time: a resume time
    // in the real past but after the clock's is accepted, and the
    // subscription's changes are stamped at the clock's time.
    let clock_now = Timestamp::parse("2026-02-18T06:00:00Z");
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/pause"),
        &key,
        json!({"resumeAt": "2026-02-25T00:00:00Z"}),
    )
    .await;
    ok(&a, 200, "pause on the clock");
    assert_eq!(a.body["status"], "paused", "{}", a.body);
    assert_eq!(time(&a.body["updatedAt"]), clock_now, "{}", a.body);
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/cancel"),
        &key,
        json!({}),
    )
    .await;
    ok(&a, 200, "cancel on the clock");
    assert_eq!(time(&a.body["cancelledAt"]), clock_now, "{}", a.body);

    // The clock goes; its subscription stays, and another advance finds
    // no clock.
    let path = format!("/v1/billing/test-clocks/{clock}");
    let a = call(&app, "DELETE", &path, &live, None).await;
    refused(&a, 403, "test_clock_live_mode", None, "live delete");
    let a = call(&app, "DELETE", &path, &key, None).await;
    ok(&a, 200, "delete");
    assert_eq!(a.body["deleted"], true);
    let a = get(&app, &path, &key).await;
    refused(&a, 404, "not_found", None, "deleted clock");
    let a = post(
        &app,
        &advance_path,
        &key,
        json!({"frozenTime": "2026-04-01T00:00:00Z"}),
    )
    .await;
    refused(&a, 404, "not_found", None, "advance a deleted clock");
    let s = get(&app, &format!("/v1/billing/subscriptions/{sub}"), &key).await;
    ok(&s, 200, "subscription after the clock");
    // Its customer gets no new subscription: there is no clock to live by.
    let a = post(
        &app,
        "/v1/billing/subscriptions",
        &key,
        json!({"customerId": customer, "planId": plan}),
    )
    .await;
    refused(
        &a,
        400,
        "validation_failed",
        Some("customerId"),
        "clock gone",
    );
    app.stop().await;
}

/// A new clock at 2026-01-10 with `n` subscriptions of `plan` on it (a
/// customer each).
async fn clock_with(
    app: &TestApp,
    key: &str,
    plan: &str,
    name: &str,
    n: usize,
) -> (String, Vec<String>) {
    let body = json!({"frozenTime": "2026-01-10T06:00:00Z", "name": name});
    let a = post(app, "/v1/billing/test-clocks", key, body).await;
    ok(&a, 201, "create clock");
    let clock = text(&a.body["id"]);
    let mut subs = Vec::new();
    for i in 0..n {
        let body = json!({"name": format!("{name} {i}"), "testClockId": clock});
        let a = post(app, "/v1/billing/customers", key, body).await;
        ok(&a, 201, "customer");
        let body = json!({"customerId": text(&a.body["id"]), "planId": plan});
        let a = post(app, "/v1/billing/subscriptions", key, body).await;
        ok(&a, 201, "subscription");
        subs.push(text(&a.body["id"]));
    }
    (clock, subs)
}

/// Each subscription's invoiced periods (their first days), in order.
async fn periods(app: &TestApp, key: &str, subs: &[String]) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for sub in subs {
        let mut starts: Vec<String> = invoices_of(app, key, sub)
            .await
            .iter()
            .map(|i| text(&i["periodStart"]))
            .collect();
        starts.sort();
        all.push(starts);
    }
    all
}

async fn a_raced_clock_bills_each_period_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Race Gym", "owner@racegym.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let a = post(
        &app,
        "/v1/billing/plans",
        &key,
        json!({
            "name": "Monthly", "amount": 90_000, "intervalUnit": "month",
            "trialDays": 7, "gracePeriodDays": 3, "overdueAction": "keep_active",
        }),
    )
    .await;
    ok(&a, 201, "plan");
    let plan = text(&a.body["id"]);
    let (calm, calm_subs) = clock_with(&app, &key, &plan, "calm", 3).await;
    let (raced, raced_subs) = clock_with(&app, &key, &plan, "raced", 3).await;
    let to = "2026-07-29T06:00:00Z";

    // The twin advanced alone: the trial ends Jan 17, then a period a
    // month, Jan 17 to Jul 17.
    advance(&app, &key, &calm, to).await;
    ready(&app, &key, &calm).await;
    let want = periods(&app, &key, &calm_subs).await;
    for starts in &want {
        assert_eq!(starts.len(), 7, "{want:?}");
        assert_eq!(starts.first().map(String::as_str), Some("2026-01-17"));
    }

    // The raced clock: once its advance has answered, three scheduler
    // runs (the billing sweep and the clocks' part), two pollers, the
    // same advance again, and API calls on its subscriptions, all at once
    // with the gateway's own background task.
    advance(&app, &key, &raced, to).await;
    let runs =
        futures::future::join_all((0..3).map(|_| ::scheduler::handle(app.state(), json!({}))));
    let polls = futures::future::join_all((0..2).map(|_| ready(&app, &key, &raced)));
    let again_path = format!("/v1/billing/test-clocks/{raced}/advance");
    let again = post(&app, &again_path, &key, json!({"frozenTime": to}));
    let ends: Vec<String> = raced_subs
        .iter()
        .map(|s| format!("/v1/billing/subscriptions/{s}/end-trial"))
        .collect();
    let calls =
        futures::future::join_all(ends.iter().map(|path| post(&app, path, &key, json!({}))));
    let (runs, _, again, calls) = tokio::join!(runs, polls, again, calls);
    for run in runs {
        if let Err(e) = run {
            panic!("scheduler run: {e}");
        }
    }
    // The same advance again: answered as it is while it advances; once
    // ready, standing still.
    match again.status {
        200 => assert_eq!(again.body["status"], "advancing", "{}", again.body),
        400 => assert_eq!(again.body["error"]["param"], "frozenTime", "{}", again.body),
        other => panic!("advance again: {other} {}", again.body),
    }
    // Ending a trial is refused either way: the clock is advancing
    // (`state_conflict`), or the trial has ended
    // (`subscription_state_conflict`); nothing is written.
    for a in calls {
        assert_eq!(a.status, 409, "{}", a.body);
        let code = a.body["error"]["code"].as_str().unwrap_or_default();
        assert!(
            ["state_conflict", "subscription_state_conflict"].contains(&code),
            "{}",
            a.body
        );
    }
    let c = ready(&app, &key, &raced).await;
    assert_eq!(time(&c["frozenTime"]), Timestamp::parse(to));
    assert_eq!(periods(&app, &key, &raced_subs).await, want);
    app.stop().await;
}

/// A signed-in browser of a new `role` user of the shop's merchant, on
/// the project's sandbox.
async fn person(shop: &Shop, email: &str, role: Role) -> Dash {
    dashboard::create_user(
        shop.app.state(),
        SystemClock.now(),
        &shop.tenant.merchant.id,
        email,
        role,
        "a long dashboard password",
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut d = Dash::new(&shop.app.base);
    let r = d.sign_in(email, "a long dashboard password").await;
    assert_eq!(r.status, 303, "{}", r.show());
    d.switch(shop.tenant.project.id.as_str(), "sandbox").await;
    d
}

async fn test_clocks_in_the_dashboard(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let list = "/dashboard/billing/test-clocks";
    let mut dev = person(&shop, "dev@asan.example", Role::Developer).await;
    let mut viewer = person(&shop, "viewer@asan.example", Role::Viewer).await;

    // Made on the page; a bad time is named.
    let page = dev.get(list).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("No test clocks yet"), "{}", page.show());
    let csrf = field(&page.body, "csrf");
    let r = dev
        .post(
            list,
            &[
                ("csrf", &csrf),
                ("name", "Year walk"),
                ("frozen_time", "soon"),
            ],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(r.body.contains("Frozen time"), "{}", r.show());
    let r = dev
        .post(
            list,
            &[
                ("csrf", &csrf),
                ("name", "Year <walk>"),
                ("frozen_time", "2026-01-10T06:00"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let clock = r.location.rsplit('/').next().unwrap_or_default().to_owned();
    assert!(clock.starts_with("clock_"), "{}", r.location);
    let a = get(
        &shop.app,
        &format!("/v1/billing/test-clocks/{clock}"),
        &shop.key,
    )
    .await;
    ok(&a, 200, "the clock over the API");
    assert_eq!(
        time(&a.body["frozenTime"]),
        Timestamp::parse("2026-01-10T06:00:00Z")
    );
    let page = viewer.get(list).await;
    assert!(page.body.contains(&clock), "{}", page.show());
    // Escaped, never markup.
    assert!(page.body.contains("Year &lt;walk&gt;"), "{}", page.show());
    assert!(!page.body.contains("Create test clock"), "{}", page.show());

    // A subscription on it, through the API.
    let a = post(
        &shop.app,
        "/v1/billing/customers",
        &shop.key,
        json!({"name": "Sita Rai", "testClockId": clock}),
    )
    .await;
    ok(&a, 201, "customer");
    let customer = text(&a.body["id"]);
    let a = post(
        &shop.app,
        "/v1/billing/plans",
        &shop.key,
        json!({"name": "Gym monthly", "amount": 150_000, "intervalUnit": "month", "trialDays": 7}),
    )
    .await;
    ok(&a, 201, "plan");
    let a = post(
        &shop.app,
        "/v1/billing/subscriptions",
        &shop.key,
        json!({"customerId": customer, "planId": text(&a.body["id"])}),
    )
    .await;
    ok(&a, 201, "subscription");
    let sub = text(&a.body["id"]);

    let clock_path = format!("{list}/{clock}");
    let advance_path = format!("{clock_path}/advance");
    let page = dev.get(&clock_path).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.body.contains(&sub) && page.body.contains("No invoices yet"),
        "{}",
        page.show()
    );
    assert!(page.body.contains(&advance_path), "{}", page.show());
    // A viewer has no form, and a forged post is refused; a developer's
    // post without its token too.
    let page = viewer.get(&clock_path).await;
    assert!(!page.body.contains(&advance_path), "{}", page.show());
    let r = viewer
        .post(
            &advance_path,
            &[("csrf", &csrf), ("frozen_time", "2026-03-01T00:00")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    let r = dev
        .post(&advance_path, &[("frozen_time", "2026-03-01T00:00")])
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    // Backwards is named.
    let r = dev
        .post(
            &advance_path,
            &[("csrf", &csrf), ("frozen_time", "2026-01-01T00:00")],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(r.body.contains("Advance to"), "{}", r.show());

    // Forty days on: the page drives the clock to ready and shows what
    // ran: the trial's end on Jan 17 and the invoices of Jan 17 and Feb
    // 17, both new.
    let r = dev
        .post(
            &advance_path,
            &[("csrf", &csrf), ("frozen_time", "2026-02-19T06:00")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert!(r.location.ends_with("?done=advance"), "{}", r.location);
    let mut page = dev.get(&r.location).await;
    for _ in 0..50 {
        if page.body.contains("status ready") {
            break;
        }
        page = dev.get(&clock_path).await;
    }
    assert!(page.body.contains("status ready"), "{}", page.show());
    assert!(
        page.body.contains("2026-02-19 06:00 UTC"),
        "{}",
        page.show()
    );
    assert!(page.body.contains("Last advanced from"), "{}", page.show());
    assert_eq!(
        page.body.matches("<strong>new</strong>").count(),
        2,
        "{}",
        page.show()
    );
    for day in ["2026-01-17", "2026-02-17"] {
        assert!(page.body.contains(day), "{day}: {}", page.show());
    }
    assert_eq!(invoices_of(&shop.app, &shop.key, &sub).await.len(), 2);

    // Live mode has no clocks.
    dev.switch(shop.tenant.project.id.as_str(), "live").await;
    let page = dev.get(list).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("sandbox only"), "{}", page.show());
    assert!(!page.body.contains(&clock), "{}", page.show());
    shop.app.stop().await;
}

on_both_backends!(
    a_trial_subscription_lives_by_its_clock,
    a_raced_clock_bills_each_period_once,
    test_clocks_in_the_dashboard
);
