//! The string to sign and the signature over it.
//!
//! Client (`limiter sign`) and server ([`super::Verifier`]) both build the string
//! here, so the two sides cannot drift apart.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// HMAC-SHA256, the only MAC the scheme uses.
pub type HmacSha256 = Hmac<Sha256>;

/// The request fields covered by the signature, each exactly as sent.
#[derive(Debug, Clone, Copy)]
pub struct Canonical<'a> {
    /// The method as sent (methods are case-sensitive, so it is not normalised).
    pub method: &'a str,
    /// The request target as sent: path and, if present, `?query`.
    pub target: &'a str,
    /// The `X-Timestamp` value as sent, not re-formatted, so that both sides sign the
    /// same bytes whatever the parser accepts.
    pub timestamp: &'a str,
    /// SHA-256 of the raw body (of the empty string when there is none).
    pub body_sha256: &'a [u8; 32],
    /// The `X-Nonce` value, only when the header was sent.
    pub nonce: Option<&'a str>,
    /// The `Idempotency-Key` value, only when the header was sent: signed, so that
    /// nobody can strip it or change it and have the upstream run the request again.
    pub idempotency_key: Option<&'a str>,
    /// The `Host` header as sent, for keys with `sign_host`; lowercased here.
    pub host: Option<&'a str>,
}

/// The line that announces the idempotency key on the line after it.
pub const IDEMPOTENCY_KEY_LABEL: &str = "idempotency-key";

impl Canonical<'_> {
    /// The string to sign: the fields joined by `\n`, without a trailing newline.
    ///
    /// After the four fixed lines come, each only when present and in this order: the
    /// nonce (one line), the idempotency key (two lines: [`IDEMPOTENCY_KEY_LABEL`], then
    /// the key) and the host (one line). No field can contain `\n` (methods are tokens,
    /// URIs and header values exclude control characters, the hash is hex), so the
    /// lines split back into the fields, and two different requests never produce the
    /// same string: whether the host is signed is fixed per key (`sign_host`), and the
    /// 0 to 3 lines left between the hash and the host say which of the others are
    /// there (an odd count: a nonce; two or more: an idempotency key). That is why the
    /// key takes two lines: on one line, a nonce `n` and a key `n` would sign alike.
    #[must_use]
    pub fn string_to_sign(&self) -> String {
        let idempotency = self.idempotency_key.map_or(0, |key| IDEMPOTENCY_KEY_LABEL.len() + 1 + key.len());
        let optional = self.nonce.map_or(0, str::len) + idempotency + self.host.map_or(0, str::len);
        let mut s =
            String::with_capacity(self.method.len() + self.target.len() + self.timestamp.len() + 64 + 6 + optional);
        s.push_str(self.method);
        s.push('\n');
        s.push_str(self.target);
        s.push('\n');
        s.push_str(self.timestamp);
        s.push('\n');
        s.push_str(&hex::encode(self.body_sha256));
        if let Some(nonce) = self.nonce {
            s.push('\n');
            s.push_str(nonce);
        }
        if let Some(key) = self.idempotency_key {
            s.push('\n');
            s.push_str(IDEMPOTENCY_KEY_LABEL);
            s.push('\n');
            s.push_str(key);
        }
        if let Some(host) = self.host {
            s.push('\n');
            s.push_str(&host.to_ascii_lowercase());
        }
        s
    }
}

/// SHA-256 of `data`.
#[must_use]
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// The signature a client sends: lowercase hex HMAC-SHA256(secret, string to sign).
#[must_use]
pub fn sign_hex(secret: &[u8], string_to_sign: &str) -> String {
    let mut mac = hmac_key(secret);
    mac.update(string_to_sign.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// HMAC state keyed with `secret`, ready to be cloned per message.
#[must_use]
pub fn hmac_key(secret: &[u8]) -> HmacSha256 {
    // HMAC hashes or pads keys of any length, so keying cannot fail; the trait only has
    // the fallible constructor because some MACs restrict key sizes.
    <HmacSha256 as hmac::digest::KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"))
}
