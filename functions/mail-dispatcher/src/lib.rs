//! The mail dispatcher: the mail queue triggers this function (SQS event
//! source mapping, `ReportBatchItemFailures`). A message names one stored
//! billing email (`shared::domain::mail`): it is claimed with a conditional
//! write and a lease, checked against the project's suppression list (and,
//! for sandbox mail, its verified addresses), sent once through Amazon SES
//! v2 with the configuration set, and its outcome recorded. The same queue
//! carries SES's bounce and complaint notifications from SNS: they
//! suppress the address for the message's project.
//!
//! A send that certainly did not leave (no connection, throttled, 503) or
//! an unavailable store reports the record as a batch item failure: it
//! comes back after the queue's visibility timeout. Every other outcome
//! lets it go: sent, refused, suppressed, unknown (a timeout or 5xx: never
//! sent again), a malformed or stale message.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use shared::AppState;
use shared::domain::mail::handle_message;
use shared::providers::mail::MailSender;
use shared::queue::lambda::handle_batch_concurrently;

/// Records of one batch handled at once (the event source's batch size).
pub const CONCURRENCY: usize = 10;

/// One invocation: every record of `event` through `handle_message`.
/// Answers the records to retry.
pub async fn handle(state: &AppState, sender: &MailSender, event: SqsEvent) -> SqsBatchResponse {
    let records = event.records.len();
    let response = handle_batch_concurrently(event, CONCURRENCY, |message_id, body| async move {
        let outcome = handle_message(state, sender, &body).await;
        if let Ok(o) = &outcome {
            tracing::debug!(message_id = %message_id, outcome = ?o, "mail message handled");
        }
        outcome.map(|_| ())
    })
    .await;
    tracing::info!(
        records,
        reported = response.batch_item_failures.len(),
        "mail batch done"
    );
    response
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use shared::providers::mail::{HttpSender, MailConfig};

    use super::*;

    fn sender() -> MailSender {
        let Ok(config) = MailConfig::from_lookup(|_| None) else {
            panic!("config")
        };
        // Nothing listens there.
        match HttpSender::new(config, "http://127.0.0.1:9".into()) {
            Ok(s) => MailSender::Http(s),
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
                    "eventSourceARN": "arn:aws:sqs:ap-south-1:123456789012:dhukuti-MailQueue-abc",
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
    async fn malformed_unknown_and_foreign_messages_are_dropped() {
        let state = AppState::for_tests();
        let response = handle(
            &state,
            &sender(),
            sqs_event(&[
                ("m1", "not json"),
                ("m2", r#"{"mail_id": "mail_01jzzzzzzzzzzzzzzzzzzzzzzz"}"#),
                (
                    "m3",
                    r#"{"Type": "Notification", "Message": "{\"eventType\": \"Delivery\"}"}"#,
                ),
            ]),
        )
        .await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }
}
