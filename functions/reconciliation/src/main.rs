#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_http::Error> {
    shared::logging::init_lambda();
    let state = shared::lambda::start(shared::AppState::from_env()).await?;
    lambda_http::run(reconciliation::router(state)).await
}
