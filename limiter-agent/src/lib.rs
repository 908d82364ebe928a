//! The limiter agent as a library: the `limiter` binary is a thin CLI over it, and
//! the integration tests drive it directly.

pub(crate) mod accept;
pub(crate) mod agent;
pub(crate) mod appender;
pub mod backend;
mod cli;
/// The agent's modules, its tests and the fuzz targets name the config `limiter::config`.
pub use limiter_config as config;
pub mod escalation;
pub mod fleet;
pub(crate) mod limits;
pub mod metrics;
pub mod proxy;
pub mod security_log;
pub mod signature;
pub(crate) mod tls;
pub mod xdp;

pub use self::cli::main;
