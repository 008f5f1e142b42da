use crate::AppState;
use crate::testenv::memory_store as store;
use std::sync::Arc;

use super::dispatch::dispatch;
use super::guards::{
    Places, Taken, WINDOW_TRIES, below, counter_update, merchant_counter, recipient_window,
    take_places,
};
use super::reminders::open_partition;
use super::request::{message_text, normalize_phone, validate};
use super::*;
use crate::Config;
use crate::Deps;
use crate::domain::account::Plan;
use crate::domain::account::Principal;
use crate::domain::checkout::CheckoutSession;
use crate::domain::record::Record;
use crate::domain::{Mode, Tenant};
use crate::ids::{MerchantId, SessionId, SmsId};
use crate::providers::sms::SmsClient;
use crate::queue::QueueName;
use crate::store::{Key, Store, TxReason, Update};
use crate::time::Timestamp;
use crate::time::{Clock, ManualClock, SystemClock};
use serde_json::json;

/// Guard 3 alone.
async fn take_abuse_limits(
    store: &dyn Store,
    limits: Limits,
    merchant_id: &MerchantId,
    mode: Mode,
    phone: &str,
    now: Timestamp,
) -> Result<(), SmsError> {
    take_places(
        store,
        Places {
            merchant_id,
            mode,
            phone,
            now,
            quota: None,
            limits,
        },
        None,
        None,
    )
    .await
    .map(|_| ())
}

/// One unit of the month's quota, as a request takes it.
async fn reserve_quota(
    store: &dyn Store,
    merchant_id: &MerchantId,
    quota: u32,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let taken = store
        .update(
            &quota_counter(merchant_id, now),
            counter_update(now.unix_seconds() + 40 * 86_400).into(),
            Some(below(i64::from(quota))),
        )
        .await;
    match taken {
        Ok(_) => Ok(true),
        Err(e) if e.is_condition_failure() => Ok(false),
        Err(e) => Err(e),
    }
}

async fn put_new(store: &dyn Store, r: &SmsReminder) -> Result<(), StoreError> {
    store.transact(vec![r.put_new()?]).await
}

fn req() -> NotifyRequest {
    NotifyRequest {
        customer_phone: "+977 984-1000001".into(),
        shop_name: "Sita's Shop".into(),
        order_name: "Order A-17".into(),
        amount_minor: 123_450,
        currency: "NPR".into(),
        checkout_url: "https://pay.example/l/lnk_1".into(),
    }
}

#[test]
fn phones_normalize_to_ten_digits() {
    for ok in [
        "9841000001",
        "+9779841000001",
        "+977 984 100 0001",
        "977-9841000001",
        "9701234567",
    ] {
        assert!(normalize_phone(ok).is_some(), "{ok}");
    }
    assert_eq!(
        normalize_phone("+977 9841000001").as_deref(),
        Some("9841000001")
    );
    for bad in [
        "",
        "984100000",
        "98410000011",
        "9641000001",
        "01-4412345",
        "+19841000001",
        "98410000o1",
        "+977+9841000001",
    ] {
        assert!(normalize_phone(bad).is_none(), "{bad}");
    }
}

#[test]
fn validation_names_the_field() {
    let field = |r: NotifyRequest| match validate(r) {
        Err(SmsError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert!(validate(req()).is_ok());
    assert_eq!(
        field(NotifyRequest {
            customer_phone: "12345".into(),
            ..req()
        }),
        "customerPhone"
    );
    assert_eq!(
        field(NotifyRequest {
            shop_name: " ".into(),
            ..req()
        }),
        "shopName"
    );
    assert_eq!(
        field(NotifyRequest {
            order_name: "x".repeat(61),
            ..req()
        }),
        "orderName"
    );
    assert_eq!(
        field(NotifyRequest {
            amount_minor: 0,
            ..req()
        }),
        "amountMinor"
    );
    assert_eq!(
        field(NotifyRequest {
            currency: "USD".into(),
            ..req()
        }),
        "currency"
    );
    assert_eq!(
        field(NotifyRequest {
            checkout_url: "javascript:alert(1)".into(),
            ..req()
        }),
        "checkoutUrl"
    );
    assert_eq!(
        field(NotifyRequest {
            checkout_url: "https://evil@pay.example/c".into(),
            ..req()
        }),
        "checkoutUrl"
    );
    let unknown: Result<NotifyRequest, _> = serde_json::from_value(json!({
        "customerPhone": "9841000001", "shopName": "a", "orderName": "b",
        "amountMinor": 1, "currency": "NPR", "checkoutUrl": "https://x/", "extra": 1
    }));
    assert!(unknown.is_err());
    let Ok(v) = validate(req()) else { panic!() };
    assert_eq!(v.checkout_host, "pay.example");
    assert!(
        message_text(&v).contains("NPR 1,234.50"),
        "{}",
        message_text(&v)
    );
}

#[tokio::test]
async fn abuse_counters_refuse_past_the_limits_and_take_nothing_then() {
    let store = store();
    let now = SystemClock.now();
    let limits = Limits {
        per_recipient_per_day: 2,
        per_merchant_per_hour: 3,
    };
    let take = |phone: &'static str| {
        let store = store.clone();
        async move { take_abuse_limits(&*store, limits, &"mer_1".into(), Mode::Live, phone, now).await }
    };
    assert!(take("9841000001").await.is_ok());
    assert!(take("9841000001").await.is_ok());
    assert!(matches!(
        take("9841000001").await,
        Err(SmsError::RateLimited { which, .. }) if which.contains("recipient")
    ));
    assert!(take("9841000002").await.is_ok());
    assert!(matches!(
        take("9841000003").await,
        Err(SmsError::RateLimited { which, .. }) if which.contains("merchant")
    ));
    // The refused requests took nothing.
    let n = |key: Key| {
        let store = store.clone();
        async move {
            store
                .get(&key)
                .await
                .ok()
                .flatten()
                .and_then(|i| i.get("n").and_then(|v| v.as_i64()))
                .unwrap_or(0)
        }
    };
    assert_eq!(
        n(merchant_counter(&"mer_1".into(), Mode::Live, now)).await,
        3
    );
    let window = store
        .get(&recipient_window(&"mer_1".into(), Mode::Live, "9841000003"))
        .await;
    assert!(matches!(window, Ok(None)), "{window:?}");
    // Sandbox counts apart.
    assert!(
        take_abuse_limits(
            &*store,
            limits,
            &"mer_1".into(),
            Mode::Sandbox,
            "9841000001",
            now
        )
        .await
        .is_ok()
    );
}

#[tokio::test]
async fn concurrent_abuse_counters_never_pass_the_limit() {
    let store = store();
    let now = SystemClock.now();
    let limits = Limits {
        per_recipient_per_day: 3,
        per_merchant_per_hour: 100,
    };
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                take_abuse_limits(
                    &*store,
                    limits,
                    &"mer_1".into(),
                    Mode::Live,
                    "9841000001",
                    now,
                )
                .await
                .is_ok()
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        if matches!(t.await, Ok(true)) {
            ok += 1;
        }
    }
    assert_eq!(ok, 3);
}

#[tokio::test]
async fn concurrent_quota_reservations_stop_at_the_quota_and_refusals_take_nothing() {
    let store = store();
    let now = SystemClock.now();
    let limits = Limits::default();
    let take = |phone: String, quota: u32, at: Timestamp| {
        let store = store.clone();
        async move {
            take_places(
                &*store,
                Places {
                    merchant_id: &"mer_1".into(),
                    mode: Mode::Live,
                    phone: &phone,
                    now: at,
                    quota: Some(quota),
                    limits,
                },
                None,
                None,
            )
            .await
        }
    };
    let tasks: Vec<_> = (0..10)
        .map(|i| tokio::spawn(take(format!("98410000{:02}", 10 + i), 3, now)))
        .collect();
    let (mut all, mut exhausted) = (0, 0);
    for t in tasks {
        match t.await {
            Ok(Ok(Taken::All)) => all += 1,
            Ok(Ok(Taken::QuotaExhausted)) => exhausted += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((all, exhausted), (3, 7), "exactly the quota is reserved");
    // The refused requests took no abuse place.
    let n = |key: Key| {
        let store = store.clone();
        async move {
            store
                .get(&key)
                .await
                .ok()
                .flatten()
                .and_then(|i| i.get("n").and_then(|v| v.as_i64()))
                .unwrap_or(0)
        }
    };
    assert_eq!(
        n(merchant_counter(&"mer_1".into(), Mode::Live, now)).await,
        3
    );
    assert_eq!(n(quota_counter(&"mer_1".into(), now)).await, 3);
    // A plan without SMS: refused, nothing taken.
    let r = take("9841000099".into(), 0, now).await;
    assert!(matches!(r, Ok(Taken::QuotaExhausted)), "{r:?}");
    assert_eq!(
        n(merchant_counter(&"mer_1".into(), Mode::Live, now)).await,
        3
    );
    let window = store
        .get(&recipient_window(&"mer_1".into(), Mode::Live, "9841000099"))
        .await;
    assert!(matches!(window, Ok(None)), "{window:?}");
    // Another month starts afresh.
    let next = now.plus(chrono::Duration::days(32));
    let r = take("9841000099".into(), 3, next).await;
    assert!(matches!(r, Ok(Taken::All)), "{r:?}");
}

#[tokio::test]
async fn a_full_hour_is_rate_limited_before_the_quota_is_looked_at() {
    let store = store();
    let now = SystemClock.now();
    let limits = Limits {
        per_recipient_per_day: 3,
        per_merchant_per_hour: 1,
    };
    let take = |phone: &'static str, quota: u32| {
        let store = store.clone();
        async move {
            take_places(
                &*store,
                Places {
                    merchant_id: &"mer_1".into(),
                    mode: Mode::Live,
                    phone,
                    now,
                    quota: Some(quota),
                    limits,
                },
                None,
                None,
            )
            .await
        }
    };
    assert!(matches!(take("9841000001", 5).await, Ok(Taken::All)));
    // Hour full and quota 0: the abuse limit (guard 3) answers.
    let r = take("9841000002", 0).await;
    assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
}

#[tokio::test]
async fn a_reminder_whose_message_was_lost_is_queued_again_once_per_sweep() {
    let (state, _who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let now = clock.now();
    let mut reminder = SmsReminder {
        id: SmsId::new(),
        project_id: "proj_1".into(),
        merchant_id: "mer_1".into(),
        mode: Mode::Live,
        to: "9841000001".into(),
        text: "pay".into(),
        session_id: None,
        invoice_id: None,
        status: SmsStatus::Queued,
        attempts: 0,
        lease_until_ms: None,
        last_error: None,
        created_at: now,
        updated_at: now,
        claim: None,
        ttl: None,
        gsi2pk: None,
        gsi2sk: None,
        counted: false,
    };
    reminder.list_open(now);
    // Recorded, but its queue message never went out (a crash).
    let Ok(()) = put_new(&*state.store, &reminder).await else {
        panic!("put")
    };
    let swept = |at| requeue_stuck(&state, at, 10);
    assert_eq!(swept(now).await.ok(), Some(0), "not stuck yet");
    let later = now.plus(chrono::Duration::minutes(6));
    assert_eq!(swept(later).await.ok(), Some(1));
    assert_eq!(
        swept(later).await.ok(),
        Some(0),
        "moved forward: once per sweep"
    );
    let Ok(got) = state
        .queue
        .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
        .await
    else {
        panic!("receive")
    };
    assert_eq!(got.len(), 1);
    assert!(got[0].body.contains(reminder.id.as_str()));
    // Once final it leaves the index and is never queued again.
    let Ok(_) = state
        .store
        .update(
            &SmsReminder::key(&reminder.id),
            Update::new().set("status", "sent"),
            None,
        )
        .await
    else {
        panic!("update")
    };
    let much_later = later.plus(chrono::Duration::minutes(10));
    assert_eq!(swept(much_later).await.ok(), Some(0));
    assert_eq!(
        swept(much_later.plus(chrono::Duration::minutes(10)))
            .await
            .ok(),
        Some(0)
    );
}

async fn state_with_tenant(plan: Plan, mode: Mode) -> (AppState, Principal, Arc<ManualClock>) {
    state_on(store(), plan, mode).await
}

async fn state_on(
    store: Arc<dyn Store>,
    plan: Plan,
    mode: Mode,
) -> (AppState, Principal, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let state = AppState::new(
        store.clone(),
        clock.clone(),
        Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let now = clock.now();
    let Ok(merchant) =
        super::super::account::create_merchant(&*store, now, "M", "m@example.com", plan).await
    else {
        panic!("merchant")
    };
    let Ok(project) =
        super::super::account::create_project(&*store, now, &merchant, "Shop", false).await
    else {
        panic!("project")
    };
    let new = super::super::account::NewKey {
        mode,
        kind: super::super::account::KeyKind::Secret,
        scopes: super::super::account::Scope::ALL.to_vec(),
        description: "k".into(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    let Ok((_, key)) = super::super::account::issue_api_key(&state, now, &project, new).await
    else {
        panic!("key")
    };
    (state, Principal::new(key, merchant), clock)
}

async fn session(state: &Deps, who: &Principal, phone: &str) -> SessionId {
    // Ids sort by the wall clock's millisecond: keep them apart.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let now = state.clock.now();
    let id = SessionId::new();
    let item = json!({
        "pk": format!("CS#{id}"), "sk": "CS",
        "gsi1pk": format!("PROJ#{}#{}#CS", who.project_id(), who.mode().as_str()),
        "gsi1sk": id,
        "id": id, "project_id": who.project_id(), "mode": who.mode(),
        "api_key_id": who.key.id, "flow": "hosted", "amount": 1000, "currency": "NPR",
        "status": "pending", "customer_phone": phone,
        "return_url": "https://shop.example/r",
        "expires_at": now.plus(chrono::Duration::hours(1)),
        "created_at": now, "updated_at": now,
    });
    let Some(item) = item.as_object().cloned() else {
        panic!()
    };
    if let Err(e) = state.store.put(item, None).await {
        panic!("{e}")
    }
    id
}

#[tokio::test]
async fn the_guards_apply_in_order() {
    let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
    let base = "https://pay.example";
    let limits = Limits {
        per_recipient_per_day: 1,
        per_merchant_per_hour: 100,
    };
    let bad_host = NotifyRequest {
        checkout_url: "https://evil.example/c/x".into(),
        ..req()
    };
    // 1 before 2: no session and a bad host → phone_not_on_session.
    let r = notify(&state, &who, bad_host.clone(), base, limits, None).await;
    assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
    session(&state, &who, "+977-9841000001").await;
    // 2 before 3.
    let r = notify(&state, &who, bad_host.clone(), base, limits, None).await;
    assert!(
        matches!(r, Err(SmsError::InvalidCheckoutHost { .. })),
        "{r:?}"
    );
    let r = notify(&state, &who, req(), base, limits, None).await;
    assert!(
        matches!(&r, Ok(o) if o.status == "logged" && !o.sent),
        "{r:?}"
    );
    let r = notify(&state, &who, req(), base, limits, None).await;
    assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
    // Bad host still answers 400 over the exhausted limit.
    let r = notify(&state, &who, bad_host, base, limits, None).await;
    assert!(
        matches!(r, Err(SmsError::InvalidCheckoutHost { .. })),
        "{r:?}"
    );
    // A session older than 24 h does not count.
    clock.advance(chrono::Duration::hours(25));
    let r = notify(
        &state,
        &who,
        NotifyRequest {
            customer_phone: "9841000001".into(),
            ..req()
        },
        base,
        limits,
        None,
    )
    .await;
    assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
}

#[tokio::test]
async fn live_reminders_take_the_quota_and_free_plans_have_none() {
    let (state, who, _) = state_with_tenant(Plan::Free, Mode::Live).await;
    session(&state, &who, "9841000001").await;
    let r = notify(
        &state,
        &who,
        req(),
        "https://pay.example",
        Limits::default(),
        None,
    )
    .await;
    assert!(
        matches!(&r, Ok(o) if o.status == "plan_limit_reached" && !o.sent),
        "{r:?}"
    );
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
    session(&state, &who, "9841000001").await;
    let r = notify(
        &state,
        &who,
        req(),
        "https://pay.example",
        Limits::default(),
        None,
    )
    .await;
    assert!(
        matches!(&r, Ok(o) if o.status == "queued" && o.sent),
        "{r:?}"
    );
    let got = state
        .queue
        .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
        .await;
    assert!(matches!(got.as_deref(), Ok([_])), "{got:?}");
}

/// A provider on loopback answering `status` to every send, counting
/// the sends; `None` answers nothing at all (holds the connection).
async fn provider(status: Option<u16>) -> (SmsClient, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new().fallback(move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            match status {
                Some(s) => {
                    http::StatusCode::from_u16(s).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR)
                }
                None => {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    http::StatusCode::OK
                }
            }
        }
    });
    let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
        panic!("bind")
    };
    let Ok(addr) = listener.local_addr() else {
        panic!("addr")
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = match SmsClient::new(crate::providers::sms::SmsConfig {
        base_url: format!("http://{addr}"),
        token: "t".into(),
        from: "Dhukuti".into(),
        timeout: Duration::from_millis(300),
    }) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    (client, calls)
}

fn calls(c: &std::sync::atomic::AtomicUsize) -> usize {
    c.load(std::sync::atomic::Ordering::SeqCst)
}

/// A live reminder queued the way `notify` does (its quota unit taken),
/// bound to a fresh pending session of `who`.
async fn queued_reminder(state: &Deps, who: &Principal) -> SmsReminder {
    let now = state.clock.now();
    let session_id = session(state, who, "9841000001").await;
    assert!(matches!(
        reserve_quota(&*state.store, &who.merchant.id.as_str().into(), 200, now).await,
        Ok(true)
    ));
    let mut r = SmsReminder {
        id: SmsId::new(),
        project_id: who.tenant().project.clone(),
        merchant_id: who.merchant.id.clone(),
        mode: Mode::Live,
        to: "9841000001".into(),
        text: "hi".into(),
        session_id: Some(session_id),
        invoice_id: None,
        status: SmsStatus::Queued,
        attempts: 0,
        lease_until_ms: None,
        last_error: None,
        created_at: now,
        updated_at: now,
        claim: None,
        ttl: None,
        gsi2pk: None,
        gsi2sk: None,
        counted: false,
    };
    r.list_open(now);
    if let Err(e) = put_new(&*state.store, &r).await {
        panic!("{e}")
    }
    r
}

async fn quota_used(state: &Deps, who: &Principal) -> i64 {
    let now = state.clock.now();
    state
        .store
        .get(&quota_counter(&who.merchant.id.as_str().into(), now))
        .await
        .ok()
        .flatten()
        .and_then(|i| i.get("n").and_then(|v| v.as_i64()))
        .unwrap_or(0)
}

async fn status_of(state: &Deps, id: &SmsId) -> SmsReminder {
    match get(&*state.store, id).await {
        Ok(Some(r)) => r,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_claimed_reminder_is_never_sent_twice_even_after_its_lease_runs_out() {
    let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(200)).await;
    let mut r = queued_reminder(&state, &who).await;
    // A dispatcher claimed it (and may have sent it), then stopped.
    let lease_until = clock.now().unix_millis() + 60_000;
    let Ok(_) = state
        .store
        .update(
            &SmsReminder::key(&r.id),
            Update::new()
                .set("status", "sending")
                .set("lease_until_ms", lease_until),
            None,
        )
        .await
    else {
        panic!("claim")
    };
    r.lease_until_ms = Some(lease_until);
    // While it holds the lease, a duplicate message sends nothing.
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
    // After the lease: it may have gone out, so it is not sent again.
    clock.advance(chrono::Duration::seconds(61));
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Unknown)), "{d:?}");
    let got = status_of(&state, &r.id).await;
    assert_eq!(got.status, SmsStatus::Unknown);
    assert!(got.lease_until_ms.is_none());
    assert_eq!(calls(&sent), 0, "never sent a second time");
    // Its quota unit is kept (it may have been delivered and billed).
    assert_eq!(quota_used(&state, &who).await, 1);
    // Final: every later message is dropped, the sweep leaves it.
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
    let later = clock.now().plus(chrono::Duration::minutes(30));
    assert_eq!(requeue_stuck(&state, later, 10).await.ok(), Some(0));
    assert_eq!(calls(&sent), 0);
}

#[tokio::test]
async fn a_send_that_may_have_reached_the_provider_is_never_retried() {
    for answer in [Some(500), Some(502), Some(504), None] {
        let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
        let (client, sent) = provider(answer).await;
        let r = queued_reminder(&state, &who).await;
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(
            matches!(d, Ok(DispatchOutcome::Unknown)),
            "{answer:?}: {d:?}"
        );
        let got = status_of(&state, &r.id).await;
        assert_eq!(got.status, SmsStatus::Unknown, "{answer:?}");
        assert_eq!(got.attempts, 1);
        // The queue redelivers, the sweep runs: nothing more is sent.
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
        assert_eq!(calls(&sent), 1, "{answer:?}: one send, never two");
        assert_eq!(quota_used(&state, &who).await, 1, "kept: it may be billed");
    }
}

#[tokio::test]
async fn a_send_that_certainly_did_not_arrive_is_retried_then_given_up_with_the_unit_back() {
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(503)).await;
    let r = queued_reminder(&state, &who).await;
    for attempt in 1..MAX_ATTEMPTS {
        let d = dispatch(&state, &client, &r.id, LEASE).await;
        assert!(matches!(d, Err(DispatchError::Transient(_))), "{d:?}");
        let got = status_of(&state, &r.id).await;
        assert_eq!((got.status, got.attempts), (SmsStatus::Queued, attempt));
    }
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
    assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Failed);
    assert_eq!(calls(&sent) as u32, MAX_ATTEMPTS);
    assert_eq!(quota_used(&state, &who).await, 0, "the unit is given back");
    // Once: a duplicate message gives nothing back a second time.
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Skipped)), "{d:?}");
    assert_eq!(quota_used(&state, &who).await, 0);
}

#[tokio::test]
async fn a_refused_reminder_fails_at_once_and_gives_its_unit_back() {
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(400)).await;
    // Another reminder's unit stays taken.
    assert!(matches!(
        reserve_quota(
            &*state.store,
            &who.merchant.id.as_str().into(),
            200,
            state.clock.now()
        )
        .await,
        Ok(true)
    ));
    let r = queued_reminder(&state, &who).await;
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
    assert_eq!(calls(&sent), 1);
    assert_eq!(quota_used(&state, &who).await, 1);
}

#[tokio::test]
async fn a_reminder_ending_after_its_month_counter_expired_still_ends_and_makes_no_counter() {
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(400)).await;
    let r = queued_reminder(&state, &who).await;
    // The month's counter is gone (its TTL ran out) before the end.
    let counter = quota_counter(&who.merchant.id.as_str().into(), r.created_at);
    if let Err(e) = state.store.delete(&counter, None).await {
        panic!("{e}")
    }
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
    assert_eq!(calls(&sent), 1);
    assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Failed);
    // Nothing to give back to: no counter made, certainly not at -1.
    assert!(matches!(state.store.get(&counter).await, Ok(None)));
}

#[tokio::test]
async fn a_reminder_for_a_session_paid_meanwhile_is_cancelled_unsent() {
    let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(200)).await;
    let r = queued_reminder(&state, &who).await;
    let Some(session_id) = r.session_id.clone() else {
        panic!("bound")
    };
    let Ok(_) = state
        .store
        .update(
            &CheckoutSession::key(&session_id),
            Update::new().set("status", "success"),
            None,
        )
        .await
    else {
        panic!("pay")
    };
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Cancelled)), "{d:?}");
    let got = status_of(&state, &r.id).await;
    assert_eq!(got.status, SmsStatus::Cancelled);
    assert!(
        got.last_error
            .as_deref()
            .is_some_and(|e| e.contains("success")),
        "{got:?}"
    );
    assert_eq!(calls(&sent), 0);
    assert_eq!(quota_used(&state, &who).await, 0);
    // An expired session cancels too.
    let r = queued_reminder(&state, &who).await;
    clock.advance(chrono::Duration::hours(2));
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Cancelled)), "{d:?}");
    assert_eq!(calls(&sent), 0);
    // A payable one is sent.
    let r = queued_reminder(&state, &who).await;
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
    assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Sent);
    assert_eq!(calls(&sent), 1);
}

#[tokio::test]
async fn concurrent_copies_of_one_message_send_once() {
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(200)).await;
    let r = queued_reminder(&state, &who).await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (state, client, id) = (state.clone(), client.clone(), r.id.clone());
            tokio::spawn(async move { dispatch(&state, &client, &id, LEASE).await })
        })
        .collect();
    let mut sends = 0;
    for t in tasks {
        if matches!(t.await, Ok(Ok(DispatchOutcome::Sent))) {
            sends += 1;
        }
    }
    assert_eq!((sends, calls(&sent)), (1, 1));
}

#[tokio::test]
async fn the_recipient_limit_is_a_rolling_24_hours() {
    let store = store();
    let limits = Limits {
        per_recipient_per_day: 3,
        per_merchant_per_hour: 100,
    };
    // 22:00 UTC: a fixed day would reset at midnight, two hours later.
    let Some(t0) = chrono::DateTime::from_timestamp(1_795_298_400, 0) else {
        panic!("time")
    };
    let t0 = Timestamp::from_datetime(t0);
    let at = |mins: i64| t0.plus(chrono::Duration::minutes(mins));
    let take = |when: Timestamp| {
        let store = store.clone();
        async move {
            take_abuse_limits(
                &*store,
                limits,
                &"mer_1".into(),
                Mode::Live,
                "9841000001",
                when,
            )
            .await
        }
    };
    for m in [0, 60, 90] {
        assert!(take(at(m)).await.is_ok(), "{m}");
    }
    // Past midnight: still three in the last 24 h.
    match take(at(180)).await {
        Err(SmsError::RateLimited {
            retry_after_secs, ..
        }) => assert_eq!(retry_after_secs, (24 * 60 - 180) * 60),
        other => panic!("{other:?}"),
    }
    // 24 h after the first, one place is free again; then full again.
    assert!(take(at(24 * 60 + 1)).await.is_ok());
    assert!(matches!(
        take(at(24 * 60 + 2)).await,
        Err(SmsError::RateLimited { .. })
    ));
    // Another recipient, another window.
    assert!(
        take_abuse_limits(
            &*store,
            limits,
            &"mer_1".into(),
            Mode::Live,
            "9841000002",
            at(181)
        )
        .await
        .is_ok()
    );
}

#[tokio::test]
async fn a_url_naming_a_session_binds_the_reminder_to_it() {
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
    let (_, other, _) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
    let base = "https://pay.example";
    let mine = session(&state, &who, "9841000001").await;
    let newer = session(&state, &who, "9841000001").await;
    let not_theirs = session(&state, &who, "9841000009").await;
    // Another project's session on the same store.
    let foreign = session(&state, &other, "9841000001").await;
    let with_url = |id: &str| NotifyRequest {
        checkout_url: format!("{base}/c/{id}?lang=ne"),
        ..req()
    };
    let r = notify(&state, &who, with_url(&mine), base, Limits::default(), None).await;
    assert!(matches!(&r, Ok(o) if o.status == "logged"), "{r:?}");
    let Ok(list) = list_recent(
        &*state.store,
        &Tenant::new(who.project_id().clone(), Mode::Sandbox),
        10,
    )
    .await
    else {
        panic!("list")
    };
    assert_eq!(list[0].session_id.as_deref(), Some(mine.as_str()));
    // A URL without a session id binds to the newest pending session.
    let r = notify(&state, &who, req(), base, Limits::default(), None).await;
    assert!(r.is_ok(), "{r:?}");
    let Ok(list) = list_recent(
        &*state.store,
        &Tenant::new(who.project_id().clone(), Mode::Sandbox),
        10,
    )
    .await
    else {
        panic!("list")
    };
    assert_eq!(list[0].session_id.as_deref(), Some(newer.as_str()));
    // The project's session of another customer: guard 1 refuses.
    let r = notify(
        &state,
        &who,
        with_url(&not_theirs),
        base,
        Limits::default(),
        None,
    )
    .await;
    assert!(matches!(r, Err(SmsError::PhoneNotOnSession)), "{r:?}");
    // Another project's session: guard 2 refuses.
    let r = notify(
        &state,
        &who,
        with_url(&foreign),
        base,
        Limits::default(),
        None,
    )
    .await;
    assert!(
        matches!(&r, Err(SmsError::ForeignCheckoutSession { given }) if *given == foreign),
        "{r:?}"
    );
    let b = "https://pay.example";
    assert_eq!(
        session_in_url("https://pay.example/c/cs_01ab/pay", b),
        Some("cs_01ab")
    );
    assert_eq!(
        session_in_url("https://pay.example/c/cs_01ab?x=1", b),
        Some("cs_01ab")
    );
    assert_eq!(session_in_url("https://pay.example/l/lnk_1", b), None);
    assert_eq!(session_in_url("https://pay.example/c/x_1", b), None);
    assert_eq!(session_in_url("https://pay.example", b), None);
    // A query or fragment never names a session.
    assert_eq!(session_in_url("https://pay.example?x=/c/cs_01ab", b), None);
    assert_eq!(session_in_url("https://pay.example#/c/cs_01ab", b), None);
    // Under a base URL with a path.
    let b = "https://x.example/pay/";
    assert_eq!(
        session_in_url("https://x.example/pay/c/cs_01ab", b),
        Some("cs_01ab")
    );
    assert_eq!(session_in_url("https://x.example/c/cs_01ab", b), None);
}

#[tokio::test]
async fn a_conflict_while_ending_a_reminder_is_retried_and_the_unit_comes_back() {
    use crate::store::faults::{Fault, FaultyStore, Op};
    let faulty = Arc::new(FaultyStore::new(store()));
    let (state, who, _) = state_on(faulty.clone(), Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(400)).await;
    let r = queued_reminder(&state, &who).await;
    // Many reminders of the merchant end at once: the first give-back
    // meets another transaction on the quota item.
    faulty.plan(
        Op::Transact,
        0,
        Fault::Before(StoreError::TransactionCanceled {
            reasons: vec![TxReason::None, TxReason::Conflict],
        }),
    );
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Failed)), "{d:?}");
    assert_eq!(faulty.injected(), 1);
    assert_eq!(calls(&sent), 1);
    assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Failed);
    assert_eq!(
        quota_used(&state, &who).await,
        0,
        "given back after the retry"
    );
}

#[tokio::test]
async fn a_store_error_before_the_send_gives_the_claim_back() {
    use crate::store::faults::{Fault, FaultyStore, Op};
    let faulty = Arc::new(FaultyStore::new(store()));
    let (state, who, _) = state_on(faulty.clone(), Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(200)).await;
    let r = queued_reminder(&state, &who).await;
    // Reads: the reminder, then its session (throttled).
    faulty.plan(Op::Get, 1, Fault::throttled());
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Err(DispatchError::Store(_))), "{d:?}");
    assert_eq!(faulty.injected(), 1);
    let got = status_of(&state, &r.id).await;
    assert_eq!(
        (got.status, got.attempts),
        (SmsStatus::Queued, 0),
        "{got:?}"
    );
    assert!(got.lease_until_ms.is_none());
    assert_eq!(calls(&sent), 0);
    // The queue's next delivery sends it (not `unknown`).
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
    assert_eq!(calls(&sent), 1);
}

#[tokio::test]
async fn a_busy_store_after_the_send_is_retried_so_the_outcome_is_kept() {
    use crate::store::faults::{Fault, FaultyStore, Op};
    let faulty = Arc::new(FaultyStore::new(store()));
    let (state, who, _) = state_on(faulty.clone(), Plan::Growth, Mode::Live).await;
    let (client, sent) = provider(Some(200)).await;
    let r = queued_reminder(&state, &who).await;
    // Updates: the claim, then the `sent` write (throttled twice).
    faulty.plan(Op::Update, 1, Fault::throttled());
    faulty.plan(Op::Update, 2, Fault::throttled());
    let d = dispatch(&state, &client, &r.id, LEASE).await;
    assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
    assert_eq!(faulty.injected(), 2);
    assert_eq!(status_of(&state, &r.id).await.status, SmsStatus::Sent);
    assert_eq!(calls(&sent), 1);
}

/// A queue that is down for sends (receives from the inner one).
struct DownForSends(Arc<dyn crate::queue::Queue>);

#[async_trait::async_trait]
impl crate::queue::Queue for DownForSends {
    async fn send(&self, _: QueueName, _: &str, _: Duration) -> Result<String, QueueError> {
        Err(QueueError::Unavailable("injected".into()))
    }
    async fn receive(
        &self,
        queue: QueueName,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<crate::queue::Message>, QueueError> {
        self.0.receive(queue, max, wait, visibility).await
    }
    async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError> {
        self.0.delete(queue, receipt).await
    }
}

#[tokio::test]
async fn a_reminder_the_queue_refused_is_answered_queued_and_swept_later() {
    let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let working = state.queue.clone();
    let down = state
        .clone()
        .with_queue(Arc::new(DownForSends(working.clone())));
    session(&down, &who, "9841000001").await;
    let r = notify(
        &down,
        &who,
        req(),
        "https://pay.example",
        Limits::default(),
        None,
    )
    .await;
    // Stored and counted: it will go out, so the answer says queued.
    assert!(
        matches!(&r, Ok(o) if o.status == "queued" && o.sent),
        "{r:?}"
    );
    assert_eq!(quota_used(&state, &who).await, 1);
    let Ok(list) = list_recent(
        &*state.store,
        &Tenant::new(who.project_id().clone(), Mode::Live),
        10,
    )
    .await
    else {
        panic!("list")
    };
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].status, SmsStatus::Queued);
    // The backstop queues it once it is overdue.
    let later = clock.now().plus(chrono::Duration::minutes(6));
    assert_eq!(requeue_stuck(&state, later, 10).await.ok(), Some(1));
    let got = working
        .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
        .await;
    assert!(
        matches!(got.as_deref(), Ok([m]) if m.body.contains(list[0].id.as_str())),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_full_hour_under_endless_conflicts_is_still_a_429() {
    use crate::store::faults::{Fault, FaultyStore, Op};
    let faulty = Arc::new(FaultyStore::new(store()));
    let now = SystemClock.now();
    let limits = Limits {
        per_recipient_per_day: 3,
        per_merchant_per_hour: 2,
    };
    let hour = merchant_counter(&"mer_1".into(), Mode::Live, now);
    let Ok(_) = faulty.update(&hour, Update::new().add("n", 2), None).await else {
        panic!("seed")
    };
    for i in 0..WINDOW_TRIES {
        faulty.plan(
            Op::Transact,
            i,
            Fault::Before(StoreError::TransactionCanceled {
                reasons: vec![TxReason::None, TxReason::Conflict],
            }),
        );
    }
    let r = take_places(
        &*faulty,
        Places {
            merchant_id: &"mer_1".into(),
            mode: Mode::Live,
            phone: "9841000001",
            now,
            quota: Some(10),
            limits,
        },
        None,
        None,
    )
    .await;
    assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
    // Under the limit, the same conflicts are a busy store (503).
    let calm = store();
    let faulty = Arc::new(FaultyStore::new(calm));
    for i in 0..WINDOW_TRIES {
        faulty.plan(
            Op::Transact,
            i,
            Fault::Before(StoreError::TransactionCanceled {
                reasons: vec![TxReason::None, TxReason::Conflict],
            }),
        );
    }
    let r = take_places(
        &*faulty,
        Places {
            merchant_id: &"mer_1".into(),
            mode: Mode::Live,
            phone: "9841000001",
            now,
            quota: Some(10),
            limits,
        },
        None,
        None,
    )
    .await;
    assert!(
        matches!(r, Err(SmsError::Store(StoreError::Unavailable(_)))),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_unreadable_reminder_is_passed_over_then_taken_out_of_the_sweep() {
    let (state, _, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let id = SmsId::new();
    let item = json!({"pk": format!("SMS#{id}"), "sk": "SMS",
                          "gsi2pk": open_partition(&id), "gsi2sk": format!("{:015}#{id}", 1),
                          "status": "teleported"});
    let Some(item) = item.as_object().cloned() else {
        panic!()
    };
    let Ok(()) = state.store.put(item, None).await else {
        panic!("put")
    };
    let now = clock.now();
    assert_eq!(requeue_stuck(&state, now, 10).await.ok(), Some(0));
    let kept = state.store.get(&SmsReminder::key(&id)).await;
    assert!(
        matches!(&kept, Ok(Some(i)) if i.contains_key("gsi2pk")),
        "young: kept for newer code"
    );
    let later = now.plus(chrono::Duration::hours(2));
    assert_eq!(requeue_stuck(&state, later, 10).await.ok(), Some(0));
    let out = state.store.get(&SmsReminder::key(&id)).await;
    assert!(
        matches!(&out, Ok(Some(i)) if !i.contains_key("gsi2pk")),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_retry_whose_first_run_took_the_last_place_answers_as_the_first() {
    use crate::store::fence::Fence;
    let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
    session(&state, &who, "9841000001").await;
    let limits = Limits {
        per_recipient_per_day: 1,
        per_merchant_per_hour: 100,
    };
    let ttl = clock.now().unix_seconds() + 86_400;
    let fence = Fence::new(Key::new("IDEMFENCE#p#sandbox#k1", "FENCE"), ttl);
    let base = "https://pay.example";
    let r = notify(&state, &who, req(), base, limits, Some(&fence)).await;
    assert!(matches!(&r, Ok(o) if o.status == "logged"), "{r:?}");
    // Its answer was lost; the retry finds the window full (with its
    // own first run) and answers as the first run did.
    let r = notify(&state, &who, req(), base, limits, Some(&fence)).await;
    assert!(matches!(&r, Ok(o) if o.status == "logged"), "{r:?}");
    let Ok(list) = list_recent(
        &*state.store,
        &Tenant::new(who.project_id().clone(), Mode::Sandbox),
        10,
    )
    .await
    else {
        panic!("list")
    };
    assert_eq!(list.len(), 1, "one reminder");
    // Another request (another key) is refused.
    let other = Fence::new(Key::new("IDEMFENCE#p#sandbox#k2", "FENCE"), ttl);
    let r = notify(&state, &who, req(), base, limits, Some(&other)).await;
    assert!(matches!(r, Err(SmsError::RateLimited { .. })), "{r:?}");
}

#[tokio::test]
async fn a_reminder_keeps_its_expiry_open_entry_and_claim_as_fields() {
    let (state, who, clock) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let (client, _sent) = provider(Some(200)).await;
    session(&state, &who, "9841000001").await;
    let r = notify(
        &state,
        &who,
        req(),
        "https://pay.example",
        Limits::default(),
        None,
    )
    .await;
    assert!(matches!(&r, Ok(o) if o.status == "queued"), "{r:?}");
    let Ok(listed) = list_recent(&*state.store, who.tenant(), 10).await else {
        panic!("list")
    };
    let [stored] = listed.as_slice() else {
        panic!("{listed:?}")
    };
    let now = clock.now();
    assert_eq!(stored.ttl, Some(now.unix_seconds() + 90 * 86_400));
    assert_eq!(
        stored.gsi2pk.as_deref(),
        Some(open_partition(&stored.id).as_str())
    );
    assert!(stored.claim.is_none());
    let raw = |id: SmsId| {
        let store = state.store.clone();
        async move {
            match store.get(&SmsReminder::key(&id)).await {
                Ok(Some(item)) => item,
                other => panic!("{other:?}"),
            }
        }
    };
    // The item as stored is the record's item: nothing lives in the item
    // alone.
    let Ok(item) = stored.to_item() else {
        panic!("to_item")
    };
    assert_eq!(raw(stored.id.clone()).await, item);

    // A claim is a field, written by the claim's update alone.
    let Ok(Some(claim_id)) =
        super::dispatch::claim(&*state.store, stored, LEASE, now.unix_millis()).await
    else {
        panic!("claim")
    };
    let claimed = status_of(&state, &stored.id).await;
    assert_eq!(claimed.claim.as_deref(), Some(claim_id.as_str()));
    assert_eq!(claimed.status, SmsStatus::Sending);
    assert_eq!(
        raw(stored.id.clone()).await.get("claim"),
        Some(&json!(claim_id))
    );

    // Ending it removes the claim and its open entry, keeps its expiry.
    let d = super::dispatch::send_and_record(&state, &client, &claimed, &claim_id).await;
    assert!(matches!(d, Ok(DispatchOutcome::Sent)), "{d:?}");
    let sent = status_of(&state, &stored.id).await;
    assert_eq!(sent.status, SmsStatus::Sent);
    assert!(sent.claim.is_none() && sent.gsi2pk.is_none() && sent.gsi2sk.is_none());
    assert_eq!(sent.ttl, stored.ttl);
    let item = raw(stored.id.clone()).await;
    assert!(!item.contains_key("claim") && !item.contains_key("gsi2pk"));
}

#[tokio::test]
async fn the_counters_and_the_recipient_window_read_as_records_of_unchanged_shape() {
    let store = store();
    let now = SystemClock.now();
    let limits = Limits::default();
    for phone in ["9841000001", "9841000001", "9841000002"] {
        let taken =
            take_abuse_limits(&*store, limits, &"mer_1".into(), Mode::Live, phone, now).await;
        assert!(taken.is_ok(), "{taken:?}");
    }
    assert!(matches!(
        reserve_quota(&*store, &"mer_1".into(), 5, now).await,
        Ok(true)
    ));
    let attrs = |item: crate::store::Item| {
        let mut names: Vec<String> = item.keys().cloned().collect();
        names.sort_unstable();
        names
    };

    let window_key = recipient_window(&"mer_1".into(), Mode::Live, "9841000001");
    let Ok(Some(window)) =
        crate::domain::record::get::<SmsRecipientWindow>(&*store, &window_key).await
    else {
        panic!("the window reads as a record")
    };
    assert_eq!(window.v, 2);
    assert_eq!(window.sent_ms, vec![now.unix_millis(); 2]);
    assert_eq!(window.ttl, (now.unix_millis() + 86_400_000) / 1000 + 3600);
    assert_eq!(window.item_key(), window_key);
    let Ok(Some(raw)) = store.get(&window_key).await else {
        panic!("raw window")
    };
    assert_eq!(attrs(raw.clone()), ["pk", "sent_ms", "sk", "ttl", "v"]);
    assert_eq!(window.to_item().ok(), Some(raw), "written back as stored");

    for (key, n) in [
        (merchant_counter(&"mer_1".into(), Mode::Live, now), 3),
        (quota_counter(&"mer_1".into(), now), 1),
    ] {
        let Ok(Some(count)) = crate::domain::record::get::<SmsCount>(&*store, &key).await else {
            panic!("{key:?} reads as a record")
        };
        assert_eq!(count.n, n, "{key:?}");
        assert!(count.ttl.is_some(), "{key:?}");
        assert_eq!(count.item_key(), key);
        let Ok(Some(raw)) = store.get(&key).await else {
            panic!("raw counter")
        };
        assert_eq!(attrs(raw.clone()), ["n", "pk", "sk", "ttl"]);
        assert_eq!(count.to_item().ok(), Some(raw), "written back as stored");
    }
}

/// A once-only claim for a test occurrence (what the billing engine
/// writes for each reminder it sends).
fn occurrence_claim(name: &str) -> crate::store::TxOp {
    let mut item = crate::store::Item::new();
    item.insert(crate::store::PK.into(), format!("TESTCLAIM#{name}").into());
    item.insert(crate::store::SK.into(), "CLAIM".into());
    crate::store::TxOp::Put {
        item,
        cond: Some(crate::store::Cond::NotExists),
    }
}

fn invoice_sms(who: &Principal, quota: u32, claim: &str) -> InvoiceSms {
    InvoiceSms {
        id: crate::ids::SmsId::new(),
        tenant: who.tenant().clone(),
        merchant_id: who.merchant.id.clone(),
        monthly_quota: quota,
        to: "9841000009".into(),
        text: "Gym KTM: NPR 2,500.00 due 2026-12-01. Pay: https://p.example/r/x".into(),
        invoice_id: Some("inv_1".into()),
        claim: occurrence_claim(claim),
        limits: Limits::default(),
    }
}

/// A billing reminder needs no checkout session; it is stored bound to
/// its invoice, once per occurrence (a second call takes nothing), logged
/// in sandbox, queued live against the plan's quota.
#[tokio::test]
async fn a_billing_reminder_is_bound_to_its_invoice_and_sent_once_per_occurrence() {
    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Sandbox).await;
    let first = notify_invoice(&state, invoice_sms(&who, 200, "a")).await;
    let Ok(InvoiceSmsOutcome::Logged(id)) = first else {
        panic!("{first:?}")
    };
    let again = notify_invoice(&state, invoice_sms(&who, 200, "a")).await;
    assert!(
        matches!(again, Ok(InvoiceSmsOutcome::AlreadyDone)),
        "{again:?}"
    );
    let (all, total) = list(&state, who.tenant(), crate::domain::Window::first(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(total, 1);
    assert_eq!(all[0].id, id);
    assert_eq!(all[0].invoice_id, Some("inv_1".into()));
    assert_eq!(all[0].session_id, None);
    assert_eq!(all[0].status, SmsStatus::Logged);
    let nothing = state
        .queue
        .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
        .await;
    assert!(matches!(nothing.as_deref(), Ok([])), "{nothing:?}");

    let (state, who, _) = state_with_tenant(Plan::Growth, Mode::Live).await;
    let none_left = notify_invoice(&state, invoice_sms(&who, 0, "b")).await;
    assert!(
        matches!(none_left, Ok(InvoiceSmsOutcome::QuotaExhausted)),
        "{none_left:?}"
    );
    let live = notify_invoice(&state, invoice_sms(&who, 200, "b")).await;
    assert!(matches!(live, Ok(InvoiceSmsOutcome::Queued(_))), "{live:?}");
    let got = state
        .queue
        .receive(QueueName::Sms, 10, Duration::ZERO, Duration::from_secs(30))
        .await;
    assert!(matches!(got.as_deref(), Ok([_])), "{got:?}");
    // The recipient's day counts billing reminders too: the fourth in a
    // day waits.
    for n in ["c", "d"] {
        let r = notify_invoice(&state, invoice_sms(&who, 200, n)).await;
        assert!(matches!(r, Ok(InvoiceSmsOutcome::Queued(_))), "{r:?}");
    }
    let full = notify_invoice(&state, invoice_sms(&who, 200, "e")).await;
    assert!(
        matches!(full, Err(SmsError::RateLimited { .. })),
        "{full:?}"
    );
}
