//! With Redis, what the server last said each bucket this agent asked had left, so
//! that the fallback of `store_failure = "local"` starts a key where the fleet left
//! it. Started full, a key whose quota the fleet had spent when Redis went away would
//! get the whole of it again from each agent's share: about twice the limit in that
//! window.
//!
//! What is remembered only ever lowers what the fallback admits: a bucket refills
//! after its answer (a window turns, tokens drip back), so the remaining noted is at
//! most what the bucket holds now, and an entry is dropped once its bucket is full
//! again (the answer's `reset_after`). A reload keeps it: a limit raised only makes
//! what was noted the lower, and one cut leaves the share no fuller than its new size.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use limiter_core::limits::{Bucket, Outcome};

use super::first_tier::entry;

/// Buckets remembered at most: as many as [`super::FirstTier`]'s, a few megabytes.
/// Past it, only buckets already remembered are noted again; the others would
/// start a fallback full, as they all did before.
pub(crate) const CAPACITY: usize = 16_384;

/// What Redis last said of each bucket, by policy and key.
#[derive(Debug, Default)]
pub(crate) struct LastKnown {
    known: Mutex<HashMap<String, Known>>,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    /// Requests the whole fleet had left in the bucket.
    remaining: u64,
    /// The agent's clock when the bucket is full again.
    full_at: Duration,
}

impl LastKnown {
    /// Remembers what each of `outcomes` (Redis' answer at `now`) left in its bucket.
    pub(crate) fn note(&self, buckets: &[Bucket<'_>], outcomes: &[Outcome], now: Duration) {
        let mut known = self.lock();
        for (bucket, outcome) in buckets.iter().zip(outcomes) {
            let left = if outcome.charged_at.is_some() { outcome.after } else { outcome.before };
            let entry = entry(bucket);
            if known.len() >= CAPACITY && !known.contains_key(&entry) {
                known.retain(|_, k| k.full_at > now);
                if known.len() >= CAPACITY {
                    continue;
                }
            }
            known.insert(entry, Known { remaining: left.remaining, full_at: now + left.reset_after });
        }
    }

    /// What the fleet had left of `bucket`, if it is not full again by `now`; taken,
    /// so that a fallback starts the bucket from it once.
    pub(crate) fn take(&self, bucket: &Bucket<'_>, now: Duration) -> Option<u64> {
        self.lock().remove(&entry(bucket)).filter(|k| k.full_at > now).map(|k| k.remaining)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        // Only whole inserts and removals happen under the lock.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::{num::NonZeroU32, sync::Arc, time::Duration};

    use limiter_core::{
        Algorithm, LimitSpec,
        limits::{Bucket, Outcome, Quota},
    };

    use super::{CAPACITY, LastKnown};

    const SECOND: Duration = Duration::from_secs(1);

    fn spec() -> LimitSpec {
        LimitSpec {
            algorithm: Algorithm::FixedWindow,
            limit: NonZeroU32::new(100).expect("limit"),
            window: Duration::from_secs(60),
            burst: None,
            throttle: None,
            queue: None,
            cost: limiter_core::Cost::default(),
            calendar: None,
        }
    }

    /// Redis' answer to a request it charged: `remaining` left, full in `full_in`.
    fn charged(remaining: u64, full_in: Duration) -> Outcome {
        let after = Quota { remaining, reset_after: full_in };
        let before = Quota { remaining: remaining + 1, reset_after: full_in };
        Outcome {
            admitted: true,
            before,
            after,
            retry_after: Duration::ZERO,
            used: 100 - remaining,
            wait: Duration::ZERO,
            charged_at: Some(SECOND),
        }
    }

    #[test]
    fn a_bucket_is_taken_once_and_only_until_it_is_full_again() {
        let (known, policy, spec) = (LastKnown::default(), Arc::<str>::from("p"), spec());
        let bucket = |key| Bucket { policy: &policy, key, spec: &spec };
        known.note(&[bucket("a"), bucket("b")], &[charged(41, 30 * SECOND), charged(7, 30 * SECOND)], SECOND);
        known.note(&[bucket("a")], &[charged(40, 30 * SECOND)], 2 * SECOND);
        assert_eq!(known.take(&bucket("a"), 3 * SECOND), Some(40), "the last answer");
        assert_eq!(known.take(&bucket("a"), 3 * SECOND), None, "taken once");
        assert_eq!(known.take(&bucket("b"), 31 * SECOND), None, "full again by then: nothing to start from");
    }

    #[test]
    fn a_full_memory_keeps_what_it_has_and_makes_room_from_buckets_full_again() {
        let (known, policy, spec) = (LastKnown::default(), Arc::<str>::from("p"), spec());
        let keys: Vec<String> = (0..=CAPACITY).map(|i| i.to_string()).collect();
        for key in &keys[..CAPACITY] {
            known.note(&[Bucket { policy: &policy, key, spec: &spec }], &[charged(1, SECOND)], SECOND);
        }
        let last = Bucket { policy: &policy, key: &keys[CAPACITY], spec: &spec };
        known.note(&[last], &[charged(1, SECOND)], SECOND);
        assert_eq!(known.take(&last, SECOND), None, "no room while every entry is live");
        known.note(&[last], &[charged(1, SECOND)], 3 * SECOND);
        assert_eq!(known.take(&last, 3 * SECOND), Some(1), "the lapsed ones made room");
    }
}
