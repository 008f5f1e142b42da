//! Checkout sessions end to end over HTTP, on both backends: create, read,
//! list, expire (by call and by time), validation, scopes, isolation, the
//! spend cap under concurrency, idempotency, and the provider list.

use std::sync::Arc;

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app, spawn_app_with_clock};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::checkout::CheckoutSession;
use shared::domain::credentials::{
    CredentialsKey, CredentialsKeys, ProviderCredentials, put_credentials,
};
use shared::store::Store;
use shared::store::faults::{Fault, FaultyStore, Op};
use shared::time::{Clock, ManualClock, SystemClock};

fn body(amount: i64) -> Value {
    json!({"amount": amount, "returnUrl": "https://shop.example/thanks"})
}

async fn create(app: &TestApp, key: &str, body: &Value) -> Answer {
    app.post("/v1/checkout", Some(key), None, body).await
}

async fn created_id(app: &TestApp, key: &str, body: &Value) -> String {
    let a = create(app, key, body).await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["id"].as_str().unwrap_or_default().to_owned()
}

async fn total_sessions(app: &TestApp, key: &str) -> u64 {
    let a = app.get("/v1/sessions", Some(key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX)
}

async fn create_answers_201_with_the_checkout_shape(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "owner@himal.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let a = create(&app, &key, &body(25_000)).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let b = &a.body;
    let id = b["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("cs_") && id.len() == 29, "{id}");
    assert_eq!(b["livemode"], false);
    assert_eq!(b["flow"], "hosted");
    assert_eq!(b["provider"], Value::Null);
    assert_eq!(b["checkout_url"], format!("{}/c/{id}", app.base).as_str());
    let expires = b["expires_at"].as_str().unwrap_or_default();
    let expires = shared::time::Timestamp::parse(expires);
    let now = SystemClock.now();
    let in_minutes = expires.map(|e| (e.unix_seconds() - now.unix_seconds()) / 60);
    assert!(matches!(in_minutes, Some(29 | 30)), "{in_minutes:?}");
    let keys: Vec<&String> = b
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert_eq!(keys.len(), 6, "exactly the six fields: {b}");

    // A redirect to a named provider.
    let mut redirect = body(1500);
    redirect["flow"] = json!("redirect");
    redirect["provider"] = json!("khalti");
    let a = create(&app, &key, &redirect).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["flow"], "redirect");
    assert_eq!(a.body["provider"], "khalti");
    app.stop().await;
}

async fn a_session_reads_back_with_every_field(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Pokhara Crafts", "maya@pokhara.example").await;
    let key = app.key(&t, Mode::Live, &Scope::ALL).await;
    let full = json!({
        "amount": 4200, "currency": "NPR", "provider": "esewa", "flow": "redirect",
        "returnUrl": "https://crafts.example/ok", "cancelUrl": "https://crafts.example/cart",
        "description": "Two singing bowls", "metadata": {"order": "A-17", "qty": 2},
        "customer": {"name": "Sita Sharma", "email": "sita@example.com", "phone": "9841000001",
                     "address": {"line1": "Lakeside", "city": "Pokhara", "country": "NP"}},
        "collectAddress": true
    });
    // Live needs credentials for a named provider.
    let a = create(&app, &key, &full).await;
    a.assert_error(422, "invalid_request_error", "provider_unavailable");
    assert_eq!(a.body["error"]["param"], "provider");
    let keys = match CredentialsKey::generate("k1") {
        Ok(k) => CredentialsKeys::single(k),
        Err(e) => panic!("{e}"),
    };
    let creds = ProviderCredentials::Esewa {
        product_code: "EPAYTEST".into(),
        secret_key: "8gBm/:&EnhH.1/q".into(),
    };
    let put = put_credentials(
        &*app.store,
        &keys,
        SystemClock.now(),
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Live),
        &creds,
    )
    .await;
    assert!(put.is_ok(), "{put:?}");
    let id = created_id(&app, &key, &full).await;

    let a = app.get(&format!("/v1/sessions/{id}"), Some(&key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let s = &a.body;
    assert_eq!(s["id"], id.as_str());
    assert_eq!(s["livemode"], true);
    assert_eq!(s["mode"], "live");
    assert_eq!(s["flow"], "redirect");
    assert_eq!(s["amount"], 4200);
    assert_eq!(s["currency"], "NPR");
    assert_eq!(s["provider"], "esewa");
    assert_eq!(s["status"], "pending");
    assert_eq!(s["paymentId"], Value::Null);
    assert_eq!(s["description"], "Two singing bowls");
    assert_eq!(s["metadata"], json!({"order": "A-17", "qty": 2}));
    assert_eq!(s["customerName"], "Sita Sharma");
    assert_eq!(s["customerEmail"], "sita@example.com");
    assert_eq!(s["customerPhone"], "9841000001");
    assert_eq!(s["collectAddress"], true);
    assert_eq!(s["customerAddress"]["city"], "Pokhara");
    assert_eq!(s["customerAddress"]["postalCode"], Value::Null);
    for f in ["expiresAt", "createdAt", "updatedAt"] {
        assert!(s[f].is_string(), "{f}: {s}");
    }
    assert!(s.get("returnUrl").is_none(), "stored, not shown: {s}");
    app.stop().await;
}

async fn sessions_list_filters_by_status_and_paginates(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Bhaktapur Pottery", "p@bkt.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let mut ids = Vec::new();
    for amount in [100, 200, 300, 400, 500] {
        ids.push(created_id(&app, &key, &body(amount)).await);
    }
    for id in &ids[..2] {
        let a = app
            .post(
                &format!("/v1/checkout/{id}/expire"),
                Some(&key),
                None,
                &json!({}),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let a = app.get("/v1/sessions", Some(&key)).await;
    assert_eq!(
        a.body["meta"],
        json!({"total": 5, "limit": 25, "offset": 0})
    );
    assert_eq!(a.body["data"][0]["id"], ids[4].as_str(), "newest first");

    let a = app.get("/v1/sessions?limit=2&offset=1", Some(&key)).await;
    assert_eq!(a.body["meta"], json!({"total": 5, "limit": 2, "offset": 1}));
    let got: Vec<&str> = a.body["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|s| s["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(got, vec![ids[3].as_str(), ids[2].as_str()]);

    let a = app.get("/v1/sessions?status=expired", Some(&key)).await;
    assert_eq!(a.body["meta"]["total"], 2, "{}", a.body);
    assert!(
        a.body["data"]
            .as_array()
            .is_some_and(|d| d.iter().all(|s| s["status"] == "expired"))
    );
    let a = app
        .get("/v1/sessions?status=pending&limit=1", Some(&key))
        .await;
    assert_eq!(a.body["meta"]["total"], 3);
    assert_eq!(a.body["data"][0]["id"], ids[4].as_str());
    let a = app.get("/v1/sessions?status=success", Some(&key)).await;
    assert_eq!(a.body["meta"]["total"], 0);
    // Unrecognised status values are ignored (spec).
    let a = app.get("/v1/sessions?status=paid", Some(&key)).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["meta"]["total"], 5);
    app.get("/v1/sessions?limit=0", Some(&key))
        .await
        .assert_error(400, "invalid_request_error", "validation_failed");
    app.stop().await;
}

async fn expire_moves_open_sessions_and_leaves_final_ones(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Lalitpur Metal", "m@lalitpur.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let id = created_id(&app, &key, &body(999)).await;
    let path = format!("/v1/checkout/{id}/expire");
    let a = app.post(&path, Some(&key), None, &json!({})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["id"], id.as_str());
    assert_eq!(a.body["status"], "expired");
    assert_eq!(a.body["flow"], "hosted");
    assert_eq!(a.body["provider"], Value::Null);
    assert!(a.body["expires_at"].is_string());
    let updated = app.get(&format!("/v1/sessions/{id}"), Some(&key)).await;
    assert_eq!(updated.body["status"], "expired");
    // Again: nothing changes, the current state is answered.
    let again = app.post(&path, Some(&key), None, &json!({})).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, a.body);
    let after = app.get(&format!("/v1/sessions/{id}"), Some(&key)).await;
    assert_eq!(after.body["updatedAt"], updated.body["updatedAt"]);

    // A paid session is final: expire answers it unchanged.
    let paid = created_id(&app, &key, &body(999)).await;
    let k = CheckoutSession::key(&paid.as_str().into());
    let set = shared::store::Update::new().set("status", "success");
    assert!(app.store.update(&k, set, None).await.is_ok());
    let a = app
        .post(
            &format!("/v1/checkout/{paid}/expire"),
            Some(&key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["status"], "success");

    app.post(
        "/v1/checkout/cs_01j00000000000000000000000/expire",
        Some(&key),
        None,
        &json!({}),
    )
    .await
    .assert_error(404, "invalid_request_error", "not_found");
    app.stop().await;
}

async fn sessions_expire_lazily_after_thirty_minutes(which: Which) {
    let clock = ManualClock::new(SystemClock.now());
    let Some(app) = spawn_app_with_clock(which, |s| s, Arc::new(clock.clone())).await else {
        return;
    };
    let t = app.tenant("Janakpur Sweets", "j@janakpur.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let id = created_id(&app, &key, &body(700)).await;
    let path = format!("/v1/sessions/{id}");
    clock.advance(chrono::Duration::minutes(29));
    assert_eq!(app.get(&path, Some(&key)).await.body["status"], "pending");
    let a = app.get("/v1/sessions?status=pending", Some(&key)).await;
    assert_eq!(a.body["meta"]["total"], 1);

    clock.advance(chrono::Duration::minutes(1));
    // The list shows it expired before any read persisted it.
    let a = app.get("/v1/sessions?status=expired", Some(&key)).await;
    assert_eq!(a.body["meta"]["total"], 1, "{}", a.body);
    assert_eq!(a.body["data"][0]["status"], "expired");
    let a = app.get("/v1/sessions?status=pending", Some(&key)).await;
    assert_eq!(a.body["meta"]["total"], 0);

    let a = app.get(&path, Some(&key)).await;
    assert_eq!(a.body["status"], "expired", "{}", a.body);
    // ...and the read persisted it.
    let stored = app
        .store
        .get(&CheckoutSession::key(&id.as_str().into()))
        .await;
    let status = stored.ok().flatten().and_then(|i| i.get("status").cloned());
    assert_eq!(status, Some(json!("expired")));
    let a = app
        .post(
            &format!("/v1/checkout/{id}/expire"),
            Some(&key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(a.body["status"], "expired");
    app.stop().await;
}

async fn every_validation_error_names_its_field(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Validation Shop", "v@shop.example").await;
    let sandbox = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let live = app.key(&t, Mode::Live, &Scope::ALL).await;
    let with = |k: &str, v: Value| {
        let mut b = body(5000);
        b[k] = v;
        b
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "sandbox",
            json!({"returnUrl": "https://x.example"}),
            "amount",
        ),
        ("sandbox", json!({"amount": 100}), "returnUrl"),
        ("sandbox", with("amount", json!(0)), "amount"),
        ("sandbox", with("amount", json!(-5)), "amount"),
        ("sandbox", with("amount", json!("100")), "amount"),
        ("sandbox", with("amount", json!(100_000_001)), "amount"),
        ("sandbox", with("currency", json!("USD")), "currency"),
        ("sandbox", with("provider", json!("paypal")), "provider"),
        ("sandbox", with("flow", json!("popup")), "flow"),
        ("sandbox", with("flow", json!("qr")), "flow"),
        ("sandbox", with("flow", json!("mobile")), "flow"),
        ("sandbox", with("flow", json!("redirect")), "provider"),
        ("sandbox", with("returnUrl", json!("/thanks")), "returnUrl"),
        (
            "sandbox",
            with("returnUrl", json!("http://shop.example")),
            "returnUrl",
        ),
        (
            "live",
            with("returnUrl", json!("http://127.0.0.1/ok")),
            "returnUrl",
        ),
        (
            "sandbox",
            with("cancelUrl", json!("ftp://x.example")),
            "cancelUrl",
        ),
        (
            "sandbox",
            with("metadata", json!({"a": {"b": 1}})),
            "metadata.a",
        ),
        ("sandbox", with("metadata", json!("x")), "metadata"),
        (
            "sandbox",
            with("description", json!("d".repeat(501))),
            "description",
        ),
        (
            "sandbox",
            with("customer", json!({"email": "nope"})),
            "customer.email",
        ),
        (
            "sandbox",
            with("customer", json!({"age": 3})),
            "customer.age",
        ),
        (
            "sandbox",
            with("customer", json!({"address": {"zip": "1"}})),
            "customer.address.zip",
        ),
        (
            "sandbox",
            with("collectAddress", json!("yes")),
            "collectAddress",
        ),
        ("sandbox", with("tip", json!(5)), "tip"),
    ];
    let mut many = serde_json::Map::new();
    for i in 0..51 {
        many.insert(format!("k{i}"), json!(i));
    }
    let mut cases = cases;
    cases.push(("sandbox", with("metadata", Value::Object(many)), "metadata"));
    let mut khalti = with("provider", json!("khalti"));
    khalti["amount"] = json!(999);
    cases.push(("sandbox", khalti, "amount"));
    for (mode, b, field) in cases {
        let key = if mode == "live" { &live } else { &sandbox };
        let a = create(&app, key, &b).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], field, "{b} -> {}", a.body);
    }
    // Local http is fine in sandbox.
    let a = create(
        &app,
        &sandbox,
        &with("returnUrl", json!("http://127.0.0.1:3000/ok")),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    // Sandbox fonepay over NPR 1,000 is a business rule: 422.
    let mut fonepay = with("provider", json!("fonepay"));
    fonepay["amount"] = json!(100_001);
    let a = create(&app, &sandbox, &fonepay).await;
    a.assert_error(422, "invalid_request_error", "fonepay_sandbox_cap");
    // Fonepay has no sandbox: without real credentials it is not enabled.
    fonepay["amount"] = json!(100_000);
    create(&app, &sandbox, &fonepay).await.assert_error(
        422,
        "invalid_request_error",
        "provider_unavailable",
    );
    // Malformed JSON.
    let a = app
        .post(
            "/v1/checkout",
            Some(&sandbox),
            None,
            &json!("not an object"),
        )
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(total_sessions(&app, &sandbox).await, 1, "only the good one");
    app.stop().await;
}

async fn other_projects_and_modes_get_404(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app.tenant("Shop A", "a@a.example").await;
    let b = app.tenant("Shop B", "b@b.example").await;
    let a_sandbox = app.key(&a, Mode::Sandbox, &Scope::ALL).await;
    let a_live = app.key(&a, Mode::Live, &Scope::ALL).await;
    let b_sandbox = app.key(&b, Mode::Sandbox, &Scope::ALL).await;
    let id = created_id(&app, &a_sandbox, &body(1000)).await;
    for key in [&a_live, &b_sandbox] {
        app.get(&format!("/v1/sessions/{id}"), Some(key))
            .await
            .assert_error(404, "invalid_request_error", "not_found");
        app.post(
            &format!("/v1/checkout/{id}/expire"),
            Some(key),
            None,
            &json!({}),
        )
        .await
        .assert_error(404, "invalid_request_error", "not_found");
        assert_eq!(total_sessions(&app, key).await, 0);
    }
    // Untouched by the refused expire.
    let s = app
        .get(&format!("/v1/sessions/{id}"), Some(&a_sandbox))
        .await;
    assert_eq!(s.body["status"], "pending");
    app.get(
        "/v1/sessions/pay_01j00000000000000000000000",
        Some(&a_sandbox),
    )
    .await
    .assert_error(404, "invalid_request_error", "not_found");
    app.stop().await;
}

async fn scopes_are_checked_per_checkout_route(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Scoped", "s@scoped.example").await;
    let all = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let read_only = app
        .key(
            &t,
            Mode::Sandbox,
            &[Scope::PaymentsRead, Scope::AccountRead],
        )
        .await;
    let writer = app.key(&t, Mode::Sandbox, &[Scope::PaymentsWrite]).await;
    let id = created_id(&app, &all, &body(1000)).await;

    let a = create(&app, &read_only, &body(1000)).await;
    a.assert_error(403, "permission_error", "missing_scope");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("payments:write"))
    );
    app.post(
        &format!("/v1/checkout/{id}/expire"),
        Some(&read_only),
        None,
        &json!({}),
    )
    .await
    .assert_error(403, "permission_error", "missing_scope");
    for path in ["/v1/sessions".to_owned(), format!("/v1/sessions/{id}")] {
        let a = app.get(&path, Some(&writer)).await;
        a.assert_error(403, "permission_error", "missing_scope");
        assert!(
            a.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("sessions:read"))
        );
    }
    app.get("/v1/providers", Some(&writer)).await.assert_error(
        403,
        "permission_error",
        "missing_scope",
    );
    assert_eq!(app.get("/v1/providers", Some(&read_only)).await.status, 200);
    assert_eq!(create(&app, &writer, &body(1000)).await.status, 201);
    app.post("/v1/checkout", None, None, &body(1000))
        .await
        .assert_error(401, "authentication_error", "api_key_invalid");
    app.stop().await;
}

async fn the_spend_cap_holds_under_concurrency(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let app = Arc::new(app);
    let t = app.tenant("Capped", "c@capped.example").await;
    let key = app
        .key_with_cap(&t, Mode::Sandbox, &Scope::ALL, Some(1000))
        .await;
    let calls = (0..30).map(|_| {
        let app = app.clone();
        let key = key.clone();
        tokio::spawn(async move { create(&app, &key, &body(100)).await })
    });
    let answers: Vec<Answer> = futures::future::join_all(calls)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(answers.len(), 30);
    let ok = answers.iter().filter(|a| a.status == 201).count();
    assert_eq!(ok, 10, "exactly the cap's worth succeeds");
    for a in answers.iter().filter(|a| a.status != 201) {
        a.assert_error(403, "permission_error", "spend_cap_exceeded");
    }
    assert_eq!(total_sessions(&app, &key).await, 10);
    // Over the cap on its own.
    let other = app
        .key_with_cap(&t, Mode::Sandbox, &Scope::ALL, Some(500))
        .await;
    create(&app, &other, &body(501)).await.assert_error(
        403,
        "permission_error",
        "spend_cap_exceeded",
    );
    assert_eq!(create(&app, &other, &body(500)).await.status, 201);
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
}

async fn concurrent_posts_with_one_idempotency_key_create_one_session(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let app = Arc::new(app);
    let t = app.tenant("Idem", "i@idem.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let calls = (0..20).map(|_| {
        let app = app.clone();
        let key = key.clone();
        tokio::spawn(async move {
            app.post("/v1/checkout", Some(&key), Some("order-1001"), &body(2500))
                .await
        })
    });
    let answers: Vec<Answer> = futures::future::join_all(calls)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(answers.len(), 20);
    let created: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
    assert!(!created.is_empty());
    let fresh = created
        .iter()
        .filter(|a| a.header("idempotent-replayed") != "true")
        .count();
    assert_eq!(fresh, 1, "exactly one request ran the create");
    let first_id = &created[0].body["id"];
    for a in &answers {
        if a.status == 201 {
            assert_eq!(&a.body["id"], first_id, "replays answer the same session");
        } else {
            a.assert_error(409, "idempotency_error", "idempotency_conflict");
        }
    }
    assert_eq!(total_sessions(&app, &key).await, 1);

    // A retry afterwards replays; the same key for another body is refused.
    let again = app
        .post("/v1/checkout", Some(&key), Some("order-1001"), &body(2500))
        .await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(&again.body["id"], first_id);
    app.post("/v1/checkout", Some(&key), Some("order-1001"), &body(2600))
        .await
        .assert_error(409, "idempotency_error", "idempotency_key_reused");
    assert_eq!(total_sessions(&app, &key).await, 1);
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
}

async fn a_retry_after_a_lost_answer_returns_the_same_session(which: Which) {
    let mut faulty: Option<Arc<FaultyStore>> = None;
    let app = dhukuti_tests::spawn_app_wrapped(which, |inner| {
        let f = Arc::new(FaultyStore::new(inner));
        faulty = Some(f.clone());
        f as Arc<dyn Store>
    })
    .await;
    let (Some(app), Some(faulty)) = (app, faulty) else {
        return;
    };
    let t = app.tenant("Lossy", "l@lossy.example").await;
    let key = app
        .key_with_cap(&t, Mode::Sandbox, &Scope::ALL, Some(10_000))
        .await;
    // The create's transaction commits, then its answer is lost.
    faulty.plan(Op::Transact, 0, Fault::timeout_after_write());
    let lost = app
        .post("/v1/checkout", Some(&key), Some("retry-me"), &body(4000))
        .await;
    lost.assert_error(503, "api_error", "api_error");
    assert_eq!(faulty.injected(), 1);
    assert_eq!(total_sessions(&app, &key).await, 1, "the write did commit");

    // Another body under that key (a client bug, or a merchant who changed
    // the order): refused, never answered the first request's session,
    // never a second session.
    let other = app
        .post("/v1/checkout", Some(&key), Some("retry-me"), &body(4100))
        .await;
    other.assert_error(409, "idempotency_error", "idempotency_key_reused");
    assert_eq!(total_sessions(&app, &key).await, 1);

    let retry = app
        .post("/v1/checkout", Some(&key), Some("retry-me"), &body(4000))
        .await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    let listed = app.get("/v1/sessions", Some(&key)).await;
    assert_eq!(listed.body["meta"]["total"], 1, "no second session");
    assert_eq!(retry.body["id"], listed.body["data"][0]["id"]);
    // The spend counter was charged once: 6000 more still fit under 10000.
    assert_eq!(create(&app, &key, &body(6000)).await.status, 201);
    app.stop().await;
}

/// Checkout ids are the bearer of the hosted page: one never tells the
/// next. Ids minted in one millisecond (40 creates at once) share their
/// time part, never a near-equal random part (a monotonic ULID's next id
/// in the same millisecond is the last one plus 1).
async fn checkout_ids_do_not_predict_each_other(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let app = Arc::new(app);
    let t = app.tenant("Ids", "i@ids.example").await;
    let key = app.key(&t, Mode::Live, &Scope::ALL).await;
    let calls = (0..40).map(|_| {
        let (app, key) = (app.clone(), key.clone());
        tokio::spawn(async move { created_id(&app, &key, &body(2500)).await })
    });
    let mut ids: Vec<ulid::Ulid> = futures::future::join_all(calls)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .map(|id| {
            let ulid = id
                .strip_prefix("cs_")
                .unwrap_or_default()
                .to_ascii_uppercase();
            ulid::Ulid::from_string(&ulid).unwrap_or_default()
        })
        .collect();
    assert_eq!(ids.len(), 40);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40, "ids never repeat");
    for pair in ids.windows(2) {
        assert!(
            pair[0].random().abs_diff(pair[1].random()) >= 1 << 40,
            "{} and {} have near random parts: a counter, not randomness",
            pair[0],
            pair[1]
        );
    }
    if let Ok(app) = Arc::try_unwrap(app) {
        app.stop().await;
    }
}

async fn live_providers(app: &TestApp, key: &str) -> Value {
    app.get("/v1/providers", Some(key)).await.body["providers"].clone()
}

async fn providers_show_what_the_project_can_use(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Providers", "p@providers.example").await;
    let sandbox = app.key(&t, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let live = app.key(&t, Mode::Live, &[Scope::PaymentsRead]).await;
    let by_name = |a: &Answer, name: &str| -> Value {
        a.body["data"]
            .as_array()
            .and_then(|d| d.iter().find(|p| p["provider"] == name).cloned())
            .unwrap_or(Value::Null)
    };
    let a = app.get("/v1/providers", Some(&sandbox)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["data"].as_array().map(Vec::len), Some(3));
    assert_eq!(a.body["providers"], json!(["esewa", "khalti"]));
    assert_eq!(
        by_name(&a, "esewa"),
        json!({"provider": "esewa", "enabled": true, "sandbox": true, "minAmount": 1, "maxAmount": 100_000_000})
    );
    assert_eq!(by_name(&a, "khalti")["minAmount"], 1000);
    assert_eq!(by_name(&a, "khalti")["enabled"], true);
    assert_eq!(
        by_name(&a, "fonepay"),
        json!({"provider": "fonepay", "enabled": false, "sandbox": false, "minAmount": 1, "maxAmount": 100_000})
    );
    let a = app.get("/v1/providers", Some(&live)).await;
    for p in ["esewa", "khalti", "fonepay"] {
        assert_eq!(by_name(&a, p)["enabled"], false, "{p}");
        assert_eq!(by_name(&a, p)["sandbox"], false, "{p}");
    }

    let keys = match CredentialsKey::generate("k1") {
        Ok(k) => CredentialsKeys::single(k),
        Err(e) => panic!("{e}"),
    };
    let creds = ProviderCredentials::Fonepay {
        merchant_code: "NBQM".into(),
        secret_key: "a7e3512f5032480a83137793cb2021dc".into(),
        username: "9861101076".into(),
        password: "admin123".into(),
    };
    let now = SystemClock.now();
    let put = put_credentials(
        &*app.store,
        &keys,
        now,
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
        &creds,
    )
    .await;
    assert!(put.is_ok(), "{put:?}");
    let a = app.get("/v1/providers", Some(&sandbox)).await;
    assert_eq!(by_name(&a, "fonepay")["enabled"], true);
    assert_eq!(a.body["providers"], json!(["esewa", "khalti", "fonepay"]));
    assert_eq!(live_providers(&app, &live).await, json!([]));
    assert_eq!(by_name(&a, "fonepay")["sandbox"], false, "real money");
    let live_after = app.get("/v1/providers", Some(&live)).await;
    assert_eq!(
        by_name(&live_after, "fonepay")["enabled"],
        false,
        "per mode"
    );
    app.stop().await;
}

/// The store as the gateway uses it, counting what it reads from the
/// partitions naming one project (its sessions, its counters, its open
/// sessions): query and count calls, and the items queries hand back.
struct ProjectReads {
    inner: Arc<dyn Store>,
    project: std::sync::Mutex<String>,
    calls: std::sync::atomic::AtomicU64,
    items: std::sync::atomic::AtomicU64,
}

impl ProjectReads {
    fn watched(&self, pk: &str) -> bool {
        let p = self.project.lock().map(|p| p.clone()).unwrap_or_default();
        !p.is_empty() && pk.contains(&p)
    }

    fn seen(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.calls.load(SeqCst), self.items.load(SeqCst))
    }
}

#[async_trait::async_trait]
impl Store for ProjectReads {
    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    fn single_process(&self) -> bool {
        self.inner.single_process()
    }

    async fn get(
        &self,
        key: &shared::store::Key,
    ) -> Result<Option<shared::store::Item>, shared::store::StoreError> {
        self.inner.get(key).await
    }

    async fn put(
        &self,
        item: shared::store::Item,
        cond: Option<shared::store::Cond>,
    ) -> Result<(), shared::store::StoreError> {
        self.inner.put(item, cond).await
    }

    async fn update(
        &self,
        key: &shared::store::Key,
        update: shared::store::Update,
        cond: Option<shared::store::Cond>,
    ) -> Result<shared::store::Item, shared::store::StoreError> {
        self.inner.update(key, update, cond).await
    }

    async fn delete(
        &self,
        key: &shared::store::Key,
        cond: Option<shared::store::Cond>,
    ) -> Result<(), shared::store::StoreError> {
        self.inner.delete(key, cond).await
    }

    async fn transact(
        &self,
        ops: Vec<shared::store::TxOp>,
    ) -> Result<(), shared::store::StoreError> {
        self.inner.transact(ops).await
    }

    async fn query(
        &self,
        query: &shared::store::Query,
    ) -> Result<shared::store::QueryPage, shared::store::StoreError> {
        let page = self.inner.query(query).await?;
        if self.watched(&query.pk) {
            use std::sync::atomic::Ordering::SeqCst;
            self.calls.fetch_add(1, SeqCst);
            self.items.fetch_add(page.items.len() as u64, SeqCst);
        }
        Ok(page)
    }

    async fn count(&self, query: &shared::store::Query) -> Result<u64, shared::store::StoreError> {
        if self.watched(&query.pk) {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.count(query).await
    }
}

/// `meta.total` of `GET /v1/sessions` costs the same reads with 4
/// sessions as with 40 (per-status counters, changed with each status),
/// and stays right through payment, expiry by time and by the sweep.
async fn the_sessions_total_costs_the_same_whatever_their_number(which: Which) {
    let clock = ManualClock::new(SystemClock.now());
    let reads: Arc<std::sync::OnceLock<Arc<ProjectReads>>> = Arc::default();
    let slot = reads.clone();
    let wrap = move |inner: Arc<dyn Store>| -> Arc<dyn Store> {
        let r = Arc::new(ProjectReads {
            inner,
            project: Default::default(),
            calls: Default::default(),
            items: Default::default(),
        });
        let _ = slot.set(r.clone());
        r
    };
    let Some(app) = spawn_app_with_clock(which, wrap, Arc::new(clock.clone())).await else {
        return;
    };
    let Some(reads) = reads.get().cloned() else {
        panic!("the store was not wrapped")
    };
    let t = app.tenant("Pokhara Crafts", "p@pokhara.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    if let Ok(mut p) = reads.project.lock() {
        *p = t.project.id.to_string();
    }
    let mut costs = Vec::new();
    let mut made = 0;
    for n in [4u64, 40] {
        while made < n {
            created_id(&app, &key, &body(1500)).await;
            made += 1;
        }
        let before = reads.seen();
        let a = app.get("/v1/sessions?limit=2", Some(&key)).await;
        let after = reads.seen();
        assert_eq!(a.body["meta"]["total"], n, "{}", a.body);
        costs.push((after.0 - before.0, after.1 - before.1));
    }
    // The same calls; items: at most the counters (one per shard and the
    // marker) and the page, however many sessions there are (a scan read
    // all 40).
    assert_eq!(costs[0].0, costs[1].0, "calls with 4 and with 40 sessions");
    let bound = u64::from(shared::domain::checkout::stats::SHARDS) + 1 + 2;
    assert!(
        costs.iter().all(|c| c.1 <= bound),
        "items read {costs:?}, at most {bound}"
    );
    let total = |status: &'static str| {
        let (app, key) = (&app, &key);
        async move {
            let a = app
                .get(&format!("/v1/sessions?status={status}"), Some(key))
                .await;
            assert_eq!(a.status, 200, "{}", a.body);
            a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX)
        }
    };
    assert_eq!(total("pending").await, 40);
    // Past their time: expired before any sweep, then after it.
    clock.advance(chrono::Duration::minutes(31));
    assert_eq!((total("pending").await, total("expired").await), (0, 40));
    let report = app.sweep(clock.now()).await;
    assert_eq!(report.sessions_expired, 40, "{report:?}");
    assert_eq!((total("pending").await, total("expired").await), (0, 40));
    created_id(&app, &key, &body(1500)).await;
    assert_eq!((total("pending").await, total("expired").await), (1, 40));
    let a = app.get("/v1/sessions", Some(&key)).await;
    assert_eq!(a.body["meta"]["total"], 41);
    app.stop().await;
}

on_both_backends!(
    the_sessions_total_costs_the_same_whatever_their_number,
    create_answers_201_with_the_checkout_shape,
    a_session_reads_back_with_every_field,
    sessions_list_filters_by_status_and_paginates,
    expire_moves_open_sessions_and_leaves_final_ones,
    sessions_expire_lazily_after_thirty_minutes,
    every_validation_error_names_its_field,
    other_projects_and_modes_get_404,
    scopes_are_checked_per_checkout_route,
    the_spend_cap_holds_under_concurrency,
    concurrent_posts_with_one_idempotency_key_create_one_session,
    a_retry_after_a_lost_answer_returns_the_same_session,
    providers_show_what_the_project_can_use,
    checkout_ids_do_not_predict_each_other,
);
