//! The SMS dispatcher: the SMS queue triggers this function (SQS event
//! source mapping, `ReportBatchItemFailures`). Each message names one
//! stored reminder; `shared::domain::sms::dispatch` claims it with a
//! conditional write and a lease, sends it through the SMS provider and
//! records the outcome, so a duplicate message never sends it twice.
//!
//! A send that certainly did not reach the provider (connection refused,
//! 408, 429, 503) or an unavailable store reports the message as a batch
//! item failure: it comes back after the queue's visibility timeout. Every
//! other outcome lets it go: sent, refused (4xx), cancelled (its session
//! was paid meanwhile), unknown (a timeout or 5xx: never sent again), a
//! malformed or stale message.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use shared::AppState;
use shared::domain::sms::handle_message;
use shared::providers::sms::SmsClient;
use shared::queue::lambda::handle_batch_concurrently;

/// Records of one batch handled at once (the event source's batch size).
pub const CONCURRENCY: usize = 10;

/// One invocation: every record of `event` through `handle_message`.
/// Answers the records to retry.
pub async fn handle(state: &AppState, client: &SmsClient, event: SqsEvent) -> SqsBatchResponse {
    let records = event.records.len();
    let response = handle_batch_concurrently(event, CONCURRENCY, |message_id, body| async move {
        let outcome = handle_message(state, client, &body).await;
        if let Ok(o) = &outcome {
            tracing::debug!(message_id = %message_id, outcome = ?o, "SMS message handled");
        }
        outcome.map(|_| ())
    })
    .await;
    tracing::info!(
        records,
        reported = response.batch_item_failures.len(),
        "SMS batch done"
    );
    response
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use shared::providers::sms::SmsConfig;

    use super::*;

    fn state() -> AppState {
        AppState::for_tests()
    }

    fn client() -> SmsClient {
        let config = SmsConfig {
            // Nothing listens there: no test here reaches the provider.
            base_url: "http://127.0.0.1:9".into(),
            token: "t".into(),
            from: "Dhukuti".into(),
            timeout: std::time::Duration::from_millis(200),
        };
        match SmsClient::new(config) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    fn sqs_event(records: &[(&str, &str)]) -> SqsEvent {
        let records: Vec<Value> = records
            .iter()
            .map(|(id, body)| {
                json!({
                    "messageId": id,
                    "receiptHandle": format!("r-{id}"),
                    "body": body,
                    "attributes": {"ApproximateReceiveCount": "1"},
                    "messageAttributes": {},
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:ap-south-1:123456789012:dhukuti-SmsQueue-abc",
                    "awsRegion": "ap-south-1"
                })
            })
            .collect();
        match serde_json::from_value(json!({ "Records": records })) {
            Ok(e) => e,
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn malformed_and_unknown_messages_are_dropped() {
        let state = state();
        let response = handle(
            &state,
            &client(),
            sqs_event(&[
                ("m1", "not json"),
                ("m2", r#"{"sms_id": "sms_01jzzzzzzzzzzzzzzzzzzzzzzz"}"#),
            ]),
        )
        .await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }
}
