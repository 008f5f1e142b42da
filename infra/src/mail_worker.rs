//! Billing mail on the local gateway: what the SQS-triggered
//! `mail-dispatcher` function does in AWS, as one background task.
//!
//! The worker receives messages from the mail queue (the in-process queue,
//! or SQS with `DHUKUTI_BACKEND=aws`), handles up to ten at once through
//! `shared::domain::mail::handle_message` (a message to send, or a bounce
//! or complaint notification the mail simulator queued) and deletes each
//! one its handler is done with. A send that certainly did not leave is
//! queued again after a short backoff (1 s, 2 s, 4 s, … up to 30 s); the
//! message's attempt count bounds the retries
//! (`shared::domain::mail::MAX_ATTEMPTS`). The loop is
//! [`crate::queue_worker`].

use std::time::Duration;

use shared::AppState;
use shared::domain::mail::{self, DispatchError};
use shared::providers::mail::MailSender;
use shared::queue::{Message, QueueName};
use tokio::task::JoinHandle;

use crate::queue_worker::{self, Handler, OnFailure, Settings};

/// Starts the worker; abort the handle to stop it.
pub fn spawn(state: &AppState, sender: MailSender) -> JoinHandle<()> {
    let settings = Settings {
        queue: QueueName::Mail,
        label: "mail",
        // Past the claim's lease, so a message whose send crashed comes
        // back to an expired claim.
        visibility: mail::LEASE + Duration::from_secs(1),
        on_failure: OnFailure::Requeue { backoff },
        sweep_every: None,
    };
    queue_worker::spawn(state, settings, Dispatcher { sender })
}

/// 1 s, 2 s, 4 s, … up to 30 s, by receive count.
fn backoff(receive_count: u32) -> Duration {
    let exp = receive_count.saturating_sub(1).min(5);
    Duration::from_secs(1u64 << exp).min(Duration::from_secs(30))
}

struct Dispatcher {
    sender: MailSender,
}

impl Handler for Dispatcher {
    type Error = DispatchError;

    async fn handle(&self, state: &AppState, m: &Message) -> Result<(), DispatchError> {
        let outcome = mail::handle_message(state, &self.sender, &m.body).await?;
        tracing::debug!(?outcome, "mail message handled");
        Ok(())
    }
}
