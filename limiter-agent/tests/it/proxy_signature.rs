//! Signed routes through the proxy: verification, replays, rotation, the per-IP
//! charge for failures, and idempotency keys.

use http::{Method, StatusCode};
use limiter_core::{
    Clock as _, SystemClock,
    signature::{Canonical, sha256, sign_hex},
};
use limiter_lab::support::{
    proxy::{PROXY_HEAD, Reply, RunningProxy, TestClient, Upstream, secret_file},
    wait::PATIENCE,
};

limiter_lab::over_http1_and_http2!(
    valid_signature_passes_and_any_change_fails_alike,
    distinct_nonces_pass_and_a_rotated_key_verifies_with_either_secret,
    failed_signatures_are_charged_to_the_ip_limits,
    idempotency_key_replays_conflicts_and_in_flight,
    an_unsigned_request_naming_a_key_never_spends_its_quota,
    a_bearer_key_is_charged_on_its_id_alone,
    a_signed_request_refused_by_the_limits_cannot_be_replayed_once_they_refill,
    a_signed_request_refused_for_its_idempotency_key_cannot_be_replayed,
    the_idempotency_key_is_signed_and_cannot_be_stripped_or_changed,
    a_sign_host_key_signs_the_host,
    the_target_is_signed_as_sent_and_forwarded_in_canonical_form,
);

fn unix_now() -> u64 {
    SystemClock.now().as_secs()
}

const SECRET: &[u8] = b"k-pay-secret";
const NEW_SECRET: &[u8] = b"k-pay-secret-2";

fn config(secrets: &[&[u8]], extra: &str) -> String {
    config_with("", 1000, secrets, extra)
}

fn secret_references(secrets: &[&[u8]]) -> String {
    let references: Vec<String> =
        secrets.iter().map(|secret| format!("\"file:{}\"", secret_file(secret).display())).collect();
    references.join(", ")
}

/// `head` goes into `[proxy]`, `extra` after the `transfer` rule; the `basic` plan
/// allows `plan_limit` requests a minute.
fn config_with(head: &str, plan_limit: u32, secrets: &[&[u8]], extra: &str) -> String {
    format!(
        r#"{PROXY_HEAD}{head}
[proxy.plans.basic]
limit = {plan_limit}
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
        secret_references(secrets)
    )
}

/// A request and how to sign it.
#[derive(Clone)]
struct Signed<'a> {
    key_id: &'a str,
    method: Method,
    target: &'a str,
    body: &'a [u8],
    timestamp: u64,
    nonce: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    /// The host signed, for a `sign_host` key.
    host: Option<&'a str>,
}

impl<'a> Signed<'a> {
    fn post(target: &'a str, body: &'a [u8]) -> Self {
        Self {
            key_id: "k-pay",
            method: Method::POST,
            target,
            body,
            timestamp: unix_now(),
            nonce: None,
            idempotency_key: None,
            host: None,
        }
    }

    fn signature(&self, secret: &[u8]) -> String {
        let canonical = Canonical {
            method: self.method.as_str(),
            target: self.target,
            timestamp: &self.timestamp.to_string(),
            body_sha256: &sha256(self.body),
            nonce: self.nonce,
            idempotency_key: self.idempotency_key,
            host: self.host,
        };
        sign_hex(secret, &canonical.string_to_sign())
    }

    /// Sends the request with `signature`; `target`, `method` and `body` as they are
    /// now, which a test may have changed after signing.
    async fn send_with(&self, client: &TestClient, proxy: &RunningProxy, signature: &str) -> Reply {
        let timestamp = self.timestamp.to_string();
        let mut headers =
            vec![("x-api-key", self.key_id), ("x-timestamp", timestamp.as_str()), ("x-signature", signature)];
        headers.extend(self.nonce.map(|nonce| ("x-nonce", nonce)));
        headers.extend(self.idempotency_key.map(|key| ("idempotency-key", key)));
        client.request(self.method.clone(), &proxy.url(self.target), &headers, self.body).await
    }

    async fn send(&self, client: &TestClient, proxy: &RunningProxy) -> Reply {
        self.send_with(client, proxy, &self.signature(SECRET)).await
    }

    /// Sends the request, signed with `SECRET`, on a task of its own: for one the
    /// upstream holds while the test goes on.
    fn spawn(&self, client: &TestClient, proxy: &RunningProxy) -> tokio::task::JoinHandle<Reply> {
        let owned = |(name, value): (&str, &str)| (name.to_owned(), value.to_owned());
        let mut headers: Vec<(String, String)> = [
            ("x-api-key", self.key_id),
            ("x-timestamp", &self.timestamp.to_string()),
            ("x-signature", &self.signature(SECRET)),
        ]
        .map(owned)
        .to_vec();
        headers.extend(self.nonce.map(|nonce| owned(("x-nonce", nonce))));
        headers.extend(self.idempotency_key.map(|key| owned(("idempotency-key", key))));
        let (client, url, body, method) =
            (client.clone(), proxy.url(self.target), self.body.to_vec(), self.method.clone());
        tokio::spawn(async move {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            client.request(method, &url, &headers, &body).await
        })
    }
}

async fn valid_signature_passes_and_any_change_fails_alike(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
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
    // Off by 301 s from the proxy's own clock, which stands still: off the wall clock,
    // a second turning since the proxy started would make one of them 300 s, inside.
    let proxy_now = proxy.clock.now().as_secs();
    for timestamp in [proxy_now - 301, proxy_now + 301] {
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

    proxy
        .stats_until("every failure counted by its reason", |stats| {
            let reasons = &stats.signature_failure_reasons;
            (stats.signature_failures, stats.replays) == (12, 1)
                && (reasons["bad_mac"], reasons["skew"], reasons["bad_signature_format"]) == (6, 2, 2)
                && (reasons["missing_header"], reasons["replay"]) == (1, 1)
        })
        .await;
}

async fn distinct_nonces_pass_and_a_rotated_key_verifies_with_either_secret(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET, NEW_SECRET], ""), upstream.addr).await;
    let first = Signed { nonce: Some("a"), ..Signed::post("/api/transfer", b"x") };
    let second = Signed { nonce: Some("b"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(first.send(&client, &proxy).await.status, StatusCode::OK);
    assert_eq!(second.send_with(&client, &proxy, &second.signature(NEW_SECRET)).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
}

async fn failed_signatures_are_charged_to_the_ip_limits(client: TestClient) {
    let upstream = Upstream::start().await;
    let per_ip = "[[proxy.rules]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"sliding_window_log\"\nlimit = 3\nwindow = \"1m\"\n";
    let proxy = RunningProxy::start(&config(&[SECRET], per_ip), upstream.addr).await;
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

async fn idempotency_key_replays_conflicts_and_in_flight(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
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
    let in_flight = held.spawn(&client, &proxy);
    upstream.arrived(2).await;
    let duplicate = Signed { nonce: Some("5"), ..held }.send(&client, &proxy).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    upstream.release(1);
    assert_eq!(in_flight.await.expect("held request").status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
    proxy.stats_until("the answer from the store counted", |stats| stats.idempotent_replays == 1).await;
}

/// The operator's tool and the proxy agree: headers printed by the `limiter sign`
/// binary, pasted onto a request, pass; the same headers on a changed body do not,
/// nor without the `Idempotency-Key` it signed.
#[tokio::test]
async fn limiter_sign_output_is_accepted_by_the_proxy() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let body = br#"{"amount":5,"to":"acct-7"}"#;
    let body_file = secret_file(body);
    let url = proxy.url("/api/transfer?x=1");
    for idempotency_key in [None, Some("order-7")] {
        let mut sign = std::process::Command::new(env!("CARGO_BIN_EXE_limiter"));
        sign.args(["sign", "--key-id", "k-pay", "--method", "POST", "--path", "/api/transfer?x=1", "--nonce"])
            .arg("--secret-file")
            .arg(secret_file(SECRET))
            .arg("--body-file")
            .arg(&body_file);
        if let Some(key) = idempotency_key {
            sign.args(["--idempotency-key", key]);
        }
        let output = sign.output().expect("run limiter sign");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8(output.stdout).expect("utf-8");
        let headers: Vec<(&str, &str)> = printed.lines().filter_map(|line| line.split_once(": ")).collect();
        let expected = if idempotency_key.is_some() { 5 } else { 4 };
        assert_eq!(headers.len(), expected, "key, timestamp, nonce, [idempotency key,] signature: {printed}");
        let tampered = client.request(Method::POST, &url, &headers, br#"{"amount":500,"to":"acct-7"}"#).await;
        assert_eq!(tampered.status, StatusCode::UNAUTHORIZED);
        if idempotency_key.is_some() {
            let without_key: Vec<(&str, &str)> =
                headers.iter().copied().filter(|(name, _)| !name.eq_ignore_ascii_case("idempotency-key")).collect();
            let stripped = client.request(Method::POST, &url, &without_key, body).await;
            assert_eq!(stripped.status, StatusCode::UNAUTHORIZED);
        }
        let reply = client.request(Method::POST, &url, &headers, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].body, &body[..]);
    assert_eq!(seen[1].headers["idempotency-key"], "order-7");
}

/// Seed attack (issue 10 §3): key ids are not secrets. Unsigned requests naming the
/// key used to spend its plan, and its owner then got 429.
async fn an_unsigned_request_naming_a_key_never_spends_its_quota(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config_with("", 3, &[SECRET], ""), upstream.addr).await;
    for _ in 0..5 {
        let reply = client.get(&proxy.url("/public"), &[("x-api-key", "k-pay")]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.headers.get("ratelimit-policy").is_none(), "charged to no plan: {:?}", reply.headers);
    }
    // A failed signature on an unsigned route proves nothing either: 401, as on signed routes.
    let forged = Signed { method: Method::GET, target: "/public", ..Signed::post("/public", b"") };
    let reply = forged.send_with(&client, &proxy, &forged.signature(b"guessed")).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let owner = Signed { nonce: Some("owner"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(owner.send(&client, &proxy).await.status, StatusCode::OK);
    // A signed request on any route is the key's, and spends its plan.
    let signed_public = Signed { method: Method::GET, ..Signed::post("/public", b"") };
    let reply = signed_public.send(&client, &proxy).await;
    assert_eq!((reply.status, reply.header("ratelimit-policy")), (StatusCode::OK, r#""basic";q=3;w=60"#));
    assert_eq!(upstream.count(), 7);
}

/// `auth = "bearer"`: the key id alone is taken as proof, as an explicit choice.
async fn a_bearer_key_is_charged_on_its_id_alone(client: TestClient) {
    let upstream = Upstream::start().await;
    let extra = "[[proxy.keys]]\nid = \"k-bearer\"\nplan = \"basic\"\nauth = \"bearer\"\n";
    let proxy = RunningProxy::start(&config_with("", 2, &[SECRET], extra), upstream.addr).await;
    let statuses: Vec<StatusCode> = {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(client.get(&proxy.url("/public"), &[("x-api-key", "k-bearer")]).await.status);
        }
        statuses
    };
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

/// Issue 25 item 10: a signed request refused by a limit (429) used to be forgotten,
/// so anyone who saw it could send its exact bytes once the plan refilled and have the
/// upstream run it. Its signature is now burnt: the resend is a replay (401).
async fn a_signed_request_refused_by_the_limits_cannot_be_replayed_once_they_refill(client: TestClient) {
    let upstream = Upstream::start().await;
    let per_key = "[[proxy.rules]]\nname = \"per-key\"\npath = \"/api\"\nkey = \"api_key\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n";
    let proxy = RunningProxy::start(&config(&[SECRET], per_key), upstream.addr).await;
    let first = Signed { nonce: Some("a"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(first.send(&client, &proxy).await.status, StatusCode::OK);
    let refused = Signed { nonce: Some("b"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(refused.send(&client, &proxy).await.status, StatusCode::TOO_MANY_REQUESTS);
    proxy.clock.advance(std::time::Duration::from_secs(60));
    let resent = refused.send(&client, &proxy).await;
    assert_eq!(resent.status, StatusCode::UNAUTHORIZED, "{:?}", resent.body);
    proxy.stats_until("the resend counted as a replay", |stats| stats.replays == 1).await;
    assert_eq!(upstream.count(), 1);
    // The client itself retries by signing anew, and the refilled plan lets it through.
    let retry = Signed { nonce: Some("c"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(retry.send(&client, &proxy).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
}

/// Issue 25 item 10, with idempotency refusals: a request refused with 422 (its key
/// reused for another body) or 409 (its key in flight) used to be forgotten, and its
/// key was not signed: the same bytes were good again, and without the
/// `Idempotency-Key` header the upstream ran them.
async fn a_signed_request_refused_for_its_idempotency_key_cannot_be_replayed(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let with_key = |nonce, target, body: &'static [u8], key| Signed {
        nonce: Some(nonce),
        idempotency_key: Some(key),
        ..Signed::post(target, body)
    };
    assert_eq!(with_key("1", "/api/transfer", b"pay 10", "idem-1").send(&client, &proxy).await.status, StatusCode::OK);
    let conflicting = with_key("2", "/api/transfer", b"pay 99", "idem-1");
    assert_eq!(conflicting.send(&client, &proxy).await.status, StatusCode::UNPROCESSABLE_ENTITY);
    let signature = conflicting.signature(SECRET);
    let resends = [
        conflicting.send(&client, &proxy).await,
        Signed { idempotency_key: None, ..conflicting.clone() }.send_with(&client, &proxy, &signature).await,
        Signed { idempotency_key: Some("idem-fresh"), ..conflicting.clone() }
            .send_with(&client, &proxy, &signature)
            .await,
    ];
    for (case, reply) in ["as sent", "key stripped", "key changed"].iter().zip(&resends) {
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{case}: {:?}", reply.body);
    }

    let held = with_key("3", "/api/transfer/hold", b"pay 5", "idem-2");
    let in_flight = held.spawn(&client, &proxy);
    upstream.arrived(2).await;
    let duplicate = with_key("4", "/api/transfer/hold", b"pay 5", "idem-2");
    assert_eq!(duplicate.send(&client, &proxy).await.status, StatusCode::CONFLICT);
    upstream.release(1);
    assert_eq!(in_flight.await.expect("held request").status, StatusCode::OK);
    // Before, the 409's bytes were answered from the store; now they are a replay.
    assert_eq!(duplicate.send(&client, &proxy).await.status, StatusCode::UNAUTHORIZED);
    proxy.stats_until("every resend counted as a replay", |stats| stats.replays == 2).await;
    assert_eq!(upstream.count(), 2);
}

/// Issue 25 item 10: the signature covers `Idempotency-Key` when it is sent, so that
/// nobody on the way can drop it (and have a retried request run twice) or change it;
/// a client that sends no key signs as it always did.
async fn the_idempotency_key_is_signed_and_cannot_be_stripped_or_changed(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let signed = Signed { nonce: Some("1"), idempotency_key: Some("idem-s"), ..Signed::post("/api/transfer", b"pay") };
    let signature = signed.signature(SECRET);
    let old_client = Signed { nonce: Some("2"), ..Signed::post("/api/transfer", b"pay") };
    let tampered = [
        Signed { idempotency_key: None, ..signed.clone() }.send_with(&client, &proxy, &signature).await,
        Signed { idempotency_key: Some("idem-t"), ..signed.clone() }.send_with(&client, &proxy, &signature).await,
        Signed { idempotency_key: Some("idem-s"), ..old_client.clone() }
            .send_with(&client, &proxy, &old_client.signature(SECRET))
            .await,
    ];
    for (case, reply) in ["stripped", "changed", "added"].iter().zip(&tampered) {
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{case}: {:?}", reply.body);
    }
    assert_eq!(upstream.count(), 0);
    assert_eq!(signed.send(&client, &proxy).await.status, StatusCode::OK);
    assert_eq!(old_client.send(&client, &proxy).await.status, StatusCode::OK);
    let seen: Vec<Option<String>> = upstream
        .seen()
        .iter()
        .map(|seen| seen.headers.get("idempotency-key").map(|key| key.to_str().expect("ascii").to_owned()))
        .collect();
    assert_eq!(seen, [Some("idem-s".to_owned()), None]);
    proxy
        .stats_until("the tampered ones counted as bad MACs", |stats| stats.signature_failure_reasons["bad_mac"] == 3)
        .await;
}

/// One key filling the replay cache made every other key's valid requests fail; each
/// key now has its share (`replay_cache_size` / number of keys).
#[tokio::test]
async fn one_key_cannot_fill_the_replay_cache_for_another() {
    const OTHER: &[u8] = b"k-other-secret";
    let upstream = Upstream::start().await;
    let extra =
        format!("[[proxy.keys]]\nid = \"k-other\"\nplan = \"basic\"\nsecrets = [{}]\n", secret_references(&[OTHER]));
    let head = "[proxy.signature]\nreplay_cache_size = 4\n";
    let proxy = RunningProxy::start(&config_with(head, 1000, &[SECRET], &extra), upstream.addr).await;
    let client = TestClient::default();
    let mut flood = Vec::new();
    for nonce in ["1", "2", "3", "4"] {
        flood.push(
            Signed { nonce: Some(nonce), ..Signed::post("/api/transfer", b"x") }.send(&client, &proxy).await.status,
        );
    }
    assert_eq!(flood, [StatusCode::OK, StatusCode::OK, StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED]);
    let other = Signed { key_id: "k-other", nonce: Some("1"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(other.send_with(&client, &proxy, &other.signature(OTHER)).await.status, StatusCode::OK);
    proxy
        .stats_until("both refusals for a full share counted", |stats| {
            stats.signature_failure_reasons["replay_cache_full"] == 2
        })
        .await;
}

fn idempotent<'a>(nonce: &'a str, target: &'a str, key: &'a str) -> Signed<'a> {
    Signed { nonce: Some(nonce), idempotency_key: Some(key), ..Signed::post(target, b"pay 10") }
}

/// A request that reached the upstream but got no answer in time (504) used to free
/// its key, and the retry ran it a second time.
#[tokio::test]
async fn an_idempotent_request_without_an_answer_is_never_run_again() {
    let upstream = Upstream::start().await;
    let head = "upstream_timeout = \"300ms\"\n";
    let proxy = RunningProxy::start(&config_with(head, 1000, &[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let first = idempotent("1", "/api/transfer/hold", "idem-504").send(&client, &proxy).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    // Whatever the upstream does now, the retry must not reach it.
    upstream.release(2);
    let retry = idempotent("2", "/api/transfer/hold", "idem-504").send(&client, &proxy).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(retry.json()["type"], "https://limiter.dev/problems#idempotency-outcome-unknown");
    assert_eq!(upstream.count(), 1);
}

/// The client hanging up while the upstream works used to free the key as well.
#[tokio::test]
async fn an_idempotent_request_whose_client_left_is_never_run_again() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let request = idempotent("1", "/api/transfer/hold", "idem-gone");
    let head = format!(
        "POST /api/transfer/hold HTTP/1.1\r\nhost: x\r\nx-api-key: k-pay\r\nx-timestamp: {}\r\nx-nonce: 1\r\nx-signature: {}\r\nidempotency-key: idem-gone\r\ncontent-length: 6\r\n\r\npay 10",
        request.timestamp,
        request.signature(SECRET)
    );
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut stream, head.as_bytes()).await.expect("send");
    upstream.arrived(1).await;
    drop(stream);
    let client = TestClient::default();
    // Until the proxy sees the hang-up the key is in flight (409 as well); then the
    // outcome is unknown. Either way the upstream must never see it twice.
    let unknown = "https://limiter.dev/problems#idempotency-outcome-unknown";
    let retries = async {
        for nonce in 2.. {
            let retry = idempotent(&nonce.to_string(), "/api/transfer/hold", "idem-gone").send(&client, &proxy).await;
            if retry.status != StatusCode::CONFLICT || retry.json()["type"] == unknown {
                return retry;
            }
            tokio::task::yield_now().await;
        }
        unreachable!("the nonces ran out")
    };
    let retry = tokio::time::timeout(PATIENCE, retries).await.expect("the retry was answered without the upstream");
    upstream.release(2);
    assert_eq!((retry.status, retry.json()["type"].as_str()), (StatusCode::CONFLICT, Some(unknown)));
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn an_idempotency_key_over_255_bytes_is_refused() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let longest = "k".repeat(255);
    assert_eq!(idempotent("1", "/api/transfer", &longest).send(&client, &proxy).await.status, StatusCode::OK);
    let too_long = "k".repeat(256);
    let reply = idempotent("2", "/api/transfer", &too_long).send(&client, &proxy).await;
    assert_eq!(
        (reply.status, reply.json()["type"].as_str()),
        (StatusCode::BAD_REQUEST, Some("https://limiter.dev/problems#bad-idempotency-key"))
    );
    assert_eq!(upstream.count(), 1);
}

/// A client whose request got 409 while its idempotency key was in flight retries by
/// signing anew (the 409's signature is burnt), and is answered from the store once
/// the first one has completed.
#[tokio::test]
async fn a_request_refused_for_an_idempotency_key_in_flight_is_retried_signed_anew() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let in_flight = idempotent("1", "/api/transfer/hold", "idem-retry").spawn(&client, &proxy);
    upstream.arrived(1).await;
    assert_eq!(
        idempotent("2", "/api/transfer/hold", "idem-retry").send(&client, &proxy).await.status,
        StatusCode::CONFLICT
    );
    upstream.release(1);
    assert_eq!(in_flight.await.expect("held request").status, StatusCode::OK);
    let again = idempotent("3", "/api/transfer/hold", "idem-retry").send(&client, &proxy).await;
    assert_eq!((again.status, again.header("idempotency-replayed")), (StatusCode::OK, "true"));
    assert_eq!(upstream.count(), 1);
}

/// A malformed `Idempotency-Key` is refused (400), and as the key is signed, dropping
/// it does not make the same signature good for an unprotected request.
#[tokio::test]
async fn a_malformed_idempotency_key_cannot_be_dropped_to_reuse_the_signature() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let client = TestClient::default();
    let too_long = "k".repeat(256);
    let request = idempotent("1", "/api/transfer", &too_long);
    let signature = request.signature(SECRET);
    assert_eq!(request.send_with(&client, &proxy, &signature).await.status, StatusCode::BAD_REQUEST);
    let dropped = Signed { idempotency_key: None, ..request };
    assert_eq!(dropped.send_with(&client, &proxy, &signature).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(upstream.count(), 0);
}

/// Twenty identical requests at once: exactly one reaches the upstream, the others
/// get 409 while it runs.
#[tokio::test]
async fn twenty_concurrent_identical_requests_run_once() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
    let statuses = twenty_at_once(&upstream, &proxy, |nonce| idempotent(nonce, "/api/transfer/hold", "idem-20")).await;
    assert_eq!(statuses[..19], [StatusCode::CONFLICT; 19]);
    assert_eq!(statuses[19], StatusCode::OK);
    assert_eq!(upstream.count(), 1);
}

/// Sends 20 requests at once; the statuses in the order they came back. The held one
/// is released once the 19 others have been answered without it.
async fn twenty_at_once(
    upstream: &Upstream,
    proxy: &RunningProxy,
    request: impl Fn(&str) -> Signed<'_>,
) -> Vec<StatusCode> {
    let (done, mut replies) = tokio::sync::mpsc::unbounded_channel();
    let client = TestClient::default();
    for n in 0..20 {
        let nonce = n.to_string();
        let sent = request(&nonce).spawn(&client, proxy);
        let done = done.clone();
        tokio::spawn(async move {
            if let Ok(reply) = sent.await {
                let _ = done.send(reply.status);
            }
        });
    }
    let mut statuses = Vec::new();
    for _ in 0..19 {
        let status = tokio::time::timeout(PATIENCE, replies.recv()).await.expect("19 answered without the upstream");
        statuses.push(status.expect("a sender"));
    }
    upstream.arrived(1).await;
    upstream.release(1);
    statuses.push(tokio::time::timeout(PATIENCE, replies.recv()).await.expect("the held one").expect("a sender"));
    statuses
}

/// Without `sign_host`, a request signed for one site verifies on any other behind the
/// same keys; with it, the signature covers the lowercase `Host`.
async fn a_sign_host_key_signs_the_host(client: TestClient) {
    let upstream = Upstream::start().await;
    let extra = "[[proxy.keys]]\nid = \"k-site\"\nplan = \"basic\"\nsign_host = true\n";
    let text =
        config(&[SECRET], extra).replace(extra, &format!("{extra}secrets = [{}]\n", secret_references(&[SECRET])));
    let proxy = RunningProxy::start(&text, upstream.addr).await;
    let site =
        |nonce, host| Signed { key_id: "k-site", nonce: Some(nonce), host, ..Signed::post("/api/transfer", b"x") };
    let send_to = |request: &Signed<'_>, host: &'static str| {
        let timestamp = request.timestamp.to_string();
        let signature = request.signature(SECRET);
        let nonce = request.nonce.unwrap_or_default().to_owned();
        let (client, addr, target) = (client.clone(), proxy.addr, request.target.to_owned());
        async move {
            let headers = [
                ("x-api-key", "k-site"),
                ("x-timestamp", timestamp.as_str()),
                ("x-nonce", nonce.as_str()),
                ("x-signature", signature.as_str()),
            ];
            client.request_to_host(addr, host, Method::POST, &target, &headers, b"x").await.status
        }
    };
    assert_eq!(send_to(&site("1", Some("Pay.Example.com")), "pay.example.com").await, StatusCode::OK);
    // The same request signed for one site, sent to another; and signed without a host.
    assert_eq!(send_to(&site("2", Some("pay.example.com")), "admin.example.com").await, StatusCode::UNAUTHORIZED);
    assert_eq!(send_to(&site("3", None), "pay.example.com").await, StatusCode::UNAUTHORIZED);
    // Keys without it keep the scheme as it was.
    let plain = Signed { nonce: Some("4"), ..Signed::post("/api/transfer", b"x") };
    assert_eq!(plain.send(&client, &proxy).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
}

async fn the_target_is_signed_as_sent_and_forwarded_in_canonical_form(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&[SECRET], ""), upstream.addr).await;
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
