//! `[proxy.adaptive]`: the upstream gate's limit, moved by a
//! [`limiter_core::adaptive::Controller`] fed every request through that gate (its
//! latency from forwarding to the response head or the failure, the requests in
//! flight when it was let in, whether `losses` names its answer), and each plan's
//! guaranteed share of it.
//!
//! Shedding is the upstream gate refusing requests: it lasts while each refusal comes
//! within [`SHEDDING_GAP`] of the one before.

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

/// The limit and what it learnt, with the config it follows.
#[derive(Debug)]
struct Running {
    config: AdaptiveConfig,
    controller: Controller,
    shares: ShareTable,
    /// When the upstream gate last refused a request.
    last_refusal: Option<Duration>,
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
        *running = config.map(|config| {
            let shares = Arc::new(config.shares.clone());
            match running.take() {
                Some(kept) if kept.config.settings == config.settings => {
                    Running { config: config.clone(), shares, ..kept }
                }
                _ => Running {
                    config: config.clone(),
                    controller: Controller::new(config.settings, now),
                    shares,
                    last_refusal: None,
                },
            }
        });
    }

    /// The upstream's limit now; `None`: not adaptive.
    pub(super) fn limit(&self) -> Option<usize> {
        self.lock().as_ref().map(|running| running.controller.limit() as usize)
    }

    /// The plans' shares of the limit (none when not adaptive).
    pub(super) fn shares(&self) -> Option<ShareTable> {
        self.lock().as_ref().map(|running| Arc::clone(&running.shares))
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
            running.last_refusal = Some(now);
        }
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
            shedding: running.last_refusal.is_some_and(|last| now.saturating_sub(last) < SHEDDING_GAP),
            probing: controller.probing(),
        })
    }
}
