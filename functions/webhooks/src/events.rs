//! The webhook events as the OpenAPI document's `webhooks` describe them:
//! one entry per [`EventType`], each with the body a receiver gets
//! ([`shared::domain::outbox::Event::body`]) and the signature headers.

use shared::domain::billing::invoice::view::InvoiceView as BillingInvoiceView;
use shared::domain::billing::lifecycle::SubscriptionView;
use shared::domain::outbox::EventType;
use shared::webhooks::signature::{SIGNATURE_HEADER, TIMESTAMP_HEADER, TOLERANCE_SECONDS};
use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItemBuilder,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, OpenApiBuilder, Paths, PathsBuilder, Ref, RefOr, Required,
    ResponseBuilder, Schema,
};
use utoipa::{PartialSchema, ToSchema};

/// Every event's envelope (`data` holds the resource, also flat).
#[derive(serde::Serialize, ToSchema)]
#[schema(as = WebhookEvent)]
#[allow(dead_code)]
pub struct Event {
    /// `evt_…`: the same on every retry of this event, so a receiver can
    /// drop duplicates.
    id: String,
    #[serde(rename = "type")]
    kind: EventType,
    /// Unix seconds at which the event happened.
    created: i64,
    livemode: bool,
    /// `object`: the resource as the API answers it; beside it, its main
    /// fields in snake_case (`id`, `amount`, `currency`, `status`, …).
    #[schema(value_type = Object)]
    data: serde_json::Map<String, serde_json::Value>,
}

/// The resource schema each event carries, and its flat fields.
fn resource(t: EventType) -> (RefOr<Schema>, &'static [(&'static str, Flat)]) {
    let (name, flat) = match t {
        t if t.is_subscription() => (SubscriptionView::name(), SUBSCRIPTION_FLAT),
        t if t.is_billing_invoice() => (BillingInvoiceView::name(), BILLING_INVOICE_FLAT),
        t => {
            let (name, flat) = named_resource(t);
            (name.into(), flat)
        }
    };
    (Ref::from_schema_name(name).into(), flat)
}

/// The components the billing events' resources are (a subscription and
/// a billing invoice as their GET answers them), for the document.
pub fn resources() -> utoipa::openapi::OpenApi {
    let mut nested = Vec::new();
    <SubscriptionView as ToSchema>::schemas(&mut nested);
    <BillingInvoiceView as ToSchema>::schemas(&mut nested);
    let components = ComponentsBuilder::new()
        .schema_from::<SubscriptionView>()
        .schema_from::<BillingInvoiceView>()
        .schemas_from_iter(nested)
        .build();
    OpenApiBuilder::new().components(Some(components)).build()
}

/// `subscription.*`'s flat fields.
const SUBSCRIPTION_FLAT: &[(&str, Flat)] = &[
    ("id", Flat::Str),
    ("subscription_id", Flat::Str),
    ("customer_id", Flat::Str),
    ("plan_id", Flat::Str),
    ("status", Flat::Str),
    ("metadata", Flat::Object),
];

/// `billing_invoice.*`'s flat fields.
const BILLING_INVOICE_FLAT: &[(&str, Flat)] = &[
    ("id", Flat::Str),
    ("invoice_id", Flat::Str),
    ("invoice_number", Flat::Str),
    ("amount", Flat::Amount),
    ("amount_due", Flat::Amount),
    ("currency", Flat::Currency),
    ("status", Flat::Str),
    ("subscription_id", Flat::Str),
    ("customer_id", Flat::Str),
];

/// The component a payment-side event's resource is, and its flat fields.
fn named_resource(t: EventType) -> (&'static str, &'static [(&'static str, Flat)]) {
    use Flat::*;
    match t {
        EventType::PaymentSucceeded
        | EventType::PaymentFailed
        | EventType::PaymentCancelled
        | EventType::PaymentRefunded => (
            "Payment",
            &[
                ("id", Str),
                ("amount", Amount),
                ("currency", Currency),
                ("provider", Provider),
                ("provider_ref", Str),
                ("session_id", Str),
                ("metadata", Object),
                ("status", Str),
            ],
        ),
        EventType::RefundSucceeded | EventType::RefundFailed => (
            "Refund",
            &[
                ("id", Str),
                ("payment_id", Str),
                ("amount", Amount),
                ("currency", Currency),
                ("status", Str),
                ("provider_ref", Str),
            ],
        ),
        EventType::PaymentLinkPaid => (
            "PaymentLink",
            &[
                ("id", Str),
                ("amount", Amount),
                ("currency", Currency),
                ("provider", Provider),
                ("metadata", Object),
                ("url", Str),
                ("status", Str),
            ],
        ),
        EventType::InvoicePaid => (
            "Invoice",
            &[
                ("id", Str),
                ("invoice_id", Str),
                ("invoice_number", Str),
                ("amount", Amount),
                ("currency", Currency),
                ("status", Str),
            ],
        ),
        EventType::CustomerCreditUpdated => (
            "BillingCustomer",
            &[
                ("id", Str),
                ("customer_id", Str),
                ("credit_balance", Amount),
                ("metadata", Object),
            ],
        ),
        EventType::ReconciliationCompleted => (
            "ReconciliationRun",
            &[
                ("id", Str),
                ("provider", Provider),
                ("date", Str),
                ("status", Str),
                ("discrepancies", Amount),
            ],
        ),
        // The billing events' resources are named by [`resource`].
        _ => ("Object", &[]),
    }
}

#[derive(Clone, Copy)]
enum Flat {
    Str,
    Amount,
    Currency,
    Provider,
    Object,
}

impl Flat {
    fn schema(self) -> RefOr<Schema> {
        match self {
            Flat::Str => String::schema(),
            Flat::Amount => shared::money::Paisa::schema(),
            Flat::Currency => Ref::from_schema_name("Currency").into(),
            Flat::Provider => Ref::from_schema_name("Provider").into(),
            Flat::Object => ObjectBuilder::new().schema_type(Type::Object).into(),
        }
    }
}

fn camel(t: EventType) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in t.as_str().chars() {
        if c == '.' || c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn body_schema(t: EventType) -> Schema {
    let (object, flat) = resource(t);
    let mut data = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("object", object)
        .required("object");
    for (name, kind) in flat {
        // A field the resource lacks is left out (`Event::flat_fields`).
        data = data.property(*name, kind.schema());
    }
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("id", String::schema())
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([t.as_str()])),
        )
        .property("created", i64::schema())
        .property("livemode", bool::schema())
        .property("data", data)
        .required("id")
        .required("type")
        .required("created")
        .required("livemode")
        .required("data")
        .into()
}

fn header(name: &str, description: String) -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(String::schema()))
        .build()
}

/// The `webhooks` of the document: what Dhukuti POSTs to an endpoint.
pub fn events() -> Paths {
    let mut paths = PathsBuilder::new();
    for t in EventType::ALL {
        let op = OperationBuilder::new()
            .operation_id(Some(format!("{}Webhook", camel(t))))
            .summary(Some(format!("`{}`", t.as_str())))
            .tag("Webhook events")
            .description(Some(format!(
                "Sent to every enabled endpoint subscribed to `{}`, as a POST \
                 with a JSON body. Verify `{SIGNATURE_HEADER}` before trusting \
                 it: `t=<unix>,v1=<hex HMAC-SHA256 of \"<t>.<raw body>\" keyed \
                 with the endpoint's signing secret>`; refuse a `t` more than \
                 {TOLERANCE_SECONDS} s from your clock. Answer any 2xx within \
                 10 s; anything else is retried with backoff.",
                t.as_str()
            )))
            .parameter(header(
                SIGNATURE_HEADER,
                "`t=<unix>,v1=<hex>`; during a secret rotation one `v1` per secret.".into(),
            ))
            .parameter(header(
                TIMESTAMP_HEADER,
                "The `t` of the signature, unix seconds.".into(),
            ))
            .request_body(Some(
                RequestBodyBuilder::new()
                    .required(Some(Required::True))
                    .content(
                        "application/json",
                        ContentBuilder::new().schema(Some(body_schema(t))).build(),
                    )
                    .build(),
            ))
            .response(
                "2XX",
                ResponseBuilder::new().description("Received: no retry."),
            )
            .response(
                "default",
                ResponseBuilder::new().description("Not received: retried with backoff."),
            )
            .build();
        paths = paths.path(
            t.as_str(),
            PathItemBuilder::new()
                .operation(HttpMethod::Post, op)
                .build(),
        );
    }
    paths.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_type_has_its_entry_and_operation_id() {
        let paths = events();
        assert_eq!(paths.paths.len(), EventType::ALL.len());
        let item = &paths.paths["payment_link.paid"];
        let op = item.post.as_ref().map(|o| o.operation_id.clone());
        assert_eq!(op, Some(Some("paymentLinkPaidWebhook".into())));
    }
}
