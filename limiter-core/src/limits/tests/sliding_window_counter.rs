use std::time::Duration;

use super::{Meter, NS, T0, secs, spec};
use crate::Algorithm::SlidingWindowCounter;

/// 10 per minute; every window here starts at `T0 + k minutes`.
fn counter() -> Meter {
    Meter::new(spec(SlidingWindowCounter, 10, secs(60)))
}

#[test]
fn the_previous_window_weighs_in_as_it_slides_out() {
    let mut c = counter();
    assert_eq!(c.admitted(T0 + secs(50), 10), 10);
    // Next window, 6 s in: 10 × 54/60 = 9 carried, room for exactly one more.
    let over = c.hit(T0 + secs(50));
    assert_eq!((over.admitted, over.retry_after), (false, secs(16)));
    let turned = c.hit(T0 + secs(60));
    assert!(!turned.admitted, "a turning window frees nothing at once");
    assert_eq!(turned.retry_after, secs(6));
    let early = c.hit(T0 + secs(66) - NS);
    assert_eq!((early.admitted, early.retry_after), (false, NS));
    let on_time = c.hit(T0 + secs(66));
    assert!(on_time.admitted);
    assert_eq!((on_time.before.remaining, on_time.after.remaining), (1, 0));
    assert_eq!(on_time.after.reset_after, secs(54 + 60), "its count weighs until the next window ends");
}

#[test]
fn remaining_counts_down_one_per_request_with_the_carried_part_rounded_up() {
    let mut c = counter();
    assert_eq!(c.admitted(T0 + secs(59), 10), 10);
    assert_eq!(c.admitted(T0 + secs(66), 1), 1);
    // 30 s in: 10 × 30/60 = 5 carried, 1 counted: 4 left, one by one.
    let remaining: Vec<_> = (0..5).map(|_| c.hit(T0 + secs(90))).map(|o| (o.admitted, o.after.remaining)).collect();
    assert_eq!(remaining, [(true, 3), (true, 2), (true, 1), (true, 0), (false, 0)]);
    // Now 5 counted: room once the carried part is at most 4, at 36 s in.
    assert_eq!(c.hit(T0 + secs(90)).retry_after, secs(6));
    // 40 s in: 10 × 20/60 = 3.33 carried, counted as 4: 1 left (the estimate 8.33 + 1 fits).
    let o = c.hit(T0 + secs(100));
    assert_eq!((o.admitted, o.before.remaining, o.after.remaining, o.used), (true, 1, 0, 10));
    assert!(!c.hit(T0 + secs(100)).admitted, "9.33 + 1 does not fit");
}

#[test]
fn a_full_previous_window_can_push_the_retry_into_the_window_after() {
    let mut c = Meter::new(spec(SlidingWindowCounter, 1, secs(60)));
    assert!(c.hit(T0 + secs(10)).admitted);
    let over = c.hit(T0 + secs(20));
    // Next window: the carried 1 × (60 − e)/60 stays above 0 until it ends.
    assert_eq!(over.retry_after, secs(100));
    assert!(!c.hit(T0 + secs(120) - NS).admitted);
    assert!(c.hit(T0 + secs(120)).admitted);
}

#[test]
fn a_long_idle_forgets_both_windows() {
    let mut c = counter();
    assert_eq!(c.admitted(T0, 10), 10);
    let fresh = c.peek(T0 + secs(86_400 * 3));
    assert_eq!((fresh.before.remaining, fresh.before.reset_after), (10, Duration::ZERO));
    let next = c.peek(T0 + secs(60));
    assert_eq!((next.before.remaining, next.before.reset_after), (0, secs(60)), "empty at the next window's end");
}
