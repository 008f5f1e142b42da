//! The records behind `Idempotency-Key` (decisions.md, Idempotency): one
//! claim per (project, mode, key), taken with a conditional put before
//! the request runs and completed with its answer after. The HTTP edge
//! (`edge::idempotency`) decides what each outcome answers; this module
//! only stores and reads the claims. An answer's secret fields (a mobile
//! session's client secret) are kept sealed with the credentials master
//! key ([`Ticket::seal`], [`open_sealed`]), never in the clear.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::app::Deps;
use crate::domain::Tenant;
use crate::domain::credentials::{self, CredentialsError, SealedSecret};
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
    /// The answer's fields holding a secret a replay shows again (a
    /// mobile session's client secret): a JSON object sealed with the
    /// credentials master key, bound to this record's key; `body` holds
    /// the rest. Absent on most answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<SealedSecret>,
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
    SEALED: Option<SealedSecret> = sealed,
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

/// What a claim's sealed fields are bound to: the record they were
/// sealed for (its project, mode and hashed key), so a sealed value copied
/// into another record no longer opens.
fn sealed_context(key: &Key) -> String {
    format!("idempotency/{}/{}", key.pk, key.sk)
}

/// The fields `claim`, the record of `tenant`'s key `key`, keeps sealed,
/// opened with the current or a previous master key (`None` when it
/// keeps none).
pub fn open_sealed(
    deps: &Deps,
    tenant: &Tenant,
    key: &str,
    claim: &Claim,
) -> Result<Option<Map<String, Value>>, CredentialsError> {
    let Some(sealed) = &claim.sealed else {
        return Ok(None);
    };
    let keys = deps.providers.keys().ok_or(CredentialsError::MissingKey)?;
    let context = sealed_context(&record_key(tenant, key));
    let text = credentials::open_secret(keys, sealed, &context)?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(fields)) => Ok(Some(fields)),
        _ => Err(CredentialsError::Corrupt(
            context,
            "sealed fields are not a JSON object".into(),
        )),
    }
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
        sealed: None,
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

    /// `fields` of this request's answer sealed for its record with the
    /// current master key (none configured: [`CredentialsError::MissingKey`]).
    pub fn seal(
        &self,
        deps: &Deps,
        fields: &Map<String, Value>,
    ) -> Result<SealedSecret, CredentialsError> {
        let keys = deps.providers.keys().ok_or(CredentialsError::MissingKey)?;
        let text = Value::Object(fields.clone()).to_string();
        credentials::seal_secret(keys, &sealed_context(&self.key), &text)
    }

    /// Done, answered `status`; `answer` (body, content type) is kept for
    /// replays when it could be stored, with its `sealed` fields
    /// ([`Ticket::seal`]).
    pub async fn complete(
        &self,
        deps: &Deps,
        status: u16,
        answer: Option<(String, String)>,
        sealed: Option<SealedSecret>,
    ) -> Result<(), StoreError> {
        let mut done = Changes::<Claim>::new()
            .set(Claim::STATE, &ClaimState::Completed)
            .set_some(Claim::STATUS, &status);
        if let Some((body, content_type)) = answer {
            done = done
                .set_some(Claim::BODY, &body)
                .set_some(Claim::CONTENT_TYPE, &content_type);
        }
        if let Some(sealed) = &sealed {
            done = done.set_some(Claim::SEALED, sealed);
        }
        deps.store
            .update(&self.key, done.into(), Some(self.held()))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{AppState, Config};
    use crate::domain::Mode;
    use crate::domain::credentials::{CredentialsKey, CredentialsKeys};
    use crate::providers::ProviderHub;
    use crate::time::SystemClock;
    use std::sync::Arc;

    fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
        r.unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    fn deps(keys: CredentialsKeys, store: Arc<dyn crate::store::Store>) -> AppState {
        let config = Config {
            public_base_url: "http://x".into(),
            events_base_url: None,
            dashboard_base_url: None,
        };
        AppState::new(store, Arc::new(SystemClock), config)
            .with_providers(ProviderHub::keys_only(keys))
    }

    const SECRET: &str = "cs_secret_Zq8dW3kP0xY7mN2bV5cL9aS1fG4hJ6tR8uE0iO3p";

    /// A completed claim of `tenant`'s key `key`, its client secret
    /// sealed: the stored item (as the table or a backup holds it) and
    /// the claim read back.
    async fn completed(state: &AppState, tenant: &Tenant, key: &str) -> (String, Claim) {
        let request = Request {
            tenant,
            key,
            fingerprint: "print",
            api_key: &ApiKeyId::stored("key_1"),
        };
        let Claimed::Ours(ticket) = ok(claim(state, request).await, "claim") else {
            panic!("the key was free")
        };
        let mut fields = Map::new();
        fields.insert("client_secret".into(), SECRET.into());
        let sealed = ok(ticket.seal(state, &fields), "seal");
        let body = r#"{"id":"cs_1","amount":50000}"#.to_owned();
        let answer = Some((body, "application/json".to_owned()));
        ok(
            ticket.complete(state, 201, answer, Some(sealed)).await,
            "complete",
        );
        let item = ok(state.store.get(&record_key(tenant, key)).await, "get");
        let Some(item) = item else {
            panic!("no record")
        };
        let raw = Value::Object(item.clone()).to_string();
        (raw, ok(from_item(item), "decode"))
    }

    #[tokio::test]
    async fn a_kept_secret_is_sealed_and_opens_for_its_record_only() {
        let k1 = ok(CredentialsKey::generate("k1"), "key");
        let state = deps(CredentialsKeys::single(k1), crate::testenv::memory_store());
        let tenant = Tenant::new("prj_1", Mode::Sandbox);
        let (raw, claim) = completed(&state, &tenant, "order-1").await;
        assert!(
            !raw.contains("Zq8dW3kP0xY7mN2bV5cL9aS1fG4hJ6tR8uE0iO3p"),
            "{raw}"
        );
        assert!(raw.contains("cs_1"), "the rest is kept: {raw}");
        assert_eq!(claim.state, ClaimState::Completed);
        let opened = ok(open_sealed(&state, &tenant, "order-1", &claim), "open");
        let secret = opened.as_ref().and_then(|f| f.get("client_secret"));
        assert_eq!(secret.and_then(Value::as_str), Some(SECRET));
        // Copied into another key's record, or another project's, it
        // does not open.
        assert!(matches!(
            open_sealed(&state, &tenant, "order-2", &claim),
            Err(CredentialsError::Decrypt(_))
        ));
        let other = Tenant::new("prj_2", Mode::Sandbox);
        assert!(open_sealed(&state, &other, "order-1", &claim).is_err());
        // A claim without sealed fields opens to none.
        let plain = Claim {
            sealed: None,
            ..claim
        };
        assert_eq!(
            ok(open_sealed(&state, &tenant, "order-1", &plain), "open"),
            None
        );
    }

    #[tokio::test]
    async fn a_kept_secret_opens_after_a_master_key_rotation() {
        let store = crate::testenv::memory_store();
        let old = ok(CredentialsKey::generate("2026-01"), "key");
        let new = ok(CredentialsKey::generate("2026-11"), "key");
        let before = deps(CredentialsKeys::single(old.clone()), store.clone());
        let tenant = Tenant::new("prj_1", Mode::Live);
        let (_, claim) = completed(&before, &tenant, "order-1").await;
        // The new key current, the old one previous: the replay opens.
        let rotating = deps(
            ok(CredentialsKeys::new(new.clone(), vec![old]), "keys"),
            store.clone(),
        );
        let opened = ok(open_sealed(&rotating, &tenant, "order-1", &claim), "open");
        let secret = opened.as_ref().and_then(|f| f.get("client_secret"));
        assert_eq!(secret.and_then(Value::as_str), Some(SECRET));
        // The old key dropped too soon: refused, never another secret.
        let after = deps(CredentialsKeys::single(new), store);
        assert!(matches!(
            open_sealed(&after, &tenant, "order-1", &claim),
            Err(CredentialsError::UnknownKey { .. })
        ));
    }
}
