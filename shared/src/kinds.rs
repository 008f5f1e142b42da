//! The two kinds every record carries, below every other module: its mode
//! (sandbox or live, fixed by the API key) and, for money movements, its
//! provider. `domain` re-exports them.

use serde::{Deserialize, Serialize};

/// Sandbox or live: fixed by the API key, carried by every record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Sandbox,
    Live,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sandbox => "sandbox",
            Mode::Live => "live",
        }
    }

    pub fn is_live(self) -> bool {
        self == Mode::Live
    }

    /// The secret-key prefix of the mode.
    pub fn key_prefix(self) -> &'static str {
        match self {
            Mode::Sandbox => "sk_test_",
            Mode::Live => "sk_live_",
        }
    }
}

/// The payment providers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Esewa,
    Khalti,
    Fonepay,
}

impl Provider {
    pub const ALL: [Provider; 3] = [Provider::Esewa, Provider::Khalti, Provider::Fonepay];

    /// The provider named `name` (`esewa`, `khalti`, `fonepay`).
    pub fn parse(name: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Esewa => "esewa",
            Provider::Khalti => "khalti",
            Provider::Fonepay => "fonepay",
        }
    }

    /// The provider's name as people write it (`eSewa`, `Khalti`,
    /// `Fonepay`), for pages and messages.
    pub fn display_name(self) -> &'static str {
        match self {
            Provider::Esewa => "eSewa",
            Provider::Khalti => "Khalti",
            Provider::Fonepay => "Fonepay",
        }
    }
}
