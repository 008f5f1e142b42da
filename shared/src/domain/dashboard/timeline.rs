//! A payment's timeline for its dashboard page: its events, oldest first,
//! each with where it was delivered when the reader may see webhook
//! endpoints (`Action::Webhooks` in the role table).

use crate::app::Deps;
use crate::domain::outbox::{self, TimelineEntry};
use crate::domain::webhooks::{self, Delivery};
use crate::ids::PaymentId;
use crate::store::StoreError;

/// Payment `id`'s events, oldest first (at most `events`), each with its
/// deliveries (at most `deliveries` each, read side by side), or with
/// none read at all when `deliveries` is `None` (a reader who may not see
/// webhook endpoints nor what they answered). The caller has found the
/// payment in its tenant.
pub async fn payment_timeline(
    deps: &Deps,
    id: &PaymentId,
    events: usize,
    deliveries: Option<usize>,
) -> Result<Vec<(TimelineEntry, Option<Vec<Delivery>>)>, StoreError> {
    let store = &*deps.store;
    let entries = outbox::of_payment(store, id, events).await?;
    let Some(deliveries) = deliveries else {
        return Ok(entries.into_iter().map(|e| (e, None)).collect());
    };
    let sent = futures::future::try_join_all(
        entries
            .iter()
            .map(|e| webhooks::deliveries_of_event(store, &e.event_id, deliveries)),
    )
    .await?;
    Ok(entries
        .into_iter()
        .zip(sent.into_iter().map(Some))
        .collect())
}
