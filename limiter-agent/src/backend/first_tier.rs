//! With Redis, this agent's memory of the buckets the server refused, each until its
//! `retry_after`: a request counted in one of them is refused here without a round
//! trip. A client hammering a limit it is over would otherwise cost the fleet's Redis
//! one script call per request, and enough of them would slow it for everyone (and,
//! past `redis_timeout`, turn every agent to `store_failure`).
//!
//! The answer is the one Redis would give, or a stricter one never: charges only delay
//! a bucket's next admission, so a bucket refused at `t` for `retry_after` refuses
//! until `t + retry_after` whatever the other agents do, and `t` is taken before the
//! call, so the deadline is never later than the server's. A reload may raise a limit:
//! it forgets everything ([`FirstTier::clear`]).

use std::{
    collections::HashMap,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use limiter_core::limits::{Bucket, Outcome, Quota};

/// Refused buckets remembered at most: each holds a policy's identity and a key of
/// at most `MAX_KEY_VALUE` bytes, so a few megabytes in all.
pub(crate) const CAPACITY: usize = 16_384;

/// Buckets Redis refused, by policy and key, and what it said then.
#[derive(Debug, Default)]
pub(crate) struct FirstTier {
    refused: Mutex<HashMap<String, Refused>>,
    /// Decisions taken here without asking Redis.
    answered: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Refused {
    /// The agent's clock before the call that refused.
    at: Duration,
    outcome: Outcome,
}

/// One bucket's entry: the identity's length first, so that no two (policy, key)
/// pairs share one.
fn entry(bucket: &Bucket<'_>) -> String {
    format!("{}:{}:{}", bucket.policy.len(), bucket.policy, bucket.key)
}

impl FirstTier {
    /// What Redis said of `bucket` when it refused it, as it stands at `now`, if that
    /// refusal still holds.
    pub(crate) fn refusal(&self, bucket: &Bucket<'_>, now: Duration) -> Option<Outcome> {
        let refused = *self.lock().get(&entry(bucket))?;
        let elapsed = now.checked_sub(refused.at)?;
        let retry_after = refused.outcome.retry_after.checked_sub(elapsed).filter(|left| !left.is_zero())?;
        let before = Quota {
            remaining: refused.outcome.before.remaining,
            reset_after: refused.outcome.before.reset_after.saturating_sub(elapsed),
        };
        Some(Outcome { before, after: before, retry_after, ..refused.outcome })
    }

    /// Remembers the buckets Redis refused in `outcomes`, asked at `now`.
    pub(crate) fn note(&self, buckets: &[Bucket<'_>], outcomes: &[Outcome], now: Duration) {
        let mut refused = self.lock();
        for (bucket, outcome) in buckets.iter().zip(outcomes).filter(|(_, outcome)| !outcome.admitted) {
            if refused.len() >= CAPACITY {
                refused.retain(|_, r| r.at + r.outcome.retry_after > now);
                // Still mostly live: a flood of keys. Starting over keeps each insert
                // amortised O(1); the forgotten ones are asked of Redis again.
                if refused.len() > CAPACITY / 2 {
                    refused.clear();
                }
            }
            refused.insert(entry(bucket), Refused { at: now, outcome: *outcome });
        }
    }

    /// Counts one decision taken from [`Self::refusal`]s.
    pub(crate) fn count(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// Decisions taken here without asking Redis, since the start.
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Forgets every refusal (a reload may have raised the limits).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Refused>> {
        // Only whole inserts and removals happen under the lock.
        self.refused.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
