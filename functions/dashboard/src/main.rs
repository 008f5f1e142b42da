#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    lambda_http::tracing::init_default_subscriber();
    let state = shared::AppState::from_env().await?;
    lambda_http::run(dashboard::router(state)).await
}
