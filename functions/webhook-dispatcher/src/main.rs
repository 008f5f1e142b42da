use aws_lambda_events::sqs::SqsEvent;
use lambda_runtime::{LambdaEvent, service_fn};

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_runtime::Error> {
    shared::logging::init_lambda();
    // One client per process: its connection pool outlives invocations.
    let (state, client) = shared::lambda::start(async {
        let state = shared::AppState::from_env().await?;
        let client = state.webhooks.client()?;
        Ok::<_, String>((state, client))
    })
    .await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let state = state.clone();
        let client = client.clone();
        async move {
            Ok::<_, lambda_runtime::Error>(
                webhook_dispatcher::handle(&state, &client, event.payload).await,
            )
        }
    }))
    .await
}
