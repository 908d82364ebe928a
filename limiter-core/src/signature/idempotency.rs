//! Idempotency keys: the first response to a (key id, `Idempotency-Key`) pair is kept
//! for a while and given again to repeats, so that a retried payment runs once.
//!
//! # Bounds
//!
//! - Entries: at most `max_entries`. When a new key arrives at capacity, expired
//!   entries go first, then the completed entry closest to expiry (counted in
//!   [`IdempotencyStore::evictions`]). A late retry of an evicted key runs again, as it
//!   would after the TTL; refusing new keys instead would deny every idempotent request
//!   for up to the TTL (hours) once a busy or hostile key filled the store. In-flight
//!   entries are never evicted, since that would let a concurrent duplicate through;
//!   when all entries are in flight, [`Begin::Full`] refuses the request.
//! - Responses: one whose body plus headers exceed `max_response_bytes` is not stored,
//!   but its completion is: a repeat gets [`Begin::NotReplayable`] rather than running
//!   the request a second time. The `Idempotency-Key` value itself is bounded by the
//!   proxy's header size limit.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use sha2::{Digest, Sha256};

/// The request header naming the idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
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
    /// Most entries held, in flight or completed.
    pub max_entries: usize,
    /// Largest response (body plus header names and values) that is stored.
    pub max_response_bytes: usize,
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
/// key (a [`Guard`] here, the agent's `SharedGuard` in the fleet's store).
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
}

#[derive(Debug)]
struct Entry {
    fingerprint: [u8; 32],
    slot: Slot,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<EntryKey, Entry>,
    /// Completed entries by expiry, soonest first. In-flight entries do not expire: their
    /// guard removes or completes them.
    expiry: BTreeSet<(Duration, EntryKey)>,
}

impl State {
    fn purge_expired(&mut self, now: Duration) {
        while let Some((expires, _)) = self.expiry.first() {
            if *expires > now {
                break;
            }
            if let Some((_, key)) = self.expiry.pop_first() {
                self.entries.remove(&key);
            }
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
        // Critical sections keep both indexes consistent before anything that could
        // panic, so a poisoned lock still guards valid state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Thread-safe store of idempotent responses. Cheap to clone; clones share the store.
#[derive(Debug, Clone)]
pub struct IdempotencyStore {
    shared: Arc<Shared>,
}

impl IdempotencyStore {
    /// An empty store with these limits.
    #[must_use]
    pub fn new(config: IdempotencyConfig) -> Self {
        Self { shared: Arc::new(Shared { state: Mutex::new(State::default()), config, evictions: AtomicU64::new(0) }) }
    }

    /// Looks up (`key_id`, `idem_key`) for a request identified by `fingerprint`
    /// (see [`fingerprint`]) at `now` (the limiter's clock, see [`crate::clock`]).
    #[must_use]
    pub fn begin(&self, key_id: &str, idem_key: &str, fingerprint: [u8; 32], now: Duration) -> Begin {
        let key: EntryKey = (key_id.into(), idem_key.into());
        let mut state = self.shared.lock();
        let expired = match state.entries.get(&key) {
            None => false,
            Some(Entry { slot: Slot::Done { expires, .. }, .. }) if *expires <= now => true,
            Some(entry) if entry.fingerprint != fingerprint => return Begin::Conflict,
            Some(Entry { slot: Slot::InFlight, .. }) => return Begin::InFlight,
            Some(Entry { slot: Slot::Done { response: Some(response), .. }, .. }) => {
                return Begin::Replay(response.clone());
            }
            Some(Entry { slot: Slot::Done { response: None, .. }, .. }) => return Begin::NotReplayable,
        };
        if expired || state.entries.len() >= self.shared.config.max_entries {
            state.purge_expired(now);
        }
        if state.entries.len() >= self.shared.config.max_entries {
            let Some((_, oldest)) = state.expiry.pop_first() else {
                return Begin::Full;
            };
            state.entries.remove(&oldest);
            self.shared.evictions.fetch_add(1, Ordering::Relaxed);
        }
        state.entries.insert(key.clone(), Entry { fingerprint, slot: Slot::InFlight });
        drop(state);
        Begin::Proceed(Guard { shared: Arc::clone(&self.shared), key: Some(key) })
    }

    /// Entries held, in flight or completed (expired ones until purged).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.lock().entries.len()
    }

    /// Whether the store holds no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Completed entries evicted before their TTL to make room.
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.shared.evictions.load(Ordering::Relaxed)
    }
}

/// The in-flight claim on an idempotency key. Complete it with the response; dropping
/// it instead (upstream failed, client went away) frees the key so a retry can proceed.
pub struct Guard {
    shared: Arc<Shared>,
    /// `None` once completed, so that `Drop` leaves the entry alone.
    key: Option<EntryKey>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("key", &self.key).finish_non_exhaustive()
    }
}

impl Guard {
    /// Stores `response` for the TTL from `now` (or only the fact of completion, if it
    /// is larger than `max_response_bytes`).
    pub fn complete(mut self, response: StoredResponse, now: Duration) {
        let Some(key) = self.key.take() else {
            return;
        };
        let config = self.shared.config;
        // A TTL too long to represent keeps the response for as long as the store lives.
        let expires = now.saturating_add(config.ttl);
        let response = (response.stored_size() <= config.max_response_bytes).then_some(response);
        let mut state = self.shared.lock();
        // Only this guard removes or completes its in-flight entry, and in-flight
        // entries are never evicted, so the entry is still there.
        if let Some(entry) = state.entries.get_mut(&key) {
            entry.slot = Slot::Done { response, expires };
            state.expiry.insert((expires, key));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.shared.lock().entries.remove(&key);
        }
    }
}
