//! Waiting for the event a test asserts. What the agent counts, logs or writes into
//! its maps may land after the client has its answer (another worker, a writer task,
//! the kernel's softirq), and a server the lab starts answers some time after it is
//! spawned: a test looks again until what it expects shows, for a bounded while, and
//! fails naming what it waited for and the last thing it saw.

use std::{
    fmt::Debug,
    ops::ControlFlow,
    time::{Duration, Instant},
};

/// Long enough for anything that should happen "at once" on a loaded test machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Between two looks: short next to [`PATIENCE`], long enough not to busy a core.
const BETWEEN_LOOKS: Duration = Duration::from_millis(20);

/// Looks with `look` until `done` holds of what it saw, for up to [`PATIENCE`]:
/// `Ok` with that look, or `Err` with the last one once the time is up.
pub fn poll<T>(look: impl FnMut() -> T, done: impl FnMut(&T) -> bool) -> Result<T, T> {
    poll_within(PATIENCE, look, done)
}

fn poll_within<T>(patience: Duration, mut look: impl FnMut() -> T, mut done: impl FnMut(&T) -> bool) -> Result<T, T> {
    let deadline = Instant::now() + patience;
    loop {
        if let ControlFlow::Break(outcome) = judge(look(), &mut done, deadline) {
            return outcome;
        }
        std::thread::sleep(BETWEEN_LOOKS);
    }
}

/// [`poll`] from a task: the runtime goes on (a test upstream on it, say) between looks.
#[cfg(feature = "agent")]
pub async fn poll_async<T>(look: impl FnMut() -> T, done: impl FnMut(&T) -> bool) -> Result<T, T> {
    poll_within_async(PATIENCE, look, done).await
}

#[cfg(feature = "agent")]
async fn poll_within_async<T>(
    patience: Duration,
    mut look: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + patience;
    loop {
        if let ControlFlow::Break(outcome) = judge(look(), &mut done, deadline) {
            return outcome;
        }
        tokio::time::sleep(BETWEEN_LOOKS).await;
    }
}

/// What one look decides: done, out of time, or (`Continue`) look again.
fn judge<T>(seen: T, done: &mut impl FnMut(&T) -> bool, deadline: Instant) -> ControlFlow<Result<T, T>> {
    if done(&seen) {
        ControlFlow::Break(Ok(seen))
    } else if Instant::now() >= deadline {
        ControlFlow::Break(Err(seen))
    } else {
        ControlFlow::Continue(())
    }
}

/// [`poll`], failing the test when the time is up.
pub fn until<T: Debug>(what: &str, look: impl FnMut() -> T, done: impl FnMut(&T) -> bool) -> T {
    until_within(PATIENCE, what, look, done)
}

/// [`until`] for what takes longer than [`PATIENCE`] by design (a failover, say).
pub fn until_within<T: Debug>(
    patience: Duration,
    what: &str,
    look: impl FnMut() -> T,
    done: impl FnMut(&T) -> bool,
) -> T {
    poll_within(patience, look, done).unwrap_or_else(|last| timed_out(what, patience, &last))
}

/// [`poll_async`], failing the test when the time is up.
#[cfg(feature = "agent")]
pub async fn until_async<T: Debug>(what: &str, look: impl FnMut() -> T, done: impl FnMut(&T) -> bool) -> T {
    until_within_async(PATIENCE, what, look, done).await
}

/// [`until_async`] for what takes longer than [`PATIENCE`] by design.
#[cfg(feature = "agent")]
pub async fn until_within_async<T: Debug>(
    patience: Duration,
    what: &str,
    look: impl FnMut() -> T,
    done: impl FnMut(&T) -> bool,
) -> T {
    poll_within_async(patience, look, done).await.unwrap_or_else(|last| timed_out(what, patience, &last))
}

/// Fails the test: `what` did not happen within `patience`; `last` was seen last.
pub fn timed_out(what: &str, patience: Duration, last: &dyn Debug) -> ! {
    panic!("waited {patience:?} for {what}; last seen: {last:?}")
}

/// Fails unless `after` is about `bound`: not before 0.9 of it (a timer may round
/// down a little), not 2 s past it (a loaded machine is late, a bound never hit is
/// later still). For a timeout a test waits out: the time it took to end the wait.
pub fn assert_about(what: &str, after: Duration, bound: Duration) {
    assert!(after >= bound.mul_f64(0.9) && after <= bound + Duration::from_secs(2), "{what} after {after:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_at_the_look_that_shows_what_it_waits_for() {
        let mut looks = 0;
        let seen = until(
            "the third look",
            || {
                looks += 1;
                looks
            },
            |n| *n == 3,
        );
        assert_eq!(seen, 3);
    }

    #[test]
    #[should_panic(expected = "waited 50ms for a count of 4; last seen: 3")]
    fn a_wait_past_its_time_fails_naming_what_it_saw_last() {
        until_within(Duration::from_millis(50), "a count of 4", || 3, |n| *n == 4);
    }
}
