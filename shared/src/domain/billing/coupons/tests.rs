use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::AppState;
use crate::domain::billing::customers::{self, CreateCustomer};
use crate::domain::billing::plans::CreatePlan;
use crate::domain::billing::testenv::deps_with;
use crate::refusal::Refusal;
use crate::store::Store;
use crate::store::embedded::EmbeddedStore;
use crate::testenv::at;
use crate::time::ManualClock;

const NOW: &str = "2026-01-10T06:00:00Z";

fn deps_on(store: Arc<dyn Store>, clock: ManualClock) -> AppState {
    deps_with(store, Arc::new(clock))
}

fn tenant() -> Tenant {
    Tenant::new("p1", Mode::Sandbox)
}

fn coupon_body(extra: serde_json::Value) -> CreateCoupon {
    let mut v = json!({"code": "LAUNCH", "name": "Launch", "discountType": "percent", "percentOff": 50, "duration": "once"});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, val) in e {
            if val.is_null() {
                o.remove(k);
            } else {
                o.insert(k.clone(), val.clone());
            }
        }
    }
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

fn field_of(e: impl Into<Refusal>) -> String {
    e.into().field.unwrap_or_default()
}

#[test]
fn the_coupon_validation_table() {
    let now = at(NOW);
    for (extra, field) in [
        (json!({"percentOff": 0}), "percentOff"),
        (json!({"percentOff": 101}), "percentOff"),
        (json!({"percentOff": -5}), "percentOff"),
        (json!({"percentOff": null}), "percentOff"),
        (json!({"amountOff": 500}), "amountOff"),
        (
            json!({"discountType": "amount", "percentOff": null, "amountOff": 0}),
            "amountOff",
        ),
        (
            json!({"discountType": "amount", "percentOff": null, "amountOff": -100}),
            "amountOff",
        ),
        (json!({"discountType": "amount"}), "percentOff"),
        (json!({"discountType": "fixed"}), "discountType"),
        // Refused, not trimmed.
        (json!({"discountType": " percent"}), "discountType"),
        (json!({"discountType": "Percent"}), "discountType"),
        (json!({"duration": "weekly"}), "duration"),
        (json!({"duration": "once "}), "duration"),
        (json!({"duration": "repeating"}), "durationInCycles"),
        (
            json!({"duration": "repeating", "durationInCycles": 0}),
            "durationInCycles",
        ),
        (json!({"durationInCycles": 3}), "durationInCycles"),
        (json!({"maxRedemptions": 0}), "maxRedemptions"),
        (json!({"redeemBy": "2025-01-01T00:00:00Z"}), "redeemBy"),
        (json!({"appliesToPlanIds": []}), "appliesToPlanIds"),
        (json!({"appliesToPlanIds": ["nope"]}), "appliesToPlanIds"),
        (json!({"currency": "USD"}), "currency"),
        (json!({"projectIds": ["proj_x"]}), "projectIds"),
        (json!({"code": "has space"}), "code"),
        (json!({"code": ""}), "code"),
        (json!({"name": " "}), "name"),
    ] {
        match new_coupon(&tenant(), coupon_body(extra.clone()), now) {
            Err(e) => assert_eq!(field_of(e), field, "{extra}"),
            Ok(_) => panic!("accepted {extra}"),
        }
    }
    let c = new_coupon(
        &tenant(),
        coupon_body(json!({"duration": "repeating", "durationInCycles": 3, "maxRedemptions": 100})),
        now,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.id.as_str().starts_with("cpn_"));
    assert_eq!(c.terms.duration_in_cycles, Some(3));
    assert_eq!(c.terms.percent_off, Some(50));
    assert_eq!(c.max_redemptions, Some(100));
    assert!(c.active);
}

#[test]
fn a_discount_is_rounded_half_up_and_never_more_than_the_amount() {
    let now = at(NOW);
    let pct = |p: i64| {
        new_coupon(&tenant(), coupon_body(json!({"percentOff": p})), now)
            .unwrap_or_else(|e| panic!("{e}"))
            .terms
    };
    assert_eq!(pct(15).discount_on(99_999), 15_000, "14,999.85 rounds up");
    assert_eq!(pct(15).discount_on(99_990), 14_999, "14,998.5 rounds up");
    assert_eq!(pct(33).discount_on(1), 0);
    assert_eq!(pct(50).discount_on(1), 1, "0.5 rounds up");
    assert_eq!(pct(100).discount_on(150_000), 150_000);
    let amount = new_coupon(
        &tenant(),
        coupon_body(json!({"discountType": "amount", "percentOff": null, "amountOff": 200_000})),
        now,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .terms;
    assert_eq!(amount.discount_on(150_000), 150_000, "capped at the amount");
    assert_eq!(amount.discount_on(500_000), 200_000);
    assert_eq!(amount.discount_on(-5), 0);
}

async fn plan(deps: &Deps, amount: i64) -> PlanId {
    let body: CreatePlan =
        serde_json::from_value(json!({"name": "Fibre", "amount": amount, "intervalUnit": "month"}))
            .unwrap_or_else(|e| panic!("{e}"));
    plans::create(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .id
}

async fn customer(deps: &Deps) -> CustomerId {
    let body: CreateCustomer =
        serde_json::from_value(json!({"name": "Sita"})).unwrap_or_else(|e| panic!("{e}"));
    customers::create(deps, &tenant(), body, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .id
}

fn promo_body(coupon: &CouponId, extra: serde_json::Value) -> CreatePromotionCode {
    let mut v = json!({"couponId": coupon, "code": "launch50"});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

fn validate_body(v: serde_json::Value) -> ValidatePromotionCode {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn codes_are_unique_per_tenant_in_any_case_and_bad_input_stores_nothing() {
    let store = Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    let deps = deps_on(store.clone(), ManualClock::new(at(NOW)));
    let t = tenant();
    let c = create_coupon(&deps, &t, coupon_body(json!({})), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let before = store.scan_all().unwrap_or_else(|e| panic!("{e}")).len();
    let dup = create_coupon(&deps, &t, coupon_body(json!({"code": "launch"})), None).await;
    let Err(e) = dup else {
        panic!("a second LAUNCH")
    };
    let r = Refusal::from(e);
    assert_eq!(
        (r.code, r.field.as_deref()),
        ("coupon_code_taken", Some("code"))
    );
    let missing_plan = create_coupon(
        &deps,
        &t,
        coupon_body(json!({"code": "OTHER", "appliesToPlanIds": [PlanId::new()]})),
        None,
    )
    .await;
    assert_eq!(
        field_of(missing_plan.err().unwrap_or_else(|| panic!("accepted"))),
        "appliesToPlanIds"
    );
    assert_eq!(
        store.scan_all().unwrap_or_else(|e| panic!("{e}")).len(),
        before,
        "nothing stored"
    );
    // Another tenant may use the code.
    let other = Tenant::new("p2", Mode::Sandbox);
    create_coupon(&deps, &other, coupon_body(json!({})), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let p = create_promotion_code(&deps, &t, promo_body(&c.id, json!({})), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.code, "LAUNCH50");
    let dup = create_promotion_code(
        &deps,
        &t,
        promo_body(&c.id, json!({"code": "Launch50"})),
        None,
    )
    .await;
    let Err(e) = dup else {
        panic!("a second LAUNCH50")
    };
    assert_eq!(Refusal::from(e).code, "promotion_code_taken");
    for (extra, field) in [
        (json!({"code": "X1", "maxRedemptions": 0}), "maxRedemptions"),
        (
            json!({"code": "X2", "expiresAt": "2026-01-01T00:00:00Z"}),
            "expiresAt",
        ),
        (json!({"code": "X3", "minimumAmount": 0}), "minimumAmount"),
        (
            json!({"code": "X4", "customerIds": [CustomerId::new()]}),
            "customerIds",
        ),
        (
            json!({"code": "X5", "customerIds": ["bp_x"]}),
            "customerIds",
        ),
        (json!({"code": "X 6"}), "code"),
    ] {
        match create_promotion_code(&deps, &t, promo_body(&c.id, extra.clone()), None).await {
            Err(e) => assert_eq!(field_of(e), field, "{extra}"),
            Ok(_) => panic!("accepted {extra}"),
        }
    }
    let bad_coupon = CreatePromotionCode {
        coupon_id: CouponId::new().to_string(),
        ..promo_body(&c.id, json!({"code": "X7"}))
    };
    assert_eq!(
        field_of(
            create_promotion_code(&deps, &t, bad_coupon, None)
                .await
                .err()
                .unwrap_or_else(|| panic!("accepted"))
        ),
        "couponId"
    );
    let page = PageRequest { page: 1, limit: 50 };
    let (_, n) = list_promotion_codes(&deps, &t, page, &PromotionFilter::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 1, "only LAUNCH50");

    // A deactivated coupon takes no new codes; its code no longer validates.
    let off = deactivate_coupon(&deps, &t, &c.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!off.active);
    let again = deactivate_coupon(&deps, &t, &c.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!again.active);
    let (active, n) = list_coupons(&deps, &t, page, Some(true))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(active.is_empty() && n == 0);
    let refused =
        create_promotion_code(&deps, &t, promo_body(&c.id, json!({"code": "LATE"})), None).await;
    assert_eq!(
        field_of(refused.err().unwrap_or_else(|| panic!("accepted"))),
        "couponId"
    );
    let v = validate(&deps, &t, validate_body(json!({"code": "launch50"})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!v.valid);
    assert_eq!(v.reason_code.as_deref(), Some("coupon_inactive"));
    // One event per change: created twice (coupon, code), deactivated once.
    let events = crate::domain::outbox::recent(&*deps.store, &t, 50)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let count = |ty: EventType| events.iter().filter(|e| e.event_type == ty).count();
    assert_eq!(count(EventType::CouponCreated), 1);
    assert_eq!(count(EventType::PromotionCodeCreated), 1);
    assert_eq!(count(EventType::CouponDeactivated), 1);
}

#[tokio::test]
async fn validate_checks_every_limit_and_writes_nothing() {
    let store = Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    let clock = ManualClock::new(at(NOW));
    let deps = deps_on(store.clone(), clock.clone());
    let t = tenant();
    let fibre = plan(&deps, 150_000).await;
    let other_plan = plan(&deps, 90_000).await;
    let sita = customer(&deps).await;
    let ram = customer(&deps).await;
    let c = create_coupon(
        &deps,
        &t,
        coupon_body(json!({"percentOff": 15, "appliesToPlanIds": [fibre]})),
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    create_promotion_code(
        &deps,
        &t,
        promo_body(
            &c.id,
            json!({"code": "fibre15", "customerIds": [sita], "minimumAmount": 100_000, "expiresAt": "2026-02-01T00:00:00Z", "firstTimeTransaction": true}),
        ),
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let before = store.scan_all().unwrap_or_else(|e| panic!("{e}"));

    let ok = validate(
        &deps,
        &t,
        validate_body(json!({"code": "Fibre15", "customerId": sita, "planId": fibre})),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(ok.valid, "{ok:?}");
    let preview = ok
        .discount_preview
        .clone()
        .unwrap_or_else(|| panic!("preview"));
    assert_eq!(
        (preview.amount, preview.discount, preview.total),
        (Some(150_000), Some(22_500), Some(127_500))
    );
    let json = serde_json::to_value(&ok).unwrap_or_default();
    assert!(json["promotion_code"]["code"] == "FIBRE15", "{json}");
    assert!(json["discount_preview"].is_object() && json.get("reason").is_none());

    for (body, why) in [
        (json!({"code": "NOPE"}), "no_such_code"),
        (
            json!({"code": "FIBRE15", "customerId": sita, "planId": other_plan}),
            "plan_not_eligible",
        ),
        (
            json!({"code": "FIBRE15", "customerId": ram, "planId": fibre}),
            "customer_not_eligible",
        ),
        (
            json!({"code": "FIBRE15", "planId": fibre}),
            "customer_required",
        ),
        (
            json!({"code": "FIBRE15", "customerId": sita, "amount": 99_999}),
            "below_minimum_amount",
        ),
        (
            json!({"code": "FIBRE15", "customerId": sita}),
            "amount_required",
        ),
    ] {
        let v = validate(&deps, &t, validate_body(body.clone()))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!v.valid, "{body}");
        assert_eq!(v.reason_code.as_deref(), Some(why), "{body}");
        let json = serde_json::to_value(&v).unwrap_or_default();
        assert!(json["reason"].is_string() && json.get("coupon").is_none());
    }
    // Bad input is a 400, not an answer.
    for (body, field) in [
        (json!({"code": "FIBRE15", "customerId": "x"}), "customerId"),
        (
            json!({"code": "FIBRE15", "planId": PlanId::new()}),
            "planId",
        ),
        (json!({"code": "FIBRE15", "amount": -1}), "amount"),
        (json!({"code": " "}), "code"),
    ] {
        match validate(&deps, &t, validate_body(body.clone())).await {
            Err(e) => assert_eq!(field_of(e), field, "{body}"),
            Ok(v) => panic!("answered {v:?} for {body}"),
        }
    }
    // Past its expiry.
    clock.advance(chrono::Duration::days(30));
    let v = validate(
        &deps,
        &t,
        validate_body(json!({"code": "FIBRE15", "customerId": sita, "planId": fibre})),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v.reason_code.as_deref(), Some("promotion_code_expired"));
    assert_eq!(
        store.scan_all().unwrap_or_else(|e| panic!("{e}")),
        before,
        "validate wrote nothing"
    );
}

#[tokio::test]
async fn a_deactivated_promotion_code_stays_so() {
    let deps = deps_on(crate::testenv::memory_store(), ManualClock::new(at(NOW)));
    let t = tenant();
    let c = create_coupon(&deps, &t, coupon_body(json!({})), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let p = create_promotion_code(&deps, &t, promo_body(&c.id, json!({})), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let patch = |v: serde_json::Value| -> UpdatePromotionCode {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    };
    let off = update_promotion_code(&deps, &t, &p.id, patch(json!({"active": false})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!off.active);
    let on = update_promotion_code(&deps, &t, &p.id, patch(json!({"active": true}))).await;
    assert_eq!(
        field_of(on.err().unwrap_or_else(|| panic!("reactivated"))),
        "active"
    );
    assert!(serde_json::from_value::<UpdatePromotionCode>(json!({"code": "X"})).is_err());
    let v = validate(&deps, &t, validate_body(json!({"code": "LAUNCH50"})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v.reason_code.as_deref(), Some("promotion_code_inactive"));
    let page = PageRequest { page: 1, limit: 50 };
    let filter = PromotionFilter {
        coupon_id: Some(c.id.clone()),
        active: Some(false),
    };
    let (found, n) = list_promotion_codes(&deps, &t, page, &filter)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((found.len(), n), (1, 1));
    let events = crate::domain::outbox::recent(&*deps.store, &t, 50)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        events
            .iter()
            .filter(|e| e.event_type == EventType::PromotionCodeDeactivated)
            .count(),
        1
    );
}
