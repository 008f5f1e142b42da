//! Webhook endpoints, the fan-out of outbox events into deliveries, and
//! the delivery of each one with retries (decisions, "Webhooks").
//!
//! Storage:
//! - an endpoint at `PROJ#<project>#<mode>#WE` / `<we_id>`: a project's
//!   endpoints are one strongly consistent partition (fan-out reads it);
//!   its signing secret is sealed with the credentials master key, never
//!   stored in the clear;
//! - their number at `PROJ#<project>#<mode>#WECOUNT` / `COUNT` (`n`),
//!   changed in the transaction that writes or deletes an endpoint, so
//!   [`MAX_ENDPOINTS`] holds under concurrent registrations (missing for
//!   data from before it: counted from the partition on first use);
//! - a delivery at `EVT#<evt_id>` / `WHD#<we_id>`: one per (event,
//!   endpoint) by construction, so a fan-out that runs twice writes it
//!   once; listed per endpoint through `gsi1` (`WE#<we_id>#WHD`, by its
//!   time-sortable id, newest first).
//!
//! Delivery is at least once. A queue message names a delivery and the
//! attempt it is for; the handler claims the attempt with a conditional
//! lease, sends, queues the next attempt's message when one is due, then
//! logs the outcome with a write conditioned on that lease, and only then
//! lets its message go. A message for an attempt already made, or for a
//! final delivery, is dropped, so a duplicate message never re-sends a
//! success; a message ahead of the log waits. A crash between send and log
//! leaves the message on the queue: it comes back after the lease and the
//! same event (same id) is sent again.

mod delivery;
mod endpoints;
mod fan_out;
mod log;
mod test_event;
#[cfg(test)]
mod tests;

pub use delivery::{Outcome, Resent, handle_message, requeue_overdue, resend, sweep};
pub use endpoints::{
    CreateEndpoint, Endpoint, EndpointCounter, EndpointView, PatchEndpoint, WebhookError, create,
    create_with, delete, delete_with, get, list, list_in, parse_events, patch, patch_with,
};
pub use fan_out::{DeliveryMessage, DispatchError, FanOutReport, fan_out_by_id, fan_out_pending};
pub use log::{
    Delivery, DeliveryStatus, DeliveryView, deliveries, deliveries_of_event, deliveries_page,
    delivery,
};
pub use test_event::send_test_event;

/// Most endpoints one project may register per mode.
pub const MAX_ENDPOINTS: usize = 16;
/// Deliveries the log answers (spec, "Limits").
pub const DELIVERY_LOG: usize = 50;
pub use crate::webhooks::settings::{RETRY_SCHEDULE, TIMEOUT, WebhookSettings, parse_schedule};

// ------------------------------------------------------------- endpoints
