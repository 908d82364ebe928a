//! The replay cache in the fleet's Redis, so that a signature used on one agent is a
//! replay on every other: the answers of `limiter_core`'s `ReplayCache`, with entries
//! that expire by themselves.
//!
//! Keys are `{prefix}replay:{len(key id)}:{key id}`, a sorted set driven by
//! `replay.lua`: each key id holds at most its share of `replay_cache_size`, so one
//! tenant cannot fill the fleet's cache for the others.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use limiter_core::signature::{replay::ReplayError, share};
use redis::Script;

use crate::fleet::{Fleet, FleetError};

/// Accepted signatures, in Redis.
#[derive(Clone)]
pub(crate) struct RedisReplay {
    fleet: Fleet,
    script: Arc<Script>,
    /// `replay_cache_size`.
    capacity: usize,
    /// Most signatures one key id holds.
    share: Arc<AtomicUsize>,
}

impl fmt::Debug for RedisReplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisReplay").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl RedisReplay {
    /// `capacity` is shared among the key ids (see [`Self::set_keys`]).
    #[must_use]
    pub fn new(fleet: Fleet, capacity: usize) -> Self {
        let script = Arc::new(Script::new(include_str!("replay.lua")));
        Self { fleet, script, capacity, share: Arc::new(AtomicUsize::new(capacity)) }
    }

    /// As [`ReplayCache::set_keys`](limiter_core::signature::ReplayCache::set_keys).
    pub(crate) fn set_keys(&self, keys: usize) {
        self.share.store(share(self.capacity, keys), Ordering::Relaxed);
    }

    fn key(&self, key_id: &str) -> String {
        self.fleet.key(&format!("replay:{}:{key_id}", key_id.len()))
    }

    /// Records `signature` of `key_id` as used, as
    /// [`ReplayCache::check_and_insert`](limiter_core::signature::ReplayCache::check_and_insert)
    /// does with the server's clock for `now`; the outer error is an unreachable store.
    pub async fn check_and_insert(
        &self,
        key_id: &str,
        signature: &[u8; 32],
        timestamp: u64,
        max_skew: Duration,
    ) -> Result<Result<(), ReplayError>, FleetError> {
        // Kept until the request fails the timestamp check, and a second beyond: an
        // agent whose clock is within a second of the server's never accepts it again.
        let expires = timestamp.saturating_add(max_skew.as_secs()).saturating_add(1).saturating_mul(1000);
        let key = self.key(key_id);
        let share = self.share.load(Ordering::Relaxed);
        let reply: String = self
            .fleet
            .call(|mut connection| {
                let mut invocation = self.script.key(&key);
                invocation.arg(hex::encode(signature)).arg(expires).arg(share);
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await?;
        match reply.as_str() {
            "ok" => Ok(Ok(())),
            "replay" => Ok(Err(ReplayError::Replay)),
            "full" => Ok(Err(ReplayError::Full)),
            other => Err(FleetError::Reply(other.to_owned())),
        }
    }
}
