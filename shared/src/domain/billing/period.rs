//! Billing periods: where each period of a subscription starts and ends,
//! in the AD or the BS calendar, on Nepal days.
//!
//! Month-based units (month, quarter, year) step from the subscription's
//! own day, or its anchor day: a month that lacks that day bills on its
//! last day, and the next period returns to the day. Each boundary is
//! computed from the first start and its index, never from the previous
//! period's end, so a short month never makes the day drift.

use chrono::{Datelike, Days, NaiveDate};
use serde::{Deserialize, Serialize};

use super::calendar::{BsDate, ad_from_bs, bs_from_ad, days_in_bs_month};

/// The SDK's `intervalUnit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalUnit {
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

/// Which calendar months and years are counted in (ours; the SDK has no
/// such field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Calendar {
    Ad,
    Bs,
}

/// Nepal days `start <= d < end_exclusive`, never empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Period {
    pub start: NaiveDate,
    pub end_exclusive: NaiveDate,
}

/// Why an interval is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    #[error("intervalCount must be at least 1")]
    ZeroCount,
    #[error("intervalCount {count} is longer than a year; at most {max} for this intervalUnit")]
    CountTooLarge { count: u32, max: u32 },
    #[error("billingAnchorDay {0} is outside 1..=28")]
    AnchorOutOfRange(u8),
    #[error("billingAnchorDay applies only to month, quarter and year intervals")]
    AnchorNeedsMonths,
}

/// The longest interval is one year (365 days, 52 weeks, 12 months, 4
/// quarters, 1 year), the bound the SDK puts on `trialDays` too: a longer
/// term is a prepaid contract, better invoiced once, and a period then
/// never spans two Nepali fiscal years' worth of VAT.
pub fn max_count(unit: IntervalUnit) -> u32 {
    match unit {
        IntervalUnit::Day => 365,
        IntervalUnit::Week => 52,
        IntervalUnit::Month => 12,
        IntervalUnit::Quarter => 4,
        IntervalUnit::Year => 1,
    }
}

/// Checks a plan's `intervalCount` and a subscription's
/// `billingAnchorDay` (1..=28, month-based units only).
pub fn validate_interval(
    unit: IntervalUnit,
    count: u32,
    anchor_day: Option<u8>,
) -> Result<(), IntervalError> {
    if count == 0 {
        return Err(IntervalError::ZeroCount);
    }
    let max = max_count(unit);
    if count > max {
        return Err(IntervalError::CountTooLarge { count, max });
    }
    match (anchor_day, months_per_unit(unit)) {
        (Some(day), Some(_)) if !(1..=28).contains(&day) => {
            Err(IntervalError::AnchorOutOfRange(day))
        }
        (Some(_), None) => Err(IntervalError::AnchorNeedsMonths),
        _ => Ok(()),
    }
}

fn months_per_unit(unit: IntervalUnit) -> Option<u32> {
    match unit {
        IntervalUnit::Day | IntervalUnit::Week => None,
        IntervalUnit::Month => Some(1),
        IntervalUnit::Quarter => Some(3),
        IntervalUnit::Year => Some(12),
    }
}

/// A validated schedule: the boundaries of every period from `first_start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    first_start: NaiveDate,
    step: Step,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Days(u64),
    Months {
        calendar: Calendar,
        months: u32,
        /// The first start's month, counted from year 0 month 1.
        base_month: i64,
        /// The day each boundary falls on (clamped to the month's length).
        day: u8,
        /// 0 when the first boundary is in the first start's own month
        /// (an anchor day after the start day), else 1.
        shift: i64,
    },
}

impl Schedule {
    /// `None` when `first_start` is outside the calendar's covered years.
    pub fn new(
        first_start: NaiveDate,
        unit: IntervalUnit,
        count: u32,
        anchor_day: Option<u8>,
        calendar: Calendar,
    ) -> Result<Option<Schedule>, IntervalError> {
        validate_interval(unit, count, anchor_day)?;
        let Some(months) = months_per_unit(unit) else {
            let days = if unit == IntervalUnit::Week { 7 } else { 1 };
            let step = Step::Days(u64::from(count) * days);
            return Ok(Some(Schedule { first_start, step }));
        };
        let Some((year, month, start_day)) = year_month_day(calendar, first_start) else {
            return Ok(None);
        };
        let day = anchor_day.unwrap_or(start_day);
        let base_month = i64::from(year) * 12 + i64::from(month) - 1;
        let step = Step::Months {
            calendar,
            months: months * count,
            base_month,
            day,
            shift: if day > start_day { 0 } else { 1 },
        };
        // An anchor (1..=28) fits every month, so a boundary in the start's
        // own month is after the start exactly when the anchor day is.
        Ok(Some(Schedule { first_start, step }))
    }

    /// The start of period `index` (0 is `first_start`), `None` past the
    /// covered years.
    fn boundary(&self, index: u32) -> Option<NaiveDate> {
        if index == 0 {
            return Some(self.first_start);
        }
        match self.step {
            Step::Days(days) => self
                .first_start
                .checked_add_days(Days::new(days.checked_mul(u64::from(index))?)),
            Step::Months {
                calendar,
                months,
                base_month,
                day,
                shift,
            } => {
                let offset = (i64::from(index) - 1 + shift) * i64::from(months);
                day_in_month(calendar, base_month + offset, day)
            }
        }
    }

    /// Period `index` (0 is the first), `None` past the covered years.
    pub fn period(&self, index: u32) -> Option<Period> {
        let start = self.boundary(index)?;
        let end_exclusive = self.boundary(index.checked_add(1)?)?;
        Some(Period {
            start,
            end_exclusive,
        })
    }

    /// Every period in order, until the covered years end.
    pub fn periods(self) -> impl Iterator<Item = Period> {
        (0..=u32::MAX).map_while(move |index| self.period(index))
    }
}

/// The period that starts on `start` (a Nepal day): the first period of a
/// schedule beginning there. `None` for an invalid interval (see
/// [`validate_interval`]) or a day outside the covered years. A later
/// period is [`periods`]' n-th, so that it keeps the first start's day.
pub fn period_after(
    start: NaiveDate,
    unit: IntervalUnit,
    count: u32,
    anchor_day: Option<u8>,
    calendar: Calendar,
) -> Option<Period> {
    Schedule::new(start, unit, count, anchor_day, calendar)
        .ok()??
        .period(0)
}

/// Every period from `first_start`, contiguous; empty for an invalid
/// interval or a start outside the covered years (validate first).
pub fn periods(
    first_start: NaiveDate,
    unit: IntervalUnit,
    count: u32,
    anchor_day: Option<u8>,
    calendar: Calendar,
) -> impl Iterator<Item = Period> {
    Schedule::new(first_start, unit, count, anchor_day, calendar)
        .ok()
        .flatten()
        .into_iter()
        .flat_map(Schedule::periods)
}

fn year_month_day(calendar: Calendar, day: NaiveDate) -> Option<(i32, u8, u8)> {
    match calendar {
        Calendar::Ad => Some((
            day.year(),
            u8::try_from(day.month()).ok()?,
            u8::try_from(day.day()).ok()?,
        )),
        Calendar::Bs => {
            let bs = bs_from_ad(day)?;
            Some((i32::from(bs.year()), bs.month(), bs.day()))
        }
    }
}

/// Day `day` of month `months` (counted from year 0 month 1), or that
/// month's last day when it is shorter.
fn day_in_month(calendar: Calendar, months: i64, day: u8) -> Option<NaiveDate> {
    let year = months.div_euclid(12);
    let month = u8::try_from(months.rem_euclid(12) + 1).ok()?;
    match calendar {
        Calendar::Ad => {
            let year = i32::try_from(year).ok()?;
            let day = day.min(ad_month_len(year, month)?);
            NaiveDate::from_ymd_opt(year, month.into(), day.into())
        }
        Calendar::Bs => {
            let year = u16::try_from(year).ok()?;
            let day = day.min(days_in_bs_month(year, month)?);
            ad_from_bs(BsDate::new(year, month, day)?)
        }
    }
}

fn ad_month_len(year: i32, month: u8) -> Option<u8> {
    let first = NaiveDate::from_ymd_opt(year, month.into(), 1)?;
    let next = first.checked_add_months(chrono::Months::new(1))?;
    u8::try_from(next.signed_duration_since(first).num_days()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ad(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).unwrap()
    }

    fn bs(y: u16, m: u8, d: u8) -> NaiveDate {
        ad_from_bs(BsDate::new(y, m, d).unwrap()).unwrap()
    }

    fn starts(
        first: NaiveDate,
        unit: IntervalUnit,
        count: u32,
        anchor: Option<u8>,
        calendar: Calendar,
        n: usize,
    ) -> Vec<NaiveDate> {
        periods(first, unit, count, anchor, calendar)
            .take(n)
            .map(|p| p.start)
            .collect()
    }

    #[test]
    fn ad_month_end_clamps_and_returns_to_its_day() {
        let got = starts(
            ad(2024, 1, 31),
            IntervalUnit::Month,
            1,
            None,
            Calendar::Ad,
            5,
        );
        let want = [
            ad(2024, 1, 31),
            ad(2024, 2, 29),
            ad(2024, 3, 31),
            ad(2024, 4, 30),
            ad(2024, 5, 31),
        ];
        assert_eq!(got, want);
        let got = starts(
            ad(2025, 1, 31),
            IntervalUnit::Month,
            1,
            None,
            Calendar::Ad,
            3,
        );
        assert_eq!(got, [ad(2025, 1, 31), ad(2025, 2, 28), ad(2025, 3, 31)]);
    }

    #[test]
    fn yearly_on_february_29_bills_on_28_then_returns() {
        let got = starts(
            ad(2024, 2, 29),
            IntervalUnit::Year,
            1,
            None,
            Calendar::Ad,
            5,
        );
        let want = [
            ad(2024, 2, 29),
            ad(2025, 2, 28),
            ad(2026, 2, 28),
            ad(2027, 2, 28),
            ad(2028, 2, 29),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn quarterly_steps_three_months_from_the_own_day() {
        let got = starts(
            ad(2024, 11, 30),
            IntervalUnit::Quarter,
            1,
            None,
            Calendar::Ad,
            4,
        );
        assert_eq!(
            got,
            [
                ad(2024, 11, 30),
                ad(2025, 2, 28),
                ad(2025, 5, 30),
                ad(2025, 8, 30)
            ]
        );
        let got = starts(
            ad(2024, 1, 10),
            IntervalUnit::Month,
            2,
            None,
            Calendar::Ad,
            3,
        );
        assert_eq!(got, [ad(2024, 1, 10), ad(2024, 3, 10), ad(2024, 5, 10)]);
    }

    #[test]
    fn bs_day_32_clamps_in_shorter_months_and_returns() {
        // Shrawan 2081 has 32 days (2081-04-32 is valid), Bhadra 31.
        assert_eq!(days_in_bs_month(2081, 4), Some(32));
        let first = bs(2081, 4, 32);
        let got = starts(first, IntervalUnit::Month, 1, None, Calendar::Bs, 13);
        let mut want = vec![first];
        for (y, m) in (5..=12)
            .map(|m| (2081, m))
            .chain((1..=4).map(|m| (2082, m)))
        {
            let len = days_in_bs_month(y, m).unwrap();
            want.push(bs(y, m, len.min(32)));
        }
        assert_eq!(got, want);
    }

    #[test]
    fn bs_periods_cross_chaitra_into_baisakh() {
        let got = starts(
            bs(2081, 11, 15),
            IntervalUnit::Month,
            1,
            None,
            Calendar::Bs,
            4,
        );
        let want = [
            bs(2081, 11, 15),
            bs(2081, 12, 15),
            bs(2082, 1, 15),
            bs(2082, 2, 15),
        ];
        assert_eq!(got, want);
        let got = starts(
            bs(2081, 12, 30),
            IntervalUnit::Quarter,
            1,
            None,
            Calendar::Bs,
            2,
        );
        let asar = days_in_bs_month(2082, 3).unwrap().min(30);
        assert_eq!(got, [bs(2081, 12, 30), bs(2082, 3, asar)]);
        let got = starts(bs(2081, 1, 1), IntervalUnit::Year, 1, None, Calendar::Bs, 3);
        assert_eq!(got, [ad(2024, 4, 13), ad(2025, 4, 14), bs(2083, 1, 1)]);
    }

    #[test]
    fn an_anchor_day_makes_a_short_first_period_then_pins_the_day() {
        // After the start day: a stub to the anchor in the same month.
        let got = starts(
            ad(2024, 1, 5),
            IntervalUnit::Month,
            1,
            Some(20),
            Calendar::Ad,
            3,
        );
        assert_eq!(got, [ad(2024, 1, 5), ad(2024, 1, 20), ad(2024, 2, 20)]);
        // Before or on the start day: the first boundary is a step later.
        let got = starts(
            ad(2024, 1, 25),
            IntervalUnit::Quarter,
            1,
            Some(20),
            Calendar::Ad,
            3,
        );
        assert_eq!(got, [ad(2024, 1, 25), ad(2024, 4, 20), ad(2024, 7, 20)]);
        let got = starts(
            ad(2024, 1, 20),
            IntervalUnit::Month,
            1,
            Some(20),
            Calendar::Ad,
            2,
        );
        assert_eq!(got, [ad(2024, 1, 20), ad(2024, 2, 20)]);
    }

    #[test]
    fn days_and_weeks_step_by_their_length() {
        let p = period_after(ad(2024, 2, 28), IntervalUnit::Day, 1, None, Calendar::Ad).unwrap();
        assert_eq!(
            (p.start, p.end_exclusive),
            (ad(2024, 2, 28), ad(2024, 2, 29))
        );
        let p = period_after(ad(2024, 2, 28), IntervalUnit::Week, 2, None, Calendar::Bs).unwrap();
        assert_eq!(p.end_exclusive, ad(2024, 3, 13));
    }

    #[test]
    fn periods_are_contiguous_non_empty_and_keep_their_day() {
        let units = [
            IntervalUnit::Day,
            IntervalUnit::Week,
            IntervalUnit::Month,
            IntervalUnit::Quarter,
            IntervalUnit::Year,
        ];
        for calendar in [Calendar::Ad, Calendar::Bs] {
            for unit in units {
                for count in [1, 2, max_count(unit)]
                    .into_iter()
                    .filter(|c| *c <= max_count(unit))
                {
                    for anchor in [None, Some(1), Some(15), Some(28)] {
                        if anchor.is_some() && months_per_unit(unit).is_none() {
                            continue;
                        }
                        for first in ad(2023, 12, 25).iter_days().take(40) {
                            check_schedule(first, unit, count, anchor, calendar);
                        }
                    }
                }
            }
        }
    }

    fn check_schedule(
        first: NaiveDate,
        unit: IntervalUnit,
        count: u32,
        anchor: Option<u8>,
        calendar: Calendar,
    ) {
        let all: Vec<Period> = periods(first, unit, count, anchor, calendar)
            .take(30)
            .collect();
        assert_eq!(
            all.len(),
            30,
            "{first} {unit:?} {count} {anchor:?} {calendar:?}"
        );
        assert_eq!(all[0].start, first);
        let own_day = match calendar {
            Calendar::Ad => first.day() as u8,
            Calendar::Bs => bs_from_ad(first).unwrap().day(),
        };
        let want_day = anchor.unwrap_or(own_day);
        for (i, p) in all.iter().enumerate() {
            assert!(p.start < p.end_exclusive, "{p:?} is empty");
            if let Some(next) = all.get(i + 1) {
                assert_eq!(p.end_exclusive, next.start, "gap or overlap after {p:?}");
            }
            if months_per_unit(unit).is_some() && i > 0 {
                let (_, month, day) = year_month_day(calendar, p.start).unwrap();
                let len = match calendar {
                    Calendar::Ad => ad_month_len(p.start.year(), month).unwrap(),
                    Calendar::Bs => {
                        let b = bs_from_ad(p.start).unwrap();
                        days_in_bs_month(b.year(), b.month()).unwrap()
                    }
                };
                assert_eq!(day, want_day.min(len), "{p:?} left day {want_day}");
            }
        }
    }

    #[test]
    fn invalid_intervals_are_refused_with_a_reason() {
        use IntervalError::{AnchorNeedsMonths, AnchorOutOfRange, CountTooLarge, ZeroCount};
        assert_eq!(
            validate_interval(IntervalUnit::Month, 0, None),
            Err(ZeroCount)
        );
        assert_eq!(
            validate_interval(IntervalUnit::Month, 13, None),
            Err(CountTooLarge { count: 13, max: 12 })
        );
        assert_eq!(
            validate_interval(IntervalUnit::Day, 366, None),
            Err(CountTooLarge {
                count: 366,
                max: 365
            })
        );
        assert_eq!(validate_interval(IntervalUnit::Year, 1, None), Ok(()));
        assert_eq!(validate_interval(IntervalUnit::Week, 52, None), Ok(()));
        assert_eq!(
            validate_interval(IntervalUnit::Month, 1, Some(0)),
            Err(AnchorOutOfRange(0))
        );
        assert_eq!(
            validate_interval(IntervalUnit::Month, 1, Some(29)),
            Err(AnchorOutOfRange(29))
        );
        assert_eq!(validate_interval(IntervalUnit::Year, 1, Some(28)), Ok(()));
        assert_eq!(
            validate_interval(IntervalUnit::Week, 1, Some(3)),
            Err(AnchorNeedsMonths)
        );
        assert_eq!(
            period_after(ad(2024, 1, 1), IntervalUnit::Month, 0, None, Calendar::Ad),
            None
        );
        assert_eq!(
            periods(ad(2024, 1, 1), IntervalUnit::Month, 0, None, Calendar::Ad).count(),
            0
        );
    }

    #[test]
    fn bs_outside_the_covered_years_is_none_not_a_panic() {
        let start = ad(2143, 1, 1);
        assert!(periods(start, IntervalUnit::Month, 1, None, Calendar::Bs).count() < 5);
        assert_eq!(
            period_after(ad(1800, 1, 1), IntervalUnit::Month, 1, None, Calendar::Bs),
            None
        );
        let last = period_after(NaiveDate::MAX, IntervalUnit::Day, 1, None, Calendar::Ad);
        assert_eq!(last, None);
    }

    #[test]
    fn interval_unit_and_calendar_use_the_sdk_spelling() {
        let units = [
            IntervalUnit::Day,
            IntervalUnit::Week,
            IntervalUnit::Month,
            IntervalUnit::Quarter,
            IntervalUnit::Year,
        ];
        let json = serde_json::to_string(&units).unwrap();
        assert_eq!(json, r#"["day","week","month","quarter","year"]"#);
        assert_eq!(serde_json::to_string(&Calendar::Bs).unwrap(), r#""bs""#);
        assert!(serde_json::from_str::<IntervalUnit>(r#""Month""#).is_err());
    }
}
