//! Issue 41, statement matching, over HTTP on both backends: 1,000
//! payments across the three providers, five discrepancies of each kind
//! injected (spread over the three), eSewa's and Fonepay's statements
//! uploaded through the upload URL, Khalti's list pulled from its
//! simulator (where its payments were made): the runs flag exactly those. The same file again
//! changes nothing; another merchant's file and a line outside the day are
//! refused naming the file; a run not completed shows no findings. "Settle
//! from provider" pays a payment whose return never arrived (the provider
//! confirms it) and refuses one the provider does not confirm.

use std::collections::{BTreeSet, HashMap};

use dhukuti_tests::shop::{Shop, Via};
use dhukuti_tests::{Answer, TestApp, Which, on_both_backends, send, spawn_app};
use futures::StreamExt;
use serde_json::{Value, json};
use shared::domain::account::Scope;
use shared::domain::payments::{self, Payment, PaymentStatus};
use shared::domain::reconciliation::matching::nepal_day_of;
use shared::domain::reconciliation::runs::{Run, RunSource, RunStatus, StoredFinding};
use shared::domain::record::Record;
use shared::domain::{Mode, Provider};
use shared::money::Paisa;
use shared::time::{Clock, SystemClock, Timestamp};

/// One line of a statement file the test writes as the portal would.
#[derive(Clone, Debug)]
struct Line {
    reference: String,
    provider_ref: String,
    amount: i64,
    fee: Option<i64>,
    at: Timestamp,
    status: &'static str,
}

fn rupees(paisa: i64) -> String {
    format!("{}.{:02}", paisa / 100, paisa % 100)
}

fn nepal(at: Timestamp) -> String {
    at.plus(chrono::Duration::minutes(345))
        .datetime()
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// The CSV of `provider`'s portal export (the column spellings of
/// `statements::columns`), for merchant `account`.
fn statement_csv(provider: Provider, account: &str, lines: &[Line]) -> String {
    let header = match provider {
        Provider::Esewa => {
            "Transaction UUID,Reference ID,Amount,Service Charge,Transaction Date,Status"
        }
        _ => "PRN,Trace ID,Amount,Commission,Transaction Date,Status",
    };
    let mut out = format!("Merchant Code: {account}\n{header}\n");
    for l in lines {
        out.push_str(&format!(
            "{},{},{},{},{},{}\n",
            l.reference,
            l.provider_ref,
            rupees(l.amount),
            l.fee.map(rupees).unwrap_or_default(),
            nepal(l.at),
            l.status
        ));
    }
    out
}

/// Uploads `file` for `provider` and `date`: the upload's id.
async fn upload(app: &TestApp, key: &str, provider: Provider, date: &str, file: &str) -> String {
    let a = app
        .post(
            "/v1/reconciliation/uploads",
            Some(key),
            Some(&format!("u-{}", ulid::Ulid::new())),
            &json!({"provider": provider.as_str(), "date": date}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert!(
        a.body["maxBytes"].as_u64().is_some_and(|n| n > 0),
        "{}",
        a.body
    );
    let url = a.body["uploadUrl"].as_str().unwrap_or_default().to_owned();
    let put = app
        .client
        .put(&url)
        .body(file.to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("PUT {url}: {e}"));
    assert!(put.status().is_success(), "PUT {url}: {}", put.status());
    a.body["id"].as_str().unwrap_or_default().to_owned()
}

async fn run(app: &TestApp, key: &str, body: Value) -> Answer {
    app.post(
        "/v1/reconciliation/runs",
        Some(key),
        Some(&format!("r-{}", ulid::Ulid::new())),
        &body,
    )
    .await
}

async fn settle(app: &TestApp, key: &str, id: &str, n: u64) -> Answer {
    app.post(
        &format!("/v1/reconciliation/runs/{id}/findings/{n}/settle"),
        Some(key),
        Some(&format!("s-{}", ulid::Ulid::new())),
        &json!({}),
    )
    .await
}

/// Every finding of run `id` (all pages).
async fn findings(app: &TestApp, key: &str, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let a = app
            .get(
                &format!(
                    "/v1/reconciliation/runs/{id}/findings?limit=100&offset={}",
                    out.len()
                ),
                Some(key),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        let page = a.body["data"].as_array().cloned().unwrap_or_default();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

fn payment(tenant: &dhukuti_tests::Tenant, provider: Provider, i: i64, now: Timestamp) -> Payment {
    let amount = 10_000 + i * 7;
    let checks = shared::domain::payments::Checks {
        fee_provider: Paisa::new(amount / 50).ok(),
        ..Default::default()
    };
    Payment {
        id: shared::ids::PaymentId::new(),
        project_id: tenant.project.id.clone(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: Mode::Sandbox,
        amount: Paisa::new(amount).unwrap_or_default(),
        amount_refunded: Paisa::ZERO,
        currency: shared::money::Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider,
        status: PaymentStatus::Success,
        provider_ref: Some(format!("PR-{i}")),
        failure_reason: None,
        metadata: Default::default(),
        customer_name: None,
        customer_email: None,
        customer_phone: None,
        created_at: now,
        updated_at: now,
        double_payment_of: None,
        scanned_at: None,
        attempt: shared::domain::payments::AttemptInfo {
            reference: Some(shared::providers::new_reference()),
            ..Default::default()
        },
        checks,
    }
}

/// The injected discrepancies: (classification, what names it: a
/// payment id or, for `not_ours`, the line's reference).
type Expected = BTreeSet<(String, String)>;

async fn a_thousand_payments_reconcile_to_exactly_the_injected_discrepancies(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let tenant = app.tenant("Sita's Shop", "sita@example.com").await;
    let key = app
        .key(
            &tenant,
            Mode::Sandbox,
            &[Scope::PaymentsRead, Scope::PaymentsWrite],
        )
        .await;
    let now = SystemClock.now();
    let date = nepal_day_of(now).format("%Y-%m-%d").to_string();
    let providers = [Provider::Esewa, Provider::Khalti, Provider::Fonepay];
    let mut made: Vec<Payment> = (0..1000)
        .map(|i| payment(&tenant, providers[(i % 3) as usize], i, now))
        .collect();

    // Khalti's payments are made at its simulator (initiated and paid
    // there, as a customer would), so its merchant transaction list states
    // them; ours record the pidx, and the transaction id and fee the
    // lookup would have given, except the ones not paid here.
    let khalti_key = match shared::providers::SandboxAccounts::default().khalti {
        Some(shared::providers::ProviderCredentials::Khalti { secret_key }) => secret_key,
        _ => panic!("no simulator Khalti key"),
    };
    let Some(keys) = app.state().providers.keys() else {
        panic!("the gateway has no credentials key")
    };
    if let Err(e) = shared::domain::credentials::put_credentials(
        &*app.store,
        keys,
        now,
        &shared::domain::Tenant::new(tenant.project.id.clone(), Mode::Sandbox),
        &shared::providers::ProviderCredentials::Khalti {
            secret_key: khalti_key.clone(),
        },
    )
    .await
    {
        panic!("khalti credentials: {e}")
    }
    let sim = format!("{}/sim/khalti", app.base);
    let khalti_paid: Vec<(usize, String, String)> =
        futures::stream::iter((0..made.len()).filter(|&i| made[i].provider == Provider::Khalti))
            .map(|i| {
                let (client, sim, key) = (app.client.clone(), sim.clone(), khalti_key.clone());
                let (reference, amount) = (
                    made[i].attempt.reference.clone().unwrap_or_default(),
                    made[i].amount.get(),
                );
                async move {
                    let a = send(
                        client
                            .post(format!("{sim}/api/v2/epayment/initiate/"))
                            .header("authorization", format!("Key {key}"))
                            .header("content-type", "application/json")
                            .body(
                                json!({
                                    "return_url": "https://shop.example/return",
                                    "website_url": "https://shop.example",
                                    "amount": amount,
                                    "purchase_order_id": reference,
                                    "purchase_order_name": "Order",
                                })
                                .to_string(),
                            ),
                    )
                    .await;
                    assert_eq!(a.status, 200, "initiate: {}", a.body);
                    let pidx = a.body["pidx"].as_str().unwrap_or_default().to_owned();
                    let a = send(
                        client
                            .post(format!("{sim}/_control/attempts/{pidx}/pay"))
                            .header("content-type", "application/json")
                            .body("{}"),
                    )
                    .await;
                    assert!(a.status < 300, "pay: {}", a.body);
                    let txn = a.body["attempt"]["transaction_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    assert!(!txn.is_empty(), "{}", a.body);
                    (i, pidx, txn)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
    let khalti_bps = dhukuti::simulators::SimConfig::new("").khalti_fee_bps;
    let mut pidx_of: HashMap<usize, String> = HashMap::new();
    for (i, pidx, txn) in khalti_paid {
        let p = &mut made[i];
        p.attempt.provider_token = Some(pidx.clone());
        p.provider_ref = Some(txn);
        p.checks.fee_provider =
            Paisa::new(dhukuti::simulators::fee_of(p.amount.get(), khalti_bps)).ok();
        pidx_of.insert(i, pidx);
    }

    // The discrepancies, five of each kind, spread over the three
    // providers (the payments' providers take turns: each kind falls on
    // each provider). eSewa's and Fonepay's are written into the files;
    // Khalti's injected into its simulator's list.
    let mut expected: Expected = BTreeSet::new();
    let mut lines: HashMap<Provider, Vec<Line>> = HashMap::new();
    let mut slots = 0..made.len();
    let mut take = |n: usize| -> Vec<usize> { (&mut slots).take(n).collect() };
    let amount_off = take(5);
    let fee_off = take(5);
    let no_line = take(5);
    let not_paid_here = take(5);
    for &i in &not_paid_here {
        made[i].status = if i % 2 == 0 {
            PaymentStatus::Cancelled
        } else {
            PaymentStatus::Pending
        };
        made[i].checks.fee_provider = None;
        // Khalti's transaction id is learned only when a payment settles.
        if made[i].provider == Provider::Khalti {
            made[i].provider_ref = None;
        }
    }
    let inject = |body: Value| {
        let (client, sim) = (app.client.clone(), sim.clone());
        async move {
            let a = send(
                client
                    .post(format!("{sim}/_sim/statement-discrepancies"))
                    .header("content-type", "application/json")
                    .body(body.to_string()),
            )
            .await;
            assert!(a.status < 300, "{body}: {}", a.body);
            a.body
        }
    };
    for (i, p) in made.iter().enumerate() {
        if p.provider == Provider::Khalti {
            let pidx = pidx_of.get(&i).cloned().unwrap_or_default();
            if amount_off.contains(&i) {
                inject(
                    json!({"kind": "amount", "reference": pidx, "amount": p.amount.get() + 100}),
                )
                .await;
            }
            if fee_off.contains(&i) {
                let fee = p.checks.fee_provider.map(Paisa::get).unwrap_or_default();
                inject(json!({"kind": "fee", "reference": pidx, "fee": fee + 1})).await;
            }
            if no_line.contains(&i) {
                inject(json!({"kind": "drop", "reference": pidx})).await;
            }
            continue;
        }
        if no_line.contains(&i) {
            continue;
        }
        let mut l = Line {
            reference: p.attempt.reference.clone().unwrap_or_default(),
            provider_ref: p.provider_ref.clone().unwrap_or_default(),
            amount: p.amount.get(),
            fee: p.checks.fee_provider.map(Paisa::get),
            at: now,
            status: "Success",
        };
        if amount_off.contains(&i) {
            l.amount += 100;
        }
        if fee_off.contains(&i) {
            l.fee = l.fee.map(|f| f + 1);
        }
        lines.entry(p.provider).or_default().push(l);
    }
    for (set, class) in [
        (&amount_off, "amount_mismatch"),
        (&fee_off, "fee_mismatch"),
        (&no_line, "missing_in_provider"),
        (&not_paid_here, "missing_in_dhukuti"),
    ] {
        for &i in set {
            expected.insert((class.into(), made[i].id.to_string()));
        }
    }
    for n in 0..5 {
        let provider = providers[n % 3];
        if provider == Provider::Khalti {
            let foreign = inject(json!({"kind": "foreign", "amount": 5_000})).await;
            let idx = foreign["provider_ref"].as_str().unwrap_or_default();
            assert!(!idx.is_empty(), "{foreign}");
            expected.insert(("not_ours".into(), idx.to_owned()));
            continue;
        }
        let reference = format!("OUTSIDE-{n}");
        lines.entry(provider).or_default().push(Line {
            reference: reference.clone(),
            provider_ref: format!("X-{n}"),
            amount: 5_000,
            fee: None,
            at: now,
            status: "Success",
        });
        expected.insert(("not_ours".into(), reference));
    }
    for kind in providers {
        let n = expected
            .iter()
            .filter(|(_, name)| {
                made.iter()
                    .any(|p| p.provider == kind && p.id.as_str() == name.as_str())
            })
            .count();
        assert!(n >= 4, "{kind:?} carries {n} discrepancies of ours");
    }

    // Stored as the attempt path stores them, sixteen at a time.
    let store = app.store.clone();
    let results: Vec<Result<(), String>> = futures::stream::iter(made.clone())
        .map(|p| {
            let store = store.clone();
            async move {
                payments::insert(&*store, &p)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for r in results {
        if let Err(e) = r {
            panic!("seeding: {e}");
        }
    }

    let mut flagged: Expected = BTreeSet::new();
    let mut matched = 0;
    for provider in [Provider::Esewa, Provider::Fonepay] {
        let account = match provider {
            Provider::Esewa => "EPAYTEST",
            _ => "fonepay123",
        };
        let configured = shared::domain::reconciliation::runs::configured_account(
            app.state(),
            &shared::domain::Tenant::new(tenant.project.id.clone(), Mode::Sandbox),
            provider,
        )
        .await
        .ok()
        .flatten();
        let ours = configured.clone().unwrap_or_else(|| account.to_owned());
        let file = statement_csv(provider, &ours, &lines[&provider]);
        let up = upload(&app, &key, provider, &date, &file).await;
        let a = run(
            &app,
            &key,
            json!({"provider": provider.as_str(), "date": date, "uploadId": up}),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.body);
        let id = a.body["id"].as_str().unwrap_or_default().to_owned();
        assert!(id.starts_with("rrun_"), "{}", a.body);
        assert_eq!(a.body["status"], "completed", "{}", a.body);
        assert_eq!(a.body["source"], "upload", "{}", a.body);
        let all = findings(&app, &key, &id).await;
        for f in &all {
            let class = f["classification"].as_str().unwrap_or_default().to_owned();
            if class == "matched" {
                matched += 1;
                continue;
            }
            let name = if class == "not_ours" {
                f["reference"]
                    .as_str()
                    .or(f["providerRef"].as_str())
                    .unwrap_or_default()
                    .to_owned()
            } else {
                f["paymentId"].as_str().unwrap_or_default().to_owned()
            };
            flagged.insert((class, name));
        }
        let counts = &a.body["counts"];
        let listed = all.len() as u64;
        let summed: u64 = [
            "matched",
            "amountMismatch",
            "feeMismatch",
            "missingInProvider",
            "missingInDhukuti",
            "notOurs",
        ]
        .iter()
        .map(|c| counts[c].as_u64().unwrap_or_default())
        .sum();
        assert_eq!(summed, listed, "{}", a.body);

        // One classification at a time.
        let only = app
            .get(
                &format!("/v1/reconciliation/runs/{id}/findings?classification=not_ours"),
                Some(&key),
            )
            .await;
        assert_eq!(only.status, 200, "{}", only.body);
        assert_eq!(
            only.body["meta"]["total"], counts["notOurs"],
            "{}",
            only.body
        );

        // The same file again: the same run, nothing new.
        let again_up = upload(&app, &key, provider, &date, &file).await;
        let again = run(
            &app,
            &key,
            json!({"provider": provider.as_str(), "date": date, "uploadId": again_up}),
        )
        .await;
        assert_eq!(again.status, 200, "{}", again.body);
        assert_eq!(again.body["id"], id.as_str(), "{}", again.body);
        assert_eq!(again.body["counts"], *counts);
        let list = app
            .get(
                &format!(
                    "/v1/reconciliation/runs?provider={}&date={date}",
                    provider.as_str()
                ),
                Some(&key),
            )
            .await;
        assert_eq!(list.status, 200, "{}", list.body);
        assert_eq!(list.body["meta"]["total"], 1, "{}", list.body);

        // Another merchant's file (where the project's account is known:
        // sandbox eSewa's), a line outside the day: refused.
        if configured.is_some() {
            let theirs = statement_csv(provider, "SOMEONE-ELSE", &lines[&provider][..3]);
            let up = upload(&app, &key, provider, &date, &theirs).await;
            let a = run(
                &app,
                &key,
                json!({"provider": provider.as_str(), "date": date, "uploadId": up}),
            )
            .await;
            assert_eq!(a.status, 400, "{}", a.body);
            assert_eq!(a.body["error"]["param"], "file", "{}", a.body);
        }
        let mut early = lines[&provider][..3].to_vec();
        early[1].at = now.plus(chrono::Duration::days(-2));
        let up = upload(
            &app,
            &key,
            provider,
            &date,
            &statement_csv(provider, &ours, &early),
        )
        .await;
        let a = run(
            &app,
            &key,
            json!({"provider": provider.as_str(), "date": date, "uploadId": up}),
        )
        .await;
        assert_eq!(a.status, 400, "{}", a.body);
        assert_eq!(a.body["error"]["param"], "file", "{}", a.body);
        let message = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("line"), "{}", a.body);
    }

    // Khalti: its list pulled from the simulator. The unmatched lines of
    // the payments not paid here are explained by looking those attempts
    // up by pidx (`missing_in_dhukuti`); the foreign ones stay not ours.
    let a = run(&app, &key, json!({"provider": "khalti", "date": date})).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["status"], "completed", "{}", a.body);
    assert_eq!(a.body["source"], "pull", "{}", a.body);
    let id = a.body["id"].as_str().unwrap_or_default().to_owned();
    for f in findings(&app, &key, &id).await {
        let class = f["classification"].as_str().unwrap_or_default().to_owned();
        if class == "matched" {
            matched += 1;
            continue;
        }
        let name = if class == "not_ours" {
            f["providerRef"].as_str().unwrap_or_default().to_owned()
        } else {
            f["paymentId"].as_str().unwrap_or_default().to_owned()
        };
        flagged.insert((class, name));
    }
    // The same list again: the same run.
    let again = run(&app, &key, json!({"provider": "khalti", "date": date})).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["id"], id.as_str(), "{}", again.body);

    for (class, _) in &expected {
        let want = expected.iter().filter(|(c, _)| c == class).count();
        let got = flagged.iter().filter(|(c, _)| c == class).count();
        assert_eq!((class.as_str(), got), (class.as_str(), want));
    }
    assert_eq!(
        flagged, expected,
        "flagged exactly the injected discrepancies"
    );
    assert_eq!(matched, made.len() - 20);

    // Bad input: a 400 naming the parameter.
    for (body, param) in [
        (json!({"provider": "paypal", "date": date}), "provider"),
        (json!({"provider": "esewa", "date": "yesterday"}), "date"),
        (json!({"provider": "esewa", "date": date}), "uploadId"),
        (
            json!({"provider": "esewa", "date": date, "uploadId": "stu_nope"}),
            "uploadId",
        ),
    ] {
        let a = run(&app, &key, body.clone()).await;
        assert_eq!(a.status, 400, "{body}: {}", a.body);
        assert_eq!(a.body["error"]["param"], param, "{body}: {}", a.body);
    }
    let a = app
        .get("/v1/reconciliation/runs?provider=paypal", Some(&key))
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.body["error"]["param"], "provider", "{}", a.body);

    app.stop().await;
}

/// A run stored `running` with findings already under it (a crash between
/// the findings and the completing write): its findings are not shown,
/// nor its counts.
async fn an_uncompleted_run_shows_no_findings(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let tenant = app.tenant("Ram's Shop", "ram@example.com").await;
    let key = app
        .key(&tenant, Mode::Sandbox, &[Scope::PaymentsRead])
        .await;
    let now = SystemClock.now();
    let mut run = Run {
        id: shared::ids::ReconRunId::new(),
        project_id: tenant.project.id.clone(),
        mode: Mode::Sandbox,
        provider: Provider::Esewa,
        day: "2026-11-20".into(),
        source: RunSource::Upload,
        digest: "ab".into(),
        status: RunStatus::Running,
        counts: Default::default(),
        ours_total: Paisa::ZERO,
        theirs_total: Paisa::ZERO,
        lines: 1,
        findings: 0,
        failure: None,
        created_at: now,
        completed_at: None,
        ranked: true,
        listed: true,
    };
    run.counts.not_ours = 1;
    let finding = StoredFinding {
        run_id: run.id.clone(),
        n: 1,
        finding: shared::domain::reconciliation::matching::Finding {
            classification: shared::domain::reconciliation::matching::Classification::NotOurs,
            kind: shared::domain::reconciliation::statements::LineKind::Payment,
            line: Some(2),
            payment_id: None,
            reference: Some("X".into()),
            provider_ref: None,
            ours_amount: None,
            theirs_amount: Paisa::new(100).ok(),
            ours_fee: None,
            theirs_fee: None,
            at: Some(now),
        },
        settled_at: None,
        rank: Some(1),
    };
    shared::domain::reconciliation::runs::store_new(&*app.store, &run)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let item = finding.to_item().unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = app.store.put(item, None).await {
        panic!("{e}");
    }
    let id = run.id.to_string();
    let a = app
        .get(&format!("/v1/reconciliation/runs/{id}"), Some(&key))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "running", "{}", a.body);
    assert_eq!(a.body["counts"]["notOurs"], 0, "{}", a.body);
    let a = app
        .get(
            &format!("/v1/reconciliation/runs/{id}/findings"),
            Some(&key),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["data"], json!([]), "{}", a.body);
    assert_eq!(a.body["meta"]["total"], 0, "{}", a.body);
    // Another tenant's run is not found.
    let other = app.tenant("Hari's Shop", "hari@example.com").await;
    let theirs = app.key(&other, Mode::Sandbox, &[Scope::PaymentsRead]).await;
    let a = app
        .get(&format!("/v1/reconciliation/runs/{id}"), Some(&theirs))
        .await;
    assert_eq!(a.status, 404, "{}", a.body);
    app.stop().await;
}

/// Two customers leave eSewa's page without coming back: one paid at
/// eSewa (its return never arrived), one did not. The portal's file says
/// both paid: each is `missing_in_dhukuti`. Settling the first asks eSewa,
/// which confirms: the payment is `success`. The second is refused, and
/// stays as it was: the file alone proves nothing.
async fn settle_from_provider_pays_only_what_the_provider_confirms(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let app = &shop.app;
    let mut started = Vec::new();
    for amount in [25_000, 30_000] {
        let s = dhukuti_tests::browser::text(&shop.create_checkout(amount).await["id"]);
        shop.to_wallet(&s, Via::Esewa).await;
        let payment = dhukuti_tests::browser::text(&shop.session(&s).await["paymentId"]);
        let reference = shop.reference(&payment).await;
        started.push((payment, reference, amount));
    }
    // The first customer pays at eSewa; the browser never comes back.
    let (paid, paid_ref, _) = &started[0];
    let a = send(
        app.client
            .post(shop.sim(&format!("/esewa/_control/attempts/{paid_ref}/pay")))
            .header("content-type", "application/json")
            .body("{}"),
    )
    .await;
    assert!(a.status < 300, "{}", a.body);
    assert_eq!(shop.payment(paid).await["status"], "pending");

    let now = SystemClock.now();
    let date = nepal_day_of(now).format("%Y-%m-%d").to_string();
    let lines: Vec<Line> = started
        .iter()
        .map(|(_, reference, amount)| Line {
            reference: reference.clone(),
            provider_ref: String::new(),
            amount: *amount,
            fee: None,
            at: now,
            status: "COMPLETE",
        })
        .collect();
    let account = shared::domain::reconciliation::runs::configured_account(
        app.state(),
        &shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox),
        Provider::Esewa,
    )
    .await
    .ok()
    .flatten()
    .unwrap_or_default();
    let file = statement_csv(Provider::Esewa, &account, &lines);
    let up = upload(app, &shop.key, Provider::Esewa, &date, &file).await;
    let a = run(
        app,
        &shop.key,
        json!({"provider": "esewa", "date": date, "uploadId": up}),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["counts"]["missingInDhukuti"], 2, "{}", a.body);
    let id = a.body["id"].as_str().unwrap_or_default().to_owned();
    let all = findings(app, &shop.key, &id).await;
    let n_of = |payment: &str| {
        all.iter()
            .find(|f| f["paymentId"] == payment)
            .and_then(|f| f["n"].as_u64())
            .unwrap_or_else(|| panic!("no finding of {payment}: {all:?}"))
    };
    let a = settle(app, &shop.key, &id, n_of(paid)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "success", "{}", a.body);
    assert_eq!(shop.payment(paid).await["status"], "success");
    assert_eq!(shop.events_about("payment.succeeded", paid).await, 1);
    // Settled already: answered again, nothing new.
    let a = settle(app, &shop.key, &id, n_of(paid)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(shop.events_about("payment.succeeded", paid).await, 1);

    let (unpaid, _, _) = &started[1];
    let a = settle(app, &shop.key, &id, n_of(unpaid)).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert_eq!(
        a.body["error"]["code"], "provider_not_confirmed",
        "{}",
        a.body
    );
    assert_ne!(shop.payment(unpaid).await["status"], "success");
    // A finding that is not missing_in_dhukuti cannot be settled.
    let a = settle(app, &shop.key, &id, 999).await;
    assert_eq!(a.status, 404, "{}", a.body);
    shop.stop().await;
}

on_both_backends!(
    a_thousand_payments_reconcile_to_exactly_the_injected_discrepancies,
    an_uncompleted_run_shows_no_findings,
    settle_from_provider_pays_only_what_the_provider_confirms,
);
