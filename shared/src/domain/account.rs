//! Merchants, projects and API keys: who is calling, in which mode, with
//! which scopes, and the account context they see.
//!
//! Secret keys are stored only as SHA-256 hashes, looked up by hash and
//! compared in constant time. A key belongs to one project and one mode.

use crate::refusal::{Kind, Refusal};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Mode;
use super::record::{from_item, to_item};
use crate::ids::{IdKind, new_id};
use crate::keys;
use crate::store::{Cond, Index, Item, Key, Query, Store, StoreError, TxOp, Update};
use crate::time::Timestamp;

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
}

impl Scope {
    pub const ALL: [Scope; 14] = [
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
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == s)
    }
}

/// The merchant's subscription plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    Free,
    Growth,
    Pro,
}

impl Plan {
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
    pub id: String,
    pub name: String,
    pub email: String,
    pub plan: Plan,
    #[serde(default)]
    pub suspension: Option<Suspension>,
    pub created_at: Timestamp,
}

impl Merchant {
    pub fn key(id: &str) -> Key {
        keys::record(keys::Record::Merchant, id)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub id: String,
    pub merchant_id: String,
    pub name: String,
    /// Whether live one-time invoices are enabled (sandbox always is).
    #[serde(default)]
    pub live_invoicing: bool,
    /// The seller profile copied onto invoices at finalize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seller: Option<Seller>,
    pub created_at: Timestamp,
}

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
    pub fn key(id: &str) -> Key {
        keys::record(keys::Record::Project, id)
    }
}

/// `secret` keys hold every scope they list for a server; `restricted`
/// keys are narrowed to a few scopes for one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    Secret,
    Restricted,
}

/// A stored API key. The secret itself is never stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: String,
    /// Hex SHA-256 of the secret.
    pub key_hash: String,
    pub merchant_id: String,
    pub project_id: String,
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

impl ApiKey {
    pub fn key_for_hash(hash_hex: &str) -> Key {
        keys::api_key(hash_hex)
    }

    pub fn has_scope(&self, scope: Scope) -> bool {
        self.scopes.iter().any(|s| s == scope.as_str())
    }
}

/// Random characters after the mode prefix of a secret key.
pub const SECRET_RANDOM_LEN: usize = 40;
const SECRET_MIN_RANDOM_LEN: usize = 32;
const SECRET_MAX_LEN: usize = 128;

/// Hex SHA-256 of a secret key, the only form in which keys are stored.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The mode a secret's prefix claims, if it is shaped like one of our keys.
pub fn mode_of_secret(secret: &str) -> Option<Mode> {
    let (mode, rest) = if let Some(rest) = secret.strip_prefix("sk_test_") {
        (Mode::Sandbox, rest)
    } else if let Some(rest) = secret.strip_prefix("sk_live_") {
        (Mode::Live, rest)
    } else {
        return None;
    };
    let well_formed = rest.len() >= SECRET_MIN_RANDOM_LEN
        && secret.len() <= SECRET_MAX_LEN
        && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    well_formed.then_some(mode)
}

/// Who is calling: the key and its merchant, both read for every request.
#[derive(Clone, Debug, PartialEq)]
pub struct Principal {
    pub key: ApiKey,
    pub merchant: Merchant,
}

impl Principal {
    pub fn mode(&self) -> Mode {
        self.key.mode
    }
    pub fn project_id(&self) -> &str {
        &self.key.project_id
    }
}

/// Why a caller was turned away.
#[derive(Clone, Debug, PartialEq)]
pub enum AuthError {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// Not shaped like a key, unknown, revoked or for the other mode.
    Invalid,
    Expired,
    Suspended(Suspension),
    Paused(Pause),
    Store(StoreError),
}

impl From<AuthError> for Refusal {
    fn from(err: AuthError) -> Self {
        let unauthenticated = |m: &str| Refusal::new(Kind::Unauthenticated, "api_key_invalid", m);
        match err {
            AuthError::Missing => unauthenticated("No API key provided"),
            // One message for unknown, malformed and revoked keys: nothing
            // to learn by probing.
            AuthError::Invalid => unauthenticated("Invalid API key provided"),
            AuthError::Expired => unauthenticated("This API key has expired"),
            AuthError::Suspended(s) => Refusal::new(
                Kind::AccountClosed,
                "account_suspended",
                "This merchant account is suspended; contact support",
            )
            .with_extra(
                "suspension",
                json!({"suspended_at": s.suspended_at, "reason": s.reason}),
            ),
            AuthError::Paused(p) => {
                Refusal::new(Kind::KeyPaused, "token_paused", "This API key is paused").with_extra(
                    "pause",
                    json!({"paused_at": p.paused_at, "reason": p.reason}),
                )
            }
            AuthError::Store(e) => e.into(),
        }
    }
}

/// Checks the bearer secret of a request: two store reads (the key by its
/// hash, then its merchant).
pub async fn authenticate(
    store: &dyn Store,
    now: Timestamp,
    secret: &str,
) -> Result<Principal, AuthError> {
    let key = authenticate_key(store, now, secret).await?;
    principal_of(store, key).await
}

/// The first half of [`authenticate`]: the key of the bearer secret (one
/// read), refused when unknown, of another mode than its prefix says, or
/// expired.
pub async fn authenticate_key(
    store: &dyn Store,
    now: Timestamp,
    secret: &str,
) -> Result<ApiKey, AuthError> {
    let Some(claimed_mode) = mode_of_secret(secret) else {
        return Err(AuthError::Invalid);
    };
    let hash = hash_secret(secret);
    let item = store
        .get(&ApiKey::key_for_hash(&hash))
        .await
        .map_err(AuthError::Store)?
        .ok_or(AuthError::Invalid)?;
    let key: ApiKey = from_item(item).map_err(AuthError::Store)?;
    // The lookup was by hash already; the constant-time compare keeps the
    // check itself free of timing signals whatever the store does.
    let same: bool = key.key_hash.as_bytes().ct_eq(hash.as_bytes()).into();
    if !same || key.mode != claimed_mode {
        return Err(AuthError::Invalid);
    }
    if key.expires_at.is_some_and(|t| t <= now) {
        return Err(AuthError::Expired);
    }
    Ok(key)
}

/// The second half of [`authenticate`]: the key's merchant (one read),
/// refused when suspended, then the key refused when paused.
pub async fn principal_of(store: &dyn Store, key: ApiKey) -> Result<Principal, AuthError> {
    let merchant: Merchant = match store.get(&Merchant::key(&key.merchant_id)).await {
        Ok(Some(item)) => from_item(item).map_err(AuthError::Store)?,
        Ok(None) => return Err(AuthError::Invalid),
        Err(e) => return Err(AuthError::Store(e)),
    };
    if let Some(s) = &merchant.suspension {
        return Err(AuthError::Suspended(s.clone()));
    }
    if let Some(p) = &key.pause {
        return Err(AuthError::Paused(p.clone()));
    }
    Ok(Principal { key, merchant })
}

/// How stale `api_key.last_used_at` may get: it is written at most once
/// per this interval per key.
pub const LAST_USED_EVERY: chrono::Duration = chrono::Duration::seconds(60);

/// Records that `key` (as [`authenticate`] read it) was used at `now`, at
/// most once per [`LAST_USED_EVERY`]: no write while the value read is
/// fresh, and a conditional write otherwise, so of concurrent requests
/// that all saw a stale value only one writes. Returns whether it wrote.
pub async fn record_use(
    store: &dyn Store,
    key: &ApiKey,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let cutoff = now.plus(-LAST_USED_EVERY);
    if key.last_used_at.is_some_and(|t| t >= cutoff) {
        return Ok(false);
    }
    // `NOT (last_used_at >= cutoff)` also holds when the attribute is
    // missing or null (a type mismatch compares false). `Exists` keeps a
    // key revoked meanwhile from coming back as a bare item.
    let stale = Cond::And(vec![
        Cond::Exists,
        Cond::Not(Box::new(Cond::ge("last_used_at", cutoff.to_rfc3339()))),
    ]);
    let update = Update::new().set("last_used_at", now.to_rfc3339());
    match store
        .update(&ApiKey::key_for_hash(&key.key_hash), update, Some(stale))
        .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates a merchant.
pub async fn create_merchant(
    store: &dyn Store,
    now: Timestamp,
    name: &str,
    email: &str,
    plan: Plan,
) -> Result<Merchant, StoreError> {
    let merchant = Merchant {
        id: new_id(IdKind::Merchant),
        name: name.to_owned(),
        email: email.to_owned(),
        plan,
        suspension: None,
        created_at: now,
    };
    let item = to_item(&merchant, &Merchant::key(&merchant.id), &[])?;
    store.put(item, Some(Cond::NotExists)).await?;
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
        id: new_id(IdKind::Project),
        merchant_id: merchant.id.clone(),
        name: name.to_owned(),
        live_invoicing,
        seller: None,
        created_at: now,
    };
    let item = to_item(&project, &Project::key(&project.id), &[])?;
    let mut ops = vec![TxOp::Put {
        item,
        cond: Some(Cond::NotExists),
    }];
    // The project's session counters start with it: they cover every
    // session it will have (checkout::stats::session_totals).
    for mode in [Mode::Sandbox, Mode::Live] {
        let key = crate::keys::stats_totals_marker(&project.id, mode);
        let mut marker = crate::store::Item::new();
        marker.insert(crate::store::PK.into(), key.pk.into());
        marker.insert(crate::store::SK.into(), key.sk.into());
        marker.insert("since".into(), now.to_rfc3339().into());
        ops.push(TxOp::Put {
            item: marker,
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
    store: &dyn Store,
    now: Timestamp,
    project: &Project,
    new: NewKey,
) -> Result<(String, ApiKey), StoreError> {
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
    let (secret, key, item) = mint_key(now, fields)?;
    store.put(item, Some(Cond::NotExists)).await?;
    Ok((secret, key))
}

/// Everything a minted key copies from its request (or, on rotation, from
/// the key it replaces). Scopes stay strings so a rotation keeps scopes
/// this build does not know.
struct KeyFields {
    merchant_id: String,
    project_id: String,
    mode: Mode,
    kind: KeyKind,
    scopes: Vec<String>,
    description: String,
    expires_at: Option<Timestamp>,
    spend_cap_paisa: Option<i64>,
}

/// The gsi1 partition listing a project's keys (sort key: the key id).
fn keys_partition(project_id: &str) -> String {
    keys::project_keys(project_id)
}

/// A fresh secret, its record and the item to store (not yet written).
fn mint_key(now: Timestamp, f: KeyFields) -> Result<(String, ApiKey, Item), StoreError> {
    let random: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(SECRET_RANDOM_LEN)
        .map(char::from)
        .collect();
    let secret = format!("{}{random}", f.mode.key_prefix());
    let hash = hash_secret(&secret);
    let key = ApiKey {
        id: new_id(IdKind::ApiKey),
        key_hash: hash.clone(),
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
    let index = (Index::Gsi1, keys_partition(&key.project_id), key.id.clone());
    let item = to_item(&key, &ApiKey::key_for_hash(&hash), &[index])?;
    Ok((secret, key, item))
}

/// Suspends a merchant: every call of its keys answers 403 from now on.
pub async fn suspend_merchant(
    store: &dyn Store,
    merchant_id: &str,
    suspension: Suspension,
) -> Result<(), StoreError> {
    let value =
        serde_json::to_value(&suspension).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let update = Update::new().set("suspension", value);
    store
        .update(&Merchant::key(merchant_id), update, Some(Cond::Exists))
        .await
        .map(|_| ())
}

/// Pauses one key: its calls answer 423 until resumed.
pub async fn pause_api_key(
    store: &dyn Store,
    key: &ApiKey,
    pause: Pause,
) -> Result<(), StoreError> {
    let value = serde_json::to_value(&pause).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let update = Update::new().set("pause", value);
    store
        .update(
            &ApiKey::key_for_hash(&key.key_hash),
            update,
            Some(Cond::Exists),
        )
        .await
        .map(|_| ())
}

/// The merchant `id`, if it exists.
pub async fn get_merchant(store: &dyn Store, id: &str) -> Result<Option<Merchant>, StoreError> {
    match store.get(&Merchant::key(id)).await? {
        Some(item) => Ok(Some(from_item(item)?)),
        None => Ok(None),
    }
}

/// The name customers see for a project's shop (its merchant's, else the
/// project's) and whether it may take payments (merchant present and not
/// suspended): the public pages and payment attempts ask this.
pub async fn storefront(store: &dyn Store, project_id: &str) -> Result<(String, bool), StoreError> {
    let Some(project) = get_project(store, project_id).await? else {
        return Ok(("Shop".into(), false));
    };
    match get_merchant(store, &project.merchant_id).await? {
        Some(m) => Ok((m.name, m.suspension.is_none())),
        None => Ok((project.name, false)),
    }
}

/// The project `id`, if it exists.
pub async fn get_project(store: &dyn Store, id: &str) -> Result<Option<Project>, StoreError> {
    match store.get(&Project::key(id)).await? {
        Some(item) => Ok(Some(from_item(item)?)),
        None => Ok(None),
    }
}

/// Lifts a suspension: the merchant's keys work again. The merchant as
/// written; [`StoreError::ConditionFailed`] when it does not exist.
pub async fn reinstate_merchant(
    store: &dyn Store,
    merchant_id: &str,
) -> Result<Merchant, StoreError> {
    let update = Update::new().remove("suspension");
    let item = store
        .update(&Merchant::key(merchant_id), update, Some(Cond::Exists))
        .await?;
    from_item(item)
}

/// Moves a merchant to `plan` (its plan-derived entitlements follow at
/// once). [`StoreError::ConditionFailed`] when the merchant does not exist.
pub async fn set_plan(
    store: &dyn Store,
    merchant_id: &str,
    plan: Plan,
) -> Result<Merchant, StoreError> {
    let value = serde_json::to_value(plan).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let update = Update::new().set("plan", value);
    let item = store
        .update(&Merchant::key(merchant_id), update, Some(Cond::Exists))
        .await?;
    from_item(item)
}

/// Turns live one-time invoices of a project on or off (sandbox always has
/// them). [`StoreError::ConditionFailed`] when the project does not exist.
/// Sets (or with `None` removes) the project's seller profile.
pub async fn set_seller(
    store: &dyn Store,
    project_id: &str,
    seller: Option<&Seller>,
) -> Result<Project, StoreError> {
    let update = match seller {
        Some(s) => Update::new().set(
            "seller",
            serde_json::to_value(s).map_err(|e| StoreError::Invalid(e.to_string()))?,
        ),
        None => Update::new().remove("seller"),
    };
    let item = store
        .update(&Project::key(project_id), update, Some(Cond::Exists))
        .await?;
    from_item(item)
}

pub async fn set_live_invoicing(
    store: &dyn Store,
    project_id: &str,
    enabled: bool,
) -> Result<Project, StoreError> {
    let update = Update::new().set("live_invoicing", enabled);
    let item = store
        .update(&Project::key(project_id), update, Some(Cond::Exists))
        .await?;
    from_item(item)
}

/// Every key of a project, newest first, revoked ones excluded.
///
/// Reads the project's gsi1 partition, which lags writes on DynamoDB: a key
/// issued or revoked a moment ago may be missing or still listed. Use
/// [`find_api_key`] for a consistent answer about one key.
pub async fn list_api_keys(store: &dyn Store, project_id: &str) -> Result<Vec<ApiKey>, StoreError> {
    let mut query = Query::partition(keys_partition(project_id))
        .on(Index::Gsi1)
        .backward()
        .limit(100);
    let mut keys = Vec::new();
    loop {
        let page = store.query(&query).await?;
        for item in page.items {
            keys.push(from_item::<ApiKey>(item)?);
        }
        match page.last_key {
            Some(last) => query.start_after = Some(last),
            None => break,
        }
    }
    Ok(keys)
}

/// The key `key_id` of `project_id`, read back from the table (strongly
/// consistent) once the project's listing names it. `None` when the
/// project has no such key (or it was revoked).
pub async fn find_api_key(
    store: &dyn Store,
    project_id: &str,
    key_id: &str,
) -> Result<Option<ApiKey>, StoreError> {
    let listed = list_api_keys(store, project_id).await?;
    let Some(found) = listed.into_iter().find(|k| k.id == key_id) else {
        return Ok(None);
    };
    match store.get(&ApiKey::key_for_hash(&found.key_hash)).await? {
        Some(item) => {
            let key: ApiKey = from_item(item)?;
            Ok((key.id == key_id && key.project_id == project_id).then_some(key))
        }
        None => Ok(None),
    }
}

/// Revokes a key for good: its item is deleted, so [`authenticate`] answers
/// [`AuthError::Invalid`] from now on. [`StoreError::ConditionFailed`] when
/// it was already revoked.
pub async fn revoke_api_key(store: &dyn Store, key: &ApiKey) -> Result<(), StoreError> {
    let cond = Cond::And(vec![Cond::Exists, Cond::eq("id", key.id.as_str())]);
    store
        .delete(&ApiKey::key_for_hash(&key.key_hash), Some(cond))
        .await
}

/// How long a rotated key keeps working unless the caller says otherwise.
pub const DEFAULT_ROTATION_GRACE_SECS: i64 = 24 * 60 * 60;

/// [`DEFAULT_ROTATION_GRACE_SECS`] as a duration.
pub fn default_rotation_grace() -> chrono::Duration {
    chrono::Duration::seconds(DEFAULT_ROTATION_GRACE_SECS)
}

/// The outcome of [`rotate_api_key`].
#[derive(Clone, PartialEq)]
pub struct Rotation {
    /// The new key's secret: shown once, never stored.
    pub secret: String,
    pub new_key: ApiKey,
    /// The old key as written, with its new `expires_at`.
    pub old_key: ApiKey,
}

impl std::fmt::Debug for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotation")
            .field("secret", &"[redacted]")
            .field("new_key", &self.new_key)
            .field("old_key", &self.old_key)
            .finish()
    }
}

/// Replaces `old` by a new key with the same mode, kind, scopes,
/// description and spend cap, and lets `old` expire at `now + grace` (or
/// earlier, if it already expired sooner). Both keys work during the
/// grace. The new key expires at `expires_at` (`None`: never) and starts
/// unpaused. One transaction: either both changes happen or neither.
pub async fn rotate_api_key(
    store: &dyn Store,
    now: Timestamp,
    old: &ApiKey,
    grace: chrono::Duration,
    expires_at: Option<Timestamp>,
) -> Result<Rotation, StoreError> {
    if grace < chrono::Duration::zero() {
        return Err(StoreError::Invalid(
            "the grace period cannot be negative".into(),
        ));
    }
    if old.expires_at.is_some_and(|t| t <= now) {
        return Err(StoreError::Invalid(format!(
            "key {} has already expired; issue a new key instead",
            old.id
        )));
    }
    if expires_at.is_some_and(|t| t <= now) {
        return Err(StoreError::Invalid(
            "the new key's expiry must be in the future".into(),
        ));
    }
    let fields = KeyFields {
        merchant_id: old.merchant_id.clone(),
        project_id: old.project_id.clone(),
        mode: old.mode,
        kind: old.kind,
        scopes: old.scopes.clone(),
        description: old.description.clone(),
        expires_at,
        spend_cap_paisa: old.spend_cap_paisa,
    };
    let (secret, new_key, new_item) = mint_key(now, fields)?;
    let grace_end = now.plus(grace);
    let old_expiry = match old.expires_at {
        Some(t) if t < grace_end => t,
        _ => grace_end,
    };
    let expiry_value =
        serde_json::to_value(old_expiry).map_err(|e| StoreError::Invalid(e.to_string()))?;
    store
        .transact(vec![
            TxOp::Put {
                item: new_item,
                cond: Some(Cond::NotExists),
            },
            TxOp::Update {
                key: ApiKey::key_for_hash(&old.key_hash),
                update: Update::new().set("expires_at", expiry_value),
                cond: Some(Cond::And(vec![
                    Cond::Exists,
                    Cond::eq("id", old.id.as_str()),
                ])),
            },
        ])
        .await?;
    let mut old_key = old.clone();
    old_key.expires_at = Some(old_expiry);
    Ok(Rotation {
        secret,
        new_key,
        old_key,
    })
}

pub use crate::fields::is_plausible_email;

/// `r***@example.com`: the first character and the domain, so a merchant
/// recognises the address without the key exposing it.
pub fn mask_email(email: &str) -> String {
    match email.split_once('@') {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => {
            let first: String = local.chars().take(1).collect();
            format!("{first}***@{domain}")
        }
        _ => "***".to_owned(),
    }
}

/// `GET /v1/account`, snake_case as the spec writes it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AccountView {
    pub merchant: MerchantView,
    pub project: ProjectView,
    pub api_key: ApiKeyView,
    pub plan: Plan,
    pub entitlements: Entitlements,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MerchantView {
    pub id: String,
    pub name: String,
    pub email: String,
    pub created_at: Timestamp,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProjectView {
    pub id: String,
    pub name: String,
    pub mode: Mode,
    pub created_at: Timestamp,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ApiKeyView {
    pub id: String,
    pub prefix: String,
    pub hint: String,
    pub kind: KeyKind,
    pub scopes: Vec<String>,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<Timestamp>,
    /// Nullable (decisions.md): always present.
    pub spend_cap_paisa: Option<i64>,
}

/// What the plan and the project allow.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Entitlements {
    pub live_invoicing: bool,
    pub sms_monthly_quota: u32,
    pub sandbox_fonepay_max_payment_paisa: i64,
    pub sandbox_fonepay_max_month_paisa: i64,
}

/// Sandbox fonepay caps (spec: NPR 1,000 a payment, NPR 5,000 a month).
pub const SANDBOX_FONEPAY_MAX_PAYMENT_PAISA: i64 = 100_000;
pub const SANDBOX_FONEPAY_MAX_MONTH_PAISA: i64 = 500_000;

/// The account context of the calling key: one more store read (the
/// project) on top of authentication.
pub async fn account_view(store: &dyn Store, who: &Principal) -> Result<AccountView, StoreError> {
    let project: Project = match store.get(&Project::key(&who.key.project_id)).await? {
        Some(item) => from_item(item)?,
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
            id: who.merchant.id.clone(),
            name: who.merchant.name.clone(),
            email,
            created_at: who.merchant.created_at,
        },
        project: ProjectView {
            id: project.id.clone(),
            name: project.name.clone(),
            mode: key.mode,
            created_at: project.created_at,
        },
        api_key: ApiKeyView {
            id: key.id.clone(),
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
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testenv::memory_store as store;
    use crate::time::{Clock, SystemClock};
    use std::sync::Arc;

    fn all_scopes(mode: Mode) -> NewKey {
        NewKey {
            mode,
            kind: KeyKind::Secret,
            scopes: Scope::ALL.to_vec(),
            description: "test".into(),
            expires_at: None,
            spend_cap_paisa: None,
        }
    }

    #[tokio::test]
    async fn last_used_at_is_written_at_most_once_a_minute() {
        let store = store();
        let (_, project) = setup(&*store).await;
        let now = SystemClock.now();
        let Ok((secret, key)) = issue_api_key(&*store, now, &project, all_scopes(Mode::Live)).await
        else {
            panic!("key")
        };
        let read = |secret: String| {
            let store = store.clone();
            async move {
                match store
                    .get(&ApiKey::key_for_hash(&hash_secret(&secret)))
                    .await
                {
                    Ok(Some(item)) => from_item::<ApiKey>(item).ok().and_then(|k| k.last_used_at),
                    other => panic!("{other:?}"),
                }
            }
        };
        // Never used: concurrent requests that all read null write once.
        let writes =
            futures::future::join_all((0..8).map(|_| record_use(&*store, &key, now))).await;
        assert_eq!(writes.iter().filter(|w| matches!(w, Ok(true))).count(), 1);
        assert_eq!(read(secret.clone()).await, Some(now));
        // Fresh (read or stored): no write.
        let Ok(Some(item)) = store.get(&ApiKey::key_for_hash(&key.key_hash)).await else {
            panic!()
        };
        let Ok(fresh) = from_item::<ApiKey>(item) else {
            panic!()
        };
        let soon = now.plus(chrono::Duration::seconds(59));
        assert_eq!(record_use(&*store, &fresh, soon).await, Ok(false));
        // A stale copy read before the write does not write either.
        assert_eq!(record_use(&*store, &key, soon).await, Ok(false));
        assert_eq!(read(secret.clone()).await, Some(now));
        // A minute later it does.
        let later = now.plus(chrono::Duration::seconds(61));
        assert_eq!(record_use(&*store, &fresh, later).await, Ok(true));
        assert_eq!(read(secret.clone()).await, Some(later));
        // A key deleted meanwhile is not brought back.
        let Ok(()) = store
            .delete(&ApiKey::key_for_hash(&key.key_hash), None)
            .await
        else {
            panic!()
        };
        let much_later = later.plus(chrono::Duration::seconds(120));
        assert_eq!(record_use(&*store, &fresh, much_later).await, Ok(false));
        assert!(matches!(
            store.get(&ApiKey::key_for_hash(&key.key_hash)).await,
            Ok(None)
        ));
    }

    async fn setup(store: &dyn Store) -> (Merchant, Project) {
        let now = SystemClock.now();
        let m = create_merchant(
            store,
            now,
            "Himal Traders",
            "ramesh@himal.example",
            Plan::Growth,
        )
        .await;
        let Ok(m) = m else { panic!("merchant") };
        let Ok(p) = create_project(store, now, &m, "Main shop", false).await else {
            panic!("project")
        };
        (m, p)
    }

    #[test]
    fn secret_shapes() {
        let good = format!("sk_test_{}", "a".repeat(32));
        assert_eq!(mode_of_secret(&good), Some(Mode::Sandbox));
        assert_eq!(
            mode_of_secret(&format!("sk_live_{}", "Z9".repeat(20))),
            Some(Mode::Live)
        );
        for bad in [
            "",
            "sk_test_",
            "sk_test_short",
            "pk_test_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert_eq!(mode_of_secret(bad), None, "{bad}");
        }
        assert_eq!(
            mode_of_secret(&format!("sk_test_{}-", "a".repeat(32))),
            None
        );
        assert_eq!(
            mode_of_secret(&format!("sk_test_{}", "a".repeat(200))),
            None
        );
    }

    #[test]
    fn emails_are_masked() {
        assert_eq!(mask_email("ramesh@himal.example"), "r***@himal.example");
        assert_eq!(mask_email("r@x.np"), "r***@x.np");
        assert_eq!(mask_email("not-an-email"), "***");
        assert_eq!(mask_email("@x.np"), "***");
    }

    #[test]
    fn scopes_round_trip() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        assert_eq!(Scope::parse("payments:delete"), None);
    }

    #[tokio::test]
    async fn keys_are_stored_only_as_hashes() {
        let store = store();
        let (_, p) = setup(&*store).await;
        let Ok((secret, key)) =
            issue_api_key(&*store, SystemClock.now(), &p, all_scopes(Mode::Sandbox)).await
        else {
            panic!("issue")
        };
        assert!(secret.starts_with("sk_test_"));
        assert_eq!(key.prefix, &secret[..12]);
        assert_eq!(key.hint, &secret[secret.len() - 4..]);
        let item = store
            .get(&ApiKey::key_for_hash(&hash_secret(&secret)))
            .await;
        let text = serde_json::to_string(&item.ok().flatten()).unwrap_or_default();
        assert!(
            !text.contains(&secret),
            "the secret itself must never be stored"
        );
        assert!(text.contains(&hash_secret(&secret)));
    }

    #[tokio::test]
    async fn authentication_checks_key_mode_expiry_suspension_and_pause() {
        let store = store();
        let now = SystemClock.now();
        let (m, p) = setup(&*store).await;
        let Ok((secret, key)) = issue_api_key(&*store, now, &p, all_scopes(Mode::Live)).await
        else {
            panic!("issue")
        };
        let who = authenticate(&*store, now, &secret).await;
        assert_eq!(who.as_ref().map(|w| w.mode()), Ok(Mode::Live));

        // Same random part, other mode: a different key, unknown.
        let other_mode = secret.replacen("sk_live_", "sk_test_", 1);
        assert_eq!(
            authenticate(&*store, now, &other_mode).await,
            Err(AuthError::Invalid)
        );
        // Unknown and malformed keys.
        let unknown = format!("sk_live_{}", "x".repeat(40));
        assert_eq!(
            authenticate(&*store, now, &unknown).await,
            Err(AuthError::Invalid)
        );
        assert_eq!(
            authenticate(&*store, now, "garbage").await,
            Err(AuthError::Invalid)
        );

        // Expired.
        let mut expiring = all_scopes(Mode::Sandbox);
        expiring.expires_at = Some(now.plus(chrono::Duration::seconds(1)));
        let Ok((exp_secret, _)) = issue_api_key(&*store, now, &p, expiring).await else {
            panic!()
        };
        assert!(authenticate(&*store, now, &exp_secret).await.is_ok());
        let later = now.plus(chrono::Duration::seconds(2));
        assert_eq!(
            authenticate(&*store, later, &exp_secret).await,
            Err(AuthError::Expired)
        );

        // Paused key.
        let pause = Pause {
            paused_at: now,
            reason: "rotating".into(),
        };
        assert!(pause_api_key(&*store, &key, pause.clone()).await.is_ok());
        assert_eq!(
            authenticate(&*store, now, &secret).await,
            Err(AuthError::Paused(pause))
        );

        // Suspension wins over everything else the key says.
        let s = Suspension {
            suspended_at: now,
            reason: "chargeback review".into(),
        };
        assert!(suspend_merchant(&*store, &m.id, s.clone()).await.is_ok());
        assert_eq!(
            authenticate(&*store, now, &secret).await,
            Err(AuthError::Suspended(s))
        );
    }

    #[tokio::test]
    async fn account_view_masks_email_without_pii_scope() {
        let store = store();
        let now = SystemClock.now();
        let (_, p) = setup(&*store).await;
        let mut narrow = all_scopes(Mode::Sandbox);
        narrow.scopes = vec![Scope::AccountRead];
        narrow.kind = KeyKind::Restricted;
        let Ok((s1, _)) = issue_api_key(&*store, now, &p, narrow).await else {
            panic!()
        };
        let Ok((s2, _)) = issue_api_key(&*store, now, &p, all_scopes(Mode::Sandbox)).await else {
            panic!()
        };
        let Ok(w1) = authenticate(&*store, now, &s1).await else {
            panic!()
        };
        let Ok(w2) = authenticate(&*store, now, &s2).await else {
            panic!()
        };
        let Ok(v1) = account_view(&*store, &w1).await else {
            panic!()
        };
        let Ok(v2) = account_view(&*store, &w2).await else {
            panic!()
        };
        assert_eq!(v1.merchant.email, "r***@himal.example");
        assert_eq!(v2.merchant.email, "ramesh@himal.example");
        assert_eq!(v1.api_key.kind, KeyKind::Restricted);
        assert_eq!(v1.project.mode, Mode::Sandbox);
        assert_eq!(v2.entitlements.sms_monthly_quota, 200);
    }

    fn ok<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
        match r {
            Ok(v) => v,
            Err(e) => panic!("{what}: {e:?}"),
        }
    }

    #[tokio::test]
    async fn keys_are_listed_newest_first_and_found_by_id() {
        let store = store();
        let now = SystemClock.now();
        let (m, p) = setup(&*store).await;
        let q = ok(create_project(&*store, now, &m, "Other", false).await, "q");
        let mut ids = Vec::new();
        for mode in [Mode::Sandbox, Mode::Live, Mode::Sandbox] {
            let (_, k) = ok(
                issue_api_key(&*store, now, &p, all_scopes(mode)).await,
                "issue",
            );
            ids.push(k.id);
        }
        let (_, other) = ok(
            issue_api_key(&*store, now, &q, all_scopes(Mode::Sandbox)).await,
            "issue q",
        );
        let listed = ok(list_api_keys(&*store, &p.id).await, "list");
        let listed_ids: Vec<String> = listed.iter().map(|k| k.id.clone()).collect();
        ids.reverse();
        assert_eq!(listed_ids, ids, "newest first, only this project's keys");
        assert!(listed.iter().all(|k| k.project_id == p.id));

        let found = ok(find_api_key(&*store, &p.id, &ids[1]).await, "find");
        assert_eq!(found.map(|k| k.mode), Some(Mode::Live));
        // Another project's key is not found through this project.
        assert_eq!(ok(find_api_key(&*store, &p.id, &other.id).await, "f"), None);
        assert_eq!(ok(find_api_key(&*store, &p.id, "ak_nope").await, "f"), None);
        assert_eq!(ok(list_api_keys(&*store, "proj_none").await, "l"), vec![]);
    }

    #[tokio::test]
    async fn listing_follows_pages() {
        let store = store();
        let now = SystemClock.now();
        let (_, p) = setup(&*store).await;
        for _ in 0..230 {
            ok(
                issue_api_key(&*store, now, &p, all_scopes(Mode::Sandbox)).await,
                "issue",
            );
        }
        assert_eq!(ok(list_api_keys(&*store, &p.id).await, "list").len(), 230);
    }

    #[tokio::test]
    async fn revoked_keys_stop_working_and_leave_the_list() {
        let store = store();
        let now = SystemClock.now();
        let (_, p) = setup(&*store).await;
        let (secret, key) = ok(
            issue_api_key(&*store, now, &p, all_scopes(Mode::Live)).await,
            "issue",
        );
        assert!(authenticate(&*store, now, &secret).await.is_ok());
        ok(revoke_api_key(&*store, &key).await, "revoke");
        assert_eq!(
            authenticate(&*store, now, &secret).await,
            Err(AuthError::Invalid)
        );
        assert_eq!(
            revoke_api_key(&*store, &key).await,
            Err(StoreError::ConditionFailed),
            "revoking twice says so"
        );
        assert!(ok(list_api_keys(&*store, &p.id).await, "list").is_empty());
        assert_eq!(ok(find_api_key(&*store, &p.id, &key.id).await, "f"), None);
    }

    #[tokio::test]
    async fn rotation_keeps_both_keys_working_during_the_grace() {
        let store = store();
        let now = SystemClock.now();
        let (_, p) = setup(&*store).await;
        let new = NewKey {
            mode: Mode::Live,
            kind: KeyKind::Restricted,
            scopes: vec![Scope::PaymentsRead, Scope::RefundsWrite],
            description: "POS terminal".into(),
            expires_at: None,
            spend_cap_paisa: Some(5_000_000),
        };
        let (old_secret, old) = ok(issue_api_key(&*store, now, &p, new).await, "issue");
        let grace = chrono::Duration::hours(1);
        let r = ok(
            rotate_api_key(&*store, now, &old, grace, None).await,
            "rotate",
        );
        assert!(r.secret.starts_with("sk_live_"));
        assert_ne!(r.secret, old_secret);
        assert_ne!(r.new_key.id, old.id);
        assert_eq!(r.new_key.mode, old.mode);
        assert_eq!(r.new_key.kind, old.kind);
        assert_eq!(r.new_key.scopes, old.scopes);
        assert_eq!(r.new_key.description, old.description);
        assert_eq!(r.new_key.spend_cap_paisa, old.spend_cap_paisa);
        assert_eq!(r.new_key.expires_at, None);
        assert_eq!(r.old_key.expires_at, Some(now.plus(grace)));
        assert!(!format!("{r:?}").contains(&r.secret), "Debug redacts");

        // Stored, not only returned.
        let stored = ok(find_api_key(&*store, &p.id, &old.id).await, "find");
        assert_eq!(stored.and_then(|k| k.expires_at), Some(now.plus(grace)));

        let during = now.plus(chrono::Duration::minutes(59));
        assert!(authenticate(&*store, during, &old_secret).await.is_ok());
        assert!(authenticate(&*store, during, &r.secret).await.is_ok());
        let after = now.plus(chrono::Duration::minutes(61));
        assert_eq!(
            authenticate(&*store, after, &old_secret).await,
            Err(AuthError::Expired)
        );
        assert!(authenticate(&*store, after, &r.secret).await.is_ok());
        assert_eq!(ok(list_api_keys(&*store, &p.id).await, "list").len(), 2);
        assert_eq!(default_rotation_grace(), chrono::Duration::hours(24));
    }

    #[tokio::test]
    async fn rotation_never_extends_an_expiry_and_refuses_bad_requests() {
        let store = store();
        let now = SystemClock.now();
        let (_, p) = setup(&*store).await;
        let mut soon = all_scopes(Mode::Sandbox);
        soon.expires_at = Some(now.plus(chrono::Duration::minutes(5)));
        let (_, key) = ok(issue_api_key(&*store, now, &p, soon).await, "issue");
        let later = Some(now.plus(chrono::Duration::days(30)));
        let r = ok(
            rotate_api_key(&*store, now, &key, default_rotation_grace(), later).await,
            "rotate",
        );
        assert_eq!(r.old_key.expires_at, key.expires_at, "never extended");
        assert_eq!(r.new_key.expires_at, later);

        let negative = chrono::Duration::seconds(-1);
        assert!(matches!(
            rotate_api_key(&*store, now, &key, negative, None).await,
            Err(StoreError::Invalid(_))
        ));
        let past = Some(now.plus(chrono::Duration::seconds(-1)));
        assert!(matches!(
            rotate_api_key(&*store, now, &key, negative.abs(), past).await,
            Err(StoreError::Invalid(_))
        ));
        let expired_at = now.plus(chrono::Duration::minutes(6));
        assert!(matches!(
            rotate_api_key(&*store, expired_at, &key, default_rotation_grace(), None).await,
            Err(StoreError::Invalid(_))
        ));

        // A revoked key cannot be rotated, and the failed rotation leaves
        // no new key behind.
        let (_, gone) = ok(
            issue_api_key(&*store, now, &p, all_scopes(Mode::Sandbox)).await,
            "issue",
        );
        ok(revoke_api_key(&*store, &gone).await, "revoke");
        let before = ok(list_api_keys(&*store, &p.id).await, "list").len();
        let failed = rotate_api_key(&*store, now, &gone, default_rotation_grace(), None).await;
        assert!(failed.is_err_and(|e| e.is_condition_failure()));
        assert_eq!(
            ok(list_api_keys(&*store, &p.id).await, "list").len(),
            before
        );
    }

    #[tokio::test]
    async fn reinstated_merchants_work_again() {
        let store = store();
        let now = SystemClock.now();
        let (m, p) = setup(&*store).await;
        let (secret, _) = ok(
            issue_api_key(&*store, now, &p, all_scopes(Mode::Sandbox)).await,
            "issue",
        );
        let s = Suspension {
            suspended_at: now,
            reason: "KYC".into(),
        };
        ok(suspend_merchant(&*store, &m.id, s).await, "suspend");
        assert!(matches!(
            authenticate(&*store, now, &secret).await,
            Err(AuthError::Suspended(_))
        ));
        let back = ok(reinstate_merchant(&*store, &m.id).await, "reinstate");
        assert_eq!(back.suspension, None);
        assert!(authenticate(&*store, now, &secret).await.is_ok());
        // Reinstating twice is harmless; a missing merchant is an error.
        ok(reinstate_merchant(&*store, &m.id).await, "again");
        assert_eq!(
            reinstate_merchant(&*store, "mer_missing").await,
            Err(StoreError::ConditionFailed)
        );
        assert_eq!(
            ok(get_merchant(&*store, "mer_missing").await, "g"),
            None,
            "reinstating a missing merchant must not create one"
        );
    }

    #[tokio::test]
    async fn plan_and_live_invoicing_change_the_entitlements() {
        let store = store();
        let now = SystemClock.now();
        let (m, p) = setup(&*store).await;
        let (secret, _) = ok(
            issue_api_key(&*store, now, &p, all_scopes(Mode::Live)).await,
            "issue",
        );
        let view = |store: Arc<dyn Store>, secret: String| async move {
            let who = ok(authenticate(&*store, now, &secret).await, "auth");
            ok(account_view(&*store, &who).await, "view")
        };
        let before = view(store.clone(), secret.clone()).await;
        assert_eq!(before.plan, Plan::Growth);
        assert!(!before.entitlements.live_invoicing);

        let m2 = ok(set_plan(&*store, &m.id, Plan::Pro).await, "plan");
        assert_eq!(m2.plan, Plan::Pro);
        assert_eq!(m2.name, m.name, "other fields kept");
        let p2 = ok(set_live_invoicing(&*store, &p.id, true).await, "inv");
        assert!(p2.live_invoicing);
        assert_eq!(
            ok(get_project(&*store, &p.id).await, "get").map(|p| p.live_invoicing),
            Some(true)
        );

        let after = view(store.clone(), secret).await;
        assert_eq!(after.plan, Plan::Pro);
        assert_eq!(after.entitlements.sms_monthly_quota, 1000);
        assert!(after.entitlements.live_invoicing);

        assert_eq!(
            set_plan(&*store, "mer_missing", Plan::Free).await,
            Err(StoreError::ConditionFailed)
        );
        assert_eq!(
            set_live_invoicing(&*store, "proj_missing", true).await,
            Err(StoreError::ConditionFailed)
        );
        assert_eq!(ok(get_project(&*store, "proj_missing").await, "g"), None);
    }
}
