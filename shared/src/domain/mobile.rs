//! Mobile sessions: a checkout session of flow `mobile` that the
//! merchant's app pays without ever holding a secret key
//! (docs/decisions-refined.md, "Mobile sessions"). The merchant's server
//! creates it and hands the app its id and client secret; the app, with
//! the project's publishable key and that secret, reads it and starts
//! attempts. Everything after the start is the hosted flow's: the same
//! provider hand-offs, the same server-to-server proof, the same webhooks.

use rand::Rng;
use serde::Deserialize;
use serde_json::{Map, Value};
use subtle::ConstantTimeEq;

use super::account::{Principal, hash_secret};
use super::attempts::{self, AttemptError, PayChoice, Started};
use super::checkout::{
    self, Address, CheckoutError, CheckoutSession, Creator, CustomerInput, Flow, ValidCheckout,
};
use super::{Mode, Provider};
use crate::app::Deps;
use crate::domain::record::Changes;
use crate::fields::Description;
use crate::ids::SessionId;
use crate::money::Currency;
use crate::refusal::Refusal;
use crate::store::fence::Fence;
use crate::store::{Cond, StoreError};
use crate::time::Timestamp;

/// What a client secret starts with; random alphanumerics follow.
pub const SECRET_PREFIX: &str = "cs_secret_";
/// Random characters after [`SECRET_PREFIX`] (about 238 bits).
const SECRET_RANDOM_LEN: usize = 40;
/// Longer than any secret we make: not even hashed.
const SECRET_MAX_LEN: usize = 128;

/// The body of `POST /v1/mobile/sessions`: `POST /v1/checkout`'s without
/// the URLs and the flow (an app has no page to return to). Unknown
/// fields refused.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateMobileSession)]
pub struct CreateMobileSession {
    /// Paisa; the provider's and mode's bounds apply (`GET /v1/providers`).
    #[schema(minimum = 1)]
    pub amount: i64,
    /// The one provider the app may pay with; the customer picks in the
    /// app when absent.
    #[serde(default)]
    pub provider: Option<Provider>,
    #[serde(default)]
    pub currency: Option<Currency>,
    #[serde(default)]
    pub description: Option<Description>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub customer: Option<CustomerInput>,
    /// The app must send the customer's address with its attempt.
    #[serde(default)]
    pub collect_address: Option<bool>,
}

/// Why a mobile session operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum MobileError {
    /// No mobile session `id` for this key's project and mode, or the
    /// client secret is wrong or missing: the app cannot tell which.
    #[error("no such mobile session")]
    NotFound(String),
    #[error(transparent)]
    Checkout(#[from] CheckoutError),
    #[error(transparent)]
    Attempt(#[from] AttemptError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<MobileError> for Refusal {
    fn from(err: MobileError) -> Self {
        match err {
            MobileError::NotFound(id) => Refusal::not_found("mobile session", &id),
            MobileError::Checkout(e) => e.into(),
            MobileError::Attempt(AttemptError::NotFound) => {
                Refusal::not_found("mobile session", "")
            }
            MobileError::Attempt(e) => e.into(),
            MobileError::Store(e) => e.into(),
        }
    }
}

/// Checks a create request (no store needed). `base`: our public base URL,
/// the session's return address (the app has no shop page).
pub fn validate(
    req: CreateMobileSession,
    mode: Mode,
    base: &str,
) -> Result<ValidCheckout, CheckoutError> {
    validate_for(Flow::Mobile, req, mode, base)
}

/// [`validate`] for a session of `flow` that ends on our own page (an
/// app's, or a counter's Direct-QR).
pub fn validate_for(
    flow: Flow,
    req: CreateMobileSession,
    mode: Mode,
    base: &str,
) -> Result<ValidCheckout, CheckoutError> {
    let amount = checkout::check_amount(req.amount, req.provider, mode)?;
    let metadata = req.metadata.unwrap_or_default();
    checkout::check_metadata(&metadata)?;
    let customer = req.customer.unwrap_or_default();
    Ok(ValidCheckout {
        amount,
        return_url: base.to_owned(),
        cancel_url: None,
        provider: req.provider,
        flow,
        description: req.description.map(String::from),
        metadata,
        customer_name: customer.name.map(String::from),
        customer_email: customer.email.map(String::from),
        customer_phone: customer.phone.map(String::from),
        customer_address: customer.address.map(Address::stored),
        collect_address: req.collect_address.unwrap_or(false),
        client_secret_sha256: None,
    })
}

/// A new mobile session and its client secret (shown once).
#[derive(Clone, Debug)]
pub struct Created {
    pub session: CheckoutSession,
    pub client_secret: String,
}

fn new_client_secret() -> String {
    let random: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(SECRET_RANDOM_LEN)
        .map(char::from)
        .collect();
    format!("{SECRET_PREFIX}{random}")
}

/// Creates the session with a fresh client secret, stored only as its
/// hash. A retry whose first run committed (its fence) finds that run's
/// session, whose secret was never answered: it gets a new one, and the
/// first stops working.
pub async fn create(
    deps: &Deps,
    who: &Principal,
    mut valid: ValidCheckout,
    now: Timestamp,
    fence: Option<&Fence>,
) -> Result<Created, MobileError> {
    let client_secret = new_client_secret();
    let hash = hash_secret(&client_secret);
    valid.client_secret_sha256 = Some(hash.clone());
    let store = &*deps.store;
    let mut session = checkout::create_in(store, &Creator::of(who), valid, now, fence).await?;
    if session.client_secret_sha256.as_deref() != Some(hash.as_str()) {
        let update = Changes::new().set_some(CheckoutSession::CLIENT_SECRET_SHA256, hash.as_str());
        store
            .update(
                &CheckoutSession::key(&session.id),
                update.into(),
                Some(Cond::Exists),
            )
            .await?;
        session.client_secret_sha256 = Some(hash);
    }
    Ok(Created {
        session,
        client_secret,
    })
}

/// Whether `given` is the session's client secret (constant time over the
/// hashes; an absent, oversized or non-mobile one never is).
pub fn secret_matches(session: &CheckoutSession, given: Option<&str>) -> bool {
    let (Some(given), Some(stored)) = (given, session.client_secret_sha256.as_deref()) else {
        return false;
    };
    if session.flow != Flow::Mobile || given.is_empty() || given.len() > SECRET_MAX_LEN {
        return false;
    }
    let hash = hash_secret(given);
    hash.as_bytes().ct_eq(stored.as_bytes()).into()
}

/// The mobile session `id` of the publishable key's project and mode, if
/// `secret` is its client secret; otherwise [`MobileError::NotFound`],
/// whichever part was wrong.
pub async fn open(
    deps: &Deps,
    who: &Principal,
    id: &SessionId,
    secret: Option<&str>,
    now: Timestamp,
) -> Result<CheckoutSession, MobileError> {
    checkout::find_at(&*deps.store, who.tenant(), id, now)
        .await?
        .filter(|s| secret_matches(s, secret))
        .ok_or_else(|| MobileError::NotFound(id.to_string()))
}

/// The app starts paying with `provider`: the hosted flow's attempt start
/// (a newer attempt supersedes an open one; at most ten per session).
/// Fonepay pays by QR.
pub async fn start(
    deps: &Deps,
    session: CheckoutSession,
    provider: Provider,
    address: Option<checkout::StoredAddress>,
    base: &str,
    now: Timestamp,
) -> Result<Started, MobileError> {
    let choice = PayChoice {
        provider: Some(provider),
        fonepay_web: false,
        address,
        from_page: false,
    };
    Ok(attempts::start_for(deps, session, choice, base, now).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::Kind;

    fn body(amount: i64, provider: Option<Provider>) -> CreateMobileSession {
        CreateMobileSession {
            amount,
            provider,
            currency: None,
            description: None,
            metadata: None,
            customer: None,
            collect_address: None,
        }
    }

    #[test]
    fn a_mobile_session_has_no_shop_and_keeps_the_providers_bounds() {
        let v = validate(body(50_000, None), Mode::Sandbox, "http://127.0.0.1:8080")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.flow, Flow::Mobile);
        assert!(!v.flow.has_shop());
        assert_eq!(v.return_url, "http://127.0.0.1:8080");
        assert!(validate(body(0, None), Mode::Sandbox, "x").is_err());
        // Khalti's minimum is NPR 10.
        assert!(validate(body(999, Some(Provider::Khalti)), Mode::Sandbox, "x").is_err());
        assert!(matches!(
            validate(body(100_001, Some(Provider::Fonepay)), Mode::Sandbox, "x"),
            Err(CheckoutError::FonepaySandboxCap(_))
        ));
    }

    fn session(flow: &str, hash: Option<String>) -> CheckoutSession {
        let now = crate::testenv::at("2026-11-26T10:00:00Z");
        serde_json::from_value(serde_json::json!({
            "id": "cs_01", "project_id": "prj_1", "mode": "sandbox", "flow": flow,
            "api_key_id": "key_1", "amount": 50000, "currency": "NPR",
            "status": "pending", "return_url": "http://x", "metadata": {},
            "expires_at": now.plus(chrono::Duration::minutes(30)).to_rfc3339(),
            "created_at": now.to_rfc3339(), "updated_at": now.to_rfc3339(),
            "client_secret_sha256": hash,
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_the_sessions_own_secret_opens_it() {
        let secret = new_client_secret();
        assert!(secret.starts_with(SECRET_PREFIX));
        assert_eq!(secret.len(), SECRET_PREFIX.len() + SECRET_RANDOM_LEN);
        assert_ne!(secret, new_client_secret());
        let s = session("mobile", Some(hash_secret(&secret)));
        assert!(secret_matches(&s, Some(&secret)));
        assert!(!secret_matches(&s, None));
        assert!(!secret_matches(&s, Some("")));
        assert!(!secret_matches(&s, Some(&new_client_secret())));
        assert!(!secret_matches(&s, Some(&format!("{secret}x"))));
        assert!(!secret_matches(&s, Some(&"a".repeat(4096))));
        // A session without a secret, or of another flow, opens for none.
        assert!(!secret_matches(&session("mobile", None), Some(&secret)));
        let hosted = session("hosted", Some(hash_secret(&secret)));
        assert!(!secret_matches(&hosted, Some(&secret)));
    }

    #[test]
    fn a_wrong_secret_reads_as_an_unknown_id() {
        let r: Refusal = MobileError::NotFound("cs_x".into()).into();
        assert_eq!((r.kind, r.code), (Kind::NotFound, "not_found"));
        let r: Refusal = MobileError::Attempt(AttemptError::FonepayCap("cap".into())).into();
        assert_eq!(
            (r.kind, r.code),
            (Kind::Unprocessable, "fonepay_sandbox_cap")
        );
    }
}
