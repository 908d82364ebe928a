//! The control plane against a real agent: reloads during a flood, rejected
//! configs, a killed agent, runtime blocks, metrics and detaching.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use limiter::xdp::{KernelMaps, monotonic_now_ns};
use limiter_common::{
    counters::Counter,
    maps::{SourceKey, SourceState},
};
use limiter_lab::{
    netns::VethNamespace,
    support::{agent::AgentProcess, free_port, unique, xdp_lab::XdpLab},
    traffic,
};

fn limit(pps: u32, burst: u32) -> String {
    format!("[xdp.limit]\npackets_per_second = {pps}\nburst = {burst}\n")
}

fn default_pps(pin_dir: &Path) -> u64 {
    KernelMaps::open_pinned(pin_dir).expect("pinned maps").settings().expect("settings").default_rate.per_second()
}

fn key_of(source: std::net::Ipv4Addr) -> SourceKey {
    SourceKey { addr: limiter_common::addr::v4_mapped(source.octets()) }
}

/// The program's own record of `source`, if it has one.
fn source_state(pin_dir: &Path, source: std::net::Ipv4Addr) -> Option<SourceState> {
    KernelMaps::open_pinned(pin_dir).expect("pinned maps").source(&key_of(source))
}

/// When, and how many packets of `source` the program had let through by then.
fn passed_by_now(pin_dir: &Path, source: std::net::Ipv4Addr) -> (Instant, u64) {
    let state = source_state(pin_dir, source).unwrap_or_default();
    (Instant::now(), state.packets - state.dropped)
}

/// The program's record of `source` once it has met all the `sent` packets: it meets
/// them in the kernel's receive path, which may run after the send returns.
fn seen_all(agent: &AgentProcess, source: std::net::Ipv4Addr, sent: u64) -> SourceState {
    let state = agent.until(
        &format!("the program to meet all {sent} packets"),
        || source_state(&agent.pin_dir, source),
        |state| state.is_some_and(|state| state.packets == sent),
    );
    state.expect("tracked")
}

/// Packets a second between two [`passed_by_now`]; the count and the seconds too.
fn rate_between(from: (Instant, u64), to: (Instant, u64)) -> (f64, u64, f64) {
    let (passed, secs) = (to.1 - from.1, (to.0 - from.0).as_secs_f64());
    (passed as f64 / secs, passed, secs)
}

#[test]
fn reload_during_a_flood_follows_the_new_limit_without_a_burst() {
    const OLD: u32 = 2_000;
    const NEW: u32 = 500;
    let mut lab = XdpLab::start(1, "keep_attached_on_exit = false", &limit(OLD, 100));
    let source = lab.sources[0];
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    let new_config = lab.config_with("keep_attached_on_exit = false", &limit(NEW, 50));
    let pins = lab.agent.pin_dir.clone();
    // The rates are the program's own counts, read at known times: a receiving thread
    // held back on a loaded machine would record packets passed before the reload
    // as after it.
    let (old_from, old_to, new_from, new_to) = std::thread::scope(|scope| {
        // About 30 000 packets per second for two seconds.
        let flood = scope.spawn(|| traffic::send(&lab.net.ns, source, receiver.addr, 60_000, 300).expect("send"));
        std::thread::sleep(Duration::from_millis(200));
        let old_from = passed_by_now(&pins, source);
        std::thread::sleep(Duration::from_millis(700));
        let old_to = passed_by_now(&pins, source);
        let output = lab.agent.reload_with(&new_config);
        let new_from = passed_by_now(&pins, source);
        assert!(output.status.success(), "reload: {}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(printed.contains("xdp.limit: 2000 pps, burst 100 -> 500 pps, burst 50"), "{printed}");
        flood.join().expect("flood");
        (old_from, old_to, new_from, passed_by_now(&pins, source))
    });
    let (old_rate, before, before_secs) = rate_between(old_from, old_to);
    let (_, after, after_secs) = rate_between(new_from, new_to);
    eprintln!("before: {before} in {before_secs:.2}s, after: {after} in {after_secs:.2}s");
    assert!((f64::from(OLD) * 0.8..=f64::from(OLD) * 1.1).contains(&old_rate), "old rate {old_rate:.0}/s");
    // No refill at the swap: past the reload, at most the new rate plus a new burst.
    let ceiling = f64::from(NEW) * after_secs + 50.0 + f64::from(NEW) * 0.05;
    assert!((after as f64) <= ceiling, "after reload {after} > {ceiling:.0}");
    assert!((after as f64) >= f64::from(NEW) * after_secs * 0.7, "after reload {after} too few");
    assert_eq!(default_pps(&lab.agent.pin_dir), u64::from(NEW));
}

#[test]
fn rejected_configs_leave_the_running_limits_in_force() {
    let lab = XdpLab::start(1, "", &limit(1_234, 100));
    let good = lab.config_with("", &limit(1_234, 100));
    let rule = "[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\n";
    let line_of =
        |text: &str, needle: &str| format!(":{}:", text.lines().position(|l| l.contains(needle)).expect("needle") + 1);
    let syntax = good.replace("burst = 100", "burst = = 100");
    let truncated = good[..good.find("packets_per_second").expect("key") + 10].to_owned();
    let bad_configs = [
        ("syntax error", syntax.clone(), line_of(&syntax, "burst = =")),
        (
            "zero rate",
            good.replace("packets_per_second = 1234", "packets_per_second = 0"),
            "xdp.limit.packets_per_second".to_owned(),
        ),
        ("bad CIDR", format!("{good}{rule}{}", rule.replace("10.0.0.0/8", "10.0.0.0/33")), "xdp.cidr[1]".to_owned()),
        (
            "one bad rule among good ones",
            format!(
                "{good}{rule}{}{}",
                rule.replace("10.0.0.0", "11.0.0.0"),
                rule.replace("\"allow\"", "\"permit\"").replace("10.0.0.0", "12.0.0.0")
            ),
            "xdp.cidr[2]".to_owned(),
        ),
        ("unknown key", good.replace("burst = 100", "burst = 100\nbrust = 5"), "xdp.limit.brust".to_owned()),
        ("truncated file", truncated.clone(), format!(":{}:", truncated.lines().count())),
    ];
    for (what, text, named) in &bad_configs {
        lab.agent.write_config(text);
        let output = lab.agent.cli(&["reload"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{what}: reload must fail: {stderr}");
        assert!(stderr.contains(named.as_str()), "{what}: error must name {named}: {stderr}");
        assert_eq!(default_pps(&lab.agent.pin_dir), 1_234, "{what}: old limit must stay");
        let cidrs = KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps").cidrs().expect("cidrs");
        assert!(cidrs.is_empty(), "{what}: no rule of a rejected file may be applied: {cidrs:?}");
    }
    lab.agent.write_config(&format!("{good}{rule}"));
    let output = lab.agent.cli(&["reload"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("xdp.cidr[10.0.0.0/8] added: "));
    // At least: the watcher may have caught some of the files too.
    lab.agent.stats_until("every rejected reload counted", |stats| {
        stats["agent"]["reloads"]["rejected"].as_u64() >= Some(bad_configs.len() as u64)
    });
}

#[test]
fn a_killed_agent_keeps_dropping_and_its_successor_continues_the_counts() {
    let spoofing = "[xdp.new_sources]\npackets_per_second = 100\nburst = 100\n\
                    [xdp.aggregate]\npackets_per_second = 100000\nburst = 100000\n";
    let mut lab = XdpLab::start(1, "keep_attached_on_exit = true", &format!("{}{spoofing}", limit(500, 50)));
    let source = lab.sources[0];
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    traffic::send(&lab.net.ns, source, receiver.addr, 2_000, 200).expect("send");
    let verified = lab.agent.cli(&["verify", "192.0.2.0/30", "--ttl", "10m"]);
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stderr));
    let first = seen_all(&lab.agent, source, 2_000);
    let dropped_before_kill = lab.agent.counter(Counter::DroppedRateLimit);
    assert!(dropped_before_kill > 0);
    let status = lab.agent.stop_with(libc::SIGKILL);
    assert!(!status.success());
    // Nobody holds the program now but its pinned link: it must still be dropping.
    traffic::send(&lab.net.ns, source, receiver.addr, 2_000, 200).expect("send");
    let second = seen_all(&lab.agent, source, 4_000);
    let dropped_after_kill = lab.agent.counter(Counter::DroppedRateLimit);
    let got_through = (second.packets - second.dropped) - (first.packets - first.dropped);
    assert!(dropped_after_kill >= dropped_before_kill + 1_500, "{dropped_before_kill} -> {dropped_after_kill}");
    assert!(got_through <= 500, "{got_through} of 2000 passed with the agent dead");
    let source_key = key_of(source);
    let prefix_key = limiter_common::maps::SourceKey { addr: limiter_common::addr::mask_v6(source_key.addr, 96 + 24) };
    let verified_key = limiter::xdp::source_key("192.0.2.1".parse().expect("ip"), 64);
    let (packets_before, budget_before, aggregate_before) = {
        let maps = KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps");
        let budget = maps.budget(limiter_common::maps::BUDGET_NEW_SOURCES).expect("budget");
        (maps.source(&source_key).expect("tracked").packets, budget, maps.aggregate(&prefix_key).expect("aggregate"))
    };

    lab.agent.spawn();
    assert!(lab.agent.counter(Counter::DroppedRateLimit) >= dropped_after_kill, "counters must not reset");
    let maps = KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps");
    let state = maps.source(&source_key).expect("bucket kept");
    assert_eq!(state.packets, packets_before, "the source's bucket survives the restart");
    // The defences against spoofed sources too: a refilled budget or aggregate would
    // hand a flood a fresh burst at every restart. (The link's own chatter may have
    // charged them since, so they can only have moved on.)
    let budget = maps.budget(limiter_common::maps::BUDGET_NEW_SOURCES).expect("budget");
    assert!(budget.tat_ns >= budget_before.tat_ns && budget.packets >= budget_before.packets, "the budget was reset");
    let aggregate = maps.aggregate(&prefix_key).expect("the aggregate is kept");
    assert!(aggregate.tat_ns >= aggregate_before.tat_ns && aggregate.packets >= aggregate_before.packets);
    assert!(maps.is_verified(&verified_key), "a verified source stays verified");
    drop(maps);
    traffic::send(&lab.net.ns, source, receiver.addr, 1_000, 200).expect("send");
    seen_all(&lab.agent, source, 5_000);
    assert!(lab.agent.counter(Counter::DroppedRateLimit) > dropped_after_kill);
    let attached = limiter::xdp::attached(&lab.agent.pin_dir).expect("attached");
    assert_eq!(attached.len(), 1, "one link, reused: {attached:?}");
}

#[test]
fn a_block_with_a_ttl_drops_then_lets_traffic_through_again() {
    let security_log = std::env::temp_dir().join(format!("{}.jsonl", unique("security-block")));
    let agent = format!("keep_attached_on_exit = false\n[agent.security_log]\npath = \"{}\"", security_log.display());
    let lab = XdpLab::start(1, &agent, &limit(10_000, 10_000));
    // `limiter block` and `unblock` write their security events themselves.
    let events = || -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&security_log).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect()
    };
    let source = lab.sources[0];
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    // Long enough for the looks below on a loaded machine, all of them before it lapses.
    let ttl = Duration::from_secs(3);
    let output = lab.agent.cli(&["block", &source.to_string(), "--ttl", "3s"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let expires = monotonic_now_ns() + u64::try_from(ttl.as_nanos()).expect("ns");
    let blocked =
        serde_json::json!({"event": "kernel_block", "reason": "cli", "client": source.to_string(), "ttl_s": 3});
    let logged = events();
    assert_eq!(logged.len(), 1, "{logged:?}");
    let mut first = logged[0].clone();
    assert!(first.as_object_mut().and_then(|line| line.remove("time")).is_some_and(|t| t.is_f64()), "{first}");
    assert_eq!(first, blocked);
    let stats = lab.agent.cli_json(&["stats", "--json"]);
    assert_eq!(stats["xdp"]["blocks"][0]["cidr"].as_str(), Some(format!("{source}/32").as_str()), "{stats}");
    assert!(stats["xdp"]["blocks"][0]["expires_in_secs"].as_u64() <= Some(ttl.as_secs()));
    traffic::send(&lab.net.ns, source, receiver.addr, 50, 10).expect("send");
    lab.agent.until("the 50 blocked packets dropped", || lab.agent.counter(Counter::DroppedDeny), |n| *n == 50);
    assert!(monotonic_now_ns() < expires, "the block lapsed while the test looked: make the TTL longer");
    assert_eq!(receiver.from(source).len(), 0, "blocked traffic got through");
    while monotonic_now_ns() <= expires {
        std::thread::sleep(Duration::from_millis(50));
    }
    traffic::send(&lab.net.ns, source, receiver.addr, 50, 10).expect("send");
    lab.agent.until("the traffic to pass after the TTL", || receiver.from(source).len(), |n| *n == 50);
    let output = lab.agent.cli(&["unblock", &source.to_string()]);
    assert_eq!(output.status.code(), Some(1), "a lapsed block is gone");
    // Until unblocked, then unblocked: both logged; the lapsed block's failed unblock not.
    assert!(lab.agent.cli(&["block", "198.51.100.0/24"]).status.success());
    assert!(lab.agent.cli(&["unblock", "198.51.100.0/24"]).status.success());
    let logged: Vec<(String, String, bool)> = events()
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or("-").to_owned(),
                e["client"].as_str().unwrap_or("-").to_owned(),
                e["ttl_s"].is_null(),
            )
        })
        .collect();
    let cidr = "198.51.100.0/24".to_owned();
    assert_eq!(
        logged[1..],
        [("kernel_block".to_owned(), cidr.clone(), true), ("kernel_unblock".to_owned(), cidr, true)]
    );
    let _ = std::fs::remove_file(&security_log);
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let port = free_port();
    let lab = XdpLab::start(
        1,
        &format!("metrics = \"127.0.0.1:{port}\""),
        &format!(
            "{}\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\
             [[proxy.rules]]\nname = \"per \\\"ip\\\"\"\nkey = \"ip\"\nlimit = 100\nwindow = \"1m\"\n",
            limit(100, 10)
        ),
    );
    let response = http_get(&format!("127.0.0.1:{port}"), "/metrics");
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b).expect("HTTP body");
    for expected in [
        "limiter_xdp_packets_total{action=\"dropped_rate_limit\"}",
        "limiter_xdp_attached{interface=",
        "limiter_config_reloads_total{result=\"ok\"}",
        "limiter_proxy_requests_total{decision=\"forwarded\"}",
        "limiter_proxy_decision_seconds_bucket{store=\"memory\",le=\"+Inf\"}",
        // A rule's name is the operator's text: escaped as a label value.
        "limiter_proxy_policy_decisions_total{kind=\"rule\",name=\"per \\\"ip\\\"\",decision=\"rejected\"} 0",
        "limiter_proxy_decision_log_lines_total{result=\"dropped\"} 0",
        "limiter_proxy_connections_refused_total{reason=\"max_connections_per_ip\"} 0",
        "limiter_proxy_body_timeouts_total 0",
    ] {
        assert!(body.contains(expected), "missing {expected} in:\n{body}");
    }
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (cargo xtask setup installs it)");
    use std::io::Write as _;
    promtool.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("write");
    let output = promtool.wait_with_output().expect("promtool");
    assert!(
        output.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    drop(lab);
}

/// Metric names in `text`: every `limiter_…` token.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|token| token.starts_with("limiter_"))
        .map(str::to_owned)
        .collect()
}

fn promtool(args: &[&str], dir: &Path) {
    let output = Command::new("promtool").args(args).current_dir(dir).output().expect("promtool");
    assert!(
        output.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_dashboard_and_alerts_query_only_metrics_the_agent_exports() {
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging");
    let dashboard = std::fs::read_to_string(packaging.join("grafana/limiter.json")).expect("dashboard");
    let rules = std::fs::read_to_string(packaging.join("prometheus/limiter-rules.yml")).expect("rules");
    promtool(&["check", "rules", "limiter-rules.yml"], &packaging.join("prometheus"));
    promtool(&["test", "rules", "limiter-rules.test.yml"], &packaging.join("prometheus"));

    let panels: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard JSON");
    let panels = panels["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty() && targets.iter().all(|t| t["expr"].is_string()), "{}", panel["title"]);
    }

    // Every optional family on: the budgets, verified sources, the proxy, its adaptive limit.
    let port = free_port();
    let lab = XdpLab::start(
        1,
        &format!("metrics = \"127.0.0.1:{port}\""),
        &format!(
            "{}\n[xdp.new_sources]\npackets_per_second = 100\nburst = 100\n[xdp.syn]\npackets_per_second = 100\n\
             burst = 100\n[xdp.verified]\nttl = \"1m\"\n[proxy]\nlisten = \"127.0.0.1:0\"\n\
             upstream = \"http://127.0.0.1:9\"\n[proxy.adaptive]\n",
            limit(100, 10)
        ),
    );
    let response = http_get(&format!("127.0.0.1:{port}"), "/metrics");
    let exported = metric_names(response.split_once("\r\n\r\n").map(|(_, b)| b).expect("HTTP body"));
    for (file, text) in [("grafana/limiter.json", &dashboard), ("prometheus/limiter-rules.yml", &rules)] {
        let queried = metric_names(text);
        assert!(queried.len() >= 5, "{file} queries {queried:?}");
        let missing: Vec<&String> = queried.difference(&exported).collect();
        assert!(missing.is_empty(), "{file} queries metrics the agent does not export: {missing:?}");
    }
    drop(lab);
}

/// The agent's open files, ignoring ones open for a moment (a config read, an
/// admin connection closing): the fewest seen over a few looks.
fn fd_count(pid: u32) -> usize {
    (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fds").count()
        })
        .min()
        .expect("samples")
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_hundred_reloads_leak_neither_memory_nor_file_descriptors() {
    let mut lab = XdpLab::start(1, "", &limit(1_000, 100));
    let pid = lab.agent.child.as_ref().expect("running").id();
    let configs = [
        lab.config_with("", &limit(1_000, 100)),
        lab.config_with("", &format!("{}[[xdp.cidr]]\ncidr = \"10.9.0.0/16\"\naction = \"deny\"\n", limit(2_000, 200))),
    ];
    let mut reload = |i: usize| {
        let output = lab.agent.reload_with(&configs[(i + 1) % 2]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_ne!(String::from_utf8_lossy(&output.stdout).trim(), "no changes", "every reload changes something");
    };
    for i in 0..10 {
        reload(i);
    }
    let (fds, rss) = (fd_count(pid), rss_kib(pid));
    for i in 0..100 {
        reload(i);
    }
    let (fds_after, rss_after) = (fd_count(pid), rss_kib(pid));
    eprintln!("fds {fds} -> {fds_after}, rss {rss} KiB -> {rss_after} KiB");
    assert_eq!(fds_after, fds, "file descriptors leaked");
    assert!(rss_after <= rss + 1_024, "memory grew from {rss} to {rss_after} KiB");
}

#[test]
fn detach_removes_program_links_and_pins() {
    let lab = XdpLab::start(1, "keep_attached_on_exit = true", &limit(1_000, 100));
    let xdp_on = |interface: &str| {
        let output = Command::new("ip").args(["-d", "link", "show", "dev", interface]).output().expect("ip");
        String::from_utf8_lossy(&output.stdout).contains("prog/xdp")
    };
    assert!(xdp_on(&lab.net.host_if));
    let output = lab.agent.cli(&["detach"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!lab.agent.pin_dir.exists(), "pins must be gone");
    assert!(!xdp_on(&lab.net.host_if), "program must be detached");
}

#[test]
fn a_reload_attaches_and_detaches_only_the_interfaces_that_changed() {
    let mut lab = XdpLab::start(1, "keep_attached_on_exit = false", &limit(1_000, 100));
    let name = unique("lim-if-");
    let second = VethNamespace::new(
        &name,
        &format!("{}h", &name[..name.len().min(13)]),
        "eth0",
        "10.99.77.1/24",
        &["10.99.77.2/24"],
    )
    .expect("second veth");
    let xdp_on = |interface: &str| {
        let output = Command::new("ip").args(["-d", "link", "show", "dev", interface]).output().expect("ip");
        String::from_utf8_lossy(&output.stdout).contains("prog/xdp")
    };
    let first_link = limiter::xdp::attached(&lab.agent.pin_dir).expect("attached");
    let both = lab.config_with("keep_attached_on_exit = false", &limit(1_000, 100)).replace(
        &format!("interfaces = [\"{}\"]", lab.net.host_if),
        &format!("interfaces = [\"{}\", \"{}\"]", lab.net.host_if, second.host_if),
    );
    let output = lab.agent.reload_with(&both);
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(printed.trim(), format!("xdp.interfaces: attached {} (native)", second.host_if));
    assert!(xdp_on(&lab.net.host_if) && xdp_on(&second.host_if));
    assert!(
        limiter::xdp::attached(&lab.agent.pin_dir).expect("attached").contains(&first_link[0]),
        "first link untouched"
    );

    let only_second = both.replace(&format!("\"{}\", ", lab.net.host_if), "");
    let output = lab.agent.reload_with(&only_second);
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), format!("xdp.interfaces: detached {}", lab.net.host_if));
    assert!(!xdp_on(&lab.net.host_if) && xdp_on(&second.host_if));
}

#[test]
fn a_clean_stop_detaches_when_keep_attached_on_exit_is_false_and_not_otherwise() {
    let xdp_on = |interface: &str| {
        let output = Command::new("ip").args(["-d", "link", "show", "dev", interface]).output().expect("ip");
        String::from_utf8_lossy(&output.stdout).contains("prog/xdp")
    };
    for keep in [false, true] {
        let mut lab = XdpLab::start(1, &format!("keep_attached_on_exit = {keep}"), &limit(1_000, 100));
        assert!(xdp_on(&lab.net.host_if));
        let status = lab.agent.stop_with(libc::SIGTERM);
        assert!(status.success(), "SIGTERM is a clean stop: {status}");
        assert_eq!(xdp_on(&lab.net.host_if), keep, "keep_attached_on_exit = {keep}");
        assert_eq!(limiter::xdp::attached(&lab.agent.pin_dir).expect("pins").len(), usize::from(keep));
        // Counters stay pinned either way, for `limiter stats` and the next start.
        assert!(lab.agent.pin_dir.join(limiter_common::maps::COUNTERS).exists());
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    let lab = XdpLab::start(1, "log_format = \"json\"\nkeep_attached_on_exit = false", &limit(1_000, 100));
    let log = lab.agent.log();
    let attached =
        log.lines().find(|l| l.contains("XDP attached")).unwrap_or_else(|| panic!("no attach line in {log}"));
    let record: serde_json::Value = serde_json::from_str(attached).expect("a JSON object");
    assert_eq!(record["level"], "INFO");
    assert_eq!(record["fields"]["interface"], lab.net.host_if.as_str());
    assert_eq!(record["fields"]["mode"], "native");
}

/// Runs `limiter run -c config` as a second agent; its exit status (within 30 s) and
/// its stderr.
fn second_run(config: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(limiter_lab::support::agent::limiter_bin())
        .args(["run", "-c"])
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start limiter run");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("second agent");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_second_agent_on_the_same_pins_or_socket_exits_before_touching_a_map() {
    let lab = XdpLab::start(1, "", &limit(1_234, 100));
    let enforcing = |pin_dir: &Path| KernelMaps::open_pinned(pin_dir).expect("maps").settings().expect("settings");
    assert_eq!(enforcing(&lab.agent.pin_dir).enforce, 1);

    // Same pins, same socket, enforcement off: it would turn the running one's off.
    let dry_run = lab.agent.dir.join("second.toml");
    std::fs::write(&dry_run, lab.config_with("", &format!("enforce = false\n{}", limit(99, 9)))).expect("config");
    let (code, stderr) = second_run(&dry_run);
    let settings = enforcing(&lab.agent.pin_dir);
    assert_eq!((settings.enforce, settings.default_rate.per_second()), (1, 1_234), "the live settings stay");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("another agent runs on"), "{stderr}");

    // Same socket, other pins: it must not load a program onto the interface.
    let other_pins = format!("/sys/fs/bpf/{}-second", lab.name);
    let other = lab.agent.dir.join("other-pins.toml");
    let text = lab.config_with("", &limit(99, 9)).replace(&lab.agent.pin_dir.display().to_string(), &other_pins);
    std::fs::write(&other, text).expect("config");
    let (code, stderr) = second_run(&other);
    let loaded = Path::new(&other_pins).exists();
    let _ = limiter::xdp::detach_all(Path::new(&other_pins));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("another agent runs on"), "{stderr}");
    assert!(!loaded, "the second agent created its pins: {stderr}");
    assert_eq!(limiter::xdp::attached(&lab.agent.pin_dir).expect("attached").len(), 1);
    assert_eq!(enforcing(&lab.agent.pin_dir).default_rate.per_second(), 1_234);

    // The running agent still answers.
    assert!(lab.agent.cli(&["reload"]).status.success());
}

#[test]
fn a_reload_that_changes_a_key_read_only_at_start_is_refused_naming_it_and_applies_nothing() {
    let redis = limiter_lab::support::redis::TestRedis::shared();
    let prefix = limiter_lab::support::redis::unique_prefix("restart-only");
    let port = free_port();
    let body = |xdp: &str, limit_pps: u32, proxy: &str, signature: &str, escalation: &str| {
        format!(
            "{xdp}{}[proxy]\nlisten = \"127.0.0.1:{port}\"\nupstream = \"http://127.0.0.1:9\"\n{}{proxy}\n\
             [proxy.signature]\n{signature}\n[escalation]\nenabled = {escalation}\n",
            limit(limit_pps, 100),
            limiter_lab::support::redis::redis_keys(&redis, &prefix, "allow"),
        )
    };
    let lab = XdpLab::start(1, "", &body("", 1_234, "", "", "false"));
    // Each with a live change too (the rate), which must not be applied either.
    let refused = [
        ("agent.log_format", lab.config_with("log_format = \"json\"", &body("", 99, "", "", "false"))),
        (
            "agent.metrics",
            lab.config_with(&format!("metrics = \"127.0.0.1:{}\"", free_port()), &body("", 99, "", "", "false")),
        ),
        ("xdp.max_sources", lab.config_with("", &body("max_sources = 5000\n", 99, "", "", "false"))),
        ("xdp.mode", lab.config_with("", &body("mode = \"generic\"\n", 99, "", "", "false"))),
        (
            "proxy.store",
            lab.config_with("", &body("", 99, "", "", "false")).replace("store = \"redis\"", "store = \"memory\""),
        ),
        (
            "proxy.redis_url",
            lab.config_with("", &body("", 99, "", "", "false")).replace(redis.url(), "redis://127.0.0.1:1/"),
        ),
        ("proxy.redis_prefix", lab.config_with("", &body("", 99, "", "", "false")).replace(&prefix, "other:")),
        (
            "proxy.redis_timeout",
            lab.config_with("", &body("", 99, "", "", "false")).replace("redis_timeout = \"", "redis_timeout = \"1"),
        ),
        (
            "proxy.signature.replay_cache_size",
            lab.config_with("", &body("", 99, "", "replay_cache_size = 10", "false")),
        ),
        (
            "proxy.signature.idempotency_ttl",
            lab.config_with("", &body("", 99, "", "idempotency_ttl = \"1h\"", "false")),
        ),
        (
            "proxy.signature.idempotency_max_entries",
            lab.config_with("", &body("", 99, "", "idempotency_max_entries = 10", "false")),
        ),
        (
            "proxy.signature.idempotency_max_body_bytes",
            lab.config_with("", &body("", 99, "", "idempotency_max_body_bytes = 10", "false")),
        ),
        (
            "proxy.signature.idempotency_max_bytes",
            lab.config_with("", &body("", 99, "", "idempotency_max_bytes = 100000", "false")),
        ),
        ("escalation.enabled", lab.config_with("", &body("", 99, "", "", "true"))),
        (
            "proxy.decision_log",
            lab.config_with("", &body("", 99, "decision_log = { path = \"/dev/null\" }", "", "false")),
        ),
        ("proxy (adding or removing the proxy)", lab.config_with("", &limit(99, 100))),
        (
            "agent.pin_dir",
            lab.config_with("", &body("", 99, "", "", "false"))
                .replace(&lab.agent.pin_dir.display().to_string(), &format!("{}-moved", lab.agent.pin_dir.display())),
        ),
    ];
    for (key, text) in &refused {
        lab.agent.write_config(text);
        let output = lab.agent.cli(&["reload"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{key}: reload must fail: {stderr}");
        assert!(stderr.contains(key) && stderr.contains("restart"), "{key}: must be named: {stderr}");
        assert_eq!(default_pps(&lab.agent.pin_dir), 1_234, "{key}: nothing of the file may be applied");
    }
    // A moved socket cannot be reached by `limiter reload`: SIGHUP reloads it.
    let socket = lab.agent.socket.display().to_string();
    lab.agent
        .write_config(&lab.config_with("", &body("", 99, "", "", "false")).replace(&socket, &format!("{socket}2")));
    let pid = i32::try_from(lab.agent.child.as_ref().expect("agent").id()).expect("pid");
    // SAFETY: plain kill(2) on the test's own child.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    lab.agent.until(
        "SIGHUP with a moved socket refused",
        || lab.agent.log().contains("agent.admin_socket: cannot change"),
        |refused| *refused,
    );
    assert_eq!(default_pps(&lab.agent.pin_dir), 1_234, "agent.admin_socket: nothing of the file may be applied");

    // Two at once: both named.
    let both = lab.config_with("log_format = \"json\"", &body("", 1_234, "", "replay_cache_size = 10", "false"));
    lab.agent.write_config(&both);
    let stderr = String::from_utf8_lossy(&lab.agent.cli(&["reload"]).stderr).into_owned();
    assert!(stderr.contains("agent.log_format") && stderr.contains("proxy.signature.replay_cache_size"), "{stderr}");

    lab.agent.write_config(&lab.config_with("", &body("", 99, "", "", "false")));
    let output = lab.agent.cli(&["reload"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(default_pps(&lab.agent.pin_dir), 99);
}

#[test]
fn the_watcher_never_applies_a_file_caught_half_written() {
    use std::io::Write as _;
    let lab = XdpLab::start(1, "", &limit(1_234, 100));
    let deny = "[[xdp.cidr]]\ncidr = \"192.0.2.0/24\"\naction = \"deny\"\n[[xdp.cidr]]\ncidr = \"198.51.100.0/24\"\naction = \"deny\"\n";
    let full = lab.config_with("", &format!("{}{deny}", limit(777, 100)));
    // Cut before the deny rules: the half parses, with the new rate and no rule.
    let (half, rest) = full.split_at(full.find("[[xdp.cidr]]").expect("rules"));

    let mut file = std::fs::File::create(lab.agent.config_path()).expect("config");
    file.write_all(half.as_bytes()).expect("write");
    // The writer stalls for longer than two watch intervals.
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(default_pps(&lab.agent.pin_dir), 1_234, "the half-written file was applied");
    file.write_all(rest.as_bytes()).expect("write");
    drop(file);

    lab.agent.until("the completed file applied", || default_pps(&lab.agent.pin_dir), |pps| *pps == 777);
    let cidrs = KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps").cidrs().expect("cidrs");
    assert_eq!(cidrs.len(), 2, "{cidrs:?}");
    // Counted once applied, after the maps show it.
    lab.agent.stats_until("one reload, of the whole file", |stats| stats["agent"]["reloads"]["ok"] == 1);
}

/// What `limiter check` warns of `config`, which it must accept.
fn check_warnings(config: &str) -> String {
    let dir = std::env::temp_dir().join(unique("check"));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("limiter.toml");
    std::fs::write(&path, config).expect("config");
    let output = Command::new(limiter_lab::support::agent::limiter_bin())
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("check");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

#[test]
fn check_warns_about_a_trusted_proxy_the_kernel_layer_would_limit_as_one_client() {
    let config = format!(
        "[xdp]\ninterfaces = [\"eth0\"]\n{}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\n\
         [[xdp.cidr]]\ncidr = \"10.9.0.0/16\"\naction = \"deny\"\n\
         [proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n\
         trusted_proxies = [\"10.1.0.0/16\", \"192.0.2.10/32\", \"10.9.0.1/32\"]\n",
        limit(100, 100)
    );
    let stderr = check_warnings(&config);
    assert!(stderr.contains("proxy.trusted_proxies 192.0.2.10/32 is not covered"), "{stderr}");
    // Inside the allow rule, but the narrower deny rule is the one the kernel applies.
    assert!(stderr.contains("proxy.trusted_proxies 10.9.0.1/32 is not covered"), "{stderr}");
    assert!(!stderr.contains("10.1.0.0/16"), "covered by the allow rule: {stderr}");
}

/// Deny rules escalated before `escalate` existed: `limiter check` names each one a
/// config with `[escalation]` on relies on, and not one that says `escalate = true`.
#[test]
fn check_names_the_deny_rules_that_no_longer_escalate() {
    let config = format!(
        "[xdp]\ninterfaces = [\"eth0\"]\n{}\
         [proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n\
         [[proxy.rules]]\nname = \"dotenv-probe\"\naction = \"deny\"\npath = \"/.env\"\n\
         [[proxy.rules]]\nname = \"scanner\"\naction = \"deny\"\nescalate = true\n\
         [proxy.rules.when]\nheaders_absent = [\"user-agent\"]\n\
         [escalation]\nthreshold = 5\n",
        limit(100, 100)
    );
    let stderr = check_warnings(&config);
    assert!(
        stderr.contains("proxy.rules \"dotenv-probe\" (action = \"deny\") no longer counts towards escalation"),
        "{stderr}"
    );
    assert!(!stderr.contains("\"scanner\""), "it escalates: {stderr}");
}

#[test]
fn check_says_that_path_rules_now_match_any_case_unless_the_config_says_so() {
    let check = |case: &str| {
        check_warnings(&format!(
            "[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n{case}\
             [[proxy.rules]]\nname = \"login\"\npath = \"/login\"\nkey = \"ip\"\nlimit = 5\nwindow = \"1m\"\n"
        ))
    };
    let unset = check("");
    assert!(unset.contains("warning: proxy.case_insensitive_paths is not set, and its default is now true"), "{unset}");
    let sensitive = check("case_insensitive_paths = false\n");
    assert!(sensitive.contains("warning: proxy.case_insensitive_paths = false"), "{sensitive}");
    assert_eq!(check("case_insensitive_paths = true\n"), "");
}

#[test]
fn check_says_that_store_failure_now_defaults_to_local_for_a_config_on_redis() {
    let check = |extra: &str| {
        check_warnings(&format!("[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n{extra}"))
    };
    let unset = check("store = \"redis\"\n");
    assert!(unset.contains("warning: proxy.store_failure is not set, and its default is now \"local\""), "{unset}");
    for set in ["allow", "deny", "local"] {
        assert_eq!(check(&format!("store = \"redis\"\nstore_failure = \"{set}\"\n")), "", "{set}");
    }
    assert_eq!(check(""), "", "in memory the store never fails");
}

/// A key that lists no scopes holds every one: `limiter check` names it once scopes
/// exist, and says nothing of a key that lists its own.
#[test]
fn check_names_the_keys_that_hold_every_scope_for_listing_none() {
    let config = "[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n\
                  [proxy.plans.p]\nlimit = 1\nwindow = \"1s\"\n\
                  [[proxy.scopes]]\nname = \"admin\"\npaths = [\"/admin\"]\n\
                  [[proxy.keys]]\nid = \"k-old\"\nplan = \"p\"\nauth = \"bearer\"\n\
                  [[proxy.keys]]\nid = \"k-new\"\nplan = \"p\"\nauth = \"bearer\"\nscopes = []\n";
    let stderr = check_warnings(config);
    assert!(
        stderr.contains("warning: proxy.keys k-old list no scopes, so they hold every [[proxy.scopes]]"),
        "{stderr}"
    );
    assert!(!stderr.contains("k-new"), "{stderr}");
}

/// A config that raised `max_connections_per_ip` past the new wider bounds: `limiter
/// check` says which one now holds an IPv6 client, and that its requests in flight
/// are capped.
#[test]
fn check_says_where_a_new_connection_bound_is_tighter_than_the_configs_own() {
    let check = |bounds: &str| {
        check_warnings(&format!("[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n{bounds}"))
    };
    let raised = check("max_connections_per_ip = 2000\n");
    assert!(raised.contains("warning: proxy.max_connections_per_ip = 2000, but an IPv6 /56 may hold 1024"), "{raised}");
    assert!(raised.contains("max_requests_in_flight_per_client"), "{raised}");
    assert_eq!(check(""), "");
}

fn ip(args: &[&str]) -> String {
    let output = Command::new("ip").args(args).output().expect("ip");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_reload_whose_kernel_step_fails_rolls_back_its_interfaces_settings_and_rules() {
    use limiter::config::xdp::{CidrAction, CidrRule};
    let mut lab = XdpLab::start(1, "", &limit(1_234, 100));
    let (dummy, peer) =
        (format!("{}d", &lab.name[..lab.name.len().min(13)]), format!("{}p", &lab.name[..lab.name.len().min(13)]));
    ip(&["link", "add", &dummy, "type", "veth", "peer", "name", &peer]);
    ip(&["link", "set", &dummy, "up"]);
    ip(&["link", "set", &peer, "up"]);
    // The IPv4 rules trie is full, so that the reload's new rule cannot go in.
    let filler: Vec<CidrRule> = (0..limiter_common::maps::MAX_CIDRS)
        .map(|i| CidrRule {
            cidr: ipnet::IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(0xac10_0000 + i))),
            action: CidrAction::Deny,
            aggregate: None,
        })
        .collect();
    KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps").sync_cidrs(&filler).expect("fill the trie");

    let two_interfaces = format!("interfaces = [\"{}\", \"{dummy}\"]", lab.net.host_if);
    let text = lab
        .config_with(
            "",
            &format!("enforce = false\n{}[[xdp.cidr]]\ncidr = \"192.0.2.0/24\"\naction = \"deny\"\n", limit(99, 9)),
        )
        .replace(&format!("interfaces = [\"{}\"]", lab.net.host_if), &two_interfaces);
    // From another file: the agent's watcher keeps to its own, unchanged one.
    let output = lab.agent.reload_with(&text);
    let dummy_link = ip(&["-d", "link", "show", &dummy]);
    ip(&["link", "del", &dummy]);

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("applying the kernel layer failed"), "{stderr}");
    assert!(!stderr.contains("attaching"), "the rules failed, after the attach: {stderr}");
    assert!(!dummy_link.contains("xdp"), "the interface attached by the failed reload stays attached: {dummy_link}");
    let attached = limiter::xdp::attached(&lab.agent.pin_dir).expect("attached");
    assert_eq!(attached.iter().map(|a| a.interface.as_str()).collect::<Vec<_>>(), [lab.net.host_if.as_str()]);
    let maps = KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps");
    let settings = maps.settings().expect("settings");
    assert_eq!((settings.enforce, settings.default_rate.per_second()), (1, 1_234), "settings flipped back");
    let cidrs = maps.cidrs().expect("cidrs");
    assert!(
        cidrs.is_empty(),
        "the trie holds the running config's rules (none), not {}: {}",
        cidrs.len(),
        lab.agent.log()
    );
    lab.agent.until(
        "the rollback logged",
        || lab.agent.log().contains("the running config stays in force"),
        |logged| *logged,
    );
}

#[test]
fn escalation_added_by_a_reload_to_an_agent_started_without_the_kernel_layer_is_refused() {
    let name = unique("esc-late");
    let proxy = format!("[proxy]\nlisten = \"127.0.0.1:{}\"\nupstream = \"http://127.0.0.1:9\"\n", free_port());
    let mut agent =
        AgentProcess::start(&name, &format!("{}{proxy}", limiter_lab::support::agent::agent_section(&name, "")));
    // The interface does not exist: were the refusal missing, the attach would fail
    // with another message.
    let text = format!(
        "{}[xdp]\ninterfaces = [\"nosuch0\"]\n{}{proxy}[escalation]\nthreshold = 3\n",
        limiter_lab::support::agent::agent_section(&name, ""),
        limit(100, 100)
    );
    let output = agent.reload_with(&text);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("escalation (the agent started without [xdp])"), "{stderr}");
}

#[test]
fn a_reload_that_adds_the_kernel_layer_on_pins_another_agent_holds_is_refused() {
    use limiter_lab::support::agent::agent_section;
    let lab = XdpLab::start(1, "", &limit(1_234, 100));
    // A proxy-only agent on the same pin dir (it holds no lock on it yet).
    let name = unique("pins-late");
    let pins = lab.agent.pin_dir.display().to_string();
    let section = agent_section(&name, "").replace(&format!("/sys/fs/bpf/{name}"), &pins);
    let proxy = format!("[proxy]\nlisten = \"127.0.0.1:{}\"\nupstream = \"http://127.0.0.1:9\"\n", free_port());
    let mut agent = AgentProcess::start(&name, &format!("{section}{proxy}"));
    let text =
        format!("{section}[xdp]\ninterfaces = [\"{}\"]\nenforce = false\n{}{proxy}", lab.net.host_if, limit(99, 9));
    let output = agent.reload_with(&text);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let settings = KernelMaps::open_pinned(&lab.agent.pin_dir).expect("maps").settings().expect("settings");
    assert_eq!((settings.enforce, settings.default_rate.per_second()), (1, 1_234), "the live settings stay");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("another agent runs on {pins}")), "{stderr}");
}

/// CPU time the process `pid` has used, in clock ticks (1/100 s on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // After the command name (in parentheses, which may hold spaces): state is field
    // 3, utime and stime fields 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("comm").1.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

#[test]
fn an_agent_out_of_descriptors_pauses_its_accept_loops_and_its_admin_socket_recovers() {
    let name = unique("limiter-fds");
    let config = format!(
        "{}[proxy]\nlisten = \"127.0.0.1:{}\"\nupstream = \"http://127.0.0.1:9\"\nheader_timeout = \"1m\"\n",
        limiter_lab::support::agent::agent_section(&name, ""),
        free_port()
    );
    let listen = config.lines().find_map(|l| l.strip_prefix("listen = \"")).expect("listen").trim_end_matches('"');
    let mut agent = AgentProcess::start(&name, &config);
    let pid = agent.child.as_ref().expect("running").id();
    // A soft limit a few descriptors above what it uses, filled by clients that
    // connect and say nothing: the proxy, then the admin socket, find none left.
    let soft = u64::try_from(fd_count(pid)).expect("count") + 8;
    let limit = libc::rlimit { rlim_cur: soft, rlim_max: soft };
    // SAFETY: prlimit on our own child, with a struct we own.
    let set = unsafe {
        libc::prlimit(i32::try_from(pid).expect("pid"), libc::RLIMIT_NOFILE, &raw const limit, std::ptr::null_mut())
    };
    assert_eq!(set, 0, "prlimit");
    let silent: Vec<_> = (0..16).map(|_| std::net::TcpStream::connect(listen).expect("connect")).collect();
    let _waiting_admin = std::os::unix::net::UnixStream::connect(&agent.socket).expect("admin connect");
    let soft_count = usize::try_from(soft).expect("soft");
    agent.until("the agent to take its descriptors", || fd_count(pid), |count| *count >= soft_count);
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(pid) - before;
    // A loop that retries at once burns a core: about 100 ticks a second.
    assert!(spent < 10, "the agent used {spent} ticks of CPU in a second without descriptors");

    drop(silent);
    let stats = agent.cli_json(&["stats", "--json"]);
    assert!(stats["proxy"].is_object(), "{stats}");
    assert_eq!(agent.stop_with(libc::SIGTERM).code(), Some(0));
}

#[test]
fn check_warns_about_secret_files_others_can_read_and_short_secrets() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = std::env::temp_dir().join(unique("limiter-check-secrets"));
    std::fs::create_dir_all(&dir).expect("dir");
    let secret = dir.join("k-pay");
    std::fs::write(&secret, "short\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let text = format!(
        "[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:3000\"\n[proxy.plans.p]\nlimit = 1\n\
         window = \"1s\"\n[[proxy.keys]]\nid = \"k-pay\"\nplan = \"p\"\nsecrets = [\"file:{}\"]\n",
        secret.display()
    );
    let stderr = check_warnings(&text);
    let reference = format!("proxy.keys[0].secrets: file:{}", secret.display());
    assert!(stderr.contains(&format!("warning: {reference} can be read by group or others (mode 644)")), "{stderr}");
    assert!(stderr.contains(&format!("warning: {reference} is 5 bytes")), "{stderr}");
    assert!(!stderr.contains("short"), "a warning showed the secret: {stderr}");

    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(check_warnings(&text), "");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn demote_slows_a_source_to_its_demoted_bucket_and_undemote_restores_it() {
    let security_log = std::env::temp_dir().join(format!("{}.jsonl", unique("security-demote")));
    let agent = format!("keep_attached_on_exit = false\n[agent.security_log]\npath = \"{}\"", security_log.display());
    let lab = XdpLab::start(1, &agent, &limit(10_000, 10_000));
    let source = lab.sources[0];
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");

    let output = lab.agent.cli(&["demote", &source.to_string()]);
    assert_eq!(output.status.code(), Some(1), "no rate given and no demote_first");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--packets-per-second"), "{output:?}");
    let output =
        lab.agent.cli(&["demote", &source.to_string(), "--packets-per-second", "5", "--burst", "5", "--ttl", "1h"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stats = lab.agent.cli_json(&["stats", "--json"]);
    let demoted = &stats["xdp"]["demoted"][0];
    assert_eq!(demoted["cidr"].as_str(), Some(format!("{source}/32").as_str()), "{stats}");
    assert_eq!((demoted["packets_per_second"].as_u64(), demoted["burst"].as_u64()), (Some(5), Some(5)), "{stats}");
    assert!(demoted["expires_in_secs"].as_u64().is_some_and(|secs| secs > 3_500 && secs <= 3_600), "{stats}");
    let table = String::from_utf8_lossy(&lab.agent.cli(&["stats"]).stdout).into_owned();
    assert!(table.contains(&format!("demoted {source}/32 to 5 pps, burst 5")), "{table}");

    // 50 at once: the burst of 5, and at most one more refilled meanwhile. (A second
    // of refill, as the normal bucket's: undemoted, the source is not held back by
    // what it spent while demoted.)
    traffic::send(&lab.net.ns, source, receiver.addr, 50, 50).expect("send");
    seen_all(&lab.agent, source, 50);
    let passed = receiver.from(source).len();
    assert!((5..=6).contains(&passed), "{passed} of 50 passed a demoted bucket of 5");

    assert!(lab.agent.cli(&["undemote", &source.to_string()]).status.success());
    assert_eq!(lab.agent.cli(&["undemote", &source.to_string()]).status.code(), Some(1), "none left");
    // The demotions keep IPv4 mapped in one trie: an IPv6 range reaching into
    // ::ffff:0:0/96 would slow every IPv4 source down too.
    for wide in ["::/0", "::ffff:0:0/96", "::ffff:10.0.0.0/104"] {
        let refused = lab.agent.cli(&["demote", wide, "--packets-per-second", "5", "--burst", "5"]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains("::ffff:0:0/96"), "{wide}: {stderr}");
    }
    let stats = lab.agent.cli_json(&["stats", "--json"]);
    assert_eq!(stats["xdp"]["demoted"], serde_json::json!([]), "{stats}");
    traffic::send(&lab.net.ns, source, receiver.addr, 50, 50).expect("send");
    lab.agent.until("all 50 to pass at the normal rate", || receiver.from(source).len(), |n| *n == passed + 50);

    let text = std::fs::read_to_string(&security_log).unwrap_or_default();
    let events: Vec<serde_json::Value> = text.lines().map(|line| serde_json::from_str(line).expect("JSON")).collect();
    let shown: Vec<_> = events
        .iter()
        .map(|e| (e["event"].as_str(), e["reason"].as_str(), e["plan"].as_str(), e["ttl_s"].as_u64()))
        .collect();
    assert_eq!(
        shown,
        [
            (Some("kernel_demote"), Some("cli"), Some("5 pps, burst 5"), Some(3_600)),
            (Some("kernel_undemote"), Some("cli"), None, None)
        ]
    );
    let _ = std::fs::remove_file(&security_log);
}
