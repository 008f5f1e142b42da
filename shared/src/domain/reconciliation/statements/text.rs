//! CSV statement files: UTF-8 (with or without a byte-order mark) or
//! UTF-16 with its mark, comma-, semicolon- or tab-separated.

use super::table::{Cell, MAX_COLUMNS, Row};
use super::{MAX_LINES, ParseError};

/// The rows of a CSV file.
pub(super) fn rows(bytes: &[u8]) -> Result<Vec<Row>, ParseError> {
    let text = decode(bytes)?;
    let delimiter = delimiter(&text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(text.as_bytes());
    // Each record's line: one more than the newlines up to its first byte
    // (a quoted field may span lines; after a CRLF the reader puts the
    // next record's start on the LF).
    let newlines: Vec<usize> = text
        .bytes()
        .enumerate()
        .filter_map(|(i, b)| (b == b'\n').then_some(i))
        .collect();
    let line_at = |byte: u64| -> u32 {
        let byte = usize::try_from(byte).unwrap_or(usize::MAX);
        u32::try_from(newlines.partition_point(|&n| n <= byte) + 1).unwrap_or(u32::MAX)
    };
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        let line = line_at(reader.position().byte());
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(line, |p| line_at(p.byte()));
                return Err(ParseError {
                    line: Some(line),
                    column: None,
                    message: format!("unreadable CSV: {e}"),
                });
            }
        }
        let line = record.position().map_or(line, |p| line_at(p.byte()));
        if usize::try_from(line).unwrap_or(usize::MAX) > MAX_LINES {
            return Err(too_long(line));
        }
        let cells = record
            .iter()
            .take(MAX_COLUMNS)
            .map(|field| {
                if field.trim().is_empty() {
                    Cell::Empty
                } else {
                    Cell::Text(field.to_owned())
                }
            })
            .collect();
        rows.push(Row { line, cells });
    }
    Ok(rows)
}

pub(super) fn too_long(line: u32) -> ParseError {
    ParseError {
        line: Some(line),
        column: None,
        message: format!("the statement has more than {MAX_LINES} lines"),
    }
}

/// The text of `bytes`: a UTF-8 or UTF-16 (LE/BE) byte-order mark is
/// honoured; without one the file must be UTF-8.
fn decode(bytes: &[u8]) -> Result<String, ParseError> {
    if let Some(rest) = bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]) {
        return utf8(rest);
    }
    let utf16 = |rest: &[u8], le: bool| -> Result<String, ParseError> {
        let units = rest.chunks(2).map(|c| match (c, le) {
            ([a, b], true) => u16::from_le_bytes([*a, *b]),
            ([a, b], false) => u16::from_be_bytes([*a, *b]),
            _ => 0xD800, // an odd trailing byte: an unpaired surrogate
        });
        let mut out = String::with_capacity(rest.len() / 2);
        let mut line = 1u32;
        for c in char::decode_utf16(units) {
            match c {
                Ok(c) => {
                    if c == '\n' {
                        line = line.saturating_add(1);
                    }
                    out.push(c);
                }
                Err(_) => {
                    return Err(ParseError {
                        line: Some(line),
                        column: None,
                        message: "the file is not valid UTF-16".into(),
                    });
                }
            }
        }
        Ok(out)
    };
    if let Some(rest) = bytes.strip_prefix(&[0xFF, 0xFE]) {
        return utf16(rest, true);
    }
    if let Some(rest) = bytes.strip_prefix(&[0xFE, 0xFF]) {
        return utf16(rest, false);
    }
    utf8(bytes)
}

fn utf8(bytes: &[u8]) -> Result<String, ParseError> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(e) => {
            let before = &bytes[..e.valid_up_to()];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            Err(ParseError {
                line: Some(u32::try_from(line).unwrap_or(u32::MAX)),
                column: None,
                message:
                    "the file is not UTF-8 text (save the export as CSV UTF-8, or upload the XLSX)"
                        .into(),
            })
        }
    }
}

/// The separator the first lines use most: `,` (the default), `;` or tab.
fn delimiter(text: &str) -> u8 {
    let head: String = text.lines().take(40).collect::<Vec<_>>().join("\n");
    let count = |c: char| head.chars().filter(|&x| x == c).count();
    let (comma, semi, tab) = (count(','), count(';'), count('\t'));
    if tab > comma && tab >= semi {
        b'\t'
    } else if semi > comma {
        b';'
    } else {
        b','
    }
}
