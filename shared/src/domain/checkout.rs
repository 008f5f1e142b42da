//! Checkout sessions: what a merchant creates (`POST /v1/checkout`) so a
//! customer can pay on the hosted page or go straight to a provider.
//!
//! Stored at `CS#<id>` / `CS` (the hosted page and provider callbacks find
//! it by id alone) and listed through `gsi1` on `PROJ#<project>#<mode>#CS`,
//! newest first because ids sort by time.
//!
//! Rules (decisions.md, "Checkout sessions"):
//! - a session lives [`SESSION_LIFETIME`]; once `expires_at` passed, a
//!   `pending` or `initiated` session is `expired`: reads show it at once
//!   and persist it with a conditional update ([`find`]);
//! - `expire` moves `pending|initiated` to `expired` with a conditional
//!   write; a final session is answered unchanged;
//! - a key's `spend_cap_paisa` bounds the volume it creates per calendar
//!   month (UTC), enforced by a counter updated in the same transaction as
//!   the session insert, so concurrent creations cannot pass it.

use crate::refusal::Refusal;
use chrono::Datelike;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::credentials::list_configured_providers;
use super::record::{from_item, to_item};
use super::{Mode, Provider};
use crate::fields::{AddressPart, Description, Email, HttpUrl, PersonName, Phone};
use crate::ids::{self, IdKind};
use crate::keys;
use crate::money::{Currency, Paisa};
use crate::store::fence::Fence;
use crate::store::{
    Cond, Index, Key, Query, SkCond, Store, StoreError, TTL, TxOp, TxReason, Update,
};
use crate::time::Timestamp;

/// How long a session can be paid.
pub const SESSION_LIFETIME: chrono::Duration = chrono::Duration::minutes(30);
/// Upper bound of any session: NPR 10,00,000 (ten lakh).
pub const MAX_AMOUNT_PAISA: i64 = 100_000_000;
/// Khalti's minimum (Rs 10).
pub const KHALTI_MIN_AMOUNT_PAISA: i64 = crate::providers::khalti::MIN_AMOUNT_PAISA;
/// Sandbox fonepay moves real money: at most NPR 1,000 a payment.
pub const FONEPAY_SANDBOX_MAX_PAISA: i64 = super::account::SANDBOX_FONEPAY_MAX_PAYMENT_PAISA;
pub const MAX_METADATA_KEYS: usize = 50;
pub const MAX_METADATA_KEY_LEN: usize = 40;
pub const MAX_METADATA_VALUE_LEN: usize = 500;
/// Default page size of `GET /v1/sessions` (spec, Limits).
pub const DEFAULT_PAGE: usize = 25;
/// Tries of the create transaction when DynamoDB reports a conflict on the
/// spend counter (another creation of the same key at the same moment).
const CONFLICT_TRIES: usize = 4;

/// How the customer pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flow {
    /// Our hosted page; the customer picks a provider unless one is set.
    Hosted,
    /// Straight to the set provider.
    Redirect,
    /// Direct-QR (created by the QR endpoint, not `POST /v1/checkout`).
    Qr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Pending,
    Initiated,
    Success,
    Failed,
    Expired,
}

impl SessionStatus {
    pub const ALL: [SessionStatus; 5] = [
        SessionStatus::Pending,
        SessionStatus::Initiated,
        SessionStatus::Success,
        SessionStatus::Failed,
        SessionStatus::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Pending => "pending",
            SessionStatus::Initiated => "initiated",
            SessionStatus::Success => "success",
            SessionStatus::Failed => "failed",
            SessionStatus::Expired => "expired",
        }
    }

    /// The status named `s`; `None` for anything else (the list ignores it).
    pub fn parse(s: &str) -> Option<SessionStatus> {
        SessionStatus::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether nothing moves the session on any more.
    pub fn is_final(self) -> bool {
        !matches!(self, SessionStatus::Pending | SessionStatus::Initiated)
    }
}

/// The customer's address, pre-filled or collected. On the wire each part
/// is an [`AddressPart`] (the contract's rule); stored records and the
/// hosted page's form hold plain strings ([`StoredAddress`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Address<T = AddressPart> {
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub line1: Option<T>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub line2: Option<T>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub city: Option<T>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub state: Option<T>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub postal_code: Option<T>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub country: Option<T>,
}

/// An address as stored and as the hosted page's form sends it.
pub type StoredAddress = Address<String>;

fn none<T>() -> Option<T> {
    None
}

impl<T> Default for Address<T> {
    fn default() -> Self {
        Address {
            line1: None,
            line2: None,
            city: None,
            state: None,
            postal_code: None,
            country: None,
        }
    }
}

impl<T> Address<T> {
    /// Every part through `f`, each with its field name.
    pub fn try_map<U, E>(
        self,
        mut f: impl FnMut(&'static str, T) -> Result<U, E>,
    ) -> Result<Address<U>, E> {
        let mut part = |name: &'static str, v: Option<T>| v.map(|v| f(name, v)).transpose();
        Ok(Address {
            line1: part("line1", self.line1)?,
            line2: part("line2", self.line2)?,
            city: part("city", self.city)?,
            state: part("state", self.state)?,
            postal_code: part("postalCode", self.postal_code)?,
            country: part("country", self.country)?,
        })
    }
}

impl Address {
    /// The parts as stored.
    pub fn stored(self) -> StoredAddress {
        let Ok(a) = self.try_map(|_, v| Ok::<_, std::convert::Infallible>(v.into_string()));
        a
    }
}

impl StoredAddress {
    /// The parts as the API shows them (they kept the rule when written).
    pub fn view(self) -> Address {
        let Ok(a) = self.try_map(|_, v| Ok::<_, std::convert::Infallible>(AddressPart::stored(v)));
        a
    }
}

/// A stored checkout session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckoutSession {
    pub id: String,
    pub project_id: String,
    pub mode: Mode,
    /// The key that created it (its spend counter was charged).
    pub api_key_id: String,
    pub flow: Flow,
    pub amount: Paisa,
    pub currency: Currency,
    /// `None` while the customer picks on the hosted page.
    #[serde(default)]
    pub provider: Option<Provider>,
    pub status: SessionStatus,
    /// The current attempt's payment.
    #[serde(default)]
    pub payment_id: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
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
    pub return_url: String,
    #[serde(default)]
    pub cancel_url: Option<String>,
    pub expires_at: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Attempts started at providers (bounded per session).
    #[serde(default)]
    pub attempts: u32,
    /// The payment link the session was opened from.
    #[serde(default)]
    pub link_id: Option<String>,
    /// Whether the session holds one of its link's `maxUses` (released
    /// when it ends unpaid).
    #[serde(default)]
    pub link_claimed: bool,
    /// The one-time invoice the session collects for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invoice_id: Option<String>,
}

impl CheckoutSession {
    pub fn key(id: &str) -> Key {
        keys::record(keys::Record::CheckoutSession, id)
    }

    /// The item for this session, with its index keys.
    pub fn item(&self) -> Result<crate::store::Item, StoreError> {
        to_item(self, &CheckoutSession::key(&self.id), &self.indexes())
    }

    fn list_partition(project_id: &str, mode: Mode) -> String {
        keys::per_mode(project_id, mode, keys::PerMode::Sessions)
    }

    /// `gsi1`: the project's list; `gsi2` (sparse, while open): the
    /// sessions the scheduler expires, by `expires_at`.
    pub(crate) fn indexes(&self) -> Vec<(Index, String, String)> {
        let mut out = vec![(
            Index::Gsi1,
            CheckoutSession::list_partition(&self.project_id, self.mode),
            self.id.clone(),
        )];
        if !self.status.is_final() {
            out.push((
                Index::Gsi2,
                open_sessions_partition(&self.project_id, self.mode),
                format!("{}#{}", self.expires_at.to_rfc3339(), self.id),
            ));
        }
        out
    }

    /// The status as of `now`: an open session past `expires_at` is expired.
    pub fn status_at(&self, now: Timestamp) -> SessionStatus {
        if !self.status.is_final() && now >= self.expires_at {
            SessionStatus::Expired
        } else {
            self.status
        }
    }
}

/// A session as the API shows it (camelCase, as the spec writes it).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckoutSessionView {
    pub id: String,
    pub livemode: bool,
    pub mode: Mode,
    pub flow: Flow,
    pub amount: Paisa,
    pub currency: Currency,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    pub status: SessionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<Description>,
    pub metadata: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_name: Option<PersonName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_email: Option<Email>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_phone: Option<Phone>,
    pub collect_address: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_address: Option<Address>,
    pub expires_at: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl CheckoutSessionView {
    /// The view as of `now` (an open session past its time shows expired).
    pub fn at(s: CheckoutSession, now: Timestamp) -> Self {
        CheckoutSessionView {
            livemode: s.mode.is_live(),
            status: s.status_at(now),
            id: s.id,
            mode: s.mode,
            flow: s.flow,
            amount: s.amount,
            currency: s.currency,
            provider: s.provider,
            payment_id: s.payment_id,
            description: s.description.map(Description::stored),
            metadata: s.metadata,
            customer_name: s.customer_name.map(PersonName::stored),
            customer_email: s.customer_email.map(Email::stored),
            customer_phone: s.customer_phone.map(Phone::stored),
            collect_address: s.collect_address,
            customer_address: s.customer_address.map(StoredAddress::view),
            expires_at: s.expires_at,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// The body of `POST /v1/checkout` (decisions.md). Unknown fields refused.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateCheckout {
    pub amount: i64,
    pub return_url: HttpUrl,
    #[serde(default)]
    pub cancel_url: Option<HttpUrl>,
    #[serde(default)]
    pub provider: Option<Provider>,
    #[serde(default)]
    pub flow: Option<Flow>,
    #[serde(default)]
    pub currency: Option<Currency>,
    #[serde(default)]
    pub description: Option<Description>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub customer: Option<CustomerInput>,
    #[serde(default)]
    pub collect_address: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomerInput {
    #[serde(default)]
    pub name: Option<PersonName>,
    #[serde(default)]
    pub email: Option<Email>,
    #[serde(default)]
    pub phone: Option<Phone>,
    #[serde(default)]
    pub address: Option<Address>,
}

/// Why a checkout operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckoutError {
    /// A field breaks a rule (400 `validation_failed`).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// Sandbox fonepay over NPR 1,000 (422 `fonepay_sandbox_cap`).
    #[error("{0}")]
    FonepaySandboxCap(String),
    /// The project cannot take payments through the provider in this mode
    /// (422 `provider_unavailable`).
    #[error("provider {0:?} is not enabled")]
    ProviderUnavailable(Provider),
    /// The key's monthly spend cap would be passed (403 `spend_cap_exceeded`).
    #[error("spend cap of {cap} paisa exceeded")]
    SpendCapExceeded { cap: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<CheckoutError> for Refusal {
    fn from(err: CheckoutError) -> Self {
        match err {
            CheckoutError::Invalid { field, message } => Refusal::invalid(field, message),
            CheckoutError::FonepaySandboxCap(message) => {
                Refusal::unprocessable("fonepay_sandbox_cap", message).at("amount")
            }
            CheckoutError::ProviderUnavailable(p) => Refusal::unprocessable(
                "provider_unavailable",
                format!(
                    "{} is not enabled for this project in this mode; see GET /v1/providers",
                    p.as_str()
                ),
            )
            .at("provider"),
            CheckoutError::SpendCapExceeded { cap } => Refusal::forbidden(
                "spend_cap_exceeded",
                format!(
                    "This checkout would take the key's volume this month above its spend cap of {cap} paisa"
                ),
            ),
            CheckoutError::Store(e) => e.into(),
        }
    }
}

fn invalid(field: &str, message: impl Into<String>) -> CheckoutError {
    CheckoutError::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// The amounts a provider takes in a mode, in paisa (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AmountLimits {
    pub min: i64,
    pub max: i64,
}

/// Khalti: at least Rs 10; fonepay in sandbox: at most NPR 1,000 (real
/// money moves); everything at most [`MAX_AMOUNT_PAISA`].
pub fn amount_limits(provider: Provider, mode: Mode) -> AmountLimits {
    match (provider, mode) {
        (Provider::Khalti, _) => AmountLimits {
            min: KHALTI_MIN_AMOUNT_PAISA,
            max: MAX_AMOUNT_PAISA,
        },
        (Provider::Fonepay, Mode::Sandbox) => AmountLimits {
            min: 1,
            max: FONEPAY_SANDBOX_MAX_PAISA,
        },
        _ => AmountLimits {
            min: 1,
            max: MAX_AMOUNT_PAISA,
        },
    }
}

/// A create request that passed every rule.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidCheckout {
    pub amount: Paisa,
    pub return_url: String,
    pub cancel_url: Option<String>,
    pub provider: Option<Provider>,
    pub flow: Flow,
    pub description: Option<String>,
    pub metadata: Map<String, Value>,
    pub customer_name: Option<String>,
    pub customer_email: Option<String>,
    pub customer_phone: Option<String>,
    pub customer_address: Option<StoredAddress>,
    pub collect_address: bool,
}

/// Checks a create request against every rule (no store needed).
pub fn validate_create(req: CreateCheckout, mode: Mode) -> Result<ValidCheckout, CheckoutError> {
    let flow = req.flow.unwrap_or(Flow::Hosted);
    if flow == Flow::Qr {
        return Err(invalid(
            "flow",
            "flow must be 'hosted' or 'redirect'; QR sessions come from the Direct-QR endpoint",
        ));
    }
    if flow == Flow::Redirect && req.provider.is_none() {
        return Err(invalid(
            "provider",
            "provider is required when flow is 'redirect'",
        ));
    }
    let amount = check_amount(req.amount, req.provider, mode)?;
    check_url("returnUrl", &req.return_url, mode)?;
    if let Some(url) = &req.cancel_url {
        check_url("cancelUrl", url, mode)?;
    }
    let metadata = req.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let customer = req.customer.unwrap_or_default();
    Ok(ValidCheckout {
        amount,
        return_url: req.return_url.into_string(),
        cancel_url: req.cancel_url.map(String::from),
        provider: req.provider,
        flow,
        description: req.description.map(String::from),
        metadata,
        customer_name: customer.name.map(String::from),
        customer_email: customer.email.map(String::from),
        customer_phone: customer.phone.map(String::from),
        customer_address: customer.address.map(Address::stored),
        collect_address: req.collect_address.unwrap_or(false),
    })
}

/// `amount` > 0, at most [`MAX_AMOUNT_PAISA`], within the provider's limits.
pub fn check_amount(
    amount: i64,
    provider: Option<Provider>,
    mode: Mode,
) -> Result<Paisa, CheckoutError> {
    if amount <= 0 {
        return Err(invalid(
            "amount",
            format!("amount must be a positive integer of paisa, got {amount}"),
        ));
    }
    if amount > MAX_AMOUNT_PAISA {
        return Err(invalid(
            "amount",
            format!("amount must be at most {MAX_AMOUNT_PAISA} paisa (NPR 10,00,000)"),
        ));
    }
    if let Some(p) = provider {
        let limits = amount_limits(p, mode);
        if amount < limits.min {
            return Err(invalid(
                "amount",
                format!(
                    "{} takes at least {} paisa, got {amount}",
                    p.as_str(),
                    limits.min
                ),
            ));
        }
        if amount > limits.max {
            if p == Provider::Fonepay && mode == Mode::Sandbox {
                return Err(CheckoutError::FonepaySandboxCap(format!(
                    "Sandbox fonepay uses real money and is capped at {} paisa (NPR 1,000) per payment",
                    limits.max
                )));
            }
            return Err(invalid(
                "amount",
                format!(
                    "{} takes at most {} paisa, got {amount}",
                    p.as_str(),
                    limits.max
                ),
            ));
        }
    }
    Paisa::new(amount).map_err(|e| invalid("amount", e.to_string()))
}

/// An absolute `http(s)` URL ([`HttpUrl`]'s rule): `https` in live; in
/// sandbox also `http` to `localhost`, `127.0.0.1` or `[::1]` (a merchant
/// testing locally).
pub fn check_url(field: &str, url: &str, mode: Mode) -> Result<(), CheckoutError> {
    let url = HttpUrl::parse(url.to_owned()).map_err(|m| invalid(field, format!("{field} {m}")))?;
    if !url.is_https() {
        let local = matches!(url.host().as_str(), "localhost" | "127.0.0.1" | "[::1]");
        if mode.is_live() || !local {
            return Err(invalid(
                field,
                format!(
                    "{field} must use https (http is allowed only to localhost/127.0.0.1 in sandbox)"
                ),
            ));
        }
    }
    Ok(())
}

/// At most 50 keys of 1–40 characters; values are strings (at most 500
/// characters), numbers or booleans.
pub fn check_metadata(metadata: &Map<String, Value>) -> Result<(), CheckoutError> {
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(invalid(
            "metadata",
            format!("metadata holds at most {MAX_METADATA_KEYS} keys"),
        ));
    }
    for (k, v) in metadata {
        if k.is_empty() || k.chars().count() > MAX_METADATA_KEY_LEN {
            return Err(invalid(
                "metadata",
                format!("metadata keys must be 1 to {MAX_METADATA_KEY_LEN} characters"),
            ));
        }
        let ok = match v {
            Value::String(s) => s.chars().count() <= MAX_METADATA_VALUE_LEN,
            Value::Number(_) | Value::Bool(_) => true,
            _ => false,
        };
        if !ok {
            return Err(invalid(
                &format!("metadata.{k}"),
                format!(
                    "metadata values must be strings of at most {MAX_METADATA_VALUE_LEN} characters, numbers or booleans"
                ),
            ));
        }
    }
    Ok(())
}

/// Who creates the session: its project, mode and key (with the key's cap).
#[derive(Clone, Debug, PartialEq)]
pub struct Creator {
    pub project_id: String,
    pub mode: Mode,
    pub api_key_id: String,
    pub spend_cap_paisa: Option<i64>,
}

impl Creator {
    /// The authenticated key `who` creating a session.
    pub fn of(who: &super::account::Principal) -> Creator {
        Creator {
            project_id: who.project_id().to_owned(),
            mode: who.mode(),
            api_key_id: who.key.id.clone(),
            spend_cap_paisa: who.key.spend_cap_paisa,
        }
    }
}

/// The spend counter of a key for the calendar month (UTC) of `now`.
pub fn spend_counter_key(api_key_id: &str, now: Timestamp) -> Key {
    let d = now.datetime();
    keys::spend_counter(api_key_id, d.year(), d.month())
}

/// The condition under which adding `amount` keeps the month's volume at
/// or under `cap`; `None` when the amount alone is over the cap.
pub fn spend_cap_condition(cap: i64, amount: i64) -> Option<Cond> {
    let room = cap.checked_sub(amount)?;
    (room >= 0).then(|| {
        Cond::Or(vec![
            Cond::AttrNotExists("volume".into()),
            Cond::le("volume", room),
        ])
    })
}

/// The write charging `amount` to the creating key's spend counter for
/// the month, conditioned on staying under its cap (for the creation's
/// transaction); `None` for a key without a cap. A transaction failing on
/// it is [`CheckoutError::SpendCapExceeded`].
pub fn spend_op(
    creator: &Creator,
    amount: i64,
    now: Timestamp,
) -> Result<Option<TxOp>, CheckoutError> {
    let Some(cap) = creator.spend_cap_paisa else {
        return Ok(None);
    };
    let cond = spend_cap_condition(cap, amount).ok_or(CheckoutError::SpendCapExceeded { cap })?;
    // Kept a month past the month it counts, then dropped by TTL.
    let ttl = now.plus(chrono::Duration::days(62)).unix_seconds();
    Ok(Some(TxOp::Update {
        key: spend_counter_key(&creator.api_key_id, now),
        update: Update::new().add("volume", amount).set(TTL, ttl),
        cond: Some(cond),
    }))
}

/// The new session of `valid`, created at `now`.
pub fn new_session(creator: &Creator, valid: ValidCheckout, now: Timestamp) -> CheckoutSession {
    CheckoutSession {
        id: ids::new_id(IdKind::CheckoutSession),
        project_id: creator.project_id.clone(),
        mode: creator.mode,
        api_key_id: creator.api_key_id.clone(),
        flow: valid.flow,
        amount: valid.amount,
        currency: Currency::Npr,
        provider: valid.provider,
        status: SessionStatus::Pending,
        payment_id: None,
        description: valid.description,
        metadata: valid.metadata,
        customer_name: valid.customer_name,
        customer_email: valid.customer_email,
        customer_phone: valid.customer_phone,
        collect_address: valid.collect_address,
        customer_address: valid.customer_address,
        return_url: valid.return_url,
        cancel_url: valid.cancel_url,
        expires_at: now.plus(SESSION_LIFETIME),
        created_at: now,
        updated_at: now,
        attempts: 0,
        link_id: None,
        link_claimed: false,
        invoice_id: None,
    }
}

/// Creates a session: checks the chosen provider is enabled, then one
/// transaction of the session, the key's spend counter (when it has a cap)
/// and the request's idempotency fence. A request whose first run already
/// committed (its fence is there) answers the session that run created.
pub async fn create(
    store: &dyn Store,
    creator: &Creator,
    valid: ValidCheckout,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<CheckoutSession, CheckoutError> {
    if let Some(p) = valid.provider {
        let enabled = providers(store, &creator.project_id, creator.mode).await?;
        if !enabled.iter().any(|x| x.provider == p && x.enabled) {
            return Err(CheckoutError::ProviderUnavailable(p));
        }
    }
    let spend = spend_op(creator, valid.amount.get(), now)?;
    super::active::touch(store, &creator.project_id, creator.mode, now).await?;
    let session = new_session(creator, valid, now);
    let item = to_item(
        &session,
        &CheckoutSession::key(&session.id),
        &session.indexes(),
    )?;
    let mut ops = vec![TxOp::Put {
        item,
        cond: Some(Cond::NotExists),
    }];
    let counter_at = spend.map(|op| {
        ops.push(op);
        ops.len() - 1
    });
    let fence_at = fence.map(|f| {
        ops.push(f.op(&session.id));
        ops.len() - 1
    });
    // The day's counters, in the same transaction (after the ops above,
    // whose indexes the error handling reads).
    let mut tally = super::analytics::Tally::new();
    tally.session_created(&session);
    tally.apply_to(&mut ops)?;
    let mut tries = 0;
    loop {
        tries += 1;
        match store.transact(ops.clone()).await {
            Ok(()) => return Ok(session),
            Err(e) => {
                if let (Some(f), Some(i)) = (fence, fence_at) {
                    if Fence::tripped(&e, i) {
                        return first_run_session(store, creator, f).await;
                    }
                }
                if let Some(i) = counter_at {
                    if failed_at(&e, i) {
                        return Err(CheckoutError::SpendCapExceeded {
                            cap: creator.spend_cap_paisa.unwrap_or_default(),
                        });
                    }
                }
                let conflict = matches!(&e, StoreError::TransactionCanceled { reasons }
                    if reasons.contains(&TxReason::Conflict));
                if conflict && tries < CONFLICT_TRIES {
                    tokio::time::sleep(std::time::Duration::from_millis(20 * tries as u64)).await;
                    continue;
                }
                if conflict {
                    return Err(StoreError::Unavailable(
                        "spend counter busy (transaction conflicts)".into(),
                    )
                    .into());
                }
                return Err(e.into());
            }
        }
    }
}

/// Whether a cancelled transaction failed on the condition of op `index`.
pub fn failed_at(err: &StoreError, index: usize) -> bool {
    matches!(err, StoreError::TransactionCanceled { reasons }
        if matches!(reasons.get(index), Some(TxReason::ConditionFailed)))
}

async fn first_run_session(
    store: &dyn Store,
    creator: &Creator,
    fence: &Fence,
) -> Result<CheckoutSession, CheckoutError> {
    let first = fence.resource_id(store).await?.unwrap_or_default();
    let item = store.get(&CheckoutSession::key(&first)).await?;
    match item {
        Some(item) => {
            let s: CheckoutSession = from_item(item)?;
            if s.project_id == creator.project_id && s.mode == creator.mode {
                return Ok(s);
            }
            Err(StoreError::Backend(format!("fence of {first} belongs to another project")).into())
        }
        None => Err(StoreError::Backend(format!("fenced session {first} is missing")).into()),
    }
}

/// The session `id` of `project_id` in `mode` as of `now`; `None` for any
/// other project's or mode's session, exactly as for a missing one. An open
/// session past `expires_at` is stored as expired on the way (conditional:
/// a concurrent move to a final state wins).
pub async fn find(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    if !ids::is_valid(id, IdKind::CheckoutSession) {
        return Ok(None);
    }
    let Some(session) = find_any(store, id, now).await? else {
        return Ok(None);
    };
    if session.project_id != project_id || session.mode != mode {
        return Ok(None);
    }
    Ok(Some(session))
}

/// The session `id` of any project as of `now` (the public pages know a
/// session by its id alone), with lazy expiry persisted as in [`find`].
pub async fn find_any(
    store: &dyn Store,
    id: &str,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    if !ids::is_valid(id, IdKind::CheckoutSession) {
        return Ok(None);
    }
    let Some(item) = store.get(&CheckoutSession::key(id)).await? else {
        return Ok(None);
    };
    let session: CheckoutSession = from_item(item)?;
    if session.status_at(now) == SessionStatus::Expired && session.status != SessionStatus::Expired
    {
        return mark_expired(store, &session.id, Some(&session), now, true)
            .await
            .map(Some);
    }
    Ok(Some(session))
}

pub(crate) fn open_cond() -> Cond {
    Cond::Or(vec![
        Cond::eq("status", SessionStatus::Pending.as_str()),
        Cond::eq("status", SessionStatus::Initiated.as_str()),
    ])
}

/// Moves an open session to `expired`; when `only_if_due`, only once its
/// `expires_at` passed. A session that is no longer open (or not yet due)
/// is answered as stored.
///
/// One transaction: the session (conditioned on the status it was read
/// with), its project's session counters, and the link use it gives back.
/// A session that moved meanwhile is read again and tried again.
async fn mark_expired(
    store: &dyn Store,
    id: &str,
    known: Option<&CheckoutSession>,
    now: Timestamp,
    only_if_due: bool,
) -> Result<CheckoutSession, StoreError> {
    let key = CheckoutSession::key(id);
    let mut read = known.cloned();
    // Set when the link the session holds a use of is gone (deleted):
    // the session expires without giving the use back.
    let mut link_gone = false;
    for attempt in 0..8usize {
        let current = match read.take() {
            Some(s) => s,
            None => match store.get(&key).await? {
                Some(item) => from_item::<CheckoutSession>(item)?,
                None => return Err(StoreError::Backend(format!("session {id} vanished"))),
            },
        };
        if current.status.is_final() || (only_if_due && now < current.expires_at) {
            return Ok(current);
        }
        let mut conds = vec![Cond::Exists, Cond::eq("status", current.status.as_str())];
        if only_if_due {
            conds.push(Cond::le("expires_at", now.to_rfc3339()));
        }
        let update = Update::new()
            .set("status", SessionStatus::Expired.as_str())
            .set("updated_at", now.to_rfc3339())
            .unindex(Index::Gsi2);
        let mut ops = vec![TxOp::Update {
            key: key.clone(),
            update,
            cond: Some(Cond::And(conds)),
        }];
        // A session holding one of its link's uses gives it back as it ends.
        let releases = current.link_claimed && current.link_id.is_some() && !link_gone;
        if releases {
            if let Some(link) = &current.link_id {
                ops.push(super::links::release_op(link));
            }
        }
        let mut tally = super::analytics::Tally::new();
        tally.session_moved(&current, current.status, SessionStatus::Expired);
        tally.apply_to(&mut ops)?;
        match store.transact(ops).await {
            Ok(()) => {
                let mut done = current;
                done.status = SessionStatus::Expired;
                done.updated_at = now;
                return Ok(done);
            }
            // Moved meanwhile (paid, another attempt): read it again.
            Err(e) if failed_at(&e, 0) => {}
            Err(e) if releases && failed_at(&e, 1) => {
                tracing::warn!(session = %id, "the link of an expiring session is gone: its use is not given back");
                link_gone = true;
                read = Some(current);
            }
            // Busy (the link or the counters are being written).
            Err(StoreError::TransactionCanceled { reasons })
                if !reasons.contains(&TxReason::ConditionFailed) =>
            {
                read = Some(current);
            }
            Err(e) => return Err(e),
        }
        crate::store::contention_backoff(attempt).await;
    }
    Err(StoreError::Unavailable(format!("session {id} is busy")))
}

/// The sweep partitions of open records (`gsi2`), spread so no single
/// partition takes every write.
pub const OPEN_SHARDS: u32 = 4;
pub(crate) const OPEN_SESSIONS: keys::Open = keys::Open::Sessions;

/// The open-records partition of `id` under `prefix`.
pub(crate) fn open_partition(what: keys::Open, id: &str) -> String {
    keys::open(what, keys::shard_of(id, OPEN_SHARDS))
}

/// Every open-records partition under `prefix`.
pub(crate) fn open_partitions(what: keys::Open) -> Vec<String> {
    (0..OPEN_SHARDS).map(|s| keys::open(what, s)).collect()
}

/// The `gsi2` partition of a project's open sessions, by `expires_at`:
/// the sweep finds it through [`super::active`], and `GET /v1/sessions`
/// counts the ones past their time in it.
pub fn open_sessions_partition(project_id: &str, mode: Mode) -> String {
    keys::open_per_project(OPEN_SESSIONS, project_id, mode)
}

/// Open sessions whose time has passed at `now`, oldest first: at most
/// `limit` of each project in `active` (one project's backlog never holds
/// up another's), then at most `limit` per partition of the former,
/// global layout (sessions written before the per-project index).
pub async fn due_for_expiry(
    store: &dyn Store,
    active: &[super::active::Active],
    now: Timestamp,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let partitions = active
        .iter()
        .map(|a| open_sessions_partition(&a.project_id, a.mode))
        .chain(open_partitions(OPEN_SESSIONS));
    let mut ids = Vec::new();
    for pk in partitions {
        let query = Query::partition(pk)
            .on(Index::Gsi2)
            .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())))
            .limit(limit);
        for item in store.query(&query).await?.items {
            if let Some(id) = item.get("id").and_then(Value::as_str) {
                ids.push(id.to_owned());
            }
        }
    }
    Ok(ids)
}

/// Whether the project has any open session indexed (the sweep retires an
/// idle registry entry only when it has none).
pub async fn has_open_sessions(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
) -> Result<bool, StoreError> {
    let query = Query::partition(open_sessions_partition(project_id, mode))
        .on(Index::Gsi2)
        .limit(1);
    Ok(!store.query(&query).await?.items.is_empty())
}

/// Stores a due session as expired (the scheduler's part of lazy expiry).
/// Whether this call moved it.
pub async fn expire_due(store: &dyn Store, id: &str, now: Timestamp) -> Result<bool, StoreError> {
    let s = mark_expired(store, id, None, now, true).await?;
    Ok(s.status == SessionStatus::Expired && s.updated_at == now)
}

/// `POST /v1/checkout/{id}/expire`: `pending|initiated` -> `expired`; a
/// final session is answered unchanged. `None` when not found.
pub async fn expire(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    id: &str,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    let Some(session) = find(store, project_id, mode, id, now).await? else {
        return Ok(None);
    };
    if session.status.is_final() {
        return Ok(Some(session));
    }
    mark_expired(store, &session.id, Some(&session), now, false)
        .await
        .map(Some)
}

/// The list filter for `status` as of `now`: stored statuses, with open
/// sessions past their time counted as expired.
pub fn status_filter(status: SessionStatus, now: Timestamp) -> Cond {
    let now = now.to_rfc3339();
    match status {
        SessionStatus::Pending | SessionStatus::Initiated => Cond::And(vec![
            Cond::eq("status", status.as_str()),
            Cond::gt("expires_at", now),
        ]),
        SessionStatus::Expired => Cond::Or(vec![
            Cond::eq("status", status.as_str()),
            Cond::And(vec![open_cond(), Cond::le("expires_at", now)]),
        ]),
        SessionStatus::Success | SessionStatus::Failed => Cond::eq("status", status.as_str()),
    }
}

/// A page of the project's sessions in `mode`, newest first, optionally of
/// one status (as of `now`), and the total. Lists show lazy expiry without
/// writing it (a read of the one session persists it).
pub async fn list(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    status: Option<SessionStatus>,
    now: Timestamp,
    offset: usize,
    limit: usize,
) -> Result<(Vec<CheckoutSession>, u64), StoreError> {
    let mut query = Query::partition(CheckoutSession::list_partition(project_id, mode))
        .on(Index::Gsi1)
        .backward();
    if let Some(s) = status {
        query = query.filter(status_filter(s, now));
    }
    let Some(totals) = super::analytics::session_totals(store, project_id, mode).await? else {
        // A project from before the counters: counted the old way.
        return super::record::page_of(store, &query, offset, limit).await;
    };
    let items = crate::store::query_window(store, &query, offset, limit).await?;
    let sessions = items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<CheckoutSession>, _>>()?;
    let total = match status {
        None => totals.total,
        Some(s @ (SessionStatus::Success | SessionStatus::Failed)) => totals.stored(s),
        // Lazy expiry: open sessions past their time are listed as
        // expired. They are the ones still in the project's open index
        // with `expires_at <= now` (the sweep stores them within a minute
        // or so), counted with a key-range query.
        Some(s @ (SessionStatus::Pending | SessionStatus::Initiated)) => {
            totals.stored(s) - overdue(store, project_id, mode, Some(s), now).await?
        }
        // Every session in the open index past its time is pending or
        // initiated: one count.
        Some(SessionStatus::Expired) => {
            totals.stored(SessionStatus::Expired)
                + overdue(store, project_id, mode, None, now).await?
        }
    };
    Ok((sessions, u64::try_from(total.max(0)).unwrap_or(0)))
}

/// Open sessions of the project whose time passed, stored as `status`
/// (any open one when `None`).
async fn overdue(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
    status: Option<SessionStatus>,
    now: Timestamp,
) -> Result<i64, StoreError> {
    let mut query = Query::partition(open_sessions_partition(project_id, mode))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(format!("{}#~", now.to_rfc3339())));
    if let Some(status) = status {
        query = query.filter(Cond::eq("status", status.as_str()));
    }
    Ok(i64::try_from(store.count(&query).await?).unwrap_or(i64::MAX))
}

/// One provider as `GET /v1/providers` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAvailability {
    pub provider: Provider,
    pub enabled: bool,
    /// Whether payments go to the provider's test environment (no real
    /// money): eSewa and Khalti in sandbox; never fonepay.
    pub sandbox: bool,
    pub min_amount: i64,
    pub max_amount: i64,
}

/// Whether a project can use `provider` in `mode`, given whether it has
/// stored credentials for it: in sandbox eSewa and Khalti always (their
/// public test credentials); fonepay has no sandbox and needs real ones.
pub fn is_enabled(provider: Provider, mode: Mode, has_credentials: bool) -> bool {
    has_credentials || (mode == Mode::Sandbox && provider != Provider::Fonepay)
}

/// Every provider, enabled or not, for the project in `mode`.
pub async fn providers(
    store: &dyn Store,
    project_id: &str,
    mode: Mode,
) -> Result<Vec<ProviderAvailability>, StoreError> {
    let configured = list_configured_providers(store, project_id)
        .await
        .map_err(|e| match e {
            super::credentials::CredentialsError::Store(s) => s,
            other => StoreError::Backend(other.to_string()),
        })?;
    Ok(Provider::ALL
        .into_iter()
        .map(|p| {
            let has = configured.iter().any(|c| c.provider == p && c.mode == mode);
            let limits = amount_limits(p, mode);
            ProviderAvailability {
                provider: p,
                enabled: is_enabled(p, mode, has),
                sandbox: mode == Mode::Sandbox && p != Provider::Fonepay,
                min_amount: limits.min,
                max_amount: limits.max,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::memory_store as store;
    use crate::time::{Clock, SystemClock};
    use serde_json::json;
    use std::sync::Arc;

    fn req(v: Value) -> CreateCheckout {
        match serde_json::from_value(v) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    fn base() -> Value {
        json!({"amount": 5000, "returnUrl": "https://shop.example/done"})
    }

    fn with(mut v: Value, k: &str, x: Value) -> Value {
        v[k] = x;
        v
    }

    #[tokio::test]
    async fn the_total_costs_the_same_reads_whatever_the_number_of_sessions() {
        let inner: Arc<dyn Store> = Arc::new(EmbeddedStore::in_memory().unwrap());
        let counting = crate::store::counting::CountingStore::new(inner.clone());
        let now = Timestamp::parse("2026-11-25T10:00:00Z").unwrap();
        let marker = super::super::analytics::totals_marker("proj_t", Mode::Sandbox);
        let mut item = crate::store::Item::new();
        item.insert(crate::store::PK.into(), marker.pk.into());
        item.insert(crate::store::SK.into(), marker.sk.into());
        inner.put(item, None).await.unwrap();
        let creator = Creator {
            project_id: "proj_t".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_t".into(),
            spend_cap_paisa: None,
        };
        let mut ids = Vec::new();
        let mut costs = Vec::new();
        for n in [3usize, 40] {
            while ids.len() < n {
                let valid = validate_create(req(base()), Mode::Sandbox).unwrap();
                ids.push(
                    create(&*inner, &creator, valid, now, None)
                        .await
                        .unwrap()
                        .id,
                );
            }
            let before = counting.calls();
            let (page, total) = list(&counting, "proj_t", Mode::Sandbox, None, now, 0, 1)
                .await
                .unwrap();
            assert_eq!((page.len(), total), (1, n as u64));
            costs.push(counting.calls() - before);
        }
        assert_eq!(costs[0], costs[1], "reads do not grow with the sessions");
        let total = |status, at| {
            let counting = &counting;
            async move {
                list(counting, "proj_t", Mode::Sandbox, Some(status), at, 0, 1)
                    .await
                    .unwrap()
                    .1
            }
        };
        assert_eq!(total(SessionStatus::Pending, now).await, 40);
        // Past their time, before any sweep: counted as expired.
        let late = now.plus(chrono::Duration::minutes(31));
        assert_eq!(total(SessionStatus::Pending, late).await, 0);
        assert_eq!(total(SessionStatus::Expired, late).await, 40);
        // Stored as expired: the same counts.
        for id in ids.iter().take(5) {
            assert!(expire_due(&*inner, id, late).await.unwrap());
        }
        assert_eq!(total(SessionStatus::Expired, late).await, 40);
        assert_eq!(total(SessionStatus::Expired, now).await, 5);
        assert_eq!(total(SessionStatus::Pending, now).await, 35);
        let (_, all) = list(&counting, "proj_t", Mode::Sandbox, None, late, 0, 1)
            .await
            .unwrap();
        assert_eq!(all, 40);
    }

    fn field_of(r: Result<ValidCheckout, CheckoutError>) -> String {
        match r {
            Err(CheckoutError::Invalid { field, .. }) => field,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn a_minimal_request_is_a_hosted_npr_session() {
        let Ok(v) = validate_create(req(base()), Mode::Live) else {
            panic!()
        };
        assert_eq!(v.flow, Flow::Hosted);
        assert_eq!(v.provider, None);
        assert_eq!(v.amount.get(), 5000);
        assert!(!v.collect_address);
    }

    #[test]
    fn amounts_must_be_positive_and_bounded() {
        for bad in [0, -1, MAX_AMOUNT_PAISA + 1] {
            let r = validate_create(req(with(base(), "amount", json!(bad))), Mode::Live);
            assert_eq!(field_of(r), "amount", "{bad}");
        }
        assert!(
            validate_create(
                req(with(base(), "amount", json!(MAX_AMOUNT_PAISA))),
                Mode::Live
            )
            .is_ok()
        );
    }

    #[test]
    fn khalti_needs_at_least_ten_rupees() {
        let r = with(
            with(base(), "provider", json!("khalti")),
            "amount",
            json!(999),
        );
        assert_eq!(field_of(validate_create(req(r), Mode::Sandbox)), "amount");
        let r = with(
            with(base(), "provider", json!("khalti")),
            "amount",
            json!(1000),
        );
        assert!(validate_create(req(r), Mode::Sandbox).is_ok());
    }

    #[test]
    fn sandbox_fonepay_is_capped_at_one_thousand_rupees() {
        let r = with(
            with(base(), "provider", json!("fonepay")),
            "amount",
            json!(100_001),
        );
        assert!(matches!(
            validate_create(req(r.clone()), Mode::Sandbox),
            Err(CheckoutError::FonepaySandboxCap(_))
        ));
        assert!(
            validate_create(req(r), Mode::Live).is_ok(),
            "live has no cap"
        );
        let r = with(
            with(base(), "provider", json!("fonepay")),
            "amount",
            json!(100_000),
        );
        assert!(validate_create(req(r), Mode::Sandbox).is_ok());
    }

    #[test]
    fn redirect_needs_a_provider_and_qr_is_not_created_here() {
        let r = with(base(), "flow", json!("redirect"));
        assert_eq!(field_of(validate_create(req(r), Mode::Live)), "provider");
        let r = with(
            with(base(), "flow", json!("redirect")),
            "provider",
            json!("esewa"),
        );
        assert!(validate_create(req(r), Mode::Live).is_ok());
        let r = with(base(), "flow", json!("qr"));
        assert_eq!(field_of(validate_create(req(r), Mode::Live)), "flow");
    }

    #[test]
    fn urls_are_absolute_https_with_local_http_in_sandbox() {
        for (url, mode, ok) in [
            ("https://shop.example/ok?x=1", Mode::Live, true),
            ("https://shop.example:8443/ok", Mode::Live, true),
            ("http://shop.example/ok", Mode::Live, false),
            ("http://shop.example/ok", Mode::Sandbox, false),
            ("http://127.0.0.1:3000/ok", Mode::Sandbox, true),
            ("http://localhost/ok", Mode::Sandbox, true),
            ("http://[::1]:80/ok", Mode::Sandbox, true),
            ("http://localhost/ok", Mode::Live, false),
            ("/relative", Mode::Sandbox, false),
            ("ftp://x.example", Mode::Sandbox, false),
            ("javascript:alert(1)", Mode::Sandbox, false),
            ("https://", Mode::Live, false),
            ("https://user:pw@shop.example/", Mode::Live, false),
            ("https://shop.example/a b", Mode::Live, false),
            ("", Mode::Live, false),
        ] {
            assert_eq!(
                check_url("returnUrl", url, mode).is_ok(),
                ok,
                "{url} {mode:?}"
            );
        }
        let long = format!(
            "https://x.example/{}",
            "a".repeat(crate::fields::MAX_URL_LEN)
        );
        assert!(check_url("returnUrl", &long, Mode::Live).is_err());
        let r = with(base(), "cancelUrl", json!("http://evil.example"));
        assert_eq!(field_of(validate_create(req(r), Mode::Live)), "cancelUrl");
        let r = with(base(), "returnUrl", json!("nope"));
        assert_eq!(refused_at(r), "returnUrl");
    }

    #[test]
    fn metadata_is_bounded() {
        let mut m = Map::new();
        for i in 0..MAX_METADATA_KEYS {
            m.insert(format!("k{i}"), json!("v"));
        }
        assert!(check_metadata(&m).is_ok());
        m.insert("one_more".into(), json!(1));
        let r = with(base(), "metadata", Value::Object(m));
        assert_eq!(field_of(validate_create(req(r), Mode::Live)), "metadata");
        let long_key = "k".repeat(MAX_METADATA_KEY_LEN + 1);
        let r = with(base(), "metadata", json!({ long_key: "v" }));
        assert_eq!(field_of(validate_create(req(r), Mode::Live)), "metadata");
        let r = with(
            base(),
            "metadata",
            json!({"order": "x".repeat(MAX_METADATA_VALUE_LEN + 1)}),
        );
        assert_eq!(
            field_of(validate_create(req(r), Mode::Live)),
            "metadata.order"
        );
        let r = with(base(), "metadata", json!({"nested": {"a": 1}}));
        assert_eq!(
            field_of(validate_create(req(r), Mode::Live)),
            "metadata.nested"
        );
        let r = with(base(), "metadata", json!({"n": 3, "ok": true, "s": "x"}));
        assert!(validate_create(req(r), Mode::Live).is_ok());
    }

    /// Where parsing a request stops, as the body's path: the field rules
    /// live in the field types ([`crate::fields`]).
    fn refused_at(v: Value) -> String {
        let r: Result<CreateCheckout, _> = serde_path_to_error::deserialize(v);
        match r {
            Err(e) => e.path().to_string(),
            Ok(r) => panic!("parsed: {r:?}"),
        }
    }

    #[test]
    fn customer_fields_are_checked_and_named() {
        use crate::fields::{AddressPart, Description, MAX_PHONE_LEN, PersonName};
        let cases = [
            (json!({"email": "not-an-email"}), "customer.email"),
            (json!({"email": ""}), "customer.email"),
            (
                json!({"name": "n".repeat(PersonName::MAX + 1)}),
                "customer.name",
            ),
            (json!({"phone": "98-call-me"}), "customer.phone"),
            (
                json!({"phone": "9".repeat(MAX_PHONE_LEN + 1)}),
                "customer.phone",
            ),
            (
                json!({"address": {"city": "c".repeat(AddressPart::MAX + 1)}}),
                "customer.address.city",
            ),
            (
                json!({"address": {"line1": "a\u{0}b"}}),
                "customer.address.line1",
            ),
        ];
        for (customer, field) in cases {
            assert_eq!(refused_at(with(base(), "customer", customer)), field);
        }
        let r = with(
            base(),
            "customer",
            json!({"name": "Sita", "email": "sita@example.com", "phone": "+977 9841000001",
                   "address": {"line1": "Thamel", "postalCode": "44600", "country": "NP"}}),
        );
        let Ok(v) = validate_create(req(r), Mode::Live) else {
            panic!()
        };
        assert_eq!(
            v.customer_address.and_then(|a| a.postal_code).as_deref(),
            Some("44600")
        );
        assert_eq!(v.customer_email.as_deref(), Some("sita@example.com"));
        let r = with(
            base(),
            "description",
            json!("d".repeat(Description::MAX + 1)),
        );
        assert_eq!(refused_at(r), "description");
    }

    #[test]
    fn unknown_fields_and_currencies_do_not_parse() {
        assert!(serde_json::from_value::<CreateCheckout>(with(base(), "tip", json!(1))).is_err());
        assert!(
            serde_json::from_value::<CreateCheckout>(with(base(), "currency", json!("USD")))
                .is_err()
        );
        assert!(
            serde_json::from_value::<CreateCheckout>(with(base(), "currency", json!("NPR")))
                .is_ok()
        );
    }

    #[test]
    fn open_sessions_expire_after_thirty_minutes() {
        let now = SystemClock.now();
        let creator = Creator {
            project_id: "proj_a".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_x".into(),
            spend_cap_paisa: None,
        };
        let Ok(v) = validate_create(req(base()), Mode::Sandbox) else {
            panic!()
        };
        let mut s = new_session(&creator, v, now);
        assert_eq!(s.expires_at, now.plus(chrono::Duration::minutes(30)));
        assert_eq!(s.status_at(now), SessionStatus::Pending);
        let later = now.plus(SESSION_LIFETIME);
        assert_eq!(s.status_at(later), SessionStatus::Expired);
        s.status = SessionStatus::Initiated;
        assert_eq!(s.status_at(later), SessionStatus::Expired);
        s.status = SessionStatus::Success;
        assert_eq!(s.status_at(later), SessionStatus::Success, "final stays");
    }

    #[test]
    fn statuses_parse_and_unknown_ones_are_none() {
        for s in SessionStatus::ALL {
            assert_eq!(SessionStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(SessionStatus::parse("paid"), None);
        assert!(SessionStatus::Expired.is_final() && !SessionStatus::Initiated.is_final());
    }

    #[test]
    fn the_spend_cap_condition_leaves_room_for_the_amount() {
        assert_eq!(spend_cap_condition(1000, 1001), None);
        let Some(c) = spend_cap_condition(1000, 100) else {
            panic!()
        };
        let mut item = crate::store::Item::new();
        assert!(crate::store::cond::eval(&c, Some(&item)), "no volume yet");
        item.insert("volume".into(), json!(900));
        assert!(crate::store::cond::eval(&c, Some(&item)));
        item.insert("volume".into(), json!(901));
        assert!(!crate::store::cond::eval(&c, Some(&item)));
        let t = Timestamp::parse("2026-11-30T23:59:59Z").unwrap_or_else(|| SystemClock.now());
        assert_eq!(spend_counter_key("ak_1", t).sk, "SPEND#2026-11");
    }

    #[test]
    fn providers_are_enabled_by_credentials_or_sandbox_test_accounts() {
        assert!(is_enabled(Provider::Esewa, Mode::Sandbox, false));
        assert!(is_enabled(Provider::Khalti, Mode::Sandbox, false));
        assert!(!is_enabled(Provider::Fonepay, Mode::Sandbox, false));
        assert!(is_enabled(Provider::Fonepay, Mode::Sandbox, true));
        for p in Provider::ALL {
            assert!(!is_enabled(p, Mode::Live, false));
            assert!(is_enabled(p, Mode::Live, true));
        }
        assert_eq!(amount_limits(Provider::Khalti, Mode::Live).min, 1000);
        assert_eq!(amount_limits(Provider::Fonepay, Mode::Sandbox).max, 100_000);
        assert_eq!(
            amount_limits(Provider::Fonepay, Mode::Live).max,
            MAX_AMOUNT_PAISA
        );
    }

    fn creator(cap: Option<i64>) -> Creator {
        Creator {
            project_id: "proj_a".into(),
            mode: Mode::Sandbox,
            api_key_id: "ak_1".into(),
            spend_cap_paisa: cap,
        }
    }

    async fn make(
        store: &dyn Store,
        c: &Creator,
        amount: i64,
        now: Timestamp,
    ) -> Result<CheckoutSession, CheckoutError> {
        let v = validate_create(req(with(base(), "amount", json!(amount))), c.mode)?;
        create(store, c, v, now, None).await
    }

    #[tokio::test]
    async fn reads_expire_lazily_and_persist_it() {
        let store = store();
        let now = SystemClock.now();
        let c = creator(None);
        let Ok(s) = make(&*store, &c, 500, now).await else {
            panic!()
        };
        let found = find(&*store, "proj_a", Mode::Sandbox, &s.id, now).await;
        assert_eq!(
            found.ok().flatten().map(|x| x.status),
            Some(SessionStatus::Pending)
        );
        assert_eq!(
            find(&*store, "proj_b", Mode::Sandbox, &s.id, now).await,
            Ok(None)
        );
        assert_eq!(
            find(&*store, "proj_a", Mode::Live, &s.id, now).await,
            Ok(None)
        );
        let later = now.plus(SESSION_LIFETIME);
        let found = find(&*store, "proj_a", Mode::Sandbox, &s.id, later).await;
        assert_eq!(
            found.ok().flatten().map(|x| x.status),
            Some(SessionStatus::Expired)
        );
        // Persisted: visible even to a reader whose clock is earlier.
        let found = find(&*store, "proj_a", Mode::Sandbox, &s.id, now).await;
        assert_eq!(
            found.ok().flatten().map(|x| x.status),
            Some(SessionStatus::Expired)
        );
    }

    #[tokio::test]
    async fn expire_moves_open_sessions_only() {
        let store = store();
        let now = SystemClock.now();
        let Ok(s) = make(&*store, &creator(None), 500, now).await else {
            panic!()
        };
        let Ok(Some(e)) = expire(&*store, "proj_a", Mode::Sandbox, &s.id, now).await else {
            panic!()
        };
        assert_eq!(e.status, SessionStatus::Expired);
        // A success stays a success.
        let key = CheckoutSession::key(&s.id);
        let _ = store
            .update(&key, Update::new().set("status", "success"), None)
            .await;
        let Ok(Some(again)) = expire(&*store, "proj_a", Mode::Sandbox, &s.id, now).await else {
            panic!()
        };
        assert_eq!(again.status, SessionStatus::Success);
        assert_eq!(
            expire(&*store, "proj_b", Mode::Sandbox, &s.id, now).await,
            Ok(None)
        );
    }

    #[tokio::test]
    async fn the_spend_cap_counts_the_month_per_key() {
        let store = store();
        let now = SystemClock.now();
        let c = creator(Some(1000));
        assert!(make(&*store, &c, 600, now).await.is_ok());
        assert!(matches!(
            make(&*store, &c, 401, now).await,
            Err(CheckoutError::SpendCapExceeded { cap: 1000 })
        ));
        assert!(make(&*store, &c, 400, now).await.is_ok());
        assert!(make(&*store, &c, 1, now).await.is_err());
        // Next month starts over.
        let next = now.plus(chrono::Duration::days(32));
        assert!(make(&*store, &c, 1000, next).await.is_ok());
        // The failed attempts left no session behind.
        let Ok((_, total)) = list(&*store, "proj_a", Mode::Sandbox, None, now, 0, 10).await else {
            panic!()
        };
        assert_eq!(total, 3);
    }

    #[tokio::test]
    async fn lists_filter_by_status_as_of_now() {
        let store = store();
        let now = SystemClock.now();
        let c = creator(None);
        let mut made = Vec::new();
        for amount in [100, 200, 300] {
            let Ok(s) = make(&*store, &c, amount, now).await else {
                panic!()
            };
            made.push(s);
        }
        let _ = expire(&*store, "proj_a", Mode::Sandbox, &made[0].id, now).await;
        let count = |s: Option<SessionStatus>, at: Timestamp| {
            let store = store.clone();
            async move {
                list(&*store, "proj_a", Mode::Sandbox, s, at, 0, 25)
                    .await
                    .map(|(items, total)| (items.len() as u64, total))
            }
        };
        assert_eq!(count(None, now).await, Ok((3, 3)));
        assert_eq!(count(Some(SessionStatus::Pending), now).await, Ok((2, 2)));
        assert_eq!(count(Some(SessionStatus::Expired), now).await, Ok((1, 1)));
        let later = now.plus(SESSION_LIFETIME);
        assert_eq!(count(Some(SessionStatus::Pending), later).await, Ok((0, 0)));
        assert_eq!(count(Some(SessionStatus::Expired), later).await, Ok((3, 3)));
        let Ok((page, _)) = list(&*store, "proj_a", Mode::Sandbox, None, now, 0, 1).await else {
            panic!()
        };
        assert_eq!(page[0].id, made[2].id, "newest first");
    }

    #[test]
    fn the_view_uses_the_spec_names() {
        let now = SystemClock.now();
        let Ok(v) = validate_create(req(base()), Mode::Live) else {
            panic!()
        };
        let s = new_session(&creator(None), v, now);
        let view = serde_json::to_value(CheckoutSessionView::at(s, now)).unwrap_or_default();
        for field in [
            "id",
            "livemode",
            "mode",
            "flow",
            "amount",
            "currency",
            "status",
            "metadata",
            "collectAddress",
            "expiresAt",
            "createdAt",
            "updatedAt",
        ] {
            assert!(view.get(field).is_some(), "missing {field}");
        }
        // Optional fields: set, or omitted; never null against their type.
        for f in [
            "provider",
            "paymentId",
            "description",
            "customerName",
            "customerEmail",
            "customerPhone",
            "customerAddress",
        ] {
            assert_ne!(view.get(f), Some(&serde_json::Value::Null), "{f} is null");
        }
        assert!(view.get("returnUrl").is_none() && view.get("apiKeyId").is_none());
        assert_eq!(view["status"], "pending");
        assert_eq!(view["flow"], "hosted");
        assert_eq!(view["currency"], "NPR");
    }
}
