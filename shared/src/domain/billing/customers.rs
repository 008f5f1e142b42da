//! Billing customers (`/v1/billing/customers`, issue 39 item 1): the
//! people a merchant bills every period. Stored in their own partition per
//! project and mode (`PROJ#<p>#<mode>#BCUS`, sort key the id: newest last),
//! read in sort-key order for lists and searches, with bounded work: the
//! unfiltered list is counted (`listing::counted`, any page at a cost
//! that does not grow with the history); a `search` scans the newest
//! [`SEARCH_SCAN`] and pages within [`MAX_WINDOW`].
//!
//! Also what the billing API shares: its error, its page request and the
//! merchant plan's entitlement.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Deps;
use crate::domain::account::{Plan, Principal};
use crate::domain::checkout::{CheckoutError, check_metadata};
use crate::domain::listing::counted::{self, CountedKind};
use crate::domain::record::{Changes, Record, Window, from_item};
use crate::domain::sms::normalize_phone;
use crate::domain::{Mode, Tenant};
use crate::fields::is_plausible_email;
use crate::fields::wire::{nullable, or_null, present};
use crate::ids::{CustomerId, ProjectId, TestClockId};
use crate::keys::{self, PerMode};
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Key, Query, StoreError, TxOp};
use crate::time::Timestamp;

/// `limit` when none is sent, and the most a page holds.
pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 100;
/// The deepest a page list reads: `page * limit` at most this many
/// records (a page list is read through from its start, as DynamoDB has
/// no skip). Past it: a 400 naming `page`; narrow with `search`/filters.
/// Counted lists ([`PageRequest::parse_deep`]) have no such bound.
pub const MAX_WINDOW: usize = 10_000;
/// The largest `page` of a counted list (any record of it is on a page
/// below this at any `limit`).
pub const MAX_PAGE: usize = 1_000_000_000;
/// A `search` reads at most this many customers, newest first, and
/// matches among them: its `total` counts matches within them.
pub const SEARCH_SCAN: usize = 5_000;
/// Longest `name`, `externalCustomerId` and `search`.
pub const MAX_NAME: usize = 200;
pub const MAX_EXTERNAL_ID: usize = 200;
pub const MAX_SEARCH: usize = 100;
/// The entitlement a 403 names when the merchant plan lacks the API.
pub const ENTITLEMENT: &str = "billing.api";

/// Why a billing request is refused.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error("{message}")]
    Invalid { field: String, message: String },
    #[error("no such {what}: {named}")]
    NotFound { what: &'static str, named: String },
    #[error(
        "customer {0} has a subscription that has not ended: cancel it before deleting the customer"
    )]
    HasSubscriptions(String),
    #[error(
        "the billing API is not in the {0:?} plan; it is in every paid plan (entitlement billing.api)"
    )]
    NotEntitled(Plan),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<BillingError> for Refusal {
    fn from(err: BillingError) -> Self {
        match err {
            BillingError::Invalid { field, message } => Refusal::invalid(field, message),
            BillingError::NotFound { what, named } => Refusal::not_found(what, &named),
            e @ BillingError::HasSubscriptions(_) => {
                Refusal::conflict("customer_has_subscriptions", e.to_string())
            }
            e @ BillingError::NotEntitled(_) => {
                Refusal::forbidden("permission_denied", e.to_string())
                    .with_extra("entitlement", Value::from(ENTITLEMENT))
            }
            BillingError::Store(e) => e.into(),
        }
    }
}

impl From<CheckoutError> for BillingError {
    fn from(e: CheckoutError) -> Self {
        match Refusal::from(e) {
            Refusal {
                field: Some(field),
                message,
                ..
            } => BillingError::Invalid { field, message },
            other => BillingError::Invalid {
                field: "metadata".into(),
                message: other.message,
            },
        }
    }
}

pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> BillingError {
    BillingError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Refuses a merchant whose plan has no billing API (checked before any
/// lookup, so the answer does not depend on the record asked for).
pub fn entitled(who: &Principal) -> Result<(), BillingError> {
    if who.merchant.plan.billing_api() {
        Ok(())
    } else {
        Err(BillingError::NotEntitled(who.merchant.plan))
    }
}

/// Whether `merchant`'s plan includes billing (the dashboard's check; a
/// key's is [`entitled`]).
pub async fn merchant_entitled(
    deps: &Deps,
    merchant: &crate::ids::MerchantId,
) -> Result<bool, StoreError> {
    let found = crate::domain::account::get_merchant(&*deps.store, merchant).await?;
    Ok(found.is_some_and(|m| m.plan.billing_api()))
}

/// A page of a page-based list: `page` from 1, `limit` 1..=[`MAX_LIMIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub page: usize,
    pub limit: usize,
}

impl PageRequest {
    /// From the query's `page` and `limit` (absent: 1 and
    /// [`DEFAULT_LIMIT`]); `page * limit` at most [`MAX_WINDOW`].
    pub fn parse(page: Option<&str>, limit: Option<&str>) -> Result<Self, BillingError> {
        let number = |field: &'static str, raw: Option<&str>, default: usize, max: usize| match raw
        {
            None => Ok(default),
            Some(raw) => match raw.trim().parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(invalid(
                    field,
                    format!("{field} must be an integer from 1 to {max}, got {raw:?}"),
                )),
            },
        };
        let limit = number("limit", limit, DEFAULT_LIMIT, MAX_LIMIT)?;
        let page = number("page", page, 1, MAX_WINDOW)?;
        if page.saturating_mul(limit) > MAX_WINDOW {
            return Err(invalid(
                "page",
                format!(
                    "a list reads at most {MAX_WINDOW} records: page * limit must be at most {MAX_WINDOW}; narrow it with search or filters"
                ),
            ));
        }
        Ok(PageRequest { page, limit })
    }

    /// For a counted list (every page served at a bounded cost): `page`
    /// up to [`MAX_PAGE`], no bound on `page * limit`; a page past the
    /// end is empty. A filtered read of it checks [`PageRequest::windowed`].
    pub fn parse_deep(page: Option<&str>, limit: Option<&str>) -> Result<Self, BillingError> {
        let limit = PageRequest::parse(Some("1"), limit)?.limit;
        let page = match page {
            None => 1,
            Some(raw) => match raw.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "page",
                        format!("page must be an integer from 1 to {MAX_PAGE}, got {raw:?}"),
                    ));
                }
            },
        };
        Ok(PageRequest { page, limit })
    }

    /// Refuses a page past [`MAX_WINDOW`] (a read through from the list's
    /// start: a search or a filter), as [`PageRequest::parse`] does.
    pub fn windowed(self) -> Result<Self, BillingError> {
        let page = self.page.to_string();
        let limit = self.limit.to_string();
        PageRequest::parse(Some(&page), Some(&limit))
    }

    /// Records before this page.
    pub fn offset(&self) -> usize {
        self.page.saturating_sub(1).saturating_mul(self.limit)
    }
}

/// The language of a customer's reminders (ours: the SDK has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Locale {
    #[default]
    En,
    Ne,
}

/// A stored customer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Customer {
    pub id: CustomerId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub name: String,
    pub email: Option<String>,
    /// 10 digits, `97…`/`98…` (as the SMS feature normalizes it).
    pub phone: Option<String>,
    pub external_customer_id: Option<String>,
    pub metadata: Map<String, Value>,
    pub locale: Locale,
    /// Subscriptions of this customer that have not ended. The
    /// subscription code raises it in the transaction that creates one
    /// (conditioned on the customer existing) and lowers it in the one
    /// that ends one; a delete is conditioned on it being 0 (or missing).
    #[serde(default)]
    pub open_subscriptions: i64,
    /// The sandbox test clock the customer lives by, set at creation
    /// (`billing::test_clock`): their subscriptions are on it.
    #[serde(default)]
    pub test_clock_id: Option<TestClockId>,
    /// Paisa of credit applied to their next invoices (never below 0;
    /// `billing::credit`), changed only with a ledger entry.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub credit_balance: i64,
    /// Ledger entries written: the balance's version, the condition of
    /// every change of it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub credit_entries: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Counted in its tenant's list counters (`listing::counted`): set at
    /// creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

crate::attrs! { Customer {
    ID: CustomerId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    NAME: String = name,
    EMAIL: Option<String> = email,
    PHONE: Option<String> = phone,
    EXTERNAL_CUSTOMER_ID: Option<String> = external_customer_id,
    METADATA: Map<String, Value> = metadata,
    LOCALE: Locale = locale,
    OPEN_SUBSCRIPTIONS: i64 = open_subscriptions,
    CREDIT_BALANCE: i64 = credit_balance,
    CREDIT_ENTRIES: i64 = credit_entries,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    COUNTED: bool = counted,
} }

crate::domain::listing::counted::counted_per_tenant!(
    Customer,
    crate::domain::listing::counted::CountedKind::Customers,
    Customer::partition
);

impl Customer {
    pub fn partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, PerMode::BillingCustomers)
    }

    pub fn key(tenant: &Tenant, id: &CustomerId) -> Key {
        Key::new(Customer::partition(tenant), id.as_str())
    }

    /// Whether `needle` (lowercase) is in its name, email, phone or
    /// external id, ignoring case.
    pub fn matches(&self, needle: &str) -> bool {
        let has = |s: &str| s.to_lowercase().contains(needle);
        has(&self.name)
            || self.email.as_deref().is_some_and(has)
            || self.phone.as_deref().is_some_and(has)
            || self.external_customer_id.as_deref().is_some_and(has)
    }
}

impl Record for Customer {
    fn item_key(&self) -> Key {
        Customer::key(&Tenant::new(self.project_id.clone(), self.mode), &self.id)
    }
}

/// The customer as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BillingCustomer)]
pub struct CustomerView {
    /// `cus_…`.
    pub id: String,
    pub livemode: bool,
    pub name: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub external_customer_id: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// Reminders in English (`en`) or Nepali (`ne`).
    pub locale: Locale,
    /// The sandbox test clock the customer is on (`clock_…`), or null.
    pub test_clock_id: Option<String>,
    /// Paisa of credit applied to the customer's next invoices before
    /// payment (`POST /v1/billing/customers/{id}/credit`).
    pub credit_balance: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl CustomerView {
    pub fn of(c: &Customer) -> Self {
        CustomerView {
            id: c.id.to_string(),
            livemode: c.mode.is_live(),
            name: c.name.clone(),
            email: c.email.clone(),
            phone: c.phone.clone(),
            external_customer_id: c.external_customer_id.clone(),
            metadata: c.metadata.clone(),
            locale: c.locale,
            test_clock_id: c.test_clock_id.as_ref().map(ToString::to_string),
            credit_balance: c.credit_balance,
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

/// `POST /v1/billing/customers` (the SDK's `CreateCustomerParams`, and
/// our `locale`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateBillingCustomer)]
pub struct CreateCustomer {
    pub name: String,
    #[serde(default, deserialize_with = "or_null")]
    pub email: Option<String>,
    #[serde(default, deserialize_with = "or_null")]
    pub phone: Option<String>,
    #[serde(default, deserialize_with = "or_null")]
    pub external_customer_id: Option<String>,
    #[serde(default, deserialize_with = "or_null")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub locale: Option<Locale>,
    /// Sandbox only: the tenant's test clock (`clock_…`) the customer, and
    /// every subscription of theirs, lives by. Set at creation only.
    #[serde(default, deserialize_with = "or_null")]
    pub test_clock_id: Option<String>,
}

/// `PATCH /v1/billing/customers/{id}`: only the keys sent change; `null`
/// clears a nullable one.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = UpdateBillingCustomer)]
pub struct UpdateCustomer {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub email: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub phone: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub external_customer_id: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Option<Map<String, Value>>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub locale: Option<Locale>,
}

/// A text field: trimmed, not empty, at most `max` characters.
pub fn text(field: &str, raw: &str, max: usize) -> Result<String, BillingError> {
    let t = raw.trim();
    if t.is_empty() {
        return Err(invalid(field, format!("{field} must not be empty")));
    }
    if t.chars().count() > max || t.chars().any(char::is_control) {
        return Err(invalid(
            field,
            format!("{field} must be at most {max} characters, without control characters"),
        ));
    }
    Ok(t.to_owned())
}

fn email(raw: &str) -> Result<String, BillingError> {
    let e = raw.trim();
    if is_plausible_email(e) {
        Ok(e.to_owned())
    } else {
        Err(invalid("email", "email must be an email address, or null"))
    }
}

fn phone(raw: &str) -> Result<String, BillingError> {
    normalize_phone(raw).ok_or_else(|| {
        invalid(
            "phone",
            "phone must be a Nepali mobile number: 10 digits starting 97 or 98, optionally prefixed +977",
        )
    })
}

pub fn metadata(m: Map<String, Value>) -> Result<Map<String, Value>, BillingError> {
    check_metadata(&m)?;
    Ok(m)
}

/// The customer a create makes (checked; not stored yet).
pub fn new_customer(
    tenant: &Tenant,
    body: CreateCustomer,
    now: Timestamp,
) -> Result<Customer, BillingError> {
    Ok(Customer {
        id: CustomerId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        name: text("name", &body.name, MAX_NAME)?,
        email: body.email.as_deref().map(email).transpose()?,
        phone: body.phone.as_deref().map(phone).transpose()?,
        external_customer_id: body
            .external_customer_id
            .as_deref()
            .map(|x| text("externalCustomerId", x, MAX_EXTERNAL_ID))
            .transpose()?,
        metadata: metadata(body.metadata.unwrap_or_default())?,
        locale: body.locale.unwrap_or_default(),
        open_subscriptions: 0,
        credit_balance: 0,
        credit_entries: 0,
        test_clock_id: body
            .test_clock_id
            .as_deref()
            .map(|raw| {
                TestClockId::parse(raw.trim())
                    .ok_or_else(|| invalid("testClockId", format!("No such test clock: '{raw}'")))
            })
            .transpose()?,
        created_at: now,
        updated_at: now,
        counted: true,
    })
}

/// Creates a customer. With the request's idempotency `fence`, a retry
/// after a lost answer finds the first one.
pub async fn create(
    deps: &Deps,
    tenant: &Tenant,
    body: CreateCustomer,
    fence: Option<&Fence>,
) -> Result<Customer, BillingError> {
    let customer = new_customer(tenant, body, deps.clock.now())?;
    // Counted in its list in the same transaction (after the fence: a
    // retry of the request trips the fence, not a counter).
    let mut tries = 0;
    loop {
        let put = customer.put_new()?;
        let counts = customer.count_new();
        match Fence::put_once_with(fence, &*deps.store, put, customer.id.as_str(), counts).await {
            Ok(None) => return Ok(customer),
            Ok(Some(first)) => return get(deps, tenant, &CustomerId::stored(first)).await,
            // A concurrent insert wrote a counter shard: try again.
            Err(e) if counted::is_conflict(&e) && tries < 10 => {
                tries += 1;
                crate::store::contention_backoff(tries).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The customer `id` of the tenant (another project's or mode's: not found).
pub async fn get(deps: &Deps, tenant: &Tenant, id: &CustomerId) -> Result<Customer, BillingError> {
    match crate::domain::record::get(&*deps.store, &Customer::key(tenant, id)).await? {
        Some(c) => Ok(c),
        None => Err(BillingError::NotFound {
            what: "customer",
            named: id.to_string(),
        }),
    }
}

/// A page of customers, newest first, and the total: of the partition
/// without `search` (counted: any page at a bounded cost, the total from
/// the counters); with it, of the matches among the newest
/// [`SEARCH_SCAN`] customers (name, email, phone, external id; any case),
/// `page * limit` at most [`MAX_WINDOW`].
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    page: PageRequest,
    search: Option<&str>,
) -> Result<(Vec<Customer>, u64), BillingError> {
    let store = &*deps.store;
    let Some(search) = search else {
        let covered = counted::covered(store, tenant, CountedKind::Customers).await?;
        let list = Customer::counted_list_of(tenant);
        let window = Window::at(page.offset(), page.limit);
        let (found, total, _) = counted::page(store, &list, &window, covered).await?;
        return Ok((found, total));
    };
    let page = page.windowed()?;
    let query = Query::partition(Customer::partition(tenant)).backward();
    if search.chars().count() > MAX_SEARCH {
        return Err(invalid(
            "search",
            format!("search must be at most {MAX_SEARCH} characters"),
        ));
    }
    let needle = search.trim().to_lowercase();
    let read = crate::store::query_window(store, &query, 0, SEARCH_SCAN).await?;
    let mut matched = Vec::new();
    for item in read {
        let c: Customer = from_item(item)?;
        if c.matches(&needle) {
            matched.push(c);
        }
    }
    let total = matched.len() as u64;
    let found = matched
        .into_iter()
        .skip(page.offset())
        .take(page.limit)
        .collect();
    Ok((found, total))
}

/// The changes a PATCH makes (checked; `updated_at` included).
pub fn changes(body: UpdateCustomer, now: Timestamp) -> Result<Changes<Customer>, BillingError> {
    let mut c = Changes::<Customer>::new();
    if let Some(name) = &body.name {
        c = c.set(Customer::NAME, &text("name", name, MAX_NAME)?);
    }
    c = match body.email {
        Some(Some(e)) => c.set_some(Customer::EMAIL, &email(&e)?),
        Some(None) => c.remove(Customer::EMAIL),
        None => c,
    };
    c = match body.phone {
        Some(Some(p)) => c.set_some(Customer::PHONE, &phone(&p)?),
        Some(None) => c.remove(Customer::PHONE),
        None => c,
    };
    c = match body.external_customer_id {
        Some(Some(x)) => c.set_some(
            Customer::EXTERNAL_CUSTOMER_ID,
            &text("externalCustomerId", &x, MAX_EXTERNAL_ID)?,
        ),
        Some(None) => c.remove(Customer::EXTERNAL_CUSTOMER_ID),
        None => c,
    };
    if let Some(m) = body.metadata {
        c = c.set(Customer::METADATA, &metadata(m.unwrap_or_default())?);
    }
    if let Some(locale) = body.locale {
        c = c.set(Customer::LOCALE, &locale);
    }
    Ok(c.set(Customer::UPDATED_AT, &now))
}

/// Changes the keys sent; answers the customer as written.
pub async fn update(
    deps: &Deps,
    tenant: &Tenant,
    id: &CustomerId,
    body: UpdateCustomer,
) -> Result<Customer, BillingError> {
    let update = changes(body, deps.clock.now())?;
    match deps
        .store
        .update(
            &Customer::key(tenant, id),
            update.into(),
            Some(Cond::Exists),
        )
        .await
    {
        Ok(item) => Ok(from_item(item)?),
        Err(e) if e.is_condition_failure() => Err(BillingError::NotFound {
            what: "customer",
            named: id.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the customer, unless a subscription of theirs has not ended
/// (`open_subscriptions` above 0, in the same conditional delete: a
/// subscription created at the same moment either lands first and stops
/// the delete, or finds no customer).
pub async fn delete(deps: &Deps, tenant: &Tenant, id: &CustomerId) -> Result<(), BillingError> {
    let store = &*deps.store;
    let key = Customer::key(tenant, id);
    let none_open = Cond::Or(vec![
        Customer::OPEN_SUBSCRIPTIONS.missing(),
        Customer::OPEN_SUBSCRIPTIONS.eq(&0),
    ]);
    let mut customer = get(deps, tenant, id).await?;
    // Out of its list, out of its counters: counted as read (the lists
    // migration may count it meanwhile, or a counter shard race: read
    // again).
    for tries in 1..=10 {
        let (is_counted, counts) = if customer.counted {
            (
                Customer::COUNTED.eq(&true),
                customer
                    .counted_list_of_self()
                    .count_gone(customer.id.as_str(), customer.created_at),
            )
        } else {
            (Customer::COUNTED.missing(), Vec::new())
        };
        let op = TxOp::Delete {
            key: key.clone(),
            cond: Some(Cond::And(vec![Cond::Exists, none_open.clone(), is_counted])),
        };
        match crate::store::write_with(store, op, counts).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_condition_failure() || counted::is_conflict(&e) => {
                // Which condition: gone, still subscribed, or counted
                // meanwhile.
                let fresh = get(deps, tenant, id).await?;
                if fresh.counted == customer.counted && !counted::is_conflict(&e) {
                    return Err(BillingError::HasSubscriptions(id.to_string()));
                }
                customer = fresh;
                crate::store::contention_backoff(tries).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BillingError::Store(StoreError::Unavailable(
        "the customer kept changing; retry".into(),
    )))
}

/// The deep pages of its counted list (a `tests.rs` of its own).
#[cfg(test)]
mod deep {
    mod tests;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::{
        BillingError, CreateCustomer, Customer, Locale, MAX_WINDOW, PageRequest, UpdateCustomer,
        create, delete, get, list, update,
    };
    use crate::domain::record::Record;
    use crate::domain::{Mode, Tenant};
    use crate::ids::{CustomerId, ProjectId};
    use crate::refusal::Refusal;
    use crate::store::Store;
    use crate::testenv::memory_store;
    use crate::time::{Clock, SystemClock};

    fn deps(store: &Arc<dyn Store>) -> crate::AppState {
        crate::AppState::new(
            store.clone(),
            Arc::new(SystemClock),
            crate::Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
    }

    fn tenant(p: &str) -> Tenant {
        Tenant::new(ProjectId::stored(p), Mode::Sandbox)
    }

    fn body(v: serde_json::Value) -> CreateCustomer {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    fn field_of(e: BillingError) -> String {
        Refusal::from(e).field.unwrap_or_default()
    }

    #[test]
    fn bad_input_names_its_field() {
        let t = tenant("p1");
        let now = SystemClock.now();
        for (v, field) in [
            (json!({"name": "  "}), "name"),
            (json!({"name": "A", "email": "not-an-email"}), "email"),
            (json!({"name": "A", "phone": "12345"}), "phone"),
            (json!({"name": "A", "phone": "+1 555 0100"}), "phone"),
            (
                json!({"name": "A", "externalCustomerId": ""}),
                "externalCustomerId",
            ),
            (
                json!({"name": "A", "metadata": {"k": {"nested": 1}}}),
                "metadata.k",
            ),
            (json!({"name": "x".repeat(201)}), "name"),
        ] {
            match super::new_customer(&t, body(v.clone()), now) {
                Err(e) => assert_eq!(field_of(e), field, "{v}"),
                Ok(_) => panic!("accepted {v}"),
            }
        }
        let ok = super::new_customer(
            &t,
            body(
                json!({"name": " Sita ", "email": "sita@example.com", "phone": "+977 980-0000001"}),
            ),
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.name, "Sita");
        assert_eq!(ok.phone.as_deref(), Some("9800000001"));
        assert_eq!(ok.locale, Locale::En);
        assert!(ok.id.as_str().starts_with("cus_"));
    }

    #[test]
    fn pages_are_bounded() {
        assert_eq!(
            PageRequest::parse(None, None).ok(),
            Some(PageRequest { page: 1, limit: 50 })
        );
        for (page, limit, field) in [
            (Some("0"), None, "page"),
            (Some("x"), None, "page"),
            (None, Some("101"), "limit"),
            (None, Some("0"), "limit"),
            (Some("101"), Some("100"), "page"),
        ] {
            match PageRequest::parse(page, limit) {
                Err(e) => assert_eq!(field_of(e), field),
                Ok(p) => panic!("accepted {p:?}"),
            }
        }
        assert!(PageRequest::parse(Some("100"), Some("100")).is_ok());
        assert_eq!(MAX_WINDOW, 100 * 100);
    }

    #[tokio::test]
    async fn create_list_search_update_delete() {
        let store = memory_store();
        let d = deps(&store);
        let t = tenant("p1");
        let mut ids = Vec::new();
        for (name, email, ext) in [
            ("Sita Rai", "sita@example.com", "u1"),
            ("Ram Thapa", "ram@example.com", "U2"),
            ("Gita Rai", "gita@shop.np", "u3"),
        ] {
            let c = create(
                &d,
                &t,
                body(json!({"name": name, "email": email, "externalCustomerId": ext})),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            ids.push(c.id);
        }
        let page = PageRequest { page: 1, limit: 2 };
        let (found, total) = list(&d, &t, page, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(total, 3);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].id, ids[2], "newest first");
        let all = PageRequest { page: 1, limit: 50 };
        let (rai, n) = list(&d, &t, all, Some("RAI"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n, 2);
        assert!(rai.iter().all(|c| c.name.ends_with("Rai")));
        let (u2, _) = list(&d, &t, all, Some("u2"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u2.len(), 1);
        let (shop, _) = list(&d, &t, all, Some("shop.np"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shop[0].id, ids[2]);
        // Another project sees none of them.
        let (none, n) = list(&d, &tenant("p2"), all, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(none.is_empty() && n == 0);
        assert!(matches!(
            get(&d, &tenant("p2"), &ids[0]).await,
            Err(BillingError::NotFound { .. })
        ));

        let patch: UpdateCustomer =
            serde_json::from_value(json!({"email": null, "phone": "9811111111", "locale": "ne"}))
                .unwrap_or_else(|e| panic!("{e}"));
        let c = update(&d, &t, &ids[0], patch)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.email, None);
        assert_eq!(c.phone.as_deref(), Some("9811111111"));
        assert_eq!(c.locale, Locale::Ne);
        assert_eq!(c.name, "Sita Rai");
        let unknown = serde_json::from_value::<UpdateCustomer>(json!({"credit": 5}));
        assert!(unknown.is_err(), "unknown fields are refused");

        delete(&d, &t, &ids[1])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            delete(&d, &t, &ids[1]).await,
            Err(BillingError::NotFound { .. })
        ));
        assert!(matches!(
            delete(&d, &t, &CustomerId::new()).await,
            Err(BillingError::NotFound { .. })
        ));
    }

    /// The hook the subscription code keeps: a customer with a
    /// subscription not ended is not deleted (409), whoever asks.
    #[tokio::test]
    async fn a_customer_with_an_open_subscription_is_not_deleted() {
        let store = memory_store();
        let d = deps(&store);
        let t = tenant("p1");
        let c = create(&d, &t, body(json!({"name": "Sita"})), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // As the subscription code will write it.
        let subscribed = Customer {
            open_subscriptions: 1,
            ..c.clone()
        };
        let item = subscribed.to_item().unwrap_or_else(|e| panic!("{e}"));
        store
            .put(item, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let refused = delete(&d, &t, &c.id).await;
        let Err(e @ BillingError::HasSubscriptions(_)) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(Refusal::from(e).code, "customer_has_subscriptions");
        assert!(get(&d, &t, &c.id).await.is_ok(), "still there");
        let ended = Customer {
            open_subscriptions: 0,
            ..c.clone()
        };
        store
            .put(ended.to_item().unwrap_or_else(|e| panic!("{e}")), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        delete(&d, &t, &c.id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
