//! What the proxy does with oversized, slow, malformed and smuggling-shaped requests,
//! a dead upstream, hop-by-hop headers and shutdown: raw TCP where a real client
//! would refuse to send such bytes.

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, raw_exchange, read_to_close};
use tokio::{io::AsyncWriteExt, net::TcpStream};

fn with_body_limit(limit: u32) -> String {
    format!("{PROXY_HEAD}max_body_bytes = {limit}\n")
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

#[tokio::test]
async fn body_over_the_limit_by_content_length_is_refused_unread() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&with_body_limit(1000), upstream.addr).await;
    // The body is announced but never sent: the answer must not wait for it.
    let response = raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\nExpect: 100-continue\r\n\r\n",
    )
    .await;
    assert_eq!(status_line(&response), "HTTP/1.1 413 Payload Too Large", "{response}");
    assert!(response.contains("application/problem+json") && response.contains("#body-too-large"), "{response}");
    assert_eq!(upstream.count(), 0);
    proxy.stats_until("the refusal counted", |stats| stats.body_too_large == 1).await;
}

#[tokio::test]
async fn chunked_body_over_the_limit_is_refused_before_the_upstream_sees_it() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&with_body_limit(1000), upstream.addr).await;
    let chunk = format!("258\r\n{}\r\n", "a".repeat(600));
    let request =
        format!("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n");
    let response = raw_exchange(proxy.addr, request.as_bytes()).await;
    assert_eq!(status_line(&response), "HTTP/1.1 413 Payload Too Large", "{response}");
    assert_eq!(upstream.count(), 0);

    // Under the limit, the same framing goes through with the exact bytes.
    let request = format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunk}0\r\n\r\n"
    );
    let response = raw_exchange(proxy.addr, request.as_bytes()).await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{response}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, "a".repeat(600));
    assert!(seen[0].headers.get("transfer-encoding").is_none_or(|te| te == "chunked"));
}

#[tokio::test]
async fn slow_headers_get_408_and_the_connection_closes() {
    let upstream = Upstream::start().await;
    let timeout = Duration::from_millis(300);
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}header_timeout = \"300ms\"\n"), upstream.addr).await;
    let start = Instant::now();
    let response = raw_exchange(proxy.addr, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").await;
    let elapsed = start.elapsed();
    assert!(response.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{response}");
    assert!(response.contains("#request-timeout"), "{response}");
    assert!(elapsed >= timeout && elapsed < timeout * 10, "closed after {elapsed:?}");
    assert_eq!(upstream.count(), 0);
    proxy.stats_until("the timeout counted", |stats| stats.timeouts == 1).await;

    // A connection that never starts a request is closed without a word.
    let response = raw_exchange(proxy.addr, b"").await;
    assert_eq!(response, "");
}

#[tokio::test]
async fn malformed_and_ambiguous_requests_never_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let refused: [&[u8]; 8] = [
        // Two lengths: which one frames the body is up to the reader.
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\nhello",
        // A coding other than chunked last: the body has no end.
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n folded: line\r\n\r\n",
    ];
    for request in refused {
        let response = raw_exchange(proxy.addr, request).await;
        assert_eq!(
            status_line(&response),
            "HTTP/1.1 400 Bad Request",
            "{:?} -> {response}",
            String::from_utf8_lossy(request)
        );
    }
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn content_length_with_transfer_encoding_cannot_smuggle_a_request() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    // CL.TE: a reader trusting Content-Length takes the smuggled request as body; one
    // trusting chunked framing sees it as the next request on the connection.
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let body = format!("0\r\n\r\n{smuggled}");
    let request = format!(
        "POST /front HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{body}",
        body.len()
    );
    let response = raw_exchange(proxy.addr, request.as_bytes()).await;
    // hyper follows RFC 9112 §6.3: chunked wins, Content-Length is dropped and the
    // connection closes after the response, so the tail is never read as a request.
    assert_eq!(response.matches("HTTP/1.1 ").count(), 1, "{response}");
    let seen = upstream.seen();
    assert!(seen.iter().all(|s| s.uri.path() != "/smuggled"), "{seen:?}");
    assert_eq!(seen.len(), 1);
    assert!(seen[0].headers.get("content-length").is_none_or(|cl| cl == "0"), "{:?}", seen[0].headers);
    assert!(seen[0].body.is_empty());
}

#[tokio::test]
async fn garbage_does_not_hurt_the_proxy() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let garbage: [&[u8]; 5] = [
        b"\x00\xff\xfe\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    ];
    for bytes in garbage {
        let response = raw_exchange(proxy.addr, bytes).await;
        assert!(response.is_empty() || response.starts_with("HTTP/1.1 4"), "{response}");
    }
    let reply = TestClient::default().get(&proxy.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn dead_upstream_gives_502_quickly() {
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("address")
    };
    let proxy = RunningProxy::start(PROXY_HEAD, closed).await;
    let reply = TestClient::default().get(&proxy.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(reply.elapsed < Duration::from_secs(1), "took {:?}", reply.elapsed);
    assert_eq!(reply.header("content-type"), "application/problem+json");
    assert_eq!(reply.json()["type"], "https://limiter.dev/problems#upstream-unavailable");
    proxy.stats_until("the upstream error counted", |stats| stats.upstream_errors == 1).await;
}

#[tokio::test]
async fn unresponsive_upstream_host_gives_502_after_the_connect_timeout() {
    // A listener that never accepts, its backlog filled: Linux drops further SYNs, so
    // a connect hangs as it would to a host that is down.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let black_hole = socket.local_addr().expect("address");
    let _listener = socket.listen(1).expect("listen");
    let mut fillers = Vec::new();
    while let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(black_hole)).await {
        fillers.push(stream);
    }
    let proxy = RunningProxy::start(PROXY_HEAD, black_hole).await;
    let reply = TestClient::default().get(&proxy.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(reply.elapsed >= Duration::from_millis(900), "took {:?}: the connect did not hang", reply.elapsed);
    assert!(reply.elapsed < Duration::from_secs(3), "took {:?}", reply.elapsed);
}

#[tokio::test]
async fn an_upstream_that_never_answers_gives_504_after_the_upstream_timeout() {
    // Accepts and reads, never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}upstream_timeout = \"300ms\"\n"), addr).await;
    let reply = TestClient::default().get(&proxy.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(reply.elapsed >= Duration::from_millis(300), "took {:?}", reply.elapsed);
    assert!(reply.elapsed < Duration::from_secs(2), "took {:?}", reply.elapsed);
    assert_eq!(reply.json()["type"], "https://limiter.dev/problems#upstream-timeout");
    proxy.stats_until("the timeout counted as an upstream error", |stats| stats.upstream_errors == 1).await;
}

#[tokio::test]
async fn hop_by_hop_headers_stay_on_their_hop() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let reply = TestClient::default()
        .request(
            Method::GET,
            &proxy.url("/hop"),
            &[
                ("connection", "x-client-secret"),
                ("x-client-secret", "1"),
                ("keep-alive", "timeout=5"),
                ("proxy-authorization", "Basic eA=="),
                ("te", "trailers"),
                ("upgrade", "h2c"),
                ("x-client-kept", "1"),
            ],
            b"",
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    for name in ["x-upstream-secret", "keep-alive", "proxy-authenticate"] {
        assert!(reply.headers.get(name).is_none(), "{name} reached the client");
    }
    assert_eq!(reply.header("x-upstream-kept"), "1");
    let seen = &upstream.seen()[0];
    for name in ["x-client-secret", "keep-alive", "proxy-authorization", "te", "upgrade"] {
        assert!(seen.headers.get(name).is_none(), "{name} reached the upstream");
    }
    assert_eq!(seen.headers["x-client-kept"], "1");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let addr = proxy.addr;
    let client = TestClient::default();
    let url = proxy.url("/hold");
    let in_flight = tokio::spawn(async move { client.get(&url, &[]).await });
    upstream.arrived(1).await;

    // An idle keep-alive connection must not hold up the drain.
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    upstream.arrived(2).await;

    let shutdown = tokio::spawn(proxy.shutdown());
    // Still running until the held request is answered.
    tokio::task::yield_now().await;
    assert!(!shutdown.is_finished());
    upstream.release(1);
    let reply = in_flight.await.expect("client task");
    assert_eq!(reply.status, StatusCode::OK);
    shutdown.await.expect("shutdown");
    assert!(read_to_close(&mut idle).await.starts_with("HTTP/1.1 200 OK"));
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting after shutdown");
}

#[tokio::test]
async fn large_responses_stream_through() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let reply = TestClient::default().get(&proxy.url("/big"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body.len(), 100 * 1024);
}

#[tokio::test]
async fn forwarding_headers_pass_from_trusted_proxies_only() {
    let claims = [
        ("forwarded", "for=203.0.113.9;proto=https;host=bank.example"),
        ("x-real-ip", "203.0.113.9"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "bank.example"),
        ("x-forwarded-for", "203.0.113.9"),
    ];
    let upstream = Upstream::start().await;
    // The test client connects from 127.0.0.1: first an ordinary client, then a
    // trusted proxy.
    for (trusted, config) in
        [(false, PROXY_HEAD.to_owned()), (true, format!("{PROXY_HEAD}trusted_proxies = [\"127.0.0.1/32\"]\n"))]
    {
        let proxy = RunningProxy::start(&config, upstream.addr).await;
        let reply = TestClient::default().request(Method::GET, &proxy.url("/"), &claims, b"").await;
        assert_eq!(reply.status, StatusCode::OK);
        let seen = upstream.seen().pop().expect("forwarded");
        for (name, value) in &claims[..4] {
            let passed = seen.headers.get(*name).map(|v| v.to_str().unwrap_or("<not text>"));
            assert_eq!(passed, trusted.then_some(*value), "{name} from a peer trusted: {trusted}");
        }
        let chain = if trusted { "203.0.113.9, 127.0.0.1" } else { "127.0.0.1" };
        assert_eq!(seen.headers["x-forwarded-for"], chain);
    }
}

/// Two `Host` headers, or one at odds with an absolute target's authority: a rule,
/// a signature covering `Host` and the upstream could each take another one.
#[tokio::test]
async fn a_repeated_or_contradicted_host_is_refused_with_400() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    for request in [
        "GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\nConnection: close\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\nConnection: close\r\n\r\n",
    ] {
        let response = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert_eq!(status_line(&response), "HTTP/1.1 400 Bad Request", "{request}: {response}");
        assert!(response.contains("#bad-host"), "{request}: {response}");
    }
    assert_eq!(upstream.count(), 0);
    let response =
        raw_exchange(proxy.addr, b"GET http://a.example/ HTTP/1.1\r\nHost: A.example\r\nConnection: close\r\n\r\n")
            .await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "the same host in another case: {response}");
    assert_eq!(upstream.seen()[0].headers.get_all("host").iter().count(), 1);
}

/// A worker that died (a panic in its accept loop: a bug) used to leave the proxy
/// with one worker fewer, silently, and with one worker none at all. It is counted,
/// logged and replaced on the same socket; one that dies again at once is replaced
/// too, a moment later.
#[tokio::test]
async fn a_worker_that_dies_is_counted_and_replaced() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}workers = 1\n"), upstream.addr).await;
    let client = TestClient::default();
    let url = proxy.url("/");
    // A connection of its own for each request: the dead worker's are cut.
    let close = [("connection", "close")];
    assert_eq!(client.get(&url, &close).await.status, StatusCode::OK);
    for deaths in 1..=2 {
        proxy.kill_worker(0);
        proxy.stats_until("the dead worker counted", |stats| stats.workers_replaced == deaths).await;
        assert_eq!(client.get(&url, &close).await.status, StatusCode::OK, "served after death {deaths}");
    }
}
