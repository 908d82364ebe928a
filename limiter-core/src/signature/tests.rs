#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use std::io::Write as _;
use std::process::{Command, Stdio};

use http::{HeaderMap, HeaderValue, Method};

use super::canonical::{Canonical, sha256, sign_hex};

/// Hex SHA-256 of the empty string (FIPS 180-2 example, `sha256sum /dev/null`).
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Runs `openssl dgst -sha256 [extra]` over `input`; returns the hex digest.
fn openssl_dgst(extra: &[&str], input: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl must be installed for the known-answer tests");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl failed");
    // `-r` prints "HEX *stdin".
    String::from_utf8(out.stdout).unwrap().split(' ').next().unwrap().to_owned()
}

fn openssl_sha256(data: &[u8]) -> String {
    openssl_dgst(&[], data)
}

fn openssl_hmac(key: &str, message: &[u8]) -> String {
    openssl_dgst(&["-hmac", key], message)
}

/// The string to sign assembled independently of `Canonical`, as the contract words it.
fn contract_string(method: &str, target: &str, ts: &str, body: &[u8], nonce: Option<&str>) -> String {
    let mut lines = vec![method.to_owned(), target.to_owned(), ts.to_owned(), openssl_sha256(body)];
    lines.extend(nonce.map(str::to_owned));
    lines.join("\n")
}

fn signed_headers(
    key_id: &str,
    secret: &[u8],
    method: &Method,
    target: &str,
    ts: &str,
    body: &[u8],
    nonce: Option<&str>,
) -> HeaderMap {
    let digest = sha256(body);
    let message = Canonical {
        method: method.as_str(),
        target,
        timestamp: ts,
        body_sha256: &digest,
        nonce,
        idempotency_key: None,
        host: None,
    }
    .string_to_sign();
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_str(key_id).unwrap());
    headers.insert("x-timestamp", HeaderValue::from_str(ts).unwrap());
    headers.insert("x-signature", HeaderValue::from_str(&sign_hex(secret, &message)).unwrap());
    if let Some(nonce) = nonce {
        headers.insert("x-nonce", HeaderValue::from_str(nonce).unwrap());
    }
    headers
}

mod canonical {
    use proptest::prelude::*;

    use super::*;
    use crate::signature::canonical::IDEMPOTENCY_KEY_LABEL;

    /// Fixed vector, derived with:
    ///
    /// ```text
    /// printf '%s' '{"amount":100,"to":"acct-42"}' | sha256sum
    ///   -> ee0885070ca8ca1ff7df3e53275c4cadb3fbf747f3e0ea380a002f8c69ab8e9d
    /// printf 'POST\n/api/transfer?dry_run=1\n1700000000\nee08…8e9d' \
    ///   | openssl dgst -sha256 -hmac 'k-free-1-secret'
    ///   -> 0a6176fce748b771768a0eccb4ee261c594e0dec5f7fc55b3df72276b7548094
    /// (same with '\n0123456789abcdef0123456789abcdef' appended as the nonce)
    ///   -> 753967b100cc93dfe972e8dc08c51069d5870ae1b921602765588d43fd1c5668
    /// ```
    #[test]
    fn fixed_vector() {
        let body = br#"{"amount":100,"to":"acct-42"}"#;
        let digest = sha256(body);
        assert_eq!(hex::encode(digest), "ee0885070ca8ca1ff7df3e53275c4cadb3fbf747f3e0ea380a002f8c69ab8e9d");
        let mut c = Canonical {
            method: "POST",
            target: "/api/transfer?dry_run=1",
            timestamp: "1700000000",
            body_sha256: &digest,
            nonce: None,
            idempotency_key: None,
            host: None,
        };
        assert_eq!(
            c.string_to_sign(),
            "POST\n/api/transfer?dry_run=1\n1700000000\nee0885070ca8ca1ff7df3e53275c4cadb3fbf747f3e0ea380a002f8c69ab8e9d"
        );
        assert_eq!(
            sign_hex(b"k-free-1-secret", &c.string_to_sign()),
            "0a6176fce748b771768a0eccb4ee261c594e0dec5f7fc55b3df72276b7548094"
        );
        // The README's sign_host example.
        let with_host = Canonical { host: Some("Pay.Example.com"), ..c };
        assert_eq!(
            sign_hex(b"k-free-1-secret", &with_host.string_to_sign()),
            "5dab4ae9ddad61b460bc600c72db8d2b30845da051105997bf289d217951a6e0"
        );
        c.nonce = Some("0123456789abcdef0123456789abcdef");
        assert_eq!(
            sign_hex(b"k-free-1-secret", &c.string_to_sign()),
            "753967b100cc93dfe972e8dc08c51069d5870ae1b921602765588d43fd1c5668"
        );
    }

    #[test]
    fn empty_body_hash() {
        assert_eq!(hex::encode(sha256(b"")), EMPTY_SHA256);
        assert_eq!(openssl_sha256(b""), EMPTY_SHA256);
    }

    /// Each case is signed by this crate and by `openssl dgst -hmac` over a string built
    /// independently from the contract.
    #[test]
    fn matches_openssl() {
        // (method, target, timestamp, body, nonce, key)
        type Case<'a> = (&'a str, &'a str, &'a str, &'a [u8], Option<&'a str>, &'a str);
        let cases: &[Case<'_>] = &[
            ("GET", "/", "0", b"", None, "k"),
            ("POST", "/api/transfer", "1700000000", b"amount=5", None, "s3cret"),
            ("PUT", "/a/b?x=1&y=%20z", "1712345678", b"\x00\x01\xff binary\n", Some("n-1"), "rotated secret"),
            ("DELETE", "/items/7?", "99", b"", Some(""), "k"),
            ("PATCH", "/p?q", "1700000001", &[b'x'; 70_000], Some("abc"), "long body key"),
        ];
        for &(method, target, ts, body, nonce, key) in cases {
            let digest = sha256(body);
            assert_eq!(hex::encode(digest), openssl_sha256(body));
            let ours = Canonical {
                method,
                target,
                timestamp: ts,
                body_sha256: &digest,
                nonce,
                idempotency_key: None,
                host: None,
            }
            .string_to_sign();
            let theirs = contract_string(method, target, ts, body, nonce);
            assert_eq!(ours, theirs);
            assert!(!ours.ends_with('\n') || nonce == Some(""));
            assert_eq!(sign_hex(key.as_bytes(), &ours), openssl_hmac(key, theirs.as_bytes()), "{method} {target}");
        }
    }

    #[test]
    fn host_line_last_and_lowercase() {
        let d = sha256(b"");
        let base = Canonical {
            method: "GET",
            target: "/",
            timestamp: "1",
            body_sha256: &d,
            nonce: None,
            idempotency_key: None,
            host: None,
        };
        let with = Canonical { nonce: Some("n"), host: Some("API.Example.com:8443"), ..base };
        assert_eq!(with.string_to_sign(), format!("GET\n/\n1\n{EMPTY_SHA256}\nn\napi.example.com:8443"));
    }

    #[test]
    fn nonce_line_only_when_sent() {
        let d = sha256(b"");
        let base = Canonical {
            method: "GET",
            target: "/",
            timestamp: "1",
            body_sha256: &d,
            nonce: None,
            idempotency_key: None,
            host: None,
        };
        assert_eq!(base.string_to_sign().lines().count(), 4);
        let with = Canonical { nonce: Some("n"), ..base };
        assert_eq!(with.string_to_sign(), format!("GET\n/\n1\n{EMPTY_SHA256}\nn"));
    }

    /// The README's worked example with `Idempotency-Key: transfer-7731`, and with a
    /// nonce and a `sign_host` host as well, derived with:
    ///
    /// ```text
    /// printf 'POST\n/api/transfer?dry_run=1\n1700000000\nee08…8e9d\nidempotency-key\ntransfer-7731' \
    ///   | openssl dgst -sha256 -hmac 'k-free-1-secret'
    ///   -> ebf028f0ba8537c7629d2a1069b7fc38cb48b6f1ab1527a03adc62b2527e6a7a
    /// printf '…8e9d\n0123456789abcdef0123456789abcdef\nidempotency-key\ntransfer-7731\npay.example.com' | …
    ///   -> f740c692f679a609d803d951cc47b554ac75ff521c7461ad84f376e735a55f62
    /// ```
    #[test]
    fn idempotency_key_vector_after_the_nonce_before_the_host() {
        let digest = sha256(br#"{"amount":100,"to":"acct-42"}"#);
        let c = Canonical {
            method: "POST",
            target: "/api/transfer?dry_run=1",
            timestamp: "1700000000",
            body_sha256: &digest,
            nonce: None,
            idempotency_key: Some("transfer-7731"),
            host: None,
        };
        let hash = hex::encode(digest);
        assert_eq!(
            c.string_to_sign(),
            format!("POST\n/api/transfer?dry_run=1\n1700000000\n{hash}\nidempotency-key\ntransfer-7731")
        );
        assert_eq!(
            sign_hex(b"k-free-1-secret", &c.string_to_sign()),
            "ebf028f0ba8537c7629d2a1069b7fc38cb48b6f1ab1527a03adc62b2527e6a7a"
        );
        let everything =
            Canonical { nonce: Some("0123456789abcdef0123456789abcdef"), host: Some("Pay.Example.com"), ..c };
        let string = everything.string_to_sign();
        assert_eq!(
            string.split('\n').skip(4).collect::<Vec<_>>(),
            ["0123456789abcdef0123456789abcdef", IDEMPOTENCY_KEY_LABEL, "transfer-7731", "pay.example.com"]
        );
        assert_eq!(sign_hex(b"k-free-1-secret", &string), openssl_hmac("k-free-1-secret", string.as_bytes()));
        assert_eq!(
            sign_hex(b"k-free-1-secret", &string),
            "f740c692f679a609d803d951cc47b554ac75ff521c7461ad84f376e735a55f62"
        );
    }

    /// The fields of a request, as a verifier reads them back from a string to sign.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Fields {
        method: String,
        target: String,
        timestamp: String,
        body_sha256: [u8; 32],
        nonce: Option<String>,
        idempotency_key: Option<String>,
        /// Lowercase, as signed.
        host: Option<String>,
    }

    impl Fields {
        fn string_to_sign(&self) -> String {
            Canonical {
                method: &self.method,
                target: &self.target,
                timestamp: &self.timestamp,
                body_sha256: &self.body_sha256,
                nonce: self.nonce.as_deref(),
                idempotency_key: self.idempotency_key.as_deref(),
                host: self.host.as_deref(),
            }
            .string_to_sign()
        }
    }

    /// Reads `string` back by the documented rule alone: four fixed lines, the host
    /// last when the key signs it, and between them 0 to 3 lines, an odd count
    /// starting with the nonce, two or more ending with the label and the key.
    fn read_back(string: &str, sign_host: bool) -> Option<Fields> {
        let mut lines: Vec<&str> = string.split('\n').collect();
        if lines.len() < 4 + usize::from(sign_host) {
            return None;
        }
        let host = if sign_host { lines.pop().map(str::to_owned) } else { None };
        let optional = lines.split_off(4);
        let (nonce, idempotency_key) = match optional.as_slice() {
            [] => (None, None),
            [nonce] => (Some(*nonce), None),
            [IDEMPOTENCY_KEY_LABEL, key] => (None, Some(*key)),
            [nonce, IDEMPOTENCY_KEY_LABEL, key] => (Some(*nonce), Some(*key)),
            _ => return None,
        };
        let mut body_sha256 = [0; 32];
        hex::decode_to_slice(lines[3], &mut body_sha256).ok()?;
        Some(Fields {
            method: lines[0].to_owned(),
            target: lines[1].to_owned(),
            timestamp: lines[2].to_owned(),
            body_sha256,
            nonce: nonce.map(str::to_owned),
            idempotency_key: idempotency_key.map(str::to_owned),
            host,
        })
    }

    /// Values chosen to collide if the layout allowed it: empty lines, the label
    /// itself, one value in every optional field.
    #[test]
    fn optional_fields_never_sign_alike() {
        let tricky = [None, Some(""), Some(IDEMPOTENCY_KEY_LABEL), Some("k"), Some("pay.example.com")];
        let digest = sha256(b"");
        for sign_host in [false, true] {
            let hosts: &[Option<&str>] =
                if sign_host { &[Some(""), Some("k"), Some("pay.example.com")] } else { &[None] };
            let mut seen = std::collections::HashMap::new();
            for nonce in tricky {
                for idempotency_key in tricky {
                    for &host in hosts {
                        let c = Canonical {
                            method: "POST",
                            target: "/",
                            timestamp: "1",
                            body_sha256: &digest,
                            nonce,
                            idempotency_key,
                            host,
                        };
                        let fields = (nonce, idempotency_key, host);
                        if let Some(earlier) = seen.insert(c.string_to_sign(), fields) {
                            panic!("{earlier:?} and {fields:?} sign the same string");
                        }
                    }
                }
            }
            assert_eq!(seen.len(), tricky.len() * tricky.len() * hosts.len());
        }
    }

    /// A line of a header value: visible ASCII, blanks and the label included.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), Just(IDEMPOTENCY_KEY_LABEL.to_owned()), "[ -~]{1,12}"]
    }

    fn fields(sign_host: bool) -> impl Strategy<Value = Fields> {
        let host = if sign_host { "[a-z0-9.:-]{0,12}".prop_map(Some).boxed() } else { Just(None).boxed() };
        (
            "[A-Z]{1,7}",
            "/[!-~]{0,12}",
            "[0-9]{1,10}",
            any::<[u8; 32]>(),
            proptest::option::of(line()),
            proptest::option::of(line()),
            host,
        )
            .prop_map(|(method, target, timestamp, body_sha256, nonce, idempotency_key, host)| Fields {
                method,
                target,
                timestamp,
                body_sha256,
                nonce,
                idempotency_key,
                host,
            })
    }

    proptest! {
        /// Every string to sign reads back into the one request that made it, so two
        /// different requests never produce the same string (for a key without
        /// `sign_host`, then with it).
        #[test]
        fn reads_back_without_host(request in fields(false)) {
            prop_assert_eq!(read_back(&request.string_to_sign(), false), Some(request));
        }

        #[test]
        fn reads_back_with_host(request in fields(true)) {
            prop_assert_eq!(read_back(&request.string_to_sign(), true), Some(request));
        }
    }
}

mod verify {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::signature::{Authenticated, Failure, FailureReason, ReplayCache, SignedRequest, Verified, Verifier};

    const NOW: u64 = 1_700_000_000;
    const SKEW: Duration = Duration::from_secs(300);

    /// A verifier and the replay cache it records in, as the proxy's memory store
    /// pairs them.
    struct Checked {
        verifier: Verifier,
        cache: ReplayCache,
    }

    impl Checked {
        fn verify(&self, req: &SignedRequest<'_>, now: u64, max_skew: Duration) -> Result<Verified, Failure> {
            let Authenticated { key_id, timestamp, signature } = self.verifier.authenticate(req, now, max_skew)?;
            self.cache.check_and_insert(&key_id, &signature, timestamp, max_skew, now)?;
            Ok(Verified { key_id, timestamp })
        }

        fn replay_cache(&self) -> &ReplayCache {
            &self.cache
        }
    }

    fn with_keys(keys: Vec<(String, Vec<Vec<u8>>)>, capacity: usize) -> Checked {
        Checked { verifier: Verifier::new(keys), cache: ReplayCache::new(capacity) }
    }

    fn verifier(capacity: usize) -> Checked {
        with_keys(
            vec![
                ("k1".to_owned(), vec![b"old-secret".to_vec(), b"new-secret".to_vec()]),
                ("k2".to_owned(), vec![b"k2-secret".to_vec()]),
                ("k3".to_owned(), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]),
            ],
            capacity,
        )
    }

    fn check(
        v: &Checked,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: u64,
    ) -> Result<Verified, Failure> {
        let digest = sha256(body);
        v.verify(&SignedRequest { method, target, headers, body_sha256: &digest }, now, SKEW)
    }

    fn valid(ts: u64, nonce: Option<&str>) -> HeaderMap {
        signed_headers(
            "k1",
            b"new-secret",
            &Method::POST,
            "/api/transfer?to=a",
            &ts.to_string(),
            b"{\"amount\":1}",
            nonce,
        )
    }

    fn reason(v: &Checked, headers: &HeaderMap) -> FailureReason {
        check(v, &Method::POST, "/api/transfer?to=a", headers, b"{\"amount\":1}", NOW).unwrap_err().reason()
    }

    #[test]
    fn valid_request_passes() {
        let v = verifier(100);
        let ok = check(&v, &Method::POST, "/api/transfer?to=a", &valid(NOW, None), b"{\"amount\":1}", NOW).unwrap();
        assert_eq!(ok, Verified { key_id: "k1".into(), timestamp: NOW });
        assert_eq!(v.replay_cache().len(), 1);
    }

    #[test]
    fn accepts_openssl_signature() {
        let v = verifier(100);
        let ts = NOW.to_string();
        let body = b"hello";
        let sig = openssl_hmac("k2-secret", contract_string("PUT", "/x?y=1", &ts, body, Some("nn")).as_bytes());
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k2"));
        h.insert("x-timestamp", HeaderValue::from_str(&ts).unwrap());
        h.insert("x-nonce", HeaderValue::from_static("nn"));
        h.insert("x-signature", HeaderValue::from_str(&sig).unwrap());
        check(&v, &Method::PUT, "/x?y=1", &h, body, NOW).unwrap();
    }

    #[test]
    fn rotation_either_secret() {
        let v = verifier(100);
        for secret in [&b"old-secret"[..], b"new-secret"] {
            let h = signed_headers("k1", secret, &Method::GET, "/r", &NOW.to_string(), b"", None);
            assert_eq!(check(&v, &Method::GET, "/r", &h, b"", NOW).unwrap().key_id, "k1");
        }
        for secret in [&b"a"[..], b"b", b"c"] {
            let h = signed_headers("k3", secret, &Method::GET, "/r", &NOW.to_string(), b"", None);
            check(&v, &Method::GET, "/r", &h, b"", NOW).unwrap();
        }
    }

    #[test]
    fn any_change_is_bad_mac() {
        let v = verifier(100);
        let h = valid(NOW, None);
        let target = "/api/transfer?to=a";
        let body = b"{\"amount\":1}";
        let bad = |m: &Method, t: &str, b: &[u8], h: &HeaderMap| check(&v, m, t, h, b, NOW).unwrap_err().reason();
        assert_eq!(bad(&Method::PUT, target, body, &h), FailureReason::BadMac);
        assert_eq!(bad(&Method::POST, "/api/transfer?to=b", body, &h), FailureReason::BadMac);
        assert_eq!(bad(&Method::POST, "/api/transfer", body, &h), FailureReason::BadMac);
        assert_eq!(bad(&Method::POST, "/api/transfer2?to=a", body, &h), FailureReason::BadMac);
        assert_eq!(bad(&Method::POST, target, b"{\"amount\":2}", &h), FailureReason::BadMac);
        assert_eq!(bad(&Method::POST, target, b"", &h), FailureReason::BadMac);
        let mut ts = h.clone();
        ts.insert("x-timestamp", HeaderValue::from_str(&(NOW + 1).to_string()).unwrap());
        assert_eq!(bad(&Method::POST, target, body, &ts), FailureReason::BadMac);
        // Leading zeros: same number, different bytes signed.
        ts.insert("x-timestamp", HeaderValue::from_str(&format!("0{NOW}")).unwrap());
        assert_eq!(bad(&Method::POST, target, body, &ts), FailureReason::BadMac);
        let mut nonce = h.clone();
        nonce.insert("x-nonce", HeaderValue::from_static("added"));
        assert_eq!(bad(&Method::POST, target, body, &nonce), FailureReason::BadMac);
        // Nothing failed past the MAC, so nothing was remembered.
        assert_eq!(v.replay_cache().len(), 0);
        // The untouched request still passes.
        check(&v, &Method::POST, target, &h, body, NOW).unwrap();
    }

    #[test]
    fn unknown_key_and_wrong_key_are_bad_mac() {
        let v = verifier(100);
        let h = signed_headers("nobody", b"new-secret", &Method::GET, "/", &NOW.to_string(), b"", None);
        assert_eq!(check(&v, &Method::GET, "/", &h, b"", NOW).unwrap_err(), Failure::BadMac);
        // Another key's valid secret.
        let h = signed_headers("k2", b"new-secret", &Method::GET, "/", &NOW.to_string(), b"", None);
        assert_eq!(check(&v, &Method::GET, "/", &h, b"", NOW).unwrap_err(), Failure::BadMac);
        // The dummy key of unknown ids never verifies, even if someone learned it.
        let h = signed_headers("nobody", b"limiter: no such key", &Method::GET, "/", &NOW.to_string(), b"", None);
        assert_eq!(check(&v, &Method::GET, "/", &h, b"", NOW).unwrap_err(), Failure::BadMac);
        // A key configured without secrets never verifies.
        let empty = with_keys(vec![("e".to_owned(), vec![])], 10);
        let h = signed_headers("e", b"", &Method::GET, "/", &NOW.to_string(), b"", None);
        assert_eq!(check(&empty, &Method::GET, "/", &h, b"", NOW).unwrap_err(), Failure::BadMac);
    }

    #[test]
    fn missing_headers() {
        let v = verifier(100);
        for name in ["x-api-key", "x-timestamp", "x-signature"] {
            let mut h = valid(NOW, None);
            h.remove(name);
            assert_eq!(reason(&v, &h), FailureReason::MissingHeader, "{name}");
        }
        assert_eq!(reason(&v, &HeaderMap::new()), FailureReason::MissingHeader);
    }

    #[test]
    fn duplicated_headers() {
        let v = verifier(100);
        for name in ["x-api-key", "x-timestamp", "x-signature", "x-nonce"] {
            let mut h = valid(NOW, Some("n1"));
            let value = h.get(name).unwrap().clone();
            h.append(name, value);
            assert_eq!(reason(&v, &h), FailureReason::DuplicateHeader, "{name}");
        }
        assert_eq!(v.replay_cache().len(), 0);
    }

    #[test]
    fn malformed_headers() {
        let v = verifier(100);
        for name in ["x-api-key", "x-timestamp", "x-signature", "x-nonce", "idempotency-key"] {
            let mut h = valid(NOW, None);
            h.insert(name, HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
            assert_eq!(reason(&v, &h), FailureReason::MalformedHeader, "{name}");
        }
    }

    #[test]
    fn bad_timestamps() {
        let v = verifier(100);
        for ts in [
            "",
            "abc",
            "+1700000000",
            "-1",
            "1700000000.5",
            " 1700000000",
            "1e9",
            "99999999999999999999",
            "123456789012345678901",
        ] {
            let mut h = valid(NOW, None);
            h.insert("x-timestamp", HeaderValue::from_str(ts).unwrap());
            assert_eq!(reason(&v, &h), FailureReason::BadTimestamp, "{ts:?}");
        }
    }

    #[test]
    fn skew_window_edges() {
        let v = verifier(100);
        let target = "/api/transfer?to=a";
        let body = b"{\"amount\":1}";
        for ts in [NOW - 301, NOW + 301, 0, u64::MAX] {
            let err = check(&v, &Method::POST, target, &valid(ts, None), body, NOW).unwrap_err();
            assert_eq!(err.reason(), FailureReason::Skew, "{ts}");
        }
        for ts in [NOW - 300, NOW + 300, NOW] {
            check(&v, &Method::POST, target, &valid(ts, None), body, NOW).unwrap();
        }
        // A clock at 0 (before 1970, see unix_now) refuses everything without panicking.
        assert_eq!(
            check(&v, &Method::POST, target, &valid(NOW, None), body, 0).unwrap_err().reason(),
            FailureReason::Skew
        );
    }

    #[test]
    fn signature_format() {
        let v = verifier(100);
        let good = valid(NOW, None).get("x-signature").unwrap().to_str().unwrap().to_owned();
        let upper = good.to_ascii_uppercase();
        let cases = [
            String::new(),
            good[..63].to_owned(),
            format!("{good}0"),
            good[..62].to_owned(),
            format!("{}g", &good[..63]),
            format!("{}Z", &good[..63]),
            upper,
            format!("0x{}", &good[..62]),
            " ".repeat(64),
            "-".repeat(64),
        ];
        for sig in cases {
            let mut h = valid(NOW, None);
            h.insert("x-signature", HeaderValue::from_str(&sig).unwrap());
            assert_eq!(reason(&v, &h), FailureReason::BadSignatureFormat, "{sig:?}");
        }
        // 64 bytes of multibyte UTF-8 is opaque header bytes, not a panic.
        let mut h = valid(NOW, None);
        h.insert("x-signature", HeaderValue::from_bytes("é".repeat(32).as_bytes()).unwrap());
        assert_eq!(reason(&v, &h), FailureReason::MalformedHeader);
    }

    #[test]
    fn replay_rejected_nonces_distinguish() {
        let v = verifier(100);
        let target = "/api/transfer?to=a";
        let body = b"{\"amount\":1}";
        let h = valid(NOW, None);
        check(&v, &Method::POST, target, &h, body, NOW).unwrap();
        let err = check(&v, &Method::POST, target, &h, body, NOW + 10).unwrap_err();
        assert_eq!(err, Failure::Replay);
        assert!(err.is_replay());
        for nonce in ["n1", "n2"] {
            check(&v, &Method::POST, target, &valid(NOW, Some(nonce)), body, NOW).unwrap();
        }
        assert_eq!(check(&v, &Method::POST, target, &valid(NOW, Some("n1")), body, NOW).unwrap_err(), Failure::Replay);
        // Still a replay at the last second the timestamp passes.
        assert_eq!(check(&v, &Method::POST, target, &h, body, NOW + 300).unwrap_err(), Failure::Replay);
        assert_eq!(v.replay_cache().len(), 3);
    }

    #[test]
    fn bad_signature_flood_does_not_grow_replay_cache() {
        let v = verifier(1000);
        for i in 0..5_000u32 {
            let mut h = valid(NOW, None);
            let sig = hex::encode(sha256(&i.to_be_bytes()));
            h.insert("x-signature", HeaderValue::from_str(&sig).unwrap());
            if i % 2 == 0 {
                h.insert("x-api-key", HeaderValue::from_str(&format!("guess-{i}")).unwrap());
            }
            assert_eq!(reason(&v, &h), FailureReason::BadMac);
        }
        assert_eq!(v.replay_cache().len(), 0);
        assert!(v.replay_cache().is_empty());
    }

    #[test]
    fn full_replay_cache_fails_closed() {
        let v = verifier(2);
        let target = "/api/transfer?to=a";
        let body = b"{\"amount\":1}";
        check(&v, &Method::POST, target, &valid(NOW, Some("a")), body, NOW).unwrap();
        check(&v, &Method::POST, target, &valid(NOW, Some("b")), body, NOW).unwrap();
        let err = check(&v, &Method::POST, target, &valid(NOW, Some("c")), body, NOW).unwrap_err();
        assert_eq!(err.reason(), FailureReason::ReplayCacheFull);
        assert_eq!(v.replay_cache().full_rejections(), 1);
        assert_eq!(v.replay_cache().len(), 2);
        // Once the first two can no longer pass the timestamp check they make room.
        let later = NOW + 301;
        check(&v, &Method::POST, target, &valid(later, Some("c")), body, later).unwrap();
        assert_eq!(v.replay_cache().len(), 1);
    }

    #[test]
    fn concurrent_replays_admit_one() {
        let v = Arc::new(verifier(100));
        let h = valid(NOW, None);
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (v, h) = (Arc::clone(&v), h.clone());
                std::thread::spawn(move || {
                    check(&v, &Method::POST, "/api/transfer?to=a", &h, b"{\"amount\":1}", NOW).is_ok()
                })
            })
            .collect();
        let admitted = handles.into_iter().map(|t| t.join().unwrap()).filter(|ok| *ok).count();
        assert_eq!(admitted, 1);
    }

    /// `valid(NOW, nonce)` with `key` sent as `Idempotency-Key` and signed.
    fn valid_with_key(nonce: Option<&str>, key: &str) -> HeaderMap {
        let digest = sha256(b"{\"amount\":1}");
        let ts = NOW.to_string();
        let message = Canonical {
            method: "POST",
            target: "/api/transfer?to=a",
            timestamp: &ts,
            body_sha256: &digest,
            nonce,
            idempotency_key: Some(key),
            host: None,
        }
        .string_to_sign();
        let mut headers = valid(NOW, nonce);
        headers.insert("x-signature", HeaderValue::from_str(&sign_hex(b"new-secret", &message)).unwrap());
        headers.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
        headers
    }

    #[test]
    fn the_idempotency_key_is_signed_when_sent() {
        let v = verifier(100);
        let signed = valid_with_key(Some("n1"), "idem-1");
        let mut stripped = signed.clone();
        stripped.remove("idempotency-key");
        let mut changed = signed.clone();
        changed.insert("idempotency-key", HeaderValue::from_static("idem-2"));
        // An old client's request, with a key added on the way.
        let mut added = valid(NOW, Some("n1"));
        added.insert("idempotency-key", HeaderValue::from_static("idem-1"));
        // The nonce moved into the key: the two-line layout tells them apart.
        let mut moved = valid(NOW, Some("idem-1"));
        moved.remove("x-nonce");
        moved.insert("idempotency-key", HeaderValue::from_static("idem-1"));
        for (case, headers) in [("stripped", &stripped), ("changed", &changed), ("added", &added), ("moved", &moved)] {
            assert_eq!(reason(&v, headers), FailureReason::BadMac, "{case}");
        }
        let mut twice = signed.clone();
        twice.append("idempotency-key", HeaderValue::from_static("idem-1"));
        assert_eq!(reason(&v, &twice), FailureReason::DuplicateHeader);
        assert_eq!(v.replay_cache().len(), 0);
        check(&v, &Method::POST, "/api/transfer?to=a", &signed, b"{\"amount\":1}", NOW).unwrap();
        // Without the header, the string to sign is what it always was.
        check(&v, &Method::POST, "/api/transfer?to=a", &valid(NOW, Some("n2")), b"{\"amount\":1}", NOW).unwrap();
        check(&v, &Method::POST, "/api/transfer?to=a", &valid_with_key(None, "idem-3"), b"{\"amount\":1}", NOW)
            .unwrap();
    }

    #[test]
    fn accepts_an_openssl_signature_over_an_idempotency_key() {
        let v = verifier(100);
        let ts = NOW.to_string();
        let message = format!("{}\nidempotency-key\norder-9", contract_string("POST", "/x", &ts, b"pay", Some("nn")));
        let sig = openssl_hmac("k2-secret", message.as_bytes());
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k2"));
        h.insert("x-timestamp", HeaderValue::from_str(&ts).unwrap());
        h.insert("x-nonce", HeaderValue::from_static("nn"));
        h.insert("idempotency-key", HeaderValue::from_static("order-9"));
        h.insert("x-signature", HeaderValue::from_str(&sig).unwrap());
        check(&v, &Method::POST, "/x", &h, b"pay", NOW).unwrap();
    }

    #[test]
    fn reason_labels_are_distinct() {
        let labels: std::collections::HashSet<_> = FailureReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), FailureReason::ALL.len());
        assert_eq!(Failure::MissingHeader("x-api-key").reason().to_string(), "missing_header");
        // Debug must not leak the HMAC states.
        assert!(!format!("{:?}", verifier(1).verifier).contains("secret"));
    }
}

mod replay {
    use std::time::Duration;

    use crate::signature::{ReplayCache, ReplayError};

    const SKEW: Duration = Duration::from_secs(300);

    #[test]
    fn expiry_and_identity() {
        let c = ReplayCache::new(10);
        c.check_and_insert("k", &[1; 32], 1000, SKEW, 1000).unwrap();
        assert_eq!(c.check_and_insert("k", &[1; 32], 1000, SKEW, 1300), Err(ReplayError::Replay));
        // Same bytes under another key id is another entry.
        c.check_and_insert("other", &[1; 32], 1000, SKEW, 1000).unwrap();
        // At 1301 the timestamp can no longer pass, so the entries are gone.
        c.check_and_insert("k", &[2; 32], 1301, SKEW, 1301).unwrap();
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn bound_honoured_and_expired_evicted_first() {
        let c = ReplayCache::new(3);
        assert_eq!(c.capacity(), 3);
        c.check_and_insert("k", &[1; 32], 1000, SKEW, 1000).unwrap();
        c.check_and_insert("k", &[2; 32], 1100, SKEW, 1100).unwrap();
        c.check_and_insert("k", &[3; 32], 1200, SKEW, 1200).unwrap();
        assert_eq!(c.check_and_insert("k", &[4; 32], 1200, SKEW, 1250), Err(ReplayError::Full));
        assert_eq!(c.len(), 3);
        // At 1301 only the first is expired: exactly one slot frees.
        c.check_and_insert("k", &[4; 32], 1301, SKEW, 1301).unwrap();
        assert_eq!(c.check_and_insert("k", &[5; 32], 1301, SKEW, 1301), Err(ReplayError::Full));
        // The live ones are still remembered.
        assert_eq!(c.check_and_insert("k", &[2; 32], 1100, SKEW, 1301), Err(ReplayError::Replay));
        assert_eq!(c.full_rejections(), 2);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn widened_skew_keeps_entries_longer() {
        let c = ReplayCache::new(10);
        c.check_and_insert("k", &[1; 32], 1000, SKEW, 1000).unwrap();
        // After a reload to a 600 s window the request passes the timestamp check until
        // 1600, so it must still be a replay at 1500.
        let wide = Duration::from_secs(600);
        assert_eq!(c.check_and_insert("k", &[1; 32], 1000, wide, 1500), Err(ReplayError::Replay));
    }

    #[test]
    fn each_key_holds_its_share_until_its_entries_expire() {
        let c = ReplayCache::new(4);
        c.set_keys(2);
        c.check_and_insert("hostile", &[1; 32], 1000, SKEW, 1000).unwrap();
        c.check_and_insert("hostile", &[2; 32], 1000, SKEW, 1000).unwrap();
        assert_eq!(c.check_and_insert("hostile", &[3; 32], 1000, SKEW, 1000), Err(ReplayError::Full));
        c.check_and_insert("victim", &[1; 32], 1000, SKEW, 1000).unwrap();
        assert_eq!(c.check_and_insert("hostile", &[2; 32], 1000, SKEW, 1300), Err(ReplayError::Replay));
        assert_eq!(c.len(), 3);
        // Expiry, and only expiry, gives the share back: both entries at once.
        c.check_and_insert("hostile", &[4; 32], 1301, SKEW, 1301).unwrap();
        c.check_and_insert("hostile", &[5; 32], 1301, SKEW, 1301).unwrap();
        assert_eq!(c.check_and_insert("hostile", &[6; 32], 1301, SKEW, 1301), Err(ReplayError::Full));
    }

    #[test]
    fn concurrent_inserts_bounded() {
        let c = std::sync::Arc::new(ReplayCache::new(100));
        let handles: Vec<_> = (0..8u8)
            .map(|t| {
                let c = std::sync::Arc::clone(&c);
                std::thread::spawn(move || {
                    (0..50u8)
                        .filter(|i| {
                            c.check_and_insert("k", &[t.wrapping_mul(50).wrapping_add(*i); 32], 1000, SKEW, 1000)
                                .is_ok()
                        })
                        .count()
                })
            })
            .collect();
        let ok: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(ok, 100);
        assert_eq!(c.len(), 100);
    }
}

mod idempotency {
    use std::time::Duration;

    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, Method, StatusCode};

    use crate::signature::idempotency::{applies_to, fingerprint};
    use crate::signature::{Begin, Guard, IdempotencyConfig, IdempotencyStore, StoredResponse};

    const TTL: Duration = Duration::from_secs(3600);

    fn store(max_entries: usize) -> IdempotencyStore {
        IdempotencyStore::new(IdempotencyConfig {
            ttl: TTL,
            max_entries,
            max_response_bytes: 64,
            max_bytes: usize::MAX,
        })
    }

    fn response(body: &'static [u8]) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        StoredResponse { status: StatusCode::CREATED, headers, body: Bytes::from_static(body) }
    }

    fn proceed(b: Begin) -> Guard {
        match b {
            Begin::Proceed(g) => g,
            other => panic!("expected Proceed, got {other:?}"),
        }
    }

    #[test]
    fn replay_conflict_in_flight() {
        let s = store(10);
        let t0 = Duration::from_secs(1_700_000_000);
        let fp = [1; 32];
        let guard = proceed(s.begin("k1", "idem-1", fp, t0));
        assert!(matches!(s.begin("k1", "idem-1", fp, t0), Begin::InFlight));
        assert!(matches!(s.begin("k1", "idem-1", [2; 32], t0), Begin::Conflict));
        guard.complete(response(b"created"), t0);
        match s.begin("k1", "idem-1", fp, t0 + Duration::from_secs(1)) {
            Begin::Replay(r) => assert_eq!(r, response(b"created")),
            other => panic!("expected Replay, got {other:?}"),
        }
        assert!(matches!(s.begin("k1", "idem-1", [2; 32], t0), Begin::Conflict));
        // Keys are per key id.
        drop(proceed(s.begin("k2", "idem-1", fp, t0)));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn expires_after_ttl() {
        let s = store(10);
        let t0 = Duration::from_secs(1_700_000_000);
        proceed(s.begin("k", "i", [1; 32], t0)).complete(response(b"x"), t0);
        assert!(matches!(s.begin("k", "i", [1; 32], t0 + TTL - Duration::from_millis(1)), Begin::Replay(_)));
        // Expired: a new first use, even with another body.
        drop(proceed(s.begin("k", "i", [9; 32], t0 + TTL)));
    }

    #[test]
    fn dropped_guard_releases() {
        let s = store(10);
        let t0 = Duration::from_secs(1_700_000_000);
        let g = proceed(s.begin("k", "i", [1; 32], t0));
        drop(g);
        assert!(s.is_empty());
        let g = proceed(s.begin("k", "i", [1; 32], t0));
        g.complete(response(b"ok"), t0);
        assert!(matches!(s.begin("k", "i", [1; 32], t0), Begin::Replay(_)));
    }

    #[test]
    fn oversized_response_not_replayed_nor_rerun() {
        let s = store(10);
        let t0 = Duration::from_secs(1_700_000_000);
        proceed(s.begin("k", "i", [1; 32], t0)).complete(response(&[b'x'; 60]), t0);
        assert!(matches!(s.begin("k", "i", [1; 32], t0), Begin::NotReplayable));
        assert!(matches!(s.begin("k", "i", [2; 32], t0), Begin::Conflict));
    }

    #[test]
    fn bounded_expired_first_then_oldest_completed() {
        let s = store(3);
        let t0 = Duration::from_secs(1_700_000_000);
        let sec = Duration::from_secs(1);
        proceed(s.begin("k", "a", [1; 32], t0)).complete(response(b"a"), t0);
        proceed(s.begin("k", "b", [1; 32], t0)).complete(response(b"b"), t0 + sec);
        let c = proceed(s.begin("k", "c", [1; 32], t0));
        // "a" has expired: it goes, nothing live is evicted.
        let d = proceed(s.begin("k", "d", [1; 32], t0 + TTL));
        assert_eq!((s.len(), s.evictions()), (3, 0));
        // Full of live entries: the completed one ("b") goes, never in-flight ones.
        let e = proceed(s.begin("k", "e", [1; 32], t0 + TTL));
        assert_eq!((s.len(), s.evictions()), (3, 1));
        assert!(matches!(s.begin("k", "c", [1; 32], t0 + TTL), Begin::InFlight));
        // All in flight: refuse rather than drop one.
        assert!(matches!(s.begin("k", "f", [1; 32], t0 + TTL), Begin::Full));
        drop((c, d, e));
        assert!(s.is_empty());
    }

    #[test]
    fn a_sent_request_is_never_released() {
        let s = store(10);
        let t0 = Duration::from_secs(1_700_000_000);
        let mut g = proceed(s.begin("k", "i", [1; 32], t0));
        g.sent(Some(t0));
        // No response (timeout, client gone): the outcome is unknown until the TTL.
        drop(g);
        assert!(matches!(s.begin("k", "i", [1; 32], t0 + TTL - Duration::from_millis(1)), Begin::OutcomeUnknown));
        assert!(matches!(s.begin("k", "i", [2; 32], t0), Begin::Conflict));
        drop(proceed(s.begin("k", "i", [1; 32], t0 + TTL)));
    }

    #[test]
    fn a_tenant_evicts_only_its_own_entries() {
        let config = IdempotencyConfig { ttl: TTL, max_entries: 4, max_response_bytes: 64, max_bytes: usize::MAX };
        let s = IdempotencyStore::new(config);
        s.set_keys(2);
        let t0 = Duration::from_secs(1_700_000_000);
        proceed(s.begin("victim", "v", [1; 32], t0)).complete(response(b"v"), t0);
        for (n, idem) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let at = t0 + Duration::from_secs(n as u64);
            proceed(s.begin("hostile", idem, [1; 32], at)).complete(response(b"h"), at);
        }
        // The hostile tenant holds its share (2) and evicted only its own.
        assert_eq!((s.len(), s.evictions()), (3, 3));
        assert!(matches!(s.begin("victim", "v", [1; 32], t0), Begin::Replay(_)));
        assert!(matches!(s.begin("hostile", "e", [1; 32], t0), Begin::Replay(_)));
        // A share all in flight refuses rather than evict.
        let held = (proceed(s.begin("hostile", "x", [1; 32], t0)), proceed(s.begin("hostile", "y", [1; 32], t0)));
        assert!(matches!(s.begin("hostile", "z", [1; 32], t0), Begin::Full));
        assert!(matches!(s.begin("victim", "v", [1; 32], t0), Begin::Replay(_)));
        drop(held);
    }

    #[test]
    fn bytes_are_bounded_per_tenant() {
        use crate::signature::idempotency::ENTRY_OVERHEAD;
        let entry = ENTRY_OVERHEAD + 2 + 1;
        let stored = response(b"0123456789").stored_size();
        // Two tenants; each share holds two entries and one response.
        let max_bytes = 2 * (2 * entry + stored);
        let config = IdempotencyConfig { ttl: TTL, max_entries: 100, max_response_bytes: 64, max_bytes };
        let s = IdempotencyStore::new(config);
        s.set_keys(2);
        let t0 = Duration::from_secs(1_700_000_000);
        proceed(s.begin("k1", "a", [1; 32], t0)).complete(response(b"0123456789"), t0);
        for idem in ["a", "b", "c", "d"] {
            proceed(s.begin("k2", idem, [1; 32], t0)).complete(response(b"0123456789"), t0);
        }
        assert!(s.bytes() <= max_bytes);
        assert_eq!((s.len(), s.evictions()), (2, 3));
        assert!(matches!(s.begin("k1", "a", [1; 32], t0), Begin::Replay(_)));
        // A response that does not fit beside the tenant's in-flight entries is not
        // stored, and never run again.
        let (x, y) = (proceed(s.begin("k1", "x", [1; 32], t0)), proceed(s.begin("k1", "y", [1; 32], t0)));
        x.complete(response(b"0123456789abcdef"), t0);
        assert!(matches!(s.begin("k1", "x", [1; 32], t0), Begin::NotReplayable));
        drop(y);
        assert!(s.bytes() <= max_bytes);
    }

    #[test]
    fn methods_and_fingerprint() {
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(applies_to(&m));
        }
        for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(!applies_to(&m));
        }
        let body = [7; 32];
        let a = fingerprint(&Method::POST, "/pay", &body);
        assert_eq!(a, fingerprint(&Method::POST, "/pay", &body));
        assert_ne!(a, fingerprint(&Method::PUT, "/pay", &body));
        assert_ne!(a, fingerprint(&Method::POST, "/pay?x", &body));
        assert_ne!(a, fingerprint(&Method::POST, "/pay", &[8; 32]));
    }
}
