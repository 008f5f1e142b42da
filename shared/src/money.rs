//! Money in paisa (1 NPR = 100 paisa), as integers, never floats.

use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// A non-negative amount of Nepalese rupees in paisa.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Paisa(i64);

/// On the wire: a non-negative integer of paisa.
impl utoipa::PartialSchema for Paisa {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(0))
            .description(Some("An amount in paisa (1 NPR = 100 paisa)."))
            .into()
    }
}
impl utoipa::ToSchema for Paisa {}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("amount must not be negative")]
    Negative,
    #[error("amount is too large")]
    Overflow,
}

impl Paisa {
    pub const ZERO: Paisa = Paisa(0);

    pub fn new(paisa: i64) -> Result<Self, MoneyError> {
        if paisa < 0 {
            Err(MoneyError::Negative)
        } else {
            Ok(Paisa(paisa))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }

    /// No paisa (a counted field left out of its stored item at zero).
    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }

    pub fn checked_add(self, other: Paisa) -> Result<Paisa, MoneyError> {
        self.0
            .checked_add(other.0)
            .map(Paisa)
            .ok_or(MoneyError::Overflow)
    }

    /// `self - other`, refusing to go below zero.
    pub fn checked_sub(self, other: Paisa) -> Result<Paisa, MoneyError> {
        match self.0.checked_sub(other.0) {
            Some(v) if v >= 0 => Ok(Paisa(v)),
            _ => Err(MoneyError::Negative),
        }
    }

    /// Rupees with thousands separators, as shown to people:
    /// `NPR 1,234.50`.
    pub fn display_npr(self) -> String {
        let rupees = self.0 / 100;
        let paisa = self.0 % 100;
        let digits = rupees.to_string();
        let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        format!("NPR {grouped}.{paisa:02}")
    }
}

impl fmt::Display for Paisa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_npr())
    }
}

impl<'de> Deserialize<'de> for Paisa {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        Paisa::new(v).map_err(serde::de::Error::custom)
    }
}

/// The one currency the service takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum Currency {
    #[default]
    #[serde(rename = "NPR")]
    Npr,
}

/// An amount a person typed in rupees (`1500`, `1,500.5`, `NPR 1,500.50`)
/// in paisa: at most two decimals, commas only between digits, more than
/// zero, at most 10 digits of rupees.
pub fn parse_rupees(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let t = t
        .strip_prefix("NPR")
        .or_else(|| t.strip_prefix("Rs."))
        .or_else(|| t.strip_prefix("Rs"))
        .unwrap_or(t)
        .trim();
    let wrong = || format!("{text:?} is not an amount in rupees, like 1500 or 1,500.50");
    let (whole, frac) = match t.split_once('.') {
        Some((_, "")) => return Err(wrong()),
        Some((w, f)) => (w, f),
        None => (t, ""),
    };
    let grouped_ok = whole.split(',').enumerate().all(|(i, g)| {
        !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) && (i == 0 || g.len() == 3)
    });
    let digits: String = whole.chars().filter(|c| *c != ',').collect();
    if !grouped_ok
        || digits.len() > 10
        || frac.len() > 2
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(wrong());
    }
    let rupees: i64 = digits.parse().map_err(|_| wrong())?;
    let paisa: i64 = match frac.len() {
        0 => 0,
        1 => frac.parse::<i64>().map_err(|_| wrong())? * 10,
        _ => frac.parse::<i64>().map_err(|_| wrong())?,
    };
    let total = rupees * 100 + paisa;
    if total <= 0 {
        return Err(format!("{text:?}: an amount must be more than zero"));
    }
    Ok(total)
}

/// A stored amount compares with a plain number of paisa (a condition
/// such as "reserved at most the room left", where the room may be
/// negative).
impl std::borrow::Borrow<i64> for Paisa {
    fn borrow(&self) -> &i64 {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_amounts_are_refused() {
        assert_eq!(Paisa::new(-1), Err(MoneyError::Negative));
        assert!(serde_json::from_str::<Paisa>("-5").is_err());
        assert!(serde_json::from_str::<Paisa>("1.5").is_err());
        assert_eq!(
            serde_json::from_str::<Paisa>("10000").ok(),
            Some(Paisa(10000))
        );
    }

    #[test]
    fn arithmetic_never_wraps_or_goes_negative() {
        let max = Paisa::new(i64::MAX).unwrap_or_default();
        assert_eq!(max.checked_add(Paisa(1)), Err(MoneyError::Overflow));
        assert_eq!(Paisa(5).checked_sub(Paisa(6)), Err(MoneyError::Negative));
        assert_eq!(Paisa(5).checked_sub(Paisa(5)), Ok(Paisa::ZERO));
        assert_eq!(Paisa(5).checked_add(Paisa(6)), Ok(Paisa(11)));
    }

    #[test]
    fn amounts_display_in_rupees() {
        assert_eq!(Paisa(0).display_npr(), "NPR 0.00");
        assert_eq!(Paisa(5).display_npr(), "NPR 0.05");
        assert_eq!(Paisa(10000).display_npr(), "NPR 100.00");
        assert_eq!(Paisa(123456789).display_npr(), "NPR 1,234,567.89");
        assert_eq!(Paisa(100000).display_npr(), "NPR 1,000.00");
    }

    #[test]
    fn currency_is_npr_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&Currency::Npr).ok().as_deref(),
            Some("\"NPR\"")
        );
        assert!(serde_json::from_str::<Currency>("\"USD\"").is_err());
    }

    #[test]
    fn rupees_as_people_type_them() {
        for (text, paisa) in [
            ("1500", 150_000),
            ("1,500", 150_000),
            ("1,500.5", 150_050),
            ("NPR 1,500.50", 150_050),
            ("Rs. 10", 1_000),
            (" 0.01 ", 1),
            ("12,34,567", -1),
            ("1234567890", 123_456_789_000),
        ] {
            match super::parse_rupees(text) {
                Ok(p) => assert_eq!(p, paisa, "{text}"),
                Err(e) => assert_eq!(paisa, -1, "{text}: {e}"),
            }
        }
        for bad in [
            "",
            "0",
            "0.00",
            "-5",
            "1.234",
            "1,50",
            ",100",
            "1e3",
            "12345678901",
            "1.",
            "abc",
            "1 000",
        ] {
            assert!(super::parse_rupees(bad).is_err(), "{bad}");
        }
    }
}
