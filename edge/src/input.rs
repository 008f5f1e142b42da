//! Request input: JSON bodies and query strings. Bad input is a 400 naming
//! the field (`error.param`), a body over 1 MiB is a 413; never a 500.

use axum::extract::{FromRequest, FromRequestParts, Request};
use http::header;
use http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
pub use shared::fields::wire::{Strict, nullable, or_null, present};

pub use crate::context::MAX_BODY_BYTES;

/// A JSON request body of type `T`, validated by serde.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let bytes = json_bytes(req).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A JSON body that may also be absent (empty): then `T::default()`.
#[derive(Debug, Clone, Default)]
pub struct OptionalJsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        // No body at all (whatever Content-Type a client sends with it,
        // e.g. `curl -d ''`): the defaults.
        let declared_empty = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() == "0");
        if declared_empty {
            return Ok(OptionalJsonBody(T::default()));
        }
        let bytes = json_bytes(req).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(T::default()));
        }
        parse_json(&bytes).map(OptionalJsonBody)
    }
}

/// The body of a JSON request: a JSON content type if one is declared,
/// at most [`MAX_BODY_BYTES`].
async fn json_bytes(req: Request) -> Result<bytes::Bytes, ApiError> {
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or_default().trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(
                ApiError::bad_request("Content-Type must be application/json")
                    .with_param("Content-Type"),
            );
        }
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(ApiError::payload_too_large(MAX_BODY_BYTES));
    }
    axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|err| {
            if is_length_limit(&err) {
                ApiError::payload_too_large(MAX_BODY_BYTES)
            } else {
                ApiError::bad_request("The request body could not be read")
            }
        })
}

fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Parses `bytes` as `T`, naming the offending field on failure.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "A JSON object is required as the request body",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let result: Result<T, _> = serde_path_to_error::deserialize(Strict::new(&mut de));
    let value = result.map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        // serde_json reports a number or array where an enum's string is
        // expected as a syntax error; the body is valid JSON, so it is the
        // field's type that is wrong.
        if inner.is_syntax() && path != "." && is_json(bytes) {
            return ApiError::validation(
                path.clone(),
                format!("Invalid `{path}`: expected a string, one of the allowed values"),
            );
        }
        json_error(&path, &inner)
    })?;
    de.end().map_err(|_| {
        ApiError::bad_request("The request body has trailing characters after the JSON value")
    })?;
    Ok(value)
}

fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

fn json_error(path: &str, err: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    let text = without_position(&err.to_string());
    match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::bad_request(format!(
            "The request body is not valid JSON: {text} (line {}, column {})",
            err.line(),
            err.column()
        )),
        Category::Data => {
            let field = field_name(path, &text);
            match field {
                Some(field) => {
                    ApiError::validation(field.clone(), format!("Invalid `{field}`: {text}"))
                }
                None => ApiError::bad_request(format!("Invalid request body: {text}")),
            }
        }
    }
}

/// The dotted path of the field at fault. serde reports a missing or
/// unknown field at its parent, with the name inside backticks.
fn field_name(path: &str, text: &str) -> Option<String> {
    let parent = if path == "." { "" } else { path };
    if text.starts_with("unknown field `") && !parent.is_empty() {
        // serde_path_to_error already put the unknown field on the path.
        return Some(parent.to_owned());
    }
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|p| text.strip_prefix(p))
        .and_then(|rest| rest.split('`').next());
    match (parent, named) {
        ("", Some(name)) => Some(name.to_owned()),
        (p, Some(name)) => Some(format!("{p}.{name}")),
        ("", None) => None,
        (p, None) => Some(p.to_owned()),
    }
}

fn without_position(text: &str) -> String {
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text.to_owned(),
    }
}

/// The query string as name/value pairs (lambda_http and hyper both put it
/// in the URI).
#[derive(Clone, Debug, Default)]
pub struct QueryParams(pub Vec<(String, String)>);

impl QueryParams {
    pub fn parse(query: Option<&str>) -> Self {
        QueryParams(
            form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
        )
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Ok(QueryParams::parse(parts.uri.query()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        amount: i64,
        provider: Option<Provider>,
        customer: Option<Customer>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Customer {
        name: String,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Provider {
        Esewa,
    }

    fn err(json: &str) -> ApiError {
        match parse_json::<Body>(json.as_bytes()) {
            Ok(b) => panic!("{json} parsed as {b:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn good_json_parses() {
        let b = parse_json::<Body>(br#"{"amount": 5, "provider": "esewa"}"#);
        assert!(b.is_ok());
    }

    #[test]
    fn malformed_json_is_a_400_without_param() {
        let e = err(r#"{"amount": "#);
        assert_eq!(e.status, http::StatusCode::BAD_REQUEST);
        assert_eq!(e.code, "validation_failed");
        assert_eq!(e.param, None);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(err("").code, "validation_failed");
        let trailing = parse_json::<serde_json::Value>(b"{} x").err();
        assert!(trailing.is_some_and(|e| e.message.contains("trailing")));
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = err(r#"{"amount": "ten"}"#);
        assert_eq!(e.param.as_deref(), Some("amount"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = err(r#"{"amount": 1, "customer": {"name": 5}}"#);
        assert_eq!(e.param.as_deref(), Some("customer.name"));
    }

    #[test]
    fn unknown_enum_values_name_the_field() {
        let e = err(r#"{"amount": 1, "provider": "paypal"}"#);
        assert_eq!(e.param.as_deref(), Some("provider"));
        assert!(e.message.contains("paypal"), "{}", e.message);
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        assert_eq!(err(r#"{}"#).param.as_deref(), Some("amount"));
        assert_eq!(
            err(r#"{"amount": 1, "extra": 1}"#).param.as_deref(),
            Some("extra")
        );
        assert_eq!(
            err(r#"{"amount": 1, "customer": {"name": "x", "age": 3}}"#)
                .param
                .as_deref(),
            Some("customer.age")
        );
        assert_eq!(
            err(r#"{"amount": 1, "customer": {}}"#).param.as_deref(),
            Some("customer.name")
        );
    }

    #[test]
    fn deep_or_huge_input_never_panics() {
        let deep = "[".repeat(100_000);
        let _ = parse_json::<serde_json::Value>(deep.as_bytes());
        let _ = parse_json::<Body>(&[0xff, 0xfe, 0x00]);
    }

    async fn post(
        body: Vec<u8>,
        content_type: Option<&str>,
    ) -> (http::StatusCode, serde_json::Value) {
        use axum::routing::post;
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let app = crate::with_edge(axum::Router::new().route(
            "/t",
            post(|JsonBody(v): JsonBody<serde_json::Value>| async move { axum::Json(v) }),
        ));
        let mut req = http::Request::post("/t");
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let req = req.body(axum::body::Body::from(body)).unwrap_or_default();
        let res = app.oneshot(req).await.unwrap_or_default();
        let status = res.status();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[tokio::test]
    async fn bodies_over_one_mib_get_413_in_the_envelope() {
        let mut big = b"{\"a\": \"".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_BODY_BYTES));
        big.extend(b"\"}");
        let (status, body) = post(big, Some("application/json")).await;
        assert_eq!(status, http::StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(body["error"]["code"], "payload_too_large");
        assert!(
            body["error"]["request_id"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        );

        let ok = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_BODY_BYTES - 100));
        let (status, _) = post(ok.into_bytes(), Some("application/json")).await;
        assert_eq!(
            status,
            http::StatusCode::OK,
            "a body just under the limit passes"
        );
    }

    #[tokio::test]
    async fn wrong_content_type_is_a_400_naming_the_header() {
        let (status, body) = post(b"{}".to_vec(), Some("text/plain")).await;
        assert_eq!(status, http::StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["param"], "Content-Type");
        let (status, _) = post(b"{}".to_vec(), Some("application/json; charset=utf-8")).await;
        assert_eq!(status, http::StatusCode::OK);
        let (status, _) = post(b"{}".to_vec(), None).await;
        assert_eq!(status, http::StatusCode::OK);
        let (status, body) = post(b"{".to_vec(), None).await;
        assert_eq!(status, http::StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["code"], "validation_failed");
    }

    #[test]
    fn query_params_decode() {
        let q = QueryParams::parse(Some("limit=5&status=pending&x=a%20b&limit=9"));
        assert_eq!(q.get("limit"), Some("5"));
        assert_eq!(q.get("x"), Some("a b"));
        assert_eq!(q.get("nope"), None);
    }
}
