//! A provider's statement of what it processed: the lines of an uploaded
//! eSewa or Fonepay portal file, or of Khalti's merchant transaction list,
//! in one shape whatever the source.
//!
//! [`parse`] reads an eSewa or Fonepay statement file (XLSX, XLS or CSV,
//! sniffed from its bytes) through the provider's column table
//! (`columns.rs`: one line per accepted header spelling). It never
//! returns part of a file: any bad line is a [`ParseError`] naming the
//! line and the column.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod columns;
mod sheet;
mod table;
#[cfg(test)]
mod tests;
mod text;

use crate::kinds::Provider;
use crate::money::Paisa;
use crate::time::Timestamp;

/// What a statement line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineKind {
    Payment,
    Refund,
}

/// What the provider says of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineStatus {
    Success,
    Failed,
    Pending,
    Refunded,
    Other,
}

/// One line of a provider's statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementLine {
    /// 1-based row of the source (CSV line, sheet row, list position):
    /// what errors and the dashboard name.
    pub line: u32,
    pub provider: Provider,
    /// Our reference as sent to the provider (eSewa `transaction_uuid`,
    /// Khalti `purchase_order_id`, Fonepay `PRN`), when the source has it.
    pub reference: Option<String>,
    /// The provider's own id (eSewa reference id, Khalti transaction
    /// `idx`, Fonepay trace id).
    pub provider_ref: Option<String>,
    pub kind: LineKind,
    pub status: LineStatus,
    /// Never negative; a refund line's amount is what was refunded.
    pub amount: Paisa,
    pub fee: Option<Paisa>,
    /// When the provider recorded it (providers write Nepal time).
    pub at: Timestamp,
}

/// A whole statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    pub provider: Provider,
    /// The merchant account the statement is for (eSewa merchant code,
    /// Fonepay merchant code), when the source names it.
    pub account: Option<String>,
    pub lines: Vec<StatementLine>,
    /// Hex SHA-256 of the source bytes (the same file twice changes
    /// nothing).
    pub digest: String,
}

/// Why a statement could not be read: never partial, always naming
/// where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: Option<u32>,
    pub column: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.line, &self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column '{c}': {}", self.message),
            (Some(l), None) => write!(f, "line {l}: {}", self.message),
            (None, Some(c)) => write!(f, "column '{c}': {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ParseError {}

/// The largest statement file accepted (bytes).
pub const MAX_BYTES: usize = 10 * 1024 * 1024;
/// The most rows a statement file may have (CSV lines or sheet rows,
/// title and header rows included).
pub const MAX_LINES: usize = 50_000;

/// A statement file's format, as its bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Csv,
    Xlsx,
    Xls,
}

impl Format {
    /// A zip container (`PK\x03\x04`) is XLSX, an OLE compound file
    /// (`D0 CF 11 E0 A1 B1 1A E1`) is XLS, anything else is read as CSV.
    pub fn sniff(bytes: &[u8]) -> Format {
        if bytes.starts_with(b"PK\x03\x04") {
            Format::Xlsx
        } else if bytes.starts_with(&[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1]) {
            Format::Xls
        } else {
            Format::Csv
        }
    }
}

/// The statement in `bytes`, an eSewa or Fonepay portal export; all of
/// it, or an error naming the first bad line.
pub fn parse(provider: Provider, bytes: &[u8]) -> Result<Statement, ParseError> {
    if bytes.len() > MAX_BYTES {
        return Err(ParseError {
            line: None,
            column: None,
            message: format!("the file is larger than {} MB", MAX_BYTES / 1024 / 1024),
        });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ParseError {
            line: None,
            column: None,
            message: "the file is empty".into(),
        });
    }
    let rows = match Format::sniff(bytes) {
        Format::Xlsx => sheet::xlsx_rows(bytes)?,
        Format::Xls => sheet::xls_rows(bytes)?,
        Format::Csv => text::rows(bytes)?,
    };
    let (account, lines) = table::read(provider, &rows)?;
    Ok(Statement {
        provider,
        account,
        lines,
        digest: digest(bytes),
    })
}

/// Hex SHA-256 of a statement's source bytes.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
