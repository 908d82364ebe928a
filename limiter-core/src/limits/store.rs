//! Where bucket state lives: the [`Store`] contract, and [`MemoryStore`].
//!
//! A bucket is named by its policy's identity (a string that stays the same across
//! reloads while the policy's name, key spec, algorithm and window do) and a key
//! string. The contract is one atomic step per request, check every bucket then
//! charge, which a shared store (Redis, as one Lua script over the same names) can
//! provide as well as memory can.

use std::{
    fmt,
    hash::{BuildHasher, Hash},
    num::NonZeroUsize,
    slice,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use foldhash::fast::RandomState;
use indexmap::{
    IndexMap,
    map::{RawEntryApiV1 as _, raw_entry_v1::RawEntryMut},
};
use smallvec::SmallVec;

use super::{
    bucket::{self, State},
    outcome::Outcome,
};
use crate::{LimitSpec, clock::to_nanos};

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
    /// None: the outcomes a request would have now, for `limiter explain`.
    Nothing,
}

impl Charge {
    /// Whether a bucket that `admitted` is charged, when `all_admit` say all of the
    /// request's buckets admit.
    #[must_use]
    pub fn charges(self, admitted: bool, all_admit: bool) -> bool {
        match self {
            Self::AllOrNothing => admitted && all_admit,
            Self::EachAdmitting => admitted,
            Self::Nothing => false,
        }
    }
}

/// Most shards; fewer for a bound below this, so that each shard holds at least one.
const MAX_SHARDS: usize = 64;

/// Entries looked at to pick an eviction victim.
const EVICTION_SAMPLE: usize = 16;

/// Buckets in memory, in shards each behind its own lock, bounded in number.
///
/// Keys are hashed once per bucket per call with `foldhash`, seeded at random per
/// process and per store: keys are client-chosen (addresses, header values), so a
/// fixed-seed hash (FxHash) would let a client craft colliding keys, while a keyed
/// one like this is what `hashbrown` itself defaults to for DoS resistance, at a
/// fraction of SipHash's cost. That one hash picks the shard (mixed, so that the
/// bits the table uses stay spread within a shard) and is reused for the lookup and
/// the insert.
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
    shards: Box<[Padded]>,
    hasher: RandomState,
    tracked: AtomicUsize,
    evictions: AtomicU64,
}

/// A shard's lock on cache lines of its own, so that threads working on different
/// shards do not contend for the lines of their neighbours' locks.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

#[derive(Debug)]
struct Shard {
    entries: IndexMap<Key, Entry, RandomState>,
    capacity: usize,
    /// Where the next eviction sample starts.
    hand: usize,
}

#[derive(Debug, PartialEq, Eq)]
struct Key {
    policy: Arc<str>,
    key: Text,
}

impl Hash for Key {
    /// As [`KeyRef`] hashes.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        KeyRef { policy: &self.policy, key: self.key.as_str() }.hash(state);
    }
}

/// Bytes of a key kept in the entry itself: any IPv4 address, as text.
const INLINE: usize = 22;

/// A key's text, in the entry when short (one memory access less per lookup).
#[derive(Debug, PartialEq, Eq)]
enum Text {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl Text {
    fn new(text: &str) -> Self {
        let mut bytes = [0; INLINE];
        match (bytes.get_mut(..text.len()), u8::try_from(text.len())) {
            (Some(head), Ok(len)) => {
                head.copy_from_slice(text.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(text.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            Self::Heap(text) => text.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole, so always valid.
            Self::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Self::Heap(text) => text,
        }
    }
}

/// A [`Key`] borrowed from a [`Bucket`], hashing the same, to hash without
/// allocating.
#[derive(Hash)]
struct KeyRef<'a> {
    policy: &'a str,
    key: &'a str,
}

impl Key {
    /// Whether this is `bucket`'s key; the policy by pointer first, as the engine
    /// passes the very `Arc` the key was made from.
    fn is(&self, bucket: &Bucket<'_>) -> bool {
        (Arc::ptr_eq(&self.policy, bucket.policy) || *self.policy == **bucket.policy)
            && self.key.as_bytes() == bucket.key.as_bytes()
    }
}

/// Buckets per call held on the stack; more spill to the heap.
type Few<T> = SmallVec<[T; 4]>;

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
        let hasher = RandomState::default();
        let store = Self {
            shards: (0..shards)
                .map(|_| {
                    Padded(Mutex::new(Shard { entries: IndexMap::with_hasher(hasher.clone()), capacity: 0, hand: 0 }))
                })
                .collect(),
            hasher,
            tracked: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
        };
        store.set_capacity(max_tracked_keys);
        store
    }

    /// The bucket's hash, the same its key has in a shard's table.
    fn hash(&self, bucket: &Bucket<'_>) -> u64 {
        self.hasher.hash_one(KeyRef { policy: bucket.policy, key: bucket.key })
    }

    fn shard_of(&self, hash: u64) -> usize {
        // The table indexes by the low bits and tags by the top seven: mixing all the
        // bits first keeps the keys of one shard spread over both.
        let mixed = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        ((mixed * self.shards.len() as u64) >> 32) as usize
    }

    /// One bucket: one hash, one lock, one lookup.
    fn apply_one(&self, bucket: &Bucket<'_>, now: Duration, charge: Charge) -> Outcome {
        let hash = self.hash(bucket);
        let mut shard = lock(&self.shards[self.shard_of(hash)]);
        let found = shard.find(hash, bucket);
        let outcome = bucket::check(bucket.spec, found.map(|i| &shard.entries[i].state), now);
        if charge.charges(outcome.admitted, outcome.admitted) {
            let change = match found {
                Some(index) => shard.update(index, bucket, &outcome, now),
                None => shard.insert(hash, bucket, &outcome, now, slice::from_ref(bucket)),
            };
            self.count(&change);
        }
        outcome
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

impl MemoryStore {
    /// Checks every bucket at `now`, then charges them as `charge` says, atomically
    /// with respect to every other call touching any of the same buckets. Returns
    /// the outcome of each bucket, in order, as checked. The buckets must be
    /// distinct.
    pub fn apply(&self, buckets: &[Bucket<'_>], now: Duration, charge: Charge) -> Vec<Outcome> {
        if let [bucket] = buckets {
            return vec![self.apply_one(bucket, now, charge)];
        }
        let hashes: Few<u64> = buckets.iter().map(|b| self.hash(b)).collect();
        let shard_of: Few<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Locking in ascending shard order means two requests sharing shards cannot
        // deadlock; holding every lock across check and charge makes the step atomic.
        let mut guards: Few<MutexGuard<'_, Shard>> = order.iter().map(|&i| lock(&self.shards[i])).collect();
        let guard_of: Few<usize> = shard_of.iter().map(|s| order.partition_point(|o| o < s)).collect();

        let outcomes: Vec<Outcome> = buckets
            .iter()
            .zip(&guard_of)
            .zip(&hashes)
            .map(|((b, &g), &h)| {
                let shard = &guards[g];
                bucket::check(b.spec, shard.find(h, b).map(|i| &shard.entries[i].state), now)
            })
            .collect();
        let all_admit = outcomes.iter().all(|o| o.admitted);
        for (((b, &g), &h), outcome) in buckets.iter().zip(&guard_of).zip(&hashes).zip(&outcomes) {
            if charge.charges(outcome.admitted, all_admit) {
                // Looked up again: an earlier bucket's eviction may have moved it.
                let shard = &mut guards[g];
                let change = match shard.find(h, b) {
                    Some(index) => shard.update(index, b, outcome, now),
                    None => shard.insert(h, b, outcome, now, buckets),
                };
                self.count(&change);
            }
        }
        outcomes
    }

    /// Drops the state of every policy whose identity `keep` refuses.
    pub fn retain_policies(&self, keep: &dyn Fn(&str) -> bool) {
        for shard in &self.shards {
            let mut shard = lock(shard);
            let before = shard.entries.len();
            shard.entries.retain(|key, _| keep(&key.policy));
            self.tracked.fetch_sub(before - shard.entries.len(), Ordering::Relaxed);
        }
    }

    /// Sets the bound on tracked buckets, evicting down to it.
    pub fn set_capacity(&self, max_tracked_keys: NonZeroUsize) {
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

    /// Buckets holding state.
    pub fn tracked_keys(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    /// Buckets dropped to make room, since the start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

impl Shard {
    /// Where `bucket` (of hash `hash`) is in the table.
    fn find(&self, hash: u64, bucket: &Bucket<'_>) -> Option<usize> {
        self.entries.raw_entry_v1().index_from_hash(hash, |key| key.is(bucket))
    }

    /// Charges an admitted request to the bucket at `index`.
    fn update(&mut self, index: usize, bucket: &Bucket<'_>, outcome: &Outcome, now: Duration) -> Change {
        if let Some((_, entry)) = self.entries.get_index_mut(index) {
            bucket::charge(bucket.spec, &mut entry.state, now);
            entry.idle_at = idle_at(outcome, now);
        }
        Change::Updated
    }

    /// Charges an admitted request to `bucket`, which is not in the table (its hash
    /// is `hash`), making room for it.
    fn insert(
        &mut self,
        hash: u64,
        bucket: &Bucket<'_>,
        outcome: &Outcome,
        now: Duration,
        request: &[Bucket<'_>],
    ) -> Change {
        let idle_at = idle_at(outcome, now);
        let change = if self.entries.len() < self.capacity {
            Change::Inserted
        } else if self.evict(to_nanos(now), request) {
            Change::Replaced
        } else {
            return Change::Dropped;
        };
        let mut state = State::new(bucket.spec.algorithm);
        bucket::charge(bucket.spec, &mut state, now);
        let key = Key { policy: Arc::clone(bucket.policy), key: Text::new(bucket.key) };
        match self.entries.raw_entry_mut_v1().from_hash(hash, |k| k.is(bucket)) {
            RawEntryMut::Vacant(vacant) => {
                vacant.insert_hashed_nocheck(hash, key, Entry { state, idle_at });
            }
            // Not reached: the caller looked it up under the same lock.
            RawEntryMut::Occupied(mut occupied) => {
                occupied.insert(Entry { state, idle_at });
            }
        }
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
            let Some((key, entry)) = self.entries.get_index(index) else {
                break;
            };
            if request.iter().any(|b| key.is(b)) {
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

/// When a bucket charged with `outcome` at `now` is back to full (ns since the epoch).
fn idle_at(outcome: &Outcome, now: Duration) -> u64 {
    to_nanos(now).saturating_add(to_nanos(outcome.after.reset_after))
}

/// Locks a shard, recovering it from a panicked holder: at worst one bucket holds a
/// half-made charge, which beats refusing every later request.
fn lock(shard: &Padded) -> MutexGuard<'_, Shard> {
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}
