//! `Authorization: Bearer sk_test_…|sk_live_…` on every merchant route.
//!
//! Order of checks: a usable key (401) -> merchant suspended (403) -> key
//! paused (423) -> the rate limit (429, [`super::ratelimit`]) -> the
//! route's scope (403, checked by the handler through [`Auth::require`]).
//!
//! Authentication runs once per request: the idempotency layer or the
//! first extractor leaves the [`Auth`] on the request, and later extractors
//! take it from there, so a request takes one slot of its key's budget.

use axum::extract::FromRequestParts;
use http::header;
use http::request::Parts;

use super::error::ApiError;
use super::ratelimit::{QuotaHttp, QuotaSlot};
use shared::app::AppState;
use shared::domain::account::{self, Principal, Scope};
use shared::domain::{Mode, Tenant};
use shared::ids::SessionId;
use shared::limits::public::SessionUse;

/// The authenticated caller of a request.
#[derive(Clone, Debug)]
pub struct Auth(pub std::sync::Arc<Principal>);

impl Auth {
    /// 403 `missing_scope` unless the key holds `scope`.
    /// The principal, if this secret or restricted key holds `scope`; a
    /// publishable key is refused whatever it holds.
    pub fn require(&self, scope: Scope) -> Result<&Principal, ApiError> {
        if self.0.key.kind == shared::domain::account::KeyKind::Publishable {
            return Err(shared::domain::account::publishable_refusal().into());
        }
        if self.0.key.has_scope(scope) {
            Ok(&self.0)
        } else {
            Err(ApiError::missing_scope(scope.as_str()))
        }
    }

    pub fn mode(&self) -> Mode {
        self.0.mode()
    }

    pub fn project_id(&self) -> &str {
        self.0.project_id()
    }

    /// Whose records the caller reads and writes.
    pub fn tenant(&self) -> &Tenant {
        self.0.tenant()
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // A layer that ran first (idempotency) may have authenticated already.
        if let Some(auth) = parts.extensions.get::<Auth>() {
            return Ok(auth.clone());
        }
        let auth = authenticate_request(parts, state).await?;
        parts.extensions.insert(auth.clone());
        Ok(auth)
    }
}

/// The caller of an endpoint for apps: a publishable key (`pk_…`) of a
/// project whose merchant may take payments. A secret key is refused
/// (403). Anyone holding the app holds its publishable key, so it has no
/// per-key rate limit for one client to exhaust: the public routes'
/// limits per client address and, once the secret is checked, per
/// session apply instead ([`shared::limits::public`]).
#[derive(Clone, Debug)]
pub struct AppKey(pub Principal);

impl AppKey {
    /// Takes one request of session `id`'s app budget (apart from its
    /// hosted pages', which anyone holding the id can spend): call it once
    /// the client secret proved the caller.
    pub async fn session_budget(state: &AppState, id: &SessionId) -> Result<(), ApiError> {
        state
            .take_session(id, SessionUse::App)
            .await
            .map_err(|limited| ApiError::public_limited(&limited))
    }
}

impl FromRequestParts<AppState> for AppKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secret = bearer(parts)?;
        let now = state.clock.now();
        let key = account::authenticate_key(state, now, secret).await?;
        if key.kind != account::KeyKind::Publishable {
            return Err(account::secret_key_in_app_refusal().into());
        }
        let principal = account::principal_of(state, key).await?;
        let address = super::requests::client_address_in(state, &parts.headers, &parts.extensions);
        // The session's own budget is taken once its secret is checked
        // ([`AppKey::session_budget`]), so no one can spend it with the id
        // alone.
        let request = shared::limits::public::PublicRequest {
            address: address.as_str(),
            poll: false,
            write: parts.method == http::Method::POST,
            link: None,
            opens_session: false,
            opens_stream: false,
        };
        if let Err(limited) = state.take_public(&request).await {
            return Err(ApiError::public_limited(&limited));
        }
        Ok(AppKey(principal))
    }
}

/// The keys this process authenticated lately
/// ([`account::cache`]: revocations elsewhere take effect within
/// [`account::cache::PRINCIPAL_TTL`]; here at once). One per process, as
/// the epoch that invalidates it is.
static PRINCIPALS: std::sync::LazyLock<account::cache::PrincipalCache> =
    std::sync::LazyLock::new(account::cache::PrincipalCache::new);

/// Authenticates the request's bearer key, then takes one request of the
/// key's rate limit (429 when over) and records the key's use. The
/// limiter's decision goes to the request's [`QuotaSlot`] (the edge turns
/// it into headers). Call it once per request.
pub async fn authenticate_request(parts: &Parts, state: &AppState) -> Result<Auth, ApiError> {
    let secret = bearer(parts)?;
    let now = state.clock.now();
    let (principal, quota) = match PRINCIPALS.recall(secret, now) {
        // Remembered (at most `PRINCIPAL_TTL` old): no store read.
        Some(principal) => {
            let principal = principal?;
            let quota = state
                .take_key_request(&principal.key.id, principal.mode())
                .await;
            (principal, quota)
        }
        None => {
            let epoch = account::cache::epoch();
            let key = account::authenticate_key(state, now, secret).await?;
            // The key is real: its merchant is read while the limiter takes
            // its slot (one round trip less on DynamoDB). A refusal of the
            // merchant or the key (403 suspended, 423 paused) still comes
            // first and carries no rate-limit headers; its slot is taken
            // from a key that can do nothing anyway.
            let (key_id, mode) = (key.id.clone(), key.mode);
            let (principal, quota) = tokio::join!(
                account::principal_of(state, key),
                state.take_key_request(&key_id, mode)
            );
            let principal = std::sync::Arc::new(principal?);
            PRINCIPALS.remember(&principal, now, epoch);
            (principal, quota)
        }
    };
    if let Some(slot) = parts.extensions.get::<QuotaSlot>() {
        slot.set(quota);
    }
    if quota.limited() {
        return Err(quota.error());
    }
    let fresh_since = now.plus(-account::LAST_USED_EVERY);
    let stale = principal.key.last_used_at.is_none_or(|t| t < fresh_since);
    match account::record_use(state, &principal.key, now).await {
        // Written now, or by another instance meanwhile (the write's
        // condition failed): the remembered copy is fresh either way.
        Ok(_) if stale => PRINCIPALS.used(&principal.key.key_hash, now),
        Ok(_) => {}
        // Bookkeeping only: the request goes on.
        Err(e) => {
            tracing::warn!(error = %e, key_id = %principal.key.id, "last_used_at not recorded");
        }
    }
    Ok(Auth(principal))
}

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::api_key_invalid(
            "No API key provided: send 'Authorization: Bearer <secret key>'",
        ));
    };
    let value = value.to_str().unwrap_or_default().trim();
    let mut parts = value.splitn(2, ' ');
    let scheme = parts.next().unwrap_or_default();
    let token = parts.next().unwrap_or_default().trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiError::api_key_invalid(
            "The Authorization header must be 'Bearer <secret key>'",
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorType;
    use http::StatusCode;
    use shared::domain::account::AuthError;
    use shared::time::Timestamp;

    fn parts(auth: Option<&str>) -> Parts {
        let mut b = http::Request::get("/v1/account");
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(()).unwrap_or_default().into_parts().0
    }

    #[test]
    fn bearer_header_is_parsed_strictly() {
        assert_eq!(
            bearer(&parts(Some("Bearer sk_test_x"))).ok(),
            Some("sk_test_x")
        );
        assert_eq!(
            bearer(&parts(Some("bearer  sk_test_x "))).ok(),
            Some("sk_test_x")
        );
        for bad in [
            None,
            Some("sk_test_x"),
            Some("Basic abc"),
            Some("Bearer "),
            Some("Bearer"),
        ] {
            let e = bearer(&parts(bad)).err();
            assert_eq!(
                e.map(|e| (e.status, e.code)),
                Some((StatusCode::UNAUTHORIZED, "api_key_invalid")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn failures_map_to_the_spec_answers() {
        let t = Timestamp::parse("2026-01-01T00:00:00Z")
            .unwrap_or_else(|| shared::time::Clock::now(&shared::time::SystemClock));
        let e = ApiError::from(AuthError::Invalid);
        assert_eq!(
            (e.status, e.kind, e.code),
            (
                StatusCode::UNAUTHORIZED,
                ErrorType::AuthenticationError,
                "api_key_invalid"
            )
        );
        let e = ApiError::from(AuthError::Suspended(account::Suspension {
            suspended_at: t,
            reason: "r".into(),
        }));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::FORBIDDEN, "account_suspended")
        );
        assert_eq!(
            e.body("id")["error"]["suspension"]["suspended_at"],
            "2026-01-01T00:00:00.000Z"
        );
        let e = ApiError::from(AuthError::Paused(account::Pause {
            paused_at: t,
            reason: "r".into(),
        }));
        assert_eq!((e.status, e.code), (StatusCode::LOCKED, "token_paused"));
        assert_eq!(e.body("id")["error"]["pause"]["reason"], "r");
    }
}
