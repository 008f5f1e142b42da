//! The matching rules (pure): our payments of one (project, mode,
//! provider, Nepal day) against the lines of the provider's statement of
//! that day, each classified once.
//!
//! A line finds our payment by our reference (eSewa `transaction_uuid`,
//! Khalti `purchase_order_id`, Fonepay PRN: `attempt.reference`), else by
//! the provider's id (`provider_ref`, set when a payment succeeds).
//!
//! | the line says | ours | classification |
//! |---|---|---|
//! | paid | none | `not_ours` |
//! | paid | success (or refunded), same amount, fees agree or one side states none | `matched` |
//! | paid | success, another amount | `amount_mismatch` |
//! | paid | success, same amount, both state a fee and they differ | `fee_mismatch` |
//! | paid | pending, processing, failed or cancelled | `missing_in_dhukuti` |
//! | not paid (failed, pending, other) | success | `missing_in_provider` |
//! | not paid | not success | nothing (both agree) |
//! | not paid | none | nothing (not a payment of anyone's) |
//! | refund | none | `not_ours` |
//! | refund | refunded the same amount in all | `matched` |
//! | refund | nothing refunded | `missing_in_dhukuti` |
//! | refund | refunded another amount | `amount_mismatch` |
//! | (no paid line) | success, created that day | `missing_in_provider` |
//!
//! A payment belongs to the Nepal day it was created on; a paid line of
//! the day finds a payment created the day before as well (the run reads
//! both), so one paid across midnight is matched by either day's file.

use std::collections::{HashMap, HashSet};

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::statements::{LineKind, LineStatus, StatementLine};
use crate::domain::payments::PaymentStatus;
use crate::ids::PaymentId;
use crate::money::Paisa;
use crate::time::Timestamp;

/// Nepal Standard Time: UTC+05:45, no daylight saving.
const NEPAL_OFFSET_SECONDS: i32 = 5 * 3600 + 45 * 60;

/// What one finding says.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Classification {
    Matched,
    AmountMismatch,
    FeeMismatch,
    MissingInProvider,
    MissingInDhukuti,
    NotOurs,
}

impl Classification {
    pub const ALL: [Classification; 6] = [
        Classification::Matched,
        Classification::AmountMismatch,
        Classification::FeeMismatch,
        Classification::MissingInProvider,
        Classification::MissingInDhukuti,
        Classification::NotOurs,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Classification::Matched => "matched",
            Classification::AmountMismatch => "amount_mismatch",
            Classification::FeeMismatch => "fee_mismatch",
            Classification::MissingInProvider => "missing_in_provider",
            Classification::MissingInDhukuti => "missing_in_dhukuti",
            Classification::NotOurs => "not_ours",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Classification::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// One of our payments as the rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ours {
    pub payment_id: PaymentId,
    pub reference: Option<String>,
    pub provider_ref: Option<String>,
    pub status: PaymentStatus,
    pub amount: Paisa,
    pub amount_refunded: Paisa,
    /// Its fee as we record it (the provider's, else the configured).
    pub fee: Option<Paisa>,
    /// Created on the run's day: a success with no line is
    /// `missing_in_provider` (one of the day before is read only to be
    /// found by a line).
    pub on_day: bool,
}

impl Ours {
    fn paid(&self) -> bool {
        matches!(
            self.status,
            PaymentStatus::Success | PaymentStatus::Refunded
        )
    }
}

/// One classified line, or one payment of ours no line names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub classification: Classification,
    pub kind: LineKind,
    /// The statement's line (none for `missing_in_provider` found by
    /// absence).
    pub line: Option<u32>,
    pub payment_id: Option<PaymentId>,
    pub reference: Option<String>,
    pub provider_ref: Option<String>,
    pub ours_amount: Option<Paisa>,
    pub theirs_amount: Option<Paisa>,
    pub ours_fee: Option<Paisa>,
    pub theirs_fee: Option<Paisa>,
    /// When the provider recorded the line.
    pub at: Option<Timestamp>,
}

/// Classifies every line of `theirs` against `ours`, then every payment
/// of ours that succeeded on the day and that no paid line named. Lines
/// first, in their order; then ours, in the order given.
pub fn classify(ours: &[Ours], theirs: &[StatementLine]) -> Vec<Finding> {
    let mut by_reference: HashMap<&str, usize> = HashMap::new();
    let mut by_provider_ref: HashMap<&str, usize> = HashMap::new();
    for (i, o) in ours.iter().enumerate() {
        if let Some(r) = o.reference.as_deref() {
            by_reference.insert(r, i);
        }
        if let Some(r) = o.provider_ref.as_deref() {
            by_provider_ref.insert(r, i);
        }
    }
    let find = |line: &StatementLine| {
        line.reference
            .as_deref()
            .and_then(|r| by_reference.get(r))
            .or_else(|| {
                line.provider_ref
                    .as_deref()
                    .and_then(|r| by_provider_ref.get(r))
            })
            .map(|&i| &ours[i])
    };
    let mut named: HashSet<&PaymentId> = HashSet::new();
    let mut out = Vec::new();
    for line in theirs {
        let found = find(line);
        let classification = match line.kind {
            LineKind::Payment => {
                if let Some(o) = found {
                    named.insert(&o.payment_id);
                }
                payment_line(line, found)
            }
            LineKind::Refund => Some(refund_line(line, found)),
        };
        if let Some(c) = classification {
            out.push(finding(c, line, found));
        }
    }
    for o in ours {
        if o.on_day && o.paid() && !named.contains(&o.payment_id) {
            out.push(Finding {
                classification: Classification::MissingInProvider,
                kind: LineKind::Payment,
                line: None,
                payment_id: Some(o.payment_id.clone()),
                reference: o.reference.clone(),
                provider_ref: o.provider_ref.clone(),
                ours_amount: Some(o.amount),
                theirs_amount: None,
                ours_fee: o.fee,
                theirs_fee: None,
                at: None,
            });
        }
    }
    out
}

fn line_paid(line: &StatementLine) -> bool {
    matches!(line.status, LineStatus::Success | LineStatus::Refunded)
}

fn payment_line(line: &StatementLine, ours: Option<&Ours>) -> Option<Classification> {
    let paid = line_paid(line);
    Some(match ours {
        None if paid => Classification::NotOurs,
        None => return None,
        Some(o) if !paid && o.paid() => Classification::MissingInProvider,
        Some(_) if !paid => return None,
        Some(o) if !o.paid() => Classification::MissingInDhukuti,
        Some(o) if o.amount != line.amount => Classification::AmountMismatch,
        Some(o) => match (o.fee, line.fee) {
            (Some(a), Some(b)) if a != b => Classification::FeeMismatch,
            _ => Classification::Matched,
        },
    })
}

fn refund_line(line: &StatementLine, ours: Option<&Ours>) -> Classification {
    match ours {
        None => Classification::NotOurs,
        Some(o) if o.amount_refunded == Paisa::ZERO => Classification::MissingInDhukuti,
        Some(o) if o.amount_refunded != line.amount => Classification::AmountMismatch,
        Some(_) => Classification::Matched,
    }
}

fn finding(c: Classification, line: &StatementLine, ours: Option<&Ours>) -> Finding {
    let refund = line.kind == LineKind::Refund;
    Finding {
        classification: c,
        kind: line.kind,
        line: Some(line.line),
        payment_id: ours.map(|o| o.payment_id.clone()),
        reference: line
            .reference
            .clone()
            .or_else(|| ours.and_then(|o| o.reference.clone())),
        provider_ref: line
            .provider_ref
            .clone()
            .or_else(|| ours.and_then(|o| o.provider_ref.clone())),
        ours_amount: ours.map(|o| if refund { o.amount_refunded } else { o.amount }),
        theirs_amount: Some(line.amount),
        ours_fee: if refund {
            None
        } else {
            ours.and_then(|o| o.fee)
        },
        theirs_fee: line.fee,
        at: Some(line.at),
    }
}

/// Per classification, how many findings.
pub fn counts(findings: &[Finding]) -> Counts {
    let mut c = Counts::default();
    for f in findings {
        *c.slot(f.classification) += 1;
    }
    c
}

/// How many findings of each classification a run has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub matched: u32,
    pub amount_mismatch: u32,
    pub fee_mismatch: u32,
    pub missing_in_provider: u32,
    pub missing_in_dhukuti: u32,
    pub not_ours: u32,
}

impl Counts {
    fn slot(&mut self, c: Classification) -> &mut u32 {
        match c {
            Classification::Matched => &mut self.matched,
            Classification::AmountMismatch => &mut self.amount_mismatch,
            Classification::FeeMismatch => &mut self.fee_mismatch,
            Classification::MissingInProvider => &mut self.missing_in_provider,
            Classification::MissingInDhukuti => &mut self.missing_in_dhukuti,
            Classification::NotOurs => &mut self.not_ours,
        }
    }

    /// Counts one more of `c`; its new count.
    pub fn bump(&mut self, c: Classification) -> u32 {
        let slot = self.slot(c);
        *slot = slot.saturating_add(1);
        *slot
    }

    pub fn of(&self, c: Classification) -> u32 {
        let mut copy = *self;
        *copy.slot(c)
    }

    /// Everything not `matched`.
    pub fn discrepancies(&self) -> u32 {
        self.amount_mismatch
            + self.fee_mismatch
            + self.missing_in_provider
            + self.missing_in_dhukuti
            + self.not_ours
    }
}

/// The sums a run shows: what we say we collected on the day (our
/// successful payments created on it) and what the provider says (its
/// paid payment lines), in paisa.
pub fn totals(ours: &[Ours], theirs: &[StatementLine]) -> (Paisa, Paisa) {
    let our = ours
        .iter()
        .filter(|o| o.on_day && o.paid())
        .fold(0i64, |s, o| s.saturating_add(o.amount.get()));
    let their = theirs
        .iter()
        .filter(|l| l.kind == LineKind::Payment && line_paid(l))
        .fold(0i64, |s, l| s.saturating_add(l.amount.get()));
    (paisa(our), paisa(their))
}

fn paisa(v: i64) -> Paisa {
    Paisa::new(v).unwrap_or(Paisa::ZERO)
}

/// The instants `[start, end)` of the Nepal calendar day `day`.
pub fn day_bounds(day: NaiveDate) -> (Timestamp, Timestamp) {
    let midnight = Timestamp::from_datetime(day.and_time(chrono::NaiveTime::MIN).and_utc());
    let start = midnight.plus(chrono::Duration::seconds(-i64::from(NEPAL_OFFSET_SECONDS)));
    (start, start.plus(chrono::Duration::days(1)))
}

/// The Nepal calendar day of `at`.
pub fn nepal_day_of(at: Timestamp) -> NaiveDate {
    at.plus(chrono::Duration::seconds(i64::from(NEPAL_OFFSET_SECONDS)))
        .datetime()
        .date_naive()
}

/// The first line dated outside `day` (Nepal time), if any: a file that
/// has one is refused whole, naming it.
pub fn outside_day(day: NaiveDate, lines: &[StatementLine]) -> Option<&StatementLine> {
    let (start, end) = day_bounds(day);
    lines.iter().find(|l| l.at < start || l.at >= end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::Provider;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap_or_else(|| panic!("{s}"))
    }

    fn p(n: i64) -> Paisa {
        Paisa::new(n).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ours(id: &str, status: PaymentStatus, amount: i64, fee: Option<i64>) -> Ours {
        Ours {
            payment_id: id.into(),
            reference: Some(format!("ref-{id}")),
            provider_ref: Some(format!("prov-{id}")),
            status,
            amount: p(amount),
            amount_refunded: Paisa::ZERO,
            fee: fee.map(p),
            on_day: true,
        }
    }

    fn line(
        n: u32,
        reference: &str,
        status: LineStatus,
        amount: i64,
        fee: Option<i64>,
    ) -> StatementLine {
        StatementLine {
            line: n,
            provider: Provider::Khalti,
            reference: Some(reference.to_owned()),
            provider_ref: None,
            kind: LineKind::Payment,
            status,
            amount: p(amount),
            fee: fee.map(p),
            at: at("2026-11-20T06:00:00Z"),
        }
    }

    fn classes(f: &[Finding]) -> Vec<(Option<u32>, Classification)> {
        f.iter().map(|f| (f.line, f.classification)).collect()
    }

    use Classification::*;
    use LineStatus as S;
    use PaymentStatus as P;

    #[test]
    fn each_line_is_classified_by_its_rule() {
        let ours = vec![
            ours("pay_1", P::Success, 1000, Some(30)),
            ours("pay_2", P::Success, 1000, None),
            ours("pay_3", P::Success, 1000, Some(30)),
            ours("pay_4", P::Cancelled, 1000, None),
            ours("pay_5", P::Pending, 1000, None),
            ours("pay_6", P::Success, 1000, Some(30)),
            ours("pay_7", P::Refunded, 1000, Some(30)),
            ours("pay_8", P::Failed, 1000, None),
        ];
        let theirs = vec![
            line(1, "ref-pay_1", S::Success, 1000, Some(30)),
            // Only one side states a fee: no fee mismatch.
            line(2, "ref-pay_2", S::Success, 1000, Some(25)),
            line(3, "ref-pay_3", S::Success, 1000, Some(31)),
            line(4, "ref-pay_4", S::Success, 1000, None),
            line(5, "ref-pay_5", S::Success, 1000, None),
            line(6, "ref-pay_6", S::Success, 999, Some(30)),
            line(7, "ref-pay_7", S::Refunded, 1000, None),
            line(8, "ref-nobody", S::Success, 500, None),
            // Not paid, and not ours or not paid on our side: nothing.
            line(9, "ref-nobody-2", S::Failed, 500, None),
            line(10, "ref-pay_8", S::Failed, 1000, None),
        ];
        let found = classify(&ours, &theirs);
        assert_eq!(
            classes(&found),
            vec![
                (Some(1), Matched),
                (Some(2), Matched),
                (Some(3), FeeMismatch),
                (Some(4), MissingInDhukuti),
                (Some(5), MissingInDhukuti),
                (Some(6), AmountMismatch),
                (Some(7), Matched),
                (Some(8), NotOurs),
            ]
        );
        assert_eq!(found[5].ours_amount, Some(p(1000)));
        assert_eq!(found[5].theirs_amount, Some(p(999)));
        assert_eq!(found[3].payment_id, Some("pay_4".into()));
        assert_eq!(found[7].payment_id, None);
    }

    #[test]
    fn a_success_of_ours_without_a_paid_line_is_missing_in_provider() {
        let mut before = ours("pay_0", P::Success, 1000, None);
        before.on_day = false;
        let ours = vec![
            ours("pay_1", P::Success, 1000, None),
            ours("pay_2", P::Success, 1000, None),
            ours("pay_3", P::Pending, 1000, None),
            before,
        ];
        // pay_2's line says it failed: missing too, named by its line.
        let theirs = vec![line(4, "ref-pay_2", S::Failed, 1000, None)];
        let found = classify(&ours, &theirs);
        assert_eq!(
            classes(&found),
            vec![(Some(4), MissingInProvider), (None, MissingInProvider)]
        );
        assert_eq!(found[1].payment_id, Some("pay_1".into()));
        let c = counts(&found);
        assert_eq!(c.missing_in_provider, 2);
        assert_eq!(c.discrepancies(), 2);
    }

    #[test]
    fn a_line_finds_ours_by_the_providers_id_when_it_has_no_reference() {
        let ours = vec![ours("pay_1", P::Success, 1000, None)];
        let mut l = line(1, "x", S::Success, 1000, None);
        l.reference = None;
        l.provider_ref = Some("prov-pay_1".into());
        assert_eq!(classes(&classify(&ours, &[l])), vec![(Some(1), Matched)]);
    }

    #[test]
    fn refund_lines_meet_what_we_refunded() {
        let mut refunded = ours("pay_1", P::Refunded, 1000, None);
        refunded.amount_refunded = p(1000);
        let mut partly = ours("pay_2", P::Success, 1000, None);
        partly.amount_refunded = p(400);
        let not = ours("pay_3", P::Success, 1000, None);
        let ours = vec![refunded, partly, not];
        let mut theirs: Vec<StatementLine> = [
            (1, "ref-pay_1", 1000),
            (2, "ref-pay_2", 500),
            (3, "ref-pay_3", 1000),
            (4, "ref-nobody", 100),
        ]
        .into_iter()
        .map(|(n, r, a)| {
            let mut l = line(n, r, S::Success, a, None);
            l.kind = LineKind::Refund;
            l
        })
        .collect();
        for r in ["ref-pay_1", "ref-pay_2", "ref-pay_3"] {
            theirs.push(line(10, r, S::Success, 1000, None));
        }
        let found = classify(&ours, &theirs);
        assert_eq!(
            classes(&found)[..4],
            [
                (Some(1), Matched),
                (Some(2), AmountMismatch),
                (Some(3), MissingInDhukuti),
                (Some(4), NotOurs),
            ]
        );
        assert_eq!(counts(&found).matched, 4);
    }

    #[test]
    fn totals_sum_the_days_successes_and_paid_lines() {
        let ours = vec![
            ours("pay_1", P::Success, 1000, None),
            ours("pay_2", P::Failed, 700, None),
        ];
        let theirs = vec![
            line(1, "a", S::Success, 300, None),
            line(2, "b", S::Failed, 900, None),
        ];
        assert_eq!(totals(&ours, &theirs), (p(1000), p(300)));
    }

    #[test]
    fn a_nepal_day_runs_from_its_midnight_at_plus_0545() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 20).unwrap_or_default();
        let (start, end) = day_bounds(day);
        assert_eq!(start, at("2026-11-19T18:15:00Z"));
        assert_eq!(end, at("2026-11-20T18:15:00Z"));
        assert_eq!(nepal_day_of(at("2026-11-19T18:15:00Z")), day);
        assert_eq!(nepal_day_of(at("2026-11-20T18:14:59Z")), day);
        assert_ne!(nepal_day_of(at("2026-11-19T18:14:59Z")), day);
        let mut early = line(7, "a", S::Success, 1, None);
        early.at = at("2026-11-19T18:14:59Z");
        let ok = line(3, "b", S::Success, 1, None);
        assert_eq!(
            outside_day(day, &[ok.clone(), early]).map(|l| l.line),
            Some(7)
        );
        assert_eq!(outside_day(day, &[ok]), None);
    }

    #[test]
    fn classifications_spell_as_the_api_does() {
        for c in Classification::ALL {
            assert_eq!(Classification::parse(c.as_str()), Some(c));
            assert_eq!(
                serde_json::to_value(c).ok(),
                Some(serde_json::json!(c.as_str()))
            );
        }
        assert_eq!(Classification::parse("nope"), None);
    }
}
