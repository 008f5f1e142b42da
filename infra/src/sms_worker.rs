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
//! the retries (`shared::domain::sms::MAX_ATTEMPTS`). Once a minute it
//! queues again reminders whose message was lost
//! (`shared::domain::sms::requeue_stuck`: the in-process queue does not
//! survive a restart). The loop itself is [`crate::queue_worker`].

use std::time::Duration;

use shared::AppState;
use shared::domain::sms::{self, DispatchError};
use shared::providers::sms::SmsClient;
use shared::queue::{Message, QueueName};
use tokio::task::JoinHandle;

use crate::queue_worker::{self, Handler, OnFailure, Settings};

/// Stuck reminders queued again per backstop sweep.
const SWEEP_BATCH: usize = 100;
/// How often reminders whose message was lost are queued again.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Starts the worker; abort the handle to stop it.
pub fn spawn(state: &AppState, client: SmsClient) -> JoinHandle<()> {
    let settings = Settings {
        queue: QueueName::Sms,
        label: "SMS",
        visibility: visibility(),
        on_failure: OnFailure::Requeue { backoff },
        sweep_every: Some(SWEEP_EVERY),
    };
    queue_worker::spawn(state, settings, Dispatcher { client })
}

/// Past the claim's lease, so a message whose send crashed comes back to
/// an expired claim.
fn visibility() -> Duration {
    sms::LEASE + Duration::from_secs(1)
}

/// 1 s, 2 s, 4 s, … up to 30 s, by receive count.
fn backoff(receive_count: u32) -> Duration {
    let exp = receive_count.saturating_sub(1).min(5);
    Duration::from_secs(1u64 << exp).min(Duration::from_secs(30))
}

/// Sends the reminders of the SMS queue's messages.
struct Dispatcher {
    client: SmsClient,
}

impl Handler for Dispatcher {
    type Error = DispatchError;

    async fn handle(&self, state: &AppState, m: &Message) -> Result<(), DispatchError> {
        let outcome = sms::handle_message(state, &self.client, &m.body).await?;
        tracing::debug!(?outcome, "SMS message handled");
        Ok(())
    }

    /// Reminders whose message was lost are queued again.
    async fn sweep(&self, state: &AppState) -> Result<(), DispatchError> {
        sms::requeue_stuck(state, state.clock.now(), SWEEP_BATCH).await?;
        Ok(())
    }
}
