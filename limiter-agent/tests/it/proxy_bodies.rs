//! Bodies the proxy reads into memory before the limits decide (a signed body, a
//! chunked one, an HTTP/2 one without a length): a client already over its own limit
//! is refused before any of it is read, and what one connection and one client may
//! have held at once is bounded.

use bytes::Bytes;
use http::{Request, StatusCode};
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, Upstream, exchange_from, raw_exchange, read_to_close};
use tokio::{io::AsyncWriteExt, net::TcpStream};

use crate::proxy_http2::h2_connect;

/// One upload a minute per client address.
const PER_IP: &str =
    "[[proxy.rules]]\nname = \"uploads\"\npath = \"/upload\"\nkey = \"ip\"\nlimit = 1\nwindow = \"1m\"\n";

/// A chunked upload's head, and a chunk of 900 bytes (`0x384`).
const CHUNKED: &str = "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
const LAST_CHUNK: &str = "0\r\n\r\n";

fn chunk() -> String {
    format!("384\r\n{}\r\n", "a".repeat(900))
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

/// Before, a signed or chunked body was read whole (and `100 Continue` sent for it)
/// before any limit was asked: a client over its per-IP limit still cost a read of
/// up to `max_body_bytes` per request, and here got `100 Continue` and a 408 once
/// `body_timeout` ran out on the body it never sent.
#[tokio::test]
async fn a_client_over_its_own_limit_is_refused_before_its_body_is_read() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}body_timeout = \"5s\"\n{PER_IP}"), upstream.addr).await;
    let first = raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    )
    .await;
    assert_eq!(status_line(&first), "HTTP/1.1 200 OK", "{first}");
    // Heads that announce a body and never send it: only an answer that did not wait
    // for the body comes before body_timeout, and none is `100 Continue`.
    let signed = "Content-Length: 100000\r\nX-Signature: keyId=\"k\",ts=\"1\",nonce=\"n\",sig=\"AAAA\"";
    for framing in [signed, "Transfer-Encoding: chunked"] {
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\n{framing}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        );
        let response = raw_exchange(proxy.addr, head.as_bytes()).await;
        assert_eq!(status_line(&response), "HTTP/1.1 429 Too Many Requests", "{framing}: {response}");
        assert!(!response.contains("100 Continue"), "{framing}: {response}");
        assert!(response.contains("#quota-exceeded") && response.contains("\"uploads\""), "{response}");
        assert!(response.to_ascii_lowercase().contains("retry-after: "), "{response}");
    }
    assert_eq!(upstream.count(), 1);
    let stats = proxy.stats_until("both refusals counted", |stats| stats.rejected == 2).await;
    let uploads = stats.policies.iter().find(|policy| policy.name == "uploads").expect("the rule's counts");
    assert_eq!((uploads.forwarded, uploads.rejected), (1, 2));
    assert_eq!((stats.signature_failures, stats.body_timeouts), (0, 0), "no body was read, no MAC checked");
}

/// Before, nothing bounded what one client had in memory: every connection could
/// hold a body of up to `max_body_bytes` it trickled in, times 256 connections.
#[tokio::test]
async fn a_client_holds_at_most_its_share_of_bodies_read_into_memory() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}max_body_bytes = 1000\nmax_buffered_bytes_per_client = 2500\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut held = Vec::new();
    for n in 1..=2 {
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        stream.write_all(format!("{CHUNKED}{}", chunk()).as_bytes()).await.expect("a chunk, and no end");
        proxy.stats_until("the chunk held", |stats| stats.buffered_bytes == 900 * n).await;
        held.push(stream);
    }
    // A third from the same client would hold 2 700 bytes.
    let response = raw_exchange(proxy.addr, format!("{CHUNKED}{}", chunk()).as_bytes()).await;
    assert_eq!(status_line(&response), "HTTP/1.1 429 Too Many Requests", "{response}");
    assert!(response.contains("#buffers-full"), "{response}");
    proxy.stats_until("the refusal counted", |stats| stats.buffers_full == 1 && stats.buffered_bytes == 1800).await;
    // Another client has a share of its own.
    let other = exchange_from([127, 0, 0, 2], proxy.addr, format!("{CHUNKED}{}{LAST_CHUNK}", chunk()).as_bytes()).await;
    assert_eq!(status_line(&other), "HTTP/1.1 200 OK", "{other}");
    // A body finished is forwarded whole, and gives its share back.
    let mut first = held.remove(0);
    first.write_all(LAST_CHUNK.as_bytes()).await.expect("the end");
    let response = read_to_close(&mut first).await;
    assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{response}");
    proxy.stats_until("the share given back", |stats| stats.buffered_bytes == 900).await;
    let again = raw_exchange(proxy.addr, format!("{CHUNKED}{}{LAST_CHUNK}", chunk()).as_bytes()).await;
    assert_eq!(status_line(&again), "HTTP/1.1 200 OK", "{again}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|request| request.body == "a".repeat(900)));
    drop(held);
    proxy.stats_until("every share given back", |stats| stats.buffered_bytes == 0).await;
}

/// An HTTP/2 connection reads up to `max_concurrent_streams` bodies at once: before,
/// 100 of `max_body_bytes` each on one connection.
#[tokio::test]
async fn an_http2_connection_holds_at_most_its_share_of_bodies_read_into_memory() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}max_body_bytes = 1000\nmax_buffered_bytes_per_connection = 2500\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let (send, _connection) = h2_connect(proxy.addr).await;
    // No content-length: each body is read whole before it is forwarded.
    let open = async |send: &h2::client::SendRequest<Bytes>| {
        let request = Request::post(format!("http://{}/upload", proxy.addr)).body(()).expect("request");
        let (response, mut stream) =
            send.clone().ready().await.expect("open").send_request(request, false).expect("a stream");
        stream.send_data(Bytes::from("a".repeat(900)), false).expect("900 bytes, and no end");
        (response, stream)
    };
    let mut streams = Vec::new();
    for n in 1..=2 {
        streams.push(open(&send).await);
        proxy.stats_until("the body held", |stats| stats.buffered_bytes == 900 * n).await;
    }
    let (third, _stream) = open(&send).await;
    let third = third.await.expect("an answer");
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.headers().get("retry-after").map(|value| value.as_bytes()), Some(&b"1"[..]));
    proxy.stats_until("the refusal counted", |stats| stats.buffers_full == 1 && stats.buffered_bytes == 1800).await;
    let (first, mut stream) = streams.remove(0);
    stream.send_data(Bytes::new(), true).expect("the end");
    assert_eq!(first.await.expect("an answer").status(), StatusCode::OK);
    assert_eq!(upstream.count(), 1);
    proxy.stats_until("its share given back", |stats| stats.buffered_bytes == 900).await;
}
