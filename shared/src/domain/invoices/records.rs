//! The invoice, its lines, buyer, allocations and adjustments as stored and
//! as answered, and the money arithmetic of a line (quantity, tax).

use crate::domain::listing::counted;
use serde::{Deserialize, Serialize};

use super::MAX_QUANTITY_UNITS;
use crate::domain::Mode;
use crate::domain::account::Seller;
use crate::domain::listing::counted::{CountedList, Narrowed};
use crate::domain::listing::merge_counts;
use crate::domain::record::{Attr, Changes, Entry, Record};
use crate::fields::{BuyerAddress, BuyerPhone, Email, InvoiceLineText, InvoiceNote, InvoiceText};
use crate::ids::{InvoiceId, PaymentId, ProjectId, SessionId};
use crate::keys;
use crate::kinds::Tenant;
use crate::money::Currency;
use crate::store::{Cond, Index, Key, StoreError, TxOp};
use crate::time::Timestamp;

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
pub(super) fn line_total(quantity: Quantity, unit_amount: i64) -> i64 {
    let product = i128::from(quantity.0) * i128::from(unit_amount);
    // Both are >= 0: half up is adding half the divisor.
    ((product + 500) / 1000) as i64
}

/// `round_half_up(subtotal x bps / 10000)` in paisa.
pub(super) fn tax_total(subtotal: i64, bps: i64) -> i64 {
    ((i128::from(subtotal) * i128::from(bps) + 5_000) / 10_000) as i64
}

// -------------------------------------------------------------- resources

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
    pub payment_id: PaymentId,
    pub amount: i64,
    /// The part beyond the collectible balance (in `amount_excess`).
    pub excess: i64,
    pub at: Timestamp,
}

/// A collection adjustment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Adjustment {
    pub amount: i64,
    pub reason: String,
    pub at: Timestamp,
}

/// A stored invoice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoice {
    pub id: InvoiceId,
    pub project_id: ProjectId,
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
    pub corrected_by_invoice_id: Option<InvoiceId>,
    pub correction_of_invoice_id: Option<InvoiceId>,
    /// The last checkout session opened for the invoice.
    #[serde(default)]
    pub checkout_session_id: Option<SessionId>,
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    #[serde(default)]
    pub adjustments: Vec<Adjustment>,
    /// Counted in its project's list counters (`listing::counted`): set
    /// at creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// Entered and counted in its project's narrowings by status
    /// ([`Invoice::by_status`]): its `gsi4` partition, present from
    /// creation, or from `dhukuti-admin lists migrate`.
    #[serde(
        default,
        rename = "gsi4pk",
        deserialize_with = "crate::domain::listing::present",
        skip_serializing
    )]
    pub narrowed: bool,
}

crate::attrs! { Invoice {
    ID: InvoiceId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    VERSION: i64 = version,
    INVOICE_NUMBER: Option<String> = invoice_number,
    DOCUMENT_STATUS: DocumentStatus = document_status,
    COLLECTION_STATUS: CollectionStatus = collection_status,
    CURRENCY: Currency = currency,
    LINES: Vec<Line> = lines,
    SUBTOTAL: i64 = subtotal,
    TAX_RATE_BPS: i64 = tax_rate_bps,
    TAX_TOTAL: i64 = tax_total,
    TOTAL_AMOUNT: i64 = total_amount,
    AMOUNT_PAID: i64 = amount_paid,
    AMOUNT_ADJUSTED: i64 = amount_adjusted,
    AMOUNT_EXCESS: i64 = amount_excess,
    CUSTOMER_ID: Option<String> = customer_id,
    BUYER: Option<StoredBuyer> = buyer,
    SELLER: Option<Seller> = seller,
    ISSUED_AT: Option<Timestamp> = issued_at,
    DUE_AT: Timestamp = due_at,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    EXTERNAL_REFERENCE: Option<String> = external_reference,
    NOTE: Option<String> = note,
    NEEDS_ATTENTION: bool = needs_attention,
    VOIDED_AT: Option<Timestamp> = voided_at,
    VOID_REASON: Option<String> = void_reason,
    CORRECTED_BY_INVOICE_ID: Option<InvoiceId> = corrected_by_invoice_id,
    CORRECTION_OF_INVOICE_ID: Option<InvoiceId> = correction_of_invoice_id,
    CHECKOUT_SESSION_ID: Option<SessionId> = checkout_session_id,
    ALLOCATIONS: Vec<Allocation> = allocations,
    ADJUSTMENTS: Vec<Adjustment> = adjustments,
    COUNTED: bool = counted,
    NARROWED: bool = narrowed as "gsi4pk",
} }

crate::domain::listing::counted::counted_per_tenant!(
    Invoice,
    crate::domain::listing::counted::CountedKind::Invoices,
    Invoice::list_partition
);

impl Invoice {
    pub fn key(id: &InvoiceId) -> Key {
        keys::record(keys::Record::Invoice, id)
    }

    pub(super) fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Invoices)
    }

    /// Its `counted` and `narrowed` still as read: a whole-record write
    /// from an older read must not undo the lists migration's marks (a
    /// rerun would count it twice).
    pub(super) fn listed_as_read(&self) -> Cond {
        Cond::And(vec![
            if self.counted {
                Invoice::COUNTED.eq(&true)
            } else {
                Invoice::COUNTED.missing()
            },
            if self.narrowed {
                Invoice::NARROWED.exists()
            } else {
                Invoice::NARROWED.missing()
            },
        ])
    }

    /// `tenant`'s invoices narrowed to a document status, a collection
    /// status, or both (`None` for neither: the whole list). Document:
    /// `gsi4`, member `d_<s>`; collection: `gsi5`, `c_<s>`; both: `gsi6`,
    /// `dc_<d>_<c>`; each partition the list's with `#D#<d>`, `#C#<c>`,
    /// `#DC#<d>#<c>`, sorted by id.
    pub fn by_status(
        tenant: &Tenant,
        document: Option<DocumentStatus>,
        collection: Option<CollectionStatus>,
    ) -> CountedList {
        let list = Invoice::counted_list_of(tenant);
        let base = Invoice::list_partition(tenant);
        match (document, collection) {
            (None, None) => list,
            (Some(d), None) => list.narrowed(
                &format!("d_{}", d.as_str()),
                Index::Gsi4,
                format!("{base}#D#{}", d.as_str()),
            ),
            (None, Some(c)) => list.narrowed(
                &format!("c_{}", c.as_str()),
                Index::Gsi5,
                format!("{base}#C#{}", c.as_str()),
            ),
            (Some(d), Some(c)) => list.narrowed(
                &format!("dc_{}_{}", d.as_str(), c.as_str()),
                Index::Gsi6,
                format!("{base}#DC#{}#{}", d.as_str(), c.as_str()),
            ),
        }
    }

    /// Its three narrowings (by document, collection, both) at its
    /// statuses.
    fn narrowings_now(&self) -> [CountedList; 3] {
        let tenant = Tenant::new(self.project_id.clone(), self.mode);
        let (d, c) = (self.document_status, self.collection_status);
        [
            Invoice::by_status(&tenant, Some(d), None),
            Invoice::by_status(&tenant, None, Some(c)),
            Invoice::by_status(&tenant, Some(d), Some(c)),
        ]
    }

    /// The counter writes of a new invoice: its list and (narrowed) its
    /// narrowings, folded per counter item.
    pub(super) fn counts_new(&self) -> Vec<TxOp> {
        let mut ops = self.count_new();
        if self.narrowed {
            for l in self.narrowings_now() {
                merge_counts(&mut ops, l.count_new(&self.id, self.created_at));
            }
        }
        ops
    }

    /// The counter writes of a deleted invoice (a discarded draft).
    pub(super) fn counts_gone(&self) -> Vec<TxOp> {
        let mut ops = Vec::new();
        if self.counted {
            ops = self
                .counted_list_of_self()
                .count_gone(&self.id, self.created_at);
        }
        if self.narrowed {
            for l in self.narrowings_now() {
                merge_counts(&mut ops, l.count_gone(&self.id, self.created_at));
            }
        }
        ops
    }

    /// THE write of a change of a stored invoice (every status change is
    /// one): `next`, the whole record (its narrowed entries from
    /// [`Record::entries`]), over `current` as read (its version, its
    /// list marks, and `also`), with its narrowings' counts moved in the
    /// same transaction when a status changed. The put is op 0; the
    /// counter writes come last.
    pub(super) fn write_over(
        current: &Invoice,
        next: &Invoice,
        also: Vec<Cond>,
    ) -> Result<Vec<TxOp>, StoreError> {
        let mut cond = vec![
            Invoice::VERSION.eq(&current.version),
            current.listed_as_read(),
        ];
        cond.extend(also);
        let mut next = next.clone();
        next.narrowed = current.narrowed;
        let mut ops = vec![TxOp::Put {
            item: next.to_item()?,
            cond: Some(Cond::And(cond)),
        }];
        if current.narrowed {
            let mut counts = Vec::new();
            for (from, to) in current.narrowings_now().iter().zip(next.narrowings_now()) {
                merge_counts(
                    &mut counts,
                    from.count_moved(&to, &current.id, current.created_at),
                );
            }
            ops.extend(counts);
        }
        Ok(ops)
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
}

impl Record for Invoice {
    fn item_key(&self) -> Key {
        Invoice::key(&self.id)
    }

    /// Listed in its project's invoices, newest first; narrowed, in its
    /// narrowings by status too.
    fn entries(&self) -> Vec<Entry> {
        let mut out = vec![Entry::gsi1(
            Invoice::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.clone(),
        )];
        if self.narrowed {
            out.extend(self.narrowed_entries());
        }
        out
    }
}

impl Invoice {
    fn narrowed_entries(&self) -> Vec<Entry> {
        counted::entries_in(&self.narrowings_now(), self.id.as_str())
    }
}

impl Narrowed for Invoice {
    const NARROWED: Attr<Self, bool> = Invoice::NARROWED;
    fn is_narrowed(&self) -> bool {
        self.narrowed
    }
    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>) {
        let counts = counted::counts_in(&self.narrowings_now(), self.id.as_str(), self.created_at);
        (Changes::new().enter(self.narrowed_entries()), counts)
    }
    fn narrowed_as_read(&self) -> Cond {
        Cond::And(vec![
            Invoice::DOCUMENT_STATUS.eq(&self.document_status),
            Invoice::COLLECTION_STATUS.eq(&self.collection_status),
        ])
    }
}

/// The seller as answered (camelCase keys, spec "seller").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Seller)]
pub struct SellerView {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub legal_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub email: Option<String>,
    #[schema(required)]
    pub logo_url: Option<String>,
    #[schema(required)]
    pub brand_color: Option<String>,
}

/// The invoice as the API answers it (spec field names, snake_case).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = Invoice)]
pub struct InvoiceView {
    pub id: String,
    pub object: &'static str,
    pub livemode: bool,
    pub version: i64,
    #[schema(required)]
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
    #[schema(required)]
    pub customer_id: Option<InvoiceText>,
    #[schema(required)]
    pub buyer: Option<Buyer>,
    #[schema(required)]
    pub seller: Option<SellerView>,
    #[schema(required)]
    pub issued_at: Option<Timestamp>,
    pub due_at: Timestamp,
    pub created_at: Timestamp,
    #[schema(required)]
    pub external_reference: Option<InvoiceText>,
    #[schema(required)]
    pub note: Option<InvoiceNote>,
    pub needs_attention: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub voided_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub void_reason: Option<InvoiceLineText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub corrected_by_invoice_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub correction_of_invoice_id: Option<String>,
}

impl InvoiceView {
    pub fn at(inv: &Invoice, now: Timestamp) -> Self {
        InvoiceView {
            id: inv.id.to_string(),
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
            corrected_by_invoice_id: inv.corrected_by_invoice_id.clone().map(String::from),
            correction_of_invoice_id: inv.correction_of_invoice_id.clone().map(String::from),
        }
    }
}

// ------------------------------------------------------------- requests
