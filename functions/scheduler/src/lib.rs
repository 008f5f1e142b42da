//! The scheduled sweep: an EventBridge rule invokes this function every
//! minute; each run expires due checkout sessions and reconciles open
//! payments with their providers ([`shared::domain::attempts::sweep`]).
//!
//! The template allows one run at a time (reserved concurrency 1). A store
//! error fails the invocation so Lambda records it; the next run tries
//! again.

use serde_json::Value;
use shared::AppState;
use shared::domain::attempts::SweepReport;
use shared::store::StoreError;

pub use shared::domain::attempts::sweep;

/// One invocation. The event (EventBridge's scheduled event) carries
/// nothing the sweep needs: the time comes from the state's clock.
/// Answers the [`SweepReport`] as JSON.
pub async fn handle(state: &AppState, event: Value) -> Result<Value, lambda_runtime::Error> {
    let _ = event;
    report(sweep(state, state.clock.now()).await)
}

/// Logs the outcome of a sweep and turns it into the invocation's answer.
fn report(result: Result<SweepReport, StoreError>) -> Result<Value, lambda_runtime::Error> {
    match result {
        Ok(r) => {
            tracing::info!(
                sessions_expired = r.sessions_expired,
                payments_checked = r.payments_checked,
                payments_settled = r.payments_settled,
                errors = r.errors,
                "sweep done"
            );
            Ok(serde_json::to_value(&r)?)
        }
        Err(e) => {
            tracing::error!(error = %e, "sweep failed");
            Err(Box::new(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use shared::Config;
    use shared::store::embedded::EmbeddedStore;
    use shared::time::{Clock, ManualClock, SystemClock};

    use super::*;

    fn state() -> AppState {
        let store = match EmbeddedStore::in_memory() {
            Ok(s) => s,
            Err(e) => panic!("in-memory store: {e}"),
        };
        AppState::new(
            Arc::new(store),
            Arc::new(ManualClock::new(SystemClock.now())),
            Config {
                public_base_url: "http://127.0.0.1:8080".into(),
            },
        )
    }

    /// What EventBridge sends on a `rate(...)` schedule.
    fn scheduled_event() -> Value {
        json!({
            "version": "0",
            "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": "123456789012",
            "time": "2025-01-01T00:00:00Z",
            "region": "ap-south-1",
            "resources": ["arn:aws:events:ap-south-1:123456789012:rule/sweep"],
            "detail": {}
        })
    }

    #[tokio::test]
    async fn a_sweep_on_an_empty_store_answers_the_four_counts() {
        let answer = handle(&state(), scheduled_event()).await;
        let Ok(answer) = answer else {
            panic!("{:?}", answer.err())
        };
        let Some(object) = answer.as_object() else {
            panic!("not an object: {answer}")
        };
        for field in [
            "sessions_expired",
            "payments_checked",
            "payments_settled",
            "errors",
        ] {
            assert_eq!(object.get(field), Some(&json!(0)), "{field} in {answer}");
        }
    }

    #[tokio::test]
    async fn any_event_payload_is_accepted() {
        assert!(handle(&state(), Value::Null).await.is_ok());
        assert!(handle(&state(), json!({})).await.is_ok());
    }

    #[test]
    fn a_store_error_fails_the_invocation() {
        let failed = report(Err(StoreError::Unavailable("throttled".into())));
        let Err(e) = failed else {
            panic!("a store error must fail the run: {failed:?}")
        };
        assert!(e.to_string().contains("throttled"), "{e}");
    }

    #[test]
    fn a_report_answers_its_counts() {
        let done = report(Ok(SweepReport {
            sessions_expired: 3,
            payments_checked: 5,
            payments_settled: 2,
            errors: 1,
            refunds_checked: 4,
            refunds_resolved: 1,
        }));
        let Ok(done) = done else {
            panic!("{:?}", done.err())
        };
        assert_eq!(
            done,
            json!({
                "sessions_expired": 3,
                "payments_checked": 5,
                "payments_settled": 2,
                "errors": 1,
                "refunds_checked": 4,
                "refunds_resolved": 1
            })
        );
    }
}
