//! UTC timestamps (RFC 3339 on the wire, millisecond precision) and the
//! clock the domain reads them from, so tests can move time.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::{Arc, Mutex};

/// A point in time, always UTC, serialized as `2026-11-22T01:24:18.123Z`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(DateTime<Utc>);

impl Timestamp {
    pub fn from_datetime(dt: DateTime<Utc>) -> Self {
        // Millisecond precision, so a value survives a wire round trip.
        let ms = dt.timestamp_millis();
        Timestamp(DateTime::from_timestamp_millis(ms).unwrap_or(dt))
    }

    pub fn from_unix_millis(ms: i64) -> Option<Self> {
        DateTime::from_timestamp_millis(ms).map(Timestamp)
    }

    /// Parses RFC 3339 with any offset and normalizes it to UTC.
    pub fn parse(s: &str) -> Option<Self> {
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|dt| Timestamp::from_datetime(dt.with_timezone(&Utc)))
    }

    pub fn datetime(self) -> DateTime<Utc> {
        self.0
    }

    pub fn unix_seconds(self) -> i64 {
        self.0.timestamp()
    }

    pub fn unix_millis(self) -> i64 {
        self.0.timestamp_millis()
    }

    pub fn plus(self, d: chrono::Duration) -> Self {
        Timestamp(self.0 + d)
    }

    pub fn to_rfc3339(self) -> String {
        self.0.to_rfc3339_opts(SecondsFormat::Millis, true)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// On the wire: an RFC 3339 UTC timestamp.
impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .into()
    }
}
impl utoipa::ToSchema for Timestamp {}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid date-time {s:?}: expected RFC 3339, e.g. 2026-01-31T12:00:00Z"
            ))
        })
    }
}

/// Where the domain reads the time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The machine's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_datetime(Utc::now())
    }
}

/// A clock tests set and advance by hand.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    pub fn new(at: Timestamp) -> Self {
        ManualClock(Arc::new(Mutex::new(at)))
    }

    pub fn advance(&self, d: chrono::Duration) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *t = t.plus(d);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_rfc3339_with_millis() {
        let t = Timestamp::parse("2026-11-22T06:54:18.5+05:30");
        assert_eq!(
            t.map(|t| t.to_rfc3339()).as_deref(),
            Some("2026-11-22T01:24:18.500Z")
        );
        let json = serde_json::to_string(&t).unwrap_or_default();
        assert_eq!(json, "\"2026-11-22T01:24:18.500Z\"");
        let back: Option<Timestamp> = serde_json::from_str(&json).ok();
        assert_eq!(back, t);
    }

    #[test]
    fn bad_timestamps_are_refused() {
        for bad in ["", "2026-11-22", "yesterday", "2026-13-01T00:00:00Z"] {
            assert!(Timestamp::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = Timestamp::parse("2026-01-01T00:00:00Z").unwrap_or_else(|| SystemClock.now());
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(chrono::Duration::minutes(30));
        assert_eq!(clock.now().unix_seconds() - start.unix_seconds(), 1800);
    }
}
