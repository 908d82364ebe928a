//! What every algorithm promises, over long random sequences.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{Meter, NS, T0, millis, nz, secs, spec};
use crate::{Algorithm, LimitSpec};

/// Every algorithm, with its capacity (what `remaining` is when the bucket is full).
pub(super) fn all() -> Vec<(LimitSpec, u64)> {
    vec![
        (spec(Algorithm::TokenBucket, 7, secs(3)), 7),
        (LimitSpec { burst: Some(nz(12)), ..spec(Algorithm::TokenBucket, 3, secs(1)) }, 12),
        (spec(Algorithm::LeakyBucket, 6, secs(2)), 6),
        (LimitSpec { queue: Some(nz(4)), ..spec(Algorithm::LeakyBucket, 3, secs(1)) }, 5),
        (spec(Algorithm::FixedWindow, 5, secs(2)), 5),
        (spec(Algorithm::SlidingWindowLog, 5, secs(2)), 5),
        (spec(Algorithm::SlidingWindowCounter, 7, secs(3)), 7),
    ]
}

/// Gaps from none (bursts) to several windows (idle).
pub(super) fn gap(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..10) {
        0..=3 => Duration::ZERO,
        4..=8 => Duration::from_nanos(rng.random_range(0..800_000_000)),
        _ => millis(rng.random_range(0..10_000)),
    }
}

#[test]
fn remaining_is_what_would_be_admitted_now_and_counts_down_by_one() {
    for (spec, _) in all() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut meter = Meter::new(spec.clone());
        let (mut now, mut last_after) = (T0, None);
        for _ in 0..3_000 {
            now += gap(&mut rng);
            let o = meter.hit(now);
            assert_eq!(o.admitted, o.before.remaining >= 1, "{spec:?}");
            if o.admitted {
                assert_eq!(o.after.remaining, o.before.remaining - 1, "{spec:?}");
                let burst = (0..o.after.remaining).filter(|_| meter.hit(now).admitted).count() as u64;
                assert_eq!(burst, o.after.remaining, "{spec:?}: exactly `remaining` more fit now");
                assert!(!meter.peek(now).admitted, "{spec:?}");
            } else {
                assert_eq!((o.after, o.retry_after.is_zero()), (o.before, false), "{spec:?}");
            }
            if let Some(before) = last_after {
                assert!(o.before.remaining >= before, "{spec:?}: quota only returns between requests");
            }
            last_after = Some(meter.peek(now).before.remaining);
        }
    }
}

#[test]
fn retry_after_is_the_exact_instant_of_admission() {
    for (spec, _) in all() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut meter = Meter::new(spec.clone());
        let mut now = T0;
        let mut rejections = 0;
        for _ in 0..5_000 {
            now += gap(&mut rng);
            let o = meter.hit(now);
            if !o.admitted {
                rejections += 1;
                assert!(meter.peek(now + o.retry_after).admitted, "{spec:?} at {now:?}");
                assert!(!meter.peek(now + o.retry_after - NS).admitted, "{spec:?} at {now:?}");
            }
        }
        assert!(rejections > 100, "{spec:?}: the sequence must test rejections");
    }
}

#[test]
fn reset_after_is_the_exact_instant_capacity_is_back_in_full() {
    for (spec, capacity) in all() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut meter = Meter::new(spec.clone());
        let mut now = T0;
        for _ in 0..3_000 {
            now += gap(&mut rng);
            let o = meter.hit(now);
            let reset = if o.admitted { o.after.reset_after } else { o.before.reset_after };
            let full = meter.peek(now + reset).before;
            assert_eq!((full.remaining, full.reset_after), (capacity, Duration::ZERO), "{spec:?} at {now:?}");
            if !reset.is_zero() {
                assert!(!meter.peek(now + reset - NS).before.reset_after.is_zero(), "{spec:?} at {now:?}");
            }
        }
    }
}

#[test]
fn a_shaper_never_holds_more_than_its_queue() {
    let spec = LimitSpec { queue: Some(nz(4)), ..spec(Algorithm::LeakyBucket, 3, secs(1)) };
    let interval = Duration::from_nanos(333_333_334);
    let mut rng = StdRng::seed_from_u64(4);
    let mut meter = Meter::new(spec);
    let mut now = T0;
    let mut departures = Vec::new();
    for _ in 0..3_000 {
        now += gap(&mut rng);
        let o = meter.hit(now);
        if o.admitted {
            assert!(o.wait <= interval * 4);
            departures.push(now + o.wait);
        }
    }
    for pair in departures.windows(2) {
        assert!(pair[1] - pair[0] >= interval - NS, "departures one interval apart");
    }
}

/// A clock that steps (a VM restored, NTP correcting a clock that ran fast, or one
/// that slept for years): a bucket emptied at `t` hands out nothing at any earlier
/// instant, whatever the algorithm, admits again at the very instant it would have
/// without the step, and a step years ahead gives one full bucket, no more.
#[test]
fn a_clock_stepping_back_hands_out_no_quota_again_and_one_far_ahead_no_more_than_full() {
    for (spec, capacity) in all() {
        let mut meter = Meter::new(spec.clone());
        let t = T0 + secs(100);
        let burst = usize::try_from(capacity).expect("small") + 5;
        assert_eq!(meter.admitted(t, burst) as u64, capacity, "{spec:?}");
        let retry = meter.peek(t).retry_after;
        for back in [NS, millis(1), secs(1), secs(30), secs(3_600), secs(86_400)] {
            assert_eq!(meter.admitted(t - back, 3), 0, "{spec:?}: {back:?} back");
        }
        assert!(!meter.peek(t + retry - NS).admitted, "{spec:?}");
        assert!(meter.peek(t + retry).admitted, "{spec:?}");
        let far = t + secs(10 * 365 * 86_400);
        assert_eq!(meter.admitted(far, burst) as u64, capacity, "{spec:?}: years ahead");
    }
}
