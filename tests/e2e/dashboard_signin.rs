//! Issue 37, items 3 and 7, over HTTP on both backends: a guessing attack
//! on one email (100 wrong passwords from ten addresses) and a flood that
//! fills one address's sign-in budget, replayed from one simulated client,
//! while the owner's known-device browser (at the flooded address) still
//! signs in; a browser without the cookie, with a tampered one, with one
//! minted for another email, or with one revoked by "sign out everywhere"
//! is still throttled. The owner sees the failed attempts once, and the
//! audit page shows sign-in success, failure, throttling and sign-out, and
//! what `dhukuti-admin user …` did.

use std::time::Duration;

use dhukuti_tests::dash::Dash;
use dhukuti_tests::{TestApp, Which, on_both_backends, spawn_app};
use shared::domain::dashboard::{self, Role};
use shared::time::{Clock, SystemClock};

const PASSWORD: &str = "a long dashboard password";
const OWNER: &str = "owner@himal.np";
const OTHER: &str = "clerk@himal.np";

async fn setup(which: Which) -> Option<TestApp> {
    let app = spawn_app(which).await?;
    let t = app.tenant("Himal Traders", "a@himal.np").await;
    let now = SystemClock.now();
    for (email, role) in [(OWNER, Role::Owner), (OTHER, Role::Developer)] {
        dashboard::create_user(app.state(), now, &t.merchant.id, email, role, PASSWORD)
            .await
            .unwrap_or_else(|e| panic!("user: {e}"));
    }
    Some(app)
}

/// Waits, if needed, so that the attack below does not straddle the
/// sign-in throttle's 15-minute window.
async fn steady_window() {
    let window = u64::try_from(dashboard::ATTEMPT_WINDOW).unwrap_or(900);
    let into = SystemClock.now().unix_seconds().rem_euclid(900);
    let left = window.saturating_sub(u64::try_from(into).unwrap_or(0));
    if left < 60 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// The attack: 100 wrong passwords for `OWNER` from ten addresses (ten
/// per address, the most each may), then 30 guesses at 30 other emails
/// from `flooded`, the owner's own (shared) address. Answers the codes of
/// one more try of each bucket.
async fn attack(app: &TestApp, flooded: [u8; 4]) {
    for a in 0..10u8 {
        let mut b = Dash::at(&app.base, [127, 0, 0, 10 + a]);
        let token = b.form_token().await;
        for n in 0..dashboard::ATTEMPTS_PER_ACCOUNT_AND_ADDRESS {
            let r = b
                .post(
                    "/dashboard/sign-in",
                    &[
                        ("email", OWNER),
                        ("password", &format!("guess {a} {n}")),
                        ("csrf", &token),
                    ],
                )
                .await;
            assert_eq!(r.status, 401, "{a}/{n}: {}", r.show());
        }
    }
    let mut b = Dash::at(&app.base, flooded);
    let token = b.form_token().await;
    for n in 0..30 {
        let email = format!("nobody{n}@himal.np");
        let r = b
            .post(
                "/dashboard/sign-in",
                &[("email", &email), ("password", "guess"), ("csrf", &token)],
            )
            .await;
        assert_eq!(r.status, 401, "{n}: {}", r.show());
    }
}

/// Issue 37, 3 and 7: the owner's known device signs in through an
/// attack that holds everyone else; the attack is audited and shown to
/// the owner once.
async fn a_known_device_signs_in_through_a_guessing_attack(which: Which) {
    let Some(app) = setup(which).await else {
        return;
    };
    // The owner's browser, at a carrier address it shares, signed in
    // before: it carries the known-device cookie, for the sign-in form
    // only, HttpOnly and SameSite=Strict.
    let home = [127, 0, 0, 2];
    let mut owner = Dash::at(&app.base, home);
    let r = owner.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let device = owner
        .set_cookies
        .iter()
        .find(|c| c.starts_with("dhukuti_device=dd_"))
        .cloned()
        .unwrap_or_else(|| panic!("no device cookie: {:?}", owner.set_cookies));
    for attr in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/dashboard/sign-in",
        "Max-Age=7776000",
    ] {
        assert!(device.contains(attr), "{device}");
    }
    let token = owner.csrf_of("/dashboard/refunds").await;
    let r = owner.post("/dashboard/sign-out", &[("csrf", &token)]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert!(owner.jar.contains_key("dhukuti_device"), "kept on sign-out");

    steady_window().await;
    attack(&app, home).await;

    // Held: a cookieless browser for the owner anywhere (per email), and
    // for another user at the flooded address (per address).
    let mut stranger = Dash::at(&app.base, [127, 0, 0, 3]);
    let r = stranger.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 429, "{}", r.show());
    let mut neighbour = Dash::at(&app.base, home);
    let r = neighbour.sign_in(OTHER, PASSWORD).await;
    assert_eq!(r.status, 429, "{}", r.show());
    // A tampered device cookie is no device, and no error.
    let mut forger = Dash::at(&app.base, [127, 0, 0, 4]);
    let mut forged = owner.jar["dhukuti_device"].clone();
    let last = if forged.ends_with('A') { "B" } else { "A" };
    forged.pop();
    forged.push_str(last);
    forger.jar.insert("dhukuti_device".into(), forged);
    let r = forger.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 429, "{}", r.show());
    // The owner's device is not the other user's: held at that address.
    let r = owner.sign_in(OTHER, PASSWORD).await;
    assert_eq!(r.status, 429, "{}", r.show());

    // The owner's known device signs in, at the flooded address.
    let r = owner.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    // The first page says what happened, once.
    let first = owner.get("/dashboard").await;
    assert_eq!(first.status, 200, "{}", first.show());
    assert!(
        first
            .body
            .contains("100 failed sign-in attempts from 127.0.0.0/24"),
        "{}",
        first.show()
    );
    let second = owner.get("/dashboard").await;
    assert!(!second.body.contains("failed sign-in"), "{}", second.show());

    // The audit log: the fill as a throttle, with its networks (never a
    // stranger's full address), the failures, the sign-ins.
    let audit = owner.get("/dashboard/audit").await;
    assert_eq!(audit.status, 200, "{}", audit.show());
    for word in ["sign_in.throttled", "sign_in.failed", "sign_in"] {
        assert!(audit.body.contains(word), "{word}: {}", audit.show());
    }
    assert!(
        audit.body.matches("sign_in.throttled").count() == 1,
        "{}",
        audit.show()
    );
    assert!(!audit.body.contains("127.0.0.10<"), "{}", audit.show());

    // Sign out everywhere: the old device cookie no longer bypasses.
    let token = owner.csrf_of("/dashboard/refunds").await;
    let r = owner
        .post("/dashboard/sign-out-everywhere", &[("csrf", &token)])
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = owner.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 429, "{}", r.show());
    app.stop().await;
}

/// Issue 37, 7: what `dhukuti-admin user …` does is in the merchant's
/// audit log, and sign-out is too.
async fn operator_actions_and_sign_out_are_audited(which: Which) {
    let Some(app) = setup(which).await else {
        return;
    };
    let merchant = dashboard::find_user_by_email(&*app.store, OWNER)
        .await
        .ok()
        .flatten()
        .map(|u| u.merchant_id)
        .unwrap_or_else(|| panic!("the owner"));
    let now = SystemClock.now();
    let state = app.state();
    dashboard::operator::create(
        state,
        now,
        &merchant,
        "new@himal.np",
        Role::Viewer,
        PASSWORD,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    dashboard::operator::reset_password(state, now, OTHER, "another long password")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    dashboard::operator::set_disabled(state, now, "new@himal.np", true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut owner = Dash::at(&app.base, [127, 0, 0, 2]);
    let r = owner.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = owner.sign_in(OWNER, "wrong password!").await;
    assert_eq!(r.status, 401, "{}", r.show());
    let token = owner.csrf_of("/dashboard/refunds").await;
    let r = owner.post("/dashboard/sign-out", &[("csrf", &token)]).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let r = owner.sign_in(OWNER, PASSWORD).await;
    assert_eq!(r.status, 303, "{}", r.show());
    let audit = owner.get("/dashboard/audit").await;
    assert_eq!(audit.status, 200, "{}", audit.show());
    for word in [
        "user.create",
        "user.reset_password",
        "user.disable",
        "dhukuti-admin",
        "sign_in.failed",
        "sign_out",
    ] {
        assert!(audit.body.contains(word), "{word}: {}", audit.show());
    }
    app.stop().await;
}

on_both_backends!(
    a_known_device_signs_in_through_a_guessing_attack,
    operator_actions_and_sign_out_are_audited,
);
