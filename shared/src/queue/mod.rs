//! The queue port: SQS in AWS, an in-process twin on the dev server and in
//! tests. Messages are delivered at least once; a consumer deletes a
//! message after handling it, and one it does not delete comes back after
//! its visibility timeout.

use std::time::Duration;

pub mod lambda;
pub mod memory;
#[cfg(feature = "sqs")]
pub mod sqs;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

use async_trait::async_trait;

/// The queues of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueName {
    /// Webhook deliveries (one message per delivery attempt).
    Webhooks,
    /// SMS reminders to dispatch.
    Sms,
    /// Email messages to dispatch, and (on AWS) SES bounce and complaint
    /// notifications through SNS (`domain::mail`).
    Mail,
}

impl QueueName {
    pub const ALL: [QueueName; 3] = [QueueName::Webhooks, QueueName::Sms, QueueName::Mail];

    /// The logical name, also the suffix of the SQS queue name.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueName::Webhooks => "webhooks",
            QueueName::Sms => "sms",
            QueueName::Mail => "mail",
        }
    }
}

/// SQS's longest delay; longer waits are re-queued by the consumer.
pub const MAX_DELAY: Duration = Duration::from_secs(900);
/// SQS's largest receive batch.
pub const MAX_RECEIVE: usize = 10;

/// One received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub body: String,
    /// Handle to delete this receipt of the message.
    pub receipt: String,
    /// How many times the message has been received, this time included.
    pub receive_count: u32,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum QueueError {
    #[error("invalid queue request: {0}")]
    Invalid(String),
    #[error("queue temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("queue failure: {0}")]
    Backend(String),
}

#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Enqueues `body`, visible after `delay` (at most [`MAX_DELAY`]).
    async fn send(
        &self,
        queue: QueueName,
        body: &str,
        delay: Duration,
    ) -> Result<String, QueueError>;

    /// Up to `max` (1..=[`MAX_RECEIVE`]) visible messages, waiting up to
    /// `wait` for the first. Each is hidden for `visibility` unless deleted.
    async fn receive(
        &self,
        queue: QueueName,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Message>, QueueError>;

    /// Removes a received message for good.
    async fn delete(&self, queue: QueueName, receipt: &str) -> Result<(), QueueError>;
}

/// The queue of a function built without one (no `sqs` feature): every
/// call fails, naming the missing feature. Such a function is granted no
/// SQS action in `template.yaml` either (`tests/e2e/deps.rs`).
pub struct NoQueue;

impl NoQueue {
    fn refuse() -> QueueError {
        QueueError::Backend("this function is built without a queue (feature sqs)".into())
    }
}

#[async_trait]
impl Queue for NoQueue {
    async fn send(&self, _: QueueName, _: &str, _: Duration) -> Result<String, QueueError> {
        Err(Self::refuse())
    }

    async fn receive(
        &self,
        _: QueueName,
        _: usize,
        _: Duration,
        _: Duration,
    ) -> Result<Vec<Message>, QueueError> {
        Err(Self::refuse())
    }

    async fn delete(&self, _: QueueName, _: &str) -> Result<(), QueueError> {
        Err(Self::refuse())
    }
}
