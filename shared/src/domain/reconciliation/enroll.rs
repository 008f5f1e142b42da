//! The back-fill of the daily pull's list (`PULL#<provider>`,
//! [`PulledTenant`]): a tenant whose credentials at a pulled provider were
//! stored before the list existed has no entry until they are saved again.
//!
//! [`project`] (`dhukuti-admin reconcile enroll <project>`) lists every
//! such tenant of a project (the store has no scan: per project);
//! [`tenant`] lists one, and every Khalti run the tenant starts (API,
//! dashboard, admin tool) calls it, so a merchant who runs Khalti once is
//! pulled daily after. Both are idempotent and conditioned: an entry
//! already there costs one read and is left as it is; a missing one is
//! written in a transaction that checks the credentials are still stored
//! (a deletion racing it wins: no entry outlives its credentials), and
//! only if still absent.

use serde::Serialize;

use crate::domain::credentials::{self, CredentialsError, PULLED, PulledTenant};
use crate::domain::record::Record;
use crate::domain::{Provider, Tenant};
use crate::ids::ProjectId;
use crate::keys;
use crate::store::{Cond, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// What a back-fill did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Enrolled {
    /// Entries written now.
    pub listed: usize,
    /// Tenants listed already (or whose credentials went meanwhile).
    pub already: usize,
}

/// Whether `tenant`'s entry in `provider`'s pulled list was written now:
/// `false` when it was there already, the provider is not pulled, or the
/// tenant has no credentials of its own there.
pub async fn tenant(
    store: &dyn Store,
    tenant: &Tenant,
    provider: Provider,
    now: Timestamp,
) -> Result<bool, StoreError> {
    if !PULLED.contains(&provider) {
        return Ok(false);
    }
    let entry = PulledTenant {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        provider,
        since: now,
    };
    if store.get(&entry.item_key()).await?.is_some() {
        return Ok(false);
    }
    let ops = vec![
        TxOp::Check {
            key: keys::credentials(&tenant.project, tenant.mode, provider),
            cond: Cond::Exists,
        },
        TxOp::Put {
            item: entry.to_item()?,
            cond: Some(Cond::NotExists),
        },
    ];
    match store.transact(ops).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_condition_failure() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Lists every tenant (mode) of `project` with credentials at a pulled
/// provider that is not listed yet.
pub async fn project(
    store: &dyn Store,
    project: &ProjectId,
    now: Timestamp,
) -> Result<Enrolled, CredentialsError> {
    let mut done = Enrolled::default();
    for c in credentials::list_configured_providers(store, project).await? {
        if !PULLED.contains(&c.provider) {
            continue;
        }
        let t = Tenant::new(project.clone(), c.mode);
        if self::tenant(store, &t, c.provider, now).await? {
            done.listed += 1;
        } else {
            done.already += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AppState;
    use crate::domain::Mode;
    use crate::domain::account::{self, Plan};
    use crate::domain::reconciliation::daily;
    use crate::providers::ProviderHub;
    use crate::secrets::{CredentialsKey, CredentialsKeys, ProviderCredentials};
    use crate::time::{Clock, SystemClock};

    fn listed(page: &[(String, PulledTenant)]) -> Vec<Tenant> {
        page.iter().map(|(_, t)| t.tenant()).collect()
    }

    async fn page(store: &dyn Store) -> Vec<(String, PulledTenant)> {
        credentials::pulled_after(store, Provider::Khalti, None, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .0
    }

    fn later() -> std::time::Instant {
        std::time::Instant::now() + std::time::Duration::from_secs(60)
    }

    /// Credentials stored the old way (without the list's entry) are
    /// listed by the back-fill, once: a second run changes nothing; a
    /// tenant without its own Khalti credentials is never listed, nor
    /// one whose credentials were removed.
    #[tokio::test]
    async fn the_back_fill_lists_old_credentials_once() {
        let keys = CredentialsKeys::single(
            CredentialsKey::new("k1", [7u8; 32]).unwrap_or_else(|e| panic!("{e}")),
        );
        let state = AppState::for_tests().with_providers(ProviderHub::keys_only(keys.clone()));
        let store = &*state.store;
        let now = SystemClock.now();
        let merchant =
            account::create_merchant(store, now, "Sita", "sita@example.com", Plan::Growth)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        let project = account::create_project(store, now, &merchant, "Shop", false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let khalti = ProviderCredentials::Khalti {
            secret_key: "live_secret_key_0123456789abcdef".into(),
        };
        let esewa = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "8gBm/:&EnhH.1/q".into(),
        };
        let sandbox = Tenant::new(project.id.clone(), Mode::Sandbox);
        let live = Tenant::new(project.id.clone(), Mode::Live);
        for (t, c) in [(&sandbox, &khalti), (&live, &khalti), (&live, &esewa)] {
            credentials::put_credentials(store, &keys, now, t, c)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // As stored before the list existed: no entries.
        for t in [&sandbox, &live] {
            store
                .delete(
                    &keys::pulled_tenant(Provider::Khalti, &t.project, t.mode),
                    None,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(page(store).await.is_empty());
        // The daily pull takes nobody.
        let day = chrono::NaiveDate::from_ymd_opt(2026, 11, 28).unwrap_or_default();
        let r = daily::pull_day(&state, day, now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r, daily::PullReport::default());

        let done = self::project(store, &project.id, now)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            done,
            Enrolled {
                listed: 2,
                already: 0
            }
        );
        let mut got = listed(&page(store).await);
        got.sort_by_key(|t| t.mode.as_str());
        assert_eq!(got, vec![live.clone(), sandbox.clone()]);
        let before = page(store).await;
        // Now the daily pull takes both (their pulls fail here: this
        // state has no provider clients).
        let next = day + chrono::Duration::days(1);
        let r = daily::pull_day(&state, next, now, later())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.failed, 2, "{r:?}");

        // Twice: nothing changes (the entries keep their `since`).
        let done = self::project(store, &project.id, now.plus(chrono::Duration::hours(1)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            done,
            Enrolled {
                listed: 0,
                already: 2
            }
        );
        assert_eq!(page(store).await, before);

        // Credentials gone: not listed again.
        credentials::delete_credentials(store, &live, Provider::Khalti)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !tenant(store, &live, Provider::Khalti, now)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
        assert_eq!(listed(&page(store).await), vec![sandbox.clone()]);
        // A provider not pulled: never listed.
        assert!(
            !tenant(store, &live, Provider::Esewa, now)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
    }
}
