//! (in progress)

pub mod sign;
