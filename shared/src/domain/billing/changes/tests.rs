use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::AppState;
use crate::domain::Mode;
use crate::domain::billing::calendar::{BsDate, ad_from_bs, days_in_bs_month};
use crate::domain::billing::customers::{self, CreateCustomer};
use crate::domain::billing::invoice::{
    self, InvoiceStatus, OutOfBand, OutOfBandMethod, PeriodClaim,
};
use crate::domain::billing::lifecycle::{CancelSubscription, CreateSubscription};
use crate::domain::billing::period::{Calendar, IntervalUnit, Schedule};
use crate::domain::billing::plans::{CreatePlan, UpdatePlan};
use crate::domain::billing::sweep;
use crate::domain::billing::testenv::{deps_with, stores};
use crate::domain::outbox::Event;
use crate::domain::record;
use crate::ids::UserId;
use crate::refusal::Kind;
use crate::store::{Index, Query, Store};
use crate::testenv::at;
use crate::time::ManualClock;

const NOW: &str = "2026-01-10T06:00:00Z";

fn day(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).unwrap()
}

fn period(start: NaiveDate, end: NaiveDate) -> Period {
    Period {
        start,
        end_exclusive: end,
    }
}

fn price(amount: i64, quantity: u32) -> Price {
    Price { amount, quantity }
}

// ---------------------------------------------------------------------------
// The rule.

#[test]
fn the_change_day_counts_as_remaining_and_each_side_rounds_half_up() {
    // January 10 to February 10: 31 days. A change on January 20 leaves
    // 21 days (the 20th to the 9th of February, both counted).
    let p = period(day(2026, 1, 10), day(2026, 2, 10));
    let r = prorate(p, day(2026, 1, 20), price(99_900, 1), price(199_900, 1)).unwrap();
    assert_eq!((r.remaining_days, r.total_days), (21, 31));
    // 21/31 x 99,900 = 67,674.19 -> 67,674; 21/31 x 199,900 = 135,416.13 -> 135,416.
    assert_eq!((r.credit, r.debit, r.net()), (67_674, 135_416, 67_742));
    // On the first day everything remains; on the last day one day does.
    let first = prorate(p, day(2026, 1, 10), price(99_900, 1), price(199_900, 1)).unwrap();
    assert_eq!((first.credit, first.debit), (99_900, 199_900));
    let last = prorate(p, day(2026, 2, 9), price(3_100, 2), price(6_200, 1)).unwrap();
    assert_eq!(
        (last.remaining_days, last.credit, last.debit),
        (1, 200, 200)
    );
    // Half a paisa rounds up: 1/2 x 1 paisa.
    let two = period(day(2026, 1, 1), day(2026, 1, 3));
    let half = prorate(two, day(2026, 1, 2), price(1, 1), price(3, 1)).unwrap();
    assert_eq!((half.credit, half.debit), (1, 2));
    // Just under a half rounds down: 1/3 x 100 = 33.33; 2/3 x 100 = 66.67.
    let three = period(day(2026, 1, 1), day(2026, 1, 4));
    let third = prorate(three, day(2026, 1, 3), price(100, 1), price(100, 2)).unwrap();
    assert_eq!((third.credit, third.debit), (33, 67));
}

#[test]
fn a_day_outside_the_period_is_not_prorated() {
    let p = period(day(2026, 1, 10), day(2026, 2, 10));
    assert!(prorate(p, day(2026, 1, 9), price(1, 1), price(2, 1)).is_none());
    assert!(prorate(p, day(2026, 2, 10), price(1, 1), price(2, 1)).is_none());
    assert!(prorate(p, day(2026, 1, 11), price(i64::MAX, u32::MAX), price(1, 1)).is_none());
}

#[test]
fn a_bs_month_counts_its_own_days() {
    // A BS monthly plan from Shrawan 1, 2082: the period is Shrawan, its
    // own length in that year.
    let shrawan = ad_from_bs(BsDate::new(2082, 4, 1).unwrap()).unwrap();
    let days = i64::from(days_in_bs_month(2082, 4).unwrap());
    let schedule = Schedule::new(shrawan, IntervalUnit::Month, 1, None, Calendar::Bs)
        .unwrap()
        .unwrap();
    let p = schedule.period(0).unwrap();
    assert_eq!((p.end_exclusive - p.start).num_days(), days);
    let change = shrawan + Duration::days(10);
    let r = prorate(p, change, price(100_000, 1), price(200_000, 1)).unwrap();
    assert_eq!(r.total_days, days);
    assert_eq!(r.remaining_days, days - 10);
    let exact = |amount: i64| (2 * amount * (days - 10) + days) / (2 * days);
    assert_eq!((r.credit, r.debit), (exact(100_000), exact(200_000)));
}

// ---------------------------------------------------------------------------
// The operations.

struct Env {
    deps: AppState,
    clock: ManualClock,
    t: Tenant,
}

fn env_on(store: Arc<dyn Store>) -> Env {
    let clock = ManualClock::new(at(NOW));
    let deps = deps_with(store, Arc::new(clock.clone()));
    Env {
        deps,
        clock,
        t: Tenant::new("p1", Mode::Sandbox),
    }
}

fn env() -> Env {
    env_on(crate::testenv::memory_store())
}

impl Env {
    async fn plan(&self, name: &str, amount: i64, extra: serde_json::Value) -> Plan {
        let mut v = json!({"name": name, "amount": amount, "intervalUnit": "month"});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let body: CreatePlan = serde_json::from_value(v).unwrap();
        plans::create(&self.deps, &self.t, body, None)
            .await
            .unwrap()
    }

    /// Active on `plan` from NOW with `quantity`, its first invoice paid.
    async fn active(&self, plan: &Plan, quantity: u32) -> Subscription {
        let body: CreateCustomer = serde_json::from_value(json!({"name": "Sita Rai"})).unwrap();
        let c = customers::create(&self.deps, &self.t, body, None)
            .await
            .unwrap();
        let body: CreateSubscription = serde_json::from_value(
            json!({"customerId": c.id, "planId": plan.id, "quantity": quantity}),
        )
        .unwrap();
        let made = lifecycle::create_subscription(&self.deps, &self.t, body, None)
            .await
            .unwrap();
        let inv = made.first_invoice.unwrap().invoice;
        self.pay(&inv).await;
        subscription::get(&self.deps, &self.t, &made.subscription.id)
            .await
            .unwrap()
    }

    async fn pay(&self, inv: &BillingInvoice) {
        let now = self.deps.clock.now();
        let payment = OutOfBand {
            method: OutOfBandMethod::Cash,
            received_on: nepal_day(now),
            reference: format!("cash-{}", inv.number),
            recorded_by: UserId::new(),
            amount: inv.amount_due,
        };
        invoice::record_out_of_band_payment(&self.deps, &self.t, &inv.id, payment, now)
            .await
            .unwrap();
    }

    async fn change(
        &self,
        sub: &Subscription,
        plan: &Plan,
        behavior: &str,
    ) -> Result<Changed, ChangeError> {
        let body: ChangePlan =
            serde_json::from_value(json!({"newPlanId": plan.id, "prorationBehavior": behavior}))
                .unwrap();
        change_plan(&self.deps, &self.t, &sub.id, body).await
    }

    async fn invoices(&self, sub: &Subscription) -> Vec<BillingInvoice> {
        let all: Vec<BillingInvoice> = record::all_of(
            &*self.deps.store,
            &Query::partition(BillingInvoice::list_partition(&self.t)).on(Index::Gsi1),
        )
        .await
        .unwrap();
        let mut mine: Vec<BillingInvoice> = all
            .into_iter()
            .filter(|i| i.subscription_id == sub.id)
            .collect();
        mine.sort_by(|a, b| a.number.cmp(&b.number));
        mine
    }

    async fn events(&self, t: EventType) -> Vec<Event> {
        let all: Vec<Event> = record::all_of(
            &*self.deps.store,
            &Query::partition(crate::keys::per_mode(
                &self.t.project,
                self.t.mode,
                crate::keys::PerMode::Events,
            ))
            .on(Index::Gsi1),
        )
        .await
        .unwrap();
        all.into_iter().filter(|e| e.event_type == t).collect()
    }
}

fn refusal(e: ChangeError) -> (Kind, String, Option<String>) {
    let r = Refusal::from(e);
    (r.kind, r.code.to_owned(), r.field)
}

#[tokio::test]
async fn an_upgrade_now_issues_a_proration_invoice_equal_to_its_preview() {
    for (name, store) in stores().await {
        let e = env_on(store);
        let basic = e.plan("Basic", 99_900, json!({})).await;
        let pro = e.plan("Pro", 199_900, json!({})).await;
        let sub = e.active(&basic, 1).await;
        // Ten days in: January 20 of the period January 10 to February 10.
        e.clock.advance(Duration::days(10));
        let preview = preview(&e.deps, &e.t, &sub.id, Some(pro.id.as_str()))
            .await
            .unwrap();
        assert_eq!(
            (
                preview.credit_amount,
                preview.debit_amount,
                preview.net_amount
            ),
            (67_674, 135_416, 67_742),
            "{name}"
        );
        assert_eq!(preview.period_start, Some(day(2026, 1, 10)));
        assert_eq!(preview.period_end, Some(day(2026, 2, 10)));
        assert_eq!(preview.current_plan.id, basic.id.to_string());
        assert_eq!(preview.new_plan.amount, 199_900);
        // The preview wrote nothing.
        let unchanged = subscription::get(&e.deps, &e.t, &sub.id).await.unwrap();
        assert_eq!(unchanged.version, sub.version, "{name}");
        assert_eq!(e.invoices(&sub).await.len(), 1, "{name}");

        let changed = e.change(&sub, &pro, "create_prorations").await.unwrap();
        assert!(changed.applied);
        assert_eq!(changed.subscription.plan_id, pro.id);
        assert_eq!(changed.subscription.terms.amount, 199_900);
        let inv = changed.invoice.expect("a proration invoice");
        assert_eq!(
            inv.amount_due, preview.net_amount,
            "{name}: the preview is what is billed"
        );
        assert_eq!(inv.status, InvoiceStatus::Open);
        assert_eq!(inv.due_date, day(2026, 1, 20));
        let lines: Vec<(LineKind, i64)> = inv.lines.iter().map(|l| (l.kind, l.amount)).collect();
        assert_eq!(
            lines,
            [
                (LineKind::ProrationCredit, -67_674),
                (LineKind::ProrationDebit, 135_416)
            ]
        );
        // Numbered next in the series, and claims no period: the next
        // period's invoice is still issued by the sweep.
        let all = e.invoices(&sub).await;
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].id, inv.id);
        assert!(all[1].number.ends_with("000002"), "{}", all[1].number);
        let claim = record::get::<PeriodClaim>(
            &*e.deps.store,
            &PeriodClaim::key(&sub.id, day(2026, 1, 20)),
        )
        .await
        .unwrap();
        assert!(claim.is_none());
        // subscription.updated with what the plan was.
        let updated = e.events(EventType::SubscriptionUpdated).await;
        assert_eq!(updated.len(), 1, "{name}");
        let body = updated[0].body();
        assert_eq!(body["data"]["object"]["planId"], json!(pro.id.to_string()));
        assert_eq!(
            body["data"]["previous_attributes"]["planId"],
            json!(basic.id.to_string())
        );
        assert_eq!(
            body["data"]["previous_attributes"]["plan"]["amount"],
            99_900
        );
        assert!(
            body["data"]["previous_attributes"]
                .get("quantity")
                .is_none()
        );
        // The next period bills the new plan in full.
        e.clock.advance(Duration::days(22));
        let advanced = sweep::advance(&e.deps, &changed.subscription, e.deps.clock.now())
            .await
            .unwrap();
        assert_eq!(advanced.invoices_issued, 1);
        let all = e.invoices(&sub).await;
        assert_eq!(all[2].amount_due, 199_900, "{name}");
        assert_eq!(all[2].period_start, day(2026, 2, 10));
    }
}

#[tokio::test]
async fn a_downgrade_now_issues_no_invoice_and_its_net_is_credit() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({})).await;
    let pro = e.plan("Pro", 199_900, json!({})).await;
    let sub = e.active(&pro, 1).await;
    e.clock.advance(Duration::days(10));
    let preview = preview(&e.deps, &e.t, &sub.id, Some(basic.id.as_str()))
        .await
        .unwrap();
    assert_eq!(preview.net_amount, -67_742);
    let changed = e.change(&sub, &basic, "create_prorations").await.unwrap();
    assert!(changed.invoice.is_none());
    assert_eq!(changed.credit_granted, 67_742);
    assert_eq!(changed.subscription.terms.amount, 99_900);
    assert_eq!(e.invoices(&sub).await.len(), 1);
    // The net credit is the customer's, with its ledger entry and event,
    // in the change's transaction.
    let c = customers::get(&e.deps, &e.t, &sub.customer_id)
        .await
        .unwrap();
    assert_eq!(c.credit_balance, 67_742);
    assert_eq!(e.events(EventType::CustomerCreditUpdated).await.len(), 1);
}

#[tokio::test]
async fn the_default_schedules_the_change_for_the_next_period() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({})).await;
    let pro = e.plan("Pro", 199_900, json!({})).await;
    let sub = e.active(&basic, 1).await;
    e.clock.advance(Duration::days(10));
    let body: ChangePlan = serde_json::from_value(json!({"newPlanId": pro.id})).unwrap();
    let changed = change_plan(&e.deps, &e.t, &sub.id, body).await.unwrap();
    assert!(!changed.applied);
    assert!(changed.invoice.is_none());
    let s = changed.subscription;
    assert_eq!(
        s.plan_id, basic.id,
        "the current period stays on the old plan"
    );
    let pending = s.pending_change.clone().expect("a pending change");
    assert_eq!(pending.plan_id, pro.id);
    assert_eq!(pending.effective_on, day(2026, 2, 10));
    assert!(e.events(EventType::SubscriptionUpdated).await.is_empty());
    // A day before the period ends nothing moves.
    e.clock.advance(Duration::days(20));
    let a = sweep::advance(&e.deps, &s, e.deps.clock.now())
        .await
        .unwrap();
    assert_eq!(a.subscription.plan_id, basic.id);
    // The sweep's renewal applies it, and the new period bills the new plan.
    e.clock.advance(Duration::days(2));
    let a = sweep::advance(&e.deps, &s, e.deps.clock.now())
        .await
        .unwrap();
    assert_eq!(a.invoices_issued, 1);
    assert_eq!(a.subscription.plan_id, pro.id);
    assert!(a.subscription.pending_change.is_none());
    let all = e.invoices(&sub).await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].amount_due, 199_900);
    assert_eq!(all[1].lines[0].description, "Pro");
    let updated = e.events(EventType::SubscriptionUpdated).await;
    assert_eq!(updated.len(), 1);
    assert_eq!(
        updated[0].body()["data"]["previous_attributes"]["planId"],
        json!(basic.id.to_string())
    );
}

#[tokio::test]
async fn an_effective_day_schedules_the_change_for_the_period_starting_then() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({})).await;
    let pro = e.plan("Pro", 199_900, json!({})).await;
    let sub = e.active(&basic, 1).await;
    let body: ChangePlan = serde_json::from_value(
        json!({"newPlanId": pro.id, "effectiveAt": "2026-02-15", "prorationBehavior": "none"}),
    )
    .unwrap();
    let s = change_plan(&e.deps, &e.t, &sub.id, body)
        .await
        .unwrap()
        .subscription;
    assert_eq!(
        s.pending_change.unwrap().effective_on,
        day(2026, 3, 10),
        "the first period starting on or after February 15"
    );
    // create_prorations applies now: another day is refused.
    let body: ChangePlan = serde_json::from_value(json!({"newPlanId": pro.id,
        "effectiveAt": "2026-02-15", "prorationBehavior": "create_prorations"}))
    .unwrap();
    let err = change_plan(&e.deps, &e.t, &sub.id, body).await.unwrap_err();
    assert_eq!(refusal(err).2.as_deref(), Some("effectiveAt"));
    // A day past is refused.
    let body: ChangePlan =
        serde_json::from_value(json!({"newPlanId": pro.id, "effectiveAt": "2026-01-01"})).unwrap();
    let err = change_plan(&e.deps, &e.t, &sub.id, body).await.unwrap_err();
    assert_eq!(refusal(err).2.as_deref(), Some("effectiveAt"));
}

#[tokio::test]
async fn changes_that_cannot_be_made_are_refused_and_write_nothing() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({})).await;
    let yearly = e
        .plan("Yearly", 999_000, json!({"intervalUnit": "year"}))
        .await;
    let old = e.plan("Old", 50_000, json!({})).await;
    let body: UpdatePlan = serde_json::from_value(json!({"active": false})).unwrap();
    plans::update(&e.deps, &e.t, &old.id, body).await.unwrap();
    let sub = e.active(&basic, 1).await;
    for (plan, behavior) in [(&basic, "none"), (&basic, "create_prorations")] {
        let err = e.change(&sub, plan, behavior).await.unwrap_err();
        assert_eq!(
            refusal(err),
            (
                Kind::Invalid,
                "validation_failed".into(),
                Some("newPlanId".into())
            ),
            "the current plan"
        );
    }
    let err = e.change(&sub, &yearly, "none").await.unwrap_err();
    assert_eq!(
        refusal(err).2.as_deref(),
        Some("newPlanId"),
        "another interval"
    );
    let err = e.change(&sub, &old, "none").await.unwrap_err();
    assert_eq!(
        refusal(err).2.as_deref(),
        Some("newPlanId"),
        "an inactive plan"
    );
    let err = preview(&e.deps, &e.t, &sub.id, None).await.unwrap_err();
    assert_eq!(
        refusal(err).2.as_deref(),
        Some("newPlanId"),
        "no plan named"
    );
    let err = preview(&e.deps, &e.t, &sub.id, Some("bp_nope"))
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, Kind::NotFound);
    // A cancelled subscription changes nothing.
    let pro = e.plan("Pro", 199_900, json!({})).await;
    lifecycle::cancel(&e.deps, &e.t, &sub.id, CancelSubscription::default())
        .await
        .unwrap();
    let err = e.change(&sub, &pro, "create_prorations").await.unwrap_err();
    assert_eq!(
        refusal(err).1,
        subscription::SUBSCRIPTION_STATE_CONFLICT,
        "a cancelled subscription"
    );
    let s = subscription::get(&e.deps, &e.t, &sub.id).await.unwrap();
    assert_eq!(s.plan_id, basic.id);
    assert!(s.pending_change.is_none());
    assert_eq!(e.invoices(&sub).await.len(), 1);
    assert!(e.events(EventType::SubscriptionUpdated).await.is_empty());
}

#[tokio::test]
async fn racing_upgrades_bill_one_proration() {
    for (name, store) in stores().await {
        let e = env_on(store);
        let basic = e.plan("Basic", 99_900, json!({})).await;
        let pro = e.plan("Pro", 199_900, json!({})).await;
        let sub = e.active(&basic, 1).await;
        e.clock.advance(Duration::days(5));
        let results =
            futures::future::join_all((0..8).map(|_| e.change(&sub, &pro, "create_prorations")))
                .await;
        let applied = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(applied, 1, "{name}: exactly one change applies");
        for r in results.into_iter().filter_map(Result::err) {
            assert_eq!(
                refusal(r).2.as_deref(),
                Some("newPlanId"),
                "{name}: the others find it on the plan"
            );
        }
        assert_eq!(
            e.invoices(&sub).await.len(),
            2,
            "{name}: one proration invoice"
        );
        assert_eq!(
            e.events(EventType::SubscriptionUpdated).await.len(),
            1,
            "{name}"
        );
    }
}

#[test]
fn quantities_are_checked() {
    for bad in [0, -1, i64::from(MAX_QUANTITY) + 1, i64::MAX] {
        let err = check_quantity(bad).unwrap_err();
        assert!(matches!(err, BillingError::Invalid { ref field, .. } if field == "quantity"));
    }
    assert_eq!(check_quantity(1).unwrap(), 1);
    assert_eq!(check_quantity(10_000).unwrap(), 10_000);
}

#[tokio::test]
async fn a_quantity_above_one_needs_a_per_unit_plan() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({})).await;
    let body: CreateCustomer = serde_json::from_value(json!({"name": "Sita Rai"})).unwrap();
    let c = customers::create(&e.deps, &e.t, body, None).await.unwrap();
    let body: CreateSubscription =
        serde_json::from_value(json!({"customerId": c.id, "planId": basic.id, "quantity": 2}))
            .unwrap();
    let err = lifecycle::create_subscription(&e.deps, &e.t, body, None)
        .await
        .unwrap_err();
    assert_eq!(Refusal::from(err).field.as_deref(), Some("quantity"));
    let sub = e.active(&basic, 1).await;
    let err = update_quantity(&e.deps, &e.t, &sub.id, UpdateQuantity { quantity: 3 })
        .await
        .unwrap_err();
    assert_eq!(refusal(err).2.as_deref(), Some("quantity"));
}

#[tokio::test]
async fn a_proration_invoice_adds_vat_when_tax_is_enabled_and_the_preview_says_so() {
    let e = env();
    let body: super::super::tax::UpdateTaxSettings =
        serde_json::from_value(json!({"enabled": true, "rateBps": 1300})).unwrap();
    super::super::tax::update(&e.deps, &e.t, body)
        .await
        .unwrap();
    let basic = e.plan("Basic", 99_900, json!({})).await;
    let pro = e.plan("Pro", 199_900, json!({})).await;
    let sub = e.active(&basic, 1).await;
    e.clock.advance(Duration::days(10));
    let preview = preview(&e.deps, &e.t, &sub.id, Some(pro.id.as_str()))
        .await
        .unwrap();
    // 13% of 67,742 = 8,806.46 -> 8,806.
    assert_eq!(
        (preview.net_amount, preview.tax_amount, preview.amount_due),
        (67_742, 8_806, 76_548)
    );
    let inv = e
        .change(&sub, &pro, "create_prorations")
        .await
        .unwrap()
        .invoice
        .unwrap();
    assert_eq!(inv.kind, InvoiceKind::Proration);
    assert_eq!(
        (inv.subtotal, inv.tax_total, inv.discount_total),
        (67_742, 8_806, 0)
    );
    assert_eq!(inv.amount_due, preview.amount_due);
    assert_eq!(inv.lines.last().map(|l| l.kind), Some(LineKind::Tax));
}

#[tokio::test]
async fn seats_change_now_prorated_and_the_same_quantity_changes_nothing() {
    for (name, store) in stores().await {
        let e = env_on(store);
        let team = e
            .plan("Team", 50_000, json!({"pricingModel": "per_unit"}))
            .await;
        let sub = e.active(&team, 3).await;
        assert_eq!(sub.quantity, 3);
        let first = &e.invoices(&sub).await[0];
        assert_eq!(first.amount_due, 150_000, "{name}: 3 seats");
        // January 20: 21 of 31 days remain. 3 -> 5 seats.
        e.clock.advance(Duration::days(10));
        let more = update_quantity(&e.deps, &e.t, &sub.id, UpdateQuantity { quantity: 5 })
            .await
            .unwrap();
        let p = more.proration.unwrap();
        // 21/31 x 150,000 = 101,612.90 -> 101,613; x 250,000 = 169,354.84 -> 169,355.
        assert_eq!((p.credit, p.debit), (101_613, 169_355), "{name}");
        assert_eq!(more.invoice.as_ref().unwrap().amount_due, 67_742);
        assert_eq!(more.subscription.quantity, 5);
        let updated = e.events(EventType::SubscriptionUpdated).await;
        assert_eq!(updated.len(), 1);
        assert_eq!(
            updated[0].body()["data"]["previous_attributes"],
            json!({"quantity": 3})
        );
        // The same again: nothing written, nothing billed.
        let same = update_quantity(&e.deps, &e.t, &sub.id, UpdateQuantity { quantity: 5 })
            .await
            .unwrap();
        assert!(!same.applied && same.invoice.is_none());
        assert_eq!(same.subscription.version, more.subscription.version);
        // Fewer seats: credit.
        let fewer = update_quantity(&e.deps, &e.t, &sub.id, UpdateQuantity { quantity: 2 })
            .await
            .unwrap();
        assert!(fewer.invoice.is_none());
        assert_eq!(fewer.credit_granted, 169_355 - 67_742, "{name}");
        assert_eq!(e.invoices(&sub).await.len(), 2, "{name}");
        // The next period bills 2 seats.
        e.clock.advance(Duration::days(22));
        sweep::advance(&e.deps, &fewer.subscription, e.deps.clock.now())
            .await
            .unwrap();
        // It bills 2 seats, and the downgrade's credit (1,016.13) pays it.
        let next = &e.invoices(&sub).await[2];
        assert_eq!(
            (next.total, next.credit_applied, next.amount_due),
            (100_000, 100_000, 0),
            "{name}"
        );
        assert_eq!(next.status, InvoiceStatus::Paid, "{name}");
        // A quantity change to a flat plan resets the quantity to 1.
        let flat = e.plan("Flat", 80_000, json!({})).await;
        let moved = e.change(&sub, &flat, "create_prorations").await.unwrap();
        assert_eq!(moved.subscription.quantity, 1, "{name}");
    }
}

/// One thing a merchant does to a subscription in the property test.
#[derive(Clone, Debug)]
enum Op {
    /// Change plan now (`create_prorations`) to plan `n` of the list.
    ChangeNow(usize),
    /// Schedule a change (`none`) to plan `n`.
    Schedule(usize),
    Quantity(u32),
}

/// For any sequence of upgrades, downgrades, scheduled changes and
/// quantity changes on random days across periods, what was billed
/// (period invoices' subtotals, proration invoices' nets, minus the net
/// credits granted) equals the plan time used, day by day, to within half
/// a paisa per proration line.
#[tokio::test]
async fn billed_equals_time_used() {
    use rand::{Rng, SeedableRng};
    const AMOUNTS: [(i64, bool); 4] = [
        (99_900, true),
        (149_900, true),
        (33_333, true),
        (120_000, false),
    ];
    for seed in 0..64u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let e = env();
        let mut plans = Vec::new();
        for (i, (amount, per_unit)) in AMOUNTS.iter().enumerate() {
            let extra = if *per_unit {
                json!({"pricingModel": "per_unit"})
            } else {
                json!({})
            };
            plans.push(e.plan(&format!("Plan {i}"), *amount, extra).await);
        }
        let q0 = rng.random_range(1..=4u32);
        let sub = e.active(&plans[0], q0).await;
        let start = nepal_day(e.deps.clock.now());
        // The model: the plan and quantity billed, and from when.
        let price = |plan: usize, q: u32| {
            let (amount, per_unit) = AMOUNTS[plan];
            amount * if per_unit { i64::from(q) } else { 1 }
        };
        let (mut plan, mut qty) = (0usize, q0);
        let mut pending: Option<(NaiveDate, usize)> = None;
        let mut timeline: Vec<(NaiveDate, i64)> = vec![(start, price(plan, qty))];
        // The proration days, and the net credits granted.
        let mut prorations: Vec<NaiveDate> = Vec::new();
        let mut credits: Vec<(NaiveDate, i64)> = Vec::new();
        let mut offsets: Vec<i64> = (0..rng.random_range(1..=7))
            .map(|_| rng.random_range(0..95 * 24))
            .collect();
        offsets.sort_unstable();
        let mut elapsed = 0;
        let end_hours = 96 * 24;
        for hours in offsets.into_iter().chain([end_hours]) {
            e.clock.advance(Duration::hours(hours - elapsed));
            elapsed = hours;
            let now = e.deps.clock.now();
            let today = nepal_day(now);
            let s = sweep::advance(&e.deps, &sub, now)
                .await
                .unwrap()
                .subscription;
            // A scheduled change the sweep has applied by now.
            if let Some((from, to)) = pending
                && from <= today
            {
                plan = to;
                if !AMOUNTS[plan].1 {
                    qty = 1;
                }
                timeline.push((from, price(plan, qty)));
                pending = None;
            }
            assert_eq!(s.plan_id, plans[plan].id, "seed {seed}: the model's plan");
            assert_eq!(s.quantity, qty, "seed {seed}: the model's quantity");
            if hours == end_hours {
                break;
            }
            let op = match rng.random_range(0..3) {
                0 => Op::ChangeNow(rng.random_range(0..plans.len())),
                1 => Op::Schedule(rng.random_range(0..plans.len())),
                _ => Op::Quantity(rng.random_range(1..=5)),
            };
            let done = match &op {
                Op::ChangeNow(n) => e.change(&s, &plans[*n], "create_prorations").await,
                Op::Schedule(n) => e.change(&s, &plans[*n], "none").await,
                Op::Quantity(q) => {
                    let body = UpdateQuantity {
                        quantity: i64::from(*q),
                    };
                    update_quantity(&e.deps, &e.t, &s.id, body).await
                }
            };
            let Ok(done) = done else { continue };
            match op {
                Op::ChangeNow(n) => {
                    plan = n;
                    if !AMOUNTS[plan].1 {
                        qty = 1;
                    }
                    pending = None;
                }
                Op::Schedule(n) => {
                    let on = done
                        .subscription
                        .pending_change
                        .as_ref()
                        .unwrap()
                        .effective_on;
                    pending = Some((on, n));
                }
                Op::Quantity(q) => qty = q,
            }
            if let Some(p) = done.proration {
                assert_eq!(p.day, today);
                prorations.push(today);
                timeline.push((today, price(plan, qty)));
                if done.credit_granted > 0 {
                    credits.push((today, done.credit_granted));
                }
            }
        }
        let last = subscription::get(&e.deps, &e.t, &sub.id).await.unwrap();
        let invoices = e.invoices(&sub).await;
        for index in 0..=last.period_index {
            let p = last.period(index).unwrap();
            let total = (p.end_exclusive - p.start).num_days();
            let inside = |d: &NaiveDate| *d >= p.start && *d < p.end_exclusive;
            let billed: i64 = invoices
                .iter()
                .filter(|i| match i.kind {
                    InvoiceKind::Cycle => i.period_start == p.start,
                    InvoiceKind::Proration => inside(&i.period_start),
                })
                .map(|i| i.subtotal)
                .sum::<i64>()
                - credits
                    .iter()
                    .filter(|(d, _)| inside(d))
                    .map(|(_, c)| c)
                    .sum::<i64>();
            // Price x days, per day: the price in effect that day.
            let used_x_total: i128 = p
                .start
                .iter_days()
                .take_while(|d| *d < p.end_exclusive)
                .map(|d| {
                    let price = timeline
                        .iter()
                        .rev()
                        .find(|(from, _)| *from <= d)
                        .map_or(0, |(_, price)| *price);
                    i128::from(price)
                })
                .sum();
            let lines = 2 * prorations.iter().filter(|d| inside(d)).count() as i128;
            let error = 2 * (i128::from(billed) * i128::from(total) - used_x_total);
            assert!(
                error.abs() <= lines * i128::from(total),
                "seed {seed}, period {index} ({} to {}): billed {billed}, used {} x {total} days, \
                 {lines} proration lines; timeline {timeline:?}",
                p.start,
                p.end_exclusive,
                used_x_total as f64 / total as f64,
            );
        }
    }
}

#[tokio::test]
async fn a_change_scheduled_in_a_trial_bills_the_first_period_even_when_the_trial_ends_early() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({"trialDays": 14})).await;
    let pro = e.plan("Pro", 199_900, json!({})).await;
    let body: CreateCustomer = serde_json::from_value(json!({"name": "Sita Rai"})).unwrap();
    let c = customers::create(&e.deps, &e.t, body, None).await.unwrap();
    let body: CreateSubscription =
        serde_json::from_value(json!({"customerId": c.id, "planId": basic.id})).unwrap();
    let sub = lifecycle::create_subscription(&e.deps, &e.t, body, None)
        .await
        .unwrap()
        .subscription;
    assert_eq!(sub.status, SubscriptionStatus::Trialing);
    // Nothing billed yet: the preview prorates nothing.
    let p = preview(&e.deps, &e.t, &sub.id, Some(pro.id.as_str()))
        .await
        .unwrap();
    assert_eq!((p.net_amount, p.period_start), (0, None));
    let s = e.change(&sub, &pro, "none").await.unwrap().subscription;
    assert!(s.pending_change.is_some());
    e.clock.advance(Duration::days(3));
    let ended = lifecycle::end_trial(&e.deps, &e.t, &sub.id, e.deps.clock.now())
        .await
        .unwrap();
    assert_eq!(ended.subscription.plan_id, pro.id);
    assert!(ended.subscription.pending_change.is_none());
    assert_eq!(ended.invoice.invoice.amount_due, 199_900);
    // The plan changed: `subscription.updated`, as when the sweep applies it.
    let updated = e.events(EventType::SubscriptionUpdated).await;
    assert_eq!(updated.len(), 1, "{updated:?}");
    assert_eq!(updated[0].object["planId"], pro.id.as_str());
    assert_eq!(
        updated[0]
            .previous_attributes
            .as_ref()
            .map(|p| p["planId"].clone()),
        Some(json!(basic.id.as_str()))
    );
}

/// A proration invoice left unpaid past its grace end is marked overdue
/// by the sweep, and the plan's overdue action taken, as a cycle
/// invoice's; one paid in time is left alone.
#[tokio::test]
async fn an_unpaid_proration_invoice_goes_overdue_like_a_cycle_invoice() {
    let e = env();
    let basic = e.plan("Basic", 99_900, json!({"gracePeriodDays": 3})).await;
    let pro = e.plan("Pro", 199_900, json!({"gracePeriodDays": 3})).await;
    let sub = e.active(&basic, 1).await;
    // Past period 0's own grace end: only the proration's is left.
    let sub = sweep::advance(&e.deps, &sub, at("2026-01-15T00:00:00Z"))
        .await
        .unwrap()
        .subscription;
    e.clock.advance(Duration::days(10));
    let changed = e.change(&sub, &pro, "create_prorations").await.unwrap();
    let inv = changed.invoice.expect("a proration invoice");
    assert_eq!(inv.overdue_on, day(2026, 1, 23));
    let s = changed.subscription;
    assert_eq!(s.grace_pending.len(), 1);
    assert_eq!(
        s.next_due_at,
        crate::domain::billing::calendar::nepal_day_start(day(2026, 1, 23))
    );
    assert_eq!(
        sweep::next_step(&s, at("2026-01-23T00:00:00Z")),
        Some(sweep::Step::ProrationGrace)
    );
    let after = sweep::advance(&e.deps, &s, at("2026-01-23T00:00:00Z"))
        .await
        .unwrap()
        .subscription;
    assert!(after.grace_pending.is_empty());
    assert_eq!(after.status, SubscriptionStatus::PastDue);
    let stored = invoice::get_invoice(&e.deps, &e.t, &inv.id).await.unwrap();
    assert_eq!(stored.status, InvoiceStatus::Overdue);
    let overdue = e.events(EventType::BillingInvoiceOverdue).await;
    assert_eq!(overdue.len(), 1, "{overdue:?}");
}
