//! Escalation end to end: agents with the kernel layer on veths, a client in a
//! namespace that keeps getting 429, and a Redis the agents share.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use ipnet::IpNet;
use limiter::xdp::KernelMaps;
use limiter_common::maps::MAX_BLOCKS;

use limiter_lab::{
    netns::{HostLab, VethNamespace, in_namespace},
    support::{
        agent::{AgentProcess, agent_section},
        proxy::Upstream,
        redis::{TestRedis, redis_keys, unique_prefix},
        unique,
        wait::PATIENCE,
    },
};

/// Long enough for every look at a block on a loaded machine to come before it
/// lapses, a late agent's start among them.
const BLOCK_TTL: Duration = Duration::from_secs(6);
// A wait for the block to lapse outlasts it.
const _: () = assert!(PATIENCE.as_secs() > BLOCK_TTL.as_secs() + 2);

/// One agent with its own veth lab: kernel layer on the host side, proxy listening
/// on the host address, a client address inside.
struct Site {
    lab: VethNamespace,
    client: Ipv4Addr,
    proxy: SocketAddr,
    agent: AgentProcess,
    /// `[agent.security_log]`'s file.
    security_log: std::path::PathBuf,
}

impl Site {
    fn start(subnet: u8, redis: &str, upstream: SocketAddr) -> Self {
        Self::start_with(subnet, redis, upstream, "")
    }

    /// With `xdp_rules` (`[[xdp.cidr]]` tables) in the config.
    fn start_with(subnet: u8, redis: &str, upstream: SocketAddr, xdp_rules: &str) -> Self {
        let escalation =
            format!("[escalation]\nthreshold = 3\nwindow = \"10s\"\nblock_ttl = \"{}ms\"\n", BLOCK_TTL.as_millis());
        Self::start_escalating(subnet, redis, upstream, xdp_rules, &escalation)
    }

    /// With `escalation`, the whole `[escalation]` section.
    fn start_escalating(subnet: u8, redis: &str, upstream: SocketAddr, xdp_rules: &str, escalation: &str) -> Self {
        let name = unique("esc");
        let host_lab = HostLab::new(&name, subnet);
        let xdp = host_lab.xdp_section();
        let HostLab { lab, client, listen: proxy, .. } = host_lab;
        let security_log = std::path::PathBuf::from(format!("/tmp/{name}/security.jsonl"));
        let config = format!(
            r#"{agent}
[agent.security_log]
path = "{security_log}"
{xdp}{xdp_rules}
[proxy]
listen = "{proxy}"
upstream = "http://{upstream}"
{redis}
# A window turning mid-test would let two more requests through.
[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1h"

{escalation}"#,
            agent = agent_section(&name, "keep_attached_on_exit = false"),
            security_log = security_log.display(),
        );
        let agent = AgentProcess::start(&name, &config);
        Self { lab, client, proxy, agent, security_log }
    }

    /// The security log's `(event, reason, client)` of each line, once `done` holds of
    /// them (the writer is a thread of its own).
    fn security_events(&self, done: impl FnMut(&Vec<[String; 3]>) -> bool) -> Vec<[String; 3]> {
        let read = || {
            let text = std::fs::read_to_string(&self.security_log).unwrap_or_default();
            let field = |line: &serde_json::Value, name: &str| line[name].as_str().unwrap_or("-").to_owned();
            text.lines()
                .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
                .map(|line: serde_json::Value| [field(&line, "event"), field(&line, "reason"), field(&line, "client")])
                .collect()
        };
        self.agent.until("the security events", read, done)
    }

    /// One GET from the client on a new connection: its status, or `None` if the
    /// connection could not be made (the kernel layer drops the client's packets). A
    /// handshake the kernel layer lets through takes far less than the second it
    /// waits, however loaded the machine: its SYN is sent again only after that.
    fn get(&self) -> Option<u16> {
        in_namespace(&self.lab.ns, || {
            let mut stream = TcpStream::connect_timeout(&self.proxy, Duration::from_secs(1)).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            stream.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").ok()?;
            let mut reply = String::new();
            let _ = stream.read_to_string(&mut reply);
            reply.split(' ').nth(1)?.parse().ok()
        })
        .expect("enter namespace")
    }

    /// Whether the client's handshake with the proxy completes: not once the kernel
    /// layer drops its packets, while the proxy accepts it to close it at once.
    fn connects(&self) -> bool {
        in_namespace(&self.lab.ns, || TcpStream::connect_timeout(&self.proxy, Duration::from_secs(1)).is_ok())
            .expect("enter namespace")
    }

    /// Whether `limiter stats` shows a block for `cidr`.
    fn blocks(&self, cidr: &str) -> bool {
        let stats = self.agent.cli_json(&["stats", "--json"]);
        stats["xdp"]["blocks"].as_array().is_some_and(|blocks| blocks.iter().any(|b| b["cidr"] == cidr))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_keeps_getting_429_is_dropped_by_xdp_on_every_agent_until_the_ttl() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("escalation"), "allow");
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;

    tokio::task::spawn_blocking(move || {
        let here = Site::start(8, &keys, upstream_addr);
        let there = Site::start(9, &keys, upstream_addr);
        let cidr = format!("{}/32", here.client);

        // Two pass, then 429s: the fourth rejection is past the threshold of three.
        let statuses: Vec<Option<u16>> = (0..6).map(|_| here.get()).collect();
        assert_eq!(statuses, [Some(200), Some(200), Some(429), Some(429), Some(429), Some(429)]);
        let crossed = Instant::now();

        here.agent.until("the kernel layer to drop the client", || here.get(), Option::is_none);
        // At once, not at the end of the escalation window (10 s): well within the TTL.
        let dropped_after = crossed.elapsed();
        assert!(dropped_after < BLOCK_TTL / 2, "dropped {dropped_after:?} after crossing the threshold");
        assert!(here.blocks(&cidr), "the agent that counted blocks the client");
        there.agent.until("the other agent to block it too", || there.blocks(&cidr), |blocked| *blocked);
        // The security log names the client (one address, not its /32).
        let event = |event: &str, reason: &str| [event.to_owned(), reason.to_owned(), here.client.to_string()];
        let escalated = [event("escalation_block", "too_many_rejections"), event("kernel_block", "escalation")];
        here.security_events(|events| escalated.iter().all(|e| events.contains(e)));
        there.security_events(|events| events.contains(&event("kernel_block", "fleet")));

        // After the TTL the client's packets pass again (and it is answered).
        here.agent.until("the client to be let through after the TTL", || here.get().is_some(), |passed| *passed);
        assert!(crossed.elapsed() >= BLOCK_TTL - Duration::from_millis(100), "the block lasted its TTL");
    })
    .await
    .expect("test thread");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_starts_later_learns_the_active_blocks() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("escalation-late"), "allow");
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;

    tokio::task::spawn_blocking(move || {
        let here = Site::start(10, &keys, upstream_addr);
        let cidr = format!("{}/32", here.client);
        for _ in 0..6 {
            here.get();
        }
        here.agent.until("the client blocked", || here.blocks(&cidr), |blocked| *blocked);
        let later = Site::start(11, &keys, upstream_addr);
        later.agent.until("a late agent to learn the block", || later.blocks(&cidr), |blocked| *blocked);
    })
    .await
    .expect("test thread");
}

/// Sends `command` to the Redis at `url`.
fn redis_command<T: redis::FromRedisValue>(url: &str, command: &redis::Cmd) -> T {
    let mut connection = redis::Client::open(url).and_then(|c| c.get_connection()).expect("redis connection");
    command.query(&mut connection).expect("redis command")
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_fleet_blocks_are_refused_and_counted_and_a_forged_ttl_is_cut_to_block_ttl() {
    let redis = TestRedis::shared();
    let prefix = unique_prefix("escalation-forged");
    let keys = redis_keys(&redis, &prefix, "allow");
    let url = redis.url().to_owned();
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;

    tokio::task::spawn_blocking(move || {
        let (set, channel) = (format!("{prefix}blocks"), format!("{prefix}escalations"));
        // Forged into the set of active blocks before the agent starts (it learns them
        // at start), and published on the channel once it follows it.
        let (server_secs, _): (u64, u64) = redis_command(&url, &redis::cmd("TIME"));
        let expiry = server_secs * 1000 + 60_000;
        let recorded = ["0.0.0.0/0", "::/0"];
        for cidr in recorded {
            let _: i64 = redis_command(&url, redis::cmd("ZADD").arg(&set).arg(expiry).arg(cidr));
        }
        let rules = r#"
[[xdp.cidr]]
cidr = "192.0.2.0/24"
action = "allow"
[[xdp.cidr]]
cidr = "2001:db8:1::5/128"
action = "allow"
"#;
        let site = Site::start_with(12, &keys, upstream_addr, rules);
        let subscribers = || redis_command::<(String, i64)>(&url, redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel)).1;
        site.agent.until("the agent to follow the channel", subscribers, |n| *n > 0);
        let wide = format!("{}/16", Ipv4Addr::from(site.client.to_bits() & 0xffff_0000));
        let published = [
            "0.0.0.0/0",
            &wide,
            "192.0.2.7/32",      // inside an allow CIDR
            "192.0.2.0/23",      // around one
            "2001:db8:1::/64",   // the prefix of an allow CIDR narrower than it
            "2001:db8:2::/48",   // wider than xdp.ipv6_prefix
            "::ffff:0.0.0.0/96", // every IPv4 source, mapped
            "203.0.113.9/32",    // one source: blocked, for no longer than BLOCK_TTL
        ];
        let malformed = ["10.0.0.1/33 60000", "203.0.113.10/32 0", "203.0.113.11/32", "garbage"];
        // A year: a forged TTL is cut to this agent's block_ttl.
        let messages = published.iter().map(|cidr| format!("{cidr} 31536000000"));
        for message in malformed.iter().map(|m| (*m).to_owned()).chain(messages) {
            let _: i64 = redis_command(&url, redis::cmd("PUBLISH").arg(&channel).arg(message));
        }

        // Messages are applied in order, so once the valid one is in place every
        // forged one was dealt with.
        site.agent.until("a valid fleet block to be applied", || site.blocks("203.0.113.9/32"), |blocked| *blocked);
        for cidr in recorded.iter().chain(&published[..published.len() - 1]) {
            assert!(!site.blocks(cidr), "{cidr} must not be blocked: {}", site.agent.log());
        }
        let refused = recorded.len() + malformed.len() + published.len() - 1;
        site.agent.stats_until("every forged block counted", |stats| {
            stats["agent"]["escalation"]["blocks_refused"] == refused
        });
        assert!(!site.blocks("203.0.113.10/32") && !site.blocks("203.0.113.11/32"));
        // Each block refused is an event naming it (a malformed message names none; the
        // one published twice at once may be summarised), and the valid one a kernel block.
        let shown = |cidr: &str| {
            let net: IpNet = cidr.parse().expect("a CIDR");
            if net.prefix_len() == net.max_prefix_len() { net.addr().to_string() } else { net.to_string() }
        };
        let expected: std::collections::BTreeSet<String> =
            recorded.iter().chain(&published[..published.len() - 1]).map(|cidr| shown(cidr)).collect();
        let refused_of = |events: &Vec<[String; 3]>| -> std::collections::BTreeSet<String> {
            events.iter().filter(|e| e[0] == "fleet_block_refused").map(|e| e[2].clone()).collect()
        };
        let kernel_block = ["kernel_block".to_owned(), "fleet".to_owned(), "203.0.113.9".to_owned()];
        let events = site.security_events(|events| refused_of(events) == expected && events.contains(&kernel_block));
        let reasons = ["not_one_source", "protected"];
        assert!(events.iter().all(|e| e[0] != "fleet_block_refused" || reasons.contains(&e[1].as_str())), "{events:?}");
        assert!(
            events
                .iter()
                .all(|e| e[0] != "fleet_block_refused" || ["not_one_source", "protected"].contains(&e[1].as_str()))
        );
        assert!(events.contains(&["kernel_block".into(), "fleet".into(), "203.0.113.9".into()]), "{events:?}");
        let stats = site.agent.cli_json(&["stats", "--json"]);
        let expires_in = stats["xdp"]["blocks"]
            .as_array()
            .and_then(|blocks| blocks.iter().find(|b| b["cidr"] == "203.0.113.9/32"))
            .and_then(|block| block["expires_in_secs"].as_u64());
        assert!(expires_in.is_some_and(|secs| secs <= BLOCK_TTL.as_secs()), "a forged TTL of a year: {stats}");
        assert_eq!(site.get(), Some(200), "the client still reaches the proxy");
    })
    .await
    .expect("test thread");
}

/// An agent (limits in memory) whose IPv4 runtime-block trie is full, with one block
/// for `ttl` per address of 198.18.0.0/16 (the benchmarking range, no test's
/// address), and whose client then crosses the escalation threshold.
fn escalate_into_a_full_trie(subnet: u8, upstream: SocketAddr, ttl: Duration) -> Site {
    let site = Site::start(subnet, "", upstream);
    let mut maps = KernelMaps::open_pinned(&site.agent.pin_dir).expect("the agent's pinned maps");
    let first = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    for n in 0..MAX_BLOCKS {
        maps.block(IpNet::from(IpAddr::from(Ipv4Addr::from(first + n))), Some(ttl)).expect("room for one more block");
    }
    let statuses: Vec<Option<u16>> = (0..6).map(|_| site.get()).collect();
    assert_eq!(statuses, [Some(200), Some(200), Some(429), Some(429), Some(429), Some(429)]);
    site
}

/// A lapsed block stops dropping at once but keeps its place in the trie until it is
/// read: an escalation that finds the trie full of them used to fail, and the source
/// it meant to block went on reaching the proxy. It now makes room first.
#[tokio::test(flavor = "multi_thread")]
async fn an_escalation_that_finds_the_block_trie_full_makes_room_from_lapsed_blocks() {
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;
    tokio::task::spawn_blocking(move || {
        let site = escalate_into_a_full_trie(13, upstream_addr, Duration::from_nanos(1));
        site.agent.until("the kernel layer to drop the client", || site.connects(), |connects| !connects);
        let stats = site.agent.cli_json(&["stats", "--json"]);
        assert_eq!(stats["agent"]["escalation"]["block_failures"], 0, "{stats}");
        let blocks: Vec<&serde_json::Value> =
            stats["xdp"]["blocks"].as_array().expect("blocks").iter().map(|block| &block["cidr"]).collect();
        assert_eq!(blocks, [&serde_json::json!(format!("{}/32", site.client))], "only the client's is in force");
    })
    .await
    .expect("test thread");
}

/// A trie full of blocks in force (a distributed attack of more sources than it
/// holds) has no room: the failed block is counted, and the proxy still refuses the
/// source's connections itself.
#[tokio::test(flavor = "multi_thread")]
async fn an_escalation_that_finds_the_block_trie_full_of_blocks_in_force_is_counted() {
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;
    tokio::task::spawn_blocking(move || {
        let site = escalate_into_a_full_trie(14, upstream_addr, Duration::from_secs(3600));
        site.agent.stats_until("the failed block counted", |stats| stats["agent"]["escalation"]["block_failures"] == 1);
        assert!(site.connects(), "the kernel layer lets the client through: {}", site.agent.log());
        assert_eq!(site.get(), None, "the proxy closes the blocked client's connections");
    })
    .await
    .expect("test thread");
}

/// The penalty ladder on a veth: the first offence demotes the client to a slow
/// kernel bucket (on every agent of the fleet), a flood from it then passes at about
/// that rate, and its next offence blocks it.
#[tokio::test(flavor = "multi_thread")]
async fn a_demoted_client_floods_at_its_demoted_rate_and_its_next_offence_blocks_it() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("ladder"), "allow");
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;
    tokio::task::spawn_blocking(move || {
        // A window of a second: the next offence may come a second after the first.
        let escalation = "[escalation]\nthreshold = 3\nwindow = \"1s\"\nblock_ttl = \"1m\"\nblock_ttl_factor = 2\n\
                          demote_first = { packets_per_second = 20, burst = 40, ttl = \"1m\" }\n";
        let site = Site::start_escalating(17, &keys, upstream_addr, "", escalation);
        let there = Site::start_escalating(18, &keys, upstream_addr, "", escalation);
        let cidr = format!("{}/32", site.client);
        let demoted = |site: &Site| {
            let stats = site.agent.cli_json(&["stats", "--json"]);
            stats["xdp"]["demoted"].as_array().and_then(|all| all.iter().find(|d| d["cidr"] == cidr.as_str()).cloned())
        };
        let statuses: Vec<Option<u16>> = (0..6).map(|_| site.get()).collect();
        assert_eq!(statuses, [Some(200), Some(200), Some(429), Some(429), Some(429), Some(429)]);
        let row = site.agent.until("the client demoted", || demoted(&site), Option::is_some).expect("demoted");
        assert_eq!((row["packets_per_second"].as_u64(), row["burst"].as_u64()), (Some(20), Some(40)), "{row}");
        assert!(!site.blocks(&cidr), "demoted, not blocked");
        there.agent.until("the other agent to demote it too", || demoted(&there), Option::is_some);

        // A flood of about 1 000 packets a second: its burst of 40, then 20 a second.
        let IpAddr::V4(host) = site.proxy.ip() else { unreachable!("an IPv4 lab") };
        let receiver = limiter_lab::traffic::Receiver::bind(host).expect("receiver");
        let took = limiter_lab::traffic::send(&site.lab.ns, site.client, receiver.addr, 3_000, 10).expect("flood");
        std::thread::sleep(Duration::from_millis(200));
        let passed = receiver.from(site.client).len() as f64;
        let expected = 40.0 + 20.0 * took.as_secs_f64();
        assert!(
            passed <= expected + 5.0 && passed >= 20.0 * took.as_secs_f64(),
            "{passed} of 3000 passed in {took:?}; a demoted bucket admits about {expected:.0}"
        );

        // Its bucket refills (two seconds hold its burst), and its next 429s are its
        // second offence: a block.
        std::thread::sleep(Duration::from_secs(2));
        site.agent.until(
            "the client blocked",
            || {
                site.get();
                site.blocks(&cidr)
            },
            |blocked| *blocked,
        );
        let event = |event: &str, reason: &str| [event.to_owned(), reason.to_owned(), site.client.to_string()];
        let ladder = [event("kernel_demote", "escalation"), event("kernel_block", "escalation")];
        site.security_events(|events| ladder.iter().all(|e| events.contains(e)));
        let learnt = [event("kernel_demote", "fleet"), event("kernel_block", "fleet")];
        there.security_events(|events| learnt.iter().all(|e| events.contains(e)));

        // `limiter unblock` forgets its offences (in the fleet's Redis): its next one
        // is a first one again, a demotion.
        let output = site.agent.cli(&["unblock", &cidr]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stdout).contains(&format!("offence history of {cidr} cleared")));
        std::thread::sleep(Duration::from_secs(1));
        let demoted_again = |events: &Vec<[String; 3]>| {
            events.iter().filter(|e| **e == event("kernel_demote", "escalation")).count() == 2
        };
        site.agent.until(
            "its next offence to demote it again",
            || {
                site.get();
                demoted_again(&site.security_events(|_| true))
            },
            |again| *again,
        );
        assert!(!site.blocks(&cidr), "demoted, not blocked");
    })
    .await
    .expect("test thread");
}
