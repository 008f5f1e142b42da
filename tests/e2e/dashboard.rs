//! The merchant dashboard over HTTP, as a browser without JavaScript and
//! as an attacker drive it: sign-in (wrong password, stale or missing
//! CSRF token, throttling), the session cookie's attributes, the pages'
//! headers, roles, tenancy, the sandbox/live switch, sign-out (here and
//! everywhere) and the audit log. Both backends.

use std::time::Duration;

use dhukuti_tests::dash::{Dash, Reply, field};
use dhukuti_tests::{Tenant, TestApp, Which, on_both_backends, spawn_app};
use shared::domain::dashboard::{self, Role};
use shared::domain::{Mode, Provider};
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";

/// The first form's CSRF token on a page.
fn csrf(body: &str) -> String {
    field(body, "csrf")
}

async fn user(app: &TestApp, tenant: &Tenant, email: &str, role: Role) {
    let now = SystemClock.now();
    dashboard::create_user(app.state(), now, &tenant.merchant.id, email, role, PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("user: {e}"));
}

async fn signed_in(app: &TestApp, email: &str) -> Dash {
    let mut b = Dash::new(&app.base);
    let r = b.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    b
}

async fn sign_in_checks_password_and_form_token(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "owner@himal.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    let mut b = Dash::new(&app.base);

    // Signed out, a page sends the browser to sign in and back after.
    let r = b.get("/dashboard/payments?page=1").await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(
        r.location,
        "/dashboard/sign-in?next=%2Fdashboard%2Fpayments%3Fpage%3D1"
    );
    let form = b.get(&r.location).await;
    assert_eq!(form.status, 200, "{}", form.show());
    assert!(
        form.body.contains("<label for=\"email\">"),
        "{}",
        form.show()
    );
    assert!(form.body.contains("<label for=\"password\">"));
    let token = csrf(&form.body);

    // A wrong password: the same words as an unknown email, no session.
    for email in ["owner@himal.np", "nobody@himal.np"] {
        let r = b
            .post(
                "/dashboard/sign-in",
                &[
                    ("email", email),
                    ("password", "not the password"),
                    ("csrf", &token),
                ],
            )
            .await;
        assert_eq!(r.status, 401, "{}", r.show());
        assert!(r.body.contains("Wrong email or password."), "{}", r.show());
        assert!(!b.jar.contains_key("dhukuti_session"));
    }
    // Without the form's token, or with another one: refused, nothing done.
    for sent in ["", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"] {
        let r = b
            .post(
                "/dashboard/sign-in",
                &[
                    ("email", "owner@himal.np"),
                    ("password", PASSWORD),
                    ("csrf", sent),
                ],
            )
            .await;
        assert_eq!(r.status, 403, "{}", r.show());
        assert!(r.body.contains("This form has expired"), "{}", r.show());
        assert!(!b.jar.contains_key("dhukuti_session"));
    }
    // A fresh browser posting another's token (no cookie of its own).
    let mut stranger = Dash::new(&app.base);
    let r = stranger
        .post(
            "/dashboard/sign-in",
            &[
                ("email", "owner@himal.np"),
                ("password", PASSWORD),
                ("csrf", &token),
            ],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());

    // The right password, with the form's token (the refusal above gave a
    // new one), an open redirect attempt in `next` ignored.
    let token = csrf(&b.get("/dashboard/sign-in").await.body);
    let r = b
        .post(
            "/dashboard/sign-in",
            &[
                ("email", " Owner@Himal.np "),
                ("password", PASSWORD),
                ("csrf", &token),
                ("next", "//evil.example/x"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(r.location, "/dashboard");
    let session_cookie = b
        .set_cookies
        .iter()
        .find(|c| c.starts_with("dhukuti_session=ds_"))
        .cloned()
        .unwrap_or_else(|| panic!("no session cookie: {:?}", b.set_cookies));
    for attr in [
        "HttpOnly",
        "SameSite=Lax",
        "Path=/dashboard",
        "Max-Age=43200",
    ] {
        assert!(session_cookie.contains(attr), "{session_cookie}");
    }
    // The local gateway is plain http: `Secure` is relaxed only there.
    assert!(!session_cookie.contains("Secure"), "{session_cookie}");

    let overview = b.get("/dashboard").await;
    assert_eq!(overview.status, 200, "{}", overview.show());
    // Standards mode: the doctype comes first.
    assert!(
        overview
            .body
            .starts_with("<!DOCTYPE html><html lang=\"en\">"),
        "{}",
        overview.show()
    );
    assert!(overview.body.contains("<h1>Overview</h1>"));
    assert!(overview.body.contains("role=\"img\""), "the chart");
    assert_eq!(overview.body.matches("<rect").count(), 30, "a bar a day");
    assert!(overview.body.contains("owner@himal.np (owner)"));
    assert!(!overview.body.contains("<script"), "no script at all");
    let h = |name: &str| {
        overview
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    assert!(h("content-security-policy").contains("frame-ancestors 'none'"));
    assert!(h("content-security-policy").contains("default-src 'none'"));
    assert!(!h("content-security-policy").contains("unsafe-inline"));
    assert_eq!(h("x-frame-options"), "DENY");
    assert_eq!(h("cache-control"), "no-store");
    // An unknown dashboard page is a page, not the API's envelope.
    let missing = b.get("/dashboard/no-such-page").await;
    assert_eq!(missing.status, 404, "{}", missing.show());
    assert!(
        missing.body.contains("There is no such page"),
        "{}",
        missing.show()
    );
    let css = b.get("/dashboard/assets/dashboard.css").await;
    assert_eq!(css.status, 200);
    assert!(css.body.contains("body{"));
    app.stop().await;
}

async fn roles_and_tenancy_are_enforced(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app.tenant("Himal Traders", "a@himal.np").await;
    let other = app.tenant("Other Shop", "b@other.np").await;
    user(&app, &a, "owner@himal.np", Role::Owner).await;
    user(&app, &a, "viewer@himal.np", Role::Viewer).await;
    user(&app, &other, "owner@other.np", Role::Owner).await;
    let ours = app
        .payment(&a, Mode::Sandbox, 150_000, Provider::Khalti)
        .await;
    let live = app.payment(&a, Mode::Live, 99_900, Provider::Esewa).await;
    let theirs = app
        .payment(&other, Mode::Sandbox, 70_000, Provider::Esewa)
        .await;

    let mut owner = signed_in(&app, "owner@himal.np").await;
    let list = owner.get("/dashboard/payments").await;
    assert_eq!(list.status, 200, "{}", list.show());
    assert!(list.body.contains(ours.id.as_str()), "{}", list.show());
    assert!(
        !list.body.contains(live.id.as_str()),
        "sandbox shows no live payment"
    );
    assert!(!list.body.contains(theirs.id.as_str()));
    let detail = owner.get(&format!("/dashboard/payments/{}", ours.id)).await;
    assert_eq!(detail.status, 200, "{}", detail.show());
    assert!(detail.body.contains("NPR 1,500.00"), "{}", detail.show());
    // Another merchant's payment is no payment here.
    let r = owner
        .get(&format!("/dashboard/payments/{}", theirs.id))
        .await;
    assert_eq!(r.status, 404, "{}", r.show());
    assert!(!r.body.contains("NPR 700.00"));
    // Filters: by provider and status; a status that is none is refused.
    let esewa = app
        .payment(&a, Mode::Sandbox, 20_000, Provider::Esewa)
        .await;
    let by_esewa = owner.get("/dashboard/payments?provider=esewa").await;
    assert!(
        by_esewa.body.contains(esewa.id.as_str()) && !by_esewa.body.contains(ours.id.as_str()),
        "{}",
        by_esewa.show()
    );
    assert!(by_esewa.body.contains("1 payments."), "{}", by_esewa.show());
    let failed = owner
        .get("/dashboard/payments?status=failed&provider=")
        .await;
    assert!(failed.body.contains("0 payments."), "{}", failed.show());
    let both = owner
        .get("/dashboard/payments?status=success&provider=khalti")
        .await;
    assert!(both.body.contains(ours.id.as_str()) && !both.body.contains(esewa.id.as_str()));
    for bad in ["status=paid", "provider=paypal"] {
        let r = owner.get(&format!("/dashboard/payments?{bad}")).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.show());
    }
    for bad in ["0", "-1", "x", "401", "99999999999999999999"] {
        let r = owner.get(&format!("/dashboard/payments?page={bad}")).await;
        assert_eq!(r.status, 400, "page={bad}: {}", r.show());
        assert!(r.body.contains("A page is a number"), "{}", r.show());
    }

    // The switch to live, with the form's token.
    let token = csrf(&list.body);
    let r = owner
        .post(
            "/dashboard/view",
            &[
                ("csrf", &token),
                ("project", &a.project.id),
                ("mode", "live"),
                ("back", "/dashboard/payments"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(r.location, "/dashboard/payments");
    let list = owner.get("/dashboard/payments").await;
    assert!(
        list.body.contains(live.id.as_str()) && !list.body.contains(ours.id.as_str()),
        "{}",
        list.show()
    );
    assert!(!list.body.contains("Sandbox: test payments"));
    // Another merchant's project, a mode that is none, a missing token:
    // refused, the view unchanged.
    for fields in [
        vec![
            ("csrf", token.as_str()),
            ("project", other.project.id.as_str()),
            ("mode", "sandbox"),
        ],
        vec![
            ("csrf", token.as_str()),
            ("project", a.project.id.as_str()),
            ("mode", "production"),
        ],
        vec![("project", a.project.id.as_str()), ("mode", "sandbox")],
    ] {
        let r = owner.post("/dashboard/view", &fields).await;
        assert!(matches!(r.status, 403 | 400), "{fields:?}: {}", r.show());
        let list = owner.get("/dashboard/payments").await;
        assert!(
            list.body.contains(live.id.as_str()),
            "{fields:?} changed the view"
        );
    }

    // A viewer reads payments but not the audit log.
    let mut viewer = signed_in(&app, "viewer@himal.np").await;
    assert_eq!(viewer.get("/dashboard/payments").await.status, 200);
    let r = viewer.get("/dashboard/audit").await;
    assert_eq!(r.status, 403, "{}", r.show());
    let nav = viewer.get("/dashboard").await;
    assert!(
        !nav.body.contains("href=\"/dashboard/audit\""),
        "no link to it"
    );

    // The owner's audit log names both sign-ins, from where; the other
    // merchant's owner sees none of them.
    let audit = owner.get("/dashboard/audit").await;
    assert_eq!(audit.status, 200, "{}", audit.show());
    assert!(audit.body.contains("owner@himal.np") && audit.body.contains("viewer@himal.np"));
    assert!(audit.body.contains("sign_in") && audit.body.contains("127.0.0.1"));
    let mut stranger = signed_in(&app, "owner@other.np").await;
    let theirs_log = stranger.get("/dashboard/audit").await;
    assert!(
        !theirs_log.body.contains("himal.np"),
        "{}",
        theirs_log.show()
    );
    app.stop().await;
}

async fn sign_out_here_and_everywhere(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    let mut phone = signed_in(&app, "owner@himal.np").await;
    let mut laptop = signed_in(&app, "owner@himal.np").await;
    let page = phone.get("/dashboard").await;
    let token = csrf(&page.body);

    // A sign-out without the token (a cross-site form) does nothing.
    let r = phone
        .post("/dashboard/sign-out", &[("csrf", "forged")])
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert_eq!(phone.get("/dashboard").await.status, 200);
    // Another session's token is not this one's.
    let laptop_token = csrf(&laptop.get("/dashboard").await.body);
    let r = phone
        .post("/dashboard/sign-out", &[("csrf", &laptop_token)])
        .await;
    assert_eq!(r.status, 403, "{}", r.show());

    // Sign out everywhere from the phone: the laptop is signed out too.
    let r = phone
        .post("/dashboard/sign-out-everywhere", &[("csrf", &token)])
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(r.location, "/dashboard/sign-in");
    for b in [&mut phone, &mut laptop] {
        let r = b.get("/dashboard").await;
        assert_eq!(r.status, 303, "{}", r.show());
        // A form posted by a signed-out browser changes nothing.
        let r = b
            .post("/dashboard/sign-out-everywhere", &[("csrf", &token)])
            .await;
        assert_eq!(r.status, 401, "{}", r.show());
    }

    // Signing out here leaves the other session.
    let mut a = signed_in(&app, "owner@himal.np").await;
    let mut b = signed_in(&app, "owner@himal.np").await;
    let token = csrf(&a.get("/dashboard").await.body);
    let r = a.post("/dashboard/sign-out", &[("csrf", &token)]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(a.get("/dashboard").await.status, 303);
    assert_eq!(b.get("/dashboard").await.status, 200);
    let audit = b.get("/dashboard/audit").await;
    assert!(
        audit.body.contains("sign_out_everywhere"),
        "{}",
        audit.show()
    );

    // A password reset ends every session; a disabled user cannot sign in.
    dashboard::reset_password(&*app.store, "owner@himal.np", "another long password")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.get("/dashboard").await.status, 303);
    dashboard::set_disabled(&*app.store, "owner@himal.np", true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut c = Dash::new(&app.base);
    let r = c.sign_in("owner@himal.np", "another long password").await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert!(r.body.contains("disabled"), "{}", r.show());
    app.stop().await;
}

async fn guessing_a_password_is_throttled(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    let mut b = Dash::new(&app.base);
    let token = b.form_token().await;
    for n in 0..dashboard::ATTEMPTS_PER_ACCOUNT_AND_ADDRESS {
        let r = b
            .post(
                "/dashboard/sign-in",
                &[
                    ("email", "owner@himal.np"),
                    ("password", &format!("guess number {n}")),
                    ("csrf", &token),
                ],
            )
            .await;
        assert_eq!(r.status, 401, "{n}: {}", r.show());
    }
    let r = b
        .post(
            "/dashboard/sign-in",
            &[
                ("email", "owner@himal.np"),
                ("password", PASSWORD),
                ("csrf", &token),
            ],
        )
        .await;
    assert_eq!(r.status, 429, "{}", r.show());
    let retry: i64 = r
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((1..=dashboard::ATTEMPT_WINDOW).contains(&retry), "{retry}");
    assert!(r.body.contains("Too many sign-in attempts"), "{}", r.show());
    assert!(!b.jar.contains_key("dhukuti_session"));
    app.stop().await;
}

async fn refund_count(app: &TestApp, t: &Tenant, payment: &str) -> u64 {
    let state = shared::AppState::new(
        app.store.clone(),
        std::sync::Arc::new(shared::time::SystemClock),
        shared::Config {
            public_base_url: app.base.clone(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    shared::domain::refunds::list(
        &state,
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
        Some(&payment.into()),
        shared::domain::Window::first(100),
    )
    .await
    .map(|(_, n)| n)
    .unwrap_or_else(|e| panic!("{e}"))
}

async fn refunds_are_issued_once_with_notes(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    let other = app.tenant("Other Shop", "b@other.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    user(&app, &t, "viewer@himal.np", Role::Viewer).await;
    let esewa = app
        .payment(&t, Mode::Sandbox, 150_000, Provider::Esewa)
        .await;
    let fonepay = app
        .payment(&t, Mode::Sandbox, 80_000, Provider::Fonepay)
        .await;
    let theirs = app
        .payment(&other, Mode::Sandbox, 70_000, Provider::Esewa)
        .await;
    let mut owner = signed_in(&app, "owner@himal.np").await;
    let path = format!("/dashboard/payments/{}", esewa.id);
    let page = owner.get(&path).await;
    assert!(
        page.body.contains("<h2 id=\"refund-title\">Refund</h2>"),
        "{}",
        page.show()
    );
    assert_eq!(field(&page.body, "amount"), "1500.00");
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    let action = format!("{path}/refund");
    let refund = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("amount", "500"),
        ("reason", "customer_request"),
        ("notes", "Torn packaging\r\nsecond line"),
    ];
    let r = owner.post(&action, &refund).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let id = r
        .location
        .split("?refund=")
        .nth(1)
        .unwrap_or_else(|| panic!("{}", r.show()))
        .to_owned();
    // The double click: the same form again finds the same refund.
    let again = owner.post(&action, &refund).await;
    assert_eq!(again.status, 303, "{}", again.show());
    assert_eq!(again.location, r.location);
    assert_eq!(refund_count(&app, &t, &esewa.id).await, 1);
    let shown = owner.get(&r.location).await;
    assert!(
        shown.body.contains(&format!("Refund {id} recorded.")),
        "{}",
        shown.show()
    );
    assert!(shown.body.contains("requires_action") && shown.body.contains("eSewa merchant portal"));
    assert!(
        shown.body.contains("Torn packaging\nsecond line"),
        "{}",
        shown.show()
    );
    assert_eq!(field(&shown.body, "amount"), "1000.00", "what is left");
    let list = owner.get("/dashboard/refunds").await;
    assert!(
        list.body.contains(&id) && list.body.contains("1 refunds."),
        "{}",
        list.show()
    );

    // More than is left, a bad amount, an unknown reason, a missing token
    // or one-time token: a clear page, nothing made.
    let fresh = owner.get(&path).await;
    let (token, nonce) = (csrf(&fresh.body), field(&fresh.body, "nonce"));
    for (amount, reason, sent_nonce, status, says) in [
        ("1,000.01", "other", nonce.as_str(), 422, "more than"),
        ("abc", "other", nonce.as_str(), 422, "Amount:"),
        ("5.005", "other", nonce.as_str(), 422, "Amount:"),
        ("10", "because", nonce.as_str(), 422, "Reason:"),
        ("10", "other", "", 403, "This form has expired"),
    ] {
        let r = owner
            .post(
                &action,
                &[
                    ("csrf", &token),
                    ("nonce", sent_nonce),
                    ("amount", amount),
                    ("reason", reason),
                ],
            )
            .await;
        assert_eq!(r.status, status, "{amount} {reason}: {}", r.show());
        assert!(r.body.contains(says), "{amount}: {}", r.show());
        assert_eq!(refund_count(&app, &t, &esewa.id).await, 1, "{amount}");
    }
    let r = owner
        .post(
            &action,
            &[("nonce", &nonce), ("amount", "10"), ("reason", "other")],
        )
        .await;
    assert_eq!(r.status, 403, "no CSRF token: {}", r.show());
    // Another merchant's payment is none of ours.
    let r = owner
        .post(
            &format!("/dashboard/payments/{}/refund", theirs.id),
            &[
                ("csrf", &token),
                ("nonce", &nonce),
                ("amount", "10"),
                ("reason", "other"),
            ],
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.show());
    assert_eq!(refund_count(&app, &other, &theirs.id).await, 0);

    // Fonepay: the full amount only, recorded for a refund by hand.
    let fp = format!("/dashboard/payments/{}", fonepay.id);
    let page = owner.get(&fp).await;
    assert!(
        page.body.contains("Fonepay has no refund API"),
        "{}",
        page.show()
    );
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    let r = owner
        .post(
            &format!("{fp}/refund"),
            &[
                ("csrf", &token),
                ("nonce", &nonce),
                ("amount", "100"),
                ("reason", "other"),
            ],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(
        r.body.contains("full amount only: NPR 800.00"),
        "{}",
        r.show()
    );
    let r = owner
        .post(
            &format!("{fp}/refund"),
            &[
                ("csrf", &token),
                ("nonce", &nonce),
                ("amount", "800.00"),
                ("reason", "other"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let shown = owner.get(&r.location).await;
    assert!(
        shown.body.contains("Fonepay merchant portal"),
        "{}",
        shown.show()
    );
    // The API still refuses a Fonepay refund (the contract).
    let key = app
        .key(&t, Mode::Sandbox, &shared::domain::account::Scope::ALL)
        .await;
    let api = app
        .post(
            "/v1/refunds",
            Some(&key),
            None,
            &serde_json::json!({"paymentId": fonepay.id, "amount": 80_000, "reason": "other"}),
        )
        .await;
    assert_eq!(api.status, 422, "{}", api.body);

    // A viewer sees no form, and posting one changes nothing.
    let mut viewer = signed_in(&app, "viewer@himal.np").await;
    let page = viewer.get(&path).await;
    assert!(!page.body.contains("refund-title"), "{}", page.show());
    let token = csrf(&page.body);
    let r = viewer
        .post(
            &action,
            &[
                ("csrf", &token),
                ("nonce", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
                ("amount", "10"),
                ("reason", "other"),
            ],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    assert_eq!(refund_count(&app, &t, &esewa.id).await, 1);

    // Both refunds are in the owner's audit log, with the notes.
    let audit = owner.get("/dashboard/audit").await;
    assert!(audit.body.contains("refund.create"), "{}", audit.show());
    assert!(audit.body.contains(&id) && audit.body.contains("Torn packaging"));
    app.stop().await;
}

async fn api_keys_are_issued_rotated_and_revoked(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    let other = app.tenant("Other Shop", "b@other.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    user(&app, &t, "dev@himal.np", Role::Developer).await;
    user(&app, &t, "viewer@himal.np", Role::Viewer).await;
    let theirs = app
        .key(&other, Mode::Sandbox, &shared::domain::account::Scope::ALL)
        .await;
    let theirs_id = shared::domain::account::list_api_keys(app.state(), &other.project.id)
        .await
        .unwrap_or_default()
        .first()
        .map(|k| k.id.clone())
        .unwrap_or_default();
    assert!(theirs.starts_with("sk_test_") && theirs_id.starts_with("ak_"));

    let mut viewer = signed_in(&app, "viewer@himal.np").await;
    assert_eq!(viewer.get("/dashboard/keys").await.status, 403);
    assert!(
        !viewer
            .get("/dashboard")
            .await
            .body
            .contains("href=\"/dashboard/keys\"")
    );

    let mut dev = signed_in(&app, "dev@himal.np").await;
    let page = dev.get("/dashboard/keys").await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert_eq!(dev.get("/dashboard/keys?page=0").await.status, 400);
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    // A restricted key without scopes, a publishable one with a cap, an
    // expiry that is no number of days: refused, nothing issued.
    for (kind, extra, says) in [
        ("restricted", ("spend_cap", ""), "Scopes:"),
        ("publishable", ("spend_cap", "100"), "Spend cap:"),
        ("secret", ("expires_days", "0"), "Expires:"),
        ("admin", ("spend_cap", ""), "Kind:"),
    ] {
        let r = dev
            .post(
                "/dashboard/keys",
                &[("csrf", &token), ("nonce", &nonce), ("kind", kind), extra],
            )
            .await;
        assert_eq!(r.status, 422, "{kind}: {}", r.show());
        assert!(r.body.contains(says), "{kind}: {}", r.show());
    }
    let issue = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("kind", "restricted"),
        ("description", "reporting <script>"),
        ("scope:payments:read", "on"),
        ("spend_cap", "5,000"),
    ];
    let r = dev.post("/dashboard/keys", &issue).await;
    assert_eq!(r.status, 200, "{}", r.show());
    let secret = field(&r.body, "secret");
    assert!(secret.starts_with("sk_test_"), "{secret}");
    assert!(r.body.contains("shown only this once"));
    assert!(!r.body.contains("<script>"), "escaped");
    // The key works for its scope only.
    assert_eq!(app.get("/v1/payments", Some(&secret)).await.status, 200);
    app.get("/v1/account", Some(&secret)).await.assert_error(
        403,
        "permission_error",
        "missing_scope",
    );
    // The double click issues nothing more, and shows no secret.
    let again = dev.post("/dashboard/keys", &issue).await;
    assert_eq!(again.status, 200, "{}", again.show());
    assert!(again.body.contains("already sent"), "{}", again.show());
    assert!(!again.body.contains(&secret));
    let list = dev.get("/dashboard/keys").await;
    assert!(!list.body.contains(&secret), "the list shows no secret");
    let keys = shared::domain::account::list_api_keys(app.state(), &t.project.id)
        .await
        .unwrap_or_default();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].spend_cap_paisa, Some(500_000));
    let id = keys[0].id.clone();

    // Rotating with no grace: the new key works, the old one no longer.
    let (token, nonce) = (csrf(&list.body), field(&list.body, "nonce"));
    let r = dev
        .post(
            &format!("/dashboard/keys/{id}/rotate"),
            &[("csrf", &token), ("nonce", &nonce), ("grace", "0")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.show());
    let rotated = field(&r.body, "secret");
    assert_ne!(rotated, secret);
    assert_eq!(app.get("/v1/payments", Some(&rotated)).await.status, 200);
    assert_eq!(app.get("/v1/payments", Some(&secret)).await.status, 401);
    // Another merchant's key is no key here.
    let page = dev.get("/dashboard/keys").await;
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    let r = dev
        .post(
            &format!("/dashboard/keys/{theirs_id}/revoke"),
            &[("csrf", &token), ("nonce", &nonce), ("confirm", "yes")],
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.show());
    assert_eq!(app.get("/v1/payments", Some(&theirs)).await.status, 200);
    // Revoking asks to confirm, then the key stops working.
    let new_id = shared::domain::account::list_api_keys(app.state(), &t.project.id)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|k| k.id)
        .find(|k| *k != id)
        .unwrap_or_default();
    let nonce2 = field(&dev.get("/dashboard/keys").await.body, "nonce");
    let revoke = format!("/dashboard/keys/{new_id}/revoke");
    let r = dev
        .post(&revoke, &[("csrf", &token), ("nonce", &nonce2)])
        .await;
    assert_eq!(r.status, 422, "{}", r.show());
    assert_eq!(app.get("/v1/payments", Some(&rotated)).await.status, 200);
    let r = dev
        .post(
            &revoke,
            &[("csrf", &token), ("nonce", &nonce2), ("confirm", "yes")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(app.get("/v1/payments", Some(&rotated)).await.status, 401);
    // The owner reads who did all this.
    let mut owner = signed_in(&app, "owner@himal.np").await;
    let audit = owner.get("/dashboard/audit").await;
    for action in ["key.issue", "key.rotate", "key.revoke"] {
        assert!(audit.body.contains(action), "{action}: {}", audit.show());
    }
    assert!(audit.body.contains("dev@himal.np"));
    app.stop().await;
}

async fn links_invoices_sms_and_webhooks_are_listed(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    let other = app.tenant("Other Shop", "b@other.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    user(&app, &t, "viewer@himal.np", Role::Viewer).await;
    let key = app
        .key(&t, Mode::Sandbox, &shared::domain::account::Scope::ALL)
        .await;
    let theirs = app
        .key(&other, Mode::Sandbox, &shared::domain::account::Scope::ALL)
        .await;
    let post = |k: &str, path: &str, body: serde_json::Value| {
        let (k, path) = (k.to_owned(), path.to_owned());
        let app = &app;
        async move { app.post(&path, Some(&k), None, &body).await }
    };
    let link = post(
        &key,
        "/v1/payment-links",
        serde_json::json!({"title": "Blue <mugs>", "amount": 50_000}),
    )
    .await;
    assert_eq!(link.status, 201, "{}", link.body);
    let invoice = post(
        &key,
        "/v1/invoices",
        serde_json::json!({
            "lines": [{"description": "Two mugs", "quantity": "2", "unitAmount": 25_000}],
            "dueAt": "2030-12-31T18:15:00+05:45",
        }),
    )
    .await;
    assert_eq!(invoice.status, 201, "{}", invoice.body);
    let inv_id = invoice.body["id"].as_str().unwrap_or_default().to_owned();
    // A receiver on loopback, allowed for sandbox endpoints in tests.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    tokio::spawn(async move {
        let _ = axum::serve(listener, axum::Router::new().fallback(|| async { "ok" })).await;
    });
    let hook = post(
        &key,
        "/v1/webhooks",
        serde_json::json!({"url": format!("http://127.0.0.1:{port}/hook")}),
    )
    .await;
    assert_eq!(hook.status, 201, "{}", hook.body);
    let we = hook.body["id"].as_str().unwrap_or_default().to_owned();
    let their_link = post(
        &theirs,
        "/v1/payment-links",
        serde_json::json!({"title": "Theirs", "amount": 1_000}),
    )
    .await;
    let their_link = their_link.body["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    let mut owner = signed_in(&app, "owner@himal.np").await;
    let links = owner.get("/dashboard/links").await;
    assert_eq!(links.status, 200, "{}", links.show());
    assert!(
        links.body.contains("Blue &lt;mugs&gt;") && links.body.contains("NPR 500.00"),
        "{}",
        links.show()
    );
    assert!(!links.body.contains(&their_link));
    let list = owner.get("/dashboard/invoices").await;
    assert!(list.body.contains(&inv_id), "{}", list.show());
    let detail = owner.get(&format!("/dashboard/invoices/{inv_id}")).await;
    assert_eq!(detail.status, 200, "{}", detail.show());
    assert!(
        detail.body.contains("Two mugs") && detail.body.contains("NPR 500.00"),
        "{}",
        detail.show()
    );
    // A draft has no PDF; finalized, it downloads.
    assert!(
        detail.body.contains("A draft has no PDF"),
        "{}",
        detail.show()
    );
    let draft_pdf = owner
        .get(&format!("/dashboard/invoices/{inv_id}/pdf"))
        .await;
    assert_eq!(draft_pdf.status, 409, "{}", draft_pdf.show());
    let version = invoice.body["version"].as_i64().unwrap_or(1);
    let fin = post(
        &key,
        &format!("/v1/invoices/{inv_id}/finalize"),
        serde_json::json!({"version": version}),
    )
    .await;
    assert_eq!(fin.status, 200, "{}", fin.body);
    let pdf = owner
        .get(&format!("/dashboard/invoices/{inv_id}/pdf"))
        .await;
    assert_eq!(pdf.status, 200, "{}", pdf.show());
    assert_eq!(
        pdf.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/pdf")
    );
    assert!(pdf.body.starts_with("%PDF-"), "a PDF");
    assert_eq!(
        owner
            .get("/dashboard/invoices/oinv_01m8bs0cc3j03q9xx14dhg73b5")
            .await
            .status,
        404
    );
    let sms = owner.get("/dashboard/sms").await;
    assert_eq!(sms.status, 200, "{}", sms.show());
    assert!(sms.body.contains("0 reminders."), "{}", sms.show());

    // Webhooks: the endpoint, its log, and a test event sent once.
    let hooks = owner.get("/dashboard/webhooks").await;
    assert!(hooks.body.contains(&we), "{}", hooks.show());
    let page = owner.get(&format!("/dashboard/webhooks/{we}")).await;
    assert_eq!(page.status, 200, "{}", page.show());
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    let send = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("type", "payment.succeeded"),
    ];
    let r = owner
        .post(&format!("/dashboard/webhooks/{we}/test"), &send)
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let again = owner
        .post(&format!("/dashboard/webhooks/{we}/test"), &send)
        .await;
    assert_eq!(
        again.location, r.location,
        "a double submit sends nothing more"
    );
    let events = shared::domain::outbox::recent(
        &*app.store,
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
        50,
    )
    .await
    .unwrap_or_default();
    let tests = events
        .iter()
        .filter(|e| e.endpoint_id.as_deref() == Some(we.as_str()))
        .count();
    assert_eq!(tests, 1);
    let r = owner
        .post(
            &format!("/dashboard/webhooks/{we}/test"),
            &[
                ("csrf", &token),
                ("nonce", &nonce),
                ("type", "payment.nothing"),
            ],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    // A viewer sees links and invoices but no webhooks.
    let mut viewer = signed_in(&app, "viewer@himal.np").await;
    assert_eq!(viewer.get("/dashboard/links").await.status, 200);
    assert_eq!(viewer.get("/dashboard/webhooks").await.status, 403);
    assert_eq!(
        viewer
            .get(&format!("/dashboard/webhooks/{we}"))
            .await
            .status,
        403
    );
    let audit = owner.get("/dashboard/audit").await;
    assert!(audit.body.contains("webhook.test"), "{}", audit.show());
    app.stop().await;
}

async fn provider_credentials_are_set_and_never_shown(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    user(&app, &t, "dev@himal.np", Role::Developer).await;
    user(&app, &t, "viewer@himal.np", Role::Viewer).await;
    let mut viewer = signed_in(&app, "viewer@himal.np").await;
    assert_eq!(viewer.get("/dashboard/credentials").await.status, 403);
    let mut dev = signed_in(&app, "dev@himal.np").await;
    let page = dev.get("/dashboard/credentials").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let token = csrf(&page.body);
    const SECRET: &str = "live_secret_key_0123456789abcdef";
    // An empty field, an unknown provider: refused, nothing stored.
    let r = dev
        .post(
            "/dashboard/credentials",
            &[
                ("csrf", &token),
                ("provider", "khalti"),
                ("secret_key", " "),
            ],
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.show());
    assert!(r.body.contains("secret_key is empty"), "{}", r.show());
    let r = dev
        .post(
            "/dashboard/credentials",
            &[
                ("csrf", &token),
                ("provider", "paypal"),
                ("secret_key", SECRET),
            ],
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.show());
    let r = dev
        .post(
            "/dashboard/credentials",
            &[("provider", "khalti"), ("secret_key", SECRET)],
        )
        .await;
    assert_eq!(r.status, 403, "no CSRF token: {}", r.show());
    let none = shared::domain::credentials::list_configured_providers(&*app.store, &t.project.id)
        .await
        .unwrap_or_default();
    assert!(none.is_empty());
    let r = dev
        .post(
            "/dashboard/credentials",
            &[
                ("csrf", &token),
                ("provider", "khalti"),
                ("secret_key", SECRET),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let shown = dev.get(&r.location).await;
    assert!(
        shown.body.contains("khalti credentials saved"),
        "{}",
        shown.show()
    );
    assert!(
        shown.body.contains("ok"),
        "the check opens them: {}",
        shown.show()
    );
    assert!(!shown.body.contains(SECRET), "never shown back");
    // Stored sealed, for this project and mode.
    let stored = shared::domain::credentials::list_configured_providers(&*app.store, &t.project.id)
        .await
        .unwrap_or_default();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].provider, stored[0].mode),
        (Provider::Khalti, Mode::Sandbox)
    );
    let mut owner_store_scan = String::new();
    for item in app
        .store
        .query(&shared::store::Query::partition(
            shared::keys::project_partition(&t.project.id),
        ))
        .await
        .map(|p| p.items)
        .unwrap_or_default()
    {
        owner_store_scan.push_str(&serde_json::Value::Object(item).to_string());
    }
    assert!(!owner_store_scan.contains(SECRET), "sealed in the store");

    // Asking Khalti: the key set is not one it knows, then one it knows.
    let r = ask(&mut dev, &token, "khalti").await;
    assert_eq!(r.status, 200, "{}", r.show());
    assert!(
        r.body
            .contains("role=\"alert\">Khalti refused the credentials")
            && r.body.contains("Invalid token."),
        "{}",
        r.show()
    );
    assert!(!r.body.contains(SECRET));
    let known = dhukuti::simulators::KHALTI_TEST_SECRET_KEY;
    let r = dev
        .post(
            "/dashboard/credentials",
            &[
                ("csrf", &token),
                ("provider", "khalti"),
                ("secret_key", known),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = ask(&mut dev, &token, "khalti").await;
    assert!(
        r.body
            .contains("role=\"status\">Khalti accepted the credentials"),
        "{}",
        r.show()
    );
    assert!(!r.body.contains(known), "never shown back");
    // eSewa: nothing to ask; none stored: said so; a viewer may not ask.
    let r = dev
        .post(
            "/dashboard/credentials",
            &[
                ("csrf", &token),
                ("provider", "esewa"),
                ("product_code", "EPAYTEST"),
                ("secret_key", "8gBm/:&EnhH.1/q"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = ask(&mut dev, &token, "esewa").await;
    assert!(
        r.body.contains("eSewa has no call that proves"),
        "{}",
        r.show()
    );
    let r = ask(&mut dev, &token, "fonepay").await;
    assert_eq!(r.status, 422, "{}", r.show());
    assert!(r.body.contains("No Fonepay credentials"), "{}", r.show());
    let r = dev
        .post("/dashboard/credentials/check", &[("provider", "khalti")])
        .await;
    assert_eq!(r.status, 403, "no CSRF token: {}", r.show());
    let viewer_token = csrf(&viewer.get("/dashboard").await.body);
    let r = viewer
        .post(
            "/dashboard/credentials/check",
            &[("csrf", viewer_token.as_str()), ("provider", "khalti")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());

    user(&app, &t, "owner@himal.np", Role::Owner).await;
    let mut owner = signed_in(&app, "owner@himal.np").await;
    let audit = owner.get("/dashboard/audit").await;
    assert!(audit.body.contains("credentials.set"), "{}", audit.show());
    assert!(audit.body.contains("credentials.check"), "{}", audit.show());
    assert!(
        audit.body.contains("refused") && audit.body.contains("accepted"),
        "{}",
        audit.show()
    );
    assert!(!audit.body.contains(SECRET));
    app.stop().await;
}

/// Presses "Ask <provider>" on the credentials page.
async fn ask(dev: &mut Dash, token: &str, provider: &str) -> Reply {
    dev.post(
        "/dashboard/credentials/check",
        &[("csrf", token), ("provider", provider)],
    )
    .await
}

async fn an_owner_manages_people(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    let other = app.tenant("Other Shop", "b@other.np").await;
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    user(&app, &t, "dev@himal.np", Role::Developer).await;
    user(&app, &other, "them@other.np", Role::Viewer).await;
    let theirs = dashboard::find_user_by_email(&*app.store, "them@other.np")
        .await
        .ok()
        .flatten()
        .map(|u| u.id)
        .unwrap_or_default();
    let me = dashboard::find_user_by_email(&*app.store, "owner@himal.np")
        .await
        .ok()
        .flatten()
        .map(|u| u.id)
        .unwrap_or_default();
    let mut owner = signed_in(&app, "owner@himal.np").await;
    let page = owner.get("/dashboard/people").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let token = csrf(&page.body);
    let at = page.body.find("action=\"/dashboard/people\"").unwrap_or(0);
    let add_nonce = field(&page.body[at..], "nonce");
    let add = [
        ("csrf", token.as_str()),
        ("nonce", add_nonce.as_str()),
        ("email", "Sita@Himal.np"),
        ("role", "viewer"),
    ];
    let r = owner.post("/dashboard/people", &add).await;
    assert_eq!(r.status, 200, "{}", r.show());
    // Adding is an invitation (issue 37 item 9): a link shown once, and
    // Sita joins by opening it and choosing her password.
    let link = field(&r.body, "link");
    let join = link
        .split_once("/dashboard/join/")
        .map(|(_, t)| format!("/dashboard/join/{t}"))
        .unwrap_or_else(|| panic!("no invitation link: {link}"));
    let first = "sita's own long password".to_owned();
    // The double click adds nobody more.
    let again = owner.post("/dashboard/people", &add).await;
    assert_eq!(again.status, 200, "{}", again.show());
    assert!(again.body.contains("already sent"), "{}", again.show());
    let mut sita_b = Dash::new(&app.base);
    assert_eq!(sita_b.get(&join).await.status, 200);
    let r = sita_b.post(&join, &[("password", &first)]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    // The same email from a fresh form: answered as any invitation, in
    // words that say nothing of who else uses it.
    let fresh_page = owner.get("/dashboard/people").await.body;
    let at = fresh_page.find("action=\"/dashboard/people\"").unwrap_or(0);
    let fresh = field(&fresh_page[at..], "nonce");
    let r = owner
        .post(
            "/dashboard/people",
            &[
                ("csrf", &token),
                ("nonce", &fresh),
                ("email", "sita@himal.np"),
                ("role", "viewer"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.show());
    assert!(r.body.contains("shown only this once"), "{}", r.show());
    let people = dashboard::list_users(app.state(), &t.merchant.id)
        .await
        .unwrap_or_default();
    assert_eq!(people.len(), 3);
    let sita = people
        .iter()
        .find(|u| u.email == "sita@himal.np")
        .map(|u| u.id.clone())
        .unwrap_or_default();

    // Sita signs in with the first password, as a viewer; promoted, the
    // same session may now see keys.
    let r = sita_b.sign_in("sita@himal.np", &first).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(sita_b.get("/dashboard/keys").await.status, 403);
    let r = owner
        .post(
            &format!("/dashboard/people/{sita}"),
            &[("csrf", &token), ("do", "role"), ("role", "developer")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(sita_b.get("/dashboard/keys").await.status, 200);
    // A new password from the owner ends Sita's session; the new one signs in.
    let r = owner
        .post(
            &format!("/dashboard/people/{sita}"),
            &[("csrf", &token), ("do", "password")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.show());
    let second = field(&r.body, "password");
    assert_ne!(second, first);
    assert_eq!(sita_b.get("/dashboard").await.status, 303);
    let r = sita_b.sign_in("sita@himal.np", &second).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = owner
        .post(
            &format!("/dashboard/people/{theirs}"),
            &[("csrf", &token), ("do", "password")],
        )
        .await;
    assert_eq!(r.status, 404, "another merchant's person: {}", r.show());
    // A developer cannot change people, nor read them.
    let mut dev = signed_in(&app, "dev@himal.np").await;
    assert_eq!(dev.get("/dashboard/people").await.status, 403);
    let dev_token = csrf(&dev.get("/dashboard").await.body);
    let r = dev
        .post(
            &format!("/dashboard/people/{sita}"),
            &[("csrf", &dev_token), ("do", "disable")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    // An owner cannot change themselves, nor another merchant's people.
    let r = owner
        .post(
            &format!("/dashboard/people/{me}"),
            &[("csrf", &token), ("do", "disable")],
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.show());
    let r = owner
        .post(
            &format!("/dashboard/people/{theirs}"),
            &[("csrf", &token), ("do", "disable")],
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.show());
    let still = dashboard::find_user_by_email(&*app.store, "them@other.np")
        .await
        .ok()
        .flatten();
    assert_eq!(still.map(|u| u.disabled), Some(false));
    // Disabling ends Sita's session at once.
    let r = owner
        .post(
            &format!("/dashboard/people/{sita}"),
            &[("csrf", &token), ("do", "disable")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(sita_b.get("/dashboard").await.status, 303);
    let audit = owner.get("/dashboard/audit").await;
    assert!(
        audit.body.contains("person.invite")
            && audit.body.contains("sita@himal.np is now developer"),
        "{}",
        audit.show()
    );
    app.stop().await;
}

async fn payment_links_are_made_once_and_cancelled(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    user(&app, &t, "dev@himal.np", Role::Developer).await;
    user(&app, &t, "viewer@himal.np", Role::Viewer).await;
    let mut dev = signed_in(&app, "dev@himal.np").await;
    let page = dev.get("/dashboard/links").await;
    assert!(page.body.contains("New payment link"), "{}", page.show());
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    for (title, amount, says) in [
        ("", "250", "title"),
        ("Mugs", "2.505", "Amount:"),
        ("Mugs", "0", "Amount:"),
    ] {
        let r = dev
            .post(
                "/dashboard/links",
                &[
                    ("csrf", &token),
                    ("nonce", &nonce),
                    ("title", title),
                    ("amount", amount),
                ],
            )
            .await;
        assert_eq!(r.status, 422, "{title} {amount}: {}", r.show());
        assert!(r.body.contains(says), "{}", r.show());
    }
    let make = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("title", "Blue mugs"),
        ("amount", "250"),
        ("max_uses", "5"),
    ];
    let r = dev.post("/dashboard/links", &make).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let again = dev.post("/dashboard/links", &make).await;
    assert_eq!(again.location, r.location, "a double submit makes one link");
    let (links, total) = shared::domain::links::list(
        app.state(),
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
        None,
        shared::domain::Window::first(10),
    )
    .await
    .unwrap_or_default();
    assert_eq!(total, 1);
    let link = &links[0];
    assert_eq!(
        (link.amount.map(|a| a.get()), link.max_uses),
        (Some(25_000), Some(5))
    );
    let public = app
        .client
        .get(app.url(&format!("/l/{}", link.id)))
        .send()
        .await;
    assert_eq!(public.map(|r| r.status().as_u16()).unwrap_or(0), 200);
    // Its page: the stats and the edit form; an edit through the API's rule.
    let lpath = format!("/dashboard/links/{}", link.id);
    let lpage = dev.get(&lpath).await;
    assert_eq!(lpage.status, 200, "{}", lpage.show());
    assert!(lpage.body.contains("Views") && lpage.body.contains("Blue mugs"));
    let r = dev
        .post(
            &lpath,
            &[
                ("csrf", &token),
                ("title", "Green mugs"),
                ("description", "Handmade"),
                ("max_uses", ""),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let edited = shared::domain::links::get(app.state(), &link.id)
        .await
        .ok()
        .flatten();
    assert_eq!(
        edited
            .as_ref()
            .map(|l| (l.title.as_str(), l.description.as_deref(), l.max_uses)),
        Some(("Green mugs", Some("Handmade"), None))
    );
    for (title, uses) in [("", "3"), ("Mugs", "-1"), ("Mugs", "x")] {
        let r = dev
            .post(
                &lpath,
                &[("csrf", &token), ("title", title), ("max_uses", uses)],
            )
            .await;
        assert_eq!(r.status, 422, "{title} {uses}: {}", r.show());
        assert!(r.body.contains("Not saved"), "{}", r.show());
    }
    // A viewer has no form, and cannot post one.
    let mut viewer = signed_in(&app, "viewer@himal.np").await;
    let r = viewer.get(&lpath).await;
    assert!(
        r.status == 200 && !r.body.contains("edit-title"),
        "{}",
        r.show()
    );
    let vpage = viewer.get("/dashboard/links").await;
    assert!(!vpage.body.contains("New payment link"));
    let vtoken = csrf(&vpage.body);
    let r = viewer
        .post(
            &format!("/dashboard/links/{}/cancel", link.id),
            &[("csrf", &vtoken)],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.show());
    // Cancelled (twice: the same outcome), the link takes no payment.
    for _ in 0..2 {
        let r = dev
            .post(
                &format!("/dashboard/links/{}/cancel", link.id),
                &[("csrf", &token)],
            )
            .await;
        assert_eq!(r.status, 303, "{}", r.show());
    }
    let after = shared::domain::links::get(app.state(), &link.id)
        .await
        .ok()
        .flatten();
    assert_eq!(after.map(|l| l.active), Some(false));
    let r = dev
        .post(
            "/dashboard/links/lnk_01m8bs0cc3j03q9xx14dhg73b5/cancel",
            &[("csrf", &token)],
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.show());
    // Each action's entry was written with it (issue 37 item 7): one per
    // link made, saved and cancelled; the double submit, the refused
    // edits and the second cancel changed nothing and left no entry.
    let (entries, _) =
        shared::domain::dashboard::list_audit(app.state(), &t.merchant.id, None, 100)
            .await
            .unwrap_or_default();
    let mut actions: Vec<&str> = entries
        .iter()
        .map(|e| e.action.as_str())
        .filter(|a| a.starts_with("link."))
        .collect();
    actions.sort_unstable();
    assert_eq!(actions, ["link.cancel", "link.create", "link.edit"]);
    assert!(
        entries
            .iter()
            .filter(|e| e.action.starts_with("link."))
            .all(|e| e.target == link.id.as_str())
    );
    app.stop().await;
}

/// A webhook receiver on loopback that answers 200 and keeps each body.
async fn hook_receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = seen.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let router = axum::Router::new().fallback(move |body: String| {
        let keep = keep.clone();
        async move {
            keep.lock().unwrap_or_else(|p| p.into_inner()).push(body);
            "ok"
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://127.0.0.1:{port}/hook"), seen)
}

async fn hits_reach(seen: &std::sync::Arc<std::sync::Mutex<Vec<String>>>, n: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let got = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if got.len() >= n || std::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn webhook_endpoints_are_managed_and_deliveries_resent(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    user(&app, &t, "dev@himal.np", Role::Developer).await;
    let (url, seen) = hook_receiver().await;
    let mut dev = signed_in(&app, "dev@himal.np").await;
    let page = dev.get("/dashboard/webhooks").await;
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    let r = dev
        .post(
            "/dashboard/webhooks",
            &[
                ("csrf", &token),
                ("nonce", &nonce),
                ("url", "ftp://example.com/x"),
            ],
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.show());
    assert!(r.body.contains("Not added"), "{}", r.show());
    let add = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("url", url.as_str()),
        ("event:payment.succeeded", "on"),
    ];
    let r = dev.post("/dashboard/webhooks", &add).await;
    assert_eq!(r.status, 200, "{}", r.show());
    assert!(
        field(&r.body, "secret").starts_with("whsec_"),
        "{}",
        r.show()
    );
    let again = dev.post("/dashboard/webhooks", &add).await;
    assert!(again.body.contains("already sent"), "{}", again.show());
    let endpoints = shared::domain::webhooks::list(
        app.state(),
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
    )
    .await
    .unwrap_or_default();
    assert_eq!(endpoints.len(), 1, "a double submit adds one endpoint");
    let we = endpoints[0].id.clone();
    let path = format!("/dashboard/webhooks/{we}");
    assert_eq!(dev.get(&format!("{path}?page=x")).await.status, 400);

    // A test event arrives; once delivered, it can be sent again, once.
    let page = dev.get(&path).await;
    let nonce = field(&page.body, "nonce");
    let r = dev
        .post(
            &format!("{path}/test"),
            &[
                ("csrf", &token),
                ("nonce", &nonce),
                ("type", "payment.succeeded"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let first = hits_reach(&seen, 1).await;
    assert_eq!(first.len(), 1, "the test event arrives");
    let event: serde_json::Value = serde_json::from_str(&first[0]).unwrap_or_default();
    let event_id = event["id"].as_str().unwrap_or_default().to_owned();
    assert!(event_id.starts_with("evt_"), "{event}");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let log = loop {
        let log = dev.get(&path).await;
        if log.body.contains(">Resend<") || std::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(log.body.contains(">Resend<"), "{}", log.show());
    let at = log.body.find("/resend\"").unwrap_or(0);
    let resend_nonce = field(&log.body[at..], "nonce");
    let resend = [
        ("csrf", token.as_str()),
        ("event", event_id.as_str()),
        ("nonce", resend_nonce.as_str()),
    ];
    let r = dev.post(&format!("{path}/resend"), &resend).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r2 = dev.post(&format!("{path}/resend"), &resend).await;
    assert_eq!(r2.status, 303, "{}", r2.show());
    let both = hits_reach(&seen, 2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let all = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(all.len(), 2, "sent again once: {both:?}");
    let again: serde_json::Value = serde_json::from_str(&all[1]).unwrap_or_default();
    assert_eq!(again["id"], event["id"], "the same event, the same id");
    // An event of another endpoint, or none, resends nothing.
    let r = dev
        .post(
            &format!("{path}/resend"),
            &[
                ("csrf", &token),
                ("event", "evt_01m8bs0cc3j03q9xx14dhg73b5"),
                ("nonce", "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"),
            ],
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.show());

    // Disable, enable, delete (after confirming).
    let r = dev
        .post(&path, &[("csrf", &token), ("do", "disable")])
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert!(dev.get(&path).await.body.contains(">disabled<"));
    let r = dev.post(&path, &[("csrf", &token), ("do", "enable")]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = dev.post(&path, &[("csrf", &token), ("do", "delete")]).await;
    assert_eq!(r.status, 422, "{}", r.show());
    let r = dev
        .post(
            &path,
            &[("csrf", &token), ("do", "delete"), ("confirm", "yes")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let left = shared::domain::webhooks::list(
        app.state(),
        &shared::domain::Tenant::new(t.project.id.clone(), Mode::Sandbox),
    )
    .await
    .unwrap_or_default();
    assert!(left.is_empty());
    user(&app, &t, "owner@himal.np", Role::Owner).await;
    let mut owner = signed_in(&app, "owner@himal.np").await;
    let audit = owner.get("/dashboard/audit").await;
    for action in [
        "webhook.add",
        "webhook.test",
        "webhook.resend",
        "webhook.disable",
        "webhook.delete",
    ] {
        assert!(audit.body.contains(action), "{action}: {}", audit.show());
    }
    app.stop().await;
}

/// A payment's page shows its events in order, each with where it was
/// delivered, from the payment's own timeline: a real Khalti payment,
/// then a refund from the dashboard, both heard by a real receiver.
async fn a_payments_events_are_shown_with_their_deliveries(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = dhukuti_tests::shop::Shop::on(app).await;
    let app = &shop.app;
    user(app, &shop.tenant, "owner@asan.example", Role::Owner).await;
    let (url, seen) = hook_receiver().await;
    let mut owner = signed_in(app, "owner@asan.example").await;
    let page = owner.get("/dashboard/webhooks").await;
    let (token, nonce) = (csrf(&page.body), field(&page.body, "nonce"));
    let add = [
        ("csrf", token.as_str()),
        ("nonce", nonce.as_str()),
        ("url", url.as_str()),
        ("event:payment.succeeded", "on"),
        ("event:refund.succeeded", "on"),
    ];
    let r = owner.post("/dashboard/webhooks", &add).await;
    assert_eq!(r.status, 200, "{}", r.show());
    let we = shared::domain::webhooks::list(
        app.state(),
        &shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox),
    )
    .await
    .unwrap_or_default()
    .first()
    .map(|e| e.id.clone())
    .unwrap_or_else(|| panic!("no endpoint"));

    let paid = shop.paid(dhukuti_tests::shop::Via::Khalti, 100_000).await;
    assert_eq!(
        hits_reach(&seen, 1).await.len(),
        1,
        "payment.succeeded heard"
    );
    let path = format!("/dashboard/payments/{paid}");
    let page = owner.get(&path).await;
    let nonce = field(&page.body, "nonce");
    let r = owner
        .post(
            &format!("{path}/refund"),
            &[
                ("csrf", token.as_str()),
                ("nonce", nonce.as_str()),
                ("amount", "300"),
                ("reason", "other"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(
        hits_reach(&seen, 2).await.len(),
        2,
        "refund.succeeded heard"
    );

    // Both deliveries are recorded as they end; the page shows them so.
    let delivered = format!(
        "<a href=\"/dashboard/webhooks/{we}\">{we}</a> <span class=\"status success\">success</span> 1 attempt, answered 200"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let page = loop {
        let page = owner.get(&path).await;
        let done = page.body.matches(&delivered).count() == 2;
        if done || std::time::Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(page.status, 200, "{}", page.show());
    let events = page
        .body
        .split("<h2 id=\"events-title\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no events section: {}", page.show()));
    assert_eq!(events.matches(&delivered).count(), 2, "{events}");
    let succeeded = events.find("payment.succeeded");
    let refunded = events.find("refund.succeeded");
    assert!(
        succeeded.is_some() && refunded.is_some() && succeeded < refunded,
        "oldest first: {events}"
    );
    let heard: Vec<serde_json::Value> = seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|b| serde_json::from_str(b).unwrap_or_default())
        .collect();
    for event in &heard {
        let id = event["id"].as_str().unwrap_or("?");
        assert!(events.contains(id), "event {id} shown: {events}");
    }

    // A payment nothing was said about has no events.
    let quiet = app
        .payment(&shop.tenant, Mode::Sandbox, 5_000, Provider::Khalti)
        .await;
    let page = owner
        .get(&format!("/dashboard/payments/{}", quiet.id))
        .await;
    assert!(page.body.contains("No events yet."), "{}", page.show());
    shop.stop().await;
}

on_both_backends!(
    a_payments_events_are_shown_with_their_deliveries,
    webhook_endpoints_are_managed_and_deliveries_resent,
    payment_links_are_made_once_and_cancelled,
    an_owner_manages_people,
    provider_credentials_are_set_and_never_shown,
    links_invoices_sms_and_webhooks_are_listed,
    api_keys_are_issued_rotated_and_revoked,
    refunds_are_issued_once_with_notes,
    sign_in_checks_password_and_form_token,
    roles_and_tenancy_are_enforced,
    sign_out_here_and_everywhere,
    guessing_a_password_is_throttled,
);
