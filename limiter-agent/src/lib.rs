//! The limiter agent as a library: the `limiter` binary is a thin CLI over it, and
//! the integration tests drive it directly.

pub mod accept;
pub mod agent;
pub mod backend;
mod cli;
/// The agent's modules, its tests and the fuzz targets name the config `limiter::config`.
pub use limiter_config as config;
pub mod escalation;
pub mod fleet;
pub mod limits;
pub mod metrics;
pub mod proxy;
pub mod signature;
pub mod tls;
pub mod xdp;

pub use self::cli::main;
