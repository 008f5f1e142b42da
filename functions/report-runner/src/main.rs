use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_runtime::Error> {
    shared::logging::init_lambda();
    let state = shared::lambda::start(shared::AppState::from_env()).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let state = state.clone();
        async move { report_runner::handle(&state, event.payload).await }
    }))
    .await
}
