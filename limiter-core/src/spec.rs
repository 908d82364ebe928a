//! What a limit is: an algorithm, a quota per window, and the options some
//! algorithms take. The config parses into these; they know nothing of the config.

use std::{fmt, num::NonZeroU32, str::FromStr, time::Duration};

use crate::calendar::Calendar;

/// The algorithm of a rule or plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindowLog,
    #[default]
    SlidingWindowCounter,
}

impl Algorithm {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [Self; 5] =
        [Self::TokenBucket, Self::LeakyBucket, Self::FixedWindow, Self::SlidingWindowLog, Self::SlidingWindowCounter];

    /// The name the config and the Redis script use.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::LeakyBucket => "leaky_bucket",
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindowLog => "sliding_window_log",
            Self::SlidingWindowCounter => "sliding_window_counter",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = SpecError;

    fn from_str(name: &str) -> Result<Self, SpecError> {
        Self::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| SpecError::UnknownAlgorithm(name.to_owned()))
    }
}

/// A limit: `limit` requests per `window` by `algorithm`, optionally with a throttle
/// band, a burst (token bucket) or a queue (leaky bucket as a shaper).
///
/// Built checked by [`LimitSpec::new`]; the fields stay public so that tests can
/// write a spec out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    pub algorithm: Algorithm,
    pub limit: NonZeroU32,
    pub window: Duration,
    /// Token bucket: back-to-back capacity (default `limit`).
    pub burst: Option<NonZeroU32>,
    /// Requests past this many in the window are delayed by `throttle_delay`, more
    /// the further past with a `throttle_step`.
    pub throttle: Option<Throttle>,
    /// Leaky bucket: hold up to this many requests and release them at the rate.
    pub queue: Option<NonZeroU32>,
    /// Fixed window: windows that turn on the calendar (`window = "month"`), `window`
    /// then being the period's usual length.
    pub calendar: Option<Calendar>,
    /// What one request takes from the bucket, in units of `limit`.
    pub cost: Cost,
}

/// What a request costs its bucket: the limit, burst and queue count these units.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cost {
    /// Taken at admission in one atomic step: a request is admitted only if this many
    /// units are left, and takes nothing if refused.
    Units(NonZeroU32),
    /// Post-paid: a request is admitted while at least one unit is left and takes
    /// nothing then; what it cost is charged once its answer says ([`CostFrom`]),
    /// which may leave the bucket in debt, repaid (by time) before the next
    /// admission.
    From(CostFrom),
}

impl Default for Cost {
    fn default() -> Self {
        Self::Units(NonZeroU32::MIN)
    }
}

impl Cost {
    /// Units an admitted request takes at once: none for a post-paid one.
    #[must_use]
    pub const fn upfront(&self) -> u32 {
        match self {
            Self::Units(units) => units.get(),
            Self::From(_) => 0,
        }
    }

    /// Units that must be left for a request to be admitted: at least one.
    #[must_use]
    pub const fn needed(&self) -> u32 {
        match self {
            Self::Units(units) => units.get(),
            Self::From(_) => 1,
        }
    }

    /// The post-paid source, if the cost is one.
    #[must_use]
    pub const fn post_paid(&self) -> Option<&CostFrom> {
        match self {
            Self::Units(_) => None,
            Self::From(from) => Some(from),
        }
    }
}

/// Where a post-paid cost comes from, and the most one request is charged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CostFrom {
    pub source: CostSource,
    pub max: NonZeroU32,
}

impl CostFrom {
    /// The units to charge for a measure of `measured` (`None`: the answer gave no
    /// readable one, charged `max`, so that a broken or hostile meter is never
    /// free), clamped to `max`.
    #[must_use]
    pub fn units(&self, measured: Option<u64>) -> u32 {
        measured.map_or(self.max.get(), |units| u32::try_from(units).unwrap_or(u32::MAX).min(self.max.get()))
    }
}

/// What a post-paid request's units are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CostSource {
    /// The value of this header of the upstream's response head, removed from the
    /// client's response when `strip`.
    ResponseHeader { name: http::HeaderName, strip: bool },
    /// The milliseconds from sending the request upstream to the end of its
    /// response (its body finished, or the connection closed).
    UpstreamMs,
}

/// The delay band below the hard limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Throttle {
    pub from: u32,
    pub delay: Duration,
    /// A progressive band: every this many further requests in the window add
    /// `delay` again. `None`: every request in the band waits `delay`.
    pub step: Option<Step>,
}

/// How a progressive band's delay grows: the article's "100 ms more for every N
/// excess requests", capped so that a client deep in the band still gets an answer
/// before its own timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    pub every: NonZeroU32,
    pub max_delay: Duration,
}

impl Throttle {
    /// The wait of a request that brings the units in use to `used`: none up to
    /// `from`; past it, for the n-th request beyond (n = 1, 2, …), `delay ×
    /// ceil(n / every)` capped at `max_delay`, or `delay` for a fixed band.
    #[must_use]
    pub fn delay_at(&self, used: u64) -> Duration {
        let beyond = used.saturating_sub(u64::from(self.from));
        if beyond == 0 {
            return Duration::ZERO;
        }
        let Some(step) = self.step else { return self.delay };
        let steps = u32::try_from(beyond.div_ceil(u64::from(step.every.get()))).unwrap_or(u32::MAX);
        self.delay.saturating_mul(steps).min(step.max_delay)
    }
}

/// The options of a limit as written, before they are checked against each other.
#[derive(Clone, Debug, Default)]
pub struct LimitOptions {
    pub burst: Option<NonZeroU32>,
    pub throttle_from: Option<u32>,
    pub throttle_delay: Option<Duration>,
    pub throttle_step: Option<NonZeroU32>,
    pub throttle_max_delay: Option<Duration>,
    pub queue: Option<NonZeroU32>,
    pub calendar: Option<Calendar>,
    pub cost: Cost,
}

/// Why a limit cannot be built; the messages speak the config's key names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "unknown algorithm `{0}`, expected one of `token_bucket`, `leaky_bucket`, `fixed_window`, `sliding_window_log`, `sliding_window_counter`"
    )]
    UnknownAlgorithm(String),
    #[error("window must be longer than 0")]
    EmptyWindow,
    #[error("throttle_from = {from} must be below limit = {limit}")]
    ThrottleAboveLimit { from: u32, limit: NonZeroU32 },
    #[error("throttle_delay must be longer than 0")]
    EmptyThrottleDelay,
    #[error("throttle_from and throttle_delay go together")]
    HalfThrottle,
    #[error("throttle_step and throttle_max_delay go with throttle_from and throttle_delay, and together")]
    HalfStep,
    #[error("throttle_max_delay must be at least throttle_delay")]
    MaxDelayBelowDelay,
    #[error("burst only applies to algorithm = \"token_bucket\"")]
    BurstWithoutTokenBucket,
    #[error("queue only applies to algorithm = \"leaky_bucket\"")]
    QueueWithoutLeakyBucket,
    #[error("a queue already delays requests: drop throttle_from/throttle_delay")]
    QueueAndThrottle,
    #[error("cost = {cost} is more than the {capacity} units a full bucket holds: no request could pass")]
    CostAboveCapacity { cost: u32, capacity: NonZeroU32 },
    #[error("cost and cost_from go apart: a request costs a fixed number of units or what its answer says")]
    CostAndCostFrom,
    #[error("algorithm = \"sliding_window_log\" logs each request once: a cost other than 1 needs another algorithm")]
    CostWithLog,
    #[error(
        "cost_from needs a bucket that can go into debt: a leaky_bucket's queue releases requests before their cost is known"
    )]
    CostFromWithQueue,
    #[error("window = \"{0}\" turns on the calendar, which only algorithm = \"fixed_window\" does")]
    CalendarWithoutFixedWindow(&'static str),
    #[error("limit {limit} (capacity {capacity}) over {window:?} is too large for the redis store; shorten the window")]
    InexactInRedis { limit: NonZeroU32, capacity: NonZeroU32, window: Duration },
}

/// Largest integer Lua's doubles hold exactly.
const EXACT_IN_DOUBLES: u128 = 1 << 53;

impl LimitSpec {
    /// A limit whose options fit its algorithm and each other.
    pub fn new(
        algorithm: Algorithm,
        limit: NonZeroU32,
        window: Duration,
        options: LimitOptions,
    ) -> Result<Self, SpecError> {
        if window.is_zero() {
            return Err(SpecError::EmptyWindow);
        }
        let throttle = match (options.throttle_from, options.throttle_delay) {
            (None, None) => None,
            (Some(from), Some(_)) if from >= limit.get() => return Err(SpecError::ThrottleAboveLimit { from, limit }),
            (Some(_), Some(delay)) if delay.is_zero() => return Err(SpecError::EmptyThrottleDelay),
            (Some(from), Some(delay)) => Some(Throttle { from, delay, step: None }),
            _ => return Err(SpecError::HalfThrottle),
        };
        let throttle = match (throttle, options.throttle_step, options.throttle_max_delay) {
            (throttle, None, None) => throttle,
            (Some(throttle), Some(_), Some(max_delay)) if max_delay < throttle.delay => {
                return Err(SpecError::MaxDelayBelowDelay);
            }
            (Some(throttle), Some(every), Some(max_delay)) => {
                Some(Throttle { step: Some(Step { every, max_delay }), ..throttle })
            }
            _ => return Err(SpecError::HalfStep),
        };
        if options.burst.is_some() && algorithm != Algorithm::TokenBucket {
            return Err(SpecError::BurstWithoutTokenBucket);
        }
        if options.queue.is_some() && algorithm != Algorithm::LeakyBucket {
            return Err(SpecError::QueueWithoutLeakyBucket);
        }
        if options.queue.is_some() && throttle.is_some() {
            return Err(SpecError::QueueAndThrottle);
        }
        let window = match &options.calendar {
            Some(calendar) if algorithm != Algorithm::FixedWindow => {
                return Err(SpecError::CalendarWithoutFixedWindow(calendar.period.name()));
            }
            Some(calendar) => calendar.period.nominal(),
            None => window,
        };
        let spec = Self {
            algorithm,
            limit,
            window,
            burst: options.burst,
            throttle,
            queue: options.queue,
            calendar: options.calendar,
            cost: options.cost,
        };
        if spec.cost != Cost::default() && algorithm == Algorithm::SlidingWindowLog {
            return Err(SpecError::CostWithLog);
        }
        if spec.cost.post_paid().is_some() && spec.queue.is_some() {
            return Err(SpecError::CostFromWithQueue);
        }
        if spec.cost.upfront() > spec.capacity().get() {
            return Err(SpecError::CostAboveCapacity { cost: spec.cost.upfront(), capacity: spec.capacity() });
        }
        Ok(spec)
    }

    /// Requests a full bucket admits back to back.
    #[must_use]
    pub fn capacity(&self) -> NonZeroU32 {
        match self.algorithm {
            Algorithm::TokenBucket => self.burst.unwrap_or(self.limit),
            // The request being served plus the queue behind it.
            Algorithm::LeakyBucket => self.queue.map_or(self.limit, |queue| queue.saturating_add(1)),
            Algorithm::FixedWindow | Algorithm::SlidingWindowLog | Algorithm::SlidingWindowCounter => self.limit,
        }
    }

    /// This limit shared out among `agents` that enforce it apart (each its own
    /// counts, as while the shared store is away): every quota divided, rounded up
    /// so that none becomes 0. Together they admit at most the limit plus
    /// `agents - 1` per window.
    #[must_use]
    pub fn share(&self, agents: u32) -> Self {
        let agents = agents.max(1);
        // Never below one request's cost, which a smaller bucket could never admit.
        let least = self.cost.needed();
        let part = |n: NonZeroU32| NonZeroU32::new(n.get().div_ceil(agents).max(least)).unwrap_or(NonZeroU32::MIN);
        let limit = part(self.limit);
        Self {
            algorithm: self.algorithm,
            limit,
            window: self.window,
            burst: self.burst.map(part),
            // Still below the limit it bands: `from < limit` held before the division.
            // Each agent sees its share of the requests: its steps are as much shorter.
            throttle: self.throttle.map(|t| Throttle {
                from: (t.from / agents).min(limit.get() - 1),
                step: t.step.map(|step| Step { every: part(step.every), ..step }),
                ..t
            }),
            queue: self.queue.map(part),
            calendar: self.calendar.clone(),
            cost: self.cost.clone(),
        }
    }

    /// The window in whole microseconds (configured windows are whole milliseconds).
    #[must_use]
    pub fn window_micros(&self) -> u64 {
        u64::try_from(self.window.as_micros()).unwrap_or(u64::MAX).max(1)
    }

    /// Refuses a limit whose arithmetic in the Redis store's script (Lua counts in
    /// doubles) would pass 2^53: GCRA counts `capacity × window` in units of
    /// `1 / limit` ns, the windowed algorithms `limit × window` in µs; a post-paid
    /// cost's debt adds `max` units to both. A calendar window's script counts only
    /// instants, which doubles hold exactly.
    pub fn check_exact_in_doubles(&self) -> Result<(), SpecError> {
        if self.calendar.is_some() {
            return Ok(());
        }
        let capacity = self.capacity();
        let debt = u128::from(self.cost.post_paid().map_or(0, |from| from.max.get()));
        let gcra = u128::from(self.window_micros()) * 1000 * (u128::from(capacity.get()) + debt);
        let windowed = u128::from(self.window_micros()) * (u128::from(self.limit.get()) + debt);
        if gcra >= EXACT_IN_DOUBLES || windowed >= EXACT_IN_DOUBLES {
            return Err(SpecError::InexactInRedis { limit: self.limit, capacity, window: self.window });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::{num::NonZeroU32, time::Duration};

    use super::{Algorithm, LimitOptions, LimitSpec, SpecError};

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).expect("nonzero")
    }

    #[test]
    fn a_shared_limit_divides_every_quota_rounding_up() {
        let options = LimitOptions { burst: Some(nz(30)), ..LimitOptions::default() };
        let spec = LimitSpec::new(Algorithm::TokenBucket, nz(101), Duration::from_secs(60), options).expect("spec");
        let half = spec.share(2);
        assert_eq!((half.limit.get(), half.burst.map(NonZeroU32::get)), (51, Some(15)));
        assert_eq!(spec.share(1), spec);
        assert_eq!(spec.share(0), spec, "no live agent known: the whole limit");
        assert_eq!(spec.share(1_000).limit.get(), 1, "never 0");
        let banded = LimitOptions {
            throttle_from: Some(80),
            throttle_delay: Some(Duration::from_millis(50)),
            ..LimitOptions::default()
        };
        let free =
            LimitSpec::new(Algorithm::SlidingWindowCounter, nz(100), Duration::from_secs(60), banded).expect("spec");
        let third = free.share(3);
        assert_eq!((third.limit.get(), third.throttle.map(|t| t.from)), (34, Some(26)));
        let tiny = LimitSpec::new(
            Algorithm::FixedWindow,
            nz(2),
            Duration::from_secs(1),
            LimitOptions {
                throttle_from: Some(1),
                throttle_delay: Some(Duration::from_millis(1)),
                ..LimitOptions::default()
            },
        )
        .expect("spec");
        assert_eq!(tiny.share(4).throttle.map(|t| t.from), Some(0), "a band stays below the limit");
    }

    fn progressive(step: u32, max_ms: u64) -> LimitOptions {
        LimitOptions {
            throttle_from: Some(50),
            throttle_delay: Some(Duration::from_millis(100)),
            throttle_step: Some(nz(step)),
            throttle_max_delay: Some(Duration::from_millis(max_ms)),
            ..LimitOptions::default()
        }
    }

    /// The example: 51–60 wait 100 ms, 61–70 200 ms, and so on up to the cap.
    #[test]
    fn a_progressive_band_adds_the_delay_for_every_step_up_to_its_cap() {
        let spec = LimitSpec::new(Algorithm::FixedWindow, nz(200), Duration::from_secs(60), progressive(10, 250))
            .expect("spec");
        let throttle = spec.throttle.expect("a band");
        let waits: Vec<u128> = [1, 50, 51, 60, 61, 70, 71, 200].map(|used| throttle.delay_at(used).as_millis()).into();
        assert_eq!(waits, [0, 0, 100, 100, 200, 200, 250, 250]);
        let fixed = LimitOptions { throttle_step: None, throttle_max_delay: None, ..progressive(10, 250) };
        let fixed = LimitSpec::new(Algorithm::FixedWindow, nz(200), Duration::from_secs(60), fixed).expect("spec");
        let fixed = fixed.throttle.expect("a band");
        assert_eq!([50, 51, 199].map(|used| fixed.delay_at(used).as_millis()), [0, 100, 100]);
    }

    #[test]
    fn a_step_needs_its_band_and_its_cap_and_a_cap_below_the_delay_is_refused() {
        let build = |options| LimitSpec::new(Algorithm::FixedWindow, nz(200), Duration::from_secs(60), options);
        let no_cap = LimitOptions { throttle_max_delay: None, ..progressive(10, 250) };
        assert_eq!(build(no_cap), Err(SpecError::HalfStep));
        let no_band = LimitOptions { throttle_from: None, throttle_delay: None, ..progressive(10, 250) };
        assert_eq!(build(no_band), Err(SpecError::HalfStep));
        assert_eq!(build(progressive(10, 99)), Err(SpecError::MaxDelayBelowDelay));
    }

    /// Apart (the store away), each of 2 agents sees about half the requests: its band
    /// starts at half the count and steps every half as many, so that the delays grow
    /// with the fleet's count as they would together.
    #[test]
    fn a_shared_progressive_band_steps_as_much_sooner() {
        let spec = LimitSpec::new(Algorithm::FixedWindow, nz(200), Duration::from_secs(60), progressive(10, 1000))
            .expect("spec");
        let half = spec.share(2).throttle.expect("a band");
        assert_eq!((half.from, half.step.map(|step| step.every.get())), (25, Some(5)));
        assert_eq!([25, 26, 30, 31].map(|used| half.delay_at(used).as_millis()), [0, 100, 100, 200]);
    }
}
