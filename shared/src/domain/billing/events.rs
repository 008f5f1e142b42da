//! Which webhook event a subscription or billing invoice change is, and
//! the event itself (`data.object`: the resource as its GET answers it).
//! The writers put it in the same transaction as the change (the outbox):
//! a refused transition writes nothing, so it has no event.

use super::invoice::BillingInvoice;
use super::invoice::view::InvoiceView;
use super::lifecycle::SubscriptionView;
use super::subscription::{Subscription, SubscriptionEvent, SubscriptionStatus};
use crate::domain::outbox::{Event, EventType};
use crate::time::Timestamp;

/// The webhook a subscription transition `from` -`event`-> `to` sends,
/// if any. Only a change merchants act on has one: a status change, or a
/// trial extended. `subscription.created` is sent by the create and
/// `subscription.trial_will_end` by the reminder sweep, not by a
/// transition; `incomplete_expired`, a cancel scheduled at period end and
/// a draft starting send none (the subscription is listed with its status).
pub fn subscription_webhook(
    from: SubscriptionStatus,
    event: SubscriptionEvent,
    to: SubscriptionStatus,
) -> Option<EventType> {
    use SubscriptionStatus as S;
    if event == SubscriptionEvent::TrialExtended {
        return Some(EventType::SubscriptionTrialExtended);
    }
    if from == to {
        return None;
    }
    match (event, to) {
        (SubscriptionEvent::TrialEnded, _) => Some(EventType::SubscriptionTrialEnded),
        (SubscriptionEvent::Resume, _) => Some(EventType::SubscriptionResumed),
        (_, S::Active) if from == S::Paused => Some(EventType::SubscriptionResumed),
        (_, S::Active) => Some(EventType::SubscriptionActivated),
        (_, S::PastDue) => Some(EventType::SubscriptionPastDue),
        (_, S::Paused) => Some(EventType::SubscriptionPaused),
        (_, S::Cancelled) => Some(EventType::SubscriptionCancelled),
        _ => None,
    }
}

/// The webhook of a change known only by the statuses it moved between
/// (the sweep's steps): as [`subscription_webhook`] would name it.
pub fn status_webhook(from: SubscriptionStatus, to: SubscriptionStatus) -> Option<EventType> {
    use SubscriptionStatus as S;
    match (from, to) {
        _ if from == to => None,
        (S::Trialing, S::Active) => Some(EventType::SubscriptionTrialEnded),
        (S::Paused, S::Active) => Some(EventType::SubscriptionResumed),
        (_, S::Active) => Some(EventType::SubscriptionActivated),
        (_, S::PastDue) => Some(EventType::SubscriptionPastDue),
        (_, S::Paused) => Some(EventType::SubscriptionPaused),
        (_, S::Cancelled) => Some(EventType::SubscriptionCancelled),
        _ => None,
    }
}

/// The event `t` about subscription `sub` (as changed).
pub fn subscription_event(t: EventType, sub: &Subscription, now: Timestamp) -> Event {
    Event::new(t, &sub.tenant(), SubscriptionView::json(sub), now)
}

/// `subscription.trial_will_end` about `sub`: the reminder sweep writes
/// it with the claim of its trial-end reminder (once per trial end).
pub fn trial_will_end(sub: &Subscription, now: Timestamp) -> Event {
    subscription_event(EventType::SubscriptionTrialWillEnd, sub, now)
}

/// The event `t` about billing invoice `inv` (as changed), its links
/// under `base` (the public base URL) as its GET answers them.
pub fn invoice_event(t: EventType, inv: &BillingInvoice, base: &str, now: Timestamp) -> Event {
    let tenant = crate::domain::Tenant::new(inv.project_id.clone(), inv.mode);
    Event::new(t, &tenant, InvoiceView::json(inv, base), now)
}

#[cfg(test)]
mod tests;
