use std::time::Duration;

use super::{Meter, NS, T0, millis, secs, spec};
use crate::Algorithm::FixedWindow;

/// 3 per minute.
fn window() -> Meter {
    Meter::new(spec(FixedWindow, 3, secs(60)))
}

#[test]
fn the_count_resets_at_the_exact_instant_the_window_turns() {
    let mut w = window();
    for left in (0..3).rev() {
        let o = w.hit(T0 + secs(59));
        assert!(o.admitted);
        assert_eq!((o.after.remaining, o.after.reset_after, o.used), (left, secs(1), 3 - left));
    }
    let over = w.hit(T0 + secs(59));
    assert!(!over.admitted);
    assert_eq!((over.retry_after, over.before.remaining, over.before.reset_after), (secs(1), 0, secs(1)));
    let early = w.hit(T0 + secs(60) - NS);
    assert!(!early.admitted);
    assert_eq!(early.retry_after, NS);
    let turned = w.hit(T0 + secs(60));
    assert!(turned.admitted);
    assert_eq!((turned.after.remaining, turned.after.reset_after), (2, secs(60)));
}

#[test]
fn up_to_twice_the_limit_passes_across_a_boundary() {
    let mut w = window();
    assert_eq!(w.admitted(T0 + secs(60) - millis(1), 10), 3);
    assert_eq!(w.admitted(T0 + secs(60), 10), 3);
}

#[test]
fn an_unused_window_has_nothing_to_reset() {
    let mut w = window();
    let fresh = w.peek(T0 + secs(30));
    assert_eq!((fresh.before.remaining, fresh.before.reset_after), (3, Duration::ZERO));
    assert_eq!(w.admitted(T0, 3), 3);
    let idle = w.peek(T0 + secs(3 * 86_400) + secs(30));
    assert_eq!((idle.before.remaining, idle.before.reset_after), (3, Duration::ZERO));
}

#[test]
fn a_clock_stepping_back_stays_in_the_latest_window() {
    let mut w = window();
    assert_eq!(w.admitted(T0 + secs(60), 3), 3);
    assert_eq!(w.admitted(T0 + secs(59), 3), 0, "the earlier window's quota is not handed out again");
}
