//! Benchmark: metered usage (issue 40 part 6), on the file-backed embedded
//! store.
//!
//!     cargo run -p dhukuti-bench --bin usage -- [--batches 40] [--concurrency 4]
//!
//! 1. Events per second for ONE subscription through batches of 1,000
//!    (`usage::report`, the call the route makes after parsing): without
//!    event keys, then with an `idempotency_key` on every event (two items
//!    each), `--concurrency` batches in flight at once; every event is
//!    then counted back from the store (none lost, none twice).
//!    Baseline from the same run: the same records put straight into the
//!    store, 100 a transaction (the store's ceiling for such items).
//! 2. The cost of issuing an invoice that bills 1,000 usage records (and
//!    10,000): `issue_invoice` of the next period through a counting
//!    wrapper: store calls, items read, time.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use shared::domain::account::{self, Plan};
use shared::domain::billing::calendar::nepal_day;
use shared::domain::billing::invoice::{LineKind, issue_invoice};
use shared::domain::billing::usage::{self, Outcome, UsageAction, UsageEvent, UsageRecord};
use shared::domain::billing::{customers, lifecycle, plans, subscription};
use shared::domain::record::Record;
use shared::domain::{Mode, Tenant};
use shared::ids::UsageRecordId;
use shared::store::counting::CountingStore;
use shared::store::embedded::EmbeddedStore;
use shared::store::{Store, TxOp};
use shared::time::{Clock, ManualClock, Timestamp};
use shared::{AppState, Config};

type Res<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

const T0: &str = "2026-01-10T06:00:00Z";

macro_rules! body {
    ($v:expr) => {
        serde_json::from_value($v).map_err(err)?
    };
}

fn deps_on(store: Arc<dyn Store>, clock: Arc<ManualClock>) -> AppState {
    AppState::new(
        store,
        clock,
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

/// A tenant and a metered subscription (Rs 0.10 a unit), billing from now.
async fn metered(deps: &AppState, name: &str) -> Res<(Tenant, subscription::Subscription)> {
    let now = deps.clock.now();
    let merchant = account::create_merchant(
        &*deps.store,
        now,
        name,
        &format!("{name}@bench.example"),
        Plan::Pro,
    )
    .await
    .map_err(err)?;
    let project = account::create_project(&*deps.store, now, &merchant, "Meter", false)
        .await
        .map_err(err)?;
    let tenant = Tenant::new(project.id, Mode::Sandbox);
    let plan = plans::create(
        deps,
        &tenant,
        body!(json!({"name": "API calls", "amount": 10, "intervalUnit": "month", "pricingModel": "metered"})),
        None,
    )
    .await
    .map_err(err)?;
    let customer = customers::create(deps, &tenant, body!(json!({"name": "Bench"})), None)
        .await
        .map_err(err)?;
    let made = lifecycle::create_subscription(
        deps,
        &tenant,
        body!(json!({"customerId": customer.id.to_string(), "planId": plan.id.to_string()})),
        None,
    )
    .await
    .map_err(err)?;
    Ok((tenant, made.subscription))
}

fn batch(n: usize, keyed: Option<usize>) -> Vec<UsageEvent> {
    (0..n)
        .map(|i| UsageEvent {
            quantity: 1,
            action: UsageAction::Increment,
            timestamp: None,
            idempotency_key: keyed.map(|b| format!("b{b}-e{i}")),
        })
        .collect()
}

/// This process's CPU time (user + system) in seconds, from
/// `/proc/self/stat` (Linux; 0 elsewhere): on a shared machine, events per
/// CPU second say more than events per wall second.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // After the command's closing parenthesis: fields 3.., utime and
    // stime are the 14th and 15th (clock ticks, 100 a second).
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

/// `batches` batches of 1,000 for one subscription, `concurrency` at once.
async fn events_per_second(
    deps: &AppState,
    name: &str,
    batches: usize,
    concurrency: usize,
    keyed: bool,
) -> Res<()> {
    let (tenant, sub) = metered(deps, name).await?;
    let started = Instant::now();
    let cpu = cpu_seconds();
    let mut created = 0usize;
    let mut next = 0usize;
    while next < batches {
        let round: Vec<_> = (next..(next + concurrency).min(batches))
            .map(|b| {
                let events = batch(1000, keyed.then_some(b));
                let (deps, tenant, id) = (deps.clone(), tenant.clone(), sub.id.clone());
                tokio::spawn(async move { usage::report(&deps, &tenant, &id, events).await })
            })
            .collect();
        next += round.len();
        for r in round {
            let outcomes = r.await.map_err(err)?.map_err(err)?;
            created += outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Created(_)))
                .count();
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let today = shared::domain::billing::calendar::nepal_day(deps.clock.now());
    let (tally, _) =
        usage::tally_between(deps, &sub, None, today.succ_opt().unwrap_or(today), None)
            .await
            .map_err(err)?;
    let stored = usize::try_from(tally.records).map_err(err)?;
    let summary = usage::summary(deps, &tenant, &sub.id).await.map_err(err)?;
    println!(
        "  {name}: {created} events in {secs:.2} s = {:.0} events/s ({cpu:.2} CPU s: {:.0} events per CPU second); stored {stored}, summary quantity {}",
        created as f64 / secs,
        created as f64 / cpu.max(0.01),
        summary.quantity
    );
    if stored != created || summary.quantity != created as u64 {
        return Err(format!("{name}: lost or doubled events"));
    }
    Ok(())
}

/// The baseline of the same run: the same records (1,000 a batch,
/// `concurrency` batches at once) put straight into the store, 100 a
/// transaction, with no parsing, seal check or key claim: the store's own
/// rate for such items, the ceiling of `usage::report`.
async fn store_baseline(
    deps: &AppState,
    name: &str,
    batches: usize,
    concurrency: usize,
) -> Res<()> {
    let (_, sub) = metered(deps, name).await?;
    let started = Instant::now();
    let cpu = cpu_seconds();
    let mut next = 0usize;
    while next < batches {
        let round: Vec<_> = (next..(next + concurrency).min(batches))
            .map(|_| {
                let (store, sub, now) = (deps.store.clone(), sub.clone(), deps.clock.now());
                tokio::spawn(async move {
                    let mut txs = Vec::new();
                    for _ in 0..10 {
                        let ops = (0..100)
                            .map(|_| {
                                UsageRecord {
                                    id: UsageRecordId::new(),
                                    subscription_id: sub.id.clone(),
                                    project_id: sub.project_id.clone(),
                                    mode: sub.mode,
                                    quantity: 1,
                                    action: UsageAction::Increment,
                                    timestamp: now,
                                    day: nepal_day(now),
                                    idempotency_key: None,
                                    created_at: now,
                                }
                                .put_new()
                            })
                            .collect::<Result<Vec<TxOp>, _>>()
                            .map_err(err)?;
                        txs.push(ops);
                    }
                    let done =
                        futures::future::join_all(txs.into_iter().map(|ops| store.transact(ops)))
                            .await;
                    done.into_iter().collect::<Result<(), _>>().map_err(err)
                })
            })
            .collect();
        next += round.len();
        for r in round {
            r.await.map_err(err)??;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let n = batches * 1000;
    println!(
        "  {name}: {n} records in {secs:.2} s = {:.0} records/s ({cpu:.2} CPU s: {:.0} records per CPU second)",
        n as f64 / secs,
        n as f64 / cpu.max(0.01),
    );
    Ok(())
}

/// Issues the next period's invoice of a subscription with `records`
/// usage records, through a counting store.
async fn issue_cost(dir: &std::path::Path, records: usize) -> Res<()> {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&dir.join(format!("issue-{records}.redb"))).map_err(err)?);
    let counting = Arc::new(CountingStore::new(store));
    let clock = Arc::new(ManualClock::new(Timestamp::parse(T0).ok_or("T0")?));
    let deps = deps_on(counting.clone(), clock.clone());
    let (tenant, sub) = metered(&deps, &format!("issue{records}")).await?;
    for b in 0..records.div_ceil(1000) {
        let n = (records - b * 1000).min(1000);
        usage::report(&deps, &tenant, &sub.id, batch(n, None))
            .await
            .map_err(err)?;
    }
    let sub = subscription::get(&deps, &tenant, &sub.id)
        .await
        .map_err(err)?;
    let next = sub.period(1).ok_or("no period 1")?;
    clock.advance(chrono::Duration::days(31));
    let (calls, read) = (counting.calls(), counting.items_read());
    let started = Instant::now();
    let issued = issue_invoice(&deps, &sub, next, clock.now())
        .await
        .map_err(err)?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let usage_line = issued
        .invoice
        .lines
        .iter()
        .find(|l| l.kind == LineKind::Usage)
        .ok_or("no usage line")?;
    println!(
        "  {records} records: {} store calls, {} items read, {ms:.1} ms; usage line {} units, {} paisa",
        counting.calls() - calls,
        counting.items_read() - read,
        usage_line.quantity,
        usage_line.amount
    );
    if usage_line.quantity as usize != records {
        return Err("the usage line is wrong".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let batches = arg("--batches", 40);
    let concurrency = arg("--concurrency", 4).max(1);
    let dir = std::env::temp_dir().join(format!("dhukuti-bench-usage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(err)?;
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(&dir.join("events.redb")).map_err(err)?);
    let clock = Arc::new(ManualClock::new(Timestamp::parse(T0).ok_or("T0")?));
    let deps = deps_on(store, clock);
    println!(
        "usage events, one subscription, batches of 1,000 ({batches} batches, {concurrency} at once):"
    );
    events_per_second(&deps, "unkeyed", batches, concurrency, false).await?;
    events_per_second(&deps, "keyed", batches, concurrency, true).await?;
    events_per_second(&deps, "unkeyed-serial", batches / 2, 1, false).await?;
    println!("baseline, the same run: records put straight into the store, 100 a transaction:");
    store_baseline(&deps, "store-puts", batches, concurrency).await?;
    println!("issuing an invoice that bills usage records:");
    issue_cost(&dir, 1000).await?;
    issue_cost(&dir, 10_000).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
