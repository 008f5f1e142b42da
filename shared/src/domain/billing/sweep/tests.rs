use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::NaiveDate;

use super::*;
use crate::AppState;
use crate::domain::billing::invoice::{PaymentSource, pay_invoice};
use crate::domain::billing::subscription::{NewSubscription, apply, create, new_subscription};
use crate::domain::billing::terms::{OverdueAction, Terms, monthly};
use crate::domain::billing::testenv::sub_input;
use crate::domain::billing::testenv::{deps_at, stores};
use crate::domain::{Mode, Provider};
use crate::store::Store;
use crate::testenv::at;

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, "2026-01-10T06:00:00Z")
}

fn deps() -> AppState {
    deps_on(crate::testenv::memory_store())
}

fn day(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).unwrap()
}

/// 00:00 in Nepal on that day.
fn nepal_midnight(y: i32, m: u32, d: u32) -> Timestamp {
    nepal_day_start(day(y, m, d)).unwrap()
}

const START: &str = "2026-01-10T06:00:00Z";

fn input(start: Timestamp, trial_ends_at: Option<Timestamp>, terms: Terms) -> NewSubscription {
    NewSubscription {
        trial_ends_at,
        ..sub_input(start, terms)
    }
}

/// A subscription created at `created` from `input`, stored.
async fn stored(
    deps: &Deps,
    project: &str,
    input: NewSubscription,
    created: Timestamp,
) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    let sub = new_subscription(&tenant, input, created).unwrap();
    create(deps, &sub).await.unwrap();
    sub
}

/// Trialing from 2026-01-10 until 2026-01-24 06:00 UTC.
async fn trialing(deps: &Deps, project: &str) -> Subscription {
    let start = at(START);
    let trial = Some(at("2026-01-24T06:00:00Z"));
    stored(deps, project, input(start, trial, monthly()), start).await
}

/// Active from 2026-01-10 with its first invoice (period 0) paid, as the
/// API and a payment leave it.
async fn active(deps: &Deps, project: &str, terms: Terms) -> Subscription {
    let start = at(START);
    let sub = stored(deps, project, input(start, None, terms), start).await;
    let period = sub.current_period().unwrap();
    let inv = issue_invoice(deps, &sub, period, start)
        .await
        .unwrap()
        .invoice;
    let source = PaymentSource::Online {
        payment_id: format!("pay_{}", sub.id).as_str().into(),
        provider: Provider::Khalti,
    };
    pay_invoice(deps, &sub.tenant(), &inv.id, source, inv.amount_due, start)
        .await
        .unwrap();
    // Paying the first invoice activated the subscription, in the same write.
    let paid = subscription::get(deps, &sub.tenant(), &sub.id)
        .await
        .unwrap();
    assert_eq!(paid.status, S::Active);
    paid
}

async fn invoices_of(deps: &Deps, tenant: &Tenant) -> Vec<BillingInvoice> {
    record::all_of(
        &*deps.store,
        &Query::partition(BillingInvoice::list_partition(tenant)).on(Index::Gsi1),
    )
    .await
    .unwrap()
}

/// The invoices of `sub` by period start: how many each period has.
async fn per_period(deps: &Deps, sub: &Subscription) -> BTreeMap<NaiveDate, usize> {
    let mut out = BTreeMap::new();
    for inv in invoices_of(deps, &sub.tenant()).await {
        if inv.subscription_id == sub.id {
            *out.entry(inv.period_start).or_insert(0) += 1;
        }
    }
    out
}

/// The stored subscription, checking that `next_due_at` is its `due_at`
/// and that the due index lists it exactly there.
async fn reread(deps: &Deps, sub: &Subscription) -> Subscription {
    let s = subscription::get(deps, &sub.tenant(), &sub.id)
        .await
        .unwrap();
    assert_eq!(s.next_due_at, s.due_at(), "next_due_at is kept true");
    let far = at("2100-01-01T00:00:00Z");
    let listed = due_in(deps, &s.tenant(), far, 10_000).await.unwrap();
    let entry = listed.iter().find(|l| l.id == s.id);
    assert_eq!(entry.is_some(), s.next_due_at.is_some(), "indexed iff due");
    if let Some(at) = s.next_due_at {
        let before = due_in(
            deps,
            &s.tenant(),
            at.plus(chrono::Duration::milliseconds(-1)),
            10_000,
        )
        .await
        .unwrap();
        assert!(
            before.iter().all(|l| l.id != s.id),
            "not listed before its due time"
        );
    }
    s
}

// ---- due_at and next_step (pure) ----

#[test]
fn due_at_is_the_next_thing_due_in_each_status() {
    let tenant = Tenant::new("proj_due", Mode::Sandbox);
    let start = at(START);
    // A draft: its start day.
    let later = at("2026-02-01T06:00:00Z");
    let draft = new_subscription(&tenant, input(later, None, monthly()), start).unwrap();
    assert_eq!(draft.status, S::Draft);
    assert_eq!(draft.due_at(), Some(nepal_midnight(2026, 2, 1)));
    assert_eq!(draft.next_due_at, draft.due_at(), "stamped when made");
    // Trialing: 3 days before the end, then the end.
    let end = at("2026-01-24T06:00:00Z");
    let mut trial = new_subscription(&tenant, input(start, Some(end), monthly()), start).unwrap();
    assert_eq!(trial.due_at(), Some(at("2026-01-21T06:00:00Z")));
    trial.trial_reminded_for = Some(end);
    assert_eq!(trial.due_at(), Some(end));
    // An extended trial is reminded again.
    trial.trial_ends_at = Some(at("2026-02-24T06:00:00Z"));
    assert_eq!(trial.due_at(), Some(at("2026-02-21T06:00:00Z")));
    // Incomplete: the first invoice's grace end (due Jan 10 + 3 days).
    let mut sub = new_subscription(&tenant, input(start, None, monthly()), start).unwrap();
    assert_eq!(sub.status, S::Incomplete);
    assert_eq!(sub.due_at(), Some(nepal_midnight(2026, 1, 13)));
    // Active: the grace end, then the period end once the grace is checked.
    sub.status = S::Active;
    assert_eq!(sub.due_at(), Some(nepal_midnight(2026, 1, 13)));
    sub.overdue_next = 1;
    assert_eq!(sub.due_at(), Some(nepal_midnight(2026, 2, 10)));
    // A grace longer than the period: the period end comes first.
    sub.overdue_next = 0;
    sub.terms.grace_period_days = 40;
    assert_eq!(sub.due_at(), Some(nepal_midnight(2026, 2, 10)));
    sub.terms.grace_period_days = 3;
    sub.overdue_next = 1;
    // Paused: the period end or resume_at, whichever first.
    sub.status = S::Paused;
    assert_eq!(sub.due_at(), Some(nepal_midnight(2026, 2, 10)));
    sub.resume_at = Some(at("2026-01-20T00:00:00Z"));
    assert_eq!(sub.due_at(), Some(at("2026-01-20T00:00:00Z")));
    // Ended: nothing, ever.
    for ended in [S::Cancelled, S::IncompleteExpired, S::Completed] {
        sub.status = ended;
        assert_eq!(sub.due_at(), None, "{ended:?}");
    }
}

#[test]
fn next_step_takes_the_earliest_due_and_nothing_early() {
    let tenant = Tenant::new("proj_step", Mode::Sandbox);
    let start = at(START);
    let mut sub = new_subscription(&tenant, input(start, None, monthly()), start).unwrap();
    sub.status = S::Active;
    assert_eq!(next_step(&sub, start), None);
    let grace = nepal_midnight(2026, 1, 13);
    assert_eq!(
        next_step(&sub, grace.plus(chrono::Duration::milliseconds(-1))),
        None
    );
    assert_eq!(next_step(&sub, grace), Some(Step::GraceEnd(0)));
    // Long past both: the grace end first (the earlier).
    assert_eq!(
        next_step(&sub, at("2026-06-01T00:00:00Z")),
        Some(Step::GraceEnd(0))
    );
    sub.overdue_next = 1;
    assert_eq!(
        next_step(&sub, at("2026-06-01T00:00:00Z")),
        Some(Step::PeriodEnd)
    );
    let end = at("2026-01-24T06:00:00Z");
    let trial = new_subscription(&tenant, input(start, Some(end), monthly()), start).unwrap();
    assert_eq!(next_step(&trial, end), Some(Step::TrialWillEnd));
}

#[test]
fn an_old_record_without_the_new_fields_decodes() {
    let tenant = Tenant::new("proj_old", Mode::Sandbox);
    let start = at(START);
    let sub = new_subscription(&tenant, input(start, None, monthly()), start).unwrap();
    let mut item = serde_json::to_value(&sub).unwrap();
    let map = item.as_object_mut().unwrap();
    map.remove("next_due_at");
    map.remove("trial_reminded_for");
    map.remove("overdue_next");
    let old: Subscription = serde_json::from_value(item).unwrap();
    assert_eq!(old.next_due_at, None);
    assert_eq!(old.overdue_next, 0);
}

// ---- advance, one case each ----

#[tokio::test]
async fn a_draft_starts_on_its_day_with_its_first_invoice() {
    let deps = deps();
    let start = at("2026-02-01T06:00:00Z");
    let sub = stored(
        &deps,
        "proj_draft",
        input(start, None, monthly()),
        at(START),
    )
    .await;
    assert_eq!(sub.status, S::Draft);
    let early = advance(&deps, &sub, at("2026-01-31T12:00:00Z"))
        .await
        .unwrap();
    assert_eq!(early.steps, 0);
    let done = advance(&deps, &sub, start).await.unwrap();
    assert_eq!(done.subscription.status, S::Incomplete);
    assert_eq!(done.invoices_issued, 1);
    assert_eq!(
        per_period(&deps, &sub).await,
        BTreeMap::from([(day(2026, 2, 1), 1)])
    );
    reread(&deps, &sub).await;
}

#[tokio::test]
async fn a_trial_is_reminded_then_ends_with_the_first_invoice() {
    let deps = deps();
    let sub = trialing(&deps, "proj_trial").await;
    let reminded = advance(&deps, &sub, at("2026-01-21T07:00:00Z"))
        .await
        .unwrap();
    assert_eq!(reminded.steps, 1);
    assert_eq!(reminded.subscription.status, S::Trialing);
    assert_eq!(reminded.subscription.trial_reminded_for, sub.trial_ends_at);
    assert!(per_period(&deps, &sub).await.is_empty());
    let s = reread(&deps, &sub).await;
    assert_eq!(s.next_due_at, sub.trial_ends_at);
    let ended = advance(&deps, &sub, at("2026-01-24T06:00:00Z"))
        .await
        .unwrap();
    let s = ended.subscription;
    assert_eq!(s.status, S::Active);
    assert_eq!(s.billing_start, Some(day(2026, 1, 24)));
    assert_eq!(ended.invoices_issued, 1);
    // The reminder moment wrote `subscription.trial_will_end` once; the
    // end wrote `trial_ended` (and the invoice its `created`).
    let events = crate::domain::outbox::recent(&*deps.store, &sub.tenant(), 50)
        .await
        .unwrap();
    let count = |t: &str| events.iter().filter(|e| e.event_type.as_str() == t).count();
    assert_eq!(count("subscription.trial_will_end"), 1);
    assert_eq!(count("subscription.trial_ended"), 1);
    assert_eq!(count("billing_invoice.created"), 1);
    assert_eq!(
        per_period(&deps, &sub).await,
        BTreeMap::from([(day(2026, 1, 24), 1)])
    );
    reread(&deps, &sub).await;
}

#[tokio::test]
async fn a_trial_with_a_cancel_pending_ends_cancelled_unbilled() {
    let deps = deps();
    let sub = trialing(&deps, "proj_trial_cancel").await;
    apply(
        &deps,
        &sub.tenant(),
        &sub.id,
        E::CancelAtPeriodEnd,
        &|s| s.cancel_at_period_end = true,
        at(START),
    )
    .await
    .unwrap();
    let done = advance(&deps, &sub, at("2026-02-01T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(done.subscription.status, S::Cancelled);
    assert!(per_period(&deps, &sub).await.is_empty());
    let s = reread(&deps, &sub).await;
    assert_eq!(s.next_due_at, None);
}

#[tokio::test]
async fn renewals_bill_each_period_once_and_unpaid_ones_go_overdue() {
    let deps = deps();
    let sub = active(&deps, "proj_renew", monthly()).await;
    // Three period ends and four grace ends later.
    let now = at("2026-04-15T00:00:00Z");
    let done = advance(&deps, &sub, now).await.unwrap();
    let s = done.subscription;
    assert_eq!(done.invoices_issued, 3);
    assert_eq!(s.period_index, 3);
    assert_eq!(s.overdue_next, 4);
    // Period 0 was paid; 1-3 went overdue: past due (the plan's action).
    assert_eq!(s.status, S::PastDue);
    let want = BTreeMap::from([
        (day(2026, 1, 10), 1),
        (day(2026, 2, 10), 1),
        (day(2026, 3, 10), 1),
        (day(2026, 4, 10), 1),
    ]);
    assert_eq!(per_period(&deps, &sub).await, want);
    let mut statuses: Vec<(NaiveDate, InvoiceStatus)> = invoices_of(&deps, &sub.tenant())
        .await
        .into_iter()
        .map(|i| (i.period_start, i.status))
        .collect();
    statuses.sort_by_key(|(d, _)| *d);
    assert_eq!(
        statuses.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        [
            InvoiceStatus::Paid,
            InvoiceStatus::Overdue,
            InvoiceStatus::Overdue,
            InvoiceStatus::Overdue
        ]
    );
    let s = reread(&deps, &sub).await;
    assert_eq!(s.next_due_at, Some(nepal_midnight(2026, 5, 10)));
    // Run again at the same time: nothing more.
    let again = advance(&deps, &sub, now).await.unwrap();
    assert_eq!((again.steps, again.invoices_issued), (0, 0));
}

#[tokio::test]
async fn a_paid_invoice_takes_no_overdue_action() {
    let deps = deps();
    let sub = active(&deps, "proj_paid", monthly()).await;
    let done = advance(&deps, &sub, at("2026-01-20T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(done.subscription.status, S::Active);
    assert_eq!(done.subscription.overdue_next, 1);
    let s = reread(&deps, &sub).await;
    assert_eq!(s.next_due_at, Some(nepal_midnight(2026, 2, 10)));
}

#[tokio::test]
async fn the_overdue_action_pauses_or_cancels() {
    for (action, want) in [
        (OverdueAction::Pause, S::Paused),
        (OverdueAction::Cancel, S::Cancelled),
        (OverdueAction::KeepActive, S::Active),
    ] {
        let deps = deps();
        let mut terms = monthly();
        terms.overdue_action = action;
        let sub = active(&deps, "proj_action", terms).await;
        // Period 1 begins Feb 10 and its grace ends Feb 13.
        let done = advance(&deps, &sub, at("2026-02-14T00:00:00Z"))
            .await
            .unwrap();
        let s = done.subscription;
        assert_eq!(s.status, want, "{action:?}");
        assert_eq!(s.paused_for_nonpayment, want == S::Paused, "{action:?}");
        assert_eq!(s.cancelled_at.is_some(), want == S::Cancelled, "{action:?}");
        reread(&deps, &sub).await;
    }
}

#[tokio::test]
async fn a_paused_period_is_not_billed_and_resume_at_resumes() {
    let deps = deps();
    let sub = active(&deps, "proj_pause", monthly()).await;
    let resume = at("2026-02-20T00:00:00Z");
    apply(
        &deps,
        &sub.tenant(),
        &sub.id,
        E::Pause,
        &|s| s.resume_at = Some(resume),
        at(START),
    )
    .await
    .unwrap();
    let paused = advance(&deps, &sub, at("2026-02-19T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(paused.subscription.status, S::Paused);
    assert_eq!(paused.subscription.period_index, 1, "the period moved on");
    assert_eq!(paused.invoices_issued, 0, "a paused period is not billed");
    let resumed = advance(&deps, &sub, resume).await.unwrap();
    assert_eq!(resumed.subscription.status, S::Active);
    assert_eq!(resumed.subscription.resume_at, None);
    // The next period is billed.
    let next = advance(&deps, &sub, at("2026-03-10T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(next.invoices_issued, 1);
    assert_eq!(
        per_period(&deps, &sub).await,
        BTreeMap::from([(day(2026, 1, 10), 1), (day(2026, 3, 10), 1)])
    );
    reread(&deps, &sub).await;
}

#[tokio::test]
async fn a_cancel_at_period_end_cancels_at_the_period_end_unbilled() {
    let deps = deps();
    let sub = active(&deps, "proj_cape", monthly()).await;
    apply(
        &deps,
        &sub.tenant(),
        &sub.id,
        E::CancelAtPeriodEnd,
        &|s| s.cancel_at_period_end = true,
        at(START),
    )
    .await
    .unwrap();
    let before = advance(&deps, &sub, at("2026-02-09T18:14:00Z"))
        .await
        .unwrap();
    assert_eq!(before.subscription.status, S::Active);
    let done = advance(&deps, &sub, at("2026-02-09T18:15:00Z"))
        .await
        .unwrap();
    assert_eq!(done.subscription.status, S::Cancelled);
    assert_eq!(done.invoices_issued, 0);
    let s = reread(&deps, &sub).await;
    assert_eq!(s.next_due_at, None);
}

#[tokio::test]
async fn an_unpaid_first_invoice_expires_the_subscription_and_is_voided() {
    let deps = deps();
    let start = at(START);
    let sub = stored(&deps, "proj_expire", input(start, None, monthly()), start).await;
    let period = sub.current_period().unwrap();
    let inv = issue_invoice(&deps, &sub, period, start)
        .await
        .unwrap()
        .invoice;
    let done = advance(&deps, &sub, at("2026-01-13T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(done.subscription.status, S::IncompleteExpired);
    let inv = invoice::get_invoice(&deps, &sub.tenant(), &inv.id)
        .await
        .unwrap();
    assert_eq!(inv.status, InvoiceStatus::Void);
    let s = reread(&deps, &sub).await;
    assert_eq!(s.next_due_at, None);
}

/// A plan without grace (the API's default) still gives the customer the
/// due day: the sweep right after the subscription starts leaves its first
/// invoice open; it expires at the next Nepal midnight.
#[tokio::test]
async fn with_no_grace_the_first_invoice_is_payable_on_its_due_day() {
    let deps = deps();
    let start = at(START);
    let mut terms = monthly();
    terms.grace_period_days = 0;
    let sub = stored(&deps, "proj_nograce", input(start, None, terms), start).await;
    let period = sub.current_period().unwrap();
    let inv = issue_invoice(&deps, &sub, period, start)
        .await
        .unwrap()
        .invoice;
    let soon = advance(&deps, &sub, start.plus(chrono::Duration::minutes(1)))
        .await
        .unwrap();
    assert_eq!(soon.subscription.status, S::Incomplete);
    let read = invoice::get_invoice(&deps, &sub.tenant(), &inv.id)
        .await
        .unwrap();
    assert_eq!(read.status, InvoiceStatus::Open);
    assert_eq!(read.overdue_on, inv.due_date.succ_opt().unwrap());
    let next_midnight = advance(&deps, &sub, nepal_midnight(2026, 1, 11))
        .await
        .unwrap();
    assert_eq!(next_midnight.subscription.status, S::IncompleteExpired);
}

#[tokio::test]
async fn a_run_that_died_after_issuing_is_finished_by_the_next() {
    let deps = deps();
    let sub = active(&deps, "proj_crash", monthly()).await;
    // The dead run issued period 1's invoice, then never wrote the
    // subscription.
    let mut renewed = sub.clone();
    renewed.period_index = 1;
    let period = renewed.current_period().unwrap();
    let first = issue_invoice(&deps, &renewed, period, at("2026-02-10T00:00:00Z"))
        .await
        .unwrap();
    assert!(first.created);
    let done = advance(&deps, &sub, at("2026-02-11T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(done.subscription.period_index, 1);
    assert_eq!(done.invoices_issued, 0, "found, not issued again");
    assert_eq!(
        per_period(&deps, &sub).await,
        BTreeMap::from([(day(2026, 1, 10), 1), (day(2026, 2, 10), 1)])
    );
}

#[tokio::test]
async fn a_subscription_on_a_test_clock_is_not_swept() {
    let deps = deps();
    let start = at(START);
    let mut on_clock = input(start, None, monthly());
    on_clock.test_clock_id = Some(crate::ids::TestClockId::new());
    let sub = stored(&deps, "proj_clock", on_clock, start).await;
    assert!(sub.next_due_at.is_some());
    let report = sweep(&deps, at("2026-03-01T00:00:00Z"), BUDGET)
        .await
        .unwrap();
    assert_eq!(report.subscriptions_advanced, 0);
    let s = subscription::get(&deps, &sub.tenant(), &sub.id)
        .await
        .unwrap();
    assert_eq!(s.status, S::Incomplete);
}

// ---- the sweep ----

/// Two sweeps and API-style issues of every period, all at once, on both
/// backends: one invoice per (subscription, period), no number taken in
/// vain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweeps_and_api_issues_at_once_make_one_invoice_per_period() {
    for (backend, store) in stores().await {
        let deps = deps_on(store.clone());
        let mut subs = Vec::new();
        for _ in 0..4 {
            subs.push(active(&deps, "proj_race", monthly()).await);
        }
        let now = at("2026-04-15T00:00:00Z");
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let deps = deps.clone();
            tasks.push(tokio::spawn(async move {
                sweep(&deps, now, BUDGET)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }));
        }
        for sub in &subs {
            for n in 1..=3 {
                let deps = deps.clone();
                let mut renewed = sub.clone();
                renewed.period_index = n;
                tasks.push(tokio::spawn(async move {
                    let period = renewed.current_period().unwrap();
                    issue_invoice(&deps, &renewed, period, now)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }));
            }
        }
        for t in futures::future::join_all(tasks).await {
            t.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}"));
        }
        // A sweep that lost every race leaves work due: the next run
        // finishes it (as the scheduler's next minute would).
        sweep(&deps, now, BUDGET).await.unwrap();
        let want = BTreeMap::from([
            (day(2026, 1, 10), 1),
            (day(2026, 2, 10), 1),
            (day(2026, 3, 10), 1),
            (day(2026, 4, 10), 1),
        ]);
        for sub in &subs {
            assert_eq!(per_period(&deps, sub).await, want, "{backend}");
            let s = reread(&deps, sub).await;
            assert_eq!(s.period_index, 3, "{backend}");
            assert_eq!(s.status, S::PastDue, "{backend}");
        }
        let tenant = subs[0].tenant();
        let all = invoices_of(&deps, &tenant).await;
        assert_eq!(all.len(), 16, "{backend}");
        let mut numbers: Vec<String> = all.into_iter().map(|i| i.number).collect();
        numbers.sort();
        let gapless: Vec<String> = (1..=16).map(|n| format!("TEST-PI-{n:06}")).collect();
        assert_eq!(
            numbers, gapless,
            "{backend}: one number per invoice, no gap"
        );
    }
}

/// One project with many due cannot hold another's few past one run.
#[tokio::test]
async fn a_small_project_is_finished_in_one_run_beside_a_big_one() {
    let deps = deps();
    let mut big = Vec::new();
    for _ in 0..60 {
        big.push(trialing(&deps, "proj_big").await);
    }
    let mut small = Vec::new();
    for _ in 0..10 {
        small.push(trialing(&deps, "proj_small").await);
    }
    // After the trials end (Jan 24), before the first grace ends (Jan 27).
    let now = at("2026-01-25T00:00:00Z");
    let report = sweep(&deps, now, 40).await.unwrap();
    assert_eq!(report.subscriptions_advanced, 40);
    for s in &small {
        let s = reread(&deps, s).await;
        assert_eq!(s.status, S::Active, "every small-project subscription");
    }
    let mut active_big = 0;
    for s in &big {
        let s = reread(&deps, s).await;
        active_big += usize::from(s.status == S::Active);
    }
    assert_eq!(active_big, 30);
    // The next run takes the rest; then nothing is due.
    let report = sweep(&deps, now, 40).await.unwrap();
    assert_eq!(report.subscriptions_advanced, 30);
    let report = sweep(&deps, now, 40).await.unwrap();
    assert_eq!(report.subscriptions_advanced, 0);
}

/// A tenant with more due than its turn takes the budget no other tenant
/// needs (further turns), after every tenant's first turn: here 3 due
/// beside 25, at most 10 a turn, budget 20: the 3 first in turn order,
/// then 17 of the 25, none twice; the next run takes the other 8.
#[tokio::test]
async fn budget_no_other_tenant_needs_goes_to_the_tenant_with_more() {
    let deps = deps();
    let mut big = std::collections::BTreeSet::new();
    for _ in 0..25 {
        big.insert(trialing(&deps, "proj_more").await.id);
    }
    let mut small = std::collections::BTreeSet::new();
    for _ in 0..3 {
        small.insert(trialing(&deps, "proj_few").await.id);
    }
    let now = at("2026-01-25T00:00:00Z");
    let (picked, errors) = pick(&deps, now, 20, 10).await.unwrap();
    assert_eq!(errors, 0);
    assert_eq!(picked.len(), 20);
    let ids: std::collections::BTreeSet<_> = picked.iter().map(|s| s.id.clone()).collect();
    assert_eq!(ids.len(), 20, "none twice");
    assert!(
        small.iter().all(|id| ids.contains(id)),
        "the few are all taken"
    );
    // Within the first two turns (10 + 3), every small one.
    let first: std::collections::BTreeSet<_> =
        picked.iter().take(13).map(|s| s.id.clone()).collect();
    assert!(small.iter().all(|id| first.contains(id)));
    let report = sweep(&deps, now, 20).await.unwrap();
    assert_eq!(report.subscriptions_advanced, 20);
    let report = sweep(&deps, now, 20).await.unwrap();
    assert_eq!(report.subscriptions_advanced, 8, "the rest of the 25");
    let report = sweep(&deps, now, 20).await.unwrap();
    assert_eq!(report.subscriptions_advanced, 0);
}
