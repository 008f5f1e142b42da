//! SMS reminders on the local gateway: what the SQS-triggered
//! `sms-dispatcher` function does in AWS, as one background task.
//!
//! The worker receives reminder messages from the SMS queue (the
//! in-process queue, or SQS with `DHUKUTI_BACKEND=aws`), handles up to ten
//! at once through `shared::domain::sms::handle_message` and deletes each
//! message its handler is done with. A message whose handler failed (the
//! send certainly did not reach the provider: refused connection, 408,
//! 429 or 503; or the store was unavailable) is
//! queued again after a short backoff (1 s, 2 s, 4 s, … up to 30 s, by
//! receive count) rather than waiting for the visibility timeout, so a
//! flaky provider is retried quickly; the record's attempt count bounds
//! the retries (`shared::domain::sms::MAX_ATTEMPTS`).

use std::time::Duration;

use futures::StreamExt;
use shared::AppState;
use shared::domain::sms;
use shared::providers::sms::SmsClient;
use shared::queue::{MAX_RECEIVE, Message, QueueName};
use tokio::task::JoinHandle;

/// Starts the worker; abort the handle to stop it.
pub fn spawn(state: &AppState, client: SmsClient) -> JoinHandle<()> {
    let state = state.clone();
    tokio::spawn(async move { work(state, client).await })
}

/// Past the claim's lease, so a message whose send crashed comes back to
/// an expired claim.
fn visibility() -> Duration {
    sms::LEASE + Duration::from_secs(1)
}

fn backoff(receive_count: u32) -> Duration {
    let exp = receive_count.saturating_sub(1).min(5);
    Duration::from_secs(1u64 << exp).min(Duration::from_secs(30))
}

async fn work(state: AppState, client: SmsClient) {
    let mut last_sweep = std::time::Instant::now();
    loop {
        // Once a minute: reminders whose message was lost (the in-process
        // queue does not survive a restart) are queued again.
        if last_sweep.elapsed() >= Duration::from_secs(60) {
            last_sweep = std::time::Instant::now();
            if let Err(e) = sms::requeue_stuck(&state, state.clock.now(), 100).await {
                tracing::warn!(error = %e, "SMS backstop sweep failed; the next one retries");
            }
        }
        let received = state
            .queue
            .receive(
                QueueName::Sms,
                MAX_RECEIVE,
                Duration::from_secs(1),
                visibility(),
            )
            .await;
        let messages = match received {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "SMS queue receive failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        futures::stream::iter(messages)
            .for_each_concurrent(MAX_RECEIVE, |m| {
                let state = &state;
                let client = &client;
                async move { handle(state, client, m).await }
            })
            .await;
    }
}

async fn handle(state: &AppState, client: &SmsClient, m: Message) {
    match sms::handle_message(state, client, &m.body).await {
        Ok(outcome) => {
            tracing::debug!(?outcome, "SMS message handled");
        }
        Err(e) => {
            let wait = backoff(m.receive_count);
            tracing::warn!(error = %e, retry_in = ?wait, "SMS message failed; it will be retried");
            if let Err(e) = state.queue.send(QueueName::Sms, &m.body, wait).await {
                // Not re-queued: leave it; it comes back after its
                // visibility timeout.
                tracing::warn!(error = %e, "could not re-queue an SMS message");
                return;
            }
        }
    }
    if let Err(e) = state.queue.delete(QueueName::Sms, &m.receipt).await {
        tracing::warn!(error = %e, "could not delete a handled SMS message; it will be handled again");
    }
}
