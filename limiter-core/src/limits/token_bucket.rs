//! Token bucket: `limit` tokens per `window`, holding up to `burst` (default `limit`).
//!
//! - A new bucket is full. Tokens return continuously, one every `window / limit`
//!   (exactly, without rounding), and never beyond `burst`.
//! - A request takes its cost in tokens (one by default); without as many left it is
//!   rejected and takes nothing.
//! - `remaining` is the whole tokens left; `reset_after` the time until the bucket is
//!   full again; `retry_after` the time until the next whole token; `used` is
//!   `burst − remaining`, what a throttle band is compared with.
//!
//! Kept as a GCRA TAT (see [`super::gcra`]): one number per key.

use std::time::Duration;

use super::{
    gcra::{Gcra, Tat},
    outcome::Outcome,
};
use crate::LimitSpec;

/// A token bucket's state; the default is a full bucket.
pub type State = Tat;

/// The outcome of one request now, without charging it.
#[must_use]
pub fn check(spec: &LimitSpec, state: &State, now: Duration) -> Outcome {
    gcra(spec).check(state, now)
}

/// Takes the cost's tokens; call only for a request [`check`] admitted at `now`. Returns the
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
