//! `GET /v1/analytics/overview` end to end, on both backends: a history is
//! made through the real paths (sessions over the API, payments on the
//! providers' simulators: successes, a decline, cancels, several
//! providers, a session paid on its second attempt), partly on an earlier
//! day (the gateway reads a manual clock), and every figure of the
//! overview is checked against a brute-force count of the sessions and
//! payments the API lists. Also: `days` validation and default, the
//! `analytics:read` scope, and another mode's data kept apart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dhukuti_tests::browser::{Form, Page, form, text};
use dhukuti_tests::shop::Shop;
use dhukuti_tests::{Which, on_both_backends, spawn_app_with_clock};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::time::{Clock, ManualClock, SystemClock, Timestamp};

/// NPR 1,500: above Khalti's minimum.
const AMOUNT: i64 = 150_000;
/// NPR 500: under the sandbox Fonepay limit of NPR 1,000 a payment.
const FONEPAY_AMOUNT: i64 = 50_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Esewa,
    Khalti,
    FonepayWeb,
}

/// Where the browser stands after the hand-off.
enum At {
    Wallet(Form),
    Back(String),
}

/// Picks `via` on the hosted page and follows the hand-off to the
/// provider's page (or straight back, when a scripted outcome acts).
async fn to_provider(shop: &Shop, session: &str, via: Via) -> At {
    let at: Page = match via {
        Via::Esewa => {
            let page = shop.choose(session, &[("provider", "esewa")]).await;
            assert_eq!(page.status, 200, "{}", page.show());
            let Some(handoff) = form(&page.body, Some("handoff")) else {
                panic!("no hand-off form: {}", page.show())
            };
            shop.browser
                .post_form(&handoff.action, &handoff.hidden)
                .await
        }
        Via::Khalti => {
            let page = shop.choose(session, &[("provider", "khalti")]).await;
            let to = page.redirect(303);
            let at = shop.browser.get(&to).await;
            if at.status == 200 {
                return wallet(at);
            }
            at
        }
        Via::FonepayWeb => {
            let page = shop
                .choose(session, &[("provider", "fonepay"), ("fonepay", "web")])
                .await;
            let to = page.redirect(303);
            shop.browser.get(&to).await
        }
    };
    match at.status {
        303 => {
            let page = shop.browser.get(&at.redirect(303)).await;
            if page.status == 200 {
                wallet(page)
            } else {
                At::Back(page.redirect(302))
            }
        }
        302 => At::Back(at.redirect(302)),
        _ => panic!("the provider answered {}", at.show()),
    }
}

fn wallet(page: Page) -> At {
    match form(&page.body, None) {
        Some(f) => At::Wallet(f),
        None => panic!("no form on the provider's page: {}", page.show()),
    }
}

/// Presses `action` (`pay`, `fail`, `cancel`) on the provider's page, or
/// takes the scripted way back, and arrives back at the gateway.
async fn finish(shop: &Shop, session: &str, at: At, action: &str) {
    let callback = match at {
        At::Wallet(f) => {
            let mut sent = f.hidden.clone();
            sent.push(("action".into(), action.into()));
            shop.browser.post_form(&f.action, &sent).await.redirect(302)
        }
        At::Back(u) => u,
    };
    assert!(
        callback.starts_with(&format!("{}/c/{session}/return/pay_", shop.app.base)),
        "{callback}"
    );
    let back = shop.browser.get(&callback).await;
    assert!(back.status == 303 || back.status == 200, "{}", back.show());
}

async fn checkout(shop: &Shop, amount: i64) -> String {
    text(&shop.create_checkout(amount).await["id"])
}

async fn status_of(shop: &Shop, session: &str) -> String {
    text(&shop.session(session).await["status"])
}

/// Every record of a list endpoint (offset pages of 100).
async fn list_all(shop: &Shop, path: &str, key: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let a = shop
            .app
            .get(&format!("{path}?limit=100&offset={}", out.len()), Some(key))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        let page = a.body["data"].as_array().cloned().unwrap_or_default();
        let done = page.len() < 100;
        out.extend(page);
        if done {
            return out;
        }
    }
}

fn field<'a>(v: &'a Value, camel: &str, snake: &str) -> &'a Value {
    match v.get(camel) {
        Some(x) if !x.is_null() => x,
        _ => &v[snake],
    }
}

fn created(v: &Value) -> Timestamp {
    match Timestamp::parse(field(v, "createdAt", "created_at").as_str().unwrap_or("")) {
        Some(t) => t,
        None => panic!("no createdAt: {v}"),
    }
}

/// The overview computed the slow way from every session and payment of
/// the key's project and mode, for the window starting at `start`.
async fn brute_force(shop: &Shop, key: &str, start: Timestamp) -> Value {
    let sessions: Vec<Value> = list_all(shop, "/v1/sessions", key)
        .await
        .into_iter()
        .filter(|s| created(s) >= start)
        .collect();
    let all_payments = list_all(shop, "/v1/payments", key).await;
    let attempted: BTreeSet<String> = all_payments
        .iter()
        .map(|p| text(field(p, "checkoutSessionId", "checkout_session_id")))
        .collect();
    let payments: Vec<&Value> = all_payments
        .iter()
        .filter(|p| created(p) >= start)
        .collect();
    let succeeded = |p: &Value| p["status"] == "success" || p["status"] == "refunded";
    let total = payments.len() as i64;
    let success = payments.iter().filter(|p| succeeded(p)).count() as i64;
    let failed = payments.iter().filter(|p| p["status"] == "failed").count() as i64;
    let volume: i64 = payments
        .iter()
        .filter(|p| succeeded(p))
        .map(|p| p["amount"].as_i64().unwrap_or(0))
        .sum();
    let initiated = sessions
        .iter()
        .filter(|s| attempted.contains(&text(&s["id"])))
        .count() as i64;
    let paid = sessions.iter().filter(|s| s["status"] == "success").count() as i64;
    let mut by: BTreeMap<&str, (i64, i64, i64)> = BTreeMap::new();
    for p in &payments {
        let e = by.entry(p["provider"].as_str().unwrap_or("?")).or_default();
        e.0 += 1;
        if succeeded(p) {
            e.1 += 1;
            e.2 += p["amount"].as_i64().unwrap_or(0);
        }
    }
    let ratio = |a: i64, b: i64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    json!({
        "payments": {
            "total": total, "success": success, "failed": failed,
            "success_rate": ratio(success, total), "success_volume_paisa": volume,
        },
        "funnel": {
            "sessions_created": sessions.len(), "sessions_initiated": initiated,
            "sessions_paid": paid,
            "conversion_rate_initiated_to_paid": ratio(paid, initiated),
        },
        "by_provider": by.into_iter().map(|(p, (c, s, v))| json!({
            "provider": p, "count": c, "success_count": s, "success_volume_paisa": v,
        })).collect::<Vec<_>>(),
    })
}

fn close(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() < 1e-9,
        _ => a == b,
    }
}

/// Checks the overview of `days` against the brute-force count.
async fn check_overview(shop: &Shop, key: &str, days: u32, now: Timestamp) -> Value {
    let a = shop
        .app
        .get(&format!("/v1/analytics/overview?days={days}"), Some(key))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let o = a.body;
    assert_eq!(o["window"]["days"], days, "{o}");
    let start = Timestamp::parse(o["window"]["start"].as_str().unwrap_or("")).unwrap();
    let midnight = now.datetime().date_naive().and_hms_opt(0, 0, 0).unwrap();
    let want_start = Timestamp::from_datetime(midnight.and_utc())
        .plus(chrono::Duration::days(-(i64::from(days) - 1)));
    assert_eq!(start, want_start, "{o}");
    assert_eq!(
        Timestamp::parse(o["window"]["end"].as_str().unwrap_or("")),
        Some(now),
        "{o}"
    );
    let want = brute_force(shop, key, start).await;
    for part in ["payments", "funnel"] {
        for (k, v) in want[part].as_object().unwrap() {
            assert!(
                close(&o[part][k], v),
                "{part}.{k}: {} vs {v}; {o}",
                o[part][k]
            );
        }
    }
    let mut got: Vec<Value> = o["by_provider"].as_array().cloned().unwrap_or_default();
    got.sort_by_key(|p| text(&p["provider"]));
    assert_eq!(Value::Array(got), want["by_provider"], "{o}");
    o
}

async fn the_overview_matches_a_brute_force_count(which: Which) {
    let today = SystemClock.now();
    let clock = ManualClock::new(today.plus(chrono::Duration::days(-3)));
    let shared_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let Some(app) = spawn_app_with_clock(which, |s| s, shared_clock).await else {
        return;
    };
    let shop = Shop::on(app).await;
    shop.app.enable_fonepay(&shop.tenant, Mode::Sandbox).await;
    let key = shop.key.clone();

    // Three days ago: one paid with eSewa, one never attempted.
    let a = checkout(&shop, AMOUNT).await;
    let at = to_provider(&shop, &a, Via::Esewa).await;
    finish(&shop, &a, at, "pay").await;
    assert_eq!(status_of(&shop, &a).await, "success");
    let _untouched_then = checkout(&shop, AMOUNT).await;

    clock.advance(chrono::Duration::days(3));

    // Today: cancelled at eSewa, then paid with Khalti (two attempts).
    let b = checkout(&shop, AMOUNT).await;
    let at = to_provider(&shop, &b, Via::Esewa).await;
    finish(&shop, &b, at, "cancel").await;
    assert_eq!(status_of(&shop, &b).await, "pending");
    let at = to_provider(&shop, &b, Via::Khalti).await;
    finish(&shop, &b, at, "pay").await;
    assert_eq!(status_of(&shop, &b).await, "success");
    // Declined by Fonepay's bank: the payment and the session fail.
    let c = checkout(&shop, FONEPAY_AMOUNT).await;
    shop.script("fonepay", json!({"outcome": "failure"})).await;
    let at = to_provider(&shop, &c, Via::FonepayWeb).await;
    finish(&shop, &c, at, "fail").await;
    assert_eq!(status_of(&shop, &c).await, "failed");
    // Cancelled at Khalti and left there.
    let d = checkout(&shop, AMOUNT).await;
    shop.script("khalti", json!({"outcome": "cancel"})).await;
    let at = to_provider(&shop, &d, Via::Khalti).await;
    finish(&shop, &d, at, "cancel").await;
    assert_eq!(status_of(&shop, &d).await, "pending");
    // Paid on Fonepay's web page.
    let e = checkout(&shop, FONEPAY_AMOUNT).await;
    let at = to_provider(&shop, &e, Via::FonepayWeb).await;
    finish(&shop, &e, at, "pay").await;
    assert_eq!(status_of(&shop, &e).await, "success");
    // Created only.
    let _untouched = checkout(&shop, AMOUNT).await;

    // Live mode: its own counters.
    let live = shop.app.key(&shop.tenant, Mode::Live, &Scope::ALL).await;
    let body = json!({"amount": AMOUNT, "returnUrl": "https://shop.example/ok"});
    let made = shop
        .app
        .post("/v1/checkout", Some(&live), None, &body)
        .await;
    assert_eq!(made.status, 201, "{}", made.body);

    let now = clock.now();
    let today_only = check_overview(&shop, &key, 1, now).await;
    assert_eq!(today_only["funnel"]["sessions_created"], 5, "{today_only}");
    assert_eq!(
        today_only["funnel"]["sessions_initiated"], 4,
        "{today_only}"
    );
    assert_eq!(today_only["funnel"]["sessions_paid"], 2, "{today_only}");
    assert_eq!(today_only["payments"]["total"], 5, "{today_only}");
    assert_eq!(today_only["payments"]["success"], 2, "{today_only}");
    assert_eq!(today_only["payments"]["failed"], 1, "{today_only}");
    assert_eq!(
        today_only["payments"]["success_volume_paisa"],
        AMOUNT + FONEPAY_AMOUNT,
        "{today_only}"
    );
    let all = check_overview(&shop, &key, 4, now).await;
    assert_eq!(all["funnel"]["sessions_created"], 7, "{all}");
    assert_eq!(all["payments"]["success"], 3, "{all}");
    check_overview(&shop, &key, 90, now).await;

    // The default window is 30 days.
    let a = shop.app.get("/v1/analytics/overview", Some(&key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["window"]["days"], 30);
    assert_eq!(a.body["funnel"]["sessions_created"], 7);

    // Live sees its one session only, and sandbox did not count it.
    let l = check_overview(&shop, &live, 30, now).await;
    assert_eq!(l["funnel"]["sessions_created"], 1, "{l}");
    assert_eq!(l["payments"]["total"], 0, "{l}");
    assert_eq!(l["by_provider"], json!([]), "{l}");
    shop.stop().await;
}

async fn days_are_validated_and_the_scope_is_required(which: Which) {
    let Some(app) = dhukuti_tests::spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Bhaktapur Pottery", "ram@pottery.example").await;
    let key = app.key(&t, Mode::Sandbox, &[Scope::AnalyticsRead]).await;
    for bad in ["0", "91", "x", "-3", "1.5", ""] {
        let a = app
            .get(&format!("/v1/analytics/overview?days={bad}"), Some(&key))
            .await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], "days", "{bad}: {}", a.body);
    }
    for good in [1, 90] {
        let a = app
            .get(&format!("/v1/analytics/overview?days={good}"), Some(&key))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["window"]["days"], good);
        assert_eq!(a.body["payments"]["total"], 0);
        assert_eq!(a.body["payments"]["success_rate"], 0.0);
        assert_eq!(a.body["funnel"]["conversion_rate_initiated_to_paid"], 0.0);
        assert_eq!(a.body["by_provider"], json!([]));
    }
    let other = app.key(&t, Mode::Sandbox, &[Scope::AccountRead]).await;
    let a = app.get("/v1/analytics/overview", Some(&other)).await;
    a.assert_error(403, "permission_error", "missing_scope");
    let a = app.get("/v1/analytics/overview", None).await;
    assert_eq!(a.status, 401, "{}", a.body);
    app.stop().await;
}

on_both_backends!(
    the_overview_matches_a_brute_force_count,
    days_are_validated_and_the_scope_is_required,
);
