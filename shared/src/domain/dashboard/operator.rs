//! What an operator does to dashboard users with `dhukuti-admin user …`:
//! each action's audit entry is written in the user's merchant's log
//! before the action, so nothing an operator does is missing from it (a
//! failed audit write fails the command, and nothing is done).

use super::audit::{AuditEntry, record_audit};
use super::users::{self, check_password, find_user_by_email, normalize_email};
use super::{DashboardError, DashboardUser, Role};
use crate::app::Deps;
use crate::ids::{AuditId, MerchantId, ProjectId, UserId};
use crate::time::Timestamp;

/// Who the audit log names for an operator.
pub const OPERATOR: &str = "dhukuti-admin";
/// Where the audit log says an operator acted from.
const FROM: &str = "command line";

/// The operator's entry of `action` on `target` in `merchant_id`'s log.
fn entry(
    merchant_id: &MerchantId,
    now: Timestamp,
    action: &str,
    target: &str,
    detail: &str,
) -> AuditEntry {
    AuditEntry {
        id: AuditId::new(),
        merchant_id: merchant_id.clone(),
        // No dashboard user acts: the id that is nobody's.
        user_id: UserId::stored("usr_00000000000000000000000000"),
        email: OPERATOR.to_owned(),
        action: action.to_owned(),
        target: target.to_owned(),
        project_id: ProjectId::default(),
        mode: None,
        detail: detail.to_owned(),
        address: FROM.to_owned(),
        at: now,
    }
}

/// Creates a user of `merchant_id` (`user create`), audited first.
pub async fn create(
    deps: &Deps,
    now: Timestamp,
    merchant_id: &MerchantId,
    email: &str,
    role: Role,
    password: &str,
) -> Result<DashboardUser, DashboardError> {
    let email = normalize_email(email)?;
    check_password(password)?;
    if super::super::account::get_merchant(&*deps.store, merchant_id)
        .await?
        .is_none()
    {
        return Err(DashboardError::UnknownMerchant);
    }
    let audit = entry(merchant_id, now, "user.create", &email, role.as_str());
    record_audit(deps, &audit).await?;
    users::create_user(deps, now, merchant_id, &email, role, password).await
}

/// Sets a new password (`user reset-password`), audited first; every
/// session and known device of the user ends.
pub async fn reset_password(
    deps: &Deps,
    now: Timestamp,
    email: &str,
    password: &str,
) -> Result<DashboardUser, DashboardError> {
    check_password(password)?;
    let user = find_user_by_email(&*deps.store, email)
        .await?
        .ok_or(DashboardError::UnknownUser)?;
    let audit = entry(
        &user.merchant_id,
        now,
        "user.reset_password",
        &user.id,
        &user.email,
    );
    record_audit(deps, &audit).await?;
    users::reset_password(&*deps.store, &user.email, password).await
}

/// Disables a user or enables them again (`user disable [--enable]`),
/// audited first.
pub async fn set_disabled(
    deps: &Deps,
    now: Timestamp,
    email: &str,
    disabled: bool,
) -> Result<DashboardUser, DashboardError> {
    let user = find_user_by_email(&*deps.store, email)
        .await?
        .ok_or(DashboardError::UnknownUser)?;
    let action = if disabled {
        "user.disable"
    } else {
        "user.enable"
    };
    let audit = entry(&user.merchant_id, now, action, &user.id, &user.email);
    record_audit(deps, &audit).await?;
    users::set_disabled(&*deps.store, &user.email, disabled).await
}
