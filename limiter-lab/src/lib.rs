//! What runs limiter rather than ships in it: the benchmark report types, written by
//! the bench examples and read by `cargo xtask bench`.

pub mod report;
