//! Fixed window: at most `limit` requests per window, windows aligned to multiples
//! of `window` since the UNIX epoch (a one-minute window turns on the minute), or, with
//! a [`calendar`](crate::calendar), a day, week or month turning at midnight in its zone.
//!
//! - A request is admitted if at least its cost's units are left of `limit` in its
//!   window, and counts its cost (a post-paid one: nothing, then its charge, which
//!   may pass `limit`); a rejected request is not counted.
//! - The count drops to 0 at the exact instant the next window begins.
//! - `remaining` is `limit − count`; `reset_after` and `retry_after` are the time
//!   until the window ends (`reset_after` is 0 for a window with nothing counted);
//!   `used` is the count including the request.
//!
//! - A refund takes one off the count of the window its request was counted in,
//!   while that window lasts.
//!
//! Up to `2 × limit` requests can pass in a `window` straddling a boundary; the
//! sliding algorithms exist for that.

use std::time::Duration;

use super::{
    outcome::{Outcome, Quota},
    window::Window,
};
use crate::LimitSpec;

/// The count of the latest window a request was admitted in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    window: u64,
    count: u32,
}

/// The outcome of one request now, without charging it.
#[must_use]
pub fn check(spec: &LimitSpec, state: &State, now: Duration) -> Outcome {
    let (window, count) = current(spec, state, now);
    let limit = u64::from(spec.limit.get());
    let remaining = limit.saturating_sub(u64::from(count));
    let to_end = window.until_end(0);
    let before = Quota { remaining, reset_after: if count == 0 { Duration::ZERO } else { to_end } };
    if remaining < u64::from(spec.cost.needed()) {
        Outcome::rejected(limit, before, to_end)
    } else {
        Outcome::admitted(limit, before, spec.cost.upfront(), to_end)
    }
}

/// Counts one request's cost; call only for a request [`check`] admitted at `now`.
/// Returns the instant it is counted at: `now`, or the start of the window counted
/// in if the clock stepped back before it.
pub fn charge(spec: &LimitSpec, state: &mut State, now: Duration) -> Duration {
    debit(spec, state, spec.cost.upfront(), now)
}

/// Counts a post-paid request's `units` in the window of `now`, past `limit` if need be.
pub fn debit(spec: &LimitSpec, state: &mut State, units: u32, now: Duration) -> Duration {
    let (window, count) = current(spec, state, now);
    *state = State { window: window.index, count: count.saturating_add(units) };
    window.instant()
}

/// Gives back the request counted at `charged_at`: its cost less in its window,
/// nothing once that window is over.
pub fn refund(spec: &LimitSpec, state: &mut State, charged_at: Duration, _now: Duration) {
    if state.window == Window::index_of(spec, charged_at) {
        state.count = state.count.saturating_sub(spec.cost.upfront());
    }
}

/// The window of `now` and its count so far.
fn current(spec: &LimitSpec, state: &State, now: Duration) -> (Window, u32) {
    let window = Window::at(spec, state.window, now);
    (window, if window.index == state.window { state.count } else { 0 })
}
