//! One-time invoices (spec "One-time invoice", decisions "One-time
//! invoices"): drafts, gapless numbering at finalize, corrections,
//! collection adjustments, collection through checkout, and the PDF.
//!
//! Storage:
//! - an invoice at `OINV#<id>` / `OINV`, listed per project and mode on
//!   `gsi1` (`PROJ#<project>#<mode>#OINV`, by id: newest first);
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

use crate::refusal::Refusal;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Mode;
use super::account::{self, Seller};
use super::analytics::Tally;
use super::checkout::{self, CheckoutSession, SessionStatus};
use super::outbox::{Event, EventType};
use super::payments::{self, Payment, PaymentStatus};
use super::record::{from_item, page_of, to_item};
use crate::Deps;
use crate::fields::wire::{nullable, or_null, present};
use crate::fields::{
    BuyerAddress, BuyerPhone, Email, InvoiceLineText, InvoiceNote, InvoiceText, PersonName, Phone,
};
use crate::ids::{self, IdKind};
use crate::keys;
use crate::money::Currency;
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Query, Store, StoreError, TxOp, TxReason, Update};
use crate::time::Timestamp;

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

/// A quantity: decimal text with at most 3 decimals, greater than zero,
/// kept as thousandths (`"1.5"` = 1500).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity(u64);

impl Quantity {
    pub fn parse(text: &str) -> Result<Quantity, String> {
        let bad = || {
            format!(
                "quantity must be decimal text like \"2\" or \"1.5\" (at most 3 decimals, greater than 0), got {text:?}"
            )
        };
        let (whole, frac) = match text.split_once('.') {
            Some((w, f)) => (w, f),
            None => (text, ""),
        };
        if whole.is_empty()
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
            || frac.len() > 3
            || (text.contains('.') && frac.is_empty())
        {
            return Err(bad());
        }
        let whole_value: u64 = whole
            .trim_start_matches('0')
            .parse()
            .or_else(|_| {
                if whole.bytes().all(|b| b == b'0') {
                    Ok(0)
                } else {
                    Err(())
                }
            })
            .map_err(|_| bad())?;
        if whole_value > MAX_QUANTITY_UNITS {
            return Err(format!("quantity must be at most {MAX_QUANTITY_UNITS}"));
        }
        let mut thousandths: u64 = 0;
        for (i, b) in frac.bytes().enumerate() {
            thousandths += u64::from(b - b'0') * [100, 10, 1][i];
        }
        let total = whole_value * 1000 + thousandths;
        if total == 0 {
            return Err(bad());
        }
        if total > MAX_QUANTITY_UNITS * 1000 {
            return Err(format!("quantity must be at most {MAX_QUANTITY_UNITS}"));
        }
        Ok(Quantity(total))
    }

    pub fn thousandths(self) -> u64 {
        self.0
    }

    /// The canonical text: no leading zeros, no trailing decimal zeros.
    pub fn text(self) -> String {
        let whole = self.0 / 1000;
        let frac = self.0 % 1000;
        if frac == 0 {
            whole.to_string()
        } else {
            let f = format!("{frac:03}");
            format!("{whole}.{}", f.trim_end_matches('0'))
        }
    }
}

/// `round_half_up(quantity x unit_amount)` in paisa.
pub fn line_total(quantity: Quantity, unit_amount: i64) -> i64 {
    let product = i128::from(quantity.0) * i128::from(unit_amount);
    // Both are >= 0: half up is adding half the divisor.
    ((product + 500) / 1000) as i64
}

/// `round_half_up(subtotal x bps / 10000)` in paisa.
pub fn tax_total(subtotal: i64, bps: i64) -> i64 {
    ((i128::from(subtotal) * i128::from(bps) + 5_000) / 10_000) as i64
}

// -------------------------------------------------------------- resources

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentStatus {
    Draft,
    Issued,
    Void,
}

impl DocumentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentStatus::Draft => "draft",
            DocumentStatus::Issued => "issued",
            DocumentStatus::Void => "void",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            DocumentStatus::Draft,
            DocumentStatus::Issued,
            DocumentStatus::Void,
        ]
        .into_iter()
        .find(|d| d.as_str() == s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectionStatus {
    Unpaid,
    PartPaid,
    Paid,
    ClosedAdjusted,
}

impl CollectionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CollectionStatus::Unpaid => "unpaid",
            CollectionStatus::PartPaid => "part_paid",
            CollectionStatus::Paid => "paid",
            CollectionStatus::ClosedAdjusted => "closed_adjusted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            CollectionStatus::Unpaid,
            CollectionStatus::PartPaid,
            CollectionStatus::Paid,
            CollectionStatus::ClosedAdjusted,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

/// One line, as stored (plain text) and as answered (`Line<InvoiceLineText>`,
/// the contract's rule on `description`), camelCase (spec "Line object").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Line<D = String> {
    pub id: String,
    pub description: D,
    pub quantity: String,
    pub unit_amount: i64,
    pub line_total: i64,
}

impl Line {
    /// The line as answered.
    pub fn view(self) -> Line<InvoiceLineText> {
        Line {
            id: self.id,
            description: InvoiceLineText::stored(self.description),
            quantity: self.quantity,
            unit_amount: self.unit_amount,
            line_total: self.line_total,
        }
    }
}

/// The buyer on the wire (spec: name, email, phone, address; nothing
/// else), each field with its rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buyer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<InvoiceText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<Email>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<BuyerPhone>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<BuyerAddress>,
}

/// The buyer as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredBuyer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl StoredBuyer {
    /// The buyer as answered (it kept the rules when written).
    pub fn view(self) -> Buyer {
        Buyer {
            name: self.name.map(InvoiceText::stored),
            email: self.email.map(Email::stored),
            phone: self.phone.map(BuyerPhone::stored),
            address: self.address.map(BuyerAddress::stored),
        }
    }
}

/// A payment allocated to the invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub payment_id: String,
    pub amount: i64,
    /// The part beyond the collectible balance (in `amount_excess`).
    pub excess: i64,
    pub at: Timestamp,
}

/// A collection adjustment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adjustment {
    pub amount: i64,
    pub reason: String,
    pub at: Timestamp,
}

/// A stored invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoice {
    pub id: String,
    pub project_id: String,
    pub mode: Mode,
    pub version: i64,
    pub invoice_number: Option<String>,
    pub document_status: DocumentStatus,
    pub collection_status: CollectionStatus,
    pub currency: Currency,
    pub lines: Vec<Line>,
    pub subtotal: i64,
    pub tax_rate_bps: i64,
    pub tax_total: i64,
    pub total_amount: i64,
    pub amount_paid: i64,
    pub amount_adjusted: i64,
    pub amount_excess: i64,
    pub customer_id: Option<String>,
    pub buyer: Option<StoredBuyer>,
    pub seller: Option<Seller>,
    pub issued_at: Option<Timestamp>,
    pub due_at: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub external_reference: Option<String>,
    pub note: Option<String>,
    pub needs_attention: bool,
    pub voided_at: Option<Timestamp>,
    pub void_reason: Option<String>,
    pub corrected_by_invoice_id: Option<String>,
    pub correction_of_invoice_id: Option<String>,
    /// The last checkout session opened for the invoice.
    #[serde(default)]
    pub checkout_session_id: Option<String>,
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    #[serde(default)]
    pub adjustments: Vec<Adjustment>,
}

impl Invoice {
    pub fn key(id: &str) -> Key {
        keys::record(keys::Record::Invoice, id)
    }

    fn list_partition(project_id: &str, mode: Mode) -> String {
        keys::per_mode(project_id, mode, keys::PerMode::Invoices)
    }

    fn indexes(&self) -> Vec<(Index, String, String)> {
        vec![(
            Index::Gsi1,
            Invoice::list_partition(&self.project_id, self.mode),
            self.id.clone(),
        )]
    }

    /// The current collectible balance.
    pub fn amount_remaining(&self) -> i64 {
        if self.document_status != DocumentStatus::Issued {
            return if self.document_status == DocumentStatus::Draft {
                self.total_amount
            } else {
                0
            };
        }
        (self.total_amount - self.amount_paid - self.amount_adjusted).max(0)
    }

    /// `collection_status` from the amounts (decisions).
    pub fn collection(&self) -> CollectionStatus {
        let remaining = self.total_amount - self.amount_paid - self.amount_adjusted;
        if self.document_status == DocumentStatus::Issued && remaining <= 0 {
            if self.amount_adjusted > 0 {
                CollectionStatus::ClosedAdjusted
            } else {
                CollectionStatus::Paid
            }
        } else if self.amount_paid > 0 {
            CollectionStatus::PartPaid
        } else {
            CollectionStatus::Unpaid
        }
    }

    /// Issued, something left to collect, and past due.
    pub fn overdue(&self, now: Timestamp) -> bool {
        self.document_status == DocumentStatus::Issued
            && self.amount_remaining() > 0
            && now > self.due_at
    }

    /// Where its PDF is stored (one file per version).
    pub fn pdf_key(&self) -> String {
        format!("invoices/{}/v{}.pdf", self.id, self.version)
    }

    fn item(&self) -> Result<crate::store::Item, StoreError> {
        to_item(self, &Invoice::key(&self.id), &self.indexes())
    }
}

/// The seller as answered (camelCase keys, spec "seller").
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SellerView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legal_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    pub logo_url: Option<String>,
    pub brand_color: Option<String>,
}

/// The invoice as the API answers it (spec field names, snake_case).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InvoiceView {
    pub id: String,
    pub object: &'static str,
    pub livemode: bool,
    pub version: i64,
    pub invoice_number: Option<String>,
    pub document_status: &'static str,
    pub collection_status: &'static str,
    pub overdue: bool,
    pub currency: &'static str,
    pub lines: Vec<Line<InvoiceLineText>>,
    pub subtotal: i64,
    pub tax_total: i64,
    pub tax_rate_bps: i64,
    pub total_amount: i64,
    pub amount_paid: i64,
    pub amount_adjusted: i64,
    pub amount_excess: i64,
    pub amount_remaining: i64,
    pub customer_id: Option<InvoiceText>,
    pub buyer: Option<Buyer>,
    pub seller: Option<SellerView>,
    pub issued_at: Option<Timestamp>,
    pub due_at: Timestamp,
    pub created_at: Timestamp,
    pub external_reference: Option<InvoiceText>,
    pub note: Option<InvoiceNote>,
    pub needs_attention: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voided_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub void_reason: Option<InvoiceLineText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corrected_by_invoice_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correction_of_invoice_id: Option<String>,
}

impl InvoiceView {
    pub fn at(inv: &Invoice, now: Timestamp) -> Self {
        InvoiceView {
            id: inv.id.clone(),
            object: "standalone_invoice",
            livemode: inv.mode.is_live(),
            version: inv.version,
            invoice_number: inv.invoice_number.clone(),
            document_status: inv.document_status.as_str(),
            collection_status: inv.collection().as_str(),
            overdue: inv.overdue(now),
            currency: "NPR",
            lines: inv.lines.iter().cloned().map(Line::view).collect(),
            subtotal: inv.subtotal,
            tax_total: inv.tax_total,
            tax_rate_bps: inv.tax_rate_bps,
            total_amount: inv.total_amount,
            amount_paid: inv.amount_paid,
            amount_adjusted: inv.amount_adjusted,
            amount_excess: inv.amount_excess,
            amount_remaining: inv.amount_remaining(),
            customer_id: inv.customer_id.clone().map(InvoiceText::stored),
            buyer: inv.buyer.clone().map(StoredBuyer::view),
            seller: inv.seller.as_ref().map(|s| SellerView {
                name: s.name.clone(),
                legal_name: s.legal_name.clone(),
                email: s.email.clone(),
                logo_url: s.logo_url.clone(),
                brand_color: s.brand_color.clone(),
            }),
            issued_at: inv.issued_at,
            due_at: inv.due_at,
            created_at: inv.created_at,
            external_reference: inv.external_reference.clone().map(InvoiceText::stored),
            note: inv.note.clone().map(InvoiceNote::stored),
            needs_attention: inv.needs_attention,
            voided_at: inv.voided_at,
            void_reason: inv.void_reason.clone().map(InvoiceLineText::stored),
            corrected_by_invoice_id: inv.corrected_by_invoice_id.clone(),
            correction_of_invoice_id: inv.correction_of_invoice_id.clone(),
        }
    }
}

// ------------------------------------------------------------- requests

/// One line of a create or patch body.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LineInput {
    pub description: InvoiceLineText,
    pub quantity: String,
    pub unit_amount: i64,
}

/// `POST /v1/invoices` (camelCase request).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateInvoice {
    pub lines: Vec<LineInput>,
    pub due_at: String,
    #[serde(default, deserialize_with = "or_null")]
    pub customer_id: Option<InvoiceText>,
    #[serde(default, deserialize_with = "or_null")]
    pub buyer: Option<Buyer>,
    #[serde(default)]
    pub tax_rate_bps: Option<i64>,
    #[serde(default, deserialize_with = "or_null")]
    pub external_reference: Option<InvoiceText>,
    #[serde(default, deserialize_with = "or_null")]
    pub note: Option<InvoiceNote>,
}

/// `PATCH /v1/invoices/{id}`: the create fields to change, and the
/// `version` they were made against. A key sent as `null` clears it
/// (except `lines` and `dueAt`, which cannot be cleared).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchInvoice {
    pub version: i64,
    #[serde(default, deserialize_with = "present")]
    pub lines: Option<Vec<LineInput>>,
    #[serde(default, deserialize_with = "present")]
    pub due_at: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_id: Option<Option<InvoiceText>>,
    #[serde(default, deserialize_with = "nullable")]
    pub buyer: Option<Option<Buyer>>,
    #[serde(default, deserialize_with = "present")]
    pub tax_rate_bps: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub external_reference: Option<Option<InvoiceText>>,
    #[serde(default, deserialize_with = "nullable")]
    pub note: Option<Option<InvoiceNote>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalizeInvoice {
    pub version: i64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectInvoice {
    pub reason: InvoiceLineText,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdjustInvoice {
    pub amount: i64,
    pub reason: InvoiceLineText,
    pub version: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvoiceCheckout {
    #[serde(default)]
    pub provider: Option<super::Provider>,
}

#[derive(Debug, thiserror::Error)]
pub enum InvoiceError {
    #[error("{message}")]
    Invalid { field: String, message: String },
    #[error("no such invoice: {0}")]
    NotFound(String),
    /// A retried discard whose first run deleted the draft.
    #[error("the draft was discarded by this request")]
    AlreadyDiscarded,
    #[error("live one-time invoices are disabled for this project; sandbox keeps working")]
    LiveDisabled,
    #[error("{0}")]
    StateConflict(String),
    #[error("the invoice changed since version {sent} (it is at version {current}); read it again")]
    VersionConflict { sent: i64, current: i64 },
    #[error("{0}")]
    NotCorrectable(String),
    /// The invoice's balance cannot be collected through a checkout now
    /// (provider disabled, sandbox cap, amount out of the provider's range).
    #[error("{0}")]
    Checkout(checkout::CheckoutError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<InvoiceError> for Refusal {
    fn from(err: InvoiceError) -> Self {
        match err {
            InvoiceError::Invalid { field, message } => Refusal::invalid(field, message),
            InvoiceError::NotFound(id) => Refusal::not_found("invoice", &id),
            e @ InvoiceError::LiveDisabled => {
                Refusal::forbidden("live_invoicing_disabled", e.to_string())
            }
            e @ InvoiceError::StateConflict(_) => {
                Refusal::conflict("state_conflict", e.to_string())
            }
            e @ InvoiceError::VersionConflict { .. } => {
                Refusal::conflict("version_conflict", e.to_string())
            }
            e @ InvoiceError::NotCorrectable(_) => {
                Refusal::unprocessable("invoice_not_correctable", e.to_string())
            }
            // The balance is out of what a checkout may take: a business
            // rule (nothing in the request to fix).
            InvoiceError::Checkout(checkout::CheckoutError::Invalid { message, .. }) => {
                Refusal::unprocessable(
                    "invoice_not_collectable",
                    format!("This invoice's balance cannot be collected by checkout: {message}"),
                )
            }
            InvoiceError::Checkout(e) => e.into(),
            e @ InvoiceError::AlreadyDiscarded => Refusal::not_found("invoice", &e.to_string()),
            InvoiceError::Store(e) => e.into(),
        }
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> InvoiceError {
    InvoiceError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// A text the merchant sent, trimmed; blank is none. Its rule (length,
/// characters) was kept when the request was parsed ([`crate::fields`]).
fn text(value: Option<impl Into<String>>) -> Option<String> {
    value
        .map(|v| v.into().trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn valid_lines(lines: Vec<LineInput>) -> Result<Vec<Line>, InvoiceError> {
    if lines.is_empty() || lines.len() > MAX_LINES {
        return Err(invalid(
            "lines",
            format!("lines must hold 1 to {MAX_LINES} items"),
        ));
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let field = |name: &str| format!("lines[{i}].{name}");
            let description = text(Some(l.description))
                .ok_or_else(|| invalid(field("description"), "description must not be empty"))?;
            let quantity =
                Quantity::parse(l.quantity.trim()).map_err(|m| invalid(field("quantity"), m))?;
            if !(0..=MAX_UNIT_AMOUNT).contains(&l.unit_amount) {
                return Err(invalid(
                    field("unitAmount"),
                    format!("unitAmount must be whole paisa from 0 to {MAX_UNIT_AMOUNT}"),
                ));
            }
            Ok(Line {
                id: format!("il_{:03}", i + 1),
                description,
                quantity: quantity.text(),
                unit_amount: l.unit_amount,
                line_total: line_total(quantity, l.unit_amount),
            })
        })
        .collect()
}

fn valid_buyer(buyer: Option<Buyer>) -> Option<StoredBuyer> {
    let b = buyer?;
    let buyer = StoredBuyer {
        name: text(b.name),
        email: b.email.map(String::from),
        phone: text(b.phone),
        address: text(b.address),
    };
    (buyer != StoredBuyer::default()).then_some(buyer)
}

fn valid_due(text_value: &str) -> Result<Timestamp, InvoiceError> {
    use chrono::Datelike;
    let due = Timestamp::parse(text_value.trim()).ok_or_else(|| {
        invalid(
            "dueAt",
            "dueAt must be a date-time like 2026-12-31T18:00:00+05:45",
        )
    })?;
    // Stored as RFC 3339 text: keep to years that read back (and make sense).
    if !(2000..=2199).contains(&due.datetime().year()) {
        return Err(invalid(
            "dueAt",
            "dueAt must be between the years 2000 and 2199",
        ));
    }
    Ok(due)
}

fn valid_tax(bps: Option<i64>) -> Result<i64, InvoiceError> {
    match bps {
        None => Ok(0),
        Some(b) if (0..=MAX_TAX_BPS).contains(&b) => Ok(b),
        Some(_) => Err(invalid(
            "taxRateBps",
            format!("taxRateBps must be 0 to {MAX_TAX_BPS}"),
        )),
    }
}

/// Recomputes subtotal, tax and total from the lines and the rate.
fn price(inv: &mut Invoice) -> Result<(), InvoiceError> {
    let subtotal: i128 = inv.lines.iter().map(|l| i128::from(l.line_total)).sum();
    let subtotal =
        i64::try_from(subtotal).map_err(|_| invalid("lines", "the invoice total is too large"))?;
    let tax = tax_total(subtotal, inv.tax_rate_bps);
    inv.subtotal = subtotal;
    inv.tax_total = tax;
    inv.total_amount = subtotal
        .checked_add(tax)
        .filter(|t| *t <= i64::MAX / 4)
        .ok_or_else(|| invalid("lines", "the invoice total is too large"))?;
    Ok(())
}

/// A new draft from a create body (validated; not stored).
pub fn new_draft(
    project_id: &str,
    mode: Mode,
    body: CreateInvoice,
    now: Timestamp,
) -> Result<Invoice, InvoiceError> {
    let lines = valid_lines(body.lines)?;
    let mut inv = Invoice {
        id: ids::new_id(IdKind::Invoice),
        project_id: project_id.to_owned(),
        mode,
        version: 1,
        invoice_number: None,
        document_status: DocumentStatus::Draft,
        collection_status: CollectionStatus::Unpaid,
        currency: Currency::Npr,
        lines,
        subtotal: 0,
        tax_rate_bps: valid_tax(body.tax_rate_bps)?,
        tax_total: 0,
        total_amount: 0,
        amount_paid: 0,
        amount_adjusted: 0,
        amount_excess: 0,
        customer_id: text(body.customer_id),
        buyer: valid_buyer(body.buyer),
        seller: None,
        issued_at: None,
        due_at: valid_due(&body.due_at)?,
        created_at: now,
        updated_at: now,
        external_reference: text(body.external_reference),
        note: text(body.note),
        needs_attention: false,
        voided_at: None,
        void_reason: None,
        corrected_by_invoice_id: None,
        correction_of_invoice_id: None,
        checkout_session_id: None,
        allocations: Vec::new(),
        adjustments: Vec::new(),
    };
    price(&mut inv)?;
    Ok(inv)
}

// ------------------------------------------------------------ operations

/// The invoice `id` of any project (payments settle by session).
pub async fn get_any(store: &dyn Store, id: &str) -> Result<Option<Invoice>, StoreError> {
    if !ids::is_valid(id, IdKind::Invoice) {
        return Ok(None);
    }
    match store.get(&Invoice::key(id)).await? {
        Some(item) => Ok(Some(from_item(item)?)),
        None => Ok(None),
    }
}

/// The invoice `id` of `project_id` in `mode`.
pub async fn get(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<Invoice, InvoiceError> {
    match get_any(store, id).await? {
        Some(inv) if inv.project_id == project_id && inv.mode == mode => Ok(inv),
        _ => Err(InvoiceError::NotFound(id.to_owned())),
    }
}

/// Creates a draft. Live mode needs live invoicing enabled on the
/// project. With the request's fence, a retry finds the first draft.
pub async fn create(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    body: CreateInvoice,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    if mode == Mode::Live {
        let project = account::get_project(&*state.store, project_id).await?;
        if !project.is_some_and(|p| p.live_invoicing) {
            return Err(InvoiceError::LiveDisabled);
        }
    }
    let inv = new_draft(project_id, mode, body, state.clock.now())?;
    let mut ops = vec![TxOp::Put {
        item: inv.item()?,
        cond: Some(Cond::NotExists),
    }];
    if let Some(f) = fence {
        ops.push(f.op(&inv.id));
    }
    match state.store.transact(ops).await {
        Ok(()) => Ok(inv),
        Err(e) => match fence {
            Some(f) if Fence::tripped(&e, 1) => first_of(state, f, project_id, mode).await,
            _ => Err(e.into()),
        },
    }
}

/// What the first run of a fenced request made.
async fn first_of(
    state: &Deps,
    fence: &Fence,
    project_id: &str,
    mode: Mode,
) -> Result<Invoice, InvoiceError> {
    let first = fence.resource_id(&*state.store).await?.unwrap_or_default();
    get(&*state.store, project_id, mode, &first).await
}

/// One page of the project's invoices, newest first, with the total.
pub async fn list(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    document_status: Option<DocumentStatus>,
    collection_status: Option<CollectionStatus>,
    offset: usize,
    limit: usize,
) -> Result<(Vec<Invoice>, u64), StoreError> {
    let mut filters = Vec::new();
    if let Some(d) = document_status {
        filters.push(Cond::eq("document_status", d.as_str()));
    }
    if let Some(c) = collection_status {
        filters.push(Cond::eq("collection_status", c.as_str()));
    }
    let mut query = Query::partition(Invoice::list_partition(project_id, mode))
        .on(Index::Gsi1)
        .backward();
    if !filters.is_empty() {
        query = query.filter(Cond::And(filters));
    }
    page_of(store, &query, offset, limit).await
}

/// The write of `next` over `current`: the whole record, conditioned on
/// the version that was read (every change bumps it).
fn replace_op(current: &Invoice, next: &Invoice) -> Result<TxOp, StoreError> {
    Ok(TxOp::Put {
        item: next.item()?,
        cond: Some(Cond::eq("version", current.version)),
    })
}

/// `current` with `version` checked against what the caller sent.
fn check_version(current: &Invoice, sent: i64) -> Result<(), InvoiceError> {
    if current.version != sent {
        return Err(InvoiceError::VersionConflict {
            sent,
            current: current.version,
        });
    }
    Ok(())
}

fn require_state(current: &Invoice, want: DocumentStatus, what: &str) -> Result<(), InvoiceError> {
    if current.document_status != want {
        return Err(InvoiceError::StateConflict(format!(
            "{what} needs a {} invoice; this one is {}",
            want.as_str(),
            current.document_status.as_str()
        )));
    }
    Ok(())
}

/// Writes `next` over `current`; a lost race is a version conflict.
async fn replace(
    store: &dyn Store,
    current: &Invoice,
    next: Invoice,
    extra: Vec<TxOp>,
    what: &str,
) -> Result<Invoice, InvoiceError> {
    let mut ops = vec![replace_op(current, &next)?];
    ops.extend(extra);
    match store.transact(ops).await {
        Ok(()) => Ok(next),
        Err(e) if e.is_condition_failure() => {
            Err(lost_race(store, current, current.version, what).await)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why a write made against `current` (at `sent` version) did not land:
/// the invoice as it is now decides between a state and a version
/// conflict.
async fn lost_race(store: &dyn Store, current: &Invoice, sent: i64, what: &str) -> InvoiceError {
    match get(store, &current.project_id, current.mode, &current.id).await {
        Ok(now) if now.document_status != current.document_status => {
            InvoiceError::StateConflict(format!(
                "{what} needs a {} invoice; this one is now {}",
                current.document_status.as_str(),
                now.document_status.as_str()
            ))
        }
        Ok(now) if now.version != current.version => InvoiceError::VersionConflict {
            sent,
            current: now.version,
        },
        Ok(_) => InvoiceError::StateConflict(format!(
            "the invoice's checkout changed during {what}; read it again"
        )),
        Err(e) => e,
    }
}

/// Edits a draft (the keys sent change), at the version sent.
pub async fn patch(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    body: PatchInvoice,
) -> Result<Invoice, InvoiceError> {
    let current = get(&*state.store, project_id, mode, id).await?;
    require_state(&current, DocumentStatus::Draft, "editing")?;
    check_version(&current, body.version)?;
    let mut next = current.clone();
    if let Some(lines) = body.lines {
        next.lines = valid_lines(lines)?;
    }
    if let Some(due) = body.due_at {
        next.due_at = valid_due(&due)?;
    }
    if let Some(v) = body.customer_id {
        next.customer_id = text(v);
    }
    if let Some(v) = body.buyer {
        next.buyer = valid_buyer(v);
    }
    if let Some(v) = body.tax_rate_bps {
        next.tax_rate_bps = valid_tax(Some(v))?;
    }
    if let Some(v) = body.external_reference {
        next.external_reference = text(v);
    }
    if let Some(v) = body.note {
        next.note = text(v);
    }
    price(&mut next)?;
    next.version += 1;
    next.updated_at = state.clock.now();
    replace(&*state.store, &current, next, Vec::new(), "editing").await
}

fn counter_key(project_id: &str, mode: Mode) -> Key {
    keys::invoice_sequence(project_id, mode)
}

/// `PI-000042` live, `TEST-PI-000042` sandbox (6 digits, then as many as
/// needed).
pub fn number_text(mode: Mode, n: u64) -> String {
    let prefix = if mode.is_live() { "PI-" } else { "TEST-PI-" };
    format!("{prefix}{n:06}")
}

/// Issues a draft at the version sent: allocates the next number of the
/// project and mode in the same transaction, copies the seller profile,
/// and freezes the document. A finalize that lost the counter to another
/// re-reads it and tries again; one that lost the invoice gets
/// `VersionConflict` and changes nothing.
pub async fn finalize(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    version: i64,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    let store = &*state.store;
    let seller = account::get_project(store, project_id)
        .await?
        .and_then(|p| p.seller);
    let ckey = counter_key(project_id, mode);
    let started = std::time::Instant::now();
    for attempt in 0..FINALIZE_TRIES {
        if started.elapsed() > FINALIZE_BUDGET {
            break;
        }
        let current = get(store, project_id, mode, id).await?;
        if current.document_status != DocumentStatus::Draft {
            if let Some(f) = fence {
                // A retry of a finalize whose answer was lost.
                if f.resource_id(store).await?.as_deref() == Some(id) {
                    return Ok(current);
                }
            }
        }
        require_state(&current, DocumentStatus::Draft, "finalize")?;
        check_version(&current, version)?;
        let last: u64 = match store.get(&ckey).await? {
            Some(item) => item.get("value").and_then(Value::as_u64).unwrap_or(0),
            None => 0,
        };
        let n = last + 1;
        let now = state.clock.now();
        let mut next = current.clone();
        next.document_status = DocumentStatus::Issued;
        next.invoice_number = Some(number_text(mode, n));
        next.issued_at = Some(now);
        next.seller = seller.clone();
        next.version += 1;
        next.updated_at = now;
        next.collection_status = next.collection();
        let counter_cond = if last == 0 {
            Cond::Or(vec![
                Cond::AttrNotExists("value".into()),
                Cond::eq("value", 0),
            ])
        } else {
            Cond::eq("value", last)
        };
        let mut ops = vec![
            TxOp::Update {
                key: Invoice::key(id),
                update: Update::new()
                    .set("document_status", "issued")
                    .set("invoice_number", json!(next.invoice_number))
                    .set("issued_at", json!(now))
                    .set("seller", json!(next.seller))
                    .set("version", next.version)
                    .set("updated_at", json!(now))
                    .set("collection_status", next.collection_status.as_str()),
                cond: Some(Cond::And(vec![
                    Cond::eq("version", current.version),
                    Cond::eq("document_status", "draft"),
                ])),
            },
            TxOp::Update {
                key: ckey.clone(),
                update: Update::new().set("value", n),
                cond: Some(counter_cond),
            },
        ];
        if let Some(f) = fence {
            ops.push(f.op(id));
        }
        match store.transact(ops).await {
            Ok(()) => return Ok(next),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let failed = |i: usize| matches!(reasons.get(i), Some(TxReason::ConditionFailed));
                if failed(2) {
                    // This very request finalized it already (its answer
                    // was lost).
                    let first = fence.map(|f| f.resource_id(store));
                    let first = match first {
                        Some(r) => r.await?,
                        None => None,
                    };
                    if first.as_deref() == Some(id) {
                        return get(store, project_id, mode, id).await;
                    }
                    return Err(InvoiceError::StateConflict(
                        "this Idempotency-Key was used for another request".into(),
                    ));
                }
                if failed(0) {
                    let now_current = get(store, project_id, mode, id).await?;
                    require_state(&now_current, DocumentStatus::Draft, "finalize")?;
                    return Err(InvoiceError::VersionConflict {
                        sent: version,
                        current: now_current.version,
                    });
                }
                // The counter moved (or a write conflict): read it again,
                // after a pause that grows with the contention.
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(InvoiceError::Store(StoreError::Unavailable(
        "invoice numbering is busy; retry".into(),
    )))
}

/// Deletes a draft. With the request's fence, a retry after a lost answer
/// answers the same.
pub async fn discard(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    fence: Option<&Fence>,
) -> Result<Invoice, InvoiceError> {
    let current = match get(&*state.store, project_id, mode, id).await {
        Ok(c) => c,
        Err(InvoiceError::NotFound(_)) => {
            if let Some(f) = fence {
                if f.resource_id(&*state.store).await?.as_deref() == Some(id) {
                    // This very request discarded it (its answer was lost).
                    return Err(InvoiceError::AlreadyDiscarded);
                }
            }
            return Err(InvoiceError::NotFound(id.to_owned()));
        }
        Err(e) => return Err(e),
    };
    require_state(&current, DocumentStatus::Draft, "discard")?;
    let mut ops = vec![TxOp::Delete {
        key: Invoice::key(id),
        cond: Some(Cond::And(vec![
            Cond::eq("document_status", "draft"),
            Cond::eq("version", current.version),
        ])),
    }];
    if let Some(f) = fence {
        ops.push(f.op(id));
    }
    match state.store.transact(ops).await {
        Ok(()) => Ok(current),
        Err(e) if e.is_condition_failure() => Err(InvoiceError::StateConflict(
            "the draft changed while being discarded; read it again".into(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The invoice's current checkout session, and the payment of its latest
/// attempt, as they are now.
struct CurrentCheckout {
    session: CheckoutSession,
    payment: Option<Payment>,
}

async fn current_checkout(
    store: &dyn Store,
    inv: &Invoice,
) -> Result<Option<CurrentCheckout>, StoreError> {
    let Some(sid) = &inv.checkout_session_id else {
        return Ok(None);
    };
    let Some(item) = store.get(&CheckoutSession::key(sid)).await? else {
        return Ok(None);
    };
    let session: CheckoutSession = from_item(item)?;
    let payment = match &session.payment_id {
        Some(pid) => payments::get(store, pid).await?,
        None => None,
    };
    Ok(Some(CurrentCheckout { session, payment }))
}

/// Whether a payment may still bring money (a cancelled one is watched for
/// a late success until its re-check ends).
fn payment_active(p: &Payment, now: Timestamp) -> bool {
    match p.status {
        PaymentStatus::Pending | PaymentStatus::Processing | PaymentStatus::Success => true,
        PaymentStatus::Cancelled => p.checks.recheck_until.is_some_and(|t| t > now),
        PaymentStatus::Failed | PaymentStatus::Refunded => false,
    }
}

/// Why the invoice's checkout stops a change that needs it closed, if it
/// does: an attempt in progress, a payment, or a payment that may still
/// succeed.
fn checkout_activity(c: &CurrentCheckout, now: Timestamp) -> Option<String> {
    let s = &c.session;
    if matches!(s.status, SessionStatus::Initiated | SessionStatus::Success) {
        return Some(format!(
            "checkout {} has a payment in progress or paid",
            s.id
        ));
    }
    if c.payment.as_ref().is_some_and(|p| payment_active(p, now)) {
        return Some(format!(
            "checkout {} has a payment that may still succeed",
            s.id
        ));
    }
    None
}

/// The write that closes the checkout as read: a pending session is
/// expired (only if nobody started an attempt meanwhile); any other is
/// checked to still be what it was.
fn close_checkout_op(s: &CheckoutSession, now: Timestamp, tally: &mut Tally) -> TxOp {
    let attempt_as_read = match &s.payment_id {
        Some(p) => Cond::eq("payment_id", p.clone()),
        // Null or missing: "not a string" covers both on both backends.
        None => Cond::Not(Box::new(Cond::ge("payment_id", ""))),
    };
    if s.status_at(now) == SessionStatus::Pending {
        tally.session_moved(s, SessionStatus::Pending, SessionStatus::Expired);
        TxOp::Update {
            key: CheckoutSession::key(&s.id),
            update: Update::new()
                .set("status", "expired")
                .set("updated_at", json!(now))
                .unindex(Index::Gsi2),
            cond: Some(Cond::And(vec![
                Cond::eq("status", "pending"),
                attempt_as_read,
            ])),
        }
    } else {
        TxOp::Check {
            key: CheckoutSession::key(&s.id),
            cond: Cond::And(vec![Cond::eq("status", s.status.as_str()), attempt_as_read]),
        }
    }
}

/// Why an issued invoice cannot be corrected (spec: any receipt,
/// allocated or excess amount, unlinked payment activity or
/// payment-related attention), if it cannot.
fn correction_blocker(
    inv: &Invoice,
    checkout: Option<&CurrentCheckout>,
    now: Timestamp,
) -> Option<String> {
    if inv.amount_paid > 0 || !inv.allocations.is_empty() {
        return Some("a payment has been received for this invoice".into());
    }
    if inv.amount_excess > 0 {
        return Some("the invoice holds an excess payment".into());
    }
    if inv.needs_attention {
        return Some("the invoice needs attention for a payment".into());
    }
    checkout
        .and_then(|c| checkout_activity(c, now))
        .map(|why| format!("{why}; use an adjustment instead"))
}

/// Voids an issued, unpaid invoice and creates its replacement draft (a
/// copy of its lines and terms), in one transaction. Its open checkout, if
/// any, is expired in the same transaction, so nobody pays a void invoice.
pub async fn correct(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    body: CorrectInvoice,
) -> Result<(Invoice, Invoice), InvoiceError> {
    let reason =
        text(Some(body.reason)).ok_or_else(|| invalid("reason", "reason must not be empty"))?;
    let store = &*state.store;
    let current = get(store, project_id, mode, id).await?;
    require_state(&current, DocumentStatus::Issued, "correct")?;
    let now = state.clock.now();
    let checkout = current_checkout(store, &current).await?;
    if let Some(why) = correction_blocker(&current, checkout.as_ref(), now) {
        return Err(InvoiceError::NotCorrectable(format!(
            "this invoice cannot be corrected: {why}"
        )));
    }
    let mut replacement = current.clone();
    replacement.id = ids::new_id(IdKind::Invoice);
    replacement.version = 1;
    replacement.invoice_number = None;
    replacement.document_status = DocumentStatus::Draft;
    replacement.collection_status = CollectionStatus::Unpaid;
    replacement.seller = None;
    replacement.issued_at = None;
    replacement.created_at = now;
    replacement.updated_at = now;
    replacement.amount_adjusted = 0;
    replacement.adjustments = Vec::new();
    replacement.checkout_session_id = None;
    replacement.correction_of_invoice_id = Some(current.id.clone());
    replacement.corrected_by_invoice_id = None;
    replacement.voided_at = None;
    replacement.void_reason = None;

    let mut voided = current.clone();
    voided.document_status = DocumentStatus::Void;
    voided.voided_at = Some(now);
    voided.void_reason = Some(reason);
    voided.corrected_by_invoice_id = Some(replacement.id.clone());
    voided.version += 1;
    voided.updated_at = now;
    voided.collection_status = voided.collection();

    let mut ops = vec![
        TxOp::Put {
            item: voided.item()?,
            // The version covers everything the blocker read (payments
            // and checkouts bump it).
            cond: Some(Cond::And(vec![
                Cond::eq("version", current.version),
                Cond::eq("document_status", "issued"),
            ])),
        },
        TxOp::Put {
            item: replacement.item()?,
            cond: Some(Cond::NotExists),
        },
    ];
    if let Some(c) = &checkout {
        let mut tally = Tally::new();
        ops.push(close_checkout_op(&c.session, now, &mut tally));
        tally.apply_to(&mut ops)?;
    }
    match store.transact(ops).await {
        Ok(()) => Ok((voided, replacement)),
        Err(e) if e.is_condition_failure() => {
            Err(lost_race(store, &current, current.version, "correct").await)
        }
        Err(e) => Err(e.into()),
    }
}

/// Records a collection adjustment on an issued invoice: adds to
/// `amount_adjusted` (at most the remaining balance), at the version sent.
/// An open checkout is for the old balance: it is expired in the same
/// transaction (a new checkout collects the new one); with an attempt in
/// progress the adjustment waits (409).
pub async fn adjust(
    state: &Deps,
    project_id: &str,
    mode: Mode,
    id: &str,
    body: AdjustInvoice,
) -> Result<Invoice, InvoiceError> {
    let reason =
        text(Some(body.reason)).ok_or_else(|| invalid("reason", "reason must not be empty"))?;
    let store = &*state.store;
    let current = get(store, project_id, mode, id).await?;
    require_state(&current, DocumentStatus::Issued, "an adjustment")?;
    check_version(&current, body.version)?;
    let remaining = current.amount_remaining();
    if body.amount < 1 || body.amount > remaining {
        return Err(invalid(
            "amount",
            format!("amount must be 1 to the remaining balance ({remaining} paisa)"),
        ));
    }
    let now = state.clock.now();
    let checkout = current_checkout(store, &current).await?;
    let mut extra = Vec::new();
    if let Some(c) = &checkout {
        if c.session.status_at(now) == SessionStatus::Initiated {
            return Err(InvoiceError::StateConflict(format!(
                "checkout {} has a payment in progress; adjust once it has finished",
                c.session.id
            )));
        }
        let mut tally = Tally::new();
        extra.push(close_checkout_op(&c.session, now, &mut tally));
        tally.apply_to(&mut extra)?;
    }
    let mut next = current.clone();
    next.amount_adjusted += body.amount;
    next.adjustments.push(Adjustment {
        amount: body.amount,
        reason,
        at: now,
    });
    next.version += 1;
    next.updated_at = now;
    next.collection_status = next.collection();
    replace(store, &current, next, extra, "an adjustment").await
}

/// What `POST /v1/invoices/{id}/checkout` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InvoiceCheckoutView {
    pub checkout_session_id: String,
    pub checkout_url: String,
    pub reused: bool,
}

/// Opens (or reuses) a checkout for what is left to collect on an issued
/// invoice. The open session of the invoice is reused when it is for the
/// current balance and the provider asked for; otherwise it is expired in
/// the transaction that opens the new one (one open checkout per invoice),
/// unless an attempt is in progress on it (409). Opening a checkout is a
/// change of the invoice: its `version` goes up.
pub async fn checkout(
    state: &Deps,
    payer: &checkout::Creator,
    id: &str,
    body: InvoiceCheckout,
    base: &str,
    fence: Option<&Fence>,
) -> Result<(CheckoutSession, bool), InvoiceError> {
    let store = &*state.store;
    let (project_id, mode) = (payer.project_id.as_str(), payer.mode);
    if let Some(p) = body.provider {
        let enabled = checkout::providers(store, project_id, mode).await?;
        if !enabled.iter().any(|x| x.provider == p && x.enabled) {
            return Err(InvoiceError::Checkout(
                checkout::CheckoutError::ProviderUnavailable(p),
            ));
        }
    }
    for attempt in 0..8 {
        let inv = get(store, project_id, mode, id).await?;
        require_state(&inv, DocumentStatus::Issued, "a checkout")?;
        let remaining = inv.amount_remaining();
        if remaining <= 0 {
            return Err(InvoiceError::StateConflict(
                "nothing is left to collect on this invoice".into(),
            ));
        }
        let now = state.clock.now();
        let previous = current_checkout(store, &inv).await?;
        if let Some(c) = &previous {
            let s = &c.session;
            let status = s.status_at(now);
            let open = matches!(status, SessionStatus::Pending | SessionStatus::Initiated);
            let same_provider = body.provider.is_none() || body.provider == s.provider;
            if open && s.amount.get() == remaining && same_provider {
                return Ok((s.clone(), true));
            }
            if status == SessionStatus::Initiated {
                return Err(InvoiceError::StateConflict(format!(
                    "checkout {} has a payment in progress; wait for it to finish",
                    s.id
                )));
            }
        }
        let amount = checkout::check_amount(remaining, body.provider, mode)
            .map_err(InvoiceError::Checkout)?;
        let number = inv.invoice_number.clone().unwrap_or_default();
        let mut metadata = serde_json::Map::new();
        metadata.insert("invoice_id".into(), json!(inv.id));
        metadata.insert("invoice_number".into(), json!(number));
        let buyer = inv.buyer.clone().unwrap_or_default();
        let valid = checkout::ValidCheckout {
            amount,
            return_url: String::new(),
            cancel_url: None,
            provider: body.provider,
            flow: checkout::Flow::Hosted,
            description: Some(format!("Invoice {number}")),
            metadata,
            // Only what the checkout's own rules take: a longer name is
            // cut, a phone in another shape left out.
            customer_name: buyer
                .name
                .map(|n| n.chars().take(PersonName::MAX).collect()),
            customer_email: buyer.email,
            customer_phone: buyer.phone.filter(|p| Phone::parse(p.clone()).is_ok()),
            customer_address: None,
            collect_address: false,
        };
        // A new checkout is volume the calling key creates: charged to its
        // spend counter like POST /v1/checkout (a reused one is not).
        let spend = checkout::spend_op(payer, amount.get(), now).map_err(InvoiceError::Checkout)?;
        let mut session = checkout::new_session(payer, valid, now);
        session.return_url = format!("{base}/c/{}", session.id);
        session.invoice_id = Some(inv.id.clone());
        let mut ops = vec![
            TxOp::Put {
                item: session.item()?,
                cond: Some(Cond::NotExists),
            },
            TxOp::Update {
                key: Invoice::key(&inv.id),
                update: Update::new()
                    .set("checkout_session_id", session.id.clone())
                    .set("version", inv.version + 1)
                    .set("updated_at", json!(now)),
                cond: Some(Cond::And(vec![
                    Cond::eq("version", inv.version),
                    Cond::eq("document_status", "issued"),
                ])),
            },
        ];
        if let Some(f) = fence {
            ops.push(f.op(&session.id));
        }
        let mut tally = super::analytics::Tally::new();
        if let Some(c) = &previous {
            ops.push(close_checkout_op(&c.session, now, &mut tally));
        }
        let spend_at = spend.map(|op| {
            ops.push(op);
            ops.len() - 1
        });
        // The day's counters, in the same transaction (last: the fence's
        // index above is read on failure).
        tally.session_created(&session);
        tally.apply_to(&mut ops)?;
        super::active::touch(store, project_id, mode, now).await?;
        match store.transact(ops).await {
            Ok(()) => return Ok((session, false)),
            Err(StoreError::TransactionCanceled { reasons })
                if fence.is_some() && matches!(reasons.get(2), Some(TxReason::ConditionFailed)) =>
            {
                // This very request opened a checkout already (its answer
                // was lost): answer that one.
                let sid = match fence {
                    Some(f) => f.resource_id(store).await?.unwrap_or_default(),
                    None => String::new(),
                };
                let s = store
                    .get(&CheckoutSession::key(&sid))
                    .await?
                    .map(from_item::<CheckoutSession>)
                    .transpose()?
                    .filter(|s| s.invoice_id.as_deref() == Some(id))
                    .ok_or_else(|| InvoiceError::NotFound(id.to_owned()))?;
                return Ok((s, false));
            }
            Err(e) if spend_at.is_some_and(|i| checkout::failed_at(&e, i)) => {
                return Err(InvoiceError::Checkout(
                    checkout::CheckoutError::SpendCapExceeded {
                        cap: payer.spend_cap_paisa.unwrap_or_default(),
                    },
                ));
            }
            Err(e)
                if e.is_condition_failure()
                    || matches!(e, StoreError::TransactionCanceled { .. }) =>
            {
                // The invoice or its checkout moved (another checkout, a
                // payment, an adjustment): read both again.
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(InvoiceError::Store(StoreError::Unavailable(
        "the invoice kept changing; retry".into(),
    )))
}

// ------------------------------------------------------------ collection

/// The writes that allocate a succeeded `payment_id` of `amount` to the
/// invoice as read: to `amount_paid` up to the collectible balance, the
/// rest to `amount_excess` with `needs_attention`; `invoice.paid` when the
/// invoice becomes paid. Nothing when the payment is already allocated.
/// The invoice write is conditioned on the version read (the settlement
/// re-reads and retries on conflict).
pub fn allocation_ops(
    inv: &Invoice,
    payment_id: &str,
    amount: i64,
    now: Timestamp,
) -> Result<Vec<TxOp>, StoreError> {
    if inv.allocations.iter().any(|a| a.payment_id == payment_id) {
        return Ok(Vec::new());
    }
    let collectible = if inv.document_status == DocumentStatus::Issued {
        inv.amount_remaining()
    } else {
        0
    };
    let paid = amount.min(collectible).max(0);
    let excess = amount - paid;
    let mut next = inv.clone();
    next.amount_paid += paid;
    next.amount_excess += excess;
    next.needs_attention |= excess > 0;
    next.allocations.push(Allocation {
        payment_id: payment_id.to_owned(),
        amount,
        excess,
        at: now,
    });
    next.version += 1;
    next.updated_at = now;
    next.collection_status = next.collection();
    if excess > 0 {
        tracing::warn!(
            invoice = %inv.id,
            payment = %payment_id,
            excess,
            "payment beyond the invoice's balance: recorded as excess, needs attention"
        );
    }
    let mut ops = vec![TxOp::Put {
        item: next.item()?,
        cond: Some(Cond::eq("version", inv.version)),
    }];
    // Paid: the payment took the balance to zero (also after adjustments).
    if inv.document_status == DocumentStatus::Issued && collectible > 0 && paid == collectible {
        let mut view = serde_json::to_value(InvoiceView::at(&next, now))
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        if let Some(o) = view.as_object_mut() {
            // The payment that settled it (the delivery log's `paymentId`).
            o.insert("payment_id".into(), json!(payment_id));
        }
        ops.push(
            Event::new(EventType::InvoicePaid, &inv.project_id, inv.mode, view, now).put_op()?,
        );
    }
    Ok(ops)
}

// -------------------------------------------------------------------- pdf

/// The PDF of an issued or void invoice: the stored file of its current
/// version, rendered and stored first when missing.
pub async fn pdf(state: &Deps, inv: &Invoice) -> Result<Vec<u8>, InvoiceError> {
    if inv.document_status == DocumentStatus::Draft {
        return Err(InvoiceError::StateConflict(
            "a draft has no PDF; finalize it first".into(),
        ));
    }
    let key = inv.pdf_key();
    match state.blobs.get(&key).await {
        Ok(Some(blob)) => return Ok(blob.bytes.to_vec()),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(invoice = %inv.id, error = %e, "stored PDF unreadable; rendering it again")
        }
    }
    let bytes = render_pdf(inv)?;
    if let Err(e) = state
        .blobs
        .put(&key, bytes::Bytes::from(bytes.clone()), "application/pdf")
        .await
    {
        tracing::warn!(invoice = %inv.id, error = %e, "could not store the PDF; it is rendered again next time");
    }
    Ok(bytes)
}

/// Renders and stores the PDF of `inv` (after finalize or a void); a
/// failure is logged, the PDF is then rendered on first request.
pub async fn store_pdf(state: &Deps, inv: &Invoice) {
    // Bounded: the change it follows has committed; a slow blob store must
    // not turn its answer into a timeout.
    match tokio::time::timeout(std::time::Duration::from_secs(3), pdf(state, inv)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(invoice = %inv.id, error = %e, "could not render the PDF now; it is rendered on request")
        }
        Err(_) => {
            tracing::warn!(invoice = %inv.id, "storing the PDF took too long; it is rendered on request")
        }
    }
}

fn render_pdf(inv: &Invoice) -> Result<Vec<u8>, InvoiceError> {
    use crate::pdf::{PdfBuyer, PdfInvoice, PdfLine, PdfSeller, render};
    let doc = PdfInvoice {
        invoice_number: inv.invoice_number.clone(),
        document_status: inv.document_status.as_str().to_owned(),
        livemode: inv.mode.is_live(),
        seller: inv.seller.as_ref().map(|s| PdfSeller {
            name: s.name.clone(),
            legal_name: s.legal_name.clone(),
            email: s.email.clone(),
            logo_url: s.logo_url.clone(),
            brand_color: s.brand_color.clone(),
        }),
        buyer: inv.buyer.as_ref().map(|b| PdfBuyer {
            name: b.name.clone(),
            email: b.email.clone(),
            phone: b.phone.clone(),
            address: b.address.clone(),
        }),
        issued_at: inv.issued_at.map(|t| t.to_rfc3339()),
        due_at: inv.due_at.to_rfc3339(),
        created_at: inv.created_at.to_rfc3339(),
        lines: inv
            .lines
            .iter()
            .map(|l| PdfLine {
                description: l.description.clone(),
                quantity: l.quantity.clone(),
                unit_amount: l.unit_amount,
                line_total: l.line_total,
            })
            .collect(),
        subtotal: inv.subtotal,
        tax_rate_bps: inv.tax_rate_bps,
        tax_total: inv.tax_total,
        total_amount: inv.total_amount,
        amount_paid: inv.amount_paid,
        amount_adjusted: inv.amount_adjusted,
        amount_remaining: inv.amount_remaining(),
        note: inv.note.clone(),
        external_reference: inv.external_reference.clone(),
        void_reason: inv.void_reason.clone(),
    };
    render(&doc).map_err(|e| {
        InvoiceError::Store(StoreError::Backend(format!("invoice {} PDF: {e}", inv.id)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn quantities_are_decimal_text_with_at_most_three_decimals() {
        for (text, thousandths, canonical) in [
            ("1", 1000, "1"),
            ("1.5", 1500, "1.5"),
            ("0.001", 1, "0.001"),
            ("002.250", 2250, "2.25"),
            ("1000000", 1_000_000_000, "1000000"),
            ("0.5", 500, "0.5"),
        ] {
            let got = q(text);
            assert_eq!(got.thousandths(), thousandths, "{text}");
            assert_eq!(got.text(), canonical, "{text}");
        }
        for bad in [
            "",
            "0",
            "0.000",
            "-1",
            "+1",
            "1.",
            ".5",
            "1.2345",
            "1e3",
            "1,5",
            " 1",
            "abc",
            "1000001",
            "99999999999999999999999",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn line_totals_round_half_up() {
        for (qty, unit, total) in [
            ("1", 10_000, 10_000),
            ("1.5", 333, 500),   // 499.5 -> 500
            ("0.5", 1, 1),       // 0.5 -> 1
            ("0.499", 1, 0),     // 0.499 -> 0
            ("0.001", 499, 0),   // 0.499 -> 0
            ("0.001", 500, 1),   // 0.5 -> 1
            ("2.333", 300, 700), // 699.9 -> 700
            ("3", 0, 0),
            ("1000000", MAX_UNIT_AMOUNT, 100_000_000_000_000_000),
        ] {
            assert_eq!(line_total(q(qty), unit), total, "{qty} x {unit}");
        }
    }

    #[test]
    fn tax_rounds_half_up_on_the_subtotal() {
        for (subtotal, bps, tax) in [
            (10_000, 1300, 1300),
            (1, 5000, 1),    // 0.5 -> 1
            (1, 4999, 0),    // 0.4999 -> 0
            (333, 1300, 43), // 43.29 -> 43
            (335, 1300, 44), // 43.55 -> 44
            (12_345, 0, 0),
            (12_345, 10_000, 12_345),
        ] {
            assert_eq!(tax_total(subtotal, bps), tax, "{subtotal} @ {bps}");
        }
    }

    fn body(lines: serde_json::Value) -> CreateInvoice {
        serde_json::from_value(json!({
            "lines": lines,
            "dueAt": "2026-12-31T18:15:00+05:45",
            "taxRateBps": 1300,
        }))
        .unwrap()
    }

    #[test]
    fn a_draft_is_priced_from_its_lines() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let inv = new_draft(
            "proj_1",
            Mode::Sandbox,
            body(json!([
                {"description": "Tea, 1 kg", "quantity": "2.5", "unitAmount": 120_000},
                {"description": "Delivery", "quantity": "1", "unitAmount": 15_050},
            ])),
            now,
        )
        .unwrap();
        assert_eq!(inv.lines[0].line_total, 300_000);
        assert_eq!(inv.lines[0].id, "il_001");
        assert_eq!(inv.subtotal, 315_050);
        assert_eq!(inv.tax_total, 40_957); // 40956.5 -> 40957
        assert_eq!(inv.total_amount, 356_007);
        assert_eq!(inv.amount_remaining(), 356_007);
        assert_eq!(inv.collection(), CollectionStatus::Unpaid);
        assert!(!inv.overdue(now));
    }

    #[test]
    fn invalid_bodies_name_their_field() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let field_of = |b: CreateInvoice| match new_draft("p", Mode::Sandbox, b, now) {
            Err(InvoiceError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field_of(body(json!([]))), "lines");
        let many: Vec<_> = (0..101)
            .map(|_| json!({"description": "x", "quantity": "1", "unitAmount": 1}))
            .collect();
        assert_eq!(field_of(body(json!(many))), "lines");
        assert_eq!(
            field_of(body(
                json!([{"description": "x", "quantity": "1.2345", "unitAmount": 1}])
            )),
            "lines[0].quantity"
        );
        assert_eq!(
            field_of(body(
                json!([{"description": "x", "quantity": "1", "unitAmount": -1}])
            )),
            "lines[0].unitAmount"
        );
        assert_eq!(
            field_of(body(
                json!([{"description": "  ", "quantity": "1", "unitAmount": 1}])
            )),
            "lines[0].description"
        );
        let mut b = body(json!([{"description": "x", "quantity": "1", "unitAmount": 1}]));
        b.tax_rate_bps = Some(10_001);
        assert_eq!(field_of(b), "taxRateBps");
        let mut b = body(json!([{"description": "x", "quantity": "1", "unitAmount": 1}]));
        b.due_at = "tomorrow".into();
        assert_eq!(field_of(b), "dueAt");
        // The field rules live in the field types: parsing stops at the
        // field, by its path.
        for (buyer, field) in [
            (json!({"email": "not-an-email"}), "buyer.email"),
            (json!({"email": ""}), "buyer.email"),
            (
                json!({"name": "n".repeat(InvoiceText::MAX + 1)}),
                "buyer.name",
            ),
            (json!({"name": "a\nb"}), "buyer.name"),
            (json!({"address": "Thamel\nKathmandu"}), ""),
        ] {
            let v = json!({"lines": [{"description": "x", "quantity": "1", "unitAmount": 1}],
                           "dueAt": "2026-12-31T00:00:00Z", "buyer": buyer});
            let r: Result<CreateInvoice, _> = serde_path_to_error::deserialize(v);
            let at = r.err().map(|e| e.path().to_string()).unwrap_or_default();
            assert_eq!(at, field);
        }
        // Unknown properties: refused by the types.
        assert!(
            serde_json::from_value::<CreateInvoice>(json!({
                "lines": [], "dueAt": "2026-12-31T00:00:00Z", "colour": "red"
            }))
            .is_err()
        );
        assert!(serde_json::from_value::<Buyer>(json!({"name": "A", "vat": "1"})).is_err());
        assert!(
            serde_json::from_value::<LineInput>(
                json!({"description": "x", "quantity": "1", "unitAmount": 1, "lineTotal": 1})
            )
            .is_err()
        );
        // Quantity must be text, unitAmount an integer.
        assert!(
            serde_json::from_value::<LineInput>(
                json!({"description": "x", "quantity": 1, "unitAmount": 1})
            )
            .is_err()
        );
        assert!(
            serde_json::from_value::<LineInput>(
                json!({"description": "x", "quantity": "1", "unitAmount": 1.5})
            )
            .is_err()
        );
    }

    #[test]
    fn collection_status_follows_the_amounts() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let mut inv = new_draft(
            "p",
            Mode::Live,
            body(json!([{"description": "x", "quantity": "1", "unitAmount": 10_000}])),
            now,
        )
        .unwrap();
        inv.tax_rate_bps = 0;
        price(&mut inv).unwrap();
        inv.document_status = DocumentStatus::Issued;
        assert_eq!(inv.collection(), CollectionStatus::Unpaid);
        inv.amount_paid = 4_000;
        assert_eq!(inv.collection(), CollectionStatus::PartPaid);
        assert_eq!(inv.amount_remaining(), 6_000);
        inv.amount_paid = 10_000;
        assert_eq!(inv.collection(), CollectionStatus::Paid);
        inv.amount_paid = 4_000;
        inv.amount_adjusted = 6_000;
        assert_eq!(inv.collection(), CollectionStatus::ClosedAdjusted);
        assert_eq!(inv.amount_remaining(), 0);
        inv.amount_paid = 0;
        inv.amount_adjusted = 10_000;
        assert_eq!(inv.collection(), CollectionStatus::ClosedAdjusted);
        // Overdue: issued, something left, past due.
        inv.amount_adjusted = 0;
        let after_due = inv.due_at.plus(chrono::Duration::seconds(1));
        assert!(inv.overdue(after_due));
        assert!(!inv.overdue(inv.due_at));
        inv.amount_paid = 10_000;
        assert!(!inv.overdue(after_due));
    }

    #[test]
    fn allocation_fills_the_balance_then_the_excess() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let mut inv = new_draft(
            "p",
            Mode::Sandbox,
            body(json!([{"description": "x", "quantity": "1", "unitAmount": 10_000}])),
            now,
        )
        .unwrap();
        inv.tax_rate_bps = 0;
        price(&mut inv).unwrap();
        inv.document_status = DocumentStatus::Issued;
        inv.amount_paid = 6_000;
        inv.allocations.push(Allocation {
            payment_id: "pay_a".into(),
            amount: 6_000,
            excess: 0,
            at: now,
        });
        let ops = allocation_ops(&inv, "pay_b", 5_000, now).unwrap();
        assert_eq!(ops.len(), 2, "the invoice and invoice.paid");
        let TxOp::Put { item, .. } = &ops[0] else {
            panic!("{ops:?}")
        };
        let next: Invoice = from_item(item.clone()).unwrap();
        assert_eq!((next.amount_paid, next.amount_excess), (10_000, 1_000));
        assert!(next.needs_attention);
        assert_eq!(next.collection(), CollectionStatus::Paid);
        // The same payment again: nothing.
        assert!(
            allocation_ops(&next, "pay_b", 5_000, now)
                .unwrap()
                .is_empty()
        );
        // A payment for a void invoice is all excess.
        let mut void = inv.clone();
        void.document_status = DocumentStatus::Void;
        let ops = allocation_ops(&void, "pay_c", 2_000, now).unwrap();
        let TxOp::Put { item, .. } = &ops[0] else {
            panic!("{ops:?}")
        };
        let next: Invoice = from_item(item.clone()).unwrap();
        assert_eq!((next.amount_paid, next.amount_excess), (6_000, 2_000));
        assert_eq!(ops.len(), 1);
    }

    #[test]
    fn numbers_are_prefixed_and_padded() {
        assert_eq!(number_text(Mode::Live, 1), "PI-000001");
        assert_eq!(number_text(Mode::Sandbox, 42), "TEST-PI-000042");
        assert_eq!(number_text(Mode::Live, 1_234_567), "PI-1234567");
    }

    mod numbering {
        use crate::AppState;
        use std::sync::Arc;

        use super::*;
        use crate::Config;
        use crate::store::embedded::EmbeddedStore;
        use crate::time::{Clock, SystemClock};

        fn state() -> AppState {
            AppState::new(
                Arc::new(EmbeddedStore::in_memory().unwrap()),
                Arc::new(SystemClock),
                Config {
                    public_base_url: "http://127.0.0.1:8080".into(),
                },
            )
        }

        async fn draft(state: &Deps) -> Invoice {
            let b =
                super::body(json!([{"description": "x", "quantity": "1", "unitAmount": 100_000}]));
            create(state, "proj_1", Mode::Sandbox, b, None)
                .await
                .unwrap()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_finalizes_take_every_number_once() {
            let state = state();
            let mut drafts = Vec::new();
            for _ in 0..40 {
                drafts.push(draft(&state).await);
            }
            let runs = drafts.into_iter().map(|d| {
                let state = state.clone();
                tokio::spawn(async move {
                    finalize(&state, "proj_1", Mode::Sandbox, &d.id, d.version, None).await
                })
            });
            let mut numbers: Vec<String> = futures::future::join_all(runs)
                .await
                .into_iter()
                .map(|r| r.unwrap().unwrap().invoice_number.unwrap())
                .collect();
            numbers.sort();
            let want: Vec<String> = (1..=40).map(|n| number_text(Mode::Sandbox, n)).collect();
            assert_eq!(numbers, want);
            // Another mode counts on its own.
            let b = super::body(json!([{"description": "x", "quantity": "1", "unitAmount": 100}]));
            let mut live_state = state.clone();
            live_state.clock = Arc::new(SystemClock);
            let live = new_draft("proj_1", Mode::Live, b, SystemClock.now()).unwrap();
            live_state
                .store
                .put(live.item().unwrap(), None)
                .await
                .unwrap();
            let issued = finalize(&live_state, "proj_1", Mode::Live, &live.id, 1, None)
                .await
                .unwrap();
            assert_eq!(issued.invoice_number.as_deref(), Some("PI-000001"));
        }

        async fn issued(state: &Deps) -> Invoice {
            let d = draft(state).await;
            finalize(state, "proj_1", Mode::Sandbox, &d.id, d.version, None)
                .await
                .unwrap()
        }

        async fn session(state: &Deps, id: &str) -> CheckoutSession {
            from_item(
                state
                    .store
                    .get(&CheckoutSession::key(id))
                    .await
                    .unwrap()
                    .unwrap(),
            )
            .unwrap()
        }

        #[tokio::test]
        async fn one_open_checkout_per_invoice_and_correct_closes_it() {
            let state = state();
            let inv = issued(&state).await;
            let base = "http://127.0.0.1:8080";
            let body = |p: Option<crate::domain::Provider>| InvoiceCheckout { provider: p };
            let (a, reused) = checkout(&state, &payer(), &inv.id, body(None), base, None)
                .await
                .unwrap();
            assert!(!reused);
            assert_eq!(a.amount.get(), inv.total_amount);
            assert_eq!(a.invoice_id.as_deref(), Some(inv.id.as_str()));
            let (again, reused) = checkout(&state, &payer(), &inv.id, body(None), base, None)
                .await
                .unwrap();
            assert!(reused);
            assert_eq!(again.id, a.id);
            // Another provider: a new session, and the old one is closed.
            let (b, reused) = checkout(
                &state,
                &payer(),
                &inv.id,
                body(Some(crate::domain::Provider::Khalti)),
                base,
                None,
            )
            .await
            .unwrap();
            assert!(!reused);
            assert_ne!(b.id, a.id);
            // Each new session counted once on its day (the reused one not
            // again).
            let counted = crate::domain::analytics::day_totals(
                &*state.store,
                "proj_1",
                Mode::Sandbox,
                a.created_at,
            )
            .await
            .unwrap();
            assert_eq!(counted.get("sessions_created"), Some(&2));
            assert_eq!(session(&state, &a.id).await.status, SessionStatus::Expired);
            // The invoice moved on: a write at the old version conflicts.
            let now_inv = get(&*state.store, "proj_1", Mode::Sandbox, &inv.id)
                .await
                .unwrap();
            assert_eq!(now_inv.version, inv.version + 2);
            // Correct an invoice with a fresh pending checkout: allowed, and
            // the checkout is expired with it.
            let (voided, replacement) = correct(
                &state,
                "proj_1",
                Mode::Sandbox,
                &inv.id,
                CorrectInvoice {
                    reason: InvoiceLineText::stored("wrong buyer".into()),
                },
            )
            .await
            .unwrap();
            assert_eq!(voided.document_status, DocumentStatus::Void);
            assert_eq!(
                replacement.correction_of_invoice_id.as_deref(),
                Some(inv.id.as_str())
            );
            assert_eq!(session(&state, &b.id).await.status, SessionStatus::Expired);
        }

        #[tokio::test]
        async fn an_adjustment_closes_the_checkout_for_the_old_balance() {
            let state = state();
            let inv = issued(&state).await;
            let base = "http://127.0.0.1:8080";
            let (a, _) = checkout(
                &state,
                &payer(),
                &inv.id,
                InvoiceCheckout::default(),
                base,
                None,
            )
            .await
            .unwrap();
            let current = get(&*state.store, "proj_1", Mode::Sandbox, &inv.id)
                .await
                .unwrap();
            let adjusted = adjust(
                &state,
                "proj_1",
                Mode::Sandbox,
                &inv.id,
                AdjustInvoice {
                    amount: 30,
                    reason: InvoiceLineText::stored("discount".into()),
                    version: current.version,
                },
            )
            .await
            .unwrap();
            assert_eq!(adjusted.amount_remaining(), inv.total_amount - 30);
            assert_eq!(session(&state, &a.id).await.status, SessionStatus::Expired);
            let (b, reused) = checkout(
                &state,
                &payer(),
                &inv.id,
                InvoiceCheckout::default(),
                base,
                None,
            )
            .await
            .unwrap();
            assert!(!reused);
            assert_eq!(b.amount.get(), inv.total_amount - 30);
        }

        #[test]
        fn due_dates_stay_in_readable_years() {
            assert!(valid_due("0000-01-01T00:00:00+05:45").is_err());
            assert!(valid_due("9999-12-31T23:00:00-05:00").is_err());
            assert!(valid_due("2199-12-31T00:00:00Z").is_ok());
            assert!(valid_due("2026-12-31T18:15:00+05:45").is_ok());
        }

        #[tokio::test]
        async fn a_stale_version_changes_nothing_and_takes_no_number() {
            let state = state();
            let a = draft(&state).await;
            let b = draft(&state).await;
            let err = finalize(&state, "proj_1", Mode::Sandbox, &a.id, 7, None)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    InvoiceError::VersionConflict {
                        sent: 7,
                        current: 1
                    }
                ),
                "{err:?}"
            );
            let still = get(&*state.store, "proj_1", Mode::Sandbox, &a.id)
                .await
                .unwrap();
            assert_eq!(still, a);
            let issued = finalize(&state, "proj_1", Mode::Sandbox, &b.id, 1, None)
                .await
                .unwrap();
            assert_eq!(issued.invoice_number.as_deref(), Some("TEST-PI-000001"));
            let again = finalize(&state, "proj_1", Mode::Sandbox, &b.id, 2, None)
                .await
                .unwrap_err();
            assert!(matches!(again, InvoiceError::StateConflict(_)), "{again:?}");
        }
    }

    /// A key of `proj_1` in sandbox without a spend cap.
    fn payer() -> checkout::Creator {
        checkout::Creator {
            project_id: "proj_1".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: None,
        }
    }
}
