//! Invitations: how a person joins a merchant's dashboard. An owner
//! invites an email with a role; the answer is a single-use link that
//! expires after [`INVITATION_TTL`], shown once to the owner (on AWS it
//! would also go by email once an email channel exists; none does yet).
//! The link's token is stored only as its SHA-256, which is the item's
//! key, so a token is looked up (and compared) by its hash. The address
//! becomes the person's only when they open the link and set a password:
//! the user, the claim of the email and the invitation's acceptance are
//! one transaction, conditional on the invitation still being pending and
//! unexpired, so of two concurrent accepts exactly one wins. An address
//! with an account already (at another merchant) accepts by signing in
//! with its password instead: the membership of this merchant
//! (`members.rs`) and the acceptance are one transaction alike.
//!
//! Inviting reads nothing about the address: its answer is the same
//! whether or not the address has an account anywhere.

use serde::{Deserialize, Serialize};

use super::audit::{AuditEntry, audit_op};
use super::members::new_membership;
use super::sessions::{SignInRequest, check_credentials};
use super::users::{check_password, find_user_by_email, new_user, normalize_email};
use super::{DashboardError, DashboardUser, Role, random_alnum};
use crate::app::Deps;
use crate::domain::record::{Changes, Entry, Record, all_of, get};
use crate::ids::{AuditId, MerchantId, ProjectId, UserId};
use crate::keys;
use crate::store::{Cond, Index, Key, Query, StoreError, update_with};
use crate::time::Timestamp;

/// How long an invitation's link works.
pub const INVITATION_TTL: chrono::Duration = chrono::Duration::days(7);
/// The pending invitations an owner's page lists at most.
pub const INVITATIONS_LISTED: usize = 100;
const TOKEN_PREFIX: &str = "di_";
const TOKEN_RANDOM: usize = 43;

/// Where an invitation stands (an expired one is still `Pending` stored,
/// and unusable: [`Invitation::usable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvitationState {
    Pending,
    Accepted,
    Revoked,
}

/// An invitation of `email` to `merchant_id` with `role`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invitation {
    /// The SHA-256 (hex) of the link's token; the item's key.
    pub hash: String,
    pub merchant_id: MerchantId,
    /// Lowercased.
    pub email: String,
    pub role: Role,
    pub invited_by: UserId,
    pub state: InvitationState,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_by: Option<UserId>,
}

crate::attrs! { Invitation {
    HASH: String = hash,
    MERCHANT_ID: MerchantId = merchant_id,
    EMAIL: String = email,
    ROLE: Role = role,
    INVITED_BY: UserId = invited_by,
    STATE: InvitationState = state,
    CREATED_AT: Timestamp = created_at,
    EXPIRES_AT: Timestamp = expires_at,
    ACCEPTED_BY: Option<UserId> = accepted_by,
} }

impl Invitation {
    pub fn key(hash: &str) -> Key {
        keys::dashboard_invitation(hash)
    }

    /// Whether its link still works at `now`.
    pub fn usable(&self, now: Timestamp) -> bool {
        self.state == InvitationState::Pending && now < self.expires_at
    }

    /// The condition under which it may still be accepted or revoked.
    fn still_usable(now: Timestamp) -> Cond {
        Cond::And(vec![
            Cond::Exists,
            Invitation::STATE.eq(&InvitationState::Pending),
            Invitation::EXPIRES_AT.gt(&now),
        ])
    }
}

impl Record for Invitation {
    fn item_key(&self) -> Key {
        Invitation::key(&self.hash)
    }

    /// Listed among its merchant's invitations, oldest first.
    fn entries(&self) -> Vec<Entry> {
        vec![Entry::gsi1(
            keys::merchant_invitations(&self.merchant_id),
            format!("{}#{}", self.created_at.to_rfc3339(), self.hash),
        )]
    }
}

/// The hash a token is stored and looked up by.
fn token_hash(token: &str) -> String {
    super::super::account::hash_secret(token)
}

/// Whether `token` is shaped like one of ours (anything else is looked
/// up nowhere).
fn well_formed(token: &str) -> bool {
    token.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == TOKEN_RANDOM && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// Whether `hash` is shaped like an invitation's (what a revoke form
/// names).
pub fn invitation_hash_ok(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Invites `email` to `merchant_id` with `role`; answers the link's token
/// (shown once, never stored) and the invitation. Reads nothing about the
/// address, so it answers alike whether or not it has an account.
pub async fn invite(
    deps: &Deps,
    now: Timestamp,
    merchant_id: &MerchantId,
    invited_by: &UserId,
    email: &str,
    role: Role,
    audit: Option<&AuditEntry>,
) -> Result<(String, Invitation), DashboardError> {
    let email = normalize_email(email)?;
    let token = format!("{TOKEN_PREFIX}{}", random_alnum(TOKEN_RANDOM));
    let invitation = Invitation {
        hash: token_hash(&token),
        merchant_id: merchant_id.clone(),
        email,
        role,
        invited_by: invited_by.clone(),
        state: InvitationState::Pending,
        created_at: now,
        expires_at: now.plus(INVITATION_TTL),
        accepted_by: None,
    };
    let mut ops = vec![invitation.put_new()?];
    if let Some(entry) = audit {
        ops.push(audit_op(entry)?);
    }
    deps.store.transact(ops).await?;
    Ok((token, invitation))
}

/// The usable invitation `token` opens at `now`; `None` for a token that
/// is malformed, unknown, used, revoked or expired alike.
pub async fn open_invitation(
    deps: &Deps,
    now: Timestamp,
    token: &str,
) -> Result<Option<Invitation>, StoreError> {
    if !well_formed(token) {
        return Ok(None);
    }
    let found: Option<Invitation> = get(&*deps.store, &Invitation::key(&token_hash(token))).await?;
    Ok(found.filter(|i| i.usable(now)))
}

/// Why an invitation could not be accepted.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// Malformed, unknown, used, revoked or expired: one answer for all.
    #[error("this invitation cannot be used")]
    Unusable,
    /// The address got an account while this accept ran: try again.
    #[error("this address has an account: sign in to accept")]
    HasAccount,
    /// The person is of this merchant already.
    #[error("this person is of this merchant already")]
    AlreadyMember,
    #[error(transparent)]
    Dashboard(#[from] DashboardError),
}

impl From<StoreError> for AcceptError {
    fn from(e: StoreError) -> Self {
        AcceptError::Dashboard(DashboardError::Store(e))
    }
}

/// Accepts invitation `token` for an address with no account yet: the
/// person, with `password`, the claim of their email and the invitation's
/// acceptance, in one transaction that only a pending, unexpired
/// invitation lets through (a second accept, concurrent or later, finds
/// it [`AcceptError::Unusable`]).
pub async fn accept_with_password(
    deps: &Deps,
    now: Timestamp,
    token: &str,
    password: &str,
    from: &str,
) -> Result<DashboardUser, AcceptError> {
    let invitation = open_invitation(deps, now, token)
        .await?
        .ok_or(AcceptError::Unusable)?;
    let (user, mut ops) = new_user(
        now,
        &invitation.merchant_id,
        &invitation.email,
        invitation.role,
        password,
    )
    .await?;
    let accepted = Changes::new()
        .set(Invitation::STATE, &InvitationState::Accepted)
        .set_some(Invitation::ACCEPTED_BY, &user.id);
    ops.push(crate::store::TxOp::Update {
        key: invitation.item_key(),
        update: accepted.into(),
        cond: Some(Invitation::still_usable(now)),
    });
    // The joining is audited in its own transaction: no entry, no person.
    ops.push(audit_op(&joined(&user, &invitation, now, from))?);
    match deps.store.transact(ops).await {
        Ok(()) => Ok(user),
        Err(e) if e.is_condition_failure() => {
            // The invitation went first, or the address has an account.
            match open_invitation(deps, now, token).await? {
                Some(_) => Err(AcceptError::HasAccount),
                None => Err(AcceptError::Unusable),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The audit entry of `user` joining `invitation`'s merchant from `from`
/// (no session yet: no project).
fn joined(user: &DashboardUser, invitation: &Invitation, now: Timestamp, from: &str) -> AuditEntry {
    AuditEntry {
        id: AuditId::new(),
        merchant_id: invitation.merchant_id.clone(),
        user_id: user.id.clone(),
        email: user.email.clone(),
        action: "person.join".to_owned(),
        target: user.id.to_string(),
        project_id: ProjectId::default(),
        mode: None,
        detail: format!("as {}", invitation.role.as_str()),
        address: from.to_owned(),
        at: now,
    }
}

/// Accepts invitation `token` with `password`: for an address with an
/// account, that account's password (signing in:
/// [`accept_with_account`]); for one without, the new account's
/// ([`accept_with_password`]). A password too short for any account is
/// refused alike for both before anything else.
pub async fn accept(
    deps: &Deps,
    now: Timestamp,
    token: &str,
    password: &str,
    from: &str,
) -> Result<DashboardUser, AcceptError> {
    let invitation = open_invitation(deps, now, token)
        .await?
        .ok_or(AcceptError::Unusable)?;
    check_password(password)?;
    match find_user_by_email(&*deps.store, &invitation.email).await? {
        Some(_) => accept_with_account(deps, now, token, password, from).await,
        None => accept_with_password(deps, now, token, password, from).await,
    }
}

/// Accepts invitation `token` for the address's existing account by
/// signing in with its `password` (the sign-in's throttle and failure
/// count: a link is no way round them): the membership of the
/// invitation's merchant, the invitation's acceptance and the audit entry
/// in one transaction that only a pending, unexpired invitation and no
/// membership there yet let through (of two concurrent accepts exactly
/// one wins). Answers the person as a member of the new merchant.
pub async fn accept_with_account(
    deps: &Deps,
    now: Timestamp,
    token: &str,
    password: &str,
    from: &str,
) -> Result<DashboardUser, AcceptError> {
    let invitation = open_invitation(deps, now, token)
        .await?
        .ok_or(AcceptError::Unusable)?;
    let req = SignInRequest {
        email: &invitation.email,
        password,
        address: from,
        device: None,
    };
    let (user, _) = check_credentials(deps, now, &req).await?;
    if user.disabled {
        return Err(DashboardError::Disabled.into());
    }
    if user.merchant_id == invitation.merchant_id {
        return Err(AcceptError::AlreadyMember);
    }
    let accepted = Changes::new()
        .set(Invitation::STATE, &InvitationState::Accepted)
        .set_some(Invitation::ACCEPTED_BY, &user.id);
    let ops = vec![
        new_membership(now, &user, &invitation.merchant_id, invitation.role)?,
        crate::store::TxOp::Update {
            key: invitation.item_key(),
            update: accepted.into(),
            cond: Some(Invitation::still_usable(now)),
        },
        audit_op(&joined(&user, &invitation, now, from))?,
    ];
    match deps.store.transact(ops).await {
        Ok(()) => Ok(DashboardUser {
            merchant_id: invitation.merchant_id,
            role: invitation.role,
            ..user
        }),
        Err(e) if e.is_condition_failure() => match open_invitation(deps, now, token).await? {
            Some(_) => Err(AcceptError::AlreadyMember),
            None => Err(AcceptError::Unusable),
        },
        Err(e) => Err(e.into()),
    }
}

/// Revokes `merchant_id`'s pending invitation `hash`; another merchant's,
/// a used or an unknown one is [`DashboardError::UnknownUser`]-like
/// `Ok(false)`.
pub async fn revoke_invitation(
    deps: &Deps,
    now: Timestamp,
    merchant_id: &MerchantId,
    hash: &str,
    audit: Option<&AuditEntry>,
) -> Result<bool, StoreError> {
    if !invitation_hash_ok(hash) {
        return Ok(false);
    }
    let cond = Cond::And(vec![
        Invitation::still_usable(now),
        Invitation::MERCHANT_ID.eq(merchant_id),
    ]);
    let revoked = Changes::new().set(Invitation::STATE, &InvitationState::Revoked);
    let also = match audit {
        Some(entry) => vec![audit_op(entry)?],
        None => Vec::new(),
    };
    match update_with(
        &*deps.store,
        &Invitation::key(hash),
        revoked.into(),
        Some(cond),
        also,
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `merchant_id`'s invitations still usable at `now`, oldest first.
pub async fn pending_invitations(
    deps: &Deps,
    now: Timestamp,
    merchant_id: &MerchantId,
) -> Result<Vec<Invitation>, StoreError> {
    let q = Query::partition(keys::merchant_invitations(merchant_id))
        .on(Index::Gsi1)
        .limit(INVITATIONS_LISTED);
    let all: Vec<Invitation> = all_of(&*deps.store, &q).await?;
    Ok(all.into_iter().filter(|i| i.usable(now)).collect())
}

/// Requests to invitation links per client address (its /64 for IPv6)
/// per [`super::ATTEMPT_WINDOW`]: the links are keyless, so a guesser is
/// bounded as on the sign-in form (whose throttle this reuses).
pub const JOIN_ATTEMPTS_PER_ADDRESS: i64 = 30;

/// Takes a slot of `address`'s budget for invitation links; `Err` holds
/// the seconds to wait.
pub async fn join_attempt(
    deps: &Deps,
    now: Timestamp,
    address: &str,
) -> Result<Result<(), i64>, StoreError> {
    let bucket = format!("DJOIN#{}", crate::limits::public::address_bucket(address));
    let taken = crate::limits::public::take_slot(
        &*deps.store,
        &bucket,
        JOIN_ATTEMPTS_PER_ADDRESS,
        super::ATTEMPT_WINDOW,
        now,
    )
    .await?;
    Ok(taken.map(|_| ()))
}
