//! Where bucket state lives: the contract every store keeps, and [`MemoryStore`].
//!
//! A bucket is named by its policy's identity (a string that stays the same across
//! reloads while the policy's name, key spec, algorithm and window do) and a key
//! string. The contract is one atomic step per request, check every bucket then
//! charge, which a shared store (Redis, as one Lua script over the same names) can
//! provide as well as memory can.

use std::{
    fmt,
    hash::{BuildHasher as _, Hasher as _, RandomState},
    num::NonZeroUsize,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use siphasher::sip128::{Hasher128 as _, SipHasher13};
use smallvec::SmallVec;

use super::{
    bucket::{self, State},
    outcome::{Outcome, Quota},
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

/// A charge to give back: its bucket, and the instant the charge counted its request
/// at ([`Outcome::charged_at`]).
#[derive(Clone, Copy, Debug)]
pub struct Refund<'a> {
    pub bucket: Bucket<'a>,
    pub charged_at: Duration,
}

/// A post-paid charge: its bucket, and the units its answer cost.
#[derive(Clone, Copy, Debug)]
pub struct Debit<'a> {
    pub bucket: Bucket<'a>,
    pub units: u32,
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

/// Slots of a policy's table when its first bucket arrives; it doubles from there.
const FIRST_SLOTS: usize = 8;

/// The outcomes of one call, one per bucket in order: on the stack for a request of
/// up to four buckets, so that a decision allocates nothing.
pub type Outcomes = SmallVec<[Outcome; 4]>;

/// Buckets in memory, in shards each behind its own lock, bounded in number.
///
/// A bucket is found by its policy (each shard keeps one table per policy) and by a
/// 128-bit fingerprint of its key: SipHash-1-3-128 under a random per-process key,
/// and not the key's text. Keys are client-chosen, so a fingerprint must be one a
/// client cannot make collide: with a keyed pseudo-random function of 128 bits, two
/// keys share a bucket only by a collision that takes about 2^64 keys even to a
/// client who could read the fingerprints, which none can. The same hash spreads
/// keys over the shards and the tables, so crafted keys cannot pile up in one place
/// either. A bucket then is one 48-byte slot (fingerprint, state, full time) of a
/// flat open-addressing table, with no key text and no pointer to follow.
///
/// The bound is split evenly over the shards. A full shard evicts before inserting:
/// among `EVICTION_SAMPLE` (16) entries at a rotating hand, the one that is back to
/// full capacity soonest, which is a bucket already full if there is one (evicting
/// it loses nothing, as a new bucket starts full). This approximates "least recently
/// used" without a list to maintain: a bucket in use keeps pushing its full time out.
///
/// A bucket that ran out of capacity (a charge left it empty, or it refused a
/// request: a refusal counts as use) is never evicted before it is back to full:
/// evicting it would hand its client a fresh bucket, so a flood of new keys would
/// reset a brute-forcer's exhausted `login` bucket. When every sampled candidate is
/// such a bucket, the new key is not tracked ([`MemoryStore::untracked_new_keys`]
/// counts it) and, by default, its request is refused, with `retry_after` the time
/// until the soonest of them is full again. Admitting it untracked would give
/// whoever filled the store with exhausted buckets unlimited requests on every new
/// key (every new username to guess passwords for); refusing costs new clients
/// their requests only while the store is full of exhausted buckets, each of which
/// cost its sender a full bucket of requests, and the counter tells the operator to
/// raise the bound. A store whose refusals would punish a client
/// ([`MemoryStore::admitting_untracked`]) admits instead.
///
/// Two limits of the split: with a bound below the shard count given at a reload
/// (the shard count is fixed at creation) every shard still holds one bucket; and a
/// request needing more new buckets in one shard than the shard holds leaves the
/// extra ones uncounted. Neither happens with any bound above a few hundred.
pub struct MemoryStore {
    shards: Box<[Padded]>,
    /// The fingerprints' secret key.
    keys: (u64, u64),
    policy_hasher: foldhash::fast::RandomState,
    tracked: AtomicUsize,
    evictions: AtomicU64,
    untracked: AtomicU64,
    untracked_admitted: bool,
}

/// A shard's lock on cache lines of its own, so that threads working on different
/// shards do not contend for the lines of their neighbours' locks.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

#[derive(Debug, Default)]
struct Shard {
    /// One per policy with buckets in this shard.
    tables: Vec<Table>,
    /// Buckets in all the tables.
    len: usize,
    capacity: usize,
    /// Where the next eviction sample starts: a table, and a slot in it.
    hand: (usize, usize),
}

/// A key's fingerprint: a keyed hash of 128 bits, its identity in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint(u64, u64);

impl Fingerprint {
    /// The slot where a probe for this key starts, in a table of `slots` (a power
    /// of two).
    fn home(self, slots: usize) -> usize {
        // Truncating keeps the low bits, which are the ones the mask keeps.
        self.0 as usize & (slots - 1)
    }
}

/// One policy's buckets in a shard: linear probing over a power-of-two array, at
/// most 7/8 full.
#[derive(Debug)]
struct Table {
    policy: Arc<str>,
    slots: Box<[Option<Slot>]>,
    len: usize,
}

#[derive(Debug)]
struct Slot {
    fingerprint: Fingerprint,
    state: State,
    idle: Idle,
}

/// When a bucket is back to full capacity (ns since the epoch, below 2^63), as of its
/// last charge or refusal, and whether it ran out of capacity on the way there: one
/// word, the top bit for the latter, so that a slot stays 48 bytes.
#[derive(Clone, Copy, Debug)]
struct Idle(u64);

impl Idle {
    const EXHAUSTED: u64 = 1 << 63;

    fn new(full_at: u64, exhausted: bool) -> Self {
        Self(full_at.min(!Self::EXHAUSTED) | if exhausted { Self::EXHAUSTED } else { 0 })
    }

    fn full_at(self) -> u64 {
        self.0 & !Self::EXHAUSTED
    }

    /// Whether the bucket may not be evicted at `now`: it ran out and is not full yet.
    fn held(self, now: u64) -> bool {
        self.0 & Self::EXHAUSTED != 0 && self.full_at() > now
    }
}

// The memory a tracked key costs is this, over the tables' load: keep it in sight.
const _: () = assert!(size_of::<Option<Slot>>() == 48);

/// Where a bucket is: its table in the shard and its slot in the table.
type Place = (usize, usize);

/// Buckets per call held on the stack; more spill to the heap.
type Few<T> = SmallVec<[T; 4]>;

/// What a request did to a shard's population.
enum Change {
    Found,
    Inserted,
    /// Inserted in place of an evicted bucket.
    Replaced,
    /// Not recorded: the shard is full of this request's own buckets.
    Dropped,
    /// Not recorded: every candidate for eviction is exhausted; the soonest is full
    /// again at this instant (ns since the epoch).
    Held(u64),
}

/// What a sample of a full shard found to evict.
#[derive(Default)]
struct Candidates {
    /// The bucket back to full soonest among those that may go.
    evictable: Option<Place>,
    /// The exhausted bucket back to full soonest, and when.
    held: Option<(Place, u64)>,
}

impl MemoryStore {
    #[must_use]
    pub fn new(max_tracked_keys: NonZeroUsize) -> Self {
        Self::with_shards(max_tracked_keys, MAX_SHARDS)
    }

    /// A store of at most `shards` shards.
    pub(super) fn with_shards(max_tracked_keys: NonZeroUsize, shards: usize) -> Self {
        let shards = max_tracked_keys.get().min(shards).max(1);
        // std's `RandomState` is seeded from the system's random source: two of its
        // hashes are two secret random words.
        let seed = RandomState::new();
        let store = Self {
            shards: (0..shards).map(|_| Padded(Mutex::default())).collect(),
            keys: (seed.hash_one(0_u8), seed.hash_one(1_u8)),
            policy_hasher: foldhash::fast::RandomState::default(),
            tracked: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            untracked: AtomicU64::new(0),
            untracked_admitted: false,
        };
        store.set_capacity(max_tracked_keys);
        store
    }

    /// This store admits a new key it cannot track, where by default it refuses it:
    /// for counts whose refusal would punish a client (escalation's), where a count
    /// missed at worst delays one escalation.
    #[must_use]
    pub fn admitting_untracked(mut self) -> Self {
        self.untracked_admitted = true;
        self
    }

    /// Where `bucket` is found: its key's fingerprint, and its shard.
    fn locate(&self, bucket: &Bucket<'_>) -> (Fingerprint, usize) {
        let mut hasher = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        // One input, whose length SipHash mixes in: no delimiter needed.
        hasher.write(bucket.key.as_bytes());
        let hash = hasher.finish128();
        let fingerprint = Fingerprint(hash.h1, hash.h2);
        // The policy moves the shard too, so that one key's buckets under several
        // policies spread over the shards like any others. Policies come from the
        // config, not from clients: a fast hash does for them. The fingerprint's
        // second word picks the shard, as the first places the key in its table.
        let spread = fingerprint.1 ^ self.policy_hasher.hash_one(&**bucket.policy);
        (fingerprint, (((spread >> 32) * self.shards.len() as u64) >> 32) as usize)
    }

    /// One bucket: one hash, one lock, one lookup.
    fn apply_one(&self, bucket: &Bucket<'_>, now: Duration, charge: Charge) -> Outcome {
        let (fingerprint, shard) = self.locate(bucket);
        let mut shard = lock(&self.shards[shard]);
        let found = shard.find(bucket.policy, fingerprint);
        let mut outcome = bucket::check(bucket.spec, found.and_then(|place| shard.state(place)), now);
        let admitted = outcome.admitted;
        match found {
            // The common case in one lookup: nothing else moves the bucket meanwhile.
            Some(place) if charge.charges(admitted, admitted) => shard.charge_at(place, bucket.spec, &mut outcome, now),
            _ => {
                self.prepare(&mut shard, bucket, fingerprint, &mut outcome, now, charge, admitted, &[]);
                if charge.charges(outcome.admitted, outcome.admitted) {
                    shard.charge(bucket, fingerprint, &mut outcome, now);
                }
            }
        }
        outcome
    }

    /// What a request's `outcome` in `bucket` does before any charge: a refusal
    /// counts as use of the bucket, and a bucket to charge gets a slot, or its
    /// request is refused if exhausted buckets hold the shard (unless this store
    /// admits untracked keys).
    #[expect(clippy::too_many_arguments, reason = "one bucket's step, shared by both paths of `apply`")]
    fn prepare(
        &self,
        shard: &mut Shard,
        bucket: &Bucket<'_>,
        fingerprint: Fingerprint,
        outcome: &mut Outcome,
        now: Duration,
        charge: Charge,
        all_admit: bool,
        spared: &[Fingerprint],
    ) {
        if charge == Charge::Nothing {
            return;
        }
        if !outcome.admitted {
            shard.refused(bucket.policy, fingerprint, outcome, now);
            return;
        }
        if !charge.charges(outcome.admitted, all_admit) {
            return;
        }
        let change = shard.track(bucket, fingerprint, now, spared);
        if let Change::Held(full_at) = change
            && !self.untracked_admitted
        {
            let retry_after = Duration::from_nanos(full_at.saturating_sub(to_nanos(now)));
            let capacity = u64::from(bucket.spec.capacity().get());
            *outcome = Outcome::rejected(capacity, Quota { remaining: 0, reset_after: retry_after }, retry_after);
        }
        self.count(&change);
    }

    fn count(&self, change: &Change) {
        match change {
            Change::Inserted => {
                self.tracked.fetch_add(1, Ordering::Relaxed);
            }
            Change::Replaced => {
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
            Change::Held(_) => {
                self.untracked.fetch_add(1, Ordering::Relaxed);
            }
            Change::Found | Change::Dropped => {}
        }
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("tracked", &self.tracked_keys())
            .field("evictions", &self.evictions())
            .field("untracked_new_keys", &self.untracked_new_keys())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// Checks every bucket at `now`, then charges them as `charge` says, atomically
    /// with respect to every other call touching any of the same buckets. Returns
    /// the outcome of each bucket, in order, as checked. The buckets must be
    /// distinct.
    pub fn apply(&self, buckets: &[Bucket<'_>], now: Duration, charge: Charge) -> Outcomes {
        if let [bucket] = buckets {
            return std::iter::once(self.apply_one(bucket, now, charge)).collect();
        }
        let (fingerprints, shard_of): (Few<Fingerprint>, Few<usize>) = buckets.iter().map(|b| self.locate(b)).unzip();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Locking in ascending shard order means two requests sharing shards cannot
        // deadlock; holding every lock across check and charge makes the step atomic.
        let mut guards: Few<MutexGuard<'_, Shard>> = order.iter().map(|&i| lock(&self.shards[i])).collect();
        let guard_of: Few<usize> = shard_of.iter().map(|s| order.partition_point(|o| o < s)).collect();

        let mut outcomes: Outcomes = buckets
            .iter()
            .zip(&guard_of)
            .zip(&fingerprints)
            .map(|((b, &g), &f)| bucket::check(b.spec, guards[g].bucket_state(b.policy, f), now))
            .collect();
        let all_admit = outcomes.iter().all(|o| o.admitted);
        // Every bucket to charge has its slot before any is charged: one that cannot
        // have one refuses the request, and then none is charged.
        for (((b, &g), &f), outcome) in buckets.iter().zip(&guard_of).zip(&fingerprints).zip(&mut outcomes) {
            self.prepare(&mut guards[g], b, f, outcome, now, charge, all_admit, &fingerprints);
        }
        let all_admit = outcomes.iter().all(|o| o.admitted);
        for (((b, &g), &f), outcome) in buckets.iter().zip(&guard_of).zip(&fingerprints).zip(&mut outcomes) {
            if charge.charges(outcome.admitted, all_admit) {
                guards[g].charge(b, f, outcome, now);
            }
        }
        outcomes
    }

    /// Gives back each charge at `now`, as [`bucket::refund`] says; a bucket no longer
    /// tracked (evicted, or its policy dropped by a reload) has nothing to give back.
    pub fn refund(&self, refunds: &[Refund<'_>], now: Duration) {
        for refund in refunds {
            let (fingerprint, shard) = self.locate(&refund.bucket);
            let mut shard = lock(&self.shards[shard]);
            if let Some(place) = shard.find(refund.bucket.policy, fingerprint) {
                shard.refund_at(place, refund, now);
            }
        }
    }

    /// Charges each post-paid request's units at `now`, into debt if need be, and
    /// returns each bucket's quota once charged; a bucket evicted since its admission
    /// is tracked again for it (unless exhausted buckets hold its shard: then the
    /// charge is lost, `None`, as its key's next request is refused anyway).
    pub fn debit(&self, debits: &[Debit<'_>], now: Duration) -> Vec<Option<Quota>> {
        debits
            .iter()
            .map(|debit| {
                let (fingerprint, shard) = self.locate(&debit.bucket);
                let mut shard = lock(&self.shards[shard]);
                let change = shard.track(&debit.bucket, fingerprint, now, &[]);
                self.count(&change);
                let place = shard.find(debit.bucket.policy, fingerprint)?;
                shard.debit_at(place, debit, now)
            })
            .collect()
    }

    /// Drops the state of every policy whose identity `keep` refuses.
    pub fn retain_policies(&self, keep: &dyn Fn(&str) -> bool) {
        for shard in &self.shards {
            let mut shard = lock(shard);
            let before = shard.len;
            shard.tables.retain(|table| keep(&table.policy));
            shard.len = shard.tables.iter().map(|t| t.len).sum();
            shard.hand = (0, 0);
            self.tracked.fetch_sub(before - shard.len, Ordering::Relaxed);
        }
    }

    /// Sets the bound on tracked buckets, evicting down to it.
    pub fn set_capacity(&self, max_tracked_keys: NonZeroUsize) {
        let (share, extra) = (max_tracked_keys.get() / self.shards.len(), max_tracked_keys.get() % self.shards.len());
        for (i, shard) in self.shards.iter().enumerate() {
            let mut shard = lock(shard);
            shard.capacity = (share + usize::from(i < extra)).max(1);
            let mut evicted = 0;
            // Without a clock here no bucket counts as full: the sample's soonest goes,
            // an exhausted one only if every sampled bucket is, as the bound must hold.
            while shard.len > shard.capacity {
                let Candidates { evictable, held } = shard.sample(0, &[]);
                let Some(victim) = evictable.or(held.map(|(place, _)| place)) else { break };
                shard.remove(victim);
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

    /// New keys not tracked, since the start, because every bucket their shard could
    /// have evicted was exhausted; refused unless [`Self::admitting_untracked`].
    pub fn untracked_new_keys(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }
}

impl Shard {
    /// Where `policy`'s table is; the policy by pointer first, as the engine passes
    /// the very `Arc` the table was made for.
    fn table_of(&self, policy: &Arc<str>) -> Option<usize> {
        (self.tables.iter().position(|t| Arc::ptr_eq(&t.policy, policy)))
            .or_else(|| self.tables.iter().position(|t| *t.policy == **policy))
    }

    /// Where the bucket of `policy` and `fingerprint` is.
    fn find(&self, policy: &Arc<str>, fingerprint: Fingerprint) -> Option<Place> {
        let table = self.table_of(policy)?;
        Some((table, self.tables[table].find(fingerprint)?))
    }

    fn state(&self, (table, slot): Place) -> Option<&State> {
        self.tables[table].slots[slot].as_ref().map(|slot| &slot.state)
    }

    /// The state of the bucket of `policy` and `fingerprint`, if tracked.
    fn bucket_state(&self, policy: &Arc<str>, fingerprint: Fingerprint) -> Option<&State> {
        self.state(self.find(policy, fingerprint)?)
    }

    /// Counts a refusal as use: the bucket is exhausted, and held until it is full
    /// again as its spec now says (a reload may have lowered its limit).
    fn refused(&mut self, policy: &Arc<str>, fingerprint: Fingerprint, outcome: &Outcome, now: Duration) {
        if let Some((table, slot)) = self.find(policy, fingerprint)
            && let Some(slot) = &mut self.tables[table].slots[slot]
        {
            slot.idle = Idle::new(idle_at(outcome.before, now), true);
        }
    }

    /// Charges an admitted request to `bucket`, if it has a slot.
    fn charge(&mut self, bucket: &Bucket<'_>, fingerprint: Fingerprint, outcome: &mut Outcome, now: Duration) {
        if let Some(place) = self.find(bucket.policy, fingerprint) {
            self.charge_at(place, bucket.spec, outcome, now);
        }
    }

    /// Charges an admitted request to the bucket at `place`, noting when in `outcome`.
    fn charge_at(&mut self, (table, slot): Place, spec: &LimitSpec, outcome: &mut Outcome, now: Duration) {
        if let Some(slot) = &mut self.tables[table].slots[slot] {
            outcome.charged_at = Some(bucket::charge(spec, &mut slot.state, now));
            let exhausted = outcome.after.remaining == 0 || slot.idle.held(to_nanos(now));
            slot.idle = Idle::new(idle_at(outcome.after, now), exhausted);
        }
    }

    /// Charges a post-paid request's units to the bucket at `place`: held from
    /// eviction once they empty it, as a charge that empties it is.
    fn debit_at(&mut self, (table, slot): Place, debit: &Debit<'_>, now: Duration) -> Option<Quota> {
        let spec = debit.bucket.spec;
        let slot = self.tables[table].slots[slot].as_mut()?;
        bucket::debit(spec, &mut slot.state, debit.units, now);
        let quota = bucket::check(spec, Some(&slot.state), now).before;
        let exhausted = quota.remaining == 0 || slot.idle.held(to_nanos(now));
        slot.idle = Idle::new(idle_at(quota, now), exhausted);
        Some(quota)
    }

    /// Gives back a charge to the bucket at `place`, which is then full sooner; one
    /// that ran out stays held until then, as a charge leaves it.
    fn refund_at(&mut self, (table, slot): Place, refund: &Refund<'_>, now: Duration) {
        let spec = refund.bucket.spec;
        if let Some(slot) = &mut self.tables[table].slots[slot] {
            bucket::refund(spec, &mut slot.state, refund.charged_at, now);
            let quota = bucket::check(spec, Some(&slot.state), now).before;
            slot.idle = Idle::new(idle_at(quota, now), slot.idle.held(to_nanos(now)));
        }
    }

    /// Gives `bucket` a slot, a full bucket if it had none, making room without
    /// evicting an exhausted bucket or any of the `spared` buckets (the request's).
    fn track(
        &mut self,
        bucket: &Bucket<'_>,
        fingerprint: Fingerprint,
        now: Duration,
        spared: &[Fingerprint],
    ) -> Change {
        if self.find(bucket.policy, fingerprint).is_some() {
            return Change::Found;
        }
        let now = to_nanos(now);
        let change = if self.len < self.capacity {
            Change::Inserted
        } else {
            match self.sample(now, spared) {
                Candidates { evictable: Some(victim), .. } => {
                    self.remove(victim);
                    Change::Replaced
                }
                Candidates { held: Some((_, full_at)), .. } => return Change::Held(full_at),
                Candidates { evictable: None, held: None } => return Change::Dropped,
            }
        };
        let table = self.table_of(bucket.policy).unwrap_or_else(|| {
            self.tables.push(Table { policy: Arc::clone(bucket.policy), slots: Box::default(), len: 0 });
            self.tables.len() - 1
        });
        let state = State::new(bucket.spec.algorithm);
        self.tables[table].insert(Slot { fingerprint, state, idle: Idle::new(now, false) });
        self.len += 1;
        change
    }

    /// Samples buckets at the rotating hand for one to evict at `now`, passing over
    /// the buckets whose key has a `spared` fingerprint, whatever their policy.
    fn sample(&mut self, now: u64, spared: &[Fingerprint]) -> Candidates {
        let mut candidates = Candidates::default();
        let mut soonest = u64::MAX;
        let (mut table, mut slot) = self.hand;
        let (mut looked, mut visited) = (0, 0);
        let slots: usize = self.tables.iter().map(|t| t.slots.len()).sum();
        // Every slot at most once: the shard may be full of spared buckets.
        while looked < EVICTION_SAMPLE.min(self.len) && visited < slots {
            if table >= self.tables.len() {
                (table, slot) = (0, 0);
            }
            if slot >= self.tables[table].slots.len() {
                (table, slot) = (table + 1, 0);
                continue;
            }
            visited += 1;
            let place = (table, slot);
            slot += 1;
            let Some(entry) = &self.tables[place.0].slots[place.1] else {
                continue;
            };
            looked += 1;
            if spared.contains(&entry.fingerprint) {
                continue;
            }
            let full_at = entry.idle.full_at();
            if entry.idle.held(now) {
                if candidates.held.is_none_or(|(_, held)| full_at < held) {
                    candidates.held = Some((place, full_at));
                }
                continue;
            }
            if full_at < soonest {
                (candidates.evictable, soonest) = (Some(place), full_at);
            }
            if full_at <= now {
                break;
            }
        }
        self.hand = (table, slot);
        candidates
    }

    fn remove(&mut self, (table, slot): Place) {
        self.tables[table].remove(slot);
        self.len -= 1;
    }
}

impl Table {
    /// The slot holding `fingerprint`.
    fn find(&self, fingerprint: Fingerprint) -> Option<usize> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut at = fingerprint.home(self.slots.len());
        // Ends at an empty slot, as one in eight at least is.
        loop {
            match &self.slots[at] {
                Some(slot) if slot.fingerprint == fingerprint => return Some(at),
                Some(_) => at = (at + 1) & mask,
                None => return None,
            }
        }
    }

    /// Adds a bucket not in the table, growing it past 7/8 full.
    fn insert(&mut self, slot: Slot) {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            let grown = (self.slots.len() * 2).max(FIRST_SLOTS);
            let old = std::mem::replace(&mut self.slots, (0..grown).map(|_| None).collect());
            for slot in old.into_iter().flatten() {
                self.place(slot);
            }
        }
        self.place(slot);
        self.len += 1;
    }

    /// Puts `slot` at the first free slot from its home.
    fn place(&mut self, slot: Slot) {
        let mask = self.slots.len() - 1;
        let mut at = slot.fingerprint.home(self.slots.len());
        while self.slots[at].is_some() {
            at = (at + 1) & mask;
        }
        self.slots[at] = Some(slot);
    }

    /// Empties slot `hole`, moving back the buckets after it that probing would no
    /// longer reach (no tombstones: a lookup still ends at the first empty slot).
    fn remove(&mut self, mut hole: usize) {
        let mask = self.slots.len() - 1;
        self.slots[hole] = None;
        self.len -= 1;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let Some(slot) = &self.slots[at] else {
                return;
            };
            // It may fill the hole if its home is not after the hole on its way here.
            let home = slot.fingerprint.home(self.slots.len());
            if at.wrapping_sub(home) & mask >= at.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[at].take();
                hole = at;
            }
        }
    }
}

/// When a bucket with `quota` at `now` is back to full (ns since the epoch).
fn idle_at(quota: Quota, now: Duration) -> u64 {
    to_nanos(now).saturating_add(to_nanos(quota.reset_after))
}

/// Locks a shard, recovering it from a panicked holder: at worst one bucket holds a
/// half-made charge, which beats refusing every later request.
fn lock(shard: &Padded) -> MutexGuard<'_, Shard> {
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}
