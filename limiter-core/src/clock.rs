//! Time as the limiter sees it: a [`Duration`] since the UNIX epoch.
//!
//! Windows are aligned to the epoch (a one-minute window turns on the minute), so
//! the clock is wall time rather than a monotonic instant. Every algorithm treats a
//! clock that steps back as standing still, so an NTP correction can delay a window
//! but never hand out extra quota.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// Time since the UNIX epoch.
    fn now(&self) -> Duration;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        // A clock before 1970 is a broken host; reading it as the epoch keeps limits on.
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
    }
}

/// A clock that moves only when told; clones share one time.
///
/// Nanosecond resolution, up to the year 2554 (a `u64` of nanoseconds), so that an
/// `advance` is one atomic add.
#[derive(Clone, Debug, Default)]
pub struct FakeClock(Arc<AtomicU64>);

impl FakeClock {
    /// A clock reading `now`.
    #[must_use]
    pub fn new(now: Duration) -> Self {
        Self(Arc::new(AtomicU64::new(to_nanos(now))))
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(to_nanos(by), Ordering::SeqCst);
    }

    /// Sets the time, backwards too.
    pub fn set(&self, now: Duration) {
        self.0.store(to_nanos(now), Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }
}

/// Nanoseconds of `d`, saturating (a `u64` lasts 584 years).
#[must_use]
pub(crate) fn to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
