use super::returns::{Distrust, verify_return};
use super::review::hold_for_review;
use super::settle::{decide, decide_for, plan};
use super::start::{origin, return_url, start_tally};
use super::sweep::{claim_as_read, claim_check, open_payments, retire};
use super::*;
use crate::AppState;
use crate::app::Deps;
use crate::domain::checkout::{CreateCheckout, Creator, validate_create};
use crate::domain::outbox;
use crate::domain::outbox::EventType;
use crate::domain::payments::{AttemptInfo, PaymentView};
use crate::domain::{Tenant, checkout};
use crate::ids::{PaymentId, SessionId};
use crate::money::Currency;
use crate::money::Paisa;
use crate::providers::ProviderCredentials;
use crate::providers::{ProviderState, ProviderStatus};
use crate::store::embedded::EmbeddedStore;
use crate::store::{Store, TxOp, Update};
use crate::testenv::at;
use crate::time::ManualClock;
use base64::Engine;
use serde_json::json;
use std::sync::Arc;

/// What a sweep at `now` would check.
async fn due_now(store: &dyn Store, now: Timestamp) -> Vec<Payment> {
    let active = crate::domain::active::all(store).await.unwrap();
    open_payments(store, &active, now).await.unwrap().0
}

/// What a sweep at `now` would expire.
async fn expiring(store: &dyn Store, now: Timestamp, limit: usize) -> Vec<SessionId> {
    let active = crate::domain::active::all(store).await.unwrap();
    checkout::due_for_expiry(store, &active, now, limit)
        .await
        .unwrap()
}

fn state(now: Timestamp) -> AppState {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
    AppState::new(
        store,
        Arc::new(ManualClock::new(now)),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

/// A session in `initiated` with one pending attempt at `provider`.
async fn attempt(st: &Deps, provider: Provider, now: Timestamp) -> (CheckoutSession, Payment) {
    let req: CreateCheckout = serde_json::from_value(json!({
        "amount": 100_000, "returnUrl": "https://shop.example/thanks"
    }))
    .unwrap();
    let valid = validate_create(req, Mode::Sandbox).unwrap();
    let creator = Creator {
        project_id: "proj_1".into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_1".into(),
        spend_cap_paisa: None,
    };
    let session = checkout::create(st, &creator, valid, now, None)
        .await
        .unwrap();
    let payment = add_attempt(st, &session, provider, "REF1", now).await;
    let session = checkout::find_any(st, &session.id, now)
        .await
        .unwrap()
        .unwrap();
    (session, payment)
}

/// A new session of `project` (sandbox, NPR 1,000).
async fn session_of(st: &Deps, project: &str, now: Timestamp) -> CheckoutSession {
    let req: CreateCheckout = serde_json::from_value(json!({
        "amount": 100_000, "returnUrl": "https://shop.example/thanks"
    }))
    .unwrap();
    let valid = validate_create(req, Mode::Sandbox).unwrap();
    let creator = Creator {
        project_id: project.into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_1".into(),
        spend_cap_paisa: None,
    };
    checkout::create(st, &creator, valid, now, None)
        .await
        .unwrap()
}

#[tokio::test]
async fn one_projects_backlog_does_not_delay_anothers_due_payments() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    // 300 attempts of one project, all due, created first...
    for i in 0..30 {
        let s = session_of(&st, "proj_junk", now).await;
        for j in 0..10 {
            add_attempt(&st, &s, Provider::Esewa, &format!("J{i}-{j}"), now).await;
        }
    }
    // ...then three genuine ones of another project.
    let mut genuine = Vec::new();
    for i in 0..3 {
        let at = now.plus(chrono::Duration::minutes(5));
        let s = session_of(&st, "proj_real", at).await;
        genuine.push(
            add_attempt(&st, &s, Provider::Esewa, &format!("G{i}"), at)
                .await
                .id,
        );
    }
    let due = due_now(&*st.store, now.plus(chrono::Duration::minutes(10))).await;
    let first: Vec<&str> = due.iter().take(6).map(|p| p.project_id.as_str()).collect();
    assert_eq!(
        first.iter().filter(|p| **p == "proj_real").count(),
        3,
        "the projects take turns: {first:?}"
    );
    for g in &genuine {
        assert!(due.iter().take(6).any(|p| &p.id == g));
    }
    let junk = due.iter().filter(|p| p.project_id == "proj_junk").count();
    assert_eq!(junk, SWEEP_BATCH, "at most a batch per project and sweep");
    // Checked now, the next turn goes to those not yet checked.
    let later = now.plus(chrono::Duration::minutes(10));
    for p in &due {
        assert!(claim_as_read(&*st.store, p, later).await.unwrap());
    }
    let next = due_now(&*st.store, later).await;
    assert!(next.iter().all(|p| p.project_id == "proj_junk"));
    assert!(
        next.iter().all(|p| !due.iter().any(|d| d.id == p.id)),
        "by next check"
    );
    // A claim lost to a concurrent checker is not taken twice.
    assert!(!claim_as_read(&*st.store, &due[0], later).await.unwrap());
}

async fn add_attempt(
    st: &Deps,
    session: &CheckoutSession,
    provider: Provider,
    reference: &str,
    now: Timestamp,
) -> Payment {
    let p = Payment {
        id: PaymentId::new(),
        project_id: session.project_id.clone(),
        checkout_session_id: session.id.clone(),
        mode: session.mode,
        amount: session.amount,
        amount_refunded: Paisa::ZERO,
        amount_reserved: Paisa::ZERO,
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider,
        status: PaymentStatus::Pending,
        provider_ref: None,
        failure_reason: None,
        metadata: Default::default(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo {
            reference: Some(reference.into()),
            provider_token: Some("pidx-1".into()),
            ..Default::default()
        },
        checks: Default::default(),
    };
    st.store
        .transact(vec![
            TxOp::Put {
                item: stored_item(&p).unwrap(),
                cond: Some(Cond::NotExists),
            },
            TxOp::Update {
                key: CheckoutSession::key(&session.id),
                update: Update::new()
                    .set("status", "initiated")
                    .set("payment_id", p.id.as_str()),
                cond: None,
            },
        ])
        .await
        .unwrap();
    p
}

async fn load(st: &Deps, p: &Payment) -> (CheckoutSession, Payment) {
    let s = checkout::find_any(
        st,
        &p.checkout_session_id.clone(),
        at("2026-11-22T10:00:00Z"),
    )
    .await
    .unwrap()
    .unwrap();
    let p = find_payment(st, &s.id.clone(), &p.id)
        .await
        .unwrap()
        .unwrap();
    (s, p)
}

async fn events(st: &Deps) -> Vec<(EventType, String)> {
    outbox::recent(&*st.store, &Tenant::new("proj_1", Mode::Sandbox), 50)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            (
                e.event_type,
                e.object["id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn paid(amount: i64) -> ProviderStatus {
    ProviderStatus {
        state: ProviderState::Paid,
        amount: Some(Paisa::new(amount).unwrap()),
        provider_ref: Some("TXN-9".into()),
        fee: None,
        raw_status: "COMPLETE".into(),
    }
}

fn with_state(state: ProviderState, raw: &str) -> ProviderStatus {
    ProviderStatus {
        state,
        amount: None,
        provider_ref: None,
        fee: None,
        raw_status: raw.into(),
    }
}

fn payment_of(amount: i64) -> Payment {
    Payment {
        id: "pay_1".into(),
        project_id: "proj_1".into(),
        checkout_session_id: "cs_1".into(),
        mode: Mode::Sandbox,
        amount: Paisa::new(amount).unwrap(),
        amount_refunded: Paisa::ZERO,
        amount_reserved: Paisa::ZERO,
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider: Provider::Esewa,
        status: PaymentStatus::Pending,
        provider_ref: None,
        failure_reason: None,
        metadata: Default::default(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: at("2026-11-22T10:00:00Z"),
        updated_at: at("2026-11-22T10:00:00Z"),
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo {
            reference: Some("250610-162413".into()),
            provider_token: Some("pidx-1".into()),
            ..Default::default()
        },
        checks: Default::default(),
    }
}

#[test]
fn only_a_paid_status_of_the_right_amount_is_success() {
    let p = payment_of(100_000);
    assert!(
        matches!(decide(&p, &paid(100_000), false), Decision::Success { provider_ref: Some(r), .. } if r == "TXN-9")
    );
    // No amount named: fine for Fonepay (its status has none; the
    // amount is the one we minted or signed), held for eSewa and
    // Khalti, which always state it. A different amount is held too.
    let mut no_amount = paid(1);
    no_amount.amount = None;
    assert!(matches!(decide(&p, &no_amount, false), Decision::Review(_)));
    let mut fonepay = p.clone();
    fonepay.provider = Provider::Fonepay;
    assert!(matches!(
        decide(&fonepay, &no_amount, false),
        Decision::Success { .. }
    ));
    assert!(matches!(
        decide(&p, &paid(99_999), false),
        Decision::Review(_)
    ));
    assert!(matches!(
        decide(&p, &paid(100_001), false),
        Decision::Review(_)
    ));
    for (state, expected) in [
        (ProviderState::Pending, "processing"),
        (ProviderState::Ambiguous, "processing"),
        (ProviderState::Failed, "failed"),
        (ProviderState::Cancelled, "cancelled"),
        (ProviderState::Expired, "cancelled"),
        (ProviderState::Refunded { partial: false }, "review"),
    ] {
        let got = match decide(&p, &with_state(state, "X"), false) {
            Decision::Processing => "processing",
            Decision::Failed(_) => "failed",
            Decision::NotStarted(_) => "not started",
            Decision::Cancelled(_) => "cancelled",
            Decision::Hold(_) => "hold",
            Decision::Review(_) => "review",
            Decision::Success { .. } => "success",
        };
        assert_eq!(got, expected, "{state:?}");
    }
    // An attempt the provider forgot is cancelled only once the
    // session is over (the customer may still be on the provider's page).
    let nf = with_state(ProviderState::NotFound, "NOT_FOUND");
    assert!(matches!(decide(&p, &nf, false), Decision::Hold(_)));
    assert!(matches!(decide(&p, &nf, true), Decision::Cancelled(_)));
}

const DOC_CALLBACK: &str = r#"{"transaction_code":"000AWEO","status":"COMPLETE","total_amount":"1000.0","transaction_uuid":"250610-162413","product_code":"EPAYTEST","signed_field_names":"transaction_code,status,total_amount,transaction_uuid,product_code,signed_field_names","signature":"62GcfZTmVkzhtUeh+QJ1AqiJrjoWWGof3U+eTPTZ7fA="}"#;

fn esewa_creds() -> ProviderCredentials {
    ProviderCredentials::Esewa {
        product_code: "EPAYTEST".into(),
        secret_key: "8gBm/:&EnhH.1/q".into(),
    }
}

fn data_param(json: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(json);
    form_urlencoded::Serializer::new(String::new())
        .append_pair("data", &b64)
        .finish()
}

#[test]
fn an_esewa_return_must_be_signed_ours_and_of_our_amount() {
    let p = payment_of(100_000);
    let good = data_param(DOC_CALLBACK);
    assert_eq!(
        verify_return(&p, &esewa_creds(), ReturnKind::Ok, &good),
        Ok(())
    );
    // Tampered amount: the signature no longer verifies.
    let tampered = data_param(&DOC_CALLBACK.replace("\"1000.0\"", "\"10.0\""));
    assert!(verify_return(&p, &esewa_creds(), ReturnKind::Ok, &tampered).is_err());
    // Another merchant's key.
    let other = ProviderCredentials::Esewa {
        product_code: "EPAYTEST".into(),
        secret_key: "another-secret".into(),
    };
    assert!(verify_return(&p, &other, ReturnKind::Ok, &good).is_err());
    // A genuine return replayed onto another attempt, or for another
    // amount.
    let mut other_attempt = p.clone();
    other_attempt.attempt.reference = Some("250610-999999".into());
    assert!(verify_return(&other_attempt, &esewa_creds(), ReturnKind::Ok, &good).is_err());
    assert!(verify_return(&payment_of(200_000), &esewa_creds(), ReturnKind::Ok, &good).is_err());
    // No data on a success return: unsigned, not believed. The failure
    // return carries nothing by design: the status check decides.
    assert!(verify_return(&p, &esewa_creds(), ReturnKind::Ok, "").is_err());
    assert_eq!(
        verify_return(&p, &esewa_creds(), ReturnKind::Fail, ""),
        Ok(())
    );
}

#[test]
fn a_khalti_return_must_name_our_pidx_order_and_amount() {
    let mut p = payment_of(100_000);
    p.provider = Provider::Khalti;
    let creds = ProviderCredentials::Khalti {
        secret_key: "k".into(),
    };
    let ok = "pidx=pidx-1&status=Completed&purchase_order_id=250610-162413&amount=100000";
    assert_eq!(verify_return(&p, &creds, ReturnKind::Ok, ok), Ok(()));
    for bad in [
        "status=Completed",
        "pidx=pidx-2&status=Completed",
        "pidx=pidx-1&purchase_order_id=OTHER",
        "pidx=pidx-1&amount=1000",
    ] {
        assert!(
            verify_return(&p, &creds, ReturnKind::Ok, bad).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn a_sandbox_qr_paid_after_its_cap_hold_is_held_for_review() {
    let mut p = payment_of(50_000);
    p.provider = Provider::Fonepay;
    p.mode = Mode::Sandbox;
    p.attempt.cap_month = Some("2026-11".into());
    let in_time = p.created_at.plus(chrono::Duration::minutes(29));
    assert!(matches!(
        decide_for(&p, &paid(50_000), None, false, in_time),
        Decision::Success { .. }
    ));
    let late = p.created_at.plus(fonepay_cap::HOLD_WINDOW);
    let d = decide_for(&p, &paid(50_000), None, true, late);
    assert!(
        matches!(&d, Decision::Review(r) if r.contains("hold lapsed")),
        "{d:?}"
    );
    // Live Fonepay has no cap hold: paid is paid.
    p.mode = Mode::Live;
    p.attempt.cap_month = None;
    assert!(matches!(
        decide_for(&p, &paid(50_000), None, true, late),
        Decision::Success { .. }
    ));
}

#[test]
fn a_sandbox_qr_is_checked_once_more_just_before_its_hold_ends() {
    let mut p = payment_of(50_000);
    p.provider = Provider::Fonepay;
    p.attempt.cap_month = Some("2026-11".into());
    let last = p
        .created_at
        .plus(fonepay_cap::HOLD_WINDOW - chrono::Duration::seconds(30));
    // Checked at 28 minutes: the next gap (2.8 min) would pass the hold.
    p.checks.checked_at = Some(p.created_at.plus(chrono::Duration::minutes(28)));
    assert_eq!(next_check_at(&p), last);
    // Checked after that: the usual gap.
    p.checks.checked_at = Some(last.plus(chrono::Duration::seconds(1)));
    assert!(next_check_at(&p) > last);
    // Live Fonepay: no hold, the usual gap.
    p.mode = Mode::Live;
    p.attempt.cap_month = None;
    p.checks.checked_at = Some(p.created_at.plus(chrono::Duration::minutes(28)));
    assert!(next_check_at(&p) > last);
}

#[test]
fn a_fonepay_return_must_carry_a_valid_dv_for_our_prn_and_amount() {
    let mut p = payment_of(50_000);
    p.provider = Provider::Fonepay;
    p.attempt.reference = Some("PRN1".into());
    let secret = "a7e3512f5032480a83137793cb2021dc";
    let creds = ProviderCredentials::Fonepay {
        merchant_code: "NBQM".into(),
        secret_key: secret.into(),
        username: "u".into(),
        password: "p".into(),
    };
    let query = |prn: &str, amount: &str, dv_over_amount: &str| {
        let values = [
            prn,
            "NBQM",
            "true",
            "successful",
            "UID1",
            "NICENPKA",
            "98",
            amount,
            amount,
        ];
        let mut signed = values;
        signed[7] = dv_over_amount;
        signed[8] = dv_over_amount;
        let dv = crate::providers::sign::fonepay_data_validation(secret, &signed);
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            "PRN", "PID", "PS", "RC", "UID", "BC", "INI", "P_AMT", "R_AMT",
        ]
        .iter()
        .zip(values)
        {
            s.append_pair(k, v);
        }
        s.append_pair("DV", &dv);
        s.finish()
    };
    assert_eq!(
        verify_return(&p, &creds, ReturnKind::Ok, &query("PRN1", "500", "500")),
        Ok(())
    );
    // Amount changed after signing; another PRN; another amount signed.
    assert!(verify_return(&p, &creds, ReturnKind::Ok, &query("PRN1", "5", "500")).is_err());
    assert!(verify_return(&p, &creds, ReturnKind::Ok, &query("PRN2", "500", "500")).is_err());
    assert!(verify_return(&p, &creds, ReturnKind::Ok, &query("PRN1", "5", "5")).is_err());
    assert!(verify_return(&p, &creds, ReturnKind::Ok, "PRN=PRN1").is_err());
    // Genuinely signed, but the customer paid less (a discount): held
    // for a person, never success.
    let values = [
        "PRN1",
        "NBQM",
        "true",
        "successful",
        "UID1",
        "NICENPKA",
        "98",
        "400",
        "500",
    ];
    let dv = crate::providers::sign::fonepay_data_validation(secret, &values);
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        "PRN", "PID", "PS", "RC", "UID", "BC", "INI", "P_AMT", "R_AMT",
    ]
    .iter()
    .zip(values)
    {
        q.append_pair(k, v);
    }
    q.append_pair("DV", &dv);
    let discounted = verify_return(&p, &creds, ReturnKind::Ok, &q.finish());
    assert!(
        matches!(discounted, Err(Distrust { review: true, .. })),
        "{discounted:?}"
    );
    let mut held = p.clone();
    held.checks.review = Some("paid 400 of 500".into());
    let mut no_amount = paid(1);
    no_amount.amount = None;
    assert!(matches!(
        decide_for(&held, &no_amount, None, false, held.created_at),
        Decision::Hold(_)
    ));
}

#[tokio::test]
async fn a_cancelled_payment_is_rechecked_for_a_day_and_can_still_succeed() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let c = apply(&st, &p, Decision::Cancelled("left".into()), now)
        .await
        .unwrap();
    assert_eq!(c.status, PaymentStatus::Cancelled);
    assert_eq!(c.checks.recheck_until, Some(now.plus(RECHECK_CANCELLED)));
    // Still in the reconciler's index...
    let soon = now.plus(chrono::Duration::minutes(5));
    let listed = due_now(&*st.store, soon).await;
    assert_eq!(
        listed.iter().map(|x| x.id.clone()).collect::<Vec<_>>(),
        vec![p.id.clone()]
    );
    // ...so a payment made after all is found and recorded.
    let ok = apply(&st, &c, decide(&c, &paid(100_000), false), soon)
        .await
        .unwrap();
    assert_eq!(ok.status, PaymentStatus::Success);
    assert_eq!(ok.checks.recheck_until, None);
    assert!(due_now(&*st.store, soon).await.is_empty());

    // Another cancelled one leaves the index after its day.
    let s2 = checkout::find_any(&st, &p.checkout_session_id.clone(), now)
        .await
        .unwrap()
        .unwrap();
    let q = add_attempt(&st, &s2, Provider::Khalti, "REF3", now).await;
    apply(&st, &q, Decision::Cancelled("left".into()), now)
        .await
        .unwrap();
    let day = now.plus(RECHECK_CANCELLED);
    let due = due_now(&*st.store, day).await;
    assert_eq!(due.len(), 1);
    retire(&*st.store, &due[0]).await.unwrap();
    assert!(due_now(&*st.store, day).await.is_empty());
}

#[tokio::test]
async fn a_person_lists_and_releases_held_payments() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let mut ps = Vec::new();
    for _ in 0..3 {
        let (_, p) = attempt(&st, Provider::Esewa, now).await;
        let h = apply(&st, &p, Decision::Review("paid 400 of 1000".into()), now)
            .await
            .unwrap();
        assert_eq!(h.status, PaymentStatus::Processing);
        ps.push(p);
    }
    let listed: Vec<PaymentId> = held(&*st.store, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(listed.len(), 3);
    for p in &ps {
        assert!(listed.contains(&p.id));
    }
    let later = now.plus(chrono::Duration::minutes(5));
    assert!(
        due_now(&*st.store, later).await.is_empty(),
        "held: out of the reconciler's turns"
    );
    // A person confirmed the first with eSewa, found no money for the
    // second, and fixed what made the third mismatch.
    let ok = release(&st, &ps[0].id, Release::Succeed, later)
        .await
        .unwrap();
    assert_eq!(ok.status, PaymentStatus::Success);
    assert!(
        events(&st)
            .await
            .contains(&(EventType::PaymentSucceeded, ps[0].id.to_string()))
    );
    let no = release(
        &st,
        &ps[1].id,
        Release::Fail("no money at eSewa".into()),
        later,
    )
    .await
    .unwrap();
    assert_eq!(no.status, PaymentStatus::Failed);
    let back = release(&st, &ps[2].id, Release::Recheck, later)
        .await
        .unwrap();
    assert_eq!(
        (back.status, back.checks.review),
        (PaymentStatus::Processing, None)
    );
    let due: Vec<PaymentId> = due_now(&*st.store, later)
        .await
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(due, vec![ps[2].id.clone()]);
    assert!(held(&*st.store, 10).await.unwrap().is_empty());
    assert!(matches!(
        release(&st, &ps[0].id, Release::Succeed, later).await,
        Err(ReleaseError::NotHeld)
    ));
    assert!(matches!(
        release(&st, &"pay_missing".into(), Release::Recheck, later).await,
        Err(ReleaseError::NotFound)
    ));
}

#[tokio::test]
async fn a_payment_held_for_review_is_never_settled_from_an_older_copy() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    // A sweep read `p`, then a signed return said another amount was
    // paid and held it; the sweep's provider check then says paid.
    let held = hold_for_review(&*st.store, &p, "paid 400 of 500", now)
        .await
        .unwrap();
    assert_eq!(held.status, PaymentStatus::Processing);
    let soon = now.plus(chrono::Duration::minutes(5));
    assert!(due_now(&*st.store, soon).await.is_empty());
    let stale = decide_for(&p, &paid(100_000), None, false, now);
    assert!(matches!(stale, Decision::Success { .. }), "{stale:?}");
    let after = apply(&st, &p, stale, now).await.unwrap();
    assert_eq!(after.status, PaymentStatus::Processing);
    assert_eq!(after.checks.review.as_deref(), Some("paid 400 of 500"));
    // Nor a failure or a cancel: it waits for a person.
    for d in [
        Decision::Failed("x".into()),
        Decision::Cancelled("x".into()),
    ] {
        let after = apply(&st, &p, d, now).await.unwrap();
        assert_eq!(after.status, PaymentStatus::Processing);
    }
    assert!(events(&st).await.is_empty());
}

#[tokio::test]
async fn a_paid_answer_for_another_amount_holds_the_payment_for_good() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let d = decide_for(&p, &paid(99_999), None, false, now);
    assert!(matches!(d, Decision::Review(_)), "{d:?}");
    let held = apply(&st, &p, d, now).await.unwrap();
    assert_eq!(held.status, PaymentStatus::Processing);
    assert!(
        held.checks
            .review
            .as_deref()
            .is_some_and(|r| r.contains("99999")),
        "{:?}",
        held.checks.review
    );
    // Out of the reconciler's index; nothing later settles it, even
    // the right amount or an expiry planned from the old copy.
    let soon = now.plus(chrono::Duration::minutes(5));
    assert!(due_now(&*st.store, soon).await.is_empty());
    for later in [
        decide(&p, &paid(100_000), false),
        Decision::Cancelled("the provider's payment window closed".into()),
    ] {
        let after = apply(&st, &p, later, soon).await.unwrap();
        assert_eq!(after.status, PaymentStatus::Processing);
    }
    assert!(events(&st).await.is_empty());
    // A settled payment is never held.
    let (_, q) = attempt(&st, Provider::Khalti, now).await;
    let ok = apply(&st, &q, decide(&q, &paid(100_000), false), now)
        .await
        .unwrap();
    assert_eq!(ok.status, PaymentStatus::Success);
    let after = apply(&st, &ok, Decision::Review("late".into()), soon)
        .await
        .unwrap();
    assert_eq!(after.status, PaymentStatus::Success);
    assert_eq!(after.checks.review, None);
}

#[tokio::test]
async fn the_settling_write_itself_refuses_a_payment_held_for_review() {
    let now = at("2026-11-22T10:00:00Z");
    for decision in [
        Decision::Success {
            provider_ref: None,
            fee: None,
            configured_fee: None,
        },
        Decision::Failed("declined".into()),
        Decision::Cancelled("left".into()),
        Decision::NotStarted("refused".into()),
    ] {
        let st = state(now);
        let (s, p) = attempt(&st, Provider::Esewa, now).await;
        // The plan made from the copy read before the hold landed.
        let ops = plan(&p, Some(&s), None, &decision, now).unwrap().unwrap();
        hold_for_review(&*st.store, &p, "paid 400 of 500", now)
            .await
            .unwrap();
        assert!(st.store.transact(ops).await.is_err(), "{decision:?}");
        let (_, after) = load(&st, &p).await;
        assert_eq!(after.status, PaymentStatus::Processing, "{decision:?}");
        assert!(events(&st).await.is_empty(), "{decision:?}");
    }
}

#[tokio::test]
async fn a_cancelled_payment_paid_another_amount_is_held_not_settled_later() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let c = apply(&st, &p, Decision::Cancelled("left".into()), now)
        .await
        .unwrap();
    assert_eq!(c.status, PaymentStatus::Cancelled);
    let held = hold_for_review(&*st.store, &c, "paid 400 of 500", now)
        .await
        .unwrap();
    assert_eq!(held.status, PaymentStatus::Processing);
    assert_eq!(held.checks.review.as_deref(), Some("paid 400 of 500"));
    assert_eq!(held.checks.recheck_until, None);
    // Out of the reconciler's index, also once the day is over.
    let day = now
        .plus(RECHECK_CANCELLED)
        .plus(chrono::Duration::minutes(1));
    assert!(due_now(&*st.store, day).await.is_empty());
    // The day's recheck of the cancelled payment then says paid.
    let later = now.plus(chrono::Duration::hours(1));
    let d = decide_for(&c, &paid(100_000), None, true, later);
    let after = apply(&st, &c, d, later).await.unwrap();
    assert_eq!(after.status, PaymentStatus::Processing);
    assert!(
        !events(&st)
            .await
            .iter()
            .any(|(t, _)| *t == EventType::PaymentSucceeded)
    );
}

#[tokio::test]
async fn the_sweep_reads_past_payments_that_are_not_due() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (s, _) = attempt(&st, Provider::Esewa, now).await;
    // 60 old attempts checked a moment ago, then one never checked.
    let later = now.plus(chrono::Duration::minutes(10));
    for i in 0..60 {
        let p = add_attempt(&st, &s, Provider::Esewa, &format!("OLD{i}"), now).await;
        assert!(
            claim_check(&*st.store, &p, later, check_gap(&p, later))
                .await
                .unwrap()
        );
    }
    let fresh = add_attempt(
        &st,
        &s,
        Provider::Esewa,
        "NEW",
        now.plus(chrono::Duration::seconds(1)),
    )
    .await;
    let active = crate::domain::active::all(&*st.store).await.unwrap();
    let (due, _) = open_payments(&*st.store, &active, later).await.unwrap();
    assert!(due.iter().any(|p| p.id == fresh.id), "{} due", due.len());
    assert!(due.len() <= 2, "only the unchecked ones: {}", due.len());
}

#[tokio::test]
async fn success_settles_payment_and_session_with_one_event() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let later = now.plus(chrono::Duration::minutes(1));
    let settled = apply(&st, &p, decide(&p, &paid(100_000), false), later)
        .await
        .unwrap();
    assert_eq!(settled.status, PaymentStatus::Success);
    assert_eq!(settled.provider_ref.as_deref(), Some("TXN-9"));
    let (s, _) = load(&st, &p).await;
    assert_eq!(s.status, SessionStatus::Success);
    assert_eq!(s.payment_id.as_deref(), Some(p.id.as_str()));
    assert_eq!(
        events(&st).await,
        vec![(EventType::PaymentSucceeded, p.id.to_string())]
    );
    // Settled payments leave the sweep's index; so does the session.
    assert!(
        due_now(&*st.store, later.plus(chrono::Duration::hours(1)))
            .await
            .is_empty()
    );
    assert!(
        expiring(&*st.store, later.plus(chrono::Duration::hours(1)), 10)
            .await
            .is_empty()
    );
    // Applying again (a replayed return, the next sweep) changes nothing.
    let again = apply(&st, &p, decide(&p, &paid(100_000), false), later)
        .await
        .unwrap();
    assert_eq!(again, settled);
    assert_eq!(events(&st).await.len(), 1);
    // A late "failed" cannot undo a success.
    let after = apply(&st, &p, Decision::Failed("x".into()), later)
        .await
        .unwrap();
    assert_eq!(after.status, PaymentStatus::Success);
}

/// A success records the fee the provider states and snapshots the
/// configured rate's (the view prefers the provider's); a later change of
/// rate leaves a settled payment's fee as it was; the webhook's payment
/// object carries the fee.
#[tokio::test]
async fn a_success_records_the_stated_fee_and_snapshots_the_configured_one() {
    use crate::domain::fees::{self, FeeRate};
    use crate::domain::payments::FeeSource;
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let tenant = Tenant::new("proj_1", Mode::Sandbox);
    let rate = FeeRate::new(&tenant, Provider::Esewa, 250, 100, now).unwrap();
    fees::set(&*st.store, &rate, Vec::new()).await.unwrap();
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let settled = apply(&st, &p, decide(&p, &paid(100_000), false), now)
        .await
        .unwrap();
    // 2.5 % of NPR 1,000 + 100 paisa.
    let fee = Paisa::new(2_600).unwrap();
    assert_eq!(settled.fee(), Some((fee, FeeSource::Configured)));
    assert_eq!(settled.net(), Paisa::new(97_400).ok());
    let rate = FeeRate::new(&tenant, Provider::Esewa, 0, 0, now).unwrap();
    fees::set(&*st.store, &rate, Vec::new()).await.unwrap();
    let (_, again) = load(&st, &p).await;
    assert_eq!(again.fee(), Some((fee, FeeSource::Configured)));
    let object = outbox::recent(&*st.store, &tenant, 5).await.unwrap()[0]
        .object
        .clone();
    assert_eq!(
        (&object["fee"], &object["net"], &object["feeSource"]),
        (&json!(2_600), &json!(97_400), &json!("configured"))
    );

    // Khalti's lookup states its fee: the provider's figure is shown.
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Khalti, now).await;
    let mut status = paid(100_000);
    status.fee = Paisa::new(3_000).ok();
    let settled = apply(&st, &p, decide(&p, &status, false), now)
        .await
        .unwrap();
    assert_eq!(
        settled.fee(),
        Some((Paisa::new(3_000).unwrap(), FeeSource::Provider))
    );
    // With neither, none.
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let settled = apply(&st, &p, decide(&p, &paid(100_000), false), now)
        .await
        .unwrap();
    assert_eq!((settled.fee(), settled.net()), (None, None));
}

#[tokio::test]
async fn racing_settlements_write_one_success_and_one_event() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Khalti, now).await;
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let st = st.clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            apply(&st, &p, decide(&p, &paid(100_000), false), now).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status, PaymentStatus::Success);
    }
    assert_eq!(
        events(&st).await,
        vec![(EventType::PaymentSucceeded, p.id.to_string())]
    );
}

#[tokio::test]
async fn a_second_success_for_a_session_is_kept_and_flagged() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (s, first) = attempt(&st, Provider::Esewa, now).await;
    let second = add_attempt(&st, &s, Provider::Khalti, "REF2", now).await;
    apply(&st, &second, decide(&second, &paid(100_000), false), now)
        .await
        .unwrap();
    let late = apply(&st, &first, decide(&first, &paid(100_000), false), now)
        .await
        .unwrap();
    assert_eq!(late.status, PaymentStatus::Success);
    assert_eq!(late.double_payment_of.as_deref(), Some(second.id.as_str()));
    let (s, _) = load(&st, &second).await;
    assert_eq!(s.payment_id.as_deref(), Some(second.id.as_str()));
    let view = serde_json::to_value(PaymentView::from(late)).unwrap();
    assert_eq!(view["doublePaymentOf"], second.id.as_str());
    assert_eq!(events(&st).await.len(), 2);
}

#[tokio::test]
async fn cancel_returns_to_the_picker_and_decline_ends_the_session() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let c = apply(
        &st,
        &p,
        decide(&p, &with_state(ProviderState::Cancelled, "CANCELED"), false),
        now,
    )
    .await
    .unwrap();
    assert_eq!(c.status, PaymentStatus::Cancelled);
    let (s, _) = load(&st, &p).await;
    assert_eq!(s.status, SessionStatus::Pending);

    let p2 = add_attempt(&st, &s, Provider::Khalti, "REF2", now).await;
    let processing = apply(&st, &p2, Decision::Processing, now).await.unwrap();
    assert_eq!(processing.status, PaymentStatus::Processing);
    let f = apply(
        &st,
        &p2,
        decide(&p2, &with_state(ProviderState::Failed, "Failed"), false),
        now,
    )
    .await
    .unwrap();
    assert_eq!(f.status, PaymentStatus::Failed);
    assert!(f.failure_reason.is_some());
    let (s, _) = load(&st, &p2).await;
    assert_eq!(s.status, SessionStatus::Failed);
    assert_eq!(
        events(&st).await,
        vec![
            (EventType::PaymentFailed, p2.id.to_string()),
            (EventType::PaymentCancelled, p.id.to_string()),
        ]
    );
}

#[tokio::test]
async fn money_taken_after_the_session_expired_is_still_recorded() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (s, p) = attempt(&st, Provider::Esewa, now).await;
    let late = now.plus(chrono::Duration::minutes(31));
    assert_eq!(expiring(&*st.store, late, 10).await, vec![s.id.clone()]);
    assert!(checkout::expire_due(&*st.store, &s.id, late).await.unwrap());
    // The provider forgot the attempt: cancelled, session stays expired.
    let nf = with_state(ProviderState::NotFound, "NOT_FOUND");
    let c = apply(&st, &p, decide(&p, &nf, true), late).await.unwrap();
    assert_eq!(c.status, PaymentStatus::Cancelled);
    assert_eq!(load(&st, &p).await.0.status, SessionStatus::Expired);
    // ...but then it reports paid after all: money moved, so record it.
    let ok = apply(&st, &c, decide(&c, &paid(100_000), true), late)
        .await
        .unwrap();
    assert_eq!(ok.status, PaymentStatus::Success);
    assert_eq!(load(&st, &p).await.0.status, SessionStatus::Success);
}

#[test]
fn a_failure_return_the_provider_does_not_know_is_a_cancel() {
    let p = payment_of(100_000);
    let now = p.created_at;
    let nf = with_state(ProviderState::NotFound, "NOT_FOUND");
    let fail = Some(ReturnKind::Fail);
    assert!(matches!(
        decide_for(&p, &nf, fail, false, now),
        Decision::Cancelled(_)
    ));
    assert!(matches!(
        decide_for(&p, &nf, Some(ReturnKind::Ok), false, now),
        Decision::Hold(_)
    ));
    assert!(matches!(
        decide_for(&p, &nf, None, false, now),
        Decision::Hold(_)
    ));
    // Any other answer decides as always (a failure return is no proof
    // of failure: a paid status still wins).
    assert!(matches!(
        decide_for(&p, &paid(100_000), fail, false, now),
        Decision::Success { .. }
    ));
}

#[test]
fn pending_is_processing_only_after_the_customer_says_paid() {
    let p = payment_of(100_000);
    let now = p.created_at.plus(chrono::Duration::minutes(2));
    let pending = with_state(ProviderState::Pending, "pending");
    let ok = Some(ReturnKind::Ok);
    assert_eq!(
        decide_for(&p, &pending, ok, false, now),
        Decision::Processing
    );
    // An unscanned QR, a wallet page left open: not paid yet.
    assert!(matches!(
        decide_for(&p, &pending, None, false, now),
        Decision::Hold(_)
    ));
    // A day after it began, with the session over: abandoned.
    let later = p.created_at.plus(ABANDONED_AFTER);
    assert!(matches!(
        decide_for(&p, &pending, None, false, later),
        Decision::Hold(_)
    ));
    assert!(matches!(
        decide_for(&p, &pending, None, true, later),
        Decision::Cancelled(_)
    ));
    // A payment the customer said was paid stays processing (review).
    let mut processing = p.clone();
    processing.status = PaymentStatus::Processing;
    assert_eq!(
        decide_for(&processing, &pending, None, true, later),
        Decision::Processing
    );
    // Ambiguous is processing whatever the trigger.
    let amb = with_state(ProviderState::Ambiguous, "AMBIGUOUS");
    assert_eq!(decide_for(&p, &amb, None, false, now), Decision::Processing);
}

#[test]
fn old_open_payments_are_checked_less_often() {
    let p = payment_of(100_000);
    let at_age = |m: i64| check_gap(&p, p.created_at.plus(chrono::Duration::minutes(m)));
    assert_eq!(at_age(2), RECONCILE_AFTER);
    assert_eq!(at_age(60), chrono::Duration::minutes(6));
    assert_eq!(at_age(24 * 60), chrono::Duration::minutes(144));
}

#[tokio::test]
async fn one_check_is_claimed_per_gap() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let gap = chrono::Duration::seconds(3);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = st.store.clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            claim_check(&*store, &p, now, gap).await
        }));
    }
    let mut won = 0;
    for t in tasks {
        if t.await.unwrap().unwrap() {
            won += 1;
        }
    }
    assert_eq!(won, 1);
    assert!(
        !claim_check(&*st.store, &p, now.plus(chrono::Duration::seconds(2)), gap)
            .await
            .unwrap()
    );
    assert!(
        claim_check(&*st.store, &p, now.plus(chrono::Duration::seconds(3)), gap)
            .await
            .unwrap()
    );
    let mut missing = p.clone();
    missing.id = "pay_missing".into();
    assert!(!claim_check(&*st.store, &missing, now, gap).await.unwrap());
}

#[tokio::test]
async fn an_attempt_the_provider_refused_fails_but_keeps_the_session_open() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Khalti, now).await;
    let f = apply(&st, &p, Decision::NotStarted("khalti: 503".into()), now)
        .await
        .unwrap();
    assert_eq!(f.status, PaymentStatus::Failed);
    assert_eq!(load(&st, &p).await.0.status, SessionStatus::Pending);
    assert_eq!(
        events(&st).await,
        vec![(EventType::PaymentFailed, p.id.to_string())]
    );
}

#[test]
fn return_urls_and_origins() {
    assert_eq!(
        return_url("https://pay.example", &"cs_1".into(), &"pay_1".into(), "ok"),
        "https://pay.example/c/cs_1/return/pay_1/ok"
    );
    assert_eq!(
        origin("https://shop.example/a/b?c=1"),
        "https://shop.example"
    );
    assert_eq!(origin("http://127.0.0.1:9/thanks"), "http://127.0.0.1:9");
}

/// The day counters (all shards) of the session's and payments'
/// creation day.
async fn counters(st: &Deps, now: Timestamp) -> std::collections::BTreeMap<String, i64> {
    crate::domain::analytics::day_totals(
        &*st.store,
        &crate::domain::Tenant::new("proj_1", Mode::Sandbox),
        now,
    )
    .await
    .unwrap()
}

fn count(c: &std::collections::BTreeMap<String, i64>, attr: &str) -> i64 {
    c.get(attr).copied().unwrap_or(0)
}

#[test]
fn a_start_counts_the_payment_and_the_first_attempt_of_its_session() {
    use crate::domain::checkout::stats::{DayCounters, day_key};
    let now = at("2026-11-22T10:00:00Z");
    let req: CreateCheckout = serde_json::from_value(json!({
        "amount": 100_000, "returnUrl": "https://shop.example/thanks"
    }))
    .unwrap();
    let creator = Creator {
        project_id: "proj_1".into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_1".into(),
        spend_cap_paisa: None,
    };
    // Created yesterday, attempted today: each counts on its own day.
    let yesterday = now.plus(chrono::Duration::days(-1));
    let mut session = checkout::new_session(
        &creator,
        validate_create(req, Mode::Sandbox).unwrap(),
        yesterday,
    );
    let mut p = payment_of(100_000);
    p.provider = Provider::Khalti;
    p.created_at = now;
    let first = start_tally(&session, &p);
    let (d0, d1) = (
        day_key(&Tenant::new("proj_1", Mode::Sandbox), yesterday),
        day_key(&Tenant::new("proj_1", Mode::Sandbox), now),
    );
    assert_eq!(first.added(&d0, DayCounters::SESSIONS_INITIATED.name()), 1);
    assert_eq!(first.added(&d1, DayCounters::SESSIONS_INITIATED.name()), 0);
    assert_eq!(first.added(&d1, DayCounters::PAYMENTS_TOTAL.name()), 1);
    assert_eq!(first.added(&d1, "khalti_count"), 1);
    // A second attempt (back at the picker after a cancel): the
    // payment counts, the session does not again.
    session.attempts = 1;
    session.payment_id = Some("pay_first".into());
    let second = start_tally(&session, &p);
    assert_eq!(second.added(&d0, DayCounters::SESSIONS_INITIATED.name()), 0);
    assert_eq!(second.added(&d1, DayCounters::PAYMENTS_TOTAL.name()), 1);
}

#[tokio::test]
async fn a_success_counts_once_for_the_payment_and_its_session() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Khalti, now).await;
    let ok = apply(&st, &p, decide(&p, &paid(100_000), false), now)
        .await
        .unwrap();
    assert_eq!(ok.status, PaymentStatus::Success);
    // A replayed success changes nothing.
    apply(&st, &ok, decide(&ok, &paid(100_000), false), now)
        .await
        .unwrap();
    let c = counters(&st, now).await;
    assert_eq!(count(&c, "sessions_created"), 1);
    assert_eq!(count(&c, "sessions_paid"), 1);
    assert_eq!(count(&c, "payments_success"), 1);
    assert_eq!(count(&c, "payments_failed"), 0);
    assert_eq!(count(&c, "success_volume_paisa"), 100_000);
    assert_eq!(count(&c, "khalti_success"), 1);
    assert_eq!(count(&c, "khalti_success_volume"), 100_000);
}

#[tokio::test]
async fn a_decline_and_a_failed_start_count_as_failed_once() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let f = apply(&st, &p, Decision::Failed("declined".into()), now)
        .await
        .unwrap();
    apply(&st, &f, Decision::Failed("declined".into()), now)
        .await
        .unwrap();
    let (_, q) = attempt(&st, Provider::Esewa, now).await;
    apply(&st, &q, Decision::NotStarted("esewa: 503".into()), now)
        .await
        .unwrap();
    let c = counters(&st, now).await;
    assert_eq!(count(&c, "payments_failed"), 2);
    assert_eq!(count(&c, "payments_success"), 0);
    assert_eq!(count(&c, "sessions_paid"), 0);
}

#[tokio::test]
async fn a_cancel_counts_in_no_outcome_until_it_succeeds_after_all() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (_, p) = attempt(&st, Provider::Esewa, now).await;
    let c = apply(&st, &p, Decision::Cancelled("left".into()), now)
        .await
        .unwrap();
    let counted = counters(&st, now).await;
    assert_eq!(count(&counted, "payments_failed"), 0);
    assert_eq!(count(&counted, "payments_success"), 0);
    // Paid after all, the next day: counted on its creation day.
    let later = now.plus(chrono::Duration::hours(20));
    apply(&st, &c, decide(&c, &paid(100_000), false), later)
        .await
        .unwrap();
    let counted = counters(&st, now).await;
    assert_eq!(count(&counted, "payments_success"), 1);
    assert_eq!(count(&counted, "sessions_paid"), 1);
    assert!(counters(&st, later).await.is_empty());
}

#[tokio::test]
async fn a_double_payment_counts_the_payment_but_not_the_session_again() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let (s, first) = attempt(&st, Provider::Khalti, now).await;
    let first = apply(&st, &first, Decision::Cancelled("left".into()), now)
        .await
        .unwrap();
    let second = add_attempt(&st, &s, Provider::Khalti, "REF2", now).await;
    apply(&st, &second, decide(&second, &paid(100_000), false), now)
        .await
        .unwrap();
    // The first attempt was paid at the provider too.
    let late = apply(&st, &first, decide(&first, &paid(100_000), false), now)
        .await
        .unwrap();
    assert!(late.double_payment_of.is_some());
    let c = counters(&st, now).await;
    assert_eq!(count(&c, "payments_success"), 2);
    assert_eq!(count(&c, "sessions_paid"), 1);
}
