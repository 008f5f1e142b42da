use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::AppState;
use crate::domain::billing::coupons::{
    CreateCoupon, CreatePromotionCode, create_coupon, create_promotion_code, get_coupon,
    get_promotion_code,
};
use crate::domain::billing::customers::{self, CreateCustomer};
use crate::domain::billing::lifecycle::{CancelSubscription, CreateSubscription};
use crate::domain::billing::plans::{self, CreatePlan};
use crate::domain::billing::testenv::deps_at;
use crate::ids::PlanId;
use crate::store::Store;
use crate::testenv::at;

const NOW: &str = "2026-01-10T06:00:00Z";

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, NOW)
}

fn tenant() -> Tenant {
    Tenant::new("p1", Mode::Sandbox)
}

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

async fn plan(deps: &Deps, name: &str) -> PlanId {
    let body: CreatePlan = ok(serde_json::from_value(
        json!({"name": name, "amount": 150_000, "intervalUnit": "month", "trialDays": 14}),
    ));
    ok(plans::create(deps, &tenant(), body, None).await).id
}

/// A trialing subscription of a new customer on `plan`.
async fn subscription(deps: &Deps, plan: &PlanId) -> Subscription {
    let body: CreateCustomer = ok(serde_json::from_value(json!({"name": "Sita"})));
    let c = ok(customers::create(deps, &tenant(), body, None).await);
    let body: CreateSubscription = ok(serde_json::from_value(
        json!({"customerId": c.id, "planId": plan}),
    ));
    ok(lifecycle::create_subscription(deps, &tenant(), body, None).await).subscription
}

async fn coupon(deps: &Deps, v: serde_json::Value) -> Coupon {
    let mut b = json!({"code": "C", "name": "Launch", "discountType": "percent", "percentOff": 50, "duration": "once"});
    if let (Some(o), Some(e)) = (b.as_object_mut(), v.as_object()) {
        o.extend(e.clone());
    }
    let body: CreateCoupon = ok(serde_json::from_value(b));
    ok(create_coupon(deps, &tenant(), body, None).await)
}

async fn promo(deps: &Deps, coupon: &CouponId, v: serde_json::Value) -> PromotionCode {
    let mut b = json!({"couponId": coupon, "code": "LAUNCH50"});
    if let (Some(o), Some(e)) = (b.as_object_mut(), v.as_object()) {
        o.extend(e.clone());
    }
    let body: CreatePromotionCode = ok(serde_json::from_value(b));
    ok(create_promotion_code(deps, &tenant(), body, None).await)
}

fn by_code(code: &str) -> ApplyCoupon {
    ApplyCoupon {
        coupon_id: None,
        promotion_code: Some(code.into()),
    }
}

fn by_coupon(id: &CouponId) -> ApplyCoupon {
    ApplyCoupon {
        coupon_id: Some(id.to_string()),
        promotion_code: None,
    }
}

fn refusal(e: DiscountError) -> (String, String, String) {
    let r = Refusal::from(e);
    let reason = r
        .extra
        .as_ref()
        .and_then(|(_, v)| v.as_str())
        .unwrap_or_default()
        .to_owned();
    (r.code.to_owned(), r.field.unwrap_or_default(), reason)
}

#[test]
fn each_duration_consumes_as_the_guide_says() {
    let now = at(NOW);
    let d = |cycles: Option<u32>| Discount {
        subscription_id: SubscriptionId::new(),
        project_id: "p1".into(),
        mode: Mode::Sandbox,
        coupon_id: CouponId::new(),
        coupon_code: "C".into(),
        name: "Launch".into(),
        promotion_code_id: None,
        promotion_code: None,
        terms: CouponTerms {
            discount_type: DiscountType::Percent,
            percent_off: Some(50),
            amount_off: None,
            duration: match cycles {
                None => CouponDuration::Forever,
                Some(1) => CouponDuration::Once,
                Some(_) => CouponDuration::Repeating,
            },
            duration_in_cycles: cycles.filter(|n| *n > 1),
            applies_to_plan_ids: None,
        },
        cycles_left: cycles,
        status: DiscountStatus::Active,
        version: 3,
        applied_at: now,
        ended_at: None,
        updated_at: now,
    };
    let once = d(Some(1)).consumed(now);
    assert_eq!(once.status, DiscountStatus::Ended);
    assert_eq!((once.cycles_left, once.version), (Some(0), 4));
    let two = d(Some(2)).consumed(now);
    assert_eq!(
        (two.status, two.cycles_left),
        (DiscountStatus::Active, Some(1))
    );
    let two = two.consumed(now);
    assert_eq!(
        (two.status, two.cycles_left),
        (DiscountStatus::Ended, Some(0))
    );
    let forever = d(None);
    assert_eq!(forever.consumed(now), forever, "forever: nothing changes");
    // Every op is conditioned on the version read.
    for disc in [d(Some(1)), d(Some(2)), d(None)] {
        for op in disc.consume_ops(now) {
            let cond = match op {
                TxOp::Update { cond, .. } => cond,
                TxOp::Check { cond, .. } => Some(cond),
                _ => None,
            };
            assert_eq!(cond, Some(Discount::VERSION.eq(&3i64)));
        }
    }
}

#[tokio::test]
async fn apply_replace_and_remove() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant();
    let fibre = plan(&deps, "Fibre").await;
    let tv = plan(&deps, "TV").await;
    let sub = subscription(&deps, &fibre).await;
    let half = coupon(&deps, json!({"code": "HALF", "maxRedemptions": 10})).await;
    let code = promo(&deps, &half.id, json!({"maxRedemptions": 5})).await;

    let a = ok(apply(&deps, &t, &sub.id, by_code("launch50"), None).await);
    let d = a.discount.clone().unwrap_or_else(|| panic!("a discount"));
    assert_eq!(d.coupon_id, half.id.to_string());
    assert_eq!(d.promotion_code.as_deref(), Some("LAUNCH50"));
    assert_eq!(d.cycles_remaining, Some(1));
    let json = serde_json::to_value(&a).unwrap_or_default();
    assert_eq!(
        json["id"],
        sub.id.as_str(),
        "the subscription, flat: {json}"
    );
    assert_eq!(json["discount"]["percentOff"], 50);
    assert_eq!(ok(get_coupon(&deps, &t, &half.id).await).redeemed_count, 1);
    assert_eq!(
        ok(get_promotion_code(&deps, &t, &code.id).await).redeemed_count,
        1
    );

    // Another replaces it (the version moves on); the counters of the
    // first stay.
    let ten = coupon(
        &deps,
        json!({"code": "TEN", "discountType": "amount", "percentOff": null, "amountOff": 10_000, "duration": "repeating", "durationInCycles": 3}),
    )
    .await;
    let b = ok(apply(&deps, &t, &sub.id, by_coupon(&ten.id), None).await);
    let d = b.discount.unwrap_or_else(|| panic!("a discount"));
    assert_eq!((d.amount_off, d.cycles_remaining), (Some(10_000), Some(3)));
    let stored = ok(get(&deps, &sub.id).await).unwrap_or_else(|| panic!("stored"));
    assert_eq!(stored.version, 2);
    assert_eq!(ok(get_coupon(&deps, &t, &half.id).await).redeemed_count, 1);

    // A coupon for another plan, an unknown code, both or neither: 400
    // naming the field, nothing changed.
    let tv_only = coupon(&deps, json!({"code": "TVONLY", "appliesToPlanIds": [tv]})).await;
    let (code_, field, why) = refusal(
        apply(&deps, &t, &sub.id, by_coupon(&tv_only.id), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("applied")),
    );
    assert_eq!(
        (code_.as_str(), field.as_str(), why.as_str()),
        ("validation_failed", "couponId", "plan_not_eligible")
    );
    let (_, field, why) = refusal(
        apply(&deps, &t, &sub.id, by_code("NOPE"), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("applied")),
    );
    assert_eq!(
        (field.as_str(), why.as_str()),
        ("promotionCode", "no_such_code")
    );
    let both = ApplyCoupon {
        coupon_id: Some(ten.id.to_string()),
        promotion_code: Some("LAUNCH50".into()),
    };
    let (_, field, _) = refusal(
        apply(&deps, &t, &sub.id, both, None)
            .await
            .err()
            .unwrap_or_else(|| panic!("applied")),
    );
    assert_eq!(field, "promotionCode");
    let (_, field, _) = refusal(
        apply(&deps, &t, &sub.id, ApplyCoupon::default(), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("applied")),
    );
    assert_eq!(field, "couponId");
    assert_eq!(ok(get(&deps, &sub.id).await).map(|d| d.version), Some(2));

    let r = ok(remove(&deps, &t, &sub.id).await);
    assert!(r.discount.is_none());
    let (code_, _, _) = refusal(
        remove(&deps, &t, &sub.id)
            .await
            .err()
            .unwrap_or_else(|| panic!("removed twice")),
    );
    assert_eq!(code_, "not_found");
    let events = ok(crate::domain::outbox::recent(&*deps.store, &t, 50).await);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event_type == EventType::SubscriptionUpdated)
            .count(),
        3,
        "two applies and a removal"
    );

    // An ended subscription takes none.
    let cancel: CancelSubscription = ok(serde_json::from_value(json!({})));
    ok(lifecycle::cancel(&deps, &t, &sub.id, cancel).await);
    let (code_, _, _) = refusal(
        apply(&deps, &t, &sub.id, by_coupon(&ten.id), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("applied")),
    );
    assert_eq!(code_, "subscription_state_conflict");
    // Another tenant's subscription: not found.
    let other = Tenant::new("p2", Mode::Sandbox);
    let (code_, _, _) = refusal(
        apply(&deps, &other, &sub.id, by_coupon(&ten.id), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("applied")),
    );
    assert_eq!(code_, "not_found");
}

#[tokio::test]
async fn a_forever_discount_ends_with_its_coupon_others_stay() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant();
    let fibre = plan(&deps, "Fibre").await;
    let a = subscription(&deps, &fibre).await;
    let b = subscription(&deps, &fibre).await;
    let forever = coupon(&deps, json!({"code": "F", "duration": "forever"})).await;
    let once = coupon(&deps, json!({"code": "O"})).await;
    ok(apply(&deps, &t, &a.id, by_coupon(&forever.id), None).await);
    ok(apply(&deps, &t, &b.id, by_coupon(&once.id), None).await);
    assert!(matches!(
        ok(for_invoice(&deps, &a).await),
        ForInvoice::Applies(_)
    ));
    ok(crate::domain::billing::coupons::deactivate_coupon(&deps, &t, &forever.id).await);
    ok(crate::domain::billing::coupons::deactivate_coupon(&deps, &t, &once.id).await);
    assert!(matches!(
        ok(for_invoice(&deps, &a).await),
        ForInvoice::Ends(_)
    ));
    assert!(matches!(
        ok(for_invoice(&deps, &b).await),
        ForInvoice::Applies(_)
    ));
}

/// The race of the issue: 50 subscriptions apply a code with one
/// redemption left, at once. Exactly one wins; the others are told the
/// limit is reached; the counters stop at the cap.
async fn race_for_the_last_redemption(store: Arc<dyn Store>) {
    let deps = deps_on(store);
    let t = tenant();
    let fibre = plan(&deps, "Fibre").await;
    let c = coupon(&deps, json!({"code": "RACE", "maxRedemptions": 100})).await;
    let p = promo(&deps, &c.id, json!({"code": "LAST", "maxRedemptions": 2})).await;
    // One of the two is taken before the race.
    let first = subscription(&deps, &fibre).await;
    ok(apply(&deps, &t, &first.id, by_code("LAST"), None).await);
    let mut subs = Vec::new();
    for _ in 0..50 {
        subs.push(subscription(&deps, &fibre).await);
    }
    let tasks: Vec<_> = subs
        .iter()
        .map(|s| {
            let deps = deps.clone();
            let t = t.clone();
            let id = s.id.clone();
            tokio::spawn(async move { apply(&deps, &t, &id, by_code("last"), None).await })
        })
        .collect();
    let mut won = 0;
    for task in tasks {
        match task.await.unwrap_or_else(|e| panic!("{e}")) {
            Ok(_) => won += 1,
            Err(e) => {
                let (_, field, why) = refusal(e);
                assert_eq!(
                    (field.as_str(), why.as_str()),
                    ("promotionCode", "promotion_code_redemption_limit_reached")
                );
            }
        }
    }
    assert_eq!(won, 1, "exactly one winner");
    assert_eq!(
        ok(get_promotion_code(&deps, &t, &p.id).await).redeemed_count,
        2
    );
    assert_eq!(ok(get_coupon(&deps, &t, &c.id).await).redeemed_count, 2);
    let mut discounted = 0;
    for s in &subs {
        if ok(active(&deps, &s.id).await).is_some() {
            discounted += 1;
        }
    }
    assert_eq!(discounted, 1, "one discount written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_racing_for_the_last_redemption_make_one_winner() {
    race_for_the_last_redemption(crate::testenv::memory_store()).await;
}

/// A subscription billing at once (no trial), with its first invoice.
async fn billing_subscription(
    deps: &Deps,
) -> (
    Subscription,
    crate::domain::billing::invoice::BillingInvoice,
) {
    let body: CreatePlan = ok(serde_json::from_value(
        json!({"name": "Now", "amount": 150_000, "intervalUnit": "month"}),
    ));
    let plan = ok(plans::create(deps, &tenant(), body, None).await).id;
    let body: CreateCustomer = ok(serde_json::from_value(json!({"name": "Ram"})));
    let c = ok(customers::create(deps, &tenant(), body, None).await);
    let body: CreateSubscription = ok(serde_json::from_value(
        json!({"customerId": c.id, "planId": plan}),
    ));
    let made = ok(lifecycle::create_subscription(deps, &tenant(), body, None).await);
    let first = made
        .first_invoice
        .unwrap_or_else(|| panic!("a first invoice"));
    (made.subscription, first.invoice)
}

async fn issue(
    deps: &Deps,
    sub: &Subscription,
    index: u32,
) -> crate::domain::billing::invoice::BillingInvoice {
    let period = sub
        .period(index)
        .unwrap_or_else(|| panic!("period {index}"));
    let issued =
        ok(crate::domain::billing::invoice::issue_invoice(deps, sub, period, at(NOW)).await);
    assert!(issued.created);
    issued.invoice
}

#[tokio::test]
async fn invoices_take_the_discount_for_its_cycles_then_not() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant();
    let (sub, first) = billing_subscription(&deps).await;
    assert_eq!(first.discount_total, 0, "applied after the first invoice");
    let c = coupon(
        &deps,
        json!({"code": "TWO", "percentOff": 15, "duration": "repeating", "durationInCycles": 2}),
    )
    .await;
    ok(apply(&deps, &t, &sub.id, by_coupon(&c.id), None).await);
    let second = issue(&deps, &sub, 1).await;
    assert_eq!(second.discount_total, 22_500, "15% of 1,500");
    assert_eq!(second.amount_due, 127_500);
    assert_eq!(
        second.discount.as_ref().map(|d| d.coupon_id.clone()),
        Some(c.id.clone())
    );
    let d = ok(get(&deps, &sub.id).await).unwrap_or_else(|| panic!("stored"));
    assert_eq!((d.cycles_left, d.status), (Some(1), DiscountStatus::Active));
    let third = issue(&deps, &sub, 2).await;
    assert_eq!(third.discount_total, 22_500);
    let d = ok(get(&deps, &sub.id).await).unwrap_or_else(|| panic!("stored"));
    assert_eq!((d.cycles_left, d.status), (Some(0), DiscountStatus::Ended));
    let fourth = issue(&deps, &sub, 3).await;
    assert_eq!(fourth.discount_total, 0, "two cycles only");
    assert_eq!(fourth.amount_due, 150_000);

    // An amount larger than the invoice makes it zero, never negative;
    // a coupon deactivated after it was applied still applies (once).
    let big = coupon(
        &deps,
        json!({"code": "BIG", "discountType": "amount", "percentOff": null, "amountOff": 500_000}),
    )
    .await;
    ok(apply(&deps, &t, &sub.id, by_coupon(&big.id), None).await);
    ok(crate::domain::billing::coupons::deactivate_coupon(&deps, &t, &big.id).await);
    let fifth = issue(&deps, &sub, 4).await;
    assert_eq!((fifth.discount_total, fifth.amount_due), (150_000, 0));
}

/// The hook's ops hold only if the discount is as `gather` read it: one
/// applied or removed meanwhile fails the issue's transaction (which then
/// reads again), so a cycle is never consumed from the wrong discount.
#[tokio::test]
async fn a_discount_changed_meanwhile_fails_the_issue_hook() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant();
    let (sub, first) = billing_subscription(&deps).await;
    for duration in [
        json!({"code": "A"}),
        json!({"code": "B", "duration": "forever"}),
    ] {
        let c = coupon(&deps, duration).await;
        ok(apply(&deps, &t, &sub.id, by_coupon(&c.id), None).await);
        let (terms, hook) = ok(for_issue(&deps, &sub, at(NOW)).await);
        assert!(terms.is_some());
        let hook = hook.unwrap_or_else(|| panic!("a hook"));
        ok(remove(&deps, &t, &sub.id).await);
        let ops = ok(hook(&first));
        let e = deps
            .store
            .transact(ops)
            .await
            .err()
            .unwrap_or_else(|| panic!("held"));
        assert!(e.is_condition_failure(), "{e:?}");
    }
    // Nothing active: no terms, no hook.
    let (terms, hook) = ok(for_issue(&deps, &sub, at(NOW)).await);
    assert!(terms.is_none() && hook.is_none());
}

/// A cycle is spent only on an invoice the discount took something off: a
/// metered period with no usage bills nothing and leaves a `once` coupon
/// for the next invoice.
#[tokio::test]
async fn an_invoice_with_nothing_to_discount_spends_no_cycle() {
    let deps = deps_on(crate::testenv::memory_store());
    let t = tenant();
    let body: CreatePlan = ok(serde_json::from_value(
        json!({"name": "Calls", "amount": 50, "intervalUnit": "month", "pricingModel": "metered"}),
    ));
    let plan = ok(plans::create(&deps, &t, body, None).await).id;
    let body: CreateCustomer = ok(serde_json::from_value(json!({"name": "Sita"})));
    let c = ok(customers::create(&deps, &t, body, None).await);
    let body: CreateSubscription = ok(serde_json::from_value(
        json!({"customerId": c.id, "planId": plan}),
    ));
    let sub = ok(lifecycle::create_subscription(&deps, &t, body, None).await).subscription;
    let once = coupon(
        &deps,
        json!({"code": "ONCE", "percentOff": 10, "duration": "once"}),
    )
    .await;
    ok(apply(&deps, &t, &sub.id, by_coupon(&once.id), None).await);
    let empty = issue(&deps, &sub, 1).await;
    assert_eq!((empty.total, empty.discount_total), (0, 0));
    assert!(empty.discount.is_none());
    let d = ok(get(&deps, &sub.id).await).unwrap_or_else(|| panic!("stored"));
    assert_eq!(
        d.status,
        DiscountStatus::Active,
        "kept for the next invoice"
    );
}
