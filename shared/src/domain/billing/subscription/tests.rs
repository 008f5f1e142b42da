use super::*;
use crate::domain::billing::dunning::FinalAction;
use crate::domain::billing::terms::{OverdueAction, monthly};
use crate::domain::billing::testenv::sub_input;
use crate::testenv::at;
use SubscriptionEvent as E;
use SubscriptionStatus as S;

/// The whole table, written out once more by hand: every allowed
/// (status, event) and where it lands. Anything not here is refused.
fn allowed() -> Vec<(S, E, S)> {
    let mut t = vec![
        (S::Draft, E::Start { trial: true }, S::Trialing),
        (S::Draft, E::Start { trial: false }, S::Incomplete),
        (S::Incomplete, E::FirstInvoicePaid, S::Active),
        (S::Trialing, E::TrialEnded, S::Active),
        (S::Trialing, E::TrialExtended, S::Trialing),
        (S::Active, E::Pause, S::Paused),
        (S::PastDue, E::Pause, S::Paused),
        (S::Paused, E::Resume, S::Active),
        (S::Paused, E::InvoicePaid { unpauses: true }, S::Active),
        (S::Paused, E::InvoicePaid { unpauses: false }, S::Paused),
    ];
    for unpauses in [true, false] {
        let e = E::InvoicePaid { unpauses };
        t.extend([
            (S::Active, e, S::Active),
            (S::PastDue, e, S::Active),
            (S::Cancelled, e, S::Cancelled),
            (S::Completed, e, S::Completed),
        ]);
    }
    for a in OverdueAction::ALL {
        t.push((S::Incomplete, E::GraceEndedUnpaid(a), S::IncompleteExpired));
    }
    t.extend([
        (
            S::Active,
            E::GraceEndedUnpaid(OverdueAction::KeepActive),
            S::Active,
        ),
        (
            S::Active,
            E::GraceEndedUnpaid(OverdueAction::MarkPastDue),
            S::PastDue,
        ),
        (
            S::Active,
            E::GraceEndedUnpaid(OverdueAction::Pause),
            S::Paused,
        ),
        (
            S::Active,
            E::GraceEndedUnpaid(OverdueAction::Cancel),
            S::Cancelled,
        ),
        (
            S::PastDue,
            E::GraceEndedUnpaid(OverdueAction::KeepActive),
            S::PastDue,
        ),
        (
            S::PastDue,
            E::GraceEndedUnpaid(OverdueAction::MarkPastDue),
            S::PastDue,
        ),
        (
            S::PastDue,
            E::GraceEndedUnpaid(OverdueAction::Pause),
            S::Paused,
        ),
        (
            S::PastDue,
            E::GraceEndedUnpaid(OverdueAction::Cancel),
            S::Cancelled,
        ),
        (
            S::Paused,
            E::GraceEndedUnpaid(OverdueAction::KeepActive),
            S::Paused,
        ),
        (
            S::Paused,
            E::GraceEndedUnpaid(OverdueAction::MarkPastDue),
            S::Paused,
        ),
        (
            S::Paused,
            E::GraceEndedUnpaid(OverdueAction::Pause),
            S::Paused,
        ),
        (
            S::Paused,
            E::GraceEndedUnpaid(OverdueAction::Cancel),
            S::Cancelled,
        ),
    ]);
    for from in [S::Active, S::PastDue, S::Paused] {
        t.extend([
            (from, E::DunningExhausted(FinalAction::Cancel), S::Cancelled),
            (from, E::DunningExhausted(FinalAction::Pause), S::Paused),
            (
                from,
                E::DunningExhausted(FinalAction::MarkUncollectible),
                from,
            ),
            (from, E::PeriodEndedCancelPending, S::Cancelled),
        ]);
    }
    t.push((S::Trialing, E::PeriodEndedCancelPending, S::Cancelled));
    for from in [S::Trialing, S::Active, S::PastDue] {
        t.push((from, E::CancelAtPeriodEnd, from));
    }
    for from in [
        S::Draft,
        S::Incomplete,
        S::Trialing,
        S::Active,
        S::PastDue,
        S::Paused,
    ] {
        t.push((from, E::CancelNow, S::Cancelled));
    }
    t
}

#[test]
fn the_state_machine_allows_exactly_its_table() {
    let table = allowed();
    let mut checked = 0;
    for from in S::ALL {
        for event in E::all() {
            let want = table
                .iter()
                .find(|(f, e, _)| *f == from && *e == event)
                .map(|(_, _, to)| *to);
            match (next(from, event), want) {
                (Ok(to), Some(w)) => assert_eq!(to, w, "{from:?} {event:?}"),
                (Err(r), None) => {
                    assert_eq!(r.code(), "subscription_state_conflict");
                    assert_eq!(r.from, from);
                    let msg = r.to_string();
                    assert!(msg.contains(from.as_str()), "{msg}");
                    assert!(msg.contains(event.action()), "{msg}");
                }
                (got, want) => panic!("{from:?} {event:?}: got {got:?}, the table says {want:?}"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 9 * 19);
    // No duplicate rows in the hand-written table.
    for (i, (f, e, _)) in table.iter().enumerate() {
        assert!(
            !table[..i].iter().any(|(g, d, _)| g == f && d == e),
            "{f:?} {e:?} twice"
        );
    }
}

#[test]
fn ended_subscriptions_refuse_every_change_but_a_late_payment() {
    for from in [S::IncompleteExpired, S::Cancelled, S::Completed] {
        assert!(from.is_ended());
        for event in E::all() {
            let late_payment =
                matches!(event, E::InvoicePaid { .. }) && from != S::IncompleteExpired;
            assert_eq!(
                next(from, event).is_ok(),
                late_payment,
                "{from:?} {event:?}"
            );
        }
    }
}

#[test]
fn a_refusal_names_the_status_and_the_action() {
    let r = next(S::Cancelled, E::Pause).unwrap_err();
    assert_eq!(
        r.to_string(),
        "a subscription that is cancelled cannot be paused"
    );
    let r = next(S::Active, E::TrialExtended).unwrap_err();
    assert_eq!(
        r.to_string(),
        "a subscription that is active cannot have its trial extended"
    );
}

#[test]
fn statuses_are_spelled_as_the_sdk_spells_them() {
    for s in S::ALL {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    let sdk =
        "incomplete incomplete_expired draft trialing active past_due paused cancelled completed";
    let ours: Vec<&str> = S::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(ours.join(" "), sdk);
}

fn input(start: &str, trial_ends_at: Option<&str>) -> NewSubscription {
    NewSubscription {
        trial_ends_at: trial_ends_at.map(at),
        ..sub_input(at(start), monthly())
    }
}

#[test]
fn a_new_subscription_starts_trials_or_waits_as_a_draft() {
    let tenant = Tenant::new("proj_1", Mode::Sandbox);
    let now = at("2026-01-10T06:00:00Z");
    let sub = new_subscription(&tenant, input("2026-01-10T06:00:00Z", None), now).unwrap();
    assert_eq!(sub.status, S::Incomplete);
    assert_eq!(sub.billing_start, Some(sub.start_date));
    let p = sub.current_period().unwrap();
    assert_eq!(p.start.to_string(), "2026-01-10");
    assert_eq!(p.end_exclusive.to_string(), "2026-02-10");

    let trial = new_subscription(
        &tenant,
        input("2026-01-10T06:00:00Z", Some("2026-01-24T06:00:00Z")),
        now,
    )
    .unwrap();
    assert_eq!(trial.status, S::Trialing);
    assert_eq!(trial.billing_start, None);

    let later = new_subscription(&tenant, input("2026-02-01T06:00:00Z", None), now).unwrap();
    assert_eq!(later.status, S::Draft);
}

#[test]
fn the_anchor_day_is_1_to_28() {
    let tenant = Tenant::new("proj_1", Mode::Sandbox);
    let now = at("2026-01-10T06:00:00Z");
    for (day, ok) in [(0, false), (1, true), (28, true), (29, false)] {
        let mut i = input("2026-01-10T06:00:00Z", None);
        i.billing_anchor_day = Some(day);
        let got = new_subscription(&tenant, i, now);
        assert_eq!(got.is_ok(), ok, "{day}");
        if !ok {
            assert!(
                got.unwrap_err().to_string().contains("billingAnchorDay"),
                "{day}"
            );
        }
    }
}

#[tokio::test]
async fn a_stored_subscription_moves_only_as_the_table_says() {
    let deps = crate::AppState::for_tests();
    let tenant = Tenant::new("proj_1", Mode::Sandbox);
    let now = at("2026-01-10T06:00:00Z");
    let sub = new_subscription(&tenant, input("2026-01-10T06:00:00Z", None), now).unwrap();
    create(&deps, &sub).await.unwrap();
    let other = Tenant::new("proj_2", Mode::Sandbox);
    assert!(matches!(
        get(&deps, &other, &sub.id).await,
        Err(SubscriptionError::NotFound(_))
    ));
    let err = apply(&deps, &tenant, &sub.id, E::Pause, &|_| {}, now)
        .await
        .unwrap_err();
    assert!(matches!(err, SubscriptionError::Refused(_)), "{err}");
    let paid = apply(&deps, &tenant, &sub.id, E::FirstInvoicePaid, &|_| {}, now)
        .await
        .unwrap();
    assert_eq!(paid.status, S::Active);
    let paused = apply(
        &deps,
        &tenant,
        &sub.id,
        E::Pause,
        &|s| s.pause_reason = Some("holiday".into()),
        now,
    )
    .await
    .unwrap();
    assert_eq!(paused.status, S::Paused);
    let read = get(&deps, &tenant, &sub.id).await.unwrap();
    assert_eq!(read, paused);
    assert_eq!(read.version, 3);
    assert_eq!(read.pause_reason.as_deref(), Some("holiday"));
}
