//! Issue 41, part 3: the dashboard's Exports page, both backends. The
//! payments list links to it; an owner starts an export of a range of
//! Nepal days (audited), sees it reach `ready` and downloads the file
//! through the page's link, which answers a fresh link to the file (a
//! 303 from the documents function: the pages' function has no S3 client
//! to sign with on AWS); a viewer sees the page and downloads, but has no
//! start form and is refused a start (the role table's `Export`). A range
//! backwards is a 400 page; a stranger, another merchant or a bad id gets
//! no file.

use std::time::{Duration, Instant};

use dhukuti_tests::dash::Dash;
use dhukuti_tests::{Which, on_both_backends, spawn_app};
use shared::domain::billing::calendar::nepal_day;
use shared::domain::dashboard::Role;
use shared::domain::{Mode, Provider};
use shared::time::{Clock, SystemClock};

use crate::dashboard_roles::{signed_in, user};

/// The first download link of a page (its `&amp;` unescaped).
fn download_link(body: &str) -> Option<String> {
    let end = body.find("\" download")?;
    let start = body[..end].rfind("href=\"")? + "href=\"".len();
    Some(body[start..end].replace("&amp;", "&"))
}

async fn the_exports_page_starts_shows_and_downloads(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = dhukuti_tests::shop::Shop::on(app).await;
    let app = &shop.app;
    let merchant = &shop.tenant.merchant.id;
    user(app, merchant, "owner@exports.example", Role::Owner).await;
    user(app, merchant, "viewer@exports.example", Role::Viewer).await;
    let paid = app
        .payment(&shop.tenant, Mode::Sandbox, 150_050, Provider::Khalti)
        .await;
    let today = nepal_day(SystemClock.now());
    let (from, to) = (
        (today - chrono::Duration::days(1)).to_string(),
        (today + chrono::Duration::days(1)).to_string(),
    );

    let mut owner = signed_in(app, "owner@exports.example").await;
    let list = owner.get("/dashboard/payments").await;
    assert!(
        list.body.contains("/dashboard/exports?type=payments"),
        "{}",
        list.show()
    );
    let page = owner.get("/dashboard/exports?type=refunds").await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(
        page.body.contains("<option value=\"refunds\" selected>"),
        "{}",
        page.show()
    );
    let csrf = dhukuti_tests::dash::field(&page.body, "csrf");
    // Backwards: refused, nothing started.
    let bad = [
        ("csrf", csrf.as_str()),
        ("type", "payments"),
        ("from", to.as_str()),
        ("to", from.as_str()),
    ];
    let r = owner.post("/dashboard/exports", &bad).await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(r.body.contains("to must be after from"), "{}", r.show());
    assert!(r.body.contains("No exports yet."), "{}", r.show());

    let start = [
        ("csrf", csrf.as_str()),
        ("type", "payments"),
        ("from", from.as_str()),
        ("to", to.as_str()),
    ];
    let r = owner.post("/dashboard/exports", &start).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        let page = owner.get("/dashboard/exports").await;
        assert_eq!(page.status, 200, "{}", page.show());
        if let Some(url) = download_link(&page.body) {
            break url;
        }
        assert!(!page.body.contains("failed"), "{}", page.show());
        assert!(Instant::now() < deadline, "{}", page.show());
        tokio::task::yield_now().await;
    };
    // The page links to the documents function, which answers a fresh
    // link to the file (the pages' function cannot sign one on AWS).
    assert!(url.starts_with("/dashboard/exports/rpt_"), "{url}");
    assert!(url.ends_with("/download"), "{url}");
    let signed = owner.get(&url).await;
    assert_eq!(signed.status, 303, "{}", signed.show());
    assert_eq!(
        signed
            .headers
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        Some("no-store")
    );
    let file = reqwest::get(&signed.location)
        .await
        .unwrap_or_else(|e| panic!("GET {}: {e}", signed.location));
    assert_eq!(file.status().as_u16(), 200);
    let csv = file.text().await.unwrap_or_default();
    assert!(csv.starts_with("id,status,provider"), "{csv}");
    assert!(csv.contains(paid.id.as_str()), "{csv}");
    assert!(csv.contains(",150050,1500.50,"), "{csv}");
    let audit = owner.get("/dashboard/audit").await;
    assert!(audit.body.contains("report.create"), "{}", audit.show());

    // The viewer: the file, no start.
    let mut viewer = signed_in(app, "viewer@exports.example").await;
    let page = viewer.get("/dashboard/exports").await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert_eq!(download_link(&page.body).as_deref(), Some(url.as_str()));
    let r = viewer.get(&url).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert!(!page.body.contains("Start export"), "{}", page.show());
    let csrf = dhukuti_tests::dash::field(&page.body, "csrf");
    let start = [
        ("csrf", csrf.as_str()),
        ("type", "payments"),
        ("from", from.as_str()),
        ("to", to.as_str()),
    ];
    let r = viewer.post("/dashboard/exports", &start).await;
    assert_eq!(r.status, 403, "{}", r.show());

    // A browser not signed in is sent to sign in; an unknown or malformed
    // id, or another merchant's export, is not found.
    let mut stranger = Dash::new(&app.base);
    let r = stranger.get(&url).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert!(r.location.starts_with("/dashboard/sign-in"), "{}", r.show());
    for path in [
        "/dashboard/exports/rpt_0000000000000000000000000/download",
        "/dashboard/exports/nonsense/download",
    ] {
        let r = owner.get(path).await;
        assert_eq!(r.status, 404, "{path}: {}", r.show());
    }
    let other = app.tenant("Other Shop", "other@exports.example").await;
    user(app, &other.merchant.id, "owner@other.example", Role::Owner).await;
    let mut elsewhere = signed_in(app, "owner@other.example").await;
    let r = elsewhere.get(&url).await;
    assert_eq!(r.status, 404, "{}", r.show());
    shop.app.stop().await;
}

on_both_backends!(the_exports_page_starts_shows_and_downloads);
