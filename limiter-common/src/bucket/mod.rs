//! Per-source token bucket, kept as a GCRA "theoretical arrival time" (TAT).
//!
//! A bucket of `burst` packets refilling at `per_second` is one number: the instant,
//! in nanoseconds, at which the bucket would be full again. A packet is admitted when
//! charging it leaves the TAT no more than `tolerance` ahead of now. A single `u64`
//! state is what makes the kernel's per-source update exact across CPUs: it is read,
//! decided with [`admit`] and written back with one compare-and-swap (the kernel
//! refuses `bpf_spin_lock` in LRU maps).
//!
//! Equivalence with a classic token bucket: `credit = tolerance - max(0, tat - now)`
//! nanoseconds of refill are available, and a packet costs `interval` of them. The
//! host tests check that against such a bucket (see `tests.rs`).

/// Nanoseconds per second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Highest rate the kernel layer can express: one packet per nanosecond.
pub const MAX_PER_SECOND: u32 = 1_000_000_000;

/// A bucket's parameters, in nanoseconds of refill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rate {
    /// Refill time of one packet: `1e9 / per_second`, at least 1.
    pub interval_ns: u64,
    /// Refill time of a full bucket: `interval_ns * burst`.
    pub tolerance_ns: u64,
}

impl Rate {
    /// A bucket admitting `per_second` packets per second on average and up to
    /// `burst` back to back (a burst of 0 admits nothing, as does a rate of 0).
    ///
    /// ```
    /// let rate = limiter_common::bucket::Rate::new(1_000, 20);
    /// assert_eq!(rate.interval_ns, 1_000_000);
    /// assert_eq!(rate.tolerance_ns, 20_000_000);
    /// ```
    #[must_use]
    pub const fn new(per_second: u32, burst: u32) -> Self {
        if per_second == 0 {
            return Self { interval_ns: u64::MAX, tolerance_ns: 0 };
        }
        let interval_ns = NANOS_PER_SEC / per_second as u64;
        let interval_ns = if interval_ns == 0 { 1 } else { interval_ns };
        Self { interval_ns, tolerance_ns: interval_ns.saturating_mul(burst as u64) }
    }

    /// Packets per second this rate was built from (rounded to the nanosecond grid).
    #[must_use]
    pub const fn per_second(&self) -> u64 {
        NANOS_PER_SEC / self.interval_ns
    }

    /// Burst size this rate was built from.
    #[must_use]
    pub const fn burst(&self) -> u64 {
        self.tolerance_ns / self.interval_ns
    }
}

/// Decides one packet at `now_ns` against a bucket whose TAT is `tat_ns`.
///
/// Returns the TAT to store if the packet is admitted, `None` if it is over the
/// limit (a refused packet is not charged). A TAT of 0 is a full bucket, so new
/// sources start with their whole burst. Arithmetic saturates: neither a long idle
/// nor a huge burst can wrap.
#[inline(always)]
#[must_use]
pub const fn admit(tat_ns: u64, now_ns: u64, rate: Rate) -> Option<u64> {
    let start = if tat_ns > now_ns { tat_ns } else { now_ns };
    let next = start.saturating_add(rate.interval_ns);
    if next - now_ns > rate.tolerance_ns { None } else { Some(next) }
}

/// A bucket may run on the tick-grained clock when its error stays within
/// 1 / `COARSE_CLOCK_ERROR_DIVISOR` of its burst.
pub const COARSE_CLOCK_ERROR_DIVISOR: u64 = 100;

/// Whether a bucket of `rate` may read a clock that lags the true time by up to
/// `tick_ns` (`bpf_ktime_get_coarse_ns`: the time of the last tick, so `tick_ns` is
/// one jiffy, `clock_getres(CLOCK_MONOTONIC_COARSE)`).
///
/// The bound: GCRA on any monotonic clock `c` admits at most
/// `burst + (c(t2) - c(t1)) / interval` packets over `[t1, t2]`, and with
/// `t - tick < c(t) <= t` that is `burst + (t2 - t1) / interval + tick / interval`:
/// at most `ceil(rate × tick)` packets more than the precise clock allows, and, the
/// refill being at most a tick late, as many fewer. This holds when
/// `rate × tick <= burst / COARSE_CLOCK_ERROR_DIVISOR`, i.e.
/// `tolerance >= COARSE_CLOCK_ERROR_DIVISOR × tick`.
///
/// ```
/// use limiter_common::bucket::{Rate, coarse_clock_fits};
/// // 100 pps, burst 100: 0.4 packets per 4 ms tick, 0.4 % of the burst.
/// assert!(coarse_clock_fits(Rate::new(100, 100), 4_000_000));
/// // 1 000 pps, burst 10: 4 packets per tick, 40 % of the burst.
/// assert!(!coarse_clock_fits(Rate::new(1_000, 10), 4_000_000));
/// ```
#[inline(always)]
#[must_use]
pub const fn coarse_clock_fits(rate: Rate, tick_ns: u64) -> bool {
    rate.tolerance_ns / COARSE_CLOCK_ERROR_DIVISOR >= tick_ns
}

/// Whole packets the bucket would admit back to back at `now_ns`.
#[inline(always)]
#[must_use]
pub const fn tokens(tat_ns: u64, now_ns: u64, rate: Rate) -> u64 {
    let debt = tat_ns.saturating_sub(now_ns);
    rate.tolerance_ns.saturating_sub(debt) / rate.interval_ns
}

/// Nanoseconds until the bucket admits a packet again (0 if it would now).
#[inline(always)]
#[must_use]
pub const fn wait_ns(tat_ns: u64, now_ns: u64, rate: Rate) -> u64 {
    let debt = tat_ns.saturating_sub(now_ns);
    debt.saturating_add(rate.interval_ns).saturating_sub(rate.tolerance_ns)
}

#[cfg(test)]
mod tests;
