//! The spec's error envelope, built in one place:
//! `{"error": {message, type, code, request_id, param?, detail?, ...}}`.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::context::current_request_id;
use shared::store::StoreError;

/// `error.type`: the broad category a client branches on first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    AuthenticationError,
    PermissionError,
    AccountError,
    InvalidRequestError,
    IdempotencyError,
    RateLimitError,
    ApiError,
}

/// Marks a response whose body is already an error envelope.
#[derive(Clone, Copy, Debug)]
pub struct Enveloped;

/// An error answer of the API. Handlers return it; it renders itself.
/// Boxed, so `Result<_, ApiError>` stays one pointer wide on the happy path.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError(Box<Problem>);

/// What an [`ApiError`] says.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub status: StatusCode,
    pub kind: ErrorType,
    pub code: &'static str,
    pub message: String,
    /// The request field or query parameter at fault.
    pub param: Option<String>,
    pub detail: Option<String>,
    /// Extra objects of the envelope: `suspension`, `pause`, `refund`.
    pub extra: Map<String, Value>,
    /// Extra headers, e.g. `Retry-After`.
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: ErrorType,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError(Box::new(Problem {
            status,
            kind,
            code,
            message: message.into(),
            param: None,
            detail: None,
            extra: Map::new(),
            headers: Vec::new(),
        }))
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.0.param = Some(param.into());
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.0.detail = Some(detail.into());
        self
    }

    pub fn with_extra(mut self, name: &str, value: Value) -> Self {
        self.0.extra.insert(name.to_owned(), value);
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.0.headers.push((name, value.into()));
        self
    }

    /// 400 `validation_failed` naming the field or parameter at fault.
    pub fn validation(param: impl Into<String>, message: impl Into<String>) -> Self {
        shared::refusal::Refusal::invalid(param, message).into()
    }

    /// 400 `validation_failed` about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorType::InvalidRequestError,
            "validation_failed",
            message,
        )
    }

    /// 429 of a public route's limit (per client address, per session),
    /// with `Retry-After`.
    pub fn public_limited(limited: &shared::limits::public::Limited) -> Self {
        let secs = limited.retry_after.max(1);
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::RateLimitError,
            "rate_limited",
            format!(
                "Too many requests ({} limit); retry after {secs} s",
                limited.limit
            ),
        )
        .with_header("retry-after", secs.to_string())
    }

    /// 404 `not_found`: also the answer for another project's or mode's record.
    pub fn not_found(what: &str, id: &str) -> Self {
        shared::refusal::Refusal::not_found(what, id).into()
    }

    /// 401 `api_key_invalid`.
    pub fn api_key_invalid(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorType::AuthenticationError,
            "api_key_invalid",
            message,
        )
        .with_header("www-authenticate", "Bearer")
    }

    /// 403 `missing_scope`, naming the scope.
    pub fn missing_scope(scope: &str) -> Self {
        ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorType::PermissionError,
            "missing_scope",
            format!("This API key lacks the scope '{scope}' needed for this request"),
        )
    }

    /// 413: the body is over the limit.
    pub fn payload_too_large(limit_bytes: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::InvalidRequestError,
            "payload_too_large",
            format!("Request body is larger than {limit_bytes} bytes"),
        )
    }

    /// 500 `api_error`: nothing internal is shown; the cause is logged.
    pub fn internal() -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::ApiError,
            "api_error",
            "Something went wrong on our side; it is safe to retry the request",
        )
    }

    /// 503 `api_error`: a dependency is busy; retry after a second.
    pub fn unavailable() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::ApiError,
            "api_error",
            "The service is busy; retry the request in a moment (with the same Idempotency-Key for writes)",
        )
        .with_header("retry-after", "1")
    }

    /// The envelope for a status the router produced itself (no route,
    /// wrong method, a panic), so every error answer has the same shape.
    pub fn for_status(status: StatusCode) -> Self {
        match status {
            StatusCode::NOT_FOUND => ApiError::new(
                status,
                ErrorType::InvalidRequestError,
                "not_found",
                "No such endpoint; paths start with /v1",
            ),
            StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
                status,
                ErrorType::InvalidRequestError,
                "method_not_allowed",
                "This endpoint does not accept that HTTP method",
            ),
            StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::payload_too_large(crate::context::MAX_BODY_BYTES)
            }
            s if s.is_client_error() => ApiError::new(
                s,
                ErrorType::InvalidRequestError,
                "invalid_request_error",
                s.canonical_reason().unwrap_or("Invalid request"),
            ),
            _ => ApiError::internal(),
        }
    }

    /// The JSON body, with the request id the client sees in `X-Request-Id`.
    pub fn body(&self, request_id: &str) -> Value {
        let mut error = Map::new();
        error.insert("message".into(), json!(self.message));
        error.insert("type".into(), json!(self.kind));
        error.insert("code".into(), json!(self.code));
        error.insert("request_id".into(), json!(request_id));
        if let Some(param) = &self.param {
            error.insert("param".into(), json!(param));
        }
        if let Some(detail) = &self.detail {
            error.insert("detail".into(), json!(detail));
        }
        for (k, v) in &self.extra {
            error.insert(k.clone(), v.clone());
        }
        json!({ "error": error })
    }
}

impl std::ops::Deref for ApiError {
    type Target = Problem;
    fn deref(&self) -> &Problem {
        &self.0
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let request_id = current_request_id().unwrap_or_default();
        let body = self.body(&request_id).to_string();
        let mut res = (self.status, body).into_response();
        let headers = res.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (name, value) in &self.headers {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.insert(*name, v);
            }
        }
        res.extensions_mut().insert(Enveloped);
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        shared::refusal::Refusal::from(err).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_the_spec_fields() {
        let e = ApiError::validation("limit", "limit must be between 1 and 100");
        let body = e.body("req_1");
        assert_eq!(
            body,
            json!({"error": {
                "message": "limit must be between 1 and 100",
                "type": "invalid_request_error",
                "code": "validation_failed",
                "request_id": "req_1",
                "param": "limit"
            }})
        );
    }

    #[test]
    fn optional_objects_join_the_envelope() {
        let e = ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorType::AccountError,
            "account_suspended",
            "suspended",
        )
        .with_extra("suspension", json!({"reason": "fraud review"}))
        .with_detail("more");
        let body = e.body("r");
        assert_eq!(body["error"]["suspension"]["reason"], "fraud review");
        assert_eq!(body["error"]["detail"], "more");
        assert_eq!(body["error"]["type"], "account_error");
        assert!(body["error"].get("param").is_none());
    }

    #[test]
    fn store_failures_never_leak_details() {
        let e: ApiError = StoreError::Backend("table dhukuti-prod at 10.0.0.1".into()).into();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.code, "api_error");
        assert!(!e.message.contains("10.0.0.1"));
    }

    #[test]
    fn router_statuses_map_to_envelopes() {
        assert_eq!(
            ApiError::for_status(StatusCode::NOT_FOUND).code,
            "not_found"
        );
        assert_eq!(
            ApiError::for_status(StatusCode::METHOD_NOT_ALLOWED).code,
            "method_not_allowed"
        );
        assert_eq!(
            ApiError::for_status(StatusCode::PAYLOAD_TOO_LARGE).status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            ApiError::for_status(StatusCode::BAD_GATEWAY).kind,
            ErrorType::ApiError
        );
    }
}
