//! A payment's timeline for its dashboard page: its events, oldest first,
//! each with where it was delivered when the reader may see webhook
//! endpoints (`Action::Webhooks` in the role table); and a subscription's
//! or billing customer's ([`billing_timeline`]): its webhook events and
//! its invoices' notices, newest first.

use crate::app::Deps;
use crate::domain::billing::notice_due::{NoticeEntry, NoticeSchedule};
use crate::domain::outbox::{self, BillingTimeline, TimelineEntry};
use crate::domain::record;
use crate::domain::webhooks::{self, Delivery};
use crate::ids::{BillingInvoiceId, PaymentId, SubscriptionId};
use crate::store::{Query, SkCond, StoreError};
use crate::time::Timestamp;

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

/// One row of a subscription's or billing customer's timeline: a webhook
/// event, or one channel of a billing notice (reminder, dunning step).
#[derive(Clone, Debug, PartialEq)]
pub enum BillingRow {
    Event(TimelineEntry),
    Notice {
        /// The invoice it is about (`None`: a trial's notice).
        invoice: Option<BillingInvoiceId>,
        entry: NoticeEntry,
    },
}

impl BillingRow {
    pub fn at(&self) -> Timestamp {
        match self {
            BillingRow::Event(e) => e.created_at,
            BillingRow::Notice { entry, .. } => entry.at,
        }
    }
}

/// A billing timeline, newest first, at most `limit` rows: the events of
/// `timeline` (its own partition, newest first) and every notice of the
/// billing invoices `invoices` and of the trials of `trials` (their
/// schedules' histories), read side by side. The caller has found the
/// subscription or customer, and those invoices, in its tenant.
pub async fn billing_timeline(
    deps: &Deps,
    timeline: BillingTimeline<'_>,
    invoices: &[BillingInvoiceId],
    trials: &[SubscriptionId],
    limit: usize,
) -> Result<Vec<BillingRow>, StoreError> {
    let store = &*deps.store;
    let (events, schedules, trial_schedules) = futures::try_join!(
        outbox::of_billing(store, timeline, limit),
        futures::future::try_join_all(invoices.iter().map(|id| async move {
            let key = NoticeSchedule::invoice_key(id);
            record::get::<NoticeSchedule>(store, &key).await
        })),
        futures::future::try_join_all(trials.iter().map(|sub| {
            let (pk, prefix) = NoticeSchedule::trials_of(sub);
            let query = Query::partition(pk)
                .sk(SkCond::BeginsWith(prefix.to_owned()))
                .limit(limit);
            async move { record::all_of::<NoticeSchedule>(store, &query).await }
        })),
    )?;
    let mut rows: Vec<BillingRow> = events.into_iter().map(BillingRow::Event).collect();
    let notices = schedules
        .into_iter()
        .flatten()
        .chain(trial_schedules.into_iter().flatten());
    for s in notices {
        rows.extend(s.history.into_iter().map(|entry| BillingRow::Notice {
            invoice: s.invoice_id.clone(),
            entry,
        }));
    }
    // Newest first; at one time, a notice above the events (it follows
    // the invoice's issue), events in their timeline's order.
    rows.sort_by_key(|r| (std::cmp::Reverse(r.at()), matches!(r, BillingRow::Event(_))));
    rows.truncate(limit);
    Ok(rows)
}
