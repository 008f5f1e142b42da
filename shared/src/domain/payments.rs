//! Payments: one per attempt at a provider. Read here; written by checkout.
//!
//! Stored at `PAY#<id>` (so a provider callback finds it by id alone) and
//! listed through `gsi1` on `PROJ#<project>#<mode>#PAY`, newest first
//! because ids sort by time.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::listing::{self, ListFilter, ListKind, Listed, StatusChange};
use super::record::{Attr, Changes, Entry, Record, from_item};
use super::{Mode, Provider};
use crate::app::Deps;
use crate::domain::{Tenant, Window};
use crate::fields::{Email, PersonName, Phone};
use crate::ids::{PaymentId, ProjectId, SessionId};
use crate::keys;
use crate::money::{Currency, Paisa};
use crate::store::{Cond, Index, Key, Query, Seek, Store, StoreError};
use crate::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PaymentStatus {
    Pending,
    Processing,
    Success,
    Failed,
    Refunded,
    Cancelled,
}

/// A stored payment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Payment {
    pub id: PaymentId,
    pub project_id: ProjectId,
    pub checkout_session_id: SessionId,
    pub mode: Mode,
    pub amount: Paisa,
    #[serde(default)]
    pub amount_refunded: Paisa,
    /// Refunds not failed, reserved against the amount (left out of the
    /// item at zero; changed only by `ADD`, with the refund it reserves
    /// for, never by writing the whole payment).
    #[serde(default, skip_serializing_if = "Paisa::is_zero")]
    pub amount_reserved: Paisa,
    pub currency: Currency,
    pub provider: Provider,
    pub status: PaymentStatus,
    #[serde(default)]
    pub provider_ref: Option<String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default)]
    pub customer_name: Option<String>,
    #[serde(default)]
    pub customer_email: Option<String>,
    #[serde(default)]
    pub customer_phone: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Another payment of the same session succeeded first: this one is a
    /// double payment, kept and flagged for the merchant to refund.
    #[serde(default)]
    pub double_payment_of: Option<PaymentId>,
    /// When Fonepay's websocket said the customer scanned the QR (a hint
    /// for the customer's screen, `qr.scanned`; never shown in the API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scanned_at: Option<Timestamp>,
    /// What the gateway needs about the attempt at the provider (never
    /// shown in the API).
    #[serde(default)]
    pub attempt: AttemptInfo,
    /// The reconciler's bookkeeping (top-level attributes, so conditional
    /// writes can use them; never shown in the API).
    #[serde(flatten, default)]
    pub checks: Checks,
    /// Its entry among its project's open payments, by next check (while
    /// open): `gsi2pk`, then `gsi2sk` (see [`Gsi2Entry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsi2pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsi2sk: Option<String>,
}

crate::attrs! { Payment {
    ID: PaymentId = id,
    PROJECT_ID: ProjectId = project_id,
    CHECKOUT_SESSION_ID: SessionId = checkout_session_id,
    MODE: Mode = mode,
    AMOUNT: Paisa = amount,
    AMOUNT_REFUNDED: Paisa = amount_refunded,
    AMOUNT_RESERVED: Paisa = amount_reserved,
    CURRENCY: Currency = currency,
    PROVIDER: Provider = provider,
    STATUS: PaymentStatus = status,
    PROVIDER_REF: Option<String> = provider_ref,
    FAILURE_REASON: Option<String> = failure_reason,
    METADATA: Map<String, Value> = metadata,
    CUSTOMER_NAME: Option<String> = customer_name,
    CUSTOMER_EMAIL: Option<String> = customer_email,
    CUSTOMER_PHONE: Option<String> = customer_phone,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    DOUBLE_PAYMENT_OF: Option<PaymentId> = double_payment_of,
    SCANNED_AT: Option<Timestamp> = scanned_at,
    ATTEMPT: AttemptInfo = attempt,
    CHECKED_AT: Option<Timestamp> = checks.checked_at,
    RECHECK_UNTIL: Option<Timestamp> = checks.recheck_until,
    REVIEW: Option<String> = checks.review,
    FEE_PROVIDER: Option<Paisa> = checks.fee_provider,
    FEE_CONFIGURED: Option<Paisa> = checks.fee_configured,
    LISTED: bool = checks.listed as "gsi3pk",
} }

/// Where a payment's fee comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FeeSource {
    /// Stated by the provider (Khalti's lookup `fee`, Fonepay's
    /// `commissionAmount`).
    Provider,
    /// Computed from the rate the merchant configured for the provider,
    /// as it was when the payment succeeded.
    Configured,
}

/// When the provider was last asked about a payment, and why it waits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checks {
    /// The last claimed provider check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<Timestamp>,
    /// A cancelled payment stays in the reconciler's index until then, in
    /// case the customer pays after all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck_until: Option<Timestamp>,
    /// Why the payment waits for a person (e.g. paid another amount).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<String>,
    /// The fee the provider stated for the payment (Khalti's lookup
    /// `fee` at success; Fonepay's websocket `commissionAmount`, whenever
    /// it arrives), paisa.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_provider: Option<Paisa>,
    /// The fee computed at success from the merchant's configured rate
    /// for the provider (`domain::fees`), kept whatever the rate later
    /// becomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_configured: Option<Paisa>,
    /// Whether it is in the filtered lists (`domain::listing`): its
    /// `gsi3` partition is there (written by its entries, never from
    /// here).
    #[serde(
        default,
        rename = "gsi3pk",
        skip_serializing,
        deserialize_with = "listing::present"
    )]
    pub listed: bool,
}

/// The attempt behind a payment, as the provider knows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptInfo {
    /// Ours, sent to the provider (eSewa `transaction_uuid`, Khalti
    /// `purchase_order_id`, Fonepay `PRN`).
    #[serde(default)]
    pub reference: Option<String>,
    /// The provider's handle before payment (Khalti `pidx`).
    #[serde(default)]
    pub provider_token: Option<String>,
    /// The Fonepay QR text, to show the QR again.
    #[serde(default)]
    pub qr_message: Option<String>,
    /// The Kathmandu month (`YYYY-MM`) whose sandbox fonepay cap holds
    /// this attempt.
    #[serde(default)]
    pub cap_month: Option<String>,
    /// Paid by scanning a QR rather than in the browser.
    #[serde(default)]
    pub qr: bool,
    /// Fonepay's websocket for this QR (scan and result hints, never
    /// proof).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket_url: Option<String>,
}

impl Payment {
    pub fn key(id: &PaymentId) -> Key {
        keys::record(keys::Record::Payment, id)
    }

    fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Payments)
    }

    /// Whose payment it is.
    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// Its fee and where it comes from: the provider's when stated, else
    /// the configured snapshot; `None` for a payment with neither (one
    /// from before fees were recorded, or of a provider with no rate).
    pub fn fee(&self) -> Option<(Paisa, FeeSource)> {
        match (self.checks.fee_provider, self.checks.fee_configured) {
            (Some(f), _) => Some((f, FeeSource::Provider)),
            (None, Some(f)) => Some((f, FeeSource::Configured)),
            (None, None) => None,
        }
    }

    /// What the merchant keeps of the amount: the amount less its fee
    /// (never below zero); `None` without a fee.
    pub fn net(&self) -> Option<Paisa> {
        self.fee()
            .map(|(fee, _)| self.amount.checked_sub(fee).unwrap_or(Paisa::ZERO))
    }

    /// The id its counters shard on: its checkout session's (so it shares
    /// its session's counter items), else its own.
    pub fn counter_shard_id(&self) -> &str {
        if self.checkout_session_id.is_empty() {
            &self.id
        } else {
            &self.checkout_session_id
        }
    }
}

impl Record for Payment {
    fn item_key(&self) -> Key {
        Payment::key(&self.id)
    }

    /// Listed in its project's payments, newest first (its open-payments
    /// entry is its `gsi2` fields).
    fn entries(&self) -> Vec<Entry> {
        let mut entries = vec![Entry::gsi1(
            Payment::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.to_string(),
        )];
        entries.extend(listing::entries(self));
        entries
    }
}

impl Listed for Payment {
    const KIND: ListKind = ListKind::Payments;
    const LISTED: Attr<Payment, bool> = Payment::LISTED;
    fn list_tenant(&self) -> Tenant {
        self.tenant()
    }
    fn list_status(&self) -> String {
        listing::status_name(&self.status)
    }
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
        self.counter_shard_id()
    }
    fn is_listed(&self) -> bool {
        self.checks.listed
    }
    fn status_unchanged(&self) -> Cond {
        Payment::STATUS.eq(&self.status)
    }
}

impl Payment {
    /// Moving this payment (as read) to `to`: the status, its filtered
    /// lists' entries and their counters, to write with `.changes` under
    /// `.cond` (the status still as read) with `.also` in the same
    /// transaction. Every status change goes through here (a test fails
    /// on a `set` of the status anywhere else).
    pub fn status_change(&self, to: PaymentStatus) -> StatusChange<Payment> {
        let changes = Changes::new().set(Payment::STATUS, &to);
        listing::status_change(self, &listing::status_name(&to), changes)
    }
}

/// A payment as the API shows it (camelCase, as the spec writes it).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Payment)]
pub struct PaymentView {
    pub id: String,
    pub livemode: bool,
    pub project_id: String,
    pub checkout_session_id: String,
    pub mode: Mode,
    pub amount: Paisa,
    pub amount_refunded: Paisa,
    pub currency: Currency,
    pub provider: Provider,
    pub status: PaymentStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub provider_ref: Option<String>,
    #[schema(required)]
    pub failure_reason: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_name: Option<PersonName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_email: Option<Email>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_phone: Option<Phone>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Set on a second success for one session (decisions, "Payments").
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub double_payment_of: Option<String>,
    /// The provider's fee in paisa (`feeSource` says whose figure); null
    /// when none is known (a payment from before fees were recorded, or
    /// of a provider that states none and has no configured rate).
    #[schema(required)]
    pub fee: Option<Paisa>,
    /// `amount` less `fee`, paisa; null with `fee`.
    #[schema(required)]
    pub net: Option<Paisa>,
    /// `provider` (stated by the provider) or `configured` (computed from
    /// the merchant's rate at success); null with `fee`.
    #[schema(required)]
    pub fee_source: Option<FeeSource>,
}

impl From<Payment> for PaymentView {
    fn from(p: Payment) -> Self {
        let fee = p.fee();
        let net = p.net();
        PaymentView {
            fee: fee.map(|(f, _)| f),
            net,
            fee_source: fee.map(|(_, s)| s),
            livemode: p.mode.is_live(),
            id: p.id.into(),
            project_id: p.project_id.into(),
            checkout_session_id: p.checkout_session_id.into(),
            mode: p.mode,
            amount: p.amount,
            amount_refunded: p.amount_refunded,
            currency: p.currency,
            provider: p.provider,
            status: p.status,
            provider_ref: p.provider_ref,
            failure_reason: p.failure_reason,
            metadata: p.metadata,
            customer_name: p.customer_name.map(PersonName::stored),
            customer_email: p.customer_email.map(Email::stored),
            customer_phone: p.customer_phone.map(Phone::stored),
            created_at: p.created_at,
            updated_at: p.updated_at,
            double_payment_of: p.double_payment_of.map(String::from),
        }
    }
}

/// Default page size of `GET /v1/payments` (decisions.md).
pub const DEFAULT_PAGE: usize = 25;

/// Stores a new payment; refuses to overwrite one.
pub async fn insert(store: &dyn Store, payment: &Payment) -> Result<(), StoreError> {
    let counted = super::totals::count_payment(&payment.tenant(), payment.counter_shard_id());
    let mut ops = vec![payment.put_new()?, counted];
    ops.extend(listing::count_new(payment));
    store.transact(ops).await
}

/// The payment `id` of `tenant`; `None` for any other project's or
/// mode's payment, exactly as for a missing one. One store read.
pub async fn find(
    deps: &Deps,
    tenant: &Tenant,
    id: &PaymentId,
) -> Result<Option<Payment>, StoreError> {
    let Some(payment) = get(&*deps.store, id).await? else {
        return Ok(None);
    };
    Ok(tenant
        .owns(&payment.project_id, payment.mode)
        .then_some(payment))
}

/// The payment `id` of any project (provider returns know it by id
/// alone).
pub async fn get(store: &dyn Store, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
    crate::domain::record::get(store, &Payment::key(id)).await
}

/// Records the fee `provider` stated for payment `id` outside its status
/// answer (Fonepay's websocket `commissionAmount`), whenever it arrives:
/// before or after the success. The first stated fee stays; a payment of
/// another provider, or a missing one, is left alone. Whether it was
/// recorded.
pub async fn record_provider_fee(
    deps: &Deps,
    id: &PaymentId,
    provider: Provider,
    fee: Paisa,
) -> Result<bool, StoreError> {
    let cond = Cond::And(vec![
        Cond::Exists,
        Payment::PROVIDER.eq(&provider),
        Payment::FEE_PROVIDER.missing(),
    ]);
    let update = Changes::<Payment>::new().set_some(Payment::FEE_PROVIDER, &fee);
    match deps
        .store
        .update(&Payment::key(id), update.into(), Some(cond))
        .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A page of the tenant's payments, newest first, and the total.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    window: Window,
) -> Result<(Vec<Payment>, u64), StoreError> {
    list_where(deps, tenant, &ListFilter::default(), window).await
}

/// A page of the tenant's payments narrowed by `filter` (created in a
/// range, a status, a provider, any combination), newest first, and the
/// total that matches: through the filtered lists' indexes and counters
/// (`domain::listing`), at a cost that does not grow with the history,
/// whatever the offset.
pub async fn list_where(
    deps: &Deps,
    tenant: &Tenant,
    filter: &ListFilter,
    window: Window,
) -> Result<(Vec<Payment>, u64), StoreError> {
    let store = &*deps.store;
    // The whole list by id (`gsi1`) costs its page for a first page or a
    // page after a record: only a deep offset walks the counters.
    let by_id = window.seek != Seek::Start || window.offset <= listing::DIRECT_OFFSET;
    if filter.is_empty() && by_id {
        return list_by_id(deps, tenant, window).await;
    }
    let counted = listing::covered(store, tenant, ListKind::Payments).await?;
    if filter.is_empty() && !counted {
        // Records from before the lists are not in them until the
        // migration: the whole list as it was kept.
        return list_by_id(deps, tenant, window).await;
    }
    let seek_from = match &window.seek {
        Seek::Start => None,
        Seek::After(id) | Seek::Before(id) => {
            let found = match PaymentId::parse(id) {
                Some(id) => find(deps, tenant, &id).await?,
                None => None,
            };
            match found {
                Some(p) => Some(p),
                // No such payment of the tenant: nothing after it.
                None => return Ok((Vec::new(), 0)),
            }
        }
    };
    let (records, total, _) =
        listing::page(store, tenant, filter, &window, seek_from.as_ref(), counted).await?;
    Ok((records, total))
}

/// The tenant's whole list by id (`gsi1`, with every payment, listed by
/// the migration or not yet), its total from the all-time counter.
async fn list_by_id(
    deps: &Deps,
    tenant: &Tenant,
    window: Window,
) -> Result<(Vec<Payment>, u64), StoreError> {
    let store = &*deps.store;
    let query = Query::partition(Payment::list_partition(tenant))
        .on(Index::Gsi1)
        .backward();
    // The total from the project's counter (one query of a few items),
    // side by side with the page; counted through the index only for a
    // project from before the counter.
    let (page, counted) = tokio::join!(
        window.read(store, &query),
        super::totals::payments(store, tenant)
    );
    let total = match counted? {
        Some(n) => n,
        None => store.count(&query).await?,
    };
    let records = page?
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<Payment>, _>>()?;
    Ok((records, total))
}

/// What a list of payments may be narrowed to (the dashboard's filters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PaymentFilter {
    pub status: Option<PaymentStatus>,
    pub provider: Option<Provider>,
}

impl From<PaymentFilter> for ListFilter {
    fn from(f: PaymentFilter) -> ListFilter {
        ListFilter {
            status: f.status.map(|s| listing::status_name(&s)),
            provider: f.provider,
            from: None,
            to: None,
        }
    }
}

/// [`list`] narrowed by `filter`: [`list_where`] (the same indexes as the
/// API's filters).
pub async fn list_filtered(
    deps: &Deps,
    tenant: &Tenant,
    filter: PaymentFilter,
    window: Window,
) -> Result<(Vec<Payment>, u64), StoreError> {
    list_where(deps, tenant, &filter.into(), window).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testenv::memory_store as store;
    use crate::time::{Clock, SystemClock};
    use crate::{AppState, Config};
    use std::sync::Arc;

    /// A state on `store` (its clock is not read here).
    fn deps(store: Arc<dyn Store>) -> AppState {
        AppState::new(
            store,
            Arc::new(SystemClock),
            Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
    }

    fn payment(project: &str, mode: Mode, amount: i64) -> Payment {
        let now = SystemClock.now();
        Payment {
            id: PaymentId::new(),
            project_id: project.into(),
            checkout_session_id: SessionId::new(),
            mode,
            amount: Paisa::new(amount).unwrap_or_default(),
            amount_refunded: Paisa::ZERO,
            amount_reserved: Paisa::ZERO,
            gsi2pk: None,
            gsi2sk: None,
            currency: Currency::Npr,
            provider: Provider::Khalti,
            status: PaymentStatus::Success,
            provider_ref: Some("KTX-1".into()),
            failure_reason: None,
            metadata: Map::new(),
            customer_name: None,
            customer_email: None,
            customer_phone: None,
            created_at: now,
            updated_at: now,
            double_payment_of: None,
            scanned_at: None,
            attempt: AttemptInfo::default(),
            checks: Checks::default(),
        }
    }

    #[tokio::test]
    async fn a_payment_is_visible_only_to_its_project_and_mode() {
        let store = store();
        let st = deps(store.clone());
        let p = payment("proj_a", Mode::Sandbox, 1000);
        assert!(insert(&*store, &p).await.is_ok());
        let found = find(&st, &Tenant::new("proj_a", Mode::Sandbox), &p.id).await;
        assert_eq!(found.ok().flatten().map(|x| x.id), Some(p.id.clone()));
        assert_eq!(
            find(&st, &Tenant::new("proj_a", Mode::Live), &p.id).await,
            Ok(None)
        );
        assert_eq!(
            find(&st, &Tenant::new("proj_b", Mode::Sandbox), &p.id).await,
            Ok(None)
        );
        assert_eq!(
            find(
                &st,
                &Tenant::new("proj_a", Mode::Sandbox),
                &"pay_nope".into()
            )
            .await,
            Ok(None)
        );
        // A second insert of the same id never overwrites.
        assert!(insert(&*store, &p).await.is_err());
    }

    #[tokio::test]
    async fn lists_are_newest_first_with_totals() {
        let store = store();
        let mut ids_in_order = Vec::new();
        for i in 0..7 {
            let p = payment("proj_a", Mode::Live, 100 + i);
            ids_in_order.push(p.id.clone());
            assert!(insert(&*store, &p).await.is_ok());
        }
        assert!(
            insert(&*store, &payment("proj_a", Mode::Sandbox, 5))
                .await
                .is_ok()
        );
        assert!(
            insert(&*store, &payment("proj_b", Mode::Live, 5))
                .await
                .is_ok()
        );
        ids_in_order.reverse();
        let st = deps(store.clone());
        let Ok((page, total)) =
            list(&st, &Tenant::new("proj_a", Mode::Live), Window::at(2, 3)).await
        else {
            panic!()
        };
        assert_eq!(total, 7);
        let got: Vec<PaymentId> = page.into_iter().map(|p| p.id).collect();
        assert_eq!(got, ids_in_order[2..5].to_vec());
        let Ok((tail, _)) = list(&st, &Tenant::new("proj_a", Mode::Live), Window::at(6, 10)).await
        else {
            panic!()
        };
        assert_eq!(tail.len(), 1);
    }

    /// A project made with the counter: its list's total is the counter
    /// (a payment written around it is listed but not counted), read side
    /// by side with the page: two store calls whatever the number.
    #[tokio::test]
    async fn a_counted_projects_total_costs_one_read() {
        use crate::domain::account::{Plan, create_merchant, create_project};
        use crate::store::counting::CountingStore;
        let inner = store();
        let now = SystemClock.now();
        let Ok(m) = create_merchant(&*inner, now, "M", "m@shop.example", Plan::Pro).await else {
            panic!("merchant")
        };
        let Ok(project) = create_project(&*inner, now, &m, "P", false).await else {
            panic!("project")
        };
        for i in 0..7 {
            assert!(
                insert(&*inner, &payment(&project.id, Mode::Live, 100 + i))
                    .await
                    .is_ok()
            );
        }
        let around = payment(&project.id, Mode::Live, 1);
        let item = around.to_item().unwrap();
        assert!(inner.put(item, None).await.is_ok());
        let counting = Arc::new(CountingStore::new(inner));
        let st = deps(counting.clone());
        let Ok((page, total)) = list(
            &st,
            &Tenant::new(project.id.clone(), Mode::Live),
            Window::first(25),
        )
        .await
        else {
            panic!("list")
        };
        assert_eq!((page.len(), total), (8, 7));
        assert_eq!(counting.calls(), 2, "the page and the counter");
        let Ok((_, sandbox)) = list(
            &st,
            &Tenant::new(project.id.clone(), Mode::Sandbox),
            Window::first(25),
        )
        .await
        else {
            panic!("list")
        };
        assert_eq!(sandbox, 0);
    }

    #[test]
    fn the_view_uses_the_spec_names() {
        let p = payment("proj_a", Mode::Live, 2500);
        let v = serde_json::to_value(PaymentView::from(p)).unwrap_or_default();
        for field in [
            "id",
            "livemode",
            "projectId",
            "checkoutSessionId",
            "mode",
            "amount",
            "currency",
            "provider",
            "status",
            "failureReason",
            "metadata",
            "createdAt",
            "updatedAt",
            "amountRefunded",
        ] {
            assert!(v.get(field).is_some(), "missing {field}");
        }
        // Optional fields: set, or omitted; never null against their type.
        for f in [
            "providerRef",
            "customerName",
            "customerEmail",
            "customerPhone",
        ] {
            assert_ne!(v.get(f), Some(&serde_json::Value::Null), "{f} is null");
        }
        assert_eq!(v["livemode"], true);
        assert_eq!(v["mode"], "live");
        assert_eq!(v["currency"], "NPR");
        assert_eq!(v["status"], "success");
    }

    #[tokio::test]
    async fn a_stated_fee_is_recorded_once_for_its_provider_only() {
        let store = store();
        let mut p = payment("proj_a", Mode::Live, 10_000);
        p.provider = Provider::Fonepay;
        assert!(insert(&*store, &p).await.is_ok());
        let st = deps(store.clone());
        let fee = |v| Paisa::new(v).unwrap_or_default();
        assert_eq!(
            record_provider_fee(&st, &p.id, Provider::Khalti, fee(9)).await,
            Ok(false)
        );
        assert_eq!(
            record_provider_fee(&st, &p.id, Provider::Fonepay, fee(29)).await,
            Ok(true)
        );
        assert_eq!(
            record_provider_fee(&st, &p.id, Provider::Fonepay, fee(31)).await,
            Ok(false)
        );
        assert_eq!(
            record_provider_fee(&st, &"pay_nope".into(), Provider::Fonepay, fee(1)).await,
            Ok(false)
        );
        let got = get(&*store, &p.id).await.ok().flatten().map(|p| p.fee());
        assert_eq!(got, Some(Some((fee(29), FeeSource::Provider))));
    }

    #[test]
    fn fee_net_and_source() {
        let mut p = payment("proj_a", Mode::Live, 10_000);
        let v = serde_json::to_value(PaymentView::from(p.clone())).unwrap_or_default();
        for f in ["fee", "net", "feeSource"] {
            assert_eq!(v.get(f), Some(&serde_json::Value::Null), "{f}");
        }
        p.checks.fee_configured = Paisa::new(250).ok();
        let v = serde_json::to_value(PaymentView::from(p.clone())).unwrap_or_default();
        assert_eq!(
            (&v["fee"], &v["net"], &v["feeSource"]),
            (
                &serde_json::json!(250),
                &serde_json::json!(9750),
                &serde_json::json!("configured")
            )
        );
        // The provider's figure wins over the configured one.
        p.checks.fee_provider = Paisa::new(300).ok();
        let v = serde_json::to_value(PaymentView::from(p.clone())).unwrap_or_default();
        assert_eq!(
            (&v["fee"], &v["net"], &v["feeSource"]),
            (
                &serde_json::json!(300),
                &serde_json::json!(9700),
                &serde_json::json!("provider")
            )
        );
        // A fee above the amount leaves a net of zero, never negative.
        p.checks.fee_provider = Paisa::new(20_000).ok();
        assert_eq!(p.net(), Some(Paisa::ZERO));
    }

    #[tokio::test]
    async fn a_filtered_list_pages_and_counts_only_what_matches() {
        let store = store();
        let mut failed_esewa = Vec::new();
        for i in 0..9 {
            let mut p = payment("proj_a", Mode::Sandbox, 100 + i);
            if i % 3 == 0 {
                p.status = PaymentStatus::Failed;
                p.provider = Provider::Esewa;
                failed_esewa.push(p.id.clone());
            } else if i % 3 == 1 {
                p.status = PaymentStatus::Failed;
            }
            assert!(insert(&*store, &p).await.is_ok());
        }
        failed_esewa.reverse();
        let st = deps(store.clone());
        let both = PaymentFilter {
            status: Some(PaymentStatus::Failed),
            provider: Some(Provider::Esewa),
        };
        let (page, total) = list_filtered(
            &st,
            &Tenant::new("proj_a", Mode::Sandbox),
            both,
            Window::at(1, 5),
        )
        .await
        .unwrap_or_default();
        assert_eq!(total, 3);
        let got: Vec<PaymentId> = page.into_iter().map(|p| p.id).collect();
        assert_eq!(got, failed_esewa[1..].to_vec());
        let failed = PaymentFilter {
            status: Some(PaymentStatus::Failed),
            provider: None,
        };
        let (_, total) = list_filtered(
            &st,
            &Tenant::new("proj_a", Mode::Sandbox),
            failed,
            Window::first(25),
        )
        .await
        .unwrap_or_default();
        assert_eq!(total, 6);
        let (_, total) = list_filtered(
            &st,
            &Tenant::new("proj_a", Mode::Sandbox),
            PaymentFilter::default(),
            Window::first(25),
        )
        .await
        .unwrap_or_default();
        assert_eq!(total, 9);
    }
}
