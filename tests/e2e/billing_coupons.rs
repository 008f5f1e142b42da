//! Issue 40 item 1 over HTTP, on both backends: coupons (create, list,
//! get, deactivate by DELETE), promotion codes (create upper-cased, list,
//! get, PATCH `{active: false}`, validate reading only), apply-coupon and
//! DELETE discount on a subscription, bad input a 400 naming the field
//! with nothing stored, a taken code a 409; the race of the issue (50
//! subscriptions applying a code with one redemption left: one winner);
//! the webhooks; and the official SDK's calls, unchanged
//! (tests/sdk/billing_coupons.py).

use dhukuti_tests::billing::{call, post, text};
use dhukuti_tests::dash::{Dash, field};
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";
use shared::domain::outbox::{self, EventType};
use shared::domain::{Mode, Tenant};

fn ok(a: &Answer, status: u16) -> &Value {
    assert_eq!(a.status, status, "{}", a.body);
    &a.body
}

/// A new customer's trialing subscription on `plan`.
async fn subscription(app: &TestApp, key: &str, plan: &str, name: &str) -> (String, String) {
    let c = post(app, "/v1/billing/customers", key, json!({"name": name})).await;
    let customer = text(&ok(&c, 201)["id"]);
    let s = post(
        app,
        "/v1/billing/subscriptions",
        key,
        json!({"customerId": customer, "planId": plan}),
    )
    .await;
    (customer, text(&ok(&s, 201)["id"]))
}

async fn plan(app: &TestApp, key: &str, name: &str) -> String {
    let p = post(
        app,
        "/v1/billing/plans",
        key,
        json!({"name": name, "amount": 150_000, "intervalUnit": "month", "trialDays": 14}),
    )
    .await;
    text(&ok(&p, 201)["id"])
}

async fn events_of(app: &TestApp, project: &str, t: EventType) -> Vec<Value> {
    let tenant = Tenant::new(project, Mode::Sandbox);
    let all = outbox::recent(&*app.store, &tenant, 200)
        .await
        .unwrap_or_else(|e| panic!("events: {e}"));
    all.into_iter()
        .filter(|e| e.event_type == t)
        .map(|e| e.object)
        .collect()
}

async fn coupons_and_codes_over_http(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Fibre Nepal", "owner@fibre.example").await;
    let project = t.project.id.to_string();
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let fibre = plan(&app, &key, "Fibre").await;
    let tv = plan(&app, &key, "TV").await;

    // Bad input: 400 naming the field, nothing stored.
    let base = json!({"code": "LAUNCH", "name": "Launch discount", "discountType": "percent", "percentOff": 50, "duration": "repeating", "durationInCycles": 3, "maxRedemptions": 100});
    for (extra, field) in [
        (json!({"percentOff": 0}), "percentOff"),
        (json!({"percentOff": 101}), "percentOff"),
        (
            json!({"discountType": "amount", "percentOff": null, "amountOff": 0}),
            "amountOff",
        ),
        (json!({"durationInCycles": null}), "durationInCycles"),
        (
            json!({"duration": "once", "durationInCycles": 2}),
            "durationInCycles",
        ),
        (json!({"redeemBy": "2020-01-01T00:00:00Z"}), "redeemBy"),
        (
            json!({"appliesToPlanIds": ["bp_01kbadbadbadbadbadbadbadba"]}),
            "appliesToPlanIds",
        ),
        (json!({"name": null}), "name"),
    ] {
        let mut b = base.clone();
        if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let r = post(&app, "/v1/billing/coupons", &key, b).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], field, "{extra}: {}", r.body);
    }
    let listed = app.get("/v1/billing/coupons", Some(&key)).await;
    assert_eq!(ok(&listed, 200)["total"], 0, "nothing stored");

    let c = post(&app, "/v1/billing/coupons", &key, base.clone()).await;
    let launch = ok(&c, 201).clone();
    let launch_id = text(&launch["id"]);
    assert!(launch_id.starts_with("cpn_"), "{launch}");
    assert_eq!(launch["percentOff"], 50);
    assert_eq!(launch["durationInCycles"], 3);
    assert_eq!(launch["redeemedCount"], 0);
    assert_eq!(launch["active"], true);
    assert_eq!(launch["appliesToPlanIds"], Value::Null);
    let dup = post(&app, "/v1/billing/coupons", &key, json!({"code": "launch", "name": "Again", "discountType": "amount", "amountOff": 5_000, "duration": "forever"})).await;
    dup.assert_error(409, "invalid_request_error", "coupon_code_taken");
    let tv_only = post(&app, "/v1/billing/coupons", &key, json!({"code": "TVONLY", "name": "TV only", "discountType": "amount", "amountOff": 20_000, "duration": "forever", "appliesToPlanIds": [tv]})).await;
    let tv_only = text(&ok(&tv_only, 201)["id"]);
    let page = app.get("/v1/billing/coupons?limit=1", Some(&key)).await;
    let page = ok(&page, 200);
    assert_eq!(
        (
            page["total"].as_u64(),
            page["page"].as_u64(),
            page["limit"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(page["data"][0]["id"], tv_only.as_str(), "newest first");
    let got = app
        .get(&format!("/v1/billing/coupons/{launch_id}"), Some(&key))
        .await;
    assert_eq!(ok(&got, 200)["code"], "LAUNCH");
    let bad = app
        .get("/v1/billing/coupons?active=maybe", Some(&key))
        .await;
    assert_eq!(bad.body["error"]["param"], "active", "{}", bad.body);

    // Promotion codes: upper-cased, unique, listed by coupon.
    let p = post(&app, "/v1/billing/promotion-codes", &key, json!({"couponId": launch_id, "code": "launch50", "maxRedemptions": 500, "expiresAt": "2031-06-01T00:00:00Z"})).await;
    let promo = ok(&p, 201).clone();
    let promo_id = text(&promo["id"]);
    assert!(promo_id.starts_with("promo_"), "{promo}");
    assert_eq!(promo["code"], "LAUNCH50");
    let dup = post(
        &app,
        "/v1/billing/promotion-codes",
        &key,
        json!({"couponId": launch_id, "code": "Launch50"}),
    )
    .await;
    dup.assert_error(409, "invalid_request_error", "promotion_code_taken");
    let bad = post(
        &app,
        "/v1/billing/promotion-codes",
        &key,
        json!({"couponId": launch_id, "code": "X", "minimumAmount": -1}),
    )
    .await;
    assert_eq!(bad.body["error"]["param"], "minimumAmount", "{}", bad.body);
    let listed = app
        .get(
            &format!("/v1/billing/promotion-codes?couponId={launch_id}&active=true"),
            Some(&key),
        )
        .await;
    assert_eq!(ok(&listed, 200)["total"], 1);

    // Validate: the guide's keys, and nothing written.
    let events_before = outbox::recent(
        &*app.store,
        &Tenant::new(project.as_str(), Mode::Sandbox),
        200,
    )
    .await
    .map(|e| e.len())
    .unwrap_or_default();
    let v = post(
        &app,
        "/v1/billing/promotion-codes/validate",
        &key,
        json!({"code": "launch50", "planId": fibre, "amount": 50_000}),
    )
    .await;
    let v = ok(&v, 200);
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(v["coupon"]["id"], launch_id.as_str());
    assert_eq!(v["promotion_code"]["id"], promo_id.as_str());
    assert_eq!(v["discount_preview"]["discount"], 25_000, "{v}");
    assert_eq!(v["discount_preview"]["total"], 25_000);
    let v = post(
        &app,
        "/v1/billing/promotion-codes/validate",
        &key,
        json!({"code": "NOPE"}),
    )
    .await;
    let v = ok(&v, 200);
    assert_eq!(v["valid"], false);
    assert!(v["reason"].is_string() && v.get("coupon").is_none(), "{v}");
    let got = app
        .get(
            &format!("/v1/billing/promotion-codes/{promo_id}"),
            Some(&key),
        )
        .await;
    assert_eq!(
        ok(&got, 200)["redeemedCount"],
        0,
        "validate redeems nothing"
    );
    let events_after = outbox::recent(
        &*app.store,
        &Tenant::new(project.as_str(), Mode::Sandbox),
        200,
    )
    .await
    .map(|e| e.len())
    .unwrap_or_default();
    assert_eq!(events_before, events_after, "validate writes no event");

    // Apply: by code, then replaced by a coupon; the discount is in the
    // answer; another plan's coupon is a 400 naming the field.
    let (_, sub) = subscription(&app, &key, &fibre, "Sita Rai").await;
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/apply-coupon"),
        &key,
        json!({"promotionCode": "launch50"}),
    )
    .await;
    let a = ok(&a, 200).clone();
    assert_eq!(a["id"], sub.as_str());
    assert_eq!(a["status"], "trialing");
    assert_eq!(a["discount"]["couponId"], launch_id.as_str(), "{a}");
    assert_eq!(a["discount"]["promotionCode"], "LAUNCH50");
    assert_eq!(a["discount"]["cyclesRemaining"], 3);
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/apply-coupon"),
        &key,
        json!({"couponId": tv_only}),
    )
    .await;
    r.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(r.body["error"]["param"], "couponId");
    assert_eq!(r.body["error"]["reason"], "plan_not_eligible", "{}", r.body);
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/apply-coupon"),
        &key,
        json!({"couponId": launch_id, "promotionCode": "LAUNCH50"}),
    )
    .await;
    assert_eq!(r.body["error"]["param"], "promotionCode", "{}", r.body);
    let got = app
        .get(&format!("/v1/billing/coupons/{launch_id}"), Some(&key))
        .await;
    assert_eq!(ok(&got, 200)["redeemedCount"], 1);
    let got = app
        .get(
            &format!("/v1/billing/promotion-codes/{promo_id}"),
            Some(&key),
        )
        .await;
    assert_eq!(ok(&got, 200)["redeemedCount"], 1);

    // Remove it; again: 404.
    let d = call(
        &app,
        "DELETE",
        &format!("/v1/billing/subscriptions/{sub}/discount"),
        &key,
        None,
    )
    .await;
    assert_eq!(ok(&d, 200)["discount"], Value::Null);
    let d = call(
        &app,
        "DELETE",
        &format!("/v1/billing/subscriptions/{sub}/discount"),
        &key,
        None,
    )
    .await;
    d.assert_error(404, "invalid_request_error", "not_found");

    // Deactivate the code (PATCH) and the coupon (DELETE): soft, each
    // once; the code no longer validates nor applies.
    let off = call(
        &app,
        "PATCH",
        &format!("/v1/billing/promotion-codes/{promo_id}"),
        &key,
        Some(&json!({"active": false})),
    )
    .await;
    assert_eq!(ok(&off, 200)["active"], false);
    let on = call(
        &app,
        "PATCH",
        &format!("/v1/billing/promotion-codes/{promo_id}"),
        &key,
        Some(&json!({"active": true})),
    )
    .await;
    assert_eq!(on.body["error"]["param"], "active", "{}", on.body);
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/apply-coupon"),
        &key,
        json!({"promotionCode": "LAUNCH50"}),
    )
    .await;
    assert_eq!(
        r.body["error"]["reason"], "promotion_code_inactive",
        "{}",
        r.body
    );
    let off = call(
        &app,
        "DELETE",
        &format!("/v1/billing/coupons/{launch_id}"),
        &key,
        None,
    )
    .await;
    assert_eq!(ok(&off, 200)["active"], false);
    let again = call(
        &app,
        "DELETE",
        &format!("/v1/billing/coupons/{launch_id}"),
        &key,
        None,
    )
    .await;
    assert_eq!(ok(&again, 200)["active"], false);
    let active = app.get("/v1/billing/coupons?active=true", Some(&key)).await;
    assert_eq!(ok(&active, 200)["total"], 1);

    // Another project sees none of it.
    let other = app.tenant("Other Fibre", "owner@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let r = app
        .get(&format!("/v1/billing/coupons/{tv_only}"), Some(&other_key))
        .await;
    r.assert_error(404, "invalid_request_error", "not_found");
    let r = post(
        &app,
        &format!("/v1/billing/subscriptions/{sub}/apply-coupon"),
        &other_key,
        json!({"couponId": tv_only}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);

    // The webhooks, one per change.
    assert_eq!(
        events_of(&app, &project, EventType::CouponCreated)
            .await
            .len(),
        2
    );
    assert_eq!(
        events_of(&app, &project, EventType::CouponDeactivated)
            .await
            .len(),
        1
    );
    assert_eq!(
        events_of(&app, &project, EventType::PromotionCodeCreated)
            .await
            .len(),
        1
    );
    assert_eq!(
        events_of(&app, &project, EventType::PromotionCodeDeactivated)
            .await
            .len(),
        1
    );
    let updated = events_of(&app, &project, EventType::SubscriptionUpdated).await;
    assert_eq!(updated.len(), 2, "applied, removed");
    assert!(
        updated
            .iter()
            .any(|o| o["discount"]["couponId"] == launch_id.as_str())
    );
    app.stop().await;
}

/// The race of the issue: 50 customers' subscriptions apply a code with
/// one redemption left, at once: exactly one wins, the 49 others are told
/// the limit is reached, and the counters stop at the caps.
async fn fifty_race_for_the_last_redemption(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant("Race Fibre", "owner@race.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let fibre = plan(&app, &key, "Fibre").await;
    let c = post(&app, "/v1/billing/coupons", &key, json!({"code": "RACE", "name": "Race", "discountType": "percent", "percentOff": 20, "duration": "forever"})).await;
    let coupon = text(&ok(&c, 201)["id"]);
    let p = post(
        &app,
        "/v1/billing/promotion-codes",
        &key,
        json!({"couponId": coupon, "code": "LAST", "maxRedemptions": 2}),
    )
    .await;
    let promo = text(&ok(&p, 201)["id"]);
    let (_, first) = subscription(&app, &key, &fibre, "First").await;
    let a = post(
        &app,
        &format!("/v1/billing/subscriptions/{first}/apply-coupon"),
        &key,
        json!({"promotionCode": "LAST"}),
    )
    .await;
    ok(&a, 200);
    let mut subs = Vec::new();
    for i in 0..50 {
        subs.push(
            subscription(&app, &key, &fibre, &format!("Racer {i}"))
                .await
                .1,
        );
    }
    let tasks: Vec<_> = subs
        .iter()
        .map(|sub| {
            let req = app
                .client
                .post(app.url(&format!("/v1/billing/subscriptions/{sub}/apply-coupon")))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .header("idempotency-key", format!("race-{sub}"))
                .body(json!({"promotionCode": "last"}).to_string());
            tokio::spawn(send(req))
        })
        .collect();
    let mut won = Vec::new();
    for (task, sub) in tasks.into_iter().zip(&subs) {
        let a = task.await.unwrap_or_else(|e| panic!("{e}"));
        if a.status == 200 {
            won.push(sub.clone());
        } else {
            a.assert_error(400, "invalid_request_error", "validation_failed");
            assert_eq!(a.body["error"]["param"], "promotionCode");
            assert_eq!(
                a.body["error"]["reason"], "promotion_code_redemption_limit_reached",
                "{}",
                a.body
            );
        }
    }
    assert_eq!(won.len(), 1, "exactly one winner: {won:?}");
    let got = app
        .get(&format!("/v1/billing/promotion-codes/{promo}"), Some(&key))
        .await;
    assert_eq!(ok(&got, 200)["redeemedCount"], 2);
    let got = app
        .get(&format!("/v1/billing/coupons/{coupon}"), Some(&key))
        .await;
    assert_eq!(ok(&got, 200)["redeemedCount"], 2);
    let project = t.project.id.to_string();
    let updated = events_of(&app, &project, EventType::SubscriptionUpdated).await;
    assert_eq!(updated.len(), 2, "one event per redemption");
    app.stop().await;
}

/// The SDK's coupons, promotion codes, apply_coupon and remove_discount,
/// unchanged.
async fn the_sdk_coupon_calls_work_unchanged(which: Which) {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("SDK Coupons", "owner@sdkcoupons.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/billing_coupons.py");
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(&script)
        .env("BASE_URL", &app.base)
        .env("API_KEY", &key)
        .kill_on_drop(true);
    let out = match tokio::time::timeout(std::time::Duration::from_secs(600), cmd.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("billing_coupons.py took over 600 s"),
    };
    app.stop().await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all SDK coupon calls behaved"),
        "the SDK run failed on {which:?}:\n{stdout}\n{stderr}"
    );
}

/// The dashboard's coupons and promotion codes pages: a developer makes
/// and deactivates them through their forms (a bad value named, nothing
/// stored), a viewer sees no form and a forged post is refused; a
/// subscription's page shows its discount.
async fn coupons_in_the_dashboard(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = dhukuti_tests::shop::Shop::on(app).await;
    let key = shop.key.clone();
    let person = |email: &'static str, role: Role| {
        let shop = &shop;
        async move {
            dashboard::create_user(
                shop.app.state(),
                SystemClock.now(),
                &shop.tenant.merchant.id,
                email,
                role,
                PASSWORD,
            )
            .await
            .unwrap_or_else(|e| panic!("user: {e}"));
            let mut d = Dash::new(&shop.app.base);
            let r = d.sign_in(email, PASSWORD).await;
            assert_eq!(r.status, 303, "{}", r.show());
            d
        }
    };
    let mut dev = person("dev@coupons.example", Role::Developer).await;
    let mut viewer = person("viewer@coupons.example", Role::Viewer).await;

    let page = dev.get("/dashboard/billing/coupons").await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.body.contains("promotion codes"),
        "the tab: {}",
        page.show()
    );
    let csrf = field(&page.body, "csrf");
    let bad = dev
        .post(
            "/dashboard/billing/coupons",
            &[
                ("csrf", &csrf),
                ("code", "DASHAIN"),
                ("name", "Dashain"),
                ("discount_type", "percent"),
                ("value", "0"),
                ("duration", "once"),
            ],
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.show());
    assert!(bad.body.contains("percentOff"), "{}", bad.show());
    let made = dev
        .post(
            "/dashboard/billing/coupons",
            &[
                ("csrf", &csrf),
                ("code", "DASHAIN"),
                ("name", "Dashain"),
                ("discount_type", "amount"),
                ("value", "250"),
                ("duration", "repeating"),
                ("duration_in_cycles", "2"),
            ],
        )
        .await;
    assert_eq!(made.status, 303, "{}", made.show());
    let list = app_get(&shop, &key, "/v1/billing/coupons").await;
    assert_eq!(list["total"], 1, "{list}");
    let coupon = text(&list["data"][0]["id"]);
    assert_eq!(list["data"][0]["amountOff"], 25_000);
    let page = dev.get("/dashboard/billing/coupons").await;
    assert!(
        page.body.contains("DASHAIN") && page.body.contains("for 2 invoices"),
        "{}",
        page.show()
    );

    let page = dev.get("/dashboard/billing/promotion-codes").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let made = dev
        .post(
            "/dashboard/billing/promotion-codes",
            &[
                ("csrf", &csrf),
                ("coupon_id", &coupon),
                ("code", "dashain25"),
                ("max_redemptions", "10"),
            ],
        )
        .await;
    assert_eq!(made.status, 303, "{}", made.show());
    let codes = app_get(&shop, &key, "/v1/billing/promotion-codes").await;
    let promo = text(&codes["data"][0]["id"]);
    assert_eq!(codes["data"][0]["code"], "DASHAIN25", "{codes}");

    // The subscription's page shows the discount applied through the API.
    let plan = plan(&shop.app, &key, "Fibre").await;
    let (_, sub) = subscription(&shop.app, &key, &plan, "Sita").await;
    let a = post(
        &shop.app,
        &format!("/v1/billing/subscriptions/{sub}/apply-coupon"),
        &key,
        json!({"promotionCode": "DASHAIN25"}),
    )
    .await;
    ok(&a, 200);
    let page = viewer
        .get(&format!("/dashboard/billing/subscriptions/{sub}"))
        .await;
    assert!(
        page.body.contains("DASHAIN (Dashain)") && page.body.contains("2 more invoices"),
        "{}",
        page.show()
    );

    // A viewer: no forms, and a forged post changes nothing.
    let page = viewer.get("/dashboard/billing/promotion-codes").await;
    assert!(
        page.body.contains("DASHAIN25") && !page.body.contains("/deactivate"),
        "{}",
        page.show()
    );
    let r = viewer
        .post(
            &format!("/dashboard/billing/promotion-codes/{promo}/deactivate"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    let r = dev
        .post(
            &format!("/dashboard/billing/promotion-codes/{promo}/deactivate"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = dev
        .post(
            &format!("/dashboard/billing/coupons/{coupon}/deactivate"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let got = app_get(&shop, &key, &format!("/v1/billing/promotion-codes/{promo}")).await;
    assert_eq!(got["active"], false);
    let got = app_get(&shop, &key, &format!("/v1/billing/coupons/{coupon}")).await;
    assert_eq!(got["active"], false);
    shop.stop().await;
}

async fn app_get(shop: &dhukuti_tests::shop::Shop, key: &str, path: &str) -> Value {
    let a = shop.app.get(path, Some(key)).await;
    ok(&a, 200).clone()
}

on_both_backends!(
    coupons_in_the_dashboard,
    coupons_and_codes_over_http,
    fifty_race_for_the_last_redemption,
    the_sdk_coupon_calls_work_unchanged
);
