use super::{Meter, NS, T0, millis, nz, secs, spec};
use crate::{Algorithm::TokenBucket, LimitSpec};

/// 10 per second (one token every 100 ms), burst 20.
fn bucket() -> Meter {
    Meter::new(LimitSpec { burst: Some(nz(20)), ..spec(TokenBucket, 10, secs(1)) })
}

#[test]
fn starts_full_and_spends_its_burst_back_to_back() {
    let mut b = bucket();
    for left in (0..20_u32).rev() {
        let o = b.hit(T0);
        assert!(o.admitted);
        assert_eq!(o.after.remaining, u64::from(left));
        assert_eq!(o.after.reset_after, millis(100) * (20 - left), "full again once every token is back");
        assert_eq!(o.used, u64::from(20 - left));
    }
    let o = b.hit(T0);
    assert!(!o.admitted);
    assert_eq!(o.retry_after, millis(100));
    assert_eq!((o.before.remaining, o.before.reset_after), (0, secs(2)));
    assert_eq!(o.after, o.before);
}

#[test]
fn admits_exactly_at_retry_after_and_not_a_nanosecond_before() {
    let mut b = bucket();
    assert_eq!(b.admitted(T0, 20), 20);
    let early = b.hit(T0 + millis(100) - NS);
    assert!(!early.admitted);
    assert_eq!(early.retry_after, NS);
    let on_time = b.hit(T0 + millis(100));
    assert!(on_time.admitted);
    assert_eq!(on_time.after.remaining, 0);
    assert_eq!(b.hit(T0 + millis(100)).retry_after, millis(100));
}

#[test]
fn a_rejected_request_takes_nothing() {
    let mut b = bucket();
    assert_eq!(b.admitted(T0, 1_000), 20);
    assert_eq!(b.admitted(T0 + millis(100), 1_000), 1);
    assert_eq!(b.admitted(T0 + millis(350), 1_000), 2);
}

#[test]
fn a_long_idle_refills_only_up_to_the_burst() {
    let mut b = bucket();
    assert_eq!(b.admitted(T0, 20), 20);
    let later = T0 + secs(3 * 86_400);
    let o = b.peek(later);
    assert_eq!((o.before.remaining, o.before.reset_after), (20, std::time::Duration::ZERO));
    assert_eq!(b.admitted(later, 100), 20);
}

#[test]
fn rates_that_are_not_whole_nanoseconds_do_not_drift() {
    // 3 per second: a token every 333 333 333.3 ns.
    let mut b = Meter::new(spec(TokenBucket, 3, secs(1)));
    let third = (0..3).map(|_| b.hit(T0)).last().expect("three");
    assert_eq!(third.after.reset_after, secs(1), "three tokens take exactly one second");
    let o = b.hit(T0);
    assert_eq!(o.retry_after, std::time::Duration::from_nanos(333_333_334), "rounded up to the nanosecond");
    assert!(!b.hit(T0 + std::time::Duration::from_nanos(333_333_333)).admitted);
    assert_eq!(b.admitted(T0 + secs(1), 10), 3, "full again after exactly one second");
}

#[test]
fn a_lower_limit_keeps_the_time_the_bucket_is_full() {
    let mut b = Meter::new(spec(TokenBucket, 10, secs(1)));
    assert_eq!(b.admitted(T0, 10), 10);
    b.spec.limit = nz(5);
    let o = b.peek(T0 + millis(500));
    assert_eq!(o.before.reset_after, millis(500), "empty until T0 + 1 s, as before the change");
    assert_eq!(o.before.remaining, 2, "half the refill time is half of the new 5");
    assert_eq!(b.admitted(T0 + secs(1), 10), 5);
}

/// The TAT as one `u128` of units of `1 / limit` ns, computed the long way: what the
/// store's 16-byte TAT must agree with to the nanosecond.
struct Reference {
    at: u128,
    scale: u32,
}

impl Reference {
    fn hit(&mut self, spec: &LimitSpec, now: std::time::Duration) -> (bool, u64, u128, u128) {
        let limit = u128::from(spec.limit.get());
        let interval = spec.window.as_nanos();
        let tolerance = interval * u128::from(spec.capacity().get());
        let scaled = if self.scale == 0 { 0 } else { (self.at * limit).div_ceil(u128::from(self.scale)) };
        let now = now.as_nanos() * limit;
        let debt = scaled.max(now) - now;
        let remaining = tolerance.saturating_sub(debt) / interval;
        let admitted = remaining > 0;
        let after = if admitted { debt + interval } else { debt + interval - tolerance };
        if admitted {
            (self.at, self.scale) = (scaled.max(now) + interval, spec.limit.get());
        }
        (admitted, remaining as u64, debt.div_ceil(limit), after.div_ceil(limit))
    }
}

#[test]
fn the_compact_tat_agrees_with_a_u128_of_units_through_limit_changes() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(3);
    let mut b = Meter::new(spec(TokenBucket, 7, millis(1300)));
    let mut reference = Reference { at: 0, scale: 0 };
    let mut now = T0;
    for step in 0..20_000 {
        if step % 500 == 0 {
            // Small limits for rejections, large ones for remainders of many units.
            b.spec.limit = nz(if rng.random() { rng.random_range(1..20) } else { rng.random_range(1..1_000_000) });
            b.spec.burst = Some(nz(rng.random_range(1..50)));
        }
        now += std::time::Duration::from_nanos(rng.random_range(0..100_000_000));
        let expected = reference.hit(&b.spec, now);
        let o = b.hit(now);
        let after = if o.admitted { o.after.reset_after } else { o.retry_after };
        let actual = (o.admitted, o.before.remaining, o.before.reset_after.as_nanos(), after.as_nanos());
        assert_eq!(actual, expected, "step {step}");
    }
}
