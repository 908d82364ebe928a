//! Windows aligned to the epoch, shared by the windowed algorithms.

use std::time::Duration;

use crate::LimitSpec;
use crate::clock::to_nanos;

/// A spec's window in nanoseconds; at least 1 so that it can divide.
pub(super) fn length(spec: &LimitSpec) -> u64 {
    to_nanos(spec.window).max(1)
}

/// The window `[index × length, (index + 1) × length)` containing an instant.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    pub index: u64,
    pub length: u64,
    /// Time since the window began.
    pub elapsed: u64,
}

impl Window {
    /// The window containing `now`, but never one before `latest`, the latest window a
    /// bucket has counted in: a clock that steps back stays at that window's start.
    pub fn at(spec: &LimitSpec, latest: u64, now: Duration) -> Self {
        let length = length(spec);
        let now = to_nanos(now);
        let index = (now / length).max(latest);
        Self { index, length, elapsed: now.saturating_sub(index.saturating_mul(length)) }
    }

    /// The index of the window containing `instant`.
    pub fn index_of(spec: &LimitSpec, instant: Duration) -> u64 {
        to_nanos(instant) / length(spec)
    }

    /// The instant this window was taken at, moved to its start if it was earlier.
    pub fn instant(&self) -> Duration {
        Duration::from_nanos(self.index.saturating_mul(self.length).saturating_add(self.elapsed))
    }

    /// Time until the end of the window `ahead` windows after this one.
    pub fn until_end(&self, ahead: u64) -> Duration {
        Duration::from_nanos(self.length.saturating_mul(ahead + 1).saturating_sub(self.elapsed))
    }
}
