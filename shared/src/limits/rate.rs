//! Per-key rate limits (decisions.md, Rate limits): a fixed one-second
//! window per API key, shared by every function instance through the store.
//!
//! One counter item per (key, window second):
//! `pk = RATE#<key id>#<unix second>`, `sk = RATE`, attributes `count` and
//! `ttl` (a minute after the window, for DynamoDB TTL). A request takes a
//! slot with one conditional update, `ADD count 1` if `count < limit` (or
//! `count` is missing): the store applies it atomically, so exactly `limit`
//! requests of a window succeed however many instances race, and the item
//! as written says how many are left. A failed condition is the 429.
//!
//! An instance does not write the counter on every request: it leases
//! slots in blocks (`ADD count n` if `count <= limit - n`) and hands them
//! out from memory until they run out or the window ends
//! ([`RateLimits::take`]). A block is sized to what this instance served
//! in the last window, scaled to what is left of this one, and grows while
//! the window is busy; when a block no longer fits it asks for one slot,
//! and once that is refused it refuses the rest of the window without
//! writing. Slots never outlive their window, so no window admits more
//! than `limit` across every instance; a slot leased and not used by the
//! window's end is lost, which only matters when the key is over its
//! limit (measured in the tests below: within 10% of the limit, at well
//! under 0.2 writes per request).
//!
//! The HTTP edge (crate `edge`) runs the check once per request, right
//! after authentication (a bad key is a 401 that costs nobody's budget),
//! and turns the [`Quota`] it leaves in the request's [`QuotaSlot`] into
//! `X-RateLimit-*` headers or the 429. A store failure of the limiter lets
//! the request through (logged).
//!
//! The local gateway on the embedded store is one process by construction
//! (the store file is locked), so it counts in memory instead
//! ([`RateLimits::counted_in_process`]): the same windows and answers,
//! without a durable write on every request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::kinds::Mode;
use crate::store::{Cond, Key, Store, StoreError, TTL, Update};
use crate::time::Timestamp;

/// Requests per second of a live key unless configured.
pub const DEFAULT_LIVE: u32 = 100;
/// Requests per second of a sandbox key unless configured.
pub const DEFAULT_SANDBOX: u32 = 25;
/// How long a window's counter outlives the window (DynamoDB TTL).
const COUNTER_TTL_SECONDS: i64 = 60;

/// Requests per second per key, by mode. Adjustable while running (the
/// test gateway raises them; a test lowers them for one gateway).
#[derive(Debug)]
pub struct RateLimits {
    live: AtomicU32,
    sandbox: AtomicU32,
    /// `Some`: windows counted in this process, not in the store.
    local: Option<LocalWindows>,
    /// Slots leased from the store's counters, per key.
    leases: Leases,
}

/// Entries kept before the windows over a minute ago are dropped.
const LOCAL_KEYS_SWEEP_AT: usize = 10_000;

/// Each key's current window and its count, in memory: one entry per key
/// (a new window replaces the last).
#[derive(Debug, Default)]
struct LocalWindows(Mutex<HashMap<String, (i64, u32)>>);

impl LocalWindows {
    /// Takes one request of `limit` in `window` for `key_id`: the count
    /// after it, or `None` when the window is full.
    /// A request that read the clock in an earlier window than the entry's
    /// (it was slower, or the clock stepped back) counts in the entry's
    /// window: only a later window starts a new count.
    fn take(&self, key_id: &str, limit: u32, window: Window) -> Option<u32> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > LOCAL_KEYS_SWEEP_AT {
            // Keys unused for a while: their windows are long over.
            map.retain(|_, (start, _)| *start >= window.start - 60);
        }
        let entry = match map.get_mut(key_id) {
            Some(e) => e,
            None => map.entry(key_id.to_owned()).or_insert((window.start, 0)),
        };
        if window.start > entry.0 {
            *entry = (window.start, 0);
        }
        (entry.1 < limit).then(|| {
            entry.1 += 1;
            entry.1
        })
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits::new(DEFAULT_LIVE, DEFAULT_SANDBOX)
    }
}

impl RateLimits {
    /// Limits of at least 1 request per second each.
    pub fn new(live: u32, sandbox: u32) -> Self {
        RateLimits {
            live: AtomicU32::new(live.max(1)),
            sandbox: AtomicU32::new(sandbox.max(1)),
            local: None,
            leases: Leases::default(),
        }
    }

    /// Counts the windows in this process instead of the store: only for
    /// a backend that is one process (the embedded store).
    pub fn counted_in_process(mut self) -> Self {
        self.local = Some(LocalWindows::default());
        self
    }

    /// Takes one request of the limit of a key of `mode` at `now`: in
    /// memory when counted in process, else with [`take`] on `store`.
    pub async fn take(&self, store: &dyn Store, key_id: &str, mode: Mode, now: Timestamp) -> Quota {
        let limit = self.for_mode(mode).max(1);
        let Some(local) = &self.local else {
            return self.leases.take(store, key_id, limit, now).await;
        };
        let window = Window::of(now);
        match local.take(key_id, limit, window) {
            Some(count) => window.quota(limit, limit.saturating_sub(count), None),
            None => window.quota(limit, 0, Some(window.retry_after(now))),
        }
    }

    /// `DHUKUTI_RATE_LIMIT_LIVE` and `DHUKUTI_RATE_LIMIT_SANDBOX`
    /// (requests per second, default 100 and 25).
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`RateLimits::from_env`] reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let read = |name: &str, default: u32| -> Result<u32, String> {
            match lookup(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<u32>() {
                    Ok(n) if n >= 1 => Ok(n),
                    _ => Err(format!(
                        "{name}={v:?} must be a number of requests per second from 1"
                    )),
                },
            }
        };
        Ok(RateLimits::new(
            read("DHUKUTI_RATE_LIMIT_LIVE", DEFAULT_LIVE)?,
            read("DHUKUTI_RATE_LIMIT_SANDBOX", DEFAULT_SANDBOX)?,
        ))
    }

    /// The limit of a key of `mode`.
    pub fn for_mode(&self, mode: Mode) -> u32 {
        match mode {
            Mode::Live => self.live.load(Ordering::Relaxed),
            Mode::Sandbox => self.sandbox.load(Ordering::Relaxed),
        }
    }

    /// Replaces both limits (at least 1 each).
    pub fn set(&self, live: u32, sandbox: u32) {
        self.live.store(live.max(1), Ordering::Relaxed);
        self.sandbox.store(sandbox.max(1), Ordering::Relaxed);
    }
}

/// The one-second window `now` falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Unix second the window starts at.
    pub start: i64,
}

impl Window {
    pub fn of(now: Timestamp) -> Self {
        Window {
            start: now.unix_millis().div_euclid(1000),
        }
    }

    /// Unix second the window ends at (`X-RateLimit-Reset`).
    pub fn reset(self) -> i64 {
        self.start + 1
    }

    /// The answer for a request of this window.
    fn quota(self, limit: u32, remaining: u32, retry_after: Option<i64>) -> Quota {
        Quota {
            limit,
            remaining,
            reset: self.reset(),
            retry_after,
        }
    }

    /// Whole seconds to wait from `now` until the window is over, at
    /// least 1 (`Retry-After`).
    pub fn retry_after(self, now: Timestamp) -> i64 {
        let left_ms = self.reset() * 1000 - now.unix_millis();
        (left_ms + 999).div_euclid(1000).max(1)
    }

    /// The counter item of `key_id` in this window.
    pub fn counter_key(self, key_id: &str) -> Key {
        crate::keys::rate_window(key_id, self.start)
    }
}

/// What the limiter decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub limit: u32,
    pub remaining: u32,
    /// Unix second the window ends at.
    pub reset: i64,
    /// `Some(seconds)` when the request is over the limit.
    pub retry_after: Option<i64>,
}

impl Quota {
    pub fn limited(&self) -> bool {
        self.retry_after.is_some()
    }
}

/// Where the limiter leaves its decision for the edge to turn into
/// headers. Set once per request: a second check of the same request (it
/// should not happen) keeps the first decision.
#[derive(Clone, Debug, Default)]
pub struct QuotaSlot(Arc<OnceLock<Quota>>);

impl QuotaSlot {
    pub fn set(&self, quota: Quota) {
        let _ = self.0.set(quota);
    }

    pub fn get(&self) -> Option<Quota> {
        self.0.get().copied()
    }
}

/// One key's slots in this instance, for one window.
#[derive(Clone, Debug, Default)]
struct Lease {
    /// The window of everything below.
    window: i64,
    /// Leased and not yet handed out: positions in the window's counter
    /// (`first..=last`), each handed out once across every instance, so
    /// `X-RateLimit-Remaining` (the limit less the position) never repeats.
    slots: Vec<(i64, i64)>,
    /// The counter is full: refuse without asking.
    full: bool,
    /// Requests admitted here in this window.
    served: u32,
    /// Requests admitted here in the window before, if it was the last one.
    served_before: u32,
    /// Held while a lease is asked for: one at a time per key here, so
    /// concurrent requests wait for its slots instead of leasing more.
    gate: Arc<tokio::sync::Mutex<()>>,
}

/// Leased slots per key in this instance (see the module documentation).
#[derive(Debug, Default)]
struct Leases(Mutex<HashMap<String, Lease>>);

/// What a request found in its key's lease.
enum Found {
    /// A slot in hand: admitted, with what is left.
    Slot(Window, u32),
    /// The window is known full.
    Full(Window),
    /// Lease (one request at a time: hold the gate).
    Lease(Arc<tokio::sync::Mutex<()>>),
}

impl Leases {
    async fn take(&self, store: &dyn Store, key_id: &str, limit: u32, now: Timestamp) -> Quota {
        let limit = limit.max(1);
        let gate = match self.find(key_id, limit, now) {
            Found::Slot(w, remaining) => return w.quota(limit, remaining, None),
            Found::Full(w) => return w.quota(limit, 0, Some(w.retry_after(now))),
            Found::Lease(gate) => gate,
        };
        let _leasing = gate.lock().await;
        // Another request may have leased while this one waited.
        let (window, block) = match self.find(key_id, limit, now) {
            Found::Slot(w, remaining) => return w.quota(limit, remaining, None),
            Found::Full(w) => return w.quota(limit, 0, Some(w.retry_after(now))),
            Found::Lease(_) => self.block(key_id, limit, now),
        };
        let mut got = lease(store, key_id, window, block, limit).await;
        if matches!(got, Ok(None)) && block > 1 {
            got = lease(store, key_id, window, 1, limit).await;
        }
        match got {
            Ok(Some((count, block))) => {
                let remaining = self.leased(key_id, window, limit, count, block);
                window.quota(limit, remaining, None)
            }
            // Full: unless a lease of this instance's that ran meanwhile
            // left a slot in hand.
            Ok(None) => match self.full(key_id, window) {
                Some(position) => window.quota(limit, remaining(limit, position), None),
                None => window.quota(limit, 0, Some(window.retry_after(now))),
            },
            Err(e) => {
                tracing::warn!(error = %e, key_id, "rate limiter unavailable; request let through");
                window.quota(limit, limit.saturating_sub(1), None)
            }
        }
    }

    /// A slot in hand, the window known full, or the block to lease.
    fn find(&self, key_id: &str, limit: u32, now: Timestamp) -> Found {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let current = Window::of(now);
        if map.len() > LOCAL_KEYS_SWEEP_AT {
            map.retain(|_, l| l.window >= current.start - 60);
        }
        let l = map.entry(key_id.to_owned()).or_default();
        if current.start > l.window {
            let served_before = if l.window == current.start - 1 {
                l.served
            } else {
                0
            };
            *l = Lease {
                window: current.start,
                served_before,
                gate: l.gate.clone(),
                ..Lease::default()
            };
        }
        // A request that read an earlier second counts in the lease's.
        let window = Window { start: l.window };
        if let Some(position) = l.next_slot() {
            l.served += 1;
            return Found::Slot(window, remaining(limit, position));
        }
        if l.full {
            return Found::Full(window);
        }
        Found::Lease(l.gate.clone())
    }

    /// The window to lease in and the block to ask for: what this
    /// instance will likely serve in the rest of the window, at the pace
    /// of the last window or of this one so far if faster (a busy window
    /// grows its blocks), at most [`max_block`].
    fn block(&self, key_id: &str, limit: u32, now: Timestamp) -> (Window, u32) {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (window, served, served_before) = match map.get(key_id) {
            Some(l) => (Window { start: l.window }, l.served, l.served_before),
            None => (Window::of(now), 0, 0),
        };
        let left_ms = (window.reset() * 1000 - now.unix_millis()).clamp(0, 1000);
        let elapsed_ms = (1000 - left_ms).max(1);
        let pace = i64::from(served_before).max(i64::from(served) * 1000 / elapsed_ms);
        let block = (pace * left_ms + 999)
            .div_euclid(1000)
            .clamp(1, i64::from(max_block(limit)));
        (window, u32::try_from(block).unwrap_or(1))
    }

    /// Records a lease of `block` slots that left the counter at `count`:
    /// the first goes to the request that leased them. What is left.
    fn leased(&self, key_id: &str, window: Window, limit: u32, count: i64, block: u32) -> u32 {
        let first = count - i64::from(block) + 1;
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let l = map.entry(key_id.to_owned()).or_default();
        // Unless the window ended meanwhile: then the other slots are lost.
        if l.window == window.start {
            if block > 1 {
                l.slots.push((first + 1, count));
            }
            l.served += 1;
        }
        remaining(limit, first)
    }

    /// Records that `window`'s counter is full; a slot still in hand (a
    /// concurrent lease's), if any, goes to the request.
    fn full(&self, key_id: &str, window: Window) -> Option<i64> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let l = map.get_mut(key_id).filter(|l| l.window == window.start)?;
        l.full = true;
        let position = l.next_slot()?;
        l.served += 1;
        Some(position)
    }
}

/// The largest block an instance leases at once: a quarter of the limit.
fn max_block(limit: u32) -> u32 {
    (limit / 4).max(1)
}

/// Slots left in the window after the request that took the slot at
/// `position` (1 for the window's first).
fn remaining(limit: u32, position: i64) -> u32 {
    u32::try_from((i64::from(limit) - position).max(0)).unwrap_or(0)
}

impl Lease {
    /// The next slot in hand, if any.
    fn next_slot(&mut self) -> Option<i64> {
        let (next, last) = self.slots.first_mut()?;
        let position = *next;
        if *next == *last {
            self.slots.remove(0);
        } else {
            *next += 1;
        }
        Some(position)
    }
}

/// Leases `block` slots of `window` for `key_id`: the counter after it and
/// the block, or `None` when they do not fit.
async fn lease(
    store: &dyn Store,
    key_id: &str,
    window: Window,
    block: u32,
    limit: u32,
) -> Result<Option<(i64, u32)>, StoreError> {
    let update = Update::new()
        .add("count", i64::from(block))
        .set(TTL, window.reset() + COUNTER_TTL_SECONDS);
    let room = Cond::Or(vec![
        Cond::AttrNotExists("count".into()),
        Cond::le("count", i64::from(limit) - i64::from(block)),
    ]);
    match store
        .update(&window.counter_key(key_id), update, Some(room))
        .await
    {
        Ok(item) => {
            let count = item
                .get("count")
                .and_then(|v| v.as_i64())
                .unwrap_or(i64::from(block));
            Ok(Some((count, block)))
        }
        Err(StoreError::ConditionFailed) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes one request of `limit` per second for the key `key_id` at `now`
/// with one write (no lease): the counter as every instance shares it.
/// Never fails: a store error lets the request through (logged), with
/// headers as if it were the window's first request.
pub async fn take(store: &dyn Store, key_id: &str, limit: u32, now: Timestamp) -> Quota {
    let window = Window::of(now);
    let limit = limit.max(1);
    match lease(store, key_id, window, 1, limit).await {
        Ok(Some((count, _))) => window.quota(limit, remaining(limit, count), None),
        Ok(None) => window.quota(limit, 0, Some(window.retry_after(now))),
        Err(e) => {
            tracing::warn!(error = %e, key_id, "rate limiter unavailable; request let through");
            window.quota(limit, limit.saturating_sub(1), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::faults::{Fault, FaultyStore, Op};
    use crate::testenv::at;
    use crate::testenv::memory_store as store;

    #[test]
    fn windows_are_whole_seconds() {
        let t = at("2026-11-22T01:00:00.000Z");
        let w = Window::of(t);
        assert_eq!(w.start, t.unix_seconds());
        assert_eq!(w.reset(), t.unix_seconds() + 1);
        assert_eq!(Window::of(at("2026-11-22T01:00:00.999Z")), w);
        assert_ne!(Window::of(at("2026-11-22T01:00:01.000Z")), w);
        // Retry-After is whole seconds, never 0.
        assert_eq!(w.retry_after(t), 1);
        assert_eq!(w.retry_after(at("2026-11-22T01:00:00.999Z")), 1);
        assert_eq!(
            w.counter_key("ak_1"),
            Key::new(format!("RATE#ak_1#{}", w.start), "RATE")
        );
    }

    #[test]
    fn limits_come_from_the_environment() {
        let none = RateLimits::from_lookup(|_| None);
        let Ok(none) = none else { panic!("{none:?}") };
        assert_eq!(none.for_mode(Mode::Live), 100);
        assert_eq!(none.for_mode(Mode::Sandbox), 25);
        let set = RateLimits::from_lookup(|n| {
            Some(if n.ends_with("LIVE") { "7" } else { " 3 " }.to_owned())
        });
        let Ok(set) = set else { panic!("{set:?}") };
        assert_eq!(
            (set.for_mode(Mode::Live), set.for_mode(Mode::Sandbox)),
            (7, 3)
        );
        for bad in ["0", "-1", "x", "1.5"] {
            assert!(RateLimits::from_lookup(|_| Some(bad.to_owned())).is_err());
        }
        set.set(0, 9);
        assert_eq!(
            (set.for_mode(Mode::Live), set.for_mode(Mode::Sandbox)),
            (1, 9)
        );
    }

    #[tokio::test]
    async fn exactly_the_limit_passes_per_window_and_key() {
        let store = store();
        let t = at("2026-11-22T01:00:00.100Z");
        let mut remaining = Vec::new();
        let mut limited = 0;
        for _ in 0..8 {
            let q = take(&*store, "ak_a", 5, t).await;
            match q.retry_after {
                None => remaining.push(q.remaining),
                Some(s) => {
                    assert_eq!(s, 1);
                    assert_eq!(q.remaining, 0);
                    limited += 1;
                }
            }
            assert_eq!(q.reset, t.unix_seconds() + 1);
        }
        assert_eq!(remaining, vec![4, 3, 2, 1, 0]);
        assert_eq!(limited, 3);
        // Another key has its own budget; the next second starts afresh.
        assert_eq!(take(&*store, "ak_b", 5, t).await.remaining, 4);
        let next = at("2026-11-22T01:00:01.000Z");
        assert_eq!(take(&*store, "ak_a", 5, next).await.remaining, 4);
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_budget() {
        let store = store();
        let t = at("2026-11-22T01:00:00.100Z");
        let calls = (0..40).map(|_| {
            let store = store.clone();
            async move { take(&*store, "ak_c", 5, t).await }
        });
        let quotas = futures::future::join_all(calls).await;
        assert_eq!(quotas.iter().filter(|q| !q.limited()).count(), 5);
    }

    /// What a simulated fleet did: requests, admitted per window, store
    /// calls (all of them writes: the limiter only updates).
    struct Fleet {
        requests: u64,
        admitted: Vec<u32>,
        writes: u64,
    }

    /// `instances` instances, each its own [`RateLimits`] on one shared
    /// store, each sending `per_second` requests a second of one key,
    /// evenly spaced with its own phase, for `seconds`; what happened from
    /// `warm` seconds on.
    async fn fleet(
        instances: usize,
        per_second: u32,
        limit: u32,
        seconds: i64,
        warm: i64,
    ) -> Fleet {
        let counting = Arc::new(crate::store::counting::CountingStore::new(store()));
        let fleet: Vec<RateLimits> = (0..instances)
            .map(|_| RateLimits::new(limit, limit))
            .collect();
        let start = at("2026-11-22T01:00:00.000Z").unix_millis();
        let step = 1000 / i64::from(per_second);
        let mut out = Fleet {
            requests: 0,
            admitted: vec![0; usize::try_from(seconds - warm).unwrap_or(0)],
            writes: 0,
        };
        let mut writes_at_warm = 0;
        for ms in 0..seconds * 1000 {
            if ms == warm * 1000 {
                writes_at_warm = counting.calls();
            }
            for (i, limits) in fleet.iter().enumerate() {
                // Instance i's phase: spread over the step.
                let phase = (i as i64 * 7919) % step;
                if ms % step != phase {
                    continue;
                }
                let now = Timestamp::from_unix_millis(start + ms).unwrap();
                let q = limits.take(&*counting, "ak_fleet", Mode::Live, now).await;
                if ms >= warm * 1000 {
                    out.requests += 1;
                    if !q.limited() {
                        let w = usize::try_from(ms / 1000 - warm).unwrap_or(0);
                        out.admitted[w] += 1;
                    }
                }
            }
        }
        out.writes = counting.calls() - writes_at_warm;
        // The figures, for `--nocapture` (recorded in BENCHMARKS.md).
        println!(
            "fleet of {instances} x {per_second}/s, limit {limit}: {} requests, {} writes \
             ({:.3} a request), admitted per window {:?}",
            out.requests,
            out.writes,
            out.writes as f64 / out.requests.max(1) as f64,
            out.admitted
        );
        out
    }

    /// Below the limit, every request passes, at under 0.2 writes each
    /// (eight instances at 10 requests a second each, limit 100).
    #[tokio::test]
    async fn a_fleet_under_the_limit_passes_everything_at_few_writes() {
        let f = fleet(8, 10, 100, 12, 2).await;
        let admitted: u32 = f.admitted.iter().sum();
        assert_eq!(u64::from(admitted), f.requests, "{:?}", f.admitted);
        let per_request = f.writes as f64 / f.requests as f64;
        assert!(
            per_request <= 0.2,
            "{} writes for {} requests",
            f.writes,
            f.requests
        );
    }

    /// Over the limit (eight instances at 40 a second against 100): no
    /// window admits more than the limit, none less than 90% of it, and
    /// refusals cost no writes once a window is known full.
    #[tokio::test]
    async fn a_fleet_over_the_limit_gets_within_ten_percent_of_it() {
        let f = fleet(8, 40, 100, 12, 2).await;
        for (w, n) in f.admitted.iter().enumerate() {
            assert!(
                (90..=100).contains(n),
                "window {w}: {n} admitted: {:?}",
                f.admitted
            );
        }
        let per_request = f.writes as f64 / f.requests as f64;
        assert!(
            per_request <= 0.2,
            "{} writes for {} requests",
            f.writes,
            f.requests
        );
    }

    /// Many instances, each with little traffic, and a small limit: still
    /// never over it; writes grow towards one a request as each instance's
    /// share shrinks (a block is what an instance serves in a window).
    #[tokio::test]
    async fn many_quiet_instances_never_pass_over_the_limit() {
        let f = fleet(20, 4, 25, 8, 2).await;
        for (w, n) in f.admitted.iter().enumerate() {
            assert!(*n <= 25, "window {w}: {n}: {:?}", f.admitted);
            assert!(*n >= 22, "window {w}: {n}: {:?}", f.admitted);
        }
        assert!(
            f.writes <= f.requests,
            "{} writes for {} requests",
            f.writes,
            f.requests
        );
    }

    /// Concurrent requests of one instance lease side by side; every slot
    /// they leased is handed out before any request is refused, so exactly
    /// the limit passes, with distinct Remaining values.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_requests_of_one_instance_use_every_leased_slot() {
        for round in 0..20 {
            let store = store();
            let limits = Arc::new(RateLimits::new(100, 25));
            let t = at("2026-11-22T01:00:00.100Z");
            let calls = (0..40).map(|_| {
                let (store, limits) = (store.clone(), limits.clone());
                tokio::spawn(async move { limits.take(&*store, "ak_c", Mode::Sandbox, t).await })
            });
            let quotas: Vec<Quota> = futures::future::join_all(calls)
                .await
                .into_iter()
                .filter_map(Result::ok)
                .collect();
            let mut left: Vec<u32> = quotas
                .iter()
                .filter(|q| !q.limited())
                .map(|q| q.remaining)
                .collect();
            left.sort_unstable();
            assert_eq!(left, (0..25).collect::<Vec<u32>>(), "round {round}");
        }
    }

    #[tokio::test]
    async fn a_store_failure_lets_the_request_through() {
        let faulty = Arc::new(FaultyStore::new(store()));
        faulty.plan(Op::Update, 0, Fault::throttled());
        let t = at("2026-11-22T01:00:00.100Z");
        let q = take(&*faulty, "ak_d", 5, t).await;
        assert!(!q.limited());
        assert_eq!((q.limit, q.remaining), (5, 4));
        assert_eq!(faulty.injected(), 1);
    }

    #[tokio::test]
    async fn counted_in_process_the_same_windows_pass_exactly_the_limit() {
        let limits = RateLimits::new(100, 5).counted_in_process();
        let store = store();
        let t = at("2026-11-22T01:00:00.100Z");
        let tasks: Vec<_> = (0..40)
            .map(|_| limits.take(&*store, "ak_1", Mode::Sandbox, t))
            .collect();
        let quotas = futures::future::join_all(tasks).await;
        let passed: Vec<_> = quotas.iter().filter(|q| !q.limited()).collect();
        assert_eq!(passed.len(), 5);
        let mut left: Vec<u32> = passed.iter().map(|q| q.remaining).collect();
        left.sort_unstable();
        assert_eq!(left, vec![0, 1, 2, 3, 4]);
        let refused = quotas.iter().find(|q| q.limited());
        assert!(
            matches!(refused, Some(q) if q.retry_after == Some(1) && q.remaining == 0),
            "{refused:?}"
        );
        // Another key, another budget; the next second, a new window.
        assert!(
            !limits
                .take(&*store, "ak_2", Mode::Sandbox, t)
                .await
                .limited()
        );
        let next = at("2026-11-22T01:00:01.000Z");
        let q = limits.take(&*store, "ak_1", Mode::Sandbox, next).await;
        assert_eq!((q.limited(), q.remaining), (false, 4));
        // A slow request of the second before counts in the current one
        // and does not start it over.
        let late = limits.take(&*store, "ak_1", Mode::Sandbox, t).await;
        assert_eq!((late.limited(), late.remaining), (false, 3));
        let q = limits.take(&*store, "ak_1", Mode::Sandbox, next).await;
        assert_eq!((q.limited(), q.remaining), (false, 2));
        // Nothing was written to the store.
        let w = Window::of(t).counter_key("ak_1");
        assert!(matches!(store.get(&w).await, Ok(None)));
        // Counted in the store unless asked otherwise.
        let shared = RateLimits::new(100, 5);
        assert!(
            !shared
                .take(&*store, "ak_1", Mode::Sandbox, t)
                .await
                .limited()
        );
        assert!(matches!(store.get(&w).await, Ok(Some(_))));
    }
}
