//! Everything a payment attempt needs from the outside world: the provider
//! clients of each mode, the master key that opens stored credentials,
//! and the gateway's own sandbox accounts ([`SandboxAccounts`]), which
//! eSewa and Khalti fall back to in sandbox so a new project can try
//! checkout at once. Fonepay has no sandbox and never falls back
//! (decisions, "Sandbox fonepay"). The hub never reads the store: the
//! rules look a project's credentials up
//! ([`crate::domain::credentials::for_provider`]) and hand them in.

use super::{ProviderClient, ProviderClients, ProviderConfig, ProviderError};
use crate::kinds::{Mode, Provider};
use crate::secrets::{CredentialsError, CredentialsKeys, ProviderCredentials};

/// eSewa's published UAT merchant (research notes, section 1).
pub const ESEWA_TEST_PRODUCT_CODE: &str = "EPAYTEST";
pub const ESEWA_TEST_SECRET_KEY: &str = "8gBm/:&EnhH.1/q";
/// The Khalti key the offline simulator accepts. Against Khalti's real
/// sandbox, set `DHUKUTI_SANDBOX_KHALTI_SECRET_KEY` to the gateway's own
/// key from test-admin.khalti.com.
pub const KHALTI_SIMULATOR_SECRET_KEY: &str = "live_secret_key_0d8f5c3e2b1a4f6e9d7c8b5a4e3f2d1c";

/// The gateway's own test accounts, used in sandbox by projects without
/// credentials of their own.
#[derive(Clone)]
pub struct SandboxAccounts {
    pub esewa: ProviderCredentials,
    /// `None`: Khalti's sandbox has no public key; without the gateway's
    /// own, only projects with their own Khalti test key can use it.
    pub khalti: Option<ProviderCredentials>,
}

impl std::fmt::Debug for SandboxAccounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxAccounts").finish_non_exhaustive()
    }
}

impl Default for SandboxAccounts {
    fn default() -> Self {
        SandboxAccounts {
            esewa: ProviderCredentials::Esewa {
                product_code: ESEWA_TEST_PRODUCT_CODE.into(),
                secret_key: ESEWA_TEST_SECRET_KEY.into(),
            },
            khalti: Some(ProviderCredentials::Khalti {
                secret_key: KHALTI_SIMULATOR_SECRET_KEY.into(),
            }),
        }
    }
}

impl SandboxAccounts {
    /// eSewa's published UAT merchant (or `DHUKUTI_SANDBOX_ESEWA_PRODUCT_CODE`
    /// and `DHUKUTI_SANDBOX_ESEWA_SECRET_KEY`) and the Khalti key in
    /// `DHUKUTI_SANDBOX_KHALTI_SECRET_KEY`, if any (the local gateway falls
    /// back to the simulator's key).
    pub fn from_env() -> Self {
        let get = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut accounts = SandboxAccounts {
            khalti: None,
            ..SandboxAccounts::default()
        };
        if let (Some(product_code), Some(secret_key)) = (
            get("DHUKUTI_SANDBOX_ESEWA_PRODUCT_CODE"),
            get("DHUKUTI_SANDBOX_ESEWA_SECRET_KEY"),
        ) {
            accounts.esewa = ProviderCredentials::Esewa {
                product_code,
                secret_key,
            };
        }
        if let Some(secret_key) = get("DHUKUTI_SANDBOX_KHALTI_SECRET_KEY") {
            accounts.khalti = Some(ProviderCredentials::Khalti { secret_key });
        }
        accounts
    }
}

/// Why no credentials could be had.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("no {provider} credentials for this project in {mode}")]
    NotConfigured {
        provider: &'static str,
        mode: &'static str,
    },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// Provider clients of both modes, the master key and the sandbox
/// accounts.
#[derive(Clone, Debug)]
pub struct ProviderHub {
    clients: Option<(ProviderClients, ProviderClients)>,
    keys: Option<CredentialsKeys>,
    sandbox: SandboxAccounts,
}

impl ProviderHub {
    /// A hub calling the endpoints of `sandbox` and `live`.
    pub fn new(
        sandbox: &ProviderConfig,
        live: &ProviderConfig,
        keys: Option<CredentialsKeys>,
        accounts: SandboxAccounts,
    ) -> Result<Self, ProviderError> {
        Ok(ProviderHub {
            clients: Some((ProviderClients::new(sandbox)?, ProviderClients::new(live)?)),
            keys,
            sandbox: accounts,
        })
    }

    /// A hub with no clients: every provider call answers "unavailable"
    /// (a state built for tests that never pay).
    pub fn unconfigured() -> Self {
        ProviderHub {
            clients: None,
            keys: None,
            sandbox: SandboxAccounts::default(),
        }
    }

    /// A hub with no clients but a master key: what needs only sealing
    /// and opening secrets (webhook endpoints in tests and tools).
    pub fn keys_only(keys: CredentialsKeys) -> Self {
        ProviderHub {
            clients: None,
            keys: Some(keys),
            sandbox: SandboxAccounts::default(),
        }
    }

    /// From the environment: endpoints (`ProviderConfig::from_env`) and
    /// the sandbox accounts, with the master key the caller read
    /// (`crate::app::credentials_keys`; without one only the sandbox
    /// accounts work).
    pub fn from_env(keys: Option<CredentialsKeys>) -> Result<Self, String> {
        let sandbox = ProviderConfig::from_env(Mode::Sandbox).map_err(|e| e.to_string())?;
        let live = ProviderConfig::from_env(Mode::Live).map_err(|e| e.to_string())?;
        ProviderHub::new(&sandbox, &live, keys, SandboxAccounts::from_env())
            .map_err(|e| e.to_string())
    }

    /// The master key, when one is configured.
    pub fn keys(&self) -> Option<&CredentialsKeys> {
        self.keys.as_ref()
    }

    /// The client of `provider` in `mode`.
    pub fn client(
        &self,
        mode: Mode,
        provider: Provider,
    ) -> Result<&dyn ProviderClient, ProviderError> {
        match &self.clients {
            Some((sandbox, live)) => Ok(match mode {
                Mode::Sandbox => sandbox.get(provider),
                Mode::Live => live.get(provider),
            }),
            None => Err(ProviderError::Unavailable(
                "provider clients are not configured".into(),
            )),
        }
    }

    /// The Khalti client of `mode` itself (its transaction list is no
    /// part of [`ProviderClient`]).
    pub fn khalti(&self, mode: Mode) -> Result<&super::khalti::KhaltiClient, ProviderError> {
        match &self.clients {
            Some((sandbox, live)) => Ok(match mode {
                Mode::Sandbox => &sandbox.khalti,
                Mode::Live => &live.khalti,
            }),
            None => Err(ProviderError::Unavailable(
                "provider clients are not configured".into(),
            )),
        }
    }

    /// The gateway's own test account at `provider` in `mode`, for a
    /// project without credentials of its own: sandbox eSewa and Khalti
    /// only (Fonepay has no sandbox; live never falls back).
    pub fn sandbox_account(&self, mode: Mode, provider: Provider) -> Option<ProviderCredentials> {
        match (mode, provider) {
            (Mode::Sandbox, Provider::Esewa) => Some(self.sandbox.esewa.clone()),
            (Mode::Sandbox, Provider::Khalti) => self.sandbox.khalti.clone(),
            _ => None,
        }
    }

    /// The same hub with other sandbox accounts.
    pub fn with_sandbox_accounts(mut self, accounts: SandboxAccounts) -> Self {
        self.sandbox = accounts;
        self
    }
}
