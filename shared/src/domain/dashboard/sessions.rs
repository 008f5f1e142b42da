//! Sign-in and sessions: the throttle before any password is checked, the
//! session a cookie names (stored by its hash), its idle and absolute
//! expiry, its CSRF token, the project and mode it looks at, sign-out.

use serde::{Deserialize, Serialize};

use super::devices::{ATTEMPTS_PER_DEVICE, FailedSignIns};
use super::members::{Membership, member_view};
use super::users::{decoy_hash, find_user_by_email, get_user, normalize_email, verify_password};
use super::{DashboardError, DashboardUser, audit, devices, random_alnum, same};
use crate::app::Deps;
use crate::domain::Mode;
use crate::domain::record::{Changes, Record};
use crate::ids::{MerchantId, ProjectId, UserId};
use crate::keys;
use crate::limits::public;
use crate::store::{Cond, Key, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// Random characters of a session cookie after its prefix.
const TOKEN_RANDOM: usize = 43;
const TOKEN_PREFIX: &str = "ds_";
/// A session ends after this long without a request.
pub(super) const IDLE: chrono::Duration = chrono::Duration::minutes(30);
/// A session ends this long after sign-in, however busy.
pub const ABSOLUTE: chrono::Duration = chrono::Duration::hours(12);
/// `last_seen_at` is written at most this often per session.
const TOUCH_EVERY: chrono::Duration = chrono::Duration::seconds(60);

/// Sign-in attempts per email from one client address per window
/// (successful ones give their slot back): a guesser gets 10 guesses per
/// 15 minutes per account from each address, and a stranger at another
/// address cannot lock the owner out.
pub const ATTEMPTS_PER_ACCOUNT_AND_ADDRESS: i64 = 10;
/// Failed sign-in attempts per email from all addresses per window: a
/// botnet spreading guesses over many addresses is held too (and can lock
/// the account for the rest of a window: the price of that).
pub(super) const ATTEMPTS_PER_ACCOUNT: i64 = 100;
/// Failed sign-in attempts per client address per window, all accounts.
pub(super) const ATTEMPTS_PER_ADDRESS: i64 = 30;
/// The throttle's window, seconds.
pub const ATTEMPT_WINDOW: i64 = 15 * 60;

/// A signed-in browser. Stored under the SHA-256 of its cookie.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DashboardSession {
    pub user_id: UserId,
    pub merchant_id: MerchantId,
    /// The user's `session_epoch` at sign-in.
    pub epoch: i64,
    /// The token every form carries back.
    pub csrf: String,
    /// The project and mode the pages show.
    pub project_id: ProjectId,
    pub mode: Mode,
    pub created_at: Timestamp,
    pub last_seen_at: Timestamp,
    pub expires_at: Timestamp,
    /// The address it signed in from (for the audit log).
    pub address: String,
    /// Shown once, on the first page after sign-in: the failed sign-ins
    /// since the user's last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// When the store may drop it (epoch seconds): an hour after its
    /// absolute expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<i64>,
    /// The SHA-256 of its cookie: not stored, the item's key holds it.
    #[serde(skip)]
    token_hash: String,
}

crate::attrs! { DashboardSession {
    USER_ID: UserId = user_id,
    MERCHANT_ID: MerchantId = merchant_id,
    EPOCH: i64 = epoch,
    CSRF: String = csrf,
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    CREATED_AT: Timestamp = created_at,
    LAST_SEEN_AT: Timestamp = last_seen_at,
    EXPIRES_AT: Timestamp = expires_at,
    ADDRESS: String = address,
    NOTICE: Option<String> = notice,
    TTL: Option<i64> = ttl,
} }

impl Record for DashboardSession {
    fn item_key(&self) -> Key {
        keys::dashboard_session(&self.token_hash)
    }
}

impl DashboardSession {
    /// When it ends if no request comes.
    pub fn idle_until(&self) -> Timestamp {
        let idle = self.last_seen_at.plus(IDLE);
        if idle < self.expires_at {
            idle
        } else {
            self.expires_at
        }
    }

    /// Whether `token` is this session's CSRF token.
    pub fn csrf_ok(&self, token: &str) -> bool {
        !token.is_empty() && same(&self.csrf, token)
    }
}

/// A session just opened: the cookie (shown to this browser once) and
/// what is stored.
#[derive(Clone, Debug)]
pub struct SignedIn {
    pub cookie: String,
    pub session: DashboardSession,
    pub user: DashboardUser,
    /// A new known-device cookie for this browser (none when it already
    /// carried a valid one).
    pub device: Option<String>,
    /// The failed sign-ins since the last one, shown once.
    pub failures: Option<FailedSignIns>,
}

/// Why a cookie opens no session.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// No such session, or not shaped like a cookie of ours.
    Unknown,
    /// Idle or absolute expiry passed.
    Expired,
    /// Signed out everywhere, password reset, or user disabled.
    Revoked,
}

fn token_hash(cookie: &str) -> String {
    super::super::account::hash_secret(cookie)
}

fn session_key(cookie: &str) -> Key {
    keys::dashboard_session(&token_hash(cookie))
}

fn well_formed(cookie: &str) -> bool {
    cookie.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        rest.len() == TOKEN_RANDOM && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// What a sign-in form sent, and from where.
#[derive(Clone, Copy, Debug)]
pub struct SignInRequest<'a> {
    pub email: &'a str,
    pub password: &'a str,
    /// The client's address.
    pub address: &'a str,
    /// The browser's known-device cookie, if it sent one.
    pub device: Option<&'a str>,
}

/// Signs a person in from `address` with no known-device cookie: see
/// [`sign_in_with`].
pub async fn sign_in(
    deps: &Deps,
    now: Timestamp,
    email: &str,
    password: &str,
    address: &str,
) -> Result<SignedIn, DashboardError> {
    let req = SignInRequest {
        email,
        password,
        address,
        device: None,
    };
    sign_in_with(deps, now, &req).await
}

/// Signs a person in: the throttle first (a known device of this email on
/// its own budget; any other browser per email and address, per address,
/// then per email), then the password (argon2id, an unknown email checked
/// against a decoy so it takes as long), then a new session on the
/// merchant's first project in sandbox, written with its audit entry and
/// this browser's known-device record in one transaction. A failure for a
/// known email is counted for the owner's notice and audited; the attempt
/// that fills the per-email bucket is audited as a throttle with the
/// networks the failures came from.
pub async fn sign_in_with(
    deps: &Deps,
    now: Timestamp,
    req: &SignInRequest<'_>,
) -> Result<SignedIn, DashboardError> {
    let (user, known) = check_credentials(deps, now, req).await?;
    if user.disabled {
        return Err(DashboardError::Disabled);
    }
    open_signed_in(deps, now, user, req.address, known).await
}

/// The throttle and the password of a sign-in (or of accepting an
/// invitation with an existing account): the user whose password matched,
/// and whether the browser is a known device of theirs.
pub(super) async fn check_credentials(
    deps: &Deps,
    now: Timestamp,
    req: &SignInRequest<'_>,
) -> Result<(DashboardUser, bool), DashboardError> {
    let store = &*deps.store;
    let email = normalize_email(req.email).map_err(|_| DashboardError::WrongCredentials)?;
    let device = devices::known_device(store, now, req.device, &email).await?;
    let (taken, filled) = match &device {
        Some(d) => take_slots(store, now, &[(d.bucket(), ATTEMPTS_PER_DEVICE)]).await?,
        None => take_slots(store, now, &shared_buckets(&email, req.address)).await?,
    };
    let user = find_user_by_email(store, &email).await?;
    let hash = match &user {
        Some(u) => u.password_hash.as_str(),
        None => decoy_hash().await,
    };
    let matches = verify_password(req.password, hash).await;
    let user = match user {
        Some(u) if matches => u,
        Some(u) => {
            failed(deps, now, &u, req.address, filled).await?;
            return Err(DashboardError::WrongCredentials);
        }
        None => return Err(DashboardError::WrongCredentials),
    };
    for key in &taken {
        public::give_back(store, key).await;
    }
    Ok((user, device.is_some()))
}

/// The buckets a browser that is no known device of the email spends, in
/// order: this address's slots first, then the shared ones, so a refusal
/// for one's own guessing never uses a slot others need.
fn shared_buckets(email: &str, address: &str) -> Vec<(String, i64)> {
    let from = public::address_bucket(address);
    vec![
        (
            format!("DSIGN#{email}#{from}"),
            ATTEMPTS_PER_ACCOUNT_AND_ADDRESS,
        ),
        (format!("DSIGNA#{from}"), ATTEMPTS_PER_ADDRESS),
        (format!("DSIGNE#{email}"), ATTEMPTS_PER_ACCOUNT),
    ]
}

/// Takes a slot in each bucket, or none (a refusal gives back what it
/// took); and whether this attempt took the per-email bucket's last slot.
async fn take_slots(
    store: &dyn Store,
    now: Timestamp,
    buckets: &[(String, i64)],
) -> Result<(Vec<Key>, bool), DashboardError> {
    let mut taken = Vec::new();
    let mut filled = false;
    for (bucket, limit) in buckets {
        match public::take_slot_counted(store, bucket, *limit, ATTEMPT_WINDOW, now).await? {
            Ok((key, count)) => {
                filled |= bucket.starts_with("DSIGNE#") && count >= *limit;
                taken.push(key);
            }
            Err(retry_after) => {
                for key in &taken {
                    public::give_back(store, key).await;
                }
                return Err(DashboardError::Throttled { retry_after });
            }
        }
    }
    Ok((taken, filled))
}

/// A wrong password for `user`: counted for their notice, audited from
/// the network (never the full address of a stranger); and when this
/// attempt filled the per-email bucket, the throttle audited with every
/// network the failures came from.
async fn failed(
    deps: &Deps,
    now: Timestamp,
    user: &DashboardUser,
    address: &str,
    filled: bool,
) -> Result<(), StoreError> {
    let store = &*deps.store;
    let network = devices::network_of(address);
    let failures = devices::note_failure(store, now, &user.id, &network).await?;
    let entry = audit::user_entry(user, now, "sign_in.failed", "", &network);
    audit::record_audit(deps, &entry).await?;
    if filled {
        let detail = format!(
            "{}; sign-in for this email refused for the rest of {} minutes except on known devices",
            failures.describe(),
            ATTEMPT_WINDOW / 60
        );
        let entry = audit::user_entry(user, now, "sign_in.throttled", &detail, &network);
        audit::record_audit(deps, &entry).await?;
    }
    Ok(())
}

/// The session of a user whose password matched: its audit entry, this
/// browser remembered as a known device unless it is one, and the failure
/// notice taken, all in one transaction.
async fn open_signed_in(
    deps: &Deps,
    now: Timestamp,
    user: DashboardUser,
    address: &str,
    known: bool,
) -> Result<SignedIn, DashboardError> {
    let store = &*deps.store;
    let project = super::super::account::merchant_projects(deps, &user.merchant_id)
        .await?
        .into_iter()
        .next()
        .ok_or(DashboardError::NoProject)?;
    let cookie = format!("{TOKEN_PREFIX}{}", random_alnum(TOKEN_RANDOM));
    let expires_at = now.plus(ABSOLUTE);
    let session = DashboardSession {
        user_id: user.id.clone(),
        merchant_id: user.merchant_id.clone(),
        epoch: user.session_epoch,
        csrf: random_alnum(32),
        project_id: project.id,
        mode: Mode::Sandbox,
        created_at: now,
        last_seen_at: now,
        expires_at,
        address: address.chars().take(64).collect(),
        notice: None,
        ttl: Some(expires_at.unix_seconds() + 3600),
        token_hash: token_hash(&cookie),
    };
    let actor = audit::Actor::of(&user, &session, address);
    let entry = audit::audit_entry(&actor, now, "sign_in", &user.id, "");
    let mut ops = vec![audit::audit_op(&entry)?];
    let device = if known {
        None
    } else {
        let (cookie, op) = devices::new_device(now, &user)?;
        ops.push(op);
        Some(cookie)
    };
    let failures = devices::failures_of(store, &user.id).await?;
    let mut session = session;
    session.notice = failures.as_ref().map(|f| {
        format!(
            "Since you last signed in: {}. If that was not you, nothing is needed: \
             this browser signs in on its own budget while the guesses are held.",
            f.describe()
        )
    });
    if failures.is_some() {
        ops.push(TxOp::Delete {
            key: devices::failures_key(&user.id),
            cond: None,
        });
    }
    ops.push(session.put_new()?);
    store.transact(ops).await?;
    Ok(SignedIn {
        cookie,
        session,
        user,
        device,
        failures,
    })
}

/// The session and user a cookie names, if it is still open: the user as
/// a person of the session's merchant (its `merchant_id` and `role` are
/// that membership's, [`member_view`]). Two reads (the session, its
/// user), a third on a merchant not the user's first (the membership),
/// and at most one write a minute to keep it from idling out.
pub async fn open_session(
    deps: &Deps,
    now: Timestamp,
    cookie: &str,
) -> Result<Result<(DashboardSession, DashboardUser), SessionEnd>, StoreError> {
    let store = &*deps.store;
    if !well_formed(cookie) {
        return Ok(Err(SessionEnd::Unknown));
    }
    let key = session_key(cookie);
    let found: Option<DashboardSession> = crate::domain::record::get(store, &key).await?;
    let Some(mut session) = found else {
        return Ok(Err(SessionEnd::Unknown));
    };
    session.token_hash = token_hash(cookie);
    if session.idle_until() <= now {
        let _ = store.delete(&key, None).await;
        return Ok(Err(SessionEnd::Expired));
    }
    let stored = get_user(store, &session.user_id)
        .await?
        .filter(|u| !u.disabled && u.session_epoch == session.epoch);
    // The person as a member of the session's merchant (removed or
    // disabled there: this session is over; their other merchants not).
    let user = match stored {
        Some(u) => member_view(store, &u, &session.merchant_id).await?,
        None => None,
    };
    let Some(user) = user else {
        let _ = store.delete(&key, None).await;
        return Ok(Err(SessionEnd::Revoked));
    };
    if session.last_seen_at.plus(TOUCH_EVERY) <= now {
        let stale = DashboardSession::LAST_SEEN_AT.lt(&now.plus(-TOUCH_EVERY));
        let update = Changes::new().set(DashboardSession::LAST_SEEN_AT, &now);
        match store.update(&key, update.into(), Some(stale)).await {
            Ok(_) | Err(StoreError::ConditionFailed) => {}
            Err(e) => return Err(e),
        }
        session.last_seen_at = now;
    }
    Ok(Ok((session, user)))
}

/// Clears a session's notice once a page has shown it.
pub async fn clear_notice(deps: &Deps, cookie: &str) -> Result<(), StoreError> {
    let store = &*deps.store;
    let update = Changes::new().remove(DashboardSession::NOTICE);
    match store
        .update(&session_key(cookie), update.into(), Some(Cond::Exists))
        .await
    {
        Ok(_) | Err(StoreError::ConditionFailed) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Ends the session a cookie names (sign out here).
pub async fn sign_out(deps: &Deps, cookie: &str) -> Result<(), StoreError> {
    let store = &*deps.store;
    if !well_formed(cookie) {
        return Ok(());
    }
    store.delete(&session_key(cookie), None).await
}

/// Signs out here with the audit entry of it, in one transaction: a
/// failed audit write signs nobody out.
pub async fn sign_out_audited(
    deps: &Deps,
    cookie: &str,
    entry: &audit::AuditEntry,
) -> Result<(), StoreError> {
    let store = &*deps.store;
    if !well_formed(cookie) {
        return Ok(());
    }
    let end = TxOp::Delete {
        key: session_key(cookie),
        cond: None,
    };
    store.transact(vec![end, audit::audit_op(entry)?]).await
}

/// Ends every session and known device of `user_id` (raises their epoch)
/// with the audit entry of it, in one transaction.
pub async fn sign_out_everywhere(
    deps: &Deps,
    user_id: &UserId,
    entry: &audit::AuditEntry,
) -> Result<(), StoreError> {
    let store = &*deps.store;
    let raise = TxOp::Update {
        key: DashboardUser::key(user_id),
        update: Changes::new().add(DashboardUser::SESSION_EPOCH, 1).into(),
        cond: Some(Cond::Exists),
    };
    store.transact(vec![raise, audit::audit_op(entry)?]).await
}

/// Points a session at another project of its merchant, or mode.
pub async fn switch_view(
    deps: &Deps,
    cookie: &str,
    session: &DashboardSession,
    project_id: &ProjectId,
    mode: Mode,
) -> Result<(), DashboardError> {
    let store = &*deps.store;
    let projects = super::super::account::merchant_projects(deps, &session.merchant_id).await?;
    if !projects.iter().any(|p| p.id == *project_id) {
        return Err(DashboardError::Invalid {
            field: "project",
            message: "No such project".into(),
        });
    }
    let update = Changes::new()
        .set(DashboardSession::PROJECT_ID, project_id)
        .set(DashboardSession::MODE, &mode);
    store
        .update(&session_key(cookie), update.into(), Some(Cond::Exists))
        .await?;
    Ok(())
}

/// Points a session at `merchant_id` (its first project, in sandbox),
/// where the person is an enabled member: checked here on the stored
/// records, never taken from the form, and again in the session's write
/// (a membership removed meanwhile fails it). Anything else is
/// [`DashboardError::NotMember`] and the session stays as it was.
pub async fn switch_merchant(
    deps: &Deps,
    cookie: &str,
    session: &DashboardSession,
    merchant_id: &MerchantId,
) -> Result<(), DashboardError> {
    let store = &*deps.store;
    let user = get_user(store, &session.user_id)
        .await?
        .filter(|u| u.session_epoch == session.epoch)
        .ok_or(DashboardError::NotMember)?;
    if member_view(store, &user, merchant_id).await?.is_none() {
        return Err(DashboardError::NotMember);
    }
    let project = super::super::account::merchant_projects(deps, merchant_id)
        .await?
        .into_iter()
        .next()
        .ok_or(DashboardError::NoProject)?;
    let update = Changes::new()
        .set(DashboardSession::MERCHANT_ID, merchant_id)
        .set(DashboardSession::PROJECT_ID, &project.id)
        .set(DashboardSession::MODE, &Mode::Sandbox);
    let mut ops = vec![TxOp::Update {
        key: session_key(cookie),
        update: update.into(),
        cond: Some(Cond::Exists),
    }];
    if user.merchant_id != *merchant_id {
        ops.push(TxOp::Check {
            key: Membership::key(&user.id, merchant_id),
            cond: Cond::And(vec![Cond::Exists, Membership::DISABLED.ne(&true)]),
        });
    }
    match store.transact(ops).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_condition_failure() => Err(DashboardError::NotMember),
        Err(e) => Err(e.into()),
    }
}

/// A random token for the sign-in form, before there is a session (sent
/// as a cookie and as a field: the double-submit pattern).
pub fn new_form_token() -> String {
    random_alnum(32)
}

/// Whether two tokens are the same, in constant time; empty is no token.
pub fn same_token(a: &str, b: &str) -> bool {
    !a.is_empty() && same(a, b)
}
