//! Issue 39, the dashboard's subscriptions and billing invoices: the lists
//! and their filters, a subscription's page with its invoices, an
//! invoice's page (Miti, pay link), and the actions a developer takes
//! there (pause, resume, cancel; void; a payment received outside), each
//! in the audit log; a viewer sees no form and a forged post is refused;
//! another merchant finds nothing. Invoices are issued through the domain
//! on subscriptions stored directly (`tests/support/billing.rs`).

use dhukuti_tests::browser::text;
use dhukuti_tests::dash::{Dash, field};
use dhukuti_tests::shop::Shop;
use dhukuti_tests::{Which, billing, on_both_backends, spawn_app};
use serde_json::json;
use shared::domain::account::{self, Plan};
use shared::domain::billing::invoice::{self, InvoiceStatus, PaymentSource};
use shared::domain::billing::subscription::{Subscription, SubscriptionStatus};
use shared::domain::dashboard::{self, Role};
use shared::domain::record;
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";

async fn customer(shop: &Shop, name: &str) -> String {
    let a = shop
        .app
        .post(
            "/v1/billing/customers",
            Some(&shop.key),
            None,
            &json!({"name": name, "phone": "9800000001"}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    text(&a.body["id"])
}

/// A signed-in browser of a new `role` user of the shop's merchant.
async fn person(shop: &Shop, email: &str, role: Role) -> Dash {
    dashboard::create_user(
        shop.app.state(),
        SystemClock.now(),
        &shop.tenant.merchant.id,
        email,
        role,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut d = Dash::new(&shop.app.base);
    let r = d.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    d
}

async fn status_of(shop: &Shop, id: &str) -> SubscriptionStatus {
    match record::get::<Subscription>(&*shop.app.store, &Subscription::key(&id.into())).await {
        Ok(Some(s)) => s.status,
        other => panic!("subscription {id}: {other:?}"),
    }
}

async fn subscriptions_and_invoices_in_the_dashboard(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let project = shop.tenant.project.id.to_string();
    let sita = customer(&shop, "Sita Rai").await;
    let ram = customer(&shop, "Ram Thapa").await;
    let (sub, inv) = billing::first_invoice(&shop.app, &project, &sita, 50_000).await;
    let (other_sub, other) = billing::first_invoice(&shop.app, &project, &ram, 70_000).await;
    let (sub_id, inv_id) = (sub.id.to_string(), inv.id.to_string());
    let mut viewer = person(&shop, "viewer@asan.example", Role::Viewer).await;
    let mut dev = person(&shop, "dev@asan.example", Role::Developer).await;
    let mut owner = person(&shop, "boss@asan.example", Role::Owner).await;

    // The lists and their filters.
    let list = viewer.get("/dashboard/billing/subscriptions").await;
    assert_eq!(list.status, 200, "{}", list.show());
    assert!(
        list.body.contains(&sub_id) && list.body.contains(other_sub.id.as_str()),
        "{}",
        list.show()
    );
    assert!(list.body.contains("2 subscriptions"), "{}", list.show());
    let mine = viewer
        .get(&format!("/dashboard/billing/subscriptions?customer={sita}"))
        .await;
    assert!(
        mine.body.contains(&sub_id) && !mine.body.contains(other_sub.id.as_str()),
        "{}",
        mine.show()
    );
    let active = viewer
        .get("/dashboard/billing/subscriptions?status=active")
        .await;
    assert!(active.body.contains("0 subscriptions"), "{}", active.show());
    let bad = viewer
        .get("/dashboard/billing/subscriptions?status=sleeping")
        .await;
    assert_eq!(bad.status, 400, "{}", bad.show());
    assert!(bad.body.contains("status must be"), "{}", bad.show());
    let invoices = viewer.get("/dashboard/billing/invoices?status=open").await;
    assert!(
        invoices.body.contains(&inv.number) && invoices.body.contains(&other.number),
        "{}",
        invoices.show()
    );
    let paid = viewer.get("/dashboard/billing/invoices?status=paid").await;
    assert!(paid.body.contains("0 invoices"), "{}", paid.show());
    let bad = viewer.get("/dashboard/billing/invoices?status=late").await;
    assert_eq!(bad.status, 400, "{}", bad.show());

    // The pages; a viewer has no forms, and a forged post is refused.
    let page = viewer
        .get(&format!("/dashboard/billing/subscriptions/{sub_id}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.body.contains(&inv.number) && page.body.contains("Fibre 100 Mbps"),
        "{}",
        page.show()
    );
    assert!(!page.body.contains("/cancel\""), "{}", page.show());
    let page = viewer
        .get(&format!("/dashboard/billing/invoices/{inv_id}"))
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("Miti 208"), "{}", page.show());
    assert!(
        page.body.contains(&format!("/b/{inv_id}")),
        "{}",
        page.show()
    );
    assert!(page.body.contains("NPR 500"), "{}", page.show());
    assert!(
        !page.body.contains("record-payment") && !page.body.contains("/void"),
        "{}",
        page.show()
    );
    let csrf = field(&page.body, "csrf");
    for path in [
        format!("/dashboard/billing/invoices/{inv_id}/void"),
        format!("/dashboard/billing/subscriptions/{sub_id}/cancel"),
    ] {
        let r = viewer.post(&path, &[("csrf", &csrf)]).await;
        assert_eq!(r.status, 403, "{path}: {}", r.show());
    }
    let still = invoice::get_invoice(shop.app.state(), &sub_tenant(&shop), &inv.id)
        .await
        .unwrap_or_else(|e| panic!("invoice: {e}"));
    assert_eq!(still.status, InvoiceStatus::Open);
    // A developer's form without its token changes nothing either.
    let r = dev
        .post(&format!("/dashboard/billing/invoices/{inv_id}/void"), &[])
        .await;
    assert_eq!(r.status, 403, "{}", r.show());

    // A payment received outside: a bad field is named, then it pays.
    let page = dev
        .get(&format!("/dashboard/billing/invoices/{inv_id}"))
        .await;
    assert!(page.body.contains("record-payment"), "{}", page.show());
    let csrf = field(&page.body, "csrf");
    let pay = format!("/dashboard/billing/invoices/{inv_id}/record-payment");
    for (fields, named) in [
        (
            [
                ("method", "cheque"),
                ("received_on", "2026-11-01"),
                ("reference", "R1"),
            ],
            "Method",
        ),
        (
            [
                ("method", "cash"),
                ("received_on", "yesterday"),
                ("reference", "R1"),
            ],
            "Received on",
        ),
        (
            [
                ("method", "cash"),
                ("received_on", "2999-01-01"),
                ("reference", "R1"),
            ],
            "Received on",
        ),
        (
            [
                ("method", "cash"),
                ("received_on", "2026-11-01"),
                ("reference", " "),
            ],
            "Reference",
        ),
    ] {
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend(fields);
        let r = dev.post(&pay, &all).await;
        assert_eq!(r.status, 400, "{fields:?}: {}", r.show());
        assert!(r.body.contains(named), "{fields:?}: {}", r.show());
    }
    let today = shared::domain::billing::calendar::nepal_day(SystemClock.now()).to_string();
    let r = dev
        .post(
            &pay,
            &[
                ("csrf", &csrf),
                ("method", "bank_deposit"),
                ("received_on", &today),
                ("reference", "NIC-SLIP-42"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let done = dev.get(&r.location).await;
    assert!(done.body.contains("the invoice is paid"), "{}", done.show());
    assert!(done.body.contains("NIC-SLIP-42"), "{}", done.show());
    assert!(!done.body.contains("record-payment"), "{}", done.show());
    let paid = invoice::get_invoice(shop.app.state(), &sub_tenant(&shop), &inv.id)
        .await
        .unwrap_or_else(|e| panic!("invoice: {e}"));
    assert_eq!(paid.status, InvoiceStatus::Paid);
    match paid.payment.as_ref().map(|p| &p.source) {
        Some(PaymentSource::OutOfBand {
            reference, method, ..
        }) => {
            assert_eq!(reference, "NIC-SLIP-42");
            assert_eq!(*method, invoice::OutOfBandMethod::BankDeposit);
        }
        other => panic!("payment: {other:?}"),
    }
    assert_eq!(status_of(&shop, &sub_id).await, SubscriptionStatus::Active);

    // Pause, resume, cancel the now active subscription.
    let sub_path = format!("/dashboard/billing/subscriptions/{sub_id}");
    for (action, expect) in [
        ("pause", SubscriptionStatus::Paused),
        ("resume", SubscriptionStatus::Active),
        ("cancel", SubscriptionStatus::Cancelled),
    ] {
        let page = dev.get(&sub_path).await;
        assert!(
            page.body.contains(&format!("{sub_path}/{action}")),
            "{action}: {}",
            page.show()
        );
        let csrf = field(&page.body, "csrf");
        let r = dev
            .post(
                &format!("{sub_path}/{action}"),
                &[("csrf", &csrf), ("reason", "moving away")],
            )
            .await;
        assert_eq!(r.status, 303, "{action}: {}", r.show());
        assert_eq!(status_of(&shop, &sub_id).await, expect, "{action}");
    }
    let gone = dev.get(&sub_path).await;
    assert!(!gone.body.contains("/cancel\""), "{}", gone.show());

    // Void the other invoice; a second void is refused.
    let other_path = format!("/dashboard/billing/invoices/{}", other.id);
    let csrf = dev.csrf_of(&other_path).await;
    let r = dev
        .post(&format!("{other_path}/void"), &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let voided = dev.get(&r.location).await;
    assert!(
        voided.body.contains("The invoice is void"),
        "{}",
        voided.show()
    );
    let again = dev
        .post(&format!("{other_path}/void"), &[("csrf", &csrf)])
        .await;
    assert_eq!(again.status, 409, "{}", again.show());
    let void = dev.get("/dashboard/billing/invoices?status=void").await;
    assert!(
        void.body.contains(&other.number) && !void.body.contains(&inv.number),
        "{}",
        void.show()
    );

    // Every action in the audit log, with who took it.
    let log = owner.get("/dashboard/audit").await;
    assert_eq!(log.status, 200, "{}", log.show());
    for action in [
        "billing_invoice.record_payment",
        "billing_invoice.void",
        "subscription.pause",
        "subscription.resume",
        "subscription.cancel",
    ] {
        assert!(log.body.contains(action), "{action}: {}", log.show());
    }
    assert!(log.body.contains("NIC-SLIP-42"), "{}", log.show());
    assert!(log.body.contains("dev@asan.example"), "{}", log.show());

    // Another merchant's owner finds none of it.
    let them = shop.app.tenant("Other Gym", "owner@other.example").await;
    dashboard::create_user(
        shop.app.state(),
        SystemClock.now(),
        &them.merchant.id,
        "boss@other.example",
        Role::Owner,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut boss = Dash::new(&shop.app.base);
    let r = boss.sign_in("boss@other.example", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    for path in [
        format!("/dashboard/billing/subscriptions/{sub_id}"),
        format!("/dashboard/billing/invoices/{inv_id}"),
        "/dashboard/billing/invoices/inv_nope".to_owned(),
    ] {
        let r = boss.get(&path).await;
        assert_eq!(r.status, 404, "{path}: {}", r.show());
    }
    let csrf = boss.csrf_of("/dashboard/billing/invoices").await;
    let r = boss
        .post(
            &format!("/dashboard/billing/subscriptions/{}/pause", other_sub.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.show());
    let theirs = boss.get("/dashboard/billing/invoices").await;
    assert!(theirs.body.contains("0 invoices"), "{}", theirs.show());

    // A merchant whose plan lost billing changes nothing through a form
    // still open.
    let csrf = dev.csrf_of("/dashboard/billing/invoices").await;
    if let Err(e) = account::set_plan(&*shop.app.store, &shop.tenant.merchant.id, Plan::Free).await
    {
        panic!("set_plan: {e}")
    }
    let r = dev
        .post(
            &format!("/dashboard/billing/subscriptions/{}/cancel", other_sub.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert!(r.body.contains("Growth and Pro"), "{}", r.show());
    assert_eq!(
        status_of(&shop, other_sub.id.as_str()).await,
        SubscriptionStatus::Incomplete
    );
    shop.stop().await;
}

fn sub_tenant(shop: &Shop) -> shared::domain::Tenant {
    shared::domain::Tenant::new(
        shop.tenant.project.id.as_str(),
        shared::domain::Mode::Sandbox,
    )
}

on_both_backends!(subscriptions_and_invoices_in_the_dashboard);
