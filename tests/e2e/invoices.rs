//! One-time invoices over HTTP, on both backends (spec "One-time invoice",
//! decisions "One-time invoices", "Idempotency", "Errors"): drafts with
//! exact totals, validation, live invoicing, gapless numbering under
//! concurrent finalizes (over HTTP, and straight through the domain
//! without the process lock), optimistic locking, idempotent writes,
//! discard, correction, collection adjustments, collection through a real
//! Khalti simulator payment (paid, part paid, excess), overdue, lists and
//! the PDF (read back with `pdftotext`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dhukuti_tests::browser::{Browser, Form, fields, form};
use dhukuti_tests::{
    Answer, Tenant, TestApp, Which, on_both_backends, spawn_app, spawn_app_tweaked,
};
use futures::StreamExt;
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::{self, Scope, Seller};
use shared::domain::invoices;
use shared::domain::outbox;
use shared::ids::ProjectId;
use shared::store::StoreError;
use shared::store::faults::{Fault, FaultyStore, Op};
use shared::time::{Clock, SystemClock, Timestamp};

/// A due date far ahead, with an offset (answered in UTC).
const DUE: &str = "2030-12-31T18:15:00+05:45";

// ---------------------------------------------------------------------------
// Helpers

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn line(description: &str, quantity: &str, unit_amount: i64) -> Value {
    json!({"description": description, "quantity": quantity, "unitAmount": unit_amount})
}

/// A body of one line of `amount` paisa, no tax.
fn simple(amount: i64) -> Value {
    json!({"lines": [line("Service", "1", amount)], "dueAt": DUE})
}

struct Ctx {
    app: TestApp,
    tenant: Tenant,
    /// A sandbox key with every scope.
    key: String,
}

impl Ctx {
    async fn open(which: Which) -> Option<Ctx> {
        Some(Ctx::on(spawn_app(which).await?).await)
    }

    async fn on(app: TestApp) -> Ctx {
        let tenant = app.tenant("Patan Prints", "owner@prints.example").await;
        let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
        Ctx { app, tenant, key }
    }

    fn project(&self) -> &ProjectId {
        &self.tenant.project.id
    }

    async fn stop(self) {
        self.app.stop().await;
    }

    async fn create_with(&self, key: &str, body: &Value) -> Answer {
        self.app.post("/v1/invoices", Some(key), None, body).await
    }

    async fn create(&self, body: &Value) -> Answer {
        self.create_with(&self.key, body).await
    }

    /// A new draft (asserts 201).
    async fn draft(&self, body: &Value) -> Value {
        let a = self.create(body).await;
        assert_eq!(a.status, 201, "create: {}", a.body);
        a.body
    }

    async fn finalize_with(&self, key: &str, id: &str, version: i64) -> Answer {
        self.app
            .post(
                &format!("/v1/invoices/{id}/finalize"),
                Some(key),
                None,
                &json!({"version": version}),
            )
            .await
    }

    async fn finalize(&self, id: &str, version: i64) -> Answer {
        self.finalize_with(&self.key, id, version).await
    }

    /// A new issued invoice (asserts 201 then 200).
    async fn issued(&self, body: &Value) -> Value {
        let d = self.draft(body).await;
        let a = self
            .finalize(&s(&d["id"]), d["version"].as_i64().unwrap_or(0))
            .await;
        assert_eq!(a.status, 200, "finalize: {}", a.body);
        assert_eq!(a.body["document_status"], "issued", "{}", a.body);
        a.body
    }

    async fn read(&self, id: &str) -> Answer {
        self.app
            .get(&format!("/v1/invoices/{id}"), Some(&self.key))
            .await
    }

    /// The invoice (asserts 200).
    async fn invoice(&self, id: &str) -> Value {
        let a = self.read(id).await;
        assert_eq!(a.status, 200, "read {id}: {}", a.body);
        a.body
    }

    /// Any method, JSON body when given, `Idempotency-Key` when given.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        idem: Option<&str>,
    ) -> Answer {
        let mut req = self
            .app
            .client
            .request(method, self.app.url(path))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        if let Some(k) = idem {
            req = req.header("idempotency-key", k);
        }
        dhukuti_tests::send(req).await
    }

    async fn patch(&self, id: &str, body: &Value) -> Answer {
        self.send(
            reqwest::Method::PATCH,
            &format!("/v1/invoices/{id}"),
            Some(body),
            None,
        )
        .await
    }

    async fn discard(&self, id: &str, idem: Option<&str>) -> Answer {
        self.send(
            reqwest::Method::POST,
            &format!("/v1/invoices/{id}/discard"),
            None,
            idem,
        )
        .await
    }

    async fn correct(&self, id: &str, reason: &str) -> Answer {
        self.app
            .post(
                &format!("/v1/invoices/{id}/correct"),
                Some(&self.key),
                None,
                &json!({"reason": reason}),
            )
            .await
    }

    async fn adjust(&self, id: &str, amount: i64, version: i64) -> Answer {
        self.app
            .post(
                &format!("/v1/invoices/{id}/adjustments"),
                Some(&self.key),
                None,
                &json!({"amount": amount, "reason": "goodwill discount", "version": version}),
            )
            .await
    }

    async fn checkout(&self, id: &str, body: &Value) -> Answer {
        self.app
            .post(
                &format!("/v1/invoices/{id}/checkout"),
                Some(&self.key),
                None,
                body,
            )
            .await
    }

    /// `GET /v1/invoices{query}` (asserts 200).
    async fn list(&self, query: &str) -> Value {
        let a = self
            .app
            .get(&format!("/v1/invoices{query}"), Some(&self.key))
            .await;
        assert_eq!(a.status, 200, "list {query}: {}", a.body);
        a.body
    }

    async fn total(&self, query: &str) -> u64 {
        self.list(query).await["meta"]["total"]
            .as_u64()
            .unwrap_or(u64::MAX)
    }

    /// `GET /v1/sessions/{id}` (asserts 200).
    async fn session(&self, id: &str) -> Value {
        let a = self
            .app
            .get(&format!("/v1/sessions/{id}"), Some(&self.key))
            .await;
        assert_eq!(a.status, 200, "session {id}: {}", a.body);
        a.body
    }

    /// Picks Khalti on checkout `session`'s hosted page and follows the
    /// hand-off to Khalti's payment page: answers its form.
    async fn start_khalti(&self, session: &str) -> Form {
        let browser = Browser::new(&self.app.base);
        let picked = browser
            .post_form(
                &format!("/c/{session}/pay"),
                &fields(&[("provider", "khalti")]),
            )
            .await;
        let to = picked.redirect(303);
        assert!(
            to.starts_with(&format!("{}/sim/khalti/pay", self.app.base)),
            "{to}"
        );
        let wallet = browser.get(&to).await;
        assert_eq!(wallet.status, 200, "{}", wallet.show());
        match form(&wallet.body, None) {
            Some(f) => f,
            None => panic!("no form on Khalti's page: {}", wallet.show()),
        }
    }

    /// Presses "pay" on Khalti's page and comes back to checkout
    /// `session`'s return URL.
    async fn finish_khalti(&self, session: &str, wallet: &Form) {
        let browser = Browser::new(&self.app.base);
        let mut sent = wallet.hidden.clone();
        sent.push(("action".into(), "pay".into()));
        let callback = browser.post_form(&wallet.action, &sent).await.redirect(302);
        assert!(
            callback.starts_with(&format!("{}/c/{session}/return/pay_", self.app.base)),
            "{callback}"
        );
        let back = browser.get(&callback).await;
        assert_eq!(back.status, 303, "{}", back.show());
    }

    /// Pays checkout `session` through the hosted picker and the Khalti
    /// simulator's payment page: answers the payment's id.
    async fn pay_with_khalti(&self, session: &str) -> String {
        let wallet = self.start_khalti(session).await;
        self.finish_khalti(session, &wallet).await;
        let sess = self.session(session).await;
        assert_eq!(sess["status"], "success", "{sess}");
        let payment = s(&sess["paymentId"]);
        assert!(payment.starts_with("pay_"), "{sess}");
        payment
    }

    /// Events of `kind` in the sandbox outbox about invoice `id`.
    async fn events_about(&self, kind: &str, id: &str) -> Vec<outbox::Event> {
        let events = match outbox::recent(
            &*self.app.store,
            &shared::domain::Tenant::new(self.project().clone(), Mode::Sandbox),
            100,
        )
        .await
        {
            Ok(e) => e,
            Err(e) => panic!("events: {e}"),
        };
        events
            .into_iter()
            .filter(|e| serde_json::to_value(e.event_type).ok() == Some(json!(kind)))
            .filter(|e| e.object["id"] == id)
            .collect()
    }
}

fn version(v: &Value) -> i64 {
    match v["version"].as_i64() {
        Some(n) => n,
        None => panic!("no version: {v}"),
    }
}

fn int(v: &Value, field: &str) -> i64 {
    match v[field].as_i64() {
        Some(n) => n,
        None => panic!("no integer {field}: {v}"),
    }
}

fn assert_replayed(a: &Answer, first: &Answer) {
    assert_eq!(a.header("idempotent-replayed"), "true", "{}", a.body);
    assert_eq!(a.status, first.status, "{}", a.body);
    assert_eq!(a.body, first.body, "a replay answers the same body");
}

fn ts(v: &Value) -> Timestamp {
    match v.as_str().and_then(Timestamp::parse) {
        Some(t) => t,
        None => panic!("not a timestamp: {v}"),
    }
}

// ---------------------------------------------------------------------------
// 1. Create

async fn a_draft_has_every_field_and_exact_totals(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let before = SystemClock.now();
    let body = json!({
        "lines": [
            line("Tea, 1 kg", "2.5", 120_000),   // 300000
            line("Sample", "0.333", 1_000),      // 333
            line("Stamp", "0.5", 33),            // 16.5 -> 17
        ],
        "dueAt": DUE,
        "customerId": "cus_42",
        "buyer": {"name": "Sita Sharma", "email": "sita@example.com",
                  "phone": "9841000001", "address": "Mangal Bazaar, Lalitpur"},
        "taxRateBps": 1300,
        "externalReference": "PO-7",
        "note": "Thank you for your business",
    });
    let a = c.create(&body).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let inv = &a.body;
    let id = s(&inv["id"]);
    assert!(id.starts_with("oinv_") && id.len() >= 5 + 24, "{inv}");
    assert_eq!(inv["object"], "standalone_invoice");
    assert_eq!(inv["livemode"], false);
    assert_eq!(inv["version"], 1);
    assert_eq!(inv["invoice_number"], Value::Null);
    assert_eq!(inv["document_status"], "draft");
    assert_eq!(inv["collection_status"], "unpaid");
    assert_eq!(inv["overdue"], false);
    assert_eq!(inv["currency"], "NPR");
    let lines = inv["lines"].as_array().cloned().unwrap_or_default();
    assert_eq!(lines.len(), 3, "{inv}");
    let expected = [
        ("Tea, 1 kg", "2.5", 120_000, 300_000),
        ("Sample", "0.333", 1_000, 333),
        ("Stamp", "0.5", 33, 17),
    ];
    let mut line_ids = BTreeSet::new();
    for (l, (d, q, u, t)) in lines.iter().zip(expected) {
        let keys: BTreeSet<&str> = l
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            BTreeSet::from(["id", "description", "quantity", "unitAmount", "lineTotal"]),
            "line keys (camelCase, nothing else): {l}"
        );
        assert!(l["id"].as_str().is_some_and(|i| !i.is_empty()), "{l}");
        line_ids.insert(s(&l["id"]));
        assert_eq!(l["description"], d, "{l}");
        assert_eq!(l["quantity"], q, "quantity is decimal text: {l}");
        assert_eq!(l["unitAmount"], u, "{l}");
        assert_eq!(l["lineTotal"], t, "{l}");
    }
    assert_eq!(line_ids.len(), 3, "line ids are distinct");
    // 300350 x 13% = 39045.5 -> 39046 (half up).
    assert_eq!(inv["subtotal"], 300_350);
    assert_eq!(inv["tax_rate_bps"], 1300);
    assert_eq!(inv["tax_total"], 39_046);
    assert_eq!(inv["total_amount"], 339_396);
    assert_eq!(inv["amount_paid"], 0);
    assert_eq!(inv["amount_adjusted"], 0);
    assert_eq!(inv["amount_excess"], 0);
    assert_eq!(inv["amount_remaining"], 339_396);
    assert_eq!(inv["customer_id"], "cus_42");
    assert_eq!(
        inv["buyer"],
        json!({"name": "Sita Sharma", "email": "sita@example.com",
               "phone": "9841000001", "address": "Mangal Bazaar, Lalitpur"})
    );
    assert_eq!(inv["seller"], Value::Null);
    assert_eq!(inv["issued_at"], Value::Null);
    assert_eq!(ts(&inv["due_at"]), ts(&json!(DUE)));
    assert!(s(&inv["due_at"]).ends_with('Z'), "UTC: {inv}");
    let created = ts(&inv["created_at"]);
    let after = SystemClock.now();
    assert!(
        created >= before.plus(chrono::Duration::seconds(-1))
            && created <= after.plus(chrono::Duration::seconds(1)),
        "{inv}"
    );
    assert_eq!(inv["external_reference"], "PO-7");
    assert_eq!(inv["note"], "Thank you for your business");
    assert_eq!(inv["needs_attention"], false);
    for absent in [
        "voided_at",
        "void_reason",
        "corrected_by_invoice_id",
        "correction_of_invoice_id",
    ] {
        assert!(inv[absent].is_null(), "{absent} on a new draft: {inv}");
    }
    assert!(!a.header("x-request-id").is_empty());

    // Read back: the same document.
    assert_eq!(&c.invoice(&id).await, inv);

    // The optional fields left out: null, no tax.
    let bare = c
        .draft(&json!({"lines": [line("Call-out", "3", 2_500)], "dueAt": DUE}))
        .await;
    for field in [
        "customer_id",
        "buyer",
        "external_reference",
        "note",
        "seller",
    ] {
        assert_eq!(bare[field], Value::Null, "{field}: {bare}");
    }
    assert_eq!(bare["tax_rate_bps"], 0);
    assert_eq!(bare["tax_total"], 0);
    assert_eq!(bare["subtotal"], 7_500);
    assert_eq!(bare["total_amount"], 7_500);
    assert_eq!(bare["amount_remaining"], 7_500);
    assert_eq!(c.total("").await, 2);
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 2. Validation

async fn invalid_creates_are_400_naming_the_field(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let ok = line("Fine", "1", 100);
    let with_line = |bad: Value| json!({"lines": [ok.clone(), bad], "dueAt": DUE});
    let many: Vec<Value> = (0..101).map(|_| ok.clone()).collect();
    let hundred: Vec<Value> = (0..100).map(|_| ok.clone()).collect();
    let cases: Vec<(Value, &[&str])> = vec![
        (json!({"lines": [], "dueAt": DUE}), &["lines"]),
        (json!({"lines": many, "dueAt": DUE}), &["lines"]),
        (json!({"dueAt": DUE}), &["lines"]),
        (json!({"lines": [ok.clone()]}), &["dueAt"]),
        (with_line(line("x", "1.2345", 100)), &["lines[1].quantity"]),
        (with_line(line("x", "-1", 100)), &["lines[1].quantity"]),
        (with_line(line("x", "0", 100)), &["lines[1].quantity"]),
        (with_line(line("x", "", 100)), &["lines[1].quantity"]),
        (with_line(line("x", "1e3", 100)), &["lines[1].quantity"]),
        (
            with_line(json!({"description": "x", "quantity": 1, "unitAmount": 100})),
            &["lines[1].quantity"],
        ),
        (with_line(line("x", "1", -1)), &["lines[1].unitAmount"]),
        (
            with_line(json!({"description": "x", "quantity": "1", "unitAmount": 1.5})),
            &["lines[1].unitAmount"],
        ),
        (
            with_line(json!({"description": "x", "quantity": "1", "unitAmount": "10"})),
            &["lines[1].unitAmount"],
        ),
        (
            with_line(json!({"quantity": "1", "unitAmount": 10})),
            &["lines[1].description"],
        ),
        (
            json!({"lines": [ok.clone()], "dueAt": DUE, "taxRateBps": 10_001}),
            &["taxRateBps"],
        ),
        (
            json!({"lines": [ok.clone()], "dueAt": DUE, "taxRateBps": -1}),
            &["taxRateBps"],
        ),
        (
            json!({"lines": [ok.clone()], "dueAt": "tomorrow"}),
            &["dueAt"],
        ),
        (
            json!({"lines": [ok.clone()], "dueAt": DUE, "buyer": {"email": "x"}}),
            &["buyer.email"],
        ),
        (
            json!({"lines": [ok.clone()], "dueAt": DUE, "buyer": {"name": "A", "vat": "1"}}),
            &["buyer.vat", "buyer"],
        ),
        (
            json!({"lines": [ok.clone()], "dueAt": DUE, "colour": "red"}),
            &["colour"],
        ),
        (
            with_line(
                json!({"description": "x", "quantity": "1", "unitAmount": 1, "lineTotal": 1}),
            ),
            &["lines[1].lineTotal", "lines[1]"],
        ),
    ];
    for (body, params) in cases {
        let a = c.create(&body).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        let param = s(&a.body["error"]["param"]);
        assert!(
            params.contains(&param.as_str()),
            "param {param:?}, want one of {params:?}; body {body}; answer {}",
            a.body
        );
    }
    // Not JSON, or not an object: 400, never a 500.
    for raw in ["{\"lines\": [", "not json", "[]", "null", "42", ""] {
        let req = c
            .app
            .client
            .post(c.app.url("/v1/invoices"))
            .bearer_auth(&c.key)
            .header("content-type", "application/json")
            .body(raw.to_owned());
        let a = dhukuti_tests::send(req).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
    }
    // Nothing was created; the limits themselves are accepted.
    assert_eq!(c.total("").await, 0);
    let max = c
        .draft(&json!({"lines": hundred, "dueAt": DUE, "taxRateBps": 10_000}))
        .await;
    assert_eq!(max["lines"].as_array().map(Vec::len), Some(100));
    assert_eq!(max["subtotal"], 10_000);
    assert_eq!(max["tax_total"], 10_000);
    assert_eq!(max["total_amount"], 20_000);

    // The other writes validate their bodies too.
    let id = s(&max["id"]);
    let v = version(&max);
    let a = c
        .app
        .post(
            &format!("/v1/invoices/{id}/finalize"),
            Some(&c.key),
            None,
            &json!({}),
        )
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "version", "{}", a.body);
    let a = c
        .app
        .post(
            &format!("/v1/invoices/{id}/finalize"),
            Some(&c.key),
            None,
            &json!({"version": "1"}),
        )
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    let a = c
        .patch(
            &id,
            &json!({"version": v, "lines": [line("x", "1.2345", 1)]}),
        )
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(a.body["error"]["param"], "lines[0].quantity", "{}", a.body);
    let a = c.patch(&id, &json!({"version": v, "colour": "red"})).await;
    a.assert_error(400, "invalid_request_error", "validation_failed");
    // The failed edits changed nothing.
    assert_eq!(c.invoice(&id).await["version"], v);
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 3. Live invoicing

async fn live_invoices_need_live_invoicing_and_take_pi_numbers(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let live = c.app.key(&c.tenant, Mode::Live, &Scope::ALL).await;
    let body = simple(50_000);
    let a = c.create_with(&live, &body).await;
    a.assert_error(403, "permission_error", "live_invoicing_disabled");
    let a = c.app.get("/v1/invoices", Some(&live)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body["meta"]["total"], 0,
        "nothing was created: {}",
        a.body
    );

    // Sandbox keeps working, unnumbered until finalize.
    let sandbox = c.draft(&body).await;
    assert_eq!(sandbox["livemode"], false);

    if let Err(e) = account::set_live_invoicing(&*c.app.store, c.project(), true).await {
        panic!("set_live_invoicing: {e}")
    }
    let seller = Seller {
        name: Some("Patan Prints".into()),
        legal_name: Some("Patan Prints Pvt. Ltd.".into()),
        email: Some("billing@prints.example".into()),
        logo_url: Some("https://prints.example/logo.png".into()),
        brand_color: Some("#aa3300".into()),
    };
    if let Err(e) = account::set_seller(&*c.app.store, c.project(), Some(&seller)).await {
        panic!("set_seller: {e}")
    }
    let a = c.create_with(&live, &body).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["livemode"], true);
    assert_eq!(a.body["invoice_number"], Value::Null);
    assert_eq!(
        a.body["seller"],
        Value::Null,
        "seller is copied at finalize"
    );
    let live_id = s(&a.body["id"]);
    let f = c.finalize_with(&live, &live_id, version(&a.body)).await;
    assert_eq!(f.status, 200, "{}", f.body);
    assert_eq!(f.body["invoice_number"], "PI-000001");
    assert_eq!(f.body["document_status"], "issued");
    assert_eq!(f.body["livemode"], true);
    assert_eq!(
        f.body["seller"],
        json!({"name": "Patan Prints", "legalName": "Patan Prints Pvt. Ltd.",
               "email": "billing@prints.example", "logoUrl": "https://prints.example/logo.png",
               "brandColor": "#aa3300"}),
        "{}",
        f.body
    );
    assert!(f.body["issued_at"].is_string(), "{}", f.body);
    // The seller is frozen with the document.
    if let Err(e) = account::set_seller(&*c.app.store, c.project(), None).await {
        panic!("set_seller: {e}")
    }
    let again = c
        .app
        .get(&format!("/v1/invoices/{live_id}"), Some(&live))
        .await;
    assert_eq!(again.body["seller"], f.body["seller"], "{}", again.body);

    // Sandbox numbers are their own sequence.
    let fs = c.finalize(&s(&sandbox["id"]), version(&sandbox)).await;
    assert_eq!(fs.status, 200, "{}", fs.body);
    assert_eq!(fs.body["invoice_number"], "TEST-PI-000001");
    assert_eq!(fs.body["livemode"], false);
    assert_eq!(fs.body["seller"], Value::Null, "{}", fs.body);

    // Each mode sees only its own invoices.
    let a = c
        .app
        .get(&format!("/v1/invoices/{live_id}"), Some(&c.key))
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    let second = c.create_with(&live, &body).await;
    let f2 = c
        .finalize_with(&live, &s(&second.body["id"]), version(&second.body))
        .await;
    assert_eq!(f2.body["invoice_number"], "PI-000002", "{}", f2.body);
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 4. Gapless numbering under concurrency

/// `n` sandbox drafts, created a few at a time: `(id, version)`.
async fn drafts(c: &Ctx, n: usize) -> Vec<(String, i64)> {
    let made: Vec<(String, i64)> = futures::stream::iter(0..n)
        .map(|i| async move {
            let d = c.draft(&simple(10_000 + i as i64)).await;
            (s(&d["id"]), version(&d))
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert_eq!(made.len(), n);
    made
}

fn expected_numbers(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("TEST-PI-{i:06}")).collect()
}

/// How many drafts are finalized at once over HTTP: 200 on both backends
/// (the proof). moto deep-copies the table for every operation of
/// a DynamoDB transaction, so this is the slowest test on the AWS backend
/// (about two minutes); its time is bounded by the count.
fn concurrent_finalizes(_which: Which) -> usize {
    200
}

async fn concurrent_finalizes_over_http_take_gapless_numbers(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let n = concurrent_finalizes(which);
    let made = drafts(&c, n).await;
    let answers = futures::future::join_all(made.iter().map(|(id, v)| c.finalize(id, *v))).await;
    let mut numbers = Vec::new();
    for ((id, _), a) in made.iter().zip(&answers) {
        assert_eq!(a.status, 200, "finalize {id}: {}", a.body);
        assert_eq!(a.body["id"], id.as_str());
        assert_eq!(a.body["document_status"], "issued");
        numbers.push(s(&a.body["invoice_number"]));
    }
    let distinct: BTreeSet<&String> = numbers.iter().collect();
    assert_eq!(distinct.len(), n, "a number was given twice");
    numbers.sort();
    assert_eq!(numbers, expected_numbers(n), "numbers 1..={n}, no gap");
    // What is stored agrees with what was answered, invoice by invoice.
    let answered: BTreeSet<(String, String)> = answers
        .iter()
        .map(|a| (s(&a.body["id"]), s(&a.body["invoice_number"])))
        .collect();
    let mut stored = BTreeSet::new();
    for offset in (0..n).step_by(100) {
        let page = c
            .list(&format!(
                "?document_status=issued&limit=100&offset={offset}"
            ))
            .await;
        for i in page["data"].as_array().cloned().unwrap_or_default() {
            stored.insert((s(&i["id"]), s(&i["invoice_number"])));
        }
    }
    assert_eq!(stored, answered);
    // And the next one continues the sequence.
    let next = c.issued(&simple(5_000)).await;
    assert_eq!(next["invoice_number"], format!("TEST-PI-{:06}", n + 1));
    c.stop().await;
}

async fn concurrent_domain_finalizes_without_the_process_lock_stay_gapless(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    const N: usize = 30;
    let made = drafts(&c, N).await;
    let start = Arc::new(tokio::sync::Barrier::new(N));
    let tasks: Vec<_> = made
        .iter()
        .cloned()
        .map(|(id, v)| {
            let state = c.app.state().clone();
            let project = c.project().to_owned();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                invoices::finalize(
                    &state,
                    &shared::domain::Tenant::new(project.as_str(), Mode::Sandbox),
                    &id.as_str().into(),
                    v,
                    None,
                )
                .await
            })
        })
        .collect();
    // Every finalize takes a number, or gives up with "busy, retry" after
    // its time budget (moto serves one call at a time: with 30 racing,
    // the last ones can run out) and takes none.
    let mut answered = BTreeSet::new();
    let mut busy = Vec::new();
    for (task, (id, _)) in futures::future::join_all(tasks)
        .await
        .into_iter()
        .zip(&made)
    {
        match task {
            Ok(Ok(inv)) => {
                assert_eq!(&inv.id, id);
                answered.insert((id.clone(), inv.invoice_number.unwrap_or_default()));
            }
            Ok(Err(invoices::InvoiceError::Store(StoreError::Unavailable(_)))) => {
                busy.push(id.clone())
            }
            Ok(Err(e)) => panic!("finalize {id}: {e:?}"),
            Err(e) => panic!("task {id}: {e}"),
        }
    }
    let k = answered.len();
    assert!(k > 0, "no finalize got through");
    let mut numbers: Vec<String> = answered.iter().map(|(_, n)| n.clone()).collect();
    numbers.sort();
    assert_eq!(
        numbers,
        expected_numbers(k),
        "the {k} finalizes that got through took 1..={k}: no gap, no repeat"
    );
    // Those that gave up took nothing: still drafts, and their retries
    // continue the sequence.
    for (i, id) in busy.iter().enumerate() {
        let inv = c.invoice(id).await;
        assert_eq!(inv["document_status"], "draft", "{inv}");
        assert_eq!(inv["invoice_number"], Value::Null, "{inv}");
        let f = c.finalize(id, version(&inv)).await;
        assert_eq!(f.status, 200, "{}", f.body);
        let want = format!("TEST-PI-{:06}", k + i + 1);
        assert_eq!(f.body["invoice_number"], want.as_str());
        answered.insert((id.clone(), want));
    }
    assert_eq!(answered.len(), N);
    // Stored as answered, and the counter continues at N + 1.
    let mut stored = BTreeSet::new();
    for (id, _) in &made {
        stored.insert((id.clone(), s(&c.invoice(id).await["invoice_number"])));
    }
    assert_eq!(stored, answered);
    let next = c.issued(&simple(5_000)).await;
    assert_eq!(next["invoice_number"], format!("TEST-PI-{:06}", N + 1));
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 5. Versions and states

async fn versions_lock_edits_and_states_guard_transitions(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let d = c.draft(&simple(10_000)).await;
    let id = s(&d["id"]);
    assert_eq!(version(&d), 1);

    // A stale finalize changes nothing and takes no number.
    for stale in [0, 2] {
        let a = c.finalize(&id, stale).await;
        a.assert_error(409, "invalid_request_error", "version_conflict");
    }
    let still = c.invoice(&id).await;
    assert_eq!(still, d, "a refused finalize changes nothing");

    // PATCH at the current version: bumps it and prices again.
    let p = c
        .patch(
            &id,
            &json!({"version": 1, "lines": [line("Design", "1.5", 333)],
                    "taxRateBps": 1300, "note": "edited"}),
        )
        .await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["version"], 2);
    assert_eq!(p.body["lines"][0]["lineTotal"], 500, "499.5 -> 500");
    assert_eq!(p.body["subtotal"], 500);
    assert_eq!(p.body["tax_total"], 65);
    assert_eq!(p.body["total_amount"], 565);
    assert_eq!(p.body["amount_remaining"], 565);
    assert_eq!(p.body["note"], "edited");
    assert_eq!(p.body["due_at"], d["due_at"], "keys not sent are kept");
    assert_eq!(p.body["document_status"], "draft");
    assert_eq!(c.invoice(&id).await, p.body);
    // Clearing a nullable field.
    let p2 = c.patch(&id, &json!({"version": 2, "note": null})).await;
    assert_eq!(p2.status, 200, "{}", p2.body);
    assert_eq!(p2.body["note"], Value::Null);
    assert_eq!(p2.body["version"], 3);
    assert_eq!(p2.body["total_amount"], 565);

    // A stale PATCH: 409, nothing changes.
    let a = c.patch(&id, &json!({"version": 2, "note": "late"})).await;
    a.assert_error(409, "invalid_request_error", "version_conflict");
    assert_eq!(c.invoice(&id).await, p2.body);

    // The refused finalizes took no number.
    let f = c.finalize(&id, 3).await;
    assert_eq!(f.status, 200, "{}", f.body);
    assert_eq!(f.body["invoice_number"], "TEST-PI-000001");
    assert_eq!(f.body["version"], 4);
    assert_eq!(f.body["total_amount"], 565);

    // Issued: frozen.
    let a = c
        .patch(&id, &json!({"version": 4, "note": "too late"}))
        .await;
    a.assert_error(409, "invalid_request_error", "state_conflict");
    let a = c.finalize(&id, 4).await;
    a.assert_error(409, "invalid_request_error", "state_conflict");
    let a = c.discard(&id, None).await;
    a.assert_error(409, "invalid_request_error", "state_conflict");
    assert_eq!(c.invoice(&id).await, f.body);

    // The next finalize continues without a gap.
    let next = c.issued(&simple(1_000)).await;
    assert_eq!(next["invoice_number"], "TEST-PI-000002");

    // Unknown ids.
    let a = c.finalize("oinv_01ARZ3NDEKTSV4RRFFQ69G5FAV", 1).await;
    a.assert_error(404, "invalid_request_error", "not_found");
    let a = c.patch("nope", &json!({"version": 1})).await;
    a.assert_error(404, "invalid_request_error", "not_found");
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 6. Idempotency

async fn invoice_writes_are_idempotent(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let post = |path: String, body: Value, key: &'static str| {
        let c = &c;
        async move { c.app.post(&path, Some(&c.key), Some(key), &body).await }
    };

    // Create: replayed, never twice.
    let body = simple(20_000);
    let first = post("/v1/invoices".into(), body.clone(), "create-1").await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_ne!(first.header("idempotent-replayed"), "true");
    let again = post("/v1/invoices".into(), body.clone(), "create-1").await;
    assert_replayed(&again, &first);
    assert_eq!(c.total("").await, 1);
    // Same key, different body or path: 409.
    let a = post("/v1/invoices".into(), simple(20_001), "create-1").await;
    a.assert_error(409, "idempotency_error", "idempotency_key_reused");
    let id = s(&first.body["id"]);
    let a = post(
        format!("/v1/invoices/{id}/finalize"),
        json!({"version": 1}),
        "create-1",
    )
    .await;
    a.assert_error(409, "idempotency_error", "idempotency_key_reused");
    assert_eq!(c.invoice(&id).await["document_status"], "draft");
    assert_eq!(c.total("").await, 1);

    // Finalize: a replay answers the same number and allocates none.
    let fin = post(
        format!("/v1/invoices/{id}/finalize"),
        json!({"version": 1}),
        "fin-1",
    )
    .await;
    assert_eq!(fin.status, 200, "{}", fin.body);
    assert_eq!(fin.body["invoice_number"], "TEST-PI-000001");
    let replay = post(
        format!("/v1/invoices/{id}/finalize"),
        json!({"version": 1}),
        "fin-1",
    )
    .await;
    assert_replayed(&replay, &fin);
    let other = c.draft(&simple(3_000)).await;
    let other_id = s(&other["id"]);
    let a = post(
        format!("/v1/invoices/{other_id}/finalize"),
        json!({"version": 1}),
        "fin-1",
    )
    .await;
    a.assert_error(409, "idempotency_error", "idempotency_key_reused");
    assert_eq!(c.invoice(&other_id).await["invoice_number"], Value::Null);
    let f2 = c.finalize(&other_id, 1).await;
    assert_eq!(f2.body["invoice_number"], "TEST-PI-000002", "{}", f2.body);

    // Discard: replayed.
    let d = c.draft(&simple(4_000)).await;
    let did = s(&d["id"]);
    let gone = c.discard(&did, Some("discard-1")).await;
    assert_eq!(gone.status, 200, "{}", gone.body);
    let replay = c.discard(&did, Some("discard-1")).await;
    assert_replayed(&replay, &gone);
    assert_eq!(c.read(&did).await.status, 404);

    // Checkout: replayed (the stored answer, `reused` false).
    let co = post(format!("/v1/invoices/{id}/checkout"), json!({}), "co-1").await;
    assert_eq!(co.status, 200, "{}", co.body);
    assert_eq!(co.body["reused"], false);
    let replay = post(format!("/v1/invoices/{id}/checkout"), json!({}), "co-1").await;
    assert_replayed(&replay, &co);
    let a = post(
        format!("/v1/invoices/{id}/checkout"),
        json!({"provider": "khalti"}),
        "co-1",
    )
    .await;
    a.assert_error(409, "idempotency_error", "idempotency_key_reused");
    // Without the key, the open session is reused.
    let plain = c.checkout(&id, &json!({})).await;
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert_eq!(
        plain.body["checkout_session_id"],
        co.body["checkout_session_id"]
    );
    assert_eq!(plain.body["reused"], true);

    // A key over 255 characters: 400.
    let long = "k".repeat(256);
    let a = c
        .app
        .post("/v1/invoices", Some(&c.key), Some(&long), &body)
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");

    // Concurrent duplicates of one create: one draft.
    let before = c.total("").await;
    const DUPES: usize = 12;
    let dup_body = simple(7_700);
    let answers = futures::future::join_all((0..DUPES).map(|_| {
        c.app
            .post("/v1/invoices", Some(&c.key), Some("create-race"), &dup_body)
    }))
    .await;
    let mut made = BTreeSet::new();
    let mut fresh = 0;
    for a in &answers {
        match a.status {
            201 => {
                made.insert(s(&a.body["id"]));
                if a.header("idempotent-replayed") != "true" {
                    fresh += 1;
                }
            }
            409 => a.assert_error(409, "idempotency_error", "idempotency_conflict"),
            other => panic!("a duplicate answered {other}: {}", a.body),
        }
    }
    assert_eq!(fresh, 1, "exactly one request ran");
    assert_eq!(made.len(), 1, "every 201 names the same draft: {made:?}");
    assert_eq!(c.total("").await, before + 1);
    // After the race, the key replays.
    let late = c
        .app
        .post("/v1/invoices", Some(&c.key), Some("create-race"), &dup_body)
        .await;
    assert_eq!(late.status, 201, "{}", late.body);
    assert_eq!(late.header("idempotent-replayed"), "true");
    assert!(made.contains(&s(&late.body["id"])));
    assert_eq!(c.total("").await, before + 1);
    c.stop().await;
}

/// The answer is lost after the write committed: the store times out on
/// the way back (the write happened), the request answers a 5xx, which the
/// idempotency layer does not keep, so the client's retry with the same key
/// runs again. It must find what the first run did (the request's fence,
/// written with the business write) and answer it, never act twice
/// (decisions, "Idempotency").
async fn a_retry_after_a_lost_answer_finds_the_first_write(which: Which) {
    let mut faults: Option<Arc<FaultyStore>> = None;
    // No webhook poller: only the requests below write.
    let app = spawn_app_tweaked(
        which,
        |inner| {
            let f = Arc::new(FaultyStore::new(inner));
            faults = Some(f.clone());
            f
        },
        |s| s.webhook_poll = None,
    )
    .await;
    let (Some(app), Some(faults)) = (app, faults) else {
        return;
    };
    let c = Ctx::on(app).await;
    let lost = |what: &str, a: &Answer| {
        assert!(
            (500..600).contains(&a.status),
            "{what}: the first run's answer is lost as a 5xx, got {}: {}",
            a.status,
            a.body
        );
    };
    let post = |path: String, body: Value, key: &'static str| {
        let c = &c;
        async move { c.app.post(&path, Some(&c.key), Some(key), &body).await }
    };

    // Create: the retry answers the first draft.
    let body = simple(25_000);
    faults.plan(Op::Transact, 0, Fault::timeout_after_write());
    let a = post("/v1/invoices".into(), body.clone(), "lost-create").await;
    lost("create", &a);
    assert_eq!(faults.injected(), 1);
    let b = post("/v1/invoices".into(), body.clone(), "lost-create").await;
    assert_eq!(b.status, 201, "{}", b.body);
    assert_eq!(c.total("").await, 1, "one draft");
    let id = s(&b.body["id"]);
    assert_eq!(c.list("").await["data"][0]["id"], id.as_str());

    // Finalize: one number.
    faults.plan(Op::Transact, 0, Fault::timeout_after_write());
    let fin = format!("/v1/invoices/{id}/finalize");
    let a = post(fin.clone(), json!({"version": 1}), "lost-finalize").await;
    lost("finalize", &a);
    assert_eq!(faults.injected(), 2);
    let b = post(fin, json!({"version": 1}), "lost-finalize").await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(b.body["invoice_number"], "TEST-PI-000001");
    assert_eq!(b.body["document_status"], "issued");
    let next = c.issued(&simple(1_000)).await;
    assert_eq!(
        next["invoice_number"], "TEST-PI-000002",
        "no number was lost"
    );

    // Checkout: one session.
    faults.plan(Op::Transact, 0, Fault::timeout_after_write());
    let co = format!("/v1/invoices/{id}/checkout");
    let a = post(co.clone(), json!({}), "lost-checkout").await;
    lost("checkout", &a);
    assert_eq!(faults.injected(), 3);
    let b = post(co, json!({}), "lost-checkout").await;
    assert_eq!(b.status, 200, "{}", b.body);
    let session = s(&b.body["checkout_session_id"]);
    assert!(session.starts_with("cs_"), "{}", b.body);
    let again = c.checkout(&id, &json!({})).await;
    assert_eq!(
        again.body["checkout_session_id"],
        session.as_str(),
        "one session"
    );
    assert_eq!(again.body["reused"], true);

    // Discard: the retry answers the discard, as the first run would have.
    let d = c.draft(&simple(2_000)).await;
    let did = s(&d["id"]);
    faults.plan(Op::Transact, 0, Fault::timeout_after_write());
    let a = c.discard(&did, Some("lost-discard")).await;
    lost("discard", &a);
    assert_eq!(faults.injected(), 4);
    c.read(&did)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    let b = c.discard(&did, Some("lost-discard")).await;
    assert_eq!(
        b.status, 200,
        "the retry of a committed discard: {}",
        b.body
    );
    assert_eq!(
        b.body,
        json!({"id": did, "deleted": true, "livemode": false})
    );
    // Without the key, the draft is simply not found.
    c.discard(&did, None)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 7. Discard

async fn a_discarded_draft_is_gone(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let d = c.draft(&simple(9_900)).await;
    let id = s(&d["id"]);
    let a = c.discard(&id, None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body,
        json!({"id": id, "deleted": true, "livemode": false})
    );
    c.read(&id)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    c.discard(&id, None)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    c.finalize(&id, 1)
        .await
        .assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(c.total("").await, 0);
    // Another mode's key cannot discard it.
    let other = c.draft(&simple(9_900)).await;
    let live = c.app.key(&c.tenant, Mode::Live, &Scope::ALL).await;
    let a = c
        .app
        .post(
            &format!("/v1/invoices/{}/discard", s(&other["id"])),
            Some(&live),
            None,
            &json!({}),
        )
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(c.invoice(&s(&other["id"])).await, other);
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 8. Correction

async fn correcting_an_unpaid_invoice_voids_it_and_drafts_a_replacement(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let body = json!({
        "lines": [line("Tea, 1 kg", "2.5", 120_000), line("Delivery", "1", 15_050)],
        "dueAt": DUE, "taxRateBps": 1300, "buyer": {"name": "Sita Sharma"},
        "externalReference": "PO-9",
    });
    let issued = c.issued(&body).await;
    let id = s(&issued["id"]);
    // A draft cannot be corrected.
    let draft = c.draft(&simple(100)).await;
    c.correct(&s(&draft["id"]), "typo").await.assert_error(
        409,
        "invalid_request_error",
        "state_conflict",
    );
    // A reason is needed.
    let a = c
        .app
        .post(
            &format!("/v1/invoices/{id}/correct"),
            Some(&c.key),
            None,
            &json!({}),
        )
        .await;
    a.assert_error(400, "invalid_request_error", "validation_failed");

    let a = c.correct(&id, "wrong buyer address").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let voided = &a.body["voided"];
    let replacement = &a.body["replacement"];
    let rid = s(&replacement["id"]);
    assert!(rid.starts_with("oinv_") && rid != id, "{}", a.body);
    assert_eq!(voided["id"], id.as_str());
    assert_eq!(voided["document_status"], "void");
    assert_eq!(
        voided["invoice_number"], issued["invoice_number"],
        "a void keeps its number"
    );
    assert!(voided["voided_at"].is_string(), "{voided}");
    assert_eq!(voided["void_reason"], "wrong buyer address");
    assert_eq!(voided["corrected_by_invoice_id"], rid.as_str());
    assert_eq!(voided["version"], version(&issued) + 1);
    assert_eq!(
        voided["amount_remaining"], 0,
        "nothing to collect on a void"
    );
    assert_eq!(voided["overdue"], false);

    assert_eq!(replacement["object"], "standalone_invoice");
    assert_eq!(replacement["document_status"], "draft");
    assert_eq!(replacement["invoice_number"], Value::Null);
    assert_eq!(replacement["version"], 1);
    assert_eq!(replacement["correction_of_invoice_id"], id.as_str());
    assert_eq!(replacement["collection_status"], "unpaid");
    assert_eq!(replacement["issued_at"], Value::Null);
    for field in [
        "lines",
        "subtotal",
        "tax_total",
        "tax_rate_bps",
        "total_amount",
        "buyer",
        "due_at",
        "external_reference",
        "livemode",
    ] {
        assert_eq!(replacement[field], issued[field], "{field}");
    }
    assert_eq!(replacement["amount_remaining"], issued["total_amount"]);
    assert_eq!(replacement["amount_paid"], 0);

    // Stored as answered.
    assert_eq!(&c.invoice(&id).await, voided);
    assert_eq!(&c.invoice(&rid).await, replacement);
    // Correcting again: 409; a void cannot be finalized or paid.
    c.correct(&id, "again")
        .await
        .assert_error(409, "invalid_request_error", "state_conflict");
    c.finalize(&id, version(voided)).await.assert_error(
        409,
        "invalid_request_error",
        "state_conflict",
    );
    c.checkout(&id, &json!({}))
        .await
        .assert_error(409, "invalid_request_error", "state_conflict");
    // The replacement gets the next number.
    let f = c.finalize(&rid, 1).await;
    assert_eq!(f.status, 200, "{}", f.body);
    assert_eq!(f.body["invoice_number"], "TEST-PI-000002");
    assert_eq!(f.body["correction_of_invoice_id"], id.as_str());
    // A void is not a draft: no edit, no discard.
    c.discard(&id, None)
        .await
        .assert_error(409, "invalid_request_error", "state_conflict");
    c.patch(&id, &json!({"version": version(voided), "note": "x"}))
        .await
        .assert_error(409, "invalid_request_error", "state_conflict");

    // An open checkout nobody started is closed with the correction, so
    // nobody pays a void invoice.
    let open = c.issued(&simple(150_000)).await;
    let oid = s(&open["id"]);
    let co = c.checkout(&oid, &json!({})).await;
    assert_eq!(co.status, 200, "{}", co.body);
    let session = s(&co.body["checkout_session_id"]);
    let a = c.correct(&oid, "wrong amount").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(c.session(&session).await["status"], "expired");
    // A checkout the customer is paying at the provider blocks it.
    let busy = c.issued(&simple(150_000)).await;
    let bid = s(&busy["id"]);
    let co = c.checkout(&bid, &json!({})).await;
    let session = s(&co.body["checkout_session_id"]);
    c.start_khalti(&session).await;
    let before = c.invoice(&bid).await;
    c.correct(&bid, "wrong amount").await.assert_error(
        422,
        "invalid_request_error",
        "invoice_not_correctable",
    );
    assert_eq!(c.invoice(&bid).await, before, "nothing changed");
    assert_eq!(c.session(&session).await["status"], "initiated");
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 9. Adjustments

async fn adjustments_lower_the_balance_until_closed(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let inv = c.issued(&simple(100_000)).await;
    let id = s(&inv["id"]);
    let v = version(&inv);
    // A draft takes no adjustment.
    let d = c.draft(&simple(100)).await;
    c.adjust(&s(&d["id"]), 10, 1).await.assert_error(
        409,
        "invalid_request_error",
        "state_conflict",
    );

    let a = c.adjust(&id, 30_000, v).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["amount_adjusted"], 30_000);
    assert_eq!(a.body["amount_remaining"], 70_000);
    assert_eq!(a.body["total_amount"], 100_000, "the document is unchanged");
    assert_eq!(a.body["collection_status"], "unpaid");
    assert_eq!(a.body["version"], v + 1);
    assert_eq!(c.invoice(&id).await, a.body);

    // Stale version: 409, nothing changes.
    c.adjust(&id, 1_000, v)
        .await
        .assert_error(409, "invalid_request_error", "version_conflict");
    // Above the remaining balance, zero, negative: 400 on amount.
    for bad in [70_001, 0, -5] {
        let r = c.adjust(&id, bad, v + 1).await;
        r.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(r.body["error"]["param"], "amount", "{}", r.body);
    }
    assert_eq!(c.invoice(&id).await, a.body);

    // An adjustment retried with its Idempotency-Key counts once.
    let keyed = |version: i64| {
        let c = &c;
        let id = id.clone();
        async move {
            c.app
                .post(
                    &format!("/v1/invoices/{id}/adjustments"),
                    Some(&c.key),
                    Some("adjust-once"),
                    &json!({"amount": 5_000, "reason": "late delivery", "version": version}),
                )
                .await
        }
    };
    let k1 = keyed(v + 1).await;
    assert_eq!(k1.status, 200, "{}", k1.body);
    assert_eq!(k1.body["amount_adjusted"], 35_000);
    let k2 = keyed(v + 1).await;
    assert_replayed(&k2, &k1);
    assert_eq!(c.invoice(&id).await["amount_adjusted"], 35_000);

    // The whole remainder: closed.
    let b = c.adjust(&id, 65_000, v + 2).await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(b.body["amount_adjusted"], 100_000);
    assert_eq!(b.body["amount_remaining"], 0);
    assert_eq!(b.body["amount_paid"], 0);
    assert_eq!(b.body["collection_status"], "closed_adjusted");
    assert_eq!(b.body["document_status"], "issued");
    assert_eq!(b.body["overdue"], false);
    assert_eq!(b.body["version"], v + 3);
    // Nothing is left to adjust or collect.
    let r = c.adjust(&id, 1, v + 3).await;
    r.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(r.body["error"]["param"], "amount", "{}", r.body);
    c.checkout(&id, &json!({}))
        .await
        .assert_error(409, "invalid_request_error", "state_conflict");
    assert_eq!(c.total("?collection_status=closed_adjusted").await, 1);
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 10. Collection

/// NPR 1,500: above Khalti's minimum.
const PAY_AMOUNT: i64 = 150_000;

async fn a_khalti_payment_through_the_invoice_checkout_pays_it(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let inv = c.issued(&simple(PAY_AMOUNT)).await;
    let id = s(&inv["id"]);
    // Drafts have no checkout.
    let d = c.draft(&simple(PAY_AMOUNT)).await;
    c.checkout(&s(&d["id"]), &json!({})).await.assert_error(
        409,
        "invalid_request_error",
        "state_conflict",
    );

    let a = c.checkout(&id, &json!({})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let session = s(&a.body["checkout_session_id"]);
    assert!(session.starts_with("cs_"), "{}", a.body);
    assert_eq!(
        a.body["checkout_url"],
        format!("{}/c/{session}", c.app.base)
    );
    assert_eq!(a.body["reused"], false);
    let keys: BTreeSet<&str> = a
        .body
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        BTreeSet::from(["checkout_session_id", "checkout_url", "reused"])
    );
    // Again: the same open session.
    let b = c.checkout(&id, &json!({})).await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(b.body["checkout_session_id"], session.as_str());
    assert_eq!(b.body["reused"], true);
    // No body at all is an empty choice too.
    let nb = c
        .send(
            reqwest::Method::POST,
            &format!("/v1/invoices/{id}/checkout"),
            None,
            None,
        )
        .await;
    assert_eq!(nb.status, 200, "{}", nb.body);
    assert_eq!(nb.body["checkout_session_id"], session.as_str());
    // Unknown provider or property: 400.
    let bad = c.checkout(&id, &json!({"provider": "paypal"})).await;
    bad.assert_error(400, "invalid_request_error", "validation_failed");
    assert_eq!(bad.body["error"]["param"], "provider", "{}", bad.body);
    c.checkout(&id, &json!({"colour": "red"}))
        .await
        .assert_error(400, "invalid_request_error", "validation_failed");
    // The session is for the balance.
    let sess = c
        .app
        .get(&format!("/v1/sessions/{session}"), Some(&c.key))
        .await;
    assert_eq!(sess.status, 200, "{}", sess.body);
    assert_eq!(sess.body["amount"], PAY_AMOUNT, "{}", sess.body);

    // The customer pays with Khalti.
    let payment = c.pay_with_khalti(&session).await;
    let paid = c.invoice(&id).await;
    assert_eq!(paid["amount_paid"], PAY_AMOUNT, "{paid}");
    assert_eq!(paid["amount_remaining"], 0, "{paid}");
    assert_eq!(paid["amount_excess"], 0, "{paid}");
    assert_eq!(paid["collection_status"], "paid", "{paid}");
    assert_eq!(paid["needs_attention"], false, "{paid}");
    assert_eq!(paid["document_status"], "issued", "{paid}");
    assert_eq!(paid["overdue"], false, "{paid}");
    assert!(
        version(&paid) > version(&inv),
        "a payment bumps the version"
    );
    let p = c
        .app
        .get(&format!("/v1/payments/{payment}"), Some(&c.key))
        .await;
    assert_eq!(p.body["status"], "success", "{}", p.body);
    assert_eq!(p.body["amount"], PAY_AMOUNT, "{}", p.body);
    let events = c.events_about("invoice.paid", &id).await;
    assert_eq!(events.len(), 1, "one invoice.paid event");
    assert_eq!(events[0].object["collection_status"], "paid");
    assert_eq!(events[0].object["amount_paid"], PAY_AMOUNT);
    assert_eq!(events[0].object["object"], "standalone_invoice");
    assert!(!events[0].mode.is_live());
    assert_eq!(c.total("?collection_status=paid").await, 1);

    // Paid: nothing left to collect, and correction is blocked.
    c.checkout(&id, &json!({}))
        .await
        .assert_error(409, "invalid_request_error", "state_conflict");
    let a = c.correct(&id, "too late").await;
    a.assert_error(422, "invalid_request_error", "invoice_not_correctable");
    assert_eq!(
        c.invoice(&id).await,
        paid,
        "a refused correction changes nothing"
    );

    // A provider choice opens a session for that provider, then reuses it.
    let other = c.issued(&simple(PAY_AMOUNT)).await;
    let oid = s(&other["id"]);
    let k1 = c.checkout(&oid, &json!({"provider": "khalti"})).await;
    assert_eq!(k1.status, 200, "{}", k1.body);
    assert_eq!(k1.body["reused"], false);
    let k2 = c.checkout(&oid, &json!({"provider": "khalti"})).await;
    assert_eq!(
        k2.body["checkout_session_id"],
        k1.body["checkout_session_id"]
    );
    assert_eq!(k2.body["reused"], true);
    let ks = c
        .app
        .get(
            &format!("/v1/sessions/{}", s(&k1.body["checkout_session_id"])),
            Some(&c.key),
        )
        .await;
    assert_eq!(ks.body["provider"], "khalti", "{}", ks.body);
    // Khalti takes at least NPR 10: a balance below it cannot be
    // collected through Khalti (a business rule, nothing to fix in the
    // request), and no session is opened.
    let small = c.issued(&simple(500)).await;
    let sid = s(&small["id"]);
    let a = c.checkout(&sid, &json!({"provider": "khalti"})).await;
    a.assert_error(422, "invalid_request_error", "invoice_not_collectable");
    let a = c.checkout(&sid, &json!({})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body["reused"], false,
        "the refused checkout opened nothing"
    );
    c.stop().await;
}

async fn adjustments_then_payments_close_or_leave_an_excess(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    // An adjustment first, then the remainder paid.
    let inv = c.issued(&simple(200_000)).await;
    let id = s(&inv["id"]);
    let a = c.adjust(&id, 50_000, version(&inv)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let co = c.checkout(&id, &json!({})).await;
    assert_eq!(co.status, 200, "{}", co.body);
    let session = s(&co.body["checkout_session_id"]);
    let sess = c
        .app
        .get(&format!("/v1/sessions/{session}"), Some(&c.key))
        .await;
    assert_eq!(
        sess.body["amount"], 150_000,
        "the checkout is for the balance"
    );
    c.pay_with_khalti(&session).await;
    let after = c.invoice(&id).await;
    assert_eq!(after["amount_paid"], 150_000, "{after}");
    assert_eq!(after["amount_adjusted"], 50_000, "{after}");
    assert_eq!(after["amount_remaining"], 0, "{after}");
    assert_eq!(after["amount_excess"], 0, "{after}");
    assert_eq!(after["needs_attention"], false, "{after}");
    assert_eq!(after["collection_status"], "closed_adjusted", "{after}");

    // An adjustment closes the open checkout (its amount is stale); the
    // next checkout is for the new balance.
    let inv = c.issued(&simple(300_000)).await;
    let id = s(&inv["id"]);
    let co = c.checkout(&id, &json!({})).await;
    assert_eq!(co.status, 200, "{}", co.body);
    let stale = s(&co.body["checkout_session_id"]);
    let now = c.invoice(&id).await;
    let a = c.adjust(&id, 40_000, version(&now)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["amount_remaining"], 260_000);
    assert_eq!(c.session(&stale).await["status"], "expired");
    let co = c.checkout(&id, &json!({})).await;
    assert_eq!(co.body["reused"], false, "{}", co.body);
    let session = s(&co.body["checkout_session_id"]);
    assert_ne!(session, stale);
    assert_eq!(c.session(&session).await["amount"], 260_000);

    // Paid twice: the customer starts paying at Khalti, the merchant
    // expires that checkout and opens another, which is paid; then the
    // first payment completes at Khalti after all. That money is taken:
    // it lands in the excess and the invoice needs attention.
    let first = c.start_khalti(&session).await;
    assert_eq!(c.session(&session).await["status"], "initiated");
    let exp = c
        .app
        .post(
            &format!("/v1/checkout/{session}/expire"),
            Some(&c.key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(exp.status, 200, "{}", exp.body);
    assert_eq!(exp.body["status"], "expired", "{}", exp.body);
    let co = c.checkout(&id, &json!({})).await;
    assert_eq!(co.status, 200, "{}", co.body);
    let second = s(&co.body["checkout_session_id"]);
    assert_ne!(second, session);
    c.pay_with_khalti(&second).await;
    let paid = c.invoice(&id).await;
    assert_eq!(paid["amount_paid"], 260_000, "{paid}");
    assert_eq!(paid["amount_excess"], 0, "{paid}");
    assert_eq!(paid["needs_attention"], false, "{paid}");
    // The first payment completes late.
    c.finish_khalti(&session, &first).await;
    let after = c.invoice(&id).await;
    assert_eq!(after["amount_paid"], 260_000, "{after}");
    assert_eq!(after["amount_excess"], 260_000, "{after}");
    assert_eq!(after["amount_adjusted"], 40_000, "{after}");
    assert_eq!(after["amount_remaining"], 0, "{after}");
    assert_eq!(after["needs_attention"], true, "{after}");
    assert_eq!(after["document_status"], "issued", "{after}");
    c.correct(&id, "excess").await.assert_error(
        422,
        "invalid_request_error",
        "invoice_not_correctable",
    );
    c.stop().await;
}

async fn part_payments_and_overdue_follow_the_balance(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    // Past due, unpaid: overdue once issued (a draft is never overdue).
    let past = json!({"lines": [line("Rent", "1", 100_000)], "dueAt": "2020-01-31T00:00:00Z"});
    let d = c.draft(&past).await;
    assert_eq!(d["overdue"], false, "{d}");
    let f = c.finalize(&s(&d["id"]), 1).await;
    assert_eq!(f.status, 200, "{}", f.body);
    assert_eq!(f.body["overdue"], true, "{}", f.body);
    let id = s(&f.body["id"]);
    assert_eq!(c.invoice(&id).await["overdue"], true);
    // Not yet due: not overdue.
    let future = c.issued(&simple(100_000)).await;
    assert_eq!(future["overdue"], false);

    // A part payment (allocated as the settlement does) leaves it part
    // paid and still overdue.
    let store = &*c.app.store;
    let state = c.app.state();
    let deps = &state;
    let project = c.project();
    let idr = id.as_str();
    let allocate = |amount: i64, payment: &'static str| async move {
        let Ok(inv) = invoices::get(
            deps,
            &shared::domain::Tenant::new(project.clone(), Mode::Sandbox),
            &idr.into(),
        )
        .await
        else {
            panic!("invoice {idr}")
        };
        let ops = match invoices::allocation_ops(&inv, &payment.into(), amount, SystemClock.now()) {
            Ok(o) => o,
            Err(e) => panic!("allocation: {e}"),
        };
        if let Err(e) = store.transact(ops).await {
            panic!("allocation: {e}")
        }
    };
    allocate(40_000, "pay_01ARZ3NDEKTSV4RRFFQ69G5FAA").await;
    let part = c.invoice(&id).await;
    assert_eq!(part["collection_status"], "part_paid", "{part}");
    assert_eq!(part["amount_paid"], 40_000);
    assert_eq!(part["amount_remaining"], 60_000);
    assert_eq!(part["overdue"], true);
    assert_eq!(c.total("?collection_status=part_paid").await, 1);
    // A part-paid invoice cannot be corrected.
    c.correct(&id, "typo").await.assert_error(
        422,
        "invalid_request_error",
        "invoice_not_correctable",
    );
    // The rest: paid, no longer overdue.
    allocate(60_000, "pay_01ARZ3NDEKTSV4RRFFQ69G5FAB").await;
    let paid = c.invoice(&id).await;
    assert_eq!(paid["collection_status"], "paid", "{paid}");
    assert_eq!(paid["amount_remaining"], 0);
    assert_eq!(paid["overdue"], false);
    assert_eq!(paid["needs_attention"], false);
    assert_eq!(c.events_about("invoice.paid", &id).await.len(), 1);
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 11. Lists and reads

async fn lists_are_newest_first_filtered_and_scoped(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let mut ids = Vec::new();
    for i in 0..27 {
        let d = c.draft(&simple(1_000 + i)).await;
        ids.push(s(&d["id"]));
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    let page = c.list("").await;
    let got: Vec<String> = page["data"]
        .as_array()
        .map(|d| d.iter().map(|i| s(&i["id"])).collect())
        .unwrap_or_default();
    assert_eq!(
        got,
        newest_first[..25].to_vec(),
        "newest first, 25 by default"
    );
    assert_eq!(page["meta"], json!({"total": 27, "limit": 25, "offset": 0}));
    assert_eq!(page["data"][0]["object"], "standalone_invoice");
    let page = c.list("?limit=5&offset=5").await;
    let got: Vec<String> = page["data"]
        .as_array()
        .map(|d| d.iter().map(|i| s(&i["id"])).collect())
        .unwrap_or_default();
    assert_eq!(got, newest_first[5..10].to_vec());
    assert_eq!(page["meta"], json!({"total": 27, "limit": 5, "offset": 5}));
    let page = c.list("?offset=25").await;
    assert_eq!(page["data"].as_array().map(Vec::len), Some(2));

    // Two issued (one adjusted to closed), one void.
    let f1 = c.finalize(&ids[0], 1).await;
    assert_eq!(f1.status, 200, "{}", f1.body);
    let f2 = c.finalize(&ids[1], 1).await;
    assert_eq!(f2.status, 200, "{}", f2.body);
    let f3 = c.finalize(&ids[2], 1).await;
    assert_eq!(f3.status, 200, "{}", f3.body);
    let closed = c.adjust(&ids[1], 1_001, 2).await;
    assert_eq!(
        closed.body["collection_status"], "closed_adjusted",
        "{}",
        closed.body
    );
    let corr = c.correct(&ids[2], "typo").await;
    assert_eq!(corr.status, 200, "{}", corr.body);
    // 27 + the replacement draft.
    assert_eq!(c.total("").await, 28);
    assert_eq!(c.total("?document_status=issued").await, 2);
    assert_eq!(c.total("?document_status=void").await, 1);
    assert_eq!(c.total("?document_status=draft").await, 25);
    assert_eq!(c.total("?collection_status=closed_adjusted").await, 1);
    assert_eq!(c.total("?collection_status=unpaid").await, 27);
    assert_eq!(
        c.total("?document_status=issued&collection_status=unpaid")
            .await,
        1
    );
    let issued = c.list("?document_status=issued").await;
    let got: Vec<String> = issued["data"]
        .as_array()
        .map(|d| d.iter().map(|i| s(&i["id"])).collect())
        .unwrap_or_default();
    assert_eq!(
        got,
        vec![ids[1].clone(), ids[0].clone()],
        "filtered, newest first"
    );
    for q in [
        "?document_status=paid",
        "?collection_status=void",
        "?document_status=DRAFT",
        "?document_status=",
        "?collection_status=",
    ] {
        let a = c.app.get(&format!("/v1/invoices{q}"), Some(&c.key)).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        let want = if q.contains("collection") {
            "collection_status"
        } else {
            "document_status"
        };
        assert_eq!(a.body["error"]["param"], want, "{q}: {}", a.body);
    }
    for q in ["?limit=0", "?limit=101", "?offset=-1", "?limit=x"] {
        let a = c.app.get(&format!("/v1/invoices{q}"), Some(&c.key)).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
    }

    // Another mode, another project: not found, not listed.
    let live = c.app.key(&c.tenant, Mode::Live, &Scope::ALL).await;
    let a = c
        .app
        .get(&format!("/v1/invoices/{}", ids[0]), Some(&live))
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    let a = c
        .app
        .get(&format!("/v1/invoices/{}/pdf", ids[0]), Some(&live))
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    let a = c.app.get("/v1/invoices", Some(&live)).await;
    assert_eq!(a.body["meta"]["total"], 0, "{}", a.body);
    let stranger = c.app.tenant("Other Shop", "owner@other.example").await;
    let skey = c.app.key(&stranger, Mode::Sandbox, &Scope::ALL).await;
    let a = c
        .app
        .get(&format!("/v1/invoices/{}", ids[0]), Some(&skey))
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    let a = c
        .app
        .post(
            &format!("/v1/invoices/{}/finalize", ids[3]),
            Some(&skey),
            None,
            &json!({"version": 1}),
        )
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(c.invoice(&ids[3]).await["document_status"], "draft");

    // Scopes.
    let read_only = c
        .app
        .key(&c.tenant, Mode::Sandbox, &[Scope::InvoicesRead])
        .await;
    let a = c.app.get("/v1/invoices", Some(&read_only)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = c.create_with(&read_only, &simple(100)).await;
    a.assert_error(403, "permission_error", "missing_scope");
    assert!(
        s(&a.body["error"]["message"]).contains("invoices:write"),
        "{}",
        a.body
    );
    let a = c.finalize_with(&read_only, &ids[3], 1).await;
    a.assert_error(403, "permission_error", "missing_scope");
    let payments_only = c
        .app
        .key(&c.tenant, Mode::Sandbox, &[Scope::PaymentsRead])
        .await;
    let a = c.app.get("/v1/invoices", Some(&payments_only)).await;
    a.assert_error(403, "permission_error", "missing_scope");
    let a = c
        .app
        .get(&format!("/v1/invoices/{}", ids[0]), Some(&payments_only))
        .await;
    a.assert_error(403, "permission_error", "missing_scope");
    let a = c.app.get("/v1/invoices", None).await;
    a.assert_error(401, "authentication_error", "api_key_invalid");
    assert_eq!(c.total("").await, 28, "the refused writes created nothing");
    c.stop().await;
}

// ---------------------------------------------------------------------------
// 12. PDF

/// The text of a PDF, through `pdftotext` (`DHUKUTI_PDFTOTEXT` or PATH),
/// with runs of whitespace made single spaces.
fn pdf_text(bytes: &[u8]) -> String {
    let tool = std::env::var("DHUKUTI_PDFTOTEXT").unwrap_or_else(|_| "pdftotext".into());
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let path = dir.path().join("invoice.pdf");
    if let Err(e) = std::fs::write(&path, bytes) {
        panic!("write pdf: {e}")
    }
    let out = std::process::Command::new(&tool)
        .arg("-layout")
        .arg(&path)
        .arg("-")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            panic!("{tool} did not run ({e}): install poppler-utils or set DHUKUTI_PDFTOTEXT")
        }
    };
    assert!(
        out.status.success(),
        "{tool} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

async fn pdf(c: &Ctx, id: &str) -> (u16, String, Vec<u8>) {
    let res = c
        .app
        .client
        .get(c.app.url(&format!("/v1/invoices/{id}/pdf")))
        .bearer_auth(&c.key)
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    let res = match res {
        Ok(r) => r,
        Err(e) => panic!("pdf: {e}"),
    };
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = res.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
    (status, ct, bytes)
}

async fn issued_invoices_have_a_pdf(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let seller = Seller {
        name: Some("Patan Prints".into()),
        legal_name: Some("Patan Prints Pvt. Ltd.".into()),
        email: Some("billing@prints.example".into()),
        logo_url: None,
        brand_color: None,
    };
    if let Err(e) = account::set_seller(&*c.app.store, c.project(), Some(&seller)).await {
        panic!("set_seller: {e}")
    }
    let body = json!({
        "lines": [line("Tea, 1 kg", "2.5", 120_000), line("Delivery", "1", 15_050)],
        "dueAt": DUE, "taxRateBps": 1300,
        "buyer": {"name": "Sita Sharma", "email": "sita@example.com"},
    });
    let d = c.draft(&body).await;
    let id = s(&d["id"]);
    let a = c
        .app
        .get(&format!("/v1/invoices/{id}/pdf"), Some(&c.key))
        .await;
    a.assert_error(409, "invalid_request_error", "state_conflict");

    let f = c.finalize(&id, version(&d)).await;
    assert_eq!(f.status, 200, "{}", f.body);
    let number = s(&f.body["invoice_number"]);
    let total = int(&f.body, "total_amount");
    assert_eq!(total, 356_007);
    let (status, ct, bytes) = pdf(&c, &id).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert!(ct.starts_with("application/pdf"), "{ct}");
    assert!(bytes.starts_with(b"%PDF"), "not a PDF");
    let text = pdf_text(&bytes);
    let money = shared::pdf::npr(total);
    for want in [
        number.as_str(),
        "Sita Sharma",
        money.as_str(),
        "Patan Prints",
    ] {
        assert!(text.contains(want), "{want:?} in the PDF text: {text}");
    }
    assert!(
        !text.contains("VOID"),
        "an issued invoice is not void: {text}"
    );
    // Read again: the same document.
    let (_, _, again) = pdf(&c, &id).await;
    assert_eq!(pdf_text(&again), text);

    // Voided: its PDF says so.
    let corr = c.correct(&id, "wrong amount").await;
    assert_eq!(corr.status, 200, "{}", corr.body);
    let (status, ct, bytes) = pdf(&c, &id).await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("application/pdf"), "{ct}");
    assert!(bytes.starts_with(b"%PDF"));
    let void_text = pdf_text(&bytes);
    assert!(void_text.contains("VOID"), "{void_text}");
    assert!(void_text.contains(&number), "{void_text}");
    // The replacement is a draft: no PDF yet.
    let rid = s(&corr.body["replacement"]["id"]);
    let a = c
        .app
        .get(&format!("/v1/invoices/{rid}/pdf"), Some(&c.key))
        .await;
    a.assert_error(409, "invalid_request_error", "state_conflict");
    c.stop().await;
}

/// An invoice checkout takes payments: it needs `payments:write` as well
/// as `invoices:write`, and counts toward the calling key's spend cap like
/// `POST /v1/checkout` (a reused checkout is not counted again).
async fn an_invoice_checkout_needs_payments_write_and_honours_the_spend_cap(which: Which) {
    let Some(c) = Ctx::open(which).await else {
        return;
    };
    let inv = c.issued(&simple(40_000)).await;
    let id = s(&inv["id"]);
    let path = format!("/v1/invoices/{id}/checkout");
    let invoices_only = c
        .app
        .key(
            &c.tenant,
            Mode::Sandbox,
            &[Scope::InvoicesRead, Scope::InvoicesWrite],
        )
        .await;
    let a = c
        .app
        .post(&path, Some(&invoices_only), None, &json!({}))
        .await;
    a.assert_error(403, "permission_error", "missing_scope");
    assert!(
        s(&a.body["error"]["message"]).contains("payments:write"),
        "{}",
        a.body
    );
    let scopes = [
        Scope::InvoicesWrite,
        Scope::PaymentsWrite,
        Scope::SessionsRead,
    ];
    let small = c
        .app
        .key_with_cap(&c.tenant, Mode::Sandbox, &scopes, Some(39_999))
        .await;
    let a = c.app.post(&path, Some(&small), None, &json!({})).await;
    a.assert_error(403, "permission_error", "spend_cap_exceeded");
    let listed = c.app.get("/v1/sessions", Some(&small)).await;
    assert_eq!(listed.body["meta"]["total"], 0, "nothing was opened");

    let capped = c
        .app
        .key_with_cap(&c.tenant, Mode::Sandbox, &scopes, Some(50_000))
        .await;
    let a = c.app.post(&path, Some(&capped), None, &json!({})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["reused"], false);
    // Reused: not charged again.
    let again = c.app.post(&path, Some(&capped), None, &json!({})).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["reused"], true);
    // 40,000 of the 50,000 are used: a checkout of 10,001 is over.
    let over = json!({"amount": 10_001, "returnUrl": "https://shop.example/t"});
    let a = c.app.post("/v1/checkout", Some(&capped), None, &over).await;
    a.assert_error(403, "permission_error", "spend_cap_exceeded");
    let fits = json!({"amount": 10_000, "returnUrl": "https://shop.example/t"});
    let a = c.app.post("/v1/checkout", Some(&capped), None, &fits).await;
    assert_eq!(a.status, 201, "{}", a.body);
    c.stop().await;
}

on_both_backends!(
    an_invoice_checkout_needs_payments_write_and_honours_the_spend_cap,
    a_draft_has_every_field_and_exact_totals,
    invalid_creates_are_400_naming_the_field,
    live_invoices_need_live_invoicing_and_take_pi_numbers,
    concurrent_finalizes_over_http_take_gapless_numbers,
    concurrent_domain_finalizes_without_the_process_lock_stay_gapless,
    versions_lock_edits_and_states_guard_transitions,
    invoice_writes_are_idempotent,
    a_retry_after_a_lost_answer_finds_the_first_write,
    a_discarded_draft_is_gone,
    correcting_an_unpaid_invoice_voids_it_and_drafts_a_replacement,
    adjustments_lower_the_balance_until_closed,
    a_khalti_payment_through_the_invoice_checkout_pays_it,
    adjustments_then_payments_close_or_leave_an_excess,
    part_payments_and_overdue_follow_the_balance,
    lists_are_newest_first_filtered_and_scoped,
    issued_invoices_have_a_pdf,
);
