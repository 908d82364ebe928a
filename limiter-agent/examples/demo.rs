//! What `cargo xtask demo` runs: a small lab of namespaces, the agent on
//! `config/demo.toml`, a flood plus a well-behaved flow at the kernel layer with a
//! reload halfway, a flood from random (spoofed) sources before and after a
//! new-source budget is reloaded in, a reflection flood to closed ports once
//! `[xdp.services]` is reloaded in, then well- and badly-behaved clients at the
//! proxy, and pro's requests served ahead of free ones while the upstream is slow.
//! Cleans up on exit and on Ctrl-C.
//!
//! Usage (as root): demo LIMITER_BINARY CONFIG

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use limiter_core::{
    Clock as _, SystemClock,
    signature::{Canonical, sha256, sign_hex},
};
use limiter_lab::{netns::VethNamespace, traffic};

const NS: &str = "lim-demo";
const HOST_IF: &str = "lim-demo0";
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const FLOODER: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const POLITE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 3);
const SECRET: &str = "demo-secret-do-not-use";
const FLOOD: u64 = 20_000;
const POLITE_PACKETS: u64 = 50;

/// What Ctrl-C must undo: the namespace, the agent, its pins, the temp dir.
struct Cleanup {
    agent_pid: Option<u32>,
    dir: PathBuf,
    pin_dir: PathBuf,
}

static CLEANUP: Mutex<Option<Cleanup>> = Mutex::new(None);

/// The plans of the `/api/reports` requests, in the order the upstream received them.
static REPORTS_SEEN: Mutex<Vec<&str>> = Mutex::new(Vec::new());

/// Whether the upstream's slowdown is over: until then it holds every `/api/reports`
/// request, so that what waits in the proxy's queue is known, not a matter of timing.
static SLOWDOWN_OVER: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

fn cleanup() {
    let Some(state) = CLEANUP.lock().ok().and_then(|mut c| c.take()) else { return };
    if let Some(pid) = state.agent_pid {
        // SAFETY: kill(2) on the agent we started.
        unsafe { libc::kill(i32::try_from(pid).unwrap_or(0), libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = Command::new("ip").args(["link", "del", HOST_IF]).output();
    let _ = Command::new("ip").args(["netns", "del", NS]).output();
    let _ = limiter::xdp::detach_all(&state.pin_dir);
    let _ = std::fs::remove_dir_all(&state.dir);
}

/// Ctrl-C and SIGTERM clean up, then exit 130.
fn install_interrupt_cleanup() {
    std::thread::spawn(|| {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
                return;
            };
            tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
        });
        eprintln!("\ninterrupted: cleaning up");
        cleanup();
        std::process::exit(130);
    });
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let limiter = PathBuf::from(args.next().context("usage: demo LIMITER_BINARY CONFIG")?);
    let config_source = PathBuf::from(args.next().context("usage: demo LIMITER_BINARY CONFIG")?);
    let dir = std::env::temp_dir().join("limiter-demo");
    std::fs::create_dir_all(&dir)?;
    let pin_dir = limiter::config::Config::load(&config_source)?.agent.pin_dir;
    // Counters from an earlier run would muddle the table.
    limiter::xdp::detach_all(&pin_dir)?;
    *CLEANUP.lock().map_err(|_| anyhow::anyhow!("lock"))? =
        Some(Cleanup { agent_pid: None, dir: dir.clone(), pin_dir });
    install_interrupt_cleanup();
    let result = run(&limiter, &config_source, &dir);
    cleanup();
    result
}

fn run(limiter: &Path, config_source: &Path, dir: &Path) -> anyhow::Result<()> {
    let config_text = std::fs::read_to_string(config_source)?;
    let config_path = dir.join("limiter.toml");
    std::fs::write(&config_path, &config_text)?;

    println!("== lab: namespace {NS} ({FLOODER} floods, {POLITE} behaves) behind veth {HOST_IF} ({HOST_IP})");
    let _lab = VethNamespace::new(
        NS,
        HOST_IF,
        "eth0",
        &format!("{HOST_IP}/24"),
        &[&format!("{FLOODER}/24"), &format!("{POLITE}/24")],
    )?;
    let upstream = spawn_upstream()?;
    let mut agent = start_agent(limiter, &config_path, dir)?;

    println!("\n== kernel layer: {FLOOD} UDP packets in ~1 s from {FLOODER}, {POLITE_PACKETS} at 50/s from {POLITE}");
    let before = kernel_phase()?;
    let reloaded = config_text.replace("packets_per_second = 1_000", "packets_per_second = 250");
    std::fs::write(&config_path, &reloaded)?;
    let output = Command::new(limiter).args(["reload", "-c"]).arg(&config_path).output()?;
    println!("\n$ limiter reload   # xdp.limit 1000 -> 250 packets/s, while nothing restarts");
    print!("{}", String::from_utf8_lossy(&output.stdout));
    let after = kernel_phase()?;
    println!("\n{:<24} {:>10} {:>10} {:>10} {:>14}", "", "flood sent", "passed", "dropped", "polite passed");
    for (label, row) in [("limit 1000/s, burst 200", before), ("limit 250/s (reloaded)", after)] {
        println!("{label:<24} {:>10} {:>10} {:>10} {:>11}/{POLITE_PACKETS}", FLOOD, row.0, FLOOD - row.0, row.1);
    }

    let budgeted = spoofed_phases(limiter, &config_path, &reloaded)?;
    reflection_phase(limiter, &config_path, &budgeted)?;

    println!("\n== application layer: proxy 127.0.0.1:18080 -> upstream {upstream}");
    proxy_phase()?;
    slowdown_phase(limiter, &config_path)?;

    println!("\n$ limiter stats");
    let output = Command::new(limiter).args(["stats", "-c"]).arg(&config_path).output()?;
    print!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));

    println!("\n$ limiter suggest --interval 1   # limits from what the agent saw");
    let output = Command::new(limiter).args(["suggest", "--interval", "1", "-c"]).arg(&config_path).output()?;
    print!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));

    println!("\n$ limiter explain --method POST --path /login --ip 127.0.0.1   # why the 6th login got 429");
    let output = Command::new(limiter)
        .args(["explain", "--method", "POST", "--path", "/login", "--ip", "127.0.0.1", "-c"])
        .arg(&config_path)
        .output()?;
    print!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    // A clean stop: with keep_attached_on_exit = false the agent detaches itself.
    // SAFETY: kill(2) on the agent we started.
    unsafe { libc::kill(i32::try_from(agent.id()).unwrap_or(0), libc::SIGTERM) };
    agent.wait()?;
    if let Ok(mut cleanup) = CLEANUP.lock()
        && let Some(state) = cleanup.as_mut()
    {
        state.agent_pid = None;
    }
    Ok(())
}

fn start_agent(limiter: &Path, config: &Path, dir: &Path) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("agent.log"))?;
    let mut child = Command::new(limiter)
        .args(["run", "-c"])
        .arg(config)
        .env("LIMITER_DEMO_SECRET", SECRET)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    if let Ok(mut cleanup) = CLEANUP.lock()
        && let Some(state) = cleanup.as_mut()
    {
        state.agent_pid = Some(child.id());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect("127.0.0.1:18080").is_err() {
        if child.try_wait()?.is_some() || Instant::now() > deadline {
            anyhow::bail!("the agent did not start:\n{}", std::fs::read_to_string(dir.join("agent.log"))?);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(dir.join("agent.log"))?;
    if let Some(line) = log.lines().find(|l| l.contains("XDP attached")) {
        println!("agent: {}", line.split_once("INFO").map_or(line, |(_, rest)| rest).trim());
    }
    Ok(child)
}

/// Floods and trickles once; (flood packets passed, polite packets passed).
fn kernel_phase() -> anyhow::Result<(u64, u64)> {
    let receiver = traffic::Receiver::bind(HOST_IP)?;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let flood = scope.spawn(|| traffic::send(NS, FLOODER, receiver.addr, FLOOD, 200));
        let polite = scope.spawn(|| traffic::send(NS, POLITE, receiver.addr, POLITE_PACKETS, 1));
        flood.join().map_err(|_| anyhow::anyhow!("flood thread"))??;
        polite.join().map_err(|_| anyhow::anyhow!("polite thread"))??;
        Ok(())
    })?;
    receiver.settle(Duration::from_millis(200));
    Ok((receiver.from(FLOODER).len() as u64, receiver.from(POLITE).len() as u64))
}

/// A random-source flood without, then with, a new-source budget; the config text
/// reloaded.
fn spoofed_phases(limiter: &Path, config_path: &Path, config_text: &str) -> anyhow::Result<String> {
    // Replies to spoofed sources would leave by the host's default route: strict
    // reverse-path filtering on the lab's link drops what the program passes from
    // sources not routed back through it, before the stack answers.
    std::fs::write(format!("/proc/sys/net/ipv4/conf/{HOST_IF}/rp_filter"), "1")?;
    println!(
        "\n== spoofed flood: {SPOOFED} UDP packets from random sources (hping3 --rand-source), \
         {POLITE_PACKETS} at 50/s from {POLITE}"
    );
    let before = spoofed_phase()?;
    let budget = "\n[xdp.new_sources]\npackets_per_second = 100\nburst = 100\n";
    let reloaded = config_text.replace("[proxy]\n", &format!("{budget}\n[proxy]\n"));
    // A new file, which the agent adopts: an edit of the watched one could be picked
    // up by its watcher first, leaving this reload "no changes" to print.
    let budget_path = config_path.with_file_name("limiter-budget.toml");
    std::fs::write(&budget_path, &reloaded)?;
    let output = Command::new(limiter).args(["reload", "-c"]).arg(&budget_path).output()?;
    println!("\n$ limiter reload   # [xdp.new_sources] 100 packets/s, burst 100");
    print!("{}", String::from_utf8_lossy(&output.stdout));
    let after = spoofed_phase()?;
    println!("\n{:<24} {:>10} {:>12} {:>14} {:>14}", "", "admitted", "new buckets", "refused unseen", "polite passed");
    for (label, row) in [("per-source buckets only", before), ("new-source budget 100/s", after)] {
        println!(
            "{label:<24} {:>10} {:>12} {:>14} {:>11}/{POLITE_PACKETS}",
            row.admitted, row.new, row.refused, row.polite
        );
    }
    Ok(reloaded)
}

const REFLECTED: u64 = 20_000;

/// A DNS reflection (UDP from port 53 to one closed port after another, hping3) once
/// `[xdp.services]` serves only the polite flow's UDP port, with the polite flow
/// beside it.
fn reflection_phase(limiter: &Path, config_path: &Path, config_text: &str) -> anyhow::Result<()> {
    use limiter_common::counters::Counter;
    let receiver = traffic::Receiver::bind(HOST_IP)?;
    let services = format!("\n[xdp.services]\ntcp = [22, 18080]\nudp = [{}]\n", receiver.addr.port());
    let reloaded = config_text.replace("[proxy]\n", &format!("{services}\n[proxy]\n"));
    let services_path = config_path.with_file_name("limiter-services.toml");
    std::fs::write(&services_path, reloaded)?;
    println!(
        "\n== reflection flood: {REFLECTED} UDP packets from {FLOODER} port 53 to closed ports 1024 and up \
         (hping3 -s 53 -p ++1024), {POLITE_PACKETS} at 50/s from {POLITE} to port {}",
        receiver.addr.port()
    );
    let output = Command::new(limiter).args(["reload", "-c"]).arg(&services_path).output()?;
    println!("\n$ limiter reload   # [xdp.services] tcp = [22, 18080], udp = [{}]", receiver.addr.port());
    print!("{}", String::from_utf8_lossy(&output.stdout));
    let pin_dir = CLEANUP.lock().ok().and_then(|c| c.as_ref().map(|c| c.pin_dir.clone())).context("pin dir")?;
    let counters = || limiter::xdp::KernelMaps::open_pinned(&pin_dir).and_then(|m| m.counter_snapshot());
    let start = counters()?;
    // Ports 1024 to 21023: below the ephemeral range the polite flow's served port is
    // taken from, so that no packet of the flood is to a port served.
    let flooder = FLOODER.to_string();
    flood_beside_polite(&receiver, &["-s", "53", "-k", "-p", "++1024", "-a", &flooder], REFLECTED)?;
    let dropped = counters()?.get(Counter::DroppedService) - start.get(Counter::DroppedService);
    println!("\n{:<24} {:>10} {:>30} {:>14}", "", "sent", "dropped at the NIC (service)", "polite passed");
    println!(
        "{:<24} {REFLECTED:>10} {dropped:>30} {:>11}/{POLITE_PACKETS}",
        "reflection to closed ports",
        receiver.from(POLITE).len()
    );
    Ok(())
}

/// `count` UDP packets from hping3 in the namespace with `hping3_args`, one each
/// 20 µs, while the polite flow sends its packets to `receiver`; returns once both are
/// done and the receiver has settled.
fn flood_beside_polite(receiver: &traffic::Receiver, hping3_args: &[&str], count: u64) -> anyhow::Result<()> {
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let polite = scope.spawn(|| traffic::send(NS, POLITE, receiver.addr, POLITE_PACKETS, 1));
        let flood = Command::new("ip")
            .args(["netns", "exec", NS, "timeout", "30", "hping3", "-q", "--udp"])
            .args(hping3_args)
            .args(["-c", &count.to_string(), "-i", "u20", &HOST_IP.to_string()])
            .output()
            .context("hping3 (cargo xtask setup installs it)")?;
        anyhow::ensure!(
            flood.status.code().is_some_and(|c| c <= 1),
            "hping3: {}",
            String::from_utf8_lossy(&flood.stderr)
        );
        polite.join().map_err(|_| anyhow::anyhow!("polite thread"))??;
        Ok(())
    })?;
    receiver.settle(Duration::from_millis(200));
    Ok(())
}

const SPOOFED: u64 = 20_000;

struct SpoofedRow {
    admitted: u64,
    new: u64,
    refused: u64,
    polite: u64,
}

/// One random-source flood with the polite flow beside it, read from the counters.
fn spoofed_phase() -> anyhow::Result<SpoofedRow> {
    use limiter_common::counters::Counter;
    let pin_dir = CLEANUP.lock().ok().and_then(|c| c.as_ref().map(|c| c.pin_dir.clone())).context("pin dir")?;
    let counters = || limiter::xdp::KernelMaps::open_pinned(&pin_dir).and_then(|m| m.counter_snapshot());
    let receiver = traffic::Receiver::bind(HOST_IP)?;
    let start = counters()?;
    flood_beside_polite(&receiver, &["-p", "9", "--rand-source"], SPOOFED)?;
    let end = counters()?;
    let delta = |c: Counter| end.get(c) - start.get(c);
    let polite = receiver.from(POLITE).len() as u64;
    Ok(SpoofedRow {
        admitted: delta(Counter::Passed).saturating_sub(delta(Counter::NonIp) + polite),
        new: delta(Counter::NewSources),
        refused: delta(Counter::DroppedNewSource),
        polite,
    })
}

/// A minimal upstream answering 200 to everything, on 127.0.0.1:18081; slow on
/// `/api/reports` until the slowdown is over.
fn spawn_upstream() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:18081")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = [0u8; 65_536];
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let read = stream.read(&mut buffer).unwrap_or(0);
                let head = String::from_utf8_lossy(&buffer[..read]);
                if head.split(' ').nth(1).is_some_and(|target| target.starts_with("/api/reports")) {
                    let plan = if header(&head, "x-api-key") == "k-pro" { "pro" } else { "free" };
                    REPORTS_SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(plan);
                    let (over, changed) = &SLOWDOWN_OVER;
                    let over = over.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    drop(changed.wait_while(over, |over| !*over));
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n");
            });
        }
    });
    Ok(addr)
}

/// `[proxy.upstream_capacity]` in the running agent's stats: requests waiting for it.
fn upstream_queued(limiter: &Path, config: &Path) -> anyhow::Result<u64> {
    let output = Command::new(limiter).args(["stats", "--json", "-c"]).arg(config).output()?;
    let stats: serde_json::Value = serde_json::from_slice(&output.stdout).context("limiter stats --json")?;
    stats["proxy"]["upstream_queued"].as_u64().context("proxy.upstream_queued in limiter stats --json")
}

/// Polls the agent until `count` requests wait for the upstream.
fn wait_until_queued(limiter: &Path, config: &Path, count: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream_queued(limiter, config)? != count {
        anyhow::ensure!(Instant::now() < deadline, "{count} requests never waited for the upstream");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The upstream slows down (it holds every report) and takes one request at a time
/// (`[proxy.upstream_capacity]`: one at a time, so that the order it sees them in is
/// the order the proxy let them in): 10 free requests take the place and queue, 3 pro
/// requests come after them, and once it recovers the upstream sees pro's first.
fn slowdown_phase(limiter: &Path, config: &Path) -> anyhow::Result<()> {
    let free: Vec<_> = (0..10)
        .map(|_| std::thread::spawn(|| request("GET", "/api/reports", &[("x-api-key", "k-free".to_owned())], "")))
        .collect();
    wait_until_queued(limiter, config, 9)?;
    let pro: Vec<_> = (0..3)
        .map(|n| {
            let headers = signed("/api/reports", "", &format!("report-{n}"));
            std::thread::spawn(move || request("POST", "/api/reports", &headers, ""))
        })
        .collect();
    wait_until_queued(limiter, config, 12)?;
    let (over, changed) = &SLOWDOWN_OVER;
    *over.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
    changed.notify_all();
    let mut statuses = Vec::new();
    for request in free.into_iter().chain(pro) {
        statuses.push(request.join().map_err(|_| anyhow::anyhow!("a report request panicked"))??.0);
    }
    let seen = REPORTS_SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).join(" ");
    println!(
        "upstream slowdown, one at a time: 10 free reports, then 3 pro while 9 free wait; the upstream saw: {seen}"
    );
    println!("  answers: {} of 13 with 200", statuses.iter().filter(|&&status| status == 200).count());
    Ok(())
}

/// One request through the proxy from 127.0.0.1; (status, headers text).
fn request(method: &str, target: &str, headers: &[(&str, String)], body: &str) -> anyhow::Result<(u16, String)> {
    request_from(Ipv4Addr::LOCALHOST, method, target, headers, body)
}

/// One request through the proxy from `from` (any address of 127.0.0.0/8 is this
/// host's, so each is a client of its own to the proxy).
fn request_from(
    from: Ipv4Addr,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let mut stream = runtime.block_on(socket.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 18080))))?.into_std()?;
    stream.set_nonblocking(false)?;
    let mut text =
        format!("{method} {target} HTTP/1.1\r\nhost: demo\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        text += &format!("{name}: {value}\r\n");
    }
    text += "\r\n";
    text += body;
    stream.write_all(text.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((status, response))
}

fn header<'a>(response: &'a str, name: &str) -> &'a str {
    response
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
        .unwrap_or("-")
}

fn signed(target: &str, body: &str, nonce: &str) -> Vec<(&'static str, String)> {
    let timestamp = SystemClock.now().as_secs().to_string();
    let canonical = Canonical {
        method: "POST",
        target,
        timestamp: &timestamp,
        body_sha256: &sha256(body.as_bytes()),
        nonce: Some(nonce),
        idempotency_key: None,
        host: None,
    };
    let signature = sign_hex(SECRET.as_bytes(), &canonical.string_to_sign());
    vec![
        ("x-api-key", "k-pro".to_owned()),
        ("x-timestamp", timestamp),
        ("x-signature", signature),
        ("x-nonce", nonce.to_owned()),
    ]
}

fn proxy_phase() -> anyhow::Result<()> {
    let key = [("x-api-key", "k-demo".to_owned())];
    let (mut fast, mut throttled, mut rejected) = (0, 0, 0);
    let mut last_reject = String::new();
    for _ in 0..105 {
        let started = Instant::now();
        let (status, response) = request("GET", "/api/items", &key, "")?;
        match status {
            429 => {
                rejected += 1;
                last_reject = response;
            }
            _ if started.elapsed() >= Duration::from_millis(50) => throttled += 1,
            _ => fast += 1,
        }
    }
    println!("free plan (100/min, delay band from 80), 105 requests at once:");
    println!(
        "  {fast} forwarded at once, {throttled} forwarded after the 50 ms throttle delay, {rejected} rejected (429)"
    );
    println!(
        "  last 429: Retry-After: {}, RateLimit: {}, X-RateLimit-Remaining: {}",
        header(&last_reject, "retry-after"),
        header(&last_reject, "ratelimit"),
        header(&last_reject, "x-ratelimit-remaining")
    );

    let statuses: Vec<u16> = (0..7)
        .map(|_| request("POST", "/login", &[], "user=demo&password=guess").map(|r| r.0))
        .collect::<Result<_, _>>()?;
    println!("POST /login 7 times from one IP (limit 5/min): {statuses:?}");
    let get = request("GET", "/login", &[], "")?.0;
    println!("GET /login from the same IP: {get}");

    // A botnet's credential stuffing: one account, one attempt per address, so the
    // per-IP rule never fires; the per-username rule (10 an hour) does.
    let json = [("content-type", "application/json".to_owned())];
    let login = |user: &str, n: u8| {
        let body = format!(r#"{{"username":"{user}","password":"guess-{n}"}}"#);
        request_from(Ipv4Addr::new(127, 0, 0, 10 + n), "POST", "/login", &json, &body).map(|r| r.0)
    };
    let stuffed: Vec<u16> =
        (0..12).map(|n| login(if n == 11 { "ALICE" } else { "alice" }, n)).collect::<Result<_, _>>()?;
    let bob = login("bob", 30)?;
    println!(
        "POST /login as alice from 12 addresses, one each (10/h per username, case folded): {stuffed:?}; bob: {bob}"
    );

    let body = r#"{"to":"acct-42","amount":100}"#;
    let headers = signed("/api/transfer", body, "n-1");
    let valid = request("POST", "/api/transfer", &headers, body)?.0;
    let replay = request("POST", "/api/transfer", &headers, body)?.0;
    let tampered =
        request("POST", "/api/transfer", &signed("/api/transfer", body, "n-2"), &body.replace("100", "900"))?.0;
    println!(
        "signed POST /api/transfer: valid {valid}, same request again (replay) {replay}, body changed after signing {tampered}"
    );
    let scanner = request("GET", "/api/items", &[("user-agent", "sqlmap/1.7.2#stable".to_owned())], "")?.0;
    println!("GET /api/items as sqlmap: {scanner} (deny rule scanner-user-agents)");
    Ok(())
}
