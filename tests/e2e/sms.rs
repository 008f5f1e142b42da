//! SMS reminders end to end: `POST /v1/sms/notify-pending-payment` on the
//! gateway, the in-process SMS worker, and the SMS provider simulator at
//! `/sim/sms` (what it received is read from its control API).

use std::time::Duration;

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app, spawn_app_tweaked};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::{self, Plan, Scope};
use shared::domain::sms::{self, SmsMessage, SmsStatus};
use shared::queue::QueueName;
use shared::store::Update;
use shared::time::{Clock, SystemClock};

const PATH: &str = "/v1/sms/notify-pending-payment";

/// A pending session with `phone` over HTTP; its hosted URL.
async fn session(app: &TestApp, key: &str, phone: &str) -> String {
    let a = app
        .post(
            "/v1/checkout",
            Some(key),
            None,
            &json!({"amount": 150_000, "returnUrl": "https://shop.example/thanks",
                    "customer": {"name": "Sita Sharma", "phone": phone}}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let url = a.body["checkout_url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(url.starts_with(&app.base), "{url}");
    url
}

fn body(phone: &str, url: &str) -> Value {
    json!({"customerPhone": phone, "shopName": "Sita's Shop", "orderName": "Order A-17",
           "amountMinor": 150_000, "currency": "NPR", "checkoutUrl": url})
}

async fn notify(app: &TestApp, key: &str, body: &Value) -> Answer {
    app.post(PATH, Some(key), None, body).await
}

/// What the simulator accepted, and how many send calls it got.
async fn simulator(app: &TestApp) -> (Vec<Value>, u64) {
    let a = app.get("/sim/sms/_control/messages", None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    (
        a.body["messages"].as_array().cloned().unwrap_or_default(),
        a.body["send_calls"].as_u64().unwrap_or(0),
    )
}

/// Waits (up to 15 s) for the simulator to hold `n` messages.
async fn wait_for_messages(app: &TestApp, n: usize) -> Vec<Value> {
    for _ in 0..150 {
        let (messages, _) = simulator(app).await;
        if messages.len() >= n {
            return messages;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (messages, calls) = simulator(app).await;
    panic!(
        "expected {n} messages, got {} after {calls} calls: {messages:?}",
        messages.len()
    )
}

async fn setup(app: &TestApp, mode: Mode, plan: Plan) -> (dhukuti_tests::Tenant, String) {
    let tenant = app.tenant("Sita's Shop", "sita@example.com").await;
    if plan != Plan::Growth {
        if let Err(e) = account::set_plan(&*app.store, &tenant.merchant.id, plan).await {
            panic!("plan: {e}")
        }
    }
    let key = app.key(&tenant, mode, &Scope::ALL).await;
    (tenant, key)
}

async fn the_guards_apply_in_order_and_sandbox_only_logs(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Sandbox, Plan::Growth).await;
    let evil = "https://evil.example/c/cs_x";

    // Scope: payments:write.
    let read_only = app
        .key(&tenant, Mode::Sandbox, &[Scope::PaymentsRead])
        .await;
    notify(&app, &read_only, &body("9841000001", evil))
        .await
        .assert_error(403, "permission_error", "missing_scope");

    // Validation names the field; unknown fields are refused.
    let a = notify(&app, &key, &body("12345", evil)).await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "customerPhone", "{}", a.body);
    let mut wrong = body("9841000001", evil);
    wrong["currency"] = json!("USD");
    let a = notify(&app, &key, &wrong).await;
    assert_eq!(a.body["error"]["param"], "currency", "{}", a.body);
    let mut extra = body("9841000001", evil);
    extra["sendAt"] = json!("now");
    notify(&app, &key, &extra).await.assert_error(
        400,
        "invalid_request_error",
        "validation_failed",
    );

    // 1 before 2: no session (and a bad host) → phone_not_on_session.
    let a = notify(&app, &key, &body("9841000001", evil)).await;
    a.assert_error(400, "invalid_request_error", "phone_not_on_session");
    let url = session(&app, &key, "+977 984-1000001").await;
    // A session of another mode does not count.
    let live = app.key(&tenant, Mode::Live, &Scope::ALL).await;
    notify(&app, &live, &body("9841000001", &url))
        .await
        .assert_error(400, "invalid_request_error", "phone_not_on_session");
    // 2: the host.
    notify(&app, &key, &body("9841000001", evil))
        .await
        .assert_error(400, "invalid_request_error", "invalid_checkout_host");
    // 2: a checkout of another merchant on our own host.
    let other = app.tenant("Other Shop", "other@example.com").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let foreign = session(&app, &other_key, "9841000001").await;
    let a = notify(&app, &key, &body("9841000001", &foreign)).await;
    a.assert_error(400, "invalid_request_error", "invalid_checkout_host");
    assert_eq!(a.body["error"]["param"], "checkoutUrl", "{}", a.body);
    // Sandbox: logged, three times (numbers compare normalized).
    for phone in ["9841000001", "+9779841000001", "984-100-0001"] {
        let a = notify(&app, &key, &body(phone, &url)).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body, json!({"sent": false, "status": "logged"}));
    }
    // 3: at most 3 per recipient per day.
    let a = notify(&app, &key, &body("9841000001", &url)).await;
    a.assert_error(429, "rate_limit_error", "rate_limited");
    assert!(a.header("retry-after").parse::<u64>().is_ok_and(|s| s > 0));
    // 2 still comes before 3.
    notify(&app, &key, &body("9841000001", evil))
        .await
        .assert_error(400, "invalid_request_error", "invalid_checkout_host");

    // Nothing reached the provider.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (messages, calls) = simulator(&app).await;
    assert!(messages.is_empty() && calls == 0, "{messages:?}");
    app.stop().await;
}

async fn a_live_reminder_is_queued_then_delivered_exactly_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let url = session(&app, &key, "9841000002").await;
    let a = notify(&app, &key, &body("+977-9841000002", &url)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body, json!({"sent": true, "status": "queued"}));
    let messages = wait_for_messages(&app, 1).await;
    assert_eq!(messages[0]["to"], "9841000002");
    let text = messages[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("Sita's Shop") && text.contains("NPR 1,500.00") && text.contains(&url),
        "{text}"
    );

    // Duplicate queue messages for the same reminder never send it again.
    let Some(id) = sent_reminder_id(&app, &tenant).await else {
        panic!("no reminder record")
    };
    let dup = match serde_json::to_string(&SmsMessage { sms_id: id.clone() }) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    for _ in 0..3 {
        let sent = app
            .state()
            .queue
            .send(QueueName::Sms, &dup, Duration::ZERO)
            .await;
        assert!(sent.is_ok(), "{sent:?}");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (messages, calls) = simulator(&app).await;
    assert_eq!((messages.len(), calls), (1, 1), "{messages:?}");
    let r = sms::get(&*app.store, &id).await;
    assert!(
        matches!(&r, Ok(Some(r)) if r.status == SmsStatus::Sent && r.attempts == 1),
        "{r:?}"
    );
    app.stop().await;
}

/// The project's one reminder (the answer names none).
async fn sent_reminder_id(
    app: &TestApp,
    tenant: &dhukuti_tests::Tenant,
) -> Option<shared::ids::SmsId> {
    let listed = sms::list_recent(
        &*app.store,
        &shared::domain::Tenant::new(tenant.project.id.clone(), Mode::Live),
        10,
    )
    .await;
    let Ok(list) = listed else {
        panic!("{listed:?}")
    };
    assert_eq!(list.len(), 1, "{list:?}");
    list.into_iter().next().map(|r| r.id)
}

async fn a_flaky_provider_is_retried_and_delivers_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (_tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let url = session(&app, &key, "9851000003").await;
    let a = app
        .post(
            "/sim/sms/_control/fail",
            None,
            None,
            &json!({"times": 2, "status": 503}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = notify(&app, &key, &body("9851000003", &url)).await;
    assert_eq!(
        a.body,
        json!({"sent": true, "status": "queued"}),
        "{}",
        a.body
    );
    let messages = wait_for_messages(&app, 1).await;
    assert_eq!(messages[0]["to"], "9851000003");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (messages, calls) = simulator(&app).await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(calls, 3, "two 503s, then the delivery");
    app.stop().await;
}

async fn the_live_quota_holds_under_concurrency(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let phones: Vec<String> = (10..20).map(|n| format!("98410000{n}")).collect();
    let mut urls = Vec::new();
    for p in &phones {
        urls.push(session(&app, &key, p).await);
    }
    // 197 of Growth's 200 already used this month: 3 left.
    let now = SystemClock.now();
    let seeded = app
        .store
        .update(
            &sms::quota_counter(&tenant.merchant.id.as_str().into(), now),
            Update::new().add("n", 197),
            None,
        )
        .await;
    assert!(seeded.is_ok(), "{seeded:?}");
    let bodies: Vec<Value> = phones.iter().zip(&urls).map(|(p, u)| body(p, u)).collect();
    let answers = futures::future::join_all(bodies.iter().map(|b| notify(&app, &key, b))).await;
    let mut queued = 0;
    let mut limited = 0;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.body);
        match a.body["status"].as_str() {
            Some("queued") => queued += 1,
            Some("plan_limit_reached") => {
                assert_eq!(a.body["sent"], false);
                limited += 1
            }
            _ => panic!("{}", a.body),
        }
    }
    assert_eq!((queued, limited), (3, 7));
    wait_for_messages(&app, 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(simulator(&app).await.0.len(), 3);

    // The Free plan has no live SMS.
    if let Err(e) = account::set_plan(&*app.store, &tenant.merchant.id, Plan::Free).await {
        panic!("{e}")
    }
    let a = notify(&app, &key, &body(&phones[0], &urls[0])).await;
    assert_eq!(
        a.body,
        json!({"sent": false, "status": "plan_limit_reached"})
    );
    app.stop().await;
}

/// The live reminder of the tenant's project, once it is final.
async fn final_reminder(app: &TestApp, tenant: &dhukuti_tests::Tenant) -> sms::SmsReminder {
    for _ in 0..150 {
        let listed = sms::list_recent(
            &*app.store,
            &shared::domain::Tenant::new(tenant.project.id.clone(), Mode::Live),
            10,
        )
        .await;
        if let Ok([r]) = listed.as_deref() {
            if let Ok(Some(r)) = sms::get(&*app.store, &r.id).await {
                if r.status.is_final() {
                    return r;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no final reminder")
}

async fn quota_used(app: &TestApp, tenant: &dhukuti_tests::Tenant) -> i64 {
    let got = app
        .store
        .get(&sms::quota_counter(
            &tenant.merchant.id.as_str().into(),
            SystemClock.now(),
        ))
        .await;
    match got {
        Ok(item) => item
            .and_then(|i| i.get("n").and_then(Value::as_i64))
            .unwrap_or(0),
        Err(e) => panic!("{e}"),
    }
}

async fn a_provider_that_may_have_taken_it_is_never_asked_again(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let url = session(&app, &key, "9841000004").await;
    // A 500: the provider may have queued it before failing.
    let a = app
        .post(
            "/sim/sms/_control/fail",
            None,
            None,
            &json!({"times": 1, "status": 500}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = notify(&app, &key, &body("9841000004", &url)).await;
    assert_eq!(a.body, json!({"sent": true, "status": "queued"}));
    let r = final_reminder(&app, &tenant).await;
    assert_eq!((r.status, r.attempts), (SmsStatus::Unknown, 1), "{r:?}");
    // The worker's retries would have come within seconds: none did.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (messages, calls) = simulator(&app).await;
    assert_eq!((messages.len(), calls), (0, 1), "{messages:?}");
    assert_eq!(quota_used(&app, &tenant).await, 1, "kept: it may be billed");
    app.stop().await;
}

async fn a_refused_reminder_gives_its_quota_unit_back(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let url = session(&app, &key, "9841000005").await;
    let a = app
        .post(
            "/sim/sms/_control/fail",
            None,
            None,
            &json!({"times": 1, "status": 400}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = notify(&app, &key, &body("9841000005", &url)).await;
    assert_eq!(a.body, json!({"sent": true, "status": "queued"}));
    let r = final_reminder(&app, &tenant).await;
    assert_eq!(r.status, SmsStatus::Failed, "{r:?}");
    assert_eq!(quota_used(&app, &tenant).await, 0);
    app.stop().await;
}

async fn a_reminder_for_a_session_paid_meanwhile_is_not_sent(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let url = session(&app, &key, "9841000006").await;
    let Some(session_id) = sms::session_in_url(&url, &app.base).map(str::to_owned) else {
        panic!("{url}")
    };
    // The provider is down for the first send; the customer pays meanwhile.
    let a = app
        .post(
            "/sim/sms/_control/fail",
            None,
            None,
            &json!({"times": 1, "status": 503}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = notify(&app, &key, &body("9841000006", &url)).await;
    assert_eq!(a.body, json!({"sent": true, "status": "queued"}));
    let paid = app
        .store
        .update(
            &shared::domain::checkout::CheckoutSession::key(&session_id.as_str().into()),
            Update::new().set("status", "success"),
            None,
        )
        .await;
    assert!(paid.is_ok(), "{paid:?}");
    let r = final_reminder(&app, &tenant).await;
    assert_eq!(r.status, SmsStatus::Cancelled, "{r:?}");
    assert_eq!(r.session_id.as_deref(), Some(session_id.as_str()));
    let (messages, calls) = simulator(&app).await;
    assert!(messages.is_empty() && calls <= 1, "{messages:?} {calls}");
    assert_eq!(quota_used(&app, &tenant).await, 0, "the unit is given back");
    app.stop().await;
}

async fn the_pro_plan_has_a_thousand_a_month(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Pro).await;
    let phones: Vec<String> = (30..34).map(|n| format!("98410000{n}")).collect();
    let mut urls = Vec::new();
    for p in &phones {
        urls.push(session(&app, &key, p).await);
    }
    // 998 of Pro's 1,000 used (more than Growth's 200): 2 left.
    let seeded = app
        .store
        .update(
            &sms::quota_counter(&tenant.merchant.id.as_str().into(), SystemClock.now()),
            Update::new().add("n", 998),
            None,
        )
        .await;
    assert!(seeded.is_ok(), "{seeded:?}");
    let bodies: Vec<Value> = phones.iter().zip(&urls).map(|(p, u)| body(p, u)).collect();
    let answers = futures::future::join_all(bodies.iter().map(|b| notify(&app, &key, b))).await;
    let queued = answers
        .iter()
        .filter(|a| a.body == json!({"sent": true, "status": "queued"}))
        .count();
    let limited = answers
        .iter()
        .filter(|a| a.body == json!({"sent": false, "status": "plan_limit_reached"}))
        .count();
    let bodies: Vec<&Value> = answers.iter().map(|a| &a.body).collect();
    assert_eq!((queued, limited), (2, 2), "{bodies:?}");
    wait_for_messages(&app, 2).await;
    assert_eq!(quota_used(&app, &tenant).await, 1000);
    app.stop().await;
}

/// The answer is lost after the reminder was stored (the store times out
/// on the way back): a 5xx, not kept by the idempotency layer, so the
/// merchant's retry with the same Idempotency-Key runs again. It must find
/// the first run's reminder: one reminder, one quota unit, one SMS.
async fn a_retry_after_a_lost_answer_sends_one_sms(which: Which) {
    use shared::store::faults::{Fault, FaultyStore, Op};
    use std::sync::Arc;
    let mut faults: Option<Arc<FaultyStore>> = None;
    let app = spawn_app_tweaked(
        which,
        |inner| {
            let f = Arc::new(FaultyStore::new(inner));
            faults = Some(f.clone());
            f
        },
        |s| s.webhook_poll = None,
    )
    .await;
    let (Some(app), Some(faults)) = (app, faults) else {
        return;
    };
    let (tenant, key) = setup(&app, Mode::Live, Plan::Growth).await;
    let url = session(&app, &key, "9841000007").await;
    let b = body("9841000007", &url);
    faults.plan(Op::Transact, 0, Fault::timeout_after_write());
    let a = app.post(PATH, Some(&key), Some("remind-once"), &b).await;
    assert!((500..600).contains(&a.status), "{}: {}", a.status, a.body);
    assert_eq!(faults.injected(), 1);
    let a = app.post(PATH, Some(&key), Some("remind-once"), &b).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body, json!({"sent": true, "status": "queued"}));
    let messages = wait_for_messages(&app, 1).await;
    assert_eq!(messages[0]["to"], "9841000007");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (messages, calls) = simulator(&app).await;
    assert_eq!((messages.len(), calls), (1, 1), "{messages:?}");
    assert_eq!(quota_used(&app, &tenant).await, 1);
    let listed = sms::list_recent(
        &*app.store,
        &shared::domain::Tenant::new(tenant.project.id.clone(), Mode::Live),
        10,
    )
    .await;
    assert!(matches!(listed.as_deref(), Ok([_])), "{listed:?}");
    app.stop().await;
}

on_both_backends!(
    a_retry_after_a_lost_answer_sends_one_sms,
    a_provider_that_may_have_taken_it_is_never_asked_again,
    a_refused_reminder_gives_its_quota_unit_back,
    a_reminder_for_a_session_paid_meanwhile_is_not_sent,
    the_pro_plan_has_a_thousand_a_month,
    the_guards_apply_in_order_and_sandbox_only_logs,
    a_live_reminder_is_queued_then_delivered_exactly_once,
    a_flaky_provider_is_retried_and_delivers_once,
    the_live_quota_holds_under_concurrency,
);
