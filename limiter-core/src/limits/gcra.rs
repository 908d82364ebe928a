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
//!
//! A refund moves the TAT back by `T`, less the time since the charge: see
//! `Gcra::refund` for why that is the most it may give back.

use std::{num::NonZeroU32, time::Duration};

use super::{
    outcome::{Outcome, Quota},
    window,
};
use crate::{LimitSpec, clock::to_nanos};

/// A bucket's TAT. The default is a full bucket.
///
/// Kept as whole nanoseconds and a remainder (16 bytes, where a `u128` of units
/// would take 32 with its alignment), so that a bucket fits a small table slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tat {
    nanos: u64,
    /// The part of a nanosecond past `nanos`, in units of `1 / scale` ns: below `scale`.
    frac: u32,
    /// The limit `frac` was counted with; 0 for a bucket never charged.
    scale: u32,
}

impl Tat {
    /// The TAT as whole nanoseconds and a remainder in units of `1 / limit` ns. A
    /// reconfigured limit keeps the instant at which the bucket is full (rounded up
    /// to the new unit), so a reload never refills a bucket.
    fn at(self, limit: u32) -> (u64, u32) {
        match self.scale {
            0 => (0, 0),
            scale if scale == limit => (self.nanos, self.frac),
            scale => {
                // `frac < scale`, so this is at most `limit`: a whole nanosecond at most.
                let frac = (u64::from(self.frac) * u64::from(limit)).div_ceil(u64::from(scale));
                match u32::try_from(frac) {
                    Ok(frac) if frac < limit => (self.nanos, frac),
                    _ => (self.nanos.saturating_add(1), 0),
                }
            }
        }
    }
}

/// One bucket's parameters, in units of `1 / limit` ns.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gcra {
    limit: u32,
    /// `T`: one request's cost, `window` units.
    interval: u64,
    /// `capacity × T`: how far ahead of now the TAT may run.
    tolerance: u128,
    capacity: u64,
    /// Units a request must find left, and units it takes at admission (its cost).
    needed: u32,
    upfront: u32,
}

impl Gcra {
    pub(super) fn new(spec: &LimitSpec, capacity: NonZeroU32) -> Self {
        let interval = window::length(spec);
        Self {
            limit: spec.limit.get(),
            interval,
            tolerance: u128::from(interval) * u128::from(capacity.get()),
            capacity: u64::from(capacity.get()),
            needed: spec.cost.needed(),
            upfront: spec.cost.upfront(),
        }
    }

    pub(super) fn check(&self, tat: &Tat, now: Duration) -> Outcome {
        let debt = self.debt(tat, to_nanos(now));
        let remaining = u64::try_from(quotient(self.tolerance.saturating_sub(debt), self.interval)).unwrap_or(u64::MAX);
        let before = Quota { remaining, reset_after: self.duration(debt) };
        if remaining < u64::from(self.needed) {
            // Admitted once the TAT is within `tolerance − needed × T` of the clock
            // (a debt past the tolerance included).
            Outcome::rejected(self.capacity, before, self.duration(debt + self.units(self.needed) - self.tolerance))
        } else {
            Outcome::admitted(self.capacity, before, self.upfront, self.duration(debt + self.units(self.upfront)))
        }
    }

    /// Takes the request's cost at admission.
    pub(super) fn charge(&self, tat: &mut Tat, now: Duration) {
        self.take(tat, now, self.upfront);
    }

    /// Moves the TAT `cost × T` on: from the TAT, or from now if the bucket is full (a
    /// full bucket does not save up beyond its capacity). Past the tolerance too: a
    /// post-paid charge may leave the bucket in debt.
    pub(super) fn take(&self, tat: &mut Tat, now: Duration, cost: u32) {
        let now = to_nanos(now);
        let limit = u128::from(self.limit);
        let (nanos, frac) = match tat.at(self.limit) {
            (nanos, frac) if nanos >= now => (nanos, u128::from(frac)),
            _ => (now, 0),
        };
        // `cost × T` units: whole nanoseconds and a remainder below `limit`.
        let added = self.units(cost);
        let frac = frac + added % limit;
        let (carry, frac) = if frac >= limit { (1, frac - limit) } else { (0, frac) };
        let whole = u64::try_from(added / limit + carry).unwrap_or(u64::MAX);
        *tat = Tat {
            nanos: nanos.saturating_add(whole),
            frac: u32::try_from(frac).unwrap_or_default(),
            scale: self.limit,
        };
    }

    /// `cost` requests' intervals, in units.
    fn units(&self, cost: u32) -> u128 {
        u128::from(self.interval) * u128::from(cost)
    }

    /// Gives back the charge made at `charged_at`, as of `now`: the TAT moves back
    /// by the cost's intervals less the time since the charge, and not at all once
    /// they have passed or if the TAT no longer holds the charge (it is less than
    /// that past it: a bucket made again since) or was counted with another limit (a
    /// reload changed it since).
    ///
    /// Never more than undoing it would: the TAT without the request would be
    /// `max(TAT − T, m)`, `m` the TAT of the later charges alone, and `m` exceeds
    /// `TAT − T` by at most the time from the charge to the refund (each later
    /// charge came by then). So the bucket ends at most that much (the request's
    /// time upstream) short of exact, and exact when the refund comes at the
    /// instant of the charge; knowing `m` would take the history of the charges.
    pub(super) fn refund(&self, tat: &mut Tat, charged_at: Duration, now: Duration) {
        if tat.scale != self.limit {
            return;
        }
        let limit = u128::from(self.limit);
        let interval = self.units(self.upfront);
        let units = u128::from(tat.nanos) * limit + u128::from(tat.frac);
        let charged = u128::from(to_nanos(charged_at)) * limit;
        if interval == 0 || units.checked_sub(charged).is_none_or(|ahead| ahead < interval) {
            return;
        }
        let late = u128::from(to_nanos(now).saturating_sub(to_nanos(charged_at))) * limit;
        let units = units - interval.saturating_sub(late);
        // Below the old TAT, so both parts fit their fields.
        *tat = Tat {
            nanos: u64::try_from(units / limit).unwrap_or(u64::MAX),
            frac: u32::try_from(units % limit).unwrap_or_default(),
            scale: self.limit,
        };
    }

    /// How far the TAT is ahead of `now` (ns), in units: 0 for a full bucket.
    fn debt(&self, tat: &Tat, now: u64) -> u128 {
        let (nanos, frac) = tat.at(self.limit);
        // A TAT whole nanoseconds before now is behind it whatever its remainder.
        nanos.checked_sub(now).map_or(0, |ahead| u128::from(ahead) * u128::from(self.limit) + u128::from(frac))
    }

    /// `units` as a duration, rounded up to the nanosecond.
    fn duration(&self, units: u128) -> Duration {
        let nanos = quotient(units + u128::from(self.limit - 1), u64::from(self.limit));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// `dividend / divisor`, in 64 bits when the dividend fits (a debt of a few windows
/// does), as a 128-bit division costs several times more.
fn quotient(dividend: u128, divisor: u64) -> u128 {
    match u64::try_from(dividend) {
        Ok(dividend) => u128::from(dividend / divisor),
        Err(_) => dividend / u128::from(divisor),
    }
}
