//! Issue 41, part 6: the dashboard's Reconciliation page over HTTP, both
//! backends. A developer uploads the day's eSewa statement through the
//! form (`multipart/form-data`, as a browser sends it): the run's page
//! shows its findings, links the payments, and "Settle from provider"
//! pays the one eSewa confirms and refuses the one it does not. The same
//! file again is the same run. "Run Khalti now" pulls Khalti's day. A
//! viewer reads but cannot run or settle; bad input is a page naming the
//! field, never a 500, and runs nothing.

use dhukuti_tests::dash::{Dash, Reply, field};
use dhukuti_tests::shop::{Shop, Via};
use dhukuti_tests::{Which, on_both_backends, send, spawn_app};
use shared::domain::dashboard::Role;
use shared::domain::reconciliation::matching::nepal_day_of;
use shared::domain::{Mode, Provider};
use shared::time::{Clock, SystemClock, Timestamp};

use crate::dashboard_roles::{signed_in, user};

const PAGE: &str = "/dashboard/reconciliation";
const BOUNDARY: &str = "----dhukutiFormBoundary7MA4YWxk";

fn today() -> String {
    nepal_day_of(SystemClock.now())
        .format("%Y-%m-%d")
        .to_string()
}

/// An eSewa portal export for merchant `account`: (reference, paisa) paid
/// at `at`.
fn esewa_csv(account: &str, lines: &[(String, i64)], at: Timestamp) -> String {
    let nepal = at
        .plus(chrono::Duration::minutes(345))
        .datetime()
        .format("%Y-%m-%d %H:%M:%S")
        .to_string();
    let mut out = format!(
        "Merchant Code: {account}\n\
         Transaction UUID,Reference ID,Amount,Service Charge,Transaction Date,Status\n"
    );
    for (reference, paisa) in lines {
        out.push_str(&format!(
            "{reference},,{}.{:02},,{nepal},COMPLETE\n",
            paisa / 100,
            paisa % 100
        ));
    }
    out
}

/// The form as a browser posts it with a file chosen.
fn form_data(fields: &[(&str, &str)], file: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        out.extend_from_slice(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    out.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"statement.csv\"\r\nContent-Type: text/csv\r\n\r\n"
        )
        .as_bytes(),
    );
    out.extend_from_slice(file);
    out.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    out
}

async fn upload(dash: &mut Dash, base: &str, fields: &[(&str, &str)], file: &[u8]) -> Reply {
    upload_body(dash, base, form_data(fields, file)).await
}

/// `body` posted to the upload form as `multipart/form-data`.
async fn upload_body(dash: &mut Dash, base: &str, body: Vec<u8>) -> Reply {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    let req = client
        .post(format!("{base}{PAGE}/uploads"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body);
    dash.send(req).await
}

/// The run id a redirect after a run names.
fn run_of(location: &str) -> String {
    let tail = location
        .strip_prefix(&format!("{PAGE}/runs/"))
        .unwrap_or_else(|| panic!("not a run's page: {location}"));
    tail.split('?').next().unwrap_or_default().to_owned()
}

/// The project's configured eSewa merchant code (the sandbox default).
async fn esewa_account(shop: &Shop) -> String {
    shared::domain::reconciliation::runs::configured_account(
        shop.app.state(),
        &shared::domain::Tenant::new(shop.tenant.project.id.clone(), Mode::Sandbox),
        Provider::Esewa,
    )
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| "EPAYTEST".into())
}

async fn the_page_runs_an_uploaded_statement_and_settles_from_the_provider(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let app = &shop.app;
    let merchant = &shop.tenant.merchant.id;
    user(app, merchant, "dev@recon.example", Role::Developer).await;
    user(app, merchant, "viewer@recon.example", Role::Viewer).await;
    user(app, merchant, "owner@recon.example", Role::Owner).await;

    // One paid through the pages; two left eSewa's page without coming
    // back: the first paid at eSewa, the second did not.
    let matched = shop.paid(Via::Esewa, 40_000).await;
    let mut lines = vec![(shop.reference(&matched).await, 40_000)];
    let mut started = Vec::new();
    for amount in [25_000, 30_000] {
        let s = dhukuti_tests::browser::text(&shop.create_checkout(amount).await["id"]);
        shop.to_wallet(&s, Via::Esewa).await;
        let payment = dhukuti_tests::browser::text(&shop.session(&s).await["paymentId"]);
        lines.push((shop.reference(&payment).await, amount));
        started.push(payment);
    }
    let paid_ref = &lines[1].0;
    let a = send(
        app.client
            .post(shop.sim(&format!("/esewa/_control/attempts/{paid_ref}/pay")))
            .header("content-type", "application/json")
            .body("{}"),
    )
    .await;
    assert!(a.status < 300, "{}", a.body);
    let (paid, unpaid) = (&started[0], &started[1]);
    assert_eq!(shop.payment(paid).await["status"], "pending");
    let file = esewa_csv(&esewa_account(&shop).await, &lines, SystemClock.now());

    let mut dev = signed_in(app, "dev@recon.example").await;
    let page = dev.get(PAGE).await;
    assert_eq!(page.status, 200, "{}", page.show());
    for text in [
        "No reconciliation runs yet.",
        "Upload and run",
        "Run Khalti now",
        "href=\"/dashboard/reconciliation\" aria-current=\"page\"",
        "/dashboard/reconciliation/settlements",
        "enctype=\"multipart/form-data\"",
    ] {
        assert!(page.body.contains(text), "{text}: {}", page.show());
    }
    let csrf = field(&page.body, "csrf");
    let date = today();
    let fields = [
        ("csrf", csrf.as_str()),
        ("provider", "esewa"),
        ("date", date.as_str()),
    ];

    // A form without its token changes nothing.
    let forged = upload(&mut dev, &app.base, &fields[1..], file.as_bytes()).await;
    assert_eq!(forged.status, 403, "{}", forged.show());

    let r = upload(&mut dev, &app.base, &fields, file.as_bytes()).await;
    assert_eq!(r.status, 303, "{}", r.show());
    assert!(r.location.ends_with("?done=ran"), "{}", r.location);
    let id = run_of(&r.location);
    assert!(id.starts_with("rrun_"), "{id}");
    let run = dev.get(&r.location).await;
    assert_eq!(run.status, 200, "{}", run.show());
    for text in [
        "Run completed.",
        "eSewa reconciliation",
        "Missing in Dhukuti",
        "Matched",
        "NPR 400.00",
        "NPR 250.00",
        &format!("href=\"/dashboard/payments/{matched}\""),
        &format!("href=\"/dashboard/payments/{paid}\""),
        &format!("href=\"/dashboard/payments/{unpaid}\""),
    ] {
        assert!(run.body.contains(text), "{text}: {}", run.show());
    }
    assert_eq!(
        run.body.matches("Settle from provider").count(),
        2,
        "{}",
        run.show()
    );
    // The API agrees: one matched, two missing in Dhukuti.
    let api = app
        .get(&format!("/v1/reconciliation/runs/{id}"), Some(&shop.key))
        .await;
    assert_eq!(api.body["counts"]["matched"], 1, "{}", api.body);
    assert_eq!(api.body["counts"]["missingInDhukuti"], 2, "{}", api.body);
    let findings = app
        .get(
            &format!("/v1/reconciliation/runs/{id}/findings"),
            Some(&shop.key),
        )
        .await;
    let n_of = |payment: &str| -> u64 {
        findings.body["data"]
            .as_array()
            .and_then(|all| all.iter().find(|f| f["paymentId"] == payment))
            .and_then(|f| f["n"].as_u64())
            .unwrap_or_else(|| panic!("no finding of {payment}: {}", findings.body))
    };
    // One classification at a time.
    let only = dev
        .get(&format!("{PAGE}/runs/{id}?classification=matched"))
        .await;
    assert_eq!(only.status, 200, "{}", only.show());
    assert!(
        !only.body.contains("Settle from provider"),
        "{}",
        only.show()
    );

    // The viewer reads, but neither runs nor settles.
    let mut viewer = signed_in(app, "viewer@recon.example").await;
    let seen = viewer.get(PAGE).await;
    assert_eq!(seen.status, 200, "{}", seen.show());
    assert!(seen.body.contains(&id), "{}", seen.show());
    assert!(!seen.body.contains("Upload and run"), "{}", seen.show());
    let vcsrf = field(&seen.body, "csrf");
    let seen = viewer.get(&format!("{PAGE}/runs/{id}")).await;
    assert!(
        !seen.body.contains("Settle from provider"),
        "{}",
        seen.show()
    );
    let settle_path = |n: u64| format!("{PAGE}/runs/{id}/findings/{n}/settle");
    let refused = viewer
        .post(&settle_path(n_of(paid)), &[("csrf", vcsrf.as_str())])
        .await;
    assert_eq!(refused.status, 403, "{}", refused.show());
    let as_viewer = [
        ("csrf", vcsrf.as_str()),
        ("provider", "esewa"),
        ("date", date.as_str()),
    ];
    let refused = upload(&mut viewer, &app.base, &as_viewer, file.as_bytes()).await;
    assert_eq!(refused.status, 403, "{}", refused.show());
    assert_eq!(shop.payment(paid).await["status"], "pending");

    // Settled from the provider: eSewa confirms the first.
    let r = dev
        .post(&settle_path(n_of(paid)), &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let back = dev.get(&r.location).await;
    assert!(
        back.body.contains(&format!("payment {paid} is now paid")),
        "{}",
        back.show()
    );
    assert!(back.body.contains("Settled "), "{}", back.show());
    assert_eq!(shop.payment(paid).await["status"], "success");
    assert_eq!(shop.events_about("payment.succeeded", paid).await, 1);
    // ... and not the second: nothing changes on the file's word.
    let r = dev
        .post(&settle_path(n_of(unpaid)), &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(r.status, 409, "{}", r.show());
    assert!(r.body.contains("does not confirm"), "{}", r.show());
    assert_ne!(shop.payment(unpaid).await["status"], "success");
    // A matched line is not settled; a finding that is not there is a 404.
    let r = dev
        .post(&settle_path(n_of(&matched)), &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(r.status, 409, "{}", r.show());
    let r = dev.post(&settle_path(99), &[("csrf", csrf.as_str())]).await;
    assert_eq!(r.status, 404, "{}", r.show());

    // The same file again: the same run, nothing new.
    let again = upload(&mut dev, &app.base, &fields, file.as_bytes()).await;
    assert_eq!(again.status, 303, "{}", again.show());
    assert!(
        again.location.ends_with("?done=again"),
        "{}",
        again.location
    );
    assert_eq!(run_of(&again.location), id);
    let list = app
        .get("/v1/reconciliation/runs?provider=esewa", Some(&shop.key))
        .await;
    assert_eq!(list.body["meta"]["total"], 1, "{}", list.body);
    let listed = dev.get(PAGE).await;
    assert!(
        listed.body.contains(&format!("href=\"{PAGE}/runs/{id}\"")),
        "{}",
        listed.show()
    );

    // Both in the audit log.
    let mut owner = signed_in(app, "owner@recon.example").await;
    let log = owner.get("/dashboard/audit").await;
    for action in ["reconciliation.run", "reconciliation.settle"] {
        assert!(log.body.contains(action), "{action}: {}", log.show());
    }
    shop.stop().await;
}

async fn run_khalti_now_pulls_the_day(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let paid = shop.paid(Via::Khalti, 100_000).await;
    user(
        &shop.app,
        &shop.tenant.merchant.id,
        "dev@khalti.example",
        Role::Developer,
    )
    .await;
    let mut dev = signed_in(&shop.app, "dev@khalti.example").await;
    let csrf = dev.csrf_of(PAGE).await;
    let date = today();
    let r = dev
        .post(
            &format!("{PAGE}/khalti"),
            &[("csrf", csrf.as_str()), ("date", date.as_str())],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.show());
    let id = run_of(&r.location);
    let run = dev.get(&r.location).await;
    assert_eq!(run.status, 200, "{}", run.show());
    assert!(run.body.contains("Khalti reconciliation"), "{}", run.show());
    assert!(run.body.contains("pulled"), "{}", run.show());
    assert!(
        run.body
            .contains(&format!("href=\"/dashboard/payments/{paid}\"")),
        "{}",
        run.show()
    );
    let api = shop
        .app
        .get(&format!("/v1/reconciliation/runs/{id}"), Some(&shop.key))
        .await;
    assert_eq!(api.body["source"], "pull", "{}", api.body);
    assert_eq!(api.body["counts"]["matched"], 1, "{}", api.body);
    shop.stop().await;
}

async fn bad_input_names_its_field_and_runs_nothing(which: Which) {
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let app = &shop.app;
    user(
        app,
        &shop.tenant.merchant.id,
        "dev@bad.example",
        Role::Developer,
    )
    .await;
    let mut dev = signed_in(app, "dev@bad.example").await;
    let csrf = dev.csrf_of(PAGE).await;
    let date = today();
    let good = esewa_csv(
        &esewa_account(&shop).await,
        &[("R-1".into(), 100)],
        SystemClock.now(),
    );
    let huge = vec![b'a'; 4 * 1024 * 1024 + 1];
    let broken_xlsx = b"PK\x03\x04 not really a workbook".to_vec();
    let unknown_columns = b"Who,What\nx,y\n".to_vec();
    let negative = good.replace("1.00", "-1.00").into_bytes();
    let cases: [(&str, &str, Vec<u8>, u16, &str); 8] = [
        (
            "paypal",
            date.as_str(),
            good.clone().into_bytes(),
            400,
            "Not run: provider:",
        ),
        (
            "khalti",
            date.as_str(),
            good.clone().into_bytes(),
            400,
            "Not run: provider:",
        ),
        (
            "esewa",
            "2026-13-45",
            good.clone().into_bytes(),
            400,
            "Not run: date:",
        ),
        (
            "esewa",
            date.as_str(),
            Vec::new(),
            400,
            "Not run: file: choose a statement file",
        ),
        (
            "esewa",
            date.as_str(),
            huge,
            413,
            "Not run: file: the file is over the 4 MB",
        ),
        ("esewa", date.as_str(), broken_xlsx, 400, "Not run: file:"),
        (
            "esewa",
            date.as_str(),
            unknown_columns,
            400,
            "Not run: file:",
        ),
        ("esewa", date.as_str(), negative, 400, "Not run: file: line"),
    ];
    for (provider, day, file, status, says) in cases {
        let fields = [
            ("csrf", csrf.as_str()),
            ("provider", provider),
            ("date", day),
        ];
        let r = upload(&mut dev, &app.base, &fields, &file).await;
        assert_eq!(r.status, status, "{provider} {day}: {}", r.show());
        assert!(r.body.contains(says), "{says}: {}", r.show());
    }
    // A form cut short; a field the form does not have.
    let fields = [
        ("csrf", csrf.as_str()),
        ("provider", "esewa"),
        ("date", date.as_str()),
    ];
    let whole = form_data(&fields, good.as_bytes());
    for cut in [0, 40, whole.len() / 2, whole.len() - 5] {
        let r = upload_body(&mut dev, &app.base, whole[..cut].to_vec()).await;
        assert_eq!(r.status, 400, "cut at {cut}: {}", r.show());
        assert!(
            r.body.contains("Not run: the form did not arrive whole"),
            "cut at {cut}: {}",
            r.show()
        );
    }
    let extra = [fields.as_slice(), &[("note", "hi")]].concat();
    let r = upload(&mut dev, &app.base, &extra, good.as_bytes()).await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(
        r.body.contains("Not run: note: not a field of this form"),
        "{}",
        r.show()
    );
    // Not a file upload at all; a Khalti day that is not one.
    let r = dev
        .post(
            &format!("{PAGE}/uploads"),
            &[("csrf", csrf.as_str()), ("provider", "esewa")],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(r.body.contains("Not run: file:"), "{}", r.show());
    let r = dev
        .post(
            &format!("{PAGE}/khalti"),
            &[("csrf", csrf.as_str()), ("date", "29-11-2026")],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(r.body.contains("Not run: date:"), "{}", r.show());
    // Nothing ran.
    let page = dev.get(PAGE).await;
    assert!(
        page.body.contains("No reconciliation runs yet."),
        "{}",
        page.show()
    );
    let list = app.get("/v1/reconciliation/runs", Some(&shop.key)).await;
    assert_eq!(list.body["meta"]["total"], 0, "{}", list.body);
    // A run that is not there, a classification that is not one.
    let r = dev.get(&format!("{PAGE}/runs/rrun_nope")).await;
    assert_eq!(r.status, 404, "{}", r.show());
    let r = dev
        .get(&format!(
            "{PAGE}/runs/rrun_01jdw3n0000000000000000000?classification=odd"
        ))
        .await;
    assert_eq!(r.status, 400, "{}", r.show());
    shop.stop().await;
}

/// A run of `project` as a run stores it, `status` as given.
fn seeded_run(
    project: &shared::ids::ProjectId,
    day: u32,
    status: shared::domain::reconciliation::runs::RunStatus,
) -> shared::domain::reconciliation::runs::Run {
    use shared::domain::reconciliation::runs::{Run, RunSource};
    let now = SystemClock.now();
    let counts = shared::domain::reconciliation::matching::Counts {
        matched: day,
        not_ours: 1,
        ..Default::default()
    };
    Run {
        id: shared::ids::ReconRunId::new(),
        project_id: project.clone(),
        mode: Mode::Sandbox,
        provider: Provider::Fonepay,
        day: format!("2026-10-{day:02}"),
        source: RunSource::Upload,
        digest: format!("{day:064x}"),
        status,
        counts,
        ours_total: shared::money::Paisa::ZERO,
        theirs_total: shared::money::Paisa::ZERO,
        lines: day + 1,
        findings: 0,
        failure: None,
        created_at: now,
        completed_at: Some(now),
        ranked: true,
        listed: true,
    }
}

async fn runs_are_paged_newest_first_and_only_the_projects_own(which: Which) {
    use shared::domain::reconciliation::runs::RunStatus;
    let Some(app) = spawn_app(which).await else {
        return;
    };
    let shop = Shop::on(app).await;
    let app = &shop.app;
    let other = app.tenant("Hari's Shop", "hari@example.com").await;
    let mut ids = Vec::new();
    let mut seeded = Vec::new();
    for day in 1..=26 {
        let run = seeded_run(&shop.tenant.project.id, day, RunStatus::Completed);
        ids.push(run.id.to_string());
        seeded.push(run);
    }
    let running = seeded_run(&shop.tenant.project.id, 27, RunStatus::Running);
    let theirs = seeded_run(&other.project.id, 28, RunStatus::Completed);
    for run in seeded.iter().chain([&running, &theirs]) {
        shared::domain::reconciliation::runs::store_new(&*app.store, run)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    ids.push(running.id.to_string());
    // Newest first: by id (ids sort by creation).
    ids.sort();
    ids.reverse();
    user(
        app,
        &shop.tenant.merchant.id,
        "v@pages.example",
        Role::Viewer,
    )
    .await;
    let mut viewer = signed_in(app, "v@pages.example").await;
    let first = viewer.get(PAGE).await;
    assert_eq!(first.status, 200, "{}", first.show());
    let shown = |body: &str| -> Vec<String> {
        body.match_indices(&format!("href=\"{PAGE}/runs/"))
            .map(|(at, m)| {
                body[at + m.len()..]
                    .split('"')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(shown(&first.body), ids[..25].to_vec(), "{}", first.show());
    assert!(first.body.contains("?page=2"), "{}", first.show());
    let second = viewer.get(&format!("{PAGE}?page=2")).await;
    assert_eq!(shown(&second.body), ids[25..].to_vec(), "{}", second.show());
    assert!(!first.body.contains(theirs.id.as_str()), "{}", first.show());
    // Another project's run is not found; a run not completed shows no
    // findings and no counts.
    let r = viewer.get(&format!("{PAGE}/runs/{}", theirs.id)).await;
    assert_eq!(r.status, 404, "{}", r.show());
    let r = viewer.get(&format!("{PAGE}/runs/{}", running.id)).await;
    assert_eq!(r.status, 200, "{}", r.show());
    assert!(r.body.contains("did not complete"), "{}", r.show());
    assert!(
        !r.body.contains("<td class=\"num\">27</td>"),
        "{}",
        r.show()
    );
    let r = viewer.get(&format!("{PAGE}?page=0")).await;
    assert_eq!(r.status, 400, "{}", r.show());
    shop.stop().await;
}

on_both_backends!(
    the_page_runs_an_uploaded_statement_and_settles_from_the_provider,
    run_khalti_now_pulls_the_day,
    bad_input_names_its_field_and_runs_nothing,
    runs_are_paged_newest_first_and_only_the_projects_own,
);
