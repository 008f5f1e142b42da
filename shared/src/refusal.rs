//! One refusal: what a domain operation says when it does not do what was
//! asked, in the contract's words (kind, code, message, field). Each
//! domain error converts into it beside its own definition; the edge gives
//! each kind its status in one place (`edge::refusals::status_of`, for the
//! API and the pages alike) and turns a refusal into the error envelope.

use std::fmt;

use serde_json::Value;

use crate::queue::QueueError;
use crate::store::StoreError;

/// The broad answer: the edge picks the status and `error.type` from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A field breaks its rule, or the request as a whole is malformed.
    Invalid,
    /// No API key, or not a valid one.
    Unauthenticated,
    /// The merchant's account is closed to the API (suspended).
    AccountClosed,
    /// This key is paused by its merchant.
    KeyPaused,
    /// Not allowed for this key, plan or mode.
    Forbidden,
    /// No such record for this project and mode.
    NotFound,
    /// The record moved on (its state or version) since the caller read it.
    Conflict,
    /// Well formed, but a business rule says no.
    Unprocessable,
    /// Too many; retry after [`Refusal::retry_after_secs`].
    RateLimited,
    /// A dependency was busy: retry (with the same idempotency key).
    Unavailable,
    /// Our fault: the details are in the logs, never in the answer.
    Internal,
}

/// A refused operation. Build one with the constructors; the edge never
/// needs to know which operation refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub kind: Kind,
    /// The contract's `error.code`.
    pub code: &'static str,
    pub message: String,
    /// The request field or parameter at fault (`error.param`).
    pub field: Option<String>,
    /// One object the envelope carries beside the message (`suspension`,
    /// `pause`).
    pub extra: Option<(&'static str, Value)>,
    pub retry_after_secs: Option<u64>,
}

impl Refusal {
    pub fn new(kind: Kind, code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            kind,
            code,
            message: message.into(),
            field: None,
            extra: None,
            retry_after_secs: None,
        }
    }

    /// `validation_failed`, naming the field at fault.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal::new(Kind::Invalid, "validation_failed", message).at(field)
    }

    /// `not_found` for the record `id` of the kind `what` ("payment
    /// link"): also the answer for another project's or mode's record.
    pub fn not_found(what: &str, id: &str) -> Self {
        Refusal::new(
            Kind::NotFound,
            "not_found",
            format!("No such {what}: '{id}'"),
        )
        .at("id")
    }

    /// A business rule said no (422).
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Refusal::new(Kind::Unprocessable, code, message)
    }

    /// A state or version moved on (409).
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Refusal::new(Kind::Conflict, code, message)
    }

    /// Not allowed for this key, plan or mode (403).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Refusal::new(Kind::Forbidden, code, message)
    }

    /// Our fault: `why` goes to the logs (never a secret), the caller gets
    /// a retryable 500 that says nothing more.
    pub fn internal(why: &dyn fmt::Display) -> Self {
        tracing::error!(error = %why, "operation failed");
        Refusal::new(Kind::Internal, "api_error", "internal error")
    }

    /// A dependency was busy: `why` goes to the logs, the caller retries.
    pub fn unavailable(why: &dyn fmt::Display) -> Self {
        tracing::error!(error = %why, "dependency unavailable");
        Refusal::new(Kind::Unavailable, "api_error", "unavailable")
    }

    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn with_extra(mut self, name: &'static str, value: Value) -> Self {
        self.extra = Some((name, value));
        self
    }

    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} ({field}): {}", self.code, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

impl std::error::Error for Refusal {}

/// A store failure is ours: 503 when the store was only busy (retry), 500
/// otherwise. Storage details stay in the logs.
impl From<StoreError> for Refusal {
    fn from(err: StoreError) -> Self {
        tracing::error!(error = %err, "store call failed");
        let kind = match err {
            StoreError::Unavailable(_) => Kind::Unavailable,
            _ => Kind::Internal,
        };
        Refusal::new(kind, "api_error", "store call failed")
    }
}

impl From<QueueError> for Refusal {
    fn from(err: QueueError) -> Self {
        Refusal::unavailable(&format_args!("queue send failed: {err}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_carry_the_contract_words() {
        let r = Refusal::invalid("amount", "amount must be positive");
        assert_eq!(
            (r.kind, r.code, r.field.as_deref()),
            (Kind::Invalid, "validation_failed", Some("amount"))
        );
        let r = Refusal::not_found("payment link", "plink_1");
        assert_eq!(r.message, "No such payment link: 'plink_1'");
        assert_eq!((r.kind, r.field.as_deref()), (Kind::NotFound, Some("id")));
        let r = Refusal::unprocessable("link_used", "used").retry_after(3);
        assert_eq!((r.kind, r.retry_after_secs), (Kind::Unprocessable, Some(3)));
        assert_eq!(r.to_string(), "link_used: used");
    }

    #[test]
    fn store_failures_are_ours_and_say_nothing() {
        let busy = Refusal::from(StoreError::Unavailable("throttled table x".into()));
        assert_eq!(busy.kind, Kind::Unavailable);
        let broken = Refusal::from(StoreError::Backend("secret detail".into()));
        assert_eq!(broken.kind, Kind::Internal);
        assert!(!broken.message.contains("secret"));
    }
}
