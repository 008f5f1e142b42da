//! SQS-triggered Lambda functions with partial batch failure reporting.
//!
//! The event source mapping must enable `ReportBatchItemFailures`
//! (`FunctionResponseTypes`); Lambda then deletes the records that are not
//! listed in the answer and returns the listed ones to the queue, where
//! they come back after their visibility timeout (and go to the
//! dead-letter queue after the redrive policy's receive count).

use std::fmt::Display;
use std::future::Future;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};

/// Runs `handler(message_id, body)` on each record of `event`, one after
/// the other, and reports the records whose handler failed as batch item
/// failures, by message id.
///
/// A record without a message id cannot be reported on its own: it is not
/// handled and is reported with an empty identifier, which makes Lambda
/// treat the whole batch as failed (the safe outcome: nothing is lost). A
/// record without a body is handled with an empty body.
pub async fn handle_batch<F, Fut, E>(event: SqsEvent, mut handler: F) -> SqsBatchResponse
where
    F: FnMut(String, String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let mut response = SqsBatchResponse::default();
    for record in event.records {
        let Some(message_id) = record.message_id.filter(|id| !id.is_empty()) else {
            tracing::error!("SQS record without a message id: failing the whole batch");
            response.add_failure(String::new());
            continue;
        };
        let body = record.body.unwrap_or_default();
        if let Err(err) = handler(message_id.clone(), body).await {
            tracing::warn!(message_id = %message_id, error = %err, "SQS record failed; it will be retried");
            response.add_failure(message_id);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;

    use super::*;

    fn event(records: serde_json::Value) -> SqsEvent {
        serde_json::from_value(json!({ "Records": records })).unwrap()
    }

    fn record(id: &str, body: &str) -> serde_json::Value {
        json!({
            "messageId": id,
            "receiptHandle": format!("rh-{id}"),
            "body": body,
            "attributes": {
                "ApproximateReceiveCount": "1",
                "SentTimestamp": "1545082649183",
                "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                "ApproximateFirstReceiveTimestamp": "1545082649185"
            },
            "messageAttributes": {},
            "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:ap-south-1:123456789012:dhukuti-webhooks",
            "awsRegion": "ap-south-1"
        })
    }

    fn failures(response: &SqsBatchResponse) -> Vec<String> {
        response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone())
            .collect()
    }

    #[tokio::test]
    async fn all_ok_reports_no_failures() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ev = event(json!([
            record("m1", "a"),
            record("m2", "b"),
            record("m3", "c")
        ]));
        let response = handle_batch(ev, |id, body| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push((id, body));
                Ok::<(), String>(())
            }
        })
        .await;
        assert!(response.batch_item_failures.is_empty());
        let seen = seen.lock().unwrap().clone();
        let expected: Vec<(String, String)> = [("m1", "a"), ("m2", "b"), ("m3", "c")]
            .iter()
            .map(|(i, b)| (i.to_string(), b.to_string()))
            .collect();
        assert_eq!(seen, expected);
        // The answer Lambda reads.
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            json!({ "batchItemFailures": [] })
        );
    }

    #[tokio::test]
    async fn failing_records_are_reported_by_message_id() {
        let ev = event(json!([
            record("m1", "ok"),
            record("m2", "boom"),
            record("m3", "ok"),
            record("m4", "boom"),
        ]));
        let response = handle_batch(ev, |_id, body| async move {
            if body == "boom" {
                Err(format!("cannot handle {body}"))
            } else {
                Ok(())
            }
        })
        .await;
        assert_eq!(failures(&response), ["m2", "m4"]);
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            json!({ "batchItemFailures": [{ "itemIdentifier": "m2" }, { "itemIdentifier": "m4" }] })
        );
    }

    #[tokio::test]
    async fn record_without_message_id_fails_without_running_the_handler() {
        let mut no_id = record("x", "orphan");
        no_id.as_object_mut().unwrap().remove("messageId");
        let ev = event(json!([record("m1", "ok"), no_id]));
        let calls = Arc::new(Mutex::new(0));
        let response = handle_batch(ev, |_id, _body| {
            let calls = Arc::clone(&calls);
            async move {
                *calls.lock().unwrap() += 1;
                Ok::<(), &str>(())
            }
        })
        .await;
        assert_eq!(*calls.lock().unwrap(), 1);
        assert_eq!(failures(&response), [""]);
    }

    #[tokio::test]
    async fn empty_event_reports_nothing() {
        let response = handle_batch(event(json!([])), |_id, _body| async {
            Ok::<(), String>(())
        })
        .await;
        assert!(response.batch_item_failures.is_empty());
    }
}
