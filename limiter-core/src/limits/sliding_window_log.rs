//! Sliding window log: at most `limit` requests in any `window`, exactly.
//!
//! - The log holds the times of the admitted requests of the last `window`: one
//!   admitted at `t` counts during `[t, t + window)`, and no longer at `t + window`.
//! - A request is admitted if fewer than `limit` are in the log; a rejected request is
//!   not logged. The log never holds more than `limit` times (8 bytes each), so its
//!   memory is bounded per key.
//! - `remaining` is `limit − logged`; `reset_after` the time until the newest entry
//!   leaves the window (then the log is empty); `retry_after` the time until the entry
//!   whose departure brings the count below `limit` leaves; `used` is the count
//!   including the request.
//! - A refund takes its request's entry out of the log.

use std::{collections::VecDeque, time::Duration};

use super::{
    outcome::{Outcome, Quota},
    window,
};
use crate::{LimitSpec, clock::to_nanos};

/// Times (ns since the epoch) of the admitted requests, oldest first; entries that
/// have left the window are dropped at the next charge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    #[expect(
        clippy::box_collection,
        reason = "a box is one word where a deque is four: a bucket of any algorithm then fits the store's 48-byte slots"
    )]
    times: Box<VecDeque<u64>>,
}

impl State {
    /// Times held, expired ones included until the next charge: at most the limit.
    #[must_use]
    pub fn logged(&self) -> usize {
        self.times.len()
    }
}

/// The outcome of one request now, without charging it.
#[must_use]
pub fn check(spec: &LimitSpec, state: &State, now: Duration) -> Outcome {
    let length = window::length(spec);
    let now = to_nanos(now);
    let first = first_live(state, length, now);
    let count = (state.times.len() - first) as u64;
    let limit = u64::from(spec.limit.get());
    let until_gone = |t: u64| Duration::from_nanos(t.saturating_add(length).saturating_sub(now));
    let remaining = limit.saturating_sub(count);
    let before = Quota {
        remaining,
        reset_after: state.times.back().filter(|_| count > 0).map_or(Duration::ZERO, |&t| until_gone(t)),
    };
    if remaining == 0 {
        // Of the `count ≥ limit` entries, the first `count − limit + 1` must leave.
        let blocking = state.times.get(first + (count - limit) as usize).copied().unwrap_or(now);
        Outcome::rejected(limit, before, until_gone(blocking))
    } else {
        Outcome::admitted(limit, before, 1, until_gone(logged_time(state, now)))
    }
}

/// Logs one request; call only for a request [`check`] admitted at `now`. Returns
/// the time it is logged at (`now`, or the latest entry's if the clock stepped back).
pub fn charge(spec: &LimitSpec, state: &mut State, now: Duration) -> Duration {
    let now = to_nanos(now);
    let first = first_live(state, window::length(spec), now);
    state.times.drain(..first);
    let time = logged_time(state, now);
    state.times.push_back(time);
    Duration::from_nanos(time)
}

/// Logs `units` requests at `now`, as many as the log has room for: it never holds
/// more than `limit`, so this never leaves a debt. `LimitSpec::new` refuses a
/// post-paid cost on the log; what charges it so is the fallback's seeding of a
/// share with what the fleet had spent, which never passes empty.
pub fn debit(spec: &LimitSpec, state: &mut State, units: u32, now: Duration) {
    let now = to_nanos(now);
    let first = first_live(state, window::length(spec), now);
    state.times.drain(..first);
    let time = logged_time(state, now);
    let room = usize::try_from(spec.limit.get()).unwrap_or(usize::MAX).saturating_sub(state.times.len());
    let units = usize::try_from(units).unwrap_or(usize::MAX);
    state.times.extend(std::iter::repeat_n(time, room.min(units)));
}

/// Gives back the request logged at `charged_at`: its entry leaves the log (one of
/// them, if several were logged at that time: they are alike); nothing once it has
/// left the window.
pub fn refund(_spec: &LimitSpec, state: &mut State, charged_at: Duration, _now: Duration) {
    if let Ok(entry) = state.times.binary_search(&to_nanos(charged_at)) {
        state.times.remove(entry);
    }
}

/// Index of the oldest entry still in the window.
///
/// Found by galloping from the head: entries leave a few at a time between
/// charges, which drop them, so this reads a cache line or two at the head where
/// bisecting the whole log (up to `limit` times) would miss the cache at each step.
fn first_live(state: &State, length: u64, now: u64) -> usize {
    let gone = |i: usize| state.times.get(i).is_some_and(|&t| t.saturating_add(length) <= now);
    // Every entry before `live` is gone; none from `live + step − 1` on is.
    let (mut live, mut step) = (0, 1);
    while gone(live + step - 1) {
        live += step;
        step *= 2;
    }
    let mut end = (live + step - 1).min(state.times.len());
    while live < end {
        let middle = live + (end - live) / 2;
        if gone(middle) { live = middle + 1 } else { end = middle }
    }
    live
}

/// The time a request at `now` is logged at: a clock stepping back stands still, so
/// the log stays sorted.
fn logged_time(state: &State, now: u64) -> u64 {
    state.times.back().map_or(now, |&last| last.max(now))
}
