//! The analytics overview (`GET /v1/analytics/overview`) from the per-day
//! counters that every session and payment change adds to
//! ([`checkout::stats`](super::checkout::stats), decisions, "Analytics").
//! Reads ([`overview`], [`day_totals`]) query the sort-key range from
//! `DAY#<first day>` to `DAY#<last day>#~` and sum every item in it: the
//! items of the former layout (`DAY#YYYY-MM-DD`, no shard) and any shard
//! number, so the number of shards may change without moving data. The
//! overview reads O(days x shards) small items with one paginated query.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Provider;
use super::checkout::stats::{DayCounters, day_end_sk, day_of, day_sk, start_of_day};
use super::record::from_item;
use super::totals::Counter;
use crate::Deps;
use crate::domain::Tenant;
use crate::store::{Query, SkCond, Store, StoreError};
use crate::time::Timestamp;

/// Days in the window when the request names none.
pub const DEFAULT_DAYS: u32 = 30;
/// The longest window.
pub const MAX_DAYS: u32 = 90;

/// Checks the `days` query parameter: an integer from 1 to [`MAX_DAYS`],
/// [`DEFAULT_DAYS`] when absent. The error is the message for `days`.
pub fn parse_days(raw: Option<&str>) -> Result<u32, String> {
    match raw {
        None => Ok(DEFAULT_DAYS),
        Some(r) => match r.trim().parse::<i64>() {
            Ok(n) if (1..=i64::from(MAX_DAYS)).contains(&n) => {
                u32::try_from(n).map_err(|e| e.to_string())
            }
            _ => Err(format!(
                "days must be an integer from 1 to {MAX_DAYS}, got '{r}'"
            )),
        },
    }
}

#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(as = AnalyticsWindow)]
pub struct Window {
    pub days: u32,
    pub start: Timestamp,
    pub end: Timestamp,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, utoipa::ToSchema)]
pub struct PaymentFigures {
    pub total: i64,
    pub success: i64,
    pub failed: i64,
    pub success_rate: f64,
    pub success_volume_paisa: i64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Funnel {
    pub sessions_created: i64,
    pub sessions_initiated: i64,
    pub sessions_paid: i64,
    pub conversion_rate_initiated_to_paid: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct ProviderFigures {
    pub provider: Provider,
    pub count: i64,
    pub success_count: i64,
    pub success_volume_paisa: i64,
}

/// The answer of `GET /v1/analytics/overview`.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Overview {
    pub window: Window,
    pub payments: PaymentFigures,
    pub funnel: Funnel,
    pub by_provider: Vec<ProviderFigures>,
}

fn ratio(part: i64, whole: i64) -> f64 {
    if whole <= 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The overview of the last `days` UTC days including today's (the window
/// starts at midnight UTC `days - 1` days before now, by the deps' clock,
/// and ends now).
pub async fn overview(deps: &Deps, tenant: &Tenant, days: u32) -> Result<Overview, StoreError> {
    let now = deps.clock.now();
    let (days, start, items) = window_items(&*deps.store, tenant, days, now).await?;
    Ok(summarize(&items, days, start, now))
}

/// The window of `days` days ending `now` (clamped to 1..=MAX_DAYS), its
/// first midnight, and its day counter items: one read.
async fn window_items(
    store: &dyn Store,
    tenant: &Tenant,
    days: u32,
    now: Timestamp,
) -> Result<(u32, Timestamp, Vec<DayCounters>), StoreError> {
    let days = days.clamp(1, MAX_DAYS);
    let start = start_of_day(now).plus(chrono::Duration::days(-(i64::from(days) - 1)));
    let items = day_items(store, tenant, &day_of(start), &day_of(now)).await?;
    Ok((days, start, items))
}

/// One UTC day's successful payments, for the dashboard's chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DayFigures {
    /// `YYYY-MM-DD`.
    pub day: String,
    pub success: i64,
    pub success_volume_paisa: i64,
}

/// [`overview`] and the same window day by day (every day present, oldest
/// first), from the same one read of the counters.
pub async fn overview_by_day(
    deps: &Deps,
    tenant: &Tenant,
    days: u32,
) -> Result<(Overview, Vec<DayFigures>), StoreError> {
    let now = deps.clock.now();
    let (days, start, items) = window_items(&*deps.store, tenant, days, now).await?;
    let mut series: Vec<DayFigures> = (0..i64::from(days))
        .map(|n| DayFigures {
            day: day_of(start.plus(chrono::Duration::days(n))),
            success: 0,
            success_volume_paisa: 0,
        })
        .collect();
    for item in &items {
        // `DAY#YYYY-MM-DD` or `DAY#YYYY-MM-DD#shard`.
        let day = item.sk.get(4..14);
        if let Some(slot) = day.and_then(|d| series.iter_mut().find(|f| f.day == d)) {
            slot.success += item.payments_success.get();
            slot.success_volume_paisa += item.success_volume_paisa.get();
        }
    }
    Ok((summarize(&items, days, start, now), series))
}

/// Every counter item from the day `first` to the day `last` (both
/// `YYYY-MM-DD`, inclusive): all shards, and the unsharded items of the
/// former layout; all pages.
async fn day_items(
    store: &dyn Store,
    tenant: &Tenant,
    first: &str,
    last: &str,
) -> Result<Vec<DayCounters>, StoreError> {
    let mut q = Query::partition(crate::keys::stats_partition(&tenant.project, tenant.mode))
        .sk(SkCond::Between(day_sk(first), day_end_sk(last)));
    let mut items = Vec::new();
    loop {
        let page = store.query(&q).await?;
        for item in page.items {
            items.push(from_item(item)?);
        }
        match page.last_key {
            Some(last) => q.start_after = Some(last),
            None => break,
        }
    }
    Ok(items)
}

/// The counters of the UTC day of `at`: the sums over all the day's items
/// (every shard, and an unsharded item of the former layout). Counters
/// never added to are absent; a day without items gives an empty map.
pub async fn day_totals(
    store: &dyn Store,
    tenant: &Tenant,
    at: Timestamp,
) -> Result<BTreeMap<String, i64>, StoreError> {
    let day = day_of(at);
    let mut totals = BTreeMap::new();
    for item in day_items(store, tenant, &day, &day).await? {
        for (attr, count) in item.counters() {
            if let Some(n) = count.stored() {
                *totals.entry(attr.name().to_owned()).or_insert(0) += n;
            }
        }
    }
    Ok(totals)
}

/// Sums counter items (any number per day: shards, former unsharded
/// items) into the overview.
pub fn summarize(items: &[DayCounters], days: u32, start: Timestamp, end: Timestamp) -> Overview {
    let sum = |count: &dyn Fn(&DayCounters) -> Counter| -> i64 {
        items.iter().map(|i| count(i).get()).sum()
    };
    let total = sum(&|c| c.payments_total);
    let success = sum(&|c| c.payments_success);
    let initiated = sum(&|c| c.sessions_initiated);
    let paid = sum(&|c| c.sessions_paid);
    let by_provider = Provider::ALL
        .iter()
        .map(|&p| ProviderFigures {
            provider: p,
            count: sum(&|c| c.provider(p).count),
            success_count: sum(&|c| c.provider(p).success),
            success_volume_paisa: sum(&|c| c.provider(p).success_volume),
        })
        .filter(|f| f.count > 0 || f.success_count > 0)
        .collect();
    Overview {
        window: Window { days, start, end },
        payments: PaymentFigures {
            total,
            success,
            failed: sum(&|c| c.payments_failed),
            success_rate: ratio(success, total),
            success_volume_paisa: sum(&|c| c.success_volume_paisa),
        },
        funnel: Funnel {
            sessions_created: sum(&|c| c.sessions_created),
            sessions_initiated: initiated,
            sessions_paid: paid,
            conversion_rate_initiated_to_paid: ratio(paid, initiated),
        },
        by_provider,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Mode;
    use crate::domain::checkout::stats::{
        DayCounters, SHARDS, Tally, counter_key, day_key, shard_of, shard_sk,
    };
    use crate::domain::checkout::{
        self, CheckoutSession, CreateCheckout, Creator, validate_create,
    };
    use crate::domain::payments::{AttemptInfo, Payment, PaymentStatus};
    use crate::money::{Currency, Paisa};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{Item, Key, PK, SK, TTL, TxOp, Update};
    use crate::testenv::at;
    use serde_json::json;

    /// The deps over `store`, their clock at `now`.
    fn deps_at(store: std::sync::Arc<dyn Store>, now: Timestamp) -> crate::AppState {
        crate::AppState::new(
            store,
            std::sync::Arc::new(crate::time::ManualClock::new(now)),
            crate::Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
    }

    fn session(now: Timestamp) -> CheckoutSession {
        let req: CreateCheckout = serde_json::from_value(json!({
            "amount": 100_000, "returnUrl": "https://shop.example/thanks"
        }))
        .unwrap();
        let creator = Creator {
            project_id: "proj_1".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: None,
        };
        checkout::new_session(&creator, validate_create(req, Mode::Sandbox).unwrap(), now)
    }

    fn payment(s: &CheckoutSession, provider: Provider, now: Timestamp) -> Payment {
        Payment {
            id: "pay_1".into(),
            project_id: s.project_id.clone(),
            checkout_session_id: s.id.clone(),
            mode: s.mode,
            amount: Paisa::new(100_000).unwrap(),
            amount_refunded: Paisa::ZERO,
            amount_reserved: Paisa::ZERO,
            gsi2pk: None,
            gsi2sk: None,
            currency: Currency::Npr,
            provider,
            status: PaymentStatus::Pending,
            provider_ref: None,
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
        }
    }

    #[test]
    fn days_are_1_to_90_defaulting_to_30() {
        assert_eq!(parse_days(None), Ok(30));
        assert_eq!(parse_days(Some("1")), Ok(1));
        assert_eq!(parse_days(Some("90")), Ok(90));
        for bad in ["0", "91", "x", "", "-1", "1.5"] {
            assert!(parse_days(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn counters_go_to_the_creation_day_of_the_record() {
        let created = at("2026-11-20T23:59:00Z");
        let s = session(created);
        let p = payment(&s, Provider::Khalti, at("2026-11-21T00:01:00Z"));
        let mut t = Tally::new();
        t.session_paid(&s);
        t.payment_succeeded(&p);
        let day_s = day_key(&Tenant::new("proj_1", Mode::Sandbox), created);
        let day_p = day_key(&Tenant::new("proj_1", Mode::Sandbox), p.created_at);
        assert_eq!(day_s.sk, "DAY#2026-11-20");
        assert_eq!(day_p.sk, "DAY#2026-11-21");
        assert_eq!(day_s.pk, "PROJ#proj_1#sandbox#STATS");
        assert_eq!(t.added(&day_s, DayCounters::SESSIONS_PAID.name()), 1);
        assert_eq!(t.added(&day_p, DayCounters::SESSIONS_PAID.name()), 0);
        assert_eq!(t.added(&day_p, DayCounters::PAYMENTS_SUCCESS.name()), 1);
        assert_eq!(
            t.added(&day_p, DayCounters::SUCCESS_VOLUME_PAISA.name()),
            100_000
        );
        assert_eq!(t.added(&day_p, "khalti_success"), 1);
        assert_eq!(t.added(&day_p, "khalti_success_volume"), 100_000);
        // Each on a shard item of its day, the shard of the session.
        assert_eq!(
            t.keys(),
            vec![
                &counter_key(&Tenant::new("proj_1", Mode::Sandbox), created, &s.id),
                &counter_key(&Tenant::new("proj_1", Mode::Sandbox), p.created_at, &s.id),
            ]
        );
        let shard = format!("#{:02}", shard_of(&s.id));
        assert_eq!(t.keys()[0].sk, format!("DAY#2026-11-20{shard}"));
        assert_eq!(t.keys()[1].sk, format!("DAY#2026-11-21{shard}"));
    }

    #[test]
    fn each_transition_adds_its_counters() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Esewa, now);
        let day = day_key(&Tenant::new("proj_1", Mode::Sandbox), now);
        type Case = (&'static str, Tally, Vec<(&'static str, i64)>);
        let cases: Vec<Case> = vec![
            (
                "session created",
                {
                    let mut t = Tally::new();
                    t.session_created(&s);
                    t
                },
                vec![(DayCounters::SESSIONS_CREATED.name(), 1)],
            ),
            (
                "session initiated",
                {
                    let mut t = Tally::new();
                    t.session_initiated(&s);
                    t
                },
                vec![(DayCounters::SESSIONS_INITIATED.name(), 1)],
            ),
            (
                "session paid",
                {
                    let mut t = Tally::new();
                    t.session_paid(&s);
                    t
                },
                vec![(DayCounters::SESSIONS_PAID.name(), 1)],
            ),
            (
                "payment created",
                {
                    let mut t = Tally::new();
                    t.payment_created(&p);
                    t
                },
                vec![(DayCounters::PAYMENTS_TOTAL.name(), 1), ("esewa_count", 1)],
            ),
            (
                "payment succeeded",
                {
                    let mut t = Tally::new();
                    t.payment_succeeded(&p);
                    t
                },
                vec![
                    (DayCounters::PAYMENTS_SUCCESS.name(), 1),
                    (DayCounters::SUCCESS_VOLUME_PAISA.name(), 100_000),
                    ("esewa_success", 1),
                    ("esewa_success_volume", 100_000),
                ],
            ),
            (
                "payment failed",
                {
                    let mut t = Tally::new();
                    t.payment_failed(&p);
                    t
                },
                vec![(DayCounters::PAYMENTS_FAILED.name(), 1)],
            ),
        ];
        let all = [
            DayCounters::SESSIONS_CREATED.name(),
            DayCounters::SESSIONS_INITIATED.name(),
            DayCounters::SESSIONS_PAID.name(),
            DayCounters::PAYMENTS_TOTAL.name(),
            DayCounters::PAYMENTS_SUCCESS.name(),
            DayCounters::PAYMENTS_FAILED.name(),
            DayCounters::SUCCESS_VOLUME_PAISA.name(),
            "esewa_count",
            "esewa_success",
            "esewa_success_volume",
        ];
        for (name, tally, want) in cases {
            for attr in all {
                let expected = want
                    .iter()
                    .find(|(a, _)| *a == attr)
                    .map(|(_, v)| *v)
                    .unwrap_or(0);
                assert_eq!(tally.added(&day, attr), expected, "{name}: {attr}");
            }
        }
    }

    #[test]
    fn adds_merge_into_one_op_per_item() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Fonepay, now);
        let mut t = Tally::new();
        t.session_initiated(&s);
        t.payment_created(&p);
        t.session_initiated(&s);
        let day = counter_key(&Tenant::new("proj_1", Mode::Sandbox), now, &s.id);
        // The transaction already updates the counter item: the adds join it.
        let mut ops = vec![TxOp::Update {
            key: day.clone(),
            update: Update::new().add(DayCounters::PAYMENTS_TOTAL.name(), 2),
            cond: None,
        }];
        t.apply_to(&mut ops).unwrap();
        // And the payment's all-time count, on its session's item.
        assert_eq!(ops.len(), 2);
        let all_time =
            crate::domain::totals::item_key(&Tenant::new("proj_1", Mode::Sandbox), &s.id);
        assert_eq!(ops[1].key(), Some(all_time));
        let TxOp::Update { update, .. } = &ops[0] else {
            panic!("not an update")
        };
        let get = |a: &str| update.add.iter().find(|(x, _)| x == a).map(|(_, v)| *v);
        assert_eq!(get(DayCounters::PAYMENTS_TOTAL.name()), Some(3));
        assert_eq!(get(DayCounters::SESSIONS_INITIATED.name()), Some(2));
        assert_eq!(get("fonepay_count"), Some(1));
        assert!(update.set.iter().any(|(a, _)| a == TTL));

        // A put of the same key cannot take adds: refused, not doubled.
        let mut t = Tally::new();
        t.session_created(&s);
        let mut ops = vec![TxOp::Check {
            key: day,
            cond: crate::store::Cond::Exists,
        }];
        assert!(t.apply_to(&mut ops).is_err());
    }

    #[tokio::test]
    async fn the_overview_reads_the_window_of_days() {
        let store = std::sync::Arc::new(EmbeddedStore::in_memory().unwrap());
        let now = at("2026-11-22T10:00:00Z");
        let day = |d: i64| now.plus(chrono::Duration::days(-d));
        let mut t = Tally::new();
        for d in [0, 1, 6, 7, 30] {
            let s = session(day(d));
            let p = payment(&s, Provider::Khalti, day(d));
            t.session_created(&s);
            t.session_initiated(&s);
            t.payment_created(&p);
            if d != 1 {
                t.session_paid(&s);
                t.payment_succeeded(&p);
            } else {
                t.payment_failed(&p);
            }
        }
        // Another mode's counters are apart.
        let mut live = session(now);
        live.mode = Mode::Live;
        t.session_created(&live);
        let mut ops = Vec::new();
        t.apply_to(&mut ops).unwrap();
        store.transact(ops).await.unwrap();
        let deps = deps_at(store.clone(), now);

        let o = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 7)
            .await
            .unwrap();
        assert_eq!(o.window.start, at("2026-11-16T00:00:00Z"));
        assert_eq!(o.window.end, now);
        assert_eq!(o.funnel.sessions_created, 3);
        assert_eq!(o.funnel.sessions_initiated, 3);
        assert_eq!(o.funnel.sessions_paid, 2);
        assert_eq!(o.payments.total, 3);
        assert_eq!(o.payments.success, 2);
        assert_eq!(o.payments.failed, 1);
        assert!((o.payments.success_rate - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(o.payments.success_volume_paisa, 200_000);
        assert_eq!(
            o.by_provider,
            vec![ProviderFigures {
                provider: Provider::Khalti,
                count: 3,
                success_count: 2,
                success_volume_paisa: 200_000,
            }]
        );
        let all = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 90)
            .await
            .unwrap();
        assert_eq!(all.funnel.sessions_created, 5);
        let one = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 1)
            .await
            .unwrap();
        assert_eq!(one.funnel.sessions_created, 1);
        let live = overview(&deps, &Tenant::new("proj_1", Mode::Live), 30)
            .await
            .unwrap();
        assert_eq!(live.funnel.sessions_created, 1);
        assert_eq!(live.payments.total, 0);
        assert_eq!(live.payments.success_rate, 0.0);
        assert_eq!(live.funnel.conversion_rate_initiated_to_paid, 0.0);
        assert!(live.by_provider.is_empty());
    }

    #[test]
    fn shard_choice_is_stable_and_spreads() {
        // Pinned values: a change of hash would move live counters between
        // shards mid-day (harmless for reads, but not meant to happen).
        assert_eq!(shard_of(""), 1);
        assert_eq!(shard_of("cs_01JD0000000000000000000000"), 0);
        assert_eq!(shard_of("cs_01JD0000000000000000000001"), 7);
        for id in ["cs_a", "cs_b", "pay_1", "some longer id with spaces"] {
            assert_eq!(shard_of(id), shard_of(id), "{id}");
            assert!(shard_of(id) < SHARDS, "{id}");
        }
        let mut hits = [0u32; SHARDS as usize];
        for i in 0..1000 {
            hits[shard_of(&format!("cs_{i}")) as usize] += 1;
        }
        assert!(hits.iter().all(|&n| n > 60), "uneven: {hits:?}");
        // Real (ULID) ids spread too.
        let mut hits = [0u32; SHARDS as usize];
        for _ in 0..1000 {
            let id = crate::ids::new_id(crate::ids::IdKind::CheckoutSession);
            hits[shard_of(&id) as usize] += 1;
        }
        assert!(hits.iter().all(|&n| n > 60), "uneven: {hits:?}");
    }

    #[test]
    fn shard_keys_sort_inside_their_day() {
        let day = "2026-11-22";
        let (lo, hi) = (day_sk(day), day_end_sk(day));
        for shard in 0..SHARDS {
            let sk = shard_sk(day, shard);
            assert!(lo < sk && sk < hi, "{sk}");
        }
        assert!(shard_sk(day, 0) < shard_sk(day, SHARDS - 1));
        // Neighbouring days stay outside.
        assert!(day_end_sk("2026-11-21") < lo);
        assert!(hi < day_sk("2026-11-23"));
        assert!(hi < shard_sk("2026-11-23", 0));
    }

    #[test]
    fn a_session_and_its_payment_land_on_one_item() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Khalti, now);
        let mut t = Tally::new();
        t.session_initiated(&s);
        t.payment_created(&p);
        t.session_paid(&s);
        t.payment_succeeded(&p);
        let key = counter_key(&Tenant::new("proj_1", Mode::Sandbox), now, &s.id);
        // The day's item, and the all-time item of the session's shard.
        let all_time =
            crate::domain::totals::item_key(&Tenant::new("proj_1", Mode::Sandbox), &s.id);
        assert_eq!(t.keys(), vec![&key, &all_time]);
        let mut ops = Vec::new();
        t.apply_to(&mut ops).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].key(), Some(key));
        // Without a session id a payment shards on its own id.
        let mut orphan = payment(&s, Provider::Khalti, now);
        orphan.checkout_session_id = Default::default();
        let mut t = Tally::new();
        t.payment_created(&orphan);
        assert_eq!(
            t.keys(),
            vec![
                &counter_key(&Tenant::new("proj_1", Mode::Sandbox), now, "pay_1"),
                &crate::domain::totals::item_key(&Tenant::new("proj_1", Mode::Sandbox), "pay_1")
            ]
        );
    }

    /// Puts a counter item as the former layout wrote it (no shard).
    async fn put_unsharded(store: &dyn Store, at: Timestamp, counts: &[(&str, i64)]) {
        let key = day_key(&Tenant::new("proj_1", Mode::Sandbox), at);
        let mut item = Item::new();
        item.insert(PK.into(), key.pk.clone().into());
        item.insert(SK.into(), key.sk.clone().into());
        for (attr, n) in counts {
            item.insert((*attr).into(), (*n).into());
        }
        store.put(item, None).await.unwrap();
    }

    #[tokio::test]
    async fn old_unsharded_items_count_with_the_shards_of_their_day() {
        let store = std::sync::Arc::new(EmbeddedStore::in_memory().unwrap());
        let now = at("2026-11-22T10:00:00Z");
        let deps = deps_at(store.clone(), now);
        let yesterday = now.plus(chrono::Duration::days(-1));
        // Written before the shards: today's and yesterday's item.
        put_unsharded(
            &*store,
            now,
            &[
                (DayCounters::SESSIONS_CREATED.name(), 4),
                (DayCounters::PAYMENTS_TOTAL.name(), 3),
                (DayCounters::PAYMENTS_SUCCESS.name(), 2),
                ("khalti_count", 3),
                ("khalti_success", 2),
            ],
        )
        .await;
        put_unsharded(
            &*store,
            yesterday,
            &[(DayCounters::SESSIONS_CREATED.name(), 10)],
        )
        .await;
        // Then sharded adds on the same days.
        let mut t = Tally::new();
        for _ in 0..5 {
            let s = session(now);
            let p = payment(&s, Provider::Khalti, now);
            t.session_created(&s);
            t.payment_created(&p);
            t.payment_succeeded(&p);
        }
        t.session_created(&session(yesterday));
        let mut ops = Vec::new();
        t.apply_to(&mut ops).unwrap();
        store.transact(ops).await.unwrap();

        let today = day_totals(&*store, &Tenant::new("proj_1", Mode::Sandbox), now)
            .await
            .unwrap();
        assert_eq!(today.get(DayCounters::SESSIONS_CREATED.name()), Some(&9));
        assert_eq!(today.get(DayCounters::PAYMENTS_TOTAL.name()), Some(&8));
        assert_eq!(today.get(DayCounters::PAYMENTS_SUCCESS.name()), Some(&7));
        assert_eq!(
            today.get(DayCounters::SUCCESS_VOLUME_PAISA.name()),
            Some(&500_000)
        );
        assert_eq!(today.get("khalti_count"), Some(&8));
        assert!(!today.contains_key(TTL) && !today.contains_key(PK));
        let before = day_totals(&*store, &Tenant::new("proj_1", Mode::Sandbox), yesterday)
            .await
            .unwrap();
        assert_eq!(before.get(DayCounters::SESSIONS_CREATED.name()), Some(&11));
        assert_eq!(before.len(), 1);
        let empty = day_totals(&*store, &Tenant::new("proj_1", Mode::Live), now)
            .await
            .unwrap();
        assert!(empty.is_empty());

        let one = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 1)
            .await
            .unwrap();
        assert_eq!(one.funnel.sessions_created, 9);
        assert_eq!(one.payments.total, 8);
        assert_eq!(one.payments.success, 7);
        assert_eq!(one.payments.success_volume_paisa, 500_000);
        assert_eq!(
            one.by_provider,
            vec![ProviderFigures {
                provider: Provider::Khalti,
                count: 8,
                success_count: 7,
                success_volume_paisa: 500_000,
            }]
        );
        let two = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 2)
            .await
            .unwrap();
        assert_eq!(two.funnel.sessions_created, 20);
    }

    /// A store whose queries return at most 2 items a page.
    struct SmallPages {
        inner: EmbeddedStore,
        queries: std::sync::atomic::AtomicU64,
    }

    #[async_trait::async_trait]
    impl Store for SmallPages {
        fn instance(&self) -> u64 {
            self.inner.instance()
        }

        async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
            self.inner.get(key).await
        }
        async fn put(
            &self,
            item: Item,
            cond: Option<crate::store::Cond>,
        ) -> Result<(), StoreError> {
            self.inner.put(item, cond).await
        }
        async fn update(
            &self,
            key: &Key,
            update: Update,
            cond: Option<crate::store::Cond>,
        ) -> Result<Item, StoreError> {
            self.inner.update(key, update, cond).await
        }
        async fn delete(
            &self,
            key: &Key,
            cond: Option<crate::store::Cond>,
        ) -> Result<(), StoreError> {
            self.inner.delete(key, cond).await
        }
        async fn transact(&self, ops: Vec<TxOp>) -> Result<(), StoreError> {
            self.inner.transact(ops).await
        }
        async fn query(&self, query: &Query) -> Result<crate::store::QueryPage, StoreError> {
            self.queries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut q = query.clone();
            q.limit = Some(2);
            self.inner.query(&q).await
        }
        async fn count(&self, query: &Query) -> Result<u64, StoreError> {
            self.inner.count(query).await
        }
    }

    #[tokio::test]
    async fn the_overview_sums_every_shard_of_every_day_across_pages() {
        let store = std::sync::Arc::new(SmallPages {
            inner: EmbeddedStore::in_memory().unwrap(),
            queries: Default::default(),
        });
        let now = at("2026-11-22T10:00:00Z");
        let deps = deps_at(store.clone(), now);
        let day = |d: i64| now.plus(chrono::Duration::days(-d));
        // 40 sessions a day on the window's first and last day and the days
        // just outside it, enough to fill every shard.
        let (mut created, mut paid, mut volume) = (0, 0, 0);
        for d in [0, 1, 5, 6, 7] {
            for i in 0..40 {
                let mut s = session(day(d));
                s.id = crate::ids::SessionId::stored(format!("cs_{d}_{i}")); // fixed ids: every shard is hit
                let mut p = payment(&s, Provider::Esewa, day(d));
                p.amount = Paisa::new(1_000 + i).unwrap();
                let mut t = Tally::new();
                t.session_created(&s);
                t.payment_created(&p);
                if i % 2 == 0 {
                    t.session_paid(&s);
                    t.payment_succeeded(&p);
                }
                if d != 7 {
                    created += 1;
                    if i % 2 == 0 {
                        paid += 1;
                        volume += 1_000 + i;
                    }
                }
                let mut ops = Vec::new();
                t.apply_to(&mut ops).unwrap();
                store.transact(ops).await.unwrap();
            }
            let shards = store
                .inner
                .query(
                    &Query::partition(crate::keys::stats_partition("proj_1", Mode::Sandbox)).sk(
                        SkCond::Between(day_sk(&day_of(day(d))), day_end_sk(&day_of(day(d)))),
                    ),
                )
                .await
                .unwrap()
                .items
                .len();
            assert_eq!(shards, SHARDS as usize, "day -{d}");
        }
        // Today's figures also with the sums of day_totals.
        let today = day_totals(&*store, &Tenant::new("proj_1", Mode::Sandbox), now)
            .await
            .unwrap();
        assert_eq!(today.get(DayCounters::SESSIONS_CREATED.name()), Some(&40));

        store.queries.store(0, std::sync::atomic::Ordering::Relaxed);
        let o = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 7)
            .await
            .unwrap();
        // 4 days of 8 shards, 2 a page: 16 or 17 pages, all followed.
        assert!(store.queries.load(std::sync::atomic::Ordering::Relaxed) >= 16);
        assert_eq!(o.funnel.sessions_created, created);
        assert_eq!(o.funnel.sessions_paid, paid);
        assert_eq!(o.payments.total, created);
        assert_eq!(o.payments.success, paid);
        assert_eq!(o.payments.success_volume_paisa, volume);
        assert_eq!(o.by_provider[0].success_volume_paisa, volume);

        // Day by day: the same sums, each on its own day, zeros between.
        let (same, series) = overview_by_day(&deps, &Tenant::new("proj_1", Mode::Sandbox), 7)
            .await
            .unwrap();
        assert_eq!(same, o);
        let days: Vec<&str> = series.iter().map(|f| f.day.as_str()).collect();
        assert_eq!(
            days,
            [
                "2026-11-16",
                "2026-11-17",
                "2026-11-18",
                "2026-11-19",
                "2026-11-20",
                "2026-11-21",
                "2026-11-22"
            ]
        );
        let per_day: i64 = (0..40).filter(|i| i % 2 == 0).map(|i| 1_000 + i).sum();
        let expected = [per_day, per_day, 0, 0, 0, per_day, per_day];
        let got: Vec<i64> = series.iter().map(|f| f.success_volume_paisa).collect();
        assert_eq!(got, expected);
        assert!(
            series
                .iter()
                .all(|f| f.success == if f.success_volume_paisa > 0 { 20 } else { 0 })
        );
        assert_eq!(
            series.iter().map(|f| f.success_volume_paisa).sum::<i64>(),
            volume
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_settles_of_one_project_end_with_exact_totals() {
        use crate::store::TxReason;
        use std::sync::Arc;
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
        let now = at("2026-11-22T10:00:00Z");
        let deps = deps_at(store.clone(), now);
        const TASKS: i64 = 16;
        const ROUNDS: i64 = 5;
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS as usize));
        let mut tasks = Vec::new();
        for n in 0..TASKS {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..ROUNDS {
                    // A session settles: its payment succeeds, with the
                    // session's own counters, in one transaction.
                    let s = session(now);
                    let mut p = payment(&s, Provider::Fonepay, now);
                    p.amount = Paisa::new(100 + n).unwrap();
                    loop {
                        let mut t = Tally::new();
                        t.session_paid(&s);
                        t.payment_succeeded(&p);
                        let mut ops = Vec::new();
                        t.apply_to(&mut ops).unwrap();
                        match store.transact(ops).await {
                            Ok(()) => break,
                            Err(StoreError::Unavailable(_)) => {}
                            Err(StoreError::TransactionCanceled { reasons })
                                if reasons.contains(&TxReason::Conflict) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let want_volume: i64 = (0..TASKS).map(|n| (100 + n) * ROUNDS).sum();
        let totals = day_totals(&*store, &Tenant::new("proj_1", Mode::Sandbox), now)
            .await
            .unwrap();
        assert_eq!(
            totals.get(DayCounters::SESSIONS_PAID.name()),
            Some(&(TASKS * ROUNDS))
        );
        assert_eq!(
            totals.get(DayCounters::PAYMENTS_SUCCESS.name()),
            Some(&(TASKS * ROUNDS))
        );
        assert_eq!(
            totals.get(DayCounters::SUCCESS_VOLUME_PAISA.name()),
            Some(&want_volume)
        );
        assert_eq!(totals.get("fonepay_success_volume"), Some(&want_volume));
        let o = overview(&deps, &Tenant::new("proj_1", Mode::Sandbox), 1)
            .await
            .unwrap();
        assert_eq!(o.funnel.sessions_paid, TASKS * ROUNDS);
        assert_eq!(o.payments.success, TASKS * ROUNDS);
        assert_eq!(o.payments.success_volume_paisa, want_volume);
    }
}
