use super::create::{khalti_amount, marker_item, validate};
use super::resolve::{Others, Outcome, decide, resolve};
use super::*;
use crate::AppState;
use crate::app::Deps;
use crate::domain::outbox::EventType;
use crate::domain::payments::AttemptInfo;
use crate::domain::payments::{self, Payment, PaymentStatus};
use crate::domain::{Tenant, Window, outbox};
use crate::ids::{PaymentId, RefundId, SessionId};
use crate::providers::ProviderState;
use crate::store::embedded::EmbeddedStore;
use crate::store::{Store, TxOp, Update};
use crate::testenv::at;
use crate::time::ManualClock;
use serde_json::json;
use std::sync::Arc;

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

async fn paid(st: &Deps, provider: Provider, amount: i64) -> Payment {
    let now = at("2026-11-22T10:00:00Z");
    let p = Payment {
        id: PaymentId::new(),
        project_id: "proj_1".into(),
        checkout_session_id: SessionId::new(),
        mode: Mode::Sandbox,
        amount: Paisa::new(amount).unwrap(),
        amount_refunded: Paisa::ZERO,
        amount_reserved: Paisa::ZERO,
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider,
        status: PaymentStatus::Success,
        provider_ref: Some("TXN-1".into()),
        failure_reason: None,
        metadata: Default::default(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo::default(),
        checks: Default::default(),
    };
    payments::insert(&*st.store, &p).await.unwrap();
    p
}

fn ask(payment: &Payment, amount: i64) -> CreateRefund {
    CreateRefund {
        payment_id: payment.id.to_string(),
        amount,
        reason: RefundReason::CustomerRequest,
        notes: None,
        mobile_number: None,
    }
}

async fn reserved(st: &Deps, p: &Payment) -> i64 {
    let item = st.store.get(&Payment::key(&p.id)).await.unwrap().unwrap();
    crate::domain::record::from_item::<Payment>(item)
        .unwrap()
        .amount_reserved
        .get()
}

async fn kinds(st: &Deps) -> Vec<EventType> {
    let mut k: Vec<EventType> =
        outbox::recent(&*st.store, &Tenant::new("proj_1", Mode::Sandbox), 50)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event_type)
            .collect();
    k.reverse();
    k
}

#[tokio::test]
async fn fifty_racing_refunds_of_thirty_percent_reserve_at_most_the_amount() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let p = paid(&st, Provider::Esewa, 100_000).await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let st = st.clone();
        let req = ask(&p, 30_000);
        tasks.push(tokio::spawn(async move {
            let pid = req.payment().unwrap();
            create(
                &st,
                &Tenant::new("proj_1", Mode::Sandbox),
                pid,
                req,
                now,
                None,
            )
            .await
        }));
    }
    let (mut ok, mut over) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => {
                assert_eq!(r.status, RefundStatus::RequiresAction);
                ok += 1;
            }
            Err(RefundError::ExceedsBalance { .. }) => over += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((ok, over), (3, 47));
    assert_eq!(reserved(&st, &p).await, 90_000);
    let (listed, total) = list(
        &st,
        &Tenant::new("proj_1", Mode::Sandbox),
        Some(&p.id),
        Window::first(100),
    )
    .await
    .unwrap();
    assert_eq!((listed.len(), total), (3, 3));
}

#[tokio::test]
async fn refunds_are_refused_for_other_projects_fonepay_and_unpaid_payments() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let p = paid(&st, Provider::Esewa, 10_000).await;
    assert!(matches!(
        create(
            &st,
            &Tenant::new("proj_2", Mode::Sandbox),
            p.id.clone(),
            ask(&p, 100),
            now,
            None
        )
        .await,
        Err(RefundError::PaymentNotFound)
    ));
    assert!(matches!(
        create(
            &st,
            &Tenant::new("proj_1", Mode::Live),
            p.id.clone(),
            ask(&p, 100),
            now,
            None
        )
        .await,
        Err(RefundError::PaymentNotFound)
    ));
    assert!(matches!(
        create(
            &st,
            &Tenant::new("proj_1", Mode::Sandbox),
            p.id.clone(),
            ask(&p, 10_001),
            now,
            None
        )
        .await,
        Err(RefundError::ExceedsBalance {
            remaining: 10_000,
            ..
        })
    ));
    let f = paid(&st, Provider::Fonepay, 10_000).await;
    assert!(matches!(
        create(
            &st,
            &Tenant::new("proj_1", Mode::Sandbox),
            f.id.clone(),
            ask(&f, 100),
            now,
            None
        )
        .await,
        Err(RefundError::NotSupported(_))
    ));
    assert_eq!(reserved(&st, &f).await, 0);
    let mut pending = paid(&st, Provider::Esewa, 10_000).await;
    pending.id = PaymentId::new();
    pending.status = PaymentStatus::Pending;
    payments::insert(&*st.store, &pending).await.unwrap();
    assert!(matches!(
        create(
            &st,
            &Tenant::new("proj_1", Mode::Sandbox),
            pending.id.clone(),
            ask(&pending, 100),
            now,
            None
        )
        .await,
        Err(RefundError::NotRefundable(_))
    ));
}

/// A Khalti refund as `create` leaves it when Khalti does not answer:
/// `processing`, reserved, with its sweep marker.
async fn open_khalti_refund(st: &Deps, p: &Payment, amount: i64) -> Refund {
    let now = at("2026-11-22T10:00:00Z");
    let r = Refund {
        fee: None,
        fee_source: None,
        listed: false,
        id: RefundId::new(),
        project_id: p.project_id.clone(),
        payment_id: p.id.clone(),
        mode: p.mode,
        provider: Provider::Khalti,
        amount: Paisa::new(amount).unwrap(),
        currency: Currency::Npr,
        reason: RefundReason::Duplicate,
        status: RefundStatus::Processing,
        provider_refund_id: None,
        failure_reason: None,
        notes: None,
        mobile_number: None,
        created_at: now,
        updated_at: now,
    };
    st.store
        .transact(vec![
            TxOp::Update {
                key: Payment::key(&p.id),
                update: Update::new().add("amount_reserved", amount),
                cond: None,
            },
            TxOp::Put {
                item: crate::domain::record::Record::to_item(&r).unwrap(),
                cond: None,
            },
            TxOp::Put {
                item: marker_item(&r).unwrap(),
                cond: None,
            },
        ])
        .await
        .unwrap();
    r
}

#[tokio::test]
async fn resolving_moves_money_counters_and_events_once() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let p = paid(&st, Provider::Khalti, 10_000).await;
    let a = open_khalti_refund(&st, &p, 4_000).await;
    let b = open_khalti_refund(&st, &p, 6_000).await;
    // A failed refund releases its reservation, once.
    let failed = resolve(&st, &a, Outcome::Failed("no".into()), now)
        .await
        .unwrap();
    assert_eq!(failed.status, RefundStatus::Failed);
    assert_eq!(reserved(&st, &p).await, 6_000);
    let again = resolve(&st, &a, Outcome::Succeeded(None), now)
        .await
        .unwrap();
    assert_eq!(
        again.status,
        RefundStatus::Failed,
        "a final refund never moves"
    );
    assert_eq!(reserved(&st, &p).await, 6_000);
    // Refund the rest: 4,000 again, then B: the payment is refunded.
    let c = open_khalti_refund(&st, &p, 4_000).await;
    let mut tasks = Vec::new();
    for r in [b.clone(), c.clone(), b.clone(), c.clone()] {
        let st = st.clone();
        tasks.push(tokio::spawn(async move {
            resolve(&st, &r, Outcome::Succeeded(Some("TXN-1".into())), now).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status, RefundStatus::Succeeded);
    }
    let after = payments::get(&*st.store, &p.id).await.unwrap().unwrap();
    assert_eq!(after.amount_refunded.get(), 10_000);
    assert_eq!(after.status, PaymentStatus::Refunded);
    // One event per change, and `payment.refunded` exactly once,
    // however the two successes raced.
    assert_eq!(
        kinds_sorted(kinds(&st).await),
        kinds_sorted(vec![
            EventType::RefundFailed,
            EventType::RefundSucceeded,
            EventType::RefundSucceeded,
            EventType::PaymentRefunded,
        ])
    );
    // The sweep's queue is empty: every marker went with its refund.
    let later = now.plus(chrono::Duration::hours(1));
    assert_eq!(sweep(&st, later).await.unwrap(), RefundSweep::default());
}

/// A refund shows the fee the provider returns with it (none, by every
/// provider's assumed rule) and what it takes from the merchant; none for
/// a payment without a fee.
#[test]
fn a_refunds_fee_follows_its_providers_rule() {
    use crate::domain::payments::FeeSource;
    use crate::domain::refunds::{RefundView, returns_fee};
    for provider in Provider::ALL {
        assert!(
            !returns_fee(provider),
            "{provider:?}: UNCONFIRMED, assumed kept"
        );
    }
    let mut r = refund();
    let v = serde_json::to_value(RefundView::from(r.clone())).unwrap();
    assert_eq!(
        (&v["fee"], &v["net"], &v["feeSource"]),
        (&json!(null), &json!(null), &json!(null))
    );
    r.fee = Some(Paisa::ZERO);
    r.fee_source = Some(FeeSource::Provider);
    let v = serde_json::to_value(RefundView::from(r)).unwrap();
    assert_eq!(
        (&v["fee"], &v["net"], &v["feeSource"]),
        (&json!(0), &json!(3000), &json!("provider"))
    );
}

/// A refund created of a payment with a fee records the fee returned
/// (none kept back: zero) and the payment's source; of one without, none.
#[tokio::test]
async fn a_created_refund_carries_its_payments_fee_rule() {
    use crate::domain::payments::FeeSource;
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let p = paid(&st, Provider::Esewa, 10_000).await;
    st.store
        .update(
            &Payment::key(&p.id),
            crate::domain::record::Changes::<Payment>::new()
                .set_some(Payment::FEE_PROVIDER, &Paisa::new(300).unwrap())
                .into(),
            None,
        )
        .await
        .unwrap();
    let tenant = Tenant::new("proj_1", Mode::Sandbox);
    let r = create(&st, &tenant, p.id.clone(), ask(&p, 4_000), now, None)
        .await
        .unwrap();
    assert_eq!(
        (r.fee, r.fee_source),
        (Some(Paisa::ZERO), Some(FeeSource::Provider))
    );
    let q = paid(&st, Provider::Esewa, 10_000).await;
    let r = create(&st, &tenant, q.id.clone(), ask(&q, 4_000), now, None)
        .await
        .unwrap();
    assert_eq!((r.fee, r.fee_source), (None, None));
}

fn kinds_sorted(mut k: Vec<EventType>) -> Vec<EventType> {
    k.sort_by_key(|t| t.as_str());
    k
}

fn refund() -> Refund {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    Refund {
        fee: None,
        fee_source: None,
        listed: false,
        id: "ref_1".into(),
        project_id: "proj_1".into(),
        payment_id: "pay_1".into(),
        mode: Mode::Sandbox,
        provider: Provider::Khalti,
        amount: Paisa::new(3000).unwrap(),
        currency: Currency::Npr,
        reason: RefundReason::CustomerRequest,
        status: RefundStatus::Processing,
        provider_refund_id: None,
        failure_reason: None,
        notes: None,
        mobile_number: None,
        created_at: now,
        updated_at: now,
    }
}

#[test]
fn the_lookup_settles_an_open_refund_only_when_it_can_tell() {
    let r = refund(); // 3,000 paisa
    let full = Paisa::new(10_000).unwrap();
    let none = Others::default();
    let partial = ProviderState::Refunded { partial: true };
    let whole = ProviderState::Refunded { partial: false };
    // Alone and partly refunded: it was ours.
    assert_eq!(
        decide(&r, full, partial, none),
        Some(Outcome::Succeeded(None))
    );
    // Another live refund (open or succeeded): cannot tell.
    let one = Others {
        count: 1,
        total: 5_000,
    };
    assert!(matches!(
        decide(&r, full, partial, one),
        Some(Outcome::RequiresAction(_))
    ));
    // Fully refunded: ours only if the live refunds add up exactly.
    let rest = Others {
        count: 1,
        total: 7_000,
    };
    assert_eq!(
        decide(&r, full, whole, rest),
        Some(Outcome::Succeeded(None))
    );
    assert!(matches!(
        decide(&r, full, whole, none),
        Some(Outcome::RequiresAction(_))
    ));
    assert!(matches!(
        decide(&r, full, ProviderState::Paid, one),
        Some(Outcome::Failed(_))
    ));
    assert_eq!(decide(&r, full, ProviderState::Pending, none), None);
    assert_eq!(decide(&r, full, ProviderState::Ambiguous, none), None);
    // A whole-payment refund, alone, but Khalti says partly refunded:
    // ours was not applied (someone refunded part elsewhere).
    let mut whole_refund = refund();
    whole_refund.amount = full;
    assert!(matches!(
        decide(&whole_refund, full, partial, none),
        Some(Outcome::RequiresAction(_))
    ));
}

#[tokio::test]
async fn khalti_gets_an_empty_body_only_for_a_whole_untouched_payment() {
    let st = state(at("2026-11-22T10:00:00Z"));
    let mut p = paid(&st, Provider::Khalti, 3000).await;
    let r = refund(); // 3,000 paisa
    assert_eq!(khalti_amount(&r, &p), None);
    p.amount_refunded = Paisa::new(1).unwrap();
    assert_eq!(khalti_amount(&r, &p), Some(r.amount));
    p.amount_refunded = Paisa::ZERO;
    p.amount = Paisa::new(5000).unwrap();
    assert_eq!(khalti_amount(&r, &p), Some(r.amount));
}

#[test]
fn requests_are_checked_and_named() {
    let req = |v: serde_json::Value| serde_json::from_value::<CreateRefund>(v);
    let ok = req(serde_json::json!({"paymentId": "pay_1", "amount": 100, "reason": "duplicate"}))
        .unwrap();
    assert!(validate(&ok).is_ok());
    let zero = serde_json::json!({"paymentId": "pay_1", "amount": 0, "reason": "other"});
    match validate(&req(zero).unwrap()) {
        Err(RefundError::Invalid { field: f, .. }) => assert_eq!(f, "amount"),
        other => panic!("amount: {other:?}"),
    }
    // The note's and the mobile's rules live in their field types:
    // parsing stops there, naming the field.
    for (body, field) in [
        (
            serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "notes": "x".repeat(501)}),
            "notes",
        ),
        (
            serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "mobileNumber": "98-1"}),
            "mobileNumber",
        ),
    ] {
        let r: Result<CreateRefund, _> = serde_path_to_error::deserialize(body);
        assert_eq!(
            r.err().map(|e| e.path().to_string()).as_deref(),
            Some(field)
        );
    }
    let with_mobile = req(serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "mobileNumber": "+9779800000001"})).unwrap();
    assert!(validate(&with_mobile).is_ok());
    assert!(
        req(serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "bored"})).is_err()
    );
    assert!(req(serde_json::json!({"paymentId": "pay_1", "amount": 1})).is_err());
    assert!(
        req(serde_json::json!({"paymentId": "pay_1", "amount": 1, "reason": "other", "extra": 1}))
            .is_err()
    );
}

#[test]
fn the_view_uses_the_spec_names() {
    let v = serde_json::to_value(RefundView::from(refund())).unwrap();
    for f in [
        "id",
        "livemode",
        "paymentId",
        "projectId",
        "mode",
        "amount",
        "currency",
        "reason",
        "status",
        "createdAt",
        "updatedAt",
    ] {
        assert!(v.get(f).is_some(), "{f}");
    }
    // Optional fields: set, or omitted; never null against their type.
    for f in ["providerRefundId", "failureReason", "notes", "mobileNumber"] {
        assert_ne!(v.get(f), Some(&serde_json::Value::Null), "{f} is null");
    }
    assert_eq!(v["status"], "processing");
    assert_eq!(v["reason"], "customer_request");
}

#[tokio::test]
async fn the_dashboard_records_a_full_fonepay_refund_once_with_its_extra_ops() {
    let now = at("2026-11-22T10:00:00Z");
    let st = state(now);
    let f = paid(&st, Provider::Fonepay, 10_000).await;
    let via = |amount: i64, fence: Option<crate::store::fence::Fence>| {
        let st = st.clone();
        let req = ask(&f, amount);
        async move {
            let tenant = Tenant::new("proj_1", Mode::Sandbox);
            let request = RefundRequest {
                tenant: &tenant,
                payment_id: req.payment().unwrap(),
                body: req,
                channel: Channel::Dashboard,
                now,
                fence: fence.as_ref(),
            };
            create_via(&st, request, |r| {
                let mut item = crate::store::Item::new();
                item.insert("pk".into(), format!("EXTRA#{}", r.id).into());
                item.insert("sk".into(), "EXTRA".into());
                Ok(vec![TxOp::Put { item, cond: None }])
            })
            .await
        }
    };
    // Part of a Fonepay payment: refused, naming the amount; nothing held.
    let part = via(4_000, None).await;
    assert!(
        matches!(&part, Err(RefundError::Invalid { field: "amount", message }) if message.contains("NPR 100.00")),
        "{part:?}"
    );
    assert_eq!(reserved(&st, &f).await, 0);
    // The whole of it: recorded for the merchant's hand, with the extra op
    // in the same transaction; the same form again finds it.
    let fence = crate::store::fence::Fence::new(
        crate::store::Key::new("DFORM#mer#n", "FENCE"),
        now.plus(chrono::Duration::hours(24)).unix_seconds(),
    );
    let r = via(10_000, Some(fence.clone())).await.unwrap();
    assert_eq!(r.status, RefundStatus::RequiresAction);
    assert!(
        r.failure_reason
            .as_deref()
            .unwrap_or("")
            .contains("Fonepay merchant portal")
    );
    assert!(
        st.store
            .get(&crate::store::Key::new(format!("EXTRA#{}", r.id), "EXTRA"))
            .await
            .unwrap()
            .is_some()
    );
    let again = via(10_000, Some(fence)).await.unwrap();
    assert_eq!(again.id, r.id);
    assert_eq!(reserved(&st, &f).await, 10_000);
    // A second full refund (another form) is more than is left.
    assert!(via(10_000, None).await.is_err());
    // The API still refuses it.
    assert!(matches!(
        create(
            &st,
            &Tenant::new("proj_1", Mode::Sandbox),
            f.id.clone(),
            ask(&f, 10_000),
            now,
            None
        )
        .await,
        Err(RefundError::NotSupported(_))
    ));
}
