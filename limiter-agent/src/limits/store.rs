//! Where bucket state lives: the [`Store`] contract, and [`MemoryStore`].
//!
//! A bucket is named by its policy's identity (a string that stays the same across
//! reloads while the policy's name, key spec, algorithm and window do) and a key
//! string. The contract is one atomic step per request, check every bucket then
//! charge, which a shared store (Redis, as one Lua script over the same names) can
//! provide as well as memory can.

use std::{
    fmt,
    hash::{BuildHasher, Hash, RandomState},
    num::NonZeroUsize,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use indexmap::{Equivalent, IndexMap};

use super::{
    bucket::{self, State},
    clock::to_nanos,
    outcome::Outcome,
};
use crate::config::proxy::LimitSpec;

/// One bucket a request is counted in.
#[derive(Clone, Copy, Debug)]
pub struct Bucket<'a> {
    /// The policy's identity: same identity, same state.
    pub policy: &'a Arc<str>,
    pub key: &'a str,
    pub spec: &'a LimitSpec,
}

/// Which of the checked buckets a step charges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// All of them if every one admits, none otherwise: a request.
    AllOrNothing,
    /// Each one that admits: a penalty, which cannot push a bucket past full.
    EachAdmitting,
}

/// Per-key limiter state.
pub trait Store: Send + Sync + fmt::Debug {
    /// Checks every bucket at `now`, then charges them as `charge` says, atomically
    /// with respect to every other call touching any of the same buckets. Returns
    /// the outcome of each bucket, in order, as checked. The buckets must be
    /// distinct.
    fn apply(&self, buckets: &[Bucket<'_>], now: Duration, charge: Charge) -> Vec<Outcome>;

    /// Drops the state of every policy whose identity `keep` refuses.
    fn retain_policies(&self, keep: &dyn Fn(&str) -> bool);

    /// Sets the bound on tracked buckets, evicting down to it.
    fn set_capacity(&self, max_tracked_keys: NonZeroUsize);

    /// Buckets holding state.
    fn tracked_keys(&self) -> usize;

    /// Buckets dropped to make room, since the start.
    fn evictions(&self) -> u64;
}

/// Most shards; fewer for a bound below this, so that each shard holds at least one.
const MAX_SHARDS: usize = 64;

/// Entries looked at to pick an eviction victim.
const EVICTION_SAMPLE: usize = 16;

/// Buckets in memory, in shards each behind its own lock, bounded in number.
///
/// The bound is split evenly over the shards (keys are spread by a keyed hash, so a
/// client cannot aim them at one shard). A full shard evicts before inserting: among
/// `EVICTION_SAMPLE` (16) entries at a rotating hand, the one that is back to full
/// capacity soonest, which is a bucket already full if there is one (evicting it
/// loses nothing, as a new bucket starts full). This approximates "least recently
/// used" without a list to maintain: a bucket in use keeps pushing its full time out.
///
/// Two limits of the split: with a bound below the shard count given at a reload
/// (the shard count is fixed at creation) every shard still holds one bucket; and a
/// request needing more new buckets in one shard than the shard holds leaves the
/// extra ones uncounted. Neither happens with any bound above a few hundred.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    tracked: AtomicUsize,
    evictions: AtomicU64,
}

#[derive(Debug)]
struct Shard {
    entries: IndexMap<Key, Entry>,
    capacity: usize,
    /// Where the next eviction sample starts.
    hand: usize,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    policy: Arc<str>,
    key: Box<str>,
}

/// A [`Key`] borrowed from a [`Bucket`], hashing the same, to look up without
/// allocating.
#[derive(Hash)]
struct KeyRef<'a> {
    policy: &'a str,
    key: &'a str,
}

impl<'a> KeyRef<'a> {
    fn of(bucket: &Bucket<'a>) -> Self {
        Self { policy: bucket.policy, key: bucket.key }
    }
}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        *key.policy == *self.policy && *key.key == *self.key
    }
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// When the bucket is back to full capacity (ns since the epoch), as of its last
    /// charge.
    idle_at: u64,
}

/// What a charge did to a shard's population.
enum Change {
    Updated,
    Inserted,
    /// Inserted in place of an evicted bucket.
    Replaced,
    /// Not recorded: the shard is full of this request's own buckets.
    Dropped,
}

impl MemoryStore {
    #[must_use]
    pub fn new(max_tracked_keys: NonZeroUsize) -> Self {
        Self::with_shards(max_tracked_keys, MAX_SHARDS)
    }

    /// A store of at most `shards` shards.
    pub(super) fn with_shards(max_tracked_keys: NonZeroUsize, shards: usize) -> Self {
        let shards = max_tracked_keys.get().min(shards).max(1);
        let store = Self {
            shards: (0..shards).map(|_| Mutex::new(Shard { entries: IndexMap::new(), capacity: 0, hand: 0 })).collect(),
            hasher: RandomState::new(),
            tracked: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
        };
        store.set_capacity(max_tracked_keys);
        store
    }

    fn shard_of(&self, bucket: &Bucket<'_>) -> usize {
        // Any bits of the hash spread keys, so truncating it on 32-bit targets is fine.
        self.hasher.hash_one(KeyRef::of(bucket)) as usize % self.shards.len()
    }

    fn count(&self, change: &Change) {
        match change {
            Change::Inserted => {
                self.tracked.fetch_add(1, Ordering::Relaxed);
            }
            Change::Replaced => {
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
            Change::Updated | Change::Dropped => {}
        }
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("tracked", &self.tracked_keys())
            .field("evictions", &self.evictions())
            .finish_non_exhaustive()
    }
}

impl Store for MemoryStore {
    fn apply(&self, buckets: &[Bucket<'_>], now: Duration, charge: Charge) -> Vec<Outcome> {
        let shard_of: Vec<usize> = buckets.iter().map(|b| self.shard_of(b)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Locking in ascending shard order means two requests sharing shards cannot
        // deadlock; holding every lock across check and charge makes the step atomic.
        let mut guards: Vec<MutexGuard<'_, Shard>> = order.iter().map(|&i| lock(&self.shards[i])).collect();
        let guard_of: Vec<usize> = shard_of.iter().map(|s| order.partition_point(|o| o < s)).collect();

        let outcomes: Vec<Outcome> = buckets
            .iter()
            .zip(&guard_of)
            .map(|(b, &g)| bucket::check(b.spec, guards[g].entries.get(&KeyRef::of(b)).map(|e| &e.state), now))
            .collect();
        let all_admit = outcomes.iter().all(|o| o.admitted);
        for ((b, &g), outcome) in buckets.iter().zip(&guard_of).zip(&outcomes) {
            if outcome.admitted && (all_admit || charge == Charge::EachAdmitting) {
                let change = guards[g].charge(b, outcome, now, buckets);
                self.count(&change);
            }
        }
        outcomes
    }

    fn retain_policies(&self, keep: &dyn Fn(&str) -> bool) {
        for shard in &self.shards {
            let mut shard = lock(shard);
            let before = shard.entries.len();
            shard.entries.retain(|key, _| keep(&key.policy));
            self.tracked.fetch_sub(before - shard.entries.len(), Ordering::Relaxed);
        }
    }

    fn set_capacity(&self, max_tracked_keys: NonZeroUsize) {
        let (share, extra) = (max_tracked_keys.get() / self.shards.len(), max_tracked_keys.get() % self.shards.len());
        for (i, shard) in self.shards.iter().enumerate() {
            let mut shard = lock(shard);
            shard.capacity = (share + usize::from(i < extra)).max(1);
            let mut evicted = 0;
            // Without a clock here no bucket counts as full: the sample's soonest goes.
            while shard.entries.len() > shard.capacity && shard.evict(0, &[]) {
                evicted += 1;
            }
            self.tracked.fetch_sub(evicted, Ordering::Relaxed);
            self.evictions.fetch_add(evicted as u64, Ordering::Relaxed);
        }
    }

    fn tracked_keys(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

impl Shard {
    /// Charges an admitted request to `bucket`, making room if it is new.
    fn charge(&mut self, bucket: &Bucket<'_>, outcome: &Outcome, now: Duration, request: &[Bucket<'_>]) -> Change {
        let idle_at = to_nanos(now).saturating_add(to_nanos(outcome.after.reset_after));
        if let Some(entry) = self.entries.get_mut(&KeyRef::of(bucket)) {
            bucket::charge(bucket.spec, &mut entry.state, now);
            entry.idle_at = idle_at;
            return Change::Updated;
        }
        let change = if self.entries.len() < self.capacity {
            Change::Inserted
        } else if self.evict(to_nanos(now), request) {
            Change::Replaced
        } else {
            return Change::Dropped;
        };
        let mut state = State::new(bucket.spec.algorithm);
        bucket::charge(bucket.spec, &mut state, now);
        self.entries
            .insert(Key { policy: Arc::clone(bucket.policy), key: bucket.key.into() }, Entry { state, idle_at });
        change
    }

    /// Evicts the sampled entry back to full capacity soonest, sparing the buckets of
    /// the request being charged; false if there was none to evict.
    fn evict(&mut self, now: u64, request: &[Bucket<'_>]) -> bool {
        let len = self.entries.len();
        let mut victim: Option<(usize, u64)> = None;
        let mut looked = 0;
        while looked < EVICTION_SAMPLE.min(len) {
            let index = (self.hand + looked) % len;
            looked += 1;
            let Some((key, entry)) = self.entries.get_index(index) else { break };
            if request.iter().any(|b| KeyRef::of(b).equivalent(key)) {
                continue;
            }
            if victim.is_none_or(|(_, idle_at)| entry.idle_at < idle_at) {
                victim = Some((index, entry.idle_at));
            }
            if entry.idle_at <= now {
                break;
            }
        }
        self.hand = (self.hand + looked) % len.max(1);
        victim.is_some_and(|(index, _)| self.entries.swap_remove_index(index).is_some())
    }
}

/// Locks a shard, recovering it from a panicked holder: at worst one bucket holds a
/// half-made charge, which beats refusing every later request.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
