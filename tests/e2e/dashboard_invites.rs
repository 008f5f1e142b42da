//! Issue 37 item 9: adding a person is an invitation. The owner's form
//! answers a single-use link shown once, alike whether or not the address
//! has an account elsewhere; the invited person opens it, sets a password
//! and sees only this merchant; a used, revoked or unknown link gets one
//! page; the keyless link route is throttled per address. Both backends.

use dhukuti_tests::{Which, on_both_backends, spawn_app};
use shared::domain::dashboard::Role;
use shared::domain::{Mode, Provider};

use crate::dashboard_roles::{Dash, PASSWORD, field, signed_in, user};

/// Invites `email` as `role` from the people page; the answer and the
/// link's path (`/dashboard/join/…`).
async fn invite(
    owner: &mut Dash,
    email: &str,
    role: &str,
) -> (crate::dashboard_roles::Reply, String) {
    let page = owner.get("/dashboard/people").await;
    assert_eq!(page.status, 200, "{}", page.show());
    let at = page.body.find("action=\"/dashboard/people\"").unwrap_or(0);
    let (token, nonce) = (field(&page.body, "csrf"), field(&page.body[at..], "nonce"));
    let r = owner
        .post(
            "/dashboard/people",
            &[
                ("csrf", &token),
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
    (r, path)
}

async fn an_invited_person_joins_once_and_sees_only_this_merchant(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let a = app.tenant("Other Shop", "a@other.np").await;
    let b = app.tenant("Himal Traders", "b@himal.np").await;
    user(&app, &a.merchant.id, "asha@other.np", Role::Viewer).await;
    user(&app, &b.merchant.id, "owner@himal.np", Role::Owner).await;
    let theirs = app
        .payment(&a, Mode::Sandbox, 70_000, Provider::Esewa)
        .await;
    let ours = app
        .payment(&b, Mode::Sandbox, 150_000, Provider::Khalti)
        .await;
    let mut owner = signed_in(&app, "owner@himal.np").await;

    // A new address and one with an account elsewhere: the same answer,
    // but for the address and the link.
    let (new, join) = invite(&mut owner, "new@himal.np", "viewer").await;
    let (known, known_join) = invite(&mut owner, "asha@other.np", "viewer").await;
    let strip = |body: &str, email: &str, path: &str| {
        let token = path.trim_start_matches("/dashboard/join/");
        body.replace(email, "EMAIL").replace(token, "TOKEN")
    };
    assert_eq!(
        strip(&new.body, "new@himal.np", &join),
        strip(&known.body, "asha@other.np", &known_join),
        "the form tells nothing of the address"
    );
    // Both pending, listed without their links.
    let people = owner.get("/dashboard/people").await;
    assert!(people.body.contains("new@himal.np") && people.body.contains("asha@other.np"));
    let token = join.trim_start_matches("/dashboard/join/");
    assert!(!people.body.contains(token), "the link is shown once");

    // The person opens the link, sets a password, and signs in.
    let mut person = Dash::new(&app.base);
    let page = person.get(&join).await;
    assert_eq!(page.status, 200, "{}", page.show());
    assert!(page.body.contains("new@himal.np"), "{}", page.show());
    let r = person.post(&join, &[("password", "short")]).await;
    assert_eq!(r.status, 422, "{}", r.show());
    let r = person.post(&join, &[("password", PASSWORD)]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = person.sign_in("new@himal.np", PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let list = person.get("/dashboard/payments").await;
    assert!(list.body.contains(ours.id.as_str()), "{}", list.show());
    assert!(!list.body.contains(theirs.id.as_str()), "{}", list.show());
    assert_eq!(
        person.get("/dashboard/people").await.status,
        403,
        "a viewer"
    );

    // Used, revoked and unknown links: one page for all.
    let used = Dash::new(&app.base).get(&join).await;
    assert_eq!(used.status, 404, "{}", used.show());
    let again = Dash::new(&app.base)
        .post(&join, &[("password", "another long password")])
        .await;
    assert_eq!(
        (again.status, again.body.as_str()),
        (404, used.body.as_str())
    );
    let people = owner.get("/dashboard/people").await;
    let at = people.body.find("name=\"invitation\"").unwrap_or(0);
    let hash = field(&people.body[at.saturating_sub(200)..], "invitation");
    let csrf = field(&people.body, "csrf");
    let r = owner
        .post(
            "/dashboard/people/invitations/revoke",
            &[("csrf", &csrf), ("invitation", &hash)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let revoked = Dash::new(&app.base).get(&known_join).await;
    assert_eq!(
        (revoked.status, revoked.body.as_str()),
        (404, used.body.as_str())
    );
    let unknown = Dash::new(&app.base)
        .get("/dashboard/join/di_0000000000000000000000000000000000000000000")
        .await;
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (404, used.body.as_str())
    );
    let audit = owner.get("/dashboard/audit").await;
    assert!(audit.body.contains("person.invite"), "{}", audit.show());

    // The keyless route is bounded per address.
    let mut guesser = Dash::new(&app.base);
    let mut limited = false;
    for _ in 0..40 {
        let r = guesser
            .get("/dashboard/join/di_1111111111111111111111111111111111111111111")
            .await;
        if r.status == 429 {
            limited = true;
            break;
        }
        assert_eq!(r.status, 404, "{}", r.show());
    }
    assert!(limited, "guessing links is throttled");
    app.stop().await;
}

on_both_backends!(an_invited_person_joins_once_and_sees_only_this_merchant);
