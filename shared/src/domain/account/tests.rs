use super::api_keys::default_rotation_grace;
use super::view::mask_email;
use super::*;
use crate::domain::record::from_item;
use crate::store::{Store, StoreError};
use crate::testenv::memory_store as store;
use crate::time::{Clock, SystemClock};
use std::sync::Arc;

/// The rules' dependencies over `store`.
fn deps(store: &Arc<dyn Store>) -> crate::AppState {
    crate::AppState::new(
        store.clone(),
        Arc::new(SystemClock),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn all_scopes(mode: Mode) -> NewKey {
    NewKey {
        mode,
        kind: KeyKind::Secret,
        scopes: Scope::ALL.to_vec(),
        description: "test".into(),
        expires_at: None,
        spend_cap_paisa: None,
    }
}

#[tokio::test]
async fn last_used_at_is_written_at_most_once_a_minute() {
    let store = store();
    let (_, project) = setup(&*store).await;
    let now = SystemClock.now();
    let Ok((secret, key)) =
        issue_api_key(&deps(&store), now, &project, all_scopes(Mode::Live)).await
    else {
        panic!("key")
    };
    let read = |secret: String| {
        let store = store.clone();
        async move {
            match store
                .get(&ApiKey::key_for_hash(&hash_secret(&secret)))
                .await
            {
                Ok(Some(item)) => from_item::<ApiKey>(item).ok().and_then(|k| k.last_used_at),
                other => panic!("{other:?}"),
            }
        }
    };
    // Never used: concurrent requests that all read null write once.
    let d = deps(&store);
    let writes = futures::future::join_all((0..8).map(|_| record_use(&d, &key, now))).await;
    assert_eq!(writes.iter().filter(|w| matches!(w, Ok(true))).count(), 1);
    assert_eq!(read(secret.clone()).await, Some(now));
    // Fresh (read or stored): no write.
    let Ok(Some(item)) = store.get(&ApiKey::key_for_hash(&key.key_hash)).await else {
        panic!()
    };
    let Ok(fresh) = from_item::<ApiKey>(item) else {
        panic!()
    };
    let soon = now.plus(chrono::Duration::seconds(59));
    assert_eq!(record_use(&deps(&store), &fresh, soon).await, Ok(false));
    // A stale copy read before the write does not write either.
    assert_eq!(record_use(&deps(&store), &key, soon).await, Ok(false));
    assert_eq!(read(secret.clone()).await, Some(now));
    // A minute later it does.
    let later = now.plus(chrono::Duration::seconds(61));
    assert_eq!(record_use(&deps(&store), &fresh, later).await, Ok(true));
    assert_eq!(read(secret.clone()).await, Some(later));
    // A key deleted meanwhile is not brought back.
    let Ok(()) = store
        .delete(&ApiKey::key_for_hash(&key.key_hash), None)
        .await
    else {
        panic!()
    };
    let much_later = later.plus(chrono::Duration::seconds(120));
    assert_eq!(
        record_use(&deps(&store), &fresh, much_later).await,
        Ok(false)
    );
    assert!(matches!(
        store.get(&ApiKey::key_for_hash(&key.key_hash)).await,
        Ok(None)
    ));
}

async fn setup(store: &dyn Store) -> (Merchant, Project) {
    let now = SystemClock.now();
    let m = create_merchant(
        store,
        now,
        "Himal Traders",
        "ramesh@himal.example",
        Plan::Growth,
    )
    .await;
    let Ok(m) = m else { panic!("merchant") };
    let Ok(p) = create_project(store, now, &m, "Main shop", false).await else {
        panic!("project")
    };
    (m, p)
}

#[test]
fn secret_shapes() {
    let good = format!("sk_test_{}", "a".repeat(32));
    assert_eq!(mode_of_secret(&good), Some(Mode::Sandbox));
    assert_eq!(
        mode_of_secret(&format!("sk_live_{}", "Z9".repeat(20))),
        Some(Mode::Live)
    );
    for bad in [
        "",
        "sk_test_",
        "sk_test_short",
        "pk_test_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ] {
        assert_eq!(mode_of_secret(bad), None, "{bad}");
    }
    assert_eq!(
        mode_of_secret(&format!("sk_test_{}-", "a".repeat(32))),
        None
    );
    assert_eq!(
        mode_of_secret(&format!("sk_test_{}", "a".repeat(200))),
        None
    );
}

#[test]
fn emails_are_masked() {
    assert_eq!(mask_email("ramesh@himal.example"), "r***@himal.example");
    assert_eq!(mask_email("r@x.np"), "r***@x.np");
    assert_eq!(mask_email("not-an-email"), "***");
    assert_eq!(mask_email("@x.np"), "***");
}

#[test]
fn scopes_round_trip() {
    for s in Scope::ALL {
        assert_eq!(Scope::parse(s.as_str()), Some(s));
    }
    assert_eq!(Scope::parse("payments:delete"), None);
}

#[tokio::test]
async fn keys_are_stored_only_as_hashes() {
    let store = store();
    let (_, p) = setup(&*store).await;
    let Ok((secret, key)) = issue_api_key(
        &deps(&store),
        SystemClock.now(),
        &p,
        all_scopes(Mode::Sandbox),
    )
    .await
    else {
        panic!("issue")
    };
    assert!(secret.starts_with("sk_test_"));
    assert_eq!(key.prefix, &secret[..12]);
    assert_eq!(key.hint, &secret[secret.len() - 4..]);
    let item = store
        .get(&ApiKey::key_for_hash(&hash_secret(&secret)))
        .await;
    let text = serde_json::to_string(&item.ok().flatten()).unwrap_or_default();
    assert!(
        !text.contains(&secret),
        "the secret itself must never be stored"
    );
    assert!(text.contains(&hash_secret(&secret)));
}

#[tokio::test]
async fn authentication_checks_key_mode_expiry_suspension_and_pause() {
    let store = store();
    let now = SystemClock.now();
    let (m, p) = setup(&*store).await;
    let Ok((secret, key)) = issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Live)).await
    else {
        panic!("issue")
    };
    let who = authenticate(&*store, now, &secret).await;
    assert_eq!(who.as_ref().map(|w| w.mode()), Ok(Mode::Live));

    // Same random part, other mode: a different key, unknown.
    let other_mode = secret.replacen("sk_live_", "sk_test_", 1);
    assert_eq!(
        authenticate(&*store, now, &other_mode).await,
        Err(AuthError::Invalid)
    );
    // Unknown and malformed keys.
    let unknown = format!("sk_live_{}", "x".repeat(40));
    assert_eq!(
        authenticate(&*store, now, &unknown).await,
        Err(AuthError::Invalid)
    );
    assert_eq!(
        authenticate(&*store, now, "garbage").await,
        Err(AuthError::Invalid)
    );

    // Expired.
    let mut expiring = all_scopes(Mode::Sandbox);
    expiring.expires_at = Some(now.plus(chrono::Duration::seconds(1)));
    let Ok((exp_secret, _)) = issue_api_key(&deps(&store), now, &p, expiring).await else {
        panic!()
    };
    assert!(authenticate(&*store, now, &exp_secret).await.is_ok());
    let later = now.plus(chrono::Duration::seconds(2));
    assert_eq!(
        authenticate(&*store, later, &exp_secret).await,
        Err(AuthError::Expired)
    );

    // Paused key.
    let pause = Pause {
        paused_at: now,
        reason: "rotating".into(),
    };
    assert!(pause_api_key(&*store, &key, pause.clone()).await.is_ok());
    assert_eq!(
        authenticate(&*store, now, &secret).await,
        Err(AuthError::Paused(pause))
    );

    // Suspension wins over everything else the key says.
    let s = Suspension {
        suspended_at: now,
        reason: "chargeback review".into(),
    };
    assert!(suspend_merchant(&*store, &m.id, s.clone()).await.is_ok());
    assert_eq!(
        authenticate(&*store, now, &secret).await,
        Err(AuthError::Suspended(s))
    );
}

#[tokio::test]
async fn account_view_masks_email_without_pii_scope() {
    let store = store();
    let now = SystemClock.now();
    let (_, p) = setup(&*store).await;
    let mut narrow = all_scopes(Mode::Sandbox);
    narrow.scopes = vec![Scope::AccountRead];
    narrow.kind = KeyKind::Restricted;
    let Ok((s1, _)) = issue_api_key(&deps(&store), now, &p, narrow).await else {
        panic!()
    };
    let Ok((s2, _)) = issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Sandbox)).await else {
        panic!()
    };
    let Ok(w1) = authenticate(&*store, now, &s1).await else {
        panic!()
    };
    let Ok(w2) = authenticate(&*store, now, &s2).await else {
        panic!()
    };
    let Ok(v1) = account_view(&deps(&store), &w1).await else {
        panic!()
    };
    let Ok(v2) = account_view(&deps(&store), &w2).await else {
        panic!()
    };
    assert_eq!(v1.merchant.email, "r***@himal.example");
    assert_eq!(v2.merchant.email, "ramesh@himal.example");
    assert_eq!(v1.api_key.kind, KeyKind::Restricted);
    assert_eq!(v1.project.mode, Mode::Sandbox);
    assert_eq!(v2.entitlements.sms_monthly_quota, 200);
}

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e:?}"),
    }
}

#[tokio::test]
async fn keys_are_listed_newest_first_and_found_by_id() {
    let store = store();
    let now = SystemClock.now();
    let (m, p) = setup(&*store).await;
    let q = ok(create_project(&*store, now, &m, "Other", false).await, "q");
    let mut ids = Vec::new();
    for mode in [Mode::Sandbox, Mode::Live, Mode::Sandbox] {
        let (_, k) = ok(
            issue_api_key(&deps(&store), now, &p, all_scopes(mode)).await,
            "issue",
        );
        ids.push(k.id);
    }
    let (_, other) = ok(
        issue_api_key(&deps(&store), now, &q, all_scopes(Mode::Sandbox)).await,
        "issue q",
    );
    let listed = ok(list_api_keys(&deps(&store), &p.id).await, "list");
    let listed_ids: Vec<String> = listed.iter().map(|k| k.id.to_string()).collect();
    ids.reverse();
    assert_eq!(listed_ids, ids, "newest first, only this project's keys");
    assert!(listed.iter().all(|k| k.project_id == p.id));

    let found = ok(find_api_key(&deps(&store), &p.id, &ids[1]).await, "find");
    assert_eq!(found.map(|k| k.mode), Some(Mode::Live));
    // Another project's key is not found through this project.
    assert_eq!(
        ok(find_api_key(&deps(&store), &p.id, &other.id).await, "f"),
        None
    );
    assert_eq!(
        ok(
            find_api_key(&deps(&store), &p.id, &"ak_nope".into()).await,
            "f"
        ),
        None
    );
    assert_eq!(
        ok(list_api_keys(&deps(&store), &"proj_none".into()).await, "l"),
        vec![]
    );
}

#[tokio::test]
async fn listing_follows_pages() {
    let store = store();
    let now = SystemClock.now();
    let (_, p) = setup(&*store).await;
    for _ in 0..230 {
        ok(
            issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Sandbox)).await,
            "issue",
        );
    }
    assert_eq!(
        ok(list_api_keys(&deps(&store), &p.id).await, "list").len(),
        230
    );
}

#[tokio::test]
async fn revoked_keys_stop_working_and_leave_the_list() {
    let store = store();
    let now = SystemClock.now();
    let (_, p) = setup(&*store).await;
    let (secret, key) = ok(
        issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Live)).await,
        "issue",
    );
    assert!(authenticate(&*store, now, &secret).await.is_ok());
    ok(revoke_api_key(&deps(&store), &key).await, "revoke");
    assert_eq!(
        authenticate(&*store, now, &secret).await,
        Err(AuthError::Invalid)
    );
    assert_eq!(
        revoke_api_key(&deps(&store), &key).await,
        Err(StoreError::ConditionFailed),
        "revoking twice says so"
    );
    assert!(ok(list_api_keys(&deps(&store), &p.id).await, "list").is_empty());
    assert_eq!(
        ok(find_api_key(&deps(&store), &p.id, &key.id).await, "f"),
        None
    );
}

#[tokio::test]
async fn rotation_keeps_both_keys_working_during_the_grace() {
    let store = store();
    let now = SystemClock.now();
    let (_, p) = setup(&*store).await;
    let new = NewKey {
        mode: Mode::Live,
        kind: KeyKind::Restricted,
        scopes: vec![Scope::PaymentsRead, Scope::RefundsWrite],
        description: "POS terminal".into(),
        expires_at: None,
        spend_cap_paisa: Some(5_000_000),
    };
    let (old_secret, old) = ok(issue_api_key(&deps(&store), now, &p, new).await, "issue");
    let grace = chrono::Duration::hours(1);
    let r = ok(
        rotate_api_key(&deps(&store), now, &old, grace, None).await,
        "rotate",
    );
    assert!(r.secret.starts_with("sk_live_"));
    assert_ne!(r.secret, old_secret);
    assert_ne!(r.new_key.id, old.id);
    assert_eq!(r.new_key.mode, old.mode);
    assert_eq!(r.new_key.kind, old.kind);
    assert_eq!(r.new_key.scopes, old.scopes);
    assert_eq!(r.new_key.description, old.description);
    assert_eq!(r.new_key.spend_cap_paisa, old.spend_cap_paisa);
    assert_eq!(r.new_key.expires_at, None);
    assert_eq!(r.old_key.expires_at, Some(now.plus(grace)));
    assert!(!format!("{r:?}").contains(&r.secret), "Debug redacts");

    // Stored, not only returned.
    let stored = ok(find_api_key(&deps(&store), &p.id, &old.id).await, "find");
    assert_eq!(stored.and_then(|k| k.expires_at), Some(now.plus(grace)));

    let during = now.plus(chrono::Duration::minutes(59));
    assert!(authenticate(&*store, during, &old_secret).await.is_ok());
    assert!(authenticate(&*store, during, &r.secret).await.is_ok());
    let after = now.plus(chrono::Duration::minutes(61));
    assert_eq!(
        authenticate(&*store, after, &old_secret).await,
        Err(AuthError::Expired)
    );
    assert!(authenticate(&*store, after, &r.secret).await.is_ok());
    assert_eq!(
        ok(list_api_keys(&deps(&store), &p.id).await, "list").len(),
        2
    );
    assert_eq!(default_rotation_grace(), chrono::Duration::hours(24));
}

#[tokio::test]
async fn rotation_never_extends_an_expiry_and_refuses_bad_requests() {
    let store = store();
    let now = SystemClock.now();
    let (_, p) = setup(&*store).await;
    let mut soon = all_scopes(Mode::Sandbox);
    soon.expires_at = Some(now.plus(chrono::Duration::minutes(5)));
    let (_, key) = ok(issue_api_key(&deps(&store), now, &p, soon).await, "issue");
    let later = Some(now.plus(chrono::Duration::days(30)));
    let r = ok(
        rotate_api_key(&deps(&store), now, &key, default_rotation_grace(), later).await,
        "rotate",
    );
    assert_eq!(r.old_key.expires_at, key.expires_at, "never extended");
    assert_eq!(r.new_key.expires_at, later);

    let negative = chrono::Duration::seconds(-1);
    assert!(matches!(
        rotate_api_key(&deps(&store), now, &key, negative, None).await,
        Err(StoreError::Invalid(_))
    ));
    let past = Some(now.plus(chrono::Duration::seconds(-1)));
    assert!(matches!(
        rotate_api_key(&deps(&store), now, &key, negative.abs(), past).await,
        Err(StoreError::Invalid(_))
    ));
    let expired_at = now.plus(chrono::Duration::minutes(6));
    assert!(matches!(
        rotate_api_key(
            &deps(&store),
            expired_at,
            &key,
            default_rotation_grace(),
            None
        )
        .await,
        Err(StoreError::Invalid(_))
    ));

    // A revoked key cannot be rotated, and the failed rotation leaves
    // no new key behind.
    let (_, gone) = ok(
        issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Sandbox)).await,
        "issue",
    );
    ok(revoke_api_key(&deps(&store), &gone).await, "revoke");
    let before = ok(list_api_keys(&deps(&store), &p.id).await, "list").len();
    let failed = rotate_api_key(&deps(&store), now, &gone, default_rotation_grace(), None).await;
    assert!(failed.is_err_and(|e| e.is_condition_failure()));
    assert_eq!(
        ok(list_api_keys(&deps(&store), &p.id).await, "list").len(),
        before
    );
}

#[tokio::test]
async fn reinstated_merchants_work_again() {
    let store = store();
    let now = SystemClock.now();
    let (m, p) = setup(&*store).await;
    let (secret, _) = ok(
        issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Sandbox)).await,
        "issue",
    );
    let s = Suspension {
        suspended_at: now,
        reason: "KYC".into(),
    };
    ok(suspend_merchant(&*store, &m.id, s).await, "suspend");
    assert!(matches!(
        authenticate(&*store, now, &secret).await,
        Err(AuthError::Suspended(_))
    ));
    let back = ok(reinstate_merchant(&*store, &m.id).await, "reinstate");
    assert_eq!(back.suspension, None);
    assert!(authenticate(&*store, now, &secret).await.is_ok());
    // Reinstating twice is harmless; a missing merchant is an error.
    ok(reinstate_merchant(&*store, &m.id).await, "again");
    assert_eq!(
        reinstate_merchant(&*store, &"mer_missing".into()).await,
        Err(StoreError::ConditionFailed)
    );
    assert_eq!(
        ok(get_merchant(&*store, &"mer_missing".into()).await, "g"),
        None,
        "reinstating a missing merchant must not create one"
    );
}

#[tokio::test]
async fn plan_and_live_invoicing_change_the_entitlements() {
    let store = store();
    let now = SystemClock.now();
    let (m, p) = setup(&*store).await;
    let (secret, _) = ok(
        issue_api_key(&deps(&store), now, &p, all_scopes(Mode::Live)).await,
        "issue",
    );
    let view = |store: Arc<dyn Store>, secret: String| async move {
        let who = ok(authenticate(&*store, now, &secret).await, "auth");
        ok(account_view(&deps(&store), &who).await, "view")
    };
    let before = view(store.clone(), secret.clone()).await;
    assert_eq!(before.plan, Plan::Growth);
    assert!(!before.entitlements.live_invoicing);

    let m2 = ok(set_plan(&*store, &m.id, Plan::Pro).await, "plan");
    assert_eq!(m2.plan, Plan::Pro);
    assert_eq!(m2.name, m.name, "other fields kept");
    let p2 = ok(set_live_invoicing(&*store, &p.id, true).await, "inv");
    assert!(p2.live_invoicing);
    assert_eq!(
        ok(get_project(&deps(&store), &p.id).await, "get").map(|p| p.live_invoicing),
        Some(true)
    );

    let after = view(store.clone(), secret).await;
    assert_eq!(after.plan, Plan::Pro);
    assert_eq!(after.entitlements.sms_monthly_quota, 1000);
    assert!(after.entitlements.live_invoicing);

    assert_eq!(
        set_plan(&*store, &"mer_missing".into(), Plan::Free).await,
        Err(StoreError::ConditionFailed)
    );
    assert_eq!(
        set_live_invoicing(&*store, &"proj_missing".into(), true).await,
        Err(StoreError::ConditionFailed)
    );
    assert_eq!(
        ok(
            get_project(&deps(&store), &"proj_missing".into()).await,
            "g"
        ),
        None
    );
}

#[test]
fn publishable_keys_have_their_own_prefix_and_are_no_secret_keys() {
    let random = "a1".repeat(20);
    assert_eq!(
        shape_of_key(&format!("pk_test_{random}")),
        Some((Mode::Sandbox, true))
    );
    assert_eq!(
        shape_of_key(&format!("pk_live_{random}")),
        Some((Mode::Live, true))
    );
    assert_eq!(
        shape_of_key(&format!("sk_live_{random}")),
        Some((Mode::Live, false))
    );
    // A publishable key is not shaped like a secret one.
    assert_eq!(mode_of_secret(&format!("pk_test_{random}")), None);
    assert_eq!(KeyKind::Publishable.prefix(Mode::Live), "pk_live_");
    assert_eq!(KeyKind::Secret.prefix(Mode::Sandbox), "sk_test_");
    assert_eq!(KeyKind::Restricted.prefix(Mode::Live), "sk_live_");
}

#[tokio::test]
async fn a_publishable_key_authenticates_only_with_its_own_prefix() {
    let store = crate::testenv::memory_store();
    let now = crate::testenv::at("2026-11-26T10:00:00Z");
    let m = create_merchant(&*store, now, "Pk Teas", "pk@example.com", Plan::Growth)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let p = create_project(&*store, now, &m, "shop", true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let new = NewKey {
        mode: Mode::Sandbox,
        kind: KeyKind::Publishable,
        scopes: Vec::new(),
        description: String::new(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    let (secret, key) = issue_api_key(&deps(&store), now, &p, new)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(secret.starts_with("pk_test_"), "{secret}");
    let who = authenticate(&*store, now, &secret)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(who.key.id, key.id);
    assert_eq!(who.key.kind, KeyKind::Publishable);
    // The same random part under a secret prefix is no key.
    let forged = secret.replacen("pk_test_", "sk_test_", 1);
    assert_eq!(
        authenticate(&*store, now, &forged).await.err(),
        Some(AuthError::Invalid)
    );
}

// ------------------------------------------------ the principal cache

/// A key authenticated once and remembered in `cache` under the epoch
/// read before the read; the epoch it was remembered under.
async fn remembered(
    store: &dyn Store,
    cache: &cache::PrincipalCache,
    secret: &str,
    now: Timestamp,
) -> u64 {
    let epoch = cache::epoch();
    let p = match authenticate(store, now, secret).await {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("{e:?}"),
    };
    cache.remember(&p, now, epoch);
    epoch
}

/// Remembered for 30 s by the hash of the secret; an expiry is checked
/// on every recall. Tests in this process may bump the epoch at any time
/// (a revocation elsewhere): a check is made only when it held still.
#[tokio::test]
async fn an_authenticated_key_is_remembered_for_thirty_seconds() {
    let store = store();
    let (_, project) = setup(&*store).await;
    let now = SystemClock.now();
    let mut expiring = all_scopes(Mode::Live);
    expiring.expires_at = Some(now.plus(chrono::Duration::seconds(10)));
    let Ok((secret, key)) = issue_api_key(&deps(&store), now, &project, expiring).await else {
        panic!("key")
    };
    let mut checked = 0;
    for _ in 0..100 {
        let cache = cache::PrincipalCache::new();
        let epoch = remembered(&*store, &cache, &secret, now).await;
        let soon = cache.recall(&secret, now.plus(chrono::Duration::seconds(9)));
        let expired = cache.recall(&secret, now.plus(chrono::Duration::seconds(10)));
        let later = cache.recall(&secret, now.plus(cache::PRINCIPAL_TTL));
        let before = cache.recall(&secret, now.plus(chrono::Duration::seconds(-1)));
        let other = cache.recall("sk_live_notthesecret", now);
        if cache::epoch() != epoch {
            continue;
        }
        assert!(
            matches!(soon, Some(Ok(ref p)) if p.key.id == key.id),
            "{soon:?}"
        );
        assert!(
            matches!(expired, Some(Err(AuthError::Expired))),
            "{expired:?}"
        );
        assert!(later.is_none() && before.is_none() && other.is_none());
        checked += 1;
        break;
    }
    assert_eq!(checked, 1, "the epoch never held still");
}

/// A revocation, a pause, a suspension or a plan change in this process
/// is seen by the next request; a read made before such a change is never
/// remembered as current.
#[tokio::test]
async fn a_change_in_this_process_is_seen_at_once() {
    let store = store();
    let (merchant, project) = setup(&*store).await;
    let now = SystemClock.now();
    let Ok((secret, key)) =
        issue_api_key(&deps(&store), now, &project, all_scopes(Mode::Live)).await
    else {
        panic!("key")
    };
    let cache = cache::PrincipalCache::new();
    remembered(&*store, &cache, &secret, now).await;
    assert!(set_plan(&*store, &merchant.id, Plan::Pro).await.is_ok());
    assert!(cache.recall(&secret, now).is_none(), "the plan changed");
    remembered(&*store, &cache, &secret, now).await;
    let pause = Pause {
        reason: "review".into(),
        paused_at: now,
    };
    assert!(pause_api_key(&*store, &key, pause).await.is_ok());
    assert!(cache.recall(&secret, now).is_none(), "paused");
    assert!(matches!(
        authenticate(&*store, now, &secret).await,
        Err(AuthError::Paused(_))
    ));
    // Read before a change, remembered after it: not remembered.
    let epoch = cache::epoch();
    let Ok((other_secret, other)) =
        issue_api_key(&deps(&store), now, &project, all_scopes(Mode::Live)).await
    else {
        panic!("key")
    };
    let Ok(p) = authenticate(&*store, now, &other_secret).await else {
        panic!("auth")
    };
    assert!(revoke_api_key(&deps(&store), &other).await.is_ok());
    cache.remember(&Arc::new(p), now, epoch);
    assert!(cache.recall(&other_secret, now).is_none(), "revoked");
}

#[tokio::test]
async fn keys_and_projects_are_stored_where_and_listed_as_before() {
    use crate::domain::record::Record;
    use crate::store::{Index, PK, SK};
    let store = store();
    let (m, p) = setup(&*store).await;
    let Ok((_, key)) =
        issue_api_key(&deps(&store), SystemClock.now(), &p, all_scopes(Mode::Live)).await
    else {
        panic!("key")
    };
    let Ok(Some(item)) = store.get(&ApiKey::key_for_hash(&key.key_hash)).await else {
        panic!("the key is stored under its hash")
    };
    assert_eq!(item[PK], format!("AKEY#{}", key.key_hash));
    assert_eq!(item[Index::Gsi1.pk_attr()], format!("PROJ#{}#AKEYS", p.id));
    assert_eq!(item[Index::Gsi1.sk_attr()], key.id.as_str());
    let Ok(Some(item)) = store.get(&Project::key(&p.id)).await else {
        panic!("the project is stored")
    };
    assert_eq!(item[Index::Gsi1.pk_attr()], format!("MER#{}#PROJ", m.id));
    assert_eq!(
        item[Index::Gsi1.sk_attr()],
        format!("{}#{}", p.created_at.to_rfc3339(), p.id)
    );
    assert_eq!(p.item_key(), Project::key(&p.id));
    assert_eq!(m.item_key(), Merchant::key(&m.id));
    let Ok(Some(item)) = store.get(&Merchant::key(&m.id)).await else {
        panic!("the merchant is stored")
    };
    assert_eq!(item[SK], "MER");
}

#[tokio::test]
async fn listing_a_project_again_writes_its_entry_and_nothing_else() {
    use crate::store::Index;
    let store = store();
    let (_, p) = setup(&*store).await;
    let Ok(Some(before)) = store.get(&Project::key(&p.id)).await else {
        panic!("the project is stored")
    };
    let mut bare = before.clone();
    bare.remove(Index::Gsi1.pk_attr());
    bare.remove(Index::Gsi1.sk_attr());
    assert_eq!(store.put(bare, None).await, Ok(()));
    assert_eq!(list_under_merchant(&*store, &p).await, Ok(()));
    let Ok(Some(after)) = store.get(&Project::key(&p.id)).await else {
        panic!("the project is stored")
    };
    assert_eq!(after, before);
}

/// Issue 39, 8: a secret key issued before the billing scopes existed
/// (its stored list without them) has them; a restricted key only what it
/// was granted; every paid plan has the billing API.
#[tokio::test]
async fn a_secret_key_has_the_billing_scopes_a_restricted_key_only_if_granted() {
    let store = store();
    let (_, project) = setup(&*store).await;
    let now = SystemClock.now();
    let old = NewKey {
        scopes: Scope::ALL
            .into_iter()
            .filter(|s| !s.as_str().starts_with("billing:"))
            .collect(),
        ..all_scopes(Mode::Sandbox)
    };
    let Ok((_, secret)) = issue_api_key(&deps(&store), now, &project, old).await else {
        panic!("key")
    };
    assert!(secret.has_scope(Scope::BillingRead));
    assert!(secret.has_scope(Scope::BillingWrite));
    let restricted = NewKey {
        kind: KeyKind::Restricted,
        scopes: vec![Scope::BillingRead],
        ..all_scopes(Mode::Sandbox)
    };
    let Ok((_, restricted)) = issue_api_key(&deps(&store), now, &project, restricted).await else {
        panic!("key")
    };
    assert!(restricted.has_scope(Scope::BillingRead));
    assert!(!restricted.has_scope(Scope::BillingWrite));
    assert_eq!(Scope::parse("billing:write"), Some(Scope::BillingWrite));
    assert!(!Plan::Free.billing_api());
    assert!(Plan::Growth.billing_api());
    assert!(Plan::Pro.billing_api());
}
