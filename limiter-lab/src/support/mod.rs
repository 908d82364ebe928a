//! The helpers of limiter-agent's integration tests, one tree: Redis servers,
//! hand-built frames and unique names here; with the `agent` feature, what drives the
//! agent's own types (a running proxy and test upstream, the XDP program under test,
//! the agent process, the namespace lab around it, waiting for what they count). Each test gets its own names,
//! and everything is removed in `Drop`.

#[cfg(feature = "agent")]
pub mod agent;
pub mod frames;
pub mod ja4;
#[cfg(feature = "agent")]
pub mod kernel;
#[cfg(feature = "agent")]
pub mod proxy;
pub mod redis;
pub mod tls;
pub mod wait;
#[cfg(feature = "agent")]
pub mod xdp_lab;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

/// The python3 that imports Debian's `websockets`: `cargo xtask test`
/// names it, as the one on PATH may be a build that cannot see it.
#[must_use]
pub fn python() -> PathBuf {
    std::env::var_os("LIMITER_TEST_PYTHON").map_or_else(|| PathBuf::from("/usr/bin/python3"), PathBuf::from)
}

/// A free port on the loopback.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A name no other test (in this or a parallel test binary) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}{}x{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed))
}
