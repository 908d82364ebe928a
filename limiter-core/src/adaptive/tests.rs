//! The controller against a model upstream on a fake clock: its latency is `UNLOADED`
//! up to `KNEE` requests in flight and grows in proportion beyond, the shape of a
//! server whose workers are all busy.

use std::time::Duration;

use super::{Algorithm, Controller, PROBE_EVERY, Sample, Settings, SettingsError};
use crate::{Clock as _, FakeClock};

const UNLOADED: Duration = Duration::from_millis(20);
const KNEE: u32 = 10;
const TICK: Duration = Duration::from_millis(10);

fn latency_at(in_flight: u32) -> Duration {
    UNLOADED * in_flight.max(KNEE) / KNEE
}

fn settings(algorithm: Algorithm) -> Settings {
    Settings::new(algorithm, 8, 1024, 64, 1.5).expect("settings")
}

/// `clients` in a closed loop for `run`: each tick, the requests admitted (as many as
/// the clients, at most the limit) finish their share of a request, each reported at
/// the latency its depth gives. The latencies of the admitted requests seen.
fn drive(controller: &mut Controller, clock: &FakeClock, clients: u32, run: Duration) -> Vec<Duration> {
    let mut seen = Vec::new();
    let mut owed = 0.0;
    let end = clock.now() + run;
    while clock.now() < end {
        clock.advance(TICK);
        let in_flight = clients.min(controller.limit());
        let latency = latency_at(in_flight);
        // Little's law: in flight / latency requests finish per unit of time.
        owed += f64::from(in_flight) * TICK.as_secs_f64() / latency.as_secs_f64();
        while owed >= 1.0 {
            owed -= 1.0;
            controller.record(clock.now(), Sample { latency, in_flight, lost: false });
            seen.push(latency);
        }
    }
    seen
}

fn p99(latencies: &mut [Duration]) -> Duration {
    latencies.sort();
    latencies[latencies.len() * 99 / 100]
}

#[test]
fn settings_refuse_unordered_bounds_and_a_tolerance_below_one() {
    assert_eq!(Settings::new(Algorithm::Aimd, 0, 10, 5, 1.5), Err(SettingsError::NoMinimum));
    assert_eq!(
        Settings::new(Algorithm::Aimd, 8, 1024, 2048, 1.5),
        Err(SettingsError::Unordered { min: 8, initial: 2048, max: 1024 })
    );
    assert_eq!(Settings::new(Algorithm::Gradient2, 8, 1024, 64, 0.9), Err(SettingsError::Tolerance(0.9)));
    assert!(matches!(Settings::new(Algorithm::Gradient2, 8, 1024, 64, f64::NAN), Err(SettingsError::Tolerance(_))));
}

/// 200 clients against an upstream whose knee is at 10: from 64 (above the knee, so
/// that no latency seen is the unloaded one) the limit probes at 8, learns the
/// baseline, and settles where the latency stays within 3 × the unloaded one.
#[test]
fn an_overloaded_upstream_brings_the_limit_down_to_its_knee_and_keeps_the_latency_low() {
    for algorithm in [Algorithm::Gradient2, Algorithm::Aimd] {
        let clock = FakeClock::default();
        let mut controller = Controller::new(settings(algorithm), clock.now());
        drive(&mut controller, &clock, 200, Duration::from_secs(10));
        let limit = controller.limit();
        assert!((8..=40).contains(&limit), "{algorithm:?}: settled at {limit}");
        let baseline = controller.baseline().expect("a baseline learnt by probing");
        assert!(baseline.abs_diff(UNLOADED) < Duration::from_millis(1), "{algorithm:?}: baseline {baseline:?}");
        let mut settled = drive(&mut controller, &clock, 200, Duration::from_secs(5));
        let p99 = p99(&mut settled);
        assert!(p99 < UNLOADED * 3, "{algorithm:?}: p99 {p99:?} at limit {}", controller.limit());
    }
}

/// An upstream that never slows down lets the limit grow to its bound and no further.
#[test]
fn a_flat_upstream_lets_the_limit_grow_to_max_limit_and_no_further() {
    for algorithm in [Algorithm::Gradient2, Algorithm::Aimd] {
        let clock = FakeClock::default();
        let mut controller = Controller::new(Settings::new(algorithm, 8, 100, 16, 1.5).expect("settings"), clock.now());
        let flat = Sample { latency: UNLOADED, in_flight: 4, lost: false };
        controller.record(clock.now(), flat);
        let mut limits = Vec::new();
        for _ in 0..2_000 {
            clock.advance(TICK * 10);
            let in_flight = controller.limit();
            limits.push(controller.record(clock.now(), Sample { in_flight, ..flat }));
            // An unloaded request now and then keeps the baseline fresh, as light
            // traffic beside the load would.
            controller.record(clock.now(), flat);
        }
        assert!(limits.windows(2).all(|pair| pair[0] <= pair[1]), "{algorithm:?}: only growth");
        assert_eq!(limits.last(), Some(&100), "{algorithm:?}");
    }
}

/// Failures alone (the upstream answering 5xx fast) bring the limit down, never
/// below `min_limit`.
#[test]
fn losses_shrink_the_limit_to_min_limit_and_no_lower() {
    for algorithm in [Algorithm::Gradient2, Algorithm::Aimd] {
        let clock = FakeClock::default();
        let mut controller = Controller::new(settings(algorithm), clock.now());
        controller.record(clock.now(), Sample { latency: UNLOADED, in_flight: 1, lost: false });
        let mut limits = vec![controller.limit()];
        for _ in 0..500 {
            clock.advance(TICK * 10);
            let lost = Sample { latency: UNLOADED, in_flight: controller.limit(), lost: true };
            limits.push(controller.record(clock.now(), lost));
            controller.record(clock.now(), Sample { latency: UNLOADED, in_flight: 1, lost: false });
        }
        assert!(limits.windows(2).all(|pair| pair[0] >= pair[1]), "{algorithm:?}: only shrinking: {limits:?}");
        assert_eq!(limits.last(), Some(&8), "{algorithm:?}");
        assert!(limits[1] < 64, "{algorithm:?}: the first lossy interval shrinks");
    }
}

/// Once the overload is over (a few clients, the upstream unloaded again), the limit
/// climbs back to where it started; it does not grow past it on a load that does
/// not use it.
#[test]
fn the_limit_climbs_back_once_the_load_is_gone_and_stays_where_it_is_not_used() {
    for algorithm in [Algorithm::Gradient2, Algorithm::Aimd] {
        let clock = FakeClock::default();
        let mut controller = Controller::new(settings(algorithm), clock.now());
        drive(&mut controller, &clock, 200, Duration::from_secs(10));
        assert!(controller.limit() <= 40, "{algorithm:?}: shed first");
        drive(&mut controller, &clock, 5, Duration::from_secs(20));
        assert_eq!(controller.limit(), 64, "{algorithm:?}: back at initial_limit");
        drive(&mut controller, &clock, 5, Duration::from_secs(20));
        assert_eq!(controller.limit(), 64, "{algorithm:?}: 5 in flight say nothing of more");
    }
}

/// Without an unloaded request for `PROBE_EVERY` the limit drops to `min_limit` for
/// as long as it takes to see one, then goes back to where it was.
#[test]
fn a_probe_drops_to_min_limit_until_an_unloaded_request_and_resumes() {
    let clock = FakeClock::default();
    let mut controller = Controller::new(settings(Algorithm::Gradient2), clock.now());
    let unloaded = Sample { latency: UNLOADED, in_flight: 2, lost: false };
    controller.record(clock.now(), unloaded);
    clock.advance(TICK * 10);
    controller.record(clock.now(), unloaded);
    assert_eq!((controller.limit(), controller.probing()), (64, false));
    // Deep and fast: the latency allows growth, but nothing unloaded is seen.
    let deep = Sample { latency: UNLOADED, in_flight: 60, lost: false };
    let mut before_probe = controller.limit();
    while !controller.probing() {
        before_probe = controller.limit();
        clock.advance(TICK * 10);
        controller.record(clock.now(), deep);
    }
    assert!(clock.now() >= PROBE_EVERY, "probed at {:?}", clock.now());
    assert_eq!(controller.limit(), 8);
    clock.advance(TICK * 10);
    controller.record(clock.now(), unloaded);
    assert_eq!((controller.limit(), controller.probing()), (before_probe, false));
}
