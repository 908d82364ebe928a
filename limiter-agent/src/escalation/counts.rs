//! Escalation's rejections per source, where `proxy.store` keeps the limits: in
//! this agent's memory (counting is per agent), or in the fleet's Redis, so that a
//! client spreading its abuse over the agents is blocked as soon as one hitting one
//! agent would be. Either way the counting is the limits' own sliding window log.

use std::{
    num::{NonZeroU32, NonZeroUsize},
    time::Duration,
};

use limiter_core::{
    Algorithm, Cost, LimitSpec,
    limits::{Bucket, Charge, MemoryStore, Outcomes},
};

use crate::{
    backend::{RedisStore, TimeSource},
    fleet::Fleet,
};

/// Sources whose rejections are counted at once; beyond it the store evicts the
/// quietest, and a new source it has no room for (every candidate past its
/// threshold) is not counted, which at worst delays one escalation: never refused,
/// which here would escalate it.
const MAX_COUNTED_SOURCES: usize = 100_000;

/// The fleet's counts, and this agent's own to decide by while Redis is away;
/// shared with the tasks that count in Redis.
#[derive(Debug)]
pub(super) struct RedisCounts {
    fleet: RedisStore,
    fallback: MemoryStore,
}

/// The sliding window log that counts `threshold` refusals within `window` (a
/// source's, or a fingerprint's): the refusal past them is the crossing.
pub(super) fn counting(threshold: NonZeroU32, window: Duration) -> LimitSpec {
    LimitSpec {
        algorithm: Algorithm::SlidingWindowLog,
        limit: threshold,
        window,
        burst: None,
        throttle: None,
        queue: None,
        cost: Cost::default(),
        calendar: None,
    }
}

/// This agent's own counts.
pub(super) fn memory() -> MemoryStore {
    MemoryStore::new(NonZeroUsize::new(MAX_COUNTED_SOURCES).unwrap_or(NonZeroUsize::MIN)).admitting_untracked()
}

impl RedisCounts {
    /// Counts in `fleet`'s Redis, which needs a tokio runtime.
    pub(super) fn new(fleet: Fleet) -> Self {
        Self { fleet: RedisStore::new(fleet, TimeSource::Server), fallback: memory() }
    }
}

/// Counts one rejection in `bucket` of `counts` at `now`; whether it crossed the
/// threshold.
pub(super) fn crossed(counts: &MemoryStore, bucket: Bucket<'_>, now: Duration) -> bool {
    refused(&counts.apply(&[bucket], now, Charge::AllOrNothing))
}

impl RedisCounts {
    /// [`crossed`], in the fleet's Redis (with its clock), or in this agent's own
    /// counts while Redis cannot be reached.
    pub(super) async fn crossed(&self, bucket: Bucket<'_>, now: Duration) -> bool {
        match self.fleet.apply(&[bucket], now, Charge::AllOrNothing).await {
            Ok(outcomes) => refused(&outcomes),
            Err(_) => crossed(&self.fallback, bucket, now),
        }
    }

    /// This agent's own counts.
    #[cfg(test)]
    pub(super) fn fallback(&self) -> &MemoryStore {
        &self.fallback
    }
}

fn refused(outcomes: &Outcomes) -> bool {
    outcomes.iter().any(|outcome| !outcome.admitted)
}
