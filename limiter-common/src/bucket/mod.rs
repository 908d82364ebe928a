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
    admit_cost(tat_ns, now_ns, rate.interval_ns, rate.tolerance_ns)
}

/// GCRA for a charge of `cost` against `tolerance`, on any clock: [`admit`] for a
/// packet, [`admit_bytes`] for a frame's bytes.
#[inline(always)]
#[must_use]
const fn admit_cost(tat: u64, now: u64, cost: u64, tolerance: u64) -> Option<u64> {
    let start = if tat > now { tat } else { now };
    let next = start.saturating_add(cost);
    if next - now > tolerance { None } else { Some(next) }
}

/// Ticks of a byte bucket's clock per nanosecond: it keeps time in tenths of a
/// nanosecond, so that `u64` still spans 58 years of uptime while the refill time of
/// one byte (0.8 ns at 10 Gbit/s) is no longer a fraction of a tick.
pub const BYTE_TICKS_PER_NS: u64 = 10;
/// Fractional bits of [`ByteRate::byte_cost`]. With ticks of 0.1 ns and 16 more
/// bits, a rate that divides 10^10 bytes per second (every rate of the tests, 10
/// Gbit/s = 1.25 × 10^9 B/s included) costs an exact number of them per byte, and
/// any other is off by less than 2^-16 of a tick per byte. A frame's cost is rounded
/// down to the tick: less than 0.1 ns a frame in its favour.
pub const BYTE_COST_SHIFT: u32 = 16;
/// Lowest byte rate: below it `frame length × byte_cost` could leave `u64`.
pub const MIN_BYTES_PER_SECOND: u64 = 1_000;
/// Highest byte rate: 100 Gbit/s, a frame of 64 bytes still 51 ticks.
pub const MAX_BYTES_PER_SECOND: u64 = 12_500_000_000;
/// Longest frame a byte bucket charges in full (a multi-buffer frame is at most 17
/// pages); the bound keeps `length × byte_cost` within `u64`.
pub const MAX_FRAME_BYTES: u64 = 1 << 18;

/// A byte bucket's parameters, in ticks of [`BYTE_TICKS_PER_NS`]: a second GCRA
/// beside a source's packet bucket, charged the frame's length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteRate {
    /// Refill time of one byte in 2^-[`BYTE_COST_SHIFT`] ticks; 0: no byte budget.
    pub byte_cost: u64,
    /// Refill time of a full bucket, in ticks.
    pub tolerance: u64,
}

impl ByteRate {
    /// No byte budget: the program skips the byte bucket.
    pub const NONE: Self = Self { byte_cost: 0, tolerance: 0 };

    /// A bucket admitting `per_second` bytes a second on average and `burst` back to
    /// back; `per_second` within [`MIN_BYTES_PER_SECOND`]..=[`MAX_BYTES_PER_SECOND`]
    /// (the config checks it; outside, the rate is clamped).
    ///
    /// ```
    /// use limiter_common::bucket::ByteRate;
    /// // 5 MB/s: 200 ns (2 000 ticks) a byte; 1 500 bytes refill in 300 µs.
    /// let rate = ByteRate::new(5_000_000, 3_000);
    /// assert_eq!(rate.cost(1_500), 3_000_000);
    /// assert_eq!(rate.tolerance, 2 * rate.cost(1_500));
    /// ```
    #[must_use]
    pub const fn new(per_second: u64, burst: u64) -> Self {
        let per_second = if per_second < MIN_BYTES_PER_SECOND {
            MIN_BYTES_PER_SECOND
        } else if per_second > MAX_BYTES_PER_SECOND {
            MAX_BYTES_PER_SECOND
        } else {
            per_second
        };
        let byte_cost = ((NANOS_PER_SEC * BYTE_TICKS_PER_NS) << BYTE_COST_SHIFT) / per_second;
        // In two parts, so that a burst of hours neither wraps nor loses its low bits.
        let whole = (burst >> BYTE_COST_SHIFT).saturating_mul(byte_cost);
        let part = ((burst & ((1 << BYTE_COST_SHIFT) - 1)) * byte_cost) >> BYTE_COST_SHIFT;
        Self { byte_cost, tolerance: whole.saturating_add(part) }
    }

    /// Whether this is a byte budget at all.
    #[inline(always)]
    #[must_use]
    pub const fn is_set(&self) -> bool {
        self.byte_cost != 0
    }

    /// Ticks of refill `length` bytes cost (a longer frame than [`MAX_FRAME_BYTES`]
    /// costs that much).
    #[inline(always)]
    #[must_use]
    pub const fn cost(&self, length: u64) -> u64 {
        let length = if length > MAX_FRAME_BYTES { MAX_FRAME_BYTES } else { length };
        // Within u64: MAX_FRAME_BYTES × the cost of MIN_BYTES_PER_SECOND is 2^57.
        length.wrapping_mul(self.byte_cost) >> BYTE_COST_SHIFT
    }

    /// Bytes per second this rate was built from (rounded to its grid).
    #[must_use]
    pub const fn per_second(&self) -> u64 {
        ((NANOS_PER_SEC * BYTE_TICKS_PER_NS) << BYTE_COST_SHIFT) / self.byte_cost
    }

    /// Burst in bytes this rate was built from (rounded down).
    #[must_use]
    pub const fn burst(&self) -> u64 {
        // A byte of a rate above 10^10 B/s costs less than a tick.
        match self.tolerance.checked_div(self.cost(1)) {
            Some(burst) => burst,
            None => (self.tolerance << BYTE_COST_SHIFT) / self.byte_cost,
        }
    }

    /// [`coarse_clock_fits`] for a byte bucket: its burst holds at least
    /// [`COARSE_CLOCK_ERROR_DIVISOR`] ticks of refill.
    #[must_use]
    pub const fn coarse_clock_fits(&self, tick_ns: u64) -> bool {
        self.tolerance / BYTE_TICKS_PER_NS / COARSE_CLOCK_ERROR_DIVISOR >= tick_ns
    }
}

/// Decides a frame of `length` bytes at `now_ns` (the packet buckets' clock, in
/// nanoseconds) against a byte bucket whose TAT is `tat` (in ticks): the TAT to
/// store, or `None` if it is over the budget. A TAT of 0 is a full bucket; a frame
/// longer than the burst is never admitted.
#[inline(always)]
#[must_use]
pub const fn admit_bytes(tat: u64, now_ns: u64, length: u64, rate: ByteRate) -> Option<u64> {
    // Not `saturating_mul`: BPF has no overflow flag, and LLVM lowers it to a 128-bit
    // multiplication the kernel cannot call.
    let now = if now_ns > u64::MAX / BYTE_TICKS_PER_NS { u64::MAX } else { now_ns * BYTE_TICKS_PER_NS };
    admit_cost(tat, now, rate.cost(length), rate.tolerance)
}

/// What a frame did to a source's two buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    Admitted,
    /// The packet bucket was empty: nothing was charged.
    OverPackets,
    /// The byte bucket had too few bytes left for the frame.
    OverBytes,
}

/// Decides a frame against both of a source's buckets at once: the two TATs to
/// store if both admit it, else which refused. Neither is charged unless both
/// admit, so a frame the byte budget refuses spends no packet, and the reverse.
/// The kernel, which changes each TAT by its own compare-and-swap, runs the same
/// decisions in the same order (`limiter-ebpf/src/bucket.rs`).
#[inline(always)]
pub const fn admit_frame(
    tat_ns: u64,
    byte_tat: u64,
    now_ns: u64,
    rate: Rate,
    length: u64,
    bytes: ByteRate,
) -> Result<(u64, u64), Taken> {
    let Some(next) = admit(tat_ns, now_ns, rate) else {
        return Err(Taken::OverPackets);
    };
    if !bytes.is_set() {
        return Ok((next, byte_tat));
    }
    match admit_bytes(byte_tat, now_ns, length, bytes) {
        Some(byte_next) => Ok((next, byte_next)),
        None => Err(Taken::OverBytes),
    }
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
