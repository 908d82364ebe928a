//! Exists so that `limiter-agent` can name this crate as a build dependency, which
//! makes cargo rebuild the agent when the program changes.
#![no_std]
