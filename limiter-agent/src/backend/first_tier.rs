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
//!
//! A refund breaks that for a `count_when` rule's bucket: any agent's refund may give a
//! unit back at any moment, so such a refusal is held [`REFUNDABLE_HOLD`] at most (a
//! client hammering it costs Redis one call a second per agent, a client it no longer
//! holds waits that much at worst), and this agent's own refunds forget it at once
//! ([`FirstTier::forget`]).

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

/// How long a refusal of a bucket a refund may lift is answered here at most.
pub(crate) const REFUNDABLE_HOLD: Duration = Duration::from_secs(1);

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
    /// Until when it is answered here: its `retry_after`, or sooner for a bucket a
    /// refund may lift.
    until: Duration,
}

/// One bucket's entry: the identity's length first, so that no two (policy, key)
/// pairs share one.
pub(super) fn entry(bucket: &Bucket<'_>) -> String {
    format!("{}:{}:{}", bucket.policy.len(), bucket.policy, bucket.key)
}

impl FirstTier {
    /// What Redis said of `bucket` when it refused it, as it stands at `now`, if that
    /// refusal still holds.
    pub(crate) fn refusal(&self, bucket: &Bucket<'_>, now: Duration) -> Option<Outcome> {
        let refused = *self.lock().get(&entry(bucket))?;
        if now >= refused.until {
            return None;
        }
        let elapsed = now.checked_sub(refused.at)?;
        let retry_after = refused.outcome.retry_after.checked_sub(elapsed).filter(|left| !left.is_zero())?;
        let before = Quota {
            remaining: refused.outcome.before.remaining,
            reset_after: refused.outcome.before.reset_after.saturating_sub(elapsed),
        };
        Some(Outcome { before, after: before, retry_after, ..refused.outcome })
    }

    /// Remembers the buckets Redis refused in `outcomes`, asked at `now`; those a
    /// refund may lift (`refundable`, bucket by bucket) for [`REFUNDABLE_HOLD`] at most.
    pub(crate) fn note(&self, buckets: &[Bucket<'_>], outcomes: &[Outcome], refundable: &[bool], now: Duration) {
        let mut refused = self.lock();
        let noted = buckets.iter().zip(outcomes).zip(refundable).filter(|((_, outcome), _)| !outcome.admitted);
        for ((bucket, outcome), &refundable) in noted {
            if refused.len() >= CAPACITY {
                refused.retain(|_, r| r.until > now);
                // Still mostly live: a flood of keys. Starting over keeps each insert
                // amortised O(1); the forgotten ones are asked of Redis again.
                if refused.len() > CAPACITY / 2 {
                    refused.clear();
                }
            }
            let held = if refundable { outcome.retry_after.min(REFUNDABLE_HOLD) } else { outcome.retry_after };
            refused.insert(entry(bucket), Refused { at: now, outcome: *outcome, until: now + held });
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

    /// Forgets the refusal of `bucket`, which this agent gave a unit back.
    pub(crate) fn forget(&self, bucket: &Bucket<'_>) {
        self.lock().remove(&entry(bucket));
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
