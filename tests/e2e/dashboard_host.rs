//! The dashboard on a host of its own (issue 37, item 10): with
//! `DHUKUTI_DASHBOARD_URL` (the template's `DashboardBaseUrl`) set, the
//! dashboard answers only on that host and the hosted pages (checkout,
//! links) never there; both are 404 on the other's host. A person signs
//! in on the dashboard's host and gets host-only cookies. Unset (every
//! other e2e module), one host serves both.
//!
//! Two hosts on one loopback listener: requests name the host in their
//! `Host` header (`dash.test` for the dashboard), as a second custom
//! domain of the same HTTP API does on AWS.

use dhukuti_tests::browser::{form_encode, tags};
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app, spawn_app_tweaked};
use serde_json::json;
use shared::domain::Mode;
use shared::domain::account::Scope;
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock};

const DASHBOARD: &str = "dash.test";
const PASSWORD: &str = "a long dashboard password";

/// An answer: status, `Set-Cookie` lines, body.
struct Seen {
    status: u16,
    cookies: Vec<String>,
    body: String,
}

/// `method path` on the app's listener naming `host` (the listener's own
/// address when `None`), with `cookie` and a form body.
async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    host: Option<&str>,
    cookie: Option<&str>,
    form: Option<&[(String, String)]>,
) -> Seen {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    let mut req = client
        .request(method, app.url(path))
        .header("accept", "text/html");
    if let Some(h) = host {
        req = req.header("host", h);
    }
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    if let Some(f) = form {
        req = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_encode(f));
    }
    let res = match req.send().await {
        Ok(r) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let cookies = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    Seen {
        status: res.status().as_u16(),
        cookies,
        body: res.text().await.unwrap_or_default(),
    }
}

/// A session's and a link's hosted paths for a fresh merchant, and the
/// merchant's tenant (to add a dashboard user).
async fn hosted_paths(app: &TestApp) -> (String, String, dhukuti_tests::Tenant) {
    let t = app.tenant("Patan Metalworks", "brass@patan.example").await;
    let key = app.key(&t, Mode::Sandbox, &Scope::ALL).await;
    let s = app
        .post(
            "/v1/checkout",
            Some(&key),
            None,
            &json!({"amount": 50_000, "returnUrl": "https://shop.example/thanks"}),
        )
        .await;
    assert_eq!(s.status, 201, "{}", s.body);
    let l = app
        .post(
            "/v1/payment-links",
            Some(&key),
            None,
            &json!({"title": "Bell", "amount": 50_000}),
        )
        .await;
    assert_eq!(l.status, 201, "{}", l.body);
    let id = |v: &serde_json::Value| v["id"].as_str().unwrap_or_default().to_owned();
    (
        format!("/c/{}", id(&s.body)),
        format!("/l/{}", id(&l.body)),
        t,
    )
}

async fn the_dashboard_has_its_own_host_when_one_is_set(which: Which) {
    use reqwest::Method;
    let Some(app) = spawn_app_tweaked(
        which,
        |s| s,
        |settings| settings.dashboard_url = Some(format!("http://{DASHBOARD}")),
    )
    .await
    else {
        return;
    };
    let (checkout, link, t) = hosted_paths(&app).await;
    let now = SystemClock.now();
    let email = "owner@patan.example";
    let made = dashboard::create_user(
        app.state(),
        now,
        &t.merchant.id,
        email,
        Role::Owner,
        PASSWORD,
    )
    .await;
    assert!(made.is_ok(), "{made:?}");

    // The hosted pages on the public host, never on the dashboard's.
    for path in [&checkout, &link] {
        let public = send(&app, Method::GET, path, None, None, None).await;
        assert_eq!(public.status, 200, "{path}: {}", public.body);
        let dash = send(&app, Method::GET, path, Some(DASHBOARD), None, None).await;
        assert_eq!(dash.status, 404, "{path} on the dashboard's host");
        assert!(!dash.body.contains("Patan"), "{}", dash.body);
    }
    // The dashboard on its host only: its pages, its sign-in, its PDFs.
    for path in [
        "/dashboard",
        "/dashboard/sign-in",
        "/dashboard/invoices/inv_x/pdf",
    ] {
        let public = send(&app, Method::GET, path, None, None, None).await;
        assert_eq!(public.status, 404, "{path} on the public host");
    }
    let posted = send(
        &app,
        Method::POST,
        "/dashboard/sign-in",
        None,
        None,
        Some(&[]),
    )
    .await;
    assert_eq!(posted.status, 404, "a sign-in posted to the public host");

    // A person signs in on the dashboard's host; its cookies stay there.
    let form = send(
        &app,
        Method::GET,
        "/dashboard/sign-in",
        Some(DASHBOARD),
        None,
        None,
    )
    .await;
    assert_eq!(form.status, 200, "{}", form.body);
    let token = tags(&form.body, "input")
        .into_iter()
        .find(|t| t.get("name") == Some("csrf"))
        .and_then(|t| t.get("value").map(str::to_owned))
        .unwrap_or_default();
    let jar: Vec<String> = form
        .cookies
        .iter()
        .filter_map(|c| c.split(';').next().map(str::to_owned))
        .collect();
    let fields: Vec<(String, String)> =
        [("email", email), ("password", PASSWORD), ("csrf", &token)]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    let jar = jar.join("; ");
    let signed = send(
        &app,
        Method::POST,
        "/dashboard/sign-in",
        Some(DASHBOARD),
        Some(&jar),
        Some(&fields),
    )
    .await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    assert!(!signed.cookies.is_empty());
    for c in form.cookies.iter().chain(&signed.cookies) {
        assert!(!c.to_ascii_lowercase().contains("domain="), "{c}");
    }
    let session: Vec<String> = signed
        .cookies
        .iter()
        .filter_map(|c| c.split(';').next().map(str::to_owned))
        .collect();
    let session = session.join("; ");
    let home = send(
        &app,
        Method::GET,
        "/dashboard",
        Some(DASHBOARD),
        Some(&session),
        None,
    )
    .await;
    assert_eq!(home.status, 200, "{}", home.body);
    let elsewhere = send(&app, Method::GET, "/dashboard", None, Some(&session), None).await;
    assert_eq!(
        elsewhere.status, 404,
        "the session's cookie on the public host"
    );
    app.stop().await;
}

/// Unset, one host serves both (the default every other module runs).
async fn one_host_serves_both_by_default(which: Which) {
    use reqwest::Method;
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let (checkout, link, _) = hosted_paths(&app).await;
    for path in [checkout.as_str(), link.as_str(), "/dashboard/sign-in"] {
        let seen = send(&app, Method::GET, path, None, None, None).await;
        assert_eq!(seen.status, 200, "{path}: {}", seen.body);
        let other = send(&app, Method::GET, path, Some(DASHBOARD), None, None).await;
        assert_eq!(other.status, 200, "{path} on another host name");
    }
    app.stop().await;
}

on_both_backends!(
    the_dashboard_has_its_own_host_when_one_is_set,
    one_host_serves_both_by_default
);
