//! `dhukuti-admin` end to end: the built binary against a temporary
//! `DHUKUTI_DATA_DIR`, checked through its output and, between runs,
//! through the store itself (the binary holds the redb lock only while it
//! runs).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use shared::domain::Tenant;
use shared::domain::account::{self, AuthError};
use shared::domain::credentials::{self, CredentialsKeys};
use shared::domain::{Mode, Provider};
use shared::store::embedded::EmbeddedStore;
use shared::time::{Clock, SystemClock};

const BIN: &str = env!("CARGO_BIN_EXE_dhukuti-admin");

struct Run {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        match serde_json::from_str(&self.stdout) {
            Ok(v) => v,
            Err(e) => panic!("stdout is not JSON ({e}): {}\n{}", self.stdout, self.stderr),
        }
    }
}

fn run_with(dir: &Path, args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("DHUKUTI_DATA_DIR", dir)
        .env_remove("DHUKUTI_BACKEND")
        .env_remove("DHUKUTI_CREDENTIALS_KEY")
        .env_remove("DHUKUTI_CREDENTIALS_PREVIOUS_KEYS")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("cannot start {BIN}: {e}"),
    };
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        if let Err(e) = pipe.write_all(text.as_bytes()) {
            panic!("stdin: {e}");
        }
    }
    let out: Output = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => panic!("wait: {e}"),
    };
    Run {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run(dir: &Path, args: &[&str]) -> Run {
    run_with(dir, args, &[], None)
}

/// Runs a command that must succeed.
fn must(dir: &Path, args: &[&str]) -> Run {
    let r = run(dir, args);
    assert!(
        r.ok,
        "{args:?} failed ({:?}):\n{}\n{}",
        r.code, r.stdout, r.stderr
    );
    r
}

fn temp_dir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

fn open(dir: &Path) -> EmbeddedStore {
    match EmbeddedStore::open(&dir.join("dhukuti.redb")) {
        Ok(s) => s,
        Err(e) => panic!("open store: {e}"),
    }
}

fn text(v: &Value, field: &str) -> String {
    match v.get(field).and_then(Value::as_str) {
        Some(s) => s.to_owned(),
        None => panic!("no string {field} in {v}"),
    }
}

/// A merchant and a project; their ids.
fn onboard(dir: &Path) -> (String, String) {
    let m = must(
        dir,
        &[
            "merchant",
            "create",
            "--name",
            "Himal Traders",
            "--email",
            "owner@himal.example",
            "--plan",
            "growth",
            "--json",
        ],
    )
    .json();
    let merchant = text(&m, "id");
    assert!(merchant.starts_with("mer_"));
    assert_eq!(m["plan"], "growth");
    let p = must(
        dir,
        &[
            "--json",
            "project",
            "create",
            "--merchant",
            &merchant,
            "--name",
            "Main shop",
        ],
    )
    .json();
    assert_eq!(p["merchant_id"], merchant.as_str());
    assert_eq!(p["live_invoicing"], false);
    // Its publishable keys come with it, one per mode.
    assert!(
        is_secret_shape(&text(&p, "publishable_key_sandbox"), "pk_test_"),
        "{p}"
    );
    assert!(
        is_secret_shape(&text(&p, "publishable_key_live"), "pk_live_"),
        "{p}"
    );
    (merchant, text(&p, "id"))
}

fn is_secret_shape(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|rest| rest.len() >= 32 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

#[tokio::test]
async fn keys_are_issued_once_listed_rotated_and_revoked() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let (_, project) = onboard(dir);

    // Human output: the secret appears once, with the warning on stderr.
    let issued = must(
        dir,
        &[
            "key",
            "issue",
            "--project",
            &project,
            "--mode",
            "sandbox",
            "--scopes",
            "all",
            "--kind",
            "secret",
            "--description",
            "Checkout server",
        ],
    );
    let secret = issued
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("secret"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    assert!(is_secret_shape(&secret, "sk_test_"), "{}", issued.stdout);
    assert_eq!(issued.stdout.matches(&secret).count(), 1);
    assert!(
        issued.stderr.contains("cannot show it again"),
        "{}",
        issued.stderr
    );

    // JSON output, a restricted live key with an expiry and a cap.
    let live = must(
        dir,
        &[
            "key",
            "issue",
            "--json",
            "--project",
            &project,
            "--mode",
            "live",
            "--scopes",
            "payments:read,payments:write",
            "--kind",
            "restricted",
            "--expires-in",
            "30d",
            "--spend-cap-paisa",
            "500000",
        ],
    );
    let live_json = live.json();
    let live_secret = text(&live_json, "secret");
    assert!(is_secret_shape(&live_secret, "sk_live_"));
    assert!(live.stderr.contains("cannot show it again"));
    let live_id = text(&live_json["key"], "id");
    assert_eq!(live_json["key"]["kind"], "restricted");
    assert_eq!(live_json["key"]["spend_cap_paisa"], 500_000);
    assert!(live_json["key"]["expires_at"].is_string());

    // Listing never shows a secret (nor the hash).
    let listed = must(dir, &["key", "list", "--project", &project]);
    assert!(!listed.stdout.contains(&secret) && !listed.stdout.contains(&live_secret));
    assert!(listed.stdout.contains(&secret[..12]), "prefix shown");
    assert!(
        listed.stdout.contains(&secret[secret.len() - 4..]),
        "hint shown"
    );
    let listed_json = must(dir, &["key", "list", "--project", &project, "--json"]);
    assert!(!listed_json.stdout.contains(&secret) && !listed_json.stdout.contains("key_hash"));
    let rows = listed_json.json();
    let rows = rows.as_array().cloned().unwrap_or_default();
    // The project's two publishable keys came with it, before these.
    assert_eq!(rows.len(), 4);
    let kinds: Vec<&str> = rows.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds[2..], ["publishable", "publishable"], "{rows:?}");
    assert_eq!(rows[0]["id"], live_id.as_str(), "newest first");
    assert_eq!(rows[1]["mode"], "sandbox");
    // A secret key has every scope, the billing ones included.
    assert_eq!(
        rows[1]["scopes"].as_array().map(Vec::len),
        Some(account::Scope::ALL.len())
    );
    let sandbox_id = text(&rows[1], "id");

    // Rotate with a one-hour grace: both work now, only the new one after.
    let rotated = must(
        dir,
        &[
            "key",
            "rotate",
            &sandbox_id,
            "--project",
            &project,
            "--grace",
            "1h",
            "--json",
        ],
    )
    .json();
    let new_secret = text(&rotated, "secret");
    assert!(is_secret_shape(&new_secret, "sk_test_"));
    assert_eq!(rotated["old_key"]["id"], sandbox_id.as_str());
    assert_eq!(rotated["new_key"]["description"], "Checkout server");
    {
        let store = open(dir);
        let now = SystemClock.now();
        let new = account::authenticate(&store, now, &new_secret).await;
        assert!(new.is_ok());
        assert!(account::authenticate(&store, now, &secret).await.is_ok());
        let later = now.plus(chrono::Duration::minutes(61));
        assert_eq!(
            account::authenticate(&store, later, &secret).await,
            Err(AuthError::Expired)
        );
        assert!(
            account::authenticate(&store, later, &new_secret)
                .await
                .is_ok()
        );
        let same_scopes = new.map(|p| p.key.scopes.len()).unwrap_or_default();
        assert_eq!(same_scopes, account::Scope::ALL.len());
    }

    // Revoke the live key: refused at once; revoking again fails.
    let revoked = must(dir, &["key", "revoke", &live_id, "--project", &project]);
    assert!(revoked.stdout.contains(&live_id));
    {
        let store = open(dir);
        assert_eq!(
            account::authenticate(&store, SystemClock.now(), &live_secret).await,
            Err(AuthError::Invalid)
        );
    }
    let again = run(dir, &["key", "revoke", &live_id, "--project", &project]);
    assert_eq!(again.code, Some(1));
    assert!(again.stderr.contains("not found"), "{}", again.stderr);
    let after = must(dir, &["key", "list", "--project", &project, "--json"]).json();
    assert_eq!(
        after.as_array().map(Vec::len),
        Some(4),
        "old + rotated + the two publishable"
    );
}

#[tokio::test]
async fn merchants_are_suspended_reinstated_and_replanned() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let (merchant, project) = onboard(dir);
    let key = must(
        dir,
        &[
            "--json",
            "key",
            "issue",
            "--project",
            &project,
            "--mode",
            "live",
            "--scopes",
            "all",
            "--kind",
            "secret",
        ],
    )
    .json();
    let secret = text(&key, "secret");

    let s = must(
        dir,
        &[
            "merchant",
            "suspend",
            &merchant,
            "--reason",
            "KYC review",
            "--json",
        ],
    )
    .json();
    assert_eq!(s["suspension"]["reason"], "KYC review");
    {
        let store = open(dir);
        let r = account::authenticate(&store, SystemClock.now(), &secret).await;
        assert!(matches!(r, Err(AuthError::Suspended(s)) if s.reason == "KYC review"));
    }
    let shown = must(dir, &["merchant", "show", &merchant]);
    assert!(shown.stdout.contains("suspended"), "{}", shown.stdout);

    let r = must(dir, &["merchant", "reinstate", &merchant, "--json"]).json();
    assert!(r["suspension"].is_null());
    let p = must(
        dir,
        &["merchant", "set-plan", &merchant, "--plan", "pro", "--json"],
    )
    .json();
    assert_eq!(p["plan"], "pro");
    let proj = must(
        dir,
        &[
            "project",
            "set",
            &project,
            "--live-invoicing",
            "true",
            "--json",
        ],
    )
    .json();
    assert_eq!(proj["live_invoicing"], true);
    {
        let store = open(dir);
        let who = account::authenticate(&store, SystemClock.now(), &secret).await;
        let Ok(who) = who else {
            panic!("reinstated key refused: {who:?}")
        };
        let deps = shared::AppState::new(
            std::sync::Arc::new(store),
            std::sync::Arc::new(SystemClock),
            shared::Config::from_env(),
        );
        let view = account::account_view(&deps, &who).await;
        let Ok(view) = view else { panic!("view") };
        assert_eq!(view.entitlements.sms_monthly_quota, 1000);
        assert!(view.entitlements.live_invoicing);
    }
}

#[tokio::test]
async fn provider_credentials_are_stored_encrypted() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let (_, project) = onboard(dir);

    // No master key: a clear refusal, nothing read or stored.
    let missing = run(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "khalti",
            "--secret-key",
            "x",
        ],
    );
    assert_eq!(missing.code, Some(2));
    assert!(
        missing.stderr.contains("DHUKUTI_CREDENTIALS_KEY"),
        "{}",
        missing.stderr
    );

    let generated = must(dir, &["credentials", "generate-key", "--json"]).json();
    let master = text(&generated, "value");
    assert!(master.starts_with("k1:"));
    let env = [("DHUKUTI_CREDENTIALS_KEY", master.as_str())];
    let khalti_secret = "live_secret_key_0123456789abcdef0123456789abcdef";
    let esewa_secret = "8gBm/:&EnhH.1/q-esewa-secret";
    let fonepay_secret = "fonepay-hmac-secret-a1b2c3";
    let fonepay_password = "p@ssw0rd-fonepay-xyz";

    // From an environment variable (out of the shell history).
    let env_with_secret = [env[0], ("KHALTI_LIVE_SECRET", khalti_secret)];
    let set = run_with(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "khalti",
            "--secret-key-env",
            "KHALTI_LIVE_SECRET",
            "--json",
        ],
        &env_with_secret,
        None,
    );
    assert!(set.ok, "{}", set.stderr);
    assert_eq!(set.json()["provider"], "khalti");
    assert!(!set.stdout.contains(khalti_secret));
    // From stdin.
    let set = run_with(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            &project,
            "--mode",
            "sandbox",
            "--provider",
            "esewa",
            "--product-code",
            "EPAYTEST",
            "--secret-key-stdin",
        ],
        &env,
        Some(&format!("{esewa_secret}\n")),
    );
    assert!(set.ok, "{}", set.stderr);
    // Two secrets from stdin, one a line.
    let set = run_with(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "fonepay",
            "--merchant-code",
            "NBQM-42",
            "--username",
            "fp-user",
            "--secret-key-stdin",
            "--password-stdin",
        ],
        &env,
        Some(&format!("{fonepay_secret}\r\n{fonepay_password}\n")),
    );
    assert!(set.ok, "{}", set.stderr);

    let listed = must(
        dir,
        &["credentials", "list", "--project", &project, "--json"],
    );
    let rows = listed.json();
    let summary: Vec<(String, String)> = rows
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| (text(r, "mode"), text(r, "provider")))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("live".to_owned(), "fonepay".to_owned()),
            ("live".to_owned(), "khalti".to_owned()),
            ("sandbox".to_owned(), "esewa".to_owned()),
        ]
    );
    let checked = run_with(
        dir,
        &["credentials", "list", "--project", &project, "--check"],
        &env,
        None,
    );
    assert!(checked.ok, "{}", checked.stderr);
    assert_eq!(
        checked.stdout.matches(" ok").count(),
        3,
        "{}",
        checked.stdout
    );
    for secret in [
        khalti_secret,
        esewa_secret,
        fonepay_secret,
        fonepay_password,
    ] {
        assert!(!listed.stdout.contains(secret) && !checked.stdout.contains(secret));
    }

    // Another master key cannot read them, and says so.
    let other = must(dir, &["credentials", "generate-key", "--id", "k1"]);
    let other_key = other.stdout.trim().to_owned();
    let wrong = run_with(
        dir,
        &["credentials", "list", "--project", &project, "--check"],
        &[("DHUKUTI_CREDENTIALS_KEY", other_key.as_str())],
        None,
    );
    assert_eq!(wrong.code, Some(1));
    assert!(
        wrong.stderr.contains("cannot be decrypted"),
        "{}",
        wrong.stderr
    );

    // What was stored decrypts to exactly what was given ...
    {
        let store = open(dir);
        let keys = match CredentialsKeys::from_values(Some(&master), None) {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        };
        let got = credentials::get_credentials(
            &store,
            &keys,
            &Tenant::new(project.as_str(), Mode::Live),
            Provider::Fonepay,
        )
        .await;
        let expected = credentials::ProviderCredentials::Fonepay {
            merchant_code: "NBQM-42".into(),
            secret_key: fonepay_secret.into(),
            username: "fp-user".into(),
            password: fonepay_password.into(),
        };
        assert_eq!(got, Ok(Some(expected)));
    }
    // ... and no secret is anywhere in the database file.
    let raw = match std::fs::read(dir.join("dhukuti.redb")) {
        Ok(b) => b,
        Err(e) => panic!("read db: {e}"),
    };
    let raw = String::from_utf8_lossy(&raw);
    for secret in [
        khalti_secret,
        esewa_secret,
        fonepay_secret,
        fonepay_password,
        "EPAYTEST",
    ] {
        assert!(!raw.contains(secret), "{secret} stored in the clear");
    }

    // Removing one.
    must(
        dir,
        &[
            "credentials",
            "remove",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "khalti",
        ],
    );
    let again = run(
        dir,
        &[
            "credentials",
            "remove",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "khalti",
        ],
    );
    assert_eq!(again.code, Some(1));
}

/// A pending eSewa payment of `project`, stored, then held for review as
/// a provider's paid answer for another amount holds it.
async fn held_payment(store: std::sync::Arc<dyn shared::store::Store>, project: &str) -> String {
    use shared::domain::attempts::{self, Decision};
    use shared::domain::payments::{self, Payment, PaymentStatus};
    let now = SystemClock.now();
    let p = Payment {
        id: shared::ids::PaymentId::new(),
        project_id: project.into(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: Mode::Sandbox,
        amount: shared::money::Paisa::new(100_000).unwrap_or_default(),
        amount_refunded: shared::money::Paisa::ZERO,
        currency: shared::money::Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider: Provider::Esewa,
        status: PaymentStatus::Pending,
        provider_ref: None,
        failure_reason: None,
        metadata: Default::default(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: Default::default(),
        checks: Default::default(),
    };
    if let Err(e) = payments::insert(&*store, &p).await {
        panic!("insert: {e}");
    }
    let state = shared::AppState::new(
        store,
        std::sync::Arc::new(SystemClock),
        shared::Config {
            public_base_url: String::new(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let reason = Decision::Review("provider says paid 40000 paisa, the payment is 100000".into());
    match attempts::apply(&state, &p, reason, now).await {
        Ok(h) => assert_eq!(h.status, PaymentStatus::Processing),
        Err(e) => panic!("hold: {e}"),
    }
    p.id.to_string()
}

#[tokio::test]
async fn held_payments_are_listed_and_released_as_a_person_decides() {
    let dir = temp_dir();
    let (_, project) = onboard(dir.path());
    let (a, b) = {
        let store: std::sync::Arc<dyn shared::store::Store> = std::sync::Arc::new(open(dir.path()));
        (
            held_payment(store.clone(), &project).await,
            held_payment(store, &project).await,
        )
    };
    let listed = must(dir.path(), &["payments", "held", "--json"]).json();
    let ids: Vec<String> = listed
        .as_array()
        .map(|l| l.iter().map(|p| text(p, "id")).collect())
        .unwrap_or_default();
    assert_eq!(ids.len(), 2, "{listed}");
    assert!(ids.contains(&a) && ids.contains(&b));
    assert!(
        text(&listed[0], "reason").contains("paid 40000"),
        "{listed}"
    );
    let table = must(dir.path(), &["payments", "held"]);
    assert!(
        table.stdout.contains("REASON") && table.stdout.contains(&a),
        "{}",
        table.stdout
    );

    let ok = must(
        dir.path(),
        &["payments", "release", &a, "--succeed", "--json"],
    )
    .json();
    assert_eq!(ok["status"], "success", "{ok}");
    let no = must(
        dir.path(),
        &[
            "payments",
            "release",
            &b,
            "--fail",
            "no money at eSewa",
            "--json",
        ],
    )
    .json();
    assert_eq!(no["status"], "failed", "{no}");
    let again = run(dir.path(), &["payments", "release", &a, "--recheck"]);
    assert_eq!(again.code, Some(1));
    assert!(again.stderr.contains("not held"), "{}", again.stderr);
    let both = run(
        dir.path(),
        &["payments", "release", &a, "--recheck", "--succeed"],
    );
    assert_eq!(both.code, Some(2), "{}", both.stderr);
    let none = run(
        dir.path(),
        &["payments", "release", "pay_nope", "--recheck"],
    );
    assert_eq!(none.code, Some(2), "{}", none.stderr);
    let empty = must(dir.path(), &["payments", "held"]);
    assert!(
        empty.stdout.contains("no payment is held"),
        "{}",
        empty.stdout
    );
    // The store agrees.
    let store = open(dir.path());
    let p = shared::domain::payments::get(&store, &a.as_str().into())
        .await
        .ok()
        .flatten();
    assert_eq!(
        p.map(|p| (p.status, p.checks.review)),
        Some((shared::domain::payments::PaymentStatus::Success, None))
    );
}

#[test]
fn bad_input_exits_non_zero_with_a_message() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let (merchant, project) = onboard(dir);
    let unknown_merchant = "mer_01jd0000000000000000000000";
    let unknown_project = "proj_01jd0000000000000000000000";
    let unknown_key = "ak_01jd0000000000000000000000";
    let key_args = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = ["key", "issue", "--project", &project]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["frobnicate".into()], "unrecognized subcommand"),
        (
            [
                "merchant",
                "create",
                "--name",
                "X",
                "--email",
                "not-an-email",
                "--plan",
                "free",
            ]
            .map(String::from)
            .to_vec(),
            "not an email address",
        ),
        (
            [
                "merchant", "create", "--name", "X", "--email", "a@b.np", "--plan", "gold",
            ]
            .map(String::from)
            .to_vec(),
            "invalid value 'gold'",
        ),
        (
            [
                "merchant", "create", "--name", " ", "--email", "a@b.np", "--plan", "free",
            ]
            .map(String::from)
            .to_vec(),
            "--name cannot be empty",
        ),
        (
            ["merchant", "suspend", "bob", "--reason", "x"]
                .map(String::from)
                .to_vec(),
            "not a merchant id",
        ),
        (
            vec!["merchant".into(), "suspend".into(), merchant.clone()],
            "--reason",
        ),
        (
            vec![
                "merchant".into(),
                "reinstate".into(),
                unknown_merchant.into(),
            ],
            "not found",
        ),
        (
            vec![
                "project".into(),
                "create".into(),
                "--merchant".into(),
                unknown_merchant.into(),
                "--name".into(),
                "x".into(),
            ],
            "not found",
        ),
        (
            vec![
                "project".into(),
                "set".into(),
                project.clone(),
                "--live-invoicing".into(),
                "maybe".into(),
            ],
            "invalid value 'maybe'",
        ),
        (
            key_args(&[
                "--mode",
                "sandbox",
                "--scopes",
                "payments:nuke",
                "--kind",
                "secret",
            ]),
            "unknown scope",
        ),
        (
            key_args(&["--mode", "sandbox", "--scopes", "all", "--kind", "admin"]),
            "invalid value 'admin'",
        ),
        (
            key_args(&["--mode", "staging", "--scopes", "all", "--kind", "secret"]),
            "invalid value 'staging'",
        ),
        (
            key_args(&[
                "--mode",
                "live",
                "--scopes",
                "all",
                "--kind",
                "secret",
                "--expires-in",
                "5y",
            ]),
            "not a duration",
        ),
        (
            key_args(&[
                "--mode",
                "live",
                "--scopes",
                "all",
                "--kind",
                "secret",
                "--spend-cap-paisa=-5",
            ]),
            "--spend-cap-paisa",
        ),
        (
            vec![
                "key".into(),
                "issue".into(),
                "--project".into(),
                unknown_project.into(),
                "--mode".into(),
                "live".into(),
                "--scopes".into(),
                "all".into(),
                "--kind".into(),
                "secret".into(),
            ],
            "not found",
        ),
        (
            vec![
                "key".into(),
                "rotate".into(),
                unknown_key.into(),
                "--project".into(),
                project.clone(),
            ],
            "not found",
        ),
        (
            vec![
                "key".into(),
                "rotate".into(),
                unknown_key.into(),
                "--project".into(),
                project.clone(),
                "--grace=-1h".into(),
            ],
            "--grace",
        ),
        (
            vec![
                "key".into(),
                "list".into(),
                "--project".into(),
                "proj_x".into(),
            ],
            "not a project id",
        ),
        (
            vec![
                "credentials".into(),
                "set".into(),
                "--project".into(),
                project.clone(),
                "--mode".into(),
                "live".into(),
                "--provider".into(),
                "paypal".into(),
                "--secret-key".into(),
                "x".into(),
            ],
            "invalid value 'paypal'",
        ),
        (
            vec![
                "credentials".into(),
                "set".into(),
                "--project".into(),
                project.clone(),
                "--mode".into(),
                "live".into(),
                "--provider".into(),
                "khalti".into(),
            ],
            "--secret-key",
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run(dir, &args);
        assert!(!r.ok, "{args:?} succeeded:\n{}", r.stdout);
        assert!(
            matches!(r.code, Some(1) | Some(2)),
            "{args:?}: {:?}",
            r.code
        );
        assert!(
            r.stderr.contains(expected),
            "{args:?}: stderr lacks {expected:?}:\n{}",
            r.stderr
        );
        assert!(r.stdout.is_empty(), "{args:?} printed {}", r.stdout);
    }

    // Credentials that do not fit the provider, with a master key set.
    let generated = must(dir, &["credentials", "generate-key"]);
    let master = generated.stdout.trim().to_owned();
    let env = [("DHUKUTI_CREDENTIALS_KEY", master.as_str())];
    let base = [
        "credentials",
        "set",
        "--project",
        project.as_str(),
        "--mode",
        "live",
    ];
    let cred_cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--provider",
                "khalti",
                "--secret-key",
                "s",
                "--product-code",
                "X",
            ],
            "--product-code does not apply to khalti",
        ),
        (
            vec!["--provider", "esewa", "--secret-key", "s"],
            "esewa needs --product-code",
        ),
        (
            vec![
                "--provider",
                "fonepay",
                "--secret-key",
                "s",
                "--merchant-code",
                "M",
                "--username",
                "u",
            ],
            "fonepay needs --password",
        ),
        (
            vec![
                "--provider",
                "khalti",
                "--secret-key-env",
                "DHUKUTI_TEST_UNSET_VAR",
            ],
            "DHUKUTI_TEST_UNSET_VAR is not set",
        ),
        (
            vec!["--provider", "khalti", "--secret-key", " padded "],
            "whitespace",
        ),
        (
            vec![
                "--provider",
                "khalti",
                "--secret-key",
                "a",
                "--secret-key-stdin",
            ],
            "cannot be used with",
        ),
    ];
    for (extra, expected) in cred_cases {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let r = run_with(dir, &args, &env, None);
        assert!(!r.ok, "{args:?} succeeded");
        assert!(r.stderr.contains(expected), "{args:?}: {}", r.stderr);
    }
    let short = run_with(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "khalti",
            "--secret-key",
            "s",
        ],
        &[("DHUKUTI_CREDENTIALS_KEY", "c2hvcnQ=")],
        None,
    );
    assert_eq!(short.code, Some(2));
    assert!(short.stderr.contains("5 bytes"), "{}", short.stderr);
    let empty_stdin = run_with(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            &project,
            "--mode",
            "live",
            "--provider",
            "khalti",
            "--secret-key-stdin",
        ],
        &env,
        Some(""),
    );
    assert_eq!(empty_stdin.code, Some(2));
    assert!(empty_stdin.stderr.contains("stdin holds no secret key"));
    let no_project = run_with(
        dir,
        &[
            "credentials",
            "set",
            "--project",
            unknown_project,
            "--mode",
            "live",
            "--provider",
            "khalti",
            "--secret-key",
            "s",
        ],
        &env,
        None,
    );
    assert_eq!(no_project.code, Some(1));
    assert!(no_project.stderr.contains("does not exist"));

    // An unsupported backend is named.
    let aws = run_with(
        dir,
        &["merchant", "show", &merchant],
        &[("DHUKUTI_BACKEND", "cassandra")],
        None,
    );
    assert_eq!(aws.code, Some(1));
    assert!(aws.stderr.contains("DHUKUTI_BACKEND"));
}

#[test]
fn a_running_gateway_is_named_when_it_holds_the_store() {
    let tmp = temp_dir();
    let dir = tmp.path();
    let (merchant, _) = onboard(dir);
    let held = open(dir);
    let r = run(dir, &["merchant", "show", &merchant]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr
            .contains("stop the local gateway first (redb is single-process)"),
        "{}",
        r.stderr
    );
    drop(held);
    must(dir, &["merchant", "show", &merchant]);
}

/// The same tool against DynamoDB (moto from `infra/test.sh`): a deployer
/// onboards a merchant on AWS exactly as on the embedded store.
#[tokio::test]
async fn the_admin_tool_onboards_a_merchant_on_dynamodb() {
    use shared::store::dynamo::{DynamoStore, client_for_endpoint, create_table};
    let Some(endpoint) = shared::queue::testkit::aws_endpoint() else {
        return;
    };
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "ap-south-1".into());
    let table = format!(
        "admin-{}",
        shared::ids::new_id(shared::ids::IdKind::Event)[4..].to_owned()
    );
    let client = client_for_endpoint(&endpoint, &region);
    if let Err(e) = create_table(&client, &table).await {
        panic!("create table: {e}");
    }
    let dir = temp_dir();
    let env = [
        ("DHUKUTI_BACKEND", "aws"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", region.as_str()),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("DHUKUTI_TABLE", table.as_str()),
    ];
    let aws = |args: &[&str]| {
        let r = run_with(dir.path(), args, &env, None);
        assert!(r.ok, "{args:?} failed: {}\n{}", r.stdout, r.stderr);
        r
    };
    let m = aws(&[
        "--json",
        "merchant",
        "create",
        "--name",
        "Cloud Shop",
        "--email",
        "o@cloud.example",
        "--plan",
        "pro",
    ])
    .json();
    let merchant = text(&m, "id");
    let p = aws(&[
        "--json",
        "project",
        "create",
        "--merchant",
        &merchant,
        "--name",
        "Main",
    ])
    .json();
    let project = text(&p, "id");
    let k = aws(&[
        "--json",
        "key",
        "issue",
        "--project",
        &project,
        "--mode",
        "live",
        "--scopes",
        "all",
        "--kind",
        "secret",
    ])
    .json();
    let secret = text(&k, "secret");
    assert!(is_secret_shape(&secret, "sk_live_"));

    let store = DynamoStore::new(client, table.clone());
    let who = account::authenticate(&store, SystemClock.now(), &secret).await;
    assert_eq!(who.map(|w| w.merchant.id.to_string()), Ok(merchant.clone()));
    aws(&["merchant", "suspend", &merchant, "--reason", "review"]);
    let who = account::authenticate(&store, SystemClock.now(), &secret).await;
    assert!(matches!(who, Err(AuthError::Suspended(_))));
}

/// `lists migrate` lists and counts a project's payments from before the
/// filtered lists once (a rerun counts nothing twice), then the project's
/// filtered totals come from its counters.
#[tokio::test]
async fn lists_migrate_counts_older_payments_once() {
    use shared::domain::listing::{self, ListFilter, ListKind, ListsMarker};
    use shared::domain::payments::{Payment, PaymentStatus};
    use shared::domain::record::{Record, Window};
    use shared::store::{Index, Store};
    let dir = temp_dir();
    let (_, project) = onboard(dir.path());
    let tenant = Tenant::new(project.as_str(), Mode::Sandbox);
    let now = SystemClock.now();
    {
        let store = open(dir.path());
        // A project from before the lists: no marker, payments unlisted.
        for mode in [Mode::Sandbox, Mode::Live] {
            let key = ListsMarker::key(&Tenant::new(project.as_str(), mode));
            if let Err(e) = store.delete(&key, None).await {
                panic!("{e}");
            }
        }
        for i in 0..9i64 {
            let p = Payment {
                id: shared::ids::PaymentId::new(),
                project_id: project.as_str().into(),
                checkout_session_id: shared::ids::SessionId::new(),
                mode: Mode::Sandbox,
                amount: shared::money::Paisa::new(1000 + i).unwrap_or_default(),
                amount_refunded: shared::money::Paisa::ZERO,
                currency: shared::money::Currency::Npr,
                amount_reserved: Default::default(),
                gsi2pk: None,
                gsi2sk: None,
                provider: if i % 3 == 0 {
                    Provider::Khalti
                } else {
                    Provider::Esewa
                },
                status: if i % 2 == 0 {
                    PaymentStatus::Success
                } else {
                    PaymentStatus::Failed
                },
                provider_ref: None,
                failure_reason: None,
                metadata: Default::default(),
                customer_name: None,
                customer_email: None,
                customer_phone: None,
                created_at: now,
                updated_at: now,
                double_payment_of: None,
                scanned_at: None,
                attempt: Default::default(),
                checks: Default::default(),
            };
            let mut item = p.to_item().unwrap_or_else(|e| panic!("{e}"));
            for index in [Index::Gsi3, Index::Gsi4, Index::Gsi5, Index::Gsi6] {
                item.remove(index.pk_attr());
                item.remove(index.sk_attr());
            }
            if let Err(e) = store.put(item, None).await {
                panic!("{e}");
            }
        }
        let covered = listing::covered(&store, &tenant, ListKind::Payments).await;
        assert_eq!(covered, Ok(false));
    }
    let first = must(dir.path(), &["--json", "lists", "migrate", &project]).json();
    assert_eq!(first["sandbox"]["payments"]["listed"], 9, "{first}");
    assert_eq!(first["live"]["payments"]["listed"], 0, "{first}");
    let again = must(dir.path(), &["--json", "lists", "migrate", &project]).json();
    assert_eq!(again["sandbox"]["payments"]["listed"], 0, "{again}");
    assert_eq!(again["sandbox"]["payments"]["already"], 9, "{again}");
    let store = open(dir.path());
    assert_eq!(
        listing::covered(&store, &tenant, ListKind::Payments).await,
        Ok(true)
    );
    let count = |status: Option<&str>, provider: Option<Provider>| {
        let store = &store;
        let tenant = &tenant;
        let filter = ListFilter {
            status: status.map(str::to_owned),
            provider,
            ..Default::default()
        };
        async move {
            match listing::page::<Payment>(store, tenant, &filter, &Window::first(1), None, true)
                .await
            {
                Ok((_, total, _)) => total,
                Err(e) => panic!("{e}"),
            }
        }
    };
    assert_eq!(count(None, None).await, 9);
    assert_eq!(count(Some("success"), None).await, 5);
    assert_eq!(count(Some("failed"), Some(Provider::Khalti)).await, 1);
    assert_eq!(count(None, Some(Provider::Esewa)).await, 6);
    let r = run(dir.path(), &["lists", "migrate", "prj_nope"]);
    assert!(!r.ok, "{}", r.stdout);
}
