//! Where the provider clients send their calls: one [`ProviderConfig`] per
//! mode, from the environment, or pointed at one simulator base URL.
//!
//! | Variable (sandbox / live) | Sandbox default | Live default |
//! |---|---|---|
//! | `DHUKUTI_ESEWA_FORM_URL` / `DHUKUTI_LIVE_ESEWA_FORM_URL` | `https://rc-epay.esewa.com.np/api/epay/main/v2/form` | `https://epay.esewa.com.np/api/epay/main/v2/form` |
//! | `DHUKUTI_ESEWA_STATUS_URL` / `DHUKUTI_LIVE_ESEWA_STATUS_URL` | `https://rc.esewa.com.np/api/epay/transaction/status/` | `https://epay.esewa.com.np/api/epay/transaction/status/` |
//! | `DHUKUTI_KHALTI_BASE_URL` / `DHUKUTI_LIVE_KHALTI_BASE_URL` | `https://dev.khalti.com` | `https://khalti.com` |
//! | `DHUKUTI_FONEPAY_BASE_URL` / `DHUKUTI_LIVE_FONEPAY_BASE_URL` | `https://merchantapi.fonepay.com/api` | same |
//! | `DHUKUTI_FONEPAY_WEB_URL` / `DHUKUTI_LIVE_FONEPAY_WEB_URL` | `https://clientapi.fonepay.com/api/merchantRequest` | same |
//! | `DHUKUTI_PROVIDERS_BASE_URL` / `DHUKUTI_LIVE_PROVIDERS_BASE_URL` | unset | unset |
//! | `DHUKUTI_PROVIDER_TIMEOUT_MS` (both modes) | `10000` | `10000` |
//!
//! - `*_PROVIDERS_BASE_URL` points every provider of the mode at one
//!   simulator ([`ProviderConfig::for_base`]); the per-provider variables
//!   still override it.
//! - The Khalti base is the host root: the API lives under `/api/v2/` and
//!   refunds under `/api/merchant-transaction/`. A value ending in
//!   `/api/v2` (as Khalti's docs print the base) is accepted and trimmed.
//! - The Fonepay base ends in `/api`; the calls are
//!   `{base}/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQr…`.
//! - **Fonepay has no sandbox** (decisions, "Sandbox fonepay"): sandbox
//!   mode uses the project's real credentials under caps, so its default
//!   hosts are the live ones. Fonepay's own dev hosts
//!   (`https://dev-merchantapi.fonepay.com/api`, also seen as
//!   `…/convergent-merchant-web/api`, and `https://uat-new-merchant-api.fonepay.com/api`;
//!   web `https://dev-clientapi.fonepay.com/api/merchantRequest`) can be
//!   set through the variables.
//! - eSewa's UAT status host: the current docs say `rc.esewa.com.np`;
//!   several SDKs use `rc-epay.esewa.com.np`. Both are settable.

use std::time::Duration;

use crate::kinds::Mode;

/// Per-call timeout when none is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The variable holding the per-call timeout in milliseconds.
pub const TIMEOUT_ENV: &str = "DHUKUTI_PROVIDER_TIMEOUT_MS";

const MAX_TIMEOUT_MS: u64 = 120_000;

/// Real paths under each provider's host (and under a simulator's
/// `{base}/{provider}`).
pub mod paths {
    pub const ESEWA_FORM: &str = "/api/epay/main/v2/form";
    pub const ESEWA_STATUS: &str = "/api/epay/transaction/status/";
    pub const KHALTI_INITIATE: &str = "/api/v2/epayment/initiate/";
    pub const KHALTI_LOOKUP: &str = "/api/v2/epayment/lookup/";
    /// The merchant transaction list (statements: reconciliation).
    pub const KHALTI_TRANSACTIONS: &str = "/api/v2/merchant-transaction/";
    /// Followed by `{transaction_id}/refund/`.
    pub const KHALTI_REFUND_PREFIX: &str = "/api/merchant-transaction/";
    /// Under the Fonepay API base (which ends in `/api`).
    pub const FONEPAY_QR_CREATE: &str =
        "/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload";
    pub const FONEPAY_QR_STATUS: &str =
        "/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrGetStatus";
    /// The web redirect, under the Fonepay web host.
    pub const FONEPAY_WEB: &str = "/api/merchantRequest";
}

/// The provider endpoints of one mode, and the per-call timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderConfig {
    /// eSewa's payment form (the browser POSTs here).
    pub esewa_form_url: String,
    /// eSewa's status check (server GET).
    pub esewa_status_url: String,
    /// Khalti's host root, without `/api/v2`.
    pub khalti_base_url: String,
    /// Fonepay's merchant API base, ending in `/api`.
    pub fonepay_api_url: String,
    /// Fonepay's web redirect (`…/api/merchantRequest`).
    pub fonepay_web_url: String,
    /// Per provider call, connection included.
    pub timeout: Duration,
}

/// A configuration variable with an unusable value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {problem}")]
pub struct ConfigError {
    pub var: String,
    pub problem: String,
}

fn trim_slash(url: &str) -> String {
    url.trim().trim_end_matches('/').to_owned()
}

fn khalti_root(url: &str) -> String {
    let u = trim_slash(url);
    let u = u.strip_suffix("/api/v2").map(str::to_owned).unwrap_or(u);
    u.strip_suffix("/api").map(str::to_owned).unwrap_or(u)
}

impl ProviderConfig {
    /// The providers' test hosts (Fonepay: live, it has no sandbox).
    pub fn sandbox() -> Self {
        ProviderConfig {
            esewa_form_url: "https://rc-epay.esewa.com.np/api/epay/main/v2/form".into(),
            esewa_status_url: "https://rc.esewa.com.np/api/epay/transaction/status/".into(),
            khalti_base_url: "https://dev.khalti.com".into(),
            fonepay_api_url: "https://merchantapi.fonepay.com/api".into(),
            fonepay_web_url: "https://clientapi.fonepay.com/api/merchantRequest".into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The providers' production hosts.
    pub fn live() -> Self {
        ProviderConfig {
            esewa_form_url: "https://epay.esewa.com.np/api/epay/main/v2/form".into(),
            esewa_status_url: "https://epay.esewa.com.np/api/epay/transaction/status/".into(),
            khalti_base_url: "https://khalti.com".into(),
            fonepay_api_url: "https://merchantapi.fonepay.com/api".into(),
            fonepay_web_url: "https://clientapi.fonepay.com/api/merchantRequest".into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The default hosts of `mode`.
    pub fn for_mode(mode: Mode) -> Self {
        match mode {
            Mode::Sandbox => Self::sandbox(),
            Mode::Live => Self::live(),
        }
    }

    /// Every provider at one simulator: `{base}/{provider}` + the
    /// provider's real path, e.g. `{base}/esewa/api/epay/main/v2/form`,
    /// `{base}/khalti/api/v2/epayment/initiate/`,
    /// `{base}/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload`.
    pub fn for_base(base: &str) -> Self {
        let b = trim_slash(base);
        ProviderConfig {
            esewa_form_url: format!("{b}/esewa{}", paths::ESEWA_FORM),
            esewa_status_url: format!("{b}/esewa{}", paths::ESEWA_STATUS),
            khalti_base_url: format!("{b}/khalti"),
            fonepay_api_url: format!("{b}/fonepay/api"),
            fonepay_web_url: format!("{b}/fonepay{}", paths::FONEPAY_WEB),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same endpoints with another per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// `mode`'s endpoints from the process environment (see the module
    /// notes for the variables).
    pub fn from_env(mode: Mode) -> Result<Self, ConfigError> {
        Self::from_lookup(mode, |name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `get`.
    pub fn from_lookup(
        mode: Mode,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let prefix = match mode {
            Mode::Sandbox => "DHUKUTI_",
            Mode::Live => "DHUKUTI_LIVE_",
        };
        let read = |suffix: &str| -> Result<Option<String>, ConfigError> {
            let var = format!("{prefix}{suffix}");
            match get(&var).map(|v| v.trim().to_owned()) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => {
                    let lower = v.to_ascii_lowercase();
                    let rest = lower
                        .strip_prefix("https://")
                        .or_else(|| lower.strip_prefix("http://"));
                    match rest {
                        Some(host) if !host.is_empty() && !v.chars().any(char::is_whitespace) => {
                            Ok(Some(v))
                        }
                        _ => Err(ConfigError {
                            var,
                            problem: format!("must be an http:// or https:// URL, got {v:?}"),
                        }),
                    }
                }
            }
        };
        let mut cfg = match read("PROVIDERS_BASE_URL")? {
            Some(base) => Self::for_base(&base),
            None => Self::for_mode(mode),
        };
        if let Some(v) = read("ESEWA_FORM_URL")? {
            cfg.esewa_form_url = v;
        }
        if let Some(v) = read("ESEWA_STATUS_URL")? {
            cfg.esewa_status_url = v;
        }
        if let Some(v) = read("KHALTI_BASE_URL")? {
            cfg.khalti_base_url = khalti_root(&v);
        }
        if let Some(v) = read("FONEPAY_BASE_URL")? {
            cfg.fonepay_api_url = trim_slash(&v);
        }
        if let Some(v) = read("FONEPAY_WEB_URL")? {
            cfg.fonepay_web_url = v;
        }
        if let Some(ms) = get(TIMEOUT_ENV) {
            let ms = ms.trim();
            match ms.parse::<u64>() {
                Ok(n) if (1..=MAX_TIMEOUT_MS).contains(&n) => {
                    cfg.timeout = Duration::from_millis(n);
                }
                _ => {
                    return Err(ConfigError {
                        var: TIMEOUT_ENV.into(),
                        problem: format!(
                            "must be milliseconds from 1 to {MAX_TIMEOUT_MS}, got {ms:?}"
                        ),
                    });
                }
            }
        }
        Ok(cfg)
    }

    pub fn khalti_initiate_url(&self) -> String {
        format!(
            "{}{}",
            khalti_root(&self.khalti_base_url),
            paths::KHALTI_INITIATE
        )
    }

    pub fn khalti_lookup_url(&self) -> String {
        format!(
            "{}{}",
            khalti_root(&self.khalti_base_url),
            paths::KHALTI_LOOKUP
        )
    }

    /// Khalti's merchant transaction list.
    pub fn khalti_transactions_url(&self) -> String {
        format!(
            "{}{}",
            khalti_root(&self.khalti_base_url),
            paths::KHALTI_TRANSACTIONS
        )
    }

    /// The refund URL of a Khalti `transaction_id` (checked by the caller
    /// to be a plain token).
    pub fn khalti_refund_url(&self, transaction_id: &str) -> String {
        format!(
            "{}{}{transaction_id}/refund/",
            khalti_root(&self.khalti_base_url),
            paths::KHALTI_REFUND_PREFIX
        )
    }

    pub fn fonepay_qr_create_url(&self) -> String {
        format!(
            "{}{}",
            trim_slash(&self.fonepay_api_url),
            paths::FONEPAY_QR_CREATE
        )
    }

    pub fn fonepay_qr_status_url(&self) -> String {
        format!(
            "{}{}",
            trim_slash(&self.fonepay_api_url),
            paths::FONEPAY_QR_STATUS
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn for_base_uses_the_real_paths_under_the_provider() {
        let c = ProviderConfig::for_base("http://127.0.0.1:9000/");
        assert_eq!(
            c.esewa_form_url,
            "http://127.0.0.1:9000/esewa/api/epay/main/v2/form"
        );
        assert_eq!(
            c.esewa_status_url,
            "http://127.0.0.1:9000/esewa/api/epay/transaction/status/"
        );
        assert_eq!(
            c.khalti_initiate_url(),
            "http://127.0.0.1:9000/khalti/api/v2/epayment/initiate/"
        );
        assert_eq!(
            c.khalti_lookup_url(),
            "http://127.0.0.1:9000/khalti/api/v2/epayment/lookup/"
        );
        assert_eq!(
            c.khalti_refund_url("GFq9PFS7b2iYvL8Lir9oXe"),
            "http://127.0.0.1:9000/khalti/api/merchant-transaction/GFq9PFS7b2iYvL8Lir9oXe/refund/"
        );
        assert_eq!(
            c.fonepay_qr_create_url(),
            "http://127.0.0.1:9000/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload"
        );
        assert_eq!(
            c.fonepay_qr_status_url(),
            "http://127.0.0.1:9000/fonepay/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrGetStatus"
        );
        assert_eq!(
            c.fonepay_web_url,
            "http://127.0.0.1:9000/fonepay/api/merchantRequest"
        );
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn defaults_per_mode() {
        let s = ProviderConfig::sandbox();
        assert!(
            s.esewa_form_url
                .starts_with("https://rc-epay.esewa.com.np/")
        );
        assert_eq!(
            s.khalti_initiate_url(),
            "https://dev.khalti.com/api/v2/epayment/initiate/"
        );
        assert_eq!(
            s.khalti_refund_url("T1"),
            "https://dev.khalti.com/api/merchant-transaction/T1/refund/"
        );
        let l = ProviderConfig::live();
        assert_eq!(
            l.esewa_status_url,
            "https://epay.esewa.com.np/api/epay/transaction/status/"
        );
        assert_eq!(
            l.khalti_lookup_url(),
            "https://khalti.com/api/v2/epayment/lookup/"
        );
        assert_eq!(
            l.fonepay_qr_create_url(),
            "https://merchantapi.fonepay.com/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrDownload"
        );
        // Fonepay has no sandbox: sandbox mode talks to the live hosts.
        assert_eq!(s.fonepay_api_url, l.fonepay_api_url);
        assert_eq!(s.fonepay_web_url, l.fonepay_web_url);
        assert_eq!(ProviderConfig::from_lookup(Mode::Live, lookup(&[])), Ok(l));
        assert_eq!(
            ProviderConfig::from_lookup(Mode::Sandbox, lookup(&[])),
            Ok(s)
        );
    }

    #[test]
    fn environment_overrides() {
        let env = lookup(&[
            ("DHUKUTI_PROVIDERS_BASE_URL", "http://127.0.0.1:7000"),
            ("DHUKUTI_KHALTI_BASE_URL", "https://a.khalti.com/api/v2/"),
            (
                "DHUKUTI_FONEPAY_BASE_URL",
                "https://dev-merchantapi.fonepay.com/api/",
            ),
            ("DHUKUTI_PROVIDER_TIMEOUT_MS", "2500"),
            ("DHUKUTI_LIVE_ESEWA_FORM_URL", "https://other.example/form"),
        ]);
        let c = ok(ProviderConfig::from_lookup(Mode::Sandbox, &env));
        assert_eq!(
            c.esewa_form_url,
            "http://127.0.0.1:7000/esewa/api/epay/main/v2/form"
        );
        assert_eq!(
            c.khalti_initiate_url(),
            "https://a.khalti.com/api/v2/epayment/initiate/"
        );
        assert_eq!(
            c.khalti_refund_url("X"),
            "https://a.khalti.com/api/merchant-transaction/X/refund/"
        );
        assert_eq!(
            c.fonepay_qr_status_url(),
            "https://dev-merchantapi.fonepay.com/api/merchant/merchantDetailsForThirdParty/thirdPartyDynamicQrGetStatus"
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        let l = ok(ProviderConfig::from_lookup(Mode::Live, &env));
        assert_eq!(l.esewa_form_url, "https://other.example/form");
        assert_eq!(l.khalti_base_url, "https://khalti.com");
        assert_eq!(l.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("DHUKUTI_ESEWA_STATUS_URL", "ftp://x"),
            ("DHUKUTI_KHALTI_BASE_URL", "dev.khalti.com"),
            ("DHUKUTI_PROVIDERS_BASE_URL", "http://"),
            ("DHUKUTI_FONEPAY_WEB_URL", "https://a b"),
            ("DHUKUTI_PROVIDER_TIMEOUT_MS", "0"),
            ("DHUKUTI_PROVIDER_TIMEOUT_MS", "10s"),
            ("DHUKUTI_PROVIDER_TIMEOUT_MS", "999999"),
        ] {
            let r = ProviderConfig::from_lookup(Mode::Sandbox, lookup(&[(var, value)]));
            assert_eq!(
                r.err().map(|e| e.var),
                Some(var.to_owned()),
                "{var}={value}"
            );
        }
        // Empty means unset.
        let r =
            ProviderConfig::from_lookup(Mode::Sandbox, lookup(&[("DHUKUTI_ESEWA_FORM_URL", " ")]));
        assert_eq!(r, Ok(ProviderConfig::sandbox()));
    }

    fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
        match r {
            Ok(v) => v,
            Err(e) => panic!("{e:?}"),
        }
    }
}
