//! The limiter agent as a library: the `limiter` binary is a thin CLI over it, and
//! the integration tests drive it directly.

pub mod config;
pub mod xdp;
