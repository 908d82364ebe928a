//! Windows aligned to the epoch, shared by the windowed algorithms, or to the
//! calendar ([`crate::calendar`], fixed windows only).

use std::time::Duration;

use crate::LimitSpec;
use crate::calendar::Calendar;
use crate::clock::to_nanos;

/// A spec's window in nanoseconds; at least 1 so that it can divide.
pub(super) fn length(spec: &LimitSpec) -> u64 {
    to_nanos(spec.window).max(1)
}

/// The window `[index × length, (index + 1) × length)` containing an instant; on the
/// calendar, the period containing it, whose index is its start in seconds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    pub index: u64,
    pub length: u64,
    /// Time since the window began.
    pub elapsed: u64,
    /// When it began (ns).
    start: u64,
}

impl Window {
    /// The window containing `now`, but never one before `latest`, the latest window a
    /// bucket has counted in: a clock that steps back stays at that window's start.
    pub fn at(spec: &LimitSpec, latest: u64, now: Duration) -> Self {
        if let Some(calendar) = &spec.calendar {
            return Self::on_calendar(calendar, latest, now);
        }
        let length = length(spec);
        let now = to_nanos(now);
        let index = (now / length).max(latest);
        let start = index.saturating_mul(length);
        Self { index, length, elapsed: now.saturating_sub(start), start }
    }

    /// The period containing `now`, or the one starting at `latest` (seconds) if that
    /// is later.
    fn on_calendar(calendar: &Calendar, latest: u64, now: Duration) -> Self {
        let (mut start, mut end) = calendar.bounds(now);
        if start.as_secs() < latest {
            (start, end) = calendar.bounds(Duration::from_secs(latest));
        }
        let (start, end, now) = (to_nanos(start), to_nanos(end), to_nanos(now));
        Self {
            index: start / 1_000_000_000,
            length: end.saturating_sub(start).max(1),
            elapsed: now.saturating_sub(start),
            start,
        }
    }

    /// The index of the window containing `instant`.
    pub fn index_of(spec: &LimitSpec, instant: Duration) -> u64 {
        match &spec.calendar {
            Some(calendar) => calendar.bounds(instant).0.as_secs(),
            None => to_nanos(instant) / length(spec),
        }
    }

    /// The instant this window was taken at, moved to its start if it was earlier.
    pub fn instant(&self) -> Duration {
        Duration::from_nanos(self.start.saturating_add(self.elapsed))
    }

    /// Time until the end of the window `ahead` windows after this one (of this one's
    /// length: the sliding window counter's, never on the calendar).
    pub fn until_end(&self, ahead: u64) -> Duration {
        Duration::from_nanos(self.length.saturating_mul(ahead + 1).saturating_sub(self.elapsed))
    }
}
