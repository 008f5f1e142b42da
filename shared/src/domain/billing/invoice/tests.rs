use std::sync::Arc;

use super::*;
use crate::AppState;
use crate::domain::billing::terms::monthly;
use crate::domain::billing::testenv::{deps_at, stores};
use crate::domain::billing::testenv::{stored_sub, sub_input};
use crate::domain::invoices::InvoiceSequence;
use crate::store::{Index, Query, Store};
use crate::testenv::at;
use InvoiceEvent as E;
use InvoiceStatus as S;

fn allowed() -> Vec<(S, E, S)> {
    vec![
        (S::Draft, E::Finalize, S::Open),
        (S::Open, E::GraceEnded, S::Overdue),
        (S::Open, E::Pay, S::Paid),
        (S::Overdue, E::Pay, S::Paid),
        (S::Uncollectible, E::Pay, S::Paid),
        (S::Draft, E::Void, S::Void),
        (S::Open, E::Void, S::Void),
        (S::Overdue, E::Void, S::Void),
        (S::Open, E::MarkUncollectible, S::Uncollectible),
        (S::Overdue, E::MarkUncollectible, S::Uncollectible),
    ]
}

#[test]
fn the_invoice_state_machine_allows_exactly_its_table() {
    let table = allowed();
    for from in S::ALL {
        for event in E::ALL {
            let want = table
                .iter()
                .find(|(f, e, _)| *f == from && *e == event)
                .map(|(_, _, to)| *to);
            match (next_invoice(from, event), want) {
                (Ok(to), Some(w)) => assert_eq!(to, w, "{from:?} {event:?}"),
                (Err(r), None) => {
                    let msg = r.to_string();
                    assert!(msg.contains(from.as_str()) && msg.contains(event.action()));
                }
                (got, want) => panic!("{from:?} {event:?}: got {got:?}, the table says {want:?}"),
            }
        }
    }
    let sdk = "draft open paid overdue void uncollectible";
    let ours: Vec<String> = S::ALL
        .iter()
        .map(|s| {
            serde_json::to_value(s)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ours.join(" "), sdk);
}

fn deps_on(store: Arc<dyn Store>) -> AppState {
    deps_at(store, "2026-01-10T06:00:00Z")
}

async fn subscription(deps: &Deps, project: &str) -> Subscription {
    let tenant = Tenant::new(project, Mode::Sandbox);
    stored_sub(
        deps,
        &tenant,
        sub_input(at("2026-01-10T06:00:00Z"), monthly()),
    )
    .await
}

async fn counter(store: &dyn Store, tenant: &Tenant) -> u64 {
    crate::domain::record::get::<InvoiceSequence>(
        store,
        &crate::keys::invoice_sequence(&tenant.project, tenant.mode),
    )
    .await
    .unwrap()
    .map_or(0, |s| s.value)
}

async fn invoices_of(store: &dyn Store, tenant: &Tenant) -> Vec<BillingInvoice> {
    crate::domain::record::all_of(
        store,
        &Query::partition(BillingInvoice::list_partition(tenant)).on(Index::Gsi1),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn an_invoice_bills_the_terms_due_on_the_period_start() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_terms").await;
    let period = sub.current_period().unwrap();
    let now = at("2026-01-10T06:00:00Z");
    let issued = issue_invoice(&deps, &sub, period, now).await.unwrap();
    assert!(issued.created);
    let inv = issued.invoice;
    assert_eq!(inv.number, "TEST-PI-000001");
    assert_eq!(inv.status, S::Open);
    assert_eq!(
        (inv.total, inv.amount_due, inv.amount_paid),
        (99_900, 99_900, 0)
    );
    assert_eq!(inv.due_date.to_string(), "2026-01-10");
    assert_eq!(inv.overdue_on.to_string(), "2026-01-13", "3 days' grace");
    assert_eq!(inv.lines.len(), 1);
    assert_eq!(inv.lines[0].period_end.to_string(), "2026-02-10");
    assert_eq!(
        inv,
        get_invoice(&deps, &sub.tenant(), &inv.id).await.unwrap()
    );
    // The next period takes the next number of the same series.
    let second = issue_invoice(&deps, &sub, sub.period(1).unwrap(), now)
        .await
        .unwrap();
    assert_eq!(second.invoice.number, "TEST-PI-000002");
    // Another project cannot read it.
    let other = Tenant::new("proj_other", Mode::Sandbox);
    assert!(matches!(
        get_invoice(&deps, &other, &inv.id).await,
        Err(BillingInvoiceError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_concurrent_issues_of_one_period_make_one_invoice_and_take_one_number() {
    for (backend, store) in stores().await {
        let deps = deps_on(store.clone());
        let sub = subscription(&deps, "proj_race").await;
        let tenant = sub.tenant();
        // A one-time invoice number taken before: the series is shared.
        let (_, take) = take_number(&tenant, 0);
        store.transact(vec![take]).await.unwrap();
        let period = sub.current_period().unwrap();
        let now = at("2026-01-10T06:00:00Z");
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let deps = deps.clone();
                let sub = sub.clone();
                // A caller that gives up `Busy` (its time budget spent
                // while a slow store serialises 40 writers) tries again,
                // as the next sweep would.
                tokio::spawn(async move {
                    match issue_invoice(&deps, &sub, period, now).await {
                        Err(BillingInvoiceError::Busy) => {
                            issue_invoice(&deps, &sub, period, now).await
                        }
                        answer => answer,
                    }
                })
            })
            .collect();
        let mut ids = std::collections::BTreeSet::new();
        let mut created = 0;
        for t in futures::future::join_all(tasks).await {
            let issued = t.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}"));
            created += usize::from(issued.created);
            ids.insert(issued.invoice.id.clone());
        }
        assert_eq!(created, 1, "{backend}: one issue created it");
        assert_eq!(ids.len(), 1, "{backend}: every caller got the same invoice");
        let all = invoices_of(&*store, &tenant).await;
        assert_eq!(all.len(), 1, "{backend}");
        assert_eq!(all[0].number, "TEST-PI-000002", "{backend}: no gap");
        assert_eq!(counter(&*store, &tenant).await, 2, "{backend}: one number");
    }
}

fn online(payment: &str, provider: Provider) -> PaymentSource {
    PaymentSource::Online {
        payment_id: payment.into(),
        provider,
    }
}

#[tokio::test]
async fn a_payment_pays_once_and_a_second_one_is_an_overpayment() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_pay").await;
    let tenant = sub.tenant();
    let now = at("2026-01-10T07:00:00Z");
    let inv = issue_invoice(&deps, &sub, sub.current_period().unwrap(), now)
        .await
        .unwrap()
        .invoice;
    let wrong = pay_invoice(
        &deps,
        &tenant,
        &inv.id,
        online("pay_0", Provider::Khalti),
        1,
        now,
    )
    .await;
    assert!(matches!(
        wrong,
        Err(BillingInvoiceError::AmountMismatch {
            expected: 99_900,
            got: 1
        })
    ));
    let a = online("pay_a", Provider::Khalti);
    let paid = pay_invoice(&deps, &tenant, &inv.id, a.clone(), 99_900, now)
        .await
        .unwrap();
    let PayOutcome::Paid(paid) = paid else {
        panic!("{paid:?}")
    };
    assert_eq!(paid.status, S::Paid);
    assert_eq!(paid.amount_paid, 99_900);
    // The same payment again (a retried notification): answered as paid.
    assert!(matches!(
        pay_invoice(&deps, &tenant, &inv.id, a, 99_900, now)
            .await
            .unwrap(),
        PayOutcome::AlreadyPaid(_)
    ));
    let b = online("pay_b", Provider::Fonepay);
    let PayOutcome::Overpayment(over) =
        pay_invoice(&deps, &tenant, &inv.id, b.clone(), 99_900, now)
            .await
            .unwrap()
    else {
        panic!("an overpayment")
    };
    assert_eq!(over.overpayments.len(), 1);
    assert_eq!(
        over.overpayments[0].refund_status,
        OverpaymentRefund::Manual
    );
    // Recorded once, however often it is told.
    pay_invoice(&deps, &tenant, &inv.id, b, 99_900, now)
        .await
        .unwrap();
    let read = get_invoice(&deps, &tenant, &inv.id).await.unwrap();
    assert_eq!(read.overpayments.len(), 1);
    assert_eq!(read.status, S::Paid);
    // A paid invoice cannot be voided.
    assert!(matches!(
        void(&deps, &tenant, &inv.id, now).await,
        Err(BillingInvoiceError::Refused(_))
    ));
}

#[tokio::test]
async fn void_uncollectible_and_overdue_follow_the_table() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_void").await;
    let tenant = sub.tenant();
    let now = at("2026-01-14T07:00:00Z");
    let first = issue_invoice(&deps, &sub, sub.period(0).unwrap(), now)
        .await
        .unwrap()
        .invoice;
    let overdue = mark_overdue(&deps, &tenant, &first.id, now).await.unwrap();
    assert_eq!(overdue.status, S::Overdue);
    let written_off = mark_uncollectible(&deps, &tenant, &first.id, now)
        .await
        .unwrap();
    assert_eq!(written_off.status, S::Uncollectible);
    assert_eq!(written_off.uncollectible_at, Some(now));
    // Paid late after all.
    let late = pay_invoice(
        &deps,
        &tenant,
        &first.id,
        online("pay_late", Provider::Esewa),
        99_900,
        now,
    )
    .await
    .unwrap();
    assert!(matches!(late, PayOutcome::Paid(_)));

    let second = issue_invoice(&deps, &sub, sub.period(1).unwrap(), now)
        .await
        .unwrap()
        .invoice;
    let voided = void(&deps, &tenant, &second.id, now).await.unwrap();
    assert_eq!(voided.status, S::Void);
    // Money arriving for a voided invoice is returned.
    assert!(matches!(
        pay_invoice(
            &deps,
            &tenant,
            &second.id,
            online("pay_v", Provider::Khalti),
            99_900,
            now
        )
        .await
        .unwrap(),
        PayOutcome::Overpayment(_)
    ));
    assert!(mark_overdue(&deps, &tenant, &second.id, now).await.is_err());
}

/// Two payments of one invoice at once: `first` and `second` race `n`
/// times, on fresh invoices; each time exactly one pays it and the other
/// is recorded as an overpayment.
async fn race_two(
    backend: &str,
    deps: &AppState,
    sub: &Subscription,
    make: fn(usize) -> (PaymentSource, PaymentSource),
    n: u32,
) {
    let tenant = sub.tenant();
    let now = at("2026-01-10T07:00:00Z");
    for i in 0..n {
        let period = sub.period(i).unwrap();
        let inv = issue_invoice(deps, sub, period, now).await.unwrap().invoice;
        let (a, b) = make(i as usize);
        let tasks: Vec<_> = [a, b]
            .into_iter()
            .map(|source| {
                let deps = deps.clone();
                let tenant = tenant.clone();
                let id = inv.id.clone();
                tokio::spawn(
                    async move { pay_invoice(&deps, &tenant, &id, source, 99_900, now).await },
                )
            })
            .collect();
        let mut paid = 0;
        let mut over = 0;
        for t in futures::future::join_all(tasks).await {
            match t.unwrap().unwrap_or_else(|e| panic!("{backend}: {e}")) {
                PayOutcome::Paid(_) => paid += 1,
                PayOutcome::Overpayment(_) => over += 1,
                other @ PayOutcome::AlreadyPaid(_) => panic!("{backend}: {other:?}"),
            }
        }
        assert_eq!((paid, over), (1, 1), "{backend} round {i}");
        let read = get_invoice(deps, &tenant, &inv.id).await.unwrap();
        assert_eq!(read.status, S::Paid, "{backend}");
        assert_eq!(read.amount_paid, 99_900, "{backend}");
        assert_eq!(read.overpayments.len(), 1, "{backend}");
        assert_ne!(
            read.payment.as_ref().map(|p| &p.source),
            Some(&read.overpayments[0].source),
            "{backend}: the overpayment is the other payment"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_payments_give_one_paid_invoice_and_one_overpayment() {
    for (backend, store) in stores().await {
        let deps = deps_on(store);
        let sub = subscription(&deps, "proj_two").await;
        race_two(
            backend,
            &deps,
            &sub,
            |i| {
                (
                    online(&format!("pay_a{i}"), Provider::Khalti),
                    online(&format!("pay_b{i}"), Provider::Esewa),
                )
            },
            5,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_out_of_band_payment_racing_an_online_one_gives_one_overpayment() {
    for (backend, store) in stores().await {
        let deps = deps_on(store);
        let sub = subscription(&deps, "proj_cash").await;
        race_two(
            backend,
            &deps,
            &sub,
            |i| {
                (
                    online(&format!("pay_o{i}"), Provider::Khalti),
                    PaymentSource::OutOfBand {
                        method: OutOfBandMethod::Cash,
                        received_on: NaiveDate::from_ymd_opt(2026, 1, 10).unwrap(),
                        reference: format!("receipt {i}"),
                        recorded_by: "usr_1".into(),
                    },
                )
            },
            5,
        )
        .await;
        // Through its own entry point too.
        let tenant = sub.tenant();
        let now = at("2026-01-10T08:00:00Z");
        let inv = issue_invoice(&deps, &sub, sub.period(7).unwrap(), now)
            .await
            .unwrap()
            .invoice;
        let cash = OutOfBand {
            method: OutOfBandMethod::BankDeposit,
            received_on: NaiveDate::from_ymd_opt(2026, 1, 10).unwrap(),
            reference: "deposit 42".into(),
            recorded_by: "usr_1".into(),
            amount: 99_900,
        };
        let got = record_out_of_band_payment(&deps, &tenant, &inv.id, cash, now)
            .await
            .unwrap();
        assert!(matches!(got, PayOutcome::Paid(_)), "{backend}");
    }
}

#[tokio::test]
async fn an_out_of_band_payment_of_a_first_invoice_activates_its_subscription() {
    use crate::domain::billing::subscription::SubscriptionStatus as Sub;
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_first").await;
    let now = at("2026-01-10T08:00:00Z");
    let inv = issue_invoice(&deps, &sub, sub.current_period().unwrap(), now)
        .await
        .unwrap()
        .invoice;
    let status = |deps: &Deps| {
        let key = Subscription::key(&sub.id);
        let store = deps.store.clone();
        async move {
            crate::domain::record::get::<Subscription>(&*store, &key)
                .await
                .unwrap()
                .unwrap()
                .status
        }
    };
    assert_eq!(status(&deps).await, Sub::Incomplete);
    let cash = OutOfBand {
        method: OutOfBandMethod::Cash,
        received_on: NaiveDate::from_ymd_opt(2026, 1, 10).unwrap(),
        reference: "receipt 7".into(),
        recorded_by: "usr_1".into(),
        amount: inv.amount_due,
    };
    let got = record_out_of_band_payment(&deps, &sub.tenant(), &inv.id, cash, now)
        .await
        .unwrap();
    assert!(matches!(got, PayOutcome::Paid(_)));
    assert_eq!(status(&deps).await, Sub::Active);
}

#[tokio::test]
async fn ended_and_draft_subscriptions_are_not_billed() {
    let deps = deps_on(crate::testenv::memory_store());
    let mut sub = subscription(&deps, "proj_end").await;
    let period = sub.current_period().unwrap();
    let now = at("2026-01-10T06:00:00Z");
    for status in [
        crate::domain::billing::subscription::SubscriptionStatus::Cancelled,
        crate::domain::billing::subscription::SubscriptionStatus::Draft,
    ] {
        sub.status = status;
        assert!(matches!(
            issue_invoice(&deps, &sub, period, now).await,
            Err(BillingInvoiceError::NotBillable(_))
        ));
    }
    assert_eq!(
        counter(&*deps.store, &sub.tenant()).await,
        0,
        "no number taken"
    );
}

#[tokio::test]
async fn money_received_is_always_recorded_and_money_asked_must_be_the_amount_due() {
    let deps = deps_on(crate::testenv::memory_store());
    let sub = subscription(&deps, "proj_plan").await;
    let now = at("2026-01-10T07:00:00Z");
    let inv = issue_invoice(&deps, &sub, sub.current_period().unwrap(), now)
        .await
        .unwrap()
        .invoice;
    let a = online("pay_a", Provider::Khalti);
    // Asked (the dashboard): another amount is refused.
    assert!(matches!(
        plan_payment(&inv, &a, 5, Taken::Asked, "http://127.0.0.1:8080", now),
        Err(BillingInvoiceError::AmountMismatch { .. })
    ));
    // Received (a provider's success): another amount is money to give
    // back, not a payment of the invoice.
    let Ok(PayPlan::Write(_, PayOutcome::Overpayment(over))) =
        plan_payment(&inv, &a, 5, Taken::Received, "http://127.0.0.1:8080", now)
    else {
        panic!("an overpayment")
    };
    assert_eq!(over.status, S::Open);
    assert_eq!(over.overpayments[0].amount, 5);
    assert_eq!(
        over.overpayments[0].refund_status,
        OverpaymentRefund::Pending
    );
    // The amount due pays it, conditioned on the version read.
    let Ok(PayPlan::Write(ops, PayOutcome::Paid(paid))) = plan_payment(
        &inv,
        &a,
        99_900,
        Taken::Received,
        "http://127.0.0.1:8080",
        now,
    ) else {
        panic!("paid")
    };
    assert_eq!(paid.version, inv.version + 1);
    assert!(matches!(
        ops.first(),
        Some(TxOp::Update { cond: Some(_), .. })
    ));
    // A draft takes no payment: asked, refused; received, recorded.
    let mut draft = inv.clone();
    draft.status = S::Draft;
    assert!(matches!(
        plan_payment(
            &draft,
            &a,
            99_900,
            Taken::Asked,
            "http://127.0.0.1:8080",
            now
        ),
        Err(BillingInvoiceError::Refused(_))
    ));
    assert!(matches!(
        plan_payment(
            &draft,
            &a,
            99_900,
            Taken::Received,
            "http://127.0.0.1:8080",
            now
        ),
        Ok(PayPlan::Write(_, PayOutcome::Overpayment(_)))
    ));
    // Told again: nothing to write.
    assert!(matches!(
        plan_payment(
            &paid,
            &a,
            99_900,
            Taken::Received,
            "http://127.0.0.1:8080",
            now
        ),
        Ok(PayPlan::Told(PayOutcome::AlreadyPaid(_)))
    ));
}

#[test]
fn the_view_shows_days_with_their_miti_and_links_to_the_pay_page() {
    use super::view::{Day, Filters, start_of_nepal_day};
    let d = NaiveDate::from_ymd_opt(2024, 7, 30).unwrap();
    assert_eq!(
        Day::of(d),
        Day {
            ad: "2024-07-30".into(),
            bs: Some("2081 Shrawan 15".into())
        }
    );
    assert_eq!(
        start_of_nepal_day(NaiveDate::from_ymd_opt(2026, 1, 10).unwrap()),
        at("2026-01-09T18:15:00Z")
    );
    assert_eq!(
        super::collect::pay_url("https://pay.example", &"inv_1".into()),
        "https://pay.example/b/inv_1"
    );
    assert!(Filters::parse(Some("open"), None, None, Some("  ")).is_ok_and(|f| f.search.is_none()));
    assert!(Filters::parse(Some("past_due"), None, None, None).is_err());
    assert!(Filters::parse(None, None, None, Some(&"x".repeat(101))).is_err());
}

/// A stored eSewa payment of `project` (refunds of eSewa need the
/// merchant: `requires_action`, no provider call).
async fn esewa_payment(deps: &Deps, project: &str, amount: i64) -> crate::ids::PaymentId {
    use crate::domain::payments::{self, AttemptInfo, Payment, PaymentStatus};
    let now = at("2026-01-10T06:00:00Z");
    let p = Payment {
        id: crate::ids::PaymentId::new(),
        project_id: project.into(),
        checkout_session_id: crate::ids::SessionId::new(),
        mode: Mode::Sandbox,
        amount: crate::money::Paisa::new(amount).unwrap(),
        amount_refunded: crate::money::Paisa::ZERO,
        amount_reserved: crate::money::Paisa::ZERO,
        gsi2pk: None,
        gsi2sk: None,
        currency: Currency::Npr,
        provider: Provider::Esewa,
        status: PaymentStatus::Success,
        provider_ref: Some("0007ABC".into()),
        failure_reason: None,
        metadata: Default::default(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo::default(),
        checks: Default::default(),
    };
    payments::insert(&*deps.store, &p).await.unwrap();
    p.id
}

/// A subscription of `project` whose first invoice Khalti paid (at
/// `2026-01-10T07:00Z`); answers it with the invoice.
async fn paid_once(deps: &Deps, project: &str) -> (Subscription, BillingInvoice) {
    let sub = subscription(deps, project).await;
    let now = at("2026-01-10T07:00:00Z");
    let inv = issue_invoice(deps, &sub, sub.current_period().unwrap(), now)
        .await
        .unwrap()
        .invoice;
    pay_invoice(
        deps,
        &sub.tenant(),
        &inv.id,
        online("pay_first", Provider::Khalti),
        99_900,
        now,
    )
    .await
    .unwrap();
    (sub, inv)
}

async fn refund_due_items(store: &dyn Store) -> Vec<refund_due::RefundDue> {
    crate::domain::record::all_of(
        store,
        &Query::partition(crate::keys::OVERPAYMENT_REFUNDS_DUE).on(Index::Gsi2),
    )
    .await
    .unwrap()
}

/// The process dies after the settlement recorded an overpayment and
/// before it asked the refund: the refund sweep asks it once, when due,
/// and a second sweep (or the late inline call) asks nothing more.
#[tokio::test]
async fn an_overpayment_whose_refund_was_never_asked_is_refunded_by_the_sweep() {
    for (backend, store) in stores().await {
        let deps = deps_on(store.clone());
        let (sub, inv) = paid_once(&deps, "proj_refund_due").await;
        let tenant = sub.tenant();
        let now = at("2026-01-10T07:00:00Z");
        let second = esewa_payment(&deps, "proj_refund_due", 99_900).await;
        let source = PaymentSource::Online {
            payment_id: second.clone(),
            provider: Provider::Esewa,
        };
        let over = pay_invoice(&deps, &tenant, &inv.id, source, 99_900, now)
            .await
            .unwrap();
        assert!(matches!(over, PayOutcome::Overpayment(_)), "{backend}");
        // The crash: `refund_overpayment` never runs. The item waits.
        let due = refund_due_items(&*store).await;
        assert_eq!(due.len(), 1, "{backend}");
        assert_eq!(due[0].payment_id, second, "{backend}");
        let early = refund_due::sweep(&deps, now.plus(chrono::Duration::seconds(60)))
            .await
            .unwrap();
        assert_eq!(
            early,
            refund_due::RefundSweep::default(),
            "{backend}: not due yet"
        );
        let later = now.plus(chrono::Duration::seconds(refund_due::GRACE_SECONDS + 1));
        let swept = refund_due::sweep(&deps, later).await.unwrap();
        assert_eq!(swept.asked, 1, "{backend}");
        let read = get_invoice(&deps, &tenant, &inv.id).await.unwrap();
        assert_eq!(read.overpayments.len(), 1, "{backend}");
        assert_eq!(
            read.overpayments[0].refund_status,
            OverpaymentRefund::RequiresAction,
            "{backend}: eSewa's refund waits for the merchant"
        );
        let refund_id = read.overpayments[0].refund_id.clone();
        assert!(refund_id.is_some(), "{backend}");
        assert!(refund_due_items(&*store).await.is_empty(), "{backend}");
        // Again, and the late inline call: one refund, kept.
        assert_eq!(
            refund_due::sweep(&deps, later).await.unwrap(),
            refund_due::RefundSweep::default(),
            "{backend}"
        );
        let again = collect::refund_overpayment(&deps, &inv.id, &second, later)
            .await
            .unwrap();
        assert!(matches!(again, collect::RefundAsked::Settled), "{backend}");
        let (refunds, total) = crate::domain::refunds::of_payment(
            &deps,
            &second,
            crate::domain::record::Window::first(10),
        )
        .await
        .unwrap();
        assert_eq!((refunds.len(), total), (1, 1), "{backend}: refunded once");
        assert_eq!(Some(refunds[0].id.clone()), refund_id, "{backend}");
    }
}

/// The inline call that works takes the item away with its own write.
#[tokio::test]
async fn a_refund_asked_inline_leaves_nothing_for_the_sweep() {
    let deps = deps_on(crate::testenv::memory_store());
    let (sub, inv) = paid_once(&deps, "proj_refund_inline").await;
    let tenant = sub.tenant();
    let now = at("2026-01-10T07:00:00Z");
    let second = esewa_payment(&deps, "proj_refund_inline", 99_900).await;
    let source = PaymentSource::Online {
        payment_id: second.clone(),
        provider: Provider::Esewa,
    };
    pay_invoice(&deps, &tenant, &inv.id, source, 99_900, now)
        .await
        .unwrap();
    assert_eq!(refund_due_items(&*deps.store).await.len(), 1);
    let asked = collect::refund_overpayment(&deps, &inv.id, &second, now)
        .await
        .unwrap();
    assert!(matches!(asked, collect::RefundAsked::Asked(_)));
    assert!(refund_due_items(&*deps.store).await.is_empty());
    // Fonepay's and out-of-band overpayments are refunded by hand: no item.
    let inv2 = issue_invoice(&deps, &sub, sub.period(1).unwrap(), now)
        .await
        .unwrap()
        .invoice;
    pay_invoice(
        &deps,
        &tenant,
        &inv2.id,
        online("pay_a", Provider::Khalti),
        99_900,
        now,
    )
    .await
    .unwrap();
    pay_invoice(
        &deps,
        &tenant,
        &inv2.id,
        online("pay_b", Provider::Fonepay),
        99_900,
        now,
    )
    .await
    .unwrap();
    assert!(refund_due_items(&*deps.store).await.is_empty());
}

/// A refund the flow keeps refusing (here: its payment is not found) is
/// tried with growing waits and then marked `failed` for a person; the
/// item goes and nothing is retried after.
#[tokio::test]
async fn a_refund_that_keeps_failing_is_marked_failed_after_the_last_try() {
    let deps = deps_on(crate::testenv::memory_store());
    let (sub, inv) = paid_once(&deps, "proj_refund_fail").await;
    let tenant = sub.tenant();
    let now = at("2026-01-10T07:00:00Z");
    // No such payment record: the refund flow refuses every time.
    pay_invoice(
        &deps,
        &tenant,
        &inv.id,
        online("pay_ghost", Provider::Khalti),
        99_900,
        now,
    )
    .await
    .unwrap();
    let mut t = now.plus(chrono::Duration::seconds(refund_due::GRACE_SECONDS));
    let mut retried = 0;
    let mut failed = 0;
    for _ in 0..refund_due::MAX_ATTEMPTS {
        let due = refund_due_items(&*deps.store).await;
        assert_eq!(due.len(), 1);
        // Not before its time.
        let before = refund_due::sweep(&deps, t.plus(chrono::Duration::seconds(-1)))
            .await
            .unwrap();
        assert_eq!(before, refund_due::RefundSweep::default());
        t = due[0].due_at;
        let r = refund_due::sweep(&deps, t).await.unwrap();
        retried += r.retried;
        failed += r.failed;
        assert_eq!(r.asked, 0);
    }
    assert_eq!(
        (retried, failed),
        (refund_due::MAX_ATTEMPTS as usize - 1, 1)
    );
    assert!(refund_due_items(&*deps.store).await.is_empty());
    let read = get_invoice(&deps, &tenant, &inv.id).await.unwrap();
    assert_eq!(
        read.overpayments[0].refund_status,
        OverpaymentRefund::Failed
    );
    assert_eq!(read.overpayments[0].refund_id, None);
    assert_eq!(refund_due::backoff_seconds(1), 120);
    assert_eq!(refund_due::backoff_seconds(6), 3_840);
    assert_eq!(refund_due::backoff_seconds(60), 3_840, "capped");
}
