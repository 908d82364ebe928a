use std::vec::Vec;

use proptest::prelude::*;

use super::{
    BYTE_TICKS_PER_NS, ByteRate, COARSE_CLOCK_ERROR_DIVISOR, MAX_BYTES_PER_SECOND, MAX_PER_SECOND,
    MIN_BYTES_PER_SECOND, NANOS_PER_SEC, Rate, Taken, admit, admit_bytes, admit_frame, coarse_clock_fits, tokens,
    wait_ns,
};

/// The textbook bucket: credit in nanoseconds of refill, capped at a full bucket,
/// one interval per packet. GCRA must agree with it packet for packet.
struct Reference {
    credit: u64,
    last: u64,
    rate: Rate,
}

impl Reference {
    fn new(rate: Rate, now: u64) -> Self {
        Self { credit: rate.tolerance_ns, last: now, rate }
    }

    fn admit(&mut self, now: u64) -> bool {
        let elapsed = now - self.last;
        self.last = now;
        self.credit = self.credit.saturating_add(elapsed).min(self.rate.tolerance_ns);
        if self.credit >= self.rate.interval_ns {
            self.credit -= self.rate.interval_ns;
            true
        } else {
            false
        }
    }
}

fn run(rate: Rate, start: u64, gaps: &[u64]) -> u64 {
    let mut tat = 0;
    let mut now = start;
    let mut admitted = 0;
    for gap in gaps {
        now += gap;
        if let Some(next) = admit(tat, now, rate) {
            tat = next;
            admitted += 1;
        }
    }
    admitted
}

#[test]
fn full_bucket_admits_exactly_the_burst_then_refuses() {
    let rate = Rate::new(10, 5);
    assert_eq!(run(rate, 1_000, &[0; 8]), 5);
}

#[test]
fn refills_one_packet_per_interval() {
    let rate = Rate::new(10, 2);
    let mut tat = 0;
    let now = 5 * NANOS_PER_SEC;
    for _ in 0..2 {
        tat = admit(tat, now, rate).expect("burst");
    }
    assert_eq!(admit(tat, now, rate), None);
    assert_eq!(wait_ns(tat, now, rate), 100_000_000);
    assert_eq!(admit(tat, now + 99_999_999, rate), None);
    assert!(admit(tat, now + 100_000_000, rate).is_some());
}

#[test]
fn zero_elapsed_time_never_refills() {
    let rate = Rate::new(MAX_PER_SECOND, 3);
    assert_eq!(rate.interval_ns, 1);
    assert_eq!(run(rate, 7, &[0; 10]), 3);
}

#[test]
fn long_idle_refills_to_burst_and_no_more() {
    let rate = Rate::new(1, 4);
    let mut tat = 0;
    for _ in 0..4 {
        tat = admit(tat, 10, rate).expect("burst");
    }
    // A century of uptime: far beyond any real idle, far from u64 saturation.
    let much_later = 10 + 100 * 365 * 24 * 3600 * NANOS_PER_SEC;
    assert_eq!(tokens(tat, much_later, rate), 4);
    assert_eq!(run(rate, much_later, &[0; 6]), 4);
}

#[test]
fn huge_burst_saturates_instead_of_wrapping() {
    let rate = Rate::new(1, u32::MAX);
    assert_eq!(rate.tolerance_ns, NANOS_PER_SEC * u64::from(u32::MAX));
    assert_eq!(tokens(0, 0, rate), u64::from(u32::MAX));
    let near_end = u64::MAX - 1;
    let tat = admit(near_end, near_end, rate).expect("room left");
    assert_eq!(tat, u64::MAX);
    assert_eq!(admit(u64::MAX, near_end, rate).map(|t| t >= near_end), Some(true));
}

#[test]
fn zero_rate_or_burst_admits_nothing() {
    assert_eq!(run(Rate::new(0, 10), 0, &[1_000_000_000; 3]), 0);
    assert_eq!(run(Rate::new(10, 0), 0, &[1_000_000_000; 3]), 0);
}

#[test]
fn rate_change_keeps_the_debt() {
    // A source that exhausted a fast bucket is not refilled by switching to a slower one.
    let fast = Rate::new(1_000, 1_000);
    let mut tat = 0;
    for _ in 0..1_000 {
        tat = admit(tat, 0, fast).expect("burst");
    }
    let slow = Rate::new(10, 10);
    assert_eq!(tokens(tat, 0, slow), 0);
    assert_eq!(admit(tat, 0, slow), None);
}

#[test]
fn round_trips_rate_and_burst() {
    let rate = Rate::new(10_000, 20_000);
    assert_eq!((rate.per_second(), rate.burst()), (10_000, 20_000));
}

/// A bucket, a tick, and arrivals: each one's instant (true time) and what a
/// tick-grained clock shows then, the last tick at or before it (ticks falling at a
/// random phase).
fn coarse_cases(arrivals: usize) -> impl Strategy<Value = (Rate, u64, Vec<(u64, u64)>)> {
    let gaps = proptest::collection::vec(prop_oneof![Just(0u64), 0u64..100_000, 0u64..20_000_000], 1..arrivals);
    (1u32..1_000_000, 1u32..10_000, 1u64..20_000_000, 0u64..20_000_000, gaps).prop_map(
        |(per_second, burst, tick, phase, gaps)| {
            let mut now = 1 << 40;
            let arrivals = gaps
                .iter()
                .map(|gap| {
                    now += gap;
                    (now, now - (now + phase % tick) % tick)
                })
                .collect();
            (Rate::new(per_second, burst), tick, arrivals)
        },
    )
}

/// Which arrivals a bucket admits when each reads the clock `clock` picks.
fn admitted(rate: Rate, arrivals: &[(u64, u64)], clock: impl Fn(&(u64, u64)) -> u64) -> Vec<bool> {
    let mut tat = 0;
    arrivals.iter().map(|arrival| admit(tat, clock(arrival), rate).inspect(|next| tat = *next).is_some()).collect()
}

#[test]
fn coarse_clock_fits_at_one_percent_of_the_burst() {
    let tick = 4_000_000;
    // 400 ms of refill is exactly 100 ticks: 4 packets of refill per tick, 1 % of 400.
    assert!(coarse_clock_fits(Rate::new(1_000, 400), tick));
    assert!(!coarse_clock_fits(Rate::new(1_000, 399), tick));
    assert!(!coarse_clock_fits(Rate::new(0, 400), tick));
}

proptest! {
    /// Over any run of arrivals, a bucket on the tick-grained clock admits at most
    /// `ceil(tick / interval)` packets more than the precise bound, and when
    /// `coarse_clock_fits` that is at most 1 % of the burst (rounded up).
    #[test]
    fn coarse_clock_admits_at_most_one_tick_of_refill_more((rate, tick, arrivals) in coarse_cases(150)) {
        let burst = rate.burst();
        let coarse = admitted(rate, &arrivals, |a| a.1);
        for first in 0..arrivals.len() {
            let mut count = 0;
            for last in first..arrivals.len() {
                count += u64::from(coarse[last]);
                let span = arrivals[last].0 - arrivals[first].0;
                prop_assert!(count <= burst + (span + tick) / rate.interval_ns);
            }
        }
        if coarse_clock_fits(rate, tick) {
            prop_assert!(tick.div_ceil(rate.interval_ns) <= burst.div_ceil(COARSE_CLOCK_ERROR_DIVISOR));
        }
    }

    /// And it refuses nothing that the precise clock admits with one tick less of
    /// tolerance: a sender within the rate and `burst - ceil(rate × tick)` is never
    /// refused for the clock's sake (checked up to the first arrival the smaller
    /// bucket refuses, after which the two hold different debts).
    #[test]
    fn coarse_clock_admits_what_a_tick_smaller_bucket_admits((rate, tick, arrivals) in coarse_cases(300)) {
        let smaller = Rate { tolerance_ns: rate.tolerance_ns.saturating_sub(tick), ..rate };
        let precise = admitted(smaller, &arrivals, |a| a.0);
        let coarse = admitted(rate, &arrivals, |a| a.1);
        let conforming = precise.iter().take_while(|admitted| **admitted).count();
        prop_assert!(coarse[..conforming].iter().all(|admitted| *admitted));
    }

    #[test]
    fn agrees_with_reference_bucket(
        per_second in 1u32..=MAX_PER_SECOND,
        burst in 0u32..=u32::MAX,
        start in 0u64..(u64::MAX / 2),
        gaps in proptest::collection::vec(
            prop_oneof![Just(0u64), 0u64..1_000, 0u64..10_000_000_000, 0u64..(u64::MAX / 1024)],
            1..200,
        ),
    ) {
        let rate = Rate::new(per_second, burst);
        let mut reference = Reference::new(rate, start);
        let mut tat = 0;
        let mut now = start;
        for gap in gaps {
            now = now.saturating_add(gap);
            let ours = admit(tat, now, rate);
            prop_assert_eq!(ours.is_some(), reference.admit(now), "at {} tat {}", now, tat);
            if let Some(next) = ours {
                tat = next;
            }
            prop_assert_eq!(tokens(tat, now, rate), reference.credit / rate.interval_ns);
        }
    }

    #[test]
    fn never_admits_more_than_burst_plus_refill(
        per_second in 1u32..100_000,
        burst in 1u32..10_000,
        gaps in proptest::collection::vec(0u64..2_000_000, 1..2_000),
    ) {
        let rate = Rate::new(per_second, burst);
        let elapsed: u64 = gaps.iter().sum();
        let admitted = run(rate, 0, &gaps);
        prop_assert!(admitted <= u64::from(burst) + elapsed / rate.interval_ns);
    }
}

/// The textbook byte bucket, in bytes: credit refills at the rate, capped at the
/// burst, and a frame passes if its length is left. Exact in u128: the credit is
/// kept in bytes × 10^10 (bytes × ticks per second), so any rate divides it.
struct ByteReference {
    /// Bytes × 10^10.
    credit: u128,
    last_ns: u64,
    per_second: u128,
    burst: u128,
}

const TICKS_PER_SEC: u128 = (NANOS_PER_SEC * BYTE_TICKS_PER_NS) as u128;

impl ByteReference {
    fn new(per_second: u64, burst: u64, now_ns: u64) -> Self {
        let burst = u128::from(burst) * TICKS_PER_SEC;
        Self { credit: burst, last_ns: now_ns, per_second: u128::from(per_second), burst }
    }

    fn admit(&mut self, now_ns: u64, length: u64) -> bool {
        let elapsed = u128::from(now_ns - self.last_ns) * u128::from(BYTE_TICKS_PER_NS);
        self.last_ns = now_ns;
        self.credit = (self.credit + elapsed * self.per_second).min(self.burst);
        let cost = u128::from(length) * TICKS_PER_SEC;
        if self.credit >= cost {
            self.credit -= cost;
            true
        } else {
            false
        }
    }
}

/// A byte rate that divides 10^10 bytes per second, so that a byte costs an exact
/// number of ticks: 10^10 / (2^a × 5^b).
fn exact_byte_rate() -> impl Strategy<Value = u64> {
    (0u32..=10, 0u32..=10)
        .prop_map(|(a, b)| 10_000_000_000 / (2u64.pow(a) * 5u64.pow(b)))
        .prop_filter("within the config's bounds", |rate| (MIN_BYTES_PER_SECOND..=MAX_BYTES_PER_SECOND).contains(rate))
}

fn frame_length() -> impl Strategy<Value = u64> {
    prop_oneof![Just(64u64), Just(1_514), 60u64..9_018]
}

#[test]
fn ten_gigabits_cost_exact_ticks() {
    // 1.25 × 10^9 B/s: 0.8 ns a byte, which a nanosecond grid cannot hold.
    let rate = ByteRate::new(1_250_000_000, 15_140);
    assert_eq!((rate.cost(1_514), rate.cost(64), rate.cost(1)), (12_112, 512, 8));
    assert_eq!((rate.per_second(), rate.burst(), rate.tolerance), (1_250_000_000, 15_140, 121_120));
    let top = ByteRate::new(MAX_BYTES_PER_SECOND, 1_514);
    assert_eq!((top.cost(1), top.cost(64)), (0, 51), "100 Gbit/s: 0.8 ticks a byte, rounded per frame");
}

#[test]
fn a_frame_longer_than_the_burst_never_passes_and_a_burst_sized_one_does() {
    let rate = ByteRate::new(5_000_000, 3_000);
    assert_eq!(admit_bytes(0, 1 << 40, 3_001, rate), None);
    let tat = admit_bytes(0, 1 << 40, 3_000, rate).expect("the whole burst");
    assert_eq!(admit_bytes(tat, 1 << 40, 1, rate), None);
    // 200 ns a byte: one byte of refill later, one byte passes.
    assert!(admit_bytes(tat, (1 << 40) + 200, 1, rate).is_some());
    assert_eq!(admit_bytes(tat, (1 << 40) + 199, 1, rate), None);
}

/// The figure: 1 500-byte frames at 10 000/s against 5 MB/s admit 3 333 a
/// second, and the burst's frames on top.
#[test]
fn full_frames_at_ten_thousand_a_second_against_five_megabytes_admit_a_third() {
    let bytes = ByteRate::new(5_000_000, 15_000);
    let packets = Rate::new(100_000, 100_000);
    let (mut tat, mut byte_tat, mut admitted) = (0, 0, 0);
    let start = 1u64 << 40;
    for i in 0..10_000u64 {
        let now = start + i * 100_000;
        if let Ok((next, byte_next)) = admit_frame(tat, byte_tat, now, packets, 1_500, bytes) {
            (tat, byte_tat, admitted) = (next, byte_next, admitted + 1);
        }
    }
    // 10 frames of burst, then one every 300 µs over the 999.9 ms after the first.
    assert_eq!(admitted, 10 + 999_900 / 300);
}

#[test]
fn byte_buckets_fit_the_coarse_clock_at_a_hundred_ticks_of_burst() {
    let tick = 4_000_000;
    // 5 MB/s: 400 ms of refill is 2 000 000 bytes.
    assert!(ByteRate::new(5_000_000, 2_000_000).coarse_clock_fits(tick));
    assert!(!ByteRate::new(5_000_000, 1_999_999).coarse_clock_fits(tick));
}

proptest! {
    /// For a rate whose byte costs a whole number of ticks, the byte GCRA agrees
    /// frame for frame with the textbook bucket counted in bytes.
    #[test]
    fn byte_gcra_agrees_with_reference_bucket(
        per_second in exact_byte_rate(),
        burst in 1_514u64..10_000_000,
        start in 0u64..(u64::MAX / 64),
        frames in proptest::collection::vec(
            (prop_oneof![Just(0u64), 0u64..1_000, 0u64..10_000_000, 0u64..10_000_000_000], frame_length()),
            1..300,
        ),
    ) {
        let rate = ByteRate::new(per_second, burst);
        let mut reference = ByteReference::new(per_second, burst, start);
        let mut tat = 0;
        let mut now = start;
        for (gap, length) in frames {
            now += gap;
            let ours = admit_bytes(tat, now, length, rate);
            prop_assert_eq!(ours.is_some(), reference.admit(now, length), "at {} tat {} length {}", now, tat, length);
            if let Some(next) = ours {
                tat = next;
            }
        }
    }

    /// At any rate of the config's range, the bytes admitted over any run are within
    /// the burst and the refill, give or take the rounding: each frame's cost down to
    /// a tick (under 0.1 ns, at most 1.25 bytes at 100 Gbit/s) and a byte's cost to
    /// 2^-16 of a tick (under 1 / 52 428 of it at that rate).
    #[test]
    fn byte_gcra_never_admits_more_than_burst_plus_refill(
        per_second in MIN_BYTES_PER_SECOND..=MAX_BYTES_PER_SECOND,
        burst in 1_514u64..100_000_000,
        frames in proptest::collection::vec((0u64..2_000_000, frame_length()), 1..2_000),
    ) {
        let rate = ByteRate::new(per_second, burst);
        let mut tat = 0;
        let (mut now, mut admitted, mut count) = (1u64 << 40, 0u128, 0u128);
        let start = now;
        for (gap, length) in frames {
            now += gap;
            if let Some(next) = admit_bytes(tat, now, length, rate) {
                tat = next;
                admitted += u128::from(length);
                count += 1;
            }
        }
        let refill = u128::from(now - start) * u128::from(per_second) / u128::from(NANOS_PER_SEC);
        let rounding = 2 * count + admitted / 52_428 + 1;
        let allowed = u128::from(burst) + refill + rounding;
        prop_assert!(admitted <= allowed, "admitted {} bytes, allowed {}", admitted, allowed);
    }

    /// A frame one bucket refuses is charged to neither: replaying only the frames
    /// `admit_frame` admitted through each bucket alone admits every one of them and
    /// leaves each TAT where the pair left it.
    #[test]
    fn a_frame_refused_by_one_bucket_costs_the_other_nothing(
        per_second in 1u32..100_000,
        burst in 1u32..100,
        bytes_per_second in MIN_BYTES_PER_SECOND..100_000_000,
        byte_burst in 1_514u64..100_000,
        frames in proptest::collection::vec((0u64..1_000_000, frame_length()), 1..500),
    ) {
        let (rate, bytes) = (Rate::new(per_second, burst), ByteRate::new(bytes_per_second, byte_burst));
        let (mut tat, mut byte_tat, mut now) = (0, 0, 1u64 << 40);
        let mut admitted = Vec::new();
        let mut refused = [0; 2];
        for (gap, length) in frames {
            now += gap;
            match admit_frame(tat, byte_tat, now, rate, length, bytes) {
                Ok((next, byte_next)) => {
                    (tat, byte_tat) = (next, byte_next);
                    admitted.push((now, length));
                }
                Err(Taken::OverPackets) => refused[0] += 1,
                Err(Taken::OverBytes) => refused[1] += 1,
                Err(Taken::Admitted) => prop_assert!(false, "a refusal is never Admitted"),
            }
        }
        let (mut packets_alone, mut bytes_alone) = (0, 0);
        for (now, length) in &admitted {
            packets_alone = admit(packets_alone, *now, rate).expect("admitted by the pair, so by the packets");
            bytes_alone = admit_bytes(bytes_alone, *now, *length, bytes).expect("and by the bytes");
        }
        prop_assert_eq!((packets_alone, bytes_alone), (tat, byte_tat), "refused {:?}", refused);
    }
}
