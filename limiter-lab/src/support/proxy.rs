//! Shared pieces of the proxy tests: a recording upstream, a running proxy, an HTTP
//! client that times each request, and raw TCP exchanges for what clients must not
//! be able to send.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use limiter::{
    config::Config,
    escalation::{Escalation, Escalator},
    proxy::{Proxy, ProxyStats, Serving},
    security_log::SecurityLog,
    signature::KeySecrets,
};
use limiter_core::{
    Clock as _, FakeClock, SystemClock,
    signature::{Canonical, sha256, sign_hex},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::{Semaphore, mpsc, watch},
    task::JoinHandle,
};

use super::wait::{PATIENCE, until_async};

/// A request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug)]
struct Recorder {
    /// Requests whose head arrived: counted before the body is read, so a request
    /// refused halfway through its body would still show up.
    arrived: watch::Sender<usize>,
    seen: Mutex<Vec<Seen>>,
    /// Permits for `/hold` requests to answer.
    gate: Semaphore,
    /// By `X-API-Key` (empty without one): requests being answered now, and the most
    /// there ever were at once.
    concurrency: Mutex<HashMap<String, (usize, usize)>>,
    /// `/loaded` requests being answered now.
    loaded: AtomicUsize,
}

/// `/loaded`'s latency at up to [`LOADED_KNEE`] in flight.
pub const LOADED_BASE: Duration = Duration::from_millis(100);

/// In flight beyond which `/loaded` slows down in proportion.
pub const LOADED_KNEE: usize = 10;

/// `/loaded`'s latency for a request arriving `in_flight` deep (itself included): an
/// upstream that takes [`LOADED_KNEE`] at once and queues the rest inside.
#[must_use]
pub fn loaded_latency(in_flight: usize) -> Duration {
    let factor = u32::try_from(in_flight.max(LOADED_KNEE)).unwrap_or(u32::MAX);
    LOADED_BASE * factor / u32::try_from(LOADED_KNEE).unwrap_or(1)
}

/// One `/loaded` request being answered.
struct Loaded<'r>(&'r AtomicUsize);

impl Drop for Loaded<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One request being answered, counted in its key's concurrency until dropped.
struct Answering<'r> {
    recorder: &'r Recorder,
    key: String,
}

impl<'r> Answering<'r> {
    fn new(recorder: &'r Recorder, key: String) -> Self {
        let mut concurrency = recorder.concurrency.lock().unwrap_or_else(PoisonError::into_inner);
        let (now, peak) = concurrency.entry(key.clone()).or_default();
        *now += 1;
        *peak = (*peak).max(*now);
        drop(concurrency);
        Self { recorder, key }
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let mut concurrency = self.recorder.concurrency.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((now, _)) = concurrency.get_mut(&self.key) {
            *now -= 1;
        }
    }
}

/// A test upstream on 127.0.0.1. Answers 200 with body `ok`; `…/hold` waits for
/// [`Upstream::release`]; `/hop` answers with hop-by-hop headers to be removed;
/// `/big` answers with a 100 KiB body. On any path, `?status=N` answers with status
/// `N`, `?delay_ms=N` that many milliseconds after the request arrived (a login
/// failing, a slow upstream) and `?cost=N` with `X-Request-Cost: N` (a metered call). `/loaded` answers after [`loaded_latency`] of the
/// `/loaded` requests in flight when it arrived (an upstream with a knee). It counts the requests it is answering at once per
/// `X-API-Key` ([`Upstream::peak`]), and [`Upstream::seen`] is its arrival order.
#[derive(Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    recorder: Arc<Recorder>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let addr = listener.local_addr().expect("upstream address");
        let recorder = Arc::new(Recorder {
            arrived: watch::Sender::new(0),
            seen: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
            concurrency: Mutex::default(),
            loaded: AtomicUsize::new(0),
        });
        let shared = recorder.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let recorder = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| respond(recorder.clone(), request));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Self { addr, recorder, task }
    }

    /// How many requests reached the upstream.
    pub fn count(&self) -> usize {
        *self.recorder.arrived.borrow()
    }

    /// Waits until at least `n` requests have arrived.
    pub async fn arrived(&self, n: usize) {
        let mut arrived = self.recorder.arrived.subscribe();
        tokio::time::timeout(PATIENCE, arrived.wait_for(|count| *count >= n))
            .await
            .expect("requests did not reach the upstream in time")
            .expect("upstream gone");
    }

    /// Lets `n` held requests answer.
    pub fn release(&self, n: usize) {
        self.recorder.gate.add_permits(n);
    }

    /// The most requests with `X-API-Key: key` (`""`: without one) it was answering at
    /// once.
    pub fn peak(&self, key: &str) -> usize {
        let concurrency = self.recorder.concurrency.lock().unwrap_or_else(PoisonError::into_inner);
        concurrency.get(key).map_or(0, |(_, peak)| *peak)
    }

    /// The requests received in full, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.recorder.seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

async fn respond(recorder: Arc<Recorder>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let key = request.headers().get("x-api-key").and_then(|key| key.to_str().ok()).unwrap_or_default();
    let _answering = Answering::new(&recorder, key.to_owned());
    recorder.arrived.send_modify(|count| *count += 1);
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let asked = |name: &str| {
        let query = parts.uri.query().unwrap_or_default();
        query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse::<u64>().ok())
    };
    let (status, delay, cost) = (asked("status"), asked("delay_ms"), asked("cost"));
    recorder.seen.lock().unwrap_or_else(PoisonError::into_inner).push(Seen {
        method: parts.method,
        uri: parts.uri,
        headers: parts.headers,
        body,
    });
    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
    if let Some(status) = status {
        *response.status_mut() =
            u16::try_from(status).ok().and_then(|s| StatusCode::from_u16(s).ok()).expect("a status");
    }
    if let Some(cost) = cost {
        response.headers_mut().insert("x-request-cost", HeaderValue::from(cost));
    }
    if let Some(ms) = delay {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    match path.as_str() {
        hold if hold.ends_with("/hold") => {
            recorder.gate.acquire().await.expect("gate closed").forget();
        }
        "/hop" => {
            let headers = response.headers_mut();
            headers.insert("connection", HeaderValue::from_static("x-upstream-secret"));
            headers.insert("x-upstream-secret", HeaderValue::from_static("1"));
            headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
            headers.insert("proxy-authenticate", HeaderValue::from_static("Basic"));
            headers.insert("x-upstream-kept", HeaderValue::from_static("1"));
        }
        "/big" => *response.body_mut() = Full::new(Bytes::from(vec![b'x'; 100 * 1024])),
        "/loaded" => {
            let in_flight = recorder.loaded.fetch_add(1, Ordering::Relaxed) + 1;
            let _loaded = Loaded(&recorder.loaded);
            tokio::time::sleep(loaded_latency(in_flight)).await;
        }
        _ => {}
    }
    Ok(response)
}

/// A proxy serving in the background until [`RunningProxy::shutdown`].
#[derive(Debug)]
pub struct RunningProxy {
    pub proxy: Arc<Proxy<FakeClock>>,
    /// What the proxy's limits, signatures and idempotency are measured with.
    pub clock: FakeClock,
    pub addr: SocketAddr,
    /// Stopped when dropped.
    serving: Serving,
}

/// Parses a `[proxy]` config; `{upstream}` in the text is replaced by the upstream's
/// address and `listen` defaults to an ephemeral port on 127.0.0.1.
pub fn proxy_config(text: &str, upstream: SocketAddr) -> Arc<limiter::config::ProxyConfig> {
    let text = text.replace("{upstream}", &upstream.to_string());
    let config = Config::parse(&text, Path::new("test.toml")).unwrap_or_else(|e| panic!("test config: {e}\n{text}"));
    Arc::new(config.proxy.expect("the test config has a [proxy] table"))
}

/// The head of a test config: `[proxy]` with the listen and upstream keys set.
/// `disclose = "full"`: most tests check the policies the headers name. `h2c`: the
/// tests that run over both protocols reach the same proxy with either client.
pub const PROXY_HEAD: &str =
    "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\ndisclose = \"full\"\nhttp2.h2c = true\n";

/// A fresh secret file: tests run concurrently, so none may rewrite another's.
pub fn secret_file(secret: &[u8]) -> PathBuf {
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("limiter-proxy-test-{}-{n}", std::process::id()));
    std::fs::write(&path, secret).expect("write secret file");
    path
}

/// A config with one signed route: key `k-pay` (plan `basic`, 1000 a minute) signing
/// with the secret in `secret_file`, and rule `transfer` (`/api/transfer`, 100 a
/// second per key) requiring signatures; `extra` goes into `[proxy]`.
pub fn signed_route_config(extra: &str, secret_file: &Path) -> String {
    format!(
        r#"{PROXY_HEAD}{extra}
[proxy.plans.basic]
limit = 1000
window = "1m"
[[proxy.keys]]
id = "k-pay"
plan = "basic"
secrets = ["file:{}"]
[[proxy.rules]]
name = "transfer"
path = "/api/transfer"
require_signature = true
key = "api_key"
limit = 100
window = "1s"
"#,
        secret_file.display()
    )
}

impl RunningProxy {
    /// A proxy on the config `text` (see [`PROXY_HEAD`]), measuring time with a fake
    /// clock that reads the wall clock's time at the start and moves only when a test
    /// advances it: windows never turn under a test's feet, and signatures made with
    /// the wall clock still pass the timestamp check.
    pub async fn start(text: &str, upstream: SocketAddr) -> Self {
        let config = proxy_config(text, upstream);
        let secrets = KeySecrets::load(&config).expect("test secrets");
        let clock = FakeClock::new(SystemClock.now());
        let proxy = Proxy::bind(config, secrets, clock.clone()).await.expect("bind proxy");
        let addr = proxy.local_addr();
        let proxy = Arc::new(proxy);
        let serving = proxy.serve().expect("proxy workers");
        Self { proxy, clock, addr, serving }
    }

    /// Sends this proxy's refusals to an escalator with `threshold`, set up as the agent
    /// would from `text` (this proxy's config, see [`PROXY_HEAD`]) beside a kernel
    /// layer; the blocks it asks for.
    pub fn escalate(&self, text: &str, upstream: SocketAddr, threshold: u32) -> mpsc::Receiver<Escalation> {
        self.escalate_with(text, upstream, &format!("threshold = {threshold}\n"))
    }

    /// [`Self::escalate`], with `escalation` the keys of `[escalation]`.
    pub fn escalate_with(&self, text: &str, upstream: SocketAddr, escalation: &str) -> mpsc::Receiver<Escalation> {
        let whole = format!(
            "[xdp]\ninterfaces = [\"lo\"]\n[xdp.limit]\npackets_per_second = 10\nburst = 20\n{text}\
             [escalation]\n{escalation}"
        )
        .replace("{upstream}", &upstream.to_string());
        let whole = Config::parse(&whole, Path::new("test.toml")).unwrap_or_else(|e| panic!("escalation config: {e}"));
        let (escalations, escalated) = mpsc::channel(8);
        self.proxy.escalate_to(Arc::new(Escalator::new(&whole, escalations, self.clock.clone(), None)));
        escalated
    }

    /// Writes this proxy's security events to the log that `section` (the keys of
    /// `[agent.security_log]`) describes, as the agent would; the log, for its counts.
    pub fn log_security(&self, section: &str) -> Arc<SecurityLog> {
        let text = format!("[agent.security_log]\n{section}");
        let config = Config::parse(&text, Path::new("test.toml")).unwrap_or_else(|e| panic!("security log: {e}"));
        let log = SecurityLog::start(config.agent.security_log.as_ref()).expect("open the security log");
        self.proxy.log_security_to(Arc::clone(&log));
        log
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The proxy's counters once `done` holds of them (see [`until_async`]): a worker
    /// may count a request after its client has the answer. For a count the test
    /// states exactly, wait for that very value: one past it fails too.
    pub async fn stats_until(&self, what: &str, done: impl FnMut(&ProxyStats) -> bool) -> ProxyStats {
        until_async(what, || self.proxy.stats(), done).await
    }

    /// Kills worker `worker` (of `proxy.workers`) as a bug would: a panic in its
    /// accept loop.
    pub fn kill_worker(&self, worker: usize) {
        self.serving.kill_worker(worker);
    }

    /// Asks the proxy to stop and waits until its workers have drained.
    pub async fn shutdown(self) {
        tokio::time::timeout(PATIENCE * 2, self.serving.stop(PATIENCE)).await.expect("proxy did not drain in time");
    }
}

/// A response with what the tests look at.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub elapsed: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("<absent>", |v| v.to_str().unwrap_or("<not text>"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// An HTTP client with a connection pool, as real clients have.
#[derive(Clone, Debug)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Every answer must come over this version.
    version: Version,
}

impl Default for TestClient {
    fn default() -> Self {
        Self { client: Client::builder(TokioExecutor::new()).build_http(), version: Version::HTTP_11 }
    }
}

/// Runs each named test body (an `async fn(TestClient)`) twice, as the tests
/// `NAME::http1` and `NAME::http2`: over HTTP/1.1 and over HTTP/2 with prior
/// knowledge (the proxy of [`PROXY_HEAD`] speaks both on one port).
#[macro_export]
macro_rules! over_http1_and_http2 {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn http1() {
                super::$name($crate::support::proxy::TestClient::default()).await;
            }

            #[tokio::test]
            async fn http2() {
                super::$name($crate::support::proxy::TestClient::h2c()).await;
            }
        }
    )+};
}

impl TestClient {
    /// A client that speaks HTTP/2 from the first byte (h2c with prior knowledge),
    /// its requests multiplexed on one connection.
    #[must_use]
    pub fn h2c() -> Self {
        Self { client: Client::builder(TokioExecutor::new()).http2_only(true).build_http(), version: Version::HTTP_2 }
    }

    pub async fn send(&self, request: Request<Full<Bytes>>) -> Reply {
        let start = Instant::now();
        let response = tokio::time::timeout(PATIENCE, self.client.request(request))
            .await
            .expect("no response in time")
            .expect("request failed");
        let (parts, body) = response.into_parts();
        assert_eq!(parts.version, self.version, "the answer's HTTP version");
        let body = body.collect().await.expect("response body").to_bytes();
        Reply { status: parts.status, headers: parts.headers, body, elapsed: start.elapsed() }
    }

    /// A request with these headers and body.
    pub async fn request(&self, method: Method, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        let mut builder = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        self.send(builder.body(Full::new(Bytes::copy_from_slice(body))).expect("test request")).await
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Reply {
        self.request(Method::GET, url, headers, b"").await
    }

    /// A request signed by `key` (its id and secret) at the wall clock's second, as
    /// README's "Signed requests" says, made unique by `nonce`; `headers` are sent
    /// too, unsigned.
    pub async fn signed(
        &self,
        method: Method,
        url: &str,
        (key_id, secret): (&str, &[u8]),
        nonce: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let uri: Uri = url.parse().expect("test URL");
        let timestamp = SystemClock.now().as_secs().to_string();
        let canonical = Canonical {
            method: method.as_str(),
            target: uri.path_and_query().map_or("/", |target| target.as_str()),
            timestamp: &timestamp,
            body_sha256: &sha256(body),
            nonce: Some(nonce),
            idempotency_key: None,
            host: None,
        };
        let signature = sign_hex(secret, &canonical.string_to_sign());
        let mut all =
            vec![("x-api-key", key_id), ("x-timestamp", &timestamp), ("x-nonce", nonce), ("x-signature", &signature)];
        all.extend_from_slice(headers);
        self.request(method, url, &all, body).await
    }

    /// A request to `addr` for the site `host`: over HTTP/1.1 in its `Host` header,
    /// over HTTP/2 as its `:authority`, as curl sends it (a `host` header naming
    /// another site than `:authority` is malformed, RFC 9113 §8.3.1).
    pub async fn request_to_host(
        &self,
        addr: SocketAddr,
        host: &str,
        method: Method,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        if self.version != Version::HTTP_2 {
            let with_host: Vec<(&str, &str)> = [("host", host)].into_iter().chain(headers.iter().copied()).collect();
            return self.request(method, &format!("http://{addr}{target}"), &with_host, body).await;
        }
        let tcp = TcpStream::connect(addr).await.expect("connect to proxy");
        let (mut send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.expect("h2 handshake");
        tokio::spawn(connection);
        let mut builder = Request::builder().method(method).uri(format!("http://{host}{target}"));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder.body(Full::new(Bytes::copy_from_slice(body))).expect("test request");
        let start = Instant::now();
        let response = tokio::time::timeout(PATIENCE, send.send_request(request))
            .await
            .expect("no response in time")
            .expect("request failed");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        Reply { status: parts.status, headers: parts.headers, body, elapsed: start.elapsed() }
    }
}

/// POSTs to each of `urls` at once, each from a client of its own (so on a connection
/// of its own), with `headers`; the statuses, in no particular order.
pub async fn posted_at_once(
    urls: impl IntoIterator<Item = String>,
    headers: &'static [(&'static str, &'static str)],
) -> Vec<StatusCode> {
    let mut tasks = tokio::task::JoinSet::new();
    for url in urls {
        tasks.spawn(async move { TestClient::default().request(Method::POST, &url, headers, b"").await.status });
    }
    tasks.join_all().await
}

/// A connection to `to` from `local` (any 127.0.0.0/8 address is this host's on
/// loopback).
pub async fn connect_from(local: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::from((local, 0))).expect("bind a loopback address");
    socket.connect(to).await.expect("connect")
}

/// Sends `bytes` on a connection from `local` and reads until the proxy closes it. A
/// connection refused before the bytes are read whole may be reset while they are
/// written.
pub async fn exchange_from(local: [u8; 4], to: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = connect_from(local, to).await;
    let _ = stream.write_all(bytes).await;
    read_to_close(&mut stream).await
}

/// Fails unless no escalation was asked for so far; `after` says after what.
pub fn assert_not_escalated(escalated: &mut mpsc::Receiver<Escalation>, after: &str) {
    assert_eq!(escalated.try_recv().map(|e| e.cidr), Err(mpsc::error::TryRecvError::Empty), "escalated after {after}");
}

/// A PROXY protocol v2 header a balancer sends for a TCP connection from `client` to
/// `to` (both of one family).
#[must_use]
pub fn proxy_v2_header(client: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let mut header = b"\r\n\r\n\0\r\nQUIT\n\x21".to_vec();
    let (family, mut addresses) = match (client.ip(), to.ip()) {
        (std::net::IpAddr::V4(from), std::net::IpAddr::V4(to)) => (0x11, [from.octets(), to.octets()].concat()),
        (std::net::IpAddr::V6(from), std::net::IpAddr::V6(to)) => (0x21, [from.octets(), to.octets()].concat()),
        _ => panic!("{client} and {to} are of different families"),
    };
    addresses.extend_from_slice(&client.port().to_be_bytes());
    addresses.extend_from_slice(&to.port().to_be_bytes());
    header.push(family);
    header.extend_from_slice(&u16::try_from(addresses.len()).expect("short").to_be_bytes());
    header.extend_from_slice(&addresses);
    header
}

/// A connection to `to` from a balancer on 127.0.0.1 that names `client` in a PROXY
/// v2 header, then sends `bytes`.
pub async fn proxied_from(client: SocketAddr, to: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = connect_from([127, 0, 0, 1], to).await;
    let destination = if client.is_ipv4() { to } else { SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, to.port())) };
    let mut sent = proxy_v2_header(client, destination);
    sent.extend_from_slice(bytes);
    // A connection refused at its header may be reset while the rest is written.
    let _ = stream.write_all(&sent).await;
    stream
}

/// Writes `bytes` on a fresh connection and reads until the proxy closes it.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect to proxy");
    stream.write_all(bytes).await.expect("write request");
    read_to_close(&mut stream).await
}

/// Everything the peer sends until it closes (a reset after the response counts as
/// a close: the response has been read by then).
pub async fn read_to_close(stream: &mut (impl AsyncRead + Unpin)) -> String {
    let mut received = Vec::new();
    let mut buf = [0; 8192];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await.expect("proxy did not close the connection") {
            Ok(0) | Err(_) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&received).into_owned()
}
