//! The outbox: every state change merchants hear about writes its event in
//! the same transaction as the change (decisions, "Webhooks"). Delivery
//! reads the outbox later; an event is never lost because a queue or a
//! receiver was down when the state changed.
//!
//! Stored at `EVT#<id>` / `EVT`, listed per project and mode through
//! `gsi1` (`PROJ#<project>#<mode>#EVT`, newest first), and, until
//! delivered, through the sparse `gsi2` partition `OUTBOX#<shard>` by id
//! (oldest first), spread over [`SHARDS`] partitions so no one partition
//! takes every write. An event about a payment also writes a small entry
//! in the payment's timeline (`PAY#<payment>#EVT` / `<event id>`), in the
//! same transaction: the dashboard reads a payment's events from there.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Mode;
use super::record::{Changes, Entry, Record, from_item};
use crate::Deps;
use crate::domain::Tenant;
use crate::ids::{EndpointId, EventId, PaymentId, ProjectId};
use crate::keys;
use crate::store::{Cond, Index, Key, Query, Store, StoreError, TxOp};
use crate::time::Timestamp;

/// How many `gsi2` partitions hold undelivered events.
pub const SHARDS: u32 = 4;

/// Every event type (decisions, "Webhooks").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventType {
    #[serde(rename = "payment.succeeded")]
    PaymentSucceeded,
    #[serde(rename = "payment.failed")]
    PaymentFailed,
    #[serde(rename = "payment.cancelled")]
    PaymentCancelled,
    #[serde(rename = "payment.refunded")]
    PaymentRefunded,
    #[serde(rename = "payment_link.paid")]
    PaymentLinkPaid,
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    #[serde(rename = "refund.failed")]
    RefundFailed,
    #[serde(rename = "invoice.paid")]
    InvoicePaid,
    #[serde(rename = "subscription.created")]
    SubscriptionCreated,
    #[serde(rename = "subscription.activated")]
    SubscriptionActivated,
    #[serde(rename = "subscription.trial_will_end")]
    SubscriptionTrialWillEnd,
    #[serde(rename = "subscription.trial_ended")]
    SubscriptionTrialEnded,
    #[serde(rename = "subscription.trial_extended")]
    SubscriptionTrialExtended,
    #[serde(rename = "subscription.past_due")]
    SubscriptionPastDue,
    #[serde(rename = "subscription.paused")]
    SubscriptionPaused,
    #[serde(rename = "subscription.resumed")]
    SubscriptionResumed,
    #[serde(rename = "subscription.cancelled")]
    SubscriptionCancelled,
    #[serde(rename = "subscription.updated")]
    SubscriptionUpdated,
    #[serde(rename = "billing_invoice.created")]
    BillingInvoiceCreated,
    #[serde(rename = "billing_invoice.paid")]
    BillingInvoicePaid,
    #[serde(rename = "billing_invoice.overdue")]
    BillingInvoiceOverdue,
    #[serde(rename = "billing_invoice.voided")]
    BillingInvoiceVoided,
    #[serde(rename = "billing_invoice.uncollectible")]
    BillingInvoiceUncollectible,
    #[serde(rename = "billing_invoice.payment_refunded")]
    BillingInvoicePaymentRefunded,
    #[serde(rename = "coupon.created")]
    CouponCreated,
    #[serde(rename = "coupon.deactivated")]
    CouponDeactivated,
    #[serde(rename = "promotion_code.created")]
    PromotionCodeCreated,
    #[serde(rename = "promotion_code.deactivated")]
    PromotionCodeDeactivated,
    #[serde(rename = "customer.credit_updated")]
    CustomerCreditUpdated,
    #[serde(rename = "invoice.upcoming")]
    InvoiceUpcoming,
    #[serde(rename = "reconciliation.completed")]
    ReconciliationCompleted,
}

/// `customer.credit_updated`'s flat fields: (flat, the view's).
const CUSTOMER_FLAT: [(&str, &str); 4] = [
    ("id", "id"),
    ("customer_id", "id"),
    ("credit_balance", "creditBalance"),
    ("metadata", "metadata"),
];

/// `reconciliation.completed`'s flat fields: (flat, the view's).
const RECON_FLAT: [(&str, &str); 5] = [
    ("id", "id"),
    ("provider", "provider"),
    ("date", "date"),
    ("status", "status"),
    ("discrepancies", "discrepancies"),
];

impl EventType {
    pub const ALL: [EventType; 31] = [
        EventType::PaymentSucceeded,
        EventType::PaymentFailed,
        EventType::PaymentCancelled,
        EventType::PaymentRefunded,
        EventType::PaymentLinkPaid,
        EventType::RefundSucceeded,
        EventType::RefundFailed,
        EventType::InvoicePaid,
        EventType::SubscriptionCreated,
        EventType::SubscriptionActivated,
        EventType::SubscriptionTrialWillEnd,
        EventType::SubscriptionTrialEnded,
        EventType::SubscriptionTrialExtended,
        EventType::SubscriptionPastDue,
        EventType::SubscriptionPaused,
        EventType::SubscriptionResumed,
        EventType::SubscriptionCancelled,
        EventType::SubscriptionUpdated,
        EventType::BillingInvoiceCreated,
        EventType::BillingInvoicePaid,
        EventType::BillingInvoiceOverdue,
        EventType::BillingInvoiceVoided,
        EventType::BillingInvoiceUncollectible,
        EventType::BillingInvoicePaymentRefunded,
        EventType::CouponCreated,
        EventType::CouponDeactivated,
        EventType::PromotionCodeCreated,
        EventType::PromotionCodeDeactivated,
        EventType::CustomerCreditUpdated,
        EventType::InvoiceUpcoming,
        EventType::ReconciliationCompleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::PaymentSucceeded => "payment.succeeded",
            EventType::PaymentFailed => "payment.failed",
            EventType::PaymentCancelled => "payment.cancelled",
            EventType::PaymentRefunded => "payment.refunded",
            EventType::PaymentLinkPaid => "payment_link.paid",
            EventType::RefundSucceeded => "refund.succeeded",
            EventType::RefundFailed => "refund.failed",
            EventType::InvoicePaid => "invoice.paid",
            EventType::SubscriptionCreated => "subscription.created",
            EventType::SubscriptionActivated => "subscription.activated",
            EventType::SubscriptionTrialWillEnd => "subscription.trial_will_end",
            EventType::SubscriptionTrialEnded => "subscription.trial_ended",
            EventType::SubscriptionTrialExtended => "subscription.trial_extended",
            EventType::SubscriptionPastDue => "subscription.past_due",
            EventType::SubscriptionPaused => "subscription.paused",
            EventType::SubscriptionResumed => "subscription.resumed",
            EventType::SubscriptionCancelled => "subscription.cancelled",
            EventType::SubscriptionUpdated => "subscription.updated",
            EventType::BillingInvoiceCreated => "billing_invoice.created",
            EventType::BillingInvoicePaid => "billing_invoice.paid",
            EventType::BillingInvoiceOverdue => "billing_invoice.overdue",
            EventType::BillingInvoiceVoided => "billing_invoice.voided",
            EventType::BillingInvoiceUncollectible => "billing_invoice.uncollectible",
            EventType::BillingInvoicePaymentRefunded => "billing_invoice.payment_refunded",
            EventType::CouponCreated => "coupon.created",
            EventType::CouponDeactivated => "coupon.deactivated",
            EventType::PromotionCodeCreated => "promotion_code.created",
            EventType::PromotionCodeDeactivated => "promotion_code.deactivated",
            EventType::CustomerCreditUpdated => "customer.credit_updated",
            EventType::InvoiceUpcoming => "invoice.upcoming",
            EventType::ReconciliationCompleted => "reconciliation.completed",
        }
    }

    pub fn parse(s: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// A subscription's event (`data.object`: the subscription as
    /// `GET /v1/billing/subscriptions/{id}` answers it).
    pub fn is_subscription(self) -> bool {
        self.as_str().starts_with("subscription.")
    }

    /// A coupon's or promotion code's event (`data.object`: the record
    /// as its GET answers it).
    pub fn is_coupon(self) -> bool {
        let s = self.as_str();
        s.starts_with("coupon.") || s.starts_with("promotion_code.")
    }

    /// A billing invoice's event (`data.object`: the invoice as
    /// `GET /v1/billing/invoices/{id}` answers it; `invoice.upcoming`'s is
    /// a draft of that shape, never stored: no `id`, `number` or links).
    pub fn is_billing_invoice(self) -> bool {
        self.as_str().starts_with("billing_invoice.") || self == EventType::InvoiceUpcoming
    }
}

/// A billing invoice event's flat fields in `data` (`Event::flat_fields`):
/// (name in `data`, field of the invoice view).
const BILLING_INVOICE_FLAT: [(&str, &str); 9] = [
    ("id", "id"),
    ("invoice_id", "id"),
    ("invoice_number", "number"),
    ("amount", "amount"),
    ("amount_due", "amountDue"),
    ("currency", "currency"),
    ("status", "status"),
    ("subscription_id", "subscriptionId"),
    ("customer_id", "customerId"),
];

/// The flat fields of `coupon.*` and `promotion_code.*` events.
const COUPON_FLAT: [(&str, &str); 5] = [
    ("id", "id"),
    ("code", "code"),
    ("coupon_id", "couponId"),
    ("active", "active"),
    ("metadata", "metadata"),
];

/// A stored event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: EventId,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub project_id: ProjectId,
    pub mode: Mode,
    pub created_at: Timestamp,
    /// The resource as the API returns it.
    pub object: Value,
    /// Whether delivery has taken it (then it leaves the outbox index).
    #[serde(default)]
    pub dispatched: bool,
    /// For a test event: the one endpoint it is for (others never get it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<EndpointId>,
    /// The payment the event is about, if any (its timeline lists it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<PaymentId>,
    /// What changed fields were before (`subscription.updated`): sent as
    /// `data.previous_attributes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_attributes: Option<Value>,
}

crate::attrs! { Event {
    ID: EventId = id,
    EVENT_TYPE: EventType = event_type as "type",
    PROJECT_ID: ProjectId = project_id,
    MODE: Mode = mode,
    CREATED_AT: Timestamp = created_at,
    OBJECT: Value = object,
    DISPATCHED: bool = dispatched,
    ENDPOINT_ID: Option<EndpointId> = endpoint_id,
    PAYMENT_ID: Option<PaymentId> = payment_id,
} }

impl Event {
    /// A new event about `object` (its API view), created at `now`.
    pub fn new(event_type: EventType, tenant: &Tenant, object: Value, now: Timestamp) -> Event {
        Event {
            id: EventId::new(),
            event_type,
            project_id: tenant.project.clone(),
            mode: tenant.mode,
            created_at: now,
            payment_id: payment_of(&object).map(|p| PaymentId::stored(&p)),
            object,
            dispatched: false,
            endpoint_id: None,
            previous_attributes: None,
        }
    }

    /// The same event, about payment `id` (when its object does not name
    /// the payment, as a payment link's does not).
    pub fn about_payment(mut self, id: &PaymentId) -> Event {
        self.payment_id = Some(id.clone());
        self
    }

    pub fn key(id: &EventId) -> Key {
        keys::record(keys::Record::Event, id)
    }

    fn list_partition(tenant: &Tenant) -> String {
        keys::per_mode(&tenant.project, tenant.mode, keys::PerMode::Events)
    }

    /// The outbox partition of event `id`.
    pub fn outbox_partition(id: &EventId) -> String {
        keys::open(keys::Open::Outbox, keys::shard_of(id, SHARDS))
    }

    /// The body merchants receive (decisions, "Webhooks"):
    /// `{id, type, created, livemode, data: {object, ...}}`, with the
    /// resource's main fields also flat in `data` ([`Event::flat_fields`]).
    pub fn body(&self) -> Value {
        let mut data = self.flat_fields();
        data.insert("object".into(), self.object.clone());
        if let Some(previous) = &self.previous_attributes {
            data.insert("previous_attributes".into(), previous.clone());
        }
        serde_json::json!({
            "id": self.id,
            "type": self.event_type.as_str(),
            "created": self.created_at.unix_seconds(),
            "livemode": self.mode.is_live(),
            "data": data,
        })
    }

    /// The resource's main fields, snake_case, flat in `data` beside
    /// `object`: plugins and SDK examples written for the product the
    /// contract describes read `data.id`, `data.amount`, `data.status`…
    /// Payment events: `id`, `amount`, `currency`, `provider`,
    /// `provider_ref`, `session_id`, `metadata`, `status`; refund events:
    /// `id`, `payment_id`, `amount`, `currency`, `status`, `provider_ref`;
    /// `payment_link.paid`: `id`, `amount`, `currency`, `provider`,
    /// `metadata`, `url`, `status` (`active`/`inactive`);
    /// `invoice.paid`: `id` and `invoice_id`, `invoice_number`, `amount`
    /// (the total), `currency`, `status` (the collection status);
    /// `subscription.*`: `id` and `subscription_id`, `customer_id`,
    /// `plan_id`, `status`, `metadata`; `customer.credit_updated`: `id`
    /// and `customer_id`, `credit_balance`, `metadata`; `billing_invoice.*`: `id` and
    /// `invoice_id`, `invoice_number`, `amount` (the total), `amount_due`,
    /// `currency`, `status`, `subscription_id`, `customer_id`;
    /// `coupon.*` and `promotion_code.*`: `id`, `code`, `coupon_id`,
    /// `active`, `metadata`. A field the resource does not have is left
    /// out.
    pub fn flat_fields(&self) -> serde_json::Map<String, Value> {
        let o = &self.object;
        let mut out = serde_json::Map::new();
        let mut copy = |to: &str, from: &str| {
            if let Some(v) = o.get(from) {
                out.insert(to.to_owned(), v.clone());
            }
        };
        match self.event_type {
            EventType::PaymentSucceeded
            | EventType::PaymentFailed
            | EventType::PaymentCancelled
            | EventType::PaymentRefunded => {
                for (to, from) in [
                    ("id", "id"),
                    ("amount", "amount"),
                    ("currency", "currency"),
                    ("provider", "provider"),
                    ("provider_ref", "providerRef"),
                    ("session_id", "checkoutSessionId"),
                    ("metadata", "metadata"),
                    ("status", "status"),
                ] {
                    copy(to, from);
                }
            }
            EventType::RefundSucceeded | EventType::RefundFailed => {
                for (to, from) in [
                    ("id", "id"),
                    ("payment_id", "paymentId"),
                    ("amount", "amount"),
                    ("currency", "currency"),
                    ("status", "status"),
                    ("provider_ref", "providerRefundId"),
                ] {
                    copy(to, from);
                }
            }
            EventType::PaymentLinkPaid => {
                for (to, from) in [
                    ("id", "id"),
                    ("amount", "amount"),
                    ("currency", "currency"),
                    ("provider", "provider"),
                    ("metadata", "metadata"),
                    ("url", "url"),
                ] {
                    copy(to, from);
                }
                if let Some(active) = o.get("active").and_then(Value::as_bool) {
                    let word = if active { "active" } else { "inactive" };
                    out.insert("status".into(), Value::from(word));
                }
            }
            EventType::InvoicePaid => {
                for (to, from) in [
                    ("id", "id"),
                    ("invoice_id", "id"),
                    ("invoice_number", "invoice_number"),
                    ("amount", "total_amount"),
                    ("currency", "currency"),
                    ("status", "collection_status"),
                ] {
                    copy(to, from);
                }
            }
            EventType::CustomerCreditUpdated => CUSTOMER_FLAT.iter().for_each(|(t, f)| copy(t, f)),
            EventType::ReconciliationCompleted => RECON_FLAT.iter().for_each(|(t, f)| copy(t, f)),
            t if t.is_subscription() => {
                for (to, from) in [
                    ("id", "id"),
                    ("subscription_id", "id"),
                    ("customer_id", "customerId"),
                    ("plan_id", "planId"),
                    ("status", "status"),
                    ("metadata", "metadata"),
                ] {
                    copy(to, from);
                }
            }
            t if t.is_coupon() => COUPON_FLAT.iter().for_each(|(to, from)| copy(to, from)),
            _ => {
                for (to, from) in BILLING_INVOICE_FLAT {
                    copy(to, from);
                }
            }
        }
        out
    }

    /// The transaction writes that record this event: the event, and its
    /// entry in the timeline of the payment it is about (not for a test
    /// event, whose payment is made up).
    pub fn put_ops(&self) -> Result<Vec<TxOp>, StoreError> {
        let mut ops = vec![self.put_new()?];
        if self.endpoint_id.is_some() {
            return Ok(ops);
        }
        if let Some(payment) = &self.payment_id {
            ops.push(
                self.timeline_entry(keys::payment_events(payment), None)
                    .put_new()?,
            );
        }
        for (timeline, about) in billing_timelines(self.event_type, &self.object) {
            ops.push(self.timeline_entry(timeline, about).put_new()?);
        }
        Ok(ops)
    }

    fn timeline_entry(&self, timeline: String, about: Option<String>) -> TimelineEntry {
        TimelineEntry {
            timeline,
            event_id: self.id.clone(),
            event_type: self.event_type,
            created_at: self.created_at,
            about,
        }
    }
}

impl Record for Event {
    fn item_key(&self) -> Key {
        Event::key(&self.id)
    }

    /// Listed in its project's events (newest first), and, until
    /// delivery has taken it, in its outbox shard by id.
    fn entries(&self) -> Vec<Entry> {
        let mut entries = vec![Entry::gsi1(
            Event::list_partition(&Tenant::new(self.project_id.clone(), self.mode)),
            self.id.clone(),
        )];
        if !self.dispatched {
            entries.push(Entry::gsi2(
                Event::outbox_partition(&self.id),
                self.id.clone(),
            ));
        }
        entries
    }
}

/// The payment an event's object is about: a refund's or an invoice
/// payment's `paymentId`/`payment_id`, or the payment itself.
pub fn payment_of(object: &Value) -> Option<String> {
    ["paymentId", "payment_id"]
        .iter()
        .find_map(|k| object.get(*k).and_then(Value::as_str))
        .or_else(|| {
            object
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| id.starts_with("pay_"))
        })
        .map(str::to_owned)
}

/// The billing timelines an event is in, each with the billing invoice
/// it is about (if it is one): a `subscription.*` event in its
/// subscription's and customer's, a `billing_invoice.*` event in its
/// invoice's subscription's and customer's.
fn billing_timelines(t: EventType, object: &Value) -> Vec<(String, Option<String>)> {
    let field = |name: &str| object.get(name).and_then(Value::as_str).map(str::to_owned);
    let (subscription, invoice) = if t.is_subscription() {
        (field("id"), None)
    } else if t.is_billing_invoice() {
        (field("subscriptionId"), field("id"))
    } else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(sub) = subscription.filter(|s| s.starts_with("sub_")) {
        out.push((keys::subscription_events(&sub), invoice.clone()));
    }
    if let Some(cus) = field("customerId").filter(|c| c.starts_with("cus_")) {
        out.push((keys::customer_events(&cus), invoice));
    }
    out
}

/// One event in a payment's, a subscription's or a billing customer's
/// timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// The timeline it is in (`PAY#<payment>#EVT`, `SUB#<sub>#EVT`,
    /// `CUS#<customer>#EVT`): its `pk`, read with it and written as its
    /// key (no attribute of its own names the payment).
    #[serde(rename = "pk", skip_serializing)]
    timeline: String,
    pub event_id: EventId,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub created_at: Timestamp,
    /// In a billing timeline, the billing invoice the event is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
}

crate::attrs! { TimelineEntry {
    EVENT_ID: EventId = event_id,
    EVENT_TYPE: EventType = event_type as "type",
    CREATED_AT: Timestamp = created_at,
} }

impl Record for TimelineEntry {
    fn item_key(&self) -> Key {
        Key::new(self.timeline.clone(), self.event_id.as_str())
    }
}

/// The events about payment `payment_id`, oldest first (at most
/// `limit`). The caller has found the payment in its tenant.
pub async fn of_payment(
    store: &dyn Store,
    payment_id: &PaymentId,
    limit: usize,
) -> Result<Vec<TimelineEntry>, StoreError> {
    let query = Query::partition(keys::payment_events(payment_id)).limit(limit);
    super::record::all_of(store, &query).await
}

/// Which billing timeline to read.
#[derive(Clone, Copy, Debug)]
pub enum BillingTimeline<'a> {
    Subscription(&'a crate::ids::SubscriptionId),
    Customer(&'a crate::ids::CustomerId),
}

/// The events in a billing timeline, newest first (at most `limit`).
/// The caller has found the subscription or customer in its tenant.
pub async fn of_billing(
    store: &dyn Store,
    timeline: BillingTimeline<'_>,
    limit: usize,
) -> Result<Vec<TimelineEntry>, StoreError> {
    let pk = match timeline {
        BillingTimeline::Subscription(id) => keys::subscription_events(id.as_str()),
        BillingTimeline::Customer(id) => keys::customer_events(id.as_str()),
    };
    let query = Query::partition(pk).backward().limit(limit);
    super::record::all_of(store, &query).await
}

/// The project's events in `mode`, newest first (at most `limit`).
pub async fn recent(
    store: &dyn Store,
    tenant: &Tenant,
    limit: usize,
) -> Result<Vec<Event>, StoreError> {
    let query = Query::partition(Event::list_partition(tenant))
        .on(Index::Gsi1)
        .backward()
        .limit(limit);
    store
        .query(&query)
        .await?
        .items
        .into_iter()
        .map(from_item)
        .collect()
}

/// The event `id`.
pub async fn get(deps: &Deps, id: &EventId) -> Result<Option<Event>, StoreError> {
    crate::domain::record::get(&*deps.store, &Event::key(id)).await
}

/// Takes event `id` out of the outbox (its deliveries exist).
pub async fn mark_dispatched(store: &dyn Store, id: &EventId) -> Result<(), StoreError> {
    let update = Changes::<Event>::new()
        .set(Event::DISPATCHED, &true)
        .unindex(Index::Gsi2);
    match store
        .update(&Event::key(id), update.into(), Some(Cond::Exists))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_condition_failure() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Undelivered events, oldest first, at most `limit` per shard. An item
/// that does not read as an event is passed over (logged), and once it is
/// [`QUARANTINE_AFTER`] old, taken out of the outbox index: one bad record
/// cannot stall its shard, and an event written by newer code during a
/// rolling deploy is left for that code to read.
pub async fn undelivered(
    store: &dyn Store,
    limit: usize,
    now: Timestamp,
) -> Result<Vec<Event>, StoreError> {
    let mut out = Vec::new();
    for shard in 0..SHARDS {
        let query = Query::partition(keys::open(keys::Open::Outbox, shard))
            .on(Index::Gsi2)
            .limit(limit);
        for item in store.query(&query).await?.items {
            if let Some(e) = readable::<Event>(store, item, "outbox event", now).await {
                out.push(e);
            }
        }
    }
    out.sort_by(|a: &Event, b: &Event| a.id.cmp(&b.id));
    Ok(out)
}

/// How old an unreadable item of a sweep's index must be before it is
/// taken out of the index (longer than a rolling deploy).
pub const QUARANTINE_AFTER: chrono::Duration = chrono::Duration::hours(1);

/// An item of a sweep's index read as its record `T`; `None` when it does
/// not read as one: then it is passed over ([`pass_over_unreadable`]).
pub(crate) async fn readable<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    item: crate::store::Item,
    what: &str,
    now: Timestamp,
) -> Option<T> {
    let seen = Unreadable::of(&item);
    match from_item(item) {
        Ok(record) => Some(record),
        Err(e) => {
            pass_over_unreadable(store, seen, what, &e, now).await;
            None
        }
    }
}

/// An item of a sweep's index that did not read as its record, as the
/// sweep saw it: its key, and when it was last written (the later of the
/// id's mint time in its `pk` and its `updated_at`, when readable).
struct Unreadable {
    key: Option<Key>,
    written_ms: Option<i64>,
    /// `updated_at` as read (the stored text, whatever record wrote it):
    /// taken out of the index only if still so.
    updated_at: Option<String>,
}

// The one attribute the sweep reads from, and conditions on, an item it
// cannot read as its record.
crate::attrs! { Unreadable {
    UPDATED_AT: Option<String> = updated_at,
} }

impl Unreadable {
    /// Taken from the item before it is read as its record.
    fn of(item: &crate::store::Item) -> Unreadable {
        let key = Key::of(item);
        let minted = key.as_ref().and_then(|k| crate::ids::minted_at_ms(&k.pk));
        let updated_at = item
            .get(Unreadable::UPDATED_AT.name())
            .and_then(Value::as_str)
            .map(str::to_owned);
        let updated = updated_at
            .as_deref()
            .and_then(Timestamp::parse)
            .map(|t| t.unix_millis());
        Unreadable {
            key,
            written_ms: minted.max(updated),
            updated_at,
        }
    }
}

/// An item of a sweep's index (`what`: "outbox event", "SMS reminder",
/// "webhook delivery") that does not read as its record: passed over, so
/// one bad record cannot stall the sweep, and once it was last written
/// [`QUARANTINE_AFTER`] ago (not by newer code during a rolling deploy)
/// taken out of the index. The record itself stays in the table for
/// support. Failing to take it out is logged, not returned: the next pass
/// tries again.
async fn pass_over_unreadable(
    store: &dyn Store,
    seen: Unreadable,
    what: &str,
    error: &StoreError,
    now: Timestamp,
) {
    let Some(key) = seen.key else {
        tracing::error!(error = %error, "unreadable {what} without a key passed over");
        return;
    };
    let young = seen
        .written_ms
        .is_some_and(|ms| ms > now.plus(-QUARANTINE_AFTER).unix_millis());
    if young {
        tracing::error!(pk = %key.pk, error = %error, "unreadable {what} passed over (newer code may read it)");
        return;
    }
    tracing::error!(pk = %key.pk, error = %error, "unreadable {what} taken out of its index");
    let update = Changes::<Unreadable>::new().unindex(Index::Gsi2);
    // Not if it was written again since it was read (newer code, now).
    let unchanged = match &seen.updated_at {
        Some(at) => Unreadable::UPDATED_AT.is(at.as_str()),
        None => Unreadable::UPDATED_AT.missing(),
    };
    let cond = Cond::And(vec![Cond::Exists, unchanged]);
    match store.update(&key, update.into(), Some(cond)).await {
        Ok(_) => {}
        // Gone already, or written again since it was read: left alone.
        Err(e) if e.is_condition_failure() => {}
        Err(e) => {
            tracing::error!(pk = %key.pk, error = %e, "unreadable {what} not taken out of its index");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use serde_json::json;

    #[test]
    fn types_round_trip_their_names() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).ok(), Some(json!(t.as_str())));
        }
        assert_eq!(EventType::parse("payment.success"), None);
    }

    #[test]
    fn the_body_has_the_decided_shape() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let e = Event::new(
            EventType::PaymentSucceeded,
            &Tenant::new("proj_1", Mode::Live),
            json!({"id": "pay_1", "status": "success"}),
            now,
        );
        let body = e.body();
        assert_eq!(body["type"], "payment.succeeded");
        assert_eq!(body["created"], now.unix_seconds());
        assert_eq!(body["livemode"], true);
        assert_eq!(body["data"]["object"]["id"], "pay_1");
        assert!(body["id"].as_str().unwrap().starts_with("evt_"));
    }

    /// Plugins written for the contract's product read flat fields from
    /// `data`; `data.object` stays as it was.
    #[test]
    fn data_carries_the_main_fields_flat_beside_the_object() {
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let body = |kind, object: Value| {
            Event::new(kind, &Tenant::new("proj_1", Mode::Sandbox), object, now).body()
        };
        let payment = json!({"id": "pay_1", "object": "payment", "amount": 150000, "currency": "NPR",
            "provider": "khalti", "providerRef": "KTX-1", "checkoutSessionId": "cs_1",
            "metadata": {"order": "42"}, "status": "success", "customerEmail": "a@b.example"});
        let d = &body(EventType::PaymentSucceeded, payment.clone())["data"];
        assert_eq!(d["object"], payment);
        assert_eq!(
            (
                &d["id"],
                &d["amount"],
                &d["currency"],
                &d["provider"],
                &d["provider_ref"],
                &d["session_id"],
                &d["status"]
            ),
            (
                &json!("pay_1"),
                &json!(150000),
                &json!("NPR"),
                &json!("khalti"),
                &json!("KTX-1"),
                &json!("cs_1"),
                &json!("success")
            )
        );
        assert_eq!(d["metadata"]["order"], "42");
        assert!(d.get("customer_email").is_none() && d.get("customerEmail").is_none());
        let refund = json!({"id": "rf_1", "paymentId": "pay_1", "amount": 5000, "currency": "NPR",
            "status": "succeeded", "providerRefundId": null});
        let d = &body(EventType::RefundSucceeded, refund)["data"];
        assert_eq!(
            (&d["id"], &d["payment_id"], &d["amount"]),
            (&json!("rf_1"), &json!("pay_1"), &json!(5000))
        );
        assert!(d.get("provider_ref").is_some_and(Value::is_null));
        let invoice = json!({"id": "oinv_1", "invoice_number": "PI-000001", "total_amount": 356007,
            "currency": "NPR", "collection_status": "paid"});
        let d = &body(EventType::InvoicePaid, invoice)["data"];
        assert_eq!(
            (
                &d["id"],
                &d["invoice_id"],
                &d["invoice_number"],
                &d["amount"],
                &d["status"]
            ),
            (
                &json!("oinv_1"),
                &json!("oinv_1"),
                &json!("PI-000001"),
                &json!(356007),
                &json!("paid")
            )
        );
        let link = json!({"id": "lnk_1", "amount": 120000, "currency": "NPR", "active": true,
            "url": "https://pay.example/l/lnk_1", "metadata": {}});
        let d = &body(EventType::PaymentLinkPaid, link)["data"];
        assert_eq!(
            (&d["id"], &d["status"], &d["url"]),
            (
                &json!("lnk_1"),
                &json!("active"),
                &json!("https://pay.example/l/lnk_1")
            )
        );
    }

    #[tokio::test]
    async fn recorded_events_are_listed_and_in_the_outbox() {
        let store = EmbeddedStore::in_memory().unwrap();
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let mut ids = Vec::new();
        for i in 0..6 {
            let e = Event::new(
                EventType::PaymentFailed,
                &Tenant::new("proj_1", Mode::Sandbox),
                json!({"n": i}),
                now,
            );
            ids.push(e.id.clone());
            store.transact(e.put_ops().unwrap()).await.unwrap();
        }
        let listed = recent(&store, &Tenant::new("proj_1", Mode::Sandbox), 10)
            .await
            .unwrap();
        assert_eq!(listed.len(), 6);
        assert_eq!(listed[0].id, ids[5]);
        assert!(
            recent(&store, &Tenant::new("proj_1", Mode::Live), 10)
                .await
                .unwrap()
                .is_empty()
        );
        let pending = undelivered(&store, 10, now).await.unwrap();
        assert_eq!(
            pending.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
            ids
        );
    }

    /// A payment's events, a refund's and a payment link's among them,
    /// are in its timeline in order; a test event and another payment's
    /// are not.
    #[tokio::test]
    async fn a_payments_events_make_its_timeline() {
        let store = EmbeddedStore::in_memory().unwrap();
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let record = |e: &Event| store.transact(e.put_ops().unwrap());
        let event =
            |t, object: Value| Event::new(t, &Tenant::new("proj_1", Mode::Sandbox), object, now);
        let paid = event(
            EventType::PaymentSucceeded,
            json!({"id": "pay_1", "status": "success"}),
        );
        let link = event(EventType::PaymentLinkPaid, json!({"id": "lnk_1"}))
            .about_payment(&"pay_1".into());
        let refund = event(
            EventType::RefundSucceeded,
            json!({"id": "ref_1", "paymentId": "pay_1"}),
        );
        let other = event(EventType::PaymentFailed, json!({"id": "pay_2"}));
        let mut test = event(EventType::PaymentSucceeded, json!({"id": "pay_1"}));
        test.endpoint_id = Some("we_1".into());
        for e in [&paid, &link, &refund, &other, &test] {
            record(e).await.unwrap();
        }
        let timeline = of_payment(&store, &"pay_1".into(), 10).await.unwrap();
        let seen: Vec<(&str, EventType)> = timeline
            .iter()
            .map(|t| (t.event_id.as_str(), t.event_type))
            .collect();
        assert_eq!(
            seen,
            [
                (paid.id.as_str(), EventType::PaymentSucceeded),
                (link.id.as_str(), EventType::PaymentLinkPaid),
                (refund.id.as_str(), EventType::RefundSucceeded),
            ]
        );
        assert_eq!(timeline[0].created_at, now);
        assert_eq!(
            of_payment(&store, &"pay_1".into(), 2).await.unwrap().len(),
            2
        );
        // The event itself remembers its payment (the delivery log's).
        assert_eq!(
            crate::domain::record::get::<Event>(&store, &Event::key(&link.id))
                .await
                .unwrap()
                .unwrap()
                .payment_id
                .as_deref(),
            Some("pay_1")
        );
        // Written once: recording the same event again is refused whole.
        assert!(record(&paid).await.is_err());
        assert_eq!(
            of_payment(&store, &"pay_1".into(), 10).await.unwrap().len(),
            3
        );
    }

    #[tokio::test]
    async fn an_unreadable_outbox_item_does_not_hide_the_others() {
        let store = match EmbeddedStore::in_memory() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let now = Timestamp::parse("2026-11-22T10:00:00Z").unwrap();
        let e = Event::new(
            EventType::PaymentSucceeded,
            &Tenant::new("proj_1", Mode::Live),
            json!({"id": "pay_1"}),
            now,
        );
        let Ok(TxOp::Put { item, .. }) = e.put_new() else {
            panic!("put op")
        };
        let shard = item.get("gsi2pk").cloned();
        store.put(item, None).await.unwrap();
        // A broken record in the same outbox shard, sorting first.
        let broken = json!({"pk": "EVT#evt_0", "sk": "EVT", "gsi2pk": shard, "gsi2sk": "evt_0"});
        store
            .put(broken.as_object().cloned().unwrap(), None)
            .await
            .unwrap();
        let got = undelivered(&store, 10, now).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].id, e.id);

        // Quarantined after that one pass: out of its shard (it no longer
        // counts towards a page of it), the record itself kept.
        let Some(Value::String(shard)) = shard else {
            panic!("no shard")
        };
        let in_shard = store
            .query(&Query::partition(shard).on(Index::Gsi2).limit(10))
            .await
            .unwrap()
            .items;
        let keys: Vec<Option<Key>> = in_shard.iter().map(Key::of).collect();
        assert_eq!(keys, vec![Some(Event::key(&e.id))]);
        let kept = store.get(&Key::new("EVT#evt_0", "EVT")).await.unwrap();
        let kept = kept.unwrap_or_else(|| panic!("the bad record is kept"));
        assert!(!kept.contains_key(Index::Gsi2.pk_attr()));
        assert!(!kept.contains_key(Index::Gsi2.sk_attr()));
        assert_eq!(undelivered(&store, 1, now).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_young_unreadable_event_is_passed_over_but_kept_in_the_outbox() {
        use crate::time::{Clock, SystemClock};
        let store = EmbeddedStore::in_memory().unwrap();
        // Written a moment ago by newer code (a type this build lacks).
        let id = EventId::new();
        let young = json!({"pk": format!("EVT#{id}"), "sk": "EVT", "gsi2pk": "OUTBOX#0",
                           "gsi2sk": id, "type": "payment.teleported"});
        store
            .put(young.as_object().cloned().unwrap(), None)
            .await
            .unwrap();
        // An id's time may run ahead of the clock after a burst of ids in
        // this process (`ids::new_id`): "now" is the later of the two.
        let minted = crate::ids::minted_at_ms(id.as_str())
            .and_then(Timestamp::from_unix_millis)
            .unwrap();
        let now = SystemClock.now().max(minted);
        assert!(undelivered(&store, 10, now).await.unwrap().is_empty());
        let still = store.get(&Event::key(&id)).await.unwrap().unwrap();
        assert!(still.contains_key("gsi2pk"), "kept for the newer code");
        // An hour later it is taken out.
        let later = now.plus(QUARANTINE_AFTER + chrono::Duration::seconds(1));
        assert!(undelivered(&store, 10, later).await.unwrap().is_empty());
        let gone = store.get(&Event::key(&id)).await.unwrap().unwrap();
        assert!(!gone.contains_key("gsi2pk"));
    }
}
