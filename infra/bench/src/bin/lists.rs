//! Filtered lists at scale (issue 41 part 2, issue 37 item 11): a filtered
//! page of payments with its exact total, at offset 0 and deep, on the
//! embedded store holding `--max` payments of one project, against the
//! filter scan main used (`gsi1` with a filter expression and a
//! `Select=COUNT`) in the same run.
//!
//!     cargo run -p dhukuti-bench --bin lists -- [--max 1000000]
//!
//! Writes the payments straight into a file-backed store in big
//! transactions, each with its list counters as the insert writes them
//! (`listing::count_new`), one every 30 s from 2025-06-01 (a million span
//! about a year: two calendar years, 13 months). Then, for each case, one
//! warm-up and one measured read through a counting store: store calls,
//! items read, wall time.

use std::sync::Arc;
use std::time::Instant;

use shared::domain::account::{self, Plan};
use shared::domain::listing::{self, ListFilter};
use shared::domain::payments::{Payment, PaymentStatus};
use shared::domain::record::{Record, Window};
use shared::domain::{Mode, Provider, Tenant};
use shared::keys;
use shared::money::{Currency, Paisa};
use shared::store::counting::CountingStore;
use shared::store::embedded::EmbeddedStore;
use shared::store::{Index, Query, Store, TxOp, query_window};
use shared::time::{Clock, SystemClock, Timestamp};

/// Payments per transaction (with their merged counter writes, within
/// the limit of 100 operations).
const PER_TX: usize = 40;
/// Transactions in flight at once.
const WRITERS: usize = 4;

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let max = args
        .iter()
        .position(|a| a == "--max")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000usize);
    let tmp = std::env::temp_dir().join(format!("dhukuti-lists-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let result = run(&tmp, max).await;
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

async fn run(tmp: &std::path::Path, max: usize) -> Result<(), String> {
    let inner: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(|e| e.to_string())?);
    let now = SystemClock.now();
    let merchant = account::create_merchant(&*inner, now, "Lists", "l@shop.example", Plan::Pro)
        .await
        .map_err(|e| e.to_string())?;
    let project = account::create_project(&*inner, now, &merchant, "Lists", false)
        .await
        .map_err(|e| e.to_string())?;
    let tenant = Tenant::new(project.id.clone(), Mode::Live);
    let started = Instant::now();
    fill(&inner, &tenant, max).await?;
    eprintln!(
        "{max} payments stored in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let store = Arc::new(CountingStore::new(inner));
    let at = |s: &str| Timestamp::parse(s).ok_or(format!("time {s}"));
    let failed_khalti = ListFilter {
        status: Some(listing::status_name(&PaymentStatus::Failed)),
        provider: Some(Provider::Khalti),
        ..Default::default()
    };
    let november = ListFilter {
        from: Some(at("2025-11-01T00:00:00Z")?),
        to: Some(at("2025-12-01T00:00:00Z")?),
        ..Default::default()
    };
    let range_status = ListFilter {
        status: Some(listing::status_name(&PaymentStatus::Success)),
        from: Some(at("2025-08-15T06:00:00Z")?),
        to: Some(at("2026-02-20T18:30:00Z")?),
        ..Default::default()
    };
    let deep = max * 9 / 10;
    println!("| case | offset | total | store calls | items read | time (ms) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, filter, offset) in [
        ("status=failed&provider=khalti", &failed_khalti, 0),
        (
            "status=failed&provider=khalti",
            &failed_khalti,
            max / 12 * 9 / 10,
        ),
        ("createdFrom=2025-11-01&createdTo=2025-12-01", &november, 0),
        (
            "createdFrom=2025-11-01&createdTo=2025-12-01",
            &november,
            80_000,
        ),
        (
            "status=success, 15 Aug 06:00 to 20 Feb 18:30",
            &range_status,
            0,
        ),
        (
            "status=success, 15 Aug 06:00 to 20 Feb 18:30",
            &range_status,
            300_000,
        ),
        ("(no filter)", &ListFilter::default(), deep),
    ] {
        let window = Window::at(offset, 25);
        // Warm-up, then measured.
        listing::page::<Payment>(&*store, &tenant, filter, &window, None, true)
            .await
            .map_err(|e| e.to_string())?;
        let (calls, items) = (store.calls(), store.items_read());
        let t = Instant::now();
        let (page, total, _) =
            listing::page::<Payment>(&*store, &tenant, filter, &window, None, true)
                .await
                .map_err(|e| e.to_string())?;
        let took = t.elapsed();
        if page.is_empty() && (offset as u64) < total {
            return Err(format!("{name}: an empty page at {offset} of {total}"));
        }
        println!(
            "| {name} | {offset} | {total} | {} | {} | {:.1} |",
            store.calls() - calls,
            store.items_read() - items,
            took.as_secs_f64() * 1000.0
        );
    }
    // Baseline: main's filter scan of the same index partition (`gsi1`,
    // every payment of the project, a filter expression), its total a
    // `Select=COUNT` of the partition.
    let scan = Query::partition(keys::per_mode(
        &tenant.project,
        tenant.mode,
        keys::PerMode::Payments,
    ))
    .on(Index::Gsi1)
    .backward()
    .filter(shared::store::Cond::And(vec![
        Payment::STATUS.eq(&PaymentStatus::Failed),
        Payment::PROVIDER.eq(&Provider::Khalti),
    ]));
    for offset in [0, max / 12 * 9 / 10] {
        let (calls, items) = (store.calls(), store.items_read());
        let t = Instant::now();
        let (page, total) =
            tokio::join!(query_window(&*store, &scan, offset, 25), store.count(&scan));
        let (page, total) = (
            page.map_err(|e| e.to_string())?,
            total.map_err(|e| e.to_string())?,
        );
        let took = t.elapsed();
        // `count` reads the partition without answering items: counted
        // here as what it examines.
        println!(
            "| baseline filter scan: status=failed&provider=khalti | {offset} | {total} | {} | {} + {} counted | {:.1} |",
            store.calls() - calls,
            store.items_read() - items,
            max,
            took.as_secs_f64() * 1000.0
        );
        let _ = page;
    }
    Ok(())
}

/// Stores `max` payments, [`PER_TX`] a transaction with their counters.
async fn fill(store: &Arc<dyn Store>, tenant: &Tenant, max: usize) -> Result<(), String> {
    let base = Timestamp::parse("2025-06-01T00:00:00Z").ok_or("base time")?;
    let mut next = 0;
    while next < max {
        let mut tasks = Vec::with_capacity(WRITERS);
        for _ in 0..WRITERS {
            if next >= max {
                break;
            }
            let end = (next + PER_TX).min(max);
            let batch: Vec<Payment> = (next..end).map(|n| payment(tenant, base, n)).collect();
            next = end;
            let store = store.clone();
            tasks.push(tokio::spawn(async move { write(&*store, batch).await }));
        }
        for t in futures::future::join_all(tasks).await {
            t.map_err(|e| e.to_string())??;
        }
        if next % 100_000 < PER_TX * WRITERS {
            eprintln!("{next} payments");
        }
    }
    Ok(())
}

/// Payment number `n`: 30 s after the one before; one in four failed, one
/// in ten pending, the providers in turn.
fn payment(tenant: &Tenant, base: Timestamp, n: usize) -> Payment {
    let created = base.plus(chrono::Duration::seconds(30 * n as i64));
    let status = match n % 20 {
        0 | 7 => PaymentStatus::Pending,
        3 | 5 | 9 | 11 | 15 => PaymentStatus::Failed,
        _ => PaymentStatus::Success,
    };
    Payment {
        id: shared::ids::PaymentId::new(),
        project_id: tenant.project.clone(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: tenant.mode,
        amount: Paisa::new(10_000 + (n as i64 % 500) * 100).unwrap_or_default(),
        amount_refunded: Paisa::ZERO,
        currency: Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider: [Provider::Esewa, Provider::Khalti, Provider::Fonepay][n % 3],
        status,
        provider_ref: Some(format!("REF-{n}")),
        failure_reason: None,
        metadata: Default::default(),
        customer_name: Some("Sita Sharma".into()),
        customer_email: Some("sita@example.com".into()),
        customer_phone: Some("9841000001".into()),
        created_at: created,
        updated_at: created,
        double_payment_of: None,
        scanned_at: None,
        attempt: Default::default(),
        checks: Default::default(),
    }
}

/// One transaction: the payments and their list counters, merged.
async fn write(store: &dyn Store, batch: Vec<Payment>) -> Result<(), String> {
    let mut ops: Vec<TxOp> = Vec::with_capacity(batch.len() * 2);
    for p in &batch {
        ops.push(p.put_new().map_err(|e| e.to_string())?);
    }
    for p in &batch {
        listing::merge_counts(&mut ops, listing::count_new(p));
    }
    store.transact(ops).await.map_err(|e| e.to_string())
}
