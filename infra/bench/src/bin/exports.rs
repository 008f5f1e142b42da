//! Exports at scale (issue 41 part 3): a `payments` report over a project
//! holding `--rows` payments (default 1,000,000), written through the real
//! export code (`reports::create`, then `reports::run` as the report
//! runner calls it) into the local blob store on disk, with the rows a
//! second and the process's peak memory before and after the export.
//!
//!     cargo run -p dhukuti-bench --bin exports -- [--rows 1000000] [--cache-mib 64]
//!
//! Writes the payments straight into a file-backed embedded store in big
//! transactions (as `lists` does), one every 30 s from 2025-06-01 (a
//! million span about 347 days, inside a report's 366; more rows are
//! packed closer), each with an id minted at its `createdAt` (a report
//! finds its records by the time in their ids). Then one report over the
//! whole range; its file is counted back line by line (never read whole)
//! and must hold exactly `--rows` rows.
//!
//! Peak memory is `VmHWM` of `/proc/self/status`: once after seeding,
//! then reset to the current size (`/proc/self/clear_refs`, Linux 4.0+)
//! so the export's own peak is measured from there. Run it at 100,000 and
//! at 1,000,000 rows: the export's peak must not grow with the count.
//! `--cache-mib` bounds redb's page cache (its default grows to 1 GiB as
//! the export reads a big store, which is the cache, not the export).

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use shared::AppState;
use shared::Config;
use shared::blobs::local::LocalDirBlobs;
use shared::domain::account::{self, Plan};
use shared::domain::payments::{Checks, Payment, PaymentStatus};
use shared::domain::record::Record;
use shared::domain::reports::{self, ReportRequest, ReportStatus};
use shared::domain::{Mode, Provider, Tenant};
use shared::ids::{IdKind, PaymentId};
use shared::money::{Currency, Paisa};
use shared::store::embedded::EmbeddedStore;
use shared::store::{Store, TxOp};
use shared::time::{Clock, SystemClock, Timestamp};

type Res<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Payments per transaction (the limit is 100 operations).
const PER_TX: usize = 100;
/// Transactions in flight at once.
const WRITERS: usize = 4;
/// The first payment's time.
const BASE: &str = "2025-06-01T00:00:00Z";

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows = args
        .iter()
        .position(|a| a == "--rows")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000usize)
        .max(1);
    let tmp = std::env::temp_dir().join(format!("dhukuti-exports-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(err)?;
    let cache = args
        .iter()
        .position(|a| a == "--cache-mib")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse::<usize>().ok())
        .map(|mib| mib.max(1) * 1024 * 1024);
    let result = run(&tmp, rows, cache).await;
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

async fn run(tmp: &std::path::Path, rows: usize, cache: Option<usize>) -> Res<()> {
    let file = tmp.join("dhukuti.redb");
    let store: Arc<dyn Store> = Arc::new(
        match cache {
            Some(bytes) => EmbeddedStore::open_with_cache(&file, bytes),
            None => EmbeddedStore::open(&file),
        }
        .map_err(err)?,
    );
    let now = SystemClock.now();
    let merchant = account::create_merchant(&*store, now, "Exports", "x@shop.example", Plan::Pro)
        .await
        .map_err(err)?;
    let project = account::create_project(&*store, now, &merchant, "Exports", false)
        .await
        .map_err(err)?;
    let tenant = Tenant::new(project.id.clone(), Mode::Live);

    let base = Timestamp::parse(BASE).ok_or("base time")?;
    // 30 s apart, closer when 30 s would take the range past a report's
    // 366 days (about 1,050,000 rows).
    let step_ms = (31_000_000_000 / rows as i64).clamp(1, 30_000);
    let started = Instant::now();
    fill(&store, &tenant, base, step_ms, rows).await?;
    let seeded = started.elapsed().as_secs_f64();
    let after_seed = memory();
    println!(
        "seeded {rows} payments in {seeded:.1} s; RSS {} MiB ({} anonymous, {} file), peak (VmHWM) {} MiB",
        mib(after_seed.rss),
        mib(after_seed.anon),
        mib(after_seed.file),
        mib(after_seed.hwm)
    );
    let blobs = Arc::new(LocalDirBlobs::new(tmp.join("blobs")));
    let deps = AppState::new(
        store.clone(),
        Arc::new(SystemClock),
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
    .with_blobs(blobs.clone());
    let reset = reset_peak();

    let from = base;
    let to = base.plus(chrono::Duration::milliseconds(step_ms * rows as i64 + 1000));
    let (from, to) = (from.to_rfc3339(), to.to_rfc3339());
    let req = ReportRequest {
        report_type: "payments",
        from: &from,
        to: &to,
    };
    let before = memory();
    let cpu = cpu_seconds();
    let started = Instant::now();
    let report = reports::create(&deps, &tenant, &req, deps.clock.now())
        .await
        .map_err(err)?;
    let report = reports::run(&deps, &report.id).await.map_err(err)?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let after = memory();
    if report.status != ReportStatus::Ready {
        return Err(format!(
            "the report ended {:?}: {:?}",
            report.status, report.failure
        ));
    }
    let path = blobs.root().join(report.blob_key());
    let counted = count_rows(&path)?;
    let on_disk = std::fs::metadata(&path).map_err(err)?.len();
    println!(
        "exported {} rows, {} bytes of CSV",
        report.rows, report.bytes
    );
    println!(
        "  wall {secs:.2} s = {:.0} rows/s; CPU {cpu:.2} s = {:.0} rows per CPU second",
        report.rows as f64 / secs,
        report.rows as f64 / cpu.max(0.01)
    );
    println!(
        "  resident after the export: {} MiB anonymous, {} MiB file",
        mib(after.anon),
        mib(after.file)
    );
    if reset {
        println!(
            "  RSS before the export {} MiB; peak during it {} MiB (+{} MiB); RSS after {} MiB",
            mib(before.rss),
            mib(after.hwm),
            mib(after.hwm.saturating_sub(before.rss)),
            mib(after.rss)
        );
    } else {
        println!(
            "  (peak not reset: /proc/self/clear_refs not writable) RSS before the export {} MiB; peak so far {} MiB; RSS after {} MiB",
            mib(before.rss),
            mib(after.hwm),
            mib(after.rss)
        );
    }
    println!(
        "| {rows} | {} | {secs:.1} | {:.0} | {cpu:.1} | {} | {} | {} |",
        report.bytes,
        report.rows as f64 / secs,
        mib(after_seed.hwm),
        mib(before.rss),
        mib(after.hwm)
    );
    if report.rows != rows as u64 || counted != rows as u64 {
        return Err(format!(
            "FAILED: {rows} payments stored, the report says {} rows, its file holds {counted}",
            report.rows
        ));
    }
    if on_disk < report.bytes {
        return Err(format!(
            "FAILED: the report says {} bytes, its file holds {on_disk}",
            report.bytes
        ));
    }
    Ok(())
}

/// Stores `rows` payments, [`PER_TX`] a transaction, [`WRITERS`] at once.
async fn fill(
    store: &Arc<dyn Store>,
    tenant: &Tenant,
    base: Timestamp,
    step_ms: i64,
    rows: usize,
) -> Res<()> {
    let mut next = 0;
    while next < rows {
        let mut tasks = Vec::with_capacity(WRITERS);
        for _ in 0..WRITERS {
            if next >= rows {
                break;
            }
            let end = (next + PER_TX).min(rows);
            let batch: Vec<Payment> = (next..end)
                .map(|n| payment(tenant, base, step_ms, n))
                .collect();
            next = end;
            let store = store.clone();
            tasks.push(tokio::spawn(async move { write(&*store, batch).await }));
        }
        for t in futures::future::join_all(tasks).await {
            t.map_err(err)??;
        }
        if next % 100_000 < PER_TX * WRITERS {
            eprintln!("{next} payments");
        }
    }
    Ok(())
}

/// A ULID in our id alphabet (lower-case Crockford base32) for `ms` with
/// `random` as its low 80 bits.
fn ulid_at(ms: u64, random: u128) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let value = (u128::from(ms) << 80) | (random & ((1u128 << 80) - 1));
    (0..26)
        .map(|i| ALPHABET[((value >> (125 - 5 * i)) & 31) as usize] as char)
        .collect()
}

/// Payment number `n`, `step_ms` after the one before, its id minted at
/// its `createdAt`: one in ten pending, one in four failed, one in
/// twenty partly refunded; the providers in turn, Khalti's fee as the
/// provider reported it, the others' as configured.
fn payment(tenant: &Tenant, base: Timestamp, step_ms: i64, n: usize) -> Payment {
    let created = base.plus(chrono::Duration::milliseconds(step_ms * n as i64));
    let ms = u64::try_from(created.unix_millis()).unwrap_or(0);
    // A spread of the counter (odd multiplier: distinct per n).
    let random = (n as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
    let id = PaymentId::stored(format!(
        "{}{}",
        IdKind::Payment.prefix(),
        ulid_at(ms, random)
    ));
    let status = match n % 20 {
        0 | 7 => PaymentStatus::Pending,
        3 | 5 | 9 | 11 | 15 => PaymentStatus::Failed,
        _ => PaymentStatus::Success,
    };
    let provider = [Provider::Esewa, Provider::Khalti, Provider::Fonepay][n % 3];
    let amount = 10_000 + (n as i64 % 500) * 100;
    let fee = amount * 2 / 100;
    let mut checks = Checks::default();
    if status == PaymentStatus::Success {
        if provider == Provider::Khalti {
            checks.fee_provider = Paisa::new(fee).ok();
        } else {
            checks.fee_configured = Paisa::new(fee).ok();
        }
    }
    let refunded = if status == PaymentStatus::Success && n % 20 == 13 {
        amount / 2
    } else {
        0
    };
    let names = [
        "Sita Sharma",
        "Ram Bahadur Thapa",
        "Gita Gurung, Pokhara",
        "=HYPERLINK(\"x\")",
        "Hari \"Dai\" Shrestha",
    ];
    let mut metadata = serde_json::Map::new();
    metadata.insert("orderId".into(), format!("ORD-{n:07}").into());
    Payment {
        id,
        project_id: tenant.project.clone(),
        checkout_session_id: shared::ids::SessionId::new(),
        mode: tenant.mode,
        amount: Paisa::new(amount).unwrap_or_default(),
        amount_refunded: Paisa::new(refunded).unwrap_or_default(),
        currency: Currency::Npr,
        amount_reserved: Default::default(),
        gsi2pk: None,
        gsi2sk: None,
        provider,
        status,
        provider_ref: (status != PaymentStatus::Pending).then(|| format!("REF-{n:08}")),
        failure_reason: (status == PaymentStatus::Failed)
            .then(|| "The customer cancelled the payment".to_owned()),
        metadata,
        customer_name: Some(names[n % names.len()].into()),
        customer_email: Some(format!("customer{}@example.com", n % 5000)),
        customer_phone: Some(format!("98{:08}", n % 100_000_000)),
        created_at: created,
        updated_at: created.plus(chrono::Duration::seconds(40)),
        double_payment_of: None,
        scanned_at: None,
        attempt: Default::default(),
        checks,
    }
}

/// One transaction of new payments.
async fn write(store: &dyn Store, batch: Vec<Payment>) -> Res<()> {
    let ops: Vec<TxOp> = batch
        .iter()
        .map(|p| p.put_new().map_err(err))
        .collect::<Res<_>>()?;
    store.transact(ops).await.map_err(err)
}

/// The data rows of the local blob file at `path`, read line by line:
/// every line less the blob header and the CSV's header (no cell of
/// these payments holds a line break).
fn count_rows(path: &std::path::Path) -> Res<u64> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut line = Vec::new();
    let mut lines = 0u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(err)? == 0 {
            break;
        }
        lines += 1;
    }
    Ok(lines.saturating_sub(2))
}

/// Resident and peak resident memory, in KiB; the resident part in heap
/// and other anonymous pages, and in pages of files.
#[derive(Clone, Copy)]
struct Memory {
    rss: u64,
    hwm: u64,
    anon: u64,
    file: u64,
}

/// This process's `VmRSS` and `VmHWM` from `/proc/self/status` (Linux; 0
/// elsewhere).
fn memory() -> Memory {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss: field("VmRSS:"),
        hwm: field("VmHWM:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
    }
}

/// Resets `VmHWM` to the current resident size (`5` to
/// `/proc/self/clear_refs`); false where that is refused.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn mib(kib: u64) -> u64 {
    kib / 1024
}

/// This process's CPU time (user + system) in seconds, from
/// `/proc/self/stat` (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // After the command's closing parenthesis: utime and stime are the
    // 14th and 15th fields (clock ticks, 100 a second).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
