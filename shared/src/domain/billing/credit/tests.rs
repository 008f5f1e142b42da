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
