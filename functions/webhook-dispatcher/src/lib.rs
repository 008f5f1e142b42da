//! The webhook dispatcher: the webhooks queue triggers this function
//! (SQS event source mapping, `ReportBatchItemFailures`). Each message
//! names one attempt of one delivery; [`handle_message`] makes it (claim,
//! signed POST, outcome logged, next attempt queued).
//!
//! The records of a batch run concurrently (up to [`CONCURRENCY`]): a
//! receiver that takes its full timeout does not hold up the others. A
//! message whose handling failed (store or queue unavailable) is reported
//! as a batch item failure and comes back after the queue's visibility
//! timeout; every other outcome, a malformed or stale message included,
//! lets it go.

use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use shared::AppState;
use shared::domain::webhooks::{Outcome, handle_message};
use shared::queue::lambda::handle_batch_concurrently;
use shared::webhooks::client::WebhookClient;

/// Records of one batch handled at once (the event source's batch size).
pub const CONCURRENCY: usize = 10;

/// What one batch did, by outcome.
#[derive(Debug, Default)]
struct Counts {
    delivered: AtomicUsize,
    retrying: AtomicUsize,
    failed: AtomicUsize,
    not_due: AtomicUsize,
    skipped: AtomicUsize,
    errors: AtomicUsize,
}

impl Counts {
    fn count(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Delivered => &self.delivered,
            Outcome::Retrying { .. } => &self.retrying,
            Outcome::Failed => &self.failed,
            Outcome::NotDue => &self.not_due,
            Outcome::Skipped => &self.skipped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One invocation: every record of `event` through [`handle_message`],
/// with `client` (built once per process, at cold start). Answers the
/// records to retry.
pub async fn handle(state: &AppState, client: &WebhookClient, event: SqsEvent) -> SqsBatchResponse {
    let records = event.records.len();
    let counts = Counts::default();
    let response = handle_batch_concurrently(event, CONCURRENCY, |message_id, body| {
        let counts = &counts;
        async move {
            match handle_message(state, client, &body).await {
                Ok(outcome) => {
                    tracing::debug!(message_id = %message_id, outcome = ?outcome, "webhook message handled");
                    counts.count(&outcome);
                    Ok(())
                }
                Err(e) => {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
            }
        }
    })
    .await;
    let load = |c: &AtomicUsize| c.load(Ordering::Relaxed);
    tracing::info!(
        records,
        delivered = load(&counts.delivered),
        retrying = load(&counts.retrying),
        failed = load(&counts.failed),
        not_due = load(&counts.not_due),
        skipped = load(&counts.skipped),
        errors = load(&counts.errors),
        reported = response.batch_item_failures.len(),
        "webhook batch done"
    );
    response
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use shared::domain::webhooks::{DeliveryMessage, WebhookSettings};
    use std::sync::Arc;

    use super::*;

    fn state() -> AppState {
        AppState::for_tests()
    }

    fn client(state: &AppState) -> WebhookClient {
        match state.webhooks.client() {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// An SQS event as Lambda delivers it.
    fn sqs_event(records: &[(&str, &str)]) -> SqsEvent {
        let records: Vec<Value> = records
            .iter()
            .map(|(id, body)| {
                json!({
                    "messageId": id,
                    "receiptHandle": format!("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a-{id}"),
                    "body": body,
                    "attributes": {
                        "ApproximateReceiveCount": "1",
                        "SentTimestamp": "1763800000000",
                        "SenderId": "AROAEXAMPLE:webhook-fanout",
                        "ApproximateFirstReceiveTimestamp": "1763800000005"
                    },
                    "messageAttributes": {},
                    "md5OfBody": "7b270e59b47ff90a553787216d55d91d",
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:ap-south-1:123456789012:dhukuti-WebhookQueue-abc",
                    "awsRegion": "ap-south-1"
                })
            })
            .collect();
        match serde_json::from_value(json!({ "Records": records })) {
            Ok(e) => e,
            Err(e) => panic!("{e}"),
        }
    }

    fn reported(response: &SqsBatchResponse) -> Vec<String> {
        response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone())
            .collect()
    }

    #[tokio::test]
    async fn a_malformed_message_is_dropped_not_retried() {
        let state = state();
        let response = handle(
            &state,
            &client(&state),
            sqs_event(&[("m1", "not json"), ("m2", r#"{"event_id": 7}"#), ("m3", "")]),
        )
        .await;
        assert!(reported(&response).is_empty(), "{response:?}");
    }

    #[tokio::test]
    async fn a_message_for_an_unknown_delivery_is_dropped() {
        let state = state();
        let body = match serde_json::to_string(&DeliveryMessage {
            event_id: "evt_01JZZZZZZZZZZZZZZZZZZZZZZZ".into(),
            endpoint_id: "we_01JZZZZZZZZZZZZZZZZZZZZZZZ".into(),
            attempt: 0,
        }) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        };
        let response = handle(&state, &client(&state), sqs_event(&[("m1", &body)])).await;
        assert!(reported(&response).is_empty(), "{response:?}");
        // Nothing was queued again either.
        let again = state
            .queue
            .receive(
                shared::queue::QueueName::Webhooks,
                10,
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(30),
            )
            .await;
        assert!(matches!(again.as_deref(), Ok([])), "{again:?}");
    }

    /// A store that cannot answer: that message is kept (reported), the
    /// others of the batch are not.
    #[tokio::test]
    async fn a_store_error_keeps_the_message_for_a_retry() {
        use shared::store::faults::{Fault, FaultyStore, Op};
        let faulty = Arc::new(FaultyStore::new(state().store.clone()));
        faulty.plan(Op::Get, 0, Fault::throttled());
        let mut state = state();
        state.store = faulty.clone();
        let message = |n: u32| {
            let msg = DeliveryMessage {
                event_id: format!("evt_01JZZZZZZZZZZZZZZZZZZZZZZ{n}").as_str().into(),
                endpoint_id: "we_01JZZZZZZZZZZZZZZZZZZZZZZZ".into(),
                attempt: 0,
            };
            match serde_json::to_string(&msg) {
                Ok(b) => b,
                Err(e) => panic!("{e}"),
            }
        };
        let (one, two) = (message(1), message(2));
        let response = handle(
            &state,
            &client(&state),
            sqs_event(&[("m1", &one), ("m2", "garbage"), ("m3", &two)]),
        )
        .await;
        assert_eq!(faulty.injected(), 1);
        let failed = reported(&response);
        assert_eq!(failed.len(), 1, "{response:?}");
        assert!(failed[0] == "m1" || failed[0] == "m3", "{response:?}");
    }

    #[tokio::test]
    async fn an_empty_batch_reports_nothing() {
        let state = state().with_webhooks(WebhookSettings::default());
        let response = handle(&state, &client(&state), sqs_event(&[])).await;
        assert_eq!(
            serde_json::to_value(&response).ok(),
            Some(json!({ "batchItemFailures": [] }))
        );
    }
}
