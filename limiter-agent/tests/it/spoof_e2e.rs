//! Floods end to end: the agent (kernel layer and proxy) on two veths, a bounded
//! `hping3` flood (from random sources, or from one real address) from one
//! namespace, a calm UDP source in the same namespace and an HTTP client in the
//! other; and whom the proxy verifies. Needs root, hping3 and curl.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use limiter::xdp::{CounterSnapshot, KernelMaps, source_key};
use limiter_common::{counters::Counter, maps::BUDGET_SYN};
use limiter_lab::{
    netns::{VethNamespace, spawn_in_namespace},
    support::{
        agent::{AgentProcess, agent_section},
        proxy::Upstream,
        unique,
    },
    traffic,
};

/// Packets each flood sends: bounded in count, and in time by `FLOOD_TIMEOUT`.
const FLOOD: u64 = 40_000;
const FLOOD_TIMEOUT: &str = "30";
const BUDGET_RATE: u64 = 100;
const BUDGET_BURST: u64 = 100;
const SYN_RATE: u64 = 100;
const SYN_BURST: u64 = 100;
/// The sources map of the random-source flood's agent.
const MAX_SOURCES: u64 = 1024;

/// Two namespaces behind two veths, the agent attached to both host sides and its
/// proxy listening on the second.
struct Site {
    flood: VethNamespace,
    clients: VethNamespace,
    flood_host: Ipv4Addr,
    calm: Ipv4Addr,
    client: Ipv4Addr,
    proxy: SocketAddr,
    /// The agent's config text.
    config: String,
    agent: AgentProcess,
}

impl Site {
    /// The agent with the new-source budget, `xdp_keys` in `[xdp]` and the tables
    /// `xdp_extra` under it.
    fn start(upstream: SocketAddr, xdp_keys: &str, xdp_extra: &str) -> Self {
        let name = unique("spf");
        let net = 150 + u8::try_from(std::process::id() % 50).unwrap_or(0);
        static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        let subnet = 2 * NEXT.fetch_add(1, Ordering::Relaxed);
        let (flood_host, calm) = (Ipv4Addr::new(10, net, subnet, 1), Ipv4Addr::new(10, net, subnet, 2));
        let (client_host, client) = (Ipv4Addr::new(10, net, subnet + 1, 1), Ipv4Addr::new(10, net, subnet + 1, 2));
        let short = &name[..name.len().min(12)];
        let flood = VethNamespace::new(
            &name,
            &format!("{short}f"),
            "eth0",
            &format!("{flood_host}/24"),
            &[&format!("{calm}/24")],
        )
        .expect("flood namespace");
        let clients_ns = format!("{name}c");
        let clients = VethNamespace::new(
            &clients_ns,
            &format!("{short}c"),
            "eth0",
            &format!("{client_host}/24"),
            &[&format!("{client}/24")],
        )
        .expect("client namespace");
        let port = TcpListener::bind((client_host, 0)).and_then(|l| l.local_addr()).expect("free port").port();
        let proxy = SocketAddr::from((client_host, port));
        let config = format!(
            r#"{agent}
[xdp]
interfaces = ["{flood_if}", "{clients_if}"]
{xdp_keys}
[xdp.limit]
packets_per_second = 1000
burst = 1000
[xdp.new_sources]
packets_per_second = {BUDGET_RATE}
burst = {BUDGET_BURST}
{xdp_extra}

[proxy]
listen = "{proxy}"
upstream = "http://{upstream}"
"#,
            agent = agent_section(&name, "keep_attached_on_exit = false"),
            flood_if = flood.host_if,
            clients_if = clients.host_if,
        );
        let agent = AgentProcess::start(&name, &config);
        Self { flood, clients, flood_host, calm, client, proxy, config, agent }
    }

    fn maps(&self) -> KernelMaps {
        KernelMaps::open_pinned(&self.agent.pin_dir).expect("pinned maps")
    }

    /// Runs `hping3 args` in the flood namespace at the host's address on its link.
    fn flood(&self, args: &[&str]) -> Duration {
        self.flood_at(IpAddr::V4(self.flood_host), args)
    }

    /// Runs `hping3 args` in the flood namespace at `target`, bounded by `FLOOD`
    /// packets and `FLOOD_TIMEOUT` seconds; from the namespace's own address unless
    /// `args` ask for `--rand-source`.
    fn flood_at(&self, target: IpAddr, args: &[&str]) -> Duration {
        // Replies to spoofed sources would leave by the host's default route. Strict
        // reverse-path filtering on the lab's link drops every packet the program
        // passes from a source not routed back through it, before the stack can
        // answer; the strictest of `all` and the link's own value applies, so a host
        // set to loose (2) cannot be made safe here.
        let all = std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter").expect("rp_filter");
        assert_ne!(all.trim(), "2", "net.ipv4.conf.all.rp_filter = 2 would let replies to spoofed sources out");
        for interface in [&self.flood.host_if, &self.clients.host_if] {
            let path = format!("/proc/sys/net/ipv4/conf/{interface}/rp_filter");
            std::fs::write(&path, "1").expect("strict reverse-path filter");
        }
        let started = Instant::now();
        let count = FLOOD.to_string();
        let target = target.to_string();
        let output = self
            .flood
            .command("timeout")
            .args([FLOOD_TIMEOUT, "hping3", "-q", "-c", &count, "-i", "u20"])
            .args(args)
            .arg(&target)
            .output()
            .expect("run hping3 (cargo xtask setup installs it)");
        // hping3 exits 1 when nothing answers, which spoofed sources never do.
        assert!(
            output.status.code().is_some_and(|code| code <= 1),
            "hping3: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        started.elapsed()
    }
}

/// One GET through the proxy on a new connection (from the namespace's only
/// address); whether it got 200.
fn get(proxy: SocketAddr) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&proxy, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        stream.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        Ok(reply.starts_with("HTTP/1.1 200"))
    };
    attempt().unwrap_or(false)
}

/// Requests from the client namespace until `stop`; (successes, attempts).
fn keep_requesting(
    ns: &str,
    proxy: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<std::io::Result<(u64, u64)>> {
    keep_trying(ns, stop, Duration::from_millis(20), move || get(proxy))
}

/// TCP connections to the proxy from the client namespace until `stop`, each closed
/// without a request, slower than a source's share of the SYN budget;
/// (established, attempts).
fn keep_connecting(
    ns: &str,
    proxy: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<std::io::Result<(u64, u64)>> {
    let connect = move || TcpStream::connect_timeout(&proxy, Duration::from_secs(3)).is_ok();
    keep_trying(ns, stop, Duration::from_millis(150), connect)
}

/// `attempt` from namespace `ns` every `pause` until `stop`; (successes, attempts).
fn keep_trying(
    ns: &str,
    stop: Arc<AtomicBool>,
    pause: Duration,
    attempt: impl Fn() -> bool + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<(u64, u64)>> {
    spawn_in_namespace(ns, move || {
        let (mut ok, mut tried) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            tried += 1;
            ok += u64::from(attempt());
            std::thread::sleep(pause);
        }
        (ok, tried)
    })
}

/// Packets the program decided on, in `counters`.
fn verdicts(counters: &CounterSnapshot) -> u64 {
    [
        Counter::Passed,
        Counter::Allowed,
        Counter::DroppedRateLimit,
        Counter::DroppedDeny,
        Counter::DroppedMalformed,
        Counter::DroppedNewSource,
        Counter::DroppedAggregate,
        Counter::DroppedSyn,
        Counter::DroppedSynShare,
        Counter::DroppedV4Mapped,
        Counter::DroppedService,
        Counter::DroppedBytes,
    ]
    .iter()
    .map(|c| counters.get(*c))
    .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_random_source_flood_is_held_to_the_budget_while_known_and_verified_clients_are_served() {
    let upstream = Upstream::start().await;
    // Room for far fewer sources than the flood forges: without the budget its churn
    // would push the calm source and the client out of the map.
    let site = Site::start(
        upstream.addr,
        &format!("max_sources = {MAX_SOURCES}"),
        "[xdp.aggregate]\npackets_per_second = 2000\nburst = 2000\n",
    );
    let receiver = traffic::Receiver::bind(site.flood_host).expect("receiver");
    // Known before the flood: the calm source by its first datagrams, the client by
    // a request served (which also verifies it).
    traffic::send(&site.flood.ns, site.calm, receiver.addr, 5, 5).expect("calm source");
    let proxy = site.proxy;
    let first = spawn_in_namespace(&site.clients.ns, move || get(proxy));
    assert_eq!(first.join().expect("client").ok(), Some(true), "the first request");
    let maps = site.maps();
    let calm_key = source_key(IpAddr::V4(site.calm), 64);
    let client_key = source_key(IpAddr::V4(site.client), 64);
    assert!(maps.is_verified(&client_key), "the proxy marked its client verified");
    assert!(maps.source(&client_key).is_some(), "the client's handshake went through the program");
    // The program meets a datagram in the kernel's receive path, which may run after
    // the send returned.
    let calm_packets = || maps.source(&calm_key).map(|state| state.packets);
    site.agent.until("the program to meet the calm source's datagrams", calm_packets, |n| *n == Some(5));

    let before = maps.counter_snapshot().expect("counters");
    let seen_before = verdicts(&before);
    let calm_before = maps.source(&calm_key).expect("calm");
    let client_before = maps.source(&client_key).expect("client");
    const CALM: u64 = 100;
    let stop = Arc::new(AtomicBool::new(false));
    let requests = keep_requesting(&site.clients.ns, site.proxy, stop.clone());
    let (calm_sent, elapsed) = std::thread::scope(|scope| {
        let calm = scope.spawn(|| traffic::send(&site.flood.ns, site.calm, receiver.addr, CALM, 1).expect("calm"));
        let elapsed = site.flood(&["--rand-source", "--udp", "-p", "9"]);
        calm.join().expect("calm source");
        (CALM, elapsed)
    });
    stop.store(true, Ordering::Relaxed);
    let (ok, tried) = requests.join().expect("client thread").expect("namespace");
    site.agent.until("the program to meet every calm datagram", calm_packets, |n| *n == Some(5 + CALM));
    let calm_received = site.agent.until(
        "every calm datagram passed to arrive",
        || receiver.from(site.calm).len() as u64 - 5,
        |n| *n == calm_sent,
    );

    let after = maps.counter_snapshot().expect("counters");
    let delta = |c: Counter| after.get(c) - before.get(c);
    let calm_after = maps.source(&calm_key).expect("the calm source is still tracked");
    let client_after = maps.source(&client_key).expect("the client is still tracked");
    let admitted_from = |before: limiter_common::maps::SourceState, after: limiter_common::maps::SourceState| {
        (after.packets - after.dropped) - (before.packets - before.dropped)
    };
    // Every packet passed that neither the calm source nor the client sent, and that
    // is IP: the flood's share (plus the odd link-local packet of the namespaces).
    let admitted = delta(Counter::Passed)
        - delta(Counter::NonIp)
        - admitted_from(calm_before, calm_after)
        - admitted_from(client_before, client_after);
    let seen = verdicts(&after) - seen_before;
    let allowed = BUDGET_BURST + (elapsed.as_secs_f64() * BUDGET_RATE as f64).ceil() as u64 + 10;
    eprintln!(
        "flood: {admitted} of ~{FLOOD} admitted in {elapsed:?} ({} refused as new sources); calm source: \
         {calm_received} of {calm_sent}; HTTP client: {ok} of {tried}",
        delta(Counter::DroppedNewSource)
    );
    assert!(seen >= FLOOD * 9 / 10, "the flood did not reach the program: {seen} packets seen");
    assert!(admitted <= allowed, "{admitted} flood packets admitted, the budget allows {allowed}");
    assert_eq!(calm_received, calm_sent, "the calm source lost packets");
    assert!(tried >= 3 && ok * 100 >= tried * 99, "HTTP client: {ok} of {tried} requests succeeded");
    let stats = site.agent.cli_json(&["stats", "--json"]);
    let later = maps.counter_snapshot().expect("counters");
    let tracked = stats["xdp"]["sources"]["tracked"].as_u64().expect("tracked sources");
    assert!(tracked < MAX_SOURCES, "{tracked} sources tracked: the flood filled the map");
    // The flood's last packets may still be meeting the program: `limiter stats` shows
    // the kernel's count as it was between the two reads around it.
    let reported = stats["xdp"]["packets"]["dropped_new_source"].as_u64().expect("dropped_new_source");
    let (first_read, last_read) = (after.get(Counter::DroppedNewSource), later.get(Counter::DroppedNewSource));
    assert!((first_read..=last_read).contains(&reported), "{reported} not within {first_read}..={last_read}");
    assert_eq!(stats["xdp"]["new_sources"]["burst"].as_u64(), Some(BUDGET_BURST), "{stats}");
    assert!(stats["xdp"]["verified"]["tracked"].as_u64() >= Some(1), "{stats}");
}

/// SYNs from random sources at the proxy's own address and port, while a client the
/// proxy verified keeps connecting: the SYNs the stack is handed stay within the SYN
/// budget, and every one of the client's connects succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_syn_flood_from_random_sources_leaves_a_verified_client_connecting() {
    let upstream = Upstream::start().await;
    let site =
        Site::start(upstream.addr, "", &format!("[xdp.syn]\npackets_per_second = {SYN_RATE}\nburst = {SYN_BURST}\n"));
    let proxy = site.proxy;
    let first = spawn_in_namespace(&site.clients.ns, move || get(proxy));
    assert_eq!(first.join().expect("client").ok(), Some(true), "the first request");
    let maps = site.maps();
    let client_key = source_key(IpAddr::V4(site.client), 64);
    let before = maps.counter_snapshot().expect("counters");
    let (seen_before, client_before) = (verdicts(&before), maps.source(&client_key).expect("client").packets);
    let stop = Arc::new(AtomicBool::new(false));
    let requests = keep_requesting(&site.clients.ns, site.proxy, stop.clone());
    // The proxy's address is the host's on the other link: route it over the flood's.
    let route = site.flood.command("ip").args(["route", "add", &proxy.ip().to_string(), "dev", "eth0"]).status();
    assert!(route.is_ok_and(|status| status.success()), "a route to the proxy from the flood namespace");
    let elapsed = site.flood_at(proxy.ip(), &["--rand-source", "-S", "-p", &proxy.port().to_string()]);
    stop.store(true, Ordering::Relaxed);
    let (ok, tried) = requests.join().expect("client thread").expect("namespace");
    // The flood's count is what one snapshot holds less the client's packets, read
    // after it: a late packet of the client's can only make the flood's count smaller.
    let after = maps.counter_snapshot().expect("counters");
    let client_packets = maps.source(&client_key).expect("client").packets - client_before;
    let flood_seen = verdicts(&after) - seen_before - client_packets;
    // Refused by the new-source budget (most of them: each forged source is new) or
    // by the SYN budget.
    let refused = |counters: &CounterSnapshot| verdicts(counters) - counters.get(Counter::Passed);
    let handed_on = flood_seen - (refused(&after) - refused(&before));
    let allowed = SYN_BURST + (elapsed.as_secs_f64() * SYN_RATE as f64).ceil() as u64 + 10;
    eprintln!(
        "SYN flood: {handed_on} of {flood_seen} SYNs passed the budgets in {elapsed:?}; client: {ok} of {tried} \
         connected"
    );
    assert!(flood_seen >= FLOOD * 9 / 10, "the flood did not reach the program: {flood_seen} packets seen");
    assert!(handed_on <= allowed, "{handed_on} SYNs passed the budgets, the SYN budget allows {allowed}");
    assert!(tried >= 3 && ok == tried, "the client connected {ok} of {tried} times");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_checks_verifies_and_reloads_the_spoofing_defences() {
    let upstream = Upstream::start().await;
    let mut site = Site::start(upstream.addr, "", "");
    let text = |output: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    };
    let check = text(&site.agent.cli(&["check"]));
    assert!(check.contains(&format!("xdp.new_sources: {BUDGET_RATE} pps, burst {BUDGET_BURST}")), "{check}");
    assert!(check.contains("xdp.syn: off"), "{check}");
    assert!(check.contains("clients the proxy served a response"), "{check}");
    assert!(check.contains("warning: xdp.verified: the proxy now verifies a client once it has served it"), "{check}");

    let verified = site.agent.cli(&["verify", "192.0.2.0/30", "--ttl", "1m"]);
    assert!(verified.status.success(), "{}", text(&verified));
    assert_eq!(String::from_utf8_lossy(&verified.stdout), "verified 192.0.2.0/30 (4 sources) for 1m\n");
    assert!(site.maps().is_verified(&source_key("192.0.2.3".parse().expect("ip"), 64)));
    assert_eq!(site.agent.cli_json(&["stats", "--json"])["xdp"]["verified"]["tracked"].as_u64(), Some(4));
    let unverified = site.agent.cli(&["unverify", "192.0.2.0/24"]);
    assert_eq!(String::from_utf8_lossy(&unverified.stdout), "unverified 192.0.2.0/24 (4 sources)\n");
    let again = site.agent.cli(&["unverify", "192.0.2.0/24"]);
    assert!(!again.status.success() && text(&again).contains("no verified source in 192.0.2.0/24"), "{}", text(&again));
    let too_wide = site.agent.cli(&["verify", "10.0.0.0/8"]);
    assert!(!too_wide.status.success() && text(&too_wide).contains("action = \"allow\""), "{}", text(&too_wide));

    let with_xdp = |table: &str| site.config.replace("\n[proxy]\n", &format!("\n{table}\n[proxy]\n"));
    let with_syn = with_xdp("[xdp.syn]\npackets_per_second = 100\nburst = 100\n");
    let resized = with_xdp("[xdp.aggregate]\nmax_prefixes = 1024\n");
    let reloaded = site.agent.reload_with(&with_syn);
    assert!(
        text(&reloaded).contains("xdp.syn: off -> 100 pps, burst 100, at most 10 pps, burst 10 per source"),
        "{}",
        text(&reloaded)
    );
    let refused = site.agent.reload_with(&resized);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("xdp.aggregate.max_prefixes"), "{}", text(&refused));
}

/// The attack: `hping3 -S -p 22` from one real address, then at the proxy's own
/// port. SYNs to the unserved port are charged to the flooder's bucket and never ask
/// the SYN budget (before, every one took a token first, and the budget was empty
/// for everyone); at the proxy's port it takes no more than its share, so another
/// client, never verified since it only connects, keeps connecting.
#[tokio::test(flavor = "multi_thread")]
async fn one_source_flooding_syns_leaves_the_syn_budget_to_other_clients() {
    let upstream = Upstream::start().await;
    let site =
        Site::start(upstream.addr, "", &format!("[xdp.syn]\npackets_per_second = {SYN_RATE}\nburst = {SYN_BURST}\n"));
    let maps = site.maps();
    let flooder = source_key(IpAddr::V4(site.calm), 64);
    let client_key = source_key(IpAddr::V4(site.client), 64);
    let seen = || verdicts(&maps.counter_snapshot().expect("counters"));
    let before = seen();

    site.flood(&["-S", "-p", "22"]);
    let seen_22 = site.agent.until("the flood to reach the program", seen, |n| *n >= before + FLOOD * 9 / 10);
    let budget = maps.budget(BUDGET_SYN).expect("budget");
    assert_eq!((budget.packets, budget.dropped), (0, 0), "SYNs to port 22 asked the SYN budget");
    let after_22 = maps.counter_snapshot().expect("counters");
    assert_eq!((after_22.get(Counter::DroppedSyn), after_22.get(Counter::DroppedSynShare)), (0, 0));
    assert!(after_22.get(Counter::DroppedRateLimit) > 0, "the flooder's own bucket held it");

    let proxy = site.proxy;
    let route = site.flood.command("ip").args(["route", "add", &proxy.ip().to_string(), "dev", "eth0"]).status();
    assert!(route.is_ok_and(|status| status.success()), "a route to the proxy from the flood namespace");
    let stop = Arc::new(AtomicBool::new(false));
    let connects = keep_connecting(&site.clients.ns, proxy, stop.clone());
    let elapsed = site.flood_at(proxy.ip(), &["-S", "-p", &proxy.port().to_string()]);
    stop.store(true, Ordering::Relaxed);
    let (ok, tried) = connects.join().expect("client thread").expect("namespace");
    site.agent.until("the flood at the proxy's port to reach the program", seen, |n| *n >= seen_22 + FLOOD * 9 / 10);
    let share = maps.syn_share(&flooder).expect("the flooder's share");
    let per_source = SYN_RATE.div_ceil(10);
    let allowed = SYN_BURST.div_ceil(10) + (elapsed.as_secs_f64() * per_source as f64).ceil() as u64 + 1;
    eprintln!(
        "one-source SYN flood at the proxy: {} of {} SYNs past its bucket took from the budget in {elapsed:?}; \
         client: {ok} of {tried} connected",
        share.packets - share.dropped,
        share.packets
    );
    assert!(
        share.packets - share.dropped <= allowed,
        "the flooder took {:?} of the budget, its share {allowed}",
        share
    );
    assert!(tried >= 3 && ok == tried, "the other client connected {ok} of {tried} times");
    assert!(!maps.is_verified(&client_key), "connecting alone verifies nobody");
}

/// The attack on the verified map: a host that connects without asking anything
/// verified its address (its /64) for `ttl`, so one /48 could fill the map. Now
/// only a request the upstream answered verifies its peer, and one /24 holds at
/// most `max_per_24` verified addresses (a /48 `max_per_48`).
#[tokio::test(flavor = "multi_thread")]
async fn only_a_served_request_verifies_and_one_24_holds_at_most_its_cap() {
    let upstream = Upstream::start().await;
    let site = Site::start(upstream.addr, "", "[xdp.verified]\nmax_per_24 = 2\nmax_per_48 = 16\n");
    let maps = site.maps();
    let client_key = source_key(IpAddr::V4(site.client), 64);
    let proxy = site.proxy;
    let refused = spawn_in_namespace(&site.clients.ns, move || -> std::io::Result<String> {
        drop(TcpStream::connect_timeout(&proxy, Duration::from_secs(3))?);
        let mut stream = TcpStream::connect_timeout(&proxy, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        stream.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n")?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        Ok(reply)
    });
    let reply = refused.join().expect("client").expect("namespace").expect("the refused request");
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(!maps.is_verified(&client_key), "a bare connect and a request the proxy refused verified the client");
    assert_eq!(site.agent.cli_json(&["stats", "--json"])["xdp"]["verified"]["tracked"].as_u64(), Some(0));

    let served = spawn_in_namespace(&site.clients.ns, move || get(proxy));
    assert_eq!(served.join().expect("client").ok(), Some(true), "the served request");
    site.agent.until("the served client to be verified", || maps.is_verified(&client_key), |verified| *verified);

    // Three more addresses of the client's /24, each served.
    let others: Vec<Ipv4Addr> = (3..=5).map(|last| Ipv4Addr::from(u32::from(site.client) - 2 + last)).collect();
    for address in &others {
        let added = site.clients.command("ip").args(["addr", "add", &format!("{address}/24"), "dev", "eth0"]).status();
        assert!(added.is_ok_and(|status| status.success()), "address {address}");
        let curl = site
            .clients
            .command("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "--interface"])
            .arg(address.to_string())
            .arg(format!("http://{proxy}/"))
            .output()
            .expect("run curl");
        assert_eq!(String::from_utf8_lossy(&curl.stdout), "200", "from {address}");
    }
    let stats =
        site.agent.stats_until("the verified sources", |stats| stats["xdp"]["verified"]["tracked"].as_u64() == Some(2));
    assert_eq!(stats["xdp"]["verified"]["tracked"].as_u64(), Some(2), "{stats}");
    let verified: Vec<bool> = others.iter().map(|a| maps.is_verified(&source_key(IpAddr::V4(*a), 64))).collect();
    assert_eq!(verified, [true, false, false], "the client and the first other fill the /24's 2");
}
