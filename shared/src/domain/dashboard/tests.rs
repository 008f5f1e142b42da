use super::sessions::{ATTEMPTS_PER_ACCOUNT, ATTEMPTS_PER_ADDRESS, IDLE};
use super::users::PASSWORD_MAX_BYTES;
use super::*;
use crate::AppState;
use crate::domain::Mode;
use crate::domain::account::{Plan, create_merchant, create_project};
use crate::ids::{MerchantId, ProjectId};
use crate::store::Store;
use crate::store::embedded::EmbeddedStore;
use crate::testenv::at;
use crate::time::ManualClock;
use std::sync::Arc;

pub(super) const PASSWORD: &str = "correct horse battery";

/// The rules' dependencies over an in-memory store; tests that read or
/// write the store itself go through `deps.store`.
fn deps() -> AppState {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}")));
    AppState::new(
        store,
        Arc::new(ManualClock::new(at("2026-11-26T10:00:00Z"))),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

pub(super) async fn setup() -> (AppState, DashboardUser, ProjectId) {
    let store = deps();
    let now = at("2026-11-26T10:00:00Z");
    let m = create_merchant(&*store.store, now, "Himal", "a@himal.np", Plan::Growth)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let p = create_project(&*store.store, now, &m, "Shop", false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let u = create_user(&store, now, &m.id, "Owner@Himal.np ", Role::Owner, PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (store, u, p.id)
}

#[test]
fn roles_allow_what_the_issue_says() {
    use super::Action::{ChangeRecords, People, ReadCredentials, ReadKeys, ReadRecords, Webhooks};
    let may = |r: Role, a: super::Action| {
        super::allows(r, a, Mode::Sandbox) && super::allows(r, a, Mode::Live)
    };
    let secrets = [ReadKeys, ReadCredentials, Webhooks];
    assert!(may(Role::Viewer, ReadRecords));
    assert!(!super::allows(Role::Viewer, ChangeRecords, Mode::Sandbox));
    assert!(
        secrets
            .iter()
            .all(|a| !super::allows(Role::Viewer, *a, Mode::Sandbox))
    );
    assert!(!super::allows(Role::Viewer, People, Mode::Sandbox));
    assert!(
        may(Role::Developer, ChangeRecords) && secrets.iter().all(|a| may(Role::Developer, *a))
    );
    assert!(!super::allows(Role::Developer, People, Mode::Sandbox));
    assert!(may(Role::Owner, People));
    for r in [Role::Owner, Role::Developer, Role::Viewer] {
        assert_eq!(Role::parse(r.as_str()), Some(r));
    }
    assert_eq!(Role::parse("admin"), None);
}

#[test]
fn passwords_and_emails_are_checked() {
    assert!(check_password("short").is_err());
    assert!(check_password(&"x".repeat(PASSWORD_MAX_BYTES + 1)).is_err());
    assert!(check_password("twelve chars").is_ok());
    assert_eq!(
        normalize_email(" A@B.np ").unwrap_or_default(),
        "a@b.np".to_owned()
    );
    assert!(normalize_email("no-at-sign").is_err());
    assert!(normalize_email("a#b@c.np").is_err());
}

#[tokio::test]
async fn the_stored_hash_is_argon2id_and_verifies_only_the_password() {
    let (store, user, _) = setup().await;
    assert!(
        user.password_hash
            .starts_with("$argon2id$v=19$m=19456,t=2,p=1$")
    );
    assert!(!user.password_hash.contains(PASSWORD));
    assert!(verify_password(PASSWORD, &user.password_hash).await);
    assert!(!verify_password("correct horse battery!", &user.password_hash).await);
    assert!(!verify_password(PASSWORD, "not a hash").await);
    assert_eq!(user.email, "owner@himal.np");
    let again = create_user(
        &store,
        at("2026-11-26T10:00:00Z"),
        &user.merchant_id,
        "OWNER@himal.np",
        Role::Viewer,
        PASSWORD,
    )
    .await;
    assert!(
        matches!(again, Err(DashboardError::EmailTaken)),
        "{again:?}"
    );
    let nobody = create_user(
        &store,
        at("2026-11-26T10:00:00Z"),
        &"mer_missing".into(),
        "x@y.np",
        Role::Viewer,
        PASSWORD,
    )
    .await;
    assert!(matches!(nobody, Err(DashboardError::UnknownMerchant)));
}

#[tokio::test]
async fn a_session_opens_idles_out_and_ends_absolutely() {
    let (store, user, project) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let s = sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.session.project_id, project);
    assert_eq!(s.session.mode, Mode::Sandbox);
    assert_eq!(s.user.id, user.id);
    // The cookie is not what is stored.
    assert!(
        store
            .store
            .get(&keys::dashboard_session(&s.cookie))
            .await
            .ok()
            .flatten()
            .is_none()
    );
    let open = |t: Timestamp| open_session(&store, t, &s.cookie);
    // Used every 20 minutes, it lives until the absolute end.
    let mut t = t0;
    for _ in 0..35 {
        t = t.plus(chrono::Duration::minutes(20));
        let r = open(t).await.unwrap_or_else(|e| panic!("{e}"));
        if t < t0.plus(ABSOLUTE) {
            assert!(r.is_ok(), "{t}: {r:?}");
        } else {
            assert_eq!(r.err(), Some(SessionEnd::Expired), "{t}");
            break;
        }
    }
    // A fresh one idles out after 30 minutes without a request.
    let s2 = sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = open_session(&store, t0.plus(IDLE), &s2.cookie).await;
    assert_eq!(r.ok().and_then(|r| r.err()), Some(SessionEnd::Expired));
    // Gone for good after it expired.
    let r = open_session(&store, t0.plus(chrono::Duration::minutes(1)), &s2.cookie).await;
    assert_eq!(r.ok().and_then(|r| r.err()), Some(SessionEnd::Unknown));
    for bad in [
        "",
        "ds_short",
        "sk_test_whatever",
        &format!("ds_{}", "a".repeat(43)),
    ] {
        let r = open_session(&store, t0, bad).await;
        assert_eq!(
            r.ok().and_then(|r| r.err()),
            Some(SessionEnd::Unknown),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn sign_out_everywhere_reset_and_disable_end_sessions() {
    let (store, user, _) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let sign = || sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.0.0.1");
    let a = sign().await.unwrap_or_else(|e| panic!("{e}"));
    let b = sign().await.unwrap_or_else(|e| panic!("{e}"));
    sign_out(&store, &a.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = open_session(&store, t0, &a.cookie).await.ok();
    assert_eq!(r.and_then(|r| r.err()), Some(SessionEnd::Unknown));
    assert!(matches!(
        open_session(&store, t0, &b.cookie).await,
        Ok(Ok(_))
    ));
    end_all_sessions(&store, &user.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = open_session(&store, t0, &b.cookie).await.ok();
    assert_eq!(r.and_then(|r| r.err()), Some(SessionEnd::Revoked));

    let c = sign().await.unwrap_or_else(|e| panic!("{e}"));
    reset_password(&*store.store, "owner@himal.np", "a brand new password")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = open_session(&store, t0, &c.cookie).await.ok();
    assert_eq!(r.and_then(|r| r.err()), Some(SessionEnd::Revoked));
    assert!(matches!(
        sign().await,
        Err(DashboardError::WrongCredentials)
    ));
    let d = sign_in(
        &store,
        t0,
        "owner@himal.np",
        "a brand new password",
        "10.0.0.1",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    set_disabled(&*store.store, "owner@himal.np", true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = open_session(&store, t0, &d.cookie).await.ok();
    assert_eq!(r.and_then(|r| r.err()), Some(SessionEnd::Revoked));
    let r = sign_in(
        &store,
        t0,
        "owner@himal.np",
        "a brand new password",
        "10.0.0.1",
    )
    .await;
    assert!(matches!(r, Err(DashboardError::Disabled)), "{r:?}");
}

#[tokio::test]
async fn guesses_are_throttled_per_account_and_per_address() {
    let (store, _, _) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    for n in 0..ATTEMPTS_PER_ACCOUNT_AND_ADDRESS {
        let r = sign_in(&store, t0, "owner@himal.np", "wrong password!", "10.0.0.1").await;
        assert!(
            matches!(r, Err(DashboardError::WrongCredentials)),
            "{n}: {r:?}"
        );
    }
    // The right password no longer helps from that address in this
    // window; the owner at another address is not locked out by it.
    let r = sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.0.0.1").await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");
    assert!(
        sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.9.9.9")
            .await
            .is_ok()
    );
    // Guesses spread over many addresses are held per account too.
    let t2 = at("2026-11-26T14:00:00Z");
    for n in 0..ATTEMPTS_PER_ACCOUNT {
        let from = format!("10.1.{}.{}", n / 200, n % 200);
        let r = sign_in(&store, t2, "owner@himal.np", "wrong password!", &from).await;
        assert!(
            matches!(r, Err(DashboardError::WrongCredentials)),
            "{n}: {r:?}"
        );
    }
    let r = sign_in(&store, t2, "owner@himal.np", PASSWORD, "10.2.0.1").await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");
    let later = t0.plus(chrono::Duration::seconds(ATTEMPT_WINDOW));
    assert!(
        sign_in(&store, later, "owner@himal.np", PASSWORD, "10.0.0.1")
            .await
            .is_ok()
    );

    // One address guessing many accounts is held too.
    let t1 = at("2026-11-26T12:00:00Z");
    for n in 0..ATTEMPTS_PER_ADDRESS {
        let r = sign_in(
            &store,
            t1,
            &format!("u{n}@x.np"),
            "wrong password!",
            "10.0.0.2",
        )
        .await;
        assert!(
            matches!(r, Err(DashboardError::WrongCredentials)),
            "{n}: {r:?}"
        );
    }
    let r = sign_in(&store, t1, "owner@himal.np", PASSWORD, "10.0.0.2").await;
    assert!(matches!(r, Err(DashboardError::Throttled { .. })), "{r:?}");
    // The owner's own slots were given back: another address signs in.
    assert!(
        sign_in(&store, t1, "owner@himal.np", PASSWORD, "10.0.0.3")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn switching_view_stays_within_the_merchant() {
    let (store, _, project) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let s = sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let other = create_merchant(&*store.store, t0, "Other", "o@o.np", Plan::Free)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let theirs = create_project(&*store.store, t0, &other, "Theirs", false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = switch_view(&store, &s.cookie, &s.session, &theirs.id, Mode::Live).await;
    assert!(matches!(
        r,
        Err(DashboardError::Invalid {
            field: "project",
            ..
        })
    ));
    switch_view(&store, &s.cookie, &s.session, &project, Mode::Live)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (session, _) = open_session(&store, t0, &s.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(session.mode, Mode::Live);
    assert!(session.csrf_ok(&s.session.csrf));
    assert!(!session.csrf_ok(""));
    assert!(!session.csrf_ok("x"));
}

#[tokio::test]
async fn the_audit_log_pages_newest_first() {
    let (store, user, project) = setup().await;
    let actor = Actor {
        user_id: user.id.clone(),
        email: user.email.clone(),
        merchant_id: user.merchant_id.clone(),
        project_id: project,
        mode: Mode::Sandbox,
        address: "10.0.0.1".into(),
    };
    let t0 = at("2026-11-26T10:00:00Z");
    for n in 0..7 {
        let e = audit_entry(
            &actor,
            t0.plus(chrono::Duration::seconds(n)),
            "test",
            &format!("t{n}"),
            "",
        );
        record_audit(&store, &e)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let (first, next) = list_audit(&store, &user.merchant_id, None, 3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let targets: Vec<_> = first.iter().map(|e| e.target.as_str()).collect();
    assert_eq!(targets, ["t6", "t5", "t4"]);
    let (second, _) = list_audit(&store, &user.merchant_id, next.as_deref(), 3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let targets: Vec<_> = second.iter().map(|e| e.target.as_str()).collect();
    assert_eq!(targets, ["t3", "t2", "t1"]);
    let (none, _) = list_audit(&store, &"mer_other".into(), None, 3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(none.is_empty());
}

#[tokio::test]
async fn an_owner_changes_only_their_own_merchants_people() {
    let (store, owner, _) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let dev = create_user(
        &store,
        t0,
        &owner.merchant_id,
        "dev@himal.np",
        Role::Developer,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let s = sign_in(&store, t0, "dev@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let changed = change_user(
        &store,
        &owner.merchant_id,
        &dev.id,
        UserChange::Role(Role::Viewer),
        |_| None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(changed.role, Role::Viewer);
    // The role is read on each request: the open session sees it.
    let (_, now_user) = open_session(&store, t0, &s.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(now_user.role, Role::Viewer);
    let r = change_user(
        &store,
        &"mer_other".into(),
        &dev.id,
        UserChange::Disabled(true),
        |_| None,
    )
    .await;
    assert!(matches!(r, Err(DashboardError::UnknownUser)), "{r:?}");
    let r = change_user(
        &store,
        &owner.merchant_id,
        &"usr_missing".into(),
        UserChange::Disabled(true),
        |_| None,
    )
    .await;
    assert!(matches!(r, Err(DashboardError::UnknownUser)), "{r:?}");
    change_user(
        &store,
        &owner.merchant_id,
        &dev.id,
        UserChange::Disabled(true),
        |_| None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let r = open_session(&store, t0, &s.cookie).await.ok();
    assert_eq!(r.and_then(|r| r.err()), Some(SessionEnd::Revoked));
    let users = list_users(&store, &owner.merchant_id)
        .await
        .unwrap_or_default();
    assert_eq!(users.len(), 2);
}

#[tokio::test]
async fn people_claims_and_sessions_are_stored_as_before() {
    use crate::domain::account::hash_secret;
    use crate::domain::record::Record;
    use crate::store::{Index, PK, SK};
    let (store, user, project) = setup().await;
    // The email claim: its key and the user's id, nothing else.
    let Ok(Some(claim)) = store
        .store
        .get(&keys::dashboard_email("owner@himal.np"))
        .await
    else {
        panic!("the email is claimed")
    };
    assert_eq!(claim.len(), 3, "{claim:?}");
    assert_eq!(claim[PK], "DEMAIL#owner@himal.np");
    assert_eq!(claim[SK], "DEMAIL");
    assert_eq!(claim["user_id"], user.id.as_str());
    // The user, listed among its merchant's people by creation.
    let Ok(Some(stored)) = store.store.get(&DashboardUser::key(&user.id)).await else {
        panic!("the user is stored")
    };
    assert_eq!(
        stored[Index::Gsi1.pk_attr()],
        format!("MER#{}#DUSER", user.merchant_id)
    );
    assert_eq!(
        stored[Index::Gsi1.sk_attr()],
        format!("{}#{}", user.created_at.to_rfc3339(), user.id)
    );
    assert_eq!(user.item_key(), DashboardUser::key(&user.id));
    // The session, under its cookie's hash, kept an hour past its end.
    let t0 = at("2026-11-26T10:00:00Z");
    let s = sign_in(&store, t0, "owner@himal.np", PASSWORD, "10.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let key = keys::dashboard_session(&hash_secret(&s.cookie));
    assert_eq!(s.session.item_key(), key);
    let Ok(Some(item)) = store.store.get(&key).await else {
        panic!("the session is stored under its cookie's hash")
    };
    let ttl = s.session.expires_at.unix_seconds() + 3600;
    assert_eq!(item["ttl"], ttl);
    assert_eq!(s.session.ttl, Some(ttl));
    assert!(!item.contains_key("token_hash"), "{item:?}");
    // Opened again, it is the session signed in (its key too).
    let opened = open_session(&store, t0, &s.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let Ok((session, _)) = opened else {
        panic!("{opened:?}")
    };
    assert_eq!(session, s.session);
    assert_eq!(session.project_id, project);
}

#[test]
fn an_audit_entry_is_kept_in_its_merchants_log_by_time() {
    use crate::domain::record::Record;
    let entry = AuditEntry {
        id: "aud_1".into(),
        merchant_id: "mer_1".into(),
        user_id: "usr_1".into(),
        email: "a@b.np".into(),
        action: "sign_in".into(),
        target: String::new(),
        project_id: ProjectId::default(),
        mode: None,
        detail: String::new(),
        address: "10.0.0.1".into(),
        at: at("2026-11-26T10:00:00Z"),
    };
    assert_eq!(
        entry.item_key(),
        crate::store::Key::new(
            keys::audit_partition("mer_1"),
            format!("{}#aud_1", entry.at.to_rfc3339())
        )
    );
}

/// An invitation from the owner of `setup`'s merchant.
async fn invited(deps: &AppState, owner: &DashboardUser, email: &str) -> (String, Invitation) {
    invite(
        deps,
        at("2026-11-26T10:00:00Z"),
        &owner.merchant_id,
        &owner.id,
        email,
        Role::Developer,
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn an_invitation_is_pending_then_accepted_once() {
    let (deps, owner, _) = setup().await;
    let now = at("2026-11-26T10:00:00Z");
    let (token, inv) = invited(&deps, &owner, " New@Himal.np").await;
    assert_eq!(
        (inv.state, inv.email.as_str()),
        (InvitationState::Pending, "new@himal.np")
    );
    assert_eq!(inv.expires_at, now.plus(INVITATION_TTL));
    // Stored by the token's hash only: no item holds the token.
    let stored = format!("{:?}", deps.store.get(&Invitation::key(&inv.hash)).await);
    assert!(
        !stored.contains(&token) && stored.contains(&inv.hash),
        "{stored}"
    );
    assert!(
        open_invitation(&deps, now, &token)
            .await
            .ok()
            .flatten()
            .is_some()
    );
    assert_eq!(
        pending_invitations(&deps, now, &owner.merchant_id)
            .await
            .map(|v| v.len())
            .ok(),
        Some(1)
    );
    // A short password leaves it pending.
    let short = accept_with_password(&deps, now, &token, "short", "127.0.0.1").await;
    assert!(matches!(
        short,
        Err(AcceptError::Dashboard(DashboardError::Invalid { .. }))
    ));
    let user = accept_with_password(&deps, now, &token, PASSWORD, "127.0.0.1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (user.role, user.merchant_id.clone()),
        (Role::Developer, owner.merchant_id.clone())
    );
    // Joining is audited in the same transaction, as the person.
    let (log, _) = list_audit(&deps, &owner.merchant_id, None, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let joined: Vec<(&str, &str)> = log
        .iter()
        .filter(|e| e.action == "person.join")
        .map(|e| (e.email.as_str(), e.address.as_str()))
        .collect();
    assert_eq!(joined, [("new@himal.np", "127.0.0.1")]);
    assert!(
        find_user_by_email(&*deps.store, "new@himal.np")
            .await
            .ok()
            .flatten()
            .is_some()
    );
    // Used: it opens nothing and accepts nothing more.
    assert!(
        open_invitation(&deps, now, &token)
            .await
            .ok()
            .flatten()
            .is_none()
    );
    let again = accept_with_password(&deps, now, &token, PASSWORD, "127.0.0.1").await;
    assert!(matches!(again, Err(AcceptError::Unusable)), "{again:?}");
    assert_eq!(
        pending_invitations(&deps, now, &owner.merchant_id)
            .await
            .map(|v| v.len())
            .ok(),
        Some(0)
    );
}

#[tokio::test]
async fn expired_revoked_and_unknown_invitations_are_alike_unusable() {
    let (deps, owner, _) = setup().await;
    let now = at("2026-11-26T10:00:00Z");
    let (token, _) = invited(&deps, &owner, "late@himal.np").await;
    let later = now.plus(INVITATION_TTL);
    assert!(
        open_invitation(&deps, later, &token)
            .await
            .ok()
            .flatten()
            .is_none()
    );
    let late = accept_with_password(&deps, later, &token, PASSWORD, "127.0.0.1").await;
    assert!(matches!(late, Err(AcceptError::Unusable)), "{late:?}");
    assert_eq!(
        pending_invitations(&deps, later, &owner.merchant_id)
            .await
            .map(|v| v.len())
            .ok(),
        Some(0)
    );

    let (token, inv) = invited(&deps, &owner, "gone@himal.np").await;
    // Another merchant's owner cannot revoke it; its own can, once.
    let other = MerchantId::stored("mer_00000000000000000000000001");
    assert!(matches!(
        revoke_invitation(&deps, now, &other, &inv.hash, None).await,
        Ok(false)
    ));
    assert!(matches!(
        revoke_invitation(&deps, now, &owner.merchant_id, &inv.hash, None).await,
        Ok(true)
    ));
    assert!(matches!(
        revoke_invitation(&deps, now, &owner.merchant_id, &inv.hash, None).await,
        Ok(false)
    ));
    let revoked = accept_with_password(&deps, now, &token, PASSWORD, "127.0.0.1").await;
    assert!(matches!(revoked, Err(AcceptError::Unusable)), "{revoked:?}");
    assert!(
        find_user_by_email(&*deps.store, "gone@himal.np")
            .await
            .ok()
            .flatten()
            .is_none()
    );

    for bad in [
        "",
        "di_x",
        "ds_0000000000000000000000000000000000000000000",
        "di_00000000000000000000000000000000000000000000",
    ] {
        assert!(
            open_invitation(&deps, now, bad)
                .await
                .ok()
                .flatten()
                .is_none(),
            "{bad}"
        );
        let r = accept_with_password(&deps, now, bad, PASSWORD, "127.0.0.1").await;
        assert!(matches!(r, Err(AcceptError::Unusable)), "{bad}: {r:?}");
    }
    assert!(!invitation_hash_ok("../x") && invitation_hash_ok(&inv.hash));
}

#[tokio::test]
async fn inviting_an_address_with_an_account_answers_alike() {
    let (deps, owner, _) = setup().await;
    // The owner's own address has an account: the invitation is made the
    // same way, and accepting it with a password is refused.
    let (token, inv) = invited(&deps, &owner, "owner@himal.np").await;
    assert_eq!(inv.state, InvitationState::Pending);
    let now = at("2026-11-26T10:00:00Z");
    let r = accept_with_password(&deps, now, &token, PASSWORD, "127.0.0.1").await;
    assert!(matches!(r, Err(AcceptError::HasAccount)), "{r:?}");
    assert!(
        open_invitation(&deps, now, &token)
            .await
            .ok()
            .flatten()
            .is_some(),
        "still pending"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_accepts_exactly_one_wins() {
    let (deps, owner, _) = setup().await;
    let now = at("2026-11-26T10:00:00Z");
    for round in 0..4 {
        let (token, _) = invited(&deps, &owner, &format!("race{round}@himal.np")).await;
        let (a, b) = tokio::join!(
            accept_with_password(&deps, now, &token, PASSWORD, "127.0.0.1"),
            accept_with_password(&deps, now, &token, "another long password", "127.0.0.1"),
        );
        let won = [a.is_ok(), b.is_ok()];
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{a:?} {b:?}");
        let lost = if a.is_ok() { b } else { a };
        assert!(matches!(lost, Err(AcceptError::Unusable)), "{lost:?}");
    }
    let people = list_users(&deps, &owner.merchant_id)
        .await
        .unwrap_or_default();
    assert_eq!(people.len(), 5, "the owner and one per invitation");
}

/// Item 7 of issue 37: an action's audit entry is written in the action's
/// own transaction, so a refused action leaves no entry and a done one
/// exactly one (no entry "logged and forgotten", none for nothing).
#[tokio::test]
async fn an_audit_entry_commits_only_with_its_action() {
    let (store, owner, project) = setup().await;
    let t0 = at("2026-11-26T10:00:00Z");
    let dev = create_user(
        &store,
        t0,
        &owner.merchant_id,
        "dev@himal.np",
        Role::Developer,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let actor = Actor {
        user_id: owner.id.clone(),
        email: owner.email.clone(),
        merchant_id: owner.merchant_id.clone(),
        project_id: project,
        mode: Mode::Sandbox,
        address: "10.0.0.1".into(),
    };
    let entries = |store: AppState, merchant: MerchantId| async move {
        let (all, _) = list_audit(&store, &merchant, None, 50)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        all.into_iter()
            .map(|e| (e.action, e.target))
            .collect::<Vec<_>>()
    };

    // Refused: another merchant's person, an unknown invitation.
    let r = change_user(
        &store,
        &"mer_other".into(),
        &dev.id,
        UserChange::Disabled(true),
        |u| Some(audit_entry(&actor, t0, "person.change", &u.id, "disabled")),
    )
    .await;
    assert!(matches!(r, Err(DashboardError::UnknownUser)), "{r:?}");
    let e = audit_entry(&actor, t0, "person.invite.revoke", &"a".repeat(64), "");
    let revoked = revoke_invitation(&store, t0, &owner.merchant_id, &"a".repeat(64), Some(&e))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!revoked);
    assert_eq!(entries(store.clone(), owner.merchant_id.clone()).await, []);

    // Done: the change and its one entry.
    let changed = change_user(
        &store,
        &owner.merchant_id,
        &dev.id,
        UserChange::Role(Role::Viewer),
        |u| {
            Some(audit_entry(
                &actor,
                t0,
                "person.change",
                &u.id,
                "now viewer",
            ))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(changed.role, Role::Viewer);
    let (_, inv) = invite(
        &store,
        t0,
        &owner.merchant_id,
        &owner.id,
        "new@himal.np",
        Role::Viewer,
        Some(&audit_entry(
            &actor,
            t0,
            "person.invite",
            "new@himal.np",
            "",
        )),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let e = audit_entry(&actor, t0, "person.invite.revoke", &inv.hash, "");
    assert!(
        revoke_invitation(&store, t0, &owner.merchant_id, &inv.hash, Some(&e))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    // A second revoke is refused, and adds no entry.
    let again = audit_entry(&actor, t0, "person.invite.revoke", &inv.hash, "");
    assert!(
        !revoke_invitation(&store, t0, &owner.merchant_id, &inv.hash, Some(&again))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    let mut got = entries(store.clone(), owner.merchant_id.clone()).await;
    got.sort();
    let mut want = vec![
        ("person.change".to_owned(), dev.id.to_string()),
        ("person.invite".to_owned(), "new@himal.np".to_owned()),
        ("person.invite.revoke".to_owned(), inv.hash.clone()),
    ];
    want.sort();
    assert_eq!(got, want);
}
