use std::sync::Arc;

use serde_json::json;

use super::{AddCredit, CreditActor, CreditReason, add, ledger, next_balance, note};
use crate::domain::billing::customers::{self, BillingError, CreateCustomer};
use crate::domain::outbox::EventType;
use crate::domain::{Mode, Tenant};
use crate::ids::{ApiKeyId, ProjectId};
use crate::refusal::Refusal;
use crate::store::Store;
use crate::testenv::memory_store;
use crate::time::SystemClock;

fn deps(store: &Arc<dyn Store>) -> crate::AppState {
    crate::AppState::new(
        store.clone(),
        Arc::new(SystemClock),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn tenant() -> Tenant {
    Tenant::new(ProjectId::stored("p1"), Mode::Sandbox)
}

fn field_of(e: BillingError) -> String {
    Refusal::from(e).field.unwrap_or_default()
}

fn body(amount: i64, note: Option<&str>) -> AddCredit {
    AddCredit {
        amount,
        note: note.map(str::to_owned),
    }
}

fn actor() -> CreditActor {
    CreditActor::ApiKey {
        key_id: ApiKeyId::new(),
    }
}

async fn customer(d: &crate::AppState) -> crate::domain::billing::customers::Customer {
    let b: CreateCustomer =
        serde_json::from_value(json!({"name": "Sita"})).unwrap_or_else(|e| panic!("{e}"));
    customers::create(d, &tenant(), b, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_balance_rules() {
    assert_eq!(next_balance(0, 500).ok(), Some(500));
    assert_eq!(next_balance(500, -500).ok(), Some(0));
    for (balance, amount) in [(0, 0), (100, -101), (0, -1), (i64::MAX, 1), (1, i64::MAX)] {
        match next_balance(balance, amount) {
            Err(e) => assert_eq!(field_of(e), "amount", "{balance} {amount}"),
            Ok(b) => panic!("{balance} + {amount} accepted: {b}"),
        }
    }
    assert_eq!(note(Some("  ")).ok(), Some(None));
    assert_eq!(
        note(Some(" goodwill\nfor the outage ")).ok(),
        Some(Some("goodwill\nfor the outage".to_owned()))
    );
    for bad in ["x".repeat(501), "a\u{7}b".to_owned()] {
        match note(Some(&bad)) {
            Err(e) => assert_eq!(field_of(e), "note"),
            Ok(n) => panic!("accepted {n:?}"),
        }
    }
}

#[tokio::test]
async fn a_ledger_keeps_every_change_with_its_balance() {
    let store = memory_store();
    let d = deps(&store);
    let c = customer(&d).await;
    let (after, entry) = add(
        &d,
        &tenant(),
        &c.id,
        body(50_000, Some("advance")),
        actor(),
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(after.credit_balance, 50_000);
    let entry = entry.unwrap_or_else(|| panic!("an entry"));
    assert!(entry.id.as_str().starts_with("cbt_"));
    assert_eq!(entry.balance_after, 50_000);
    assert_eq!(entry.reason, CreditReason::Manual);
    let (after, _) = add(&d, &tenant(), &c.id, body(-20_000, None), actor(), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(after.credit_balance, 30_000);
    // Beyond the balance, 0, an overflow: refused, nothing stored.
    for amount in [-30_001, 0, i64::MAX] {
        let refused = add(&d, &tenant(), &c.id, body(amount, None), actor(), None).await;
        match refused {
            Err(e) => assert_eq!(field_of(e), "amount"),
            Ok(c) => panic!("{amount} accepted: {c:?}"),
        }
    }
    let stored = customers::get(&d, &tenant(), &c.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((stored.credit_balance, stored.credit_entries), (30_000, 2));
    let entries = ledger(&d, &tenant(), &c.id, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: Vec<(i64, i64)> = entries
        .iter()
        .map(|e| (e.amount, e.balance_after))
        .collect();
    assert_eq!(
        seen,
        vec![(-20_000, 30_000), (50_000, 50_000)],
        "newest first"
    );
    assert_eq!(entries[1].note.as_deref(), Some("advance"));
    // One webhook per change, the customer with its balance.
    let events = crate::domain::outbox::recent(&*store, &tenant(), 50)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let balances: Vec<i64> = events
        .into_iter()
        .filter(|e| e.event_type == EventType::CustomerCreditUpdated)
        .filter_map(|e| e.object["creditBalance"].as_i64())
        .collect();
    assert_eq!(balances.len(), 2, "{balances:?}");
    assert!(balances.contains(&50_000) && balances.contains(&30_000));
    // Another tenant's customer is not found.
    let other = Tenant::new(ProjectId::stored("p2"), Mode::Sandbox);
    assert!(matches!(
        add(&d, &other, &c.id, body(1, None), actor(), None).await,
        Err(BillingError::NotFound { .. })
    ));
}

/// 20 deductions racing for a balance that covers 10: exactly 10 are
/// taken, the balance ends at 0 and the ledger holds 10 deductions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_deductions_never_take_the_balance_below_zero() {
    let store = memory_store();
    let d = deps(&store);
    let c = customer(&d).await;
    add(&d, &tenant(), &c.id, body(10_000, None), actor(), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let d = d.clone();
        let id = c.id.clone();
        tasks.push(tokio::spawn(async move {
            add(&d, &tenant(), &id, body(-1_000, None), actor(), None).await
        }));
    }
    let (mut taken, mut refused) = (0, 0);
    for t in tasks {
        match t.await {
            Ok(Ok(_)) => taken += 1,
            Ok(Err(e)) => {
                assert_eq!(field_of(e), "amount");
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((taken, refused), (10, 10));
    let stored = customers::get(&d, &tenant(), &c.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stored.credit_balance, 0);
    let entries = ledger(&d, &tenant(), &c.id, 100)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(entries.len(), 11);
    let mut after: Vec<i64> = entries.iter().map(|e| e.balance_after).collect();
    after.sort_unstable();
    assert_eq!(after, (0..=10).map(|n| n * 1_000).collect::<Vec<_>>());
}

mod invoices {
    use super::*;
    use crate::domain::Provider;
    use crate::domain::billing::customers::Customer;
    use crate::domain::billing::invoice::{
        InvoiceStatus, OverpaymentRefund, PayOutcome, PaymentSource, issue_invoice, pay_invoice,
    };
    use crate::domain::billing::subscription::{NewSubscription, Subscription};
    use crate::domain::billing::tax::{self, UpdateTaxSettings};
    use crate::domain::billing::terms::monthly;
    use crate::testenv::at;

    async fn subscription(d: &crate::AppState, c: &Customer) -> Subscription {
        let now = at("2026-01-10T06:00:00Z");
        let input = NewSubscription {
            customer_id: c.id.clone(),
            ..crate::domain::billing::testenv::sub_input(now, monthly())
        };
        crate::domain::billing::testenv::stored_sub(d, &tenant(), input).await
    }

    async fn settings(d: &crate::AppState, v: serde_json::Value) {
        let body: UpdateTaxSettings = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        tax::update(d, &tenant(), body)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// VAT on the plan price (rounded half up), then the credit against
    /// the total; the ledger says which invoice took it.
    #[tokio::test]
    async fn an_invoice_takes_the_vat_and_the_credit_and_the_ledger_says_so() {
        let store = memory_store();
        let d = deps(&store);
        settings(
            &d,
            json!({"enabled": true, "rateBps": 1300, "registrationNumber": "301234567"}),
        )
        .await;
        let c = customer(&d).await;
        add(&d, &tenant(), &c.id, body(50_000, None), actor(), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sub = subscription(&d, &c).await;
        let now = at("2026-01-10T07:00:00Z");
        let period = sub.current_period().unwrap_or_else(|| panic!("a period"));
        let inv = issue_invoice(&d, &sub, period, now)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .invoice;
        // 99,900 x 13% = 12,987 paisa.
        assert_eq!(
            (
                inv.subtotal,
                inv.tax_total,
                inv.total,
                inv.credit_applied,
                inv.amount_due
            ),
            (99_900, 12_987, 112_887, 50_000, 62_887)
        );
        let t = inv.tax.clone().unwrap_or_else(|| panic!("a tax snapshot"));
        assert_eq!(
            (t.rate_bps, t.registration_number.as_deref()),
            (1300, Some("301234567"))
        );
        assert_eq!(inv.status, InvoiceStatus::Open);
        let entries = ledger(&d, &tenant(), &c.id, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(entries[0].reason, CreditReason::InvoiceApplied);
        assert_eq!((entries[0].amount, entries[0].balance_after), (-50_000, 0));
        assert_eq!(entries[0].invoice_id.as_ref(), Some(&inv.id));
        assert_eq!(entries[0].actor, CreditActor::System);
        // A later rate does not rewrite the invoice.
        settings(&d, json!({"rateBps": 1500})).await;
        let read = crate::domain::billing::invoice::get_invoice(&d, &tenant(), &inv.id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read.tax.as_ref().map(|t| t.rate_bps), Some(1300));
        let view = crate::domain::billing::invoice::view::InvoiceView::of(&read, "http://x");
        assert_eq!(view.fiscal_year.as_deref(), Some("2082/83"));
    }

    /// Credit that covers the invoice: it is issued paid, the rest kept.
    #[tokio::test]
    async fn credit_covering_the_invoice_issues_it_paid() {
        let store = memory_store();
        let d = deps(&store);
        let c = customer(&d).await;
        add(&d, &tenant(), &c.id, body(150_000, None), actor(), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sub = subscription(&d, &c).await;
        let now = at("2026-01-10T07:00:00Z");
        let period = sub.current_period().unwrap_or_else(|| panic!("a period"));
        let inv = issue_invoice(&d, &sub, period, now)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .invoice;
        assert_eq!((inv.credit_applied, inv.amount_due), (99_900, 0));
        assert_eq!(inv.status, InvoiceStatus::Paid);
        assert_eq!(inv.tax, None, "tax is off by default");
        let stored = customers::get(&d, &tenant(), &c.id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stored.credit_balance, 50_100);
    }

    /// Credit that moved between what the issue read and its write makes
    /// the write fail (the issue reads again): nothing taken twice.
    #[tokio::test]
    async fn a_balance_that_moved_fails_the_invoices_write() {
        let store = memory_store();
        let d = deps(&store);
        let c = customer(&d).await;
        add(&d, &tenant(), &c.id, body(10_000, None), actor(), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let now = at("2026-01-10T07:00:00Z");
        let (available, hook) = super::super::invoice_credit(&d, &tenant(), &c.id, now)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(available, 10_000);
        let hook = hook.unwrap_or_else(|| panic!("a hook"));
        // Spent elsewhere meanwhile.
        add(&d, &tenant(), &c.id, body(-10_000, None), actor(), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sub = subscription(&d, &c).await;
        let period = sub.current_period().unwrap_or_else(|| panic!("a period"));
        let mut inv = crate::domain::billing::invoice::invoice_for(
            &sub,
            period,
            "PI-1".into(),
            now,
            &crate::domain::billing::adjust::Adjustments::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        inv.credit_applied = 10_000;
        let ops = hook(&inv).unwrap_or_else(|e| panic!("{e}"));
        let Err(e) = store.transact(ops).await else {
            panic!("written on a moved balance")
        };
        assert!(e.is_condition_failure(), "{e}");
        let stored = customers::get(&d, &tenant(), &c.id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stored.credit_balance, 0);
    }

    /// `overpaymentHandling: credit`: a second payment of a paid invoice
    /// becomes the customer's credit, once, with no refund to ask.
    #[tokio::test]
    async fn an_overpayment_is_kept_as_credit_once_when_the_merchant_says_so() {
        let store = memory_store();
        let d = deps(&store);
        settings(&d, json!({"overpaymentHandling": "credit"})).await;
        let c = customer(&d).await;
        let sub = subscription(&d, &c).await;
        let now = at("2026-01-10T07:00:00Z");
        let period = sub.current_period().unwrap_or_else(|| panic!("a period"));
        let inv = issue_invoice(&d, &sub, period, now)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .invoice;
        let online = |p: &str| PaymentSource::Online {
            payment_id: p.into(),
            provider: Provider::Khalti,
        };
        let paid = pay_invoice(&d, &tenant(), &inv.id, online("pay_a"), 99_900, now)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(paid, PayOutcome::Paid(_)));
        for _ in 0..2 {
            let over = pay_invoice(&d, &tenant(), &inv.id, online("pay_b"), 99_900, now)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let PayOutcome::Overpayment(over) = over else {
                panic!("{over:?}")
            };
            assert_eq!(over.overpayments.len(), 1);
            assert_eq!(
                over.overpayments[0].refund_status,
                OverpaymentRefund::Credited
            );
        }
        let stored = customers::get(&d, &tenant(), &c.id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stored.credit_balance, 99_900, "credited once");
        let entries = ledger(&d, &tenant(), &c.id, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].reason, CreditReason::Overpayment);
        // No refund for the sweep to ask.
        let due = store
            .get(&crate::domain::billing::invoice::refund_due::RefundDue::key(&"pay_b".into()))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(due.is_none());
    }
}
