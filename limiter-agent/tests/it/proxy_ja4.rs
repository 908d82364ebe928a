//! TLS fingerprints (JA4): what the upstream is told matches what a capture of the
//! same handshake gives (tcpdump on the loopback, then `ja4.py`, the spec read
//! apart from the proxy's parser), a client's own `X-JA4` never reaches the upstream,
//! a balancer's `ja4_header` is believed from `trusted_proxies` only, and, with the
//! kernel layer, clients in two namespaces presenting one fingerprint share its
//! bucket and are blocked together, an allowed third never.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::Output,
    time::{Duration, Instant},
};

use http::StatusCode;
use limiter_lab::{
    netns::HostLab,
    support::{
        agent::{AgentProcess, agent_section},
        ja4::Capture,
        proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, raw_exchange},
        tls::TestTls,
        unique,
        wait::{assert_about, until_async},
    },
};

async fn curl(args: &[&str]) -> Output {
    tokio::process::Command::new("curl").args(["-sS", "--max-time", "10"]).args(args).output().await.expect("curl")
}

/// What the upstream was told of each request it received, in order.
fn told(upstream: &Upstream) -> Vec<Option<String>> {
    upstream
        .seen()
        .iter()
        .map(|seen| {
            let mut values = seen.headers.get_all("x-ja4").iter();
            let value = values.next().map(|value| value.to_str().unwrap_or("<not text>").to_owned());
            assert!(values.next().is_none(), "one X-JA4 at most: {:?}", seen.headers);
            value
        })
        .collect()
}

const FORGED: &str = "t13d1516h2_8daaf6152771_e5627efa2ab1";

#[tokio::test]
async fn the_upstream_is_told_the_fingerprint_a_capture_of_the_handshake_gives() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let log = std::env::temp_dir().join(format!("{}.jsonl", unique("limiter-ja4-decisions-")));
    let config = tls.proxy_head().replace("[proxy.tls]", &format!("decision_log = {{ path = {log:?} }}\n[proxy.tls]"));
    let proxy = RunningProxy::start(&format!("{config}fingerprint = \"ja4\"\n"), upstream.addr).await;
    let port = proxy.addr.port();
    let url = format!("https://localhost:{port}/hello");
    let (ca, resolve) = (tls.ca.display().to_string(), format!("localhost:{port}:127.0.0.1"));

    let capture = Capture::start(port);
    // Two handshakes that differ (ALPN offers h2 first, or http/1.1 alone), the first
    // with an X-JA4 of its own.
    for version in ["--http2", "--http1.1"] {
        let forged = format!("X-JA4: {FORGED}");
        let output =
            curl(&["--cacert", &ca, "--resolve", &resolve, version, "-H", &forged, "-o", "/dev/null", &url]).await;
        assert!(output.status.success(), "curl {version}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let captured = capture.finish(port);

    assert_eq!(captured.len(), 2, "a ClientHello per connection: {captured:?}");
    assert!(captured[0].contains("h2_") && captured[1].contains("h1_"), "{captured:?}");
    assert_eq!(told(&upstream), captured.iter().cloned().map(Some).collect::<Vec<_>>());
    // The decision log names each request's fingerprint.
    let logged = until_async(
        "the decision log's lines",
        || std::fs::read_to_string(&log).unwrap_or_default(),
        |text| text.lines().count() == 2,
    )
    .await;
    let logged: Vec<String> = logged
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line")["ja4"].to_string())
        .collect();
    assert_eq!(logged, captured.iter().map(|ja4| format!("{ja4:?}")).collect::<Vec<_>>());
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_stalled_or_malformed_client_hello_fails_its_handshake_as_without_fingerprints() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let header_timeout = Duration::from_secs(1);
    let config = tls.proxy_head().replace("[proxy.tls]", "header_timeout = \"1s\"\n[proxy.tls]");
    let proxy = RunningProxy::start(&format!("{config}fingerprint = \"ja4\"\n"), upstream.addr).await;
    // A record announcing a ClientHello of 512 bytes, then the first few of them:
    // the capture waits for the rest until header_timeout, as rustls would.
    let start = Instant::now();
    let response = raw_exchange(proxy.addr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03").await;
    assert!(!response.contains("HTTP/"), "{response}");
    assert_about("the stalled hello closed", start.elapsed(), header_timeout);
    proxy.stats_until("the stalled handshake counted", |stats| stats.tls_handshake_failures == 1).await;
    // Not TLS, a record too long for any hello, a ServerHello: settled at once, no
    // fingerprint, and rustls refuses each.
    let oversized: &[u8] = b"\x16\x03\x01\xff\xff\x01\xff\xff\xfb";
    let server_hello: &[u8] = b"\x16\x03\x03\x00\x04\x02\x00\x00\x00";
    for (failures, sent) in (2..).zip([&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..], oversized, server_hello]) {
        let start = Instant::now();
        let response = raw_exchange(proxy.addr, sent).await;
        assert!(!response.contains("HTTP/1.1 200"), "{response}");
        assert!(start.elapsed() < header_timeout, "{} refused at once", sent.escape_ascii());
        proxy.stats_until("the refused handshake counted", |stats| stats.tls_handshake_failures == failures).await;
    }
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn a_clients_own_x_ja4_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let client = TestClient::default();
    // Without fingerprints, and over TLS without a ClientHello read: none to tell.
    let plain = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let reply = client.get(&plain.url("/"), &[("x-ja4", FORGED), ("X-Ja4", "garbage")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let tls = TestTls::new();
    let unfingerprinted = RunningProxy::start(&tls.proxy_head(), upstream.addr).await;
    let url = format!("https://127.0.0.1:{}/", unfingerprinted.addr.port());
    let forged = format!("X-JA4: {FORGED}");
    let output = curl(&["--cacert", &tls.ca.display().to_string(), "-H", &forged, "-o", "/dev/null", &url]).await;
    assert!(output.status.success(), "curl: {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(told(&upstream), [None, None]);
}

#[tokio::test]
async fn ja4_header_is_believed_from_trusted_proxies_only() {
    let upstream = Upstream::start().await;
    let client = TestClient::default();
    let rule = "[[proxy.rules]]\nname = \"per-stack\"\nkey = \"ja4\"\nalgorithm = \"fixed_window\"\nlimit = 1\n\
                window = \"1h\"\n";
    let head = |trusted: &str| {
        PROXY_HEAD
            .replace("[proxy]\n", &format!("[proxy]\ntrusted_proxies = [\"{trusted}\"]\nja4_header = \"x-edge-ja4\"\n"))
    };
    let other = "t12i0601h1_2c9a3d3a8c57_0e5d25d7bb07";

    // The test's client is the balancer: its header is the fingerprint.
    let behind = RunningProxy::start(&format!("{}{rule}", head("127.0.0.1/32")), upstream.addr).await;
    let get = |ja4: &'static str| {
        let (client, url) = (client.clone(), behind.url("/"));
        async move { client.get(&url, &[("x-edge-ja4", ja4), ("x-ja4", FORGED)]).await.status }
    };
    assert_eq!(get(other).await, StatusCode::OK);
    // One bucket per fingerprint, whichever client behind the balancer presents it.
    assert_eq!(get(other).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(FORGED).await, StatusCode::OK);
    // Not a fingerprint: the request has none, and its key is missing.
    assert_eq!(get("curl/8.5.0").await, StatusCode::OK);
    assert_eq!(told(&upstream), [Some(other.to_owned()), Some(FORGED.to_owned()), None]);

    // From a peer that is not a trusted proxy the header is the client's own claim.
    let direct = RunningProxy::start(&format!("{}{rule}", head("192.0.2.0/24")), upstream.addr).await;
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(client.get(&direct.url("/"), &[("x-edge-ja4", other), ("x-ja4", other)]).await.status);
    }
    // Both lack the key, and share the missing-key bucket.
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    assert_eq!(told(&upstream), [Some(other.to_owned()), Some(FORGED.to_owned()), None, None]);
    // The balancer's header reaches the upstream from the balancer only.
    let passed: Vec<bool> = upstream.seen().iter().map(|seen| seen.headers.contains_key("x-edge-ja4")).collect();
    assert_eq!(passed, [true, true, true, false]);
}

/// One agent with the kernel layer on three veth labs, its proxy ending TLS on every
/// address of the host: two clients and an allowed third, one namespace each.
struct Lab {
    clients: [HostLab; 3],
    port: u16,
    agent: AgentProcess,
    /// Kept for the agent's certificate files.
    tls: TestTls,
}

const BLOCK_TTL: Duration = Duration::from_secs(60);

impl Lab {
    fn start(upstream: SocketAddr) -> Self {
        let name = unique("ja4");
        let clients = [1, 2, 3].map(|n| HostLab::new(&format!("{name}{n}"), 30 + n));
        let port = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let interfaces: Vec<String> = clients.iter().map(|lab| format!("{:?}", lab.lab.host_if)).collect();
        let tls = TestTls::new();
        let config = format!(
            r#"{agent}
[xdp]
interfaces = [{interfaces}]
mode = "auto"
[xdp.limit]
packets_per_second = 100000
burst = 100000
[[xdp.cidr]]
cidr = "{allowed}/32"
action = "allow"

[proxy]
listen = "0.0.0.0:{port}"
upstream = "http://{upstream}"
[proxy.tls]
cert = {cert:?}
key = {key:?}
fingerprint = "ja4"

# A window turning mid-test would let another request through.
[[proxy.rules]]
name = "per-stack"
key = "ja4"
algorithm = "fixed_window"
limit = 1
window = "1h"

[escalation]
threshold = 1000
block_ttl = "{ttl}s"
[escalation.fingerprint]
threshold = 3
window = "1m"
max_sources = 16
"#,
            agent = agent_section(&name, "keep_attached_on_exit = false"),
            interfaces = interfaces.join(", "),
            allowed = clients[2].client,
            cert = tls.cert,
            key = tls.key,
            ttl = BLOCK_TTL.as_secs(),
        );
        let agent = AgentProcess::start(&name, &config);
        Self { clients, port, agent, tls }
    }

    /// One GET with curl from client `n`'s namespace, to the host's address on its
    /// veth: the status, or `None` if the connection could not be made.
    fn get(&self, n: usize) -> Option<u16> {
        let lab = &self.clients[n];
        let resolve = format!("localhost:{}:{}", self.port, lab.host);
        let output = lab
            .lab
            .command("curl")
            .args(["-sS", "--connect-timeout", "2", "--max-time", "5", "--cacert"])
            .arg(&self.tls.ca)
            .args(["--resolve", &resolve, "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("https://localhost:{}/", self.port))
            .output()
            .expect("curl in the namespace");
        String::from_utf8_lossy(&output.stdout).parse().ok().filter(|&status| status != 0)
    }

    /// The sources `limiter stats` shows blocked.
    fn blocks(&self) -> Vec<String> {
        let stats = self.agent.cli_json(&["stats", "--json"]);
        let blocks = stats["xdp"]["blocks"].as_array().cloned().unwrap_or_default();
        blocks.iter().filter_map(|block| block["cidr"].as_str().map(str::to_owned)).collect()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_presenting_one_fingerprint_share_its_bucket_and_are_blocked_together() {
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;
    tokio::task::spawn_blocking(move || {
        let lab = Lab::start(upstream_addr);
        let cidr = |n: usize| format!("{}/32", lab.clients[n].client);

        // The same curl in two namespaces: one fingerprint, one bucket.
        assert_eq!(lab.get(0), Some(200));
        assert_eq!(lab.get(1), Some(429), "the second address meets the bucket the first emptied");
        assert_eq!([lab.get(2), lab.get(1)], [Some(429); 2]);
        assert!(lab.blocks().is_empty(), "three refusals are not past the threshold of three");
        // The fourth is: every source that presented the fingerprint lately is
        // blocked, each one source wide, but for the allowed one.
        assert_eq!(lab.get(0), Some(429));
        let blocked = lab.agent.until("the fingerprint's sources blocked", || lab.blocks(), |blocks| blocks.len() >= 2);
        let mut expected = vec![cidr(0), cidr(1)];
        expected.sort();
        let mut blocked = blocked;
        blocked.sort();
        assert_eq!(blocked, expected);
        assert_eq!(lab.get(0), None, "dropped in the kernel");
        assert_eq!(lab.get(1), None, "dropped in the kernel");
        assert_eq!(lab.get(2), Some(429), "an allowed source is never blocked");
        assert!(!lab.blocks().contains(&cidr(2)));
        // `limiter explain --ja4` names the bucket a fingerprint's request would meet.
        let client = lab.clients[2].client.to_string();
        let explained = lab.agent.cli_json(&["explain", "--path", "/", "--ip", &client, "--ja4", FORGED, "--json"]);
        let policies = explained["proxy"]["policies"].as_array().cloned().unwrap_or_default();
        assert_eq!(policies.len(), 1, "{explained:#}");
        assert_eq!(policies[0]["key"], format!("ja4={FORGED}"), "{explained:#}");
    })
    .await
    .expect("the lab");
}
