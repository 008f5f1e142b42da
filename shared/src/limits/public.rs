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

/// What a public request is, for its limits. A checkout session's own
/// budget is not here: it is taken once the session is known to exist
/// ([`PublicLimits::take_session`]), so an id that names nothing costs
/// no counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicRequest<'a> {
    /// The client's address (API Gateway's `sourceIp`, else the socket's
    /// peer), or `unknown`.
    pub address: &'a str,
    /// A provider's return or the pages' status poll: counted in the
    /// address's generous poll budget ([`POLLS_PER_ADDRESS`]) instead of
    /// its page budget, and never as a write (many customers share one
    /// address behind a carrier's NAT, and a paying customer's return
    /// must not be refused).
    pub poll: bool,
    /// Whether it may write (starts an attempt, opens a session).
    pub write: bool,
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

/// The /56 and /48 an IPv6 client's address is in (`None` for IPv4).
fn v6_allocations(address: &str) -> Option<(String, String)> {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            Some((
                format!("{:x}:{:x}:{:x}:{:x}::/56", s[0], s[1], s[2], s[3] & 0xff00),
                format!("{:x}:{:x}:{:x}::/48", s[0], s[1], s[2]),
            ))
        }
        _ => None,
    }
}

/// Who spends a checkout session's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionUse {
    /// Its hosted pages (the page, paying, the status poll).
    Page,
    /// Its pages opening an event stream.
    Stream,
    /// The app holding its client secret.
    App,
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
/// Writes (attempts, session opens) per client address and minute.
pub const WRITES_PER_ADDRESS: u32 = 60;
/// Status polls and provider returns per client address and minute: a
/// carrier NAT's worth of customers (a page polls every 2 s, so about a
/// hundred paying at once behind one address), and a bound on one
/// client sending made-up session ids.
pub const POLLS_PER_ADDRESS: u32 = 3000;
/// Sessions opened from one payment link per minute by one IPv6 /56 (a
/// site's allocation: up to 256 /64s, each counted apart as an address)
/// and by one /48, so one allocation cannot take the whole [`PER_LINK`].
pub const LINK_OPENS_PER_56: u32 = 120;
pub const LINK_OPENS_PER_48: u32 = 300;
/// Requests per checkout session and minute from its pages (they poll
/// every 2 s); the app holding the session's client secret has as many
/// of its own.
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
/// Event streams one project holds open at once in one mode (the default
/// of `DHUKUTI_STREAMS_PER_PROJECT`): a counter screen or an app waiting
/// for its payment holds one; past it a screen polls `status`. Counted in
/// the store as expiring leases (`domain::streams`), so every instance
/// sees them and a crashed one leaks none.
pub const STREAMS_PER_PROJECT: u32 = 10;
/// The environment variable that replaces [`STREAMS_PER_PROJECT`].
pub const STREAMS_PER_PROJECT_ENV: &str = "DHUKUTI_STREAMS_PER_PROJECT";

/// The public routes' limits, adjustable while running (tests).
#[derive(Debug)]
pub struct PublicLimits {
    per_address: Limit,
    writes_per_address: Limit,
    polls_per_address: Limit,
    per_session: Limit,
    app_session: Limit,
    link_opens_56: Limit,
    link_opens_48: Limit,
    per_link: Limit,
    link_sessions: Limit,
    address_streams: Limit,
    session_streams: Limit,
    /// Event streams a project holds open at once ([`STREAMS_PER_PROJECT`]).
    project_streams: AtomicU32,
    /// `Some`: windows counted in this process (the embedded store).
    local: Option<Mutex<HashMap<String, (i64, u32)>>>,
}

/// Which limit a 429 came from, and how long to wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// `address`, `address writes`, `address polls`, `session`,
    /// `app session`, `session streams`, `address streams`, `link`,
    /// `link sessions`, `link opens /56` or `link opens /48`.
    pub limit: &'static str,
    /// Whole seconds until the window ends (at least 1).
    pub retry_after: i64,
}

impl Default for PublicLimits {
    fn default() -> Self {
        PublicLimits {
            per_address: Limit::new("address", PER_ADDRESS, 60),
            writes_per_address: Limit::new("address writes", WRITES_PER_ADDRESS, 60),
            polls_per_address: Limit::new("address polls", POLLS_PER_ADDRESS, 60),
            per_session: Limit::new("session", PER_SESSION, 60),
            app_session: Limit::new("app session", PER_SESSION, 60),
            link_opens_56: Limit::new("link opens /56", LINK_OPENS_PER_56, 60),
            link_opens_48: Limit::new("link opens /48", LINK_OPENS_PER_48, 60),
            per_link: Limit::new("link", PER_LINK, 60),
            link_sessions: Limit::new("link sessions", SESSIONS_PER_LINK_AND_ADDRESS, 1800),
            address_streams: Limit::new("address streams", STREAMS_PER_ADDRESS, 60),
            session_streams: Limit::new("session streams", STREAMS_PER_SESSION, 60),
            project_streams: AtomicU32::new(STREAMS_PER_PROJECT),
            local: None,
        }
    }
}

/// Entries kept before windows long over are dropped.
const LOCAL_SWEEP_AT: usize = 50_000;

impl PublicLimits {
    /// The limits, with what the environment sets
    /// ([`STREAMS_PER_PROJECT_ENV`]); a value that is not a whole number
    /// from 1 to 10,000 is an error naming the variable.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let limits = PublicLimits::default();
        if let Some(v) = lookup(STREAMS_PER_PROJECT_ENV).filter(|v| !v.trim().is_empty()) {
            match v.trim().parse::<u32>() {
                Ok(n @ 1..=10_000) => limits.set_project_streams(n),
                _ => {
                    return Err(format!(
                        "{STREAMS_PER_PROJECT_ENV}: expected a whole number from 1 to 10000, got {v:?}"
                    ));
                }
            }
        }
        Ok(limits)
    }

    /// Event streams one project may hold open at once in one mode.
    pub fn project_streams(&self) -> u32 {
        self.project_streams.load(Ordering::Relaxed).max(1)
    }

    /// Replaces [`PublicLimits::project_streams`].
    pub fn set_project_streams(&self, n: u32) {
        self.project_streams.store(n.max(1), Ordering::Relaxed);
    }

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

    /// Replaces the budgets of polls per address, of a session's app and
    /// of link opens per IPv6 /56 and /48 (tests), a minute.
    pub fn set_more(&self, polls: u32, app_session: u32, per_56: u32, per_48: u32) {
        for (l, n) in [
            (&self.polls_per_address, polls),
            (&self.app_session, app_session),
            (&self.link_opens_56, per_56),
            (&self.link_opens_48, per_48),
        ] {
            l.limit.store(n.max(1), Ordering::Relaxed);
        }
    }

    /// How many requests bucket `bucket` (`S#<session id>`, `AP#<address>`,
    /// ...) counted in its one-minute window at `now` (tests: a request
    /// that names nothing must cost no counter).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn spent(&self, store: &dyn Store, bucket: &str, now: Timestamp) -> u32 {
        let start = now.unix_seconds().div_euclid(60) * 60;
        if let Some(local) = &self.local {
            let map = local.lock().unwrap_or_else(|p| p.into_inner());
            return map
                .get(bucket)
                .filter(|(s, _)| *s == start)
                .map_or(0, |(_, n)| *n);
        }
        let key = crate::keys::throttle(bucket, start);
        match store.get(&key).await {
            Ok(Some(item)) => item
                .get("count")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            _ => 0,
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
    /// client's own (per address, its writes, its sessions of the link,
    /// its IPv6 allocation's opens of the link) first, then the link's,
    /// shared by all, so a client refused for its own flood never uses up
    /// a slot others need. The first limit full answers the request.
    pub async fn take(
        &self,
        store: &dyn Store,
        req: &PublicRequest<'_>,
        now: Timestamp,
    ) -> Result<(), Limited> {
        let address = address_bucket(req.address);
        let mut buckets: Vec<(&Limit, String)> = Vec::with_capacity(6);
        if req.poll {
            buckets.push((&self.polls_per_address, format!("AP#{address}")));
        } else {
            buckets.push((&self.per_address, format!("A#{address}")));
            if req.write {
                buckets.push((&self.writes_per_address, format!("AW#{address}")));
            }
        }
        if let (true, Some(link)) = (req.opens_session, req.link) {
            buckets.push((&self.link_sessions, format!("LS#{link}#{address}")));
            if let Some((p56, p48)) = v6_allocations(req.address) {
                buckets.push((&self.link_opens_56, format!("LS56#{link}#{p56}")));
                buckets.push((&self.link_opens_48, format!("LS48#{link}#{p48}")));
            }
        }
        if req.opens_stream {
            buckets.push((&self.address_streams, format!("AS#{address}")));
        }
        if let (true, Some(l)) = (req.opens_session, req.link) {
            buckets.push((&self.per_link, format!("L#{l}")));
        }
        for (limit, bucket) in buckets {
            self.take_one(store, limit, &bucket, now).await?;
        }
        Ok(())
    }

    /// Takes a slot of session `id`'s budget for `by`, once the session is
    /// known to exist: its pages' (and, opening a stream, its streams'),
    /// or the app's that proved its client secret, which no one holding
    /// only the id can spend.
    pub async fn take_session(
        &self,
        store: &dyn Store,
        id: &str,
        by: SessionUse,
        now: Timestamp,
    ) -> Result<(), Limited> {
        match by {
            SessionUse::Page => {
                self.take_one(store, &self.per_session, &format!("S#{id}"), now)
                    .await
            }
            SessionUse::Stream => {
                self.take_one(store, &self.per_session, &format!("S#{id}"), now)
                    .await?;
                self.take_one(store, &self.session_streams, &format!("SS#{id}"), now)
                    .await
            }
            SessionUse::App => {
                self.take_one(store, &self.app_session, &format!("SA#{id}"), now)
                    .await
            }
        }
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

/// [`take_slot`] that also tells the bucket's count with this slot (so a
/// caller sees the attempt that fills it).
pub async fn take_slot_counted(
    store: &dyn Store,
    bucket: &str,
    limit: i64,
    window: i64,
    now: Timestamp,
) -> Result<Result<(crate::store::Key, i64), i64>, StoreError> {
    let start = now.unix_seconds().div_euclid(window) * window;
    let end = start + window;
    let key = crate::keys::throttle(bucket, start);
    let update = Update::new().add("count", 1).set(TTL, end + 60);
    let room = Cond::Or(vec![
        Cond::AttrNotExists("count".into()),
        Cond::lt("count", limit),
    ]);
    match store.update(&key, update, Some(room)).await {
        Ok(item) => {
            let count = item
                .get("count")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(limit);
            Ok(Ok((key, count)))
        }
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

    fn req<'a>(address: &'a str, link: Option<&'a str>) -> PublicRequest<'a> {
        PublicRequest {
            address,
            poll: false,
            write: false,
            link,
            opens_session: false,
            opens_stream: false,
        }
    }

    fn open<'a>(address: &'a str, link: &'a str) -> PublicRequest<'a> {
        PublicRequest {
            write: true,
            opens_session: true,
            ..req(address, Some(link))
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
            for n in 0..20 {
                let r = limits.take(store, &open("10.0.0.1", "lnk_1"), t).await;
                assert_eq!(r.is_ok(), n < 3, "{n}: {r:?}");
            }
            // Its 17 refused opens took none of the link's 4: the fourth
            // is there for another client, then the link is full.
            for (a, ok) in [("10.0.0.2", true), ("10.0.0.3", false)] {
                let r = limits.take(store, &open(a, "lnk_1"), t).await;
                assert_eq!(
                    r.map_err(|l| l.limit),
                    if ok { Ok(()) } else { Err("link") },
                    "{a}"
                );
            }
            // A page view of the link is not counted per link.
            assert!(
                limits
                    .take(store, &req("10.0.0.6", Some("lnk_1")), t)
                    .await
                    .is_ok()
            );
            // Returns and status polls: in the address's poll budget, not
            // its page budget (spent above).
            let back = PublicRequest {
                poll: true,
                ..req("10.0.0.1", None)
            };
            limits.set_more(5, 100, 100, 100);
            for _ in 0..5 {
                assert!(limits.take(store, &back, t).await.is_ok());
            }
            let over = limits.take(store, &back, t).await;
            assert_eq!(over.map_err(|l| l.limit), Err("address polls"));
        })
        .await;
    }

    #[test]
    fn the_streams_of_a_project_are_set_by_the_environment_or_refused() {
        let env = |v: &'static str| {
            PublicLimits::from_lookup(move |name| {
                (name == STREAMS_PER_PROJECT_ENV).then(|| v.to_owned())
            })
        };
        assert_eq!(
            PublicLimits::default().project_streams(),
            STREAMS_PER_PROJECT
        );
        assert_eq!(
            env("").map(|l| l.project_streams()),
            Ok(STREAMS_PER_PROJECT)
        );
        assert_eq!(env(" 40 ").map(|l| l.project_streams()), Ok(40));
        for bad in ["0", "-1", "ten", "10001", "2.5"] {
            let e = env(bad).map(|l| l.project_streams());
            assert!(
                matches!(&e, Err(m) if m.starts_with(STREAMS_PER_PROJECT_ENV)),
                "{bad}: {e:?}"
            );
        }
    }

    #[tokio::test]
    async fn event_streams_are_bounded_per_address_and_per_session() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            limits.set_streams(3, 2);
            let t = at("2026-11-25T10:00:10Z");
            let stream = |address| PublicRequest {
                opens_stream: true,
                ..req(address, None)
            };
            let session = async |id: &str| {
                limits
                    .take_session(store, id, SessionUse::Stream, t)
                    .await
                    .map_err(|l| l.limit)
            };
            // One session: two opens a minute, whoever asks.
            assert_eq!(session("cs_1").await, Ok(()));
            assert_eq!(session("cs_1").await, Ok(()));
            assert_eq!(session("cs_1").await, Err("session streams"));
            // One address: three opens a minute over its sessions.
            for _ in 0..3 {
                assert!(limits.take(store, &stream("10.0.0.1"), t).await.is_ok());
            }
            let r = limits.take(store, &stream("10.0.0.1"), t).await;
            assert_eq!(r.map_err(|l| l.limit), Err("address streams"));
            // Other requests of that address are not streams.
            assert!(limits.take(store, &req("10.0.0.1", None), t).await.is_ok());
            // The next minute opens again.
            let later = at("2026-11-25T10:01:10Z");
            assert!(limits.take(store, &stream("10.0.0.1"), later).await.is_ok());
        })
        .await;
    }

    #[tokio::test]
    async fn the_app_holding_the_secret_has_its_own_session_budget() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            limits.set(100, 100, 3, 100, 100);
            limits.set_more(100, 2, 100, 100);
            let t = at("2026-11-25T10:00:10Z");
            let take = async |id: &str, by| {
                limits
                    .take_session(store, id, by, t)
                    .await
                    .map_err(|l| l.limit)
            };
            // Anyone holding the id spends the pages' budget...
            for _ in 0..3 {
                assert_eq!(take("cs_1", SessionUse::Page).await, Ok(()));
            }
            assert_eq!(take("cs_1", SessionUse::Page).await, Err("session"));
            // ...and not the app's.
            assert_eq!(take("cs_1", SessionUse::App).await, Ok(()));
            assert_eq!(take("cs_1", SessionUse::App).await, Ok(()));
            assert_eq!(take("cs_1", SessionUse::App).await, Err("app session"));
            // Another session is not touched by either.
            assert_eq!(take("cs_2", SessionUse::Page).await, Ok(()));
            assert_eq!(take("cs_2", SessionUse::App).await, Ok(()));
        })
        .await;
    }

    #[tokio::test]
    async fn one_ipv6_allocation_cannot_take_every_open_of_a_link() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            // Per link 10; per /56 3, per /48 5.
            limits.set(1000, 1000, 1000, 10, 1000);
            limits.set_more(1000, 1000, 3, 5);
            let t = at("2026-11-25T10:00:10Z");
            let addresses: Vec<String> = (0..8u32)
                .flat_map(|site| {
                    (0..4u32).map(move |net| format!("2400:1a00:b040:{:x}::1", site * 256 + net))
                })
                .collect();
            let mut opened = 0;
            let mut refusals = Vec::new();
            // Each /64 new to the limits, 8 /56s of one /48.
            for a in &addresses {
                match limits.take(store, &open(a, "lnk_1"), t).await {
                    Ok(()) => opened += 1,
                    Err(l) => refusals.push(l.limit),
                }
            }
            assert_eq!(opened, 5, "{refusals:?}");
            assert!(refusals.contains(&"link opens /56"), "{refusals:?}");
            assert!(refusals.contains(&"link opens /48"), "{refusals:?}");
            // The link still opens for everyone else: IPv4 and another /48.
            for a in ["203.0.113.7", "2400:1a00:b041::1"] {
                let r = limits.take(store, &open(a, "lnk_1"), t).await;
                assert_eq!(r, Ok(()), "{a}");
            }
            // Another link is not touched.
            let r = limits
                .take(store, &open("2400:1a00:b040:1::1", "lnk_2"), t)
                .await;
            assert_eq!(r, Ok(()));
        })
        .await;
    }

    #[test]
    fn an_ipv6_client_is_its_64_in_its_56_and_48() {
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
        assert_eq!(
            v6_allocations("2400:1a00:b040:12ff::1"),
            Some((
                "2400:1a00:b040:1200::/56".to_owned(),
                "2400:1a00:b040::/48".to_owned()
            ))
        );
        assert_eq!(v6_allocations("203.0.113.7"), None);
        assert_eq!(v6_allocations("::ffff:203.0.113.7"), None);
    }

    #[tokio::test]
    async fn each_limit_holds_in_its_window_and_says_when_to_retry() {
        both(async |limits: PublicLimits, store: &dyn Store| {
            limits.set(5, 2, 3, 4, 1);
            let t = at("2026-11-25T10:00:10.250Z");
            // Per session: 3 a minute.
            for _ in 0..3 {
                assert!(
                    limits
                        .take_session(store, "cs_1", SessionUse::Page, t)
                        .await
                        .is_ok()
                );
            }
            let over = limits
                .take_session(store, "cs_1", SessionUse::Page, t)
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
                    .take_session(store, "cs_2", SessionUse::Page, t)
                    .await
                    .is_ok()
            );
            // A new window starts the count again.
            let next = at("2026-11-25T10:01:00Z");
            assert!(
                limits
                    .take_session(store, "cs_1", SessionUse::Page, next)
                    .await
                    .is_ok()
            );
            // Writes per address: 2, then the address is limited on writes
            // only.
            let w = PublicRequest {
                write: true,
                ..req("10.0.0.9", None)
            };
            assert!(limits.take(store, &w, next).await.is_ok());
            assert!(limits.take(store, &w, next).await.is_ok());
            assert_eq!(
                limits.take(store, &w, next).await.map_err(|l| l.limit),
                Err("address writes")
            );
            assert!(
                limits
                    .take(store, &req("10.0.0.9", None), next)
                    .await
                    .is_ok()
            );
            // Sessions per link and address: 1 per 30 minutes.
            assert!(
                limits
                    .take(store, &open("10.0.0.7", "lnk_1"), next)
                    .await
                    .is_ok()
            );
            let again = limits.take(store, &open("10.0.0.7", "lnk_1"), next).await;
            assert_eq!(again.as_ref().map_err(|l| l.limit), Err("link sessions"));
            assert_eq!(again.map_err(|l| l.retry_after), Err(29 * 60));
            assert!(
                limits
                    .take(store, &open("10.0.0.8", "lnk_1"), next)
                    .await
                    .is_ok()
            );
        })
        .await;
    }
}
