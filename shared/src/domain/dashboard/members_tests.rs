//! One person in several merchants: accepting with an existing account,
//! a role per merchant, switching, removing one membership.

use super::audit;
use super::tests::{PASSWORD, setup};
use super::{
    AcceptError, DashboardError, DashboardUser, Membership, Role, SessionEnd, UserChange, accept,
    audit_entry, change_user, create_user, invite, list_audit, list_members, member_merchants,
    open_session, remove_member, reset_password, reset_password_of, sign_in, sign_out_everywhere,
    switch_merchant,
};
use crate::AppState;
use crate::domain::account::{Plan, create_merchant, create_project};
use crate::ids::MerchantId;
use crate::testenv::at;

const FROM: &str = "127.0.0.1";

/// A second merchant (with a project) and its owner.
async fn merchant(deps: &AppState, name: &str, owner: &str) -> (MerchantId, DashboardUser) {
    let now = at("2026-11-26T10:00:00Z");
    let m = create_merchant(&*deps.store, now, name, owner, Plan::Growth)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    create_project(&*deps.store, now, &m, "Shop", false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let u = create_user(deps, now, &m.id, owner, Role::Owner, PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (m.id, u)
}

/// A token inviting `email` to `by`'s merchant as `role`.
async fn invited(deps: &AppState, by: &DashboardUser, email: &str, role: Role) -> String {
    let now = at("2026-11-26T10:00:00Z");
    invite(deps, now, &by.merchant_id, &by.id, email, role, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

/// The session's person, as the dashboard authorises them.
async fn seen(deps: &AppState, cookie: &str) -> Result<DashboardUser, SessionEnd> {
    let now = at("2026-11-26T10:01:00Z");
    open_session(deps, now, cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|(_, u)| u)
}

#[tokio::test]
async fn an_account_joins_a_second_merchant_with_a_role_there() {
    let (deps, asha, _) = setup().await;
    let (b, b_owner) = merchant(&deps, "Other", "owner@other.np").await;
    let now = at("2026-11-26T10:00:00Z");
    let token = invited(&deps, &b_owner, "owner@himal.np", Role::Viewer).await;
    // Too short for any account: the same refusal as for a new address.
    let short = accept(&deps, now, &token, "short", FROM).await;
    assert!(
        matches!(
            short,
            Err(AcceptError::Dashboard(DashboardError::Invalid { .. }))
        ),
        "{short:?}"
    );
    let wrong = accept(&deps, now, &token, "not the right password", FROM).await;
    assert!(
        matches!(
            wrong,
            Err(AcceptError::Dashboard(DashboardError::WrongCredentials))
        ),
        "{wrong:?}"
    );
    let joined = accept(&deps, now, &token, PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (joined.id.clone(), joined.merchant_id.clone()),
        (asha.id.clone(), b.clone())
    );
    assert_eq!(joined.role, Role::Viewer);
    let merchants = member_merchants(&deps, &asha.id).await.unwrap_or_default();
    assert_eq!(
        merchants,
        vec![
            (asha.merchant_id.clone(), Role::Owner),
            (b.clone(), Role::Viewer)
        ]
    );
    let listed = list_members(&deps, &b).await.unwrap_or_default();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].email.as_str(), listed[0].role),
        ("owner@himal.np", Role::Viewer)
    );
    let (log, _) = list_audit(&deps, &b, None, 10).await.unwrap_or_default();
    assert!(
        log.iter()
            .any(|e| e.action == "person.join" && e.user_id == asha.id)
    );

    // Signed in on her first merchant as its owner; switched, a viewer of B.
    let s = sign_in(&deps, now, "owner@himal.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let u = seen(&deps, &s.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        (u.merchant_id.clone(), u.role),
        (asha.merchant_id.clone(), Role::Owner)
    );
    switch_merchant(&deps, &s.cookie, &s.session, &b)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let u = seen(&deps, &s.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!((u.merchant_id.clone(), u.role), (b.clone(), Role::Viewer));

    // Not a person of C: refused, the session unchanged.
    let (c, _) = merchant(&deps, "Third", "owner@third.np").await;
    let forged = switch_merchant(&deps, &s.cookie, &s.session, &c).await;
    assert!(
        matches!(forged, Err(DashboardError::NotMember)),
        "{forged:?}"
    );
    let u = seen(&deps, &s.cookie)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(u.merchant_id, b);

    // A second invitation to B, or one to her own first merchant: she is
    // there already.
    let again = invited(&deps, &b_owner, "owner@himal.np", Role::Owner).await;
    let r = accept(&deps, now, &again, PASSWORD, FROM).await;
    assert!(matches!(r, Err(AcceptError::AlreadyMember)), "{r:?}");
    let own = invited(&deps, &asha, "owner@himal.np", Role::Viewer).await;
    let r = accept(&deps, now, &own, PASSWORD, FROM).await;
    assert!(matches!(r, Err(AcceptError::AlreadyMember)), "{r:?}");
}

#[tokio::test]
async fn removing_a_membership_leaves_the_other_merchants() {
    let (deps, asha, _) = setup().await;
    let (b, b_owner) = merchant(&deps, "Other", "owner@other.np").await;
    let now = at("2026-11-26T10:00:00Z");
    let token = invited(&deps, &b_owner, "owner@himal.np", Role::Viewer).await;
    accept(&deps, now, &token, PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let on_a = sign_in(&deps, now, "owner@himal.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let on_b = sign_in(&deps, now, "owner@himal.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    switch_merchant(&deps, &on_b.cookie, &on_b.session, &b)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // B's owner changes her role there: A's role stays.
    let changed = change_user(
        &deps,
        &b,
        &asha.id,
        UserChange::Role(Role::Developer),
        |_| None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (changed.merchant_id.clone(), changed.role),
        (b.clone(), Role::Developer)
    );
    assert_eq!(
        seen(&deps, &on_b.cookie).await.map(|u| u.role),
        Ok(Role::Developer)
    );
    assert_eq!(
        seen(&deps, &on_a.cookie).await.map(|u| u.role),
        Ok(Role::Owner)
    );
    // Nor may B's owner set the password that opens A.
    let r = reset_password_of(&deps, &b, &asha.id, "a password from B's owner").await;
    assert!(matches!(r, Err(DashboardError::UnknownUser)), "{r:?}");

    // Removed from B: the session on B ends, the one on A goes on.
    let b_owner_session = sign_in(&deps, now, "owner@other.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let actor = audit::Actor::of(&b_owner, &b_owner_session.session, FROM);
    let entry = audit_entry(&actor, now, "person.remove", &asha.id, "");
    remove_member(&deps, &b, &asha.id, &entry)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen(&deps, &on_b.cookie).await.err(),
        Some(SessionEnd::Revoked)
    );
    assert_eq!(
        seen(&deps, &on_a.cookie).await.map(|u| u.merchant_id),
        Ok(asha.merchant_id.clone())
    );
    assert!(list_members(&deps, &b).await.unwrap_or_default().is_empty());
    let r = switch_merchant(&deps, &on_a.cookie, &on_a.session, &b).await;
    assert!(matches!(r, Err(DashboardError::NotMember)), "{r:?}");
    // Her first merchant is not a membership to remove; a second removal
    // finds none.
    let r = remove_member(&deps, &asha.merchant_id, &asha.id, &entry).await;
    assert!(matches!(r, Err(DashboardError::Invalid { .. })), "{r:?}");
    let r = remove_member(&deps, &b, &asha.id, &entry).await;
    assert!(matches!(r, Err(DashboardError::UnknownUser)), "{r:?}");
}

#[tokio::test]
async fn disabling_a_membership_signing_out_everywhere_and_a_new_password() {
    let (deps, asha, _) = setup().await;
    let (b, b_owner) = merchant(&deps, "Other", "owner@other.np").await;
    let now = at("2026-11-26T10:00:00Z");
    let token = invited(&deps, &b_owner, "owner@himal.np", Role::Owner).await;
    accept(&deps, now, &token, PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let s = sign_in(&deps, now, "owner@himal.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    switch_merchant(&deps, &s.cookie, &s.session, &b)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    change_user(&deps, &b, &asha.id, UserChange::Disabled(true), |_| None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen(&deps, &s.cookie).await.err(),
        Some(SessionEnd::Revoked)
    );
    // Her first merchant still signs her in, but B is not switchable.
    let s = sign_in(&deps, now, "owner@himal.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let r = switch_merchant(&deps, &s.cookie, &s.session, &b).await;
    assert!(matches!(r, Err(DashboardError::NotMember)), "{r:?}");
    change_user(&deps, &b, &asha.id, UserChange::Disabled(false), |_| None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    switch_merchant(&deps, &s.cookie, &s.session, &b)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Signing out everywhere ends the session whatever merchant it is on.
    let actor = audit::Actor::of(&asha, &s.session, FROM);
    let entry = audit_entry(&actor, now, "sign_out_everywhere", &asha.id, "");
    sign_out_everywhere(&deps, &asha.id, &entry)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen(&deps, &s.cookie).await.err(),
        Some(SessionEnd::Revoked)
    );
    // So does a new password.
    let s = sign_in(&deps, now, "owner@himal.np", PASSWORD, FROM)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    switch_merchant(&deps, &s.cookie, &s.session, &b)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    reset_password(&*deps.store, "owner@himal.np", "a brand new password")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen(&deps, &s.cookie).await.err(),
        Some(SessionEnd::Revoked)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_accepts_with_an_account_exactly_one_wins() {
    let now = at("2026-11-26T10:00:00Z");
    for round in 0..4 {
        let (deps, asha, _) = setup().await;
        let (b, b_owner) = merchant(&deps, "Other", "owner@other.np").await;
        // The same link twice.
        let token = invited(&deps, &b_owner, "owner@himal.np", Role::Viewer).await;
        let (x, y) = tokio::join!(
            accept(&deps, now, &token, PASSWORD, FROM),
            accept(&deps, now, &token, PASSWORD, FROM),
        );
        assert_eq!(
            [x.is_ok(), y.is_ok()].iter().filter(|w| **w).count(),
            1,
            "{round}: {x:?} {y:?}"
        );
        let lost = if x.is_ok() { y } else { x };
        assert!(
            matches!(
                lost,
                Err(AcceptError::Unusable | AcceptError::AlreadyMember)
            ),
            "{lost:?}"
        );
        // Two links to the same merchant at once: one membership.
        let (c, c_owner) = merchant(&deps, "Third", "owner@third.np").await;
        let one = invited(&deps, &c_owner, "owner@himal.np", Role::Viewer).await;
        let two = invited(&deps, &c_owner, "owner@himal.np", Role::Owner).await;
        let (x, y) = tokio::join!(
            accept(&deps, now, &one, PASSWORD, FROM),
            accept(&deps, now, &two, PASSWORD, FROM),
        );
        assert_eq!(
            [x.is_ok(), y.is_ok()].iter().filter(|w| **w).count(),
            1,
            "{x:?} {y:?}"
        );
        let lost = if x.is_ok() { y } else { x };
        assert!(matches!(lost, Err(AcceptError::AlreadyMember)), "{lost:?}");
        let merchants = member_merchants(&deps, &asha.id).await.unwrap_or_default();
        assert_eq!(merchants.len(), 3, "A, B and C once each");
        assert!(merchants.iter().any(|(m, _)| *m == b) && merchants.iter().any(|(m, _)| *m == c));
    }
}

#[test]
fn a_membership_is_stored_beside_its_user_and_listed_by_its_merchant() {
    use crate::domain::record::{Record, from_item};
    use crate::ids::UserId;
    let m = Membership {
        user_id: UserId::stored("usr_1"),
        merchant_id: MerchantId::stored("mer_1"),
        role: Role::Viewer,
        disabled: false,
        created_at: at("2026-11-26T10:00:00Z"),
    };
    let item = m.to_item().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(item.get("pk").and_then(|v| v.as_str()), Some("DUSER#usr_1"));
    assert_eq!(item.get("sk").and_then(|v| v.as_str()), Some("DMEM#mer_1"));
    assert_eq!(
        item.get("gsi1pk").and_then(|v| v.as_str()),
        Some("MER#mer_1#DMEM")
    );
    let back: Membership = from_item(item).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, m);
}
