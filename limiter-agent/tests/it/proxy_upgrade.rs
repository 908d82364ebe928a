//! WebSockets through the proxy, with Python's `websockets` on both ends: the upgrade
//! is decided like any request (limits, signatures), the tunnel relays both ways,
//! closes when idle, and holds its place under `max_connections`.

use std::{process::Stdio, time::Duration};

use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, Upstream, raw_exchange},
    python,
    wait::PATIENCE,
};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

/// An echo server on an ephemeral port, which it prints once listening.
const ECHO_SERVER: &str = r#"
import asyncio, websockets
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with websockets.serve(echo, "127.0.0.1", 0) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()
asyncio.run(main())
"#;

/// Opens `count` WebSockets to `url` one after the other, each sending a message
/// and reading its echo, and prints one JSON line per connection: its echo, or the
/// status its handshake got. With `hold`, keeps the open ones until the proxy
/// closes them, printing "open" once all are up, then how long each stayed silent.
const CLIENT: &str = r#"
import asyncio, json, sys, time, websockets
url, count, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
async def main():
    held = []
    for n in range(count):
        try:
            ws = await websockets.connect(url, ping_interval=None, open_timeout=10)
        except websockets.exceptions.InvalidStatusCode as refused:
            print(json.dumps({"status": refused.status_code}), flush=True)
            continue
        await ws.send(f"hello {n}")
        print(json.dumps({"echo": await ws.recv()}), flush=True)
        if hold:
            held.append((ws, time.monotonic()))
        else:
            await ws.close()
    if hold:
        print("open", flush=True)
        for ws, since in held:
            try:
                await asyncio.wait_for(ws.recv(), 30)
            except websockets.exceptions.ConnectionClosed:
                print(json.dumps({"silent_for": time.monotonic() - since}), flush=True)
asyncio.run(main())
"#;

struct Script {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Script {
    /// Runs `script`; the echo server's stderr is dropped, where it logs every
    /// connection the proxy closes on purpose.
    fn start(script: &str, args: &[&str]) -> Self {
        let stderr = if script == ECHO_SERVER { Stdio::null() } else { Stdio::inherit() };
        let mut child = Command::new(python())
            .arg("-c")
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("python3 with websockets (cargo xtask setup installs it)");
        let stdout = child.stdout.take().expect("stdout");
        Self { child, lines: BufReader::new(stdout).lines() }
    }

    async fn line(&mut self) -> String {
        let line = tokio::time::timeout(PATIENCE * 3, self.lines.next_line()).await.expect("a line in time");
        line.expect("read").unwrap_or_else(|| panic!("the script ended early: {:?}", self.child.try_wait()))
    }

    async fn json(&mut self) -> serde_json::Value {
        let line = self.line().await;
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("{error}: {line}"))
    }
}

/// A config whose upstream is the echo server (not the recording upstream).
async fn echo_proxy(extra: &str) -> (Script, RunningProxy) {
    let mut server = Script::start(ECHO_SERVER, &[]);
    let port: u16 = server.line().await.parse().expect("the echo server's port");
    let echo = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    (server, RunningProxy::start(&format!("{PROXY_HEAD}{extra}"), echo).await)
}

fn ws_url(proxy: &RunningProxy, path: &str) -> String {
    format!("ws://{}{path}", proxy.addr)
}

const WS_LIMIT: &str = "[[proxy.rules]]\nname = \"ws\"\npath = \"/ws\"\nkey = \"ip\"\nlimit = 3\nwindow = \"1m\"\n";

#[tokio::test]
async fn messages_echo_through_the_proxy_and_the_upgrade_over_the_limit_gets_429() {
    let (_server, proxy) = echo_proxy(WS_LIMIT).await;
    let mut client = Script::start(CLIENT, &[&ws_url(&proxy, "/ws"), "4", "close"]);
    for n in 0..3 {
        assert_eq!(client.json().await, serde_json::json!({"echo": format!("hello {n}")}));
    }
    assert_eq!(client.json().await, serde_json::json!({"status": 429}));
    // A tunnel is counted once the upstream's side of it is open, after the client
    // has its 101.
    proxy.stats_until("three tunnels and a refusal", |stats| (stats.upgrades, stats.rejected) == (3, 1)).await;
}

/// What the upstream was asked to switch to, request by request.
fn upgrades_asked(upstream: &Upstream) -> Vec<Option<String>> {
    let asked = |headers: &http::HeaderMap| headers.get("upgrade").map(|v| v.to_str().expect("ascii").to_owned());
    upstream.seen().iter().map(|seen| asked(&seen.headers)).collect()
}

#[tokio::test]
async fn only_the_protocols_in_upgrade_protocols_are_asked_of_the_upstream() {
    let upgrade = |offered: &str| {
        format!("GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: {offered}\r\n\r\n")
    };
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    for offered in ["h2c", "foo/1, websocket", "WebSocket", "TLS/1.0"] {
        let answer = raw_exchange(proxy.addr, upgrade(offered).as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{offered}: {answer}");
    }
    let expected = [None, Some("websocket"), Some("WebSocket"), None].map(|p| p.map(str::to_owned));
    assert_eq!(upgrades_asked(&upstream), expected, "by default only websocket");

    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}upgrade_protocols = []\n"), upstream.addr).await;
    let answer = raw_exchange(proxy.addr, upgrade("websocket").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(upgrades_asked(&upstream), [None], "none allowed");
}

#[tokio::test]
async fn an_unsigned_upgrade_on_a_signed_route_gets_401() {
    let rule = "[[proxy.rules]]\nname = \"signed\"\npath = \"/ws\"\nrequire_signature = true\nkey = \"api_key\"\nlimit = 100\nwindow = \"1m\"\n";
    let (_server, proxy) = echo_proxy(rule).await;
    let mut client = Script::start(CLIENT, &[&ws_url(&proxy, "/ws"), "1", "close"]);
    assert_eq!(client.json().await, serde_json::json!({"status": 401}));
    assert_eq!(proxy.proxy.stats().upgrades, 0);
}

#[tokio::test]
async fn open_tunnels_hold_their_places_and_an_idle_one_is_closed() {
    let (_server, proxy) = echo_proxy("max_connections = 2\ntunnel_idle_timeout = \"1s\"\n").await;
    let mut client = Script::start(CLIENT, &[&ws_url(&proxy, "/ws"), "2", "hold"]);
    for n in 0..2 {
        assert_eq!(client.json().await, serde_json::json!({"echo": format!("hello {n}")}));
    }
    assert_eq!(client.line().await, "open");
    // Both places are the tunnels': a third connection is closed at accept.
    assert_eq!(raw_exchange(proxy.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await, "");
    proxy
        .stats_until("the third connection refused", |stats| stats.connections_refused_reasons["max_connections"] == 1)
        .await;
    for _ in 0..2 {
        let silent = client.json().await["silent_for"].as_f64().expect("seconds");
        // Counted by the client from its last read, a little after the proxy's last write.
        assert!((0.9..5.0).contains(&silent), "closed after {silent} s of silence; the timeout is 1 s");
    }
    // Closed, the tunnels give their places back (the echo server answers a plain GET).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while raw_exchange(proxy.addr, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the tunnels' places were not freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tunnel holds its place in flight under a rule's `concurrency` while open, not
/// only while its 101 is written.
#[tokio::test]
async fn an_open_tunnel_holds_its_unit_of_concurrency_until_it_closes() {
    let rule =
        "tunnel_idle_timeout = \"1s\"\n[[proxy.rules]]\nname = \"ws\"\npath = \"/ws\"\nkey = \"ip\"\nconcurrency = 1\n";
    let (_server, proxy) = echo_proxy(rule).await;
    let in_flight = |stats: &limiter::proxy::ProxyStats| {
        stats.policies.iter().find(|policy| policy.name == "ws").map(|policy| policy.inflight)
    };
    let mut client = Script::start(CLIENT, &[&ws_url(&proxy, "/ws"), "2", "hold"]);
    assert_eq!(client.json().await, serde_json::json!({"echo": "hello 0"}));
    assert_eq!(client.json().await, serde_json::json!({"status": 429}), "the first tunnel holds the unit");
    assert_eq!(client.line().await, "open");
    assert!(client.json().await["silent_for"].is_number(), "closed when idle");
    proxy.stats_until("the unit back once the tunnel closed", |stats| in_flight(stats) == Some(0)).await;
}
