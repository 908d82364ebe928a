//! The I/O around signed requests: reading a body once while hashing it, loading
//! key secrets from their references, and the replay cache and idempotency store in
//! the fleet's Redis. The scheme itself is `limiter_core::signature`.

pub mod body;
pub mod secrets;
pub mod shared;

#[cfg(test)]
mod tests;

pub(crate) use body::{BodyError, read_body_hashed};
pub use secrets::{KeySecretError, KeySecrets, SecretError};
pub use shared::{SharedGuard, SharedIdempotency, SharedReplay};
