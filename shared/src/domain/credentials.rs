//! A project's credentials at each payment provider, per mode, encrypted at
//! rest.
//!
//! Each `(project, mode, provider)` has at most one stored item, in the
//! project's partition (`pk = PROJ#{project}`, `sk = CRED#{mode}#{provider}`),
//! so listing them is a strongly consistent table query. The item holds the
//! AES-256-GCM ciphertext of the credentials (JSON), its 96-bit random
//! nonce and the id of the master key that sealed it; never a plaintext
//! field. The associated data binds the ciphertext to its project, mode,
//! provider and key id: copied into another record, it no longer decrypts.
//!
//! The master key is 32 bytes from configuration ([`KEY_ENV`], base64,
//! optionally `id:base64`). Older keys listed in [`PREVIOUS_KEYS_ENV`] still
//! decrypt what they sealed, so the master key can be rotated: configure the
//! new one as current, keep the old one as previous, run
//! [`reencrypt_credentials`] for every project, then drop the old key.
//!
//! Deployed functions read the keys from a Secrets Manager secret named
//! by [`KEY_SECRET_ENV`] instead, once at cold start (the SDK call is in
//! `crate::app`); [`CredentialsKeys::from_secret_string`] reads its value.

use aes_gcm::Nonce;
use aes_gcm::aead::{Aead, Payload};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::TryRngCore;
use serde::{Deserialize, Serialize};

use super::record::{Record, from_item};
use super::{Mode, Provider};
use crate::Deps;
use crate::domain::Tenant;
use crate::ids::ProjectId;
use crate::keys;
use crate::providers::hub::{HubError, ProviderHub};
use crate::providers::probe::{self, Verdict};
use crate::store::{Cond, Key, Query, SkCond, Store, StoreError, TxOp};
use crate::time::Timestamp;

use crate::secrets::{ALG, NONCE_LEN, Plaintext};
pub use crate::secrets::{
    CredentialsError, CredentialsKey, CredentialsKeys, DEFAULT_KEY_ID, KEY_ENV, KEY_SECRET_ENV,
    PREVIOUS_KEYS_ENV, ProviderCredentials,
};

/// The stored item: ciphertext, nonce and key id, no plaintext field.
/// Written whole each time (replaced, never updated).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredCredentials {
    project_id: ProjectId,
    mode: Mode,
    provider: Provider,
    /// The id of the master key that sealed it (not one of our ids).
    #[serde(rename = "key_id")]
    master_key: String,
    alg: String,
    /// Base64 of the 96-bit nonce.
    nonce: String,
    /// Base64 of the AES-256-GCM ciphertext and its 128-bit tag.
    ciphertext: String,
    updated_at: Timestamp,
}

crate::attrs! { StoredCredentials {
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    PROVIDER: Provider = provider,
    MASTER_KEY: String = master_key as "key_id",
    ALG: String = alg,
    NONCE: String = nonce,
    CIPHERTEXT: String = ciphertext,
    UPDATED_AT: Timestamp = updated_at,
} }

impl Record for StoredCredentials {
    fn item_key(&self) -> Key {
        credentials_key(
            &Tenant::new(self.project_id.clone(), self.mode),
            self.provider,
        )
    }
}

/// One configured provider of a project, without any secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConfiguredProvider {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    /// The id of the master key that sealed the credentials.
    #[serde(rename = "key_id")]
    pub master_key: String,
    pub updated_at: Timestamp,
}

impl From<&StoredCredentials> for ConfiguredProvider {
    fn from(s: &StoredCredentials) -> Self {
        ConfiguredProvider {
            project_id: s.project_id.clone(),
            mode: s.mode,
            provider: s.provider,
            master_key: s.master_key.clone(),
            updated_at: s.updated_at,
        }
    }
}

/// The providers whose statement is pulled daily from their API
/// (`domain::reconciliation::daily`): a tenant with its own credentials
/// there is listed ([`PulledTenant`]) while they are stored.
pub const PULLED: [Provider; 1] = [Provider::Khalti];

/// A tenant whose statement at `provider` is pulled daily: written with
/// its credentials there (same transaction), deleted with them.
/// Credentials stored before this list existed are listed by
/// `reconciliation::enroll` (`dhukuti-admin reconcile enroll <project>`,
/// or the tenant's first Khalti run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulledTenant {
    pub project_id: ProjectId,
    pub mode: Mode,
    pub provider: Provider,
    pub since: Timestamp,
}

impl PulledTenant {
    pub fn tenant(&self) -> Tenant {
        Tenant::new(self.project_id.clone(), self.mode)
    }
}

impl Record for PulledTenant {
    fn item_key(&self) -> Key {
        keys::pulled_tenant(self.provider, &self.project_id, self.mode)
    }
}

/// Up to `limit` tenants pulled at `provider`, in order, after the sort
/// key `after` (each with its sort key, to resume after it); and whether
/// more follow.
pub async fn pulled_after(
    store: &dyn Store,
    provider: Provider,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<(String, PulledTenant)>, bool), StoreError> {
    let mut query = Query::partition(keys::pulled_partition(provider)).limit(limit);
    if let Some(after) = after {
        query = query.sk(SkCond::Gt(after.to_owned()));
    }
    let page = store.query(&query).await?;
    let more = page.last_key.is_some();
    let mut out = Vec::with_capacity(page.items.len());
    for item in page.items {
        let t: PulledTenant = from_item(item)?;
        let sort = t.item_key().sk;
        out.push((sort, t));
    }
    Ok((out, more))
}

fn project_partition(project: &ProjectId) -> String {
    keys::project_partition(project)
}

fn project_key(project: &ProjectId) -> Key {
    keys::record(keys::Record::Project, project)
}

fn credentials_key(tenant: &Tenant, provider: Provider) -> Key {
    keys::credentials(&tenant.project, tenant.mode, provider)
}

/// The associated data: what the ciphertext belongs to. NUL separators
/// keep the fields apart (ids never contain NUL).
fn associated_data(tenant: &Tenant, provider: Provider, master_key: &str) -> Vec<u8> {
    format!(
        "dhukuti/credentials/v1\0{}\0{}\0{}\0{master_key}",
        tenant.project,
        tenant.mode.as_str(),
        provider.as_str()
    )
    .into_bytes()
}

fn describe(tenant: &Tenant, provider: Provider) -> String {
    format!(
        "{} {} {}",
        tenant.project,
        tenant.mode.as_str(),
        provider.as_str()
    )
}

fn seal(
    key: &CredentialsKey,
    tenant: &Tenant,
    creds: &ProviderCredentials,
    now: Timestamp,
) -> Result<StoredCredentials, CredentialsError> {
    let provider = creds.provider();
    let plaintext = serde_json::to_vec(&Plaintext::from(creds))
        .map_err(|e| CredentialsError::Crypto(format!("cannot encode credentials: {e}")))?;
    let aad = associated_data(tenant, provider, &key.id);
    let sealed = seal_bytes(key, &plaintext, &aad)?;
    Ok(StoredCredentials {
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        provider,
        master_key: sealed.master_key,
        alg: sealed.alg,
        nonce: sealed.nonce,
        ciphertext: sealed.ciphertext,
        updated_at: now,
    })
}

/// AES-256-GCM of `plaintext` under `key` with a fresh random nonce.
fn seal_bytes(
    key: &CredentialsKey,
    plaintext: &[u8],
    aad: &[u8],
) -> Result<SealedSecret, CredentialsError> {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng
        .try_fill_bytes(&mut nonce)
        .map_err(|e| CredentialsError::Crypto(format!("no randomness for a nonce: {e}")))?;
    let ciphertext = key
        .cipher()
        .encrypt(
            &Nonce::from(nonce),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| CredentialsError::Crypto("encryption failed".into()))?;
    Ok(SealedSecret {
        master_key: key.id.clone(),
        alg: ALG.to_owned(),
        nonce: STANDARD.encode(nonce),
        ciphertext: STANDARD.encode(ciphertext),
    })
}

/// Opens what [`seal_bytes`] sealed, found as `what`; `aad_for` gives the
/// associated data for the sealing key's id.
fn open_bytes(
    keys: &CredentialsKeys,
    sealed: &SealedSecret,
    what: &str,
    aad_for: impl Fn(&str) -> Vec<u8>,
) -> Result<Vec<u8>, CredentialsError> {
    let corrupt = |why: &str| CredentialsError::Corrupt(what.to_owned(), why.to_owned());
    if sealed.alg != ALG {
        return Err(corrupt("unknown algorithm"));
    }
    let key = keys
        .by_id(&sealed.master_key)
        .ok_or_else(|| CredentialsError::UnknownKey {
            key_id: sealed.master_key.clone(),
            what: what.to_owned(),
        })?;
    let nonce: [u8; NONCE_LEN] = STANDARD
        .decode(&sealed.nonce)
        .ok()
        .and_then(|n| n.as_slice().try_into().ok())
        .ok_or_else(|| corrupt("bad nonce"))?;
    let ciphertext = STANDARD
        .decode(&sealed.ciphertext)
        .map_err(|_| corrupt("bad ciphertext encoding"))?;
    key.cipher()
        .decrypt(
            &Nonce::from(nonce),
            Payload {
                msg: &ciphertext,
                aad: &aad_for(&key.id),
            },
        )
        .map_err(|_| CredentialsError::Decrypt(what.to_owned()))
}

/// Decrypts a stored record as found at `(tenant, provider)`: the
/// record's own claims are not trusted, the place it was read from is.
fn open(
    keys: &CredentialsKeys,
    stored: &StoredCredentials,
    tenant: &Tenant,
    provider: Provider,
) -> Result<ProviderCredentials, CredentialsError> {
    let what = describe(tenant, provider);
    let corrupt = |why: &str| CredentialsError::Corrupt(what.clone(), why.to_owned());
    let sealed = SealedSecret {
        master_key: stored.master_key.clone(),
        alg: stored.alg.clone(),
        nonce: stored.nonce.clone(),
        ciphertext: stored.ciphertext.clone(),
    };
    let plaintext = open_bytes(keys, &sealed, &what, |master_key| {
        associated_data(tenant, provider, master_key)
    })?;
    let creds: ProviderCredentials = serde_json::from_slice::<Plaintext>(&plaintext)
        .map_err(|_| corrupt("plaintext does not parse"))?
        .into();
    if creds.provider() != provider {
        return Err(corrupt("provider mismatch"));
    }
    Ok(creds)
}

/// Another secret sealed with the master key (a webhook signing secret):
/// the same AES-256-GCM sealing as provider credentials, bound through the
/// associated data to a `context` (what the secret belongs to) and to the
/// key id, so a sealed value copied elsewhere no longer opens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSecret {
    /// The id of the master key that sealed it (not one of our ids).
    #[serde(rename = "key_id")]
    pub master_key: String,
    pub alg: String,
    /// Base64 of the 96-bit nonce.
    pub nonce: String,
    /// Base64 of the ciphertext and its tag.
    pub ciphertext: String,
}

fn secret_aad(context: &str, master_key: &str) -> Vec<u8> {
    format!("dhukuti/secret/v1\0{context}\0{master_key}").into_bytes()
}

/// Seals `secret` for `context` with the current master key.
pub fn seal_secret(
    keys: &CredentialsKeys,
    context: &str,
    secret: &str,
) -> Result<SealedSecret, CredentialsError> {
    let key = keys.current();
    seal_bytes(key, secret.as_bytes(), &secret_aad(context, &key.id))
}

/// Opens a [`SealedSecret`] as found for `context`.
pub fn open_secret(
    keys: &CredentialsKeys,
    sealed: &SealedSecret,
    context: &str,
) -> Result<String, CredentialsError> {
    let plaintext = open_bytes(keys, sealed, context, |master_key| {
        secret_aad(context, master_key)
    })?;
    String::from_utf8(plaintext).map_err(|_| {
        CredentialsError::Corrupt(context.to_owned(), "plaintext is not text".to_owned())
    })
}

/// Stores (or replaces) the credentials of `project_id` for one mode and
/// the provider they are for, sealed with the current master key. Fails
/// with [`CredentialsError::ProjectNotFound`] when the project does not
/// exist.
pub async fn put_credentials(
    store: &dyn Store,
    keys: &CredentialsKeys,
    now: Timestamp,
    tenant: &Tenant,
    creds: &ProviderCredentials,
) -> Result<ConfiguredProvider, CredentialsError> {
    put_credentials_with(store, keys, now, tenant, creds, Vec::new()).await
}

/// [`put_credentials`] with `also` (the dashboard's audit entry) in the
/// same transaction.
pub async fn put_credentials_with(
    store: &dyn Store,
    keys: &CredentialsKeys,
    now: Timestamp,
    tenant: &Tenant,
    creds: &ProviderCredentials,
    also: Vec<TxOp>,
) -> Result<ConfiguredProvider, CredentialsError> {
    creds.validate()?;
    let stored = seal(keys.current(), tenant, creds, now)?;
    let item = stored.to_item()?;
    let mut ops = vec![
        TxOp::Check {
            key: project_key(&tenant.project),
            cond: Cond::Exists,
        },
        TxOp::Put { item, cond: None },
    ];
    if PULLED.contains(&creds.provider()) {
        let pulled = PulledTenant {
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            provider: creds.provider(),
            since: now,
        };
        ops.push(TxOp::Put {
            item: pulled.to_item()?,
            cond: None,
        });
    }
    ops.extend(also);
    let written = store.transact(ops).await;
    match written {
        Ok(()) => Ok(ConfiguredProvider::from(&stored)),
        Err(e) if e.is_condition_failure() => Err(CredentialsError::ProjectNotFound(
            tenant.project.clone().into(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The decrypted credentials of `project_id` at `provider` in `mode`, or
/// `None` when none are configured.
pub async fn get_credentials(
    store: &dyn Store,
    keys: &CredentialsKeys,
    tenant: &Tenant,
    provider: Provider,
) -> Result<Option<ProviderCredentials>, CredentialsError> {
    let Some(item) = store.get(&credentials_key(tenant, provider)).await? else {
        return Ok(None);
    };
    let stored: StoredCredentials = from_item(item).map_err(|_| {
        CredentialsError::Corrupt(describe(tenant, provider), "record does not parse".into())
    })?;
    open(keys, &stored, tenant, provider).map(Some)
}

/// Which providers a project has credentials for, in each mode (no
/// secrets; no key needed). Ordered by mode, then provider.
pub async fn list_configured_providers(
    store: &dyn Store,
    project_id: &ProjectId,
) -> Result<Vec<ConfiguredProvider>, CredentialsError> {
    let mut query = Query::partition(project_partition(project_id))
        .sk(SkCond::BeginsWith(keys::CREDENTIALS_PREFIX.into()))
        .limit(100);
    let mut out = Vec::new();
    loop {
        let page = store.query(&query).await?;
        for item in page.items {
            let stored: StoredCredentials = from_item(item)?;
            out.push(ConfiguredProvider::from(&stored));
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => break,
        }
    }
    Ok(out)
}

/// Removes the credentials of one provider and mode. Whether there were
/// any.
pub async fn delete_credentials(
    store: &dyn Store,
    tenant: &Tenant,
    provider: Provider,
) -> Result<bool, CredentialsError> {
    let ops = vec![
        TxOp::Delete {
            key: credentials_key(tenant, provider),
            cond: Some(Cond::Exists),
        },
        TxOp::Delete {
            key: keys::pulled_tenant(provider, &tenant.project, tenant.mode),
            cond: None,
        },
    ];
    match store.transact(ops).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_condition_failure() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Re-seals every credential of a project that an older master key sealed
/// with the current one (for master-key rotation). How many it rewrote.
pub async fn reencrypt_credentials(
    store: &dyn Store,
    keys: &CredentialsKeys,
    now: Timestamp,
    project_id: &ProjectId,
) -> Result<usize, CredentialsError> {
    let mut rewritten = 0;
    for configured in list_configured_providers(store, project_id).await? {
        if configured.master_key == keys.current().id {
            continue;
        }
        let tenant = Tenant::new(project_id.clone(), configured.mode);
        let Some(creds) = get_credentials(store, keys, &tenant, configured.provider).await? else {
            continue;
        };
        let stored = seal(keys.current(), &tenant, &creds, now)?;
        // Only if nobody replaced it meanwhile.
        let unchanged = StoredCredentials::MASTER_KEY.eq(configured.master_key.as_str());
        match store.put(stored.to_item()?, Some(unchanged)).await {
            Ok(()) => rewritten += 1,
            Err(StoreError::ConditionFailed) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(rewritten)
}

/// The providers the tenant's project has credentials for in the
/// tenant's mode (no secrets), ordered by provider.
pub async fn configured_in(
    deps: &Deps,
    tenant: &Tenant,
) -> Result<Vec<ConfiguredProvider>, CredentialsError> {
    let mut all = list_configured_providers(&*deps.store, &tenant.project).await?;
    all.retain(|c| c.mode == tenant.mode);
    Ok(all)
}

/// The tenant's credentials at `provider`, opened with the deps' master
/// key ([`CredentialsError::MissingKey`] without one), or `None` when
/// none are configured.
pub async fn opened(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
) -> Result<Option<ProviderCredentials>, CredentialsError> {
    let keys = deps.providers.keys().ok_or(CredentialsError::MissingKey)?;
    get_credentials(&*deps.store, keys, tenant, provider).await
}

/// Stores (or replaces) the tenant's credentials as [`put_credentials`]
/// does, sealed with the deps' master key
/// ([`CredentialsError::MissingKey`] without one), at the deps' time.
pub async fn set(
    deps: &Deps,
    tenant: &Tenant,
    creds: &ProviderCredentials,
    also: Vec<TxOp>,
) -> Result<ConfiguredProvider, CredentialsError> {
    let keys = deps.providers.keys().ok_or(CredentialsError::MissingKey)?;
    put_credentials_with(&*deps.store, keys, deps.clock.now(), tenant, creds, also).await
}

/// The credentials of `payment`'s project at its provider in its mode.
pub async fn for_payment(
    deps: &Deps,
    payment: &super::payments::Payment,
) -> Result<ProviderCredentials, HubError> {
    let tenant = Tenant::new(payment.project_id.clone(), payment.mode);
    for_provider(&*deps.store, &deps.providers, &tenant, payment.provider).await
}

/// The credentials a project uses at `provider` in `mode`: its own,
/// opened with the hub's master key; else the gateway's sandbox account
/// (sandbox eSewa and Khalti only).
pub async fn for_provider(
    store: &dyn Store,
    hub: &ProviderHub,
    tenant: &Tenant,
    provider: Provider,
) -> Result<ProviderCredentials, HubError> {
    let mode = tenant.mode;
    if let Some(keys) = hub.keys() {
        if let Some(c) = get_credentials(store, keys, tenant, provider).await? {
            return Ok(c);
        }
    }
    hub.sandbox_account(mode, provider)
        .ok_or(HubError::NotConfigured {
            provider: provider.as_str(),
            mode: mode.as_str(),
        })
}

/// Provider checks ([`ask_provider`]) a project may ask for per
/// [`CHECK_WINDOW`] seconds, across every person and instance: each is
/// a call to the provider on the project's credentials.
pub const CHECKS_PER_WINDOW: i64 = 10;
pub const CHECK_WINDOW: i64 = 600;

/// What [`ask_provider`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// The provider's answer, read for what it says of the credentials.
    Verdict(Verdict),
    /// The project has no credentials of its own there.
    NoneStored,
    /// Too many checks lately: the seconds until one may be asked again.
    Throttled { retry_after: i64 },
}

/// Asks `provider` whether the project's own credentials in `mode` work
/// ([`crate::providers::probe`]: one read-only call, none for eSewa),
/// within [`CHECKS_PER_WINDOW`]. The gateway's sandbox accounts are never
/// asked about.
pub async fn ask_provider(
    deps: &Deps,
    tenant: &Tenant,
    provider: Provider,
) -> Result<Asked, HubError> {
    let (store, hub, now) = (&*deps.store, &*deps.providers, deps.clock.now());
    let keys = hub.keys().ok_or(CredentialsError::MissingKey)?;
    let Some(creds) = get_credentials(store, keys, tenant, provider).await? else {
        return Ok(Asked::NoneStored);
    };
    let bucket = format!("CREDCHECK#{}", tenant.project);
    let taken =
        crate::limits::public::take_slot(store, &bucket, CHECKS_PER_WINDOW, CHECK_WINDOW, now)
            .await
            .map_err(CredentialsError::from)?;
    if let Err(retry_after) = taken {
        return Ok(Asked::Throttled { retry_after });
    }
    let verdict = match hub.client(tenant.mode, provider) {
        Ok(client) => probe::ask(client, &creds).await,
        Err(e) => Verdict::Unknown(format!(
            "{} cannot be asked from here: {e}",
            provider.display_name()
        )),
    };
    Ok(Asked::Verdict(verdict))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::account::{Plan, create_merchant, create_project};
    use crate::store::Update;
    use crate::testenv::memory_store as store;
    use crate::time::{Clock, SystemClock};
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::Value;

    fn ok<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
        match r {
            Ok(v) => v,
            Err(e) => panic!("{what}: {e:?}"),
        }
    }

    fn keys(id: &str) -> CredentialsKeys {
        CredentialsKeys::single(ok(CredentialsKey::generate(id), "generate"))
    }

    #[test]
    fn sealed_secrets_open_only_in_their_context_and_with_their_key() {
        let k1 = keys("k1");
        let sealed = ok(seal_secret(&k1, "we_1", "whsec_abc"), "seal");
        assert!(!sealed.ciphertext.contains("whsec_abc"));
        assert_eq!(ok(open_secret(&k1, &sealed, "we_1"), "open"), "whsec_abc");
        assert!(matches!(
            open_secret(&k1, &sealed, "we_2"),
            Err(CredentialsError::Decrypt(_))
        ));
        assert!(matches!(
            open_secret(&keys("k2"), &sealed, "we_1"),
            Err(CredentialsError::UnknownKey { .. })
        ));
        // Two seals of one secret differ (fresh nonce).
        let again = ok(seal_secret(&k1, "we_1", "whsec_abc"), "seal");
        assert_ne!(again.ciphertext, sealed.ciphertext);
    }

    async fn project(store: &dyn Store) -> ProjectId {
        let now = SystemClock.now();
        let m = ok(
            create_merchant(store, now, "Himal", "r@himal.example", Plan::Free).await,
            "merchant",
        );
        ok(
            create_project(store, now, &m, "Shop", false).await,
            "project",
        )
        .id
    }

    fn esewa() -> ProviderCredentials {
        ProviderCredentials::Esewa {
            product_code: "EPAYTEST-PC-7731".into(),
            secret_key: "8gBm/:&EnhH.1/q-SECRET".into(),
        }
    }

    fn khalti() -> ProviderCredentials {
        ProviderCredentials::Khalti {
            secret_key: "live_secret_key_68791341fdd94846a146f0457ff7b455".into(),
        }
    }

    fn fonepay() -> ProviderCredentials {
        ProviderCredentials::Fonepay {
            merchant_code: "NBQM-MERCH-42".into(),
            secret_key: "fonepay-hmac-secret-a1b2c3".into(),
            username: "fp-user-9841000001".into(),
            password: "p@ssw0rd-fonepay-xyz".into(),
        }
    }

    /// The project's own credentials are asked about, one call each, at
    /// most [`CHECKS_PER_WINDOW`] a window across the project; none
    /// stored is said so, with no call.
    #[tokio::test]
    async fn the_provider_is_asked_about_the_projects_own_credentials() {
        use crate::providers::mock::Mock;
        use crate::providers::{ProviderConfig, SandboxAccounts};
        let store = store();
        let p = project(&*store).await;
        let k = keys("k1");
        let mock = Mock::start().await;
        let cfg = ProviderConfig::for_base(&mock.base);
        let hub = ok(
            ProviderHub::new(&cfg, &cfg, Some(k.clone()), SandboxAccounts::default()),
            "hub",
        );
        let now = SystemClock.now();
        let tenant = Tenant::new(p.as_str(), Mode::Sandbox);
        let deps = crate::AppState::new(
            store.clone(),
            std::sync::Arc::new(SystemClock),
            crate::Config {
                public_base_url: "https://pay.example".into(),
                events_base_url: None,
                dashboard_base_url: None,
            },
        )
        .with_providers(hub);
        let ask = |provider| ask_provider(&deps, &tenant, provider);
        assert_eq!(ok(ask(Provider::Khalti).await, "ask"), Asked::NoneStored);
        assert!(mock.requests().is_empty());
        ok(
            put_credentials(
                &*store,
                &k,
                now,
                &Tenant::new(p.as_str(), Mode::Sandbox),
                &khalti(),
            )
            .await,
            "put",
        );
        mock.reply(401, r#"{"detail": "Invalid token.", "status_code": 401}"#);
        match ok(ask(Provider::Khalti).await, "ask") {
            Asked::Verdict(v) => assert_eq!(v.word(), "refused", "{v:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(mock.requests().len(), 1);
        let sent = mock.last();
        assert_eq!(
            sent.header("authorization"),
            Some("Key live_secret_key_68791341fdd94846a146f0457ff7b455"),
            "the stored key, opened"
        );
        for _ in 1..CHECKS_PER_WINDOW {
            assert!(matches!(
                ok(ask(Provider::Khalti).await, "ask"),
                Asked::Verdict(_)
            ));
        }
        assert!(matches!(
            ok(ask(Provider::Khalti).await, "ask"),
            Asked::Throttled { retry_after } if retry_after > 0 && retry_after <= CHECK_WINDOW
        ));
        assert_eq!(
            mock.requests().len() as i64,
            CHECKS_PER_WINDOW,
            "no call when throttled"
        );
    }

    async fn raw_items(store: &dyn Store, project_id: &str) -> Vec<crate::store::Item> {
        let page = store
            .query(&Query::partition(project_partition(&ProjectId::from(
                project_id,
            ))))
            .await;
        ok(page, "query").items
    }

    #[tokio::test]
    async fn credentials_round_trip_per_mode_and_provider() {
        let store = store();
        let keys = keys("k1");
        let now = SystemClock.now();
        let p = project(&*store).await;
        for (mode, creds) in [
            (Mode::Sandbox, esewa()),
            (Mode::Live, khalti()),
            (Mode::Live, fonepay()),
        ] {
            let c = ok(
                put_credentials(&*store, &keys, now, &Tenant::new(p.as_str(), mode), &creds).await,
                "put",
            );
            assert_eq!(c.master_key, "k1");
            let back = get_credentials(
                &*store,
                &keys,
                &Tenant::new(p.as_str(), mode),
                creds.provider(),
            )
            .await;
            assert_eq!(ok(back, "get"), Some(creds));
        }
        // Sandbox eSewa says nothing about live eSewa.
        let live_esewa = get_credentials(
            &*store,
            &keys,
            &Tenant::new(p.as_str(), Mode::Live),
            Provider::Esewa,
        )
        .await;
        assert_eq!(ok(live_esewa, "get"), None);

        // Replacing keeps one record.
        let newer = ProviderCredentials::Esewa {
            product_code: "EPAYTEST".into(),
            secret_key: "other".into(),
        };
        ok(
            put_credentials(
                &*store,
                &keys,
                now,
                &Tenant::new(p.as_str(), Mode::Sandbox),
                &newer,
            )
            .await,
            "replace",
        );
        let back = get_credentials(
            &*store,
            &keys,
            &Tenant::new(p.as_str(), Mode::Sandbox),
            Provider::Esewa,
        )
        .await;
        assert_eq!(ok(back, "get"), Some(newer));

        let listed = ok(list_configured_providers(&*store, &p).await, "list");
        let summary: Vec<(Mode, Provider)> = listed.iter().map(|c| (c.mode, c.provider)).collect();
        assert_eq!(
            summary,
            vec![
                (Mode::Live, Provider::Fonepay),
                (Mode::Live, Provider::Khalti),
                (Mode::Sandbox, Provider::Esewa),
            ]
        );
        assert!(
            ok(
                list_configured_providers(&*store, &"proj_none".into()).await,
                "l"
            )
            .is_empty()
        );

        assert!(ok(
            delete_credentials(
                &*store,
                &Tenant::new(p.as_str(), Mode::Live),
                Provider::Khalti
            )
            .await,
            "delete"
        ));
        assert!(!ok(
            delete_credentials(
                &*store,
                &Tenant::new(p.as_str(), Mode::Live),
                Provider::Khalti
            )
            .await,
            "delete again"
        ));
        assert_eq!(
            ok(list_configured_providers(&*store, &p).await, "list").len(),
            2
        );
    }

    #[tokio::test]
    async fn stored_items_hold_no_secret() {
        let store = store();
        let keys = keys("k1");
        let now = SystemClock.now();
        let p = project(&*store).await;
        for (mode, creds) in [
            (Mode::Sandbox, esewa()),
            (Mode::Live, khalti()),
            (Mode::Sandbox, fonepay()),
        ] {
            ok(
                put_credentials(&*store, &keys, now, &Tenant::new(p.as_str(), mode), &creds).await,
                "put",
            );
        }
        let dump = serde_json::to_string(&raw_items(&*store, &p).await).unwrap_or_default();
        assert!(dump.contains("ciphertext"), "the dump holds the records");
        for secret in [
            "EPAYTEST-PC-7731",
            "8gBm/:&EnhH.1/q-SECRET",
            "SECRET",
            "live_secret_key_68791341fdd94846a146f0457ff7b455",
            "68791341fdd9",
            "NBQM-MERCH-42",
            "fonepay-hmac-secret-a1b2c3",
            "fp-user-9841000001",
            "p@ssw0rd-fonepay-xyz",
            "secret_key",
            "password",
            "username",
        ] {
            assert!(!dump.contains(secret), "{secret:?} stored in the clear");
        }
        let master = keys.current().export();
        let b64 = master.split_once(':').map(|(_, b)| b).unwrap_or_default();
        assert!(!dump.contains(b64), "the master key is never stored");
    }

    #[tokio::test]
    async fn tampered_records_fail_to_decrypt_cleanly() {
        let store = store();
        let keys = keys("k1");
        let now = SystemClock.now();
        let p = project(&*store).await;
        ok(
            put_credentials(
                &*store,
                &keys,
                now,
                &Tenant::new(p.as_str(), Mode::Live),
                &khalti(),
            )
            .await,
            "put",
        );
        let key = credentials_key(&Tenant::new(p.clone(), Mode::Live), Provider::Khalti);
        let Some(original) = ok(store.get(&key).await, "get") else {
            panic!("stored")
        };
        let field = |name: &str| {
            original
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let live = Tenant::new(p.as_str(), Mode::Live);
        let get = || get_credentials(&*store, &keys, &live, Provider::Khalti);

        // Flip one bit of every byte position of the ciphertext, one at a time.
        let ct = ok(STANDARD.decode(field("ciphertext")), "b64");
        for i in 0..ct.len() {
            let mut bad = ct.clone();
            bad[i] ^= 0x01;
            let mut item = original.clone();
            item.insert("ciphertext".into(), Value::from(STANDARD.encode(&bad)));
            ok(store.put(item, None).await, "tamper");
            assert!(
                matches!(get().await, Err(CredentialsError::Decrypt(_))),
                "flipped byte {i}"
            );
        }
        // Truncated ciphertext, altered nonce, wrong-length nonce, junk.
        let cases: Vec<(&str, Value)> = vec![
            ("ciphertext", Value::from(STANDARD.encode(&ct[..4]))),
            ("ciphertext", Value::from("")),
            ("ciphertext", Value::from("%%% not base64")),
            ("nonce", Value::from(STANDARD.encode([0u8; 12]))),
            ("nonce", Value::from(STANDARD.encode([0u8; 5]))),
            ("nonce", Value::from("??")),
            ("alg", Value::from("ROT13")),
            ("key_id", Value::from("k9")),
            ("ciphertext", Value::from(5)),
        ];
        for (name, value) in cases {
            let mut item = original.clone();
            item.insert(name.into(), value.clone());
            ok(store.put(item, None).await, "tamper");
            let r = get().await;
            assert!(r.is_err(), "{name}={value} must fail");
            let text = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!text.contains("live_secret_key"), "{text}");
        }
        ok(store.put(original.clone(), None).await, "restore");
        assert_eq!(ok(get().await, "restored"), Some(khalti()));

        // Rewriting the key id to the one configured does not help either.
        let mut item = original.clone();
        item.insert("key_id".into(), Value::from("k2"));
        ok(store.put(item, None).await, "tamper");
        let other = CredentialsKeys::single(ok(CredentialsKey::generate("k2"), "g"));
        let r = get_credentials(
            &*store,
            &other,
            &Tenant::new(p.as_str(), Mode::Live),
            Provider::Khalti,
        )
        .await;
        assert!(matches!(r, Err(CredentialsError::Decrypt(_))));
    }

    #[tokio::test]
    async fn wrong_or_unknown_keys_fail_cleanly() {
        let store = store();
        let now = SystemClock.now();
        let p = project(&*store).await;
        let right = keys("k1");
        ok(
            put_credentials(
                &*store,
                &right,
                now,
                &Tenant::new(p.as_str(), Mode::Sandbox),
                &esewa(),
            )
            .await,
            "put",
        );
        // Same id, other bytes.
        let wrong = keys("k1");
        let r = get_credentials(
            &*store,
            &wrong,
            &Tenant::new(p.as_str(), Mode::Sandbox),
            Provider::Esewa,
        )
        .await;
        assert!(matches!(r, Err(CredentialsError::Decrypt(_))), "{r:?}");
        // Another id altogether.
        let unknown = keys("k2");
        let r = get_credentials(
            &*store,
            &unknown,
            &Tenant::new(p.as_str(), Mode::Sandbox),
            Provider::Esewa,
        )
        .await;
        assert!(
            matches!(&r, Err(CredentialsError::UnknownKey { key_id, .. }) if key_id == "k1"),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn moved_ciphertexts_do_not_decrypt() {
        let store = store();
        let keys = keys("k1");
        let now = SystemClock.now();
        let p = project(&*store).await;
        let q = project(&*store).await;
        ok(
            put_credentials(
                &*store,
                &keys,
                now,
                &Tenant::new(p.as_str(), Mode::Sandbox),
                &khalti(),
            )
            .await,
            "put",
        );
        let Some(original) = ok(
            store
                .get(&credentials_key(
                    &Tenant::new(p.clone(), Mode::Sandbox),
                    Provider::Khalti,
                ))
                .await,
            "get",
        ) else {
            panic!("stored")
        };
        let targets = [
            (q.as_str(), Mode::Sandbox, Provider::Khalti),
            (p.as_str(), Mode::Live, Provider::Khalti),
            (p.as_str(), Mode::Sandbox, Provider::Esewa),
        ];
        for (project_id, mode, provider) in targets {
            let mut item = original.clone();
            let key = credentials_key(&Tenant::new(project_id, mode), provider);
            item.insert("pk".into(), Value::from(key.pk.clone()));
            item.insert("sk".into(), Value::from(key.sk.clone()));
            // Even with the record's own fields rewritten to match.
            item.insert("project_id".into(), Value::from(project_id));
            item.insert("mode".into(), Value::from(mode.as_str()));
            item.insert("provider".into(), Value::from(provider.as_str()));
            ok(store.put(item, None).await, "copy");
            let r = get_credentials(&*store, &keys, &Tenant::new(project_id, mode), provider).await;
            assert!(
                matches!(r, Err(CredentialsError::Decrypt(_))),
                "moved to {project_id} {mode:?} {provider:?}: {r:?}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_projects_and_invalid_fields_are_refused() {
        let store = store();
        let keys = keys("k1");
        let now = SystemClock.now();
        let r = put_credentials(
            &*store,
            &keys,
            now,
            &Tenant::new("proj_nope", Mode::Live),
            &khalti(),
        )
        .await;
        assert_eq!(
            r,
            Err(CredentialsError::ProjectNotFound("proj_nope".into()))
        );
        assert!(raw_items(&*store, "proj_nope").await.is_empty());

        let p = project(&*store).await;
        for bad in [
            ProviderCredentials::Khalti {
                secret_key: String::new(),
            },
            ProviderCredentials::Khalti {
                secret_key: " padded ".into(),
            },
            ProviderCredentials::Khalti {
                secret_key: "line\nbreak".into(),
            },
            ProviderCredentials::Esewa {
                product_code: "EPAYTEST".into(),
                secret_key: "x".repeat(2000),
            },
        ] {
            let r = put_credentials(
                &*store,
                &keys,
                now,
                &Tenant::new(p.as_str(), Mode::Live),
                &bad,
            )
            .await;
            assert!(matches!(r, Err(CredentialsError::Invalid(_))), "{bad:?}");
        }
        // Changing a project item's attribute does not count as a project.
        let _ = store
            .update(
                &Key::new("PROJ#proj_ghost", "OTHER"),
                Update::new().set("x", 1),
                None,
            )
            .await;
        let r = put_credentials(
            &*store,
            &keys,
            now,
            &Tenant::new("proj_ghost", Mode::Live),
            &khalti(),
        )
        .await;
        assert!(matches!(r, Err(CredentialsError::ProjectNotFound(_))));
    }

    #[tokio::test]
    async fn master_key_rotation_reencrypts_with_the_new_key() {
        let store = store();
        let now = SystemClock.now();
        let p = project(&*store).await;
        let old = ok(CredentialsKey::generate("2025-01"), "g");
        let new = ok(CredentialsKey::generate("2026-06"), "g");
        let before = CredentialsKeys::single(old.clone());
        ok(
            put_credentials(
                &*store,
                &before,
                now,
                &Tenant::new(p.as_str(), Mode::Live),
                &fonepay(),
            )
            .await,
            "put",
        );
        ok(
            put_credentials(
                &*store,
                &before,
                now,
                &Tenant::new(p.as_str(), Mode::Sandbox),
                &esewa(),
            )
            .await,
            "put",
        );
        let both = ok(CredentialsKeys::new(new.clone(), vec![old.clone()]), "keys");
        // Older records still read with the old key listed as previous.
        let r = get_credentials(
            &*store,
            &both,
            &Tenant::new(p.as_str(), Mode::Live),
            Provider::Fonepay,
        )
        .await;
        assert_eq!(ok(r, "read old"), Some(fonepay()));
        assert_eq!(
            ok(reencrypt_credentials(&*store, &both, now, &p).await, "re"),
            2
        );
        assert_eq!(
            ok(reencrypt_credentials(&*store, &both, now, &p).await, "re"),
            0
        );
        let listed = ok(list_configured_providers(&*store, &p).await, "list");
        assert!(listed.iter().all(|c| c.master_key == "2026-06"));
        // The old key can go now.
        let after = CredentialsKeys::single(new);
        let r = get_credentials(
            &*store,
            &after,
            &Tenant::new(p.as_str(), Mode::Sandbox),
            Provider::Esewa,
        )
        .await;
        assert_eq!(ok(r, "read new"), Some(esewa()));
        assert!(CredentialsKeys::new(old.clone(), vec![old]).is_err());
    }

    #[test]
    fn master_keys_parse_from_configuration() {
        let b64 = STANDARD.encode([7u8; 32]);
        let k = ok(CredentialsKey::parse(&b64), "plain");
        assert_eq!(k.id(), DEFAULT_KEY_ID);
        let k = ok(CredentialsKey::parse(&format!("v2:{b64}\n")), "with id");
        assert_eq!(k.id(), "v2");
        let again = ok(CredentialsKey::parse(&k.export()), "export");
        assert_eq!((again.id(), again.bytes), ("v2", [7u8; 32]));
        let url = URL_SAFE_NO_PAD.encode([0xfb; 32]);
        assert!(CredentialsKey::parse(&url).is_ok(), "url-safe, unpadded");

        assert_eq!(
            CredentialsKeys::from_values(None, None).err(),
            Some(CredentialsError::MissingKey)
        );
        assert_eq!(
            CredentialsKeys::from_values(Some("  "), None).err(),
            Some(CredentialsError::MissingKey)
        );
        let short = STANDARD.encode([1u8; 16]);
        let e = CredentialsKeys::from_values(Some(&short), None).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("16 bytes") && text.contains("32"), "{text}");
        for bad in [
            "not base64 at all!",
            "k1:",
            "bad id!:AAAA",
            &STANDARD.encode([1u8; 33]),
        ] {
            assert!(
                matches!(
                    CredentialsKeys::from_values(Some(bad), None),
                    Err(CredentialsError::BadKey(_))
                ),
                "{bad}"
            );
        }
        let prev = format!(
            "old1:{},old2:{}",
            STANDARD.encode([2u8; 32]),
            STANDARD.encode([3u8; 32])
        );
        let ks = ok(
            CredentialsKeys::from_values(Some(&format!("new:{b64}")), Some(&prev)),
            "previous",
        );
        assert!(ks.by_id("old2").is_some() && ks.by_id("new").is_some());
        assert!(CredentialsKeys::from_values(Some(&b64), Some(&b64)).is_err());
        let dup = format!("k1:{b64}");
        assert!(CredentialsKeys::from_values(Some(&b64), Some(&dup)).is_err());
    }

    #[test]
    fn master_keys_parse_from_a_secret_string() {
        const ARN: &str = "arn:aws:secretsmanager:ap-south-1:123456789012:secret:dhukuti/ck-AbCdEf";
        let b64 = STANDARD.encode([7u8; 32]);
        let old = STANDARD.encode([2u8; 32]);
        let older = STANDARD.encode([3u8; 32]);

        // What DHUKUTI_CREDENTIALS_KEY held, whitespace trimmed.
        let ks = ok(
            CredentialsKeys::from_secret_string(ARN, &format!("\n {b64} \n")),
            "plain",
        );
        assert_eq!(ks.current().id(), DEFAULT_KEY_ID);
        assert!(ks.previous.is_empty());
        let ks = ok(
            CredentialsKeys::from_secret_string(ARN, &format!("v2:{b64}\n")),
            "with id",
        );
        assert_eq!((ks.current().id(), ks.current().bytes), ("v2", [7u8; 32]));

        // JSON with previous keys, comma-separated or a list.
        for text in [
            format!(r#" {{"current": "v3:{b64}", "previous": "v2:{old}, v1:{older}"}} "#),
            format!(r#"{{"current": "v3:{b64}", "previous": ["v2:{old}", " v1:{older} "]}}"#),
        ] {
            let ks = ok(CredentialsKeys::from_secret_string(ARN, &text), "json");
            assert_eq!(ks.current().id(), "v3");
            let ids: Vec<&str> = ks.previous.iter().map(|k| k.id()).collect();
            assert_eq!(ids, ["v2", "v1"]);
            assert_eq!(ks.by_id("v1").map(|k| k.bytes), Some([3u8; 32]));
        }
        let ks = ok(
            CredentialsKeys::from_secret_string(ARN, &format!(r#"{{"current": "{b64}"}}"#)),
            "json without previous",
        );
        assert_eq!(ks.current().id(), DEFAULT_KEY_ID);

        // Garbage: a BadKey naming the secret, never quoting the value.
        let secret_part = "c2VjcmV0LXZhbHVl";
        for bad in [
            String::new(),
            "   \n".to_owned(),
            format!("not base64 {secret_part}!"),
            STANDARD.encode([1u8; 16]),
            format!("{{\"current\": \"{secret_part}\""),
            format!(r#"{{"current": 5, "x": "{secret_part}"}}"#),
            format!(r#"{{"curent": "{secret_part}"}}"#),
            format!(r#"{{"{secret_part}": "v1:{b64}"}}"#),
            r#"{"current": " "}"#.to_owned(),
            format!(r#"{{"current": "v1:{b64}", "previous": "{secret_part}"}}"#),
            format!(r#"{{"current": "v1:{b64}", "previous": "v1:{old}"}}"#),
            format!(r#""{secret_part}""#),
        ] {
            match CredentialsKeys::from_secret_string(ARN, &bad) {
                Err(CredentialsError::BadKey(why)) => {
                    assert!(why.contains(ARN), "{why}");
                    assert!(!why.contains(secret_part) && !why.contains(&b64), "{why}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn debug_output_redacts_secrets() {
        let text = format!("{:?} {:?} {:?}", esewa(), khalti(), fonepay());
        for secret in [
            "8gBm/:&EnhH.1/q-SECRET",
            "live_secret_key",
            "fonepay-hmac-secret",
            "fp-user",
            "p@ssw0rd",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("EPAYTEST-PC-7731") && text.contains("[redacted]"));

        let key = ok(CredentialsKey::new("k1", [0xab; 32]), "key");
        let keys = CredentialsKeys::single(key.clone());
        let text = format!("{key:?} {keys:?}");
        let b64 = STANDARD.encode([0xab; 32]);
        assert!(!text.contains(&b64) && !text.contains("171"), "{text}");
        assert!(text.contains("k1"));
    }

    #[tokio::test]
    async fn projects_without_credentials_fall_back_to_the_sandbox_accounts_only() {
        use crate::providers::hub::{HubError, ProviderHub, SandboxAccounts};
        let store = crate::store::embedded::EmbeddedStore::in_memory().unwrap();
        let hub = ProviderHub::unconfigured();
        let esewa = for_provider(
            &store,
            &hub,
            &Tenant::new("proj_1", Mode::Sandbox),
            Provider::Esewa,
        )
        .await
        .unwrap();
        assert_eq!(esewa.provider(), Provider::Esewa);
        assert!(
            for_provider(
                &store,
                &hub,
                &Tenant::new("proj_1", Mode::Sandbox),
                Provider::Khalti
            )
            .await
            .is_ok()
        );
        for (mode, provider) in [
            (Mode::Sandbox, Provider::Fonepay),
            (Mode::Live, Provider::Esewa),
            (Mode::Live, Provider::Khalti),
            (Mode::Live, Provider::Fonepay),
        ] {
            let got = for_provider(&store, &hub, &Tenant::new("proj_1", mode), provider).await;
            assert!(
                matches!(got, Err(HubError::NotConfigured { .. })),
                "{mode:?} {provider:?}"
            );
        }
        // No gateway Khalti key (a deployment without one): no fallback.
        let hub = hub.with_sandbox_accounts(SandboxAccounts {
            khalti: None,
            ..SandboxAccounts::default()
        });
        let got = for_provider(
            &store,
            &hub,
            &Tenant::new("proj_1", Mode::Sandbox),
            Provider::Khalti,
        )
        .await;
        assert!(matches!(got, Err(HubError::NotConfigured { .. })));
    }
}
