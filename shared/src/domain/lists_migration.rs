//! Lists a tenant's payments and refunds from before the filtered lists
//! (`domain::listing`) and counts them, then marks the tenant covered:
//! `dhukuti-admin lists migrate`. Idempotent and safe while traffic runs
//! (`listing::migrate`): one conditional transaction per record.

use super::Tenant;
use super::listing::{self, Migrated};
use super::payments::Payment;
use super::refunds::Refund;
use crate::keys;
use crate::store::{Index, Query, Store, StoreError};

/// What one tenant's migration did, per list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantMigrated {
    pub payments: Migrated,
    pub refunds: Migrated,
}

/// Migrates `tenant`'s payments, then its refunds.
pub async fn migrate(store: &dyn Store, tenant: &Tenant) -> Result<TenantMigrated, StoreError> {
    let by_id =
        |what| Query::partition(keys::per_mode(&tenant.project, tenant.mode, what)).on(Index::Gsi1);
    let payments =
        listing::migrate::<Payment>(store, tenant, by_id(keys::PerMode::Payments)).await?;
    let refunds = listing::migrate::<Refund>(store, tenant, by_id(keys::PerMode::Refunds)).await?;
    Ok(TenantMigrated { payments, refunds })
}
