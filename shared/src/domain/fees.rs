//! The fee a merchant's contract with a provider charges, as the merchant
//! configured it: per project, mode and provider, a rate in basis points
//! and/or a fixed part in paisa. Stored in the project's partition beside
//! its credentials at that provider (`pk = PROJ#{project}`,
//! `sk = FEE#{mode}#{provider}`), set on the dashboard's provider settings
//! page. A payment's success snapshots the fee computed from it
//! ([`FeeRate::fee_for`]) when the provider states none
//! (`docs/reconciliation.md`).

use serde::{Deserialize, Serialize};

use super::record::{Record, from_item};
use super::{Mode, Provider, Tenant};
use crate::Deps;
use crate::ids::ProjectId;
use crate::keys;
use crate::money::Paisa;
use crate::store::{Key, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// At most 100 %.
pub const MAX_BASIS_POINTS: i64 = 10_000;
/// At most NPR 10,000 fixed per payment.
pub const MAX_FIXED: i64 = 1_000_000;

/// One provider's configured fee for a project in one mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeeRate {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// Hundredths of a percent of the amount (`250` is 2.5 %).
    pub basis_points: i64,
    /// Paisa added per payment.
    pub fixed: Paisa,
    pub updated_at: Timestamp,
}

crate::attrs! { FeeRate {
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    PROVIDER: Provider = provider,
    BASIS_POINTS: i64 = basis_points,
    FIXED: Paisa = fixed,
    UPDATED_AT: Timestamp = updated_at,
} }

impl Record for FeeRate {
    fn item_key(&self) -> Key {
        keys::fee_rate(&self.project_id, self.mode, self.provider)
    }
}

/// Why a rate cannot be stored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FeeRateError {
    #[error("basis points must be between 0 and {MAX_BASIS_POINTS}")]
    BasisPoints,
    #[error("the fixed fee must be between 0 and {MAX_FIXED} paisa")]
    Fixed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FeeRate {
    /// The fee on `amount`: its basis points rounded half up to the
    /// paisa, plus the fixed part, never more than the amount (so a net
    /// is never negative). Integer arithmetic throughout.
    pub fn fee_for(&self, amount: Paisa) -> Paisa {
        let a = i128::from(amount.get());
        let bps = i128::from(self.basis_points.clamp(0, MAX_BASIS_POINTS));
        let share = (a * bps + 5_000) / 10_000;
        let fee = (share + i128::from(self.fixed.get())).min(a).max(0);
        Paisa::new(i64::try_from(fee).unwrap_or(0)).unwrap_or(Paisa::ZERO)
    }

    /// A rate to store, checked.
    pub fn new(
        tenant: &Tenant,
        provider: Provider,
        basis_points: i64,
        fixed: i64,
        now: Timestamp,
    ) -> Result<FeeRate, FeeRateError> {
        if !(0..=MAX_BASIS_POINTS).contains(&basis_points) {
            return Err(FeeRateError::BasisPoints);
        }
        if !(0..=MAX_FIXED).contains(&fixed) {
            return Err(FeeRateError::Fixed);
        }
        Ok(FeeRate {
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            provider,
            basis_points,
            fixed: Paisa::new(fixed).map_err(|_| FeeRateError::Fixed)?,
            updated_at: now,
        })
    }
}

/// The tenant's rate at `provider`, if configured.
pub async fn get(
    store: &dyn Store,
    tenant: &Tenant,
    provider: Provider,
) -> Result<Option<FeeRate>, StoreError> {
    super::record::get(
        store,
        &keys::fee_rate(&tenant.project, tenant.mode, provider),
    )
    .await
}

/// Stores (or replaces) `rate`, with `also` (the dashboard's audit entry)
/// in the same transaction.
pub async fn set(store: &dyn Store, rate: &FeeRate, also: Vec<TxOp>) -> Result<(), StoreError> {
    let mut ops = vec![TxOp::Put {
        item: rate.to_item()?,
        cond: None,
    }];
    ops.extend(also);
    store.transact(ops).await
}

/// Removes the tenant's rate at `provider` (payments then get no
/// configured fee), with `also` in the same transaction.
pub async fn clear(
    store: &dyn Store,
    tenant: &Tenant,
    provider: Provider,
    also: Vec<TxOp>,
) -> Result<(), StoreError> {
    let mut ops = vec![TxOp::Delete {
        key: keys::fee_rate(&tenant.project, tenant.mode, provider),
        cond: None,
    }];
    ops.extend(also);
    store.transact(ops).await
}

/// The tenant's rates, by provider (the dashboard's settings page).
pub async fn configured(deps: &Deps, tenant: &Tenant) -> Result<Vec<FeeRate>, StoreError> {
    all(&*deps.store, tenant).await
}

/// Sets the tenant's rate at `provider` at the deps' time (checked: see
/// [`FeeRate::new`]), with `also` (the audit entry) in the transaction.
pub async fn configure(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
    basis_points: i64,
    fixed: i64,
    also: Vec<TxOp>,
) -> Result<FeeRate, FeeRateError> {
    let rate = FeeRate::new(tenant, provider, basis_points, fixed, deps.clock.now())?;
    set(&*deps.store, &rate, also).await?;
    Ok(rate)
}

/// Removes the tenant's rate at `provider`, with `also`.
pub async fn unconfigure(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
    also: Vec<TxOp>,
) -> Result<(), StoreError> {
    clear(&*deps.store, tenant, provider, also).await
}

/// Every configured rate of the tenant, by provider.
pub async fn all(store: &dyn Store, tenant: &Tenant) -> Result<Vec<FeeRate>, StoreError> {
    let mut out = Vec::new();
    for provider in Provider::ALL {
        if let Some(item) = store
            .get(&keys::fee_rate(&tenant.project, tenant.mode, provider))
            .await?
        {
            out.push(from_item(item)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{Clock, SystemClock};

    fn rate(bps: i64, fixed: i64) -> FeeRate {
        let t = Tenant::new("proj_a", Mode::Live);
        match FeeRate::new(&t, Provider::Esewa, bps, fixed, SystemClock.now()) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    fn p(v: i64) -> Paisa {
        Paisa::new(v).unwrap_or_default()
    }

    #[test]
    fn the_fee_is_basis_points_rounded_half_up_plus_the_fixed_part() {
        // 2.5 % of NPR 100.00 = 250 paisa.
        assert_eq!(rate(250, 0).fee_for(p(10_000)), p(250));
        // 1.5 % of 333 paisa = 4.995 -> 5; of 330 = 4.95 -> 5; of 329 = 4.935 -> 5;
        // of 300 = 4.5 -> 5 (half up); of 299 = 4.485 -> 4.
        assert_eq!(rate(150, 0).fee_for(p(333)), p(5));
        assert_eq!(rate(150, 0).fee_for(p(300)), p(5));
        assert_eq!(rate(150, 0).fee_for(p(299)), p(4));
        assert_eq!(rate(0, 500).fee_for(p(10_000)), p(500));
        assert_eq!(rate(200, 300).fee_for(p(10_000)), p(500));
        // Never more than the amount.
        assert_eq!(rate(0, 500).fee_for(p(100)), p(100));
        assert_eq!(rate(10_000, 0).fee_for(p(i64::MAX)), p(i64::MAX));
        assert_eq!(rate(0, 0).fee_for(p(10_000)), p(0));
    }

    #[test]
    fn rates_out_of_range_are_refused() {
        let t = Tenant::new("proj_a", Mode::Live);
        let now = SystemClock.now();
        for (bps, fixed, err) in [
            (-1, 0, FeeRateError::BasisPoints),
            (10_001, 0, FeeRateError::BasisPoints),
            (0, -1, FeeRateError::Fixed),
            (0, MAX_FIXED + 1, FeeRateError::Fixed),
        ] {
            assert_eq!(
                FeeRate::new(&t, Provider::Khalti, bps, fixed, now),
                Err(err)
            );
        }
        assert!(FeeRate::new(&t, Provider::Khalti, 10_000, MAX_FIXED, now).is_ok());
    }

    #[tokio::test]
    async fn a_rate_is_per_project_mode_and_provider() {
        let store = crate::testenv::memory_store();
        let live = Tenant::new("proj_a", Mode::Live);
        let r = rate(250, 100);
        assert!(set(&*store, &r, Vec::new()).await.is_ok());
        assert_eq!(
            get(&*store, &live, Provider::Esewa).await,
            Ok(Some(r.clone()))
        );
        assert_eq!(get(&*store, &live, Provider::Khalti).await, Ok(None));
        let sandbox = Tenant::new("proj_a", Mode::Sandbox);
        assert_eq!(get(&*store, &sandbox, Provider::Esewa).await, Ok(None));
        assert_eq!(all(&*store, &live).await, Ok(vec![r]));
        assert!(
            clear(&*store, &live, Provider::Esewa, Vec::new())
                .await
                .is_ok()
        );
        assert_eq!(get(&*store, &live, Provider::Esewa).await, Ok(None));
    }
}
