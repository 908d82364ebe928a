//! A lab of network namespaces joined to the host by veth pairs, and bounded UDP
//! traffic through them: what `cargo xtask demo`, the benchmarks and the end-to-end
//! tests run the kernel layer against. Needs root; every name is the caller's, and
//! everything is removed on drop.

pub mod netns;
pub mod traffic;
