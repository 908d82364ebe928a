//! What one client may hold of what every client shares, against clients that try
//! to hold it all: connection places per prefix (a /56 of sources), idle keep-alive
//! places given to new clients at `max_connections`, connections that stall their
//! head or send nothing (escalated), responses never read (`send_timeout`), requests
//! in flight per client and upstream connections; and an escalated client behind a
//! PROXY protocol balancer, refused by the proxy since the kernel layer only sees the
//! balancer.
//!
//! Sources other than 127.0.0.0/8 are named by a PROXY v2 header from a balancer on
//! 127.0.0.1.

use std::net::{IpAddr, SocketAddr};

use http::StatusCode;
use limiter::escalation::Escalation;
use limiter_lab::support::{
    proxy::{
        PROXY_HEAD, RunningProxy, TestClient, Upstream, assert_not_escalated, connect_from, proxied_from, read_to_close,
    },
    wait::PATIENCE,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc::Receiver,
};

use crate::proxy_http2::h2_connect;

const BALANCED: &str = "trusted_proxies = [\"127.0.0.1/32\"]\nproxy_protocol = \"v2\"\n";

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// A head that never ends.
const HALF_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n";

fn source(ip: &str) -> SocketAddr {
    SocketAddr::new(ip.parse::<IpAddr>().expect("an address"), 40_000)
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

#[tokio::test]
async fn the_sources_of_one_ipv6_56_cannot_take_every_connection_place() {
    let upstream = Upstream::start().await;
    let config = format!(
        "{PROXY_HEAD}{BALANCED}max_connections = 40\nmax_connections_per_ip = 2\nmax_connections_per_ipv6_56 = 8\n"
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    // 20 /64s of one /56, each with its own share, would hold all 40 places; their
    // heads never end, so none of them is idle.
    let mut held = Vec::new();
    for subnet in 0..20 {
        for _ in 0..2 {
            held.push(proxied_from(source(&format!("2001:db8:0:1{subnet:02x}::1")), proxy.addr, HALF_HEAD).await);
        }
    }
    proxy
        .stats_until("32 refused for their /56", |stats| {
            let reasons = &stats.connections_refused_reasons;
            (reasons["max_connections_per_ipv6_56"], reasons["max_connections_per_ip"], reasons["max_connections"])
                == (32, 0, 0)
        })
        .await;
    let mut neighbour = proxied_from(source("2001:db8:0:200::1"), proxy.addr, GET).await;
    let response = read_to_close(&mut neighbour).await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "another /56 is served: {response}");
    drop(held);
}

/// Sends one keep-alive request on `stream` and reads its answer (`ok`).
async fn keep_alive_request(stream: &mut TcpStream) {
    stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\nok") {
        let mut buf = [0; 1024];
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await.expect("in time").expect("read");
        assert!(n > 0, "closed before the response: {}", String::from_utf8_lossy(&response));
        response.extend_from_slice(&buf[..n]);
    }
    assert!(response.starts_with(b"HTTP/1.1 200 OK"), "{}", String::from_utf8_lossy(&response));
}

#[tokio::test]
async fn at_max_connections_the_keep_alive_connection_idle_longest_makes_room() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}workers = 1\nmax_connections = 3\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut idle = Vec::new();
    for client in 1..=3 {
        let mut stream = connect_from([127, 0, 0, client], proxy.addr).await;
        keep_alive_request(&mut stream).await;
        idle.push(stream);
    }
    // Every place is held by an idle keep-alive connection: a new client takes the
    // place of the first one, which is closed.
    let mut newcomer = connect_from([127, 0, 0, 4], proxy.addr).await;
    keep_alive_request(&mut newcomer).await;
    assert_eq!(read_to_close(&mut idle[0]).await, "", "the longest idle closed without a word");
    for stream in &mut idle[1..] {
        keep_alive_request(stream).await;
    }
    let stats = proxy.stats_until("one place reclaimed", |stats| stats.connections_reclaimed == 1).await;
    assert_eq!(stats.connections_refused, 0);
    assert_eq!(upstream.count(), 6);
}

/// Refusals tolerated before a client is escalated.
const THRESHOLD: u32 = 3;

/// The first escalation, which must be of `cidr`, and those that followed it.
async fn escalated_is(escalated: &mut Receiver<Escalation>, cidr: &str) {
    let escalation = tokio::time::timeout(PATIENCE, escalated.recv()).await.expect("escalated in time").expect("one");
    assert_eq!(escalation.cidr.to_string(), cidr);
    while let Ok(escalation) = escalated.try_recv() {
        assert_eq!(escalation.cidr.to_string(), cidr);
    }
}

/// `n` connections from `client` that send `bytes` at once, read until closed.
async fn stalled(proxy: &RunningProxy, client: &str, n: usize, bytes: &[u8]) -> Vec<String> {
    let mut streams = Vec::new();
    for _ in 0..n {
        streams.push(proxied_from(source(client), proxy.addr, bytes).await);
    }
    let mut answers = Vec::new();
    for stream in &mut streams {
        answers.push(read_to_close(stream).await);
    }
    answers
}

#[tokio::test]
async fn half_sent_heads_escalate_and_silent_connections_only_past_half_a_share() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{BALANCED}header_timeout = \"300ms\"\nmax_connections_per_ip = 8\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, THRESHOLD);
    // A browser's preconnects: a few connections that never send a request.
    assert_eq!(stalled(&proxy, "203.0.113.1", 4, b"").await, ["", "", "", ""]);
    proxy.stats_until("the silent connections counted", |stats| stats.silent_connections == 4).await;
    assert_not_escalated(&mut escalated, "4 silent connections, half of max_connections_per_ip");
    // Twice as many: at least the first 4 to time out saw more than 4 open.
    assert!(stalled(&proxy, "203.0.113.2", 8, b"").await.iter().all(String::is_empty));
    escalated_is(&mut escalated, "203.0.113.2/32").await;
    // Half a head, which no browser sends: each one counts.
    for answer in stalled(&proxy, "203.0.113.3", THRESHOLD as usize, HALF_HEAD).await {
        assert_eq!(status_line(&answer), "HTTP/1.1 408 Request Timeout");
    }
    assert_not_escalated(&mut escalated, "half heads up to the threshold");
    let answer = stalled(&proxy, "203.0.113.3", 1, HALF_HEAD).await;
    assert_eq!(status_line(&answer[0]), "HTTP/1.1 408 Request Timeout");
    escalated_is(&mut escalated, "203.0.113.3/32").await;
    proxy.stats_until("the half heads answered 408", |stats| stats.timeouts == 4).await;
}

/// An upstream that answers every request with a chunked body that never ends, and
/// reports through the channel when the proxy's connection to it is gone.
async fn endless_upstream() -> (SocketAddr, tokio::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
    let addr = listener.local_addr().expect("address");
    let (released, releases) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let released = released.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut byte = [0];
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let chunk = [b"10000\r\n".as_slice(), &[b'x'; 0x10000], b"\r\n"].concat();
                let mut sent = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await;
                while sent.is_ok() {
                    sent = stream.write_all(&chunk).await;
                }
                let _ = released.send(()).await;
            });
        }
    });
    (addr, releases)
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_after_send_timeout_and_its_upstream_connection_closed() {
    let (upstream, mut released) = endless_upstream().await;
    let config = format!("{PROXY_HEAD}send_timeout = \"500ms\"\n");
    let proxy = RunningProxy::start(&config, upstream).await;
    let mut reader = TcpStream::connect(proxy.addr).await.expect("connect");
    reader.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    // Never read: once the buffers on the way are full, the proxy's writes stall.
    tokio::time::timeout(PATIENCE, released.recv()).await.expect("the upstream connection closed in time");
    proxy.stats_until("the stalled write counted", |stats| stats.send_timeouts == 1).await;
    drop(reader);
}

/// An HTTP/2 client that stops reading one stream (it never opens the stream's window)
/// while it keeps the connection: nothing is written to it, so the socket's
/// `send_timeout` never runs out, and before, the stream and its upstream connection
/// were held for ever.
#[tokio::test]
async fn an_http2_stream_its_client_stops_reading_is_reset_and_its_upstream_connection_closed() {
    let (upstream, mut released) = endless_upstream().await;
    let config = format!("{PROXY_HEAD}send_timeout = \"500ms\"\nupstream_timeout = \"500ms\"\n");
    let proxy = RunningProxy::start(&config, upstream).await;
    let (send, _connection) = h2_connect(proxy.addr).await;
    let get = || http::Request::get(format!("http://{}/big", proxy.addr)).body(()).expect("request");
    let (response, _) = send.clone().ready().await.expect("open").send_request(get(), true).expect("a stream");
    let mut body = response.await.expect("the head").into_body();
    // Its window is never opened again: the proxy holds the rest of the body.
    tokio::time::timeout(PATIENCE, released.recv()).await.expect("the upstream connection closed in time");
    proxy.stats_until("the stalled stream counted", |stats| stats.send_timeouts == 1).await;
    let reset = loop {
        match body.data().await {
            Some(Ok(_)) => {}
            Some(Err(error)) => break error.reason(),
            None => panic!("the stream ended instead of being reset"),
        }
    };
    assert_eq!(reset, Some(h2::Reason::CANCEL));
    // The stream alone: the connection still serves.
    let (response, _) = send.ready().await.expect("still open").send_request(get(), true).expect("a stream");
    assert_eq!(response.await.expect("the head").status(), StatusCode::OK);
}

#[tokio::test]
async fn one_client_has_at_most_max_requests_in_flight_over_its_streams_and_connections() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}max_requests_in_flight_per_client = 4\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let (h2, proxy_addr) = (TestClient::h2c(), proxy.addr);
    let url = proxy.url("/hold");
    let streams: Vec<_> = (0..6)
        .map(|_| {
            let (h2, url) = (h2.clone(), url.clone());
            tokio::spawn(async move { h2.get(&url, &[]).await.status })
        })
        .collect();
    upstream.arrived(4).await;
    proxy.stats_until("two streams refused", |stats| stats.in_flight_refused == 2).await;
    // Another connection of the same client is refused too; another client is served.
    let mut other = connect_from([127, 0, 0, 1], proxy.addr).await;
    other.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
    let response = read_to_close(&mut other).await;
    assert_eq!(status_line(&response), "HTTP/1.1 429 Too Many Requests", "{response}");
    assert!(response.contains("#too-many-in-flight") && response.contains("retry-after: 1"), "{response}");
    let neighbour = tokio::spawn(async move {
        let mut stream = connect_from([127, 0, 0, 2], proxy_addr).await;
        stream.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        read_to_close(&mut stream).await
    });
    upstream.arrived(5).await;
    upstream.release(5);
    let mut statuses = Vec::new();
    for stream in streams {
        statuses.push(stream.await.expect("stream task"));
    }
    statuses.sort_unstable();
    let (ok, refused) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, ok, ok, refused, refused]);
    let neighbour = neighbour.await.expect("neighbour");
    assert_eq!(status_line(&neighbour), "HTTP/1.1 200 OK", "another client is served: {neighbour}");
    assert_eq!(upstream.count(), 5);
    proxy.stats_until("three requests refused in all", |stats| stats.in_flight_refused == 3).await;
}

#[tokio::test]
async fn upstream_connections_are_bounded_over_all_clients() {
    let upstream = Upstream::start().await;
    // One worker, one pool: the connections it keeps are the ones counted.
    let config = format!("{PROXY_HEAD}workers = 1\nmax_upstream_connections = 2\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let url = proxy.url("/hold");
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { TestClient::default().get(&url, &[]).await.status })
        })
        .collect();
    upstream.arrived(2).await;
    let third = TestClient::default().get(&url, &[]).await;
    assert_eq!(third.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(third.json()["type"], "https://limiter.dev/problems#upstream-busy");
    upstream.release(2);
    for request in held {
        assert_eq!(request.await.expect("request task"), StatusCode::OK);
    }
    let stats = proxy.stats_until("one request refused", |stats| stats.upstream_busy == 1).await;
    assert_eq!(stats.upstream_errors, 0);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn an_escalated_client_behind_a_proxy_protocol_balancer_is_refused_and_its_neighbour_served() {
    let upstream = Upstream::start().await;
    let limit = "[[proxy.rules]]\nname = \"api\"\npath = \"/api\"\nkey = \"ip\"\nlimit = 1\nwindow = \"1m\"\n";
    let config = format!("{PROXY_HEAD}{BALANCED}{limit}");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, 1);
    let api = b"GET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let abuser = source("203.0.113.7");
    for expected in ["HTTP/1.1 200 OK", "HTTP/1.1 429 Too Many Requests", "HTTP/1.1 429 Too Many Requests"] {
        let response = read_to_close(&mut proxied_from(abuser, proxy.addr, api).await).await;
        assert_eq!(status_line(&response), expected, "{response}");
    }
    // Threshold 1: the second 429 escalates the client the balancer named.
    escalated_is(&mut escalated, "203.0.113.7/32").await;
    let refused = read_to_close(&mut proxied_from(abuser, proxy.addr, api).await).await;
    assert_eq!(refused, "", "closed at the PROXY header");
    proxy.stats_until("the blocked client refused", |stats| stats.connections_refused_reasons["blocked"] == 1).await;
    let neighbour = read_to_close(&mut proxied_from(source("203.0.113.8"), proxy.addr, api).await).await;
    assert_eq!(status_line(&neighbour), "HTTP/1.1 200 OK", "{neighbour}");
    assert_eq!(upstream.count(), 2);
}
