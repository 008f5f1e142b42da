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
use futures::StreamExt;

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

/// [`handle_batch`], with up to `concurrency` records handled at once
/// (0 counts as 1). The handlers run interleaved on the calling task, not
/// in parallel: this is for handlers that mostly wait (an HTTP call, a
/// store write). Failures are reported by message id in the order of the
/// records, under the same rules as [`handle_batch`].
pub async fn handle_batch_concurrently<F, Fut, E>(
    event: SqsEvent,
    concurrency: usize,
    mut handler: F,
) -> SqsBatchResponse
where
    F: FnMut(String, String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let outcomes: Vec<Option<String>> = futures::stream::iter(event.records)
        .map(|record| {
            let job = match record.message_id.filter(|id| !id.is_empty()) {
                Some(message_id) => {
                    let body = record.body.unwrap_or_default();
                    Some((message_id.clone(), handler(message_id, body)))
                }
                None => None,
            };
            async move {
                let Some((message_id, running)) = job else {
                    tracing::error!("SQS record without a message id: failing the whole batch");
                    return Some(String::new());
                };
                match running.await {
                    Ok(()) => None,
                    Err(err) => {
                        tracing::warn!(message_id = %message_id, error = %err, "SQS record failed; it will be retried");
                        Some(message_id)
                    }
                }
            }
        })
        .buffered(concurrency.max(1))
        .collect()
        .await;
    let mut response = SqsBatchResponse::default();
    for failed in outcomes.into_iter().flatten() {
        response.add_failure(failed);
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

    // ---- handle_batch_concurrently ----

    #[tokio::test]
    async fn concurrent_failing_records_are_reported_in_record_order() {
        let ev = event(json!([
            record("m1", "ok"),
            record("m2", "boom"),
            record("m3", "ok"),
            record("m4", "boom"),
            record("m5", "ok"),
        ]));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let response = handle_batch_concurrently(ev, 3, |id, body| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(id);
                // The failing ones finish last: the report keeps record order.
                if body == "boom" {
                    tokio::task::yield_now().await;
                    Err(format!("cannot handle {body}"))
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert_eq!(failures(&response), ["m2", "m4"]);
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(
            seen,
            ["m1", "m2", "m3", "m4", "m5"],
            "every record ran once"
        );
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            json!({ "batchItemFailures": [{ "itemIdentifier": "m2" }, { "itemIdentifier": "m4" }] })
        );
    }

    /// Three handlers that each wait for the other two: one at a time,
    /// the first would wait for ever.
    #[tokio::test]
    async fn records_really_run_at_the_same_time() {
        let ev = event(json!([
            record("m1", "a"),
            record("m2", "b"),
            record("m3", "c")
        ]));
        let barrier = Arc::new(tokio::sync::Barrier::new(3));
        let run = handle_batch_concurrently(ev, 3, |_id, _body| {
            let barrier = Arc::clone(&barrier);
            async move {
                barrier.wait().await;
                Ok::<(), String>(())
            }
        });
        let Ok(response) = tokio::time::timeout(std::time::Duration::from_secs(5), run).await
        else {
            panic!("the records did not run concurrently")
        };
        assert!(response.batch_item_failures.is_empty());
    }

    #[tokio::test]
    async fn no_more_than_the_concurrency_run_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let ids: Vec<serde_json::Value> = (1..=7).map(|i| record(&format!("m{i}"), "x")).collect();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let response = handle_batch_concurrently(event(json!(ids)), 2, |_id, _body| {
            let running = Arc::clone(&running);
            let most = Arc::clone(&most);
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        })
        .await;
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrently_a_record_without_message_id_fails_the_batch_unhandled() {
        let mut no_id = record("x", "orphan");
        no_id.as_object_mut().unwrap().remove("messageId");
        let ev = event(json!([record("m1", "ok"), no_id, record("m3", "ok")]));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let response = handle_batch_concurrently(ev, 0, |id, body| {
            let calls = Arc::clone(&calls);
            async move {
                calls.lock().unwrap().push((id, body));
                Ok::<(), &str>(())
            }
        })
        .await;
        assert_eq!(calls.lock().unwrap().len(), 2);
        assert!(calls.lock().unwrap().iter().all(|(_, b)| b == "ok"));
        assert_eq!(failures(&response), [""]);
        let empty = handle_batch_concurrently(event(json!([])), 10, |_id, _body| async {
            Ok::<(), String>(())
        })
        .await;
        assert!(empty.batch_item_failures.is_empty());
    }
}
