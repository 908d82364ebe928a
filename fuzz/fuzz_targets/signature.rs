//! Signature headers and the string to sign over arbitrary requests: arbitrary
//! headers get a verdict, never a panic; a request signed with the key's secret
//! verifies exactly when its headers can carry it, and another body does not.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use limiter_core::signature::{Canonical, Failure, SignedRequest, Verifier, sha256, sign_hex};

/// The signature headers, and one it ignores.
const NAMES: [&str; 5] = ["x-api-key", "x-timestamp", "x-signature", "x-nonce", "x-other"];
const SECRET: &[u8] = b"fuzz-secret";
const NOW: u64 = 1_700_000_000;
const MAX_SKEW: Duration = Duration::from_secs(300);

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    method: &'a [u8],
    target: &'a str,
    headers: Vec<(u8, &'a [u8])>,
    body: &'a [u8],
    /// Seconds from now, within the allowed skew once reduced.
    skew: i16,
    nonce: Option<&'a str>,
}

fuzz_target!(|input: Input<'_>| {
    let Ok(method) = Method::from_bytes(input.method) else {
        return;
    };
    let verifier = Verifier::new([("k".to_owned(), vec![SECRET.to_vec()])]);
    let body_sha256 = sha256(input.body);

    let mut headers = HeaderMap::new();
    for (name, value) in &input.headers {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(NAMES[usize::from(*name) % NAMES.len()], value);
        }
    }
    let arbitrary =
        SignedRequest { method: &method, target: input.target, headers: &headers, body_sha256: &body_sha256 };
    let _ = verifier.authenticate(&arbitrary, NOW, MAX_SKEW);

    let timestamp = NOW.saturating_add_signed(i64::from(input.skew % 300)).to_string();
    let canonical = Canonical {
        method: method.as_str(),
        target: input.target,
        timestamp: &timestamp,
        body_sha256: &body_sha256,
        nonce: input.nonce,
        // The key signs without the host, as keys do unless `sign_host` is set.
        host: None,
    };
    let string = canonical.string_to_sign();
    if !input.target.contains('\n') && input.nonce.is_none_or(|nonce| !nonce.contains('\n')) {
        let fields: Vec<&str> = string.split('\n').collect();
        let hash = hex::encode(body_sha256);
        let mut expected = vec![method.as_str(), input.target, timestamp.as_str(), hash.as_str()];
        expected.extend(input.nonce);
        assert_eq!(fields, expected, "the string to sign does not split back into its fields");
    }

    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("k"));
    headers.insert("x-timestamp", HeaderValue::from(NOW.saturating_add_signed(i64::from(input.skew % 300))));
    let Ok(signature) = HeaderValue::from_str(&sign_hex(SECRET, &string)) else {
        panic!("a hex signature is a header value");
    };
    headers.insert("x-signature", signature);
    if let Some(nonce) = input.nonce {
        let Ok(value) = HeaderValue::from_str(nonce) else {
            return;
        };
        headers.insert("x-nonce", value);
    }
    let signed = SignedRequest { headers: &headers, ..arbitrary };
    let visible_nonce = input.nonce.is_none_or(|nonce| nonce.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)));
    match verifier.authenticate(&signed, NOW, MAX_SKEW) {
        Ok(authenticated) => assert!(visible_nonce && authenticated.key_id == "k"),
        Err(failure) => assert!(!visible_nonce && failure == Failure::MalformedHeader("x-nonce"), "{failure}"),
    }
    let other_body = sha256(&[input.body, b"!"].concat());
    let tampered = SignedRequest { body_sha256: &other_body, ..signed };
    assert!(verifier.authenticate(&tampered, NOW, MAX_SKEW).is_err());
});
