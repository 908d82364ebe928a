//! HTTP/2 from clients no one here wrote (curl, h2load, the h2 crate), and its bounds
//! against abuse: streams at once, the header list, and the rapid-reset attack.
//! (The limits and signature tests run over both protocols in their own files.)

use std::{net::SocketAddr, process::Output};

use http::{Request, StatusCode};
use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream},
    tls::TestTls,
    wait::PATIENCE,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

const API_LIMIT: &str =
    "[[proxy.rules]]\nname = \"api\"\npath = \"/api\"\nkey = \"ip\"\nlimit = 100\nwindow = \"1m\"\n";

async fn run(program: &str, args: &[&str]) -> Output {
    let output = tokio::process::Command::new(program).args(args).output().await;
    output.unwrap_or_else(|error| panic!("{program} (cargo xtask setup installs it): {error}"))
}

#[tokio::test]
async fn curl_speaks_h2c_with_prior_knowledge_only_where_h2c_is_on() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let url = proxy.url("/");
    let h2c = run("curl", &["-sS", "--http2-prior-knowledge", "-w", " %{http_version}", &url]).await;
    assert_eq!(String::from_utf8_lossy(&h2c.stdout), "ok 2");
    let http1 = run("curl", &["-sS", "-w", " %{http_version}", &url]).await;
    assert_eq!(String::from_utf8_lossy(&http1.stdout), "ok 1.1", "HTTP/1.1 on the same port");

    let off = PROXY_HEAD.replace("http2.h2c = true\n", "");
    let proxy = RunningProxy::start(&off, upstream.addr).await;
    let refused = run("curl", &["-sS", "--http2-prior-knowledge", "-o", "/dev/null", &proxy.url("/")]).await;
    assert!(!refused.status.success(), "h2c is off: the preface is no HTTP/1.1 request");
    assert_eq!(upstream.count(), 2);
}

/// `h2load`'s count of answers by class, from its summary.
fn status_codes(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines().find_map(|line| line.strip_prefix("status codes: ")).unwrap_or_else(|| panic!("{text}")).to_owned()
}

#[tokio::test]
async fn h2load_gets_exactly_the_limit_over_h2c_and_over_tls() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let h2c = RunningProxy::start(&format!("{PROXY_HEAD}{API_LIMIT}"), upstream.addr).await;
    let over_tls = RunningProxy::start(&format!("{}{API_LIMIT}", tls.proxy_head()), upstream.addr).await;
    for url in [h2c.url("/api"), format!("https://127.0.0.1:{}/api", over_tls.addr.port())] {
        // 300 requests on 3 connections, 10 streams at a time on each.
        let output = run("h2load", &["-n", "300", "-c", "3", "-m", "10", &url]).await;
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(status_codes(&output), "100 2xx, 0 3xx, 200 4xx, 0 5xx", "{url}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("Application protocol: h2"), "{text}");
    }
    assert_eq!(upstream.count(), 200);
    h2c.stats_until("the 200 refusals counted", |stats| stats.rejected == 200).await;
}

/// HTTP/2 framing, by hand, for a client that breaks the rules a real one keeps.
mod frames {
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const GOAWAY: u8 = 0x7;
    pub const CONTINUATION: u8 = 0x9;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).expect("a small frame").to_be_bytes();
        let mut frame = vec![length[1], length[2], length[3], kind, flags];
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    /// A GET of `path` whose head ends the stream, in HPACK from the static table
    /// (`:method GET`, `:scheme http`) and literals never indexed.
    pub fn get(stream: u32, path: &str) -> Vec<u8> {
        let mut block = vec![0x82, 0x86, 0x04, u8::try_from(path.len()).expect("a short path")];
        block.extend_from_slice(path.as_bytes());
        block.extend_from_slice(&[0x01, 0x01, b'x']);
        const END_STREAM_AND_HEADERS: u8 = 0x5;
        frame(HEADERS, END_STREAM_AND_HEADERS, stream, &block)
    }
}

/// Frames the server sends, as (type, flags, stream, payload).
async fn next_frame(stream: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0; 9];
    stream.read_exact(&mut head).await.ok()?;
    let length = usize::try_from(u32::from_be_bytes([0, head[0], head[1], head[2]])).ok()?;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], id, payload))
}

#[tokio::test]
async fn streams_past_max_concurrent_streams_are_refused_and_the_settings_say_so() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}http2.max_concurrent_streams = 4\n"), upstream.addr).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    stream.write_all(frames::PREFACE).await.expect("preface");
    stream.write_all(&frames::frame(frames::SETTINGS, 0, 0, &[])).await.expect("settings");
    let (kind, _, _, settings) = next_frame(&mut stream).await.expect("the server's settings");
    assert_eq!(kind, frames::SETTINGS);
    let advertised =
        settings.chunks(6).find(|s| s[..2] == [0, 3]).map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
    assert_eq!(advertised, Some(4), "SETTINGS_MAX_CONCURRENT_STREAMS");
    const ACK: u8 = 0x1;
    stream.write_all(&frames::frame(frames::SETTINGS, ACK, 0, &[])).await.expect("ack");
    // Six requests the upstream holds, sent at once as a client ignoring the setting would.
    let mut burst = Vec::new();
    for id in [1, 3, 5, 7, 9, 11] {
        burst.extend(frames::get(id, "/hold"));
    }
    stream.write_all(&burst).await.expect("requests");
    let mut refused = Vec::new();
    while refused.len() < 2 {
        let frame = tokio::time::timeout(PATIENCE, next_frame(&mut stream)).await.expect("frames in time");
        let Some((kind, _, id, payload)) = frame else { panic!("closed; refused so far {refused:?}") };
        if kind == frames::RST_STREAM {
            assert_eq!(u32::from_be_bytes(payload[..4].try_into().expect("code")), frames::REFUSED_STREAM);
            refused.push(id);
        }
        assert_ne!(kind, frames::GOAWAY, "the connection itself stays");
    }
    assert_eq!(refused, [9, 11]);
    upstream.arrived(4).await;
    upstream.release(4);
    assert_eq!(upstream.count(), 4);
}

/// An HTTP/2 CONTINUATION flood: a head that never ends (HEADERS without END_HEADERS,
/// then CONTINUATION frames, none ending it), of empty frames and of full ones. h2
/// buffers a head until it ends, so the proxy cuts the connection with GOAWAY
/// (ENHANCE_YOUR_CALM, counted as a flood) after a few frames, before the head passes
/// `max_header_list_bytes`; other clients are served meanwhile and after.
#[tokio::test]
async fn a_continuation_flood_is_cut_with_goaway_and_other_clients_are_served() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let other = TestClient::h2c();
    for (round, fragment) in [0usize, 16_384].into_iter().enumerate() {
        let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
        stream.write_all(frames::PREFACE).await.expect("preface");
        stream.write_all(&frames::frame(frames::SETTINGS, 0, 0, &[])).await.expect("settings");
        // `:method GET`, `:scheme http`, `:path /`, and no END_HEADERS.
        const END_STREAM: u8 = 0x1;
        stream.write_all(&frames::frame(frames::HEADERS, END_STREAM, 1, &[0x82, 0x86, 0x84])).await.expect("head");
        let reply = other.get(&proxy.url("/"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "another client served while the head is open");
        let (mut read, mut write) = stream.into_split();
        let reader = tokio::spawn(async move {
            let mut goaway = None;
            let mut head = [0; 9];
            while read.read_exact(&mut head).await.is_ok() {
                let length = usize::try_from(u32::from_be_bytes([0, head[0], head[1], head[2]])).expect("length");
                let mut payload = vec![0; length];
                if read.read_exact(&mut payload).await.is_err() {
                    break;
                }
                if head[3] == frames::GOAWAY {
                    goaway = Some(u32::from_be_bytes(payload[4..8].try_into().expect("error code")));
                }
            }
            goaway
        });
        // `x-a: b` again and again, literals never indexed: valid HPACK, and a header
        // list growing with every frame.
        let field = [0x10, 0x03, b'x', b'-', b'a', 0x01, b'b'];
        let block: Vec<u8> = field.iter().copied().cycle().take(fragment / field.len() * field.len()).collect();
        let continuation = frames::frame(frames::CONTINUATION, 0, 1, &block);
        let mut sent = 0usize;
        // A bounded flood: 16 MiB of full frames, or 100 000 empty ones.
        while sent < 100_000 && sent * fragment < 16 << 20 && !reader.is_finished() {
            if write.write_all(&continuation).await.is_err() {
                break;
            }
            sent += 1;
        }
        let goaway = tokio::time::timeout(PATIENCE, reader).await.expect("closed in time").expect("reader");
        eprintln!("{fragment}-byte CONTINUATION frames: {sent} written before the cut");
        assert_eq!(goaway, Some(frames::ENHANCE_YOUR_CALM), "{fragment}-byte frames: GOAWAY after {sent} sent");
        proxy.stats_until("the cut counted", |stats| stats.http2_reset_floods == round as u64 + 1).await;
    }
    assert_eq!(other.get(&proxy.url("/"), &[]).await.status, StatusCode::OK, "served after the floods");
    assert_eq!(upstream.count(), 3, "no flooded head reached the upstream");
}

#[tokio::test]
async fn a_header_list_over_the_bound_gets_431() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}http2.max_header_list_bytes = 8192\n"), upstream.addr).await;
    let big = format!("x-big: {}", "a".repeat(10_000));
    let url = proxy.url("/");
    let output =
        run("curl", &["-sS", "--http2-prior-knowledge", "-H", &big, "-o", "/dev/null", "-w", "%{http_code}", &url])
            .await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "431");
    let small = format!("x-small: {}", "a".repeat(4_000));
    let output =
        run("curl", &["-sS", "--http2-prior-knowledge", "-H", &small, "-o", "/dev/null", "-w", "%{http_code}", &url])
            .await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "200");
    assert_eq!(upstream.count(), 1);
}

/// An h2 connection to `addr`, driven on a task of its own.
pub(crate) async fn h2_connect(
    addr: SocketAddr,
) -> (h2::client::SendRequest<bytes::Bytes>, tokio::task::JoinHandle<Result<(), h2::Error>>) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    (send, tokio::spawn(connection))
}

fn get(addr: SocketAddr, path: &str) -> Request<()> {
    Request::get(format!("http://{addr}{path}")).body(()).expect("request")
}

#[tokio::test]
async fn a_connection_that_cancels_its_requests_past_the_bound_is_cut() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}http2.max_resets_per_minute = 10\n"), upstream.addr).await;
    let (mut send, connection) = h2_connect(proxy.addr).await;
    let cancel_one = async |send: &mut h2::client::SendRequest<bytes::Bytes>, n: usize| {
        let (_response, mut stream) = send.send_request(get(proxy.addr, "/hold"), true).expect("a stream");
        // Taken by the proxy and sent on: the work a reset makes it waste.
        upstream.arrived(n).await;
        stream.send_reset(h2::Reason::CANCEL);
    };
    for n in 1..=10 {
        send = send.ready().await.expect("the connection is still open");
        cancel_one(&mut send, n).await;
    }
    // Ten cancellations are within the bound: the connection still serves.
    send = send.ready().await.expect("open after 10");
    let (response, _) = send.send_request(get(proxy.addr, "/"), true).expect("a stream");
    assert_eq!(response.await.expect("answer").status(), StatusCode::OK);
    assert_eq!(proxy.proxy.stats().http2_reset_floods, 0);
    send = send.ready().await.expect("open");
    cancel_one(&mut send, 12).await;
    let ended = tokio::time::timeout(PATIENCE, connection).await.expect("cut in time").expect("task");
    assert!(ended.is_err() || send.ready().await.is_err(), "the connection is closed");
    // h2's own cut closes the socket before the worker counts it.
    proxy.stats_until("the cut counted", |stats| stats.http2_reset_floods == 1).await;
    // The cut is of that connection only.
    let reply = TestClient::h2c().get(&proxy.url("/"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn a_burst_of_opened_and_reset_streams_is_cut_before_most_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}http2.max_resets_per_minute = 10\n"), upstream.addr).await;
    let (mut send, connection) = h2_connect(proxy.addr).await;
    let mut sent = 0;
    for _ in 0..1_000 {
        let Ok(ready) = send.ready().await else { break };
        send = ready;
        let Ok((_response, mut stream)) = send.send_request(get(proxy.addr, "/hold"), true) else { break };
        stream.send_reset(h2::Reason::CANCEL);
        sent += 1;
    }
    // The client queues its frames faster than the proxy reads them: the cut comes
    // when the proxy has read enough of them.
    let _ = tokio::time::timeout(PATIENCE, connection).await.expect("cut in time");
    // h2's own cut closes the socket before the worker counts it: the count is read
    // once the workers have drained.
    let stopped = std::sync::Arc::clone(&proxy.proxy);
    proxy.shutdown().await;
    assert_eq!(stopped.stats().http2_reset_floods, 1, "{sent} streams opened and reset");
    // Whichever cut it (the proxy's count of cancellations, or h2's of streams reset
    // before they were taken), what reached the upstream is at most the cancellations
    // allowed and one more, and the streams open at the cut.
    let reached = upstream.count();
    assert!(reached <= 10 + 1 + 100, "{reached} of {sent} reached the upstream");
}

/// An HTTP/2 request without `content-length` announces no size (DATA frames follow
/// the head): `body_larger_than` counts it as larger, as it does a chunked body,
/// instead of as empty. A head that ends the stream has no body at all.
#[tokio::test]
async fn an_http2_body_without_content_length_counts_as_larger_than_any_bound() {
    let upstream = Upstream::start().await;
    let rule = "[[proxy.rules]]\nname = \"big-posts\"\naction = \"deny\"\nmethods = [\"POST\"]\n\
                [proxy.rules.when]\nbody_larger_than = 4\n";
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{rule}"), upstream.addr).await;
    let (mut send, _connection) = h2_connect(proxy.addr).await;
    let mut post = async |length: Option<usize>, body: &'static [u8]| {
        let mut request = Request::post(format!("http://{}/upload", proxy.addr));
        if let Some(length) = length {
            request = request.header("content-length", length);
        }
        send = send.clone().ready().await.expect("the connection is open");
        let (response, mut stream) =
            send.send_request(request.body(()).expect("request"), body.is_empty()).expect("a stream");
        if !body.is_empty() {
            stream.send_data(bytes::Bytes::from_static(body), true).expect("the body");
        }
        response.await.expect("an answer").status()
    };
    assert_eq!(post(None, &[b'x'; 1_000]).await, StatusCode::FORBIDDEN, "no content-length");
    assert_eq!(post(None, b"1234").await, StatusCode::FORBIDDEN, "no content-length, however short");
    assert_eq!(post(Some(1_000), &[b'x'; 1_000]).await, StatusCode::FORBIDDEN, "announced");
    assert_eq!(post(Some(4), b"1234").await, StatusCode::OK, "announced within the bound");
    assert_eq!(post(None, b"").await, StatusCode::OK, "END_STREAM on the head: no body");
    assert_eq!(upstream.count(), 2);
    proxy.stats_until("the three denials counted", |stats| stats.denied == 3).await;
}

/// Over HTTP/2 the host is `:authority`; a `host` header that names another, or two
/// of them, gets 400 as over HTTP/1.1. One that agrees is forwarded once.
#[tokio::test]
async fn an_http2_host_at_odds_with_the_authority_is_refused_with_400() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let (mut send, _connection) = h2_connect(proxy.addr).await;
    let mut status = async |hosts: &[&str]| {
        let mut request = Request::get("http://a.example/");
        for host in hosts {
            request = request.header("host", *host);
        }
        send = send.clone().ready().await.expect("the connection is open");
        let (response, _) = send.send_request(request.body(()).expect("request"), true).expect("a stream");
        response.await.expect("an answer").status()
    };
    assert_eq!(status(&["b.example"]).await, StatusCode::BAD_REQUEST);
    assert_eq!(status(&["a.example", "b.example"]).await, StatusCode::BAD_REQUEST);
    assert_eq!(upstream.count(), 0);
    assert_eq!(status(&["a.example"]).await, StatusCode::OK);
    assert_eq!(status(&[]).await, StatusCode::OK);
    let hosts: Vec<Vec<String>> = upstream
        .seen()
        .iter()
        .map(|seen| seen.headers.get_all("host").iter().map(|v| v.to_str().unwrap_or("?").to_owned()).collect())
        .collect();
    assert_eq!(hosts, [["a.example"], ["a.example"]]);
}
