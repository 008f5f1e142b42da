//! `/dashboard/join/{token}`: the keyless page an invitation's link opens,
//! where the invited person sets their password and so joins the
//! merchant, or, when their address signs in to another merchant
//! already, enters that account's password (`dashboard::accept`: one form
//! for both, so the page tells nothing of the address; the existing
//! account's password is checked on the sign-in's throttle). Every
//! request takes a slot of the client address's budget for these links
//! before anything is read; a link that is malformed, unknown, used, revoked or expired
//! gets one page, the same for all. The token in the path is the form's
//! only credential (unguessable, single use), so no CSRF cookie is
//! needed: a forged post would have to know it.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use edge::html::html;
use http::{HeaderValue, StatusCode, header};
use maud::html as markup;
use shared::AppState;
use shared::domain::dashboard::{self, AcceptError};

use crate::{form, pages, see_other};

/// The one page of a link that cannot be used.
fn unusable() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::message(
            "This invitation cannot be used",
            "The link is wrong, was used already, was revoked, or has expired. Ask the person who invited you for a new one.",
        ),
    )
}

/// Takes a slot of the address's budget; the 429 page when there is none.
async fn throttled(state: &AppState, address: &str) -> Option<Response> {
    match dashboard::join_attempt(state, state.clock.now(), address).await {
        Ok(Ok(())) => None,
        Ok(Err(retry_after)) => {
            let mut res = html(
                StatusCode::TOO_MANY_REQUESTS,
                pages::message(
                    "Too many requests",
                    &format!(
                        "Too many invitation requests from your network. Try again in {retry_after} s."
                    ),
                ),
            );
            if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
            Some(res)
        }
        Err(e) => Some(crate::failure(e)),
    }
}

/// The password form for invitation `email`.
fn join_form(token: &str, email: &str, error: Option<&str>, status: StatusCode) -> Response {
    let body = markup! {
        main id="main" .signin {
            h1 { "Join the dashboard" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            p { "You were invited as " strong { (email) } "." }
            p { "If this address signs in to a Dhukuti dashboard already, enter that password: you keep one sign-in for every merchant. Otherwise choose a password (at least 12 characters)." }
            form.stack method="post" action={ "/dashboard/join/" (token) } autocomplete="off" {
                label for="password" { "Password" }
                input id="password" name="password" type="password" required minlength="12" maxlength="256" autocomplete="new-password";
                button.primary type="submit" { "Join" }
            }
        }
    };
    html(status, pages::bare("Join the dashboard", body))
}

pub async fn page(
    State(state): State<AppState>,
    Path(token): Path<String>,
    req: axum::extract::Request,
) -> Response {
    let address = edge::requests::client_address(&state, &req);
    if let Some(res) = throttled(&state, &address).await {
        return res;
    }
    match dashboard::open_invitation(&state, state.clock.now(), &token).await {
        Ok(Some(inv)) => join_form(&token, &inv.email, None, StatusCode::OK),
        Ok(None) => unusable(),
        Err(e) => crate::failure(e),
    }
}

pub async fn accept(
    State(state): State<AppState>,
    Path(token): Path<String>,
    req: axum::extract::Request,
) -> Response {
    let address = edge::requests::client_address(&state, &req);
    if let Some(res) = throttled(&state, &address).await {
        return res;
    }
    let Ok(body) = axum::body::to_bytes(req.into_body(), 16 * 1024).await else {
        return html(
            StatusCode::PAYLOAD_TOO_LARGE,
            pages::message("Too large", "That form was too large."),
        );
    };
    let body: Bytes = body;
    let password = form(&body).get("password").cloned().unwrap_or_default();
    let now = state.clock.now();
    let again = |message: &str, status: StatusCode| {
        let (state, token, message) = (state.clone(), token.clone(), message.to_owned());
        async move {
            match dashboard::open_invitation(&state, now, &token).await {
                Ok(Some(inv)) => join_form(&token, &inv.email, Some(&message), status),
                _ => unusable(),
            }
        }
    };
    match dashboard::accept(&state, now, &token, &password, &address).await {
        Ok(_) => see_other("/dashboard/sign-in?joined=1"),
        Err(AcceptError::Unusable) => unusable(),
        Err(AcceptError::HasAccount) => html(
            StatusCode::CONFLICT,
            pages::message(
                "Try again",
                "This address got an account while you were joining. Open the link again and enter that account's password.",
            ),
        ),
        Err(AcceptError::AlreadyMember) => html(
            StatusCode::CONFLICT,
            pages::message(
                "You are in this dashboard already",
                "This address is a person of this merchant already: sign in, and switch to it in the header.",
            ),
        ),
        Err(AcceptError::Dashboard(dashboard::DashboardError::Invalid { message, .. })) => {
            again(&message, StatusCode::UNPROCESSABLE_ENTITY).await
        }
        Err(AcceptError::Dashboard(dashboard::DashboardError::WrongCredentials)) => {
            let message = "That is not the password of this address's account.";
            again(message, StatusCode::UNAUTHORIZED).await
        }
        Err(AcceptError::Dashboard(e)) => crate::failure(e),
    }
}
