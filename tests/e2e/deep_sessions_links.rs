//! Filtered counted lists (issue 37 item 11): `GET /v1/sessions?status=`
//! (stored status narrowings merged with lazy expiry) and
//! `GET /v1/payment-links?active=` (narrowed by the stored `active`) serve
//! any offset exactly: a deep filtered page is the slice of the whole
//! list filtered client-side, totals included, and a record whose value
//! changes moves list. Both backends.

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::Tenant as Scoped;
use shared::domain::account::Scope;
use shared::domain::checkout::{self, Creator, SessionStatus};
use shared::domain::links::{self, PaymentLink};
use shared::domain::record::Record;
use shared::ids::{LinkId, SessionId};
use shared::time::{Clock, SystemClock, Timestamp};

fn page(a: &Answer) -> Vec<Value> {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["data"].as_array().cloned().unwrap_or_default()
}

fn ids(a: &Answer) -> Vec<String> {
    page(a)
        .iter()
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect()
}

async fn shop(app: &TestApp, name: &str) -> (Scoped, String) {
    app.set_rate_limits(10_000, 10_000);
    let t = app.tenant(name, &format!("owner@{name}.np")).await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[
                Scope::PaymentsWrite,
                Scope::SessionsRead,
                Scope::LinksRead,
                Scope::LinksWrite,
            ],
        )
        .await;
    (Scoped::new(t.project.id.clone(), Mode::Sandbox), key)
}

/// A ULID id minted at `ms` after `prefix`, its random part from `i`.
fn id_at(prefix: &str, ms: i64, i: u64) -> String {
    let ulid = ulid::Ulid::from_parts(
        u64::try_from(ms).unwrap_or(0),
        u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15) & ((1u128 << 80) - 1),
    );
    format!("{prefix}{}", ulid.to_string().to_ascii_lowercase())
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms).unwrap_or_else(|| panic!("ms {ms}"))
}

/// Sessions over the 40 days before now as their creations store them
/// (narrowed and counted): mostly expired (some only lazily: open and
/// past their time), some pending, paid or failed.
async fn seed_sessions(app: &TestApp, tenant: &Scoped, n: u64) {
    let now = SystemClock.now().unix_millis();
    let creator = Creator {
        project_id: tenant.project.clone(),
        mode: Mode::Sandbox,
        api_key_id: "ak_seed".into(),
        spend_cap_paisa: None,
    };
    for i in 0..n {
        let created = now - 40 * 86_400_000 + i64::try_from(i).unwrap_or(0) * 12_000_000;
        let valid = checkout::validate_create(
            serde_json::from_value(
                json!({"amount": 10_000, "returnUrl": "https://shop.example/thanks"}),
            )
            .unwrap_or_else(|e| panic!("{e}")),
            Mode::Sandbox,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut s = checkout::new_session(&creator, valid, at(created));
        s.id = SessionId::stored(id_at("cs_", created, i));
        let (status, expires) = match i % 8 {
            // Open, past their time: expired as of now, not stored so.
            0 => (SessionStatus::Pending, now - 60_000),
            1 => (SessionStatus::Initiated, now - 120_000),
            2 => (SessionStatus::Pending, now + 3_600_000),
            3 => (SessionStatus::Success, created + 60_000),
            4 => (SessionStatus::Failed, created + 60_000),
            _ => (SessionStatus::Expired, created + 1_800_000),
        };
        s.status = status;
        s.expires_at = at(expires);
        let mut ops = vec![s.put_new().unwrap_or_else(|e| panic!("{e}"))];
        ops.extend(s.insert_counts());
        app.store
            .transact(ops)
            .await
            .unwrap_or_else(|e| panic!("session: {e}"));
    }
}

/// Every record of `list` (as the API shows it) by walking
/// `starting_after` pages of 100.
async fn walk(app: &TestApp, key: &str, list: &str) -> Vec<Value> {
    let mut walked: Vec<Value> = Vec::new();
    let mut path = format!("{list}?limit=100");
    loop {
        let got = page(&app.get(&path, Some(key)).await);
        let Some(last) = got.last().and_then(|r| r["id"].as_str()).map(str::to_owned) else {
            break;
        };
        walked.extend(got);
        assert!(walked.len() <= 2000, "the walk goes round");
        path = format!("{list}?limit=100&starting_after={last}");
    }
    walked
}

/// The filtered list `filtered` (`?<field>=<value>`) at deep offsets and
/// after a record equals the slice of `want` (the whole list filtered
/// client-side), totals included.
async fn assert_filtered(app: &TestApp, key: &str, filtered: &str, want: &[String]) {
    let n = want.len();
    for offset in [0, 1, 99, 101, n / 2, n.saturating_sub(5), n, n + 40] {
        let a = app
            .get(&format!("{filtered}&limit=7&offset={offset}"), Some(key))
            .await;
        let slice: Vec<String> = want.iter().skip(offset).take(7).cloned().collect();
        assert_eq!(ids(&a), slice, "{filtered} offset {offset}");
        assert_eq!(
            a.body["meta"],
            json!({"total": n, "limit": 7, "offset": offset}),
            "{filtered}"
        );
    }
    if n > 10 {
        let from = &want[4];
        let a = app
            .get(
                &format!("{filtered}&limit=5&offset=3&starting_after={from}"),
                Some(key),
            )
            .await;
        let slice: Vec<String> = want.iter().skip(8).take(5).cloned().collect();
        assert_eq!(ids(&a), slice, "{filtered} after {from}");
        assert_eq!(a.body["meta"]["total"], n, "{filtered}");
    }
}

fn with(all: &[Value], field: &str, value: &Value) -> Vec<String> {
    all.iter()
        .filter(|r| &r[field] == value)
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect()
}

async fn sessions_by_status_at_any_offset(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = shop(&app, "deepstatus").await;
    seed_sessions(&app, &tenant, 280).await;
    let all = walk(&app, &key, "/v1/sessions").await;
    assert_eq!(all.len(), 280);
    for status in ["pending", "initiated", "success", "failed", "expired"] {
        let want = with(&all, "status", &json!(status));
        assert_filtered(&app, &key, &format!("/v1/sessions?status={status}"), &want).await;
    }
    // Expired now: it moves from pending to expired.
    let pending = with(&all, "status", &json!("pending"));
    let moved = &pending[pending.len() / 2];
    let a = app
        .post(
            &format!("/v1/checkout/{moved}/expire"),
            Some(&key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let all = walk(&app, &key, "/v1/sessions").await;
    let (pending_now, expired_now) = (
        with(&all, "status", &json!("pending")),
        with(&all, "status", &json!("expired")),
    );
    assert!(!pending_now.contains(moved) && expired_now.contains(moved));
    assert_eq!(pending_now.len() + 1, pending.len());
    assert_filtered(&app, &key, "/v1/sessions?status=pending", &pending_now).await;
    assert_filtered(&app, &key, "/v1/sessions?status=expired", &expired_now).await;
    app.stop().await;
}

async fn send_json(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Value,
) -> Answer {
    send(
        app.client
            .request(method, app.url(path))
            .bearer_auth(key)
            .json(&body),
    )
    .await
}

async fn links_by_active_at_any_offset(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (tenant, key) = shop(&app, "deepactive").await;
    let now = SystemClock.now().unix_millis();
    for i in 0..190u64 {
        let created = now - 30 * 86_400_000 + i64::try_from(i).unwrap_or(0) * 11_000_000;
        let req: links::CreateLink =
            serde_json::from_value(json!({"title": "Tea", "amount": 10_000}))
                .unwrap_or_else(|e| panic!("{e}"));
        let mut l: PaymentLink =
            links::new_link(&tenant, req, at(created)).unwrap_or_else(|e| panic!("{e:?}"));
        l.id = LinkId::stored(id_at("lnk_", created, i));
        l.active = i % 4 != 0;
        let mut ops = vec![l.put_new().unwrap_or_else(|e| panic!("{e}"))];
        ops.extend(l.insert_counts());
        app.store
            .transact(ops)
            .await
            .unwrap_or_else(|e| panic!("link: {e}"));
    }
    let all = walk(&app, &key, "/v1/payment-links").await;
    assert_eq!(all.len(), 190);
    for active in [true, false] {
        let want = with(&all, "active", &json!(active));
        assert_filtered(
            &app,
            &key,
            &format!("/v1/payment-links?active={active}"),
            &want,
        )
        .await;
    }
    // A PATCH and a cancel move a link each; a DELETE takes one out.
    let active = with(&all, "active", &json!(true));
    let (patched, cancelled, deleted) = (&active[5], &active[120], &active[60]);
    let a = send_json(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{patched}"),
        &key,
        json!({"active": false}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = send_json(
        &app,
        reqwest::Method::POST,
        &format!("/v1/payment-links/{cancelled}/cancel"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = send_json(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/payment-links/{deleted}"),
        &key,
        json!({}),
    )
    .await;
    assert!(a.status == 200 || a.status == 204, "{}", a.body);
    let all_now = walk(&app, &key, "/v1/payment-links").await;
    let (on, off) = (
        with(&all_now, "active", &json!(true)),
        with(&all_now, "active", &json!(false)),
    );
    assert!(off.contains(patched) && off.contains(cancelled) && !on.contains(deleted));
    assert_eq!(on.len(), active.len() - 3);
    assert_filtered(&app, &key, "/v1/payment-links?active=true", &on).await;
    assert_filtered(&app, &key, "/v1/payment-links?active=false", &off).await;
    app.stop().await;
}

on_both_backends!(
    sessions_by_status_at_any_offset,
    links_by_active_at_any_offset,
);
