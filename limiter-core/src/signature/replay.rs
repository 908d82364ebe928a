//! Memory of accepted signatures, so that each can be used once.
//!
//! A signature is used once its MAC verified, whatever then becomes of the request:
//! refused by a limit or for its idempotency key, it is still burnt. Forgetting it
//! would let anyone who saw the refused request send its exact bytes again later
//! (once the plan refilled) and have the upstream run it; a client that retries
//! signs anew (another timestamp or `X-Nonce`).
//!
//! # Capacity policy: fail closed
//!
//! When every entry is still live and a new signature arrives, the cache refuses it
//! ([`ReplayError::Full`], counted in [`ReplayCache::full_rejections`]) instead of
//! evicting the oldest entry. Evicting would forget a signature that can still pass
//! the timestamp check, so anyone who captured that request could replay it; refusing
//! only costs availability of signed routes until entries expire (at most twice the
//! skew window). Only MAC-verified requests enter the cache, so filling it takes a
//! valid key, and that key's requests are rate limited; size `max_entries` above the
//! signed request rate times the retention (2 × `max_skew`).
//!
//! # Each key its share
//!
//! No key holds more than `max_entries / keys` entries ([`ReplayCache::set_keys`]):
//! a key that fills its share gets [`ReplayError::Full`], and the others still have
//! theirs, so one tenant cannot make another's valid requests fail.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::share;

/// Why a signature was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The signature was already accepted and is still within its window.
    #[error("signature already used")]
    Replay,
    /// Every entry is live and the cache is at capacity (see the module docs).
    #[error("replay cache full")]
    Full,
}

/// One accepted signature. The key id is part of the identity so that two keys that
/// happen to produce the same MAC bytes never collide.
type Entry = (Box<str>, [u8; 32]);

#[derive(Debug, Default)]
struct Inner {
    live: HashSet<Entry>,
    /// The same entries ordered by signed timestamp, oldest first, for expiry.
    by_timestamp: BTreeSet<(u64, Entry)>,
    /// Live entries per key id, for the per-key share.
    per_key: HashMap<Box<str>, usize>,
    /// Most entries one key id may hold.
    share: usize,
    /// The longest skew window ever used with this cache. Entries are kept for
    /// timestamp + this, so widening `max_skew` on reload cannot make an entry expire
    /// while its request would still pass the wider check.
    retention_secs: u64,
}

impl Inner {
    /// Drops entries whose request can no longer pass the timestamp check
    /// (timestamp + retention < now).
    fn purge(&mut self, now: u64) {
        while let Some(first) = self.by_timestamp.first() {
            if first.0.saturating_add(self.retention_secs) >= now {
                break;
            }
            if let Some((_, entry)) = self.by_timestamp.pop_first() {
                self.remove(&entry);
            }
        }
    }

    fn remove(&mut self, entry: &Entry) {
        if self.live.remove(entry)
            && let Some(count) = self.per_key.get_mut(&entry.0)
        {
            *count -= 1;
            if *count == 0 {
                self.per_key.remove(&entry.0);
            }
        }
    }
}

/// Bounded, thread-safe set of accepted signatures.
#[derive(Debug)]
pub struct ReplayCache {
    inner: Mutex<Inner>,
    max_entries: usize,
    full_rejections: AtomicU64,
}

impl ReplayCache {
    /// A cache holding at most `max_entries` signatures.
    #[must_use]
    pub fn new(max_entries: usize) -> Self {
        let inner = Inner { share: max_entries, ..Inner::default() };
        Self { inner: Mutex::new(inner), max_entries, full_rejections: AtomicU64::new(0) }
    }

    /// Shares the capacity equally among `keys` signing keys (at least one entry
    /// each). A key over a smaller share after a reload keeps its entries until they
    /// expire, and takes no new ones until then.
    pub fn set_keys(&self, keys: usize) {
        self.lock().share = share(self.max_entries, keys);
    }

    /// Records `signature` of `key_id` as used, or says why it cannot be.
    ///
    /// `timestamp` is the signed timestamp, `now` the wall clock (both unix seconds).
    /// Call only after the MAC verified, so that unauthenticated traffic never grows
    /// the cache.
    pub fn check_and_insert(
        &self,
        key_id: &str,
        signature: &[u8; 32],
        timestamp: u64,
        max_skew: Duration,
        now: u64,
    ) -> Result<(), ReplayError> {
        let mut inner = self.lock();
        inner.retention_secs = inner.retention_secs.max(max_skew.as_secs());
        inner.purge(now);
        let entry: Entry = (key_id.into(), *signature);
        if inner.live.contains(&entry) {
            return Err(ReplayError::Replay);
        }
        let held = inner.per_key.get(key_id).copied().unwrap_or(0);
        if inner.live.len() >= self.max_entries || held >= inner.share {
            self.full_rejections.fetch_add(1, Ordering::Relaxed);
            return Err(ReplayError::Full);
        }
        inner.by_timestamp.insert((timestamp, entry.clone()));
        inner.live.insert(entry);
        inner.per_key.insert(key_id.into(), held + 1);
        Ok(())
    }

    /// Entries currently held, live or not yet purged.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether the cache holds no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Configured capacity.
    #[must_use]
    pub const fn capacity(&self) -> usize {
        self.max_entries
    }

    /// Signatures refused because the cache was full of live entries.
    #[must_use]
    pub fn full_rejections(&self) -> u64 {
        self.full_rejections.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every critical section leaves both indexes consistent before anything that
        // could panic, so a poisoned lock still guards valid state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
