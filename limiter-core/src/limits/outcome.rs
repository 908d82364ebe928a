//! What an algorithm says about one request against one bucket.
//!
//! Every algorithm keeps one invariant, which is what makes the headers exact:
//! `remaining` is the number of units the bucket would give out back to back at this
//! instant (a request of one unit each: requests). So a request is admitted exactly
//! when `before.remaining` is at least its cost's [`needed`](crate::Cost::needed)
//! units, and each admitted request lowers `remaining` by exactly the units it takes
//! ([`upfront`](crate::Cost::upfront)); between requests it can only rise, as
//! capacity returns, and it falls again only by a post-paid request's charge.

use std::time::Duration;

use crate::Throttle;

/// A bucket's quota at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Requests the bucket would admit back to back now.
    pub remaining: u64,
    /// Time until the bucket is back to its full capacity (zero if it is).
    pub reset_after: Duration,
}

/// The verdict of one bucket on one request, computed without changing the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub admitted: bool,
    /// The quota as it stands, without this request.
    pub before: Quota,
    /// The quota once this request is charged; `before` if it is rejected.
    pub after: Quota,
    /// Time until this request would be admitted; zero if it is.
    pub retry_after: Duration,
    /// Units of the bucket's capacity in use once this request is charged: what a
    /// throttle band is compared with.
    pub used: u64,
    /// Leaky bucket as a shaper: how long the request waits for its departure slot.
    pub wait: Duration,
    /// The instant the store counted the request at, if it charged the bucket: what a
    /// refund of that charge needs (see [`super::bucket::refund`]). `None` for a
    /// bucket not charged.
    pub charged_at: Option<Duration>,
}

impl Outcome {
    /// An admitted request taking `units`: `before.remaining` must be at least its
    /// cost's needed units.
    pub(super) fn admitted(capacity: u64, before: Quota, units: u32, reset_after: Duration) -> Self {
        let remaining = before.remaining.saturating_sub(u64::from(units));
        Self {
            admitted: true,
            before,
            after: Quota { remaining, reset_after },
            retry_after: Duration::ZERO,
            used: capacity.saturating_sub(remaining),
            wait: Duration::ZERO,
            charged_at: None,
        }
    }

    /// A rejected request: `before.remaining` is below its cost's needed units.
    pub(super) fn rejected(capacity: u64, before: Quota, retry_after: Duration) -> Self {
        Self {
            admitted: false,
            before,
            after: before,
            retry_after,
            used: capacity,
            wait: Duration::ZERO,
            charged_at: None,
        }
    }

    /// How long an admitted request is held before it is forwarded: its shaper wait,
    /// or its throttle band's delay at the usage it brings, whichever is longer.
    #[must_use]
    pub fn delay(&self, throttle: Option<Throttle>) -> Duration {
        let band = throttle.map_or(Duration::ZERO, |t| t.delay_at(self.used));
        self.wait.max(band)
    }
}
