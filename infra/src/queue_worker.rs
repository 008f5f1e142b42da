//! The queue worker loop of the local gateway's background workers: what
//! the SQS event source mapping of an SQS-triggered function does in AWS.
//!
//! A worker receives up to [`MAX_RECEIVE`] messages at a time from its
//! queue (the in-process queue, or SQS with `DHUKUTI_BACKEND=aws`), hidden
//! for its visibility timeout, handles them concurrently through its
//! [`Handler`] and deletes each message whose handler succeeded. A message
//! whose handler failed is either left on the queue (it comes back after
//! its visibility timeout) or queued again after a backoff by receive
//! count, with the original deleted ([`OnFailure`]). A worker may also run
//! a periodic backstop sweep ([`Handler::sweep`]) between receives. When a
//! receive fails, the worker waits a second and tries again.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use shared::AppState;
use shared::queue::{MAX_RECEIVE, Message, QueueName};
use tokio::task::JoinHandle;

/// How long a receive waits for a first message.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// How long the worker waits after a failed receive before the next one.
const RECEIVE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What becomes of a message whose handler failed.
#[derive(Clone, Copy, Debug)]
pub enum OnFailure {
    /// It is left on the queue: it comes back after its visibility timeout.
    AwaitVisibility,
    /// It is queued again, visible after `backoff(receive_count)`, and the
    /// original is deleted; if it cannot be queued again it is left on the
    /// queue and comes back after its visibility timeout.
    Requeue {
        /// The delay before a failed message is seen again, by how many
        /// times it has been received (1 the first time).
        backoff: fn(u32) -> Duration,
    },
}

/// A worker's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The queue it receives from (and queues failed messages to again).
    pub queue: QueueName,
    /// Names its messages in the logs ("SMS", "webhook").
    pub label: &'static str,
    /// How long a received message stays hidden unless deleted.
    pub visibility: Duration,
    /// What becomes of a message whose handler failed.
    pub on_failure: OnFailure,
    /// How often [`Handler::sweep`] runs (first one interval after the
    /// start); `None`: never.
    pub sweep_every: Option<Duration>,
}

/// What a worker does with its messages.
pub trait Handler: Send + Sync {
    /// Why a message could not be handled (or a sweep failed); logged.
    type Error: Display + Send;

    /// Handles one received message. `Ok`: the message is done with and
    /// deleted; `Err`: see [`Settings::on_failure`].
    fn handle(
        &self,
        state: &AppState,
        message: &Message,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The backstop sweep, run every [`Settings::sweep_every`]; a failed
    /// sweep is logged and the next one retries. Does nothing by default.
    fn sweep(&self, state: &AppState) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = state;
        async { Ok(()) }
    }
}

/// Starts a worker; abort the handle to stop it.
pub fn spawn<H: Handler + 'static>(
    state: &AppState,
    settings: Settings,
    handler: H,
) -> JoinHandle<()> {
    let state = state.clone();
    tokio::spawn(async move { run(&state, &settings, &handler).await })
}

/// The worker loop; never returns.
pub async fn run<H: Handler>(state: &AppState, settings: &Settings, handler: &H) {
    let mut last_sweep = Instant::now();
    loop {
        if let Some(every) = settings.sweep_every {
            if last_sweep.elapsed() >= every {
                last_sweep = Instant::now();
                if let Err(e) = handler.sweep(state).await {
                    tracing::warn!(
                        error = %e,
                        "{} backstop sweep failed; the next one retries",
                        settings.label
                    );
                }
            }
        }
        let received = state
            .queue
            .receive(
                settings.queue,
                MAX_RECEIVE,
                RECEIVE_WAIT,
                settings.visibility,
            )
            .await;
        let messages = match received {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "{} queue receive failed", settings.label);
                tokio::time::sleep(RECEIVE_RETRY_AFTER).await;
                continue;
            }
        };
        futures::stream::iter(messages)
            .for_each_concurrent(MAX_RECEIVE, |m| async move {
                process(state, settings, handler, m).await
            })
            .await;
    }
}

/// Handles one message, then deletes it, queues it again or leaves it.
async fn process<H: Handler>(state: &AppState, settings: &Settings, handler: &H, m: Message) {
    let label = settings.label;
    if let Err(e) = handler.handle(state, &m).await {
        match settings.on_failure {
            OnFailure::AwaitVisibility => {
                tracing::warn!(
                    error = %e,
                    "{label} message failed; it comes back after its visibility timeout"
                );
                return;
            }
            OnFailure::Requeue { backoff } => {
                let wait = backoff(m.receive_count);
                tracing::warn!(
                    error = %e,
                    retry_in = ?wait,
                    "{label} message failed; it will be retried"
                );
                if let Err(e) = state.queue.send(settings.queue, &m.body, wait).await {
                    // Not queued again: leave it; it comes back after its
                    // visibility timeout.
                    tracing::warn!(error = %e, "could not re-queue a failed {label} message");
                    return;
                }
            }
        }
    }
    if let Err(e) = state.queue.delete(settings.queue, &m.receipt).await {
        tracing::warn!(
            error = %e,
            "could not delete a handled {label} message; it will be handled again"
        );
    }
}
