//! The errors of starting the proxy and of swapping its config.

use std::net::SocketAddr;

/// Why the proxy could not start or take a new config. A refused config leaves the
/// running one in place, whole.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("proxy.redis_url: {0}")]
    Store(#[from] crate::fleet::FleetError),
    #[error("proxy.decision_log.path: cannot open {path}: {source}")]
    DecisionLog {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("proxy.listen changed from {running} to {requested}: the agent must restart the proxy to move it")]
    ListenChanged { running: SocketAddr, requested: SocketAddr },
    #[error("cannot start proxy worker {worker}: {source}")]
    Worker {
        worker: usize,
        #[source]
        source: std::io::Error,
    },
}
