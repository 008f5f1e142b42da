//! The payment providers: eSewa ePay v2, Khalti KPG-2 and Fonepay, behind
//! one trait, and their signatures.
//!
//! - [`ProviderClient`]: start a payment attempt ([`Handoff`]: a form to
//!   auto-post, a page to redirect to, or a QR to show), ask the provider
//!   server-to-server what became of it ([`ProviderStatus`]), and refund
//!   (Khalti only; eSewa and Fonepay refunds are manual in their portals).
//! - [`ProviderClients`]: the three clients of one mode, sharing one HTTPS
//!   client, built from a [`ProviderConfig`]. Credentials are per project
//!   and passed to every call ([`ProviderCredentials`]).
//! - Callback helpers (pure, no network): [`esewa::verify_callback`],
//!   [`khalti::parse_return`] (untrusted by design),
//!   [`fonepay::verify_web_return`], [`fonepay::parse_ws_frame`].
//! - [`amount`]: paisa to and from the providers' rupee strings, exactly.
//!
//! A browser return is never proof of payment: only [`ProviderClient::status`]
//! is (decisions, "Payments").
//!
//! The protocols are in `../shared/research/providers.md`; the choices where
//! it is silent or unconfirmed are documented on each module.

pub mod amount;
pub mod config;
pub mod esewa;
pub mod fonepay;
pub mod fonepay_ws;
pub mod hub;
pub mod khalti;
pub mod mail;
pub mod probe;
pub mod sign;
pub mod sms;
pub mod transport;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
pub(crate) mod mock;

use async_trait::async_trait;

use crate::kinds::Provider;
use crate::money::Paisa;
pub use crate::secrets::ProviderCredentials;
pub use config::{ConfigError, ProviderConfig};
pub use esewa::EsewaClient;
pub use fonepay::FonepayClient;
pub use hub::{ProviderHub, SandboxAccounts};
pub use khalti::KhaltiClient;

const REDACTED: &str = "[redacted]";

/// One provider's API, for any project: credentials come with each call.
#[async_trait]
pub trait ProviderClient: Send + Sync {
    fn provider(&self) -> Provider;

    /// Start `attempt`: what the customer's browser (or the hosted page)
    /// must do next. eSewa's form and Fonepay's web redirect are built
    /// locally; Khalti and the Fonepay QR are a call to the provider.
    async fn initiate(
        &self,
        creds: &ProviderCredentials,
        attempt: &Attempt,
    ) -> Result<Handoff, ProviderError>;

    /// The server-to-server check: what the provider says about the
    /// attempt. The only source of truth for `success`.
    async fn status(
        &self,
        creds: &ProviderCredentials,
        query: &StatusQuery,
    ) -> Result<ProviderStatus, ProviderError>;

    /// Refund `amount` (all of it when `None`) of the payment the provider
    /// knows as `provider_ref` (Khalti: the lookup's `transaction_id`, not
    /// the `pidx`). `mobile`: the payer's Khalti id, needed by Khalti for
    /// payments made from a bank. eSewa and Fonepay: `Unsupported`.
    async fn refund(
        &self,
        creds: &ProviderCredentials,
        provider_ref: &str,
        amount: Option<Paisa>,
        mobile: Option<&str>,
    ) -> Result<RefundOutcome, ProviderError>;
}

/// How the customer pays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Channel {
    /// In the browser: eSewa's form, Khalti's page, Fonepay's web redirect.
    #[default]
    Browser,
    /// By scanning a QR (Fonepay dynamic QR only).
    Qr,
}

/// The payer, as far as the merchant told us. Khalti shows it on its page.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CustomerInfo {
    pub name: Option<String>,
    pub email: Option<String>,
    pub phone: Option<String>,
}

impl std::fmt::Debug for CustomerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &Option<String>| v.as_ref().map(|_| REDACTED);
        f.debug_struct("CustomerInfo")
            .field("name", &shown(&self.name))
            .field("email", &shown(&self.email))
            .field("phone", &shown(&self.phone))
            .finish()
    }
}

/// One attempt to pay, as a provider needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Ours, unique per attempt: eSewa `transaction_uuid`, Khalti
    /// `purchase_order_id`, Fonepay `prn`/`PRN`. Must suit every provider:
    /// letters, digits and `-`, at most 20 characters ([`new_reference`]).
    pub reference: String,
    pub amount: Paisa,
    /// On our server: eSewa `success_url`, Khalti `return_url`, Fonepay `RU`.
    pub return_url: String,
    /// On our server: eSewa `failure_url` (cancelled, failed or pending);
    /// `return_url` when `None`. The others return to `return_url` always.
    pub failure_url: Option<String>,
    /// Khalti `website_url`: the merchant's site.
    pub website_url: String,
    /// Khalti `purchase_order_name`, Fonepay `remarks1`/`R1`.
    pub order_name: String,
    pub customer: Option<CustomerInfo>,
    pub channel: Channel,
}

/// What to do with the customer after [`ProviderClient::initiate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// Auto-submit an HTML form (`POST`, form-urlencoded) to `action` with
    /// `fields`, in order (eSewa).
    AutoPostForm {
        action: String,
        fields: Vec<(String, String)>,
    },
    /// Send the browser to `url` (Khalti's payment page, with the `pidx`
    /// as `provider_ref`; Fonepay's web redirect, without).
    Redirect {
        url: String,
        provider_ref: Option<String>,
    },
    /// Show `qr_message` as a QR code; `websocket_url` pushes hints (never
    /// proof) while the payer scans and pays (Fonepay dynamic QR).
    Qr {
        qr_message: String,
        websocket_url: Option<String>,
        provider_ref: Option<String>,
    },
}

/// What [`ProviderClient::status`] needs: our reference, the amount we
/// asked for (eSewa's check repeats it, as the same rupee string) and the
/// provider's id from [`Handoff`] (Khalti's `pidx`; required there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusQuery {
    pub reference: String,
    pub amount: Paisa,
    pub provider_ref: Option<String>,
}

/// The provider's answer about an attempt, mapped onto one vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderState {
    /// eSewa `COMPLETE`, Khalti `Completed`, Fonepay `success`.
    Paid,
    /// eSewa `PENDING`, Khalti `Pending` and `Initiated`, Fonepay `pending`.
    Pending,
    /// Khalti `Failed`, Fonepay `failed`.
    Failed,
    /// eSewa `CANCELED`, Khalti `User canceled` (and `Canceled`).
    Cancelled,
    /// eSewa `FULL_REFUND`/`PARTIAL_REFUND`, Khalti `Refunded`/`Partially Refunded`.
    Refunded { partial: bool },
    /// eSewa `AMBIGUOUS`, and any status word we do not know: hold and ask
    /// again, or review by hand.
    Ambiguous,
    /// eSewa `NOT_FOUND` (session ended at eSewa, or unknown), Khalti's
    /// "Not found." for an unknown `pidx`.
    NotFound,
    /// Khalti `Expired`.
    Expired,
}

impl ProviderState {
    /// Whether the provider will not move the attempt on by itself any more
    /// (refunds aside).
    pub fn is_final(self) -> bool {
        !matches!(self, ProviderState::Pending | ProviderState::Ambiguous)
    }
}

/// The server-to-server answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderStatus {
    pub state: ProviderState,
    /// What the provider says was asked or paid, when it says (eSewa
    /// `total_amount`, Khalti `total_amount`; Fonepay's status has none).
    pub amount: Option<Paisa>,
    /// The provider's reference of the payment: eSewa `ref_id`, Khalti
    /// `transaction_id` (what refunds need), Fonepay `fonepayTraceId`.
    pub provider_ref: Option<String>,
    /// The provider's fee for the payment, when its answer states one
    /// (Khalti's lookup `fee`, paisa); `None` for eSewa and Fonepay, whose
    /// status answers carry none.
    pub fee: Option<Paisa>,
    /// The provider's status word as received, for logs and reviews.
    pub raw_status: String,
}

/// A refund the provider accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundOutcome {
    /// The provider's message, e.g. "Transaction refund successful.".
    pub message: String,
}

/// Why a provider call did not give an answer we can use. Messages never
/// hold a secret; provider texts are shortened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// No answer in time. The provider may still have acted (a refund may
    /// have gone through): resolve with a later status call.
    #[error("the provider did not answer in time")]
    Timeout,
    /// Connection failure, 5xx, 429, or the provider saying it is down.
    /// Safe to retry.
    #[error("the provider is unavailable: {0}")]
    Unavailable(String),
    /// The provider refused the request (bad signature, unknown merchant,
    /// invalid field, wrong key...). Retrying the same request will not help.
    #[error("the provider refused the request: {code}: {message}")]
    Rejected { code: String, message: String },
    /// An answer we cannot read.
    #[error("unexpected answer from the provider: {0}")]
    Protocol(String),
    /// The provider has no such operation (eSewa/Fonepay refunds, QR on
    /// eSewa/Khalti).
    #[error("{0}")]
    Unsupported(String),
    /// Our own request cannot be made: credentials of another provider, a
    /// reference or amount the provider cannot take, a missing `pidx`.
    /// Nothing was sent.
    #[error("invalid provider request: {0}")]
    Invalid(String),
}

impl ProviderError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProviderError::Timeout | ProviderError::Unavailable(_))
    }
}

/// A browser callback that cannot be believed or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackError {
    #[error("malformed callback: {0}")]
    Malformed(String),
    #[error("the callback's signature does not verify")]
    BadSignature,
    #[error("the callback names another merchant")]
    MerchantMismatch,
    #[error("credentials of another provider")]
    WrongCredentials,
}

/// A fresh attempt reference that suits every provider: 20 characters of
/// uppercase Crockford base32, the first 10 the time in milliseconds (so
/// references sort by creation), the last 10 random (50 bits).
pub fn new_reference() -> String {
    let text = ulid::Ulid::new().to_string();
    let head = text.get(..10).unwrap_or_default();
    let tail = text.get(16..).unwrap_or_default();
    format!("{head}{tail}")
}

/// The three clients of one mode, sharing one HTTPS connection pool.
#[derive(Clone, Debug)]
pub struct ProviderClients {
    pub esewa: EsewaClient,
    pub khalti: KhaltiClient,
    pub fonepay: FonepayClient,
}

impl ProviderClients {
    pub fn new(config: &ProviderConfig) -> Result<Self, ProviderError> {
        let transport = transport::Transport::new(config.timeout);
        Ok(ProviderClients {
            esewa: EsewaClient::new(config, transport.clone()),
            khalti: KhaltiClient::new(config, transport.clone()),
            fonepay: FonepayClient::new(config, transport),
        })
    }

    pub fn get(&self, provider: Provider) -> &dyn ProviderClient {
        match provider {
            Provider::Esewa => &self.esewa,
            Provider::Khalti => &self.khalti,
            Provider::Fonepay => &self.fonepay,
        }
    }
}

/// `text` cut to at most `max` characters (on a character boundary).
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// Whether `reference` suits every provider (see [`Attempt::reference`]).
pub(crate) fn check_reference(reference: &str, max: usize) -> Result<(), ProviderError> {
    if reference.is_empty()
        || reference.len() > max
        || !reference
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ProviderError::Invalid(format!(
            "reference {:?} must be 1-{max} letters, digits or '-'",
            clip(reference, 40)
        )));
    }
    Ok(())
}

pub(crate) fn check_amount(amount: Paisa) -> Result<(), ProviderError> {
    if amount == Paisa::ZERO {
        return Err(ProviderError::Invalid("amount must be positive".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_suit_every_provider_and_sort() {
        let a = new_reference();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_reference();
        assert_eq!(a.len(), 20);
        assert!(a < b, "{a} {b}");
        assert_ne!(a, b);
        for r in [&a, &b] {
            assert!(check_reference(r, 20).is_ok());
            assert!(
                r.bytes()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            );
        }
        for bad in ["", "pay_01jd", "a b", "x".repeat(21).as_str(), "ü"] {
            assert!(matches!(
                check_reference(bad, 20),
                Err(ProviderError::Invalid(_))
            ));
        }
    }

    #[test]
    fn clipping_is_character_safe() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("नेपाल", 2), "ने…");
        assert_eq!(clip("abcdef", 3), "abc…");
    }

    #[test]
    fn customer_info_is_redacted_in_debug() {
        let a = Attempt {
            reference: "R1".into(),
            amount: Paisa::ZERO,
            return_url: "https://x/r".into(),
            failure_url: None,
            website_url: "https://x".into(),
            order_name: "Order".into(),
            customer: Some(CustomerInfo {
                name: Some("Ram Bahadur".into()),
                email: Some("ram@example.com".into()),
                phone: Some("9800000001".into()),
            }),
            channel: Channel::Browser,
        };
        let text = format!("{a:?}");
        for secret in ["Ram Bahadur", "ram@example.com", "9800000001"] {
            assert!(!text.contains(secret), "{text}");
        }
    }

    #[test]
    fn retryable_errors() {
        assert!(ProviderError::Timeout.is_retryable());
        assert!(ProviderError::Unavailable("503".into()).is_retryable());
        assert!(!ProviderError::Protocol("x".into()).is_retryable());
        assert!(
            !ProviderError::Rejected {
                code: "406".into(),
                message: "Data Validation Failed".into()
            }
            .is_retryable()
        );
        assert!(ProviderState::Paid.is_final());
        assert!(!ProviderState::Ambiguous.is_final());
        assert!(!ProviderState::Pending.is_final());
    }
}
