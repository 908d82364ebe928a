//! HTTP/2 streams that make no progress. A client that stops reading one stream (it
//! never opens the stream's flow-control window) while it keeps the connection busy
//! is not written to, so `send_timeout` on the socket never sees it; hyper then never
//! asks the response body for more, so no timer inside the body runs either, and the
//! stream would hold its upstream connection for ever, a hundred times a connection.
//! hyper runs each stream as a task of the connection's executor: this one ends (and
//! so resets) a stream whose task was not woken for its bound.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

/// Spawns each stream of one connection, to be ended once it was not woken for
/// `after`; `on_cut` counts each one ended so.
#[derive(Clone)]
pub(super) struct StallCut {
    after: Duration,
    on_cut: Arc<dyn Fn() + Send + Sync>,
}

impl StallCut {
    pub(super) fn new(after: Duration, on_cut: Arc<dyn Fn() + Send + Sync>) -> Self {
        Self { after, on_cut }
    }
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for StallCut {
    fn execute(&self, stream: F) {
        tokio::spawn(Stalled::new(stream, self.after, Arc::clone(&self.on_cut)));
    }
}

/// Whether the task it wakes was woken since it last looked, and the task's waker.
#[derive(Debug, Default)]
struct Woken {
    since: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.since.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            task.wake_by_ref();
        }
    }
}

/// A future ended when it was not woken for `after`: each wake-up (a frame from the
/// client, the upstream's bytes, window opened for a write, a timer of its own) is
/// progress.
struct Stalled<F> {
    inner: Pin<Box<F>>,
    woken: Arc<Woken>,
    /// Wakes `woken`, given to `inner` instead of the task's.
    inner_waker: Waker,
    deadline: Pin<Box<Sleep>>,
    after: Duration,
    on_cut: Arc<dyn Fn() + Send + Sync>,
}

impl<F: Future<Output = ()>> Stalled<F> {
    fn new(inner: F, after: Duration, on_cut: Arc<dyn Fn() + Send + Sync>) -> Self {
        let woken = Arc::new(Woken::default());
        // Polled at first as if woken.
        woken.since.store(true, Ordering::Relaxed);
        let inner_waker = Waker::from(Arc::clone(&woken));
        Self {
            inner: Box::pin(inner),
            woken,
            inner_waker,
            deadline: Box::pin(tokio::time::sleep(after)),
            after,
            on_cut,
        }
    }
}

impl<F: Future<Output = ()>> Future for Stalled<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        {
            let mut task = this.woken.task.lock().unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|task| task.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        if this.woken.since.swap(false, Ordering::AcqRel) {
            if this.inner.as_mut().poll(&mut Context::from_waker(&this.inner_waker)).is_ready() {
                return Poll::Ready(());
            }
            this.deadline.as_mut().reset(Instant::now() + this.after);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            // Dropping the stream resets it, and with it the upstream's response.
            (this.on_cut)();
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting() -> (Arc<std::sync::atomic::AtomicUsize>, Arc<dyn Fn() + Send + Sync>) {
        let cuts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&cuts);
        (cuts, Arc::new(move || _ = counted.fetch_add(1, Ordering::Relaxed)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_woken_in_time_runs_to_its_end_and_one_left_unwoken_is_ended() {
        let (cuts, on_cut) = counting();
        // Woken every 900 ms by a timer of its own, for 5 s: never 1 s without progress.
        let ticking = async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(900)).await;
            }
        };
        let started = Instant::now();
        Stalled::new(ticking, Duration::from_secs(1), Arc::clone(&on_cut)).await;
        assert_eq!((started.elapsed(), cuts.load(Ordering::Relaxed)), (Duration::from_millis(4500), 0));
        // Never woken again after its first poll.
        let started = Instant::now();
        Stalled::new(std::future::pending::<()>(), Duration::from_secs(1), on_cut).await;
        assert_eq!((started.elapsed(), cuts.load(Ordering::Relaxed)), (Duration::from_secs(1), 1));
    }
}
