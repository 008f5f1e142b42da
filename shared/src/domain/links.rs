//! Payment links (spec "Payment link", decisions "Payment links"):
//! reusable hosted pages that shops share, with a fixed amount or one the
//! customer enters between bounds.
//!
//! Stored at `LNK#<id>` / `LNK`, listed per project and mode through
//! `gsi1` (`PROJ#<p>#<mode>#LNK`, newest first). `views` and `used_count`
//! are counters on the item (atomic `ADD`); `maxUses` can never be set
//! below `used_count` (a condition on the update), a used link can never be
//! deleted (a condition on the delete), and a cancel of an inactive link
//! changes nothing (a condition on `active`).

use crate::refusal::Refusal;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::checkout::{self, CheckoutError, MAX_AMOUNT_PAISA, StoredAddress, check_url};
use super::record::{from_item, to_item};
use super::{Mode, Provider};
use crate::fields::wire::{nullable, or_null};
use crate::fields::{
    AddressPart, Description, Email, HttpUrl, InactiveMessage, LinkTitle, OrEmpty, PersonName,
    Phone, ReferenceId, Rule,
};
use crate::ids::{self, IdKind};
use crate::keys;
use crate::money::{Currency, Paisa};
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Query, Store, StoreError, TxOp, Update};
use crate::time::Timestamp;

pub const DEFAULT_PAGE: usize = 25;
/// The smallest amount a customer may enter when the link sets none.
pub const DEFAULT_MIN_AMOUNT: i64 = 1000;

/// A stored link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PaymentLink {
    pub id: String,
    pub project_id: String,
    pub mode: Mode,
    pub title: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub amount: Option<Paisa>,
    #[serde(default)]
    pub min_amount: Option<i64>,
    #[serde(default)]
    pub max_amount: Option<i64>,
    pub currency: Currency,
    #[serde(default)]
    pub provider: Option<Provider>,
    pub active: bool,
    #[serde(default)]
    pub max_uses: Option<i64>,
    #[serde(default)]
    pub used_count: i64,
    #[serde(default)]
    pub views: i64,
    /// Uses taken: completed payments plus attempts holding a use (a use
    /// is held from the moment a customer is sent to a provider until that
    /// attempt fails, is cancelled or its session expires).
    #[serde(default)]
    pub claimed: i64,
    /// When the last hold taken ends at the latest (its session's expiry):
    /// how long the page says to wait while every use is held.
    #[serde(default)]
    pub held_until: Option<Timestamp>,
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    #[serde(default)]
    pub redirect_url: Option<String>,
    #[serde(default)]
    pub inactive_message: Option<String>,
    #[serde(default)]
    pub customer_name: Option<String>,
    #[serde(default)]
    pub customer_email: Option<String>,
    #[serde(default)]
    pub customer_phone: Option<String>,
    #[serde(default)]
    pub collect_address: bool,
    #[serde(default)]
    pub customer_address: Option<StoredAddress>,
    #[serde(default)]
    pub reference_id: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl PaymentLink {
    pub fn key(id: &str) -> Key {
        keys::record(keys::Record::PaymentLink, id)
    }

    fn list_partition(project_id: &str, mode: Mode) -> String {
        keys::per_mode(project_id, mode, keys::PerMode::Links)
    }

    fn indexes(&self) -> [(Index, String, String); 1] {
        [(
            Index::Gsi1,
            PaymentLink::list_partition(&self.project_id, self.mode),
            self.id.clone(),
        )]
    }

    /// Why the link cannot take a payment at `now`, if it cannot.
    pub fn unusable(&self, now: Timestamp) -> Option<&'static str> {
        if !self.active {
            Some("inactive")
        } else if self.expires_at.is_some_and(|e| now >= e) {
            Some("expired")
        } else if self.max_uses.is_some_and(|m| self.used_count >= m) {
            Some("used up")
        } else {
            None
        }
    }

    /// While every remaining use is held by a customer at a provider (none
    /// used up): whole minutes, at least 1, until the holds end at the
    /// latest.
    pub fn held(&self, now: Timestamp) -> Option<i64> {
        let m = self.max_uses?;
        if self.used_count >= m || self.claimed < m {
            return None;
        }
        let until = self
            .held_until
            .unwrap_or(now.plus(checkout::SESSION_LIFETIME));
        let secs = (until.datetime() - now.datetime()).num_seconds();
        Some(((secs + 59) / 60).max(1))
    }
}

/// The page's words while every use of a link is held.
pub fn held_text(minutes: i64) -> String {
    let unit = if minutes == 1 { "minute" } else { "minutes" };
    format!(
        "This payment link is temporarily unavailable: every use is being paid \
         right now. Try again in {minutes} {unit}."
    )
}

/// The write taking one use of `link` (as read) for an attempt of a
/// session ending at `session_expires`: conditioned on a use being left
/// and `maxUses` unchanged.
pub fn claim_op(link: &PaymentLink, session_expires: Timestamp) -> TxOp {
    let room = below_max_uses(link.max_uses, "claimed");
    let until = link
        .held_until
        .filter(|h| *h > session_expires)
        .unwrap_or(session_expires);
    TxOp::Update {
        key: PaymentLink::key(&link.id),
        update: Update::new()
            .add("claimed", 1)
            .set("held_until", until.to_rfc3339()),
        cond: Some(Cond::And(vec![Cond::Exists, room])),
    }
}

/// The link's counter `attr` is below `max_uses` as read (and `maxUses`
/// unchanged, or still unlimited, when the write lands).
fn below_max_uses(max_uses: Option<i64>, attr: &str) -> Cond {
    match max_uses {
        None => Cond::Not(Box::new(Cond::ge("max_uses", 0))),
        Some(m) => Cond::And(vec![
            Cond::eq("max_uses", m),
            Cond::Or(vec![Cond::AttrNotExists(attr.into()), Cond::lt(attr, m)]),
        ]),
    }
}

/// `stats` of the single-link retrieve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkStats {
    pub views: i64,
    pub used_count: i64,
    pub conversion_rate: f64,
}

/// A link as the API shows it (camelCase; the address flattened into
/// `customerLine1`… as the spec writes it).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentLinkView {
    pub id: String,
    pub livemode: bool,
    pub mode: Mode,
    pub title: LinkTitle,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<Description>,
    pub amount: Option<Paisa>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_amount: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_amount: Option<i64>,
    pub currency: Currency,
    pub provider: Option<Provider>,
    pub active: bool,
    pub max_uses: Option<i64>,
    pub used_count: i64,
    pub expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect_url: Option<HttpUrl>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inactive_message: Option<InactiveMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_name: Option<PersonName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_email: Option<Email>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_phone: Option<Phone>,
    pub collect_address: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_line1: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_line2: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_city: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_state: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_postal_code: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_country: Option<AddressPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_id: Option<ReferenceId>,
    pub metadata: Map<String, Value>,
    pub url: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
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
            id: l.id,
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
#[derive(Clone, Debug, Default, Deserialize)]
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
    pub metadata: Option<Map<String, Value>>,
}

/// The body of `PATCH /v1/payment-links/{id}`: only the keys sent change.
#[derive(Clone, Debug, Default, Deserialize)]
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

fn invalid(field: &str, message: impl Into<String>) -> LinkError {
    LinkError::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// A text the merchant sent, trimmed; blank is none. Its rule (length,
/// characters) was kept when the request was parsed.
fn text(v: Option<impl Into<String>>) -> Option<String> {
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

fn max_uses(v: i64) -> Result<i64, LinkError> {
    if v < 1 {
        return Err(invalid("maxUses", "maxUses must be at least 1"));
    }
    Ok(v)
}

/// Checks a create request and builds the link.
pub fn new_link(
    project_id: &str,
    mode: Mode,
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
                Some(checkout::check_amount(a, req.provider, mode)?),
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
        check_url("redirectUrl", url, mode)?;
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
        id: ids::new_id(IdKind::PaymentLink),
        project_id: project_id.to_owned(),
        mode,
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
    })
}

/// Gives back a use an unpaid session held (its session ended).
pub fn release_op(link_id: &str) -> TxOp {
    TxOp::Update {
        key: PaymentLink::key(link_id),
        update: Update::new().add("claimed", -1),
        cond: Some(Cond::Exists),
    }
}

/// Stores a new link once per request: with the request's idempotency
/// fence in the same transaction, a retry whose first run committed gets
/// that run's link instead of a second one.
pub async fn insert_once(
    store: &dyn Store,
    link: &PaymentLink,
    fence: Option<&Fence>,
) -> Result<PaymentLink, StoreError> {
    let mut ops = vec![TxOp::Put {
        item: to_item(link, &PaymentLink::key(&link.id), &link.indexes())?,
        cond: Some(Cond::NotExists),
    }];
    if let Some(f) = fence {
        ops.push(f.op(&link.id));
    }
    match store.transact(ops).await {
        Ok(()) => Ok(link.clone()),
        Err(e) => match fence {
            Some(f) if Fence::tripped(&e, 1) => {
                let first = f.resource_id(store).await?.unwrap_or_default();
                get(store, &first)
                    .await?
                    .ok_or_else(|| StoreError::Backend(format!("fenced link {first} is missing")))
            }
            _ => Err(e),
        },
    }
}

/// Stores a new link.
pub async fn insert(store: &dyn Store, link: &PaymentLink) -> Result<(), StoreError> {
    let item = to_item(link, &PaymentLink::key(&link.id), &link.indexes())?;
    store.put(item, Some(Cond::NotExists)).await
}

/// The link `id` of any project (the public page knows it by id alone).
pub async fn get(store: &dyn Store, id: &str) -> Result<Option<PaymentLink>, StoreError> {
    if !ids::is_valid(id, IdKind::PaymentLink) {
        return Ok(None);
    }
    match store.get(&PaymentLink::key(id)).await? {
        Some(item) => from_item(item).map(Some),
        None => Ok(None),
    }
}

/// The link `id` of `project_id` in `mode`, else `None`.
pub async fn find(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<Option<PaymentLink>, StoreError> {
    Ok(get(store, id)
        .await?
        .filter(|l| l.project_id == project_id && l.mode == mode))
}

/// A page of the project's links in `mode`, newest first, optionally only
/// active or inactive ones, and the total.
pub async fn list(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    active: Option<bool>,
    offset: usize,
    limit: usize,
) -> Result<(Vec<PaymentLink>, u64), StoreError> {
    let mut query = Query::partition(PaymentLink::list_partition(project_id, mode))
        .on(Index::Gsi1)
        .backward();
    if let Some(a) = active {
        query = query.filter(Cond::eq("active", a));
    }
    super::record::page_of(store, &query, offset, limit).await
}

/// Applies `patch` to the link (only the keys sent), atomically: `maxUses`
/// below the use count at the moment of the write is refused.
pub async fn patch(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
    patch: PatchLink,
    now: Timestamp,
) -> Result<PaymentLink, LinkError> {
    // Address parts are written with the rest of the address as read: a
    // concurrent edit in between means read again.
    for _ in 0..4 {
        if let Some(link) = patch_once(store, project_id, mode, id, patch.clone(), now).await? {
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
    project_id: &str,
    mode: Mode,
    id: &str,
    patch: PatchLink,
    now: Timestamp,
) -> Result<Option<PaymentLink>, LinkError> {
    let link = find(store, project_id, mode, id)
        .await?
        .ok_or_else(|| LinkError::NotFound(id.to_owned()))?;
    let mut update = Update::new().set("updated_at", now.to_rfc3339());
    let set_opt = |update: Update, attr: &str, v: Option<String>| match v {
        Some(s) => update.set(attr, s),
        None => update.set(attr, Value::Null),
    };
    if let Some(t) = not_null("title", patch.title)? {
        let t = text(Some(t)).ok_or_else(|| invalid("title", "title must not be empty"))?;
        update = update.set("title", t);
    }
    if let Some(d) = not_null("description", patch.description)? {
        update = set_opt(update, "description", text(Some(d)));
    }
    if let Some(a) = not_null("active", patch.active)? {
        update = update.set("active", a);
    }
    if let Some(m) = not_null("inactiveMessage", patch.inactive_message)? {
        update = set_opt(update, "inactive_message", text(Some(m)));
    }
    if let Some(e) = patch.expires_at {
        let e = match e {
            Some(v) => Some(future_time("expiresAt", &v, now)?.to_rfc3339()),
            None => None,
        };
        update = set_opt(update, "expires_at", e);
    }
    let mut cond = vec![Cond::Exists];
    match patch.max_uses {
        None => {}
        // null: unlimited.
        Some(None) => update = update.remove("max_uses"),
        Some(Some(m)) => {
            let m = max_uses(m)?;
            if m < link.used_count {
                return Err(below_use_count(link.used_count));
            }
            update = update.set("max_uses", m);
            cond.push(Cond::Or(vec![
                Cond::AttrNotExists("used_count".into()),
                Cond::le("used_count", m),
            ]));
        }
    }
    if let Some(u) = patch.redirect_url {
        if let Some(url) = &u {
            check_url("redirectUrl", url, mode)?;
        }
        update = set_opt(update, "redirect_url", u.map(String::from));
    }
    if let Some(r) = not_null("referenceId", patch.reference_id)? {
        update = set_opt(update, "reference_id", text(Some(r)));
    }
    if let Some(c) = not_null("collectAddress", patch.collect_address)? {
        update = update.set("collect_address", c);
    }
    // Pre-fills: a string sets, an empty string clears.
    if let Some(n) = not_null("customerName", patch.customer_name)? {
        update = set_opt(update, "customer_name", text(Some(n)));
    }
    if let Some(e) = not_null("customerEmail", patch.customer_email)? {
        let e = e.into_option().map(String::from);
        update = set_opt(update, "customer_email", e);
    }
    if let Some(p) = not_null("customerPhone", patch.customer_phone)? {
        let p = p.into_option().map(String::from);
        update = set_opt(update, "customer_phone", p);
    }
    let mut address = link.customer_address.clone().unwrap_or_default();
    let mut address_sent = false;
    for (field, sent, slot) in [
        ("customerLine1", patch.customer_line1, &mut address.line1),
        ("customerLine2", patch.customer_line2, &mut address.line2),
        ("customerCity", patch.customer_city, &mut address.city),
        ("customerState", patch.customer_state, &mut address.state),
        (
            "customerPostalCode",
            patch.customer_postal_code,
            &mut address.postal_code,
        ),
        (
            "customerCountry",
            patch.customer_country,
            &mut address.country,
        ),
    ] {
        if let Some(v) = not_null(field, sent)? {
            *slot = text(Some(v));
            address_sent = true;
        }
    }
    if address_sent {
        // The address is one attribute: written whole, on the version read.
        update = if address == StoredAddress::default() {
            update.remove("customer_address")
        } else {
            update.set(
                "customer_address",
                serde_json::to_value(&address).map_err(|e| StoreError::Backend(e.to_string()))?,
            )
        };
        cond.push(Cond::eq("updated_at", link.updated_at.to_rfc3339()));
    }
    match store
        .update(&PaymentLink::key(&link.id), update, Some(Cond::And(cond)))
        .await
    {
        Ok(item) => Ok(Some(from_item(item)?)),
        Err(StoreError::ConditionFailed) => match get(store, &link.id).await? {
            None => Err(LinkError::NotFound(id.to_owned())),
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

fn below_use_count(used: i64) -> LinkError {
    invalid(
        "maxUses",
        format!("maxUses cannot be set below the link's use count ({used})"),
    )
}

/// `POST /v1/payment-links/{id}/cancel`: active -> inactive; an inactive
/// link is refused (422 `link_inactive`).
pub async fn cancel(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
    now: Timestamp,
) -> Result<PaymentLink, LinkError> {
    let link = find(store, project_id, mode, id)
        .await?
        .ok_or_else(|| LinkError::NotFound(id.to_owned()))?;
    let update = Update::new()
        .set("active", false)
        .set("updated_at", now.to_rfc3339());
    match store
        .update(
            &PaymentLink::key(&link.id),
            update,
            Some(Cond::eq("active", true)),
        )
        .await
    {
        Ok(item) => Ok(from_item(item)?),
        Err(StoreError::ConditionFailed) => Err(LinkError::Inactive),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /v1/payment-links/{id}`: only a link never used (422
/// `link_used` otherwise).
pub async fn delete(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
) -> Result<String, LinkError> {
    let link = find(store, project_id, mode, id)
        .await?
        .ok_or_else(|| LinkError::NotFound(id.to_owned()))?;
    let unused = Cond::And(vec![
        Cond::Or(vec![
            Cond::AttrNotExists("used_count".into()),
            Cond::eq("used_count", 0),
        ]),
        Cond::Or(vec![
            Cond::AttrNotExists("claimed".into()),
            Cond::le("claimed", 0),
        ]),
    ]);
    match store
        .delete(
            &PaymentLink::key(&link.id),
            Some(Cond::And(vec![Cond::Exists, unused])),
        )
        .await
    {
        Ok(_) => Ok(link.id),
        Err(StoreError::ConditionFailed) => match get(store, &link.id).await? {
            Some(_) => Err(LinkError::Used),
            None => Err(LinkError::NotFound(id.to_owned())),
        },
        Err(e) => Err(e.into()),
    }
}

/// Why the public page could not open a checkout for a link.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("no such payment link")]
    NotFound,
    /// Inactive, expired or used up: the page shows this message.
    #[error("{0}")]
    Unusable(String),
    /// Every use is held by customers at a provider: try again in so many
    /// minutes.
    #[error("{}", held_text(*.0))]
    Held(i64),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the customer typed on the link page.
#[derive(Clone, Debug, Default)]
pub struct LinkCustomer {
    /// NPR as typed (`1500` or `1500.50`), for a link without a fixed amount.
    pub amount: Option<String>,
    pub name: Option<String>,
    pub email: Option<String>,
    pub phone: Option<String>,
}

/// What a customer typed on a link's page, trimmed (blank is none) and
/// held to the field's rule; when nothing was typed, the link's pre-fill
/// if it keeps the rule.
fn typed<T: Rule + Into<String>>(
    field: &str,
    typed: Option<String>,
    prefill: Option<&String>,
) -> Result<Option<String>, OpenError> {
    match typed {
        Some(v) => text(Some(v))
            .map(|v| T::parse(v).map(Into::into))
            .transpose()
            .map_err(|message| OpenError::Invalid {
                field: field.to_owned(),
                message: format!("{field} {message}"),
            }),
        // The link's own pre-fill: one stored before a stricter rule is
        // left out rather than refusing every customer of the link.
        None => Ok(text(prefill.cloned()).and_then(|p| T::parse(p).ok().map(Into::into))),
    }
}

/// The message a link shows when it cannot be used.
pub fn inactive_text(link: &PaymentLink) -> String {
    link.inactive_message
        .clone()
        .unwrap_or_else(|| "This payment link is no longer available.".into())
}

/// Counts one view of the public page (an atomic `ADD`).
pub async fn count_view(store: &dyn Store, id: &str) -> Result<(), StoreError> {
    match store
        .update(
            &PaymentLink::key(id),
            Update::new().add("views", 1),
            Some(Cond::Exists),
        )
        .await
    {
        Ok(_) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The amount of a payment through `link`: its fixed amount, or what the
/// customer typed, within the link's bounds and the provider's limits.
pub fn amount_for(link: &PaymentLink, typed: Option<&str>) -> Result<Paisa, OpenError> {
    let bad = |m: String| OpenError::Invalid {
        field: "amount".into(),
        message: m,
    };
    let paisa = match link.amount {
        Some(a) => a.get(),
        None => {
            let t = typed
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| bad("Enter an amount.".into()))?;
            crate::providers::amount::parse_rupees(t)
                .map_err(|_| {
                    bad(format!(
                        "{t:?} is not an amount in rupees (e.g. 1500 or 1500.50)"
                    ))
                })?
                .get()
        }
    };
    let (min, max) = (
        link.min_amount.unwrap_or(1),
        link.max_amount.unwrap_or(MAX_AMOUNT_PAISA),
    );
    if link.amount.is_none() && (paisa < min || paisa > max) {
        return Err(bad(format!(
            "Enter an amount from {} to {}.",
            Paisa::new(min).unwrap_or_default().display_npr(),
            Paisa::new(max).unwrap_or_default().display_npr()
        )));
    }
    checkout::check_amount(paisa, link.provider, link.mode).map_err(|e| match e {
        CheckoutError::Invalid { message, .. } => bad(message),
        CheckoutError::FonepaySandboxCap(m) => bad(m),
        other => bad(other.to_string()),
    })
}

/// Opens a checkout session for a customer of `link`. The session takes no
/// use of the link: its attempt does ([`claim_op`], in the attempt's
/// transaction), so opening the page again and again holds nothing. The
/// session is refused while the link is used up (checked in the same
/// transaction) or every use is held.
pub async fn open_session(
    store: &dyn Store,
    link_id: &str,
    customer: LinkCustomer,
    base: &str,
    now: Timestamp,
) -> Result<checkout::CheckoutSession, OpenError> {
    let link = get(store, link_id).await?.ok_or(OpenError::NotFound)?;
    if link.unusable(now).is_some() {
        return Err(OpenError::Unusable(inactive_text(&link)));
    }
    if let Some(minutes) = link.held(now) {
        return Err(OpenError::Held(minutes));
    }
    let amount = amount_for(&link, customer.amount.as_deref())?;
    let valid = checkout::ValidCheckout {
        amount,
        return_url: link
            .redirect_url
            .clone()
            .unwrap_or_else(|| format!("{base}/l/{}/thanks", link.id)),
        cancel_url: Some(format!("{base}/l/{}", link.id)),
        provider: link.provider,
        flow: checkout::Flow::Hosted,
        description: Some(link.title.clone()),
        metadata: link.metadata.clone(),
        customer_name: typed::<PersonName>(
            "customerName",
            customer.name,
            link.customer_name.as_ref(),
        )?,
        customer_email: typed::<Email>(
            "customerEmail",
            customer.email,
            link.customer_email.as_ref(),
        )?,
        customer_phone: typed::<Phone>(
            "customerPhone",
            customer.phone,
            link.customer_phone.as_ref(),
        )?,
        customer_address: link.customer_address.clone(),
        collect_address: link.collect_address,
    };
    let creator = checkout::Creator {
        project_id: link.project_id.clone(),
        mode: link.mode,
        api_key_id: format!("link:{}", link.id),
        spend_cap_paisa: None,
    };
    let mut session = checkout::new_session(&creator, valid, now);
    session.link_id = Some(link.id.clone());
    let left = below_max_uses(link.max_uses, "used_count");
    let mut ops = vec![
        TxOp::Check {
            key: PaymentLink::key(&link.id),
            cond: Cond::And(vec![Cond::Exists, Cond::eq("active", true), left]),
        },
        TxOp::Put {
            item: to_item(
                &session,
                &checkout::CheckoutSession::key(&session.id),
                &session.indexes(),
            )?,
            cond: Some(Cond::NotExists),
        },
    ];
    // The day's counters, in the same transaction.
    let mut tally = super::analytics::Tally::new();
    tally.session_created(&session);
    tally.apply_to(&mut ops)?;
    super::active::touch(store, &session.project_id, session.mode, now).await?;
    for attempt in 0..6u64 {
        match store.transact(ops.clone()).await {
            Ok(()) => return Ok(session),
            // Busy (views, other customers): try again.
            Err(StoreError::TransactionCanceled { reasons })
                if !reasons.contains(&crate::store::TxReason::ConditionFailed) =>
            {
                let pause = 5 + 10 * attempt + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            Err(StoreError::TransactionCanceled { .. }) => {
                let now_link = get(store, link_id).await?.ok_or(OpenError::NotFound)?;
                return Err(OpenError::Unusable(inactive_text(&now_link)));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Unavailable("the payment link is busy; try again".into()).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use serde_json::json;

    fn now() -> Timestamp {
        Timestamp::parse("2026-11-22T10:00:00Z").unwrap()
    }

    /// A create request, parsed as the API parses it: a field's rule
    /// ([`crate::fields`]) is kept or the error names the field's path.
    fn create(v: Value) -> Result<PaymentLink, LinkError> {
        let req: CreateLink = serde_path_to_error::deserialize(v)
            .map_err(|e| invalid(&e.path().to_string(), e.inner().to_string()))?;
        new_link("proj_1", Mode::Sandbox, req, now())
    }

    fn field(r: Result<PaymentLink, LinkError>) -> String {
        match r {
            Err(LinkError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn links_are_fixed_or_bounded_and_checked() {
        let fixed = create(json!({"title": "Momo box", "amount": 50000})).unwrap();
        assert_eq!(fixed.amount.map(Paisa::get), Some(50000));
        assert_eq!((fixed.min_amount, fixed.max_amount), (None, None));
        let open =
            create(json!({"title": "Donate", "minAmount": 10000, "maxAmount": 500000})).unwrap();
        assert_eq!(
            (open.amount, open.min_amount, open.max_amount),
            (None, Some(10000), Some(500000))
        );
        let defaults = create(json!({"title": "Tip jar"})).unwrap();
        assert_eq!(defaults.min_amount, Some(DEFAULT_MIN_AMOUNT));
        assert_eq!(field(create(json!({"title": ""}))), "title");
        assert_eq!(field(create(json!({"title": "x".repeat(101)}))), "title");
        assert_eq!(field(create(json!({"title": "a", "amount": 0}))), "amount");
        assert_eq!(
            field(create(json!({"title": "a", "amount": 5, "minAmount": 1}))),
            "amount"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "minAmount": 5000, "maxAmount": 10})
            )),
            "minAmount"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "amount": 500, "provider": "khalti"})
            )),
            "amount"
        );
        assert_eq!(
            field(create(json!({"title": "a", "maxUses": 0}))),
            "maxUses"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "expiresAt": "2026-11-22T09:00:00Z"})
            )),
            "expiresAt"
        );
        assert_eq!(
            field(create(json!({"title": "a", "expiresAt": "tomorrow"}))),
            "expiresAt"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "redirectUrl": "http://shop.example/x"})
            )),
            "redirectUrl"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "inactiveMessage": "x".repeat(301)})
            )),
            "inactiveMessage"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "referenceId": "x".repeat(101)})
            )),
            "referenceId"
        );
        assert_eq!(
            field(create(
                json!({"title": "a", "description": "x".repeat(501)})
            )),
            "description"
        );
        assert_eq!(field(create(json!({"title": "a", "bogus": 1}))), "bogus");
    }

    /// What a customer types is held to the rule; a link's own pre-fill
    /// that breaks today's rule (stored before it) is left out instead of
    /// refusing every customer.
    #[test]
    fn typed_details_are_checked_and_stale_prefills_dropped() {
        let stale = "call me".to_owned();
        let good = "9800000001".to_owned();
        assert!(matches!(
            typed::<Phone>("customerPhone", Some("call me".into()), Some(&good)),
            Err(OpenError::Invalid { ref field, .. }) if field == "customerPhone"
        ));
        assert_eq!(
            typed::<Phone>("customerPhone", None, Some(&stale)).ok(),
            Some(None)
        );
        assert_eq!(
            typed::<Phone>("customerPhone", None, Some(&good)).ok(),
            Some(Some(good.clone()))
        );
        assert_eq!(
            typed::<Phone>("customerPhone", Some("  ".into()), Some(&good)).ok(),
            Some(None),
            "a blank field clears the pre-fill"
        );
    }

    #[test]
    fn usability_and_stats() {
        let mut l = create(json!({"title": "a", "amount": 1000, "maxUses": 2})).unwrap();
        assert_eq!(l.unusable(now()), None);
        l.used_count = 2;
        assert_eq!(l.unusable(now()), Some("used up"));
        l.used_count = 1;
        l.expires_at = Some(now());
        assert_eq!(l.unusable(now()), Some("expired"));
        l.active = false;
        assert_eq!(l.unusable(now()), Some("inactive"));
        l.views = 4;
        let v = serde_json::to_value(PaymentLinkView::of(l.clone(), "https://pay.example", true))
            .unwrap();
        assert_eq!(
            v["stats"],
            json!({"views": 4, "used_count": 1, "conversion_rate": 0.25})
        );
        assert_eq!(v["url"], format!("https://pay.example/l/{}", l.id).as_str());
        let no_stats =
            serde_json::to_value(PaymentLinkView::of(l, "https://pay.example", false)).unwrap();
        assert!(no_stats.get("stats").is_none());
    }

    #[tokio::test]
    async fn a_fenced_create_that_committed_answers_its_first_link() {
        let store = EmbeddedStore::in_memory().unwrap();
        let fence = Fence::new(Key::new("IDEMFENCE#test", "FENCE"), 0);
        let first = create(json!({"title": "Once", "amount": 1000})).unwrap();
        let stored = insert_once(&store, &first, Some(&fence)).await.unwrap();
        assert_eq!(stored.id, first.id);
        // The retry built another link; the fence answers the first.
        let second = create(json!({"title": "Once", "amount": 1000})).unwrap();
        let again = insert_once(&store, &second, Some(&fence)).await.unwrap();
        assert_eq!(again.id, first.id);
        assert!(get(&store, &second.id).await.unwrap().is_none());
        let (_, total) = list(&store, "proj_1", Mode::Sandbox, None, 0, 10)
            .await
            .unwrap();
        assert_eq!(total, 1);
    }

    #[tokio::test]
    async fn an_opened_session_is_counted_on_its_day() {
        let store = EmbeddedStore::in_memory().unwrap();
        let l = create(json!({"title": "Momo box", "amount": 50000})).unwrap();
        insert(&store, &l).await.unwrap();
        for _ in 0..2 {
            open_session(
                &store,
                &l.id,
                LinkCustomer::default(),
                "https://pay.example",
                now(),
            )
            .await
            .unwrap();
        }
        let counted = crate::domain::analytics::day_totals(&store, "proj_1", Mode::Sandbox, now())
            .await
            .unwrap();
        assert_eq!(counted.get("sessions_created"), Some(&2));
    }

    #[tokio::test]
    async fn patch_cancel_and_delete_follow_the_rules() {
        let store = EmbeddedStore::in_memory().unwrap();
        let l = create(json!({"title": "Box", "amount": 1000, "description": "d"})).unwrap();
        insert(&store, &l).await.unwrap();
        let p: PatchLink =
            serde_json::from_value(json!({"title": "Big box", "description": "", "maxUses": 3}))
                .unwrap();
        let after = patch(&store, "proj_1", Mode::Sandbox, &l.id, p, now())
            .await
            .unwrap();
        assert_eq!(
            (
                after.title.as_str(),
                after.description.clone(),
                after.max_uses
            ),
            ("Big box", None, Some(3))
        );
        assert_eq!(after.amount, l.amount, "keys not sent stay");
        // maxUses null: unlimited again.
        let p: PatchLink = serde_json::from_value(json!({"maxUses": null})).unwrap();
        let after = patch(&store, "proj_1", Mode::Sandbox, &l.id, p, now())
            .await
            .unwrap();
        assert_eq!(after.max_uses, None);
        // Pre-fills: set one address part, keep the others; "" clears.
        let p: PatchLink = serde_json::from_value(json!({
            "customerName": "Sita", "customerEmail": "sita@example.com",
            "customerPhone": "9800000001", "customerCity": "Pokhara", "customerLine1": "Lakeside 4"
        }))
        .unwrap();
        let after = patch(&store, "proj_1", Mode::Sandbox, &l.id, p, now())
            .await
            .unwrap();
        assert_eq!(after.customer_name.as_deref(), Some("Sita"));
        assert_eq!(after.customer_email.as_deref(), Some("sita@example.com"));
        assert_eq!(after.customer_phone.as_deref(), Some("9800000001"));
        let a = after.customer_address.clone().unwrap_or_default();
        assert_eq!(
            (a.line1.as_deref(), a.city.as_deref()),
            (Some("Lakeside 4"), Some("Pokhara"))
        );
        let p: PatchLink =
            serde_json::from_value(json!({"customerCity": "", "customerEmail": ""})).unwrap();
        let after = patch(&store, "proj_1", Mode::Sandbox, &l.id, p, now())
            .await
            .unwrap();
        let a = after.customer_address.clone().unwrap_or_default();
        assert_eq!((a.line1.as_deref(), a.city), (Some("Lakeside 4"), None));
        assert_eq!(after.customer_email, None);
        let p: Result<PatchLink, _> =
            serde_path_to_error::deserialize(json!({"customerEmail": "not-an-email"}));
        assert_eq!(
            p.err().map(|e| e.path().to_string()).as_deref(),
            Some("customerEmail")
        );
        // Keys the contract does not type as nullable refuse null.
        for key in [
            "title",
            "description",
            "active",
            "inactiveMessage",
            "referenceId",
            "collectAddress",
            "customerName",
            "customerEmail",
            "customerPhone",
            "customerLine1",
            "customerLine2",
            "customerCity",
            "customerState",
            "customerPostalCode",
            "customerCountry",
        ] {
            let p: PatchLink = serde_json::from_value(json!({ key: null })).unwrap();
            assert!(
                matches!(patch(&store, "proj_1", Mode::Sandbox, &l.id, p, now()).await,
                    Err(LinkError::Invalid { ref field, .. }) if field == key),
                "{key}"
            );
        }
        // Two uses, then maxUses below them is refused.
        store
            .update(
                &PaymentLink::key(&l.id),
                Update::new().add("used_count", 2),
                None,
            )
            .await
            .unwrap();
        let p: PatchLink = serde_json::from_value(json!({"maxUses": 1})).unwrap();
        assert!(matches!(
            patch(&store, "proj_1", Mode::Sandbox, &l.id, p, now()).await,
            Err(LinkError::Invalid { field, .. }) if field == "maxUses"
        ));
        assert!(matches!(
            delete(&store, "proj_1", Mode::Sandbox, &l.id).await,
            Err(LinkError::Used)
        ));
        assert!(
            cancel(&store, "proj_1", Mode::Sandbox, &l.id, now())
                .await
                .is_ok()
        );
        assert!(matches!(
            cancel(&store, "proj_1", Mode::Sandbox, &l.id, now()).await,
            Err(LinkError::Inactive)
        ));
        // Another project sees nothing.
        assert!(matches!(
            cancel(&store, "proj_2", Mode::Sandbox, &l.id, now()).await,
            Err(LinkError::NotFound(_))
        ));
        let unused = create(json!({"title": "Unused"})).unwrap();
        insert(&store, &unused).await.unwrap();
        assert_eq!(
            delete(&store, "proj_1", Mode::Sandbox, &unused.id)
                .await
                .unwrap(),
            unused.id
        );
        assert!(get(&store, &unused.id).await.unwrap().is_none());
        let (active, total) = list(&store, "proj_1", Mode::Sandbox, Some(true), 0, 10)
            .await
            .unwrap();
        assert_eq!((active.len(), total), (0, 0));
        let (all, total) = list(&store, "proj_1", Mode::Sandbox, None, 0, 10)
            .await
            .unwrap();
        assert_eq!((all.len(), total), (1, 1));
    }
}
