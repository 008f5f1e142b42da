//! `GET /dashboard/invoices/{id}/pdf`: an invoice's PDF for a signed-in
//! dashboard user (`dashboard::documents_router`). Its own function so that
//! only it carries the S3 client and the PDF renderer.

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_http::Error> {
    shared::logging::init_lambda();
    let state = shared::lambda::start(shared::AppState::from_env()).await?;
    lambda_http::run(dashboard::documents_router(state)).await
}
