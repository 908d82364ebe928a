//! HTTP/2's rapid-reset attack (CVE-2023-44487): a client opens streams and cancels
//! each at once, so that the proxy starts the work of every request while the
//! client, never waiting for an answer, is bound by no stream limit. Cancellations
//! are counted per connection; past `max_resets_per_minute` the connection is cut.
//! (h2 itself also ends a connection whose streams are reset before they are
//! accepted, faster than the proxy takes them; that is counted alike.)

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

const WINDOW: Duration = Duration::from_secs(60);

/// One connection's cancelled requests in the current minute.
#[derive(Debug)]
pub(super) struct Resets {
    max_per_minute: u32,
    /// Start of the current window and the cancellations in it.
    window: Mutex<(Instant, u32)>,
    over: Notify,
}

impl Resets {
    pub(super) fn new(max_per_minute: u32) -> Arc<Self> {
        Arc::new(Self { max_per_minute, window: Mutex::new((Instant::now(), 0)), over: Notify::new() })
    }

    /// Watches one request: dropped before [`Cancellation::answered`], it was cancelled.
    pub(super) fn watch(self: &Arc<Self>) -> Cancellation {
        Cancellation { resets: Arc::clone(self), answered: false }
    }

    /// Completes once the client has cancelled more than it may.
    pub(super) async fn exceeded(&self) {
        self.over.notified().await;
    }

    fn cancelled(&self) {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if now.duration_since(window.0) >= WINDOW {
            *window = (now, 0);
        }
        window.1 = window.1.saturating_add(1);
        if window.1 > self.max_per_minute {
            // Kept as a permit if the connection is not waiting yet.
            self.over.notify_one();
        }
    }
}

/// One request of a connection watched by [`Resets`].
#[derive(Debug)]
pub(super) struct Cancellation {
    resets: Arc<Resets>,
    answered: bool,
}

impl Cancellation {
    /// The request's answer is ready: the client no longer cancels it for free.
    pub(super) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Cancellation {
    fn drop(&mut self) {
        if !self.answered {
            self.resets.cancelled();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_cancellation_past_the_bound_cuts_and_a_new_minute_starts_afresh() {
        let resets = Resets::new(3);
        for _ in 0..3 {
            drop(resets.watch());
        }
        resets.watch().answered();
        let cut = tokio::time::timeout(Duration::from_millis(1), resets.exceeded()).await;
        assert!(cut.is_err(), "3 cancellations and an answer are within a bound of 3");
        tokio::time::advance(WINDOW).await;
        for _ in 0..3 {
            drop(resets.watch());
        }
        assert!(tokio::time::timeout(Duration::from_millis(1), resets.exceeded()).await.is_err());
        drop(resets.watch());
        assert!(tokio::time::timeout(Duration::from_millis(1), resets.exceeded()).await.is_ok(), "the 4th in a minute");
    }
}
