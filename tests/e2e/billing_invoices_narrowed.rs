//! Issue 37 item 11, the billing invoices narrowed by their filters
//! (`shared::domain::billing::invoice::narrowed`): `GET
//! /v1/billing/invoices` by `status`, `customerId`, `subscriptionId` and
//! their combinations answers any page (past the 100 read through, past
//! the old 10,000 window) equal to the full list filtered client-side,
//! with exact totals; an invoice voided at a deep offset moves from one
//! status's list to the other's; the dashboard's invoices list pages a
//! status the same way. Invoices are issued through the domain on
//! subscriptions stored directly (`tests/support/billing.rs`). Both
//! backends.

use dhukuti_tests::billing::{self, get, ok, text};
use dhukuti_tests::dash::Dash;
use dhukuti_tests::shop::Shop;
use dhukuti_tests::{Which, on_both_backends, spawn_app};
use serde_json::Value;
use shared::domain::billing::invoice;
use shared::domain::dashboard::{self, Role};
use shared::domain::record::Record;
use shared::domain::{Mode, Tenant};
use shared::ids::{BillingInvoiceId, CustomerId};
use shared::time::{Clock, SystemClock};

/// One invoice as the full list shows it.
#[derive(Clone, Debug)]
struct Row {
    id: String,
    status: String,
    customer: String,
    subscription: String,
}

fn rows(a: &dhukuti_tests::Answer) -> Vec<Row> {
    ok(a, 200, "list");
    a.body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .map(|v: &Value| Row {
                    id: text(&v["id"]),
                    status: text(&v["status"]),
                    customer: text(&v["customerId"]),
                    subscription: text(&v["subscriptionId"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The whole list, newest first, by pages of 100.
async fn walk(shop: &Shop) -> Vec<Row> {
    let mut all = Vec::new();
    for p in 1.. {
        let a = get(
            &shop.app,
            &format!("/v1/billing/invoices?page={p}&limit=100"),
            &shop.key,
        )
        .await;
        let got = rows(&a);
        if got.is_empty() {
            break;
        }
        all.extend(got);
    }
    all
}

/// What a filter keeps: `(status, customer, subscription)`, each `None`
/// for any.
type Filter = (Option<String>, Option<String>, Option<String>);

fn query_of(f: &Filter) -> String {
    let mut q = Vec::new();
    for (name, v) in [
        ("status", &f.0),
        ("customerId", &f.1),
        ("subscriptionId", &f.2),
    ] {
        if let Some(v) = v {
            q.push(format!("{name}={v}"));
        }
    }
    q.join("&")
}

fn kept(all: &[Row], f: &Filter) -> Vec<String> {
    all.iter()
        .filter(|r| {
            f.0.as_ref().is_none_or(|s| *s == r.status)
                && f.1.as_ref().is_none_or(|c| *c == r.customer)
                && f.2.as_ref().is_none_or(|s| *s == r.subscription)
        })
        .map(|r| r.id.clone())
        .collect()
}

/// `f`'s pages at offsets 0, 1, 100, 101, the last and past the end (a
/// page of one), by pages of 7 across the 100 read through, and far past
/// the old window: each the slice of the full list filtered.
async fn assert_filter(shop: &Shop, all: &[Row], f: &Filter) {
    let want = kept(all, f);
    let n = want.len();
    let q = query_of(f);
    let at = |page: usize, limit: usize| {
        let path = format!("/v1/billing/invoices?{q}&page={page}&limit={limit}");
        async move { get(&shop.app, &path, &shop.key).await }
    };
    for offset in [0, 1, 100, 101, n.saturating_sub(1), n] {
        let a = at(offset + 1, 1).await;
        let got: Vec<String> = rows(&a).into_iter().map(|r| r.id).collect();
        let slice = want
            .get(offset.min(n)..(offset + 1).min(n))
            .unwrap_or_default();
        assert_eq!(got, slice.to_vec(), "{q} offset {offset}");
        assert_eq!(a.body["total"], n, "{q}");
    }
    for page in [15, 16] {
        let a = at(page, 7).await;
        let got: Vec<String> = rows(&a).into_iter().map(|r| r.id).collect();
        let from = ((page - 1) * 7).min(n);
        assert_eq!(
            got,
            want[from..(from + 7).min(n)].to_vec(),
            "{q} page {page}"
        );
    }
    let a = at(101, 100).await;
    assert!(rows(&a).is_empty(), "{q}: {}", a.body);
    assert_eq!(a.body["total"], n, "{q}");
}

async fn billing_invoices_filtered_deep_with_exact_totals(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    app.set_rate_limits(10_000, 10_000);
    let shop = Shop::on(app).await;
    let project = shop.tenant.project.id.to_string();
    let tenant = Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox);
    let (sita, ram) = (CustomerId::new().to_string(), CustomerId::new().to_string());
    let (sita, ram) = (sita.as_str(), ram.as_str());
    // 150 invoices: eight issued on eight subscriptions (six Sita's, two
    // Ram's), the rest copies of them as the engine writes an invoice
    // (its entries and counts); every fourth voided.
    const N: usize = 150;
    let mut issued = Vec::new();
    for i in 0..8 {
        let who = if i % 4 == 3 { ram } else { sita };
        let (_, inv) = billing::first_invoice(&shop.app, &project, who, 50_000).await;
        issued.push(inv);
    }
    let mut made = issued.clone();
    for i in 8..N {
        let mut inv = issued[i % 8].clone();
        inv.id = BillingInvoiceId::new();
        inv.number = format!("{}-{i}", inv.number);
        let mut ops = vec![inv.put_new().unwrap_or_else(|e| panic!("{e}"))];
        ops.extend(inv.insert_counts());
        shop.app
            .store
            .transact(ops)
            .await
            .unwrap_or_else(|e| panic!("insert: {e}"));
        made.push(inv);
    }
    for inv in made.iter().step_by(4) {
        invoice::void(shop.app.state(), &tenant, &inv.id, SystemClock.now())
            .await
            .unwrap_or_else(|e| panic!("void: {e}"));
    }
    let all = walk(&shop).await;
    assert_eq!(all.len(), N);
    let some = |s: &str| Some(s.to_owned());
    let (sita_sub, ram_sub) = (
        issued[1].subscription_id.to_string(),
        issued[3].subscription_id.to_string(),
    );
    let filters: Vec<Filter> = vec![
        (some("open"), None, None),
        (some("void"), None, None),
        (some("paid"), None, None),
        (None, some(sita), None),
        (None, some(ram), None),
        (None, None, some(&ram_sub)),
        (some("open"), some(sita), None),
        (some("void"), some(ram), None),
        (some("open"), None, some(&sita_sub)),
        (None, some(ram), some(&ram_sub)),
        (None, some(sita), some(&ram_sub)),
    ];
    assert!(kept(&all, &filters[0]).len() > 110);
    for f in &filters {
        assert_filter(&shop, &all, f).await;
    }

    // An open invoice at a deep offset voided: it leaves the open list
    // (the next moves up into its place) and joins the void list.
    let open = kept(&all, &filters[0]);
    let deep = open[105].clone();
    invoice::void(
        shop.app.state(),
        &tenant,
        &deep.as_str().into(),
        SystemClock.now(),
    )
    .await
    .unwrap_or_else(|e| panic!("void: {e}"));
    let a = get(
        &shop.app,
        "/v1/billing/invoices?status=open&page=106&limit=1",
        &shop.key,
    )
    .await;
    assert_eq!(rows(&a)[0].id, open[106], "{}", a.body);
    assert_eq!(a.body["total"], open.len() - 1);
    let after = walk(&shop).await;
    assert_eq!(
        after
            .iter()
            .find(|r| r.id == deep)
            .map(|r| r.status.as_str()),
        Some("void")
    );
    for f in [
        &filters[0],
        &filters[1],
        &filters[6],
        &filters[7],
        &filters[8],
    ] {
        assert_filter(&shop, &after, f).await;
    }

    // The dashboard's invoices list pages a status the same way (25 a
    // page): its fifth page of open invoices.
    dashboard::create_user(
        shop.app.state(),
        SystemClock.now(),
        &shop.tenant.merchant.id,
        "viewer@narrow.example",
        Role::Viewer,
        "a long dashboard password",
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut viewer = Dash::new(&shop.app.base);
    let r = viewer
        .sign_in("viewer@narrow.example", "a long dashboard password")
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let open_now: Vec<&Row> = after.iter().filter(|r| r.status == "open").collect();
    let page = viewer
        .get("/dashboard/billing/invoices?status=open&page=5")
        .await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.body.contains(&format!("{} invoices.", open_now.len())),
        "{}",
        page.show()
    );
    for (i, r) in open_now.iter().enumerate() {
        assert_eq!(
            page.body.contains(&r.id),
            (100..125).contains(&i),
            "{} at {i}",
            r.id
        );
    }
    shop.stop().await;
}

on_both_backends!(billing_invoices_filtered_deep_with_exact_totals);
