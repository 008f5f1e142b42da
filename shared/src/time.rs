//! UTC timestamps (RFC 3339 on the wire, millisecond precision) and the
//! clock the domain reads them from, so tests can move time.

use chrono::{DateTime, Datelike, NaiveDate, SecondsFormat, Timelike, Utc};
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
        if let Some(t) = Self::parse_canonical(s.as_bytes()) {
            return Some(t);
        }
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|dt| Timestamp::from_datetime(dt.with_timezone(&Utc)))
    }

    /// The form this type writes, `YYYY-MM-DDTHH:MM:SS.mmmZ`, read without
    /// chrono's general parser: every stored record and most requests carry
    /// it. `None` for anything else (other precision, an offset, a leap
    /// second, an invalid date), which [`Timestamp::parse`] then hands to
    /// chrono, so the fast path never decides what is valid.
    fn parse_canonical(b: &[u8]) -> Option<Self> {
        if b.len() != CANONICAL_LEN {
            return None;
        }
        if PUNCTUATION.iter().any(|&(at, c)| b[at] != c) {
            return None;
        }
        let num = |from: usize, to: usize| -> Option<u32> {
            b[from..to].iter().try_fold(0u32, |n, &d| {
                d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
            })
        };
        let year = i32::try_from(num(0, 4)?).ok()?;
        let (month, day) = (num(5, 7)?, num(8, 10)?);
        let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
        let millis = num(20, 23)?;
        if second > 59 {
            return None;
        }
        let dt = NaiveDate::from_ymd_opt(year, month, day)?
            .and_hms_milli_opt(hour, minute, second, millis)?
            .and_utc();
        Some(Timestamp(dt))
    }

    /// Writes the wire form into `buf` and returns it, without allocating;
    /// `None` outside years 0000-9999, which chrono writes with a sign.
    fn write_canonical(self, buf: &mut [u8; CANONICAL_LEN]) -> Option<&str> {
        let dt = self.0;
        let year = u32::try_from(dt.year()).ok().filter(|y| *y <= 9999)?;
        let millis = dt.nanosecond() / 1_000_000;
        if millis > 999 {
            return None; // a leap second; chrono's writer handles it
        }
        let mut put = |at: usize, width: usize, mut n: u32| {
            for i in (at..at + width).rev() {
                buf[i] = b'0' + (n % 10) as u8;
                n /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, dt.month());
        put(8, 2, dt.day());
        put(11, 2, dt.hour());
        put(14, 2, dt.minute());
        put(17, 2, dt.second());
        put(20, 3, millis);
        for (at, c) in PUNCTUATION {
            buf[at] = c;
        }
        std::str::from_utf8(buf).ok()
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
        self.to_string()
    }
}

/// The length of `2026-11-22T01:24:18.123Z`.
const CANONICAL_LEN: usize = 24;

/// Where that form has which separator; every other byte is a digit.
const PUNCTUATION: [(usize, u8); 7] = [
    (4, b'-'),
    (7, b'-'),
    (10, b'T'),
    (13, b':'),
    (16, b':'),
    (19, b'.'),
    (23, b'Z'),
];

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; CANONICAL_LEN];
        match self.write_canonical(&mut buf) {
            Some(s) => f.write_str(s),
            None => f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true)),
        }
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
        let mut buf = [0u8; CANONICAL_LEN];
        match self.write_canonical(&mut buf) {
            Some(text) => s.serialize_str(text),
            None => s.serialize_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true)),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TimestampVisitor)
    }
}

/// Reads the text where the deserializer holds it, borrowed or not, so a
/// record's timestamps cost no allocation.
struct TimestampVisitor;

impl serde::de::Visitor<'_> for TimestampVisitor {
    type Value = Timestamp;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an RFC 3339 date-time string")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Timestamp, E> {
        Timestamp::parse(s).ok_or_else(|| {
            E::custom(format!(
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

    /// chrono's reading and writing, which the fast paths must match.
    fn chrono_parse(s: &str) -> Option<Timestamp> {
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|dt| Timestamp::from_datetime(dt.with_timezone(&Utc)))
    }

    fn chrono_text(t: Timestamp) -> String {
        t.0.to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    /// Instants from year 0 to 9999 and beyond, edges first, then a
    /// fixed pseudo-random sweep.
    fn instants() -> Vec<Timestamp> {
        let edges = [
            "0000-01-01T00:00:00.000Z",
            "1970-01-01T00:00:00.000Z",
            "1999-12-31T23:59:59.999Z",
            "2000-02-29T12:00:00.001Z",
            "2024-02-29T23:59:59.999Z",
            "2026-11-22T01:24:18.500Z",
            "9999-12-31T23:59:59.999Z",
        ];
        let mut out: Vec<Timestamp> = edges.iter().filter_map(|e| chrono_parse(e)).collect();
        assert_eq!(out.len(), edges.len());
        let (min, max) = (-62_167_219_200_000i64, 253_402_300_799_999i64);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ms = min + (x % ((max - min) as u64 + 1)) as i64;
            out.extend(Timestamp::from_unix_millis(ms));
        }
        // Outside four-digit years chrono writes a sign; the writer defers.
        out.extend(Timestamp::from_unix_millis(max + 1));
        out.extend(Timestamp::from_unix_millis(min - 1));
        out
    }

    #[test]
    fn the_writer_writes_what_chrono_writes() {
        for t in instants() {
            let expected = chrono_text(t);
            assert_eq!(t.to_rfc3339(), expected);
            assert_eq!(
                serde_json::to_string(&t).unwrap_or_default(),
                format!("\"{expected}\"")
            );
        }
    }

    #[test]
    fn the_reader_agrees_with_chrono_on_every_text() {
        for t in instants() {
            let text = chrono_text(t);
            assert_eq!(Timestamp::parse(&text), chrono_parse(&text), "{text}");
            if (0..=9999).contains(&t.0.year()) {
                assert_eq!(Timestamp::parse(&text), Some(t), "{text}");
            }
            // Every one-byte change: the fast path accepts nothing chrono
            // refuses and reads nothing differently.
            let bytes = text.as_bytes();
            if t.unix_millis() % 97 != 0 {
                continue;
            }
            for at in 0..bytes.len() {
                for c in [
                    b'0', b'1', b'3', b'9', b'-', b':', b'T', b't', b'Z', b'z', b' ', b'.', b'+',
                    b'a',
                ] {
                    let mut changed = bytes.to_vec();
                    changed[at] = c;
                    let Ok(s) = std::str::from_utf8(&changed) else {
                        continue;
                    };
                    assert_eq!(Timestamp::parse(s), chrono_parse(s), "{s}");
                }
            }
        }
        for s in [
            "2026-02-29T00:00:00.000Z",
            "2026-04-31T00:00:00.000Z",
            "2026-11-22T24:00:00.000Z",
            "2026-11-22T23:60:00.000Z",
            "2026-11-22T23:59:60.000Z",
            "2016-12-31T23:59:60.000Z",
            "2026-11-22T01:24:18.5Z",
            "2026-11-22T01:24:18Z",
            "2026-11-22T01:24:18.123456Z",
            "2026-11-22T06:54:18.500+05:30",
            "2026-11-22t01:24:18.500z",
            "+2026-11-22T01:24:18.500Z",
            "２026-11-22T01:24:18.500Z",
        ] {
            assert_eq!(Timestamp::parse(s), chrono_parse(s), "{s}");
        }
    }

    #[test]
    fn a_timestamp_reads_from_borrowed_escaped_and_owned_text() {
        let expected = Timestamp::parse("2026-11-22T01:24:18.500Z");
        assert!(expected.is_some());
        let borrowed: Option<Timestamp> =
            serde_json::from_slice(b"\"2026-11-22T01:24:18.500Z\"").ok();
        let escaped: Option<Timestamp> =
            serde_json::from_str("\"2026-11-22T01:24:18.500\\u005a\"").ok();
        let owned: Option<Timestamp> =
            serde_json::from_value(serde_json::json!("2026-11-22T01:24:18.500Z")).ok();
        assert_eq!(borrowed, expected);
        assert_eq!(escaped, expected);
        assert_eq!(owned, expected);
        let wrong = serde_json::from_str::<Timestamp>("1764000000").map_err(|e| e.to_string());
        assert!(
            wrong.as_ref().is_err_and(|e| e.contains("date-time")),
            "{wrong:?}"
        );
        let bad = serde_json::from_str::<Timestamp>("\"2026-13-01T00:00:00Z\"")
            .map_err(|e| e.to_string());
        assert!(
            bad.as_ref().is_err_and(|e| e.contains("invalid date-time")),
            "{bad:?}"
        );
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
