//! Merchants, projects and API keys: who is calling, in which mode, with
//! which scopes, and the account context they see.
//!
//! Secret keys are stored only as SHA-256 hashes, looked up by hash and
//! compared in constant time. A key belongs to one project and one mode.

use serde::{Deserialize, Serialize};

use super::Mode;
use super::record::{Entry, Record};
use crate::ids::{ApiKeyId, MerchantId, ProjectId};
use crate::keys;
use crate::store::Key;
use crate::time::Timestamp;

mod admin;
mod api_keys;
mod auth;
pub mod cache;
#[cfg(test)]
mod tests;
mod view;

pub use admin::{
    NewKey, create_merchant, create_project, get_merchant, get_project, issue_api_key,
    issue_api_key_with, list_under_merchant, merchant_projects, pause_api_key, reinstate_merchant,
    set_live_invoicing, set_plan, set_seller, storefront, suspend_merchant,
};
pub use api_keys::{
    Rotation, find_api_key, is_plausible_email, list_api_keys, revoke_api_key, revoke_api_key_with,
    rotate_api_key, rotate_api_key_with,
};
pub use auth::{
    AuthError, LAST_USED_EVERY, Principal, authenticate, authenticate_key, hash_secret,
    mode_of_secret, principal_of, publishable_refusal, record_use, secret_key_in_app_refusal,
    shape_of_key,
};
pub use view::{
    AccountView, ApiKeyView, Entitlements, MerchantView, ProjectView,
    SANDBOX_FONEPAY_MAX_PAYMENT_PAISA, account_view,
};

/// What a key may do. Unknown scope strings in storage are ignored, so a
/// newer scope never breaks an older reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    AccountRead,
    PaymentsRead,
    PaymentsWrite,
    LinksRead,
    LinksWrite,
    SessionsRead,
    AnalyticsRead,
    PiiRead,
    InvoicesRead,
    InvoicesWrite,
    RefundsRead,
    RefundsWrite,
    WebhooksRead,
    WebhooksWrite,
    /// Recurring billing (`/v1/billing`): customers, plans and what
    /// follows them.
    BillingRead,
    BillingWrite,
}

impl Scope {
    pub const ALL: [Scope; 16] = [
        Scope::AccountRead,
        Scope::PaymentsRead,
        Scope::PaymentsWrite,
        Scope::LinksRead,
        Scope::LinksWrite,
        Scope::SessionsRead,
        Scope::AnalyticsRead,
        Scope::PiiRead,
        Scope::InvoicesRead,
        Scope::InvoicesWrite,
        Scope::RefundsRead,
        Scope::RefundsWrite,
        Scope::WebhooksRead,
        Scope::WebhooksWrite,
        Scope::BillingRead,
        Scope::BillingWrite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::AccountRead => "account:read",
            Scope::PaymentsRead => "payments:read",
            Scope::PaymentsWrite => "payments:write",
            Scope::LinksRead => "links:read",
            Scope::LinksWrite => "links:write",
            Scope::SessionsRead => "sessions:read",
            Scope::AnalyticsRead => "analytics:read",
            Scope::PiiRead => "pii:read",
            Scope::InvoicesRead => "invoices:read",
            Scope::InvoicesWrite => "invoices:write",
            Scope::RefundsRead => "refunds:read",
            Scope::RefundsWrite => "refunds:write",
            Scope::WebhooksRead => "webhooks:read",
            Scope::WebhooksWrite => "webhooks:write",
            Scope::BillingRead => "billing:read",
            Scope::BillingWrite => "billing:write",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == s)
    }
}

/// The merchant's subscription plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    Free,
    Growth,
    Pro,
}

impl Plan {
    /// Direct-QR (`POST /v1/qr/fonepay`): every paid plan.
    pub fn direct_qr(self) -> bool {
        self != Plan::Free
    }

    /// The billing API (`/v1/billing`): every paid plan, in both modes
    /// (the guide's "Premium"; `docs/decisions-refined.md`).
    pub fn billing_api(self) -> bool {
        self != Plan::Free
    }

    /// Live SMS reminders a month (spec: Free 0, Growth 200, Pro 1,000).
    pub fn sms_monthly_quota(self) -> u32 {
        match self {
            Plan::Free => 0,
            Plan::Growth => 200,
            Plan::Pro => 1000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    pub suspended_at: Timestamp,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    pub paused_at: Timestamp,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Merchant {
    pub id: MerchantId,
    pub name: String,
    pub email: String,
    pub plan: Plan,
    #[serde(default)]
    pub suspension: Option<Suspension>,
    pub created_at: Timestamp,
}

crate::attrs! { Merchant {
    ID: MerchantId = id,
    NAME: String = name,
    EMAIL: String = email,
    PLAN: Plan = plan,
    SUSPENSION: Option<Suspension> = suspension,
    CREATED_AT: Timestamp = created_at,
} }

impl Merchant {
    pub fn key(id: &MerchantId) -> Key {
        keys::record(keys::Record::Merchant, id)
    }
}

impl Record for Merchant {
    fn item_key(&self) -> Key {
        Merchant::key(&self.id)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub id: ProjectId,
    pub merchant_id: MerchantId,
    pub name: String,
    /// Whether live one-time invoices are enabled (sandbox always is).
    #[serde(default)]
    pub live_invoicing: bool,
    /// The seller profile copied onto invoices at finalize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seller: Option<Seller>,
    pub created_at: Timestamp,
}

crate::attrs! { Project {
    ID: ProjectId = id,
    MERCHANT_ID: MerchantId = merchant_id,
    NAME: String = name,
    LIVE_INVOICING: bool = live_invoicing,
    SELLER: Option<Seller> = seller,
    CREATED_AT: Timestamp = created_at,
} }

/// A project's seller profile (spec "seller": name, legalName, email,
/// logoUrl, brandColor), set by the operator (`dhukuti-admin project
/// seller`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seller {
    pub name: Option<String>,
    pub legal_name: Option<String>,
    pub email: Option<String>,
    pub logo_url: Option<String>,
    pub brand_color: Option<String>,
}

impl Project {
    pub fn key(id: &ProjectId) -> Key {
        keys::record(keys::Record::Project, id)
    }
}

impl Record for Project {
    fn item_key(&self) -> Key {
        Project::key(&self.id)
    }

    /// Listed under its merchant, oldest first (the dashboard's project
    /// switch).
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            keys::merchant_projects(&self.merchant_id),
            format!("{}#{}", self.created_at.to_rfc3339(), self.id),
        )]
    }
}

/// `secret` keys hold every scope they list for a server; `restricted`
/// keys are narrowed to a few scopes for one job; `publishable` keys
/// (`pk_test_…`, `pk_live_…`) are safe to ship in an app: they call only
/// the mobile endpoints, with a session's client secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    Secret,
    Restricted,
    Publishable,
}

impl KeyKind {
    /// The prefix of a key of this kind in `mode`.
    pub fn prefix(self, mode: Mode) -> &'static str {
        match (self, mode) {
            (KeyKind::Publishable, Mode::Sandbox) => "pk_test_",
            (KeyKind::Publishable, Mode::Live) => "pk_live_",
            (_, mode) => mode.key_prefix(),
        }
    }
}

/// A stored API key. The secret itself is never stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: ApiKeyId,
    /// Hex SHA-256 of the secret.
    pub key_hash: String,
    pub merchant_id: MerchantId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub kind: KeyKind,
    pub scopes: Vec<String>,
    #[serde(default)]
    pub description: String,
    /// First 12 characters of the secret, e.g. `sk_test_AbCd`.
    pub prefix: String,
    /// Last 4 characters of the secret.
    pub hint: String,
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    #[serde(default)]
    pub last_used_at: Option<Timestamp>,
    #[serde(default)]
    pub spend_cap_paisa: Option<i64>,
    #[serde(default)]
    pub pause: Option<Pause>,
    pub created_at: Timestamp,
}

crate::attrs! { ApiKey {
    ID: ApiKeyId = id,
    KEY_HASH: String = key_hash,
    MERCHANT_ID: MerchantId = merchant_id,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    KIND: KeyKind = kind,
    SCOPES: Vec<String> = scopes,
    DESCRIPTION: String = description,
    PREFIX: String = prefix,
    HINT: String = hint,
    EXPIRES_AT: Option<Timestamp> = expires_at,
    LAST_USED_AT: Option<Timestamp> = last_used_at,
    SPEND_CAP_PAISA: Option<i64> = spend_cap_paisa,
    PAUSE: Option<Pause> = pause,
    CREATED_AT: Timestamp = created_at,
} }

impl ApiKey {
    pub fn key_for_hash(hash_hex: &str) -> Key {
        keys::api_key(hash_hex)
    }

    /// A secret key has every scope, those added after it was issued
    /// included; a restricted key only those it was granted.
    pub fn has_scope(&self, scope: Scope) -> bool {
        self.kind == KeyKind::Secret || self.scopes.iter().any(|s| s == scope.as_str())
    }
}

impl Record for ApiKey {
    fn item_key(&self) -> Key {
        ApiKey::key_for_hash(&self.key_hash)
    }

    /// Listed in its project's keys, by id.
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            keys::project_keys(&self.project_id),
            self.id.to_string(),
        )]
    }
}
