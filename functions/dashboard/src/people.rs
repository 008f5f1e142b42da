//! People (owners only): the merchant's dashboard users, inviting one
//! with a role (a single-use link shown once, `dashboard::invite`; the
//! invited person sets their password at `/dashboard/join/{token}`),
//! revoking a pending invitation, changing a role, disabling and enabling,
//! removing a person whose first merchant is another (only this
//! merchant's membership goes: `dashboard::remove_member`). An owner
//! cannot change themselves here, so no account is left without an owner
//! by a slip.
//! Every change is in the audit log.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use maud::html as markup;
use shared::AppState;
use shared::domain::dashboard::{self, Action, DashboardError, Role, UserChange};
use shared::ids::UserId;

use crate::pages::{layout, status_badge, when};
use crate::{Page, Signed, fail, nav, query, see_other};

const ROLES: [Role; 3] = [Role::Owner, Role::Developer, Role::Viewer];

async fn show(
    state: &AppState,
    signed: &Signed,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let users = dashboard::list_users(state, &signed.user.merchant_id)
        .await
        .map_err(fail)?;
    // People whose first merchant is another: their password is not this
    // merchant's to set; their membership is this merchant's to remove.
    let members = dashboard::list_members(state, &signed.user.merchant_id)
        .await
        .map_err(fail)?;
    let people = users
        .iter()
        .map(|u| (u, true))
        .chain(members.iter().map(|u| (u, false)));
    let invited =
        dashboard::pending_invitations(state, state.clock.now(), &signed.user.merchant_id)
            .await
            .map_err(fail)?;
    let nav = nav(state, signed, "people").await?;
    let body = markup! {
        @if let Some(n) = notice { p.notice role="status" { (n) } }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        div.panel {
            table {
                thead { tr { th scope="col" { "Person" } th scope="col" { "Role" } th scope="col" { "State" } th scope="col" { "Since" } th scope="col" { "Change" } } }
                tbody { @for (u, first) in people {
                    tr {
                        td { (u.email) }
                        td { (u.role.as_str()) }
                        td { (status_badge(if u.disabled { "disabled" } else { "active" })) }
                        td { (when(u.created_at)) }
                        td {
                            @if u.id == signed.user.id {
                                span.muted { "you" }
                            } @else {
                                form method="post" action={ "/dashboard/people/" (u.id) } {
                                    input type="hidden" name="csrf" value=(nav.csrf);
                                    label for={ "role-" (u.id) } { "Role" } " "
                                    select id={ "role-" (u.id) } name="role" {
                                        @for r in ROLES { option value=(r.as_str()) selected[r == u.role] { (r.as_str()) } }
                                    }
                                    " "
                                    button type="submit" name="do" value="role" { "Change role" }
                                    " "
                                    @if first {
                                        button type="submit" name="do" value="password" { "New password" }
                                    } @else {
                                        button type="submit" name="do" value="remove" { "Remove" }
                                    }
                                    " "
                                    @if u.disabled {
                                        button type="submit" name="do" value="enable" { "Enable" }
                                    } @else {
                                        button type="submit" name="do" value="disable" { "Disable" }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        }
        section.panel aria-labelledby="invited-title" {
            h2 id="invited-title" { "Invited" }
            @if invited.is_empty() {
                p.muted { "No pending invitations." }
            }
            @for i in &invited {
                form method="post" action="/dashboard/people/invitations/revoke" {
                    (i.email) " as " (i.role.as_str()) ", until " (when(i.expires_at)) " "
                    input type="hidden" name="csrf" value=(nav.csrf);
                    input type="hidden" name="invitation" value=(i.hash);
                    button type="submit" { "Revoke" }
                }
            }
        }
        section.panel aria-labelledby="add-title" {
            h2 id="add-title" { "Invite a person" }
            form.stack method="post" action="/dashboard/people" {
                input type="hidden" name="csrf" value=(nav.csrf);
                input type="hidden" name="nonce" value=(dashboard::new_form_nonce());
                label for="email" { "Email" }
                input id="email" name="email" type="email" required maxlength="254";
                label for="role" { "Role" }
                select id="role" name="role" {
                    option value="viewer" { "viewer: reads, changes nothing" }
                    option value="developer" { "developer: keys, webhooks, refunds; not people" }
                    option value="owner" { "owner: everything" }
                }
                button.primary type="submit" { "Invite" }
            }
        }
    };
    Ok(html(status, layout(&nav, "People", body)))
}

pub async fn page(State(state): State<AppState>, signed: Signed, RawQuery(raw): RawQuery) -> Page {
    signed.require(Action::People)?;
    let q = query(&raw);
    let notice = q.contains_key("changed").then_some("Saved.");
    show(&state, &signed, notice, None, StatusCode::OK).await
}

pub async fn add(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::People, &body)?;
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, state.clock.now())
    else {
        return Err(crate::expired_form());
    };
    let Some(role) = f.get("role").and_then(|r| Role::parse(r)) else {
        return show(
            &state,
            &signed,
            None,
            Some("Role: choose owner, developer or viewer"),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    };
    let email = f.get("email").cloned().unwrap_or_default();
    if let Err(e) = dashboard::normalize_email(&email) {
        return show(
            &state,
            &signed,
            None,
            Some(&e.to_string()),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    if let dashboard::FormClaim::Done(_) =
        dashboard::claim_form::<shared::ids::UserId>(&state, &fence)
            .await
            .map_err(fail)?
    {
        return show(
            &state,
            &signed,
            Some("This form was already sent. If its link was lost, revoke it and invite again."),
            None,
            StatusCode::OK,
        )
        .await;
    }
    // Reads nothing about the address: the same answer whether or not it
    // has an account anywhere.
    let now = state.clock.now();
    let entry = signed.entry(
        &state,
        "person.invite",
        email.trim(),
        &format!("as {}", role.as_str()),
    );
    let (token, inv) = dashboard::invite(
        &state,
        now,
        &signed.user.merchant_id,
        &signed.user.id,
        &email,
        role,
        Some(&entry),
    )
    .await
    .map_err(fail)?;
    let base =
        (state.config.dashboard_base_url.as_deref()).unwrap_or(&state.config.public_base_url);
    let link = format!("{base}/dashboard/join/{token}");
    let nav = nav(&state, &signed, "people").await?;
    let body = markup! {
        p.notice role="status" { "Send this link to " (inv.email) " yourself; it is shown only this once, works once, and expires in 7 days. They join when they open it and set a password." }
        div.panel {
            label for="link" { "Invitation link for " (inv.email) }
            input id="link" name="link" readonly value=(link) size="80";
        }
        p { a href="/dashboard/people" { "← People" } }
    };
    Ok(html(StatusCode::OK, layout(&nav, "Invitation made", body)))
}

/// Revokes a pending invitation of the owner's merchant.
pub async fn revoke_invitation(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::People, &body)?;
    let hash = f.get("invitation").map(String::as_str).unwrap_or("");
    let now = state.clock.now();
    let entry = signed.entry(&state, "person.invite.revoke", hash, "");
    let revoked =
        dashboard::revoke_invitation(&state, now, &signed.user.merchant_id, hash, Some(&entry))
            .await
            .map_err(fail)?;
    if !revoked {
        return show(
            &state,
            &signed,
            None,
            Some("No such pending invitation"),
            StatusCode::NOT_FOUND,
        )
        .await;
    }
    Ok(see_other("/dashboard/people?changed=1"))
}

pub async fn change(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<UserId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::People, &body)?;
    // An id that cannot be a person's is answered where a person is
    // looked up, as an unknown one.
    let user_id = id.get_or(|_, _| fail(DashboardError::UnknownUser));
    if user_id.as_ref().is_ok_and(|u| *u == signed.user.id) {
        return show(
            &state,
            &signed,
            None,
            Some("You cannot change yourself here; another owner can."),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    if f.get("do").map(String::as_str) == Some("password") {
        let password = dashboard::new_form_token();
        let user_id = user_id?;
        // The intent is recorded before the password changes (the reset
        // is several writes, with no one transaction to share).
        crate::audit(&state, &signed, "person.password", &user_id, "").await?;
        let u = dashboard::reset_password_of(&state, &signed.user.merchant_id, &user_id, &password)
            .await
            .map_err(fail)?;
        let nav = nav(&state, &signed, "people").await?;
        let body = markup! {
            p.notice role="status" { "Hand this new password to " (u.email) " yourself; it is shown only this once. Their sessions have ended." }
            div.panel {
                label for="password" { "New password of " (u.email) }
                input id="password" name="password" readonly value=(password) size="40";
            }
            p { a href="/dashboard/people" { "← People" } }
        };
        return Ok(html(StatusCode::OK, layout(&nav, "New password", body)));
    }
    if f.get("do").map(String::as_str) == Some("remove") {
        let user_id = user_id?;
        let entry = signed.entry(&state, "person.remove", &user_id, "");
        dashboard::remove_member(&state, &signed.user.merchant_id, &user_id, &entry)
            .await
            .map_err(fail)?;
        return Ok(see_other("/dashboard/people?changed=1"));
    }
    let what = match (
        f.get("do").map(String::as_str),
        f.get("role").and_then(|r| Role::parse(r)),
    ) {
        (Some("role"), Some(role)) => UserChange::Role(role),
        (Some("disable"), _) => UserChange::Disabled(true),
        (Some("enable"), _) => UserChange::Disabled(false),
        _ => {
            return show(
                &state,
                &signed,
                None,
                Some("Choose a role, or disable or enable"),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let user_id = user_id?;
    let entry = |u: &dashboard::DashboardUser| {
        let detail = match what {
            UserChange::Role(r) => format!("{} is now {}", u.email, r.as_str()),
            UserChange::Disabled(true) => format!("{} disabled", u.email),
            UserChange::Disabled(false) => format!("{} enabled", u.email),
        };
        Some(signed.entry(&state, "person.change", &u.id, &detail))
    };
    dashboard::change_user(&state, &signed.user.merchant_id, &user_id, what, entry)
        .await
        .map_err(fail)?;
    Ok(see_other("/dashboard/people?changed=1"))
}
