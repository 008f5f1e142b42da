//! Memberships: one person (one email, one password) in several
//! merchants, with a role in each. A user's first merchant and role are
//! the fields of the user itself (every user stored before memberships
//! keeps working as it was: that is their only membership); every further
//! merchant is a [`Membership`] record in the user's partition, listed
//! among that merchant's people. A session looks at one merchant; every
//! request reads the person's membership of it ([`member_view`]), so
//! removing or disabling a membership ends the access to that merchant at
//! the next request, and nothing else.

use serde::{Deserialize, Serialize};

use super::audit::{AuditEntry, audit_op};
use super::users::get_user;
use super::{DashboardError, DashboardUser, Role};
use crate::app::Deps;
use crate::domain::record::{Changes, Entry, Record, all_of, from_item, get};
use crate::ids::{MerchantId, UserId};
use crate::store::{Cond, Index, Key, Query, SkCond, Store, StoreError, TxOp, update_with};
use crate::time::Timestamp;

/// The memberships of one merchant a people page lists at most (with its
/// first-merchant users, each at most 100).
const MEMBERS_LISTED: usize = 100;

/// `user_id`'s place in a merchant other than their first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    pub user_id: UserId,
    pub merchant_id: MerchantId,
    pub role: Role,
    /// Disabled by an owner of this merchant: no access to it, the
    /// person's other merchants untouched.
    #[serde(default)]
    pub disabled: bool,
    pub created_at: Timestamp,
}

crate::attrs! { Membership {
    USER_ID: UserId = user_id,
    MERCHANT_ID: MerchantId = merchant_id,
    ROLE: Role = role,
    DISABLED: bool = disabled,
    CREATED_AT: Timestamp = created_at,
} }

impl Membership {
    /// In the user's partition (beside the user), one per merchant.
    pub fn key(user_id: &UserId, merchant_id: &MerchantId) -> Key {
        Key::new(format!("DUSER#{user_id}"), format!("DMEM#{merchant_id}"))
    }
}

/// A merchant's memberships (`gsi1`).
fn merchant_members(merchant_id: &MerchantId) -> String {
    format!("MER#{merchant_id}#DMEM")
}

impl Record for Membership {
    fn item_key(&self) -> Key {
        Membership::key(&self.user_id, &self.merchant_id)
    }

    /// Listed among its merchant's people, oldest first.
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            merchant_members(&self.merchant_id),
            format!("{}#{}", self.created_at.to_rfc3339(), self.user_id),
        )]
    }
}

/// `user` as a person of `m`'s merchant: its merchant and role, disabled
/// if either the user or the membership is.
fn as_member(user: &DashboardUser, m: &Membership) -> DashboardUser {
    DashboardUser {
        merchant_id: m.merchant_id.clone(),
        role: m.role,
        disabled: user.disabled || m.disabled,
        ..user.clone()
    }
}

/// `user` (as stored) as a person of `merchant_id`, if they are an
/// enabled one: their first merchant from the user's own fields, any
/// other from its membership (one read). The dashboard authorises every
/// request against what this answers for the session's merchant.
pub async fn member_view(
    store: &dyn Store,
    user: &DashboardUser,
    merchant_id: &MerchantId,
) -> Result<Option<DashboardUser>, StoreError> {
    if user.merchant_id == *merchant_id {
        return Ok((!user.disabled).then(|| user.clone()));
    }
    let m: Option<Membership> = get(store, &Membership::key(&user.id, merchant_id)).await?;
    Ok(m.map(|m| as_member(user, &m)).filter(|u| !u.disabled))
}

/// The merchants `user_id` may switch to, first merchant first (two
/// reads: the user, their memberships).
pub async fn member_merchants(
    deps: &Deps,
    user_id: &UserId,
) -> Result<Vec<(MerchantId, Role)>, StoreError> {
    let store = &*deps.store;
    let Some(user) = get_user(store, user_id).await? else {
        return Ok(Vec::new());
    };
    let q = Query::partition(format!("DUSER#{user_id}"))
        .sk(SkCond::BeginsWith("DMEM#".to_owned()))
        .limit(MEMBERS_LISTED);
    let others: Vec<Membership> = all_of(store, &q).await?;
    let mut out = vec![(user.merchant_id.clone(), user.role)];
    out.extend(
        others
            .into_iter()
            .filter(|m| !m.disabled)
            .map(|m| (m.merchant_id, m.role)),
    );
    Ok(out)
}

/// The merchants `user_id` may switch to, with their names, for the
/// dashboard's switcher: none when they belong to one only (then no more
/// reads than [`member_merchants`]).
pub async fn switchable_merchants(
    deps: &Deps,
    user_id: &UserId,
) -> Result<Vec<(MerchantId, String, Role)>, StoreError> {
    let merchants = member_merchants(deps, user_id).await?;
    let mut out = Vec::new();
    if merchants.len() < 2 {
        return Ok(out);
    }
    for (id, role) in merchants {
        let name = crate::domain::account::get_merchant(&*deps.store, &id)
            .await?
            .map_or_else(|| id.to_string(), |m| m.name);
        out.push((id, name, role));
    }
    Ok(out)
}

/// The people of `merchant_id` whose first merchant is another, as
/// people of this one (their role and state here), oldest first.
pub async fn list_members(
    deps: &Deps,
    merchant_id: &MerchantId,
) -> Result<Vec<DashboardUser>, StoreError> {
    let store = &*deps.store;
    let q = Query::partition(merchant_members(merchant_id))
        .on(Index::Gsi1)
        .limit(MEMBERS_LISTED);
    let memberships: Vec<Membership> = all_of(store, &q).await?;
    let mut out = Vec::with_capacity(memberships.len());
    for m in &memberships {
        if let Some(user) = get_user(store, &m.user_id).await? {
            out.push(as_member(&user, m));
        }
    }
    Ok(out)
}

/// The put of a new membership of `user` in `merchant_id` with `role`
/// (refused by the store where one is already).
pub(super) fn new_membership(
    now: Timestamp,
    user: &DashboardUser,
    merchant_id: &MerchantId,
    role: Role,
) -> Result<TxOp, StoreError> {
    Membership {
        user_id: user.id.clone(),
        merchant_id: merchant_id.clone(),
        role,
        disabled: false,
        created_at: now,
    }
    .put_new()
}

/// Changes `user_id`'s membership of `merchant_id` (not their first
/// merchant): a role, or disabled; `None` when there is none.
pub(super) async fn change_membership(
    store: &dyn Store,
    merchant_id: &MerchantId,
    user_id: &UserId,
    role: Option<Role>,
    disabled: Option<bool>,
    also: Vec<TxOp>,
) -> Result<Option<DashboardUser>, DashboardError> {
    let mut update = Changes::new();
    if let Some(role) = role {
        update = update.set(Membership::ROLE, &role);
    }
    if let Some(disabled) = disabled {
        update = update.set(Membership::DISABLED, &disabled);
    }
    let key = Membership::key(user_id, merchant_id);
    let m: Membership =
        match update_with(store, &key, update.into(), Some(Cond::Exists), also).await {
            Ok(item) => from_item(item)?,
            Err(StoreError::ConditionFailed) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
    Ok(get_user(store, user_id).await?.map(|u| as_member(&u, &m)))
}

/// Removes `user_id` from `merchant_id` with the audit entry of it, in one
/// transaction: only that membership goes (their sessions lose that
/// merchant at their next request); the person, their password and their
/// other merchants stay. Their first merchant is not a membership to
/// remove (an owner there disables them instead).
pub async fn remove_member(
    deps: &Deps,
    merchant_id: &MerchantId,
    user_id: &UserId,
    entry: &AuditEntry,
) -> Result<(), DashboardError> {
    let store = &*deps.store;
    let remove = TxOp::Delete {
        key: Membership::key(user_id, merchant_id),
        cond: Some(Cond::Exists),
    };
    match store.transact(vec![remove, audit_op(entry)?]).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_condition_failure() => {
            let first = get_user(store, user_id)
                .await?
                .is_some_and(|u| u.merchant_id == *merchant_id);
            if first {
                Err(DashboardError::Invalid {
                    field: "do",
                    message: "This is the person's first merchant: disable them instead".into(),
                })
            } else {
                Err(DashboardError::UnknownUser)
            }
        }
        Err(e) => Err(e.into()),
    }
}
