use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};

use super::dispatch::dispatch;
use super::*;
use crate::AppState;
use crate::domain::billing::reminders::{Locale, ReminderKind, ReminderText};
use crate::domain::record::Record;
use crate::domain::{Mode, Tenant};
use crate::ids::{BillingInvoiceId, MailId, ProjectId};
use crate::providers::mail::{HttpSender, MailConfig, MailSender};
use crate::queue::QueueName;
use crate::time::{Clock, ManualClock, SystemClock};

/// A mail endpoint: records each call; answers the scripted statuses
/// first (a 0 never answers), then 200.
#[derive(Clone, Default)]
struct Endpoint {
    calls: Arc<Mutex<Vec<Value>>>,
    script: Arc<Mutex<VecDeque<u16>>>,
}

impl Endpoint {
    fn calls(&self) -> Vec<Value> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn script(&self, statuses: &[u16]) {
        if let Ok(mut s) = self.script.lock() {
            s.extend(statuses);
        }
    }
}

async fn take(State(e): State<Endpoint>, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    let next = e.script.lock().ok().and_then(|mut s| s.pop_front());
    if let Ok(mut c) = e.calls.lock() {
        c.push(body);
    }
    match next {
        Some(0) => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            (StatusCode::OK, Json(json!({})))
        }
        Some(s) => (
            StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(json!({"error": "scripted"})),
        ),
        None => (StatusCode::OK, Json(json!({"messageId": "sim-1"}))),
    }
}

async fn endpoint() -> (Endpoint, String) {
    let e = Endpoint::default();
    let app = axum::Router::new()
        .route("/send", post(take))
        .with_state(e.clone());
    let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
        panic!("bind")
    };
    let Ok(addr) = listener.local_addr() else {
        panic!("addr")
    };
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (e, format!("http://{addr}"))
}

fn sender(base: &str, verified_only: bool) -> MailSender {
    let Ok(mut config) = MailConfig::from_lookup(|_| None) else {
        panic!("config")
    };
    config.timeout = Duration::from_millis(400);
    match HttpSender::new(config, base.to_owned()) {
        Ok(s) => MailSender::Http(s.sandbox_verified_only(verified_only)),
        Err(e) => panic!("{e}"),
    }
}

fn tenant(mode: Mode) -> Tenant {
    Tenant::new(ProjectId::new(), mode)
}

fn template() -> ReminderText<'static> {
    ReminderText {
        kind: ReminderKind::BeforeDue,
        locale: Locale::En,
        merchant: "Himal Tea <Shop>",
        amount_paisa: 150_000,
        due: chrono::NaiveDate::from_ymd_opt(2024, 7, 30).unwrap_or_default(),
        pay_url: "https://pay.example/r/abc",
        invoice_number: "INV-0001",
    }
}

fn invoice() -> MailAbout {
    MailAbout::BillingInvoice(BillingInvoiceId::new())
}

async fn send(state: &AppState, t: &Tenant, to: &str, occurrence: &str) -> MailId {
    match send_billing_mail(state, t, to, &template(), invoice(), occurrence).await {
        Ok(id) => id,
        Err(e) => panic!("{e}"),
    }
}

async fn stored(state: &AppState, id: &MailId) -> MailMessage {
    match get(&*state.store, id).await {
        Ok(Some(m)) => m,
        other => panic!("{other:?}"),
    }
}

/// The queue's messages, taken (each deleted).
async fn drain(state: &AppState) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let Ok(batch) = state
            .queue
            .receive(QueueName::Mail, 10, Duration::ZERO, Duration::from_secs(30))
            .await
        else {
            panic!("receive")
        };
        if batch.is_empty() {
            return out;
        }
        for m in batch {
            let _ = state.queue.delete(QueueName::Mail, &m.receipt).await;
            out.push(m.body);
        }
    }
}

#[test]
fn addresses_are_checked_and_lowercased() {
    assert_eq!(
        normalize_address("  Ram.Bahadur@Example.COM "),
        Some("ram.bahadur@example.com".into())
    );
    for bad in [
        "",
        "ram",
        "ram@",
        "@example.com",
        "ram@example",
        "ram bahadur@example.com",
        "a@b@example.com",
        "<ram@example.com>",
        "ram@-x.com",
    ] {
        assert_eq!(normalize_address(bad), None, "{bad}");
    }
    assert!(!is_address(&format!("{}@example.com", "a".repeat(65))));
}

#[test]
fn the_billing_mail_escapes_its_html_and_shows_the_miti() {
    let Some(m) = render_billing_mail(&template()) else {
        panic!("render")
    };
    assert_eq!(m.subject, "Himal Tea <Shop>: invoice INV-0001 is due soon");
    assert!(m.text.contains("2024-07-30"), "{}", m.text);
    assert!(m.text.contains("2081"), "the BS year: {}", m.text);
    assert!(m.html.contains("Himal Tea &lt;Shop&gt;"), "{}", m.html);
    assert!(!m.html.contains("<Shop>"), "{}", m.html);
    assert!(
        m.html.contains("<a href=\"https://pay.example/r/abc\">"),
        "{}",
        m.html
    );
    let ne = ReminderText {
        locale: Locale::Ne,
        ..template()
    };
    let Some(n) = render_billing_mail(&ne) else {
        panic!("render ne")
    };
    assert!(n.html.contains("lang=\"ne\""));
    assert!(n.text.contains("२०८१"), "{}", n.text);
}

#[tokio::test]
async fn one_occurrence_stores_one_message_however_often_it_is_sent() {
    let state = AppState::for_tests();
    let t = tenant(Mode::Live);
    let first = send(&state, &t, "Ram@Example.com", "inv_1:before_due").await;
    let again = send(&state, &t, "ram@example.com", "inv_1:before_due").await;
    assert_eq!(first, again);
    let other = send(&state, &t, "ram@example.com", "inv_1:due_today").await;
    assert_ne!(first, other);
    let Ok(listed) = list_recent(&*state.store, &t, 10).await else {
        panic!("list")
    };
    assert_eq!(listed.len(), 2);
    let m = stored(&state, &first).await;
    assert_eq!(m.status, MailStatus::Queued);
    assert_eq!(m.to, "ram@example.com");
    assert_eq!(m.kind, "before_due");
    assert!(m.invoice_id.is_some());
    // The retry queued the still-queued message again: harmless.
    let bodies = drain(&state).await;
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    // The same key in another project is another occurrence.
    let elsewhere = send(
        &state,
        &tenant(Mode::Live),
        "ram@example.com",
        "inv_1:before_due",
    )
    .await;
    assert_ne!(elsewhere, first);
}

#[tokio::test]
async fn concurrent_sends_of_one_occurrence_store_one_message() {
    let state = AppState::for_tests();
    let t = tenant(Mode::Live);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (state, t) = (state.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            send_billing_mail(&state, &t, "ram@example.com", &template(), invoice(), "occ").await
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(id)) => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let Ok(listed) = list_recent(&*state.store, &t, 10).await else {
        panic!("list")
    };
    assert_eq!(listed.len(), 1);
}

#[tokio::test]
async fn bad_input_names_the_field() {
    let state = AppState::for_tests();
    let t = tenant(Mode::Live);
    let bad = send_billing_mail(&state, &t, "nope", &template(), invoice(), "k").await;
    assert!(
        matches!(
            bad,
            Err(MailError::Invalid {
                field: "recipient",
                ..
            })
        ),
        "{bad:?}"
    );
    let long = "k".repeat(MAX_OCCURRENCE + 1);
    let bad = send_billing_mail(&state, &t, "a@example.com", &template(), invoice(), &long).await;
    assert!(
        matches!(
            bad,
            Err(MailError::Invalid {
                field: "occurrence",
                ..
            })
        ),
        "{bad:?}"
    );
}

#[tokio::test]
async fn a_message_is_sent_once_however_often_it_is_dispatched() {
    let state = AppState::for_tests();
    let (server, base) = endpoint().await;
    let s = sender(&base, false);
    let t = tenant(Mode::Live);
    let id = send(&state, &t, "ram@example.com", "occ").await;
    let bodies = drain(&state).await;
    assert_eq!(bodies.len(), 1);
    let first = handle_message(&state, &s, &bodies[0]).await;
    assert!(matches!(first, Ok(DispatchOutcome::Sent)), "{first:?}");
    // The same queue message again (SQS delivers at least once).
    let again = handle_message(&state, &s, &bodies[0]).await;
    assert!(matches!(again, Ok(DispatchOutcome::Skipped)), "{again:?}");
    let calls = server.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["to"], "ram@example.com");
    assert_eq!(calls[0]["tags"]["dhukuti_mail"], id.as_str());
    let m = stored(&state, &id).await;
    assert_eq!(m.status, MailStatus::Sent);
    assert_eq!(m.attempts, 1);
    assert_eq!(m.provider_message_id.as_deref(), Some("sim-1"));
    assert_eq!(m.claim, None);
}

#[tokio::test]
async fn concurrent_dispatches_send_once() {
    let state = AppState::for_tests();
    let (server, base) = endpoint().await;
    let s = sender(&base, false);
    let id = send(&state, &tenant(Mode::Live), "ram@example.com", "occ").await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (state, s, id) = (state.clone(), s.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            dispatch(&state, &s, &id, LEASE).await
        }));
    }
    let mut sent = 0;
    for task in tasks {
        match task.await {
            Ok(Ok(DispatchOutcome::Sent)) => sent += 1,
            Ok(Ok(DispatchOutcome::Skipped)) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sent, 1);
    assert_eq!(server.calls().len(), 1);
}

#[tokio::test]
async fn an_uncertain_send_ends_unknown_and_is_never_resent() {
    let state = AppState::for_tests();
    let (server, base) = endpoint().await;
    let s = sender(&base, false);
    for (script, why) in [(500u16, "a 5xx"), (0, "a timeout")] {
        server.script(&[script]);
        let before = server.calls().len();
        let id = send(&state, &tenant(Mode::Live), "ram@example.com", why).await;
        let out = dispatch(&state, &s, &id, LEASE).await;
        assert!(
            matches!(out, Ok(DispatchOutcome::Unknown)),
            "{why}: {out:?}"
        );
        let m = stored(&state, &id).await;
        assert_eq!(m.status, MailStatus::Unknown, "{why}");
        // A retried batch: nothing is sent again.
        let out = dispatch(&state, &s, &id, LEASE).await;
        assert!(
            matches!(out, Ok(DispatchOutcome::Skipped)),
            "{why}: {out:?}"
        );
        assert_eq!(server.calls().len(), before + 1, "{why}");
    }
}

#[tokio::test]
async fn a_send_that_certainly_failed_is_retried_until_the_last_attempt() {
    let state = AppState::for_tests();
    let (server, base) = endpoint().await;
    let s = sender(&base, false);
    server.script(&[503]);
    let id = send(&state, &tenant(Mode::Live), "ram@example.com", "occ").await;
    let out = dispatch(&state, &s, &id, LEASE).await;
    assert!(matches!(out, Err(DispatchError::Transient(_))), "{out:?}");
    let m = stored(&state, &id).await;
    assert_eq!((m.status, m.attempts), (MailStatus::Queued, 1));
    let out = dispatch(&state, &s, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Sent)), "{out:?}");
    assert_eq!(stored(&state, &id).await.attempts, 2);
    // Refused: final. Out of attempts: final.
    server.script(&[400]);
    let id = send(&state, &tenant(Mode::Live), "ram@example.com", "refused").await;
    let out = dispatch(&state, &s, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Failed)), "{out:?}");
    server.script(&[503; MAX_ATTEMPTS as usize]);
    let id = send(&state, &tenant(Mode::Live), "ram@example.com", "flaky").await;
    for _ in 1..MAX_ATTEMPTS {
        let out = dispatch(&state, &s, &id, LEASE).await;
        assert!(matches!(out, Err(DispatchError::Transient(_))), "{out:?}");
    }
    let out = dispatch(&state, &s, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Failed)), "{out:?}");
    assert_eq!(stored(&state, &id).await.status, MailStatus::Failed);
}

#[tokio::test]
async fn a_claim_whose_lease_ran_out_ends_unknown_unsent() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let state = state_on(clock.clone());
    let (server, base) = endpoint().await;
    let s = sender(&base, false);
    let id = send(&state, &tenant(Mode::Live), "ram@example.com", "occ").await;
    // A dispatcher claims it and stops before recording anything.
    let m = stored(&state, &id).await;
    let now = state.clock.now().unix_millis();
    let Ok(Some(_)) = dispatch::claim(&*state.store, &m, Duration::from_secs(1), now).await else {
        panic!("claim")
    };
    let out = dispatch(&state, &s, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Skipped)), "held: {out:?}");
    clock.advance(chrono::Duration::seconds(2));
    let out = dispatch(&state, &s, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Unknown)), "{out:?}");
    assert_eq!(stored(&state, &id).await.status, MailStatus::Unknown);
    assert!(server.calls().is_empty());
}

/// A state on a clock the test moves.
fn state_on(clock: Arc<ManualClock>) -> AppState {
    let store = match crate::store::embedded::EmbeddedStore::in_memory() {
        Ok(s) => s,
        Err(e) => panic!("in-memory store: {e}"),
    };
    AppState::new(
        Arc::new(store),
        clock,
        crate::Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn bounce(mail_id: &MailId, address: &str, bounce_type: &str) -> String {
    let event = json!({
        "eventType": "Bounce",
        "bounce": {
            "bounceType": bounce_type,
            "bounceSubType": "General",
            "bouncedRecipients": [{"emailAddress": address, "action": "failed", "status": "5.1.1"}],
            "timestamp": "2026-11-29T04:00:00.000Z",
            "feedbackId": "0100018c-feedback"
        },
        "mail": {
            "timestamp": "2026-11-29T03:59:59.000Z",
            "source": "billing@dhukuti.example",
            "messageId": "0100018c-message",
            "destination": [address],
            "tags": {"dhukuti_mail": [mail_id.as_str()], "ses:configuration-set": ["dhukuti"]}
        }
    });
    json!({
        "Type": "Notification",
        "MessageId": "2d5c-sns",
        "TopicArn": "arn:aws:sns:ap-south-1:123456789012:dhukuti-mail-feedback",
        "Message": event.to_string(),
        "Timestamp": "2026-11-29T04:00:01.000Z",
        "SignatureVersion": "1"
    })
    .to_string()
}

#[tokio::test]
async fn a_permanent_bounce_or_a_complaint_suppresses_the_address_for_its_project() {
    let state = AppState::for_tests();
    let (server, base) = endpoint().await;
    let s = sender(&base, false);
    let t = tenant(Mode::Live);
    let id = send(&state, &t, "ram@example.com", "first").await;
    let _ = drain(&state).await;
    let Ok(DispatchOutcome::Sent) = dispatch(&state, &s, &id, LEASE).await else {
        panic!("sent")
    };
    // A transient bounce (a full inbox) suppresses nothing.
    let out = handle_message(&state, &s, &bounce(&id, "ram@example.com", "Transient")).await;
    assert!(
        matches!(
            out,
            Ok(DispatchOutcome::Feedback(FeedbackOutcome::Ignored(_)))
        ),
        "{out:?}"
    );
    let out = handle_message(&state, &s, &bounce(&id, "Ram@Example.com", "Permanent")).await;
    assert!(
        matches!(&out, Ok(DispatchOutcome::Feedback(FeedbackOutcome::Suppressed(a))) if a == &["ram@example.com".to_owned()]),
        "{out:?}"
    );
    assert!(matches!(
        is_suppressed(&*state.store, &t.project, "ram@example.com").await,
        Ok(true)
    ));
    // Another project still mails the address.
    assert!(matches!(
        is_suppressed(&*state.store, &ProjectId::new(), "ram@example.com").await,
        Ok(false)
    ));
    // A new message to it is stored suppressed and never queued.
    let next = send(&state, &t, "ram@example.com", "second").await;
    assert_eq!(stored(&state, &next).await.status, MailStatus::Suppressed);
    assert!(drain(&state).await.is_empty());
    // One queued before the bounce is not sent either.
    let sita = send(&state, &t, "sita@example.com", "third").await;
    let complaint = json!({
        "notificationType": "Complaint",
        "complaint": {"complainedRecipients": [{"emailAddress": "sita@example.com"}], "complaintFeedbackType": "abuse"},
        "mail": {"messageId": "x", "tags": {"dhukuti_mail": [sita.as_str()]}}
    });
    let out = handle_message(&state, &s, &complaint.to_string()).await;
    assert!(
        matches!(
            out,
            Ok(DispatchOutcome::Feedback(FeedbackOutcome::Suppressed(_)))
        ),
        "{out:?}"
    );
    let out = dispatch(&state, &s, &sita, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Suppressed)), "{out:?}");
    assert_eq!(server.calls().len(), 1);
    // A notification about no message of ours does nothing.
    let out = handle_message(
        &state,
        &s,
        &bounce(&MailId::new(), "x@example.com", "Permanent"),
    )
    .await;
    assert!(
        matches!(
            out,
            Ok(DispatchOutcome::Feedback(FeedbackOutcome::Ignored(_)))
        ),
        "{out:?}"
    );
}

#[tokio::test]
async fn sandbox_mail_through_a_real_sender_goes_only_to_verified_addresses() {
    let state = AppState::for_tests();
    let (server, base) = endpoint().await;
    let real = sender(&base, true);
    let t = tenant(Mode::Sandbox);
    let id = send(&state, &t, "customer@example.com", "a").await;
    let out = dispatch(&state, &real, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Suppressed)), "{out:?}");
    let Ok(()) = verify_address(&state, &t.project, "Owner@Example.com").await else {
        panic!("verify")
    };
    let id = send(&state, &t, "owner@example.com", "b").await;
    let out = dispatch(&state, &real, &id, LEASE).await;
    assert!(matches!(out, Ok(DispatchOutcome::Sent)), "{out:?}");
    // Live mail goes to anyone not suppressed; the simulator takes all.
    let live = send(&state, &tenant(Mode::Live), "customer@example.com", "c").await;
    assert!(matches!(
        dispatch(&state, &real, &live, LEASE).await,
        Ok(DispatchOutcome::Sent)
    ));
    let sim = sender(&base, false);
    let sandbox = send(&state, &t, "customer@example.com", "d").await;
    assert!(matches!(
        dispatch(&state, &sim, &sandbox, LEASE).await,
        Ok(DispatchOutcome::Sent)
    ));
    assert_eq!(server.calls().len(), 3);
}

#[tokio::test]
async fn malformed_messages_are_dropped() {
    let state = AppState::for_tests();
    let s = sender("http://127.0.0.1:9", false);
    for body in [
        "not json",
        "{}",
        r#"{"mail_id": "mail_01jzzzzzzzzzzzzzzzzzzzzzzz"}"#,
        r#"{"Type":"Notification","Message":"nope"}"#,
    ] {
        let out = handle_message(&state, &s, body).await;
        assert!(
            matches!(
                out,
                Ok(DispatchOutcome::Skipped | DispatchOutcome::Feedback(_))
            ),
            "{body}: {out:?}"
        );
    }
}

#[test]
fn stored_records_have_their_keys() {
    let p = ProjectId::stored("proj_x");
    let s = MailSuppression {
        project_id: p.clone(),
        address: "a@example.com".into(),
        reason: SuppressReason::Bounce,
        mail_id: None,
        created_at: crate::time::Timestamp::from_unix_millis(0).unwrap_or_else(|| panic!("ts")),
    };
    assert_eq!(s.item_key().pk, "MAILSUP#proj_x");
    assert_eq!(s.item_key().sk, "A#a@example.com");
    assert_eq!(
        MailMessage::key(&MailId::stored("mail_1")).pk,
        "MAIL#mail_1"
    );
}
