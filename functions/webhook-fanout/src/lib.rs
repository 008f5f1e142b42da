//! The webhook fan-out: the table's stream triggers this function
//! (DynamoDB Streams event source mapping, filtered to inserts of outbox
//! events, `ReportBatchItemFailures`). For each new event it creates the
//! deliveries and queues their first attempt ([`fan_out_by_id`]), which
//! also takes the event out of the outbox.
//!
//! A stream shard is ordered, and Lambda resumes a shard from the lowest
//! sequence number reported: on the first record that fails, the function
//! stops and reports that record and every later one. Fan-out is safe to
//! run again, so the records handled before it are harmless to see twice
//! (bisection may replay them). What the stream never delivers (records
//! expire after 24 hours, or the retries ran out) the scheduler's outbox
//! sweep still fans out.

use aws_lambda_events::dynamodb::{Event, EventRecord};
use aws_lambda_events::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use serde_dynamo::AttributeValue;
use shared::AppState;
use shared::domain::webhooks::fan_out_by_id;
use shared::ids::EventId;

/// The outbox event a stream record announces: its id, for an INSERT of
/// an item at `EVT#<id>` / `EVT` (deliveries share that partition, under
/// other sort keys; they are not events).
pub fn outbox_event_id(record: &EventRecord) -> Option<EventId> {
    if record.event_name != "INSERT" {
        return None;
    }
    let key = |name: &str| match record.change.keys.get(name) {
        Some(AttributeValue::S(s)) => Some(s.as_str()),
        _ => None,
    };
    // The key of an event our own table holds.
    shared::keys::record_id(shared::keys::Record::Event, key("pk")?, key("sk")?)
        .map(EventId::stored)
}

fn failure(record: &EventRecord) -> DynamoDbBatchItemFailure {
    let mut failure = DynamoDbBatchItemFailure::default();
    // No sequence number (never seen in practice): an empty identifier
    // makes Lambda retry the whole batch, the safe outcome.
    failure.item_identifier = Some(record.change.sequence_number.clone().unwrap_or_default());
    failure
}

/// One invocation: fans out the events the batch announces, in order.
/// Answers the records to retry: none, or the first that failed and all
/// after it.
pub async fn handle(state: &AppState, event: Event) -> DynamoDbEventResponse {
    let total = event.records.len();
    let mut response = DynamoDbEventResponse::default();
    let (mut events, mut deliveries, mut ignored) = (0usize, 0usize, 0usize);
    let mut records = event.records.iter();
    while let Some(record) = records.next() {
        let Some(id) = outbox_event_id(record) else {
            ignored += 1;
            continue;
        };
        match fan_out_by_id(state, &id).await {
            Ok(n) => {
                events += 1;
                deliveries += n;
            }
            Err(e) => {
                tracing::warn!(
                    event_id = %id,
                    sequence_number = record.change.sequence_number.as_deref().unwrap_or(""),
                    error = %e,
                    "fan-out failed; this record and the rest of the batch will be retried"
                );
                response.batch_item_failures.push(failure(record));
                response
                    .batch_item_failures
                    .extend(records.by_ref().map(failure));
                break;
            }
        }
    }
    tracing::info!(
        records = total,
        events,
        deliveries_queued = deliveries,
        ignored,
        reported = response.batch_item_failures.len(),
        "webhook fan-out batch done"
    );
    response
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use shared::domain::Mode;
    use shared::domain::outbox::{self, EventType};
    use std::sync::Arc;

    use super::*;

    fn state() -> AppState {
        AppState::for_tests()
    }

    /// One stream record as DynamoDB Streams hands it to Lambda
    /// (`NEW_AND_OLD_IMAGES`).
    fn record(name: &str, seq: &str, pk: &str, sk: &str) -> Value {
        let image = json!({
            "pk": {"S": pk},
            "sk": {"S": sk},
            "type": {"S": "payment.succeeded"},
            "dispatched": {"BOOL": false},
            "gsi2pk": {"S": "OUTBOX#1"},
            "gsi2sk": {"S": pk.trim_start_matches("EVT#")}
        });
        let mut change = json!({
            "ApproximateCreationDateTime": 1763800000.0,
            "Keys": {"pk": {"S": pk}, "sk": {"S": sk}},
            "SequenceNumber": seq,
            "SizeBytes": 312,
            "StreamViewType": "NEW_AND_OLD_IMAGES"
        });
        if name != "REMOVE" {
            change["NewImage"] = image.clone();
        }
        if name != "INSERT" {
            change["OldImage"] = image;
        }
        json!({
            "eventID": format!("c4ca4238a0b923820dcc509a6f75849{seq}"),
            "eventName": name,
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "ap-south-1",
            "dynamodb": change,
            "eventSourceARN": "arn:aws:dynamodb:ap-south-1:123456789012:table/dhukuti-Table-1ABC/stream/2026-11-22T00:00:00.000"
        })
    }

    fn event(records: Vec<Value>) -> Event {
        match serde_json::from_value(json!({ "Records": records })) {
            Ok(e) => e,
            Err(e) => panic!("{e}"),
        }
    }

    fn reported(response: &DynamoDbEventResponse) -> Vec<String> {
        response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone().unwrap_or_default())
            .collect()
    }

    async fn recorded_event(state: &AppState) -> outbox::Event {
        let e = outbox::Event::new(
            EventType::PaymentSucceeded,
            &shared::domain::Tenant::new("proj_1", Mode::Sandbox),
            json!({"id": "pay_1", "status": "success"}),
            state.clock.now(),
        );
        let put = match e.put_ops() {
            Ok(ops) => ops,
            Err(err) => panic!("{err}"),
        };
        if let Err(err) = state.store.transact(put).await {
            panic!("{err}")
        }
        e
    }

    #[test]
    fn only_inserts_of_outbox_events_are_fanned_out() {
        let ev = event(vec![
            record("INSERT", "100", "EVT#evt_1", "EVT"),
            record("INSERT", "200", "EVT#evt_1", "WHD#we_1"),
            record("MODIFY", "300", "EVT#evt_1", "EVT"),
            record("REMOVE", "400", "EVT#evt_1", "EVT"),
            record("INSERT", "500", "PAY#pay_1", "EVT"),
            record("INSERT", "600", "EVT#", "EVT"),
        ]);
        let ids: Vec<Option<String>> = ev
            .records
            .iter()
            .map(|r| outbox_event_id(r).map(String::from))
            .collect();
        assert_eq!(
            ids,
            [Some("evt_1".to_owned()), None, None, None, None, None]
        );
    }

    #[tokio::test]
    async fn an_insert_is_fanned_out_and_the_rest_ignored() {
        let state = state();
        let e = recorded_event(&state).await;
        let pk = format!("EVT#{}", e.id);
        let response = handle(
            &state,
            event(vec![
                record("INSERT", "111", &pk, "EVT"),
                record("INSERT", "222", &pk, "WHD#we_01JZZZZZZZZZZZZZZZZZZZZZZZ"),
                record("REMOVE", "333", "EVT#evt_gone", "EVT"),
            ]),
        )
        .await;
        assert!(reported(&response).is_empty(), "{response:?}");
        // No endpoint: nothing queued, but the event left the outbox.
        match outbox::get(&state, &e.id).await {
            Ok(Some(stored)) => assert!(stored.dispatched),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            serde_json::to_value(&response).ok(),
            Some(json!({ "batchItemFailures": [] }))
        );
    }

    /// The first failure stops the batch: it and every later record are
    /// reported, by sequence number; the earlier ones are not.
    #[tokio::test]
    async fn a_failure_reports_that_record_and_all_later_ones() {
        use shared::store::faults::{Fault, FaultyStore, Op};
        let state = state();
        let first = recorded_event(&state).await;
        let second = recorded_event(&state).await;
        let faulty = Arc::new(FaultyStore::new(state.store.clone()));
        let mut state = state;
        state.store = faulty.clone();
        // The first event's fan-out reads the event (1 get); the second's
        // read is the next get.
        faulty.plan(Op::Get, 1, Fault::throttled());
        let response = handle(
            &state,
            event(vec![
                record("INSERT", "100", &format!("EVT#{}", first.id), "EVT"),
                record("INSERT", "200", &format!("EVT#{}", second.id), "EVT"),
                record("REMOVE", "300", "EVT#evt_x", "EVT"),
                record("INSERT", "400", "EVT#evt_y", "EVT"),
            ]),
        )
        .await;
        assert_eq!(faulty.injected(), 1);
        assert_eq!(reported(&response), ["200", "300", "400"]);
        assert_eq!(
            serde_json::to_value(&response).ok(),
            Some(json!({ "batchItemFailures": [
                {"itemIdentifier": "200"}, {"itemIdentifier": "300"}, {"itemIdentifier": "400"}
            ] }))
        );
    }
}
