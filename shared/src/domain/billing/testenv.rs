//! What the billing tests share: deps on a store and a clock, and the
//! stores a test runs on to hold on both backends.

use std::sync::Arc;

use super::subscription::{NewSubscription, Subscription, create, new_subscription};
use super::terms::Terms;
use crate::domain::Tenant;
use crate::store::Store;
use crate::testenv::at;
use crate::time::{Clock, ManualClock, Timestamp};
use crate::{AppState, Config, Deps};

/// Deps on `store`, living by `clock`, with the local gateway's URL.
pub(crate) fn deps_with(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> AppState {
    AppState::new(
        store,
        clock,
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

/// Deps on `store`, a manual clock standing at `now` (RFC 3339).
pub(crate) fn deps_at(store: Arc<dyn Store>, now: &str) -> AppState {
    deps_with(store, Arc::new(ManualClock::new(at(now))))
}

/// The embedded store, and DynamoDB (a fresh table) when
/// `DHUKUTI_TEST_AWS_ENDPOINT` is set (moto).
pub(crate) async fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    let mut out: Vec<(&'static str, Arc<dyn Store>)> =
        vec![("embedded", crate::testenv::memory_store())];
    if let Some(endpoint) = crate::queue::testkit::aws_endpoint() {
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "ap-south-1".into());
        let client = crate::store::dynamo::client_for_endpoint(&endpoint, &region);
        let table = format!("dhukuti-test-{}", ulid::Ulid::new());
        crate::store::dynamo::create_table(&client, &table)
            .await
            .unwrap_or_else(|e| panic!("create table {table}: {e}"));
        out.push((
            "dynamodb",
            Arc::new(crate::store::dynamo::DynamoStore::new(client, table)),
        ));
    }
    out
}

/// A test subscription's input: customer `cus_1`, plan `bp_1`, on
/// `terms` from `start`, no trial (the rest by `..`).
pub(crate) fn sub_input(start: Timestamp, terms: Terms) -> NewSubscription {
    NewSubscription {
        customer_id: "cus_1".into(),
        plan_id: "bp_1".into(),
        terms,
        reference_id: None,
        metadata: serde_json::Map::new(),
        start,
        trial_ends_at: None,
        billing_anchor_day: None,
        dunning_policy_id: None,
        test_clock_id: None,
    }
}

/// The subscription `input` makes for `tenant` at its start, stored.
pub(crate) async fn stored_sub(
    deps: &Deps,
    tenant: &Tenant,
    input: NewSubscription,
) -> Subscription {
    let start = input.start;
    let sub = new_subscription(tenant, input, start).unwrap_or_else(|e| panic!("{e}"));
    create(deps, &sub).await.unwrap_or_else(|e| panic!("{e}"));
    sub
}
