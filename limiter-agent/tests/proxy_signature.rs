//! Signed routes through the proxy: verification, replays, rotation, the per-IP
//! charge for failures, and idempotency keys.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
};

use http::{Method, StatusCode};
use limiter_core::{
    Clock as _, SystemClock,
    signature::{Canonical, sha256, sign_hex},
};
use limiter_lab::support::proxy::{PROXY_HEAD, Reply, RunningProxy, TestClient, Upstream};

fn unix_now() -> u64 {
    SystemClock.now().as_secs()
}

const SECRET: &[u8] = b"k-pay-secret";
const NEW_SECRET: &[u8] = b"k-pay-secret-2";

/// A fresh secret file: tests run concurrently, so none may rewrite another's.
fn secret_file(secret: &[u8]) -> PathBuf {
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("limiter-proxy-test-{}-{n}", std::process::id()));
    std::fs::write(&path, secret).expect("write secret file");
    path
}

fn config(secrets: &[&[u8]], extra: &str) -> String {
    let references: Vec<String> =
        secrets.iter().map(|secret| format!("\"file:{}\"", secret_file(secret).display())).collect();
    format!(
        r#"{PROXY_HEAD}
[proxy.plans.basic]
limit = 1000
window = "1m"
[[proxy.keys]]
id = "k-pay"
plan = "basic"
secrets = [{}]
[[proxy.rules]]
name = "transfer"
path = "/api/transfer"
require_signature = true
key = "api_key"
algorithm = "token_bucket"
limit = 100
window = "1s"
{extra}"#,
        references.join(", ")
    )
}

/// A request and how to sign it.
struct Signed<'a> {
    method: Method,
    target: &'a str,
    body: &'a [u8],
    timestamp: u64,
    nonce: Option<&'a str>,
    idempotency_key: Option<&'a str>,
}

impl<'a> Signed<'a> {
    fn post(target: &'a str, body: &'a [u8]) -> Self {
        Self { method: Method::POST, target, body, timestamp: unix_now(), nonce: None, idempotency_key: None }
    }

    fn signature(&self, secret: &[u8]) -> String {
        let canonical = Canonical {
            method: self.method.as_str(),
            target: self.target,
            timestamp: &self.timestamp.to_string(),
            body_sha256: &sha256(self.body),
            nonce: self.nonce,
        };
        sign_hex(secret, &canonical.string_to_sign())
    }

    /// Sends the request with `signature`; `target`, `method` and `body` as they are
    /// now, which a test may have changed after signing.
    async fn send_with(&self, client: &TestClient, proxy: &RunningProxy, signature: &str) -> Reply {
        let timestamp = self.timestamp.to_string();
        let mut headers = vec![("x-api-key", "k-pay"), ("x-timestamp", timestamp.as_str()), ("x-signature", signature)];
        headers.extend(self.nonce.map(|nonce| ("x-nonce", nonce)));
        headers.extend(self.idempotency_key.map(|key| ("idempotency-key", key)));
        client.request(self.method.clone(), &proxy.url(self.target), &headers, self.body).await
    }

    async fn send(&self, client: &TestClient, proxy: &RunningProxy) -> Reply {
        self.send_with(client, proxy, &self.signature(SECRET)).await
    }
}

#[tokio::test]
async fn valid_signature_passes_and_any_change_fails_alike() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let body = br#"{"amount":100,"to":"acct-42"}"#;

    let valid = Signed::post("/api/transfer?dry_run=1", body);
    let reply = valid.send(&client, &proxy).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(upstream.seen()[0].body, &body[..]);
    assert_eq!(reply.header("ratelimit-policy"), r#""transfer";q=100;w=1, "basic";q=1000;w=60"#);

    let original = || Signed { nonce: Some("n-1"), ..Signed::post("/api/transfer?dry_run=1", body) };
    let signature = original().signature(SECRET);
    let mut failures = Vec::new();
    for changed in [
        Signed { body: br#"{"amount":900,"to":"acct-42"}"#, ..original() },
        Signed { method: Method::PUT, ..original() },
        Signed { target: "/api/transfer/other?dry_run=1", ..original() },
        Signed { target: "/api/transfer?dry_run=0", ..original() },
        Signed { timestamp: original().timestamp + 1, ..original() },
    ] {
        failures.push(changed.send_with(&client, &proxy, &signature).await);
    }
    for timestamp in [unix_now() - 301, unix_now() + 301] {
        failures.push(Signed { timestamp, ..original() }.send(&client, &proxy).await);
    }
    failures.push(original().send_with(&client, &proxy, &signature[..63]).await);
    failures.push(original().send_with(&client, &proxy, &signature.to_uppercase()).await);
    failures.push(client.request(Method::POST, &proxy.url("/api/transfer"), &[("x-api-key", "k-pay")], body).await);
    failures.push(original().send_with(&client, &proxy, &original().signature(b"not the secret")).await);
    // The first request once more: a replay.
    failures.push(valid.send(&client, &proxy).await);

    let first = &failures[0];
    assert_eq!(first.json()["type"], "https://limiter.dev/problems#invalid-signature");
    for (i, reply) in failures.iter().enumerate() {
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "case {i}");
        assert_eq!(reply.body, first.body, "case {i}: every failure looks the same");
    }
    assert_eq!(upstream.count(), 1);

    let stats = proxy.proxy.stats();
    assert_eq!(stats.signature_failures, 12);
    assert_eq!(stats.replays, 1);
    let reasons = &stats.signature_failure_reasons;
    assert_eq!((reasons["bad_mac"], reasons["skew"], reasons["bad_signature_format"]), (6, 2, 2));
    assert_eq!((reasons["missing_header"], reasons["replay"]), (1, 1));
}

#[tokio::test]
async fn distinct_nonces_pass_and_a_rotated_key_verifies_with_either_secret() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET, NEW_SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let first = Signed { nonce: Some("a"), ..Signed::post("/api/transfer", b"x") };
    let second = Signed { nonce: Some("b"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(first.send(&client, &proxy).await.status, StatusCode::OK);
    assert_eq!(second.send_with(&client, &proxy, &second.signature(NEW_SECRET)).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn failed_signatures_are_charged_to_the_ip_limits() {
    let upstream = Upstream::start().await;
    let per_ip = "[[proxy.rules]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"sliding_window_log\"\nlimit = 3\nwindow = \"1m\"\n";
    let proxy = RunningProxy::start(&config(&[SECRET], per_ip), upstream.addr).await;
    let client = TestClient::default();
    for guess in ["0", "1", "2"] {
        let request = Signed { nonce: Some(guess), ..Signed::post("/api/transfer", b"x") };
        let reply = request.send_with(&client, &proxy, &"0".repeat(64)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    }
    let honest = Signed { nonce: Some("honest"), ..Signed::post("/api/transfer", b"x") };
    let reply = honest.send(&client, &proxy).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.json()["violated_policies"], serde_json::json!(["per-ip"]));
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn idempotency_key_replays_conflicts_and_in_flight() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let with_key = |nonce, body: &'static [u8], key| Signed {
        nonce: Some(nonce),
        idempotency_key: Some(key),
        ..Signed::post("/api/transfer", body)
    };

    let first = with_key("1", b"pay 10", "idem-1").send(&client, &proxy).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.headers.get("idempotency-replayed").is_none());
    let again = with_key("2", b"pay 10", "idem-1").send(&client, &proxy).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.header("idempotency-replayed"), "true");
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.count(), 1);

    let other_body = with_key("3", b"pay 99", "idem-1").send(&client, &proxy).await;
    assert_eq!(other_body.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.count(), 1);

    let held =
        Signed { nonce: Some("4"), idempotency_key: Some("idem-2"), ..Signed::post("/api/transfer/hold", b"pay 5") };
    let (held_client, held_proxy_url) = (client.clone(), proxy.url(""));
    let signature = held.signature(SECRET);
    let timestamp = held.timestamp.to_string();
    let in_flight = tokio::spawn(async move {
        let headers = [
            ("x-api-key", "k-pay"),
            ("x-timestamp", timestamp.as_str()),
            ("x-signature", signature.as_str()),
            ("x-nonce", "4"),
            ("idempotency-key", "idem-2"),
        ];
        held_client.request(Method::POST, &format!("{held_proxy_url}/api/transfer/hold"), &headers, b"pay 5").await
    });
    upstream.arrived(2).await;
    let duplicate = Signed { nonce: Some("5"), ..held }.send(&client, &proxy).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    upstream.release(1);
    assert_eq!(in_flight.await.expect("held request").status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
    assert_eq!(proxy.proxy.stats().idempotent_replays, 1);
}

/// The operator's tool and the proxy agree: headers printed by the `limiter sign`
/// binary, pasted onto a request, pass; the same headers on a changed body do not.
#[tokio::test]
async fn limiter_sign_output_is_accepted_by_the_proxy() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let body = br#"{"amount":5,"to":"acct-7"}"#;
    let body_file = secret_file(body);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_limiter"))
        .args(["sign", "--key-id", "k-pay", "--method", "POST", "--path", "/api/transfer?x=1", "--nonce"])
        .arg("--secret-file")
        .arg(secret_file(SECRET))
        .arg("--body-file")
        .arg(&body_file)
        .output()
        .expect("run limiter sign");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).expect("utf-8");
    let headers: Vec<(&str, &str)> = printed.lines().filter_map(|line| line.split_once(": ")).collect();
    assert_eq!(headers.len(), 4, "key, timestamp, nonce, signature: {printed}");
    let reply = client.request(Method::POST, &proxy.url("/api/transfer?x=1"), &headers, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(upstream.seen()[0].body, &body[..]);
    let tampered = client
        .request(Method::POST, &proxy.url("/api/transfer?x=1"), &headers, br#"{"amount":500,"to":"acct-7"}"#)
        .await;
    assert_eq!(tampered.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_target_is_signed_as_sent_and_forwarded_in_canonical_form() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let sent = Signed { nonce: Some("a"), ..Signed::post("/api/%74ransfer?to=%2e", b"x") };
    assert_eq!(sent.send(&client, &proxy).await.status, StatusCode::OK);
    // Signed over the canonical form instead of what was sent: refused.
    let canonical = Signed { nonce: Some("b"), ..Signed::post("/api/transfer?to=%2e", b"x") };
    let as_sent = Signed { target: "//api/transfer?to=%2e", ..Signed::post("", b"x") };
    let reply = Signed { nonce: Some("b"), ..as_sent }.send_with(&client, &proxy, &canonical.signature(SECRET)).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.to_string()).collect();
    assert_eq!(seen, ["/api/transfer?to=%2e"]);
}
