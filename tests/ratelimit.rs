//! Per-key rate limits and `last_used_at` end to end (issue 8), on both
//! backends: a fixed one-second window per key shared through the store.

use std::collections::BTreeMap;

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use shared::domain::Mode;
use shared::domain::account::{self, ApiKey, Scope};
use shared::time::{Clock, SystemClock, Timestamp};

const LIMIT: u32 = 5;

async fn app_with_limit(which: Which, limit: u32) -> Option<TestApp> {
    let app = spawn_app(which).await?;
    app.set_rate_limits(limit, limit);
    Some(app)
}

fn num(a: &Answer, name: &str) -> i64 {
    match a.header(name).parse() {
        Ok(n) => n,
        Err(_) => panic!("{name} missing or not a number on a {}", a.status),
    }
}

async fn burst(app: &TestApp, key: &str, n: usize) -> Vec<Answer> {
    let calls = (0..n).map(|_| app.get("/v1/account", Some(key)));
    futures::future::join_all(calls).await
}

/// Checks a burst window by window (`X-RateLimit-Reset`): at most `limit`
/// 2xx per window, exactly `limit` where anything was refused, Remaining
/// counting down without repeats, and every 429 in the envelope with
/// `Retry-After`. Returns (ok, limited).
fn check_windows(answers: &[Answer], limit: u32) -> (usize, usize) {
    let mut windows: BTreeMap<i64, (Vec<i64>, usize)> = BTreeMap::new();
    for a in answers {
        assert_eq!(num(a, "x-ratelimit-limit"), i64::from(limit));
        let reset = num(a, "x-ratelimit-reset");
        let w = windows.entry(reset).or_default();
        match a.status {
            200 => w.0.push(num(a, "x-ratelimit-remaining")),
            429 => {
                a.assert_error(429, "rate_limit_error", "rate_limited");
                assert_eq!(num(a, "x-ratelimit-remaining"), 0);
                assert!(num(a, "retry-after") >= 1);
                w.1 += 1;
            }
            other => panic!("unexpected status {other}: {}", a.body),
        }
    }
    let (mut ok, mut limited) = (0, 0);
    for (reset, (mut remaining, refused)) in windows {
        remaining.sort_unstable();
        remaining.reverse();
        let n = remaining.len();
        let expected: Vec<i64> = (0..n as i64).map(|i| i64::from(limit) - 1 - i).collect();
        assert_eq!(remaining, expected, "window ending {reset}");
        if refused > 0 {
            assert_eq!(n, limit as usize, "window ending {reset}");
        }
        ok += n;
        limited += refused;
    }
    (ok, limited)
}

async fn only_the_limit_passes_per_window(which: Which) {
    let Some(app) = app_with_limit(which, LIMIT).await else {
        return;
    };
    let tenant = app.tenant("Rate Shop", "rate@shop.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let answers = burst(&app, &key, 40).await;
    let (ok, limited) = check_windows(&answers, LIMIT);
    assert_eq!(ok + limited, 40);
    assert!(
        limited > 0,
        "40 requests never went over a limit of {LIMIT}"
    );
    app.stop().await;
}

async fn each_key_has_its_own_budget(which: Which) {
    let Some(app) = app_with_limit(which, 2).await else {
        return;
    };
    let tenant = app.tenant("Two Keys", "two@shop.example").await;
    let a = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let b = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let answers = burst(&app, &a, 12).await;
    assert!(answers.iter().any(|x| x.status == 429));
    // Key a is exhausted in its window; b's first request is b's first.
    let first_b = app.get("/v1/account", Some(&b)).await;
    assert_eq!(first_b.status, 200, "{}", first_b.body);
    assert_eq!(num(&first_b, "x-ratelimit-remaining"), 1);
    // The live limit is its own setting.
    app.set_rate_limits(7, 2);
    let live = app.key(&tenant, Mode::Live, &Scope::ALL).await;
    let l = app.get("/v1/account", Some(&live)).await;
    assert_eq!(l.status, 200, "{}", l.body);
    assert_eq!(num(&l, "x-ratelimit-limit"), 7);
    app.stop().await;
}

async fn a_refused_key_costs_nothing(which: Which) {
    let Some(app) = app_with_limit(which, 1).await else {
        return;
    };
    let tenant = app.tenant("Bad Keys", "bad@shop.example").await;
    let good = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    // The good key's secret with its last character changed: a 401.
    let mut wrong = good.clone();
    let last = if good.ends_with('a') { "b" } else { "a" };
    wrong.replace_range(good.len() - 1.., last);
    for key in [Some(wrong.as_str()), Some("sk_test_short"), None] {
        for _ in 0..3 {
            let a = app.get("/v1/account", key).await;
            a.assert_error(401, "authentication_error", "api_key_invalid");
            for h in ["x-ratelimit-limit", "x-ratelimit-remaining", "retry-after"] {
                assert!(a.headers.get(h).is_none(), "{h} on a 401");
            }
        }
    }
    // No counter was written for the good key by any of them.
    let id = key_record(&app, &good).await.id;
    let now = SystemClock.now();
    for dt in [-2, -1, 0] {
        let w = shared::http::ratelimit::Window::of(now.plus(chrono::Duration::seconds(dt)));
        let item = app.store.get(&w.counter_key(&id)).await;
        assert!(matches!(item, Ok(None)), "{item:?}");
    }
    let ok = app.get("/v1/account", Some(&good)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(num(&ok, "x-ratelimit-remaining"), 0);
    app.stop().await;
}

async fn key_record(app: &TestApp, secret: &str) -> ApiKey {
    let key = ApiKey::key_for_hash(&account::hash_secret(secret));
    match app.store.get(&key).await {
        Ok(Some(item)) => match shared::domain::record::from_item(item) {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        },
        other => panic!("key item: {other:?}"),
    }
}

async fn last_used_at_is_written_at_most_once_a_minute(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let tenant = app.tenant("Used Keys", "used@shop.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    assert_eq!(key_record(&app, &key).await.last_used_at, None);

    let before = SystemClock.now();
    for a in burst(&app, &key, 10).await {
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let Some(first) = key_record(&app, &key).await.last_used_at else {
        panic!("last_used_at not recorded")
    };
    assert!(first >= before.plus(chrono::Duration::seconds(-1)));
    for _ in 0..3 {
        let a = app.get("/v1/account", Some(&key)).await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    for a in burst(&app, &key, 10).await {
        assert_eq!(a.status, 200, "{}", a.body);
    }
    assert_eq!(key_record(&app, &key).await.last_used_at, Some(first));

    // Once the value is over a minute old, the next request writes it.
    let stale = Timestamp::parse("2026-01-01T00:00:00.000Z").unwrap_or(first);
    let hash_key = ApiKey::key_for_hash(&account::hash_secret(&key));
    let set = shared::store::Update::new().set("last_used_at", stale.to_rfc3339());
    assert!(app.store.update(&hash_key, set, None).await.is_ok());
    for a in burst(&app, &key, 10).await {
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let Some(second) = key_record(&app, &key).await.last_used_at else {
        panic!("last_used_at gone")
    };
    assert!(second >= first, "{second:?} < {first:?}");
    app.stop().await;
}

on_both_backends!(
    only_the_limit_passes_per_window,
    each_key_has_its_own_budget,
    a_refused_key_costs_nothing,
    last_used_at_is_written_at_most_once_a_minute,
);
