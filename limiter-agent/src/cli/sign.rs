//! `limiter sign`: the signature headers (or a ready `curl` command) for one request, so
//! that operators can exercise a signed route by hand.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;

use http::Method;
use http::uri::{InvalidUri, PathAndQuery, Uri};

use limiter_core::{
    Clock as _, SystemClock,
    signature::{Canonical, idempotency::MAX_IDEMPOTENCY_KEY_BYTES, sha256, sign_hex},
};

use crate::signature::secrets::read_secret_file;

/// Why `limiter sign` produced nothing: an unreadable file, or an input the proxy
/// would not verify.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("reading secret file {}", path.display())]
    ReadSecret { path: PathBuf, source: std::io::Error },
    #[error("secret file {} is empty", .0.display())]
    EmptySecret(PathBuf),
    #[error("reading body file {}", path.display())]
    ReadBody { path: PathBuf, source: std::io::Error },
    #[error("invalid method {method:?}")]
    Method { method: String, source: http::method::InvalidMethod },
    #[error("--path must be a request target starting with '/', got {0:?}")]
    NotATarget(String),
    #[error("invalid request target {target:?}")]
    Target { target: String, source: InvalidUri },
    #[error("invalid --curl URL {url:?}")]
    CurlUrl { url: String, source: InvalidUri },
    #[error("--curl needs scheme://host[:port], got {0:?}")]
    CurlNotAbsolute(String),
    #[error("--curl takes the proxy's base URL only; put the target in --path (got {0:?})")]
    CurlWithTarget(String),
    #[error("invalid --host {host:?}")]
    Host { host: String, source: InvalidUri },
    #[error("body file path {} is not UTF-8", .0.display())]
    BodyPathNotUtf8(PathBuf),
    #[error("--idempotency-key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes of visible ASCII, got {0:?}")]
    IdempotencyKey(String),
    #[error("reading /dev/urandom for a nonce")]
    Nonce(#[source] std::io::Error),
}

/// Arguments of `limiter sign`.
#[derive(Debug, Clone, clap::Args)]
pub struct SignArgs {
    /// Key id, sent as X-API-Key.
    #[arg(long)]
    pub key_id: String,
    /// File holding the key's secret (one trailing newline is ignored, as by the proxy).
    #[arg(long)]
    pub secret_file: PathBuf,
    /// Request method, exactly as it will be sent.
    #[arg(long)]
    pub method: String,
    /// Request target exactly as it will be sent: path and, if any, ?query.
    #[arg(long)]
    pub path: String,
    /// File holding the request body; without it the body is empty.
    #[arg(long)]
    pub body_file: Option<PathBuf>,
    /// Add a random 128-bit X-Nonce, so that identical requests get distinct signatures.
    #[arg(long)]
    pub nonce: bool,
    /// The Idempotency-Key the request will carry: sent, and covered by the signature
    /// (the proxy refuses a request whose key was stripped or changed).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The Host header the request will carry (`host[:port]`), for a key with
    /// `sign_host = true`: its signature covers it, lowercased.
    #[arg(long)]
    pub host: Option<String>,
    /// Unix timestamp to sign instead of now.
    #[arg(long)]
    pub timestamp: Option<u64>,
    /// Print a curl command for this proxy base URL (`scheme://host[:port]`) instead of
    /// the headers; --path is appended to it.
    #[arg(long, value_name = "URL")]
    pub curl: Option<String>,
}

/// Runs `limiter sign`, printing to stdout.
pub fn run(args: SignArgs) -> Result<(), SignError> {
    let secret = read_secret_file(&args.secret_file)
        .map_err(|source| SignError::ReadSecret { path: args.secret_file.clone(), source })?;
    if secret.is_empty() {
        return Err(SignError::EmptySecret(args.secret_file));
    }
    let body = match &args.body_file {
        Some(path) => std::fs::read(path).map_err(|source| SignError::ReadBody { path: path.clone(), source })?,
        None => Vec::new(),
    };
    let nonce = args.nonce.then(random_nonce).transpose()?;
    let timestamp = args.timestamp.unwrap_or_else(|| SystemClock.now().as_secs());
    print!("{}", render(&args, &secret, &body, timestamp, nonce.as_deref())?);
    Ok(())
}

/// The output of `limiter sign`, with every input fixed (for tests).
fn render(
    args: &SignArgs,
    secret: &[u8],
    body: &[u8],
    timestamp: u64,
    nonce: Option<&str>,
) -> Result<String, SignError> {
    // Validate exactly what the proxy will see, so a typo fails here and not as a 401.
    Method::from_str(&args.method).map_err(|source| SignError::Method { method: args.method.clone(), source })?;
    if !args.path.starts_with('/') {
        return Err(SignError::NotATarget(args.path.clone()));
    }
    PathAndQuery::from_str(&args.path).map_err(|source| SignError::Target { target: args.path.clone(), source })?;

    let timestamp = timestamp.to_string();
    let body_sha256 = sha256(body);
    if let Some(host) = &args.host {
        http::uri::Authority::from_str(host).map_err(|source| SignError::Host { host: host.clone(), source })?;
    }
    let idempotency_key = args.idempotency_key.as_deref();
    if let Some(key) = idempotency_key {
        check_idempotency_key(key)?;
    }
    let message = Canonical {
        method: &args.method,
        target: &args.path,
        timestamp: &timestamp,
        body_sha256: &body_sha256,
        nonce,
        idempotency_key,
        host: args.host.as_deref(),
    }
    .string_to_sign();
    let signature = sign_hex(secret, &message);

    let mut headers = vec![("X-API-Key", args.key_id.as_str()), ("X-Timestamp", timestamp.as_str())];
    if let Some(nonce) = nonce {
        headers.push(("X-Nonce", nonce));
    }
    if let Some(key) = idempotency_key {
        headers.push(("Idempotency-Key", key));
    }
    headers.push(("X-Signature", signature.as_str()));

    let mut out = String::new();
    if let Some(base) = &args.curl {
        let url = format!("{}{}", curl_base(base)?, args.path);
        // --path-as-is and --globoff: curl must send the target byte for byte as signed,
        // without resolving dot segments or expanding [] and {}.
        out.push_str("curl --path-as-is --globoff -X ");
        out.push_str(&shell_quote(&args.method));
        // curl sends the URL's host otherwise, which the signature may not cover.
        let host = args.host.as_deref().map(|host| ("Host", host));
        for (name, value) in host.iter().chain(&headers) {
            out.push_str(" -H ");
            out.push_str(&shell_quote(&format!("{name}: {value}")));
        }
        if let Some(path) = &args.body_file {
            out.push_str(" --data-binary ");
            out.push_str(&shell_quote(&format!("@{}", path_str(path)?)));
        }
        out.push(' ');
        out.push_str(&shell_quote(&url));
        out.push('\n');
    } else {
        for (name, value) in &headers {
            let _ = writeln!(out, "{name}: {value}");
        }
    }
    Ok(out)
}

/// A key the proxy takes as sent: one header value (visible ASCII, no surrounding
/// blanks, which a server's parser would trim) within the length the proxy accepts.
fn check_idempotency_key(key: &str) -> Result<(), SignError> {
    let visible = key.bytes().all(|b| (b' '..=b'~').contains(&b));
    let trimmed = key.trim_matches(' ') == key;
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || !visible || !trimmed {
        return Err(SignError::IdempotencyKey(key.to_owned()));
    }
    Ok(())
}

/// The base URL without a trailing slash. A path or query in it would change the request
/// target curl sends and so break the signature, hence refused.
fn curl_base(base: &str) -> Result<&str, SignError> {
    let uri = Uri::from_str(base).map_err(|source| SignError::CurlUrl { url: base.to_owned(), source })?;
    if uri.scheme().is_none() || uri.authority().is_none() {
        return Err(SignError::CurlNotAbsolute(base.to_owned()));
    }
    if uri.path_and_query().is_some_and(|pq| pq.as_str() != "/") {
        return Err(SignError::CurlWithTarget(base.to_owned()));
    }
    Ok(base.strip_suffix('/').unwrap_or(base))
}

fn path_str(path: &Path) -> Result<&str, SignError> {
    path.to_str().ok_or_else(|| SignError::BodyPathNotUtf8(path.to_owned()))
}

/// Single-quotes `s` for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// 128 random bits from the kernel, as 32 hex characters.
fn random_nonce() -> Result<String, SignError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(SignError::Nonce)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "tests fail loudly")]

    use std::time::Duration;

    use http::{HeaderMap, HeaderName, HeaderValue};
    use limiter_core::signature::{SignedRequest, Verifier};

    use super::*;

    const TS: u64 = 1_700_000_000;

    fn args(method: &str, path: &str, body_file: Option<&str>, curl: Option<&str>) -> SignArgs {
        SignArgs {
            key_id: "k-free-1".into(),
            secret_file: PathBuf::from("/unused"),
            method: method.into(),
            path: path.into(),
            body_file: body_file.map(PathBuf::from),
            nonce: false,
            idempotency_key: None,
            host: None,
            timestamp: Some(TS),
            curl: curl.map(str::to_owned),
        }
    }

    #[test]
    fn host_is_signed_for_a_sign_host_key() {
        let key = limiter_core::signature::SigningKey { secrets: vec![b"s".to_vec()], sign_host: true };
        let verifier = Verifier::new([("k-free-1".to_owned(), key)]);
        let a = SignArgs { host: Some("API.example.com".into()), ..args("POST", "/pay", None, None) };
        let digest = sha256(b"");
        let verify = |host: &str| {
            let mut headers = parse_headers(&render(&a, b"s", b"", TS, None).unwrap());
            headers.insert("host", HeaderValue::from_str(host).unwrap());
            let req = SignedRequest { method: &Method::POST, target: "/pay", headers: &headers, body_sha256: &digest };
            verifier.authenticate(&req, TS, Duration::from_secs(300)).map(|_| ())
        };
        verify("api.example.com").unwrap();
        assert_eq!(verify("other.example.com"), Err(limiter_core::signature::Failure::BadMac));
        let curl = render(&SignArgs { curl: Some("http://127.0.0.1:8080".into()), ..a.clone() }, b"s", b"", TS, None);
        assert!(curl.unwrap().contains(" -H 'Host: API.example.com' "));
        let bad = SignArgs { host: Some("a b".into()), ..a.clone() };
        assert!(render(&bad, b"s", b"", TS, None).is_err());
    }

    /// The printed header lines, parsed back as the proxy would receive them.
    fn parse_headers(out: &str) -> HeaderMap {
        out.lines()
            .map(|line| {
                let (name, value) = line.split_once(": ").unwrap();
                (HeaderName::from_str(name).unwrap(), HeaderValue::from_str(value).unwrap())
            })
            .collect()
    }

    #[test]
    fn headers_match_the_fixed_vector() {
        // Same vector as signature::tests::canonical::fixed_vector.
        let a = args("POST", "/api/transfer?dry_run=1", Some("b.json"), None);
        let out = render(&a, b"k-free-1-secret", br#"{"amount":100,"to":"acct-42"}"#, TS, None).unwrap();
        assert_eq!(
            out,
            "X-API-Key: k-free-1\nX-Timestamp: 1700000000\n\
             X-Signature: 0a6176fce748b771768a0eccb4ee261c594e0dec5f7fc55b3df72276b7548094\n"
        );
    }

    #[test]
    fn output_is_accepted_by_the_verifier() {
        let verifier = Verifier::new([("k-free-1".to_owned(), vec![b"s".to_vec()])]);
        for nonce in [None, Some(random_nonce().unwrap())] {
            let a = args("PATCH", "/v1/x?y=%2F", None, None);
            let headers = parse_headers(&render(&a, b"s", b"payload", TS, nonce.as_deref()).unwrap());
            assert_eq!(headers.contains_key("x-nonce"), nonce.is_some());
            let digest = sha256(b"payload");
            let req = SignedRequest {
                method: &Method::PATCH,
                target: "/v1/x?y=%2F",
                headers: &headers,
                body_sha256: &digest,
            };
            verifier.authenticate(&req, TS + 5, Duration::from_secs(300)).unwrap();
        }
    }

    #[test]
    fn the_idempotency_key_is_sent_and_signed() {
        let verifier = Verifier::new([("k-free-1".to_owned(), vec![b"s".to_vec()])]);
        let a = SignArgs { idempotency_key: Some("order-7731".into()), ..args("POST", "/pay", None, None) };
        let out = render(&a, b"s", b"payload", TS, Some("n")).unwrap();
        let names: Vec<&str> = out.lines().filter_map(|line| Some(line.split_once(": ")?.0)).collect();
        assert_eq!(names, ["X-API-Key", "X-Timestamp", "X-Nonce", "Idempotency-Key", "X-Signature"]);
        let digest = sha256(b"payload");
        let verify = |headers: &HeaderMap| {
            let req = SignedRequest { method: &Method::POST, target: "/pay", headers, body_sha256: &digest };
            verifier.authenticate(&req, TS, Duration::from_secs(300)).map(|_| ())
        };
        let mut headers = parse_headers(&out);
        assert_eq!(headers["idempotency-key"], "order-7731");
        verify(&headers).unwrap();
        headers.remove("idempotency-key");
        assert_eq!(verify(&headers), Err(limiter_core::signature::Failure::BadMac));
        let curl = render(&SignArgs { curl: Some("http://h".into()), ..a.clone() }, b"s", b"", TS, None).unwrap();
        assert!(curl.contains(" -H 'Idempotency-Key: order-7731' "), "{curl}");
        for bad in [String::new(), "k".repeat(256), " padded".into(), "caf\u{e9}".into(), "tab\there".into()] {
            let a = SignArgs { idempotency_key: Some(bad.clone()), ..a.clone() };
            assert!(matches!(render(&a, b"s", b"", TS, None), Err(SignError::IdempotencyKey(_))), "{bad:?}");
        }
        let longest = SignArgs { idempotency_key: Some("k".repeat(255)), ..a };
        render(&longest, b"s", b"", TS, None).unwrap();
    }

    #[test]
    fn curl_command() {
        let a = args("POST", "/api/it's?a=[1]", Some("/tmp/my body.json"), Some("http://127.0.0.1:8080/"));
        let out = render(&a, b"s", b"{}", TS, Some("n")).unwrap();
        let sig = sign_hex(b"s", &format!("POST\n/api/it's?a=[1]\n{TS}\n{}\nn", hex::encode(sha256(b"{}"))));
        assert_eq!(
            out,
            format!(
                "curl --path-as-is --globoff -X 'POST' -H 'X-API-Key: k-free-1' -H 'X-Timestamp: {TS}' \
                 -H 'X-Nonce: n' -H 'X-Signature: {sig}' --data-binary '@/tmp/my body.json' \
                 'http://127.0.0.1:8080/api/it'\\''s?a=[1]'\n"
            )
        );
        let no_body = render(&args("GET", "/", None, Some("https://h")), b"s", b"", TS, None).unwrap();
        assert!(!no_body.contains("--data-binary"));
        assert!(no_body.ends_with(" 'https://h/'\n"));
    }

    #[test]
    fn refuses_inputs_that_would_not_verify() {
        let bad = [
            args("PO ST", "/", None, None),
            args("GET", "api", None, None),
            args("GET", "/a b", None, None),
            args("GET", "/", None, Some("http://h/base")),
            args("GET", "/", None, Some("http://h/?q")),
            args("GET", "/", None, Some("h:80")),
        ];
        for a in bad {
            assert!(render(&a, b"s", b"", TS, None).is_err(), "{a:?}");
        }
    }

    #[test]
    fn nonce_is_128_bit_hex() {
        let (a, b) = (random_nonce().unwrap(), random_nonce().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn run_reads_files() {
        let dir = std::env::temp_dir().join(format!("limiter-sign-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), "s\n").unwrap();
        let mut a = args("GET", "/", None, None);
        a.secret_file = dir.join("secret");
        run(a.clone()).unwrap();
        a.body_file = Some(dir.join("missing"));
        assert!(run(a.clone()).is_err());
        std::fs::write(dir.join("empty"), "").unwrap();
        a.body_file = None;
        a.secret_file = dir.join("empty");
        assert!(run(a).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
