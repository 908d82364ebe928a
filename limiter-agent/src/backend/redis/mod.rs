//! The Redis side of every store (`proxy.store = "redis"`): state that holds across
//! every agent sharing the server, one file per store, each driven by its own Lua
//! script beside it (one atomic round trip per step). The in-memory stores of
//! `limiter_core` stay the reference: each answers as its memory counterpart does,
//! and its keys expire by themselves.
//!
//! - [`RedisStore`] (`limits.rs`): the limits' buckets, and escalation's rejection
//!   counts; keys `{prefix}limit:…` (`{prefix}log:…` for the sliding window log).
//! - [`RedisReplay`] (`replay.rs`): accepted signatures; keys `{prefix}replay:…`.
//! - [`RedisIdempotency`] and its [`RedisClaim`] (`idempotency.rs`): idempotent
//!   responses; keys `{prefix}idem:…`, `{prefix}idem-index:…`, `{prefix}idem-sizes:…`.
//!
//! The connection they share, and the fleet's own keys (heartbeats), are `fleet.rs`'s;
//! the escalated blocks the agents publish to one another are `escalation`'s.

mod idempotency;
mod limits;
mod replay;

pub use self::limits::{RedisStore, TimeSource};
pub(crate) use self::{
    idempotency::{RedisClaim, RedisIdempotency},
    replay::RedisReplay,
};
