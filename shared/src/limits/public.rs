//! Limits of the public routes (the hosted pages, no API key): whoever
//! holds one link URL can call them as fast as they like, so each request
//! takes a slot in fixed windows per client address, per checkout session
//! and per payment link, and opening sessions from a link is bounded per
//! client address. Over a limit the answer is 429 with `Retry-After`
//! (a page for a browser, the `rate_limited` envelope for a script), and
//! nothing else is done: no store write beyond the counter.
//!
//! The counters are the same kind as the per-key limits'
//! ([`super::rate`]): one conditional `ADD` per bucket and window in
//! the store, shared by every function instance; in memory on the
//! embedded store (one process). A store failure of the limiter lets the
//! request through (logged): the limits protect, they never block a
//! customer because the limiter is down.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::store::{Cond, Store, StoreError, TTL, Update};
use crate::time::Timestamp;

/// What a public request is, for its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicRequest<'a> {
    /// The client's address (API Gateway's `sourceIp`, else the socket's
    /// peer), or `unknown`; `None`: the request is not counted per
    /// address (a provider's return and the pages' status poll, bounded
    /// per session: many customers share one address behind a carrier's
    /// NAT, and a paying customer's return must not be refused).
    pub address: Option<&'a str>,
    /// Whether it may write (starts an attempt, opens a session, a return).
    pub write: bool,
    /// The checkout session in its path.
    pub session: Option<&'a str>,
    /// The payment link in its path.
    pub link: Option<&'a str>,
    /// Whether it opens a checkout session from the link (`POST /l/{id}`):
    /// only these count per link (a link's page views count per address).
    pub opens_session: bool,
    /// Whether it opens a session's event stream (`GET /c/{id}/events`):
    /// a stream holds a function instance while it lasts, so opens are
    /// bounded per address and per session, not only as requests.
    pub opens_stream: bool,
}

/// The counter name of a client address: an IPv6 client is its /64 (one
/// subscriber's prefix), an IPv4 client its address.
pub fn address_bucket(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        Ok(std::net::IpAddr::V6(v6)) => v6
            .to_ipv4_mapped()
            .map(|v4| v4.to_string())
            .unwrap_or_else(|| address.to_owned()),
        _ => address.chars().take(64).collect(),
    }
}

/// One limit: at most `limit` requests per `window` seconds.
#[derive(Debug)]
struct Limit {
    name: &'static str,
    limit: AtomicU32,
    window: i64,
}

impl Limit {
    const fn new(name: &'static str, limit: u32, window: i64) -> Self {
        Limit {
            name,
            limit: AtomicU32::new(limit),
            window,
        }
    }

    fn get(&self) -> u32 {
        self.limit.load(Ordering::Relaxed).max(1)
    }
}

/// Requests a client address may make to the public routes per minute.
pub const PER_ADDRESS: u32 = 600;
/// Writes (attempts, session opens, returns) per client address and minute.
pub const WRITES_PER_ADDRESS: u32 = 60;
/// Requests per checkout session and minute (the pages poll every 2 s).
pub const PER_SESSION: u32 = 120;
/// Sessions opened per payment link and minute, all clients together.
pub const PER_LINK: u32 = 600;
/// Sessions one client address may open from one link per 30 minutes
/// (a session's lifetime): how many open sessions it can hold.
pub const SESSIONS_PER_LINK_AND_ADDRESS: u32 = 10;
/// Event streams one client address may open per minute: with streams of
/// up to 50 s, at most about this many held at once (a screen reconnects
/// about once a minute; an address shared by many phones gets a dozen).
pub const STREAMS_PER_ADDRESS: u32 = 12;
/// Event streams per session and minute (a screen needs one at a time).
pub const STREAMS_PER_SESSION: u32 = 6;

/// The public routes' limits, adjustable while running (tests).
#[derive(Debug)]
pub struct PublicLimits {
    per_address: Limit,
    writes_per_address: Limit,
    per_session: Limit,
    per_link: Limit,
    link_sessions: Limit,
    address_streams: Limit,
    session_streams: Limit,
    /// `Some`: windows counted in this process (the embedded store).
    local: Option<Mutex<HashMap<String, (i64, u32)>>>,
}

/// Which limit a 429 came from, and how long to wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// `address`, `address writes`, `session`, `link` or `link sessions`.
    pub limit: &'static str,
    /// Whole seconds until the window ends (at least 1).
    pub retry_after: i64,
}

impl Default for PublicLimits {
    fn default() -> Self {
        PublicLimits {
            per_address: Limit::new("address", PER_ADDRESS, 60),
            writes_per_address: Limit::new("address writes", WRITES_PER_ADDRESS, 60),
            per_session: Limit::new("session", PER_SESSION, 60),
            per_link: Limit::new("link", PER_LINK, 60),
            link_sessions: Limit::new("link sessions", SESSIONS_PER_LINK_AND_ADDRESS, 1800),
            address_streams: Limit::new("address streams", STREAMS_PER_ADDRESS, 60),
            session_streams: Limit::new("session streams", STREAMS_PER_SESSION, 60),
            local: None,
        }
    }
}

/// Entries kept before windows long over are dropped.
const LOCAL_SWEEP_AT: usize = 50_000;

impl PublicLimits {
    /// Counts in this process instead of the store (the embedded store).
    pub fn counted_in_process(mut self) -> Self {
        self.local = Some(Mutex::new(HashMap::new()));
        self
    }

    /// Replaces the limits (tests): per address, writes per address, per
    /// session, per link, sessions per link and address.
    pub fn set(&self, address: u32, writes: u32, session: u32, link: u32, link_sessions: u32) {
        for (l, n) in [
            (&self.per_address, address),
            (&self.writes_per_address, writes),
            (&self.per_session, session),
            (&self.per_link, link),
            (&self.link_sessions, link_sessions),
        ] {
            l.limit.store(n.max(1), Ordering::Relaxed);
        }
    }

    /// Replaces the event-stream limits (tests): opens per address and
    /// per session, a minute.
    pub fn set_streams(&self, address: u32, session: u32) {
        self.address_streams
            .limit
            .store(address.max(1), Ordering::Relaxed);
        self.session_streams
            .limit
            .store(session.max(1), Ordering::Relaxed);
    }

    /// Takes a slot of every limit `req` falls under at `now`: the
    /// client's own (per address, its writes, its sessions of the link)
    /// first, then the shared ones (the session's, the link's), so a
    /// client refused for its own flood never uses up a slot others
    /// need. The first limit full answers the request.
    pub async fn take(
        &self,
        store: &dyn Store,
        req: &PublicRequest<'_>,
        now: Timestamp,
    ) -> Result<(), Limited> {
        let mut buckets: Vec<(&Limit, String)> = Vec::with_capacity(5);
        if let Some(address) = req.address.map(address_bucket) {
            buckets.push((&self.per_address, format!("A#{address}")));
            if req.write {
                buckets.push((&self.writes_per_address, format!("AW#{address}")));
            }
            if let (true, Some(link)) = (req.opens_session, req.link) {
                buckets.push((&self.link_sessions, format!("LS#{link}#{address}")));
            }
            if req.opens_stream {
                buckets.push((&self.address_streams, format!("AS#{address}")));
            }
        }
        if let Some(s) = req.session {
            buckets.push((&self.per_session, format!("S#{s}")));
            if req.opens_stream {
                buckets.push((&self.session_streams, format!("SS#{s}")));
            }
        }
        if let (true, Some(l)) = (req.opens_session, req.link) {
            buckets.push((&self.per_link, format!("L#{l}")));
        }
        for (limit, bucket) in buckets {
            self.take_one(store, limit, &bucket, now).await?;
        }
        Ok(())
    }

    async fn take_one(
        &self,
        store: &dyn Store,
        limit: &Limit,
        bucket: &str,
        now: Timestamp,
    ) -> Result<(), Limited> {
        let n = limit.get();
        let start = now.unix_seconds().div_euclid(limit.window) * limit.window;
        let end = start + limit.window;
        let limited = || Limited {
            limit: limit.name,
            retry_after: ((end * 1000 - now.unix_millis() + 999) / 1000).max(1),
        };
        if let Some(local) = &self.local {
            let mut map = local.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() > LOCAL_SWEEP_AT {
                let cutoff = now.unix_seconds() - 3600;
                map.retain(|_, (s, _)| *s >= cutoff);
            }
            let entry = map.entry(bucket.to_owned()).or_insert((start, 0));
            if start > entry.0 {
                *entry = (start, 0);
            }
            if entry.1 >= n {
                return Err(limited());
            }
            entry.1 += 1;
            return Ok(());
        }
        match take_slot(store, bucket, i64::from(n), limit.window, now).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(limited()),
            Err(e) => {
                tracing::warn!(error = %e, limit = limit.name, "public limiter unavailable; request let through");
                Ok(())
            }
        }
    }
}

/// Takes one slot of `bucket` in its fixed window of `window` seconds
/// holding `limit` slots, counted in the store (one conditional `ADD`,
/// shared by every instance): the slot's key (to give it back with
/// [`give_back`]), or, when the window is full, the whole seconds until
/// it ends.
pub async fn take_slot(
    store: &dyn Store,
    bucket: &str,
    limit: i64,
    window: i64,
    now: Timestamp,
) -> Result<Result<crate::store::Key, i64>, StoreError> {
    let start = now.unix_seconds().div_euclid(window) * window;
    let end = start + window;
    let key = crate::keys::throttle(bucket, start);
    let update = Update::new().add("count", 1).set(TTL, end + 60);
    let room = Cond::Or(vec![
        Cond::AttrNotExists("count".into()),
        Cond::lt("count", limit),
    ]);
    match store.update(&key, update, Some(room)).await {
        Ok(_) => Ok(Ok(key)),
        Err(StoreError::ConditionFailed) => {
            Ok(Err(((end * 1000 - now.unix_millis() + 999) / 1000).max(1)))
        }
        Err(e) => Err(e),
    }
}

/// Gives back a slot [`take_slot`] took (best effort: a slot not given
/// back only counts against its window).
pub async fn give_back(store: &dyn Store, key: &crate::store::Key) {
    let _ = store
        .update(key, Update::new().add("count", -1), Some(Cond::Exists))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::testenv::at;

    fn req<'a>(
        address: &'a str,
        session: Option<&'a str>,
        link: Option<&'a str>,
    ) -> PublicRequest<'a> {
        PublicRequest {
            address: Some(address),
            write: false,
            session,
            link,
            opens_session: false,
            opens_stream: false,
        }
    }

    async fn both(check: impl AsyncFn(PublicLimits, &dyn Store)) {
        let store = EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}"));
        check(PublicLimits::default(), &store).await;
        let store = EmbeddedStore::in_memory().unwrap_or_else(|e| panic!("{e}"));
        check(PublicLimits::default().counted_in_process(), &store).await;
    }

    #[tokio::test]
    async fn a_client_refused_for_its_own_flood_uses_no_shared_slot() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            limits.set(3, 100, 5, 4, 100);
            let t = at("2026-11-25T10:00:10Z");
            let mut open = req("10.0.0.1", None, Some("lnk_1"));
            open.write = true;
            open.opens_session = true;
            for n in 0..20 {
                let r = limits.take(store, &open, t).await;
                assert_eq!(r.is_ok(), n < 3, "{n}: {r:?}");
            }
            // Its 17 refused opens took none of the link's 4: the fourth
            // is there for another client, then the link is full.
            for (a, ok) in [("10.0.0.2", true), ("10.0.0.3", false)] {
                let mut other = open.clone();
                other.address = Some(a);
                let r = limits.take(store, &other, t).await;
                assert_eq!(
                    r.map_err(|l| l.limit),
                    if ok { Ok(()) } else { Err("link") },
                    "{a}"
                );
            }
            // A page view of the link is not counted per link.
            assert!(
                limits
                    .take(store, &req("10.0.0.6", None, Some("lnk_1")), t)
                    .await
                    .is_ok()
            );
            // Returns and status polls: per session only.
            let mut back = req("10.0.0.1", Some("cs_1"), None);
            back.address = None;
            for _ in 0..5 {
                assert!(limits.take(store, &back, t).await.is_ok());
            }
            assert!(limits.take(store, &back, t).await.is_err());
        })
        .await;
    }

    #[tokio::test]
    async fn event_streams_are_bounded_per_address_and_per_session() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            limits.set_streams(3, 2);
            let t = at("2026-11-25T10:00:10Z");
            let stream = |address, session| PublicRequest {
                opens_stream: true,
                ..req(address, Some(session), None)
            };
            // One session: two opens a minute, whoever asks.
            assert!(
                limits
                    .take(store, &stream("10.0.0.1", "cs_1"), t)
                    .await
                    .is_ok()
            );
            assert!(
                limits
                    .take(store, &stream("10.0.0.2", "cs_1"), t)
                    .await
                    .is_ok()
            );
            let r = limits.take(store, &stream("10.0.0.3", "cs_1"), t).await;
            assert_eq!(r.map_err(|l| l.limit), Err("session streams"));
            // One address: three opens a minute over its sessions (the
            // refused one above counted for 10.0.0.3, not 10.0.0.1).
            assert!(
                limits
                    .take(store, &stream("10.0.0.1", "cs_2"), t)
                    .await
                    .is_ok()
            );
            assert!(
                limits
                    .take(store, &stream("10.0.0.1", "cs_3"), t)
                    .await
                    .is_ok()
            );
            let r = limits.take(store, &stream("10.0.0.1", "cs_4"), t).await;
            assert_eq!(r.map_err(|l| l.limit), Err("address streams"));
            // Other requests of that address are not streams.
            assert!(
                limits
                    .take(store, &req("10.0.0.1", Some("cs_4"), None), t)
                    .await
                    .is_ok()
            );
            // The next minute opens again.
            let later = at("2026-11-25T10:01:10Z");
            assert!(
                limits
                    .take(store, &stream("10.0.0.1", "cs_4"), later)
                    .await
                    .is_ok()
            );
        })
        .await;
    }

    #[test]
    fn an_ipv6_client_is_its_64() {
        assert_eq!(
            address_bucket("2400:1a00:b040:1234:aaaa:bbbb:cccc:dddd"),
            address_bucket("2400:1a00:b040:1234::1")
        );
        assert_ne!(
            address_bucket("2400:1a00:b040:1234::1"),
            address_bucket("2400:1a00:b040:1235::1")
        );
        assert_eq!(address_bucket("::ffff:203.0.113.7"), "203.0.113.7");
        assert_eq!(address_bucket("203.0.113.7"), "203.0.113.7");
    }

    #[tokio::test]
    async fn each_limit_holds_in_its_window_and_says_when_to_retry() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            limits.set(5, 2, 3, 4, 1);
            let t = at("2026-11-25T10:00:10.250Z");
            // Per session: 3 a minute, whichever address asks.
            for a in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
                assert!(
                    limits
                        .take(store, &req(a, Some("cs_1"), None), t)
                        .await
                        .is_ok()
                );
            }
            let over = limits
                .take(store, &req("10.0.0.4", Some("cs_1"), None), t)
                .await;
            assert_eq!(
                over,
                Err(Limited {
                    limit: "session",
                    retry_after: 50
                })
            );
            // Another session is not touched by it.
            assert!(
                limits
                    .take(store, &req("10.0.0.4", Some("cs_2"), None), t)
                    .await
                    .is_ok()
            );
            // A new window starts the count again.
            let next = at("2026-11-25T10:01:00Z");
            assert!(
                limits
                    .take(store, &req("10.0.0.4", Some("cs_1"), None), next)
                    .await
                    .is_ok()
            );
            // Writes per address: 2, then the address is limited on writes
            // only.
            let mut w = req("10.0.0.9", None, None);
            w.write = true;
            assert!(limits.take(store, &w, next).await.is_ok());
            assert!(limits.take(store, &w, next).await.is_ok());
            assert_eq!(
                limits.take(store, &w, next).await.map_err(|l| l.limit),
                Err("address writes")
            );
            assert!(
                limits
                    .take(store, &req("10.0.0.9", None, None), next)
                    .await
                    .is_ok()
            );
            // Sessions per link and address: 1 per 30 minutes.
            let mut open = req("10.0.0.7", None, Some("lnk_1"));
            open.write = true;
            open.opens_session = true;
            assert!(limits.take(store, &open, next).await.is_ok());
            let again = limits.take(store, &open, next).await;
            assert_eq!(again.as_ref().map_err(|l| l.limit), Err("link sessions"));
            assert_eq!(again.map_err(|l| l.retry_after), Err(29 * 60));
            let mut other = open.clone();
            other.address = Some("10.0.0.8");
            assert!(limits.take(store, &other, next).await.is_ok());
        })
        .await;
    }
}
