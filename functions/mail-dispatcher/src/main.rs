use aws_lambda_events::sqs::SqsEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use shared::providers::mail::MailSender;

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> Result<(), lambda_runtime::Error> {
    shared::logging::init_lambda();
    // One sender per process (DHUKUTI_MAIL_FROM,
    // DHUKUTI_SES_CONFIGURATION_SET; DHUKUTI_MAIL_BASE_URL for the local
    // simulator): its connection pool outlives invocations.
    let (state, sender) = shared::lambda::start(async {
        let state = shared::AppState::from_env().await?;
        let sender = MailSender::from_env()?;
        Ok::<_, String>((state, sender))
    })
    .await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let state = state.clone();
        let sender = sender.clone();
        async move {
            Ok::<_, lambda_runtime::Error>(
                mail_dispatcher::handle(&state, &sender, event.payload).await,
            )
        }
    }))
    .await
}
