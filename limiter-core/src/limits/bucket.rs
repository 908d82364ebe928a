//! One bucket's state, whatever its algorithm, and the dispatch to the algorithm.

use std::time::Duration;

use super::{fixed_window, leaky_bucket, outcome::Outcome, sliding_window_counter, sliding_window_log, token_bucket};
use crate::{Algorithm, LimitSpec};

/// Writes the state enum and the dispatch once, from one list of (algorithm, module):
/// every algorithm module has the same `State`, `check`, `charge` and `refund`.
macro_rules! algorithms {
    ($($algorithm:ident => $module:ident),+ $(,)?) => {
        /// The state of one (policy, key) bucket.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum State {
            $($algorithm($module::State),)+
        }

        impl State {
            /// A bucket at full capacity.
            #[must_use]
            pub fn new(algorithm: Algorithm) -> Self {
                match algorithm {
                    $(Algorithm::$algorithm => Self::$algorithm($module::State::default()),)+
                }
            }
        }

        /// The outcome of one request now against `state` (`None`: a bucket never charged).
        #[must_use]
        pub fn check(spec: &LimitSpec, state: Option<&State>, now: Duration) -> Outcome {
            match state {
                $(Some(State::$algorithm(s)) if spec.algorithm == Algorithm::$algorithm => $module::check(spec, s, now),)+
                // A policy's identity includes its algorithm, so another algorithm's state
                // can only be a stale leftover: the bucket is new.
                _ => check(spec, Some(&State::new(spec.algorithm)), now),
            }
        }

        /// Charges one request; call only for a request [`check`] admitted at `now`.
        /// Returns the instant the request is counted at, which [`refund`] takes.
        pub fn charge(spec: &LimitSpec, state: &mut State, now: Duration) -> Duration {
            match state {
                $(State::$algorithm(s) if spec.algorithm == Algorithm::$algorithm => $module::charge(spec, s, now),)+
                _ => {
                    *state = State::new(spec.algorithm);
                    charge(spec, state, now)
                }
            }
        }

        /// Gives back, at `now`, the charge [`charge`] counted at `charged_at` under
        /// `spec`, as far as the bucket still holds it: at most what it took, never
        /// leaving the bucket fuller than had the request not come, and nothing to a
        /// bucket made since (another algorithm's state) or past the charge.
        pub fn refund(spec: &LimitSpec, state: &mut State, charged_at: Duration, now: Duration) {
            match state {
                $(State::$algorithm(s) if spec.algorithm == Algorithm::$algorithm => {
                    $module::refund(spec, s, charged_at, now);
                })+
                _ => {}
            }
        }
    };
}

/// Charges a post-paid request's `units` at `now`, as far past the limit as they go
/// (a debt the bucket repays by time before it admits again; the log, which holds a
/// time per request, only up to its limit). A bucket of another algorithm's state is
/// made again first, as [`charge`] does.
pub fn debit(spec: &LimitSpec, state: &mut State, units: u32, now: Duration) {
    match state {
        State::TokenBucket(s) if spec.algorithm == Algorithm::TokenBucket => token_bucket::debit(spec, s, units, now),
        State::LeakyBucket(s) if spec.algorithm == Algorithm::LeakyBucket => leaky_bucket::debit(spec, s, units, now),
        State::FixedWindow(s) if spec.algorithm == Algorithm::FixedWindow => {
            fixed_window::debit(spec, s, units, now);
        }
        State::SlidingWindowCounter(s) if spec.algorithm == Algorithm::SlidingWindowCounter => {
            sliding_window_counter::debit(spec, s, units, now);
        }
        State::SlidingWindowLog(s) if spec.algorithm == Algorithm::SlidingWindowLog => {
            sliding_window_log::debit(spec, s, units, now);
        }
        _ => {
            *state = State::new(spec.algorithm);
            debit(spec, state, units, now);
        }
    }
}

algorithms! {
    TokenBucket => token_bucket,
    LeakyBucket => leaky_bucket,
    FixedWindow => fixed_window,
    SlidingWindowLog => sliding_window_log,
    SlidingWindowCounter => sliding_window_counter,
}
