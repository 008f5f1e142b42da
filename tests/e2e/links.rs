//! Payment links over HTTP, on both backends: create (fixed and open
//! amounts, validation), list with the `active` filter, retrieve with
//! stats, PATCH (only the keys sent; the spec's limits; `maxUses` never
//! below the use count), cancel (422 when inactive), delete (422 once
//! used), scopes and isolation, and idempotent creates.

use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::links::PaymentLink;
use shared::store::Update;

async fn create(app: &TestApp, key: &str, body: Value) -> Answer {
    app.post("/v1/payment-links", Some(key), None, &body).await
}

async fn created(app: &TestApp, key: &str, body: Value) -> Value {
    let a = create(app, key, body).await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body
}

async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> Answer {
    let mut req = app.client.request(method, app.url(path)).bearer_auth(key);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    dhukuti_tests::send(req).await
}

async fn links_are_created_with_the_spec_shape(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let b = created(
        &app,
        &key,
        json!({
            "title": "Everest tee", "description": "Cotton, size M", "amount": 120000,
            "maxUses": 50, "redirectUrl": "https://tees.example/thanks",
            "inactiveMessage": "Sold out!", "customerName": "Sita",
            "collectAddress": true, "customerCity": "Pokhara", "referenceId": "SKU-9",
            "metadata": {"campaign": "dashain"}
        }),
    )
    .await;
    let id = b["id"].as_str().unwrap_or_default().to_owned();
    assert!(id.starts_with("lnk_"), "{b}");
    assert_eq!(b["url"], format!("{}/l/{id}", app.base).as_str());
    assert_eq!(b["livemode"], false);
    assert_eq!(b["mode"], "sandbox");
    assert_eq!(b["amount"], 120000);
    assert_eq!(b["minAmount"], Value::Null);
    assert_eq!(b["currency"], "NPR");
    assert_eq!(b["active"], true);
    assert_eq!(b["usedCount"], 0);
    assert_eq!(b["maxUses"], 50);
    assert_eq!(b["customerCity"], "Pokhara");
    assert_eq!(b["customerLine1"], Value::Null);
    assert_eq!(b["collectAddress"], true);
    assert_eq!(b["referenceId"], "SKU-9");
    assert!(b.get("stats").is_none(), "stats only on retrieve: {b}");

    let open = created(
        &app,
        &key,
        json!({"title": "Donate", "minAmount": 10000, "maxAmount": 1000000}),
    )
    .await;
    assert_eq!(open["amount"], Value::Null);
    assert_eq!(
        (open["minAmount"].clone(), open["maxAmount"].clone()),
        (json!(10000), json!(1000000))
    );

    let got = app
        .get(&format!("/v1/payment-links/{id}"), Some(&key))
        .await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(
        got.body["stats"],
        json!({"views": 0, "used_count": 0, "conversion_rate": 0.0})
    );
    assert_eq!(got.body["title"], "Everest tee");
    app.stop().await;
}

async fn bad_links_are_refused_with_the_field_named(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    for (body, param) in [
        (json!({"amount": 100}), None),
        (json!({"title": ""}), Some("title")),
        (json!({"title": "x".repeat(101)}), Some("title")),
        (json!({"title": "a", "amount": -5}), Some("amount")),
        (
            json!({"title": "a", "amount": 100, "minAmount": 10}),
            Some("amount"),
        ),
        (
            json!({"title": "a", "minAmount": 900, "maxAmount": 100}),
            Some("minAmount"),
        ),
        (json!({"title": "a", "maxUses": 0}), Some("maxUses")),
        (
            json!({"title": "a", "expiresAt": "2020-01-01T00:00:00Z"}),
            Some("expiresAt"),
        ),
        (
            json!({"title": "a", "redirectUrl": "ftp://x"}),
            Some("redirectUrl"),
        ),
        (
            json!({"title": "a", "inactiveMessage": "x".repeat(301)}),
            Some("inactiveMessage"),
        ),
        (
            json!({"title": "a", "referenceId": "x".repeat(101)}),
            Some("referenceId"),
        ),
        (json!({"title": "a", "provider": "paypal"}), None),
        (json!({"title": "a", "surprise": true}), None),
    ] {
        let a = create(&app, &key, body.clone()).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        if let Some(p) = param {
            assert_eq!(a.body["error"]["param"], p, "{body}: {}", a.body);
        }
    }
    let (_, total) = list(&app, &key, "").await;
    assert_eq!(total, 0, "nothing was created");
    app.stop().await;
}

async fn list(app: &TestApp, key: &str, query: &str) -> (Vec<String>, u64) {
    let a = app
        .get(&format!("/v1/payment-links{query}"), Some(key))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let ids = a.body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|l| l["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (ids, a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX))
}

async fn lists_filter_on_active_and_patch_changes_only_what_is_sent(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let a = created(
        &app,
        &key,
        json!({"title": "A", "amount": 1000, "description": "first"}),
    )
    .await;
    let b = created(&app, &key, json!({"title": "B", "amount": 2000})).await;
    let (a_id, b_id) = (
        a["id"].as_str().unwrap_or_default(),
        b["id"].as_str().unwrap_or_default(),
    );

    let p = send(&app, reqwest::Method::PATCH, &format!("/v1/payment-links/{a_id}"), &key,
        Some(json!({"title": "A2", "description": "", "maxUses": 3, "expiresAt": "2099-01-01T00:00:00Z",
            "customerName": "Sita Rai", "customerEmail": "sita@example.com", "customerPhone": "9800000001",
            "customerLine1": "Lakeside 4", "customerCity": "Pokhara", "customerCountry": "NP"}))).await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["title"], "A2");
    assert_eq!(
        p.body.get("description"),
        None,
        "cleared: omitted, never null"
    );
    assert_eq!(p.body["maxUses"], 3);
    assert_eq!(p.body["customerName"], "Sita Rai");
    assert_eq!(p.body["customerEmail"], "sita@example.com");
    assert_eq!(p.body["customerLine1"], "Lakeside 4");
    assert_eq!(p.body["customerCity"], "Pokhara");
    assert_eq!(p.body["customerCountry"], "NP");
    assert_eq!(p.body.get("customerState"), None);
    // maxUses null: unlimited (the SDK sends it so).
    let u = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{a_id}"),
        &key,
        Some(json!({"maxUses": null})),
    )
    .await;
    assert_eq!(u.status, 200, "{}", u.body);
    assert_eq!(u.body["maxUses"], Value::Null);
    assert_eq!(u.body["customerCity"], "Pokhara", "not sent, not changed");
    let u = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{a_id}"),
        &key,
        Some(json!({"maxUses": 3})),
    )
    .await;
    assert_eq!(u.status, 200, "{}", u.body);
    assert_eq!(p.body["amount"], 1000, "not sent, not changed");
    assert_eq!(p.body["expiresAt"], "2099-01-01T00:00:00.000Z");
    for (body, param) in [
        (json!({"title": "x".repeat(101)}), "title"),
        (json!({"description": "x".repeat(501)}), "description"),
        (
            json!({"inactiveMessage": "x".repeat(301)}),
            "inactiveMessage",
        ),
        (json!({"referenceId": "x".repeat(101)}), "referenceId"),
        // null only where the contract types the field "or null".
        (json!({"description": null}), "description"),
        (json!({"inactiveMessage": null}), "inactiveMessage"),
        (json!({"referenceId": null}), "referenceId"),
        (json!({"customerEmail": "sita"}), "customerEmail"),
        (json!({"customerName": 5}), "customerName"),
        (json!({"customerLine1": ["Lakeside"]}), "customerLine1"),
        (json!({"maxUses": 0}), "maxUses"),
        (json!({"expiresAt": "2001-01-01T00:00:00Z"}), "expiresAt"),
        (
            json!({"redirectUrl": "http://shop.example/x"}),
            "redirectUrl",
        ),
    ] {
        let r = send(
            &app,
            reqwest::Method::PATCH,
            &format!("/v1/payment-links/{a_id}"),
            &key,
            Some(body),
        )
        .await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], param, "{}", r.body);
    }
    let r = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{a_id}"),
        &key,
        Some(json!({"amount": 5})),
    )
    .await;
    r.assert_error(400, "invalid_request_error", "validation_failed");

    // Deactivate B by PATCH; the filter sees it.
    let off = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{b_id}"),
        &key,
        Some(json!({"active": false})),
    )
    .await;
    assert_eq!(off.body["active"], false, "{}", off.body);
    assert_eq!(
        list(&app, &key, "?active=true").await,
        (vec![a_id.to_owned()], 1)
    );
    assert_eq!(
        list(&app, &key, "?active=false").await,
        (vec![b_id.to_owned()], 1)
    );
    assert_eq!(list(&app, &key, "").await.1, 2);
    // `active` is true or false, or left out: an empty value is neither
    // (found by the contract fuzzer).
    for q in ["?active=maybe", "?active="] {
        let a = app.get(&format!("/v1/payment-links{q}"), Some(&key)).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], "active", "{q}: {}", a.body);
    }
    app.stop().await;
}

async fn cancel_delete_and_max_uses_follow_the_use_count(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let l = created(&app, &key, json!({"title": "Used", "amount": 1000})).await;
    let id = l["id"].as_str().unwrap_or_default().to_owned();
    // Two completed payments went through it.
    if let Err(e) = app
        .store
        .update(
            &PaymentLink::key(&id.as_str().into()),
            Update::new().add("used_count", 2),
            None,
        )
        .await
    {
        panic!("{e}")
    }
    let r = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{id}"),
        &key,
        Some(json!({"maxUses": 1})),
    )
    .await;
    r.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(r.body["error"]["param"], "maxUses");
    let r = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{id}"),
        &key,
        Some(json!({"maxUses": 2})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let d = send(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/payment-links/{id}"),
        &key,
        None,
    )
    .await;
    d.assert_error(422, "invalid_request_error", "link_used");
    let c = app
        .post(
            &format!("/v1/payment-links/{id}/cancel"),
            Some(&key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.body["active"], false);
    let again = app
        .post(
            &format!("/v1/payment-links/{id}/cancel"),
            Some(&key),
            None,
            &json!({}),
        )
        .await;
    again.assert_error(422, "invalid_request_error", "link_inactive");
    // Kept with its history.
    let got = app
        .get(&format!("/v1/payment-links/{id}"), Some(&key))
        .await;
    assert_eq!(got.body["stats"]["used_count"], 2, "{}", got.body);

    let fresh = created(&app, &key, json!({"title": "Unused", "amount": 1000})).await;
    let fid = fresh["id"].as_str().unwrap_or_default();
    let d = send(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/payment-links/{fid}"),
        &key,
        None,
    )
    .await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(
        d.body,
        json!({"deleted": true, "id": fid, "livemode": false})
    );
    app.get(&format!("/v1/payment-links/{fid}"), Some(&key))
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    app.stop().await;
}

async fn scopes_isolation_and_idempotent_creates(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let reader = app.key(&t, Mode::Sandbox, &[Scope::LinksRead]).await;
    let other = app.tenant("Other", "o@other.example").await;
    let other_key = app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let live_key = app.key(&t, Mode::Live, &Scope::ALL).await;

    let l = created(&app, &key, json!({"title": "Mine", "amount": 1000})).await;
    let id = l["id"].as_str().unwrap_or_default();
    create(&app, &reader, json!({"title": "x", "amount": 1000}))
        .await
        .assert_error(403, "permission_error", "missing_scope");
    assert_eq!(
        app.get(&format!("/v1/payment-links/{id}"), Some(&reader))
            .await
            .status,
        200
    );
    for k in [&other_key, &live_key] {
        app.get(&format!("/v1/payment-links/{id}"), Some(k))
            .await
            .assert_error(404, "invalid_request_error", "not_found");
        send(
            &app,
            reqwest::Method::DELETE,
            &format!("/v1/payment-links/{id}"),
            k,
            None,
        )
        .await
        .assert_error(404, "invalid_request_error", "not_found");
        assert_eq!(list(&app, k, "").await.1, 0);
    }

    let body = json!({"title": "Once", "amount": 5000});
    let first = app
        .post("/v1/payment-links", Some(&key), Some("link-1"), &body)
        .await;
    let second = app
        .post("/v1/payment-links", Some(&key), Some("link-1"), &body)
        .await;
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert_eq!(first.body["id"], second.body["id"]);
    assert_eq!(second.header("idempotent-replayed"), "true");
    assert_eq!(list(&app, &key, "").await.1, 2);
    app.stop().await;
}

// ---------------------------------------------------------------------------
// The public link page: a customer pays through it.

/// Form-encodes `pairs`.
fn encode(pairs: &[(&str, &str)]) -> String {
    reqwest::Url::parse_with_params("http://x/", pairs)
        .ok()
        .and_then(|u| u.query().map(str::to_owned))
        .unwrap_or_default()
}

/// A browser without automatic redirects.
fn browser() -> reqwest::Client {
    match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

fn location(res: &reqwest::Response) -> String {
    res.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn absolute(app: &TestApp, url: &str) -> String {
    if url.starts_with('/') {
        app.url(url)
    } else {
        url.to_owned()
    }
}

/// Opens a checkout from the link page: the session id.
async fn open(
    app: &TestApp,
    b: &reqwest::Client,
    link: &str,
    form: &[(&str, &str)],
) -> Result<String, (u16, String)> {
    let res = b
        .post(app.url(&format!("/l/{link}")))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode(form))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = res.status().as_u16();
    if status == 303 {
        let loc = location(&res);
        return Ok(loc.trim_start_matches("/c/").to_owned());
    }
    Err((status, res.text().await.unwrap_or_default()))
}

/// `POST /c/{id}/pay` with `provider`: the status and the redirect (or
/// the page's text when there is none).
async fn choose(
    app: &TestApp,
    b: &reqwest::Client,
    session: &str,
    provider: &str,
) -> (u16, String) {
    let res = b
        .post(app.url(&format!("/c/{session}/pay")))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode(&[("provider", provider)]))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = res.status().as_u16();
    if status == 303 {
        return (status, location(&res));
    }
    (status, res.text().await.unwrap_or_default())
}

/// At Khalti's simulated wallet (`wallet`, from [`choose`]), presses
/// `action` (pay, cancel) and follows the return: where the gateway
/// finally sends the customer.
async fn at_khalti(app: &TestApp, b: &reqwest::Client, wallet: &str, action: &str) -> String {
    let wallet = absolute(app, wallet);
    let pidx = reqwest::Url::parse(&wallet)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "pidx")
                .map(|(_, v)| v.into_owned())
        })
        .unwrap_or_default();
    let res = b
        .post(&wallet)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode(&[("action", action), ("pidx", pidx.as_str())]))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        res.status().as_u16(),
        302,
        "wallet: {}",
        res.text().await.unwrap_or_default()
    );
    let back = absolute(app, &location(&res));
    let res = b.get(&back).send().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(res.status().as_u16(), 303);
    location(&res)
}

/// Pays a session with Khalti in the simulator, as the customer's browser
/// does; returns where the gateway finally sends the customer.
async fn pay_with_khalti(app: &TestApp, b: &reqwest::Client, session: &str) -> String {
    let (status, wallet) = choose(app, b, session, "khalti").await;
    assert_eq!(status, 303, "pay: {wallet}");
    at_khalti(app, b, &wallet, "pay").await
}

/// `GET /l/{id}`: status, `Retry-After` and the page.
async fn link_page(app: &TestApp, b: &reqwest::Client, id: &str) -> (u16, Option<String>, String) {
    let res = b
        .get(app.url(&format!("/l/{id}")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, retry, res.text().await.unwrap_or_default())
}

async fn link_of(app: &TestApp, key: &str, id: &str) -> Value {
    let a = app.get(&format!("/v1/payment-links/{id}"), Some(key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body
}

async fn a_customer_pays_through_a_link(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let l = created(
        &app,
        &key,
        json!({
            "title": "Everest tee", "minAmount": 50000, "maxAmount": 200000,
            "redirectUrl": "https://tees.example/thanks", "customerName": "Sita"
        }),
    )
    .await;
    let id = l["id"].as_str().unwrap_or_default().to_owned();
    let b = browser();
    // The page: a view is counted; the form pre-fills the name.
    let page = b
        .get(app.url(&format!("/l/{id}")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(page.status().as_u16(), 200);
    let html = page.text().await.unwrap_or_default();
    assert!(
        html.contains("Everest tee")
            && html.contains("id=link-form")
            && html.contains("value=\"Sita\""),
        "{html}"
    );
    // Out of bounds: the page again, with the reason, nothing opened.
    let (status, body) = open(&app, &b, &id, &[("amount", "10")])
        .await
        .err()
        .unwrap_or_default();
    assert_eq!(status, 422);
    assert!(body.contains("Enter an amount from"), "{body}");
    let session = open(
        &app,
        &b,
        &id,
        &[("amount", "1500"), ("name", "Sita Sharma")],
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    let s = app
        .get(&format!("/v1/sessions/{session}"), Some(&key))
        .await;
    assert_eq!(s.body["amount"], 150000, "{}", s.body);
    assert_eq!(s.body["customerName"], "Sita Sharma");
    let landed = pay_with_khalti(&app, &b, &session).await;
    assert!(
        landed.starts_with("https://tees.example/thanks?session_id="),
        "{landed}"
    );
    let after = link_of(&app, &key, &id).await;
    assert_eq!(after["usedCount"], 1, "{after}");
    assert_eq!(after["stats"]["views"], 1);
    assert_eq!(after["stats"]["conversion_rate"], 1.0);
    // The same return again (a replayed callback): counted once.
    let events = shared::domain::outbox::recent(
        &*app.store,
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
        20,
    )
    .await
    .unwrap_or_default();
    let paid: Vec<_> = events
        .iter()
        .filter(|e| e.event_type.as_str() == "payment_link.paid")
        .collect();
    assert_eq!(paid.len(), 1);
    assert_eq!(paid[0].object["id"], id.as_str());
    assert_eq!(paid[0].object["usedCount"], 1);
    // A used link cannot be deleted any more.
    send(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/payment-links/{id}"),
        &key,
        None,
    )
    .await
    .assert_error(422, "invalid_request_error", "link_used");
    app.stop().await;
}

/// Customers who reach the provider at once take at most `maxUses` uses:
/// opening the page holds nothing, the attempt does.
async fn max_uses_holds_when_customers_arrive_at_once(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let l = created(&app, &key, json!({"title": "Last two", "amount": 100000, "maxUses": 2, "inactiveMessage": "Sold out, sorry!"})).await;
    let id = l["id"].as_str().unwrap_or_default().to_owned();
    let b = browser();
    let tries =
        futures::future::join_all((0..8).map(|_| open(&app, &b, &id, &[("name", "Ram")]))).await;
    let opened: Vec<String> = tries
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect();
    assert_eq!(opened.len(), 8, "opening holds no use: {tries:?}");
    let sent =
        futures::future::join_all(opened.iter().map(|s| choose(&app, &b, s, "khalti"))).await;
    let to_wallet: Vec<&String> = sent
        .iter()
        .filter(|(status, _)| *status == 303)
        .map(|(_, wallet)| wallet)
        .collect();
    assert_eq!(to_wallet.len(), 2, "{sent:?}");
    for (status, page) in sent.iter().filter(|(status, _)| *status != 303) {
        assert_eq!(*status, 422, "{page}");
        assert!(page.contains("temporarily unavailable"), "{page}");
        assert!(!page.contains("Sold out"), "{page}");
    }
    for wallet in to_wallet {
        let landed = at_khalti(&app, &b, wallet, "pay").await;
        assert!(landed.contains(&format!("/l/{id}/thanks")), "{landed}");
    }
    let after = link_of(&app, &key, &id).await;
    assert_eq!(after["usedCount"], 2);
    // Used up: the page shows the link's message and opens nothing.
    let (status, _, html) = link_page(&app, &b, &id).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("id=inactive") && html.contains("Sold out, sorry!"),
        "{html}"
    );
    assert!(open(&app, &b, &id, &[]).await.is_err());
    app.stop().await;
}

/// A use is held from the moment a customer is sent to a provider until
/// that attempt is cancelled, fails or its session expires: re-opening the
/// page never holds a `maxUses: 1` link shut, and while the one use is
/// held the page says when to come back, not that the link is used up.
async fn a_use_is_held_only_while_an_attempt_is_open(which: Which) {
    let clock = std::sync::Arc::new(shared::time::ManualClock::new(shared::time::Clock::now(
        &shared::time::SystemClock,
    )));
    let Some(app) = dhukuti_tests::spawn_app_with_clock(which, |s| s, clock.clone()).await else {
        return;
    };
    let t = app.tenant("Thamel Tees", "owner@tees.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let l = created(
        &app,
        &key,
        json!({"title": "One", "amount": 100000, "maxUses": 1, "inactiveMessage": "Sold out"}),
    )
    .await;
    let id = l["id"].as_str().unwrap_or_default().to_owned();
    let b = browser();
    let mut sessions = Vec::new();
    for _ in 0..5 {
        let s = open(&app, &b, &id, &[]).await;
        sessions.push(s.unwrap_or_else(|e| panic!("opening holds nothing: {e:?}")));
    }
    // The first customer is sent to Khalti: the one use is held.
    let (status, wallet) = choose(&app, &b, &sessions[0], "khalti").await;
    assert_eq!(status, 303, "{wallet}");
    let (status, retry, html) = link_page(&app, &b, &id).await;
    assert_eq!(status, 503, "{html}");
    assert_eq!(retry.as_deref(), Some("1800"));
    assert!(
        html.contains("temporarily unavailable") && html.contains("30 minutes"),
        "{html}"
    );
    assert!(!html.contains("Sold out"), "{html}");
    let refused = open(&app, &b, &id, &[]).await;
    assert!(
        matches!(&refused, Err((503, p)) if p.contains("temporarily unavailable")),
        "{refused:?}"
    );
    let (status, page) = choose(&app, &b, &sessions[1], "esewa").await;
    assert_eq!(status, 422, "{page}");
    assert!(page.contains("temporarily unavailable"), "{page}");
    // The customer cancels at Khalti: the use is given back.
    let back = at_khalti(&app, &b, &wallet, "cancel").await;
    assert!(back.contains(&sessions[0]), "{back}");
    let (status, _, html) = link_page(&app, &b, &id).await;
    assert_eq!(status, 200, "{html}");
    assert!(!html.contains("temporarily unavailable"), "{html}");
    // Another customer is sent to eSewa and never comes back: held until
    // the session expires.
    let (status, page) = choose(&app, &b, &sessions[1], "esewa").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(link_page(&app, &b, &id).await.0, 503);
    clock.advance(chrono::Duration::minutes(31));
    let s = app
        .get(&format!("/v1/sessions/{}", sessions[1]), Some(&key))
        .await;
    assert_eq!(s.body["status"], "expired");
    assert_eq!(link_page(&app, &b, &id).await.0, 200);
    // A customer pays: used up, the link's own message.
    let last = open(&app, &b, &id, &[])
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let landed = pay_with_khalti(&app, &b, &last).await;
    assert!(landed.contains(&format!("/l/{id}/thanks")), "{landed}");
    let (status, _, html) = link_page(&app, &b, &id).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("id=inactive") && html.contains("Sold out"),
        "{html}"
    );
    let after = link_of(&app, &key, &id).await;
    assert_eq!(
        (after["usedCount"].as_i64(), after["active"].as_bool()),
        (Some(1), Some(true))
    );
    app.stop().await;
}

/// A key with a monthly spend cap creates only links a customer cannot
/// pay more than the cap through (decisions refined in the README).
async fn a_capped_key_creates_only_links_under_its_cap(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Capped", "c@capped.example").await;
    let key = app
        .key_with_cap(&t, Mode::Sandbox, &Scope::ALL, Some(50_000))
        .await;
    let over = create(&app, &key, json!({"title": "Big", "amount": 50_001})).await;
    over.assert_error(403, "permission_error", "spend_cap_exceeded");
    assert_eq!(over.body["error"]["param"], "amount", "{}", over.body);
    // An open amount without a maximum: any amount up to the providers'.
    let open = create(&app, &key, json!({"title": "Open"})).await;
    open.assert_error(403, "permission_error", "spend_cap_exceeded");
    assert_eq!(open.body["error"]["param"], "maxAmount", "{}", open.body);
    let open = create(&app, &key, json!({"title": "Open", "maxAmount": 60_000})).await;
    open.assert_error(403, "permission_error", "spend_cap_exceeded");
    // At the cap: fine, fixed or open.
    let fixed = created(&app, &key, json!({"title": "Fits", "amount": 50_000})).await;
    created(&app, &key, json!({"title": "Open", "maxAmount": 50_000})).await;
    // The amount cannot be raised afterwards: PATCH takes no amount.
    let id = fixed["id"].as_str().unwrap_or_default();
    let patch = send(
        &app,
        reqwest::Method::PATCH,
        &format!("/v1/payment-links/{id}"),
        &key,
        Some(json!({"amount": 90_000})),
    )
    .await;
    assert_eq!(patch.status, 400, "{}", patch.body);
    let (_, total) = list(&app, &key, "").await;
    assert_eq!(total, 2, "refused creates made nothing");
    // A key without a cap is not limited by another key's.
    let free = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    created(&app, &free, json!({"title": "Big", "amount": 500_000})).await;
    app.stop().await;
}

on_both_backends!(
    a_capped_key_creates_only_links_under_its_cap,
    links_are_created_with_the_spec_shape,
    bad_links_are_refused_with_the_field_named,
    lists_filter_on_active_and_patch_changes_only_what_is_sent,
    cancel_delete_and_max_uses_follow_the_use_count,
    scopes_isolation_and_idempotent_creates,
    a_customer_pays_through_a_link,
    max_uses_holds_when_customers_arrive_at_once,
    a_use_is_held_only_while_an_attempt_is_open,
);
