//! What every accept loop (proxy, admin socket, metrics) does when `accept` fails.

use std::{io, time::Duration};

/// Out of file descriptors, `accept` fails again at once until some connection
/// closes; without a pause the loop would spin on a core and starve the tasks that
/// would close them.
const BACKOFF: Duration = Duration::from_millis(50);

/// Logs a failed accept and, when the process or system is out of descriptors or
/// memory, waits before the next one. Other failures (a client that reset before
/// it was accepted) concern that client only, so the loop goes on at once.
pub async fn backoff(listener: &str, error: &io::Error) {
    let exhausted = matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
    if exhausted {
        tracing::warn!(%error, listener, "accept failed; pausing");
        tokio::time::sleep(BACKOFF).await;
    } else {
        tracing::debug!(%error, listener, "accept failed");
    }
}
