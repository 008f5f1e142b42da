use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::AppState;
use crate::domain::billing::testenv::{deps_at, stores};
use crate::domain::billing::usage::tests::subscription;
use crate::store::Store;

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, "2026-01-10T06:00:00Z")
}

fn body(v: serde_json::Value) -> CreateItem {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn bad_items_name_their_field() {
    for (v, field) in [
        (json!({"amount": 0, "description": "Setup"}), "amount"),
        (json!({"amount": -5, "description": "Setup"}), "amount"),
        (
            json!({"amount": 10_000_000_001i64, "description": "Setup"}),
            "amount",
        ),
        (json!({"amount": 100, "description": "  "}), "description"),
        (
            json!({"amount": 100, "description": "x".repeat(501)}),
            "description",
        ),
        (
            json!({"amount": 100, "description": "Setup", "quantity": 0}),
            "quantity",
        ),
        (
            json!({"amount": 100, "description": "Setup", "quantity": -1}),
            "quantity",
        ),
        (
            json!({"amount": 100, "description": "Setup", "quantity": 10_001}),
            "quantity",
        ),
    ] {
        match checked(&body(v.clone())) {
            Err(e) => assert_eq!(Refusal::from(e).field.as_deref(), Some(field), "{v}"),
            Ok(got) => panic!("accepted {v}: {got:?}"),
        }
    }
    assert_eq!(
        checked(&body(
            json!({"amount": 150_000, "description": " Installation "})
        ))
        .unwrap(),
        (150_000, "Installation".to_owned(), 1)
    );
    assert!(
        serde_json::from_value::<CreateItem>(json!({"amount": 1, "description": "a", "x": 1}))
            .is_err()
    );
}

#[tokio::test]
async fn items_are_listed_until_invoiced_and_only_pending_ones_deleted() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let t = sub.tenant();
    let a = create(
        &deps,
        &t,
        &sub.id,
        body(json!({"amount": 50_000, "description": "Installation", "quantity": 2})),
        None,
    )
    .await
    .unwrap();
    let b = create(
        &deps,
        &t,
        &sub.id,
        body(json!({"amount": 100, "description": "Cable"})),
        None,
    )
    .await
    .unwrap();
    assert_eq!(a.total(), 100_000);
    let listed = list_pending(&deps, &t, &sub.id).await.unwrap();
    assert_eq!(
        listed.iter().map(|i| &i.id).collect::<Vec<_>>(),
        vec![&a.id, &b.id],
        "oldest first"
    );
    // Taken by an invoice: no longer pending, and not deleted.
    let invoice: BillingInvoiceId = "inv_1".into();
    deps.store
        .transact(consume_ops(
            std::slice::from_ref(&a),
            &invoice,
            deps.clock.now(),
        ))
        .await
        .unwrap();
    assert_eq!(
        list_pending(&deps, &t, &sub.id).await.unwrap(),
        vec![b.clone()]
    );
    let refused = delete(&deps, &t, &sub.id, &a.id).await;
    let Err(e) = refused else {
        panic!("deleted an invoiced item")
    };
    assert_eq!(Refusal::from(e).code, "invoice_item_invoiced");
    // Taken twice: the condition refuses it.
    assert!(
        deps.store
            .transact(consume_ops(
                std::slice::from_ref(&a),
                &invoice,
                deps.clock.now()
            ))
            .await
            .is_err()
    );
    delete(&deps, &t, &sub.id, &b.id).await.unwrap();
    assert!(list_pending(&deps, &t, &sub.id).await.unwrap().is_empty());
    let gone = delete(&deps, &t, &sub.id, &b.id).await;
    let Err(e) = gone else {
        panic!("deleted twice")
    };
    assert_eq!(Refusal::from(e).code, "not_found");
    // Another tenant's subscription is not found.
    let other = Tenant::new("p2", Mode::Sandbox);
    assert!(list_pending(&deps, &other, &sub.id).await.is_err());
    assert!(
        create(
            &deps,
            &other,
            &sub.id,
            body(json!({"amount": 1, "description": "x"})),
            None
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn at_most_forty_items_wait() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "p1").await;
    let t = sub.tenant();
    for _ in 0..MAX_PENDING {
        create(
            &deps,
            &t,
            &sub.id,
            body(json!({"amount": 1, "description": "x"})),
            None,
        )
        .await
        .unwrap();
    }
    let Err(e) = create(
        &deps,
        &t,
        &sub.id,
        body(json!({"amount": 1, "description": "x"})),
        None,
    )
    .await
    else {
        panic!("a 41st item")
    };
    assert_eq!(Refusal::from(e).code, "invoice_item_limit");
}

/// An invoice taking an item races its delete, on both backends: exactly
/// one wins, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_racing_the_invoice_leaves_the_item_on_exactly_one_side() {
    for (name, store) in stores().await {
        let deps = deps_on(store);
        let sub = subscription(&deps, "p1").await;
        let t = sub.tenant();
        for round in 0..20 {
            let item = create(
                &deps,
                &t,
                &sub.id,
                body(json!({"amount": 100, "description": "x"})),
                None,
            )
            .await
            .unwrap();
            let invoice: BillingInvoiceId = format!("inv_{round}").as_str().into();
            let ops = consume_ops(std::slice::from_ref(&item), &invoice, deps.clock.now());
            let (d2, t2, s2, i2) = (deps.clone(), t.clone(), sub.id.clone(), item.id.clone());
            let deleting = tokio::spawn(async move { delete(&d2, &t2, &s2, &i2).await });
            let issued = deps.store.transact(ops).await;
            let deleted = deleting.await.unwrap();
            let stored = crate::domain::record::get::<InvoiceItem>(&*deps.store, &item.item_key())
                .await
                .unwrap();
            match (issued.is_ok(), deleted.is_ok()) {
                (true, false) => {
                    let s = stored.unwrap_or_else(|| panic!("{name}: invoiced item gone"));
                    assert_eq!(s.status, ItemStatus::Invoiced, "{name}");
                    assert_eq!(s.invoice_id, Some(invoice), "{name}");
                }
                (false, true) => assert!(stored.is_none(), "{name}"),
                other => panic!("{name}: round {round}: issue and delete both {other:?}"),
            }
            assert_eq!(
                pending_count(&deps, &sub.id).await.unwrap(),
                0,
                "{name}: round {round}: counted out once"
            );
        }
    }
}

/// Creates racing at one below the cap, on both backends: exactly one
/// wins, the others are refused `invoice_item_limit`; a delete and an
/// invoice taking the items give their places back, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_at_the_cap_have_exactly_one_winner() {
    for (name, store) in stores().await {
        let deps = deps_on(store);
        let sub = subscription(&deps, "p1").await;
        let t = sub.tenant();
        let one = || body(json!({"amount": 100, "description": "x"}));
        for _ in 0..MAX_PENDING - 1 {
            create(&deps, &t, &sub.id, one(), None).await.unwrap();
        }
        for round in 0..3 {
            let racers: Vec<_> = (0..8)
                .map(|_| {
                    let (d, t, s, b) = (deps.clone(), t.clone(), sub.id.clone(), one());
                    tokio::spawn(async move { create(&d, &t, &s, b, None).await })
                })
                .collect();
            let (mut won, mut refused) = (Vec::new(), 0);
            for r in racers {
                match r.await.unwrap() {
                    Ok(item) => won.push(item),
                    Err(ItemError::TooMany(_)) => refused += 1,
                    Err(e) => panic!("{name}: {e}"),
                }
            }
            assert_eq!((won.len(), refused), (1, 7), "{name}: round {round}");
            let waiting = pending(&deps, &sub.id).await.unwrap();
            assert_eq!(waiting.len(), MAX_PENDING, "{name}");
            assert_eq!(pending_count(&deps, &sub.id).await.unwrap(), CAP, "{name}");
            // The winner deleted: one place again for the next round.
            delete(&deps, &t, &sub.id, &won[0].id).await.unwrap();
            assert_eq!(pending_count(&deps, &sub.id).await.unwrap(), CAP - 1);
            assert!(delete(&deps, &t, &sub.id, &won[0].id).await.is_err());
            assert_eq!(
                pending_count(&deps, &sub.id).await.unwrap(),
                CAP - 1,
                "{name}: a second delete counts nothing"
            );
        }
        // An invoice takes them all: the count is back to 0, and a retry
        // of the same writes takes (and counts) nothing.
        let waiting = pending(&deps, &sub.id).await.unwrap();
        let ops = consume_ops(&waiting, &"inv_1".into(), deps.clock.now());
        deps.store.transact(ops.clone()).await.unwrap();
        assert_eq!(pending_count(&deps, &sub.id).await.unwrap(), 0, "{name}");
        assert!(deps.store.transact(ops).await.is_err());
        assert_eq!(pending_count(&deps, &sub.id).await.unwrap(), 0, "{name}");
        assert_eq!(
            all(&deps, &sub.id, 100).await.unwrap().len(),
            MAX_PENDING - 1
        );
        for _ in 0..MAX_PENDING {
            create(&deps, &t, &sub.id, one(), None).await.unwrap();
        }
        assert!(matches!(
            create(&deps, &t, &sub.id, one(), None).await,
            Err(ItemError::TooMany(_))
        ));
    }
}
