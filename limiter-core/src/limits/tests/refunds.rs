//! Refunds: a charge given back undoes the request, exactly for the windows and the
//! log, and for the GCRA buckets exactly when given back at once and otherwise never
//! more than the request took, short of exact by at most the time since the charge.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{
    Meter, T0, millis, nz,
    properties::{all, gap},
    secs, spec,
};
use crate::{
    Algorithm::{FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog, TokenBucket},
    LimitSpec,
    limits::{Outcome, bucket},
};

#[test]
fn a_refund_at_the_charge_instant_gives_the_whole_unit_back_for_every_algorithm() {
    for (spec, capacity) in all() {
        let mut meter = Meter::new(spec.clone());
        let t = T0 + secs(100);
        let burst = usize::try_from(capacity).expect("small");
        let charged: Vec<Outcome> = (0..burst).map(|_| meter.hit(t)).collect();
        assert!(charged.iter().all(|o| o.admitted) && !meter.peek(t).admitted, "{spec:?}");
        for outcome in &charged {
            meter.refund(outcome, t);
        }
        let fresh = Meter::new(spec.clone()).peek(t);
        assert_eq!(meter.peek(t), fresh, "{spec:?}: as if none had come");
        assert_eq!(meter.admitted(t, burst + 5), burst, "{spec:?}");
    }
}

#[test]
fn a_bucket_that_never_held_the_charge_gives_nothing_back() {
    for (spec, _) in all() {
        let mut meter = Meter::new(spec.clone());
        let charged = meter.hit(T0);
        let mut fresh = Meter::new(spec.clone());
        fresh.refund(&charged, T0);
        assert_eq!(fresh.state, Meter::new(spec.clone()).state, "{spec:?}: a new bucket stays new");
        meter.refund(&charged, T0);
        let refunded = meter.state.clone();
        meter.refund(&charged, T0);
        let again = meter.peek(T0);
        assert_eq!(meter.state, refunded, "{spec:?}: a second refund finds nothing to give");
        assert_eq!(again.before.remaining, fresh.peek(T0).before.remaining, "{spec:?}: never past full");
    }
}

#[test]
fn a_token_given_back_late_comes_back_short_by_the_time_since_the_charge() {
    // 10 a second (a token every 100 ms), burst 3.
    let mut b = Meter::new(LimitSpec { burst: Some(nz(3)), ..spec(TokenBucket, 10, secs(1)) });
    let first = b.hit(T0);
    assert_eq!(b.admitted(T0, 5), 2);
    b.refund(&first, T0 + millis(40));
    // Had it not come, the two others would leave the bucket full at T0 + 200 ms; the
    // refund gives back 60 of the token's 100 ms.
    let o = b.peek(T0 + millis(40));
    assert_eq!((o.before.remaining, o.before.reset_after), (1, millis(200)));
    assert_eq!(b.admitted(T0 + millis(40), 5), 1);
}

#[test]
fn a_token_given_back_after_the_bucket_refilled_gives_nothing() {
    // 1 a second, burst 1: the first request's token is back by T0 + 1 s, and a
    // second request takes it.
    let mut b = Meter::new(spec(TokenBucket, 1, secs(1)));
    let first = b.hit(T0);
    assert!(b.hit(T0 + secs(1)).admitted);
    b.refund(&first, T0 + millis(1500));
    assert!(!b.peek(T0 + millis(1500)).admitted, "the second request's charge stands");
    assert!(b.peek(T0 + secs(2)).admitted);
}

#[test]
fn a_token_bucket_whose_limit_changed_since_the_charge_gives_nothing_back() {
    let mut b = Meter::new(spec(TokenBucket, 10, secs(1)));
    let first = b.hit(T0);
    let old = b.spec.clone();
    b.spec.limit = nz(5);
    assert!(b.hit(T0).admitted, "counted with the new limit from here");
    let before = b.state.clone();
    bucket::refund(&old, &mut b.state, first.charged_at.expect("charged"), T0);
    assert_eq!(b.state, before);
}

#[test]
fn a_window_gives_back_while_it_counts_and_not_after() {
    let mut w = Meter::new(spec(FixedWindow, 3, secs(60)));
    let first = w.hit(T0 + secs(10));
    assert_eq!(w.admitted(T0 + secs(10), 5), 2);
    w.refund(&first, T0 + secs(50));
    assert_eq!(w.admitted(T0 + secs(50), 5), 1, "one back in the window it was counted in");
    let last = w.hit(T0 + secs(59));
    assert!(!last.admitted);
    let turned = w.hit(T0 + secs(60));
    w.refund(&Outcome { charged_at: Some(T0 + secs(59)), ..turned }, T0 + secs(61));
    assert_eq!(w.admitted(T0 + secs(61), 5), 2, "the last window's refund takes nothing from this one");
}

#[test]
fn a_sliding_counter_gives_back_from_the_previous_window_while_it_weighs() {
    let mut c = Meter::new(spec(SlidingWindowCounter, 5, secs(10)));
    let charged: Vec<Outcome> = (0..4).map(|_| c.hit(T0 + secs(5))).collect();
    c.refund(&charged[0], T0 + secs(6));
    assert_eq!(c.peek(T0 + secs(6)).before.remaining, 2, "one back in the current window");
    // At the turn the previous window weighs in full: 3 of it, and 2 new.
    assert_eq!(c.admitted(T0 + secs(10), 5), 2);
    c.refund(&charged[1], T0 + secs(10));
    assert_eq!(c.admitted(T0 + secs(10), 5), 1, "one back in the previous window");
    // Two windows on, the first window weighs nothing: its refund gives nothing.
    assert_eq!(c.admitted(T0 + secs(20), 10), 2, "3 new weigh in full");
    c.refund(&charged[2], T0 + secs(20));
    assert!(!c.peek(T0 + secs(20)).admitted);
}

#[test]
fn a_log_gives_back_its_entry_and_what_a_stepped_back_clock_logged() {
    // 3 per 10 seconds.
    let mut l = Meter::new(spec(SlidingWindowLog, 3, secs(10)));
    let [_, middle, _] = [0, 1, 2].map(|s| l.hit(T0 + secs(s)));
    l.refund(&middle, T0 + secs(5));
    let o = l.hit(T0 + secs(5));
    assert!(o.admitted);
    let full = l.hit(T0 + secs(5));
    assert_eq!((full.admitted, full.retry_after), (false, secs(5)), "T0's entry leaves first, as before");
    // Logged at T0 + 5 s, the latest time, with the clock a second behind.
    let mut stepped = Meter::new(spec(SlidingWindowLog, 3, secs(10)));
    assert!(stepped.hit(T0 + secs(5)).admitted);
    let behind = stepped.hit(T0 + secs(4));
    assert_eq!(behind.charged_at, Some(T0 + secs(5)));
    stepped.refund(&behind, T0 + secs(4));
    assert_eq!(stepped.peek(T0 + secs(4)).before.remaining, 2);
}

/// A request of a random schedule, and whether its charge was given back.
struct Charged {
    at: Duration,
    refunded: bool,
}

/// Long random schedules of requests and refunds against the same schedule without
/// the refunded requests, replayed on a fresh bucket. The windows and the log
/// answer exactly as it does; a GCRA bucket is never fuller, and full again at most
/// the refunds' total lateness after it. With every refund given at once, all agree.
#[test]
fn a_refunded_bucket_answers_as_if_the_refunded_requests_never_came() {
    for at_once in [false, true] {
        for (spec, _) in all() {
            let mut rng = StdRng::seed_from_u64(7);
            let mut meter = Meter::new(spec.clone());
            let mut charged: Vec<(Outcome, Charged)> = Vec::new();
            let (mut now, mut late, mut refunds) = (T0, Duration::ZERO, 0);
            for _ in 0..800 {
                now += gap(&mut rng);
                let o = meter.hit(now);
                if o.admitted {
                    charged.push((o, Charged { at: now, refunded: false }));
                }
                let outstanding: Vec<usize> = (0..charged.len()).filter(|&i| !charged[i].1.refunded).collect();
                if !outstanding.is_empty() && rng.random_range(0..3) == 0 {
                    // One of the latest few: older ones have mostly left their window.
                    let i = outstanding[outstanding.len() - 1 - rng.random_range(0..outstanding.len().min(3))];
                    let (outcome, request) = &mut charged[i];
                    if !at_once || request.at == now {
                        meter.refund(outcome, now);
                        request.refunded = true;
                        late += now - request.at;
                        refunds += 1;
                    }
                }
                let mut kept = Meter::new(spec.clone());
                for request in charged.iter().map(|(_, r)| r).filter(|r| !r.refunded) {
                    bucket::charge(&kept.spec, &mut kept.state, request.at);
                }
                let (actual, exact) = (meter.peek(now), kept.peek(now));
                if at_once || !matches!(spec.algorithm, TokenBucket | LeakyBucket) {
                    assert_eq!(actual, exact, "{spec:?} at {now:?}");
                } else {
                    assert!(actual.before.remaining <= exact.before.remaining, "{spec:?} at {now:?}: never fuller");
                    let (reset, exact_reset) = (actual.before.reset_after, exact.before.reset_after);
                    assert!((exact_reset..=exact_reset + late).contains(&reset), "{spec:?} at {now:?}");
                }
            }
            assert!(refunds > 50, "{spec:?}: the schedule must give back ({refunds})");
        }
    }
}
