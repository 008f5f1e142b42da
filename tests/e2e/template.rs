//! `template.yaml` is where the table is defined; the store's constants
//! must agree with it, and every function crate must be deployed.

use serde_norway::Value;
use shared::store::{Index, PK, SK, TTL};

fn template() -> Value {
    let path = format!("{}/../template.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn key_schema(v: &Value) -> Vec<(String, String)> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|k| {
                    (
                        k["AttributeName"].as_str().unwrap_or("").to_owned(),
                        k["KeyType"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pair(hash: &str, range: &str) -> Vec<(String, String)> {
    vec![(hash.into(), "HASH".into()), (range.into(), "RANGE".into())]
}

#[test]
fn the_table_in_template_yaml_matches_the_store() {
    let t = template();
    let table = &t["Resources"]["Table"];
    assert_eq!(table["Type"].as_str(), Some("AWS::DynamoDB::Table"));
    let props = &table["Properties"];
    assert_eq!(key_schema(&props["KeySchema"]), pair(PK, SK));
    let gsis = props["GlobalSecondaryIndexes"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert_eq!(gsis.len(), Index::ALL.len(), "one GSI per store::Index");
    for index in Index::ALL {
        let Some(gsi) = gsis
            .iter()
            .find(|g| g["IndexName"].as_str() == Some(index.name()))
        else {
            panic!("index {} missing from template.yaml", index.name())
        };
        assert_eq!(
            key_schema(&gsi["KeySchema"]),
            pair(index.pk_attr(), index.sk_attr())
        );
        assert_eq!(gsi["Projection"]["ProjectionType"].as_str(), Some("ALL"));
    }
    let attrs: Vec<&str> = props["AttributeDefinitions"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|a| a["AttributeName"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut expected = vec![PK, SK];
    for index in Index::ALL {
        expected.extend([index.pk_attr(), index.sk_attr()]);
    }
    assert_eq!(attrs, expected);
    assert_eq!(
        props["TimeToLiveSpecification"]["AttributeName"].as_str(),
        Some(TTL)
    );
    assert_eq!(
        props["TimeToLiveSpecification"]["Enabled"].as_bool(),
        Some(true)
    );
}

/// An index as (name, key schema, projection type).
type Gsi = (String, Vec<(String, String)>, String);

/// `dynamo::create_table` builds the table from `dynamo::table_schema()`;
/// that data must be exactly the table `template.yaml` deploys.
#[test]
fn the_dynamo_table_definition_matches_template_yaml() {
    let t = template();
    let props = &t["Resources"]["Table"]["Properties"];
    let schema = shared::store::dynamo::table_schema();
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(props["BillingMode"].as_str(), Some(schema.billing_mode));
    let attrs: Vec<(String, String)> = props["AttributeDefinitions"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| {
                    (
                        a["AttributeName"].as_str().unwrap_or("").to_owned(),
                        a["AttributeType"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(attrs, owned(&schema.attributes), "AttributeDefinitions");
    assert_eq!(
        key_schema(&props["KeySchema"]),
        owned(&schema.key_schema),
        "KeySchema"
    );
    let gsis: Vec<Gsi> = props["GlobalSecondaryIndexes"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .map(|g| {
                    (
                        g["IndexName"].as_str().unwrap_or("").to_owned(),
                        key_schema(&g["KeySchema"]),
                        g["Projection"]["ProjectionType"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let expected: Vec<Gsi> = schema
        .indexes
        .iter()
        .map(|i| {
            (
                i.name.to_owned(),
                owned(&i.key_schema),
                i.projection.to_owned(),
            )
        })
        .collect();
    assert_eq!(gsis, expected, "GlobalSecondaryIndexes");
    let ttl = &props["TimeToLiveSpecification"];
    assert_eq!(ttl["AttributeName"].as_str(), Some(schema.ttl_attribute));
    assert_eq!(ttl["Enabled"].as_bool(), Some(true));
    assert_eq!(
        props["StreamSpecification"]["StreamViewType"].as_str(),
        Some(schema.stream_view_type)
    );
}

#[test]
fn every_function_crate_is_a_cargo_lambda_function_in_template_yaml() {
    let t = template();
    let resources = t["Resources"].as_mapping().cloned().unwrap_or_default();
    let binaries: Vec<String> = resources
        .values()
        .filter(|r| r["Type"].as_str() == Some("AWS::Serverless::Function"))
        .map(|r| {
            assert_eq!(
                r["Metadata"]["BuildMethod"].as_str(),
                Some("rust-cargolambda")
            );
            r["Metadata"]["BuildProperties"]["Binary"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    let dir = format!("{}/../functions", env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    crates.sort();
    assert!(!crates.is_empty());
    for name in crates {
        assert!(
            binaries.contains(&name),
            "functions/{name} is not declared in template.yaml"
        );
    }
    let globals = &t["Globals"]["Function"];
    assert_eq!(globals["Runtime"].as_str(), Some("provided.al2023"));
    assert_eq!(globals["Architectures"][0].as_str(), Some("arm64"));
}

// ---- functions, routes and permissions ----

/// The function resource `name`, checked to be a cargo-lambda function
/// building `binary`.
fn function<'a>(t: &'a Value, name: &str, binary: &str) -> &'a Value {
    let f = &t["Resources"][name];
    assert_eq!(
        f["Type"].as_str(),
        Some("AWS::Serverless::Function"),
        "{name} is not a function"
    );
    assert_eq!(
        f["Metadata"]["BuildProperties"]["Binary"].as_str(),
        Some(binary),
        "{name} builds the wrong binary"
    );
    f
}

/// Every `AWS::Serverless::Function` as (logical id, resource).
pub(crate) fn functions(t: &Value) -> Vec<(String, Value)> {
    t["Resources"]
        .as_mapping()
        .map(|m| {
            m.iter()
                .filter(|(_, r)| r["Type"].as_str() == Some("AWS::Serverless::Function"))
                .map(|(k, r)| (k.as_str().unwrap_or("").to_owned(), r.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// An intrinsic function as (name without `Fn::` or `!`, argument), in its
/// short (`!Ref X`) or long (`{Ref: X}`) form.
fn intrinsic(v: &Value) -> Option<(String, Value)> {
    match v {
        Value::Tagged(t) => Some((
            t.tag.to_string().trim_start_matches('!').to_owned(),
            t.value.clone(),
        )),
        Value::Mapping(m) if m.len() == 1 => m.iter().next().and_then(|(k, arg)| {
            let k = k.as_str()?;
            let name = k.strip_prefix("Fn::").unwrap_or(k);
            (name == "Ref" || k.starts_with("Fn::")).then(|| (name.to_owned(), arg.clone()))
        }),
        _ => None,
    }
}

/// `!If [condition, then, else]` as (condition, then, else).
fn if_of(v: &Value) -> Option<(String, Value, Value)> {
    let (f, arg) = intrinsic(v)?;
    let parts = arg.as_sequence().filter(|_| f == "If")?;
    match parts.as_slice() {
        [cond, then, otherwise] => {
            Some((cond.as_str()?.to_owned(), then.clone(), otherwise.clone()))
        }
        _ => None,
    }
}

/// `!Ref name`?
fn is_ref_to(v: &Value, name: &str) -> bool {
    matches!(intrinsic(v), Some((f, arg)) if f == "Ref" && arg.as_str() == Some(name))
}

/// The (METHOD, path) of every HttpApi event of a function, with the event.
fn http_routes(f: &Value) -> Vec<(String, String, Value)> {
    f["Properties"]["Events"]
        .as_mapping()
        .map(|m| {
            m.values()
                .filter(|e| e["Type"].as_str() == Some("HttpApi"))
                .map(|e| {
                    (
                        e["Properties"]["Method"]
                            .as_str()
                            .unwrap_or("")
                            .to_uppercase(),
                        e["Properties"]["Path"].as_str().unwrap_or("").to_owned(),
                        e.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_hosted_pages_are_served_by_hosted_without_an_authorizer() {
    let t = template();
    let hosted = function(&t, "HostedFunction", "hosted");
    let mut routes: Vec<(String, String)> = http_routes(hosted)
        .into_iter()
        .map(|(method, path, event)| {
            assert!(
                is_ref_to(&event["Properties"]["ApiId"], "HttpApi"),
                "{method} {path} is not on HttpApi"
            );
            // No authorizer on the route: none at all, or explicitly NONE.
            let auth = &event["Properties"]["Auth"];
            assert!(
                auth.is_null() || auth["Authorizer"].as_str() == Some("NONE"),
                "{method} {path} has an authorizer: {auth:?}"
            );
            (method, path)
        })
        .collect();
    routes.sort();
    let mut expected: Vec<(String, String)> = [
        ("GET", "/c/{id}"),
        ("POST", "/c/{id}/pay"),
        ("GET", "/c/{id}/status"),
        ("GET", "/c/{id}/events"),
        ("GET", "/c/{id}/return/{payment}/{outcome}"),
        ("POST", "/c/{id}/return/{payment}/{outcome}"),
        ("GET", "/c/{id}/qr/{payment}"),
        ("GET", "/l/{id}"),
        ("POST", "/l/{id}"),
        ("GET", "/l/{id}/thanks"),
        ("GET", "/b/{id}"),
        ("POST", "/b/{id}"),
        ("GET", "/r/{token}"),
        ("HEAD", "/r/{token}"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(routes, expected);
    // Nor one by default on the API (routes without Auth would inherit it).
    let api_auth = &t["Resources"]["HttpApi"]["Properties"]["Auth"];
    assert!(
        api_auth["DefaultAuthorizer"].is_null()
            || api_auth["DefaultAuthorizer"].as_str() == Some("NONE"),
        "HttpApi has a default authorizer: {api_auth:?}"
    );
}

#[test]
fn no_two_functions_claim_the_same_route() {
    let t = template();
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for (name, f) in functions(&t) {
        for (method, path, _) in http_routes(&f) {
            if let Some((other, _, _)) = seen.iter().find(|(_, m, p)| *m == method && *p == path) {
                panic!("{method} {path} is claimed by {other} and {name}");
            }
            seen.push((name.clone(), method, path));
        }
    }
    assert!(seen.len() >= 6);
}

#[test]
fn the_scheduler_sweeps_every_minute_one_run_at_a_time() {
    let t = template();
    let scheduler = function(&t, "SchedulerFunction", "scheduler");
    let props = &scheduler["Properties"];
    let schedules: Vec<&Value> = props["Events"]
        .as_mapping()
        .map(|m| {
            m.values()
                .filter(|e| e["Type"].as_str() == Some("Schedule"))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(schedules.len(), 1, "one Schedule event");
    assert_eq!(
        schedules[0]["Properties"]["Schedule"].as_str(),
        Some("rate(1 minute)")
    );
    assert_ne!(
        schedules[0]["Properties"]["Enabled"].as_bool(),
        Some(false),
        "the sweep schedule is disabled"
    );
    assert_eq!(props["ReservedConcurrentExecutions"].as_u64(), Some(1));
    // A run ends (or is cut) before the next minute's starts.
    let timeout = props["Timeout"].as_u64();
    assert!(
        matches!(timeout, Some(1..=60)),
        "Timeout {timeout:?} must be at most the 60 s period"
    );
    // An event throttled by the concurrency of 1 or a failed run is not
    // queued and retried: the next run does the same work.
    let invoke = &props["EventInvokeConfig"];
    assert_eq!(invoke["MaximumRetryAttempts"].as_u64(), Some(0));
    assert!(
        matches!(invoke["MaximumEventAgeInSeconds"].as_u64(), Some(60..=120)),
        "{invoke:?}"
    );
    // Only HTTP functions have HTTP routes; the scheduler is not public.
    assert!(http_routes(scheduler).is_empty());
}

/// The functions that talk to a provider: Hosted (payments), Qr (Fonepay's
/// QR API for Direct-QR), Mobile (an app's attempts and status checks),
/// Events (the event streams' status checks),
/// Refunds (Khalti's refund API), Reconciliation (settle from provider
/// verifies with it; Khalti's transaction list) and Scheduler
/// (reconciliation of payments and refunds).
const PROVIDER_CALLERS: [&str; 8] = [
    "DashboardFunction",
    "EventsFunction",
    "HostedFunction",
    "MobileFunction",
    "QrFunction",
    "ReconciliationFunction",
    "RefundsFunction",
    "SchedulerFunction",
];

/// The functions that hold webhook signing secrets, sealed with the same
/// master key: Webhooks (seals a new endpoint's secret) and
/// WebhookDispatcher (opens it to sign each delivery).
const SECRET_HOLDERS: [&str; 2] = ["WebhookDispatcherFunction", "WebhooksFunction"];

/// Which functions get the credentials master key: exactly the ones that
/// open sealed credentials to talk to a provider, and the ones that seal
/// or open webhook signing secrets. They get the ARN of the Secrets
/// Manager secret holding it (read at cold start), never the key: no
/// function's environment holds a key, and Globals passes neither.
#[test]
fn the_credentials_key_reaches_only_the_functions_that_call_providers() {
    use shared::domain::credentials::{KEY_ENV, KEY_SECRET_ENV, PREVIOUS_KEYS_ENV};
    let t = template();
    assert!(
        t["Parameters"]["CredentialsKey"].is_null(),
        "the key itself is no stack parameter"
    );
    let param = &t["Parameters"]["CredentialsKeySecretArn"];
    assert_eq!(param["Type"].as_str(), Some("String"));
    assert!(
        param["Default"].is_null(),
        "CredentialsKeySecretArn must be given (an empty ARN grants nothing)"
    );
    let pattern = param["AllowedPattern"].as_str().unwrap_or("");
    assert!(pattern.contains(":secretsmanager:"), "{pattern}");
    let globals = &t["Globals"]["Function"]["Environment"]["Variables"];
    for var in [KEY_ENV, KEY_SECRET_ENV, PREVIOUS_KEYS_ENV] {
        assert!(globals[var].is_null(), "{var} must not be global");
    }
    let mut with_key: Vec<String> = functions(&t)
        .into_iter()
        .filter_map(|(name, f)| {
            let vars = &f["Properties"]["Environment"]["Variables"];
            for var in [KEY_ENV, PREVIOUS_KEYS_ENV] {
                assert!(vars[var].is_null(), "{name}: a plain key in {var}");
            }
            let v = &vars[KEY_SECRET_ENV];
            if v.is_null() {
                return None;
            }
            assert!(
                is_ref_to(v, "CredentialsKeySecretArn"),
                "{name}: {KEY_SECRET_ENV} is {v:?}"
            );
            Some(name)
        })
        .collect();
    with_key.sort();
    let mut expected: Vec<&str> = PROVIDER_CALLERS
        .iter()
        .chain(&SECRET_HOLDERS)
        .copied()
        .collect();
    expected.sort();
    assert_eq!(with_key, expected);
}

/// Secrets Manager: exactly the functions that get the secret's ARN may
/// read it, with GetSecretValue on that ARN alone (no wildcard, no other
/// secret, no other action); nobody else has any Secrets Manager right,
/// and no SAM policy template grants one behind the test's back.
#[test]
fn only_the_key_holders_may_read_the_credentials_key_secret() {
    let t = template();
    let mut readers = Vec::new();
    for (name, f) in functions(&t) {
        for policy in f["Properties"]["Policies"]
            .as_sequence()
            .cloned()
            .unwrap_or_default()
        {
            // A managed policy by name, or a SAM policy template.
            let names: Vec<String> = match &policy {
                Value::String(n) => vec![n.clone()],
                Value::Mapping(m) => m
                    .keys()
                    .filter_map(|k| k.as_str())
                    .filter(|k| *k != "Statement")
                    .map(str::to_owned)
                    .collect(),
                _ => Vec::new(),
            };
            for n in names {
                assert!(!n.contains("Secret"), "{name}: policy {n}");
            }
        }
        let mut grants = Vec::new();
        for st in statements(&f) {
            let actions = actions_of(&st);
            if !actions.iter().any(|a| a.starts_with("secretsmanager:")) {
                continue;
            }
            assert_eq!(st["Effect"].as_str(), Some("Allow"), "{name}: {st:?}");
            assert_eq!(
                actions,
                ["secretsmanager:GetSecretValue"],
                "{name}: only GetSecretValue, alone in its statement"
            );
            assert!(st["Condition"].is_null(), "{name}: {st:?}");
            let resources: Vec<Value> = match &st["Resource"] {
                Value::Sequence(s) => s.clone(),
                one => vec![one.clone()],
            };
            assert_eq!(resources.len(), 1, "{name}: {resources:?}");
            assert!(
                is_ref_to(&resources[0], "CredentialsKeySecretArn"),
                "{name}: GetSecretValue on {:?}",
                resources[0]
            );
            grants.push(());
        }
        match grants.len() {
            0 => {}
            1 => readers.push(name),
            n => panic!("{name}: {n} Secrets Manager statements"),
        }
    }
    readers.sort();
    let mut expected: Vec<&str> = PROVIDER_CALLERS
        .iter()
        .chain(&SECRET_HOLDERS)
        .copied()
        .collect();
    expected.sort();
    assert_eq!(readers, expected);
}

/// The gateway's own Khalti sandbox key goes where the credentials key
/// goes (a sandbox refund or reconciliation of a project without its own
/// Khalti key needs it as much as the payment did), and nowhere else.
#[test]
fn the_sandbox_khalti_key_reaches_only_the_functions_that_call_providers() {
    const ENV: &str = "DHUKUTI_SANDBOX_KHALTI_SECRET_KEY";
    let t = template();
    let param = &t["Parameters"]["SandboxKhaltiSecretKey"];
    assert_eq!(param["Type"].as_str(), Some("String"));
    assert_eq!(param["NoEcho"].as_bool(), Some(true));
    assert!(
        t["Globals"]["Function"]["Environment"]["Variables"][ENV].is_null(),
        "{ENV} must not be global"
    );
    let mut with_key: Vec<String> = functions(&t)
        .into_iter()
        .filter_map(|(name, f)| {
            let v = &f["Properties"]["Environment"]["Variables"][ENV];
            if v.is_null() {
                return None;
            }
            assert!(
                is_ref_to(v, "SandboxKhaltiSecretKey"),
                "{name}: {ENV} is {v:?}"
            );
            Some(name)
        })
        .collect();
    with_key.sort();
    assert_eq!(with_key, PROVIDER_CALLERS);
}

/// The DynamoDB actions a function is granted on the table itself.
fn table_actions(f: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for policy in f["Properties"]["Policies"]
        .as_sequence()
        .cloned()
        .unwrap_or_default()
    {
        for st in policy["Statement"]
            .as_sequence()
            .cloned()
            .unwrap_or_default()
        {
            let resources: Vec<Value> = match &st["Resource"] {
                Value::Sequence(s) => s.clone(),
                one => vec![one.clone()],
            };
            if !resources.iter().any(|r| target(r) == Target::Table) {
                continue;
            }
            match &st["Action"] {
                Value::String(a) => out.push(a.clone()),
                Value::Sequence(s) => {
                    out.extend(s.iter().filter_map(|a| a.as_str()).map(str::to_owned))
                }
                _ => {}
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether a function may Query every index (`${Table.Arn}/index/*`).
/// Whether `f` may query the index `index` (named, or all of them).
fn queries_index(f: &Value, index: &str) -> bool {
    let named = format!("${{Table.Arn}}/index/{index}");
    f["Properties"]["Policies"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default())
        .any(|st| {
            let queries = match &st["Action"] {
                Value::String(a) => a == "dynamodb:Query",
                Value::Sequence(s) => s.iter().any(|a| a.as_str() == Some("dynamodb:Query")),
                _ => false,
            };
            let resources = match &st["Resource"] {
                Value::Sequence(s) => s.clone(),
                one => vec![one.clone()],
            };
            queries
                && resources.iter().any(|r| {
                    matches!(intrinsic(r), Some((f, arg)) if f == "Sub"
                        && (arg.as_str() == Some(named.as_str())
                            || arg.as_str() == Some("${Table.Arn}/index/*")))
                })
        })
}

/// `GET /v1/sessions` counts the project's open sessions past their time
/// (its `gsi2` partition) for `meta.total`; the sweep and the pages find
/// open work there too.
#[test]
fn the_functions_reading_open_sessions_may_query_gsi2() {
    let t = template();
    for (name, binary) in [
        ("CheckoutFunction", "checkout"),
        ("SchedulerFunction", "scheduler"),
    ] {
        assert!(
            queries_index(function(&t, name, binary), "gsi2"),
            "{name} may not query gsi2"
        );
    }
}

fn queries_every_index(f: &Value) -> bool {
    f["Properties"]["Policies"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default())
        .any(|st| {
            let actions = match &st["Action"] {
                Value::String(a) => vec![a.clone()],
                Value::Sequence(s) => s
                    .iter()
                    .filter_map(|a| a.as_str())
                    .map(str::to_owned)
                    .collect(),
                _ => Vec::new(),
            };
            let resource = match &st["Resource"] {
                Value::Sequence(s) => s.first().cloned().unwrap_or(Value::Null),
                one => one.clone(),
            };
            actions.iter().any(|a| a == "dynamodb:Query")
                && matches!(intrinsic(&resource), Some((f, arg)) if f == "Sub"
                    && arg.as_str() == Some("${Table.Arn}/index/*"))
        })
}

/// The refunds API is the refunds function's, on the HTTP API, with what
/// a refund transaction and its idempotency claim need on the table.
#[test]
fn the_refunds_function_serves_the_refund_routes() {
    let t = template();
    let refunds = function(&t, "RefundsFunction", "refunds");
    let mut routes: Vec<(String, String)> = http_routes(refunds)
        .into_iter()
        .map(|(method, path, event)| {
            assert!(
                is_ref_to(&event["Properties"]["ApiId"], "HttpApi"),
                "{method} {path} is not on HttpApi"
            );
            (method, path)
        })
        .collect();
    routes.sort();
    let mut expected: Vec<(String, String)> = [
        ("POST", "/v1/refunds"),
        ("GET", "/v1/refunds"),
        ("GET", "/v1/refunds/{id}"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(routes, expected);
    assert_eq!(
        table_actions(refunds),
        [
            "dynamodb:ConditionCheckItem",
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
        ]
    );
    assert!(
        queries_every_index(refunds),
        "RefundsFunction: Query on the indexes"
    );
}

/// The account function serves the account and the analytics overview,
/// and only reads: items by key and the day counters (one table Query).
#[test]
fn the_account_function_serves_account_and_analytics() {
    let t = template();
    let account = function(&t, "AccountFunction", "account");
    let mut routes: Vec<(String, String)> = http_routes(account)
        .into_iter()
        .map(|(method, path, event)| {
            assert!(
                is_ref_to(&event["Properties"]["ApiId"], "HttpApi"),
                "{method} {path} is not on HttpApi"
            );
            (method, path)
        })
        .collect();
    routes.sort();
    assert_eq!(
        routes,
        vec![
            ("GET".to_owned(), "/v1/account".to_owned()),
            ("GET".to_owned(), "/v1/analytics/overview".to_owned()),
        ]
    );
    assert_eq!(
        table_actions(account),
        ["dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem"]
    );
}

/// Every function with an authenticated API route counts its calls in the
/// per-key rate-limit counter and stamps the key's `last_used_at`: both are
/// table UpdateItem calls.
#[test]
fn every_api_function_may_count_its_calls() {
    let t = template();
    for (name, f) in functions(&t) {
        // The hosted pages and the API reference take no key.
        if http_routes(&f).is_empty() || ["HostedFunction", "DocsFunction"].contains(&name.as_str())
        {
            continue;
        }
        assert!(
            table_actions(&f).iter().any(|a| a == "dynamodb:UpdateItem"),
            "{name} cannot update the rate-limit counter"
        );
    }
}

/// The payment links API is the payment links function's, on the HTTP
/// API, with what a link and its idempotency claim need on the table: the
/// claim is a conditional put, then an update or a delete, and a fence is
/// a conditional put too, so no ConditionCheckItem. It calls no provider.
#[test]
fn the_payment_links_function_serves_the_payment_link_routes() {
    let t = template();
    let links = function(&t, "PaymentLinksFunction", "payment-links");
    let mut routes: Vec<(String, String)> = http_routes(links)
        .into_iter()
        .map(|(method, path, event)| {
            assert!(
                is_ref_to(&event["Properties"]["ApiId"], "HttpApi"),
                "{method} {path} is not on HttpApi"
            );
            (method, path)
        })
        .collect();
    routes.sort();
    let mut expected: Vec<(String, String)> = [
        ("POST", "/v1/payment-links"),
        ("GET", "/v1/payment-links"),
        ("GET", "/v1/payment-links/{id}"),
        ("PATCH", "/v1/payment-links/{id}"),
        ("DELETE", "/v1/payment-links/{id}"),
        ("POST", "/v1/payment-links/{id}/cancel"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(routes, expected);
    assert_eq!(
        table_actions(links),
        [
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
        ]
    );
    assert!(
        queries_every_index(links),
        "PaymentLinksFunction: Query on the indexes"
    );
    // It calls no provider: no credentials key, no sandbox key.
    let vars = &links["Properties"]["Environment"]["Variables"];
    for env in [
        shared::domain::credentials::KEY_ENV,
        shared::domain::credentials::KEY_SECRET_ENV,
        "DHUKUTI_SANDBOX_KHALTI_SECRET_KEY",
    ] {
        assert!(vars[env].is_null(), "PaymentLinksFunction gets {env}");
    }
}

/// The one-time invoices API is the invoices function's, on the HTTP API,
/// with what its writes need on the table: the idempotency claim
/// (Put/Update/Delete), the draft insert and its fence (conditional Put),
/// patch and adjustment (Put on the version), discard (Delete), the
/// finalize transaction (invoice and counter Updates), the correction
/// transaction (two Puts and an Update or a ConditionCheck of the open
/// checkout session) and the checkout transaction (session Put, invoice
/// Update); the list and its total on gsi1. It reads and writes the PDFs
/// in the documents bucket, under `invoices/` only. It calls no provider.
#[test]
fn the_invoices_function_serves_the_invoice_routes() {
    let t = template();
    let invoices = function(&t, "InvoicesFunction", "invoices");
    let mut routes: Vec<(String, String)> = http_routes(invoices)
        .into_iter()
        .map(|(method, path, event)| {
            assert!(
                is_ref_to(&event["Properties"]["ApiId"], "HttpApi"),
                "{method} {path} is not on HttpApi"
            );
            (method, path)
        })
        .collect();
    routes.sort();
    let mut expected: Vec<(String, String)> = [
        ("POST", "/v1/invoices"),
        ("GET", "/v1/invoices"),
        ("GET", "/v1/invoices/{id}"),
        ("PATCH", "/v1/invoices/{id}"),
        ("POST", "/v1/invoices/{id}/finalize"),
        ("POST", "/v1/invoices/{id}/discard"),
        ("POST", "/v1/invoices/{id}/correct"),
        ("POST", "/v1/invoices/{id}/adjustments"),
        ("POST", "/v1/invoices/{id}/checkout"),
        ("GET", "/v1/invoices/{id}/pdf"),
        ("GET", "/v1/billing/invoices/{id}/pdf"),
        // The bill page's PDF, keyless as the page.
        ("GET", "/b/{id}/pdf"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(routes, expected);
    assert_eq!(
        table_actions(invoices),
        [
            "dynamodb:ConditionCheckItem",
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        ]
    );
    assert!(
        queries_every_index(invoices),
        "InvoicesFunction: Query on the indexes (the list and its COUNT on gsi1)"
    );
    assert_eq!(
        s3_grants(invoices),
        [
            (
                "s3:GetObject".to_owned(),
                "${DocumentsBucket.Arn}/invoices/*".to_owned()
            ),
            ("s3:ListBucket".to_owned(), "DocumentsBucket.Arn".to_owned()),
            (
                "s3:PutObject".to_owned(),
                "${DocumentsBucket.Arn}/invoices/*".to_owned()
            ),
        ]
    );
    // Listing (for NoSuchKey instead of AccessDenied) only under invoices/.
    let list_conditions: Vec<Value> = statements(invoices)
        .into_iter()
        .filter(|st| actions_of(st).iter().any(|a| a == "s3:ListBucket"))
        .map(|st| st["Condition"]["StringLike"]["s3:prefix"].clone())
        .collect();
    assert_eq!(
        list_conditions,
        [Value::String("invoices/*".into())],
        "s3:ListBucket must be limited to the invoices/ prefix"
    );
    // The bucket reaches the function as DHUKUTI_BUCKET (from Globals).
    let bucket_env = {
        let own = &invoices["Properties"]["Environment"]["Variables"]["DHUKUTI_BUCKET"];
        if own.is_null() {
            &t["Globals"]["Function"]["Environment"]["Variables"]["DHUKUTI_BUCKET"]
        } else {
            own
        }
    };
    assert!(
        is_ref_to(bucket_env, "DocumentsBucket"),
        "DHUKUTI_BUCKET is {bucket_env:?}"
    );
    // A PDF is rendered in the request: more memory than the default, and
    // within API Gateway's 30 s.
    let memory = invoices["Properties"]["MemorySize"]
        .as_u64()
        .or_else(|| t["Globals"]["Function"]["MemorySize"].as_u64());
    assert!(matches!(memory, Some(512..=2048)), "MemorySize {memory:?}");
    let timeout = invoices["Properties"]["Timeout"]
        .as_u64()
        .or_else(|| t["Globals"]["Function"]["Timeout"].as_u64());
    assert!(matches!(timeout, Some(1..=30)), "Timeout {timeout:?}");
    // It calls no provider and sends no message.
    let vars = &invoices["Properties"]["Environment"]["Variables"];
    for env in [
        shared::domain::credentials::KEY_ENV,
        shared::domain::credentials::KEY_SECRET_ENV,
        "DHUKUTI_SANDBOX_KHALTI_SECRET_KEY",
    ] {
        assert!(vars[env].is_null(), "InvoicesFunction gets {env}");
    }
    assert!(queue_actions(invoices, "WebhookQueue").is_empty());
}

/// A payment for an invoice's checkout is allocated to the invoice (a Put
/// conditioned on its version, and `invoice.paid` to the outbox) in the
/// transaction that settles it: wherever payments settle (the hosted
/// returns and status polls, the scheduler's reconciler) the invoice can
/// be read and written.
#[test]
fn the_functions_that_settle_payments_may_write_the_invoice() {
    let t = template();
    for (name, binary) in [
        ("HostedFunction", "hosted"),
        ("SchedulerFunction", "scheduler"),
    ] {
        let actions = table_actions(function(&t, name, binary));
        for needed in ["dynamodb:GetItem", "dynamodb:PutItem"] {
            assert!(
                actions.iter().any(|a| a == needed),
                "{name} lacks {needed}: {actions:?}"
            );
        }
    }
}

/// Only the invoices function and the dashboard's documents function (an
/// invoice's PDF; an export's file, read only) may touch the documents
/// bucket, the exports and statements functions their own prefixes, and
/// no function gets S3 rights anywhere else.
#[test]
fn only_the_invoices_and_dashboard_functions_touch_the_documents_bucket() {
    let t = template();
    let mut holders = Vec::new();
    for (name, f) in functions(&t) {
        let grants = s3_grants(&f);
        for (action, resource) in &grants {
            // Exports (issue 41) have their own prefix and functions.
            let reports = ["ReportsFunction", "ReportRunnerFunction"].contains(&name.as_str());
            assert!(
                if reports {
                    resource == "${DocumentsBucket.Arn}/reports/*"
                } else if name == "ReconciliationFunction" {
                    // Statement files (issue 41) have theirs.
                    resource == "${DocumentsBucket.Arn}/statements/*"
                } else if name == "DashboardDocumentsFunction"
                    && resource == "${DocumentsBucket.Arn}/reports/*"
                {
                    // The dashboard's export download signs a GET with
                    // its role: reading the files, nothing else.
                    action == "s3:GetObject"
                } else {
                    resource == "DocumentsBucket.Arn"
                        || resource.starts_with("${DocumentsBucket.Arn}/invoices/")
                },
                "{name}: {action} on {resource}"
            );
            assert!(
                !action.contains('*') && !action.contains("Delete"),
                "{name}: {action}"
            );
        }
        if !grants.is_empty() {
            holders.push(name);
        }
    }
    holders.sort();
    assert_eq!(
        holders,
        [
            "DashboardDocumentsFunction",
            "InvoicesFunction",
            "ReconciliationFunction",
            "ReportRunnerFunction",
            "ReportsFunction"
        ]
    );
}

/// Every policy statement of a function.
fn statements(f: &Value) -> Vec<Value> {
    f["Properties"]["Policies"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default())
        .collect()
}

/// The actions of a statement (one or a list).
fn actions_of(st: &Value) -> Vec<String> {
    match &st["Action"] {
        Value::String(a) => vec![a.clone()],
        Value::Sequence(s) => s
            .iter()
            .filter_map(|a| a.as_str())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The S3 grants of a function as (action, resource), sorted; the resource
/// as `Resource.Attribute` for `!GetAtt`, the text of a `!Sub`, else as
/// written.
fn s3_grants(f: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for st in statements(f) {
        let resources: Vec<Value> = match &st["Resource"] {
            Value::Sequence(s) => s.clone(),
            one => vec![one.clone()],
        };
        for action in actions_of(&st).into_iter().filter(|a| a.starts_with("s3:")) {
            for r in &resources {
                let resource = match (get_att(r), intrinsic(r)) {
                    (Some((res, attr)), _) => format!("{res}.{attr}"),
                    (None, Some((f, arg))) if f == "Sub" => {
                        arg.as_str().unwrap_or_default().to_owned()
                    }
                    _ => format!("{r:?}"),
                };
                out.push((action.clone(), resource));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A session ending (expired by the API or lazily on read, or its payment
/// failed on the hosted pages) gives its payment link's held use back in
/// the same transaction (an Update of the session and one of the link);
/// the link page counts views and opens a session in a transaction of an
/// Update of the link and a Put of the session.
#[test]
fn link_uses_are_held_and_released_by_functions_that_may() {
    let t = template();
    for (name, binary, needed) in [
        (
            "HostedFunction",
            "hosted",
            &[
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:ConditionCheckItem",
            ][..],
        ),
        (
            "CheckoutFunction",
            "checkout",
            &["dynamodb:GetItem", "dynamodb:UpdateItem"][..],
        ),
    ] {
        let actions = table_actions(function(&t, name, binary));
        for needed in needed {
            assert!(
                actions.iter().any(|a| a == needed),
                "{name} lacks {needed}: {actions:?}"
            );
        }
    }
}

/// A checkout that names a provider needing the project's credentials
/// checks that they exist inside its transaction (no read before it).
#[test]
fn a_checkout_may_check_credentials_in_its_transaction() {
    let t = template();
    let actions = table_actions(function(&t, "CheckoutFunction", "checkout"));
    assert!(
        actions.iter().any(|a| a == "dynamodb:ConditionCheckItem"),
        "{actions:?}"
    );
}

/// The sweep resolves refunds left pending as well as payments: the same
/// item rights as Refunds on the table, and the indexes.
#[test]
fn the_scheduler_may_do_what_resolving_a_refund_needs() {
    let t = template();
    let scheduler = function(&t, "SchedulerFunction", "scheduler");
    let actions = table_actions(scheduler);
    for needed in [
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:ConditionCheckItem",
        "dynamodb:Query",
    ] {
        assert!(
            actions.iter().any(|a| a == needed),
            "SchedulerFunction lacks {needed}: {actions:?}"
        );
    }
    assert!(
        queries_every_index(scheduler),
        "SchedulerFunction: Query on the indexes"
    );
    // The outbox backstop queues the first attempts it fans out.
    assert_eq!(
        queue_actions(scheduler, "WebhookQueue"),
        ["sqs:SendMessage"]
    );
}

/// What a statement's resource is.
#[derive(Debug, PartialEq)]
enum Target {
    Table,
    Index,
    Other,
}

fn target(v: &Value) -> Target {
    match intrinsic(v) {
        Some((f, arg)) if f == "GetAtt" => {
            let parts: Vec<String> = match &arg {
                Value::String(s) => s.split('.').map(str::to_owned).collect(),
                Value::Sequence(s) => s
                    .iter()
                    .map(|p| p.as_str().unwrap_or("").to_owned())
                    .collect(),
                _ => Vec::new(),
            };
            if parts == ["Table", "Arn"] {
                Target::Table
            } else {
                Target::Other
            }
        }
        Some((f, arg)) if f == "Sub" => match arg.as_str() {
            Some(s) if s.starts_with("${Table.Arn}/index/") => Target::Index,
            _ => Target::Other,
        },
        _ => Target::Other,
    }
}

/// Every DynamoDB grant of every function: IAM actions that exist, item
/// actions on the table only, Query (or Scan) only on the indexes. IAM has
/// no `TransactWriteItems`/`TransactGetItems` action: a transaction is
/// authorized item by item (PutItem, UpdateItem, DeleteItem,
/// ConditionCheckItem, GetItem), so listing them grants nothing and hides
/// a missing item permission.
#[test]
fn dynamodb_grants_are_real_actions_on_the_right_resources() {
    const ITEM: [&str; 5] = [
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:ConditionCheckItem",
    ];
    const READ_MANY: [&str; 2] = ["dynamodb:Query", "dynamodb:Scan"];
    let t = template();
    let mut checked = 0;
    for (name, f) in functions(&t) {
        let policies = f["Properties"]["Policies"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        if name == "DocsFunction" {
            // The API reference is built into the binary: no AWS rights.
            assert!(policies.is_empty(), "{name} needs no policy: {policies:?}");
            continue;
        }
        assert!(!policies.is_empty(), "{name} has no policy");
        for policy in &policies {
            let statements = policy["Statement"]
                .as_sequence()
                .cloned()
                .unwrap_or_default();
            for st in statements
                .iter()
                .filter(|st| st["Effect"].as_str() != Some("Deny"))
            {
                let actions: Vec<String> = match &st["Action"] {
                    Value::String(a) => vec![a.clone()],
                    Value::Sequence(s) => s
                        .iter()
                        .map(|a| a.as_str().unwrap_or("").to_owned())
                        .collect(),
                    other => panic!("{name}: Action {other:?}"),
                };
                let resources: Vec<Value> = match &st["Resource"] {
                    Value::Sequence(s) => s.clone(),
                    one => vec![one.clone()],
                };
                for action in actions.iter().filter(|a| a.starts_with("dynamodb:")) {
                    assert!(
                        ITEM.contains(&action.as_str()) || READ_MANY.contains(&action.as_str()),
                        "{name}: {action} is not a DynamoDB action a function needs (wildcard, or not an IAM action)"
                    );
                    for r in &resources {
                        match target(r) {
                            Target::Table => {}
                            Target::Index => assert!(
                                READ_MANY.contains(&action.as_str()),
                                "{name}: {action} on an index"
                            ),
                            Target::Other => panic!("{name}: {action} on {r:?}"),
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}

/// SAM attaches an AWS managed policy to a function with a queue or
/// stream trigger (AWSLambdaSQSQueueExecutionRole,
/// AWSLambdaDynamoDBExecutionRole) whose read rights are on every queue
/// or stream (`Resource: "*"`). Each such function denies those actions
/// on everything but its own trigger, so it can read no other queue or
/// stream; every Deny is one of these fences.
#[test]
fn queue_and_stream_triggers_read_only_their_own_source() {
    /// A Deny as (sorted actions, `!GetAtt` of its NotResource).
    type Fence = (Vec<String>, Option<(String, String)>);
    const SQS: [&str; 3] = [
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "sqs:ReceiveMessage",
    ];
    const STREAM: [&str; 3] = [
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
    ];
    let t = template();
    let mut fenced = Vec::new();
    for (name, f) in functions(&t) {
        let denies: Vec<Fence> = statements(&f)
            .into_iter()
            .filter(|st| st["Effect"].as_str() == Some("Deny"))
            .map(|st| {
                assert!(st["Resource"].is_null(), "{name}: a Deny names NotResource");
                let mut actions = actions_of(&st);
                actions.sort();
                (actions, get_att(&st["NotResource"]))
            })
            .collect();
        let mut expected = Vec::new();
        for event in events_of(&f, "SQS") {
            let queue = get_att(&event["Properties"]["Queue"]);
            assert!(queue.is_some(), "{name}: SQS trigger {event:?}");
            expected.push((SQS.map(str::to_owned).to_vec(), queue));
        }
        for event in events_of(&f, "DynamoDB") {
            let stream = get_att(&event["Properties"]["Stream"]);
            assert!(stream.is_some(), "{name}: stream trigger {event:?}");
            expected.push((STREAM.map(str::to_owned).to_vec(), stream));
        }
        assert_eq!(denies, expected, "{name}");
        if !expected.is_empty() {
            fenced.push(name);
        }
    }
    fenced.sort();
    assert_eq!(
        fenced,
        [
            "MailDispatcherFunction",
            "SmsDispatcherFunction",
            "WebhookDispatcherFunction",
            "WebhookFanoutFunction"
        ]
    );
}

// ---- webhooks ----

/// `!GetAtt Resource.Attribute` (either form) as (resource, attribute).
fn get_att(v: &Value) -> Option<(String, String)> {
    let (f, arg) = intrinsic(v)?;
    if f != "GetAtt" {
        return None;
    }
    let parts: Vec<String> = match &arg {
        Value::String(s) => s.splitn(2, '.').map(str::to_owned).collect(),
        Value::Sequence(s) => s
            .iter()
            .map(|p| p.as_str().unwrap_or("").to_owned())
            .collect(),
        _ => return None,
    };
    match parts.as_slice() {
        [resource, attribute] => Some((resource.clone(), attribute.clone())),
        _ => None,
    }
}

/// The actions a function is granted on the SQS queue `queue` (logical
/// id), through `!GetAtt <queue>.Arn`.
fn queue_actions(f: &Value, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    for st in f["Properties"]["Policies"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default())
    {
        let resources: Vec<Value> = match &st["Resource"] {
            Value::Sequence(s) => s.clone(),
            one => vec![one.clone()],
        };
        let on_queue = resources
            .iter()
            .any(|r| get_att(r) == Some((queue.to_owned(), "Arn".to_owned())));
        if !on_queue {
            continue;
        }
        match &st["Action"] {
            Value::String(a) => out.push(a.clone()),
            Value::Sequence(s) => {
                out.extend(s.iter().filter_map(|a| a.as_str()).map(str::to_owned))
            }
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The events of type `kind` (`SQS`, `DynamoDB`, ...) of a function.
fn events_of(f: &Value, kind: &str) -> Vec<Value> {
    f["Properties"]["Events"]
        .as_mapping()
        .map(|m| {
            m.values()
                .filter(|e| e["Type"].as_str() == Some(kind))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The webhook endpoints API is the webhooks function's, on the HTTP API,
/// with what endpoints, their idempotency claims, the delivery log and a
/// test event (a one-item transaction) need on the table. It seals
/// signing secrets (the credentials key) but calls no provider and sends
/// no message.
#[test]
fn the_webhooks_function_serves_the_webhook_routes() {
    let t = template();
    let webhooks = function(&t, "WebhooksFunction", "webhooks");
    let mut routes: Vec<(String, String)> = http_routes(webhooks)
        .into_iter()
        .map(|(method, path, event)| {
            assert!(
                is_ref_to(&event["Properties"]["ApiId"], "HttpApi"),
                "{method} {path} is not on HttpApi"
            );
            (method, path)
        })
        .collect();
    routes.sort();
    let mut expected: Vec<(String, String)> = [
        ("POST", "/v1/webhooks"),
        ("GET", "/v1/webhooks"),
        ("GET", "/v1/webhooks/{id}"),
        ("PATCH", "/v1/webhooks/{id}"),
        ("DELETE", "/v1/webhooks/{id}"),
        ("GET", "/v1/webhooks/{id}/deliveries"),
        ("POST", "/v1/webhooks/{id}/test"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    expected.sort();
    assert_eq!(routes, expected);
    assert_eq!(
        table_actions(webhooks),
        [
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
        ]
    );
    assert!(
        queries_every_index(webhooks),
        "WebhooksFunction: Query on the indexes (the delivery log)"
    );
    assert!(queue_actions(webhooks, "WebhookQueue").is_empty());
}

/// The fan-out reads the table's stream from the oldest record it still
/// holds, only inserts of outbox events, reporting partial failures, and
/// may write what a fan-out writes and queue first attempts.
#[test]
fn the_webhook_fanout_takes_outbox_inserts_from_the_table_stream() {
    let t = template();
    let fanout = function(&t, "WebhookFanoutFunction", "webhook-fanout");
    let props = &fanout["Properties"];
    assert!(http_routes(fanout).is_empty(), "the fan-out is not public");
    let streams = events_of(fanout, "DynamoDB");
    assert_eq!(streams.len(), 1, "one DynamoDB stream event");
    assert_eq!(
        props["Events"].as_mapping().map(|m| m.len()),
        Some(1),
        "the stream is its only trigger"
    );
    let source = &streams[0]["Properties"];
    assert_eq!(
        get_att(&source["Stream"]),
        Some(("Table".to_owned(), "StreamArn".to_owned()))
    );
    assert_eq!(source["StartingPosition"].as_str(), Some("TRIM_HORIZON"));
    assert_eq!(source["BatchSize"].as_u64(), Some(100));
    assert_eq!(source["MaximumRetryAttempts"].as_u64(), Some(10));
    assert_eq!(source["BisectBatchOnFunctionError"].as_bool(), Some(true));
    assert_eq!(
        source["FunctionResponseTypes"],
        serde_norway::from_str::<Value>("[ReportBatchItemFailures]").unwrap_or(Value::Null)
    );
    let filters = source["FilterCriteria"]["Filters"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert_eq!(filters.len(), 1, "one filter");
    let pattern: serde_json::Value =
        serde_json::from_str(filters[0]["Pattern"].as_str().unwrap_or(""))
            .unwrap_or_else(|e| panic!("the filter pattern is not JSON: {e}"));
    assert_eq!(
        pattern,
        serde_json::json!({
            "eventName": ["INSERT"],
            "dynamodb": {"Keys": {
                "pk": {"S": [{"prefix": "EVT#"}]},
                "sk": {"S": ["EVT"]}
            }}
        })
    );
    // What still fails after the retries is recorded in a queue of its own.
    let Some((dlq, attr)) = get_att(&source["DestinationConfig"]["OnFailure"]["Destination"])
    else {
        panic!("no OnFailure destination: {source:?}")
    };
    assert_eq!(attr, "Arn");
    assert_ne!(
        dlq, "WebhookQueue",
        "failures must not look like deliveries"
    );
    assert_eq!(
        t["Resources"][dlq.as_str()]["Type"].as_str(),
        Some("AWS::SQS::Queue"),
        "{dlq}"
    );
    assert_eq!(queue_actions(fanout, &dlq), ["sqs:SendMessage"]);
    // The stream carries the keys (every view type does), and exists.
    let view =
        t["Resources"]["Table"]["Properties"]["StreamSpecification"]["StreamViewType"].as_str();
    assert!(
        matches!(
            view,
            Some("KEYS_ONLY" | "NEW_IMAGE" | "OLD_IMAGE" | "NEW_AND_OLD_IMAGES")
        ),
        "{view:?}"
    );
    assert_eq!(
        table_actions(fanout),
        [
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
        ]
    );
    assert_eq!(queue_actions(fanout, "WebhookQueue"), ["sqs:SendMessage"]);
    // A batch of 100 fan-outs takes longer than an API call.
    assert!(
        matches!(props["Timeout"].as_u64(), Some(30..=300)),
        "{:?}",
        props["Timeout"]
    );
}

/// The dispatcher consumes the webhooks queue ten at a time, reporting
/// partial failures; the queue hides a message long enough for a run and
/// for the dispatcher's claim, and redrives only after many receives.
#[test]
fn the_webhook_dispatcher_consumes_the_webhooks_queue() {
    use shared::domain::webhooks::WebhookSettings;
    let t = template();
    let dispatcher = function(&t, "WebhookDispatcherFunction", "webhook-dispatcher");
    let props = &dispatcher["Properties"];
    assert!(
        http_routes(dispatcher).is_empty(),
        "the dispatcher is not public"
    );
    let sources = events_of(dispatcher, "SQS");
    assert_eq!(sources.len(), 1, "one SQS event");
    assert_eq!(
        props["Events"].as_mapping().map(|m| m.len()),
        Some(1),
        "the queue is its only trigger"
    );
    let source = &sources[0]["Properties"];
    assert_eq!(
        get_att(&source["Queue"]),
        Some(("WebhookQueue".to_owned(), "Arn".to_owned()))
    );
    assert_eq!(
        source["BatchSize"].as_u64(),
        Some(webhook_dispatcher::CONCURRENCY as u64),
        "a batch is what the function runs at once"
    );
    assert_eq!(
        source["FunctionResponseTypes"],
        serde_norway::from_str::<Value>("[ReportBatchItemFailures]").unwrap_or(Value::Null)
    );
    let window = &source["MaximumBatchingWindowInSeconds"];
    assert!(
        window.is_null() || matches!(window.as_u64(), Some(0..=5)),
        "deliveries wait for no batch: {window:?}"
    );

    let settings = WebhookSettings::default();
    let Some(timeout) = props["Timeout"].as_u64() else {
        panic!("WebhookDispatcherFunction needs its own Timeout")
    };
    assert!(
        timeout > settings.timeout.as_secs() + 5,
        "Timeout {timeout} s leaves no room after a receiver's {:?}",
        settings.timeout
    );
    let queue = &t["Resources"]["WebhookQueue"]["Properties"];
    let Some(visibility) = queue["VisibilityTimeout"].as_u64() else {
        panic!("WebhookQueue needs a VisibilityTimeout")
    };
    assert!(
        visibility >= 6 * timeout,
        "VisibilityTimeout {visibility} s < 6 x the function's {timeout} s"
    );
    assert!(
        visibility >= settings.lease.as_secs(),
        "a message must not come back while its attempt is still claimed"
    );
    let Some(receives) = queue["RedrivePolicy"]["maxReceiveCount"].as_u64() else {
        panic!("WebhookQueue needs a redrive policy")
    };
    assert!(receives >= 20, "maxReceiveCount {receives}");
    assert!(
        get_att(&queue["RedrivePolicy"]["deadLetterTargetArn"])
            == Some(("WebhookDeadLetterQueue".to_owned(), "Arn".to_owned()))
    );

    assert_eq!(
        table_actions(dispatcher),
        ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    );
    assert_eq!(
        queue_actions(dispatcher, "WebhookQueue"),
        ["sqs:SendMessage"],
        "the next attempt goes back on the queue"
    );
}

/// Who may send to the webhooks queue: whoever queues an attempt (the
/// fan-out, the scheduler's outbox backstop, the dispatcher's retries),
/// and nobody else. Every SQS grant is a send to a queue of the template.
#[test]
fn only_the_webhook_pipeline_sends_to_the_webhooks_queue() {
    let t = template();
    let mut senders = Vec::new();
    for (name, f) in functions(&t) {
        for st in f["Properties"]["Policies"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default())
            .filter(|st| st["Effect"].as_str() != Some("Deny"))
        {
            let actions: Vec<String> = match &st["Action"] {
                Value::String(a) => vec![a.clone()],
                Value::Sequence(s) => s
                    .iter()
                    .map(|a| a.as_str().unwrap_or("").to_owned())
                    .collect(),
                _ => Vec::new(),
            };
            let resources: Vec<Value> = match &st["Resource"] {
                Value::Sequence(s) => s.clone(),
                one => vec![one.clone()],
            };
            for action in actions.iter().filter(|a| a.starts_with("sqs:")) {
                assert_eq!(action, "sqs:SendMessage", "{name}: {action}");
                for r in &resources {
                    let Some((queue, "Arn")) =
                        get_att(r).as_ref().map(|(q, a)| (q.clone(), a.as_str()))
                    else {
                        panic!("{name}: {action} on {r:?}")
                    };
                    assert_eq!(
                        t["Resources"][queue.as_str()]["Type"].as_str(),
                        Some("AWS::SQS::Queue"),
                        "{name}: {action} on {queue}"
                    );
                }
            }
        }
        if !queue_actions(&f, "WebhookQueue").is_empty() {
            senders.push(name);
        }
    }
    senders.sort();
    assert_eq!(
        senders,
        [
            "DashboardFunction",
            "SchedulerFunction",
            "WebhookDispatcherFunction",
            "WebhookFanoutFunction"
        ]
    );
    // The local-only switches are never deployed.
    for var in [
        "DHUKUTI_WEBHOOKS_ALLOW_LOCAL_HTTP",
        "DHUKUTI_WEBHOOK_RETRY_SECONDS",
    ] {
        assert!(
            t["Globals"]["Function"]["Environment"]["Variables"][var].is_null(),
            "{var} in Globals"
        );
        for (name, f) in functions(&t) {
            assert!(
                f["Properties"]["Environment"]["Variables"][var].is_null(),
                "{name} sets {var}"
            );
        }
    }
}

/// The SMS endpoint is the SMS function's, on the HTTP API; it reads the
/// recent sessions through the indexes, takes its counters and quota with
/// conditional updates, stores the reminder and queues it on the SMS
/// queue (and only there). It gets no provider secret.
#[test]
fn the_sms_function_serves_the_sms_route_and_queues_reminders() {
    let t = template();
    let f = function(&t, "SmsFunction", "sms");
    let routes: Vec<(String, String)> =
        http_routes(f).into_iter().map(|(m, p, _)| (m, p)).collect();
    assert_eq!(
        routes,
        [(
            "POST".to_owned(),
            "/v1/sms/notify-pending-payment".to_owned()
        )]
    );
    assert_eq!(
        table_actions(f),
        [
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem"
        ]
    );
    assert!(queries_every_index(f), "guard 1 reads sessions on gsi1");
    assert_eq!(queue_actions(f, "SmsQueue"), ["sqs:SendMessage"]);
    assert!(queue_actions(f, "WebhookQueue").is_empty());
    let vars = &f["Properties"]["Environment"]["Variables"];
    for var in [
        "DHUKUTI_SMS_TOKEN",
        shared::domain::credentials::KEY_ENV,
        shared::domain::credentials::KEY_SECRET_ENV,
        "DHUKUTI_SMS_BASE_URL",
    ] {
        assert!(vars[var].is_null(), "SmsFunction gets {var}");
    }
}

/// The SMS dispatcher consumes the SMS queue ten at a time with partial
/// batch failures; the queue hides a message past the dispatcher's run
/// and its claim on the reminder; only the dispatcher gets the SMS
/// provider settings, and only the SMS function sends to the queue.
#[test]
fn the_sms_dispatcher_consumes_the_sms_queue() {
    let t = template();
    let dispatcher = function(&t, "SmsDispatcherFunction", "sms-dispatcher");
    let props = &dispatcher["Properties"];
    assert!(
        http_routes(dispatcher).is_empty(),
        "the dispatcher is not public"
    );
    let sources = events_of(dispatcher, "SQS");
    assert_eq!(sources.len(), 1, "one SQS event");
    assert_eq!(props["Events"].as_mapping().map(|m| m.len()), Some(1));
    let source = &sources[0]["Properties"];
    assert_eq!(
        get_att(&source["Queue"]),
        Some(("SmsQueue".to_owned(), "Arn".to_owned()))
    );
    assert_eq!(
        source["BatchSize"].as_u64(),
        Some(sms_dispatcher::CONCURRENCY as u64)
    );
    assert_eq!(
        source["FunctionResponseTypes"],
        serde_norway::from_str::<Value>("[ReportBatchItemFailures]").unwrap_or(Value::Null)
    );

    let Some(timeout) = props["Timeout"].as_u64() else {
        panic!("SmsDispatcherFunction needs its own Timeout")
    };
    let client_timeout = shared::providers::sms::DEFAULT_TIMEOUT.as_secs();
    assert!(
        timeout > client_timeout,
        "Timeout {timeout} s leaves no room after the SMS client's {client_timeout} s"
    );
    let queue = &t["Resources"]["SmsQueue"]["Properties"];
    let Some(visibility) = queue["VisibilityTimeout"].as_u64() else {
        panic!("SmsQueue needs a VisibilityTimeout")
    };
    assert!(
        visibility >= 6 * timeout,
        "VisibilityTimeout {visibility} s"
    );
    assert!(
        visibility > shared::domain::sms::LEASE.as_secs(),
        "a message must not come back while its reminder is still claimed"
    );
    assert_eq!(
        queue["RedrivePolicy"]["maxReceiveCount"].as_u64(),
        Some(u64::from(shared::domain::sms::MAX_ATTEMPTS)),
        "the dead-letter queue takes a reminder after the dispatcher's attempts"
    );
    assert_eq!(
        get_att(&queue["RedrivePolicy"]["deadLetterTargetArn"]),
        Some(("SmsDeadLetterQueue".to_owned(), "Arn".to_owned()))
    );
    assert_eq!(
        table_actions(dispatcher),
        ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    );
    let vars = &props["Environment"]["Variables"];
    assert!(is_ref_to(&vars["DHUKUTI_SMS_BASE_URL"], "SmsBaseUrl"));
    assert!(is_ref_to(&vars["DHUKUTI_SMS_TOKEN"], "SmsToken"));
    assert!(is_ref_to(&vars["DHUKUTI_SMS_FROM"], "SmsFrom"));
    assert_eq!(t["Parameters"]["SmsToken"]["NoEcho"].as_bool(), Some(true));

    let mut senders = Vec::new();
    let mut token_holders = Vec::new();
    for (name, f) in functions(&t) {
        if !queue_actions(&f, "SmsQueue").is_empty() {
            senders.push(name.clone());
        }
        if !f["Properties"]["Environment"]["Variables"]["DHUKUTI_SMS_TOKEN"].is_null() {
            token_holders.push(name);
        }
    }
    // The API queues reminders; the Scheduler re-queues stuck ones.
    assert_eq!(senders, ["SchedulerFunction", "SmsFunction"]);
    assert_eq!(token_holders, ["SmsDispatcherFunction"]);
    assert!(t["Globals"]["Function"]["Environment"]["Variables"]["DHUKUTI_SMS_TOKEN"].is_null());
}

#[test]
fn the_mail_dispatcher_consumes_the_mail_queue_and_sends_through_ses() {
    let t = template();
    let dispatcher = function(&t, "MailDispatcherFunction", "mail-dispatcher");
    let props = &dispatcher["Properties"];
    assert!(http_routes(dispatcher).is_empty(), "not public");
    let sources = events_of(dispatcher, "SQS");
    assert_eq!(sources.len(), 1, "one SQS event");
    let source = &sources[0]["Properties"];
    assert_eq!(
        get_att(&source["Queue"]),
        Some(("MailQueue".to_owned(), "Arn".to_owned()))
    );
    assert_eq!(
        source["BatchSize"].as_u64(),
        Some(mail_dispatcher::CONCURRENCY as u64)
    );
    assert_eq!(
        source["FunctionResponseTypes"],
        serde_norway::from_str::<Value>("[ReportBatchItemFailures]").unwrap_or(Value::Null)
    );
    let Some(timeout) = props["Timeout"].as_u64() else {
        panic!("MailDispatcherFunction needs its own Timeout")
    };
    assert!(timeout > shared::providers::mail::DEFAULT_TIMEOUT.as_secs());
    let queue = &t["Resources"]["MailQueue"]["Properties"];
    let visibility = queue["VisibilityTimeout"].as_u64().unwrap_or(0);
    assert!(
        visibility >= 6 * timeout,
        "VisibilityTimeout {visibility} s"
    );
    assert!(visibility > shared::domain::mail::LEASE.as_secs());
    assert_eq!(
        queue["RedrivePolicy"]["maxReceiveCount"].as_u64(),
        Some(u64::from(shared::domain::mail::MAX_ATTEMPTS))
    );
    assert_eq!(
        get_att(&queue["RedrivePolicy"]["deadLetterTargetArn"]),
        Some(("MailDeadLetterQueue".to_owned(), "Arn".to_owned()))
    );
    assert_eq!(
        table_actions(dispatcher),
        [
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem"
        ]
    );
    let vars = &props["Environment"]["Variables"];
    assert!(is_ref_to(&vars["DHUKUTI_MAIL_FROM"], "MailFrom"));
    assert!(is_ref_to(
        &vars["DHUKUTI_SES_CONFIGURATION_SET"],
        "MailConfigurationSet"
    ));
    assert!(is_ref_to(
        &vars["DHUKUTI_MAIL_BASE_URL"],
        "LocalMailBaseUrl"
    ));
    // Bounces and complaints: configuration set -> topic -> the queue.
    let dest = &t["Resources"]["MailFeedbackDestination"]["Properties"];
    assert!(is_ref_to(
        &dest["ConfigurationSetName"],
        "MailConfigurationSet"
    ));
    assert!(is_ref_to(
        &dest["EventDestination"]["SnsDestination"]["TopicARN"],
        "MailFeedbackTopic"
    ));
    let subs = &t["Resources"]["MailFeedbackTopic"]["Properties"]["Subscription"][0];
    assert_eq!(subs["Protocol"].as_str(), Some("sqs"));
    assert_eq!(
        get_att(&subs["Endpoint"]),
        Some(("MailQueue".to_owned(), "Arn".to_owned()))
    );
    // Only the dispatcher may send mail.
    let mut senders = Vec::new();
    for (name, f) in functions(&t) {
        let grants_ses = statements(&f)
            .iter()
            .filter(|st| st["Effect"].as_str() != Some("Deny"))
            .flat_map(actions_of)
            .any(|a| a.starts_with("ses:"));
        if grants_ses {
            senders.push(name);
        }
    }
    assert_eq!(senders, ["MailDispatcherFunction"]);
}

/// The event streams are deployed as a function URL that streams its
/// answer (API Gateway would buffer it): no authorizer (public like the
/// checkout page), GET only from any origin, a timeout past the stream's
/// own end, and reserved concurrency so held streams can never take the
/// API's. The functions that answer `events_url` point it there, and the
/// binary runs lambda_http's streaming runtime.
#[test]
fn the_event_streams_are_a_streaming_function_url() {
    let t = template();
    let f = function(&t, "EventsFunction", "events");
    let props = &f["Properties"];
    let url = &props["FunctionUrlConfig"];
    assert_eq!(url["InvokeMode"].as_str(), Some("RESPONSE_STREAM"));
    assert_eq!(url["AuthType"].as_str(), Some("NONE"));
    assert_eq!(url["Cors"]["AllowMethods"][0].as_str(), Some("GET"));
    assert!(url["Cors"]["AllowMethods"][1].is_null(), "GET only");
    assert!(http_routes(f).is_empty(), "not behind API Gateway");
    let timeout = props["Timeout"].as_u64().unwrap_or(0);
    assert!(
        timeout > events::STREAM_FOR.as_secs() && timeout <= 900,
        "Timeout {timeout} must outlast a {:?} stream",
        events::STREAM_FOR
    );
    let reserved = intrinsic(&props["ReservedConcurrentExecutions"]);
    assert_eq!(
        reserved.as_ref().map(|(f, arg)| (f.as_str(), arg.as_str())),
        Some(("Ref", Some("EventStreamConcurrency")))
    );
    assert_eq!(
        t["Parameters"]["EventStreamConcurrency"]["Type"].as_str(),
        Some("Number")
    );
    for name in ["QrFunction", "MobileFunction"] {
        let var =
            &t["Resources"][name]["Properties"]["Environment"]["Variables"]["DHUKUTI_EVENTS_URL"];
        // Without the edge stack the function URL; behind it the public
        // base, whose /c/*/events behaviour forwards to the function URL.
        let (cond, behind, alone) = if_of(var).unwrap_or_else(|| panic!("{name}: {var:?}"));
        assert_eq!(cond, "BehindEdge", "{name}");
        assert!(is_ref_to(&behind, "PublicBaseUrl"), "{name}: {behind:?}");
        assert_eq!(
            get_att(&alone),
            Some(("EventsFunctionUrl".into(), "FunctionUrl".into())),
            "{name}: {var:?}"
        );
    }
    let main = format!(
        "{}/../functions/events/src/main.rs",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&main).unwrap_or_else(|e| panic!("{main}: {e}"));
    assert!(text.contains("run_with_streaming_response("), "{text}");
}

/// The crates `package` links, as `cargo tree` resolves it alone: the
/// features of a deployed build (`sam build` builds one function at a time),
/// not the union the workspace's tests are built with.
fn linked_crates(package: &str) -> Vec<String> {
    let out = crate::workspace::cargo_stdout(&[
        "tree", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}", "--locked",
    ]);
    let mut crates: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

/// Never in a deployed function: the embedded store, the local gateway and
/// its provider simulators, the benches and the tests' own crates.
const NEVER_DEPLOYED: &[&str] = &[
    "redb",
    "dhukuti",
    "dhukuti-bench",
    "dhukuti-tests",
    "tempfile",
    "fantoccini",
    // The log filter is by target (shared::logging), not `EnvFilter`
    // (tracing-subscriber's `env-filter`, whose matchers compile regexes).
    "matchers",
];

/// Issue 21: each function links only what it uses. What it does on AWS
/// beyond DynamoDB is what `template.yaml` grants it, so its SDK clients
/// follow its grants both ways (a client without a grant is dead weight; a
/// grant without a client is a function that fails when it needs it), the
/// PDF writer goes with the documents bucket, and nothing on
/// [`NEVER_DEPLOYED`] is linked. The read functions are held to the plain
/// list too, so a grant added to one must change this test.
#[test]
fn every_function_links_what_its_grants_use_and_nothing_denied() {
    let t = template();
    let mut seen = 0;
    for (name, f) in functions(&t) {
        let Some(binary) = f["Metadata"]["BuildProperties"]["Binary"].as_str() else {
            continue;
        };
        let crates = linked_crates(&format!("dhukuti-{binary}"));
        let links = |c: &str| crates.iter().any(|x| x == c);
        assert!(links("lambda_runtime"), "{name}: not a Lambda function?");
        let granted: Vec<String> = statements(&f)
            .iter()
            .filter(|st| st["Effect"].as_str() != Some("Deny"))
            .flat_map(actions_of)
            .collect();
        let grants = |prefix: &str| granted.iter().any(|a| a.starts_with(prefix));
        if binary != "docs" {
            for (sdk, action) in [
                ("aws-sdk-sqs", "sqs:SendMessage"),
                ("aws-sdk-s3", "s3:"),
                ("aws-sdk-secretsmanager", "secretsmanager:GetSecretValue"),
                ("aws-sdk-sesv2", "ses:SendEmail"),
            ] {
                assert_eq!(
                    links(sdk),
                    grants(action),
                    "{name}: links {sdk}: {}, granted {action}: {}",
                    links(sdk),
                    grants(action)
                );
            }
        }
        // PDFs go to S3; the exports (reports, report-runner) and the
        // uploaded statements (reconciliation) use S3 without the PDF
        // writer.
        if links("pdf-writer") || !["reports", "report-runner", "reconciliation"].contains(&binary)
        {
            assert_eq!(
                links("pdf-writer"),
                links("aws-sdk-s3"),
                "{name}: pdf-writer"
            );
        }
        for denied in NEVER_DEPLOYED {
            assert!(!links(denied), "{name} links {denied}");
        }
        if ["account", "payments", "payment-links", "checkout", "docs"].contains(&binary) {
            for denied in [
                "aws-sdk-s3",
                "aws-sdk-sqs",
                "aws-sdk-secretsmanager",
                "pdf-writer",
            ] {
                assert!(
                    !links(denied),
                    "{name} (reads and writes DynamoDB only) links {denied}"
                );
            }
        }
        seen += 1;
    }
    assert!(seen >= 17, "only {seen} functions checked");
}

/// Issue 21: every function runs on tokio's current-thread runtime. Lambda
/// hands an instance one event at a time, so the default multi-thread
/// runtime's worker threads would only be started at init and left idle:
/// about a tenth of hello-lambda's start for most functions, a sixth for
/// the dashboard (BENCHMARKS.md §3, "one thread").
#[test]
fn every_function_starts_a_current_thread_runtime() {
    let t = template();
    let mut seen = 0;
    for (name, f) in functions(&t) {
        let Some(dir) = f["Properties"]["CodeUri"].as_str() else {
            continue;
        };
        let main = format!("{}/../{dir}/src/main.rs", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&main).unwrap_or_else(|e| panic!("{main}: {e}"));
        let runtimes: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("#[tokio::main"))
            .collect();
        assert_eq!(
            runtimes,
            ["#[tokio::main(flavor = \"current_thread\")]"],
            "{name}: {main}"
        );
        seen += 1;
    }
    assert!(seen >= 17, "only {seen} functions checked");
}

/// `sam build` runs `cargo lambda build --release --arm64 --bin <Binary>` in
/// each function's `CodeUri` and copies `<CodeUri>/target/lambda/<Binary>/
/// bootstrap`. From the workspace root `--bin` finds only the default
/// member's binaries (and would unify every member's features); from the
/// crate's own directory cargo builds that crate alone, with its own
/// features, into the workspace's target directory, which
/// `functions/<Binary>/target` links to.
#[test]
fn every_function_is_built_from_its_own_crate_directory() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let t = template();
    for (name, f) in functions(&t) {
        let Some(binary) = f["Metadata"]["BuildProperties"]["Binary"].as_str() else {
            continue;
        };
        let dir = format!("functions/{binary}");
        assert_eq!(
            f["Properties"]["CodeUri"].as_str(),
            Some(dir.as_str()),
            "{name}: CodeUri"
        );
        let manifest = std::fs::read_to_string(root.join(&dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{dir}/Cargo.toml: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{binary}\"")),
            "{dir}/Cargo.toml has no binary {binary}"
        );
        let link = std::fs::read_link(root.join(&dir).join("target"))
            .unwrap_or_else(|e| panic!("{dir}/target is not a link: {e}"));
        assert_eq!(link, std::path::Path::new("../../target"), "{dir}/target");
    }
}

/// The (burst, rate) of a route settings entry.
fn throttle_of(v: &Value) -> (u64, f64) {
    (
        v["ThrottlingBurstLimit"].as_u64().unwrap_or(0),
        v["ThrottlingRateLimit"].as_f64().unwrap_or(0.0),
    )
}

/// Issue 37, 12: every route family has its own throttle, sized for an
/// honest peak (template.yaml's comment and infra/README.md "Route
/// throttles" have the arithmetic), and names only routes that exist.
#[test]
fn every_route_family_has_a_throttle_sized_for_its_peak() {
    let t = template();
    let api = &t["Resources"]["HttpApi"]["Properties"];
    let default = throttle_of(&api["DefaultRouteSettings"]);
    let settings = api["RouteSettings"]
        .as_mapping()
        .unwrap_or_else(|| panic!("HttpApi has no RouteSettings"));
    let mut routes = std::collections::BTreeSet::new();
    for (_, f) in functions(&t) {
        for (method, path, _) in http_routes(&f) {
            routes.insert(format!("{method} {path}"));
        }
    }
    let mut set = std::collections::BTreeMap::new();
    for (key, v) in settings {
        let key = key.as_str().unwrap_or("").to_owned();
        assert!(routes.contains(&key), "RouteSettings names no route: {key}");
        let (burst, rate) = throttle_of(v);
        assert!(
            burst as f64 >= rate && rate > 0.0,
            "{key}: burst {burst}, rate {rate}"
        );
        set.insert(key, (burst, rate));
    }
    // Merchant API (the default): the 10 busiest merchants at a live
    // key's full rate.
    let live_key = f64::from(shared::limits::rate::DEFAULT_LIVE);
    assert!(default.1 >= 10.0 * live_key, "API default {default:?}");
    assert!(default.0 as f64 >= default.1, "API default {default:?}");
    // Every route outside /v1, and the mobile apps' routes, has its own.
    for route in &routes {
        let path = route.split_once(' ').map_or("", |(_, p)| p);
        if !path.starts_with("/v1/") || path.starts_with("/v1/mobile/") {
            assert!(
                set.contains_key(route),
                "{route} has no throttle of its own"
            );
        }
    }
    let rate = |key: &str| set.get(key).map_or(0.0, |s| s.1);
    // Status polls: 3,000 open screens, one poll each every 3 s.
    assert!(rate("GET /c/{id}/status") >= 3000.0 / 3.0);
    // Mobile apps: 3,000 app checkouts reading every 3 s.
    assert!(rate("GET /v1/mobile/sessions/{id}") >= 3000.0 / 3.0);
    // Hosted pages: 100 checkouts a second, about 4 requests each.
    for page in [
        "GET /c/{id}",
        "POST /c/{id}/pay",
        "GET /l/{id}",
        "POST /l/{id}",
    ] {
        assert!(rate(page) >= 400.0, "{page}");
    }
    // Dashboard: 500 signed-in staff, about one request a second.
    assert!(rate("ANY /dashboard/{proxy+}") >= 500.0);
    // Below the account's 10,000 a second per region, route by route.
    for (key, (burst, rate)) in &set {
        assert!(*rate <= 10_000.0 && *burst <= 5_000, "{key}");
    }
}

/// Issue 37, 12: with the edge stack's origin secret the API's default
/// endpoint is off (only its custom domain, CloudFront's origin, answers),
/// every function gets the secret to check CloudFront's viewer address
/// against, and the stack refuses the secret without a domain. Without it
/// (the default) nothing changes.
#[test]
fn the_edge_turns_the_execute_api_endpoint_off() {
    let t = template();
    let secret = &t["Parameters"]["EdgeOriginSecret"];
    assert_eq!(secret["NoEcho"].as_bool(), Some(true));
    assert_eq!(secret["Default"].as_str(), Some(""));
    let (f, arg) =
        intrinsic(&t["Conditions"]["BehindEdge"]).unwrap_or_else(|| panic!("BehindEdge"));
    assert_eq!(f, "Not");
    assert!(format!("{arg:?}").contains("EdgeOriginSecret"), "{arg:?}");
    let disable = &t["Resources"]["HttpApi"]["Properties"]["DisableExecuteApiEndpoint"];
    let (cond, on, off) = if_of(disable).unwrap_or_else(|| panic!("{disable:?}"));
    assert_eq!(
        (cond.as_str(), on.as_bool(), off.as_bool()),
        ("BehindEdge", Some(true), Some(false))
    );
    let var = &t["Globals"]["Function"]["Environment"]["Variables"]["DHUKUTI_EDGE_ORIGIN_SECRET"];
    assert!(is_ref_to(var, "EdgeOriginSecret"), "{var:?}");
    assert_eq!(shared::app::ORIGIN_SECRET_ENV, "DHUKUTI_EDGE_ORIGIN_SECRET");
    let domain = &t["Resources"]["EdgeApiDomain"];
    assert_eq!(
        domain["Type"].as_str(),
        Some("AWS::ApiGatewayV2::DomainName")
    );
    assert_eq!(domain["Condition"].as_str(), Some("BehindEdge"));
    let mapping = &t["Resources"]["EdgeApiMapping"];
    assert_eq!(mapping["Condition"].as_str(), Some("BehindEdge"));
    assert!(is_ref_to(&mapping["Properties"]["ApiId"], "HttpApi"));
    let rule = format!("{:?}", t["Rules"]["EdgeNeedsAnApiDomain"]);
    for name in [
        "EdgeApiDomainName",
        "EdgeApiCertificateArn",
        "PublicBaseUrl",
    ] {
        assert!(
            rule.contains(name),
            "the rule does not check {name}: {rule}"
        );
    }
}

fn edge_stack() -> Value {
    let path = format!("{}/../infra/edge.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Issue 37, 12: the edge stack (infra/edge.yaml; `cfn-lint` in
/// infra/test.sh) is CloudFront with a CLOUDFRONT-scoped web ACL, refused
/// outside us-east-1: rate-based rules per client address, AWS's common
/// and known-bad-inputs groups; the origin secret on both origins (the
/// API and the event streams' function URL) and CloudFront's viewer
/// address forwarded to each.
#[test]
fn the_edge_stack_is_a_waf_in_front_of_the_api_and_the_streams() {
    let e = edge_stack();
    let description = e["Description"].as_str().unwrap_or("");
    assert!(description.contains("us-east-1"), "{description}");
    let region = format!("{:?}", e["Rules"]["OnlyInUsEast1"]["Assertions"]);
    assert!(
        region.contains("AWS::Region") && region.contains("us-east-1"),
        "{region}"
    );
    let secret = &e["Parameters"]["OriginSecret"];
    assert_eq!(secret["NoEcho"].as_bool(), Some(true));
    assert!(secret["MinLength"].as_u64().unwrap_or(0) >= 32);

    let acl = &e["Resources"]["WebAcl"];
    assert_eq!(acl["Type"].as_str(), Some("AWS::WAFv2::WebACL"));
    let acl = &acl["Properties"];
    assert_eq!(acl["Scope"].as_str(), Some("CLOUDFRONT"));
    let rules = acl["Rules"].as_sequence().cloned().unwrap_or_default();
    let groups: Vec<&str> = rules
        .iter()
        .filter_map(|r| r["Statement"]["ManagedRuleGroupStatement"]["Name"].as_str())
        .collect();
    for group in [
        "AWSManagedRulesCommonRuleSet",
        "AWSManagedRulesKnownBadInputsRuleSet",
    ] {
        assert!(groups.contains(&group), "{group} missing: {groups:?}");
    }
    let rated: Vec<&Value> = rules
        .iter()
        .map(|r| &r["Statement"]["RateBasedStatement"])
        .filter(|r| !r.is_null())
        .collect();
    assert!(!rated.is_empty(), "no rate-based rule");
    for r in &rated {
        assert_eq!(r["AggregateKeyType"].as_str(), Some("IP"), "{r:?}");
    }
    for r in &rules {
        if !r["Statement"]["RateBasedStatement"].is_null() {
            assert!(r["Action"]["Block"].is_mapping(), "{r:?}");
        }
    }

    let dist = &e["Resources"]["Distribution"]["Properties"]["DistributionConfig"];
    let (f, arg) = intrinsic(&dist["WebACLId"]).unwrap_or_else(|| panic!("no web ACL"));
    assert_eq!((f.as_str(), arg.as_str()), ("GetAtt", Some("WebAcl.Arn")));
    let origins = dist["Origins"].as_sequence().cloned().unwrap_or_default();
    let origin = |id: &str| {
        origins
            .iter()
            .find(|o| o["Id"].as_str() == Some(id))
            .cloned()
            .unwrap_or_else(|| panic!("no origin {id}"))
    };
    for (id, domain) in [("api", "ApiOriginDomain"), ("events", "EventsOriginDomain")] {
        let o = origin(id);
        assert!(is_ref_to(&o["DomainName"], domain), "{id}: {o:?}");
        assert_eq!(
            o["CustomOriginConfig"]["OriginProtocolPolicy"].as_str(),
            Some("https-only")
        );
        let headers = o["OriginCustomHeaders"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        assert!(
            headers.iter().any(|h| {
                h["HeaderName"].as_str().map(str::to_lowercase).as_deref()
                    == Some(edge::requests::ORIGIN_SECRET_HEADER)
                    && is_ref_to(&h["HeaderValue"], "OriginSecret")
            }),
            "{id}: no origin secret header: {headers:?}"
        );
    }
    let policy_of = |behaviour: &Value| {
        let (f, arg) = intrinsic(&behaviour["OriginRequestPolicyId"])
            .unwrap_or_else(|| panic!("{behaviour:?}"));
        assert_eq!(f, "Ref");
        let name = arg.as_str().unwrap_or("").to_owned();
        e["Resources"][name.as_str()]["Properties"]["OriginRequestPolicyConfig"]["HeadersConfig"]
            .clone()
    };
    let forwards_viewer = |headers: &Value| {
        headers["Headers"].as_sequence().is_some_and(|h| {
            h.iter().any(|n| {
                n.as_str().map(str::to_lowercase).as_deref()
                    == Some(edge::requests::VIEWER_ADDRESS_HEADER)
            })
        })
    };
    let default = &dist["DefaultCacheBehavior"];
    assert_eq!(default["TargetOriginId"].as_str(), Some("api"));
    assert!(forwards_viewer(&policy_of(default)), "{default:?}");
    let behaviours = dist["CacheBehaviors"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let stream = behaviours
        .iter()
        .find(|b| b["TargetOriginId"].as_str() == Some("events"))
        .unwrap_or_else(|| panic!("no behaviour for the event streams"));
    assert_eq!(stream["PathPattern"].as_str(), Some("/c/*/events"));
    let policy = policy_of(stream);
    assert!(forwards_viewer(&policy), "{policy:?}");
    // The function URL answers only its own Host: never forward the viewer's.
    assert_eq!(policy["HeaderBehavior"].as_str(), Some("whitelist"));
}
