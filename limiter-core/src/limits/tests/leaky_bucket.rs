use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{Meter, NS, T0, millis, nz, secs, spec};
use crate::{
    Algorithm::{LeakyBucket, TokenBucket},
    LimitSpec,
};

#[test]
fn a_meter_admits_while_the_level_plus_one_fits() {
    // 5 per second: one unit drains every 200 ms.
    let mut b = Meter::new(spec(LeakyBucket, 5, secs(1)));
    for left in (0..5).rev() {
        let o = b.hit(T0);
        assert!(o.admitted);
        assert_eq!((o.after.remaining, o.wait), (left, Duration::ZERO));
    }
    let full = b.hit(T0);
    assert!(!full.admitted);
    assert_eq!((full.retry_after, full.before.reset_after), (millis(200), secs(1)));
    assert!(!b.hit(T0 + millis(200) - NS).admitted);
    assert!(b.hit(T0 + millis(200)).admitted);
    let empty = b.peek(T0 + millis(1_200));
    assert_eq!((empty.before.remaining, empty.before.reset_after), (5, Duration::ZERO));
}

#[test]
fn a_meter_admits_what_a_token_bucket_of_burst_limit_admits() {
    let mut meter = Meter::new(spec(LeakyBucket, 7, secs(2)));
    let mut tokens = Meter::new(LimitSpec { burst: Some(nz(7)), ..spec(TokenBucket, 7, secs(2)) });
    let mut rng = StdRng::seed_from_u64(4);
    let mut now = T0;
    for _ in 0..5_000 {
        now += Duration::from_nanos(rng.random_range(0..400_000_000));
        assert_eq!(meter.hit(now), tokens.hit(now));
    }
}

#[test]
fn a_shaper_spaces_departures_by_the_emission_interval() {
    // 5 per second, so one leaves every 200 ms; two may wait behind the one leaving.
    let mut b = Meter::new(LimitSpec { queue: Some(nz(2)), ..spec(LeakyBucket, 5, secs(1)) });
    let waits: Vec<_> = (0..3).map(|_| b.hit(T0)).map(|o| (o.admitted, o.wait, o.after.remaining)).collect();
    assert_eq!(waits, [(true, Duration::ZERO, 2), (true, millis(200), 1), (true, millis(400), 0)]);
    let over = b.hit(T0);
    assert!(!over.admitted);
    assert_eq!((over.retry_after, over.wait), (millis(200), Duration::ZERO));
    assert!(!b.hit(T0 + millis(200) - NS).admitted);
    let next = b.hit(T0 + millis(200));
    assert!(next.admitted);
    assert_eq!(next.wait, millis(400), "leaves at T0 + 600 ms, after the third");
    assert_eq!(next.after.reset_after, millis(600), "queue empty at T0 + 800 ms");
}

#[test]
fn a_shaper_forwards_a_stream_at_the_rate_without_waiting() {
    let mut b = Meter::new(LimitSpec { queue: Some(nz(1)), ..spec(LeakyBucket, 10, secs(1)) });
    for i in 0..1_000 {
        let o = b.hit(T0 + millis(100) * i);
        assert!(o.admitted);
        assert_eq!(o.wait, Duration::ZERO);
    }
    assert_eq!(b.hit(T0 + secs(86_400)).wait, Duration::ZERO, "after a long idle");
}
