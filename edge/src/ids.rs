//! Ids in a path, typed at the edge: a handler takes `Id(id, ..): Id<PaymentId>`
//! and the domain never sees a string. An id that cannot exist (another
//! kind's prefix, a malformed tail) is answered as not found before any
//! store read, in the surface's own words: the API's error envelope
//! (`No such payment: '…'`, param `id`) or a page's.

use std::marker::PhantomData;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use shared::ids::{
    ApiKeyId, AuditId, BankCreditId, BillingInvoiceId, CouponId, CustomerId, DeliveryId,
    DunningPolicyId, EndpointId, EventId, InvoiceId, InvoiceItemId, LinkId, MerchantId, PaymentId,
    PlanId, ProjectId, PromotionCodeId, ReconRunId, RefundId, ReportId, SessionId, SmsId,
    SubscriptionId, TestClockId, TypedId, UserId,
};
use shared::refusal::Refusal;

use crate::ApiError;

/// Who answers an id that cannot exist: the JSON API ([`Api`]) or a page.
pub trait Surface: Send + Sync + 'static {
    type Rejection: IntoResponse;

    /// The answer for `raw`, which is no `noun`'s id.
    fn not_found(noun: &'static str, raw: &str) -> Self::Rejection;
}

/// The JSON API: 404 `not_found`, `No such {noun}: '{raw}'`, param `id`.
pub struct Api;

impl Surface for Api {
    type Rejection = ApiError;

    fn not_found(noun: &'static str, raw: &str) -> ApiError {
        Refusal::not_found(noun, raw).into()
    }
}

/// One piece of a path: a typed id (parsed strictly) or plain text.
pub trait PathPart: Sized {
    /// The part, or the noun of the id `raw` is not.
    fn from_segment(raw: &str) -> Result<Self, &'static str>;
}

impl PathPart for String {
    fn from_segment(raw: &str) -> Result<Self, &'static str> {
        Ok(raw.to_owned())
    }
}

macro_rules! id_parts {
    ($($id:ty),*) => {$(
        impl PathPart for $id {
            fn from_segment(raw: &str) -> Result<Self, &'static str> {
                <$id as TypedId>::parse(raw).ok_or(<$id as TypedId>::NOUN)
            }
        }
    )*};
}

id_parts!(
    MerchantId,
    ProjectId,
    ApiKeyId,
    SessionId,
    PaymentId,
    RefundId,
    LinkId,
    InvoiceId,
    EndpointId,
    DeliveryId,
    EventId,
    SmsId,
    UserId,
    AuditId,
    CustomerId,
    PlanId,
    SubscriptionId,
    DunningPolicyId,
    BillingInvoiceId,
    TestClockId,
    CouponId,
    PromotionCodeId,
    InvoiceItemId,
    ReportId,
    BankCreditId,
    ReconRunId
);

/// What a route's path holds, in order: one part or a tuple of them.
pub trait PathParts: Sized {
    /// The parts of `segments`; on a bad one, its noun and raw text.
    fn from_segments(segments: &[String]) -> Result<Self, (&'static str, String)>;
}

fn part<P: PathPart>(segments: &[String], at: usize) -> Result<P, (&'static str, String)> {
    let raw = segments.get(at).map(String::as_str).unwrap_or_default();
    P::from_segment(raw).map_err(|noun| (noun, raw.to_owned()))
}

impl<A: PathPart> PathParts for A {
    fn from_segments(segments: &[String]) -> Result<Self, (&'static str, String)> {
        part(segments, 0)
    }
}

impl<A: PathPart, B: PathPart> PathParts for (A, B) {
    fn from_segments(segments: &[String]) -> Result<Self, (&'static str, String)> {
        Ok((part(segments, 0)?, part(segments, 1)?))
    }
}

impl<A: PathPart, B: PathPart, C: PathPart> PathParts for (A, B, C) {
    fn from_segments(segments: &[String]) -> Result<Self, (&'static str, String)> {
        Ok((part(segments, 0)?, part(segments, 1)?, part(segments, 2)?))
    }
}

/// The path's ids (and any plain parts), typed; `S` answers a bad one.
pub struct Id<T, S = Api>(pub T, pub PhantomData<S>);

impl<T, S, St> FromRequestParts<St> for Id<T, S>
where
    T: PathParts + Send,
    S: Surface,
    St: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, Response> {
        // Read and parsed as a PathId is; answered at once.
        let PathId(parsed) = PathId::<T>::from_request_parts(parts, state).await?;
        parsed
            .map(|t| Id(t, PhantomData))
            .map_err(|(noun, raw)| S::not_found(noun, &raw).into_response())
    }
}

/// A path id an API handler takes when its own checks come first (the
/// key's scope, the body's validation): extracted and parsed like [`Id`],
/// but an id that cannot exist is answered only where the handler asks
/// for it with [`PathId::get`], so a key without the scope still gets 403
/// and a bad body still its 400, whatever the path, as before ids were
/// typed.
pub struct PathId<T>(Result<T, (&'static str, String)>);

impl<T> PathId<T> {
    /// The id, or the API's not-found answer for the text the path held.
    pub fn get(self) -> Result<T, ApiError> {
        self.0.map_err(|(noun, raw)| Api::not_found(noun, &raw))
    }

    /// The id, or what a page answers for the text the path held (its
    /// noun and the text).
    pub fn get_or<E>(self, answer: impl FnOnce(&'static str, &str) -> E) -> Result<T, E> {
        self.0.map_err(|(noun, raw)| answer(noun, &raw))
    }
}

impl<T, St> FromRequestParts<St> for PathId<T>
where
    T: PathParts + Send,
    St: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, Response> {
        let Path(segments) = Path::<Vec<String>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(PathId(T::from_segments(&segments)))
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    async fn payment(Id(id, ..): Id<PaymentId>) -> String {
        format!("payment {id}")
    }

    async fn attempt(
        Id((session, payment, outcome), ..): Id<(SessionId, PaymentId, String)>,
    ) -> String {
        format!("{session} {payment} {outcome}")
    }

    /// Stands in for a scope check that refuses before the lookup.
    async fn guarded(id: PathId<PaymentId>) -> Result<String, ApiError> {
        let allowed = false;
        if !allowed {
            return Err(ApiError::from(Refusal::forbidden(
                "insufficient_scope",
                "no",
            )));
        }
        Ok(format!("payment {}", id.get()?))
    }

    async fn lookup(id: PathId<PaymentId>) -> Result<String, ApiError> {
        Ok(format!("payment {}", id.get()?))
    }

    #[tokio::test]
    async fn a_deferred_id_is_answered_where_the_handler_asks() {
        let app = Router::new()
            .route("/g/{id}", get(guarded))
            .route("/l/{id}", get(lookup));
        // The check before the lookup answers first, whatever the id.
        assert_eq!(call_on(&app, "/g/pay_1").await.0, StatusCode::FORBIDDEN);
        let (status, body) = call_on(&app, "/l/pay_1").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("No such payment: 'pay_1'"), "{body}");
        let id = PaymentId::new();
        assert_eq!(
            call_on(&app, &format!("/l/{id}")).await,
            (StatusCode::OK, format!("payment {id}"))
        );
    }

    async fn call(uri: &str) -> (StatusCode, String) {
        let app = Router::new()
            .route("/p/{id}", get(payment))
            .route("/c/{id}/{payment}/{outcome}", get(attempt));
        call_on(&app, uri).await
    }

    async fn call_on(app: &Router, uri: &str) -> (StatusCode, String) {
        let res = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_well_formed_id_reaches_the_handler_typed() {
        let id = PaymentId::new();
        assert_eq!(
            call(&format!("/p/{id}")).await,
            (StatusCode::OK, format!("payment {id}"))
        );
        let s = SessionId::new();
        let (status, body) = call(&format!("/c/{s}/{id}/success")).await;
        assert_eq!(
            (status, body),
            (StatusCode::OK, format!("{s} {id} success"))
        );
    }

    #[tokio::test]
    async fn an_id_that_cannot_exist_is_not_found_in_the_envelope() {
        for raw in [
            "pay_1",
            "ref_01j00000000000000000000000",
            "pay_01J00000000000000000000000",
        ] {
            let (status, body) = call(&format!("/p/{raw}")).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{raw}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["code"], "not_found");
            assert_eq!(v["error"]["param"], "id");
            assert_eq!(v["error"]["message"], format!("No such payment: '{raw}'"));
        }
        // The bad part of a longer path names its own kind.
        let s = SessionId::new();
        let (status, body) = call(&format!("/c/{s}/pay_x/success")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("No such payment: 'pay_x'"), "{body}");
    }
}
