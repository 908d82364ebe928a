//! The helpers of limiter-agent's integration tests, one tree: Redis servers,
//! hand-built frames and unique names here; with the `agent` feature, what drives the
//! agent's own types (a running proxy and test upstream, the XDP program under test,
//! the agent process, the namespace lab around it). Each test gets its own names,
//! and everything is removed in `Drop`.

#[cfg(feature = "agent")]
pub mod agent;
pub mod frames;
#[cfg(feature = "agent")]
pub mod kernel;
#[cfg(feature = "agent")]
pub mod proxy;
pub mod redis;
pub mod tls;
#[cfg(feature = "agent")]
pub mod xdp_lab;

use std::sync::atomic::{AtomicU32, Ordering};

/// A name no other test (in this or a parallel test binary) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}{}x{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed))
}
