//! Refunds end to end over HTTP, on both backends: real payments taken
//! through the hosted pages and the providers' simulators (an HTTP client
//! playing the customer's browser, as in `pay.rs`), then refunded through
//! `POST /v1/refunds`.
//!
//! Khalti refunds call the Khalti simulator's refund API once; its control
//! API scripts a rejection, a timeout (applied, answered late) and a 5xx
//! (nothing applied), and counts the refund calls. eSewa refunds wait for
//! the merchant (`requires_action`); Fonepay refunds are refused.
//!
//! The concurrency proof: 50 refunds of 30% at once reserve exactly three,
//! and 50 retries of one request under one `Idempotency-Key` create one.
//!
//! Every wait is bounded (no poll here: refunds answer once decided, and
//! the sweep is called directly).

use std::time::{Duration, Instant};

use dhukuti_tests::browser::text;
use dhukuti_tests::shop::{self, Via};
use dhukuti_tests::{Answer, Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::attempts::SweepReport;
use shared::ids::{IdKind, new_id};
use shared::time::{Clock, SystemClock};

/// NPR 1,000.
const AMOUNT: i64 = 100_000;
/// NPR 500: under the sandbox Fonepay limit of NPR 1,000 a payment.
const FONEPAY_AMOUNT: i64 = 50_000;
/// Concurrent requests in the race tests.
const RACERS: usize = 50;

// ---------------------------------------------------------------------------
// The shop: one merchant, its API key, and one customer

/// The shared shop (`dhukuti_tests::shop`) with this file's flows.
struct Shop(shop::Shop);

impl std::ops::Deref for Shop {
    type Target = shop::Shop;

    fn deref(&self) -> &shop::Shop {
        &self.0
    }
}

impl Shop {
    async fn open(which: Which) -> Option<Shop> {
        Some(Shop(shop::Shop::on(spawn_app(which).await?).await))
    }

    async fn stop(self) {
        self.0.stop().await;
    }

    // --- payments, taken for real

    /// `POST /v1/checkout`: the new session's id.
    async fn checkout(&self, amount: i64) -> String {
        text(&self.create_checkout(amount).await["id"])
    }

    /// The payment's status and refunded total, as the API shows them.
    async fn payment_refunded(&self, id: &str) -> (String, i64) {
        let p = self.payment(id).await;
        (
            text(&p["status"]),
            p["amountRefunded"].as_i64().unwrap_or(-1),
        )
    }

    // --- refunds, through the API

    /// `POST /v1/refunds` with the shop's key.
    async fn refund(&self, body: &Value, idempotency_key: Option<&str>) -> Answer {
        self.app
            .post("/v1/refunds", Some(&self.key), idempotency_key, body)
            .await
    }

    /// A refund of `amount` of `payment` that must be created (201): the
    /// refund as answered.
    async fn refunded(&self, payment: &str, amount: i64) -> Value {
        let a = self
            .refund(
                &json!({"paymentId": payment, "amount": amount, "reason": "customer_request"}),
                None,
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
        assert_refund_shape(&a.body, payment, amount);
        a.body
    }

    async fn get_refund(&self, id: &str) -> Value {
        let a = self
            .app
            .get(&format!("/v1/refunds/{id}"), Some(&self.key))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        a.body
    }

    /// `GET /v1/refunds?paymentId=…&limit=100`: the refunds and the total.
    async fn refunds_of(&self, payment: &str) -> (Vec<Value>, u64) {
        let a = self
            .app
            .get(
                &format!("/v1/refunds?paymentId={payment}&limit=100"),
                Some(&self.key),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        let data = a.body["data"].as_array().cloned().unwrap_or_default();
        let total = a.body["meta"]["total"].as_u64().unwrap_or(u64::MAX);
        (data, total)
    }

    /// A scheduler pass two minutes after the last one (so every open
    /// refund is past its minute).
    async fn sweep(&self) -> SweepReport {
        // Past the time a refund waits before the sweep asks Khalti.
        self.sweep_after(shared::domain::refunds::RESOLVE_AFTER)
            .await
    }

    /// A scheduler pass `wait` (and a few minutes more) from now.
    async fn sweep_after(&self, wait: chrono::Duration) -> SweepReport {
        let n = self
            .sweeps
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let at = SystemClock
            .now()
            .plus(wait)
            .plus(chrono::Duration::minutes(1 + 2 * n));
        self.app.sweep(at).await
    }

    // --- the Khalti simulator's control API

    /// Scripts the next refund call of `payment` at Khalti.
    async fn script_refund(&self, payment: &str, outcome: &str) {
        let reference = self.reference(payment).await;
        let body = json!({"outcome": outcome, "on": "refund", "reference": reference});
        self.script("khalti", body).await;
    }

    /// Khalti's view of the payment (`refund_calls`, `refunded_paisa`,
    /// `refunds`, `status`).
    async fn at_khalti(&self, payment: &str) -> Value {
        let reference = self.reference(payment).await;
        let res = self
            .app
            .client
            .get(self.sim(&format!("/khalti/_control/attempts/{reference}")))
            .send()
            .await;
        match res {
            Ok(r) => {
                let status = r.status();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                assert!(status.is_success(), "control attempts: {status} {body}");
                body
            }
            Err(e) => panic!("control attempts: {e}"),
        }
    }

    /// Khalti's refund calls for the payment, and the paisa it refunded.
    async fn khalti_refunds(&self, payment: &str) -> (u64, i64) {
        let a = self.at_khalti(payment).await;
        (
            a["refund_calls"].as_u64().unwrap_or(u64::MAX),
            a["refunded_paisa"].as_i64().unwrap_or(-1),
        )
    }
}

/// The refund view carries the spec's fields with the request's values.
fn assert_refund_shape(r: &Value, payment: &str, amount: i64) {
    assert!(text(&r["id"]).starts_with("ref_"), "{r}");
    assert_eq!(r["livemode"], false, "{r}");
    assert_eq!(r["mode"], "sandbox", "{r}");
    assert_eq!(r["paymentId"], payment, "{r}");
    assert!(text(&r["projectId"]).starts_with("proj_"), "{r}");
    assert_eq!(r["amount"], amount, "{r}");
    assert_eq!(r["currency"], "NPR", "{r}");
    for f in ["reason", "status", "createdAt", "updatedAt"] {
        assert!(r.get(f).is_some(), "{f} missing: {r}");
    }
    // Typed without "or null": set, or omitted.
    for f in ["providerRefundId", "failureReason", "notes", "mobileNumber"] {
        assert_ne!(r.get(f), Some(&Value::Null), "{f} is null: {r}");
    }
}

/// A JSON field that must be a non-empty string.
fn non_empty(v: &Value, field: &str) -> String {
    let s = text(&v[field]);
    assert!(!s.is_empty(), "{field} must be a non-empty string: {v}");
    s
}

// ---------------------------------------------------------------------------
// 1. A partial Khalti refund, then the rest

async fn khalti_partial_then_full_refund(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Khalti, AMOUNT).await;

    // 30%: Khalti refunds part; the payment stays `success`.
    let body = json!({
        "paymentId": payment,
        "amount": 30_000,
        "reason": "customer_request",
        "notes": "  size did not fit  ",
    });
    let first = shop.refund(&body, Some("refund-30")).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let r1 = first.body;
    assert_refund_shape(&r1, &payment, 30_000);
    assert_eq!(r1["status"], "succeeded", "{r1}");
    assert_eq!(r1["reason"], "customer_request", "{r1}");
    assert_eq!(r1["notes"], "size did not fit", "{r1}");
    assert_eq!(r1["failureReason"], Value::Null, "{r1}");
    assert_eq!(r1["projectId"], shop.tenant.project.id.as_str(), "{r1}");
    non_empty(&r1, "providerRefundId");
    let id1 = text(&r1["id"]);
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("success".into(), 30_000)
    );
    assert_eq!(shop.get_refund(&id1).await, r1);
    let (listed, total) = shop.refunds_of(&payment).await;
    assert_eq!(total, 1);
    assert_eq!(listed, vec![r1.clone()]);
    let all = shop.app.get("/v1/refunds", Some(&shop.key)).await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(all.body["meta"]["total"], 1, "{}", all.body);
    assert_eq!(all.body["meta"]["limit"], 10, "{}", all.body);
    assert_eq!(all.body["meta"]["offset"], 0, "{}", all.body);
    assert_eq!(all.body["data"][0]["id"], id1.as_str(), "{}", all.body);
    assert_eq!(shop.events_about("refund.succeeded", &id1).await, 1);
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 0);
    let k = shop.at_khalti(&payment).await;
    assert_eq!(k["refund_calls"], 1, "{k}");
    assert_eq!(k["refunded_paisa"], 30_000, "{k}");
    assert_eq!(k["status"], "Partially Refunded", "{k}");

    // The remaining 70%: the payment is `refunded`, announced once.
    let r2 = shop.refunded(&payment, 70_000).await;
    assert_eq!(r2["status"], "succeeded", "{r2}");
    let id2 = text(&r2["id"]);
    assert_ne!(id1, id2);
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("refunded".into(), AMOUNT)
    );
    assert_eq!(shop.events_about("refund.succeeded", &id2).await, 1);
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 1);
    let k = shop.at_khalti(&payment).await;
    assert_eq!(k["refund_calls"], 2, "{k}");
    assert_eq!(k["refunded_paisa"], AMOUNT, "{k}");
    assert_eq!(k["status"], "Refunded", "{k}");
    let (listed, total) = shop.refunds_of(&payment).await;
    assert_eq!(total, 2);
    let ids: Vec<String> = listed.iter().map(|r| text(&r["id"])).collect();
    assert!(ids.contains(&id1) && ids.contains(&id2), "{ids:?}");

    // The event carries the payment as refunded.
    let refunded_event = shop.events().await.into_iter().find(|e| {
        serde_json::to_value(e.event_type).ok() == Some(json!("payment.refunded"))
            && e.object["id"] == payment.as_str()
    });
    match refunded_event {
        Some(e) => {
            assert_eq!(e.object["status"], "refunded", "{}", e.object);
            assert_eq!(e.object["amountRefunded"], AMOUNT, "{}", e.object);
        }
        None => panic!("no payment.refunded event"),
    }

    // Nothing is left.
    let again = shop
        .refund(
            &json!({"paymentId": payment, "amount": 1, "reason": "other"}),
            None,
        )
        .await;
    again.assert_error(422, "invalid_request_error", "payment_not_refundable");
    assert_eq!(again.body["error"]["param"], "paymentId", "{}", again.body);
    assert_eq!(shop.refunds_of(&payment).await.1, 2);
    assert_eq!(shop.khalti_refunds(&payment).await, (2, AMOUNT));
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 1);
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 2. The concurrency proof

async fn concurrent_refunds_never_exceed_the_payment(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Khalti, AMOUNT).await;

    // 50 refunds of 30% at once, each its own request: three fit.
    let body = json!({"paymentId": payment, "amount": 30_000, "reason": "duplicate"});
    let started = Instant::now();
    let answers = futures::future::join_all((0..RACERS).map(|i| {
        let body = body.clone();
        let shop = &shop;
        async move {
            shop.refund(&body, Some(&format!("race-{i}-{}", new_id(IdKind::Event))))
                .await
        }
    }))
    .await;
    let mut accepted = Vec::new();
    let mut refused = 0;
    let mut other = Vec::new();
    for a in &answers {
        match a.status {
            201 => accepted.push(a.body.clone()),
            422 if a.body["error"]["code"] == "refund_exceeds_balance" => {
                a.assert_error(422, "invalid_request_error", "refund_exceeds_balance");
                assert_eq!(a.body["error"]["param"], "amount", "{}", a.body);
                refused += 1;
            }
            s => other.push(format!("{s} {}", a.body)),
        }
    }
    assert!(other.is_empty(), "unexpected answers: {other:#?}");
    assert_eq!(
        accepted.len(),
        3,
        "accepted {accepted:#?} after {:?}",
        started.elapsed()
    );
    assert_eq!(refused, RACERS - 3);
    eprintln!(
        "{RACERS} refunds of 30% at once: 3 accepted, {refused} refused in {:?}",
        started.elapsed()
    );
    let mut ids: Vec<String> = accepted.iter().map(|r| text(&r["id"])).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    for r in &accepted {
        assert_refund_shape(r, &payment, 30_000);
        assert_eq!(r["status"], "succeeded", "{r}");
    }
    let sum: i64 = accepted.iter().filter_map(|r| r["amount"].as_i64()).sum();
    assert_eq!(sum, 90_000);
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("success".into(), 90_000)
    );
    let (listed, total) = shop.refunds_of(&payment).await;
    assert_eq!(total, 3);
    let mut listed_ids: Vec<String> = listed.iter().map(|r| text(&r["id"])).collect();
    listed_ids.sort();
    assert_eq!(listed_ids, ids);
    assert_eq!(shop.khalti_refunds(&payment).await, (3, 90_000));
    for id in &ids {
        assert_eq!(shop.events_about("refund.succeeded", id).await, 1, "{id}");
    }

    // 50 copies of one request (one key, one body) for the last 10%: one
    // refund. Each copy is answered that refund, or 409 while the first
    // is in flight.
    let body = json!({"paymentId": payment, "amount": 10_000, "reason": "duplicate"});
    let answers = futures::future::join_all((0..RACERS).map(|_| {
        let body = body.clone();
        let shop = &shop;
        async move { shop.refund(&body, Some("one-retried-request")).await }
    }))
    .await;
    let mut same = Vec::new();
    let mut conflicts = 0;
    let mut other = Vec::new();
    for a in &answers {
        match a.status {
            201 => same.push(a.body.clone()),
            409 => {
                a.assert_error(409, "idempotency_error", "idempotency_conflict");
                conflicts += 1;
            }
            s => other.push(format!("{s} {}", a.body)),
        }
    }
    assert!(other.is_empty(), "unexpected answers: {other:#?}");
    assert!(!same.is_empty(), "no copy was answered the refund");
    assert_eq!(same.len() + conflicts, RACERS);
    eprintln!(
        "one key, {RACERS} copies: {} answered the refund, {conflicts} got 409",
        same.len()
    );
    let last = same[0].clone();
    assert_refund_shape(&last, &payment, 10_000);
    assert_eq!(last["status"], "succeeded", "{last}");
    for r in &same {
        assert_eq!(r["id"], last["id"], "one refund for one request");
    }
    // A retry after the dust settles gets the same refund, replayed.
    let replay = shop.refund(&body, Some("one-retried-request")).await;
    assert_eq!(replay.status, 201, "{}", replay.body);
    assert_eq!(replay.body["id"], last["id"], "{}", replay.body);
    assert_eq!(replay.header("idempotent-replayed"), "true");

    let (listed, total) = shop.refunds_of(&payment).await;
    assert_eq!(total, 4, "{listed:#?}");
    assert_eq!(
        listed
            .iter()
            .filter(|r| r["amount"] == 10_000)
            .map(|r| text(&r["id"]))
            .collect::<Vec<_>>(),
        vec![text(&last["id"])]
    );
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("refunded".into(), AMOUNT)
    );
    assert_eq!(shop.khalti_refunds(&payment).await, (4, AMOUNT));
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 1);
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 3. eSewa: the merchant refunds in eSewa's portal

async fn an_esewa_refund_requires_action_and_holds_its_amount(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Esewa, AMOUNT).await;
    let r = shop.refunded(&payment, 40_000).await;
    assert_eq!(r["status"], "requires_action", "{r}");
    let why = non_empty(&r, "failureReason");
    assert!(
        why.contains("eSewa") && why.contains("portal"),
        "failureReason must send the merchant to the eSewa portal: {why}"
    );
    let id = text(&r["id"]);
    assert_eq!(shop.get_refund(&id).await, r);
    // Not refunded yet, but reserved.
    assert_eq!(shop.payment_refunded(&payment).await, ("success".into(), 0));
    let over = shop
        .refund(
            &json!({"paymentId": payment, "amount": 60_001, "reason": "other"}),
            None,
        )
        .await;
    over.assert_error(422, "invalid_request_error", "refund_exceeds_balance");
    assert_eq!(over.body["error"]["param"], "amount", "{}", over.body);
    // The rest fits exactly; then not a paisa more.
    let rest = shop.refunded(&payment, 60_000).await;
    assert_eq!(rest["status"], "requires_action", "{rest}");
    let more = shop
        .refund(
            &json!({"paymentId": payment, "amount": 1, "reason": "other"}),
            None,
        )
        .await;
    more.assert_error(422, "invalid_request_error", "refund_exceeds_balance");
    assert_eq!(shop.refunds_of(&payment).await.1, 2);
    assert_eq!(shop.events_about("refund.succeeded", &id).await, 0);
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 0);
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 4. Fonepay: no refund API

async fn a_fonepay_refund_is_refused_and_creates_nothing(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    shop.app.enable_fonepay(&shop.tenant, Mode::Sandbox).await;
    let payment = shop.paid(Via::FonepayWeb, FONEPAY_AMOUNT).await;
    let a = shop
        .refund(
            &json!({"paymentId": payment, "amount": FONEPAY_AMOUNT, "reason": "customer_request"}),
            Some("fonepay-refund"),
        )
        .await;
    a.assert_error(422, "invalid_request_error", "refund_not_supported");
    assert_eq!(a.body["error"]["param"], "paymentId", "{}", a.body);
    assert_eq!(shop.refunds_of(&payment).await, (Vec::new(), 0));
    let all = shop.app.get("/v1/refunds", Some(&shop.key)).await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(all.body["meta"]["total"], 0, "{}", all.body);
    assert_eq!(shop.payment_refunded(&payment).await, ("success".into(), 0));
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 5. Khalti rejects: failed, and the amount is free again

async fn a_rejected_khalti_refund_fails_and_releases_its_amount(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Khalti, AMOUNT).await;
    shop.script_refund(&payment, "failure").await;
    let r = shop.refunded(&payment, 30_000).await;
    assert_eq!(r["status"], "failed", "{r}");
    non_empty(&r, "failureReason");
    let id = text(&r["id"]);
    assert_eq!(shop.get_refund(&id).await, r);
    assert_eq!(shop.events_about("refund.failed", &id).await, 1);
    assert_eq!(shop.events_about("refund.succeeded", &id).await, 0);
    assert_eq!(shop.payment_refunded(&payment).await, ("success".into(), 0));
    assert_eq!(shop.khalti_refunds(&payment).await, (1, 0));

    // The same amount again succeeds, and so does the rest: the whole
    // payment was free again.
    let again = shop.refunded(&payment, 30_000).await;
    assert_eq!(again["status"], "succeeded", "{again}");
    let rest = shop.refunded(&payment, 70_000).await;
    assert_eq!(rest["status"], "succeeded", "{rest}");
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("refunded".into(), AMOUNT)
    );
    assert_eq!(shop.khalti_refunds(&payment).await, (3, AMOUNT));
    assert_eq!(shop.refunds_of(&payment).await.1, 3);
    // The failed one stays failed.
    assert_eq!(shop.get_refund(&id).await["status"], "failed");
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 1);
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 6. Khalti times out or errs: processing until the sweep asks the lookup

async fn an_unanswered_khalti_refund_is_settled_by_the_sweep(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };

    // A timeout: Khalti applied the refund, we never heard.
    let payment = shop.paid(Via::Khalti, AMOUNT).await;
    shop.script_refund(&payment, "timeout").await;
    let started = Instant::now();
    let r = shop.refunded(&payment, 40_000).await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the refund call was expected to time out, answered in {:?}",
        started.elapsed()
    );
    assert_eq!(r["status"], "processing", "{r}");
    let id = text(&r["id"]);
    let k = shop.at_khalti(&payment).await;
    assert_eq!(k["refund_calls"], 1, "{k}");
    assert_eq!(k["refunded_paisa"], 40_000, "{k}");
    assert_eq!(k["refunds"][0]["timed_out"], true, "{k}");
    assert_eq!(shop.payment_refunded(&payment).await, ("success".into(), 0));
    // Its amount is held meanwhile.
    let over = shop
        .refund(
            &json!({"paymentId": payment, "amount": 60_001, "reason": "other"}),
            None,
        )
        .await;
    over.assert_error(422, "invalid_request_error", "refund_exceeds_balance");

    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.refunds_resolved, 1, "{report:?}");
    let after = shop.get_refund(&id).await;
    assert_eq!(after["status"], "succeeded", "{after}");
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("success".into(), 40_000)
    );
    assert_eq!(shop.events_about("refund.succeeded", &id).await, 1);
    // A second sweep has nothing to do, and never calls the refund API.
    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.refunds_resolved, 0, "{report:?}");
    assert_eq!(shop.khalti_refunds(&payment).await, (1, 40_000));
    assert_eq!(shop.get_refund(&id).await["status"], "succeeded");
    assert_eq!(shop.events_about("refund.succeeded", &id).await, 1);

    // A 5xx: nothing applied at Khalti; the sweep finds no refund.
    let payment = shop.paid(Via::Khalti, AMOUNT).await;
    shop.script_refund(&payment, "server_error").await;
    let r = shop.refunded(&payment, 30_000).await;
    assert_eq!(r["status"], "processing", "{r}");
    let id = text(&r["id"]);
    assert_eq!(shop.khalti_refunds(&payment).await, (1, 0));
    let over = shop
        .refund(
            &json!({"paymentId": payment, "amount": 70_001, "reason": "other"}),
            None,
        )
        .await;
    over.assert_error(422, "invalid_request_error", "refund_exceeds_balance");
    // Khalti's lookup shows no refund, but Khalti may still apply it a
    // little later: not failed (its balance still held) for the first hour.
    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.refunds_resolved, 0, "{report:?}");
    assert_eq!(shop.get_refund(&id).await["status"], "processing");
    let over = shop
        .refund(
            &json!({"paymentId": payment, "amount": 70_001, "reason": "other"}),
            None,
        )
        .await;
    over.assert_error(422, "invalid_request_error", "refund_exceeds_balance");
    let report = shop
        .sweep_after(shared::domain::refunds::NOT_APPLIED_AFTER)
        .await;
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.refunds_resolved, 1, "{report:?}");
    let after = shop.get_refund(&id).await;
    assert_eq!(after["status"], "failed", "{after}");
    non_empty(&after, "failureReason");
    assert_eq!(shop.events_about("refund.failed", &id).await, 1);
    assert_eq!(shop.payment_refunded(&payment).await, ("success".into(), 0));
    assert_eq!(shop.khalti_refunds(&payment).await, (1, 0));
    // Released: the whole payment can be refunded.
    let full = shop.refunded(&payment, AMOUNT).await;
    assert_eq!(full["status"], "succeeded", "{full}");
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("refunded".into(), AMOUNT)
    );
    assert_eq!(shop.khalti_refunds(&payment).await, (2, AMOUNT));
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 7. Validation and access

async fn refunds_are_validated_and_kept_to_their_tenant(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Khalti, AMOUNT).await;
    let ok = json!({"paymentId": payment, "amount": 1_000, "reason": "other"});
    let with = |field: &str, value: Value| {
        let mut b = ok.clone();
        b[field] = value;
        b
    };
    let without = |field: &str| {
        let mut b = ok.clone();
        if let Some(o) = b.as_object_mut() {
            o.remove(field);
        }
        b
    };
    let cases = [
        ("amount 0", with("amount", json!(0)), "amount"),
        ("negative amount", with("amount", json!(-500)), "amount"),
        ("amount as text", with("amount", json!("ten")), "amount"),
        ("missing reason", without("reason"), "reason"),
        ("unknown reason", with("reason", json!("bored")), "reason"),
        ("missing paymentId", without("paymentId"), "paymentId"),
        ("unknown field", with("refundAll", json!(true)), "refundAll"),
        (
            "bad mobile",
            with("mobileNumber", json!("12345")),
            "mobileNumber",
        ),
        (
            "mobile with letters",
            with("mobileNumber", json!("98000000ab")),
            "mobileNumber",
        ),
        ("long notes", with("notes", json!("x".repeat(501))), "notes"),
    ];
    for (what, body, param) in cases {
        let a = shop.refund(&body, None).await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], param, "{what}: {}", a.body);
    }

    // Unknown payments, another mode's, another tenant's: 404.
    for missing in [new_id(IdKind::Payment), "pay_nope".to_owned()] {
        let a = shop.refund(&with("paymentId", json!(missing)), None).await;
        a.assert_error(404, "invalid_request_error", "not_found");
        assert_eq!(a.body["error"]["param"], "paymentId", "{}", a.body);
    }
    let live = shop.app.key(&shop.tenant, Mode::Live, &Scope::ALL).await;
    let a = shop.app.post("/v1/refunds", Some(&live), None, &ok).await;
    a.assert_error(404, "invalid_request_error", "not_found");
    let other = shop.app.tenant("Other Shop", "owner@other.example").await;
    let other_key = shop.app.key(&other, Mode::Sandbox, &Scope::ALL).await;
    let a = shop
        .app
        .post("/v1/refunds", Some(&other_key), None, &ok)
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    assert_eq!(a.body["error"]["param"], "paymentId", "{}", a.body);

    // A key that may only read refunds cannot make one.
    let reader = shop
        .app
        .key(&shop.tenant, Mode::Sandbox, &[Scope::RefundsRead])
        .await;
    let a = shop.app.post("/v1/refunds", Some(&reader), None, &ok).await;
    a.assert_error(403, "permission_error", "missing_scope");
    assert_eq!(shop.refunds_of(&payment).await.1, 0);
    assert_eq!(shop.khalti_refunds(&payment).await, (0, 0));

    // A payment not (yet) paid cannot be refunded.
    let s = shop.checkout(AMOUNT).await;
    shop.to_wallet(&s, Via::Khalti).await;
    let unpaid = text(&shop.session(&s).await["paymentId"]);
    assert_eq!(shop.payment(&unpaid).await["status"], "pending");
    let a = shop.refund(&with("paymentId", json!(unpaid)), None).await;
    a.assert_error(422, "invalid_request_error", "payment_not_refundable");
    assert_eq!(shop.refunds_of(&unpaid).await.1, 0);

    // None of that refunded anything; a good request does.
    let r = shop.refunded(&payment, 1_000).await;
    assert_eq!(r["status"], "succeeded", "{r}");
    let id = text(&r["id"]);
    let listed = shop
        .app
        .get(&format!("/v1/refunds?paymentId={payment}"), Some(&reader))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.body["meta"]["total"], 1, "{}", listed.body);

    // The other tenant (and the live mode) see none of it.
    for key in [&other_key, &live] {
        for path in [
            "/v1/refunds".to_owned(),
            format!("/v1/refunds?paymentId={payment}"),
        ] {
            let a = shop.app.get(&path, Some(key)).await;
            assert_eq!(a.status, 200, "{path}: {}", a.body);
            assert_eq!(a.body["meta"]["total"], 0, "{path}: {}", a.body);
            assert_eq!(a.body["data"], json!([]), "{path}: {}", a.body);
        }
        let a = shop.app.get(&format!("/v1/refunds/{id}"), Some(key)).await;
        a.assert_error(404, "invalid_request_error", "not_found");
    }
    assert_eq!(shop.khalti_refunds(&payment).await, (1, 1_000));
    shop.stop().await;
}

// ---------------------------------------------------------------------------
// 8. A retried request answers the first refund

async fn a_retried_refund_answers_the_first(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Khalti, AMOUNT).await;
    let body = json!({
        "paymentId": payment,
        "amount": 25_000,
        "reason": "fraudulent",
        "mobileNumber": "9800000001",
    });
    let first = shop.refund(&body, Some("retry-me")).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.body["status"], "succeeded", "{}", first.body);
    assert_eq!(first.body["mobileNumber"], "9800000001", "{}", first.body);
    assert_eq!(first.body["reason"], "fraudulent", "{}", first.body);
    assert_ne!(first.header("idempotent-replayed"), "true");
    let second = shop.refund(&body, Some("retry-me")).await;
    assert_eq!(second.status, 201, "{}", second.body);
    assert_eq!(second.body["id"], first.body["id"], "{}", second.body);
    assert_eq!(second.body, first.body);
    assert_eq!(second.header("idempotent-replayed"), "true");
    // The same key with another body is a misuse, not a second refund.
    let mut changed = body.clone();
    changed["amount"] = json!(26_000);
    shop.refund(&changed, Some("retry-me")).await.assert_error(
        409,
        "idempotency_error",
        "idempotency_key_reused",
    );

    assert_eq!(shop.refunds_of(&payment).await.1, 1);
    assert_eq!(shop.khalti_refunds(&payment).await, (1, 25_000));
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("success".into(), 25_000)
    );
    shop.stop().await;
}

on_both_backends!(
    khalti_partial_then_full_refund,
    concurrent_refunds_never_exceed_the_payment,
    an_esewa_refund_requires_action_and_holds_its_amount,
    a_fonepay_refund_is_refused_and_creates_nothing,
    a_rejected_khalti_refund_fails_and_releases_its_amount,
    an_unanswered_khalti_refund_is_settled_by_the_sweep,
    refunds_are_validated_and_kept_to_their_tenant,
    a_retried_refund_answers_the_first,
);

// ---------------------------------------------------------------------------
// Regressions found while writing this suite (both were bugs, now fixed).

/// Many refunds of one payment at once, all within its balance: every one
/// Khalti accepted is answered `succeeded`; none is left to the sweep.
async fn many_small_concurrent_refunds_all_succeed(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let payment = shop.paid(Via::Khalti, AMOUNT).await;
    let n: usize = 20;
    let answers = futures::future::join_all((0..n).map(|i| {
        let shop = &shop;
        let body = json!({"paymentId": payment, "amount": AMOUNT / 20, "reason": "duplicate"});
        async move { shop.refund(&body, Some(&format!("small-{i}"))).await }
    }))
    .await;
    let answered: Vec<String> = answers
        .iter()
        .map(|a| format!("{} {}", a.status, a.body["status"]))
        .collect();
    // Khalti applied every one of them.
    assert_eq!(shop.khalti_refunds(&payment).await, (n as u64, AMOUNT));
    assert!(
        answers
            .iter()
            .all(|a| a.status == 201 && a.body["status"] == "succeeded"),
        "every refund Khalti accepted must be answered 201 succeeded: {answered:#?}"
    );
    assert_eq!(
        shop.payment_refunded(&payment).await,
        ("refunded".into(), AMOUNT)
    );
    assert_eq!(shop.events_about("payment.refunded", &payment).await, 1);
    shop.stop().await;
}

/// Two open refunds of one payment: Khalti applied one (timeout) and not
/// the other (5xx). The sweep must never call the one Khalti did not apply
/// `succeeded`, nor count more than Khalti refunded. Several payments, as
/// the order the sweep meets the two refunds in is down to their ids.
async fn the_sweep_never_succeeds_a_refund_khalti_did_not_apply(which: Which) {
    let Some(shop) = Shop::open(which).await else {
        return;
    };
    let mut payments = Vec::new();
    for _ in 0..6 {
        payments.push(shop.paid(Via::Khalti, AMOUNT).await);
    }
    let pairs = futures::future::join_all(payments.iter().map(|payment| {
        let shop = &shop;
        async move {
            shop.script_refund(payment, "timeout").await;
            let applied = shop.refunded(payment, 30_000).await;
            shop.script_refund(payment, "server_error").await;
            let not_applied = shop.refunded(payment, 50_000).await;
            assert_eq!(applied["status"], "processing", "{applied}");
            assert_eq!(not_applied["status"], "processing", "{not_applied}");
            (text(&applied["id"]), text(&not_applied["id"]))
        }
    }))
    .await;
    let report = shop.sweep().await;
    assert_eq!(report.errors, 0, "{report:?}");
    let mut wrong = Vec::new();
    for (payment, (applied, not_applied)) in payments.iter().zip(&pairs) {
        let a = shop.get_refund(applied).await;
        let b = shop.get_refund(not_applied).await;
        let (_, ours) = shop.payment_refunded(payment).await;
        let (_, khaltis) = shop.khalti_refunds(payment).await;
        if b["status"] == "succeeded" || ours > khaltis {
            wrong.push(format!(
                "{payment}: applied 30000 -> {}, not applied 50000 -> {}; amountRefunded {ours}, Khalti refunded {khaltis}",
                a["status"], b["status"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    shop.stop().await;
}

mod regressions {
    use super::{
        many_small_concurrent_refunds_all_succeed,
        the_sweep_never_succeeds_a_refund_khalti_did_not_apply,
    };
    dhukuti_tests::on_both_backends!(
        many_small_concurrent_refunds_all_succeed,
        the_sweep_never_succeeds_a_refund_khalti_did_not_apply,
    );
}
