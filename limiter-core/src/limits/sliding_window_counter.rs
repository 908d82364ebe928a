//! Sliding window counter: the fixed windows' counts, with the previous window
//! weighted by how much of it the sliding window still covers.
//!
//! With windows aligned to the epoch, `elapsed` the time into the current one,
//! `previous` and `current` the admitted counts of the previous and current window:
//!
//! ```text
//! estimate = previous × (window − elapsed) / window + current
//! ```
//!
//! - A request of cost `c` (its needed units) is admitted if `estimate + c ≤ limit`,
//!   tested exactly in integers
//!   (`previous × (window − elapsed) + (current + c) × window ≤ limit × window`), so
//!   there is no rounding in the decision. It counts its cost (a post-paid one:
//!   nothing, then its charge, which may pass `limit`). A rejected request is not
//!   counted.
//! - `remaining = limit − current − ⌈previous × (window − elapsed) / window⌉`: the
//!   previous window's share is rounded up to whole requests, which makes
//!   `remaining` exactly the number of requests admitted back to back now. It drops
//!   by one per admitted request and otherwise only rises, as the previous window's
//!   weight decays; the estimate is continuous when a window turns (at that instant
//!   the previous window still weighs 1), so a turn frees nothing at once.
//! - `reset_after` is the time until the estimate is back to 0: the end of the next
//!   window once anything is counted in the current one (its count weighs on the next
//!   window), else the end of this one if the previous window still weighs.
//! - `retry_after` is the exact first instant the test above passes, possibly in the
//!   next window or, at worst, at the start of the one after.
//! - `used` is `limit − remaining` after the request, the rounded-up estimate.
//! - A refund takes one off the count of the window its request was counted in,
//!   current or previous, while it weighs.

use std::time::Duration;

use super::{
    outcome::{Outcome, Quota},
    window::Window,
};
use crate::LimitSpec;

/// The counts of the latest window a request was admitted in and the one before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    window: u64,
    current: u32,
    previous: u32,
}

/// The outcome of one request now, without charging it.
#[must_use]
pub fn check(spec: &LimitSpec, state: &State, now: Duration) -> Outcome {
    let (window, previous, current) = counts(spec, state, now);
    let limit = spec.limit.get();
    let carried = carried(previous, window.length, window.elapsed);
    let remaining = u64::from(limit).saturating_sub(u64::from(current) + carried);
    let reset_after = if current > 0 {
        window.until_end(1)
    } else if carried > 0 {
        window.until_end(0)
    } else {
        Duration::ZERO
    };
    let before = Quota { remaining, reset_after };
    let needed = spec.cost.needed();
    if remaining >= u64::from(needed) {
        return Outcome::admitted(limit.into(), before, spec.cost.upfront(), window.until_end(1));
    }
    // Admission only gets easier as time passes, so the first fit is the answer: later
    // in this window, else in the next (where `current` becomes the previous count),
    // else at the start of the one after, when nothing weighs any more.
    let retry_after = match first_fit(limit, needed, previous, current, window.length) {
        Some(offset) => Duration::from_nanos(offset.saturating_sub(window.elapsed)),
        None => match first_fit(limit, needed, current, 0, window.length) {
            Some(offset) => window.until_end(0) + Duration::from_nanos(offset),
            None => window.until_end(1),
        },
    };
    Outcome::rejected(limit.into(), before, retry_after)
}

/// Counts one request's cost; call only for a request [`check`] admitted at `now`.
/// Returns the instant it is counted at: `now`, or the start of the window counted
/// in if the clock stepped back before it.
pub fn charge(spec: &LimitSpec, state: &mut State, now: Duration) -> Duration {
    debit(spec, state, spec.cost.upfront(), now)
}

/// Counts a post-paid request's `units` in the window of `now`, past `limit` if need be.
pub fn debit(spec: &LimitSpec, state: &mut State, units: u32, now: Duration) -> Duration {
    let (window, previous, current) = counts(spec, state, now);
    *state = State { window: window.index, current: current.saturating_add(units), previous };
    window.instant()
}

/// Gives back the request counted at `charged_at`: its cost less in its window's
/// count, current or previous; nothing once that window no longer weighs.
pub fn refund(spec: &LimitSpec, state: &mut State, charged_at: Duration, _now: Duration) {
    let charged = Window::index_of(spec, charged_at);
    let units = spec.cost.upfront();
    if state.window == charged {
        state.current = state.current.saturating_sub(units);
    } else if state.window == charged.saturating_add(1) {
        state.previous = state.previous.saturating_sub(units);
    }
}

/// The window of `now` and its previous and current counts.
fn counts(spec: &LimitSpec, state: &State, now: Duration) -> (Window, u32, u32) {
    let window = Window::at(spec, state.window, now);
    let (previous, current) = match window.index - state.window {
        0 => (state.previous, state.current),
        1 => (state.current, 0),
        _ => (0, 0),
    };
    (window, previous, current)
}

/// The previous window's weight `elapsed` into the current one, in whole requests
/// rounded up.
fn carried(previous: u32, length: u64, elapsed: u64) -> u64 {
    let weighted = u128::from(previous) * u128::from(length.saturating_sub(elapsed));
    u64::try_from(weighted.div_ceil(u128::from(length))).unwrap_or(u64::MAX)
}

/// The first offset into a window with these counts at which `needed` more units
/// fit, if any: the least `e` with
/// `previous × (length − e) ≤ (limit − current − needed) × length`.
fn first_fit(limit: u32, needed: u32, previous: u32, current: u32, length: u64) -> Option<u64> {
    let room = u128::from(limit.checked_sub(current)?.checked_sub(needed)?) * u128::from(length);
    if previous == 0 {
        return Some(0);
    }
    // `length − e` may be at most `room / previous`, in whole nanoseconds.
    let longest = u64::try_from(room / u128::from(previous)).unwrap_or(u64::MAX);
    match length.checked_sub(longest) {
        None | Some(0) => Some(0),
        Some(offset) if offset < length => Some(offset),
        Some(_) => None,
    }
}
