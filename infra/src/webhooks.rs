//! Webhooks on the local gateway: what DynamoDB Streams, the fan-out
//! function and the SQS-triggered dispatcher do in AWS, as two background
//! tasks of the one process.
//!
//! - the poller takes events out of the outbox and fans them out into
//!   deliveries (`fan_out_pending`), every `poll` interval, and once a
//!   minute queues again deliveries whose message was lost
//!   (`requeue_overdue`: the in-process queue does not survive a restart);
//! - the worker receives delivery messages from the webhooks queue (the
//!   in-process queue, or SQS with `DHUKUTI_BACKEND=aws`), handles up to
//!   ten at once, and deletes each message its handler is done with; a
//!   message whose handler failed comes back after its visibility timeout
//!   (the loop is [`crate::queue_worker`]).

use std::time::Duration;

use shared::AppState;
use shared::domain::webhooks::{self, DispatchError, Outcome};
use shared::queue::{Message, QueueName};
use shared::webhooks::client::WebhookClient;
use tokio::task::JoinHandle;

use crate::queue_worker::{self, Handler, OnFailure, Settings};

/// Events fanned out (and overdue deliveries queued again) per shard per run.
const POLL_BATCH: usize = 100;
/// How often deliveries whose message was lost (the in-process queue does
/// not survive a restart) are queued again.
const REQUEUE_EVERY: Duration = Duration::from_secs(60);

/// Starts the poller and the worker; abort the handles to stop them.
pub fn spawn(state: &AppState, poll: Duration) -> Result<Vec<JoinHandle<()>>, String> {
    let client = state.webhooks.client()?;
    let poller = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut last_requeue = std::time::Instant::now();
            loop {
                if last_requeue.elapsed() >= REQUEUE_EVERY {
                    last_requeue = std::time::Instant::now();
                    if let Err(e) =
                        webhooks::requeue_overdue(&state, state.clock.now(), POLL_BATCH).await
                    {
                        tracing::warn!(error = %e, "overdue webhook sweep failed; next one retries");
                    }
                }
                match webhooks::fan_out_pending(&state, None, POLL_BATCH).await {
                    Ok(r) if r.events > 0 => {
                        tracing::debug!(
                            events = r.events,
                            deliveries = r.deliveries,
                            errors = r.errors,
                            "outbox fanned out"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "outbox poll failed; next poll retries"),
                }
                tokio::time::sleep(poll).await;
            }
        })
    };
    let settings = Settings {
        queue: QueueName::Webhooks,
        label: "webhook",
        visibility: visibility(state),
        on_failure: OnFailure::AwaitVisibility,
        // The poller queues lost deliveries again.
        sweep_every: None,
    };
    let worker = queue_worker::spawn(state, settings, Dispatcher { client });
    Ok(vec![poller, worker])
}

/// How long a received message stays hidden: past the claim's lease, so a
/// message whose attempt crashed comes back to an expired claim.
fn visibility(state: &AppState) -> Duration {
    state.webhooks.lease + Duration::from_secs(1)
}

/// Attempts the deliveries of the webhooks queue's messages.
struct Dispatcher {
    client: WebhookClient,
}

impl Handler for Dispatcher {
    type Error = DispatchError;

    async fn handle(&self, state: &AppState, m: &Message) -> Result<(), DispatchError> {
        let outcome = webhooks::handle_message(state, &self.client, &m.body).await?;
        if outcome != Outcome::Skipped {
            tracing::debug!(?outcome, "webhook message handled");
        }
        Ok(())
    }
}
