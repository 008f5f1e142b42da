//! A provider's statement of what it processed: the lines of an uploaded
//! eSewa or Fonepay portal file, or of Khalti's merchant transaction list,
//! in one shape whatever the source.

use serde::{Deserialize, Serialize};

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
