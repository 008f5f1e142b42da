//! A statement's rows, whatever the file format, read as lines: find the
//! header row (title rows may precede it), read the merchant account from
//! those rows, then each row through the provider's column table.

use std::collections::HashMap;

use chrono::{NaiveDate, NaiveDateTime, NaiveTime, TimeDelta};

use super::columns::{self, ACCOUNT_LABELS, Field};
use super::{LineKind, LineStatus, ParseError, StatementLine};
use crate::kinds::Provider;
use crate::money::Paisa;
use crate::providers::amount::{AmountError, parse_rupees};
use crate::time::Timestamp;

/// How many rows may come before the header row.
pub(super) const HEADER_SCAN: usize = 30;
/// Columns read per row; cells further right are ignored.
pub(super) const MAX_COLUMNS: usize = 64;
/// Longest reference accepted in a cell.
const MAX_REF_LEN: usize = 128;
/// Nepal time, which the providers write.
const NEPAL_OFFSET_SECONDS: i64 = 5 * 3600 + 45 * 60;

/// One cell, as the CSV reader or the spreadsheet reader saw it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Cell {
    Empty,
    Text(String),
    Int(i64),
    Float(f64),
    /// A spreadsheet date/time cell: days since 1899-12-30 (the 1900
    /// date system), the fraction being the time of day.
    Serial(f64),
    /// Anything else (a boolean, a formula error).
    Other(String),
}

impl Cell {
    fn is_blank(&self) -> bool {
        match self {
            Cell::Empty => true,
            Cell::Text(t) => t.trim().is_empty(),
            _ => false,
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Cell::Text(t) => Some(t.trim()).filter(|t| !t.is_empty()),
            _ => None,
        }
    }
}

/// One source row: its 1-based line (CSV line, sheet row) and its cells.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Row {
    pub line: u32,
    pub cells: Vec<Cell>,
}

fn err(line: u32, column: Option<&str>, message: impl Into<String>) -> ParseError {
    ParseError {
        line: Some(line),
        column: column.map(str::to_owned),
        message: message.into(),
    }
}

/// The lines of `rows` for `provider`, with the merchant account named
/// before the header row (when it is).
pub(super) fn read(
    provider: Provider,
    rows: &[Row],
) -> Result<(Option<String>, Vec<StatementLine>), ParseError> {
    let Some(table) = columns::table(provider) else {
        return Err(ParseError {
            line: None,
            column: None,
            message: format!(
                "{} statements are pulled from its API, not uploaded",
                provider.display_name()
            ),
        });
    };
    let nonblank: Vec<&Row> = rows
        .iter()
        .filter(|r| !r.cells.iter().all(Cell::is_blank))
        .collect();
    if nonblank.is_empty() {
        return Err(ParseError {
            line: None,
            column: None,
            message: "the file is empty".into(),
        });
    }
    let (header_at, header) = find_header(table, &nonblank)?;
    let account = account(&nonblank[..header_at]);
    let mut lines = Vec::new();
    let mut seen: HashMap<(LineKind, String), u32> = HashMap::new();
    for row in &nonblank[header_at + 1..] {
        let Some(line) = read_row(provider, &header, row)? else {
            continue;
        };
        let key = line
            .provider_ref
            .clone()
            .or_else(|| line.reference.clone())
            .unwrap_or_default();
        if let Some(first) = seen.insert((line.kind, key.clone()), line.line) {
            let column = header
                .name_of(if line.provider_ref.is_some() {
                    Field::ProviderRef
                } else {
                    Field::Reference
                })
                .map(str::to_owned);
            return Err(err(
                line.line,
                column.as_deref(),
                format!("duplicate line: '{key}' is already on line {first}"),
            ));
        }
        lines.push(line);
    }
    Ok((account, lines))
}

/// The header row: which column index holds which field.
struct Header {
    columns: Vec<(usize, Field, String)>,
}

impl Header {
    fn get(&self, field: Field) -> Option<(usize, &str)> {
        self.columns
            .iter()
            .find(|(_, f, _)| *f == field)
            .map(|(i, _, name)| (*i, name.as_str()))
    }

    fn name_of(&self, field: Field) -> Option<&str> {
        self.get(field).map(|(_, name)| name)
    }
}

const REQUIRED: [Field; 2] = [Field::Amount, Field::At];

fn find_header(table: &[(&str, Field)], rows: &[&Row]) -> Result<(usize, Header), ParseError> {
    let mut best: Option<(usize, usize)> = None; // (row position, fields recognised)
    for (at, row) in rows.iter().enumerate().take(HEADER_SCAN) {
        let mut found: Vec<(usize, Field, String)> = Vec::new();
        for (i, cell) in row.cells.iter().enumerate() {
            let Some(text) = cell.text() else { continue };
            if let Some(field) = columns::field_of(table, text) {
                found.push((i, field, text.to_owned()));
            }
        }
        let has = |f: Field| found.iter().any(|(_, g, _)| *g == f);
        let complete =
            REQUIRED.iter().all(|f| has(*f)) && (has(Field::Reference) || has(Field::ProviderRef));
        if complete {
            for (n, (_, field, name)) in found.iter().enumerate() {
                if let Some((_, _, other)) = found[n + 1..].iter().find(|(_, f, _)| f == field) {
                    return Err(err(
                        row.line,
                        Some(other),
                        format!(
                            "columns '{name}' and '{other}' both mean the {}",
                            field.label()
                        ),
                    ));
                }
            }
            return Ok((at, Header { columns: found }));
        }
        if best.is_none_or(|(_, n)| found.len() > n) && !found.is_empty() {
            best = Some((at, found.len()));
        }
    }
    let wanted = |f: Field| format!("{} ({})", f.label(), columns::spellings(table, f));
    match best {
        Some((at, _)) => {
            let row = rows[at];
            let present: Vec<Field> = row
                .cells
                .iter()
                .filter_map(|c| c.text().and_then(|t| columns::field_of(table, t)))
                .collect();
            let mut missing: Vec<String> = REQUIRED
                .iter()
                .filter(|f| !present.contains(f))
                .map(|f| wanted(*f))
                .collect();
            if !present.contains(&Field::Reference) && !present.contains(&Field::ProviderRef) {
                missing.push(format!(
                    "{} or {}",
                    wanted(Field::Reference),
                    wanted(Field::ProviderRef)
                ));
            }
            Err(err(
                row.line,
                None,
                format!(
                    "the header row lacks required columns: {}",
                    missing.join("; ")
                ),
            ))
        }
        None => Err(ParseError {
            line: None,
            column: None,
            message: format!(
                "no header row in the first {HEADER_SCAN} rows: unknown columns (expected {}, {}, and {} or {})",
                wanted(Field::Amount),
                wanted(Field::At),
                wanted(Field::Reference),
                wanted(Field::ProviderRef)
            ),
        }),
    }
}

/// The merchant account named in the rows before the header:
/// `Merchant Code: X` in one cell, or the label and the value in two.
fn account(preamble: &[&Row]) -> Option<String> {
    for row in preamble {
        for (i, cell) in row.cells.iter().enumerate() {
            let Some(text) = cell.text() else { continue };
            let (label, value) = match text.split_once(':') {
                Some((l, v)) if !v.trim().is_empty() => (l, Some(v.trim().to_owned())),
                Some((l, _)) => (l, None),
                None => (text, None),
            };
            if !ACCOUNT_LABELS.contains(&columns::normalize(label).as_str()) {
                continue;
            }
            let value = value.or_else(|| {
                row.cells[i + 1..].iter().find_map(|c| match c {
                    Cell::Int(n) => Some(n.to_string()),
                    other => other.text().map(str::to_owned),
                })
            });
            if let Some(v) = value.filter(|v| v.chars().count() <= MAX_REF_LEN) {
                return Some(v);
            }
        }
    }
    None
}

/// One data row; `None` for a totals row (no reference, a cell starting
/// with "total").
fn read_row(
    provider: Provider,
    header: &Header,
    row: &Row,
) -> Result<Option<StatementLine>, ParseError> {
    let cell = |field: Field| -> Option<(&Cell, &str)> {
        header
            .get(field)
            .map(|(i, name)| (row.cells.get(i).unwrap_or(&Cell::Empty), name))
    };
    // A totals row: its first text says so and it has no date.
    let first_text = row
        .cells
        .iter()
        .find_map(Cell::text)
        .map(columns::normalize);
    let dateless = cell(Field::At).is_none_or(|(c, _)| c.is_blank());
    if dateless
        && first_text.as_deref().is_some_and(|t| {
            ["total", "grand total", "sub total", "subtotal"]
                .iter()
                .any(|w| t.starts_with(w))
        })
    {
        return Ok(None);
    }
    let reference = match cell(Field::Reference) {
        Some((c, name)) => ref_text(c).map_err(|m| err(row.line, Some(name), m))?,
        None => None,
    };
    let provider_ref = match cell(Field::ProviderRef) {
        Some((c, name)) => ref_text(c).map_err(|m| err(row.line, Some(name), m))?,
        None => None,
    };
    if reference.is_none() && provider_ref.is_none() {
        let name = header
            .name_of(Field::ProviderRef)
            .or_else(|| header.name_of(Field::Reference));
        return Err(err(row.line, name, "the line has no reference"));
    }
    let (c, name) = cell(Field::Amount).ok_or_else(|| err(row.line, None, "no amount column"))?;
    let amount = money(c).map_err(|m| err(row.line, Some(name), m))?;
    let fee = match cell(Field::Fee) {
        Some((c, _)) if c.is_blank() => None,
        Some((c, name)) => Some(money(c).map_err(|m| err(row.line, Some(name), m))?),
        None => None,
    };
    let (c, name) = cell(Field::At).ok_or_else(|| err(row.line, None, "no date column"))?;
    let at = instant(c).map_err(|m| err(row.line, Some(name), m))?;
    let status = match cell(Field::Status) {
        Some((c, name)) => status(c).map_err(|m| err(row.line, Some(name), m))?,
        None => LineStatus::Success,
    };
    let kind = match cell(Field::Kind) {
        Some((c, _)) if c.is_blank() => LineKind::Payment,
        Some((c, name)) => kind(c).map_err(|m| err(row.line, Some(name), m))?,
        None => LineKind::Payment,
    };
    Ok(Some(StatementLine {
        line: row.line,
        provider,
        reference,
        provider_ref,
        kind,
        status,
        amount,
        fee,
        at,
    }))
}

fn ref_text(cell: &Cell) -> Result<Option<String>, String> {
    let text = match cell {
        Cell::Empty => return Ok(None),
        Cell::Text(t) => t.trim().to_owned(),
        Cell::Int(n) => n.to_string(),
        // A numeric id a spreadsheet stored as a number.
        Cell::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.0}"),
        _ => return Err("the reference is not text".into()),
    };
    if text.is_empty() {
        return Ok(None);
    }
    if text.chars().count() > MAX_REF_LEN {
        return Err(format!(
            "the reference is longer than {MAX_REF_LEN} characters"
        ));
    }
    if text.chars().any(char::is_control) {
        return Err("the reference has control characters".into());
    }
    Ok(Some(text))
}

/// Rupees, exactly, as paisa: decimal text (`"1,500.50"`, an `Rs`/`NPR`
/// prefix allowed) or a spreadsheet number within 1e-6 of a paisa value.
pub(super) fn money(cell: &Cell) -> Result<Paisa, String> {
    match cell {
        Cell::Text(t) => {
            let mut s = t.trim();
            for prefix in ["NPR", "Rs.", "Rs", "रु."] {
                if let Some(rest) = s.strip_prefix(prefix) {
                    s = rest.trim_start();
                    break;
                }
            }
            parse_rupees(s).map_err(|e| match e {
                AmountError::Empty => "the amount is empty".to_owned(),
                AmountError::Negative => "the amount is negative".to_owned(),
                AmountError::Invalid => format!("'{}' is not an amount", clip(t, 40)),
                AmountError::SubPaisa => "the amount is not a whole number of paisa".to_owned(),
                AmountError::Overflow => "the amount is too large".to_owned(),
            })
        }
        Cell::Int(n) => {
            if *n < 0 {
                return Err("the amount is negative".into());
            }
            n.checked_mul(100)
                .and_then(|p| Paisa::new(p).ok())
                .ok_or_else(|| "the amount is too large".into())
        }
        Cell::Float(f) => float_paisa(*f),
        Cell::Empty => Err("the amount is empty".into()),
        Cell::Serial(_) | Cell::Other(_) => Err("the amount is not a number".into()),
    }
}

/// A spreadsheet number of rupees as paisa, when it is one to within 1e-6.
fn float_paisa(f: f64) -> Result<Paisa, String> {
    if !f.is_finite() {
        return Err("the amount is not a number".into());
    }
    if f < 0.0 {
        return Err("the amount is negative".into());
    }
    // Beyond 2^53 / 100 rupees a float no longer holds every paisa.
    if f >= 90_071_992_547_409.0 {
        return Err("the amount is too large".into());
    }
    let paisa = (f * 100.0).round();
    if (f - paisa / 100.0).abs() > 1e-6 {
        return Err("the amount is not a whole number of paisa".into());
    }
    // In range (checked above), so the cast is exact.
    Paisa::new(paisa as i64).map_err(|_| "the amount is negative".into())
}

/// When, as UTC: a spreadsheet date cell, RFC 3339 with an offset, or a
/// Nepal-time `YYYY-MM-DD[ HH:MM[:SS[.fff]]]` (also with `/`).
pub(super) fn instant(cell: &Cell) -> Result<Timestamp, String> {
    let local = match cell {
        Cell::Serial(days) => serial(*days)?,
        Cell::Float(days) if (1.0..2_958_466.0).contains(days) => serial(*days)?,
        Cell::Text(t) => {
            let t = t.trim();
            if t.is_empty() {
                return Err("the date is empty".into());
            }
            if let Some(ts) = Timestamp::parse(t) {
                return Ok(ts);
            }
            nepal_text(t).ok_or_else(|| {
                format!(
                    "'{}' is not a date (YYYY-MM-DD HH:MM:SS, Nepal time)",
                    clip(t, 40)
                )
            })?
        }
        Cell::Empty => return Err("the date is empty".into()),
        _ => return Err("the date is not a date".into()),
    };
    let utc = local
        .checked_sub_signed(TimeDelta::seconds(NEPAL_OFFSET_SECONDS))
        .ok_or("the date is out of range")?;
    Ok(Timestamp::from_datetime(utc.and_utc()))
}

fn nepal_text(t: &str) -> Option<NaiveDateTime> {
    const FORMATS: [&str; 8] = [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
        "%Y/%m/%d %H:%M:%S%.f",
        "%Y/%m/%d %H:%M",
        "%Y-%m-%d %I:%M:%S %p",
        "%Y-%m-%d %I:%M %p",
        "%Y/%m/%d %I:%M:%S %p",
    ];
    for f in FORMATS {
        if let Ok(dt) = NaiveDateTime::parse_from_str(t, f) {
            return Some(dt);
        }
    }
    for f in ["%Y-%m-%d", "%Y/%m/%d"] {
        if let Ok(d) = NaiveDate::parse_from_str(t, f) {
            return Some(d.and_time(NaiveTime::MIN));
        }
    }
    None
}

/// A 1900-system spreadsheet serial as a local date and time (to the
/// second).
fn serial(days: f64) -> Result<NaiveDateTime, String> {
    if !days.is_finite() || !(0.0..2_958_466.0).contains(&days) {
        return Err("the date is out of range".into());
    }
    let base = NaiveDate::from_ymd_opt(1899, 12, 30)
        .map(|d| d.and_time(NaiveTime::MIN))
        .ok_or("the date is out of range")?;
    // Bounded above, so the cast is exact.
    let seconds = (days * 86_400.0).round() as i64;
    base.checked_add_signed(TimeDelta::seconds(seconds))
        .ok_or_else(|| "the date is out of range".into())
}

fn status(cell: &Cell) -> Result<LineStatus, String> {
    let Some(word) = cell.text() else {
        return Err("the status is empty".into());
    };
    Ok(match columns::normalize(word).as_str() {
        "success" | "successful" | "succeeded" | "complete" | "completed" | "paid" | "settled" => {
            LineStatus::Success
        }
        "failed" | "failure" | "fail" | "declined" | "cancelled" | "canceled" | "expired" => {
            LineStatus::Failed
        }
        "pending" | "initiated" | "processing" | "ambiguous" | "in progress" => LineStatus::Pending,
        "refunded" | "refund" | "partially refunded" | "full refund" | "partial refund" => {
            LineStatus::Refunded
        }
        _ => LineStatus::Other,
    })
}

fn kind(cell: &Cell) -> Result<LineKind, String> {
    let Some(word) = cell.text() else {
        return Err("the type is not text".into());
    };
    match columns::normalize(word).as_str() {
        "payment" | "sale" | "purchase" | "collection" | "credit" | "qr payment"
        | "web payment" | "merchant payment" => Ok(LineKind::Payment),
        "refund" | "reversal" | "refunded" | "debit" => Ok(LineKind::Refund),
        _ => Err(format!("'{}' is not a payment or a refund", clip(word, 40))),
    }
}

fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Cell {
        Cell::Text(s.into())
    }

    #[test]
    fn amounts_are_exact_paisa() {
        assert_eq!(
            money(&t("1,500.50")),
            Ok(Paisa::new(150_050).unwrap_or_default())
        );
        assert_eq!(
            money(&t("Rs. 10")),
            Ok(Paisa::new(1000).unwrap_or_default())
        );
        assert_eq!(
            money(&t("NPR 1,00,000.0")),
            Ok(Paisa::new(10_000_000).unwrap_or_default())
        );
        assert_eq!(
            money(&Cell::Int(15)),
            Ok(Paisa::new(1500).unwrap_or_default())
        );
        assert_eq!(
            money(&Cell::Float(1500.5)),
            Ok(Paisa::new(150_050).unwrap_or_default())
        );
        assert_eq!(
            money(&Cell::Float(0.1 + 0.2)),
            Ok(Paisa::new(30).unwrap_or_default())
        );
        assert!(money(&Cell::Float(10.005)).is_err());
        assert!(money(&Cell::Float(-1.0)).is_err());
        assert!(money(&Cell::Float(f64::NAN)).is_err());
        assert!(money(&Cell::Float(1e300)).is_err());
        assert!(money(&Cell::Int(-5)).is_err());
        assert!(money(&Cell::Int(i64::MAX)).is_err());
        assert!(money(&t("-10")).is_err_and(|m| m.contains("negative")));
        assert!(money(&t("ten")).is_err_and(|m| m.contains("not an amount")));
        assert!(money(&t("10.005")).is_err());
        assert!(money(&t("")).is_err());
    }

    #[test]
    fn dates_are_nepal_time_unless_they_say_otherwise() {
        let want = Timestamp::parse("2026-11-28T08:15:00Z");
        assert_eq!(instant(&t("2026-11-28 14:00:00")).ok(), want);
        assert_eq!(instant(&t("2026/11/28 14:00")).ok(), want);
        assert_eq!(instant(&t("2026-11-28 02:00:00 PM")).ok(), want);
        assert_eq!(instant(&t("2026-11-28T14:00:00+05:45")).ok(), want);
        assert_eq!(instant(&t("2026-11-28T08:15:00Z")).ok(), want);
        // 2026-11-28 14:00 as a 1900-system serial.
        let days = 46_354.0 + 14.0 / 24.0;
        assert_eq!(instant(&Cell::Serial(days)).ok(), want);
        assert!(instant(&t("28/11/2026")).is_err());
        assert!(instant(&t("")).is_err());
        assert!(instant(&Cell::Serial(f64::INFINITY)).is_err());
        assert!(instant(&Cell::Serial(-3.0)).is_err());
    }
}
