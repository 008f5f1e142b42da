//! Per-key rate limits and `last_used_at` end to end (issue 8), on both
//! backends: a fixed one-second window per key shared through the store.

use std::collections::BTreeMap;

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use shared::domain::Mode;
use shared::domain::account::{self, ApiKey, Scope};
use shared::time::{Clock, SystemClock};

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
        let w = shared::limits::rate::Window::of(now.plus(chrono::Duration::seconds(dt)));
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
    let clock = shared::time::ManualClock::new(SystemClock.now());
    let shared_clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(clock.clone());
    let Some(app) = dhukuti_tests::spawn_app_with_clock(which, |s| s, shared_clock).await else {
        return;
    };
    let tenant = app.tenant("Used Keys", "used@shop.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    assert_eq!(key_record(&app, &key).await.last_used_at, None);

    let before = clock.now();
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

    // Once the value is over a minute old, the next request writes it
    // (the key remembered for 30 s at most is read again by then).
    clock.advance(chrono::Duration::seconds(61));
    for a in burst(&app, &key, 10).await {
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let Some(second) = key_record(&app, &key).await.last_used_at else {
        panic!("last_used_at gone")
    };
    assert_eq!(second, clock.now(), "written again, once");
    app.stop().await;
}

// ---------------------------------------------------------------------------
// The public routes (no API key): per client address, session and link

/// A customer's browser (or an attacker's script) from `ip`, following no
/// redirect.
fn client_from(ip: [u8; 4]) -> reqwest::Client {
    match reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(20))
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// Status, `Retry-After` and body of one public request.
async fn public(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    accept: &str,
    form: Option<&str>,
) -> (u16, Option<i64>, String) {
    let mut req = client.request(method, url).header("accept", accept);
    if let Some(f) = form {
        req = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(f.to_owned());
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            let retry = res
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            (status, retry, res.text().await.unwrap_or_default())
        }
        Err(e) => panic!("{url}: {e}"),
    }
}

async fn new_session(app: &TestApp, key: &str) -> String {
    let a = app
        .post(
            "/v1/checkout",
            Some(key),
            Some(&shared::ids::new_id(shared::ids::IdKind::Event)),
            &serde_json::json!({"amount": 150000, "returnUrl": "https://shop.example/done"}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["id"].as_str().unwrap_or_default().to_owned()
}

async fn total(app: &TestApp, key: &str, path: &str) -> u64 {
    let a = app.get(path, Some(key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX)
}

/// Waits (at most 26 s) until the public limits' windows (a minute; half
/// an hour for sessions per link and address) have at least 25 s left, so
/// a burst is counted in one window.
async fn steady_window() {
    let now = SystemClock.now().unix_seconds();
    let (in_minute, in_half_hour) = (now.rem_euclid(60), now.rem_euclid(1800));
    let wait = if in_minute >= 35 || in_half_hour >= 1775 {
        60 - in_minute + 1
    } else {
        0
    };
    tokio::time::sleep(std::time::Duration::from_secs(
        u64::try_from(wait).unwrap_or(0),
    ))
    .await;
}

const JSON: &str = "application/json";
const HTML: &str = "text/html,application/xhtml+xml";

/// A flood of one session's pages from one address is cut at the
/// session's limit (429, `Retry-After`; the envelope for a script, a page
/// for a browser) while other sessions answer; writes are bounded per
/// address, a refused one changes nothing, and another address is not
/// held back by the first one's flood.
async fn public_routes_are_throttled_per_session_and_address(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Asan Bazaar", "owner@asan.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let (s1, s2, s3) = (
        new_session(&app, &key).await,
        new_session(&app, &key).await,
        new_session(&app, &key).await,
    );
    // address, writes per address, per session, per link, link sessions
    app.state().public_limits().set(60, 4, 8, 100, 3);
    steady_window().await;
    let here = client_from([127, 0, 0, 1]);
    let status = app.url(&format!("/c/{s1}/status"));
    let answers = futures::future::join_all(
        (0..20).map(|_| public(&here, reqwest::Method::GET, &status, JSON, None)),
    )
    .await;
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    assert_eq!(
        ok,
        8,
        "{:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    for (code, retry, body) in answers.iter().filter(|a| a.0 != 200) {
        assert_eq!(*code, 429, "{body}");
        assert!(retry.is_some_and(|r| (1..=60).contains(&r)), "{retry:?}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(v["error"]["code"], "rate_limited", "{body}");
        assert_eq!(v["error"]["type"], "rate_limit_error", "{body}");
    }
    // A browser gets a page that says when to come back.
    let (code, retry, page) = public(
        &here,
        reqwest::Method::GET,
        &app.url(&format!("/c/{s1}")),
        HTML,
        None,
    )
    .await;
    assert_eq!(code, 429);
    assert!(retry.is_some());
    assert!(
        page.contains("Too many requests") && page.contains("try again"),
        "{page}"
    );
    // Another session answers.
    let other = app.url(&format!("/c/{s2}/status"));
    assert_eq!(
        public(&here, reqwest::Method::GET, &other, JSON, None)
            .await
            .0,
        200
    );
    // Writes: four attempts from this address, the fifth refused and not
    // stored.
    let pay = app.url(&format!("/c/{s2}/pay"));
    for n in 0..4 {
        let (code, _, body) = public(
            &here,
            reqwest::Method::POST,
            &pay,
            HTML,
            Some("provider=esewa"),
        )
        .await;
        assert_eq!(code, 200, "attempt {n}: {body}");
    }
    let (code, retry, _) = public(
        &here,
        reqwest::Method::POST,
        &pay,
        HTML,
        Some("provider=esewa"),
    )
    .await;
    assert_eq!((code, retry.is_some()), (429, true));
    assert_eq!(total(&app, &key, "/v1/payments").await, 4);
    // Another address pays.
    let there = client_from([127, 0, 0, 2]);
    let pay3 = app.url(&format!("/c/{s3}/pay"));
    let (code, _, body) = public(
        &there,
        reqwest::Method::POST,
        &pay3,
        HTML,
        Some("provider=esewa"),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(total(&app, &key, "/v1/payments").await, 5);
    app.stop().await;
}

/// Issue 37, 1: the status poll and the provider returns are counted per
/// address (a generous budget), and a session's own budget is spent only
/// once the session exists: one client sending made-up ids is bounded,
/// costs no counter per id, and locks out neither the real session's
/// customer nor anyone at another address.
async fn made_up_session_ids_are_bounded_per_address_and_cost_no_counter(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Asan Bazaar", "owner@asan.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let real = new_session(&app, &key).await;
    // polls per address, the app's session budget, link opens per /56, /48
    app.state().public_limits().set_more(12, 100, 100, 100);
    steady_window().await;
    let stranger = client_from([127, 0, 0, 9]);
    let made_up: Vec<String> = (0..10)
        .map(|_| shared::ids::SessionId::new().to_string())
        .collect();
    let mut codes = Vec::new();
    for (n, id) in made_up.iter().cycle().take(20).enumerate() {
        let path = if n % 2 == 0 {
            format!("/c/{id}/status")
        } else {
            format!("/c/{id}/return/pay_01HZZZZZZZZZZZZZZZZZZZZZZZ/ok?data=x")
        };
        codes.push(
            public(&stranger, reqwest::Method::GET, &app.url(&path), JSON, None)
                .await
                .0,
        );
    }
    let refused = codes.iter().filter(|c| **c == 429).count();
    assert_eq!(refused, 8, "{codes:?}");
    assert!(codes[..12].iter().all(|c| *c == 404), "{codes:?}");
    // No counter for any of the ids: only the address's.
    let now = app.state().clock.now();
    let limits = app.state().public_limits();
    let store = app.state().store.clone();
    for id in &made_up {
        assert_eq!(
            limits.spent(&*store, &format!("S#{id}"), now).await,
            0,
            "{id}"
        );
    }
    assert_eq!(limits.spent(&*store, "AP#127.0.0.9", now).await, 12);
    // The real session's customer, at another address, is answered.
    let customer = client_from([127, 0, 0, 2]);
    let status = app.url(&format!("/c/{real}/status"));
    let (code, _, body) = public(&customer, reqwest::Method::GET, &status, JSON, None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(limits.spent(&*store, &format!("S#{real}"), now).await, 1);
    app.stop().await;
}

/// Issue 37, 13: a wrong method, a form that is not UTF-8 and an outsized
/// form on the keyless routes are answered plainly (a page for a browser,
/// the envelope for a script) and store nothing.
async fn the_keyless_routes_refuse_bad_input_plainly(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Asan Bazaar", "owner@asan.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let s = new_session(&app, &key).await;
    let link = app
        .post(
            "/v1/payment-links",
            Some(&key),
            None,
            &serde_json::json!({"title": "Everest tee", "amount": 120000}),
        )
        .await;
    assert_eq!(link.status, 201, "{}", link.body);
    let link = link.body["id"].as_str().unwrap_or_default().to_owned();
    let client = client_from([127, 0, 0, 1]);
    let send = async |method: reqwest::Method, path: &str, accept: &str, body: Vec<u8>| {
        // A server that refuses a body before reading it all (413) may
        // close the connection while the client is still writing it; the
        // client then sees a broken pipe instead of the answer. Nothing
        // was done by such a request: it is sent again (a few times).
        let mut sent = None;
        for _ in 0..3 {
            let req = client
                .request(method.clone(), app.url(path))
                .header("accept", accept)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.clone());
            match req.send().await {
                Err(e) if e.is_request() || e.is_body() => sent = Some(Err(e)),
                other => {
                    sent = Some(other);
                    break;
                }
            }
        }
        let Some(sent) = sent else {
            panic!("{path}: nothing sent")
        };
        match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                let allow = r
                    .headers()
                    .get("allow")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let ct = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                (status, allow, ct, r.text().await.unwrap_or_default())
            }
            Err(e) => panic!("{path}: {e}"),
        }
    };
    // A wrong method: a page for a browser, the envelope for a script,
    // both saying what the route takes.
    let (code, allow, ct, page) =
        send(reqwest::Method::PUT, &format!("/c/{s}"), HTML, vec![]).await;
    assert_eq!(
        (code, ct.as_str()),
        (405, "text/html; charset=utf-8"),
        "{page}"
    );
    assert!(allow.contains("GET"), "{allow}");
    assert!(page.contains("cannot be used that way"), "{page}");
    for path in [format!("/c/{s}"), format!("/l/{link}")] {
        let (code, allow, _, body) = send(reqwest::Method::DELETE, &path, JSON, vec![]).await;
        assert_eq!(code, 405, "{path}: {body}");
        assert!(allow.contains("GET"), "{path}: {allow}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(v["error"]["code"], "method_not_allowed", "{path}: {body}");
    }
    // A picker's form that is not UTF-8 starts nothing.
    let mut form = b"provider=esewa&name=".to_vec();
    form.extend_from_slice(&[0xff, 0xfe, 0x41]);
    let (code, _, _, page) = send(
        reqwest::Method::POST,
        &format!("/c/{s}/pay"),
        HTML,
        form.clone(),
    )
    .await;
    assert_eq!(code, 400, "{page}");
    assert!(page.contains("could not be read"), "{page}");
    assert_eq!(total(&app, &key, "/v1/payments").await, 0);
    let (code, _, _, page) = send(reqwest::Method::POST, &format!("/l/{link}"), HTML, form).await;
    assert_eq!(code, 400, "{page}");
    // A 100 KB form opens no session: 413, a page or the envelope.
    let mut big = b"name=".to_vec();
    big.extend(std::iter::repeat_n(b'a', 100 * 1024));
    let (code, _, _, page) = send(
        reqwest::Method::POST,
        &format!("/l/{link}"),
        HTML,
        big.clone(),
    )
    .await;
    assert_eq!(code, 413, "{page}");
    assert!(page.contains("too large"), "{page}");
    let (code, _, _, body) = send(reqwest::Method::POST, &format!("/l/{link}"), JSON, big).await;
    assert_eq!(code, 413, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(total(&app, &key, "/v1/sessions").await, 1);
    // The same link still opens for a real form.
    let (code, _, _, page) = send(
        reqwest::Method::POST,
        &format!("/l/{link}"),
        HTML,
        b"name=Sita".to_vec(),
    )
    .await;
    assert_eq!(code, 303, "{page}");
    assert_eq!(total(&app, &key, "/v1/sessions").await, 2);
    app.stop().await;
}

async fn views(app: &TestApp, key: &str, id: &str) -> u64 {
    let link = app.get(&format!("/v1/payment-links/{id}"), Some(key)).await;
    link.body["stats"]["views"].as_u64().unwrap_or(u64::MAX)
}

/// One address opens at most a few sessions from a link (each would be
/// an open session to expire and an attempt to reconcile), the link opens
/// a bounded number a minute in all, a flood of its page is cut per
/// address and counts only the views it served, and bad input answers a
/// clear page.
async fn a_link_is_bounded_per_address_and_in_all(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let l = app
        .post(
            "/v1/payment-links",
            Some(&key),
            Some("link-1"),
            &serde_json::json!({"title": "Tee", "amount": 120000}),
        )
        .await;
    assert_eq!(l.status, 201, "{}", l.body);
    let id = l.body["id"].as_str().unwrap_or_default().to_owned();
    // address, writes per address, per session, link opens, link sessions
    app.state().public_limits().set(1000, 100, 100, 5, 3);
    steady_window().await;
    let here = client_from([127, 0, 0, 1]);
    let url = app.url(&format!("/l/{id}"));
    for n in 0..3 {
        let (code, _, body) =
            public(&here, reqwest::Method::POST, &url, HTML, Some("name=Ram")).await;
        assert_eq!(code, 303, "session {n}: {body}");
    }
    let (code, retry, page) =
        public(&here, reqwest::Method::POST, &url, HTML, Some("name=Ram")).await;
    assert_eq!(code, 429, "{page}");
    // The half-hour window of sessions per link and address: the wait is
    // what is left of it (over a minute unless it is nearly over).
    assert!(retry.is_some_and(|r| (1..=1800).contains(&r)), "{retry:?}");
    assert!(
        page.contains("Please wait") && page.contains("try again"),
        "{page}"
    );
    // The same link with its id percent-encoded is the same link.
    let encoded = app.url(&format!("/l/{}", id.replace('_', "%5F")));
    let (code, _, page) = public(
        &here,
        reqwest::Method::POST,
        &encoded,
        HTML,
        Some("name=Ram"),
    )
    .await;
    assert_eq!(code, 429, "{page}");
    assert_eq!(total(&app, &key, "/v1/sessions").await, 3);
    // Other addresses: the link's fourth and fifth opens (one with a
    // broken form, answered with a page), then the link is full.
    let there = client_from([127, 0, 0, 3]);
    assert_eq!(
        public(&there, reqwest::Method::POST, &url, HTML, Some("name=Sita"))
            .await
            .0,
        303
    );
    let (code, _, _) = public(
        &there,
        reqwest::Method::POST,
        &url,
        HTML,
        Some("amount=%ZZ&name=%"),
    )
    .await;
    assert!(code == 303 || code == 422, "{code}");
    let (code, retry, _) = public(
        &client_from([127, 0, 0, 5]),
        reqwest::Method::POST,
        &url,
        JSON,
        Some("name=Hari"),
    )
    .await;
    assert_eq!(code, 429);
    assert!(retry.is_some_and(|r| (1..=60).contains(&r)), "{retry:?}");
    assert!(total(&app, &key, "/v1/sessions").await <= 5);
    // An absurd id, a wrong method: clear answers, nothing stored.
    let long = app.url(&format!("/l/{}", "x".repeat(5000)));
    assert_eq!(
        public(&there, reqwest::Method::GET, &long, HTML, None)
            .await
            .0,
        404
    );
    assert_eq!(
        public(&there, reqwest::Method::PUT, &url, HTML, None)
            .await
            .0,
        405
    );
    // A flood of the page from one address: its 50 a minute are served
    // (and counted as views), the rest refused.
    app.state().public_limits().set(50, 100, 100, 5, 3);
    let before = views(&app, &key, &id).await;
    let flooder = client_from([127, 0, 0, 7]);
    let flood = futures::future::join_all(
        (0..120).map(|_| public(&flooder, reqwest::Method::GET, &url, HTML, None)),
    )
    .await;
    let served = flood.iter().filter(|a| a.0 == 200).count();
    assert_eq!(served, 50);
    assert!(flood.iter().all(|a| a.0 == 200 || a.0 == 429));
    assert_eq!(views(&app, &key, &id).await, before + 50);
    // Another address still gets the page.
    assert_eq!(
        public(&here, reqwest::Method::GET, &url, HTML, None)
            .await
            .0,
        200
    );
    app.stop().await;
}

on_both_backends!(
    public_routes_are_throttled_per_session_and_address,
    made_up_session_ids_are_bounded_per_address_and_cost_no_counter,
    the_keyless_routes_refuse_bad_input_plainly,
    a_link_is_bounded_per_address_and_in_all,
    only_the_limit_passes_per_window,
    each_key_has_its_own_budget,
    a_refused_key_costs_nothing,
    last_used_at_is_written_at_most_once_a_minute,
);
