//! Spreadsheet statement files (XLSX, XLS) through calamine: the first
//! worksheet, as rows of cells.
//!
//! XLSX is read cell by cell (calamine's streaming reader), so a sheet
//! that claims a huge extent costs nothing: rows past [`MAX_LINES`] are
//! refused and columns past [`MAX_COLUMNS`] ignored. Before that, the zip
//! container's declared sizes must stay under [`MAX_INFLATED`] (a small
//! file must not inflate to gigabytes).

use std::collections::BTreeMap;
use std::io::Cursor;

use calamine::{Data, DataRef, Reader, Xls, Xlsx};

use super::table::{Cell, MAX_COLUMNS, Row};
use super::text::too_long;
use super::{MAX_LINES, ParseError};

/// The most an XLSX may inflate to, all its parts together.
pub const MAX_INFLATED: u128 = 100 * 1024 * 1024;

fn broken(what: &str, e: impl std::fmt::Display) -> ParseError {
    let mut message = format!("the {what} file is broken or not a spreadsheet: {e}");
    message.truncate(300);
    ParseError {
        line: None,
        column: None,
        message,
    }
}

/// calamine may panic on a malformed file (an XLS whose sector chain
/// points past its end, found by the fuzz): such a file is broken, not a
/// crash.
fn guarded<T>(what: &str, read: impl FnOnce() -> Result<T, ParseError>) -> Result<T, ParseError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read))
        .unwrap_or_else(|_| Err(broken(what, "unreadable structure")))
}

/// The rows of an XLSX file's first worksheet.
pub(super) fn xlsx_rows(bytes: &[u8]) -> Result<Vec<Row>, ParseError> {
    guarded("XLSX", || xlsx_rows_unguarded(bytes))
}

/// The rows of an XLS (BIFF) file's first worksheet.
pub(super) fn xls_rows(bytes: &[u8]) -> Result<Vec<Row>, ParseError> {
    guarded("XLS", || xls_rows_unguarded(bytes))
}

fn xlsx_rows_unguarded(bytes: &[u8]) -> Result<Vec<Row>, ParseError> {
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| broken("XLSX", e))?;
    let mut inflated: u128 = 0;
    for i in 0..zip.len() {
        let size = zip.by_index_raw(i).map_err(|e| broken("XLSX", e))?.size();
        inflated = inflated.saturating_add(u128::from(size));
    }
    if inflated > MAX_INFLATED {
        return Err(ParseError {
            line: None,
            column: None,
            message: format!(
                "the XLSX file inflates to more than {} MB",
                MAX_INFLATED / 1024 / 1024
            ),
        });
    }
    let mut book: Xlsx<_> = Xlsx::new(Cursor::new(bytes)).map_err(|e| broken("XLSX", e))?;
    let Some(name) = book.sheet_names().first().cloned() else {
        return Err(broken("XLSX", "it has no worksheet"));
    };
    let mut cells = book
        .worksheet_cells_reader(&name)
        .map_err(|e| broken("XLSX", e))?;
    let mut rows: BTreeMap<u32, Vec<Cell>> = BTreeMap::new();
    while let Some(cell) = cells.next_cell().map_err(|e| broken("XLSX", e))? {
        let (r, c) = cell.get_position();
        let line = r.saturating_add(1);
        if usize::try_from(line).unwrap_or(usize::MAX) > MAX_LINES {
            return Err(too_long(line));
        }
        let Ok(c) = usize::try_from(c) else { continue };
        if c >= MAX_COLUMNS {
            continue;
        }
        let value = from_ref(cell.get_value());
        if value == Cell::Empty {
            continue;
        }
        let row = rows.entry(line).or_default();
        if row.len() <= c {
            row.resize(c + 1, Cell::Empty);
        }
        row[c] = value;
    }
    Ok(rows
        .into_iter()
        .map(|(line, cells)| Row { line, cells })
        .collect())
}

fn xls_rows_unguarded(bytes: &[u8]) -> Result<Vec<Row>, ParseError> {
    let mut book: Xls<_> = Xls::new(Cursor::new(bytes)).map_err(|e| broken("XLS", e))?;
    let range = match book.worksheet_range_at(0) {
        Some(r) => r.map_err(|e| broken("XLS", e))?,
        None => return Err(broken("XLS", "it has no worksheet")),
    };
    let Some((r0, c0)) = range.start() else {
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    for (i, row) in range.rows().enumerate() {
        let line = u32::try_from(i)
            .unwrap_or(u32::MAX)
            .saturating_add(r0)
            .saturating_add(1);
        if usize::try_from(line).unwrap_or(usize::MAX) > MAX_LINES {
            return Err(too_long(line));
        }
        let lead = usize::try_from(c0).unwrap_or(usize::MAX).min(MAX_COLUMNS);
        let mut cells = vec![Cell::Empty; lead];
        cells.extend(row.iter().take(MAX_COLUMNS - lead).map(from_data));
        rows.push(Row { line, cells });
    }
    Ok(rows)
}

fn from_ref(v: &DataRef<'_>) -> Cell {
    match v {
        DataRef::Int(n) => Cell::Int(*n),
        DataRef::Float(f) => Cell::Float(*f),
        DataRef::String(s) => Cell::Text(s.clone()),
        DataRef::SharedString(s) => Cell::Text((*s).to_owned()),
        DataRef::DateTime(d) => Cell::Serial(d.as_f64()),
        DataRef::DateTimeIso(s) => Cell::Text(s.clone()),
        DataRef::Empty => Cell::Empty,
        DataRef::Bool(b) => Cell::Other(b.to_string()),
        DataRef::DurationIso(s) => Cell::Other(s.clone()),
        DataRef::Error(e) => Cell::Other(e.to_string()),
    }
}

fn from_data(v: &Data) -> Cell {
    match v {
        Data::Int(n) => Cell::Int(*n),
        Data::Float(f) => Cell::Float(*f),
        Data::String(s) => Cell::Text(s.clone()),
        Data::DateTime(d) => Cell::Serial(d.as_f64()),
        Data::DateTimeIso(s) => Cell::Text(s.clone()),
        Data::Empty => Cell::Empty,
        Data::Bool(b) => Cell::Other(b.to_string()),
        Data::DurationIso(s) => Cell::Other(s.clone()),
        Data::Error(e) => Cell::Other(e.to_string()),
    }
}
