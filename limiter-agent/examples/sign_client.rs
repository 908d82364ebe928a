//! A minimal client for signed routes, as in the README: HMAC-SHA256 over the
//! string to sign with nothing but the `hmac`, `sha2` and `hex` crates.
//!
//! Prints the headers of the README's worked example, without and with `sign_host`,
//! and with an `Idempotency-Key`.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// What the signature covers besides the timestamp. `host` is the `Host` header to
/// send, for a key with `sign_host = true`.
struct Request<'a> {
    method: &'a str,
    target: &'a str,
    body: &'a [u8],
    nonce: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    host: Option<&'a str>,
}

/// `(X-Timestamp, X-Signature)` for `request` at `timestamp`.
fn sign(secret: &[u8], request: &Request<'_>, timestamp: u64) -> (String, String) {
    let timestamp = timestamp.to_string();
    let body_hash = hex::encode(Sha256::digest(request.body));
    let host = request.host.map(str::to_ascii_lowercase);
    let mut lines = vec![request.method, request.target, &timestamp, &body_hash];
    lines.extend(request.nonce);
    // Two lines, so that a key is never read as a nonce.
    if let Some(key) = request.idempotency_key {
        lines.extend(["idempotency-key", key]);
    }
    lines.extend(host.as_deref());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(lines.join("\n").as_bytes());
    (timestamp, hex::encode(mac.finalize().into_bytes()))
}

const TRANSFER: Request<'static> = Request {
    method: "POST",
    target: "/api/transfer?dry_run=1",
    body: br#"{"amount":100,"to":"acct-42"}"#,
    nonce: None,
    idempotency_key: None,
    host: None,
};

fn main() {
    let secret = b"k-free-1-secret";
    let (timestamp, signature) = sign(secret, &TRANSFER, 1_700_000_000);
    println!("X-API-Key: k-free-1\nX-Timestamp: {timestamp}\nX-Signature: {signature}");
    let (_, signature) = sign(secret, &Request { host: Some("Pay.Example.com"), ..TRANSFER }, 1_700_000_000);
    println!("with sign_host, for Host: pay.example.com\nX-Signature: {signature}");
    let (_, signature) = sign(secret, &Request { idempotency_key: Some("transfer-7731"), ..TRANSFER }, 1_700_000_000);
    println!("with Idempotency-Key: transfer-7731\nX-Signature: {signature}");
}

#[cfg(test)]
mod tests {
    use super::{Request, TRANSFER, sign};

    /// The README's worked examples, checked there with `openssl dgst`.
    #[test]
    fn signs_the_worked_example_without_and_with_the_host_and_an_idempotency_key() {
        let sign = |request| sign(b"k-free-1-secret", &request, 1_700_000_000).1;
        assert_eq!(sign(TRANSFER), "0a6176fce748b771768a0eccb4ee261c594e0dec5f7fc55b3df72276b7548094");
        assert_eq!(
            sign(Request { host: Some("Pay.Example.com"), ..TRANSFER }),
            "5dab4ae9ddad61b460bc600c72db8d2b30845da051105997bf289d217951a6e0"
        );
        assert_eq!(
            sign(Request { idempotency_key: Some("transfer-7731"), ..TRANSFER }),
            "ebf028f0ba8537c7629d2a1069b7fc38cb48b6f1ab1527a03adc62b2527e6a7a"
        );
        let everything = Request {
            nonce: Some("0123456789abcdef0123456789abcdef"),
            idempotency_key: Some("transfer-7731"),
            host: Some("pay.example.com"),
            ..TRANSFER
        };
        assert_eq!(sign(everything), "f740c692f679a609d803d951cc47b554ac75ff521c7461ad84f376e735a55f62");
    }
}
