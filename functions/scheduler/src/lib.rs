//! The scheduled sweep: an EventBridge rule invokes this function every
//! minute; each run expires due checkout sessions and reconciles open
//! payments with their providers ([`shared::domain::attempts::sweep`]),
//! then fans out the outbox events the stream function has not taken and
//! queues again webhook deliveries whose message was lost
//! ([`shared::domain::webhooks::sweep`]): the backstop for events whose
//! stream record was lost or whose retries ran out. Beside them, the
//! billing engine advances every subscription something is due for
//! ([`shared::domain::billing::sweep`]: renewals, trial ends, grace ends,
//! at most [`billing::sweep::BUDGET`] a run, fair across projects), and
//! right after it the billing notices pass
//! ([`shared::domain::notices::pass`]: reminders by SMS and email, dunning
//! reminders and final actions), so an invoice the sweep just issued gets
//! its first notice in the same run; and sandbox test clocks left advancing
//! are finished ([`shared::domain::clocks::finish_advancing`]). And the
//! daily Khalti pull: every tenant with its own Khalti credentials gets a
//! reconciliation run of the previous Nepal day, once, a page of tenants
//! per run ([`shared::domain::reconciliation::daily`]).
//!
//! The template allows one run at a time (reserved concurrency 1). A store
//! error fails the invocation so Lambda records it; the next run tries
//! again. The sweep and the fan-out run whatever the other did.

use serde_json::Value;
use shared::AppState;
use shared::domain::attempts::SweepReport;
use shared::domain::billing::{self, sweep::BillingSweepReport};
use shared::domain::clocks;
use shared::domain::notices::{self, NoticeReport};
use shared::domain::reconciliation::daily::{self, PullReport};
use shared::domain::webhooks::{self, FanOutReport};
use shared::store::StoreError;

pub use shared::domain::attempts::sweep;

/// Most outbox events fanned out (and overdue deliveries queued again) per
/// shard and run.
pub const FAN_OUT_LIMIT: usize = 100;

/// One invocation. The event (EventBridge's scheduled event) carries
/// nothing the sweep needs: the time comes from the state's clock.
/// Answers the [`SweepReport`] with the fan-out's counts, as JSON.
pub async fn handle(state: &AppState, event: Value) -> Result<Value, lambda_runtime::Error> {
    let _ = event;
    let now = state.clock.now();
    // Side by side: a slow provider must not starve webhook delivery.
    let clocks_deadline = std::time::Instant::now() + clocks::RUN_DEADLINE;
    let pull_deadline = std::time::Instant::now() + daily::RUN_DEADLINE;
    let (swept, fanned, sms, billed, clocked, pulled) = tokio::join!(
        sweep(state, now),
        webhooks::sweep(state, now, FAN_OUT_LIMIT),
        shared::domain::sms::requeue_stuck(state, now, FAN_OUT_LIMIT),
        async {
            let billed = billing::sweep::sweep(state, now, billing::sweep::BUDGET).await;
            let noticed = notices::pass(state, now, billing::sweep::BUDGET).await;
            (billed, noticed)
        },
        clocks::finish_advancing(state, clocks_deadline),
        daily::daily(state, now, pull_deadline)
    );
    let (billed, noticed) = billed;
    // Overpayments whose refund was never asked (a crash after their
    // settlement) or failed: asked again, with a growing wait.
    match billing::invoice::refund_due::sweep(state, now).await {
        Ok(r) if r.asked + r.retried + r.failed > 0 => {
            tracing::warn!(
                asked = r.asked,
                retried = r.retried,
                failed = r.failed,
                "overpayment refunds taken up by the sweep"
            )
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "overpayment refund sweep failed"),
    }
    // SMS reminders whose queue message was lost (logged; the next run
    // retries a failure).
    match sms {
        Ok(n) if n > 0 => tracing::warn!(sms_requeued = n, "stuck SMS reminders queued again"),
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "SMS backstop sweep failed"),
    }
    let mut answer = report(swept, fanned)?;
    with_billing(&mut answer, billed)?;
    with_notices(&mut answer, noticed)?;
    with_clocks(&mut answer, clocked)?;
    with_pulls(&mut answer, pulled);
    Ok(answer)
}

/// Adds the daily pull's counts (`khalti_pulled`, `khalti_pull_skipped`,
/// `khalti_pull_failed`); a store error is logged and the next run
/// resumes from the cursor (the pull never fails the others' run).
fn with_pulls(answer: &mut Value, pulled: Result<PullReport, StoreError>) {
    let report = match pulled {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "daily Khalti pull failed; the next run resumes");
            PullReport::default()
        }
    };
    if report.pulled + report.failed > 0 {
        tracing::info!(
            pulled = report.pulled,
            skipped = report.skipped,
            failed = report.failed,
            "daily Khalti pull"
        );
    }
    if let Value::Object(map) = answer {
        map.insert("khalti_pulled".into(), report.pulled.into());
        map.insert("khalti_pull_skipped".into(), report.skipped.into());
        map.insert("khalti_pull_failed".into(), report.failed.into());
    }
}

/// Adds the billing sweep's counts to the answer (`subscriptions_advanced`,
/// `billing_invoices_issued`, `billing_errors`); its store error fails the
/// invocation like the others'.
fn with_billing(
    answer: &mut Value,
    billed: Result<BillingSweepReport, StoreError>,
) -> Result<(), lambda_runtime::Error> {
    match billed {
        Ok(b) => {
            if let Value::Object(map) = answer {
                map.insert(
                    "subscriptions_advanced".into(),
                    b.subscriptions_advanced.into(),
                );
                map.insert("billing_invoices_issued".into(), b.invoices_issued.into());
                map.insert("billing_errors".into(), b.errors.into());
            }
            Ok(())
        }
        Err(e) => {
            tracing::error!(error = %e, "billing sweep failed");
            Err(Box::new(e))
        }
    }
}

/// Adds the notices pass's counts to the answer (`notices_run`,
/// `notices_sent`, `notices_skipped`, `notices_deferred`,
/// `dunning_final_actions`, `notices_errors`); its store error fails the
/// invocation like the others'.
fn with_notices(
    answer: &mut Value,
    noticed: Result<NoticeReport, StoreError>,
) -> Result<(), lambda_runtime::Error> {
    match noticed {
        Ok(n) => {
            if let Value::Object(map) = answer {
                map.insert("notices_run".into(), n.notices_run.into());
                map.insert("notices_sent".into(), n.sent.into());
                map.insert("notices_skipped".into(), n.skipped.into());
                map.insert("notices_deferred".into(), n.deferred.into());
                map.insert("dunning_final_actions".into(), n.final_actions.into());
                map.insert("notices_errors".into(), n.errors.into());
            }
            Ok(())
        }
        Err(e) => {
            tracing::error!(error = %e, "billing notices pass failed");
            Err(Box::new(e))
        }
    }
}

/// Adds `test_clocks_ready` (sandbox test clocks left advancing that the
/// run finished: `domain::clocks`, at most `PER_RUN` a run, within
/// `RUN_DEADLINE`); a store error fails the invocation like the others'.
fn with_clocks(
    answer: &mut Value,
    clocked: Result<clocks::Finished, StoreError>,
) -> Result<(), lambda_runtime::Error> {
    match clocked {
        Ok(done) => {
            if let Value::Object(map) = answer {
                map.insert("test_clocks_ready".into(), done.ready.into());
            }
            Ok(())
        }
        Err(e) => {
            tracing::error!(error = %e, "test clocks failed");
            Err(Box::new(e))
        }
    }
}

/// Logs the outcome of a run and turns it into the invocation's answer:
/// the sweep's counts, plus `events_fanned_out` (events whose deliveries
/// were created and queued), `deliveries_queued` and `fan_out_errors`.
fn report(
    swept: Result<SweepReport, StoreError>,
    fanned: Result<FanOutReport, StoreError>,
) -> Result<Value, lambda_runtime::Error> {
    if let Ok(f) = &fanned {
        tracing::info!(
            events_fanned_out = f.events.saturating_sub(f.errors),
            deliveries_queued = f.deliveries,
            fan_out_errors = f.errors,
            deliveries_requeued = f.requeued,
            "outbox fan-out done"
        );
    }
    match (swept, fanned) {
        (Ok(r), Ok(f)) => {
            tracing::info!(
                sessions_expired = r.sessions_expired,
                payments_checked = r.payments_checked,
                payments_settled = r.payments_settled,
                errors = r.errors,
                "sweep done"
            );
            let mut answer = serde_json::to_value(&r)?;
            if let Value::Object(map) = &mut answer {
                map.insert(
                    "events_fanned_out".into(),
                    f.events.saturating_sub(f.errors).into(),
                );
                map.insert("deliveries_queued".into(), f.deliveries.into());
                map.insert("fan_out_errors".into(), f.errors.into());
                map.insert("deliveries_requeued".into(), f.requeued.into());
            }
            Ok(answer)
        }
        (Err(e), fanned) => {
            tracing::error!(error = %e, "sweep failed");
            if let Err(f) = fanned {
                tracing::error!(error = %f, "outbox fan-out failed");
            }
            Err(Box::new(e))
        }
        (Ok(_), Err(e)) => {
            tracing::error!(error = %e, "outbox fan-out failed");
            Err(Box::new(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shared::domain::Mode;
    use shared::domain::credentials::{CredentialsKey, CredentialsKeys};
    use shared::domain::outbox::{self, EventType};
    use shared::domain::webhooks::{self, CreateEndpoint, WebhookSettings};
    use shared::providers::{ProviderConfig, ProviderHub, SandboxAccounts};
    use shared::queue::QueueName;
    use shared::time::Timestamp;

    use super::*;
    use shared::domain::Tenant;

    fn state() -> AppState {
        AppState::for_tests()
    }

    /// A state that can seal signing secrets and accepts local receivers.
    fn webhook_state() -> AppState {
        let key = match CredentialsKey::generate("k1") {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        };
        let hub = match ProviderHub::new(
            &ProviderConfig::sandbox(),
            &ProviderConfig::live(),
            Some(CredentialsKeys::single(key)),
            SandboxAccounts::default(),
        ) {
            Ok(h) => h,
            Err(e) => panic!("{e}"),
        };
        state().with_providers(hub).with_webhooks(WebhookSettings {
            allow_local_http: true,
            ..WebhookSettings::default()
        })
    }

    /// What EventBridge sends on a `rate(...)` schedule.
    fn scheduled_event() -> Value {
        json!({
            "version": "0",
            "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": "123456789012",
            "time": "2025-01-01T00:00:00Z",
            "region": "ap-south-1",
            "resources": ["arn:aws:events:ap-south-1:123456789012:rule/sweep"],
            "detail": {}
        })
    }

    const KEYS: [&str; 23] = [
        "sessions_expired",
        "payments_checked",
        "payments_settled",
        "errors",
        "refunds_checked",
        "refunds_resolved",
        "events_fanned_out",
        "deliveries_queued",
        "fan_out_errors",
        "deliveries_requeued",
        "subscriptions_advanced",
        "billing_invoices_issued",
        "billing_errors",
        "notices_run",
        "notices_sent",
        "notices_skipped",
        "notices_deferred",
        "dunning_final_actions",
        "notices_errors",
        "test_clocks_ready",
        "khalti_pulled",
        "khalti_pull_skipped",
        "khalti_pull_failed",
    ];

    #[tokio::test]
    async fn a_run_on_an_empty_store_answers_every_count() {
        let answer = handle(&state(), scheduled_event()).await;
        let Ok(answer) = answer else {
            panic!("{:?}", answer.err())
        };
        let Some(object) = answer.as_object() else {
            panic!("not an object: {answer}")
        };
        for field in KEYS {
            assert_eq!(object.get(field), Some(&json!(0)), "{field} in {answer}");
        }
        assert_eq!(object.len(), KEYS.len(), "{answer}");
    }

    #[tokio::test]
    async fn any_event_payload_is_accepted() {
        assert!(handle(&state(), Value::Null).await.is_ok());
        assert!(handle(&state(), json!({})).await.is_ok());
    }

    /// Events older than the grace period still in the outbox are fanned
    /// out; younger ones are left to the stream function.
    #[tokio::test]
    async fn the_run_fans_out_outbox_events_the_stream_missed() {
        let state = webhook_state();
        let created = webhooks::create(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            CreateEndpoint {
                url: "http://127.0.0.1:9/hooks".into(),
                events: None,
                enabled: None,
            },
            None,
        )
        .await;
        let Ok((endpoint, _secret)) = created else {
            panic!("{:?}", created.err())
        };
        let now = state.clock.now();
        let Some(old) = Timestamp::from_unix_millis(now.unix_millis() - 3 * 60 * 1000) else {
            panic!("time")
        };
        let mut recorded = Vec::new();
        for at in [old, now] {
            let e = outbox::Event::new(
                EventType::PaymentSucceeded,
                &Tenant::new("proj_1", Mode::Sandbox),
                json!({"id": "pay_1", "status": "success"}),
                at,
            );
            let put = match e.put_ops() {
                Ok(ops) => ops,
                Err(err) => panic!("{err}"),
            };
            if let Err(err) = state.store.transact(put).await {
                panic!("{err}")
            }
            recorded.push(e.id);
        }
        let answer = match handle(&state, scheduled_event()).await {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(answer["events_fanned_out"], 1, "{answer}");
        assert_eq!(answer["deliveries_queued"], 1, "{answer}");
        assert_eq!(answer["fan_out_errors"], 0, "{answer}");
        let dispatched = |id: shared::ids::EventId| {
            let state = state.clone();
            async move {
                match outbox::get(&state, &id).await {
                    Ok(Some(e)) => e.dispatched,
                    other => panic!("{other:?}"),
                }
            }
        };
        assert!(dispatched(recorded[0].clone()).await, "the old event");
        assert!(!dispatched(recorded[1].clone()).await, "the new event");
        let queued = state
            .queue
            .receive(
                QueueName::Webhooks,
                10,
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(30),
            )
            .await;
        let Ok(queued) = queued else {
            panic!("{queued:?}")
        };
        assert_eq!(queued.len(), 1);
        let body: Value = serde_json::from_str(&queued[0].body).unwrap_or(Value::Null);
        assert_eq!(
            body,
            json!({"event_id": recorded[0], "endpoint_id": endpoint.id, "attempt": 0})
        );
    }

    /// A subscription whose trial ended is advanced by the run: its
    /// first invoice is issued.
    #[tokio::test]
    async fn the_run_advances_due_subscriptions() {
        use shared::domain::billing::subscription::{self, NewSubscription};
        let state = state();
        let now = state.clock.now();
        let tenant = Tenant::new("proj_sched", Mode::Sandbox);
        let day = |days: i64| match Timestamp::from_unix_millis(
            now.unix_millis() + days * 24 * 3600 * 1000,
        ) {
            Some(t) => t,
            None => panic!("time"),
        };
        let start = day(-20);
        let terms = billing::terms::Terms {
            description: "Pro".into(),
            amount: 99_900,
            currency: shared::money::Currency::Npr,
            interval_unit: billing::period::IntervalUnit::Month,
            interval_count: 1,
            calendar: billing::period::Calendar::Ad,
            trial_days: 0,
            grace_period_days: 3,
            reminder_days_before_due: 3,
            overdue_reminder_interval_days: 2,
            overdue_action: billing::terms::OverdueAction::MarkPastDue,
            default_provider: None,
            pricing_model: Default::default(),
        };
        let input = NewSubscription {
            customer_id: "cus_1".into(),
            plan_id: "bp_1".into(),
            terms,
            reference_id: None,
            metadata: serde_json::Map::new(),
            start,
            trial_ends_at: Some(day(-1)),
            billing_anchor_day: None,
            dunning_policy_id: None,
            test_clock_id: None,
        };
        let sub = match subscription::new_subscription(&tenant, input, start) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        if let Err(e) = subscription::create(&state, &sub).await {
            panic!("{e}")
        }
        let answer = match handle(&state, scheduled_event()).await {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(answer["subscriptions_advanced"], 1, "{answer}");
        assert_eq!(answer["billing_invoices_issued"], 1, "{answer}");
        let after = match subscription::get(&state, &tenant, &sub.id).await {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(after.status.as_str(), "active");
        // Nothing more is due: a second run advances nothing.
        let again = match handle(&state, scheduled_event()).await {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(again["subscriptions_advanced"], 0, "{again}");
    }

    #[test]
    fn a_store_error_fails_the_invocation() {
        let failed = report(
            Err(StoreError::Unavailable("throttled".into())),
            Ok(FanOutReport::default()),
        );
        let Err(e) = failed else {
            panic!("a store error must fail the run: {failed:?}")
        };
        assert!(e.to_string().contains("throttled"), "{e}");
        let failed = report(
            Ok(SweepReport::default()),
            Err(StoreError::Unavailable("outbox throttled".into())),
        );
        let Err(e) = failed else {
            panic!("an outbox store error must fail the run: {failed:?}")
        };
        assert!(e.to_string().contains("outbox throttled"), "{e}");
    }

    #[test]
    fn a_report_answers_its_counts() {
        let done = report(
            Ok(SweepReport {
                sessions_expired: 3,
                payments_checked: 5,
                payments_settled: 2,
                errors: 1,
                refunds_checked: 4,
                refunds_resolved: 1,
            }),
            Ok(FanOutReport {
                events: 7,
                deliveries: 9,
                errors: 2,
                requeued: 4,
            }),
        );
        let Ok(done) = done else {
            panic!("{:?}", done.err())
        };
        assert_eq!(
            done,
            json!({
                "sessions_expired": 3,
                "payments_checked": 5,
                "payments_settled": 2,
                "errors": 1,
                "refunds_checked": 4,
                "refunds_resolved": 1,
                "events_fanned_out": 5,
                "deliveries_queued": 9,
                "fan_out_errors": 2,
                "deliveries_requeued": 4
            })
        );
    }
}
