use std::vec::Vec;

use proptest::prelude::*;

use super::{
    COARSE_CLOCK_ERROR_DIVISOR, MAX_PER_SECOND, NANOS_PER_SEC, Rate, admit, coarse_clock_fits, tokens, wait_ns,
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
