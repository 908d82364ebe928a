//! Signed requests: HMAC-SHA256 verification, replay
//! protection, idempotency keys, and the pieces `limiter sign` shares with the proxy.
//! Reading the body and loading secrets are I/O, so they live in the agent.
//!
//! # The scheme
//!
//! A client holding the secret of key `K` sends `X-API-Key: K`, `X-Timestamp` (unix
//! seconds), optionally `X-Nonce` and `Idempotency-Key`, and `X-Signature`: the
//! lowercase hex HMAC-SHA256(secret, string to sign), where the string to sign is these
//! lines joined by `\n`, without a trailing newline:
//!
//! ```text
//! METHOD
//! request target as sent (path and ?query)
//! TIMESTAMP as sent
//! lowercase hex SHA-256 of the raw body (of "" when there is none)
//! NONCE, only when X-Nonce is sent
//! idempotency-key, then the KEY as sent: two lines, only when Idempotency-Key is sent
//! HOST lowercased, only for keys with sign_host
//! ```
//!
//! [`Canonical::string_to_sign`] says why no two requests sign the same string.
//!
//! Worked example, reproducible with standard tools (also a test vector in `tests`):
//!
//! ```text
//! $ printf '%s' '{"amount":100,"to":"acct-42"}' | sha256sum
//! ee0885070ca8ca1ff7df3e53275c4cadb3fbf747f3e0ea380a002f8c69ab8e9d  -
//! $ printf 'POST\n/api/transfer?dry_run=1\n1700000000\nee0885070ca8ca1ff7df3e53275c4cadb3fbf747f3e0ea380a002f8c69ab8e9d' \
//!     | openssl dgst -sha256 -hmac 'k-free-1-secret'
//! SHA2-256(stdin)= 0a6176fce748b771768a0eccb4ee261c594e0dec5f7fc55b3df72276b7548094
//! ```
//!
//! # How the proxy uses this module
//!
//! 1. The agent reads the body up to `max_body_bytes` (else 413), giving the bytes to
//!    forward and their SHA-256.
//! 2. [`Verifier::authenticate`] checks headers, timestamp window and MAC (constant
//!    time, any of the key's secrets); the agent then records the signature in a
//!    replay cache ([`ReplayCache`] in memory, or the fleet's), where it stays
//!    whatever the limits and the idempotency store then answer. Every [`Failure`]
//!    gets the same 401; [`Failure::reason`] is the metrics label.
//! 3. For [`idempotency::applies_to`] methods with an `Idempotency-Key`,
//!    [`IdempotencyStore::begin`] decides between forwarding (then
//!    [`idempotency::Guard::complete`]), replaying a stored response, 422, 409 or 503.
//!
//! Secrets come from `file:`/`env:` references the agent loads, and each secret's
//! HMAC key state is computed once, when the [`Verifier`] is built.

pub mod canonical;
pub mod idempotency;
pub mod replay;
pub mod verify;

#[cfg(test)]
mod tests;

pub use canonical::{Canonical, sha256, sign_hex};
pub use idempotency::{Begin, Guard, IdempotencyConfig, IdempotencyStore, StoredResponse};
pub use replay::{ReplayCache, ReplayError};
pub use verify::{Authenticated, Failure, FailureReason, SignedRequest, SigningKey, Verified, Verifier};

/// `capacity` shared equally among `keys` key ids, at least 1 each: the bound of one
/// key id in the replay cache and the idempotency store, so that no tenant can fill
/// what another needs.
#[must_use]
pub fn share(capacity: usize, keys: usize) -> usize {
    (capacity / keys.max(1)).max(1)
}
