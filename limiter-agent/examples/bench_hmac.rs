//! Signed-request verification throughput by body size: what the proxy does per
//! signed request (SHA-256 of the body, the string to sign, HMAC-SHA256 with every
//! slot, constant-time compare, replay-cache insert). Prints one JSON object.
//!
//! Usage: bench_hmac [BYTES_PER_SIZE]
//!        bench_hmac --wrk-script COUNT KEY_ID SECRET PATH OUT.lua
//!          writes a wrk script that sends COUNT distinct signed GETs (one nonce each,
//!          so none is a replay), for the HTTP bench's signed route.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use http::{HeaderMap, HeaderValue, Method};
use limiter_core::{
    Clock as _, SystemClock,
    signature::{Canonical, ReplayCache, SignedRequest, Verifier, sha256, sign_hex},
};
use limiter_lab::report::{Hmac, HmacRow};

const KEY_ID: &str = "bench-key";
const SECRET: &[u8] = b"bench-secret-0123456789abcdef";

fn signed_headers(method: &str, target: &str, body_hash: &[u8; 32], nonce: &str, now: u64) -> HeaderMap {
    let timestamp = now.to_string();
    let message = Canonical {
        method,
        target,
        timestamp: &timestamp,
        body_sha256: body_hash,
        nonce: Some(nonce),
        idempotency_key: None,
        host: None,
    }
    .string_to_sign();
    let mut headers = HeaderMap::new();
    let value = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
    headers.insert("x-api-key", value(KEY_ID));
    headers.insert("x-timestamp", value(&timestamp));
    headers.insert("x-nonce", value(nonce));
    headers.insert("x-signature", value(&sign_hex(SECRET, &message)));
    headers
}

fn wrk_script(args: &[String]) -> anyhow::Result<()> {
    let [count, key_id, secret, path, out] = args else {
        anyhow::bail!("usage: bench_hmac --wrk-script COUNT KEY_ID SECRET PATH OUT.lua");
    };
    let count: usize = count.parse()?;
    let now = SystemClock.now().as_secs();
    let body_hash = sha256(b"");
    // The requests go in a data file read at init: a script of that many statements
    // is more than LuaJIT compiles.
    let data = format!("{out}.data");
    let timestamp = now.to_string();
    let mut lines = String::new();
    for i in 0..count {
        let nonce = format!("n{i}-{now}");
        let message = Canonical {
            method: "GET",
            target: path,
            timestamp: &timestamp,
            body_sha256: &body_hash,
            nonce: Some(&nonce),
            idempotency_key: None,
            host: None,
        }
        .string_to_sign();
        lines += &format!("{nonce} {}\n", sign_hex(secret.as_bytes(), &message));
    }
    std::fs::write(&data, lines)?;
    // One wrk thread: each request is sent once, in order; past the end they repeat
    // (and are refused as replays, which the report counts as errors).
    let lua = format!(
        "local reqs = {{}}\nlocal n = 0\nlocal i = 0\n\
         function init(args)\n  for line in io.lines('{data}') do\n    local nonce, sig = line:match('(%S+) (%S+)')\n    n = n + 1\n    \
         reqs[n] = wrk.format('GET', '{path}', {{['X-API-Key']='{key_id}', ['X-Timestamp']='{timestamp}', ['X-Nonce']=nonce, ['X-Signature']=sig}})\n  end\nend\n\
         function request() i = i + 1 if i > n then i = 1 end return reqs[i] end\n"
    );
    std::fs::write(out, lua)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--wrk-script") {
        return wrk_script(&args[1..]);
    }
    let bytes_per_size: usize = args.first().map_or(Ok(256 << 20), |a| a.parse())?;
    let verifier = Verifier::new([(KEY_ID.to_owned(), vec![SECRET.to_vec()])]);
    let replay = ReplayCache::new(10_000_000);
    let method = Method::POST;
    let target = "/api/transfer";
    let mut rows = Vec::new();
    for size in [64usize, 1024, 64 * 1024, 1024 * 1024] {
        let body: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let count = (bytes_per_size / size).clamp(20, 200_000);
        let now = SystemClock.now().as_secs();
        let body_hash = sha256(&body);
        // Signing is the client's work: done before the clock starts.
        let requests: Vec<HeaderMap> =
            (0..count).map(|i| signed_headers("POST", target, &body_hash, &format!("nonce-{size}-{i}"), now)).collect();
        let started = Instant::now();
        let mut verified = 0usize;
        for headers in &requests {
            let hash = sha256(black_box(&body));
            let request = SignedRequest { method: &method, target, headers, body_sha256: &hash };
            // What the proxy does in memory: the MAC, then the replay check.
            let max_skew = Duration::from_secs(300);
            if let Ok(signed) = verifier.authenticate(&request, now, max_skew)
                && replay.check_and_insert(&signed.key_id, &signed.signature, signed.timestamp, max_skew, now).is_ok()
            {
                verified += 1;
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        anyhow::ensure!(verified == count, "only {verified} of {count} verified");
        rows.push(HmacRow {
            body_bytes: size,
            requests: count,
            ns_per_request: elapsed * 1e9 / count as f64,
            requests_per_second: count as f64 / elapsed,
            bytes_per_second: (count * size) as f64 / elapsed,
        });
    }
    println!("{}", serde_json::to_string(&Hmac { rows, sha_ni: std::is_x86_feature_detected!("sha") })?);
    Ok(())
}
