//! The links API: the answer's shape, the create and patch bodies and their
//! rules, and create, read, list, patch, cancel and delete.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{DEFAULT_MIN_AMOUNT, PaymentLink};
use crate::app::Deps;
use crate::domain::checkout::{self, CheckoutError, MAX_AMOUNT_PAISA, StoredAddress, check_url};
use crate::domain::listing::counted;
use crate::domain::record::{Changes, Record, from_item};
use crate::domain::{Mode, Provider, Tenant, Window};
use crate::fields::wire::{nullable, or_null};
use crate::fields::{
    AddressPart, Description, Email, HttpUrl, InactiveMessage, LinkTitle, OrEmpty, PersonName,
    Phone, ReferenceId,
};
use crate::ids::LinkId;
use crate::money::{Currency, Paisa};
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Query, Store, StoreError, TxOp, update_with};
use crate::time::Timestamp;

/// `stats` of the single-link retrieve.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LinkStats {
    pub views: i64,
    pub used_count: i64,
    pub conversion_rate: f64,
}

/// A link as the API shows it (camelCase; the address flattened into
/// `customerLine1`… as the spec writes it).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = PaymentLink)]
pub struct PaymentLinkView {
    pub id: String,
    pub livemode: bool,
    pub mode: Mode,
    pub title: LinkTitle,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub description: Option<Description>,
    #[schema(required)]
    pub amount: Option<Paisa>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub min_amount: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_amount: Option<i64>,
    pub currency: Currency,
    #[schema(required)]
    pub provider: Option<Provider>,
    pub active: bool,
    #[schema(required)]
    pub max_uses: Option<i64>,
    pub used_count: i64,
    #[schema(required)]
    pub expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub redirect_url: Option<HttpUrl>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub inactive_message: Option<InactiveMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_name: Option<PersonName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_email: Option<Email>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_phone: Option<Phone>,
    pub collect_address: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_line1: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_line2: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_city: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_state: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_postal_code: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub customer_country: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reference_id: Option<ReferenceId>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub url: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub stats: Option<LinkStats>,
}

impl PaymentLinkView {
    /// The view of `l`, served from `base`; with `stats` on a retrieve.
    pub fn of(l: PaymentLink, base: &str, with_stats: bool) -> Self {
        let a = l.customer_address.clone().unwrap_or_default().view();
        let stats = with_stats.then(|| LinkStats {
            views: l.views,
            used_count: l.used_count,
            conversion_rate: if l.views > 0 {
                l.used_count as f64 / l.views as f64
            } else {
                0.0
            },
        });
        PaymentLinkView {
            livemode: l.mode.is_live(),
            url: format!("{base}/l/{}", l.id),
            id: l.id.into(),
            mode: l.mode,
            title: LinkTitle::stored(l.title),
            description: l.description.map(Description::stored),
            amount: l.amount,
            min_amount: l.min_amount,
            max_amount: l.max_amount,
            currency: l.currency,
            provider: l.provider,
            active: l.active,
            max_uses: l.max_uses,
            used_count: l.used_count,
            expires_at: l.expires_at,
            redirect_url: l.redirect_url.map(HttpUrl::stored),
            inactive_message: l.inactive_message.map(InactiveMessage::stored),
            customer_name: l.customer_name.map(PersonName::stored),
            customer_email: l.customer_email.map(Email::stored),
            customer_phone: l.customer_phone.map(Phone::stored),
            collect_address: l.collect_address,
            customer_line1: a.line1,
            customer_line2: a.line2,
            customer_city: a.city,
            customer_state: a.state,
            customer_postal_code: a.postal_code,
            customer_country: a.country,
            reference_id: l.reference_id.map(ReferenceId::stored),
            metadata: l.metadata,
            created_at: l.created_at,
            updated_at: l.updated_at,
            stats,
        }
    }
}

/// The body of `POST /v1/payment-links`. Unknown fields refused.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateLink {
    pub title: LinkTitle,
    #[serde(default)]
    pub description: Option<Description>,
    #[serde(default, deserialize_with = "or_null")]
    pub amount: Option<i64>,
    #[serde(default)]
    pub min_amount: Option<i64>,
    #[serde(default)]
    pub max_amount: Option<i64>,
    #[serde(default)]
    pub currency: Option<Currency>,
    #[serde(default, deserialize_with = "or_null")]
    pub provider: Option<Provider>,
    #[serde(default, deserialize_with = "or_null")]
    pub max_uses: Option<i64>,
    #[serde(default, deserialize_with = "or_null")]
    pub expires_at: Option<String>,
    #[serde(default)]
    pub redirect_url: Option<HttpUrl>,
    #[serde(default)]
    pub inactive_message: Option<InactiveMessage>,
    #[serde(default)]
    pub customer_name: Option<PersonName>,
    #[serde(default)]
    pub customer_email: Option<Email>,
    #[serde(default)]
    pub customer_phone: Option<OrEmpty<Phone>>,
    #[serde(default)]
    pub collect_address: Option<bool>,
    #[serde(default)]
    pub customer_line1: Option<AddressPart>,
    #[serde(default)]
    pub customer_line2: Option<AddressPart>,
    #[serde(default)]
    pub customer_city: Option<AddressPart>,
    #[serde(default)]
    pub customer_state: Option<AddressPart>,
    #[serde(default)]
    pub customer_postal_code: Option<AddressPart>,
    #[serde(default)]
    pub customer_country: Option<AddressPart>,
    #[serde(default)]
    pub reference_id: Option<ReferenceId>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// The body of `PATCH /v1/payment-links/{id}`: only the keys sent change.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchLink {
    #[serde(default, deserialize_with = "nullable")]
    pub title: Option<Option<LinkTitle>>,
    #[serde(default, deserialize_with = "nullable")]
    pub description: Option<Option<Description>>,
    #[serde(default, deserialize_with = "nullable")]
    pub active: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    pub inactive_message: Option<Option<InactiveMessage>>,
    #[serde(default, deserialize_with = "nullable")]
    pub expires_at: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub max_uses: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    pub redirect_url: Option<Option<HttpUrl>>,
    #[serde(default, deserialize_with = "nullable")]
    pub reference_id: Option<Option<ReferenceId>>,
    #[serde(default, deserialize_with = "nullable")]
    pub collect_address: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_name: Option<Option<PersonName>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_email: Option<Option<OrEmpty<Email>>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_phone: Option<Option<OrEmpty<Phone>>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_line1: Option<Option<AddressPart>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_line2: Option<Option<AddressPart>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_city: Option<Option<AddressPart>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_state: Option<Option<AddressPart>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_postal_code: Option<Option<AddressPart>>,
    #[serde(default, deserialize_with = "nullable")]
    pub customer_country: Option<Option<AddressPart>>,
}

/// A key that cannot be cleared was sent as `null`.
fn not_null<T>(field: &str, v: Option<Option<T>>) -> Result<Option<T>, LinkError> {
    match v {
        None => Ok(None),
        Some(Some(x)) => Ok(Some(x)),
        Some(None) => Err(invalid(field, format!("{field} cannot be null"))),
    }
}

/// Why a link operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("no such payment link: {0}")]
    NotFound(String),
    /// 422 `link_inactive`.
    #[error("the payment link is already inactive")]
    Inactive,
    /// 422 `link_used`.
    #[error(
        "the payment link has been used (or a customer is paying through it now); cancel it instead"
    )]
    Used,
    /// 403 `spend_cap_exceeded`: a customer could pay more through the
    /// link than the creating key may take in a month.
    #[error("{field}: above the key's spend cap of {cap} paisa")]
    SpendCapExceeded { field: &'static str, cap: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<LinkError> for Refusal {
    fn from(err: LinkError) -> Self {
        match err {
            LinkError::Invalid { field, message } => Refusal::invalid(field, message),
            LinkError::NotFound(id) => Refusal::not_found("payment link", &id),
            e @ LinkError::Inactive => Refusal::unprocessable("link_inactive", e.to_string()),
            e @ LinkError::Used => Refusal::unprocessable("link_used", e.to_string()),
            LinkError::SpendCapExceeded { field, cap } => Refusal::forbidden(
                "spend_cap_exceeded",
                format!(
                    "A customer could pay more than this key's spend cap of {cap} paisa through this link: set {field} to at most {cap}"
                ),
            )
            .at(field),
            LinkError::Store(e) => e.into(),
        }
    }
}

/// A key with a monthly spend cap creates only links whose largest
/// payment fits under it: a fixed `amount` at most the cap, or a
/// customer-entered amount whose `maxAmount` (given, since its default is
/// the providers' largest) is at most the cap. The link's sessions are
/// opened by customers, not by the key, so the cap bounds what one of them
/// can pay rather than counting them (a public page could otherwise use
/// the key's month up by opening sessions).
pub fn check_spend_cap(link: &PaymentLink, cap: Option<i64>) -> Result<(), LinkError> {
    let Some(cap) = cap else {
        return Ok(());
    };
    let (field, largest) = match (link.amount, link.max_amount) {
        (Some(a), _) => ("amount", a.get()),
        (None, Some(m)) => ("maxAmount", m),
        (None, None) => ("maxAmount", MAX_AMOUNT_PAISA),
    };
    if largest > cap {
        return Err(LinkError::SpendCapExceeded { field, cap });
    }
    Ok(())
}

impl From<CheckoutError> for LinkError {
    fn from(e: CheckoutError) -> Self {
        match e {
            CheckoutError::Invalid { field, message } => LinkError::Invalid { field, message },
            CheckoutError::FonepaySandboxCap(m) => LinkError::Invalid {
                field: "amount".into(),
                message: m,
            },
            CheckoutError::ProviderUnavailable(p) => LinkError::Invalid {
                field: "provider".into(),
                message: format!("{} is not enabled for this project", p.as_str()),
            },
            CheckoutError::SpendCapExceeded { cap } => LinkError::Invalid {
                field: "amount".into(),
                message: format!("over the spend cap of {cap} paisa"),
            },
            CheckoutError::Store(s) => LinkError::Store(s),
        }
    }
}

pub(super) fn invalid(field: &str, message: impl Into<String>) -> LinkError {
    LinkError::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// A text the merchant sent, trimmed; blank is none. Its rule (length,
/// characters) was kept when the request was parsed.
pub(super) fn text(v: Option<impl Into<String>>) -> Option<String> {
    v.map(|s| s.into().trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn future_time(field: &str, v: &str, now: Timestamp) -> Result<Timestamp, LinkError> {
    let t = Timestamp::parse(v).ok_or_else(|| {
        invalid(
            field,
            format!("{field} must be an ISO 8601 timestamp, e.g. 2026-12-31T18:00:00Z"),
        )
    })?;
    if t <= now {
        return Err(invalid(field, format!("{field} must be in the future")));
    }
    Ok(t)
}

pub(super) fn max_uses(v: i64) -> Result<i64, LinkError> {
    if v < 1 {
        return Err(invalid("maxUses", "maxUses must be at least 1"));
    }
    Ok(v)
}

/// Checks a create request and builds the link.
pub fn new_link(
    tenant: &Tenant,
    req: CreateLink,
    now: Timestamp,
) -> Result<PaymentLink, LinkError> {
    let title = text(Some(req.title)).ok_or_else(|| invalid("title", "title is required"))?;
    let (amount, min_amount, max_amount) = match req.amount {
        Some(a) => {
            if req.min_amount.is_some() || req.max_amount.is_some() {
                return Err(invalid(
                    "amount",
                    "give either a fixed amount or minAmount/maxAmount, not both",
                ));
            }
            (
                Some(checkout::check_amount(a, req.provider, tenant.mode)?),
                None,
                None,
            )
        }
        None => {
            let min = req.min_amount.unwrap_or(DEFAULT_MIN_AMOUNT);
            let max = req.max_amount.unwrap_or(MAX_AMOUNT_PAISA);
            if min < 1 {
                return Err(invalid("minAmount", "minAmount must be at least 1 paisa"));
            }
            if max > MAX_AMOUNT_PAISA {
                return Err(invalid(
                    "maxAmount",
                    format!("maxAmount must be at most {MAX_AMOUNT_PAISA} paisa"),
                ));
            }
            if min > max {
                return Err(invalid(
                    "minAmount",
                    "minAmount must not be above maxAmount",
                ));
            }
            (None, Some(min), Some(max))
        }
    };
    if let Some(url) = &req.redirect_url {
        check_url("redirectUrl", url, tenant.mode)?;
    }
    let expires_at = match &req.expires_at {
        Some(v) => Some(future_time("expiresAt", v, now)?),
        None => None,
    };
    let metadata = req.metadata.unwrap_or_default();
    checkout::check_metadata(&metadata)?;
    let address = StoredAddress {
        line1: text(req.customer_line1),
        line2: text(req.customer_line2),
        city: text(req.customer_city),
        state: text(req.customer_state),
        postal_code: text(req.customer_postal_code),
        country: text(req.customer_country),
    };
    Ok(PaymentLink {
        id: LinkId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        title,
        description: text(req.description),
        amount,
        min_amount,
        max_amount,
        currency: Currency::Npr,
        provider: req.provider,
        active: true,
        max_uses: req.max_uses.map(max_uses).transpose()?,
        used_count: 0,
        views: 0,
        claimed: 0,
        held_until: None,
        expires_at,
        redirect_url: req.redirect_url.map(String::from),
        inactive_message: text(req.inactive_message),
        customer_name: text(req.customer_name),
        customer_email: req.customer_email.map(String::from),
        customer_phone: req
            .customer_phone
            .and_then(OrEmpty::into_option)
            .map(String::from),
        collect_address: req.collect_address.unwrap_or(false),
        customer_address: (address != StoredAddress::default()).then_some(address),
        reference_id: text(req.reference_id),
        metadata,
        created_at: now,
        updated_at: now,
        counted: true,
        narrowed: true,
    })
}

/// Stores a new link once per request: with the request's idempotency
/// fence in the same transaction, a retry whose first run committed gets
/// that run's link instead of a second one.
/// `also` (the dashboard's audit entry) is written in the same transaction.
pub async fn insert_once(
    deps: &Deps,
    link: &PaymentLink,
    fence: Option<&Fence>,
    also: Vec<TxOp>,
) -> Result<PaymentLink, StoreError> {
    let store = &*deps.store;
    let mut also = also;
    also.extend(link.insert_counts());
    let mut tries = 0;
    let first = loop {
        match Fence::put_once_with(fence, store, link.put_new()?, &link.id, also.clone()).await {
            // A concurrent insert on the same counter shard.
            Err(e) if counted::is_conflict(&e) && tries < 8 => {
                tries += 1;
                crate::store::contention_backoff(tries).await;
            }
            other => break other?,
        }
    };
    match first {
        None => Ok(link.clone()),
        Some(first) => get_in(store, &LinkId::stored(first.as_str()))
            .await?
            .ok_or_else(|| StoreError::Backend(format!("fenced link {first} is missing"))),
    }
}

/// Stores a new link.
#[cfg(test)]
pub(super) async fn insert(store: &dyn Store, link: &PaymentLink) -> Result<(), StoreError> {
    let counts = match (link.counted, link.narrowed) {
        (_, true) => link.insert_counts(),
        (true, false) => PaymentLink::count_new(link),
        (false, false) => Vec::new(),
    };
    crate::store::write_with(store, link.put_new()?, counts).await
}

/// The link `id` of any project (the public page knows it by id alone).
pub async fn get(deps: &Deps, id: &LinkId) -> Result<Option<PaymentLink>, StoreError> {
    get_in(&*deps.store, id).await
}

/// [`get`] on a store (for the domain's own callers).
pub(crate) async fn get_in(
    store: &dyn Store,
    id: &LinkId,
) -> Result<Option<PaymentLink>, StoreError> {
    crate::domain::record::get(store, &PaymentLink::key(id)).await
}

/// The link `id` of the tenant, else `None`.
pub async fn find(
    deps: &Deps,
    tenant: &Tenant,
    id: &LinkId,
) -> Result<Option<PaymentLink>, StoreError> {
    find_in(&*deps.store, tenant, id).await
}

async fn find_in(
    store: &dyn Store,
    tenant: &Tenant,
    id: &LinkId,
) -> Result<Option<PaymentLink>, StoreError> {
    Ok(get_in(store, id)
        .await?
        .filter(|l| tenant.owns(&l.project_id, l.mode)))
}

/// A page of the project's links in `mode`, newest first, optionally only
/// active or inactive ones (the stored `active`: only a PATCH or a cancel
/// changes it; an expired or used-up link keeps it), and the total.
pub async fn list(
    deps: &Deps,
    tenant: &Tenant,
    active: Option<bool>,
    window: Window,
) -> Result<(Vec<PaymentLink>, u64), StoreError> {
    let store = &*deps.store;
    if active.is_none() {
        // Unfiltered: counted (once covered), any offset at a bounded cost.
        let covered = counted::covered(store, tenant, counted::CountedKind::Links).await?;
        let list = PaymentLink::counted_list_of(tenant);
        let (links, total, _) = counted::page(store, &list, &window, covered).await?;
        return Ok((links, total));
    }
    if let Some(a) = active {
        // Narrowed (once covered): any offset at a bounded cost.
        if counted::covered_narrowing(store, tenant, counted::Narrowing::LinksByActive).await? {
            let list = PaymentLink::by_active(tenant, a);
            let (links, total, _) = counted::page(store, &list, &window, true).await?;
            return Ok((links, total));
        }
    }
    let mut query = Query::partition(PaymentLink::list_partition(tenant))
        .on(Index::Gsi1)
        .backward();
    if let Some(a) = active {
        query = query.filter(PaymentLink::ACTIVE.eq(&a));
    }
    crate::domain::record::page_of(store, &query, window).await
}

/// Applies `patch` to the link (only the keys sent), atomically: `maxUses`
/// below the use count at the moment of the write is refused. `also` (the
/// dashboard's audit entry) is written in the same transaction.
pub async fn patch(
    deps: &Deps,
    tenant: &Tenant,
    id: &LinkId,
    patch: PatchLink,
    now: Timestamp,
    also: Vec<TxOp>,
) -> Result<PaymentLink, LinkError> {
    let store = &*deps.store;
    // Address parts are written with the rest of the address as read: a
    // concurrent edit in between means read again.
    for _ in 0..4 {
        if let Some(link) = patch_once(store, tenant, id, patch.clone(), now, also.clone()).await? {
            return Ok(link);
        }
    }
    Err(LinkError::Store(StoreError::Unavailable(
        "the payment link kept changing; retry".into(),
    )))
}

/// One try of [`patch`]; `None` when the link changed after it was read.
async fn patch_once(
    store: &dyn Store,
    tenant: &Tenant,
    id: &LinkId,
    mut patch: PatchLink,
    now: Timestamp,
    also: Vec<TxOp>,
) -> Result<Option<PaymentLink>, LinkError> {
    let link = find_in(store, tenant, id)
        .await?
        .ok_or_else(|| LinkError::NotFound(id.to_string()))?;
    let mut cond = vec![Cond::Exists];
    let mut also = also;
    let changes = Changes::<PaymentLink>::new().set(PaymentLink::UPDATED_AT, &now);
    let changes = match not_null("active", patch.active.take())? {
        // Its narrowed entry and counts move with it.
        Some(a) => {
            let change = link.active_change(a, changes);
            cond.push(change.cond);
            crate::domain::listing::merge_counts(&mut also, change.also);
            change.changes
        }
        None => changes,
    };
    let changes = patch_details(changes, &mut patch, now)?;
    let changes = patch_max_uses(changes, &link, patch.max_uses, &mut cond)?;
    let changes = patch_checkout_fields(changes, &mut patch, tenant.mode)?;
    let changes = patch_address(changes, &link, &mut patch, &mut cond)?;
    match update_with(
        store,
        &link.item_key(),
        changes.into(),
        Some(Cond::And(cond)),
        also,
    )
    .await
    {
        Ok(item) => Ok(Some(from_item(item)?)),
        // A counter item another write holds: try again.
        Err(e) if counted::is_conflict(&e) => Ok(None),
        Err(StoreError::ConditionFailed) => match get_in(store, &link.id).await? {
            None => Err(LinkError::NotFound(id.to_string())),
            Some(now_link) => match patch.max_uses {
                Some(Some(m)) if now_link.used_count > m => {
                    Err(below_use_count(now_link.used_count))
                }
                _ => Ok(None),
            },
        },
        Err(e) => Err(e.into()),
    }
}

/// The link's own details sent: title, description, inactive message and
/// expiry (`active` is [`PaymentLink::active_change`]'s) (a cleared one is stored as null).
fn patch_details(
    mut changes: Changes<PaymentLink>,
    patch: &mut PatchLink,
    now: Timestamp,
) -> Result<Changes<PaymentLink>, LinkError> {
    if let Some(t) = not_null("title", patch.title.take())? {
        let t = text(Some(t)).ok_or_else(|| invalid("title", "title must not be empty"))?;
        changes = changes.set(PaymentLink::TITLE, t.as_str());
    }
    if let Some(d) = not_null("description", patch.description.take())? {
        changes = changes.set(PaymentLink::DESCRIPTION, &text(Some(d)));
    }
    if let Some(m) = not_null("inactiveMessage", patch.inactive_message.take())? {
        changes = changes.set(PaymentLink::INACTIVE_MESSAGE, &text(Some(m)));
    }
    if let Some(e) = patch.expires_at.take() {
        let e = match e {
            Some(v) => Some(future_time("expiresAt", &v, now)?),
            None => None,
        };
        changes = changes.set(PaymentLink::EXPIRES_AT, &e);
    }
    Ok(changes)
}

/// `maxUses` sent: `null` is unlimited; a number may not be below the
/// link's use count, as read and (`cond`) at the write.
fn patch_max_uses(
    changes: Changes<PaymentLink>,
    link: &PaymentLink,
    sent: Option<Option<i64>>,
    cond: &mut Vec<Cond>,
) -> Result<Changes<PaymentLink>, LinkError> {
    match sent {
        None => Ok(changes),
        // null: unlimited.
        Some(None) => Ok(changes.remove(PaymentLink::MAX_USES)),
        Some(Some(m)) => {
            let m = max_uses(m)?;
            if m < link.used_count {
                return Err(below_use_count(link.used_count));
            }
            cond.push(Cond::Or(vec![
                PaymentLink::USED_COUNT.missing(),
                PaymentLink::USED_COUNT.le(&m),
            ]));
            Ok(changes.set_some(PaymentLink::MAX_USES, &m))
        }
    }
}

/// What the link's checkouts take from it, sent: the redirect, the
/// reference, whether to collect an address, and the customer pre-fills
/// (a string sets, an empty string clears).
fn patch_checkout_fields(
    mut changes: Changes<PaymentLink>,
    patch: &mut PatchLink,
    mode: Mode,
) -> Result<Changes<PaymentLink>, LinkError> {
    if let Some(u) = patch.redirect_url.take() {
        if let Some(url) = &u {
            check_url("redirectUrl", url, mode)?;
        }
        changes = changes.set(PaymentLink::REDIRECT_URL, &u.map(String::from));
    }
    if let Some(r) = not_null("referenceId", patch.reference_id.take())? {
        changes = changes.set(PaymentLink::REFERENCE_ID, &text(Some(r)));
    }
    if let Some(c) = not_null("collectAddress", patch.collect_address.take())? {
        changes = changes.set(PaymentLink::COLLECT_ADDRESS, &c);
    }
    // Pre-fills: a string sets, an empty string clears.
    if let Some(n) = not_null("customerName", patch.customer_name.take())? {
        changes = changes.set(PaymentLink::CUSTOMER_NAME, &text(Some(n)));
    }
    if let Some(e) = not_null("customerEmail", patch.customer_email.take())? {
        let e = e.into_option().map(String::from);
        changes = changes.set(PaymentLink::CUSTOMER_EMAIL, &e);
    }
    if let Some(p) = not_null("customerPhone", patch.customer_phone.take())? {
        let p = p.into_option().map(String::from);
        changes = changes.set(PaymentLink::CUSTOMER_PHONE, &p);
    }
    Ok(changes)
}

/// The customer address parts sent, over the address as read: the address
/// is one attribute, written whole on the version read (`cond`).
fn patch_address(
    changes: Changes<PaymentLink>,
    link: &PaymentLink,
    patch: &mut PatchLink,
    cond: &mut Vec<Cond>,
) -> Result<Changes<PaymentLink>, LinkError> {
    let mut address = link.customer_address.clone().unwrap_or_default();
    let mut address_sent = false;
    for (field, sent, slot) in [
        (
            "customerLine1",
            patch.customer_line1.take(),
            &mut address.line1,
        ),
        (
            "customerLine2",
            patch.customer_line2.take(),
            &mut address.line2,
        ),
        (
            "customerCity",
            patch.customer_city.take(),
            &mut address.city,
        ),
        (
            "customerState",
            patch.customer_state.take(),
            &mut address.state,
        ),
        (
            "customerPostalCode",
            patch.customer_postal_code.take(),
            &mut address.postal_code,
        ),
        (
            "customerCountry",
            patch.customer_country.take(),
            &mut address.country,
        ),
    ] {
        if let Some(v) = not_null(field, sent)? {
            *slot = text(Some(v));
            address_sent = true;
        }
    }
    if !address_sent {
        return Ok(changes);
    }
    cond.push(PaymentLink::UPDATED_AT.eq(&link.updated_at));
    if address == StoredAddress::default() {
        return Ok(changes.remove(PaymentLink::CUSTOMER_ADDRESS));
    }
    Ok(changes.set_some(PaymentLink::CUSTOMER_ADDRESS, &address))
}

fn below_use_count(used: i64) -> LinkError {
    invalid(
        "maxUses",
        format!("maxUses cannot be set below the link's use count ({used})"),
    )
}

/// `POST /v1/payment-links/{id}/cancel`: active -> inactive; an inactive
/// link is refused (422 `link_inactive`). `also` (the dashboard's audit
/// entry) is written in the same transaction.
pub async fn cancel(
    deps: &Deps,
    tenant: &Tenant,
    id: &LinkId,
    now: Timestamp,
    also: Vec<TxOp>,
) -> Result<PaymentLink, LinkError> {
    let store = &*deps.store;
    let mut link = find_in(store, tenant, id)
        .await?
        .ok_or_else(|| LinkError::NotFound(id.to_string()))?;
    for attempt in 0..6 {
        if !link.active {
            return Err(LinkError::Inactive);
        }
        let change = link.active_change(
            false,
            Changes::<PaymentLink>::new().set(PaymentLink::UPDATED_AT, &now),
        );
        let mut with = also.clone();
        crate::domain::listing::merge_counts(&mut with, change.also);
        match update_with(
            store,
            &link.item_key(),
            change.changes.into(),
            Some(change.cond),
            with,
        )
        .await
        {
            Ok(item) => return Ok(from_item(item)?),
            // Cancelled, or narrowed by the migration, meanwhile: as it
            // is now.
            Err(StoreError::ConditionFailed) => {
                link = get_in(store, &link.id)
                    .await?
                    .ok_or_else(|| LinkError::NotFound(id.to_string()))?;
            }
            Err(e) if counted::is_conflict(&e) => {
                crate::store::contention_backoff(attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(LinkError::Store(StoreError::Unavailable(
        "the payment link kept changing; retry".into(),
    )))
}

/// `DELETE /v1/payment-links/{id}`: only a link never used (422
/// `link_used` otherwise).
pub async fn delete(deps: &Deps, tenant: &Tenant, id: &LinkId) -> Result<LinkId, LinkError> {
    let store = &*deps.store;
    let mut link = find_in(store, tenant, id)
        .await?
        .ok_or_else(|| LinkError::NotFound(id.to_string()))?;
    let unused = Cond::And(vec![
        Cond::Or(vec![
            PaymentLink::USED_COUNT.missing(),
            PaymentLink::USED_COUNT.eq(&0),
        ]),
        Cond::Or(vec![
            PaymentLink::CLAIMED.missing(),
            PaymentLink::CLAIMED.le(&0),
        ]),
    ]);
    // Out of its list, out of its counters: counted as read (the lists
    // migration may count it meanwhile: then read again).
    for _ in 0..3 {
        let counted = if link.counted {
            PaymentLink::COUNTED.eq(&true)
        } else {
            PaymentLink::COUNTED.missing()
        };
        // Out of its narrowing too, as read (`active` and narrowed).
        let narrowed = if link.narrowed {
            Cond::And(vec![
                PaymentLink::NARROWED.exists(),
                PaymentLink::ACTIVE.eq(&link.active),
            ])
        } else {
            PaymentLink::NARROWED.missing()
        };
        let op = TxOp::Delete {
            key: link.item_key(),
            cond: Some(Cond::And(vec![
                Cond::Exists,
                unused.clone(),
                counted,
                narrowed,
            ])),
        };
        match crate::store::write_with(store, op, link.gone_counts()).await {
            Ok(()) => return Ok(link.id),
            Err(StoreError::ConditionFailed) => match get_in(store, &link.id).await? {
                Some(fresh)
                    if (fresh.counted, fresh.narrowed, fresh.active)
                        != (link.counted, link.narrowed, link.active) =>
                {
                    link = fresh
                }
                Some(_) => return Err(LinkError::Used),
                None => return Err(LinkError::NotFound(id.to_string())),
            },
            Err(e) => return Err(e.into()),
        }
    }
    Err(LinkError::Store(StoreError::Unavailable(
        "the payment link kept changing; retry".into(),
    )))
}
