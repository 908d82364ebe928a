//! Idempotency keys: the first response to a (key id, `Idempotency-Key`) pair is kept
//! for a while and given again to repeats, so that a retried payment runs once.
//!
//! # Never twice
//!
//! Once the request has been sent upstream ([`Guard::sent`]) its key stays claimed
//! for the TTL whatever happens: a response is stored, or, when none came (timeout,
//! the client left), the outcome is recorded as unknown and repeats get
//! [`Begin::OutcomeUnknown`]. Only a claim dropped before sending frees the key.
//!
//! # Bounds, per key id
//!
//! Each key id (tenant) has an equal share of `max_entries` and of `max_bytes`
//! ([`IdempotencyStore::set_keys`]); an entry costs [`ENTRY_OVERHEAD`] plus its
//! key names plus its stored response. A tenant at its share first loses its own
//! expired entries, then its own completed entry closest to expiry (counted in
//! [`IdempotencyStore::evictions`]); never another tenant's. A late retry of an
//! evicted key runs again, as it would after the TTL. In-flight entries are never
//! evicted, since that would let a concurrent duplicate through; when a tenant's share
//! is all in flight, [`Begin::Full`] refuses the request.
//!
//! A response whose body plus headers exceed `max_response_bytes`, or that does not fit
//! the tenant's share even after evicting its completed entries, is not stored, but its
//! completion is: a repeat gets [`Begin::NotReplayable`] rather than running the
//! request a second time. The `Idempotency-Key` value is bounded by
//! [`MAX_IDEMPOTENCY_KEY_BYTES`].

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use sha2::{Digest, Sha256};

use super::share;

/// The request header naming the idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Longest `Idempotency-Key` accepted (as Stripe's); longer ones are refused (400).
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;
/// Bytes counted for every entry besides its key names and response: the maps'
/// nodes, the fingerprint and the bookkeeping.
pub const ENTRY_OVERHEAD: usize = 256;
/// The response header marking a stored response given again.
pub const IDEMPOTENCY_REPLAYED_HEADER: &str = "idempotency-replayed";

/// Whether idempotency keys apply to `method`: the methods that change state.
#[must_use]
pub fn applies_to(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE)
}

/// What identifies "the same request" for a key: method, target and body. Reusing a key
/// for another endpoint with the same body is then a conflict too, not a replay of the
/// other endpoint's response. Fields are length-prefixed so they cannot run together.
#[must_use]
pub fn fingerprint(method: &Method, target: &str, body_sha256: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    for field in [method.as_str().as_bytes(), target.as_bytes()] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field);
    }
    h.update(body_sha256);
    h.finalize().into()
}

/// Store limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// How long a completed response is kept (`idempotency_ttl`).
    pub ttl: Duration,
    /// Most entries held, in flight or completed, shared out among the key ids.
    pub max_entries: usize,
    /// Largest response (body plus header names and values) that is stored.
    pub max_response_bytes: usize,
    /// Most bytes held (see [`ENTRY_OVERHEAD`]), shared out among the key ids.
    pub max_bytes: usize,
}

/// A response as stored and given again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The upstream's status.
    pub status: StatusCode,
    /// The upstream's headers.
    pub headers: HeaderMap,
    /// The upstream's body.
    pub body: Bytes,
}

impl StoredResponse {
    /// Bytes counted against `max_response_bytes`.
    #[must_use]
    pub fn stored_size(&self) -> usize {
        self.headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum::<usize>()
            .saturating_add(self.body.len())
    }
}

/// What to do with a request carrying an idempotency key; `G` is the claim on the
/// key (a [`Guard`] here, the agent's `RedisClaim` in the fleet's store).
#[derive(Debug)]
pub enum Begin<G = Guard> {
    /// First use: forward it, then complete the claim with the response.
    Proceed(G),
    /// A completed repeat with the same request: answer with this and
    /// `Idempotency-Replayed: true`, without reaching the upstream.
    Replay(StoredResponse),
    /// The key was used for a different request (422). Takes precedence over
    /// [`Begin::InFlight`]: a different body is wrong however often it is retried.
    Conflict,
    /// The first request with this key is still running (409).
    InFlight,
    /// The first request completed but its response was too large to store; running it
    /// again could repeat its effect, so the proxy refuses (409).
    NotReplayable,
    /// The first request was sent upstream and no response came back: it may or may
    /// not have taken effect, and running it again could repeat it (409).
    OutcomeUnknown,
    /// Every entry is in flight; the store cannot track another key (503).
    Full,
}

impl<G> Begin<G> {
    /// The same answer with the claim turned into another type.
    pub fn map_claim<H>(self, f: impl FnOnce(G) -> H) -> Begin<H> {
        match self {
            Self::Proceed(guard) => Begin::Proceed(f(guard)),
            Self::Replay(response) => Begin::Replay(response),
            Self::Conflict => Begin::Conflict,
            Self::InFlight => Begin::InFlight,
            Self::NotReplayable => Begin::NotReplayable,
            Self::OutcomeUnknown => Begin::OutcomeUnknown,
            Self::Full => Begin::Full,
        }
    }
}

type EntryKey = (Box<str>, Box<str>);

#[derive(Debug)]
enum Slot {
    InFlight,
    /// `response` is `None` when it was too large to store.
    Done {
        response: Option<StoredResponse>,
        expires: Duration,
    },
    /// Sent upstream, and no response came back.
    Unknown {
        expires: Duration,
    },
}

impl Slot {
    const fn expires(&self) -> Option<Duration> {
        match self {
            Self::InFlight => None,
            Self::Done { expires, .. } | Self::Unknown { expires } => Some(*expires),
        }
    }
}

#[derive(Debug)]
struct Entry {
    fingerprint: [u8; 32],
    slot: Slot,
    /// What the entry counts against its tenant's `max_bytes` share.
    bytes: usize,
}

/// One key id's part of the store.
#[derive(Debug, Default)]
struct Tenant {
    entries: usize,
    bytes: usize,
    /// Its settled entries by expiry, soonest first: what it evicts to make room.
    expiry: BTreeSet<(Duration, Box<str>)>,
}

#[derive(Debug)]
struct State {
    entries: HashMap<EntryKey, Entry>,
    /// Settled entries by expiry, soonest first. In-flight entries do not expire: their
    /// guard settles or removes them.
    expiry: BTreeSet<(Duration, EntryKey)>,
    tenants: HashMap<Box<str>, Tenant>,
    bytes: usize,
    /// Key ids the bounds are shared among.
    keys: usize,
}

impl State {
    fn purge_expired(&mut self, now: Duration) {
        while let Some((expires, key)) = self.expiry.first() {
            if *expires > now {
                break;
            }
            let key = key.clone();
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &EntryKey) {
        let Some(entry) = self.entries.remove(key) else { return };
        self.bytes -= entry.bytes;
        let tenant = self.tenants.entry(key.0.clone()).or_default();
        tenant.entries -= 1;
        tenant.bytes -= entry.bytes;
        if let Some(expires) = entry.slot.expires() {
            self.expiry.remove(&(expires, key.clone()));
            tenant.expiry.remove(&(expires, key.1.clone()));
        }
        if tenant.entries == 0 {
            self.tenants.remove(&key.0);
        }
    }

    /// Settles the in-flight entry `key` as `slot`, with `extra` bytes more.
    fn settle(&mut self, key: &EntryKey, slot: Slot, extra: usize) {
        let Some(entry) = self.entries.get_mut(key) else { return };
        if let Some(expires) = slot.expires() {
            self.expiry.insert((expires, key.clone()));
            self.tenants.entry(key.0.clone()).or_default().expiry.insert((expires, key.1.clone()));
        }
        entry.slot = slot;
        entry.bytes += extra;
        self.bytes += extra;
        self.tenants.entry(key.0.clone()).or_default().bytes += extra;
    }

    /// Evicts settled entries of `key_id`, soonest to expire first, until `entries`
    /// more entries and `bytes` more bytes fit its share and the whole store: how many
    /// it evicted, `None` if they cannot fit.
    fn make_room(&mut self, config: &IdempotencyConfig, key_id: &str, entries: usize, bytes: usize) -> Option<u64> {
        let (entry_share, byte_share) = (share(config.max_entries, self.keys), share(config.max_bytes, self.keys));
        let mut evicted = 0;
        loop {
            let tenant = self.tenants.get(key_id);
            let (held, held_bytes) = tenant.map_or((0, 0), |t| (t.entries, t.bytes));
            let fits = held + entries <= entry_share
                && held_bytes + bytes <= byte_share
                && self.entries.len() + entries <= config.max_entries
                && self.bytes + bytes <= config.max_bytes;
            if fits {
                return Some(evicted);
            }
            let (_, idem) = tenant.and_then(|t| t.expiry.first()).cloned()?;
            self.remove(&(key_id.into(), idem));
            evicted += 1;
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    config: IdempotencyConfig,
    evictions: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections keep the indexes consistent before anything that could
        // panic, so a poisoned lock still guards valid state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes room as [`State::make_room`] does, counting evictions; false if there is none.
    fn make_room(&self, state: &mut State, key_id: &str, entries: usize, bytes: usize) -> bool {
        let evicted = state.make_room(&self.config, key_id, entries, bytes);
        self.evictions.fetch_add(evicted.unwrap_or(0), Ordering::Relaxed);
        evicted.is_some()
    }
}

/// Thread-safe store of idempotent responses. Cheap to clone; clones share the store.
#[derive(Debug, Clone)]
pub struct IdempotencyStore {
    shared: Arc<Shared>,
}

impl IdempotencyStore {
    /// An empty store with these limits, shared by one key id until [`Self::set_keys`].
    #[must_use]
    pub fn new(config: IdempotencyConfig) -> Self {
        let state =
            State { entries: HashMap::new(), expiry: BTreeSet::new(), tenants: HashMap::new(), bytes: 0, keys: 1 };
        Self { shared: Arc::new(Shared { state: Mutex::new(state), config, evictions: AtomicU64::new(0) }) }
    }

    /// Shares the bounds equally among `keys` key ids. A tenant over a smaller share
    /// after a reload loses its settled entries as it adds new ones.
    pub fn set_keys(&self, keys: usize) {
        self.shared.lock().keys = keys;
    }

    /// Looks up (`key_id`, `idem_key`) for a request identified by `fingerprint`
    /// (see [`fingerprint`]) at `now` (the limiter's clock, see [`crate::clock`]).
    #[must_use]
    pub fn begin(&self, key_id: &str, idem_key: &str, fingerprint: [u8; 32], now: Duration) -> Begin {
        let key: EntryKey = (key_id.into(), idem_key.into());
        let mut state = self.shared.lock();
        match state.entries.get(&key) {
            // Expired: purged below, then a first use again.
            None => {}
            Some(entry) if entry.slot.expires().is_some_and(|expires| expires <= now) => {}
            Some(entry) if entry.fingerprint != fingerprint => return Begin::Conflict,
            Some(Entry { slot: Slot::InFlight, .. }) => return Begin::InFlight,
            Some(Entry { slot: Slot::Done { response: Some(response), .. }, .. }) => {
                return Begin::Replay(response.clone());
            }
            Some(Entry { slot: Slot::Done { response: None, .. }, .. }) => return Begin::NotReplayable,
            Some(Entry { slot: Slot::Unknown { .. }, .. }) => return Begin::OutcomeUnknown,
        }
        // Pops only what has expired: nothing, most of the time.
        state.purge_expired(now);
        let bytes = ENTRY_OVERHEAD + key_id.len() + idem_key.len();
        if !self.shared.make_room(&mut state, key_id, 1, bytes) {
            return Begin::Full;
        }
        state.entries.insert(key.clone(), Entry { fingerprint, slot: Slot::InFlight, bytes });
        state.bytes += bytes;
        let tenant = state.tenants.entry(key.0.clone()).or_default();
        tenant.entries += 1;
        tenant.bytes += bytes;
        drop(state);
        Begin::Proceed(Guard { shared: Arc::clone(&self.shared), key: Some(key), sent: None })
    }

    /// Entries held, in flight or settled (expired ones until purged).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.lock().entries.len()
    }

    /// Whether the store holds no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held, as counted against `max_bytes`.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.shared.lock().bytes
    }

    /// Settled entries evicted before their TTL to make room.
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.shared.evictions.load(Ordering::Relaxed)
    }
}

/// The in-flight claim on an idempotency key. Complete it with the response. Dropping
/// it instead frees the key if the request was never [`Guard::sent`], so a retry can
/// proceed; once sent, it records the outcome as unknown for the TTL.
pub struct Guard {
    shared: Arc<Shared>,
    /// `None` once completed, so that `Drop` leaves the entry alone.
    key: Option<EntryKey>,
    /// When the request went upstream.
    sent: Option<Duration>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("key", &self.key).field("sent", &self.sent).finish_non_exhaustive()
    }
}

impl Guard {
    /// Marks the request as sent upstream at `at` (from then on dropping the guard
    /// records the outcome as unknown until `at` + TTL), or, with `None`, as never sent
    /// (dropping it frees the key).
    pub fn sent(&mut self, at: Option<Duration>) {
        self.sent = at;
    }

    /// Stores `response` for the TTL from `now` (or only the fact of completion, if it
    /// is larger than `max_response_bytes` or does not fit the key id's share).
    pub fn complete(mut self, response: StoredResponse, now: Duration) {
        let Some(key) = self.key.take() else {
            return;
        };
        let config = self.shared.config;
        // A TTL too long to represent keeps the response for as long as the store lives.
        let expires = now.saturating_add(config.ttl);
        let size = response.stored_size();
        let mut state = self.shared.lock();
        let stored = size <= config.max_response_bytes && self.shared.make_room(&mut state, &key.0, 0, size);
        // Only this guard removes or settles its in-flight entry, and in-flight
        // entries are never evicted, so the entry is still there.
        let (response, extra) = if stored { (Some(response), size) } else { (None, 0) };
        state.settle(&key, Slot::Done { response, expires }, extra);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut state = self.shared.lock();
        match self.sent {
            Some(sent) => state.settle(&key, Slot::Unknown { expires: sent.saturating_add(self.shared.config.ttl) }, 0),
            None => state.remove(&key),
        }
    }
}
