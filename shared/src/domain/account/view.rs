//! What `GET /v1/account` answers: the merchant, project, key and
//! entitlements, with the email masked.

use serde::Serialize;

use super::auth::Principal;
use super::{KeyKind, Plan, Project, Scope};
use crate::app::Deps;
use crate::domain::Mode;
use crate::store::StoreError;
use crate::time::Timestamp;

/// `r***@example.com`: the first character and the domain, so a merchant
/// recognises the address without the key exposing it.
pub(super) fn mask_email(email: &str) -> String {
    match email.split_once('@') {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => {
            let first: String = local.chars().take(1).collect();
            format!("{first}***@{domain}")
        }
        _ => "***".to_owned(),
    }
}

/// `GET /v1/account`, snake_case as the spec writes it.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(as = Account)]
pub struct AccountView {
    pub merchant: MerchantView,
    pub project: ProjectView,
    pub api_key: ApiKeyView,
    pub plan: Plan,
    pub entitlements: Entitlements,
}

#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(as = Merchant)]
pub struct MerchantView {
    pub id: String,
    pub name: String,
    pub email: String,
    pub created_at: Timestamp,
}

#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(as = Project)]
pub struct ProjectView {
    pub id: String,
    pub name: String,
    pub mode: Mode,
    pub created_at: Timestamp,
}

#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(as = ApiKey)]
pub struct ApiKeyView {
    pub id: String,
    pub prefix: String,
    pub hint: String,
    pub kind: KeyKind,
    pub scopes: Vec<String>,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub last_used_at: Option<Timestamp>,
    /// Nullable (decisions.md): always present.
    #[schema(required)]
    pub spend_cap_paisa: Option<i64>,
}

/// What the plan and the project allow.
#[derive(Clone, Debug, Serialize, PartialEq, utoipa::ToSchema)]
pub struct Entitlements {
    pub live_invoicing: bool,
    pub sms_monthly_quota: u32,
    pub sandbox_fonepay_max_payment_paisa: i64,
    pub sandbox_fonepay_max_month_paisa: i64,
    /// Direct-QR (`POST /v1/qr/fonepay`): every paid plan.
    pub fonepay_direct_qr: bool,
}

/// Sandbox fonepay caps (spec: NPR 1,000 a payment, NPR 5,000 a month).
pub const SANDBOX_FONEPAY_MAX_PAYMENT_PAISA: i64 = 100_000;
const SANDBOX_FONEPAY_MAX_MONTH_PAISA: i64 = 500_000;

/// The account context of the calling key: one more store read (the
/// project) on top of authentication.
pub async fn account_view(deps: &Deps, who: &Principal) -> Result<AccountView, StoreError> {
    let store = &*deps.store;
    let project: Project =
        match crate::domain::record::get(store, &Project::key(&who.key.project_id)).await? {
            Some(project) => project,
            None => {
                return Err(StoreError::Backend(format!(
                    "project {} of key {} is missing",
                    who.key.project_id, who.key.id
                )));
            }
        };
    let email = if who.key.has_scope(Scope::PiiRead) {
        who.merchant.email.clone()
    } else {
        mask_email(&who.merchant.email)
    };
    let key = &who.key;
    Ok(AccountView {
        merchant: MerchantView {
            id: who.merchant.id.to_string(),
            name: who.merchant.name.clone(),
            email,
            created_at: who.merchant.created_at,
        },
        project: ProjectView {
            id: project.id.to_string(),
            name: project.name.clone(),
            mode: key.mode,
            created_at: project.created_at,
        },
        api_key: ApiKeyView {
            id: key.id.to_string(),
            prefix: key.prefix.clone(),
            hint: key.hint.clone(),
            kind: key.kind,
            scopes: key.scopes.clone(),
            description: key.description.clone(),
            expires_at: key.expires_at,
            last_used_at: key.last_used_at,
            spend_cap_paisa: key.spend_cap_paisa,
        },
        plan: who.merchant.plan,
        entitlements: Entitlements {
            live_invoicing: project.live_invoicing,
            sms_monthly_quota: who.merchant.plan.sms_monthly_quota(),
            sandbox_fonepay_max_payment_paisa: SANDBOX_FONEPAY_MAX_PAYMENT_PAISA,
            sandbox_fonepay_max_month_paisa: SANDBOX_FONEPAY_MAX_MONTH_PAISA,
            fonepay_direct_qr: who.merchant.plan.direct_qr(),
        },
    })
}
