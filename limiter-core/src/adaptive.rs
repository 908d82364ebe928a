//! An adaptive concurrency limit: how many requests the upstream may have in flight,
//! moved between an operator's bounds by what the upstream's own latency and failures
//! say, so that a slow upstream is protected before its clients time out.
//!
//! Netflix's concurrency-limits (gradient2, AIMD) are the references; what differs is
//! where the baseline comes from. Both compare the latency now with an unloaded
//! latency, and an upstream whose latency grows with its load shows none while it is
//! overloaded: a limit that started above the knee would take the loaded latency for
//! the baseline and never come down. Here the baseline is learnt only from requests
//! admitted while at most `min_limit` were in flight (what the operator says the
//! upstream always takes), and when none has been seen for [`PROBE_EVERY`] the limit
//! drops to `min_limit` until one has: a probe, as BBR probes its round-trip time.
//!
//! Time comes from the caller (`now`), so that the maths runs on a fake clock.

use std::time::Duration;

/// Samples are folded into one update of the limit per interval of at least this.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// With no unloaded sample for this long, the limit probes for one.
pub const PROBE_EVERY: Duration = Duration::from_secs(10);

/// A probe that has seen no unloaded request for this long gives up (requests longer
/// than this, say) and keeps the baseline it had.
const PROBE_AT_MOST: Duration = Duration::from_secs(1);

/// gradient2: the share of each update's target taken in, against oscillation.
const SMOOTHING: f64 = 0.2;

/// gradient2: the lowest factor one update's target takes the limit down by.
const MIN_GRADIENT: f64 = 0.5;

/// AIMD: what a lossy interval multiplies the limit by.
const BACKOFF: f64 = 0.9;

/// The baseline's weight of each new unloaded interval's latency.
const BASELINE_WEIGHT: f64 = 0.2;

/// How the limit moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Towards `limit × gradient + √limit`, the gradient being the baseline over the
    /// latency now (times the tolerance), between 0.5 and 1; smoothed.
    Gradient2,
    /// Up by one per interval while the limit is in use, down by a tenth on a loss or a
    /// latency past the tolerance.
    Aimd,
}

impl Algorithm {
    /// The name the config uses.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Gradient2 => "gradient2",
            Self::Aimd => "aimd",
        }
    }
}

/// The bounds and the tolerance of a limit, checked against each other.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    algorithm: Algorithm,
    min_limit: u32,
    max_limit: u32,
    initial_limit: u32,
    tolerance: f64,
}

/// Why settings cannot be built; the messages speak the config's key names.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SettingsError {
    #[error("min_limit must be at least 1")]
    NoMinimum,
    #[error("min_limit = {min} ≤ initial_limit = {initial} ≤ max_limit = {max} does not hold")]
    Unordered { min: u32, initial: u32, max: u32 },
    #[error("tolerance = {0} must be a number of at least 1")]
    Tolerance(f64),
}

impl Settings {
    pub fn new(
        algorithm: Algorithm,
        min_limit: u32,
        max_limit: u32,
        initial_limit: u32,
        tolerance: f64,
    ) -> Result<Self, SettingsError> {
        if min_limit == 0 {
            return Err(SettingsError::NoMinimum);
        }
        if !(min_limit <= initial_limit && initial_limit <= max_limit) {
            return Err(SettingsError::Unordered { min: min_limit, initial: initial_limit, max: max_limit });
        }
        if !(tolerance >= 1.0 && tolerance.is_finite()) {
            return Err(SettingsError::Tolerance(tolerance));
        }
        Ok(Self { algorithm, min_limit, max_limit, initial_limit, tolerance })
    }

    #[must_use]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    #[must_use]
    pub fn min_limit(&self) -> u32 {
        self.min_limit
    }

    #[must_use]
    pub fn max_limit(&self) -> u32 {
        self.max_limit
    }

    #[must_use]
    pub fn initial_limit(&self) -> u32 {
        self.initial_limit
    }

    #[must_use]
    pub fn tolerance(&self) -> f64 {
        self.tolerance
    }

    fn clamp(&self, limit: f64) -> f64 {
        limit.clamp(f64::from(self.min_limit), f64::from(self.max_limit))
    }
}

/// One request the upstream finished (or failed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// From forwarding to the response head (or the failure).
    pub latency: Duration,
    /// Requests in flight when this one was forwarded, itself included.
    pub in_flight: u32,
    /// An answer `losses` names (a 5xx, a timeout).
    pub lost: bool,
}

/// The samples of the interval being gathered.
#[derive(Clone, Copy, Debug)]
struct Interval {
    start: Duration,
    samples: u32,
    latency_sum: f64,
    unloaded_samples: u32,
    unloaded_latency_sum: f64,
    most_in_flight: u32,
    lost: bool,
}

impl Interval {
    fn new(start: Duration) -> Self {
        Self {
            start,
            samples: 0,
            latency_sum: 0.0,
            unloaded_samples: 0,
            unloaded_latency_sum: 0.0,
            most_in_flight: 0,
            lost: false,
        }
    }
}

/// A probe under way: the limit it will go back to, and since when.
#[derive(Clone, Copy, Debug)]
struct Probe {
    since: Duration,
    resume_at: f64,
}

/// The limit and what it has learnt.
#[derive(Clone, Debug)]
pub struct Controller {
    settings: Settings,
    limit: f64,
    /// Mean latency, in seconds, of requests admitted at most `min_limit` deep.
    baseline: Option<f64>,
    /// Mean latency, in seconds, of the last interval.
    latency: Option<f64>,
    last_unloaded: Duration,
    interval: Interval,
    probe: Option<Probe>,
}

impl Controller {
    /// At `initial_limit`, nothing learnt yet, at `now`.
    #[must_use]
    pub fn new(settings: Settings, now: Duration) -> Self {
        Self {
            settings,
            limit: f64::from(settings.initial_limit),
            baseline: None,
            latency: None,
            last_unloaded: now,
            interval: Interval::new(now),
            probe: None,
        }
    }

    /// Requests the upstream may have in flight now.
    #[must_use]
    pub fn limit(&self) -> u32 {
        // The clamp keeps the float within u32's bounds.
        self.limit.floor() as u32
    }

    /// The mean latency of the last interval.
    #[must_use]
    pub fn latency(&self) -> Option<Duration> {
        self.latency.map(Duration::from_secs_f64)
    }

    /// The unloaded latency learnt.
    #[must_use]
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline.map(Duration::from_secs_f64)
    }

    /// Whether the limit is down at `min_limit` looking for an unloaded latency.
    #[must_use]
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// Takes in a request the upstream finished at `now`; once an interval has passed,
    /// moves the limit. The limit after it.
    pub fn record(&mut self, now: Duration, sample: Sample) -> u32 {
        let latency = sample.latency.as_secs_f64();
        let interval = &mut self.interval;
        interval.samples += 1;
        interval.latency_sum += latency;
        interval.most_in_flight = interval.most_in_flight.max(sample.in_flight);
        interval.lost |= sample.lost;
        if sample.in_flight <= self.settings.min_limit && !sample.lost {
            interval.unloaded_samples += 1;
            interval.unloaded_latency_sum += latency;
        }
        if now.saturating_sub(interval.start) >= INTERVAL {
            self.update(now);
        }
        self.limit()
    }

    /// Ends the interval gathered: learns from it and moves the limit.
    fn update(&mut self, now: Duration) {
        let interval = std::mem::replace(&mut self.interval, Interval::new(now));
        let latency = interval.latency_sum / f64::from(interval.samples);
        self.latency = Some(latency);
        if interval.unloaded_samples > 0 {
            let unloaded = interval.unloaded_latency_sum / f64::from(interval.unloaded_samples);
            self.baseline = Some(self.baseline.map_or(unloaded, |b| b + BASELINE_WEIGHT * (unloaded - b)));
            self.last_unloaded = now;
        }
        if let Some(probe) = self.probe {
            if interval.unloaded_samples > 0 || now.saturating_sub(probe.since) >= PROBE_AT_MOST {
                self.probe = None;
                self.limit = probe.resume_at;
            }
            return;
        }
        let Some(baseline) = self.baseline.filter(|_| now.saturating_sub(self.last_unloaded) < PROBE_EVERY) else {
            self.probe = Some(Probe { since: now, resume_at: self.limit });
            self.limit = f64::from(self.settings.min_limit);
            return;
        };
        let limit = self.limit;
        let congested = interval.lost || latency > self.settings.tolerance * baseline;
        let next = match self.settings.algorithm {
            Algorithm::Gradient2 => {
                let gradient = if interval.lost {
                    MIN_GRADIENT
                } else {
                    (self.settings.tolerance * baseline / latency).clamp(MIN_GRADIENT, 1.0)
                };
                let target = limit * gradient + limit.sqrt();
                limit * (1.0 - SMOOTHING) + target * SMOOTHING
            }
            Algorithm::Aimd if congested => limit * BACKOFF,
            Algorithm::Aimd => limit + 1.0,
        };
        // A limit not half used says nothing of what more the upstream would take: it
        // does not grow, but below its initial value it grows back while the latency
        // allows.
        let unused = f64::from(interval.most_in_flight) < limit / 2.0;
        let next = if unused { next.min(limit.max(f64::from(self.settings.initial_limit))) } else { next };
        self.limit = self.settings.clamp(next);
    }
}

#[cfg(test)]
mod tests;
