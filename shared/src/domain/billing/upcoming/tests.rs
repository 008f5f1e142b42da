use std::sync::Arc;

use super::*;
use crate::AppState;
use crate::domain::billing::calendar::nepal_day_start;
use crate::domain::billing::invoice::{InvoiceStatus, issue_invoice};
use crate::domain::billing::items::{self, CreateItem};
use crate::domain::billing::subscription::{self, SubscriptionStatus as S};
use crate::domain::billing::sweep::{self, Step, next_step};
use crate::domain::billing::terms::{PricingModel, Terms, monthly};
use crate::domain::billing::testenv::{deps_at, stores};
use crate::domain::billing::testenv::{stored_sub, sub_input};
use crate::domain::billing::usage::{self, UsageAction, UsageEvent};
use crate::domain::outbox;
use crate::domain::{Mode, Tenant};
use crate::store::Store;
use crate::testenv::at;

/// The deps, their clock at 2026-01-25 (period 0 open for usage).
fn deps_with(store: Arc<dyn Store>, _now: &str) -> AppState {
    deps_at(store, "2026-01-25T06:00:00Z")
}

const START: &str = "2026-01-10T06:00:00Z";
/// Period 0 ends 2026-02-10 (00:00 Nepal: 2026-02-09T18:15Z); its
/// upcoming moment is three days before.
const MOMENT: &str = "2026-02-06T18:15:00Z";

fn metered() -> Terms {
    Terms {
        amount: 10,
        description: "API calls".into(),
        pricing_model: PricingModel::Metered,
        ..monthly()
    }
}

/// An active subscription of `terms` billing from [`START`], its first
/// invoice paid.
async fn active(deps: &AppState, project: &str, terms: Terms) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    let sub = stored_sub(deps, &tenant, sub_input(at(START), terms)).await;
    let inv = issue_invoice(deps, &sub, sub.period(0).unwrap(), at(START))
        .await
        .unwrap()
        .invoice;
    if inv.status != InvoiceStatus::Paid {
        let source = crate::domain::billing::invoice::PaymentSource::Online {
            payment_id: format!("pay_{}", sub.id).as_str().into(),
            provider: crate::domain::Provider::Khalti,
        };
        crate::domain::billing::invoice::pay_invoice(
            deps,
            &tenant,
            &inv.id,
            source,
            inv.amount_due,
            at(START),
        )
        .await
        .unwrap();
    }
    let now = subscription::get(deps, &tenant, &sub.id).await.unwrap();
    assert_eq!(now.status, S::Active);
    // Past period 0's grace end (nothing else due until the moment).
    let now = sweep::advance(deps, &now, at("2026-01-20T00:00:00Z"))
        .await
        .unwrap()
        .subscription;
    assert_eq!(now.overdue_next, 1);
    now
}

async fn use_units(deps: &AppState, sub: &Subscription, q: u64, ts: &str) {
    let e = UsageEvent {
        quantity: q,
        action: UsageAction::Increment,
        timestamp: Some(at(ts)),
        idempotency_key: None,
    };
    usage::report(deps, &sub.tenant(), &sub.id, vec![e])
        .await
        .unwrap();
}

async fn upcoming_events(deps: &AppState, tenant: &Tenant) -> Vec<serde_json::Value> {
    outbox::recent(&*deps.store, tenant, 200)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == EventType::InvoiceUpcoming)
        .map(|e| e.object)
        .collect()
}

#[tokio::test]
async fn the_moment_is_three_days_before_a_metered_or_itemised_period_ends() {
    let deps = deps_with(crate::testenv::memory_store(), START);
    let sub = active(&deps, "p1", metered()).await;
    let end = sub.period(0).unwrap().end_exclusive;
    assert_eq!(sub.upcoming_at(), Some((at(MOMENT), end)));
    assert_eq!(
        nepal_day_start(end).map(|e| e.plus(-UPCOMING_BEFORE)),
        Some(at(MOMENT))
    );
    assert_eq!(next_step(&sub, at("2026-02-06T18:14:59Z")), None);
    assert_eq!(next_step(&sub, at(MOMENT)), Some(Step::Upcoming));
    let handled = Subscription {
        upcoming_for: Some(end),
        ..sub.clone()
    };
    assert_eq!(handled.upcoming_at(), None, "once per period");
    let cancelling = Subscription {
        cancel_at_period_end: true,
        ..sub.clone()
    };
    assert_eq!(cancelling.upcoming_at(), None, "no next invoice");
    let paused = Subscription {
        status: S::Paused,
        ..sub.clone()
    };
    assert_eq!(paused.upcoming_at(), None);
    // A flat plan: only once it has had an item.
    let flat = active(&deps, "p2", monthly()).await;
    assert_eq!(flat.upcoming_at(), None);
    assert_eq!(flat.due_at(), flat.next_due_at);
    let body = CreateItem {
        amount: 50_000,
        description: "Installation".into(),
        quantity: None,
    };
    items::create(&deps, &flat.tenant(), &flat.id, body, None)
        .await
        .unwrap();
    let flat = subscription::get(&deps, &flat.tenant(), &flat.id)
        .await
        .unwrap();
    assert!(flat.has_items);
    assert_eq!(flat.next_due_at, Some(at(MOMENT)), "indexed for it");
    // A daily plan's period has no moment inside it.
    let mut daily = sub.clone();
    daily.terms.interval_unit = crate::domain::billing::period::IntervalUnit::Day;
    assert_eq!(daily.upcoming_at(), None);
}

/// The draft is what the invoice would be now, read only: the seal does
/// not move (usage after it still counts on the real invoice), no
/// invoice is stored, and it is sent once.
#[tokio::test]
async fn a_metered_period_sends_its_draft_once_and_the_invoice_follows() {
    let deps = deps_with(crate::testenv::memory_store(), START);
    let sub = active(&deps, "p1", metered()).await;
    let t = sub.tenant();
    use_units(&deps, &sub, 120, "2026-01-15T06:00:00Z").await;
    let first = sweep::advance(&deps, &sub, at("2026-02-07T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!((first.steps, first.invoices_issued), (1, 0));
    assert_eq!(
        first.subscription.upcoming_for,
        Some(sub.period(0).unwrap().end_exclusive)
    );
    let sent = upcoming_events(&deps, &t).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let draft = &sent[0];
    assert_eq!(draft["status"], "draft");
    assert_eq!(draft["id"], serde_json::Value::Null);
    assert_eq!(draft["number"], serde_json::Value::Null);
    assert_eq!(draft["payUrl"], serde_json::Value::Null);
    assert_eq!(draft["subscriptionId"], sub.id.as_str());
    assert_eq!(draft["periodStart"], "2026-02-10");
    assert_eq!(draft["lines"][0]["kind"], "usage");
    assert_eq!(draft["lines"][0]["quantity"], 120);
    assert_eq!(draft["amountDue"], 1_200);
    // Again at the same time, or later in the period: nothing more.
    let again = sweep::advance(&deps, &first.subscription, at("2026-02-08T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(again.steps, 0);
    assert_eq!(upcoming_events(&deps, &t).await.len(), 1);
    // Usage after the draft still lands in period 0 (nothing was sealed).
    use_units(&deps, &sub, 5, "2026-01-25T06:01:00Z").await;
    let issued = sweep::advance(&deps, &first.subscription, at("2026-02-10T06:00:00Z"))
        .await
        .unwrap();
    assert_eq!(issued.invoices_issued, 1);
    let invoices: Vec<BillingInvoice> = crate::domain::record::all_of(
        &*deps.store,
        &crate::store::Query::partition(BillingInvoice::list_partition(&t))
            .on(crate::store::Index::Gsi1),
    )
    .await
    .unwrap();
    let second = invoices
        .iter()
        .find(|i| i.period_start == sub.period(1).unwrap().start)
        .unwrap_or_else(|| panic!("{invoices:?}"));
    assert_eq!(second.lines[0].quantity, 125);
    assert_eq!(upcoming_events(&deps, &t).await.len(), 1);
}

/// No usage and no items: the moment is recorded, nothing is sent; a
/// sweep that comes only after the period ended sends nothing either.
#[tokio::test]
async fn nothing_to_bill_or_too_late_sends_nothing() {
    let deps = deps_with(crate::testenv::memory_store(), START);
    let sub = active(&deps, "p1", metered()).await;
    let done = sweep::advance(&deps, &sub, at("2026-02-07T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!((done.steps, done.invoices_issued), (1, 0));
    assert!(done.subscription.upcoming_for.is_some());
    assert!(upcoming_events(&deps, &sub.tenant()).await.is_empty());

    let late = active(&deps, "p2", metered()).await;
    use_units(&deps, &late, 3, "2026-01-15T06:00:00Z").await;
    let done = sweep::advance(&deps, &late, at("2026-02-11T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!((done.steps, done.invoices_issued), (2, 1));
    assert!(upcoming_events(&deps, &late.tenant()).await.is_empty());
}

/// A flat plan with a pending item: the draft has the price and the item.
#[tokio::test]
async fn a_pending_item_on_a_flat_plan_is_announced() {
    let deps = deps_with(crate::testenv::memory_store(), START);
    let sub = active(&deps, "p1", monthly()).await;
    let body = CreateItem {
        amount: 50_000,
        description: "Installation".into(),
        quantity: Some(2),
    };
    items::create(&deps, &sub.tenant(), &sub.id, body, None)
        .await
        .unwrap();
    let sub = subscription::get(&deps, &sub.tenant(), &sub.id)
        .await
        .unwrap();
    sweep::advance(&deps, &sub, at("2026-02-07T00:00:00Z"))
        .await
        .unwrap();
    let sent = upcoming_events(&deps, &sub.tenant()).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let kinds: Vec<&str> = sent[0]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["kind"].as_str())
        .collect();
    assert_eq!(kinds, vec!["subscription", "item"]);
    assert_eq!(
        sent[0]["subtotal"],
        sub.terms.amount + 100_000,
        "{}",
        sent[0]
    );
    // The item is still pending: the draft consumed nothing.
    let pending = items::pending(&deps, &sub.id).await.unwrap();
    assert_eq!(pending.len(), 1);
}

/// Sweeps racing for the same moment send it once, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_sweeps_send_it_once() {
    for (name, store) in stores().await {
        let deps = deps_with(store, START);
        let sub = active(&deps, "p1", metered()).await;
        use_units(&deps, &sub, 7, "2026-01-15T06:00:00Z").await;
        let runs = (0..8).map(|_| {
            let (deps, sub) = (deps.clone(), sub.clone());
            tokio::spawn(async move {
                sweep::advance(&deps, &sub, at("2026-02-07T00:00:00Z"))
                    .await
                    .map(|a| a.steps)
            })
        });
        let mut steps = 0;
        for r in futures::future::join_all(runs).await {
            steps += r.unwrap().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert_eq!(steps, 1, "{name}: one write took the step");
        let sent = upcoming_events(&deps, &sub.tenant()).await;
        assert_eq!(sent.len(), 1, "{name}: {sent:?}");
    }
}
