//! `[proxy.adaptive]`: the upstream gate's limit, moved by a
//! [`limiter_core::adaptive::Controller`] fed every request through that gate (its
//! latency from forwarding to the response head or the failure, the requests in
//! flight when it was let in, whether `losses` names its answer), and each plan's
//! guaranteed share of it.
//!
//! Shedding is the upstream gate refusing requests: it lasts while each refusal comes
//! within [`SHEDDING_GAP`] of the one before. Shedding for [`TIGHTEN_AFTER`] asks the
//! kernel's new-source budget to be scaled by `tighten_new_sources`, until
//! [`RESTORE_AFTER`] has passed without a refusal.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use limiter_core::adaptive::{Controller, Sample};
use tokio::time::Instant;

use super::{gates::ShareTable, stats::AdaptiveStats};
use crate::config::{count_when::Answer, proxy::AdaptiveConfig};

/// A refusal within this of the last keeps the upstream shedding; longer without one,
/// it has stopped.
pub(super) const SHEDDING_GAP: Duration = Duration::from_secs(1);

/// Shedding this long tightens the kernel's new-source budget.
pub(super) const TIGHTEN_AFTER: Duration = Duration::from_secs(10);

/// This long without a refusal restores it.
pub(super) const RESTORE_AFTER: Duration = Duration::from_secs(10);

/// The limit and what it learnt, with the config it follows.
#[derive(Debug)]
struct Running {
    config: AdaptiveConfig,
    controller: Controller,
    shares: ShareTable,
    /// When the upstream gate last refused a request.
    last_refusal: Option<Duration>,
    /// When the shedding under way started.
    shedding_since: Option<Duration>,
    /// The kernel's new-source budget is to be tightened.
    tightened: bool,
}

impl Running {
    fn shedding(&self, now: Duration) -> bool {
        self.last_refusal.is_some_and(|last| now.saturating_sub(last) < SHEDDING_GAP)
    }
}

/// The adaptive limit, if `[proxy.adaptive]` is on; it outlives reloads.
#[derive(Debug)]
pub(super) struct Adaptive {
    running: Mutex<Option<Running>>,
    /// What the controller's time counts from.
    started: Instant,
}

impl Adaptive {
    pub(super) fn new(config: Option<&AdaptiveConfig>) -> Self {
        let adaptive = Self { running: Mutex::new(None), started: Instant::now() };
        adaptive.reconfigure(config);
        adaptive
    }

    fn lock(&self) -> MutexGuard<'_, Option<Running>> {
        // Every change under the lock leaves the state whole.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Follows a reload: new settings (algorithm, bounds, tolerance) start a new
    /// controller at `initial_limit`; new losses or shares keep what it learnt.
    pub(super) fn reconfigure(&self, config: Option<&AdaptiveConfig>) {
        let now = self.now();
        let mut running = self.lock();
        let kept = running.take();
        *running = config.map(|config| {
            let shares = Arc::new(config.shares.clone());
            let controller = match &kept {
                Some(kept) if kept.config.settings == config.settings => kept.controller.clone(),
                _ => Controller::new(config.settings, now),
            };
            // Shedding goes on whatever changed: a reload while tightened stays so.
            let (last_refusal, shedding_since, tightened) = kept
                .as_ref()
                .map_or((None, None, false), |kept| (kept.last_refusal, kept.shedding_since, kept.tightened));
            Running { config: config.clone(), controller, shares, last_refusal, shedding_since, tightened }
        });
    }

    /// The upstream's limit now and the plans' shares of it, under one lock; `None`:
    /// not adaptive.
    pub(super) fn bounds(&self) -> Option<(usize, ShareTable)> {
        self.lock().as_ref().map(|running| (running.controller.limit() as usize, Arc::clone(&running.shares)))
    }

    /// Takes in a request the upstream gate let in `depth` deep, answered `answer`
    /// after `latency`; the limit after it. One never sent (no upstream connection
    /// free, its body too slow) says nothing of the upstream and is left out.
    pub(super) fn record(&self, depth: usize, latency: Duration, answer: Answer) -> Option<usize> {
        if answer == Answer::Unsent {
            return None;
        }
        let now = self.now();
        let mut running = self.lock();
        let running = running.as_mut()?;
        let lost = running.config.losses.iter().any(|loss| loss.matches(answer));
        let in_flight = u32::try_from(depth).unwrap_or(u32::MAX);
        Some(running.controller.record(now, Sample { latency, in_flight, lost }) as usize)
    }

    /// The upstream gate refused a request.
    pub(super) fn refused(&self) {
        let now = self.now();
        if let Some(running) = self.lock().as_mut() {
            if !running.shedding(now) {
                running.shedding_since = Some(now);
            }
            running.last_refusal = Some(now);
        }
    }

    /// What the kernel's new-source budget is to be scaled by now; `None`: as
    /// configured. Asked on the agent's ticks.
    pub(super) fn tightening(&self) -> Option<f64> {
        let now = self.now();
        let mut running = self.lock();
        let running = running.as_mut()?;
        let factor = running.config.tighten_new_sources?;
        let shed_for = running.shedding_since.filter(|_| running.shedding(now)).map(|since| now.saturating_sub(since));
        if shed_for.is_some_and(|shed_for| shed_for >= TIGHTEN_AFTER) {
            running.tightened = true;
        } else if running.last_refusal.is_none_or(|last| now.saturating_sub(last) >= RESTORE_AFTER) {
            running.tightened = false;
        }
        running.tightened.then_some(factor)
    }

    pub(super) fn stats(&self) -> Option<AdaptiveStats> {
        let now = self.now();
        let running = self.lock();
        let running = running.as_ref()?;
        let controller = &running.controller;
        let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
        Some(AdaptiveStats {
            limit: controller.limit(),
            latency_ms: controller.latency().map(ms),
            baseline_ms: controller.baseline().map(ms),
            shedding: running.shedding(now),
            probing: controller.probing(),
            tightened: running.tightened,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::count_when::StatusMatch;
    use limiter_core::adaptive::{Algorithm, Settings};

    fn config(min_limit: u32, tighten_new_sources: Option<f64>) -> AdaptiveConfig {
        AdaptiveConfig {
            settings: Settings::new(Algorithm::Gradient2, min_limit, 100, 50, 1.5).expect("settings"),
            losses: vec![StatusMatch::Timeout],
            shares: [("pro".to_owned(), 0.5)].into(),
            tighten_new_sources,
        }
    }

    /// Refusals every half second for `span`.
    async fn shed_for(adaptive: &Adaptive, span: Duration) -> Vec<Option<f64>> {
        let mut seen = Vec::new();
        let start = Instant::now();
        while start.elapsed() < span {
            adaptive.refused();
            seen.push(adaptive.tightening());
            tokio::time::advance(Duration::from_millis(500)).await;
        }
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn shedding_ten_seconds_tightens_and_ten_without_restores_across_a_reload() {
        let adaptive = Adaptive::new(Some(&config(8, Some(0.5))));
        assert_eq!(adaptive.tightening(), None);
        let seen = shed_for(&adaptive, TIGHTEN_AFTER).await;
        assert!(seen.iter().all(Option::is_none), "not yet: {seen:?}");
        assert_eq!(shed_for(&adaptive, Duration::from_millis(500)).await, [Some(0.5)]);
        assert!(adaptive.stats().expect("stats").shedding);
        // A reload with new bounds starts the limit again, and stays tightened.
        adaptive.reconfigure(Some(&config(4, Some(0.5))));
        assert_eq!(adaptive.tightening(), Some(0.5));
        // The last refusal came half a second ago.
        tokio::time::advance(RESTORE_AFTER - Duration::from_secs(1)).await;
        assert_eq!(adaptive.tightening(), Some(0.5), "still within 10 s of the last refusal");
        assert!(!adaptive.stats().expect("stats").shedding);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(adaptive.tightening(), None, "restored");
        // A gap of more than a second starts the count again.
        shed_for(&adaptive, Duration::from_secs(6)).await;
        tokio::time::advance(Duration::from_secs(2)).await;
        let seen = shed_for(&adaptive, Duration::from_secs(6)).await;
        assert!(seen.iter().all(Option::is_none), "{seen:?}");
        // Without tighten_new_sources nothing is asked.
        adaptive.reconfigure(Some(&config(4, None)));
        assert_eq!(adaptive.tightening(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn new_shares_keep_what_the_limit_learnt_and_new_bounds_start_it_again() {
        let adaptive = Adaptive::new(Some(&config(8, None)));
        let answer = Answer::Status(http::StatusCode::OK);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(150)).await;
            adaptive.record(1, Duration::from_millis(20), answer);
        }
        let learnt = adaptive.stats().expect("stats");
        assert!(learnt.baseline_ms.is_some());
        let mut shared = config(8, None);
        shared.shares = [("pro".to_owned(), 0.2)].into();
        adaptive.reconfigure(Some(&shared));
        assert_eq!(adaptive.stats().expect("stats").baseline_ms, learnt.baseline_ms);
        assert_eq!(adaptive.bounds().expect("bounds").1.get("pro"), Some(&0.2));
        adaptive.reconfigure(Some(&config(4, None)));
        assert_eq!(adaptive.stats().expect("stats").baseline_ms, None, "a new controller");
        assert_eq!(adaptive.bounds().map(|(limit, _)| limit), Some(50));
        assert_eq!(adaptive.record(1, Duration::from_millis(20), Answer::Unsent), None, "not a sample");
        adaptive.reconfigure(None);
        assert_eq!((adaptive.bounds().map(|(limit, _)| limit), adaptive.stats()), (None, None));
    }
}
