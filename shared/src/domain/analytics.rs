//! The analytics overview (`GET /v1/analytics/overview`) from per-day
//! counters (decisions, "Analytics").
//!
//! One counter item per project, mode and UTC day:
//! `pk = PROJ#<project>#<mode>#STATS`, `sk = DAY#YYYY-MM-DD`. Every write
//! that creates a session or payment or changes its status adds to the
//! item of the record's *creation* day, in the same transaction as the
//! change ([`Tally`]), so the figures are exact for "created in the
//! window":
//!
//! - a session created: `sessions_created` +1;
//! - a session's first attempt (it first becomes `initiated`):
//!   `sessions_initiated` +1 (later attempts add nothing);
//! - a session that becomes `success` (once: success is final):
//!   `sessions_paid` +1;
//! - a payment created: `payments_total` +1 and `<provider>_count` +1;
//! - a payment that becomes `success` (from pending, processing or
//!   cancelled; once): `payments_success` +1, `success_volume_paisa`
//!   +amount, `<provider>_success` +1, `<provider>_success_volume` +amount;
//! - a payment that becomes `failed` (a decline, or an attempt the
//!   provider could not start; once: failed is final): `payments_failed` +1.
//!
//! A cancelled payment counts in `total` only (a cancel may still turn
//! into a success, which then counts once); a refunded payment stays
//! counted as a success; `processing` and session expiry add nothing.
//!
//! The overview reads the window's day items with one query: O(days).

use serde::Serialize;

use super::checkout::CheckoutSession;
use super::payments::Payment;
use super::{Mode, Provider};
use crate::store::{Item, Key, MAX_TX_OPS, Query, SkCond, Store, StoreError, TTL, TxOp, Update};
use crate::time::Timestamp;

/// Days in the window when the request names none.
pub const DEFAULT_DAYS: u32 = 30;
/// The longest window.
pub const MAX_DAYS: u32 = 90;
/// A day's counters are kept this long after the day (then dropped by
/// TTL): well past the longest window and the latest late success.
pub const KEEP_DAYS: i64 = 120;

pub const SESSIONS_CREATED: &str = "sessions_created";
pub const SESSIONS_INITIATED: &str = "sessions_initiated";
pub const SESSIONS_PAID: &str = "sessions_paid";
pub const PAYMENTS_TOTAL: &str = "payments_total";
pub const PAYMENTS_SUCCESS: &str = "payments_success";
pub const PAYMENTS_FAILED: &str = "payments_failed";
pub const SUCCESS_VOLUME: &str = "success_volume_paisa";

fn provider_count(p: Provider) -> String {
    format!("{}_count", p.as_str())
}
fn provider_success(p: Provider) -> String {
    format!("{}_success", p.as_str())
}
fn provider_volume(p: Provider) -> String {
    format!("{}_success_volume", p.as_str())
}

/// The counters partition of a project in a mode.
pub fn stats_partition(project_id: &str, mode: Mode) -> String {
    format!("PROJ#{project_id}#{}#STATS", mode.as_str())
}

/// The UTC day of `at`, as `YYYY-MM-DD`.
pub fn day_of(at: Timestamp) -> String {
    at.datetime().format("%Y-%m-%d").to_string()
}

fn day_sk(day: &str) -> String {
    format!("DAY#{day}")
}

/// The counter item of the UTC day of `at`.
pub fn day_key(project_id: &str, mode: Mode, at: Timestamp) -> Key {
    Key::new(stats_partition(project_id, mode), day_sk(&day_of(at)))
}

/// Midnight UTC of the day of `at`.
fn start_of_day(at: Timestamp) -> Timestamp {
    let d = at.datetime().date_naive();
    match d.and_hms_opt(0, 0, 0) {
        Some(naive) => Timestamp::from_datetime(naive.and_utc()),
        None => at,
    }
}

/// One day item's adds (one entry per attribute).
type Adds = Vec<(String, i64)>;

/// Counter additions of one transaction, grouped per day item.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// Per item: its ttl and its adds.
    items: Vec<(Key, i64, Adds)>,
}

impl Tally {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn add(&mut self, project_id: &str, mode: Mode, created: Timestamp, attr: &str, n: i64) {
        let key = day_key(project_id, mode, created);
        let ttl = start_of_day(created)
            .plus(chrono::Duration::days(KEEP_DAYS))
            .unix_seconds();
        let at = match self.items.iter().position(|(k, _, _)| *k == key) {
            Some(i) => i,
            None => {
                self.items.push((key, ttl, Vec::new()));
                self.items.len() - 1
            }
        };
        let adds = &mut self.items[at].2;
        match adds.iter_mut().find(|(a, _)| a == attr) {
            Some((_, v)) => *v += n,
            None => adds.push((attr.to_owned(), n)),
        }
    }

    fn session(&mut self, s: &CheckoutSession, attr: &str) {
        self.add(&s.project_id, s.mode, s.created_at, attr, 1);
    }

    /// A session was created.
    pub fn session_created(&mut self, s: &CheckoutSession) {
        self.session(s, SESSIONS_CREATED);
    }

    /// A session became `initiated` for the first time.
    pub fn session_initiated(&mut self, s: &CheckoutSession) {
        self.session(s, SESSIONS_INITIATED);
    }

    /// A session became `success`.
    pub fn session_paid(&mut self, s: &CheckoutSession) {
        self.session(s, SESSIONS_PAID);
    }

    /// A payment was created.
    pub fn payment_created(&mut self, p: &Payment) {
        self.add(&p.project_id, p.mode, p.created_at, PAYMENTS_TOTAL, 1);
        self.add(
            &p.project_id,
            p.mode,
            p.created_at,
            &provider_count(p.provider),
            1,
        );
    }

    /// A payment became `success`.
    pub fn payment_succeeded(&mut self, p: &Payment) {
        let amount = p.amount.get();
        let (proj, mode, at) = (&p.project_id, p.mode, p.created_at);
        self.add(proj, mode, at, PAYMENTS_SUCCESS, 1);
        self.add(proj, mode, at, SUCCESS_VOLUME, amount);
        self.add(proj, mode, at, &provider_success(p.provider), 1);
        self.add(proj, mode, at, &provider_volume(p.provider), amount);
    }

    /// A payment became `failed`.
    pub fn payment_failed(&mut self, p: &Payment) {
        self.add(&p.project_id, p.mode, p.created_at, PAYMENTS_FAILED, 1);
    }

    /// The adds of `attr` on the item `key` (tests and checks).
    pub fn added(&self, key: &Key, attr: &str) -> i64 {
        self.items
            .iter()
            .filter(|(k, _, _)| k == key)
            .flat_map(|(_, _, adds)| adds.iter())
            .filter(|(a, _)| a == attr)
            .map(|(_, v)| *v)
            .sum()
    }

    /// Adds the counters to `ops`: into an update of the same item already
    /// there (a transaction touches each key once), else as a new
    /// unconditional update (an upsert: a missing day starts from 0).
    pub fn apply_to(self, ops: &mut Vec<TxOp>) -> Result<(), StoreError> {
        for (key, ttl, adds) in self.items {
            let existing = ops.iter_mut().find(|op| op.key().as_ref() == Some(&key));
            match existing {
                Some(TxOp::Update { update, .. }) => {
                    for (attr, n) in adds {
                        match update.add.iter_mut().find(|(a, _)| *a == attr) {
                            Some((_, v)) => *v += n,
                            None => update.add.push((attr, n)),
                        }
                    }
                    if !update.set.iter().any(|(a, _)| a == TTL) {
                        update.set.push((TTL.to_owned(), ttl.into()));
                    }
                }
                Some(_) => {
                    return Err(StoreError::Invalid(format!(
                        "counter item {}/{} is already written by this transaction",
                        key.pk, key.sk
                    )));
                }
                None => {
                    let mut update = Update::new().set(TTL, ttl);
                    update.add = adds;
                    ops.push(TxOp::Update {
                        key,
                        update,
                        cond: None,
                    });
                }
            }
        }
        if ops.len() > MAX_TX_OPS {
            return Err(StoreError::Invalid(format!(
                "a transaction of {} operations with its counters (at most {MAX_TX_OPS})",
                ops.len()
            )));
        }
        Ok(())
    }
}

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

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Window {
    pub days: u32,
    pub start: Timestamp,
    pub end: Timestamp,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PaymentFigures {
    pub total: i64,
    pub success: i64,
    pub failed: i64,
    pub success_rate: f64,
    pub success_volume_paisa: i64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Funnel {
    pub sessions_created: i64,
    pub sessions_initiated: i64,
    pub sessions_paid: i64,
    pub conversion_rate_initiated_to_paid: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProviderFigures {
    pub provider: Provider,
    pub count: i64,
    pub success_count: i64,
    pub success_volume_paisa: i64,
}

/// The answer of `GET /v1/analytics/overview`.
#[derive(Clone, Debug, Serialize, PartialEq)]
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

fn int(item: &Item, attr: &str) -> i64 {
    item.get(attr).and_then(|v| v.as_i64()).unwrap_or(0)
}

/// The overview of the last `days` UTC days including today's (the window
/// starts at midnight UTC `days - 1` days before `now` and ends `now`).
pub async fn overview(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    days: u32,
    now: Timestamp,
) -> Result<Overview, StoreError> {
    let days = days.clamp(1, MAX_DAYS);
    let start = start_of_day(now).plus(chrono::Duration::days(-(i64::from(days) - 1)));
    let mut q = Query::partition(stats_partition(project_id, mode)).sk(SkCond::Between(
        day_sk(&day_of(start)),
        day_sk(&day_of(now)),
    ));
    let mut items = Vec::new();
    loop {
        let page = store.query(&q).await?;
        items.extend(page.items);
        match page.last_key {
            Some(last) => q.start_after = Some(last),
            None => break,
        }
    }
    Ok(summarize(&items, days, start, now))
}

/// Sums day items into the overview.
pub fn summarize(items: &[Item], days: u32, start: Timestamp, end: Timestamp) -> Overview {
    let sum = |attr: &str| items.iter().map(|i| int(i, attr)).sum::<i64>();
    let total = sum(PAYMENTS_TOTAL);
    let success = sum(PAYMENTS_SUCCESS);
    let initiated = sum(SESSIONS_INITIATED);
    let paid = sum(SESSIONS_PAID);
    let by_provider = Provider::ALL
        .iter()
        .map(|&p| ProviderFigures {
            provider: p,
            count: sum(&provider_count(p)),
            success_count: sum(&provider_success(p)),
            success_volume_paisa: sum(&provider_volume(p)),
        })
        .filter(|f| f.count > 0 || f.success_count > 0)
        .collect();
    Overview {
        window: Window { days, start, end },
        payments: PaymentFigures {
            total,
            success,
            failed: sum(PAYMENTS_FAILED),
            success_rate: ratio(success, total),
            success_volume_paisa: sum(SUCCESS_VOLUME),
        },
        funnel: Funnel {
            sessions_created: sum(SESSIONS_CREATED),
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
    use crate::domain::checkout::{self, CreateCheckout, Creator, validate_create};
    use crate::domain::payments::{AttemptInfo, PaymentStatus};
    use crate::money::{Currency, Paisa};
    use crate::store::embedded::EmbeddedStore;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap()
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
        let day_s = day_key("proj_1", Mode::Sandbox, created);
        let day_p = day_key("proj_1", Mode::Sandbox, p.created_at);
        assert_eq!(day_s.sk, "DAY#2026-11-20");
        assert_eq!(day_p.sk, "DAY#2026-11-21");
        assert_eq!(day_s.pk, "PROJ#proj_1#sandbox#STATS");
        assert_eq!(t.added(&day_s, SESSIONS_PAID), 1);
        assert_eq!(t.added(&day_p, SESSIONS_PAID), 0);
        assert_eq!(t.added(&day_p, PAYMENTS_SUCCESS), 1);
        assert_eq!(t.added(&day_p, SUCCESS_VOLUME), 100_000);
        assert_eq!(t.added(&day_p, "khalti_success"), 1);
        assert_eq!(t.added(&day_p, "khalti_success_volume"), 100_000);
    }

    #[test]
    fn each_transition_adds_its_counters() {
        let now = at("2026-11-22T10:00:00Z");
        let s = session(now);
        let p = payment(&s, Provider::Esewa, now);
        let day = day_key("proj_1", Mode::Sandbox, now);
        type Case = (&'static str, Tally, Vec<(&'static str, i64)>);
        let cases: Vec<Case> = vec![
            (
                "session created",
                {
                    let mut t = Tally::new();
                    t.session_created(&s);
                    t
                },
                vec![(SESSIONS_CREATED, 1)],
            ),
            (
                "session initiated",
                {
                    let mut t = Tally::new();
                    t.session_initiated(&s);
                    t
                },
                vec![(SESSIONS_INITIATED, 1)],
            ),
            (
                "session paid",
                {
                    let mut t = Tally::new();
                    t.session_paid(&s);
                    t
                },
                vec![(SESSIONS_PAID, 1)],
            ),
            (
                "payment created",
                {
                    let mut t = Tally::new();
                    t.payment_created(&p);
                    t
                },
                vec![(PAYMENTS_TOTAL, 1), ("esewa_count", 1)],
            ),
            (
                "payment succeeded",
                {
                    let mut t = Tally::new();
                    t.payment_succeeded(&p);
                    t
                },
                vec![
                    (PAYMENTS_SUCCESS, 1),
                    (SUCCESS_VOLUME, 100_000),
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
                vec![(PAYMENTS_FAILED, 1)],
            ),
        ];
        let all = [
            SESSIONS_CREATED,
            SESSIONS_INITIATED,
            SESSIONS_PAID,
            PAYMENTS_TOTAL,
            PAYMENTS_SUCCESS,
            PAYMENTS_FAILED,
            SUCCESS_VOLUME,
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
        let day = day_key("proj_1", Mode::Sandbox, now);
        // The transaction already updates the day item: the adds join it.
        let mut ops = vec![TxOp::Update {
            key: day.clone(),
            update: Update::new().add(PAYMENTS_TOTAL, 2),
            cond: None,
        }];
        t.apply_to(&mut ops).unwrap();
        assert_eq!(ops.len(), 1);
        let TxOp::Update { update, .. } = &ops[0] else {
            panic!("not an update")
        };
        let get = |a: &str| update.add.iter().find(|(x, _)| x == a).map(|(_, v)| *v);
        assert_eq!(get(PAYMENTS_TOTAL), Some(3));
        assert_eq!(get(SESSIONS_INITIATED), Some(2));
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
        let store = EmbeddedStore::in_memory().unwrap();
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

        let o = overview(&store, "proj_1", Mode::Sandbox, 7, now)
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
        let all = overview(&store, "proj_1", Mode::Sandbox, 90, now)
            .await
            .unwrap();
        assert_eq!(all.funnel.sessions_created, 5);
        let one = overview(&store, "proj_1", Mode::Sandbox, 1, now)
            .await
            .unwrap();
        assert_eq!(one.funnel.sessions_created, 1);
        let live = overview(&store, "proj_1", Mode::Live, 30, now)
            .await
            .unwrap();
        assert_eq!(live.funnel.sessions_created, 1);
        assert_eq!(live.payments.total, 0);
        assert_eq!(live.payments.success_rate, 0.0);
        assert_eq!(live.funnel.conversion_rate_initiated_to_paid, 0.0);
        assert!(live.by_provider.is_empty());
    }
}
