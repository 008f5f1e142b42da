//! A project's keys: listing, finding, revoking and rotating with a grace
//! period.

use super::ApiKey;
use super::admin::{KeyFields, keys_partition, mint_key};
use crate::app::Deps;
use crate::domain::record::{Changes, Record, from_item};
use crate::ids::{ApiKeyId, ProjectId};
use crate::store::{Cond, Index, Query, StoreError, TxOp};
use crate::time::Timestamp;

/// Every key of a project, newest first, revoked ones excluded.
///
/// Reads the project's gsi1 partition, which lags writes on DynamoDB: a key
/// issued or revoked a moment ago may be missing or still listed. Use
/// [`find_api_key`] for a consistent answer about one key.
pub async fn list_api_keys(deps: &Deps, project_id: &ProjectId) -> Result<Vec<ApiKey>, StoreError> {
    let store = &*deps.store;
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
    deps: &Deps,
    project_id: &ProjectId,
    key_id: &ApiKeyId,
) -> Result<Option<ApiKey>, StoreError> {
    let store = &*deps.store;
    let listed = list_api_keys(deps, project_id).await?;
    let Some(found) = listed.into_iter().find(|k| k.id == *key_id) else {
        return Ok(None);
    };
    let key: Option<ApiKey> = crate::domain::record::get(store, &found.item_key()).await?;
    Ok(key.filter(|key| key.id == *key_id && key.project_id == *project_id))
}

/// Revokes a key for good: its item is deleted, so [`authenticate`](super::authenticate) answers
/// [`AuthError::Invalid`](super::AuthError::Invalid) from now on. [`StoreError::ConditionFailed`] when
/// it was already revoked.
pub async fn revoke_api_key(deps: &Deps, key: &ApiKey) -> Result<(), StoreError> {
    revoke_api_key_with(deps, key, Vec::new()).await
}

/// [`revoke_api_key`] with `also` (the dashboard's audit entry) in the
/// same transaction: written only if the key goes.
pub async fn revoke_api_key_with(
    deps: &Deps,
    key: &ApiKey,
    also: Vec<crate::store::TxOp>,
) -> Result<(), StoreError> {
    let store = &*deps.store;
    let cond = Cond::And(vec![Cond::Exists, ApiKey::ID.eq(&key.id)]);
    let deleted = if also.is_empty() {
        store.delete(&key.item_key(), Some(cond)).await
    } else {
        let op = crate::store::TxOp::Delete {
            key: key.item_key(),
            cond: Some(cond),
        };
        crate::store::write_with(store, op, also).await
    };
    super::cache::changed();
    deleted
}

/// How long a rotated key keeps working unless the caller says otherwise.
#[cfg(test)]
const DEFAULT_ROTATION_GRACE_SECS: i64 = 24 * 60 * 60;

/// [`DEFAULT_ROTATION_GRACE_SECS`] as a duration.
#[cfg(test)]
pub(super) fn default_rotation_grace() -> chrono::Duration {
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
    deps: &Deps,
    now: Timestamp,
    old: &ApiKey,
    grace: chrono::Duration,
    expires_at: Option<Timestamp>,
) -> Result<Rotation, StoreError> {
    rotate_api_key_with(deps, now, old, grace, expires_at, |_| Ok(Vec::new())).await
}

/// [`rotate_api_key`] with `also(new key)` (the dashboard's audit entry)
/// in the rotation's transaction.
pub async fn rotate_api_key_with(
    deps: &Deps,
    now: Timestamp,
    old: &ApiKey,
    grace: chrono::Duration,
    expires_at: Option<Timestamp>,
    also: impl FnOnce(&ApiKey) -> Result<Vec<TxOp>, StoreError>,
) -> Result<Rotation, StoreError> {
    let store = &*deps.store;
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
    let (secret, new_key) = mint_key(now, fields);
    let grace_end = now.plus(grace);
    let old_expiry = match old.expires_at {
        Some(t) if t < grace_end => t,
        _ => grace_end,
    };
    let mut ops = vec![
        new_key.put_new()?,
        TxOp::Update {
            key: old.item_key(),
            update: Changes::new()
                .set_some(ApiKey::EXPIRES_AT, &old_expiry)
                .into(),
            cond: Some(Cond::And(vec![Cond::Exists, ApiKey::ID.eq(&old.id)])),
        },
    ];
    ops.extend(also(&new_key)?);
    let written = store.transact(ops).await;
    super::cache::changed();
    written?;
    let mut old_key = old.clone();
    old_key.expires_at = Some(old_expiry);
    Ok(Rotation {
        secret,
        new_key,
        old_key,
    })
}

pub use crate::fields::is_plausible_email;
