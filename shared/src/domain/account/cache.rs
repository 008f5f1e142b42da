//! Who called with a key, remembered for a short while in this process, so
//! that a busy key's requests do not each read the key and its merchant.
//!
//! The bound: what changes the answer of [`super::authenticate`] (a key
//! revoked, rotated or paused; a merchant suspended, reinstated or moved to
//! another plan) takes effect at once in the process that made the change,
//! and within [`PRINCIPAL_TTL`] everywhere else (other Lambda instances).
//! An expiry (`expires_at`, a rotation's grace) is checked against the
//! clock on every request, cached or not.
//!
//! In-process changes reach the cache through a process-wide epoch that
//! every such write bumps ([`changed`]): an entry is good only under the
//! epoch it was read under, so a request that read the old state while a
//! revocation was being written never stores it as new. Only successful
//! authentications are remembered (a refusal is read again each time), by
//! the SHA-256 of the secret, never the secret.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{AuthError, Principal, hash_secret};
use crate::time::Timestamp;

/// How long an authenticated key is remembered in a process.
pub const PRINCIPAL_TTL: chrono::Duration = chrono::Duration::seconds(30);

/// Entries a cache holds at most (then the oldest half is dropped).
const CAPACITY: usize = 10_000;

static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Says that keys or merchants changed in this process: every cache forgets
/// what it remembered (called by each write that changes who may call).
pub(super) fn changed() {
    EPOCH.fetch_add(1, Ordering::SeqCst);
}

/// The epoch a read starts under: pass it to [`PrincipalCache::remember`].
pub fn epoch() -> u64 {
    EPOCH.load(Ordering::SeqCst)
}

struct Entry {
    principal: Arc<Principal>,
    read_at: Timestamp,
    epoch: u64,
}

/// Authenticated keys by the hash of their secret, for [`PRINCIPAL_TTL`].
#[derive(Default)]
pub struct PrincipalCache {
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for PrincipalCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.entries.lock().map(|m| m.len()).unwrap_or_default();
        f.debug_struct("PrincipalCache")
            .field("entries", &n)
            .finish()
    }
}

impl PrincipalCache {
    pub fn new() -> Self {
        PrincipalCache::default()
    }

    /// The caller of `secret` as remembered, if fresh: `Some(Err)` when its
    /// key has expired since (the clock is checked on every request).
    pub fn recall(
        &self,
        secret: &str,
        now: Timestamp,
    ) -> Option<Result<Arc<Principal>, AuthError>> {
        let hash = hash_secret(secret);
        let map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let e = map.get(&hash)?;
        let fresh = e.epoch == epoch() && e.read_at <= now && now < e.read_at.plus(PRINCIPAL_TTL);
        if !fresh {
            return None;
        }
        if e.principal.key.expires_at.is_some_and(|t| t <= now) {
            return Some(Err(AuthError::Expired));
        }
        Some(Ok(Arc::clone(&e.principal)))
    }

    /// Remembers `principal`, read at `now` under `epoch` (taken before
    /// the read): not if anything changed since.
    pub fn remember(&self, principal: &Arc<Principal>, now: Timestamp, epoch: u64) {
        if epoch != self::epoch() {
            return;
        }
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= CAPACITY {
            let cutoff = now.plus(-PRINCIPAL_TTL);
            map.retain(|_, e| e.read_at > cutoff);
            if map.len() >= CAPACITY {
                map.clear();
            }
        }
        map.insert(
            principal.key.key_hash.clone(),
            Entry {
                principal: Arc::clone(principal),
                read_at: now,
                epoch,
            },
        );
    }

    /// Notes that the key was recorded as used at `at`, so the remembered
    /// copy does not ask for the write again.
    pub fn used(&self, key_hash: &str, at: Timestamp) {
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get_mut(key_hash) {
            Arc::make_mut(&mut e.principal).key.last_used_at = Some(at);
        }
    }
}
