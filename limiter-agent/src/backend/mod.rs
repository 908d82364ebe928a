//! Where the proxy's state lives: this agent's memory or the fleet's Redis, chosen
//! once from `proxy.store` for the limits, the replay cache and the idempotency store
//! alike (and for escalation's counts, which follow the limits), and only the chosen
//! side is built. The memory side is `limiter_core`'s; the Redis side is in `redis/`.
//!
//! Each store answers the same on both sides. The memory side never fails; the Redis
//! side fails with a [`FleetError`] when the server cannot be reached, and the caller
//! then follows `store_failure` and counts the decision ([`Stores::count_failure`]).

mod first_tier;
mod last_known;
mod redis;

use std::{
    num::NonZeroUsize,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use limiter_core::{
    Clock as _,
    limits::{Bucket, Charge, Debit, MemoryStore, Outcomes, Quota, Refund},
    signature::{
        Authenticated, Begin, Guard, IdempotencyConfig, IdempotencyStore, ReplayCache, ReplayError, StoredResponse,
    },
};

use crate::{
    config::{ProxyConfig, proxy::StoreKind},
    fleet::{Fleet, FleetError},
};

pub(crate) use self::redis::{RedisClaim, RedisIdempotency, RedisReplay};
pub use self::redis::{RedisStore, TimeSource};
pub(crate) use self::{first_tier::FirstTier, last_known::LastKnown};

/// One store, in memory or in Redis.
#[derive(Debug)]
pub enum Backend<M, R> {
    Memory(M),
    Redis(R),
}

/// The limits' buckets.
pub type Limits = Backend<MemoryStore, RedisStore>;
/// Accepted signatures.
pub(crate) type Replay = Backend<ReplayCache, RedisReplay>;
/// Idempotent responses.
pub(crate) type Idempotency = Backend<IdempotencyStore, RedisIdempotency>;
/// A request's hold on its idempotency key; boxed in Redis, where it carries its
/// connection and key names.
pub(crate) type Claim = Backend<Guard, Box<RedisClaim>>;

/// The stores of one proxy. They outlive reloads: forgetting accepted signatures
/// would reopen the replay window, and sizes are taken from the first config
/// (`max_tracked_keys` excepted, which a reload applies).
#[derive(Debug)]
pub(crate) struct Stores {
    pub limits: Limits,
    pub replay: Replay,
    pub idempotency: Idempotency,
    /// The connection the Redis stores share; `None` in memory.
    fleet: Option<Fleet>,
    /// With Redis, the buckets it refused, answered here until they admit again.
    first_tier: Option<FirstTier>,
    /// With Redis, what it last said each bucket had left, for the local fallback.
    last_known: Option<LastKnown>,
    /// Agents of the fleet the last heartbeat counted (this one alone until then).
    agents: Arc<AtomicU32>,
    /// The limits' buckets while Redis is away under `store_failure = "local"`, made
    /// on first use, bounded like the memory store.
    local: OnceLock<MemoryStore>,
    local_capacity: NonZeroUsize,
    local_decisions: AtomicU64,
    /// With Redis, its keys and evictions as the last heartbeat read them.
    redis_size: Arc<[AtomicU64; 2]>,
}

/// How often an agent tells the fleet it is alive; one that has not for three
/// beats is no longer counted.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

impl Stores {
    /// The stores `config.store` names. A Redis store connects on first use, so that
    /// an agent starts (and follows `store_failure`) while Redis is down.
    pub fn new(config: &ProxyConfig) -> Result<Self, FleetError> {
        let signature = &config.signature;
        let idempotency = IdempotencyConfig {
            ttl: signature.idempotency_ttl.0,
            max_entries: signature.idempotency_max_entries.get(),
            max_response_bytes: signature.idempotency_max_body_bytes,
            max_bytes: signature.idempotency_max_bytes.get(),
        };
        let (limits, replay, idempotency, fleet) = match config.store {
            StoreKind::Memory => (
                Backend::Memory(MemoryStore::new(config.max_tracked_keys)),
                Backend::Memory(ReplayCache::new(signature.replay_cache_size.get())),
                Backend::Memory(IdempotencyStore::new(idempotency)),
                None,
            ),
            StoreKind::Redis => {
                let ca = match &config.redis_tls_ca {
                    Some(path) => {
                        Some(std::fs::read(path).map_err(|source| FleetError::Ca { path: path.clone(), source })?)
                    }
                    None => None,
                };
                let fleet =
                    Fleet::connect_tls(&config.redis_url, &config.redis_prefix, config.redis_timeout.0, ca.as_deref())?;
                (
                    Backend::Redis(RedisStore::new(fleet.clone(), TimeSource::Server)),
                    Backend::Redis(RedisReplay::new(fleet.clone(), signature.replay_cache_size.get())),
                    Backend::Redis(RedisIdempotency::new(fleet.clone(), idempotency)),
                    Some(fleet),
                )
            }
        };
        let stores = Self {
            limits,
            replay,
            idempotency,
            first_tier: fleet.as_ref().map(|_| FirstTier::default()),
            last_known: fleet.as_ref().map(|_| LastKnown::default()),
            fleet,
            agents: Arc::new(AtomicU32::new(1)),
            local: OnceLock::new(),
            local_capacity: config.max_tracked_keys,
            local_decisions: AtomicU64::new(0),
            redis_size: Arc::default(),
        };
        stores.set_keys(config);
        Ok(stores)
    }

    /// Shares the replay cache and the idempotency store equally among the keys
    /// that sign (see [`limiter_core::signature::share`]); called again on reload.
    pub(crate) fn set_keys(&self, config: &ProxyConfig) {
        let keys = config.keys.iter().filter(|key| !key.secrets.is_empty()).count();
        match &self.replay {
            Backend::Memory(cache) => cache.set_keys(keys),
            Backend::Redis(shared) => shared.set_keys(keys),
        }
        match &self.idempotency {
            Backend::Memory(store) => store.set_keys(keys),
            Backend::Redis(shared) => shared.set_keys(keys),
        }
    }

    /// With Redis, every [`HEARTBEAT`] until the stores are dropped: says this agent
    /// is alive, counts the fleet's live agents, and reads the server's size. It is
    /// also the probe that ends an outage as soon as Redis is back, whether requests
    /// come or not. Needs a tokio runtime.
    pub(crate) fn start_heartbeat(&self) {
        let Some(fleet) = self.fleet.clone() else { return };
        let agents = Arc::downgrade(&self.agents);
        let size = Arc::downgrade(&self.redis_size);
        let id = format!("{:x}-{:x}", std::process::id(), limiter_core::SystemClock.now().as_nanos());
        tokio::spawn(async move {
            let mut beats = tokio::time::interval(HEARTBEAT);
            beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                beats.tick().await;
                let (Some(agents), Some(size)) = (agents.upgrade(), size.upgrade()) else { return };
                // While Redis is away the last count stands: that is what it is for.
                if let Ok((live, keys)) = fleet.heartbeat(&id, HEARTBEAT * 3).await {
                    agents.store(live.max(1), Ordering::Relaxed);
                    size[0].store(keys, Ordering::Relaxed);
                }
                if let Ok(evicted) = fleet.evictions().await {
                    size[1].store(evicted, Ordering::Relaxed);
                }
            }
        });
    }

    /// Buckets held: in memory, this agent's; in Redis, the server's keys (the whole
    /// fleet's, every store's).
    #[must_use]
    pub fn tracked_keys(&self) -> usize {
        match &self.limits {
            Backend::Memory(store) => store.tracked_keys(),
            Backend::Redis(_) => usize::try_from(self.redis_size[0].load(Ordering::Relaxed)).unwrap_or(usize::MAX),
        }
    }

    /// Buckets evicted to stay in bounds: in memory, by `max_tracked_keys`; in
    /// Redis, by the server's `maxmemory`.
    #[must_use]
    pub fn evictions(&self) -> u64 {
        match &self.limits {
            Backend::Memory(store) => store.evictions(),
            Backend::Redis(_) => self.redis_size[1].load(Ordering::Relaxed),
        }
    }

    /// New keys the memory store could not track, every bucket it could have
    /// evicted being exhausted, and so refused: this agent's own, in memory or in the
    /// fallback of `store_failure = "local"` (Redis expires keys by their TTL and
    /// never refuses one for room).
    #[must_use]
    pub fn untracked_keys(&self) -> u64 {
        match &self.limits {
            Backend::Memory(store) => store.untracked_new_keys(),
            Backend::Redis(_) => self.local.get().map_or(0, MemoryStore::untracked_new_keys),
        }
    }

    /// Whether the shared store answers (always, in memory).
    #[must_use]
    pub fn reachable(&self) -> bool {
        self.fleet.as_ref().is_none_or(Fleet::is_up)
    }

    /// The fleet's live agents, as the heartbeats last counted them.
    #[must_use]
    pub(crate) fn live_agents(&self) -> u32 {
        self.agents.load(Ordering::Relaxed)
    }

    /// The store the limits fall back on under `store_failure = "local"`; `None` in
    /// memory, where the store never fails. A call that charges is one local
    /// decision; a check that charges nothing (`limiter explain`) is not.
    pub(crate) fn local_fallback(&self, charge: Charge) -> Option<&MemoryStore> {
        self.fleet.as_ref()?;
        if charge != Charge::Nothing {
            self.local_decisions.fetch_add(1, Ordering::Relaxed);
        }
        Some(self.local.get_or_init(|| MemoryStore::new(self.local_capacity)))
    }

    /// The local fallback's store, if it was ever used: where the charges it took are
    /// given back.
    pub(crate) fn local_store(&self) -> Option<&MemoryStore> {
        self.local.get()
    }

    /// With Redis, this agent's memory of the buckets it refused; `None` in memory,
    /// where the store is this agent's own.
    pub(crate) fn first_tier(&self) -> Option<&FirstTier> {
        self.first_tier.as_ref()
    }

    /// With Redis, what it last said each bucket had left; `None` in memory.
    pub(crate) fn last_known(&self) -> Option<&LastKnown> {
        self.last_known.as_ref()
    }

    /// Requests refused by [`Self::first_tier`] without asking Redis, since the start.
    #[must_use]
    pub fn refused_locally(&self) -> u64 {
        self.first_tier.as_ref().map_or(0, FirstTier::answered)
    }

    /// Decisions taken by [`Self::local_fallback`] since the start.
    #[must_use]
    pub fn local_decisions(&self) -> u64 {
        self.local_decisions.load(Ordering::Relaxed)
    }

    /// `memory` or `redis`, as `proxy.store` says.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        if self.fleet.is_some() { "redis" } else { "memory" }
    }

    /// The connection the Redis stores share; `None` in memory.
    #[must_use]
    pub fn fleet(&self) -> Option<&Fleet> {
        self.fleet.as_ref()
    }

    /// Counts one decision taken without the store (by `store_failure`).
    pub(crate) fn count_failure(&self) {
        if let Some(fleet) = &self.fleet {
            fleet.count_failure();
        }
    }

    /// Decisions taken without the store since the start.
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.fleet.as_ref().map_or(0, Fleet::failures)
    }
}

impl Limits {
    /// [`limiter_core::limits::MemoryStore::apply`], wherever the buckets are; `now` is
    /// used in memory (Redis measures with its own clock, see [`TimeSource`]).
    pub async fn apply(&self, buckets: &[Bucket<'_>], now: Duration, charge: Charge) -> Result<Outcomes, FleetError> {
        match self {
            Self::Memory(store) => Ok(store.apply(buckets, now, charge)),
            Self::Redis(store) => store.apply(buckets, now, charge).await,
        }
    }

    /// [`limiter_core::limits::MemoryStore::refund`], wherever the buckets are; `now`
    /// is used in memory.
    pub async fn refund(&self, refunds: &[Refund<'_>], now: Duration) -> Result<(), FleetError> {
        match self {
            Self::Memory(store) => {
                store.refund(refunds, now);
                Ok(())
            }
            Self::Redis(store) => store.refund(refunds, now).await,
        }
    }

    /// [`limiter_core::limits::MemoryStore::debit`], wherever the buckets are; `now`
    /// is used in memory.
    pub async fn debit(&self, debits: &[Debit<'_>], now: Duration) -> Result<Vec<Option<Quota>>, FleetError> {
        match self {
            Self::Memory(store) => Ok(store.debit(debits, now)),
            Self::Redis(store) => store.debit(debits, now).await,
        }
    }

    /// Applies a reload: the new bound on tracked buckets, and the state of the
    /// policies `keep` refuses dropped. Redis drops the buckets of a gone policy by
    /// itself: they expire once full.
    pub fn reconfigure(&self, max_tracked_keys: std::num::NonZeroUsize, keep: &dyn Fn(&str) -> bool) {
        if let Self::Memory(store) = self {
            store.set_capacity(max_tracked_keys);
            store.retain_policies(keep);
        }
    }
}

impl Replay {
    /// Records an authenticated signature as used, or says why it cannot be; `now`
    /// is the clock in unix seconds, used in memory (Redis expires signatures by its
    /// own clock, so that agents with skewed clocks agree).
    pub async fn check_and_insert(
        &self,
        authenticated: &Authenticated,
        max_skew: Duration,
        now: u64,
    ) -> Result<Result<(), ReplayError>, FleetError> {
        let Authenticated { key_id, timestamp, signature } = authenticated;
        match self {
            Self::Memory(cache) => Ok(cache.check_and_insert(key_id, signature, *timestamp, max_skew, now)),
            Self::Redis(shared) => shared.check_and_insert(key_id, signature, *timestamp, max_skew).await,
        }
    }
}

impl Idempotency {
    /// Looks up (`key_id`, `idem_key`) for a request identified by `fingerprint`.
    pub(crate) async fn begin(
        &self,
        key_id: &str,
        idem_key: &str,
        fingerprint: [u8; 32],
        now: Duration,
    ) -> Result<Begin<Claim>, FleetError> {
        match self {
            Self::Memory(store) => Ok(store.begin(key_id, idem_key, fingerprint, now).map_claim(Backend::Memory)),
            Self::Redis(shared) => Ok(shared
                .begin(key_id, idem_key, fingerprint)
                .await?
                .map_claim(|guard| Backend::Redis(Box::new(guard)))),
        }
    }
}

impl Claim {
    /// Marks the request as sent upstream at `now`: the key is never freed before the
    /// TTL from here on.
    pub async fn sent(&mut self, now: Duration) {
        match self {
            Self::Memory(guard) => guard.sent(Some(now)),
            Self::Redis(guard) => guard.hold().await,
        }
    }

    /// Undoes [`Self::sent`] for a request that provably never left (the upstream
    /// refused the connection): dropping the claim then frees the key.
    pub(crate) fn not_sent(&mut self) {
        match self {
            Self::Memory(guard) => guard.sent(None),
            Self::Redis(guard) => guard.sent(false),
        }
    }

    /// Stores the response for later repeats.
    pub async fn complete(self, response: StoredResponse, now: Duration) {
        match self {
            Self::Memory(guard) => guard.complete(response, now),
            Self::Redis(guard) => (*guard).complete(response).await,
        }
    }
}
