use super::*;
use crate::AppState;
use crate::domain::Mode;
use crate::domain::billing::testenv::deps_at;

fn deps() -> AppState {
    deps_at(crate::testenv::memory_store(), "2026-01-10T06:00:00Z")
}

fn body(name: &str, default: bool) -> CreatePolicy {
    CreatePolicy {
        name: name.into(),
        retry_intervals_days: vec![1, 3, 7],
        final_action: None,
        is_default: Some(default),
    }
}

fn field_of(e: DunningError) -> Option<String> {
    Refusal::from(e).field
}

#[tokio::test]
async fn a_policy_is_checked_and_defaults_to_cancel() {
    let deps = deps();
    let tenant = Tenant::new("proj_dpol", Mode::Sandbox);
    let p = create(&deps, &tenant, body("Standard", false), None)
        .await
        .unwrap();
    assert_eq!(p.final_action, FinalAction::Cancel);
    assert!(!p.is_default && p.active);
    let mut bad = body("Bad", false);
    bad.final_action = Some("delete".into());
    let e = create(&deps, &tenant, bad, None).await.unwrap_err();
    assert_eq!(field_of(e).as_deref(), Some("finalAction"));
    let mut bad = body("Bad", false);
    bad.retry_intervals_days = vec![];
    let e = create(&deps, &tenant, bad, None).await.unwrap_err();
    assert_eq!(field_of(e).as_deref(), Some("retryIntervalsDays"));
    let e = update(
        &deps,
        &tenant,
        &p.id,
        UpdatePolicy {
            retry_intervals_days: Some(vec![1; 11]),
            ..UpdatePolicy::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(field_of(e).as_deref(), Some("retryIntervalsDays"));
    // Another project's id is not found.
    let other = Tenant::new("proj_other", Mode::Sandbox);
    let e = update(&deps, &other, &p.id, UpdatePolicy::default())
        .await
        .unwrap_err();
    assert_eq!(Refusal::from(e).code, "not_found");
}

#[tokio::test]
async fn the_default_moves_and_cannot_be_unset_or_deactivated() {
    let deps = deps();
    let tenant = Tenant::new("proj_ddef", Mode::Sandbox);
    let a = create(&deps, &tenant, body("A", true), None).await.unwrap();
    assert!(a.is_default);
    let b = create(&deps, &tenant, body("B", false), None)
        .await
        .unwrap();
    for refused in [
        UpdatePolicy {
            is_default: Some(false),
            ..UpdatePolicy::default()
        },
        UpdatePolicy {
            active: Some(false),
            ..UpdatePolicy::default()
        },
    ] {
        let e = update(&deps, &tenant, &a.id, refused).await.unwrap_err();
        assert_eq!(Refusal::from(e).code, STATE_CONFLICT);
    }
    let b = update(
        &deps,
        &tenant,
        &b.id,
        UpdatePolicy {
            is_default: Some(true),
            name: Some("B2".into()),
            final_action: Some("pause".into()),
            ..UpdatePolicy::default()
        },
    )
    .await
    .unwrap();
    assert!(b.is_default);
    assert_eq!(
        (b.name.as_str(), b.final_action),
        ("B2", FinalAction::Pause)
    );
    let a = dunning::get_policy(&deps, &tenant, &a.id).await.unwrap();
    assert!(!a.is_default, "the old default's flag is cleared");
    // Now A is not the default: it can be deactivated, and then not made
    // the default.
    let a = update(
        &deps,
        &tenant,
        &a.id,
        UpdatePolicy {
            active: Some(false),
            ..UpdatePolicy::default()
        },
    )
    .await
    .unwrap();
    assert!(!a.active);
    let e = update(
        &deps,
        &tenant,
        &a.id,
        UpdatePolicy {
            is_default: Some(true),
            ..UpdatePolicy::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(Refusal::from(e).code, STATE_CONFLICT);
    assert_eq!(
        dunning::default_policy(&deps, &tenant).await.unwrap(),
        Some(b.id)
    );
}
