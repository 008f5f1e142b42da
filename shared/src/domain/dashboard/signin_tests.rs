//! Issue 37, 3 and 7 in the rules: known devices, failed sign-ins, and
//! audit entries that cannot be skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use super::sessions::ATTEMPTS_PER_ACCOUNT;
use super::{
    ATTEMPT_WINDOW, ATTEMPTS_PER_DEVICE, Actor, DashboardError, DashboardUser, Role, SignInRequest,
    audit_entry, create_user, end_all_sessions, find_user_by_email, network_of, open_session,
    operator, reset_password, sign_in, sign_in_with, sign_out_audited, sign_out_everywhere,
    verify_password,
};
use crate::AppState;
use crate::domain::account::{Plan, create_merchant, create_project};
use crate::store::embedded::EmbeddedStore;
use crate::store::{Cond, Item, Key, Query, QueryPage, Store, StoreError, Stored, TxOp, Update};
use crate::testenv::at;
use crate::time::ManualClock;

const PASSWORD: &str = "correct horse battery";

/// A store whose audit writes fail while `failing` is set (alone or in a
/// transaction: then the whole transaction fails, as DynamoDB's would).
struct AuditFails {
    inner: Arc<dyn Store>,
    failing: AtomicBool,
}

fn is_audit(item: &Item) -> bool {
    item.get(crate::store::PK)
        .and_then(|v| v.as_str())
        .is_some_and(|pk| pk.ends_with("#AUDIT"))
}

impl AuditFails {
    fn refuse(&self) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("audit write refused (test)".into()))
    }
}

#[async_trait]
impl Store for AuditFails {
    fn single_process(&self) -> bool {
        self.inner.single_process()
    }
    fn instance(&self) -> u64 {
        self.inner.instance()
    }
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_stored(&self, key: &Key) -> Result<Option<Stored>, StoreError> {
        self.inner.get_stored(key).await
    }
    async fn put(&self, item: Item, cond: Option<Cond>) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) && is_audit(&item) {
            return self.refuse();
        }
        self.inner.put(item, cond).await
    }
    async fn update(
        &self,
        key: &Key,
        update: Update,
        cond: Option<Cond>,
    ) -> Result<Item, StoreError> {
        self.inner.update(key, update, cond).await
    }
    async fn delete(&self, key: &Key, cond: Option<Cond>) -> Result<(), StoreError> {
        self.inner.delete(key, cond).await
    }
    async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
        let audited = ops
            .iter()
            .any(|op| matches!(op, TxOp::Put { item, .. } if is_audit(item)));
        if self.failing.load(Ordering::SeqCst) && audited {
            return self.refuse();
        }
        self.inner.transact(ops).await
    }
    async fn query(&self, query: &Query) -> Result<QueryPage, StoreError> {
        self.inner.query(query).await
    }
    async fn count(&self, query: &Query) -> Result<u64, StoreError> {
        self.inner.count(query).await
    }
}

async fn setup() -> (AppState, Arc<AuditFails>, DashboardUser) {
    let inner: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    let store = Arc::new(AuditFails {
        inner,
        failing: AtomicBool::new(false),
    });
    let deps = AppState::new(
        store.clone(),
        Arc::new(ManualClock::new(at("2026-11-26T10:00:00Z"))),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let now = at("2026-11-26T10:00:00Z");
    let m = create_merchant(&*deps.store, now, "Himal", "a@himal.np", Plan::Growth)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    create_project(&*deps.store, now, &m, "Shop", false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let u = create_user(&deps, now, &m.id, "owner@himal.np", Role::Owner, PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    create_user(&deps, now, &m.id, "clerk@himal.np", Role::Viewer, PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (deps, store, u)
}

fn with_device<'a>(email: &'a str, password: &'a str, device: &'a str) -> SignInRequest<'a> {
    SignInRequest {
        email,
        password,
        address: "10.0.0.1",
        device: Some(device),
    }
}

/// 100 wrong passwords for the owner from 100 addresses.
async fn fill_the_email_bucket(deps: &AppState, now: crate::time::Timestamp) {
    for n in 0..ATTEMPTS_PER_ACCOUNT {
        let from = format!("10.1.{n}.1");
        let r = sign_in(deps, now, "owner@himal.np", "wrong password!", &from).await;
        assert!(matches!(r, Err(DashboardError::WrongCredentials)), "{r:?}");
    }
    let r = sign_in(deps, now, "owner@himal.np", PASSWORD, "10.9.0.1").await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");
}

#[tokio::test]
async fn a_known_device_signs_in_on_its_own_budget_until_revoked() {
    let (deps, _, owner) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let first = sign_in(&deps, t0, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let Some(device) = first.device else {
        panic!("a first sign-in remembers the browser")
    };
    assert!(first.failures.is_none());
    fill_the_email_bucket(&deps, t0).await;

    // The device signs in, and is not minted again.
    let again = sign_in_with(&deps, t0, &with_device("owner@himal.np", PASSWORD, &device))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(again.device.is_none());
    let failures = again.failures.unwrap_or_else(|| panic!("a notice"));
    assert_eq!(failures.count, ATTEMPTS_PER_ACCOUNT);
    assert_eq!(failures.networks.len(), 10, "{failures:?}");
    assert!(failures.describe().ends_with("and others"), "{failures:?}");
    assert!(again.session.notice.is_some());

    // Not a device of another email, nor a tampered one.
    let clerks = sign_in(&deps, t0, "clerk@himal.np", PASSWORD, "10.0.0.3")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .device
        .unwrap_or_else(|| panic!("the clerk's device"));
    let other = sign_in_with(&deps, t0, &with_device("owner@himal.np", PASSWORD, &clerks)).await;
    assert!(
        matches!(other, Err(DashboardError::Throttled { .. })),
        "{other:?}"
    );
    let mut tampered = device.clone();
    tampered.replace_range(5..6, if &device[5..6] == "a" { "b" } else { "a" });
    let r = sign_in_with(
        &deps,
        t0,
        &with_device("owner@himal.np", PASSWORD, &tampered),
    )
    .await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");

    // Its own budget: 10 guesses, then held.
    for _ in 0..ATTEMPTS_PER_DEVICE {
        let r = sign_in_with(&deps, t0, &with_device("owner@himal.np", "wrong!", &device)).await;
        assert!(matches!(r, Err(DashboardError::WrongCredentials)), "{r:?}");
    }
    let r = sign_in_with(&deps, t0, &with_device("owner@himal.np", PASSWORD, &device)).await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");

    // A later window: sign out everywhere revokes the device.
    let t1 = t0.plus(chrono::Duration::seconds(ATTEMPT_WINDOW));
    fill_the_email_bucket(&deps, t1).await;
    assert!(
        sign_in_with(&deps, t1, &with_device("owner@himal.np", PASSWORD, &device))
            .await
            .is_ok()
    );
    end_all_sessions(&deps, &owner.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = sign_in_with(&deps, t1, &with_device("owner@himal.np", PASSWORD, &device)).await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");

    // And so does a password reset.
    let t2 = t1.plus(chrono::Duration::seconds(ATTEMPT_WINDOW));
    let fresh = sign_in(&deps, t2, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .device
        .unwrap_or_else(|| panic!("a new device"));
    fill_the_email_bucket(&deps, t2).await;
    reset_password(&*deps.store, "owner@himal.np", PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = sign_in_with(&deps, t2, &with_device("owner@himal.np", PASSWORD, &fresh)).await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");
}

#[test]
fn networks_are_a_slash_24_or_a_slash_48() {
    assert_eq!(network_of("203.0.113.77"), "203.0.113.0/24");
    assert_eq!(network_of("2400:1a00:b040:12::1"), "2400:1a00:b040::/48");
    assert_eq!(network_of("::ffff:198.51.100.7"), "198.51.100.0/24");
    assert_eq!(network_of("unknown"), "unknown");
}

#[tokio::test]
async fn an_audit_write_that_fails_fails_the_action_and_does_nothing() {
    let (deps, store, owner) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let signed = sign_in(&deps, t0, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.failing.store(true, Ordering::SeqCst);

    // A sign-in: refused, no session.
    let r = sign_in(&deps, t0, "owner@himal.np", PASSWORD, "10.0.0.2").await;
    assert!(matches!(r, Err(DashboardError::Store(_))), "{r:?}");
    // A wrong password for a known user is not answered as one.
    let r = sign_in(&deps, t0, "owner@himal.np", "wrong password!", "10.0.0.2").await;
    assert!(matches!(r, Err(DashboardError::Store(_))), "{r:?}");

    // Sign out here and everywhere: nothing ends.
    let actor = Actor::of(&signed.user, &signed.session, "10.0.0.1");
    let entry = audit_entry(&actor, t0, "sign_out", &owner.id, "");
    assert!(
        sign_out_audited(&deps, &signed.cookie, &entry)
            .await
            .is_err()
    );
    assert!(sign_out_everywhere(&deps, &owner.id, &entry).await.is_err());
    let open = open_session(&deps, t0, &signed.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(open.is_ok(), "{open:?}");

    // An operator's reset and disable: not done.
    let r = operator::reset_password(&deps, t0, "owner@himal.np", "a brand new password").await;
    assert!(r.is_err(), "{r:?}");
    let r = operator::set_disabled(&deps, t0, "owner@himal.np", true).await;
    assert!(r.is_err(), "{r:?}");
    let r = operator::create(
        &deps,
        t0,
        &owner.merchant_id,
        "x@himal.np",
        Role::Viewer,
        PASSWORD,
    )
    .await;
    assert!(r.is_err(), "{r:?}");
    store.failing.store(false, Ordering::SeqCst);
    let user = find_user_by_email(&*deps.store, "owner@himal.np")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the owner"));
    assert_eq!(user.session_epoch, owner.session_epoch);
    assert!(!user.disabled);
    assert!(verify_password(PASSWORD, &user.password_hash).await);
    assert!(
        find_user_by_email(&*deps.store, "x@himal.np")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none()
    );
}
