//! The time and connection bounds, against clients that open connections and stall
//! them or trickle their bytes: `header_timeout`, `body_timeout`, `idle_timeout`,
//! `max_connections`, `max_connections_per_ip`, and the metrics endpoint's bound on
//! scrapers.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use limiter_lab::support::{
    proxy::{
        PROXY_HEAD, RunningProxy, Upstream, connect_from, exchange_from, raw_exchange, read_to_close, secret_file,
        signed_route_config,
    },
    wait::{PATIENCE, assert_about, until_async},
};
use tokio::{io::AsyncWriteExt, net::TcpStream};

const BODY_TIMEOUT: Duration = Duration::from_millis(500);

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// The head of a chunked upload and its first chunk; the rest never comes.
const STALLED_CHUNKED: &[u8] = b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

/// Waits for the 408 on a stalled connection; returns when it came.
async fn expect_408(stream: &mut TcpStream) -> Instant {
    assert_408(&read_to_close(stream).await);
    Instant::now()
}

fn assert_408(response: &str) {
    assert_eq!(status_line(response), "HTTP/1.1 408 Request Timeout", "{response}");
    assert!(response.contains("#request-timeout") && response.contains("connection: close"), "{response}");
}

#[tokio::test]
async fn stalled_chunked_bodies_hold_at_most_max_connections_and_only_for_body_timeout() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}max_connections = 20\nbody_timeout = \"500ms\"\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let start = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..21 {
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        // The one refused may be closed before its head is written.
        let _ = stream.write_all(STALLED_CHUNKED).await;
        stalled.push(stream);
    }
    // The workers accept side by side, so which connection finds every place taken
    // is theirs to say: that one is closed unanswered, the other 20 wait out
    // body_timeout.
    let mut refused = 0;
    for stream in &mut stalled {
        let response = read_to_close(stream).await;
        if response.is_empty() {
            refused += 1;
            continue;
        }
        assert_408(&response);
        let after = start.elapsed();
        assert!(after >= BODY_TIMEOUT && after < BODY_TIMEOUT + PATIENCE, "408 after {after:?}");
    }
    assert_eq!(refused, 1);
    proxy
        .stats_until("one connection refused and 20 bodies timed out", |stats| {
            (stats.connections_refused, stats.connections_refused_reasons["max_connections"], stats.body_timeouts)
                == (1, 1, 20)
        })
        .await;
    assert_eq!(upstream.count(), 0, "a chunked body is read whole before forwarding");

    // The places are free again once the proxy has closed its ends.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let response = exchange_from([127, 0, 0, 1], proxy.addr, GET).await;
        if status_line(&response) == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(response.is_empty() && Instant::now() < deadline, "{response}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_stalled_body_of_known_length_gets_408_on_signed_and_forwarded_routes() {
    let upstream = Upstream::start().await;
    let secret = secret_file(b"a-secret-of-enough-length");
    let config = signed_route_config("body_timeout = \"500ms\"", &secret);
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    // The signed route reads the whole body before it can check the MAC; the other
    // streams it to the upstream as it comes.
    for (path, reaches_upstream) in [("/api/transfer", 0), ("/upload", 1)] {
        let start = Instant::now();
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: k-pay\r\nContent-Length: 100\r\n\r\nabc");
        stream.write_all(head.as_bytes()).await.expect("write");
        let after = expect_408(&mut stream).await - start;
        assert!(after >= BODY_TIMEOUT && after < BODY_TIMEOUT + PATIENCE, "{path}: 408 after {after:?}");
        assert_eq!(upstream.count(), reaches_upstream, "{path}");
    }
    proxy.stats_until("both stalled bodies counted", |stats| stats.body_timeouts == 2).await;
    // A body that comes in time is not affected.
    let response = raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{response}");
    let _ = std::fs::remove_file(secret);
}

/// A slowloris's pace: each byte comes well within any per-read deadline, so only a
/// bound on the whole head (or body) ends the connection.
const TRICKLE: Duration = Duration::from_millis(250);

/// Writes `bytes` on `stream` one at a time, [`TRICKLE`] apart, while reading what
/// the proxy sends until it closes the connection: what it sent and when it closed.
async fn trickle(stream: TcpStream, bytes: &'static [u8]) -> (String, Instant) {
    let (mut reader, mut writer) = stream.into_split();
    let writing = tokio::spawn(async move {
        for byte in bytes {
            tokio::time::sleep(TRICKLE).await;
            if writer.write_all(std::slice::from_ref(byte)).await.is_err() {
                break;
            }
        }
    });
    let received = read_to_close(&mut reader).await;
    let closed = Instant::now();
    writing.abort();
    (received, closed)
}

#[tokio::test]
async fn a_head_trickled_a_byte_at_a_time_gets_408_at_header_timeout() {
    let upstream = Upstream::start().await;
    let header_timeout = Duration::from_secs(1);
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}header_timeout = \"1s\"\n"), upstream.addr).await;
    // 54 bytes at TRICKLE: 13.5 s if no bound on the whole head cut it.
    let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaa\r\n\r\n";
    let start = Instant::now();
    let stream = TcpStream::connect(proxy.addr).await.expect("connect");
    let (response, closed) = trickle(stream, head).await;
    assert_408(&response);
    assert_about("the trickled head's 408", closed - start, header_timeout);
    proxy.stats_until("the timeout counted", |stats| stats.timeouts == 1).await;
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn a_body_trickled_a_byte_at_a_time_gets_408_at_body_timeout_and_never_reaches_the_upstream_whole() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}body_timeout = \"1s\"\n");
    let body_timeout = Duration::from_secs(1);
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    // A chunked body is read whole before it is forwarded; one of known length is
    // streamed to the upstream as it comes. At TRICKLE they would take 7 s and 10 s.
    let uploads: [(&[u8], &[u8]); 2] = [
        (
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"1\r\na\r\n1\r\na\r\n1\r\na\r\n1\r\na\r\n0\r\n\r\n",
        ),
        (
            b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n",
            b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ),
    ];
    for (timed_out, (head, body)) in (1..).zip(uploads) {
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        stream.write_all(head).await.expect("write the head");
        let start = Instant::now();
        let (response, closed) = trickle(stream, body).await;
        assert_408(&response);
        assert_about("the trickled body's 408", closed - start, body_timeout);
        proxy.stats_until("the body's timeout counted", |stats| stats.body_timeouts == timed_out).await;
    }
    // Only the streamed one reached the upstream, and never whole.
    let seen =
        until_async("the streamed body to end at the upstream", || upstream.seen(), |seen| seen.len() == 1).await;
    assert!(seen[0].body.len() < 40, "the upstream got {:?}", seen[0].body);
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn one_peer_gets_max_connections_per_ip_and_its_refusals_escalate() {
    let upstream = Upstream::start().await;
    // One worker accepts in the order the connections came, which the counts below
    // follow: with several, a fourth connection may take its place before a held one.
    let config = format!("{PROXY_HEAD}workers = 1\nmax_connections_per_ip = 3\ntrusted_proxies = [\"127.0.0.3/32\"]\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, 1);

    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from([127, 0, 0, 1], proxy.addr).await);
    }
    for _ in 0..2 {
        assert_eq!(exchange_from([127, 0, 0, 1], proxy.addr, GET).await, "");
    }
    // Another peer, and a trusted proxy with more connections than one client's
    // share, are served meanwhile.
    let response = exchange_from([127, 0, 0, 2], proxy.addr, GET).await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{response}");
    for _ in 0..4 {
        held.push(connect_from([127, 0, 0, 3], proxy.addr).await);
    }
    let response = exchange_from([127, 0, 0, 3], proxy.addr, GET).await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{response}");

    proxy
        .stats_until("two connections refused for their peer's", |stats| {
            let reasons = &stats.connections_refused_reasons;
            (reasons["max_connections_per_ip"], reasons["max_connections"]) == (2, 0)
        })
        .await;
    // Threshold 1: the second refusal crosses it.
    let escalation =
        tokio::time::timeout(PATIENCE, escalated.recv()).await.expect("escalated in time").expect("escalation");
    assert_eq!(escalation.cidr.addr(), IpAddr::from([127, 0, 0, 1]));
    assert_eq!(escalation.cidr.prefix_len(), 32);
}

#[tokio::test]
async fn a_keep_alive_connection_waits_idle_timeout_for_its_next_request_not_header_timeout() {
    let upstream = Upstream::start().await;
    let idle = Duration::from_millis(1500);
    let config = format!("{PROXY_HEAD}header_timeout = \"300ms\"\nidle_timeout = \"1500ms\"\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    // The proxy starts waiting once it has sent the last response: after that was asked for.
    let mut asked = Instant::now();
    for _ in 0..2 {
        asked = Instant::now();
        stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut response = Vec::new();
        while !response.ends_with(b"\r\n\r\nok") {
            let mut buf = [0; 1024];
            let n = tokio::time::timeout(PATIENCE, tokio::io::AsyncReadExt::read(&mut stream, &mut buf))
                .await
                .expect("response in time")
                .expect("read");
            assert!(n > 0, "closed before the response: {}", String::from_utf8_lossy(&response));
            response.extend_from_slice(&buf[..n]);
        }
        assert!(response.starts_with(b"HTTP/1.1 200 OK"), "{}", String::from_utf8_lossy(&response));
    }
    // Idle for longer than header_timeout, the connection stays; after idle_timeout
    // it is closed without a word.
    let rest = read_to_close(&mut stream).await;
    let after = asked.elapsed();
    assert_eq!(rest, "");
    assert!(after >= idle && after < idle + PATIENCE, "closed after {after:?}");
    assert_eq!(upstream.count(), 2);
    assert_eq!(proxy.proxy.stats().timeouts, 0);
}

/// The metrics endpoint of an agent without kernel layer or proxy, serving until
/// the task is aborted.
async fn metrics_endpoint() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use limiter::metrics::{AgentGauges, MetricsSources, serve};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind metrics");
    let addr = listener.local_addr().expect("metrics address");
    let sources = MetricsSources {
        pin_dir: "/nonexistent".into(),
        agent: AgentGauges::default().into(),
        proxy: None,
        security_log: std::sync::Arc::default(),
    };
    (addr, tokio::spawn(serve(listener, sources)))
}

#[tokio::test]
async fn connections_held_silent_on_the_metrics_endpoint_never_keep_a_scraper_out() {
    let (addr, metrics) = metrics_endpoint().await;
    let scrape = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    // A local loop takes every place, and again each time it loses one.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(addr).await.expect("connect"));
    }
    for round in 0..3 {
        let response = exchange_from([127, 0, 0, 1], addr, scrape).await;
        assert!(response.starts_with("HTTP/1.1 200 OK"), "scrape {round}: {response}");
        assert!(response.contains("limiter_config_reloads_total"), "{response}");
        // The oldest silent connection gave its place up.
        let mut oldest = held.remove(0);
        assert_eq!(read_to_close(&mut oldest).await, "", "the oldest held connection is closed");
        held.push(TcpStream::connect(addr).await.expect("connect"));
    }
    metrics.abort();
}

/// tokio's clock is paused: whenever every task waits it jumps to the next timer, so
/// the endpoint's ten-second header timeout passes at once.
#[tokio::test(start_paused = true)]
async fn a_scraper_that_stalls_its_request_is_cut_off() {
    let (addr, metrics) = metrics_endpoint().await;
    let start = tokio::time::Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.expect("write");
    let mut buf = [0; 1024];
    let read = tokio::time::timeout(Duration::from_secs(3600), tokio::io::AsyncReadExt::read(&mut stream, &mut buf));
    let closed = read.await.expect("the stalled scraper was still connected an hour later");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    let after = start.elapsed();
    assert!(after >= Duration::from_secs(10) && after < Duration::from_secs(60), "closed after {after:?}");
    metrics.abort();
}
