//! Everything that crosses the boundary between the limiter XDP program and user space:
//! map names, keys and values, the settings record, counter indices, and the bucket
//! arithmetic the kernel runs and the host tests.
//!
//! Nothing here allocates. With the `user` feature the map types implement
//! [`aya::Pod`] so that user space can read and write them.
#![no_std]

pub mod addr;
pub mod bucket;
pub mod counters;
pub mod maps;

#[cfg(test)]
extern crate std;
