//! Which providers a project can take payments through in a mode.

use serde::Serialize;

use super::sessions::{CheckoutSession, Flow, amount_limits, check_amount};
use crate::app::Deps;
use crate::domain::credentials::list_configured_providers;
use crate::domain::{Mode, Provider, Tenant};
use crate::store::{Store, StoreError};

/// One provider as `GET /v1/providers` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
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
pub(super) fn is_enabled(provider: Provider, mode: Mode, has_credentials: bool) -> bool {
    has_credentials || (mode == Mode::Sandbox && provider != Provider::Fonepay)
}

/// Every provider, enabled or not, for the project in `mode`.
pub async fn providers(
    deps: &Deps,
    tenant: &Tenant,
) -> Result<Vec<ProviderAvailability>, StoreError> {
    providers_in(&*deps.store, tenant).await
}

/// [`providers`] on a store (for the domain's own callers).
pub(crate) async fn providers_in(
    store: &dyn Store,
    tenant: &Tenant,
) -> Result<Vec<ProviderAvailability>, StoreError> {
    let configured = list_configured_providers(store, &tenant.project)
        .await
        .map_err(|e| match e {
            crate::domain::credentials::CredentialsError::Store(s) => s,
            other => StoreError::Backend(other.to_string()),
        })?;
    Ok(Provider::ALL
        .into_iter()
        .map(|p| {
            let has = configured
                .iter()
                .any(|c| c.provider == p && c.mode == tenant.mode);
            let limits = amount_limits(p, tenant.mode);
            ProviderAvailability {
                provider: p,
                enabled: is_enabled(p, tenant.mode, has),
                sandbox: tenant.mode == Mode::Sandbox && p != Provider::Fonepay,
                min_amount: limits.min,
                max_amount: limits.max,
            }
        })
        .collect())
}

/// The providers a customer of session `s` may pay with: enabled for its
/// project and mode, taking its amount, and only the set one where the
/// session names it (a redirect checkout, a Direct-QR or a mobile
/// session with `provider`).
pub async fn offered(deps: &Deps, s: &CheckoutSession) -> Result<Vec<Provider>, StoreError> {
    let all = providers_in(&*deps.store, &Tenant::new(s.project_id.clone(), s.mode)).await?;
    Ok(all
        .into_iter()
        .filter(|p| p.enabled)
        .filter(|p| check_amount(s.amount.get(), Some(p.provider), s.mode).is_ok())
        .filter(|p| s.flow == Flow::Hosted || s.provider.is_none_or(|set| set == p.provider))
        .map(|p| p.provider)
        .collect())
}
