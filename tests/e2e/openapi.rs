//! The OpenAPI document: the committed copy is what the code generates,
//! the gateway serves it, every `/v1` route is in it and every operation
//! in it is a route, and each operation's documented scope is the one the
//! handler demands.

use std::collections::BTreeSet;

use dhukuti_tests::{Which, spawn_app};
use serde_json::Value;
use shared::domain::Mode;
use shared::domain::account::Scope;

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

const COMMITTED: &str = "docs/openapi.json";

fn generated() -> String {
    dhukuti::openapi_json().unwrap_or_else(|e| panic!("{e}"))
}

fn document() -> Value {
    serde_json::from_str(&generated()).unwrap_or_else(|e| panic!("the document: {e}"))
}

/// An app's operation: the `publishable` scheme, no scope.
const APP: &str = "publishable";

/// `(METHOD, path)` of every operation, and its documented scopes (for
/// an app's operation, [`APP`] alone).
fn operations(doc: &Value) -> Vec<(String, String, Vec<String>)> {
    let mut out = Vec::new();
    let Some(paths) = doc["paths"].as_object() else {
        panic!("no paths")
    };
    for (path, item) in paths {
        let Some(item) = item.as_object() else {
            continue;
        };
        for (method, op) in item {
            if !["get", "post", "patch", "put", "delete"].contains(&method.as_str()) {
                continue;
            }
            if op["security"][0][APP].is_array() {
                out.push((method.to_uppercase(), path.clone(), vec![APP.to_owned()]));
                continue;
            }
            let scopes = op["security"][0]["bearer"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            out.push((method.to_uppercase(), path.clone(), scopes));
        }
    }
    out
}

/// The committed copy is byte for byte what the code generates, so a
/// change to a type or a route shows in review. `DHUKUTI_BLESS=1`
/// rewrites it (or `cargo run -- --openapi > docs/openapi.json`).
#[test]
fn the_committed_document_is_what_the_code_generates() {
    let path = repo_root().join(COMMITTED);
    let now = generated();
    if std::env::var("DHUKUTI_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &now).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    if committed != now {
        let first = committed
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(now.lines().count()));
        panic!(
            "{COMMITTED} is not what the code generates (first difference at line {}); \
             run `DHUKUTI_BLESS=1 bash infra/test.sh -p dhukuti-tests --test e2e openapi::` \
             or `cargo run -- --openapi > {COMMITTED}` and review the diff",
            first + 1
        );
    }
}

/// Every `error.code` the sources can answer with is listed in the
/// document (`edge::openapi::ERROR_CODES`), and every listed code is
/// still answered somewhere: read from the calls that set a code
/// (`Refusal::new(kind, "…")`, `Refusal::unprocessable("…")`,
/// `ApiError::new(status, type, "…")`, …), whitespace removed so a call
/// over several lines reads as one.
#[test]
fn every_error_code_is_documented() {
    const CALLS: [(&str, usize); 6] = [
        ("Refusal::new(", 1),
        ("Refusal::unprocessable(", 0),
        ("Refusal::conflict(", 0),
        ("Refusal::forbidden(", 0),
        ("ApiError::new(", 2),
        ("conflict(", 0),
    ];
    let mut found = BTreeSet::new();
    let mut dirs = vec![
        repo_root().join("shared/src"),
        repo_root().join("edge/src"),
        repo_root().join("functions"),
    ];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            // Not through links: functions/<binary>/target is the
            // workspace's target directory (template.yaml's CodeUri).
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs")
                || p.file_name().and_then(|n| n.to_str()) == Some("tests.rs")
            {
                continue;
            }
            let text: String = std::fs::read_to_string(&p)
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            // An inline test module (at the end of a file) calls these
            // with made-up codes.
            let text = text.split("#[cfg(test)]modtests{").next().unwrap_or("");
            for (call, skip) in CALLS {
                for (at, _) in text.match_indices(call) {
                    let mut rest = &text[at + call.len()..];
                    for _ in 0..skip {
                        rest = rest.split_once(',').map(|(_, r)| r).unwrap_or("");
                    }
                    if let Some(lit) = rest.strip_prefix('"')
                        && let Some((code, _)) = lit.split_once('"')
                    {
                        found.insert(code.to_owned());
                    }
                }
            }
        }
    }
    let listed: BTreeSet<String> = edge::openapi::ERROR_CODES
        .iter()
        .map(|(c, _)| (*c).to_owned())
        .collect();
    assert!(
        found.len() >= 20,
        "only {} codes found: {found:?}",
        found.len()
    );
    let undocumented: Vec<_> = found.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&found).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "codes answered but not in ERROR_CODES: {undocumented:?}; listed but never answered: {stale:?}"
    );
    let description = document()["info"]["description"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    for code in &listed {
        assert!(
            description.contains(&format!("`{code}`")),
            "{code} not described"
        );
    }
}

/// An independent OpenAPI 3.1 validator (from the test venv) accepts the
/// committed document.
#[test]
fn an_openapi_validator_accepts_the_document() {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let validator = python.with_file_name("openapi-spec-validator");
    let path = repo_root().join(COMMITTED);
    let out = std::process::Command::new(&validator)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", validator.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The document is OpenAPI 3.1 with every part a tool needs.
#[test]
fn the_document_describes_every_operation_fully() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let ops = operations(&doc);
    assert!(ops.len() >= 35, "only {} operations", ops.len());
    let mut ids = BTreeSet::new();
    for (method, path, scopes) in &ops {
        let op = &doc["paths"][path][method.to_lowercase()];
        let id = op["operationId"].as_str().unwrap_or("");
        assert!(!id.is_empty(), "{method} {path}: no operationId");
        assert!(ids.insert(id.to_owned()), "operationId {id} twice");
        assert!(!scopes.is_empty(), "{method} {path}: no scope");
        let app = scopes == &[APP];
        for s in scopes.iter().filter(|_| !app) {
            assert!(Scope::parse(s).is_some(), "{method} {path}: scope {s}");
        }
        let responses = op["responses"].as_object().cloned().unwrap_or_default();
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path}: no success answer"
        );
        for status in ["401", "403", "429"] {
            assert!(
                responses.contains_key(status),
                "{method} {path}: no {status}"
            );
        }
        let idempotent = op["parameters"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["name"] == "Idempotency-Key"));
        // An app's attempt is not: a retry starts a newer attempt, which
        // supersedes the first.
        assert_eq!(
            idempotent,
            method != "GET" && !path.ends_with("/pdf") && !app,
            "{method} {path}: Idempotency-Key documented where the layer is"
        );
        let success = responses
            .iter()
            .find(|(s, _)| s.starts_with('2'))
            .map(|(_, r)| r.clone())
            .unwrap_or_default();
        assert!(
            success["headers"]["X-Request-Id"].is_object(),
            "{method} {path}: X-Request-Id"
        );
    }
    let webhooks = doc["webhooks"].as_object().cloned().unwrap_or_default();
    for t in shared::domain::outbox::EventType::ALL {
        assert!(webhooks.contains_key(t.as_str()), "webhook {}", t.as_str());
    }
}

/// Every `/v1` route of the functions and of `template.yaml` is in the
/// document, and nothing else is: the route tables are the document's
/// source (`edge::openapi`), so no function may add a `/v1` route past it.
#[test]
fn the_document_and_the_route_tables_agree() {
    let doc = document();
    let documented: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .map(|(m, p, _)| (m, p))
        .collect();
    // No `.route("/v1…")` outside the documented tables.
    let functions = repo_root().join("functions");
    let dirs = std::fs::read_dir(&functions).unwrap_or_else(|e| panic!("{functions:?}: {e}"));
    for dir in dirs.flatten() {
        let src = dir.path().join("src");
        let Ok(files) = std::fs::read_dir(&src) else {
            continue;
        };
        for f in files.flatten() {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            let compact: String = text.split_whitespace().collect();
            assert!(
                !compact.contains(".route(\"/v1"),
                "{:?} adds a /v1 route outside `routes!`: it would be missing from the document",
                f.path()
            );
        }
    }
    // The deployed routes: every /v1 HttpApi event of template.yaml.
    let path = repo_root().join("template.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let t: serde_norway::Value =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut deployed = BTreeSet::new();
    if let Some(resources) = t["Resources"].as_mapping() {
        for f in resources.values() {
            let Some(events) = f["Properties"]["Events"].as_mapping() else {
                continue;
            };
            for e in events.values() {
                let p = e["Properties"]["Path"].as_str().unwrap_or("");
                if e["Type"].as_str() == Some("HttpApi") && p.starts_with("/v1/") {
                    let m = e["Properties"]["Method"].as_str().unwrap_or("");
                    deployed.insert((m.to_uppercase(), p.to_owned()));
                }
            }
        }
    }
    let missing: Vec<_> = deployed.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&deployed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "template.yaml routes missing from the document: {missing:?}; \
         documented but not deployed: {extra:?}"
    );
}

fn fill(path: &str) -> String {
    path.replace("{id}", "zz_0000000000")
}

/// Over HTTP: every documented operation is a route (a request without a
/// key is refused as unauthenticated, not as an unknown path or method),
/// a key lacking the documented scope gets 403 `missing_scope`, and a key
/// with only that scope gets past the scope check. The gateway serves the
/// document itself at `/openapi.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_is_served_with_its_documented_scope() {
    let Some(app) = spawn_app(Which::Embedded).await else {
        return;
    };
    let served = app.get("/openapi.json", None).await;
    assert_eq!(served.status, 200);
    assert_eq!(served.body, document(), "the served document");

    let tenant = app.tenant("Scope Teas", "owner@scope.example").await;
    // The demo project's publishable key, from the demo keys file.
    let publishable = match &app.running {
        Some(r) => r.keys.sandbox_publishable.clone(),
        None => panic!("the gateway stopped"),
    };
    assert!(publishable.starts_with("pk_test_"), "{publishable}");
    let doc = document();
    for (method, path, scopes) in operations(&doc) {
        let url = app.url(&fill(&path));
        let m = http::Method::from_bytes(method.as_bytes()).unwrap_or(http::Method::GET);
        let send = |key: Option<String>| {
            let mut req = app
                .client
                .request(m.clone(), &url)
                .header("content-type", "application/json")
                .body("{}");
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            async move {
                let res = req.send().await.unwrap_or_else(|e| panic!("{e}"));
                let status = res.status().as_u16();
                let body: Value = res.json().await.unwrap_or(Value::Null);
                (status, body)
            }
        };
        let (status, body) = send(None).await;
        assert_eq!(status, 401, "{method} {path} without a key: {body}");
        if scopes == [APP] {
            // An app's operation refuses a secret key, whatever it holds,
            // and with the publishable key but no client secret knows no
            // session.
            let full = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
            let (status, body) = send(Some(full)).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (403, Some("permission_denied")),
                "{method} {path} with a secret key: {body}"
            );
            let said = body["error"]["message"].as_str().unwrap_or("");
            assert!(said.contains("publishable key"), "{said}");
            // (A valid body: what is left to refuse is the session.)
            let res = app
                .client
                .request(m.clone(), &url)
                .header("content-type", "application/json")
                .body(r#"{"provider": "khalti"}"#)
                .bearer_auth(&publishable)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (404, Some("not_found")),
                "{method} {path} with the publishable key: {body}"
            );
            continue;
        }
        // A publishable key moves no money and reads nothing here.
        let (status, body) = send(Some(publishable.clone())).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("permission_denied")),
            "{method} {path} with a publishable key: {body}"
        );
        let said = body["error"]["message"].as_str().unwrap_or("");
        assert!(said.contains("publishable key"), "{said}");

        let wanted: Vec<Scope> = scopes.iter().filter_map(|s| Scope::parse(s)).collect();
        let others: Vec<Scope> = Scope::ALL
            .into_iter()
            .filter(|s| !wanted.contains(s))
            .collect();
        let without = app.key(&tenant, Mode::Sandbox, &others).await;
        let (status, body) = send(Some(without)).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("missing_scope")),
            "{method} {path} without {scopes:?}: {body}"
        );
        let with = app.key(&tenant, Mode::Sandbox, &wanted).await;
        let (status, body) = send(Some(with)).await;
        assert!(
            body["error"]["code"] != "missing_scope" && status != 401 && status < 500,
            "{method} {path} with only {scopes:?}: {status} {body}"
        );
    }
    app.stop().await;
}

/// A typed client generated from the document by a standard generator
/// (openapi-python-client, from the test venv) builds and does what a
/// merchant's server does: create a checkout, read it back, list, and get
/// a 404 typed as the error envelope (`tests/sdk/generated_client_smoke.py`).
/// The generator's one warning: it has no type for `application/pdf`
/// answers, so the invoice PDF operation returns raw bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_client_works() {
    let Some(python) = shared::testenv::python() else {
        return;
    };
    let generator = python.with_file_name("openapi-python-client");
    let out = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let config = out.path().join("config.yaml");
    std::fs::write(
        &config,
        "post_hooks: []\npackage_name_override: dhukuti_client\n",
    )
    .unwrap_or_else(|e| panic!("{config:?}: {e}"));
    let generated = std::process::Command::new(&generator)
        .args(["generate", "--meta", "none", "--path"])
        .arg(repo_root().join(COMMITTED))
        .arg("--config")
        .arg(&config)
        .arg("--output-path")
        .arg(out.path().join("dhukuti_client"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", generator.display()));
    assert!(
        generated.status.success(),
        "the generator failed:\n{}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );

    let Some(app) = spawn_app(Which::Embedded).await else {
        return;
    };
    let tenant = app.tenant("Client Teas", "owner@client.example").await;
    let key = app.key(&tenant, Mode::Sandbox, &Scope::ALL).await;
    let script = repo_root().join("tests/sdk/generated_client_smoke.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .args([app.base.as_str(), key.as_str()])
        .env("PYTHONPATH", out.path())
        .kill_on_drop(true)
        .output();
    let ran = match tokio::time::timeout(std::time::Duration::from_secs(120), run).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => panic!("{}: {e}", python.display()),
        Err(_) => panic!("the generated client took over 120 s"),
    };
    app.stop().await;
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success() && stdout.contains("generated client behaved"),
        "{stdout}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}
