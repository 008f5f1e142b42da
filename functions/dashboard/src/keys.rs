//! API keys in the dashboard: the project's keys in this mode, issuing one
//! (scopes, spend cap, expiry; the secret shown once, on the answer to the
//! form, never in a URL), rotating with a grace period, revoking. Owners
//! and developers only. Each action claims its form's one-time token, so a
//! double submit issues nothing twice, and is in the audit log.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use edge::PathId;
use edge::html::html;
use http::StatusCode;
use shared::AppState;
use shared::domain::account::{self, ApiKey, KeyKind, NewKey, Scope};
use shared::domain::dashboard::{self, Action, FormClaim};
use shared::ids::ApiKeyId;

use crate::{Page, Signed, Stop, expired_form, fail, nav, pages, query, see_other};

/// Longest key description.
const DESCRIPTION_MAX: usize = 100;

/// The project's keys in the session's mode (`account::list_api_keys`).
async fn listed(state: &AppState, signed: &Signed) -> Result<Vec<ApiKey>, Stop> {
    Ok(account::list_api_keys(state, &signed.session.project_id)
        .await
        .map_err(fail)?
        .into_iter()
        .filter(|k| k.mode == signed.session.mode)
        .collect())
}

async fn show(
    state: &AppState,
    signed: &Signed,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    show_page(state, signed, 1, notice, error, status).await
}

async fn show_page(
    state: &AppState,
    signed: &Signed,
    page: usize,
    notice: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    let all = listed(state, signed).await?;
    let total = all.len();
    let keys: Vec<ApiKey> = all
        .into_iter()
        .skip((page - 1) * crate::PAGE)
        .take(crate::PAGE)
        .collect();
    let nav = nav(state, signed, "keys").await?;
    let now = state.clock.now();
    Ok(html(
        status,
        pages::keys(
            &nav,
            &keys,
            (page, total),
            now,
            &dashboard::new_form_nonce(),
            notice,
            error,
        ),
    ))
}

pub async fn keys_page(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Page {
    signed.require(Action::ReadKeys)?;
    let q = query(&raw);
    let notice = crate::id_param(&q, "revoked", "ak_")
        .map(|id| format!("Key {id} revoked: it no longer works."));
    let page = crate::page_number(&q)?;
    show_page(
        &state,
        &signed,
        page,
        notice.as_deref(),
        None,
        StatusCode::OK,
    )
    .await
}

/// What issuing (or rotating) a key of `kind` is in the role table: a
/// secret or restricted key's secret acts for the project.
fn issuing(kind: KeyKind) -> Action {
    match kind {
        KeyKind::Publishable => Action::IssuePublishableKey,
        KeyKind::Secret | KeyKind::Restricted => Action::IssueSecretKey,
    }
}

/// What the issue form asks for.
fn new_key(
    signed: &Signed,
    f: &HashMap<String, String>,
    now: shared::time::Timestamp,
) -> Result<NewKey, String> {
    let kind = match f.get("kind").map(String::as_str) {
        Some("secret") => KeyKind::Secret,
        Some("restricted") => KeyKind::Restricted,
        Some("publishable") => KeyKind::Publishable,
        _ => return Err("Kind: choose secret, restricted or publishable".into()),
    };
    let description = f
        .get("description")
        .map(|d| d.trim().to_owned())
        .unwrap_or_default();
    if description.chars().count() > DESCRIPTION_MAX || description.chars().any(char::is_control) {
        return Err(format!(
            "Description: at most {DESCRIPTION_MAX} characters on one line"
        ));
    }
    let scopes = match kind {
        KeyKind::Secret => Scope::ALL.to_vec(),
        KeyKind::Publishable => Vec::new(),
        KeyKind::Restricted => {
            let chosen: Vec<Scope> = Scope::ALL
                .into_iter()
                .filter(|s| f.contains_key(&format!("scope:{}", s.as_str())))
                .collect();
            if chosen.is_empty() {
                return Err("Scopes: a restricted key needs at least one".into());
            }
            chosen
        }
    };
    let spend_cap_paisa = match f
        .get("spend_cap")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(_) if kind == KeyKind::Publishable => {
            return Err("Spend cap: a publishable key creates no payments of its own".into());
        }
        Some(text) => {
            Some(shared::money::parse_rupees(text).map_err(|e| format!("Spend cap: {e}"))?)
        }
    };
    let expires_at = match f
        .get("expires_days")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(text) => match text.parse::<i64>() {
            Ok(days) if (1..=3650).contains(&days) => Some(now.plus(chrono::Duration::days(days))),
            _ => return Err("Expires: a number of days from 1 to 3650, or empty".into()),
        },
    };
    Ok(NewKey {
        mode: signed.session.mode,
        kind,
        scopes,
        description,
        expires_at,
        spend_cap_paisa,
    })
}

/// Claims the form's one-time token; `Err` when it is not one of ours, or
/// answers the page of a form already sent.
async fn claim(
    state: &AppState,
    signed: &Signed,
    f: &HashMap<String, String>,
) -> Result<Result<shared::store::fence::Fence, Page>, Stop> {
    let nonce = f.get("nonce").map(String::as_str).unwrap_or("");
    let Some(fence) = dashboard::form_fence(&signed.user.merchant_id, nonce, state.clock.now())
    else {
        return Err(expired_form());
    };
    match dashboard::claim_form::<ApiKeyId>(state, &fence)
        .await
        .map_err(fail)?
    {
        FormClaim::First => Ok(Ok(fence)),
        FormClaim::Done(made) => {
            let text = match made {
                Some(id) => format!(
                    "This form was already sent (key {id}); a new key's secret is shown only once. Nothing else was done."
                ),
                None => "This form was already sent. Nothing else was done.".to_owned(),
            };
            Ok(Err(
                show(state, signed, Some(&text), None, StatusCode::OK).await
            ))
        }
    }
}

pub async fn issue(State(state): State<AppState>, signed: Signed, body: Bytes) -> Page {
    let f = signed.action_form(Action::IssuePublishableKey, &body)?;
    let now = state.clock.now();
    let new = match new_key(&signed, &f, now) {
        Ok(n) => n,
        Err(e) => {
            return show(
                &state,
                &signed,
                None,
                Some(&e),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    signed.require(issuing(new.kind))?;
    let fence = match claim(&state, &signed, &f).await? {
        Ok(fence) => fence,
        Err(page) => return page,
    };
    let project = account::get_project(&state, &signed.session.project_id)
        .await
        .map_err(fail)?
        .ok_or_else(|| {
            fail(shared::refusal::Refusal::not_found(
                "project",
                &signed.session.project_id,
            ))
        })?;
    let audit = |k: &ApiKey| key_entry(&state, &signed, "key.issue", k);
    let (secret, key) = account::issue_api_key_with(&state, now, &project, new, audit)
        .await
        .map_err(fail)?;
    finish(&state, &signed, &fence, &key, &secret, "Your new key").await
}

/// The audit entry of `action` on `key`, for the key's own transaction.
fn key_entry(
    state: &AppState,
    signed: &Signed,
    action: &str,
    key: &ApiKey,
) -> Result<Vec<shared::store::TxOp>, shared::store::StoreError> {
    let detail = format!("{:?} {}", key.kind, key.scopes.join(","));
    let entry = signed.entry(state, action, &key.id, &detail);
    Ok(vec![dashboard::audit_op(&entry)?])
}

/// Records the form's result, then shows the secret (the audit entry was
/// written with the key).
async fn finish(
    state: &AppState,
    signed: &Signed,
    fence: &shared::store::fence::Fence,
    key: &ApiKey,
    secret: &str,
    title: &str,
) -> Page {
    if let Err(e) = dashboard::complete_form(state, fence, &key.id).await {
        tracing::warn!(error = %e, "form result not recorded");
    }
    let nav = nav(state, signed, "keys").await?;
    Ok(html(
        StatusCode::OK,
        pages::secret_once(&nav, title, secret, key),
    ))
}

/// The key of the path in the session's project and mode, or a 404 page
/// (also for an id that cannot be one).
async fn key_of(state: &AppState, signed: &Signed, id: PathId<ApiKeyId>) -> Result<ApiKey, Stop> {
    let missing = |raw: &str| fail(shared::refusal::Refusal::not_found("key", raw));
    let key_id = id.get_or(|_, raw| missing(raw))?;
    account::find_api_key(state, &signed.session.project_id, &key_id)
        .await
        .map_err(fail)?
        .filter(|k| k.mode == signed.session.mode)
        .ok_or_else(|| missing(&key_id))
}

pub async fn rotate(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<ApiKeyId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::IssuePublishableKey, &body)?;
    let grace = match f.get("grace").map(String::as_str) {
        Some("0") => chrono::Duration::zero(),
        Some("1h") => chrono::Duration::hours(1),
        Some("24h") | None => chrono::Duration::hours(24),
        Some("7d") => chrono::Duration::days(7),
        Some(_) => {
            return show(
                &state,
                &signed,
                None,
                Some("Grace: choose one of the periods"),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let old = key_of(&state, &signed, id).await?;
    signed.require(issuing(old.kind))?;
    let fence = match claim(&state, &signed, &f).await? {
        Ok(fence) => fence,
        Err(page) => return page,
    };
    let now = state.clock.now();
    let rotation = match account::rotate_api_key_with(
        &state,
        now,
        &old,
        grace,
        old.expires_at.filter(|t| *t > now),
        |k: &ApiKey| key_entry(&state, &signed, "key.rotate", k),
    )
    .await
    {
        Ok(r) => r,
        Err(shared::store::StoreError::Invalid(why)) => {
            return show(
                &state,
                &signed,
                None,
                Some(&why),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
        Err(e) => return Err(fail(e)),
    };
    let title = format!("The key that replaces {}", old.id);
    finish(
        &state,
        &signed,
        &fence,
        &rotation.new_key,
        &rotation.secret,
        &title,
    )
    .await
}

pub async fn revoke(
    State(state): State<AppState>,
    signed: Signed,
    id: PathId<ApiKeyId>,
    body: Bytes,
) -> Page {
    let f = signed.action_form(Action::RevokeKey, &body)?;
    if f.get("confirm").map(String::as_str) != Some("yes") {
        return show(
            &state,
            &signed,
            None,
            Some("Tick the box to confirm: a revoked key stops working at once."),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    let fence = match claim(&state, &signed, &f).await? {
        Ok(fence) => fence,
        Err(page) => return page,
    };
    let key = key_of(&state, &signed, id).await?;
    if let Err(e) = dashboard::complete_form(&state, &fence, &key.id).await {
        tracing::warn!(error = %e, "form result not recorded");
    }
    let audit = signed.audit_op(&state, "key.revoke", &key.id, &key.prefix)?;
    match account::revoke_api_key_with(&state, &key, audit).await {
        // Already revoked (a double submit): the same outcome.
        Ok(()) | Err(shared::store::StoreError::ConditionFailed) => {}
        Err(e) => return Err(fail(e)),
    }
    Ok(see_other(&format!("/dashboard/keys?revoked={}", key.id)))
}
