//! The events function: `GET /c/{id}/events` (a Direct-QR or mobile
//! session's server-sent events) behind a Lambda function URL with
//! `InvokeMode: RESPONSE_STREAM`, so each event reaches the customer's
//! screen when it happens. API Gateway buffers a Lambda's answer until it
//! ends; the hosted function's copy of the route stays for the local
//! gateway and as the fallback. The stream itself is the hosted one's
//! (`hosted::events_router`): the same limits, proof and event ids.

use std::time::Duration;

use shared::AppState;

/// How long one streamed connection lasts before the screen reconnects
/// with `Last-Event-ID`: under the function's 60 s timeout, long enough
/// that a waiting screen costs about one invocation a minute.
pub const STREAM_FOR: Duration = Duration::from_secs(50);

/// The function's routes.
pub fn router(state: AppState) -> axum::Router {
    hosted::events_router(state, STREAM_FOR)
}
