//! Refunds (spec "Refund", decisions "Refunds"): money back to a customer,
//! where a bug pays twice.
//!
//! - **Balance.** A refund reserves its amount on the payment with one
//!   conditional write (`amount_reserved <= amount - this`, payment still
//!   `success`) in the same transaction that stores the refund, so the sum
//!   of `processing + succeeded + requires_action` refunds never passes the
//!   payment, whatever the concurrency. A `failed` refund releases its
//!   reservation in the transaction that fails it.
//! - **Providers.** Khalti: its refund API, called once per refund, never
//!   again (a timeout leaves the refund `processing` for [`sweep`], which
//!   asks Khalti's lookup instead). eSewa: no refund API, so the refund is
//!   `requires_action` at once (the merchant refunds in eSewa's portal; the
//!   record is the audit trail). Fonepay: refused (422), nothing created.
//! - **Events.** `refund.succeeded` / `refund.failed` in the transaction of
//!   the change; `payment.refunded` when succeeded refunds reach the full
//!   amount (the payment becomes `refunded`).
//!
//! Stored at `REF#<id>`, listed by project and mode (`gsi1`
//! `PROJ#<p>#<mode>#REF`) and by payment (`gsi2` `PAY#<payment>#REF`);
//! an open refund also has a marker item `OPENREF#<shard>` /
//! `<created>#<id>`, the sweep's queue, deleted when it resolves.

use serde::{Deserialize, Serialize};

use super::Mode;
use super::Provider;
use super::checkout::open_partition;
use crate::domain::listing::{self, ListKind, Listed, StatusChange};
use crate::domain::payments::{FeeSource, Payment};
use crate::domain::record::{Attr, Changes, Entry, Record};
use crate::fields::{NepaliMobile, RefundNotes};
use crate::ids::{PaymentId, ProjectId, RefundId};
use crate::keys;
use crate::kinds::Tenant;
use crate::money::{Currency, Paisa};
use crate::store::{Cond, Key};
use crate::time::Timestamp;

mod create;
mod resolve;
#[cfg(test)]
mod tests;

pub use create::{Channel, CreateRefund, RefundError, RefundRequest, create, create_via};
pub use resolve::{RefundSweep, find, list, list_where, of_payment, sweep};

/// Default page size of `GET /v1/refunds` (spec).
pub const DEFAULT_PAGE: usize = 10;
/// An open refund is asked about after this: longer than the longest
/// provider call (`DHUKUTI_PROVIDER_TIMEOUT_MS` is at most 120 s), so the
/// sweep never judges a refund whose call is still in flight.
pub const RESOLVE_AFTER: chrono::Duration = chrono::Duration::minutes(5);
/// A refund Khalti's lookup shows as not applied is `failed` (its balance
/// released for another refund) only once it is this old: a refund call
/// that timed out or answered 5xx may still be applied a little later, and
/// failing it early would let the merchant refund the customer twice.
pub const NOT_APPLIED_AFTER: chrono::Duration = chrono::Duration::hours(1);
/// An open refund Khalti cannot confirm within this goes to a person.
pub const GIVE_UP_AFTER: chrono::Duration = chrono::Duration::hours(24);
const OPEN_REFUNDS: keys::Open = keys::Open::Refunds;
const TRIES: usize = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    Processing,
    Succeeded,
    Failed,
    RequiresAction,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RefundStatus::Processing => "processing",
            RefundStatus::Succeeded => "succeeded",
            RefundStatus::Failed => "failed",
            RefundStatus::RequiresAction => "requires_action",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    CustomerRequest,
    Duplicate,
    Fraudulent,
    Other,
}

/// A stored refund.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Refund {
    pub id: RefundId,
    pub project_id: ProjectId,
    pub payment_id: PaymentId,
    pub mode: Mode,
    pub provider: Provider,
    pub amount: Paisa,
    pub currency: Currency,
    pub reason: RefundReason,
    pub status: RefundStatus,
    #[serde(default)]
    pub provider_refund_id: Option<String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(default)]
    pub mobile_number: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The part of its payment's fee the provider gives back with it
    /// ([`fee_returned`]), fixed at creation; `None` when the payment had
    /// no fee (or for a refund from before fees were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee: Option<Paisa>,
    /// Whose figure the payment's fee was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_source: Option<FeeSource>,
    /// Whether it is in the filtered lists (`domain::listing`): its
    /// `gsi3` partition is there (written by its entries, never from
    /// here). A `bool`, so a refund stays the size it was.
    #[serde(
        default,
        rename = "gsi3pk",
        skip_serializing,
        deserialize_with = "listing::present"
    )]
    pub listed: bool,
}

/// Whether `provider` gives the merchant back its fee (in proportion)
/// when a payment is refunded. No provider documents it publicly:
/// assumed not, for each (UNCONFIRMED; `docs/reconciliation.md`).
pub fn returns_fee(provider: Provider) -> bool {
    match provider {
        Provider::Esewa | Provider::Khalti | Provider::Fonepay => false,
    }
}

/// The fee returned with a refund of `amount` of `payment`, and whose
/// figure the fee was: the fee's share of the amount (rounded down) where
/// the provider returns fees ([`returns_fee`]), else zero; `None` for a
/// payment without a fee.
pub fn fee_returned(payment: &Payment, amount: Paisa) -> Option<(Paisa, FeeSource)> {
    let (fee, source) = payment.fee()?;
    if !returns_fee(payment.provider) || payment.amount.is_zero() {
        return Some((Paisa::ZERO, source));
    }
    let share = i128::from(fee.get()) * i128::from(amount.get()) / i128::from(payment.amount.get());
    let share = Paisa::new(i64::try_from(share).unwrap_or(0)).unwrap_or(Paisa::ZERO);
    Some((share, source))
}

crate::attrs! { Refund {
    ID: RefundId = id,
    PROJECT_ID: ProjectId = project_id,
    PAYMENT_ID: PaymentId = payment_id,
    MODE: Mode = mode,
    PROVIDER: Provider = provider,
    AMOUNT: Paisa = amount,
    CURRENCY: Currency = currency,
    REASON: RefundReason = reason,
    STATUS: RefundStatus = status,
    PROVIDER_REFUND_ID: Option<String> = provider_refund_id,
    FAILURE_REASON: Option<String> = failure_reason,
    NOTES: Option<String> = notes,
    MOBILE_NUMBER: Option<String> = mobile_number,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    LISTED: bool = listed as "gsi3pk",
} }

impl Refund {
    pub fn key(id: &RefundId) -> Key {
        keys::record(keys::Record::Refund, id)
    }

    fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Refunds)
    }

    fn payment_partition(payment_id: &PaymentId) -> String {
        keys::payment_refunds(payment_id)
    }

    /// Its place in the sweep's queue of open refunds, by creation.
    fn marker(&self) -> OpenRefund {
        OpenRefund {
            id: self.id.clone(),
            queued_at: format!("{}#{}", self.created_at.to_rfc3339(), self.id),
        }
    }

    fn marker_key(&self) -> Key {
        self.marker().item_key()
    }
}

impl Record for Refund {
    fn item_key(&self) -> Key {
        Refund::key(&self.id)
    }

    /// Listed in its project's refunds and in its payment's.
    fn entries(&self) -> Vec<Entry> {
        vec![
            Entry::gsi1(
                Refund::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
                self.id.to_string(),
            ),
            Entry::gsi2(
                Refund::payment_partition(&self.payment_id),
                self.id.to_string(),
            ),
        ]
        .into_iter()
        .chain(listing::entries(self))
        .collect()
    }
}

impl Listed for Refund {
    const KIND: ListKind = ListKind::Refunds;
    const LISTED: Attr<Refund, bool> = Refund::LISTED;
    fn list_tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }
    fn list_status(&self) -> String {
        self.status.as_str().to_owned()
    }
    /// Its payment's.
    fn list_provider(&self) -> Provider {
        self.provider
    }
    fn list_created(&self) -> Timestamp {
        self.created_at
    }
    fn list_id(&self) -> &str {
        &self.id
    }
    fn list_shard(&self) -> &str {
        &self.id
    }
    fn is_listed(&self) -> bool {
        self.listed
    }
    fn status_unchanged(&self) -> Cond {
        Refund::STATUS.eq(&self.status)
    }
}

impl Refund {
    /// Moving this refund (as read) to `to`, with its filtered lists'
    /// entries and counters: the one place a refund's status is set.
    pub fn status_change(&self, to: RefundStatus) -> StatusChange<Refund> {
        let changes = Changes::new().set(Refund::STATUS, &to);
        listing::status_change(self, to.as_str(), changes)
    }
}

/// An open refund in the sweep's queue (`OPEN#REF#<shard>`, by creation):
/// the item holds its id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct OpenRefund {
    pub id: RefundId,
    /// Its sort key in the queue: the item's `sk`, not an attribute.
    #[serde(skip)]
    queued_at: String,
}

crate::attrs! { OpenRefund {
    ID: RefundId = id,
} }

impl Record for OpenRefund {
    fn item_key(&self) -> Key {
        Key::new(
            open_partition(OPEN_REFUNDS, &self.id),
            self.queued_at.clone(),
        )
    }
}

/// A refund as the API shows it (camelCase, as the spec writes it).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Refund)]
pub struct RefundView {
    pub id: String,
    pub livemode: bool,
    pub payment_id: String,
    pub project_id: String,
    pub mode: Mode,
    pub amount: Paisa,
    pub currency: Currency,
    pub reason: RefundReason,
    pub status: RefundStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub provider_refund_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub failure_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub notes: Option<RefundNotes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub mobile_number: Option<NepaliMobile>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The part of the payment's fee the provider returns with this
    /// refund, paisa (0 where it keeps it); null when the payment has no
    /// fee.
    #[schema(required)]
    pub fee: Option<Paisa>,
    /// What the refund takes from the merchant: `amount` less `fee`;
    /// null with `fee`.
    #[schema(required)]
    pub net: Option<Paisa>,
    /// The payment's `feeSource`; null with `fee`.
    #[schema(required)]
    pub fee_source: Option<FeeSource>,
}

impl From<Refund> for RefundView {
    fn from(r: Refund) -> Self {
        RefundView {
            fee: r.fee,
            net: r
                .fee
                .map(|f| r.amount.checked_sub(f).unwrap_or(Paisa::ZERO)),
            fee_source: r.fee.and(r.fee_source),
            livemode: r.mode.is_live(),
            id: r.id.into(),
            payment_id: r.payment_id.into(),
            project_id: r.project_id.into(),
            mode: r.mode,
            amount: r.amount,
            currency: r.currency,
            reason: r.reason,
            status: r.status,
            provider_refund_id: r.provider_refund_id,
            failure_reason: r.failure_reason,
            notes: r.notes.map(RefundNotes::stored),
            mobile_number: r.mobile_number.map(NepaliMobile::stored),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}
