use std::sync::Arc;

use super::*;
use crate::AppState;
use crate::blobs::Blobs;
use crate::blobs::memory::MemoryBlobs;
use crate::domain::Provider;
use crate::domain::payments::{self, AttemptInfo, Checks, Payment, PaymentStatus};
use crate::ids::{PaymentId, ProjectId, SessionId};
use crate::money::{Currency, Paisa};
use crate::providers::ProviderHub;
use crate::secrets::{CredentialsKey, CredentialsKeys};
use crate::time::{Clock, ManualClock, SystemClock};

fn state(blobs: Arc<MemoryBlobs>) -> AppState {
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
        (req("reconciliation", ok, later), "type"),
        (req("billing_invoices", ok, later), "type"),
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
    let err = parse(&req("reconciliation", ok, later)).unwrap_err();
    assert!(err.to_string().contains("not available yet"), "{err}");
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
