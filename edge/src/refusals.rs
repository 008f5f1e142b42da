//! Domain refusals as answers: the envelope, status and code of each.

use http::StatusCode;
use shared::domain::checkout::CheckoutError;

use crate::{ApiError, ErrorType};

/// The one place checkout refusals become answers (the checkout and
/// invoices functions).
pub fn checkout(err: CheckoutError) -> ApiError {
    match err {
        CheckoutError::Invalid { field, message } => ApiError::validation(field, message),
        CheckoutError::FonepaySandboxCap(message) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::InvalidRequestError,
            "fonepay_sandbox_cap",
            message,
        )
        .with_param("amount"),
        CheckoutError::ProviderUnavailable(p) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::InvalidRequestError,
            "provider_unavailable",
            format!(
                "{} is not enabled for this project in this mode; see GET /v1/providers",
                p.as_str()
            ),
        )
        .with_param("provider"),
        CheckoutError::SpendCapExceeded { cap } => ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorType::PermissionError,
            "spend_cap_exceeded",
            format!(
                "This checkout would take the key's volume this month above its spend cap of {cap} paisa"
            ),
        ),
        CheckoutError::Store(e) => e.into(),
    }
}
