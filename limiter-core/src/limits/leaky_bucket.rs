//! Leaky bucket: a bucket of size `limit` draining `limit` per `window`.
//!
//! **As a meter** (no `queue`): each request pours one unit in; it is admitted if the
//! level plus one is at most `limit`, and rejected (pouring nothing) otherwise. The
//! level drains continuously at one unit per `T = window / limit`. `remaining` is
//! `limit − level` rounded down, `reset_after` the time until the bucket is empty,
//! `retry_after` the time until one unit has drained. (A meter admits exactly what a
//! token bucket with `burst = limit` admits: the two are duals, and both are a GCRA,
//! see [`super::gcra`].)
//!
//! **As a shaper** (`queue = N`): requests leave at the rate, one every `T`, and wait
//! for their turn. There is no real queue, only the time the last one leaves: a
//! request departs at `max(now, last_departure + T)`, and is rejected if it would
//! wait more than `N × T`, so at most `N` are waiting behind the one leaving.
//! An admitted request's [`Outcome::wait`] (so the engine's `Verdict::Delay`) is
//! `departure − now`; a waiting request holds no thread, the proxy just sleeps it.
//! `remaining` is the number of further requests that would be accepted now (free
//! places in the queue), `reset_after` the time until the queue is empty, and
//! `retry_after` the time until a place frees up.

use std::time::Duration;

use super::{
    gcra::{Gcra, Tat},
    outcome::Outcome,
};
use crate::LimitSpec;

/// A leaky bucket's state; the default is an empty bucket.
pub type State = Tat;

/// The outcome of one request now, without charging it.
#[must_use]
pub fn check(spec: &LimitSpec, state: &State, now: Duration) -> Outcome {
    let mut outcome = gcra(spec).check(state, now);
    if spec.queue.is_some() && outcome.admitted {
        // The TAT before this request is the previous departure plus `T`: this
        // request's own departure.
        outcome.wait = outcome.before.reset_after;
    }
    outcome
}

/// Pours the cost's units in; call only for a request [`check`] admitted at `now`. Returns the
/// instant it is counted at, `now`.
pub fn charge(spec: &LimitSpec, state: &mut State, now: Duration) -> Duration {
    gcra(spec).charge(state, now);
    now
}

/// Charges a post-paid request's `units` at `now`, into debt if need be.
pub fn debit(spec: &LimitSpec, state: &mut State, units: u32, now: Duration) {
    gcra(spec).take(state, now, units);
}

/// Gives back the charge made at `charged_at`, as of `now` (see [`super::gcra`]).
pub fn refund(spec: &LimitSpec, state: &mut State, charged_at: Duration, now: Duration) {
    gcra(spec).refund(state, charged_at, now);
}

fn gcra(spec: &LimitSpec) -> Gcra {
    Gcra::new(spec, spec.capacity())
}
