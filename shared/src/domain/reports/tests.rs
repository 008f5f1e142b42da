use std::sync::Arc;

use super::*;
use crate::AppState;
use crate::blobs::Blobs;
use crate::blobs::memory::MemoryBlobs;
use crate::domain::Provider;
use crate::domain::billing::invoice::BillingInvoice;
use crate::domain::payments::{self, AttemptInfo, Checks, Payment, PaymentStatus};
use crate::ids::{PaymentId, ProjectId, SessionId};
use crate::money::{Currency, Paisa};
use crate::providers::ProviderHub;
use crate::secrets::{CredentialsKey, CredentialsKeys};
use crate::time::{Clock, ManualClock, SystemClock};

fn state(blobs: Arc<MemoryBlobs>) -> AppState {
    state_with(blobs)
}

fn state_with(blobs: Arc<dyn Blobs>) -> AppState {
    let keys = CredentialsKeys::single(CredentialsKey::new("k1", [7u8; 32]).unwrap());
    AppState::for_tests()
        .with_blobs(blobs)
        .with_providers(ProviderHub::keys_only(keys))
}

fn tenant() -> Tenant {
    Tenant::new(ProjectId::from("proj_1"), Mode::Sandbox)
}

fn payment(tenant: &Tenant, amount: i64, name: &str, at: Timestamp) -> Payment {
    Payment {
        id: PaymentId::new(),
        project_id: tenant.project.clone(),
        checkout_session_id: SessionId::new(),
        mode: tenant.mode,
        amount: Paisa::new(amount).unwrap(),
        amount_refunded: Paisa::new(0).unwrap(),
        amount_reserved: Paisa::new(0).unwrap(),
        currency: Currency::default(),
        provider: Provider::Khalti,
        status: PaymentStatus::Success,
        provider_ref: Some("KH1".into()),
        failure_reason: None,
        metadata: Default::default(),
        customer_name: Some(name.into()),
        customer_email: None,
        customer_phone: None,
        created_at: at,
        updated_at: at,
        double_payment_of: None,
        scanned_at: None,
        attempt: AttemptInfo::default(),
        checks: Checks::default(),
        gsi2pk: None,
        gsi2sk: None,
    }
}

fn req<'a>(t: &'a str, from: &'a str, to: &'a str) -> ReportRequest<'a> {
    ReportRequest {
        report_type: t,
        from,
        to,
    }
}

#[test]
fn bad_requests_name_their_field() {
    let ok = "2026-11-01T00:00:00Z";
    let later = "2026-11-02T00:00:00Z";
    for (r, field) in [
        (req("payouts", ok, later), "type"),
        (req("Payments", ok, later), "type"),
        (req("payments", "yesterday", later), "from"),
        (req("payments", ok, "2026-13-01"), "to"),
        (req("payments", later, ok), "to"),
        (req("payments", ok, ok), "to"),
        (
            req("payments", "2025-01-01T00:00:00Z", "2026-01-03T00:00:00Z"),
            "to",
        ),
    ] {
        let refusal: Refusal = parse(&r).unwrap_err().into();
        assert_eq!(refusal.field.as_deref(), Some(field), "{r:?}");
        assert_eq!(refusal.code, "validation_failed");
    }
    let (kind, _, _) = parse(&req("reconciliation", ok, later)).unwrap();
    assert_eq!(kind, ReportType::Reconciliation);
    // 366 days exactly is allowed.
    assert!(
        parse(&req(
            "refunds",
            "2025-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z"
        ))
        .is_ok()
    );
}

#[tokio::test]
async fn a_report_runs_to_a_csv_of_its_range_only() {
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let t = tenant();
    let now = SystemClock.now();
    let inside = payment(&t, 150050, "=cmd|' /C calc'!A0", now);
    let outside = payment(&t, 100, "Old", now.plus(chrono::Duration::days(-3)));
    let other = payment(
        &Tenant::new(ProjectId::from("proj_2"), Mode::Sandbox),
        200,
        "Theirs",
        now,
    );
    for p in [&inside, &outside, &other] {
        payments::insert(&*deps.store, p).await.unwrap();
    }
    let from = now.plus(chrono::Duration::days(-1)).to_rfc3339();
    let to = now.plus(chrono::Duration::days(1)).to_rfc3339();
    let report = create(&deps, &t, &req("payments", &from, &to), now)
        .await
        .unwrap();
    assert_eq!(report.status, ReportStatus::Pending);
    let done = run(&deps, &report.id).await.unwrap();
    assert_eq!(done.status, ReportStatus::Ready, "{done:?}");
    assert_eq!(done.rows, 1);
    let blob = blobs.get(&done.blob_key()).await.unwrap().unwrap();
    assert_eq!(done.bytes, blob.bytes.len() as u64);
    let mut csv = ::csv::Reader::from_reader(blob.bytes.as_ref());
    let header: Vec<String> = csv.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(header, super::csv::PAYMENT_COLUMNS);
    let rows: Vec<::csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(&rows[0][0], inside.id.as_str());
    assert_eq!(&rows[0][3], "150050");
    assert_eq!(&rows[0][4], "1500.50");
    assert_eq!(&rows[0][10], "'=cmd|' /C calc'!A0");
    // Running it again changes nothing.
    let again = run(&deps, &report.id).await.unwrap();
    assert_eq!(again, done);
    // Another tenant does not see it.
    let theirs = Tenant::new(ProjectId::from("proj_2"), Mode::Sandbox);
    assert!(matches!(
        get(&deps, &theirs, &report.id).await,
        Err(ReportError::NotFound(_))
    ));
    let (mine, total) = list(&deps, &t, Window::first(10)).await.unwrap();
    assert_eq!((mine.len(), total), (1, 1));
    let (none, total) = list(&deps, &theirs, Window::first(10)).await.unwrap();
    assert_eq!((none.len(), total), (0, 0));
}

#[tokio::test]
async fn a_local_link_is_refused_when_forged_or_expired() {
    let blobs = Arc::new(MemoryBlobs::new());
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let deps = state(blobs.clone()).with_clock(clock.clone());
    let t = tenant();
    let now = clock.now();
    let from = now.plus(chrono::Duration::days(-1)).to_rfc3339();
    let to = now.plus(chrono::Duration::days(1)).to_rfc3339();
    let report = create(&deps, &t, &req("refunds", &from, &to), now)
        .await
        .unwrap();
    let done = run(&deps, &report.id).await.unwrap();
    assert_eq!((done.status, done.rows), (ReportStatus::Ready, 0));
    let view = ReportView::with_link(&deps, &done, now).await.unwrap();
    let url = view.download_url.unwrap();
    let query = url.split_once('?').unwrap().1;
    let mut expires = "";
    let mut signature = "";
    for pair in query.split('&') {
        match pair.split_once('=').unwrap() {
            ("expires", v) => expires = v,
            ("signature", v) => signature = v,
            _ => {}
        }
    }
    let blob = download(&deps, &report.id, expires, signature, now)
        .await
        .unwrap();
    assert!(blob.bytes.starts_with(b"id,payment_id,status"));
    // Another expiry, another id, a changed signature: not ours.
    let later = (expires.parse::<i64>().unwrap() + 60).to_string();
    let other = ReportId::new();
    let mut forged = signature.to_owned();
    forged.replace_range(0..1, if forged.starts_with('0') { "1" } else { "0" });
    for (id, e, s) in [
        (&report.id, later.as_str(), signature),
        (&other, expires, signature),
        (&report.id, expires, forged.as_str()),
        (&report.id, "x", signature),
    ] {
        let err = download(&deps, id, e, s, now).await.unwrap_err();
        assert!(matches!(err, ReportError::BadLink), "{err:?}");
    }
    clock.advance(link::LINK_TTL);
    let err = download(&deps, &report.id, expires, signature, clock.now())
        .await
        .unwrap_err();
    assert!(matches!(err, ReportError::Expired), "{err:?}");
}

#[tokio::test]
async fn two_drivers_run_a_report_once() {
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let t = tenant();
    let now = deps.clock.now();
    let from = now.plus(chrono::Duration::days(-1)).to_rfc3339();
    let to = now.plus(chrono::Duration::days(1)).to_rfc3339();
    let report = create(&deps, &t, &req("payments", &from, &to), now)
        .await
        .unwrap();
    let first = claim(&deps, report.clone(), now).await.unwrap();
    assert!(first.is_some());
    // The second claim read the same version: it loses.
    assert_eq!(claim(&deps, report.clone(), now).await.unwrap(), None);
    // A live lease keeps others off; a lapsed one lets the next take over.
    let held = first.unwrap();
    assert_eq!(claim(&deps, held.clone(), now).await.unwrap(), None);
    let later = now.plus(LEASE).plus(chrono::Duration::seconds(1));
    assert!(claim(&deps, held, later).await.unwrap().is_some());
}

/// The permits of [`TestBlobs`]' gate: a test holding them all shuts the
/// store (`Semaphore::MAX_PERMITS` does not fit `acquire_many`'s `u32`, so
/// taking "all" of those left most of them open).
const GATE: u32 = 1 << 20;

/// A blob store that fails every write while `fail` is set, and holds
/// every write until `gate` gives a permit.
struct TestBlobs {
    inner: MemoryBlobs,
    fail: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Semaphore,
}

impl TestBlobs {
    fn open() -> Arc<Self> {
        Arc::new(TestBlobs {
            inner: MemoryBlobs::new(),
            fail: false.into(),
            gate: tokio::sync::Semaphore::new(GATE as usize),
        })
    }
}

#[async_trait::async_trait]
impl Blobs for TestBlobs {
    async fn put(
        &self,
        key: &str,
        bytes: bytes::Bytes,
        content_type: &str,
    ) -> Result<(), crate::blobs::BlobError> {
        let _permit = self.gate.acquire().await;
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::blobs::BlobError::Backend("down".into()));
        }
        self.inner.put(key, bytes, content_type).await
    }

    async fn get(&self, key: &str) -> Result<Option<crate::blobs::Blob>, crate::blobs::BlobError> {
        self.inner.get(key).await
    }
}

fn wide(now: Timestamp) -> (String, String) {
    (
        now.plus(chrono::Duration::days(-1)).to_rfc3339(),
        now.plus(chrono::Duration::days(1)).to_rfc3339(),
    )
}

fn csv_rows(bytes: &[u8]) -> (Vec<String>, Vec<::csv::StringRecord>) {
    let mut csv = ::csv::Reader::from_reader(bytes);
    let header = csv.headers().unwrap().iter().map(str::to_owned).collect();
    (header, csv.records().map(Result::unwrap).collect())
}

fn cell<'a>(header: &[String], row: &'a ::csv::StringRecord, column: &str) -> &'a str {
    let at = header.iter().position(|h| h == column).unwrap();
    &row[at]
}

#[tokio::test]
async fn payments_and_refunds_carry_their_fee_and_net() {
    use crate::domain::payments::FeeSource;
    use crate::domain::refunds::{Refund, RefundReason, RefundStatus};
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let t = tenant();
    let now = SystemClock.now();
    let mut fee = payment(&t, 100_000, "Fee", now);
    fee.checks.fee_provider = Some(Paisa::new(2_950).unwrap());
    let plain = payment(&t, 500, "Plain", now);
    for p in [&fee, &plain] {
        payments::insert(&*deps.store, p).await.unwrap();
    }
    let refund = Refund {
        fee: Some(Paisa::new(1_475).unwrap()),
        fee_source: Some(FeeSource::Provider),
        id: crate::ids::RefundId::new(),
        project_id: t.project.clone(),
        payment_id: fee.id.clone(),
        mode: t.mode,
        provider: Provider::Khalti,
        amount: Paisa::new(50_000).unwrap(),
        currency: Currency::Npr,
        reason: RefundReason::Duplicate,
        status: RefundStatus::Processing,
        provider_refund_id: None,
        failure_reason: None,
        notes: None,
        mobile_number: None,
        created_at: now,
        updated_at: now,
        listed: false,
    };
    deps.store
        .transact(vec![
            refund
                .to_item()
                .map(|item| TxOp::Put { item, cond: None })
                .unwrap(),
        ])
        .await
        .unwrap();
    let (from, to) = wide(now);
    let pays = create(&deps, &t, &req("payments", &from, &to), now)
        .await
        .unwrap();
    let refs = create(&deps, &t, &req("refunds", &from, &to), now)
        .await
        .unwrap();
    for r in [&pays, &refs] {
        assert_eq!(run(&deps, &r.id).await.unwrap().status, ReportStatus::Ready);
    }
    let blob = blobs.get(&pays.blob_key()).await.unwrap().unwrap();
    let (header, rows) = csv_rows(&blob.bytes);
    let cells = |row: &::csv::StringRecord| {
        ["fee_paisa", "fee_npr", "net_paisa", "net_npr", "fee_source"]
            .map(|c| cell(&header, row, c).to_owned())
    };
    let of = |id: &PaymentId| rows.iter().find(|r| &r[0] == id.as_str()).unwrap();
    assert_eq!(
        cells(of(&fee.id)),
        ["2950", "29.50", "97050", "970.50", "provider"]
    );
    assert_eq!(cells(of(&plain.id)), ["", "", "", "", ""]);
    let blob = blobs.get(&refs.blob_key()).await.unwrap().unwrap();
    let (header, rows) = csv_rows(&blob.bytes);
    assert_eq!(header, super::csv::REFUND_COLUMNS);
    assert_eq!(rows.len(), 1);
    let got = ["fee_paisa", "fee_npr", "net_paisa", "net_npr", "fee_source"]
        .map(|c| cell(&header, &rows[0], c).to_owned());
    assert_eq!(got, ["1475", "14.75", "48525", "485.25", "provider"]);
}

fn invoice(tenant: &Tenant, number: &str, at: Timestamp) -> BillingInvoice {
    use crate::domain::billing::invoice::{InvoiceKind, InvoiceStatus};
    use crate::ids::{BillingInvoiceId, CustomerId, SubscriptionId};
    let day = chrono::NaiveDate::from_ymd_opt(2026, 11, 29).unwrap();
    BillingInvoice {
        id: BillingInvoiceId::new(),
        project_id: tenant.project.clone(),
        mode: tenant.mode,
        subscription_id: SubscriptionId::new(),
        customer_id: CustomerId::new(),
        number: number.into(),
        status: InvoiceStatus::Paid,
        currency: Currency::Npr,
        lines: Vec::new(),
        subtotal: 100_000,
        discount_total: 10_000,
        tax_total: 11_700,
        total: 101_700,
        credit_applied: 1_700,
        amount_due: 100_000,
        amount_paid: 100_000,
        discount: None,
        tax: None,
        kind: InvoiceKind::Cycle,
        period_start: day,
        period_end: day + chrono::Duration::days(30),
        due_date: day,
        overdue_on: day + chrono::Duration::days(3),
        payment: None,
        overpayments: Vec::new(),
        issued_at: at,
        paid_at: Some(at),
        voided_at: None,
        uncollectible_at: None,
        version: 1,
        created_at: at,
        updated_at: at,
        counted: true,
        narrowed: false,
    }
}

/// One row per billing invoice created in the range, on both modes: a
/// sandbox invoice's `createdAt` follows its test clock (months away from
/// its id's time) and is still found.
#[tokio::test]
async fn a_billing_invoices_report_has_one_row_per_invoice_of_its_range() {
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let now = SystemClock.now();
    for mode in [Mode::Live, Mode::Sandbox] {
        let t = Tenant::new(ProjectId::from("proj_1"), mode);
        // A sandbox clock three months ahead.
        let at = match mode {
            Mode::Live => now,
            Mode::Sandbox => now.plus(chrono::Duration::days(90)),
        };
        let inside = invoice(&t, "=PI-1", at);
        let before = invoice(&t, "PI-0", at.plus(chrono::Duration::days(-5)));
        let other = invoice(&Tenant::new(ProjectId::from("proj_2"), mode), "PI-9", at);
        for i in [&inside, &before, &other] {
            deps.store
                .transact(vec![i.put_new().unwrap()])
                .await
                .unwrap();
        }
        let (from, to) = wide(at);
        let r = create(&deps, &t, &req("billing_invoices", &from, &to), now)
            .await
            .unwrap();
        let done = run(&deps, &r.id).await.unwrap();
        assert_eq!(
            (done.status, done.rows),
            (ReportStatus::Ready, 1),
            "{mode:?}"
        );
        let blob = blobs.get(&done.blob_key()).await.unwrap().unwrap();
        let (header, rows) = csv_rows(&blob.bytes);
        assert_eq!(header, super::csv::INVOICE_COLUMNS);
        let row = &rows[0];
        assert_eq!(&row[0], inside.id.as_str());
        for (column, value) in [
            ("number", "'=PI-1"),
            ("status", "paid"),
            ("subtotal_paisa", "100000"),
            ("subtotal_npr", "1000.00"),
            ("discount_npr", "100.00"),
            ("tax_paisa", "11700"),
            ("total_npr", "1017.00"),
            ("credit_applied_paisa", "1700"),
            ("amount_paid_npr", "1000.00"),
            ("period_start_ad", "2026-11-29"),
            ("period_start_bs", "2083-08-13"),
            ("period_end_ad", "2026-12-29"),
            ("due_date_bs", "2083-08-13"),
            ("paid_at_utc", &at.to_rfc3339()),
            ("voided_at_utc", ""),
        ] {
            assert_eq!(cell(&header, row, column), value, "{column}");
        }
        assert_eq!(
            cell(&header, row, "issued_at_nepal"),
            super::csv::nepal_time(at)
        );
        assert_eq!(
            cell(&header, row, "customer_id"),
            inside.customer_id.as_str()
        );
    }
}

#[tokio::test]
async fn a_tenant_has_at_most_its_bound_of_unfinished_reports_even_racing() {
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let t = tenant();
    let now = deps.clock.now();
    let (from, to) = wide(now);
    let tries = (0..12).map(|_| {
        let deps = deps.clone();
        let t = t.clone();
        let (from, to) = (from.clone(), to.clone());
        tokio::spawn(async move { create(&deps, &t, &req("payments", &from, &to), now).await })
    });
    let mut made = Vec::new();
    for tried in futures::future::join_all(tries).await {
        match tried.unwrap() {
            Ok(r) => made.push(r),
            Err(e) => {
                assert!(matches!(e, ReportError::TooMany), "{e:?}");
                let refusal: Refusal = e.into();
                assert_eq!(refusal.code, TOO_MANY_REPORTS);
                assert!(
                    matches!(refusal.kind, crate::refusal::Kind::Conflict),
                    "{:?}",
                    refusal.kind
                );
            }
        }
    }
    assert_eq!(made.len() as i64, MAX_UNFINISHED);
    // Another tenant is not held back.
    let theirs = Tenant::new(ProjectId::from("proj_2"), Mode::Sandbox);
    assert!(
        create(&deps, &theirs, &req("payments", &from, &to), now)
            .await
            .is_ok()
    );
    // One ends: one more may start.
    assert_eq!(
        run(&deps, &made[0].id).await.unwrap().status,
        ReportStatus::Ready
    );
    assert!(
        create(&deps, &t, &req("payments", &from, &to), now)
            .await
            .is_ok()
    );
    assert!(matches!(
        create(&deps, &t, &req("payments", &from, &to), now).await,
        Err(ReportError::TooMany)
    ));
}

/// A report whose runs keep being cut short (a lapsed lease) or failing
/// is `failed` with a reason after [`MAX_ATTEMPTS`], not retried forever,
/// and gives its place back.
#[tokio::test]
async fn a_report_is_failed_after_its_attempts() {
    let blobs = TestBlobs::open();
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let deps = state_with(blobs.clone()).with_clock(clock.clone());
    let t = tenant();
    let now = clock.now();
    let (from, to) = wide(now);
    // Cut short every time: claimed, then its lease lapses.
    let cut = create(&deps, &t, &req("payments", &from, &to), now)
        .await
        .unwrap();
    for attempt in 1..=MAX_ATTEMPTS {
        let seen = get(&deps, &t, &cut.id).await.unwrap();
        let held = claim(&deps, seen, clock.now()).await.unwrap().unwrap();
        assert_eq!(held.attempts, attempt);
        clock.advance(LEASE + chrono::Duration::seconds(1));
    }
    let seen = get(&deps, &t, &cut.id).await.unwrap();
    assert_eq!(claim(&deps, seen, clock.now()).await.unwrap(), None);
    let failed = get(&deps, &t, &cut.id).await.unwrap();
    assert_eq!(failed.status, ReportStatus::Failed);
    assert!(
        failed
            .failure
            .unwrap()
            .contains("did not finish in 3 attempts")
    );
    // A failing blob store: pending again twice, then failed.
    blobs.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let broken = create(&deps, &t, &req("payments", &from, &to), clock.now())
        .await
        .unwrap();
    for _ in 1..MAX_ATTEMPTS {
        let r = run(&deps, &broken.id).await.unwrap();
        assert_eq!(
            (r.status, r.failure.as_deref()),
            (ReportStatus::Pending, None)
        );
    }
    let r = run(&deps, &broken.id).await.unwrap();
    assert_eq!(r.status, ReportStatus::Failed);
    assert_eq!(r.attempts, MAX_ATTEMPTS);
    // Nothing is unfinished: the tenant may start its full bound again.
    for _ in 0..MAX_UNFINISHED {
        create(&deps, &t, &req("payments", &from, &to), clock.now())
            .await
            .unwrap();
    }
}

/// One tenant's many reports take one of the runner's slots: another
/// tenant's report, asked for after them all, runs in the same run; two
/// reports of one tenant racing for the slot, one gets it.
#[tokio::test]
async fn one_tenant_cannot_take_every_runner_slot() {
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let greedy = tenant();
    let other = Tenant::new(ProjectId::from("proj_2"), Mode::Sandbox);
    let now = deps.clock.now();
    let (from, to) = wide(now);
    let mut theirs = Vec::new();
    for _ in 0..MAX_UNFINISHED {
        theirs.push(
            create(&deps, &greedy, &req("payments", &from, &to), now)
                .await
                .unwrap(),
        );
    }
    let late = create(&deps, &other, &req("payments", &from, &to), now)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    assert_eq!(run_unfinished(&deps, deadline).await.unwrap(), 2);
    assert_eq!(
        get(&deps, &other, &late.id).await.unwrap().status,
        ReportStatus::Ready
    );
    let mut states = Vec::new();
    for r in &theirs {
        states.push(get(&deps, &greedy, &r.id).await.unwrap().status);
    }
    assert_eq!(
        states.iter().filter(|s| **s == ReportStatus::Ready).count(),
        1,
        "{states:?}"
    );
    // Racing claims of two of its reports: one holds the slot.
    let (a, b) = (
        get(&deps, &greedy, &theirs[3].id).await.unwrap(),
        get(&deps, &greedy, &theirs[4].id).await.unwrap(),
    );
    let (x, y) = tokio::join!(claim(&deps, a, now), claim(&deps, b, now));
    let held = [x.unwrap(), y.unwrap()].into_iter().flatten().count();
    assert_eq!(held, 1);
}

/// The local tick hands the runs to a task of their own: it is back while
/// an export still writes (the blob store held shut here), starts no
/// second runner meanwhile, and the export finishes once the store opens.
#[tokio::test]
async fn the_tick_does_not_wait_for_an_export() {
    let blobs = TestBlobs::open();
    let held = blobs.gate.acquire_many(GATE).await.unwrap();
    let deps = state_with(blobs.clone());
    let t = tenant();
    let now = deps.clock.now();
    let (from, to) = wide(now);
    let r = create(&deps, &t, &req("payments", &from, &to), now)
        .await
        .unwrap();
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let task = kick((*deps).clone(), busy.clone()).unwrap();
    // Let the task reach the shut store.
    loop {
        match get(&deps, &t, &r.id).await.unwrap().status {
            ReportStatus::Running => break,
            ReportStatus::Pending => tokio::task::yield_now().await,
            other => panic!("the export ended ({other:?}) with its store shut"),
        }
    }
    assert!(kick((*deps).clone(), busy.clone()).is_none());
    drop(held);
    task.await.unwrap();
    assert_eq!(
        get(&deps, &t, &r.id).await.unwrap().status,
        ReportStatus::Ready
    );
    assert!(kick((*deps).clone(), busy).is_some());
}

/// A reconciliation export: one row per finding of the completed runs
/// whose Nepal day begins in the range (a run of another day, or one not
/// completed, is left out), references from the file neutralised, amounts
/// plain numbers in paisa and rupees.
#[tokio::test]
async fn a_reconciliation_report_has_one_row_per_finding_of_the_days_runs() {
    use crate::domain::reconciliation::matching::{day_bounds, nepal_day_of};
    use crate::domain::reconciliation::runs::{self, RunSource};
    use crate::domain::reconciliation::statements::{
        LineKind, LineStatus, Statement, StatementLine,
    };
    let blobs = Arc::new(MemoryBlobs::new());
    let deps = state(blobs.clone());
    let t = tenant();
    let now = SystemClock.now();
    let day = nepal_day_of(now);
    let mut ours = payment(&t, 150_050, "Sita", now);
    ours.provider = Provider::Esewa;
    ours.attempt.reference = Some("REF-1".into());
    payments::insert(&*deps.store, &ours).await.unwrap();
    let line = |n: u32, reference: &str, amount: i64, at: Timestamp| StatementLine {
        line: n,
        provider: Provider::Esewa,
        reference: Some(reference.into()),
        provider_ref: None,
        kind: LineKind::Payment,
        status: LineStatus::Success,
        amount: Paisa::new(amount).unwrap(),
        fee: None,
        at,
    };
    let statement = |lines: Vec<StatementLine>, digest: &str| Statement {
        provider: Provider::Esewa,
        account: None,
        lines,
        digest: digest.into(),
    };
    // The day's run: ours with another amount, and a line not ours whose
    // reference a spreadsheet would run.
    let today = statement(
        vec![
            line(1, "REF-1", 150_100, now),
            line(2, "=HYPERLINK(\"x\")", 5_000, now),
        ],
        "d1",
    );
    let made = runs::execute(&deps, &t, day, &today, RunSource::Upload, now)
        .await
        .unwrap();
    assert_eq!(made.findings, 2);
    // Another day's run: not in the range.
    let before = day - chrono::Duration::days(2);
    let (start, _) = day_bounds(before);
    let old = statement(vec![line(1, "OTHER", 100, start)], "d0");
    runs::execute(&deps, &t, before, &old, RunSource::Upload, now)
        .await
        .unwrap();

    let (from, to) = day_bounds(day);
    let report = create(
        &deps,
        &t,
        &req(
            "reconciliation",
            &from
                .datetime()
                .with_timezone(&chrono::FixedOffset::east_opt(20_700).unwrap())
                .to_rfc3339(),
            &to.to_rfc3339(),
        ),
        now,
    )
    .await
    .unwrap();
    assert_eq!(report.report_type, ReportType::Reconciliation);
    let done = run(&deps, &report.id).await.unwrap();
    assert_eq!(done.status, ReportStatus::Ready, "{done:?}");
    assert_eq!(done.rows, 2);
    let blob = blobs.get(&done.blob_key()).await.unwrap().unwrap();
    let mut csv = ::csv::Reader::from_reader(blob.bytes.as_ref());
    let header: Vec<String> = csv.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(header, csv::RECONCILIATION_COLUMNS);
    let rows: Vec<Vec<String>> = csv
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect();
    assert_eq!(rows.len(), 2);
    let cell = |row: &Vec<String>, name: &str| {
        let i = header.iter().position(|h| h == name).unwrap();
        row[i].clone()
    };
    let (ad, bs) = csv::ad_bs(day);
    for row in &rows {
        assert_eq!(cell(row, "run_id"), made.id.to_string());
        assert_eq!(cell(row, "provider"), "esewa");
        assert_eq!(cell(row, "source"), "upload");
        assert_eq!(cell(row, "date_ad"), ad);
        assert_eq!(cell(row, "date_bs"), bs);
    }
    assert_eq!(cell(&rows[0], "classification"), "amount_mismatch");
    assert_eq!(cell(&rows[0], "payment_id"), ours.id.to_string());
    assert_eq!(cell(&rows[0], "ours_amount_paisa"), "150050");
    assert_eq!(cell(&rows[0], "ours_amount_npr"), "1500.50");
    assert_eq!(cell(&rows[0], "theirs_amount_paisa"), "150100");
    assert_eq!(cell(&rows[0], "theirs_amount_npr"), "1501.00");
    assert_eq!(cell(&rows[1], "classification"), "not_ours");
    assert_eq!(cell(&rows[1], "reference"), "'=HYPERLINK(\"x\")");
    assert_eq!(cell(&rows[1], "payment_id"), "");
    assert_eq!(cell(&rows[1], "kind"), "payment");
    assert_eq!(cell(&rows[1], "line"), "2");

    // A range without runs: the header alone.
    let empty = create(
        &deps,
        &t,
        &req(
            "reconciliation",
            &to.plus(chrono::Duration::days(3)).to_rfc3339(),
            &to.plus(chrono::Duration::days(4)).to_rfc3339(),
        ),
        now,
    )
    .await
    .unwrap();
    let done = run(&deps, &empty.id).await.unwrap();
    assert_eq!((done.status, done.rows), (ReportStatus::Ready, 0));
}
