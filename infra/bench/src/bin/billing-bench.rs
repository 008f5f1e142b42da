//! Benchmark: the billing engine's sweep (issue 39), on the embedded store.
//!
//!     cargo run -p dhukuti-bench --bin billing-bench -- [--projects 10] [--subscriptions 1000]
//!
//! creates `projects` sandbox projects with `subscriptions` monthly
//! subscriptions each through the same domain calls the API makes (a
//! customer each; half on an AD plan, half on a BS plan; one in five with
//! a 30-day trial, the others with their first invoice issued at once and
//! paid), then runs `billing::sweep::sweep` with the scheduler's `BUDGET`
//! until nothing is due, twice: when the paid first invoices' grace ends
//! are due (no invoice to issue), then a month on, when every subscription
//! is due for its next invoice. Prints each sweep (what it advanced and
//! issued, its store calls and writes, its time) and the sweep in which
//! each project's work was done.
//!
//! With `--fairness`, one project with `--big` (100,000) due subscriptions
//! beside `--small-projects` (9) with `--small` (10) each (see
//! [`fairness_bench`]):
//!
//!     cargo run -p dhukuti-bench --bin billing-bench -- --fairness [--big 100000] [--sweeps 3]
//!
//! With `--payments`, the payment path on a gateway whose store holds
//! 10,000 due subscriptions, against one without, and with the sweep
//! running beside it (see [`payments_bench`]):
//!
//!     cargo run -p dhukuti-bench --bin billing-bench -- --payments [--seconds 12] [--rounds 4]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use shared::domain::account::{self, Plan};
use shared::domain::billing::invoice::{PaymentSource, pay_invoice};
use shared::domain::billing::subscription::{NewSubscription, new_subscription};
use shared::domain::billing::sweep::{self, BUDGET, BillingSweepReport};
use shared::domain::billing::{customers, due, lifecycle, plans};
use shared::domain::record::Record;
use shared::domain::{Mode, Provider, Tenant};
use shared::ids::{CustomerId, PaymentId};
use shared::store::embedded::EmbeddedStore;
use shared::store::{
    Cond, Index, Item, Key, Query, QueryPage, SkCond, Store, StoreError, Stored, TxOp, Update,
};
use shared::time::{ManualClock, Timestamp};
use shared::{AppState, Config};

#[path = "../local.rs"]
mod local;
use local::local_settings;

type Res<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// When the subscriptions are created (a Nepal morning).
const T0: &str = "2026-01-10T06:00:00Z";
/// After the paid first invoices' grace ends (7 days), before anything else.
const GRACE_PASS: &str = "2026-01-25T06:00:00Z";
/// After every first period's end (AD 2026-02-10, BS Magh 26 = 2026-02-09)
/// and every 30-day trial's end (2026-02-09), before any later step.
const PERIOD_PASS: &str = "2026-02-12T06:00:00Z";

fn at(s: &str) -> Res<Timestamp> {
    Timestamp::parse(s).ok_or_else(|| format!("not a time: {s}"))
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if args.iter().any(|a| a == "--fairness") {
        return fairness_bench(
            arg("--big", 100_000) as usize,
            arg("--small-projects", 9) as usize,
            arg("--small", 10) as usize,
            arg("--sweeps", 3) as usize,
        )
        .await;
    }
    if args.iter().any(|a| a == "--payments") {
        return payments_bench(PaymentsBench {
            projects: arg("--projects", 10) as usize,
            subscriptions: arg("--subscriptions", 1000) as usize,
            seconds: arg("--seconds", 12),
            rounds: arg("--rounds", 4).max(1) as usize,
            connections: arg("--connections", 32) as usize,
            payments: arg("--payments-each", 10) as usize,
        })
        .await;
    }
    sweep_bench(
        arg("--projects", 10) as usize,
        arg("--subscriptions", 1000) as usize,
    )
    .await
}

// ------------------------------------------------------------ the counter

type StoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = std::result::Result<T, StoreError>> + Send + 'a>>;

/// Forwards to the store and counts its calls, the writes among them
/// (put, update, delete, transaction: each one round trip on DynamoDB),
/// the items the successful ones wrote, and the writes refused (a condition or a
/// conflict: a race lost). Written out by hand, as `bench`'s `CommitClock`.
struct Tally {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
    writes: AtomicU64,
    items: AtomicU64,
    refused: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    calls: u64,
    writes: u64,
    items: u64,
    refused: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            calls: self.calls - o.calls,
            writes: self.writes - o.writes,
            items: self.items - o.items,
            refused: self.refused - o.refused,
        }
    }
}

impl Tally {
    fn new(inner: Arc<dyn Store>) -> Self {
        Tally {
            inner,
            calls: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            items: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn counts(&self) -> Counts {
        Counts {
            calls: self.calls.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn write<'f, T: Send + 'f>(
        &'f self,
        items: usize,
        fut: StoreFuture<'f, T>,
    ) -> StoreFuture<'f, T> {
        self.call();
        self.writes.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let r = fut.await;
            match &r {
                Ok(_) => self.items.fetch_add(items as u64, Ordering::Relaxed),
                Err(_) => self.refused.fetch_add(1, Ordering::Relaxed),
            };
            r
        })
    }
}

impl Store for Tally {
    fn single_process(&self) -> bool {
        self.inner.single_process()
    }

    fn instance(&self) -> u64 {
        self.inner.instance()
    }

    fn get<'s, 'k, 'f>(&'s self, key: &'k Key) -> StoreFuture<'f, Option<Item>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.call();
        self.inner.get(key)
    }

    fn get_stored<'s, 'k, 'f>(&'s self, key: &'k Key) -> StoreFuture<'f, Option<Stored>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.call();
        self.inner.get_stored(key)
    }

    fn put<'s, 'f>(&'s self, item: Item, cond: Option<Cond>) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.write(1, self.inner.put(item, cond))
    }

    fn update<'s, 'k, 'f>(
        &'s self,
        key: &'k Key,
        update: Update,
        cond: Option<Cond>,
    ) -> StoreFuture<'f, Item>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.write(1, self.inner.update(key, update, cond))
    }

    fn delete<'s, 'k, 'f>(&'s self, key: &'k Key, cond: Option<Cond>) -> StoreFuture<'f, ()>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.write(1, self.inner.delete(key, cond))
    }

    fn transact<'s, 'f>(&'s self, ops: Vec<TxOp>) -> StoreFuture<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        let n = ops.len();
        self.write(n, self.inner.transact(ops))
    }

    fn query<'s, 'q, 'f>(&'s self, query: &'q Query) -> StoreFuture<'f, QueryPage>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        self.call();
        self.inner.query(query)
    }

    fn count<'s, 'q, 'f>(&'s self, query: &'q Query) -> StoreFuture<'f, u64>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        self.call();
        self.inner.count(query)
    }
}

// ------------------------------------------------------------ set-up

/// The billing rules' dependencies on `store`, with a clock at `now`.
fn deps_on(store: Arc<dyn Store>, now: Timestamp) -> AppState {
    AppState::new(
        store,
        Arc::new(ManualClock::new(now)),
        Config {
            public_base_url: "http://127.0.0.1:8080".into(),
            events_base_url: None,
            dashboard_base_url: None,
        },
    )
}

/// A file-backed embedded store in a fresh temporary directory.
fn open_store(name: &str) -> Res<(std::path::PathBuf, Arc<EmbeddedStore>)> {
    let tmp = std::env::temp_dir().join(format!("dhukuti-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(err)?;
    let store = Arc::new(EmbeddedStore::open(&tmp.join("dhukuti.redb")).map_err(err)?);
    Ok((tmp, store))
}

/// `n` sandbox projects, each of its own merchant (on the Pro plan: each
/// has its own monthly SMS quota, 1,000), as tenants.
async fn tenants(store: &dyn Store, n: usize, now: Timestamp) -> Res<Vec<Tenant>> {
    let mut out = Vec::new();
    for i in 0..n {
        let merchant = account::create_merchant(
            store,
            now,
            &format!("Bench ISP {i}"),
            &format!("isp{i}@bench.example"),
            Plan::Pro,
        )
        .await
        .map_err(err)?;
        let project = account::create_project(store, now, &merchant, "Subscribers", false)
            .await
            .map_err(err)?;
        out.push(Tenant::new(project.id, Mode::Sandbox));
    }
    Ok(out)
}

/// A request body as the SDK sends it (camelCase JSON), parsed as the
/// route parses it.
macro_rules! body {
    ($v:expr) => {
        serde_json::from_value($v).map_err(err)?
    };
}

/// What [`fill`] made in one project.
#[derive(Default)]
struct Filled {
    trialing: usize,
    bs: usize,
    first_invoices: usize,
}

/// `n` monthly subscriptions in `tenant` at the clock's time, through the
/// calls the API's routes make: a customer each, the AD or the BS plan in
/// turn, one in five on a 30-day trial; the others' first invoice (issued
/// at once) paid online, which activates them.
async fn fill(deps: &AppState, tenant: &Tenant, n: usize) -> Res<Filled> {
    let now = deps.clock.now();
    let plan = |calendar: &str| {
        json!({
            "name": format!("Fibre 100 Mbps ({calendar})"),
            "amount": 150_000,
            "intervalUnit": "month",
            "calendar": calendar,
            "gracePeriodDays": 7,
            "reminderDaysBeforeDue": 3,
        })
    };
    let ad = plans::create(deps, tenant, body!(plan("ad")), None)
        .await
        .map_err(err)?;
    let bs = plans::create(deps, tenant, body!(plan("bs")), None)
        .await
        .map_err(err)?;
    let mut made = Filled::default();
    for i in 0..n {
        let customer = customers::create(
            deps,
            tenant,
            body!(json!({
                "name": format!("Customer {i}"),
                "email": format!("c{i}@example.com"),
                "phone": (i % 2 == 0).then(|| format!("9841{:06}", i % 1_000_000)),
            })),
            None,
        )
        .await
        .map_err(err)?;
        let on_bs = i % 2 == 1;
        let trial = i % 10 < 2;
        let plan = if on_bs { &bs } else { &ad };
        let created = lifecycle::create_subscription(
            deps,
            tenant,
            body!(json!({
                "customerId": customer.id.to_string(),
                "planId": plan.id.to_string(),
                "trialDays": if trial { 30 } else { 0 },
            })),
            None,
        )
        .await
        .map_err(err)?;
        made.bs += usize::from(on_bs);
        made.trialing += usize::from(trial);
        if let Some(first) = created.first_invoice {
            let source = PaymentSource::Online {
                payment_id: PaymentId::new(),
                provider: Provider::Khalti,
            };
            pay_invoice(
                deps,
                tenant,
                &first.invoice.id,
                source,
                first.invoice.amount_due,
                now,
            )
            .await
            .map_err(err)?;
            made.first_invoices += 1;
        }
    }
    Ok(made)
}

/// Whether `tenant` has anything due at `now` (read from `store` directly,
/// outside the counts).
async fn has_due(store: &dyn Store, tenant: &Tenant, now: Timestamp) -> Res<bool> {
    let query = Query::partition(due::due_partition(tenant))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(due::due_before(now)))
        .limit(1);
    Ok(!store.query(&query).await.map_err(err)?.items.is_empty())
}

/// How many entries `tenant` has due at `now` (outside the counts).
async fn due_count(store: &dyn Store, tenant: &Tenant, now: Timestamp) -> Res<u64> {
    let query = Query::partition(due::due_partition(tenant))
        .on(Index::Gsi2)
        .sk(SkCond::Lt(due::due_before(now)));
    store.count(&query).await.map_err(err)
}

/// One sweep's row.
struct SweepRow {
    report: BillingSweepReport,
    counts: Counts,
    ms: f64,
    /// Tenants with nothing left due after it.
    done: usize,
}

/// Sweeps at `now` with the scheduler's budget until a sweep advances
/// nothing; notes after which sweep each tenant had nothing left due.
async fn sweep_until_done(
    deps: &AppState,
    tally: &Tally,
    raw: &dyn Store,
    tenants: &[Tenant],
    now: Timestamp,
) -> Res<(Vec<SweepRow>, Vec<Option<usize>>)> {
    let mut rows = Vec::new();
    let mut finished: Vec<Option<usize>> = vec![None; tenants.len()];
    loop {
        let before = tally.counts();
        let t = Instant::now();
        let report = sweep::sweep(deps, now, BUDGET).await.map_err(err)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let counts = tally.counts() - before;
        if report.subscriptions_advanced == 0 && report.errors == 0 {
            break;
        }
        let n = rows.len() + 1;
        for (i, tenant) in tenants.iter().enumerate() {
            if finished[i].is_none() && !has_due(raw, tenant, now).await? {
                finished[i] = Some(n);
            }
        }
        let done = finished.iter().filter(|f| f.is_some()).count();
        eprintln!(
            "sweep {n}: {} advanced, {} issued, {} errors, {:.0} ms",
            report.subscriptions_advanced, report.invoices_issued, report.errors, ms
        );
        rows.push(SweepRow {
            report,
            counts,
            ms,
            done,
        });
        if rows.len() > 10_000 {
            return Err("the sweep never finished".into());
        }
    }
    Ok((rows, finished))
}

fn print_sweeps(rows: &[SweepRow], tenants: usize) {
    println!(
        "| sweep | advanced | invoices issued | errors | store calls | writes | items written | writes refused | time (ms) | projects done |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in rows.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {}/{tenants} |",
            i + 1,
            r.report.subscriptions_advanced,
            r.report.invoices_issued,
            r.report.errors,
            r.counts.calls,
            r.counts.writes,
            r.counts.items,
            r.counts.refused,
            r.ms,
            r.done
        );
    }
}

/// Sums and per-unit costs of a pass.
fn print_totals(label: &str, rows: &[SweepRow], per: &str, units: usize) {
    let advanced: usize = rows.iter().map(|r| r.report.subscriptions_advanced).sum();
    let issued: usize = rows.iter().map(|r| r.report.invoices_issued).sum();
    let errors: usize = rows.iter().map(|r| r.report.errors).sum();
    let c = rows.iter().fold(Counts::default(), |a, r| Counts {
        calls: a.calls + r.counts.calls,
        writes: a.writes + r.counts.writes,
        items: a.items + r.counts.items,
        refused: a.refused + r.counts.refused,
    });
    let mut ms: Vec<f64> = rows.iter().map(|r| r.ms).collect();
    ms.sort_by(f64::total_cmp);
    let total_ms: f64 = ms.iter().sum();
    let u = units.max(1) as f64;
    println!(
        "\n{label}: {} sweeps; {advanced} advanced, {issued} invoices issued, {errors} errors; \
         {} store calls, {} writes ({} items, {} refused); \
         per {per}: {:.2} store calls, {:.2} writes, {:.2} items written; \
         sweep time: total {:.1} s, median {:.0} ms, max {:.0} ms",
        rows.len(),
        c.calls,
        c.writes,
        c.items,
        c.refused,
        c.calls as f64 / u,
        c.writes as f64 / u,
        c.items as f64 / u,
        total_ms / 1000.0,
        ms.get(ms.len() / 2).copied().unwrap_or(0.0),
        ms.last().copied().unwrap_or(0.0),
    );
}

// ------------------------------------------------------------ 10 x 1,000

/// See the module: `projects` x `per_project` subscriptions, the grace-end
/// pass, then the period-end pass, each swept until nothing is due.
async fn sweep_bench(projects: usize, per_project: usize) -> Res<()> {
    let (tmp, embedded) = open_store("billing")?;
    let raw: Arc<dyn Store> = embedded.clone();
    let tally = Arc::new(Tally::new(raw.clone()));
    let t0 = at(T0)?;
    let deps = deps_on(tally.clone(), t0);
    let tenants = tenants(&*raw, projects, t0).await?;

    let started = Instant::now();
    let before = tally.counts();
    // The projects fill at once, each one subscription after the other (a
    // project's invoice numbers are one series).
    let filled: Vec<Res<Filled>> = futures::stream::iter(&tenants)
        .map(|t| fill(&deps, t, per_project))
        .buffer_unordered(projects.max(1))
        .collect()
        .await;
    let mut total = Filled::default();
    for f in filled {
        let f = f?;
        total.trialing += f.trialing;
        total.bs += f.bs;
        total.first_invoices += f.first_invoices;
    }
    let made = tally.counts() - before;
    let subs = projects * per_project;
    println!(
        "made {subs} subscriptions in {projects} projects in {:.1} s ({} on the BS plan, {} trialing, \
         {} first invoices issued and paid; {:.1} store calls and {:.1} writes a subscription)\n",
        started.elapsed().as_secs_f64(),
        total.bs,
        total.trialing,
        total.first_invoices,
        made.calls as f64 / subs.max(1) as f64,
        made.writes as f64 / subs.max(1) as f64,
    );

    let grace = at(GRACE_PASS)?;
    println!("## grace ends of the paid first invoices (sweeps at {grace})\n");
    let (rows, _) = sweep_until_done(&deps, &tally, &*raw, &tenants, grace).await?;
    print_sweeps(&rows, tenants.len());
    let advanced: usize = rows.iter().map(|r| r.report.subscriptions_advanced).sum();
    print_totals("grace-end pass", &rows, "subscription advanced", advanced);

    let period = at(PERIOD_PASS)?;
    let mut due_at_start = 0;
    for t in &tenants {
        due_at_start += due_count(&*raw, t, period).await?;
    }
    println!(
        "\n## the next period of every subscription (sweeps at {period}; {due_at_start} due)\n"
    );
    let (rows, finished) = sweep_until_done(&deps, &tally, &*raw, &tenants, period).await?;
    print_sweeps(&rows, tenants.len());
    let issued: usize = rows.iter().map(|r| r.report.invoices_issued).sum();
    print_totals("period-end pass", &rows, "invoice issued", issued);
    let finished: Vec<String> = finished
        .iter()
        .map(|f| f.map_or("-".into(), |n| n.to_string()))
        .collect();
    println!(
        "\nthe sweep in which each project's work was done: {}",
        finished.join(", ")
    );
    println!(
        "invoices issued in the period-end pass: {issued} of {subs} subscriptions (exactly one each: {})",
        issued == subs
    );
    notices_after(&deps, &tally, period).await?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// The notices pass (`notices::pass`, the scheduler's budget) at `now`,
/// pass after pass until one runs nothing: what the invoices and trials
/// the sweeps made have due (each customer has an email, every other one
/// a mobile number too).
async fn notices_after(deps: &AppState, tally: &Tally, now: Timestamp) -> Res<()> {
    use shared::domain::notices;
    println!("\n## the notices pass (at {now})\n");
    println!(
        "| pass | notices run | sent | skipped | deferred | errors | store calls | writes | items written | writes refused | time (ms) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut total = (0usize, 0usize, Counts::default(), 0.0f64);
    for n in 1..=10_000 {
        let before = tally.counts();
        let t = Instant::now();
        let r = notices::pass(deps, now, BUDGET).await.map_err(err)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let c = tally.counts() - before;
        if r.notices_run == 0 && r.errors == 0 {
            break;
        }
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {ms:.0} |",
            r.notices_run,
            r.sent,
            r.skipped,
            r.deferred,
            r.errors,
            c.calls,
            c.writes,
            c.items,
            c.refused
        );
        total.0 += r.notices_run;
        total.1 += r.sent;
        total.2 = Counts {
            calls: total.2.calls + c.calls,
            writes: total.2.writes + c.writes,
            items: total.2.items + c.items,
            refused: total.2.refused + c.refused,
        };
        total.3 += ms;
    }
    let (run, sent, c, ms) = total;
    println!(
        "\nnotices: {run} run, {sent} messages sent; per message sent: {:.2} store calls, {:.2} writes, \
         {:.2} items; per notice run: {:.2} store calls, {:.2} writes; {:.1} s in all",
        c.calls as f64 / sent.max(1) as f64,
        c.writes as f64 / sent.max(1) as f64,
        c.items as f64 / sent.max(1) as f64,
        c.calls as f64 / run.max(1) as f64,
        c.writes as f64 / run.max(1) as f64,
        ms / 1000.0
    );
    Ok(())
}

// ------------------------------------------------------------ fairness

/// One project with `big` subscriptions due and `small_projects` projects
/// with `small` each: which sweep finishes each small project, and how the
/// big one drains. The subscriptions are written directly as records, in
/// transactions of 99 (the records `subscription::create` writes, without
/// its `subscription.created` event and customer counter: neither is read
/// by the sweep): making 100,000 through the API's calls would take most
/// of an hour here. Each is on a 14-day trial from `T0`; the sweeps run on
/// day 15, when each is due for its `trial_will_end` moment and its trial's
/// end (the first invoice). Then `sweeps` sweeps in all.
async fn fairness_bench(big: usize, small_projects: usize, small: usize, sweeps: usize) -> Res<()> {
    let (tmp, embedded) = open_store("billing-fair")?;
    let raw: Arc<dyn Store> = embedded.clone();
    let tally = Arc::new(Tally::new(raw.clone()));
    let t0 = at(T0)?;
    let deps = deps_on(tally.clone(), t0);
    let tenants = tenants(&*raw, 1 + small_projects, t0).await?;
    let trial_end = t0.plus(chrono::Duration::days(14));

    let started = Instant::now();
    for (i, tenant) in tenants.iter().enumerate() {
        let n = if i == 0 { big } else { small };
        let plan = plans::create(
            &deps,
            tenant,
            body!(json!({"name": "Gym monthly", "amount": 250_000, "intervalUnit": "month", "gracePeriodDays": 7})),
            None,
        )
        .await
        .map_err(err)?;
        let terms = lifecycle::terms_of(&plan);
        let mut batches = Vec::new();
        let mut left = n;
        while left > 0 {
            let take = left.min(shared::store::MAX_TX_OPS - 1);
            left -= take;
            let mut ops = vec![due::listed(tenant, t0).map_err(err)?];
            for _ in 0..take {
                let input = NewSubscription {
                    customer_id: CustomerId::new(),
                    plan_id: plan.id.clone(),
                    terms: terms.clone(),
                    reference_id: None,
                    metadata: Default::default(),
                    start: t0,
                    trial_ends_at: Some(trial_end),
                    billing_anchor_day: None,
                    dunning_policy_id: None,
                    test_clock_id: None,
                };
                let sub = new_subscription(tenant, input, t0).map_err(err)?;
                ops.push(sub.put_new().map_err(err)?);
            }
            batches.push(ops);
        }
        let written: Vec<std::result::Result<(), StoreError>> = futures::stream::iter(batches)
            .map(|ops| raw.transact(ops))
            .buffer_unordered(8)
            .collect()
            .await;
        if let Some(Err(e)) = written.into_iter().find(|w| w.is_err()) {
            return Err(format!("writing subscriptions: {e}"));
        }
    }
    let now = t0.plus(chrono::Duration::days(15));
    let mut due_before = Vec::new();
    for t in &tenants {
        due_before.push(due_count(&*raw, t, now).await?);
    }
    println!(
        "wrote {} subscriptions ({big} in the big project, {small} in each of {small_projects}) in {:.1} s; \
         due at {now}: {:?}\n",
        big + small_projects * small,
        started.elapsed().as_secs_f64(),
        due_before
    );

    println!(
        "| sweep | advanced | invoices issued | errors | store calls | writes | writes refused | time (ms) | big project: still due | small projects with work left | small subscriptions still due |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in 1..=sweeps {
        let before = tally.counts();
        let t = Instant::now();
        let report = sweep::sweep(&deps, now, BUDGET).await.map_err(err)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let c = tally.counts() - before;
        let big_left = due_count(&*raw, &tenants[0], now).await?;
        let mut small_left = 0;
        let mut small_projects_left = 0;
        for t in &tenants[1..] {
            let left = due_count(&*raw, t, now).await?;
            small_left += left;
            small_projects_left += usize::from(left > 0);
        }
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {ms:.0} | {big_left} | {small_projects_left} | {small_left} |",
            report.subscriptions_advanced,
            report.invoices_issued,
            report.errors,
            c.calls,
            c.writes,
            c.refused
        );
    }
    println!(
        "\nper sweep the big project gets its turns of sweep::PER_TENANT = {} \
         subscriptions, then the budget ({BUDGET}) no other project needs",
        sweep::PER_TENANT,
    );
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

// ------------------------------------------------------------ payment path

struct PaymentsBench {
    projects: usize,
    subscriptions: usize,
    seconds: u64,
    rounds: usize,
    connections: usize,
    /// Full payments (checkout, Khalti, return) timed per phase and round.
    payments: usize,
}

/// One local gateway under test and what counts its store calls.
struct Gateway {
    running: dhukuti::Running,
    tally: Arc<Tally>,
    key: String,
    tmp: std::path::PathBuf,
}

async fn gateway(name: &str) -> Res<(Gateway, Arc<dyn Store>)> {
    let (tmp, embedded) = open_store(name)?;
    let raw: Arc<dyn Store> = embedded;
    let tally = Arc::new(Tally::new(raw.clone()));
    let running = dhukuti::start_with_store(local_settings(&tmp)?, tally.clone()).await?;
    // Load from one key and one address: the rate limits must not be what
    // is measured.
    running.state.limits().set(u32::MAX, u32::MAX);
    running
        .state
        .public_limits()
        .set(u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX);
    running
        .state
        .public_limits()
        .set_more(u32::MAX, u32::MAX, u32::MAX, u32::MAX);
    let key = running.keys.sandbox.clone();
    Ok((
        Gateway {
            running,
            tally,
            key,
            tmp,
        },
        raw,
    ))
}

/// The store calls of each step of one payment, and its time: `POST
/// /v1/checkout` with an Idempotency-Key, the Khalti hand-off (`POST
/// /c/{id}/pay`), paid at the simulator, the customer's return (verified
/// with the simulator's lookup, settled).
async fn one_payment(g: &Gateway, http: &reqwest::Client) -> Res<([u64; 3], [u64; 3], f64)> {
    let base = &g.running.base_url;
    let t = Instant::now();
    let c0 = g.tally.counts();
    let session: Value = http
        .post(format!("{base}/v1/checkout"))
        .bearer_auth(&g.key)
        .header("idempotency-key", PaymentId::new().to_string())
        .json(&json!({"amount": 150000, "returnUrl": "https://shop.example/thanks"}))
        .send()
        .await
        .map_err(err)?
        .json()
        .await
        .map_err(err)?;
    let c1 = g.tally.counts();
    let id = session["id"]
        .as_str()
        .ok_or_else(|| format!("no session id: {session}"))?;
    let handoff = http
        .post(format!("{base}/c/{id}/pay"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("provider=khalti")
        .send()
        .await
        .map_err(err)?;
    let c2 = g.tally.counts();
    let to = location(&handoff)?;
    let pidx = reqwest::Url::parse(&to)
        .map_err(err)?
        .query_pairs()
        .find(|(k, _)| k == "pidx")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| format!("no pidx in {to}"))?;
    let acted: Value = http
        .post(format!("{base}/sim/khalti/_control/attempts/{pidx}/pay"))
        .send()
        .await
        .map_err(err)?
        .json()
        .await
        .map_err(err)?;
    let callback = acted["callback_url"]
        .as_str()
        .ok_or_else(|| format!("the simulator did not pay: {acted}"))?;
    let c3 = g.tally.counts();
    let back = http.get(callback).send().await.map_err(err)?;
    let c4 = g.tally.counts();
    let landed = location(&back)?;
    if !landed.contains("status=success") {
        return Err(format!("the payment did not succeed: {landed}"));
    }
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let calls = [(c1 - c0).calls, (c2 - c1).calls, (c4 - c3).calls];
    let writes = [(c1 - c0).writes, (c2 - c1).writes, (c4 - c3).writes];
    Ok((calls, writes, ms))
}

fn location(res: &reqwest::Response) -> Res<String> {
    res.headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("expected a redirect, got {}", res.status()))
}

/// `connections` workers, each on its own keep-alive connection, post
/// checkouts (a fresh Idempotency-Key each) until `duration` passes.
async fn checkout_load(
    base: &str,
    key: &str,
    connections: usize,
    duration: Duration,
) -> (usize, usize, f64, Vec<u64>) {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let url = format!("{base}/v1/checkout");
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .build()
                .unwrap_or_default();
            let mut lat = Vec::new();
            let mut errors = 0usize;
            while Instant::now() < deadline {
                let t = Instant::now();
                let ok = match client
                    .post(&url)
                    .bearer_auth(&key)
                    .header("content-type", "application/json")
                    .header("idempotency-key", PaymentId::new().to_string())
                    .body(r#"{"amount": 150000, "returnUrl": "https://shop.example/thanks"}"#)
                    .send()
                    .await
                {
                    Ok(res) => res.status().is_success() && res.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    lat.push(t.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((lat, e)) = t.await {
            all.extend(lat);
            errors += e;
        }
    }
    (all.len(), errors, started.elapsed().as_secs_f64(), all)
}

/// Each value with how often it occurred, `3×58, 4×2`.
fn spread(values: impl Iterator<Item = u64>) -> String {
    let mut seen = std::collections::BTreeMap::new();
    for v in values {
        *seen.entry(v).or_insert(0usize) += 1;
    }
    seen.iter()
        .map(|(v, n)| format!("{v}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pick(sorted: &[u64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0) as f64
        / 1000.0
}

/// What one phase gathered over the rounds.
#[derive(Default)]
struct Phase {
    requests: usize,
    errors: usize,
    seconds: f64,
    lat: Vec<u64>,
    rates: Vec<f64>,
    payment_calls: Vec<[u64; 3]>,
    payment_writes: Vec<[u64; 3]>,
    payment_ms: Vec<f64>,
}

/// The payment path on two local gateways (each its own embedded store on
/// disk, in this process), in alternating rounds: `A`, no billing data;
/// `B`, `projects` x `subscriptions` subscriptions made as the sweep bench
/// makes them (other projects of another merchant), all due; `C`, the same
/// gateway as `B` while the billing sweep runs on its store (the
/// scheduler's `BUDGET`, sweep after sweep, a month later whenever nothing
/// is left due, so it never runs out of work). Each round measures, per
/// phase, `payments` full payments one after the other (the store calls of
/// each step, its time) and `POST /v1/checkout` under load.
async fn payments_bench(cfg: PaymentsBench) -> Res<()> {
    let (a, _) = gateway("billing-pay-a").await?;
    let (b, b_raw) = gateway("billing-pay-b").await?;
    let t0 = at(T0)?;
    let started = Instant::now();
    let billing = deps_on(b_raw.clone(), t0);
    let tenants = tenants(&*b_raw, cfg.projects, t0).await?;
    let filled: Vec<Res<Filled>> = futures::stream::iter(&tenants)
        .map(|t| fill(&billing, t, cfg.subscriptions))
        .buffer_unordered(cfg.projects.max(1))
        .collect()
        .await;
    for f in filled {
        f?;
    }
    let first = at(PERIOD_PASS)?;
    let mut due_now = 0;
    for t in &tenants {
        due_now += due_count(&*b_raw, t, first).await?;
    }
    eprintln!(
        "B: {} subscriptions made in {:.1} s, {due_now} due at {first}",
        cfg.projects * cfg.subscriptions,
        started.elapsed().as_secs_f64()
    );

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(err)?;
    // Warm up: keys remembered, connections open, the simulator's first
    // attempt made.
    for g in [&a, &b] {
        one_payment(g, &http).await?;
        checkout_load(
            &g.running.base_url,
            &g.key,
            cfg.connections,
            Duration::from_secs(1),
        )
        .await;
    }

    let per_round = Duration::from_secs(cfg.seconds) / cfg.rounds as u32;
    let mut phases: [Phase; 3] = Default::default();
    let mut month = 0i64;
    let mut swept = (0usize, 0usize, 0usize);
    for round in 0..cfg.rounds {
        for (p, phase) in phases.iter_mut().enumerate() {
            let g = if p == 0 { &a } else { &b };
            let stop = Arc::new(AtomicBool::new(false));
            let sweeper = (p == 2).then(|| {
                let (billing, stop) = (billing.clone(), stop.clone());
                let from = month;
                tokio::spawn(async move {
                    let (mut sweeps, mut issued, mut month) = (0usize, 0usize, from);
                    while !stop.load(Ordering::Relaxed) {
                        let now = first.plus(chrono::Duration::days(31 * month));
                        match sweep::sweep(&billing, now, BUDGET).await {
                            Ok(r) => {
                                sweeps += 1;
                                issued += r.invoices_issued;
                                if r.subscriptions_advanced == 0 {
                                    month += 1;
                                }
                            }
                            Err(e) => eprintln!("sweep failed: {e}"),
                        }
                    }
                    (sweeps, issued, month)
                })
            });
            for _ in 0..cfg.payments {
                let (calls, writes, ms) = one_payment(g, &http).await?;
                phase.payment_calls.push(calls);
                phase.payment_writes.push(writes);
                phase.payment_ms.push(ms);
            }
            let (requests, errors, secs, lat) =
                checkout_load(&g.running.base_url, &g.key, cfg.connections, per_round).await;
            stop.store(true, Ordering::Relaxed);
            if let Some(s) = sweeper {
                let (sweeps, issued, m) = s.await.map_err(err)?;
                swept.0 += sweeps;
                swept.1 += issued;
                month = m;
            }
            phase.requests += requests;
            phase.errors += errors;
            phase.seconds += secs;
            phase.lat.extend(lat);
            phase.rates.push(requests as f64 / secs);
            eprintln!(
                "round {} phase {}: {:.0} checkouts/s",
                round + 1,
                ["A", "B", "C"][p],
                requests as f64 / secs
            );
        }
    }
    swept.2 = usize::try_from(month).unwrap_or(0);

    let names = [
        "A: no billing data",
        "B: 10,000 due subscriptions in the store",
        "C: as B, the billing sweep running",
    ];
    println!(
        "\nstore calls of each step of one payment, over the {} payments of each phase \
         (`calls×payments`; writes among them in brackets)\n",
        cfg.payments * cfg.rounds,
    );
    println!(
        "| phase | POST /v1/checkout (Idempotency-Key) | POST /c/{{id}}/pay (Khalti) | return (lookup + settle) | payment p50 (ms) | payment max (ms) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, p) in names.iter().zip(&phases) {
        let step = |i: usize| {
            let calls = spread(p.payment_calls.iter().map(|c| c[i]));
            let writes = spread(p.payment_writes.iter().map(|w| w[i]));
            format!("{calls} ({writes})")
        };
        let mut ms = p.payment_ms.clone();
        ms.sort_by(f64::total_cmp);
        println!(
            "| {name} | {} | {} | {} | {:.1} | {:.1} |",
            step(0),
            step(1),
            step(2),
            ms.get(ms.len() / 2).copied().unwrap_or(0.0),
            ms.last().copied().unwrap_or(0.0)
        );
    }
    println!(
        "\nPOST /v1/checkout under load: {} connections, {} rounds of {:.1} s per phase, A B C in turn\n",
        cfg.connections,
        cfg.rounds,
        per_round.as_secs_f64()
    );
    println!(
        "| phase | requests | errors | req/s | p50 (ms) | p99 (ms) | req/s per round | vs A per round |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---|");
    let base_rates = phases[0].rates.clone();
    for (name, p) in names.iter().zip(phases.iter_mut()) {
        p.lat.sort_unstable();
        let rounds = p
            .rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let vs = p
            .rates
            .iter()
            .zip(&base_rates)
            .map(|(r, a)| format!("{:.0}%", 100.0 * r / a.max(1.0)))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "| {name} | {} | {} | {:.0} | {:.2} | {:.2} | {rounds} | {vs} |",
            p.requests,
            p.errors,
            p.requests as f64 / p.seconds.max(1e-9),
            pick(&p.lat, 0.50),
            pick(&p.lat, 0.99),
        );
    }
    println!(
        "\nthe sweep beside C: {} sweeps, {} invoices issued, {} months of due work",
        swept.0, swept.1, swept.2
    );
    for g in [a, b] {
        let _ = g.running.stop().await;
        let _ = std::fs::remove_dir_all(&g.tmp);
    }
    Ok(())
}
