//! People: creating a user, resetting a password, disabling, listing; the
//! password rule and its argon2id hash.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{AuditEntry, DashboardError, DashboardUser, Role};
use crate::app::Deps;
use crate::domain::record::{Changes, Record, from_item};
use crate::ids::{MerchantId, UserId};
use crate::keys;
use crate::store::{Cond, Index, Key, Query, Store, StoreError, TxOp, update_with};
use crate::time::Timestamp;

/// The claim of an email by the one user who signs in with it: written
/// with the user, in one transaction, where none is yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmailClaim {
    /// The email claimed (lowercased): not stored, the item's key holds
    /// it.
    #[serde(skip)]
    pub email: String,
    pub user_id: UserId,
}

crate::attrs! { EmailClaim {
    USER_ID: UserId = user_id,
} }

impl EmailClaim {
    pub fn key(email: &str) -> Key {
        keys::dashboard_email(email)
    }
}

impl Record for EmailClaim {
    fn item_key(&self) -> Key {
        EmailClaim::key(&self.email)
    }
}

/// Shortest password accepted (NIST SP 800-63B asks for at least 8; a
/// dashboard that issues refunds asks for more).
const PASSWORD_MIN_CHARS: usize = 12;
/// Longest password accepted, in bytes: hashing cost must not grow with
/// what a stranger posts.
pub(super) const PASSWORD_MAX_BYTES: usize = 256;
/// Longest email accepted.
const EMAIL_MAX: usize = 254;

/// argon2id with OWASP's first recommended setting (19 MiB, 2 passes, 1
/// lane): about 20 ms on a Lambda core.
fn hasher() -> Argon2<'static> {
    let params = Params::new(19 * 1024, 2, 1, None).unwrap_or_default();
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Checks a new password against the rule.
pub fn check_password(password: &str) -> Result<(), DashboardError> {
    let invalid = |message: String| DashboardError::Invalid {
        field: "password",
        message,
    };
    if password.chars().count() < PASSWORD_MIN_CHARS {
        return Err(invalid(format!(
            "A password needs at least {PASSWORD_MIN_CHARS} characters"
        )));
    }
    if password.len() > PASSWORD_MAX_BYTES {
        return Err(invalid(format!(
            "A password may have at most {PASSWORD_MAX_BYTES} bytes"
        )));
    }
    Ok(())
}

/// The lowercased email, if it is shaped like one.
pub fn normalize_email(email: &str) -> Result<String, DashboardError> {
    let email = email.trim().to_lowercase();
    let ok = email.len() <= EMAIL_MAX
        && crate::fields::Email::parse(email.clone()).is_ok()
        && !email.contains('#');
    if ok {
        Ok(email)
    } else {
        Err(DashboardError::Invalid {
            field: "email",
            message: "Enter an email address like name@example.com".into(),
        })
    }
}

/// The argon2id PHC string of `password` (CPU work: off the async
/// threads).
async fn hash_password(password: &str) -> Result<String, DashboardError> {
    check_password(password)?;
    let password = password.to_owned();
    let salt: [u8; 16] = rand::rng().random();
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
        hasher()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| StoreError::Backend(format!("password hashing stopped: {e}")))?
    .map_err(|e| DashboardError::Store(StoreError::Backend(format!("password hashing: {e}"))))
}

/// Whether `password` matches the PHC string `hash` (off the async
/// threads). A hash that does not parse matches nothing.
pub async fn verify_password(password: &str, hash: &str) -> bool {
    if password.len() > PASSWORD_MAX_BYTES {
        return false;
    }
    let (password, hash) = (password.to_owned(), hash.to_owned());
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash)
            .map(|parsed| {
                hasher()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// A hash to verify against when the email is unknown, so that an unknown
/// email takes as long as a wrong password.
pub(super) async fn decoy_hash() -> &'static str {
    static DECOY: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    DECOY
        .get_or_init(|| async {
            hash_password("decoy password, never anyone's")
                .await
                .unwrap_or_default()
        })
        .await
}

/// Creates a user of `merchant_id`. The email is one user's only.
pub async fn create_user(
    deps: &Deps,
    now: Timestamp,
    merchant_id: &MerchantId,
    email: &str,
    role: Role,
    password: &str,
) -> Result<DashboardUser, DashboardError> {
    let store = &*deps.store;
    let email = normalize_email(email)?;
    if super::super::account::get_merchant(store, merchant_id)
        .await?
        .is_none()
    {
        return Err(DashboardError::UnknownMerchant);
    }
    let (user, ops) = new_user(now, merchant_id, &email, role, password).await?;
    match store.transact(ops).await {
        Ok(()) => Ok(user),
        Err(e) if e.is_condition_failure() => Err(DashboardError::EmailTaken),
        Err(e) => Err(e.into()),
    }
}

/// A new user of `merchant_id` and the writes that store it with the
/// claim of its (normalized) email, where neither is yet.
pub(super) async fn new_user(
    now: Timestamp,
    merchant_id: &MerchantId,
    email: &str,
    role: Role,
    password: &str,
) -> Result<(DashboardUser, Vec<TxOp>), DashboardError> {
    let user = DashboardUser {
        id: UserId::new(),
        merchant_id: merchant_id.clone(),
        email: email.to_owned(),
        role,
        password_hash: hash_password(password).await?,
        disabled: false,
        session_epoch: 0,
        created_at: now,
    };
    let claim = EmailClaim {
        email: email.to_owned(),
        user_id: user.id.clone(),
    };
    let ops = vec![claim.put_new()?, user.put_new()?];
    Ok((user, ops))
}

/// The user with this id.
pub(super) async fn get_user(
    store: &dyn Store,
    id: &UserId,
) -> Result<Option<DashboardUser>, StoreError> {
    crate::domain::record::get(store, &DashboardUser::key(id)).await
}

/// The user who signs in with `email` (two reads: the claim, the user).
pub async fn find_user_by_email(
    store: &dyn Store,
    email: &str,
) -> Result<Option<DashboardUser>, DashboardError> {
    let email = normalize_email(email)?;
    let claim: Option<EmailClaim> =
        crate::domain::record::get(store, &EmailClaim::key(&email)).await?;
    let Some(claim) = claim else {
        // As many reads as a known email, so timing tells nobody which
        // emails sign in here.
        let _ = get_user(store, &UserId::stored("usr_00000000000000000000000000")).await;
        return Ok(None);
    };
    Ok(get_user(store, &claim.user_id)
        .await?
        .filter(|u| u.email == email))
}

/// Sets a new password and ends every session of the user.
pub async fn reset_password(
    store: &dyn Store,
    email: &str,
    password: &str,
) -> Result<DashboardUser, DashboardError> {
    let user = find_user_by_email(store, email)
        .await?
        .ok_or(DashboardError::UnknownUser)?;
    let hash = hash_password(password).await?;
    let update = Changes::new()
        .set(DashboardUser::PASSWORD_HASH, hash.as_str())
        .add(DashboardUser::SESSION_EPOCH, 1);
    let item = store
        .update(&user.item_key(), update.into(), Some(Cond::Exists))
        .await?;
    Ok(from_item(item)?)
}

/// Disables (or enables again) a user; disabling ends every session.
pub async fn set_disabled(
    store: &dyn Store,
    email: &str,
    disabled: bool,
) -> Result<DashboardUser, DashboardError> {
    let user = find_user_by_email(store, email)
        .await?
        .ok_or(DashboardError::UnknownUser)?;
    let mut update = Changes::new().set(DashboardUser::DISABLED, &disabled);
    if disabled {
        update = update.add(DashboardUser::SESSION_EPOCH, 1);
    }
    let item = store
        .update(&user.item_key(), update.into(), Some(Cond::Exists))
        .await?;
    Ok(from_item(item)?)
}

/// Ends every session of `user_id` (sign out everywhere).
pub async fn end_all_sessions(deps: &Deps, user_id: &UserId) -> Result<(), StoreError> {
    let store = &*deps.store;
    store
        .update(
            &DashboardUser::key(user_id),
            Changes::new().add(DashboardUser::SESSION_EPOCH, 1).into(),
            Some(Cond::Exists),
        )
        .await
        .map(|_| ())
}

/// A merchant's users, oldest first (at most 100).
pub async fn list_users(
    deps: &Deps,
    merchant_id: &MerchantId,
) -> Result<Vec<DashboardUser>, StoreError> {
    let store = &*deps.store;
    let q = Query::partition(keys::merchant_users(merchant_id))
        .on(Index::Gsi1)
        .limit(100);
    super::super::record::all_of(store, &q).await
}

/// What an owner may change about a person of their merchant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserChange {
    Role(Role),
    /// Disabling also ends every session.
    Disabled(bool),
}

/// Changes `user_id` of `merchant_id`: the user where it is their first
/// merchant, else their membership of it (disabling a membership ends
/// access to this merchant only); a person not of this merchant is
/// [`DashboardError::UnknownUser`].
pub async fn change_user(
    deps: &Deps,
    merchant_id: &MerchantId,
    user_id: &UserId,
    change: UserChange,
    audit: impl FnOnce(&DashboardUser) -> Option<AuditEntry>,
) -> Result<DashboardUser, DashboardError> {
    let store = &*deps.store;
    // The person as they are, for the entry's words (their address); the
    // write below still decides whether they are of this merchant.
    let before = get_user(store, user_id)
        .await?
        .ok_or(DashboardError::UnknownUser)?;
    let also = match audit(&before) {
        Some(entry) => vec![super::audit_op(&entry)?],
        None => Vec::new(),
    };
    let update = match change {
        UserChange::Role(role) => Changes::new().set(DashboardUser::ROLE, &role),
        UserChange::Disabled(true) => Changes::new()
            .set(DashboardUser::DISABLED, &true)
            .add(DashboardUser::SESSION_EPOCH, 1),
        UserChange::Disabled(false) => Changes::new().set(DashboardUser::DISABLED, &false),
    };
    let ours = Cond::And(vec![
        Cond::Exists,
        DashboardUser::MERCHANT_ID.eq(merchant_id),
    ]);
    match update_with(
        store,
        &DashboardUser::key(user_id),
        update.into(),
        Some(ours),
        also.clone(),
    )
    .await
    {
        Ok(item) => Ok(from_item(item)?),
        Err(StoreError::ConditionFailed) => {
            // Not their first merchant: their membership of this one.
            let (role, disabled) = match change {
                UserChange::Role(role) => (Some(role), None),
                UserChange::Disabled(d) => (None, Some(d)),
            };
            super::members::change_membership(store, merchant_id, user_id, role, disabled, also)
                .await?
                .ok_or(DashboardError::UnknownUser)
        }
        Err(e) => Err(e.into()),
    }
}

/// An owner gives `user_id` of `merchant_id` a new password (ending their
/// sessions); another merchant's user is [`DashboardError::UnknownUser`],
/// and so is a member whose first merchant is another: the password opens
/// every merchant of theirs, so only their first merchant's owner sets it.
pub async fn reset_password_of(
    deps: &Deps,
    merchant_id: &MerchantId,
    user_id: &UserId,
    password: &str,
) -> Result<DashboardUser, DashboardError> {
    let store = &*deps.store;
    let user = get_user(store, user_id)
        .await?
        .filter(|u| u.merchant_id == *merchant_id)
        .ok_or(DashboardError::UnknownUser)?;
    reset_password(store, &user.email, password).await
}
