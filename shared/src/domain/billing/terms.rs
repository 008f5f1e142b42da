//! The terms a subscription bills: a snapshot of its plan's price and
//! schedule taken when the subscription is created, so a later change to
//! the plan (a new name, a new grace period) never rewrites what a
//! subscription already agreed to, and the engine never reads the plan.
//! The plan record (`billing::plans`) converts into [`Terms`].

use chrono::{Duration, NaiveDate};
use serde::{Deserialize, Serialize};

use super::period::{Calendar, IntervalError, IntervalUnit, validate_interval};
use crate::domain::Provider;
use crate::money::Currency;
use crate::time::Timestamp;

/// The longest trial, and the largest `trialDays`: one year (the SDK's
/// bound, 0-365).
pub const MAX_TRIAL_DAYS: u32 = 365;
/// The largest grace period and reminder offsets, in days.
pub const MAX_TERM_DAYS: u16 = 365;

/// The SDK's `overdueAction`: what a subscription does when an invoice's
/// grace period ends unpaid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverdueAction {
    KeepActive,
    MarkPastDue,
    Pause,
    Cancel,
}

impl OverdueAction {
    pub const ALL: [OverdueAction; 4] = [
        OverdueAction::KeepActive,
        OverdueAction::MarkPastDue,
        OverdueAction::Pause,
        OverdueAction::Cancel,
    ];
}

/// How a plan's `amount` makes a period's price (`pricingModel`): `flat`
/// (the amount, whatever the quantity is: always 1), `per_unit` (the amount
/// per seat, times the subscription's `quantity`), `metered` (the amount per
/// unit of usage reported in the period).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PricingModel {
    #[default]
    Flat,
    PerUnit,
    Metered,
}

impl PricingModel {
    pub const ALL: [PricingModel; 3] = [
        PricingModel::Flat,
        PricingModel::PerUnit,
        PricingModel::Metered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PricingModel::Flat => "flat",
            PricingModel::PerUnit => "per_unit",
            PricingModel::Metered => "metered",
        }
    }

    pub fn parse(raw: &str) -> Option<PricingModel> {
        PricingModel::ALL.into_iter().find(|m| m.as_str() == raw)
    }
}

/// What one subscription bills, period after period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    /// What an invoice's subscription line says (the plan's name).
    pub description: String,
    /// Paisa per period, more than 0.
    pub amount: i64,
    pub currency: Currency,
    pub interval_unit: IntervalUnit,
    pub interval_count: u32,
    pub calendar: Calendar,
    /// The plan's default trial, used when the subscription names none.
    pub trial_days: u32,
    /// Days after the due date before an unpaid invoice is overdue.
    pub grace_period_days: u16,
    pub reminder_days_before_due: u16,
    pub overdue_reminder_interval_days: u16,
    pub overdue_action: OverdueAction,
    pub default_provider: Option<Provider>,
    /// Stored before issue 40 without it: flat.
    #[serde(default)]
    pub pricing_model: PricingModel,
}

/// Why terms or a trial are refused; the message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TermsError {
    #[error("amount must be more than 0 paisa")]
    Amount,
    #[error(transparent)]
    Interval(#[from] IntervalError),
    #[error("{field} must be between 0 and {max}, got {got}")]
    Days {
        field: &'static str,
        max: u32,
        got: i64,
    },
    #[error("trialEndsAt must be after the subscription starts")]
    TrialEndsBeforeStart,
    #[error("trialEndsAt must be within {MAX_TRIAL_DAYS} days of the start")]
    TrialTooLong,
    #[error("trialEndsAt must be after the current trial end {current}")]
    ExtensionNotLater { current: Timestamp },
}

impl Terms {
    /// Checks what the engine relies on (the plan checked it already; a
    /// snapshot is checked again before it is stored).
    pub fn check(&self) -> Result<(), TermsError> {
        if self.amount <= 0 {
            return Err(TermsError::Amount);
        }
        validate_interval(self.interval_unit, self.interval_count, None)?;
        check_days("trialDays", i64::from(self.trial_days), MAX_TRIAL_DAYS)?;
        for (field, days) in [
            ("gracePeriodDays", self.grace_period_days),
            ("reminderDaysBeforeDue", self.reminder_days_before_due),
            (
                "overdueReminderIntervalDays",
                self.overdue_reminder_interval_days,
            ),
        ] {
            check_days(field, i64::from(days), u32::from(MAX_TERM_DAYS))?;
        }
        Ok(())
    }

    /// The day an invoice due on `due` becomes overdue unpaid: the grace
    /// is the days it can be paid, counting the due day, and never less
    /// than the due day itself (a grace of 0 would make an invoice overdue
    /// the moment it is issued, and expire a new subscription's first
    /// invoice before its customer could open it).
    pub fn overdue_on(&self, due: NaiveDate) -> Option<NaiveDate> {
        let days = self.grace_period_days.max(1);
        due.checked_add_days(chrono::Days::new(u64::from(days)))
    }
}

fn check_days(field: &'static str, got: i64, max: u32) -> Result<(), TermsError> {
    if (0..=i64::from(max)).contains(&got) {
        Ok(())
    } else {
        Err(TermsError::Days { field, max, got })
    }
}

/// When the trial of a subscription starting at `start` ends (`None`: no
/// trial): `trialEndsAt` wins over `trialDays` (0-365), which wins over
/// the plan's default. Each given value is checked, even one that loses.
pub fn trial_end(
    start: Timestamp,
    trial_ends_at: Option<Timestamp>,
    trial_days: Option<i64>,
    plan_default_days: u32,
) -> Result<Option<Timestamp>, TermsError> {
    if let Some(days) = trial_days {
        check_days("trialDays", days, MAX_TRIAL_DAYS)?;
    }
    if let Some(end) = trial_ends_at {
        if end <= start {
            return Err(TermsError::TrialEndsBeforeStart);
        }
        if end > start.plus(Duration::days(i64::from(MAX_TRIAL_DAYS))) {
            return Err(TermsError::TrialTooLong);
        }
        return Ok(Some(end));
    }
    let days = trial_days.unwrap_or(i64::from(plan_default_days));
    check_days("trialDays", days, MAX_TRIAL_DAYS)?;
    Ok((days > 0).then(|| start.plus(Duration::days(days))))
}

/// Checks an extended trial end: after the current end, and at most a
/// year after `now` (the same bound as a new trial).
pub fn extended_trial_end(
    current: Timestamp,
    requested: Timestamp,
    now: Timestamp,
) -> Result<Timestamp, TermsError> {
    if requested <= current {
        return Err(TermsError::ExtensionNotLater { current });
    }
    if requested > now.plus(Duration::days(i64::from(MAX_TRIAL_DAYS))) {
        return Err(TermsError::TrialTooLong);
    }
    Ok(requested)
}

/// Terms for tests: NPR 999 a month, 3 days' grace, past due when
/// overdue.
#[cfg(test)]
pub(crate) fn monthly() -> Terms {
    Terms {
        description: "Pro Monthly".into(),
        amount: 99_900,
        currency: Currency::Npr,
        interval_unit: IntervalUnit::Month,
        interval_count: 1,
        calendar: Calendar::Ad,
        trial_days: 14,
        grace_period_days: 3,
        reminder_days_before_due: 3,
        overdue_reminder_interval_days: 2,
        overdue_action: OverdueAction::MarkPastDue,
        default_provider: None,
        pricing_model: PricingModel::Flat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testenv::at;

    #[test]
    fn the_due_day_is_always_payable_even_with_no_grace() {
        let due = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let mut t = monthly();
        assert_eq!(t.overdue_on(due).unwrap().to_string(), "2026-12-04");
        t.grace_period_days = 1;
        assert_eq!(t.overdue_on(due).unwrap().to_string(), "2026-12-02");
        t.grace_period_days = 0;
        assert_eq!(
            t.overdue_on(due).unwrap().to_string(),
            "2026-12-02",
            "a grace of 0 leaves the due day to pay, not an invoice overdue at issue"
        );
    }

    #[test]
    fn trial_ends_at_wins_over_trial_days_which_wins_over_the_plan() {
        let start = at("2026-01-01T00:00:00Z");
        let ends = at("2026-01-20T00:00:00Z");
        assert_eq!(trial_end(start, Some(ends), Some(5), 14), Ok(Some(ends)));
        assert_eq!(
            trial_end(start, None, Some(5), 14),
            Ok(Some(at("2026-01-06T00:00:00Z")))
        );
        assert_eq!(
            trial_end(start, None, None, 14),
            Ok(Some(at("2026-01-15T00:00:00Z")))
        );
        assert_eq!(trial_end(start, None, Some(0), 14), Ok(None));
        assert_eq!(trial_end(start, None, None, 0), Ok(None));
        assert_eq!(
            trial_end(start, None, Some(365), 0),
            Ok(Some(at("2027-01-01T00:00:00Z")))
        );
    }

    #[test]
    fn out_of_range_trials_are_refused_naming_the_field() {
        let start = at("2026-01-01T00:00:00Z");
        for bad in [366, -1, i64::MAX] {
            let err = trial_end(start, None, Some(bad), 14).unwrap_err();
            assert!(err.to_string().starts_with("trialDays"), "{err}");
            // Even when trialEndsAt would win.
            assert!(trial_end(start, Some(at("2026-02-01T00:00:00Z")), Some(bad), 0).is_err());
        }
        assert_eq!(
            trial_end(start, Some(start), None, 0),
            Err(TermsError::TrialEndsBeforeStart)
        );
        assert_eq!(
            trial_end(start, Some(at("2027-01-02T00:00:00Z")), None, 0),
            Err(TermsError::TrialTooLong)
        );
    }

    #[test]
    fn an_extended_trial_must_end_after_the_current_end() {
        let now = at("2026-01-05T00:00:00Z");
        let current = at("2026-01-15T00:00:00Z");
        assert!(matches!(
            extended_trial_end(current, current, now),
            Err(TermsError::ExtensionNotLater { .. })
        ));
        assert!(extended_trial_end(current, at("2026-01-10T00:00:00Z"), now).is_err());
        assert_eq!(
            extended_trial_end(current, at("2026-01-16T00:00:00Z"), now),
            Ok(at("2026-01-16T00:00:00Z"))
        );
    }

    #[test]
    fn terms_are_checked() {
        assert_eq!(monthly().check(), Ok(()));
        let mut t = monthly();
        t.amount = 0;
        assert_eq!(t.check(), Err(TermsError::Amount));
        let mut t = monthly();
        t.interval_count = 0;
        assert!(matches!(t.check(), Err(TermsError::Interval(_))));
        let mut t = monthly();
        t.trial_days = 366;
        assert!(t.check().is_err());
        let mut t = monthly();
        t.grace_period_days = 366;
        assert!(
            t.check()
                .unwrap_err()
                .to_string()
                .contains("gracePeriodDays")
        );
    }
}
