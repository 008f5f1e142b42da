//! The notices pass on the store (embedded, and DynamoDB through moto when
//! `DHUKUTI_TEST_AWS_ENDPOINT` is set).

use std::sync::Arc;

use chrono::Duration;

use super::*;
use crate::domain::account::{self, Plan};
use crate::domain::billing::customers::{self, CreateCustomer, Customer};
use crate::domain::billing::dunning::{self, DunningStatus, FinalAction};
use crate::domain::billing::invoice::{self, BillingInvoice, InvoiceStatus, PeriodClaim};
use crate::domain::billing::notice_due::{
    NoticeChannel, NoticeKind, NoticeOutcome, NoticeSchedule,
};
use crate::domain::billing::subscription::{
    self, NewSubscription, Subscription, SubscriptionStatus as S, new_subscription,
};
use crate::domain::billing::terms::{Terms, monthly};
use crate::domain::billing::{sweep, test_clock};
use crate::domain::record::{self as rec, Record};
use crate::domain::{Mode, Tenant};
use crate::store::Store;
use crate::testenv::at;
use crate::time::{Clock, ManualClock, Timestamp};
use crate::{AppState, Config};

async fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    let mut out: Vec<(&'static str, Arc<dyn Store>)> =
        vec![("embedded", crate::testenv::memory_store())];
    if let Some(endpoint) = crate::queue::testkit::aws_endpoint() {
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "ap-south-1".into());
        let client = crate::store::dynamo::client_for_endpoint(&endpoint, &region);
        let table = format!("dhukuti-test-{}", ulid::Ulid::new());
        crate::store::dynamo::create_table(&client, &table)
            .await
            .unwrap_or_else(|e| panic!("create table {table}: {e}"));
        out.push((
            "dynamodb",
            Arc::new(crate::store::dynamo::DynamoStore::new(client, table)),
        ));
    }
    out
}

struct World {
    deps: AppState,
    clock: Arc<ManualClock>,
    tenant: Tenant,
    customer: Customer,
}

impl World {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn set(&self, t: Timestamp) {
        let d = t.unix_millis() - self.now().unix_millis();
        self.clock.advance(Duration::milliseconds(d));
    }
}

/// A sandbox project with a customer reachable by SMS and email, at `t0`.
async fn world(store: Arc<dyn Store>, t0: Timestamp) -> World {
    let clock = Arc::new(ManualClock::new(t0));
    let deps = AppState::new(
        store.clone(),
        clock.clone(),
        Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let merchant =
        account::create_merchant(&*store, t0, "Himal Net", "m@example.com", Plan::Growth)
            .await
            .unwrap();
    let project = account::create_project(&*store, t0, &merchant, "Shop", false)
        .await
        .unwrap();
    let tenant = Tenant::new(project.id.clone(), Mode::Sandbox);
    let customer = customers::create(
        &deps,
        &tenant,
        CreateCustomer {
            name: "Sita".into(),
            email: Some("sita@example.com".into()),
            phone: Some("9841000001".into()),
            external_customer_id: None,
            metadata: None,
            locale: None,
            test_clock_id: None,
        },
        None,
    )
    .await
    .unwrap();
    World {
        deps,
        clock,
        tenant,
        customer,
    }
}

/// A subscription of the world's customer, trial ending at `trial_end`.
async fn subscribe(
    w: &World,
    terms: Terms,
    trial_end: Timestamp,
    clock: Option<crate::ids::TestClockId>,
    policy: Option<crate::ids::DunningPolicyId>,
) -> Subscription {
    let input = NewSubscription {
        customer_id: w.customer.id.clone(),
        plan_id: "bp_1".into(),
        terms,
        reference_id: None,
        metadata: serde_json::Map::new(),
        start: w.now(),
        trial_ends_at: Some(trial_end),
        billing_anchor_day: None,
        dunning_policy_id: policy,
        test_clock_id: clock,
    };
    let sub = new_subscription(&w.tenant, input, w.now()).unwrap();
    subscription::create(&w.deps, &sub).await.unwrap();
    sub
}

async fn invoices(w: &World, sub: &Subscription) -> Vec<BillingInvoice> {
    let sub = subscription::get(&w.deps, &w.tenant, &sub.id)
        .await
        .unwrap();
    let mut out = Vec::new();
    for n in 0..=sub.period_index {
        let Some(p) = sub.period(n) else { continue };
        if let Some(c) =
            rec::get::<PeriodClaim>(&*w.deps.store, &PeriodClaim::key(&sub.id, p.start))
                .await
                .unwrap()
        {
            out.push(
                invoice::get_invoice(&w.deps, &w.tenant, &c.invoice_id)
                    .await
                    .unwrap(),
            );
        }
    }
    out
}

async fn schedule(w: &World, inv: &BillingInvoice) -> NoticeSchedule {
    rec::get::<NoticeSchedule>(&*w.deps.store, &NoticeSchedule::invoice_key(&inv.id))
        .await
        .unwrap()
        .expect("the invoice's schedule is written with it")
}

async fn sms_texts(w: &World) -> Vec<String> {
    crate::domain::sms::list_recent(&*w.deps.store, &w.tenant, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.text)
        .collect()
}

async fn mail_kinds(w: &World) -> Vec<String> {
    crate::domain::mail::list_recent(&*w.deps.store, &w.tenant, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.kind)
        .collect()
}

/// Trial ends 2026-01-17 06:00 UTC (11:45 Nepal): the first invoice is
/// issued then, due that day.
const T0: &str = "2026-01-10T06:00:00Z";
const TRIAL_END: &str = "2026-01-17T06:00:00Z";

#[tokio::test]
async fn the_due_today_notice_goes_by_sms_and_email_once() {
    for (name, store) in stores().await {
        let w = world(store, at(T0)).await;
        let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
        w.set(at(TRIAL_END));
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let inv = invoices(&w, &sub).await.remove(0);
        let s = schedule(&w, &inv).await;
        // Issued at 11:45 Nepal time: its due_today notice is due at once.
        assert_eq!(s.next_at, Some(inv.issued_at), "{name}");
        let report = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(report.sent, 2, "{name}: {report:?}");
        let texts = sms_texts(&w).await;
        assert_eq!(texts.len(), 1, "{name}");
        assert!(texts[0].contains("due today"), "{name}: {}", texts[0]);
        assert!(
            texts[0].contains("https://pay.example/r/"),
            "{name}: the short link"
        );
        assert_eq!(mail_kinds(&w).await, vec!["due_today"], "{name}");
        let s = schedule(&w, &inv).await;
        let channels: Vec<_> = s
            .history
            .iter()
            .map(|e| (e.kind, e.channel, e.outcome))
            .collect();
        assert_eq!(
            channels,
            vec![
                (
                    NoticeKind::DueToday,
                    NoticeChannel::Email,
                    NoticeOutcome::Queued
                ),
                (
                    NoticeKind::DueToday,
                    NoticeChannel::Sms,
                    NoticeOutcome::Logged
                ),
            ],
            "{name}"
        );
        // Next: the overdue notice on the grace end (3 days), at 07:00.
        assert_eq!(s.next_at, Some(at("2026-01-20T01:15:00Z")), "{name}");
        // A retried pass sends nothing twice: nothing is due.
        let again = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(again.sent, 0, "{name}");
        // Even a record run again by hand, as a crashed run would leave it.
        let mut stale = s.clone();
        stale.next_at = Some(inv.issued_at);
        stale.through = None;
        stale.version += 1;
        w.deps
            .store
            .transact(vec![stale.write(Some(s.version)).unwrap()])
            .await
            .unwrap();
        run_one(&w.deps, &stale, w.now()).await.unwrap();
        assert_eq!(sms_texts(&w).await.len(), 1, "{name}: no SMS twice");
        assert_eq!(mail_kinds(&w).await.len(), 1, "{name}: no email twice");
        // The run again records the messages the first run stored.
        let ids = |history: &[crate::domain::billing::notice_due::NoticeEntry]| {
            history
                .iter()
                .map(|e| (e.channel, e.sms_id.clone(), e.mail_id.clone()))
                .collect::<Vec<_>>()
        };
        let first = ids(&s.history);
        assert!(
            first
                .iter()
                .all(|(_, sms, mail)| sms.is_some() || mail.is_some())
        );
        let after = schedule(&w, &inv).await;
        let rerun = ids(&after.history[after.history.len() - first.len()..]);
        assert_eq!(rerun, first, "{name}: the same message ids");
    }
}

#[tokio::test]
async fn two_runs_at_once_send_once() {
    for (name, store) in stores().await {
        let w = world(store, at(T0)).await;
        let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
        w.set(at(TRIAL_END));
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let inv = invoices(&w, &sub).await.remove(0);
        let s = schedule(&w, &inv).await;
        let now = w.now();
        let runs = futures::future::join_all((0..6).map(|_| run_one(&w.deps, &s, now))).await;
        assert!(runs.iter().all(Result::is_ok), "{name}: {runs:?}");
        assert_eq!(sms_texts(&w).await.len(), 1, "{name}");
        assert_eq!(mail_kinds(&w).await.len(), 1, "{name}");
        let s = schedule(&w, &inv).await;
        assert_eq!(
            s.history
                .iter()
                .filter(|e| e.kind == NoticeKind::DueToday)
                .count(),
            2,
            "{name}: one entry per channel"
        );
    }
}

#[tokio::test]
async fn quiet_hours_defer_the_sms_and_never_resend_the_email() {
    for (name, store) in stores().await {
        // The trial ends at 22:00 Nepal time: the invoice is issued then.
        let w = world(store, at(T0)).await;
        let end = at("2026-01-17T16:15:00Z");
        let sub = subscribe(&w, monthly(), end, None, None).await;
        w.set(end);
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let inv = invoices(&w, &sub).await.remove(0);
        let report = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(report.deferred, 1, "{name}: {report:?}");
        assert!(sms_texts(&w).await.is_empty(), "{name}: no SMS at 22:00");
        assert_eq!(mail_kinds(&w).await.len(), 1, "{name}: the email went");
        let s = schedule(&w, &inv).await;
        assert_eq!(s.next_at, Some(at("2026-01-18T01:15:00Z")), "{name}: 07:00");
        assert!(s.history.is_empty(), "{name}");
        w.set(at("2026-01-18T01:15:00Z"));
        let report = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(report.sent, 2, "{name}: {report:?}");
        assert_eq!(sms_texts(&w).await.len(), 1, "{name}");
        assert_eq!(mail_kinds(&w).await.len(), 1, "{name}: not resent");
        let s = schedule(&w, &inv).await;
        assert_eq!(s.history.len(), 2, "{name}");
    }
}

#[tokio::test]
async fn a_rate_limited_sms_waits_and_is_sent_later() {
    let (_, store) = stores().await.remove(0);
    let w = world(store, at(T0)).await;
    let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
    w.set(at(TRIAL_END));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    let inv = invoices(&w, &sub).await.remove(0);
    // Three SMS to the same number today fill the recipient's day.
    for i in 0..3 {
        let claim = crate::domain::billing::notice_due::NoticeSmsClaim {
            project_id: w.tenant.project.clone(),
            mode: w.tenant.mode,
            subscription_id: sub.id.clone(),
            invoice_id: Some(inv.id.clone()),
            occurrence: format!("other#{i}"),
            sms_id: None,
            created_at: w.now(),
        };
        let project = account::get_project(&w.deps, &w.tenant.project)
            .await
            .unwrap()
            .unwrap();
        crate::domain::sms::notify_invoice(
            &w.deps,
            crate::domain::sms::InvoiceSms {
                id: crate::ids::SmsId::new(),
                tenant: w.tenant.clone(),
                merchant_id: project.merchant_id.clone(),
                monthly_quota: 100,
                to: "9841000001".into(),
                text: format!("other {i}"),
                invoice_id: Some(inv.id.clone()),
                claim: claim.put_new().unwrap(),
                limits: crate::domain::sms::Limits::default(),
            },
        )
        .await
        .unwrap();
    }
    let report = pass(&w.deps, w.now(), 100).await.unwrap();
    assert_eq!(report.deferred, 1, "{report:?}");
    let s = schedule(&w, &inv).await;
    let retry = s.next_at.unwrap();
    assert!(retry > w.now() && retry <= w.now().plus(Duration::hours(24)));
    assert_eq!(sms_texts(&w).await.len(), 3);
    w.set(retry.plus(Duration::minutes(1)));
    if crate::domain::billing::reminders::quiet_until(w.now()).is_some() {
        w.set(crate::domain::billing::reminders::quiet_until(w.now()).unwrap());
    }
    pass(&w.deps, w.now(), 100).await.unwrap();
    assert_eq!(
        sms_texts(&w).await.len(),
        4,
        "sent after the wait, not lost"
    );
    assert_eq!(mail_kinds(&w).await.len(), 1);
}

#[tokio::test]
async fn after_an_outage_only_the_latest_due_notice_is_sent() {
    let (_, store) = stores().await.remove(0);
    let w = world(store, at(T0)).await;
    let mut terms = monthly();
    terms.overdue_action = crate::domain::billing::terms::OverdueAction::KeepActive;
    let sub = subscribe(&w, terms, at(TRIAL_END), None, None).await;
    w.set(at(TRIAL_END));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    let inv = invoices(&w, &sub).await.remove(0);
    // Nothing runs for five days: due today (17th), overdue (20th) and
    // its repeat (22nd) are due; only the repeat is sent.
    w.set(at("2026-01-22T05:00:00Z"));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    let report = pass(&w.deps, w.now(), 100).await.unwrap();
    assert_eq!((report.sent, report.skipped), (2, 2), "{report:?}");
    let s = schedule(&w, &inv).await;
    let kinds: Vec<_> = s
        .history
        .iter()
        .map(|e| (e.kind, e.day.to_string(), e.outcome))
        .collect();
    assert_eq!(
        kinds[0],
        (
            NoticeKind::DueToday,
            "2026-01-17".into(),
            NoticeOutcome::Skipped
        )
    );
    assert_eq!(
        kinds[1],
        (
            NoticeKind::Overdue,
            "2026-01-20".into(),
            NoticeOutcome::Skipped
        )
    );
    assert_eq!(kinds[2].0, NoticeKind::Overdue);
    assert_eq!(kinds[2].1, "2026-01-22");
    assert_eq!(sms_texts(&w).await.len(), 1);
    assert_eq!(s.next_at, Some(at("2026-01-24T01:15:00Z")));
}

async fn policy(w: &World, intervals: &[i64], action: FinalAction) -> crate::ids::DunningPolicyId {
    let p = dunning::new_policy(&w.tenant, "Standard", intervals, action, w.now()).unwrap();
    dunning::create_policy(&w.deps, &p, true).await.unwrap().id
}

/// A test clock run from T0 to `to`, to the end.
async fn run_clock(w: &World, clock: &crate::ids::TestClockId, to: Timestamp) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let r = clock::run(&w.deps, clock, to, deadline).await.unwrap();
    assert!(r.done);
}

#[tokio::test]
async fn on_a_clock_the_final_action_comes_before_the_next_invoice() {
    for (name, store) in stores().await {
        for action in FinalAction::ALL {
            let w = world(store.clone(), at(T0)).await;
            let clock = test_clock::create(&w.deps, &w.tenant, "c", at(T0), at(T0))
                .await
                .unwrap();
            // Dunning 2 and 5 days after the grace end (Jan 20): the final
            // action on Jan 25, before the next period (Feb 17).
            policy(&w, &[2, 5], action).await;
            let sub = subscribe(&w, monthly(), at(TRIAL_END), Some(clock.id.clone()), None).await;
            run_clock(&w, &clock.id, at("2026-02-20T00:00:00Z")).await;
            let invs = invoices(&w, &sub).await;
            let s = subscription::get(&w.deps, &w.tenant, &sub.id)
                .await
                .unwrap();
            let inv = &invs[0];
            let sched = schedule(&w, inv).await;
            let kinds: Vec<_> = sched
                .history
                .iter()
                .filter(|e| e.channel == NoticeChannel::Sms)
                .map(|e| (e.kind, e.day.to_string()))
                .collect();
            assert_eq!(
                kinds,
                vec![
                    (NoticeKind::DueToday, "2026-01-17".into()),
                    (NoticeKind::Overdue, "2026-01-20".into()),
                    (NoticeKind::Dunning, "2026-01-22".into()),
                    (NoticeKind::Dunning, "2026-01-25".into()),
                ],
                "{name} {action:?}"
            );
            assert!(
                sched.next_at.is_none(),
                "{name} {action:?}: out of the index"
            );
            let state = dunning::dunning_state(&w.deps, &w.tenant, &inv.id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(state.status, DunningStatus::Exhausted, "{name} {action:?}");
            assert_eq!(state.attempts.len(), 4, "{name}: 2 intervals x 2 channels");
            let events = crate::domain::outbox::recent(&*w.deps.store, &w.tenant, 100)
                .await
                .unwrap();
            let count = |t: &str| events.iter().filter(|e| e.event_type.as_str() == t).count();
            match action {
                FinalAction::Cancel => {
                    assert_eq!(s.status, S::Cancelled, "{name}");
                    assert_eq!(invs.len(), 1, "{name}: no invoice after the cancel");
                    assert_eq!(count("subscription.cancelled"), 1, "{name}");
                }
                FinalAction::Pause => {
                    assert_eq!(s.status, S::Paused, "{name}");
                    assert_eq!(invs.len(), 1, "{name}: a paused period is not billed");
                    assert_eq!(count("subscription.paused"), 1, "{name}");
                }
                FinalAction::MarkUncollectible => {
                    assert_eq!(inv.status, InvoiceStatus::Uncollectible, "{name}");
                    assert_eq!(count("billing_invoice.uncollectible"), 1, "{name}");
                    assert_eq!(invs.len(), 2, "{name}: still billed");
                }
            }
            // SMS in the clock's time: 4 of the first invoice's (the
            // recipient's day counts clock days), plus the next invoice's.
            assert!(sms_texts(&w).await.len() >= 4, "{name}");
        }
    }
}

#[tokio::test]
async fn on_a_clock_the_trial_ending_notice_goes_three_days_before() {
    let (_, store) = stores().await.remove(0);
    let w = world(store, at(T0)).await;
    let clock = test_clock::create(&w.deps, &w.tenant, "c", at(T0), at(T0))
        .await
        .unwrap();
    let sub = subscribe(&w, monthly(), at(TRIAL_END), Some(clock.id.clone()), None).await;
    run_clock(&w, &clock.id, at("2026-01-15T00:00:00Z")).await;
    let texts = sms_texts(&w).await;
    assert_eq!(texts.len(), 1);
    assert!(texts[0].contains("trial ends 2026-01-17"), "{}", texts[0]);
    assert_eq!(mail_kinds(&w).await, vec!["trial_ending"]);
    let end = subscription::get(&w.deps, &w.tenant, &sub.id)
        .await
        .unwrap()
        .trial_ends_at
        .unwrap();
    let rec = rec::get::<NoticeSchedule>(&*w.deps.store, &NoticeSchedule::trial_key(&sub.id, end))
        .await
        .unwrap()
        .unwrap();
    assert!(rec.next_at.is_none());
    assert_eq!(rec.history.len(), 2);
    // A paid invoice has no more notices.
    run_clock(&w, &clock.id, at("2026-01-17T07:00:00Z")).await;
    let inv = invoices(&w, &sub).await.remove(0);
    invoice::pay_invoice(
        &w.deps,
        &w.tenant,
        &inv.id,
        invoice::PaymentSource::OutOfBand {
            method: invoice::OutOfBandMethod::Cash,
            received_on: inv.due_date,
            reference: "r1".into(),
            recorded_by: "test".into(),
        },
        inv.amount_due,
        at("2026-01-17T07:00:00Z"),
    )
    .await
    .unwrap();
    run_clock(&w, &clock.id, at("2026-02-01T00:00:00Z")).await;
    let s = schedule(&w, &inv).await;
    assert!(s.next_at.is_none());
    assert_eq!(
        s.history
            .iter()
            .filter(|e| e.kind == NoticeKind::Overdue)
            .count(),
        0,
        "paid: no overdue notice"
    );
    let _ = rec.item_key();
}

#[tokio::test]
async fn retry_now_sends_a_real_reminder_and_shows_in_the_dunning_view() {
    use crate::domain::billing::dunning_api::{invoice_dunning, stop};
    use crate::refusal::Refusal;
    let (_, store) = stores().await.remove(0);
    let w = world(store, at(T0)).await;
    let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
    w.set(at(TRIAL_END));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    let inv = invoices(&w, &sub).await.remove(0);
    pass(&w.deps, w.now(), 100).await.unwrap();
    // Not dunned yet (no policy, not overdue): refused.
    let e = retry_now(&w.deps, &w.tenant, &inv.id).await.unwrap_err();
    assert_eq!(Refusal::from(e).code, "state_conflict");
    policy(&w, &[3], FinalAction::Cancel).await;
    // The grace end (Jan 20): overdue, dunning starts with the notice.
    w.set(at("2026-01-20T02:00:00Z"));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    pass(&w.deps, w.now(), 100).await.unwrap();
    let view = invoice_dunning(&w.deps, &w.tenant, &inv.id).await.unwrap();
    assert_eq!(view.status, "active");
    assert!(
        view.attempts.is_empty(),
        "the overdue notice is not an attempt"
    );
    let kinds: Vec<_> = view.reminders.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, vec!["due_today", "due_today", "overdue", "overdue"]);
    let texts_before = sms_texts(&w).await.len();
    let view = retry_now(&w.deps, &w.tenant, &inv.id).await.unwrap();
    assert_eq!(view.attempts.len(), 2, "email and SMS");
    assert!(view.attempts.iter().all(|a| a.interval.is_none()));
    assert_eq!(sms_texts(&w).await.len(), texts_before + 1, "a real SMS");
    assert_eq!(
        mail_kinds(&w)
            .await
            .iter()
            .filter(|k| *k == "dunning")
            .count(),
        1
    );
    assert_eq!(view.reminders.len(), 6);
    // The scheduled dunning reminder (Jan 23) still goes.
    assert_eq!(
        view.next_attempt_on.map(|d| d.to_string()).as_deref(),
        Some("2026-01-23")
    );
    let stopped = stop(&w.deps, &w.tenant, &inv.id).await.unwrap();
    assert_eq!(stopped.status, "stopped");
    let e = retry_now(&w.deps, &w.tenant, &inv.id).await.unwrap_err();
    assert_eq!(Refusal::from(e).code, "state_conflict");
    // Stopped: the record leaves the index at its next run, nothing sent.
    w.set(at("2026-01-23T02:00:00Z"));
    let before = sms_texts(&w).await.len();
    pass(&w.deps, w.now(), 100).await.unwrap();
    assert_eq!(sms_texts(&w).await.len(), before);
    assert!(schedule(&w, &inv).await.next_at.is_none());
}

/// An invoice overdue since 2026-01-20 under a one-interval policy (3
/// days: the scheduled dunning reminder on Jan 23), its dunning active.
async fn dunned(w: &World) -> BillingInvoice {
    let sub = subscribe(w, monthly(), at(TRIAL_END), None, None).await;
    w.set(at(TRIAL_END));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    let inv = invoices(w, &sub).await.remove(0);
    pass(&w.deps, w.now(), 100).await.unwrap();
    policy(w, &[3], FinalAction::Cancel).await;
    w.set(at("2026-01-20T02:00:00Z"));
    sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
    pass(&w.deps, w.now(), 100).await.unwrap();
    inv
}

fn reminders_of(view: &crate::domain::billing::dunning_api::InvoiceDunningView) -> Vec<String> {
    view.reminders
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                r.kind.as_str(),
                serde_json::to_value(r.channel).unwrap().as_str().unwrap(),
                serde_json::to_value(r.outcome).unwrap().as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn retry_now_in_quiet_hours_defers_the_sms_and_sends_it_once_at_seven() {
    use crate::domain::billing::dunning_api::invoice_dunning;
    for (name, store) in stores().await {
        let w = world(store, at(T0)).await;
        let inv = dunned(&w).await;
        let sms_before = sms_texts(&w).await.len();
        // 21:45 Nepal time: quiet hours.
        w.set(at("2026-01-20T16:00:00Z"));
        let view = retry_now(&w.deps, &w.tenant, &inv.id).await.unwrap();
        assert_eq!(view.attempts.len(), 1, "{name}: the email only, for now");
        assert_eq!(view.attempts[0].channel, dunning::Channel::Email, "{name}");
        let shown = reminders_of(&view);
        assert_eq!(
            shown[shown.len() - 2..],
            ["dunning email queued", "dunning sms deferred"],
            "{name}"
        );
        assert_eq!(
            sms_texts(&w).await.len(),
            sms_before,
            "{name}: no SMS at night"
        );
        let s = schedule(&w, &inv).await;
        assert_eq!(s.deferred.len(), 1, "{name}");
        assert_eq!(s.next_at, Some(at("2026-01-21T01:15:00Z")), "{name}: 07:00");
        // Still night: nothing goes.
        w.set(at("2026-01-21T01:00:00Z"));
        let r = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!((r.sent, r.notices_run), (0, 0), "{name}: {r:?}");
        // 07:00: the SMS goes, once, however many runs race for it.
        w.set(at("2026-01-21T01:15:00Z"));
        let now = w.now();
        let runs = futures::future::join_all((0..4).map(|_| run_one(&w.deps, &s, now))).await;
        assert!(runs.iter().all(Result::is_ok), "{name}: {runs:?}");
        pass(&w.deps, now, 100).await.unwrap();
        let texts = sms_texts(&w).await;
        assert_eq!(texts.len(), sms_before + 1, "{name}: {texts:?}");
        assert!(
            texts.iter().any(|t| t.contains("failed. Please pay")),
            "{name}: {texts:?}"
        );
        let view = invoice_dunning(&w.deps, &w.tenant, &inv.id).await.unwrap();
        let attempts: Vec<_> = view
            .attempts
            .iter()
            .map(|a| (a.channel, a.outcome, a.interval))
            .collect();
        assert_eq!(
            attempts,
            vec![
                (
                    dunning::Channel::Email,
                    dunning::AttemptOutcome::Queued,
                    None
                ),
                (dunning::Channel::Sms, dunning::AttemptOutcome::Logged, None),
            ],
            "{name}"
        );
        let shown = reminders_of(&view);
        assert_eq!(
            shown.last().map(String::as_str),
            Some("dunning sms logged"),
            "{name}"
        );
        assert_eq!(
            shown.iter().filter(|r| *r == "dunning sms logged").count(),
            1,
            "{name}: {shown:?}"
        );
        let s = schedule(&w, &inv).await;
        assert!(s.deferred.is_empty(), "{name}");
        // The scheduled reminder (Jan 23) is still the next.
        assert_eq!(s.next_at, Some(at("2026-01-23T01:15:00Z")), "{name}");
        let again = pass(&w.deps, now, 100).await.unwrap();
        assert_eq!(again.sent, 0, "{name}");
        assert_eq!(sms_texts(&w).await.len(), sms_before + 1, "{name}");
        // A second retry-now is its own reminder (not the first's again).
        w.set(at("2026-01-21T03:00:00Z"));
        let view = retry_now(&w.deps, &w.tenant, &inv.id).await.unwrap();
        assert_eq!(view.attempts.len(), 4, "{name}");
        assert_eq!(sms_texts(&w).await.len(), sms_before + 2, "{name}");
    }
}

#[tokio::test]
async fn a_deferred_retry_now_sms_is_dropped_when_dunning_stops_or_the_invoice_is_paid() {
    use crate::domain::billing::dunning_api::{invoice_dunning, stop};
    let (_, store) = stores().await.remove(0);
    for paid in [false, true] {
        let w = world(store.clone(), at(T0)).await;
        let inv = dunned(&w).await;
        let sms_before = sms_texts(&w).await.len();
        w.set(at("2026-01-20T16:00:00Z"));
        retry_now(&w.deps, &w.tenant, &inv.id).await.unwrap();
        if paid {
            invoice::pay_invoice(
                &w.deps,
                &w.tenant,
                &inv.id,
                invoice::PaymentSource::OutOfBand {
                    method: invoice::OutOfBandMethod::Cash,
                    received_on: chrono::NaiveDate::from_ymd_opt(2026, 1, 20).unwrap(),
                    reference: "r-1".into(),
                    recorded_by: "test".into(),
                },
                inv.amount_due,
                w.now(),
            )
            .await
            .unwrap();
        } else {
            stop(&w.deps, &w.tenant, &inv.id).await.unwrap();
        }
        w.set(at("2026-01-21T01:15:00Z"));
        pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(
            sms_texts(&w).await.len(),
            sms_before,
            "paid {paid}: not sent"
        );
        let s = schedule(&w, &inv).await;
        assert!(
            s.deferred.is_empty() && s.next_at.is_none(),
            "paid {paid}: {s:?}"
        );
        let last = s.history.last().unwrap();
        assert_eq!(
            (last.channel, last.outcome),
            (NoticeChannel::Sms, NoticeOutcome::Skipped),
            "paid {paid}"
        );
        let view = invoice_dunning(&w.deps, &w.tenant, &inv.id).await.unwrap();
        assert_eq!(view.attempts.len(), 1, "paid {paid}: the email only");
    }
}

/// A queue that refuses sends to one queue (down), the rest as `inner`.
struct DownFor(crate::queue::QueueName, Arc<dyn crate::queue::Queue>);

#[async_trait::async_trait]
impl crate::queue::Queue for DownFor {
    async fn send(
        &self,
        queue: crate::queue::QueueName,
        body: &str,
        delay: std::time::Duration,
    ) -> Result<String, crate::queue::QueueError> {
        if queue == self.0 {
            return Err(crate::queue::QueueError::Unavailable("injected".into()));
        }
        self.1.send(queue, body, delay).await
    }
    async fn receive(
        &self,
        queue: crate::queue::QueueName,
        max: usize,
        wait: std::time::Duration,
        visibility: std::time::Duration,
    ) -> Result<Vec<crate::queue::Message>, crate::queue::QueueError> {
        self.1.receive(queue, max, wait, visibility).await
    }
    async fn delete(
        &self,
        queue: crate::queue::QueueName,
        receipt: &str,
    ) -> Result<(), crate::queue::QueueError> {
        self.1.delete(queue, receipt).await
    }
}

fn with_down(w: &World, queue: crate::queue::QueueName) -> AppState {
    w.deps
        .clone()
        .with_queue(Arc::new(DownFor(queue, w.deps.queue.clone())))
}

/// Every message on `queue` now (taken off it).
async fn drain(w: &World, queue: crate::queue::QueueName) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = w
            .deps
            .queue
            .receive(
                queue,
                10,
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(300),
            )
            .await
            .unwrap();
        if got.is_empty() {
            return out;
        }
        for m in got {
            w.deps.queue.delete(queue, &m.receipt).await.unwrap();
            out.push(m.body);
        }
    }
}

/// Another merchant's project in `mode`, with a customer (email and/or
/// phone).
async fn another_tenant(
    w: &World,
    mode: Mode,
    email: Option<&str>,
    phone: Option<&str>,
) -> (Tenant, Customer) {
    let t0 = w.now();
    let store = &*w.deps.store;
    let merchant = account::create_merchant(store, t0, "Valley Gym", "v@example.com", Plan::Growth)
        .await
        .unwrap();
    let project = account::create_project(store, t0, &merchant, "Gym", false)
        .await
        .unwrap();
    let tenant = Tenant::new(project.id.clone(), mode);
    let customer = customers::create(
        &w.deps,
        &tenant,
        CreateCustomer {
            name: "Hari".into(),
            email: email.map(str::to_owned),
            phone: phone.map(str::to_owned),
            external_customer_id: None,
            metadata: None,
            locale: None,
            test_clock_id: None,
        },
        None,
    )
    .await
    .unwrap();
    (tenant, customer)
}

/// A subscription of `customer` (of `tenant`) whose trial ends at
/// `TRIAL_END`.
async fn subscribe_as(w: &World, tenant: &Tenant, customer: &Customer) -> Subscription {
    let input = NewSubscription {
        customer_id: customer.id.clone(),
        plan_id: "bp_1".into(),
        terms: monthly(),
        reference_id: None,
        metadata: serde_json::Map::new(),
        start: w.now(),
        trial_ends_at: Some(at(TRIAL_END)),
        billing_anchor_day: None,
        dunning_policy_id: None,
        test_clock_id: None,
    };
    let sub = new_subscription(tenant, input, w.now()).unwrap();
    subscription::create(&w.deps, &sub).await.unwrap();
    sub
}

#[tokio::test]
async fn with_the_mail_queue_down_the_notice_waits_and_each_message_goes_once() {
    use crate::queue::QueueName;
    for (name, store) in stores().await {
        let w = world(store, at(T0)).await;
        let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
        w.set(at(TRIAL_END));
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let inv = invoices(&w, &sub).await.remove(0);
        let down = with_down(&w, QueueName::Mail);
        // Two passes while the queue is down: each fails the record, which
        // stays due; the SMS (no queue in sandbox) goes in the first, once.
        for minute in 0..2 {
            w.set(at(TRIAL_END).plus(Duration::minutes(minute)));
            let r = pass(&down, w.now(), 100).await.unwrap();
            assert_eq!(r.errors, 1, "{name}: {r:?}");
            let s = schedule(&w, &inv).await;
            assert!(s.history.is_empty(), "{name}: nothing recorded");
            assert_eq!(s.next_at, Some(inv.issued_at), "{name}: still due");
            assert_eq!(sms_texts(&w).await.len(), 1, "{name}: the SMS, once");
            assert_eq!(mail_kinds(&w).await.len(), 1, "{name}: stored once");
        }
        assert!(drain(&w, QueueName::Mail).await.is_empty(), "{name}");
        // The queue is back: the next pass queues the stored email (once)
        // and records both channels with the first run's messages.
        w.set(at(TRIAL_END).plus(Duration::minutes(2)));
        let r = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!((r.errors, r.notices_run), (0, 1), "{name}: {r:?}");
        let queued = drain(&w, QueueName::Mail).await;
        assert_eq!(queued.len(), 1, "{name}: {queued:?}");
        let s = schedule(&w, &inv).await;
        let got: Vec<_> = s.history.iter().map(|e| (e.channel, e.outcome)).collect();
        assert_eq!(
            got,
            vec![
                (NoticeChannel::Email, NoticeOutcome::Queued),
                (NoticeChannel::Sms, NoticeOutcome::Logged),
            ],
            "{name}"
        );
        assert!(
            s.history
                .iter()
                .all(|e| e.sms_id.is_some() || e.mail_id.is_some())
        );
        let again = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(again.notices_run, 0, "{name}");
        assert!(drain(&w, QueueName::Mail).await.is_empty(), "{name}");
        assert_eq!(sms_texts(&w).await.len(), 1, "{name}");
        assert_eq!(mail_kinds(&w).await.len(), 1, "{name}");
    }
}

#[tokio::test]
async fn with_the_sms_queue_down_a_live_notice_is_kept_and_queued_once_later() {
    use crate::queue::QueueName;
    for (name, store) in stores().await {
        let w = world(store, at(T0)).await;
        let (tenant, customer) =
            another_tenant(&w, Mode::Live, Some("hari@example.com"), Some("9841000002")).await;
        subscribe_as(&w, &tenant, &customer).await;
        w.set(at(TRIAL_END));
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let down = with_down(&w, QueueName::Sms);
        let r = pass(&down, w.now(), 100).await.unwrap();
        // Stored and counted: the SMS will go, so the notice is recorded.
        assert_eq!((r.errors, r.sent), (0, 2), "{name}: {r:?}");
        assert!(drain(&w, QueueName::Sms).await.is_empty(), "{name}");
        let sms = crate::domain::sms::list_recent(&*w.deps.store, &tenant, 10)
            .await
            .unwrap();
        assert_eq!(sms.len(), 1, "{name}");
        assert_eq!(sms[0].status, crate::domain::sms::SmsStatus::Queued);
        assert_eq!(
            drain(&w, QueueName::Mail).await.len(),
            1,
            "{name}: the email"
        );
        // Passes go on (the queue still down): nothing is stored again.
        w.set(at(TRIAL_END).plus(Duration::minutes(1)));
        let r = pass(&down, w.now(), 100).await.unwrap();
        assert_eq!(r.notices_run, 0, "{name}: {r:?}");
        // The queue is back: the SMS backstop queues the stored SMS once.
        w.set(at(TRIAL_END).plus(Duration::minutes(6)));
        let n = crate::domain::sms::requeue_stuck(&w.deps, w.now(), 10)
            .await
            .unwrap();
        assert_eq!(n, 1, "{name}");
        let queued = drain(&w, QueueName::Sms).await;
        assert_eq!(queued.len(), 1, "{name}: {queued:?}");
        assert!(queued[0].contains(sms[0].id.as_str()), "{name}");
        let r = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!(r.notices_run, 0, "{name}");
        assert_eq!(
            crate::domain::sms::list_recent(&*w.deps.store, &tenant, 10)
                .await
                .unwrap()
                .len(),
            1,
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_tenant_whose_notice_fails_does_not_hold_up_another() {
    use crate::queue::QueueName;
    for (name, store) in stores().await {
        // The world's customer has an email (the mail queue is down); the
        // other tenant's customer only a phone.
        let w = world(store, at(T0)).await;
        let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
        let (other, customer) = another_tenant(&w, Mode::Sandbox, None, Some("9841000003")).await;
        subscribe_as(&w, &other, &customer).await;
        w.set(at(TRIAL_END));
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let inv = invoices(&w, &sub).await.remove(0);
        let down = with_down(&w, QueueName::Mail);
        let r = pass(&down, w.now(), 100).await.unwrap();
        // The other's SMS counted; the failed run counts nothing (the
        // trials' ending notices, past, are closed beside).
        assert_eq!((r.errors, r.sent), (1, 1), "{name}: {r:?}");
        let theirs = crate::domain::sms::list_recent(&*w.deps.store, &other, 10)
            .await
            .unwrap();
        assert_eq!(theirs.len(), 1, "{name}: the other tenant's SMS went");
        assert!(schedule(&w, &inv).await.history.is_empty(), "{name}");
        // Back up: the failed tenant's notice goes; the other's not again.
        let r = pass(&w.deps, w.now(), 100).await.unwrap();
        assert_eq!((r.errors, r.notices_run), (0, 1), "{name}: {r:?}");
        assert_eq!(schedule(&w, &inv).await.history.len(), 2, "{name}");
        assert_eq!(
            crate::domain::sms::list_recent(&*w.deps.store, &other, 10)
                .await
                .unwrap()
                .len(),
            1,
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_subscriptions_timeline_holds_its_events_and_notices_newest_first() {
    use crate::domain::dashboard::{BillingRow, billing_timeline};
    use crate::domain::outbox::BillingTimeline;
    for (name, store) in stores().await {
        let w = world(store, at(T0)).await;
        let sub = subscribe(&w, monthly(), at(TRIAL_END), None, None).await;
        w.set(at(TRIAL_END));
        sweep::sweep(&w.deps, w.now(), 100).await.unwrap();
        let inv = invoices(&w, &sub).await.remove(0);
        pass(&w.deps, w.now(), 100).await.unwrap();
        let show = |rows: &[BillingRow]| -> Vec<String> {
            rows.iter()
                .map(|r| match r {
                    BillingRow::Event(e) => format!(
                        "{} {}",
                        e.event_type.as_str(),
                        e.about.as_deref().unwrap_or("-")
                    ),
                    BillingRow::Notice { invoice, entry } => format!(
                        "{} {:?} {:?} {}",
                        entry.kind.as_str(),
                        entry.channel,
                        entry.outcome,
                        invoice.as_ref().map_or("-", |i| i.as_str())
                    ),
                })
                .collect()
        };
        let rows = billing_timeline(
            &w.deps,
            BillingTimeline::Subscription(&sub.id),
            std::slice::from_ref(&inv.id),
            std::slice::from_ref(&sub.id),
            50,
        )
        .await
        .unwrap();
        let mut seen = show(&rows);
        let i = inv.id.as_str();
        // The sweep's three events share its time (their order is the
        // timeline's, by event id); the notices, at that time too, first.
        seen[2..5].sort();
        assert_eq!(
            seen,
            vec![
                format!("due_today Email Queued {i}"),
                format!("due_today Sms Logged {i}"),
                format!("billing_invoice.created {i}"),
                "subscription.trial_ended -".to_owned(),
                "subscription.trial_will_end -".to_owned(),
                "subscription.created -".to_owned(),
            ],
            "{name}"
        );
        assert!(rows.windows(2).all(|p| p[0].at() >= p[1].at()), "{name}");
        // The customer's timeline has the same events; bounded by `limit`.
        let rows = billing_timeline(
            &w.deps,
            BillingTimeline::Customer(&w.customer.id),
            &[],
            &[],
            2,
        )
        .await
        .unwrap();
        assert_eq!(rows.len(), 2, "{name}");
        assert!(
            rows.iter()
                .all(|r| matches!(r, BillingRow::Event(e) if e.created_at == at(TRIAL_END))),
            "{name}: the newest two"
        );
    }
}
