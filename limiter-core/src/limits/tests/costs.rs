//! Costs: a request of `cost = N` takes N units in one step or nothing, and a
//! post-paid one is admitted while a unit is left, then charged into debt.

use std::{
    num::{NonZeroU32, NonZeroUsize},
    time::Duration,
};

use http::HeaderName;

use super::{Meter, NS, T0, millis, nz, secs, spec};
use crate::{
    Algorithm::{self, FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog, TokenBucket},
    Cost, CostFrom, CostSource, LimitSpec, SpecError,
    limits::{Bucket, Charge, Debit, MemoryStore},
    spec::LimitOptions,
};

/// Every algorithm a cost applies to.
const COSTED: [Algorithm; 4] = [TokenBucket, LeakyBucket, FixedWindow, SlidingWindowCounter];

fn costing(algorithm: Algorithm, limit: u32, window: Duration, cost: Cost) -> LimitSpec {
    LimitSpec { cost, ..spec(algorithm, limit, window) }
}

fn post_paid(max: u32) -> Cost {
    let source = CostSource::ResponseHeader { name: HeaderName::from_static("x-request-cost"), strip: true };
    Cost::From(CostFrom { source, max: nz(max) })
}

/// The example: `cost = 5` with `limit = 20` leaves 15, 10, 5, 0, then
/// refuses, taking nothing.
#[test]
fn a_cost_takes_its_units_at_once_and_nothing_when_refused() {
    for algorithm in COSTED {
        let mut b = Meter::new(costing(algorithm, 20, secs(60), Cost::Units(nz(5))));
        let left: Vec<u64> = (0..4).map(|_| b.hit(T0).after.remaining).collect();
        assert_eq!(left, [15, 10, 5, 0], "{algorithm}");
        let refused = b.hit(T0);
        assert!(!refused.admitted, "{algorithm}");
        assert_eq!(refused.before.remaining, 0, "{algorithm}");
        assert_eq!(b.peek(T0).before.remaining, 0, "{algorithm}: a refusal takes nothing");
    }
}

/// A cost of 5 with 3 units left is refused, and those 3 stay; the GCRA buckets admit
/// it once the 2 missing units have returned, to the nanosecond.
#[test]
fn a_cost_waits_for_all_of_its_units() {
    // One unit a second.
    let mut b = Meter::new(costing(TokenBucket, 10, secs(10), Cost::Units(nz(5))));
    assert!(b.hit(T0).admitted);
    assert_eq!(b.hit(T0 + secs(2)).after.remaining, 2, "5 − 5 + 2 returned");
    let refused = b.hit(T0 + secs(3));
    assert!(!refused.admitted);
    assert_eq!(refused.before.remaining, 3);
    assert_eq!(refused.retry_after, secs(2));
    assert!(!b.hit(T0 + secs(5) - NS).admitted);
    assert_eq!(b.hit(T0 + secs(5)).after.remaining, 0);
}

/// A refund of a costly request gives all of its units back.
#[test]
fn a_refund_gives_back_the_whole_cost() {
    for algorithm in COSTED {
        let mut b = Meter::new(costing(algorithm, 20, secs(60), Cost::Units(nz(5))));
        b.hit(T0);
        let charged = b.hit(T0);
        b.refund(&charged, T0);
        assert_eq!(b.peek(T0).before.remaining, 15, "{algorithm}");
    }
}

/// `x-request-cost: 7` against `limit = 20`: three pass, the third leaves a debt
/// of one unit, and the fourth is refused until that and one more have returned.
#[test]
fn a_post_paid_cost_is_charged_into_debt_and_repaid_before_the_next_admission() {
    // One unit a second: the debt's arithmetic to the nanosecond.
    let mut b = Meter::new(costing(TokenBucket, 20, secs(20), post_paid(1000)));
    for left in [20, 13, 6] {
        let admitted = b.hit(T0);
        assert!(admitted.admitted);
        assert_eq!((admitted.before.remaining, admitted.after.remaining), (left, left), "nothing taken at admission");
        b.debit(7, T0);
    }
    let refused = b.hit(T0);
    assert!(!refused.admitted, "20 − 21 = −1");
    assert_eq!(refused.before.remaining, 0);
    assert_eq!(refused.retry_after, secs(2), "the unit owed, then the one a request needs");
    assert_eq!(refused.before.reset_after, secs(21));
    assert!(!b.hit(T0 + secs(2) - NS).admitted);
    assert_eq!(b.hit(T0 + secs(2)).before.remaining, 1);
}

/// The windows count a debt past their limit: refused until the window (or, for
/// the counter, its weight) has let enough go.
#[test]
fn the_windows_carry_a_debt_to_their_end() {
    for algorithm in [FixedWindow, SlidingWindowCounter] {
        let mut b = Meter::new(costing(algorithm, 20, secs(60), post_paid(1000)));
        for _ in 0..3 {
            assert!(b.hit(T0).admitted, "{algorithm}");
            b.debit(7, T0 + millis(1));
        }
        let refused = b.hit(T0 + secs(30));
        assert!(!refused.admitted, "{algorithm}");
        assert_eq!(refused.before.remaining, 0, "{algorithm}");
    }
    let mut fixed = Meter::new(costing(FixedWindow, 20, secs(60), post_paid(1000)));
    fixed.hit(T0);
    fixed.debit(25, T0);
    assert_eq!(fixed.hit(T0).retry_after, secs(60));
    assert_eq!(fixed.hit(T0 + secs(60)).before.remaining, 20, "a new window owes nothing");
    // 21 counted in the previous window weigh 21 × (60 − e) / 60: one unit is left
    // once they weigh at most 19, 2 × 60 / 21 s into the next window.
    let mut counter = Meter::new(costing(SlidingWindowCounter, 20, secs(60), post_paid(1000)));
    counter.hit(T0);
    counter.debit(21, T0);
    let refused = counter.hit(T0 + secs(60));
    assert_eq!(refused.retry_after, Duration::from_nanos(120_000_000_000_u64.div_ceil(21)));
    assert!(!counter.hit(T0 + secs(60) + refused.retry_after - NS).admitted);
    assert!(counter.hit(T0 + secs(60) + refused.retry_after).admitted);
}

/// The log takes a charge of units as that many requests, up to its limit.
#[test]
fn the_log_takes_a_charge_up_to_its_limit() {
    let mut b = Meter::new(spec(SlidingWindowLog, 20, secs(60)));
    b.debit(15, T0);
    assert_eq!(b.peek(T0).before.remaining, 5);
    b.debit(15, T0 + secs(1));
    let full = b.peek(T0 + secs(1));
    assert_eq!((full.before.remaining, full.retry_after), (0, secs(59)), "20 logged, the oldest at T0");
    assert_eq!(b.peek(T0 + secs(60)).before.remaining, 15, "the 15 of T0 have left, 5 of T0 + 1 s stay");
}

/// A charge clamps to `max`, and an answer that gives no readable measure costs
/// `max`.
#[test]
fn a_post_paid_charge_is_clamped_to_its_max() {
    let Cost::From(from) = post_paid(1000) else { unreachable!("a post-paid cost") };
    assert_eq!(from.units(Some(7)), 7);
    assert_eq!(from.units(Some(5_000)), 1000);
    assert_eq!(from.units(Some(u64::MAX)), 1000);
    assert_eq!(from.units(None), 1000);
}

/// The store charges a debit to its bucket, and tracks one evicted since.
#[test]
fn the_store_charges_a_debit() {
    let spec = costing(FixedWindow, 20, secs(60), post_paid(1000));
    let policy = "debt".into();
    let store = MemoryStore::new(NonZeroUsize::new(64).expect("nonzero"));
    let bucket = Bucket { policy: &policy, key: "k", spec: &spec };
    assert!(store.apply(&[bucket], T0, Charge::AllOrNothing)[0].admitted);
    let charged = store.debit(&[Debit { bucket, units: 15 }], T0);
    assert_eq!(charged.first().copied().flatten().map(|quota| quota.remaining), Some(5));
    assert_eq!(store.apply(&[bucket], T0, Charge::Nothing)[0].before.remaining, 5);
    let fresh = Bucket { key: "never seen", ..bucket };
    store.debit(&[Debit { bucket: fresh, units: 30 }], T0);
    assert!(!store.apply(&[fresh], T0, Charge::AllOrNothing)[0].admitted);
}

#[test]
fn costs_the_algorithms_cannot_take_are_refused() {
    let build = |algorithm, cost, options: LimitOptions| {
        LimitSpec::new(algorithm, nz(20), secs(60), LimitOptions { cost, ..options })
    };
    let five = Cost::Units(nz(5));
    assert_eq!(build(SlidingWindowLog, five.clone(), LimitOptions::default()), Err(SpecError::CostWithLog));
    assert_eq!(build(SlidingWindowLog, post_paid(10), LimitOptions::default()), Err(SpecError::CostWithLog));
    let queued = LimitOptions { queue: NonZeroU32::new(4), ..LimitOptions::default() };
    assert_eq!(build(LeakyBucket, post_paid(10), queued.clone()), Err(SpecError::CostFromWithQueue));
    assert!(build(LeakyBucket, five, queued).is_ok(), "a shaper releases a costly request as it does five");
    assert_eq!(
        build(FixedWindow, Cost::Units(nz(21)), LimitOptions::default()),
        Err(SpecError::CostAboveCapacity { cost: 21, capacity: nz(20) })
    );
}

/// Shared out among agents, a bucket still holds one request's cost.
#[test]
fn a_share_holds_at_least_one_cost() {
    let spec = costing(FixedWindow, 20, secs(60), Cost::Units(nz(5)));
    assert_eq!(spec.share(10).limit.get(), 5);
    assert_eq!(spec.share(2).limit.get(), 10);
}
