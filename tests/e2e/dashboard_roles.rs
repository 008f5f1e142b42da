//! Issue 37 item 8: the dashboard's role table (`docs/dashboard.md`,
//! `shared::domain::dashboard::roles`) as a browser drives it. A viewer's
//! payment page names no webhook endpoint and no delivery answer; only an
//! owner replaces live provider credentials or issues a live secret key,
//! a developer may in sandbox. Both backends. The small browser here is
//! also the invitations' (`dashboard_invites.rs`).

use std::time::Duration;

pub(crate) use dhukuti_tests::dash::{Dash, Reply, field};
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app};
use shared::domain::account::{self, KeyKind};
use shared::domain::credentials;
use shared::domain::dashboard::{self, Role};
use shared::domain::{Mode, Provider};
use shared::time::{Clock, SystemClock};

pub(crate) const PASSWORD: &str = "a long dashboard password";

pub(crate) async fn user(
    app: &TestApp,
    merchant: &shared::ids::MerchantId,
    email: &str,
    role: Role,
) {
    dashboard::create_user(
        app.state(),
        SystemClock.now(),
        merchant,
        email,
        role,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("user: {e}"));
}

pub(crate) async fn signed_in(app: &TestApp, email: &str) -> Dash {
    let mut b = Dash::new(&app.base);
    let r = b.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    b
}

async fn hook_receiver() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let router = axum::Router::new().fallback(|| async { "ok" });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://127.0.0.1:{port}/hook")
}

async fn a_viewer_sees_no_endpoint_or_delivery_answer(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = dhukuti_tests::shop::Shop::on(app).await;
    let app = &shop.app;
    user(
        app,
        &shop.tenant.merchant.id,
        "owner@asan.example",
        Role::Owner,
    )
    .await;
    user(
        app,
        &shop.tenant.merchant.id,
        "viewer@asan.example",
        Role::Viewer,
    )
    .await;
    let url = hook_receiver().await;
    let mut owner = signed_in(app, "owner@asan.example").await;
    let page = owner.get("/dashboard/webhooks").await;
    let (token, nonce) = (field(&page.body, "csrf"), field(&page.body, "nonce"));
    let add = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("url", url.as_str()),
        ("event:payment.succeeded", "on"),
    ];
    let r = owner.post("/dashboard/webhooks", &add).await;
    assert_eq!(r.status, 200, "{}", r.show());
    let tenant = shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox);
    let we = shared::domain::webhooks::list(app.state(), &tenant)
        .await
        .unwrap_or_default()
        .first()
        .map(|e| e.id.to_string())
        .unwrap_or_else(|| panic!("no endpoint"));
    let paid = shop.paid(dhukuti_tests::shop::Via::Khalti, 100_000).await;
    let path = format!("/dashboard/payments/{paid}");
    // The owner sees where the event went and what it answered.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let page = owner.get(&path).await;
        if page.body.contains("answered 200") {
            assert!(page.body.contains(&we), "{}", page.show());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", page.show());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The viewer sees the event, but not the endpoint nor its answer.
    let mut viewer = signed_in(app, "viewer@asan.example").await;
    let page = viewer.get(&path).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("payment.succeeded"), "{}", page.show());
    assert!(
        !page.body.contains(&we),
        "endpoint id shown: {}",
        page.show()
    );
    assert!(
        !page.body.contains("answered"),
        "answer shown: {}",
        page.show()
    );
    assert!(
        !page.body.contains("/dashboard/webhooks"),
        "{}",
        page.show()
    );
    assert_eq!(
        viewer
            .get(&format!("/dashboard/webhooks/{we}"))
            .await
            .status,
        403
    );
    shop.stop().await;
}

/// Sets Khalti credentials from the credentials page; the answer.
async fn set_khalti(b: &mut Dash, secret: &str) -> Reply {
    let page = b.get("/dashboard/credentials").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let token = field(&page.body, "csrf");
    b.post(
        "/dashboard/credentials",
        &[
            ("csrf", &token),
            ("provider", "khalti"),
            ("secret_key", secret),
        ],
    )
    .await
}

/// Issues a key of `kind` from the keys page; the answer.
async fn issue(b: &mut Dash, kind: &str) -> Reply {
    let page = b.get("/dashboard/keys").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let (token, nonce) = (field(&page.body, "csrf"), field(&page.body, "nonce"));
    b.post(
        "/dashboard/keys",
        &[("csrf", &token), ("nonce", &nonce), ("kind", kind)],
    )
    .await
}

/// The project's stored Khalti credentials in `mode`, and its keys of
/// `kind` in `mode`.
async fn stored(app: &TestApp, t: &dhukuti_tests::Tenant, mode: Mode) -> (usize, usize) {
    let creds = credentials::list_configured_providers(&*app.store, &t.project.id)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.mode == mode && c.provider == Provider::Khalti)
        .count();
    let keys = account::list_api_keys(app.state(), &t.project.id)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|k| k.mode == mode && k.kind == KeyKind::Secret)
        .count();
    (creds, keys)
}

async fn only_an_owner_replaces_live_secrets(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    user(&app, &t.merchant.id, "owner@himal.np", Role::Owner).await;
    user(&app, &t.merchant.id, "dev@himal.np", Role::Developer).await;
    let project = t.project.id.to_string();
    const LIVE: &str = "live_secret_key_0123456789abcdef";

    // In sandbox a developer sets credentials and issues a secret key.
    let mut dev = signed_in(&app, "dev@himal.np").await;
    assert_eq!(
        set_khalti(&mut dev, "test_secret_key_0123456789abcdef")
            .await
            .status,
        303
    );
    let r = issue(&mut dev, "secret").await;
    assert_eq!(r.status, 200, "{}", r.show());
    assert!(field(&r.body, "secret").starts_with("sk_test_"));
    assert_eq!(stored(&app, &t, Mode::Sandbox).await, (1, 1));

    // In live they are refused, and nothing changes.
    dev.switch(&project, "live").await;
    let r = set_khalti(&mut dev, LIVE).await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert!(r.body.contains("Only an owner"), "{}", r.show());
    let r = issue(&mut dev, "secret").await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert!(!r.body.contains("sk_live_"), "{}", r.show());
    assert_eq!(stored(&app, &t, Mode::Live).await, (0, 0));
    // A live publishable key is no secret: a developer may issue it.
    let r = issue(&mut dev, "publishable").await;
    assert_eq!(r.status, 200, "{}", r.show());

    // The owner may.
    let mut owner = signed_in(&app, "owner@himal.np").await;
    owner.switch(&project, "live").await;
    assert_eq!(set_khalti(&mut owner, LIVE).await.status, 303);
    let r = issue(&mut owner, "secret").await;
    assert_eq!(r.status, 200, "{}", r.show());
    let live_key = field(&r.body, "secret");
    assert!(live_key.starts_with("sk_live_"), "{live_key}");
    assert_eq!(stored(&app, &t, Mode::Live).await, (1, 1));

    // Nor may the developer rotate the owner's live secret key.
    let id = account::list_api_keys(app.state(), &t.project.id)
        .await
        .unwrap_or_default()
        .into_iter()
        .find(|k| k.mode == Mode::Live && k.kind == KeyKind::Secret)
        .map(|k| k.id.to_string())
        .unwrap_or_else(|| panic!("no live key"));
    let page = dev.get("/dashboard/keys").await;
    let (token, nonce) = (field(&page.body, "csrf"), field(&page.body, "nonce"));
    let r = dev
        .post(
            &format!("/dashboard/keys/{id}/rotate"),
            &[("csrf", &token), ("nonce", &nonce), ("grace", "0")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert_eq!(app.get("/v1/payments", Some(&live_key)).await.status, 200);
    app.stop().await;
}

on_both_backends!(
    a_viewer_sees_no_endpoint_or_delivery_answer,
    only_an_owner_replaces_live_secrets,
);
