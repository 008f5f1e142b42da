//! One-time invoices (spec "One-time invoice", decisions "One-time
//! invoices"): drafts, gapless numbering at finalize, corrections,
//! collection adjustments, collection through checkout, and the PDF.
//!
//! Storage:
//! - an invoice at `OINV#<id>` / `OINV`, listed per project and mode on
//!   `gsi1` (`PROJ#<project>#<mode>#OINV`, by id: newest first), and in
//!   its narrowings by status (`Invoice::by_status`: `gsi4` by document
//!   status, `gsi5` by collection status, `gsi6` by both), every change
//!   one whole write (`Invoice::write_over`) moving their counts;
//! - the number counter at `PROJ#<project>#<mode>` / `SEQ#PI`, attribute
//!   `value` = the last number given. A finalize reads it and writes
//!   `value + 1` with the condition `value = <read>` in the same
//!   transaction as the invoice, so two finalizes can never take one
//!   number, and a failed finalize takes none (no gap);
//! - the PDF in the blob store at `invoices/<id>/v<version>.pdf`: a new
//!   version of the document (a payment, an adjustment, a void) is a new
//!   file, so a stale PDF is never served.
//!
//! Every change bumps `version`; writes from the API carry the version
//! they were made against (optimistic locking), and so does the payment
//! allocation (re-read and retried on conflict).

mod collection;
mod corrections;
mod drafts;
/// The lists by status (a `tests.rs` of their own).
#[cfg(test)]
mod narrowed {
    mod tests;
}
mod numbering;
#[cfg(feature = "pdf")]
mod pdf;
mod records;
#[cfg(test)]
mod tests;

pub use collection::{InvoiceCheckoutView, allocation_ops, checkout};
pub use corrections::{adjust, correct};
pub use drafts::{
    AdjustInvoice, CorrectInvoice, CreateInvoice, FinalizeInvoice, InvoiceCheckout, InvoiceError,
    LineInput, PatchInvoice, create, get, get_any, list, new_draft, patch,
};
pub use numbering::{InvoiceSequence, discard, finalize, last_number, take_number};
#[cfg(feature = "pdf")]
pub use pdf::{pdf, store_pdf};
pub use records::{
    Adjustment, Allocation, Buyer, CollectionStatus, DocumentStatus, Invoice, InvoiceView, Line,
    Quantity, SellerView, StoredBuyer,
};

pub const MAX_LINES: usize = 100;
pub const MAX_TAX_BPS: i64 = 10_000;
/// Largest quantity (before the decimals).
pub const MAX_QUANTITY_UNITS: u64 = 1_000_000;
/// Largest unit amount: NPR 1,000,000,000.00.
pub const MAX_UNIT_AMOUNT: i64 = 100_000_000_000;
pub const DEFAULT_PAGE: usize = 25;
/// How often a finalize re-reads a counter another finalize moved, and for
/// how long at most (well within a Lambda's 15 s).
const FINALIZE_TRIES: usize = 64;
const FINALIZE_BUDGET: std::time::Duration = std::time::Duration::from_secs(8);

// ------------------------------------------------------------------ money
