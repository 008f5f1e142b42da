//! Growth: how list, read and analytics answer as one project grows to a
//! million payments on the embedded store (issue 21).
//!
//!     cargo build --release -p dhukuti-bench --bin growth
//!     ./target/release/growth [--max 1000000] [--samples 200]
//!
//! Starts the local gateway on a file-backed embedded store, makes one
//! merchant, project and live key, and fills the project with payments
//! scattered over the last 90 days (one in four failed), each written with
//! its counters as the real write path does (the day's analytics counters
//! and the all-time payment count). At 10k, 100k and 1M payments it sends
//! `--samples` requests of each kind, one after another, and prints their
//! latency: the first page of `GET /v1/payments`, `GET /v1/payments/{id}`
//! of a random payment, and `GET /v1/analytics/overview?days=90`.

use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../local.rs"]
mod local;

use shared::domain::account::{self, KeyKind, NewKey, Plan, Scope};
use shared::domain::checkout::stats::Tally;
use shared::domain::payments::{Payment, PaymentStatus};
use shared::domain::record::Record;
use shared::domain::{Mode, Provider};
use shared::money::{Currency, Paisa};
use shared::store::Store;
use shared::store::embedded::EmbeddedStore;
use shared::time::{Clock, SystemClock, Timestamp};

/// Payments per transaction: with their counter items, within the
/// store's limit of operations per transaction.
const PER_TX: usize = 40;
/// Transactions in flight at once (the writer commits them together).
const WRITERS: usize = 8;

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let max = arg("--max", 1_000_000) as usize;
    let samples = arg("--samples", 200) as usize;

    let tmp = std::env::temp_dir().join(format!("dhukuti-growth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(|e| e.to_string())?);
    let settings = local::local_settings(&tmp)?;
    let running = dhukuti::start_with_store(settings, store.clone()).await?;
    running.state.limits().set(u32::MAX, u32::MAX);

    let now = SystemClock.now();
    let merchant =
        account::create_merchant(&*store, now, "Growth Shop", "g@shop.example", Plan::Pro)
            .await
            .map_err(|e| e.to_string())?;
    let project = account::create_project(&*store, now, &merchant, "Growth", false)
        .await
        .map_err(|e| e.to_string())?;
    let new = NewKey {
        mode: Mode::Live,
        kind: KeyKind::Secret,
        scopes: Scope::ALL.to_vec(),
        description: "growth".into(),
        expires_at: None,
        spend_cap_paisa: None,
    };
    let (key, _) = account::issue_api_key(&running.state, now, &project, new)
        .await
        .map_err(|e| e.to_string())?;

    let client = reqwest::Client::new();
    let base = running.base_url.clone();
    let mut ids: Vec<String> = Vec::with_capacity(max);
    println!("| payments | request | p50 (ms) | p99 (ms) | max (ms) |");
    println!("|---:|---|---:|---:|---:|");
    for checkpoint in [10_000, 100_000, 1_000_000] {
        if checkpoint > max {
            break;
        }
        let started = Instant::now();
        fill(&store, &project.id, now, ids.len(), checkpoint, &mut ids).await?;
        eprintln!(
            "{checkpoint} payments stored ({:.1} s for this step)",
            started.elapsed().as_secs_f64()
        );
        let mut pick = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random_id = || {
            // xorshift: a different payment each time, no crate needed.
            pick ^= pick << 13;
            pick ^= pick >> 7;
            pick ^= pick << 17;
            ids[(pick % ids.len() as u64) as usize].clone()
        };
        for (name, path) in [
            (
                "GET /v1/payments?limit=25",
                "/v1/payments?limit=25".to_owned(),
            ),
            ("GET /v1/payments/{id}", String::new()),
            (
                "GET /v1/analytics/overview?days=90",
                "/v1/analytics/overview?days=90".to_owned(),
            ),
        ] {
            let mut lat = Vec::with_capacity(samples);
            for _ in 0..samples {
                let path = if path.is_empty() {
                    format!("/v1/payments/{}", random_id())
                } else {
                    path.clone()
                };
                let t = Instant::now();
                let res = client
                    .get(format!("{base}{path}"))
                    .bearer_auth(&key)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = res.status();
                let _ = res.bytes().await;
                if !status.is_success() {
                    return Err(format!("{path}: HTTP {status}"));
                }
                lat.push(t.elapsed());
            }
            lat.sort_unstable();
            let at = |q: f64| {
                let i = ((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1));
                ms(lat.get(i).copied().unwrap_or_default())
            };
            println!(
                "| {checkpoint} | {name} | {:.3} | {:.3} | {:.3} |",
                at(0.5),
                at(0.99),
                ms(lat.last().copied().unwrap_or_default())
            );
        }
    }
    let _ = running.stop().await;
    drop(store);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Stores payments `from..to` of the project, [`PER_TX`] a transaction,
/// [`WRITERS`] transactions at once, and keeps their ids.
async fn fill(
    store: &Arc<dyn Store>,
    project_id: &shared::ids::ProjectId,
    now: Timestamp,
    from: usize,
    to: usize,
    ids: &mut Vec<String>,
) -> Result<(), String> {
    let mut next = from;
    while next < to {
        let mut tasks = Vec::with_capacity(WRITERS);
        for _ in 0..WRITERS {
            if next >= to {
                break;
            }
            let end = (next + PER_TX).min(to);
            let batch: Vec<Payment> = (next..end).map(|n| payment(project_id, now, n)).collect();
            ids.extend(batch.iter().map(|p| p.id.to_string()));
            next = end;
            let store = store.clone();
            tasks.push(tokio::spawn(async move { write(&*store, batch).await }));
        }
        for t in futures::future::join_all(tasks).await {
            t.map_err(|e| e.to_string())??;
        }
    }
    Ok(())
}

/// Payment number `n`: created at a minute of the last 90 days that
/// scatters the first payments over all of them (so every checkpoint has
/// 90 days of counters: analytics is measured at the same number of days),
/// one in four failed.
fn payment(project_id: &shared::ids::ProjectId, now: Timestamp, n: usize) -> Payment {
    let minutes = ((n as i64) * 7919) % (90 * 24 * 60);
    let created = now.plus(chrono::Duration::minutes(-minutes));
    let failed = n % 4 == 3;
    Payment {
        id: shared::ids::PaymentId::new(),
        project_id: project_id.clone(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: Mode::Live,
        amount: Paisa::new(10_000 + (n as i64 % 500) * 100).unwrap_or_default(),
        amount_refunded: Paisa::ZERO,
        currency: Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider: [Provider::Esewa, Provider::Khalti, Provider::Fonepay][n % 3],
        status: if failed {
            PaymentStatus::Failed
        } else {
            PaymentStatus::Success
        },
        provider_ref: Some(format!("REF-{n}")),
        failure_reason: failed.then(|| "declined".to_owned()),
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

/// One transaction: the payments and their counters.
async fn write(store: &dyn Store, batch: Vec<Payment>) -> Result<(), String> {
    let mut ops = Vec::with_capacity(batch.len() * 2);
    let mut tally = Tally::new();
    for p in &batch {
        ops.push(p.put_new().map_err(|e| e.to_string())?);
        tally.payment_created(p);
        match p.status {
            PaymentStatus::Success => tally.payment_succeeded(p),
            _ => tally.payment_failed(p),
        }
    }
    tally.apply_to(&mut ops).map_err(|e| e.to_string())?;
    store.transact(ops).await.map_err(|e| e.to_string())
}
