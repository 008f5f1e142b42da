use aws_lambda_events::dynamodb::Event;
use lambda_runtime::{LambdaEvent, service_fn};

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_runtime::Error> {
    shared::logging::init_lambda();
    let state = shared::lambda::start(shared::AppState::from_env()).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
        let state = state.clone();
        async move {
            Ok::<_, lambda_runtime::Error>(webhook_fanout::handle(&state, event.payload).await)
        }
    }))
    .await
}
