//! SAM local without Docker (issue 42). SAM runs a function by starting its
//! `bootstrap` against a Lambda Runtime API in a container; here each
//! function's `main.rs` (the very file `sam build` compiles, included
//! below) runs in a child process, this test binary started again with
//! `DHUKUTI_SAM_FUNCTION` naming the function, against a Runtime API
//! served by this test on 127.0.0.1, with the environment of
//! `infra/sam-local/env.json` pointed at moto, and gets every event of
//! `infra/sam-local/events/`. Its own binary would be a second build of
//! the workspace with other features (minutes of CI); `sam build` makes a
//! release arm64 build of each crate alone, whose compile and lint
//! `.ci/run` checks. What is not proven here: the containers, their
//! networking (`host.docker.internal`), and `sam` itself routing requests.
//!
//! Also: `cargo run -- --init-only` and `dhukuti-admin seed` exit, twice
//! (they are idempotent), and a function missing a variable reports its
//! failed start to the Runtime API's `/init/error`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::sync::{Mutex, mpsc};

/// The longest a child process may take to start, answer or exit.
const PATIENCE: Duration = Duration::from_secs(60);
/// Where SAM's containers find moto and the gateway in env.json.
const MOTO_IN_ENV_FILE: &str = "http://host.docker.internal:5000";
const GATEWAY_IN_ENV_FILE: &str = "http://host.docker.internal:8080";

// Each function's `main.rs`, as `sam build` compiles it into `bootstrap`.
#[path = "../../functions/account/src/main.rs"]
mod account_main;
#[path = "../../functions/billing/src/main.rs"]
mod billing_main;
#[path = "../../functions/checkout/src/main.rs"]
mod checkout_main;
#[path = "../../functions/dashboard-documents/src/main.rs"]
mod dashboard_documents_main;
#[path = "../../functions/dashboard/src/main.rs"]
mod dashboard_main;
#[path = "../../functions/docs/src/main.rs"]
mod docs_main;
#[path = "../../functions/events/src/main.rs"]
mod events_main;
#[path = "../../functions/hosted/src/main.rs"]
mod hosted_main;
#[path = "../../functions/invoices/src/main.rs"]
mod invoices_main;
#[path = "../../functions/mail-dispatcher/src/main.rs"]
mod mail_dispatcher_main;
#[path = "../../functions/mobile/src/main.rs"]
mod mobile_main;
#[path = "../../functions/payment-links/src/main.rs"]
mod payment_links_main;
#[path = "../../functions/payments/src/main.rs"]
mod payments_main;
#[path = "../../functions/qr/src/main.rs"]
mod qr_main;
#[path = "../../functions/reconciliation/src/main.rs"]
mod reconciliation_main;
#[path = "../../functions/refunds/src/main.rs"]
mod refunds_main;
#[path = "../../functions/report-runner/src/main.rs"]
mod report_runner_main;
#[path = "../../functions/reports/src/main.rs"]
mod reports_main;
#[path = "../../functions/scheduler/src/main.rs"]
mod scheduler_main;
#[path = "../../functions/settlements/src/main.rs"]
mod settlements_main;
#[path = "../../functions/sms-dispatcher/src/main.rs"]
mod sms_dispatcher_main;
#[path = "../../functions/sms/src/main.rs"]
mod sms_main;
#[path = "../../functions/webhook-dispatcher/src/main.rs"]
mod webhook_dispatcher_main;
#[path = "../../functions/webhook-fanout/src/main.rs"]
mod webhook_fanout_main;
#[path = "../../functions/webhooks/src/main.rs"]
mod webhooks_main;

/// The variable naming the function a child process runs.
const FUNCTION_ENV: &str = "DHUKUTI_SAM_FUNCTION";

/// A function's process: this binary started with [`FUNCTION_ENV`] set
/// (by [`spawn_function`]) runs that function's `main` and exits as its
/// bootstrap would (`main`'s error: non-zero).
#[test]
#[ignore = "a function's process, started by the tests below with DHUKUTI_SAM_FUNCTION"]
fn function_process() {
    let name = std::env::var(FUNCTION_ENV).unwrap_or_default();
    let result = match name.as_str() {
        "account" => account_main::main(),
        "billing" => billing_main::main(),
        "checkout" => checkout_main::main(),
        "dashboard" => dashboard_main::main(),
        "dashboard-documents" => dashboard_documents_main::main(),
        "docs" => docs_main::main(),
        "events" => events_main::main(),
        "hosted" => hosted_main::main(),
        "invoices" => invoices_main::main(),
        "mail-dispatcher" => mail_dispatcher_main::main(),
        "mobile" => mobile_main::main(),
        "payment-links" => payment_links_main::main(),
        "payments" => payments_main::main(),
        "qr" => qr_main::main(),
        "reconciliation" => reconciliation_main::main(),
        "refunds" => refunds_main::main(),
        "report-runner" => report_runner_main::main(),
        "reports" => reports_main::main(),
        "scheduler" => scheduler_main::main(),
        "settlements" => settlements_main::main(),
        "sms" => sms_main::main(),
        "sms-dispatcher" => sms_dispatcher_main::main(),
        "webhook-dispatcher" => webhook_dispatcher_main::main(),
        "webhook-fanout" => webhook_fanout_main::main(),
        "webhooks" => webhooks_main::main(),
        other => panic!("{FUNCTION_ENV}={other:?} is no function"),
    };
    // As a `main` returning an error ends: its Debug, exit code 1.
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("Error: {e:?}");
            std::process::exit(1)
        }
    }
}

/// Starts `function`'s process (see [`function_process`]) with exactly
/// `env`, as a container would.
fn spawn_function(function: &str, env: &[(String, String)], log: &Path) -> tokio::process::Child {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut env = env.to_vec();
    env.push((FUNCTION_ENV.to_owned(), function.to_owned()));
    let args = [
        "sam_local::function_process",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ];
    spawn(&exe, &args, &env, log)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn template() -> serde_norway::Value {
    let path = root().join("template.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn names(v: &serde_norway::Value) -> BTreeSet<String> {
    v.as_mapping()
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn env_file() -> BTreeMap<String, BTreeMap<String, String>> {
    let path = root().join("infra/sam-local/env.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn events_dir() -> PathBuf {
    root().join("infra/sam-local/events")
}

/// `sam local --env-vars` sets only the variables the template declares
/// for a function (its own and Globals'): the file names every function
/// with exactly those, so none is silently dropped and none is missing.
#[test]
fn the_env_file_gives_every_function_each_variable_it_declares() {
    let t = template();
    let file = env_file();
    let globals = names(&t["Globals"]["Function"]["Environment"]["Variables"]);
    assert!(globals.contains("AWS_ENDPOINT_URL"), "{globals:?}");
    let mut seen = BTreeSet::new();
    for (name, f) in crate::template::functions(&t) {
        let Some(vars) = file.get(&name) else {
            panic!("infra/sam-local/env.json has no {name}")
        };
        let mut declared = globals.clone();
        declared.extend(names(&f["Properties"]["Environment"]["Variables"]));
        let given: BTreeSet<String> = vars.keys().cloned().collect();
        assert_eq!(
            given, declared,
            "{name}: env.json's variables (left) are not the ones the template declares (right)"
        );
        seen.insert(name);
    }
    let extra: Vec<&String> = file.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(extra.is_empty(), "env.json names no function: {extra:?}");
}

/// What `infra/sam-local/make_events.py` writes for one trigger.
fn expected_events() -> BTreeMap<String, serde_norway::Value> {
    let mut out = BTreeMap::new();
    for (name, f) in crate::template::functions(&template()) {
        for (event, spec) in f["Properties"]["Events"]
            .as_mapping()
            .cloned()
            .unwrap_or_default()
        {
            let event = event.as_str().unwrap_or("").to_owned();
            out.insert(format!("{name}/{event}"), spec);
        }
        if !f["Properties"]["FunctionUrlConfig"].is_null() {
            out.insert(format!("{name}/FunctionUrl"), serde_norway::Value::Null);
        }
    }
    out
}

fn event_files() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let dirs = std::fs::read_dir(events_dir()).unwrap_or_else(|e| panic!("events: {e}"));
    for dir in dirs.flatten() {
        let function = dir.file_name().to_string_lossy().into_owned();
        for file in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let file_name = file.file_name().to_string_lossy().into_owned();
            let Some(event) = file_name.strip_suffix(".json") else {
                continue;
            };
            let text = std::fs::read_to_string(file.path()).unwrap_or_default();
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{function}/{file_name}: {e}"));
            out.insert(format!("{function}/{event}"), json);
        }
    }
    out
}

/// `/c/{id}/return/{payment}/{outcome}` matches `/c/cs_…/return/pay_…/success`.
fn path_matches(template_path: &str, raw: &str) -> bool {
    let want: Vec<&str> = template_path.split('/').collect();
    let got: Vec<&str> = raw.split('/').collect();
    want.len() == got.len()
        && want
            .iter()
            .zip(&got)
            .all(|(w, g)| (w.starts_with('{') && !g.is_empty()) || w == g)
}

/// Every trigger of every function has its event (a route added to the
/// template without one fails here), and every event file is a trigger's.
#[test]
fn every_trigger_of_the_template_has_its_event() {
    let expected = expected_events();
    let files = event_files();
    let missing: Vec<&String> = expected
        .keys()
        .filter(|k| !files.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "no event in infra/sam-local/events for {missing:?}: run python infra/sam-local/make_events.py"
    );
    let orphans: Vec<&String> = files
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .collect();
    assert!(orphans.is_empty(), "events of no trigger: {orphans:?}");
    assert!(expected.len() >= 60, "{} triggers", expected.len());
    for (id, spec) in &expected {
        let event = &files[id];
        match spec["Type"].as_str() {
            Some("HttpApi") => {
                let path = spec["Properties"]["Path"].as_str().unwrap_or("");
                let method = spec["Properties"]["Method"].as_str().unwrap_or("");
                let raw = event["rawPath"].as_str().unwrap_or("");
                assert!(path_matches(path, raw), "{id}: {raw} is not {path}");
                let sent = event["requestContext"]["http"]["method"]
                    .as_str()
                    .unwrap_or("");
                assert!(
                    sent == method || method == "ANY",
                    "{id}: {sent} is not {method}"
                );
                assert_eq!(event["version"], "2.0", "{id}");
            }
            Some("SQS") => {
                let records = event["Records"].as_array().map(Vec::len).unwrap_or(0);
                assert!(records >= 2, "{id}: a batch of {records}");
                assert_eq!(event["Records"][0]["eventSource"], "aws:sqs", "{id}");
            }
            Some("DynamoDB") => {
                assert_eq!(event["Records"][0]["eventName"], "INSERT", "{id}");
                let pk = event["Records"][0]["dynamodb"]["Keys"]["pk"]["S"]
                    .as_str()
                    .unwrap_or("");
                assert!(pk.starts_with("EVT#"), "{id}: {pk}");
            }
            Some("Schedule") => assert_eq!(event["detail-type"], "Scheduled Event", "{id}"),
            _ => assert_eq!(event["routeKey"], "$default", "{id}"),
        }
    }
}

// ------------------------------------------------------ the Runtime API

/// What a function sent back.
#[derive(Debug)]
enum Answer {
    Response(String, Bytes),
    Error(String, Bytes),
    InitError(HeaderMap, Bytes),
}

#[derive(Clone)]
struct Api {
    next: Arc<Mutex<mpsc::UnboundedReceiver<(String, String)>>>,
    answers: mpsc::UnboundedSender<Answer>,
    arn: String,
}

async fn next(State(api): State<Api>) -> Response {
    // One invocation at a time, as Lambda hands them out; with none left
    // the call waits (the test stops the process).
    let event = api.next.lock().await.recv().await;
    let Some((id, body)) = event else {
        return std::future::pending().await;
    };
    let deadline = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() + 30_000)
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    };
    set("lambda-runtime-aws-request-id", id);
    set("lambda-runtime-deadline-ms", deadline.to_string());
    set("lambda-runtime-invoked-function-arn", api.arn.clone());
    set(
        "lambda-runtime-trace-id",
        "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1".into(),
    );
    set("content-type", "application/json".into());
    (headers, body).into_response()
}

async fn response(State(api): State<Api>, UrlPath(id): UrlPath<String>, body: Bytes) -> StatusCode {
    let _ = api.answers.send(Answer::Response(id, body));
    StatusCode::ACCEPTED
}

async fn error(State(api): State<Api>, UrlPath(id): UrlPath<String>, body: Bytes) -> StatusCode {
    let _ = api.answers.send(Answer::Error(id, body));
    StatusCode::ACCEPTED
}

async fn init_error(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let _ = api.answers.send(Answer::InitError(headers, body));
    StatusCode::ACCEPTED
}

/// A Runtime API on 127.0.0.1 for one function process: events go in
/// through the sender, answers come out of the receiver. Stops with the
/// returned task's abort (on drop of [`Runtime`]).
struct Runtime {
    addr: std::net::SocketAddr,
    events: mpsc::UnboundedSender<(String, String)>,
    answers: mpsc::UnboundedReceiver<Answer>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn runtime_api(function: &str) -> Runtime {
    let (events, next_rx) = mpsc::unbounded_channel();
    let (answers_tx, answers) = mpsc::unbounded_channel();
    let api = Api {
        next: Arc::new(Mutex::new(next_rx)),
        answers: answers_tx,
        arn: format!("arn:aws:lambda:ap-south-1:123456789012:function:{function}"),
    };
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .route("/2018-06-01/runtime/init/error", post(init_error))
        .layer(DefaultBodyLimit::disable())
        .with_state(api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Runtime {
        addr,
        events,
        answers,
        task,
    }
}

// ----------------------------------------------------------- processes

/// The directory of the debug binaries (`target/debug`): this test's
/// executable is `target/debug/deps/e2e-…`. `cargo test --workspace`
/// builds the gateway's binaries there (infra's own tests run them).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("{exe:?} is not in target/<profile>/deps"))
}

fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{path:?} is missing: `cargo test --workspace` builds it, or \
         `cargo build -p dhukuti --bins`"
    );
    path
}

/// What AWS's Lambda and SAM set for every function.
fn lambda_env(function: &str, runtime: &Runtime) -> Vec<(String, String)> {
    [
        ("AWS_LAMBDA_RUNTIME_API", runtime.addr.to_string()),
        ("AWS_LAMBDA_FUNCTION_NAME", function.to_owned()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256".to_owned()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        (
            "AWS_LAMBDA_LOG_GROUP_NAME",
            format!("/aws/lambda/{function}"),
        ),
        (
            "AWS_LAMBDA_LOG_STREAM_NAME",
            "2026/11/27/[$LATEST]test".to_owned(),
        ),
        ("AWS_REGION", "ap-south-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A child with exactly `env` (as in a container: nothing of ours leaks
/// in), its output in `log`; killed when dropped.
fn spawn(
    path: &Path,
    args: &[&str],
    env: &[(String, String)],
    log: &Path,
) -> tokio::process::Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{log:?}: {e}"));
    let err = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = tokio::process::Command::new(path);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true);
    cmd.spawn().unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn read_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Runs a command to its end (bounded): its exit status and output.
async fn run(path: &Path, args: &[&str], env: &[(String, String)], log: &Path) -> (i32, String) {
    let mut child = spawn(path, args, env, log);
    let status = match tokio::time::timeout(PATIENCE, child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => panic!("{path:?}: {e}"),
        Err(_) => panic!(
            "{path:?} {args:?} did not exit in {PATIENCE:?}: {}",
            read_log(log)
        ),
    };
    (status.code().unwrap_or(-1), read_log(log))
}

/// The AWS resources one run uses: names no other test has.
struct Names {
    endpoint: String,
    prefix: String,
    secret: String,
}

impl Names {
    fn new(endpoint: String) -> Names {
        let prefix = format!("samlocal-{}", ulid::Ulid::new().to_string().to_lowercase());
        Names {
            endpoint,
            secret: format!("{prefix}/credentials-key"),
            prefix,
        }
    }

    /// The variables of `dhukuti --init-only` and `dhukuti-admin seed`.
    fn tool_env(&self, data_dir: &Path) -> Vec<(String, String)> {
        [
            ("DHUKUTI_BACKEND", "aws".to_owned()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("DHUKUTI_TABLE", self.prefix.clone()),
            ("DHUKUTI_QUEUE_PREFIX", self.prefix.clone()),
            ("DHUKUTI_BUCKET", self.prefix.clone()),
            ("DHUKUTI_CREDENTIALS_KEY_SECRET", self.secret.clone()),
            ("DHUKUTI_DATA_DIR", data_dir.display().to_string()),
            ("AWS_REGION", "ap-south-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "test".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// A function's variables from env.json, pointed at this run's moto
    /// resources; the simulators at a port nobody listens on (no event
    /// here reaches a provider).
    fn function_env(&self, vars: &BTreeMap<String, String>) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| {
                let v = match k.as_str() {
                    "DHUKUTI_TABLE" | "DHUKUTI_BUCKET" => self.prefix.clone(),
                    "DHUKUTI_CREDENTIALS_KEY_SECRET" => self.secret.clone(),
                    "DHUKUTI_QUEUE_WEBHOOKS_URL" => {
                        format!("{}/123456789012/{}-webhooks", self.endpoint, self.prefix)
                    }
                    "DHUKUTI_QUEUE_SMS_URL" => {
                        format!("{}/123456789012/{}-sms", self.endpoint, self.prefix)
                    }
                    "DHUKUTI_QUEUE_MAIL_URL" => {
                        format!("{}/123456789012/{}-mail", self.endpoint, self.prefix)
                    }
                    _ => v
                        .replace(MOTO_IN_ENV_FILE, &self.endpoint)
                        .replace(GATEWAY_IN_ENV_FILE, "http://127.0.0.1:9"),
                };
                (k.clone(), v)
            })
            .collect()
    }
}

/// `dhukuti --init-only` twice (creates, then keeps) and `dhukuti-admin
/// seed` twice (the same keys): they exit 0. Returns the sandbox key.
async fn init_and_seed(names: &Names, tmp: &Path) -> String {
    let env = names.tool_env(tmp);
    let gateway = binary("dhukuti");
    let (code, out) = run(&gateway, &["--init-only"], &env, &tmp.join("init-1.log")).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("table   {}", names.prefix)), "{out}");
    assert!(
        out.contains("(created: the credentials master key)"),
        "{out}"
    );
    let (code, again) = run(&gateway, &["--init-only"], &env, &tmp.join("init-2.log")).await;
    assert_eq!(code, 0, "{again}");
    assert!(
        again.contains("(kept: the credentials master key)"),
        "{again}"
    );

    let admin = binary("dhukuti-admin");
    let seed = |n: u8| tmp.join(format!("seed-{n}.log"));
    let (code, out) = run(&admin, &["--json", "seed"], &env, &seed(1)).await;
    assert_eq!(code, 0, "{out}");
    let first = json_of(&out);
    let key = first["sandboxKey"].as_str().unwrap_or("").to_owned();
    assert!(key.starts_with("sk_test_"), "{out}");
    assert_eq!(first["fonepayCredentials"], true, "{out}");
    let (code, out) = run(&admin, &["--json", "seed"], &env, &seed(2)).await;
    assert_eq!(code, 0, "{out}");
    let second = json_of(&out);
    assert_eq!(second["sandboxKey"], first["sandboxKey"], "{out}");
    assert_eq!(second["project"], first["project"], "{out}");
    key
}

/// The JSON document in a command's output (messages may follow it).
fn json_of(out: &str) -> Value {
    let start = out.find('{').unwrap_or(0);
    let mut stream = serde_json::Deserializer::from_str(&out[start..]).into_iter::<Value>();
    match stream.next() {
        Some(Ok(v)) => v,
        _ => panic!("no JSON in {out}"),
    }
}

#[tokio::test]
async fn init_only_refuses_the_embedded_backend_and_names_the_variable() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let env = vec![(
        "DHUKUTI_DATA_DIR".to_owned(),
        tmp.path().display().to_string(),
    )];
    let (code, out) = run(
        &binary("dhukuti"),
        &["--init-only"],
        &env,
        &tmp.path().join("init.log"),
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DHUKUTI_BACKEND=aws"), "{out}");
}

/// A function whose table variable is missing fails its start with one
/// line naming it, reported to `/init/error`, and exits non-zero.
#[tokio::test]
async fn a_function_missing_a_variable_reports_an_init_error() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut runtime = runtime_api("AccountFunction").await;
    let names = Names::new("http://127.0.0.1:9".into());
    let file = env_file();
    let mut env = names.function_env(&file["AccountFunction"]);
    env.retain(|(k, _)| k != "DHUKUTI_TABLE");
    env.extend(lambda_env("AccountFunction", &runtime));
    let log = tmp.path().join("account.log");
    let mut child = spawn_function("account", &env, &log);
    let answer = tokio::time::timeout(PATIENCE, runtime.answers.recv()).await;
    let Ok(Some(Answer::InitError(headers, body))) = answer else {
        panic!("no init error: {answer:?}: {}", read_log(&log))
    };
    assert_eq!(
        headers
            .get("lambda-runtime-function-error-type")
            .and_then(|v| v.to_str().ok()),
        Some("Runtime.InitError")
    );
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(body["errorType"], "Runtime.InitError", "{body}");
    let message = body["errorMessage"].as_str().unwrap_or("");
    assert!(message.starts_with("DHUKUTI_TABLE is not set"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    let status = tokio::time::timeout(PATIENCE, child.wait()).await;
    let Ok(Ok(status)) = status else {
        panic!("the function did not exit: {}", read_log(&log))
    };
    assert!(!status.success(), "{}", read_log(&log));
    assert!(read_log(&log).contains("DHUKUTI_TABLE is not set"));
}

/// What one event must get back: checked per trigger kind and route.
fn check_answer(
    id: &str,
    kind: &str,
    v1: bool,
    answer: &Answer,
    project: &str,
    expect_failures: &[&str],
) {
    let body = match answer {
        Answer::Response(_, body) => body,
        Answer::Error(_, body) => panic!("{id}: an error: {}", String::from_utf8_lossy(body)),
        Answer::InitError(_, body) => {
            panic!("{id}: the start failed: {}", String::from_utf8_lossy(body))
        }
    };
    match kind {
        "SQS" | "DynamoDB" => {
            let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let failures = v["batchItemFailures"]
                .as_array()
                .unwrap_or_else(|| panic!("{id}: no batchItemFailures in {v}"));
            // With the table there, both messages are done with: the
            // well-formed one names a delivery (or reminder) that does not
            // exist, the other is no message at all (dropped, logged);
            // retrying either could never succeed. Without the table, the
            // well-formed one fails and is reported, alone.
            let ids: Vec<&str> = failures
                .iter()
                .filter_map(|f| f["itemIdentifier"].as_str())
                .collect();
            assert_eq!(ids, expect_failures, "{id}: {v}");
        }
        // The sweep ran (an error would have come as Answer::Error).
        "Schedule" => {}
        _ => check_http(id, v1, body, project),
    }
}

/// An API Gateway (v2) answer: never a 5xx; `/v1` errors in the API's
/// error shape; a few routes answer exactly.
fn check_http(id: &str, v1: bool, body: &Bytes, project: &str) {
    // A streamed answer (the function URL) starts with its JSON prelude
    // and 8 NUL bytes.
    let (head, rest) = match body.windows(8).position(|w| w == [0u8; 8]) {
        Some(at) if id.ends_with("/FunctionUrl") => (&body[..at], &body[at + 8..]),
        _ => (&body[..], &[][..]),
    };
    let res: Value = serde_json::from_slice(head).unwrap_or(Value::Null);
    let status = res["statusCode"].as_u64().unwrap_or(0);
    assert!((200..500).contains(&status), "{id}: {res}");
    let text = match res["body"].as_str() {
        Some(b) => b.to_owned(),
        None => String::from_utf8_lossy(rest).into_owned(),
    };
    let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let api = res["headers"]["content-type"]
        .as_str()
        .is_some_and(|c| c.starts_with("application/json"));
    if api && status >= 400 && v1 {
        assert!(json["error"]["code"].is_string(), "{id}: {status} {text}");
    }
    match id {
        "AccountFunction/GetAccount" => {
            assert_eq!(status, 200, "{text}");
            assert!(text.contains(project), "{id}: {text}");
        }
        "PaymentsFunction/ListPayments" | "AccountFunction/GetAnalyticsOverview" => {
            assert_eq!(status, 200, "{id}: {text}")
        }
        "CheckoutFunction/CreateCheckout" => {
            assert_eq!(status, 201, "{id}: {text}");
            assert!(
                json["id"].as_str().is_some_and(|s| s.starts_with("cs_")),
                "{text}"
            );
        }
        "DocsFunction/OpenApi" => {
            assert_eq!(status, 200, "{id}");
            assert!(json["openapi"].is_string(), "{id}");
        }
        "PaymentsFunction/GetPayment" => assert_eq!(status, 404, "{id}: {text}"),
        _ => {}
    }
}

/// One function's run: its events, and what its queue batches must report.
struct FunctionRun<'a> {
    name: &'a str,
    binary: &'a str,
    events: &'a [(String, String, String)],
    project: &'a str,
    /// Another table than the run's (one that does not exist).
    table: Option<&'a str>,
    expect_failures: &'a [&'a str],
}

/// One function's process against its own Runtime API, every event of
/// the function in turn; the process must still be serving after the last.
async fn run_function(names: &Names, tmp: &Path, run: FunctionRun<'_>) {
    let FunctionRun {
        name,
        binary: binary_name,
        events,
        project,
        table,
        expect_failures,
    } = run;
    let mut runtime = runtime_api(name).await;
    let file = env_file();
    let mut env = names.function_env(&file[name]);
    if let Some(table) = table {
        for (k, v) in env.iter_mut() {
            if k == "DHUKUTI_TABLE" {
                *v = table.to_owned();
            }
        }
    }
    env.extend(lambda_env(name, &runtime));
    let log = tmp.join(format!("{name}.log"));
    let mut child = spawn_function(binary_name, &env, &log);
    for (n, (id, kind, event)) in events.iter().enumerate() {
        let request = format!("{n:08}-0000-4000-8000-{:012}", n);
        let _ = runtime.events.send((request.clone(), event.clone()));
        let answer = tokio::time::timeout(PATIENCE, runtime.answers.recv()).await;
        let answer = match answer {
            Ok(Some(a)) => a,
            _ => panic!("{id}: no answer in {PATIENCE:?}: {}", read_log(&log)),
        };
        if let Answer::Response(got, _) | Answer::Error(got, _) = &answer {
            assert_eq!(got, &request, "{id}");
        }
        let v1 = serde_json::from_str::<Value>(event)
            .ok()
            .and_then(|e| e["rawPath"].as_str().map(|p| p.starts_with("/v1/")))
            .unwrap_or(false);
        check_answer(id, kind, v1, &answer, project, expect_failures);
    }
    match child.try_wait() {
        Ok(None) => {}
        other => panic!("{name} exited: {other:?}: {}", read_log(&log)),
    }
    let _ = child.kill().await;
}

/// Every function of the template, started as SAM starts it, answers
/// every one of its events (moto behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_answers_its_events_through_the_runtime_api() {
    let Some(endpoint) = shared::queue::testkit::aws_endpoint() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let names = Names::new(endpoint);
    let key = init_and_seed(&names, tmp.path()).await;
    let project = {
        let (_, out) = run(
            &binary("dhukuti-admin"),
            &["--json", "seed"],
            &names.tool_env(tmp.path()),
            &tmp.path().join("seed-3.log"),
        )
        .await;
        json_of(&out)["project"].as_str().unwrap_or("").to_owned()
    };
    let files = event_files();
    let t = template();
    let specs = expected_events();
    let mut ran = 0;
    let mut partial = 0;
    for (name, f) in crate::template::functions(&t) {
        let binary_name = f["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no Binary"));
        let mut events = Vec::new();
        for (id, spec) in specs
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{name}/")))
        {
            let kind = spec["Type"].as_str().unwrap_or("FunctionUrl").to_owned();
            let text = files[id].to_string().replace("__KEY__", &key);
            events.push((id.clone(), kind, text));
        }
        assert!(!events.is_empty(), "{name} has no event");
        ran += events.len();
        let run = FunctionRun {
            name: &name,
            binary: binary_name,
            events: &events,
            project: &project,
            table: None,
            expect_failures: &[],
        };
        run_function(&names, tmp.path(), run).await;
        if events.iter().any(|(_, kind, _)| kind == "SQS") {
            // A store that fails (no such table): the partial batch
            // response names the one message to retry.
            let missing = format!("{}-missing", names.prefix);
            let first = ["00000000-0000-4000-8000-000000000000"];
            let run = FunctionRun {
                name: &name,
                binary: binary_name,
                events: &events,
                project: &project,
                table: Some(&missing),
                expect_failures: &first,
            };
            run_function(&names, tmp.path(), run).await;
            partial += 1;
        }
    }
    assert!(ran >= 60, "{ran} events");
    assert_eq!(partial, 3, "the webhook, SMS and mail dispatchers");
}
