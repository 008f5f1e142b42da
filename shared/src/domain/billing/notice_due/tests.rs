use chrono::NaiveDate;

use super::*;
use crate::domain::billing::terms::monthly;
use crate::testenv::at;

fn day(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).unwrap()
}

fn terms(grace: u16, before: u16, every: u16) -> Terms {
    let mut t = monthly();
    t.grace_period_days = grace;
    t.reminder_days_before_due = before;
    t.overdue_reminder_interval_days = every;
    t
}

fn days(due: NaiveDate, grace: u16) -> InvoiceDays {
    InvoiceDays {
        due_date: due,
        overdue_on: due.checked_add_days(Days::new(u64::from(grace))).unwrap(),
    }
}

/// Every notice, walking `next_notice` from nothing.
fn walk(inv: &InvoiceDays, t: &Terms, d: Option<(&[u16], DunningStatus)>) -> Vec<Notice> {
    let mut out = Vec::new();
    let mut through = None;
    while let Some(n) = next_notice(inv, t, d, through.as_ref()) {
        out.push(n);
        through = Some(Through {
            day: n.0,
            kind: n.1,
        });
        assert!(out.len() < 50, "the schedule ends");
    }
    assert_eq!(out, invoice_notices(inv, t, d), "walked = listed");
    out
}

use NoticeKind::{BeforeDue, DueToday, Dunning, Overdue};

#[test]
fn without_dunning_due_today_before_due_then_four_overdue_reminders() {
    let due = day(2026, 2, 1);
    let got = walk(&days(due, 7), &terms(7, 2, 3), None);
    assert_eq!(
        got,
        vec![
            (due, DueToday, None),
            (day(2026, 2, 6), BeforeDue, None),
            (day(2026, 2, 8), Overdue, None),
            (day(2026, 2, 11), Overdue, None),
            (day(2026, 2, 14), Overdue, None),
            (day(2026, 2, 17), Overdue, None),
        ]
    );
    assert_eq!(
        got.iter().filter(|n| n.1 == Overdue).count() as u64,
        MAX_OVERDUE_REMINDERS
    );
}

#[test]
fn before_due_only_strictly_between_the_due_date_and_the_grace_end() {
    let due = day(2026, 2, 1);
    // reminderDaysBeforeDue == grace: it would fall on the due date.
    let got = walk(&days(due, 3), &terms(3, 3, 0), None);
    assert_eq!(
        got,
        vec![(due, DueToday, None), (day(2026, 2, 4), Overdue, None)]
    );
    // More than the grace: before the due date: none either.
    let got = walk(&days(due, 3), &terms(3, 10, 0), None);
    assert!(!got.iter().any(|n| n.1 == BeforeDue));
    // reminderDaysBeforeDue 0: none.
    let got = walk(&days(due, 5), &terms(5, 0, 0), None);
    assert_eq!(
        got,
        vec![(due, DueToday, None), (day(2026, 2, 6), Overdue, None)]
    );
    // One day before the grace end.
    let got = walk(&days(due, 5), &terms(5, 1, 0), None);
    assert_eq!(got[1], (day(2026, 2, 5), BeforeDue, None));
}

#[test]
fn grace_zero_has_only_the_overdue_notice_on_the_due_day() {
    let due = day(2026, 2, 1);
    let got = walk(&days(due, 0), &terms(0, 3, 0), None);
    assert_eq!(got, vec![(due, Overdue, None)]);
}

#[test]
fn a_dunning_policy_replaces_the_repeated_overdue_reminders() {
    let due = day(2026, 2, 1);
    let intervals = [1u16, 3, 7];
    let got = walk(
        &days(due, 3),
        &terms(3, 1, 2),
        Some((&intervals, DunningStatus::Active)),
    );
    assert_eq!(
        got,
        vec![
            (due, DueToday, None),
            (day(2026, 2, 3), BeforeDue, None),
            (day(2026, 2, 4), Overdue, None),
            (day(2026, 2, 5), Dunning, Some(0)),
            (day(2026, 2, 7), Dunning, Some(1)),
            (day(2026, 2, 11), Dunning, Some(2)),
        ]
    );
}

#[test]
fn a_policy_with_one_interval_has_one_dunning_reminder() {
    let due = day(2026, 2, 1);
    let got = walk(
        &days(due, 3),
        &terms(3, 0, 2),
        Some((&[10], DunningStatus::Active)),
    );
    assert_eq!(got.last(), Some(&(day(2026, 2, 14), Dunning, Some(0))));
    assert_eq!(got.len(), 3);
}

#[test]
fn a_stopped_exhausted_or_resolved_dunning_has_nothing_next() {
    let due = day(2026, 2, 1);
    for status in [
        DunningStatus::Stopped,
        DunningStatus::Exhausted,
        DunningStatus::Resolved,
    ] {
        let through = Through {
            day: day(2026, 2, 4),
            kind: Overdue,
        };
        assert_eq!(
            next_notice(
                &days(due, 3),
                &terms(3, 0, 2),
                Some((&[1, 2], status)),
                Some(&through)
            ),
            None,
            "{status:?}"
        );
    }
}

#[test]
fn next_is_strictly_after_through_even_when_the_policy_changes() {
    let due = day(2026, 2, 1);
    let through = Through {
        day: day(2026, 2, 7),
        kind: Dunning,
    };
    // The policy now has intervals 1, 5, 9 (days 5, 9, 13): after day 7,
    // day 9.
    let got = next_notice(
        &days(due, 3),
        &terms(3, 0, 2),
        Some((&[1, 5, 9], DunningStatus::Active)),
        Some(&through),
    );
    assert_eq!(got, Some((day(2026, 2, 9), Dunning, Some(1))));
}

#[test]
fn a_bs_month_invoice_runs_on_its_nepal_days() {
    // BS 2081-04-15 is 2024-07-30 (a Shrawan bill): the days are AD days
    // either way; the schedule only adds days.
    let due = day(2024, 7, 30);
    let got = walk(&days(due, 5), &terms(5, 2, 0), None);
    assert_eq!(
        got,
        vec![
            (due, DueToday, None),
            (day(2024, 8, 2), BeforeDue, None),
            (day(2024, 8, 4), Overdue, None),
        ]
    );
}

#[test]
fn notices_go_at_seven_nepal_time_never_before_the_issue() {
    let d = day(2026, 2, 1);
    assert_eq!(send_time(d), Some(at("2026-02-01T01:15:00Z")));
    // Issued at 00:00 Nepal time: at 07:00.
    let issued = at("2026-01-31T18:15:00Z");
    assert_eq!(due_time(d, issued), Some(at("2026-02-01T01:15:00Z")));
    // Issued at 14:00 Nepal time: at once.
    let issued = at("2026-02-01T08:15:00Z");
    assert_eq!(due_time(d, issued), Some(issued));
}

#[test]
fn a_trial_notice_waits_for_seven_nepal_time() {
    use crate::domain::billing::subscription::{NewSubscription, new_subscription};
    let t0 = at("2026-01-28T06:00:00Z");
    let tenant = Tenant::new(ProjectId::stored("proj_1"), Mode::Sandbox);
    let input = NewSubscription {
        trial_ends_at: Some(at("2026-02-10T18:15:00Z")),
        ..crate::domain::billing::testenv::sub_input(t0, monthly())
    };
    let mut sub = new_subscription(&tenant, input, t0).unwrap();
    let end = at("2026-02-10T18:15:00Z"); // 00:00 Nepal, Feb 11
    let moment = at("2026-02-07T18:15:00Z"); // 00:00 Nepal, Feb 8
    sub.trial_ends_at = Some(end);
    let rec = NoticeSchedule::for_trial(&sub, end, moment, moment);
    assert_eq!(rec.next_at, Some(at("2026-02-08T01:15:00Z")));
    // Recorded late (after 07:00): at once.
    let late = at("2026-02-08T10:00:00Z");
    let rec = NoticeSchedule::for_trial(&sub, end, late, late);
    assert_eq!(rec.next_at, Some(late));
    assert_eq!(
        rec.item_key(),
        NoticeSchedule::trial_key(&sub.id, end),
        "one record per trial end"
    );
}
