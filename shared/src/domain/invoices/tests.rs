use super::drafts::{price, valid_due};
use super::numbering::number_text;
use super::records::{line_total, tax_total};
use super::*;
use crate::Deps;
use crate::domain::checkout::{self, CheckoutSession, SessionStatus};
use crate::domain::record::{Record, from_item};
use crate::domain::{Mode, Tenant};
use crate::fields::{InvoiceLineText, InvoiceText};
use crate::store::TxOp;
use crate::time::Timestamp;
use serde_json::json;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

#[test]
fn quantities_are_decimal_text_with_at_most_three_decimals() {
    for (text, thousandths, canonical) in [
        ("1", 1000, "1"),
        ("1.5", 1500, "1.5"),
        ("0.001", 1, "0.001"),
        ("002.250", 2250, "2.25"),
        ("1000000", 1_000_000_000, "1000000"),
        ("0.5", 500, "0.5"),
    ] {
        let got = q(text);
        assert_eq!(got.thousandths(), thousandths, "{text}");
        assert_eq!(got.text(), canonical, "{text}");
    }
    for bad in [
        "",
        "0",
        "0.000",
        "-1",
        "+1",
        "1.",
        ".5",
        "1.2345",
        "1e3",
        "1,5",
        " 1",
        "abc",
        "1000001",
        "99999999999999999999999",
    ] {
        assert!(Quantity::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn line_totals_round_half_up() {
    for (qty, unit, total) in [
        ("1", 10_000, 10_000),
        ("1.5", 333, 500),   // 499.5 -> 500
        ("0.5", 1, 1),       // 0.5 -> 1
        ("0.499", 1, 0),     // 0.499 -> 0
        ("0.001", 499, 0),   // 0.499 -> 0
        ("0.001", 500, 1),   // 0.5 -> 1
        ("2.333", 300, 700), // 699.9 -> 700
        ("3", 0, 0),
        ("1000000", MAX_UNIT_AMOUNT, 100_000_000_000_000_000),
    ] {
        assert_eq!(line_total(q(qty), unit), total, "{qty} x {unit}");
    }
}

#[test]
fn tax_rounds_half_up_on_the_subtotal() {
    for (subtotal, bps, tax) in [
        (10_000, 1300, 1300),
        (1, 5000, 1),    // 0.5 -> 1
        (1, 4999, 0),    // 0.4999 -> 0
        (333, 1300, 43), // 43.29 -> 43
        (335, 1300, 44), // 43.55 -> 44
        (12_345, 0, 0),
        (12_345, 10_000, 12_345),
    ] {
        assert_eq!(tax_total(subtotal, bps), tax, "{subtotal} @ {bps}");
    }
}

fn body(lines: serde_json::Value) -> CreateInvoice {
    serde_json::from_value(json!({
        "lines": lines,
        "dueAt": "2026-12-31T18:15:00+05:45",
        "taxRateBps": 1300,
    }))
    .unwrap()
}

#[test]
fn a_draft_is_priced_from_its_lines() {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    let inv = new_draft(
        &Tenant::new("proj_1", Mode::Sandbox),
        body(json!([
            {"description": "Tea, 1 kg", "quantity": "2.5", "unitAmount": 120_000},
            {"description": "Delivery", "quantity": "1", "unitAmount": 15_050},
        ])),
        now,
    )
    .unwrap();
    assert_eq!(inv.lines[0].line_total, 300_000);
    assert_eq!(inv.lines[0].id, "il_001");
    assert_eq!(inv.subtotal, 315_050);
    assert_eq!(inv.tax_total, 40_957); // 40956.5 -> 40957
    assert_eq!(inv.total_amount, 356_007);
    assert_eq!(inv.amount_remaining(), 356_007);
    assert_eq!(inv.collection(), CollectionStatus::Unpaid);
    assert!(!inv.overdue(now));
}

#[test]
fn invalid_bodies_name_their_field() {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    let field_of = |b: CreateInvoice| match new_draft(&Tenant::new("p", Mode::Sandbox), b, now) {
        Err(InvoiceError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field_of(body(json!([]))), "lines");
    let many: Vec<_> = (0..101)
        .map(|_| json!({"description": "x", "quantity": "1", "unitAmount": 1}))
        .collect();
    assert_eq!(field_of(body(json!(many))), "lines");
    assert_eq!(
        field_of(body(
            json!([{"description": "x", "quantity": "1.2345", "unitAmount": 1}])
        )),
        "lines[0].quantity"
    );
    assert_eq!(
        field_of(body(
            json!([{"description": "x", "quantity": "1", "unitAmount": -1}])
        )),
        "lines[0].unitAmount"
    );
    assert_eq!(
        field_of(body(
            json!([{"description": "  ", "quantity": "1", "unitAmount": 1}])
        )),
        "lines[0].description"
    );
    let mut b = body(json!([{"description": "x", "quantity": "1", "unitAmount": 1}]));
    b.tax_rate_bps = Some(10_001);
    assert_eq!(field_of(b), "taxRateBps");
    let mut b = body(json!([{"description": "x", "quantity": "1", "unitAmount": 1}]));
    b.due_at = "tomorrow".into();
    assert_eq!(field_of(b), "dueAt");
    // The field rules live in the field types: parsing stops at the
    // field, by its path.
    for (buyer, field) in [
        (json!({"email": "not-an-email"}), "buyer.email"),
        (json!({"email": ""}), "buyer.email"),
        (
            json!({"name": "n".repeat(InvoiceText::MAX + 1)}),
            "buyer.name",
        ),
        (json!({"name": "a\nb"}), "buyer.name"),
        (json!({"address": "Thamel\nKathmandu"}), ""),
    ] {
        let v = json!({"lines": [{"description": "x", "quantity": "1", "unitAmount": 1}],
                           "dueAt": "2026-12-31T00:00:00Z", "buyer": buyer});
        let r: Result<CreateInvoice, _> = serde_path_to_error::deserialize(v);
        let at = r.err().map(|e| e.path().to_string()).unwrap_or_default();
        assert_eq!(at, field);
    }
    // Unknown properties: refused by the types.
    assert!(
        serde_json::from_value::<CreateInvoice>(json!({
            "lines": [], "dueAt": "2026-12-31T00:00:00Z", "colour": "red"
        }))
        .is_err()
    );
    assert!(serde_json::from_value::<Buyer>(json!({"name": "A", "vat": "1"})).is_err());
    assert!(
        serde_json::from_value::<LineInput>(
            json!({"description": "x", "quantity": "1", "unitAmount": 1, "lineTotal": 1})
        )
        .is_err()
    );
    // Quantity must be text, unitAmount an integer.
    assert!(
        serde_json::from_value::<LineInput>(
            json!({"description": "x", "quantity": 1, "unitAmount": 1})
        )
        .is_err()
    );
    assert!(
        serde_json::from_value::<LineInput>(
            json!({"description": "x", "quantity": "1", "unitAmount": 1.5})
        )
        .is_err()
    );
}

#[test]
fn collection_status_follows_the_amounts() {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    let mut inv = new_draft(
        &Tenant::new("p", Mode::Live),
        body(json!([{"description": "x", "quantity": "1", "unitAmount": 10_000}])),
        now,
    )
    .unwrap();
    inv.tax_rate_bps = 0;
    price(&mut inv).unwrap();
    inv.document_status = DocumentStatus::Issued;
    assert_eq!(inv.collection(), CollectionStatus::Unpaid);
    inv.amount_paid = 4_000;
    assert_eq!(inv.collection(), CollectionStatus::PartPaid);
    assert_eq!(inv.amount_remaining(), 6_000);
    inv.amount_paid = 10_000;
    assert_eq!(inv.collection(), CollectionStatus::Paid);
    inv.amount_paid = 4_000;
    inv.amount_adjusted = 6_000;
    assert_eq!(inv.collection(), CollectionStatus::ClosedAdjusted);
    assert_eq!(inv.amount_remaining(), 0);
    inv.amount_paid = 0;
    inv.amount_adjusted = 10_000;
    assert_eq!(inv.collection(), CollectionStatus::ClosedAdjusted);
    // Overdue: issued, something left, past due.
    inv.amount_adjusted = 0;
    let after_due = inv.due_at.plus(chrono::Duration::seconds(1));
    assert!(inv.overdue(after_due));
    assert!(!inv.overdue(inv.due_at));
    inv.amount_paid = 10_000;
    assert!(!inv.overdue(after_due));
}

#[test]
fn allocation_fills_the_balance_then_the_excess() {
    let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
    let mut inv = new_draft(
        &Tenant::new("p", Mode::Sandbox),
        body(json!([{"description": "x", "quantity": "1", "unitAmount": 10_000}])),
        now,
    )
    .unwrap();
    inv.tax_rate_bps = 0;
    price(&mut inv).unwrap();
    inv.document_status = DocumentStatus::Issued;
    inv.amount_paid = 6_000;
    inv.allocations.push(Allocation {
        payment_id: "pay_a".into(),
        amount: 6_000,
        excess: 0,
        at: now,
    });
    inv.collection_status = inv.collection();
    let ops = allocation_ops(&inv, &"pay_b".into(), 5_000, now).unwrap();
    // Then its narrowings' counters (part paid -> paid): year, month, day.
    assert_eq!(
        ops.len(),
        3 + 3,
        "the invoice, invoice.paid and its entry in the paying payment's timeline"
    );
    let TxOp::Put { item: entry, .. } = &ops[2] else {
        panic!("{ops:?}")
    };
    assert_eq!(entry.get("pk"), Some(&json!("PAY#pay_b#EVT")));
    let TxOp::Put { item, .. } = &ops[0] else {
        panic!("{ops:?}")
    };
    let next: Invoice = from_item(item.clone()).unwrap();
    assert_eq!((next.amount_paid, next.amount_excess), (10_000, 1_000));
    assert!(next.needs_attention);
    assert_eq!(next.collection(), CollectionStatus::Paid);
    // The same payment again: nothing.
    assert!(
        allocation_ops(&next, &"pay_b".into(), 5_000, now)
            .unwrap()
            .is_empty()
    );
    // A payment for a void invoice is all excess.
    let mut void = inv.clone();
    void.document_status = DocumentStatus::Void;
    let ops = allocation_ops(&void, &"pay_c".into(), 2_000, now).unwrap();
    let TxOp::Put { item, .. } = &ops[0] else {
        panic!("{ops:?}")
    };
    let next: Invoice = from_item(item.clone()).unwrap();
    assert_eq!((next.amount_paid, next.amount_excess), (6_000, 2_000));
    assert_eq!(ops.len(), 1);
}

#[test]
fn numbers_are_prefixed_and_padded() {
    assert_eq!(number_text(Mode::Live, 1), "PI-000001");
    assert_eq!(number_text(Mode::Sandbox, 42), "TEST-PI-000042");
    assert_eq!(number_text(Mode::Live, 1_234_567), "PI-1234567");
}

mod numbering {
    use crate::AppState;
    use std::sync::Arc;

    use super::*;
    use crate::Config;
    use crate::store::embedded::EmbeddedStore;
    use crate::time::{Clock, SystemClock};

    fn state() -> AppState {
        AppState::new(
            Arc::new(EmbeddedStore::in_memory().unwrap()),
            Arc::new(SystemClock),
            Config {
                public_base_url: "http://127.0.0.1:8080".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
    }

    async fn draft(state: &Deps) -> Invoice {
        let b = super::body(json!([{"description": "x", "quantity": "1", "unitAmount": 100_000}]));
        create(state, &Tenant::new("proj_1", Mode::Sandbox), b, None)
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_finalizes_take_every_number_once() {
        let state = state();
        let mut drafts = Vec::new();
        for _ in 0..40 {
            drafts.push(draft(&state).await);
        }
        let runs = drafts.into_iter().map(|d| {
            let state = state.clone();
            tokio::spawn(async move {
                finalize(
                    &state,
                    &Tenant::new("proj_1", Mode::Sandbox),
                    &d.id,
                    d.version,
                    None,
                )
                .await
            })
        });
        let mut numbers: Vec<String> = futures::future::join_all(runs)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap().invoice_number.unwrap())
            .collect();
        numbers.sort();
        let want: Vec<String> = (1..=40).map(|n| number_text(Mode::Sandbox, n)).collect();
        assert_eq!(numbers, want);
        // Another mode counts on its own.
        let b = super::body(json!([{"description": "x", "quantity": "1", "unitAmount": 100}]));
        let mut live_state = state.clone();
        live_state.clock = Arc::new(SystemClock);
        let live = new_draft(&Tenant::new("proj_1", Mode::Live), b, SystemClock.now()).unwrap();
        live_state
            .store
            .put(live.to_item().unwrap(), None)
            .await
            .unwrap();
        let issued = finalize(
            &live_state,
            &Tenant::new("proj_1", Mode::Live),
            &live.id,
            1,
            None,
        )
        .await
        .unwrap();
        assert_eq!(issued.invoice_number.as_deref(), Some("PI-000001"));
    }

    async fn issued(state: &Deps) -> Invoice {
        let d = draft(state).await;
        finalize(
            state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &d.id,
            d.version,
            None,
        )
        .await
        .unwrap()
    }

    async fn session(state: &Deps, id: &str) -> CheckoutSession {
        from_item(
            state
                .store
                .get(&CheckoutSession::key(&crate::ids::SessionId::stored(id)))
                .await
                .unwrap()
                .unwrap(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn one_open_checkout_per_invoice_and_correct_closes_it() {
        let state = state();
        let inv = issued(&state).await;
        let base = "http://127.0.0.1:8080";
        let body = |p: Option<crate::domain::Provider>| InvoiceCheckout { provider: p };
        let (a, reused) = checkout(&state, &payer(), &inv.id, body(None), base, None)
            .await
            .unwrap();
        assert!(!reused);
        assert_eq!(a.amount.get(), inv.total_amount);
        assert_eq!(a.invoice_id.as_deref(), Some(inv.id.as_str()));
        let (again, reused) = checkout(&state, &payer(), &inv.id, body(None), base, None)
            .await
            .unwrap();
        assert!(reused);
        assert_eq!(again.id, a.id);
        // Another provider: a new session, and the old one is closed.
        let (b, reused) = checkout(
            &state,
            &payer(),
            &inv.id,
            body(Some(crate::domain::Provider::Khalti)),
            base,
            None,
        )
        .await
        .unwrap();
        assert!(!reused);
        assert_ne!(b.id, a.id);
        // Each new session counted once on its day (the reused one not
        // again).
        let counted = crate::domain::analytics::day_totals(
            &*state.store,
            &crate::domain::Tenant::new("proj_1", Mode::Sandbox),
            a.created_at,
        )
        .await
        .unwrap();
        assert_eq!(counted.get("sessions_created"), Some(&2));
        assert_eq!(session(&state, &a.id).await.status, SessionStatus::Expired);
        // The invoice moved on: a write at the old version conflicts.
        let now_inv = get(&state, &Tenant::new("proj_1", Mode::Sandbox), &inv.id)
            .await
            .unwrap();
        assert_eq!(now_inv.version, inv.version + 2);
        // Correct an invoice with a fresh pending checkout: allowed, and
        // the checkout is expired with it.
        let (voided, replacement) = correct(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &inv.id,
            CorrectInvoice {
                reason: InvoiceLineText::stored("wrong buyer".into()),
            },
        )
        .await
        .unwrap();
        assert_eq!(voided.document_status, DocumentStatus::Void);
        assert_eq!(
            replacement.correction_of_invoice_id.as_deref(),
            Some(inv.id.as_str())
        );
        assert_eq!(session(&state, &b.id).await.status, SessionStatus::Expired);
    }

    #[tokio::test]
    async fn an_adjustment_closes_the_checkout_for_the_old_balance() {
        let state = state();
        let inv = issued(&state).await;
        let base = "http://127.0.0.1:8080";
        let (a, _) = checkout(
            &state,
            &payer(),
            &inv.id,
            InvoiceCheckout::default(),
            base,
            None,
        )
        .await
        .unwrap();
        let current = get(&state, &Tenant::new("proj_1", Mode::Sandbox), &inv.id)
            .await
            .unwrap();
        let adjusted = adjust(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &inv.id,
            AdjustInvoice {
                amount: 30,
                reason: InvoiceLineText::stored("discount".into()),
                version: current.version,
            },
        )
        .await
        .unwrap();
        assert_eq!(adjusted.amount_remaining(), inv.total_amount - 30);
        assert_eq!(session(&state, &a.id).await.status, SessionStatus::Expired);
        let (b, reused) = checkout(
            &state,
            &payer(),
            &inv.id,
            InvoiceCheckout::default(),
            base,
            None,
        )
        .await
        .unwrap();
        assert!(!reused);
        assert_eq!(b.amount.get(), inv.total_amount - 30);
    }

    #[test]
    fn due_dates_stay_in_readable_years() {
        assert!(valid_due("0000-01-01T00:00:00+05:45").is_err());
        assert!(valid_due("9999-12-31T23:00:00-05:00").is_err());
        assert!(valid_due("2199-12-31T00:00:00Z").is_ok());
        assert!(valid_due("2026-12-31T18:15:00+05:45").is_ok());
    }

    #[tokio::test]
    async fn a_stale_version_changes_nothing_and_takes_no_number() {
        let state = state();
        let a = draft(&state).await;
        let b = draft(&state).await;
        let err = finalize(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &a.id,
            7,
            None,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                InvoiceError::VersionConflict {
                    sent: 7,
                    current: 1
                }
            ),
            "{err:?}"
        );
        let still = get(&state, &Tenant::new("proj_1", Mode::Sandbox), &a.id)
            .await
            .unwrap();
        assert_eq!(still, a);
        let issued = finalize(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &b.id,
            1,
            None,
        )
        .await
        .unwrap();
        assert_eq!(issued.invoice_number.as_deref(), Some("TEST-PI-000001"));
        let again = finalize(
            &state,
            &Tenant::new("proj_1", Mode::Sandbox),
            &b.id,
            2,
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(again, InvoiceError::StateConflict(_)), "{again:?}");
    }

    #[tokio::test]
    async fn the_number_counter_is_a_record_holding_only_its_value() {
        let state = state();
        let tenant = Tenant::new("proj_1", Mode::Sandbox);
        let key = crate::keys::invoice_sequence("proj_1", Mode::Sandbox);
        let none = crate::domain::record::get::<InvoiceSequence>(&*state.store, &key).await;
        assert_eq!(none, Ok(None), "no number given yet");
        issued(&state).await;
        issued(&state).await;
        let Ok(Some(seq)) =
            crate::domain::record::get::<InvoiceSequence>(&*state.store, &key).await
        else {
            panic!("the counter reads as a record")
        };
        assert_eq!(seq.value, 2);
        assert_eq!(seq.item_key(), key);
        let raw = state.store.get(&key).await.unwrap().unwrap();
        let mut attrs: Vec<&str> = raw.keys().map(String::as_str).collect();
        attrs.sort_unstable();
        assert_eq!(
            attrs,
            ["pk", "sk", "value"],
            "the item's shape is unchanged"
        );
        assert_eq!(seq.to_item().unwrap(), raw, "written back as stored");
        let third = issued(&state).await;
        assert_eq!(third.invoice_number.as_deref(), Some("TEST-PI-000003"));
        let listed = list(
            &state,
            &tenant,
            Some(DocumentStatus::Issued),
            None,
            crate::domain::Window::first(10),
        )
        .await
        .unwrap();
        assert_eq!(listed.1, 3, "the status filter names the typed attribute");
    }
}

/// A key of `proj_1` in sandbox without a spend cap.
fn payer() -> checkout::Creator {
    checkout::Creator {
        project_id: "proj_1".into(),
        mode: Mode::Sandbox,
        api_key_id: "ak_1".into(),
        spend_cap_paisa: None,
    }
}
