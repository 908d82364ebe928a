use std::time::Duration;

use super::{Meter, NS, T0, millis, secs, spec};
use crate::{Algorithm::SlidingWindowLog, limits::bucket::State};

/// 3 per 10 seconds.
fn log() -> Meter {
    Meter::new(spec(SlidingWindowLog, 3, secs(10)))
}

#[test]
fn at_most_limit_in_any_window_each_entry_leaving_after_exactly_one_window() {
    let mut l = log();
    for (i, left) in [2, 1, 0].into_iter().enumerate() {
        let o = l.hit(T0 + secs(i as u64));
        assert!(o.admitted);
        assert_eq!((o.after.remaining, o.after.reset_after), (left, secs(10)));
    }
    let over = l.hit(T0 + secs(5));
    assert!(!over.admitted);
    assert_eq!(over.retry_after, secs(5), "the entry of T0 leaves at T0 + 10 s");
    assert_eq!(over.before.reset_after, secs(7), "the entry of T0 + 2 s leaves at T0 + 12 s");
    let early = l.hit(T0 + secs(10) - NS);
    assert_eq!((early.admitted, early.retry_after), (false, NS));
    let on_time = l.hit(T0 + secs(10));
    assert_eq!((on_time.admitted, on_time.after.remaining), (true, 0));
    assert_eq!(l.hit(T0 + secs(10)).retry_after, secs(1), "then the entry of T0 + 1 s");
}

#[test]
fn memory_stays_within_the_limit() {
    let mut l = Meter::new(spec(SlidingWindowLog, 5, secs(1)));
    for i in 0..10_000 {
        l.hit(T0 + millis(7) * i);
        let State::SlidingWindowLog(state) = &l.state else { panic!("a log") };
        assert!(state.logged() <= 5);
    }
}

#[test]
fn a_long_idle_empties_the_log() {
    let mut l = log();
    assert_eq!(l.admitted(T0, 10), 3);
    let idle = l.peek(T0 + secs(2 * 86_400));
    assert_eq!((idle.before.remaining, idle.before.reset_after), (3, Duration::ZERO));
    assert_eq!(l.admitted(T0 + secs(2 * 86_400), 10), 3);
}
