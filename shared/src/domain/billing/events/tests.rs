use std::sync::Arc;

use super::*;
use crate::AppState;
use crate::Deps;
use crate::domain::billing::invoice::{
    BillingInvoiceError, PaymentSource, get_invoice, issue_invoice, mark_overdue,
    mark_uncollectible, pay_invoice, void,
};
use crate::domain::billing::subscription::{self, NewSubscription, SubscriptionError, apply, next};
use crate::domain::billing::terms::monthly;
use crate::domain::billing::testenv::{deps_at, stores};
use crate::domain::billing::testenv::{stored_sub, sub_input};
use crate::domain::outbox::recent;
use crate::domain::{Mode, Provider, Tenant};
use crate::store::Store;
use crate::testenv::at;
use SubscriptionEvent as E;
use SubscriptionStatus as S;

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, "2026-01-10T06:00:00Z")
}

/// A subscription of `project` made and stored now (`trial`: with one).
async fn subscription(deps: &Deps, project: &str, trial: bool) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    let input = NewSubscription {
        trial_ends_at: trial.then(|| at("2026-01-24T06:00:00Z")),
        ..sub_input(at("2026-01-10T06:00:00Z"), monthly())
    };
    stored_sub(deps, &tenant, input).await
}

/// The tenant's event types, oldest first.
async fn types(deps: &Deps, tenant: &Tenant) -> Vec<&'static str> {
    let mut events = recent(&*deps.store, tenant, 100).await.unwrap();
    events.reverse();
    events.iter().map(|e| e.event_type.as_str()).collect()
}

#[test]
fn every_allowed_transition_has_the_webhook_its_new_status_names() {
    let expect = |from, event, to| -> Option<&'static str> {
        subscription_webhook(from, event, to).map(EventType::as_str)
    };
    for from in SubscriptionStatus::ALL {
        for event in SubscriptionEvent::all() {
            let Ok(to) = next(from, event) else { continue };
            let got = expect(from, event, to);
            if event == E::TrialExtended {
                assert_eq!(got, Some("subscription.trial_extended"));
            } else if from == to {
                assert_eq!(got, None, "{from:?} {event:?}: nothing changed");
            } else {
                let want = match (event, to) {
                    (E::TrialEnded, _) => Some("subscription.trial_ended"),
                    (_, S::Active) if from == S::Paused => Some("subscription.resumed"),
                    (_, S::Active) => Some("subscription.activated"),
                    (_, S::PastDue) => Some("subscription.past_due"),
                    (_, S::Paused) => Some("subscription.paused"),
                    (_, S::Cancelled) => Some("subscription.cancelled"),
                    _ => None,
                };
                assert_eq!(got, want, "{from:?} {event:?} -> {to:?}");
            }
        }
    }
    // The cases merchants read most, spelled out.
    assert_eq!(
        expect(S::Incomplete, E::FirstInvoicePaid, S::Active),
        Some("subscription.activated")
    );
    assert_eq!(
        expect(S::Paused, E::InvoicePaid { unpauses: true }, S::Active),
        Some("subscription.resumed")
    );
    assert_eq!(
        expect(S::PastDue, E::InvoicePaid { unpauses: false }, S::Active),
        Some("subscription.activated")
    );
    assert_eq!(
        expect(S::Draft, E::Start { trial: true }, S::Trialing),
        None
    );
    assert_eq!(
        expect(
            S::Incomplete,
            E::GraceEndedUnpaid(super::super::terms::OverdueAction::Cancel),
            S::IncompleteExpired
        ),
        None
    );
}

/// A change known by its statuses alone (the sweep's steps) names the
/// webhook the event-named change would, for every allowed transition
/// (trial extension aside: it changes no status).
#[test]
fn a_status_change_names_the_webhook_its_event_would() {
    for from in SubscriptionStatus::ALL {
        for event in SubscriptionEvent::all() {
            let Ok(to) = next(from, event) else { continue };
            if event == E::TrialExtended {
                continue;
            }
            assert_eq!(
                status_webhook(from, to),
                subscription_webhook(from, event, to),
                "{from:?} {event:?} -> {to:?}"
            );
        }
    }
}

#[tokio::test]
async fn each_subscription_transition_writes_its_event_and_a_refused_one_none() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_sev", false).await;
    let tenant = sub.tenant();
    assert_eq!(types(&deps, &tenant).await, ["subscription.created"]);
    let now = at("2026-01-11T06:00:00Z");
    let noop = |_: &mut Subscription| {};
    // Refused: an incomplete subscription cannot be paused.
    assert!(matches!(
        apply(&deps, &tenant, &sub.id, E::Pause, &noop, now).await,
        Err(SubscriptionError::Refused(_))
    ));
    assert_eq!(
        types(&deps, &tenant).await.len(),
        1,
        "a refusal writes none"
    );
    for event in [E::FirstInvoicePaid, E::Pause, E::Resume, E::CancelNow] {
        apply(&deps, &tenant, &sub.id, event, &noop, now)
            .await
            .unwrap();
    }
    assert_eq!(
        types(&deps, &tenant).await,
        [
            "subscription.created",
            "subscription.activated",
            "subscription.paused",
            "subscription.resumed",
            "subscription.cancelled",
        ]
    );
    // The object is the subscription as changed, as its GET shows it.
    let events = recent(&*deps.store, &tenant, 1).await.unwrap();
    let stored = subscription::get(&deps, &tenant, &sub.id).await.unwrap();
    assert_eq!(events[0].object, SubscriptionView::json(&stored));
    assert_eq!(events[0].object["status"], "cancelled");
    assert_eq!(events[0].body()["data"]["subscription_id"], sub.id.as_str());

    let trial = subscription(&deps, "proj_trial", true).await;
    let t = trial.tenant();
    apply(&deps, &t, &trial.id, E::TrialExtended, &noop, now)
        .await
        .unwrap();
    apply(&deps, &t, &trial.id, E::TrialEnded, &noop, now)
        .await
        .unwrap();
    assert_eq!(
        types(&deps, &t).await,
        [
            "subscription.created",
            "subscription.trial_extended",
            "subscription.trial_ended",
        ]
    );
}

fn online(payment: &str) -> PaymentSource {
    PaymentSource::Online {
        payment_id: payment.into(),
        provider: Provider::Khalti,
    }
}

#[tokio::test]
async fn each_invoice_change_writes_its_event_and_a_refused_one_none() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_iev", false).await;
    let tenant = sub.tenant();
    let now = at("2026-01-14T07:00:00Z");
    let first = issue_invoice(&deps, &sub, sub.period(0).unwrap(), now)
        .await
        .unwrap()
        .invoice;
    // The same period again: the invoice as it is, no second event.
    let again = issue_invoice(&deps, &sub, sub.period(0).unwrap(), now)
        .await
        .unwrap();
    assert!(!again.created);
    mark_overdue(&deps, &tenant, &first.id, now).await.unwrap();
    assert!(matches!(
        mark_overdue(&deps, &tenant, &first.id, now).await,
        Err(BillingInvoiceError::Refused(_))
    ));
    mark_uncollectible(&deps, &tenant, &first.id, now)
        .await
        .unwrap();
    pay_invoice(&deps, &tenant, &first.id, online("pay_1"), 99_900, now)
        .await
        .unwrap();
    // The same payment's notification again: answered, nothing new.
    pay_invoice(&deps, &tenant, &first.id, online("pay_1"), 99_900, now)
        .await
        .unwrap();
    // A second payment: an overpayment, refunded.
    pay_invoice(&deps, &tenant, &first.id, online("pay_2"), 99_900, now)
        .await
        .unwrap();
    assert!(void(&deps, &tenant, &first.id, now).await.is_err());
    let second = issue_invoice(&deps, &sub, sub.period(1).unwrap(), now)
        .await
        .unwrap()
        .invoice;
    void(&deps, &tenant, &second.id, now).await.unwrap();
    assert_eq!(
        types(&deps, &tenant).await,
        [
            "subscription.created",
            "billing_invoice.created",
            "billing_invoice.overdue",
            "billing_invoice.uncollectible",
            "billing_invoice.paid",
            "subscription.activated",
            "billing_invoice.payment_refunded",
            "billing_invoice.created",
            "billing_invoice.voided",
        ]
    );
    let events = recent(&*deps.store, &tenant, 100).await.unwrap();
    let refunded = events
        .iter()
        .find(|e| e.event_type == EventType::BillingInvoicePaymentRefunded)
        .unwrap();
    let stored = get_invoice(&deps, &tenant, &first.id).await.unwrap();
    assert_eq!(
        refunded.object,
        crate::domain::billing::invoice::view::InvoiceView::json(&stored, "http://127.0.0.1:8080")
    );
    assert_eq!(
        refunded.object["overpayments"][0]["refundStatus"],
        "pending"
    );
    assert_eq!(refunded.object["overpayments"][0]["paymentId"], "pay_2");
    let body = refunded.body();
    assert_eq!(body["data"]["invoice_number"], first.number.as_str());
    assert_eq!(body["data"]["amount"], 99_900);
}

/// Forty issues of one period race: one invoice, one `created` event
/// (the event is in the issuing transaction, so the losers write none).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_issues_of_one_period_write_one_created_event() {
    for (backend, store) in stores().await {
        let deps = deps_on(store);
        let sub = subscription(&deps, "proj_evrace", false).await;
        let period = sub.current_period().unwrap();
        let now = at("2026-01-10T06:00:00Z");
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let deps = deps.clone();
                let sub = sub.clone();
                tokio::spawn(async move {
                    match issue_invoice(&deps, &sub, period, now).await {
                        Err(BillingInvoiceError::Busy) => {
                            issue_invoice(&deps, &sub, period, now).await
                        }
                        answer => answer,
                    }
                })
            })
            .collect();
        for t in futures::future::join_all(tasks).await {
            t.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}"));
        }
        let created = types(&deps, &sub.tenant())
            .await
            .into_iter()
            .filter(|t| *t == "billing_invoice.created")
            .count();
        assert_eq!(created, 1, "{backend}");
    }
}
