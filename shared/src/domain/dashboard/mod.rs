//! The merchant dashboard's people and sign-in: users of a merchant with a
//! role, their argon2id passwords, cookie sessions with an idle and an
//! absolute expiry, sign-in throttling, and the audit log of what each
//! person did. The pages themselves are `functions/dashboard`.

use rand::Rng;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use super::record::{Entry, Record};
use crate::ids::{MerchantId, UserId};
use crate::keys;
use crate::refusal::{Kind, Refusal};
use crate::store::{Key, StoreError};
use crate::time::Timestamp;

mod audit;
mod devices;
mod forms;
mod invitations;
mod members;
#[cfg(test)]
mod members_tests;
pub mod operator;
mod roles;
mod sessions;
#[cfg(test)]
mod signin_tests;
#[cfg(test)]
mod tests;
mod timeline;
mod users;

pub use audit::{
    AUDIT_PAGE, Actor, AuditEntry, audit_entry, audit_op, list_audit, record_audit, user_entry,
};
pub use devices::{
    ATTEMPTS_PER_DEVICE, DEVICE_LIFETIME, FailedSignIns, KnownDevice, device_key, failures_key,
    network_of,
};
pub use forms::{FormClaim, claim_form, complete_form, form_fence, new_form_nonce};
pub use invitations::{
    AcceptError, INVITATION_TTL, Invitation, InvitationState, JOIN_ATTEMPTS_PER_ADDRESS, accept,
    accept_with_account, accept_with_password, invitation_hash_ok, invite, join_attempt,
    open_invitation, pending_invitations, revoke_invitation,
};
pub use members::{
    Membership, list_members, member_merchants, member_view, remove_member, switchable_merchants,
};
pub use roles::{Action, allows};
pub use sessions::{
    ABSOLUTE, ATTEMPT_WINDOW, ATTEMPTS_PER_ACCOUNT_AND_ADDRESS, DashboardSession, SessionEnd,
    SignInRequest, SignedIn, clear_notice, new_form_token, open_session, same_token, sign_in,
    sign_in_with, sign_out, sign_out_audited, sign_out_everywhere, switch_merchant, switch_view,
};
pub use timeline::{BillingRow, billing_timeline, payment_timeline};
pub use users::{
    EmailClaim, UserChange, change_user, check_password, create_user, end_all_sessions,
    find_user_by_email, list_users, normalize_email, reset_password, reset_password_of,
    set_disabled, verify_password,
};

/// What a person may do in the dashboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, people and the audit log included.
    Owner,
    /// Everything but people and the audit log, and in live mode neither
    /// provider credentials nor secret keys.
    Developer,
    /// Reads payments, refunds, links, invoices and the overview; changes
    /// nothing and sees no keys, credentials or webhook endpoints. What
    /// each role may do is [`allows`]'s table.
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Developer => "developer",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        [Role::Owner, Role::Developer, Role::Viewer]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// A person who signs in to a merchant's dashboard. The password is kept
/// only as an argon2id PHC string. `merchant_id` and `role` as stored are
/// the person's first merchant and their role there; further merchants
/// are [`Membership`]s. A signed-in request's user is the person as a
/// member of the session's merchant ([`member_view`]): there these two
/// fields are that membership's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DashboardUser {
    pub id: UserId,
    pub merchant_id: MerchantId,
    /// Lowercased.
    pub email: String,
    pub role: Role,
    pub password_hash: String,
    #[serde(default)]
    pub disabled: bool,
    /// Sessions carry the epoch they began in; raising it ends them all
    /// ("sign out everywhere", a password reset, disabling).
    #[serde(default)]
    pub session_epoch: i64,
    pub created_at: Timestamp,
}

crate::attrs! { DashboardUser {
    ID: UserId = id,
    MERCHANT_ID: MerchantId = merchant_id,
    EMAIL: String = email,
    ROLE: Role = role,
    PASSWORD_HASH: String = password_hash,
    DISABLED: bool = disabled,
    SESSION_EPOCH: i64 = session_epoch,
    CREATED_AT: Timestamp = created_at,
} }

impl DashboardUser {
    pub fn key(id: &UserId) -> Key {
        keys::dashboard_user(id)
    }
}

impl Record for DashboardUser {
    fn item_key(&self) -> Key {
        DashboardUser::key(&self.id)
    }

    /// Listed among its merchant's people, oldest first.
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            keys::merchant_users(&self.merchant_id),
            format!("{}#{}", self.created_at.to_rfc3339(), self.id),
        )]
    }
}

/// `n` random letters and digits.
fn random_alnum(n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Constant-time equality of two strings.
fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// Why a person could not sign in or act.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("wrong email or password")]
    WrongCredentials,
    #[error("too many sign-in attempts")]
    Throttled { retry_after: i64 },
    #[error("this user is disabled")]
    Disabled,
    #[error("the merchant has no project")]
    NoProject,
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("a user with this email exists")]
    EmailTaken,
    #[error("no such user")]
    UnknownUser,
    #[error("no such merchant")]
    UnknownMerchant,
    #[error("not a person of this merchant")]
    NotMember,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The dashboard shows these as pages, never in the API's envelope, so
/// they take the API's general codes (`tests/e2e/openapi.rs` keeps the
/// list of codes to what the API answers).
impl From<DashboardError> for Refusal {
    fn from(e: DashboardError) -> Self {
        match e {
            DashboardError::WrongCredentials => Refusal::new(
                Kind::Unauthenticated,
                "permission_denied",
                "Wrong email or password",
            ),
            DashboardError::Throttled { retry_after } => Refusal::new(
                Kind::RateLimited,
                "rate_limited",
                format!("Too many sign-in attempts; try again in {retry_after} s"),
            )
            .retry_after(u64::try_from(retry_after).unwrap_or(1)),
            DashboardError::Disabled => Refusal::forbidden(
                "permission_denied",
                "This user is disabled; ask the account's owner",
            ),
            DashboardError::NoProject => Refusal::forbidden(
                "permission_denied",
                "This merchant has no project yet; ask Dhukuti's operators",
            ),
            DashboardError::Invalid { field, message } => Refusal::invalid(field, message),
            DashboardError::EmailTaken => {
                Refusal::conflict("state_conflict", "A user with this email exists").at("email")
            }
            DashboardError::UnknownUser => {
                Refusal::new(Kind::NotFound, "not_found", "No such user")
            }
            DashboardError::UnknownMerchant => {
                Refusal::new(Kind::NotFound, "not_found", "No such merchant")
            }
            DashboardError::NotMember => Refusal::forbidden(
                "permission_denied",
                "You are not a person of this merchant's dashboard",
            ),
            DashboardError::Store(e) => e.into(),
        }
    }
}
