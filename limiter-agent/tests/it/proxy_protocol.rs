//! The PROXY protocol on the listener: HAProxy in front with `send-proxy-v2`, and raw
//! headers from peers that may, and may not, send one.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, Upstream, exchange_from, proxy_v2_header},
    unique,
    wait::{PATIENCE, assert_about},
};

const TRUSTED_LB: &str = "trusted_proxies = [\"127.0.0.1/32\"]\n";
const API_LIMIT: &str = "[[proxy.rules]]\nname = \"api\"\npath = \"/api\"\nkey = \"ip\"\nlimit = 3\nwindow = \"1m\"\n";

/// HAProxy in TCP mode on 127.0.0.1, passing every connection to `backend` from
/// 127.0.0.1 with a PROXY v2 header naming the client.
struct HaProxy {
    child: Child,
    front: SocketAddr,
    dir: std::path::PathBuf,
}

impl HaProxy {
    fn start(backend: SocketAddr) -> Self {
        let front = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
        let dir = std::env::temp_dir().join(unique("limiter-haproxy-"));
        std::fs::create_dir_all(&dir).expect("dir");
        let config = format!(
            "global\n  maxconn 100\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  \
             timeout server 30s\nfrontend in\n  bind {front}\n  default_backend limiter\nbackend limiter\n  \
             server limiter {backend} send-proxy-v2 source 127.0.0.1\n"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config).expect("config");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy (cargo xtask setup installs it)");
        let haproxy = Self { child, front, dir };
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(front).is_err() {
            assert!(Instant::now() < deadline, "haproxy did not listen on {front}");
            std::thread::yield_now();
        }
        haproxy
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `curl` from the local address `from` (any of 127.0.0.0/8 is this host): its status.
async fn curl_from(from: &str, url: &str) -> String {
    let output = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--interface", from, "-o", "/dev/null", "-w", "%{http_code}", url])
        .output()
        .await
        .expect("curl");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn behind_haproxy_the_client_it_names_is_the_one_limited_and_forwarded_for() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{TRUSTED_LB}proxy_protocol = \"v2\"\n{API_LIMIT}");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, 1);
    let haproxy = HaProxy::start(proxy.addr);
    let url = format!("http://{}/api", haproxy.front);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(curl_from("127.0.0.2", &url).await);
    }
    statuses.push(curl_from("127.0.0.3", &url).await);
    assert_eq!(
        statuses,
        ["200", "200", "200", "429", "429", "200"],
        "each client behind the balancer has its own limit"
    );
    let forwarded: Vec<_> = upstream.seen().iter().map(|seen| seen.headers["x-forwarded-for"].clone()).collect();
    assert_eq!(forwarded, ["127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3"]);
    assert_eq!(proxy.proxy.stats().connections_refused, 0);
    // Threshold 1: the second 429 escalates the client, not the balancer.
    let escalation = tokio::time::timeout(PATIENCE, escalated.recv()).await.expect("escalated in time").expect("one");
    assert_eq!(escalation.cidr.to_string(), "127.0.0.2/32");
}

const V1_THEN_GET: &[u8] =
    b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80\r\nGET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn a_header_from_a_peer_not_trusted_is_refused_and_a_trusted_peer_must_send_one() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{TRUSTED_LB}proxy_protocol = \"any\"\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    // 127.0.0.5 is no trusted proxy: it may not speak for 203.0.113.7.
    assert_eq!(exchange_from([127, 0, 0, 5], proxy.addr, V1_THEN_GET).await, "");
    proxy.stats_until("the header refused", |stats| stats.connections_refused_reasons["proxy_protocol"] == 1).await;
    assert_eq!(upstream.count(), 0);
    // It may still connect as itself.
    let direct = exchange_from([127, 0, 0, 5], proxy.addr, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(direct.await.starts_with("HTTP/1.1 200 OK"));
    assert_eq!(upstream.seen()[0].headers["x-forwarded-for"], "127.0.0.5");

    // The trusted peer's v1 header names the client.
    let proxied = exchange_from([127, 0, 0, 1], proxy.addr, V1_THEN_GET).await;
    assert!(proxied.starts_with("HTTP/1.1 200 OK"), "{proxied}");
    assert_eq!(upstream.seen()[1].headers["x-forwarded-for"], "203.0.113.7");
    // Without one, from the trusted peer, the connection is refused: it would be
    // taken for the balancer's own.
    assert_eq!(exchange_from([127, 0, 0, 1], proxy.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await, "");
    proxy
        .stats_until("the connection without one refused", |stats| {
            stats.connections_refused_reasons["proxy_protocol"] == 2
        })
        .await;
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn half_a_header_is_cut_at_header_timeout_and_counted() {
    let upstream = Upstream::start().await;
    let header_timeout = Duration::from_secs(1);
    let config = format!("{PROXY_HEAD}{TRUSTED_LB}proxy_protocol = \"any\"\nheader_timeout = \"1s\"\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = SocketAddr::from(([203, 0, 113, 7], 5555));
    // v2 whose length promises its 12 address bytes, of which 4 come.
    let mut short_v2 = proxy_v2_header(client, proxy.addr);
    short_v2.truncate(short_v2.len() - 8);
    let halves = [b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80".to_vec(), short_v2];
    for (refused, half) in (1..).zip(halves) {
        let start = Instant::now();
        assert_eq!(exchange_from([127, 0, 0, 1], proxy.addr, &half).await, "");
        assert_about(&format!("{} closed", half.escape_ascii()), start.elapsed(), header_timeout);
        proxy
            .stats_until("the half header refused", |stats| {
                stats.connections_refused_reasons["proxy_protocol"] == refused
            })
            .await;
    }
    assert_eq!(upstream.count(), 0);
}
