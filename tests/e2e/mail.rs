//! Billing email end to end: `shared::domain::mail::send_billing_mail` on
//! a running gateway, its mail worker (what `mail-dispatcher` does on AWS)
//! and the mail simulator at `/sim/mail` (its inbox read from the control
//! API); bounces through the simulator's control endpoint, which queues
//! the SES notification as SNS would. And the SES v2 sender against moto.

use std::time::Duration;

use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::Tenant;
use shared::domain::billing::reminders::{Locale, ReminderKind, ReminderText};
use shared::domain::mail::{self, DispatchOutcome, MailAbout, MailStatus};
use shared::ids::{BillingInvoiceId, MailId};
use shared::providers::mail::{HttpSender, MailConfig, MailSender};

fn template() -> ReminderText<'static> {
    ReminderText {
        kind: ReminderKind::DueToday,
        locale: Locale::En,
        merchant: "Sita's Shop",
        amount_paisa: 250_000,
        due: chrono::NaiveDate::from_ymd_opt(2024, 4, 13).unwrap_or_default(),
        pay_url: "https://pay.example/r/x1",
        invoice_number: "INV-0042",
    }
}

async fn tenant(app: &TestApp) -> Tenant {
    let t = app.tenant("Sita's Shop", "sita@example.com").await;
    Tenant::new(t.project.id.clone(), Mode::Live)
}

async fn send(app: &TestApp, t: &Tenant, to: &str, occurrence: &str) -> MailId {
    let about = MailAbout::BillingInvoice(BillingInvoiceId::new());
    match mail::send_billing_mail(app.state(), t, to, &template(), about, occurrence).await {
        Ok(id) => id,
        Err(e) => panic!("{e}"),
    }
}

/// The simulator's inbox and its send calls.
async fn inbox(app: &TestApp) -> (Vec<Value>, u64) {
    let a = app.get("/sim/mail/_control/messages", None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    (
        a.body["messages"].as_array().cloned().unwrap_or_default(),
        a.body["send_calls"].as_u64().unwrap_or(0),
    )
}

/// Polls (up to 15 s) until `done` holds.
async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..150 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}")
}

async fn status(app: &TestApp, id: &MailId) -> Option<MailStatus> {
    mail::get(&*app.store, id)
        .await
        .ok()
        .flatten()
        .map(|m| m.status)
}

/// The sender the gateway's worker uses (the simulator).
fn simulator_sender(app: &TestApp) -> MailSender {
    let Ok(config) = MailConfig::from_lookup(|_| None) else {
        panic!("config")
    };
    match HttpSender::new(config, app.url("/sim/mail")) {
        Ok(s) => MailSender::Http(s),
        Err(e) => panic!("{e}"),
    }
}

/// An SQS batch of `bodies`, as the mail queue's trigger delivers it.
fn batch(bodies: &[String]) -> aws_lambda_events::sqs::SqsEvent {
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            json!({"messageId": format!("m{i}"), "receiptHandle": format!("r{i}"), "body": body,
                   "attributes": {"ApproximateReceiveCount": "2"}, "messageAttributes": {},
                   "eventSource": "aws:sqs", "awsRegion": "ap-south-1",
                   "eventSourceARN": "arn:aws:sqs:ap-south-1:123456789012:dhukuti-mail"})
        })
        .collect();
    match serde_json::from_value(json!({ "Records": records })) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    }
}

async fn a_billing_mail_reaches_the_inbox_exactly_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = tenant(&app).await;
    let id = send(&app, &t, "Ram@Example.com", "inv_1:due_today").await;
    // The sweep retried: the same occurrence, the same message.
    assert_eq!(
        send(&app, &t, "ram@example.com", "inv_1:due_today").await,
        id
    );
    until("the message sent", || async {
        status(&app, &id).await == Some(MailStatus::Sent)
    })
    .await;
    let (messages, calls) = inbox(&app).await;
    assert_eq!((messages.len(), calls), (1, 1), "{messages:?}");
    let m = &messages[0];
    assert_eq!(m["to"], "ram@example.com");
    assert_eq!(m["subject"], "Sita's Shop: invoice INV-0042 is due today");
    let text = m["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("2024-04-13") && text.contains("2081"),
        "{text}"
    );
    assert!(
        m["html"]
            .as_str()
            .unwrap_or_default()
            .contains("Sita&#39;s Shop")
    );
    assert_eq!(m["tags"]["dhukuti_mail"], id.as_str());

    // A retried batch (the same message three times, as SQS may deliver
    // it after a lost delete): nothing is sent again.
    let body = json!({"mail_id": id.as_str()}).to_string();
    let sender = simulator_sender(&app);
    let response = mail_dispatcher::handle(
        app.state(),
        &sender,
        batch(&[body.clone(), body.clone(), body]),
    )
    .await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let (messages, calls) = inbox(&app).await;
    assert_eq!((messages.len(), calls), (1, 1), "{messages:?}");
    let Ok(listed) = mail::list_recent(&*app.store, &t, 10).await else {
        panic!("list")
    };
    assert_eq!(listed.len(), 1);
    app.stop().await;
}

async fn a_bounce_suppresses_the_address_for_the_project(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = tenant(&app).await;
    let id = send(&app, &t, "gone@example.com", "first").await;
    until("the message sent", || async {
        status(&app, &id).await == Some(MailStatus::Sent)
    })
    .await;
    let a = app
        .post(
            "/sim/mail/_control/bounce",
            None,
            None,
            &json!({"address": "gone@example.com"}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let inner: Value =
        serde_json::from_str(a.body["notification"]["Message"].as_str().unwrap_or(""))
            .unwrap_or(Value::Null);
    assert_eq!(inner["eventType"], "Bounce", "{}", a.body);
    until("the address suppressed", || async {
        mail::is_suppressed(&*app.store, &t.project, "gone@example.com")
            .await
            .unwrap_or(false)
    })
    .await;
    let next = send(&app, &t, "gone@example.com", "second").await;
    assert_eq!(status(&app, &next).await, Some(MailStatus::Suppressed));
    // A complaint about another address suppresses it too.
    let other = send(&app, &t, "angry@example.com", "third").await;
    until("the message sent", || async {
        status(&app, &other).await == Some(MailStatus::Sent)
    })
    .await;
    let a = app
        .post(
            "/sim/mail/_control/bounce",
            None,
            None,
            &json!({"address": "angry@example.com", "type": "complaint"}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    until("the complainer suppressed", || async {
        mail::is_suppressed(&*app.store, &t.project, "angry@example.com")
            .await
            .unwrap_or(false)
    })
    .await;
    let (messages, calls) = inbox(&app).await;
    assert_eq!((messages.len(), calls), (2, 2), "{messages:?}");
    // Bad control input is refused; an address never mailed is unknown.
    let a = app
        .post(
            "/sim/mail/_control/bounce",
            None,
            None,
            &json!({"address": "nobody@example.com"}),
        )
        .await;
    assert_eq!(a.status, 404, "{}", a.body);
    app.stop().await;
}

async fn an_uncertain_send_ends_unknown_and_is_never_resent(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app
        .post(
            "/sim/mail/_control/fail",
            None,
            None,
            &json!({"times": 1, "status": 502}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let t = tenant(&app).await;
    let id = send(&app, &t, "ram@example.com", "maybe").await;
    until("the message unknown", || async {
        status(&app, &id).await == Some(MailStatus::Unknown)
    })
    .await;
    let sender = simulator_sender(&app);
    let again = mail::handle_message(
        app.state(),
        &sender,
        &json!({"mail_id": id.as_str()}).to_string(),
    )
    .await;
    assert!(matches!(again, Ok(DispatchOutcome::Skipped)), "{again:?}");
    let (messages, calls) = inbox(&app).await;
    assert_eq!((messages.len(), calls), (0, 1), "{messages:?}");
    app.stop().await;
}

async fn a_503_is_retried_and_delivers_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app
        .post(
            "/sim/mail/_control/fail",
            None,
            None,
            &json!({"times": 2, "status": 503}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let t = tenant(&app).await;
    let id = send(&app, &t, "ram@example.com", "flaky").await;
    until("the message sent", || async {
        status(&app, &id).await == Some(MailStatus::Sent)
    })
    .await;
    let (messages, calls) = inbox(&app).await;
    assert_eq!((messages.len(), calls), (1, 3), "{messages:?}");
    let Ok(Some(m)) = mail::get(&*app.store, &id).await else {
        panic!("stored")
    };
    assert_eq!(m.attempts, 3);
    app.stop().await;
}

on_both_backends!(
    a_billing_mail_reaches_the_inbox_exactly_once,
    a_bounce_suppresses_the_address_for_the_project,
    an_uncertain_send_ends_unknown_and_is_never_resent,
    a_503_is_retried_and_delivers_once,
);

/// The SES v2 sender against moto, through the dispatcher: a sender
/// identity SES has not verified is refused (the message ends `failed`,
/// never retried); once verified (moto requires it, as SES does), the
/// message is sent and its SES message id recorded. The store and queue
/// are in-process: nothing else consumes the queue here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ses_sender_sends_through_moto_once_verified() {
    let Some(endpoint) = shared::queue::testkit::aws_endpoint() else {
        return;
    };
    let Ok(sdk) = shared::aws::sdk_config(Some(&endpoint)) else {
        panic!("sdk config")
    };
    let from = format!("billing-{}@dhukuti.example", &MailId::new()[5..]);
    let Ok(config) = MailConfig::from_lookup(|n| (n == "DHUKUTI_MAIL_FROM").then(|| from.clone()))
    else {
        panic!("config")
    };
    let ses = match MailSender::new(config, &sdk) {
        Ok(MailSender::Ses(s)) => s,
        other => panic!("not SES: {other:?}"),
    };
    let sender = MailSender::Ses(ses.clone());
    assert!(sender.sandbox_needs_verified());
    let state = shared::AppState::for_tests();
    let t = Tenant::new(shared::ids::ProjectId::new(), Mode::Live);
    let about = || MailAbout::BillingInvoice(BillingInvoiceId::new());
    let dispatch = |id: &MailId| {
        let body = json!({"mail_id": id.as_str()}).to_string();
        let (state, sender) = (state.clone(), sender.clone());
        async move { mail::handle_message(&state, &sender, &body).await }
    };
    let stored = |id: MailId| {
        let state = state.clone();
        async move {
            match mail::get(&*state.store, &id).await {
                Ok(Some(m)) => m,
                other => panic!("{other:?}"),
            }
        }
    };
    let Ok(refused) =
        mail::send_billing_mail(&state, &t, "ram@example.com", &template(), about(), "a").await
    else {
        panic!("send")
    };
    let out = dispatch(&refused).await;
    assert!(matches!(out, Ok(DispatchOutcome::Failed)), "{out:?}");
    let m = stored(refused.clone()).await;
    assert_eq!(m.status, MailStatus::Failed);
    assert!(m.last_error.unwrap_or_default().contains("rejected"));

    let verified = ses
        .client()
        .create_email_identity()
        .email_identity(&from)
        .send()
        .await;
    assert!(verified.is_ok(), "{verified:?}");
    let Ok(id) =
        mail::send_billing_mail(&state, &t, "ram@example.com", &template(), about(), "b").await
    else {
        panic!("send")
    };
    let out = dispatch(&id).await;
    assert!(matches!(out, Ok(DispatchOutcome::Sent)), "{out:?}");
    let m = stored(id.clone()).await;
    assert_eq!(m.status, MailStatus::Sent);
    assert!(m.provider_message_id.is_some_and(|p| !p.is_empty()));
    // Delivered again: nothing sent twice.
    let out = dispatch(&id).await;
    assert!(matches!(out, Ok(DispatchOutcome::Skipped)), "{out:?}");
}
