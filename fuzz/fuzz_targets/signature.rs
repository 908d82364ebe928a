//! Signed requests, read from a request written as text (a line `METHOD TARGET`,
//! header lines `name: value`, an empty line, the body), so that the seeds in
//! `fuzz/seeds/signature` are real signed requests the fuzzer mutates field by field:
//! an arbitrary request gets a verdict, never a panic; the same request signed with
//! the key's secret verifies exactly when its headers can carry it, and neither
//! another body nor the request without its `Idempotency-Key` does.

#![no_main]

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use limiter_core::signature::{
    Canonical, Failure, SignedRequest, Verifier, canonical::IDEMPOTENCY_KEY_LABEL, sha256, sign_hex,
};

const SECRET: &[u8] = b"fuzz-secret";
const NOW: u64 = 1_700_000_000;
const MAX_SKEW: Duration = Duration::from_secs(300);

struct Request<'a> {
    method: Method,
    target: &'a str,
    headers: HeaderMap,
    body: &'a [u8],
}

/// `None` where the text is no request: no first line of a method and a target.
fn parse(data: &[u8]) -> Option<Request<'_>> {
    let (head, body) = match data.windows(2).position(|pair| pair == b"\n\n") {
        Some(end) => (&data[..end], &data[end + 2..]),
        None => (data, &[][..]),
    };
    let mut lines = head.split(|&b| b == b'\n');
    let first = lines.next()?;
    let space = first.iter().position(|&b| b == b' ')?;
    let method = Method::from_bytes(&first[..space]).ok()?;
    let target = std::str::from_utf8(&first[space + 1..]).ok()?;
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let value = line[colon + 1..].strip_prefix(b" ").unwrap_or(&line[colon + 1..]);
        // Lines no header can carry are left out, as a server's parser refuses them.
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
    Some(Request { method, target, headers, body })
}

fuzz_target!(|data: &[u8]| {
    let Some(request) = parse(data) else {
        return;
    };
    let verifier = Verifier::new([("k".to_owned(), vec![SECRET.to_vec()])]);
    let body_sha256 = sha256(request.body);
    let as_sent = SignedRequest {
        method: &request.method,
        target: request.target,
        headers: &request.headers,
        body_sha256: &body_sha256,
    };
    let _ = verifier.authenticate(&as_sent, NOW, MAX_SKEW);

    // The same request signed properly: its timestamp where that is within the skew,
    // its nonce and idempotency key where it sent ones that are text.
    let timestamp = request
        .headers
        .get("x-timestamp")
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .filter(|sent| sent.abs_diff(NOW) < MAX_SKEW.as_secs())
        .unwrap_or(NOW)
        .to_string();
    let (Ok(nonce), Ok(idempotency_key)) =
        (text_header(&request.headers, "x-nonce"), text_header(&request.headers, "idempotency-key"))
    else {
        return;
    };
    let canonical = Canonical {
        method: request.method.as_str(),
        target: request.target,
        timestamp: &timestamp,
        body_sha256: &body_sha256,
        nonce,
        idempotency_key,
        // The key signs without the host, as keys do unless `sign_host` is set.
        host: None,
    };
    let string = canonical.string_to_sign();
    // Neither the target (one line) nor a header value holds a newline.
    let fields: Vec<&str> = string.split('\n').collect();
    let hash = hex::encode(body_sha256);
    let mut expected = vec![request.method.as_str(), request.target, timestamp.as_str(), hash.as_str()];
    expected.extend(nonce);
    if let Some(key) = idempotency_key {
        expected.extend([IDEMPOTENCY_KEY_LABEL, key]);
    }
    assert_eq!(fields, expected, "the string to sign does not split back into its fields");

    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("k"));
    let Ok(timestamp) = HeaderValue::from_str(&timestamp) else {
        panic!("digits are a header value");
    };
    headers.insert("x-timestamp", timestamp);
    let Ok(signature) = HeaderValue::from_str(&sign_hex(SECRET, &string)) else {
        panic!("a hex signature is a header value");
    };
    headers.insert("x-signature", signature);
    for name in ["x-nonce", "idempotency-key"] {
        if let Some(value) = request.headers.get(name) {
            headers.insert(name, value.clone());
        }
    }
    let signed = SignedRequest { headers: &headers, ..as_sent };
    // The nonce is read first, so it is the one named when both are unreadable.
    let unreadable = [("x-nonce", nonce), ("idempotency-key", idempotency_key)]
        .into_iter()
        .find(|(_, value)| value.is_some_and(|value| !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))))
        .map(|(name, _)| name);
    match (verifier.authenticate(&signed, NOW, MAX_SKEW), unreadable) {
        (Ok(authenticated), None) => assert_eq!(authenticated.key_id, "k"),
        (Err(failure), Some(name)) => assert_eq!(failure, Failure::MalformedHeader(name)),
        (outcome, unreadable) => panic!("{outcome:?} with unreadable header {unreadable:?}"),
    }
    let other_body = sha256(&[request.body, b"!"].concat());
    let tampered = SignedRequest { body_sha256: &other_body, ..signed };
    assert!(verifier.authenticate(&tampered, NOW, MAX_SKEW).is_err());
    if idempotency_key.is_some() {
        let mut stripped = headers.clone();
        stripped.remove("idempotency-key");
        let stripped = SignedRequest { headers: &stripped, ..signed };
        assert!(verifier.authenticate(&stripped, NOW, MAX_SKEW).is_err(), "the idempotency key is not signed");
    }
});

/// The value of `name` as UTF-8 (not necessarily a valid header string), `None` when
/// absent; `Err` where it is no text at all.
fn text_header<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, std::str::Utf8Error> {
    headers.get(name).map(|value| std::str::from_utf8(value.as_bytes())).transpose()
}
