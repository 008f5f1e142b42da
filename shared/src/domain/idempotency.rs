//! The records behind `Idempotency-Key` (decisions.md, Idempotency): one
//! claim per (project, mode, key), taken with a conditional put before
//! the request runs and completed with its answer after. The HTTP edge
//! (`edge::idempotency`) decides what each outcome answers; this module
//! only stores and reads the claims.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::app::Deps;
use crate::domain::Tenant;
use crate::domain::record::{Changes, from_item, item_at};
use crate::ids::{ApiKeyId, EventId};
use crate::store::fence::{Fence, RETENTION};
use crate::store::{Cond, Key, StoreError};
use crate::time::Timestamp;

/// How long an in-flight claim blocks retries before another may take it.
pub const LEASE: chrono::Duration = chrono::Duration::seconds(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    InProgress,
    Completed,
}

/// One idempotency key's record: who holds it, for which request, and
/// once done the answer to replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub state: ClaimState,
    /// What makes two requests "the same request" (method, path, query
    /// and body, hashed).
    pub fingerprint: String,
    /// Random tag of the request holding the claim.
    pub owner: String,
    pub locked_until: Timestamp,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub body: Option<String>,
    pub created_at: Timestamp,
    /// Epoch seconds after which the record is gone (DynamoDB TTL).
    pub ttl: i64,
    /// The API key that made the request: another key of the project
    /// (which may lack the route's scope) is never answered its replay.
    /// Absent on records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<ApiKeyId>,
}

crate::attrs! { Claim {
    STATE: ClaimState = state,
    FINGERPRINT: String = fingerprint,
    OWNER: String = owner,
    LOCKED_UNTIL: Timestamp = locked_until,
    STATUS: Option<u16> = status,
    CONTENT_TYPE: Option<String> = content_type,
    BODY: Option<String> = body,
    CREATED_AT: Timestamp = created_at,
    TTL: i64 = ttl,
    KEY_ID: Option<ApiKeyId> = key_id,
} }

/// The request that wants key `key`: whose, and which.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub tenant: &'a Tenant,
    /// The `Idempotency-Key` as sent (hashed before it is stored).
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub api_key: &'a ApiKeyId,
}

/// Where the claim of `tenant`'s `Idempotency-Key` `key` is stored.
pub fn record_key(tenant: &Tenant, key: &str) -> Key {
    // Hashed: any printable key fits, and the store never sees it raw.
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    crate::keys::idempotency(&tenant.project, tenant.mode.as_str(), &digest)
}

/// What claiming a key found.
#[derive(Debug)]
pub enum Claimed {
    /// The key is this request's until it answers.
    Ours(Ticket),
    /// Someone holds it (or held it): their claim, unless it vanished
    /// between the refused put and the read.
    Taken(Option<Claim>),
}

/// A claim this request holds: every later write is conditioned on it.
#[derive(Clone, Debug)]
pub struct Ticket {
    key: Key,
    owner: String,
    fingerprint: String,
    made_at: Timestamp,
}

/// Claims `req`'s key, free when there is no record, an expired one, or
/// an abandoned claim (lease over) of the same request by the same API key.
pub async fn claim(deps: &Deps, req: Request<'_>) -> Result<Claimed, StoreError> {
    let now = deps.clock.now();
    let key = record_key(req.tenant, req.key);
    let owner = EventId::new().to_string();
    let claim = Claim {
        state: ClaimState::InProgress,
        fingerprint: req.fingerprint.to_owned(),
        owner: owner.clone(),
        locked_until: now.plus(LEASE),
        status: None,
        content_type: None,
        body: None,
        created_at: now,
        ttl: now.plus(RETENTION).unix_seconds(),
        key_id: Some(req.api_key.clone()),
    };
    let free = Cond::Or(vec![
        Cond::NotExists,
        Claim::TTL.lt(&now.unix_seconds()),
        Cond::And(vec![
            Claim::STATE.eq(&ClaimState::InProgress),
            Claim::FINGERPRINT.eq(req.fingerprint),
            Claim::LOCKED_UNTIL.lt(&now),
            Cond::Or(vec![Claim::KEY_ID.missing(), Claim::KEY_ID.is(req.api_key)]),
        ]),
    ]);
    match deps.store.put(item_at(&claim, &key)?, Some(free)).await {
        Ok(()) => Ok(Claimed::Ours(Ticket {
            key,
            owner,
            fingerprint: req.fingerprint.to_owned(),
            made_at: now,
        })),
        Err(StoreError::ConditionFailed) => match deps.store.get(&key).await? {
            Some(item) => Ok(Claimed::Taken(Some(from_item(item)?))),
            None => Ok(Claimed::Taken(None)),
        },
        Err(e) => Err(e),
    }
}

impl Ticket {
    /// The request's fence: it names the request (its fingerprint) as
    /// well as the key, so another request under the same key never finds
    /// this one's write as "already done".
    pub fn fence(&self) -> Fence {
        Fence::new(
            crate::keys::idempotency_fence(&self.key, &self.fingerprint),
            self.made_at.plus(RETENTION).unix_seconds(),
        )
    }

    /// Only while this request still holds the claim.
    fn held(&self) -> Cond {
        Cond::And(vec![
            Claim::OWNER.eq(&self.owner),
            Claim::STATE.eq(&ClaimState::InProgress),
        ])
    }

    /// Nothing was written: the key is free again.
    pub async fn release(&self, deps: &Deps) -> Result<(), StoreError> {
        deps.store.delete(&self.key, Some(self.held())).await
    }

    /// A handler ran and may have written (its fence knows): the lease
    /// ends now, so a retry of this request takes it over at once while
    /// another request under the same key is still refused.
    pub async fn lapse(&self, deps: &Deps) -> Result<(), StoreError> {
        let lapsed =
            Changes::<Claim>::new().set(Claim::LOCKED_UNTIL, &deps.clock.now().plus(-LEASE));
        deps.store
            .update(&self.key, lapsed.into(), Some(self.held()))
            .await
            .map(drop)
    }

    /// Done, answered `status`; `answer` (body, content type) is kept for
    /// replays when it could be stored.
    pub async fn complete(
        &self,
        deps: &Deps,
        status: u16,
        answer: Option<(String, String)>,
    ) -> Result<(), StoreError> {
        let mut done = Changes::<Claim>::new()
            .set(Claim::STATE, &ClaimState::Completed)
            .set_some(Claim::STATUS, &status);
        if let Some((body, content_type)) = answer {
            done = done
                .set_some(Claim::BODY, &body)
                .set_some(Claim::CONTENT_TYPE, &content_type);
        }
        deps.store
            .update(&self.key, done.into(), Some(self.held()))
            .await
            .map(drop)
    }
}
