//! A minimal client for signed routes, as in the README: HMAC-SHA256 over the
//! string to sign with nothing but the `hmac`, `sha2` and `hex` crates.
//!
//! Prints the headers of the README's worked example.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// `(X-Timestamp, X-Signature)` for a request.
fn sign(
    secret: &[u8],
    method: &str,
    target: &str,
    body: &[u8],
    timestamp: u64,
    nonce: Option<&str>,
) -> (String, String) {
    let timestamp = timestamp.to_string();
    let body_hash = hex::encode(Sha256::digest(body));
    let mut lines = vec![method, target, &timestamp, &body_hash];
    lines.extend(nonce);
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(lines.join("\n").as_bytes());
    (timestamp, hex::encode(mac.finalize().into_bytes()))
}

fn main() {
    let body = br#"{"amount":100,"to":"acct-42"}"#;
    let (timestamp, signature) = sign(b"k-free-1-secret", "POST", "/api/transfer?dry_run=1", body, 1_700_000_000, None);
    println!("X-API-Key: k-free-1\nX-Timestamp: {timestamp}\nX-Signature: {signature}");
}
