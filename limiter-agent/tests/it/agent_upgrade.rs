//! Upgrades and stops through the real binary: `limiter upgrade` hands the sockets to
//! the binary on disk without refusing a connection, a new binary that cannot start
//! leaves the old one serving, SIGTERM drains HTTP/1.1, HTTP/2 and tunnels within
//! `drain_timeout`, and socket activation (`LISTEN_FDS`, as systemd passes it) serves
//! what waited in the socket's queue.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    process::{Child, ChildStdout, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use limiter_common::counters::Counter;
use limiter_lab::{
    support::{
        agent::{AgentProcess, agent_section, limiter_bin},
        proxy::Upstream,
        python, unique,
        wait::PATIENCE,
        xdp_lab::XdpLab,
    },
    traffic,
};

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr")
}

fn proxy_section(listen: SocketAddr, upstream: SocketAddr) -> String {
    format!("[proxy]\nlisten = \"{listen}\"\nupstream = \"http://{upstream}\"\n")
}

/// One request on a connection of its own; the response as text.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(PATIENCE))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// A client opening a new connection every few milliseconds until stopped,
/// counting answers that were 200 and everything else (a refused connection, a
/// reset, another status).
struct Churn {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Churn {
    fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let (stopping, counting) = (Arc::clone(&stop), Arc::clone(&ok));
        let thread = std::thread::spawn(move || {
            let mut failures = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                match get(addr, "/churn") {
                    Ok(response) if response.starts_with("HTTP/1.1 200") => {
                        counting.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(response) => failures.push(response.lines().next().unwrap_or_default().to_owned()),
                    Err(error) => failures.push(error.to_string()),
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            failures
        });
        Self { stop, ok, thread }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// The failures seen.
    fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("churn thread")
    }
}

/// Through `limiter upgrade` with the kernel layer and the proxy: a client
/// connecting every few milliseconds meets no refusal and no error, a slow request
/// started before completes with 200 (told to close its connection), the new agent
/// reuses the pinned link and the kernel's counters go on from where they were.
#[test]
fn an_upgrade_refuses_no_connection_and_the_kernel_counters_go_on() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = runtime.block_on(Upstream::start());
    let listen = free_addr();
    let xdp = format!("[xdp.limit]\npackets_per_second = 500\nburst = 50\n{}", proxy_section(listen, upstream.addr));
    let mut lab = XdpLab::start(1, "drain_timeout = \"10s\"", &xdp);
    let source = lab.sources[0];
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    traffic::send(&lab.net.ns, source, receiver.addr, 1_000, 200).expect("send");
    lab.agent.until("the kernel to count the flood", || lab.agent.counter(Counter::DroppedRateLimit), |n| *n > 0);
    let dropped_before = lab.agent.counter(Counter::DroppedRateLimit);

    let churn = Churn::start(listen);
    lab.agent.until("the churn to be served", || churn.ok(), |n| *n >= 20);
    let slow = std::thread::spawn(move || get(listen, "/slow?delay_ms=1500"));
    lab.agent.until(
        "the slow request to reach the upstream",
        || upstream.seen().iter().any(|seen| seen.uri.path() == "/slow"),
        |arrived| *arrived,
    );
    let before_upgrade = churn.ok();
    let (output, old_exit) = lab.agent.upgrade();
    assert!(output.status.success(), "upgrade: {}\n{}", String::from_utf8_lossy(&output.stderr), lab.agent.log());
    assert_eq!(old_exit.and_then(|s| s.code()), Some(0), "the old agent drains and exits 0: {}", lab.agent.log());
    let slow = slow.join().expect("slow thread").expect("the slow request's answer");
    assert!(slow.starts_with("HTTP/1.1 200"), "{slow}");
    assert!(slow.to_ascii_lowercase().contains("connection: close"), "a drain closes keep-alive: {slow}");
    // The new agent alone serves now, for a while.
    let after_exit = churn.ok();
    lab.agent.until("the new agent to serve the churn", || churn.ok(), |n| *n >= after_exit + 20);
    let failures = churn.stop();
    assert!(failures.is_empty(), "{} failed across the upgrade: {failures:?}", failures.len());
    assert!(after_exit > before_upgrade, "the churn went on during the hand-over");

    let log = lab.agent.log();
    assert!(log.contains("inherited=true"), "the new agent serves on the inherited socket: {log}");
    let attached = limiter::xdp::attached(&lab.agent.pin_dir).expect("attached");
    assert_eq!(attached.len(), 1, "one link, reused: {attached:?}");
    assert!(lab.agent.counter(Counter::DroppedRateLimit) >= dropped_before, "the counters must not reset");
    traffic::send(&lab.net.ns, source, receiver.addr, 1_000, 200).expect("send");
    lab.agent.until(
        "the new agent's program to drop the next flood",
        || lab.agent.counter(Counter::DroppedRateLimit),
        |n| *n > dropped_before,
    );
    let stats = lab.agent.cli_json(&["stats", "--json"]);
    assert!(stats["proxy"]["requests"].as_u64().is_some(), "the new agent answers its admin socket: {stats}");
}

/// The binary under test at `path`: a hard link where it can be, since a copy is
/// open for writing for a moment, and a process another test forks meanwhile would
/// hold it so (exec would fail with ETXTBSY).
fn place_binary(path: &std::path::Path) {
    if std::fs::hard_link(limiter_bin(), path).is_err() {
        std::fs::copy(limiter_bin(), path).expect("copy the binary");
    }
}

/// A script in the binary's place that exits 3: the upgrade says so, with what it
/// wrote to stderr, and fails, and the old agent serves on; then the real binary on a config it refuses: the
/// upgrade names the key and line.
#[test]
fn a_new_binary_that_fails_to_start_leaves_the_old_one_serving() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = runtime.block_on(Upstream::start());
    let name = unique("upg-fail");
    let dir = AgentProcess::dir_of(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let bin = dir.join("limiter");
    place_binary(&bin);
    let listen = free_addr();
    let config = format!("{}{}", agent_section(&name, ""), proxy_section(listen, upstream.addr));
    let mut agent = AgentProcess::start_with(&name, &config, bin.clone(), |_| {});

    // Replaced as a package upgrade replaces it: a new file renamed into place.
    let broken = dir.join("limiter.new");
    std::fs::write(&broken, "#!/bin/sh\necho 'cannot start' >&2\nexit 3\n").expect("script");
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    std::fs::rename(&broken, &bin).expect("replace");
    let (output, old_exit) = agent.upgrade();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(old_exit.is_none());
    assert!(stderr.contains("exit status: 3") && stderr.contains("this agent serves on"), "{stderr}");
    assert!(stderr.contains("its last lines: cannot start"), "the script's stderr is reported: {stderr}");
    assert!(agent.log().contains("cannot start"), "and is in the agent's log too: {}", agent.log());
    assert!(get(listen, "/").expect("the old agent serves").starts_with("HTTP/1.1 200"));

    place_binary(&dir.join("limiter.real"));
    std::fs::rename(dir.join("limiter.real"), &bin).expect("restore");
    agent.write_config(&format!("{config}bogus_key = 1\n"));
    let (output, _) = agent.upgrade();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let line = config.lines().count() + 1;
    assert!(stderr.contains(&format!("limiter.toml:{line}: proxy.bogus_key")), "{stderr}");
    assert!(get(listen, "/").expect("the old agent serves").starts_with("HTTP/1.1 200"));
    // The CLI reads the file too.
    agent.write_config(&config);
    let stats = agent.cli_json(&["stats", "--json"]);
    assert!(stats["proxy"].is_object(), "{stats}");
    assert!(agent.child.as_mut().expect("the old agent").try_wait().expect("status").is_none(), "it runs on");
}

/// An upstream answering `/slow` after a second, and a WebSocket handshake with 101
/// (holding the tunnel open, saying nothing); it prints `slow` or `tunnel` as each
/// arrives, and its port first.
const UPSTREAM: &str = r#"
import asyncio, base64, hashlib
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
async def handle(reader, writer):
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    headers = {}
    for line in head.split("\r\n")[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    if headers.get("upgrade", "").lower() == "websocket":
        digest = hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()
        accept = base64.b64encode(digest).decode()
        writer.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
        await writer.drain()
        print("tunnel", flush=True)
        while await reader.read(4096):
            pass
        return
    print("slow", flush=True)
    await asyncio.sleep(1)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"#;

/// Opens a WebSocket, prints `open`, then `closed` once the proxy closes it.
const TUNNEL: &str = r#"
import asyncio, sys, websockets
async def main():
    ws = await websockets.connect(sys.argv[1], ping_interval=None, open_timeout=10)
    print("open", flush=True)
    await ws.wait_closed()
    print("closed", flush=True)
asyncio.run(main())
"#;

/// A Python script whose stdout is read line by line.
struct Lines {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Lines {
    fn python(script: &str, args: &[&str]) -> Self {
        let mut child = Command::new(python())
            .arg("-c")
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 with websockets (cargo xtask setup installs it)");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The next line, within a generous wait.
    fn line(&mut self) -> String {
        self.lines.recv_timeout(PATIENCE * 2).unwrap_or_else(|error| panic!("no line from the script: {error}"))
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGTERM with an HTTP/1.1 request, an HTTP/2 stream and a WebSocket tunnel open:
/// the two requests complete (the HTTP/1.1 one told to close), the tunnel is cut
/// at `drain_timeout` and counted, and the agent exits 0.
#[test]
fn sigterm_finishes_requests_and_cuts_the_tunnel_at_drain_timeout() {
    let mut upstream = Lines::python(UPSTREAM, &[]);
    let port: u16 = upstream.line().parse().expect("the upstream's port");
    let name = unique("upg-drain");
    let listen = free_addr();
    let config = format!(
        "{}{}[proxy.http2]\nh2c = true\n",
        agent_section(&name, "drain_timeout = \"2s\""),
        proxy_section(listen, SocketAddr::from(([127, 0, 0, 1], port)))
    );
    let mut agent = AgentProcess::start(&name, &config);
    let mut tunnel = Lines::python(TUNNEL, &[&format!("ws://{listen}/ws")]);
    assert_eq!(tunnel.line(), "open");
    assert_eq!(upstream.line(), "tunnel");
    let curl = |args: &[&str]| {
        Command::new("curl")
            .args(["-s", "-i", "--max-time", "20"])
            .args(args)
            .arg(format!("http://{listen}/slow"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl")
    };
    let http1 = curl(&["--http1.1"]);
    let http2 = curl(&["--http2-prior-knowledge"]);
    assert_eq!((upstream.line(), upstream.line()), ("slow".to_owned(), "slow".to_owned()));

    let pid = i32::try_from(agent.child.as_ref().expect("agent").id()).expect("pid");
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let signalled = Instant::now();
    let http1 = String::from_utf8(http1.wait_with_output().expect("curl").stdout).expect("utf-8");
    let http2 = String::from_utf8(http2.wait_with_output().expect("curl").stdout).expect("utf-8");
    assert!(http1.starts_with("HTTP/1.1 200"), "{http1}");
    assert!(http1.to_ascii_lowercase().contains("connection: close"), "{http1}");
    assert!(http2.starts_with("HTTP/2 200"), "{http2}");
    assert_eq!(tunnel.line(), "closed");
    let open_for = signalled.elapsed();
    assert!(open_for >= Duration::from_millis(1_900), "the tunnel was cut after {open_for:?}, before drain_timeout");
    let status = agent.child.take().expect("agent").wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    let log = agent.log();
    assert!(log.contains("drain_cut=1"), "the tunnel is counted as cut: {log}");
}

/// Socket activation as systemd does it: the listening socket is bound before the
/// agent starts and passed as descriptor 3 (`LISTEN_FDS=1`, unnamed); a request
/// sent before the agent ran waited in its queue and is served.
#[test]
fn a_socket_passed_as_systemd_does_serves_what_waited_in_its_queue() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = runtime.block_on(Upstream::start());
    let name = unique("upg-sock");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let listen = listener.local_addr().expect("addr");
    let mut waiting = TcpStream::connect(listen).expect("queued connection");
    waiting.write_all(b"GET /early HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
    let config = format!("{}{}", agent_section(&name, ""), proxy_section(listen, upstream.addr));
    let fd = listener.as_raw_fd();
    let agent = AgentProcess::start_with(&name, &config, limiter_bin(), |command| {
        command.env("LISTEN_FDS", "1").env_remove("LISTEN_PID").env_remove("LISTEN_FDNAMES");
        // SAFETY: dup2 alone between fork and exec, as systemd hands descriptor 3.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                if libc::dup2(fd, 3) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    drop(listener);
    waiting.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let mut response = String::new();
    waiting.read_to_string(&mut response).expect("the queued request's answer");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(get(listen, "/").expect("served").starts_with("HTTP/1.1 200"));
    assert!(agent.log().contains("inherited=true"), "{}", agent.log());
}
