//! Per-key request limits: one module per algorithm, each a pure function of a
//! [`LimitSpec`](crate::LimitSpec), a bucket's state and the time, and the
//! [`MemoryStore`] that keeps the buckets in memory (the agent keeps them in Redis
//! for a fleet, behind the same calls).
//!
//! Meanings every algorithm keeps (details in each module):
//! - `remaining` is always the number of requests that would pass back to back now
//!   (for a leaky-bucket shaper: places left in its queue); `reset_after` is the time
//!   until the bucket is back in full, which for the sliding window counter can reach
//!   two windows.
//! - A clock that steps back is read as standing still.
//! - A request takes its cost's units (`LimitSpec::cost`, one by default) in one
//!   step, or none if refused; a post-paid one takes none at admission and is charged
//!   later ([`MemoryStore::debit`]), which may leave the bucket in debt: `remaining`
//!   stays 0 until time has repaid it.
//! - A charge can be given back ([`MemoryStore::refund`], for a request whose answer
//!   a rule does not count): exactly for the windows and the log; for the GCRA
//!   buckets exactly when given back at once, else at most the time since the
//!   charge short of it (see `gcra`); never more than the request took.

pub mod bucket;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod outcome;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod store;
pub mod token_bucket;
mod window;

#[cfg(test)]
mod tests;

pub use self::{
    outcome::{Outcome, Quota},
    store::{Bucket, Charge, Debit, MemoryStore, Outcomes, Refund},
};
