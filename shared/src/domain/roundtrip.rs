//! Requests and responses cannot drift apart: whatever a resource answers
//! for a field the merchant wrote, the API takes back for that field.
//!
//! Each test creates a resource with every writable field at the edge of
//! its rule (the longest value, characters outside ASCII, line breaks
//! where allowed), reads its view as a merchant would, and sends the view's
//! values back through the API's own body parser (create and, where there
//! is one, patch). A rule changed on one side only, a view that emits
//! `null` or another type for a field the request types differently, or a
//! view field the request no longer knows fails here.

use serde_json::{Map, Value, json};

use super::Mode;
use super::checkout::{self, CheckoutSessionView, CreateCheckout, Creator};
use super::invoices::{self, CreateInvoice, InvoiceView, PatchInvoice};
use super::links::{self, CreateLink, PatchLink, PaymentLinkView};
use super::refunds::{CreateRefund, Refund, RefundStatus, RefundView};
use crate::domain::Tenant;
use crate::fields::wire::Strict;
use crate::fields::{
    AddressPart, BuyerAddress, BuyerPhone, Description, InactiveMessage, InvoiceLineText,
    InvoiceNote, InvoiceText, LinkTitle, MAX_PHONE_LEN, PersonName, ReferenceId, RefundNotes,
};
use crate::time::Timestamp;

fn now() -> Timestamp {
    match Timestamp::parse("2026-11-25T10:00:00Z") {
        Some(t) => t,
        None => panic!("a fixed time"),
    }
}

/// `n` characters, none ASCII (a byte-length check would refuse it).
fn longest(n: usize) -> String {
    "न".repeat(n)
}

/// `n` characters spanning lines.
fn longest_lines(n: usize) -> String {
    let mut s = longest(n - 1);
    s.insert(n / 2 * "न".len(), '\n');
    s
}

/// A long but plausible email address.
fn email() -> String {
    format!("{}@pasal.example.com.np", "a".repeat(200))
}

fn phone() -> String {
    let p = "+977 980-0000001";
    format!("{p}{}", "1".repeat(MAX_PHONE_LEN - p.len()))
}

/// Reads `v` as the API reads a body ([`Strict`]), or fails naming the
/// field.
fn api<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    let text = v.to_string();
    let mut de = serde_json::Deserializer::from_str(&text);
    match serde_path_to_error::deserialize::<_, T>(Strict::new(&mut de)) {
        Ok(t) => t,
        Err(e) => panic!(
            "the API refuses what it answered at {}: {e}\nbody: {v:#}",
            e.path()
        ),
    }
}

/// The view of `value` as a merchant reads it (JSON).
fn read(value: impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(m)) => m,
        other => panic!("a view is an object: {other:?}"),
    }
}

/// `keys` of `view`, those present only.
fn pick(view: &Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|k| view.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect()
}

#[test]
fn a_checkout_session_is_taken_back_as_it_is_answered() {
    let address = json!({
        "line1": longest(AddressPart::MAX), "line2": longest(AddressPart::MAX),
        "city": longest(AddressPart::MAX), "state": longest(AddressPart::MAX),
        "postalCode": longest(AddressPart::MAX), "country": longest(AddressPart::MAX),
    });
    let sent = json!({
        "amount": 150_000, "returnUrl": "https://pasal.example/done",
        "description": longest(Description::MAX),
        "metadata": {"order": longest(checkout::MAX_METADATA_VALUE_LEN), "n": 3, "gift": true},
        "customer": {"name": longest(PersonName::MAX), "email": email(), "phone": phone(),
                     "address": address},
        "collectAddress": true,
    });
    let valid = match checkout::validate_create(api::<CreateCheckout>(&sent), Mode::Sandbox) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    let creator = Creator {
        project_id: "proj_1".into(),
        mode: Mode::Sandbox,
        api_key_id: "key_1".into(),
        spend_cap_paisa: None,
    };
    let view = read(CheckoutSessionView::at(
        checkout::new_session(&creator, valid, now()),
        now(),
    ));
    let back = json!({
        "amount": view["amount"], "returnUrl": "https://pasal.example/done",
        "description": view["description"], "metadata": view["metadata"],
        "customer": {"name": view["customerName"], "email": view["customerEmail"],
                     "phone": view["customerPhone"], "address": view["customerAddress"]},
        "collectAddress": view["collectAddress"],
    });
    api::<CreateCheckout>(&back);
    assert_eq!(back, sent, "the view answers what was sent");
}

#[test]
fn a_payment_link_is_taken_back_as_it_is_answered() {
    let sent = json!({
        "title": longest(LinkTitle::MAX), "description": longest(Description::MAX),
        "amount": 50_000, "currency": "NPR", "provider": "khalti", "maxUses": 5,
        "expiresAt": "2027-01-01T00:00:00Z", "redirectUrl": "https://pasal.example/thanks",
        "inactiveMessage": longest(InactiveMessage::MAX),
        "customerName": longest(PersonName::MAX), "customerEmail": email(),
        "customerPhone": phone(), "collectAddress": true,
        "customerLine1": longest(AddressPart::MAX), "customerLine2": longest(AddressPart::MAX),
        "customerCity": longest(AddressPart::MAX), "customerState": longest(AddressPart::MAX),
        "customerPostalCode": longest(AddressPart::MAX),
        "customerCountry": longest(AddressPart::MAX),
        "referenceId": longest(ReferenceId::MAX), "metadata": {"k": "v"},
    });
    let link = match links::new_link(
        &Tenant::new("proj_1", Mode::Sandbox),
        api::<CreateLink>(&sent),
        now(),
    ) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    };
    let view = read(PaymentLinkView::of(link, "https://pay.example", false));
    let writable: Vec<&str> = sent
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut back = pick(&view, &writable);
    // The view writes the time as RFC 3339 with its own precision.
    back.insert("expiresAt".into(), sent["expiresAt"].clone());
    assert_eq!(
        Value::Object(back.clone()),
        sent,
        "the view answers what was sent"
    );
    api::<CreateLink>(&Value::Object(back.clone()));
    // A patch takes every field it shares with the create (not the amount
    // terms, currency or provider, which a link keeps for life).
    for fixed in ["amount", "currency", "provider", "metadata"] {
        back.remove(fixed);
    }
    api::<PatchLink>(&Value::Object(back));
}

#[test]
fn an_invoice_is_taken_back_as_it_is_answered() {
    let buyer = json!({
        "name": longest(InvoiceText::MAX), "email": email(),
        "phone": longest(BuyerPhone::MAX), "address": longest_lines(BuyerAddress::MAX),
    });
    let sent = json!({
        "lines": [{"description": longest_lines(InvoiceLineText::MAX), "quantity": "1.5",
                   "unitAmount": 10_000}],
        "dueAt": "2026-12-31T18:15:00Z", "customerId": longest(InvoiceText::MAX),
        "buyer": buyer, "taxRateBps": 1300,
        "externalReference": longest(InvoiceText::MAX),
        "note": longest_lines(InvoiceNote::MAX),
    });
    let inv = match invoices::new_draft(
        &Tenant::new("proj_1", Mode::Sandbox),
        api::<CreateInvoice>(&sent),
        now(),
    ) {
        Ok(i) => i,
        Err(e) => panic!("{e}"),
    };
    let view = read(InvoiceView::at(&inv, now()));
    let lines: Vec<Value> = view["lines"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .map(|l| {
                    json!({"description": l["description"], "quantity": l["quantity"],
                           "unitAmount": l["unitAmount"]})
                })
                .collect()
        })
        .unwrap_or_default();
    let back = json!({
        "lines": lines, "dueAt": "2026-12-31T18:15:00Z", "customerId": view["customer_id"],
        "buyer": view["buyer"], "taxRateBps": view["tax_rate_bps"],
        "externalReference": view["external_reference"], "note": view["note"],
    });
    assert_eq!(back, sent, "the view answers what was sent");
    api::<CreateInvoice>(&back);
    let mut patch = back;
    patch["version"] = view["version"].clone();
    api::<PatchInvoice>(&patch);
}

#[test]
fn a_refund_is_taken_back_as_it_is_answered() {
    let sent = json!({
        "paymentId": "pay_1", "amount": 100, "reason": "customer_request",
        "notes": longest_lines(RefundNotes::MAX), "mobileNumber": "+977-9800000001",
    });
    let req = api::<CreateRefund>(&sent);
    let refund = Refund {
        fee: None,
        fee_source: None,
        listed: false,
        id: "re_1".into(),
        project_id: "proj_1".into(),
        payment_id: req.payment_id.as_str().into(),
        mode: Mode::Sandbox,
        provider: super::Provider::Khalti,
        amount: match crate::money::Paisa::new(req.amount) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        },
        currency: crate::money::Currency::Npr,
        reason: req.reason,
        status: RefundStatus::Processing,
        provider_refund_id: None,
        failure_reason: None,
        notes: req.notes.map(String::from),
        mobile_number: req.mobile_number.map(String::from),
        created_at: now(),
        updated_at: now(),
    };
    let view = read(RefundView::from(refund));
    let back = Value::Object(pick(
        &view,
        &["paymentId", "amount", "reason", "notes", "mobileNumber"],
    ));
    assert_eq!(back, sent, "the view answers what was sent");
    api::<CreateRefund>(&back);
}

/// The fields the contract types "or null" are answered as `null` when
/// unset, and the API takes that `null` back; the others are left out.
#[test]
fn unset_fields_typed_or_null_come_back_as_null_and_are_taken() {
    let sent = json!({
        "title": "Tip jar", "amount": null, "provider": null, "maxUses": null,
        "expiresAt": null,
    });
    let link = match links::new_link(
        &Tenant::new("proj_1", Mode::Sandbox),
        api::<CreateLink>(&sent),
        now(),
    ) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    };
    let view = read(PaymentLinkView::of(link, "https://pay.example", false));
    let back = Value::Object(pick(
        &view,
        &["title", "amount", "provider", "maxUses", "expiresAt"],
    ));
    assert_eq!(back, sent, "or-null fields are present as null");
    api::<CreateLink>(&back);
    for absent in ["description", "customerEmail", "referenceId", "redirectUrl"] {
        assert!(!view.contains_key(absent), "{absent} is not typed or null");
    }

    let sent = json!({
        "lines": [{"description": "Momo", "quantity": "1", "unitAmount": 100}],
        "dueAt": "2026-12-31T18:15:00Z",
        "customerId": null, "buyer": null, "externalReference": null, "note": null,
    });
    let inv = match invoices::new_draft(
        &Tenant::new("proj_1", Mode::Sandbox),
        api::<CreateInvoice>(&sent),
        now(),
    ) {
        Ok(i) => i,
        Err(e) => panic!("{e}"),
    };
    let view = read(InvoiceView::at(&inv, now()));
    let back = json!({
        "lines": sent["lines"], "dueAt": sent["dueAt"], "customerId": view["customer_id"],
        "buyer": view["buyer"], "externalReference": view["external_reference"],
        "note": view["note"],
    });
    assert_eq!(back, sent, "or-null fields are present as null");
    for key in ["customer_id", "buyer", "external_reference", "note"] {
        assert!(
            view.contains_key(key),
            "{key} is typed or null: always present"
        );
    }
    api::<CreateInvoice>(&back);
}
