//! The audit log: who did what, when and from where, per merchant, newest
//! first. Written by every dashboard action; read by owners.

use serde::{Deserialize, Serialize};

use super::DashboardUser;
use super::sessions::DashboardSession;
use crate::app::Deps;
use crate::domain::Mode;
use crate::domain::record::{Record, from_item};
use crate::ids::{AuditId, MerchantId, ProjectId, UserId};
use crate::keys;
use crate::store::{Cond, Key, Query, SkCond, StoreError, TxOp};
use crate::time::Timestamp;

/// Longest `detail` kept (a note, a URL).
const DETAIL_MAX: usize = 500;
/// Entries a page shows.
pub const AUDIT_PAGE: usize = 25;

/// One thing a person did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub id: AuditId,
    pub merchant_id: MerchantId,
    pub user_id: UserId,
    pub email: String,
    /// What, e.g. `refund.create`, `key.rotate`, `sign_in`.
    pub action: String,
    /// The record acted on (`pay_…`, `ak_…`), or empty.
    pub target: String,
    /// The project and mode it happened in, or empty.
    #[serde(default)]
    pub project_id: ProjectId,
    #[serde(default)]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub detail: String,
    pub address: String,
    pub at: Timestamp,
}

crate::attrs! { AuditEntry {
    ID: AuditId = id,
    MERCHANT_ID: MerchantId = merchant_id,
    USER_ID: UserId = user_id,
    EMAIL: String = email,
    ACTION: String = action,
    TARGET: String = target,
    PROJECT_ID: ProjectId = project_id,
    MODE: Option<Mode> = mode,
    DETAIL: String = detail,
    ADDRESS: String = address,
    AT: Timestamp = at,
} }

/// Who acts, as the audit log names them.
#[derive(Clone, Debug)]
pub struct Actor {
    pub user_id: UserId,
    pub email: String,
    pub merchant_id: MerchantId,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub address: String,
}

impl Actor {
    pub fn of(user: &DashboardUser, session: &DashboardSession, address: &str) -> Actor {
        Actor {
            user_id: user.id.clone(),
            email: user.email.clone(),
            merchant_id: user.merchant_id.clone(),
            project_id: session.project_id.clone(),
            mode: session.mode,
            address: address.chars().take(64).collect(),
        }
    }
}

/// The audit entry of `action` on `target` by `actor`.
pub fn audit_entry(
    actor: &Actor,
    now: Timestamp,
    action: &str,
    target: &str,
    detail: &str,
) -> AuditEntry {
    AuditEntry {
        id: AuditId::new(),
        merchant_id: actor.merchant_id.clone(),
        user_id: actor.user_id.clone(),
        email: actor.email.clone(),
        action: action.to_owned(),
        target: target.to_owned(),
        project_id: actor.project_id.clone(),
        mode: Some(actor.mode),
        detail: detail.chars().take(DETAIL_MAX).collect(),
        address: actor.address.clone(),
        at: now,
    }
}

/// The audit entry of `action` about `user` with no session (a sign-in
/// attempt): from `address` (a network, for a stranger's attempts), in no
/// project.
pub fn user_entry(
    user: &DashboardUser,
    now: Timestamp,
    action: &str,
    detail: &str,
    address: &str,
) -> AuditEntry {
    AuditEntry {
        id: AuditId::new(),
        merchant_id: user.merchant_id.clone(),
        user_id: user.id.clone(),
        email: user.email.clone(),
        action: action.to_owned(),
        target: user.id.to_string(),
        project_id: ProjectId::default(),
        mode: None,
        detail: detail.chars().take(DETAIL_MAX).collect(),
        address: address.chars().take(64).collect(),
        at: now,
    }
}

impl Record for AuditEntry {
    /// In its merchant's log, by time.
    fn item_key(&self) -> Key {
        Key::new(
            keys::audit_partition(&self.merchant_id),
            format!("{}#{}", self.at.to_rfc3339(), self.id),
        )
    }
}

/// Writes an audit entry.
pub async fn record_audit(deps: &Deps, entry: &AuditEntry) -> Result<(), StoreError> {
    let store = &*deps.store;
    store.put(entry.to_item()?, Some(Cond::NotExists)).await
}

/// The put of an audit entry, for an action's own transaction.
pub fn audit_op(entry: &AuditEntry) -> Result<TxOp, StoreError> {
    entry.put_new()
}

/// A page of a merchant's audit log, newest first, from before the
/// cursor `before` (an entry's sort key); and the cursor of the next page.
pub async fn list_audit(
    deps: &Deps,
    merchant_id: &MerchantId,
    before: Option<&str>,
    limit: usize,
) -> Result<(Vec<AuditEntry>, Option<String>), StoreError> {
    let store = &*deps.store;
    let mut q = Query::partition(keys::audit_partition(merchant_id))
        .backward()
        .limit(limit);
    if let Some(before) = before {
        q = q.sk(SkCond::Lt(before.to_owned()));
    }
    let page = store.query(&q).await?;
    let next = page
        .last_key
        .as_ref()
        .and_then(|k| k.get(crate::store::SK))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    let entries = page
        .items
        .into_iter()
        .map(from_item)
        .collect::<Result<Vec<AuditEntry>, _>>()?;
    Ok((entries, next))
}
