use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::AppState;
use crate::domain::Mode;
use crate::domain::billing::customers::CreateCustomer;
use crate::domain::billing::dunning::{FinalAction, create_policy, new_policy};
use crate::domain::billing::invoice::{InvoiceStatus, PeriodClaim};
use crate::domain::billing::plans::{CreatePlan, UpdatePlan};
use crate::domain::billing::subscription::SUBSCRIPTION_STATE_CONFLICT;
use crate::domain::billing::terms::PricingModel;
use crate::domain::billing::testenv::{deps_at, stores};
use crate::domain::record;
use crate::store::Key;
use crate::store::Store;
use crate::store::fence::Fence;
use crate::testenv::at;

const NOW: &str = "2026-01-10T06:00:00Z";

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, NOW)
}

fn tenant(p: &str) -> Tenant {
    Tenant::new(p, Mode::Sandbox)
}

async fn customer(deps: &Deps, t: &Tenant) -> Customer {
    let body: CreateCustomer = serde_json::from_value(json!({"name": "Sita Rai"})).unwrap();
    customers::create(deps, t, body, None).await.unwrap()
}

async fn plan(deps: &Deps, t: &Tenant, extra: serde_json::Value) -> Plan {
    let mut v = json!({"name": "Fibre 50", "amount": 150_000, "intervalUnit": "month"});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let body: CreatePlan = serde_json::from_value(v).unwrap();
    plans::create(deps, t, body, None).await.unwrap()
}

fn body(v: serde_json::Value) -> CreateSubscription {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

async fn open_count(deps: &Deps, t: &Tenant, c: &CustomerId) -> i64 {
    customers::get(deps, t, c).await.unwrap().open_subscriptions
}

fn field_of(e: LifecycleError) -> (u16, String, String) {
    let r = Refusal::from(e);
    let status = match r.kind {
        Kind::Invalid => 400,
        Kind::NotFound => 404,
        Kind::Conflict => 409,
        _ => 0,
    };
    (status, r.code.to_owned(), r.field.unwrap_or_default())
}

#[tokio::test]
async fn a_subscription_without_a_trial_is_incomplete_with_its_first_invoice() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p1");
    let c = customer(&deps, &t).await;
    let p = plan(&deps, &t, json!({})).await;
    let made = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id, "referenceId": "member-7", "metadata": {"k": "v"}})),
        None,
    )
    .await
    .unwrap();
    let sub = &made.subscription;
    assert_eq!(sub.status, SubscriptionStatus::Incomplete);
    assert_eq!(sub.terms.amount, 150_000);
    assert_eq!(sub.reference_id.as_deref(), Some("member-7"));
    let issued = made.first_invoice.expect("first invoice");
    assert!(issued.created);
    assert_eq!(issued.invoice.status, InvoiceStatus::Open);
    assert_eq!(issued.invoice.amount_due, 150_000);
    assert_eq!(issued.invoice.period_start, nepal_day(at(NOW)));
    assert_eq!(open_count(&deps, &t, &c.id).await, 1);

    // The customer cannot be deleted while it is open; cancelling lowers
    // the count in the same write, and then it can.
    assert!(matches!(
        customers::delete(&deps, &t, &c.id).await,
        Err(BillingError::HasSubscriptions(_))
    ));
    let cancelled = cancel(&deps, &t, &sub.id, CancelSubscription::default())
        .await
        .unwrap();
    assert_eq!(cancelled.status, SubscriptionStatus::Cancelled);
    assert_eq!(cancelled.cancelled_at, Some(at(NOW)));
    assert_eq!(open_count(&deps, &t, &c.id).await, 0);
    let again = cancel(&deps, &t, &sub.id, CancelSubscription::default()).await;
    let (status, code, _) = field_of(again.unwrap_err());
    assert_eq!((status, code.as_str()), (409, SUBSCRIPTION_STATE_CONFLICT));
    assert_eq!(open_count(&deps, &t, &c.id).await, 0, "lowered once");
    customers::delete(&deps, &t, &c.id).await.unwrap();
}

#[tokio::test]
async fn a_trial_issues_nothing_until_it_ends_and_extends_only_later() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p1");
    let c = customer(&deps, &t).await;
    let p = plan(&deps, &t, json!({"trialDays": 14})).await;
    let made = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id})),
        None,
    )
    .await
    .unwrap();
    let sub = made.subscription;
    assert_eq!(sub.status, SubscriptionStatus::Trialing);
    assert!(made.first_invoice.is_none());
    assert_eq!(
        sub.trial_ends_at,
        Some(at("2026-01-24T06:00:00Z")),
        "the plan's 14 days"
    );
    let claim = PeriodClaim::key(&sub.id, nepal_day(at(NOW)));
    assert!(
        record::get::<PeriodClaim>(&*deps.store, &claim)
            .await
            .unwrap()
            .is_none()
    );

    // trialDays wins over the plan, trialEndsAt over both; 0 disables.
    let over = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id, "trialDays": 3, "trialEndsAt": "2026-02-01T00:00:00Z"})),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        over.subscription.trial_ends_at,
        Some(at("2026-02-01T00:00:00Z"))
    );
    let none = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id, "trialDays": 0})),
        None,
    )
    .await
    .unwrap();
    assert_eq!(none.subscription.status, SubscriptionStatus::Incomplete);
    assert_eq!(open_count(&deps, &t, &c.id).await, 3);

    // Extending: only later than the current end.
    let earlier = ExtendTrial {
        trial_ends_at: at("2026-01-20T00:00:00Z"),
    };
    let (status, _, field) = field_of(extend_trial(&deps, &t, &sub.id, earlier).await.unwrap_err());
    assert_eq!((status, field.as_str()), (400, "trialEndsAt"));
    let later = ExtendTrial {
        trial_ends_at: at("2026-01-30T00:00:00Z"),
    };
    let extended = extend_trial(&deps, &t, &sub.id, later).await.unwrap();
    assert_eq!(extended.trial_ends_at, Some(at("2026-01-30T00:00:00Z")));
    assert_eq!(extended.status, SubscriptionStatus::Trialing);

    // Ending it: active, billing from today, the first invoice issued.
    let ended = end_trial(&deps, &t, &sub.id, at(NOW)).await.unwrap();
    assert_eq!(ended.subscription.status, SubscriptionStatus::Active);
    assert_eq!(ended.subscription.billing_start, Some(nepal_day(at(NOW))));
    assert!(ended.invoice.created);
    assert_eq!(ended.invoice.invoice.subscription_id, sub.id);
    assert!(
        record::get::<PeriodClaim>(&*deps.store, &claim)
            .await
            .unwrap()
            .is_some()
    );
    // Not trialing any more: both refused as conflicts.
    let (status, code, _) = field_of(end_trial(&deps, &t, &sub.id, at(NOW)).await.unwrap_err());
    assert_eq!((status, code.as_str()), (409, SUBSCRIPTION_STATE_CONFLICT));
    let later = ExtendTrial {
        trial_ends_at: at("2026-03-01T00:00:00Z"),
    };
    let (status, _, _) = field_of(extend_trial(&deps, &t, &sub.id, later).await.unwrap_err());
    assert_eq!(status, 409);
}

#[tokio::test]
async fn bad_input_names_its_field() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p1");
    let c = customer(&deps, &t).await;
    let p = plan(&deps, &t, json!({})).await;
    let weekly = plan(&deps, &t, json!({"intervalUnit": "week"})).await;
    let off = plan(&deps, &t, json!({})).await;
    let patch: UpdatePlan = serde_json::from_value(json!({"active": false})).unwrap();
    plans::update(&deps, &t, &off.id, patch).await.unwrap();
    let other = tenant("p2");
    let theirs = customer(&deps, &other).await;
    let (cid, pid) = (c.id.to_string(), p.id.to_string());
    for (v, status, field) in [
        (
            json!({"customerId": cid, "planId": pid, "trialDays": 366}),
            400,
            "trialDays",
        ),
        (
            json!({"customerId": cid, "planId": pid, "trialDays": -1}),
            400,
            "trialDays",
        ),
        (
            json!({"customerId": cid, "planId": pid, "billingAnchorDay": 29}),
            400,
            "billingAnchorDay",
        ),
        (
            json!({"customerId": cid, "planId": pid, "billingAnchorDay": 0}),
            400,
            "billingAnchorDay",
        ),
        (
            json!({"customerId": cid, "planId": weekly.id, "billingAnchorDay": 5}),
            400,
            "billingAnchorDay",
        ),
        (
            json!({"customerId": cid, "planId": pid, "quantity": 2}),
            400,
            "quantity",
        ),
        (
            json!({"customerId": cid, "planId": pid, "startDate": "2026-01-09"}),
            400,
            "startDate",
        ),
        (
            json!({"customerId": cid, "planId": pid, "startDate": "2028-01-09"}),
            400,
            "startDate",
        ),
        (
            json!({"customerId": cid, "planId": pid, "startDate": "soon"}),
            400,
            "startDate",
        ),
        (
            json!({"customerId": cid, "planId": pid, "trialEndsAt": "2026-01-01T00:00:00Z"}),
            400,
            "trialEndsAt",
        ),
        (
            json!({"customerId": cid, "planId": pid, "referenceId": ""}),
            400,
            "referenceId",
        ),
        (
            json!({"customerId": cid, "planId": pid, "metadata": {"k": {"n": 1}}}),
            400,
            "metadata.k",
        ),
        (json!({"customerId": cid, "planId": off.id}), 400, "planId"),
        (
            json!({"customerId": theirs.id, "planId": pid}),
            404,
            "customerId",
        ),
        (
            json!({"customerId": "cus_nope", "planId": pid}),
            404,
            "customerId",
        ),
        (
            json!({"customerId": cid, "planId": "bp_01J0000000000000000000000"}),
            404,
            "planId",
        ),
    ] {
        match create_subscription(&deps, &t, body(v.clone()), None).await {
            Err(e) => {
                let (s, _, f) = field_of(e);
                assert_eq!((s, f.as_str()), (status, field), "{v}");
            }
            Ok(made) => panic!("accepted {v}: {:?}", made.subscription.status),
        }
    }
    assert_eq!(open_count(&deps, &t, &c.id).await, 0, "nothing was made");
    // A start on a later day is a draft: nothing billed yet.
    let draft = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": cid, "planId": pid, "startDate": "2026-02-01", "billingAnchorDay": 28})),
        None,
    )
    .await
    .unwrap();
    assert_eq!(draft.subscription.status, SubscriptionStatus::Draft);
    assert!(draft.first_invoice.is_none());
    assert_eq!(draft.subscription.billing_anchor_day, Some(28));
    assert_eq!(open_count(&deps, &t, &c.id).await, 1, "a draft is open");
}

#[tokio::test]
async fn a_retried_create_with_its_fence_makes_one_subscription() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p1");
    let c = customer(&deps, &t).await;
    let p = plan(&deps, &t, json!({})).await;
    let fence = Fence::new(Key::new("IDEMFENCE#p1#sandbox#k", "FENCE"), 5_000_000_000);
    let v = json!({"customerId": c.id, "planId": p.id});
    let first = create_subscription(&deps, &t, body(v.clone()), Some(&fence))
        .await
        .unwrap();
    let again = create_subscription(&deps, &t, body(v), Some(&fence))
        .await
        .unwrap();
    assert_eq!(first.subscription.id, again.subscription.id);
    let (a, b) = (first.first_invoice.unwrap(), again.first_invoice.unwrap());
    assert_eq!(a.invoice.id, b.invoice.id, "one first invoice");
    assert!(!b.created);
    assert_eq!(open_count(&deps, &t, &c.id).await, 1);
}

#[tokio::test]
async fn pause_resume_cancel_at_period_end_and_the_dunning_policy() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p1");
    let c = customer(&deps, &t).await;
    let p = plan(&deps, &t, json!({"trialDays": 7})).await;
    let sub = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id})),
        None,
    )
    .await
    .unwrap()
    .subscription;
    // A trialing subscription is not paused.
    let (s, code, _) = field_of(
        pause(&deps, &t, &sub.id, PauseSubscription::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((s, code.as_str()), (409, SUBSCRIPTION_STATE_CONFLICT));
    end_trial(&deps, &t, &sub.id, at(NOW)).await.unwrap();
    let past = PauseSubscription {
        pause_reason: None,
        resume_at: Some(at("2026-01-01T00:00:00Z")),
    };
    let (s, _, f) = field_of(pause(&deps, &t, &sub.id, past).await.unwrap_err());
    assert_eq!((s, f.as_str()), (400, "resumeAt"));
    let paused = pause(
        &deps,
        &t,
        &sub.id,
        PauseSubscription {
            pause_reason: Some("travelling".into()),
            resume_at: Some(at("2026-02-01T00:00:00Z")),
        },
    )
    .await
    .unwrap();
    assert_eq!(paused.status, SubscriptionStatus::Paused);
    assert_eq!(paused.pause_reason.as_deref(), Some("travelling"));
    assert_eq!(open_count(&deps, &t, &c.id).await, 1, "paused is not ended");
    let resumed = resume(&deps, &t, &sub.id).await.unwrap();
    assert_eq!(resumed.status, SubscriptionStatus::Active);
    assert_eq!(resumed.resume_at, None);
    let (s, _, _) = field_of(resume(&deps, &t, &sub.id).await.unwrap_err());
    assert_eq!(s, 409);

    let later = cancel(
        &deps,
        &t,
        &sub.id,
        CancelSubscription {
            cancel_reason: Some("moving".into()),
            at_period_end: Some(true),
        },
    )
    .await
    .unwrap();
    assert_eq!(later.status, SubscriptionStatus::Active);
    assert!(later.cancel_at_period_end);
    assert_eq!(
        open_count(&deps, &t, &c.id).await,
        1,
        "still open until the period ends"
    );

    // The dunning policy: the tenant's, or null for the default.
    let policy = new_policy(&t, "Gentle", &[3, 7], FinalAction::Pause, at(NOW)).unwrap();
    create_policy(&deps, &policy, false).await.unwrap();
    let set = |v: serde_json::Value| -> SetDunningPolicy { serde_json::from_value(v).unwrap() };
    let with = set_dunning_policy(&deps, &t, &sub.id, set(json!({"policyId": policy.id})))
        .await
        .unwrap();
    assert_eq!(with.dunning_policy_id.as_ref(), Some(&policy.id));
    let back = set_dunning_policy(&deps, &t, &sub.id, set(json!({"policyId": null})))
        .await
        .unwrap();
    assert_eq!(back.dunning_policy_id, None);
    let theirs = new_policy(&tenant("p2"), "Theirs", &[1], FinalAction::Cancel, at(NOW)).unwrap();
    create_policy(&deps, &theirs, false).await.unwrap();
    let (s, _, f) = field_of(
        set_dunning_policy(&deps, &t, &sub.id, set(json!({"policyId": theirs.id})))
            .await
            .unwrap_err(),
    );
    assert_eq!((s, f.as_str()), (404, "policyId"));
    let (s, _, f) = field_of(
        set_dunning_policy(&deps, &t, &sub.id, set(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((s, f.as_str()), (400, "policyId"));
}

#[tokio::test]
async fn lists_filter_by_status_customer_and_plan() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p1");
    let (a, b) = (customer(&deps, &t).await, customer(&deps, &t).await);
    let monthly = plan(&deps, &t, json!({})).await;
    let trial = plan(&deps, &t, json!({"trialDays": 5})).await;
    for (c, p) in [(&a, &monthly), (&a, &trial), (&b, &monthly)] {
        create_subscription(
            &deps,
            &t,
            body(json!({"customerId": c.id, "planId": p.id})),
            None,
        )
        .await
        .unwrap();
    }
    let page = PageRequest { page: 1, limit: 50 };
    let count = |f: ListFilter| {
        let deps = deps.clone();
        let t = t.clone();
        async move { list(&deps, &t, page, &f).await.unwrap() }
    };
    let (all, n) = count(ListFilter::default()).await;
    assert_eq!((all.len(), n), (3, 3));
    assert_eq!(all[0].customer_id, b.id, "newest first");
    let by =
        |s: Option<&str>, c: Option<&str>, p: Option<&str>| ListFilter::parse(s, c, p).unwrap();
    assert_eq!(count(by(Some("trialing"), None, None)).await.1, 1);
    assert_eq!(
        count(by(Some("incomplete"), Some(a.id.as_str()), None))
            .await
            .1,
        1
    );
    assert_eq!(count(by(None, None, Some(monthly.id.as_str()))).await.1, 2);
    assert_eq!(
        count(by(None, Some(b.id.as_str()), Some(trial.id.as_str())))
            .await
            .1,
        0
    );
    let (one, n) = list(
        &deps,
        &t,
        PageRequest { page: 2, limit: 2 },
        &ListFilter::default(),
    )
    .await
    .unwrap();
    assert_eq!((one.len(), n), (1, 3));
    let (none, n) = list(&deps, &tenant("p2"), page, &ListFilter::default())
        .await
        .unwrap();
    assert!(none.is_empty() && n == 0);
    for (s, c, p, field) in [
        (Some("nope"), None, None, "status"),
        (None, Some("x"), None, "customerId"),
        (None, None, Some("x"), "planId"),
    ] {
        let e = ListFilter::parse(s, c, p).unwrap_err();
        assert_eq!(Refusal::from(e).field.as_deref(), Some(field));
    }
}

/// Two creates for one customer at once both count; two cancels of one
/// subscription at once: one cancels, the other is a conflict, and the
/// count is lowered once. On both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_and_cancels_keep_the_count_exact() {
    for (backend, store) in stores().await {
        let deps = deps_on(store);
        let t = tenant("p_race");
        let c = customer(&deps, &t).await;
        let p = plan(&deps, &t, json!({"trialDays": 3})).await;
        let creates: Vec<_> = (0..8)
            .map(|_| {
                let deps = deps.clone();
                let t = t.clone();
                let v = json!({"customerId": c.id, "planId": p.id});
                tokio::spawn(async move { create_subscription(&deps, &t, body(v), None).await })
            })
            .collect();
        let mut subs = Vec::new();
        for task in futures::future::join_all(creates).await {
            let made = task.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}"));
            subs.push(made.subscription.id);
        }
        assert_eq!(open_count(&deps, &t, &c.id).await, 8, "{backend}");

        let target = subs[0].clone();
        let cancels: Vec<_> = (0..6)
            .map(|_| {
                let deps = deps.clone();
                let t = t.clone();
                let id = target.clone();
                tokio::spawn(
                    async move { cancel(&deps, &t, &id, CancelSubscription::default()).await },
                )
            })
            .collect();
        let mut won = 0;
        for task in futures::future::join_all(cancels).await {
            match task.unwrap() {
                Ok(s) => {
                    assert_eq!(s.status, SubscriptionStatus::Cancelled);
                    won += 1;
                }
                Err(e) => {
                    let (s, code, _) = field_of(e);
                    assert_eq!(
                        (s, code.as_str()),
                        (409, SUBSCRIPTION_STATE_CONFLICT),
                        "{backend}"
                    );
                }
            }
        }
        assert_eq!(won, 1, "{backend}: one cancel ended it");
        assert_eq!(
            open_count(&deps, &t, &c.id).await,
            7,
            "{backend}: lowered once"
        );
    }
}

/// A customer's delete racing a subscription's create: either the
/// subscription lands first and the delete is refused, or the delete
/// lands first and the create finds no customer. Never a subscription
/// of a deleted customer. On both backends, several rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_racing_a_create_leaves_no_orphan() {
    for (backend, store) in stores().await {
        let deps = deps_on(store);
        let t = tenant("p_orphan");
        let p = plan(&deps, &t, json!({})).await;
        for round in 0..6 {
            let c = customer(&deps, &t).await;
            let create = {
                let (deps, t) = (deps.clone(), t.clone());
                let v = json!({"customerId": c.id, "planId": p.id});
                tokio::spawn(async move { create_subscription(&deps, &t, body(v), None).await })
            };
            let delete = {
                let (deps, t, id) = (deps.clone(), t.clone(), c.id.clone());
                tokio::spawn(async move { customers::delete(&deps, &t, &id).await })
            };
            let (made, deleted) = (create.await.unwrap(), delete.await.unwrap());
            match (made, deleted) {
                (Ok(m), Err(BillingError::HasSubscriptions(_))) => {
                    assert_eq!(m.subscription.customer_id, c.id);
                    assert_eq!(open_count(&deps, &t, &c.id).await, 1, "{backend} {round}");
                }
                (Err(e), Ok(())) => {
                    let (s, _, f) = field_of(e);
                    assert_eq!((s, f.as_str()), (404, "customerId"), "{backend} {round}");
                    let (subs, _) = list(
                        &deps,
                        &t,
                        PageRequest { page: 1, limit: 50 },
                        &ListFilter {
                            customer_id: Some(c.id.clone()),
                            ..ListFilter::default()
                        },
                    )
                    .await
                    .unwrap();
                    assert!(subs.is_empty(), "{backend} {round}: an orphan");
                }
                (made, deleted) => panic!(
                    "{backend} {round}: create {:?}, delete {deleted:?}",
                    made.map(|m| m.subscription.status)
                ),
            }
        }
    }
}

/// On a test clock every transition is decided and stamped at the
/// clock's time, never the real one; while the clock advances nothing
/// on it changes (409 `state_conflict`), and once it is deleted its
/// subscriptions stay as they are (409 `subscription_state_conflict`).
#[tokio::test]
async fn every_transition_on_a_clock_reads_the_clock_time() {
    use crate::domain::billing::test_clock::{self, TestClock};
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant("p_clock");
    // The clock is behind the real time (NOW, 2026-01-10): a time valid
    // on the clock is in the real past.
    let c0 = at("2025-06-01T00:00:00Z");
    let day = |n: i64| c0.plus(Duration::days(n));
    let clock = test_clock::create(&deps, &t, "walk", c0, at(NOW))
        .await
        .unwrap();
    let on_clock: CreateCustomer =
        serde_json::from_value(json!({"name": "Sita Rai", "testClockId": clock.id})).unwrap();
    let c = test_clock::create_customer(&deps, &t, on_clock, None)
        .await
        .unwrap();
    let p = plan(&deps, &t, json!({"trialDays": 14})).await;
    let sub = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id})),
        None,
    )
    .await
    .unwrap()
    .subscription;
    assert_eq!(sub.created_at, c0);
    assert_eq!(sub.trial_ends_at, Some(day(14)));

    let extended = extend_trial(
        &deps,
        &t,
        &sub.id,
        ExtendTrial {
            trial_ends_at: day(20),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (extended.trial_ends_at, extended.updated_at),
        (Some(day(20)), c0)
    );

    let ended = end_trial(&deps, &t, &sub.id, at(NOW)).await.unwrap();
    assert_eq!(ended.subscription.trial_ends_at, Some(c0));
    assert_eq!(ended.subscription.billing_start, Some(nepal_day(c0)));
    assert_eq!(ended.invoice.invoice.issued_at, c0);
    assert_eq!(ended.invoice.invoice.period_start, nepal_day(c0));

    // Five days on the clock is in the real past: accepted.
    let paused = pause(
        &deps,
        &t,
        &sub.id,
        PauseSubscription {
            pause_reason: None,
            resume_at: Some(day(5)),
        },
    )
    .await
    .unwrap();
    assert_eq!((paused.resume_at, paused.updated_at), (Some(day(5)), c0));

    // The clock advancing: nothing on it changes.
    let seen = test_clock::get(&deps, &t, &clock.id).await.unwrap();
    let moving = test_clock::advanced(&seen, day(1), at(NOW))
        .unwrap()
        .unwrap();
    let moving = test_clock::save(&deps, &seen, moving).await.unwrap();
    let (s, code, _) = field_of(resume(&deps, &t, &sub.id).await.unwrap_err());
    assert_eq!((s, code.as_str()), (409, "state_conflict"));
    let more = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id})),
        None,
    )
    .await
    .unwrap_err();
    let (s, code, _) = field_of(more);
    assert_eq!((s, code.as_str()), (409, "state_conflict"));
    let ready: TestClock = test_clock::save(&deps, &moving, test_clock::finished(&moving, at(NOW)))
        .await
        .unwrap();

    let resumed = resume(&deps, &t, &sub.id).await.unwrap();
    assert_eq!(resumed.updated_at, ready.frozen_time);
    let set: SetDunningPolicy = serde_json::from_value(json!({"policyId": null})).unwrap();
    let with = set_dunning_policy(&deps, &t, &sub.id, set).await.unwrap();
    assert_eq!(with.updated_at, day(1));
    let cancelled = cancel(&deps, &t, &sub.id, CancelSubscription::default())
        .await
        .unwrap();
    assert_eq!(cancelled.cancelled_at, Some(day(1)));

    // A deleted clock's subscription no longer changes.
    let other = create_subscription(
        &deps,
        &t,
        body(json!({"customerId": c.id, "planId": p.id})),
        None,
    )
    .await
    .unwrap()
    .subscription;
    test_clock::delete(&deps, &t, &clock.id).await.unwrap();
    let (s, code, _) = field_of(
        cancel(&deps, &t, &other.id, CancelSubscription::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((s, code.as_str()), (409, SUBSCRIPTION_STATE_CONFLICT));
}

#[tokio::test]
async fn a_first_invoice_with_nothing_to_pay_is_paid_at_issue_and_the_subscription_active() {
    // A metered plan bills usage in arrears: its first invoice is zero.
    for (name, store) in stores().await {
        let deps = deps_on(store.clone());
        let t = tenant("p-zero");
        let c = customer(&deps, &t).await;
        let p = plan(&deps, &t, json!({"pricingModel": "metered", "amount": 500})).await;
        let made = create_subscription(
            &deps,
            &t,
            body(json!({"customerId": c.id, "planId": p.id})),
            None,
        )
        .await
        .unwrap();
        let inv = made.first_invoice.expect("first invoice").invoice;
        assert_eq!(inv.status, InvoiceStatus::Paid, "{name}");
        assert_eq!((inv.total, inv.amount_due, inv.amount_paid), (0, 0, 0));
        assert!(
            inv.lines.is_empty(),
            "{name}: no flat line on a metered plan"
        );
        assert_eq!(inv.paid_at, Some(at(NOW)));
        assert_eq!(
            made.subscription.status,
            SubscriptionStatus::Active,
            "{name}"
        );
        let stored = subscription::get(&deps, &t, &made.subscription.id)
            .await
            .unwrap();
        assert_eq!(stored.status, SubscriptionStatus::Active, "{name}");
        // Nothing to remind of: no notice schedule was written.
        let notices = store
            .get(&crate::domain::billing::notice_due::NoticeSchedule::invoice_key(&inv.id))
            .await
            .unwrap();
        assert!(notices.is_none(), "{name}");
        // Both webhooks, created then paid.
        let types: Vec<&str> = crate::domain::outbox::recent(&*store, &t, 50)
            .await
            .unwrap()
            .iter()
            .map(|e| e.event_type.as_str())
            .collect();
        assert!(
            types.contains(&"billing_invoice.created"),
            "{name}: {types:?}"
        );
        assert!(types.contains(&"billing_invoice.paid"), "{name}: {types:?}");
    }
}

#[test]
fn a_plan_names_its_pricing_model_and_refuses_another() {
    let t = tenant("p-pm");
    let mk = |pm: serde_json::Value| {
        let body: CreatePlan = serde_json::from_value(
            json!({"name": "Seats", "amount": 10_000, "intervalUnit": "month", "pricingModel": pm}),
        )
        .unwrap();
        plans::new_plan(&t, body, at(NOW))
    };
    assert_eq!(
        mk(json!("per_unit")).unwrap().pricing_model,
        PricingModel::PerUnit
    );
    assert_eq!(
        mk(json!("metered")).unwrap().pricing_model,
        PricingModel::Metered
    );
    let e = mk(json!("tiered")).unwrap_err();
    assert_eq!(Refusal::from(e).field.as_deref(), Some("pricingModel"));
    // The guide's `billingScheme` says the same; contradicting is refused.
    let scheme = |v: serde_json::Value| {
        let mut b = json!({"name": "Calls", "amount": 10, "intervalUnit": "month"});
        if let (Some(o), Some(e)) = (b.as_object_mut(), v.as_object()) {
            o.extend(e.clone());
        }
        let body: CreatePlan = serde_json::from_value(b).unwrap();
        plans::new_plan(&t, body, at(NOW))
    };
    let m = scheme(json!({"billingScheme": "metered"})).unwrap();
    assert_eq!(m.pricing_model, PricingModel::Metered);
    assert_eq!(plans::PlanView::of(&m).billing_scheme, "metered");
    assert_eq!(
        scheme(json!({"billingScheme": "per_unit"}))
            .unwrap()
            .pricing_model,
        PricingModel::PerUnit
    );
    assert_eq!(scheme(json!({})).unwrap().pricing_model, PricingModel::Flat);
    let e = scheme(json!({"billingScheme": "metered", "pricingModel": "per_unit"})).unwrap_err();
    assert_eq!(Refusal::from(e).field.as_deref(), Some("billingScheme"));
    let e = scheme(json!({"billingScheme": "tiered"})).unwrap_err();
    assert_eq!(Refusal::from(e).field.as_deref(), Some("billingScheme"));
}
