//! The two kinds every record carries, below every other module: its mode
//! (sandbox or live, fixed by the API key) and, for money movements, its
//! provider; and the [`Tenant`] a call acts for (a project in a mode).
//! `domain` re-exports them.

use crate::ids::ProjectId;
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

/// Whose records a call reads and writes: one project in one mode, as
/// authentication found it (an API key, a publishable key, a dashboard
/// session). Every find and list of a caller's records takes one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant {
    pub project: ProjectId,
    pub mode: Mode,
}

impl Tenant {
    pub fn new(project: impl Into<ProjectId>, mode: Mode) -> Self {
        Tenant {
            project: project.into(),
            mode,
        }
    }

    /// Whether a record of `project_id` in `mode` is this tenant's.
    pub fn owns(&self, project_id: &str, mode: Mode) -> bool {
        *self.project == *project_id && self.mode == mode
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
