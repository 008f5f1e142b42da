//! The API reference as a Lambda: the router of `lib.rs` under
//! `lambda_http`, serving the document committed at `docs/openapi.json`
//! (embedded at build time: a Lambda has no filesystem to read it from).

/// The OpenAPI document the gateway answers from `/openapi.json`.
const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_http::Error> {
    shared::logging::init_lambda();
    lambda_http::run(docs::router(std::sync::Arc::from(OPENAPI_JSON))).await
}
