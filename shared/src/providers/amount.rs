//! Amounts at the providers' edge, exactly, without floats.
//!
//! Internally every amount is [`Paisa`]. eSewa and Fonepay take and send
//! **rupees as decimal strings**; Khalti takes and sends **integer paisa**.
//!
//! - What we send ([`rupees`]): whole rupees without a fraction (`"110"`,
//!   as in eSewa's own form example), otherwise exactly two decimals
//!   (`"110.50"`). No thousands separators, no exponent, no sign. The same
//!   `Paisa` always renders to the same string, which matters for eSewa: the
//!   signature covers the string, and the status check must repeat it.
//! - What we read ([`parse_rupees`]): lenient but exact. eSewa renders
//!   amounts like a Java double (`"1000.0"`) and may use separators
//!   (`"1,000.0"`, or the South Asian `"1,00,000.0"`); any number of
//!   fraction digits is accepted as long as the digits past the paisa are
//!   zeros (`"10.500"` is 1050 paisa, `"10.005"` is refused: it is not a
//!   whole number of paisa).

use crate::money::Paisa;

/// Why a provider's amount could not be read as paisa.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("amount is empty")]
    Empty,
    #[error("amount is negative")]
    Negative,
    #[error("amount is not a decimal number")]
    Invalid,
    #[error("amount is not a whole number of paisa")]
    SubPaisa,
    #[error("amount is too large")]
    Overflow,
}

/// `amount` as a rupee string: `"110"` for whole rupees, else `"110.50"`.
pub fn rupees(amount: Paisa) -> String {
    let p = amount.get();
    let (whole, frac) = (p / 100, p % 100);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:02}")
    }
}

/// A rupee decimal string as exact paisa (see the module notes for what is
/// accepted). Surrounding whitespace is ignored.
pub fn parse_rupees(text: &str) -> Result<Paisa, AmountError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(AmountError::Empty);
    }
    if s.starts_with('-') {
        return Err(AmountError::Negative);
    }
    let (int_part, frac_part) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    // Integer part: digits, with commas only between digits.
    if int_part.is_empty()
        || int_part.starts_with(',')
        || int_part.ends_with(',')
        || int_part.contains(",,")
        || !int_part.bytes().all(|b| b.is_ascii_digit() || b == b',')
    {
        return Err(AmountError::Invalid);
    }
    let mut paisa: i64 = 0;
    for b in int_part.bytes().filter(u8::is_ascii_digit) {
        paisa = paisa
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(b - b'0')))
            .ok_or(AmountError::Overflow)?;
    }
    paisa = paisa.checked_mul(100).ok_or(AmountError::Overflow)?;
    if let Some(frac) = frac_part {
        if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AmountError::Invalid);
        }
        let digits = frac.as_bytes();
        if digits.iter().skip(2).any(|&b| b != b'0') {
            return Err(AmountError::SubPaisa);
        }
        let tens = digits.first().map_or(0, |b| i64::from(b - b'0'));
        let ones = digits.get(1).map_or(0, |b| i64::from(b - b'0'));
        paisa = paisa
            .checked_add(tens * 10 + ones)
            .ok_or(AmountError::Overflow)?;
    }
    Paisa::new(paisa).map_err(|_| AmountError::Negative)
}

/// A rupee amount from a JSON answer: a string, or a number taken by its
/// JSON text (`100.0` reads as `"100.0"`, never through float arithmetic
/// of ours).
pub fn rupees_from_json(value: &serde_json::Value) -> Result<Paisa, AmountError> {
    match value {
        serde_json::Value::String(s) => parse_rupees(s),
        serde_json::Value::Number(n) => parse_rupees(&n.to_string()),
        serde_json::Value::Null => Err(AmountError::Empty),
        _ => Err(AmountError::Invalid),
    }
}

/// A paisa amount from a Khalti answer: an integer, an integer string, or
/// a number with a zero fraction (`1000.0`).
pub fn paisa_from_json(value: &serde_json::Value) -> Result<Paisa, AmountError> {
    let text = match value {
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Paisa::new(i).map_err(|_| AmountError::Negative);
            }
            n.to_string()
        }
        serde_json::Value::String(s) => s.trim().to_owned(),
        serde_json::Value::Null => return Err(AmountError::Empty),
        _ => return Err(AmountError::Invalid),
    };
    if text.is_empty() {
        return Err(AmountError::Empty);
    }
    if text.starts_with('-') {
        return Err(AmountError::Negative);
    }
    let (int_part, frac) = match text.split_once('.') {
        Some((i, f)) if !f.is_empty() => (i, f),
        Some(_) => return Err(AmountError::Invalid),
        None => (text.as_str(), ""),
    };
    if int_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(AmountError::Invalid);
    }
    if frac.bytes().any(|b| b != b'0') {
        return Err(AmountError::SubPaisa);
    }
    let v: i64 = int_part.parse().map_err(|_| AmountError::Overflow)?;
    Paisa::new(v).map_err(|_| AmountError::Negative)
}

/// A fee the provider states in rupees as a JSON number or string
/// (Fonepay's `commissionAmount`, e.g. `0.0` or `12.35`), read strictly
/// from its JSON text: digits, then at most two decimals; no sign, no
/// exponent, no separators. A negative value or a third decimal is refused
/// (a provider error for the caller to log), never rounded.
pub fn parse_commission(raw: &str) -> Result<Paisa, AmountError> {
    let mut s = raw.trim();
    if let Some(inner) = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        s = inner.trim();
    }
    if s.is_empty() || s == "null" {
        return Err(AmountError::Empty);
    }
    if s.starts_with('-') {
        return Err(AmountError::Negative);
    }
    let (int_part, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, "00"),
    };
    if int_part.is_empty()
        || frac.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(AmountError::Invalid);
    }
    if frac.len() > 2 {
        return Err(AmountError::SubPaisa);
    }
    let mut paisa: i64 = 0;
    for b in int_part.bytes() {
        paisa = paisa
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(b - b'0')))
            .ok_or(AmountError::Overflow)?;
    }
    let digits = frac.as_bytes();
    let tens = digits.first().map_or(0, |b| i64::from(b - b'0'));
    let ones = digits.get(1).map_or(0, |b| i64::from(b - b'0'));
    paisa = paisa
        .checked_mul(100)
        .and_then(|v| v.checked_add(tens * 10 + ones))
        .ok_or(AmountError::Overflow)?;
    Paisa::new(paisa).map_err(|_| AmountError::Negative)
}

/// The raw JSON text of the value of `key` (matched case-insensitively)
/// in the top-level object `json`, untouched by any number parsing (so a
/// decimal is read exactly by [`parse_commission`]). `None` when the text
/// is not an object or has no such key.
pub fn raw_field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let b = json.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(b, i);
        match b.get(i)? {
            b'}' => return None,
            b'"' => {}
            _ => return None,
        }
        let key_end = skip_string(b, i)?;
        let name = json.get(i + 1..key_end - 1)?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let start = i;
        i = skip_value(b, i)?;
        if name.eq_ignore_ascii_case(key) {
            return json.get(start..i).map(str::trim);
        }
        i = skip_ws(b, i);
        match b.get(i)? {
            b',' => i += 1,
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The index just past the string starting at `i` (a `"`).
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index just past the JSON value starting at `i`.
fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match b.get(i)? {
                    b'"' => {
                        i = skip_string(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            while b
                .get(i)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
            {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: i64) -> Paisa {
        Paisa::new(v).unwrap_or_default()
    }

    #[test]
    fn rupee_strings_are_exact_and_stable() {
        assert_eq!(rupees(p(0)), "0");
        assert_eq!(rupees(p(1)), "0.01");
        assert_eq!(rupees(p(10)), "0.10");
        assert_eq!(rupees(p(11000)), "110");
        assert_eq!(rupees(p(11050)), "110.50");
        assert_eq!(rupees(p(11005)), "110.05");
        assert_eq!(rupees(p(100_000)), "1000");
        assert_eq!(rupees(p(i64::MAX)), "92233720368547758.07");
        for v in [0, 1, 99, 100, 101, 11050, 123_456_789, i64::MAX] {
            assert_eq!(parse_rupees(&rupees(p(v))), Ok(p(v)), "round trip {v}");
        }
    }

    #[test]
    fn provider_amounts_parse_leniently_but_exactly() {
        let cases = [
            ("1000.0", 100_000),
            ("110", 11_000),
            ("110.5", 11_050),
            ("110.50", 11_050),
            ("110.500", 11_050),
            ("0.01", 1),
            ("0.1", 10),
            ("1,000.0", 100_000),
            ("1,000.00", 100_000),
            ("1,00,000.0", 10_000_000),
            ("  20.0 ", 2_000),
            ("007", 700),
            ("0", 0),
            ("92233720368547758.07", i64::MAX),
        ];
        for (text, paisa) in cases {
            assert_eq!(parse_rupees(text), Ok(p(paisa)), "{text}");
        }
    }

    #[test]
    fn bad_amounts_are_refused_with_a_reason() {
        use AmountError::*;
        let cases = [
            ("", Empty),
            ("   ", Empty),
            ("-1", Negative),
            ("-0.01", Negative),
            ("+5", Invalid),
            ("1e3", Invalid),
            ("abc", Invalid),
            ("1.2.3", Invalid),
            (".5", Invalid),
            ("5.", Invalid),
            (",100", Invalid),
            ("100,", Invalid),
            ("1,,000", Invalid),
            ("1,000.0,0", Invalid),
            ("NaN", Invalid),
            ("1 000", Invalid),
            ("१००", Invalid),
            ("10.005", SubPaisa),
            ("0.001", SubPaisa),
            ("92233720368547758.08", Overflow),
            ("99999999999999999999999", Overflow),
        ];
        for (text, err) in cases {
            assert_eq!(parse_rupees(text), Err(err), "{text}");
        }
    }

    #[test]
    fn json_amounts() {
        assert_eq!(rupees_from_json(&json!(100.0)), Ok(p(10_000)));
        assert_eq!(rupees_from_json(&json!(100)), Ok(p(10_000)));
        assert_eq!(rupees_from_json(&json!(110.5)), Ok(p(11_050)));
        assert_eq!(rupees_from_json(&json!(1234567.89)), Ok(p(123_456_789)));
        assert_eq!(rupees_from_json(&json!("1,000.0")), Ok(p(100_000)));
        assert_eq!(rupees_from_json(&json!(null)), Err(AmountError::Empty));
        assert_eq!(rupees_from_json(&json!(true)), Err(AmountError::Invalid));
        assert_eq!(rupees_from_json(&json!(-5.0)), Err(AmountError::Negative));

        assert_eq!(paisa_from_json(&json!(1000)), Ok(p(1000)));
        assert_eq!(paisa_from_json(&json!("1000")), Ok(p(1000)));
        assert_eq!(paisa_from_json(&json!(1000.0)), Ok(p(1000)));
        assert_eq!(paisa_from_json(&json!("1000.00")), Ok(p(1000)));
        assert_eq!(paisa_from_json(&json!(10.5)), Err(AmountError::SubPaisa));
        assert_eq!(paisa_from_json(&json!(-1)), Err(AmountError::Negative));
        assert_eq!(paisa_from_json(&json!("-1")), Err(AmountError::Negative));
        assert_eq!(paisa_from_json(&json!("1e3")), Err(AmountError::Invalid));
        assert_eq!(paisa_from_json(&json!("")), Err(AmountError::Empty));
        assert_eq!(paisa_from_json(&json!(null)), Err(AmountError::Empty));
        assert_eq!(paisa_from_json(&json!([1])), Err(AmountError::Invalid));
        assert_eq!(
            paisa_from_json(&json!("99999999999999999999")),
            Err(AmountError::Overflow)
        );
    }

    #[test]
    fn commissions_convert_exactly_and_strictly() {
        let ok = [
            ("0.0", 0),
            ("0", 0),
            ("12.35", 1235),
            ("12.3", 1230),
            ("\"4.50\"", 450),
            ("0.01", 1),
            ("1234567.89", 123_456_789),
            ("92233720368547758.07", i64::MAX),
        ];
        for (raw, paisa) in ok {
            assert_eq!(parse_commission(raw), Ok(p(paisa)), "{raw}");
        }
        use AmountError::*;
        let bad = [
            ("-0.5", Negative),
            ("\"-1\"", Negative),
            ("0.001", SubPaisa),
            ("1.500", SubPaisa),
            ("1e2", Invalid),
            ("1.", Invalid),
            (".5", Invalid),
            ("1,000.00", Invalid),
            ("true", Invalid),
            ("null", Empty),
            ("", Empty),
            ("92233720368547758.08", Overflow),
        ];
        for (raw, err) in bad {
            assert_eq!(parse_commission(raw), Err(err), "{raw}");
        }
    }

    #[test]
    fn raw_fields_are_the_json_text() {
        let j = r#"{"traceId":17015,"remarks1":"a,}b\"","nested":{"x":[1,{"y":2}]},"commissionAmount" : 0.10 ,"last":true}"#;
        assert_eq!(raw_field(j, "commissionamount"), Some("0.10"));
        assert_eq!(raw_field(j, "traceId"), Some("17015"));
        assert_eq!(raw_field(j, "remarks1"), Some(r#""a,}b\"""#));
        assert_eq!(raw_field(j, "last"), Some("true"));
        assert_eq!(raw_field(j, "missing"), None);
        assert_eq!(raw_field("[1]", "a"), None);
        assert_eq!(raw_field(r#"{"a":"#, "a"), None);
        assert_eq!(raw_field(r#"{"a":"unterminated"#, "a"), None);
        assert_eq!(raw_field("", "a"), None);
    }
}
