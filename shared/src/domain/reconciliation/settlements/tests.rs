use std::sync::Arc;

use chrono::NaiveDate;
use serde_json::Map;

use super::{
    BankCredit, CreditRequest, DayRange, SettlementError, SettlementQuery, Tally, day_of,
    delete_credit, get_credit, new_credit, record_credit, settlements,
};
use crate::domain::payments::{self, AttemptInfo, Checks, FeeSource, Payment, PaymentStatus};
use crate::domain::record::Record;
use crate::domain::refunds::{Refund, RefundReason, RefundStatus};
use crate::domain::{Mode, Provider, Tenant};
use crate::ids::{PaymentId, RefundId, SessionId, minted_at_ms};
use crate::money::{Currency, Paisa};
use crate::refusal::Refusal;
use crate::store::Store;
use crate::testenv::{at, memory_store};
use crate::time::ManualClock;

fn paisa(n: i64) -> Paisa {
    Paisa::new(n).unwrap_or_default()
}

fn day(s: &str) -> NaiveDate {
    NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// An id of `prefix` minted at `time` (RFC 3339), `n` its random part.
fn id_at(prefix: &str, time: &str, n: u128) -> String {
    let ms = u64::try_from(at(time).unix_millis()).unwrap_or(0);
    let u = ulid::Ulid::from_parts(ms, n);
    format!("{prefix}{}", u.to_string().to_ascii_lowercase())
}

fn tenant() -> Tenant {
    Tenant::new("proj_s", Mode::Sandbox)
}

fn payment(time: &str, n: u128, provider: Provider, amount: i64) -> Payment {
    let created = at(time);
    Payment {
        id: PaymentId::stored(id_at("pay_", time, n)),
        project_id: "proj_s".into(),
        checkout_session_id: SessionId::new(),
        mode: Mode::Sandbox,
        amount: paisa(amount),
        amount_refunded: Paisa::ZERO,
        amount_reserved: Paisa::ZERO,
        currency: Currency::Npr,
        provider,
        status: PaymentStatus::Success,
        provider_ref: Some("X".into()),
        failure_reason: None,
        metadata: Map::new(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: created,
        updated_at: created,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo::default(),
        checks: Checks::default(),
        gsi2pk: None,
        gsi2sk: None,
    }
}

fn refund(time: &str, n: u128, provider: Provider, amount: i64, fee: Option<i64>) -> Refund {
    let created = at(time);
    Refund {
        id: RefundId::stored(id_at("ref_", time, n)),
        project_id: "proj_s".into(),
        payment_id: "pay_1".into(),
        mode: Mode::Sandbox,
        provider,
        amount: paisa(amount),
        currency: Currency::Npr,
        reason: RefundReason::CustomerRequest,
        status: RefundStatus::Succeeded,
        provider_refund_id: None,
        failure_reason: None,
        notes: None,
        mobile_number: None,
        created_at: created,
        updated_at: created,
        fee: fee.map(paisa),
        fee_source: fee.map(|_| FeeSource::Provider),
        listed: false,
    }
}

fn credit(date: &str, provider: Provider, amount: i64, reference: &str) -> BankCredit {
    let req = CreditRequest {
        provider: provider.as_str(),
        date,
        amount,
        reference,
    };
    new_credit(
        &tenant(),
        req,
        day("2030-01-01"),
        at("2026-11-20T00:00:00Z"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn range(from: &str, to: &str) -> DayRange {
    DayRange {
        from: day(from),
        to: day(to),
    }
}

fn field_of(e: SettlementError) -> String {
    Refusal::from(e).field.unwrap_or_default()
}

/// Expected = net of the day's successful payments (the provider's fee,
/// else the configured one, else none: the amount) less the net of the
/// day's refunds that took money back; credits against it.
#[test]
fn a_days_expected_settlement_is_net_payments_less_refunds() {
    let mut t = Tally::default();
    let d = "2026-11-20T06:00:00Z";
    let mut stated = payment(d, 1, Provider::Khalti, 100_000);
    stated.checks.fee_provider = Some(paisa(3_000));
    stated.checks.fee_configured = Some(paisa(9_999));
    let mut configured = payment(d, 2, Provider::Khalti, 50_000);
    configured.checks.fee_configured = Some(paisa(1_000));
    let no_fee = payment(d, 3, Provider::Khalti, 20_000);
    let mut refunded = payment(d, 4, Provider::Khalti, 10_000);
    refunded.status = PaymentStatus::Refunded;
    refunded.checks.fee_provider = Some(paisa(300));
    for p in [&stated, &configured, &no_fee, &refunded] {
        t.add_payment(p);
    }
    // Not money the provider holds for the merchant.
    for (n, status) in [
        (5, PaymentStatus::Failed),
        (6, PaymentStatus::Pending),
        (7, PaymentStatus::Processing),
        (8, PaymentStatus::Cancelled),
    ] {
        let mut p = payment(d, n, Provider::Khalti, 77_777);
        p.status = status;
        t.add_payment(&p);
    }
    // Refunds: one with no fee returned, one that returned part of it,
    // one eSewa-style `requires_action`; failed and processing ones not.
    t.add_refund(&refund(d, 1, Provider::Khalti, 10_000, Some(0)));
    t.add_refund(&refund(d, 2, Provider::Khalti, 5_000, Some(150)));
    let mut waiting = refund(d, 3, Provider::Khalti, 1_000, None);
    waiting.status = RefundStatus::RequiresAction;
    t.add_refund(&waiting);
    for (n, status) in [(4, RefundStatus::Failed), (5, RefundStatus::Processing)] {
        let mut r = refund(d, n, Provider::Khalti, 66_666, None);
        r.status = status;
        t.add_refund(&r);
    }
    t.add_credit(credit("2026-11-20", Provider::Khalti, 100_000, "B-1"));
    t.add_credit(credit("2026-11-20", Provider::Khalti, 50_000, "B-2"));
    let days = t.days(range("2026-11-20", "2026-11-20"), None);
    assert_eq!(days.len(), 1, "{days:?}");
    let k = &days[0];
    assert_eq!(
        (k.provider, k.date.as_str()),
        (Provider::Khalti, "2026-11-20")
    );
    let payments_net = 97_000 + 49_000 + 20_000 + 9_700;
    let refunds_net = 10_000 + 4_850 + 1_000;
    assert_eq!(k.expected_payments, 4);
    assert_eq!(k.payments_without_fee, 1);
    assert_eq!(k.payments_net, payments_net);
    assert_eq!(k.expected_refunds, 3);
    assert_eq!(k.refunds_net, refunds_net);
    assert_eq!(k.expected, payments_net - refunds_net);
    assert_eq!(k.credited, 150_000);
    assert_eq!(k.credits.len(), 2);
    assert_eq!(k.variance, 150_000 - (payments_net - refunds_net));
}

/// Refunds can outweigh a day's payments: expected goes negative, and a
/// day with only a credit shows the credit as variance.
#[test]
fn a_day_of_refunds_only_expects_less_than_nothing() {
    let mut t = Tally::default();
    t.add_refund(&refund(
        "2026-11-21T04:00:00Z",
        1,
        Provider::Esewa,
        2_500,
        None,
    ));
    t.add_credit(credit("2026-11-22", Provider::Fonepay, 700, "FP-9"));
    let days = t.days(range("2026-11-21", "2026-11-22"), None);
    assert_eq!(days.len(), 2);
    assert_eq!((days[0].expected, days[0].variance), (-2_500, 2_500));
    assert_eq!(days[0].provider, Provider::Esewa);
    assert_eq!(
        (days[1].expected, days[1].credited, days[1].variance),
        (0, 700, 700)
    );
    // Narrowed to one provider, and to the range.
    let only = Tally::default();
    assert!(
        only.days(range("2026-11-21", "2026-11-22"), None)
            .is_empty()
    );
    let mut t = Tally::default();
    t.add_credit(credit("2026-11-22", Provider::Fonepay, 700, "FP-9"));
    t.add_credit(credit("2026-11-23", Provider::Fonepay, 700, "FP-10"));
    t.add_credit(credit("2026-11-22", Provider::Esewa, 700, "E-10"));
    let days = t.days(range("2026-11-21", "2026-11-22"), Some(Provider::Fonepay));
    assert_eq!(days.len(), 1, "{days:?}");
}

/// A Nepal day runs from 18:15 UTC the day before: 23:59:59.999 in
/// Kathmandu is the same day, 00:00 the next.
#[test]
fn days_are_nepal_days_at_the_0545_boundary() {
    let last = id_at("pay_", "2026-11-20T18:14:59.999Z", 1);
    let first = id_at("pay_", "2026-11-20T18:15:00.000Z", 1);
    let never = at("2000-01-01T00:00:00Z");
    assert_eq!(day_of(minted_at_ms(&last), never), day("2026-11-20"));
    assert_eq!(day_of(minted_at_ms(&first), never), day("2026-11-21"));
    // Not one of our ids: its creation time.
    assert_eq!(
        day_of(minted_at_ms("legacy"), at("2026-11-20T18:15:00Z")),
        day("2026-11-21")
    );
    let mut t = Tally::default();
    t.add_payment(&payment(
        "2026-11-20T18:14:59.999Z",
        1,
        Provider::Esewa,
        100,
    ));
    t.add_payment(&payment("2026-11-20T18:15:00Z", 2, Provider::Esewa, 200));
    let days = t.days(range("2026-11-20", "2026-11-21"), None);
    let got: Vec<(String, i64)> = days.iter().map(|d| (d.date.clone(), d.expected)).collect();
    assert_eq!(
        got,
        vec![("2026-11-20".into(), 100), ("2026-11-21".into(), 200)]
    );
}

#[test]
fn ranges_are_checked_and_bounded() {
    let today = day("2026-11-29");
    let r = DayRange::parse(None, None, today).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r, range("2026-11-23", "2026-11-29"));
    let r = DayRange::parse(Some("2026-09-01"), Some("2026-11-30"), today)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.days().count(), 91);
    let r = DayRange::parse(Some("2026-09-01"), Some("2026-12-01"), today)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.days().count(), 92);
    for (from, to, field) in [
        (Some("2026-09-01"), Some("2026-12-02"), "to"),
        (Some("2026-11-02"), Some("2026-11-01"), "from"),
        (Some("2026-11-1"), None, "from"),
        (Some("yesterday"), None, "from"),
        (None, Some("2026-02-30"), "to"),
        (None, Some("2026-11-01T00:00:00Z"), "to"),
        (None, Some("1999-12-31"), "to"),
        (None, Some(""), "to"),
    ] {
        match DayRange::parse(from, to, today) {
            Err(e) => assert_eq!(field_of(e), field, "{from:?} {to:?}"),
            Ok(r) => panic!("{from:?} {to:?} accepted: {r:?}"),
        }
    }
}

#[test]
fn a_credit_names_the_field_it_breaks() {
    let ok = CreditRequest {
        provider: "khalti",
        date: "2026-11-20",
        amount: 10_000,
        reference: " NIC-778 ",
    };
    let today = day("2026-11-29");
    let now = at("2026-11-29T00:00:00Z");
    let c = new_credit(&tenant(), ok, today, now).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.reference, "NIC-778");
    assert_eq!(c.date, "2026-11-20");
    assert!(
        new_credit(
            &tenant(),
            CreditRequest {
                date: "2026-11-29",
                ..ok
            },
            today,
            now
        )
        .is_ok()
    );
    for (req, field) in [
        (
            CreditRequest {
                provider: "paypal",
                ..ok
            },
            "provider",
        ),
        (CreditRequest { provider: "", ..ok }, "provider"),
        (
            CreditRequest {
                date: "2026-11-30",
                ..ok
            },
            "date",
        ),
        (
            CreditRequest {
                date: "20-11-2026",
                ..ok
            },
            "date",
        ),
        (CreditRequest { amount: 0, ..ok }, "amount"),
        (CreditRequest { amount: -5, ..ok }, "amount"),
        (
            CreditRequest {
                amount: super::MAX_CREDIT + 1,
                ..ok
            },
            "amount",
        ),
        (
            CreditRequest {
                reference: "  ",
                ..ok
            },
            "reference",
        ),
        (
            CreditRequest {
                reference: "a\nb",
                ..ok
            },
            "reference",
        ),
        (
            CreditRequest {
                reference: &"x".repeat(101),
                ..ok
            },
            "reference",
        ),
    ] {
        match new_credit(&tenant(), req, today, now) {
            Err(e) => assert_eq!(field_of(e), field, "{req:?}"),
            Ok(c) => panic!("{req:?} accepted: {c:?}"),
        }
    }
}

fn deps(store: &Arc<dyn Store>, now: &str) -> crate::AppState {
    crate::AppState::new(
        store.clone(),
        Arc::new(ManualClock::new(at(now))),
        crate::Config {
            public_base_url: "https://pay.example".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

fn req<'a>(provider: &'a str, reference: &'a str) -> CreditRequest<'a> {
    CreditRequest {
        provider,
        date: "2026-11-20",
        amount: 12_345,
        reference,
    }
}

#[tokio::test]
async fn a_reference_is_recorded_once_per_provider_until_deleted() {
    let store = memory_store();
    let st = deps(&store, "2026-11-25T00:00:00Z");
    let t = tenant();
    let first = record_credit(&st, &t, req("khalti", "NIC-1"), None, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The same reference, any case or spacing, for the same provider.
    let again = record_credit(&st, &t, req("khalti", " nic-1"), None, Vec::new()).await;
    match again {
        Err(e @ SettlementError::DuplicateReference { .. }) => {
            let r = Refusal::from(e);
            assert_eq!(r.code, "duplicate_reference");
            assert!(r.message.contains(first.id.as_str()), "{}", r.message);
        }
        other => panic!("{other:?}"),
    }
    // Another provider's, another mode's: their own.
    assert!(
        record_credit(&st, &t, req("esewa", "NIC-1"), None, Vec::new())
            .await
            .is_ok()
    );
    let live = Tenant::new("proj_s", Mode::Live);
    assert!(
        record_credit(&st, &live, req("khalti", "NIC-1"), None, Vec::new())
            .await
            .is_ok()
    );
    // Another tenant does not see it, nor delete it.
    assert!(matches!(
        get_credit(&st, &live, &first.id).await,
        Err(SettlementError::NotFound(_))
    ));
    assert!(matches!(
        delete_credit(&st, &live, &first.id, Vec::new()).await,
        Err(SettlementError::NotFound(_))
    ));
    // Deleted: the reference is free again, the credit gone.
    let gone = delete_credit(&st, &t, &first.id, Vec::new()).await;
    assert_eq!(gone.ok().map(|c| c.id), Some(first.id.clone()));
    assert!(matches!(
        delete_credit(&st, &t, &first.id, Vec::new()).await,
        Err(SettlementError::NotFound(_))
    ));
    assert!(
        record_credit(&st, &t, req("khalti", "NIC-1"), None, Vec::new())
            .await
            .is_ok()
    );
}

/// Twenty requests with one reference at once: one credit.
#[tokio::test]
async fn concurrent_credits_with_one_reference_record_one() {
    let store = memory_store();
    let st = deps(&store, "2026-11-25T00:00:00Z");
    let t = tenant();
    let tries = (0..20).map(|_| {
        let st = st.clone();
        let t = t.clone();
        tokio::spawn(async move {
            record_credit(&st, &t, req("fonepay", "FP-RACE"), None, Vec::new())
                .await
                .is_ok()
        })
    });
    let mut made = 0;
    for h in tries {
        if h.await.unwrap_or(false) {
            made += 1;
        }
    }
    assert_eq!(made, 1);
    let s = settlements(
        &st,
        &t,
        SettlementQuery {
            provider: Some("fonepay"),
            from: Some("2026-11-20"),
            to: Some("2026-11-20"),
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.data.len(), 1);
    assert_eq!(s.data[0].credits.len(), 1);
    assert_eq!(s.data[0].credited, 12_345);
}

/// Through the store: the range's edges in Nepal time, other tenants and
/// providers left out.
#[tokio::test]
async fn the_store_read_takes_exactly_the_ranges_records() {
    let store = memory_store();
    let st = deps(&store, "2026-11-25T00:00:00Z");
    let t = tenant();
    let inside = [
        payment("2026-11-19T18:15:00Z", 1, Provider::Khalti, 1_000),
        payment("2026-11-20T18:14:59.999Z", 2, Provider::Khalti, 2_000),
    ];
    let outside = [
        payment("2026-11-19T18:14:59.999Z", 3, Provider::Khalti, 40_000),
        payment("2026-11-20T18:15:00Z", 4, Provider::Khalti, 80_000),
    ];
    let mut other_mode = payment("2026-11-20T06:00:00Z", 5, Provider::Khalti, 160_000);
    other_mode.mode = Mode::Live;
    let other_provider = payment("2026-11-20T06:00:00Z", 6, Provider::Esewa, 320_000);
    for p in inside
        .iter()
        .chain(&outside)
        .chain([&other_mode, &other_provider])
    {
        assert!(payments::insert(&*store, p).await.is_ok());
    }
    let r = refund("2026-11-20T10:00:00Z", 1, Provider::Khalti, 500, Some(0));
    let late = refund("2026-11-20T18:15:00Z", 2, Provider::Khalti, 600, Some(0));
    for r in [&r, &late] {
        let item = r.to_item().unwrap_or_else(|e| panic!("{e}"));
        assert!(store.put(item, None).await.is_ok());
    }
    assert!(
        record_credit(&st, &t, req("khalti", "K-20"), None, Vec::new())
            .await
            .is_ok()
    );
    let s = settlements(
        &st,
        &t,
        SettlementQuery {
            provider: Some("khalti"),
            from: Some("2026-11-20"),
            to: Some("2026-11-20"),
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (s.from.as_str(), s.to.as_str()),
        ("2026-11-20", "2026-11-20")
    );
    assert_eq!(s.data.len(), 1, "{:?}", s.data);
    let d = &s.data[0];
    assert_eq!((d.expected_payments, d.payments_net), (2, 3_000));
    assert_eq!((d.expected_refunds, d.refunds_net), (1, 500));
    assert_eq!((d.expected, d.credited, d.variance), (2_500, 12_345, 9_845));
    // All providers: eSewa's day too.
    let all = settlements(
        &st,
        &t,
        SettlementQuery {
            provider: None,
            from: Some("2026-11-20"),
            to: Some("2026-11-20"),
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let providers: Vec<Provider> = all.data.iter().map(|d| d.provider).collect();
    assert_eq!(providers, vec![Provider::Esewa, Provider::Khalti]);
    // Bad input names its parameter.
    let bad = settlements(
        &st,
        &t,
        SettlementQuery {
            provider: Some("paypal"),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(bad.err().map(field_of), Some("provider".into()));
}
