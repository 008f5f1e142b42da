use std::sync::Arc;

use super::*;
use crate::AppState;
use crate::domain::billing::testenv::{deps_at, stores};
use crate::store::{Index, Store};
use crate::testenv::at;

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, "2026-01-10T06:00:00Z")
}

#[test]
fn intervals_are_1_to_10_ascending_days_of_1_to_365() {
    assert_eq!(validate("Standard", &[1, 3, 7]).unwrap(), vec![1, 3, 7]);
    assert_eq!(validate("One", &[365]).unwrap(), vec![365]);
    assert_eq!(
        validate("Ten", &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
            .unwrap()
            .len(),
        10
    );
    for bad in [
        vec![],
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        vec![0],
        vec![-1],
        vec![366],
        vec![3, 1],
        vec![2, 2],
        vec![i64::MAX],
    ] {
        let err = validate("x", &bad).unwrap_err();
        assert!(
            err.to_string().starts_with("retryIntervalsDays"),
            "{bad:?}: {err}"
        );
    }
    for bad in ["", "   ", &"n".repeat(101)] {
        let err = validate(bad, &[1]).unwrap_err();
        assert!(err.to_string().starts_with("name"), "{err}");
    }
}

#[test]
fn final_actions_are_spelled_as_the_api_spells_them() {
    let words: Vec<String> = FinalAction::ALL
        .iter()
        .map(|a| {
            serde_json::to_value(a)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(words, ["cancel", "pause", "mark_uncollectible"]);
}

/// Every policy of the tenant, and how many say they are the default.
async fn defaults(deps: &Deps, tenant: &Tenant) -> (Vec<DunningPolicy>, Option<DunningPolicyId>) {
    let (all, _) = list_policies(deps, tenant, Window::first(100))
        .await
        .unwrap();
    let pointer = default_policy(deps, tenant).await.unwrap();
    (all, pointer)
}

fn one_default(all: &[DunningPolicy], pointer: Option<&DunningPolicyId>, backend: &str) {
    let flagged: Vec<&DunningPolicyId> =
        all.iter().filter(|p| p.is_default).map(|p| &p.id).collect();
    assert_eq!(
        flagged.len(),
        1,
        "{backend}: one flagged default: {flagged:?}"
    );
    assert_eq!(
        Some(flagged[0]),
        pointer,
        "{backend}: the pointer and the flag agree"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_make_me_default_leave_exactly_one_default() {
    for (backend, store) in stores().await {
        let deps = deps_on(store);
        let tenant = Tenant::new("proj_dunning", Mode::Sandbox);
        let now = deps.clock.now();
        let mut ids = Vec::new();
        for i in 0..20 {
            let p = new_policy(
                &tenant,
                &format!("Policy {i}"),
                &[1, 3, 7],
                FinalAction::Cancel,
                now,
            )
            .unwrap();
            // The first is created as the default.
            create_policy(&deps, &p, i == 0).await.unwrap();
            ids.push(p.id);
        }
        let (all, pointer) = defaults(&deps, &tenant).await;
        one_default(&all, pointer.as_ref(), backend);
        let tasks: Vec<_> = ids
            .iter()
            .map(|id| {
                let deps = deps.clone();
                let tenant = tenant.clone();
                let id = id.clone();
                tokio::spawn(async move { set_default(&deps, &tenant, &id).await })
            })
            .collect();
        for t in futures::future::join_all(tasks).await {
            let p = t.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}"));
            assert_eq!(p.id.as_str().len(), "dpol_".len() + 26);
        }
        let (all, pointer) = defaults(&deps, &tenant).await;
        assert_eq!(all.len(), 20, "{backend}");
        one_default(&all, pointer.as_ref(), backend);

        // Twenty new policies created as the default at once: still one.
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let deps = deps.clone();
                let p = new_policy(
                    &tenant,
                    &format!("New {i}"),
                    &[2, 5],
                    FinalAction::Pause,
                    now,
                )
                .unwrap();
                tokio::spawn(async move { create_policy(&deps, &p, true).await })
            })
            .collect();
        for t in futures::future::join_all(tasks).await {
            t.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}"));
        }
        let (all, pointer) = defaults(&deps, &tenant).await;
        assert_eq!(all.len(), 40, "{backend}");
        one_default(&all, pointer.as_ref(), backend);
    }
}

#[tokio::test]
async fn policies_are_the_tenants_own_and_an_inactive_one_is_not_made_default() {
    let deps = deps_on(crate::testenv::memory_store());
    let tenant = Tenant::new("proj_a", Mode::Sandbox);
    let now = deps.clock.now();
    let p = new_policy(&tenant, "Mine", &[1], FinalAction::MarkUncollectible, now).unwrap();
    create_policy(&deps, &p, false).await.unwrap();
    assert_eq!(default_policy(&deps, &tenant).await.unwrap(), None);
    let other = Tenant::new("proj_b", Mode::Sandbox);
    assert!(matches!(
        get_policy(&deps, &other, &p.id).await,
        Err(DunningError::NotFound(_))
    ));
    assert!(matches!(
        set_default(&deps, &other, &p.id).await,
        Err(DunningError::NotFound(_))
    ));
    let live = Tenant::new("proj_a", Mode::Live);
    assert!(get_policy(&deps, &live, &p.id).await.is_err());
    // Deactivated behind our back: the conditioned flag refuses it.
    deps.store
        .update(
            &DunningPolicy::key(&p.id),
            Changes::<DunningPolicy>::new()
                .set(DunningPolicy::ACTIVE, &false)
                .into(),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(
        set_default(&deps, &tenant, &p.id).await,
        Err(DunningError::Conflict(_))
    ));
    assert_eq!(default_policy(&deps, &tenant).await.unwrap(), None);
    let _ = Index::Gsi1;
}

#[tokio::test]
async fn an_invoices_dunning_history_is_appended_without_losing_a_writer() {
    let deps = deps_on(crate::testenv::memory_store());
    let tenant = Tenant::new("proj_d", Mode::Sandbox);
    let invoice: BillingInvoiceId = "inv_1".into();
    let policy: DunningPolicyId = "dpol_1".into();
    let state = start_dunning(&deps, &tenant, &invoice, &policy)
        .await
        .unwrap();
    // A second start answers the state already there.
    let again = start_dunning(&deps, &tenant, &invoice, &"dpol_2".into())
        .await
        .unwrap();
    assert_eq!(again, state);
    let attempt = |channel| Attempt {
        at: at("2026-01-11T03:00:00Z"),
        kind: AttemptKind::Reminder,
        channel,
        outcome: AttemptOutcome::Logged,
        interval: Some(0),
        occurrence: None,
    };
    let one = append_attempt(&deps, &state, attempt(Channel::Sms))
        .await
        .unwrap();
    // A writer that read the old state loses and must re-read.
    assert!(matches!(
        append_attempt(&deps, &state, attempt(Channel::Email)).await,
        Err(DunningError::Conflict(_))
    ));
    let two = append_attempt(&deps, &one, attempt(Channel::Email))
        .await
        .unwrap();
    let stopped = set_dunning_status(&deps, &two, DunningStatus::Stopped)
        .await
        .unwrap();
    let read = dunning_state(&deps, &tenant, &invoice)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, stopped);
    assert_eq!(read.attempts.len(), 2);
    assert!(
        append_attempt(&deps, &read, attempt(Channel::Sms))
            .await
            .is_err()
    );
    let other = Tenant::new("proj_x", Mode::Sandbox);
    assert_eq!(dunning_state(&deps, &other, &invoice).await.unwrap(), None);
}
