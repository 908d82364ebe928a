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
    /// The `Host` header as sent, for keys with `sign_host`; lowercased here.
    pub host: Option<&'a str>,
}

impl Canonical<'_> {
    /// The string to sign: the fields joined by `\n`, without a trailing newline.
    ///
    /// No field can contain `\n` (methods are tokens, URIs and header values exclude
    /// control characters, the hash is hex) and the optional nonce and host come last,
    /// so two different requests never produce the same string: whether the host is
    /// signed is fixed per key (`sign_host`), so the line count tells whether a nonce is.
    #[must_use]
    pub fn string_to_sign(&self) -> String {
        let optional = self.nonce.map_or(0, str::len) + self.host.map_or(0, str::len);
        let mut s =
            String::with_capacity(self.method.len() + self.target.len() + self.timestamp.len() + 64 + 5 + optional);
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
