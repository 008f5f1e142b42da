//! The operator's side: creating merchants and projects, issuing keys,
//! suspending, pausing and reinstating, plans, sellers and live invoicing.

use rand::Rng;

use super::auth::{SECRET_RANDOM_LEN, hash_secret};
use super::{ApiKey, KeyKind, Merchant, Pause, Plan, Project, Scope, Seller, Suspension};
use crate::app::Deps;
use crate::domain::Mode;
use crate::domain::record::{Changes, Record, from_item};
use crate::ids::{ApiKeyId, MerchantId, ProjectId};
use crate::keys;
use crate::kinds::Tenant;
use crate::store::{Cond, Index, Query, Store, StoreError, TxOp, Update};
use crate::time::Timestamp;

/// Creates a merchant.
pub async fn create_merchant(
    store: &dyn Store,
    now: Timestamp,
    name: &str,
    email: &str,
    plan: Plan,
) -> Result<Merchant, StoreError> {
    let merchant = Merchant {
        id: MerchantId::new(),
        name: name.to_owned(),
        email: email.to_owned(),
        plan,
        suspension: None,
        created_at: now,
    };
    store
        .put(merchant.to_item()?, Some(Cond::NotExists))
        .await?;
    Ok(merchant)
}

/// Creates a project of `merchant`.
pub async fn create_project(
    store: &dyn Store,
    now: Timestamp,
    merchant: &Merchant,
    name: &str,
    live_invoicing: bool,
) -> Result<Project, StoreError> {
    let project = Project {
        id: ProjectId::new(),
        merchant_id: merchant.id.clone(),
        name: name.to_owned(),
        live_invoicing,
        seller: None,
        created_at: now,
    };
    let mut ops = vec![project.put_new()?];
    // The project's session counters start with it: they cover every
    // session it will have (checkout::stats::session_totals).
    for mode in [Mode::Sandbox, Mode::Live] {
        let marker =
            super::super::totals::AllTimeMarker::new(&Tenant::new(project.id.clone(), mode), now);
        ops.push(TxOp::Put {
            item: super::super::record::Record::to_item(&marker)?,
            cond: None,
        });
        // So do its filtered lists' counters (`domain::listing`).
        let lists = super::super::listing::ListsMarker::new(&Tenant::new(project.id.clone(), mode));
        ops.push(TxOp::Put {
            item: super::super::record::Record::to_item(&lists)?,
            cond: None,
        });
    }
    store.transact(ops).await?;
    Ok(project)
}

/// What a new key may do and how it is labelled.
#[derive(Clone, Debug)]
pub struct NewKey {
    pub mode: Mode,
    pub kind: KeyKind,
    pub scopes: Vec<Scope>,
    pub description: String,
    pub expires_at: Option<Timestamp>,
    pub spend_cap_paisa: Option<i64>,
}

/// Mints a key for `project`. Returns the secret (shown once, never
/// stored) and the stored record.
pub async fn issue_api_key(
    deps: &Deps,
    now: Timestamp,
    project: &Project,
    new: NewKey,
) -> Result<(String, ApiKey), StoreError> {
    issue_api_key_with(deps, now, project, new, |_| Ok(Vec::new())).await
}

/// [`issue_api_key`] with `also(key)` (the dashboard's audit entry)
/// written in the same transaction as the key.
pub async fn issue_api_key_with(
    deps: &Deps,
    now: Timestamp,
    project: &Project,
    new: NewKey,
    also: impl FnOnce(&ApiKey) -> Result<Vec<crate::store::TxOp>, StoreError>,
) -> Result<(String, ApiKey), StoreError> {
    let store = &*deps.store;
    let fields = KeyFields {
        merchant_id: project.merchant_id.clone(),
        project_id: project.id.clone(),
        mode: new.mode,
        kind: new.kind,
        scopes: new.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        description: new.description,
        expires_at: new.expires_at,
        spend_cap_paisa: new.spend_cap_paisa,
    };
    let (secret, key) = mint_key(now, fields);
    let put = crate::store::TxOp::Put {
        item: key.to_item()?,
        cond: Some(Cond::NotExists),
    };
    let also = also(&key)?;
    crate::store::write_with(store, put, also).await?;
    Ok((secret, key))
}

/// Everything a minted key copies from its request (or, on rotation, from
/// the key it replaces). Scopes stay strings so a rotation keeps scopes
/// this build does not know.
pub(super) struct KeyFields {
    pub(super) merchant_id: MerchantId,
    pub(super) project_id: ProjectId,
    pub(super) mode: Mode,
    pub(super) kind: KeyKind,
    pub(super) scopes: Vec<String>,
    pub(super) description: String,
    pub(super) expires_at: Option<Timestamp>,
    pub(super) spend_cap_paisa: Option<i64>,
}

/// The gsi1 partition listing a project's keys (sort key: the key id).
pub(super) fn keys_partition(project_id: &ProjectId) -> String {
    keys::project_keys(project_id)
}

/// A fresh secret and its record (not yet written).
pub(super) fn mint_key(now: Timestamp, f: KeyFields) -> (String, ApiKey) {
    let random: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(SECRET_RANDOM_LEN)
        .map(char::from)
        .collect();
    let secret = format!("{}{random}", f.kind.prefix(f.mode));
    let key = ApiKey {
        id: ApiKeyId::new(),
        key_hash: hash_secret(&secret),
        merchant_id: f.merchant_id,
        project_id: f.project_id,
        mode: f.mode,
        kind: f.kind,
        scopes: f.scopes,
        description: f.description,
        prefix: secret.chars().take(12).collect(),
        hint: secret[secret.len() - 4..].to_owned(),
        expires_at: f.expires_at,
        last_used_at: None,
        spend_cap_paisa: f.spend_cap_paisa,
        pause: None,
        created_at: now,
    };
    (secret, key)
}

/// Suspends a merchant: every call of its keys answers 403 from now on.
pub async fn suspend_merchant(
    store: &dyn Store,
    merchant_id: &MerchantId,
    suspension: Suspension,
) -> Result<(), StoreError> {
    let update = Changes::new().set_some(Merchant::SUSPENSION, &suspension);
    let written = store
        .update(
            &Merchant::key(merchant_id),
            update.into(),
            Some(Cond::Exists),
        )
        .await;
    super::cache::changed();
    written.map(|_| ())
}

/// Pauses one key: its calls answer 423 until resumed.
pub async fn pause_api_key(
    store: &dyn Store,
    key: &ApiKey,
    pause: Pause,
) -> Result<(), StoreError> {
    let update = Changes::new().set_some(ApiKey::PAUSE, &pause);
    let written = store
        .update(&key.item_key(), update.into(), Some(Cond::Exists))
        .await;
    super::cache::changed();
    written.map(|_| ())
}

/// The merchant `id`, if it exists.
pub async fn get_merchant(
    store: &dyn Store,
    id: &MerchantId,
) -> Result<Option<Merchant>, StoreError> {
    crate::domain::record::get(store, &Merchant::key(id)).await
}

/// The name customers see for a project's shop (its merchant's, else the
/// project's) and whether it may take payments (merchant present and not
/// suspended): the public pages and payment attempts ask this.
pub async fn storefront(deps: &Deps, project_id: &ProjectId) -> Result<(String, bool), StoreError> {
    let store = &*deps.store;
    let Some(project) =
        crate::domain::record::get::<Project>(store, &Project::key(project_id)).await?
    else {
        return Ok(("Shop".into(), false));
    };
    match get_merchant(store, &project.merchant_id).await? {
        Some(m) => Ok((m.name, m.suspension.is_none())),
        None => Ok((project.name, false)),
    }
}

/// The project `id`, if it exists.
pub async fn get_project(deps: &Deps, id: &ProjectId) -> Result<Option<Project>, StoreError> {
    let store = &*deps.store;
    crate::domain::record::get(store, &Project::key(id)).await
}

/// Lifts a suspension: the merchant's keys work again. The merchant as
/// written; [`StoreError::ConditionFailed`] when it does not exist.
pub async fn reinstate_merchant(
    store: &dyn Store,
    merchant_id: &MerchantId,
) -> Result<Merchant, StoreError> {
    let update = Changes::new().remove(Merchant::SUSPENSION);
    let written = store
        .update(
            &Merchant::key(merchant_id),
            update.into(),
            Some(Cond::Exists),
        )
        .await;
    super::cache::changed();
    from_item(written?)
}

/// Moves a merchant to `plan` (its plan-derived entitlements follow at
/// once). [`StoreError::ConditionFailed`] when the merchant does not exist.
pub async fn set_plan(
    store: &dyn Store,
    merchant_id: &MerchantId,
    plan: Plan,
) -> Result<Merchant, StoreError> {
    let update = Changes::new().set(Merchant::PLAN, &plan);
    let written = store
        .update(
            &Merchant::key(merchant_id),
            update.into(),
            Some(Cond::Exists),
        )
        .await;
    super::cache::changed();
    from_item(written?)
}

/// Turns live one-time invoices of a project on or off (sandbox always has
/// them). [`StoreError::ConditionFailed`] when the project does not exist.
/// Sets (or with `None` removes) the project's seller profile.
pub async fn set_seller(
    store: &dyn Store,
    project_id: &ProjectId,
    seller: Option<&Seller>,
) -> Result<Project, StoreError> {
    let update = match seller {
        Some(s) => Changes::new().set_some(Project::SELLER, s),
        None => Changes::new().remove(Project::SELLER),
    };
    let item = store
        .update(&Project::key(project_id), update.into(), Some(Cond::Exists))
        .await?;
    from_item(item)
}

pub async fn set_live_invoicing(
    store: &dyn Store,
    project_id: &ProjectId,
    enabled: bool,
) -> Result<Project, StoreError> {
    let update = Changes::new().set(Project::LIVE_INVOICING, &enabled);
    let item = store
        .update(&Project::key(project_id), update.into(), Some(Cond::Exists))
        .await?;
    from_item(item)
}

/// Lists `project` under its merchant (idempotent): projects created
/// before the dashboard were not (`dhukuti-admin project
/// list-under-merchant`, and the local gateway on start).
pub async fn list_under_merchant(store: &dyn Store, project: &Project) -> Result<(), StoreError> {
    // Its entries as a new project's (no field changes).
    let update: Update = Changes::<Project>::new().enter(project.entries()).into();
    store
        .update(&project.item_key(), update, Some(Cond::Exists))
        .await
        .map(|_| ())
}

/// The projects of `merchant_id`, oldest first (at most 100: the
/// dashboard's switch; an operator creates projects).
pub async fn merchant_projects(
    deps: &Deps,
    merchant_id: &MerchantId,
) -> Result<Vec<Project>, StoreError> {
    let store = &*deps.store;
    let q = Query::partition(keys::merchant_projects(merchant_id))
        .on(Index::Gsi1)
        .limit(100);
    super::super::record::all_of(store, &q).await
}
