//! The generic cell rate algorithm (GCRA) under the token and the leaky bucket.
//!
//! A bucket is one number, its theoretical arrival time (TAT): the instant at which
//! it is back to full capacity. A request costs one emission interval
//! `T = window / limit` and is admitted when, once charged, the TAT is at most
//! `capacity × T` ahead of now. That is a token bucket of `capacity` tokens refilled
//! at `limit` per `window` (`capacity − (TAT − now) / T` tokens are left), and equally
//! a leaky bucket of size `capacity` draining at that rate (its level is
//! `(TAT − now) / T`).
//!
//! Time is counted in units of `1 / limit` nanoseconds, so that `T` is exactly
//! `window` units: 3 per second is exactly 3 per second, with no rounding drift.
//! Times reported back are rounded up to the nanosecond, so a request retried after
//! `retry_after` is admitted, and one a nanosecond earlier is not.

use std::{num::NonZeroU32, time::Duration};

use super::{
    outcome::{Outcome, Quota},
    window,
};
use crate::{LimitSpec, clock::to_nanos};

/// A bucket's TAT. The default is a full bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tat {
    /// In units of `1 / scale` ns.
    at: u128,
    /// The limit `at` was counted with; 0 for a bucket never charged.
    scale: u32,
}

impl Tat {
    /// The TAT in units of `1 / limit` ns. A reconfigured limit keeps the instant at
    /// which the bucket is full, so a reload never refills a bucket.
    fn scaled(self, limit: u32) -> u128 {
        match self.scale {
            0 => 0,
            scale if scale == limit => self.at,
            scale => (self.at * u128::from(limit)).div_ceil(u128::from(scale)),
        }
    }
}

/// One bucket's parameters, in units of `1 / limit` ns.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gcra {
    limit: u32,
    /// `T`: one request's cost.
    interval: u128,
    /// `capacity × T`: how far ahead of now the TAT may run.
    tolerance: u128,
    capacity: u64,
}

impl Gcra {
    pub(super) fn new(spec: &LimitSpec, capacity: NonZeroU32) -> Self {
        let interval = u128::from(window::length(spec));
        Self {
            limit: spec.limit.get(),
            interval,
            tolerance: interval * u128::from(capacity.get()),
            capacity: u64::from(capacity.get()),
        }
    }

    pub(super) fn check(&self, tat: &Tat, now: Duration) -> Outcome {
        let (now, start) = self.start(tat, now);
        let debt = start - now;
        let remaining = u64::try_from(self.tolerance.saturating_sub(debt) / self.interval).unwrap_or(u64::MAX);
        let before = Quota { remaining, reset_after: self.duration(debt) };
        if remaining == 0 {
            // Admitted once the TAT is within `tolerance − T` of the clock.
            Outcome::rejected(self.capacity, before, self.duration(debt + self.interval - self.tolerance))
        } else {
            Outcome::admitted(self.capacity, before, self.duration(debt + self.interval))
        }
    }

    pub(super) fn charge(&self, tat: &mut Tat, now: Duration) {
        let (_, start) = self.start(tat, now);
        *tat = Tat { at: start + self.interval, scale: self.limit };
    }

    /// Now, and where the next charge starts from: the TAT, or now if the bucket is
    /// full (a full bucket does not save up beyond its capacity).
    fn start(&self, tat: &Tat, now: Duration) -> (u128, u128) {
        let now = u128::from(to_nanos(now)) * u128::from(self.limit);
        (now, tat.scaled(self.limit).max(now))
    }

    fn duration(&self, units: u128) -> Duration {
        let nanos = units.div_ceil(u128::from(self.limit));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}
