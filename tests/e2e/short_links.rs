//! Issue 39 part 6, the short pay path `/r/<token>` a reminder SMS carries
//! (at most 40 characters): an invoice's token goes on (303) to its bill
//! page, which the customer's browser pays from; a subscription's shows
//! its trial; an unknown or malformed token is a 404 page; the page of a
//! token shows that target only (tokens are global, as ids are); a flood
//! from one address is refused while another address is served. The
//! customer, plans and subscriptions are made over the API; the tokens
//! through `short_links::ensure`, as the reminders make them.

use dhukuti_tests::browser::text;
use dhukuti_tests::shop::Shop;
use dhukuti_tests::{Which, on_both_backends, spawn_app};
use serde_json::{Value, json};
use shared::domain::billing::reminders::MAX_PAY_URL_CHARS;
use shared::domain::short_links::{self, ShortLink, ShortTarget};
use shared::domain::{Mode, Tenant};
use shared::ids::{BillingInvoiceId, SubscriptionId};

const HTML: &str = "text/html,application/xhtml+xml";

async fn open(which: Which) -> Option<Shop> {
    Some(Shop::on(spawn_app(which).await?).await)
}

fn tenant(shop: &Shop) -> Tenant {
    Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox)
}

async fn post(shop: &Shop, path: &str, body: Value) -> Value {
    let a = shop.app.post(path, Some(&shop.key), None, &body).await;
    assert_eq!(a.status, 201, "{path}: {}", a.body);
    a.body
}

/// A customer (with the details a page must not show) and a plan of
/// `trial_days` over the API; their subscription: its id.
async fn subscribe(shop: &Shop, plan: &str, trial_days: u32) -> String {
    let customer = post(
        shop,
        "/v1/billing/customers",
        json!({"name": "Sita Rai", "phone": "9800000001", "email": "sita@example.np"}),
    )
    .await;
    let plan = post(
        shop,
        "/v1/billing/plans",
        json!({"name": plan, "amount": 150_000, "intervalUnit": "month", "trialDays": trial_days}),
    )
    .await;
    let sub = post(
        shop,
        "/v1/billing/subscriptions",
        json!({"customerId": customer["id"], "planId": plan["id"]}),
    )
    .await;
    text(&sub["id"])
}

/// A subscription without a trial over the API, and the invoice it issued
/// at once: its `payUrl`, number and id.
async fn issued_invoice(shop: &Shop) -> (String, String, BillingInvoiceId) {
    let sub = subscribe(shop, "Fibre 100 Mbps", 0).await;
    let list = shop
        .app
        .get(
            &format!("/v1/billing/invoices?subscriptionId={sub}"),
            Some(&shop.key),
        )
        .await;
    assert_eq!(list.status, 200, "{}", list.body);
    let inv = &list.body["data"][0];
    assert_eq!(inv["status"], "open", "{}", list.body);
    (
        text(&inv["payUrl"]),
        text(&inv["number"]),
        BillingInvoiceId::stored(text(&inv["id"])),
    )
}

async fn link(shop: &Shop, target: ShortTarget) -> ShortLink {
    short_links::ensure(shop.app.state(), &tenant(shop), &target)
        .await
        .unwrap_or_else(|e| panic!("ensure: {e}"))
}

async fn an_invoices_short_link_leads_to_its_bill_page(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let (pay_url, number, id) = issued_invoice(&shop).await;
    let l = link(&shop, ShortTarget::Invoice(id.clone())).await;
    assert_eq!(
        link(&shop, ShortTarget::Invoice(id.clone())).await,
        l,
        "one token per invoice"
    );
    let short = l.url(&shop.app.base);
    assert!(
        short.chars().count() <= MAX_PAY_URL_CHARS,
        "{short} fits a reminder"
    );

    // The browser: a 303 to the invoice's payUrl, its bill page served,
    // and "Pay" opens a checkout.
    let page = shop.browser.get(&short).await;
    assert_eq!(page.redirect(303), pay_url);
    let bill = shop.browser.get(&pay_url).await;
    assert_eq!(bill.status, 200, "{}", bill.show());
    assert!(bill.has(&number), "{}", bill.show());
    assert!(bill.has("Asan Bazaar"), "{}", bill.show());
    // The page reveals that invoice only: not whom it bills.
    for private in ["Sita Rai", "9800000001", "sita@example.np"] {
        assert!(!page.has(private) && !bill.has(private), "{private}");
    }
    let pay = shop.browser.post_form(&pay_url, &[]).await;
    assert!(pay.redirect(303).contains("/c/cs_"), "{}", pay.show());

    // HEAD answers as GET, without a body.
    let head = shop.browser.send(shop.browser.http.head(&short)).await;
    assert_eq!(head.redirect(303), pay_url);
    assert!(head.body.is_empty());
    shop.stop().await;
}

async fn a_subscriptions_short_link_shows_its_trial(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let sub = subscribe(&shop, "Gym Monthly", 14).await;
    let got = shop
        .app
        .get(&format!("/v1/billing/subscriptions/{sub}"), Some(&shop.key))
        .await;
    assert_eq!(got.body["status"], "trialing", "{}", got.body);
    let ends = text(&got.body["trialEndsAt"]);
    let ends = shared::time::Timestamp::parse(&ends).expect("trialEndsAt");
    let day = shared::domain::billing::calendar::nepal_day(ends);
    let miti = shared::domain::billing::calendar::bs_from_ad(day)
        .map(shared::domain::billing::calendar::miti_latin)
        .expect("a Miti");

    let l = link(
        &shop,
        ShortTarget::Subscription(SubscriptionId::stored(&sub)),
    )
    .await;
    let page = shop.browser.get(&l.url(&shop.app.base)).await;
    assert_eq!(page.status, 200, "{}", page.show());
    for shown in [
        "Asan Bazaar",
        "Gym Monthly",
        "1,500.00",
        &format!("{day} ({miti} BS)"),
        "receive a bill with a pay link when the trial ends",
        "test mode",
    ] {
        assert!(page.has(shown), "{shown}: {}", page.show());
    }
    for private in ["Sita Rai", "9800000001", "sita@example.np", sub.as_str()] {
        assert!(!page.has(private), "{private}: {}", page.show());
    }
    // The hosted pages' policy: its own style by hash, no script.
    for url in [l.url(&shop.app.base), shop.app.url("/r/zZ9yY8xX7w")] {
        let res = shop
            .browser
            .http
            .get(&url)
            .header("accept", HTML)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let csp = res
            .headers()
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert_eq!(csp, hosted::pages::csp(), "{url}");
    }
    let head = shop
        .browser
        .send(shop.browser.http.head(l.url(&shop.app.base)))
        .await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    shop.stop().await;
}

async fn unknown_and_malformed_tokens_are_not_found(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    for path in [
        "/r/aB3dE6gH9j",
        "/r/0000000000",
        "/r/short",
        "/r/aB3dE6gH9jk",
        "/r/aB3dE6gH9%21",
        "/r/%ZZ%ZZ%ZZ%ZZ%ZZ",
        "/r/aB3dE6gH9%C3%A9",
    ] {
        let page = shop
            .browser
            .send(
                shop.browser
                    .http
                    .get(shop.app.url(path))
                    .header("accept", HTML),
            )
            .await;
        assert_eq!(page.status, 404, "{path}: {}", page.show());
        assert!(page.has("Link not found"), "{path}: {}", page.show());
        assert!(page.location.is_none(), "{path}");
    }
    shop.stop().await;
}

fn client_from(ip: [u8; 4]) -> reqwest::Client {
    match reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(20))
        .build()
    {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

async fn status_of(client: &reqwest::Client, url: &str) -> (u16, Option<String>) {
    match client.get(url).header("accept", HTML).send().await {
        Ok(res) => (
            res.status().as_u16(),
            res.headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        ),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// A burst of short links (real and made up) from one address is cut at
/// the address's budget (429 with `Retry-After`), while a customer at
/// another address is served.
async fn a_burst_from_one_address_is_refused_another_is_served(which: Which) {
    let Some(shop) = open(which).await else {
        return;
    };
    let (_, _, id) = issued_invoice(&shop).await;
    let real = link(&shop, ShortTarget::Invoice(id))
        .await
        .url(&shop.app.base);
    let made_up = shop.app.url("/r/zZ9yY8xX7w");
    // address, writes per address, per session, per link, link sessions
    shop.app.state().public_limits().set(10, 100, 100, 100, 100);
    let flooder = client_from([127, 0, 0, 31]);
    // 30 at a limit of 10 a minute: even across a minute's end (two
    // windows), some are refused.
    let burst = futures::future::join_all((0..30).map(|n| {
        let url = if n % 2 == 0 { &real } else { &made_up };
        status_of(&flooder, url)
    }))
    .await;
    let refused: Vec<_> = burst.iter().filter(|(s, _)| *s == 429).collect();
    assert!(!refused.is_empty(), "{burst:?}");
    assert!(refused.len() >= 10, "{burst:?}");
    assert!(
        refused.iter().all(|(_, retry)| retry.is_some()),
        "{burst:?}"
    );
    assert!(
        burst.iter().all(|(s, _)| [303, 404, 429].contains(s)),
        "{burst:?}"
    );
    let customer = client_from([127, 0, 0, 32]);
    assert_eq!(status_of(&customer, &real).await.0, 303);
    shop.stop().await;
}

on_both_backends!(
    an_invoices_short_link_leads_to_its_bill_page,
    a_subscriptions_short_link_shows_its_trial,
    unknown_and_malformed_tokens_are_not_found,
    a_burst_from_one_address_is_refused_another_is_served,
);
