//! Issue 41, the providers' statements as the simulators state them, over
//! HTTP on both backends: customers pay through the hosted pages and each
//! provider's simulator; discrepancies are injected through the
//! simulators' control; eSewa's and Fonepay's portal files are fetched from
//! `/{provider}/_sim/statement` (CSV and XLSX) and uploaded; Khalti's list
//! is pulled by the daily pull as the scheduler runs it (two calls racing:
//! one run). Each run flags exactly what was injected, and the day's
//! reconciliation export has a row per finding; the local tick pulls the
//! previous day by itself; a tenant whose pull fails stops no other. A
//! completed run reaches a real webhook receiver as
//! `reconciliation.completed`, signed, with its counts.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use dhukuti_tests::browser::text;
use dhukuti_tests::shop::{Shop, Via};
use dhukuti_tests::{
    Answer, Which, on_both_backends, send, spawn_app, spawn_app_tweaked_with_clock,
};
use serde_json::{Value, json};
use shared::domain::reconciliation::daily::{self, PullReport};
use shared::domain::reconciliation::matching::nepal_day_of;
use shared::domain::{Mode, Tenant};
use shared::time::{Clock, ManualClock, SystemClock};
use shared::webhooks::signature::{self, SIGNATURE_HEADER};

/// (classification, what names it: our payment's id, else the line's
/// provider id).
type Flagged = BTreeSet<(String, String)>;

fn tenant(shop: &Shop) -> Tenant {
    Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox)
}

/// Gives the shop's project its own Khalti credentials (the simulator's
/// key): it is then one of the tenants pulled daily.
async fn enable_khalti(shop: &Shop) {
    let Some(keys) = shop.app.state().providers.keys() else {
        panic!("the gateway has no credentials key")
    };
    let Some(creds) = shared::providers::SandboxAccounts::default().khalti else {
        panic!("no simulator Khalti key")
    };
    if let Err(e) = shared::domain::credentials::put_credentials(
        &*shop.app.store,
        keys,
        SystemClock.now(),
        &tenant(shop),
        &creds,
    )
    .await
    {
        panic!("khalti credentials: {e}")
    }
}

/// Injects a discrepancy into `sim`'s statement: the control's answer.
async fn inject(shop: &Shop, sim: &str, body: Value) -> Value {
    let a = send(
        shop.app
            .client
            .post(shop.sim(&format!("/{sim}/_sim/statement-discrepancies")))
            .header("content-type", "application/json")
            .body(body.to_string()),
    )
    .await;
    assert!(a.status < 300, "{body}: {}", a.body);
    a.body
}

/// A customer pays `amount` at the provider, whose return never reaches
/// us: the payment's id, still `pending`.
async fn paid_unreturned(shop: &Shop, via: Via, sim: &str, amount: i64) -> String {
    let s = text(&shop.create_checkout(amount).await["id"]);
    shop.to_wallet(&s, via).await;
    let payment = text(&shop.session(&s).await["paymentId"]);
    let reference = shop.reference(&payment).await;
    let a = send(
        shop.app
            .client
            .post(shop.sim(&format!("/{sim}/_control/attempts/{reference}/pay")))
            .header("content-type", "application/json")
            .body("{}"),
    )
    .await;
    assert!(a.status < 300, "{}", a.body);
    assert_eq!(shop.payment(&payment).await["status"], "pending");
    payment
}

/// The portal file `sim` states for Nepal day `date`.
async fn statement(shop: &Shop, sim: &str, date: &str, format: &str) -> Vec<u8> {
    let url = shop.sim(&format!(
        "/{sim}/_sim/statement?date={date}&format={format}"
    ));
    let res = match shop.app.client.get(&url).send().await {
        Ok(r) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    assert_eq!(res.status(), 200, "GET {url}");
    match res.bytes().await {
        Ok(b) => b.to_vec(),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// Uploads `file` through the upload URL: the upload's id.
async fn upload(shop: &Shop, provider: &str, date: &str, file: Vec<u8>) -> String {
    let a = shop
        .app
        .post(
            "/v1/reconciliation/uploads",
            Some(&shop.key),
            Some(&format!("u-{}", ulid::Ulid::new())),
            &json!({"provider": provider, "date": date}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let url = text(&a.body["uploadUrl"]);
    let put = match shop.app.client.put(&url).body(file).send().await {
        Ok(r) => r,
        Err(e) => panic!("PUT {url}: {e}"),
    };
    assert!(put.status().is_success(), "PUT {url}: {}", put.status());
    text(&a.body["id"])
}

async fn run_upload(shop: &Shop, provider: &str, date: &str, upload: &str) -> Answer {
    shop.app
        .post(
            "/v1/reconciliation/runs",
            Some(&shop.key),
            Some(&format!("r-{}", ulid::Ulid::new())),
            &json!({"provider": provider, "date": date, "uploadId": upload}),
        )
        .await
}

/// Every finding of run `id`.
async fn findings(shop: &Shop, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let a = shop
            .app
            .get(
                &format!(
                    "/v1/reconciliation/runs/{id}/findings?limit=100&offset={}",
                    out.len()
                ),
                Some(&shop.key),
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

/// What a run flagged (all but `matched`), and how many it matched.
async fn flagged(shop: &Shop, id: &str) -> (Flagged, usize) {
    let mut out = Flagged::new();
    let mut matched = 0;
    for f in findings(shop, id).await {
        let class = text(&f["classification"]);
        if class == "matched" {
            matched += 1;
            continue;
        }
        let name = match f["paymentId"].as_str() {
            Some(p) => p.to_owned(),
            None => text(&f["providerRef"]),
        };
        out.insert((class, name));
    }
    (out, matched)
}

/// The one run of `provider` on `date`, as listed.
async fn only_run(shop: &Shop, provider: &str, date: &str) -> Value {
    let a = shop
        .app
        .get(
            &format!("/v1/reconciliation/runs?provider={provider}&date={date}"),
            Some(&shop.key),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["meta"]["total"], 1, "{}", a.body);
    a.body["data"][0].clone()
}

/// Today's Khalti pull, as the scheduler's daily pull makes it (for the
/// day the payments were made: the scheduler takes yesterday's).
async fn pull_today(shop: &Shop) -> PullReport {
    let now = SystemClock.now();
    let deadline = Instant::now() + Duration::from_secs(30);
    match daily::pull_day(shop.app.state(), nepal_day_of(now), now, deadline).await {
        Ok(r) => r,
        Err(e) => panic!("daily pull: {e}"),
    }
}

fn class(c: &str, name: &str) -> (String, String) {
    (c.to_owned(), name.to_owned())
}

async fn simulator_statements_reconcile_to_exactly_the_injected_discrepancies(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    shop.app.enable_fonepay(&shop.tenant, Mode::Sandbox).await;
    enable_khalti(&shop).await;
    let date = nepal_day_of(SystemClock.now())
        .format("%Y-%m-%d")
        .to_string();

    // eSewa and Fonepay: four paid, one paid whose return never came.
    // Injected: another amount, a dropped line, a line not ours.
    for (provider, via, format) in [
        ("esewa", Via::Esewa, "csv"),
        ("fonepay", Via::FonepayWeb, "xlsx"),
    ] {
        let mut paid = Vec::new();
        for i in 0..4 {
            paid.push(shop.paid(via, 10_000 + i * 150).await);
        }
        let unreturned = paid_unreturned(&shop, via, provider, 12_500).await;
        let mut want = Flagged::new();
        inject(
            &shop,
            provider,
            json!({"kind": "amount", "reference": shop.reference(&paid[0]).await, "amount": 10_100}),
        )
        .await;
        want.insert(class("amount_mismatch", &paid[0]));
        inject(
            &shop,
            provider,
            json!({"kind": "drop", "reference": shop.reference(&paid[1]).await}),
        )
        .await;
        want.insert(class("missing_in_provider", &paid[1]));
        let foreign = inject(&shop, provider, json!({"kind": "foreign", "amount": 4_000})).await;
        want.insert(class("not_ours", &text(&foreign["provider_ref"])));
        want.insert(class("missing_in_dhukuti", &unreturned));

        let file = statement(&shop, provider, &date, format).await;
        let up = upload(&shop, provider, &date, file.clone()).await;
        let a = run_upload(&shop, provider, &date, &up).await;
        assert_eq!(a.status, 201, "{provider}: {}", a.body);
        assert_eq!(a.body["status"], "completed", "{}", a.body);
        let id = text(&a.body["id"]);
        let (got, matched) = flagged(&shop, &id).await;
        assert_eq!(got, want, "{provider}: flagged exactly the injected");
        assert_eq!(matched, 2, "{provider}");
        assert_eq!(a.body["counts"]["matched"], 2, "{}", a.body);
        assert_eq!(a.body["discrepancies"], 4, "{}", a.body);
        // The same file again changes nothing.
        let again = upload(&shop, provider, &date, file).await;
        let a = run_upload(&shop, provider, &date, &again).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(text(&a.body["id"]), id);
        only_run(&shop, provider, &date).await;
    }

    // Khalti: pulled. Four paid; another amount, another fee, a dropped
    // line, a line not ours; and one paid whose return never came (the
    // list names only Khalti's transaction id: the run learns it by
    // looking the attempt up by pidx), of the foreign line's amount, which
    // stays not ours.
    let mut paid = Vec::new();
    for i in 0..4 {
        paid.push(shop.paid(Via::Khalti, 20_000 + i * 150).await);
    }
    let unreturned = paid_unreturned(&shop, Via::Khalti, "khalti", 4_000).await;
    // Started, never paid, of the same amount: looked up, explains nothing.
    let s = text(&shop.create_checkout(4_000).await["id"]);
    shop.to_wallet(&s, Via::Khalti).await;
    let mut want = Flagged::new();
    want.insert(class("missing_in_dhukuti", &unreturned));
    inject(
        &shop,
        "khalti",
        json!({"kind": "amount", "reference": shop.reference(&paid[0]).await, "amount": 20_100}),
    )
    .await;
    want.insert(class("amount_mismatch", &paid[0]));
    inject(
        &shop,
        "khalti",
        json!({"kind": "fee", "reference": shop.reference(&paid[1]).await, "fee": 1}),
    )
    .await;
    want.insert(class("fee_mismatch", &paid[1]));
    inject(
        &shop,
        "khalti",
        json!({"kind": "drop", "reference": shop.reference(&paid[2]).await}),
    )
    .await;
    want.insert(class("missing_in_provider", &paid[2]));
    let foreign = inject(&shop, "khalti", json!({"kind": "foreign", "amount": 4_000})).await;
    want.insert(class("not_ours", &text(&foreign["provider_ref"])));

    // Two ticks racing: one run.
    let (a, b) = tokio::join!(pull_today(&shop), pull_today(&shop));
    assert_eq!(a.pulled + b.pulled, 1, "{a:?} {b:?}");
    assert_eq!(a.failed + b.failed, 0, "{a:?} {b:?}");
    // The day is done: nothing more.
    assert_eq!(pull_today(&shop).await, PullReport::default());
    let run = only_run(&shop, "khalti", &date).await;
    assert_eq!(run["source"], "pull", "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    let run_id = text(&run["id"]);
    let (got, matched) = flagged(&shop, &run_id).await;
    assert_eq!(got, want, "khalti: flagged exactly the injected");
    assert_eq!(matched, 1);
    // "Settle from provider" pays the unreturned one (Khalti confirms).
    let n = findings(&shop, &run_id)
        .await
        .iter()
        .find(|f| f["paymentId"] == unreturned.as_str())
        .and_then(|f| f["n"].as_u64())
        .unwrap_or_else(|| panic!("no finding of {unreturned}"));
    let a = shop
        .app
        .post(
            &format!("/v1/reconciliation/runs/{run_id}/findings/{n}/settle"),
            Some(&shop.key),
            Some(&format!("s-{}", ulid::Ulid::new())),
            &json!({}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "success", "{}", a.body);
    assert_eq!(shop.payment(&unreturned).await["status"], "success");

    // The day's findings exported: one row per finding of the three runs
    // (6 + 6 + 6), the day in AD and BS.
    let day = nepal_day_of(SystemClock.now());
    let (start, end) = shared::domain::reconciliation::matching::day_bounds(day);
    let csv = export(&shop, &start.to_rfc3339(), &end.to_rfc3339()).await;
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header: Vec<String> = match reader.headers() {
        Ok(h) => h.iter().map(str::to_owned).collect(),
        Err(e) => panic!("{e}: {csv}"),
    };
    assert_eq!(
        header,
        shared::domain::reports::csv::RECONCILIATION_COLUMNS,
        "{csv}"
    );
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or(usize::MAX);
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap_or_default()).collect();
    assert_eq!(rows.len(), 18, "{csv}");
    let (ad, bs) = shared::domain::reports::csv::ad_bs(day);
    let mut per_provider = std::collections::BTreeMap::new();
    for r in &rows {
        assert_eq!(&r[col("date_ad")], ad.as_str(), "{csv}");
        assert_eq!(&r[col("date_bs")], bs.as_str(), "{csv}");
        *per_provider
            .entry(r[col("provider")].to_owned())
            .or_insert(0) += 1;
    }
    assert_eq!(
        per_provider,
        [
            ("esewa".to_owned(), 6),
            ("fonepay".into(), 6),
            ("khalti".into(), 6)
        ]
        .into_iter()
        .collect(),
        "{csv}"
    );
    let mismatch = rows
        .iter()
        .find(|r| &r[col("classification")] == "amount_mismatch" && &r[col("provider")] == "khalti")
        .unwrap_or_else(|| panic!("{csv}"));
    assert_eq!(&mismatch[col("payment_id")], paid[0].as_str());
    assert_eq!(&mismatch[col("theirs_amount_paisa")], "20100");
    assert_eq!(&mismatch[col("theirs_amount_npr")], "201.00");
    shop.stop().await;
}

/// A reconciliation export of `[from, to)`, run to its end: its CSV.
async fn export(shop: &Shop, from: &str, to: &str) -> String {
    let a = shop
        .app
        .post(
            "/v1/reports",
            Some(&shop.key),
            Some(&format!("x-{}", ulid::Ulid::new())),
            &json!({"type": "reconciliation", "from": from, "to": to}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["type"], "reconciliation", "{}", a.body);
    let path = format!("/v1/reports/{}", text(&a.body["id"]));
    let until = Instant::now() + Duration::from_secs(60);
    let url = loop {
        let a = shop.app.get(&path, Some(&shop.key)).await;
        assert_eq!(a.status, 200, "{}", a.body);
        match a.body["status"].as_str() {
            Some("ready") => break text(&a.body["downloadUrl"]),
            Some("pending" | "running") if Instant::now() < until => tokio::task::yield_now().await,
            _ => panic!("report: {}", a.body),
        }
    };
    let res = match shop.app.client.get(&url).send().await {
        Ok(r) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    assert_eq!(res.status(), 200, "GET {url}");
    res.text().await.unwrap_or_default()
}

/// What the receiver got.
#[derive(Default)]
struct Got {
    hits: Mutex<Vec<(HeaderMap, Bytes)>>,
}

async fn receive(State(got): State<Arc<Got>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    got.hits
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((headers, body));
    StatusCode::OK
}

async fn a_completed_run_reaches_a_webhook_with_its_counts(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    enable_khalti(&shop).await;
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("receiver: {e}"),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let got = Arc::new(Got::default());
    let router = axum::Router::new()
        .fallback(receive)
        .with_state(got.clone());
    let receiver = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let a = shop
        .app
        .post(
            "/v1/webhooks",
            Some(&shop.key),
            Some("hook-1"),
            &json!({"url": format!("http://127.0.0.1:{port}/hooks"), "events": ["reconciliation.completed"]}),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let secret = text(&a.body["signing_secret"]);

    for i in 0..2 {
        shop.paid(Via::Khalti, 30_000 + i * 100).await;
    }
    let foreign = inject(&shop, "khalti", json!({"kind": "foreign", "amount": 7_500})).await;
    // Another project whose Khalti key Khalti refuses: its pull fails,
    // ours goes on.
    let other = shop.app.tenant("Hari's Shop", "hari@example.com").await;
    let Some(keys) = shop.app.state().providers.keys() else {
        panic!("the gateway has no credentials key")
    };
    if let Err(e) = shared::domain::credentials::put_credentials(
        &*shop.app.store,
        keys,
        SystemClock.now(),
        &Tenant::new(other.project.id.clone(), Mode::Sandbox),
        &shared::providers::ProviderCredentials::Khalti {
            secret_key: "not-a-key-khalti-knows".into(),
        },
    )
    .await
    {
        panic!("khalti credentials: {e}")
    }
    let pulled = pull_today(&shop).await;
    assert_eq!((pulled.pulled, pulled.failed), (1, 1), "{pulled:?}");
    let date = nepal_day_of(SystemClock.now())
        .format("%Y-%m-%d")
        .to_string();
    let run = only_run(&shop, "khalti", &date).await;

    // Delivered (polled, at most 15 s).
    let until = Instant::now() + Duration::from_secs(15);
    let (headers, body) = loop {
        let first = got
            .hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .cloned();
        if let Some(hit) = first {
            break hit;
        }
        assert!(Instant::now() < until, "no delivery in 15 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let header = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let Err(e) = signature::verify(
        header,
        &body,
        &[secret.as_str()],
        SystemClock.now().unix_seconds(),
    ) {
        panic!("the delivery does not verify: {e}");
    }
    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(event["type"], "reconciliation.completed", "{event}");
    let object = &event["data"]["object"];
    assert_eq!(object["id"], run["id"], "{event}");
    assert_eq!(object["object"], "reconciliation_run", "{event}");
    assert_eq!(object["provider"], "khalti", "{event}");
    assert_eq!(object["date"], date.as_str(), "{event}");
    assert_eq!(object["source"], "pull", "{event}");
    assert_eq!(object["status"], "completed", "{event}");
    assert_eq!(object["counts"]["matched"], 2, "{event}");
    assert_eq!(object["counts"]["notOurs"], 1, "{event}");
    assert_eq!(object["discrepancies"], 1, "{event}");
    assert_eq!(object["lines"], 3, "{event}");
    assert!(!text(&foreign["provider_ref"]).is_empty());
    // Pulled once: one run, one delivery.
    assert_eq!(pull_today(&shop).await, PullReport::default());
    assert_eq!(
        got.hits.lock().unwrap_or_else(|p| p.into_inner()).len(),
        1,
        "one delivery"
    );
    receiver.abort();
    shop.stop().await;
}

/// The local gateway's tick drives the daily pull as the scheduler does:
/// with the clock at 02:00 Nepal time the next day, a tenant with Khalti
/// credentials gets its run of the day before (Khalti's list, today's
/// line not ours in it), its claim done.
async fn the_local_tick_pulls_the_previous_day(which: Which) {
    let today = nepal_day_of(SystemClock.now());
    let (_, midnight) = shared::domain::reconciliation::matching::day_bounds(today);
    let clock = Arc::new(ManualClock::new(midnight.plus(chrono::Duration::hours(2))));
    let Some(app) = spawn_app_tweaked_with_clock(which, clock.clone(), |s| {
        s.sweep_every = Some(Duration::from_millis(100));
    })
    .await
    else {
        return;
    };
    let shop = Shop::on(app).await;
    let foreign = inject(&shop, "khalti", json!({"kind": "foreign", "amount": 6_000})).await;
    enable_khalti(&shop).await;
    // A pass that ran before the credentials came is followed by another
    // RETRY_AFTER later: past it, whenever the first tick ran.
    clock.advance(daily::RETRY_AFTER + chrono::Duration::seconds(1));
    let date = today.format("%Y-%m-%d").to_string();
    let path = format!("/v1/reconciliation/runs?provider=khalti&date={date}");
    let until = Instant::now() + Duration::from_secs(20);
    let run = loop {
        let a = shop.app.get(&path, Some(&shop.key)).await;
        assert_eq!(a.status, 200, "{}", a.body);
        // Listed `running` first, then `completed` by one write.
        if a.body["meta"]["total"] == 1 && a.body["data"][0]["status"] == "completed" {
            break a.body["data"][0].clone();
        }
        assert!(Instant::now() < until, "no run by the tick: {}", a.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(run["source"], "pull", "{run}");
    assert_eq!(run["lines"], 1, "{run}");
    assert_eq!(run["counts"]["notOurs"], 1, "{run}");
    let (got, _) = flagged(&shop, &text(&run["id"])).await;
    assert_eq!(
        got,
        [class("not_ours", &text(&foreign["provider_ref"]))]
            .into_iter()
            .collect::<Flagged>()
    );
    // Its claim is done, naming the run: later passes leave the day alone.
    let claim_key = shared::domain::reconciliation::daily::PullClaim::key(
        &tenant(&shop),
        shared::domain::Provider::Khalti,
        &date,
    );
    let claim: Option<shared::domain::reconciliation::daily::PullClaim> =
        match shared::domain::record::get(&*shop.app.store, &claim_key).await {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
    let Some(claim) = claim else {
        panic!("no claim")
    };
    assert_eq!(
        claim.status,
        shared::domain::reconciliation::daily::PullStatus::Done
    );
    assert_eq!(claim.attempts, 1);
    assert_eq!(claim.run_id.map(|r| r.to_string()), Some(text(&run["id"])));
    shop.stop().await;
}

on_both_backends!(
    simulator_statements_reconcile_to_exactly_the_injected_discrepancies,
    a_completed_run_reaches_a_webhook_with_its_counts,
    the_local_tick_pulls_the_previous_day,
);
