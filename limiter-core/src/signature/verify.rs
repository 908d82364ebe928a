//! Verification of signed requests.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use hmac::Mac;
use http::{HeaderMap, HeaderValue, Method};
use subtle::{Choice, ConstantTimeEq};

use super::canonical::{Canonical, HmacSha256, hmac_key};
use super::idempotency::IDEMPOTENCY_KEY_HEADER;
use super::replay::ReplayError;

/// The header carrying the key id.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The header carrying the unix-seconds timestamp.
pub const TIMESTAMP_HEADER: &str = "x-timestamp";
/// The header carrying the lowercase hex signature.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// The optional nonce header.
pub const NONCE_HEADER: &str = "x-nonce";
/// The header a `sign_host` key's signature also covers.
pub const HOST_HEADER: &str = "host";

/// Longest accepted timestamp: `u64::MAX` has 20 digits, and a bound keeps parsing
/// trivially cheap whatever a client sends.
const MAX_TIMESTAMP_DIGITS: usize = 20;

/// The parts of a request the signature covers.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The request target as received: path and, if present, `?query`.
    pub target: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// SHA-256 of the body bytes that will be forwarded (the agent reads and hashes it in one pass).
    pub body_sha256: &'a [u8; 32],
}

impl From<ReplayError> for Failure {
    fn from(error: ReplayError) -> Self {
        match error {
            ReplayError::Replay => Self::Replay,
            ReplayError::Full => Self::ReplayCacheFull,
        }
    }
}

/// A request whose signature verified and which was not a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The key that signed the request.
    pub key_id: String,
    /// The signed timestamp (unix seconds).
    pub timestamp: u64,
}

/// A request whose signature verified, before the replay check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The key that signed the request.
    pub key_id: String,
    /// The signed timestamp (unix seconds).
    pub timestamp: u64,
    /// The MAC, what the replay check remembers.
    pub signature: [u8; 32],
}

/// Why a signed request was refused. The HTTP layer answers every variant with the same
/// 401 body; the variants exist for metrics and logs only.
///
/// An unknown key id and a wrong MAC are deliberately the same variant ([`Failure::BadMac`]),
/// so not even internal code can tell them apart by accident.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// A required signature header is absent.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A signature header was sent more than once; which copy to trust would be ambiguous.
    #[error("header {0} sent more than once")]
    DuplicateHeader(&'static str),
    /// A header value is not visible ASCII.
    #[error("header {0} is not visible ASCII")]
    MalformedHeader(&'static str),
    /// The timestamp is not a plain unsigned decimal number.
    #[error("timestamp is not unix seconds")]
    BadTimestamp,
    /// The timestamp is further than `max_skew` from the wall clock.
    #[error("timestamp {timestamp} is more than {max_skew_secs} s from now ({now})")]
    Skew {
        /// The signed timestamp.
        timestamp: u64,
        /// The wall clock at verification.
        now: u64,
        /// The allowed distance.
        max_skew_secs: u64,
    },
    /// The signature is not 64 lowercase hex characters.
    #[error("signature is not 64 lowercase hex characters")]
    BadSignatureFormat,
    /// No secret of the key produced this signature, or the key id is unknown.
    #[error("signature does not verify")]
    BadMac,
    /// The signature was already accepted within its validity window.
    #[error("signature already used")]
    Replay,
    /// The replay cache is full of live entries; refused rather than accepted unrecorded.
    #[error("replay cache full")]
    ReplayCacheFull,
}

/// A [`Failure`] without its details: the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// See [`Failure::MissingHeader`].
    MissingHeader,
    /// See [`Failure::DuplicateHeader`].
    DuplicateHeader,
    /// See [`Failure::MalformedHeader`].
    MalformedHeader,
    /// See [`Failure::BadTimestamp`].
    BadTimestamp,
    /// See [`Failure::Skew`].
    Skew,
    /// See [`Failure::BadSignatureFormat`].
    BadSignatureFormat,
    /// See [`Failure::BadMac`]; also an unknown key id.
    BadMac,
    /// See [`Failure::Replay`].
    Replay,
    /// See [`Failure::ReplayCacheFull`].
    ReplayCacheFull,
}

impl FailureReason {
    /// Every reason, for pre-registering metric label values.
    pub const ALL: [Self; 9] = [
        Self::MissingHeader,
        Self::DuplicateHeader,
        Self::MalformedHeader,
        Self::BadTimestamp,
        Self::Skew,
        Self::BadSignatureFormat,
        Self::BadMac,
        Self::Replay,
        Self::ReplayCacheFull,
    ];

    /// The label value, in snake case.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MissingHeader => "missing_header",
            Self::DuplicateHeader => "duplicate_header",
            Self::MalformedHeader => "malformed_header",
            Self::BadTimestamp => "bad_timestamp",
            Self::Skew => "skew",
            Self::BadSignatureFormat => "bad_signature_format",
            Self::BadMac => "bad_mac",
            Self::Replay => "replay",
            Self::ReplayCacheFull => "replay_cache_full",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Failure {
    /// The metrics label for this failure.
    #[must_use]
    pub const fn reason(&self) -> FailureReason {
        match self {
            Self::MissingHeader(_) => FailureReason::MissingHeader,
            Self::DuplicateHeader(_) => FailureReason::DuplicateHeader,
            Self::MalformedHeader(_) => FailureReason::MalformedHeader,
            Self::BadTimestamp => FailureReason::BadTimestamp,
            Self::Skew { .. } => FailureReason::Skew,
            Self::BadSignatureFormat => FailureReason::BadSignatureFormat,
            Self::BadMac => FailureReason::BadMac,
            Self::Replay => FailureReason::Replay,
            Self::ReplayCacheFull => FailureReason::ReplayCacheFull,
        }
    }

    /// Whether this is a replay (counted separately from other failures in `limiter stats`).
    #[must_use]
    pub const fn is_replay(&self) -> bool {
        matches!(self, Self::Replay)
    }
}

/// Verifies signed requests against the configured keys.
///
/// Built once per configuration. It does not remember signatures: the caller records
/// each [`Authenticated`] signature in a replay cache that outlives reloads
/// ([`super::ReplayCache`] or the fleet's), so that a reload cannot reopen the replay
/// window.
pub struct Verifier {
    keys: HashMap<String, KeyState>,
    /// Stands in for the secrets of an unknown key, and pads keys with fewer secrets.
    dummy: HmacSha256,
    /// HMACs computed per request, whatever the key: the largest number of secrets any
    /// key has. Every verification does exactly this much work, so timing reveals
    /// neither whether a key exists nor how many secrets it has.
    slots: usize,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Key ids and counts only: the HMAC states are derived from the secrets.
        f.debug_struct("Verifier").field("keys", &self.keys.len()).field("slots", &self.slots).finish_non_exhaustive()
    }
}

/// One key as the verifier needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SigningKey {
    /// The secrets, several during a rotation.
    pub secrets: Vec<Vec<u8>>,
    /// The string to sign ends with the lowercase `Host` (see [`Canonical::host`]).
    pub sign_host: bool,
}

impl From<Vec<Vec<u8>>> for SigningKey {
    fn from(secrets: Vec<Vec<u8>>) -> Self {
        Self { secrets, sign_host: false }
    }
}

/// A key's precomputed HMAC states.
struct KeyState {
    secrets: Vec<HmacSha256>,
    sign_host: bool,
}

impl Verifier {
    /// Precomputes the HMAC key state of every secret.
    ///
    /// `keys` maps key id to its secrets (several during a rotation). A key with no
    /// secrets never verifies; configuration validation is expected to reject it.
    pub fn new<I, K>(keys: I) -> Self
    where
        I: IntoIterator<Item = (String, K)>,
        K: Into<SigningKey>,
    {
        let keys: HashMap<String, KeyState> = keys
            .into_iter()
            .map(|(id, key)| {
                let SigningKey { secrets, sign_host } = key.into();
                (id, KeyState { secrets: secrets.iter().map(|s| hmac_key(s)).collect(), sign_host })
            })
            .collect();
        let slots = keys.values().map(|key| key.secrets.len()).max().unwrap_or(0).max(1);
        // The dummy's outcome is always discarded, so its key need not be secret.
        let dummy = hmac_key(b"limiter: no such key");
        Self { keys, dummy, slots }
    }

    /// Checks one request's headers, timestamp window and MAC. `now` is the wall
    /// clock in unix seconds; `max_skew` is the allowed distance either way. The
    /// replay check is the caller's: record [`Authenticated::signature`] as used.
    pub fn authenticate(
        &self,
        req: &SignedRequest<'_>,
        now: u64,
        max_skew: Duration,
    ) -> Result<Authenticated, Failure> {
        let key_id = header_str(req.headers, API_KEY_HEADER)?.ok_or(Failure::MissingHeader(API_KEY_HEADER))?;
        let timestamp_raw =
            header_str(req.headers, TIMESTAMP_HEADER)?.ok_or(Failure::MissingHeader(TIMESTAMP_HEADER))?;
        let signature_raw =
            header_str(req.headers, SIGNATURE_HEADER)?.ok_or(Failure::MissingHeader(SIGNATURE_HEADER))?;
        let nonce = header_str(req.headers, NONCE_HEADER)?;
        let idempotency_key = header_str(req.headers, IDEMPOTENCY_KEY_HEADER)?;

        let timestamp = parse_timestamp(timestamp_raw)?;
        let max_skew_secs = max_skew.as_secs();
        if timestamp.abs_diff(now) > max_skew_secs {
            return Err(Failure::Skew { timestamp, now, max_skew_secs });
        }
        let signature = parse_signature(signature_raw)?;
        let key = self.keys.get(key_id);
        let host = match key {
            Some(key) if key.sign_host => {
                Some(header_str(req.headers, HOST_HEADER)?.ok_or(Failure::MissingHeader(HOST_HEADER))?)
            }
            _ => None,
        };

        let message = Canonical {
            method: req.method.as_str(),
            target: req.target,
            timestamp: timestamp_raw,
            body_sha256: req.body_sha256,
            nonce,
            idempotency_key,
            host,
        }
        .string_to_sign();
        if !bool::from(self.mac_matches(key, message.as_bytes(), &signature)) {
            return Err(Failure::BadMac);
        }

        Ok(Authenticated { key_id: key_id.to_owned(), timestamp, signature })
    }

    /// Whether any secret of `key` produced `signature`, doing the same work for an
    /// unknown key, a key with fewer secrets, and a match in any position.
    fn mac_matches(&self, key: Option<&KeyState>, message: &[u8], signature: &[u8; 32]) -> Choice {
        let secrets = key.map_or(&[][..], |key| key.secrets.as_slice());
        let mut matched = Choice::from(0);
        for slot in 0..self.slots {
            let (state, real) = match secrets.get(slot) {
                Some(state) => (state, Choice::from(1)),
                None => (&self.dummy, Choice::from(0)),
            };
            let mut mac = state.clone();
            mac.update(message);
            let tag = mac.finalize().into_bytes();
            matched |= tag.as_slice().ct_eq(signature) & real;
        }
        matched
    }
}

/// The single value of `name`, `None` when absent. Several values are refused rather
/// than picking one: a proxy in front could otherwise verify one copy while the
/// upstream reads another.
fn header_str<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<Option<&'h str>, Failure> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Failure::DuplicateHeader(name));
    }
    HeaderValue::to_str(value).map(Some).map_err(|_| Failure::MalformedHeader(name))
}

/// Plain decimal digits only: `u64::from_str` would also take a leading `+`, which the
/// contract does not describe.
fn parse_timestamp(raw: &str) -> Result<u64, Failure> {
    if raw.is_empty() || raw.len() > MAX_TIMESTAMP_DIGITS || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Failure::BadTimestamp);
    }
    raw.parse().map_err(|_| Failure::BadTimestamp)
}

/// Exactly 64 lowercase hex characters. Uppercase is refused so that each MAC has one
/// spelling, and the replay cache cannot be bypassed by changing case.
fn parse_signature(raw: &str) -> Result<[u8; 32], Failure> {
    let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if raw.len() != 64 || !raw.bytes().all(lower_hex) {
        return Err(Failure::BadSignatureFormat);
    }
    let mut out = [0; 32];
    hex::decode_to_slice(raw, &mut out).map_err(|_| Failure::BadSignatureFormat)?;
    Ok(out)
}
