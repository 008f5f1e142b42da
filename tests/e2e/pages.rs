//! Deep pages (issue 37, item 11): every record of a list stays
//! reachable, and what one list request reads stays bounded. The API
//! takes any `offset >= 0` (the contract; main refused past 10,000) and
//! `starting_after`, a record's id, which reads one page whatever its
//! depth; the dashboard's Older and Newer links seek the same way, so
//! records past its old 400th page are reachable. Both backends.

use std::sync::Arc;

use dhukuti_tests::browser::tags;
use dhukuti_tests::dash::Dash;
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, spawn_app_tweaked};
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::domain::{Mode, Provider};
use shared::store::counting::CountingStore;
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";

/// A gateway whose store counts what it is asked (no webhook poller: its
/// reads would be counted too).
async fn counted(which: Which) -> Option<(TestApp, Arc<CountingStore>)> {
    let mut counting: Option<Arc<CountingStore>> = None;
    let app = spawn_app_tweaked(
        which,
        |inner| {
            let c = Arc::new(CountingStore::new(inner).apart(shared::keys::is_rate_window));
            counting = Some(c.clone());
            c
        },
        |s| s.webhook_poll = None,
    )
    .await;
    match (app, counting) {
        (Some(app), Some(c)) => Some((app, c)),
        _ => None,
    }
}

fn ids(a: &Answer) -> Vec<String> {
    a.body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|p| p["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Items the store read to answer `path` (a warm request: the key is
/// remembered after the first).
async fn items_read(app: &TestApp, c: &CountingStore, path: &str, key: &str) -> (Answer, u64) {
    let before = c.items_read();
    let a = app.get(path, Some(key)).await;
    (a, c.items_read() - before)
}

/// Any offset is a page, never a refusal: past the end it is empty, with
/// the list's total (main answered 400 `offset` past 10,000, on every
/// list).
async fn an_offset_past_the_old_cap_is_a_page(which: Which) {
    let Some((app, _)) = counted(which).await else {
        return;
    };
    let t = app.tenant("Deep Shop", "d@deep.example").await;
    let key = app
        .key(
            &t,
            Mode::Sandbox,
            &[
                Scope::PaymentsRead,
                Scope::RefundsRead,
                Scope::LinksRead,
                Scope::SessionsRead,
                Scope::InvoicesRead,
            ],
        )
        .await;
    for i in 0..3 {
        app.payment(&t, Mode::Sandbox, 100 + i, Provider::Khalti)
            .await;
    }
    let a = app.get("/v1/payments?offset=10001", Some(&key)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["data"], serde_json::json!([]));
    assert_eq!(
        a.body["meta"],
        serde_json::json!({"total": 3, "limit": 25, "offset": 10001})
    );
    let a = app.get("/v1/payments?offset=2&limit=5", Some(&key)).await;
    assert_eq!(ids(&a).len(), 1, "{}", a.body);
    for list in [
        "/v1/refunds",
        "/v1/payment-links",
        "/v1/sessions",
        "/v1/invoices",
    ] {
        let a = app.get(&format!("{list}?offset=10001"), Some(&key)).await;
        assert_eq!(a.status, 200, "{list}: {}", a.body);
        assert_eq!(a.body["data"], serde_json::json!([]), "{list}");
        assert_eq!(a.body["meta"]["offset"], 10001, "{list}");
    }
    app.stop().await;
}

/// `starting_after` walks a whole list, every record once, newest first,
/// each page reading what one page holds however deep it is; an offset
/// reads what it skips. A cursor that is no record of the list is a 400
/// naming it.
async fn starting_after_reaches_every_record_at_the_cost_of_a_page(which: Which) {
    let Some((app, c)) = counted(which).await else {
        return;
    };
    let t = app.tenant("Walk Shop", "w@walk.example").await;
    let key = app.key(&t, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let mut created = Vec::new();
    for i in 0..30 {
        let p = app
            .payment(&t, Mode::Sandbox, 100 + i, Provider::Esewa)
            .await;
        created.push(p.id.to_string());
    }
    created.reverse();

    let (first, first_cost) = items_read(&app, &c, "/v1/payments?limit=4", &key).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let mut seen = ids(&first);
    let mut costs = Vec::new();
    while let Some(last) = seen.last().cloned() {
        let path = format!("/v1/payments?limit=4&starting_after={last}");
        let (a, cost) = items_read(&app, &c, &path, &key).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["meta"]["total"], 30);
        let page = ids(&a);
        if page.is_empty() {
            break;
        }
        // A cursor that does not move would loop: fail instead of hanging.
        assert!(
            seen.len() + page.len() <= created.len() && !page.iter().any(|id| seen.contains(id)),
            "the walk repeats records: {page:?} after {seen:?}"
        );
        costs.push(cost);
        seen.extend(page);
    }
    assert_eq!(seen, created, "every payment once, newest first");
    assert!(
        costs.iter().all(|&n| n <= first_cost),
        "a deep page reads no more than the first ({first_cost}): {costs:?}"
    );
    // The same page by offset reads the 24 records it skips as well.
    let (by_offset, offset_cost) =
        items_read(&app, &c, "/v1/payments?limit=4&offset=24", &key).await;
    let after = format!("/v1/payments?limit=4&starting_after={}", created[23]);
    let (by_cursor, cursor_cost) = items_read(&app, &c, &after, &key).await;
    assert_eq!(ids(&by_offset), ids(&by_cursor));
    assert_eq!(ids(&by_cursor), created[24..28].to_vec());
    assert!(
        offset_cost >= cursor_cost + 24,
        "offset {offset_cost}, cursor {cursor_cost}"
    );
    // `offset` counts from the cursor.
    let a = app
        .get(
            &format!(
                "/v1/payments?limit=2&offset=3&starting_after={}",
                created[9]
            ),
            Some(&key),
        )
        .await;
    assert_eq!(ids(&a), created[13..15].to_vec());
    for bad in [
        "ref_01jdq7v3kz8y2x6w5t4s3r2q1p",
        "pay_nope",
        "PAY_01JDQ7V3KZ8Y2X6W5T4S3R2Q1P",
    ] {
        let a = app
            .get(&format!("/v1/payments?starting_after={bad}"), Some(&key))
            .await;
        a.assert_error(400, "invalid_request_error", "validation_failed");
        assert_eq!(a.body["error"]["param"], "starting_after", "{bad}");
    }
    app.stop().await;
}

/// The hrefs of the payments a dashboard list page shows, and of its
/// `rel` link (`next`: Older, `prev`: Newer).
fn dashboard_page(body: &str, rel: &str) -> (Vec<String>, Option<String>) {
    let links = tags(body, "a");
    let payments = links
        .iter()
        .filter_map(|a| a.get("href"))
        .filter_map(|h| h.strip_prefix("/dashboard/payments/"))
        .filter(|id| id.starts_with("pay_"))
        .map(str::to_owned)
        .collect();
    let link = links
        .iter()
        .find(|a| a.get("rel") == Some(rel))
        .and_then(|a| a.get("href"))
        .map(str::to_owned);
    (payments, link)
}

/// The dashboard's payments list reaches every payment by its Older
/// links and back by its Newer ones; a page past the old 400th (10,000
/// payments) is one its links can reach (main refused `page=401`), and a
/// page by link reads no more than the first.
async fn the_dashboard_reaches_every_payment_by_its_links(which: Which) {
    let Some((app, c)) = counted(which).await else {
        return;
    };
    let t = app.tenant("Page Traders", "owner@pages.np").await;
    dashboard::create_user(
        app.state(),
        SystemClock.now(),
        &t.merchant.id,
        "owner@pages.np",
        Role::Owner,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
    let mut created = Vec::new();
    for i in 0..60 {
        let p = app
            .payment(&t, Mode::Sandbox, 1000 + i, Provider::Khalti)
            .await;
        created.push(p.id.to_string());
    }
    created.reverse();
    let mut b = Dash::new(&app.base);
    let r = b.sign_in("owner@pages.np", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());

    let before = c.items_read();
    let r = b.get("/dashboard/payments").await;
    let first_cost = c.items_read() - before;
    assert_eq!(r.status, 200, "{}", r.show());
    let (mut seen, mut next) = dashboard_page(&r.body, "next");
    let mut pages = vec![r.body];
    while let Some(href) = next {
        let before = c.items_read();
        let r = b.get(&href).await;
        let cost = c.items_read() - before;
        assert_eq!(r.status, 200, "{href}: {}", r.show());
        assert!(
            cost <= first_cost,
            "{href}: {cost} items, first {first_cost}"
        );
        let (ids, older) = dashboard_page(&r.body, "next");
        seen.extend(ids);
        next = older;
        pages.push(r.body);
        assert!(pages.len() <= 4, "the Older links go round");
    }
    assert_eq!(seen, created, "every payment once, newest first");
    assert_eq!(pages.len(), 3);
    // Back by the Newer links, page by page.
    let (_, mut prev) = dashboard_page(&pages[2], "prev");
    let mut back: Vec<Vec<String>> = Vec::new();
    while let Some(href) = prev {
        let r = b.get(&href).await;
        assert_eq!(r.status, 200, "{href}: {}", r.show());
        let (ids, newer) = dashboard_page(&r.body, "prev");
        back.push(ids);
        prev = newer;
        assert!(back.len() <= 3, "the Newer links go round");
    }
    assert_eq!(back, vec![created[25..50].to_vec(), created[..25].to_vec()]);

    // A page number past the old last page, as the links carry it.
    let deep = format!("/dashboard/payments?after={}&page=401", created[24]);
    let r = b.get(&deep).await;
    assert_eq!(r.status, 200, "{}", r.show());
    assert_eq!(dashboard_page(&r.body, "next").0, created[25..50].to_vec());
    assert!(r.body.contains("Page 401"), "{}", r.show());
    // By number alone a page is near the top; a cursor of another kind
    // is refused.
    for bad in [
        "page=41",
        "after=ref_01jdq7v3kz8y2x6w5t4s3r2q1p",
        "before=nope",
    ] {
        let r = b.get(&format!("/dashboard/payments?{bad}")).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.show());
    }
    app.stop().await;
}

on_both_backends!(
    an_offset_past_the_old_cap_is_a_page,
    starting_after_reaches_every_record_at_the_cost_of_a_page,
    the_dashboard_reaches_every_payment_by_its_links,
);
