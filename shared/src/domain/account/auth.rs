//! Authentication: a secret key's hash and mode, the principal a valid key
//! makes, why a caller is turned away, and the key's last use.

use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiKey, KeyKind, Merchant, Pause, Suspension};
use crate::app::Deps;
use crate::domain::record::{Changes, Record};
use crate::domain::{Mode, Tenant};
use crate::ids::ProjectId;
use crate::refusal::{Kind, Refusal};
use crate::store::{Cond, Store, StoreError};
use crate::time::Timestamp;

/// Random characters after the mode prefix of a secret key.
pub(super) const SECRET_RANDOM_LEN: usize = 40;
const SECRET_MIN_RANDOM_LEN: usize = 32;
const SECRET_MAX_LEN: usize = 128;

/// Hex SHA-256 of a secret key, the only form in which keys are stored.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The mode a secret key's prefix claims, if it is shaped like one of our
/// secret keys (`sk_…`).
pub fn mode_of_secret(secret: &str) -> Option<Mode> {
    match shape_of_key(secret) {
        Some((mode, false)) => Some(mode),
        _ => None,
    }
}

/// The mode a key's prefix claims and whether it is publishable (`pk_…`),
/// if it is shaped like one of our keys.
pub fn shape_of_key(secret: &str) -> Option<(Mode, bool)> {
    let (mode, publishable, rest) = if let Some(rest) = secret.strip_prefix("sk_test_") {
        (Mode::Sandbox, false, rest)
    } else if let Some(rest) = secret.strip_prefix("sk_live_") {
        (Mode::Live, false, rest)
    } else if let Some(rest) = secret.strip_prefix("pk_test_") {
        (Mode::Sandbox, true, rest)
    } else if let Some(rest) = secret.strip_prefix("pk_live_") {
        (Mode::Live, true, rest)
    } else {
        return None;
    };
    let well_formed = rest.len() >= SECRET_MIN_RANDOM_LEN
        && secret.len() <= SECRET_MAX_LEN
        && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    well_formed.then_some((mode, publishable))
}

/// Who is calling: the key and its merchant, both read for every request,
/// and the tenant the key acts for (its project and mode).
#[derive(Clone, Debug, PartialEq)]
pub struct Principal {
    pub key: ApiKey,
    pub merchant: Merchant,
    tenant: Tenant,
}

impl Principal {
    pub fn new(key: ApiKey, merchant: Merchant) -> Self {
        let tenant = Tenant::new(key.project_id.clone(), key.mode);
        Principal {
            key,
            merchant,
            tenant,
        }
    }

    /// Whose records the caller reads and writes.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    pub fn mode(&self) -> Mode {
        self.key.mode
    }
    pub fn project_id(&self) -> &ProjectId {
        &self.key.project_id
    }
}

/// The refusal of a publishable key anywhere but the mobile endpoints.
pub fn publishable_refusal() -> Refusal {
    Refusal::forbidden(
        "permission_denied",
        "This is a publishable key (pk_…): it can call only the mobile endpoints \
         with a session's client secret; call this endpoint from your server \
         with a secret key",
    )
}

/// A secret key sent to an endpoint for apps: refused, so that no app is
/// ever built around one.
pub fn secret_key_in_app_refusal() -> Refusal {
    Refusal::forbidden(
        "permission_denied",
        "This endpoint is for apps and takes the project's publishable key (pk_…) \
         with the session's client secret; a secret key must never be in an app",
    )
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
    let key = key_of_secret(store, now, secret).await?;
    principal_in(store, key).await
}

/// The first half of [`authenticate`]: the key of the bearer secret (one
/// read), refused when unknown, of another mode than its prefix says, or
/// expired.
pub async fn authenticate_key(
    deps: &Deps,
    now: Timestamp,
    secret: &str,
) -> Result<ApiKey, AuthError> {
    key_of_secret(&*deps.store, now, secret).await
}

async fn key_of_secret(
    store: &dyn Store,
    now: Timestamp,
    secret: &str,
) -> Result<ApiKey, AuthError> {
    let Some((claimed_mode, publishable)) = shape_of_key(secret) else {
        return Err(AuthError::Invalid);
    };
    let hash = hash_secret(secret);
    let key: ApiKey = crate::domain::record::get(store, &ApiKey::key_for_hash(&hash))
        .await
        .map_err(AuthError::Store)?
        .ok_or(AuthError::Invalid)?;
    // The lookup was by hash already; the constant-time compare keeps the
    // check itself free of timing signals whatever the store does.
    let same: bool = key.key_hash.as_bytes().ct_eq(hash.as_bytes()).into();
    // A key is of the kind its prefix says, or it is no key of ours.
    if !same || key.mode != claimed_mode || (key.kind == KeyKind::Publishable) != publishable {
        return Err(AuthError::Invalid);
    }
    if key.expires_at.is_some_and(|t| t <= now) {
        return Err(AuthError::Expired);
    }
    Ok(key)
}

/// The second half of [`authenticate`]: the key's merchant (one read),
/// refused when suspended, then the key refused when paused.
pub async fn principal_of(deps: &Deps, key: ApiKey) -> Result<Principal, AuthError> {
    principal_in(&*deps.store, key).await
}

async fn principal_in(store: &dyn Store, key: ApiKey) -> Result<Principal, AuthError> {
    let merchant: Merchant =
        match crate::domain::record::get(store, &Merchant::key(&key.merchant_id)).await {
            Ok(Some(merchant)) => merchant,
            Ok(None) => return Err(AuthError::Invalid),
            Err(e) => return Err(AuthError::Store(e)),
        };
    if let Some(s) = &merchant.suspension {
        return Err(AuthError::Suspended(s.clone()));
    }
    if let Some(p) = &key.pause {
        return Err(AuthError::Paused(p.clone()));
    }
    Ok(Principal::new(key, merchant))
}

/// How stale `api_key.last_used_at` may get: it is written at most once
/// per this interval per key.
pub const LAST_USED_EVERY: chrono::Duration = chrono::Duration::seconds(60);

/// Records that `key` (as [`authenticate`] read it) was used at `now`, at
/// most once per [`LAST_USED_EVERY`]: no write while the value read is
/// fresh, and a conditional write otherwise, so of concurrent requests
/// that all saw a stale value only one writes. Returns whether it wrote.
pub async fn record_use(deps: &Deps, key: &ApiKey, now: Timestamp) -> Result<bool, StoreError> {
    let store = &*deps.store;
    let cutoff = now.plus(-LAST_USED_EVERY);
    if key.last_used_at.is_some_and(|t| t >= cutoff) {
        return Ok(false);
    }
    // `NOT (last_used_at >= cutoff)` also holds when the attribute is
    // missing or null (a type mismatch compares false). `Exists` keeps a
    // key revoked meanwhile from coming back as a bare item.
    let stale = Cond::And(vec![
        Cond::Exists,
        Cond::Not(Box::new(ApiKey::LAST_USED_AT.ge(&Some(cutoff)))),
    ]);
    let update = Changes::new().set_some(ApiKey::LAST_USED_AT, &now);
    match store
        .update(&key.item_key(), update.into(), Some(stale))
        .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}
