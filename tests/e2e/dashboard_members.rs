//! Issue 37 item 9: one sign-in, several merchants. Merchant B's owner
//! invites merchant A's owner (the form answers as for a new address);
//! she accepts by signing in with her existing password on the join page;
//! she switches between A and B in the header, each merchant's pages
//! (payments, people, keys) show only its own data with her role there
//! (owner of A, viewer then developer of B); a forged switch to a merchant she does not
//! belong to is refused with the session unchanged while an honest owner
//! keeps working; removing her from B leaves A intact. Both backends.

use dhukuti_tests::{TestApp, Which, dash::Dash, on_both_backends, spawn_app};
use shared::domain::account::{self, KeyKind, NewKey};
use shared::domain::dashboard::Role;
use shared::domain::{Mode, Provider};
use shared::ids::ApiKeyId;
use shared::time::{Clock, SystemClock};

use crate::dashboard_roles::{PASSWORD, field, signed_in, user};

/// A sandbox publishable key of `tenant`'s project: its id.
async fn key_of(app: &TestApp, tenant: &dhukuti_tests::Tenant, what: &str) -> ApiKeyId {
    let new = NewKey {
        mode: Mode::Sandbox,
        kind: KeyKind::Publishable,
        scopes: Vec::new(),
        description: what.to_owned(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    match account::issue_api_key(app.state(), SystemClock.now(), &tenant.project, new).await {
        Ok((_, key)) => key.id,
        Err(e) => panic!("key: {e}"),
    }
}

/// Invites `email` as `role` from the people page: the answer's body and
/// the link's path.
async fn invite(owner: &mut Dash, email: &str, role: &str) -> (String, String) {
    let page = owner.get("/dashboard/people").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let at = page.body.find("action=\"/dashboard/people\"").unwrap_or(0);
    let (csrf, nonce) = (field(&page.body, "csrf"), field(&page.body[at..], "nonce"));
    let r = owner
        .post(
            "/dashboard/people",
            &[
                ("csrf", &csrf),
                ("nonce", &nonce),
                ("email", email),
                ("role", role),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.show());
    let link = field(&r.body, "link");
    let path = link
        .split_once("/dashboard/join/")
        .map(|(_, t)| format!("/dashboard/join/{t}"))
        .unwrap_or_else(|| panic!("no link: {}", r.show()));
    let token = path.trim_start_matches("/dashboard/join/");
    (r.body.replace(email, "EMAIL").replace(token, "TOKEN"), path)
}

/// The action of the people page's form changing `email`.
fn person_form(body: &str, email: &str) -> String {
    let at = body
        .find(email)
        .unwrap_or_else(|| panic!("{email} not listed: {body}"));
    let form_at = body[at..].find("<form").map_or(at, |i| at + i);
    body[form_at..]
        .split_once("action=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(a, _)| a.to_owned())
        .unwrap_or_else(|| panic!("no form for {email}: {body}"))
}

/// Switches the session to `merchant` with the header's form.
async fn switch_to(person: &mut Dash, merchant: &str) -> dhukuti_tests::dash::Reply {
    let csrf = person.csrf_of("/dashboard").await;
    person
        .post(
            "/dashboard/switch",
            &[("csrf", &csrf), ("merchant", merchant)],
        )
        .await
}

async fn a_person_of_two_merchants_switches_between_them(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app.tenant("Other Shop", "a@other.np").await;
    let b = app.tenant("Himal Traders", "b@himal.np").await;
    let c = app.tenant("Third Shop", "c@third.np").await;
    user(&app, &a.merchant.id, "asha@other.np", Role::Owner).await;
    user(&app, &b.merchant.id, "owner@himal.np", Role::Owner).await;
    let in_a = app
        .payment(&a, Mode::Sandbox, 70_000, Provider::Esewa)
        .await;
    let in_b = app
        .payment(&b, Mode::Sandbox, 150_000, Provider::Khalti)
        .await;
    let (key_a, key_b) = (key_of(&app, &a, "A's").await, key_of(&app, &b, "B's").await);
    let mut owner = signed_in(&app, "owner@himal.np").await;

    // Her address is answered exactly as a new one.
    let (new, _) = invite(&mut owner, "new@himal.np", "viewer").await;
    let (known, join) = invite(&mut owner, "asha@other.np", "viewer").await;
    assert_eq!(new, known, "the form tells nothing of the address");

    // She accepts by signing in with her existing password: a wrong one
    // joins nothing, the right one joins (today's main answered 409).
    let mut asha = Dash::new(&app.base);
    let page = asha.get(&join).await;
    assert_eq!(page.status, 200, "{}", page.show());
    let wrong = asha
        .post(&join, &[("password", "not her password at all")])
        .await;
    assert!(
        wrong.status == 401 || wrong.status == 422,
        "{}",
        wrong.show()
    );
    let r = asha.post(&join, &[("password", PASSWORD)]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = asha.sign_in("asha@other.np", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());

    // Signed in on A, where she is an owner.
    let pays = asha.get("/dashboard/payments").await;
    assert!(pays.body.contains(in_a.id.as_str()), "{}", pays.show());
    assert!(!pays.body.contains(in_b.id.as_str()), "{}", pays.show());
    let people = asha.get("/dashboard/people").await;
    assert_eq!(people.status, 200, "{}", people.show());
    assert!(!people.body.contains("owner@himal.np"), "{}", people.show());
    let keys = asha.get("/dashboard/keys").await;
    assert!(keys.body.contains(key_a.as_str()), "{}", keys.show());
    assert!(!keys.body.contains(key_b.as_str()), "{}", keys.show());
    assert!(
        keys.body.contains("Himal Traders"),
        "the switcher lists B: {}",
        keys.show()
    );

    // Switched to B, where she is a viewer.
    let r = switch_to(&mut asha, b.merchant.id.as_str()).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let pays = asha.get("/dashboard/payments").await;
    assert!(pays.body.contains(in_b.id.as_str()), "{}", pays.show());
    assert!(!pays.body.contains(in_a.id.as_str()), "{}", pays.show());
    assert_eq!(asha.get("/dashboard/people").await.status, 403, "a viewer");
    assert_eq!(asha.get("/dashboard/keys").await.status, 403, "a viewer");

    // A forged switch to C, whose person she is not: refused, nothing
    // changes, while B's owner keeps working.
    let csrf = asha.csrf_of("/dashboard").await;
    let fields = [
        ("csrf", csrf.as_str()),
        ("merchant", c.merchant.id.as_str()),
    ];
    let (forged, honest) = tokio::join!(
        asha.post("/dashboard/switch", &fields),
        owner.get("/dashboard/people"),
    );
    assert_eq!(forged.status, 403, "{}", forged.show());
    assert_eq!(honest.status, 200, "{}", honest.show());
    assert!(honest.body.contains("asha@other.np"), "{}", honest.show());
    let pays = asha.get("/dashboard/payments").await;
    assert!(pays.body.contains(in_b.id.as_str()), "still on B");
    let no_csrf = asha
        .post("/dashboard/switch", &[("merchant", a.merchant.id.as_str())])
        .await;
    assert_eq!(no_csrf.status, 403, "{}", no_csrf.show());

    // B's owner makes her a developer there: B's keys, never A's.
    let people = owner.get("/dashboard/people").await;
    let action = person_form(&people.body, "asha@other.np");
    let csrf = field(&people.body, "csrf");
    let r = owner
        .post(
            &action,
            &[("csrf", &csrf), ("do", "role"), ("role", "developer")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let keys = asha.get("/dashboard/keys").await;
    assert_eq!(keys.status, 200, "{}", keys.show());
    assert!(keys.body.contains(key_b.as_str()), "{}", keys.show());
    assert!(!keys.body.contains(key_a.as_str()), "{}", keys.show());
    assert_eq!(
        asha.get("/dashboard/people").await.status,
        403,
        "a developer"
    );

    // Back to A: an owner there again.
    let r = switch_to(&mut asha, a.merchant.id.as_str()).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert_eq!(asha.get("/dashboard/people").await.status, 200);
    let r = switch_to(&mut asha, b.merchant.id.as_str()).await;
    assert_eq!(r.status, 303, "{}", r.show());

    // B's owner removes her from B: her session on B ends; A is intact.
    let people = owner.get("/dashboard/people").await;
    let action = person_form(&people.body, "asha@other.np");
    let csrf = field(&people.body, "csrf");
    let r = owner
        .post(&action, &[("csrf", &csrf), ("do", "remove")])
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let people = owner.get("/dashboard/people").await;
    assert!(!people.body.contains("asha@other.np"), "{}", people.show());
    let gone = asha.get("/dashboard/payments").await;
    assert_eq!(gone.status, 303, "signed out of B: {}", gone.show());
    let r = asha.sign_in("asha@other.np", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let pays = asha.get("/dashboard/payments").await;
    assert!(pays.body.contains(in_a.id.as_str()), "{}", pays.show());
    assert_eq!(
        asha.get("/dashboard/people").await.status,
        200,
        "owner of A"
    );
    let r = switch_to(&mut asha, b.merchant.id.as_str()).await;
    assert_eq!(r.status, 403, "{}", r.show());
    let audit = owner.get("/dashboard/audit").await;
    assert!(audit.body.contains("person.join"), "{}", audit.show());
    assert!(audit.body.contains("person.remove"), "{}", audit.show());
    app.stop().await;
}

on_both_backends!(a_person_of_two_merchants_switches_between_them);
