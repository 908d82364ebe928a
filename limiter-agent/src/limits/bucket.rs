//! One bucket's state, whatever its algorithm, and the dispatch to the algorithm.

use std::time::Duration;

use super::{fixed_window, leaky_bucket, outcome::Outcome, sliding_window_counter, sliding_window_log, token_bucket};
use crate::config::proxy::{Algorithm, LimitSpec};

/// The state of one (policy, key) bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    TokenBucket(token_bucket::State),
    LeakyBucket(leaky_bucket::State),
    FixedWindow(fixed_window::State),
    SlidingWindowLog(sliding_window_log::State),
    SlidingWindowCounter(sliding_window_counter::State),
}

impl State {
    /// A bucket at full capacity.
    #[must_use]
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::TokenBucket => Self::TokenBucket(token_bucket::State::default()),
            Algorithm::LeakyBucket => Self::LeakyBucket(leaky_bucket::State::default()),
            Algorithm::FixedWindow => Self::FixedWindow(fixed_window::State::default()),
            Algorithm::SlidingWindowLog => Self::SlidingWindowLog(sliding_window_log::State::default()),
            Algorithm::SlidingWindowCounter => Self::SlidingWindowCounter(sliding_window_counter::State::default()),
        }
    }
}

/// The outcome of one request now against `state` (`None`: a bucket never charged).
#[must_use]
pub fn check(spec: &LimitSpec, state: Option<&State>, now: Duration) -> Outcome {
    match state {
        Some(State::TokenBucket(s)) if spec.algorithm == Algorithm::TokenBucket => token_bucket::check(spec, s, now),
        Some(State::LeakyBucket(s)) if spec.algorithm == Algorithm::LeakyBucket => leaky_bucket::check(spec, s, now),
        Some(State::FixedWindow(s)) if spec.algorithm == Algorithm::FixedWindow => fixed_window::check(spec, s, now),
        Some(State::SlidingWindowLog(s)) if spec.algorithm == Algorithm::SlidingWindowLog => {
            sliding_window_log::check(spec, s, now)
        }
        Some(State::SlidingWindowCounter(s)) if spec.algorithm == Algorithm::SlidingWindowCounter => {
            sliding_window_counter::check(spec, s, now)
        }
        // A policy's identity includes its algorithm, so another algorithm's state
        // can only be a stale leftover: the bucket is new.
        _ => check(spec, Some(&State::new(spec.algorithm)), now),
    }
}

/// Charges one request; call only for a request [`check`] admitted at `now`.
pub fn charge(spec: &LimitSpec, state: &mut State, now: Duration) {
    match state {
        State::TokenBucket(s) if spec.algorithm == Algorithm::TokenBucket => token_bucket::charge(spec, s, now),
        State::LeakyBucket(s) if spec.algorithm == Algorithm::LeakyBucket => leaky_bucket::charge(spec, s, now),
        State::FixedWindow(s) if spec.algorithm == Algorithm::FixedWindow => fixed_window::charge(spec, s, now),
        State::SlidingWindowLog(s) if spec.algorithm == Algorithm::SlidingWindowLog => {
            sliding_window_log::charge(spec, s, now);
        }
        State::SlidingWindowCounter(s) if spec.algorithm == Algorithm::SlidingWindowCounter => {
            sliding_window_counter::charge(spec, s, now);
        }
        _ => {
            *state = State::new(spec.algorithm);
            charge(spec, state, now);
        }
    }
}
