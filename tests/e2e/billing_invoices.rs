//! Issue 39 item 4, billing invoices over HTTP: the list and its filters,
//! the invoice with its pay page and Miti, the pay page's checkout and the
//! Direct-QR paying it, exactly once: of two payments (two tabs, the QR
//! and the page) one pays the invoice and moves its subscription, the
//! other is an overpayment refunded as its provider refunds. Invoices are
//! issued through the domain, as the engine issues them, on subscriptions
//! stored directly.

use dhukuti_tests::browser::{fields, form, text};
use dhukuti_tests::shop::{Shop, Via};
use dhukuti_tests::{Which, billing, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::billing::subscription::{Subscription, SubscriptionStatus};
use shared::domain::record;
use shared::time::{Clock, SystemClock};

/// NPR 500: under the sandbox Fonepay cap.
const AMOUNT: i64 = 50_000;

async fn open(which: Which) -> Option<Shop> {
    let shop = Shop::on(spawn_app(which).await?).await;
    shop.app.enable_fonepay(&shop.tenant, Mode::Sandbox).await;
    Some(shop)
}

fn project(shop: &Shop) -> String {
    shop.tenant.project.id.to_string()
}

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

async fn get(shop: &Shop, path: &str) -> Value {
    let a = shop.app.get(path, Some(&shop.key)).await;
    assert_eq!(a.status, 200, "{path}: {}", a.body);
    a.body
}

async fn subscription_status(shop: &Shop, sub: &Subscription) -> SubscriptionStatus {
    match record::get::<Subscription>(&*shop.app.store, &Subscription::key(&sub.id)).await {
        Ok(Some(s)) => s.status,
        other => panic!("subscription {}: {other:?}", sub.id),
    }
}

/// Opens the pay page's checkout ("Pay"): the session it leads to.
async fn pay_page_checkout(shop: &Shop, invoice: &str) -> String {
    let page = shop.browser.post_form(&format!("/b/{invoice}"), &[]).await;
    let to = page.redirect(303);
    let Some(session) = to.rsplit("/c/").next().map(str::to_owned) else {
        panic!("not a checkout: {to}")
    };
    assert!(session.starts_with("cs_"), "{to}");
    session
}

/// Takes the customer of `session` to Khalti's page: the form that pays
/// there, and the payment.
async fn at_khalti(shop: &Shop, session: &str) -> (dhukuti_tests::browser::Form, String) {
    let wallet = shop.to_wallet(session, Via::Khalti).await;
    let payment = text(&shop.session(session).await["paymentId"]);
    assert!(payment.starts_with("pay_"), "{payment}");
    (wallet, payment)
}

/// Pays at Khalti and comes back: the return is checked with Khalti and
/// settles the payment; where the customer lands (the bill page once
/// settled).
async fn pay_at_khalti(shop: &Shop, wallet: &dhukuti_tests::browser::Form) -> String {
    let mut sent = wallet.hidden.clone();
    sent.push(("action".into(), "pay".into()));
    let callback = shop
        .browser
        .post_form(&wallet.action, &sent)
        .await
        .redirect(302);
    shop.browser.get(&callback).await.redirect(303)
}

/// Settled: a success, or already refunded (Khalti refunds at once).
async fn settled(shop: &Shop, payment: &str) {
    let status = text(&shop.payment(payment).await["status"]);
    assert!(
        ["success", "refunded"].contains(&status.as_str()),
        "{payment}: {status}"
    );
}

async fn pay_qr_at_fonepay(shop: &Shop, session: &str) -> String {
    let payment = text(&shop.session(session).await["paymentId"]);
    let prn = shop.reference(&payment).await;
    let res = shop
        .app
        .client
        .post(shop.sim(&format!("/fonepay/_control/attempts/{prn}/pay")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(res.status().is_success(), "{}", res.status());
    shop.app
        .sweep(SystemClock.now().plus(chrono::Duration::minutes(2)))
        .await;
    assert_eq!(shop.payment(&payment).await["status"], "success");
    payment
}

async fn invoices_are_listed_read_and_shown_on_their_pay_page(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let sita = customer(&shop, "Sita Rai").await;
    let ram = customer(&shop, "Ram Thapa").await;
    let (sub, inv) = billing::first_invoice(&shop.app, &project(&shop), &sita, AMOUNT).await;
    let (_, other) = billing::first_invoice(&shop.app, &project(&shop), &ram, 70_000).await;
    let id = inv.id.to_string();

    let list = get(&shop, "/v1/billing/invoices").await;
    assert_eq!(list["total"], 2, "{list}");
    assert_eq!(
        (list["page"].clone(), list["limit"].clone()),
        (json!(1), json!(50))
    );
    assert_eq!(list["data"][0]["id"], other.id.to_string(), "newest first");
    let only = get(&shop, &format!("/v1/billing/invoices?customerId={sita}")).await;
    assert_eq!(only["total"], 1, "{only}");
    assert_eq!(only["data"][0]["id"], id.as_str());
    let by_sub = get(
        &shop,
        &format!("/v1/billing/invoices?subscriptionId={}", sub.id),
    )
    .await;
    assert_eq!(by_sub["total"], 1, "{by_sub}");
    let open_ones = get(&shop, "/v1/billing/invoices?status=open&limit=1").await;
    assert_eq!(
        (
            open_ones["total"].clone(),
            open_ones["data"].as_array().map(Vec::len)
        ),
        (json!(2), Some(1))
    );
    let paid = get(&shop, "/v1/billing/invoices?status=paid").await;
    assert_eq!(paid["total"], 0, "{paid}");
    let found = get(
        &shop,
        &format!("/v1/billing/invoices?search={}", inv.number.to_lowercase()),
    )
    .await;
    assert_eq!(found["total"], 1, "{found}");
    for (query, param) in [
        ("status=past_due", "status"),
        ("customerId=nobody", "customerId"),
        ("subscriptionId=cus_1", "subscriptionId"),
        ("limit=0", "limit"),
    ] {
        let a = shop
            .app
            .get(&format!("/v1/billing/invoices?{query}"), Some(&shop.key))
            .await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], param, "{query}: {}", a.body);
    }

    let got = get(&shop, &format!("/v1/billing/invoices/{id}")).await;
    assert_eq!(got["status"], "open", "{got}");
    assert_eq!(got["livemode"], false);
    assert!(text(&got["number"]).starts_with("TEST-PI-"), "{got}");
    assert_eq!(got["subscriptionId"], sub.id.to_string());
    assert_eq!(got["customerId"], sita.as_str());
    assert_eq!(
        (
            got["amount"].clone(),
            got["amountDue"].clone(),
            got["amountPaid"].clone()
        ),
        (json!(AMOUNT), json!(AMOUNT), json!(0))
    );
    assert_eq!(got["currency"], "NPR");
    assert_eq!(got["lines"][0]["amount"], AMOUNT, "{got}");
    assert_eq!(got["lines"][0]["kind"], "subscription");
    assert_eq!(got["dueDate"], inv.due_date.to_string());
    assert_eq!(got["due"]["ad"], inv.due_date.to_string());
    assert!(text(&got["due"]["bs"]).starts_with("208"), "a Miti: {got}");
    assert_eq!(got["periodStart"], inv.period_start.to_string());
    let pay_url = format!("{}/b/{id}", shop.app.base);
    assert_eq!(got["payUrl"], pay_url.as_str(), "{got}");
    let pdf_url = format!("{}/v1/billing/invoices/{id}/pdf", shop.app.base);
    assert_eq!(got["pdfUrl"], pdf_url.as_str());
    let pdf = shop
        .app
        .client
        .get(&pdf_url)
        .bearer_auth(&shop.key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pdf.status(), 200);
    assert_eq!(
        pdf.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/pdf")
    );
    let bytes = pdf.bytes().await.unwrap_or_default();
    assert!(bytes.starts_with(b"%PDF-"), "a PDF");
    assert_eq!(got["payment"], Value::Null);
    assert_eq!(got["overpayments"], json!([]));

    // Unknown and malformed ids, another tenant's key, the live key: 404.
    let other_shop = shop.app.tenant("Other Gym", "owner@other.example").await;
    let other_key = shop.app.key(&other_shop, Mode::Sandbox, &Scope::ALL).await;
    let live = shop.app.key(&shop.tenant, Mode::Live, &Scope::ALL).await;
    for (key, path) in [
        (
            &shop.key,
            "/v1/billing/invoices/inv_00000000000000000000000000".to_owned(),
        ),
        (&shop.key, "/v1/billing/invoices/cus_123".to_owned()),
        (&other_key, format!("/v1/billing/invoices/{id}")),
        (&live, format!("/v1/billing/invoices/{id}")),
    ] {
        let a = shop.app.get(&path, Some(key)).await;
        a.assert_error(404, "invalid_request_error", "not_found");
    }
    let theirs = shop.app.get("/v1/billing/invoices", Some(&other_key)).await;
    assert_eq!(theirs.body["total"], 0, "{}", theirs.body);
    // A key without billing:read.
    let payments_only = shop
        .app
        .key(&shop.tenant, Mode::Sandbox, &[Scope::PaymentsRead])
        .await;
    let a = shop
        .app
        .get("/v1/billing/invoices", Some(&payments_only))
        .await;
    a.assert_error(403, "permission_error", "missing_scope");

    // The pay page: no key; merchant, number, amount, period and due date
    // in AD and BS, and a Pay button.
    let page = shop.browser.get(&format!("/b/{id}")).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.has("Asan Bazaar"), "{}", page.show());
    assert!(page.has(&inv.number), "{}", page.show());
    assert!(page.has("NPR 500.00"), "{}", page.show());
    assert!(page.has(&inv.due_date.to_string()), "{}", page.show());
    assert!(page.has(" BS)"), "{}", page.show());
    assert!(
        form(&page.body, Some("link-form")).is_some(),
        "{}",
        page.show()
    );
    assert!(!page.has("?"), "no unprintable Miti: {}", page.show());
    // Its PDF, keyless as the page: the same document the API serves.
    let link = format!("/b/{id}/pdf");
    assert!(page.has(&format!("href=\"{link}\"")), "{}", page.show());
    let doc = shop
        .app
        .client
        .get(format!("{}{link}", shop.app.base))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc.status(), 200);
    assert_eq!(
        doc.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/pdf")
    );
    assert_eq!(
        doc.headers()
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        Some("private, no-store")
    );
    assert_eq!(doc.bytes().await.unwrap_or_default(), bytes, "the same PDF");
    for path in [
        "/b/inv_00000000000000000000000000/pdf",
        "/b/not-an-id/pdf",
        "/b/pay_00000000000000000000000000/pdf",
    ] {
        let r = shop
            .app
            .client
            .get(format!("{}{path}", shop.app.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status(), 404, "{path}");
    }
    let missing = shop.browser.get("/b/inv_00000000000000000000000000").await;
    assert_eq!(missing.status, 404, "{}", missing.show());
    let junk = shop.browser.get("/b/not-an-id").await;
    assert_eq!(junk.status, 404, "{}", junk.show());
    shop.stop().await;
}

/// The QR pays the invoice first (its subscription becomes active); the
/// page's Khalti checkout, opened before in another tab, pays after: an
/// overpayment, refunded through Khalti's API, shown on the invoice; the
/// page then shows the invoice paid, and a new QR is refused.
async fn a_qr_and_a_pay_page_give_one_payment_and_one_refund(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let sita = customer(&shop, "Sita Rai").await;
    let (sub, inv) = billing::first_invoice(&shop.app, &project(&shop), &sita, AMOUNT).await;
    let id = inv.id.to_string();
    assert_eq!(
        subscription_status(&shop, &sub).await,
        SubscriptionStatus::Incomplete
    );

    // The other tab: the pay page's checkout, at Khalti, not yet paid.
    let tab = pay_page_checkout(&shop, &id).await;
    let (wallet, late) = at_khalti(&shop, &tab).await;

    // The counter's QR.
    let q = shop
        .app
        .post(
            &format!("/v1/billing/invoices/{id}/qr"),
            Some(&shop.key),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(q.status, 201, "{}", q.body);
    assert_eq!(q.body["invoice_id"], id.as_str());
    assert_eq!(q.body["amount"], AMOUNT);
    assert_eq!(q.body["currency"], "NPR");
    assert_eq!(q.body["provider"], "fonepay");
    assert_eq!(q.body["status"], "initiated", "{}", q.body);
    assert!(
        text(&q.body["qr_message"]).starts_with("000201"),
        "{}",
        q.body
    );
    assert!(text(&q.body["qr_image"]).starts_with("data:image/png;base64,"));
    assert!(
        text(&q.body["events_url"]).contains("/events"),
        "{}",
        q.body
    );
    let qr_session = text(&q.body["id"]);
    let first = pay_qr_at_fonepay(&shop, &qr_session).await;

    let got = get(&shop, &format!("/v1/billing/invoices/{id}")).await;
    assert_eq!(got["status"], "paid", "{got}");
    assert_eq!(got["amountPaid"], AMOUNT);
    assert_eq!(got["payment"]["paymentId"], first.as_str(), "{got}");
    assert_eq!(got["payment"]["method"], "fonepay");
    assert!(got["paidAt"].is_string());
    assert_eq!(
        subscription_status(&shop, &sub).await,
        SubscriptionStatus::Active
    );

    // The tab pays too: an overpayment, refunded by Khalti's API. (The
    // sweep above checked its payment "later": its return leaves the
    // check to the next sweep.)
    pay_at_khalti(&shop, &wallet).await;
    shop.app
        .sweep(SystemClock.now().plus(chrono::Duration::minutes(4)))
        .await;
    settled(&shop, &late).await;
    let got = get(&shop, &format!("/v1/billing/invoices/{id}")).await;
    assert_eq!(got["status"], "paid", "{got}");
    assert_eq!(
        got["payment"]["paymentId"],
        first.as_str(),
        "still the QR's: {got}"
    );
    assert_eq!(got["amountPaid"], AMOUNT);
    let over = &got["overpayments"];
    assert_eq!(over.as_array().map(Vec::len), Some(1), "{got}");
    assert_eq!(over[0]["paymentId"], late.as_str());
    assert_eq!(over[0]["method"], "khalti");
    assert_eq!(over[0]["amount"], AMOUNT);
    assert!(text(&over[0]["refundId"]).starts_with("ref_"), "{got}");
    assert!(
        ["processing", "succeeded"].contains(&over[0]["refundStatus"].as_str().unwrap_or("")),
        "{got}"
    );
    let refunds = get(&shop, &format!("/v1/refunds?paymentId={late}")).await;
    assert_eq!(refunds["meta"]["total"], 1, "{refunds}");
    assert_eq!(refunds["data"][0]["amount"], AMOUNT);
    assert_eq!(
        subscription_status(&shop, &sub).await,
        SubscriptionStatus::Active
    );

    // Told again (a retried return, the sweep): nothing more.
    shop.app
        .sweep(SystemClock.now().plus(chrono::Duration::minutes(6)))
        .await;
    let again = get(&shop, &format!("/v1/billing/invoices/{id}")).await;
    assert_eq!(
        again["overpayments"].as_array().map(Vec::len),
        Some(1),
        "{again}"
    );
    let refunds = get(&shop, &format!("/v1/refunds?paymentId={late}")).await;
    assert_eq!(refunds["meta"]["total"], 1, "{refunds}");

    // The page shows the invoice paid, without a Pay button; "Pay" and a
    // new QR are refused.
    let page = shop.browser.get(&format!("/b/{id}")).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.has("id=bill-state data-status=paid"),
        "{}",
        page.show()
    );
    assert!(!page.has("id=bill-pay"), "{}", page.show());
    let pay = shop
        .browser
        .post_form(&format!("/b/{id}"), &fields(&[]))
        .await;
    assert_eq!(pay.status, 422, "{}", pay.show());
    let q = shop
        .app
        .post(
            &format!("/v1/billing/invoices/{id}/qr"),
            Some(&shop.key),
            None,
            &json!({}),
        )
        .await;
    q.assert_error(
        409,
        "invalid_request_error",
        "billing_invoice_state_conflict",
    );
    shop.stop().await;
}

/// Two tabs pay at once: one pays the invoice, the other is an
/// overpayment with its refund, whichever wins.
async fn two_tabs_paying_at_once_give_one_paid_invoice_and_one_refund(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let sita = customer(&shop, "Sita Rai").await;
    let (sub, inv) = billing::first_invoice(&shop.app, &project(&shop), &sita, AMOUNT).await;
    let id = inv.id.to_string();
    let a = pay_page_checkout(&shop, &id).await;
    let b = pay_page_checkout(&shop, &id).await;
    assert_ne!(a, b);
    let (wa, pa) = at_khalti(&shop, &a).await;
    let (wb, pb) = at_khalti(&shop, &b).await;
    let (to_a, to_b) = tokio::join!(pay_at_khalti(&shop, &wa), pay_at_khalti(&shop, &wb));
    for to in [to_a, to_b] {
        assert!(
            to.starts_with(&format!("{}/b/{id}?session_id=cs_", shop.app.base)),
            "back to the bill page: {to}"
        );
    }
    for p in [&pa, &pb] {
        settled(&shop, p).await;
    }
    let got = get(&shop, &format!("/v1/billing/invoices/{id}")).await;
    assert_eq!(got["status"], "paid", "{got}");
    assert_eq!(got["amountPaid"], AMOUNT);
    let winner = text(&got["payment"]["paymentId"]);
    let over = &got["overpayments"];
    assert_eq!(over.as_array().map(Vec::len), Some(1), "{got}");
    let loser = text(&over[0]["paymentId"]);
    let mut both = [winner, loser.clone()];
    both.sort();
    let mut want = [pa, pb];
    want.sort();
    assert_eq!(both, want);
    assert!(text(&over[0]["refundId"]).starts_with("ref_"), "{got}");
    let refunds = get(&shop, &format!("/v1/refunds?paymentId={loser}")).await;
    assert_eq!(refunds["meta"]["total"], 1, "{refunds}");
    assert_eq!(
        subscription_status(&shop, &sub).await,
        SubscriptionStatus::Active
    );
    shop.stop().await;
}

/// A QR is a plan feature behind `billing:write`; an invoice above the
/// sandbox Fonepay cap is refused saying so.
async fn an_invoice_qr_refuses_what_it_cannot_do(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let sita = customer(&shop, "Sita Rai").await;
    let (_, big) = billing::first_invoice(&shop.app, &project(&shop), &sita, 150_000).await;
    let a = shop
        .app
        .post(
            &format!("/v1/billing/invoices/{}/qr", big.id),
            Some(&shop.key),
            None,
            &json!({}),
        )
        .await;
    a.assert_error(422, "invalid_request_error", "fonepay_sandbox_cap");
    let reader = shop
        .app
        .key(&shop.tenant, Mode::Sandbox, &[Scope::BillingRead])
        .await;
    let a = shop
        .app
        .post(
            &format!("/v1/billing/invoices/{}/qr", big.id),
            Some(&reader),
            None,
            &json!({}),
        )
        .await;
    a.assert_error(403, "permission_error", "missing_scope");
    let a = shop
        .app
        .post(
            "/v1/billing/invoices/inv_00000000000000000000000000/qr",
            Some(&shop.key),
            None,
            &json!({}),
        )
        .await;
    a.assert_error(404, "invalid_request_error", "not_found");
    shop.stop().await;
}

on_both_backends!(
    invoices_are_listed_read_and_shown_on_their_pay_page,
    a_qr_and_a_pay_page_give_one_payment_and_one_refund,
    two_tabs_paying_at_once_give_one_paid_invoice_and_one_refund,
    an_invoice_qr_refuses_what_it_cannot_do,
);
