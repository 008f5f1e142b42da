use super::providers::is_enabled;
use super::sessions::{amount_limits, spend_cap_condition, spend_counter_key};
use super::*;
use crate::domain::{Mode, Provider, Tenant, Window};
use crate::store::embedded::EmbeddedStore;
use crate::store::{Store, Update};
use crate::testenv::memory_store as store;
use crate::time::Timestamp;
use crate::time::{Clock, SystemClock};
use serde_json::json;
use serde_json::{Map, Value};
use std::sync::Arc;

fn req(v: Value) -> CreateCheckout {
    match serde_json::from_value(v) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn base() -> Value {
    json!({"amount": 5000, "returnUrl": "https://shop.example/done"})
}

fn with(mut v: Value, k: &str, x: Value) -> Value {
    v[k] = x;
    v
}

#[tokio::test]
async fn the_total_costs_the_same_reads_whatever_the_number_of_sessions() {
    let inner: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
    let counting = crate::store::counting::CountingStore::new(inner.clone());
    let now = Timestamp::parse("2026-11-25T10:00:00Z").unwrap();
    let marker = crate::keys::stats_totals_marker("proj_t", Mode::Sandbox);
    let mut item = crate::store::Item::new();
    item.insert(crate::store::PK.into(), marker.pk.into());
    item.insert(crate::store::SK.into(), marker.sk.into());
    inner.put(item, None).await.unwrap();
    let creator = Creator {
        project_id: "proj_t".into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_t".into(),
        spend_cap_paisa: None,
    };
    let mut ids = Vec::new();
    let mut costs = Vec::new();
    for n in [3usize, 40] {
        while ids.len() < n {
            let valid = validate_create(req(base()), Mode::Sandbox).unwrap();
            ids.push(
                create_in(&*inner, &creator, valid, now, None)
                    .await
                    .unwrap()
                    .id,
            );
        }
        let before = counting.calls();
        let (page, total) = list_in(
            &counting,
            &Tenant::new("proj_t", Mode::Sandbox),
            None,
            now,
            Window::first(1),
        )
        .await
        .unwrap();
        assert_eq!((page.len(), total), (1, n as u64));
        costs.push(counting.calls() - before);
    }
    assert_eq!(costs[0], costs[1], "reads do not grow with the sessions");
    let total = |status, at| {
        let counting = &counting;
        async move {
            list_in(
                counting,
                &Tenant::new("proj_t", Mode::Sandbox),
                Some(status),
                at,
                Window::first(1),
            )
            .await
            .unwrap()
            .1
        }
    };
    assert_eq!(total(SessionStatus::Pending, now).await, 40);
    // Past their time, before any sweep: counted as expired.
    let late = now.plus(chrono::Duration::minutes(31));
    assert_eq!(total(SessionStatus::Pending, late).await, 0);
    assert_eq!(total(SessionStatus::Expired, late).await, 40);
    // Stored as expired: the same counts.
    for id in ids.iter().take(5) {
        assert!(expire_due(&*inner, id, late).await.unwrap());
    }
    assert_eq!(total(SessionStatus::Expired, late).await, 40);
    assert_eq!(total(SessionStatus::Expired, now).await, 5);
    assert_eq!(total(SessionStatus::Pending, now).await, 35);
    let (_, all) = list_in(
        &counting,
        &Tenant::new("proj_t", Mode::Sandbox),
        None,
        late,
        Window::first(1),
    )
    .await
    .unwrap();
    assert_eq!(all, 40);
}

fn field_of(r: Result<ValidCheckout, CheckoutError>) -> String {
    match r {
        Err(CheckoutError::Invalid { field, .. }) => field,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn a_minimal_request_is_a_hosted_npr_session() {
    let Ok(v) = validate_create(req(base()), Mode::Live) else {
        panic!()
    };
    assert_eq!(v.flow, Flow::Hosted);
    assert_eq!(v.provider, None);
    assert_eq!(v.amount.get(), 5000);
    assert!(!v.collect_address);
}

#[test]
fn amounts_must_be_positive_and_bounded() {
    for bad in [0, -1, MAX_AMOUNT_PAISA + 1] {
        let r = validate_create(req(with(base(), "amount", json!(bad))), Mode::Live);
        assert_eq!(field_of(r), "amount", "{bad}");
    }
    assert!(
        validate_create(
            req(with(base(), "amount", json!(MAX_AMOUNT_PAISA))),
            Mode::Live
        )
        .is_ok()
    );
}

#[test]
fn khalti_needs_at_least_ten_rupees() {
    let r = with(
        with(base(), "provider", json!("khalti")),
        "amount",
        json!(999),
    );
    assert_eq!(field_of(validate_create(req(r), Mode::Sandbox)), "amount");
    let r = with(
        with(base(), "provider", json!("khalti")),
        "amount",
        json!(1000),
    );
    assert!(validate_create(req(r), Mode::Sandbox).is_ok());
}

#[test]
fn sandbox_fonepay_is_capped_at_one_thousand_rupees() {
    let r = with(
        with(base(), "provider", json!("fonepay")),
        "amount",
        json!(100_001),
    );
    assert!(matches!(
        validate_create(req(r.clone()), Mode::Sandbox),
        Err(CheckoutError::FonepaySandboxCap(_))
    ));
    assert!(
        validate_create(req(r), Mode::Live).is_ok(),
        "live has no cap"
    );
    let r = with(
        with(base(), "provider", json!("fonepay")),
        "amount",
        json!(100_000),
    );
    assert!(validate_create(req(r), Mode::Sandbox).is_ok());
}

#[test]
fn redirect_needs_a_provider_and_qr_is_not_created_here() {
    let r = with(base(), "flow", json!("redirect"));
    assert_eq!(field_of(validate_create(req(r), Mode::Live)), "provider");
    let r = with(
        with(base(), "flow", json!("redirect")),
        "provider",
        json!("esewa"),
    );
    assert!(validate_create(req(r), Mode::Live).is_ok());
    let r = with(base(), "flow", json!("qr"));
    assert_eq!(field_of(validate_create(req(r), Mode::Live)), "flow");
}

#[test]
fn urls_are_absolute_https_with_local_http_in_sandbox() {
    for (url, mode, ok) in [
        ("https://shop.example/ok?x=1", Mode::Live, true),
        ("https://shop.example:8443/ok", Mode::Live, true),
        ("http://shop.example/ok", Mode::Live, false),
        ("http://shop.example/ok", Mode::Sandbox, false),
        ("http://127.0.0.1:3000/ok", Mode::Sandbox, true),
        ("http://localhost/ok", Mode::Sandbox, true),
        ("http://[::1]:80/ok", Mode::Sandbox, true),
        ("http://localhost/ok", Mode::Live, false),
        ("/relative", Mode::Sandbox, false),
        ("ftp://x.example", Mode::Sandbox, false),
        ("javascript:alert(1)", Mode::Sandbox, false),
        ("https://", Mode::Live, false),
        ("https://user:pw@shop.example/", Mode::Live, false),
        ("https://shop.example/a b", Mode::Live, false),
        ("", Mode::Live, false),
    ] {
        assert_eq!(
            check_url("returnUrl", url, mode).is_ok(),
            ok,
            "{url} {mode:?}"
        );
    }
    let long = format!(
        "https://x.example/{}",
        "a".repeat(crate::fields::MAX_URL_LEN)
    );
    assert!(check_url("returnUrl", &long, Mode::Live).is_err());
    let r = with(base(), "cancelUrl", json!("http://evil.example"));
    assert_eq!(field_of(validate_create(req(r), Mode::Live)), "cancelUrl");
    let r = with(base(), "returnUrl", json!("nope"));
    assert_eq!(refused_at(r), "returnUrl");
}

#[test]
fn metadata_is_bounded() {
    let mut m = Map::new();
    for i in 0..MAX_METADATA_KEYS {
        m.insert(format!("k{i}"), json!("v"));
    }
    assert!(check_metadata(&m).is_ok());
    m.insert("one_more".into(), json!(1));
    let r = with(base(), "metadata", Value::Object(m));
    assert_eq!(field_of(validate_create(req(r), Mode::Live)), "metadata");
    let long_key = "k".repeat(MAX_METADATA_KEY_LEN + 1);
    let r = with(base(), "metadata", json!({ long_key: "v" }));
    assert_eq!(field_of(validate_create(req(r), Mode::Live)), "metadata");
    let r = with(
        base(),
        "metadata",
        json!({"order": "x".repeat(MAX_METADATA_VALUE_LEN + 1)}),
    );
    assert_eq!(
        field_of(validate_create(req(r), Mode::Live)),
        "metadata.order"
    );
    let r = with(base(), "metadata", json!({"nested": {"a": 1}}));
    assert_eq!(
        field_of(validate_create(req(r), Mode::Live)),
        "metadata.nested"
    );
    let r = with(base(), "metadata", json!({"n": 3, "ok": true, "s": "x"}));
    assert!(validate_create(req(r), Mode::Live).is_ok());
}

/// Where parsing a request stops, as the body's path: the field rules
/// live in the field types ([`crate::fields`]).
fn refused_at(v: Value) -> String {
    let r: Result<CreateCheckout, _> = serde_path_to_error::deserialize(v);
    match r {
        Err(e) => e.path().to_string(),
        Ok(r) => panic!("parsed: {r:?}"),
    }
}

#[test]
fn customer_fields_are_checked_and_named() {
    use crate::fields::{AddressPart, Description, MAX_PHONE_LEN, PersonName};
    let cases = [
        (json!({"email": "not-an-email"}), "customer.email"),
        (json!({"email": ""}), "customer.email"),
        (
            json!({"name": "n".repeat(PersonName::MAX + 1)}),
            "customer.name",
        ),
        (json!({"phone": "98-call-me"}), "customer.phone"),
        (
            json!({"phone": "9".repeat(MAX_PHONE_LEN + 1)}),
            "customer.phone",
        ),
        (
            json!({"address": {"city": "c".repeat(AddressPart::MAX + 1)}}),
            "customer.address.city",
        ),
        (
            json!({"address": {"line1": "a\u{0}b"}}),
            "customer.address.line1",
        ),
    ];
    for (customer, field) in cases {
        assert_eq!(refused_at(with(base(), "customer", customer)), field);
    }
    let r = with(
        base(),
        "customer",
        json!({"name": "Sita", "email": "sita@example.com", "phone": "+977 9841000001",
                   "address": {"line1": "Thamel", "postalCode": "44600", "country": "NP"}}),
    );
    let Ok(v) = validate_create(req(r), Mode::Live) else {
        panic!()
    };
    assert_eq!(
        v.customer_address.and_then(|a| a.postal_code).as_deref(),
        Some("44600")
    );
    assert_eq!(v.customer_email.as_deref(), Some("sita@example.com"));
    let r = with(
        base(),
        "description",
        json!("d".repeat(Description::MAX + 1)),
    );
    assert_eq!(refused_at(r), "description");
}

#[test]
fn unknown_fields_and_currencies_do_not_parse() {
    assert!(serde_json::from_value::<CreateCheckout>(with(base(), "tip", json!(1))).is_err());
    assert!(
        serde_json::from_value::<CreateCheckout>(with(base(), "currency", json!("USD"))).is_err()
    );
    assert!(
        serde_json::from_value::<CreateCheckout>(with(base(), "currency", json!("NPR"))).is_ok()
    );
}

#[test]
fn open_sessions_expire_after_thirty_minutes() {
    let now = SystemClock.now();
    let creator = Creator {
        project_id: "proj_a".into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_x".into(),
        spend_cap_paisa: None,
    };
    let Ok(v) = validate_create(req(base()), Mode::Sandbox) else {
        panic!()
    };
    let mut s = new_session(&creator, v, now);
    assert_eq!(s.expires_at, now.plus(chrono::Duration::minutes(30)));
    assert_eq!(s.status_at(now), SessionStatus::Pending);
    let later = now.plus(SESSION_LIFETIME);
    assert_eq!(s.status_at(later), SessionStatus::Expired);
    s.status = SessionStatus::Initiated;
    assert_eq!(s.status_at(later), SessionStatus::Expired);
    s.status = SessionStatus::Success;
    assert_eq!(s.status_at(later), SessionStatus::Success, "final stays");
}

#[test]
fn statuses_parse_and_unknown_ones_are_none() {
    for s in SessionStatus::ALL {
        assert_eq!(SessionStatus::parse(s.as_str()), Some(s));
    }
    assert_eq!(SessionStatus::parse("paid"), None);
    assert!(SessionStatus::Expired.is_final() && !SessionStatus::Initiated.is_final());
}

#[test]
fn the_spend_cap_condition_leaves_room_for_the_amount() {
    assert_eq!(spend_cap_condition(1000, 1001), None);
    let Some(c) = spend_cap_condition(1000, 100) else {
        panic!()
    };
    let mut item = crate::store::Item::new();
    assert!(crate::store::cond::eval(&c, Some(&item)), "no volume yet");
    item.insert("volume".into(), json!(900));
    assert!(crate::store::cond::eval(&c, Some(&item)));
    item.insert("volume".into(), json!(901));
    assert!(!crate::store::cond::eval(&c, Some(&item)));
    let t = Timestamp::parse("2026-11-30T23:59:59Z").unwrap_or_else(|| SystemClock.now());
    assert_eq!(spend_counter_key(&"ak_1".into(), t).sk, "SPEND#2026-11");
}

#[test]
fn providers_are_enabled_by_credentials_or_sandbox_test_accounts() {
    assert!(is_enabled(Provider::Esewa, Mode::Sandbox, false));
    assert!(is_enabled(Provider::Khalti, Mode::Sandbox, false));
    assert!(!is_enabled(Provider::Fonepay, Mode::Sandbox, false));
    assert!(is_enabled(Provider::Fonepay, Mode::Sandbox, true));
    for p in Provider::ALL {
        assert!(!is_enabled(p, Mode::Live, false));
        assert!(is_enabled(p, Mode::Live, true));
    }
    assert_eq!(amount_limits(Provider::Khalti, Mode::Live).min, 1000);
    assert_eq!(amount_limits(Provider::Fonepay, Mode::Sandbox).max, 100_000);
    assert_eq!(
        amount_limits(Provider::Fonepay, Mode::Live).max,
        MAX_AMOUNT_PAISA
    );
}

fn creator(cap: Option<i64>) -> Creator {
    Creator {
        project_id: "proj_a".into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_1".into(),
        spend_cap_paisa: cap,
    }
}

async fn make(
    store: &dyn Store,
    c: &Creator,
    amount: i64,
    now: Timestamp,
) -> Result<CheckoutSession, CheckoutError> {
    let v = validate_create(req(with(base(), "amount", json!(amount))), c.mode)?;
    create_in(store, c, v, now, None).await
}

#[tokio::test]
async fn reads_expire_lazily_and_persist_it() {
    let store = store();
    let now = SystemClock.now();
    let c = creator(None);
    let Ok(s) = make(&*store, &c, 500, now).await else {
        panic!()
    };
    let found = find_at(&*store, &Tenant::new("proj_a", Mode::Sandbox), &s.id, now).await;
    assert_eq!(
        found.ok().flatten().map(|x| x.status),
        Some(SessionStatus::Pending)
    );
    assert_eq!(
        find_at(&*store, &Tenant::new("proj_b", Mode::Sandbox), &s.id, now).await,
        Ok(None)
    );
    assert_eq!(
        find_at(&*store, &Tenant::new("proj_a", Mode::Live), &s.id, now).await,
        Ok(None)
    );
    let later = now.plus(SESSION_LIFETIME);
    let found = find_at(&*store, &Tenant::new("proj_a", Mode::Sandbox), &s.id, later).await;
    assert_eq!(
        found.ok().flatten().map(|x| x.status),
        Some(SessionStatus::Expired)
    );
    // Persisted: visible even to a reader whose clock is earlier.
    let found = find_at(&*store, &Tenant::new("proj_a", Mode::Sandbox), &s.id, now).await;
    assert_eq!(
        found.ok().flatten().map(|x| x.status),
        Some(SessionStatus::Expired)
    );
}

#[tokio::test]
async fn expire_moves_open_sessions_only() {
    let store = store();
    let now = SystemClock.now();
    let Ok(s) = make(&*store, &creator(None), 500, now).await else {
        panic!()
    };
    let Ok(Some(e)) = expire_in(&*store, &Tenant::new("proj_a", Mode::Sandbox), &s.id, now).await
    else {
        panic!()
    };
    assert_eq!(e.status, SessionStatus::Expired);
    // A success stays a success.
    let key = CheckoutSession::key(&s.id);
    let _ = store
        .update(&key, Update::new().set("status", "success"), None)
        .await;
    let Ok(Some(again)) =
        expire_in(&*store, &Tenant::new("proj_a", Mode::Sandbox), &s.id, now).await
    else {
        panic!()
    };
    assert_eq!(again.status, SessionStatus::Success);
    assert_eq!(
        expire_in(&*store, &Tenant::new("proj_b", Mode::Sandbox), &s.id, now).await,
        Ok(None)
    );
}

#[tokio::test]
async fn the_spend_cap_counts_the_month_per_key() {
    let store = store();
    let now = SystemClock.now();
    let c = creator(Some(1000));
    assert!(make(&*store, &c, 600, now).await.is_ok());
    assert!(matches!(
        make(&*store, &c, 401, now).await,
        Err(CheckoutError::SpendCapExceeded { cap: 1000 })
    ));
    assert!(make(&*store, &c, 400, now).await.is_ok());
    assert!(make(&*store, &c, 1, now).await.is_err());
    // Next month starts over.
    let next = now.plus(chrono::Duration::days(32));
    assert!(make(&*store, &c, 1000, next).await.is_ok());
    // The failed attempts left no session behind.
    let Ok((_, total)) = list_in(
        &*store,
        &Tenant::new("proj_a", Mode::Sandbox),
        None,
        now,
        Window::first(10),
    )
    .await
    else {
        panic!()
    };
    assert_eq!(total, 3);
}

#[tokio::test]
async fn lists_filter_by_status_as_of_now() {
    let store = store();
    let now = SystemClock.now();
    let c = creator(None);
    let mut made = Vec::new();
    for amount in [100, 200, 300] {
        let Ok(s) = make(&*store, &c, amount, now).await else {
            panic!()
        };
        made.push(s);
    }
    let _ = expire_in(
        &*store,
        &Tenant::new("proj_a", Mode::Sandbox),
        &made[0].id,
        now,
    )
    .await;
    let count = |s: Option<SessionStatus>, at: Timestamp| {
        let store = store.clone();
        async move {
            list_in(
                &*store,
                &Tenant::new("proj_a", Mode::Sandbox),
                s,
                at,
                Window::first(25),
            )
            .await
            .map(|(items, total)| (items.len() as u64, total))
        }
    };
    assert_eq!(count(None, now).await, Ok((3, 3)));
    assert_eq!(count(Some(SessionStatus::Pending), now).await, Ok((2, 2)));
    assert_eq!(count(Some(SessionStatus::Expired), now).await, Ok((1, 1)));
    let later = now.plus(SESSION_LIFETIME);
    assert_eq!(count(Some(SessionStatus::Pending), later).await, Ok((0, 0)));
    assert_eq!(count(Some(SessionStatus::Expired), later).await, Ok((3, 3)));
    let Ok((page, _)) = list_in(
        &*store,
        &Tenant::new("proj_a", Mode::Sandbox),
        None,
        now,
        Window::first(1),
    )
    .await
    else {
        panic!()
    };
    assert_eq!(page[0].id, made[2].id, "newest first");
}

#[test]
fn the_view_uses_the_spec_names() {
    let now = SystemClock.now();
    let Ok(v) = validate_create(req(base()), Mode::Live) else {
        panic!()
    };
    let s = new_session(&creator(None), v, now);
    let view = serde_json::to_value(CheckoutSessionView::at(s, now)).unwrap_or_default();
    for field in [
        "id",
        "livemode",
        "mode",
        "flow",
        "amount",
        "currency",
        "status",
        "metadata",
        "collectAddress",
        "expiresAt",
        "createdAt",
        "updatedAt",
    ] {
        assert!(view.get(field).is_some(), "missing {field}");
    }
    // Optional fields: set, or omitted; never null against their type.
    for f in [
        "provider",
        "paymentId",
        "description",
        "customerName",
        "customerEmail",
        "customerPhone",
        "customerAddress",
    ] {
        assert_ne!(view.get(f), Some(&serde_json::Value::Null), "{f} is null");
    }
    assert!(view.get("returnUrl").is_none() && view.get("apiKeyId").is_none());
    assert_eq!(view["status"], "pending");
    assert_eq!(view["flow"], "hosted");
    assert_eq!(view["currency"], "NPR");
}
