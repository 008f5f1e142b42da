//! Checkout sessions as stored and answered, the create request and its
//! rules (amount ranges per provider and mode, URLs, metadata), and the
//! spend cap taken with the session.

use crate::domain::listing::counted;
use chrono::Datelike;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::expiry::{mark_expired, open_sessions_partition};
use super::providers::is_enabled;
use super::{
    CONFLICT_TRIES, FONEPAY_SANDBOX_MAX_PAISA, KHALTI_MIN_AMOUNT_PAISA, MAX_AMOUNT_PAISA,
    MAX_METADATA_KEY_LEN, MAX_METADATA_KEYS, MAX_METADATA_VALUE_LEN, SESSION_LIFETIME, stats,
};
use crate::app::Deps;
use crate::domain::listing::counted::{CountedList, Narrowed};
use crate::domain::listing::{StatusChange, merge_counts};
use crate::domain::record::{Attr, Changes, Entry, Record};
use crate::domain::{Mode, Provider, Tenant};
use crate::fields::{AddressPart, Description, Email, HttpUrl, PersonName, Phone};
use crate::ids::{ApiKeyId, BillingInvoiceId, InvoiceId, LinkId, PaymentId, ProjectId, SessionId};
use crate::keys;
use crate::money::{Currency, Paisa};
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, Index, Key, Store, StoreError, TxOp, TxReason};
use crate::time::Timestamp;

/// How the customer pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Flow {
    /// Our hosted page; the customer picks a provider unless one is set.
    Hosted,
    /// Straight to the set provider.
    Redirect,
    /// Direct-QR (created by the QR endpoint, not `POST /v1/checkout`).
    Qr,
    /// A merchant's app pays (created by `POST /v1/mobile/sessions`; the
    /// app starts attempts with a publishable key and the client secret).
    Mobile,
}

impl Flow {
    /// Whether the customer came from a shop page to go back to: a
    /// counter's QR and an app have none, so our final page is the end.
    pub fn has_shop(self) -> bool {
        matches!(self, Flow::Hosted | Flow::Redirect)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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

pub(super) fn none<T>() -> Option<T> {
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
    pub id: SessionId,
    pub project_id: ProjectId,
    pub mode: Mode,
    /// The key that created it (its spend counter was charged).
    pub api_key_id: ApiKeyId,
    pub flow: Flow,
    pub amount: Paisa,
    pub currency: Currency,
    /// The provider the merchant named at creation (binding except on the
    /// hosted page); `None` when the customer picks. Never the current
    /// attempt's ([`attempt_provider`](Self::attempt_provider)); but an
    /// item written before that field existed may hold its attempt's
    /// provider here, which is then read as the merchant's (it cannot be
    /// told apart; such sessions ended within their lifetime).
    #[serde(default)]
    pub provider: Option<Provider>,
    /// The provider of the current attempt (`payment_id`), or of the
    /// paying one once paid; absent before the first attempt and on
    /// items written before it was kept apart from `provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_provider: Option<Provider>,
    pub status: SessionStatus,
    /// The current attempt's payment.
    #[serde(default)]
    pub payment_id: Option<PaymentId>,
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
    pub link_id: Option<LinkId>,
    /// Whether the session holds one of its link's `maxUses` (released
    /// when it ends unpaid).
    #[serde(default)]
    pub link_claimed: bool,
    /// The one-time invoice the session collects for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invoice_id: Option<InvoiceId>,
    /// The billing invoice the session collects for (its pay page or its
    /// QR): its success pays the invoice, exactly once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing_invoice_id: Option<BillingInvoiceId>,
    /// Hex SHA-256 of a mobile session's client secret (the secret itself
    /// is shown once, to the merchant's server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_sha256: Option<String>,
    /// Counted in its project's list counters (`listing::counted`): set
    /// at creation, or by `dhukuti-admin lists migrate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
    /// In its list's narrowing by stored status
    /// ([`CheckoutSession::by_status`]): its `gsi4` partition is there
    /// (written by its entries, never from here). Set at creation, or by
    /// `dhukuti-admin lists migrate`.
    #[serde(
        default,
        rename = "gsi4pk",
        skip_serializing,
        deserialize_with = "crate::domain::listing::present"
    )]
    pub narrowed: bool,
}

crate::attrs! { CheckoutSession {
    ID: SessionId = id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    API_KEY_ID: ApiKeyId = api_key_id,
    FLOW: Flow = flow,
    AMOUNT: Paisa = amount,
    CURRENCY: Currency = currency,
    PROVIDER: Option<Provider> = provider,
    ATTEMPT_PROVIDER: Option<Provider> = attempt_provider,
    STATUS: SessionStatus = status,
    PAYMENT_ID: Option<PaymentId> = payment_id,
    DESCRIPTION: Option<String> = description,
    METADATA: Map<String, Value> = metadata,
    CUSTOMER_NAME: Option<String> = customer_name,
    CUSTOMER_EMAIL: Option<String> = customer_email,
    CUSTOMER_PHONE: Option<String> = customer_phone,
    COLLECT_ADDRESS: bool = collect_address,
    CUSTOMER_ADDRESS: Option<StoredAddress> = customer_address,
    RETURN_URL: String = return_url,
    CANCEL_URL: Option<String> = cancel_url,
    EXPIRES_AT: Timestamp = expires_at,
    CREATED_AT: Timestamp = created_at,
    UPDATED_AT: Timestamp = updated_at,
    ATTEMPTS: u32 = attempts,
    LINK_ID: Option<LinkId> = link_id,
    LINK_CLAIMED: bool = link_claimed,
    INVOICE_ID: Option<InvoiceId> = invoice_id,
    BILLING_INVOICE_ID: Option<BillingInvoiceId> = billing_invoice_id,
    CLIENT_SECRET_SHA256: Option<String> = client_secret_sha256,
    COUNTED: bool = counted,
    NARROWED: bool = narrowed as "gsi4pk",
} }

crate::domain::listing::counted::counted_per_tenant!(
    CheckoutSession,
    crate::domain::listing::counted::CountedKind::Sessions,
    CheckoutSession::list_partition
);

impl Narrowed for CheckoutSession {
    const NARROWED: Attr<Self, bool> = CheckoutSession::NARROWED;
    fn is_narrowed(&self) -> bool {
        self.narrowed
    }
    fn narrowings(&self) -> (Changes<Self>, Vec<TxOp>) {
        (
            Changes::new().enter([self.status_entry(self.status)]),
            CheckoutSession::by_status(&self.tenant(), self.status)
                .count_new(&self.id, self.created_at),
        )
    }
    fn narrowed_as_read(&self) -> Cond {
        CheckoutSession::STATUS.eq(&self.status)
    }
}

impl Record for CheckoutSession {
    fn item_key(&self) -> Key {
        CheckoutSession::key(&self.id)
    }

    /// `gsi1`: the project's list; `gsi4` (once narrowed): its narrowing
    /// by stored status; `gsi2` (sparse, while open): the sessions the
    /// scheduler expires, by `expires_at` (an update that ends the session
    /// takes it out).
    fn entries(&self) -> Vec<Entry> {
        let mut out = vec![Entry::gsi1(
            CheckoutSession::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.clone(),
        )];
        if self.narrowed {
            out.push(self.status_entry(self.status));
        }
        if !self.status.is_final() {
            out.push(Entry::gsi2(
                open_sessions_partition(&Tenant::new(self.project_id.clone(), self.mode)),
                format!("{}#{}", self.expires_at.to_rfc3339(), self.id),
            ));
        }
        out
    }
}

impl CheckoutSession {
    pub fn key(id: &SessionId) -> Key {
        keys::record(keys::Record::CheckoutSession, id)
    }

    pub(super) fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Sessions)
    }

    /// `tenant`'s sessions stored as `status`: the list narrowed on
    /// `gsi4` (`<list>#S#<status>`, member `s_<status>`).
    pub fn by_status(tenant: &Tenant, status: SessionStatus) -> CountedList {
        CheckoutSession::counted_list_of(tenant).narrowed(
            &format!("s_{}", status.as_str()),
            Index::Gsi4,
            format!(
                "{}#S#{}",
                CheckoutSession::list_partition(tenant),
                status.as_str()
            ),
        )
    }

    fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }

    /// Its entry in the narrowing of `status`.
    fn status_entry(&self, status: SessionStatus) -> Entry {
        Entry {
            index: Index::Gsi4,
            partition: CheckoutSession::by_status(&self.tenant(), status).partition,
            sort: self.id.as_str().to_owned(),
        }
    }

    /// The counter writes of a new session, for its insert's transaction:
    /// its list's and (narrowed) its status's, folded per counter item.
    /// Every insert counts through here (not the list's `count_new`
    /// alone: a unit test fails on that).
    pub fn insert_counts(&self) -> Vec<TxOp> {
        let mut ops = self.count_new();
        if self.narrowed {
            merge_counts(
                &mut ops,
                CheckoutSession::by_status(&self.tenant(), self.status)
                    .count_new(&self.id, self.created_at),
            );
        }
        ops
    }

    /// Moving this session (as read) to `to`: `changes` with the status
    /// set and its narrowed entry moved, the condition to write them under
    /// (the status as read, narrowed or not as read) and the counter
    /// writes for the same transaction (fold them in with
    /// [`merge_counts`]). Every write of a session's status goes through
    /// here (a unit test fails on a `set` of it anywhere else).
    pub fn status_change(
        &self,
        to: SessionStatus,
        changes: Changes<CheckoutSession>,
    ) -> StatusChange<CheckoutSession> {
        let tenant = self.tenant();
        counted::value_change(
            self,
            CheckoutSession::STATUS.eq(&self.status),
            changes.set(CheckoutSession::STATUS, &to),
            (
                &CheckoutSession::by_status(&tenant, self.status),
                &CheckoutSession::by_status(&tenant, to),
            ),
            (self.id.as_str(), self.created_at),
        )
    }

    /// The provider the session pays with as it stands: the current
    /// attempt's, else the merchant's choice (an old item's `provider`
    /// after an attempt was that attempt's).
    pub fn current_provider(&self) -> Option<Provider> {
        self.attempt_provider.or(self.provider)
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
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = CheckoutSession)]
pub struct CheckoutSessionView {
    pub id: String,
    pub livemode: bool,
    pub mode: Mode,
    pub flow: Flow,
    pub amount: Paisa,
    pub currency: Currency,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub provider: Option<Provider>,
    pub status: SessionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub payment_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub description: Option<Description>,
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
    pub collect_address: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
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
            provider: s.current_provider(),
            id: s.id.into(),
            mode: s.mode,
            flow: s.flow,
            amount: s.amount,
            currency: s.currency,
            payment_id: s.payment_id.map(String::from),
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
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateCheckout {
    /// Paisa; the provider's and mode's bounds apply (`GET /v1/providers`).
    #[schema(minimum = 1)]
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
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub customer: Option<CustomerInput>,
    #[serde(default)]
    pub collect_address: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
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
pub(super) struct AmountLimits {
    pub min: i64,
    pub max: i64,
}

/// Khalti: at least Rs 10; fonepay in sandbox: at most NPR 1,000 (real
/// money moves); everything at most [`MAX_AMOUNT_PAISA`].
pub(super) fn amount_limits(provider: Provider, mode: Mode) -> AmountLimits {
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
    /// A mobile session's client secret, hashed.
    pub client_secret_sha256: Option<String>,
}

/// Checks a create request against every rule (no store needed).
pub fn validate_create(req: CreateCheckout, mode: Mode) -> Result<ValidCheckout, CheckoutError> {
    let flow = req.flow.unwrap_or(Flow::Hosted);
    if matches!(flow, Flow::Qr | Flow::Mobile) {
        return Err(invalid(
            "flow",
            "flow must be 'hosted' or 'redirect'; QR sessions come from POST /v1/qr/fonepay, \
             mobile ones from POST /v1/mobile/sessions",
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
        client_secret_sha256: None,
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
    pub project_id: ProjectId,
    pub mode: Mode,
    pub api_key_id: ApiKeyId,
    pub spend_cap_paisa: Option<i64>,
}

impl Creator {
    /// The authenticated key `who` creating a session.
    pub fn of(who: &crate::domain::account::Principal) -> Creator {
        Creator {
            project_id: who.tenant().project.clone(),
            mode: who.mode(),
            api_key_id: who.key.id.clone(),
            spend_cap_paisa: who.key.spend_cap_paisa,
        }
    }
}

/// A key's spend counter for one calendar month (UTC), "api key spend":
/// the volume of the sessions it created, only ever added to, in the
/// creation's transaction. Its key is no function of its fields: the
/// record holds it (`pk`, `sk`, read from the item, written as its key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendCounter {
    #[serde(skip_serializing)]
    pub pk: String,
    #[serde(skip_serializing)]
    pub sk: String,
    /// Paisa of the sessions created in the month.
    pub volume: i64,
    /// Epoch seconds after which the counter may go (a month past its
    /// month).
    pub ttl: i64,
}

crate::attrs! { SpendCounter {
    VOLUME: i64 = volume,
    TTL: i64 = ttl,
} }

impl Record for SpendCounter {
    fn item_key(&self) -> Key {
        Key::new(self.pk.as_str(), self.sk.as_str())
    }
}

/// The spend counter of a key for the calendar month (UTC) of `now`.
pub(super) fn spend_counter_key(api_key_id: &ApiKeyId, now: Timestamp) -> Key {
    let d = now.datetime();
    keys::spend_counter(api_key_id, d.year(), d.month())
}

/// The condition under which adding `amount` keeps the month's volume at
/// or under `cap`; `None` when the amount alone is over the cap.
pub(super) fn spend_cap_condition(cap: i64, amount: i64) -> Option<Cond> {
    let room = cap.checked_sub(amount)?;
    (room >= 0).then(|| {
        Cond::Or(vec![
            SpendCounter::VOLUME.missing(),
            SpendCounter::VOLUME.le(&room),
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
        update: Changes::<SpendCounter>::new()
            .add(SpendCounter::VOLUME, amount)
            .set(SpendCounter::TTL, &ttl)
            .into(),
        cond: Some(cond),
    }))
}

/// The new session of `valid`, created at `now`.
pub fn new_session(creator: &Creator, valid: ValidCheckout, now: Timestamp) -> CheckoutSession {
    CheckoutSession {
        id: SessionId::new(),
        project_id: creator.project_id.clone(),
        mode: creator.mode,
        api_key_id: creator.api_key_id.clone(),
        flow: valid.flow,
        amount: valid.amount,
        currency: Currency::Npr,
        provider: valid.provider,
        attempt_provider: None,
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
        billing_invoice_id: None,
        client_secret_sha256: valid.client_secret_sha256,
        counted: true,
        narrowed: true,
    }
}

/// Creates a session in one transaction: the session, the key's spend
/// counter (when it has a cap), the request's idempotency fence and, when
/// the request names a provider that needs the project's own credentials
/// (live, or Fonepay), a check that they are there (no read before). A
/// request whose first run already committed (its fence is there) answers
/// the session that run created.
pub async fn create(
    deps: &Deps,
    creator: &Creator,
    valid: ValidCheckout,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<CheckoutSession, CheckoutError> {
    create_in(&*deps.store, creator, valid, now, fence).await
}

/// [`create`] on a store (for the domain's own callers).
pub(crate) async fn create_in(
    store: &dyn Store,
    creator: &Creator,
    valid: ValidCheckout,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<CheckoutSession, CheckoutError> {
    create_bound_in(store, creator, valid, None, now, fence).await
}

/// [`create_in`] of a session bound to a billing invoice (`billing`), whose
/// success pays it.
pub(crate) async fn create_bound_in(
    store: &dyn Store,
    creator: &Creator,
    valid: ValidCheckout,
    billing: Option<BillingInvoiceId>,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<CheckoutSession, CheckoutError> {
    // Enabled without credentials (sandbox eSewa and Khalti), or with them.
    let needs_credentials = valid
        .provider
        .filter(|p| !is_enabled(*p, creator.mode, false));
    let spend = spend_op(creator, valid.amount.get(), now)?;
    crate::domain::active::touch(
        store,
        &Tenant::new(creator.project_id.clone(), creator.mode),
        now,
    )
    .await?;
    let mut session = new_session(creator, valid, now);
    session.billing_invoice_id = billing;
    let mut ops = vec![session.put_new()?];
    let counter_at = spend.map(|op| {
        ops.push(op);
        ops.len() - 1
    });
    let fence_at = fence.map(|f| {
        ops.push(f.op(&session.id));
        ops.len() - 1
    });
    let credentials_at = needs_credentials.map(|p| {
        ops.push(TxOp::Check {
            key: keys::credentials(&creator.project_id, creator.mode, p),
            cond: Cond::Exists,
        });
        (p, ops.len() - 1)
    });
    // The day's counters, in the same transaction (after the ops above,
    // whose indexes the error handling reads).
    let mut tally = stats::Tally::new();
    tally.session_created(&session);
    tally.apply_to(&mut ops)?;
    ops.extend(session.insert_counts());
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
                if let Some((p, i)) = credentials_at {
                    if failed_at(&e, i) {
                        return Err(CheckoutError::ProviderUnavailable(p));
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
    let stored = crate::domain::record::get::<CheckoutSession>(
        store,
        &CheckoutSession::key(&SessionId::stored(first.as_str())),
    )
    .await?;
    match stored {
        Some(s) => {
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
    deps: &Deps,
    tenant: &Tenant,
    id: &SessionId,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    find_at(&*deps.store, tenant, id, now).await
}

/// [`find`] on a store as of `now` (for the domain's own callers).
pub(crate) async fn find_at(
    store: &dyn Store,
    tenant: &Tenant,
    id: &SessionId,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    let Some(session) = find_any_at(store, id, now).await? else {
        return Ok(None);
    };
    if !tenant.owns(&session.project_id, session.mode) {
        return Ok(None);
    }
    Ok(Some(session))
}

/// The session `id` of any project as of `now` (the public pages know a
/// session by its id alone), with lazy expiry persisted as in [`find`].
pub async fn find_any(
    deps: &Deps,
    id: &SessionId,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    find_any_at(&*deps.store, id, now).await
}

/// [`find_any`] on a store as of `now` (for the domain's own callers).
pub(crate) async fn find_any_at(
    store: &dyn Store,
    id: &SessionId,
    now: Timestamp,
) -> Result<Option<CheckoutSession>, StoreError> {
    let Some(session) =
        crate::domain::record::get::<CheckoutSession>(store, &CheckoutSession::key(id)).await?
    else {
        return Ok(None);
    };
    if session.status_at(now) == SessionStatus::Expired && session.status != SessionStatus::Expired
    {
        return mark_expired(store, &session.id, Some(&session), now, true)
            .await
            .map(Some);
    }
    Ok(Some(session))
}
