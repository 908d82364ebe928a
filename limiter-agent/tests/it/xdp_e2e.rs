//! The agent attached to a real veth, with real UDP traffic from a namespace.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use limiter::xdp::{KernelMaps, source_key};
use limiter_common::counters::Counter;
use limiter_lab::{support::xdp_lab::XdpLab, traffic};

const RATE: u64 = 1_000;
const BURST: u64 = 100;

#[test]
fn flood_is_held_to_its_rate_while_a_slow_flow_loses_nothing() {
    let lab = XdpLab::start(
        2,
        "keep_attached_on_exit = false",
        &format!("[xdp.limit]\npackets_per_second = {RATE}\nburst = {BURST}\n"),
    );
    let (flooder, polite) = (lab.sources[0], lab.sources[1]);
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    const FLOOD: u64 = 30_000;
    const POLITE: u64 = 40;
    let flood_elapsed = std::thread::scope(|scope| {
        // 30 000 packets over about a second: 30x the limit.
        let flood = scope.spawn(|| traffic::send(&lab.net.ns, flooder, receiver.addr, FLOOD, 300).expect("send"));
        scope.spawn(|| traffic::send(&lab.net.ns, polite, receiver.addr, POLITE, 1).expect("send"));
        flood.join().expect("flood")
    });
    // The program meets each packet in the kernel's receive path, which may run after
    // the send returned, and the receiving thread gets those it passed later still.
    let row = |top: &serde_json::Value, ip: std::net::Ipv4Addr| {
        top.as_array().and_then(|rows| rows.iter().find(|r| r["source"] == ip.to_string())).cloned()
    };
    let count = |top: &serde_json::Value, ip, what: &str| row(top, ip).and_then(|row| row[what].as_u64());
    let top = lab.agent.json_until(&["top", "-n", "5", "--json"], "the program to meet every packet", |top| {
        (count(top, flooder, "packets"), count(top, polite, "packets")) == (Some(FLOOD), Some(POLITE))
    });
    assert_eq!(count(&top, polite, "dropped"), Some(0), "the slow flow lost packets");
    let flood_received = FLOOD - count(&top, flooder, "dropped").expect("the flooder's drops");
    lab.agent.until(
        "every packet passed to reach the receiver",
        || (receiver.from(flooder).len() as u64, receiver.from(polite).len() as u64),
        |received| *received == (flood_received, POLITE),
    );
    eprintln!("flood: {flood_received} of {FLOOD} received in {flood_elapsed:?}; slow flow: {POLITE} of {POLITE}");
    let ceiling = BURST + (flood_elapsed.as_secs_f64() * RATE as f64).ceil() as u64 + RATE / 20;
    let floor = (flood_elapsed.as_secs_f64() * RATE as f64 * 0.8) as u64;
    assert!(
        (floor..=ceiling).contains(&flood_received),
        "flood got {flood_received} through in {flood_elapsed:?}; expected {floor}..={ceiling}"
    );

    // Read after the program met the last packet: the counters are final.
    let stats = lab.agent.cli_json(&["stats", "--json"]);
    assert_eq!(stats["xdp"]["packets"]["dropped_rate_limit"].as_u64(), Some(FLOOD - flood_received), "{stats}");
    assert_eq!(stats["xdp"]["attached"][0]["interface"].as_str(), Some(lab.net.host_if.as_str()));
}

/// `limiter top --watch` with its output going to a pipe, not a terminal: plain
/// tables every interval, with the rates of a source flooding the kernel layer and of
/// a client the proxy refuses, and the rule refusing it.
#[tokio::test(flavor = "multi_thread")]
async fn top_watch_prints_plain_frames_with_both_layers_rates_when_not_on_a_terminal() {
    use limiter_lab::support::{
        proxy::{TestClient, Upstream},
        wait::PATIENCE,
    };
    use std::io::BufRead as _;

    let upstream = Upstream::start().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let proxy = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nupstream = \"http://{}\"\n[[proxy.rules]]\nname = \"login\"\n\
         path = \"/login\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1m\"\n",
        upstream.addr
    );
    let lab = XdpLab::start(
        1,
        "keep_attached_on_exit = false",
        &format!("[xdp.limit]\npackets_per_second = {RATE}\nburst = {BURST}\n{proxy}"),
    );
    let mut top = std::process::Command::new(limiter_lab::support::agent::limiter_bin())
        .args(["top", "--watch", "1", "-n", "5", "-c"])
        .arg(&lab.agent.config_path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("limiter top --watch");
    let (lines, output) = std::sync::mpsc::channel();
    let stdout = top.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });

    let source = lab.sources[0];
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    let client = TestClient::default();
    let url = format!("http://127.0.0.1:{port}/login");
    let (mut source_seen, mut client_seen, mut frames) = (None, None, 0);
    let deadline = std::time::Instant::now() + PATIENCE * 4;
    while (source_seen.is_none() || client_seen.is_none() || frames < 2) && std::time::Instant::now() < deadline {
        // Every round: more packets than the bucket passes, and requests over the rule.
        traffic::send(&lab.net.ns, source, receiver.addr, 2_000, 500).expect("send");
        for _ in 0..3 {
            client.request(http::Method::POST, &url, &[], b"").await;
        }
        while let Ok(line) = output.recv_timeout(Duration::from_millis(100)) {
            frames += usize::from(line.starts_with("limiter top · every 1 s · sorted by rate"));
            let cells: Vec<&str> = line.split_whitespace().collect();
            match cells.as_slice() {
                [name, pps, drops, _tokens] if *name == source.to_string() => {
                    let (pps, drops): (f64, f64) = (pps.parse().expect("pps"), drops.parse().expect("drops"));
                    if pps > 0.0 && drops > 0.0 {
                        source_seen = Some(line.clone());
                    }
                }
                ["ip", "127.0.0.1", rps, refused, "login"] => {
                    let (rps, refused): (f64, f64) = (rps.parse().expect("rps"), refused.parse().expect("refused"));
                    if rps > 0.0 && refused > 0.0 {
                        client_seen = Some(line.clone());
                    }
                }
                _ => {}
            }
        }
    }
    let _ = top.kill();
    let _ = top.wait();
    eprintln!("{frames} frames; source: {source_seen:?}; client: {client_seen:?}");
    assert!(frames >= 2, "repeated frames: {frames}");
    assert!(source_seen.is_some(), "the flooding source with packets/s and drops/s");
    assert!(client_seen.is_some(), "the refused client with its rule");
}

/// The verified map filling and its entries lapsing, on a real veth: `[xdp.verified]
/// max` entries and no more, a source verified into the full map still gets in (the
/// least recently used make room), and once its `ttl` has passed its packets charge
/// the aggregate again (here a 1-packet one, so that skipping it shows).
#[test]
fn a_full_verified_map_takes_new_sources_and_a_lapsed_entry_skips_nothing() {
    const MAX: u64 = 256;
    let body = format!(
        "[xdp.limit]\npackets_per_second = 100000\nburst = 100000\n\
         [xdp.aggregate]\npackets_per_second = 1\nburst = 1\n[xdp.verified]\nmax = {MAX}\n"
    );
    let mut lab = XdpLab::start(1, "keep_attached_on_exit = false", &body);
    let client = lab.sources[0];
    let maps = || KernelMaps::open_pinned(&lab.agent.pin_dir).expect("pinned maps");
    // Twice the map's size, as `limiter verify` takes at most `max` sources a command.
    for cidr in ["198.18.0.0/24", "198.18.1.0/24"] {
        let output = lab.agent.cli(&["verify", cidr, "--ttl", "10m"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let verified = &lab.agent.cli_json(&["stats", "--json"])["xdp"]["verified"];
    assert_eq!(verified["capacity"].as_u64(), Some(MAX), "{verified}");
    assert!(verified["tracked"].as_u64().is_some_and(|tracked| tracked <= MAX), "{verified}");
    let newest = source_key(IpAddr::V4(Ipv4Addr::new(198, 18, 1, 255)), 64);
    assert!(maps().is_verified(&newest), "the newest verified source is in the full map");

    let key = source_key(IpAddr::V4(client), 64);
    let output = lab.agent.cli(&["verify", &format!("{client}/32"), "--ttl", "3s"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(maps().is_verified(&key), "verified into the full map");
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    traffic::send(&lab.net.ns, client, receiver.addr, 20, 20).expect("send");
    // All of them: a verified source skips the aggregate, whose burst is 1.
    lab.agent.until("all 20 to arrive", || receiver.from(client).len(), |n| *n == 20);

    // Past its ttl the entry verifies nothing, whether or not the map still holds it.
    lab.agent.until("the entry to lapse", || maps().is_verified(&key), |verified| !verified);
    // The program reads the coarse clock (1/HZ: 10 ms at most), which is behind the
    // precise one the line above read by up to a tick.
    std::thread::sleep(Duration::from_millis(50));
    traffic::send(&lab.net.ns, client, receiver.addr, 20, 20).expect("send");
    // The drops count every source's (the namespace's IPv6 chatter has an aggregate too).
    lab.agent.until(
        "the program to meet the 20",
        || lab.agent.counter(Counter::DroppedAggregate) + receiver.from(client).len() as u64,
        |met| *met >= 40,
    );
    receiver.settle(Duration::from_millis(200));
    let passed = receiver.from(client).len() - 20;
    assert!(passed <= 2, "the aggregate's burst of 1 (and 1 a second) passes, no more: {passed} of 20");

    // A reload refuses a size past the bound as `limiter check` does.
    let beyond = lab.config_with("keep_attached_on_exit = false", &body.replace("max = 256", "max = 3_000_000"));
    let output = lab.agent.reload_with(&beyond);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("xdp.verified.max: 3000000 is above the most of 2097152"),
        "{stderr}"
    );
}
