//! Answers several resource groups share.

use serde::Serialize;

/// The answer of a delete (a payment link) or a discard (a draft invoice):
/// the record is gone.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Deleted {
    /// Always `true`.
    pub deleted: bool,
    pub id: String,
    pub livemode: bool,
}

impl Deleted {
    pub fn of(id: String, mode: shared::domain::Mode) -> Deleted {
        Deleted {
            deleted: true,
            id,
            livemode: mode.is_live(),
        }
    }
}
