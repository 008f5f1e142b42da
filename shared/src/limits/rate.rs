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
            return take(store, key_id, limit, now).await;
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

/// Takes one request of `limit` per second for the key `key_id` at `now`.
/// Never fails: a store error lets the request through (logged), with
/// headers as if it were the window's first request.
pub async fn take(store: &dyn Store, key_id: &str, limit: u32, now: Timestamp) -> Quota {
    let window = Window::of(now);
    let limit = limit.max(1);
    let update = Update::new()
        .add("count", 1)
        .set(TTL, window.reset() + COUNTER_TTL_SECONDS);
    let room = Cond::Or(vec![
        Cond::AttrNotExists("count".into()),
        Cond::lt("count", i64::from(limit)),
    ]);
    let quota =
        |remaining: u32, retry_after: Option<i64>| window.quota(limit, remaining, retry_after);
    match store
        .update(&window.counter_key(key_id), update, Some(room))
        .await
    {
        Ok(item) => {
            let count = item.get("count").and_then(|v| v.as_i64()).unwrap_or(1);
            let remaining = (i64::from(limit) - count).clamp(0, i64::from(limit));
            quota(u32::try_from(remaining).unwrap_or(0), None)
        }
        Err(StoreError::ConditionFailed) => quota(0, Some(window.retry_after(now))),
        Err(e) => {
            tracing::warn!(error = %e, key_id, "rate limiter unavailable; request let through");
            quota(limit.saturating_sub(1), None)
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
