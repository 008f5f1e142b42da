//! End to end over HTTP: the local gateway on a real loopback socket, driven
//! the way a merchant's server drives it.

use dhukuti_tests::{
    Answer, TestApp, Which, fresh_backend, on_both_backends, send, spawn_app, spawn_app_on,
    spawn_app_tweaked, spawn_app_wrapped,
};
use serde_json::{Value, json};
use shared::domain::account::{self, Pause, Scope, Suspension};
use shared::domain::{Mode, Provider};
use shared::time::{Clock, SystemClock};

fn keys_of(app: &TestApp) -> (String, String) {
    let Some(r) = app.running.as_ref() else {
        panic!("not running")
    };
    (r.keys.sandbox.clone(), r.keys.live.clone())
}

async fn health_answers_without_a_key(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app.get("/health", None).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["status"], "ok");
    assert!(!a.header("x-request-id").is_empty());
    app.stop().await;
}

async fn first_start_writes_demo_keys_that_work(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (sandbox, live) = keys_of(&app);
    assert!(sandbox.starts_with("sk_test_") && live.starts_with("sk_live_"));
    let text = std::fs::read_to_string(app.data_dir.join("demo-keys.json")).unwrap_or_default();
    let file: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(file["sandbox"], sandbox.as_str());
    assert_eq!(file["live"], live.as_str());

    let a = app.get("/v1/account", Some(&sandbox)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["project"]["mode"], "sandbox");
    let a = app.get("/v1/account", Some(&live)).await;
    assert_eq!(a.body["project"]["mode"], "live");
    app.stop().await;
}

async fn a_restart_keeps_data_and_keys(which: Which) {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let Some(backend) = fresh_backend(which, tmp.path()) else {
        return;
    };
    let app = spawn_app_on(backend.clone(), tmp.path().to_path_buf(), |s| s).await;
    let keys = keys_of(&app);
    let t = app.tenant("Kathmandu Books", "info@ktmbooks.example").await;
    let key = app.key(&t, Mode::Live, &Scope::ALL).await;
    let p = app.payment(&t, Mode::Live, 4200, Provider::Esewa).await;
    app.stop().await;

    let again = spawn_app_on(backend, tmp.path().to_path_buf(), |s| s).await;
    assert_eq!(keys_of(&again), keys, "demo keys survive a restart");
    let a = again
        .get(&format!("/v1/payments/{}", p.id), Some(&key))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["amount"], 4200);
    let a = again.get("/v1/account", Some(&keys.0)).await;
    assert_eq!(a.status, 200);
    again.stop().await;
}

async fn account_shows_the_key_context_and_masks_email_without_pii_read(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Pokhara Crafts", "maya@pokhara.example").await;
    let narrow = app.key(&t, Mode::Sandbox, &[Scope::AccountRead]).await;
    let wide = app
        .key(&t, Mode::Live, &[Scope::AccountRead, Scope::PiiRead])
        .await;

    let a = app.get("/v1/account", Some(&narrow)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let b = &a.body;
    assert_eq!(b["merchant"]["id"], t.merchant.id.as_str());
    assert_eq!(b["merchant"]["name"], "Pokhara Crafts");
    assert_eq!(b["merchant"]["email"], "m***@pokhara.example");
    assert!(b["merchant"]["created_at"].is_string());
    assert_eq!(b["project"]["id"], t.project.id.as_str());
    assert_eq!(b["project"]["mode"], "sandbox");
    let k = &b["api_key"];
    for field in [
        "id",
        "prefix",
        "hint",
        "kind",
        "scopes",
        "description",
        "spend_cap_paisa",
    ] {
        assert!(k.get(field).is_some(), "api_key.{field} missing: {k}");
    }
    // Timestamps typed without "or null": set, or omitted.
    for field in ["expires_at", "last_used_at"] {
        assert_ne!(k.get(field), Some(&serde_json::Value::Null), "{k}");
    }
    assert!(k["id"].as_str().is_some_and(|s| s.starts_with("ak_")));
    assert_eq!(k["prefix"], &narrow[..12]);
    assert_eq!(k["hint"], &narrow[narrow.len() - 4..]);
    assert_eq!(k["kind"], "restricted");
    assert_eq!(k["scopes"], serde_json::json!(["account:read"]));
    assert_eq!(b["plan"], "growth");
    assert!(b["entitlements"].is_object());
    // The secret never comes back.
    assert!(!b.to_string().contains(&narrow));

    let a = app.get("/v1/account", Some(&wide)).await;
    assert_eq!(a.body["merchant"]["email"], "maya@pokhara.example");
    assert_eq!(a.body["project"]["mode"], "live");
    app.stop().await;
}

async fn missing_malformed_and_unknown_keys_get_401(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    for path in [
        "/v1/account",
        "/v1/payments",
        "/v1/payments/pay_01j00000000000000000000000",
    ] {
        app.get(path, None)
            .await
            .assert_error(401, "authentication_error", "api_key_invalid");
        app.get(path, Some("nonsense")).await.assert_error(
            401,
            "authentication_error",
            "api_key_invalid",
        );
        let unknown = format!("sk_test_{}", "Q".repeat(40));
        app.get(path, Some(&unknown)).await.assert_error(
            401,
            "authentication_error",
            "api_key_invalid",
        );
    }
    let a = send(
        app.client
            .get(app.url("/v1/account"))
            .header("authorization", "Basic abc"),
    )
    .await;
    a.assert_error(401, "authentication_error", "api_key_invalid");
    app.stop().await;
}

async fn scopes_are_checked_per_route(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Scope Shop", "s@scope.example").await;
    let only_account = app.key(&t, Mode::Sandbox, &[Scope::AccountRead]).await;
    let only_payments = app.key(&t, Mode::Sandbox, &[Scope::PaymentsRead]).await;

    let a = app.get("/v1/payments", Some(&only_account)).await;
    a.assert_error(403, "permission_error", "missing_scope");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("payments:read")
    );
    app.get(
        "/v1/payments/pay_01j00000000000000000000000",
        Some(&only_account),
    )
    .await
    .assert_error(403, "permission_error", "missing_scope");
    let a = app.get("/v1/account", Some(&only_payments)).await;
    a.assert_error(403, "permission_error", "missing_scope");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("account:read")
    );
    assert_eq!(
        app.get("/v1/payments", Some(&only_payments)).await.status,
        200
    );
    app.stop().await;
}

async fn suspended_merchants_get_403_with_the_suspension(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Suspended Co", "x@susp.example").await;
    let key = app.key(&t, Mode::Live, &Scope::ALL).await;
    let s = Suspension {
        suspended_at: SystemClock.now(),
        reason: "Chargeback review".into(),
    };
    assert!(
        account::suspend_merchant(&*app.store, &t.merchant.id, s)
            .await
            .is_ok()
    );
    for path in ["/v1/account", "/v1/payments"] {
        let a = app.get(path, Some(&key)).await;
        a.assert_error(403, "account_error", "account_suspended");
        assert_eq!(a.body["error"]["suspension"]["reason"], "Chargeback review");
        assert!(a.body["error"]["suspension"]["suspended_at"].is_string());
    }
    app.stop().await;
}

async fn paused_keys_get_423_with_the_pause(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Paused Co", "x@paused.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let hash = account::hash_secret(&key);
    let Ok(Some(item)) = app.store.get(&account::ApiKey::key_for_hash(&hash)).await else {
        panic!()
    };
    let Ok(record) = shared::domain::record::from_item::<account::ApiKey>(item) else {
        panic!()
    };
    let pause = Pause {
        paused_at: SystemClock.now(),
        reason: "Key rotation".into(),
    };
    assert!(
        account::pause_api_key(&*app.store, &record, pause)
            .await
            .is_ok()
    );
    let a = app.get("/v1/account", Some(&key)).await;
    a.assert_error(423, "account_error", "token_paused");
    assert_eq!(a.body["error"]["pause"]["reason"], "Key rotation");
    app.stop().await;
}

async fn payment_retrieve_has_every_field_of_the_spec(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Field Shop", "f@field.example").await;
    let key = app.key(&t, Mode::Live, &[Scope::PaymentsRead]).await;
    let p = app.payment(&t, Mode::Live, 150_000, Provider::Khalti).await;
    let a = app.get(&format!("/v1/payments/{}", p.id), Some(&key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let b = &a.body;
    assert_eq!(b["id"], p.id.as_str());
    assert_eq!(b["livemode"], true);
    assert_eq!(b["projectId"], t.project.id.as_str());
    assert_eq!(b["checkoutSessionId"], p.checkout_session_id.as_str());
    assert_eq!(b["mode"], "live");
    assert_eq!(b["amount"], 150_000);
    assert_eq!(b["amountRefunded"], 0);
    assert_eq!(b["currency"], "NPR");
    assert_eq!(b["provider"], "khalti");
    assert_eq!(b["status"], "success");
    assert_eq!(b["providerRef"], "REF-1");
    assert_eq!(b["failureReason"], Value::Null);
    assert_eq!(b["metadata"]["order"], "A-1");
    assert_eq!(b["customerName"], "Sita Sharma");
    assert_eq!(b["customerEmail"], "sita@example.com");
    assert_eq!(b["customerPhone"], "9841000001");
    assert!(b["createdAt"].as_str().is_some_and(|s| s.ends_with('Z')));
    assert!(b["updatedAt"].as_str().is_some_and(|s| s.ends_with('Z')));
    assert_eq!(a.header("content-type"), "application/json");
    app.stop().await;
}

async fn other_projects_and_other_modes_are_invisible(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app.tenant("Shop A", "a@a.example").await;
    let b = app.tenant("Shop B", "b@b.example").await;
    let a_live = app.key(&a, Mode::Live, &Scope::ALL).await;
    let a_test = app.key(&a, Mode::Sandbox, &Scope::ALL).await;
    let b_live = app.key(&b, Mode::Live, &Scope::ALL).await;
    let live_payment = app.payment(&a, Mode::Live, 1000, Provider::Esewa).await;
    let test_payment = app.payment(&a, Mode::Sandbox, 2000, Provider::Esewa).await;

    let path = |id: &str| format!("/v1/payments/{id}");
    assert_eq!(
        app.get(&path(&live_payment.id), Some(&a_live)).await.status,
        200
    );
    app.get(&path(&live_payment.id), Some(&a_test))
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    app.get(&path(&live_payment.id), Some(&b_live))
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    app.get(&path(&test_payment.id), Some(&a_live))
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    app.get(&path("pay_doesnotexist"), Some(&a_live))
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    app.get(&path("../v1/account"), Some(&a_live)).await;

    let ids = |ans: &Answer| -> Vec<String> {
        ans.body["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|p| p["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let l = app.get("/v1/payments", Some(&a_live)).await;
    assert_eq!(ids(&l), vec![live_payment.id.clone()]);
    assert_eq!(l.body["meta"]["total"], 1);
    let l = app.get("/v1/payments", Some(&a_test)).await;
    assert_eq!(ids(&l), vec![test_payment.id.clone()]);
    let l = app.get("/v1/payments", Some(&b_live)).await;
    assert_eq!(ids(&l), Vec::<String>::new());
    assert_eq!(l.body["meta"]["total"], 0);
    app.stop().await;
}

async fn payments_list_is_newest_first_and_paginates(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("List Shop", "l@list.example").await;
    let key = app.key(&t, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let mut created = Vec::new();
    for i in 0..30 {
        created.push(
            app.payment(&t, Mode::Sandbox, 100 + i, Provider::Khalti)
                .await
                .id,
        );
    }
    created.reverse();

    let a = app.get("/v1/payments", Some(&key)).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.body["meta"],
        serde_json::json!({"total": 30, "limit": 25, "offset": 0})
    );
    let got: Vec<&str> = a.body["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|p| p["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        got,
        created[..25]
            .iter()
            .map(|id| id.as_str())
            .collect::<Vec<_>>()
    );

    let a = app.get("/v1/payments?limit=4&offset=27", Some(&key)).await;
    assert_eq!(
        a.body["meta"],
        serde_json::json!({"total": 30, "limit": 4, "offset": 27})
    );
    let got: Vec<&str> = a.body["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|p| p["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        got,
        created[27..]
            .iter()
            .map(|id| id.as_str())
            .collect::<Vec<_>>()
    );

    let a = app.get("/v1/payments?offset=100", Some(&key)).await;
    assert_eq!(a.body["data"], serde_json::json!([]));
    assert_eq!(a.body["meta"]["total"], 30);

    for (q, param) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("offset=-1", "offset"),
        ("offset=1e3", "offset"),
    ] {
        let a = app.get(&format!("/v1/payments?{q}"), Some(&key)).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], param, "{q}");
    }
    app.stop().await;
}

/// Refusals come in order: a request without a usable key is a 401 before
/// anything about its Idempotency-Key (or its body) is judged.
async fn no_key_is_a_401_before_a_bad_idempotency_key(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let long = "k".repeat(300);
    for key in ["", long.as_str()] {
        let a = send(
            app.client
                .post(app.url("/v1/refunds"))
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body("not json"),
        )
        .await;
        a.assert_error(401, "authentication_error", "api_key_invalid");
        assert!(!a.header("x-request-id").is_empty());
    }
    app.stop().await;
}

async fn unknown_routes_and_methods_get_the_envelope(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (key, _) = keys_of(&app);
    app.get("/v1/nothing-here", Some(&key)).await.assert_error(
        404,
        "invalid_request_error",
        "not_found",
    );
    let a = send(app.client.delete(app.url("/v1/account")).bearer_auth(&key)).await;
    a.assert_error(405, "invalid_request_error", "method_not_allowed");
    let a = send(
        app.client
            .post(app.url("/v1/payments"))
            .bearer_auth(&key)
            .body("{}"),
    )
    .await;
    a.assert_error(405, "invalid_request_error", "method_not_allowed");
    // A method the path does not take is a 405 whatever Idempotency-Key
    // it carries (the key is not judged, nor taken, for it): found by the
    // contract fuzzer, which got 409 idempotency_key_reused here.
    let body = json!({"amount": 10_000, "returnUrl": "https://shop.example/thanks"});
    let created = send(
        app.client
            .post(app.url("/v1/checkout"))
            .bearer_auth(&key)
            .header("Idempotency-Key", "fuzz-405")
            .json(&body),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    for method in [reqwest::Method::PATCH, reqwest::Method::DELETE] {
        let a = send(
            app.client
                .request(method.clone(), app.url("/v1/checkout"))
                .bearer_auth(&key)
                .header("Idempotency-Key", "fuzz-405")
                .json(&body),
        )
        .await;
        a.assert_error(405, "invalid_request_error", "method_not_allowed");
    }
    // ... and the POST under that key still replays.
    let again = send(
        app.client
            .post(app.url("/v1/checkout"))
            .bearer_auth(&key)
            .header("Idempotency-Key", "fuzz-405")
            .json(&body),
    )
    .await;
    assert_eq!(again.body["id"], created.body["id"], "{}", again.body);

    // A body declared over 1 MiB is refused before it is read: 413 in the
    // envelope. Raw TCP, so the client reads the answer instead of racing
    // to push 2 MiB into a connection the server has already answered.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let head = format!(
        "POST /v1/checkout HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        2 * 1024 * 1024
    );
    tcp.write_all(head.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("\"code\":\"payload_too_large\""),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("x-request-id:"),
        "{answer}"
    );
    app.stop().await;
}

async fn concurrent_reads_all_succeed_with_distinct_request_ids(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Busy Shop", "b@busy.example").await;
    let key = app.key(&t, Mode::Live, &Scope::ALL).await;
    let p = app.payment(&t, Mode::Live, 500, Provider::Fonepay).await;
    let path = format!("/v1/payments/{}", p.id);
    let answers = futures::future::join_all((0..64).map(|_| app.get(&path, Some(&key)))).await;
    let mut ids: Vec<String> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 200);
            a.header("x-request-id").to_owned()
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 64);
    app.stop().await;
}

/// Store calls a request costs, counted on the counting store wrapper
/// (issue 21's budgets). Authentication reads the key and its merchant
/// once, then remembers them (`account::cache`): a read is then one call,
/// a list page two side by side. The per-key rate limiter's writes are
/// counted apart: none on the embedded store (one process counts in
/// memory), on DynamoDB a lease of slots now and then.
async fn store_calls_per_request_stay_within_budget(which: Which) {
    use shared::store::counting::CountingStore;
    use std::sync::Arc;

    let mut counting: Option<Arc<CountingStore>> = None;
    // No webhook poller: its outbox reads would be counted too.
    let app = spawn_app_tweaked(
        which,
        |inner| {
            let c = Arc::new(CountingStore::new(inner).apart(shared::keys::is_rate_window));
            counting = Some(c.clone());
            c
        },
        |s| s.webhook_poll = None,
    )
    .await;
    let (Some(app), Some(counting)) = (app, counting) else {
        return;
    };
    let t = app.tenant("Count Shop", "c@count.example").await;
    let key = app.key(&t, Mode::Live, &[Scope::PaymentsRead]).await;
    let p = app.payment(&t, Mode::Live, 100, Provider::Khalti).await;
    let read = format!("/v1/payments/{}", p.id);

    // Cold: the key by its hash, its merchant, the payment, and the key's
    // first last_used_at.
    let before = counting.other_calls();
    assert_eq!(app.get(&read, Some(&key)).await.status, 200);
    assert_eq!(counting.other_calls() - before, 4);

    // Warm: what the route itself reads, nothing for authentication (a
    // key change elsewhere in this test process may cost a read again:
    // then the round is measured again).
    const ROUNDS: u64 = 20;
    let limiter_before = counting.apart_calls();
    for (path, budget, status) in [
        (read.as_str(), 1, 200),
        ("/v1/payments/pay_notavalidid", 0, 404),
        ("/v1/payments?limit=10", 2, 200),
    ] {
        let mut measured = false;
        for _ in 0..5 {
            // A request first: the key is remembered if nothing changed
            // since the epoch was read (checked after the round).
            let epoch = shared::domain::account::cache::epoch();
            assert_eq!(app.get(path, Some(&key)).await.status, status, "{path}");
            let before = counting.other_calls();
            for _ in 0..ROUNDS {
                assert_eq!(app.get(path, Some(&key)).await.status, status, "{path}");
            }
            let spent = counting.other_calls() - before;
            if shared::domain::account::cache::epoch() != epoch {
                continue;
            }
            assert_eq!(
                spent,
                budget * ROUNDS,
                "{path}: {spent} calls for {ROUNDS} requests"
            );
            measured = true;
            break;
        }
        assert!(measured, "{path}: keys kept changing");
    }

    // Creating a checkout with an Idempotency-Key: the key's claim, one
    // transaction (the session, its counters, the fence and, for a
    // provider that needs the project's credentials, their check), and the
    // answer kept. Refused for want of credentials: the same three, the
    // claim given back instead of kept.
    let writer = app.key(&t, Mode::Sandbox, &[Scope::PaymentsWrite]).await;
    let body = |provider: &str| {
        serde_json::json!({
            "amount": 10_000, "provider": provider,
            "returnUrl": "https://shop.example/ok", "cancelUrl": "https://shop.example/no",
        })
    };
    let first = app
        .post(
            "/v1/checkout",
            Some(&writer),
            Some("warm-up"),
            &body("khalti"),
        )
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    for (provider, status) in [("khalti", 201), ("fonepay", 422)] {
        let mut measured = false;
        for attempt in 0..5 {
            let epoch = shared::domain::account::cache::epoch();
            let warm = app
                .post(
                    "/v1/checkout",
                    Some(&writer),
                    Some(&format!("w-{provider}-{attempt}")),
                    &body(provider),
                )
                .await;
            assert_eq!(warm.status, status, "{provider}: {}", warm.body);
            let before = counting.other_calls();
            for i in 0..ROUNDS {
                let idem = format!("{provider}-{attempt}-{i}");
                let a = app
                    .post("/v1/checkout", Some(&writer), Some(&idem), &body(provider))
                    .await;
                assert_eq!(a.status, status, "{provider}: {}", a.body);
            }
            let spent = counting.other_calls() - before;
            if shared::domain::account::cache::epoch() != epoch {
                continue;
            }
            assert_eq!(
                spent,
                3 * ROUNDS,
                "{provider}: {spent} calls for {ROUNDS} checkouts"
            );
            measured = true;
            break;
        }
        assert!(measured, "checkout: keys kept changing");
    }

    // The limiter's writes depend on timing (a block is what the
    // instance serves in a second; `limits::rate`'s simulation pins them):
    // shown, and none on the embedded store.
    let limiter = counting.apart_calls() - limiter_before;
    use shared::store::Store;
    if counting.single_process() {
        assert_eq!(limiter, 0, "counted in memory");
    }
    println!(
        "{which:?}: {limiter} limiter writes for about {} requests",
        5 * ROUNDS + 11
    );
    app.stop().await;
}

async fn a_store_fault_answers_503_with_the_request_id_and_a_retry_succeeds(which: Which) {
    use shared::store::faults::{Fault, FaultyStore, Op};
    use std::sync::Arc;

    let mut faulty: Option<Arc<FaultyStore>> = None;
    let app = spawn_app_wrapped(which, |inner| {
        let f = Arc::new(FaultyStore::new(inner));
        faulty = Some(f.clone());
        f
    })
    .await;
    let (Some(app), Some(faulty)) = (app, faulty) else {
        return;
    };
    let t = app.tenant("Flaky Shop", "f@flaky.example").await;
    let key = app.key(&t, Mode::Live, &[Scope::PaymentsRead]).await;
    let p = app.payment(&t, Mode::Live, 100, Provider::Khalti).await;
    let path = format!("/v1/payments/{}", p.id);

    // The third read of the request (the payment) is throttled.
    faulty.plan(Op::Get, 2, Fault::throttled());
    let a = app.get(&path, Some(&key)).await;
    a.assert_error(503, "api_error", "api_error");
    assert_eq!(a.header("retry-after"), "1");
    assert!(
        !a.body.to_string().contains("Throughput"),
        "no internals leak: {}",
        a.body
    );
    assert_eq!(faulty.injected(), 1);
    assert_eq!(app.get(&path, Some(&key)).await.status, 200);

    // A backend failure that is not transient is a 500, same envelope.
    faulty.plan(
        Op::Get,
        0,
        Fault::Before(shared::store::StoreError::Backend("disk on fire".into())),
    );
    let a = app.get(&path, Some(&key)).await;
    a.assert_error(500, "api_error", "api_error");
    assert!(!a.body.to_string().contains("disk"));
    app.stop().await;
}

async fn the_provider_simulators_answer_in_their_own_shapes(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let index = app.client.get(app.url("/sim")).send().await;
    assert_eq!(index.map(|r| r.status().as_u16()).ok(), Some(200));
    // eSewa's status API for an unknown transaction: eSewa's answer, not our envelope.
    let a = app
        .get("/sim/esewa/api/epay/transaction/status/?product_code=EPAYTEST&total_amount=100&transaction_uuid=nope", None)
        .await;
    assert!(
        a.body.get("error").is_none(),
        "the edge must not wrap simulator answers: {}",
        a.body
    );
    // Khalti without its key: Khalti's 401 shape.
    let a = send(
        app.client
            .post(app.url("/sim/khalti/api/v2/epayment/lookup/"))
            .json(&serde_json::json!({"pidx": "x"})),
    )
    .await;
    assert_eq!(a.status, 401);
    assert!(
        a.body.get("error").is_none() || !a.body["error"].is_object(),
        "{}",
        a.body
    );
    app.stop().await;
}

on_both_backends!(
    the_provider_simulators_answer_in_their_own_shapes,
    a_store_fault_answers_503_with_the_request_id_and_a_retry_succeeds,
    health_answers_without_a_key,
    first_start_writes_demo_keys_that_work,
    a_restart_keeps_data_and_keys,
    account_shows_the_key_context_and_masks_email_without_pii_read,
    missing_malformed_and_unknown_keys_get_401,
    scopes_are_checked_per_route,
    suspended_merchants_get_403_with_the_suspension,
    paused_keys_get_423_with_the_pause,
    payment_retrieve_has_every_field_of_the_spec,
    other_projects_and_other_modes_are_invisible,
    payments_list_is_newest_first_and_paginates,
    unknown_routes_and_methods_get_the_envelope,
    no_key_is_a_401_before_a_bad_idempotency_key,
    concurrent_reads_all_succeed_with_distinct_request_ids,
    store_calls_per_request_stay_within_budget,
);
