use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::AppState;
use crate::domain::billing::invoice::{InvoiceStatus, LineKind, issue_invoice};
use crate::domain::billing::items::{self, CreateItem, ItemStatus};
use crate::domain::billing::terms::{PricingModel, Terms, monthly};
use crate::domain::billing::testenv::{deps_at, deps_with, stores};
use crate::domain::billing::testenv::{stored_sub, sub_input};
use crate::store::Store;
use crate::testenv::at;
use crate::time::{Clock, ManualClock};

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, "2026-01-10T06:00:00Z")
}

/// A subscription billing from 2026-01-10 (period 0: to 2026-02-10).
pub(crate) async fn subscription(deps: &Deps, project: &str) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    stored_sub(
        deps,
        &tenant,
        sub_input(at("2026-01-10T06:00:00Z"), metered()),
    )
    .await
}

/// A monthly plan at Rs 0.10 a unit of usage.
pub(crate) fn metered() -> Terms {
    Terms {
        amount: 10,
        description: "API calls".into(),
        pricing_model: PricingModel::Metered,
        ..monthly()
    }
}

fn body(v: serde_json::Value) -> ReportUsage {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

fn field_of(e: BillingError) -> String {
    Refusal::from(e).field.unwrap_or_default()
}

fn event(q: u64, action: UsageAction, ts: &str, key: Option<&str>) -> UsageEvent {
    UsageEvent {
        quantity: q,
        action,
        timestamp: Some(at(ts)),
        idempotency_key: key.map(str::to_owned),
    }
}

#[test]
fn bad_events_name_their_field_and_refuse_the_batch() {
    for (v, field) in [
        (json!({"quantity": -1}), "quantity"),
        (json!({"quantity": 1.5}), "quantity"),
        (json!({"quantity": "3"}), "quantity"),
        (json!({}), "quantity"),
        (json!({"quantity": 1_000_000_001u64}), "quantity"),
        (json!({"quantity": 1, "action": "decrement"}), "action"),
        (json!({"quantity": 1, "action": 1}), "action"),
        (
            json!({"quantity": 1, "timestamp": "yesterday"}),
            "timestamp",
        ),
        (json!({"quantity": 1, "timestamp": true}), "timestamp"),
        (
            json!({"quantity": 1, "timestamp": 1_767_000_000}),
            "timestamp",
        ),
        (
            json!({"quantity": 1, "idempotency_key": ""}),
            "idempotency_key",
        ),
        // Refused, not trimmed: " k1 " and "k1" would be one key.
        (
            json!({"quantity": 1, "idempotency_key": " k1 "}),
            "idempotency_key",
        ),
        (
            json!({"events": [{"quantity": 1, "idempotencyKey": "k1\t"}]}),
            "events[0].idempotency_key",
        ),
        (json!({"quantity": 1, "events": []}), "events"),
        (json!({"events": []}), "events"),
        (
            json!({"events": [{"quantity": 1}, {"quantity": 2}, {"quantity": -2}]}),
            "events[2].quantity",
        ),
        (
            json!({"events": [{"quantity": 1, "action": "x"}]}),
            "events[0].action",
        ),
        (json!({"events": [5]}), "events[0]"),
        (
            json!({"events": [{"quantity": 1, "bogus": 1}]}),
            "events[0]",
        ),
    ] {
        match events_of(body(v.clone())) {
            Err(e) => assert_eq!(field_of(e), field, "{v}"),
            Ok(got) => panic!("accepted {v}: {got:?}"),
        }
    }
    let too_many: Vec<serde_json::Value> =
        (0..=MAX_BATCH).map(|_| json!({"quantity": 1})).collect();
    assert!(events_of(body(json!({ "events": too_many }))).is_err());
    let (one, batch) = events_of(body(json!({
        "quantity": 0, "action": "set", "timestamp": "2025-12-29T09:20:00Z", "idempotencyKey": "k1"
    })))
    .unwrap();
    assert!(!batch);
    assert_eq!(one[0].quantity, 0);
    assert_eq!(one[0].action, UsageAction::Set);
    assert_eq!(one[0].idempotency_key.as_deref(), Some("k1"));
    assert_eq!(
        one[0].timestamp,
        Timestamp::from_unix_millis(1_767_000_000_000)
    );
    let (default, _) = events_of(body(json!({"quantity": 7, "idempotency_key": "a"}))).unwrap();
    assert_eq!(default[0].action, UsageAction::Increment);
    assert_eq!(default[0].timestamp, None);
}

fn rec(id: &str, q: u64, action: UsageAction, ts: &str) -> UsageRecord {
    let t = at(ts);
    UsageRecord {
        id: UsageRecordId::stored(id.to_owned()),
        subscription_id: "sub_1".into(),
        project_id: ProjectId::stored("p1"),
        mode: Mode::Sandbox,
        quantity: q,
        action,
        timestamp: t,
        day: nepal_day(t),
        idempotency_key: None,
        created_at: t,
    }
}

#[test]
fn set_makes_the_total_as_of_its_timestamp_and_later_increments_add() {
    use UsageAction::{Increment as I, Set as S};
    // Listed out of time order: the rule follows timestamps.
    let records = vec![
        rec("ur_4", 3, I, "2026-01-10T10:00:00Z"),
        rec("ur_2", 10, S, "2026-01-10T08:00:00Z"),
        rec("ur_1", 5, I, "2026-01-10T07:00:00Z"),
        rec("ur_3", 2, I, "2026-01-10T07:30:00Z"),
    ];
    // 5 + 2, then set 10, then + 3.
    assert_eq!(period_total(&records), Some(13));
    let later_set = [
        records.clone(),
        vec![rec("ur_5", 4, S, "2026-01-10T11:00:00Z")],
    ]
    .concat();
    assert_eq!(
        period_total(&later_set),
        Some(4),
        "the last set by timestamp wins"
    );
    let earlier_set = [
        records.clone(),
        vec![rec("ur_0", 100, S, "2026-01-10T06:00:00Z")],
    ]
    .concat();
    assert_eq!(
        period_total(&earlier_set),
        Some(13),
        "a set before others is replaced"
    );
    // Same timestamp: ties by id.
    let tie = vec![
        rec("ur_b", 1, I, "2026-01-10T07:00:00Z"),
        rec("ur_a", 50, S, "2026-01-10T07:00:00Z"),
    ];
    assert_eq!(period_total(&tie), Some(51));
    assert_eq!(period_total(&[]), Some(0));
    assert_eq!(
        period_total(&[rec("ur_z", 0, S, "2026-01-10T07:00:00Z")]),
        Some(0)
    );
}

#[tokio::test]
async fn a_set_resets_only_its_own_period() {
    use UsageAction::{Increment as I, Set as S};
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let records = vec![
        rec("ur_1", 5, I, "2026-01-20T07:00:00Z"),
        rec("ur_2", 7, S, "2026-02-11T07:00:00Z"),
        rec("ur_3", 1, I, "2026-02-12T07:00:00Z"),
    ];
    assert_eq!(total_by_period(&sub, &records), Some(5 + 7 + 1));
}

#[tokio::test]
async fn events_are_recorded_and_a_key_counts_once() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let tenant = sub.tenant();
    let first = report(
        &deps,
        &tenant,
        &sub.id,
        vec![event(
            3,
            UsageAction::Increment,
            "2026-01-10T06:00:00Z",
            Some("e1"),
        )],
    )
    .await
    .unwrap();
    let Outcome::Created(r1) = &first[0] else {
        panic!("{first:?}")
    };
    let again = report(
        &deps,
        &tenant,
        &sub.id,
        vec![event(
            9,
            UsageAction::Increment,
            "2026-01-10T06:00:00Z",
            Some("e1"),
        )],
    )
    .await
    .unwrap();
    assert_eq!(
        again,
        vec![Outcome::Duplicate(r1.clone())],
        "the first record answers"
    );
    // A batch: a new key twice, a seen key, and no key.
    let batch = report(
        &deps,
        &tenant,
        &sub.id,
        vec![
            event(
                1,
                UsageAction::Increment,
                "2026-01-10T05:00:00Z",
                Some("e2"),
            ),
            event(
                1,
                UsageAction::Increment,
                "2026-01-10T05:00:00Z",
                Some("e2"),
            ),
            event(
                4,
                UsageAction::Increment,
                "2026-01-10T05:00:00Z",
                Some("e1"),
            ),
            event(2, UsageAction::Increment, "2026-01-10T05:30:00Z", None),
        ],
    )
    .await
    .unwrap();
    assert!(matches!(batch[0], Outcome::Created(_)));
    assert!(
        matches!(&batch[1], Outcome::Duplicate(r) if Some(r) == match &batch[0] { Outcome::Created(r) => Some(r), _ => None })
    );
    assert_eq!(batch[2], Outcome::Duplicate(r1.clone()));
    assert!(matches!(batch[3], Outcome::Created(_)));
    let summary = summary(&deps, &tenant, &sub.id).await.unwrap();
    assert_eq!(summary.quantity, 3 + 1 + 2);
    assert_eq!(summary.record_count, 3);
    assert_eq!(
        summary.period_start,
        Some(NaiveDate::from_ymd_opt(2026, 1, 10).unwrap())
    );
    assert_eq!(summary.amount, 6 * sub.terms.amount);
    let (listed, more) = list_records(&deps, &tenant, &sub.id, 2).await.unwrap();
    assert!(more);
    assert_eq!(listed[0].id, r1.id, "newest by timestamp first");
    // Another tenant sees nothing.
    let other = Tenant::new("p2", Mode::Sandbox);
    assert!(
        report(
            &deps,
            &other,
            &sub.id,
            vec![event(
                1,
                UsageAction::Increment,
                "2026-01-10T06:00:00Z",
                None
            )]
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn a_timestamp_must_be_in_an_open_period() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let tenant = sub.tenant();
    for ts in ["2026-01-10T06:06:00Z", "2026-01-09T12:00:00Z"] {
        let got = report(
            &deps,
            &tenant,
            &sub.id,
            vec![event(1, UsageAction::Increment, ts, None)],
        )
        .await;
        let Err(e) = got else { panic!("{ts} accepted") };
        let r = Refusal::from(e);
        assert_eq!(
            (r.code, r.field.as_deref()),
            ("validation_failed", Some("timestamp")),
            "{ts}"
        );
    }
    // A batch of one names its event, as a longer batch does.
    let one = vec![event(
        1,
        UsageAction::Increment,
        "2026-01-10T06:06:00Z",
        None,
    )];
    let Err(e) = report_as(&deps, &tenant, &sub.id, one, true).await else {
        panic!("a batch of one in the future accepted")
    };
    assert_eq!(
        Refusal::from(e).field.as_deref(),
        Some("events[0].timestamp")
    );
    // Within the skew, and with no timestamp (now).
    let ok = report(
        &deps,
        &tenant,
        &sub.id,
        vec![
            event(1, UsageAction::Increment, "2026-01-10T06:04:00Z", None),
            UsageEvent {
                quantity: 1,
                action: UsageAction::Increment,
                timestamp: None,
                idempotency_key: None,
            },
        ],
    )
    .await
    .unwrap();
    assert!(ok.iter().all(|o| matches!(o, Outcome::Created(_))));
    // Sealed through the 11th: the 10th is closed, named by its period.
    let sealed = seal(
        &deps,
        &sub.id,
        NaiveDate::from_ymd_opt(2026, 1, 11).unwrap(),
        at("2026-01-10T07:00:00Z"),
    )
    .await
    .unwrap();
    assert_eq!(
        sealed,
        Some(Sealed {
            from: None,
            to: NaiveDate::from_ymd_opt(2026, 1, 11).unwrap()
        })
    );
    let refused = report(
        &deps,
        &tenant,
        &sub.id,
        vec![event(
            1,
            UsageAction::Increment,
            "2026-01-10T06:00:00Z",
            None,
        )],
    )
    .await
    .unwrap();
    let jan10 = NaiveDate::from_ymd_opt(2026, 1, 10).unwrap();
    let feb10 = NaiveDate::from_ymd_opt(2026, 2, 10).unwrap();
    assert_eq!(
        refused,
        vec![Outcome::Closed {
            start: jan10,
            end: feb10
        }]
    );
    let r = Refusal::from(UsageError::PeriodClosed {
        start: jan10,
        end: feb10,
    });
    assert_eq!(r.code, "usage_period_closed");
    assert!(
        r.message.contains("2026-01-10 to 2026-02-10"),
        "{}",
        r.message
    );
}

#[tokio::test]
async fn a_seal_closes_once_and_answers_the_same_days_again() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let d = |m, day| NaiveDate::from_ymd_opt(2026, m, day).unwrap();
    let now = at("2026-02-10T00:00:00Z");
    let first = Sealed {
        from: None,
        to: d(2, 10),
    };
    assert_eq!(
        seal(&deps, &sub.id, d(2, 10), now).await.unwrap(),
        Some(first)
    );
    assert_eq!(
        seal(&deps, &sub.id, d(2, 10), now).await.unwrap(),
        Some(first),
        "a retried issue"
    );
    let second = Sealed {
        from: Some(d(2, 10)),
        to: d(3, 10),
    };
    assert_eq!(
        seal(&deps, &sub.id, d(3, 10), now).await.unwrap(),
        Some(second)
    );
    assert_eq!(
        seal(&deps, &sub.id, d(3, 10), now).await.unwrap(),
        Some(second)
    );
    assert_eq!(
        seal(&deps, &sub.id, d(2, 10), now).await.unwrap(),
        None,
        "billed already"
    );
}

/// Events race the seal on both backends: every event is either recorded
/// before the seal, and in the issuer's read after it, or refused; none
/// is lost or counted later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_racing_the_seal_are_counted_once_or_refused() {
    for (name, store) in stores().await {
        let deps = deps_on(store);
        let sub = subscription(&deps, "p1").await;
        let tenant = sub.tenant();
        let through = NaiveDate::from_ymd_opt(2026, 1, 11).unwrap();
        // Each writer reports batches of 5 until its events are refused.
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (deps, tenant, id) = (deps.clone(), tenant.clone(), sub.id.clone());
                tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    for i in 0..400 {
                        let events = (0..5)
                            .map(|j| {
                                let key = format!("w{w}-{i}-{j}");
                                event(
                                    1,
                                    UsageAction::Increment,
                                    "2026-01-10T06:00:00Z",
                                    Some(&key),
                                )
                            })
                            .collect();
                        let got = report(&deps, &tenant, &id, events)
                            .await
                            .unwrap_or_else(|e| panic!("{e}"));
                        let refused = got.iter().any(|o| matches!(o, Outcome::Closed { .. }));
                        outcomes.extend(got);
                        if refused {
                            break;
                        }
                    }
                    outcomes
                })
            })
            .collect();
        // Seal once some events are in, while the writers go on.
        while records_between(&deps, &sub.id, None, through)
            .await
            .unwrap()
            .len()
            < 40
        {
            tokio::task::yield_now().await;
        }
        let sealed = seal(&deps, &sub.id, through, at("2026-01-10T06:00:00Z"))
            .await
            .unwrap()
            .unwrap();
        let read = records_between(&deps, &sub.id, sealed.from, sealed.to)
            .await
            .unwrap();
        let mut created = Vec::new();
        let mut closed = 0;
        for w in writers {
            for o in w.await.unwrap() {
                match o {
                    Outcome::Created(r) => created.push(r.id),
                    Outcome::Closed { .. } => closed += 1,
                    Outcome::Duplicate(r) => panic!("{name}: no key repeats: {r:?}"),
                }
            }
        }
        let mut read_ids: Vec<_> = read.iter().map(|r| r.id.clone()).collect();
        read_ids.sort();
        created.sort();
        assert!(
            created.len() >= 40 && closed >= 8,
            "{name}: {} created, {closed} refused",
            created.len()
        );
        assert_eq!(
            read_ids, created,
            "{name}: the issuer reads exactly what was recorded"
        );
        let after = records_between(&deps, &sub.id, None, through)
            .await
            .unwrap();
        assert_eq!(
            after.len(),
            read.len(),
            "{name}: nothing lands after the seal"
        );
    }
}

fn item_body(amount: i64, description: &str) -> CreateItem {
    serde_json::from_value(json!({"amount": amount, "description": description}))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Usage is billed in arrears on the next period's invoice, with a line
/// naming its own period; pending items go on the next invoice once.
#[tokio::test]
async fn an_invoice_bills_the_last_periods_usage_and_the_pending_items_once() {
    use UsageAction::{Increment as I, Set as S};
    let clock = Arc::new(ManualClock::new(at("2026-01-10T06:00:00Z")));
    let deps = deps_with(crate::testenv::memory_store(), clock.clone());
    let sub = subscription(&deps, "p1").await;
    let t = sub.tenant();
    let setup = items::create(&deps, &t, &sub.id, item_body(150_000, "Installation"), None)
        .await
        .unwrap();
    let p0 = sub.period(0).unwrap();
    let first = issue_invoice(&deps, &sub, p0, clock.now())
        .await
        .unwrap()
        .invoice;
    let kinds: Vec<LineKind> = first.lines.iter().map(|l| l.kind).collect();
    assert_eq!(
        kinds,
        vec![LineKind::Item],
        "no usage yet, no flat line: {:?}",
        first.lines
    );
    assert_eq!(first.amount_due, 150_000);
    assert_eq!(first.status, InvoiceStatus::Open);
    let taken = items::all(&deps, &sub.id, 10).await.unwrap();
    assert_eq!(taken[0].status, ItemStatus::Invoiced);
    assert_eq!(taken[0].invoice_id.as_ref(), Some(&first.id));
    assert!(
        items::list_pending(&deps, &t, &sub.id)
            .await
            .unwrap()
            .is_empty()
    );
    // Period 0's usage: 100, then set to 40, then 2 more.
    clock.advance(chrono::Duration::days(20));
    let got = report(
        &deps,
        &t,
        &sub.id,
        vec![
            event(100, I, "2026-01-12T06:00:00Z", None),
            event(40, S, "2026-01-20T06:00:00Z", None),
            event(2, I, "2026-01-25T06:00:00Z", None),
        ],
    )
    .await
    .unwrap();
    assert!(got.iter().all(|o| matches!(o, Outcome::Created(_))));
    let cable = items::create(&deps, &t, &sub.id, item_body(2_500, "Cable"), None)
        .await
        .unwrap();
    clock.advance(chrono::Duration::days(12));
    let p1 = sub.period(1).unwrap();
    let second = issue_invoice(&deps, &sub, p1, clock.now())
        .await
        .unwrap()
        .invoice;
    let usage = second
        .lines
        .iter()
        .find(|l| l.kind == LineKind::Usage)
        .unwrap_or_else(|| panic!("{:?}", second.lines));
    assert_eq!((usage.quantity, usage.amount), (42, 420));
    assert_eq!(
        (usage.period_start, usage.period_end),
        (p0.start, p0.end_exclusive),
        "the usage line names its own period"
    );
    let item_lines: Vec<_> = second
        .lines
        .iter()
        .filter(|l| l.kind == LineKind::Item)
        .collect();
    assert_eq!(item_lines.len(), 1, "the installation is not billed again");
    assert_eq!(item_lines[0].description, cable.description);
    assert_eq!(second.subtotal, 420 + 2_500);
    assert_ne!(setup.id, cable.id);
    // Period 0 is closed now; period 1 is open.
    let late = report(
        &deps,
        &t,
        &sub.id,
        vec![event(1, I, "2026-02-01T06:00:00Z", None)],
    )
    .await
    .unwrap();
    assert_eq!(
        late,
        vec![Outcome::Closed {
            start: p0.start,
            end: p0.end_exclusive
        }]
    );
    let ok = report(
        &deps,
        &t,
        &sub.id,
        vec![event(1, I, "2026-02-10T06:00:00Z", None)],
    )
    .await
    .unwrap();
    assert!(matches!(ok[0], Outcome::Created(_)));
    // Issued again (a retried sweep): the same invoice.
    let again = issue_invoice(&deps, &sub, p1, clock.now()).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.invoice.id, second.id);
}

/// An invoice issued while its item is deleted, on both backends: the
/// item is on the invoice and not deleted, or deleted and not on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_item_deleted_while_the_invoice_is_issued_is_on_exactly_one_side() {
    for (name, store) in stores().await {
        let deps = deps_on(store);
        let mut outcomes = (0, 0);
        for round in 0..12 {
            let sub = subscription(&deps, &format!("p{round}")).await;
            let t = sub.tenant();
            let item = items::create(&deps, &t, &sub.id, item_body(900, "Visit"), None)
                .await
                .unwrap();
            let (d2, t2, s2, i2) = (deps.clone(), t.clone(), sub.id.clone(), item.id.clone());
            let deleting = tokio::spawn(async move { items::delete(&d2, &t2, &s2, &i2).await });
            let p0 = sub.period(0).unwrap();
            let invoice = issue_invoice(&deps, &sub, p0, deps.clock.now())
                .await
                .unwrap()
                .invoice;
            let deleted = deleting.await.unwrap();
            let on_invoice = invoice.lines.iter().any(|l| l.kind == LineKind::Item);
            let left = items::all(&deps, &sub.id, 10).await.unwrap();
            match (on_invoice, deleted) {
                (true, Err(e)) => {
                    assert_eq!(Refusal::from(e).code, "invoice_item_invoiced", "{name}");
                    assert_eq!(left[0].invoice_id.as_ref(), Some(&invoice.id), "{name}");
                    outcomes.0 += 1;
                }
                (false, Ok(())) => {
                    assert!(left.is_empty(), "{name}");
                    assert_eq!(invoice.amount_due, 0, "{name}");
                    outcomes.1 += 1;
                }
                (on, d) => panic!("{name}: round {round}: on the invoice {on}, delete {d:?}"),
            }
            assert_eq!(
                items::pending_count(&deps, &sub.id).await.unwrap(),
                0,
                "{name}: round {round}: the item left the count once"
            );
        }
        assert_eq!(outcomes.0 + outcomes.1, 12, "{name}");
    }
}

/// On a test clock, whose time moves in jumps, a timestamp anywhere in
/// the current period is taken; past its end it is still refused.
#[tokio::test]
async fn on_a_test_clock_the_whole_current_period_is_open() {
    let deps = deps_on(crate::testenv::memory_store());
    let tenant = Tenant::new("p1", Mode::Sandbox);
    let now = at("2026-01-10T06:00:00Z");
    let clock = test_clock::create(&deps, &tenant, "walk", now, now)
        .await
        .unwrap();
    let mut sub = subscription(&deps, "p1").await;
    sub.test_clock_id = Some(clock.id);
    deps.store.put(sub.to_item().unwrap(), None).await.unwrap();
    let ahead = report(
        &deps,
        &tenant,
        &sub.id,
        vec![event(
            5,
            UsageAction::Increment,
            "2026-01-20T06:00:00Z",
            None,
        )],
    )
    .await
    .unwrap();
    assert!(matches!(ahead[0], Outcome::Created(_)), "{ahead:?}");
    let past_period = report(
        &deps,
        &tenant,
        &sub.id,
        vec![event(
            5,
            UsageAction::Increment,
            "2026-02-11T06:00:00Z",
            None,
        )],
    )
    .await;
    let Err(e) = past_period else {
        panic!("took the next period's usage")
    };
    assert_eq!(Refusal::from(e).field.as_deref(), Some("timestamp"));
}

/// Totals near `u64::MAX` are checked, never clamped: an overflow is
/// `None`, and a later `set` in the same period makes it exact again.
#[tokio::test]
async fn a_total_past_u64_max_is_no_number_not_a_clamped_one() {
    use UsageAction::{Increment as I, Set as S};
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let half = u64::MAX / 2 + 1;
    let over = vec![
        rec("ur_1", half, I, "2026-01-20T07:00:00Z"),
        rec("ur_2", half, I, "2026-01-20T08:00:00Z"),
    ];
    assert_eq!(period_total(&over), None);
    assert_eq!(total_by_period(&sub, &over), None);
    let edge = vec![
        rec("ur_1", half, I, "2026-01-20T07:00:00Z"),
        rec("ur_2", half - 1, I, "2026-01-20T08:00:00Z"),
    ];
    assert_eq!(period_total(&edge), Some(u64::MAX));
    let reset = [
        over.clone(),
        vec![rec("ur_3", 7, S, "2026-01-20T09:00:00Z")],
    ]
    .concat();
    assert_eq!(period_total(&reset), Some(7), "a set replaces the overflow");
    // Two periods each at the edge: their sum overflows.
    let two = vec![
        rec("ur_1", u64::MAX, S, "2026-01-20T07:00:00Z"),
        rec("ur_2", 1, I, "2026-02-11T07:00:00Z"),
    ];
    assert_eq!(total_by_period(&sub, &two), None);
    // MAX_QUANTITY events up to the largest u64 multiple.
    let n = u64::MAX / MAX_QUANTITY;
    let mut tally = Tally::default();
    for i in 0..3 {
        tally.add(
            &sub,
            &rec(&format!("ur_{i}"), MAX_QUANTITY, I, "2026-01-20T07:00:00Z"),
        );
    }
    assert_eq!(tally.total(), Some(3 * MAX_QUANTITY));
    let mut big = rec("ur_x", (n - 3) * MAX_QUANTITY, I, "2026-01-20T08:00:00Z");
    tally.add(&sub, &big);
    assert_eq!(tally.total(), Some(n * MAX_QUANTITY));
    big.id = UsageRecordId::stored("ur_y".to_owned());
    big.quantity = MAX_QUANTITY;
    tally.add(&sub, &big);
    assert_eq!(tally.total(), None, "one more MAX_QUANTITY event overflows");
}

/// A line holds a u64 quantity and an i64 amount: an amount past i64 is
/// an overflow, never a clamped number; free units never overflow.
#[test]
fn priced_usage_is_checked_at_the_edges() {
    let lim = u64::from(u32::MAX);
    assert_eq!(priced(lim, 1), Ok((lim, i64::from(u32::MAX))));
    assert_eq!(priced(lim + 1, 1), Ok((lim + 1, i64::from(u32::MAX) + 1)));
    assert_eq!(priced(u64::MAX, 0), Ok((u64::MAX, 0)));
    let big = i64::MAX as u64;
    assert_eq!(priced(big, 1), Ok((big, i64::MAX)));
    assert!(priced(big + 1, 1).is_err());
    assert!(priced(u64::MAX, 1).is_err());
    assert!(priced(2, i64::MIN).is_err());
    let unit = i64::MAX / 1_000_000_000;
    assert_eq!(
        priced(MAX_QUANTITY, unit),
        Ok((1_000_000_000, unit * 1_000_000_000))
    );
    let e = priced(MAX_QUANTITY, unit + 1).unwrap_err();
    assert_eq!(e.quantity, Some(MAX_QUANTITY));
    assert!(e.to_string().contains("1000000000 units"), "{e}");
    assert_eq!(priced(0, i64::MAX), Ok((0, 0)));
    let (q, a) = priced(lim, i64::MAX / lim as i64).unwrap();
    assert_eq!((q, a), (lim, (i64::MAX / lim as i64) * lim as i64));
    assert!(priced(lim, i64::MAX / lim as i64 + 1).is_err());
}

/// A metered plan at Rs 10 crore a unit and one event of MAX_QUANTITY:
/// the amount passes i64::MAX; the summary says so (409), it does not
/// show a clamped amount.
#[tokio::test]
async fn a_summary_whose_amount_overflows_is_refused_not_clamped() {
    let deps = deps_on(crate::testenv::memory_store());
    let tenant = Tenant::new("p1", Mode::Sandbox);
    let terms = Terms {
        amount: 10_000_000_000,
        ..metered()
    };
    let sub = stored_sub(&deps, &tenant, sub_input(at("2026-01-10T06:00:00Z"), terms)).await;
    let ev = |q| {
        vec![event(
            q,
            UsageAction::Increment,
            "2026-01-10T06:00:00Z",
            None,
        )]
    };
    report(&deps, &tenant, &sub.id, ev(922)).await.unwrap();
    let fits = summary(&deps, &tenant, &sub.id).await.unwrap();
    assert_eq!(fits.amount, 922 * 10_000_000_000);
    report(&deps, &tenant, &sub.id, ev(MAX_QUANTITY))
        .await
        .unwrap();
    let Err(e) = summary(&deps, &tenant, &sub.id).await else {
        panic!("an amount past i64::MAX answered")
    };
    let r = Refusal::from(e);
    assert_eq!(r.code, "usage_overflow", "{}", r.message);
    assert!(r.message.contains("1000000922 units"), "{}", r.message);
}

/// A metered subscription at `unit` paisa a unit, its first invoice
/// issued, `n` events of MAX_QUANTITY reported in its first period, and
/// the clock moved to its second period: the deps, the subscription and
/// that period.
async fn max_usage_at(unit: i64, n: usize) -> (AppState, Arc<ManualClock>, Subscription, Period) {
    let clock = Arc::new(ManualClock::new(at("2026-01-10T06:00:00Z")));
    let deps = deps_with(crate::testenv::memory_store(), clock.clone());
    let terms = Terms {
        amount: unit,
        ..metered()
    };
    let tenant = Tenant::new("p1", Mode::Sandbox);
    let sub = stored_sub(&deps, &tenant, sub_input(at("2026-01-10T06:00:00Z"), terms)).await;
    let p0 = sub.period(0).unwrap();
    issue_invoice(&deps, &sub, p0, clock.now()).await.unwrap();
    clock.advance(chrono::Duration::days(5));
    let events = (0..n)
        .map(|_| {
            event(
                MAX_QUANTITY,
                UsageAction::Increment,
                "2026-01-15T06:00:00Z",
                None,
            )
        })
        .collect();
    report(&deps, &sub.tenant(), &sub.id, events).await.unwrap();
    clock.advance(chrono::Duration::days(27));
    let p1 = sub.period(1).unwrap();
    (deps, clock, sub, p1)
}

/// Usage whose amount passes what an invoice line holds (one
/// MAX_QUANTITY event at Rs 10 crore a unit: past i64::MAX paisa) fails
/// the invoice: nothing is issued, the period is not claimed, and a
/// retry fails the same way.
#[tokio::test]
async fn an_invoice_whose_usage_overflows_fails_and_issues_nothing() {
    let (deps, clock, sub, p1) = max_usage_at(10_000_000_000, 1).await;
    for _ in 0..2 {
        let got = issue_invoice(&deps, &sub, p1, clock.now()).await;
        assert!(matches!(got, Err(BillingInvoiceError::Overflow)), "{got:?}");
        let claim = record::get::<crate::domain::billing::invoice::PeriodClaim>(
            &*deps.store,
            &crate::domain::billing::invoice::PeriodClaim::key(&sub.id, p1.start),
        )
        .await
        .unwrap();
        assert!(claim.is_none(), "no invoice for the period");
    }
}

/// A period's usage past u32::MAX units (five MAX_QUANTITY events at
/// Rs 0.10) is billed whole: the line holds a u64 quantity, the amount
/// is exact.
#[tokio::test]
async fn an_invoice_bills_more_units_than_u32_holds() {
    let (deps, clock, sub, p1) = max_usage_at(metered().amount, 5).await;
    let second = issue_invoice(&deps, &sub, p1, clock.now())
        .await
        .unwrap()
        .invoice;
    let usage = second
        .lines
        .iter()
        .find(|l| l.kind == LineKind::Usage)
        .unwrap_or_else(|| panic!("{:?}", second.lines));
    assert_eq!(
        (usage.quantity, usage.amount),
        (
            5 * MAX_QUANTITY,
            10 * 5 * i64::try_from(MAX_QUANTITY).unwrap()
        )
    );
    assert!(usage.quantity > u64::from(u32::MAX));
}

/// A period of more records than one page (with sets across page
/// boundaries) is counted exactly by the paged tally, every query asking
/// for at most a page; a cap stops the count and says so.
#[tokio::test]
async fn a_period_is_counted_page_by_page_exactly() {
    use UsageAction::{Increment as I, Set as S};
    let counting = Arc::new(crate::store::counting::CountingStore::new(
        crate::testenv::memory_store(),
    ));
    let clock = Arc::new(ManualClock::new(at("2026-01-25T06:00:00Z")));
    let deps = deps_with(counting.clone(), clock);
    let sub = subscription(&deps, "p1").await;
    let t = sub.tenant();
    let n = 2 * READ_PAGE + 345;
    let mut events = Vec::with_capacity(n);
    for i in 0..n {
        let ts = Timestamp::parse("2026-01-10T06:00:00Z")
            .unwrap()
            .plus(Duration::seconds(i as i64 * 60));
        let action = if i % 997 == 500 { S } else { I };
        events.push(UsageEvent {
            quantity: (i % 13) as u64 + 1,
            action,
            timestamp: Some(ts),
            idempotency_key: None,
        });
    }
    for chunk in events.chunks(MAX_BATCH) {
        report(&deps, &t, &sub.id, chunk.to_vec()).await.unwrap();
    }
    let p0 = sub.period(0).unwrap();
    let all = records_between(&deps, &sub.id, Some(p0.start), p0.end_exclusive)
        .await
        .unwrap();
    assert_eq!(all.len(), n);
    let expected = period_total(&all).unwrap();
    let before = (counting.calls(), counting.items_read());
    let (tally, more) = tally_between(&deps, &sub, Some(p0.start), p0.end_exclusive, None)
        .await
        .unwrap();
    let (calls, read) = (
        counting.calls() - before.0,
        counting.items_read() - before.1,
    );
    assert_eq!(
        (tally.total(), tally.records, more),
        (Some(expected), n as u64, false)
    );
    assert_eq!(read, n as u64, "each record read once");
    assert!(calls <= (n / READ_PAGE) as u64 + 2, "{calls} calls");
    let s = summary(&deps, &t, &sub.id).await.unwrap();
    assert_eq!((s.quantity, s.record_count), (expected, n as u64));
    let (capped, more) = tally_between(&deps, &sub, Some(p0.start), p0.end_exclusive, Some(1500))
        .await
        .unwrap();
    assert_eq!((capped.records, more), (1500, true));
    assert_eq!(capped.total(), period_total(&all[..1500]));
    let (exact, more) = tally_between(
        &deps,
        &sub,
        Some(p0.start),
        p0.end_exclusive,
        Some(n as u64),
    )
    .await
    .unwrap();
    assert_eq!((exact.records, more), (n as u64, false));
}
