//! The I/O around signed requests: reading a body once while hashing it, and
//! loading key secrets from their references. The scheme itself is
//! `limiter_core::signature`; the replay cache and the idempotency store in the
//! fleet's Redis are `backend`'s.

pub mod body;
pub mod secrets;

#[cfg(test)]
mod tests;

pub(crate) use body::{BodyError, read_body_hashed};
pub use secrets::{KeySecretError, KeySecrets, SecretError};
