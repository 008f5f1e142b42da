//! The report runner: an EventBridge rule invokes this function every
//! minute; each run takes up the unfinished exports
//! ([`shared::domain::reports::run_unfinished`]: pending ones, and running
//! ones whose runner's lease lapsed) and writes each one's CSV to S3 as a
//! multipart upload. Apart from the scheduler, whose runs must end within
//! its minute: a report of a million rows takes longer than that. The
//! template allows one run at a time and 15 minutes; a run starts no new
//! report after [`DEADLINE`].

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared::AppState;
use shared::domain::reports;

/// How long after its start a run still takes up another report.
pub const DEADLINE: Duration = Duration::from_secs(5 * 60);

/// One invocation: the scheduled event carries nothing it needs. Answers
/// how many reports it finished; a store error fails the invocation.
pub async fn handle(state: &AppState, event: Value) -> Result<Value, lambda_runtime::Error> {
    let _ = event;
    let finished = reports::run_unfinished(state, Instant::now() + DEADLINE).await?;
    tracing::info!(finished, "report run done");
    Ok(json!({ "reports_finished": finished }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::domain::Tenant;
    use shared::domain::reports::{ReportRequest, ReportStatus};

    #[tokio::test]
    async fn a_run_finishes_the_pending_reports() {
        let state = AppState::for_tests();
        let tenant = Tenant::new(
            shared::ids::ProjectId::stored("proj_1"),
            shared::domain::Mode::Sandbox,
        );
        let req = ReportRequest {
            report_type: "payments",
            from: "2026-11-01T00:00:00Z",
            to: "2026-11-02T00:00:00Z",
        };
        let now = state.clock.now();
        let report = reports::create(&state, &tenant, &req, now).await.unwrap();
        let answer = handle(&state, json!({})).await.unwrap();
        assert_eq!(answer, json!({ "reports_finished": 1 }));
        let done = reports::get(&state, &tenant, &report.id).await.unwrap();
        assert_eq!(done.status, ReportStatus::Ready);
        // Nothing is left for the next run.
        let answer = handle(&state, json!({})).await.unwrap();
        assert_eq!(answer, json!({ "reports_finished": 0 }));
    }
}
