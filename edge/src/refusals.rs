//! Domain refusals as answers: the one place a [`Refusal`] (what any
//! domain operation says when it does not do what was asked) becomes the
//! contract's envelope, status and headers. The status of a kind
//! ([`status_of`]) is also what the dashboard's and hosted pages answer.

use http::StatusCode;
use shared::domain::account::AuthError;
use shared::domain::billing::customers::BillingError;
use shared::domain::billing::dunning::DunningError;
use shared::domain::billing::invoice::BillingInvoiceError;
use shared::domain::billing::invoice::collect::CollectError;
use shared::domain::billing::test_clock::TestClockError;
use shared::domain::checkout::CheckoutError;
use shared::domain::invoices::InvoiceError;
use shared::domain::links::LinkError;
use shared::domain::mobile::MobileError;
use shared::domain::qr::QrError;
use shared::domain::reconciliation::runs::RunError;
use shared::domain::reconciliation::uploads::UploadError;
use shared::domain::refunds::RefundError;
use shared::domain::reports::ReportError;
use shared::domain::sms::SmsError;
use shared::domain::webhooks::WebhookError;
use shared::refusal::{Kind, Refusal};

use crate::{ApiError, ErrorType};

/// The status of each kind of refusal: the only place a kind becomes an
/// HTTP status. The API's envelope, the dashboard's pages and the hosted
/// pages all answer with it; a page chooses only its words.
pub fn status_of(kind: Kind) -> StatusCode {
    match kind {
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
        Kind::AccountClosed | Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::KeyPaused => StatusCode::LOCKED,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        Kind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let kind = match r.kind {
            Kind::Invalid | Kind::NotFound | Kind::Conflict | Kind::Unprocessable => {
                ErrorType::InvalidRequestError
            }
            Kind::Unauthenticated => return ApiError::api_key_invalid(r.message),
            Kind::AccountClosed | Kind::KeyPaused => ErrorType::AccountError,
            Kind::Forbidden => ErrorType::PermissionError,
            Kind::RateLimited => ErrorType::RateLimitError,
            // Ours: the logs have the detail (the refusal logged it when it
            // was made); the answer says only what to do.
            Kind::Unavailable => return ApiError::unavailable(),
            Kind::Internal => return ApiError::internal(),
        };
        let mut e = ApiError::new(status_of(r.kind), kind, r.code, r.message);
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
    BillingError,
    BillingInvoiceError,
    CollectError,
    CheckoutError,
    DunningError,
    InvoiceError,
    LinkError,
    MobileError,
    QrError,
    RefundError,
    ReportError,
    RunError,
    SmsError,
    TestClockError,
    UploadError,
    WebhookError,
);

#[cfg(test)]
mod tests {
    use super::*;
    use shared::store::StoreError;

    /// Every kind's status, once: the API, the dashboard and the hosted
    /// pages all answer with these.
    const STATUSES: [(Kind, u16); 11] = [
        (Kind::Invalid, 400),
        (Kind::Unauthenticated, 401),
        (Kind::AccountClosed, 403),
        (Kind::KeyPaused, 423),
        (Kind::Forbidden, 403),
        (Kind::NotFound, 404),
        (Kind::Conflict, 409),
        (Kind::Unprocessable, 422),
        (Kind::RateLimited, 429),
        (Kind::Unavailable, 503),
        (Kind::Internal, 500),
    ];

    #[test]
    fn each_kind_has_one_status_and_the_envelope_answers_with_it() {
        for (kind, status) in STATUSES {
            assert_eq!(status_of(kind).as_u16(), status, "{kind:?}");
            let e = ApiError::from(Refusal::new(kind, "some_code", "m"));
            assert_eq!(e.status, status_of(kind), "{kind:?}");
        }
        // The table names each kind once.
        for (i, (kind, _)) in STATUSES.iter().enumerate() {
            assert!(
                STATUSES[..i].iter().all(|(k, _)| k != kind),
                "{kind:?} twice"
            );
        }
    }

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
