//! What runs limiter rather than ships in it:
//!
//! - [`netns`], [`traffic`]: a lab of network namespaces joined to the host by veth
//!   pairs, and bounded UDP traffic through them: what `cargo xtask demo`, the
//!   benchmarks and the end-to-end tests run the kernel layer against. Needs root;
//!   every name is the caller's, and everything is removed on drop.
//! - [`report`]: the benchmark report, written by the bench examples and read by
//!   `cargo xtask bench`.
//! - [`support`]: the helpers of limiter-agent's integration tests.
//!
//! xtask depends on this crate and is built before `cargo xtask setup` has installed
//! bpf-linker, so only the `agent` feature (which limiter-agent's tests turn on)
//! depends on limiter-agent, whose build compiles the eBPF program.

pub mod netns;
pub mod report;
pub mod support;
pub mod traffic;
