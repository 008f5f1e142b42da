//! Domain refusals as answers: the one place a [`Refusal`] (what any
//! domain operation says when it does not do what was asked) becomes the
//! contract's envelope, status and headers.

use http::StatusCode;
use shared::domain::account::AuthError;
use shared::domain::checkout::CheckoutError;
use shared::domain::invoices::InvoiceError;
use shared::domain::links::LinkError;
use shared::domain::mobile::MobileError;
use shared::domain::qr::QrError;
use shared::domain::refunds::RefundError;
use shared::domain::sms::SmsError;
use shared::domain::webhooks::WebhookError;
use shared::refusal::{Kind, Refusal};

use crate::{ApiError, ErrorType};

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let (status, kind) = match r.kind {
            Kind::Invalid => (StatusCode::BAD_REQUEST, ErrorType::InvalidRequestError),
            Kind::Unauthenticated => return ApiError::api_key_invalid(r.message),
            Kind::AccountClosed => (StatusCode::FORBIDDEN, ErrorType::AccountError),
            Kind::KeyPaused => (StatusCode::LOCKED, ErrorType::AccountError),
            Kind::Forbidden => (StatusCode::FORBIDDEN, ErrorType::PermissionError),
            Kind::NotFound => (StatusCode::NOT_FOUND, ErrorType::InvalidRequestError),
            Kind::Conflict => (StatusCode::CONFLICT, ErrorType::InvalidRequestError),
            Kind::Unprocessable => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorType::InvalidRequestError,
            ),
            Kind::RateLimited => (StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimitError),
            // Ours: the logs have the detail (the refusal logged it when it
            // was made); the answer says only what to do.
            Kind::Unavailable => return ApiError::unavailable(),
            Kind::Internal => return ApiError::internal(),
        };
        let mut e = ApiError::new(status, kind, r.code, r.message);
        if let Some(field) = r.field {
            e = e.with_param(field);
        }
        if let Some((name, value)) = r.extra {
            e = e.with_extra(name, value);
        }
        if let Some(secs) = r.retry_after_secs {
            e = e.with_header("retry-after", secs.to_string());
        }
        e
    }
}

/// Every domain error a handler returns answers through its [`Refusal`],
/// so a handler writes `?` and nothing else.
macro_rules! answered_by_refusal {
    ($($error:ty),* $(,)?) => {
        $(
            impl From<$error> for ApiError {
                fn from(err: $error) -> Self {
                    Refusal::from(err).into()
                }
            }
        )*
    };
}

answered_by_refusal!(
    AuthError,
    CheckoutError,
    InvoiceError,
    LinkError,
    MobileError,
    QrError,
    RefundError,
    SmsError,
    WebhookError,
);

#[cfg(test)]
mod tests {
    use super::*;
    use shared::store::StoreError;

    #[test]
    fn each_kind_has_its_status_and_type() {
        let cases = [
            (
                Refusal::invalid("amount", "m"),
                400,
                ErrorType::InvalidRequestError,
            ),
            (
                Refusal::new(Kind::AccountClosed, "account_suspended", "m"),
                403,
                ErrorType::AccountError,
            ),
            (
                Refusal::new(Kind::KeyPaused, "token_paused", "m"),
                423,
                ErrorType::AccountError,
            ),
            (
                Refusal::forbidden("spend_cap_exceeded", "m"),
                403,
                ErrorType::PermissionError,
            ),
            (
                Refusal::not_found("invoice", "inv_1"),
                404,
                ErrorType::InvalidRequestError,
            ),
            (
                Refusal::conflict("version_conflict", "m"),
                409,
                ErrorType::InvalidRequestError,
            ),
            (
                Refusal::unprocessable("link_used", "m"),
                422,
                ErrorType::InvalidRequestError,
            ),
            (
                Refusal::new(Kind::RateLimited, "rate_limited", "m").retry_after(7),
                429,
                ErrorType::RateLimitError,
            ),
        ];
        for (refusal, status, kind) in cases {
            let code = refusal.code;
            let field = refusal.field.clone();
            let e = ApiError::from(refusal);
            assert_eq!((e.status.as_u16(), e.kind, e.code), (status, kind, code));
            assert_eq!(e.param, field);
        }
        let limited =
            ApiError::from(Refusal::new(Kind::RateLimited, "rate_limited", "m").retry_after(7));
        assert_eq!(limited.headers, vec![("retry-after", "7".to_owned())]);
        let unauthenticated =
            ApiError::from(Refusal::new(Kind::Unauthenticated, "api_key_invalid", "No"));
        assert_eq!(unauthenticated, ApiError::api_key_invalid("No"));
    }

    #[test]
    fn our_failures_say_nothing_of_their_cause() {
        let busy = ApiError::from(Refusal::from(StoreError::Unavailable("table x".into())));
        assert_eq!(busy, ApiError::unavailable());
        let broken = ApiError::from(Refusal::from(StoreError::Backend("detail".into())));
        assert_eq!(broken, ApiError::internal());
        assert_eq!(
            ApiError::from(Refusal::internal(&"why")),
            ApiError::internal()
        );
    }
}
