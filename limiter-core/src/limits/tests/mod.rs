//! Fake-clock tests: each algorithm's exact sequences, properties every algorithm
//! keeps, and the store's bound.

mod costs;
mod fixed_window;
mod leaky_bucket;
mod properties;
mod refunds;
mod sliding_window_counter;
mod sliding_window_log;
mod store;
mod token_bucket;

use std::{num::NonZeroU32, time::Duration};

use super::{
    Outcome,
    bucket::{self, State},
};
use crate::{Algorithm, Cost, LimitSpec};

/// On a minute boundary, as windows are aligned to the epoch.
const T0: Duration = Duration::from_secs(1_700_000_040);

const NS: Duration = Duration::from_nanos(1);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

fn spec(algorithm: Algorithm, limit: u32, window: Duration) -> LimitSpec {
    LimitSpec {
        algorithm,
        limit: nz(limit),
        window,
        burst: None,
        throttle: None,
        queue: None,
        calendar: None,
        cost: Cost::default(),
    }
}

/// One bucket, checked then charged as the store does.
struct Meter {
    spec: LimitSpec,
    state: State,
}

impl Meter {
    fn new(spec: LimitSpec) -> Self {
        let state = State::new(spec.algorithm);
        Self { spec, state }
    }

    /// The outcome at `at`, charging nothing.
    fn peek(&self, at: Duration) -> Outcome {
        bucket::check(&self.spec, Some(&self.state), at)
    }

    /// A request at `at`, charged if admitted (then `charged_at` says when, as a
    /// store notes it).
    fn hit(&mut self, at: Duration) -> Outcome {
        let mut outcome = self.peek(at);
        if outcome.admitted {
            outcome.charged_at = Some(bucket::charge(&self.spec, &mut self.state, at));
        }
        outcome
    }

    /// Gives back at `at` the charge of `outcome` (one [`Self::hit`] admitted).
    fn refund(&mut self, outcome: &Outcome, at: Duration) {
        let charged_at = outcome.charged_at.expect("a charged request");
        bucket::refund(&self.spec, &mut self.state, charged_at, at);
    }

    /// Charges a post-paid request's `units` at `at`.
    fn debit(&mut self, units: u32, at: Duration) {
        bucket::debit(&self.spec, &mut self.state, units, at);
    }

    /// How many of `n` requests at `at` are admitted.
    fn admitted(&mut self, at: Duration, n: usize) -> usize {
        (0..n).filter(|_| self.hit(at).admitted).count()
    }
}
