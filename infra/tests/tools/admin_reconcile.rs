//! `dhukuti-admin reconcile` (issue 41, part 6): the built binary against
//! a temporary `DHUKUTI_DATA_DIR`. An eSewa statement file runs and
//! prints the run and its counts; the same file again is the same run;
//! Khalti's day is pulled from the simulator (in this process) with the
//! sandbox key. Bad input exits 2 naming what is wrong, a provider that
//! cannot be reached 1, and nothing is run.

use std::path::Path;
use std::process::{Command, Stdio};

use axum::Router;
use dhukuti::simulators::{self, KHALTI_TEST_SECRET_KEY, SimConfig, SimState};
use serde_json::Value;
use shared::domain::reconciliation::matching::nepal_day_of;
use shared::providers::hub::ESEWA_TEST_PRODUCT_CODE;
use shared::time::{Clock, SystemClock};

const BIN: &str = env!("CARGO_BIN_EXE_dhukuti-admin");

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

fn admin(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("DHUKUTI_DATA_DIR", dir)
        .env_remove("DHUKUTI_BACKEND")
        .env_remove("DHUKUTI_CREDENTIALS_KEY")
        .env_remove("DHUKUTI_CREDENTIALS_PREVIOUS_KEYS")
        .env_remove("DHUKUTI_PROVIDERS_BASE_URL")
        .env_remove("DHUKUTI_SANDBOX_KHALTI_SECRET_KEY")
        .env_remove("DHUKUTI_SANDBOX_ESEWA_PRODUCT_CODE")
        .env_remove("DHUKUTI_SANDBOX_ESEWA_SECRET_KEY")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"));
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let r = admin(dir, args, env);
    assert_eq!(r.code, Some(0), "{args:?}:\n{}\n{}", r.stdout, r.stderr);
    r
}

/// A merchant's project: its id.
fn project(dir: &Path) -> String {
    let m = ok(
        dir,
        &[
            "--json",
            "merchant",
            "create",
            "--name",
            "Sagarmatha Tea",
            "--email",
            "owner@tea.example",
            "--plan",
            "growth",
        ],
        &[],
    )
    .json();
    let merchant = m["id"].as_str().unwrap_or_default().to_owned();
    let p = ok(
        dir,
        &[
            "--json",
            "project",
            "create",
            "--merchant",
            &merchant,
            "--name",
            "Shop",
        ],
        &[],
    )
    .json();
    p["id"].as_str().unwrap_or_default().to_owned()
}

/// The simulators on a free port: their base URL.
async fn simulator() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    let base = format!("http://{addr}/sim");
    let app = Router::new().nest(
        "/sim",
        simulators::router(SimState::new(SimConfig::new(&base))),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_runs_a_file_or_pulls_khalti_and_prints_the_run() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let dir = tmp.path();
    let project = project(dir);
    let date = nepal_day_of(SystemClock.now())
        .format("%Y-%m-%d")
        .to_string();
    let at = format!("{date} 10:15:00");
    let csv = format!(
        "Merchant Code: {ESEWA_TEST_PRODUCT_CODE}\n\
         Transaction UUID,Reference ID,Amount,Service Charge,Transaction Date,Status\n\
         OUTSIDE-1,R1,150.00,,{at},COMPLETE\n\
         OUTSIDE-2,R2,75.50,,{at},COMPLETE\n"
    );
    let file = dir.join("esewa.csv");
    std::fs::write(&file, &csv).unwrap_or_else(|e| panic!("write: {e}"));
    let file = file.to_string_lossy().into_owned();

    // A statement file: the run, completed, its counts.
    let run = ok(
        dir,
        &[
            "reconcile",
            &project,
            "esewa",
            &date,
            "--file",
            &file,
            "--json",
        ],
        &[],
    )
    .json();
    let id = run["id"].as_str().unwrap_or_default().to_owned();
    assert!(id.starts_with("rrun_"), "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["source"], "upload", "{run}");
    assert_eq!(run["counts"]["notOurs"], 2, "{run}");
    assert_eq!(run["theirsTotal"], 22_550, "{run}");
    // The same file again, as text: the same run, said so.
    let again = ok(
        dir,
        &["reconcile", &project, "esewa", &date, "--file", &file],
        &[],
    );
    assert!(
        again.stdout.contains(&format!("run        {id}")),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains("status     completed"),
        "{}",
        again.stdout
    );
    assert!(again.stdout.contains("not_ours"), "{}", again.stdout);
    assert!(again.stderr.contains("run before"), "{}", again.stderr);

    // Khalti: pulled from the simulator with the sandbox key.
    let sim = simulator().await;
    let khalti_env = [
        ("DHUKUTI_PROVIDERS_BASE_URL", sim.as_str()),
        ("DHUKUTI_SANDBOX_KHALTI_SECRET_KEY", KHALTI_TEST_SECRET_KEY),
    ];
    let pulled = ok(
        dir,
        &["reconcile", &project, "khalti", &date, "--json"],
        &khalti_env,
    )
    .json();
    assert_eq!(pulled["source"], "pull", "{pulled}");
    assert_eq!(pulled["status"], "completed", "{pulled}");
    assert_eq!(pulled["provider"], "khalti", "{pulled}");

    // Bad input: exit 2, naming what is wrong.
    let bad_csv = dir.join("bad.csv");
    std::fs::write(&bad_csv, csv.replace("75.50", "seventy")).unwrap_or_else(|e| panic!("{e}"));
    let bad_csv = bad_csv.to_string_lossy().into_owned();
    let missing = dir.join("nope.csv").to_string_lossy().into_owned();
    for (args, says) in [
        (
            vec!["reconcile", &project, "esewa", &date],
            "--file is required",
        ),
        (
            vec!["reconcile", &project, "khalti", &date, "--file", &file],
            "--file: Khalti",
        ),
        (
            vec![
                "reconcile",
                &project,
                "esewa",
                "2026-02-30",
                "--file",
                &file,
            ],
            "date:",
        ),
        (
            vec!["reconcile", &project, "esewa", &date, "--file", &missing],
            "--file",
        ),
        (
            vec!["reconcile", &project, "esewa", &date, "--file", &bad_csv],
            "file: line 4",
        ),
        (vec!["reconcile", &project, "paypal", &date], "paypal"),
        (
            vec!["reconcile", "proj", "esewa", &date, "--file", &file],
            "not a project id",
        ),
        (
            vec!["reconcile", &project, "khalti", &date],
            "provider: no khalti credentials",
        ),
    ] {
        let r = admin(dir, &args, &[]);
        assert_eq!(r.code, Some(2), "{args:?}: {}\n{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(says), "{says}: {}", r.stderr);
    }
    // Khalti not answering: exit 1.
    let down = [
        ("DHUKUTI_PROVIDERS_BASE_URL", "http://127.0.0.1:9"),
        ("DHUKUTI_SANDBOX_KHALTI_SECRET_KEY", KHALTI_TEST_SECRET_KEY),
    ];
    let r = admin(dir, &["reconcile", &project, "khalti", &date], &down);
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("the run failed"), "{}", r.stderr);
    // An unknown project: exit 1.
    let r = admin(
        dir,
        &[
            "reconcile",
            "proj_01jdw3n0000000000000000000",
            "esewa",
            &date,
            "--file",
            &file,
        ],
        &[],
    );
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("not found"), "{}", r.stderr);

    // Nothing else ran: one eSewa run, one Khalti run.
    let store = shared::store::embedded::EmbeddedStore::open(&dir.join("dhukuti.redb"))
        .unwrap_or_else(|e| panic!("open: {e}"));
    let state = shared::AppState::new(
        std::sync::Arc::new(store),
        std::sync::Arc::new(SystemClock),
        shared::Config {
            public_base_url: String::new(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    );
    let tenant = shared::domain::Tenant::new(project.as_str(), shared::domain::Mode::Sandbox);
    let (runs, total) = shared::domain::reconciliation::runs::list(
        &state,
        &tenant,
        &Default::default(),
        shared::domain::Window::first(10),
    )
    .await
    .unwrap_or_else(|e| panic!("list: {e}"));
    assert_eq!(total, 2, "{runs:?}");
}

/// `reconcile enroll`: Khalti credentials stored before the daily pull's
/// list existed (no entry) are listed by it, once; a second run changes
/// nothing; a bad or unknown project is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_enroll_lists_old_khalti_credentials_once() {
    use shared::domain::credentials::{self, CredentialsKey, CredentialsKeys, PulledTenant};
    use shared::domain::{Mode, Provider, Tenant};
    use shared::store::embedded::EmbeddedStore;

    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let dir = tmp.path();
    let project = project(dir);
    let tenant = Tenant::new(shared::ids::ProjectId::from(project.as_str()), Mode::Live);
    let open = || match EmbeddedStore::open(&dir.join("dhukuti.redb")) {
        Ok(s) => s,
        Err(e) => panic!("open store: {e}"),
    };
    async fn listed(store: &EmbeddedStore) -> Vec<Tenant> {
        credentials::pulled_after(store, Provider::Khalti, None, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .0
            .into_iter()
            .map(|(_, t): (String, PulledTenant)| t.tenant())
            .collect()
    }
    {
        // Stored the old way: the credentials without the list's entry.
        let store = open();
        let keys = CredentialsKeys::single(
            CredentialsKey::new("k1", [9u8; 32]).unwrap_or_else(|e| panic!("{e}")),
        );
        credentials::put_credentials(
            &store,
            &keys,
            SystemClock.now(),
            &tenant,
            &shared::providers::ProviderCredentials::Khalti {
                secret_key: "live_secret_key_0123456789abcdef".into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let entry = shared::keys::pulled_tenant(Provider::Khalti, &tenant.project, tenant.mode);
        shared::store::Store::delete(&store, &entry, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(listed(&store).await.is_empty());
    }
    let first = ok(dir, &["--json", "reconcile", "enroll", &project], &[]).json();
    assert_eq!(first["listed"], 1, "{first}");
    assert_eq!(first["already"], 0, "{first}");
    let again = ok(dir, &["reconcile", "enroll", &project], &[]);
    assert!(again.stdout.contains("listed 0"), "{}", again.stdout);
    assert!(again.stdout.contains("already 1"), "{}", again.stdout);
    assert_eq!(listed(&open()).await, vec![tenant.clone()]);

    let bad = admin(dir, &["reconcile", "enroll", "nope"], &[]);
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    let unknown = admin(
        dir,
        &["reconcile", "enroll", "proj_01jz0000000000000000000000"],
        &[],
    );
    assert_eq!(unknown.code, Some(1), "{}", unknown.stderr);
}
