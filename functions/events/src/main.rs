#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_http::Error> {
    shared::logging::init_lambda();
    let state = shared::lambda::start(shared::AppState::from_env()).await?;
    // Each chunk of the answer goes out as it is written.
    lambda_http::run_with_streaming_response(events::router(state)).await
}
